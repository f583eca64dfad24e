/* device.c - collectives ordered on a CUDA stream, and collectives on device
 * memory (DESIGN.md, data flow step 5).
 *
 * A call with a stream (or with device buffers) never runs on the caller's
 * thread and never blocks it.  The caller enqueues two things on its stream:
 * a write of the operation's ticket into a start flag, and a wait until the
 * done flag reaches the ticket.  The progress thread runs the operation once
 * the start flag says the stream got there (everything earlier on the stream
 * has finished), then writes the done flag, which lets the stream go on.  Both
 * flags live in pinned host memory, so no event has to be recorded before it
 * exists (the race of cudaStreamWaitEvent on an event recorded later).
 *
 * Device buffers travel through pinned host staging: the operation is cut into
 * pieces, and while the host algorithm (ring, tree, ...) reduces piece k over
 * whatever transport joins the ranks, the engine's own stream copies piece k+1
 * in and piece k-1 out.  Each piece is an operation of its own to the
 * algorithms, with its own sequence number (reserved at the call, so every
 * rank numbers them alike).
 *
 * The device ring keeps device data on the devices when every rank's ring
 * neighbours are on its machine: each slot of ring 0's shared-memory FIFOs has
 * a twin in the receiver's device memory, which the sender maps once by IPC
 * handle (cudaIpcOpenMemHandle).  A primitive moves the payload into the
 * peer's twin (a copy, or the reduction kernel writing there directly), waits
 * for the engine's stream, then posts the chunk's header on the host FIFO as
 * always, so sequence numbers, call checks, deadlines, dead peers and abort
 * notices work unchanged.  Without it (ranks on several machines, no IPC, GW_DEV_IPC=0)
 * device buffers go through the staging above. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "dev.h"
#include "prims.h"

/* Bytes of one staging buffer (two are used).  Rank 0's is every rank's
 * (agreed at init, gw__dev_ring_setup): the pieces of an operation must be
 * the same on every rank. */
GW_PARAM(DevStageBytes, "GW_DEV_STAGE_BYTES", 4 << 20)

/* The device ring's chunk (and twin slot) size, and a switch for it.  4 MiB:
 * each chunk costs a stream synchronization and a header, and on the H200
 * (2 ranks, one GPU) 4 MiB chunks moved 256 MiB 3.7x faster than 1 MiB ones
 * (11.2 against 3.0 GB/s), within 13% of them from 1 MiB down. */
GW_PARAM(DevChunkBytes, "GW_DEV_CHUNK_BYTES", 4 << 20)
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
GW_PARAM(DevRingMinBytes, "GW_DEV_RING_MIN_BYTES", 64 << 10)
/* How the device ring orders one rank's stream with its neighbours': 0
 * (default) the engine's stream is synchronized before each chunk's header
 * goes out (a host round trip per chunk); 1 (stream-ordered) nothing waits on
 * the host per chunk: each connection's shared page holds two counters that
 * the streams write and wait on (the driver's stream memory operations), the
 * sender's "payload ready" and the receiver's "twin read", and the host waits
 * for its stream once per operation.  Used only when every rank asks for it
 * and could register both pages. */
GW_PARAM(DevAsync, "GW_DEV_ASYNC", 0)
/* At destroy, how long a rank waits for its ring predecessor to unmap this
 * rank's twins before it frees them (gw__dev_ring_free). */
GW_PARAM(DevUnmapWaitMs, "GW_DEV_UNMAP_WAIT_MS", 2000)

/* The device ring of a communicator (set up at init, used by the progress thread). */
struct gw_devring {
  const struct gw_dev_ops *ops;
  gw_dev_stream_t stream; /* the engine's (devstate's), set before each operation */
  char *recv_twin;        /* own device memory: twins of the slots ring 0's prev writes */
  char *send_twin;        /* the next rank's recv_twin, mapped by IPC */
  size_t chunk;
  uint32_t nslots;
  int dtype, kop;
  bool copy_engine;       /* GW_DEV_COPY_ENGINE */
  uint64_t min_bytes;     /* GW_DEV_RING_MIN_BYTES: smaller operations are staged */
  /* Stream-ordered (GW_DEV_ASYNC): the counters of ring 0's connections
   * (transport dev_flag; positions + 1), in pages registered with the device. */
  bool async;
  uint64_t *ready_in, *read_in;   /* receiving: this stream waits on ready_in, writes read_in */
  uint64_t *ready_out, *read_out; /* sending: writes ready_out, waits on read_out */
  void *reg[2];                   /* the registered pages (NULL: none) */
  size_t reg_bytes;
  uint64_t *last_fill;            /* [nslots]: 1 + the position that last filled each of the successor's twins */
  uint64_t in_base, out_base;     /* the connections' positions when the operation started (its stream idle) */
};

/* How many chunks each way a host may enqueue ahead of its stream when
 * stream-ordered: a CUDA stream's queue is finite, and a launch into a full
 * one blocks in the driver, where a dead neighbour's missing counter write
 * would hold the thread for good; a wait here keeps every check running.
 * 16 chunks of 4 MiB: far more than the pipeline needs. */
#define GW_DEV_AHEAD 16

/* What a failed operation stores in the counters its stream waits on, so the
 * stream runs to its end instead of waiting for a peer that will never write. */
#define GW_DEV_FLAG_RELEASE (1ull << 62)

/* Start flags: one per ticket modulo this many; at most this many stream
 * operations may be outstanding (the caller waits beyond that). */
#define GW_DEV_TICKETS 1024

