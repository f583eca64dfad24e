/*
 * gw-run-teardown.c: how the gw-run launcher reacts to signals and failures.
 *
 * What it is: the signal handling (a self-pipe that wakes the poll loop,
 * forwarding SIGINT, SIGTERM, SIGHUP and SIGQUIT (and passing SIGUSR1/2 on) to
 * the ranks, restoring the caller's
 * dispositions in each child), and tearing the job down: SIGTERM to every
 * remaining rank and to the processes they left behind, SIGKILL once the
 * grace is over.  Collecting exited ranks and judging them is
 * gw-run-reap.c's.
 *
 * In a multi-node job the same paths also serve failures and signals that
 * arrive from other nodes (gw-run-net.c calls gw__run_fail and
 * gw__run_remote_signal), and a local rank failure or signal is reported to
 * the other nodes through gw-run-net.c.
 *
 * What it is not: it parses no arguments, spawns nothing and runs no loop
 * (gw-run.c does), and it reads or writes no rank output beyond asking
 * gw-run-io.c to pass on a failed rank's last lines.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>

#include "gw-run.h"

static bool escalated; /* the grace is over: stragglers get SIGKILL at once */
/* After SIGKILL: when gw-run stops waiting for what is still there (a process
 * in uninterruptible sleep, a driver or file system hang, or one it may not
 * signal); 0 before. */
static int64_t give_up_ms, escalated_ms;

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
static volatile sig_atomic_t pending_chld, pending_int, pending_term, pending_hup, pending_quit;
/* SIGUSR1/SIGUSR2: passed on to the ranks, the job goes on (mpirun's way:
 * schedulers send them to ask for a checkpoint before a time limit). */
static volatile sig_atomic_t pending_usr1, pending_usr2;
/* The pending signal came from the kernel (a terminal's ^C or hangup): it went
 * to the whole foreground process group, the ranks included (they share
 * gw-run's), so passing it on would give them a second one. */
static volatile sig_atomic_t tty_int, tty_term, tty_hup, tty_quit;
static bool spawn_raced; /* a signal came while forking: some ranks may not have it */
static volatile sig_atomic_t session_leader; /* gw-run leads its session (set before the handlers) */

void gw__run_signal_during_spawn(void)
{
    spawn_raced = true;
}

/* What the caller left us with, restored in each child before exec so that
 * the ranks start exactly as they would without the launcher. */
static sigset_t orig_mask;
static bool int_ignored, term_ignored, hup_ignored, pipe_ignored, quit_ignored, usr1_ignored, usr2_ignored,
    xfsz_ignored;

int64_t gw__run_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *gw__run_signal_name(int sig)
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

/* The state letter of pid in /proc (R, S, D, T, t, Z, ...), '?' where it
 * cannot be read. */
static char proc_state(pid_t pid)
{
    char st[512];
    const char *fields = gw__run_proc_stat_fields(pid, st, sizeof st);
    return fields ? fields[0] : '?';
}

/* A process stopped by job control (SIGSTOP, Ctrl-Z at a terminal: state T)
 * holds a terminating signal pending until it is continued, so the teardown
 * waited the whole kill grace for it and then killed it without its cleanup:
 * it gets SIGCONT after the signal, as a shell's kill and systemd do (one held
 * by a debugger, t, is left alone: SIGCONT does not free it).  rank: its
 * global rank, said once per process; -1: a stray, not said. */
static void continue_if_stopped(pid_t pid, int rank, int sig)
{
    static pid_t said[8];
    if (proc_state(pid) != 'T')
        return;
    kill(pid, SIGCONT);
    if (rank < 0)
        return;
    for (size_t i = 0; i < sizeof said / sizeof said[0]; i++) {
        if (said[i] == pid)
            return;
        if (!said[i]) {
            said[i] = pid;
            break;
        }
    }
    gw__run_say("gw-run: rank %d (pid %ld) is stopped (SIGSTOP, or Ctrl-Z); continuing it (SIGCONT) so that it "
                "takes the %s\n", rank, (long)pid, gw__run_signal_name(sig));
}

