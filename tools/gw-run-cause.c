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
 * once the attempt is over, says the earliest origin when the rank it named
 * recorded none of its own and the origin came before it.  Across machines
 * the FAIL frame says what the failed rank recorded and each node sends its
 * earliest origin to node 0 (one CAUSE frame), whose verdict is the job's;
 * the machines' clocks then order them (NTP keeps them within milliseconds,
 * far less than a failure takes to spread).  After a signal nothing is said:
 * the signal is the cause.  A PyTorch program's exception under @record
 * comes through TORCHELASTIC_ERROR_FILE (read_torch_record).
 * docs/architecture.md, "Where a failure began".
 */
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gw-run.h"
#include "gw-run-net.h"
#include "utf8.h"

static char dir[4096]; /* the records' folder; "" when none could be made */

struct cause {
    bool have;
    int64_t us; /* wall clock, microseconds */
    int global, node;
    long pid;
    char host[256];
    char msg[GW_RUN_MAX_STR + 1];
};
static struct cause first; /* the earliest origin heard this attempt */
static bool sent;          /* the other nodes: this attempt's earliest went to node 0 */
/* The failure gw-run named first (or corrected to: a crash): its rank (-1:
 * no rank's, a lost node or a launcher's failure), what that rank recorded
 * and when gw-run heard of it. */
static bool named;
static int named_rank = -1, named_kind;
static int64_t named_us;
static bool signal_first; /* a signal to the job came before the failure named: that is the job's end */

static int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag;
    if (ftw->level > 0) /* the folder itself stays */
        remove(path);
    return 0;
}

