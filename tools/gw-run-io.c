/*
 * gw-run-io.c: the output half of the gw-run launcher.
 *
 * What it is: everything between a rank's stdout/stderr pipes and gw-run's
 * own: reading the pipes, splitting what arrives into lines, prefixing each
 * line with the rank that wrote it and writing it out in one piece so lines
 * of different ranks never interleave, and the output side of the poll loop
 * (which pipes to watch, giving up on pipes nobody will close).
 *
 * What it is not: it creates no pipes (gw-run.c does, when it spawns a rank),
 * decides nothing about failures or signals (gw-run-teardown.c) and does not
 * run the loop itself (gw-run.c).
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gw-run.h"

enum {
    MAX_LINE = 64 * 1024, /* longer lines are split into pieces of this size */
};

static char outbuf[2 * MAX_LINE + 64];
static size_t outlen;
static bool out_broken[3];

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
    gw__run.open_streams--;
}

/* One read from a rank's pipe. Returns false when nothing more is available
 * right now (or the stream ended). */
bool gw__run_pump(const struct rank *r, struct stream *s)
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

/* Adds the pipes still open to pfds from index nfds on, noting whose each one
 * is in owner and owner_rank; returns the new count. */
int gw__run_io_pollfds(struct pollfd *pfds, int nfds, struct stream **owner,
                       struct rank **owner_rank)
{
    struct rank *ranks = gw__run.ranks;
    for (int i = 0; i < gw__run.nranks; i++) {
        for (int k = 0; k < 2; k++) {
            if (ranks[i].s[k].fd >= 0) {
                owner[nfds] = &ranks[i].s[k];
                owner_rank[nfds] = &ranks[i];
                pfds[nfds++] = (struct pollfd){.fd = ranks[i].s[k].fd, .events = POLLIN};
            }
        }
    }
    return nfds;
}

/* Every rank is gone and the drain grace is over, but a process a rank
 * started still holds a pipe: print what we have and stop waiting. */
void gw__run_abandon_output(void)
{
    fprintf(stderr, "gw-run: all ranks exited but a process they started still "
                    "holds their output; not waiting for it\n");
    for (int i = 0; i < gw__run.nranks; i++)
        for (int k = 0; k < 2; k++)
            close_stream(&gw__run.ranks[i], &gw__run.ranks[i].s[k]);
}
