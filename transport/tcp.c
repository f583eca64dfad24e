/* tcp.c - the TCP transport: the connection of DESIGN.md over GW_SOCKET_NSTREAMS
 * non-blocking sockets.  The receiver owns a FIFO of slots (staging memory) and
 * reads frames straight into them; the sender stages chunks in its own slots and
 * writes them out as the sockets accept bytes.  Each chunk is split into up to
 * nstreams parts (64 KiB at least), one per socket, so big chunks use several
 * sockets at once.  Every frame carries the chunk's stream position, the part's
 * offset and length and the chunk header, and every field is checked before a
 * byte of payload is read: a malformed, oversized or out-of-order frame, or a peer
 * that closes its socket, is an error naming the peer, never an over-read or a
 * hang.  Nothing here blocks on the data path; setup (connect, accept, hello)
 * waits with a deadline.  Not here: which chunks to send (comm/). */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/uio.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "sock.h"
#include "transport.h"

#define TCP_FRAME_MAGIC 0x6672777au /* "zwrf" */
#define TCP_HELLO_MAGIC 0x6c68777au
#define TCP_MAX_STREAMS 16
#define TCP_MIN_PART (64u << 10)
#define TCP_ABANDON_MAGIC 0x62617767u /* "gwab": the receiver's reason, back on stream 0 */
#define TCP_ABANDON_MAX 1024
/* "gwwt": the operation the receiver waits in, back on stream 0 (waiting) */
#define TCP_WAIT_MAGIC 0x74777767u
#define TCP_WAIT_BYTES (8 + sizeof(struct gw_opdesc))
_Static_assert(TCP_WAIT_BYTES <= GW_WAY_BACK_MAX, "a waiting record fits the way back");

struct tcp_handle {
  struct gw_sockaddr_packed addr;
  uint32_t nstreams;
  uint64_t nonce; /* this connection's id, so a stray connect is refused */
};
_Static_assert(sizeof(struct tcp_handle) <= GW_CONN_HANDLE_BYTES, "tcp handle fits the opaque handle");

struct tcp_hello {
  uint32_t magic;
  uint32_t stream;
  uint64_t job_hash;
  uint64_t nonce;
  int32_t sender;
  uint32_t pad;
};
_Static_assert(sizeof(struct tcp_hello) <= GW_HELLO_MAX, "a hello the accept set can hold");

struct tcp_frame {
  uint32_t magic;
  uint32_t stream;
  uint64_t pos;  /* the chunk's position in this connection's stream of chunks */
  uint32_t off;  /* this part's offset in the chunk */
  uint32_t len;  /* this part's payload bytes */
  struct gw_chunk_hdr hdr;
};

struct tcp_sstream { /* sender side of one socket */
  int fd;
  uint64_t next_pos; /* next chunk to send a part of */
  bool busy;         /* cur is being written */
  size_t done;       /* bytes of frame + payload written */
  struct tcp_frame cur;
};

struct tcp_rstream { /* receiver side of one socket */
  int fd;
  bool have_frame;
  size_t got; /* bytes of the frame (then of the payload) read */
  uint64_t last_pos;
  bool any;
  bool eof; /* the peer closed this socket; an error only if a part is still owed */
  struct tcp_frame f;
  uint32_t boff, blen; /* unread bytes of buf */
  uint8_t buf[4096];
};

struct tcp_rslot {
  struct gw_chunk_hdr hdr;
  bool have_hdr;
  uint32_t parts, parts_done;
  uint32_t got_mask; /* the streams whose part is in */
};

struct tcp_conn {
  uint32_t nslots, slot_bytes, nstreams;
  uint8_t *slots;
  size_t map_bytes;
  uint64_t pos; /* sender: chunks posted; receiver: next chunk to deliver */
  struct gw_chunk_hdr *shdr;  /* sender: the posted headers [nslots] */
  struct tcp_rslot *rslot;    /* receiver [nslots] */
  struct tcp_sstream ss[TCP_MAX_STREAMS];
  struct tcp_rstream rs[TCP_MAX_STREAMS];
  int listen_fd;
  uint64_t nonce, job_hash;
  double timeout_s;
  gw_result_t failed;
  char failmsg[GW_ERRMSG_MAX];
  int test_corrupt; /* GW_TCP_TEST_CORRUPT: corrupt the Nth frame sent (tests) */
  int test_corrupt_seq; /* GW_TCP_TEST_CORRUPT_SEQ: flip bit 38 of the Nth frame's operation number (tests) */
  int test_skip;    /* GW_TCP_TEST_SKIP: leave out the Nth part sent on a stream other than 0 (tests) */
  uint32_t frames_sent, others_sent;
  /* Stream 0's way back, receiver to sender: records of 8 bytes (magic,
   * length) and a body, TCP_WAIT_MAGIC (waiting) and at last
   * TCP_ABANDON_MAGIC (recv_abandon).  Touched by the thread that drives
   * the connection and by any that waits on the communicator (waiting):
   * back.lock, tried, never waited for (each use is best effort or comes
   * again); the receiver's record still to go is back's (sock.h). */
  struct gw_way_back back;
  /* an error the way back met (a keepalive's timeout, a reset): the socket
   * says it once, so the thread driving the connection reports it */
  _Atomic int back_err;
  /* sender: what came back, from a record's start; the latest waiting record */
  uint32_t ab_got;
  uint8_t ab_buf[8 + TCP_ABANDON_MAX];
  bool peer_waits;
  struct gw_opdesc peer_wait;
  uint64_t drained_seq; /* the operation send_post last drained the way back in, and when */
  double drained_at;
};

