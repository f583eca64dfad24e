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
 * whatever transport joins the ranks, the caller's stream copies piece k+1 in
 * and piece k-1 out.  Every copy is put on the caller's stream at the call,
 * between flag writes and waits per piece, so the progress thread enqueues no
 * device work for a staged operation: a stream waiting for the host never
 * holds up device work the host enqueues later (with streams sharing one
 * hardware queue, CUDA_DEVICE_MAX_CONNECTIONS=1, that would never run).  Each
 * piece is an operation of its own to the algorithms, with its own sequence
 * number (reserved at the call, so every rank numbers them alike).
 *
 * Ranks whose ring neighbours are all on their machine keep device data on
 * the devices instead: the device ring (devring.c).  Synchronized (the
 * default), the progress thread enqueues its chunks on an engine stream as
 * they go, one that runs beside the caller's stream (pick_engine; with one
 * hardware queue there is none, so no device ring); stream-ordered
 * (GW_DEV_ASYNC), the caller's thread puts the whole operation on its stream
 * at the call.  Without it (ranks on several machines, no IPC, GW_DEV_IPC=0,
 * one queue) device buffers go through the staging above. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "dev.h"
#include "devring.h"
#include "prims.h"

/* Bytes of one staging buffer (two are used).  Rank 0's is every rank's
 * (agreed at init, gw__dev_ring_setup): the pieces of an operation must be
 * the same on every rank. */
GW_PARAM_MIN(DevStageBytes, "GW_DEV_STAGE_BYTES", 4 << 20, 0) /* (4096..GW_DEV_STAGE_MAX: gw__dev_stage_bytes_own) */
/* How many hardware work queues this rank's streams share: 0 (default) asks
 * the device layer (CUDA: CUDA_DEVICE_MAX_CONNECTIONS, 8 unless set).  A
 * stream gets a queue when it is made, round robin, and work of two streams
 * in one queue runs in the order it was enqueued.  With one queue there is no
 * synchronized device ring (the caller's stream waits for the progress thread,
 * whose ring work on the engine's stream would queue behind that wait and
 * never run), unless every rank runs the stream-ordered ring (GW_DEV_ASYNC=1:
 * all of an operation's work on the caller's stream), which is kept;
 * with more, the device ring takes an engine stream that is seen to run
 * while the caller's waits (pick_engine).  Another value overrides what the
 * layer says (the GPU check sets 8 with CUDA_DEVICE_MAX_CONNECTIONS=1 to
 * show the hazard: the probe then finds no engine stream that runs, and the
 * operation fails instead of hanging). */
GW_PARAM_MIN(DevQueues, "GW_DEV_QUEUES", 0, 0)

long gw__dev_queues(void) {
  const struct gw_dev_ops *dv = gw__dev();
  if (gw__param_DevQueues() > 0) return gw__param_DevQueues();
  return dv && dv->queues ? dv->queues() : 0;
}

bool gw__dev_queues_set(void) { return gw__param_DevQueues() > 0; }



/* Start flags: one per ticket modulo this many; at most this many stream
 * operations may be outstanding (the caller waits beyond that). */
#define GW_DEV_TICKETS 1024

/* Engine streams at most: one more than the hardware queues (up to 32), so
 * that at least one is in a queue other than any given caller's stream. */
#define GW_DEV_POOL_MAX 33

/* Flag values: piece k (from 1) of ticket t is t << 24 | k, the whole
 * operation t << 24 | GW_DEV_ALL (done; a failure skips to it). */
#define GW_DEV_PIECE_BITS 24
#define GW_DEV_ALL ((UINT64_C(1) << GW_DEV_PIECE_BITS) - 1)
static uint64_t fval(uint64_t t, uint64_t k) { return t << GW_DEV_PIECE_BITS | k; }

struct gw_devstate {
  const struct gw_dev_ops *ops;
  uint64_t *flags;      /* host_alloc: [GW_DEV_TICKETS] start flags, the done flag, the staging's free flag */
  uint64_t next_ticket; /* the caller's side, under comm->mu */
  uint64_t last_staged; /* the caller's side: the last staged operation's ticket */
  uint64_t last_ring;   /* and the last stream-ordered device-ring operation's */
  _Atomic double next_fault_query; /* gw__dev_settle_look's (rate only: any thread waiting) */
  /* The ticket whose work the caller could not all put on its stream (0:
   * none).  Its stream may still run what went in, at any time, so nothing
   * more is put on streams for this communicator (broken). */
  _Atomic uint64_t enqueue_failed;
  char enqueue_why[GW_ERRMSG_MAX]; /* why, written before enqueue_failed (its release) */
  _Atomic bool broken;
  /* The last ticket whose waits the caller has put on its stream: its start
   * flag can be written (the stream runs it) before the done-wait after it is
   * enqueued, and an engine stream probed in between answers even where it
   * shares the caller's hardware queue, then queues behind that wait. */
  _Atomic uint64_t waits_queued;
  /* The progress thread's side, made on first use on its device: the engine
   * streams (the device ring's work; pool[0] only where the streams do not
   * share hardware queues), the one in use, and the caller's stream it was
   * last seen to run beside. */
  gw_dev_stream_t stream;
  gw_dev_stream_t pool[GW_DEV_POOL_MAX];
  int npool, engine;
  void *engine_for;
  uint64_t probe_seq;
  char *stage[2];
  size_t stage_bytes;
  /* An operation whose stream never got to it was given up (destroy): that
   * stream may still wait, on the device, for something, and cudaFree /
   * cudaFreeHost wait for the whole device, so the buffers are left. */
  _Atomic bool abandoned;
};