struct gw_devstate {
  const struct gw_dev_ops *ops;
  uint64_t *flags;      /* host_alloc: [GW_DEV_TICKETS] start flags, then the done flag */
  uint64_t next_ticket; /* the caller's side, under comm->mu */
  /* The progress thread's side, made on first use on its device: */
  gw_dev_stream_t stream;
  bool stream_made;
  char *stage[2];
  size_t stage_bytes;
  /* An operation whose stream never got to it was given up (destroy): that
   * stream may still wait, on the device, for something, and cudaFree /
   * cudaFreeHost wait for the whole device, so the buffers are left. */
  _Atomic bool abandoned;
};

static uint64_t *done_flag(struct gw_devstate *d) { return &d->flags[GW_DEV_TICKETS]; }

/* Some destroy in this process gave up an operation whose stream never got
 * to it: that stream may wait forever, and freeing or unmapping device memory
 * waits for every stream of the device (CUDA synchronizes there), so from then
 * on no communicator frees or unmaps device memory (leaked, with a warning). */
static _Atomic bool given_up_any;

static gw_result_t dev_fail(struct gw_errctx *err, const struct gw_comm *comm, const char *what) {
  const struct gw_dev_ops *dv = gw__dev();
  return gw__err(err, GW_ERR_CUDA, "rank %d: %s failed: %s", comm->rank, what, dv ? dv->error() : "no device");
}

/* The emulator's reductions are the host kernels. */
static void host_reduce(void *dst0, void *dst1, const void *a, const void *b, size_t n, int dtype, int kop,
                        uint32_t div) {
  (*gw__reduce_table())[dtype][kop](dst0, dst1, a, b, n, div);
}

/* The emulator's cast_async: the bucketer's wire conversions on the host. */
static void host_cast(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n) {
  if (dst_dtype == GW_FLOAT32) gw__cvt_to_f32((gw_dtype_t)src_dtype, dst, src, n);
  else gw__cvt_from_f32((gw_dtype_t)dst_dtype, dst, src, n);
}

/* ---- binding a rank to a device ------------------------------------------------------- */
gw_result_t gw__dev_bind(struct gw_comm *comm, struct gw_errctx *err) {
  comm->device = -1;
  const struct gw_dev_ops *dv = gw__dev();
  if (!dv) return GW_SUCCESS;
  const char *want = gw__env_str("GW_DEVICE", NULL);
  if (want && !strcmp(want, "none")) return GW_SUCCESS;
  int ndev = 0, dev = -1, in_use = 0;
  if (dv->device_count(&ndev) || ndev < 1) return dev_fail(err, comm, "counting the devices");
  if (want && *want) {
    char *end;
    long v = strtol(want, &end, 10);
    if (*end || v < 0 || v >= ndev)
      return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_DEVICE=%s is not 'none' or a device in 0..%d",
                     comm->rank, want, ndev - 1);
    dev = (int)v;
  } else {
    if (dv->device_in_use(&in_use)) return dev_fail(err, comm, "asking for the current device");
    if (in_use && dv->get_device(&dev)) return dev_fail(err, comm, "asking for the current device");
    if (!in_use) dev = comm->local_rank % ndev;
  }
  if (dv->set_device(dev)) return dev_fail(err, comm, "binding to a device");
  comm->device = dev;
  if (dv->preload && dv->preload()) return dev_fail(err, comm, "loading the device kernels");
  gw__dev_set_host_reduce(host_reduce);
  gw__dev_set_host_cast(host_cast);
  GW_INFO(GW_SUB_INIT, "rank %d: device %d of %d (%s, %s)", comm->rank, dev, ndev, dv->name,
          want && *want ? "GW_DEVICE" : in_use ? "already current" : "local rank modulo devices");
  return GW_SUCCESS;
}

uint32_t gw__dev_caps(void) {
  const char *want = gw__env_str("GW_DEVICE", NULL);
  if (!gw__dev() || (want && !strcmp(want, "none"))) return 0;
  return GW_CAP_DEVLAYER | (gw__param_DevIpc() != 0 ? GW_CAP_DEVICE : 0);
}

void gw__dev_thread_start(struct gw_comm *comm) {
  const struct gw_dev_ops *dv = gw__dev();
  if (dv && comm->device >= 0 && dv->set_device(comm->device))
    GW_WARN(GW_SUB_PROXY, "rank %d: the progress thread cannot use device %d: %s", comm->rank, comm->device,
            dv->error());
}

/* ---- argument checks --------------------------------------------------------------------- */
static gw_result_t kind_of(struct gw_comm *comm, const char *fn, const char *name, const void *p, int *is_dev,
                           struct gw_errctx *err) {
  int dev = -1;
  *is_dev = 0;
  const struct gw_dev_ops *dv = gw__dev();
  if (!dv || !p) return GW_SUCCESS;
  dv->ptr_kind(p, is_dev, &dev);
  if (!*is_dev) return GW_SUCCESS;
  if (comm->device < 0)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: %s is device memory, but this communicator is "
                   "bound to no device (GW_DEVICE=none)", comm->rank, fn, name);
  if (dev != comm->device)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: %s is memory of device %d, but this communicator "
                   "is bound to device %d", comm->rank, fn, name, dev, comm->device);
  return GW_SUCCESS;
}

