/* ring.c - ring algorithms for every collective, built from the primitive set of
 * NCCL's ring (send, recv, recv-reduce-send, recv-reduce-copy-send,
 * recv-copy-send, recv-reduce-copy) over the ring's two connections.  Data is
 * split into blocks of at most one slot, so the FIFO depth keeps several chunks
 * in flight and the ring stays pipelined.  Every received chunk's header is
 * checked against this rank's own call, so ranks that called different
 * collectives fail with a message naming both calls instead of corrupting data.
 * The same code serves every transport; only host memory is handled here. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "comm.h"

struct prims {
  struct gw_comm *comm;
  struct gw_ring *ring; /* this channel's ring */
  const struct gw_op *op;
  const void *in;  /* this channel's part of the input (NULL when empty) */
  void *out;       /* and of the output */
  size_t count;    /* elements this channel moves (per rank's block for RS/AG) */
  size_t stride;   /* RS/AG: elements between consecutive ranks' blocks */
  struct gw_errctx *err;
  gw_reduce_fn red;
  size_t es;       /* element size */
  uint32_t sent;   /* chunks sent so far */
  bool stream_out; /* write the user's output with non-temporal stores */
};

GW_PARAM(StreamThreshold, "GW_NT_THRESHOLD", 8 << 20)
GW_PARAM(ExchangeMaxBytes, "GW_EXCHANGE_MAX_BYTES", 256 << 10)

const char *gw__coll_name(int coll) {
  switch (coll) {
    case GW_COLL_ALLREDUCE: return "allreduce";
    case GW_COLL_BROADCAST: return "broadcast";
    case GW_COLL_ALLGATHER: return "allgather";
    case GW_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case GW_COLL_BARRIER: return "barrier";
  }
  return "unknown-collective";
}

static void describe(const struct gw_opdesc *d, char *buf, size_t len) {
  const char *dt = gw_dtype_name((gw_dtype_t)d->dtype);
  switch (d->coll) {
    case GW_COLL_BARRIER:
      snprintf(buf, len, "#%" PRIu64 " barrier()", d->seq);
      break;
    case GW_COLL_BROADCAST:
      snprintf(buf, len, "#%" PRIu64 " broadcast(count=%" PRIu64 ", %s, root=%d)", d->seq, d->count, dt, d->root);
      break;
    case GW_COLL_ALLGATHER:
      snprintf(buf, len, "#%" PRIu64 " allgather(count=%" PRIu64 ", %s)", d->seq, d->count, dt);
      break;
    default:
      snprintf(buf, len, "#%" PRIu64 " %s(count=%" PRIu64 ", %s, %s)", d->seq, gw__coll_name(d->coll), d->count,
               dt, gw_op_name((gw_op_t)d->op));
  }
}

static gw_result_t timeout_error(struct prims *p, const char *what, int peer) {
  char me[160];
  describe(&p->op->desc, me, sizeof me);
  return gw__err(p->err, GW_ERR_TIMEOUT,
                 "rank %d: operation %s waited %.0f s for %s rank %d; that rank is stuck, dead or "
                 "in a different operation (raise GW_TIMEOUT if it is just slow)",
                 p->comm->rank, me, p->comm->timeout_s, what, peer);
}

/* Transports that queue bytes in user space (tcp) move them while we wait on
 * anything, so two ranks waiting on each other's queued sends cannot deadlock. */
static gw_result_t pump(struct prims *p) {
  struct gw_ring *ring = p->ring;
  if (ring->send.tp->progress) {
    gw_result_t r = ring->send.tp->progress(&ring->send, p->err);
    if (r != GW_SUCCESS && r != GW_INPROGRESS) return r;
  }
  if (ring->recv.tp->progress) {
    gw_result_t r = ring->recv.tp->progress(&ring->recv, p->err);
    if (r != GW_SUCCESS && r != GW_INPROGRESS) return r;
  }
  return GW_SUCCESS;
}

/* Whether a peer on this machine still runs (a zombie counts as dead: its
 * launcher has not reaped it yet).  Peers elsewhere are watched by their
 * transport (a closed socket). */
