/* enqueue.c - the collective entry points: argument checks, sequence numbers,
 * and the execution of operations one at a time in call order, either inline on
 * the caller's thread (a blocking call with nothing queued) or on the
 * communicator's progress thread (non-blocking calls and anything queued behind
 * them).  The progress thread starts with the first non-blocking call, so
 * blocking-only users never pay for it.  The algorithms live in ring.c and tree.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "comm.h"
#include "reduce.h"

/* The cost model's pick for this call, within what GW_ALGO / GW_PROTO allow
 * (tune.c).  Every rank decides alike from the same call. */
static void choose(struct gw_comm *comm, struct gw_op *op) {
  size_t bytes = op->desc.count * gw_dtype_size((gw_dtype_t)op->desc.dtype);
  if (op->desc.coll == GW_COLL_ALLGATHER || op->desc.coll == GW_COLL_REDUCE_SCATTER) bytes *= (size_t)comm->nranks;
  const size_t nmemo = sizeof comm->pick_memo / sizeof comm->pick_memo[0];
  struct gw_pick_memo *m = &comm->pick_memo[((bytes * 0x9e3779b97f4a7c15ull) >> 58 ^ op->desc.coll) % nmemo];
  if (!m->valid || m->bytes != bytes || m->coll != op->desc.coll || m->want_algo != op->want_algo ||
      m->want_proto != op->want_proto) {
    struct gw_pick_args a;
    gw__pick_base(comm, op->want_algo, op->want_proto, &a);
    a.coll = op->desc.coll, a.bytes = bytes;
    int algo, proto;
    gw__model_pick(&comm->model, &a, &algo, &proto);
    *m = (struct gw_pick_memo){.bytes = bytes, .coll = op->desc.coll, .algo = (uint8_t)algo, .proto = (uint8_t)proto,
                               .valid = 1, .want_algo = op->want_algo, .want_proto = op->want_proto};
  }
  op->algo = m->algo, op->proto = m->proto;
}

gw_result_t gw__refuse_if_failed(struct gw_comm *comm, const struct gw_op *op, struct gw_errctx *err) {
  if (atomic_load(&comm->aborted) && !atomic_load(&comm->failed)) {
    /* Aborted between operations: the peers hear of it as of any failure (they
     * may be waiting in this very operation). */
    struct gw_errctx aerr;
    char why[GW_ERRMSG_MAX];
    gw__abort_reason(comm, why, sizeof why);
    gw__err(&aerr, GW_ERR_ABORTED, "rank %d: %.450s", comm->rank, why);
    gw__comm_fail(comm, &op->desc, GW_ERR_ABORTED, &aerr);
  }
  int failed = atomic_load(&comm->failed);
  if (!failed) return GW_SUCCESS;
  char first[GW_ERRMSG_MAX];
  gw__comm_first_error(comm, first, sizeof first);
  gw__err(err, (gw_result_t)failed,
          "rank %d: the communicator %s and cannot run more; destroy it and make a new one (first error: %.300s)",
          comm->rank, failed == GW_ERR_ABORTED ? "was aborted" : "failed in an earlier operation", first);
  gw__comm_set_error(comm, err->msg);
  return (gw_result_t)failed;
}

static gw_result_t run_host(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err) {
  return op->algo == GW_ALGO_TREE                              ? gw__tree_run(comm, op, err)
         : op->algo == GW_ALGO_EXCHANGE && comm->nranks > 2 ? gw__rd_run(comm, op, err)
                                                            : gw__ring_run(comm, op, err);
}

/* Whether the algorithm chosen for a widened operation converts inside its
 * steps (ring.c: the ring's allreduce and the two-rank exchange). */
static bool folds(const struct gw_comm *comm, const struct gw_op *op) {
  return comm->nranks > 1 && (op->algo == GW_ALGO_RING || (op->algo == GW_ALGO_EXCHANGE && comm->nranks == 2));
}

/* A widened operation on an algorithm that does not convert (the trees,
 * recursive doubling, one rank): float32 into the 16-bit buffer, the
 * operation on it, and back, here on the operation's thread. */
static gw_result_t run_through_wire_buf(struct gw_comm *comm, const struct gw_op *op, struct gw_errctx *err) {
  const gw_dtype_t wire = (gw_dtype_t)op->desc.dtype;
  struct gw_op w = *op;
  w.sendbuf = w.recvbuf = op->wire_buf;
  w.widened = false;
  gw__cvt_from_f32_scaled(wire, op->wire_buf, op->sendbuf, op->desc.count, op->scale);
  gw_result_t res = run_host(comm, &w, err);
  if (res == GW_SUCCESS) gw__cvt_to_f32(wire, op->recvbuf, op->wire_buf, op->desc.count);
  return res;
}

