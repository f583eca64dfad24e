/*
 * test_gwrun: Check suite for the gw-run launcher (tools/gw-run.c).
 *
 * What it is: black-box tests that run the built gw-run binary (found through
 * the GW_RUN_BIN environment variable, which meson sets) with small sh
 * scripts as ranks, capture its stdout and stderr in temporary files, and
 * check exit codes, the GW_* environment, output routing and teardown.
 *
 * Multi-node jobs are run here as several gw-runs on this one machine, one
 * per node, with 127.0.0.1 as the master, so that their control channel
 * (joining, failures, lost nodes, signals) is exercised for real.
 *
 * What it is not: a test of the library's bootstrap; the ranks here never
 * talk to each other. Every run has a timeout guard so that a broken gw-run
 * fails a test instead of hanging the suite, and the multi-node tests wait
 * for every gw-run they started before asserting anything, so that a failed
 * check leaves no process behind.
 */
#include <arpa/inet.h>
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
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

/* A port P with P and P + 1 both free on 127.0.0.1: the master port and
 * node 0's launcher port. Released before use, so another process could take
 * it in between; on a test machine that is rare enough. */
static int free_port_pair(void)
{
    for (int tries = 0; tries < 100; tries++) {
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
        ck_assert_int_ge(fd, 0);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &len) == 0)
            port = ntohs(a.sin_port);
        close(fd);
        if (port <= 0 || port >= 65535)
            continue;
        fd = socket(AF_INET, SOCK_STREAM, 0);
        a.sin_port = htons((uint16_t)(port + 1));
        bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            return port;
    }
    ck_abort_msg("no two adjacent free ports on 127.0.0.1");
    return -1;
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

    /* Node 1 of 2 with 2 ranks each holds global ranks 2 and 3. Its node 0
     * runs too: without one, node 1 would wait for it to join. */
    const char *env[] = {"GW_JOB_TOKEN=shared", NULL};
    int port = free_port_pair();
    char master[64], line[128];
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    const char *a0[] = {"-n", "2", "--nnodes", "2", "--master", master, "true", NULL};
    const char *a3[] = {"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
                        "--master", master, "sh", "-c", script, NULL};
    struct run r0;
    run_start(&r0, env, a0);
    run_start(&r, env, a3);
    run_wait(&r, RUN_TIMEOUT_S);
    run_wait(&r0, RUN_TIMEOUT_S);
    ck_assert_msg(r.code == 0 && r0.code == 0, "exit codes %d, %d, stderr:\n%s%s", r0.code,
                  r.code, r0.err, r.err);
    ck_assert_int_eq(count_lines(r.out), 2);
    snprintf(line, sizeof line, "[2] 2 4 0 2 1 2 127.0.0.1 %d", port);
    ck_assert_msg(has_line(r.out, line), "stdout:\n%s", r.out);
    snprintf(line, sizeof line, "[3] 3 4 1 2 1 2 127.0.0.1 %d", port);
    ck_assert_msg(has_line(r.out, line), "stdout:\n%s", r.out);
    run_free(&r);
    run_free(&r0);
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

/* ---- multi-node: one gw-run per node, all on this machine ---- */

/* Every multi-node run ends within seconds unless gw-run is broken; this
 * bound only keeps a broken one from stalling the suite. */
#define NODE_TIMEOUT_S 20.0

/* Starts node `node` of an nnodes-node job with master 127.0.0.1:port. */
static void node_start(struct run *r, const char *const *env, int port, int nnodes, int node,
                       const char *nproc, const char *script)
{
    char nn[16], nr[16], master[64];
    snprintf(nn, sizeof nn, "%d", nnodes);
    snprintf(nr, sizeof nr, "%d", node);
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    const char *args[] = {"-n",     nproc, "--nnodes", nn,     "--node-rank", nr,
                          "--master", master, "sh",       "-c", script,        NULL};
    run_start(r, env, args);
}

/* Waits for every run (each killed after NODE_TIMEOUT_S from its start)
 * before any assertion, so that a failed check leaves no gw-run behind. */
