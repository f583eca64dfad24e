/* comm.c - communicator lifecycle: the rendezvous, connecting ranks (the
 * rings, and the trees unless GW_ALGO rules them out), the cost model's table
 * and teardown; the settings every rank must share are compared in
 * comm_settings.c.  Also the small dtype/op helpers of the public API.  The
 * collectives live in enqueue.c, ring.c and tree.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sched.h>
#include <unistd.h>

#include "comm.h"
#include "prims.h" /* gw__heard_abort */

GW_PARAM(ShmSlots, "GW_SHM_SLOTS", 8)
GW_PARAM(ShmSlotBytes, "GW_SHM_SLOT_BYTES", 256 << 10)
GW_PARAM(SocketStreams, "GW_SOCKET_NSTREAMS", 1)
GW_PARAM(Channels, "GW_NCHANNELS", 1)
/* Negative (the default): auto, gw__pick_base's rule; the ranks agree on the
 * value as given. */
GW_PARAM(ExchangeMaxBytes, "GW_EXCHANGE_MAX_BYTES", -1)
/* An operation uses one channel per this many bytes (channels.c). */
GW_PARAM_MIN(ChannelMinBytes, "GW_CHANNEL_MIN_BYTES", 1 << 20, 0) /* 0: as 1 (every channel for any size) */

/* ---- dtype / op helpers ---------------------------------------------------------- */
static const struct {
  const char *name;
  size_t size;
} dtypes[GW_NUM_DTYPES] = {
    [GW_INT8] = {"int8", 1},       [GW_UINT8] = {"uint8", 1},       [GW_INT32] = {"int32", 4},
    [GW_INT64] = {"int64", 8},     [GW_FLOAT16] = {"float16", 2},   [GW_BFLOAT16] = {"bfloat16", 2},
    [GW_FLOAT32] = {"float32", 4}, [GW_FLOAT64] = {"float64", 8},
};
static const char *op_names[GW_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};

size_t gw_dtype_size(gw_dtype_t dt) { return (unsigned)dt < GW_NUM_DTYPES ? dtypes[dt].size : 0; }
const char *gw_dtype_name(gw_dtype_t dt) { return (unsigned)dt < GW_NUM_DTYPES ? dtypes[dt].name : "?"; }
const char *gw_op_name(gw_op_t op) { return (unsigned)op < GW_NUM_OPS ? op_names[op] : "?"; }

int gw_dtype_from_name(const char *name) {
  static const struct {
    const char *alias;
    gw_dtype_t dt;
  } aliases[] = {{"char", GW_INT8},      {"int", GW_INT32},         {"long", GW_INT64},
                 {"half", GW_FLOAT16},   {"fp16", GW_FLOAT16},      {"bf16", GW_BFLOAT16},
                 {"float", GW_FLOAT32},  {"fp32", GW_FLOAT32},      {"double", GW_FLOAT64},
                 {"fp64", GW_FLOAT64}};
  if (!name) return -1;
  for (int i = 0; i < GW_NUM_DTYPES; i++)
    if (!strcasecmp(name, dtypes[i].name)) return i;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (!strcasecmp(name, aliases[i].alias)) return (int)aliases[i].dt;
  return -1;
}

int gw_op_from_name(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < GW_NUM_OPS; i++)
    if (!strcasecmp(name, op_names[i])) return i;
  return -1;
}

/* ---- errors ----------------------------------------------------------------------- */
static bool forked_away(const struct gw_comm *comm);
static bool peek(struct gw_comm *comm, const char *fn, bool quiet);
static void refuse_going(const struct gw_comm *comm, const char *fn);

void gw__comm_set_error(struct gw_comm *comm, const char *msg) {
  /* a forked child's copy: its err_mu may have been held at the fork, and
   * gw_comm_last_error reads a child's refusals from its thread anyway */
  if (!comm || forked_away(comm)) {
    gw__set_thread_error(msg);
    return;
  }
  pthread_mutex_lock(&comm->err_mu);
  snprintf(comm->last_error, sizeof comm->last_error, "%s", msg);
  pthread_mutex_unlock(&comm->err_mu);
}

void gw__comm_first_error(struct gw_comm *comm, char *buf, size_t len) {
  pthread_mutex_lock(&comm->err_mu);
  snprintf(buf, len, "%s", comm->first_error);
  pthread_mutex_unlock(&comm->err_mu);
}

const char *gw_comm_last_error(gw_comm_t comm) {
  static _Thread_local char copy[GW_ERRMSG_MAX];
  if (!comm || forked_away(comm)) return gw__thread_error(); /* a child's refusals are its thread's */
  /* gone or going: the thread's error, which a refused call set (not
   * replaced by this refusal: the call's own message was lost) */
  if (!peek(comm, "gw_comm_last_error", true)) {
    if (!gw__thread_error()[0]) refuse_going(comm, "gw_comm_last_error"); /* a thread that made no call on it */
    return gw__thread_error();
  }
  pthread_mutex_lock(&comm->err_mu);
  memcpy(copy, comm->last_error, sizeof copy);
  pthread_mutex_unlock(&comm->err_mu);
  gw__comm_unpeek(comm);
  return copy;
}

gw_result_t gw__init_fail(struct gw_errctx *err, gw_result_t res) {
  gw__set_thread_error(err->msg);
  gw__record_failure(res != GW_ERR_REMOTE, err->msg);
  return res;
}

/* ---- setup ----------------------------------------------------------------------- */
/* The slowest transport the ring crosses (tcp, then ib, then shm), from the
 * rendezvous table and GW_TRANSPORT (alike on every rank: the settings check)
 * alone, as gw__transport_select picks (shm within a machine's shared
 * /dev/shm and user, ib where both offer a port, else tcp), so every rank
 * finds the same: the tuning file's rows are keyed by it.  Not from the
 * transports this build has (a rank built without ib offers no port, so its
 * pairs are tcp everywhere; a class from each rank's own list made its model
 * differ, said as tuning files that differ).  A pair no transport connects
 * is left to the connect's message. */
