/*
 * gw-run: the gradwire launcher, the local half of what torchrun does.
 *
 * What it is: a small program that starts N ranks of one PROGRAM on this
 * machine with fork + execvp, gives each rank the GW_* environment that the
 * library's bootstrap reads (rank, world size, master address, job token),
 * prefixes every output line with the rank that wrote it, forwards SIGINT and
 * SIGTERM, and tears the whole job down as soon as one rank fails, so a crash
 * on one rank never leaves the others hanging in a collective.
 *
 * What it is not: it does no rendezvous, no networking and no elastic
 * restarts, and it does not reach other machines. For a multi-node job you run
 * one gw-run per node (with ssh, Slurm or by hand) giving each the same
 * --master and GW_JOB_TOKEN; the ranks themselves meet at the master address.
 * It links nothing from gradwire on purpose, so it builds and works even when
 * the library does not.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>

enum {
    MAX_LOCAL_RANKS = 4096,
    MAX_NNODES = 65536, /* keeps N * nnodes far below INT_MAX */
    MAX_LINE = 64 * 1024, /* longer lines are split into pieces of this size */
    DRAIN_GRACE_MS = 2000,
    EXIT_USAGE = 2,
    EXIT_NOT_FOUND = 127,
};

#define DEFAULT_KILL_GRACE_S 5.0

static const char usage_text[] =
    "usage: gw-run -n N [--nnodes M --node-rank R --master HOST:PORT] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Starts N ranks of PROGRAM on this machine with the GW_* environment set,\n"
    "prefixes their output lines with [rank], and stops the job when a rank fails.\n"
    "\n"
    "options:\n"
    "  -n, --nproc-per-node N  ranks to start on this node (1..4096)\n"
    "  --nnodes M              nodes in the job (default 1); run one gw-run per node\n"
    "  --node-rank R           index of this node, 0..M-1 (default 0)\n"
    "  --master HOST:PORT      rendezvous address, [v6addr]:PORT for IPv6; required\n"
    "                          with --nnodes > 1, else 127.0.0.1 and a free port\n"
    "  -h, --help              show this help\n"
    "\n"
    "environment:\n"
    "  GW_JOB_TOKEN       shared secret of the job; generated if unset, but must be\n"
    "                     set (to the same value on every node) with --nnodes > 1\n"
    "  OMP_NUM_THREADS    passed through if set, else online cores / N (at least 1)\n"
    "  GW_RUN_KILL_GRACE  seconds between SIGTERM and SIGKILL at teardown (default 5)\n";

/* One of a rank's two output pipes and the unfinished line read from it. */
struct stream {
    int fd;      /* read end, -1 once it reached EOF and was closed */
    int out_fd;  /* where its lines go: 1 or 2 */
    char *partial; /* bytes after the last newline; [len], capacity cap */
    size_t len, cap;
};

struct rank {
    pid_t pid;          /* 0 when never started or already reaped */
    int global;         /* global rank, printed as the line prefix */
    bool stopped_by_us; /* gw-run stopped it: its exit is not a failure */
    struct stream s[2]; /* [0] stdout, [1] stderr */
};

static struct rank *ranks;
static int nranks;      /* ranks spawned (N unless a fork failed) */
static int alive;       /* spawned and not yet reaped */
static int open_streams;

static bool have_failure;
static int exit_code;     /* of the first failure that gw-run did not cause */
static int got_signal;    /* first SIGINT/SIGTERM received, 0 if none */
static double kill_grace_s = DEFAULT_KILL_GRACE_S;
static int64_t kill_deadline_ms; /* SIGKILL the remaining ranks then; 0: none */
static bool escalated;           /* the grace is over: stragglers get SIGKILL at once */

/* Rank pids sorted, to tell ranks from strays among our children quickly. */
struct pid_index {
    pid_t pid;
    int rank;
};
static struct pid_index *pid_index;

/* Strays: processes a rank started that outlived it. gw-run is a child
 * subreaper, so they are re-parented to it instead of to init, which lets a
 * teardown stop them too (a rank that is a wrapper script would otherwise
 * leave the real program running, holding GPUs and blocked in a collective)
 * and lets gw-run reap them where init does not. */
static int strays;          /* strays seen by the last scan while stopping */
static pid_t *stray_termed; /* strays already sent SIGTERM, so a trap runs once */
static size_t nstray_termed, stray_termed_cap;

