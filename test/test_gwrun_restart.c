/*
 * test_gwrun_restart: Check suite for gw-run --max-restarts (tools/gw-run.c).
 *
 * What it is: black-box tests of the built gw-run (GW_RUN_BIN) with sh ranks:
 * a failed job is started again, all of its ranks, with GW_RESTART_COUNT
 * counting up, a fresh job token and master port each time, until it
 * succeeds or the restarts are used up (then the last failure's exit code);
 * no restart after a signal to gw-run or for a program that cannot be
 * started; the flag's checks; and the same across nodes (one gw-run per node
 * on this machine): all nodes start the next attempt together, end together
 * when the restarts are used up or a signal came, and must agree on K.
 *
 * What it is not: a test of a program resuming (test_train_restart.c runs
 * gw-train through a restart), nor of the teardown itself (test_gwrun.c).
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gwrun_helpers.h"

/* Ranks that fail at once could get the teardown's SIGTERM to the others in
 * before those printed their line: each rank says it printed (a file per
 * attempt and rank in $GWT_DIR), and waits until all `n` of its attempt did
 * before it goes on (a wait of at most 20 s). */
#define SYNCED(n)                                                                                       \
    "touch \"$GWT_DIR/$GW_RESTART_COUNT.$GW_RANK\"; k=0; "                                             \
    "while [ $(ls \"$GWT_DIR\" | grep -c \"^$GW_RESTART_COUNT\\.\") -lt " n " ] && [ $k -lt 400 ]; do " \
    "sleep 0.05; k=$((k+1)); done; "


/* Rank 1 fails (exit 5) on the first two attempts; every rank says what it
 * sees. */
START_TEST(test_restarts_until_success)
{
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "3", "sh", "-c",
                          "echo \"attempt $GW_RESTART_COUNT/$GW_MAX_RESTARTS port $GW_MASTER_PORT "
                          "token $GW_JOB_TOKEN\"; " SYNCED("2")
                          "if [ \"$GW_RANK\" = 1 ] && [ \"$GW_RESTART_COUNT\" -lt 2 ]; then exit 5; fi",
                          NULL};
    char dir[64];
    gwt_dir(dir, sizeof dir);
    gwrun_run(&r, (const char *const[]){"GW_RUN_KILL_GRACE=30", "GW_JOB_TOKEN=tok", dir, NULL}, args);
    gwt_dir_remove(dir);
    ck_assert_msg(r.code == 0, "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    ck_assert_msg(strstr(r.err, "restarting the job (exit code 5): restart 1 of 3, 2 ranks") &&
                      strstr(r.err, "restart 2 of 3") && !strstr(r.err, "restart 3 of 3"),
                  "stderr:\n%s", r.err);
    /* Each attempt: both ranks, its count, one port (a free one picked anew:
     * the kernel may hand out the same again) and a token of its own. */
    char port[3][16] = {{0}};
    for (int a = 0; a < 3; a++)
        for (int rank = 0; rank < 2; rank++) {
            char pre[64];
            snprintf(pre, sizeof pre, "[%d] attempt %d/3 port ", rank, a);
            const char *p = strstr(r.out, pre);
            ck_assert_msg(p, "no '%s' in stdout:\n%s", pre, r.out);
            char pt[16] = "", tok[64] = "";
            ck_assert_int_eq(sscanf(p + strlen(pre), "%15s token %63s", pt, tok), 2);
            if (rank == 0)
                snprintf(port[a], sizeof port[a], "%s", pt);
            ck_assert_msg(!strcmp(pt, port[a]), "attempt %d: ranks on ports %s and %s", a, port[a], pt);
            char want[64];
            snprintf(want, sizeof want, a ? "tok.restart%d" : "tok", a);
            ck_assert_msg(!strcmp(tok, want), "attempt %d: token %s, expected %s", a, tok, want);
        }
    ck_assert_msg(!strstr(r.out, "attempt 3/3"), "a fourth attempt ran:\n%s", r.out);
    gwrun_free(&r);
}
END_TEST

