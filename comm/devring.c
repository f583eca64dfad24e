/* devring.c - the device ring (the cudaipc path): device data stays on the
 * devices when every rank's ring neighbours are on its machine.  Each slot of
 * ring 0's shared-memory FIFOs has a twin in the receiver's device memory,
 * which the sender maps once by IPC handle (cudaIpcOpenMemHandle).  A
 * primitive moves the payload into the peer's twin (a copy, or the reduction
 * kernel writing there directly), and the chunk's header goes over the host
 * FIFO as always, so sequence numbers, call checks, deadlines, dead peers and
 * abort notices work unchanged.  How the streams of neighbours are ordered:
 * the progress thread runs each chunk's work on the engine's stream and
 * synchronizes it before the header goes out (the default), or the caller's
 * thread puts the whole operation on the caller's stream at the call, with
 * counters the streams write and wait on (GW_DEV_ASYNC).  Here: setup and
 * teardown (agreement between ranks, IPC mapping, the counters' pages), the
 * primitives, and the end of a stream-ordered operation.  device.c decides
 * which operations take the ring and runs them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "devring.h"
#include "prims.h"

/* The device ring's chunk (and twin slot) size, and a switch for it.  4 MiB:
 * each chunk costs a stream synchronization and a header, and on the H200
 * (2 ranks, one GPU) 4 MiB chunks moved 256 MiB 3.7x faster than 1 MiB ones
 * (11.2 against 3.0 GB/s), within 13% of them from 1 MiB down. */
GW_PARAM(DevChunkBytes, "GW_DEV_CHUNK_BYTES", 4 << 20)
size_t gw__devring_chunk(int64_t asked) {
  return (size_t)GW_ALIGN_UP(GW_MIN(GW_MAX(asked, 4096), (int64_t)1 << 30), 256);
}
GW_PARAM(DevIpc, "GW_DEV_IPC", 1)
/* How the device ring copies: 0 (default) a kernel on the SMs (copy_async:
 * the two copies of a forwarded chunk, into the peer's twin and the output,
 * from one read, like the reduction's second output); 1 the copy engine
 * (memcpy_async, one per destination).  A rank's own choice: the peers never
 * see it.  scripts/gpu-check.sh measures both. */
GW_PARAM(DevCopyEngine, "GW_DEV_COPY_ENGINE", 0)
/* Device-buffer operations smaller than this go through host staging even
 * where the device ring exists: the ring pays a stream synchronization and a
 * header per step, 2 (n - 1) of them for an allreduce, where staging pays two
 * copies and the host algorithms (exchange, tree, LL) at host latency.  Rank
 * 0's is every rank's (agreed at init with the ring). */
GW_PARAM_MIN(DevRingMinBytes, "GW_DEV_RING_MIN_BYTES", 64 << 10, 0)
/* How the device ring orders one rank's stream with its neighbours': 0
 * (default) the progress thread runs each chunk's work on the engine's stream
 * and synchronizes it before the chunk's header goes out (a host round trip
 * per chunk); 1 (stream-ordered) the caller's thread puts the whole
 * operation's device work on the caller's stream at the call, and the
 * streams order the chunks between them: each connection's shared page holds
 * two counters that the streams write and wait on (the driver's stream memory
 * operations), the sender's "chunks ready" and the receiver's "chunks read";
 * the progress thread sends the headers (every check as ever) and waits once
 * per operation.  Used only when every rank asks for it and could register
 * both pages. */
GW_PARAM(DevAsync, "GW_DEV_ASYNC", 0)
/* At destroy, how long a rank waits for its ring predecessor to unmap this
 * rank's twins before it frees them (gw__dev_ring_free). */
GW_PARAM_MIN(DevUnmapWaitMs, "GW_DEV_UNMAP_WAIT_MS", 2000, 0)

/* What a failed operation stores in the counters its stream waits on, so the
 * stream runs to its end instead of waiting for a peer that will never write. */
#define GW_DEV_FLAG_RELEASE (1ull << 62)

/* The checks of a host wait on the stream-ordered ring: an abort, a dead
 * neighbour (looked at every 100 ms), the limit (GW_TIMEOUT when the wait
 * started: a wait under way keeps it, gradwire.h) counted from start. */