/* The signal handler only sets a flag and writes a byte into this pipe to
 * wake poll(), so all real work happens in the loop, where anything is safe. */
static int sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t pending_chld, pending_int, pending_term;

/* What the caller left us with, restored in each child before exec so that
 * the ranks start exactly as they would without the launcher. */
static sigset_t orig_mask;
static bool int_ignored, term_ignored, pipe_ignored;
static struct rlimit orig_nofile;

static char outbuf[2 * MAX_LINE + 64];
static size_t outlen;
static bool out_broken[3];

static void usage_error(const char *fmt, const char *arg)
{
    fputs("gw-run: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\n\n", stderr);
    fputs(usage_text, stderr);
    exit(EXIT_USAGE);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "unknown";
    }
}

/* Strict decimal parse: the whole string must be a number within [lo, hi]. */
static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* HOST:PORT or [v6addr]:PORT. A bare IPv6 address is refused because its
 * last colon cannot be told apart from the port separator. */
static bool parse_master(const char *s, char *host, size_t hostsz, long *port)
{
    const char *h, *colon;
    size_t hl;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return false;
        h = s + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || memchr(s, ':', (size_t)(colon - s)))
            return false;
        h = s;
        hl = (size_t)(colon - s);
    }
    if (hl == 0 || hl >= hostsz || !parse_long(colon + 1, 1, 65535, port))
        return false;
    memcpy(host, h, hl);
    host[hl] = '\0';
    return true;
}

/* Binding port 0 lets the kernel pick a free port. It is released again before
 * rank 0 binds it, so another process could take it in between; torchrun
 * accepts the same small race, and a clash shows up as a clear bind error. */
static int find_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static bool make_token(char out[33])
{
    unsigned char raw[16];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return true;
}

/* Writes everything, waiting when a non-blocking stdout is full. After a hard
 * error (a closed pipe, a full disk) the destination is dropped but the ranks
 * keep running: losing log lines must not kill a training job. */
static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0 && !out_broken[fd]) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, 100);
        } else {
            out_broken[fd] = true;
        }
    }
}

static void flush_out(int fd)
{
    write_all(fd, outbuf, outlen);
    outlen = 0;
}

/* Queues "[R] " + a + b + "\n". The line is built in one buffer so that it
 * reaches our stdout in one write and never interleaves with another rank's. */
static void emit_line(const struct rank *r, const struct stream *s, const char *a, size_t alen,
                      const char *b, size_t blen)
{
    char prefix[24];
    int pl = snprintf(prefix, sizeof prefix, "[%d] ", r->global);
    size_t need = (size_t)pl + alen + blen + 1;
    if (outlen + need > sizeof outbuf)
        flush_out(s->out_fd);
    memcpy(outbuf + outlen, prefix, (size_t)pl);
    outlen += (size_t)pl;
    if (alen)
        memcpy(outbuf + outlen, a, alen);
    outlen += alen;
    if (blen)
        memcpy(outbuf + outlen, b, blen);
    outlen += blen;
    outbuf[outlen++] = '\n';
}

/* Splits freshly read bytes into lines; what follows the last newline is kept
 * in s->partial until its newline (or EOF) arrives. */