gw_result_t gw__run_op(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err) {
  GW_CHECK(gw__refuse_if_failed(comm, op, err));
  gw_result_t res;
  const bool dev_ring = gw__dev_ring_chunk(comm, op) != 0;
  if (dev_ring) op->algo = GW_ALGO_RING, op->proto = GW_PROTO_SIMPLE; /* one channel (device.c) */
  else choose(comm, op);
  if (op->desc.coll != GW_COLL_BARRIER) /* barriers are also a device operation's confirmation */
    atomic_store_explicit(&comm->last_path,
                          1u << 24 | (uint32_t)(dev_ring && gw__dev_ring_async(comm)) << 17 | (uint32_t)dev_ring << 16 |
                              (uint32_t)op->proto << 8 | op->algo,
                          memory_order_relaxed);
  op->desc.pad = (uint8_t)((op->desc.pad & (GW_DESC_DEVICE | GW_DESC_MORE | GW_DESC_DIVIDED)) |
                           op->algo << GW_DESC_ALGO_SHIFT | op->proto << GW_DESC_PROTO_SHIFT);
  if (dev_ring) res = gw__ring_run_channel(comm, 0, 1, op, err);
  else if (op->widened && !folds(comm, op)) res = run_through_wire_buf(comm, op, err);
  else res = run_host(comm, op, err);
  if (res != GW_SUCCESS) gw__comm_fail(comm, &op->desc, res, err);
  return res;
}

void gw__comm_fail(struct gw_comm *comm, const struct gw_opdesc *desc, gw_result_t res, struct gw_errctx *err) {
  /* A forked child's copy: telling the peers would stop the parent's job
   * (its FIFOs and sockets are the parent's); the child was refused at the gates. */
  if (gw__comm_forked_away(comm)) return;
  /* The flag and both messages under the error lock: a thread that sees the
   * failure (gw_comm_get_async_error) and then reads gw_comm_last_error gets
   * its message (it read an empty one, set only after the abort notice went). */
  int expected = 0;
  pthread_mutex_lock(&comm->err_mu);
  const bool first = atomic_compare_exchange_strong(&comm->failed, &expected, (int)res);
  if (first) snprintf(comm->first_error, sizeof comm->first_error, "%s", err->msg);
  snprintf(comm->last_error, sizeof comm->last_error, "%s", err->msg);
  pthread_mutex_unlock(&comm->err_mu);
  if (first && comm->nranks > 1) gw__send_abort(comm, desc, err->msg);
  if (first) gw__record_failure(res != GW_ERR_REMOTE, err->msg); /* after the peers were told */
}

/* A failure noticed on a caller's thread, outside any operation (a step the
 * bucketer left incomplete, a stream-ordered call that waited too long):
 * the communicator fails and the peers are told, with err.  The notice goes
 * over the connections as a blocking call's chunks do: only with nothing
 * queued and no other thread's call inline (submit's claim; two threads
 * posting at once claimed one slot twice).  Else an abort stops the call on
 * them at its next wait, and that call sends this reason (not "aborted by
 * gw_comm_abort", never called); one already past its last wait ends without
 * telling anyone, so the notice goes from here once the connections are free
 * (bounded by the timeout, at most 10 s; a queued call tells them as it
 * starts). */
static bool tell_if_idle(struct gw_comm *c, gw_result_t code, struct gw_errctx *err) {
  if (atomic_load(&c->pending) != 0 || atomic_exchange(&c->inline_busy, true)) return false;
  const bool idle = atomic_load(&c->pending) == 0;
  if (idle && !atomic_load(&c->failed)) {
    struct gw_opdesc d = {.seq = atomic_load(&c->next_seq), .root = -1, .coll = GW_COLL_ABORT};
    gw__comm_fail(c, &d, code, err);
  }
  atomic_store_explicit(&c->inline_busy, false, memory_order_release);
  return idle;
}

void gw__comm_fail_caller(struct gw_comm *c, gw_result_t code, struct gw_errctx *err) {
  if (gw__comm_forked_away(c)) return; /* as gw__comm_fail: the parent's peers are not the child's to stop */
  if (!atomic_load(&c->failed)) gw__record_failure(code != GW_ERR_REMOTE, err->msg);
  if (tell_if_idle(c, code, err)) return;
  pthread_mutex_lock(&c->err_mu); /* the first reason: a user's abort before it stays the user's */
  if (!c->abort_reason[0] && !atomic_load(&c->aborted))
    snprintf(c->abort_reason, sizeof c->abort_reason, "%s", err->msg);
  pthread_mutex_unlock(&c->err_mu);
  gw_comm_abort(c);
  struct gw_waiter w;
  const double t = atomic_load(&c->timeout_s);
  gw__waiter_init(&w, t > 0 && t < 10.0 ? t : 10.0);
  while (!atomic_load(&c->failed) && !tell_if_idle(c, code, err))
    if (!gw__waiter_pause(&w)) {
      GW_WARN(GW_SUB_INIT, "rank %d: the other ranks may not hear of this failure until this communicator is "
              "destroyed: another thread's call still holds its connections", c->rank);
      break;
    }
  gw__comm_set_error(c, err->msg);
}

