/* rd.c - recursive doubling allreduce, the "exchange" algorithm at more than
 * two ranks (at two it is the one-hop exchange over the ring's connections,
 * ring.c).  For small, latency-bound data: every rank sends all of it log2 p
 * times (p the largest power of two <= n) to partners at ring positions
 * pos ^ 1, pos ^ 2, ..., and reduces what comes back, so a message crosses
 * log2 p hops (+ 2 when n is not a power of two: the positions >= p fold their
 * data into pos - p first and get the result back last) instead of the tree's
 * 2 log2 n or the ring's 2(n - 1), and every rank works in every step instead
 * of waiting for a level of the tree.  Each combination takes the lower
 * position's value as its first operand, so partners compute bit-identical
 * results and every rank ends with the same bits.  Data larger than one chunk
 * runs the whole pattern once per chunk.  Not here: the choice (tune.c), the
 * waits (prims.c). */
#include <string.h>

#include "prims.h"

static int pow2_floor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int gw__extra_conns(struct gw_comm *comm, struct gw_conn *out[GW_EXTRA_CONNS]) {
  int n = 0;
  for (int t = 0; t < GW_NTREES; t++, n += 6) gw__tree_conns(&comm->trees[t], out + n);
  for (int k = 0; k < GW_RD_MAX; k++) out[n++] = &comm->rd.send[k], out[n++] = &comm->rd.recv[k];
  return n;
}

int gw__rd_shape(int n, int pos, int *extra, int partners[GW_RD_MAX]) {
  int p = pow2_floor(n), np = 0;
  *extra = pos >= p ? pos - p : pos + p < n ? pos + p : -1;
  if (pos >= p) return 0;
  for (int bit = 1; bit < p; bit <<= 1) partners[np++] = pos ^ bit; /* n <= GW_RD_MAX_RANKS: at most 15 */
  return np;
}

/* Links to the partners and the extra position, both directions, with FIFOs of
 * two slots: one chunk is in flight per link and step, and a rank sends chunk
 * c + 1 to a partner only after it took that partner's chunk c. */
gw_result_t gw__rd_connect(struct gw_comm *comm, struct gw_errctx *err) {
  const struct gw_ring *ring = &comm->rings[0];
  struct gw_rd *rd = &comm->rd;
  int partners[GW_RD_MAX], extra;
  rd->npartners = gw__rd_shape(comm->nranks, ring->index, &extra, partners);
  rd->nlinks = 0;
  struct gw_link links[2 * GW_RD_MAX];
  int nl = 0;
  for (int i = 0; i <= rd->npartners; i++) {
    int pos = i < rd->npartners ? partners[i] : extra;
    if (pos < 0) continue;
    int k = rd->nlinks++;
    rd->peer[k] = ring->order[pos];
    links[nl++] = (struct gw_link){.conn = &rd->recv[k], .peer = rd->peer[k], .is_send = false, .graph = GW_GRAPH_RD};
    links[nl++] = (struct gw_link){.conn = &rd->send[k], .peer = rd->peer[k], .is_send = true, .graph = GW_GRAPH_RD};
  }
  uint32_t nslots = comm->conn_params.nslots;
  comm->conn_params.nslots = 2;
  gw_result_t r = gw__connect(comm, links, nl, GW_RD_MAX, err);
  comm->conn_params.nslots = nslots;
  return r;
}

static gw_result_t send_chunk(struct prims *p, struct gw_conn *c, const void *src, size_t n) {
  void *slot;
  GW_CHECK(gw__wait_slot(p, c, n * p->es, &slot));
  if (n) memcpy(slot, src, n * p->es);
  return gw__post(p, c, n * p->es);
}

/* dst = lower OP higher of (mine, the peer's chunk), the lower ring position's
 * value first; div != 0 divides (AVG's last step). */
static gw_result_t recv_combine(struct prims *p, struct gw_conn *c, const void *mine, void *dst, size_t n,
                                bool mine_first, uint32_t div) {
  const void *data;
  GW_CHECK(gw__wait_recv(p, c, &data, n * p->es));
  if (n) p->red(dst, NULL, mine_first ? mine : data, mine_first ? data : mine, n, div);
  return gw__release(p, c);
}

static gw_result_t recv_copy(struct prims *p, struct gw_conn *c, void *dst, size_t n) {
  const void *data;
  GW_CHECK(gw__wait_recv(p, c, &data, n * p->es));
  if (n) memcpy(dst, data, n * p->es);
  return gw__release(p, c);
}