static gw_result_t ring_watch(struct gw_comm *comm, const struct gw_op *op, double start, double limit,
                              double *next_look, struct gw_errctx *err) {
  const int prev = comm->rings[0].prev, next = comm->rings[0].next;
  const double now = gw__now();
  char what[GW_OPDESC_TEXT];
  if (atomic_load(&comm->aborted)) {
    gw__describe_op(&op->desc, what, sizeof what);
    return gw__err(err, GW_ERR_ABORTED, "rank %d: aborted while the device ring's stream ran operation %s",
                   comm->rank, what);
  }
  if (now > *next_look) {
    *next_look = now + 0.1;
    /* The predecessor's abort notice: its operation failed, and its stream,
     * whose counter writes this stream may wait for, may never run them
     * (a device fault).  Only looked at: the host waits take it as ever. */
    GW_CHECK(gw__notice_on(comm, &comm->rings[0].recv, err));
    const int dead = !gw__peer_alive(comm, prev) ? prev : !gw__peer_alive(comm, next) ? next : -1;
    if (dead >= 0) {
      gw__describe_op(&op->desc, what, sizeof what);
      return gw__err(err, GW_ERR_REMOTE, "rank %d: rank %d (pid %d on this machine) died during operation %s, "
                     "while this rank's stream waited for its stream on the device ring", comm->rank, dead,
                     (int)comm->peers[dead].pid, what);
    }
  }
  if (limit > 0 && now - start > limit) {
    /* A stopped rank anywhere on the ring (all on this machine) is named:
     * each rank said "rank prev's or rank next's", a healthy one always
     * among them, and a rank not beside the stopped one neither. */
    for (int k = 1; k < comm->nranks; k++) {
      const int r = (comm->rank + k) % comm->nranks;
      if (gw__stopped_peer_error(comm, r, &op->desc, "the device ring's stream of", now - start, err) != GW_SUCCESS)
        return GW_ERR_TIMEOUT;
    }
    gw__describe_op(&op->desc, what, sizeof what);
    return gw__err(err, GW_ERR_TIMEOUT, "rank %d: operation %s: this rank's stream still waits after %.0f s "
                   "(GW_TIMEOUT) for rank %d's or rank %d's stream on the device ring", comm->rank, what,
                   limit, prev, next);
  }
  return GW_SUCCESS;
}

/* The end of a stream-ordered device-ring operation: the host waits until the
 * caller's stream has done the operation's device work (its flag), which may
 * still wait on its neighbours' streams.  Those waits end when the
 * neighbours' streams get there, unless a neighbour died, the operation
 * failed on the host (its peers may never send the rest), the communicator
 * was aborted, or GW_TIMEOUT passes: then the counters this stream waits on
 * are set past anything it waits for (again and again, as a live neighbour's
 * stream may still store a lower count), so the stream runs out its work, on
 * garbage, and the operation fails.  A device fault is sticky: our own
 * stream, asked every 100 ms, reports it (the caller may have destroyed its
 * stream since). */
static gw_result_t ring_drain(struct gw_comm *comm, const struct gw_op *op, gw_result_t res,
                              const struct gw_ring_end *e, struct gw_errctx *err) {
  const struct gw_devring *dr = comm->devring;
  const double start = gw__now(), limit = comm->timeout_s;
  double next_look = start + 0.1, next_query = start + 0.1;
  bool release = res != GW_SUCCESS;
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  for (;;) {
    int idle = 0;
    if (atomic_load_explicit(e->unqueued, memory_order_acquire) == e->ticket) {
      /* The rest never went on the stream, so it may never say it is done
       * (and the caller was told the call failed). */
      gw__dev_ring_release(comm);
      return res != GW_SUCCESS ? res
                               : gw__err(err, GW_ERR_CUDA, "rank %d: operation #%llu could not be put on the "
                                         "caller's stream: %.300s", comm->rank, (unsigned long long)op->desc.seq,
                                         e->unqueued_why);
    }
    if (atomic_load_explicit((const _Atomic uint64_t *)e->finished, memory_order_acquire) >= e->want) break;
    if (gw__now() > next_query) {
      next_query = gw__now() + 0.1;
      if (e->query && dr->ops->stream_idle(e->query, &idle))
        return res != GW_SUCCESS ? res : gw__dev_fail(err, comm, "the device, while the device ring's stream ran,");
    }
    if (!release) {
      res = ring_watch(comm, op, start, limit, &next_look, err);
      release = res != GW_SUCCESS;
    }
    if (release) gw__dev_ring_release(comm);
    gw__waiter_pause(&w);
  }
  return res;
}

void gw__dev_ring_release(struct gw_comm *comm) {
  const struct gw_devring *dr = comm->devring;
  if (!dr || !dr->async) return;
  atomic_store_explicit((_Atomic uint64_t *)dr->ready_in, GW_DEV_FLAG_RELEASE, memory_order_release);
  atomic_store_explicit((_Atomic uint64_t *)dr->read_out, GW_DEV_FLAG_RELEASE, memory_order_release);
}