static uint64_t *done_flag(struct gw_devstate *d) { return &d->flags[GW_DEV_TICKETS]; }
/* The ticket of the last staged operation whose stream is done with the staging buffers. */
static uint64_t *stage_free_flag(struct gw_devstate *d) { return &d->flags[GW_DEV_TICKETS + 1]; }
/* The ticket of the last stream-ordered device-ring operation whose stream
 * has done all its device work (the next may touch the twins and counters). */
static uint64_t *ring_free_flag(struct gw_devstate *d) { return &d->flags[GW_DEV_TICKETS + 2]; }
/* Engine stream i's probe (pick_engine). */
static uint64_t *probe_flag(struct gw_devstate *d, int i) { return &d->flags[GW_DEV_TICKETS + 3 + i]; }
/* The synchronized device ring's engine: how far it got (gw__dev_engine_wait). */
static uint64_t *chunk_flag(struct gw_devstate *d) { return &d->flags[GW_DEV_TICKETS + 3 + GW_DEV_POOL_MAX]; }
#define GW_DEV_NFLAGS (GW_DEV_TICKETS + 4 + GW_DEV_POOL_MAX)

_Atomic bool gw__dev_given_up;

gw_result_t gw__dev_fail(struct gw_errctx *err, const struct gw_comm *comm, const char *what) {
  const struct gw_dev_ops *dv = gw__dev();
  return gw__err(err, GW_ERR_CUDA, "rank %d: %s failed: %s", comm->rank, what, dv ? dv->error() : "no device");
}

/* ---- pieces -------------------------------------------------------------------------------- */
size_t gw__dev_stage_bytes_own(void) {
  const int64_t asked = gw__param_DevStageBytes();
  static atomic_bool said;
  if (asked > GW_DEV_STAGE_MAX && !atomic_exchange(&said, true))
    GW_WARN(GW_SUB_INIT, "GW_DEV_STAGE_BYTES=%lld is above %lld (each of two pinned staging buffers): %lld used",
            (long long)asked, (long long)GW_DEV_STAGE_MAX, (long long)GW_DEV_STAGE_MAX);
  return (size_t)GW_MIN(GW_MAX(asked, 4096), GW_DEV_STAGE_MAX);
}

/* The staging size: rank 0's, agreed at init (this rank's own before that,
 * or where no rank-wide agreement was needed: one rank, or not every rank
 * has a device layer, so device buffers cannot run anyway). */