/* ---- progress thread ------------------------------------------------------------- */
static void *progress_main(void *arg) {
  struct gw_comm *comm = arg;
  /* Tests: a pause between an operation's end and its request showing done. */
  const int64_t test_pause_us = gw__env_int("GW_TEST_COMPLETE_PAUSE_US", 0);
  gw__log_set_rank(comm->rank);
  gw__dev_thread_start(comm);
  pthread_mutex_lock(&comm->mu);
  for (;;) {
    while (!comm->shutdown && comm->q_head == NULL) pthread_cond_wait(&comm->work_cv, &comm->mu);
    if (comm->q_head == NULL) break; /* shutdown with nothing left */
    struct gw_request *req = comm->q_head;
    comm->q_head = req->next;
    if (!comm->q_head) comm->q_tail = NULL;
    pthread_mutex_unlock(&comm->mu);

    /* A blocking call that started inline before this was queued finishes first. */
    struct gw_waiter w;
    gw__waiter_init(&w, 0);
    while (atomic_load(&comm->inline_busy)) gw__waiter_pause(&w); /* seq_cst: against the caller's pending check */
    struct gw_errctx err = {{0}};
    req->result = req->op.ordered ? gw__dev_run(comm, &req->op, &err) : gw__run_op(comm, &req->op, &err);
    bool detached = req->detached;
    if (req->result != GW_SUCCESS && !detached && err.msg[0]) req->msg = strdup(err.msg);
    /* Not pending any more before it is seen done: a waiter that then finds
     * pending 0 may run the communicator inline (the bucketer's failure
     * notice does; finding it still 1 it fell back to an abort, and the peers
     * were told late and without the reason). */
    atomic_fetch_sub(&comm->pending, 1);
    if (test_pause_us > 0) usleep((useconds_t)test_pause_us);
    atomic_store_explicit(&req->done, 1, memory_order_release);
    if (detached) free(req);

    pthread_mutex_lock(&comm->mu);
    pthread_cond_broadcast(&comm->done_cv);
  }
  pthread_mutex_unlock(&comm->mu);
  return NULL;
}

void gw__progress_stop(struct gw_comm *comm) {
  pthread_mutex_lock(&comm->mu);
  comm->shutdown = true;
  atomic_store(&comm->stopping, true);
  pthread_cond_broadcast(&comm->work_cv);
  bool started = comm->thread_started;
  pthread_mutex_unlock(&comm->mu);
  if (started) pthread_join(comm->thread, NULL);
}

/* ---- argument checks --------------------------------------------------------------- */
static gw_result_t bad_arg(struct gw_comm *comm, const char *fmt, const char *fn, const char *detail) {
  char msg[GW_ERRMSG_MAX];
  snprintf(msg, sizeof msg, fmt, comm ? comm->rank : -1, fn, detail);
  struct gw_errctx err;
  gw_result_t res = gw__err(&err, GW_ERR_INVALID_ARGUMENT, "%s", msg);
  gw__comm_set_error(comm, err.msg);
  return res;
}

static gw_result_t check_args(struct gw_comm *comm, const char *fn, struct gw_op *op, void *stream,
                              size_t send_elems, size_t recv_elems) {
  char detail[200];
  if (!comm) return bad_arg(NULL, "rank %d: %s: %s", fn, "comm is NULL (was gw_comm_init successful?)");
  if (op->desc.coll == GW_COLL_BROADCAST && (op->desc.root < 0 || op->desc.root >= comm->nranks)) {
    snprintf(detail, sizeof detail, "root %d is not a rank of this %d-rank communicator", op->desc.root, comm->nranks);
    return bad_arg(comm, "rank %d: %s: %s", fn, detail);
  }
  size_t es = gw_dtype_size((gw_dtype_t)op->desc.dtype);
  if (op->desc.count > (SIZE_MAX / 2) / (es ? es : 1) / (size_t)comm->nranks) {
    snprintf(detail, sizeof detail, "count %llu is too large", (unsigned long long)op->desc.count);
    return bad_arg(comm, "rank %d: %s: %s", fn, detail);
  }
  if (send_elems > 0 && op->sendbuf == NULL) return bad_arg(comm, "rank %d: %s: %s", fn, "sendbuf is NULL with count > 0");
  if (recv_elems > 0 && op->recvbuf == NULL) return bad_arg(comm, "rank %d: %s: %s", fn, "recvbuf is NULL with count > 0");
  /* Elements at addresses of their size, as C's own pointers to them: the
   * reduction kernels read them as such (undefined otherwise, and a vectorized
   * loop peeled for alignment may fault). */
  const char *which = send_elems && (uintptr_t)op->sendbuf % es ? "sendbuf"
                      : recv_elems && (uintptr_t)op->recvbuf % es ? "recvbuf" : NULL;
  if (which) {
    snprintf(detail, sizeof detail, "%s %p is not aligned to its %zu-byte elements", which,
             which[0] == 's' ? op->sendbuf : op->recvbuf, es);
    return bad_arg(comm, "rank %d: %s: %s", fn, detail);
  }
  /* Partial overlap of send and receive buffers would corrupt data silently.
   * Equal pointers are in place for allreduce and broadcast; for allgather and
   * reduce_scatter only on rank 0 (their in-place layout puts this rank's
   * part at its offset), elsewhere they overlap. */
  const bool gathers = op->desc.coll == GW_COLL_ALLGATHER || op->desc.coll == GW_COLL_REDUCE_SCATTER;
  if (send_elems && recv_elems && (op->sendbuf != op->recvbuf || gathers)) {
    const char *s = op->sendbuf, *r = op->recvbuf;
    size_t sb = send_elems * es, rb = recv_elems * es;
    bool overlap = s < r + rb && r < s + sb;
    bool in_place = false;
    if (op->desc.coll == GW_COLL_ALLGATHER) in_place = s == r + (size_t)comm->rank * sb;
    if (op->desc.coll == GW_COLL_REDUCE_SCATTER) in_place = r == s + (size_t)comm->rank * rb;
    if (overlap && !in_place)
      return bad_arg(comm, "rank %d: %s: %s", fn,
                     "send and receive buffers overlap without being the in-place layout");
  }
  /* Host or device memory, and the stream: after the checks above, so a NULL
   * buffer is reported as such. */
  struct gw_errctx err;
  gw_result_t res = gw__dev_check(comm, fn, op, stream, send_elems, recv_elems, &err);
  if (res != GW_SUCCESS) gw__comm_set_error(comm, err.msg);
  return res;
}

