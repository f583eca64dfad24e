/*
 * test_gwrun_multinode_signals: the multi-node suite's signal cases
 * (test_gwrun_multinode.c has the rest and the helpers): a stop signal from
 * either end of the control channel, SIGUSR1 passed on to every node, a
 * signal that reaches several nodes' gw-run reaching every rank once, and a
 * stopped launcher given up by its heartbeats' silence.
 */

#include <check.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test_gwrun_multinode.h"

/* A signal stops the whole job from either end of the control channel: node 0
 * got SIGTERM, or node 1 got SIGHUP (which node 0 once took for a malformed
 * frame, losing the node instead of stopping the job). */
static const struct {
    int node, sig;
    const char *name, *token;
} stop_cases[] = {{0, SIGTERM, "SIGTERM", "GW_JOB_TOKEN=mn-term"},
                  {1, SIGHUP, "SIGHUP", "GW_JOB_TOKEN=mn-hup"}};

START_TEST(test_multinode_signal_stops_job)
{
    int from = stop_cases[_i].node, sig = stop_cases[_i].sig, other = 1 - from;
    char dir[] = "/tmp/test_gwrun_XXXXXX", dir_env[128];
    struct run r[2];
    bool joined = start_joined_pair(r, dir, dir_env, sizeof dir_env, stop_cases[_i].token);
    if (joined)
        kill(r[from].pid, sig);
    struct timespec t_kill;
    clock_gettime(CLOCK_MONOTONIC, &t_kill);
    nodes_wait(r, 2);
    double after = gwrun_seconds_since(&t_kill);
    bool gone = ranks_gone(dir, 2);
    remove_pid_files(dir, 2); /* before any assertion can skip it */
    ck_assert_msg(joined, "node 1 never joined; stderr:\n%s\n%s", r[0].err, r[1].err);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 128 + sig, "node %d: exit code %d, stderr:\n%s", i,
                      r[i].code, r[i].err);
    ck_assert_msg(after < 8.0, "the job took %.1f s to stop", after);
    char want[800];
    snprintf(want, sizeof want, "gw-run: node %d (host %s) received %s; stopping %s", from,
             hostname(), stop_cases[_i].name, other == 0 ? "the job" : "this node too");
    ck_assert_msg(gwrun_has_line(r[other].err, want), "node %d stderr lacks '%s':\n%s", other,
                  want, r[other].err);
    ck_assert_msg(gone, "a rank outlived the job");
    gwrun_nodes_free(r, 2);
}
END_TEST

/* A signal reaching both nodes' gw-run 0.2 s apart (scancel -s INT, a time
 * limit, sbatch --signal=USR1): every rank gets it once.  Each rank got it
 * once from its own gw-run and again from the other node's STOP or PASS (a
 * second SIGINT breaks Python's KeyboardInterrupt cleanup).  The ranks note
 * each delivery and go on: SIGINT's end by the kill grace, SIGUSR1's 1.5 s
 * after the first (exit 0). */
static const struct {
    int sig, code;
    const char *script;
} once_cases[] = {
    {SIGINT, 128 + SIGINT,
     "trap 'echo x >> \"$GWT_DIR/n.$GW_RANK\"' INT; echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; "
     "while :; do sleep 0.1; done"},
    {SIGUSR1, 0,
     "trap 'echo x >> \"$GWT_DIR/n.$GW_RANK\"' USR1; echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; "
     "while [ ! -e \"$GWT_DIR/n.$GW_RANK\" ]; do sleep 0.1; done; sleep 1.5"},
};

