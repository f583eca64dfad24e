/* comm_calls.c - the communicator's small calls of the public API: its
 * accessors (rank, sizes, device, async error, last path), its settings
 * (algorithm, timeout) and what a call's choice starts from (gw__pick_base),
 * gw_comm_abort, and buffer registration.  The
 * lifecycle (init, destroy and what destroy refuses) is comm.c's, the
 * collectives enqueue.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "comm.h"

/* A NULL argument of an API call: GW_ERR_INVALID_ARGUMENT with the call named
 * (in comm's message when there is a communicator, else this thread's). */
static gw_result_t null_argument(gw_comm_t comm, const char *fn) {
  char msg[160];
  snprintf(msg, sizeof msg, "%s: a NULL %s", fn, comm ? "argument" : "communicator");
  if (comm) gw__comm_set_error(comm, msg);
  else gw__set_thread_error(msg);
  return GW_ERR_INVALID_ARGUMENT;
}

/* The accessors' start: the destroy gate, then the output pointer, whose
 * refusal goes into comm's message only once the gate let the call in
 * (before it, a call racing destroy wrote into a communicator being freed;
 * a forked child's goes to its thread's, gw__comm_set_error).  GW_SUCCESS
 * holds the peek. */
static gw_result_t peek_out(gw_comm_t comm, const void *out, const char *fn) {
  if (!comm) return null_argument(NULL, fn);
  if (!gw__comm_peek(comm, fn)) return GW_ERR_INVALID_ARGUMENT;
  if (out) return GW_SUCCESS;
  null_argument(comm, fn);
  gw__comm_unpeek(comm);
  return GW_ERR_INVALID_ARGUMENT;
}

void gw__abort_reason(struct gw_comm *comm, char *out, size_t len) {
  pthread_mutex_lock(&comm->err_mu);
  snprintf(out, len, "%s", comm->abort_reason[0] ? comm->abort_reason : "aborted by gw_comm_abort");
  pthread_mutex_unlock(&comm->err_mu);
}

_Static_assert(ATOMIC_BOOL_LOCK_FREE == 2, "gw_comm_abort's flag must be lock-free (async-signal-safe)");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "gw_comm_abort's count must be lock-free (async-signal-safe)");
_Static_assert(ATOMIC_POINTER_LOCK_FREE == 2, "gw_comm_abort's test hook must be lock-free (async-signal-safe)");

gw_result_t gw_comm_abort(gw_comm_t comm) {
  if (!comm) return GW_ERR_INVALID_ARGUMENT; /* (no message: nothing here may lock or print) */
  /* No gate: from any thread, any time before the free, and from a signal
   * handler: lock-free atomics alone (it logged here, and a handler that
   * interrupted a thread inside the logger's lock deadlocked).  The operations
   * it stops say so, and destroy does.  One being destroyed or destroyed
   * (its gate, which outlives the free, says GOING) is refused, not a
   * success, but the flag is set still while a destroy is under way: it
   * tells the peers.  Not once destroyed (FREE): the memory may be making the
   * next communicator, which a stale handle's abort must leave alone.  A
   * forked child's copy is refused too (its calls are; nothing reaches the
   * parent's peers). */
  if (gw__comm_forked_away(comm)) return GW_ERR_INVALID_ARGUMENT;
  atomic_fetch_add(&comm->aborting, 1); /* the next communicator here opens once we are out (comm.h) */
  const int state = atomic_load(&comm->destroying);
  if (state != GW_DESTROY_FREE) {
    void (*gap)(void) = atomic_load(&gw__abort_gap_hook);
    if (gap) gap();
    atomic_store(&comm->aborted, true);
  }
  atomic_fetch_sub(&comm->aborting, 1);
  return state == GW_DESTROY_NO || state == GW_DESTROY_CHECKING ? GW_SUCCESS : GW_ERR_INVALID_ARGUMENT;
}

void (*_Atomic gw__abort_gap_hook)(void);