/* Checked before the values are narrowed into the operation descriptor. */
static gw_result_t check_enums(struct gw_comm *comm, const char *fn, int dtype, int op) {
  char detail[64];
  if (dtype < 0 || dtype >= GW_NUM_DTYPES) {
    snprintf(detail, sizeof detail, "unknown dtype %d", dtype);
    return bad_arg(comm, "rank %d: %s: %s", fn, detail);
  }
  if (op < 0 || op >= GW_NUM_OPS) {
    snprintf(detail, sizeof detail, "unknown reduction op %d", op);
    return bad_arg(comm, "rank %d: %s: %s", fn, detail);
  }
  return GW_SUCCESS;
}

/* ---- execution --------------------------------------------------------------------- */
/* A request done with: its own failure is the communicator's last error
 * again for the caller (requests queued after it, refused, replaced it). */
static gw_result_t free_request(struct gw_comm *comm, struct gw_request *req, gw_result_t res) {
  if (res != GW_SUCCESS && res == req->result && req->msg) gw__comm_set_error(comm, req->msg);
  free(req->msg);
  free(req);
  return res;
}

static gw_result_t wait_request(struct gw_comm *comm, struct gw_request *req) {
  bool done = false;
  for (int i = 0; i < 4000 && !done; i++) {
    done = atomic_load_explicit(&req->done, memory_order_acquire);
    if (!done) gw__cpu_relax();
  }
  if (!done) {
    pthread_mutex_lock(&comm->mu);
    while (!atomic_load_explicit(&req->done, memory_order_acquire)) pthread_cond_wait(&comm->done_cv, &comm->mu);
    pthread_mutex_unlock(&comm->mu);
  }
  /* Device memory with no stream: done for the caller once the default
   * stream copied the result out too. */
  if (req->result == GW_SUCCESS && !gw__dev_settled(comm, &req->op)) return gw__dev_settle(comm, &req->op);
  return req->result;
}

/* The progress thread, at the first call that queues.  Failing, the call
 * cannot run, nor can any later one that queues: the communicator fails and
 * the peers are told by the caller (it was this rank's error alone, and its
 * peers, already in the call, waited out GW_TIMEOUT and blamed it for not
 * starting it). */
static gw_result_t start_thread_locked(struct gw_comm *comm, struct gw_errctx *err) {
  if (comm->thread_started) return GW_SUCCESS;
  const int e = pthread_create(&comm->thread, NULL, progress_main, comm);
  if (e)
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot start the progress thread of its non-blocking and "
                   "stream-ordered calls: %s%s", comm->rank, strerror(e), gw__thread_limit_hint(e));
  comm->thread_started = true;
  return GW_SUCCESS;
}

const char *gw__thread_limit_hint(int e) {
  return e == EAGAIN ? " (this user's or container's limit on threads: ulimit -u, the cgroup's pids.max, "
                       "kernel.threads-max; or no memory for the thread's stack: ulimit -v, vm.max_map_count)"
                     : "";
}

/* Tests: GW_TEST_INLINE_PAUSE_US, a pause after a blocking call claims the
 * inline path (over early once another call queued); GW_TEST_INLINE_HOLD_US,
 * one after it ran, before it lets the connections go.  Either is over early
 * once the communicator is aborted, and says it is on (comm->test_paused): a
 * test waits for that and then acts, its bound long, instead of racing a
 * short pause with a sleep of its own.  A variable set at the first call is
 * read again at every call (a test's rank sets it for one call alone); one
 * absent then is never looked at again. */
static int64_t test_us(_Atomic int *armed, const char *name) {
  int a = atomic_load_explicit(armed, memory_order_relaxed);
  if (a < 0) {
    const char *v = getenv(name); /* empty: unset, as everywhere in the library */
    atomic_store_explicit(armed, a = v && *v, memory_order_relaxed);
  }
  return a ? gw__env_int(name, 0) : 0;
}

static int64_t inline_pause_us(void) {
  static _Atomic int armed = -1;
  return test_us(&armed, "GW_TEST_INLINE_PAUSE_US");
}