START_TEST(test_multinode_signal_once_per_rank)
{
    char dir[] = "/tmp/test_gwrun_XXXXXX", dir_env[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(dir_env, sizeof dir_env, "GWT_DIR=%s", dir);
    const char *env[] = {"GW_JOB_TOKEN=mn-once", dir_env, "GW_DEBUG=INFO", "GW_RUN_KILL_GRACE=2", NULL};
    const char *script = once_cases[_i].script;
    const int sig = once_cases[_i].sig;
    int port = gwrun_free_port_pair();
    struct run r[2];
    for (int i = 0; i < 2; i++)
        node_start(&r[i], env, port, 2, i, "1", script);
    bool joined = gwrun_stderr_has(&r[1], "node 1 joined node 0", 10.0);
    const int started = pid_files_written(dir, 2);
    if (joined && started == 2) {
        kill(r[1].pid, sig);
        gwrun_sleep(0.2);
        kill(r[0].pid, sig);
    } else {
        for (int i = 0; i < 2; i++)
            kill(r[i].pid, SIGTERM);
    }
    nodes_wait(r, 2);
    int got[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        char path[200];
        snprintf(path, sizeof path, "%s/n.%d", dir, i);
        FILE *f = fopen(path, "r");
        for (int c; f && (c = fgetc(f)) != EOF;)
            got[i] += c == '\n';
        if (f)
            fclose(f);
        unlink(path);
    }
    bool gone = ranks_gone(dir, 2);
    remove_pid_files(dir, 2);
    ck_assert_msg(joined && started == 2, "the job did not start; stderr:\n%s\n%s", r[0].err, r[1].err);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(got[i] == 1 && r[i].code == once_cases[_i].code, "node %d: its rank got %s %d times, exit %d; "
                      "stderr:\n%s", i, strsignal(sig), got[i], r[i].code, r[i].err);
    ck_assert_msg(gone, "a rank outlived the job");
    gwrun_nodes_free(r, 2);
}
END_TEST

/* SIGUSR1 to node 1's gw-run (a scheduler asking for a checkpoint) reaches
 * every rank of every node (node 0 passes it on to node 2), and the job goes
 * on: the ranks note it and then end well, and every gw-run exits 0. */
START_TEST(test_multinode_usr1_passed_on)
{
    char dir[] = "/tmp/test_gwrun_XXXXXX", dir_env[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(dir_env, sizeof dir_env, "GWT_DIR=%s", dir);
    const char *env[] = {"GW_JOB_TOKEN=mn-usr1", dir_env, "GW_DEBUG=INFO", NULL};
    const char *script = "trap ': > \"$GWT_DIR/got.$GW_RANK\"' USR1; echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; "
                         "while [ ! -e \"$GWT_DIR/got.$GW_RANK\" ]; do sleep 0.1; done";
    int port = gwrun_free_port_pair();
    struct run r[3];
    for (int i = 0; i < 3; i++)
        node_start(&r[i], env, port, 3, i, "1", script);
    bool joined = gwrun_stderr_has(&r[1], "node 1 joined node 0", 10.0) &&
                  gwrun_stderr_has(&r[2], "node 2 joined node 0", 10.0);
    const int started = pid_files_written(dir, 3);
    if (joined && started == 3)
        kill(r[1].pid, SIGUSR1);
    else
        for (int i = 0; i < 3; i++)
            kill(r[i].pid, SIGTERM);
    nodes_wait(r, 3);
    int got = 0;
    for (int i = 0; i < 3; i++) {
        char path[200];
        snprintf(path, sizeof path, "%s/got.%d", dir, i);
        got += unlink(path) == 0;
    }
    remove_pid_files(dir, 3);
    ck_assert_msg(joined && started == 3, "the job did not start; stderr:\n%s\n%s\n%s", r[0].err, r[1].err, r[2].err);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(r[i].code == 0, "node %d: exit code %d, stderr:\n%s", i, r[i].code, r[i].err);
    ck_assert_msg(got == 3, "%d of 3 ranks got SIGUSR1", got);
    char want[800];
    snprintf(want, sizeof want, "gw-run: node 1 received SIGUSR1; passing it on to 1 rank");
    ck_assert_msg(gwrun_has_line(r[2].err, want), "node 2 stderr lacks '%s':\n%s", want, r[2].err);
    gwrun_nodes_free(r, 3);
}
END_TEST

/* A joined launcher stopped (SIGSTOP: its connections stay open and its
 * kernel answers keepalive) is taken as lost once it has been silent for
 * GW_RUN_HEARTBEAT_TIMEOUT (3 s here, on both nodes) while its machine
 * acknowledges the heartbeats sent to it: node 0 waited for a
 * stopped node's end for good, and a node for a stopped node 0.  _i 0: node
 * 1 stopped, node 0 names it; 1: node 0 stopped, node 1 names it.  Once the
 * stopped one goes on, it finds the connection closed and ends too, and no
 * rank outlives the job. */
START_TEST(test_multinode_silent_launcher_lost)
{
    const int stopped = _i == 0 ? 1 : 0, watcher = 1 - stopped;
    char dir[] = "/tmp/test_gwrun_XXXXXX", dir_env[128];
    struct run r[2];
    setenv("GW_RUN_HEARTBEAT_TIMEOUT", "3", 1);
    bool joined = start_joined_pair(r, dir, dir_env, sizeof dir_env, _i ? "GW_JOB_TOKEN=mn-silent0" : "GW_JOB_TOKEN=mn-silent1");
    unsetenv("GW_RUN_HEARTBEAT_TIMEOUT");
    if (joined)
        kill(r[stopped].pid, SIGSTOP);
    struct timespec t_stop;
    clock_gettime(CLOCK_MONOTONIC, &t_stop);
    gwrun_wait(&r[watcher], NODE_TIMEOUT_S);
    double after = gwrun_seconds_since(&t_stop);
    kill(r[stopped].pid, SIGCONT);
    gwrun_wait(&r[stopped], NODE_TIMEOUT_S);
    bool gone = ranks_gone(dir, 2);
    remove_pid_files(dir, 2); /* before any assertion can skip it */
    ck_assert_msg(joined, "node 1 never joined; stderr:\n%s\n%s", r[0].err, r[1].err);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code != 0, "node %d exited 0; stderr:\n%s", i, r[i].err);
    ck_assert_msg(after >= 2.0 && after < 10.0, "node %d took %.1f s to give the stopped one up", watcher, after);
    const char *want = stopped == 1 ? "(a joined node): nothing from it for 3 s (GW_RUN_HEARTBEAT_TIMEOUT) while its "
                                      "machine answers: its gw-run is stopped or hung"
                                    : ": nothing from node 0 for 3 s (GW_RUN_HEARTBEAT_TIMEOUT) while its machine "
                                      "answers: its gw-run is stopped or hung";
    ck_assert_msg(strstr(r[watcher].err, want), "node %d stderr lacks '%s':\n%s", watcher, want, r[watcher].err);
    /* and the stopped one, going on, reads why (not a bare end: "lost node 0") */
    char told[200];
    snprintf(told, sizeof told, "gw-run: node %d gave node %d up: nothing from its gw-run for 3 s", watcher, stopped);
    ck_assert_msg(strstr(r[stopped].err, told), "node %d stderr lacks '%s':\n%s", stopped, told, r[stopped].err);
    char lost[400];
    snprintf(lost, sizeof lost, "gw-run: lost node %d (host %s): its gw-run went silent while its machine answered",
             stopped, hostname());
    ck_assert_msg(strstr(r[watcher].err, lost), "node %d stderr lacks '%s':\n%s", watcher, lost, r[watcher].err);
    /* (it said "its launcher exited or the network failed" after that) */
    ck_assert_msg(!strstr(r[watcher].err, "its launcher exited or the network failed"), "node %d stderr:\n%s", watcher,
                  r[watcher].err);
    ck_assert_msg(gone, "a rank outlived the job");
    gwrun_nodes_free(r, 2);
}
END_TEST

/* The whole job stopped for longer than GW_RUN_HEARTBEAT_TIMEOUT (2 s here)
 * and continued together, as scontrol suspend / resume, a frozen cgroup or
 * docker pause do: the job goes on and ends well.  Each gw-run gave the
 * others up as it woke (their silence was its own stop), and the job
 * failed: a helper's probe. */
START_TEST(test_multinode_suspended_job_goes_on)
{
    char dir[] = "/tmp/test_gwrun_XXXXXX", dir_env[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(dir_env, sizeof dir_env, "GWT_DIR=%s", dir);
    const char *env[] = {"GW_JOB_TOKEN=mn-suspended", dir_env, "GW_DEBUG=INFO", "GW_RUN_HEARTBEAT_TIMEOUT=2", NULL};
    const char *script = "echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; exec sleep 8";
    int port = gwrun_free_port_pair();
    struct run r[2];
    node_start(&r[0], env, port, 2, 0, "1", script);
    node_start(&r[1], env, port, 2, 1, "1", script);
    const bool joined = gwrun_stderr_has(&r[1], "node 1 joined node 0", 10.0) && pid_files_written(dir, 2) == 2;
    pid_t pids[4] = {r[0].pid, r[1].pid, 0, 0};
    for (int i = 0; joined && i < 2; i++) {
        char path[160];
        snprintf(path, sizeof path, "%s/pid.%d", dir, i);
        pids[2 + i] = gwrun_read_pid_file(path);
    }
    for (int i = 0; joined && i < 4; i++)
        if (pids[i] > 0)
            kill(pids[i], SIGSTOP);
    gwrun_sleep(4.5);
    for (int i = 0; i < 4; i++)
        if (pids[i] > 0)
            kill(pids[i], SIGCONT);
    nodes_wait(r, 2);
    remove_pid_files(dir, 2);
    rmdir(dir);
    ck_assert_msg(joined, "node 1 never joined; stderr:\n%s\n%s", r[0].err, r[1].err);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 0 && !strstr(r[i].err, "nothing from") && !strstr(r[i].err, "gave node"),
                      "node %d: exit %d, stderr:\n%s", i, r[i].code, r[i].err);
    gwrun_nodes_free(r, 2);
}
END_TEST

void add_multinode_signal_tests(TCase *tc)
{
    tcase_add_loop_test(tc, test_multinode_silent_launcher_lost, 0, 2);
    tcase_add_test(tc, test_multinode_suspended_job_goes_on);
    tcase_add_loop_test(tc, test_multinode_signal_stops_job, 0, (int)(sizeof stop_cases / sizeof stop_cases[0]));
    tcase_add_test(tc, test_multinode_usr1_passed_on);
    tcase_add_loop_test(tc, test_multinode_signal_once_per_rank, 0, (int)(sizeof once_cases / sizeof once_cases[0]));
}