static size_t stage_bytes_param(const struct gw_comm *comm) {
  size_t s = comm->dev_stage_bytes ? (size_t)comm->dev_stage_bytes : gw__dev_stage_bytes_own();
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

size_t gw__dev_ring_chunk(const struct gw_comm *comm, const struct gw_op *op) {
  return on_ring(comm, op) ? comm->devring->chunk : 0;
}

uint64_t gw__dev_npieces(const struct gw_comm *comm, const struct gw_op *op) {
  if (on_ring(comm, op)) return comm->devring->async ? 2 : 1; /* 2: gw__dev_ring_end's barrier */
  if (!op->device_mem || op->desc.count == 0) return 1;
  size_t pc = piece_elems(comm, op);
  return (op->desc.count + pc - 1) / pc;
}

/* Whether op goes through the host staging (device buffers off the device ring). */
static bool staged(const struct gw_comm *comm, const struct gw_op *op) {
  return op->device_mem && !on_ring(comm, op);
}

/* Whether op is on the stream-ordered device ring (its device work emitted at the call). */
static bool emitted(const struct gw_comm *comm, const struct gw_op *op) {
  return on_ring(comm, op) && comm->devring->async;
}

/* ---- pieces of a staged operation ------------------------------------------------------ */
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
  if (p->off + p->n < op->desc.count) p->sub.desc.pad |= GW_DESC_MORE;
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

/* ---- the caller's side ---------------------------------------------------------------------- */
/* Whether the next ticket's start flag is free (see gw__dev_throttle). */
static bool ticket_free(struct gw_devstate *d) {
  const uint64_t next = __atomic_load_n(&d->next_ticket, __ATOMIC_RELAXED) + 1; /* written under comm->mu */
  return next <= GW_DEV_TICKETS || atomic_load_explicit((_Atomic uint64_t *)done_flag(d), memory_order_acquire) >=
                                       fval(next - GW_DEV_TICKETS, GW_DEV_ALL);
}

/* Before comm->mu is taken: a start flag is reused GW_DEV_TICKETS tickets
 * later, so the next ticket waits for the one that used its flag to be done.
 * Calls from two threads may both pass it for one ticket: the reservation
 * under comm->mu looks again (ticket_free) and sends the loser back here. */
gw_result_t gw__dev_throttle(struct gw_comm *comm) {
  struct gw_devstate *d = __atomic_load_n(&comm->dev, __ATOMIC_ACQUIRE); /* made under comm->mu */
  if (!d || ticket_free(d)) return GW_SUCCESS;
  const uint64_t flag_of = __atomic_load_n(&d->next_ticket, __ATOMIC_RELAXED) + 1 - GW_DEV_TICKETS;
  uint64_t need = fval(flag_of, GW_DEV_ALL);
  struct gw_waiter w;
  const double limit = atomic_load(&comm->timeout_s); /* what the message says: this wait's */
  gw__waiter_init(&w, limit);
  while (atomic_load_explicit((_Atomic uint64_t *)done_flag(d), memory_order_acquire) < need) {
    /* The operation that holds the flag ends (or is given up) by its own
     * deadline; an abort or a failed communicator ends this wait too. */
    struct gw_errctx err;
    if (atomic_load(&comm->aborted) || atomic_load(&comm->failed)) {
      gw__err(&err, GW_ERR_ABORTED, "rank %d: the communicator failed or was aborted while this stream-ordered call "
              "waited for operation #%llu's flag", comm->rank, (unsigned long long)flag_of);
      gw__comm_set_error(comm, err.msg);
      return GW_ERR_ABORTED;
    }
    if (!gw__waiter_pause(&w)) {
      /* The peers may be in this call already: the communicator fails and
       * they hear of it, as from any failed operation. */
      gw__err(&err, GW_ERR_TIMEOUT, "rank %d: a stream-ordered call waited %.0f s (GW_TIMEOUT) for the operation %d "
              "calls before it to finish on its stream (its flag is reused)", comm->rank,
              limit, GW_DEV_TICKETS);
      gw__comm_fail_caller(comm, GW_ERR_TIMEOUT, &err); /* the progress thread may be on the connections */
      return GW_ERR_TIMEOUT;
    }
  }
  return GW_SUCCESS;
}

/* Under comm->mu.  Makes the flags on first use, takes a ticket and enqueues
 * the flag write and wait on the caller's stream. */
static gw_result_t engine_stream(struct gw_comm *comm, struct gw_devstate *d, struct gw_errctx *err);
static gw_result_t stage_ready(struct gw_comm *comm, struct gw_devstate *d, struct gw_errctx *err);

/* The engine's stream and (without a device ring) the staging buffers; what a
 * failed first try left out is made by the next call (a half-made state was
 * kept and used: a missing staging buffer taken for a host address). */
static gw_result_t devstate_ready(struct gw_comm *comm, struct gw_devstate *d, struct gw_errctx *err) {
  if (comm->device < 0) return GW_SUCCESS;
  /* Staging serves operations below the ring's threshold too. */
  return comm->devring && !comm->devring->min_bytes ? engine_stream(comm, d, err) : stage_ready(comm, d, err);
}

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
  if (dv->host_alloc(&flags, GW_DEV_NFLAGS * sizeof(uint64_t))) {
    free(d);
    return gw__dev_fail(err, comm, "allocating pinned host memory for the stream flags");
  }
  d->flags = flags;
  __atomic_store_n(&comm->dev, d, __ATOMIC_RELEASE); /* from here gw__dev_free takes it back; the throttle reads it unlocked */
  return devstate_ready(comm, d, err);
}

/* The calling thread on `device` for the calls in between (a thread other
 * than gw_comm_init's may be on another one); *prev: the device to go back
 * to, -1 for none.  A thread with no device context yet (one that never used
 * CUDA: it "is on" device 0) goes to `device` and stays there: going back
 * would make a context on device 0 (half a GB of it per rank on an 8-GPU
 * machine), and staying put when `device` is 0 left the thread without a
 * context for the driver's stream memory operations.  0, or what failed:
 * 1 asking, 2 switching. */
int gw__dev_enter(int device, int *prev) {
  const struct gw_dev_ops *dv = gw__dev();
  int cur = -1, in_use = 0;
  *prev = -1;
  if (!dv || device < 0) return 0;
  if (dv->device_in_use(&in_use) || (in_use && dv->get_device(&cur))) return 1;
  if (in_use && cur == device) return 0;
  if (dv->set_device(device)) return 2;
  if (in_use) *prev = cur;
  return 0;
}

static gw_result_t device_enter(struct gw_comm *comm, int *prev, struct gw_errctx *err) {
  switch (gw__dev_enter(comm->device, prev)) {
    case 1: return gw__dev_fail(err, comm, "asking for the calling thread's device");
    case 2: return gw__dev_fail(err, comm, "switching the calling thread to the device");
    default: return GW_SUCCESS;
  }
}

static void device_leave(int prev) {
  if (prev >= 0) gw__dev()->set_device(prev);
}

int gw__dev_switch(struct gw_comm *comm) {
  struct gw_errctx err;
  int prev = -1;
  if (comm->device >= 0 && device_enter(comm, &prev, &err) != GW_SUCCESS)
    GW_WARN(GW_SUB_INIT, "%s (going on with the calling thread's device)", err.msg);
  return prev;
}