static int64_t inline_hold_us(void) {
  static _Atomic int armed = -1;
  return test_us(&armed, "GW_TEST_INLINE_HOLD_US");
}

static void test_pause(struct gw_comm *comm, int64_t us, bool until_queued) {
  atomic_store(&comm->test_paused, 1);
  for (const double end = gw__now() + (double)us / 1e6;
       gw__now() < end && !atomic_load(&comm->aborted) && !(until_queued && atomic_load(&comm->pending) != 0);)
    usleep(1000);
  atomic_store(&comm->test_paused, 0);
}

/* The next n sequence numbers.  Every taker holds comm->mu, so no locked
 * read-modify-write: other threads only read the counter (an abort notice's). */
static uint64_t take_seq_locked(struct gw_comm *comm, uint64_t n) {
  uint64_t seq = atomic_load_explicit(&comm->next_seq, memory_order_relaxed);
  atomic_store_explicit(&comm->next_seq, seq + n, memory_order_relaxed);
  return seq;
}

/* ---- live handles ---------------------------------------------------------------------------
 * The requests handed out and not yet completed by gw_wait / gw_test, per
 * process.  A handle waited for twice (a copy of it, or two threads waiting
 * on one) is refused by name instead of freed twice: gw_wait and gw_test take
 * it out of the table before touching it, and only the one that took it goes
 * on (gw_test puts back one not done).  A handle is not the request's
 * address but a number never given out before (a copy of a completed handle
 * matched a new request that got the freed address, and waited for it), looked
 * up here: the count of requests, through a bijection keyed per process (as
 * 1, 2, 3..., the likeliest garbage values, an uninitialised handle waited
 * for completed another caller's request, whose own wait was then refused). */
#define LIVE_BUCKETS 256
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gw_request *live[LIVE_BUCKETS];
static uint64_t live_next_id = 1; /* under live_mu */
static uint64_t live_key;          /* set once (live_fork_once) */

static struct gw_request **live_bucket(uint64_t id) { return &live[(uint32_t)(id * 0x9E3779B1u) >> 24]; }

/* Held across fork, so a child's gw_wait (refused) does not find it locked
 * for good by a parent's thread. */
static void live_fork_prepare(void) { pthread_mutex_lock(&live_mu); }
static void live_fork_after(void) { pthread_mutex_unlock(&live_mu); }
static pthread_once_t live_fork_once = PTHREAD_ONCE_INIT;
static void live_fork_install(void) {
  pthread_atfork(live_fork_prepare, live_fork_after, live_fork_after);
  uint64_t k = 0;
  if (getrandom(&k, sizeof k, GRND_NONBLOCK) != (ssize_t)sizeof k) /* no entropy yet: the clock and pid */
    k = ((uint64_t)gw__clock_bits() << 32 | gw__clock_bits()) | 1;
  live_key = k;
}

/* The n-th request's handle: n times an odd number (a bijection mod 2^64),
 * xor the key, within a pointer's width; never 0 (NULL: no request). */
static uint64_t live_id(uint64_t n) { return ((n * 0x9E3779B97F4A7C15ull) ^ live_key) & (uint64_t)UINTPTR_MAX; }

/* Into the table (a new request gets its number: the handle). */
static void live_add(struct gw_request *req) {
  pthread_once(&live_fork_once, live_fork_install);
  pthread_mutex_lock(&live_mu);
  while (!req->id) req->id = live_id(live_next_id++);
  struct gw_request **b = live_bucket(req->id);
  req->live_next = *b, *b = req;
  pthread_mutex_unlock(&live_mu);
}

static gw_request_t handle_of(const struct gw_request *req) { return (gw_request_t)(uintptr_t)req->id; }

/* Takes handle h's request out of the table: NULL if it is not there. */
static struct gw_request *live_take(gw_request_t h) {
  const uint64_t id = (uint64_t)(uintptr_t)h;
  struct gw_request *found = NULL;
  pthread_mutex_lock(&live_mu);
  for (struct gw_request **p = live_bucket(id); *p; p = &(*p)->live_next)
    if ((*p)->id == id) {
      found = *p, *p = found->live_next;
      break;
    }
  pthread_mutex_unlock(&live_mu);
  return found;
}

static gw_result_t not_live(const char *fn, const void *req) {
  char msg[GW_ERRMSG_MAX];
  snprintf(msg, sizeof msg, "%s: request %p is not a live request: completed already (by gw_wait or gw_test, "
           "through a copy of the handle), being waited for or tested on another thread, or not a handle from a "
           "non-blocking call", fn, req);
  gw__set_thread_error(msg);
  return GW_ERR_INVALID_ARGUMENT;
}

/* Blocking: runs inline when nothing is queued or running (no lock, no thread
 * handoff on the latency path), else queues behind the earlier operations and
 * waits.  Non-blocking (reqp != NULL): queues for the progress thread.  Like an
 * NCCL communicator, one communicator is driven by one thread at a time; calls
 * from several threads at once need the caller's own ordering (across ranks),
 * but never run at once here: a blocking call that finds another thread's
 * running inline queues behind it (two inline at once shared the connections'
 * unsynchronized state: a slot claimed twice, chunks under the other call's
 * header). */