static bool tcp_can_connect(const struct gw_peer_info *self, const struct gw_peer_info *peer) {
  (void)self, (void)peer;
  return true; /* any two ranks with IP connectivity */
}

static gw_result_t alloc_slots(struct gw_conn *c, struct tcp_conn *t, struct gw_errctx *err) {
  t->map_bytes = (size_t)t->nslots * t->slot_bytes;
  /* Pre-faulted once per communicator (first touch is slow on some machines). */
  void *m = mmap(NULL, t->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (m == MAP_FAILED)
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot allocate %zu bytes of tcp staging: %s", c->self,
                   t->map_bytes, strerror(errno));
  t->slots = m;
  return GW_SUCCESS;
}

static struct tcp_conn *conn_new(const struct gw_conn_params *p) {
  struct tcp_conn *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->nslots = p->nslots;
  t->slot_bytes = p->slot_bytes;
  t->nstreams = GW_MAX(1u, GW_MIN(p->nstreams, (uint32_t)TCP_MAX_STREAMS));
  t->job_hash = p->job_hash;
  t->timeout_s = p->timeout_s > 0 ? p->timeout_s : 60;
  t->listen_fd = -1;
  for (int i = 0; i < TCP_MAX_STREAMS; i++) t->ss[i].fd = t->rs[i].fd = -1;
  t->test_corrupt = (int)gw__env_int("GW_TCP_TEST_CORRUPT", 0);
  t->test_corrupt_seq = (int)gw__env_int("GW_TCP_TEST_CORRUPT_SEQ", 0);
  t->test_skip = (int)gw__env_int("GW_TCP_TEST_SKIP", 0);
  return t;
}

/* ---- setup ------------------------------------------------------------------------ */
static gw_result_t tcp_recv_setup(struct gw_conn *c, const struct gw_conn_params *p, struct gw_conn_handle *out,
                                  struct gw_errctx *err) {
  gw_result_t res;
  struct tcp_conn *t = conn_new(p);
  if (!t) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
  if (p->local_addr_len == 0) {
    res = gw__err(err, GW_ERR_INTERNAL, "rank %d: no local address for tcp", c->self);
    goto fail;
  }
  struct sockaddr_storage a;
  char where[96];
  gw__sock_addr_str(&p->local_addr, where, sizeof where);
  t->listen_fd = gw__sock_listen(&p->local_addr, p->local_addr_len, GW_LISTEN_BACKLOG, &a);
  if (t->listen_fd < 0) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot listen for rank %d on %s: %s%s", c->self,
                  c->peer, where, strerror(errno), gw__sock_listen_hint(errno));
    goto fail;
  }
  GW_CHECK_GOTO(alloc_slots(c, t, err), res, fail);
  t->rslot = calloc(t->nslots, sizeof *t->rslot);
  if (!t->rslot || getrandom(&t->nonce, sizeof t->nonce, 0) != sizeof t->nonce) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory or entropy", c->self);
    goto fail;
  }
  struct tcp_handle h = {.nstreams = t->nstreams, .nonce = t->nonce};
  gw__sock_pack(&a, &h.addr);
  memset(out, 0, sizeof *out);
  memcpy(out->bytes, &h, sizeof h);
  c->priv = t;
  return GW_SUCCESS;
fail:
  gw__sock_close(t->listen_fd);
  if (t->slots) munmap(t->slots, t->map_bytes);
  free(t->rslot);
  free(t);
  return res;
}