void gw__dev_switch_back(int prev) { device_leave(prev); }

gw_result_t gw__dev_reserve_locked(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err) {
  if (comm->dev && !ticket_free(comm->dev)) return GW_INPROGRESS; /* the caller throttles again */
  int prev;
  GW_CHECK(device_enter(comm, &prev, err));
  gw_result_t res = comm->dev ? devstate_ready(comm, comm->dev, err) : devstate_make(comm, err);
  struct gw_devstate *d = comm->dev;
  op->after = 0;
  if (res == GW_SUCCESS && atomic_load(&d->broken))
    res = gw__err(err, GW_ERR_CUDA, "rank %d: an earlier operation's work could not all be put on its stream, so "
                  "this communicator takes no more stream-ordered calls (destroy it and make a new one)", comm->rank);
  if (res == GW_SUCCESS && staged(comm, op) && gw__dev_npieces(comm, op) >= GW_DEV_ALL)
    res = gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %llu elements make more than %llu staging pieces of "
                  "GW_DEV_STAGE_BYTES=%zu; raise it", comm->rank, (unsigned long long)op->desc.count,
                  (unsigned long long)GW_DEV_ALL - 1, stage_bytes_param(comm));
  if (res == GW_SUCCESS) {
    op->ticket = d->next_ticket + 1;
    __atomic_store_n(&d->next_ticket, op->ticket, __ATOMIC_RELAXED); /* the throttle reads it unlocked */
    if (staged(comm, op)) {
      op->after = d->last_staged;
      d->last_staged = op->ticket;
    } else if (emitted(comm, op)) {
      op->after = d->last_ring;
      d->last_ring = op->ticket;
    }
  }
  device_leave(prev);
  return res;
}

/* A staged operation on its stream: wait until the staged operation before it
 * (maybe on another stream) has copied its last piece out; then per piece k
 * copy it in and say so (start flag = piece k + 1), and once the host has
 * reduced it (done flag) copy it out, behind the copy in of piece k + 1, so
 * the stream moves one piece while the host reduces the next. */
static int enqueue_staged(const struct gw_comm *comm, struct gw_devstate *d, const struct gw_op *op) {
  const struct gw_dev_ops *dv = d->ops;
  gw_dev_stream_t s = op->stream;
  const uint64_t t = op->ticket, np = gw__dev_npieces(comm, op);
  uint64_t *start = &d->flags[t % GW_DEV_TICKETS];
  if (op->after && dv->flag_wait(stage_free_flag(d), op->after, s)) return 1;
  struct piece p;
  for (uint64_t k = 0; k <= np; k++) {
    if (k < np) {
      piece_of(comm, op, k, d->stage[k % 2], &p);
      if (piece_copies(comm, dv, s, op, &p, d->stage[k % 2], true) || dv->flag_write(start, fval(t, k + 1), s))
        return 1;
    }
    if (k >= 1) {
      piece_of(comm, op, k - 1, d->stage[(k - 1) % 2], &p);
      if (dv->flag_wait(done_flag(d), fval(t, k), s) || piece_copies(comm, dv, s, op, &p, d->stage[(k - 1) % 2], false))
        return 1;
    }
  }
  /* The end of the operation (a failure also skips here), then the buffers are free. */
  return dv->flag_wait(done_flag(d), fval(t, GW_DEV_ALL), s) || dv->flag_write(stage_free_flag(d), t, s);
}

/* A stream-ordered device-ring operation on its stream: after the one before
 * it (maybe on another stream) has done its device work, the start flag, every
 * chunk's waits, copies and kernels and counter writes (gw__ring_emit), the
 * flag that says so (start = piece 2), and the wait for the host's verdict. */
static gw_result_t enqueue_emitted(struct gw_comm *comm, struct gw_devstate *d, const struct gw_op *op,
                                   struct gw_errctx *err) {
  const struct gw_dev_ops *dv = d->ops;
  gw_dev_stream_t s = op->stream;
  const uint64_t t = op->ticket;
  uint64_t *start = &d->flags[t % GW_DEV_TICKETS];
  if ((op->after && dv->flag_wait(ring_free_flag(d), op->after, s)) || dv->flag_write(start, fval(t, 1), s))
    return gw__dev_fail(err, comm, "enqueueing on the caller's stream");
  GW_CHECK(gw__ring_emit(comm, op, s, err));
  if (dv->flag_write(ring_free_flag(d), t, s) || dv->flag_write(start, fval(t, 2), s) ||
      dv->flag_wait(done_flag(d), fval(t, GW_DEV_ALL), s))
    return gw__dev_fail(err, comm, "enqueueing on the caller's stream");
  return GW_SUCCESS;
}