static gw_result_t submit(struct gw_comm *comm, struct gw_op *op, gw_request_t *reqp) {
  if (!reqp && !op->ordered && atomic_load(&comm->pending) == 0 && !atomic_exchange(&comm->inline_busy, true)) {
    const int64_t pause_us = inline_pause_us();
    if (pause_us > 0) test_pause(comm, pause_us, true); /* tests: another thread queues meanwhile */
    /* Re-check after announcing: the progress thread waits for inline_busy to
     * clear before it starts anything queued meanwhile.  The check and the
     * sequence number under the queue's lock, as a queued call takes its own:
     * else a call queued in between took the number before this one's and
     * ran after it (ranks pair calls by number: "calls differ"). */
    pthread_mutex_lock(&comm->mu);
    const bool alone = atomic_load(&comm->pending) == 0;
    if (alone) op->desc.seq = take_seq_locked(comm, 1);
    pthread_mutex_unlock(&comm->mu);
    if (alone) {
      struct gw_errctx err; /* 512 bytes: only the message's end is set, not the whole */
      err.msg[0] = 0;
      gw_result_t res = gw__run_op(comm, op, &err);
      const int64_t hold_us = inline_hold_us();
      if (hold_us > 0) test_pause(comm, hold_us, false);
      atomic_store_explicit(&comm->inline_busy, false, memory_order_release);
      return res;
    }
    atomic_store(&comm->inline_busy, false);
  }
  gw_result_t res;
  struct gw_request *req = calloc(1, sizeof *req);
  if (!req) {
    struct gw_errctx err;
    gw__err(&err, GW_ERR_SYSTEM, "rank %d: out of memory for an operation's request", comm->rank);
    gw__comm_set_error(comm, err.msg);
    return GW_ERR_SYSTEM;
  }
  /* A stream-ordered call on a communicator known to have failed is refused
   * here, naming the first error, as NCCL refuses a call on a communicator
   * with an asynchronous error: queued, the progress thread refused it, and
   * the call returned success with its stream let through and nothing reduced
   * (the error only in the log and gw_comm_get_async_error). */
  if (op->ordered && atomic_load(&comm->failed)) {
    struct gw_errctx err;
    free(req);
    return gw__refuse_if_failed(comm, op, &err);
  }
throttled:
  if (op->ordered && (res = gw__dev_throttle(comm)) != GW_SUCCESS) {
    free(req);
    return res;
  }
  pthread_mutex_lock(&comm->mu);
  struct gw_errctx terr;
  res = start_thread_locked(comm, &terr);
  if (res != GW_SUCCESS) {
    pthread_mutex_unlock(&comm->mu);
    free(req);
    gw__comm_fail_caller(comm, res, &terr);
    return res;
  }
  if (op->ordered) {
    /* Stream-ordered: a ticket now, in the same order as the queue; the
     * stream's work goes on it once the operation is queued (below). */
    struct gw_errctx err;
    res = gw__dev_reserve_locked(comm, op, &err);
    if (res == GW_INPROGRESS) { /* another thread's call took the ticket the throttle cleared: again */
      pthread_mutex_unlock(&comm->mu);
      goto throttled;
    }
    if (res != GW_SUCCESS) {
      pthread_mutex_unlock(&comm->mu);
      gw__comm_set_error(comm, err.msg);
      free(req);
      return res;
    }
    /* With a stream and no request nobody waits: the call returns now. */
    req->detached = !reqp && op->stream;
  }
  atomic_fetch_add(&comm->pending, 1);
  op->desc.seq = take_seq_locked(comm, op->ordered ? gw__dev_npieces(comm, op) : 1);
  req->op = *op;
  req->comm = comm;
  bool detached = req->detached;
  gw_result_t enqueued = GW_SUCCESS;
  if (comm->q_tail) comm->q_tail->next = req;
  else comm->q_head = req;
  comm->q_tail = req;
  pthread_cond_signal(&comm->work_cv);
  pthread_mutex_unlock(&comm->mu);
  if (op->ordered) {
    /* Queued first: a full stream queue may block these launches until the
     * stream runs, and the stream may wait for the progress thread to run
     * this very operation (the staging's pieces).  A failure here is the
     * operation's too (the progress thread fails it). */
    struct gw_errctx err;
    enqueued = gw__dev_enqueue(comm, op, &err);
    if (enqueued != GW_SUCCESS) {
      gw__comm_set_error(comm, err.msg);
      if (detached) return enqueued;
    }
  }
  if (detached) return GW_SUCCESS; /* req may be gone already */
  if (reqp) {
    atomic_fetch_add(&comm->requests, 1); /* until gw_wait / gw_test frees it */
    live_add(req);
    *reqp = handle_of(req);
    return GW_SUCCESS;
  }
  res = free_request(comm, req, wait_request(comm, req));
  /* Its stream's part could not all be queued: the call failed, whatever
   * the host's part did. */
  return res == GW_SUCCESS && op->ordered ? enqueued : res;
}

/* dtype and op as the caller gave them (op->desc holds them narrowed).  Every
 * refusal that writes the communicator's error comes after the gate: one
 * racing destroy wrote into a communicator being freed, and a forked child's
 * locked its parent's copy of the error lock. */
