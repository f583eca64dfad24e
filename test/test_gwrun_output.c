/*
 * test_gwrun_output: the single-node gw-run launcher's output cases, part of
 * test_gwrun (test_gwrun.c runs them): each rank's stdout and stderr go to
 * gw-run's with a [rank] prefix, whole lines never interleave between ranks,
 * a line longer than the buffer is split (not lost), a grandchild that
 * keeps the output open does not keep gw-run waiting, and neither does a
 * stdout nobody reads once gw-run was told to stop.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gwrun_helpers.h"

START_TEST(test_output_routing)
{
    struct run r;
    const char *args[] = {"-n", "2", "sh", "-c",
                          "echo out$GW_RANK; echo err$GW_RANK >&2; printf partial$GW_RANK", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(gwrun_count_lines(r.out) == 4, "stdout:\n%s", r.out);
    ck_assert_msg(gwrun_has_line(r.out, "[0] out0") && gwrun_has_line(r.out, "[1] out1"),
                  "stdout:\n%s", r.out);
    ck_assert_msg(gwrun_has_line(r.out, "[0] partial0") && gwrun_has_line(r.out, "[1] partial1"),
                  "the partial last line is missing:\n%s", r.out);
    ck_assert_msg(gwrun_has_line(r.err, "[0] err0") && gwrun_has_line(r.err, "[1] err1"),
                  "stderr:\n%s", r.err);
    ck_assert_msg(!strstr(r.out, "err"), "stderr lines reached stdout:\n%s", r.out);
    ck_assert_msg(!strstr(r.err, "out") && !strstr(r.err, "partial"),
                  "stdout lines reached stderr:\n%s", r.err);
    gwrun_free(&r);
}
END_TEST

struct many_seen {
    int count;
    int next[4]; /* next line number expected from each rank */
};

static void check_many_line(const char *line, void *arg)
{
    struct many_seen *s = arg;
    int prefix, rank, i, used = 0;
    int n = sscanf(line, "[%d] line %d %d%n", &prefix, &rank, &i, &used);
    ck_assert_msg(n == 3 && line[used] == '\0' && prefix == rank && rank >= 0 && rank < 4,
                  "mangled line '%s'", line);
    ck_assert_msg(i == s->next[rank], "rank %d: line %d came after %d", rank, i,
                  s->next[rank] - 1);
    s->next[rank]++;
    s->count++;
}