gw_result_t gw__dev_enqueue(struct gw_comm *comm, const struct gw_op *op, struct gw_errctx *err) {
  struct gw_devstate *d = comm->dev;
  const struct gw_dev_ops *dv = d->ops;
  const uint64_t t = op->ticket;
  gw_dev_stream_t s = op->stream;
  int prev;
  gw_result_t res = device_enter(comm, &prev, err);
  if (res == GW_SUCCESS) {
    if (emitted(comm, op)) {
      res = enqueue_emitted(comm, d, op, err);
    } else {
      int rc;
      if (staged(comm, op)) {
        rc = enqueue_staged(comm, d, op);
      } else {
        rc = dv->flag_write(&d->flags[t % GW_DEV_TICKETS], fval(t, 1), s);
        const int64_t gap = gw__env_int("GW_TEST_ENQUEUE_GAP_US", 0); /* tests: the caller slow in between */
        if (gap > 0) usleep((useconds_t)gap);
        rc = rc || dv->flag_wait(done_flag(d), fval(t, GW_DEV_ALL), s);
      }
      if (rc) res = gw__dev_fail(err, comm, "enqueueing on the caller's stream");
      else atomic_store_explicit(&d->waits_queued, t, memory_order_release);
    }
    device_leave(prev);
  }
  if (res != GW_SUCCESS) {
    /* The progress thread fails the operation instead of waiting for what
     * never went in.  What did go in may still run, whenever its stream gets
     * there (after the operation before it, whose "free" flag it waits for),
     * and never says it is done, so no later call of this communicator may
     * count on the staging buffers or the ring's counters: none is taken. */
    /* Why, for the progress thread's failure (what the peers and
     * gw_comm_get_async_error say): the device's error, without "rank N: ". */
    const char *why = err->msg;
    if (!strncmp(why, "rank ", 5) && strstr(why, ": ")) why = strstr(why, ": ") + 2;
    snprintf(d->enqueue_why, sizeof d->enqueue_why, "%s", why);
    atomic_store_explicit(&d->broken, true, memory_order_release);
    atomic_store_explicit(&d->enqueue_failed, t, memory_order_release);
  }
  return res;
}

/* ---- the progress thread's side ------------------------------------------------------------ */
/* Until the caller's stream wrote piece k's start (k = 0: the operation's). */
static gw_result_t wait_start(struct gw_comm *comm, struct gw_devstate *d, const struct gw_op *op, uint64_t k,
                              struct gw_errctx *err) {
  _Atomic uint64_t *flag = (_Atomic uint64_t *)&d->flags[op->ticket % GW_DEV_TICKETS];
  const uint64_t want = fval(op->ticket, k + 1);
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  double give_up = 0, next_query = gw__now() + 0.1;
  while (atomic_load_explicit(flag, memory_order_acquire) < want) {
    if (atomic_load_explicit(&d->enqueue_failed, memory_order_acquire) == op->ticket)
      return gw__err(err, GW_ERR_CUDA, "rank %d: operation #%llu could not be put on the caller's stream: %.300s",
                     comm->rank, (unsigned long long)op->desc.seq, d->enqueue_why);
    /* A fault on the caller's stream (an illegal address before our flag)
     * leaves the flag unwritten, and is sticky: every call on the device
     * reports it from then on, so our own stream is asked every 100 ms (not
     * the caller's, which the caller may destroy once its work is queued). */
    if (gw__now() > next_query) {
      int idle = 0;
      if (d->npool && d->ops->stream_idle(d->stream, &idle))
        return gw__dev_fail(err, comm, "the device, while the caller's stream went to the operation,");
      next_query = gw__now() + 0.1;
      /* No deadline here, but a peer that failed (its notice; it timed out
       * waiting for this operation, say) or died ends the wait: it held this
       * rank's later calls for ever.  (Not while destroying: the give-up
       * below marks the state abandoned, so frees do not wait for a stream
       * that may never get here.) */
      if (!atomic_load(&comm->stopping)) GW_CHECK(gw__heard_abort(comm, err));
      for (int i = 0; i < 2 && comm->nranks > 1 && !atomic_load(&comm->stopping); i++) {
        const int peer = i ? comm->rings[0].next : comm->rings[0].prev;
        if (!gw__peer_alive(comm, peer)) {
          char what[GW_OPDESC_TEXT];
          gw__describe_op(&op->desc, what, sizeof what);
          return gw__err(err, GW_ERR_REMOTE, "rank %d: rank %d (pid %d) is gone, while this rank waited for the "
                         "stream to reach operation %s", comm->rank, peer, (int)comm->peers[peer].pid, what);
        }
      }
    }
    if (atomic_load(&comm->aborted)) { /* (the operation named, not its number alone) */
      char what[GW_OPDESC_TEXT];
      gw__describe_op(&op->desc, what, sizeof what);
      return gw__err(err, GW_ERR_ABORTED, "rank %d: aborted while waiting for the stream to reach operation %s",
                     comm->rank, what);
    }
    /* No deadline while the stream has work ahead (a forward pass may take long),
     * but a communicator being destroyed waits GW_TIMEOUT at most. */
    bool stopping = atomic_load(&comm->stopping);
    if (stopping && give_up == 0) give_up = gw__now() + (comm->timeout_s > 0 ? comm->timeout_s : 1.0);
    if (give_up && gw__now() > give_up) {
      atomic_store(&d->abandoned, true);
      atomic_store(&gw__dev_given_up, true);
      return gw__err(err, GW_ERR_TIMEOUT, "rank %d: gw_comm_destroy: the stream of operation #%llu never got to it "
                     "(synchronize the streams before destroying the communicator)", comm->rank,
                     (unsigned long long)op->desc.seq);
    }
    gw__waiter_pause(&w);
  }
  return GW_SUCCESS;
}

