/*
 * test_gwrun: Check suite for the gw-run launcher (tools/gw-run.c).
 *
 * What it is: black-box tests that run the built gw-run binary (found through
 * the GW_RUN_BIN environment variable, which meson sets) with small sh
 * scripts as ranks, capture its stdout and stderr in temporary files, and
 * check exit codes, the GW_* environment, output routing and teardown.
 *
 * What it is not: a test of the library's bootstrap; the ranks here never
 * talk to each other. Every run has a timeout guard so that a broken gw-run
 * fails a test instead of hanging the suite.
 */
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
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

/* Generous: the CI machines have 2 shared cores. */
#define RUN_TIMEOUT_S 40.0

struct run {
    pid_t pid;
    char out_path[64], err_path[64];
    struct timespec t0;
    int status;
    int code;       /* exit code, or 128 + signal when gw-run itself was killed */
    bool timed_out; /* gw-run did not finish in time and was killed */
    double elapsed; /* seconds from start to exit */
    char *out, *err;
};

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void sleep_s(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static const char *gwrun_bin(void)
{
    const char *b = getenv("GW_RUN_BIN");
    ck_assert_msg(b && *b, "GW_RUN_BIN is not set (point it at the built gw-run)");
    return b;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

/* Starts gw-run with args (NULL-terminated, without argv[0]). env holds
 * "NAME=VALUE" to set and "NAME" to unset in the child, NULL-terminated. */
static void run_start(struct run *r, const char *const *env, const char *const *args)
{
    memset(r, 0, sizeof *r);
    const char *bin = gwrun_bin();
    snprintf(r->out_path, sizeof r->out_path, "/tmp/test_gwrun_out_XXXXXX");
    snprintf(r->err_path, sizeof r->err_path, "/tmp/test_gwrun_err_XXXXXX");
    int ofd = mkstemp(r->out_path);
    int efd = mkstemp(r->err_path);
    ck_assert_msg(ofd >= 0 && efd >= 0, "mkstemp failed: %s", strerror(errno));

    const char *argv[64];
    int argc = 0;
    argv[argc++] = bin;
    for (int i = 0; args[i]; i++) {
        ck_assert_int_lt(argc, 63);
        argv[argc++] = args[i];
    }
    argv[argc] = NULL;

    clock_gettime(CLOCK_MONOTONIC, &r->t0);
    r->pid = fork();
    ck_assert_int_ge(r->pid, 0);
    if (r->pid == 0) {
        dup2(ofd, 1);
        dup2(efd, 2);
        close(ofd);
        close(efd);
        for (int i = 0; env && env[i]; i++) {
            const char *eq = strchr(env[i], '=');
            if (eq) {
                char name[128];
                snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
                setenv(name, eq + 1, 1);
            } else {
                unsetenv(env[i]);
            }
        }
        execv(bin, (char *const *)argv);
        dprintf(2, "test_gwrun: cannot exec %s: %s\n", bin, strerror(errno));
        _exit(126);
    }
    close(ofd);
    close(efd);
}

/* Waits for gw-run, killing it after timeout_s, then collects its output. */
static void run_wait(struct run *r, double timeout_s)
{
    for (;;) {
        pid_t p = waitpid(r->pid, &r->status, WNOHANG);
        if (p == r->pid)
            break;
        ck_assert_msg(p == 0 || errno == EINTR, "waitpid failed: %s", strerror(errno));
        if (seconds_since(&r->t0) > timeout_s) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &r->status, 0);
            r->timed_out = true;
            break;
        }
        sleep_s(0.01);
    }
    r->elapsed = seconds_since(&r->t0);
    r->code = WIFEXITED(r->status) ? WEXITSTATUS(r->status) : 128 + WTERMSIG(r->status);
    r->out = slurp(r->out_path);
    r->err = slurp(r->err_path);
    unlink(r->out_path);
    unlink(r->err_path);
}

static void run_gwrun(struct run *r, const char *const *env, const char *const *args)
{
    run_start(r, env, args);
    run_wait(r, RUN_TIMEOUT_S);
    ck_assert_msg(!r->timed_out, "gw-run did not finish within %.0f s; stderr:\n%s", RUN_TIMEOUT_S,
                  r->err);
}