gw_result_t gw__dev_check(struct gw_comm *comm, const char *fn, struct gw_op *op, void *stream, size_t send_elems,
                          size_t recv_elems, struct gw_errctx *err) {
  op->stream = stream;
  op->ordered = false;
  op->device_mem = false;
  int sdev = 0, rdev = 0;
  if (send_elems) GW_CHECK(kind_of(comm, fn, "sendbuf", op->sendbuf, &sdev, err));
  if (recv_elems) GW_CHECK(kind_of(comm, fn, "recvbuf", op->recvbuf, &rdev, err));
  if (send_elems && recv_elems && sdev != rdev)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: sendbuf is %s memory but recvbuf is %s memory; both "
                   "must be on the same side (copy one of them first)", comm->rank, fn, sdev ? "device" : "host",
                   rdev ? "device" : "host");
  op->device_mem = sdev || rdev;
  if (stream && !gw__dev())
    return gw__err(err, GW_ERR_UNSUPPORTED, "rank %d: %s: a CUDA stream was given, but %s; pass stream = NULL with "
                   "host buffers", comm->rank, fn, gw__dev_absent_reason());
  if (stream && comm->device < 0)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: a CUDA stream was given, but this communicator is "
                   "bound to no device (GW_DEVICE=none)", comm->rank, fn);
  int capturing = 0;
  if (stream && gw__dev()->stream_capturing(stream, &capturing) == 0 && capturing)
    return gw__err(err, GW_ERR_UNSUPPORTED, "rank %d: %s: the stream is being captured into a CUDA graph; gradwire "
                   "calls cannot be captured yet (make the call outside the capture)", comm->rank, fn);
  op->ordered = stream || op->device_mem;
  if (op->device_mem && comm->devring) op->desc.pad |= GW_DESC_DEVICE;
  return GW_SUCCESS;
}

/* ---- pieces -------------------------------------------------------------------------------- */
static size_t stage_bytes_own(void) { return (size_t)GW_MAX(gw__param_DevStageBytes(), 4096); }

/* The staging size: rank 0's, agreed at init (this rank's own before that,
 * or where no rank-wide agreement was needed: one rank, or not every rank
 * has a device layer, so device buffers cannot run anyway). */
static size_t stage_bytes_param(const struct gw_comm *comm) {
  size_t s = comm->dev_stage_bytes ? (size_t)comm->dev_stage_bytes : stage_bytes_own();
  return GW_MAX(s, (size_t)comm->nranks * 16); /* room for one element of each rank */
}

/* Elements per piece along the call's count (per rank for allgather and
 * reduce-scatter, whose staging holds every rank's part). */
static size_t piece_elems(const struct gw_comm *comm, const struct gw_op *op) {
  size_t es = gw_dtype_size((gw_dtype_t)op->desc.dtype);
  bool per_rank = op->desc.coll == GW_COLL_ALLGATHER || op->desc.coll == GW_COLL_REDUCE_SCATTER;
  size_t mult = per_rank ? (size_t)comm->nranks : 1;
  return GW_MAX(stage_bytes_param(comm) / (es * mult), (size_t)1);
}

/* Whether op (device buffers) runs on the device ring: there is one, and op
 * moves at least GW_DEV_RING_MIN_BYTES (per rank's block for allgather and
 * reduce-scatter, times the ranks); the same answer on every rank. */
static bool on_ring(const struct gw_comm *comm, const struct gw_op *op) {
  if (!op->device_mem || !comm->devring) return false;
  bool per_rank = op->desc.coll == GW_COLL_ALLGATHER || op->desc.coll == GW_COLL_REDUCE_SCATTER;
  uint64_t bytes = op->desc.count * gw_dtype_size((gw_dtype_t)op->desc.dtype) * (per_rank ? (uint64_t)comm->nranks : 1);
  return bytes >= comm->devring->min_bytes;
}

uint64_t gw__dev_npieces(const struct gw_comm *comm, const struct gw_op *op) {
  if (on_ring(comm, op)) return comm->devring->async ? 2 : 1; /* 2: ring_confirm's barrier */
  if (!op->device_mem || op->desc.count == 0) return 1;
  size_t pc = piece_elems(comm, op);
  return (op->desc.count + pc - 1) / pc;
}

/* ---- the caller's side ---------------------------------------------------------------------- */
/* Before comm->mu is taken: a start flag is reused GW_DEV_TICKETS tickets
 * later, so the next ticket waits for the one that used its flag to be done.
 * (One thread drives a communicator at a time, so next_ticket is stable.) */
void gw__dev_throttle(struct gw_comm *comm) {
  struct gw_devstate *d = comm->dev;
  if (!d || d->next_ticket + 1 <= GW_DEV_TICKETS) return;
  uint64_t need = d->next_ticket + 1 - GW_DEV_TICKETS;
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  while (atomic_load_explicit((_Atomic uint64_t *)done_flag(d), memory_order_acquire) < need) gw__waiter_pause(&w);
}

/* Under comm->mu.  Makes the flags on first use, takes a ticket and enqueues
 * the flag write and wait on the caller's stream. */
static gw_result_t engine_stream(struct gw_comm *comm, struct gw_devstate *d, struct gw_errctx *err);
static gw_result_t stage_ready(struct gw_comm *comm, struct gw_devstate *d, struct gw_errctx *err);

/* The flags, the engine's stream and (without a device ring) the staging
 * buffers, made on the caller's side before the first operation's flag wait
 * is queued: allocating pinned memory or a stream while one of our waits
 * spins may wait for the device, and the wait would wait for us. */
static gw_result_t devstate_make(struct gw_comm *comm, struct gw_errctx *err) {
  const struct gw_dev_ops *dv = gw__dev();
  struct gw_devstate *d = calloc(1, sizeof *d);
  if (!d) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", comm->rank);
  d->ops = dv;
  void *flags = NULL;
  if (dv->host_alloc(&flags, (GW_DEV_TICKETS + 1) * sizeof(uint64_t))) {
    free(d);
    return dev_fail(err, comm, "allocating pinned host memory for the stream flags");
  }
  d->flags = flags;
  comm->dev = d; /* from here gw__dev_free takes it back */
  if (comm->device < 0) return GW_SUCCESS;
  /* Staging serves operations below the ring's threshold too. */
  return comm->devring && !comm->devring->min_bytes ? engine_stream(comm, d, err) : stage_ready(comm, d, err);
}

