/*
 * test_gwrun_logs: gw-run's log files (--log-dir, --tee, --redirects), part
 * of test_gwrun (test_gwrun.c runs them): each rank's streams land byte for
 * byte in DIR/RUN/attempt_K/RANK/{stdout,stderr}.log beside the console's
 * prefixed lines, RUN new at each start (a second run leaves the first's
 * logs alone); torchrun's per-rank selections send a stream to the file
 * only, to both (tee over redirect), or to the console only; each restart
 * gets its own files; a failed rank's redirected stderr is named; a file
 * past the file-size limit is said and the rest goes to the console, losing
 * nothing; bad values are refused by name.
 */
#include <check.h>
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/resource.h>
#include <sys/stat.h>

#include "gwrun_helpers.h"

/* The whole file, or NULL where there is none; *n its length. */
static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, len = 0, got;
    do {
        if (len + 4096 > cap) {
            cap = (len + 4096) * 2;
            buf = realloc(buf, cap + 1);
            ck_assert_ptr_nonnull(buf);
        }
        got = fread(buf + len, 1, 4096, f);
        len += got;
    } while (got > 0);
    fclose(f);
    buf[len] = '\0';
    if (n)
        *n = len;
    return buf;
}

/* Asserts that dir/rel holds exactly want (NULL: that there is no such file). */
static void expect_file(const char *dir, const char *rel, const char *want)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    char *got = slurp(path, NULL);
    if (!want)
        ck_assert_msg(!got, "%s exists, holding '%s'", path, got);
    else
        ck_assert_msg(got && strcmp(got, want) == 0, "%s holds '%s', expected '%s'", path, got ? got : "(no file)",
                      want);
    free(got);
}

/* Asserts that `want` run directories match pattern, and copies the one
 * gw-run's stderr says it logged in into out (two runs in one second sort by
 * their random part, not by time). */
static void run_dirs(const char *pattern, size_t want, const char *err, char *out, size_t outsz)
{
    glob_t g;
    const int rc = glob(pattern, GLOB_ONLYDIR, NULL, &g);
    const size_t n = rc == 0 ? g.gl_pathc : 0;
    if (rc == 0)
        globfree(&g);
    ck_assert_msg(n == want, "%zu run directories match %s, expected %zu", n, pattern, want);
    const char *said = strstr(err, "logged in "), *end = said ? strstr(said, "/attempt_K/") : NULL;
    ck_assert_msg(said && end && (size_t)(end - said - 10) < outsz, "no log directory said:\n%s", err);
    memcpy(out, said + 10, (size_t)(end - said - 10));
    out[end - said - 10] = '\0';
}