/* Every attempt fails: the job ends with the last one's code after K restarts. */
START_TEST(test_restarts_used_up)
{
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "2", "sh", "-c",
                          "echo \"attempt $GW_RESTART_COUNT\"; " SYNCED("2") "exit $((3 + GW_RESTART_COUNT))",
                          NULL};
    char dir[64];
    gwt_dir(dir, sizeof dir);
    gwrun_run(&r, (const char *const[]){dir, NULL}, args);
    gwt_dir_remove(dir);
    ck_assert_msg(r.code == 5, "exit %d (expected the third attempt's 5)\nstderr:\n%s", r.code, r.err);
    ck_assert_msg(strstr(r.out, "[0] attempt 2") && !strstr(r.out, "attempt 3") &&
                      strstr(r.err, "the job failed again; no restarts left (2 used)"),
                  "stdout:\n%s\nstderr:\n%s", r.out, r.err);
    gwrun_free(&r);
}
END_TEST

/* A SIGTERM while a failed attempt's leftovers take their grace (every rank
 * gone, a process rank 0 started ignoring SIGTERM): no restart, the
 * failure's code kept, and both said (nothing was: the signal found no rank
 * to forward to, and the restart was dropped unsaid). */
START_TEST(test_signal_in_cleanup_said)
{
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "3", "sh", "-c",
                          "if [ \"$GW_RANK\" = 1 ]; then sleep 0.3; exit 7; fi; "
                          "(trap '' TERM; sleep 30) & sleep 30",
                          NULL};
    gwrun_start(&r, (const char *const[]){"GW_RUN_KILL_GRACE=4", NULL}, args);
    const bool cleaning = gwrun_stderr_has(&r, "left behind by exited ranks", 30);
    kill(r.pid, SIGTERM);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    ck_assert_msg(cleaning && !r.timed_out && r.code == 7, "exit %d\nstderr:\n%s", r.code, r.err);
    ck_assert_msg(strstr(r.err, "gw-run: received SIGTERM with no rank running") &&
                      strstr(r.err, "gw-run: not restarting the job: stopped by SIGTERM") &&
                      !strstr(r.err, "gw-run: restarting"), "stderr:\n%s", r.err);
    gwrun_free(&r);
}
END_TEST

/* SIGTERM to gw-run stops the job for good: no restart.  The ranks fail on
 * it (exit 3: gw-run's code then), so only the rule about signals keeps
 * gw-run from restarting (ranks that die of the signal itself are no failure
 * anyway: it then exits 128 + 15). */
START_TEST(test_no_restart_after_signal)
{
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "3", "sh", "-c",
                          "trap 'exit 3' TERM; echo \"attempt $GW_RESTART_COUNT\" >&2; while :; do sleep 0.1; done",
                          NULL};
    gwrun_start(&r, (const char *const[]){"GW_RUN_KILL_GRACE=5", NULL}, args);
    /* both traps set (their lines come after them), at most 30 s */
    const bool trapped = gwrun_stderr_has(&r, "[0] attempt 0", 30) && gwrun_stderr_has(&r, "[1] attempt 0", 30);
    kill(r.pid, SIGTERM);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    ck_assert_msg(trapped && !r.timed_out && r.code == 3, "exit %d\nstderr:\n%s", r.code, r.err);
    ck_assert_msg(!strstr(r.err, "gw-run: restarting") && !strstr(r.err, "attempt 1") &&
                      strstr(r.err, "gw-run: not restarting the job: stopped by SIGTERM"), "stdout:\n%s\nstderr:\n%s",
                  r.out, r.err);
    gwrun_free(&r);
}
END_TEST

/* A SIGINT between two attempts (held there: GW_RUN_TEST_RESTART_DELAY_MS
 * widens the moment) stops the job instead of starting it again with ranks
 * that never hear of it. */
START_TEST(test_no_restart_signal_between)
{
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "3", "sh", "-c",
                          "echo \"attempt $GW_RESTART_COUNT\"; exit 3", NULL};
    gwrun_start(&r, (const char *const[]){"GW_RUN_TEST_RESTART_DELAY_MS=30000", NULL}, args);
    ck_assert(gwrun_stderr_has(&r, "holding the restart", 30)); /* the window is open, until a signal */
    kill(r.pid, SIGINT);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    ck_assert_msg(!r.timed_out && r.code == 128 + SIGINT && !strstr(r.out, "attempt 1") &&
                      strstr(r.err, "SIGINT arrived as the job was to start again: not restarting it"),
                  "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
}
END_TEST

/* A SIGUSR1 while gw-run holds signals between two attempts (a scheduler's
 * "checkpoint now" at that moment; GW_RUN_TEST_RESTART_DELAY_MS widens it) is
 * dropped, and said so.  Passed on, it reached the ranks just started, which
 * had no handler for it yet, and killed them: the last restart used up, the
 * job failed with 128 + SIGUSR1. */
