/* ring.c - ring algorithms for every collective, built from the primitive set of
 * NCCL's ring (send, recv, recv-reduce-send, recv-reduce-copy-send,
 * recv-copy-send, recv-reduce-copy) over the ring's two connections.  Data is
 * split into blocks of at most one chunk (a slot, or an LL chunk when the
 * operation's protocol is LL: gw__chunk_bytes), so the FIFO depth keeps several
 * chunks in flight and the ring stays pipelined.  Which algorithm and protocol
 * a call takes is the cost model's (tune.c), decided in enqueue.c.  The waits
 * under the primitives, and the check of every received header against this
 * rank's own call, are prims.c's.  The same code serves every transport, and
 * device memory too: on the device ring each primitive hands over to its
 * device form (device.c), which moves the payload between device twins of the
 * slots while the headers travel as always. */
#include <string.h>

#include "devring.h"
#include "prims.h"

GW_PARAM_MIN(StreamThreshold, "GW_NT_THRESHOLD", 8 << 20, 0)

/* ---- the primitives: n is in elements, pointers may be NULL when n == 0 ---- */

/* A widened operation's wire dtype (p->fold: the buffers are float32). */
static inline gw_dtype_t wire_of(const struct prims *p) { return (gw_dtype_t)p->op->desc.dtype; }
static inline gw_op_t op_of(const struct prims *p) { return (gw_op_t)p->op->desc.op; }

/* slot <- src, and dst <- src too when dst is not NULL.  A transport that can
 * send from registered memory (ib) may read src after this returns, until the
 * operation's flush: direct = false where src is written before then. */
static gw_result_t prim_send_ex(struct prims *p, const void *src, void *dst, size_t n, bool direct) {
  if (p->dev) return gw__dprim_send(p, src, dst, n);
  void *slot;
  GW_CHECK(gw__wait_slot(p, &p->ring->send, n * p->es, &slot));
  if (p->fold) { /* float32 into the wire; the algorithms that fold send no copy to dst */
    if (n) gw__cvt_from_f32_scaled(wire_of(p), slot, src, n, p->fscale);
    return gw__post(p, &p->ring->send, n * p->es);
  }
  if (direct && !dst && gw__direct_ok(&p->ring->send, src, n * p->es))
    return gw__post_direct(p, &p->ring->send, src, n * p->es);
  if (n) gw__copy2(slot, dst, src, n * p->es);
  return gw__post(p, &p->ring->send, n * p->es);
}

static gw_result_t prim_send(struct prims *p, const void *src, void *dst, size_t n) {
  return prim_send_ex(p, src, dst, n, true);
}

static gw_result_t prim_recv(struct prims *p, void *dst, size_t n) {
  if (p->dev) return gw__dprim_recv(p, dst, n);
  const void *data;
  GW_CHECK(gw__wait_recv(p, &p->ring->recv, &data, n * p->es));
  if (n && p->fold) gw__cvt_to_f32(wire_of(p), dst, data, n);
  else if (n && p->stream_out) gw__copy_stream(dst, data, n * p->es);
  else if (n) memcpy(dst, data, n * p->es);
  return gw__release(p, &p->ring->recv);
}

static gw_result_t prim_recv_reduce_send(struct prims *p, const void *src, size_t n) {
  if (p->dev) return gw__dprim_recv_reduce_send(p, src, n);
  const void *data;
  void *slot;
  GW_CHECK(gw__wait_recv(p, &p->ring->recv, &data, n * p->es));
  GW_CHECK(gw__wait_slot(p, &p->ring->send, n * p->es, &slot));
  if (n && p->fold) gw__fold_reduce(op_of(p), wire_of(p), slot, NULL, data, src, n, 0, p->fscale, false);
  else if (n) p->red(slot, NULL, data, src, n, 0);
  GW_CHECK(gw__post(p, &p->ring->send, n * p->es));
  return gw__release(p, &p->ring->recv);
}