static int transport_class(const struct gw_comm *c) {
  const struct gw_ring *ring = &c->rings[0];
  const int32_t want = gw__transport_wanted(); /* 0 unset, 1 shm, 2 ib, 3 tcp */
  int worst = GW_TCLASS_SHM;
  for (int pos = 0; pos < c->nranks && c->nranks > 1; pos++) {
    const struct gw_peer_info *a = &c->peers[ring->order[pos]], *b = &c->peers[ring->order[(pos + 1) % c->nranks]];
    const bool shm = gw__shm_transport.can_connect(a, b);
    const bool ib = (a->caps & GW_CAP_IB) && (b->caps & GW_CAP_IB);
    const int t = shm && want <= 1 ? GW_TCLASS_SHM : ib && (want == 0 || want == 2) ? GW_TCLASS_IB : GW_TCLASS_TCP;
    worst = GW_MAX(worst, t);
  }
  return worst;
}

/* The built-in table, or GW_TUNING_FILE's rows for this world size and
 * transport class (true); a file that does not parse is refused (the warning
 * names the line) and the built-in table stays. */
static bool model_init(struct gw_comm *c) {
  gw__model_defaults(&c->model);
  const char *path = gw__env_str("GW_TUNING_FILE", "");
  struct gw_errctx err;
  int applied = 0;
  if (!*path || gw__model_load(&c->model, path, c->nranks, c->tclass, &applied, &err) != GW_SUCCESS) return false;
  if (applied)
    GW_INFO(GW_SUB_TUNE, "cost model from %s: %d of its rows apply to %d ranks over %s", path, applied, c->nranks,
            gw__tclass_name(c->tclass));
  else if (c->nranks > 1) /* fitted elsewhere: over another transport, or another world size */
    GW_INFO(GW_SUB_TUNE, "cost model: %s has no row for %d ranks over %s (gw-perf --tune writes them): the built-in "
            "table", path, c->nranks, gw__tclass_name(c->tclass));
  return true;
}

/* Orders the ring by machine (in order of each machine's lowest rank), ranks
 * ascending within a machine, so the ring crosses the network once in each
 * direction per machine whatever the launcher's rank placement. */
static gw_result_t build_ring_order(struct gw_comm *c, struct gw_errctx *err) {
  struct gw_ring *ring = &c->rings[0];
  int n = c->nranks;
  ring->order = malloc(sizeof(int) * (size_t)n);
  ring->pos_of = malloc(sizeof(int) * (size_t)n);
  bool *placed = calloc((size_t)n, sizeof(bool));
  if (!ring->order || !ring->pos_of || !placed) {
    free(placed);
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->rank);
  }
  int pos = 0;
  for (int first = 0; first < n; first++) {
    if (placed[first]) continue;
    for (int r = first; r < n; r++)
      if (!placed[r] && !strcmp(c->peers[r].node_id, c->peers[first].node_id)) {
        placed[r] = true;
        ring->pos_of[r] = pos;
        ring->order[pos++] = r;
      }
  }
  free(placed);
  ring->index = ring->pos_of[c->rank];
  ring->prev = ring->order[(ring->index - 1 + n) % n];
  ring->next = ring->order[(ring->index + 1) % n];
  for (int ch = 1; ch < c->nchannels; ch++) { /* every channel's ring has the same order */
    c->rings[ch].index = ring->index;
    c->rings[ch].order = ring->order;
    c->rings[ch].pos_of = ring->pos_of;
    c->rings[ch].prev = ring->prev;
    c->rings[ch].next = ring->next;
  }
  return GW_SUCCESS;
}

/* What a receiving end publishes at the rendezvous: its handle, and which
 * sender and graph it is for (the rendezvous routes it to that sender only). */
struct published {
  int32_t from, graph; /* from = -1: an unused entry; first: the route's destination */
  struct gw_conn_handle handle;
};

/* Picks the transport for one link and names the connection for messages and
 * the INFO line ("ring 0: 1 -> 2 via shm", "tree 1: 3 -> 1 via tcp"). */
static gw_result_t prepare_link(struct gw_comm *c, const struct gw_link *l, struct gw_errctx *err) {
  const struct gw_transport *tp = gw__transport_select(&c->peers[c->rank], &c->peers[l->peer]);
  if (!tp) {
    /* over ib, which end has no port (one rank's GW_IB_DISABLE or GW_IB_HCA
     * read as this general note) */
    const bool ib = gw__transport_wanted() == 2, mine = c->peers[c->rank].caps & GW_CAP_IB;
    char which[160] = "";
    const struct gw_peer_info *me = &c->peers[c->rank], *peer = &c->peers[l->peer];
    if (ib && !(mine && (peer->caps & GW_CAP_IB)))
      snprintf(which, sizeof which, ": rank %d has no ib port to use", mine ? l->peer : c->rank);
    else if (!strcmp(me->node_id, peer->node_id) && me->shm_id != peer->shm_id) /* containers apart */
      snprintf(which, sizeof which, ": both are on this machine but do not share /dev/shm (another mount: separate "
               "containers?)");
    else if (!strcmp(me->node_id, peer->node_id) && me->uid != peer->uid)
      snprintf(which, sizeof which, ": both are on this machine but run as other users (uid %u and %u), whose "
               "/dev/shm files are private", (unsigned)me->uid, (unsigned)peer->uid);
    return gw__err(err, GW_ERR_UNSUPPORTED,
                   "rank %d (%s): no transport connects it with rank %d (%s)%s%s%s", c->rank,
                   c->peers[c->rank].host, l->peer, c->peers[l->peer].host, which,
                   !getenv("GW_TRANSPORT") ? "" : which[0] ? "; " : ": ",
                   getenv("GW_TRANSPORT") ? "GW_TRANSPORT restricts the choice (shm needs both on one machine, ib an "
                                            "active port on both: GW_IB_HCA, GW_IB_DISABLE, or GW_IB_EMULATE=1 in "
                                            "tests)" : "");
  }
  struct gw_conn *conn = l->conn;
  *conn = (struct gw_conn){.tp = tp, .self = c->rank, .peer = l->peer, .is_send = l->is_send};
  snprintf(conn->peer_host, sizeof conn->peer_host, "%s", c->peers[l->peer].host);
  bool ring = l->graph < GW_MAX_CHANNELS, rd = l->graph == GW_GRAPH_RD;
  snprintf(conn->desc, sizeof conn->desc, "%s %d: %d -> %d via %s", ring ? "ring" : rd ? "exchange" : "tree",
           ring ? l->graph : rd ? 0 : l->graph - GW_GRAPH_TREE(0), l->is_send ? c->rank : l->peer,
           l->is_send ? l->peer : c->rank, tp->name);
  return GW_SUCCESS;
}

