/*
 * gw-run-logs.c: the ranks' log files (--log-dir, --tee, --redirects), as
 * torchrun writes them.
 *
 * What it is: parsing torchrun's stream selections ("3", or "0:1,2:3" by
 * local rank), making each run's own directory under --log-dir (as torchrun's
 * RUNID_RANDOM: DIR/YYYYmmdd-HHMMSS-XXXXXX, with -nodeN across nodes, so a
 * job resubmitted with the same DIR, or the nodes of one job sharing it, never
 * meet a log already there), opening each rank's files at each attempt
 * (RUN/attempt_K/RANK/stdout.log and stderr.log, RANK the global rank),
 * writing what a rank prints there byte for byte, unprefixed, and saying when
 * a file cannot be written any more (its bytes then go to the console: a full
 * disk loses no line a rank printed, and does not stop the job).
 *
 * A stream is teed (file and console, --tee, and every stream with --log-dir
 * alone) or redirected (file only, --redirects); tee wins where both name it.
 * torchrun writes no file with --log-dir alone; gw-run tees both streams then
 * (a torchrun command line with --tee 3 gives the same files either way).
 *
 * What it is not: it reads no pipe and writes no console line (gw-run-io.c
 * does, and asks here whether a stream is teed, redirected or neither).
 * Files are written from gw-run's loop: a local disk's page cache takes a
 * write at once, a hung network file system would hold the loop.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/stat.h>

#include "gw-run.h"

enum { TO_FILE = 1, TO_CONSOLE = 2, TAIL = 2048 };

/* The end of a hidden rank's stderr (--local-ranks-filter), for the report
 * if it fails. */
struct tail {
    char b[TAIL];
    size_t len;
    bool cut; /* b starts inside a line (what came before it is gone) */
};

static struct {
    bool on;                 /* a stream goes to a file */
    const char *base;        /* --log-dir, or NULL: $TMPDIR */
    char *dir;               /* this run's directory, made by gw__run_logs_start */
    int local_n, node_rank, nnodes;
    unsigned char *where;    /* [local * 2 + k]: TO_FILE | TO_CONSOLE */
    bool *broken;            /* [local * 2 + k]: its file failed this attempt: to the console */
    int *fd;                 /* [local * 2 + k]: the open log file, -1 none */
    char **path;             /* [local * 2 + k]: its name, for messages */
    bool *shown;             /* [local]: its lines reach the console; NULL: every rank's do */
    struct tail *tail;       /* [local]: the end of a hidden rank's stderr this attempt */
} L;

/* torchrun's Std: one of 0 (none), 1 (stdout), 2 (stderr), 3 (both) for
 * every local rank, or LOCAL:V pairs separated by commas (ranks not named:
 * 0; ranks past -n ignored, as torchrun does; one named twice refused).
 * Fills mask[local]; false with the reason in err. */
static bool parse_std(const char *flag, const char *v, int local_n, unsigned char *mask, char *err, size_t errsz)
{
    if (v[0] >= '0' && v[0] <= '3' && v[1] == '\0') {
        memset(mask, v[0] - '0', (size_t)local_n);
        return true;
    }
    memset(mask, 0, (size_t)local_n);
    bool *seen = calloc((size_t)local_n, 1);
    const char *p = v;
    bool ok = seen != NULL && *p != '\0';
    long past = -1; /* the first local rank named past -n */
    int npast = 0;
    while (ok && *p) {
        char *end;
        errno = 0;
        const long r = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1;
        ok = r >= 0 && errno == 0 && *end == ':' && end[1] >= '0' && end[1] <= '3' &&
             (end[2] == ',' || end[2] == '\0') && !(end[2] == ',' && end[3] == '\0');
        if (!ok)
            break;
        if (r < local_n && seen[r]) {
            snprintf(err, errsz, "%s '%s': local rank %ld is named twice", flag, v, r);
            free(seen);
            return false;
        }
        if (r < local_n) {
            seen[r] = true;
            mask[r] = (unsigned char)(end[1] - '0');
        } else if (npast++ == 0) {
            past = r;
        }
        p = end[2] ? end + 3 : end + 2;
    }
    free(seen);
    if (!ok)
        snprintf(err, errsz, "%s must be 0 (no stream), 1 (stdout), 2 (stderr) or 3 (both), for every rank or as "
                 "LOCAL_RANK:VALUE pairs separated by commas (e.g. 0:3,1:2), not '%s'", flag, v);
    else if (npast) /* accepted as torchrun's, but said: no file came of it, and nothing told why */
        gw__run_say("gw-run: note: %s '%s' names local rank %ld%s, past -n %d (local ranks 0-%d): ignored, as "
                    "torchrun ignores %s\n", flag, v, past, npast > 1 ? " and others" : "", local_n, local_n - 1,
                    npast > 1 ? "them" : "it");
    return ok;
}

