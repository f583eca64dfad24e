/*
 * gw-run: the gradwire launcher, the local half of what torchrun does.
 *
 * What it is: a small program that starts N ranks of one PROGRAM on this
 * machine with fork + execvp, gives each rank the GW_* environment that the
 * library's bootstrap reads (rank, world size, master address, job token) and
 * torchrun's names for the same (a program written for torchrun runs
 * unchanged), prefixes every output line with the rank that wrote it,
 * forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT and passes SIGUSR1/2 on, and
 * tears the whole job down as soon as one rank fails, so a crash
 * on one rank never leaves the others hanging in a collective.
 *
 * For a multi-node job you run one gw-run per node (with ssh, Slurm or by
 * hand) giving each the same --master and GW_JOB_TOKEN. The ranks meet at the
 * master address in the library's rendezvous; the gw-runs meet on the
 * launcher port next to it (gw-run-net.c), so that a failure, a signal or a
 * missing node anywhere stops the job on every machine.
 *
 * With --max-restarts K a failed job (a rank that exited non-zero or was
 * killed, not a signal to gw-run) is started again, all of its ranks, up to K
 * times, as torchrun's --max-restarts does; a program that resumes from its
 * checkpoints (gw-train --resume) then survives a crash.
 *
 * What it is not: it does no rendezvous of its own, restarts only whole jobs
 * at the same size (no elastic membership: a lost node ends the job), and it
 * does not start anything on other machines. It links nothing from
 * gradwire on purpose, so it builds and works even when the library does not.
 *
 * This file parses the arguments (gw-run-args.c has the help text and the
 * parsers), sets up the environment, spawns the ranks and runs the main
 * loop; gw-run-io.c forwards the ranks' output,
 * gw-run-teardown.c handles signals, failures, teardown and reaping, and
 * gw-run-net.c is the control channel between the nodes, and gw-run-restart.c
 * how they agree on a restart over it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "gw-run.h"
#include "netname.h"

enum {
    MAX_LOCAL_RANKS = GW_RUN_MAX_LOCAL_RANKS,
    MAX_NNODES = 65536, /* keeps N * nnodes far below INT_MAX */
    EXIT_USAGE = 2,
    EXIT_NOT_FOUND = 127,
    EXIT_NOT_EXECUTABLE = 126, /* found, but exec refused it: the shell's code */
    MAX_RESTARTS = 10000,
    TOKEN_MAX = GW_RUN_TOKEN_MAX,
};

#define DEFAULT_KILL_GRACE_S 5.0
#define DEFAULT_JOIN_TIMEOUT_S 120.0
/* A joined launcher silent this long (no BEAT: stopped or hung) is lost. */
#define DEFAULT_HEARTBEAT_TIMEOUT_S 60.0

/* GW_RUN_HEARTBEAT_TIMEOUT: 0 (never), or at least 2 s: four heartbeats (a
 * shorter one gave launchers up between two of theirs). */
static double heartbeat_timeout_s(void)
{
    const double s = gw__run_env_seconds("GW_RUN_HEARTBEAT_TIMEOUT", DEFAULT_HEARTBEAT_TIMEOUT_S, true);
    if (s > 0 && s < 2.0) {
        gw__run_say("gw-run: GW_RUN_HEARTBEAT_TIMEOUT=%g is less than 2 s (four heartbeats): using 2\n", s);
        return 2.0;
    }
    return s;
}

struct job gw__run = {.kill_grace_s = DEFAULT_KILL_GRACE_S};

/* The caller's open-file limit, restored in each child before exec so that
 * the ranks start exactly as they would without the launcher. */
static struct rlimit orig_nofile;

/* PROGRAM runs through the Python interpreter (gw__run_program_argv). */
static bool run_by_python;

/* Runs in the child between fork and exec.  gw-run's only other threads are
 * its output writers (gw-run-io.c), which touch neither the environment nor
 * stdio's locks (they write(2) their queues); malloc, which setenv uses, is
 * kept consistent in the child by glibc's own fork handling.  So the
 * non-async-signal-safe calls here (setenv, snprintf, dprintf) are fine. */
