/*
 * test_gwrun_multinode_handshake.c: the launcher port's handshake, from
 * test_gwrun_multinode.c (past 900 lines): frames that break the protocol
 * (too long, no such type, cut short, another version), a program posing as
 * node 0 (it learns no token and its welcome is refused), a node's failure
 * sent only after its hello, a refused node started again, and more silent
 * strangers than node 0 holds places for; and node 0 listening on each
 * address of the master's name.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gwrun_helpers.h"
#include "test_gwrun_multinode.h"

/* Writes a frame header claiming len body bytes, then body. */
static void send_raw(int fd, uint32_t len, const char *body, size_t n)
{
    unsigned char hdr[4] = {(unsigned char)(len >> 24), (unsigned char)(len >> 16),
                            (unsigned char)(len >> 8), (unsigned char)len};
    ssize_t w = write(fd, hdr, 4);
    if (n)
        w = write(fd, body, n);
    (void)w;
}

START_TEST(test_multinode_garbage_frames)
{
    /* Strangers on the launcher port get their connection closed with a log
     * line; the job itself is unaffected. */
    int port = gwrun_free_port_pair();
    const char *env[] = {"GW_JOB_TOKEN=mn-garbage", "GW_DEBUG=INFO", NULL};
    struct run r[2];
    node_start(&r[0], env, port, 2, 0, "1", "sleep 1.5");
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)(port + 1));
    int sent = 0;
    for (int tries = 0; tries < 200 && sent < 4; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            /* Over the 4 KiB limit; no such frame type; a hello cut short; the
             * hello of another protocol version (an older gw-run), refused by name. */
            if (sent == 0)
                send_raw(fd, 100000, "xxxx", 4);
            else if (sent == 1)
                send_raw(fd, 5, "\x63" "abcd", 5);
            else if (sent == 2)
                send_raw(fd, 3, "\x01" "ab", 3);
            else
                send_raw(fd, 9, "\x01" "GWL1" "\0\0\0\x01", 9);
            sent++;
            gwrun_sleep(0.1);
        } else {
            gwrun_sleep(0.02);
        }
        if (fd >= 0)
            close(fd);
    }
    node_start(&r[1], env, port, 2, 1, "1", "true");
    nodes_wait(r, 2);
    ck_assert_int_eq(sent, 4);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 0, "node %d: exit code %d, stderr:\n%s", i, r[i].code, r[i].err);
    ck_assert_msg(strstr(r[0].err, "frame length 100000") && strstr(r[0].err, "malformed frame") &&
                      strstr(r[0].err, "speaks version 1 of the launcher protocol, node 0's"),
                  "node 0 did not log the bad frames:\n%s", r[0].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

/* Another program on the launcher port (started before node 0's gw-run, or
 * at a wrong --master) learns nothing from a node and cannot pass for node
 * 0: the node's hello proves the token without sending it, and a welcome
 * without node 0's proof is refused by name.  The hello carried the token in
 * the clear (the impostor could then join the ranks' rendezvous as them). */
static bool read_some(int fd, unsigned char *buf, size_t cap, size_t *got, double timeout_s)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (*got < cap && gwrun_seconds_since(&t0) < timeout_s) {
        ssize_t n = recv(fd, buf + *got, cap - *got, MSG_DONTWAIT);
        if (n == 0)
            return *got > 0;
        if (n > 0)
            *got += (size_t)n;
        else
            gwrun_sleep(0.01);
        if (*got >= 4) { /* one whole frame is enough */
            size_t len = (size_t)buf[0] << 24 | (size_t)buf[1] << 16 | (size_t)buf[2] << 8 | buf[3];
            if (*got >= 4 + len)
                return true;
        }
    }
    return false;
}

int launcher_listen(int port)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(port + 1))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ck_assert_msg(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 8) == 0,
                  "cannot listen on the launcher port %d: %s", port + 1, strerror(errno));
    return lfd;
}

/* Node 0's side of the handshake on fd: its challenge (type 12, "GWL9", 16
 * bytes of nonce), then what the node sends back within 5 s, into buf.
 * True when a whole frame came and it is a hello (type 1). */
static bool challenge_for_hello(int fd, unsigned char *buf, size_t cap, size_t *got)
{
    send_raw(fd, 1 + 4 + 2 + 16, "\x0c" "GWL9" "\0\x10" "0123456789abcdef", 1 + 4 + 2 + 16);
    return read_some(fd, buf, cap, got, 5.0) && *got > 5 && buf[4] == 0x01;
}