/* The handle rank `self` needs to send to `peer` on `graph`, among those routed here. */
static const struct published *find_handle(const struct published *got, const int32_t *origin, int n, int self,
                                           int peer, int graph) {
  for (int i = 0; i < n; i++)
    if (origin[i] == peer && got[i].from == self && got[i].graph == graph) return &got[i];
  return NULL;
}

/* Receivers set up and publish, everyone exchanges, senders attach to their
 * receiver's handle, and after a barrier (every sender attached) the receivers
 * finish: the order every transport's lifecycle asks for (transport.h). */
gw_result_t gw__connect(struct gw_comm *c, const struct gw_link *links, int nlinks, int max_recv,
                        struct gw_errctx *err) {
  struct published *mine = calloc((size_t)max_recv, sizeof *mine);
  struct published *got = calloc((size_t)nlinks, sizeof *got);
  int32_t *origin = calloc((size_t)nlinks, sizeof *origin);
  int ngot = 0;
  gw_result_t res = GW_SUCCESS;
  if (!mine || !got || !origin) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->rank);
    goto out;
  }
  for (int i = 0; i < max_recv; i++) mine[i].from = -1;
  for (int i = 0, nrecv = 0; i < nlinks; i++) {
    const struct gw_link *l = &links[i];
    GW_CHECK_GOTO(prepare_link(c, l, err), res, out);
    if (l->is_send) continue;
    if (nrecv == max_recv) {
      res = gw__err(err, GW_ERR_INTERNAL, "rank %d: more than %d receiving connections", c->rank, max_recv);
      goto out;
    }
    mine[nrecv] = (struct published){.from = l->peer, .graph = l->graph};
    GW_CHECK_GOTO(l->conn->tp->recv_setup(l->conn, &c->conn_params, &mine[nrecv++].handle, err), res, out);
  }
  GW_CHECK_GOTO(gw__bootstrap_route(c->bs, mine, max_recv, sizeof *mine, got, origin, nlinks, &ngot, err), res, out);
  for (int i = 0; i < nlinks; i++) {
    const struct gw_link *l = &links[i];
    if (!l->is_send) continue;
    const struct published *e = find_handle(got, origin, ngot, c->rank, l->peer, l->graph);
    if (!e) {
      res = gw__err(err, GW_ERR_INTERNAL, "rank %d: rank %d published no handle for %s", c->rank, l->peer,
                    l->conn->desc);
      goto out;
    }
    GW_CHECK_GOTO(l->conn->tp->send_connect(l->conn, &c->conn_params, &e->handle, err), res, out);
  }
  GW_CHECK_GOTO(gw__bootstrap_barrier(c->bs, err), res, out);
  for (int i = 0; i < nlinks; i++)
    if (!links[i].is_send) GW_CHECK_GOTO(links[i].conn->tp->recv_connect(links[i].conn, err), res, out);
  for (int i = 0; i < nlinks; i++)
    if (links[i].is_send) GW_INFO(GW_SUB_INIT, "%s", links[i].conn->desc);
out:
  free(origin);
  free(got);
  free(mine);
  return res;
}

static gw_result_t connect_rings(struct gw_comm *c, struct gw_errctx *err) {
  struct gw_link links[2 * GW_MAX_CHANNELS];
  for (int ch = 0; ch < c->nchannels; ch++) {
    struct gw_ring *ring = &c->rings[ch];
    links[2 * ch] = (struct gw_link){.conn = &ring->recv, .peer = ring->prev, .is_send = false, .graph = ch};
    links[2 * ch + 1] = (struct gw_link){.conn = &ring->send, .peer = ring->next, .is_send = true, .graph = ch};
  }
  return gw__connect(c, links, 2 * c->nchannels, c->nchannels, err);
}

/* The LL format's chunk size: the smallest any rank's connections allow, 0
 * when one of them has none (tcp), so every rank chunks an LL operation alike. */
static uint32_t conn_ll_bytes(const struct gw_conn *conn, uint32_t cur) {
  return conn->tp ? GW_MIN(cur, conn->tp->ll_chunk_bytes) : cur;
}

static gw_result_t agree_ll(struct gw_comm *c, struct gw_errctx *err) {
  uint32_t mine = UINT32_MAX;
  for (int ch = 0; ch < c->nchannels; ch++)
    mine = conn_ll_bytes(&c->rings[ch].recv, conn_ll_bytes(&c->rings[ch].send, mine));
  struct gw_conn *extra[GW_EXTRA_CONNS];
  for (int i = 0, n = gw__extra_conns(c, extra); i < n; i++) mine = conn_ll_bytes(extra[i], mine);
  uint32_t *all = calloc((size_t)c->nranks, sizeof *all);
  if (!all) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->rank);
  gw_result_t res = gw__bootstrap_allgather(c->bs, &mine, all, sizeof mine, err);
  for (int r = 0; r < c->nranks; r++) mine = GW_MIN(mine, all[r]);
  free(all);
  c->ll_chunk_bytes = mine;
  if (res == GW_SUCCESS && c->proto == GW_PROTO_LL && !mine) {
    char none[64] = ""; /* this rank's transports without it ("tcp" was said whatever they were) */
    for (int i = 0, n = gw__extra_conns(c, extra); i < n + 2 * c->nchannels; i++) {
      const struct gw_conn *k = i < n ? extra[i] : i % 2 ? &c->rings[(i - n) / 2].send : &c->rings[(i - n) / 2].recv;
      if (k->tp && !k->tp->ll_chunk_bytes && !strstr(none, k->tp->name))
        snprintf(none + strlen(none), sizeof none - strlen(none), "%s%s", none[0] ? ", " : "", k->tp->name);
    }
    GW_WARN(GW_SUB_INIT, "rank %d: GW_PROTO=ll, but some connections (%s%s) have no LL format: using simple",
            c->rank, none[0] ? "this rank's over " : "another rank's", none);
  }
  return res;
}