/* Stream-ordered, a header no longer vouches for its data: a rank whose
 * stream was released (its neighbour died, its operation failed) forwards
 * what its twins hold, and a rank further on may finish on it with no error
 * of its own.  So after its stream is done every rank takes part in a
 * barrier under the operation's second sequence number (gw__dev_npieces
 * reserves it): a rank whose operation failed never enters it (its abort
 * notice, or its death, fails everyone's), and the operation is good only
 * where every rank finished.  One small host operation per device
 * operation, where the synchronized ring pays a host round trip per chunk. */
static gw_result_t ring_confirm(struct gw_comm *comm, const struct gw_op *op, struct gw_errctx *err) {
  struct gw_op bar = {.desc = {.seq = op->desc.seq + 1, .coll = GW_COLL_BARRIER, .dtype = GW_INT8, .op = GW_SUM,
                               .root = -1}};
  return gw__run_op(comm, &bar, err);
}

gw_result_t gw__dev_ring_end(struct gw_comm *comm, const struct gw_op *op, gw_result_t res,
                             const struct gw_ring_end *e, struct gw_errctx *err) {
  res = ring_drain(comm, op, res, e, err);
  return res == GW_SUCCESS ? ring_confirm(comm, op, err) : res;
}

uint32_t gw__dev_caps(void) {
  const char *want = gw__env_str("GW_DEVICE", NULL);
  if (!gw__dev() || (want && !strcmp(want, "none"))) return 0;
  return GW_CAP_DEVLAYER | (gw__param_DevIpc() != 0 ? GW_CAP_DEVICE : 0);
}

bool gw__dev_ring_async(const struct gw_comm *comm) { return comm->devring && comm->devring->async; }

/* Whether this rank can take part: a device that maps its peers' memory, and
 * ring 0's neighbours reached over shared memory (same machine). */
static bool ring_candidate(const struct gw_comm *comm) {
  const struct gw_ring *r = &comm->rings[0];
  if (!(comm->device >= 0 && gw__dev() && gw__param_DevIpc() != 0 && r->send.tp && r->recv.tp &&
        r->send.tp->position && r->recv.tp->position))
    return false;
  return true;
}

static void flags_unregister(struct gw_devring *dr) {
  for (int i = 0; i < 2; i++)
    if (dr->reg[i] && dr->ops->host_unregister(dr->reg[i]))
      GW_WARN(GW_SUB_INIT, "unregistering the device ring's flag page: %s", dr->ops->error());
  dr->reg[0] = dr->reg[1] = NULL;
  dr->ready_in = dr->read_in = dr->ready_out = dr->read_out = NULL;
}

/* Registers the first page of both ring-0 connections' mappings, where their
 * counters are, so this rank's stream can write and wait on them. */
static bool flags_register(struct gw_comm *comm, struct gw_devring *dr) {
  struct gw_ring *r = &comm->rings[0];
  if (!r->send.tp->dev_flag || !r->recv.tp->dev_flag) return false;
  if (atomic_load(&gw__dev_given_up)) { /* registering and unregistering may wait for the device too */
    GW_WARN(GW_SUB_INIT, "rank %d: GW_DEV_ASYNC: an operation was given up at an earlier destroy in this process, "
            "so no pages are registered", comm->rank);
    return false;
  }
  const long page = sysconf(_SC_PAGESIZE);
  dr->reg_bytes = (size_t)(page > 0 ? page : 4096);
  struct gw_conn *c[2] = {&r->recv, &r->send};
  for (int i = 0; i < 2; i++) {
    void *base = (void *)((uintptr_t)c[i]->tp->dev_flag(c[i], 0) & ~(uintptr_t)(dr->reg_bytes - 1));
    if (dr->ops->host_register(base, dr->reg_bytes)) {
      GW_WARN(GW_SUB_INIT, "rank %d: GW_DEV_ASYNC: cannot register the flags shared with rank %d: %s", comm->rank,
              c[i]->peer, dr->ops->error());
      flags_unregister(dr);
      return false;
    }
    dr->reg[i] = base;
  }
  dr->ready_in = r->recv.tp->dev_flag(&r->recv, 0);
  dr->read_in = r->recv.tp->dev_flag(&r->recv, 1);
  dr->ready_out = r->send.tp->dev_flag(&r->send, 0);
  dr->read_out = r->send.tp->dev_flag(&r->send, 1);
  return true;
}