static bool peer_alive(const struct gw_comm *comm, int peer) {
  const struct gw_peer_info *pi = &comm->peers[peer];
  if (strcmp(pi->node_id, comm->peers[comm->rank].node_id) != 0 || pi->pid <= 0) return true;
  if (kill(pi->pid, 0) != 0 && errno == ESRCH) return false;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pi->pid);
  FILE *f = fopen(path, "r");
  if (!f) return true;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *close = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return !(close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X'));
}

/* While a wait drags on, look every ~1024 slow steps whether the rank we wait
 * for (on this machine) died (kill -9, crash): fail within a second or so instead
 * of at the deadline.  Returns true when it is dead. */
static bool waited_peer_dead(struct prims *p, const struct gw_waiter *w, int peer) {
  if (!gw__waiter_done_spinning(w) || (w->iter & 1023) != 0) return false;
  return !peer_alive(p->comm, peer);
}

static gw_result_t dead_peer_error(struct prims *p, int peer) {
  char me[160];
  describe(&p->op->desc, me, sizeof me);
  return gw__err(p->err, GW_ERR_REMOTE, "rank %d: rank %d (pid %d on this machine) died during operation %s",
                 p->comm->rank, peer, (int)p->comm->peers[peer].pid, me);
}

static gw_result_t aborted_error(struct prims *p) {
  char me[160];
  describe(&p->op->desc, me, sizeof me);
  return gw__err(p->err, GW_ERR_ABORTED, "rank %d: operation %s stopped: the communicator was aborted (gw_comm_abort)",
                 p->comm->rank, me);
}

/* One wait step: past the spinning phase, ranks whose connections have file
 * descriptors sleep in poll() until one is ready (at most 1 ms, then look again);
 * otherwise the common back-off.  False once the deadline has passed or the
 * communicator was aborted (the caller tells which by looking at `aborted`). */
static bool wait_step(struct prims *p, struct gw_waiter *w) {
  struct gw_ring *ring = p->ring;
  if (atomic_load_explicit(&p->comm->aborted, memory_order_relaxed)) return false;
  if ((ring->send.tp->pollfds || ring->recv.tp->pollfds) && gw__waiter_done_spinning(w)) {
    struct pollfd fds[32];
    int n = 0;
    if (ring->send.tp->pollfds) n += ring->send.tp->pollfds(&ring->send, fds, 16);
    if (ring->recv.tp->pollfds) n += ring->recv.tp->pollfds(&ring->recv, fds + n, 16);
    if (n > 0) {
      poll(fds, (nfds_t)n, 1);
      return !gw__waiter_expired(w);
    }
  }
  return gw__waiter_pause(w);
}

/* A data-path call failed: let the transport say why (it keeps the message). */
static gw_result_t conn_error(struct prims *p, struct gw_conn *c, gw_result_t r) {
  if (c->tp->progress) {
    gw_result_t r2 = c->tp->progress(c, p->err);
    if (r2 != GW_SUCCESS && r2 != GW_INPROGRESS) return r2;
  }
  return gw__err(p->err, r, "rank %d: %s failed", p->comm->rank, c->desc);
}

/* Before an operation completes, everything it sent must have left user space. */
static gw_result_t flush(struct prims *p) {
  struct gw_conn *c = &p->ring->send;
  if (!c->tp->progress) return GW_SUCCESS;
  struct gw_waiter w;
  gw__waiter_init(&w, p->comm->timeout_s);
  for (;;) {
    gw_result_t r = c->tp->progress(c, p->err);
    if (r == GW_SUCCESS) return GW_SUCCESS;
    if (r != GW_INPROGRESS) return r;
    GW_CHECK(pump(p));
    if (!wait_step(p, &w)) return p->comm->aborted ? aborted_error(p) : timeout_error(p, "its socket to drain towards", c->peer);
  }
}

static gw_result_t wait_slot(struct prims *p, size_t bytes, void **slot) {
  struct gw_conn *c = &p->ring->send;
  size_t cap;
  gw_result_t r = c->tp->send_slot(c, bytes, slot, &cap);
  if (r != GW_INPROGRESS) return r;
  struct gw_waiter w;
  gw__waiter_init(&w, p->comm->timeout_s);
  while ((r = c->tp->send_slot(c, bytes, slot, &cap)) == GW_INPROGRESS) {
    GW_CHECK(pump(p));
    /* it may have freed the slot just before it exited: look once more */
    if (waited_peer_dead(p, &w, c->peer) && c->tp->send_slot(c, bytes, slot, &cap) == GW_INPROGRESS)
      return dead_peer_error(p, c->peer);
    if (!wait_step(p, &w)) return p->comm->aborted ? aborted_error(p) : timeout_error(p, "a free slot at", c->peer);
  }
  return r == GW_SUCCESS ? r : conn_error(p, c, r);
}

