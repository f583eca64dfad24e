/*
 * gwrun_helpers: shared helpers for the gw-run Check suites; see
 * gwrun_helpers.h.
 *
 * What it is: the runner of the built gw-run (fork, exec with the given
 * environment, output captured in /tmp files, killed past its timeout), line
 * helpers over the captured output, a free loopback port pair, the pid-file
 * reader and the suites' shared main().
 *
 * What it is not: any test case; nothing here knows what a test expects.
 */
#include "gwrun_helpers.h"
#include "ports.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/ioctl.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

double gwrun_seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

void gwrun_sleep(double s)
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
void gwrun_start(struct run *r, const char *const *env, const char *const *args)
{
    gwrun_start_out(r, -1, env, args);
}

static void start_impl(struct run *r, const char *bin, int out_fd, const char *ctty, const char *const *env,
                       const char *const *args)
{
    memset(r, 0, sizeof *r);
    snprintf(r->out_path, sizeof r->out_path, "/tmp/test_gwrun_out_XXXXXX");
    snprintf(r->err_path, sizeof r->err_path, "/tmp/test_gwrun_err_XXXXXX");
    snprintf(r->tmp_path, sizeof r->tmp_path, "/tmp/test_gwrun_tmp_XXXXXX");
    int ofd = mkstemp(r->out_path);
    int efd = mkstemp(r->err_path);
    ck_assert_msg(ofd >= 0 && efd >= 0, "mkstemp failed: %s", strerror(errno));
    ck_assert_msg(mkdtemp(r->tmp_path) != NULL, "mkdtemp failed: %s", strerror(errno));

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
        if (ctty) { /* a session of its own, with the terminal ctty */
            int t = -1;
            if (setsid() < 0 || (t = open(ctty, O_RDWR)) < 0 || ioctl(t, TIOCSCTTY, 0) != 0) {
                dprintf(2, "test_gwrun: cannot make %s the controlling terminal: %s\n", ctty, strerror(errno));
                _exit(126);
            }
            close(t);
        }
        /* gw-run keeps a signal its caller ignored ignored; this process may
         * have inherited ignores (a shell's background job ignores SIGINT
         * and SIGQUIT; meson's runner resets only SIGINT, which it handles):
         * the signal tests want gw-run's own handling. */
        static const int sigs[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
        dup2(out_fd >= 0 ? out_fd : ofd, 1);
        dup2(efd, 2);
        close(ofd);
        close(efd);
        setenv("TMPDIR", r->tmp_path, 1);
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

void gwrun_start_out(struct run *r, int out_fd, const char *const *env, const char *const *args)
{
    start_impl(r, gwrun_bin(), out_fd, NULL, env, args);
}

void gwrun_start_prog(struct run *r, const char *prog, const char *const *env, const char *const *args)
{
    start_impl(r, prog, -1, NULL, env, args);
}

void gwrun_start_ctty(struct run *r, const char *ctty, const char *const *env, const char *const *args)
{
    start_impl(r, gwrun_bin(), -1, ctty, env, args);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* Waits for gw-run, killing it after timeout_s, then collects its output. */
void gwrun_wait(struct run *r, double timeout_s)
{
    struct rusage ru = {0};
    for (;;) {
        pid_t p = wait4(r->pid, &r->status, WNOHANG, &ru);
        if (p == r->pid)
            break;
        ck_assert_msg(p == 0 || errno == EINTR, "waitpid failed: %s", strerror(errno));
        if (gwrun_seconds_since(&r->t0) > timeout_s) {
            kill(r->pid, SIGKILL);
            wait4(r->pid, &r->status, 0, &ru);
            r->timed_out = true;
            break;
        }
        gwrun_sleep(0.01);
    }
    r->elapsed = gwrun_seconds_since(&r->t0);
    r->cpu_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
               ru.ru_stime.tv_usec / 1e6;
    r->code = WIFEXITED(r->status) ? WEXITSTATUS(r->status) : 128 + WTERMSIG(r->status);
    r->out = slurp(r->out_path);
    r->err = slurp(r->err_path);
    unlink(r->out_path);
    unlink(r->err_path);
    nftw(r->tmp_path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void gwrun_run(struct run *r, const char *const *env, const char *const *args)
{
    gwrun_start(r, env, args);
    gwrun_wait(r, GWRUN_TIMEOUT_S);
    ck_assert_msg(!r->timed_out, "gw-run did not finish within %.0f s; stderr:\n%s",
                  GWRUN_TIMEOUT_S, r->err);
}

void gwrun_free(struct run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

void gwrun_node_start(struct run *r, const char *const *env, int port, int nnodes, int node, const char *nproc,
                      const char *const *extra, const char *script)
{
    char nn[16], nr[16], master[64];
    snprintf(nn, sizeof nn, "%d", nnodes);
    snprintf(nr, sizeof nr, "%d", node);
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    const char *args[32] = {"-n", nproc, "--nnodes", nn, "--node-rank", nr, "--master", master};
    int n = 8;
    for (int i = 0; extra && extra[i]; i++) {
        ck_assert_msg(n < 28, "too many extra gw-run options");
        args[n++] = extra[i];
    }
    args[n++] = "sh", args[n++] = "-c", args[n++] = script, args[n] = NULL;
    gwrun_start(r, env, args);
}

void gwrun_nodes_wait(struct run *r, int n, double timeout_s)
{
    for (int i = 0; i < n; i++)
        gwrun_wait(&r[i], timeout_s);
    for (int i = 0; i < n; i++)
        ck_assert_msg(!r[i].timed_out, "node %d's gw-run did not finish within %.0f s; stderr:\n%s", i, timeout_s,
                      r[i].err);
}

void gwrun_nodes_free(struct run *r, int n)
{
    for (int i = 0; i < n; i++)
        gwrun_free(&r[i]);
}

/* Whether a running gw-run's stderr file holds needle within timeout_s. */
bool gwrun_stderr_has(const struct run *r, const char *needle, double timeout_s)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char buf[16384];
    while (gwrun_seconds_since(&t0) < timeout_s) {
        FILE *f = fopen(r->err_path, "rb");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = '\0';
            if (strstr(buf, needle))
                return true;
        }
        gwrun_sleep(0.02);
    }
    return false;
}

/* Whether text holds exactly this line (without its newline). */
bool gwrun_has_line(const char *text, const char *line)
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

int gwrun_count_lines(const char *text)
{
    int n = 0;
    for (const char *p = text; *p; p++)
        if (*p == '\n')
            n++;
    return n;
}

/* Calls fn on each line of text, copied into a NUL-terminated buffer. */
void gwrun_for_each_line(const char *text, void (*fn)(const char *line, void *arg), void *arg)
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
 * node 0's launcher port, from below the ephemeral range (ports.h: a pair
 * bind(0) gave could be taken by another test's connect() before gw-run
 * listened on it). Released before use; nothing else binds there. */
int gwrun_free_port_pair(void)
{
    const int port = test_free_ports(2);
    if (port < 0)
        ck_abort_msg("no two adjacent free ports on 127.0.0.1 below the ephemeral range");
    return port;
}

pid_t gwrun_read_pid_file(const char *path)
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

void gwt_dir(char *env_dir, size_t cap)
{
    char d[] = "/tmp/gwt-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(d));
    snprintf(env_dir, cap, "GWT_DIR=%s", d);
}

void gwt_dir_remove(const char *env_dir)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", env_dir + strlen("GWT_DIR="));
    ck_assert_int_eq(system(cmd), 0);
}

pid_t gwt_pid(const char *env_dir, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", env_dir + strlen("GWT_DIR="), name);
    return gwrun_read_pid_file(path);
}

void gwt_assert_gone(const char *env_dir, const char *name, const char *what)
{
    const pid_t pid = gwt_pid(env_dir, name);
    ck_assert_msg(pid > 0, "%s: no pid in %s/%s", what, env_dir + strlen("GWT_DIR="), name);
    errno = 0;
    const int rc = kill(pid, 0);
    if (rc == 0)
        kill(pid, SIGKILL);
    ck_assert_msg(rc == -1 && errno == ESRCH, "%s (pid %ld) is still there", what, (long)pid);
}

int gwrun_main(const char *prog, Suite *(*make_suite)(void))
{
    const char *bin = getenv("GW_RUN_BIN");
    if (!bin || !*bin || access(bin, X_OK) != 0) {
        fprintf(stderr, "%s: GW_RUN_BIN must name the built gw-run (got '%s')\n", prog,
                bin ? bin : "");
        return 1;
    }
    SRunner *sr = srunner_create(make_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr), ran = srunner_ntests_run(sr);
    srunner_free(sr);
    /* nothing run (a CK_RUN_CASE naming no case) is no pass, as run_suite says */
    if (ran == 0)
        fprintf(stderr, "%s: no test ran (CK_RUN_CASE='%s' names no case?)\n", prog,
                getenv("CK_RUN_CASE") ? getenv("CK_RUN_CASE") : "");
    return failed == 0 && ran > 0 ? 0 : 1;
}

bool gwrun_is_zombie(pid_t pid)
{
    char path[64], st[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(st, 1, sizeof st - 1, f);
    fclose(f);
    st[n] = '\0';
    const char *p = strrchr(st, ')');
    return p && p[1] == ' ' && p[2] == 'Z';
}