/* Unregistering may wait for a stream that never ends (see gw__dev_given_up):
 * the pages stay registered, so their mappings must stay too (a later mapping
 * at the address would meet the old registration). */
static void flags_leave(struct gw_comm *comm, const struct gw_devring *dr) {
  if (dr->reg[0] || dr->reg[1]) comm->rings[0].send.keep_mapped = comm->rings[0].recv.keep_mapped = true;
}

static void ring_free(struct gw_comm *comm, struct gw_devring *dr) {
  if (!dr) return;
  if (atomic_load(&gw__dev_given_up)) flags_leave(comm, dr);
  else flags_unregister(dr);
  if (dr->send_twin) dr->ops->ipc_close(dr->send_twin);
  if (dr->recv_twin) dr->ops->free(dr->recv_twin);
  free(dr);
}

struct ring_offer {
  int32_t ok;
  int32_t async; /* 1: asks for GW_DEV_ASYNC and registered its flags; -1: asks, could not */
  int32_t one_queue; /* its streams share one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) */
  uint32_t nslots;
  uint64_t chunk, min_bytes, stage_bytes;
  struct gw_dev_ipc ipc;
};

gw_result_t gw__dev_ring_setup(struct gw_comm *comm, struct gw_errctx *err) {
  comm->devring = NULL;
  if (comm->nranks < 2) return GW_SUCCESS;
  /* Only when every rank has a device layer (the rendezvous' capability
   * flags), so host-only jobs spend no round on it: the staging size is
   * agreed wherever device buffers can run, the ring where every rank could
   * also map its neighbour's memory. */
  bool all_ipc = true;
  for (int r = 0; r < comm->nranks; r++) {
    if (!(comm->peers[r].caps & GW_CAP_DEVLAYER)) return GW_SUCCESS;
    all_ipc &= (comm->peers[r].caps & GW_CAP_DEVICE) != 0;
  }
  const struct gw_dev_ops *dv = gw__dev();
  struct gw_devring *dr = calloc(1, sizeof *dr);
  struct ring_offer mine = {0}, *all = calloc((size_t)comm->nranks, sizeof *all);
  gw_result_t res = dr && all ? GW_SUCCESS : gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", comm->rank);
  bool mapping = false; /* the second round began: a peer may map our twins */
  if (res != GW_SUCCESS) goto out;
  dr->ops = dv;
  dr->nslots = comm->conn_params.nslots;
  const int64_t chunk_asked = gw__param_DevChunkBytes();
  dr->chunk = gw__devring_chunk(chunk_asked);
  if (chunk_asked < 4096 || chunk_asked > (int64_t)1 << 30)
    GW_WARN(GW_SUB_INIT, "rank %d: GW_DEV_CHUNK_BYTES=%lld is outside 4096..1073741824: %zu used", comm->rank,
            (long long)chunk_asked, dr->chunk);
  dr->copy_engine = gw__param_DevCopyEngine() != 0;
  dr->min_bytes = (uint64_t)GW_MAX(gw__param_DevRingMinBytes(), 0);
  void *twin = NULL;
  const bool candidate = all_ipc && ring_candidate(comm);
  if (candidate && dv->alloc(&twin, (size_t)dr->nslots * dr->chunk) == 0) {
    dr->recv_twin = twin;
    mine.ok = dv->ipc_get(twin, &mine.ipc) == 0;
    if (!mine.ok) GW_WARN(GW_SUB_INIT, "rank %d: no IPC handle for the device ring: %s", comm->rank, dv->error());
  } else if (candidate) {
    GW_WARN(GW_SUB_INIT, "rank %d: no device memory for the device ring: %s", comm->rank, dv->error());
  }
  if (mine.ok && gw__param_DevAsync() != 0) mine.async = flags_register(comm, dr) ? 1 : -1;
  mine.nslots = dr->nslots, mine.chunk = dr->chunk, mine.min_bytes = dr->min_bytes;
  mine.stage_bytes = gw__dev_stage_bytes_own();
  mine.one_queue = mine.ok && gw__dev_queues() == 1;
  GW_CHECK_GOTO(gw__bootstrap_allgather(comm->bs, &mine, all, sizeof mine, err), res, out);
  /* Rank 0's staging size and ring minimum are every rank's: an operation's
   * pieces, and whether it takes the ring, must be the same everywhere.  A
   * rank whose own setting differs says so (each rank speaks for itself). */
  comm->dev_stage_bytes = all[0].stage_bytes;
  dr->min_bytes = all[0].min_bytes;
  if (mine.stage_bytes != all[0].stage_bytes)
    GW_WARN(GW_SUB_INIT, "rank %d: GW_DEV_STAGE_BYTES is %llu here and %llu on rank 0: rank 0's is used (set it "
            "alike on every rank)", comm->rank, (unsigned long long)mine.stage_bytes,
            (unsigned long long)all[0].stage_bytes);
  if (all_ipc && mine.min_bytes != all[0].min_bytes)
    GW_WARN(GW_SUB_INIT, "rank %d: GW_DEV_RING_MIN_BYTES is %llu here and %llu on rank 0: rank 0's is used (set "
            "it alike on every rank)", comm->rank, (unsigned long long)mine.min_bytes,
            (unsigned long long)all[0].min_bytes);
  bool agree = true;
  for (int r = 0; r < comm->nranks; r++) {
    /* The twins are sized by each rank's own chunk and slots: a mismatch
     * leaves the ring out, and says which setting (GW_SHM_SLOTS is checked
     * by the host connections themselves). */
    if (all[r].ok && mine.ok && all[r].chunk != mine.chunk && agree)
      GW_WARN(GW_SUB_INIT, "rank %d: GW_DEV_CHUNK_BYTES is %llu here and %llu on rank %d: no device ring (set it "
              "alike on every rank)", comm->rank, (unsigned long long)mine.chunk, (unsigned long long)all[r].chunk,
              r);
    agree &= all[r].ok && all[r].nslots == mine.nslots && all[r].chunk == mine.chunk;
  }
  /* One hardware queue: the synchronized ring's engine stream would sit
   * behind the caller's stream's wait for it, so only the stream-ordered ring
   * (all of an operation's work on the caller's stream), and only where every
   * rank runs it (decided before anything is mapped). */
  int one_queue = -1, no_async = -1;
  for (int r = 0; r < comm->nranks; r++) {
    if (all[r].one_queue && one_queue < 0) one_queue = r;
    if (all[r].async != 1 && no_async < 0) no_async = r;
  }
  if (agree && one_queue >= 0 && no_async >= 0) {
    agree = false;
    /* named by what set it here (the CUDA variable was named whatever did) */
    const char *why = gw__dev_queues_set()                          ? "GW_DEV_QUEUES=1"
                      : dv && dv->name && !strcmp(dv->name, "cuda") ? "CUDA_DEVICE_MAX_CONNECTIONS=1"
                                                                    : "GW_DEV_EMU_CONNECTIONS=1";
    if (mine.one_queue)
      GW_WARN(GW_SUB_INIT, "rank %d: this rank's device streams share one hardware queue (%s) and rank %d runs no "
              "stream-ordered ring (GW_DEV_ASYNC=1 on every rank allows one): no device ring, device buffers go "
              "through host staging", comm->rank, why, no_async);
  }
  if (agree) {
    /* Second round: every rank maps its ring successor's twins. */
    mapping = true;
    void *peer = NULL;
    int32_t opened = dv->ipc_open(&all[comm->rings[0].next].ipc, &peer) == 0, *oks = calloc((size_t)comm->nranks, 4);
    if (!opened) GW_WARN(GW_SUB_INIT, "rank %d: cannot map rank %d's device memory: %s", comm->rank,
                         comm->rings[0].next, dv->error());
    /* Mapped is not reachable: our kernels write the twins, which on another
     * GPU needs peer access (else the first write faults the context). */
    int is_dev = 0, pdev = -1, reach = 1;
    if (opened && dv->ptr_kind(peer, &is_dev, &pdev) == 0 && is_dev && pdev != comm->device &&
        (dv->can_access_peer(comm->device, pdev, &reach) || !reach)) {
      GW_WARN(GW_SUB_INIT, "rank %d: device %d cannot reach rank %d's device %d (no peer access)", comm->rank,
              comm->device, comm->rings[0].next, pdev);
      if (!atomic_load(&gw__dev_given_up)) dv->ipc_close(peer);
      opened = 0;
    }
    dr->send_twin = opened ? peer : NULL;
    if (!oks) {
      res = gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", comm->rank);
      goto out;
    }
    res = gw__bootstrap_allgather(comm->bs, &opened, oks, sizeof opened, err);
    for (int r = 0; r < comm->nranks && res == GW_SUCCESS; r++) agree &= oks[r] != 0;
    free(oks);
    if (res != GW_SUCCESS) goto out;
    if (!agree) { /* every rank unmaps before any frees (the barrier): freeing mapped memory is undefined */
      if (dr->send_twin && !atomic_load(&gw__dev_given_up)) dv->ipc_close(dr->send_twin);
      dr->send_twin = NULL;
      GW_CHECK_GOTO(gw__bootstrap_barrier(comm->bs, err), res, out);
    }
  }
  if (agree) {
    /* Stream-ordered only where every rank can: a rank waiting on a counter
     * its neighbour never writes would hang its stream. */
    int without = -1;
    for (int r = 0; r < comm->nranks && without < 0; r++)
      if (all[r].async != 1) without = r;
    dr->async = without < 0;
    if (!dr->async && mine.async)
      GW_WARN(GW_SUB_INIT, "rank %d: GW_DEV_ASYNC is off on the device ring: rank %d %s", comm->rank, without,
              all[without].async ? "could not register its flags" : "did not ask for it (set it alike on every rank)");
    if (!dr->async) flags_unregister(dr);
    comm->devring = dr;
    dr = NULL;
    GW_INFO(GW_SUB_INIT, "rank %d: device ring over IPC (%u slots of %zu bytes, %s; operations under %llu bytes "
            "through host staging)", comm->rank, comm->devring->nslots, comm->devring->chunk,
            comm->devring->async ? "stream-ordered" : "a stream synchronization per chunk",
            (unsigned long long)comm->devring->min_bytes);
  } else {
    GW_INFO(GW_SUB_INIT, "rank %d: no device ring (not every rank can map its neighbour's device memory); "
            "device buffers go through host staging", comm->rank);
  }
out:
  if (dr && atomic_load(&gw__dev_given_up)) dr->send_twin = dr->recv_twin = NULL; /* leaked: see gw__dev_given_up */
  /* Failed after the second round began: the predecessor may map this rank's
   * twins, and no unmap handshake ran, so they are leaked (freeing memory
   * another process maps is undefined in CUDA); this rank's mapping goes. */
  if (dr && res != GW_SUCCESS && mapping && dr->recv_twin) dr->recv_twin = NULL;
  ring_free(comm, dr);
  free(all);
  return res;
}