/* One chunk [in, in + n) -> [out, out + n) through the whole pattern. */
static gw_result_t rd_chunk(struct prims *p, struct gw_rd *rd, const void *in, void *out, size_t n, uint32_t div) {
  int me = p->comm->rings[0].index, pow2 = pow2_floor(p->comm->nranks);
  struct gw_conn *send = rd->send, *recv = rd->recv;
  if (me >= pow2) { /* an extra position: fold in, get the result back */
    GW_CHECK(send_chunk(p, &send[0], in, n));
    p->grace_part = 1; /* its home waits on the whole pattern first */
    return recv_copy(p, &recv[0], out, n);
  }
  bool has_extra = rd->nlinks > rd->npartners;
  const void *cur = in;
  if (has_extra) { /* the extra's data joins first (this position is the lower); it sends at once */
    p->grace_part = 0;
    GW_CHECK(recv_combine(p, &recv[rd->npartners], in, out, n, true, rd->npartners == 0 ? div : 0));
    cur = out;
  }
  for (int k = 0; k < rd->npartners; k++) {
    int partner = p->comm->rings[0].pos_of[rd->peer[k]];
    /* A partner sends at once in the first step unless it waits for its extra
     * first.  The grace grows with the step, so that the rank that waits on
     * the straggler in the earliest step reports first and its notice reaches
     * the later steps' waiters before their own deadlines (one grace for all
     * had ranks blame partners that waited themselves). */
    p->grace_part = k > 0 || pow2 < p->comm->nranks ? (double)(k + 1) / (rd->npartners + 2) : 0;
    /* A first-step partner that has not started may still be finishing the
     * operation before, waiting in a later step on a stopped or slow rank
     * whose waiter names it: half the first staggered part, so a partner
     * that never called is still named before any later step's waiter
     * reports (with none, at 4 ranks, rank 2 blamed rank 3, still in the
     * operation before on a stopped rank 1, when a loaded machine ran rank
     * 3's deadline late: test_stopped_midop_times_out, 1 CI run). */
    p->prev_part = 0.5 / (rd->npartners + 2);
    GW_CHECK(send_chunk(p, &send[k], cur, n));
    GW_CHECK(recv_combine(p, &recv[k], cur, out, n, me < partner, k == rd->npartners - 1 ? div : 0));
    cur = out;
  }
  if (has_extra) GW_CHECK(send_chunk(p, &send[rd->npartners], out, n));
  return GW_SUCCESS;
}

gw_result_t gw__rd_run(struct gw_comm *comm, const struct gw_op *op, struct gw_errctx *err) {
  struct gw_conn *conns[2 * GW_RD_MAX], *watch[GW_MAX_CHANNELS + 3 * GW_NTREES];
  struct prims p = {.comm = comm, .op = op, .err = err, .in = op->sendbuf, .out = op->recvbuf, .conns = conns,
                    .watch = watch,
                    .count = op->desc.count, .es = gw_dtype_size((gw_dtype_t)op->desc.dtype),
                    .red = gw__reduce_fn((gw_dtype_t)op->desc.dtype, (gw_op_t)op->desc.op),
                    .chunk_bytes = gw__chunk_bytes(comm, op)};
  struct gw_rd *rd = &comm->rd;
  for (int k = 0; k < rd->nlinks; k++) gw__use(&p, &rd->send[k]), gw__use(&p, &rd->recv[k]);
  for (int ch = 0; ch < comm->nchannels; ch++) gw__watch(&p, &comm->rings[ch].recv);
  for (int t = 0; t < GW_NTREES; t++) {
    struct gw_conn *tc[6];
    gw__tree_conns(&comm->trees[t], tc);
    for (int i = 0; i < 6; i++) gw__watch(&p, tc[i]);
  }
  const size_t chunk = p.chunk_bytes / p.es;
  const uint32_t div = op->desc.op == GW_AVG ? (uint32_t)comm->nranks : 0;
  size_t off = 0;
  do {
    size_t len = blk_len(p.count, off, chunk);
    GW_CHECK(rd_chunk(&p, rd, cat(p.in, off, p.es), at(p.out, off, p.es), len, div));
    off += chunk;
  } while (off < p.count);
  return gw__flush(&p);
}