/* Whether the ranks that may run on rank `who`'s CPUs (same machine,
 * affinity overlapping: ranks a launcher bound to cores of their own share
 * none) are more than those CPUs; from the rendezvous table alone, so every
 * rank finds the same for every rank. */
static bool oversubscribed(const struct gw_comm *c, int who, int *sharers, int *ncpus) {
  const struct gw_peer_info *me = &c->peers[who];
  const int n = me->ncpus;
  *ncpus = n;
  *sharers = 0;
  bool mine_known = false;
  for (int w = 0; w < 16; w++) mine_known |= me->cpus[w] != 0;
  for (int r = 0; r < c->nranks; r++) {
    if (strcmp(c->peers[r].node_id, me->node_id)) continue; /* another machine */
    bool overlap = r == who, known = false; /* a set unknown (all zero) overlaps every other */
    for (int w = 0; w < 16; w++) overlap |= (c->peers[r].cpus[w] & me->cpus[w]) != 0;
    for (int w = 0; w < 16; w++) known |= c->peers[r].cpus[w] != 0;
    *sharers += overlap || !known || !mine_known;
  }
  return n > 0 && *sharers > n;
}

static gw_result_t connect_all(struct gw_comm *c, struct gw_errctx *err) {
  /* How long waits spin before they yield: adaptive unless fixed (gw__waiter_pause). */
  int64_t spin_us = gw__env_int_min("GW_SPIN_US", -1, 0); /* -1: adaptive */
  if (spin_us >= 0) gw__waiter_set_spin((double)spin_us * 1e-6);
  /* More ranks on this machine than cores to run them: the rank a wait is for
   * is likely queued behind this one, so waits yield at once instead of
   * spinning first (Open MPI does the same when oversubscribed).  Measured, 4
   * ranks on 2 cores, 8 B allreduce: 4.5 us with the adaptive 2 us spin, 2.6
   * us without. */
  int ncpus = 0, local = 0;
  c->oversubscribed = oversubscribed(c, c->rank, &local, &ncpus);
  if (spin_us < 0 && c->oversubscribed) {
    gw__waiter_oversubscribed(+1), c->oversub_counted = true; /* until comm_free */
    GW_INFO(GW_SUB_INIT, "%d ranks on this rank's cores, %d cores to run them: waits yield at once", local, ncpus);
  }
  /* Oversubscribed anywhere, every step of every algorithm costs a trip
   * through the scheduler: the cost model counts it, so that fewer steps win
   * (4 ranks on 2 cores: recursive doubling beat the ring 1.3-2x from 16 to
   * 256 KiB, its limit, where the built-in 2-rank table picked the ring from
   * 16 KiB).
   * Every rank decides alike: the table is the same everywhere. */
  GW_CHECK(build_ring_order(c, err)); /* (the transport class is the ring's) */
  c->tclass = transport_class(c);
  c->model_from_file = model_init(c);
  for (int r = 0, s, k; r < c->nranks; r++)
    if (oversubscribed(c, r, &s, &k)) {
      c->model.oversub_step_us = GW_MODEL_OVERSUB_STEP_US;
      break;
    }
  GW_CHECK(gw__check_settings_agree(c, err));
  /* An allgather: every rank has opened the others' liveness files by now. */
  gw__alive_unlink_own(c);
  GW_CHECK(gw__bootstrap_local_addr(c->bs, &c->conn_params.local_addr, &c->conn_params.local_addr_len, err));
  GW_CHECK(connect_rings(c, err));
  /* Auto may pick the tree for any call, so every rank connects the trees at
   * init (a lazy connect would need every rank in the rendezvous at the same
   * call, and a mismatched call would then hang there instead of failing with
   * a message); a communicator forced onto the ring pays nothing for them. */
  c->tree_ok = c->algo == GW_ALGO_AUTO || c->algo == GW_ALGO_TREE;
  if (c->tree_ok) GW_CHECK(gw__tree_connect(c, err));
  /* Recursive doubling (the exchange at more than 2 ranks), for small data;
   * at 2 ranks the exchange runs over the ring's connections. */
  c->rd_ok = c->nranks > 2 && c->nranks <= GW_RD_MAX_RANKS && (c->algo == GW_ALGO_AUTO || c->algo == GW_ALGO_EXCHANGE);
  if (c->rd_ok) GW_CHECK(gw__rd_connect(c, err));
  GW_CHECK(agree_ll(c, err));
  c->connected = true; /* every connection made: a failure from here on is told on them too (rank peers may be past init) */
  if (c->rank == 0) {
    struct gw_pick_args base;
    gw__pick_base(c, c->algo, c->proto, &base);
    gw__model_log(&c->model, &base);
  }
  return gw__channels_start(c, err);
}

/* Communicators' memory, kept for the next one rather than freed: a call
 * racing a destroy may still count itself in and out of the gate (comm.h)
 * after the destroy let the communicator go; on freed memory that was a
 * write after free (a second destroy, or an accessor, starting while the
 * destroy ran).  At most as many as were ever alive at once. */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gw_comm *pool;
/* Held across fork, as the other process-wide locks: a child's init or
 * destroy must not find it locked for good by a parent's thread. */
static void pool_fork_prepare(void) { pthread_mutex_lock(&pool_mu); }
static void pool_fork_after(void) { pthread_mutex_unlock(&pool_mu); }
/* The child has no thread inside an abort: a parent's, counted in a kept
 * communicator's gate at the fork, would hold up the child's next init for good. */
static void pool_fork_child(void) {
  for (struct gw_comm *c = pool; c; c = c->pool_next) atomic_store(&c->aborting, 0);
  pthread_mutex_unlock(&pool_mu);
}
static pthread_once_t pool_fork_once = PTHREAD_ONCE_INIT;
static void pool_fork_install(void) { pthread_atfork(pool_fork_prepare, pool_fork_after, pool_fork_child); }

/* A communicator to make, zeroed but for the gate, which says FREE until
 * init is done (gw__live_add's caller opens it). */