static gw_result_t tcp_send_connect(struct gw_conn *c, const struct gw_conn_params *p, const struct gw_conn_handle *in,
                                    struct gw_errctx *err) {
  struct tcp_handle h;
  memcpy(&h, in->bytes, sizeof h);
  struct sockaddr_storage a;
  socklen_t al;
  if (h.nstreams < 1 || h.nstreams > TCP_MAX_STREAMS || !gw__sock_unpack(&h.addr, &p->local_addr, &a, &al))
    return gw__err(err, GW_ERR_REMOTE, "rank %d: rank %d sent a malformed tcp handle", c->self, c->peer);
  struct tcp_conn *t = conn_new(p);
  if (!t) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
  t->nstreams = h.nstreams; /* the receiver decides */
  gw_result_t res = alloc_slots(c, t, err);
  if (res != GW_SUCCESS) goto fail;
  t->shdr = calloc(t->nslots, sizeof *t->shdr);
  if (!t->shdr) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
    goto fail;
  }
  char where[96];
  gw__sock_addr_str(&a, where, sizeof where);
  double deadline = gw__now() + t->timeout_s;
  for (uint32_t s = 0; s < t->nstreams; s++) {
    struct tcp_hello hello = {.magic = TCP_HELLO_MAGIC, .stream = s, .job_hash = t->job_hash, .nonce = h.nonce,
                              .sender = c->self};
    int fd = gw__sock_connect_hello(&a, al, &hello, sizeof hello, deadline);
    t->ss[s].fd = fd;
    if (fd < 0) { /* out of descriptors or memory is this rank's failure, not the peer's */
      const int e = errno;
      const char *hint;
      const gw_result_t kind = gw__sock_errno_kind(e, &hint);
      res = gw__err(err, kind, "rank %d: cannot connect to rank %d (%s) at %s: %s%s", c->self, c->peer, c->peer_host, where,
                    strerror(e), hint);
      goto fail;
    }
    gw__sock_tune(fd);
  }
  c->priv = t;
  snprintf(c->desc + strlen(c->desc), sizeof c->desc - strlen(c->desc), " %s", where);
  return GW_SUCCESS;
fail:
  for (uint32_t s = 0; s < TCP_MAX_STREAMS; s++)
    gw__sock_close(t->ss[s].fd);
  if (t->slots) munmap(t->slots, t->map_bytes);
  free(t->shdr);
  free(t);
  return res;
}

static gw_result_t tcp_recv_connect(struct gw_conn *c, struct gw_errctx *err) {
  struct tcp_conn *t = c->priv;
  double deadline = gw__now() + t->timeout_s;
  uint32_t joined = 0;
  struct gw_accept_set set;
  gw__accept_set_init(&set);
  gw_result_t res = GW_SUCCESS;
  while (joined < t->nstreams && res == GW_SUCCESS) {
    struct tcp_hello hello;
    char from[64];
    int fd = gw__sock_accept_hello(&set, t->listen_fd, &hello, sizeof hello, deadline, from, sizeof from);
    if (fd < 0 && errno != ETIMEDOUT) {
      res = gw__sock_accept_error(c, "tcp stream", err);
      break;
    }
    if (fd < 0) {
      char strangers[160];
      gw__accept_set_said(&set, strangers, sizeof strangers);
      res = gw__err(err, GW_ERR_TIMEOUT, "rank %d: rank %d (%s) opened %u of %u tcp streams within %.0f s%s",
                    c->self, c->peer, c->peer_host, joined, t->nstreams, t->timeout_s, strangers);
      break;
    }
    const char *why = hello.magic != TCP_HELLO_MAGIC ? "not a gradwire hello"
                      : hello.job_hash != t->job_hash ? "another job's"
                      : hello.nonce != t->nonce ? "another connection's (a stale or foreign nonce)"
                      : hello.sender != c->peer ? "another rank's"
                      : hello.stream >= t->nstreams ? "a stream number out of range"
                      : t->rs[hello.stream].fd >= 0 ? "a stream already joined"
                      : NULL;
    if (why) { /* what a stranger's bytes claim is said only for a gradwire hello */
      char claims[64] = "";
      if (hello.magic == TCP_HELLO_MAGIC)
        snprintf(claims, sizeof claims, "; it says stream %u from rank %d", hello.stream, hello.sender);
      GW_WARN(GW_SUB_ALL, "rank %d: refused a tcp connection from %s that is not rank %d's stream of this job: %s%s",
              c->self, from, c->peer, why, claims);
      gw__accept_set_refused(&set, fd, from);
      continue;
    }
    gw__sock_tune(fd);
    t->rs[hello.stream].fd = fd;
    joined++;
  }
  gw__accept_set_close(&set);
  if (res != GW_SUCCESS) return res;
  gw__sock_close(t->listen_fd);
  t->listen_fd = -1;
  return GW_SUCCESS;
}

/* ---- data path: sender --------------------------------------------------------- */
#define fail(c, t, code, ...) gw__conn_fail((c), &(t)->failed, (t)->failmsg, "", (code), __VA_ARGS__)

/* A send or receive that failed: the peer's failure (a reset: did it exit?) or
 * this rank's own (memory, its network), as errno says. */