START_TEST(test_multinode_impostor_master)
{
    int port = gwrun_free_port_pair();
    static const char token[] = "mn-impostor-secret-4711";
    const char *env[] = {"GW_JOB_TOKEN=mn-impostor-secret-4711", "GW_RUN_JOIN_TIMEOUT=4", "GW_DEBUG=INFO", NULL};
    int lfd = launcher_listen(port);
    struct run r[1];
    node_start(&r[0], env, port, 2, 1, "1", "exec sleep 6");
    int fd = accept(lfd, NULL, NULL);
    unsigned char hello[4 + 4096];
    size_t got = 0;
    bool heard = false;
    if (fd >= 0) {
        heard = challenge_for_hello(fd, hello, sizeof hello, &got);
        /* a welcome with a proof that is not node 0's: type 2, node 1, host, 32 bytes */
        send_raw(fd, 1 + 4 + 2 + 8 + 2 + 32,
                 "\x02" "\0\0\0\x01" "\0\x08" "impostor" "\0\x20" "................................",
                 1 + 4 + 2 + 8 + 2 + 32);
        gwrun_sleep(0.5);
        close(fd);
    }
    nodes_wait(r, 1);
    close(lfd);
    ck_assert_msg(fd >= 0 && heard, "node 1 sent no hello (%zu bytes); stderr:\n%s",
                  got, r[0].err);
    ck_assert_msg(!memmem(hello, got, token, strlen(token)), "node 1's hello carries the job token; stderr:\n%s",
                  r[0].err);
    ck_assert_msg(strstr(r[0].err, "does not prove the job token") && r[0].code != 0 &&
                      !strstr(r[0].err, "joined node 0"),
                  "node 1 (exit %d) believed the impostor's welcome; stderr:\n%s", r[0].code, r[0].err);
    gwrun_nodes_free(r, 1);
}
END_TEST

/* A node whose rank fails before node 0's challenge came (node 0 slow to
 * answer) sends the hello first, then the failure: the failure went out at
 * once, ahead of the hello, and node 0 dropped the connection ("expected a
 * hello"), the news late by a reconnect. */
START_TEST(test_multinode_fail_waits_for_hello)
{
    int port = gwrun_free_port_pair();
    const char *env[] = {"GW_JOB_TOKEN=mn-early-fail", "GW_RUN_JOIN_TIMEOUT=4", "GW_DEBUG=INFO", NULL};
    int lfd = launcher_listen(port);
    struct run r[1];
    node_start(&r[0], env, port, 2, 1, "1", "exit 3");
    int fd = accept(lfd, NULL, NULL);
    unsigned char first[4 + 4096];
    size_t got = 0;
    bool heard = false;
    if (fd >= 0) {
        gwrun_stderr_has(&r[0], "exited with code 3", 2.5); /* the failure, before the challenge (its hello is due 5 s after connecting) */
        heard = challenge_for_hello(fd, first, sizeof first, &got);
        close(fd);
    }
    nodes_wait(r, 1);
    close(lfd);
    ck_assert_msg(fd >= 0 && heard,
                  "node 1's first frame (%zu bytes) is of type %d, not its hello; stderr:\n%s", got,
                  got > 4 ? first[4] : -1, r[0].err);
    gwrun_nodes_free(r, 1);
}
END_TEST

/* A node refused for options that differ from node 0's, started again with
 * the right ones while node 0 still waits to tell a late node how the job
 * ended: refused, saying so (it was told "node 1 already joined (host
 * (null))": a NULL string to printf, and the wrong advice). */
START_TEST(test_multinode_refused_node_again)
{
    const char *env[] = {"GW_JOB_TOKEN=mn-again", "GW_RUN_JOIN_TIMEOUT=6", "GW_DEBUG=INFO", NULL};
    int port = gwrun_free_port_pair();
    struct run r[3];
    node_start(&r[0], env, port, 3, 0, "1", "exec sleep 30");
    node_start(&r[1], env, port, 3, 1, "2", "exec sleep 30");
    gwrun_nodes_wait(&r[1], 1, NODE_TIMEOUT_S);
    node_start(&r[2], env, port, 3, 1, "1", "exec sleep 30");
    gwrun_nodes_wait(&r[2], 1, NODE_TIMEOUT_S);
    gwrun_nodes_wait(&r[0], 1, NODE_TIMEOUT_S);
    ck_assert_msg(r[1].code != 0 && strstr(r[1].err, "was started with -n 2 but node 0"),
                  "the first node 1 (exit %d):\n%s", r[1].code, r[1].err);
    ck_assert_msg(r[2].code != 0 && strstr(r[2].err, "node 1 was refused before") && !strstr(r[2].err, "(null)") &&
                      !strstr(r[0].err, "(null)"),
                  "node 1 again (exit %d):\n%s\nnode 0:\n%s", r[2].code, r[2].err, r[0].err);
    gwrun_nodes_free(r, 3);
}
END_TEST

/* More silent strangers on the launcher port than node 0's 64 places for
 * connections that have not said hello: the oldest is closed for each new
 * one, and node 1 joins at once (node 0 stopped accepting while the places
 * were full, and node 1 waited out the strangers' 5 s, or for ever while
 * new ones kept coming). */
