/*
 * gw-run-reap.c: collecting the gw-run launcher's exited ranks and judging
 * them (split from gw-run-teardown.c, which reacts to signals and failures
 * and stops the job).
 *
 * What it is: the index of the ranks' pids (ranks told from strays among
 * gw-run's children), gw__run_reap (every exited child collected, the ranks
 * among them judged together: a crash over the exits 1 that follow it, a
 * rank the kernel counts as dying waited for), and what one rank's end
 * means (its last words, its failure record, the job's verdict, the
 * teardown it starts).
 *
 * What it is not: it sends no signal but the SIGKILLs of an out-of-memory
 * start, and stops nothing itself (gw__run_teardown does).
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/types.h>
#include <sys/wait.h>

#include "gw-run.h"

/* Rank pids sorted, to tell ranks from strays among our children quickly. */
struct pid_index {
    pid_t pid;
    int rank;
};
static struct pid_index *pid_index;
/* The ranks one gw__run_reap collected, to judge together. */
struct exited {
    struct rank *r;
    pid_t pid;
    int status;
};
static struct exited *exited;

/* pid's /proc/<pid>/stat from its state on (after the command name, which
 * may hold spaces and parentheses), read into buf; NULL where it cannot be. */
const char *gw__run_proc_stat_fields(pid_t pid, char *buf, size_t len)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    const size_t n = fread(buf, 1, len - 1, f);
    buf[n] = 0;
    fclose(f);
    const char *close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' && close_paren[2] ? close_paren + 2 : NULL;
}

/* The ranks here that had exited with code 0 before the job's first
 * failure, failed: a rank that ends early (a script's branch taken on one
 * rank alone, a program that returns before its collectives) leaves its
 * peers waiting for it, and their failure, a rendezvous or a wait that timed
 * out naming it as missing, said nothing of its exit.  failed: the failed
 * rank's global number (-1: none here). */
void gw__run_say_done_before(int failed)
{
    const int64_t now = gw__run_now_ms();
    int said = 0, more = 0;
    for (int i = 0; i < gw__run.nranks; i++) {
        const struct rank *d = &gw__run.ranks[i];
        if (!d->done_ms || d->global == failed)
            continue;
        if (said == 4) {
            more++;
            continue;
        }
        gw__run_say("gw-run: rank %d had exited with code 0, %.1f s before: a rank that ends early "
                    "leaves peers that wait for it to time out\n",
                    d->global, (double)(now - d->done_ms) / 1e3);
        said++;
    }
    if (more)
        gw__run_say("gw-run: and %d more rank(s) here had exited with code 0 before\n", more);
}

