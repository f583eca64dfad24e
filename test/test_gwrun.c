/*
 * test_gwrun: Check suite for the single-node gw-run launcher (tools/gw-run.c).
 *
 * What it is: black-box tests that run the built gw-run binary (found through
 * the GW_RUN_BIN environment variable, which meson sets) with small sh
 * scripts as ranks, capture its stdout and stderr in temporary files, and
 * check exit codes, the GW_* environment, output routing and teardown, and
 * the command-line checks (multi-node flags included).
 *
 * What it is not: the multi-node control channel (joining, failures, lost
 * nodes, signals across nodes), which test_gwrun_multinode.c covers, nor a
 * test of the library's bootstrap; the ranks here never talk to each other.
 * Running gw-run, with a timeout guard so that a broken gw-run fails a test
 * instead of hanging the suite, is in gwrun_helpers.c; the output routing and
 * line-integrity cases are in test_gwrun_output.c.
 */
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gwrun_helpers.h"

/* ---- 1: all ranks succeed ---- */

START_TEST(test_all_ranks_succeed)
{
    struct run r;
    const char *args[] = {"-n", "3", "sh", "-c", "echo hi $GW_RANK/$GW_WORLD_SIZE $GW_LOCAL_RANK",
                          NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(gwrun_count_lines(r.out) == 3, "expected 3 lines, got:\n%s", r.out);
    ck_assert_msg(gwrun_has_line(r.out, "[0] hi 0/3 0"), "stdout:\n%s", r.out);
    ck_assert_msg(gwrun_has_line(r.out, "[1] hi 1/3 1"), "stdout:\n%s", r.out);
    ck_assert_msg(gwrun_has_line(r.out, "[2] hi 2/3 2"), "stdout:\n%s", r.out);
    gwrun_free(&r);
}
END_TEST

/* ---- 3, 4: failures are propagated and the other ranks stopped ---- */

START_TEST(test_failing_rank_exit_code)
{
    struct run r;
    /* A long grace, so only the SIGTERM of the teardown can end this quickly. */
    const char *env[] = {"GW_RUN_KILL_GRACE=30", NULL};
    const char *args[] = {"-n", "3", "sh", "-c",
                          "if [ \"$GW_RANK\" = 1 ]; then exit 7; fi; sleep 30", NULL};
    gwrun_run(&r, env, args);
    ck_assert_msg(r.code == 7, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(r.elapsed < 20.0, "took %.1f s: the other ranks were not stopped", r.elapsed);
    ck_assert_msg(strstr(r.err, "rank 1 (pid") && strstr(r.err, "exited with code 7"),
                  "stderr does not name rank 1 and code 7:\n%s", r.err);
    /* Ranks that gw-run stopped itself are not reported as failures. */
    ck_assert_msg(!strstr(r.err, "rank 0 (pid") && !strstr(r.err, "rank 2 (pid"),
                  "stderr:\n%s", r.err);
    gwrun_free(&r);
}
END_TEST

/* A rank that cannot be started (its fork refused) fails the job at once:
 * the ranks already started are stopped, and the reason is printed. */
START_TEST(test_fork_failure)
{
    struct run r;
    const char *env[] = {"GW_RUN_KILL_GRACE=30", "GW_RUN_TEST_FORK_FAIL=2", NULL};
    const char *args[] = {"-n", "4", "sh", "-c", "exec sleep 30", NULL};
    gwrun_run(&r, env, args);
    char want[300];
    snprintf(want, sizeof want, "gw-run: cannot start rank 2: fork failed: %s" GWRUN_FORK_LIMIT_HINT, strerror(EAGAIN));
    ck_assert_msg(r.code == 1, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(r.elapsed < 20.0, "took %.1f s: ranks 0 and 1 were not stopped", r.elapsed);
    ck_assert_msg(gwrun_has_line(r.err, want), "stderr lacks '%s':\n%s", want, r.err);
    gwrun_free(&r);
}
END_TEST

/* Nobody reads gw-run's stdout (a paused `| less`, a terminal stopped with
 * ^S): a rank failing meanwhile is still reported on stderr and the others
 * are still stopped, while gw-run waits for its stdout to move. */
START_TEST(test_stuck_stdout)
{
    char dir[] = "/tmp/test_gwrun_XXXXXX", denv[64], pid_path[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(denv, sizeof denv, "D=%s", dir);
    snprintf(pid_path, sizeof pid_path, "%s/pid.0", dir);
    int p[2]; /* close-on-exec: only gw-run's stdout (a dup) may hold the write end */
    ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
    struct run r;
    const char *env[] = {"GW_RUN_KILL_GRACE=30", denv, NULL};
    const char *args[] = {"-n", "2", "sh", "-c",
                          "if [ \"$GW_RANK\" = 1 ]; then sleep 1; exit 3; fi; "
                          "echo $$ > \"$D/pid.0.tmp\"; mv \"$D/pid.0.tmp\" \"$D/pid.0\"; exec yes stuck",
                          NULL};
    gwrun_start_out(&r, p[1], env, args);
    close(p[1]);
    /* While the pipe is not read: the failure reported, rank 0 stopped and reaped. */
    bool reported = false, stopped = false;
    pid_t pid0 = 0;
    for (int i = 0; i < 1000 && !(reported && stopped); i++) {
        gwrun_sleep(0.01);
        FILE *f = fopen(r.err_path, "rb");
        char buf[4096] = "";
        if (f) {
            buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
            fclose(f);
        }
        reported = strstr(buf, "exited with code 3") != NULL;
        if (!pid0)
            pid0 = gwrun_read_pid_file(pid_path);
        stopped = pid0 > 0 && kill(pid0, 0) != 0 && errno == ESRCH;
    }
    siginfo_t si = {0}; /* whether gw-run still runs, leaving it to gwrun_wait to collect */
    bool running = waitid(P_PID, (id_t)r.pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == 0;
    close(p[0]); /* now its writes fail and gw-run can finish */
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    unlink(pid_path);
    rmdir(dir);
    ck_assert_msg(!r.timed_out, "gw-run did not finish after its stdout closed; stderr:\n%s", r.err);
    ck_assert_msg(running, "gw-run exited while its stdout was full (code %d)", r.code);
    ck_assert_msg(reported, "rank 1's failure not reported while stdout was full; stderr:\n%s", r.err);
    ck_assert_msg(stopped, "rank 0 (pid %d) was not stopped while stdout was full", (int)pid0);
    ck_assert_msg(r.code == 3, "exit code %d, stderr:\n%s", r.code, r.err);
    gwrun_free(&r);
}
END_TEST

/* A rank that dies during its setup leaves shared-memory segments in /dev/shm
 * (their names carry the job token's hash and the creating pid): gw-run
 * removes its own ranks' ones at the end, and those of this job whose creator
 * is gone (a rank started through a wrapper script creates them in a
 * grandchild), and nothing else (a live process's, another job's). */
START_TEST(test_leftover_shm_removed)
{
    /* FNV-1a 64 of the token, low 32 bits, as the library names its segments */
    const char *hash = "cf1c0cd6";
    char other_pid[128], other_job[128], dir[] = "/tmp/test_gwrun_XXXXXX", denv[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(denv, sizeof denv, "D=%s", dir);
    snprintf(other_pid, sizeof other_pid, "/dev/shm/gw-%s-1-0-%d-0-00000000", hash, (int)getpid());
    FILE *f = fopen(other_pid, "w");
    ck_assert_msg(f != NULL, "cannot create %s", other_pid);
    fclose(f);
    /* a dead pid, but of another pid namespace (a container sharing /dev/shm): kept */
    char other_ns[128];
    snprintf(other_ns, sizeof other_ns, "/dev/shm/gw-%s-1-0-999999999-0-00000000-12345", hash);
    f = fopen(other_ns, "w");
    ck_assert_msg(f != NULL, "cannot create %s", other_ns);
    fclose(f);
    struct run r;
    const char *env[] = {"GW_JOB_TOKEN=shm-leftover-test", "GW_RUN_KILL_GRACE=30", denv, NULL};
    const char *args[] = {"-n", "2", "sh", "-c",
                          "if [ \"$GW_RANK\" = 1 ]; then touch /dev/shm/gw-cf1c0cd6-0-1-$$-7-deadbeef "
                          "/dev/shm/gw-0badf00d-0-1-$$-7-deadbeef; echo $$ > \"$D/pid\"; "
                          "sh -c 'touch /dev/shm/gw-cf1c0cd6-0-1-$$-8-feedface-$(stat -L -c %i /proc/self/ns/pid); "
                          "echo $$ > \"$D/gpid\"'; "
                          "touch /dev/shm/gw-cf1c0cd6-0-1-$$-9-cafebabe-$(($(stat -L -c %i /proc/self/ns/pid) + 1)); "
                          "exit 3; fi; exec sleep 30",
                          NULL};
    gwrun_run(&r, env, args);
    char pidfile[128];
    snprintf(pidfile, sizeof pidfile, "%s/pid", dir);
    pid_t pid1 = gwrun_read_pid_file(pidfile);
    unlink(pidfile);
    snprintf(pidfile, sizeof pidfile, "%s/gpid", dir);
    pid_t gpid = gwrun_read_pid_file(pidfile);
    unlink(pidfile);
    char grandchild[128];
    struct stat nsst;
    ck_assert_int_eq(stat("/proc/self/ns/pid", &nsst), 0);
    snprintf(grandchild, sizeof grandchild, "/dev/shm/gw-%s-0-1-%d-8-feedface-%llu", hash, (int)gpid,
             (unsigned long long)nsst.st_ino);
    const bool grandchild_gone = access(grandchild, F_OK) != 0;
    unlink(grandchild);
    rmdir(dir);
    char mine[128];
    snprintf(mine, sizeof mine, "/dev/shm/gw-%s-0-1-%d-7-deadbeef", hash, (int)pid1);
    snprintf(other_job, sizeof other_job, "/dev/shm/gw-0badf00d-0-1-%d-7-deadbeef", (int)pid1);
    /* rank 1's pid, but of another pid namespace: another job's there (the same token), kept */
    char ns_of_rank[128];
    snprintf(ns_of_rank, sizeof ns_of_rank, "/dev/shm/gw-%s-0-1-%d-9-cafebabe-%llu", hash, (int)pid1,
             (unsigned long long)nsst.st_ino + 1);
    bool mine_gone = access(mine, F_OK) != 0, pid_kept = access(other_pid, F_OK) == 0,
         job_kept = access(other_job, F_OK) == 0, ns_of_rank_kept = access(ns_of_rank, F_OK) == 0;
    unlink(mine), unlink(other_pid), unlink(other_job), unlink(ns_of_rank);
    ck_assert_msg(ns_of_rank_kept, "%s (a rank's pid in another pid namespace) was removed", ns_of_rank);
    ck_assert_msg(r.code == 3 && pid1 > 0, "exit code %d, rank 1 pid %d, stderr:\n%s", r.code, (int)pid1, r.err);
    ck_assert_msg(mine_gone, "%s was left", mine);
    ck_assert_msg(gpid > 0 && grandchild_gone, "%s (a dead grandchild's) was left", grandchild);
    const bool ns_kept = access(other_ns, F_OK) == 0;
    unlink(other_ns);
    ck_assert_msg(ns_kept, "%s (another pid namespace's) was removed", other_ns);
    ck_assert_msg(pid_kept, "%s (not a rank's) was removed", other_pid);
    ck_assert_msg(job_kept, "%s (another job's) was removed", other_job);
    /* 2, or 1 when a library's own sweep at another test's init (dead pids'
     * segments in its namespace) took one first: the tests run side by side */
    ck_assert_msg(strstr(r.err, "removed 2 shared-memory segments that") ||
                      strstr(r.err, "removed 1 shared-memory segment that"), "stderr:\n%s", r.err);
    gwrun_free(&r);
}
END_TEST

START_TEST(test_sigkill_after_grace)
{
    /* Ranks that ignore SIGTERM are killed once GW_RUN_KILL_GRACE has passed. */
    /* Rank 2 fails once the others ignore SIGTERM (ready files: a sleep
     * before its exit raced with their shells' start on a loaded machine). */
    char dir[] = "/tmp/gwrun-grace-XXXXXX", script[512];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(script, sizeof script,
             "if [ \"$GW_RANK\" = 2 ]; then i=0; while [ ! -e %s/ready.0 -o ! -e %s/ready.1 ] && [ $i -lt 400 ]; "
             "do sleep 0.05; i=$((i+1)); done; exit 5; fi; trap '' TERM; : > %s/ready.$GW_RANK; exec sleep 30",
             dir, dir, dir);
    struct run r;
    const char *env[] = {"GW_RUN_KILL_GRACE=1", NULL};
    const char *args[] = {"-n", "3", "sh", "-c", script, NULL};
    gwrun_run(&r, env, args);
    for (int i = 0; i < 2; i++) {
        char f[64];
        snprintf(f, sizeof f, "%s/ready.%d", dir, i);
        unlink(f);
    }
    rmdir(dir);
    ck_assert_msg(r.code == 5, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(r.elapsed < 15.0, "took %.1f s", r.elapsed);
    ck_assert_msg(strstr(r.err, "SIGKILL"), "stderr does not mention SIGKILL:\n%s", r.err);
    gwrun_free(&r);
}
END_TEST

/* A rank stopped by job control (SIGSTOP here; Ctrl-Z at its own terminal)
 * when the job fails holds the teardown's SIGTERM pending: gw-run continues
 * it (SIGCONT) and says so, so that it ends at once instead of being killed
 * after the whole kill grace (30 s here). */
START_TEST(test_stopped_rank_continued)
{
    char dir[] = "/tmp/gwrun-stopped-XXXXXX", script[640];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(script, sizeof script,
             "if [ \"$GW_RANK\" = 1 ]; then echo $$ > %s/pid.tmp; mv %s/pid.tmp %s/pid; kill -STOP $$; exec sleep 30; "
             "fi; i=0; while [ $i -lt 400 ]; do p=$(cat %s/pid 2>/dev/null) && "
             "grep -q '^[0-9]* (.*) T' /proc/$p/stat 2>/dev/null && exit 4; sleep 0.05; i=$((i+1)); done; exit 9",
             dir, dir, dir, dir);
    struct run r;
    const char *env[] = {"GW_RUN_KILL_GRACE=30", NULL};
    const char *args[] = {"-n", "2", "sh", "-c", script, NULL};
    gwrun_run(&r, env, args);
    char f[64];
    snprintf(f, sizeof f, "%s/pid", dir);
    const pid_t stopped = gwrun_read_pid_file(f);
    unlink(f);
    rmdir(dir);
    ck_assert_msg(r.code == 4, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(r.elapsed < 15.0, "took %.1f s (kill grace 30 s); stderr:\n%s", r.elapsed, r.err);
    char want[128];
    snprintf(want, sizeof want, "gw-run: rank 1 (pid %ld) is stopped (SIGSTOP, or Ctrl-Z); continuing it (SIGCONT)",
             (long)stopped);
    ck_assert_msg(stopped > 0 && strstr(r.err, want), "no \"%s\" in stderr:\n%s", want, r.err);
    ck_assert_msg(!strstr(r.err, "sending SIGKILL"), "stderr:\n%s", r.err);
    gwrun_free(&r);
}
END_TEST

START_TEST(test_rank_killed_by_signal)
{
    struct run r;
    const char *args[] = {"-n", "2", "sh", "-c",
                          "if [ \"$GW_RANK\" = 0 ]; then kill -9 $$; fi; sleep 30", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(WIFEXITED(r.status) && r.code == 137, "exit code %d, stderr:\n%s", r.code,
                  r.err);
    ck_assert_msg(r.elapsed < 20.0, "took %.1f s", r.elapsed);
    ck_assert_msg(strstr(r.err, "rank 0 (pid") && strstr(r.err, "signal 9"),
                  "stderr does not name rank 0 and signal 9:\n%s", r.err);
    gwrun_free(&r);
}
END_TEST

/* ---- 5: SIGTERM is forwarded and nothing is left behind ---- */

/* sig (SIGTERM, or SIGHUP: a closed terminal or ssh session) to gw-run reaches
 * every rank, which exit with `code` from their trap for it (named), and
 * nothing is left; gw-run exits with the ranks' code, or 128 + sig when that is
 * 0.  (A rank's nonzero exit stops the others with SIGTERM, which the TERM
 * case's trap takes too.)  code -1: a signal passed on with the job going on
 * (SIGUSR1/SIGUSR2): the ranks note it and end well after, gw-run exits 0. */
static void signal_forwarded(int sig, const char *name, int code)
{
    const bool passed = code < 0;
    char dir[] = "/tmp/test_gwrun_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char dir_env[128], script[400];
    snprintf(dir_env, sizeof dir_env, "GWT_DIR=%s", dir);
    if (passed)
        snprintf(script, sizeof script,
                 "trap ': > \"$GWT_DIR/got.$GW_RANK\"' %s; echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; "
                 "while [ ! -e \"$GWT_DIR/got.$GW_RANK\" ]; do sleep 0.1; done; echo went on",
                 name);
    else
        snprintf(script, sizeof script,
                 "trap ': > \"$GWT_DIR/got.$GW_RANK\"; exit %d' %s; echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; "
                 "while :; do sleep 0.1; done",
                 code, name);
    /* A long grace, so the ranks can only stop through the forwarded signal. */
    const char *env[] = {dir_env, "GW_RUN_KILL_GRACE=30", NULL};
    const char *args[] = {"-n", "2", "sh", "-c", script, NULL};
    struct run r;
    gwrun_start(&r, env, args);

    pid_t pids[2] = {0, 0};
    for (int tries = 0; tries < 1500 && (!pids[0] || !pids[1]); tries++) {
        for (int i = 0; i < 2; i++) {
            char path[200];
            snprintf(path, sizeof path, "%s/pid.%d", dir, i);
            if (!pids[i])
                pids[i] = gwrun_read_pid_file(path);
        }
        gwrun_sleep(0.01);
    }
    double since_start = gwrun_seconds_since(&r.t0);
    if (since_start < 1.0)
        gwrun_sleep(1.0 - since_start);
    ck_assert_int_eq(kill(r.pid, sig), 0);
    struct timespec t_kill;
    clock_gettime(CLOCK_MONOTONIC, &t_kill);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    double after_kill = gwrun_seconds_since(&t_kill);

    ck_assert_msg(pids[0] > 0 && pids[1] > 0, "the ranks did not start; stderr:\n%s", r.err);
    ck_assert_msg(!r.timed_out, "gw-run ignored SIG%s; stderr:\n%s", name, r.err);
    ck_assert_msg(WIFEXITED(r.status), "gw-run died of signal %d instead of handling it",
                  WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0);
    ck_assert_msg(r.code != 0 || passed, "gw-run exited 0 after SIG%s", name);
    ck_assert_msg(!passed || (gwrun_count_lines(r.out) == 2 && strstr(r.err, "passing it on to 2 ranks")),
                  "SIG%s was not passed on with the job going on; stdout:\n%s\nstderr:\n%s", name, r.out, r.err);
    const int want = passed ? 0 : code ? code : 128 + sig;
    ck_assert_msg(r.code == want, "exit code %d, not %d; stderr:\n%s", r.code, want, r.err);
    ck_assert_msg(after_kill < 10.0, "gw-run took %.1f s to stop after SIG%s", after_kill, name);
    for (int i = 0; i < 2; i++) {
        errno = 0;
        int rc = kill(pids[i], 0);
        ck_assert_msg(rc == -1 && errno == ESRCH, "rank %d (pid %ld) is still there", i,
                      (long)pids[i]);
    }
    for (int i = 0; i < 2; i++) {
        char path[200];
        snprintf(path, sizeof path, "%s/got.%d", dir, i);
        ck_assert_msg(access(path, F_OK) == 0, "rank %d never saw SIG%s", i, name);
        unlink(path);
        snprintf(path, sizeof path, "%s/pid.%d", dir, i);
        unlink(path);
    }
    rmdir(dir);
    gwrun_free(&r);
}

START_TEST(test_sigterm_forwarded)
{
    signal_forwarded(SIGTERM, "TERM", 3);
    signal_forwarded(SIGHUP, "HUP", 0);
    signal_forwarded(SIGQUIT, "QUIT", 0); /* ^\ not from a terminal: stops the job as SIGTERM does */
    signal_forwarded(SIGUSR1, "USR1", -1); /* a scheduler's "checkpoint now": passed on, gw-run lives */
    signal_forwarded(SIGUSR2, "USR2", -1);
}
END_TEST

/* A 2-rank job of `script` (sh) under gw-run in a session of its own whose
 * controlling terminal is a fresh pty (master m, held here only), started
 * once both ranks wrote $GWT_DIR/pid.RANK and set their traps. */
struct pty_job {
    int m, started;
    char dir[32];
    struct run r;
};

static void pty_job_start(struct pty_job *j, const char *script, const char *grace_env)
{
    j->m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC); /* gw-run must not hold the master too */
    ck_assert_msg(j->m >= 0 && grantpt(j->m) == 0 && unlockpt(j->m) == 0, "no pty: %s", strerror(errno));
    char slave[128];
    ck_assert_int_eq(ptsname_r(j->m, slave, sizeof slave), 0);
    snprintf(j->dir, sizeof j->dir, "/tmp/test_gwrun_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(j->dir));
    char dir_env[128];
    snprintf(dir_env, sizeof dir_env, "GWT_DIR=%s", j->dir);
    const char *env[] = {dir_env, grace_env, NULL};
    const char *args[] = {"-n", "2", "sh", "-c", script, NULL};
    gwrun_start_ctty(&j->r, slave, env, args);
    j->started = 0;
    for (int tries = 0; tries < 1500 && j->started < 2; tries++) {
        j->started = 0;
        for (int i = 0; i < 2; i++) {
            char path[200];
            snprintf(path, sizeof path, "%s/pid.%d", j->dir, i);
            j->started += gwrun_read_pid_file(path) > 0;
        }
        gwrun_sleep(0.01);
    }
    /* (the scripts set their traps before they write their pid files) */
}

/* After gwrun_wait: what rank i wrote to $GWT_DIR/sig.i ("" if nothing); the
 * files and the directory removed. */
static void pty_job_end(struct pty_job *j, char got[2][64])
{
    for (int i = 0; i < 2; i++) {
        char path[200];
        got[i][0] = 0;
        snprintf(path, sizeof path, "%s/sig.%d", j->dir, i);
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(got[i], 1, 63, f);
            got[i][n] = 0;
            fclose(f);
            unlink(path);
        }
        snprintf(path, sizeof path, "%s/pid.%d", j->dir, i);
        unlink(path);
    }
    rmdir(j->dir);
    if (j->m >= 0)
        close(j->m);
}

/* ^C at a terminal: the kernel sends SIGINT to the whole foreground process
 * group, gw-run and its ranks alike.  gw-run must not send a second one, and
 * a rank that the signal ends is no failure to answer with SIGTERM: here rank
 * 0 exits at once (code 130), rank 1 takes 1.5 s in its handler (a checkpoint
 * saved on KeyboardInterrupt) and must see no SIGTERM; gw-run then dies of
 * SIGINT itself (it exited 130, and `for f in a b; do gw-run ...; done` went
 * on to the next one after the ^C). */
START_TEST(test_terminal_interrupt)
{
    struct pty_job j;
    pty_job_start(&j,
                  "trap 'echo INT >> \"$GWT_DIR/sig.$GW_RANK\"; [ $GW_RANK = 0 ] && exit 130; sleep 1.5; exit 0' INT; "
                  "trap 'echo TERM >> \"$GWT_DIR/sig.$GW_RANK\"; exit 143' TERM; "
                  "echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; "
                  "while :; do sleep 0.1; done",
                  "GW_RUN_KILL_GRACE=30");
    ck_assert_int_eq(write(j.m, "\x03", 1), 1);
    gwrun_wait(&j.r, GWRUN_TIMEOUT_S);
    char got[2][64];
    pty_job_end(&j, got);
    ck_assert_msg(j.started == 2 && !j.r.timed_out, "ranks started: %d; stderr:\n%s", j.started, j.r.err);
    ck_assert_msg(!strcmp(got[0], "INT\n") && !strcmp(got[1], "INT\n"),
                  "the ranks saw rank 0 [%s] rank 1 [%s] (one SIGINT each expected, no SIGTERM); stderr:\n%s",
                  got[0], got[1], j.r.err);
    /* gw-run dies of SIGINT itself (not exit 130), so a shell loop around it
     * stops too; rank 0's exit 130 is the signal's effect, no failure. */
    ck_assert_msg(WIFSIGNALED(j.r.status) && WTERMSIG(j.r.status) == SIGINT &&
                      strstr(j.r.err, "from the terminal reached") && !strstr(j.r.err, "stopping the") &&
                      !strstr(j.r.err, "exited with code 130"),
                  "exit code %d (died of a signal: %d); stderr:\n%s", j.r.code, WIFSIGNALED(j.r.status), j.r.err);
    gwrun_free(&j.r);
}
END_TEST

/* The terminal hangs up (an ssh connection lost) while gw-run leads the
 * session (ssh -t host gw-run ..., kubectl exec -it): the kernel sends SIGHUP
 * to the session leader alone, so gw-run must pass it on (it took a kernel
 * signal for one the ranks got too, and they were SIGKILLed after the grace
 * without their handlers running). */
START_TEST(test_terminal_hangup)
{
    struct pty_job j;
    pty_job_start(&j,
                  "trap 'echo HUP >> \"$GWT_DIR/sig.$GW_RANK\"; exit 0' HUP; "
                  "echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; "
                  "while :; do sleep 0.1; done",
                  "GW_RUN_KILL_GRACE=20");
    close(j.m); /* the hangup */
    j.m = -1;
    gwrun_wait(&j.r, GWRUN_TIMEOUT_S);
    char got[2][64];
    pty_job_end(&j, got);
    ck_assert_msg(j.started == 2 && !j.r.timed_out && !strcmp(got[0], "HUP\n") && !strcmp(got[1], "HUP\n") &&
                      j.r.elapsed < 15.0,
                  "ranks started %d, saw [%s] [%s] after %.1f s; stderr:\n%s", j.started, got[0], got[1],
                  j.r.elapsed, j.r.err);
    gwrun_free(&j.r);
}
END_TEST

/* A rank SIGKILL does not end (uninterruptible sleep, or not gw-run's to
 * signal; here the hook GW_RUN_TEST_UNKILLABLE spares it): gw-run names it and
 * exits with the job's failure some seconds after the SIGKILL (max(grace,
 * 5 s)), instead of waiting forever and holding the scheduler's job. */
START_TEST(test_unkillable_rank_given_up)
{
    char dir[] = "/tmp/test_gwrun_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char dir_env[128];
    snprintf(dir_env, sizeof dir_env, "GWT_DIR=%s", dir);
    const char *script = "echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; [ $GW_RANK = 0 ] && { sleep 0.5; exit 3; }; "
                         "trap '' TERM; while :; do sleep 0.1; done";
    const char *env[] = {dir_env, "GW_RUN_KILL_GRACE=1", "GW_RUN_TEST_UNKILLABLE=1", NULL};
    const char *args[] = {"-n", "2", "sh", "-c", script, NULL};
    struct run r;
    gwrun_start(&r, env, args);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    char path[200];
    snprintf(path, sizeof path, "%s/pid.1", dir);
    pid_t spared = gwrun_read_pid_file(path);
    if (spared > 0)
        kill(spared, SIGKILL);
    unlink(path);
    snprintf(path, sizeof path, "%s/pid.0", dir);
    unlink(path);
    rmdir(dir);
    ck_assert_msg(!r.timed_out && r.code == 3, "exit code %d (timed out: %d); stderr:\n%s", r.code, r.timed_out,
                  r.err);
    ck_assert_msg(r.elapsed > 5.0 && r.elapsed < 20.0, "took %.1f s", r.elapsed);
    ck_assert_msg(strstr(r.err, "rank 1 (pid") && strstr(r.err, "after SIGKILL") && strstr(r.err, "giving up"),
                  "stderr:\n%s", r.err);
    gwrun_free(&r);
}
END_TEST

/* Ranks that all ended before gw-run looked (it is stopped meanwhile): the
 * crash (rank 2, SIGSEGV) is the job's failure, not the exits 1 that follow
 * it (ranks 0 and 1, collected first in fork order), and each is reported.
 * Handshakes, not sleeps: gw-run is stopped once every rank wrote its pid
 * file, the ranks go on at a file made then, and gw-run goes on once all
 * three are zombies (at most 20 s each: the case has 60). */
START_TEST(test_crash_reported_over_consequences)
{
    char dir[] = "/tmp/gwrun-crash-XXXXXX", script[512], path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(script, sizeof script,
             "echo $$ > %s/pid.$GW_RANK; i=0; while [ ! -e %s/go ] && [ $i -lt 600 ]; do sleep 0.05; "
             "i=$((i+1)); done; if [ \"$GW_RANK\" = 2 ]; then kill -SEGV $$; fi; sleep 0.3; exit 1",
             dir, dir);
    const char *env[] = {"GW_RUN_KILL_GRACE=30", NULL};
    const char *args[] = {"-n", "3", "sh", "-c", script, NULL};
    struct run r;
    gwrun_start(&r, env, args);
    pid_t pids[3] = {0, 0, 0};
    for (double t0 = gwrun_seconds_since(&r.t0); gwrun_seconds_since(&r.t0) - t0 < 20;) {
        int have = 0;
        for (int i = 0; i < 3; i++) {
            snprintf(path, sizeof path, "%s/pid.%d", dir, i);
            if (!pids[i])
                pids[i] = gwrun_read_pid_file(path);
            have += pids[i] > 0;
        }
        if (have == 3)
            break;
        gwrun_sleep(0.02);
    }
    const bool started = pids[0] > 0 && pids[1] > 0 && pids[2] > 0;
    bool ended = false;
    if (started && kill(r.pid, SIGSTOP) == 0) {
        snprintf(path, sizeof path, "%s/go", dir);
        close(open(path, O_CREAT | O_WRONLY, 0644));
        for (double t0 = gwrun_seconds_since(&r.t0); !ended && gwrun_seconds_since(&r.t0) - t0 < 20;) {
            ended = gwrun_is_zombie(pids[0]) && gwrun_is_zombie(pids[1]) && gwrun_is_zombie(pids[2]);
            gwrun_sleep(0.02);
        }
    }
    kill(r.pid, SIGCONT);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/pid.%d", dir, i);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/go", dir);
    unlink(path);
    rmdir(dir);
    ck_assert_msg(started && ended, "set-up failed (ranks started %d, ended while gw-run was stopped %d)", started,
                  ended);
    ck_assert_msg(!r.timed_out, "gw-run did not finish; stderr:\n%s", r.err);
    ck_assert_msg(r.code == 128 + SIGSEGV, "exit code %d, not SIGSEGV's; stderr:\n%s", r.code, r.err);
    ck_assert_msg(strstr(r.err, "rank 2 (pid") && strstr(r.err, "SIGSEGV") && strstr(r.err, "rank 0 (pid") &&
                      strstr(r.err, "rank 1 (pid"),
                  "stderr does not report all three:\n%s", r.err);
    gwrun_free(&r);
}
END_TEST

/* A failed rank whose background child keeps writing to the inherited pipe:
 * its last words are read, not forever, and the job stops. */
START_TEST(test_failure_with_writing_grandchild)
{
    const char *args[] = {"-n", "2", "sh", "-c",
                          "if [ \"$GW_RANK\" = 1 ]; then (while :; do echo chatter; done) & sleep 0.5; exit 3; fi; "
                          "sleep 100",
                          NULL};
    struct run r;
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 3 && r.elapsed < 30, "exit code %d after %.1f s; stderr:\n%.2000s", r.code, r.elapsed,
                  r.err);
    ck_assert_msg(strstr(r.err, "rank 1 (pid") && strstr(r.err, "exited with code 3"), "stderr:\n%.2000s", r.err);
    gwrun_free(&r);
}
END_TEST

START_TEST(test_teardown_stops_leftovers)
{
    /* Rank 0 is a wrapper script whose real program (a grandchild of gw-run)
     * would survive the wrapper's death; the teardown must stop it too. */
    char dir_env[128];
    gwt_dir(dir_env, sizeof dir_env);
    const char *env[] = {dir_env, "GW_RUN_KILL_GRACE=2", NULL};
    const char *args[] = {"-n", "2", "sh", "-c",
                          "if [ \"$GW_RANK\" = 1 ]; then "
                          "  while [ ! -s \"$GWT_DIR/gc\" ]; do sleep 0.05; done; exit 7; "
                          "fi; "
                          "sh -c 'echo $$ > \"$GWT_DIR/gc.tmp\"; mv \"$GWT_DIR/gc.tmp\" "
                          "\"$GWT_DIR/gc\"; exec sleep 30'; true",
                          NULL};
    struct run r;
    gwrun_run(&r, env, args);
    ck_assert_msg(r.code == 7, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(r.elapsed < 15.0, "took %.1f s", r.elapsed);
    gwt_assert_gone(dir_env, "gc", "the wrapper's program");
    gwt_dir_remove(dir_env);
    gwrun_free(&r);
}
END_TEST

/* Rank 0 is a wrapper shell whose program (a stray once the wrapper dies of
 * the teardown's SIGTERM) takes 3 s over its own SIGTERM and then prints its
 * last line: gw-run waits for it (the kill grace bounds that) and forwards
 * the line.  It closed the pipes 2 s after the last rank ended instead, the
 * line lost and the stray killed by SIGPIPE. */
START_TEST(test_stray_last_words_kept)
{
    char dir_env[128];
    gwt_dir(dir_env, sizeof dir_env);
    const char *env[] = {dir_env, "GW_RUN_KILL_GRACE=20", NULL};
    const char *args[] = {"-n", "2", "sh", "-c",
                          "if [ \"$GW_RANK\" = 1 ]; then "
                          "  while [ ! -e \"$GWT_DIR/ready\" ]; do sleep 0.05; done; exit 3; "
                          "fi; "
                          "sh -c 'trap \"sleep 3; echo last words; exit 0\" TERM; : > \"$GWT_DIR/ready\"; "
                          "while :; do sleep 0.1; done' & wait",
                          NULL};
    struct run r;
    gwrun_run(&r, env, args);
    gwt_dir_remove(dir_env);
    ck_assert_msg(r.code == 3 && r.elapsed < 15.0, "exit code %d after %.1f s, stderr:\n%s", r.code, r.elapsed,
                  r.err);
    ck_assert_msg(gwrun_has_line(r.out, "[0] last words") && !strstr(r.err, "not waiting for it"),
                  "the stray's last line was lost; stdout:\n%s\nstderr:\n%s", r.out, r.err);
    gwrun_free(&r);
}
END_TEST

/* GW_JOB_TOKEN longer than the library's 128 characters: every rank would
 * fail at init (and with --max-restarts every attempt), so gw-run refuses it
 * at once, on one node as on several; 128 characters are fine. */
START_TEST(test_token_too_long)
{
    char tok[300] = "GW_JOB_TOKEN=";
    size_t pre = strlen(tok);
    memset(tok + pre, 'k', 129);
    const char *env[] = {tok, NULL};
    struct run r;
    const char *a1[] = {"-n", "1", "--max-restarts", "2", "sh", "-c", "echo started", NULL};
    gwrun_run(&r, env, a1);
    ck_assert_msg(r.code == 2 && r.out[0] == '\0' && strstr(r.err, "GW_JOB_TOKEN is 129 characters") &&
                      strstr(r.err, "at most 128"),
                  "exit code %d, stdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);

    memset(tok + pre, 'k', 200); /* multi-node: refused before it waits for any node */
    char master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", gwrun_free_port_pair());
    const char *a2[] = {"-n", "1", "--nnodes", "2", "--master", master, "sh", "-c", "echo started", NULL};
    gwrun_run(&r, env, a2);
    ck_assert_msg(r.code == 2 && r.elapsed < 5.0 && r.out[0] == '\0' && strstr(r.err, "at most 128"),
                  "exit code %d after %.1f s, stdout:\n%s\nstderr:\n%s", r.code, r.elapsed, r.out, r.err);
    gwrun_free(&r);

    tok[pre + 128] = '\0';
    const char *a3[] = {"-n", "1", "sh", "-c", "echo ${#GW_JOB_TOKEN}", NULL};
    gwrun_run(&r, env, a3);
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] 128"), "exit code %d, stdout:\n%s\nstderr:\n%s",
                  r.code, r.out, r.err);
    gwrun_free(&r);
}
END_TEST

/* ---- 6, 7: bad command lines and missing programs ---- */

START_TEST(test_bad_flags)
{
    static const char *const cases[][8] = {
        {"true", NULL},                          /* missing -n */
        {"-n", "0", "true", NULL},
        {"-n", "abc", "true", NULL},
        {"-n", "5000", "true", NULL},
        {"-n", "2", "--bogus", "true", NULL},    /* unknown option */
        {"-n", "2", NULL},                       /* no program */
        {"-n", NULL},                            /* -n without a value */
        {"-n", "2", "--nnodes", "2", "true", NULL}, /* multi-node without --master */
        {"-n", "2", "--master", "no-port", "true", NULL},
        {"-n", "2", "--master", "host:0", "true", NULL},
        {"-n", "2", "--master", "host:99999", "true", NULL},
        {"-n", "2", "--master", "::1:80", "true", NULL}, /* bare IPv6 */
        {"-n", "1", "--nnodes", "1:4", "true", NULL},   /* torchrun's elastic range */
        {"-n", "1", "--nnodes", "2:x", "true", NULL},
        {"-n", "1", "--rdzv-backend", "etcd-v2", "true", NULL},
        {"-n", "1", "--rdzv-conf", "is_host=maybe", "true", NULL},
        {"-n", "1", "--rdzv-conf", "join_timeout=0", "true", NULL},
        {"-n", "1", "--rdzv-conf", "is_host", "true", NULL},
        {"-n", "1", "--master", "h:1", "--rdzv-endpoint", "h:2", "true", NULL},
        {"-n", "1", "--rdzv-conf", "is_host=1", "--node-rank", "1", "true", NULL},
        {"-n", "1", "--rdzv-endpoint", "[::1", "true", NULL},
        {"-n", "1", "--rdzv-endpoint", "", "true", NULL},
        {"-n", "1", "--rdzv-endpoint", "a:b:c", "true", NULL},     /* taken for an IPv6 address */
        {"-n", "1", "--master-addr", "host:29500", "true", NULL}, /* taken too; the ranks then failed */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run r;
        gwrun_run(&r, NULL, cases[i]);
        ck_assert_msg(r.code == 2, "case %zu (%s %s): exit code %d, stderr:\n%s", i, cases[i][0],
                      cases[i][1] ? cases[i][1] : "", r.code, r.err);
        ck_assert_msg(strstr(r.err, "gw-run: ") && strstr(r.err, "usage:"),
                      "case %zu: no message and usage on stderr:\n%s", i, r.err);
        ck_assert_msg(r.out[0] == '\0', "case %zu: unexpected stdout:\n%s", i, r.out);
        gwrun_free(&r);
    }
    /* an unbracketed IPv6 endpoint: its port or its address's last part? said (torchrun takes it for the port) */
    struct run r;
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--rdzv-endpoint", "fe80::1:1234", "true", NULL});
    ck_assert_msg(r.code == 2 && strstr(r.err, "--rdzv-endpoint 'fe80::1:1234': an IPv6 address goes in brackets"),
                  "exit %d, stderr:\n%.600s", r.code, r.err);
    gwrun_free(&r);
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--master-addr", "host:1", "true", NULL});
    ck_assert_msg(r.code == 2 && strstr(r.err, "--master-addr 'host:1' is neither a host name nor an IPv6 address "
                                               "(the port goes in --master-port)"),
                  "exit %d, stderr:\n%.600s", r.code, r.err);
    gwrun_free(&r);
    /* a link-local IPv6 master without its interface: no socket can use it
     * (node 0 said "Invalid argument", the others retried to the deadline) */
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--master", "[fe80::1]:2970", "true", NULL});
    ck_assert_msg(r.code == 2 && strstr(r.err, "--master fe80::1 is a link-local IPv6 address without its interface: "
                                               "give it as [fe80::1%IFACE]:PORT"),
                  "exit %d, stderr:\n%.600s", r.code, r.err);
    gwrun_free(&r);
    /* a host name past 255 characters: said so (the port was said to be wrong) */
    char longmaster[320];
    snprintf(longmaster, sizeof longmaster, "%0300d:29500", 0);
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--master", longmaster, "true", NULL});
    ck_assert_msg(r.code == 2 && strstr(r.err, "the host is 300 characters long, at most 255"), "exit %d, stderr:\n%.600s",
                  r.code, r.err);
    gwrun_free(&r);
    /* seconds in hexadecimal (strtod's: 16 s) are no seconds: said and ignored, as other bad values */
    gwrun_run(&r, (const char *[]){"GW_RUN_KILL_GRACE=0x10", NULL}, (const char *[]){"-n", "1", "true", NULL});
    ck_assert_msg(r.code == 0 && strstr(r.err, "gw-run: ignoring GW_RUN_KILL_GRACE='0x10' (want seconds"),
                  "exit %d, stderr:\n%.600s", r.code, r.err);
    gwrun_free(&r);
    /* One node: --launcher-port has nothing to do, and says so (it was ignored silently) */
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--launcher-port", "5000", "true", NULL});
    ck_assert_msg(r.code == 0 && strstr(r.err, "ignoring --launcher-port 5000"), "exit %d, stderr:\n%s", r.code,
                  r.err);
    gwrun_free(&r);
}
END_TEST

START_TEST(test_multinode_checks)
{
    struct run r;
    const char *no_token[] = {"GW_JOB_TOKEN", NULL};
    const char *a1[] = {"-n", "2", "--nnodes", "2", "--master", "127.0.0.1:1234", "true", NULL};
    gwrun_run(&r, no_token, a1);
    ck_assert_msg(r.code == 2, "exit code %d", r.code);
    ck_assert_msg(strstr(r.err, "GW_JOB_TOKEN"), "stderr does not mention GW_JOB_TOKEN:\n%s",
                  r.err);
    gwrun_free(&r);

    const char *token[] = {"GW_JOB_TOKEN=t", NULL};
    const char *a2[] = {"-n", "2", "--nnodes", "2", "--node-rank", "2",
                        "--master", "127.0.0.1:1234", "true", NULL};
    gwrun_run(&r, token, a2);
    ck_assert_msg(r.code == 2, "exit code %d", r.code);
    ck_assert_msg(strstr(r.err, "node-rank"), "stderr:\n%s", r.err);
    gwrun_free(&r);

    const char *a3[] = {"--help", NULL};
    gwrun_run(&r, NULL, a3);
    ck_assert_int_eq(r.code, 0);
    ck_assert_msg(strstr(r.out, "usage:"), "--help printed:\n%s", r.out);
    gwrun_free(&r);
}
END_TEST

START_TEST(test_program_not_found)
{
    struct run r;
    const char *args[] = {"-n", "2", "gw-no-such-program-xyz", "--flag", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code != 0, "gw-run exited 0 for a missing program");
    ck_assert_int_eq(r.code, 127);
    ck_assert_msg(strstr(r.err, "gw-no-such-program-xyz") && !strstr(r.err, "searched in PATH"),
                  "stderr does not name the program:\n%s", r.err);
    gwrun_free(&r);
    /* a file of that name in this directory, not in PATH (torchrun would run
     * it with python): said where it is and how to run it */
    char here[64];
    snprintf(here, sizeof here, "gw-script-here-%d", (int)getpid());
    FILE *f = fopen(here, "w");
    ck_assert_ptr_nonnull(f);
    fputs("print('hi')\n", f);
    fclose(f);
    const char *local[] = {"-n", "1", here, NULL};
    gwrun_run(&r, NULL, local);
    ck_assert_msg(r.code == 127 && strstr(r.err, "searched in PATH; the file in this directory is ./gw-script-here-") &&
                      strstr(r.err, "runs as 'python3 SCRIPT'"),
                  "a script here: exit %d\n%s", r.code, r.err);
    gwrun_free(&r);
    /* named by its path, found but not executable: the shell's 126, not 127 */
    char path[80];
    snprintf(path, sizeof path, "./%s", here);
    const char *by_path[] = {"-n", "1", path, NULL};
    gwrun_run(&r, NULL, by_path);
    unlink(here);
    ck_assert_msg(r.code == 126 && strstr(r.err, "Permission denied"), "not executable: exit %d\n%s", r.code, r.err);
    gwrun_free(&r);
}
END_TEST

static Suite *gwrun_suite(void)
{
    Suite *s = suite_create("gw-run");
    TCase *tc = tcase_create("launcher");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_all_ranks_succeed);
    tcase_add_test(tc, test_failing_rank_exit_code);
    tcase_add_test(tc, test_fork_failure);
    tcase_add_test(tc, test_stuck_stdout);
    tcase_add_test(tc, test_leftover_shm_removed);
    tcase_add_test(tc, test_sigkill_after_grace);
    tcase_add_test(tc, test_rank_killed_by_signal);
    tcase_add_test(tc, test_stopped_rank_continued);
    tcase_add_test(tc, test_sigterm_forwarded);
    tcase_add_test(tc, test_terminal_interrupt);
    tcase_add_test(tc, test_terminal_hangup);
    tcase_add_test(tc, test_unkillable_rank_given_up);
    tcase_add_test(tc, test_crash_reported_over_consequences);
    tcase_add_test(tc, test_failure_with_writing_grandchild);
    tcase_add_test(tc, test_teardown_stops_leftovers);
    tcase_add_test(tc, test_stray_last_words_kept);
    tcase_add_test(tc, test_token_too_long);
    tcase_add_test(tc, test_bad_flags);
    tcase_add_test(tc, test_multinode_checks);
    tcase_add_test(tc, test_program_not_found);
    gwrun_add_output_tests(tc); /* test_gwrun_output.c */
    gwrun_add_env_tests(tc);    /* test_gwrun_env.c */
    gwrun_add_log_tests(tc);    /* test_gwrun_logs.c */
    gwrun_add_cause_tests(tc);  /* test_gwrun_cause.c */
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return gwrun_main("test_gwrun", gwrun_suite);
}