/* Whether ring 0's predecessor has unmapped this rank's twins (it stored 1
 * in the word of the connection it sends on, which is the one this rank
 * receives on), or is gone; waits up to GW_DEV_UNMAP_WAIT_MS. */
static bool twins_unmapped(struct gw_comm *comm) {
  struct gw_conn *in = &comm->rings[0].recv;
  _Atomic uint64_t *word = in->tp && in->tp->shared_word ? in->tp->shared_word(in) : NULL;
  if (!word) return true; /* cannot tell: as before */
  const int prev = comm->rings[0].prev;
  const double deadline = gw__now() + (double)GW_MAX(gw__param_DevUnmapWaitMs(), 0) / 1e3;
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  while (atomic_load_explicit(word, memory_order_acquire) == 0) {
    if (!gw__peer_alive(comm, prev)) return true; /* its mappings went with it */
    if (gw__now() > deadline) {
      GW_WARN(GW_SUB_INIT, "rank %d: rank %d has not unmapped this rank's device-ring buffers after %lld ms "
              "(not destroyed its communicator yet?): they stay allocated (freeing memory another process maps "
              "is undefined in CUDA)", comm->rank, prev, (long long)gw__param_DevUnmapWaitMs());
      return false;
    }
    gw__waiter_pause(&w);
  }
  return true;
}