/* The calling thread on the communicator's device for the calls in between
 * (a thread other than gw_comm_init's may be on another one); *prev = -1
 * when nothing changed. */
static gw_result_t device_enter(struct gw_comm *comm, int *prev, struct gw_errctx *err) {
  const struct gw_dev_ops *dv = gw__dev();
  int cur = -1;
  *prev = -1;
  if (comm->device < 0) return GW_SUCCESS;
  if (dv->get_device(&cur)) return dev_fail(err, comm, "asking for the calling thread's device");
  if (cur == comm->device) return GW_SUCCESS;
  if (dv->set_device(comm->device)) return dev_fail(err, comm, "switching the calling thread to the device");
  *prev = cur;
  return GW_SUCCESS;
}

static void device_leave(int prev) {
  if (prev >= 0) gw__dev()->set_device(prev);
}

gw_result_t gw__dev_enqueue_locked(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err) {
  const struct gw_dev_ops *dv = gw__dev();
  int prev;
  GW_CHECK(device_enter(comm, &prev, err));
  gw_result_t res = comm->dev ? GW_SUCCESS : devstate_make(comm, err);
  struct gw_devstate *d = comm->dev;
  if (res == GW_SUCCESS) {
    uint64_t t = ++d->next_ticket;
    gw_dev_stream_t s = op->stream;
    if (dv->flag_write(&d->flags[t % GW_DEV_TICKETS], t, s) || dv->flag_wait(done_flag(d), t, s)) {
      d->next_ticket--;
      res = dev_fail(err, comm, "enqueueing on the caller's stream");
    } else {
      op->ticket = t;
    }
  }
  device_leave(prev);
  return res;
}

/* ---- the progress thread's side ------------------------------------------------------------ */
static gw_result_t wait_start(struct gw_comm *comm, struct gw_devstate *d, const struct gw_op *op,
                              struct gw_errctx *err) {
  _Atomic uint64_t *flag = (_Atomic uint64_t *)&d->flags[op->ticket % GW_DEV_TICKETS];
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  double give_up = 0, next_query = gw__now() + 0.1;
  while (atomic_load_explicit(flag, memory_order_acquire) < op->ticket) {
    /* A fault on the caller's stream (an illegal address before our flag)
     * leaves the flag unwritten, and is sticky: every call on the device
     * reports it from then on, so our own stream is asked every 100 ms (not
     * the caller's, which the caller may destroy once its work is queued). */
    if (d->stream_made && gw__now() > next_query) {
      int idle = 0;
      if (d->ops->stream_idle(d->stream, &idle))
        return dev_fail(err, comm, "the device, while the caller's stream went to the operation,");
      next_query = gw__now() + 0.1;
    }
    if (atomic_load(&comm->aborted))
      return gw__err(err, GW_ERR_ABORTED, "rank %d: aborted while waiting for the stream to reach operation #%llu",
                     comm->rank, (unsigned long long)op->desc.seq);
    /* No deadline while the stream has work ahead (a forward pass may take long),
     * but a communicator being destroyed waits GW_TIMEOUT at most. */
    bool stopping = atomic_load(&comm->stopping);
    if (stopping && give_up == 0) give_up = gw__now() + (comm->timeout_s > 0 ? comm->timeout_s : 1.0);
    if (give_up && gw__now() > give_up) {
      atomic_store(&d->abandoned, true);
      atomic_store(&given_up_any, true);
      return gw__err(err, GW_ERR_TIMEOUT, "rank %d: gw_comm_destroy: the stream of operation #%llu never got to it "
                     "(synchronize the streams before destroying the communicator)", comm->rank,
                     (unsigned long long)op->desc.seq);
    }
    gw__waiter_pause(&w);
  }
  return GW_SUCCESS;
}

static gw_result_t engine_stream(struct gw_comm *comm, struct gw_devstate *d, struct gw_errctx *err) {
  if (!d->stream_made) {
    if (d->ops->stream_create(&d->stream)) return dev_fail(err, comm, "creating the engine's stream");
    d->stream_made = true;
  }
  return GW_SUCCESS;
}

static gw_result_t stage_ready(struct gw_comm *comm, struct gw_devstate *d, struct gw_errctx *err) {
  GW_CHECK(engine_stream(comm, d, err));
  if (!d->stage[0]) {
    size_t bytes = stage_bytes_param(comm);
    for (int i = 0; i < 2; i++) {
      void *p = NULL;
      if (d->ops->host_alloc(&p, bytes)) return dev_fail(err, comm, "allocating pinned staging memory");
      d->stage[i] = p;
    }
    d->stage_bytes = bytes;
  }
  return GW_SUCCESS;
}

/* The piece k of op as the host algorithms see it, in staging buffer buf,
 * and the copies that bring it in (in = true) or take it out. */
struct piece {
  size_t off, n; /* elements along the call's count */
  struct gw_op sub;
};

static void piece_of(const struct gw_comm *comm, const struct gw_op *op, uint64_t k, char *buf, struct piece *p) {
  size_t pc = piece_elems(comm, op), es = gw_dtype_size((gw_dtype_t)op->desc.dtype);
  p->off = (size_t)k * pc;
  p->n = GW_MIN(pc, op->desc.count - p->off);
  p->sub = *op;
  p->sub.desc.count = p->n;
  p->sub.desc.seq = op->desc.seq + k;
  p->sub.ordered = false;
  p->sub.device_mem = false;
  p->sub.sendbuf = p->sub.recvbuf = buf;
  if (op->desc.coll == GW_COLL_ALLGATHER) p->sub.sendbuf = buf + (size_t)comm->rank * p->n * es;
  if (op->desc.coll == GW_COLL_REDUCE_SCATTER) p->sub.recvbuf = buf + (size_t)comm->rank * p->n * es;
}