static gw_result_t io_fail(struct gw_conn *c, struct tcp_conn *t, const char *what, int e) {
  const char *hint;
  const gw_result_t kind = gw__sock_errno_kind(e, &hint);
  /* A timeout or an unreachable peer with this machine's own interface down
   * (its streams share the route): this rank's failure, said so. */
  char here[300];
  int fd = -1;
  for (uint32_t s = 0; s < t->nstreams && fd < 0; s++) fd = t->ss[s].fd >= 0 ? t->ss[s].fd : t->rs[s].fd;
  const enum gw_local_link link = kind == GW_ERR_REMOTE && (e == ETIMEDOUT || e == EHOSTUNREACH || e == EHOSTDOWN)
                                      ? gw__sock_local_down(fd, here, sizeof here)
                                      : GW_LOCAL_UP;
  if (link == GW_LOCAL_DOWN) return fail(c, t, GW_ERR_SYSTEM, "%s failed: %s (%s)", what, strerror(e), here);
  if (link == GW_LOCAL_NO_LINK)
    return fail(c, t, kind, "%s failed: %s (did rank %d's machine go away? %s)", what, strerror(e), c->peer, here);
  if (kind == GW_ERR_REMOTE && (e == ETIMEDOUT || e == EHOSTUNREACH || e == EHOSTDOWN))
    /* nobody closed it: keepalive's bound ran out, or the route did (a lossy
     * link that still delivered some was said as "did rank 2 exit") */
    return fail(c, t, kind, "%s failed: %s (rank %d's machine stopped answering: it went away, or the network to it "
                "failed)", what, strerror(e), c->peer);
  if (kind == GW_ERR_REMOTE)
    return fail(c, t, kind, "%s failed: %s (did rank %d exit, or its machine go away?)", what, strerror(e), c->peer);
  return fail(c, t, kind, "%s failed: %s%s", what, strerror(e), hint);
}

/* transport.h: the streams' sockets (and stream 0's way back, the same
 * socket) checked for a stall (sock.h, gw__sock_stall_add).  A timeout of a
 * stuck network was said as a peer that "has not started" the operation, or
 * as calls that differ. */
static bool tcp_net_stalled(const struct gw_conn *c, char *why, size_t len) {
  const struct tcp_conn *t = c->priv;
  if (!t) return false;
  struct gw_sock_stall st = {.fd = -1};
  for (uint32_t s = 0; s < t->nstreams; s++) {
    gw__sock_stall_add(t->ss[s].fd, &st);
    gw__sock_stall_add(t->rs[s].fd, &st);
  }
  return gw__sock_stall_text(&st, c->peer_host, why, len);
}

static uint64_t min_stream_pos(const struct tcp_conn *t) {
  uint64_t m = UINT64_MAX;
  for (uint32_t s = 0; s < t->nstreams; s++) m = GW_MIN(m, t->ss[s].next_pos);
  return m;
}

/* Writes as much as the sockets take.  GW_INPROGRESS while bytes are queued. */
/* The error the way back met on stream 0's socket, said by the data path. */
static gw_result_t back_failed(struct gw_conn *c, struct tcp_conn *t) {
  const int e = atomic_exchange_explicit(&t->back_err, 0, memory_order_relaxed);
  return e ? io_fail(c, t, c->is_send ? "receive" : "send", e) : GW_SUCCESS;
}

static gw_result_t pump_send(struct gw_conn *c, struct tcp_conn *t) {
  GW_CHECK(back_failed(c, t));
  bool pending = false;
  for (uint32_t s = 0; s < t->nstreams; s++) {
    struct tcp_sstream *st = &t->ss[s];
    while (st->next_pos < t->pos) {
      if (!st->busy) {
        const struct gw_chunk_hdr *h = &t->shdr[st->next_pos % t->nslots];
        uint32_t nparts = gw__nparts(h->bytes, t->nstreams, TCP_MIN_PART);
        if (s >= nparts || (t->test_skip && s > 0 && ++t->others_sent == (uint32_t)t->test_skip)) {
          st->next_pos++; /* this chunk has no part on this socket (or a test leaves it out) */
          continue;
        }
        st->cur = (struct tcp_frame){.magic = TCP_FRAME_MAGIC, .stream = s, .pos = st->next_pos, .hdr = *h};
        gw__part_of(h->bytes, nparts, s, &st->cur.off, &st->cur.len);
        if (t->test_corrupt | t->test_corrupt_seq) { /* (tests) */
          ++t->frames_sent;
          if (t->frames_sent == (uint32_t)t->test_corrupt) st->cur.len = 0xfffffff0u;
          if (t->frames_sent == (uint32_t)t->test_corrupt_seq) st->cur.hdr.op.seq ^= 1ull << 38;
        }
        st->busy = true;
        st->done = 0;
      }
      const uint8_t *payload = t->slots + (size_t)(st->next_pos % t->nslots) * t->slot_bytes + st->cur.off;
      size_t flen = sizeof st->cur, total = flen + (st->cur.len == 0xfffffff0u ? 0 : st->cur.len);
      struct iovec iov[2];
      int n = 0;
      if (st->done < flen) iov[n++] = (struct iovec){(uint8_t *)&st->cur + st->done, flen - st->done};
      size_t pdone = st->done > flen ? st->done - flen : 0;
      if (total > flen) iov[n++] = (struct iovec){(void *)(payload + pdone), total - flen - pdone};
      ssize_t w = n ? sendmsg(st->fd, &(struct msghdr){.msg_iov = iov, .msg_iovlen = (size_t)n},
                              MSG_NOSIGNAL | MSG_DONTWAIT)
                    : 0;
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
          pending = true;
          break;
        }
        return io_fail(c, t, "send", errno);
      }
      st->done += (size_t)w;
      if (st->done < total) {
        pending = true;
        break;
      }
      st->busy = false;
      st->next_pos++;
    }
  }
  return pending ? GW_INPROGRESS : GW_SUCCESS;
}