static void consume(const struct rank *r, struct stream *s, const char *p, size_t n)
{
    const char *end = p + n, *nl;
    while ((nl = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        emit_line(r, s, s->partial, s->len, p, (size_t)(nl - p));
        s->len = 0;
        p = nl + 1;
    }
    while (p < end) {
        size_t take = (size_t)(end - p);
        if (s->len + take >= MAX_LINE) {
            take = MAX_LINE - s->len;
            emit_line(r, s, s->partial, s->len, p, take);
            s->len = 0;
            p += take;
            continue;
        }
        if (s->len + take > s->cap) {
            /* Grown on demand: 4096 ranks x 2 streams x 64 KiB up front
             * would be half a gigabyte for buffers that are mostly empty. */
            size_t cap = s->cap ? s->cap : 256;
            while (cap < s->len + take)
                cap *= 2;
            char *np = realloc(s->partial, cap);
            if (!np) {
                emit_line(r, s, s->partial, s->len, p, take);
                s->len = 0;
                break;
            }
            s->partial = np;
            s->cap = cap;
        }
        memcpy(s->partial + s->len, p, take);
        s->len += take;
        p += take;
    }
}

static void close_stream(const struct rank *r, struct stream *s)
{
    if (s->fd < 0)
        return;
    if (s->len > 0)
        emit_line(r, s, s->partial, s->len, NULL, 0);
    flush_out(s->out_fd);
    close(s->fd);
    s->fd = -1;
    free(s->partial);
    s->partial = NULL;
    s->len = s->cap = 0;
    open_streams--;
}

/* One read from a rank's pipe. Returns false when nothing more is available
 * right now (or the stream ended). */
static bool pump(const struct rank *r, struct stream *s)
{
    static char buf[MAX_LINE];
    if (s->fd < 0)
        return false;
    ssize_t n = read(s->fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return false;
    if (n <= 0) {
        close_stream(r, s);
        return false;
    }
    consume(r, s, buf, (size_t)n);
    flush_out(s->out_fd);
    return true;
}

static void signal_ranks(int sig, bool mark_stopped)
{
    for (int i = 0; i < nranks; i++) {
        if (ranks[i].pid > 0) {
            kill(ranks[i].pid, sig);
            if (mark_stopped)
                ranks[i].stopped_by_us = true;
        }
    }
}

/* After the first failure the others would only block in a collective waiting
 * for the dead rank, so they are asked to stop, then killed after the grace. */
static void teardown(void)
{
    if (alive == 0)
        return;
    fprintf(stderr, "gw-run: stopping the %d other running rank%s (SIGTERM, SIGKILL after %g s)\n",
            alive, alive == 1 ? "" : "s", kill_grace_s);
    signal_ranks(SIGTERM, true);
    kill_deadline_ms = now_ms() + (int64_t)(kill_grace_s * 1000.0);
}

static void forward_signal(int sig)
{
    if (!got_signal)
        got_signal = sig;
    if (alive == 0)
        return;
    fprintf(stderr, "gw-run: received %s, forwarding it to %d rank%s\n", signal_name(sig), alive,
            alive == 1 ? "" : "s");
    signal_ranks(sig, false);
    /* A rank that ignores the signal must not keep the job alive forever. */
    if (!kill_deadline_ms)
        kill_deadline_ms = now_ms() + (int64_t)(kill_grace_s * 1000.0);
}

static void rank_exited(struct rank *r, pid_t pid, int status)
{
    int code;
    if (WIFEXITED(status))
        code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
        code = 128 + WTERMSIG(status);
    else
        return;
    if (code == 0 || r->stopped_by_us)
        return;
    /* Print the rank's last words (often the reason it failed) before our
     * verdict; a grandchild that still holds the pipe cannot stall this
     * because the pipes are non-blocking. */
    for (int k = 0; k < 2; k++)
        while (pump(r, &r->s[k])) {
        }
    if (WIFEXITED(status))
        fprintf(stderr, "gw-run: rank %d (pid %ld) exited with code %d\n", r->global, (long)pid,
                code);
    else
        fprintf(stderr, "gw-run: rank %d (pid %ld) was killed by signal %d (%s)\n", r->global,
                (long)pid, WTERMSIG(status), signal_name(WTERMSIG(status)));
    if (!have_failure) {
        have_failure = true;
        exit_code = code;
        teardown();
    }
}

static int cmp_pid_index(const void *a, const void *b)
{
    pid_t x = ((const struct pid_index *)a)->pid, y = ((const struct pid_index *)b)->pid;
    return (x > y) - (x < y);
}

static bool is_live_rank(pid_t pid)
{
    struct pid_index key = {.pid = pid, .rank = 0};
    const struct pid_index *hit =
        bsearch(&key, pid_index, (size_t)nranks, sizeof *pid_index, cmp_pid_index);
    return hit && ranks[hit->rank].pid == pid;
}

static bool stopping(void)
{
    return have_failure || got_signal;
}

/* Signals our children that are not ranks: SIGTERM once, SIGKILL after the
 * grace. Only called while stopping; after a clean run, a process a rank left
 * behind on purpose is left alone. Without /proc the strays are not chased. */
static void scan_strays(void)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld/children", (long)getpid());
    FILE *f = fopen(path, "re");
    strays = 0;
    if (!f)
        return;
    int fresh = 0;
    long v;
    while (fscanf(f, "%ld", &v) == 1) {
        pid_t pid = (pid_t)v;
        if (is_live_rank(pid))
            continue;
        strays++;
        if (escalated) {
            kill(pid, SIGKILL);
            continue;
        }
        bool seen = false;
        for (size_t i = 0; i < nstray_termed && !seen; i++)
            seen = stray_termed[i] == pid;
        if (seen)
            continue;
        if (nstray_termed == stray_termed_cap) {
            size_t cap = stray_termed_cap ? 2 * stray_termed_cap : 16;
            pid_t *np = realloc(stray_termed, cap * sizeof *np);
            if (!np)
                continue; /* it will get SIGKILL after the grace instead */
            stray_termed = np;
            stray_termed_cap = cap;
        }
        stray_termed[nstray_termed++] = pid;
        kill(pid, SIGTERM);
        fresh++;
    }
    fclose(f);
    if (fresh)
        fprintf(stderr, "gw-run: stopping %d process%s left behind by exited ranks\n", fresh,
                fresh == 1 ? "" : "es");
    if (strays && !kill_deadline_ms && !escalated)
        kill_deadline_ms = now_ms() + (int64_t)(kill_grace_s * 1000.0);
}

/* Collects every exited child: ranks are accounted for, strays only reaped. */
static void reap(void)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        struct pid_index key = {.pid = pid, .rank = 0};
        const struct pid_index *hit =
            bsearch(&key, pid_index, (size_t)nranks, sizeof *pid_index, cmp_pid_index);
        if (hit && ranks[hit->rank].pid == pid) {
            struct rank *r = &ranks[hit->rank];
            r->pid = 0;
            alive--;
            rank_exited(r, pid, status);
        }
    }
}