gw_result_t gw_comm_rank(gw_comm_t comm, int *rank) {
  gw_result_t res = peek_out(comm, rank, "gw_comm_rank");
  if (res != GW_SUCCESS) return res;
  *rank = comm->rank;
  gw__comm_unpeek(comm);
  return GW_SUCCESS;
}

gw_result_t gw_comm_local_rank(gw_comm_t comm, int *local_rank) {
  gw_result_t res = peek_out(comm, local_rank, "gw_comm_local_rank");
  if (res != GW_SUCCESS) return res;
  *local_rank = comm->local_rank;
  gw__comm_unpeek(comm);
  return GW_SUCCESS;
}

gw_result_t gw_comm_local_size(gw_comm_t comm, int *local_size) {
  gw_result_t res = peek_out(comm, local_size, "gw_comm_local_size");
  if (res != GW_SUCCESS) return res;
  *local_size = comm->local_size > 0 ? comm->local_size : 1;
  gw__comm_unpeek(comm);
  return GW_SUCCESS;
}

gw_result_t gw_comm_device(gw_comm_t comm, int *device) {
  gw_result_t res = peek_out(comm, device, "gw_comm_device");
  if (res != GW_SUCCESS) return res;
  *device = comm->device;
  gw__comm_unpeek(comm);
  return GW_SUCCESS;
}

gw_result_t gw_comm_get_async_error(gw_comm_t comm, gw_result_t *async_error) {
  gw_result_t res = peek_out(comm, async_error, "gw_comm_get_async_error");
  if (res != GW_SUCCESS) return res;
  *async_error = (gw_result_t)atomic_load(&comm->failed);
  gw__comm_unpeek(comm);
  return GW_SUCCESS;
}

gw_result_t gw_comm_size(gw_comm_t comm, int *size) {
  gw_result_t res = peek_out(comm, size, "gw_comm_size");
  if (res != GW_SUCCESS) return res;
  *size = comm->nranks;
  gw__comm_unpeek(comm);
  return GW_SUCCESS;
}

/* Atomic loads of plain fields, here rather than in launch: there gcc 12 sees
 * a communicator that may be NULL and reports a -Wstringop-overflow false
 * positive on an atomic load (or on an _Atomic field). */
void gw__comm_algo_setting(const struct gw_comm *comm, int8_t *algo, int8_t *proto) {
  *algo = (int8_t)__atomic_load_n(&comm->algo, __ATOMIC_RELAXED);
  *proto = (int8_t)__atomic_load_n(&comm->proto, __ATOMIC_RELAXED);
}

gw_result_t gw_comm_set_algo(gw_comm_t comm, const char *algo, const char *proto) {
  if (!comm) return null_argument(NULL, "gw_comm_set_algo");
  GW_CHECK(gw__comm_enter(comm, "gw_comm_set_algo")); /* not on a communicator being freed, nor a parent's copy */
  if (!algo || !proto) {
    null_argument(comm, "gw_comm_set_algo");
    gw__comm_leave(comm);
    return GW_ERR_INVALID_ARGUMENT;
  }
  int a = gw__algo_from_name(algo), p = gw__proto_from_name(proto);
  struct gw_errctx err;
  gw_result_t res = GW_SUCCESS;
  if (a < 0 || p == -1)
    res = gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: gw_comm_set_algo: '%s' / '%s' is not an algorithm "
                  "(auto, ring, tree, exchange) / protocol (auto, simple, ll)", comm->rank, algo, proto);
  else if ((a == GW_ALGO_TREE && !comm->tree_ok && comm->nranks > 1) || (a == GW_ALGO_EXCHANGE && comm->nranks > 2 && !comm->rd_ok) ||
           (p == GW_PROTO_LL && !comm->ll_chunk_bytes && comm->nranks > 1))
    res = gw__err(&err, GW_ERR_UNSUPPORTED, "rank %d: gw_comm_set_algo: %s/%s is not available on this "
                  "communicator (tree: made with GW_ALGO auto or tree; exchange: 2 ranks, or made with GW_ALGO auto or "
                  "exchange; ll: shm only)",
                  comm->rank, algo, proto);
  if (res != GW_SUCCESS) {
    gw__comm_set_error(comm, err.msg);
    gw__comm_leave(comm);
    return res;
  }
  /* Other threads may be starting calls (gw__comm_algo_setting): atomic
   * stores.  A call racing this may pair the new algorithm with the old
   * protocol: every pair of settings allowed here is valid. */
  __atomic_store_n(&comm->algo, (enum gw_algo)a, __ATOMIC_RELAXED);
  __atomic_store_n(&comm->proto, p < 0 ? -1 : p, __ATOMIC_RELAXED);
  gw__comm_leave(comm);
  return GW_SUCCESS;
}