static void signal_ranks(int sig, bool mark_stopped)
{
    /* Test hook: this global rank is never signalled (as if unkillable). */
    const char *hook = getenv("GW_RUN_TEST_UNKILLABLE");
    const int spared = hook && *hook ? atoi(hook) : -1;
    for (int i = 0; i < gw__run.nranks; i++) {
        if (gw__run.ranks[i].global == spared)
            continue;
        if (gw__run.ranks[i].pid > 0) {
            /* A rank that already ended (not reaped yet: its crash is still
             * to be judged) was not stopped by us. */
            siginfo_t si = {0};
            const bool ended = mark_stopped &&
                               waitid(P_PID, (id_t)gw__run.ranks[i].pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                               si.si_pid == gw__run.ranks[i].pid;
            kill(gw__run.ranks[i].pid, sig);
            if (sig != SIGKILL && sig != SIGUSR1 && sig != SIGUSR2)
                continue_if_stopped(gw__run.ranks[i].pid, gw__run.ranks[i].global, sig);
            if (mark_stopped && !ended)
                gw__run.ranks[i].stopped_by_us = true;
        }
    }
}

/* After the first failure the others would only block in a collective waiting
 * for the dead rank, so they are asked to stop, then killed after the grace. */
void gw__run_teardown(void)
{
    if (gw__run.alive == 0)
        return;
    gw__run_say("gw-run: stopping the %d other running rank%s (SIGTERM, SIGKILL after %g s)\n",
            gw__run.alive, gw__run.alive == 1 ? "" : "s", gw__run.kill_grace_s);
    signal_ranks(SIGTERM, true);
    gw__run.kill_deadline_ms = gw__run_now_ms() + (int64_t)(gw__run.kill_grace_s * 1000.0);
}

/* A failure decided elsewhere (another node's rank, a lost node, a node that
 * did not join): stops the job as a local rank failure does. Returns false
 * when the job had already failed, whose exit code then stands. */
bool gw__run_fail(int code)
{
    if (gw__run.have_failure)
        return false;
    /* Ranks that ended before this news was read (their SIGCHLD in the same
     * wake-up) are judged first: the teardown would take them for ranks it
     * stopped, and a local crash would go unreported, its code lost. */
    gw__run_reap();
    if (gw__run.have_failure)
        return false;
    gw__run.have_failure = true;
    gw__run.exit_code = code;
    gw__run.fail_weight = code > 128 ? 2 : 1;
    gw__run_teardown();
    return true;
}

/* The job's failure is the likeliest cause among those seen: a rank killed
 * by a signal (a crash) over one that exited with a code (often a peer that
 * saw the crash: on another node it can exit before the crash's news gets
 * here).  Node 0 decides for the job, so the others also take its word over
 * their own of the same weight: every gw-run then exits with one code.  Not
 * after a signal to the job, whose code that is. */
bool gw__run_refail(int code, int weight, bool from_node0)
{
    if (!gw__run.have_failure || gw__run.got_signal)
        return false;
    if (weight < gw__run.fail_weight || (weight == gw__run.fail_weight && !from_node0))
        return false;
    gw__run.exit_code = code;
    gw__run.fail_weight = weight;
    return true;
}

/* Whether the ranks are to get sig now: not when it is the same signal as
 * the one they got less than a second ago, reaching several nodes' gw-run a
 * little apart (scancel, a time limit, sbatch --signal): another node's after
 * any, or this node's own after another node's (each node passed it on and
 * told the others, whose ranks got it again: a second SIGINT lands in
 * Python's KeyboardInterrupt cleanup).  Two of this gw-run's own both go (a
 * second ^C or TERM to hurry), and so does any a second later. */
static bool once_per_signal(int sig, bool remote)
{
    if (sig <= 0 || sig >= 32)
        return true;
    const int64_t now = gw__run_now_ms();
    if (gw__run.sig_ms[sig] && now - gw__run.sig_ms[sig] < 1000 && (remote || gw__run.sig_remote[sig])) {
        gw__run_say("gw-run: %s%s again within a second: the ranks here got it already\n",
                gw__run_signal_name(sig), remote ? " from another node" : "");
        return false;
    }
    gw__run.sig_ms[sig] = now, gw__run.sig_remote[sig] = remote;
    return true;
}

/* remote: the signal reached another node's gw-run, which passed it on.
 * reached: the ranks got it already (a terminal's signal to the process group). */
static void forward_signal(int sig, bool remote, bool reached)
{
    if (!gw__run.got_signal)
        gw__run.got_signal = sig;
    if (gw__run.alive == 0) {
        /* Nothing left to stop: what keeps gw-run may be its own output, a
         * stdout nobody reads; a program blocked writing there would die
         * of this signal, so gw-run gives that output up at once.  Said:
         * it also ends a failed attempt's restart. */
        if (!remote) {
            gw__run.out_hurry = true;
            gw__run_say("gw-run: received %s with no rank running\n", gw__run_signal_name(sig));
        }
        return;
    }
    if (!once_per_signal(sig, remote))
        return;
    if (remote)
        gw__run_say("gw-run: forwarding %s to %d rank%s\n", gw__run_signal_name(sig),
                gw__run.alive, gw__run.alive == 1 ? "" : "s");
    else if (reached && !spawn_raced)
        gw__run_say("gw-run: %s from the terminal reached the %d rank%s too; waiting for them\n",
                gw__run_signal_name(sig), gw__run.alive, gw__run.alive == 1 ? "" : "s");
    else
        gw__run_say("gw-run: received %s, forwarding it to %d rank%s\n",
                gw__run_signal_name(sig), gw__run.alive, gw__run.alive == 1 ? "" : "s");
    if (!reached || spawn_raced) {
        signal_ranks(sig, false);
    } else { /* a rank that left gw-run's process group (setsid) did not get it */
        for (int i = 0; i < gw__run.nranks; i++)
            if (gw__run.ranks[i].pid > 0) {
                if (getpgid(gw__run.ranks[i].pid) != getpgrp())
                    kill(gw__run.ranks[i].pid, sig);
                continue_if_stopped(gw__run.ranks[i].pid, gw__run.ranks[i].global, sig);
            }
    }
    /* A rank that ignores the signal must not keep the job alive forever. */
    if (!gw__run.kill_deadline_ms)
        gw__run.kill_deadline_ms = gw__run_now_ms() + (int64_t)(gw__run.kill_grace_s * 1000.0);
}

void gw__run_remote_signal(int sig)
{
    forward_signal(sig, true, false);
}

/* SIGUSR1/SIGUSR2 to every running rank, the job going on; from_node: the
 * node whose gw-run received it, -1 this one. */
void gw__run_pass_signal(int sig, int from_node)
{
    if (gw__run.alive == 0)
        return;
    if (!once_per_signal(sig, from_node >= 0))
        return;
    if (from_node >= 0)
        gw__run_say("gw-run: node %d received %s; passing it on to %d rank%s\n", from_node,
                gw__run_signal_name(sig), gw__run.alive, gw__run.alive == 1 ? "" : "s");
    else
        gw__run_say("gw-run: received %s, passing it on to %d rank%s\n", gw__run_signal_name(sig),
                gw__run.alive, gw__run.alive == 1 ? "" : "s");
    signal_ranks(sig, false);
}

bool gw__run_stopping(void)
{
    return gw__run.have_failure || gw__run.got_signal;
}

/* Children gw-run had before it started a rank (inherited across the exec
 * of a job script's `tensorboard & exec gw-run ...`): not the job's, never
 * stopped as its leftovers. */
static pid_t *inherited;
static size_t ninherited;
static bool strays_abandoned; /* given up on after SIGKILL: no longer waited for */

static FILE *open_children(void)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld/children", (long)getpid());
    return fopen(path, "re");
}

