/*
 * gw-run-io.c: the output half of the gw-run launcher.
 *
 * What it is: everything between a rank's stdout/stderr pipes and gw-run's
 * own: reading the pipes, splitting what arrives into lines, prefixing each
 * line with the rank that wrote it and writing it out in one piece so lines
 * of different ranks never interleave, and the output side of the poll loop
 * (which pipes to watch, giving up on pipes nobody will close). The writing
 * itself is done by writer threads from queues, so that an output nobody
 * reads never stops the loop (see "the output queues" below); gw-run's own
 * messages (gw__run_say) go through the same queues.
 *
 * It also moves the frames of the launcher control channel between the
 * gw-runs of a multi-node job: encoding and decoding them, queueing what is
 * to be sent, reading what arrived with every length checked.
 *
 * What it is not: it creates no pipes (gw-run.c does, when it spawns a rank)
 * and no sockets (gw-run-net.c does), decides nothing about failures, signals
 * or what a frame means (gw-run-teardown.c, gw-run-net.c) and does not run
 * the loop itself (gw-run.c).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "envint.h"
#include "gw-run.h"

enum {
    MAX_LINE = 64 * 1024, /* longer lines are split into pieces of this size */
    MAX_FRAME = GW_RUN_MAX_FRAME,
    MAX_STR = GW_RUN_MAX_STR,
    MAX_OUT = 256 * 1024, /* unsent bytes on one connection before we drop it */
};

/* Two pieces of a line (the partial one held, and the next read's) and the
 * rank's prefix: one emit_line fits after a flush. */
static char outbuf[2 * MAX_LINE + sizeof ((struct rank *)0)->prefix + 1];
static size_t outlen;

/* ---- the output queues ----
 *
 * Lines are not written by the loop: a full stdout (a paused `| less`, a
 * terminal stopped with ^S, a slow disk) would block it, and with it the
 * signals, the reaping and the teardown of a failed job. The loop appends
 * them to a queue and a writer thread per destination writes them out. While
 * a queue holds OUT_HIGH bytes the loop stops reading the pipes that feed it
 * (a rank writing more then blocks on its own pipe, as without gw-run), but
 * it goes on handling everything else. stdout and stderr share one queue and
 * one thread when they are the same file, so their lines keep their order;
 * otherwise a stuck stdout does not hold back stderr (gw-run's own messages).
 *
 * A queue holds records: a destination byte (1 or 2), a 4-byte length, that
 * many bytes; an append to the same destination as the last record extends
 * it. The writer takes the whole buffer at once and gives the loop its empty
 * spare, so the lock is never held across a write. */
enum { OUT_HIGH = 1 << 20, REC_HDR = 5 };

struct outq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, stop, done; /* done: the writer has returned */
    unsigned char *buf, *spare;
    size_t len, cap, spare_cap;
    size_t inflight; /* bytes the writer took and has not finished writing */
    size_t last;     /* offset of the last record's header; SIZE_MAX: none */
    /* When the queue last moved: it got bytes while empty, the writer took
     * them, or a write took some (gw__run_io_stuck_ms). */
    _Atomic int64_t moved_ms;
};
static struct outq queues[2];
static struct outq *queue_of[3]; /* by destination fd; NULL: written directly */
static _Atomic bool out_broken[3];

/* Writes everything, waiting when a non-blocking stdout is full. After a hard
 * error (a closed pipe, a full disk) the destination is dropped but the ranks
 * keep running: losing log lines must not kill a training job. A dropped
 * stdout is named once on stderr (it was silent: a job whose stdout went to a
 * full disk ended 0 with every line lost and nothing said); a closed one is
 * not (`gw-run ... | head` closes it on purpose). q: the queue it writes
 * for, NULL when written directly. */