static gw_result_t conn_error(struct prims *p, struct gw_conn *c, gw_result_t r);

static gw_result_t post(struct prims *p, size_t bytes) {
  struct gw_conn *c = &p->ring->send;
  struct gw_chunk_hdr h = {.op = p->op->desc, .bytes = (uint32_t)bytes, .step = p->sent++};
  gw_result_t r = c->tp->send_post(c, &h);
  return r == GW_SUCCESS ? r : conn_error(p, c, r);
}

static gw_result_t wait_recv(struct prims *p, const void **data, size_t bytes) {
  struct gw_conn *c = &p->ring->recv;
  const struct gw_chunk_hdr *h;
  gw_result_t r = c->tp->recv_peek(c, &h, data);
  if (r == GW_INPROGRESS) {
    struct gw_waiter w;
    gw__waiter_init(&w, p->comm->timeout_s);
    while ((r = c->tp->recv_peek(c, &h, data)) == GW_INPROGRESS) {
      GW_CHECK(pump(p));
      /* it may have posted the chunk just before it exited: look once more */
      if (waited_peer_dead(p, &w, c->peer) && c->tp->recv_peek(c, &h, data) == GW_INPROGRESS)
        return dead_peer_error(p, c->peer);
      if (!wait_step(p, &w)) return p->comm->aborted ? aborted_error(p) : timeout_error(p, "data from", c->peer);
    }
  }
  if (r != GW_SUCCESS) return conn_error(p, c, r);
  struct gw_opdesc theirs = h->op;
  if (theirs.coll == GW_COLL_ABORT) {
    char msg[GW_ERRMSG_MAX];
    size_t len = GW_MIN((size_t)h->bytes, sizeof msg - 1);
    memcpy(msg, *data, len);
    msg[len] = 0;
    return gw__err(p->err, GW_ERR_REMOTE, "rank %d: rank %d failed and stopped the job: %s", p->comm->rank,
                   c->peer, msg);
  }
  if (memcmp(&theirs, &p->op->desc, sizeof theirs) != 0) {
    char me[160], them[160];
    describe(&p->op->desc, me, sizeof me);
    describe(&theirs, them, sizeof them);
    return gw__err(p->err, GW_ERR_INVALID_ARGUMENT,
                   "rank %d: collective calls differ across ranks: this rank called %s but rank %d called %s",
                   p->comm->rank, me, c->peer, them);
  }
  if (h->bytes != bytes)
    return gw__err(p->err, GW_ERR_INTERNAL, "rank %d: chunk %u from rank %d has %u bytes, expected %zu",
                   p->comm->rank, h->step, c->peer, h->bytes, bytes);
  return GW_SUCCESS;
}

static gw_result_t release(struct prims *p) {
  struct gw_conn *c = &p->ring->recv;
  return c->tp->recv_release(c);
}

static void abort_one(struct gw_comm *comm, struct gw_conn *c, const struct gw_opdesc *desc, const char *msg);

void gw__ring_send_abort(struct gw_comm *comm, const struct gw_opdesc *desc, const char *msg) {
  for (int ch = 0; ch < comm->nchannels; ch++) abort_one(comm, &comm->rings[ch].send, desc, msg);
}

static void abort_one(struct gw_comm *comm, struct gw_conn *c, const struct gw_opdesc *desc, const char *msg) {
  if (!c->tp) return;
  void *slot;
  size_t cap, want = GW_MIN(strlen(msg), (size_t)comm->conn_params.slot_bytes);
  /* A full FIFO means the successor is busy or stuck: give up after a moment. */
  struct gw_waiter w;
  gw__waiter_init(&w, 0.5);
  gw_result_t r;
  while ((r = c->tp->send_slot(c, want, &slot, &cap)) == GW_INPROGRESS)
    if (!gw__waiter_pause(&w)) return;
  if (r != GW_SUCCESS) return;
  size_t len = GW_MIN(strlen(msg), cap);
  memcpy(slot, msg, len);
  struct gw_chunk_hdr h = {.op = *desc, .bytes = (uint32_t)len};
  h.op.coll = GW_COLL_ABORT;
  c->tp->send_post(c, &h);
}