/* mkdir -p; errno set on failure. */
static bool make_dirs(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return false;
    }
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            const char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return false;
            *p = c;
            if (c == '\0')
                break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0)
        return false;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return false;
    }
    return true;
}

int gw__run_logs_setup(const char *dir, const char *tee, const char *redirects, const char *filter, int local_n,
                       int node_rank, int nnodes, char *err, size_t errsz)
{
    if (filter) {
        L.shown = calloc((size_t)local_n, sizeof *L.shown);
        L.tail = calloc((size_t)local_n, sizeof *L.tail);
        if (!L.shown || !L.tail) {
            snprintf(err, errsz, "out of memory");
            return 1;
        }
        if (!gw__run_parse_ranks_filter(filter, local_n, L.shown, err, errsz))
            return -2;
        int shown = 0;
        for (int i = 0; i < local_n; i++)
            shown += L.shown[i];
        if (!shown) /* accepted as torchrun's, but said: the job looked silent */
            gw__run_say("gw-run: note: --local-ranks-filter %s names no local rank of -n %d (0-%d): every rank's "
                        "output is hidden (a failing rank's last stderr lines are still shown)\n", filter, local_n,
                        local_n - 1);
    }
    if (!dir && !tee && !redirects)
        return 0;
    if (dir && !*dir) {
        snprintf(err, errsz, "--log-dir must name a directory, not ''");
        return -2;
    }
    L.local_n = local_n, L.node_rank = node_rank, L.nnodes = nnodes, L.base = dir;
    unsigned char *t = calloc((size_t)local_n, 1), *r = calloc((size_t)local_n, 1);
    L.where = calloc((size_t)local_n * 2, 1);
    L.fd = malloc((size_t)local_n * 2 * sizeof *L.fd);
    L.path = calloc((size_t)local_n * 2, sizeof *L.path);
    L.broken = calloc((size_t)local_n * 2, sizeof *L.broken);
    if (!t || !r || !L.where || !L.fd || !L.path || !L.broken) {
        snprintf(err, errsz, "out of memory");
        return 1;
    }
    if ((tee && !parse_std("--tee", tee, local_n, t, err, errsz)) ||
        (redirects && !parse_std("--redirects", redirects, local_n, r, err, errsz))) {
        free(t), free(r);
        return -2;
    }
    if (!tee && !redirects)
        memset(t, 3, (size_t)local_n); /* --log-dir alone: both streams, and the console as before */
    for (int i = 0; i < local_n * 2; i++) {
        const unsigned bit = 1u << (i % 2);
        L.fd[i] = -1;
        L.where[i] = (unsigned char)(((t[i / 2] | r[i / 2]) & bit ? TO_FILE : 0) |
                                     ((t[i / 2] & bit) || !(r[i / 2] & bit) ? TO_CONSOLE : 0));
        L.on |= (L.where[i] & TO_FILE) != 0;
    }
    free(t), free(r);
    return 0;
}

/* Makes this run's directory (none where no stream goes to a file). */
int gw__run_logs_start(int node_rank, char *err, size_t errsz)
{
    L.node_rank = node_rank;
    if (!L.on)
        return 0;
    const char *tmp = getenv("TMPDIR");
    const char *base = L.base ? L.base : tmp && *tmp ? tmp : "/tmp";
    if (L.base && !make_dirs(L.base)) {
        snprintf(err, errsz, "--log-dir %s: cannot make that directory: %s", L.base, strerror(errno));
        return 1;
    }
    char stamp[32], node[24] = "", templ[4200];
    const time_t now = time(NULL);
    struct tm tm;
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime_r(&now, &tm));
    if (L.nnodes > 1)
        snprintf(node, sizeof node, "-node%d", L.node_rank);
    snprintf(templ, sizeof templ, "%s/%s%s%s-XXXXXX", base, L.base ? "" : "gw-run-logs-", stamp, node);
    if (!mkdtemp(templ) || !(L.dir = strdup(templ))) {
        snprintf(err, errsz, "%scannot make the log directory %s: %s",
                 L.base ? "" : "--tee/--redirects without --log-dir: ", templ, strerror(errno));
        return 1;
    }
    gw__run_say("gw-run: the ranks' output logged in %s/attempt_K/RANK/{stdout,stderr}.log (K the restart, RANK "
                "the global rank)\n", L.dir);
    return 0;
}

bool gw__run_logs_on(void)
{
    return L.on;
}

/* The file a stream goes to alone (redirected), or NULL. */
const char *gw__run_logs_file_only(int local, int k)
{
    const int i = local * 2 + k;
    return L.dir && !(L.where[i] & TO_CONSOLE) && !L.broken[i] ? L.path[i] : NULL;
}