static void nodes_wait(struct run *r, int n)
{
    for (int i = 0; i < n; i++)
        run_wait(&r[i], NODE_TIMEOUT_S);
    for (int i = 0; i < n; i++)
        ck_assert_msg(!r[i].timed_out, "node %d's gw-run did not finish within %.0f s; stderr:\n%s",
                      i, NODE_TIMEOUT_S, r[i].err);
}

static void nodes_free(struct run *r, int n)
{
    for (int i = 0; i < n; i++)
        run_free(&r[i]);
}

/* Whether a running gw-run's stderr file holds needle within timeout_s. */
static bool wait_for_stderr(const struct run *r, const char *needle, double timeout_s)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char buf[16384];
    while (seconds_since(&t0) < timeout_s) {
        FILE *f = fopen(r->err_path, "rb");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = '\0';
            if (strstr(buf, needle))
                return true;
        }
        sleep_s(0.02);
    }
    return false;
}

static const char *hostname(void)
{
    static char h[256];
    if (!h[0] && gethostname(h, sizeof h - 1) != 0)
        snprintf(h, sizeof h, "unknown");
    return h;
}

/* Whether every pid in the files dir/pid.0 .. pid.(n-1) is gone, allowing
 * a moment for the parent-death signal of a SIGKILLed gw-run to land. */
static bool ranks_gone(const char *dir, int n)
{
    for (int tries = 0; tries < 300; tries++) {
        bool any = false;
        for (int i = 0; i < n; i++) {
            char path[200];
            snprintf(path, sizeof path, "%s/pid.%d", dir, i);
            pid_t pid = read_pid_file(path);
            any = any || (pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH));
        }
        if (!any)
            return true;
        sleep_s(0.01);
    }
    return false;
}

static void remove_pid_files(const char *dir, int n)
{
    for (int i = 0; i < n; i++) {
        char path[200];
        snprintf(path, sizeof path, "%s/pid.%d", dir, i);
        unlink(path);
    }
    rmdir(dir);
}

START_TEST(test_multinode_all_succeed)
{
    int port = free_port_pair();
    const char *env[] = {"GW_JOB_TOKEN=mn-ok", NULL};
    const char *script = "echo $GW_RANK $GW_WORLD_SIZE $GW_NODE_RANK $GW_LOCAL_RANK; sleep 0.2";
    struct run r[2];
    node_start(&r[0], env, port, 2, 0, "2", script);
    node_start(&r[1], env, port, 2, 1, "2", script);
    nodes_wait(r, 2);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 0, "node %d: exit code %d, stderr:\n%s", i, r[i].code, r[i].err);
    ck_assert_msg(has_line(r[0].out, "[0] 0 4 0 0") && has_line(r[0].out, "[1] 1 4 0 1") &&
                      count_lines(r[0].out) == 2,
                  "node 0 stdout:\n%s", r[0].out);
    ck_assert_msg(has_line(r[1].out, "[2] 2 4 1 0") && has_line(r[1].out, "[3] 3 4 1 1") &&
                      count_lines(r[1].out) == 2,
                  "node 1 stdout:\n%s", r[1].out);
    nodes_free(r, 2);
}
END_TEST

START_TEST(test_multinode_rank_failure)
{
    /* Rank 3 (node 1) fails once every node had time to join; the others
     * would sleep 30 s, and a long grace leaves only the teardown's SIGTERM
     * to end them quickly. */
    int port = free_port_pair();
    const char *env[] = {"GW_JOB_TOKEN=mn-fail", "GW_RUN_KILL_GRACE=30", NULL};
    const char *script = "if [ \"$GW_RANK\" = 3 ]; then sleep 1; exit 5; fi; exec sleep 30";
    struct run r[3];
    for (int i = 0; i < 3; i++)
        node_start(&r[i], env, port, 3, i, "2", script);
    nodes_wait(r, 3);
    char want[800];
    snprintf(want, sizeof want, "gw-run: rank 3 on node 1 (host %s) exited with code 5",
             hostname());
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(r[i].code == 5, "node %d: exit code %d, stderr:\n%s", i, r[i].code, r[i].err);
        ck_assert_msg(r[i].elapsed < 10.0, "node %d took %.1f s", i, r[i].elapsed);
    }
    ck_assert_msg(has_line(r[0].err, want), "node 0 stderr lacks '%s':\n%s", want, r[0].err);
    ck_assert_msg(has_line(r[2].err, want), "node 2 stderr lacks '%s':\n%s", want, r[2].err);
    ck_assert_msg(strstr(r[1].err, "rank 3 (pid"), "node 1 stderr:\n%s", r[1].err);
    nodes_free(r, 3);

    /* A rank killed by a signal: 128 + signal everywhere, and the signal named. */
    port = free_port_pair();
    script = "if [ \"$GW_RANK\" = 1 ]; then sleep 1; kill -9 $$; fi; exec sleep 30";
    node_start(&r[0], env, port, 2, 0, "1", script);
    node_start(&r[1], env, port, 2, 1, "1", script);
    nodes_wait(r, 2);
    snprintf(want, sizeof want,
             "gw-run: rank 1 on node 1 (host %s) was killed by signal 9 (SIGKILL)",
             hostname());
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 137, "node %d: exit code %d, stderr:\n%s", i, r[i].code,
                      r[i].err);
    ck_assert_msg(has_line(r[0].err, want), "node 0 stderr lacks '%s':\n%s", want, r[0].err);
    nodes_free(r, 2);
}
END_TEST

