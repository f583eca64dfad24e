/*
 * gw-run-cause.c: naming the rank a failed job's failure began at.
 *
 * gw-run names the first rank it sees fail.  That is often not the one at
 * fault: a rank that gives up for a reason of its own tells its peers
 * (libgradwire's failure notice), they fail at once with "another rank
 * failed" and exit, while it is still cleaning up, saving or printing; the
 * teardown then stops it.  So each rank gets GW_ERROR_FILE, a file of its own
 * in a folder gw-run makes (as torchelastic's agent gives each worker
 * TORCHELASTIC_ERROR_FILE), where libgradwire writes the process's first
 * failure: its own finding ("origin") or news of another's ("consequence"),
 * with the wall-clock time (comm/failrec.c; gw_record_failure for the
 * program's own reasons).  gw-run reads a rank's record when it exits and,
 * once the attempt is over, says the earliest origin when that is not the
 * rank it named and came before it.  Across machines each node sends its
 * ranks' origins to node 0 (a CAUSE frame), whose verdict is the job's; the
 * machines' clocks then order them (NTP keeps them within milliseconds, far
 * less than a failure takes to spread).  After a signal nothing is said: the
 * signal is the cause.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gw-run.h"
#include "gw-run-net.h"

static char dir[4096]; /* the records' folder; "" when none could be made */

struct cause {
    bool have;
    int64_t us; /* wall clock, microseconds */
    int global, node;
    long pid;
    char host[256];
    char msg[GW_RUN_MAX_STR + 1];
};
static struct cause first;
/* The failure gw-run named first (or corrected to: a crash): its rank (-1:
 * no rank's, a lost node or a launcher's failure) and when gw-run heard of it. */
static bool named;
static int named_rank = -1;
static int64_t named_us;

static int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void empty_dir(void)
{
    DIR *d = dir[0] ? opendir(dir) : NULL;
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
}

static void remove_dir(void)
{
    empty_dir();
    if (dir[0])
        rmdir(dir);
    dir[0] = '\0';
}

void gw__run_cause_init(void)
{
    const char *tmp = getenv("TMPDIR");
    for (int i = 0; i < 2 && !dir[0]; i++) {
        snprintf(dir, sizeof dir, "%s/gw-run-XXXXXX", i == 0 && tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir))
            dir[0] = '\0';
    }
    /* Without one the failure is named by exit order alone, as before. */
    if (dir[0])
        atexit(remove_dir);
}

void gw__run_cause_cleanup(void)
{
    remove_dir();
}

void gw__run_cause_env(int global)
{
    char path[4200];
    if (!dir[0]) {
        unsetenv("GW_ERROR_FILE"); /* ranks sharing one given to gw-run would write over each other */
        return;
    }
    snprintf(path, sizeof path, "%s/rank.%d", dir, global);
    setenv("GW_ERROR_FILE", path, 1);
}

static void consider(const struct cause *c)
{
    if (!first.have || c->us < first.us)
        first = *c;
}

/* "gw-failure 1 TAB origin TAB SECONDS.MICROS TAB PID TAB MESSAGE\n": the
 * origin's time, pid and message; false for anything else (a consequence, a
 * short write, another format). */
static bool parse(char *line, struct cause *c)
{
    char *nl = strchr(line, '\n');
    if (strncmp(line, "gw-failure 1\torigin\t", 20) != 0 || !nl)
        return false;
    *nl = '\0';
    char *p = line + 20, *end;
    errno = 0;
    const long long s = strtoll(p, &end, 10);
    if (end == p || *end != '.' || s < 0 || s > 4000000000ll)
        return false;
    p = end + 1;
    const long us = strtol(p, &end, 10);
    if (end == p || *end != '\t' || us < 0 || us > 999999)
        return false;
    p = end + 1;
    c->pid = strtol(p, &end, 10);
    if (end == p || *end != '\t' || c->pid <= 0)
        return false;
    c->us = (int64_t)s * 1000000 + us;
    snprintf(c->msg, sizeof c->msg, "%s", end + 1);
    return true;
}

void gw__run_cause_read(int global, bool failed)
{
    if (!dir[0])
        return;
    char path[4200], buf[GW_RUN_MAX_STR + 128];
    snprintf(path, sizeof path, "%s/rank.%d", dir, global);
    const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return;
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    unlink(path);
    struct cause c = {.have = true, .global = global, .node = net.on ? net.cfg.node : 0};
    if (!failed || n <= 0)
        return;
    buf[n] = '\0';
    if (!parse(buf, &c))
        return;
    snprintf(c.host, sizeof c.host, "%s", net.on ? net.myhost : "");
    consider(&c);
    if (net.on && net.cfg.node != 0) { /* node 0 decides; the frame goes before this node's READY or end */
        struct msg m = {.type = F_CAUSE,
                        .v = {(uint32_t)global, (uint32_t)net.cfg.node, (uint32_t)c.pid,
                              (uint32_t)(c.us / 1000000), (uint32_t)(c.us % 1000000)}};
        snprintf(m.s, sizeof m.s, "%s", c.msg);
        gw__run_net_report(&m);
    }
}

void gw__run_cause_heard(const struct msg *m, const char *host)
{
    struct cause c = {.have = true, .us = (int64_t)m->v[3] * 1000000 + m->v[4], .global = (int)m->v[0],
                      .node = (int)m->v[1], .pid = (long)m->v[2]};
    snprintf(c.host, sizeof c.host, "%s", host ? host : "?");
    snprintf(c.msg, sizeof c.msg, "%s", m->s);
    consider(&c);
}

void gw__run_cause_named(int global)
{
    named = true;
    named_rank = global;
    named_us = wall_us();
}

void gw__run_cause_say(void)
{
    const bool judge = !net.on || net.cfg.node == 0;
    if (judge && gw__run.have_failure && !gw__run.got_signal && first.have && named && first.global != named_rank &&
        first.us <= named_us) {
        char who[400], when[160];
        if (net.on)
            snprintf(who, sizeof who, "rank %d on node %d (host %s, pid %ld", first.global, first.node, first.host,
                     first.pid);
        else
            snprintf(who, sizeof who, "rank %d (pid %ld", first.global, first.pid);
        char ahead[32];
        const int64_t us = named_us - first.us;
        if (us < 1000000)
            snprintf(ahead, sizeof ahead, "%lld ms", (long long)((us + 500) / 1000));
        else
            snprintf(ahead, sizeof ahead, "%.1f s", (double)us / 1e6);
        if (named_rank >= 0)
            snprintf(when, sizeof when, "%s before rank %d's failure above", ahead, named_rank);
        else
            snprintf(when, sizeof when, "%s before the failure above", ahead);
        gw__run_say("gw-run: the failure began at %s, %s): %s\n", who, when, first.msg);
    }
    first.have = false;
    named = false;
    named_rank = -1;
    empty_dir(); /* what a rank's leftover child wrote: not the next attempt's */
}
