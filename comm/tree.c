/* tree.c - the double binary tree allreduce, as NCCL builds it: two binary
 * trees over the ring positions, complementary so that the leaves of one are
 * the interior nodes of the other; each reduces one half of the data up to its
 * root and broadcasts the result back down, chunk by chunk, so the root already
 * sends the first chunks down while later ones still climb.  A message crosses
 * about 2 log2(n) hops instead of the ring's 2(n - 1), which is what small,
 * latency-bound allreduces need; the ring stays the better choice for
 * bandwidth.  Not here: the choice between them (tune.c, enqueue.c), the waits
 * (prims.c), the chunk format (the protocol: the transport's). */
#include <stdlib.h>
#include <string.h>

#include "prims.h"

/* ---- shape -------------------------------------------------------------------- */

/* NCCL's binary tree over positions 0..n-1: a node's children lie half its
 * lowest set bit below and above it, so the odd positions are the leaves, and
 * position 0 is a root with one child (the largest power of two below n). */
static void btree(int n, int p, int *up, int down[2]) {
  int bit = 1;
  while (bit < n && !(p & bit)) bit <<= 1; /* p's lowest set bit; for 0 the power of two >= n */
  down[0] = down[1] = -1;
  if (p == 0) {
    *up = -1;
    if (n > 1) down[0] = bit >> 1;
    return;
  }
  /* The parent clears that bit and sets the next one; where that lies past the
   * end, the parent only clears it (and takes p as its right child below). */
  int parent = (p ^ bit) | (bit << 1);
  *up = parent < n ? parent : p ^ bit;
  int low = bit >> 1;
  if (low == 0) return;
  down[0] = p - low;
  /* The right child is the first of p + low, p + low/2, ... that exists. */
  for (; low > 0; low >>= 1)
    if (p + low < n) {
      down[1] = p + low;
      return;
    }
}

/* Tree 1 is tree 0 mirrored (n even) or shifted by one position (n odd), which
 * turns tree 0's leaves, the odd positions, into its interior nodes: every
 * position is interior in one tree only, except position 0 for odd n (tree 0's
 * root with one child, interior in tree 1 too).  So each rank forwards about
 * one half of the data, as in NCCL. */
void gw__tree_shape(int n, int pos, int t, int *up, int down[2]) {
  if (t == 0) {
    btree(n, pos, up, down);
    return;
  }
  bool mirror = n % 2 == 0;
  btree(n, mirror ? n - 1 - pos : (pos - 1 + n) % n, up, down);
  int *nodes[3] = {up, &down[0], &down[1]};
  for (int i = 0; i < 3; i++)
    if (*nodes[i] >= 0) *nodes[i] = mirror ? n - 1 - *nodes[i] : (*nodes[i] + 1) % n;
}

/* Several machines with several ranks on some: the double binary tree over the
 * machines, a chain inside each.  node_of[pos] is the machine of each ring
 * position (non-decreasing: the ring is ordered by machine).  In tree t a
 * machine's chain runs from its head to its tail (tree 0: first to last
 * position; tree 1 reversed, so the machine's ends swap roles between the
 * trees); the head's parent is the tail of the parent machine in the machines'
 * tree t, and the tail's children are the heads of that machine's children.
 * Every position keeps at most two children, and the data crosses the network
 * once per machine level, not once per rank level as the flat tree over ring
 * positions would. */
/* The first and last position of machine `node`: binary searches, as every
 * position's shape takes a few (a scan from 0 made building both trees
 * O(n^2) at init: billions of steps at tens of thousands of ranks). */
static int first_at_least(int n, const int *node_of, int node) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (node_of[mid] < node) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static void node_span(int n, const int *node_of, int node, int *first, int *last) {
  *first = first_at_least(n, node_of, node);
  *last = first_at_least(n, node_of, node + 1) - 1;
}

void gw__tree_shape_hier(int n, const int *node_of, int pos, int t, int *up, int down[2]) {
  int nnodes = node_of[n - 1] + 1, node = node_of[pos], first, last, P, C[2];
  node_span(n, node_of, node, &first, &last);
  int head = t ? last : first, tail = t ? first : last, step = t ? -1 : 1;
  gw__tree_shape(nnodes, node, t, &P, C);
  down[0] = down[1] = -1;
  if (pos != head) *up = pos - step;
  else if (P < 0) *up = -1;
  else {
    int f, l;
    node_span(n, node_of, P, &f, &l);
    *up = t ? f : l; /* the parent machine's tail */
  }
  if (pos != tail) {
    down[0] = pos + step;
    return;
  }
  for (int i = 0; i < 2; i++)
    if (C[i] >= 0) {
      int f, l;
      node_span(n, node_of, C[i], &f, &l);
      down[i] = t ? l : f; /* the child machine's head */
    }
}