static int piece_copies(const struct gw_comm *comm, const struct gw_dev_ops *dv, gw_dev_stream_t s,
                        const struct gw_op *op, const struct piece *p, char *buf, bool in) {
  size_t es = gw_dtype_size((gw_dtype_t)op->desc.dtype), bytes = p->n * es, total = op->desc.count;
  const char *send = op->sendbuf;
  char *recv = op->recvbuf;
  int r = 0;
  switch (op->desc.coll) {
  case GW_COLL_ALLREDUCE:
  case GW_COLL_BROADCAST:
    if (in && (op->desc.coll == GW_COLL_ALLREDUCE || comm->rank == op->desc.root))
      r = dv->memcpy_async(buf, send + p->off * es, bytes, s);
    if (!in) r = dv->memcpy_async(recv + p->off * es, buf, bytes, s);
    break;
  case GW_COLL_ALLGATHER:
    if (in) r = dv->memcpy_async(buf + (size_t)comm->rank * bytes, send + p->off * es, bytes, s);
    for (int q = 0; !in && !r && q < comm->nranks; q++)
      r = dv->memcpy_async(recv + ((size_t)q * total + p->off) * es, buf + (size_t)q * bytes, bytes, s);
    break;
  case GW_COLL_REDUCE_SCATTER:
    for (int q = 0; in && !r && q < comm->nranks; q++)
      r = dv->memcpy_async(buf + (size_t)q * bytes, send + ((size_t)q * total + p->off) * es, bytes, s);
    if (!in) r = dv->memcpy_async(recv + p->off * es, buf + (size_t)comm->rank * bytes, bytes, s);
    break;
  default:
    break;
  }
  return r;
}

static gw_result_t run_staged(struct gw_comm *comm, struct gw_devstate *d, const struct gw_op *op,
                              struct gw_errctx *err) {
  GW_CHECK(stage_ready(comm, d, err));
  const struct gw_dev_ops *dv = d->ops;
  uint64_t np = gw__dev_npieces(comm, op);
  struct piece cur, next;
  piece_of(comm, op, 0, d->stage[0], &cur);
  next = cur;
  if (piece_copies(comm, dv, d->stream, op, &cur, d->stage[0], true)) return dev_fail(err, comm, "copying in");
  for (uint64_t k = 0; k < np; k++) {
    char *buf = d->stage[k % 2], *nbuf = d->stage[(k + 1) % 2];
    /* Piece k is in (and piece k-1 out of the other buffer); start k+1's copy
     * in behind k-1's copy out, then reduce k while they run. */
    if (dv->stream_sync(d->stream)) return dev_fail(err, comm, "waiting for the staging copies");
    if (k + 1 < np) {
      piece_of(comm, op, k + 1, nbuf, &next);
      if (piece_copies(comm, dv, d->stream, op, &next, nbuf, true)) return dev_fail(err, comm, "copying in");
    }
    gw_result_t res = gw__run_op(comm, &cur.sub, err);
    if (res != GW_SUCCESS) {
      dv->stream_sync(d->stream);
      return res;
    }
    if (piece_copies(comm, dv, d->stream, op, &cur, buf, false)) return dev_fail(err, comm, "copying out");
    cur = next;
  }
  if (dv->stream_sync(d->stream)) return dev_fail(err, comm, "waiting for the staging copies");
  return GW_SUCCESS;
}

/* The checks of a host wait on the stream-ordered ring: an abort, a dead
 * neighbour (looked at every 100 ms), GW_TIMEOUT counted from start. */
static gw_result_t ring_watch(struct gw_comm *comm, const struct gw_op *op, double start, double *next_look,
                              struct gw_errctx *err) {
  const int prev = comm->rings[0].prev, next = comm->rings[0].next;
  const double now = gw__now();
  char what[160];
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
    struct gw_conn *in = &comm->rings[0].recv;
    const struct gw_chunk_hdr *h;
    const void *data;
    if (in->tp->recv_peek(in, &h, &data) == GW_SUCCESS && h->op.coll == GW_COLL_ABORT) {
      char msg[GW_ERRMSG_MAX];
      size_t len = GW_MIN((size_t)h->bytes, sizeof msg - 1);
      memcpy(msg, data, len);
      msg[len] = 0;
      return gw__err(err, GW_ERR_REMOTE, "rank %d: " GW_FORWARDED "%s", comm->rank, gw__root_cause(msg));
    }
    const int dead = !gw__peer_alive(comm, prev) ? prev : !gw__peer_alive(comm, next) ? next : -1;
    if (dead >= 0) {
      gw__describe_op(&op->desc, what, sizeof what);
      return gw__err(err, GW_ERR_REMOTE, "rank %d: rank %d (pid %d on this machine) died during operation %s, "
                     "while this rank's stream waited for its stream on the device ring", comm->rank, dead,
                     (int)comm->peers[dead].pid, what);
    }
  }
  if (comm->timeout_s > 0 && now - start > comm->timeout_s) {
    gw__describe_op(&op->desc, what, sizeof what);
    return gw__err(err, GW_ERR_TIMEOUT, "rank %d: operation %s: this rank's stream still waits after %.0f s "
                   "(GW_TIMEOUT) for rank %d's or rank %d's stream on the device ring", comm->rank, what,
                   comm->timeout_s, prev, next);
  }
  return GW_SUCCESS;
}

/* The end of a stream-ordered device-ring operation: the host waits for the
 * engine's stream, which may still wait on its neighbours' streams.  Those
 * waits end when the neighbours' streams get there, unless a neighbour died,
 * the operation failed on the host (its peers may never send the rest), the
 * communicator was aborted, or GW_TIMEOUT passes: then the counters this
 * stream waits on are set past anything it waits for (again and again, as a
 * live neighbour's stream may still store a lower count), so the stream runs
 * out its queued work, on garbage, and the operation fails. */
