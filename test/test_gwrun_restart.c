/*
 * test_gwrun_restart: Check suite for gw-run --max-restarts (tools/gw-run.c).
 *
 * What it is: black-box tests of the built gw-run (GW_RUN_BIN) with sh ranks:
 * a failed job is started again, all of its ranks, with GW_RESTART_COUNT
 * counting up, a fresh job token and master port each time, until it
 * succeeds or the restarts are used up (then the last failure's exit code);
 * no restart after a signal to gw-run or for a program that cannot be
 * started; the flag's checks.
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

/* Rank 1 fails (exit 5) on the first two attempts; every rank says what it
 * sees. */
START_TEST(test_restarts_until_success)
{
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "3", "sh", "-c",
                          "echo \"attempt $GW_RESTART_COUNT/$GW_MAX_RESTARTS port $GW_MASTER_PORT "
                          "token $GW_JOB_TOKEN\"; "
                          "if [ \"$GW_RANK\" = 1 ] && [ \"$GW_RESTART_COUNT\" -lt 2 ]; then exit 5; fi",
                          NULL};
    gwrun_run(&r, (const char *const[]){"GW_RUN_KILL_GRACE=30", "GW_JOB_TOKEN=tok", NULL}, args);
    ck_assert_msg(r.code == 0, "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    ck_assert_msg(strstr(r.err, "restarting the job (exit code 5): restart 1 of 3, 2 ranks") &&
                      strstr(r.err, "restart 2 of 3") && !strstr(r.err, "restart 3 of 3"),
                  "stderr:\n%s", r.err);
    /* Each attempt: both ranks, its count, one port and token of its own. */
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
    ck_assert_msg(strcmp(port[0], port[1]) && strcmp(port[1], port[2]),
                  "the attempts shared a master port: %s %s %s", port[0], port[1], port[2]);
    ck_assert_msg(!strstr(r.out, "attempt 3/3"), "a fourth attempt ran:\n%s", r.out);
    gwrun_free(&r);
}
END_TEST

/* Every attempt fails: the job ends with the last one's code after K restarts. */
START_TEST(test_restarts_used_up)
{
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "2", "sh", "-c",
                          "echo \"attempt $GW_RESTART_COUNT\"; exit $((3 + GW_RESTART_COUNT))", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 5, "exit %d (expected the third attempt's 5)\nstderr:\n%s", r.code, r.err);
    ck_assert_msg(strstr(r.out, "[0] attempt 2") && !strstr(r.out, "attempt 3") &&
                      strstr(r.err, "the job failed again; no restarts left (2 used)"),
                  "stdout:\n%s\nstderr:\n%s", r.out, r.err);
    gwrun_free(&r);
}
END_TEST

/* SIGTERM to gw-run stops the job for good: no restart, exit 128 + 15. */
START_TEST(test_no_restart_after_signal)
{
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "3", "sh", "-c",
                          "echo \"attempt $GW_RESTART_COUNT\"; exec sleep 30", NULL};
    gwrun_start(&r, (const char *const[]){"GW_RUN_KILL_GRACE=5", NULL}, args);
    gwrun_sleep(1.0);
    kill(r.pid, SIGTERM);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    ck_assert_msg(!r.timed_out && r.code == 128 + SIGTERM, "exit %d\nstderr:\n%s", r.code, r.err);
    ck_assert_msg(!strstr(r.err, "restarting") && !strstr(r.out, "attempt 1"), "stdout:\n%s\nstderr:\n%s",
                  r.out, r.err);
    gwrun_free(&r);
}
END_TEST

/* A program that cannot be started is not tried again. */
START_TEST(test_no_restart_not_found)
{
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "3", "gw-no-such-program-xyz", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 127 && strstr(r.err, "not restarting the job: exit code 127") &&
                      !strstr(r.err, "restarting the job ("),
                  "exit %d\nstderr:\n%s", r.code, r.err);
    gwrun_free(&r);
}
END_TEST

START_TEST(test_restart_flags)
{
    static const char *const cases[][10] = {
        {"-n", "2", "--max-restarts", "-1", "true", NULL},
        {"-n", "2", "--max-restarts", "x", "true", NULL},
        {"-n", "2", "--max-restarts", "10001", "true", NULL},
        {"-n", "2", "--max-restarts", NULL},
        {"-n", "2", "--max-restarts", "1", "--nnodes", "2", "--master", "127.0.0.1:1234", "true", NULL},
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

static Suite *make_suite(void)
{
    Suite *s = suite_create("gw-run-restart");
    TCase *tc = tcase_create("restart");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_restarts_until_success);
    tcase_add_test(tc, test_restarts_used_up);
    tcase_add_test(tc, test_no_restart_after_signal);
    tcase_add_test(tc, test_no_restart_not_found);
    tcase_add_test(tc, test_restart_flags);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return gwrun_main("test_gwrun_restart", make_suite);
}