/* The engine streams, made on the caller's side before its first wait (making
 * a stream may wait for the device).  One where streams do not share queues;
 * else one more than the queues: made one after another, round robin, they
 * take every queue, so some run beside any caller's stream. */
static gw_result_t engine_stream(struct gw_comm *comm, struct gw_devstate *d, struct gw_errctx *err) {
  if (!d->npool) {
    const long q = gw__dev_queues();
    const int want = q >= 2 && comm->devring && !comm->devring->async ? (int)GW_MIN(q, GW_DEV_POOL_MAX - 1) + 1 : 1;
    for (; d->npool < want; d->npool++)
      if (d->ops->stream_create(&d->pool[d->npool])) {
        if (d->npool) break; /* fewer to choose from */
        return gw__dev_fail(err, comm, "creating the engine's stream");
      }
    d->stream = d->pool[0];
  }
  return GW_SUCCESS;
}

/* Before a device-ring operation, with the caller's stream waiting on the
 * done flag: an engine stream whose work runs now.  Where streams share
 * hardware queues, one in the caller's stream's queue would run nothing
 * behind that wait, and the operation would never end (CUDA's stream memory
 * operations warn of it).  Each try writes a probe flag on a stream and waits
 * for it briefly; the one that answered last time for this caller's stream is
 * tried first, and answers at once when it still may. */
static gw_result_t pick_engine(struct gw_comm *comm, struct gw_devstate *d, const struct gw_op *op,
                               struct gw_errctx *err) {
  if (d->npool <= 1) return GW_SUCCESS;
  /* A failed or aborted communicator runs nothing more: no seconds of probing
   * per queued operation; refused as gw__run_op refuses, naming the first
   * error (the bare "failed or was aborted before it" lost the cause, the
   * dead rank, on every later call: with one engine stream, as the emulator
   * had by default, this path never ran). */
  if (atomic_load(&comm->aborted) || atomic_load(&comm->failed)) return gw__refuse_if_failed(comm, op, err);
  const int first = op->stream == d->engine_for ? d->engine : 0;
  for (int round = 0; round < 2 && !atomic_load(&comm->aborted); round++) {
    const double patience = round ? 1.0 : 0.02; /* a busy device's front end: the second round */
    for (int k = 0; k < d->npool; k++) {
      const int i = (first + k) % d->npool;
      _Atomic uint64_t *f = (_Atomic uint64_t *)probe_flag(d, i);
      const uint64_t v = ++d->probe_seq;
      if (d->ops->flag_write((uint64_t *)f, v, d->pool[i])) return gw__dev_fail(err, comm, "probing an engine stream");
      const double until = gw__now() + patience;
      struct gw_waiter w;
      gw__waiter_init(&w, 0);
      while (atomic_load_explicit(f, memory_order_acquire) < v && gw__now() < until) gw__waiter_pause(&w);
      if (atomic_load_explicit(f, memory_order_acquire) >= v) {
        if (i != d->engine || op->stream != d->engine_for)
          GW_INFO(GW_SUB_PROXY, "rank %d: engine stream %d of %d runs beside the caller's stream %p", comm->rank, i,
                  d->npool, op->stream);
        d->engine = i, d->engine_for = op->stream, d->stream = d->pool[i];
        return GW_SUCCESS;
      }
    }
  }
  return gw__err(err, GW_ERR_CUDA, "rank %d: operation #%llu: none of the %d engine streams runs while the caller's "
                 "stream waits (the streams share %ld hardware queues; GW_DEV_IPC=0 takes host staging instead)",
                 comm->rank, (unsigned long long)op->desc.seq, d->npool, gw__dev_queues());
}

static gw_result_t stage_ready(struct gw_comm *comm, struct gw_devstate *d, struct gw_errctx *err) {
  GW_CHECK(engine_stream(comm, d, err));
  if (!d->stage[1]) {
    size_t bytes = stage_bytes_param(comm);
    for (int i = 0; i < 2; i++) {
      void *p = NULL;
      if (d->stage[i]) continue;
      if (d->ops->host_alloc(&p, bytes)) return gw__dev_fail(err, comm, "allocating pinned staging memory");
      d->stage[i] = p;
    }
    d->stage_bytes = bytes;
  }
  return GW_SUCCESS;
}

/* The host's half of a staged operation: each piece once the caller's stream
 * has copied it in (enqueue_staged), then the stream may copy it out. */
static gw_result_t run_staged(struct gw_comm *comm, struct gw_devstate *d, const struct gw_op *op,
                              struct gw_errctx *err) {
  const uint64_t np = gw__dev_npieces(comm, op);
  for (uint64_t k = 0; k < np; k++) {
    GW_CHECK(wait_start(comm, d, op, k, err));
    struct piece p;
    piece_of(comm, op, k, d->stage[k % 2], &p);
    GW_CHECK(gw__run_op(comm, &p.sub, err));
    if (k + 1 < np) atomic_store_explicit((_Atomic uint64_t *)done_flag(d), fval(op->ticket, k + 1), memory_order_release);
  }
  return GW_SUCCESS;
}