/* ---- connections ------------------------------------------------------------ */

static void add_peer(struct gw_link *links, int *n, struct gw_conn *send, struct gw_conn *recv, int peer, int t) {
  links[(*n)++] = (struct gw_link){.conn = recv, .peer = peer, .is_send = false, .graph = GW_GRAPH_TREE(t)};
  links[(*n)++] = (struct gw_link){.conn = send, .peer = peer, .is_send = true, .graph = GW_GRAPH_TREE(t)};
}

/* The trees over ring positions: flat on one machine (or one rank per
 * machine), hierarchical across machines with several ranks on one.  Records
 * the trees' depth for the cost model. */
gw_result_t gw__tree_connect(struct gw_comm *comm, struct gw_errctx *err) {
  const struct gw_ring *ring = &comm->rings[0];
  const int n = comm->nranks;
  struct gw_link links[6 * GW_NTREES];
  int nlinks = 0;
  int *node_of = malloc(sizeof(int) * (size_t)n), (*ups)[2] = malloc(sizeof(int[2]) * (size_t)n);
  int *depth = malloc(sizeof(int) * (size_t)n);
  if (!node_of || !ups || !depth) {
    free(node_of), free(ups), free(depth);
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", comm->rank);
  }
  node_of[0] = 0;
  for (int p = 1; p < n; p++)
    node_of[p] = node_of[p - 1] + (strcmp(comm->peers[ring->order[p]].node_id, comm->peers[ring->order[p - 1]].node_id) != 0);
  bool hier = node_of[n - 1] > 0 && node_of[n - 1] < n - 1;
  comm->tree_levels = 0;
  for (int t = 0; t < GW_NTREES; t++) {
    for (int p = 0; p < n; p++) { /* every position's parent, for the depth */
      int d[2];
      if (hier) gw__tree_shape_hier(n, node_of, p, t, &ups[p][t], d);
      else gw__tree_shape(n, p, t, &ups[p][t], d);
    }
    int levels = 0;
    for (int p = 0; p < n; p++) {
      depth[p] = 0;
      for (int q = p; ups[q][t] >= 0 && depth[p] <= n; q = ups[q][t]) depth[p]++;
      levels = GW_MAX(levels, depth[p]);
    }
    if (hier) comm->tree_levels = GW_MAX(comm->tree_levels, levels);
    struct gw_tree *tree = &comm->trees[t];
    int up, down[2];
    if (hier) gw__tree_shape_hier(n, node_of, ring->index, t, &up, down);
    else gw__tree_shape(n, ring->index, t, &up, down);
    tree->up = up < 0 ? -1 : ring->order[up];
    tree->up_grace = (float)(levels + (double)depth[ring->index] / (levels + 1)) / (float)(levels + 2);
    if (tree->up >= 0) add_peer(links, &nlinks, &tree->send_up, &tree->recv_up, tree->up, t);
    for (int i = 0; i < 2; i++) {
      int cu, cd[2] = {-1, -1};
      if (down[i] >= 0 && hier) gw__tree_shape_hier(n, node_of, down[i], t, &cu, cd);
      else if (down[i] >= 0) gw__tree_shape(n, down[i], t, &cu, cd);
      const bool leaf = down[i] < 0 || (cd[0] < 0 && cd[1] < 0);
      tree->down_grace[i] = leaf ? 0.0f : (float)(levels - depth[down[i]] + 1) / (float)(levels + 2);
      tree->down[i] = down[i] < 0 ? -1 : ring->order[down[i]];
      if (tree->down[i] >= 0) add_peer(links, &nlinks, &tree->send_down[i], &tree->recv_down[i], tree->down[i], t);
    }
  }
  if (hier)
    GW_INFO(GW_SUB_INIT, "trees: hierarchical over %d machines (a chain inside each), %d levels", node_of[n - 1] + 1,
            comm->tree_levels);
  free(node_of);
  free(ups);
  free(depth);
  /* A rank receives from at most a parent and two children in each tree. */
  return gw__connect(comm, links, nlinks, 3 * GW_NTREES, err);
}