static struct gw_comm *comm_alloc(void) {
  pthread_once(&pool_fork_once, pool_fork_install);
  pthread_mutex_lock(&pool_mu);
  struct gw_comm *c = pool;
  if (c) pool = c->pool_next;
  pthread_mutex_unlock(&pool_mu);
  if (!c) {
    c = calloc(1, sizeof *c);
    if (c) atomic_init(&c->destroying, GW_DESTROY_FREE);
    return c;
  }
  const size_t keep = offsetof(struct gw_comm, pool_next);
  memset((char *)c + keep, 0, sizeof *c - keep);
  return c;
}

static void comm_free(struct gw_comm *c) {
  if (!c) return;
  atomic_store(&c->destroying, GW_DESTROY_GOING); /* init's failures come here too */
  gw__live_remove(c, GW_LIVE_COMM);
  if (c->oversub_counted) gw__waiter_oversubscribed(-1), c->oversub_counted = false;
  gw__channels_stop(c);
  const int prev_dev = gw__dev_switch(c);
  gw__dev_free(c);
  gw__dev_ring_free(c);
  gw__dev_switch_back(prev_dev);
  for (int ch = 0; ch < GW_MAX_CHANNELS; ch++) {
    gw__conn_close(&c->rings[ch].send);
    gw__conn_close(&c->rings[ch].recv);
  }
  struct gw_conn *extra[GW_EXTRA_CONNS];
  for (int i = 0, n = gw__extra_conns(c, extra); i < n; i++) gw__conn_close(extra[i]);
  free(c->rings[0].order);
  free(c->rings[0].pos_of);
  gw__bootstrap_free(c->bs);
  gw__alive_free(c);
  free(c->peers);
  pthread_cond_destroy(&c->work_cv);
  pthread_cond_destroy(&c->done_cv);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->err_mu);
  atomic_store(&c->destroying, GW_DESTROY_FREE); /* gw_comm_abort through a stale handle sets nothing now */
  pthread_mutex_lock(&pool_mu);
  c->pool_next = pool;
  pool = c;
  pthread_mutex_unlock(&pool_mu);
}