/* A device-ring operation synchronized per chunk, or host buffers ordered on a
 * stream: once the caller's stream got to it, the progress thread runs it
 * (the device ring's work on an engine stream that runs beside the caller's). */
static gw_result_t run_direct(struct gw_comm *comm, struct gw_devstate *d, const struct gw_op *op,
                              struct gw_errctx *err) {
  GW_CHECK(wait_start(comm, d, op, 0, err));
  struct gw_op run = *op;
  run.ordered = false;
  if (!op->device_mem) return gw__run_op(comm, &run, err);
  GW_CHECK(engine_stream(comm, d, err));
  /* Probing only once the caller's done-wait is in its queue (the caller is
   * enqueueing it now): an engine stream behind it must not answer. */
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  while (d->npool > 1 && atomic_load_explicit(&d->waits_queued, memory_order_acquire) < op->ticket) {
    if (atomic_load_explicit(&d->enqueue_failed, memory_order_acquire) == op->ticket)
      return gw__err(err, GW_ERR_CUDA, "rank %d: operation #%llu could not be put on the caller's stream: %.300s",
                     comm->rank, (unsigned long long)op->desc.seq, d->enqueue_why);
    if (atomic_load(&comm->aborted))
      return gw__err(err, GW_ERR_CUDA, "rank %d: operation #%llu could not be put on the caller's stream",
                     comm->rank, (unsigned long long)op->desc.seq);
    gw__waiter_pause(&w);
  }
  GW_CHECK(pick_engine(comm, d, op, err));
  comm->devring->stream = d->stream;
  comm->devring->chunk_flag = chunk_flag(d);
  gw_result_t res = gw__run_op(comm, &run, err); /* the device ring */
  /* Nothing of it may still run on the device when the caller's stream goes
   * on (after a give-up the state is abandoned: no waiting again). */
  if (!atomic_load(&d->abandoned)) {
    struct gw_errctx e2 = {{0}};
    gw_result_t r2 = gw__dev_engine_wait(comm, d->stream, chunk_flag(d), &comm->devring->chunk_seq, &e2);
    if (r2 != GW_SUCCESS && res == GW_SUCCESS) res = r2, *err = e2;
  }
  return res;
}

gw_result_t gw__dev_engine_wait(struct gw_comm *comm, gw_dev_stream_t s, uint64_t *flag, uint64_t *seq,
                                struct gw_errctx *err) {
  struct gw_devstate *d = comm->dev;
  const uint64_t want = ++*seq;
  if (d->ops->flag_write(flag, want, s)) return gw__dev_fail(err, comm, "the device ring's stream");
  const double limit = comm->timeout_s > 0 ? comm->timeout_s : 60.0, give_up = gw__now() + limit;
  double next_query = gw__now() + 0.1;
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  while (atomic_load_explicit((_Atomic uint64_t *)flag, memory_order_acquire) < want) {
    if (gw__now() > next_query) { /* a fault on the device is sticky: asked now and then */
      int idle = 0;
      if (d->ops->stream_idle(s, &idle)) return gw__dev_fail(err, comm, "the device ring's stream");
      next_query = gw__now() + 0.1;
    }
    if (atomic_load(&comm->aborted) || gw__now() > give_up) {
      atomic_store(&d->abandoned, true); /* what is queued may still run: nothing waits for it again */
      if (atomic_load(&comm->aborted))
        return gw__err(err, GW_ERR_ABORTED, "rank %d: aborted while the device ring's stream worked", comm->rank);
      return gw__err(err, GW_ERR_TIMEOUT,
                     "rank %d: the device ring's engine stream did not get through a chunk's work in %.0f s: its "
                     "hardware queue is likely held by a stream that waits for this very operation (streams share "
                     "%ld queues, CUDA_DEVICE_MAX_CONNECTIONS; GW_DEV_ASYNC=1 enqueues from the caller's side only)",
                     comm->rank, limit, gw__dev_queues());
    }
    gw__waiter_pause(&w);
  }
  return GW_SUCCESS;
}

/* A stream-ordered device-ring operation: its device work went on the caller's
 * stream at the call; the progress thread sends and checks its headers, waits
 * for the stream to say it is done (releasing it where neighbours fail), and
 * takes part in the barrier that makes it good everywhere or nowhere. */
static gw_result_t run_emitted(struct gw_comm *comm, struct gw_devstate *d, const struct gw_op *op,
                               struct gw_errctx *err) {
  gw_result_t res = wait_start(comm, d, op, 0, err);
  if (res != GW_SUCCESS) {
    /* The stream may reach the operation later: let its waits pass then. */
    gw__dev_ring_release(comm);
    return res;
  }
  struct gw_op run = *op;
  run.ordered = false;
  res = gw__run_op(comm, &run, err); /* the headers */
  const struct gw_ring_end e = {.finished = &d->flags[op->ticket % GW_DEV_TICKETS],
                                .want = fval(op->ticket, 2),
                                .unqueued = &d->enqueue_failed,
                                .unqueued_why = d->enqueue_why,
                                .ticket = op->ticket,
                                .query = d->npool ? d->stream : NULL};
  return gw__dev_ring_end(comm, op, res, &e, err);
}