static void rank_exited(struct rank *r, pid_t pid, int status)
{
    if (r->exec_fd >= 0) { /* exec failed: the child wrote its errno there */
        int e;
        if (read(r->exec_fd, &e, sizeof e) == (ssize_t)sizeof e)
            gw__run.not_started = true;
        close(r->exec_fd);
        r->exec_fd = -1;
    }
    int code;
    if (WIFEXITED(status))
        code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
        code = 128 + WTERMSIG(status);
    else
        return;
    /* Its failure record, whoever ended it (the one at fault is often
     * stopped by the teardown, still cleaning up: gw-run-cause.c). */
    const int recorded = gw__run_cause_read(r->global, (long)pid, code != 0);
    if (code == 0 && !r->stopped_by_us && !gw__run.have_failure && !gw__run.got_signal)
        r->done_ms = gw__run_now_ms();
    if (code == 0 || r->stopped_by_us)
        return;
    /* After a signal: a rank it ended is its effect, not a failure to report
     * (nor one to answer with SIGTERM to the others: the grace deadline the
     * signal set bounds the wait, and a rank still saving a checkpoint on
     * SIGINT must not be cut off by a SIGTERM). */
    const bool after_signal = gw__run.got_signal != 0;
    if (after_signal && WIFSIGNALED(status) && WTERMSIG(status) == gw__run.got_signal)
        return;
    /* Nor one that exits with 128 + that signal, as a shell's trap or a
     * program saying it was interrupted does (exit 130 after SIGINT). */
    if (after_signal && WIFEXITED(status) && code == 128 + gw__run.got_signal)
        return;
    /* Print the rank's last words (often the reason it failed) before our
     * verdict: what its pipes hold (non-blocking), and no more than that
     * much (a grandchild still writing there must not keep us here). */
    for (int k = 0; k < 2; k++)
        for (int reads = 0; reads < 64 && gw__run_pump(r, &r->s[k]); reads++) {
        }
    if (WIFEXITED(status))
        gw__run_say("gw-run: rank %d (pid %ld) exited with code %d\n", r->global, (long)pid,
                code);
    else
        gw__run_say("gw-run: rank %d (pid %ld) was killed by signal %d (%s)\n", r->global,
                (long)pid, WTERMSIG(status), gw__run_signal_name(WTERMSIG(status)));
    gw__run_logs_say_hidden((int)(r - gw__run.ranks), r->global, r->prefix);
    const char *err_log = gw__run_logs_file_only((int)(r - gw__run.ranks), 1);
    if (err_log) /* its last words (a program not found, too) went there alone */
        gw__run_say("gw-run: rank %d's stderr is in %s\n", r->global, err_log);
    if (!gw__run.have_failure) {
        gw__run.have_failure = true;
        gw__run.exit_code = code;
        gw__run.fail_weight = WIFSIGNALED(status) ? 2 : 1;
        gw__run_cause_named(r->global, recorded);
        if (!after_signal)
            gw__run_say_done_before(r->global);
        /* After a signal the ranks' deaths are its consequence, not news for
         * the other nodes, which got the signal itself as a STOP. */
        if (!after_signal) {
            gw__run_net_rank_failed(r->global, WIFSIGNALED(status),
                                    WIFSIGNALED(status) ? WTERMSIG(status) : code, recorded);
            gw__run_teardown();
        }
    }
}

static int cmp_pid_index(const void *a, const void *b)
{
    pid_t x = ((const struct pid_index *)a)->pid, y = ((const struct pid_index *)b)->pid;
    return (x > y) - (x < y);
}

/* Called once the ranks are spawned, with signals unblocked again. */
void gw__run_index_ranks(void)
{
    pid_index = calloc((size_t)gw__run.nranks + 1, sizeof *pid_index);
    exited = calloc((size_t)gw__run.nranks + 1, sizeof *exited);
    if (!pid_index || !exited) {
        gw__run_say("gw-run: out of memory\n");
        for (int i = 0; i < gw__run.nranks; i++)
            if (gw__run.ranks[i].pid > 0)
                kill(gw__run.ranks[i].pid, SIGKILL);
        exit(1);
    }
    for (int i = 0; i < gw__run.nranks; i++)
        pid_index[i] = (struct pid_index){.pid = gw__run.ranks[i].pid, .rank = i};
    qsort(pid_index, (size_t)gw__run.nranks, sizeof *pid_index, cmp_pid_index);
}

bool gw__run_is_rank(pid_t pid)
{
    struct pid_index key = {.pid = pid, .rank = 0};
    const struct pid_index *hit =
        bsearch(&key, pid_index, (size_t)gw__run.nranks, sizeof *pid_index, cmp_pid_index);
    return hit && gw__run.ranks[hit->rank].pid == pid;
}

/* How much an exit says about the job's failure: a death by a signal is
 * most likely its cause (a crash, the OOM killer), a nonzero exit more likely
 * a rank that saw another fail. */
static int exit_weight(int status)
{
    return WIFSIGNALED(status) ? 2 : WIFEXITED(status) && WEXITSTATUS(status) ? 1 : 0;
}