static gw_result_t tcp_send_slot(struct gw_conn *c, size_t bytes, void **buf, size_t *cap) {
  struct tcp_conn *t = c->priv;
  (void)bytes;
  if (t->failed) return t->failed;
  if (t->pos - min_stream_pos(t) >= t->nslots) {
    gw_result_t r = pump_send(c, t);
    if (r != GW_SUCCESS && r != GW_INPROGRESS) return r;
    if (t->pos - min_stream_pos(t) >= t->nslots) return GW_INPROGRESS;
  }
  *buf = t->slots + (size_t)(t->pos % t->nslots) * t->slot_bytes;
  *cap = t->slot_bytes;
  return GW_SUCCESS;
}

static void back_read(struct tcp_conn *t);

static gw_result_t tcp_send_post(struct gw_conn *c, const struct gw_chunk_hdr *h) {
  struct tcp_conn *t = c->priv;
  /* the way back's waiting records taken in once in 16 operations, or
   * half a second, so a sender that never waits long does not let them fill
   * the socket (the receiver publishes at most one a wait for this
   * sender's data), nor leaves one unread when it closes: a socket closed
   * with bytes unread resets, and the receiver loses what it had not read
   * yet of this sender's last data */
  if ((h->op.seq >= t->drained_seq + 16 || gw__now() - t->drained_at > 0.5) &&
      !atomic_flag_test_and_set(&t->back.lock)) {
    t->drained_seq = h->op.seq, t->drained_at = gw__now();
    back_read(t);
    atomic_flag_clear(&t->back.lock);
  }
  t->shdr[t->pos % t->nslots] = *h;
  t->pos++;
  gw_result_t r = pump_send(c, t);
  return r == GW_INPROGRESS ? GW_SUCCESS : r;
}

/* ---- data path: receiver ---------------------------------------------------------- */
static gw_result_t check_frame(struct gw_conn *c, struct tcp_conn *t, uint32_t s, const struct tcp_frame *f) {
  const struct tcp_rstream *rs = &t->rs[s];
  if (f->magic != TCP_FRAME_MAGIC || f->stream != s)
    return fail(c, t, GW_ERR_REMOTE, "malformed frame on stream %u (magic 0x%08x, stream %u)", s, f->magic, f->stream);
  if (f->hdr.bytes > t->slot_bytes)
    return fail(c, t, GW_ERR_REMOTE, "frame announces a %u-byte chunk, more than the %u-byte slots", f->hdr.bytes,
                t->slot_bytes);
  if ((rs->any && f->pos <= rs->last_pos) || f->pos < t->pos)
    return fail(c, t, GW_ERR_REMOTE, "frame for chunk %llu arrived out of order on stream %u",
                (unsigned long long)f->pos, s);
  /* Stream 0 carries a part of every chunk: one skipped there never completes. */
  if (s == 0 && f->pos != (rs->any ? rs->last_pos + 1 : 0))
    return fail(c, t, GW_ERR_REMOTE, "frame for chunk %llu on stream 0 skips chunk %llu", (unsigned long long)f->pos,
                (unsigned long long)(rs->any ? rs->last_pos + 1 : 0));
  uint32_t nparts = gw__nparts(f->hdr.bytes, t->nstreams, TCP_MIN_PART), off, len;
  if (s >= nparts) return fail(c, t, GW_ERR_REMOTE, "stream %u carries a part of a %u-part chunk", s, nparts);
  gw__part_of(f->hdr.bytes, nparts, s, &off, &len);
  if (f->off != off || f->len != len)
    return fail(c, t, GW_ERR_REMOTE, "frame part %u+%u does not match its %u-byte chunk (expected %u+%u)", f->off,
                f->len, f->hdr.bytes, off, len);
  return GW_SUCCESS;
}

/* Reads what the socket has into the stream's small buffer.  Returns GW_SUCCESS
 * when bytes arrived, GW_INPROGRESS when none (would block, or the peer closed at
 * a frame boundary), or an error. */