/* Teardown (after the progress thread stopped): cudaFree of memory another
 * process has mapped by IPC is undefined, so each rank first unmaps its
 * successor's twins and says so in the word of the shm connection it sends on
 * (its successor receives on it), then frees its own twins once its
 * predecessor has said the same or is gone (twins_unmapped). Not a barrier:
 * ranks destroy in any order; one that waits past the limit (a predecessor
 * that keeps its communicator, or destroys several in another order) leaves
 * its twins allocated with a warning. */
void gw__dev_ring_free(struct gw_comm *comm) {
  struct gw_devring *dr = comm->devring;
  if (!dr) return;
  if (comm->dev_abandoned || atomic_load(&gw__dev_given_up)) {
    /* A stream waits for an operation given up at destroy, and unmapping, as
     * freeing, waits for every stream of the device (CUDA synchronizes there):
     * everything stays mapped and allocated (gw__dev_free warned), and the
     * successor, never told, keeps its twins too after its wait. */
    flags_leave(comm, dr);
    free(dr);
    comm->devring = NULL;
    return;
  }
  /* The successor frees its buffer once told it is unmapped here: not told
   * when the unmap failed (it frees after its wait's limit instead). */
  const bool unmapped = !dr->send_twin || dr->ops->ipc_close(dr->send_twin) == 0;
  if (!unmapped) GW_WARN(GW_SUB_INIT, "rank %d: unmapping the successor's device buffer failed: %s", comm->rank,
                         dr->ops->error());
  dr->send_twin = NULL;
  struct gw_conn *out = &comm->rings[0].send;
  if (unmapped && out->tp && out->tp->shared_word)
    atomic_store_explicit(out->tp->shared_word(out), 1, memory_order_release);
  if (dr->recv_twin && !twins_unmapped(comm)) dr->recv_twin = NULL;
  ring_free(comm, dr);
  comm->devring = NULL;
}