START_TEST(test_multinode_node_missing)
{
    /* Node 2 of 3 never starts: nodes 0 and 1 fail at the join deadline. */
    int port = free_port_pair();
    const char *env[] = {"GW_JOB_TOKEN=mn-missing", "GW_RUN_JOIN_TIMEOUT=2", NULL};
    const char *script = "exec sleep 30";
    struct run r[2];
    node_start(&r[0], env, port, 3, 0, "1", script);
    node_start(&r[1], env, port, 3, 1, "1", script);
    nodes_wait(r, 2);
    char want[200];
    snprintf(want, sizeof want,
             "gw-run: node(s) 2 did not join within 2 s (launcher port 127.0.0.1:%d)", port + 1);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(r[i].code != 0, "node %d exited 0; stderr:\n%s", i, r[i].err);
        ck_assert_msg(r[i].elapsed < 10.0, "node %d took %.1f s", i, r[i].elapsed);
        ck_assert_msg(has_line(r[i].err, want), "node %d stderr lacks '%s':\n%s", i, want,
                      r[i].err);
    }
    nodes_free(r, 2);

    /* Node 0 never starts: node 1 gives up at its deadline. */
    port = free_port_pair();
    node_start(&r[1], env, port, 2, 1, "1", script);
    nodes_wait(&r[1], 1);
    snprintf(want, sizeof want, "gw-run: node 1: no answer from node 0 at 127.0.0.1:%d after 2 s",
             port + 1);
    ck_assert_msg(r[1].code != 0 && r[1].elapsed < 10.0, "exit code %d after %.1f s", r[1].code,
                  r[1].elapsed);
    ck_assert_msg(has_line(r[1].err, want), "stderr lacks '%s':\n%s", want, r[1].err);
    run_free(&r[1]);
}
END_TEST

START_TEST(test_multinode_wrong_token)
{
    int port = free_port_pair();
    const char *env0[] = {"GW_JOB_TOKEN=mn-right", "GW_RUN_JOIN_TIMEOUT=2", NULL};
    const char *env1[] = {"GW_JOB_TOKEN=mn-wrong", "GW_RUN_JOIN_TIMEOUT=2", NULL};
    struct run r[2];
    node_start(&r[0], env0, port, 2, 0, "1", "exec sleep 30");
    node_start(&r[1], env1, port, 2, 1, "1", "exec sleep 30");
    nodes_wait(r, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(r[i].code != 0, "node %d exited 0; stderr:\n%s", i, r[i].err);
        ck_assert_msg(r[i].elapsed < 10.0, "node %d took %.1f s", i, r[i].elapsed);
    }
    ck_assert_msg(strstr(r[0].err, "refused a launcher connection") &&
                      strstr(r[0].err, "wrong job token") &&
                      strstr(r[0].err, "node(s) 1 did not join"),
                  "node 0 stderr:\n%s", r[0].err);
    ck_assert_msg(strstr(r[1].err, "refused this node") && strstr(r[1].err, "wrong job token"),
                  "node 1 stderr:\n%s", r[1].err);
    nodes_free(r, 2);
}
END_TEST