static gw_result_t prim_recv_reduce_copy_send(struct prims *p, const void *src, void *dst, size_t n,
                                              uint32_t div) {
  if (p->dev) return gw__dprim_recv_reduce_copy_send(p, src, dst, n, div);
  const void *data;
  void *slot;
  GW_CHECK(gw__wait_recv(p, &p->ring->recv, &data, n * p->es));
  GW_CHECK(gw__wait_slot(p, &p->ring->send, n * p->es, &slot));
  if (n && p->fold) {
    gw__fold_reduce(op_of(p), wire_of(p), slot, dst, data, src, n, div, p->fscale, false);
  } else if (n && p->stream_out && dst != src) {
    /* reduce once into the slot (it stays in cache), then stream it out */
    p->red(slot, NULL, data, src, n, div);
    gw__copy_stream(dst, slot, n * p->es);
  } else if (n) {
    p->red(dst, slot, data, src, n, div);
  }
  GW_CHECK(gw__post(p, &p->ring->send, n * p->es));
  return gw__release(p, &p->ring->recv);
}

/* local_first: pass the local data as the first operand, so that two ranks
 * computing the same reduction order their operands the same way (of two NaNs
 * max/min pass the first one on; every other op, and max/min otherwise, is
 * commutative bit for bit). */
static gw_result_t prim_recv_reduce_copy(struct prims *p, const void *src, void *dst, size_t n, uint32_t div,
                                         bool local_first) {
  if (p->dev) return gw__dprim_recv_reduce_copy(p, src, dst, n, div, local_first);
  const void *data;
  GW_CHECK(gw__wait_recv(p, &p->ring->recv, &data, n * p->es));
  if (n && p->fold) gw__fold_reduce(op_of(p), wire_of(p), NULL, dst, data, src, n, div, p->fscale, local_first);
  else if (n && local_first) p->red(dst, NULL, src, data, n, div);
  else if (n) p->red(dst, NULL, data, src, n, div);
  return gw__release(p, &p->ring->recv);
}

static gw_result_t prim_recv_copy_send(struct prims *p, void *dst, size_t n) {
  if (p->dev) return gw__dprim_recv_copy_send(p, dst, n);
  const void *data;
  void *slot;
  GW_CHECK(gw__wait_recv(p, &p->ring->recv, &data, n * p->es));
  GW_CHECK(gw__wait_slot(p, &p->ring->send, n * p->es, &slot));
  if (p->fold) { /* the 16-bit values on, widened into dst */
    if (n) memcpy(slot, data, n * p->es), gw__cvt_to_f32(wire_of(p), dst, data, n);
  } else if (gw__direct_ok(&p->ring->send, dst, n * p->es)) { /* dst is registered: it is the source of the send */
    if (p->stream_out) gw__copy_stream(dst, data, n * p->es);
    else memcpy(dst, data, n * p->es);
    GW_CHECK(gw__post_direct(p, &p->ring->send, dst, n * p->es));
    return gw__release(p, &p->ring->recv);
  } else if (n && p->stream_out) {
    memcpy(slot, data, n * p->es);
    gw__copy_stream(dst, data, n * p->es);
  } else if (n) {
    gw__copy2(dst, slot, data, n * p->es);
  }
  GW_CHECK(gw__post(p, &p->ring->send, n * p->es));
  return gw__release(p, &p->ring->recv);
}

/* ---- algorithms ---------------------------------------------------------------- */

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* The algorithms walk ring positions (ring->index is this rank's), not ranks:
 * the ring is ordered by machine.  Blocks of allreduce belong to positions; the
 * blocks of reduce-scatter, allgather and the broadcast root belong to ranks, so
 * those map positions to ranks through ring->order. */
static gw_result_t ring_allreduce(struct prims *p) {
  const int n = p->comm->nranks, r = p->ring->index;
  const size_t count = p->count, es = p->es, ues = p->ues;
  const size_t chunk = p->chunk_bytes / es;
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
    /* In place, this block's result is written here in the allgather phase,
     * before the operation's flush: not sent from the buffer directly (over
     * ib a retransmission after a lost ack would send the result). */
    GW_CHECK(prim_send_ex(p, cat(in, BLK(k), ues), NULL, LEN(k), in != out));
    for (int j = 2; j < n; j++) {
      k = mod(r - j, n);
      GW_CHECK(prim_recv_reduce_send(p, cat(in, BLK(k), ues), LEN(k)));
    }
    k = r;
    GW_CHECK(prim_recv_reduce_copy_send(p, cat(in, BLK(k), ues), at(out, BLK(k), ues), LEN(k), div));
    for (int j = 1; j < n - 1; j++) {
      k = mod(r - j, n);
      GW_CHECK(prim_recv_copy_send(p, at(out, BLK(k), ues), LEN(k)));
    }
    k = mod(r + 1, n);
    GW_CHECK(prim_recv(p, at(out, BLK(k), ues), LEN(k)));
#undef BLK
#undef LEN
    off += (size_t)n * real;
  } while (off < count);
  return GW_SUCCESS;
}

