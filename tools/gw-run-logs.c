/*
 * gw-run-logs.c: the ranks' log files (--log-dir, --tee, --redirects), as
 * torchrun writes them.
 *
 * What it is: parsing torchrun's stream selections ("3", or "0:1,2:3" by
 * local rank), making the log directory, refusing one that already holds
 * this node's ranks' logs (gw-run never overwrites a log), opening each
 * rank's files at each attempt (DIR/attempt_K/RANK/stdout.log and stderr.log,
 * RANK the global rank, so that the nodes of a job can share one directory),
 * writing what a rank prints there byte for byte, unprefixed, and saying when
 * a file cannot be written any more (its lines then go to the console: a full
 * disk loses no line a rank printed, and does not stop the job).
 *
 * A stream is teed (file and console, --tee, and every stream with --log-dir
 * alone) or redirected (file only, --redirects); tee wins where both name it.
 * torchrun writes no file with --log-dir alone; gw-run tees both streams then
 * (a torchrun command line with --tee 3 gives the same files either way).
 *
 * What it is not: it reads no pipe and writes no console line (gw-run-io.c
 * does, and asks here whether a stream is teed, redirected or neither).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/stat.h>

#include "gw-run.h"

enum { TO_FILE = 1, TO_CONSOLE = 2 };

static struct {
    char *dir;               /* NULL: no log files */
    int local_n, node_rank;
    unsigned char *where;    /* [local * 2 + k]: TO_FILE | TO_CONSOLE */
    bool *broken;            /* [local * 2 + k]: its file failed this attempt: to the console */
    int *fd;                 /* [local * 2 + k]: the open log file, -1 none */
    char **path;             /* [local * 2 + k]: its name, for messages */
} L;

/* torchrun's Std: one of 0 (none), 1 (stdout), 2 (stderr), 3 (both) for
 * every local rank, or LOCAL:V pairs separated by commas (ranks not named:
 * 0).  Fills mask[local]; false with the reason in err. */
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
    while (ok && *p) {
        char *end;
        errno = 0;
        long r = strtol(p, &end, 10);
        ok = end != p && *p != '-' && *p != '+' && errno == 0 && *end == ':' && end[1] >= '0' && end[1] <= '3' &&
             (end[2] == ',' || end[2] == '\0') && !(end[2] == ',' && end[3] == '\0');
        if (!ok)
            break;
        if (r >= local_n || seen[r]) {
            snprintf(err, errsz, "%s '%s': local rank %ld %s", flag, v, r,
                     r >= local_n ? "is not on this node (-n gives fewer)" : "is named twice");
            free(seen);
            return false;
        }
        seen[r] = true;
        mask[r] = (unsigned char)(end[1] - '0');
        p = end[2] ? end + 3 : end + 2;
    }
    free(seen);
    if (!ok)
        snprintf(err, errsz, "%s must be 0 (no stream), 1 (stdout), 2 (stderr) or 3 (both), for every rank or as "
                 "LOCAL_RANK:VALUE pairs separated by commas (e.g. 0:3,1:2), not '%s'", flag, v);
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

/* A rank's logs of an attempt this job may run, already there. */
static bool find_old_logs(long max_restarts, char *found, size_t foundsz)
{
    DIR *d = opendir(L.dir);
    if (!d)
        return false;
    bool hit = false;
    struct dirent *e;
    while (!hit && (e = readdir(d)) != NULL) {
        char *end;
        if (strncmp(e->d_name, "attempt_", 8) != 0)
            continue;
        long k = strtol(e->d_name + 8, &end, 10);
        if (*end || end == e->d_name + 8 || k < 0 || k > max_restarts)
            continue;
        for (int i = 0; i < L.local_n && !hit; i++) {
            struct stat st;
            snprintf(found, foundsz, "%s/%s/%d", L.dir, e->d_name, L.node_rank * L.local_n + i);
            hit = stat(found, &st) == 0;
        }
    }
    closedir(d);
    return hit;
}