gw_result_t gw_comm_last_path(gw_comm_t comm, char *buf, size_t len) {
  gw_result_t res = peek_out(comm, buf, "gw_comm_last_path");
  if (res != GW_SUCCESS) return res;
  if (!len) {
    gw__comm_set_error(comm, "gw_comm_last_path: len is 0 (room for at least the terminating NUL is needed)");
    gw__comm_unpeek(comm);
    return GW_ERR_INVALID_ARGUMENT;
  }
  uint32_t v = atomic_load_explicit(&comm->last_path, memory_order_relaxed);
  gw__comm_unpeek(comm);
  if (!(v >> 24)) snprintf(buf, len, "none");
  else if (v >> 16 & 1) snprintf(buf, len, "%s/device%s", gw__algo_name((int)(v & 0xff)), v >> 17 & 1 ? "-async" : "");
  else snprintf(buf, len, "%s/%s", gw__algo_name((int)(v & 0xff)), gw__proto_name((int)(v >> 8 & 0xff)));
  return GW_SUCCESS;
}

/* A registration: the transport's handle (NULL without ib), so the caller's
 * handle is never NULL after success.  The live ones are listed (per
 * process, as the transport caches them), so a handle deregistered twice,
 * or one never given out, is refused instead of freed again. */
struct gw_registration {
  void *ib;
  struct gw_registration *next;
};
static pthread_mutex_t regs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gw_registration *regs;

/* Held across fork (gw__fork_guard): a parent's thread registering at a
 * fork left it held in the child for good, whose own registration hung. */
static void regs_lock(void) {
  gw__fork_guard(&regs_mu);
  pthread_mutex_lock(&regs_mu);
}

/* Takes reg out of the live list; false if it is not there. */
static bool regs_take(struct gw_registration *reg) {
  bool found = false;
  regs_lock();
  for (struct gw_registration **p = &regs; *p; p = &(*p)->next)
    if (*p == reg) {
      *p = reg->next, found = true;
      break;
    }
  pthread_mutex_unlock(&regs_mu);
  return found;
}

gw_result_t gw_comm_register(gw_comm_t comm, void *buf, size_t bytes, void **handle) {
  if (!comm) return null_argument(comm, "gw_comm_register");
  if (handle) *handle = NULL; /* refused below too: no stale handle */
  GW_CHECK(gw__comm_enter(comm, "gw_comm_register"));
  struct gw_errctx err = {{0}};
  gw_result_t r = GW_SUCCESS;
  struct gw_registration *reg = NULL;
  if (!buf || !bytes || !handle) {
    r = gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: gw_comm_register(buf=%p, bytes=%zu, handle=%p): needs a "
                "buffer, a size and a place for the handle", comm->rank, buf, bytes, (void *)handle);
  } else if (bytes > UINTPTR_MAX - (uintptr_t)buf) { /* its end wrapped: a range ending below its start was cached */
    r = gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: gw_comm_register(buf=%p, bytes=%zu): the range runs past the "
                "end of the address space", comm->rank, buf, bytes);
  } else if (!(reg = calloc(1, sizeof *reg))) {
    r = gw__err(&err, GW_ERR_SYSTEM, "rank %d: out of memory", comm->rank);
  } else {
#if GW_HAVE_IBVERBS
    r = gw__ib_register(buf, bytes, &reg->ib, &err);
#endif
  }
  if (r != GW_SUCCESS) {
    free(reg);
    gw__comm_set_error(comm, err.msg);
    gw__comm_leave(comm);
    return r;
  }
  regs_lock();
  reg->next = regs, regs = reg;
  pthread_mutex_unlock(&regs_mu);
  *handle = reg;
  gw__comm_leave(comm);
  return GW_SUCCESS;
}