/* Two ranks, small data: both send everything and both reduce, one hop instead
 * of the ring's two.  Rank 0's data is always the first operand, so both ranks
 * compute bit-identical results.  In place, the result goes where the input
 * was sent from as soon as the peer's arrives, which says nothing of our own
 * send: copied through the slot then, never sent from the buffer directly
 * (over ib the peer summed partly reduced values). */
static gw_result_t exchange_allreduce(struct prims *p) {
  const size_t count = p->count, es = p->es, ues = p->ues;
  const size_t chunk = p->chunk_bytes / es;
  const uint32_t div = p->op->desc.op == GW_AVG ? 2 : 0;
  size_t off = 0;
  do {
    size_t len = blk_len(count, off, chunk);
    GW_CHECK(prim_send_ex(p, cat(p->in, off, ues), NULL, len, p->in != p->out));
    GW_CHECK(prim_recv_reduce_copy(p, cat(p->in, off, ues), at(p->out, off, ues), len, div,
                                   p->comm->rank == 0));
    off += chunk;
  } while (off < count);
  return GW_SUCCESS;
}

static gw_result_t ring_reduce_scatter(struct prims *p) {
  const int n = p->comm->nranks, r = p->ring->index;
  const int *order = p->ring->order;
  const size_t rc = p->stride, count = p->count, es = p->es;
  const size_t chunk = p->chunk_bytes / es;
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
  const size_t chunk = p->chunk_bytes / es;
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
  const size_t chunk = p->chunk_bytes / es;
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
    } else {
      /* Beyond the root's successor a rank receives from one that waits
       * itself before it sends: a grace before blaming it, longer the further
       * from the root, so that the first rank behind the straggler (whose
       * predecessor is it: every rank before it got its data) reports first
       * and its notice travels on before the others' deadlines. */
      p->grace_part = (double)(pos - 1) / (n - 1); /* 0 at the root's successor */
      gw_result_t got = pos == n - 1 ? prim_recv(p, at(out, off, es), len)
                                     : prim_recv_copy_send(p, at(out, off, es), len);
      p->grace_part = 0;
      GW_CHECK(got);
    }
    off += chunk;
  } while (off < count);
  /* The root only sends: a peer that called something else (another root, a
   * count that differs) failed, but the root returned success and left its
   * chunk for its next call to trip over.  The last rank's empty chunk, back
   * round the ring, carries its call's header for the root to check (or the
   * abort notice of any rank that failed). */
  if (pos == n - 1) GW_CHECK(prim_send_ex(p, NULL, NULL, 0, false));
  if (pos == 0) { /* the last rank may itself wait on an earlier straggler: a grace before blaming it (none
                    * at 2 ranks, where it receives from the root: the wait was twice the limit) */
    p->grace_part = n > 2 ? 1 : 0;
    gw_result_t acked = prim_recv(p, NULL, 0);
    p->grace_part = 0;
    GW_CHECK(acked);
  }
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

/* The ring's schedule for op on p (its slice of the buffers set). */
static gw_result_t ring_schedule(struct prims *p) {
  /* In the ring's reduce collectives a predecessor that has not started may
   * still be finishing the operation before, whose last step is a receive
   * (see prev_part); not in the broadcast, whose staggered parts go lower;
   * recursive doubling sets its own (rd.c). */
  p->prev_part = p->op->desc.coll == GW_COLL_BROADCAST || p->op->algo == GW_ALGO_EXCHANGE ? 0 : 0.25;
  switch (p->op->desc.coll) {
    case GW_COLL_ALLREDUCE:
    case GW_COLL_BARRIER: return p->op->algo == GW_ALGO_EXCHANGE ? exchange_allreduce(p) : ring_allreduce(p);
    case GW_COLL_REDUCE_SCATTER: return ring_reduce_scatter(p);
    case GW_COLL_ALLGATHER: return ring_allgather(p);
    case GW_COLL_BROADCAST: return ring_broadcast(p);
    default:
      return gw__err(p->err, GW_ERR_INTERNAL, "rank %d: unknown collective %d", p->comm->rank, p->op->desc.coll);
  }
}