/* The twin of the slot a connection handles next: by the FIFO's position
 * (synchronized), or by the device chunks' own count (stream-ordered). */
static char *twin_of(const struct prims *p, struct gw_conn *c, bool send) {
  const struct gw_devring *dr = p->dev;
  uint64_t pos = dr->async ? (send ? dr->dseq_out : dr->dseq_in) : c->tp->position(c);
  return (send ? dr->send_twin : dr->recv_twin) + (size_t)(pos % dr->nslots) * dr->chunk;
}

static gw_result_t dev_err(struct prims *p, const char *what) {
  return gw__err(p->err, GW_ERR_CUDA, "rank %d: the device ring's %s failed: %s", p->comm->rank, what,
                 p->dev->ops->error());
}

/* Around the work of a primitive that reads this rank's twin (in) and/or
 * writes the successor's (out).
 * Synchronized (the default): after the work, the engine's stream finishes
 * it before the chunk's header goes out and the received slot is released.
 * Stream-ordered (GW_DEV_ASYNC, emitted at the call onto the caller's
 * stream): before the work the stream waits until the predecessor's stream
 * has written the chunk it reads, and until the successor's stream has read
 * the chunk one twin-ring back from the slot it writes; after it, it says
 * what it did in the same counters.  Each wait is for a write its peer's
 * stream makes after waits on earlier chunks only (the schedule's order),
 * so every rank's stream gets through once every rank has called; one that
 * does not, dies or fails is met by ring_drain's release. */
static gw_result_t dbefore(struct prims *p, bool in, bool out) {
  struct gw_devring *dr = p->dev;
  if (!dr->async) return GW_SUCCESS;
  int r = 0;
  if (in) r = dr->ops->flag_wait(dr->ready_in, dr->dseq_in + 1, p->stream);
  if (!r && out && dr->dseq_out >= dr->nslots)
    r = dr->ops->flag_wait(dr->read_out, dr->dseq_out - dr->nslots + 1, p->stream);
  return r ? dev_err(p, "stream wait on a peer") : GW_SUCCESS;
}

static gw_result_t dafter(struct prims *p, bool in, bool out) {
  struct gw_devring *dr = p->dev;
  if (!dr->async) return gw__dev_engine_wait(p->comm, p->stream, dr->chunk_flag, &dr->chunk_seq, p->err);
  int r = 0;
  if (in) r = dr->ops->flag_write(dr->read_in, ++dr->dseq_in, p->stream);
  if (!r && out) r = dr->ops->flag_write(dr->ready_out, ++dr->dseq_out, p->stream);
  return r ? dev_err(p, "stream flag write") : GW_SUCCESS;
}

/* dst0 = src and dst1 = src (n elements; a NULL destination is skipped). */
static gw_result_t dcopy(struct prims *p, void *dst0, void *dst1, const void *src, size_t n) {
  const struct gw_devring *dr = p->dev;
  if (!dst0) dst0 = dst1, dst1 = NULL;
  if (!n || !dst0) return GW_SUCCESS;
  const size_t bytes = n * p->es;
  int r;
  if (dr->copy_engine) {
    r = dr->ops->memcpy_async(dst0, src, bytes, p->stream);
    if (!r && dst1) r = dr->ops->memcpy_async(dst1, src, bytes, p->stream);
  } else {
    r = dr->ops->copy_async(dst0, dst1, src, bytes, p->stream);
  }
  return r ? dev_err(p, "copy") : GW_SUCCESS;
}

static gw_result_t dreduce(struct prims *p, void *dst0, void *dst1, const void *a, const void *b, size_t n,
                           uint32_t div) {
  const struct gw_devring *dr = p->dev;
  if (!n) return GW_SUCCESS;
  const int kop = p->op->desc.op == GW_AVG ? GW_KOP_SUM : p->op->desc.op;
  return dr->ops->reduce_async(dst0, dst1, a, b, n, p->op->desc.dtype, kop, div, p->stream)
             ? dev_err(p, "reduction")
             : GW_SUCCESS;
}