static void exec_rank(const struct rank *r, int local, int out_w, int err_w, int report_w,
                      pid_t launcher, char **argv)
{
    int e;
    if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) {
        e = errno;
        if (write(report_w, &e, sizeof e) < 0) { /* the exit code says it too */
        }
        _exit(EXIT_NOT_FOUND);
    }
    /* If gw-run dies without a chance to clean up (SIGKILL, OOM killer), its
     * ranks would otherwise live on holding GPUs and ports. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != launcher)
        _exit(1);
    gw__run_child_signals();
    setrlimit(RLIMIT_NOFILE, &orig_nofile);

    char buf[16];
    snprintf(buf, sizeof buf, "%d", r->global);
    setenv("GW_RANK", buf, 1);
    setenv("RANK", buf, 1); /* torchrun's names too (see gw__run_job_env) */
    setenv("ROLE_RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", local);
    setenv("GW_LOCAL_RANK", buf, 1);
    setenv("LOCAL_RANK", buf, 1);
    gw__run_cause_env(r->global);

    execvp(argv[0], argv);
    e = errno;
    /* an exit code of 127 alone is no proof: a program that ran may exit with it */
    if (write(report_w, &e, sizeof e) < 0) {
    }
    /* a file of that name here, not found in PATH or not executable: torchrun
     * would run it with python (gw-run does so for .py files alone) */
    const bool here = !run_by_python && !strchr(argv[0], '/') && access(argv[0], F_OK) == 0;
    dprintf(2, "gw-run: cannot run '%s': %s%s%s%s%s\n", argv[0], strerror(e),
            run_by_python ? " (a .py PROGRAM or -m runs with python3 -u, as under torchrun: GW_RUN_PYTHON or "
                            "PYTHON_EXEC name another interpreter, --no-python runs PROGRAM as given)" : "",
            here ? " (searched in PATH; the file in this directory is ./" : "", here ? argv[0] : "",
            here ? ", which must be executable; a Python script without .py runs as 'python3 SCRIPT')" : "");
    _exit(e == ENOENT || e == ENOTDIR ? EXIT_NOT_FOUND : EXIT_NOT_EXECUTABLE);
}

/* Each rank needs three pipes: stdout, stderr and the exec report (node 0 of
 * a large job one socket per node on top, counted in extra); thousands of
 * ranks exceed the usual soft limit of 1024 descriptors, so raise it up to
 * the hard limit when needed. */