/* Collects every exited child: ranks are accounted for, strays only reaped.
 * All that exited by now are collected before any is judged, so the one
 * reported as the job's failure is the likeliest cause among them (a crash
 * over a peer's exit 1, which waitpid's order, the ranks' fork order, would
 * otherwise put first), and each failure among them is reported (the
 * teardown the first one starts marks only ranks still running). */
static int collect_exited(int n)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            break;
        struct pid_index key = {.pid = pid, .rank = 0};
        const struct pid_index *hit =
            bsearch(&key, pid_index, (size_t)gw__run.nranks, sizeof *pid_index, cmp_pid_index);
        if (hit && gw__run.ranks[hit->rank].pid == pid) {
            struct rank *r = &gw__run.ranks[hit->rank];
            r->pid = 0;
            gw__run.alive--;
            exited[n++] = (struct exited){r, pid, status};
        }
    }
    return n;
}

/* Whether a rank still running is on its way out (the kernel's PF_EXITING in
 * /proc/<pid>/stat's flags, or a zombie not yet collected). */
static bool rank_dying(void)
{
    for (int i = 0; i < gw__run.nranks; i++) {
        const pid_t pid = gw__run.ranks[i].pid;
        if (pid <= 0)
            continue;
        char st[1024];
        const char *fields = gw__run_proc_stat_fields(pid, st, sizeof st);
        char state = 0;
        unsigned long flags = 0;
        if (fields && sscanf(fields, "%c %*d %*d %*d %*d %*d %lu", &state, &flags) == 2 &&
            (state == 'Z' || state == 'X' || (flags & 0x4 /* PF_EXITING */)))
            return true;
    }
    return false;
}

void gw__run_reap(void)
{
    static bool reaping; /* rank_exited's teardown must not reap again into exited[] */
    if (reaping)
        return;
    reaping = true;
    int n = collect_exited(0);
    /* A rank killed by a signal closes its files (its peers see it gone and
     * may exit 1 at once) before it can be collected: such a peer's exit
     * came first about 8 runs in 100 of a rank killed during setup, and was
     * the job's failure, exit code 1, the crash reported after it.  So a
     * first failure that is an exit with a code waits, while a rank is
     * dying, for it (at most half a second); not where a rank that exited
     * recorded the failure as its own (gradwire's record: a rank that failed
     * of itself and whose peer then crashed of it stays the failure). */
    int heaviest = 0;
    bool own = false;
    for (int i = 0; i < n; i++) {
        heaviest = exit_weight(exited[i].status) > heaviest ? exit_weight(exited[i].status) : heaviest;
        own |= exit_weight(exited[i].status) == 1 && gw__run_cause_own(exited[i].r->global);
    }
    if (heaviest == 1 && !own && !gw__run.have_failure && !gw__run.got_signal) {
        for (const int64_t until = gw__run_now_ms() + 500; gw__run_now_ms() < until && rank_dying();) {
            const struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
            n = collect_exited(n);
        }
    }
    for (int i = 1; i < n; i++) /* insertion sort by weight, stable: a few at a time */
        for (int j = i; j > 0 && exit_weight(exited[j].status) > exit_weight(exited[j - 1].status); j--) {
            struct exited t = exited[j];
            exited[j] = exited[j - 1], exited[j - 1] = t;
        }
    for (int i = 0; i < n; i++)
        rank_exited(exited[i].r, exited[i].pid, exited[i].status);
    reaping = false;
}

/* Whether pid is one of the ranks gw-run started in this attempt (alive or
 * not), for gw__run_remove_leftover_shm. */
bool gw__run_started_pid(pid_t pid)
{
    struct pid_index key = {.pid = pid};
    return pid_index && bsearch(&key, pid_index, (size_t)gw__run.nranks, sizeof *pid_index, cmp_pid_index);
}

/* Forgets the attempt's index (gw__run_teardown_reset). */
void gw__run_reap_reset(void)
{
    free(pid_index);
    free(exited);
    pid_index = NULL, exited = NULL;
}