START_TEST(test_multinode_mismatch)
{
    const char *env[] = {"GW_JOB_TOKEN=mn-mismatch", "GW_RUN_JOIN_TIMEOUT=5", NULL};
    char want[800];
    struct run r[2];
    /* -n differs */
    int port = free_port_pair();
    node_start(&r[0], env, port, 2, 0, "2", "exec sleep 30");
    node_start(&r[1], env, port, 2, 1, "1", "exec sleep 30");
    nodes_wait(r, 2);
    snprintf(want, sizeof want,
             "node 1 (host %s) was started with -n 1 but node 0 (host %s) with -n 2",
             hostname(), hostname());
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(r[i].code != 0, "node %d exited 0; stderr:\n%s", i, r[i].err);
        ck_assert_msg(r[i].elapsed < 4.0, "node %d took %.1f s: not failed at once", i,
                      r[i].elapsed);
        ck_assert_msg(strstr(r[i].err, want), "node %d stderr lacks '%s':\n%s", i, want, r[i].err);
    }
    nodes_free(r, 2);

    /* --nnodes differs: node 1 thinks there are 3 nodes */
    port = free_port_pair();
    node_start(&r[0], env, port, 2, 0, "1", "exec sleep 30");
    node_start(&r[1], env, port, 3, 1, "1", "exec sleep 30");
    nodes_wait(r, 2);
    snprintf(want, sizeof want, "node 1 (host %s) was started with --nnodes 3 but node 0",
             hostname());
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code != 0, "node %d exited 0; stderr:\n%s", i, r[i].err);
    ck_assert_msg(strstr(r[0].err, want), "node 0 stderr lacks '%s':\n%s", want, r[0].err);
    nodes_free(r, 2);

    /* --node-rank 1 twice: the second one is refused, the job runs on. */
    struct run d[3];
    port = free_port_pair();
    node_start(&d[0], env, port, 2, 0, "1", "sleep 1");
    node_start(&d[1], env, port, 2, 1, "1", "sleep 1");
    node_start(&d[2], env, port, 2, 1, "1", "sleep 1");
    nodes_wait(d, 3);
    ck_assert_msg(d[0].code == 0, "node 0: exit code %d, stderr:\n%s", d[0].code, d[0].err);
    ck_assert_msg((d[1].code == 0) != (d[2].code == 0),
                  "not exactly one node 1 refused: exit codes %d, %d", d[1].code, d[2].code);
    ck_assert_msg(strstr(d[0].err, "node 1 already joined"), "node 0 stderr:\n%s", d[0].err);
    ck_assert_msg(strstr(d[d[1].code ? 1 : 2].err, "refused this node"), "stderr:\n%s",
                  d[d[1].code ? 1 : 2].err);
    nodes_free(d, 3);
}
END_TEST

/* Starts a 2-node job whose ranks write their pids to dir/pid.RANK and wait,
 * and returns once node 0 has seen node 1 join (false if it never did). */
static bool start_joined_pair(struct run *r, char *dir, char *dir_env, size_t dir_env_size,
                              const char *token)
{
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(dir_env, dir_env_size, "GWT_DIR=%s", dir);
    const char *env[] = {token, dir_env, "GW_DEBUG=INFO", "GW_RUN_KILL_GRACE=30", NULL};
    const char *script = "echo $$ > \"$GWT_DIR/pid.$GW_RANK\"; exec sleep 30";
    int port = free_port_pair();
    node_start(&r[0], env, port, 2, 0, "1", script);
    node_start(&r[1], env, port, 2, 1, "1", script);
    return wait_for_stderr(&r[0], "node 1 (host", 10.0) &&
           wait_for_stderr(&r[1], "node 1 joined node 0", 10.0);
}