static void make_tmp_dir(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/gwrun-logs-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_tree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_log_dir_tees)
{
    char base[64], dir[96], pattern[128], run1[256], run2[256];
    make_tmp_dir(base, sizeof base);
    snprintf(dir, sizeof dir, "%s/logs/job", base); /* made, parents too */
    snprintf(pattern, sizeof pattern, "%s/2*-*", dir);
    struct run r;
    const char *args[] = {"-n", "2", "--log-dir", dir, "sh", "-c",
                          "echo out $GW_RANK; printf 'err %s\\n\\001no newline' $GW_RANK >&2", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%.800s", r.code, r.err);
    /* the console as without --log-dir */
    ck_assert_msg(gwrun_has_line(r.out, "[0] out 0") && gwrun_has_line(r.out, "[1] out 1"), "stdout:\n%s", r.out);
    ck_assert_msg(gwrun_has_line(r.err, "[0] err 0") && gwrun_has_line(r.err, "[1] \001no newline"), "stderr:\n%.800s",
                  r.err);
    run_dirs(pattern, 1, r.err, run1, sizeof run1);
    /* the files as the ranks printed them: no prefix, the last line unended */
    expect_file(run1, "attempt_0/0/stdout.log", "out 0\n");
    expect_file(run1, "attempt_0/1/stdout.log", "out 1\n");
    expect_file(run1, "attempt_0/0/stderr.log", "err 0\n\001no newline");
    expect_file(run1, "attempt_0/1/stderr.log", "err 1\n\001no newline");
    gwrun_free(&r);

    /* Again into the same directory (a resubmitted job): a run directory of
     * its own, the first run's logs untouched. */
    const char *again[] = {"-n", "2", "--log-dir", dir, "sh", "-c", "echo second", NULL};
    gwrun_run(&r, NULL, again);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%.800s", r.code, r.err);
    run_dirs(pattern, 2, r.err, run2, sizeof run2);
    ck_assert_msg(strcmp(run1, run2) != 0, "the second run logged in the first's %s", run1);
    expect_file(run2, "attempt_0/0/stdout.log", "second\n");
    expect_file(run1, "attempt_0/0/stdout.log", "out 0\n");
    gwrun_free(&r);

    /* No stream to a file: no directory made, nothing said. */
    const char *none[] = {"-n", "1", "--log-dir", dir, "--tee", "0", "true", NULL};
    gwrun_run(&r, NULL, none);
    ck_assert_msg(r.code == 0 && !strstr(r.err, "logged in"), "exit code %d, stderr:\n%.800s", r.code, r.err);
    glob_t g;
    ck_assert_msg(glob(pattern, GLOB_ONLYDIR, NULL, &g) == 0 && g.gl_pathc == 2, "a directory was made for no file");
    globfree(&g);
    gwrun_free(&r);
    remove_tree(base);
}
END_TEST

START_TEST(test_tee_and_redirects_by_rank)
{
    /* torchrun's per-rank values: rank 0's stdout to its file only; rank 1's
     * streams to both; rank 2's redirected, its stdout teed too (tee wins);
     * rank 3 (past -n) ignored, as torchrun does; the rest to the console
     * only.  No --log-dir: a new directory under TMPDIR, said. */
    char tmp[64], env_tmp[96];
    make_tmp_dir(tmp, sizeof tmp);
    snprintf(env_tmp, sizeof env_tmp, "TMPDIR=%s", tmp);
    const char *env[] = {env_tmp, NULL};
    struct run r;
    const char *args[] = {"-n", "3", "-r", "0:1,2:3,3:3", "--tee", "1:3,2:1", "sh", "-c",
                          "echo out $GW_RANK; echo err $GW_RANK >&2", NULL};
    gwrun_run(&r, env, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%.800s", r.code, r.err);
    ck_assert_msg(!strstr(r.out, "out 0") && !strstr(r.err, "err 2"), "a redirected stream reached the console:\n"
                  "%s\n%s", r.out, r.err);
    ck_assert_msg(gwrun_has_line(r.out, "[1] out 1") && gwrun_has_line(r.out, "[2] out 2"), "stdout:\n%s", r.out);
    ck_assert_msg(gwrun_has_line(r.err, "[0] err 0") && gwrun_has_line(r.err, "[1] err 1"), "stderr:\n%.800s", r.err);
    /* said (a value naming only such ranks logged nothing, and said nothing) */
    ck_assert_msg(strstr(r.err, "gw-run: note: --redirects '0:1,2:3,3:3' names local rank 3, past -n 3 "
                                "(local ranks 0-2): ignored, as torchrun ignores it") &&
                      !strstr(r.err, "--tee '1:3,2:1' names"),
                  "stderr:\n%.800s", r.err);
    char pattern[128], run[256];
    snprintf(pattern, sizeof pattern, "%s/gw-run-logs-*", tmp);
    run_dirs(pattern, 1, r.err, run, sizeof run);
    expect_file(run, "attempt_0/0/stdout.log", "out 0\n");
    expect_file(run, "attempt_0/0/stderr.log", NULL);
    expect_file(run, "attempt_0/1/stdout.log", "out 1\n");
    expect_file(run, "attempt_0/1/stderr.log", "err 1\n");
    expect_file(run, "attempt_0/2/stdout.log", "out 2\n");
    expect_file(run, "attempt_0/2/stderr.log", "err 2\n");
    gwrun_free(&r);

    /* A program that cannot be started, its stderr redirected: the report
     * names the file that says why. */
    const char *bad[] = {"-n", "1", "-r", "2", "/nonexistent/program", NULL};
    gwrun_run(&r, env, bad);
    run_dirs(pattern, 2, r.err, run, sizeof run);
    char named[320];
    snprintf(named, sizeof named, "rank 0's stderr is in %s/attempt_0/0/stderr.log", run);
    ck_assert_msg(r.code == 127 && strstr(r.err, named), "exit code %d, stderr:\n%.800s", r.code, r.err);
    expect_file(run, "attempt_0/0/stderr.log", "gw-run: cannot run '/nonexistent/program': No such file or directory\n");
    gwrun_free(&r);
    remove_tree(tmp);
}
END_TEST

START_TEST(test_logs_per_restart)
{
    /* Attempt 0 fails (rank 0, once rank 1 has printed and exited), attempt 1
     * succeeds: each has its own files, all of them redirected. */
    char base[64], dir[96], script[512], pattern[128], run[256];
    make_tmp_dir(base, sizeof base);
    snprintf(dir, sizeof dir, "%s/logs", base);
    snprintf(pattern, sizeof pattern, "%s/2*-*", dir);
    snprintf(script, sizeof script,
             "echo try $GW_RESTART_COUNT; [ $GW_RESTART_COUNT = 0 ] || exit 0; "
             "if [ $GW_RANK = 1 ]; then : > %s/printed; exit 0; fi; "
             "i=0; while [ ! -e %s/printed ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; exit 1",
             base, base);
    struct run r;
    const char *args[] = {"-n", "2", "--max-restarts", "1", "--log-dir", dir, "--redirects", "3", "sh", "-c",
                          script, NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 0 && strstr(r.err, "restarting the job"), "exit code %d, stderr:\n%.800s", r.code, r.err);
    ck_assert_msg(!strstr(r.out, "try"), "redirected lines reached the console:\n%s", r.out);
    run_dirs(pattern, 1, r.err, run, sizeof run);
    expect_file(run, "attempt_0/0/stdout.log", "try 0\n");
    expect_file(run, "attempt_0/1/stdout.log", "try 0\n");
    expect_file(run, "attempt_1/0/stdout.log", "try 1\n");
    expect_file(run, "attempt_1/1/stdout.log", "try 1\n");
    gwrun_free(&r);
    remove_tree(base);
}
END_TEST

START_TEST(test_log_file_full)
{
    /* Past the file-size limit (ulimit -f; the same for a full disk) the
     * file keeps what it took, the rest and what follows go to the console,
     * said once; gw-run is not killed by SIGXFSZ, and the job goes on. */
    char dir[64];
    make_tmp_dir(dir, sizeof dir);
    struct rlimit old, lim = {.rlim_cur = 65536, .rlim_max = RLIM_INFINITY};
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim.rlim_max = old.rlim_max;
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    struct run r;
    const char *args[] = {"-n", "1", "--log-dir", dir, "-r", "1", "sh", "-c",
                          "grep SigIgn /proc/$$/status >&2; head -c 100000 /dev/zero | tr '\\000' a; echo; echo end",
                          NULL};
    gwrun_start(&r, NULL, args);
    setrlimit(RLIMIT_FSIZE, &old);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%.800s", r.code, r.err);
    ck_assert_msg(strstr(r.err, "cannot write") && strstr(r.err, "File too large") &&
                      strstr(r.err, "rank 0's stdout goes to the console"),
                  "stderr:\n%.800s", r.err);
    /* the rank got SIGXFSZ's default back (gw-run ignores it) */
    const char *ign = strstr(r.err, "SigIgn:");
    ck_assert_msg(ign && !(strtoull(ign + 7, NULL, 16) & (1ull << (25 - 1))), "the rank ignores SIGXFSZ:\n%s", r.err);
    char pattern[128], run[256], path[320];
    snprintf(pattern, sizeof pattern, "%s/2*-*", dir);
    run_dirs(pattern, 1, r.err, run, sizeof run);
    snprintf(path, sizeof path, "%s/attempt_0/0/stdout.log", run);
    size_t n = 0;
    char *got = slurp(path, &n);
    ck_assert_msg(got && n == 65536 && strspn(got, "a") == n, "the log holds %zu bytes", n);
    free(got);
    size_t console = 0; /* the a's on the console: the rest, once */
    const char *line = strstr(r.out, "[0] a");
    ck_assert_msg(line, "stdout:\n%.200s", r.out);
    console = strspn(line + 4, "a");
    ck_assert_msg(console == 100000 - 65536, "%zu a's on the console, expected %d", console, 100000 - 65536);
    ck_assert_msg(gwrun_has_line(r.out, "[0] end"), "the line after is missing:\n%.200s", r.out);
    gwrun_free(&r);
    remove_tree(dir);
}
END_TEST

START_TEST(test_log_values_refused)
{
    static const struct {
        const char *flag, *value, *says;
    } bad[] = {
        {"--tee", "4", "--tee must be 0 (no stream)"},
        {"-r", "0:1,0:2", "local rank 0 is named twice"},
        {"--redirects", " 1:3", "not ' 1:3'"},
        {"--redirects", "0:3, -1:2", "not '0:3, -1:2'"},
        {"-t", "0:1,", "not '0:1,'"},
        {"-t", "-1:1", "not '-1:1'"},
        {"--log-dir", "", "--log-dir must name a directory"},
        {"--local-ranks-filter", "0,,1", "--local-ranks-filter must be local ranks"},
        {"--local-ranks-filter", "-1", "not '-1'"},
        {"--local_ranks_filter", "0;1", "not '0;1'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct run r;
        const char *args[] = {"-n", "2", bad[i].flag, bad[i].value, "true", NULL};
        gwrun_run(&r, NULL, args);
        ck_assert_msg(r.code == 2 && strstr(r.err, bad[i].says), "%s '%s': exit code %d, stderr:\n%.800s", bad[i].flag,
                      bad[i].value, r.code, r.err);
        gwrun_free(&r);
    }
    /* a file where the directory should be: the system's reason, by name */
    struct run r;
    const char *args[] = {"-n", "1", "--log-dir", "/dev/null/logs", "true", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 1 && strstr(r.err, "--log-dir /dev/null/logs: cannot make that directory"),
                  "exit code %d, stderr:\n%.800s", r.code, r.err);
    gwrun_free(&r);
}
END_TEST

/* Each "[1] ..." line of a report must be one the rank printed whole. */
static void whole_line(const char *line, void *arg)
{
    if (strncmp(line, "[1] ", 4) == 0 && strncmp(line + 4, "noise ", 6) != 0 && strcmp(line + 4, "the reason") != 0)
        ++*(int *)arg;
}

/* torchrun's --local-ranks-filter: only the named local ranks' lines reach
 * the console (a rank past -n names nothing), the log files keep every
 * rank's, and a hidden rank that fails has the end of its stderr said, from
 * a whole line (its reason was lost). */
START_TEST(test_local_ranks_filter)
{
    char base[64], dir[96], pattern[128], run[256];
    make_tmp_dir(base, sizeof base);
    snprintf(dir, sizeof dir, "%s/logs", base);
    snprintf(pattern, sizeof pattern, "%s/2*-*", dir);
    struct run r;
    const char *args[] = {"-n", "3", "--local-ranks-filter", "0,2,7", "--log-dir", dir, "sh", "-c",
                          "echo out $RANK; echo err $RANK >&2", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] out 0") && gwrun_has_line(r.out, "[2] out 2") &&
                      !strstr(r.out, "out 1") && gwrun_has_line(r.err, "[2] err 2") && !strstr(r.err, "err 1"),
                  "exit code %d, stdout:\n%s\nstderr:\n%.800s", r.code, r.out, r.err);
    run_dirs(pattern, 1, r.err, run, sizeof run);
    expect_file(run, "attempt_0/1/stdout.log", "out 1\n");
    expect_file(run, "attempt_0/1/stderr.log", "err 1\n");
    ck_assert_msg(!strstr(r.err, "names no local rank"), "a filter naming ranks 0 and 2 said it named none");
    gwrun_free(&r);
    remove_tree(base);
    /* one naming no rank of -n: accepted as torchrun's, and said */
    const char *none[] = {"-n", "2", "--local-ranks-filter", "7", "sh", "-c", "echo out $RANK", NULL};
    gwrun_run(&r, NULL, none);
    ck_assert_msg(r.code == 0 && !strstr(r.out, "out") &&
                      strstr(r.err, "gw-run: note: --local-ranks-filter 7 names no local rank of -n 2 (0-1)"),
                  "exit code %d, stdout:\n%s\nstderr:\n%.800s", r.code, r.out, r.err);
    gwrun_free(&r);

    const char *fail[] = {"-n", "2", "--local-ranks-filter", "0", "sh", "-c",
                          "if [ $RANK = 1 ]; then echo hidden out; i=0; while [ $i -lt 100 ]; do "
                          "echo \"noise $i of rank 1 .........................................\" >&2; "
                          "i=$((i + 1)); done; echo 'the reason' >&2; exit 3; fi; exec sleep 30", NULL};
    gwrun_run(&r, NULL, fail);
    int broken = 0;
    gwrun_for_each_line(r.err, whole_line, &broken);
    const char *said = strstr(r.err, "rank 1's last stderr lines (hidden by --local-ranks-filter):");
    ck_assert_msg(r.code == 3 && said && strstr(said, "[1] noise 99 of rank 1") && strstr(said, "[1] the reason") &&
                      !strstr(r.err, "noise 0 of") && broken == 0 && !strstr(r.out, "hidden out"),
                  "exit code %d, %d broken lines, stderr from the report:\n%.800s", r.code, broken,
                  said ? said : r.err);
    gwrun_free(&r);

    /* Two lines filling the kept end exactly: both said (the first was taken
     * for a cut one); '' is torchrun's default, every rank shown */
    const char *exact[] = {"-n", "2", "--local-ranks-filter", "0", "sh", "-c",
                           "if [ $RANK = 1 ]; then head -c 1023 /dev/zero | tr '\\0' A >&2; echo >&2; "
                           "head -c 1023 /dev/zero | tr '\\0' B >&2; echo >&2; exit 5; fi; exec sleep 30", NULL};
    gwrun_run(&r, NULL, exact);
    said = strstr(r.err, "hidden by --local-ranks-filter");
    ck_assert_msg(r.code == 5 && said && strstr(said, "[1] AAAA") && strstr(said, "[1] BBBB"),
                  "exit code %d, stderr:\n%.800s", r.code, r.err);
    gwrun_free(&r);
    gwrun_run(&r, NULL, (const char *[]){"-n", "2", "--local-ranks-filter", "", "sh", "-c", "echo out $RANK", NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[1] out 1"), "'': exit %d, stdout:\n%s", r.code, r.out);
    gwrun_free(&r);
}
END_TEST

void gwrun_add_log_tests(TCase *tc)
{
    tcase_add_test(tc, test_local_ranks_filter);
    tcase_add_test(tc, test_log_dir_tees);
    tcase_add_test(tc, test_tee_and_redirects_by_rank);
    tcase_add_test(tc, test_logs_per_restart);
    tcase_add_test(tc, test_log_file_full);
    tcase_add_test(tc, test_log_values_refused);
}