void gw__run_note_inherited_children(void)
{
    FILE *f = open_children();
    long v;
    size_t cap = 0;
    while (f && fscanf(f, "%ld", &v) == 1) {
        if (ninherited == cap) {
            pid_t *np = realloc(inherited, (cap = cap ? 2 * cap : 8) * sizeof *np);
            if (!np)
                break;
            inherited = np;
        }
        inherited[ninherited++] = (pid_t)v;
    }
    if (f)
        fclose(f);
}

static bool is_inherited(pid_t pid)
{
    for (size_t i = 0; i < ninherited; i++)
        if (inherited[i] == pid)
            return true;
    return false;
}

/* While stopping, or once every rank ended, the loop keeps running until the
 * strays are gone too. */
bool gw__run_waiting_for_strays(void)
{
    return (gw__run_stopping() || gw__run.alive == 0) && strays > 0 && !strays_abandoned;
}

/* Signals our children that are not ranks: SIGTERM once, SIGKILL after the
 * grace.  Called while stopping, and once every rank ended: what the ranks
 * started ends with the job, a clean one too (as torchrun ends each
 * worker's process group, and a scheduler its step's processes; a daemon a
 * rank left running was orphaned unsaid, and one holding the ranks' output
 * was given up on after 2 s).  Without /proc the strays are not chased. */