/* comm may be NULL: registrations are the process's, not a communicator's,
 * and one may outlive the communicator it was made through (its memory
 * stayed registered for good: refused for a NULL communicator). */
gw_result_t gw_comm_deregister(gw_comm_t comm, void *handle) {
  struct gw_registration *reg = handle;
  if (!reg) return GW_SUCCESS;
  if (comm) GW_CHECK(gw__comm_enter(comm, "gw_comm_deregister"));
  if (!regs_take(reg)) {
    char msg[GW_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "rank %d: gw_comm_deregister: %p is not a live registration (deregistered twice, or "
             "not a handle from gw_comm_register)", comm ? comm->rank : -1, handle);
    if (comm) {
      gw__comm_set_error(comm, msg);
      gw__comm_leave(comm);
    } else {
      gw__set_thread_error(msg);
    }
    return GW_ERR_INVALID_ARGUMENT;
  }
#if GW_HAVE_IBVERBS
  gw__ib_deregister(reg->ib);
#endif
  free(reg);
  if (comm) gw__comm_leave(comm);
  return GW_SUCCESS;
}

gw_result_t gw_comm_set_timeout(gw_comm_t comm, double seconds) {
  if (!comm) return null_argument(comm, "gw_comm_set_timeout");
  GW_CHECK(gw__comm_enter(comm, "gw_comm_set_timeout"));
  gw_result_t res = GW_SUCCESS;
  if (seconds != seconds) { /* NaN: every deadline would be off without a word */
    char msg[GW_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "rank %d: gw_comm_set_timeout: the timeout is NaN (0 waits without a limit)", comm->rank);
    gw__comm_set_error(comm, msg);
    res = GW_ERR_INVALID_ARGUMENT;
  } else {
    comm->timeout_s = seconds > 0 ? seconds : 0;
  }
  gw__comm_leave(comm);
  return res;
}

/* The exchange's cap when GW_EXCHANGE_MAX_BYTES is unset: none for 2 ranks
 * whose every connection is shm on one channel (both send everything and
 * both reduce, one hop: measured 1.6-2x the ring's bus bandwidth from 512 KiB
 * to 8 MiB and 1.1-1.5x up to 256 MiB on this machine, where the cap of 256
 * KiB had left the ring); 256 KiB otherwise (over tcp the ring was as fast or
 * faster past it; above 2 ranks recursive doubling moves log2(n) times the
 * data). */
enum { EXCHANGE_MAX_NET = 256 << 10 };
static size_t exchange_cap(const struct gw_comm *c) {
  if (c->exchange_max != SIZE_MAX) return c->exchange_max;
  /* Not oversubscribed anywhere (2 ranks on one core): each rank reduces all
   * the data where the ring's reduce half, and the cores are what is short
   * there.  The model's flag, the same on every rank (this rank's own is
   * not: the ranks would pick differently). */
  return c->nranks == 2 && c->ll_chunk_bytes > 0 && c->nchannels == 1 && !(c->model.oversub_step_us > 0)
             ? SIZE_MAX
             : EXCHANGE_MAX_NET;
}

void gw__pick_base(const struct gw_comm *c, int algo, int proto, struct gw_pick_args *a) {
  *a = (struct gw_pick_args){.nranks = c->nranks, .algo = algo, .proto = proto, .tree_ok = c->tree_ok,
                             .ll_ok = c->ll_chunk_bytes > 0, .tree_levels = c->tree_levels, .rd_ok = c->rd_ok,
                             .exchange_max = exchange_cap(c)};
}