/* What the ranks (or their children: a folder, files in it) left there. */
static void empty_dir(void)
{
    if (dir[0])
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
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
    /* An absolute TMPDIR (a rank that changes directory must still find its
     * file) with room for the files' names; else /tmp. */
    const char *tmp = getenv("TMPDIR");
    const bool usable = tmp && tmp[0] == '/' && strlen(tmp) < 3000;
    for (int i = usable ? 0 : 1; i < 2 && !dir[0]; i++) {
        snprintf(dir, sizeof dir, "%s/gw-run-XXXXXX", i == 0 ? tmp : "/tmp");
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
    /* torchelastic's, for a PyTorch program's @record (read_torch_record) */
    snprintf(path, sizeof path, "%s/rank.%d.json", dir, global);
    setenv("TORCHELASTIC_ERROR_FILE", path, 1);
}

static void consider(const struct cause *c)
{
    if (!first.have || c->us < first.us)
        first = *c;
}

/* "gw-failure 1 TAB origin|consequence TAB SECONDS.MICROS TAB PID TAB
 * MESSAGE\n": the record's kind (GW_RUN_CAUSE_ORIGIN, _CONSEQUENCE), and an
 * origin's time, pid and message (control characters made '?', as the frames
 * make them; an empty one said so); GW_RUN_CAUSE_NONE for anything else (a
 * short write, another format). */
static int parse(char *line, struct cause *c)
{
    char *nl = strchr(line, '\n');
    const bool origin = !strncmp(line, "gw-failure 1\torigin\t", 20);
    if (!nl || (!origin && strncmp(line, "gw-failure 1\tconsequence\t", 25)))
        return GW_RUN_CAUSE_NONE;
    *nl = '\0';
    char *p = line + (origin ? 20 : 25), *end;
    const long long s = strtoll(p, &end, 10);
    if (end == p || *end != '.' || s < 0 || s > 4000000000ll)
        return GW_RUN_CAUSE_NONE;
    p = end + 1;
    const long us = strtol(p, &end, 10);
    if (end == p || *end != '\t' || us < 0 || us > 999999)
        return GW_RUN_CAUSE_NONE;
    p = end + 1;
    c->pid = strtol(p, &end, 10);
    if (end == p || *end != '\t' || c->pid <= 0)
        return GW_RUN_CAUSE_NONE;
    c->us = (int64_t)s * 1000000 + us;
    snprintf(c->msg, sizeof c->msg, "%s", end[1] ? end + 1 : "(an empty message)");
    for (char *q = c->msg; *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7f)
            *q = '?';
    return origin ? GW_RUN_CAUSE_ORIGIN : GW_RUN_CAUSE_CONSEQUENCE;
}

/* A message being decoded into out[cap]: it ends at the first character
 * that does not fit (full; "..." then marks the cut), so nothing is dropped
 * from its middle and no character is cut in two. */
struct text {
    char *out;
    size_t cap, k;
    bool full;
};

static void put_bytes(struct text *t, const char *b, size_t n)
{
    if (t->full || t->k + n + 4 > t->cap) /* room for "..." and the NUL stays */
        t->full = true;
    else
        memcpy(t->out + t->k, b, n), t->k += n;
}

/* Code point u as UTF-8 (control characters, lone surrogates: '?'). */
static void put_code(struct text *t, unsigned long u)
{
    char b[4];
    if (u < 0x20 || u == 0x7f || (u >= 0xd800 && u < 0xe000) || u > 0x10ffff)
        u = '?';
    put_bytes(t, b, (size_t)(gw__put_utf8(b, (unsigned)u) - b));
}

/* The 4 hex digits at p as a number, or -1. */
static long hex4(const char *p)
{
    unsigned v;
    return gw__hex4(p, p + strnlen(p, 4), &v) == 0 ? (long)v : -1;
}

static const char *skip_ws(const char *p)
{
    return p + strspn(p, " \t\r\n");
}

/* p at `"key"` (after white space) followed by ':': what follows the colon
 * and its white space, else NULL. */
static const char *after_key(const char *p, const char *key)
{
    const size_t len = strlen(key);
    p = skip_ws(p);
    if (*p != '"' || strncmp(p + 1, key, len) || p[1 + len] != '"')
        return NULL;
    p = skip_ws(p + 2 + len);
    return *p == ':' ? skip_ws(p + 1) : NULL;
}

/* The message of a torchelastic error file as torch.distributed.elastic's
 * @record writes it (json.dump of {"message": {"message": "RuntimeError:
 * ...", "extraInfo": {"py_callstack": ..., "timestamp": "SECONDS"}}}; the
 * timestamp is whole seconds, the file's own time is finer), or in the
 * other form torch reads, {"message": "...", "timestamp": N}: its JSON
 * escapes undone (\uXXXX, surrogate pairs too, to UTF-8; json.dump escapes
 * every non-ASCII character), control characters made '?' (a multi-line
 * message is one line), cut with "..." where out is full or the text read
 * (cut: buf holds only the file's start) ends inside it; false for anything
 * else. */
static bool torch_message(const char *buf, bool cut, char *out, size_t cap)
{
    const char *p = skip_ws(buf);
    if (*p++ != '{' || !(p = after_key(p, "message")))
        return false;
    if (*p == '{' && !(p = after_key(p + 1, "message")))
        return false;
    if (*p++ != '"')
        return false;
    struct text t = {.out = out, .cap = cap};
    for (; *p && *p != '"' && !t.full; p++) {
        const unsigned char c = (unsigned char)*p;
        if (c == '\\') {
            const char e = *++p;
            static const char plain[] = "\"\\/", ctrl[] = "bfnrt";
            long u = -1;
            if (e && strchr(plain, e)) {
                u = (unsigned char)e;
            } else if (e && strchr(ctrl, e)) {
                u = '?';
            } else if (e == 'u' && (u = hex4(p + 1)) >= 0) {
                p += 4;
                const long lo = u >= 0xd800 && u < 0xdc00 && p[1] == '\\' && p[2] == 'u' ? hex4(p + 3) : -1;
                if (lo >= 0xdc00 && lo < 0xe000) /* a pair: one character past the 16-bit ones */
                    u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00), p += 6;
            }
            if (u < 0) {
                if (cut && !p[e ? 1 + strspn(p + 1, "0123456789abcdefABCDEF") : 0])
                    break; /* an escape the read cut short */
                return false;
            }
            put_code(&t, (unsigned long)u);
        } else if (c < 0x20) {
            return false; /* not JSON */
        } else if (c < 0x80) {
            put_bytes(&t, c == 0x7f ? "?" : (const char *)p, 1);
        } else { /* a UTF-8 character as it is, whole, or '?' */
            const size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
            size_t ok = 1;
            while (ok < n && ((unsigned char)p[ok] & 0xc0) == 0x80)
                ok++;
            if (ok == n && n > 1)
                put_bytes(&t, p, n), p += n - 1;
            else if (cut && !p[ok])
                break; /* a character the read cut short */
            else
                put_bytes(&t, "?", 1);
        }
    }
    const bool ended = *p == '"' && !t.full;
    if (!ended && !t.full && !cut)
        return false;
    if (!ended)
        memcpy(out + t.k, "...", 3), t.k += 3;
    out[t.k] = '\0';
    if (!t.k)
        snprintf(out, cap, "(an empty message)");
    return true;
}