void gw__run_scan_strays(void)
{
    FILE *f = open_children();
    strays = 0;
    /* Test hook: the strays are never signalled (as if unkillable). */
    const char *hook = getenv("GW_RUN_TEST_UNKILLABLE_STRAYS");
    const bool spare = hook && !strcmp(hook, "1");
    if (!f)
        return;
    int fresh = 0;
    long v;
    while (fscanf(f, "%ld", &v) == 1) {
        pid_t pid = (pid_t)v;
        if (gw__run_is_rank(pid) || is_inherited(pid))
            continue;
        strays++;
        if (escalated) {
            if (!spare)
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
        if (!spare) {
            kill(pid, SIGTERM);
            continue_if_stopped(pid, -1, SIGTERM);
        }
        fresh++;
    }
    fclose(f);
    if (fresh)
        gw__run_say("gw-run: stopping %d process%s left behind by exited ranks%s\n", fresh, fresh == 1 ? "" : "es",
                    gw__run_stopping() ? "" : " (every rank here ended: what they started ends with them)");
    if (strays && !gw__run.kill_deadline_ms && !escalated)
        gw__run.kill_deadline_ms = gw__run_now_ms() + (int64_t)(gw__run.kill_grace_s * 1000.0);
}

/* The kill deadline has passed: SIGKILL for every rank and stray still there,
 * and at once for any stray found from now on. */
void gw__run_escalate(void)
{
    if (gw__run.alive > 0)
        gw__run_say("gw-run: %d rank%s still running after %g s, sending SIGKILL\n",
                gw__run.alive, gw__run.alive == 1 ? "" : "s", gw__run.kill_grace_s);
    signal_ranks(SIGKILL, true);
    gw__run.kill_deadline_ms = 0;
    escalated = true;
    if (!give_up_ms) {
        escalated_ms = gw__run_now_ms();
        give_up_ms = escalated_ms + (int64_t)(1000.0 * (gw__run.kill_grace_s > 5 ? gw__run.kill_grace_s : 5));
    }
    gw__run_scan_strays();
}

int64_t gw__run_give_up_deadline(void)
{
    return give_up_ms;
}

/* The give-up deadline has passed: names what is still there and stops
 * waiting for it (gw-run exits with the job's failure, or 1; after a clean
 * run, a leftover that survived SIGKILL is named and the job keeps its
 * success). */
void gw__run_give_up(void)
{
    for (int i = 0; i < gw__run.nranks; i++) {
        const pid_t pid = gw__run.ranks[i].pid;
        if (pid <= 0)
            continue;
        const char state = proc_state(pid);
        gw__run_say("gw-run: rank %d (pid %ld, state %c) is still there %g s after SIGKILL%s: giving up on it\n",
                    gw__run.ranks[i].global, (long)pid, state, (double)(gw__run_now_ms() - escalated_ms) / 1000.0,
                    state == 'D' ? " (uninterruptible sleep: a driver or file system hang; see /proc/PID/stack)"
                                 : " (it may not be gw-run's to signal)");
    }
    for (size_t i = 0; i < nstray_termed; i++)
        if (kill(stray_termed[i], 0) == 0)
            gw__run_say("gw-run: a process the ranks left behind (pid %ld) is still there after SIGKILL: giving up "
                        "on it\n", (long)stray_termed[i]);
    strays_abandoned = true;
    /* A signal's stop keeps its 128 + signal; else the job failed (a rank
     * was still there: no clean run). */
    if (!gw__run.have_failure && !gw__run.got_signal && gw__run.alive > 0) {
        gw__run.have_failure = true;
        gw__run.exit_code = 1;
    }
}

/* Forgets one attempt's ranks and teardown before the next (--max-restarts):
 * what the loop left is no child of ours any more (every rank and stray was
 * reaped, or gw-run gave up and does not restart). */
void gw__run_teardown_reset(void)
{
    gw__run_reap_reset();
    escalated = false, give_up_ms = escalated_ms = 0;
    strays = 0, nstray_termed = 0;
    strays_abandoned = false;
    spawn_raced = false;
}

bool gw__run_stop_signal_pending(void)
{
    return pending_int || pending_term || pending_hup || pending_quit;
}

static void on_signal(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    int saved = errno;
    /* A terminal's ^C goes to its foreground process group, ours; its hangup
     * only to the session leader (the group hears of it when the leader
     * exits): the ranks got a kernel SIGHUP too unless gw-run leads the session. */
    const bool tty = si && si->si_code == SI_KERNEL && (sig != SIGHUP || !session_leader);
    if (sig == SIGCHLD)
        pending_chld = 1;
    else if (sig == SIGINT)
        pending_int = 1, tty_int = tty;
    else if (sig == SIGTERM)
        pending_term = 1, tty_term = tty;
    else if (sig == SIGHUP)
        pending_hup = 1, tty_hup = tty;
    else if (sig == SIGQUIT)
        pending_quit = 1, tty_quit = tty;
    else if (sig == SIGUSR1)
        pending_usr1 = 1;
    else if (sig == SIGUSR2)
        pending_usr2 = 1;
    /* The byte only wakes poll(); the flags say what happened, so nothing is
     * lost when the pipe is full (then it already holds a wake-up). */
    unsigned char b = (unsigned char)sig;
    ssize_t w = write(sig_pipe[1], &b, 1);
    (void)w;
    errno = saved;
}

/* Creates the wake-up pipe, notes the caller's signal mask and installs our
 * handlers. A signal the caller ignored (nohup, a background job in a script)
 * stays ignored, for us and for the ranks. Returns false, having said why,
 * when the pipe cannot be created. */
bool gw__run_setup_signals(void)
{
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        gw__run_say("gw-run: cannot create a pipe: %s\n", strerror(errno));
        return false;
    }
    sigprocmask(SIG_SETMASK, NULL, &orig_mask);
    session_leader = getsid(0) == getpid();

    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_SIGINFO;

    sigaction(SIGINT, NULL, &old);
    int_ignored = old.sa_handler == SIG_IGN;
    if (!int_ignored)
        sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, NULL, &old);
    term_ignored = old.sa_handler == SIG_IGN;
    if (!term_ignored)
        sigaction(SIGTERM, &sa, NULL);
    /* A hangup (the terminal or ssh session gone) stops the job as SIGTERM
     * does, rather than killing gw-run with no teardown (nohup: ignored). */
    sigaction(SIGHUP, NULL, &old);
    hup_ignored = old.sa_handler == SIG_IGN;
    if (!hup_ignored)
        sigaction(SIGHUP, &sa, NULL);
    /* ^\ (SIGQUIT) stops the job as ^C does; SIGUSR1/SIGUSR2 would kill
     * gw-run with no teardown (the ranks then got SIGTERM by the parent-death
     * signal instead of the request to checkpoint): passed on instead. */
    sigaction(SIGQUIT, NULL, &old);
    quit_ignored = old.sa_handler == SIG_IGN;
    if (!quit_ignored)
        sigaction(SIGQUIT, &sa, NULL);
    sigaction(SIGUSR1, NULL, &old);
    usr1_ignored = old.sa_handler == SIG_IGN;
    if (!usr1_ignored)
        sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, NULL, &old);
    usr2_ignored = old.sa_handler == SIG_IGN;
    if (!usr2_ignored)
        sigaction(SIGUSR2, &sa, NULL);

    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP | SA_SIGINFO;
    sigaction(SIGCHLD, &sa, NULL);

    /* Writing to a closed stdout must cost us log lines, not the job. */
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old);
    pipe_ignored = old.sa_handler == SIG_IGN;
    /* Nor a log file past the file-size limit (ulimit -f): EFBIG, said. */
    sigaction(SIGXFSZ, &ign, &old);
    xfsz_ignored = old.sa_handler == SIG_IGN;
    return true;
}

