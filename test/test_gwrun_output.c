/*
 * test_gwrun_output: the single-node gw-run launcher's output cases, part of
 * test_gwrun (test_gwrun.c runs them): each rank's stdout and stderr go to
 * gw-run's with a [rank] prefix, whole lines never interleave between ranks,
 * a line longer than the buffer is split (not lost), and a grandchild that
 * keeps the output open does not keep gw-run waiting.
 */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

START_TEST(test_grandchild_holding_output)
{
    /* A rank that leaves a background process holding its stdout must not keep
     * gw-run waiting for that process. */
    struct run r;
    const char *args[] = {"-n", "1", "sh", "-c", "sleep 60 & echo done", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(gwrun_has_line(r.out, "[0] done"), "stdout:\n%s", r.out);
    ck_assert_msg(r.elapsed < 30.0, "gw-run waited %.1f s for a background process", r.elapsed);
    gwrun_free(&r);
}
END_TEST

void gwrun_add_output_tests(TCase *tc)
{
    tcase_add_test(tc, test_output_routing);
    tcase_add_test(tc, test_lines_never_interleave);
    tcase_add_test(tc, test_long_line_split);
    tcase_add_test(tc, test_carriage_return_redraws);
    tcase_add_test(tc, test_grandchild_holding_output);
}