START_TEST(test_multinode_lost_node)
{
    char dir[] = "/tmp/test_gwrun_XXXXXX", dir_env[128];
    struct run r[2];
    bool joined = start_joined_pair(r, dir, dir_env, sizeof dir_env, "GW_JOB_TOKEN=mn-lost");
    if (joined)
        kill(r[1].pid, SIGKILL);
    struct timespec t_kill;
    clock_gettime(CLOCK_MONOTONIC, &t_kill);
    nodes_wait(r, 2); /* node 1 without the kill: stopped by its timeout */
    double after = seconds_since(&t_kill);
    bool gone = ranks_gone(dir, 2);
    remove_pid_files(dir, 2); /* before any assertion can skip it */
    ck_assert_msg(joined, "node 1 never joined; stderr:\n%s\n%s", r[0].err, r[1].err);
    ck_assert_msg(r[0].code != 0, "node 0 exited 0; stderr:\n%s", r[0].err);
    ck_assert_msg(after < 8.0, "node 0 took %.1f s to notice", after);
    char want[800];
    snprintf(want, sizeof want,
             "gw-run: lost node 1 (host %s): its launcher exited or the network failed",
             hostname());
    ck_assert_msg(has_line(r[0].err, want), "node 0 stderr lacks '%s':\n%s", want, r[0].err);
    ck_assert_msg(gone, "a rank outlived the job");
    nodes_free(r, 2);
}
END_TEST

START_TEST(test_multinode_sigterm_node0)
{
    char dir[] = "/tmp/test_gwrun_XXXXXX", dir_env[128];
    struct run r[2];
    bool joined = start_joined_pair(r, dir, dir_env, sizeof dir_env, "GW_JOB_TOKEN=mn-term");
    if (joined)
        kill(r[0].pid, SIGTERM);
    struct timespec t_kill;
    clock_gettime(CLOCK_MONOTONIC, &t_kill);
    nodes_wait(r, 2);
    double after = seconds_since(&t_kill);
    bool gone = ranks_gone(dir, 2);
    remove_pid_files(dir, 2); /* before any assertion can skip it */
    ck_assert_msg(joined, "node 1 never joined; stderr:\n%s\n%s", r[0].err, r[1].err);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 128 + SIGTERM, "node %d: exit code %d, stderr:\n%s", i,
                      r[i].code, r[i].err);
    ck_assert_msg(after < 8.0, "the job took %.1f s to stop", after);
    char want[800];
    snprintf(want, sizeof want, "gw-run: node 0 (host %s) received SIGTERM; stopping this node too",
             hostname());
    ck_assert_msg(has_line(r[1].err, want), "node 1 stderr lacks '%s':\n%s", want, r[1].err);
    ck_assert_msg(gone, "a rank outlived the job");
    nodes_free(r, 2);
}
END_TEST

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
    int port = free_port_pair();
    const char *env[] = {"GW_JOB_TOKEN=mn-garbage", "GW_DEBUG=INFO", NULL};
    struct run r[2];
    node_start(&r[0], env, port, 2, 0, "1", "sleep 1.5");
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)(port + 1));
    int sent = 0;
    for (int tries = 0; tries < 200 && sent < 3; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            /* Over the 4 KiB limit; no such frame type; a hello cut short. */
            if (sent == 0)
                send_raw(fd, 100000, "xxxx", 4);
            else if (sent == 1)
                send_raw(fd, 5, "\x63" "abcd", 5);
            else
                send_raw(fd, 3, "\x01" "ab", 3);
            sent++;
            sleep_s(0.1);
        } else {
            sleep_s(0.02);
        }
        if (fd >= 0)
            close(fd);
    }
    node_start(&r[1], env, port, 2, 1, "1", "true");
    nodes_wait(r, 2);
    ck_assert_int_eq(sent, 3);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].code == 0, "node %d: exit code %d, stderr:\n%s", i, r[i].code, r[i].err);
    ck_assert_msg(strstr(r[0].err, "frame length 100000") && strstr(r[0].err, "malformed frame"),
                  "node 0 did not log the bad frames:\n%s", r[0].err);
    nodes_free(r, 2);
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

    TCase *mn = tcase_create("multi-node");
    tcase_set_timeout(mn, 60);
    tcase_add_test(mn, test_multinode_all_succeed);
    tcase_add_test(mn, test_multinode_rank_failure);
    tcase_add_test(mn, test_multinode_node_missing);
    tcase_add_test(mn, test_multinode_wrong_token);
    tcase_add_test(mn, test_multinode_mismatch);
    tcase_add_test(mn, test_multinode_lost_node);
    tcase_add_test(mn, test_multinode_sigterm_node0);
    tcase_add_test(mn, test_multinode_garbage_frames);
    suite_add_tcase(s, mn);
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