static gw_result_t launch(struct gw_comm *comm, const char *fn, struct gw_op *op, int dtype, int red_op, void *stream,
                          size_t send_elems, size_t recv_elems, gw_request_t *reqp, bool nonblocking) {
  if (reqp) *reqp = NULL;
  if (comm) GW_CHECK(gw__comm_enter(comm, fn));
  gw_result_t res = nonblocking && !reqp ? bad_arg(comm, "rank %d: %s: %s", fn, "the request pointer is NULL")
                                         : check_enums(comm, fn, dtype, red_op);
  if (res == GW_SUCCESS) res = check_args(comm, fn, op, stream, send_elems, recv_elems);
  if (res == GW_SUCCESS) {
    gw__comm_algo_setting(comm, &op->want_algo, &op->want_proto);
    res = submit(comm, op, reqp);
  }
  if (comm) gw__comm_leave(comm);
  return res;
}

/* A non-blocking call's handle is NULL whenever it is refused (a caller's
 * cleanup may wait for it). */
static void clear_req(gw_request_t *req) {
  if (req) *req = NULL;
}

#define NOARG
#define REQARG , gw_request_t *req
#define OPDESC(COLL, COUNT, DT, OP, ROOT) \
  {.desc = {.count = (COUNT), .root = (ROOT), .coll = (COLL), .dtype = (uint8_t)(DT), .op = (uint8_t)(OP)}}

static size_t nranks_of(gw_comm_t comm) { return comm ? (size_t)comm->nranks : 1; }

static gw_result_t allreduce_call(const char *fn, const void *sendbuf, void *recvbuf, size_t count, gw_dtype_t dtype,
                                  gw_op_t op, gw_comm_t comm, void *stream, gw_request_t *req, bool nb, int32_t tag,
                                  uint8_t marks) {
  struct gw_op o = OPDESC(GW_COLL_ALLREDUCE, count, dtype, op, tag);
  o.desc.pad = marks;
  o.sendbuf = sendbuf;
  o.recvbuf = recvbuf;
  clear_req(req); /* refused below too: no stale handle */
  return launch(comm, fn, &o, (int)dtype, (int)op, stream, count, count, req, nb);
}

gw_result_t gw_allreduce(const void *sendbuf, void *recvbuf, size_t count, gw_dtype_t dtype, gw_op_t op,
                         gw_comm_t comm, void *stream) {
  return allreduce_call("gw_allreduce", sendbuf, recvbuf, count, dtype, op, comm, stream, NULL, false, -1, 0);
}

gw_result_t gw_iallreduce(const void *sendbuf, void *recvbuf, size_t count, gw_dtype_t dtype, gw_op_t op,
                          gw_comm_t comm, void *stream, gw_request_t *req) {
  return allreduce_call("gw_iallreduce", sendbuf, recvbuf, count, dtype, op, comm, stream, req, true, -1, 0);
}

gw_result_t gw__iallreduce_tagged(const void *sendbuf, void *recvbuf, size_t count, gw_dtype_t dtype, gw_op_t op,
                                  gw_comm_t comm, void *stream, gw_request_t *req, int32_t tag, uint8_t marks) {
  return allreduce_call("gw_iallreduce", sendbuf, recvbuf, count, dtype, op, comm, stream, req, true, tag, marks);
}

gw_result_t gw__iallreduce_widened(float *buf, void *wire_buf, size_t count, gw_dtype_t wire, gw_op_t op, float scale,
                                   gw_comm_t comm, gw_request_t *req, int32_t tag, uint8_t marks) {
  struct gw_op o = OPDESC(GW_COLL_ALLREDUCE, count, wire, op, tag);
  o.desc.pad = marks;
  o.sendbuf = o.recvbuf = buf;
  o.widened = true, o.scale = scale, o.wire_buf = wire_buf;
  clear_req(req);
  return launch(comm, "gw_iallreduce", &o, (int)wire, (int)op, NULL, count, count, req, true);
}