START_TEST(test_multinode_silent_strangers_make_room)
{
    int port = gwrun_free_port_pair();
    const char *env[] = {"GW_JOB_TOKEN=mn-silent", "GW_RUN_JOIN_TIMEOUT=20", NULL};
    struct run r[2];
    node_start(&r[0], env, port, 2, 0, "1", "true");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(port + 1))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    enum { N = 100 };
    int fds[N], held = 0;
    for (int tries = 0; tries < 500 && held < N; tries++) {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            fds[held++] = fd;
            continue;
        }
        if (fd >= 0)
            close(fd);
        gwrun_sleep(0.02); /* node 0 not listening yet */
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    node_start(&r[1], env, port, 2, 1, "1", "true");
    nodes_wait(&r[1], 1);
    const double took = gwrun_seconds_since(&t0);
    nodes_wait(r, 1);
    for (int i = 0; i < held; i++)
        close(fds[i]);
    ck_assert_int_eq(held, N);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 0, "node %d: exit code %d, stderr:\n%s", i, r[i].code, r[i].err);
    ck_assert_msg(took < 4.0 && strstr(r[0].err, "closing the oldest for each new one"),
                  "node 1 behind %d silent strangers took %.1f s; node 0:\n%s", N, took, r[0].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

/* Node 0's --master names two addresses (10.77.9.1 and fd77::9 on lo, in a
 * network and mount namespace of the test's own, with an /etc/hosts bound
 * over the real one there); node 1 reaches it at each in turn: node 0's
 * gw-run listens on both, as the rendezvous does, and the job ends well.  It
 * listened on the first alone, and a node reaching another was refused until
 * the join deadline (a helper's probe: a running job killed at 120 s).  As
 * root; said as not run where the namespaces cannot be made. */
START_TEST(test_multinode_master_every_address)
{
    if (geteuid() != 0) {
        printf("test_multinode_master_every_address: not run (it needs root for namespaces)\n");
        return;
    }
    char hosts[] = "/tmp/test_gwrun_hosts_XXXXXX";
    const int fd = mkstemp(hosts);
    ck_assert_int_ge(fd, 0);
    static const char text[] = "127.0.0.1 localhost\n10.77.9.1 gw-dual-master\nfd77::9 gw-dual-master\n";
    ck_assert(write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1) && close(fd) == 0);
    char script[2000], hosts_env[128];
    snprintf(hosts_env, sizeof hosts_env, "GWT_HOSTS=%s", hosts);
    /* node 1 at each address in turn; each run's status and output in the
     * script's own (exit 77: no namespace, no mount) */
    snprintf(script, sizeof script,
             "mount --bind \"$GWT_HOSTS\" /etc/hosts && ip link set lo up && ip addr add 10.77.9.1/32 dev lo && "
             "ip -6 addr add fd77::9/128 dev lo nodad || exit 77; rc=0; p=29870; "
             "for a in 10.77.9.1 '[fd77::9]'; do p=$((p + 2)); "
             "\"$GW_RUN_BIN\" -n 1 --nnodes 2 --node-rank 0 --master gw-dual-master:$p sh -c 'exit 0' & z=$!; "
             "\"$GW_RUN_BIN\" -n 1 --nnodes 2 --node-rank 1 --master $a:$p sh -c 'exit 0' || { echo \"node 1 via $a\"; rc=1; }; "
             "wait $z || { echo \"node 0 with node 1 via $a\"; rc=1; }; done; exit $rc");
    const char *env[] = {"GW_JOB_TOKEN=mn-dual", "GW_RUN_JOIN_TIMEOUT=6", "GW_TRANSPORT=tcp", hosts_env, NULL};
    const char *args[] = {"-mn", "sh", "-c", script, NULL};
    struct run r;
    gwrun_start_prog(&r, access("/usr/bin/unshare", X_OK) == 0 ? "/usr/bin/unshare" : "/bin/unshare", env, args);
    gwrun_wait(&r, NODE_TIMEOUT_S);
    unlink(hosts);
    if (r.code == 77) {
        printf("test_multinode_master_every_address: not run (no namespaces: %s)\n", r.err);
        gwrun_free(&r);
        return;
    }
    ck_assert_msg(r.code == 0, "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
}
END_TEST

void add_multinode_handshake_tests(TCase *tc)
{
    tcase_add_test(tc, test_multinode_master_every_address);
    tcase_add_test(tc, test_multinode_garbage_frames);
    tcase_add_test(tc, test_multinode_impostor_master);
    tcase_add_test(tc, test_multinode_fail_waits_for_hello);
    tcase_add_test(tc, test_multinode_refused_node_again);
    tcase_add_test(tc, test_multinode_silent_strangers_make_room);
}