gw_result_t gw_comm_init(gw_comm_t *out, int nranks, int rank, const char *master) {
  struct gw_errctx err = {{0}};
  gw_result_t res;
  gw__log_init();
  gw__record_failure_init();
  if (!out) return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT, "gw_comm_init: comm is NULL"));
  *out = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT,
                                   "gw_comm_init: rank %d is not valid for %d ranks (need 0 <= rank < nranks)",
                                   rank, nranks));
  if (nranks > GW_MAX_NRANKS)
    return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT,
                                   "gw_comm_init: %d ranks, more than a communicator takes (%d)", nranks,
                                   GW_MAX_NRANKS));
  char token[GW_BOOT_TOKEN_MAX + 16] = "";
  if (nranks > 1) {
    if (!master || !*master)
      return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT,
                                     "rank %d: gw_comm_init needs the master address (HOST:PORT) for %d ranks",
                                     rank, nranks));
    char host[256], port[16];
    if (!gw__parse_host_port(master, host, sizeof host, port, sizeof port))
      return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT,
                                     "rank %d: master address '%s' is not HOST:PORT (IPv6 as [ADDR]:PORT, "
                                     "port 1..65535)", rank, master));
    if (!gw__job_token(token, sizeof token))
      return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT,
                                     "rank %d: no job token: set GW_JOB_TOKEN to the same secret on every rank "
                                     "(gw-run does this for you)%s", rank,
                                     getenv("TORCHELASTIC_RUN_ID") && !strcmp(getenv("TORCHELASTIC_RUN_ID"), "none")
                                         ? "; TORCHELASTIC_RUN_ID is torchrun's default 'none', which every job "
                                           "shares: give torchrun --rdzv-id, or set GW_JOB_TOKEN"
                                         : ""));
  }
  gw__log_set_rank(rank);

  struct gw_comm *c = comm_alloc();
  if (!c) return gw__init_fail(&err, gw__err(&err, GW_ERR_SYSTEM, "rank %d: out of memory", rank));
  c->rank = rank;
  c->device = -1;
  c->alive_own = -1;
  c->owner_pid = (long)getpid();
  c->fork_gen = gw__fork_generation();
  c->nranks = nranks;
  c->next_seq = 1;
  double timeout_s;
  const bool timeout_ok = gw__env_seconds_checked("GW_TIMEOUT", 300.0, true, &timeout_s);
  c->timeout_s = timeout_s;
  double boot_timeout;
  const bool boot_timeout_ok = gw__env_seconds_checked("GW_BOOTSTRAP_TIMEOUT", 60.0, false, &boot_timeout);
  c->algo = gw__settings_algo(nranks);
  const char *xword = getenv("GW_EXCHANGE_MAX_BYTES"); /* "auto": the default's name, no number to warn about */
  const int64_t xmax = xword && !strcasecmp(xword, "auto") ? -1 : gw__param_ExchangeMaxBytes();
  c->exchange_max = xmax < 0 ? SIZE_MAX : (size_t)xmax; /* SIZE_MAX: auto (exchange_cap) */
  c->channel_min_bytes = (size_t)GW_MAX(1, gw__param_ChannelMinBytes());
  c->proto = gw__settings_proto();
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->err_mu, NULL);
  pthread_cond_init(&c->work_cv, NULL);
  pthread_cond_init(&c->done_cv, NULL);
  /* Settings out of range are refused, but only once the rendezvous has
   * this rank, so that every rank hears why (said here at once too): the
   * others waited out GW_BOOTSTRAP_TIMEOUT, then said only that this rank
   * never came, when ranks were started without a launcher that stops them. */
  gw_result_t refused = GW_SUCCESS;
  char bad[GW_ERRMSG_MAX];
  /* The words first: a value that is no number was warned of as "using the
   * default" by the reads, and then refused. */
  const bool words_bad = gw__settings_refused(rank, bad, sizeof bad);
  int64_t slot_bytes = words_bad ? 4096 : gw__param_ShmSlotBytes(), nslots = words_bad ? 2 : gw__param_ShmSlots();
  int64_t nchannels = words_bad ? 1 : gw__param_Channels(), nstreams = words_bad ? 1 : gw__param_SocketStreams();
  const int64_t ibqps = words_bad ? 1 : gw__env_int("GW_IB_QPS_PER_CONN", 1); /* (read as ib reads it: uncached) */
  if (words_bad)
    refused = gw__err(&err, GW_ERR_INVALID_ARGUMENT, "%s", bad);
  else if (slot_bytes < 4096 || slot_bytes > (64 << 20) || slot_bytes % 64 || nslots < 2 || nslots > 64)
    refused = gw__err(&err, GW_ERR_INVALID_ARGUMENT,
                      "rank %d: GW_SHM_SLOT_BYTES=%lld / GW_SHM_SLOTS=%lld out of range (4 KiB..64 MiB, a multiple "
                      "of 64; 2..64 slots)", rank, (long long)slot_bytes, (long long)nslots);
  else if (nchannels < 1 || nchannels > GW_MAX_CHANNELS)
    refused = gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_NCHANNELS=%lld is not in 1..%d", rank,
                      (long long)nchannels, GW_MAX_CHANNELS);
  else if (nstreams < 1 || nstreams > 16)
    refused = gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_SOCKET_NSTREAMS=%lld is not in 1..16", rank,
                      (long long)nstreams);
  else if (ibqps < 1 || ibqps > GW_IB_MAX_QPS) /* (ib used the nearest, logged as given) */
    refused = gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_IB_QPS_PER_CONN=%lld is not in 1..%d", rank,
                      (long long)ibqps, GW_IB_MAX_QPS);
  else if (!timeout_ok || !boot_timeout_ok) /* (the limits on every wait: a typo left the default unsaid) */
    refused = gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s%.60s%s%s%s%.60s%s: not %s in seconds (a number "
                      "above 0%s)", rank,
                      timeout_ok ? "" : "GW_TIMEOUT='", timeout_ok ? "" : getenv("GW_TIMEOUT"), timeout_ok ? "" : "'",
                      !timeout_ok && !boot_timeout_ok ? " and " : "",
                      boot_timeout_ok ? "" : "GW_BOOTSTRAP_TIMEOUT='", boot_timeout_ok ? "" : getenv("GW_BOOTSTRAP_TIMEOUT"),
                      boot_timeout_ok ? "" : "'", !timeout_ok && !boot_timeout_ok ? "times" : "a time",
                      timeout_ok ? "" : "; GW_TIMEOUT=0: no limit"); /* (the rendezvous always has one) */
  char refusal[GW_ERRMSG_MAX] = "";
  if (refused) {
    if (nranks == 1) {
      res = refused;
      goto fail;
    }
    snprintf(refusal, sizeof refusal, "%s", err.msg);
    GW_WARN(GW_SUB_INIT, "%s; failing init once the rendezvous has this rank, so that the others hear it too",
            refusal);
    nchannels = 1, slot_bytes = 4096, nslots = 2, nstreams = 1; /* nothing is connected with them */
  }
  c->nchannels = nranks == 1 ? 1 : (int)nchannels;
  c->conn_params = (struct gw_conn_params){.nslots = (uint32_t)nslots, .slot_bytes = (uint32_t)slot_bytes,
                                           .job_hash = gw__fnv(GW_FNV_START, token, strlen(token)), .nstreams = (uint32_t)nstreams,
                                           .timeout_s = boot_timeout};
  c->peers = calloc((size_t)nranks, sizeof *c->peers);
  if (!c->peers) {
    res = gw__err(&err, GW_ERR_SYSTEM, "rank %d: out of memory", rank);
    goto fail;
  }
  struct gw_peer_info me;
  memset(&me, 0, sizeof me); /* padding included: it goes on the wire */
  me.rank = rank, me.pid = (int32_t)getpid(), me.caps = gw__transport_caps() | gw__dev_caps();
  struct stat st;
  if (stat("/dev/shm", &st) == 0) me.shm_id = ((uint64_t)st.st_dev << 32) ^ (uint64_t)st.st_ino;
  me.pidns = gw__pidns_self();
  me.uid = (uint32_t)geteuid();
  cpu_set_t aff;
  if (sched_getaffinity(0, sizeof aff, &aff) == 0)
    for (int cpu = 0; cpu < 1024 && cpu < CPU_SETSIZE; cpu++)
      if (CPU_ISSET(cpu, &aff)) me.cpus[cpu / 64] |= 1ull << (cpu % 64);
  me.ncpus = gw__usable_cpus(me.cpus);
  gw__node_id(me.node_id, sizeof me.node_id);
  if (gethostname(me.host, sizeof me.host) != 0) snprintf(me.host, sizeof me.host, "?");
  me.host[sizeof me.host - 1] = 0;
  if (nranks == 1) {
    c->peers[0] = me;
    GW_CHECK_GOTO(build_ring_order(c, &err), res, fail);
    c->tclass = GW_TCLASS_SHM, c->model_from_file = model_init(c); /* (read for its warnings: nothing picks) */
  } else {
    const int swept = gw__shm_sweep(); /* what dead ranks of earlier jobs left (a full /dev/shm fails this one) */
    if (swept)
      GW_INFO(GW_SUB_INIT, "rank %d: removed %d file%s from /dev/shm that ranks of this user which died during setup "
              "left", rank, swept, swept == 1 ? "" : "s");
    gw__alive_create(c, &me);
    res = gw__bootstrap_init(&c->bs, rank, nranks, master, token, boot_timeout, &err);
    /* the table exchanged first: a rank that left right after joining was
     * taken for one that exited during the rendezvous, its news unread */
    if (!res) res = gw__bootstrap_allgather(c->bs, &me, c->peers, sizeof me, &err);
    if (refused) { /* the refusal first, the rendezvous's failure after it */
      char boot[GW_ERRMSG_MAX];
      snprintf(boot, sizeof boot, "%s", err.msg);
      if (res) res = gw__err(&err, refused, "%s (and the rendezvous failed: %s)", refusal, boot);
      else res = gw__err(&err, refused, "%s", refusal);
    }
    if (res) goto fail;
    /* A test hook: this rank late to the next exchange, after rank 0 ended
     * the rendezvous and closed (test_setting_refused_said_to_all). */
    const char *pause = getenv("GW_TEST_AFTER_TABLE_PAUSE_MS");
    const char *cmd = getenv("GW_TEST_AFTER_TABLE_CMD"); /* (and a command first: test_rdzv_link_down_named) */
    if (cmd && system(cmd) != 0) GW_WARN(GW_SUB_INIT, "rank %d: GW_TEST_AFTER_TABLE_CMD failed", rank);
    if (pause) usleep((useconds_t)(atoi(pause) * 1000));
    for (int r = 0; r < nranks; r++) {
      if (c->peers[r].rank != r) {
        res = gw__err(&err, GW_ERR_REMOTE, "rank %d: rendezvous returned a garbled table (slot %d says rank %d)",
                      rank, r, c->peers[r].rank);
        goto fail;
      }
      c->peers[r].node_id[sizeof c->peers[r].node_id - 1] = 0;
      c->peers[r].host[sizeof c->peers[r].host - 1] = 0;
      if (r < rank && !strcmp(c->peers[r].node_id, me.node_id)) c->local_rank++;
      if (!strcmp(c->peers[r].node_id, me.node_id)) c->local_size++;
    }
    const char *env_local = gw__env_local_rank();
    if (env_local && atoi(env_local) != c->local_rank)
      GW_WARN(GW_SUB_INIT, "rank %d: the launcher says local rank %s but the rendezvous found %d ranks before it "
              "on this machine; using %d", rank, env_local, c->local_rank, c->local_rank);
    GW_CHECK_GOTO(gw__alive_open_peers(c, &err), res, fail);
    GW_CHECK_GOTO(connect_all(c, &err), res, fail);
  }
  GW_CHECK_GOTO(gw__dev_bind(c, &err), res, fail);
  GW_CHECK_GOTO(gw__dev_ring_setup(c, &err), res, fail);
  GW_INFO(GW_SUB_INIT, "rank %d of %d (local rank %d) ready; reduction kernels %s", rank, nranks, c->local_rank,
          gw__reduce_simd_name());
  gw__live_add(c, GW_LIVE_COMM); /* whole: a destroy may take it */
  /* A gw_comm_abort through a stale handle that saw the old communicator
   * alive or its destroy under way and set its flag only after comm_alloc's
   * clearing is not this communicator's: such an abort still between its
   * look and its store is waited for (a few instructions, unless its thread
   * was preempted there), and its flag cleared. */
  struct gw_waiter w; /* the waiting policy (spin, yield, then sleep: a waiter of higher priority livelocked on a yield) */
  gw__waiter_init(&w, 1.0);
  while (atomic_load(&c->aborting) > 0)
    if (!gw__waiter_pause(&w)) { /* an abort that will not finish: a handler jumped out of it, its thread ended */
      GW_WARN(GW_SUB_INIT, "rank %d: a gw_comm_abort through a destroyed communicator's handle in this memory has "
              "not finished in 1 s (its thread stopped, or a signal handler left it): going on", rank);
      atomic_store(&c->aborting, 0);
      break;
    }
  atomic_store(&c->aborted, false);
  atomic_store(&c->destroying, GW_DESTROY_NO); /* and calls may enter */
  *out = c;
  return GW_SUCCESS;