static void ensure_fd_limit(int n, int extra)
{
    getrlimit(RLIMIT_NOFILE, &orig_nofile);
    rlim_t need = (rlim_t)n * 3 + (rlim_t)extra + 64;
    if (orig_nofile.rlim_cur != RLIM_INFINITY && orig_nofile.rlim_cur < need) {
        struct rlimit raised = orig_nofile;
        raised.rlim_cur = orig_nofile.rlim_max == RLIM_INFINITY || orig_nofile.rlim_max > need
                              ? need
                              : orig_nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &raised);
        if (raised.rlim_cur < need) {
            gw__run_say(
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

/* The signals gw-run handles (INT, TERM, HUP, QUIT, USR1, USR2, CHLD): held while forking and
 * between two attempts. */
static sigset_t handled_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    sigaddset(&set, SIGCHLD);
    return set;
}

static void spawn_all(int local_n, int node_rank, char **argv)
{
    const sigset_t block = handled_signals();
    /* Blocked while forking, so a signal cannot run our handler in a child
     * before it has reset its dispositions; pending ones arrive afterwards. */
    sigprocmask(SIG_BLOCK, &block, NULL);
    pid_t self = getpid();
    /* Test hook: the fork of this global rank fails as if out of processes
     * (root, as in CI, is not held to RLIMIT_NPROC). */
    const char *hook = getenv("GW_RUN_TEST_FORK_FAIL");
    int fail_at = hook && *hook ? atoi(hook) : -1;
    char why[512] = "";

    for (int i = 0; i < local_n; i++) {
        struct rank *r = &gw__run.ranks[i];
        r->global = node_rank * local_n + i;
        static bool prefix_cut_noted; /* once: the first rank cut (rank 10's is longer than rank 1's) */
        if (gw__run_format_prefix(gw__run.prefix_template, gw__run.role, r->global, i, r->prefix,
                                  sizeof r->prefix) && !prefix_cut_noted) {
            prefix_cut_noted = true;
            gw__run_say("gw-run: note: --log-line-prefix-template makes prefixes longer than %zu bytes; they are cut "
                        "there (what follows, a ${rank} too, is lost)\n", sizeof r->prefix - 1);
        }
        if (!gw__run_logs_open(i, r->global, gw__run.attempt, why, sizeof why))
            break;
        r->exec_fd = -1;
        int pp[3][2], made = 0; /* stdout, stderr, the exec report */
        while (made < 3 && pipe2(pp[made], O_CLOEXEC) == 0)
            made++;
        if (made < 3) {
            snprintf(why, sizeof why, "cannot create a pipe for rank %d: %s", r->global,
                     strerror(errno));
            for (int k = 0; k < made; k++)
                close(pp[k][0]), close(pp[k][1]);
            gw__run_logs_close(i, 0), gw__run_logs_close(i, 1);
            break;
        }
        pid_t pid = r->global == fail_at ? (errno = EAGAIN, -1) : fork();
        int fork_errno = errno;
        if (pid == 0)
            exec_rank(r, i, pp[0][1], pp[1][1], pp[2][1], self, argv);
        for (int k = 0; k < 3; k++)
            close(pp[k][1]);
        if (pid < 0) {
            snprintf(why, sizeof why, "cannot start rank %d: fork failed: %s%s", r->global,
                     strerror(fork_errno),
                     fork_errno == EAGAIN ? " (this user's or container's limit on processes and threads: "
                                            "ulimit -u, the cgroup's pids.max)"
                                          : "");
            for (int k = 0; k < 3; k++)
                close(pp[k][0]);
            gw__run_logs_close(i, 0), gw__run_logs_close(i, 1);
            break;
        }
        int po[2] = {pp[0][0], -1}, pe[2] = {pp[1][0], -1};
        fcntl(pp[2][0], F_SETFL, fcntl(pp[2][0], F_GETFL) | O_NONBLOCK);
        r->exec_fd = pp[2][0];
        r->pid = pid;
        for (int k = 0; k < 2; k++) {
            int fd = k == 0 ? po[0] : pe[0];
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            r->s[k].fd = fd;
            r->s[k].out_fd = k + 1;
        }
        gw__run.nranks++;
        gw__run.alive++;
        gw__run.open_streams += 2;
    }
    /* A terminal's signal that came while forking reached only the ranks
     * forked before it: gw-run passes that one on to all. */
    sigset_t pend;
    if (sigpending(&pend) == 0 &&
        (sigismember(&pend, SIGINT) || sigismember(&pend, SIGHUP) || sigismember(&pend, SIGTERM) ||
         sigismember(&pend, SIGQUIT)))
        gw__run_signal_during_spawn();
    gw__run_drop_early_passes();
    sigprocmask(SIG_UNBLOCK, &block, NULL);

    gw__run_index_ranks();

    if (gw__run.nranks < local_n) {
        /* The launcher's own failure: the job cannot run with ranks missing,
         * and the other nodes are told why (not that this node was lost). */
        gw__run_say("gw-run: %s\n", why);
        gw__run_net_launch_failed(1, why);
        /* gw__run_fail: the weight of an exit code, so that a rank's exit
         * heard later from another node (often of this very failure: its
         * peers never met) does not replace it; and the ranks already
         * started that ended meanwhile are judged before the teardown
         * marks the others as stopped by us. */
        gw__run_fail(1);
    }
}

/* A single-node job after an attempt ended: whether to start it again (a
 * signal since the loop ended counts: gw-run exits as after it). */
static bool restart_wanted(long max_restarts)
{
    if (!gw__run.have_failure || max_restarts == 0)
        return false;
    bool child_event = false;
    if (!gw__run.got_signal) {
        gw__run_drain_signals(&child_event);
        if (gw__run.got_signal)
            gw__run.have_failure = false;
    }
    const char *why = gw__run_restart_refusal();
    gw__run_say_no_restart(why, max_restarts);
    return !why;
}

/* A multi-node job: whether node 0 started the next attempt everywhere (it
 * decided once every node's ranks were gone: gw-run-restart.c), and this node
 * takes part (a signal here since ends it, and the others see it leave). */
static bool node_restarts(long attempt)
{
    if (gw__run_net_restart() != attempt + 1)
        return false;
    bool child_event = false;
    gw__run_drain_signals(&child_event); /* passes a STOP to node 0 too (sent at exit) */
    if (gw__run.got_signal)
        gw__run.have_failure = false;
    return !gw__run.got_signal;
}

/* A SIGINT, SIGTERM or SIGHUP held pending (blocked between two attempts):
 * the job is not started again, and gw-run exits as after that signal. */
static bool signal_held(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    sigset_t pend;
    if (sigpending(&pend) != 0)
        return false;
    for (int i = 0; i < 4; i++)
        if (sigismember(&pend, sigs[i])) {
            gw__run_say("gw-run: %s arrived as the job was to start again: not restarting it\n",
                        gw__run_signal_name(sigs[i]));
            gw__run.got_signal = sigs[i];
            if (!gw__run.own_signal)
                gw__run.own_signal = sigs[i];
            gw__run.have_failure = false; /* gw-run exits as after that signal */
            gw__run_net_signal(sigs[i]);  /* the other nodes, restarting, stop too */
            return true;
        }
    return false;
}

/* A ^C (SIGINT to gw-run) that stopped the job, and nothing else failed:
 * gw-run ends as its ranks did, killed by SIGINT, not with exit code 130, so
 * that the shell that started it stops too (bash ends a script, or the loop
 * `for f in a b; do gw-run ...; done`, only when its child died of SIGINT).
 * The output is written out first (atexit does not run on a signal death).
 * SIGQUIT is left at 128 + 3: its default action would dump gw-run's core,
 * and shells act on a child's SIGINT only. */
static void die_of_sigint(void)
{
    gw__run_io_finish();
    fflush(NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(SIGINT);
    /* Not reached unless SIGINT could not kill us. */
    exit(128 + SIGINT);
}

/* The job state of a new attempt: no ranks, no failure, no teardown. */
static void reset_job(int local_n)
{
    gw__run_teardown_reset();
    for (int i = 0; i < local_n; i++)
        gw__run.ranks[i] = (struct rank){.s = {{.fd = -1}, {.fd = -1}}, .exec_fd = -1};
    gw__run.nranks = gw__run.alive = gw__run.open_streams = 0;
    gw__run.have_failure = gw__run.not_started = false;
    gw__run.exit_code = gw__run.fail_weight = 0;
    gw__run.kill_deadline_ms = 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"nproc-per-node", required_argument, NULL, 'n'},
        {"nproc_per_node", required_argument, NULL, 'n'}, /* torch 1.x's torchrun spelled them so */
        {"node_rank", required_argument, NULL, 'K'},
        {"master_addr", required_argument, NULL, 'A'},
        {"master_port", required_argument, NULL, 'P'},
        {"max_restarts", required_argument, NULL, 'R'},
        {"nnodes", required_argument, NULL, 'N'},
        {"node-rank", required_argument, NULL, 'K'},
        {"master", required_argument, NULL, 'O'},
        {"master-addr", required_argument, NULL, 'A'},
        {"master-port", required_argument, NULL, 'P'},
        {"standalone", no_argument, NULL, 'S'},
        {"launcher-port", required_argument, NULL, 'L'},
        {"max-restarts", required_argument, NULL, 'R'},
        {"log-dir", required_argument, NULL, 'D'},
        {"log_dir", required_argument, NULL, 'D'},
        {"tee", required_argument, NULL, 't'},
        {"redirects", required_argument, NULL, 'r'},
        {"rdzv-endpoint", required_argument, NULL, 'E'},
        {"rdzv_endpoint", required_argument, NULL, 'E'},
        {"rdzv-backend", required_argument, NULL, 'B'},
        {"rdzv_backend", required_argument, NULL, 'B'},
        {"rdzv-id", required_argument, NULL, 'I'},
        {"rdzv_id", required_argument, NULL, 'I'},
        {"rdzv-conf", required_argument, NULL, 'C'},
        {"rdzv_conf", required_argument, NULL, 'C'},
        {"local-ranks-filter", required_argument, NULL, 'F'},
        {"local_ranks_filter", required_argument, NULL, 'F'},
        {"no-python", no_argument, NULL, 'Y'},
        {"no_python", no_argument, NULL, 'Y'},
        {"module", no_argument, NULL, 'm'},
        {"run-path", no_argument, NULL, 'X'},
        {"run_path", no_argument, NULL, 'X'},
        {"role", required_argument, NULL, 'W'},
        {"monitor-interval", required_argument, NULL, 'V'},
        {"monitor_interval", required_argument, NULL, 'V'},
        {"start-method", required_argument, NULL, 'T'},
        {"start_method", required_argument, NULL, 'T'},
        {"log-line-prefix-template", required_argument, NULL, 'Q'},
        {"log_line_prefix_template", required_argument, NULL, 'Q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    long local_n = 0, nnodes = 1, node_rank = GW_RUN_NODE_AUTO, port = 0, lport = 0, max_restarts = 0, mport = 0;
    const char *master = NULL, *maddr = NULL, *log_dir = NULL, *tee = NULL, *redirects = NULL;
    const char *master_flag = "--master", *master_given = NULL; /* where master came from */
    const char *endpoint = NULL, *rdzv_id = NULL, *filter = NULL, *role = "default";
    int prog_mode = GW_RUN_PROG_AUTO;
    char host[256], composed[1100], err[1200]; /* (composed: a long value quoted whole in a refusal) */
    bool standalone = false;
    int is_host = -1; /* --rdzv-conf is_host */
    double conf_join_timeout_s = 0;

    /* '+' stops at the first non-option so PROGRAM's own flags are left alone;
     * the leading ':' lets us word the error messages ourselves. */
    opterr = 0;
    int c;
    /* torchrun's PET_* variables (Kubeflow's PyTorchJob sets them) for the
     * flags not given: a first pass notes which were */
    char given[128] = {0};
    while ((c = getopt_long(argc, argv, "+:hmn:r:t:", longopts, NULL)) != -1)
        given[c & 127] = 1;
    optind = 0;
    argv = gw__run_pet_argv(given, &argc, argv);
    while ((c = getopt_long(argc, argv, "+:hmn:r:t:", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (!gw__run_parse_long(optarg, 1, MAX_LOCAL_RANKS, &local_n)) {
                const int by_kind = gw__run_ranks_by_kind(optarg, &local_n);
                const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
                if (by_kind < 0 && cvd)
                    gw__run_usage_error("-n gpu: no GPU to use: CUDA_VISIBLE_DEVICES='%.200s' leaves none, as torch "
                                "reads it (its entries up to the first that is no GPU ordinal or UUID, or one the "
                                "driver does not list; none where one repeats)", cvd);
                if (by_kind < 0)
                    gw__run_usage_error("-n gpu: no GPU to use (the NVIDIA driver lists none in "
                                "/proc/driver/nvidia/gpus)%s", "");
                if (by_kind == 0)
                    gw__run_usage_error("-n (--nproc-per-node) must be a number of ranks from 1 to 4096, or gpu, cpu "
                                "or auto, not '%s'", optarg);
            }
            break;
        case 'A':
            maddr = optarg;
            break;
        case 'P':
            if (!gw__run_parse_long(optarg, 1, 65535, &mport))
                gw__run_usage_error("--master-port must be a port from 1 to 65535, not '%s'", optarg);
            break;
        case 'S':
            standalone = true;
            break;
        case 'N':
            if (!gw__run_parse_nnodes(optarg, &nnodes, err, sizeof err))
                gw__run_usage_error("%s", err);
            break;
        case 'E':
            endpoint = optarg;
            break;
        case 'F':
            filter = optarg;
            break;
        case 'Q':
            gw__run.prefix_template = optarg;
            break;
        case 'W':
            if (!*optarg)
                gw__run_usage_error("%s--role must name the role (ROLE_NAME), not ''", "");
            role = optarg;
            break;
        case 'V':
        case 'T':
            if (!gw__run_check_ignored(c == 'V' ? "--monitor-interval" : "--start-method", optarg, err, sizeof err))
                gw__run_usage_error("%s", err);
            break;
        case 'Y':
        case 'm':
            if (prog_mode != GW_RUN_PROG_AUTO && prog_mode != (c == 'm' ? GW_RUN_PROG_MODULE : GW_RUN_PROG_DIRECT))
                gw__run_usage_error("%s--no-python and -m (--module) exclude each other (torchrun's too)", "");
            prog_mode = c == 'm' ? GW_RUN_PROG_MODULE : GW_RUN_PROG_DIRECT;
            break;
        case 'X':
            gw__run_usage_error("%s--run-path runs the script inside torchrun's own Python: gw-run starts every "
                                "rank as a process (a .py PROGRAM with python3 -u, as torchrun without it)", "");
        case 'B':
            if (!gw__run_check_rdzv_backend(optarg, err, sizeof err))
                gw__run_usage_error("%s", err);
            break;
        case 'I':
            rdzv_id = gw__run.run_id = optarg;
            break;
        case 'C':
            if (!gw__run_parse_rdzv_conf(optarg, &conf_join_timeout_s, &is_host, err, sizeof err))
                gw__run_usage_error("%s", err);
            break;
        case 'D':
            log_dir = optarg;
            break;
        case 't':
            tee = optarg;
            break;
        case 'r':
            redirects = optarg;
            break;
        case 'K':
            if (!gw__run_parse_long(optarg, 0, MAX_NNODES - 1, &node_rank))
                gw__run_usage_error("--node-rank must be a number from 0 to nnodes-1, not '%s'", optarg);
            break;
        case 'O':
            master = optarg;
            break;
        case 'L':
            if (!gw__run_parse_long(optarg, 1, 65535, &lport))
                gw__run_usage_error("--launcher-port must be a port from 1 to 65535, not '%s'", optarg);
            break;
        case 'R':
            if (!gw__run_parse_long(optarg, 0, MAX_RESTARTS, &max_restarts))
                gw__run_usage_error("--max-restarts must be a number from 0 to 10000, not '%s'", optarg);
            break;
        case 'h':
            fputs(gw__run_usage_text, stdout);
            return 0;
        case ':':
            gw__run_usage_error("option '%s' needs a value", argv[optind - 1]);
            break;
        default:
            if (optopt) {
                char opt[3] = {'-', (char)optopt, '\0'};
                gw__run_usage_error("unknown option '%s'", opt);
            }
            gw__run_usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (local_n == 0)
        gw__run_usage_error("%smissing -n N (ranks to start on this node)", "");
    if ((master != NULL) + (maddr || mport) + (endpoint != NULL) > 1)
        gw__run_usage_error("%sgive one of --master HOST:PORT, --master-addr/--master-port and --rdzv-endpoint "
                    "HOST[:PORT]", "");
    if (endpoint && (!*endpoint || *endpoint == ':' || (endpoint[0] == '[' && !strchr(endpoint, ']'))))
        gw__run_usage_error("--rdzv-endpoint must be HOST[:PORT] or [v6addr][:PORT], not '%s'", endpoint);
    /* Two colons or more outside brackets: an IPv6 address with a port or
     * without one (fe80::1:1234 is both; torchrun takes the last part for
     * the port, where it was taken for the address's) */
    if (endpoint && endpoint[0] != '[' && strchr(endpoint, ':') != strrchr(endpoint, ':'))
        gw__run_usage_error("--rdzv-endpoint '%.300s': an IPv6 address goes in brackets, [ADDRESS]:PORT or [ADDRESS] "
                    "(without them the last part could be the port or part of the address)", endpoint);
    if (endpoint) { /* torchrun's c10d endpoint: its port 29400 by default */
        /* (outside brackets at most one colon now: the port's) */
        const char *close = endpoint[0] == '[' ? strchr(endpoint, ']') : NULL;
        const bool has_port = close ? close[1] == ':' : strchr(endpoint, ':') != NULL;
        snprintf(composed, sizeof composed, has_port ? "%s" : "%s:29400", endpoint);
        master = composed;
        master_flag = "--rdzv-endpoint", master_given = endpoint;
    }
    if (is_host == 1 && node_rank > 0)
        gw__run_usage_error("%s--rdzv-conf is_host=1 makes this node 0; --node-rank says it is another", "");
    if (is_host == 0 && node_rank == 0)
        gw__run_usage_error("%s--rdzv-conf is_host=0 says this is not node 0; --node-rank says it is", "");
    if (is_host == 1)
        node_rank = 0;
    if (nnodes == 1 && node_rank == GW_RUN_NODE_AUTO)
        node_rank = 0;
    if (maddr && strchr(maddr, ':') && maddr[0] != '[') { /* an IPv6 address, or a port put in the wrong place */
        struct in6_addr a6;
        char bare[INET6_ADDRSTRLEN + 16];
        snprintf(bare, sizeof bare, "%.*s", (int)strcspn(maddr, "%"), maddr); /* (fe80::1%eth0: its zone apart) */
        if (inet_pton(AF_INET6, bare, &a6) != 1)
            gw__run_usage_error("--master-addr '%.300s' is neither a host name nor an IPv6 address (the port goes in "
                        "--master-port)", maddr);
    }
    if (maddr || mport) { /* torchrun's defaults for the one not given */
        const char *a = maddr ? maddr : "127.0.0.1";
        snprintf(composed, sizeof composed, strchr(a, ':') && a[0] != '[' ? "[%s]:%ld" : "%s:%ld", a,
                 mport ? mport : 29500);
        master = composed;
        master_flag = "--master-addr/--master-port", master_given = maddr;
    }
    master = gw__run_standalone(standalone, nnodes, master);
    if (optind >= argc)
        gw__run_usage_error("%smissing PROGRAM to run", "");
    /* a .py script with python3 -u, as torchrun; kept to the end (static: LeakSanitizer sees it held) */
    static char **program;
    program = gw__run_program_argv(argv + optind, prog_mode);
    run_by_python = program != argv + optind;
    if (!program) {
        gw__run_say("gw-run: out of memory\n");
        return 1;
    }
    if (master && !gw__run_parse_master(master, host, sizeof host, &port)) {
        char msg[1400]; /* named by the flag it came from (the endpoint's was called --master) */
        const bool v6 = master[0] == '[';
        const size_t hl = v6 ? strcspn(master + 1, "]") : strcspn(master, ":");
        if (hl >= sizeof host) /* (it said the port was wrong) */
            snprintf(msg, sizeof msg, "%s '%.300s...': the host is %zu characters long, at most %zu (a DNS name has "
                     "at most 253)", master_flag, master, hl, sizeof host - 1);
        else
            snprintf(msg, sizeof msg, "%s must give HOST:PORT or [IPv6]:PORT with a port from 1 to 65535, not "
                     "'%.1000s'", master_flag, master);
        gw__run_usage_error_for(msg, master_given);
    }
    if (nnodes > 1 && !master)
        gw__run_usage_error("%s--nnodes > 1 needs --master HOST:PORT (the address of node 0's rank 0)",
                    "");
    if (nnodes > 1 && !lport && port == 65535)
        gw__run_usage_error("%s--master port 65535 leaves no room for the launcher port (PORT + 1); "
                    "give --launcher-port", "");
    /* Said, not refused: a job script passes it whatever --nnodes it gets. */
    if (nnodes == 1 && lport)
        gw__run_say("gw-run: ignoring --launcher-port %ld: it is the channel between the nodes' "
                    "gw-runs, and --nnodes is 1\n", lport);
    if (nnodes > 1 && lport == port)
        gw__run_usage_error("--launcher-port must differ from the --master port (%s), which rank 0 "
                    "listens on", master);
    if (node_rank >= nnodes) {
        char from_r[160], from_n[160];
        gw__run_say("gw-run: --node-rank %ld is out of range for --nnodes %ld (0..%ld)%s%s\n", node_rank, nnodes,
                    nnodes - 1, gw__run_pet_note("--node-rank", from_r, sizeof from_r),
                    gw__run_pet_note("--nnodes", from_n, sizeof from_n));
        return EXIT_USAGE;
    }

    const char *token = getenv("GW_JOB_TOKEN");
    char token_buf[33];
    /* torchrun's job id, the same on every node (not its default "none",
     * which every job shares: the library refuses it as a token too) */
    const bool from_id = (!token || !*token) && rdzv_id && *rdzv_id && strcmp(rdzv_id, "none") != 0;
    if (from_id)
        token = rdzv_id;
    if (!token || !*token) {
        if (nnodes > 1) {
            /* Each node would invent a different token and the ranks would
             * refuse each other at rendezvous; only the user can share one. */
            gw__run_say(
                    "gw-run: GW_JOB_TOKEN is not set (nor --rdzv-id); a multi-node job needs the same "
                    "token on every node.\n"
                    "        Set it before starting gw-run on each node, e.g. "
                    "export GW_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\n");
            return EXIT_USAGE;
        }
        if (!gw__run_make_token(token_buf)) {
            gw__run_say("gw-run: cannot make a job token: getrandom failed: %s\n",
                    strerror(errno));
            return 1;
        }
        token = token_buf;
    }
    /* The library refuses a longer one at init, on every rank (and with
     * --max-restarts on every attempt: attempt_token shortens only the ones
     * gw-run makes longer); refused here, once, before anything starts. */
    if (strlen(token) > TOKEN_MAX) {
        gw__run_say("gw-run: %s is %zu characters long; the ranks accept at most %d: "
                    "use a shorter one (the same on every node)\n", from_id ? "--rdzv-id (the job token)"
                    : "GW_JOB_TOKEN", strlen(token), TOKEN_MAX);
        return EXIT_USAGE;
    }
    char lo[64], why[4400];
    const int logs = gw__run_logs_setup(log_dir, tee, redirects, filter, (int)local_n, (int)node_rank, (int)nnodes, why,
                                        sizeof why);
    if (logs < 0)
        gw__run_usage_error("%s", why);
    if (logs) {
        gw__run_say("gw-run: %s\n", why);
        return logs;
    }
    if (gw__addr_needs_zone(host)) {
        gw__run_say("gw-run: --master %s is a link-local IPv6 address without its interface: give it as "
                    "[%s%%IFACE]:PORT (each node's own interface name)\n", host, host);
        return EXIT_USAGE;
    }
    if (nnodes > 1 && strcmp(host, "localhost") != 0 && gw__name_is_loopback(host, lo, sizeof lo)) {
        gw__run_say("gw-run: --master %s resolves to %s (a loopback address) here; the other nodes cannot reach "
                    "that: give node 0's network address, or a name that resolves to it (Debian and Ubuntu map "
                    "the host name to 127.0.1.1 in /etc/hosts)\n", host, lo);
        return EXIT_USAGE;
    }

    if (!master) {
        strcpy(host, "127.0.0.1");
        port = gw__run_free_port();
        if (port < 0) {
            gw__run_say("gw-run: cannot find a free TCP port on 127.0.0.1: %s\n",
                    strerror(errno));
            return 1;
        }
    }

    char buf[32];
    /* Without this every rank's OpenMP runtime would start one thread per
     * core and N ranks would oversubscribe the machine N times over. */
    /* The cores gw-run may use (taskset, a cpuset, a scheduler's
     * allocation), not the machine's. */
    cpu_set_t aff;
    long cores = sched_getaffinity(0, sizeof aff, &aff) == 0 ? CPU_COUNT(&aff) : sysconf(_SC_NPROCESSORS_ONLN);
    long threads = cores > 0 ? cores / local_n : 1;
    snprintf(buf, sizeof buf, "%ld", threads < 1 ? 1 : threads);
    setenv("OMP_NUM_THREADS", buf, 0);

    gw__run.kill_grace_s = gw__run_env_seconds("GW_RUN_KILL_GRACE", gw__run.kill_grace_s, true);
    const double join_timeout_s = conf_join_timeout_s > 0 ? conf_join_timeout_s
                                  : gw__run_env_seconds("GW_RUN_JOIN_TIMEOUT", DEFAULT_JOIN_TIMEOUT_S, false);

    ensure_std_fds();
    ensure_fd_limit((int)local_n, ((node_rank == 0 || (node_rank < 0 && is_host != 0)) && nnodes > 1
                                       ? (int)nnodes + 64 : 0) +
                                      (gw__run_logs_on() ? 2 * (int)local_n : 0));
    if (!gw__run_setup_signals())
        return 1;
    /* Held until the ranks are forked (spawn_all passes on what came
     * meanwhile): a ^C during the launcher's own setup (a slow name lookup)
     * was taken for one that reached ranks not started yet. */
    const sigset_t held = handled_signals();
    sigprocmask(SIG_BLOCK, &held, NULL);
    gw__run_io_start();
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* see gw__run_scan_strays(); best effort */
    gw__run_note_inherited_children();

    gw__run.ranks = calloc((size_t)local_n, sizeof *gw__run.ranks);
    if (!gw__run.ranks) {
        gw__run_say("gw-run: out of memory\n");
        return 1;
    }
    for (long i = 0; i < local_n; i++)
        gw__run.ranks[i].s[0].fd = gw__run.ranks[i].s[1].fd = -1;

    /* Node 0 binds the launcher port before any rank starts, so that a wrong
     * --master fails at once and cleanly; the ranks do not wait for the other
     * nodes to join (their own rendezvous orders them). */
    struct net_config net = {
        .node = (int)node_rank,
        .nnodes = (int)nnodes,
        .nproc = (int)local_n,
        .host = host,
        .lport = (int)(lport ? lport : port + 1),
        .token = token,
        .join_timeout_s = join_timeout_s,
        .silence_s = heartbeat_timeout_s(),
        .max_restarts = (int)max_restarts,
        .not_host = is_host == 0,
    };
    if (!gw__run_net_init(&net))
        return 1;
    int join_sig = 0;
    node_rank = gw__run_net_join(&join_sig); /* no --node-rank: node 0, or the number node 0 gives */
    if (node_rank < 0) {
        gw__run_net_close();
        if (join_sig == SIGINT)
            die_of_sigint();
        return join_sig ? 128 + join_sig : 1;
    }
    if (gw__run_stopping()) { /* node 0's welcome came with how the job ended (it waited for late nodes) */
        gw__run_say("gw-run: node %ld: the job ended before this node joined; no rank started\n", node_rank);
        gw__run_net_close();
        return gw__run.have_failure ? gw__run.exit_code : 128 + gw__run.got_signal;
    }
    if (gw__run_logs_start((int)node_rank, why, sizeof why)) {
        gw__run_say("gw-run: %s\n", why);
        return 1;
    }
    /* Settings shared by all ranks go into our own environment once; the
     * per-rank ones are set in each child. */
    setenv("ROLE_NAME", role, 1); /* torchrun's --role */
    gw__run.role = role;
    gw__run_job_env(local_n * nnodes, local_n, nnodes, node_rank, host, port, lport ? lport : port + 1, nnodes > 1,
                    token);

    const size_t token_cap = strlen(token) + 32;
    char *cur_token = malloc(token_cap);
    if (!cur_token) {
        gw__run_say("gw-run: out of memory\n");
        return 1;
    }
    snprintf(cur_token, token_cap, "%s", token);
    gw__run_cause_init();
    for (long attempt = 0;; attempt++) {
        gw__run_setenv_long("GW_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", NULL, attempt);
        gw__run_setenv_long("GW_MAX_RESTARTS", "TORCHELASTIC_MAX_RESTARTS", NULL, max_restarts);
        gw__run.attempt = attempt;
        gw__run.may_restart = attempt < max_restarts;
        spawn_all((int)local_n, (int)node_rank, program);
        gw__run_loop();
        gw__run_cause_say();
        gw__run_remove_leftover_shm(cur_token);
        /* Signals are held from the decision until spawn_all has forked the
         * next attempt (it unblocks them, passing on what came meanwhile): a
         * terminal's ^C in between would otherwise reach no rank. */
        const sigset_t block = handled_signals();
        sigset_t old;
        sigprocmask(SIG_BLOCK, &block, &old);
        bool again = nnodes > 1 ? node_restarts(attempt) : restart_wanted(max_restarts);
        if (again)
            gw__run_test_restart_hold();
        if (!again || signal_held()) {
            sigprocmask(SIG_SETMASK, &old, NULL);
            break;
        }
        /* Nothing of the failed attempt is left (gw__run_loop waited for every
         * rank and stray): a fresh token and, unless --master fixed it, a
         * fresh port keep anything it left elsewhere away from the next. */
        gw__run_attempt_token(token, attempt + 1, cur_token, token_cap);
        if (!master) {
            port = gw__run_free_port();
            if (port < 0) {
                gw__run_say("gw-run: cannot restart the job: no free TCP port on 127.0.0.1: %s\n",
                        strerror(errno));
                break;
            }
        }
        /* the store's port afresh too (one node), or the same (across nodes) */
        gw__run_job_env(local_n * nnodes, local_n, nnodes, node_rank, host, port, lport ? lport : port + 1,
                        nnodes > 1, cur_token);
        gw__run_say("gw-run: restarting the job (exit code %d): restart %ld of %ld, %ld rank%s\n",
                gw__run.exit_code, attempt + 1, max_restarts, local_n, local_n == 1 ? "" : "s");
        reset_job((int)local_n);
        gw__run_net_reset();
    }
    free(cur_token);
    gw__run_net_close();
    gw__run_cause_cleanup();

    if (gw__run.have_failure)
        return gw__run.exit_code;
    if (gw__run.got_signal == SIGINT && gw__run.own_signal == SIGINT)
        die_of_sigint();
    if (gw__run.got_signal)
        return 128 + gw__run.got_signal;
    return 0;
}