static void write_all(int fd, const unsigned char *p, size_t n, struct outq *q)
{
    while (n > 0 && !out_broken[fd]) {
        /* 64 KiB at a time: a blocking write of a whole record (up to 1 MiB)
         * returned only once a slow reader had taken all of it, so a reader
         * still reading looked stuck (gw__run_io_stuck_ms) and lost its
         * output after a signal */
        ssize_t w = write(fd, p, n < 65536 ? n : 65536);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            if (q)
                atomic_store(&q->moved_ms, gw__run_now_ms());
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, 100);
        } else {
            const int e = w < 0 ? errno : EIO;
            out_broken[fd] = true;
            if (fd == 1 && e != EPIPE && !out_broken[2] && !(queue_of[2] && queue_of[2] == queue_of[1]))
                gw__run_say("gw-run: cannot write the ranks' output to stdout: %s; its lines are dropped from "
                            "here on, the job goes on\n", strerror(e));
        }
    }
}

static void *writer_main(void *arg)
{
    struct outq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->len == 0 && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->len == 0)
            break; /* stopping, and everything is out */
        unsigned char *b = q->buf;
        size_t n = q->len, cap = q->cap;
        q->buf = q->spare, q->cap = q->spare_cap;
        q->spare = NULL, q->spare_cap = 0;
        q->len = 0, q->last = SIZE_MAX, q->inflight = n;
        atomic_store(&q->moved_ms, gw__run_now_ms());
        pthread_mutex_unlock(&q->mu);
        for (size_t off = 0; off + REC_HDR <= n;) {
            uint32_t len;
            memcpy(&len, b + off + 1, 4);
            write_all(b[off], b + off + REC_HDR, len, q);
            off += REC_HDR + len;
        }
        pthread_mutex_lock(&q->mu);
        q->inflight = 0;
        if (!q->spare || cap > q->spare_cap) { /* keep the larger buffer as the spare */
            free(q->spare);
            q->spare = b, q->spare_cap = cap;
        } else {
            free(b);
        }
    }
    q->done = true;
    pthread_cond_broadcast(&q->cv); /* gw__run_io_finish waits on it too */
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* Appends n bytes for fd (1 or 2) to its queue, or writes them directly when
 * there is none (before gw__run_io_start, or it could not start a thread). */