gw_result_t gw__dev_run(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err) {
  struct gw_devstate *d = comm->dev;
  gw_result_t res = staged(comm, op)    ? run_staged(comm, d, op, err)
                    : emitted(comm, op) ? run_emitted(comm, d, op, err)
                                        : run_direct(comm, d, op, err);
  /* Every piece started, but what follows them (the last copies out, the
   * waits) could not all be put on the stream: not a success. */
  if (res == GW_SUCCESS && atomic_load_explicit(&d->enqueue_failed, memory_order_acquire) == op->ticket)
    res = gw__err(err, GW_ERR_CUDA, "rank %d: the end of operation #%llu could not be put on the caller's stream: "
                  "%.300s", comm->rank, (unsigned long long)op->desc.seq, d->enqueue_why);
  if (res != GW_SUCCESS) gw__comm_fail(comm, &op->desc, res, err);
  /* Always let the stream go on: on failure its output is undefined and the
   * error is the communicator's (gw_comm_get_async_error, gw_wait). */
  atomic_store_explicit((_Atomic uint64_t *)done_flag(d), fval(op->ticket, GW_DEV_ALL), memory_order_release);
  return res;
}

bool gw__dev_settled(const struct gw_comm *comm, const struct gw_op *op) {
  if (!op->ordered || op->stream || !staged(comm, op) || !comm->dev) return true;
  struct gw_devstate *d = comm->dev;
  /* Never written after a failed enqueue: nothing more to wait for. */
  if (atomic_load_explicit(&d->broken, memory_order_acquire)) return true;
  return atomic_load_explicit((_Atomic uint64_t *)stage_free_flag(d), memory_order_acquire) >= op->ticket;
}

gw_result_t gw__dev_settle_look(struct gw_comm *comm, const struct gw_op *op, double since, double timeout,
                                bool *settled) {
  *settled = gw__dev_settled(comm, op);
  const double now = gw__now();
  /* A fault on the device (sticky: the free flag is then never written) ends
   * the wait at once, asked about every 100 ms as the other waits do: it
   * waited GW_TIMEOUT, or for good with 0. */
  struct gw_devstate *d = comm->dev;
  if (!*settled && d && now > atomic_load(&d->next_fault_query)) {
    atomic_store(&d->next_fault_query, now + 0.1);
    int idle = 0;
    /* On the communicator's device: gw_wait / gw_test may run on a thread of
     * another device (its default stream is not the one copying out, and a
     * fault here went unseen) or of none (the query made a context on device
     * 0, which gw__dev_enter exists to avoid). */
    const int prev = gw__dev_switch(comm);
    const int fault = d->ops->stream_idle(NULL, &idle); /* the default stream: the one that copies the result out */
    gw__dev_switch_back(prev);
    if (fault) {
      struct gw_errctx e;
      gw__dev_fail(&e, comm, "the device, while a blocking call's result was copied out,");
      gw__comm_set_error(comm, e.msg);
      return GW_ERR_CUDA;
    }
  }
  if (*settled || !((timeout > 0 && now > since + timeout) || atomic_load(&comm->aborted))) /* 0: no limit */
    return GW_SUCCESS;
  char me[GW_OPDESC_TEXT], msg[GW_ERRMSG_MAX];
  gw__describe_op(&op->desc, me, sizeof me);
  snprintf(msg, sizeof msg, "rank %d: operation %s was done, but the default stream had not copied its result "
           "out after %.0f s%s (is that stream held up by other work?)", comm->rank, me, now - since,
           atomic_load(&comm->aborted) ? " when the communicator was aborted" : "");
  gw__comm_set_error(comm, msg);
  return atomic_load(&comm->aborted) ? GW_ERR_ABORTED : GW_ERR_TIMEOUT;
}

gw_result_t gw__dev_settle(struct gw_comm *comm, const struct gw_op *op) {
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  const double since = gw__now(), limit = comm->timeout_s; /* a wait under way keeps its limit */
  bool settled;
  gw_result_t res;
  while ((res = gw__dev_settle_look(comm, op, since, limit, &settled)) == GW_SUCCESS && !settled)
    gw__waiter_pause(&w);
  return res;
}

/* After the progress thread stopped. */
void gw__dev_free(struct gw_comm *comm) {
  struct gw_devstate *d = comm->dev;
  if (!d) return;
  comm->dev_abandoned = atomic_load(&d->abandoned) || atomic_load(&gw__dev_given_up);
  /* Given up: an engine stream may sit behind that wait too (a probe that
   * never answered), and syncing it would hang destroy: left as they are. */
  for (int i = 0; i < d->npool && !comm->dev_abandoned; i++) {
    d->ops->stream_sync(d->pool[i]);
    d->ops->stream_destroy(d->pool[i]);
  }
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