/* The read end of the wake-up pipe, for the loop to poll. */
int gw__run_signal_fd(void)
{
    return sig_pipe[0];
}

/* Called when the wake-up pipe is readable: empties it and acts on what the
 * handler noted. Sets *child_event when the loop should reap and rescan. */
void gw__run_drain_signals(bool *child_event)
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
        if (!gw__run.own_signal)
            gw__run.own_signal = SIGINT;
        forward_signal(SIGINT, false, tty_int);
        gw__run_net_signal(SIGINT);
        *child_event = true; /* rescan for strays now that we are stopping */
    }
    if (pending_term) {
        pending_term = 0;
        if (!gw__run.own_signal)
            gw__run.own_signal = SIGTERM;
        forward_signal(SIGTERM, false, tty_term);
        gw__run_net_signal(SIGTERM);
        *child_event = true;
    }
    if (pending_hup) {
        pending_hup = 0;
        if (!gw__run.own_signal)
            gw__run.own_signal = SIGHUP;
        forward_signal(SIGHUP, false, tty_hup);
        gw__run_net_signal(SIGHUP);
        *child_event = true;
    }
    if (pending_quit) {
        pending_quit = 0;
        if (!gw__run.own_signal)
            gw__run.own_signal = SIGQUIT;
        forward_signal(SIGQUIT, false, tty_quit);
        gw__run_net_signal(SIGQUIT);
        *child_event = true;
    }
    if (pending_usr1) {
        pending_usr1 = 0;
        gw__run_pass_signal(SIGUSR1, -1);
        gw__run_net_pass(SIGUSR1);
    }
    if (pending_usr2) {
        pending_usr2 = 0;
        gw__run_pass_signal(SIGUSR2, -1);
        gw__run_net_pass(SIGUSR2);
    }
}