gw_result_t gw__ring_emit(struct gw_comm *comm, const struct gw_op *op, void *stream, struct gw_errctx *err) {
  struct gw_op ring_op = *op;
  ring_op.algo = GW_ALGO_RING, ring_op.proto = GW_PROTO_SIMPLE; /* as gw__run_op makes every device-ring call */
  struct prims p = {.comm = comm, .ring = &comm->rings[0], .op = &ring_op, .err = err,
                    .es = gw_dtype_size((gw_dtype_t)op->desc.dtype), .chunk_bytes = gw__dev_ring_chunk(comm, op),
                    .dev = comm->devring, .stream = (gw_dev_stream_t)stream, .emit = true};
  p.ues = p.es;
  p.count = p.stride = op->desc.count;
  p.in = p.count ? op->sendbuf : NULL;
  p.out = p.count ? op->recvbuf : NULL;
  return ring_schedule(&p);
}

gw_result_t gw__ring_run_channel(struct gw_comm *comm, int ch, int nch, const struct gw_op *op, struct gw_errctx *err) {
  struct gw_ring *ring = &comm->rings[ch];
  struct gw_conn *conns[2] = {&ring->send, &ring->recv}, *watch[3 * GW_NTREES + GW_RD_MAX];
  size_t dev_chunk = gw__dev_ring_chunk(comm, op);
  struct prims p = {.comm = comm, .ring = ring, .op = op, .err = err, .conns = conns, .nconns = 2, .watch = watch, .es = gw_dtype_size((gw_dtype_t)op->desc.dtype),
                    .chunk_bytes = dev_chunk ? dev_chunk : gw__chunk_bytes(comm, op),
                    .dev = dev_chunk ? comm->devring : NULL,
                    .stream = dev_chunk ? comm->devring->stream : NULL};
  if (comm->nranks == 1) return ch == 0 ? single_rank(op, p.es) : GW_SUCCESS;
  /* Channel 0 runs on the thread that also runs the tree and recursive doubling
   * (the others' threads must not touch their connections): it watches them. */
  for (int t = 0; t < GW_NTREES && ch == 0; t++) {
    gw__watch(&p, &comm->trees[t].recv_up);
    gw__watch(&p, &comm->trees[t].recv_down[0]);
    gw__watch(&p, &comm->trees[t].recv_down[1]);
  }
  for (int k = 0; k < comm->rd.nlinks && ch == 0; k++) gw__watch(&p, &comm->rd.recv[k]);
  p.red = gw__reduce_fn((gw_dtype_t)op->desc.dtype, (gw_op_t)op->desc.op);
  /* Too big to stay in cache: the output is written once and not read back
   * soon, so skip reading its lines in.  Not an allreduce in place: each
   * round reads every block it later writes (its n blocks of at most a chunk
   * each are in cache), and a streaming store to a cached line costs more
   * than it saves (docs/architecture.md). */
  size_t out_bytes = op->desc.count * p.es;
  if (op->desc.coll == GW_COLL_ALLGATHER) out_bytes *= (size_t)comm->nranks;
  const bool rereads = op->desc.coll == GW_COLL_ALLREDUCE && op->sendbuf == op->recvbuf;
  /* A widened operation folds here only as gw__run_op routes it: an
   * allreduce of several ranks in host memory. */
  if (op->widened && (p.dev || op->desc.coll != GW_COLL_ALLREDUCE))
    return gw__err(err, GW_ERR_INTERNAL, "rank %d: a float32 operation on a %s wire reached the %s", comm->rank,
                   gw_dtype_name((gw_dtype_t)op->desc.dtype), p.dev ? "device ring" : "ring's other collectives");
  p.fold = op->widened, p.fscale = op->scale, p.ues = op->widened ? sizeof(float) : p.es;
  if (p.fold && ch == 0) atomic_fetch_add_explicit(&comm->folded_ops, 1, memory_order_relaxed);
  p.stream_out = !p.dev && !p.fold && !rereads && out_bytes >= (size_t)gw__param_StreamThreshold();
  /* Each channel moves its own slice: of the buffer, or of every rank's block. */
  size_t base;
  channel_part(op->desc.count, p.es, ch, nch, &base, &p.count);
  p.stride = op->desc.count;
  p.in = p.count ? cat(op->sendbuf, base, p.ues) : NULL;
  p.out = p.count ? at(op->recvbuf, base, p.ues) : NULL;
  gw_result_t res = ring_schedule(&p);
  return res == GW_SUCCESS ? gw__flush(&p) : res;
}