static gw_result_t ring_drain(struct gw_comm *comm, struct gw_devstate *d, const struct gw_op *op, gw_result_t res,
                              struct gw_errctx *err) {
  const struct gw_devring *dr = comm->devring;
  const double start = gw__now();
  double next_look = start + 0.1;
  bool release = res != GW_SUCCESS;
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  for (;;) {
    int idle = 0;
    if (d->ops->stream_idle(d->stream, &idle)) {
      return res != GW_SUCCESS ? res : dev_fail(err, comm, "the device ring's stream");
    }
    if (idle) return res;
    if (!release) {
      res = ring_watch(comm, op, start, &next_look, err);
      release = res != GW_SUCCESS;
    }
    if (release) {
      atomic_store_explicit((_Atomic uint64_t *)dr->ready_in, GW_DEV_FLAG_RELEASE, memory_order_release);
      atomic_store_explicit((_Atomic uint64_t *)dr->read_out, GW_DEV_FLAG_RELEASE, memory_order_release);
    }
    gw__waiter_pause(&w);
  }
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

gw_result_t gw__dev_run(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err) {
  struct gw_devstate *d = comm->dev;
  gw_result_t res = wait_start(comm, d, op, err);
  if (res == GW_SUCCESS) {
    if (!op->device_mem || on_ring(comm, op)) {
      struct gw_op run = *op;
      run.ordered = false;
      if (op->device_mem && (res = engine_stream(comm, d, err)) == GW_SUCCESS) {
        struct gw_devring *dr = comm->devring;
        struct gw_ring *r0 = &comm->rings[0];
        dr->stream = d->stream;
        dr->dtype = op->desc.dtype;
        dr->kop = op->desc.op == GW_AVG ? GW_KOP_SUM : op->desc.op;
        dr->in_base = r0->recv.tp->position(&r0->recv);
        dr->out_base = r0->send.tp->position(&r0->send);
      }
      if (res == GW_SUCCESS) res = gw__run_op(comm, &run, err); /* the device ring when device_mem */
      /* Nothing of it may still run on the device when the caller's stream
       * goes on; stream-ordered, every rank's stream must have finished with
       * data from live streams before any rank calls the result good. */
      if (op->device_mem && d->stream_made && comm->devring->async) {
        res = ring_drain(comm, d, op, res, err);
        if (res == GW_SUCCESS) res = ring_confirm(comm, op, err);
      } else if (op->device_mem && d->stream_made && d->ops->stream_sync(d->stream) && res == GW_SUCCESS)
        res = dev_fail(err, comm, "waiting for the device ring's stream");
    } else {
      res = run_staged(comm, d, op, err);
    }
    if (res != GW_SUCCESS) gw__comm_fail(comm, &op->desc, res, err);
  } else {
    gw__comm_fail(comm, &op->desc, res, err);
  }
  /* Always let the stream go on: on failure its output is undefined and the
   * error is the communicator's (gw_comm_get_async_error, gw_wait). */
  atomic_store_explicit((_Atomic uint64_t *)done_flag(d), op->ticket, memory_order_release);
  return res;
}

/* After the progress thread stopped. */
void gw__dev_free(struct gw_comm *comm) {
  struct gw_devstate *d = comm->dev;
  if (!d) return;
  if (d->stream_made) {
    d->ops->stream_sync(d->stream);
    d->ops->stream_destroy(d->stream);
  }
  comm->dev_abandoned = atomic_load(&d->abandoned) || atomic_load(&given_up_any);
  if (comm->dev_abandoned)
    GW_WARN(GW_SUB_INIT, "rank %d: a stream still waits for an operation given up at destroy: its staging and "
            "device-ring buffers are left allocated (freeing them would wait for that stream)", comm->rank);
  for (int i = 0; i < 2 && !comm->dev_abandoned; i++)
    if (d->stage[i]) d->ops->host_free(d->stage[i]);
  /* The flags stay: a caller's stream may not have run its last wait on the
   * done flag yet, and freeing the page under it would fault (one page per
   * communicator that used streams). */
  free(d);
  comm->dev = NULL;
}

/* ---- the device ring ----------------------------------------------------------------------- */
size_t gw__dev_ring_chunk(const struct gw_comm *comm, const struct gw_op *op) {
  return on_ring(comm, op) ? comm->devring->chunk : 0;
}

bool gw__dev_ring_async(const struct gw_comm *comm) { return comm->devring && comm->devring->async; }

/* Whether this rank can take part: a device that maps its peers' memory, and
 * ring 0's neighbours reached over shared memory (same machine). */
static bool ring_candidate(const struct gw_comm *comm) {
  const struct gw_ring *r = &comm->rings[0];
  return comm->device >= 0 && gw__dev() && gw__param_DevIpc() != 0 && r->send.tp && r->recv.tp &&
         r->send.tp->position && r->recv.tp->position;
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
  if (atomic_load(&given_up_any)) { /* registering and unregistering may wait for the device too */
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
  dr->last_fill = calloc(dr->nslots, sizeof *dr->last_fill);
  if (!dr->last_fill) flags_unregister(dr);
  return dr->last_fill != NULL;
}

/* Unregistering may wait for a stream that never ends (see given_up_any):
 * the pages stay registered, so their mappings must stay too (a later mapping
 * at the address would meet the old registration). */
static void flags_leave(struct gw_comm *comm, const struct gw_devring *dr) {
  if (dr->reg[0] || dr->reg[1]) comm->rings[0].send.keep_mapped = comm->rings[0].recv.keep_mapped = true;
}

static void ring_free(struct gw_comm *comm, struct gw_devring *dr) {
  if (!dr) return;
  if (atomic_load(&given_up_any)) flags_leave(comm, dr);
  else flags_unregister(dr);
  free(dr->last_fill);
  if (dr->send_twin) dr->ops->ipc_close(dr->send_twin);
  if (dr->recv_twin) dr->ops->free(dr->recv_twin);
  free(dr);
}

struct ring_offer {
  int32_t ok;
  int32_t async; /* 1: asks for GW_DEV_ASYNC and registered its flags; -1: asks, could not */
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
  if (res != GW_SUCCESS) goto out;
  dr->ops = dv;
  dr->nslots = comm->conn_params.nslots;
  dr->chunk = (size_t)GW_ALIGN_UP(GW_MAX(gw__param_DevChunkBytes(), 4096), 256);
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
  mine.stage_bytes = stage_bytes_own();
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
  if (agree) {
    /* Second round: every rank maps its ring successor's twins. */
    void *peer = NULL;
    int32_t opened = dv->ipc_open(&all[comm->rings[0].next].ipc, &peer) == 0, *oks = calloc((size_t)comm->nranks, 4);
    if (!opened) GW_WARN(GW_SUB_INIT, "rank %d: cannot map rank %d's device memory: %s", comm->rank,
                         comm->rings[0].next, dv->error());
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
      if (dr->send_twin && !atomic_load(&given_up_any)) dv->ipc_close(dr->send_twin);
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
  if (dr && atomic_load(&given_up_any)) dr->send_twin = dr->recv_twin = NULL; /* leaked: see given_up_any */
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
  if (comm->dev_abandoned || atomic_load(&given_up_any)) {
    /* A stream waits for an operation given up at destroy, and unmapping, as
     * freeing, waits for every stream of the device (CUDA synchronizes there):
     * everything stays mapped and allocated (gw__dev_free warned), and the
     * successor, never told, keeps its twins too after its wait. */
    flags_leave(comm, dr);
    free(dr->last_fill);
    free(dr);
    comm->devring = NULL;
    return;
  }
  if (dr->send_twin) dr->ops->ipc_close(dr->send_twin);
  dr->send_twin = NULL;
  struct gw_conn *out = &comm->rings[0].send;
  if (out->tp && out->tp->shared_word) atomic_store_explicit(out->tp->shared_word(out), 1, memory_order_release);
  if (dr->recv_twin && !twins_unmapped(comm)) dr->recv_twin = NULL;
  ring_free(comm, dr);
  comm->devring = NULL;
}

/* The twin of the slot a connection handles next. */
static char *twin_of(const struct prims *p, struct gw_conn *c, bool send) {
  const struct gw_devring *dr = p->dev;
  uint64_t pos = c->tp->position(c);
  return (send ? dr->send_twin : dr->recv_twin) + (size_t)(pos % dr->nslots) * dr->chunk;
}

static gw_result_t dev_err(struct prims *p, const char *what) {
  return gw__err(p->err, GW_ERR_CUDA, "rank %d: the device ring's %s failed: %s", p->comm->rank, what,
                 p->dev->ops->error());
}

/* Stream-ordered: waits until this rank's stream is less than GW_DEV_AHEAD
 * chunks behind its host on each side the next primitive touches (the
 * counters its own stream writes; positions before the operation count as
 * done, its stream was idle then). */
static gw_result_t ahead_wait(struct prims *p, bool in, bool out) {
  const struct gw_devring *dr = p->dev;
  const uint64_t rpos = in ? p->ring->recv.tp->position(&p->ring->recv) : 0;
  const uint64_t spos = out ? p->ring->send.tp->position(&p->ring->send) : 0;
  double start = 0, next_look = 0;
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  for (;;) {
    uint64_t rdone = atomic_load_explicit((_Atomic uint64_t *)dr->read_in, memory_order_acquire);
    uint64_t sdone = atomic_load_explicit((_Atomic uint64_t *)dr->ready_out, memory_order_acquire);
    if ((!in || rpos < GW_MAX(rdone, dr->in_base) + GW_DEV_AHEAD) &&
        (!out || spos < GW_MAX(sdone, dr->out_base) + GW_DEV_AHEAD))
      return GW_SUCCESS;
    if (start == 0) start = gw__now(), next_look = start + 0.1;
    const double looked = next_look;
    GW_CHECK(ring_watch(p->comm, p->op, start, &next_look, p->err));
    int idle = 0; /* a device fault stops the stream for good: asked as often as ring_watch looks */
    if (next_look != looked && dr->ops->stream_idle(dr->stream, &idle)) return dev_err(p, "stream");
    gw__waiter_pause(&w);
  }
}

/* Around the work of a primitive that reads this rank's twin (in) and/or
 * writes the successor's (out).
 * Synchronized (the default): after the work, the engine's stream finishes
 * it before the chunk's header goes out and the received slot is released.
 * Stream-ordered (GW_DEV_ASYNC): before the work the stream waits until the
 * predecessor's stream has written the payload of the chunk it reads (the
 * header came first, the data may still be on its way), and until the
 * successor's stream has read what was last written into the twin it writes
 * (host chunks between them leave that slot's last device use behind, hence
 * last_fill rather than the position one FIFO depth back); after it, it says
 * what it did in the same counters, and the host goes on at once.  Every wait
 * is enqueued after the host saw the chunk, or the release, whose counter
 * write its peer had enqueued before: no cycle, so no deadlock. */
static gw_result_t dbefore(struct prims *p, bool in, bool out) {
  const struct gw_devring *dr = p->dev;
  if (!dr->async) return GW_SUCCESS;
  GW_CHECK(ahead_wait(p, in, out));
  int r = 0;
  if (in) r = dr->ops->flag_wait(dr->ready_in, p->ring->recv.tp->position(&p->ring->recv) + 1, dr->stream);
  if (!r && out) {
    uint64_t pos = p->ring->send.tp->position(&p->ring->send), *last = &dr->last_fill[pos % dr->nslots];
    if (*last) r = dr->ops->flag_wait(dr->read_out, *last, dr->stream);
    *last = pos + 1;
  }
  return r ? dev_err(p, "stream wait on a peer") : GW_SUCCESS;
}

static gw_result_t dafter(struct prims *p, bool in, bool out) {
  const struct gw_devring *dr = p->dev;
  if (!dr->async) return p->dev->ops->stream_sync(p->dev->stream) ? dev_err(p, "stream") : GW_SUCCESS;
  int r = 0;
  if (in) r = dr->ops->flag_write(dr->read_in, p->ring->recv.tp->position(&p->ring->recv) + 1, dr->stream);
  if (!r && out) r = dr->ops->flag_write(dr->ready_out, p->ring->send.tp->position(&p->ring->send) + 1, dr->stream);
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
    r = dr->ops->memcpy_async(dst0, src, bytes, dr->stream);
    if (!r && dst1) r = dr->ops->memcpy_async(dst1, src, bytes, dr->stream);
  } else {
    r = dr->ops->copy_async(dst0, dst1, src, bytes, dr->stream);
  }
  return r ? dev_err(p, "copy") : GW_SUCCESS;
}

static gw_result_t dreduce(struct prims *p, void *dst0, void *dst1, const void *a, const void *b, size_t n,
                           uint32_t div) {
  const struct gw_devring *dr = p->dev;
  if (!n) return GW_SUCCESS;
  return dr->ops->reduce_async(dst0, dst1, a, b, n, dr->dtype, dr->kop, div, dr->stream) ? dev_err(p, "reduction")
                                                                                         : GW_SUCCESS;
}

gw_result_t gw__dprim_send(struct prims *p, const void *src, void *dst, size_t n) {
  void *slot;
  GW_CHECK(gw__wait_slot(p, &p->ring->send, n * p->es, &slot));
  GW_CHECK(dbefore(p, false, true));
  GW_CHECK(dcopy(p, twin_of(p, &p->ring->send, true), dst, src, n));
  GW_CHECK(dafter(p, false, true));
  return gw__post(p, &p->ring->send, n * p->es);
}

gw_result_t gw__dprim_recv(struct prims *p, void *dst, size_t n) {
  const void *data;
  GW_CHECK(gw__wait_recv(p, &p->ring->recv, &data, n * p->es));
  GW_CHECK(dbefore(p, true, false));
  GW_CHECK(dcopy(p, dst, NULL, twin_of(p, &p->ring->recv, false), n));
  GW_CHECK(dafter(p, true, false));
  return gw__release(p, &p->ring->recv);
}

gw_result_t gw__dprim_recv_reduce_send(struct prims *p, const void *src, size_t n) {
  const void *data;
  void *slot;
  GW_CHECK(gw__wait_recv(p, &p->ring->recv, &data, n * p->es));
  GW_CHECK(gw__wait_slot(p, &p->ring->send, n * p->es, &slot));
  /* The kernel reads this rank's twin and writes straight into the next rank's. */
  GW_CHECK(dbefore(p, true, true));
  GW_CHECK(dreduce(p, twin_of(p, &p->ring->send, true), NULL, twin_of(p, &p->ring->recv, false), src, n, 0));
  GW_CHECK(dafter(p, true, true));
  GW_CHECK(gw__post(p, &p->ring->send, n * p->es));
  return gw__release(p, &p->ring->recv);
}

gw_result_t gw__dprim_recv_reduce_copy_send(struct prims *p, const void *src, void *dst, size_t n, uint32_t div) {
  const void *data;
  void *slot;
  GW_CHECK(gw__wait_recv(p, &p->ring->recv, &data, n * p->es));
  GW_CHECK(gw__wait_slot(p, &p->ring->send, n * p->es, &slot));
  GW_CHECK(dbefore(p, true, true));
  GW_CHECK(dreduce(p, dst, twin_of(p, &p->ring->send, true), twin_of(p, &p->ring->recv, false), src, n, div));
  GW_CHECK(dafter(p, true, true));
  GW_CHECK(gw__post(p, &p->ring->send, n * p->es));
  return gw__release(p, &p->ring->recv);
}

gw_result_t gw__dprim_recv_reduce_copy(struct prims *p, const void *src, void *dst, size_t n, uint32_t div,
                                       bool local_first) {
  const void *data;
  GW_CHECK(gw__wait_recv(p, &p->ring->recv, &data, n * p->es));
  const void *in = twin_of(p, &p->ring->recv, false);
  GW_CHECK(dbefore(p, true, false));
  GW_CHECK(local_first ? dreduce(p, dst, NULL, src, in, n, div) : dreduce(p, dst, NULL, in, src, n, div));
  GW_CHECK(dafter(p, true, false));
  return gw__release(p, &p->ring->recv);
}

gw_result_t gw__dprim_recv_copy_send(struct prims *p, void *dst, size_t n) {
  const void *data;
  void *slot;
  GW_CHECK(gw__wait_recv(p, &p->ring->recv, &data, n * p->es));
  GW_CHECK(gw__wait_slot(p, &p->ring->send, n * p->es, &slot));
  const void *in = twin_of(p, &p->ring->recv, false);
  GW_CHECK(dbefore(p, true, true));
  GW_CHECK(dcopy(p, twin_of(p, &p->ring->send, true), dst, in, n));
  GW_CHECK(dafter(p, true, true));
  GW_CHECK(gw__post(p, &p->ring->send, n * p->es));
  return gw__release(p, &p->ring->recv);
}