/* ---- the primitives: n is in elements, pointers may be NULL when n == 0 ---- */

/* slot <- src, and dst <- src too when dst is not NULL. */
static gw_result_t prim_send(struct prims *p, const void *src, void *dst, size_t n) {
  void *slot;
  GW_CHECK(wait_slot(p, n * p->es, &slot));
  if (n) gw__copy2(slot, dst, src, n * p->es);
  return post(p, n * p->es);
}

static gw_result_t prim_recv(struct prims *p, void *dst, size_t n) {
  const void *data;
  GW_CHECK(wait_recv(p, &data, n * p->es));
  if (n && p->stream_out) gw__copy_stream(dst, data, n * p->es);
  else if (n) memcpy(dst, data, n * p->es);
  return release(p);
}

static gw_result_t prim_recv_reduce_send(struct prims *p, const void *src, size_t n) {
  const void *data;
  void *slot;
  GW_CHECK(wait_recv(p, &data, n * p->es));
  GW_CHECK(wait_slot(p, n * p->es, &slot));
  if (n) p->red(slot, NULL, data, src, n, 0);
  GW_CHECK(post(p, n * p->es));
  return release(p);
}

static gw_result_t prim_recv_reduce_copy_send(struct prims *p, const void *src, void *dst, size_t n,
                                              uint32_t div) {
  const void *data;
  void *slot;
  GW_CHECK(wait_recv(p, &data, n * p->es));
  GW_CHECK(wait_slot(p, n * p->es, &slot));
  if (n && p->stream_out) {
    /* reduce once into the slot (it stays in cache), then stream it out */
    p->red(slot, NULL, data, src, n, div);
    gw__copy_stream(dst, slot, n * p->es);
  } else if (n) {
    p->red(dst, slot, data, src, n, div);
  }
  GW_CHECK(post(p, n * p->es));
  return release(p);
}

/* local_first: pass the local data as the first operand, so that two ranks
 * computing the same reduction order their operands the same way (max/min pick
 * the second operand on NaN; every other op is commutative bit for bit). */
static gw_result_t prim_recv_reduce_copy(struct prims *p, const void *src, void *dst, size_t n, uint32_t div,
                                         bool local_first) {
  const void *data;
  GW_CHECK(wait_recv(p, &data, n * p->es));
  if (n && local_first) p->red(dst, NULL, src, data, n, div);
  else if (n) p->red(dst, NULL, data, src, n, div);
  return release(p);
}

static gw_result_t prim_recv_copy_send(struct prims *p, void *dst, size_t n) {
  const void *data;
  void *slot;
  GW_CHECK(wait_recv(p, &data, n * p->es));
  GW_CHECK(wait_slot(p, n * p->es, &slot));
  if (n && p->stream_out) {
    memcpy(slot, data, n * p->es);
    gw__copy_stream(dst, data, n * p->es);
  } else if (n) {
    gw__copy2(dst, slot, data, n * p->es);
  }
  GW_CHECK(post(p, n * p->es));
  return release(p);
}

/* ---- algorithms ---------------------------------------------------------------- */