static void on_signal(int sig)
{
    int saved = errno;
    if (sig == SIGCHLD)
        pending_chld = 1;
    else if (sig == SIGINT)
        pending_int = 1;
    else if (sig == SIGTERM)
        pending_term = 1;
    /* The byte only wakes poll(); the flags say what happened, so nothing is
     * lost when the pipe is full (then it already holds a wake-up). */
    unsigned char b = (unsigned char)sig;
    ssize_t w = write(sig_pipe[1], &b, 1);
    (void)w;
    errno = saved;
}

/* Installs our handlers. A signal the caller ignored (nohup, a background job
 * in a script) stays ignored, for us and for the ranks. */
static void setup_signals(void)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;

    sigaction(SIGINT, NULL, &old);
    int_ignored = old.sa_handler == SIG_IGN;
    if (!int_ignored)
        sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, NULL, &old);
    term_ignored = old.sa_handler == SIG_IGN;
    if (!term_ignored)
        sigaction(SIGTERM, &sa, NULL);

    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);

    /* Writing to a closed stdout must cost us log lines, not the job. */
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old);
    pipe_ignored = old.sa_handler == SIG_IGN;
}

static void set_default(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

/* Runs in the child between fork and exec. gw-run is single-threaded, so the
 * non-async-signal-safe calls here (setenv, dprintf) are fine. */
static void exec_rank(const struct rank *r, int local, int out_w, int err_w, pid_t launcher,
                      char **argv)
{
    if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
        _exit(EXIT_NOT_FOUND);
    /* If gw-run dies without a chance to clean up (SIGKILL, OOM killer), its
     * ranks would otherwise live on holding GPUs and ports. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != launcher)
        _exit(1);
    if (!int_ignored)
        set_default(SIGINT);
    if (!term_ignored)
        set_default(SIGTERM);
    set_default(SIGCHLD);
    if (!pipe_ignored)
        set_default(SIGPIPE);
    sigprocmask(SIG_SETMASK, &orig_mask, NULL);
    setrlimit(RLIMIT_NOFILE, &orig_nofile);

    char buf[16];
    snprintf(buf, sizeof buf, "%d", r->global);
    setenv("GW_RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", local);
    setenv("GW_LOCAL_RANK", buf, 1);

    execvp(argv[0], argv);
    dprintf(2, "gw-run: cannot run '%s': %s\n", argv[0], strerror(errno));
    _exit(EXIT_NOT_FOUND);
}

/* Each rank needs two pipes; thousands of ranks exceed the usual soft limit of
 * 1024 descriptors, so raise it up to the hard limit when needed. */
static void ensure_fd_limit(int n)
{
    getrlimit(RLIMIT_NOFILE, &orig_nofile);
    rlim_t need = (rlim_t)n * 2 + 64;
    if (orig_nofile.rlim_cur != RLIM_INFINITY && orig_nofile.rlim_cur < need) {
        struct rlimit raised = orig_nofile;
        raised.rlim_cur = orig_nofile.rlim_max == RLIM_INFINITY || orig_nofile.rlim_max > need
                              ? need
                              : orig_nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &raised);
        if (raised.rlim_cur < need) {
            fprintf(stderr,
                    "gw-run: -n %d needs about %lu open files but the hard limit is %lu; "
                    "raise it (ulimit -Hn) or start fewer ranks\n",
                    n, (unsigned long)need, (unsigned long)raised.rlim_cur);
            exit(1);
        }
    }
}

/* A pipe created while fd 1 or 2 is closed could land on that number, and
 * dup2 onto itself would then keep its close-on-exec flag. */
static void ensure_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) < 0) {
            int nfd = open("/dev/null", O_RDWR);
            if (nfd >= 0 && nfd != fd) {
                dup2(nfd, fd);
                close(nfd);
            }
        }
    }
}