#define DEFINE_BROADCAST(NAME, REQ_PARAM, REQ, NB)                                                      \
  gw_result_t NAME(const void *sendbuf, void *recvbuf, size_t count, gw_dtype_t dtype, int root,       \
                   gw_comm_t comm, void *stream REQ_PARAM) {                                          \
    struct gw_op o = OPDESC(GW_COLL_BROADCAST, count, dtype, 0, root);                                \
    o.sendbuf = sendbuf;                                                                              \
    o.recvbuf = recvbuf;                                                                              \
    clear_req(REQ); /* refused below too: no stale handle */                                          \
    bool is_root = comm && comm->rank == root;                                                        \
    return launch(comm, #NAME, &o, (int)dtype, 0, stream, is_root ? count : 0, count, REQ, NB);                      \
  }
DEFINE_BROADCAST(gw_broadcast, NOARG, NULL, false)
DEFINE_BROADCAST(gw_ibroadcast, REQARG, req, true)

#define DEFINE_ALLGATHER(NAME, REQ_PARAM, REQ, NB)                                                      \
  gw_result_t NAME(const void *sendbuf, void *recvbuf, size_t sendcount, gw_dtype_t dtype,             \
                   gw_comm_t comm, void *stream REQ_PARAM) {                                          \
    struct gw_op o = OPDESC(GW_COLL_ALLGATHER, sendcount, dtype, 0, -1);                              \
    o.sendbuf = sendbuf;                                                                              \
    o.recvbuf = recvbuf;                                                                              \
    clear_req(REQ); /* refused below too: no stale handle */                                          \
    return launch(comm, #NAME, &o, (int)dtype, 0, stream, sendcount, sendcount * nranks_of(comm), REQ, NB);          \
  }
DEFINE_ALLGATHER(gw_allgather, NOARG, NULL, false)
DEFINE_ALLGATHER(gw_iallgather, REQARG, req, true)

#define DEFINE_REDUCE_SCATTER(NAME, REQ_PARAM, REQ, NB)                                                 \
  gw_result_t NAME(const void *sendbuf, void *recvbuf, size_t recvcount, gw_dtype_t dtype, gw_op_t op, \
                   gw_comm_t comm, void *stream REQ_PARAM) {                                          \
    struct gw_op o = OPDESC(GW_COLL_REDUCE_SCATTER, recvcount, dtype, op, -1);                        \
    o.sendbuf = sendbuf;                                                                              \
    o.recvbuf = recvbuf;                                                                              \
    clear_req(REQ); /* refused below too: no stale handle */                                          \
    return launch(comm, #NAME, &o, (int)dtype, (int)op, stream, recvcount * nranks_of(comm), recvcount, REQ, NB);          \
  }
DEFINE_REDUCE_SCATTER(gw_reduce_scatter, NOARG, NULL, false)
DEFINE_REDUCE_SCATTER(gw_ireduce_scatter, REQARG, req, true)

gw_result_t gw_barrier(gw_comm_t comm) {
  struct gw_op o = OPDESC(GW_COLL_BARRIER, 0, GW_INT8, GW_SUM, -1);
  return launch(comm, "gw_barrier", &o, GW_INT8, GW_SUM, NULL, 0, 0, NULL, false);
}

gw_result_t gw_ibarrier(gw_comm_t comm, gw_request_t *req) {
  struct gw_op o = OPDESC(GW_COLL_BARRIER, 0, GW_INT8, GW_SUM, -1);
  return launch(comm, "gw_ibarrier", &o, GW_INT8, GW_SUM, NULL, 0, 0, req, true);
}

/* ---- requests ----------------------------------------------------------------------- */
gw_result_t gw_wait(gw_request_t *reqp) {
  if (!reqp) return gw__set_thread_error("gw_wait: a NULL request pointer"), GW_ERR_INVALID_ARGUMENT;
  if (!*reqp) return GW_SUCCESS;
  struct gw_request *req = live_take(*reqp);
  if (!req) return not_live("gw_wait", *reqp);
  /* No deadline here: the operation itself enforces GW_TIMEOUT. */
  struct gw_comm *comm = req->comm;
  gw_result_t entered = gw__comm_enter(comm, "gw_wait");
  if (entered != GW_SUCCESS) {
    live_add(req); /* still the caller's (a forked child's refusal; destroy waits for it) */
    return entered;
  }
  gw_result_t res = free_request(comm, req, wait_request(comm, req));
  atomic_fetch_sub(&comm->requests, 1);
  gw__comm_leave(comm);
  *reqp = NULL;
  return res;
}

gw_result_t gw_test(gw_request_t *reqp, int *done) {
  if (!reqp || !done) return gw__set_thread_error("gw_test: a NULL argument"), GW_ERR_INVALID_ARGUMENT;
  if (!*reqp) {
    *done = 1;
    return GW_SUCCESS;
  }
  *done = 0;
  struct gw_request *req = live_take(*reqp);
  if (!req) return not_live("gw_test", *reqp);
  struct gw_comm *comm = req->comm;
  gw_result_t entered = gw__comm_enter(comm, "gw_test");
  if (entered != GW_SUCCESS) {
    live_add(req);
    return entered;
  }
  if (!atomic_load_explicit(&req->done, memory_order_acquire)) {
    live_add(req);
    gw__comm_leave(comm);
    return GW_SUCCESS;
  }
  /* Device memory with no stream: done once the default stream copied the
   * result out, or given up on as gw_wait would (aborted, or the timeout
   * since this call first saw the rest done): polling must end too. */
  gw_result_t res = req->result;
  if (res == GW_SUCCESS && !gw__dev_settled(comm, &req->op)) {
    bool settled = false;
    if (!req->unsettled_since) req->unsettled_since = gw__now(), req->unsettled_limit = comm->timeout_s;
    res = gw__dev_settle_look(comm, &req->op, req->unsettled_since, req->unsettled_limit, &settled);
    if (res == GW_SUCCESS && !settled) {
      live_add(req);
      gw__comm_leave(comm);
      return GW_SUCCESS;
    }
  }
  *done = 1;
  res = free_request(comm, req, res);
  *reqp = NULL;
  atomic_fetch_sub(&comm->requests, 1);
  gw__comm_leave(comm);
  return res;
}