/* The rank's torchelastic error file, read once its GW_ERROR_FILE held no
 * record: a PyTorch program's exception under @record is its own finding,
 * an origin as of the file's last change (a record gradwire's library wrote
 * wins: it knows what was its own). */
static int read_torch_record(int global, long pid, struct cause *c)
{
    char path[4200];
    static char buf[16384]; /* the message comes first; the traceback after it is not read */
    snprintf(path, sizeof path, "%s/rank.%d.json", dir, global);
    const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return GW_RUN_CAUSE_NONE;
    struct stat st;
    const bool stated = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    const ssize_t n = stated ? read(fd, buf, sizeof buf - 1) : -1;
    close(fd);
    unlink(path);
    if (n <= 0)
        return GW_RUN_CAUSE_NONE;
    buf[n] = '\0';
    if (!torch_message(buf, (size_t)n == sizeof buf - 1, c->msg, sizeof c->msg))
        return GW_RUN_CAUSE_NONE;
    c->us = (int64_t)st.st_mtim.tv_sec * 1000000 + st.st_mtim.tv_nsec / 1000;
    c->pid = pid;
    return GW_RUN_CAUSE_ORIGIN;
}

/* Rank global's record into buf (len - 1 bytes at most, not terminated),
 * removed once read when take; the bytes read, or -1. */
static ssize_t record_text(int global, char *buf, size_t len, bool take)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/rank.%d", dir, global);
    const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    const ssize_t n = fd < 0 ? -1 : read(fd, buf, len - 1);
    if (fd >= 0) {
        close(fd);
        if (take)
            unlink(path);
    }
    return n;
}

bool gw__run_cause_own(int global)
{
    char buf[GW_RUN_MAX_STR + 128];
    const ssize_t n = dir[0] ? record_text(global, buf, sizeof buf, false) : -1;
    if (n <= 0)
        return false;
    buf[n] = '\0';
    struct cause c;
    return parse(buf, &c) == GW_RUN_CAUSE_ORIGIN;
}

int gw__run_cause_read(int global, long pid, bool failed)
{
    if (!dir[0])
        return GW_RUN_CAUSE_NONE;
    char path[4200], buf[GW_RUN_MAX_STR + 128];
    struct cause c = {.have = true, .global = global, .node = net.on ? net.cfg.node : 0};
    const ssize_t n = record_text(global, buf, sizeof buf, true);
    int kind = GW_RUN_CAUSE_NONE;
    if (failed && n > 0) {
        buf[n] = '\0';
        kind = parse(buf, &c);
    }
    if (kind == GW_RUN_CAUSE_NONE) {
        /* The torchelastic file, if any, goes too.  An exception does not
         * say whether it was the rank's own finding or another's failure
         * reaching it (a peer's closed connection): the earliest is taken
         * for where the failure began (torchrun's "first observed
         * failure"), and the rank itself counts as having recorded nothing
         * of its own, so that an earlier one elsewhere is said. */
        const bool torch = read_torch_record(global, pid, &c) == GW_RUN_CAUSE_ORIGIN;
        if (failed && torch && !(named && c.us > named_us)) {
            snprintf(c.host, sizeof c.host, "%s", net.on ? net.myhost : "");
            consider(&c);
        }
        return GW_RUN_CAUSE_NONE;
    }
    snprintf(path, sizeof path, "%s/rank.%d.json", dir, global);
    unlink(path);
    if (!failed)
        return GW_RUN_CAUSE_NONE;
    /* Made after this node began stopping the job (a rank that aborts its
     * communicators on the teardown's SIGTERM, a timeout in its grace): a
     * consequence of the failure named, whatever the rank took it for. */
    if (kind == GW_RUN_CAUSE_ORIGIN && named && c.us > named_us)
        return GW_RUN_CAUSE_CONSEQUENCE;
    if (kind != GW_RUN_CAUSE_ORIGIN)
        return kind;
    snprintf(c.host, sizeof c.host, "%s", net.on ? net.myhost : "");
    consider(&c);
    return kind;
}