fail:
  gw__bootstrap_fail(c->bs, err.msg); /* the others hear why, not that this rank went */
  /* Failed once connected (a channel's thread refused, the device ring):
   * peers whose init was done by then hear why at their first call, not that
   * this rank left. */
  if (c->connected) {
    struct gw_opdesc d = {.seq = atomic_load(&c->next_seq), .root = -1, .coll = GW_COLL_ABORT};
    gw__send_abort(c, &d, err.msg);
  }
  comm_free(c);
  return gw__init_fail(&err, res);
}

/* Whether comm is its process's own: not a forked child's copy of it. */
static bool forked_away(const struct gw_comm *comm) {
  return comm->fork_gen != atomic_load_explicit(&gw__fork_gen, memory_order_relaxed); /* init installed the handler */
}
bool gw__comm_forked_away(const struct gw_comm *comm) { return forked_away(comm); }

/* A call refused at the gate (GOING or FREE): the thread's error says whether the
 * communicator is still being destroyed or is gone (its gate outlives the
 * free, comm_alloc: every call after gw_comm_destroy returned said "being
 * destroyed on another thread", with no other thread).  Only the gate and the
 * registry are read: the rest may be freed. */
static void refuse_going(const struct gw_comm *comm, const char *fn) {
  char msg[GW_ERRMSG_MAX];
  if (gw__live_has(comm, GW_LIVE_COMM))
    snprintf(msg, sizeof msg, "%s: the communicator is being destroyed on another thread", fn);
  else
    snprintf(msg, sizeof msg, "%s: %p is not a live communicator (gw_comm_destroy freed it): nothing done", fn,
             (const void *)comm);
  gw__set_thread_error(msg);
}

/* gw__comm_peek; quiet: a refusal leaves the thread's error as it is. */
static bool peek(struct gw_comm *comm, const char *fn, bool quiet) {
  if (forked_away(comm)) return true;
  atomic_fetch_add(&comm->peeking, 1); /* seq_cst: destroy's GOING, then its look at peeking */
  if (atomic_load(&comm->destroying) < GW_DESTROY_GOING) return true;
  atomic_fetch_sub(&comm->peeking, 1);
  if (!quiet) refuse_going(comm, fn);
  return false;
}

bool gw__comm_peek(struct gw_comm *comm, const char *fn) { return peek(comm, fn, false); }

void gw__comm_unpeek(struct gw_comm *comm) {
  if (!forked_away(comm)) atomic_fetch_sub(&comm->peeking, 1);
}

/* A refusal's message: the communicator's error, or in a forked child this
 * thread's (the parent's threads may have held the error lock at the fork:
 * held in the child for good, and the refusal hung instead). */
static void refusal(struct gw_comm *comm, const char *msg) {
  if (forked_away(comm)) gw__set_thread_error(msg);
  else gw__comm_set_error(comm, msg);
}