/* The host's part of a primitive runs unless this is the caller's emission;
 * the device's unless this is the progress thread's run of a stream-ordered
 * operation (its work was emitted at the call). */
static bool host_part(const struct prims *p) { return !p->emit; }
static bool dev_part(const struct prims *p) { return p->emit || !p->dev->async; }

/* Each primitive: the host's waits for the received chunk and for room to
 * send, the device's work between its before and after, then the header out
 * and the received slot released. */
static gw_result_t host_in(struct prims *p, size_t n) {
  const void *data;
  return host_part(p) ? gw__wait_recv(p, &p->ring->recv, &data, n * p->es) : GW_SUCCESS;
}

static gw_result_t host_room(struct prims *p, size_t n) {
  void *slot;
  return host_part(p) ? gw__wait_slot(p, &p->ring->send, n * p->es, &slot) : GW_SUCCESS;
}

static gw_result_t host_done(struct prims *p, bool in, bool out, size_t n) {
  if (!host_part(p)) return GW_SUCCESS;
  if (out) GW_CHECK(gw__post(p, &p->ring->send, n * p->es));
  return in ? gw__release(p, &p->ring->recv) : GW_SUCCESS;
}

gw_result_t gw__dprim_send(struct prims *p, const void *src, void *dst, size_t n) {
  GW_CHECK(host_room(p, n));
  if (dev_part(p)) {
    GW_CHECK(dbefore(p, false, true));
    GW_CHECK(dcopy(p, twin_of(p, &p->ring->send, true), dst, src, n));
    GW_CHECK(dafter(p, false, true));
  }
  return host_done(p, false, true, n);
}

gw_result_t gw__dprim_recv(struct prims *p, void *dst, size_t n) {
  GW_CHECK(host_in(p, n));
  if (dev_part(p)) {
    GW_CHECK(dbefore(p, true, false));
    GW_CHECK(dcopy(p, dst, NULL, twin_of(p, &p->ring->recv, false), n));
    GW_CHECK(dafter(p, true, false));
  }
  return host_done(p, true, false, n);
}

gw_result_t gw__dprim_recv_reduce_send(struct prims *p, const void *src, size_t n) {
  GW_CHECK(host_in(p, n));
  GW_CHECK(host_room(p, n));
  if (dev_part(p)) { /* the kernel reads this rank's twin and writes straight into the next rank's */
    GW_CHECK(dbefore(p, true, true));
    GW_CHECK(dreduce(p, twin_of(p, &p->ring->send, true), NULL, twin_of(p, &p->ring->recv, false), src, n, 0));
    GW_CHECK(dafter(p, true, true));
  }
  return host_done(p, true, true, n);
}

gw_result_t gw__dprim_recv_reduce_copy_send(struct prims *p, const void *src, void *dst, size_t n, uint32_t div) {
  GW_CHECK(host_in(p, n));
  GW_CHECK(host_room(p, n));
  if (dev_part(p)) {
    GW_CHECK(dbefore(p, true, true));
    GW_CHECK(dreduce(p, dst, twin_of(p, &p->ring->send, true), twin_of(p, &p->ring->recv, false), src, n, div));
    GW_CHECK(dafter(p, true, true));
  }
  return host_done(p, true, true, n);
}

gw_result_t gw__dprim_recv_reduce_copy(struct prims *p, const void *src, void *dst, size_t n, uint32_t div,
                                       bool local_first) {
  GW_CHECK(host_in(p, n));
  if (dev_part(p)) {
    const void *in = twin_of(p, &p->ring->recv, false);
    GW_CHECK(dbefore(p, true, false));
    GW_CHECK(local_first ? dreduce(p, dst, NULL, src, in, n, div) : dreduce(p, dst, NULL, in, src, n, div));
    GW_CHECK(dafter(p, true, false));
  }
  return host_done(p, true, false, n);
}

gw_result_t gw__dprim_recv_copy_send(struct prims *p, void *dst, size_t n) {
  GW_CHECK(host_in(p, n));
  GW_CHECK(host_room(p, n));
  if (dev_part(p)) {
    GW_CHECK(dbefore(p, true, true));
    GW_CHECK(dcopy(p, twin_of(p, &p->ring->send, true), dst, twin_of(p, &p->ring->recv, false), n));
    GW_CHECK(dafter(p, true, true));
  }
  return host_done(p, true, true, n);
}