static void spawn_all(int local_n, int node_rank, char **argv)
{
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGCHLD);
    /* Blocked while forking, so a signal cannot run our handler in a child
     * before it has reset its dispositions; pending ones arrive afterwards. */
    sigprocmask(SIG_BLOCK, &block, NULL);
    pid_t self = getpid();

    for (int i = 0; i < local_n; i++) {
        struct rank *r = &ranks[i];
        r->global = node_rank * local_n + i;
        int po[2], pe[2];
        if (pipe2(po, O_CLOEXEC) < 0) {
            fprintf(stderr, "gw-run: cannot create a pipe for rank %d: %s\n", r->global,
                    strerror(errno));
            break;
        }
        if (pipe2(pe, O_CLOEXEC) < 0) {
            fprintf(stderr, "gw-run: cannot create a pipe for rank %d: %s\n", r->global,
                    strerror(errno));
            close(po[0]);
            close(po[1]);
            break;
        }
        pid_t pid = fork();
        if (pid == 0)
            exec_rank(r, i, po[1], pe[1], self, argv);
        close(po[1]);
        close(pe[1]);
        if (pid < 0) {
            fprintf(stderr, "gw-run: cannot start rank %d: fork failed: %s\n", r->global,
                    strerror(errno));
            close(po[0]);
            close(pe[0]);
            break;
        }
        r->pid = pid;
        for (int k = 0; k < 2; k++) {
            int fd = k == 0 ? po[0] : pe[0];
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            r->s[k].fd = fd;
            r->s[k].out_fd = k + 1;
        }
        nranks++;
        alive++;
        open_streams += 2;
    }
    sigprocmask(SIG_UNBLOCK, &block, NULL);

    pid_index = calloc((size_t)nranks + 1, sizeof *pid_index);
    if (!pid_index) {
        fprintf(stderr, "gw-run: out of memory\n");
        signal_ranks(SIGKILL, true);
        exit(1);
    }
    for (int i = 0; i < nranks; i++)
        pid_index[i] = (struct pid_index){.pid = ranks[i].pid, .rank = i};
    qsort(pid_index, (size_t)nranks, sizeof *pid_index, cmp_pid_index);

    if (nranks < local_n) {
        /* The launcher's own failure: the job cannot run with ranks missing. */
        have_failure = true;
        exit_code = 1;
        teardown();
    }
}

static void drain_signal_pipe(bool *child_event)
{
    unsigned char b[256];
    while (read(sig_pipe[0], b, sizeof b) > 0) {
    }
    if (pending_chld) {
        pending_chld = 0;
        *child_event = true;
    }
    if (pending_int) {
        pending_int = 0;
        forward_signal(SIGINT);
        *child_event = true; /* rescan for strays now that we are stopping */
    }
    if (pending_term) {
        pending_term = 0;
        forward_signal(SIGTERM);
        *child_event = true;
    }
}

