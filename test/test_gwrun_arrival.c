/*
 * test_gwrun_arrival: the multi-node suite's cases for nodes started without
 * --node-rank, as torchrun's c10d rendezvous starts them (test_gwrun_multinode.c
 * has the rest): node 0 is the gw-run that can listen on the launcher port,
 * the others are numbered as they join it; torchrun's spellings
 * (--rdzv-endpoint, --rdzv-id as the token, --nnodes N:N, --rdzv-backend);
 * a node too many refused with the job going on; a signal while a node waits
 * for its number; and a port held by something else said as such.
 */
#include <check.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <unistd.h>

#include "test_gwrun_multinode.h"

/* Starts a node of an nnodes-node job at 127.0.0.1:port with no --node-rank,
 * extra options (NULL-terminated, may be NULL) before the script. */
static void arrival_start(struct run *r, const char *const *env, int port, int nnodes, const char *nproc,
                          const char *const *extra, const char *script)
{
    char nn[16], master[64];
    snprintf(nn, sizeof nn, "%d", nnodes);
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    const char *args[24] = {"-n", nproc, "--nnodes", nn, "--master", master};
    int n = 6;
    for (int i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n++] = "sh", args[n++] = "-c", args[n++] = script, args[n] = NULL;
    gwrun_start(r, env, args);
}

/* Each "[G] RANK GROUP_RANK LOCAL_RANK" line of a node's output: the global
 * ranks seen (bits of *seen) and whether each agrees with the others. */
struct ranks_seen {
    unsigned seen;
    int nproc, bad;
};

static void note_rank(const char *line, void *arg)
{
    struct ranks_seen *s = arg;
    int g, rank, group, local;
    if (sscanf(line, "[%d] %d %d %d", &g, &rank, &group, &local) != 4)
        return;
    if (g != rank || rank != group * s->nproc + local || (s->seen >> rank & 1u))
        s->bad++;
    s->seen |= 1u << rank;
}

/* Three gw-runs, none told its number: one is node 0, the others say which
 * number node 0 gave them, and the six ranks are 0..5, each once, each with
 * its node's GROUP_RANK. */
START_TEST(test_arrival_numbers_nodes)
{
    const char *env[] = {"GW_JOB_TOKEN=arrival-three", NULL};
    const int port = gwrun_free_port_pair();
    struct run r[3];
    for (int i = 0; i < 3; i++)
        arrival_start(&r[i], env, port, 3, "2", NULL, "echo \"$RANK $GROUP_RANK $LOCAL_RANK\"");
    nodes_wait(r, 3);
    struct ranks_seen s = {.nproc = 2};
    int said[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(r[i].code == 0, "gw-run %d: exit code %d, stderr:\n%s", i, r[i].code, r[i].err);
        gwrun_for_each_line(r[i].out, note_rank, &s);
        for (int k = 1; k < 3; k++) {
            char want[80];
            snprintf(want, sizeof want, "this node is node %d of 3", k);
            said[k] += strstr(r[i].err, want) != NULL;
        }
        said[0] += strstr(r[i].err, "this node is node") == NULL;
    }
    ck_assert_msg(s.seen == 0x3fu && s.bad == 0 && said[0] == 1 && said[1] == 1 && said[2] == 1,
                  "ranks seen %#x (%d wrong), node 0/1/2 said %d/%d/%d times; stdout:\n%s%s%s\nstderr:\n%s%s%s",
                  s.seen, s.bad, said[0], said[1], said[2], r[0].out, r[1].out, r[2].out, r[0].err, r[1].err,
                  r[2].err);
    gwrun_nodes_free(r, 3);
}
END_TEST

/* torchrun's multi-node line, unchanged but for the program: no
 * GW_JOB_TOKEN (the --rdzv-id is the token), --nnodes 2:2, c10d at
 * --rdzv-endpoint. */