static gw_result_t fill(struct gw_conn *c, struct tcp_conn *t, struct tcp_rstream *rs) {
  if (rs->eof) return GW_INPROGRESS;
  if (rs->boff == rs->blen) rs->boff = rs->blen = 0;
  if (rs->blen == sizeof rs->buf) { /* keep the unread tail, make room behind it */
    memmove(rs->buf, rs->buf + rs->boff, rs->blen - rs->boff);
    rs->blen -= rs->boff;
    rs->boff = 0;
  }
  ssize_t n = recv(rs->fd, rs->buf + rs->blen, sizeof rs->buf - rs->blen, MSG_DONTWAIT);
  if (n > 0) {
    rs->blen += (uint32_t)n;
    return GW_SUCCESS;
  }
  if (n == 0) {
    /* A sender that finished closes all its sockets; a socket with nothing more to
     * carry may close before another delivers the last part (see check_owed). */
    if (rs->have_frame || rs->blen > rs->boff)
      return fail(c, t, GW_ERR_REMOTE, "closed by the peer in the middle of a frame (did rank %d exit?)", c->peer);
    rs->eof = true;
    return GW_INPROGRESS;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return GW_INPROGRESS;
  return io_fail(c, t, "receive", errno);
}

static void slot_take_hdr(struct tcp_conn *t, struct tcp_rslot *sl, const struct tcp_frame *f) {
  sl->hdr = f->hdr;
  sl->have_hdr = true;
  sl->parts = gw__nparts(f->hdr.bytes, t->nstreams, TCP_MIN_PART);
  sl->parts_done = 0;
  sl->got_mask = 0;
}

/* Small frames are read through a per-socket buffer (one recv for header and
 * payload, often for several frames); big payloads go straight from the socket
 * into their slot, so bulk data is copied once. */
static gw_result_t pump_recv(struct gw_conn *c, struct tcp_conn *t) {
  GW_CHECK(back_failed(c, t));
  for (uint32_t s = 0; s < t->nstreams; s++) {
    struct tcp_rstream *rs = &t->rs[s];
    for (;;) {
      if (!rs->have_frame) {
        if (rs->blen - rs->boff < sizeof rs->f) {
          gw_result_t r = fill(c, t, rs);
          if (r == GW_INPROGRESS) break;
          if (r != GW_SUCCESS) return r;
          continue;
        }
        memcpy(&rs->f, rs->buf + rs->boff, sizeof rs->f);
        rs->boff += (uint32_t)sizeof rs->f;
        GW_CHECK(check_frame(c, t, s, &rs->f));
        rs->have_frame = true;
        rs->got = 0;
        if (rs->f.pos < t->pos + t->nslots) {
          struct tcp_rslot *sl = &t->rslot[rs->f.pos % t->nslots];
          if (!sl->have_hdr) slot_take_hdr(t, sl, &rs->f);
          else if (memcmp(&sl->hdr, &rs->f.hdr, sizeof sl->hdr) != 0)
            return fail(c, t, GW_ERR_REMOTE, "the parts of chunk %llu disagree on its header",
                        (unsigned long long)rs->f.pos);
        }
        continue;
      }
      if (rs->f.pos >= t->pos + t->nslots) break; /* its slot is still in use: read on later */
      uint8_t *dst = t->slots + (size_t)(rs->f.pos % t->nslots) * t->slot_bytes + rs->f.off + rs->got;
      size_t want = rs->f.len - rs->got;
      if (want > 0) {
        size_t avail = rs->blen - rs->boff;
        if (avail > 0) {
          size_t n = GW_MIN(avail, want);
          memcpy(dst, rs->buf + rs->boff, n);
          rs->boff += (uint32_t)n;
          rs->got += n;
        } else if (want >= sizeof rs->buf && !rs->eof) {
          ssize_t n = recv(rs->fd, dst, want, MSG_DONTWAIT);
          if (n == 0) return fail(c, t, GW_ERR_REMOTE, "closed by the peer in the middle of a frame (did rank %d exit?)", c->peer);
          if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            return io_fail(c, t, "receive", errno);
          }
          rs->got += (size_t)n;
        } else {
          gw_result_t r = fill(c, t, rs);
          if (r == GW_INPROGRESS) break;
          if (r != GW_SUCCESS) return r;
        }
        continue;
      }
      /* a whole part is in its slot */
      struct tcp_rslot *sl = &t->rslot[rs->f.pos % t->nslots];
      if (!sl->have_hdr) slot_take_hdr(t, sl, &rs->f); /* its header came while the slot was busy */
      else if (memcmp(&sl->hdr, &rs->f.hdr, sizeof sl->hdr) != 0) /* and another part's came since */
        return fail(c, t, GW_ERR_REMOTE, "the parts of chunk %llu disagree on its header",
                    (unsigned long long)rs->f.pos);
      sl->parts_done++;
      sl->got_mask |= 1u << s;
      rs->last_pos = rs->f.pos;
      rs->any = true;
      rs->have_frame = false;
      rs->got = 0;
    }
  }
  return GW_SUCCESS;
}