void gw__run_drop_early_passes(void)
{
    static const int sigs[] = {SIGUSR1, SIGUSR2};
    /* Caught after the last attempt's loop ended, before signals were held. */
    bool got[2] = {pending_usr1 != 0, pending_usr2 != 0};
    pending_usr1 = pending_usr2 = 0;
    /* Held pending since (the caller holds them while forking). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    const struct timespec zero = {0, 0};
    int sig;
    while ((sig = sigtimedwait(&set, NULL, &zero)) > 0)
        got[sig == SIGUSR2] = true;
    for (int i = 0; i < 2; i++)
        if (got[i])
            gw__run_say("gw-run: %s arrived before the ranks started; not passing it on (they could not handle "
                        "it yet: it would kill them)\n", gw__run_signal_name(sigs[i]));
}

static void set_default(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

/* Runs in the child between fork and exec: gives the rank the dispositions
 * and signal mask that the caller gave gw-run. */
void gw__run_child_signals(void)
{
    if (!int_ignored)
        set_default(SIGINT);
    if (!term_ignored)
        set_default(SIGTERM);
    if (!hup_ignored)
        set_default(SIGHUP);
    if (!quit_ignored)
        set_default(SIGQUIT);
    if (!usr1_ignored)
        set_default(SIGUSR1);
    if (!usr2_ignored)
        set_default(SIGUSR2);
    set_default(SIGCHLD);
    if (!pipe_ignored)
        set_default(SIGPIPE);
    if (!xfsz_ignored)
        set_default(SIGXFSZ);
    sigprocmask(SIG_SETMASK, &orig_mask, NULL);
}