START_TEST(test_arrival_torchrun_flags)
{
    const char *env[] = {"GW_JOB_TOKEN", NULL};
    const int port = gwrun_free_port_pair();
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "--rdzv-endpoint=127.0.0.1:%d", port);
    const char *args[] = {"--nnodes=2:2", "--nproc-per-node=1", "--rdzv-backend=c10d", endpoint,
                          "--rdzv-id=job4711", "--rdzv-conf=join_timeout=30,read_timeout=60", "sh", "-c",
                          "echo \"$RANK $WORLD_SIZE ${GW_JOB_TOKEN%%.*}\"", NULL};
    struct run r[2];
    for (int i = 0; i < 2; i++)
        gwrun_start(&r[i], env, args);
    nodes_wait(r, 2);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 0 && strstr(r[i].err, "ignoring --rdzv-conf read_timeout=60"),
                      "gw-run %d: exit code %d, stderr:\n%s", i, r[i].code, r[i].err);
    const bool first = gwrun_has_line(r[0].out, "[0] 0 2 job4711");
    ck_assert_msg(gwrun_has_line(r[first ? 0 : 1].out, "[0] 0 2 job4711") &&
                      gwrun_has_line(r[first ? 1 : 0].out, "[1] 1 2 job4711"),
                  "stdout:\n%s%s\nstderr:\n%s%s", r[0].out, r[1].out, r[0].err, r[1].err);
    gwrun_nodes_free(r, 2);

    /* The endpoint's port defaults to c10d's 29400 (one node: nothing listens) */
    struct run one;
    gwrun_run(&one, NULL, (const char *[]){"-n", "1", "--rdzv-endpoint", "[::1]", "sh", "-c",
                                           "echo $GW_MASTER_ADDR $GW_MASTER_PORT", NULL});
    ck_assert_msg(one.code == 0 && gwrun_has_line(one.out, "[0] ::1 29400"), "exit %d, stdout:\n%s\nstderr:\n%s",
                  one.code, one.out, one.err);
    gwrun_free(&one);
}
END_TEST

/* A third gw-run for a 2-node job whose nodes both joined: refused (no
 * number left), and the job runs on. */
START_TEST(test_arrival_node_too_many)
{
    const char *env[] = {"GW_JOB_TOKEN=arrival-extra", NULL};
    const int port = gwrun_free_port_pair();
    char go[] = "/tmp/gw-arrival-go-XXXXXX", script[200];
    const int fd = mkstemp(go);
    ck_assert_int_ge(fd, 0);
    close(fd);
    unlink(go);
    snprintf(script, sizeof script, "while [ ! -e %s ]; do sleep 0.05; done; echo \"$RANK $GROUP_RANK $LOCAL_RANK\"",
             go);
    struct run r[3];
    /* Node 0 by its flag; the others never node 0 (is_host=0): on one
     * machine, one started before node 0 listens would take its place */
    const char *const zero[] = {"--node-rank", "0", NULL}, *const not_host[] = {"--rdzv-conf", "is_host=0", NULL};
    arrival_start(&r[0], env, port, 2, "1", zero, script);
    arrival_start(&r[1], env, port, 2, "1", not_host, script);
    const bool joined = gwrun_stderr_has(&r[1], "this node is node 1 of 2", 15);
    arrival_start(&r[2], env, port, 2, "1", not_host, script);
    gwrun_wait(&r[2], NODE_TIMEOUT_S);
    FILE *f = fopen(go, "w");
    if (f)
        fclose(f);
    nodes_wait(r, 2);
    unlink(go);
    ck_assert_msg(joined, "node 1 was never numbered; stderr:\n%s", r[1].err);
    ck_assert_msg(r[2].code != 0 && strstr(r[2].err, "all 2 nodes of the job joined already") &&
                      strstr(r[0].err, "all 2 nodes of the job joined already") && r[2].out[0] == '\0',
                  "the third gw-run: exit %d, stdout:\n%s\nstderr:\n%s\nnode 0:\n%s", r[2].code, r[2].out, r[2].err,
                  r[0].err);
    struct ranks_seen s = {.nproc = 1};
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(r[i].code == 0, "node %d: exit code %d, stderr:\n%s", i, r[i].code, r[i].err);
        gwrun_for_each_line(r[i].out, note_rank, &s);
    }
    ck_assert_msg(s.seen == 3u && s.bad == 0, "ranks %#x; stdout:\n%s%s", s.seen, r[0].out, r[1].out);
    gwrun_nodes_free(r, 3);
}
END_TEST