/* The next chunk is incomplete: is a socket that owes part of it closed, or
 * past it without that part (a stream's frames come in order: the part can
 * no longer come, and the wait would last until the deadline)? */
static gw_result_t check_owed(struct gw_conn *c, struct tcp_conn *t, const struct tcp_rslot *sl) {
  for (uint32_t s = 0; s < t->nstreams; s++) {
    const struct tcp_rstream *rs = &t->rs[s];
    bool owes = s == 0 || (sl->have_hdr && s < sl->parts);
    bool delivered = rs->any && rs->last_pos >= t->pos;
    if (rs->eof && owes && !delivered)
      return fail(c, t, GW_ERR_REMOTE, "closed by the peer (did rank %d exit?)", c->peer);
    if (owes && sl->have_hdr && !(sl->got_mask & (1u << s)) && rs->any && rs->last_pos > t->pos)
      return fail(c, t, GW_ERR_REMOTE, "stream %u skipped its part of chunk %llu (its last part is of chunk %llu)", s,
                  (unsigned long long)t->pos, (unsigned long long)rs->last_pos);
  }
  return GW_SUCCESS;
}

static gw_result_t tcp_recv_peek(struct gw_conn *c, const struct gw_chunk_hdr **h, const void **data) {
  struct tcp_conn *t = c->priv;
  if (t->failed) return t->failed;
  struct tcp_rslot *sl = &t->rslot[t->pos % t->nslots];
  if (!(sl->have_hdr && sl->parts_done == sl->parts)) {
    GW_CHECK(pump_recv(c, t));
    if (!(sl->have_hdr && sl->parts_done == sl->parts)) {
      if (!c->look) GW_CHECK(check_owed(c, t, sl));
      return GW_INPROGRESS;
    }
  }
  *h = &sl->hdr;
  *data = t->slots + (size_t)(t->pos % t->nslots) * t->slot_bytes;
  return GW_SUCCESS;
}

static gw_result_t tcp_recv_release(struct gw_conn *c) {
  struct tcp_conn *t = c->priv;
  t->rslot[t->pos % t->nslots].have_hdr = false;
  t->pos++;
  return GW_SUCCESS;
}

static gw_result_t tcp_progress(struct gw_conn *c, struct gw_errctx *err) {
  struct tcp_conn *t = c->priv;
  gw_result_t r = t->failed ? t->failed : c->is_send ? pump_send(c, t) : pump_recv(c, t);
  if (r != GW_SUCCESS && r != GW_INPROGRESS) return gw__err(err, r, "%s", t->failmsg);
  return r;
}

/* The receiver's rank failed: its reason goes back on stream 0, which
 * otherwise carries only waiting records that way (the sender takes those
 * in, so one non-blocking send takes it). */
static void tcp_recv_abandon(struct gw_conn *c, const char *why) {
  struct tcp_conn *t = c->priv;
  if (!t || t->rs[0].fd < 0) return;
  uint8_t buf[8 + TCP_ABANDON_MAX];
  const uint32_t magic = TCP_ABANDON_MAGIC, len = (uint32_t)GW_MIN(strlen(why), (size_t)TCP_ABANDON_MAX);
  memcpy(buf, &magic, 4), memcpy(buf + 4, &len, 4), memcpy(buf + 8, why, len);
  gw__way_back_abandon(t->rs[0].fd, &t->back, buf, 8 + len, &t->back_err);
}

/* Sender, under back.lock: takes in what came back; waiting records are
 * consumed (the latest kept), an abandon record stays at the front. */