/* ---- allreduce ------------------------------------------------------------------ */

/* One tree's share of an allreduce on this rank. */
struct half {
  const struct gw_tree *tree;
  size_t base, count; /* the elements this tree reduces */
  size_t nchunks;     /* at least 1: an empty half still sends one empty chunk */
  struct gw_conn *up_send[1], *up_recv[1];
  struct gw_conn *down_send[2], *down_recv[2];
  float down_grace[2]; /* the tree's: how long a wait on each child holds off blaming it */
  int ndown;
};

/* targets[0..nt) = src OP data[0] OP ... OP data[nd-1] (the last operation
 * divides by div), or a copy of the one source when there is nothing to reduce.
 * The first two targets are written in one pass; a third is copied from the
 * first.  Every target is a different array, and the kernels allow the output
 * to be an input (the in-place root reduces into its own input). */
static void combine(struct prims *p, const void *src, const void *const *data, int nd, void *const *targets,
                    int nt, size_t n, uint32_t div) {
  void *second = nt > 1 ? targets[1] : NULL;
  if (!src || nd == 0) {
    gw__copy2(targets[0], second, src ? src : data[0], n * p->es);
  } else {
    const void *a = src;
    for (int i = 0; i < nd; i++) {
      bool last = i == nd - 1;
      p->red(targets[0], last ? second : NULL, a, data[i], n, last ? div : 0);
      a = targets[0];
    }
  }
  if (nt > 2) memcpy(targets[2], targets[0], n * p->es);
}

/* One chunk through this node: a chunk from each of from[], room on each of
 * to[], then dst (when given) and every slot receive the combination of src
 * and the chunks (see combine).  Every tree role is one call of this: a leaf
 * sends up (src, no from), an interior node reduces up (src, children) or
 * forwards down (parent, no src), the root reduces and turns the result down. */
static gw_result_t tree_step(struct prims *p, struct gw_conn *const *from, const float *grace, int nfrom,
                             struct gw_conn *const *to, int nto, const void *src, void *dst, size_t n, uint32_t div) {
  const size_t bytes = n * p->es;
  const void *data[2];
  void *targets[3];
  int nt = 0;
  for (int i = 0; i < nfrom; i++) {
    p->grace_part = grace[i];
    gw_result_t r = gw__wait_recv(p, from[i], &data[i], bytes);
    p->grace_part = 0;
    GW_CHECK(r);
  }
  if (dst) targets[nt++] = dst;
  for (int i = 0; i < nto; i++) GW_CHECK(gw__wait_slot(p, to[i], bytes, &targets[nt++]));
  if (n) combine(p, src, data, nfrom, targets, nt, n, div);
  for (int i = 0; i < nto; i++) GW_CHECK(gw__post(p, to[i], bytes));
  for (int i = 0; i < nfrom; i++) GW_CHECK(gw__release(p, from[i]));
  return GW_SUCCESS;
}

/* Chunk k of half h towards the root; the root itself reduces it into the
 * output (dividing for AVG, once) and sends it straight back down. */
static gw_result_t reduce_up(struct prims *p, const struct half *h, size_t chunk, size_t k) {
  size_t first = h->base + k * chunk, n = blk_len(h->count, k * chunk, chunk);
  const void *src = cat(p->in, first, p->es);
  if (h->tree->up >= 0)
    return tree_step(p, h->down_recv, h->down_grace, h->ndown, h->up_send, 1, src, NULL, n, 0);
  uint32_t div = p->op->desc.op == GW_AVG ? (uint32_t)p->comm->nranks : 0;
  return tree_step(p, h->down_recv, h->down_grace, h->ndown, h->down_send, h->ndown, src,
                   at(p->out, first, p->es), n, div);
}

/* Chunk k of half h, final, from the parent to the output and the children.
 * The parent sends down only after its whole subtree sent up: waiting on it
 * is waiting on whoever it waits for. */
static gw_result_t broadcast_down(struct prims *p, const struct half *h, size_t chunk, size_t k) {
  size_t first = h->base + k * chunk, n = blk_len(h->count, k * chunk, chunk);
  return tree_step(p, h->up_recv, &h->tree->up_grace, 1, h->down_send, h->ndown, NULL, at(p->out, first, p->es), n,
                   0);
}