/* A node numbered by arrival after the job ended (node 0's rank failed and
 * node 0 waits to tell late nodes): how it ended comes with the welcome, and
 * the node starts nothing, exiting with the job's code.  Its ranks started,
 * with no teardown left to stop them. */
START_TEST(test_arrival_after_the_end)
{
    const char *env[] = {"GW_JOB_TOKEN=arrival-late", "GW_RUN_JOIN_TIMEOUT=15", NULL};
    const int port = gwrun_free_port_pair();
    const char *const zero[] = {"--node-rank", "0", NULL}, *const not_host[] = {"--rdzv-conf", "is_host=0", NULL};
    struct run r[2];
    arrival_start(&r[0], env, port, 2, "1", zero, "exit 4");
    const bool waiting = gwrun_stderr_has(&r[0], "waiting up to", 10.0);
    arrival_start(&r[1], env, port, 2, "1", not_host, "echo started");
    nodes_wait(r, 2);
    ck_assert_msg(waiting, "node 0 did not wait for a late node; stderr:\n%s", r[0].err);
    ck_assert_msg(r[0].code == 4, "node 0: exit %d, stderr:\n%s", r[0].code, r[0].err);
    ck_assert_msg(r[1].code == 4 && r[1].out[0] == '\0' &&
                      strstr(r[1].err, "node 1: the job ended before this node joined; no rank started"),
                  "the late node: exit %d, stdout:\n%s\nstderr:\n%s", r[1].code, r[1].out, r[1].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

/* A gw-run waiting for its number (is_host=0: it joins even on the master's
 * machine; here a socket that never answers holds the port) ends at
 * SIGTERM, saying so, with no rank started.  Without is_host, the port
 * taken here makes it join the socket's owner, and the join timeout says
 * that owner may not be a gw-run. */
START_TEST(test_arrival_signal_and_port_taken)
{
    const char *env[] = {"GW_JOB_TOKEN=arrival-wait", NULL};
    const int port = gwrun_free_port_pair();
    const int lfd = launcher_listen(port); /* never answers as node 0 would */
    const char *const not_host[] = {"--rdzv-conf", "is_host=0", NULL};
    struct run r;
    arrival_start(&r, env, port, 2, "1", not_host, "echo started");
    const int fd = accept(lfd, NULL, NULL); /* it is in its join loop now */
    if (fd >= 0)
        kill(r.pid, SIGTERM);
    gwrun_wait(&r, NODE_TIMEOUT_S);
    if (fd >= 0)
        close(fd);
    ck_assert_msg(fd >= 0 && r.code == 128 + SIGTERM && strstr(r.err, "SIGTERM before node 0 numbered this node") &&
                      r.out[0] == '\0',
                  "exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);

    const char *const quick[] = {"--rdzv-conf", "join_timeout=2", NULL};
    arrival_start(&r, env, port, 2, "1", quick, "echo started");
    gwrun_wait(&r, NODE_TIMEOUT_S);
    close(lfd);
    ck_assert_msg(r.code != 0 && strstr(r.err, "this node: no answer from node 0") &&
                      strstr(r.err, "took the program that holds the launcher port here for node 0") &&
                      r.out[0] == '\0',
                  "exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
}
END_TEST

void add_multinode_arrival_tests(TCase *tc)
{
    tcase_add_test(tc, test_arrival_numbers_nodes);
    tcase_add_test(tc, test_arrival_torchrun_flags);
    tcase_add_test(tc, test_arrival_node_too_many);
    tcase_add_test(tc, test_arrival_after_the_end);
    tcase_add_test(tc, test_arrival_signal_and_port_taken);
}