START_TEST(test_usr1_between_attempts_dropped)
{
    struct run r;
    const char *args[] = {"-n", "1", "--max-restarts", "1", "sh", "-c",
                          "echo \"attempt $GW_RESTART_COUNT\"; [ \"$GW_RESTART_COUNT\" = 0 ] && exit 3; "
                          "sleep 1; echo done",
                          NULL};
    gwrun_start(&r, (const char *const[]){"GW_RUN_TEST_RESTART_DELAY_MS=30000", NULL}, args);
    const bool ended = gwrun_stderr_has(&r, "holding the restart", 30); /* the window is open, until a signal */
    if (ended)
        kill(r.pid, SIGUSR1);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    ck_assert_msg(ended && !r.timed_out && r.code == 0 && gwrun_has_line(r.out, "[0] done") &&
                      strstr(r.err, "SIGUSR1 arrived before the ranks started"),
                  "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
}
END_TEST

/* A job token that fits the library's 128 characters keeps fitting in every
 * attempt (TOKEN.restartK would not), and differs between attempts. */
START_TEST(test_restart_long_token)
{
    char tok[160] = "GW_JOB_TOKEN=";
    memset(tok + strlen(tok), 't', 125);
    struct run r;
    const char *args[] = {"-n", "1", "--max-restarts", "2", "sh", "-c",
                          "echo \"attempt $GW_RESTART_COUNT $(printf %s \"$GW_JOB_TOKEN\" | wc -c) $GW_JOB_TOKEN\"; "
                          "[ \"$GW_RESTART_COUNT\" = 2 ]",
                          NULL};
    gwrun_run(&r, (const char *const[]){tok, NULL}, args);
    ck_assert_msg(r.code == 0, "exit %d\nstderr:\n%s", r.code, r.err);
    char seen[3][160] = {{0}};
    for (int a = 0; a < 3; a++) {
        char pre[32];
        snprintf(pre, sizeof pre, "[0] attempt %d ", a);
        const char *p = strstr(r.out, pre);
        int len = 0;
        ck_assert_msg(p && sscanf(p + strlen(pre), "%d %159s", &len, seen[a]) == 2, "stdout:\n%s", r.out);
        ck_assert_msg(len <= 128 && (int)strlen(seen[a]) == len, "attempt %d: a token of %d characters", a, len);
        for (int b = 0; b < a; b++)
            ck_assert_msg(strcmp(seen[a], seen[b]), "attempts %d and %d share token %s", b, a, seen[a]);
    }
    gwrun_free(&r);
}
END_TEST

/* A program that cannot be started is not tried again; one that started and
 * exited 127 (a wrapper script whose last command is missing) is: its exit
 * code alone was taken for "could not be started". */
START_TEST(test_no_restart_not_found)
{
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "3", "gw-no-such-program-xyz", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 127 && strstr(r.err, "not restarting the job: the program could not be started") &&
                      !strstr(r.err, "restarting the job ("),
                  "exit %d\nstderr:\n%s", r.code, r.err);
    gwrun_free(&r);
    const char *ran[] = {"-n", "2", "--max-restarts", "1", "sh", "-c", "echo attempt $GW_RESTART_COUNT; exit 127",
                         NULL};
    gwrun_run(&r, NULL, ran);
    ck_assert_msg(r.code == 127 && strstr(r.err, "restarting the job (exit code 127): restart 1 of 1") &&
                      strstr(r.out, "attempt 1") && !strstr(r.err, "could not be started"),
                  "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
}
END_TEST

START_TEST(test_restart_flags)
{
    static const char *const cases[][6] = {
        {"-n", "2", "--max-restarts", "-1", "true", NULL},
        {"-n", "2", "--max-restarts", "x", "true", NULL},
        {"-n", "2", "--max-restarts", "10001", "true", NULL},
        {"-n", "2", "--max-restarts", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run r;
        gwrun_run(&r, (const char *const[]){"GW_JOB_TOKEN=t", NULL}, cases[i]);
        ck_assert_msg(r.code == 2 && strstr(r.err, "gw-run: ") && strstr(r.err, "usage:"),
                      "case %zu: exit %d, stderr:\n%s", i, r.code, r.err);
        gwrun_free(&r);
    }
    struct run r;
    gwrun_run(&r, NULL, (const char *const[]){"--help", NULL});
    ck_assert_msg(r.code == 0 && strstr(r.out, "--max-restarts K"), "--help:\n%s", r.out);
    gwrun_free(&r);
    /* 0 is the default: one attempt, the failure stands. */
    gwrun_run(&r, NULL, (const char *const[]){"-n", "1", "--max-restarts", "0", "sh", "-c",
                                              "echo \"attempt $GW_RESTART_COUNT of $GW_MAX_RESTARTS\"; exit 4",
                                              NULL});
    ck_assert_msg(r.code == 4 && strstr(r.out, "attempt 0 of 0") && !strstr(r.err, "restart"),
                  "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
}
END_TEST

/* ---- several nodes: one gw-run per node on this machine ---- */

/* Starts both nodes of a 2-node job of 2 ranks each (master 127.0.0.1:port)
 * with --max-restarts restarts (node 1's own where restarts1 is not NULL). */
static void nodes_start(struct run r[2], int port, const char *const *env0, const char *const *env1,
                        const char *restarts, const char *restarts1, const char *script)
{
    const char *extra0[] = {"--max-restarts", restarts, NULL};
    const char *extra1[] = {"--max-restarts", restarts1 ? restarts1 : restarts, NULL};
    gwrun_node_start(&r[0], env0, port, 2, 0, "2", extra0, script);
    gwrun_node_start(&r[1], env1 ? env1 : env0, port, 2, 1, "2", extra1, script);
}

/* Rank 3 (node 1) fails on the first attempt: node 0 hears of it, both nodes
 * tear down, node 1 says it is ready, node 0 starts attempt 1 everywhere,
 * with the next token on both nodes; the job then succeeds on both. */
START_TEST(test_nodes_restart_together)
{
    int port = gwrun_free_port_pair();
    char dir[64];
    gwt_dir(dir, sizeof dir);
    const char *env[] = {"GW_JOB_TOKEN=mn-restart", "GW_RUN_KILL_GRACE=10", dir, NULL};
    /* Rank 0 takes 1.5 s to end after the teardown's SIGTERM (a checkpoint
     * saved on the way out): node 1 may start again only after that. */
    const char *script = "echo \"attempt $GW_RESTART_COUNT token $GW_JOB_TOKEN\"; "
                         "if [ \"$GW_RESTART_COUNT\" = 0 ] && [ \"$GW_RANK\" = 0 ]; then "
                         "trap 'sleep 1.5; date +%s.%N > \"$GWT_DIR/ended\"; exit 0' TERM; sleep 30 & wait; fi; "
                         "if [ \"$GW_RESTART_COUNT\" = 1 ]; then date +%s.%N > \"$GWT_DIR/started.$GW_RANK\"; fi; "
                         "if [ \"$GW_RANK\" = 3 ] && [ \"$GW_RESTART_COUNT\" = 0 ]; then sleep 0.5; exit 6; fi; sleep 0.5";
    struct run r[2];
    nodes_start(r, port, env, NULL, "2", NULL, script);
    gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
    double t[5] = {0};
    const char *files[] = {"ended", "started.0", "started.1", "started.2", "started.3"};
    for (int i = 0; i < 5; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", dir + strlen("GWT_DIR="), files[i]);
        FILE *f = fopen(path, "r");
        ck_assert_msg(f && fscanf(f, "%lf", &t[i]) == 1, "no %s", files[i]);
        fclose(f);
    }
    gwt_dir_remove(dir);
    for (int i = 1; i < 5; i++)
        ck_assert_msg(t[i] > t[0], "rank %d of attempt 1 started %.2f s before attempt 0's rank 0 ended", i - 1,
                      t[0] - t[i]);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(r[i].code == 0, "node %d: exit %d\nstdout:\n%s\nstderr:\n%s", i, r[i].code, r[i].out, r[i].err);
        ck_assert_msg(strstr(r[i].err, "restarting the job (exit code 6): restart 1 of 2") &&
                          !strstr(r[i].err, "restart 2 of 2"),
                      "node %d: stderr:\n%s", i, r[i].err);
        for (int k = 0; k < 2; k++) {
            char want[80];
            snprintf(want, sizeof want, "[%d] attempt 1 token mn-restart.restart1", 2 * i + k);
            ck_assert_msg(strstr(r[i].out, want), "node %d: no '%s' in stdout:\n%s", i, want, r[i].out);
        }
        ck_assert_msg(!strstr(r[i].out, "attempt 2"), "node %d: a third attempt:\n%s", i, r[i].out);
    }
    gwrun_nodes_free(r, 2);
}
END_TEST

/* Every attempt fails: both nodes end with the failure after K restarts. */
START_TEST(test_nodes_restarts_used_up)
{
    int port = gwrun_free_port_pair();
    char dir[64];
    gwt_dir(dir, sizeof dir);
    const char *env[] = {"GW_JOB_TOKEN=mn-used-up", dir, NULL};
    const char *script = "echo \"attempt $GW_RESTART_COUNT\"; " SYNCED("4")
                         "if [ \"$GW_RANK\" = 0 ]; then exit 4; fi; sleep 5";
    struct run r[2];
    nodes_start(r, port, env, NULL, "1", NULL, script);
    gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
    gwt_dir_remove(dir);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 4 && strstr(r[i].out, "attempt 1") && !strstr(r[i].out, "attempt 2"),
                      "node %d: exit %d\nstdout:\n%s\nstderr:\n%s", i, r[i].code, r[i].out, r[i].err);
    ck_assert_msg(strstr(r[0].err, "the job failed again; no restarts left (1 used)"), "node 0:\n%s", r[0].err);
    /* node 1 says node 0's verdict (it said nothing of why it ended) */
    ck_assert_msg(strstr(r[1].err, "gw-run: node 0 (host ") &&
                      strstr(r[1].err, "): the job failed again; no restarts left (1 used)"),
                  "node 1:\n%s", r[1].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

/* Node 1's ranks end well at once; node 0's rank 0 fails 1.5 s later, on the
 * first attempt only: node 1's gw-run stayed (restarts were left), so the job
 * starts again on both nodes and succeeds.  Node 1 had left at once, and
 * node 0, without it, did not restart ("a node was stopped, lost or cannot
 * start again"), exiting 4, while the other way round (node 1's rank
 * failing) restarted: a helper's probe. */
START_TEST(test_nodes_done_node_restarts)
{
    int port = gwrun_free_port_pair();
    /* (node 1 says why it stays from 0.5 s on: a note still due in the next
     * attempt would spin its loop there, which takes 2 s) */
    const char *noted[] = {"GW_JOB_TOKEN=mn-done-first", "GW_RUN_TEST_DONE_NOTE_MS=500", NULL};
    const char *script = "echo \"attempt $GW_RESTART_COUNT\"; [ $GW_RESTART_COUNT = 1 ] && { sleep 2; exit 0; }; "
                         "[ $GW_RANK -ge 2 ] && exit 0; sleep 1.5; [ $GW_RANK = 0 ] && exit 4; exit 0";
    struct run r[2];
    nodes_start(r, port, noted, NULL, "2", NULL, script);
    gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 0 && strstr(r[i].err, "restarting the job (exit code 4): restart 1 of 2") &&
                          strstr(r[i].out, "attempt 1") && !strstr(r[i].out, "attempt 2"),
                      "node %d: exit %d\nstdout:\n%s\nstderr:\n%s", i, r[i].code, r[i].out, r[i].err);
    ck_assert_msg(r[1].cpu_s < 1.0, "node 1's gw-run used %.2f s of CPU in %.1f s", r[1].cpu_s, r[1].elapsed);
    gwrun_nodes_free(r, 2);
    /* and a job that ends well everywhere ends on node 1 as node 0 ends;
     * node 1 says why it stays, and stays idle (a passed deadline, its
     * DONE's flush, spins its loop) */
    port = gwrun_free_port_pair();
    nodes_start(r, port, noted, NULL, "2", NULL, "[ $GW_RANK = 0 ] && sleep 3; exit 0");
    gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 0 && !strstr(r[i].err, "restarting"), "node %d: exit %d\nstderr:\n%s", i, r[i].code,
                      r[i].err);
    ck_assert_msg(strstr(r[1].err, "gw-run: node 1: this node's ranks are done; staying until node 0"), "node 1:\n%s",
                  r[1].err);
    ck_assert_msg(r[1].cpu_s < 1.0, "node 1's gw-run used %.2f s of CPU in %.1f s", r[1].cpu_s, r[1].elapsed);
    gwrun_nodes_free(r, 2);
    /* an interrupt there: node 1 leaves, and the job goes on without it */
    port = gwrun_free_port_pair();
    nodes_start(r, port, noted, NULL, "2", NULL, "[ $GW_RANK = 0 ] && sleep 4; exit 0");
    const bool staying = gwrun_stderr_has(&r[1], "staying until node 0", 20);
    if (staying)
        kill(r[1].pid, SIGINT);
    gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
    ck_assert_msg(staying, "node 1 did not say it stays:\n%s", r[1].err);
    ck_assert_msg(r[0].code == 0 && !strstr(r[0].err, "SIGINT"), "node 0: exit %d\nstderr:\n%s", r[0].code, r[0].err);
    ck_assert_msg(r[1].code == 130 && strstr(r[1].err, "gw-run: node 1: leaving; its ranks are done"),
                  "node 1: exit %d\nstderr:\n%s", r[1].code, r[1].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

/* Node 1's rank fails; while node 1 waits for node 0's verdict on
 * restarting (node 0's rank 0 takes its time over the SIGTERM), node 0's
 * gw-run is killed: node 1 says it lost node 0 before its word and ends
 * (it ended with the rank's code, without a word of why). */
START_TEST(test_nodes_lost_before_verdict_said)
{
    int port = gwrun_free_port_pair();
    const char *env[] = {"GW_JOB_TOKEN=mn-lost-verdict", "GW_RUN_KILL_GRACE=20", NULL};
    const char *script = "[ $GW_RANK = 0 ] && trap 'sleep 10; exit 0' TERM; "
                         "[ $GW_RANK = 3 ] && { sleep 0.5; exit 3; }; sleep 30 & wait";
    struct run r[2];
    nodes_start(r, port, env, NULL, "2", NULL, script);
    const bool failed = gwrun_stderr_has(&r[1], "rank 3 (pid", 20) && gwrun_stderr_has(&r[0], "stopping the", 10);
    if (failed) {
        gwrun_sleep(0.5); /* its READY is out */
        kill(r[0].pid, SIGKILL);
    }
    gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
    ck_assert_msg(failed, "rank 3 did not fail, or node 0 did not stop\n%s\n%s", r[0].err, r[1].err);
    ck_assert_msg(r[1].code == 3 && strstr(r[1].err, "gw-run: node 1: lost node 0 (host ") &&
                      strstr(r[1].err, ") before its word on restarting the job: not restarting; ending this node"),
                  "node 1: exit %d\nstderr:\n%s", r[1].code, r[1].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

/* A signal to one node's gw-run stops the job on every node for good (the
 * ranks fail on it, as above). */
START_TEST(test_nodes_no_restart_after_signal)
{
    int port = gwrun_free_port_pair();
    const char *env[] = {"GW_JOB_TOKEN=mn-signal", "GW_RUN_KILL_GRACE=5", NULL};
    const char *script = "trap 'exit 3' TERM; echo \"attempt $GW_RESTART_COUNT\"; while :; do sleep 0.1; done";
    struct run r[2];
    nodes_start(r, port, env, NULL, "3", NULL, script);
    gwrun_sleep(1.5);
    kill(r[1].pid, SIGTERM);
    gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code != 0 && !strstr(r[i].out, "attempt 1") && !strstr(r[i].err, "gw-run: restarting"),
                      "node %d: exit %d\nstdout:\n%s\nstderr:\n%s", i, r[i].code, r[i].out, r[i].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

/* A SIGINT to node 1's gw-run between two attempts (node 0 already sent
 * RESTART): node 1 does not start again and tells node 0, which stops the
 * attempt it started, saying why (it said "lost node 1" before). */
START_TEST(test_nodes_signal_between)
{
    int port = gwrun_free_port_pair();
    const char *env0[] = {"GW_JOB_TOKEN=mn-sigbetween", NULL};
    const char *env1[] = {"GW_JOB_TOKEN=mn-sigbetween", "GW_RUN_TEST_RESTART_DELAY_MS=30000", NULL};
    const char *script = "echo \"attempt $GW_RESTART_COUNT\"; "
                         "if [ \"$GW_RANK\" = 3 ] && [ \"$GW_RESTART_COUNT\" = 0 ]; then exit 6; fi; exec sleep 30";
    struct run r[2];
    nodes_start(r, port, env0, env1, "2", NULL, script);
    const bool held = gwrun_stderr_has(&r[1], "holding the restart", 30); /* node 1's window, open until a signal */
    kill(r[1].pid, SIGINT);
    gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
    ck_assert_msg(held, "node 1 never held its restart; stderr:\n%s", r[1].err);
    ck_assert_msg(r[1].code == 128 + SIGINT && strstr(r[1].err, "SIGINT arrived as the job was to start again") &&
                      !strstr(r[1].out, "attempt 1"),
                  "node 1: exit %d\nstdout:\n%s\nstderr:\n%s", r[1].code, r[1].out, r[1].err);
    ck_assert_msg(r[0].code != 0 && strstr(r[0].err, "node 1 (host") && strstr(r[0].err, "received SIGINT") &&
                      !strstr(r[0].err, "lost node"),
                  "node 0: exit %d\nstderr:\n%s", r[0].code, r[0].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

/* A fork refused on node 1 (its launcher's failure, an ABORT) is restarted as
 * one on node 0 or a single node is; here it fails every time. */
START_TEST(test_nodes_launch_failure_restarts)
{
    int port = gwrun_free_port_pair();
    const char *env0[] = {"GW_JOB_TOKEN=mn-forkfail", NULL};
    const char *env1[] = {"GW_JOB_TOKEN=mn-forkfail", "GW_RUN_TEST_FORK_FAIL=3", NULL};
    struct run r[2];
    nodes_start(r, port, env0, env1, "1", NULL, "exec sleep 30");
    gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 1 && strstr(r[i].err, "restarting the job (exit code 1): restart 1 of 1"),
                      "node %d: exit %d\nstderr:\n%s", i, r[i].code, r[i].err);
    ck_assert_msg(strstr(r[0].err, "no restarts left (1 used)"), "node 0:\n%s", r[0].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

/* Node 1 fails before node 0 has started: it lingers to tell node 0, is
 * welcomed when node 0 comes, and waits for the verdict while node 0's rank 0
 * takes 7 s over the teardown's SIGTERM.  That wait blocks in poll: once the
 * linger's deadline (5 s after the failure) passed, it spun at timeout 0
 * until the verdict (seconds of CPU; gw-run's own is a few hundredths). */
START_TEST(test_nodes_wait_verdict_idle)
{
    /* Only a run where rank 0 caught the SIGTERM tests the wait: one whose
     * SIGTERM came before its shell set the trap ends at once, before the
     * linger's deadline, and proves nothing (it says "lingered" when caught). */
    for (int attempt = 1;; attempt++) {
        int port = gwrun_free_port_pair();
        const char *env[] = {"GW_JOB_TOKEN=mn-idle", "GW_RUN_JOIN_TIMEOUT=30", "GW_RUN_KILL_GRACE=10", NULL};
        const char *script = "[ \"$GW_RANK\" = 0 ] && trap 'echo lingered; sleep 7; exit 0' TERM; "
                             "echo \"attempt $GW_RESTART_COUNT\"; [ \"$GW_RESTART_COUNT\" = 1 ] && exit 0; "
                             "if [ \"$GW_RANK\" = 2 ]; then exit 6; fi; "
                             "sleep 30 & wait";
        const char *extra[] = {"--max-restarts", "1", NULL};
        struct run r[2];
        gwrun_node_start(&r[1], env, port, 2, 1, "2", extra, script);
        ck_assert_msg(gwrun_stderr_has(&r[1], "rank 2 (pid", 20), "node 1's rank 2 did not fail");
        gwrun_sleep(0.5); /* it lingers */
        gwrun_node_start(&r[0], env, port, 2, 0, "2", extra, script);
        gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
        for (int i = 0; i < 2; i++)
            ck_assert_msg(r[i].code == 0 && strstr(r[i].err, "restart 1 of 1"), "node %d: exit %d\nstdout:\n%s\nstderr:\n%s",
                          i, r[i].code, r[i].out, r[i].err);
        const bool lingered = strstr(r[0].out, "lingered") != NULL;
        if (lingered)
            ck_assert_msg(r[1].cpu_s < 1.0, "node 1's gw-run used %.2f s of CPU in %.1f s (a poll spinning?)",
                          r[1].cpu_s, r[1].elapsed);
        else
            ck_assert_msg(attempt < 3, "node 0's rank 0 never caught the SIGTERM in 3 runs (stdout:\n%s)", r[0].out);
        gwrun_nodes_free(r, 2);
        if (lingered) break;
    }
}
END_TEST

/* Node 1's kill grace is far shorter than node 0's: it sends READY at once
 * and, counting its own grace, would give up on the verdict after 4 s (3 x
 * 0.5 s + the test's 0.5 s in place of 30, doubled) while node 0's rank 0
 * takes 6 s over its SIGTERM (within node 0's 15 s grace).  Node 0's WAIT,
 * its answer to the READY, gives node 1 the longest grace: both nodes start
 * attempt 1 together and succeed.  Without the WAIT (node 0 not sending
 * it, or node 1 not heeding it; the slack hook came with it), node 1 said
 * "no word from node 0" and ended, and node 0's restart failed for want of
 * it. */
START_TEST(test_nodes_verdict_waits_longest_grace)
{
    for (int attempt = 1;; attempt++) {
        int port = gwrun_free_port_pair();
        const char *env0[] = {"GW_JOB_TOKEN=mn-graces", "GW_RUN_KILL_GRACE=15", "GW_RUN_TEST_VERDICT_SLACK_MS=500", NULL};
        const char *env1[] = {"GW_JOB_TOKEN=mn-graces", "GW_RUN_KILL_GRACE=0.5", "GW_RUN_TEST_VERDICT_SLACK_MS=500",
                              NULL};
        const char *script = "[ \"$GW_RANK\" = 0 ] && [ \"$GW_RESTART_COUNT\" = 0 ] && "
                             "trap 'echo lingered; sleep 6; exit 0' TERM; "
                             "echo \"attempt $GW_RESTART_COUNT\"; [ \"$GW_RESTART_COUNT\" = 1 ] && exit 0; "
                             "if [ \"$GW_RANK\" = 2 ]; then sleep 1; exit 6; fi; "
                             "sleep 30 & wait";
        struct run r[2];
        nodes_start(r, port, env0, env1, "1", NULL, script);
        gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
        const bool lingered = strstr(r[0].out, "lingered") != NULL;
        if (lingered) {
            for (int i = 0; i < 2; i++)
                ck_assert_msg(r[i].code == 0 && strstr(r[i].err, "restart 1 of 1") && strstr(r[i].out, "attempt 1") &&
                                  !strstr(r[i].err, "no word from node 0"),
                              "node %d: exit %d\nstdout:\n%s\nstderr:\n%s", i, r[i].code, r[i].out, r[i].err);
        } else {
            /* rank 0's SIGTERM came before its shell set the trap: proves nothing */
            ck_assert_msg(attempt < 3, "node 0's rank 0 never caught the SIGTERM in 3 runs (stdout:\n%s)", r[0].out);
        }
        gwrun_nodes_free(r, 2);
        if (lingered)
            break;
    }
}
END_TEST

/* The nodes must agree on --max-restarts, as on -n and --nnodes. */
START_TEST(test_nodes_restarts_must_agree)
{
    int port = gwrun_free_port_pair();
    const char *env[] = {"GW_JOB_TOKEN=mn-agree", NULL};
    struct run r[2];
    nodes_start(r, port, env, NULL, "2", "1", "sleep 5");
    gwrun_nodes_wait(r, 2, GWRUN_TIMEOUT_S);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code != 0 && strstr(r[i].err, "--max-restarts 1 but node 0") &&
                          strstr(r[i].err, "with --max-restarts 2"),
                      "node %d: exit %d\nstderr:\n%s", i, r[i].code, r[i].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("gw-run-restart");
    TCase *tc = tcase_create("restart");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_restarts_until_success);
    tcase_add_test(tc, test_restarts_used_up);
    tcase_add_test(tc, test_no_restart_after_signal);
    tcase_add_test(tc, test_signal_in_cleanup_said);
    tcase_add_test(tc, test_no_restart_not_found);
    tcase_add_test(tc, test_restart_flags);
    tcase_add_test(tc, test_no_restart_signal_between);
    tcase_add_test(tc, test_restart_long_token);
    tcase_add_test(tc, test_usr1_between_attempts_dropped);
    tcase_add_test(tc, test_nodes_restart_together);
    tcase_add_test(tc, test_nodes_restarts_used_up);
    tcase_add_test(tc, test_nodes_done_node_restarts);
    tcase_add_test(tc, test_nodes_lost_before_verdict_said);
    tcase_add_test(tc, test_nodes_no_restart_after_signal);
    tcase_add_test(tc, test_nodes_restarts_must_agree);
    tcase_add_test(tc, test_nodes_wait_verdict_idle);
    tcase_add_test(tc, test_nodes_verdict_waits_longest_grace);
    tcase_add_test(tc, test_nodes_signal_between);
    tcase_add_test(tc, test_nodes_launch_failure_restarts);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return gwrun_main("test_gwrun_restart", make_suite);
}