int gw__run_logs_setup(const char *dir, const char *tee, const char *redirects, int local_n, int node_rank,
                       long max_restarts, char *err, size_t errsz)
{
    if (!dir && !tee && !redirects)
        return 0;
    L.local_n = local_n, L.node_rank = node_rank;
    unsigned char *t = calloc((size_t)local_n, 1), *r = calloc((size_t)local_n, 1);
    L.where = calloc((size_t)local_n * 2, 1);
    L.fd = malloc((size_t)local_n * 2 * sizeof *L.fd);
    L.path = calloc((size_t)local_n * 2, sizeof *L.path);
    L.broken = calloc((size_t)local_n * 2, sizeof *L.broken);
    if (!t || !r || !L.where || !L.fd || !L.path || !L.broken) {
        snprintf(err, errsz, "out of memory");
        return 1;
    }
    if (tee && !parse_std("--tee", tee, local_n, t, err, errsz))
        return -2;
    if (redirects && !parse_std("--redirects", redirects, local_n, r, err, errsz))
        return -2;
    if (!tee && !redirects)
        memset(t, 3, (size_t)local_n); /* --log-dir alone: both streams, and the console as before */
    for (int i = 0; i < local_n * 2; i++) {
        const unsigned bit = 1u << (i % 2);
        L.fd[i] = -1;
        L.where[i] = (unsigned char)(((t[i / 2] | r[i / 2]) & bit ? TO_FILE : 0) |
                                     ((t[i / 2] & bit) || !(r[i / 2] & bit) ? TO_CONSOLE : 0));
    }
    free(t), free(r);
    if (dir) {
        if (!*dir) {
            snprintf(err, errsz, "--log-dir must name a directory, not ''");
            return -2;
        }
        L.dir = strdup(dir);
        if (!L.dir || !make_dirs(dir)) {
            snprintf(err, errsz, "--log-dir %s: cannot make that directory: %s", dir, strerror(errno));
            return 1;
        }
    } else { /* torchrun's choice too: a fresh temporary directory, said */
        const char *tmp = getenv("TMPDIR");
        char templ[4096];
        snprintf(templ, sizeof templ, "%s/gw-run-logs-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(templ) || !(L.dir = strdup(templ))) {
            snprintf(err, errsz, "--tee/--redirects without --log-dir: cannot make a directory %s: %s", templ,
                     strerror(errno));
            return 1;
        }
    }
    char found[4200];
    if (find_old_logs(max_restarts, found, sizeof found)) {
        snprintf(err, errsz, "--log-dir %s already holds the logs of a job (%s): gw-run does not overwrite them; "
                 "give another directory, or move them away", L.dir, found);
        return 2;
    }
    gw__run_say("gw-run: the ranks' output logged in %s/attempt_K/RANK/{stdout,stderr}.log (K the restart, RANK "
                "the global rank)\n", L.dir);
    return 0;
}

bool gw__run_logs_on(void)
{
    return L.dir != NULL;
}

bool gw__run_logs_open(int local, int global, long attempt, char *why, size_t whysz)
{
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
            return false;
        }
        made = true;
        free(L.path[i]);
        L.path[i] = malloc(strlen(dir) + 16);
        if (!L.path[i]) {
            snprintf(why, whysz, "out of memory");
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

/* Writes n bytes to a stream's log file; returns how many of them the
 * console skips (n where the stream is redirected, else 0).  A file that
 * cannot take them (a full disk, ulimit -f) is closed, said once, and what it
 * did not take goes to the console, as its stream's lines from then on. */
size_t gw__run_logs_write(int local, int k, int global, const char *p, size_t n)
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

void gw__run_logs_close(int local, int k)
{
    if (!L.dir)
        return;
    const int i = local * 2 + k;
    if (L.fd[i] >= 0)
        close(L.fd[i]);
    L.fd[i] = -1;
}