bool gw__run_logs_open(int local, int global, long attempt, char *why, size_t whysz)
{
    if (L.tail)
        L.tail[local].len = 0, L.tail[local].cut = false;
    if (!L.dir)
        return true;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/attempt_%ld/%d", L.dir, attempt, global);
    bool made = false;
    for (int k = 0; k < 2; k++) {
        const int i = local * 2 + k;
        L.fd[i] = -1;
        L.broken[i] = false;
        if (!(L.where[i] & TO_FILE))
            continue;
        if (!made && !make_dirs(dir)) {
            snprintf(why, whysz, "cannot make the log directory %s for rank %d: %s", dir, global, strerror(errno));
            gw__run_logs_close(local, 0);
            return false;
        }
        made = true;
        free(L.path[i]);
        L.path[i] = malloc(strlen(dir) + 16);
        if (!L.path[i]) {
            snprintf(why, whysz, "out of memory");
            gw__run_logs_close(local, 0);
            return false;
        }
        sprintf(L.path[i], "%s/%s", dir, k == 0 ? "stdout.log" : "stderr.log");
        L.fd[i] = open(L.path[i], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_APPEND, 0644);
        if (L.fd[i] < 0) {
            snprintf(why, whysz, "cannot create the log file %s for rank %d: %s", L.path[i], global,
                     strerror(errno));
            gw__run_logs_close(local, 0);
            gw__run_logs_close(local, 1);
            return false;
        }
    }
    return true;
}

/* Whether --local-ranks-filter hides local rank `local` from the console. */
static bool gw__run_logs_hidden(int local)
{
    return L.shown && !L.shown[local];
}

/* Writes n bytes to a stream's log file; returns how many of them the
 * console skips (n where the stream is redirected, else 0).  A file that
 * cannot take them (a full disk, ulimit -f) is closed, said once, and what it
 * did not take goes to the console, as its stream's lines from then on. */
static size_t file_write(int local, int k, int global, const char *p, size_t n)
{
    if (!L.dir)
        return 0;
    const int i = local * 2 + k;
    size_t done = 0;
    while (L.fd[i] >= 0 && done < n) {
        ssize_t w = write(L.fd[i], p + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            gw__run_say("gw-run: cannot write %s: %s; rank %d's %s goes to the console from here on\n", L.path[i],
                        w < 0 ? strerror(errno) : "nothing written", global, k == 0 ? "stdout" : "stderr");
            close(L.fd[i]);
            L.fd[i] = -1;
            L.broken[i] = true;
            break;
        }
        done += (size_t)w;
    }
    if (L.where[i] & TO_CONSOLE)
        return 0;
    return L.broken[i] ? done : n;
}

/* The file's part, then --local-ranks-filter's: a hidden rank's console
 * skips everything, the end of its stderr kept. */
size_t gw__run_logs_write(int local, int k, int global, const char *p, size_t n)
{
    const size_t skip = file_write(local, k, global, p, n);
    if (!gw__run_logs_console_skips(local, k))
        return skip; /* shown, or its file failed: said to go to the console, and it does */
    struct tail *t = &L.tail[local];
    if (k == 1 && n >= TAIL) {
        t->cut = n > TAIL ? p[n - TAIL - 1] != '\n' : t->len > 0 && t->b[t->len - 1] != '\n';
        memcpy(t->b, p + n - TAIL, TAIL);
        t->len = TAIL;
    } else if (k == 1) {
        const size_t drop = t->len + n > TAIL ? t->len + n - TAIL : 0;
        if (drop)
            t->cut = t->b[drop - 1] != '\n';
        memmove(t->b, t->b + drop, t->len - drop);
        memcpy(t->b + t->len - drop, p, n);
        t->len += n - drop;
    }
    return n;
}

bool gw__run_logs_console_skips(int local, int k)
{
    return gw__run_logs_hidden(local) && !(L.dir && L.broken[local * 2 + k]);
}

void gw__run_logs_say_hidden(int local, int global, const char *prefix)
{
    if (!gw__run_logs_hidden(local) || !L.tail[local].len)
        return;
    struct tail *t = &L.tail[local];
    char *s = t->b;
    const char *end = t->b + t->len;
    for (char *c = s; c < end; c++) /* printed as text: a NUL would end its line */
        *c = *c ? *c : '?';
    if (t->cut) { /* from the first whole line */
        char *nl = memchr(s, '\n', t->len);
        s = nl && nl + 1 < end ? nl + 1 : s;
    }
    gw__run_say("gw-run: rank %d's last stderr lines (hidden by --local-ranks-filter):\n", global);
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const int len = (int)((nl ? nl : end) - s);
        gw__run_say("%s%.*s\n", prefix, len, s);
        s += len + (nl != NULL);
    }
}

void gw__run_logs_close(int local, int k)
{
    if (!L.dir)
        return;
    const int i = local * 2 + k;
    if (L.fd[i] >= 0)
        close(L.fd[i]);
    L.fd[i] = -1;
}