static void half_init(struct half *h, struct gw_tree *tree, size_t base, size_t count, size_t chunk) {
  *h = (struct half){.tree = tree, .base = base, .count = count,
                     .nchunks = GW_MAX((size_t)1, GW_DIV_UP(count, chunk)),
                     .up_send = {&tree->send_up}, .up_recv = {&tree->recv_up}};
  for (int i = 0; i < 2 && tree->down[i] >= 0; i++) {
    h->down_send[h->ndown] = &tree->send_down[i];
    h->down_grace[h->ndown] = tree->down_grace[i];
    h->down_recv[h->ndown++] = &tree->recv_down[i];
  }
}

/* Runs the halves' chunks through both trees (one thread drives both).
 * Upward, the tree where this rank is a leaf goes first: that step waits for
 * no one, so both halves are on their way before the rank blocks on its
 * children (in one fixed order, at 2 ranks each rank's leaf send waited for
 * the other's reduction, and the tree ran at half the ring's bandwidth).
 * Chunk k climbs both trees before chunk k - lag comes back down.  Every wait
 * is then for an earlier step, or for the same step of a rank nearer the
 * data's source (the one rank interior in both trees, position 0 for odd n, is
 * tree 0's root and no tree-0 child, so the two orders form no cycle); a lag
 * below the FIFO depth keeps the root's downward sends from waiting on
 * children still in their upward phase.  Up to lag chunks per tree are in
 * flight in between. */
static gw_result_t run_halves(struct prims *p, const struct half *halves, int ntrees, size_t chunk) {
  const bool leaf_in_1 = ntrees == 2 && halves[1].ndown == 0 && halves[0].ndown > 0;
  const struct half *up_order[2] = {&halves[leaf_in_1 ? 1 : 0], &halves[leaf_in_1 ? 0 : 1]};
  const size_t lag = p->comm->conn_params.nslots - 1;
  const size_t nsteps = GW_MAX(halves[0].nchunks, ntrees > 1 ? halves[1].nchunks : 0) + lag;
  for (size_t k = 0; k < nsteps; k++) {
    for (int t = 0; t < ntrees; t++)
      if (k < up_order[t]->nchunks) GW_CHECK(reduce_up(p, up_order[t], chunk, k));
    for (int t = 0; t < ntrees; t++)
      if (k >= lag && k - lag < halves[t].nchunks && halves[t].tree->up >= 0)
        GW_CHECK(broadcast_down(p, &halves[t], chunk, k - lag));
  }
  return GW_SUCCESS;
}

/* The halves are split on a cache line, so data of one line or less (a loss
 * value, a barrier) takes tree 0 alone. */
gw_result_t gw__tree_run(struct gw_comm *comm, const struct gw_op *op, struct gw_errctx *err) {
  struct gw_conn *conns[6 * GW_NTREES], *watch[GW_MAX_CHANNELS + GW_RD_MAX];
  struct prims p = {.comm = comm, .op = op, .err = err, .in = op->sendbuf, .out = op->recvbuf, .conns = conns,
                    .watch = watch,
                    .count = op->desc.count, .es = gw_dtype_size((gw_dtype_t)op->desc.dtype),
                    .red = gw__reduce_fn((gw_dtype_t)op->desc.dtype, (gw_op_t)op->desc.op),
                    .chunk_bytes = gw__chunk_bytes(comm, op)};
  for (int t = 0; t < GW_NTREES; t++) {
    struct gw_conn *tc[6];
    gw__tree_conns(&comm->trees[t], tc);
    for (int i = 0; i < 6; i++) gw__use(&p, tc[i]);
  }
  for (int ch = 0; ch < comm->nchannels; ch++) gw__watch(&p, &comm->rings[ch].recv);
  for (int k = 0; k < comm->rd.nlinks; k++) gw__watch(&p, &comm->rd.recv[k]);
  const size_t chunk = p.chunk_bytes / p.es;
  const size_t align = GW_MAX((size_t)1, GW_CACHELINE / p.es);
  const size_t first = GW_MIN(p.count, GW_ALIGN_UP(GW_DIV_UP(p.count, 2), align));
  struct half halves[GW_NTREES];
  half_init(&halves[0], &comm->trees[0], 0, first, chunk);
  half_init(&halves[1], &comm->trees[1], first, p.count - first, chunk);
  GW_CHECK(run_halves(&p, halves, p.count > first ? 2 : 1, chunk));
  return gw__flush(&p);
}