gw_result_t gw__comm_enter(struct gw_comm *comm, const char *fn) {
  if (forked_away(comm)) {
    char msg[GW_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "rank %d: %s: this communicator belongs to process %ld, which forked this one (pid "
             "%ld); a child cannot use it (make a new communicator in the child, after exec or not)", comm->rank, fn,
             comm->owner_pid, (long)getpid());
    refusal(comm, msg);
    return GW_ERR_INVALID_ARGUMENT;
  }
  atomic_fetch_add(&comm->inside, 1); /* seq_cst, against destroy's flag and count */
  int state;
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  while ((state = atomic_load(&comm->destroying)) == GW_DESTROY_CHECKING) gw__waiter_pause(&w); /* its verdict */
  if (state >= GW_DESTROY_GOING) {
    /* Destroy frees the communicator once `inside` is 0 again: the message
     * goes to this thread's error (gw_comm_last_error(NULL)), and nothing of
     * the communicator is touched after the count (it took the lock and set
     * the communicator's error under a free). */
    atomic_fetch_sub(&comm->inside, 1);
    refuse_going(comm, fn);
    return GW_ERR_INVALID_ARGUMENT;
  }
  return GW_SUCCESS;
}

void gw__comm_leave(struct gw_comm *comm) { atomic_fetch_sub(&comm->inside, 1); }

/* Why gw_comm_destroy cannot free comm now, into msg; false if it can. */
static bool destroy_refused(struct gw_comm *comm, char *msg, size_t len) {
  if (forked_away(comm)) {
    snprintf(msg, len, "rank %d: gw_comm_destroy refused: this communicator belongs to process %ld, which forked this "
             "one; a child cannot free it (its copy goes when the child exits)", comm->rank, comm->owner_pid);
    return true;
  }
  const int inside = atomic_load(&comm->inside) - 1 /* this destroy */, bucketers = atomic_load(&comm->bucketers),
            requests = atomic_load(&comm->requests);
  if (inside > 0)
    snprintf(msg, len, "rank %d: gw_comm_destroy refused: %d call%s on this communicator (a collective, gw_wait, ...) "
             "%s still running on another thread; destroy it once %s returned (gw_comm_abort makes %s return "
             "promptly); the communicator is unchanged", comm->rank, inside, inside == 1 ? "" : "s",
             inside == 1 ? "is" : "are", inside == 1 ? "it has" : "they have", inside == 1 ? "it" : "them");
  else if (bucketers > 0)
    snprintf(msg, len, "rank %d: gw_comm_destroy refused: %d bucketer%s still use%s it (gw_bucketer_destroy first); "
             "the communicator is unchanged", comm->rank, bucketers, bucketers == 1 ? "" : "s",
             bucketers == 1 ? "s" : "");
  else if (requests > 0)
    snprintf(msg, len, "rank %d: gw_comm_destroy refused: %d request%s of non-blocking calls %s not been waited for "
             "(gw_wait or gw_test %s to the end first: after gw_comm_abort %s promptly); the communicator is "
             "unchanged", comm->rank, requests, requests == 1 ? "" : "s", requests == 1 ? "has" : "have",
             requests == 1 ? "it" : "them", requests == 1 ? "it ends" : "they end");
  else
    return false;
  return true;
}

gw_result_t gw_comm_destroy(gw_comm_t comm) {
  if (!comm) return GW_SUCCESS;
  if (!gw__live_or_refuse(comm, GW_LIVE_COMM, "gw_comm_destroy")) return GW_ERR_INVALID_ARGUMENT;
  /* Freed under a call on another thread, a bucketer or a request, the
   * communicator would be used after its free (a crash, or worse): refused,
   * left as it was, so the caller can let them finish and destroy it again.
   * The flag first: a call entering after the count sees it (seq_cst). */
  char msg[GW_ERRMSG_MAX];
  int idle = GW_DESTROY_NO;
  /* A second destroy racing this one touches only the gate, which outlives
   * the free (comm_alloc), and says so in its thread's error (it locked the
   * freed error mutex once; counted inside, it made the first one refuse too,
   * "1 call ... is still running"). */
  if (!atomic_compare_exchange_strong(&comm->destroying, &idle, GW_DESTROY_CHECKING)) {
    snprintf(msg, sizeof msg, "rank %d: gw_comm_destroy refused: another thread is destroying this communicator",
             comm->rank);
    gw__set_thread_error(msg);
    return GW_ERR_INVALID_ARGUMENT;
  }
  atomic_fetch_add(&comm->inside, 1); /* counted inside like every call while it decides */
  if (destroy_refused(comm, msg, sizeof msg)) {
    atomic_store(&comm->destroying, GW_DESTROY_NO); /* the calls that waited for the verdict go on */
    refusal(comm, msg);
    GW_WARN(GW_SUB_INIT, "%s", msg);
    atomic_fetch_sub(&comm->inside, 1);
    return GW_ERR_INVALID_ARGUMENT;
  }
  atomic_store(&comm->destroying, GW_DESTROY_GOING);
  /* A call that entered after the count (and waited for the verdict), or a
   * losing destroy, is on its way out: it must be gone before the free. */
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  while (atomic_load(&comm->inside) > 1 || atomic_load(&comm->peeking) > 0) gw__waiter_pause(&w);
  atomic_fetch_sub(&comm->inside, 1);
  gw__progress_stop(comm);
  if (atomic_load(&comm->aborted)) {
    /* Aborted with no operation since: the peers have not heard of it yet (an
     * operation would have told them), and may be waiting in one. */
    struct gw_errctx err;
    char why[GW_ERRMSG_MAX];
    gw__abort_reason(comm, why, sizeof why); /* the bucketer's, when it aborted */
    gw__err(&err, GW_ERR_ABORTED, "rank %d: %.440s (and destroyed)", comm->rank, why);
    struct gw_opdesc d = {.seq = atomic_load(&comm->next_seq), .root = -1, .coll = GW_COLL_ABORT};
    gw__comm_fail(comm, &d, GW_ERR_ABORTED, &err);
  } else if (!atomic_load(&comm->failed) && comm->nranks > 1) {
    /* A peer's notice behind the data of this rank's last operation: that
     * completed here (its data had all arrived) but failed there (a timeout
     * while this rank was late, an abort); with no call after it, nothing
     * else would ever say so.  Said, not returned: the communicator is freed
     * either way, and an error here would invite a second destroy. */
    struct gw_errctx err;
    if (gw__heard_abort(comm, &err) != GW_SUCCESS)
      GW_WARN(GW_SUB_INIT, "rank %d: destroyed with that peer's failure notice (above) unread: the peer failed in "
              "or after this rank's last operation, which completed here", comm->rank);
  }
  comm_free(comm);
  return GW_SUCCESS;
}