START_TEST(test_lines_never_interleave)
{
    struct run r;
    const char *args[] = {"-n", "4", "sh", "-c",
                          "i=0; while [ $i -lt 2000 ]; do echo line $GW_RANK $i; i=$((i+1)); done",
                          NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    struct many_seen s = {0};
    gwrun_for_each_line(r.out, check_many_line, &s);
    ck_assert_int_eq(s.count, 8000);
    gwrun_free(&r);
}
END_TEST

struct long_seen {
    long xs;
    int lines;
};

static void check_long_line(const char *line, void *arg)
{
    struct long_seen *s = arg;
    ck_assert_msg(strncmp(line, "[0] ", 4) == 0, "line without prefix");
    const char *p = line + 4;
    if (strcmp(p, "after") == 0)
        return;
    ck_assert_msg(strspn(p, "x") == strlen(p), "piece of the long line holds other bytes");
    s->xs += (long)strlen(p);
    s->lines++;
}

START_TEST(test_long_line_split)
{
    struct run r;
    const char *args[] = {"-n", "1", "sh", "-c",
                          "head -c 200000 /dev/zero | tr '\\0' x; echo; echo after", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    struct long_seen s = {0};
    gwrun_for_each_line(r.out, check_long_line, &s);
    ck_assert_int_eq(s.xs, 200000);
    ck_assert_int_ge(s.lines, 2); /* split at 64 KiB, but no byte lost */
    ck_assert_msg(gwrun_has_line(r.out, "[0] after"), "the line after the long one is missing");
    gwrun_free(&r);
}
END_TEST

/* A line of exactly 64 KiB (the piece size), its newline in the next read,
 * is one line: it was a piece and then an empty line. The /dev/full stdout:
 * the job goes on, and the lost output is named on stderr (it was silent). */
START_TEST(test_line_of_piece_size)
{
    int full = open("/dev/full", O_WRONLY | O_CLOEXEC);
    ck_assert_int_ge(full, 0);
    struct run r;
    const char *args[] = {"-n", "1", "sh", "-c", "head -c 65536 /dev/zero | tr '\\0' x; sleep 0.3; echo; echo after",
                          NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 0 && gwrun_count_lines(r.out) == 2 && gwrun_has_line(r.out, "[0] after"),
                  "exit code %d, %d lines (2 expected), stderr:\n%s", r.code, gwrun_count_lines(r.out), r.err);
    struct long_seen s = {0};
    gwrun_for_each_line(r.out, check_long_line, &s);
    ck_assert_int_eq(s.xs, 65536);
    gwrun_free(&r);

    const char *args_full[] = {"-n", "1", "sh", "-c", "echo hi", NULL};
    gwrun_start_out(&r, full, NULL, args_full);
    close(full);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    ck_assert_msg(r.code == 0 && strstr(r.err, "gw-run: cannot write the ranks' output to stdout: No space left on "
                                                "device; its lines are dropped from here on, the job goes on"),
                  "exit code %d, stderr:\n%s", r.code, r.err);
    gwrun_free(&r);
}
END_TEST

/* A progress bar's redraws ("\r" + the bar, a newline at its end, as tqdm
 * writes them) go out "\r"-ended with the prefix as each next one arrives
 * (they waited for the bar's newline); "\r\n" stays one line end. */
START_TEST(test_carriage_return_redraws)
{
    struct run r;
    const char *args[] = {"-n", "1", "sh", "-c",
                          "printf 'a\\r\\nb\\n'; for i in 1 2 3; do printf '\\r %d0%%' $i; done; printf '\\n'", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 0 && !strcmp(r.out, "[0] a\r\n[0] b\n[0]  10%\r[0]  20%\r[0]  30%\n"),
                  "exit code %d, stdout '%s', stderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
}
END_TEST

/* Whether gw-run (r) is still running, leaving it to gwrun_wait to collect. */
static bool still_running(const struct run *r)
{
    siginfo_t si = {0};
    return waitid(P_PID, (id_t)r->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == 0;
}

/* A stdout nobody reads (a paused pager) and a SIGTERM: gw-run stops the
 * ranks, and gives up the output it cannot write once that output has taken
 * nothing for 5 s, naming it, instead of waiting for the reader for ever (it
 * did, through a second SIGTERM too). ranks_end: the rank writes less than
 * the queue holds and exits before the signal, which then comes with no rank
 * left and ends gw-run at once. */
static void stuck_stdout_signal(bool ranks_end)
{
    int p[2]; /* close-on-exec: only gw-run's stdout (a dup) holds the write end */
    ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
    struct run r;
    const char *args[] = {"-n", "1", "sh", "-c", ranks_end ? "head -c 300000 /dev/zero | tr '\\0' x" : "exec yes stuck",
                          NULL};
    gwrun_start_out(&r, p[1], NULL, args);
    close(p[1]);
    gwrun_sleep(1.5);
    const bool running = still_running(&r);
    kill(r.pid, SIGTERM);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    gwrun_wait(&r, 20.0);
    const double took = gwrun_seconds_since(&t0);
    close(p[0]);
    ck_assert_msg(running, "gw-run exited before the signal while its stdout was full (code %d)", r.code);
    ck_assert_msg(!r.timed_out, "gw-run still ran 20 s after SIGTERM with its stdout unread; stderr:\n%s", r.err);
    ck_assert_msg(strstr(r.err, "stdout has taken nothing for") && strstr(r.err, "gw-run was told to stop"),
                  "the output given up is not named; stderr:\n%s", r.err);
    if (ranks_end)
        ck_assert_msg(r.code == 0 && took < 3.0, "with no rank left: code %d after %.1f s; stderr:\n%s", r.code,
                      took, r.err);
    else
        ck_assert_msg(r.code == 128 + SIGTERM && took < 12.0, "code %d after %.1f s; stderr:\n%s", r.code, took,
                      r.err);
    gwrun_free(&r);
}

START_TEST(test_stuck_stdout_signal)
{
    stuck_stdout_signal(false);
}
END_TEST

START_TEST(test_stuck_stdout_signal_after_job)
{
    stuck_stdout_signal(true);
}
END_TEST

/* A clean run whose ranks leave processes running: one started with nohup,
 * one in a session of its own holding the ranks' stdout.  They end with
 * the job (they were orphaned unsaid; the one holding stdout given up on
 * after 2 s), and gw-run still exits 0. */
START_TEST(test_clean_run_stops_leftovers)
{
    char dir_env[128];
    gwt_dir(dir_env, sizeof dir_env);
    const char *env[] = {dir_env, "GW_RUN_KILL_GRACE=2", NULL};
    const char *args[] = {"-n", "2", "sh", "-c",
                          "f=\"$GWT_DIR/gc$GW_RANK\"; "
                          "if [ \"$GW_RANK\" = 1 ]; then nohup sleep 30 >/dev/null 2>&1 & echo $! > \"$f.tmp\"; "
                          "else setsid sh -c 'echo $$ > \"$0.tmp\"; exec sleep 30' \"$f\" & "
                          "while [ ! -s \"$f.tmp\" ]; do sleep 0.05; done; fi; mv \"$f.tmp\" \"$f\"; echo done",
                          NULL};
    struct run r;
    gwrun_run(&r, env, args);
    ck_assert_msg(r.code == 0 && r.elapsed < 15.0, "exit code %d after %.1f s, stderr:\n%s", r.code, r.elapsed, r.err);
    ck_assert_msg(gwrun_has_line(r.out, "[0] done") && gwrun_has_line(r.out, "[1] done"), "stdout:\n%s", r.out);
    ck_assert_msg(strstr(r.err, "stopping 2 processes left behind by exited ranks (every rank here ended") &&
                      !strstr(r.err, "not waiting for it"), "stderr:\n%s", r.err);
    gwt_assert_gone(dir_env, "gc0", "rank 0's leftover (setsid, holding stdout)");
    gwt_assert_gone(dir_env, "gc1", "rank 1's leftover (nohup)");
    gwrun_free(&r);
    /* One that SIGKILL does not end (a hook spares it): named and given up
     * on, the job's success kept (it exited 1, a rank's failure). */
    const char *spare_env[] = {dir_env, "GW_RUN_KILL_GRACE=1", "GW_RUN_TEST_UNKILLABLE_STRAYS=1", NULL};
    const char *one[] = {"-n", "1", "sh", "-c", "sleep 30 & echo $! > \"$GWT_DIR/gc.tmp\"; "
                         "mv \"$GWT_DIR/gc.tmp\" \"$GWT_DIR/gc\"; echo done", NULL};
    gwrun_run(&r, spare_env, one);
    ck_assert_msg(r.code == 0 && strstr(r.err, "is still there after SIGKILL: giving up on it") &&
                      gwrun_has_line(r.out, "[0] done"), "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out,
                  r.err);
    const pid_t spared = gwt_pid(dir_env, "gc");
    if (spared > 0)
        kill(spared, SIGKILL);
    gwt_dir_remove(dir_env);
    gwrun_free(&r);
}
END_TEST

/* A process gw-run had before its ranks (a job script's `tensorboard &
 * exec gw-run ...`) is not the job's: left running after a clean run, as
 * after a failed one (it was stopped as a leftover of the ranks). */
START_TEST(test_inherited_child_left_alone)
{
    char dir_env[128];
    gwt_dir(dir_env, sizeof dir_env);
    const char *env[] = {dir_env, "GW_RUN_KILL_GRACE=2", NULL};
    const char *args[] = {"-c", "sleep 30 & echo $! > \"$GWT_DIR/bg.tmp\"; mv \"$GWT_DIR/bg.tmp\" \"$GWT_DIR/bg\"; "
                          "exec \"$GW_RUN_BIN\" -n 1 sh -c 'echo done'", NULL};
    struct run r;
    gwrun_start_prog(&r, "/bin/sh", env, args);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    const pid_t bg = gwt_pid(dir_env, "bg");
    const bool alive = bg > 0 && kill(bg, 0) == 0;
    if (bg > 0)
        kill(bg, SIGKILL);
    gwt_dir_remove(dir_env);
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] done"), "exit %d\nstdout:\n%s\nstderr:\n%s", r.code,
                  r.out, r.err);
    ck_assert_msg(alive && !strstr(r.err, "left behind"), "the inherited child (pid %ld) was %s; stderr:\n%s",
                  (long)bg, alive ? "named" : "stopped", r.err);
    gwrun_free(&r);
}
END_TEST

void gwrun_add_output_tests(TCase *tc)
{
    tcase_add_test(tc, test_stuck_stdout_signal);
    tcase_add_test(tc, test_stuck_stdout_signal_after_job);
    tcase_add_test(tc, test_output_routing);
    tcase_add_test(tc, test_lines_never_interleave);
    tcase_add_test(tc, test_long_line_split);
    tcase_add_test(tc, test_line_of_piece_size);
    tcase_add_test(tc, test_carriage_return_redraws);
    tcase_add_test(tc, test_clean_run_stops_leftovers);
    tcase_add_test(tc, test_inherited_child_left_alone);
}