/* The other nodes, their ranks all gone: this attempt's earliest origin to
 * node 0, one frame (one per rank could fill the queue kept for node 0
 * before it welcomed this node, which then could never join). */
void gw__run_cause_send(void)
{
    if (!net.on || net.cfg.node == 0 || sent || !first.have)
        return;
    sent = true;
    struct msg m = {.type = F_CAUSE,
                    .v = {(uint32_t)first.global, (uint32_t)net.cfg.node, (uint32_t)first.pid,
                          (uint32_t)(first.us / 1000000), (uint32_t)(first.us % 1000000)}};
    snprintf(m.s, sizeof m.s, "%s", first.msg);
    gw__run_net_report(&m);
}

void gw__run_cause_heard(const struct msg *m, const char *host)
{
    struct cause c = {.have = true, .us = (int64_t)m->v[3] * 1000000 + m->v[4], .global = (int)m->v[0],
                      .node = (int)m->v[1], .pid = (long)m->v[2]};
    snprintf(c.host, sizeof c.host, "%s", host ? host : "?");
    snprintf(c.msg, sizeof c.msg, "%s", m->s);
    consider(&c);
}

void gw__run_cause_named(int global, int kind)
{
    if (!named) { /* the moment this node began stopping: later records are its consequences */
        named_us = wall_us();
        signal_first = gw__run.got_signal != 0;
    }
    named = true;
    named_rank = global;
    named_kind = kind;
}

void gw__run_cause_say(void)
{
    /* Said when the rank named failed of another's failure, or recorded
     * nothing (a program that exits without gradwire's word); not when it
     * failed of its own accord too (every rank refusing the same input, a
     * straggler's neighbours timing out: its own message says it).  Only
     * origins made before each node began stopping the job count
     * (gw__run_cause_read): those after are the teardown's consequences.
     * A signal to the job after the failure (a ^C to hurry the teardown)
     * leaves the failure's exit code, and so its line too. */
    const bool judge = !net.on || net.cfg.node == 0;
    if (judge && gw__run.have_failure && !signal_first && first.have && named && first.global != named_rank &&
        named_kind != GW_RUN_CAUSE_ORIGIN) {
        char who[400], when[160] = "", ahead[32];
        if (net.on)
            snprintf(who, sizeof who, "rank %d on node %d (host %s, pid %ld", first.global, first.node, first.host,
                     first.pid);
        else
            snprintf(who, sizeof who, "rank %d (pid %ld", first.global, first.pid);
        /* (a record a little after it by another machine's clock: no time) */
        const int64_t us = named_us - first.us;
        if (us < 1000000)
            snprintf(ahead, sizeof ahead, "%lld ms", (long long)((us + 500) / 1000));
        else
            snprintf(ahead, sizeof ahead, "%.1f s", (double)us / 1e6);
        if (us >= 0 && named_rank >= 0)
            snprintf(when, sizeof when, ", %s before rank %d's failure above", ahead, named_rank);
        else if (us >= 0)
            snprintf(when, sizeof when, ", %s before the failure above", ahead);
        gw__run_say("gw-run: the failure began at %s%s): %s\n", who, when, first.msg);
    }
    first.have = false;
    sent = false;
    named = false;
    named_rank = -1;
    named_kind = GW_RUN_CAUSE_NONE;
    empty_dir(); /* what a rank's leftover child wrote: not the next attempt's */
}