static void run_free(struct run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* Whether text holds exactly this line (without its newline). */
static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len == n && memcmp(p, line, n) == 0)
            return true;
        if (!nl)
            break;
        p = nl + 1;
    }
    return false;
}

static int count_lines(const char *text)
{
    int n = 0;
    for (const char *p = text; *p; p++)
        if (*p == '\n')
            n++;
    return n;
}

/* Calls fn on each line of text, copied into a NUL-terminated buffer. */
static void for_each_line(const char *text, void (*fn)(const char *line, void *arg), void *arg)
{
    static char line[256 * 1024];
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        ck_assert_uint_lt(len, sizeof line);
        memcpy(line, p, len);
        line[len] = '\0';
        fn(line, arg);
        if (!nl)
            break;
        p = nl + 1;
    }
}

/* ---- 1: all ranks succeed ---- */

START_TEST(test_all_ranks_succeed)
{
    struct run r;
    const char *args[] = {"-n", "3", "sh", "-c", "echo hi $GW_RANK/$GW_WORLD_SIZE $GW_LOCAL_RANK",
                          NULL};
    run_gwrun(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(count_lines(r.out) == 3, "expected 3 lines, got:\n%s", r.out);
    ck_assert_msg(has_line(r.out, "[0] hi 0/3 0"), "stdout:\n%s", r.out);
    ck_assert_msg(has_line(r.out, "[1] hi 1/3 1"), "stdout:\n%s", r.out);
    ck_assert_msg(has_line(r.out, "[2] hi 2/3 2"), "stdout:\n%s", r.out);
    run_free(&r);
}
END_TEST

/* ---- 2: environment ---- */

struct env_seen {
    int lines;
    bool rank_seen[8];
    char token[128];
    int omp;
};

static void check_env_line(const char *line, void *arg)
{
    struct env_seen *s = arg;
    int prefix, rank, port, omp, lws, nnodes, node_rank, used = 0;
    char addr[64], token[128];
    int n = sscanf(line, "[%d] %d %63s %d %127s %d %d %d %d%n", &prefix, &rank, addr, &port, token,
                   &omp, &lws, &nnodes, &node_rank, &used);
    ck_assert_msg(n == 9 && line[used] == '\0', "unexpected line '%s'", line);
    ck_assert_int_eq(prefix, rank);
    ck_assert(rank >= 0 && rank < 8);
    s->rank_seen[rank] = true;
    ck_assert_str_eq(addr, "127.0.0.1");
    ck_assert_msg(port >= 1 && port <= 65535, "GW_MASTER_PORT %d", port);
    ck_assert_int_ge(omp, 1);
    ck_assert_int_eq(nnodes, 1);
    ck_assert_int_eq(node_rank, 0);
    if (s->lines == 0) {
        snprintf(s->token, sizeof s->token, "%s", token);
        s->omp = omp;
    } else {
        ck_assert_msg(strcmp(s->token, token) == 0, "ranks see different tokens: %s vs %s",
                      s->token, token);
        ck_assert_int_eq(s->omp, omp);
    }
    (void)lws;
    s->lines++;
}

static const char env_script[] =
    "echo $GW_RANK $GW_MASTER_ADDR $GW_MASTER_PORT $GW_JOB_TOKEN $OMP_NUM_THREADS "
    "$GW_LOCAL_WORLD_SIZE $GW_NNODES $GW_NODE_RANK";

START_TEST(test_env_generated)
{
    struct run r;
    const char *env[] = {"GW_JOB_TOKEN", "OMP_NUM_THREADS", NULL};
    const char *args[] = {"-n", "2", "sh", "-c", env_script, NULL};
    run_gwrun(&r, env, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    struct env_seen s = {0};
    for_each_line(r.out, check_env_line, &s);
    ck_assert_int_eq(s.lines, 2);
    ck_assert(s.rank_seen[0] && s.rank_seen[1]);
    ck_assert_uint_eq(strlen(s.token), 32);
    for (int i = 0; i < 32; i++)
        ck_assert_msg(isxdigit((unsigned char)s.token[i]), "token %s is not hex", s.token);
    /* Two runs must not share a token: it is the job's secret. */
    struct run r2;
    run_gwrun(&r2, env, args);
    ck_assert_int_eq(r2.code, 0);
    struct env_seen s2 = {0};
    for_each_line(r2.out, check_env_line, &s2);
    ck_assert_str_ne(s.token, s2.token);
    run_free(&r);
    run_free(&r2);
}
END_TEST

START_TEST(test_env_passthrough)
{
    struct run r;
    const char *env[] = {"GW_JOB_TOKEN=my-preset-token", "OMP_NUM_THREADS=5", NULL};
    const char *args[] = {"-n", "3", "sh", "-c", env_script, NULL};
    run_gwrun(&r, env, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    struct env_seen s = {0};
    for_each_line(r.out, check_env_line, &s);
    ck_assert_int_eq(s.lines, 3);
    ck_assert_str_eq(s.token, "my-preset-token");
    ck_assert_int_eq(s.omp, 5);
    run_free(&r);
}
END_TEST

START_TEST(test_env_master_and_multinode)
{
    const char *script = "echo $GW_RANK $GW_WORLD_SIZE $GW_LOCAL_RANK $GW_LOCAL_WORLD_SIZE "
                         "$GW_NODE_RANK $GW_NNODES $GW_MASTER_ADDR $GW_MASTER_PORT";
    struct run r;
    const char *a1[] = {"-n", "1", "--master", "10.1.2.3:29500", "sh", "-c", script, NULL};
    run_gwrun(&r, NULL, a1);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(has_line(r.out, "[0] 0 1 0 1 0 1 10.1.2.3 29500"), "stdout:\n%s", r.out);
    run_free(&r);

    const char *a2[] = {"-n", "1", "--master", "[::1]:4000", "--", "sh", "-c", script, NULL};
    run_gwrun(&r, NULL, a2);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(has_line(r.out, "[0] 0 1 0 1 0 1 ::1 4000"), "stdout:\n%s", r.out);
    run_free(&r);

    /* Node 1 of 2 with 2 ranks each holds global ranks 2 and 3. */
    const char *env[] = {"GW_JOB_TOKEN=shared", NULL};
    const char *a3[] = {"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
                        "--master", "node0.example:1234", "sh", "-c", script, NULL};
    run_gwrun(&r, env, a3);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_int_eq(count_lines(r.out), 2);
    ck_assert_msg(has_line(r.out, "[2] 2 4 0 2 1 2 node0.example 1234"), "stdout:\n%s", r.out);
    ck_assert_msg(has_line(r.out, "[3] 3 4 1 2 1 2 node0.example 1234"), "stdout:\n%s", r.out);
    run_free(&r);
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
    run_gwrun(&r, env, args);
    ck_assert_msg(r.code == 7, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(r.elapsed < 20.0, "took %.1f s: the other ranks were not stopped", r.elapsed);
    ck_assert_msg(strstr(r.err, "rank 1 (pid") && strstr(r.err, "exited with code 7"),
                  "stderr does not name rank 1 and code 7:\n%s", r.err);
    /* Ranks that gw-run stopped itself are not reported as failures. */
    ck_assert_msg(!strstr(r.err, "rank 0 (pid") && !strstr(r.err, "rank 2 (pid"),
                  "stderr:\n%s", r.err);
    run_free(&r);
}
END_TEST

START_TEST(test_sigkill_after_grace)
{
    /* Ranks that ignore SIGTERM are killed once GW_RUN_KILL_GRACE has passed. */
    struct run r;
    const char *env[] = {"GW_RUN_KILL_GRACE=1", NULL};
    const char *args[] = {"-n", "3", "sh", "-c",
                          "if [ \"$GW_RANK\" = 2 ]; then sleep 0.3; exit 5; fi; "
                          "trap '' TERM; exec sleep 30",
                          NULL};
    run_gwrun(&r, env, args);
    ck_assert_msg(r.code == 5, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(r.elapsed < 15.0, "took %.1f s", r.elapsed);
    ck_assert_msg(strstr(r.err, "SIGKILL"), "stderr does not mention SIGKILL:\n%s", r.err);
    run_free(&r);
}
END_TEST

START_TEST(test_rank_killed_by_signal)
{
    struct run r;
    const char *args[] = {"-n", "2", "sh", "-c",
                          "if [ \"$GW_RANK\" = 0 ]; then kill -9 $$; fi; sleep 30", NULL};
    run_gwrun(&r, NULL, args);
    ck_assert_msg(WIFEXITED(r.status) && r.code == 137, "exit code %d, stderr:\n%s", r.code,
                  r.err);
    ck_assert_msg(r.elapsed < 20.0, "took %.1f s", r.elapsed);
    ck_assert_msg(strstr(r.err, "rank 0 (pid") && strstr(r.err, "signal 9"),
                  "stderr does not name rank 0 and signal 9:\n%s", r.err);
    run_free(&r);
}
END_TEST

/* ---- 5: SIGTERM is forwarded and nothing is left behind ---- */

static pid_t read_pid_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    long pid = 0;
    char nl = 0;
    /* Only a complete line counts: the rank may still be writing it. */
    if (fscanf(f, "%ld%c", &pid, &nl) != 2 || nl != '\n')
        pid = 0;
    fclose(f);
    return (pid_t)pid;
}

START_TEST(test_sigterm_forwarded)
{
    char dir[] = "/tmp/test_gwrun_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char dir_env[128];
    snprintf(dir_env, sizeof dir_env, "GWT_DIR=%s", dir);
    /* A long grace, so the ranks can only stop through the forwarded SIGTERM. */
    const char *env[] = {dir_env, "GW_RUN_KILL_GRACE=30", NULL};
    const char *args[] = {"-n", "2", "sh", "-c",
                          "echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; "
                          "trap ': > \"$GWT_DIR/got.$GW_RANK\"; exit 3' TERM; "
                          "while :; do sleep 0.1; done",
                          NULL};
    struct run r;
    run_start(&r, env, args);

    pid_t pids[2] = {0, 0};
    for (int tries = 0; tries < 1500 && (!pids[0] || !pids[1]); tries++) {
        for (int i = 0; i < 2; i++) {
            char path[200];
            snprintf(path, sizeof path, "%s/pid.%d", dir, i);
            if (!pids[i])
                pids[i] = read_pid_file(path);
        }
        sleep_s(0.01);
    }
    double since_start = seconds_since(&r.t0);
    if (since_start < 1.0)
        sleep_s(1.0 - since_start);
    ck_assert_int_eq(kill(r.pid, SIGTERM), 0);
    struct timespec t_kill;
    clock_gettime(CLOCK_MONOTONIC, &t_kill);
    run_wait(&r, RUN_TIMEOUT_S);
    double after_kill = seconds_since(&t_kill);

    ck_assert_msg(pids[0] > 0 && pids[1] > 0, "the ranks did not start; stderr:\n%s", r.err);
    ck_assert_msg(!r.timed_out, "gw-run ignored SIGTERM; stderr:\n%s", r.err);
    ck_assert_msg(WIFEXITED(r.status), "gw-run died of signal %d instead of handling it",
                  WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0);
    ck_assert_msg(r.code != 0, "gw-run exited 0 after SIGTERM");
    ck_assert_msg(r.code == 3, "exit code %d, not the ranks' 3; stderr:\n%s", r.code, r.err);
    ck_assert_msg(after_kill < 10.0, "gw-run took %.1f s to stop after SIGTERM", after_kill);
    for (int i = 0; i < 2; i++) {
        errno = 0;
        int rc = kill(pids[i], 0);
        ck_assert_msg(rc == -1 && errno == ESRCH, "rank %d (pid %ld) is still there", i,
                      (long)pids[i]);
    }
    for (int i = 0; i < 2; i++) {
        char path[200];
        snprintf(path, sizeof path, "%s/got.%d", dir, i);
        ck_assert_msg(access(path, F_OK) == 0, "rank %d never saw SIGTERM", i);
        unlink(path);
        snprintf(path, sizeof path, "%s/pid.%d", dir, i);
        unlink(path);
    }
    rmdir(dir);
    run_free(&r);
}
END_TEST

START_TEST(test_teardown_stops_leftovers)
{
    /* Rank 0 is a wrapper script whose real program (a grandchild of gw-run)
     * would survive the wrapper's death; the teardown must stop it too. */
    char dir[] = "/tmp/test_gwrun_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char dir_env[128], path[200];
    snprintf(dir_env, sizeof dir_env, "GWT_DIR=%s", dir);
    snprintf(path, sizeof path, "%s/gc", dir);
    const char *env[] = {dir_env, "GW_RUN_KILL_GRACE=2", NULL};
    const char *args[] = {"-n", "2", "sh", "-c",
                          "if [ \"$GW_RANK\" = 1 ]; then "
                          "  while [ ! -s \"$GWT_DIR/gc\" ]; do sleep 0.05; done; exit 7; "
                          "fi; "
                          "sh -c 'echo $$ > \"$GWT_DIR/gc.tmp\"; mv \"$GWT_DIR/gc.tmp\" "
                          "\"$GWT_DIR/gc\"; exec sleep 30'; true",
                          NULL};
    struct run r;
    run_gwrun(&r, env, args);
    ck_assert_msg(r.code == 7, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(r.elapsed < 15.0, "took %.1f s", r.elapsed);
    pid_t gc = read_pid_file(path);
    ck_assert_msg(gc > 0, "no grandchild pid; stderr:\n%s", r.err);
    errno = 0;
    int rc = kill(gc, 0);
    ck_assert_msg(rc == -1 && errno == ESRCH, "the wrapper's program (pid %ld) is still there",
                  (long)gc);
    unlink(path);
    rmdir(dir);
    run_free(&r);
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
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run r;
        run_gwrun(&r, NULL, cases[i]);
        ck_assert_msg(r.code == 2, "case %zu (%s %s): exit code %d, stderr:\n%s", i, cases[i][0],
                      cases[i][1] ? cases[i][1] : "", r.code, r.err);
        ck_assert_msg(strstr(r.err, "gw-run: ") && strstr(r.err, "usage:"),
                      "case %zu: no message and usage on stderr:\n%s", i, r.err);
        ck_assert_msg(r.out[0] == '\0', "case %zu: unexpected stdout:\n%s", i, r.out);
        run_free(&r);
    }
}
END_TEST

START_TEST(test_multinode_checks)
{
    struct run r;
    const char *no_token[] = {"GW_JOB_TOKEN", NULL};
    const char *a1[] = {"-n", "2", "--nnodes", "2", "--master", "127.0.0.1:1234", "true", NULL};
    run_gwrun(&r, no_token, a1);
    ck_assert_msg(r.code == 2, "exit code %d", r.code);
    ck_assert_msg(strstr(r.err, "GW_JOB_TOKEN"), "stderr does not mention GW_JOB_TOKEN:\n%s",
                  r.err);
    run_free(&r);

    const char *token[] = {"GW_JOB_TOKEN=t", NULL};
    const char *a2[] = {"-n", "2", "--nnodes", "2", "--node-rank", "2",
                        "--master", "127.0.0.1:1234", "true", NULL};
    run_gwrun(&r, token, a2);
    ck_assert_msg(r.code == 2, "exit code %d", r.code);
    ck_assert_msg(strstr(r.err, "node-rank"), "stderr:\n%s", r.err);
    run_free(&r);

    const char *a3[] = {"--help", NULL};
    run_gwrun(&r, NULL, a3);
    ck_assert_int_eq(r.code, 0);
    ck_assert_msg(strstr(r.out, "usage:"), "--help printed:\n%s", r.out);
    run_free(&r);
}
END_TEST

START_TEST(test_program_not_found)
{
    struct run r;
    const char *args[] = {"-n", "2", "gw-no-such-program-xyz", "--flag", NULL};
    run_gwrun(&r, NULL, args);
    ck_assert_msg(r.code != 0, "gw-run exited 0 for a missing program");
    ck_assert_int_eq(r.code, 127);
    ck_assert_msg(strstr(r.err, "gw-no-such-program-xyz"),
                  "stderr does not name the program:\n%s", r.err);
    run_free(&r);
}
END_TEST

/* ---- 8 and beyond: output routing and line integrity ---- */

START_TEST(test_output_routing)
{
    struct run r;
    const char *args[] = {"-n", "2", "sh", "-c",
                          "echo out$GW_RANK; echo err$GW_RANK >&2; printf partial$GW_RANK", NULL};
    run_gwrun(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(count_lines(r.out) == 4, "stdout:\n%s", r.out);
    ck_assert_msg(has_line(r.out, "[0] out0") && has_line(r.out, "[1] out1"), "stdout:\n%s",
                  r.out);
    ck_assert_msg(has_line(r.out, "[0] partial0") && has_line(r.out, "[1] partial1"),
                  "the partial last line is missing:\n%s", r.out);
    ck_assert_msg(has_line(r.err, "[0] err0") && has_line(r.err, "[1] err1"), "stderr:\n%s",
                  r.err);
    ck_assert_msg(!strstr(r.out, "err"), "stderr lines reached stdout:\n%s", r.out);
    ck_assert_msg(!strstr(r.err, "out") && !strstr(r.err, "partial"),
                  "stdout lines reached stderr:\n%s", r.err);
    run_free(&r);
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
    run_gwrun(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    struct many_seen s = {0};
    for_each_line(r.out, check_many_line, &s);
    ck_assert_int_eq(s.count, 8000);
    run_free(&r);
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
    run_gwrun(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    struct long_seen s = {0};
    for_each_line(r.out, check_long_line, &s);
    ck_assert_int_eq(s.xs, 200000);
    ck_assert_int_ge(s.lines, 2); /* split at 64 KiB, but no byte lost */
    ck_assert_msg(has_line(r.out, "[0] after"), "the line after the long one is missing");
    run_free(&r);
}
END_TEST

START_TEST(test_grandchild_holding_output)
{
    /* A rank that leaves a background process holding its stdout must not keep
     * gw-run waiting for that process. */
    struct run r;
    const char *args[] = {"-n", "1", "sh", "-c", "sleep 15 & echo done", NULL};
    run_gwrun(&r, NULL, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(has_line(r.out, "[0] done"), "stdout:\n%s", r.out);
    ck_assert_msg(r.elapsed < 10.0, "gw-run waited %.1f s for a background process", r.elapsed);
    run_free(&r);
}
END_TEST

static Suite *gwrun_suite(void)
{
    Suite *s = suite_create("gw-run");
    TCase *tc = tcase_create("launcher");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_all_ranks_succeed);
    tcase_add_test(tc, test_env_generated);
    tcase_add_test(tc, test_env_passthrough);
    tcase_add_test(tc, test_env_master_and_multinode);
    tcase_add_test(tc, test_failing_rank_exit_code);
    tcase_add_test(tc, test_sigkill_after_grace);
    tcase_add_test(tc, test_rank_killed_by_signal);
    tcase_add_test(tc, test_sigterm_forwarded);
    tcase_add_test(tc, test_teardown_stops_leftovers);
    tcase_add_test(tc, test_bad_flags);
    tcase_add_test(tc, test_multinode_checks);
    tcase_add_test(tc, test_program_not_found);
    tcase_add_test(tc, test_output_routing);
    tcase_add_test(tc, test_lines_never_interleave);
    tcase_add_test(tc, test_long_line_split);
    tcase_add_test(tc, test_grandchild_holding_output);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    const char *bin = getenv("GW_RUN_BIN");
    if (!bin || !*bin || access(bin, X_OK) != 0) {
        fprintf(stderr, "test_gwrun: GW_RUN_BIN must name the built gw-run (got '%s')\n",
                bin ? bin : "");
        return 1;
    }
    SRunner *sr = srunner_create(gwrun_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