static inline const uint8_t *cat(const void *base, size_t idx, size_t es) {
  return base ? (const uint8_t *)base + idx * es : NULL;
}
static inline uint8_t *at(void *base, size_t idx, size_t es) {
  return base ? (uint8_t *)base + idx * es : NULL;
}
static inline size_t blk_len(size_t count, size_t start, size_t len) {
  return start >= count ? 0 : GW_MIN(len, count - start);
}
static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* The algorithms walk ring positions (ring->index is this rank's), not ranks:
 * the ring is ordered by machine.  Blocks of allreduce belong to positions; the
 * blocks of reduce-scatter, allgather and the broadcast root belong to ranks, so
 * those map positions to ranks through ring->order. */
static gw_result_t ring_allreduce(struct prims *p) {
  const int n = p->comm->nranks, r = p->ring->index;
  const size_t count = p->count, es = p->es;
  const size_t chunk = p->comm->conn_params.slot_bytes / es;
  const size_t align = GW_MAX((size_t)1, 64 / es); /* keep blocks cache-line aligned */
  const uint32_t div = p->op->desc.op == GW_AVG ? (uint32_t)n : 0;
  const void *in = p->in;
  void *out = p->out;
  size_t off = 0;
  do {
    size_t real = GW_MIN(chunk, GW_ALIGN_UP(GW_DIV_UP(count - off, (size_t)n), align));
#define BLK(k) (off + (size_t)(k) * real)
#define LEN(k) blk_len(count, BLK(k), real)
    int k = mod(r - 1, n);
    GW_CHECK(prim_send(p, cat(in, BLK(k), es), NULL, LEN(k)));
    for (int j = 2; j < n; j++) {
      k = mod(r - j, n);
      GW_CHECK(prim_recv_reduce_send(p, cat(in, BLK(k), es), LEN(k)));
    }
    k = r;
    GW_CHECK(prim_recv_reduce_copy_send(p, cat(in, BLK(k), es), at(out, BLK(k), es), LEN(k), div));
    for (int j = 1; j < n - 1; j++) {
      k = mod(r - j, n);
      GW_CHECK(prim_recv_copy_send(p, at(out, BLK(k), es), LEN(k)));
    }
    k = mod(r + 1, n);
    GW_CHECK(prim_recv(p, at(out, BLK(k), es), LEN(k)));
#undef BLK
#undef LEN
    off += (size_t)n * real;
  } while (off < count);
  return GW_SUCCESS;
}

/* Two ranks, small data: both send everything and both reduce, one hop instead
 * of the ring's two.  Rank 0's data is always the first operand, so both ranks
 * compute bit-identical results. */
static gw_result_t exchange_allreduce(struct prims *p) {
  const size_t count = p->count, es = p->es;
  const size_t chunk = p->comm->conn_params.slot_bytes / es;
  const uint32_t div = p->op->desc.op == GW_AVG ? 2 : 0;
  size_t off = 0;
  do {
    size_t len = blk_len(count, off, chunk);
    GW_CHECK(prim_send(p, cat(p->in, off, es), NULL, len));
    GW_CHECK(prim_recv_reduce_copy(p, cat(p->in, off, es), at(p->out, off, es), len, div,
                                   p->comm->rank == 0));
    off += chunk;
  } while (off < count);
  return GW_SUCCESS;
}

static gw_result_t ring_reduce_scatter(struct prims *p) {
  const int n = p->comm->nranks, r = p->ring->index;
  const int *order = p->ring->order;
  const size_t rc = p->stride, count = p->count, es = p->es;
  const size_t chunk = p->comm->conn_params.slot_bytes / es;
  const uint32_t div = p->op->desc.op == GW_AVG ? (uint32_t)n : 0;
  const void *in = p->in;
  void *out = p->out;
  size_t off = 0;
  do {
    size_t len = blk_len(count, off, chunk);
    int k = order[mod(r - 1, n)];
    GW_CHECK(prim_send(p, cat(in, (size_t)k * rc + off, es), NULL, len));
    for (int j = 2; j < n; j++) {
      k = order[mod(r - j, n)];
      GW_CHECK(prim_recv_reduce_send(p, cat(in, (size_t)k * rc + off, es), len));
    }
    k = order[r];
    GW_CHECK(prim_recv_reduce_copy(p, cat(in, (size_t)k * rc + off, es), at(out, off, es), len, div, false));
    off += chunk;
  } while (off < count);
  return GW_SUCCESS;
}

static gw_result_t ring_allgather(struct prims *p) {
  const int n = p->comm->nranks, r = p->ring->index, me = p->comm->rank;
  const int *order = p->ring->order;
  const size_t sc = p->stride, count = p->count, es = p->es;
  const size_t chunk = p->comm->conn_params.slot_bytes / es;
  const void *in = p->in;
  void *out = p->out;
  size_t off = 0;
  do {
    size_t len = blk_len(count, off, chunk);
    const uint8_t *own = cat(in, off, es);
    uint8_t *own_out = at(out, (size_t)me * sc + off, es);
    GW_CHECK(prim_send(p, own, own_out == own ? NULL : own_out, len));
    for (int j = 1; j < n - 1; j++) {
      int k = order[mod(r - j, n)];
      GW_CHECK(prim_recv_copy_send(p, at(out, (size_t)k * sc + off, es), len));
    }
    int k = order[mod(r + 1, n)];
    GW_CHECK(prim_recv(p, at(out, (size_t)k * sc + off, es), len));
    off += chunk;
  } while (off < count);
  return GW_SUCCESS;
}

static gw_result_t ring_broadcast(struct prims *p) {
  const int n = p->comm->nranks, r = p->ring->index;
  const size_t count = p->count, es = p->es;
  const size_t chunk = p->comm->conn_params.slot_bytes / es;
  const int pos = mod(r - p->ring->pos_of[p->op->desc.root], n); /* distance from the root along the ring */
  const void *in = p->in;
  void *out = p->out;
  size_t off = 0;
  do {
    size_t len = blk_len(count, off, chunk);
    if (pos == 0) {
      const uint8_t *src = cat(in, off, es);
      uint8_t *dst = at(out, off, es);
      GW_CHECK(prim_send(p, src, dst == src ? NULL : dst, len));
    } else if (pos == n - 1) {
      GW_CHECK(prim_recv(p, at(out, off, es), len));
    } else {
      GW_CHECK(prim_recv_copy_send(p, at(out, off, es), len));
    }
    off += chunk;
  } while (off < count);
  return GW_SUCCESS;
}

/* One rank: no communication, only the copy an out-of-place call implies. */
static gw_result_t single_rank(const struct gw_op *op, size_t es) {
  size_t bytes = op->desc.count * es;
  if (op->desc.coll == GW_COLL_BARRIER || bytes == 0 || op->sendbuf == op->recvbuf) return GW_SUCCESS;
  memcpy(op->recvbuf, op->sendbuf, bytes);
  return GW_SUCCESS;
}

/* Channel ch's share of [0, total): equal parts aligned to 64 bytes. */
static void channel_part(size_t total, size_t es, int ch, int nch, size_t *base, size_t *len) {
  size_t part = GW_ALIGN_UP(GW_DIV_UP(total, (size_t)nch), GW_MAX((size_t)1, 64 / es));
  size_t b = GW_MIN(total, (size_t)ch * part);
  *base = b;
  *len = GW_MIN(part, total - b);
}

gw_result_t gw__ring_run_channel(struct gw_comm *comm, int ch, int nch, const struct gw_op *op, struct gw_errctx *err) {
  struct prims p = {.comm = comm, .ring = &comm->rings[ch], .op = op, .err = err,
                    .es = gw_dtype_size((gw_dtype_t)op->desc.dtype)};
  if (comm->nranks == 1) return ch == 0 ? single_rank(op, p.es) : GW_SUCCESS;
  p.red = gw__reduce_fn((gw_dtype_t)op->desc.dtype, (gw_op_t)op->desc.op);
  /* Out of place and too big to stay in cache: the output is written once and not
   * read back soon, so skip reading its lines in (see docs/architecture.md). */
  size_t out_bytes = op->desc.count * p.es;
  if (op->desc.coll == GW_COLL_ALLGATHER) out_bytes *= (size_t)comm->nranks;
  p.stream_out = op->sendbuf != op->recvbuf && out_bytes >= (size_t)gw__param_StreamThreshold();
  /* Each channel moves its own slice: of the buffer, or of every rank's block. */
  size_t base;
  channel_part(op->desc.count, p.es, ch, nch, &base, &p.count);
  p.stride = op->desc.count;
  p.in = p.count ? cat(op->sendbuf, base, p.es) : NULL;
  p.out = p.count ? at(op->recvbuf, base, p.es) : NULL;
  gw_result_t res;
  switch (op->desc.coll) {
    case GW_COLL_ALLREDUCE:
    case GW_COLL_BARRIER:
      if (comm->nranks == 2 && (comm->algo == GW_ALGO_EXCHANGE ||
                                (comm->algo == GW_ALGO_AUTO && out_bytes <= (size_t)gw__param_ExchangeMaxBytes())))
        res = exchange_allreduce(&p);
      else
        res = ring_allreduce(&p);
      break;
    case GW_COLL_REDUCE_SCATTER: res = ring_reduce_scatter(&p); break;
    case GW_COLL_ALLGATHER: res = ring_allgather(&p); break;
    case GW_COLL_BROADCAST: res = ring_broadcast(&p); break;
    default: return gw__err(err, GW_ERR_INTERNAL, "rank %d: unknown collective %d", comm->rank, op->desc.coll);
  }
  return res == GW_SUCCESS ? flush(&p) : res;
}