static void back_read(struct tcp_conn *t) {
  if (t->ss[0].fd < 0) return;
  for (;;) {
    uint32_t magic = 0, wlen = 0;
    if (t->ab_got >= 8) memcpy(&magic, t->ab_buf, 4), memcpy(&wlen, t->ab_buf + 4, 4);
    if (t->ab_got >= 8 && magic == TCP_WAIT_MAGIC && wlen != sizeof(struct gw_opdesc)) return; /* no gradwire's */
    if (t->ab_got >= TCP_WAIT_BYTES && magic == TCP_WAIT_MAGIC) {
      memcpy(&t->peer_wait, t->ab_buf + 8, sizeof t->peer_wait);
      t->peer_waits = true;
      t->ab_got -= (uint32_t)TCP_WAIT_BYTES;
      memmove(t->ab_buf, t->ab_buf + TCP_WAIT_BYTES, t->ab_got);
      continue;
    }
    /* an abandon record, whole (or what no gradwire sends): it stays */
    if (t->ab_got >= 8 && magic != TCP_WAIT_MAGIC && (magic != TCP_ABANDON_MAGIC || wlen > TCP_ABANDON_MAX ||
                                                      t->ab_got >= 8 + wlen))
      return;
    if (t->ab_got >= sizeof t->ab_buf) return;
    const ssize_t n = recv(t->ss[0].fd, t->ab_buf + t->ab_got, sizeof t->ab_buf - t->ab_got, MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      atomic_store_explicit(&t->back_err, errno, memory_order_relaxed);
    if (n <= 0) return;
    t->ab_got += (uint32_t)n;
  }
}

static bool tcp_send_abandoned(struct gw_conn *c, char *why, size_t len) {
  struct tcp_conn *t = c->priv;
  if (!t || t->ss[0].fd < 0 || atomic_flag_test_and_set(&t->back.lock)) return false;
  back_read(t);
  uint32_t magic = 0, wlen = 0;
  if (t->ab_got >= 8) memcpy(&magic, t->ab_buf, 4), memcpy(&wlen, t->ab_buf + 4, 4);
  const bool said = t->ab_got >= 8 && magic == TCP_ABANDON_MAGIC && wlen <= TCP_ABANDON_MAX && t->ab_got >= 8 + wlen;
  if (said) snprintf(why, len, "%.*s", (int)wlen, (const char *)t->ab_buf + 8);
  atomic_flag_clear(&t->back.lock);
  return said;
}

/* The receiver publishes the operation it has waited in for a second or
 * more on this connection before it sent anything in it (once per
 * operation; a shorter wait is a straggler's, every day, and a ring
 * allreduce's ranks send first, so DDP's gradients publish nothing);
 * the sender reads the latest the receiver published.  One way only: the
 * way forward is the chunks' stream. */
static bool tcp_waiting(struct gw_conn *c, const struct gw_opdesc *mine, double waited, bool awaited,
                        struct gw_opdesc *theirs) {
  struct tcp_conn *t = c->priv;
  if (!t) return false;
  if (!c->is_send) {
    /* the sender takes the records in at least once in 16 of the operations
     * that publish them, so this direction's window does not stay shut */
    const uint32_t head[2] = {TCP_WAIT_MAGIC, sizeof *mine};
    if (t->rs[0].fd >= 0)
      gw__way_back_waiting(t->rs[0].fd, &t->back, head, sizeof head, mine, waited, awaited, &t->back_err);
    return false;
  }
  if (atomic_flag_test_and_set(&t->back.lock)) return false;
  back_read(t);
  const bool got = t->peer_waits;
  if (got) *theirs = t->peer_wait;
  atomic_flag_clear(&t->back.lock);
  return got;
}

static int tcp_pollfds(struct gw_conn *c, struct pollfd *out, int max) {
  struct tcp_conn *t = c->priv;
  int n = 0;
  for (uint32_t s = 0; s < t->nstreams && n < max; s++) {
    if (c->is_send) {
      if (t->ss[s].next_pos < t->pos) out[n++] = (struct pollfd){.fd = t->ss[s].fd, .events = POLLOUT};
    } else if (!t->rs[s].eof && !(t->rs[s].have_frame && t->rs[s].f.pos >= t->pos + t->nslots)) {
      /* Not a stream parked on a frame whose slot is still in use: its socket
       * stays readable, and polling it would return at once, again and again. */
      out[n++] = (struct pollfd){.fd = t->rs[s].fd, .events = POLLIN};
    }
  }
  return n;
}

static void tcp_close(struct gw_conn *c) {
  struct tcp_conn *t = c->priv;
  if (!t) return;
  /* the way back's unread records taken first: closed with bytes unread, the
   * socket resets, and the receiver loses what it had not read yet of ours
   * (an abort notice) */
  if (c->is_send && t->ss[0].fd >= 0) {
    uint8_t sink[256];
    while (recv(t->ss[0].fd, sink, sizeof sink, MSG_DONTWAIT) > 0) continue;
  }
  for (int s = 0; s < TCP_MAX_STREAMS; s++) {
    gw__sock_close(t->ss[s].fd);
    gw__sock_close(t->rs[s].fd);
  }
  gw__sock_close(t->listen_fd);
  if (t->slots) munmap(t->slots, t->map_bytes);
  free(t->shdr);
  free(t->rslot);
  free(t);
  c->priv = NULL;
}

const struct gw_transport gw__tcp_transport = {
    .name = "tcp",
    .can_connect = tcp_can_connect,
    .net_stalled = tcp_net_stalled,
    .recv_setup = tcp_recv_setup,
    .send_connect = tcp_send_connect,
    .recv_connect = tcp_recv_connect,
    .send_slot = tcp_send_slot,
    .send_post = tcp_send_post,
    .recv_peek = tcp_recv_peek,
    .recv_release = tcp_recv_release,
    .progress = tcp_progress,
    .pollfds = tcp_pollfds,
    .recv_abandon = tcp_recv_abandon,
    .send_abandoned = tcp_send_abandoned,
    .waiting = tcp_waiting,
    .close = tcp_close,
};