static void run_loop(void)
{
    struct pollfd *pfds = calloc((size_t)nranks * 2 + 1, sizeof *pfds);
    struct stream **owner = calloc((size_t)nranks * 2 + 1, sizeof *owner);
    struct rank **owner_rank = calloc((size_t)nranks * 2 + 1, sizeof *owner_rank);
    if (!pfds || !owner || !owner_rank) {
        fprintf(stderr, "gw-run: out of memory\n");
        exit(1);
    }
    int64_t drain_deadline_ms = 0;
    bool child_event = true; /* a rank may have exited before we got here */

    for (;;) {
        if (child_event) {
            child_event = false;
            reap();
            if (stopping())
                scan_strays();
        }
        bool wait_strays = stopping() && strays > 0;
        if (alive == 0 && open_streams == 0 && !wait_strays)
            break;
        int64_t now = now_ms();
        if ((alive > 0 || wait_strays) && kill_deadline_ms && now >= kill_deadline_ms) {
            if (alive > 0)
                fprintf(stderr, "gw-run: %d rank%s still running after %g s, sending SIGKILL\n",
                        alive, alive == 1 ? "" : "s", kill_grace_s);
            signal_ranks(SIGKILL, true);
            kill_deadline_ms = 0;
            escalated = true;
            scan_strays();
        }
        if (alive == 0 && open_streams > 0) {
            /* Every rank is gone but a process it started still holds its
             * stdout or stderr; wait a little for its last lines, not forever. */
            if (!drain_deadline_ms)
                drain_deadline_ms = now + DRAIN_GRACE_MS;
            if (now >= drain_deadline_ms) {
                fprintf(stderr, "gw-run: all ranks exited but a process they started still "
                                "holds their output; not waiting for it\n");
                for (int i = 0; i < nranks; i++)
                    for (int k = 0; k < 2; k++)
                        close_stream(&ranks[i], &ranks[i].s[k]);
                continue;
            }
        }

        int nfds = 0;
        pfds[nfds++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
        for (int i = 0; i < nranks; i++) {
            for (int k = 0; k < 2; k++) {
                if (ranks[i].s[k].fd >= 0) {
                    owner[nfds] = &ranks[i].s[k];
                    owner_rank[nfds] = &ranks[i];
                    pfds[nfds++] = (struct pollfd){.fd = ranks[i].s[k].fd, .events = POLLIN};
                }
            }
        }
        int64_t deadline = 0;
        if ((alive > 0 || wait_strays) && kill_deadline_ms)
            deadline = kill_deadline_ms;
        if (alive == 0 && open_streams > 0 && (!deadline || drain_deadline_ms < deadline))
            deadline = drain_deadline_ms;
        int timeout = -1;
        if (deadline) {
            int64_t left = deadline - now;
            timeout = left < 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
        }

        int n = poll(pfds, (nfds_t)nfds, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "gw-run: poll failed: %s\n", strerror(errno));
            exit(1);
        }
        if (pfds[0].revents)
            drain_signal_pipe(&child_event);
        for (int j = 1; j < nfds; j++)
            if (pfds[j].revents)
                pump(owner_rank[j], owner[j]);
    }
    free(pfds);
    free(owner);
    free(owner_rank);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"nproc-per-node", required_argument, NULL, 'n'},
        {"nnodes", required_argument, NULL, 'N'},
        {"node-rank", required_argument, NULL, 'r'},
        {"master", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    long local_n = 0, nnodes = 1, node_rank = 0, port = 0;
    const char *master = NULL;
    char host[256];

    /* '+' stops at the first non-option so PROGRAM's own flags are left alone;
     * the leading ':' lets us word the error messages ourselves. */
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "+:hn:", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (!parse_long(optarg, 1, MAX_LOCAL_RANKS, &local_n))
                usage_error("-n must be a number of ranks from 1 to 4096, not '%s'", optarg);
            break;
        case 'N':
            if (!parse_long(optarg, 1, MAX_NNODES, &nnodes))
                usage_error("--nnodes must be a number from 1 to 65536, not '%s'", optarg);
            break;
        case 'r':
            if (!parse_long(optarg, 0, MAX_NNODES - 1, &node_rank))
                usage_error("--node-rank must be a number from 0 to nnodes-1, not '%s'", optarg);
            break;
        case 'm':
            master = optarg;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case ':':
            usage_error("option '%s' needs a value", argv[optind - 1]);
            break;
        default:
            if (optopt) {
                char opt[3] = {'-', (char)optopt, '\0'};
                usage_error("unknown option '%s'", opt);
            }
            usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (local_n == 0)
        usage_error("%smissing -n N (ranks to start on this node)", "");
    if (optind >= argc)
        usage_error("%smissing PROGRAM to run", "");
    if (master && !parse_master(master, host, sizeof host, &port))
        usage_error("--master must be HOST:PORT or [IPv6]:PORT with a port from 1 to 65535, "
                    "not '%s'", master);
    if (nnodes > 1 && !master)
        usage_error("%s--nnodes > 1 needs --master HOST:PORT (the address of node 0's rank 0)",
                    "");
    if (node_rank >= nnodes) {
        fprintf(stderr, "gw-run: --node-rank %ld is out of range for --nnodes %ld (0..%ld)\n",
                node_rank, nnodes, nnodes - 1);
        return EXIT_USAGE;
    }

    const char *token = getenv("GW_JOB_TOKEN");
    char token_buf[33];
    if (!token || !*token) {
        if (nnodes > 1) {
            /* Each node would invent a different token and the ranks would
             * refuse each other at rendezvous; only the user can share one. */
            fprintf(stderr,
                    "gw-run: GW_JOB_TOKEN is not set; a multi-node job needs the same token on "
                    "every node.\n"
                    "        Set it before starting gw-run on each node, e.g. "
                    "export GW_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\n");
            return EXIT_USAGE;
        }
        if (!make_token(token_buf)) {
            fprintf(stderr, "gw-run: cannot make a job token: getrandom failed: %s\n",
                    strerror(errno));
            return 1;
        }
        token = token_buf;
    }

    if (!master) {
        strcpy(host, "127.0.0.1");
        port = find_free_port();
        if (port < 0) {
            fprintf(stderr, "gw-run: cannot find a free TCP port on 127.0.0.1: %s\n",
                    strerror(errno));
            return 1;
        }
    }

    /* Settings shared by all ranks go into our own environment once; the
     * per-rank ones are set in each child. */
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", local_n * nnodes);
    setenv("GW_WORLD_SIZE", buf, 1);
    snprintf(buf, sizeof buf, "%ld", local_n);
    setenv("GW_LOCAL_WORLD_SIZE", buf, 1);
    snprintf(buf, sizeof buf, "%ld", nnodes);
    setenv("GW_NNODES", buf, 1);
    snprintf(buf, sizeof buf, "%ld", node_rank);
    setenv("GW_NODE_RANK", buf, 1);
    setenv("GW_MASTER_ADDR", host, 1);
    snprintf(buf, sizeof buf, "%ld", port);
    setenv("GW_MASTER_PORT", buf, 1);
    setenv("GW_JOB_TOKEN", token, 1);
    /* Without this every rank's OpenMP runtime would start one thread per
     * core and N ranks would oversubscribe the machine N times over. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long threads = cores > 0 ? cores / local_n : 1;
    snprintf(buf, sizeof buf, "%ld", threads < 1 ? 1 : threads);
    setenv("OMP_NUM_THREADS", buf, 0);

    const char *grace = getenv("GW_RUN_KILL_GRACE");
    if (grace && *grace) {
        char *end;
        double g = strtod(grace, &end);
        if (*end != '\0' || !isfinite(g) || g < 0 || g > 86400)
            fprintf(stderr, "gw-run: ignoring GW_RUN_KILL_GRACE='%s' (want seconds, 0..86400)\n",
                    grace);
        else
            kill_grace_s = g;
    }

    ensure_std_fds();
    ensure_fd_limit((int)local_n);
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        fprintf(stderr, "gw-run: cannot create a pipe: %s\n", strerror(errno));
        return 1;
    }
    sigprocmask(SIG_SETMASK, NULL, &orig_mask);
    setup_signals();
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* see scan_strays(); best effort */

    ranks = calloc((size_t)local_n, sizeof *ranks);
    if (!ranks) {
        fprintf(stderr, "gw-run: out of memory\n");
        return 1;
    }
    for (long i = 0; i < local_n; i++)
        ranks[i].s[0].fd = ranks[i].s[1].fd = -1;

    spawn_all((int)local_n, (int)node_rank, argv + optind);
    run_loop();

    if (have_failure)
        return exit_code;
    if (got_signal)
        return 128 + got_signal;
    return 0;
}