static void out_append(int fd, const char *p, size_t n)
{
    struct outq *q = queue_of[fd];
    if (n == 0)
        return;
    if (!q) {
        write_all(fd, (const unsigned char *)p, n, NULL);
        return;
    }
    pthread_mutex_lock(&q->mu);
    if (q->len == 0 && q->inflight == 0)
        atomic_store(&q->moved_ms, gw__run_now_ms()); /* behind from now, not since its last write */
    bool extend = q->last != SIZE_MAX && q->buf[q->last] == fd;
    size_t need = q->len + n + (extend ? 0 : REC_HDR);
    if (need > q->cap) {
        size_t cap = q->cap ? q->cap : 64 * 1024;
        while (cap < need)
            cap *= 2;
        unsigned char *nb = realloc(q->buf, cap);
        if (!nb) { /* out of memory: these lines are lost, not the job */
            pthread_mutex_unlock(&q->mu);
            return;
        }
        q->buf = nb, q->cap = cap;
    }
    if (!extend) {
        q->last = q->len;
        q->buf[q->len] = (unsigned char)fd;
        memset(q->buf + q->len + 1, 0, 4);
        q->len += REC_HDR;
    }
    uint32_t len;
    memcpy(&len, q->buf + q->last + 1, 4);
    len += (uint32_t)n; /* a record never reaches 4 GiB: the loop stops at OUT_HIGH */
    memcpy(q->buf + q->last + 1, &len, 4);
    memcpy(q->buf + q->len, p, n);
    q->len += n;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static bool same_file(int a, int b)
{
    struct stat sa, sb;
    return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* How long queue q has been behind: bytes to write and none taken since
 * (0: nothing waits). Called with q->mu held or from the loop. */
static int64_t queue_stuck_ms(struct outq *q, int64_t now)
{
    if (!q->started || q->done || (q->len == 0 && q->inflight == 0))
        return 0;
    const int64_t d = now - atomic_load(&q->moved_ms);
    return d > 0 ? d : 0;
}

int64_t gw__run_io_stuck_ms(void)
{
    const int64_t now = gw__run_now_ms();
    int64_t worst = 0;
    for (int i = 0; i < 2; i++) {
        struct outq *q = &queues[i];
        if (!q->started)
            continue;
        pthread_mutex_lock(&q->mu);
        const int64_t d = queue_stuck_ms(q, now);
        pthread_mutex_unlock(&q->mu);
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* How long a stuck destination may hold gw-run: for ever while nothing asked
 * it to stop (a job that ended waits for its reader, as any program's write
 * would), GW_RUN_OUT_STUCK_MS of no progress once a stop signal ended the
 * job, GW_RUN_OUT_HURRY_MS once one came with no rank left. */
static int64_t stuck_limit_ms(void)
{
    if (gw__run.out_hurry || gw__run_stop_signal_pending())
        return GW_RUN_OUT_HURRY_MS;
    return gw__run.got_signal ? GW_RUN_OUT_STUCK_MS : 0;
}

/* Writes out what is queued and ends the writers (atexit: every way out of
 * gw-run passes here, and no line already read from a rank is lost), but
 * leaves a writer that a stop signal's limit finds stuck (it stays blocked in
 * write(2) until the process exits; a blocked stdout kept gw-run alive after
 * SIGTERM, and a second one too, for as long as its reader slept). */
void gw__run_io_finish(void)
{
    for (int i = 0; i < 2; i++) {
        struct outq *q = &queues[i];
        if (!q->started)
            continue;
        pthread_mutex_lock(&q->mu);
        q->stop = true;
        pthread_cond_broadcast(&q->cv);
        int64_t stuck = 0;
        while (!q->done) {
            const int64_t limit = stuck_limit_ms(), now = gw__run_now_ms();
            stuck = queue_stuck_ms(q, now);
            if (limit && stuck >= limit)
                break;
            /* A signal's handler does not wake this wait: look again soon. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L)
                ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&q->cv, &q->mu, &ts);
        }
        const bool left = !q->done;
        const size_t behind = q->len + q->inflight;
        pthread_mutex_unlock(&q->mu);
        if (left) {
            const bool both = queue_of[1] == queue_of[2];
            char note[256];
            const int len = snprintf(note, sizeof note, "gw-run: %s has taken nothing for %.1f s and gw-run was told "
                                     "to stop: exiting without the last %zu bytes of output\n",
                                     both ? "stdout and stderr" : i == 0 ? "stdout" : "stderr",
                                     (double)stuck / 1000.0, behind);
            if (!both && i == 0) {
                gw__run_say("%s", note); /* stderr's own queue moves */
            } else if (len > 0 && (size_t)len < sizeof note) {
                /* the stuck queue is stderr's: one try straight to it, when
                 * it has room for the whole line (a write of at most
                 * PIPE_BUF then goes in at once, without blocking) */
                struct pollfd pfd = {.fd = 2, .events = POLLOUT};
                if (poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLOUT) && write(2, note, (size_t)len) < 0) {
                }
            }
            pthread_detach(q->thread);
        } else {
            pthread_join(q->thread, NULL);
        }
        q->started = false;
    }
    queue_of[1] = queue_of[2] = NULL;
}

void gw__run_io_start(void)
{
    bool one = same_file(1, 2);
    /* The writers take no signals: the loop's handlers run in the main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (int i = 0; i < (one ? 1 : 2); i++) {
        struct outq *q = &queues[i];
        pthread_mutex_init(&q->mu, NULL);
        pthread_cond_init(&q->cv, NULL);
        q->last = SIZE_MAX;
        q->started = pthread_create(&q->thread, NULL, writer_main, q) == 0;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    queue_of[1] = queues[0].started ? &queues[0] : NULL;
    queue_of[2] = queues[one ? 0 : 1].started ? &queues[one ? 0 : 1] : NULL;
    atexit(gw__run_io_finish);
}

/* Whether the loop may read more for destination fd now. */
static bool has_room(int fd)
{
    struct outq *q = queue_of[fd];
    if (!q)
        return true;
    pthread_mutex_lock(&q->mu);
    bool room = q->len + q->inflight < OUT_HIGH;
    pthread_mutex_unlock(&q->mu);
    return room;
}

void gw__run_say(const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        out_append(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void flush_out(int fd)
{
    out_append(fd, outbuf, outlen);
    outlen = 0;
}

/* Queues the rank's prefix ("[R] ") + a + b + end ("\n", or "\r" for a
 * progress bar's redraw). The line is built in one buffer so that it
 * reaches our stdout in one write and never interleaves with another rank's. */
static void emit_ended(const struct rank *r, const struct stream *s, const char *a, size_t alen,
                       const char *b, size_t blen, char end)
{
    const size_t pl = strlen(r->prefix), need = pl + alen + blen + 1;
    if (outlen + need > sizeof outbuf)
        flush_out(s->out_fd);
    memcpy(outbuf + outlen, r->prefix, pl);
    outlen += pl;
    if (alen)
        memcpy(outbuf + outlen, a, alen);
    outlen += alen;
    if (blen)
        memcpy(outbuf + outlen, b, blen);
    outlen += blen;
    outbuf[outlen++] = end;
}

static void emit_line(const struct rank *r, const struct stream *s, const char *a, size_t alen,
                      const char *b, size_t blen)
{
    emit_ended(r, s, a, alen, b, blen, '\n');
}

/* Splits freshly read bytes into lines; what follows the last newline is kept
 * in s->partial until its newline (or EOF) arrives. */
static void consume(const struct rank *r, struct stream *s, const char *p, size_t n)
{
    const char *end = p + n, *nl;
    /* A carriage return not ending a line ("\r\n") ends a redraw (tqdm's
     * progress bars write "\r" + the bar, newline only at the end): passed on
     * with its prefix, "\r"-ended, when what follows shows it is no "\r\n",
     * so the bar moves (it stayed hidden until the bar's last newline). */
    if (n && s->len && s->partial[s->len - 1] == '\r' && *p != '\n') {
        if (s->len > 1) /* nothing before it: no empty piece */
            emit_ended(r, s, s->partial, s->len - 1, NULL, 0, '\r');
        s->len = 0;
    }
    for (;;) {
        nl = memchr(p, '\n', (size_t)(end - p));
        const char *cr = memchr(p, '\r', (size_t)((nl ? nl : end) - p));
        if (cr && cr + 1 < end && cr[1] != '\n') {
            if (s->len || cr > p) /* nothing before it: no empty line */
                emit_ended(r, s, s->partial, s->len, p, (size_t)(cr - p), '\r');
            s->len = 0;
            p = cr + 1;
            continue;
        }
        if (!nl)
            break;
        emit_line(r, s, s->partial, s->len, p, (size_t)(nl - p));
        s->len = 0;
        p = nl + 1;
    }
    while (p < end) {
        size_t take = (size_t)(end - p);
        if (s->len + take > MAX_LINE) { /* one of exactly MAX_LINE waits: its newline may come next */
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
    gw__run_logs_close((int)(r - gw__run.ranks), (int)(s - r->s));
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
    const int local = (int)(r - gw__run.ranks);
    const int k = (int)(s - r->s);
    if (s->fd < 0 || (!has_room(s->out_fd) && !gw__run_logs_console_skips(local, k))) /* it queues nothing */
        return false;
    ssize_t n = read(s->fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return false;
    if (n <= 0) {
        close_stream(r, s);
        return false;
    }
    const size_t skip = gw__run_logs_write(local, k, r->global, buf, (size_t)n);
    if (skip < (size_t)n) {
        consume(r, s, buf + skip, (size_t)n - skip);
        flush_out(s->out_fd);
    }
    return true;
}

/* Adds the pipes still open to pfds from index nfds on, noting whose each one
 * is in owner and owner_rank; returns the new count. */
int gw__run_io_pollfds(struct pollfd *pfds, int nfds, struct stream **owner,
                       struct rank **owner_rank, bool *held)
{
    struct rank *ranks = gw__run.ranks;
    bool room[3] = {false, has_room(1), has_room(2)};
    *held = !room[1] || !room[2];
    for (int i = 0; i < gw__run.nranks; i++) {
        for (int k = 0; k < 2; k++) {
            if (ranks[i].s[k].fd >= 0 && (room[ranks[i].s[k].out_fd] || gw__run_logs_console_skips(i, k))) {
                owner[nfds] = &ranks[i].s[k];
                owner_rank[nfds] = &ranks[i];
                pfds[nfds++] = (struct pollfd){.fd = ranks[i].s[k].fd, .events = POLLIN};
            }
        }
    }
    return nfds;
}

static void close_all_streams(void)
{
    for (int i = 0; i < gw__run.nranks; i++)
        for (int k = 0; k < 2; k++)
            close_stream(&gw__run.ranks[i], &gw__run.ranks[i].s[k]);
}

void gw__run_abandon_stuck_output(int64_t stuck_ms)
{
    gw__run_say("gw-run: our output has taken nothing for %.1f s and gw-run was told to stop: not reading the "
                "ranks' pipes any more\n", (double)stuck_ms / 1000.0);
    close_all_streams();
}

/* Every rank is gone and the drain grace is over, but a process a rank
 * started still holds a pipe: print what we have and stop waiting. */
void gw__run_abandon_output(void)
{
    gw__run_say("gw-run: all ranks exited but a process they started still "
                    "holds their output; not waiting for it\n");
    close_all_streams();
}

/* ---- control-channel frames ----
 *
 * A frame is a 4-byte big-endian body length (1..MAX_FRAME), then the body:
 * a type byte and the fields its layout below lists, u = 4-byte big-endian,
 * b = 1 byte, s and T = a 2-byte length (at most MAX_STR) and the bytes.
 *   CHALLENGE 0 -> node uT    magic "GWL9", node 0's nonce (16 bytes): the
 *                              first frame on a connection node 0 accepted
 *   HELLO   node -> 0  uuuuuuTs magic "GWL9", node (0xffffffff: none given,
 *                              number it by arrival), nnodes, nproc, max
 *                              restarts, its kill grace in milliseconds
 *                              (GW_RUN_KILL_GRACE), the node's nonce (16
 *                              bytes) and its proof (32: HMAC-SHA256 under
 *                              the job token of both nonces and the five
 *                              numbers), host
 *   WELCOME 0 -> node  usT     the node's number (its own, or the one node 0
 *                              gave it), node 0's hostname, node 0's proof
 *                              (HMAC of the node's nonce, its own and that
 *                              number): the node believes nothing before it
 *   REFUSE  0 -> node  s       the reason; node 0 closes the connection
 *   FAIL    both ways  uubusb  global rank, node, signaled, code or signal,
 *                              host, what the rank recorded (GW_RUN_CAUSE_*):
 *                              a rank failed there
 *   LOST    0 -> node  ubs     node, how (0: its connection ended; 1: its
 *                              gw-run went silent, GW_RUN_HEARTBEAT_TIMEOUT),
 *                              host: its launcher went away
 *   ABORT   both ways  bs      exit code, message: the job failed for a
 *                              reason that is no rank's (a node missing or
 *                              disagreeing; to node 0: that node's launcher
 *                              could not start its ranks)
 *   STOP    both ways  uus     node, signal, host: SIGINT/SIGTERM/SIGHUP reached it
 *   DONE    node -> 0  u       node: every rank there exited 0
 *   READY   node -> 0  ub      node, whether it can start again: its ranks of a
 *                              failed attempt are gone (--max-restarts only)
 *   WAIT    0 -> node  u       the longest kill grace of any node, in
 *                              milliseconds (a day at most), in answer to its
 *                              READY: how long the verdict may take
 *   RESTART 0 -> node  us      the attempt every node starts now (0: none),
 *                              and with 0 why not
 *   PASS    both ways  uus     node, signal, host: SIGUSR1/SIGUSR2 reached it, for
 *                              every rank (the job goes on)
 *   CAUSE   node -> 0  uuuuus  global rank, node, pid, seconds and microseconds
 *                              of the wall clock, message: the earliest failure
 *                              of its own a failed rank there recorded, sent
 *                              once its ranks are gone (gw-run-cause.c)
 *   BEAT    both ways  (none)  every GW_RUN_BEAT_MS on a joined connection:
 *                              the launcher at the other end still runs (a
 *                              stopped one's kernel still answers keepalive)
 * A frame that breaks these rules closes its connection with a log line.
 */

static const char *const layout[] = {
    [F_HELLO] = "uuuuuuTs", [F_WELCOME] = "usT", [F_REFUSE] = "s", [F_FAIL] = "uubusb",
    [F_LOST] = "ubs",       [F_ABORT] = "bs",  [F_STOP] = "uus",  [F_DONE] = "u",
    [F_READY] = "ub",      [F_RESTART] = "us",    [F_PASS] = "uus",  [F_CHALLENGE] = "uT",
    [F_CAUSE] = "uuuuus", [F_WAIT] = "u", [F_BEAT] = "",
};

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Encodes m by its type's layout. No layout has more than two strings of
 * MAX_STR bytes, so no frame can overflow. */
void gw__run_pack(struct frame *f, const struct msg *m)
{
    int nv = 0;
    f->n = 4;
    f->b[f->n++] = (unsigned char)m->type;
    for (const char *l = layout[m->type]; *l; l++) {
        if (*l == 'b') {
            f->b[f->n++] = (unsigned char)m->v[nv++];
        } else if (*l == 'u') {
            put_u32(f->b + f->n, m->v[nv++]);
            f->n += 4;
        } else {
            const void *s = *l == 'T' ? (const void *)m->tok : m->s;
            size_t len = *l == 'T' ? m->toklen : strlen(m->s);
            len = len > MAX_STR ? MAX_STR : len;
            f->b[f->n++] = (unsigned char)(len >> 8);
            f->b[f->n++] = (unsigned char)len;
            memcpy(f->b + f->n, s, len);
            f->n += len;
        }
    }
    put_u32(f->b, (uint32_t)(f->n - 4));
}

/* Decodes a body of n >= 1 bytes; false unless it matches its layout exactly. */
static bool unpack(const unsigned char *p, size_t n, struct msg *m)
{
    size_t pos = 1, nv = 0;
    m->type = p[0];
    m->s[0] = '\0';
    if (m->type < F_HELLO || m->type > F_BEAT)
        return false;
    if (m->type == F_HELLO && n >= 5 && get_u32(p + 1) != GW_RUN_HELLO_MAGIC) {
        memset(m->v, 0, sizeof m->v); /* another version's layout: its magic alone, refused by name */
        m->v[0] = get_u32(p + 1);
        m->tok = NULL, m->toklen = 0;
        return true;
    }
    for (const char *l = layout[m->type]; *l; l++) {
        size_t w = *l == 'b' ? 1 : *l == 'u' ? 4 : 2;
        if (n - pos < w)
            return false;
        if (*l == 'b' || *l == 'u') {
            m->v[nv++] = w == 1 ? p[pos] : get_u32(p + pos);
            pos += w;
            continue;
        }
        size_t len = (size_t)p[pos] << 8 | p[pos + 1];
        pos += 2;
        if (len > MAX_STR || n - pos < len)
            return false;
        if (*l == 'T') {
            m->tok = p + pos;
            m->toklen = len;
        } else {
            for (size_t i = 0; i < len; i++)
                m->s[i] = p[pos + i] >= 0x20 && p[pos + i] < 0x7f ? (char)p[pos + i] : '?';
            m->s[len] = '\0';
        }
        pos += len;
    }
    return pos == n;
}

/* GW_SOCKET_KEEPALIVE as the ranks read it (transport/sock.c, README): 10
 * unset, not an integer (spelled as every GW_* setting: envint.h) or
 * negative, 0 off, above Linux's 32767 s 32767 (the ranks say so).  Read
 * with strtol up to 32767 only, a longer setting left these links at ~30 s
 * while the ranks rode out hours. */
static int ranks_keepalive_s(void)
{
    const char *s = getenv("GW_SOCKET_KEEPALIVE");
    long long v;
    if (!s || !*s || !gw__parse_env_int(s, &v) || v < 0)
        return 10;
    return v > 32767 ? 32767 : (int)v;
}

void gw__run_tune_socket(int fd)
{
    /* The launchers' links ride out an outage at least as long as the ranks'
     * connections do (GW_SOCKET_KEEPALIVE; 0: any): gw-run ended the job
     * after ~30 s whatever the ranks were told. */
    const int ka = ranks_keepalive_s();
    int one = 1, idle = ka > 10 ? ka : 10, intvl = 5, cnt = 4;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (ka == 0)
        return;
    /* A machine that dies or drops off the network sends no FIN; keepalive
     * turns its silence into an error within about 30 s (idle + 20 s). */
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    /* Keepalive probes only an idle connection: with a frame unacknowledged
     * (a PASS in flight when the peer's machine died) the kernel retransmits
     * for about 15 minutes.  30 s of no acknowledgement ends it too.  (Linux
     * applies this to a zero window as well; gw-run reads its sockets as
     * frames come, and its frames are small: a window never fills.) */
    unsigned user_timeout_ms = (unsigned)(idle + intvl * cnt) * 1000u;
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

void gw__run_conn_close(struct conn *c)
{
    if (c->fd < 0)
        return;
    /* Unread input would make close() send a reset, which can destroy frames
     * the peer has not read yet (a REFUSE, a FAIL). */
    unsigned char sink[512];
    for (int i = 0; i < 64 && recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {
    }
    close(c->fd);
    c->fd = -1;
    c->connecting = false;
    c->inlen = c->outlen = 0;
}

bool gw__run_out_add(struct conn *c, const void *p, size_t n)
{
    if (n == 0)
        return true; /* nothing to queue (p may be NULL) */
    if (c->outlen + n > MAX_OUT)
        return false;
    if (c->outlen + n > c->outcap) {
        size_t cap = c->outcap ? c->outcap : 1024;
        while (cap < c->outlen + n)
            cap *= 2;
        unsigned char *nb = realloc(c->out, cap);
        if (!nb)
            return false;
        c->out = nb;
        c->outcap = cap;
    }
    memcpy(c->out + c->outlen, p, n);
    c->outlen += n;
    return true;
}

/* Only queues: the poll loop sends when the socket can take it. */
void gw__run_conn_send(struct conn *c, const struct frame *f)
{
    if (c->fd >= 0 && !gw__run_out_add(c, f->b, f->n))
        c->broken = true;
}

/* Sends what the socket takes now; false on a connection error. */
bool gw__run_conn_flush(struct conn *c)
{
    while (c->fd >= 0 && c->outlen > 0) {
        ssize_t w = send(c->fd, c->out, c->outlen, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
        memmove(c->out, c->out + w, c->outlen - (size_t)w);
        c->outlen -= (size_t)w;
    }
    return true;
}

/* Reads what has arrived (a bounded amount per call) and hands each complete
 * frame to handle, which may close the connection. */
int gw__run_conn_read(struct conn *c, bool (*handle)(struct conn *, const struct msg *),
                      const char **why)
{
    static struct msg m;
    static char badlen[64];
    for (int round = 0; round < 16; round++) {
        ssize_t n = recv(c->fd, c->in + c->inlen, sizeof c->in - c->inlen, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return R_OPEN;
        if (n <= 0)
            return R_GONE; /* the end or an error: either way the peer is gone */
        c->heard_ms = gw__run_now_ms();
        c->silence_said = false;
        c->inlen += (size_t)n;
        size_t off = 0;
        while (c->inlen - off >= 4) {
            uint32_t len = get_u32(c->in + off);
            if (len == 0 || len > MAX_FRAME) {
                snprintf(badlen, sizeof badlen, "frame length %u (1..%d)", len, MAX_FRAME);
                *why = badlen;
                return R_BAD;
            }
            if (c->inlen - off - 4 < len)
                break;
            if (!unpack(c->in + off + 4, len, &m)) {
                *why = "malformed frame";
                return R_BAD;
            }
            if (!handle(c, &m))
                return R_BAD;
            if (c->fd < 0)
                return R_CLOSED;
            off += 4 + len;
        }
        memmove(c->in, c->in + off, c->inlen - off);
        c->inlen -= off;
    }
    return R_OPEN;
}

/* ---- randomness (the job token, the control channel's nonces) ---- */

bool gw__run_random(void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = getrandom((unsigned char *)buf + got, len - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        got += (size_t)n;
    }
    return true;
}
