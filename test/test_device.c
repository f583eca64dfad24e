/* test_device.c - collectives on device memory, ordered on streams.  One
 * source, two suites:
 *   - "gpu": the real CUDA device layer.  Exits 77 (meson: skipped) when this
 *     build has no CUDA or no GPU is visible, so it is never reported passed
 *     without one.
 *   - "device-emu" (GW_DEV_EMULATE set): the same cases on the device
 *     emulator (cuda/dev_emu.c), so the stream-ordered engine, the staging
 *     pipeline and the misuse errors run on every machine.
 * Cases: "grid" (GW_TEST_NRANKS ranks: every collective, several dtypes and
 * ops, counts across staging pieces, in place and not, exact results),
 * "ordering" (the caller never blocks; slow work ahead on the stream and a
 * stream closed by a host gate; a chain of operations with one sync at the
 * end; a request from the gw_i... form), "misuse" (host and device buffers
 * mixed; another device's memory; a stream on a communicator bound to no
 * device; a stream under CUDA graph capture (emulator); the binding rule), "dead-peer" (a rank dies during stream-ordered
 * operations: the others' streams are released and the async error names
 * it), "destroy" (a communicator destroyed while its stream never reached an
 * operation gives up after the timeout and releases the stream), "bucketer"
 * (the gradient bucketer over device gradients written on its stream behind
 * slow work and marked ready at once: exact sums, three steps; and with a
 * separate compute stream the bucketer orders by events, the optimizer's work
 * on it after wait seeing the sums: test_device_bucket.c), "ipc" (a
 * device allocation mapped by another process), "teardown" (a rank frees its
 * device-ring buffers only after its predecessor unmapped them, or is gone, or
 * the wait's limit passed); test_device_settings.c's "settings" (ranks that
 * set GW_DEV_RING_MIN_BYTES, GW_DEV_STAGE_BYTES or GW_DEV_CHUNK_BYTES
 * differently still agree); and test_device_streams.c's "streams", "queues"
 * and "unqueued".  The cases of a communicator's end (a peer dies, fails,
 * destroy, teardown) are in test_device_failures.c.
 * The parent process never touches the device before forking the ranks (a
 * CUDA process cannot fork usable children). */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm.h" /* comm->devring */
#include "dev.h"
#include "devring.h" /* gw__devring_chunk */
#include "harness.h"
#include "reduce.h" /* fp16/bf16 conversions for expected values */
#include "test_device.h"

const struct gw_dev_ops *dv;

int nranks_env(void) {
  const char *e = getenv("GW_TEST_NRANKS");
  return e ? atoi(e) : 2;
}

/* ---- values ---------------------------------------------------------------------------- */
/* Small integers, so every sum, product, max and min is exact in every dtype. */
static int val(int op, int r, size_t i) {
  if (op == GW_PROD) return (int)((i + (size_t)r) % 5) - 2;
  return (int)((i * 7 + (size_t)r * 13) % 23) - 11;
}

static void store(gw_dtype_t dt, void *buf, size_t i, double v) {
  switch (dt) {
    case GW_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case GW_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case GW_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case GW_FLOAT16: ((uint16_t *)buf)[i] = gw__float_to_half((float)v); break;
    case GW_BFLOAT16: ((uint16_t *)buf)[i] = gw__float_to_bf16((float)v); break;
    case GW_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case GW_FLOAT64: ((double *)buf)[i] = v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  }
}

static double load(gw_dtype_t dt, const void *buf, size_t i) {
  switch (dt) {
    case GW_INT8: return ((const int8_t *)buf)[i];
    case GW_INT32: return ((const int32_t *)buf)[i];
    case GW_INT64: return (double)((const int64_t *)buf)[i];
    case GW_FLOAT16: return gw__half_to_float(((const uint16_t *)buf)[i]);
    case GW_BFLOAT16: return gw__bf16_to_float(((const uint16_t *)buf)[i]);
    case GW_FLOAT32: return ((const float *)buf)[i];
    case GW_FLOAT64: return ((const double *)buf)[i];
    default: return ((const uint8_t *)buf)[i];
  }
}

/* The reduction of element i over n ranks, as the dtype holds it. */
static double expect_reduce(gw_dtype_t dt, int op, int n, size_t i) {
  double acc = val(op, 0, i);
  for (int r = 1; r < n; r++) {
    double x = val(op, r, i);
    acc = op == GW_PROD ? acc * x : op == GW_MAX ? fmax(acc, x) : op == GW_MIN ? fmin(acc, x) : acc + x;
  }
  if (op != GW_AVG) return acc;
  if (!test_is_float(dt)) return (double)((long long)acc / n); /* C division, as the kernels */
  char tmp[8];
  store(dt, tmp, 0, dt == GW_FLOAT64 ? acc / n : (double)((float)acc / (float)n));
  return load(dt, tmp, 0);
}

/* ---- shared with test_device_streams.c (test_device.h) ----------------------------------- */
int one_queue(void) { return gw__dev_queues() == 1; } /* the runtime's own answer */

int warm_stream(gw_comm_t comm, int rank, size_t count, gw_dev_stream_t *s, int32_t **d) {
  DCHECK(dv->stream_create(s));
  DCHECK(dv->alloc((void **)d, count * 4));
  GWCHECK(gw_allreduce(*d, *d, count, GW_INT32, GW_SUM, comm, *s), comm);
  DCHECK(dv->stream_sync(*s));
  return 0;
}

/* ---- the grid ------------------------------------------------------------------------------ */
static const size_t grid_counts[] = {0, 1, 7, 1023, 65537, 300007};
#define MAXC 300007
static const gw_dtype_t grid_dtypes[] = {GW_INT8, GW_INT32, GW_FLOAT16, GW_BFLOAT16, GW_FLOAT32, GW_FLOAT64};

struct grid_bufs {
  char *dsend, *drecv, *hin, *hout;
  size_t bytes;
  gw_dev_stream_t s;
};

/* One call: inputs up, the collective, outputs down, then a check of every element. */
static int grid_one(gw_comm_t comm, int rank, int n, struct grid_bufs *b, int coll, gw_dtype_t dt, int op,
                    size_t count, int in_place) {
  size_t es = gw_dtype_size(dt);
  size_t in_elems = coll == 3 ? count * (size_t)n : count, out_elems = coll == 2 ? count * (size_t)n : count;
  int root = (int)(count % (size_t)n);
  char *send = b->dsend, *recv = b->drecv;
  if (in_place) {
    send = recv;
    if (coll == 2) send = recv + (size_t)rank * count * es;
    if (coll == 3) recv = send + (size_t)rank * count * es;
  }
  /* Garbage in the output first, so an unwritten element shows. */
  memset(b->hout, 0xA5, out_elems * es + 64);
  DCHECK(dv->memcpy_async(b->drecv, b->hout, (coll == 2 ? out_elems : in_elems) * es, b->s));
  for (size_t i = 0; i < in_elems; i++) store(dt, b->hin, i, val(op, rank, i));
  DCHECK(dv->memcpy_async(send, b->hin, in_elems * es, b->s));
  gw_result_t r;
  switch (coll) {
    case 0: r = gw_allreduce(send, recv, count, dt, (gw_op_t)op, comm, b->s); break;
    case 1: r = gw_broadcast(send, recv, count, dt, root, comm, b->s); break;
    case 2: r = gw_allgather(send, recv, count, dt, comm, b->s); break;
    default: r = gw_reduce_scatter(send, recv, count, dt, (gw_op_t)op, comm, b->s); break;
  }
  EXPECT(r == GW_SUCCESS, "coll %d %s count %zu: %s", coll, gw_dtype_name(dt), count, gw_comm_last_error(comm));
  DCHECK(dv->memcpy_async(b->hout, recv, out_elems * es, b->s));
  DCHECK(dv->stream_sync(b->s));
  gw_result_t async;
  EXPECT(gw_comm_get_async_error(comm, &async) == GW_SUCCESS && async == GW_SUCCESS, "async error: %s",
         gw_comm_last_error(comm));
  for (size_t i = 0; i < out_elems; i++) {
    double want;
    if (coll == 0) want = expect_reduce(dt, op, n, i);
    else if (coll == 1) want = val(op, root, i);
    else if (coll == 2) want = val(op, (int)(i / count), i % count);
    else want = expect_reduce(dt, op, n, (size_t)rank * count + i);
    double got = load(dt, b->hout, i);
    EXPECT(got == want, "%s(%s, %s, count %zu, %s): element %zu is %g, expected %g",
           coll == 0 ? "allreduce" : coll == 1 ? "broadcast" : coll == 2 ? "allgather" : "reduce_scatter",
           gw_dtype_name(dt), gw_op_name((gw_op_t)op), count, in_place ? "in place" : "out of place", i, got, want);
  }
  return 0;
}

static int body_grid(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  dv = gw__dev();
  EXPECT(dv, "no device layer: %s", gw__dev_absent_reason());
  const char *async_env = getenv("GW_DEV_ASYNC");
  if (comm->devring && async_env && strcmp(async_env, "0") != 0)
    EXPECT(gw__dev_ring_async(comm), "GW_DEV_ASYNC=%s, but the device ring is synchronized per chunk", async_env);
  /* One hardware queue: the stream-ordered ring only (the synchronized
   * one's engine stream would wait behind the caller's) */
  const int async_all = async_env && strcmp(async_env, "0") != 0;
  if (one_queue() && !async_all)
    EXPECT(!comm->devring, "one hardware queue, yet a synchronized device ring (its stream would wait behind the caller's)");
  if (one_queue() && async_all)
    EXPECT(comm->devring && gw__dev_ring_async(comm), "one hardware queue and GW_DEV_ASYNC=1: no stream-ordered ring");
  const char *no_peer = getenv("GW_DEV_EMU_NO_PEER");
  if (no_peer && strcmp(no_peer, "0") != 0)
    EXPECT(!comm->devring, "GW_DEV_EMU_NO_PEER: a device ring, yet no device reaches its neighbour's memory");
  struct grid_bufs b = {.bytes = (size_t)MAXC * (size_t)n * 8 + 64};
  DCHECK(dv->stream_create(&b.s));
  DCHECK(dv->alloc((void **)&b.dsend, b.bytes));
  DCHECK(dv->alloc((void **)&b.drecv, b.bytes));
  DCHECK(dv->host_alloc((void **)&b.hin, b.bytes));
  DCHECK(dv->host_alloc((void **)&b.hout, b.bytes));
  static const int ar_ops[] = {GW_SUM, GW_PROD, GW_MAX, GW_MIN, GW_AVG};
  for (size_t d = 0; d < sizeof grid_dtypes / sizeof *grid_dtypes; d++) {
    for (size_t c = 0; c < sizeof grid_counts / sizeof *grid_counts; c++) {
      size_t count = grid_counts[c];
      if (count == MAXC && grid_dtypes[d] != GW_FLOAT32 && grid_dtypes[d] != GW_BFLOAT16) continue;
      for (int in_place = 0; in_place < 2; in_place++) {
        for (size_t o = 0; o < 5; o++)
          if (grid_one(comm, rank, n, &b, 0, grid_dtypes[d], ar_ops[o], count, in_place)) return 1;
        if (grid_one(comm, rank, n, &b, 1, grid_dtypes[d], GW_SUM, count, in_place)) return 1;
        if (grid_one(comm, rank, n, &b, 2, grid_dtypes[d], GW_SUM, count, in_place)) return 1;
        if (grid_one(comm, rank, n, &b, 3, grid_dtypes[d], GW_SUM, count, in_place)) return 1;
        if (grid_one(comm, rank, n, &b, 3, grid_dtypes[d], GW_AVG, count, in_place)) return 1;
      }
    }
  }
  if (comm->devring) { /* the path names the ring's mode: gw-perf's rows show which ran */
    gw_result_t r = gw_allreduce(b.dsend, b.drecv, MAXC, GW_FLOAT32, GW_SUM, comm, b.s);
    EXPECT(r == GW_SUCCESS, "allreduce of %d floats: %s", MAXC, gw_strerror(r));
    DCHECK(dv->stream_sync(b.s));
    char path[32];
    EXPECT(gw_comm_last_path(comm, path, sizeof path) == GW_SUCCESS, "gw_comm_last_path");
    const char *want = gw__dev_ring_async(comm) ? "ring/device-async" : "ring/device";
    EXPECT(!strcmp(path, want), "the last path is '%s', not '%s'", path, want);
  }
  DCHECK(dv->free(b.dsend));
  DCHECK(dv->free(b.drecv));
  DCHECK(dv->host_free(b.hin));
  DCHECK(dv->host_free(b.hout));
  DCHECK(dv->stream_destroy(b.s));
  return 0;
}

START_TEST(grid) { ck_assert_int_eq(run_ranks(nranks_env(), body_grid, NULL, 1200), 0); }
END_TEST

/* ---- ordering ------------------------------------------------------------------------------- */
static _Atomic uint64_t *gate;
static _Atomic int gate_forced;

static void *gate_watchdog(void *arg) {
  (void)arg;
  for (int i = 0; i < 2000 && atomic_load(gate) == 0; i++) usleep(10000);
  if (atomic_load(gate) == 0) atomic_store(&gate_forced, 1);
  atomic_store(gate, 1);
  return NULL;
}

static int body_ordering(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  dv = gw__dev();
  const size_t count = 1 << 20;
  gw_dev_stream_t s;
  int32_t *din, *dout, *h;
  DCHECK(dv->stream_create(&s));
  DCHECK(dv->alloc((void **)&din, count * 4));
  DCHECK(dv->alloc((void **)&dout, count * 4));
  DCHECK(dv->host_alloc((void **)&h, count * 4));
  DCHECK(dv->host_alloc((void **)&gate, 64));

  /* 1. The stream is closed by a host gate the test opens only after the call
   * returned: a call that waited for its stream would never return (the
   * watchdog opens the gate after 20 s and the case fails).  Behind the gate
   * comes slow work, then the input: an operation that did not wait for its
   * stream would read the garbage put there first. */
  memset(h, 0xff, count * 4);
  DCHECK(dv->memcpy_async(din, h, count * 4, s));
  DCHECK(dv->stream_sync(s));
  for (size_t i = 0; i < count; i++) h[i] = (int32_t)(i % 1000) + rank;
  pthread_t wd;
  pthread_create(&wd, NULL, gate_watchdog, NULL);
  DCHECK(dv->flag_wait((uint64_t *)gate, 1, s));
  DCHECK(dv->sleep_async(0.2, s));
  DCHECK(dv->memcpy_async(din, h, count * 4, s));
  GWCHECK(gw_allreduce(din, dout, count, GW_INT32, GW_SUM, comm, s), comm);
  EXPECT(atomic_load(gate) == 0, "gw_allreduce blocked until its stream got to it");
  int idle = 1;
  DCHECK(dv->stream_idle(s, &idle));
  EXPECT(!idle, "the stream finished before its gate opened");
  atomic_store(gate, 1);
  int32_t *hout = h; /* reuse the pinned buffer for the result */
  DCHECK(dv->memcpy_async(hout, dout, count * 4, s));
  DCHECK(dv->stream_sync(s));
  EXPECT(!atomic_load(&gate_forced), "the gate had to be forced open");
  for (size_t i = 0; i < count; i++)
    EXPECT(hout[i] == (int32_t)(n * (int)(i % 1000) + n * (n - 1) / 2), "element %zu is %d", i, hout[i]);
  pthread_join(wd, NULL);

  /* 2. A chain: out = allreduce(out) ten times with no host sync between. */
  for (size_t i = 0; i < count; i++) h[i] = 1;
  DCHECK(dv->memcpy_async(dout, h, count * 4, s));
  for (int k = 0; k < 10; k++) GWCHECK(gw_allreduce(dout, dout, count, GW_INT32, GW_SUM, comm, s), comm);
  DCHECK(dv->memcpy_async(h, dout, count * 4, s));
  DCHECK(dv->stream_sync(s));
  int32_t want = 1;
  for (int k = 0; k < 10; k++) want *= n;
  for (size_t i = 0; i < count; i++) EXPECT(h[i] == want, "chain: element %zu is %d, expected %d", i, h[i], want);

  /* 3. The request form on a stream, and a host-memory call ordered on it. */
  gw_request_t req;
  for (size_t i = 0; i < count; i++) h[i] = rank + 1;
  DCHECK(dv->memcpy_async(din, h, count * 4, s));
  GWCHECK(gw_iallreduce(din, dout, count, GW_INT32, GW_MAX, comm, s, &req), comm);
  GWCHECK(gw_wait(&req), comm);
  int32_t *hh = malloc(64 * 4);
  for (int i = 0; i < 64; i++) hh[i] = rank;
  GWCHECK(gw_allreduce(hh, hh, 64, GW_INT32, GW_SUM, comm, s), comm);
  DCHECK(dv->memcpy_async(h, dout, count * 4, s));
  DCHECK(dv->stream_sync(s));
  for (size_t i = 0; i < count; i++) EXPECT(h[i] == n, "request: element %zu is %d", i, h[i]);
  for (int i = 0; i < 64; i++) EXPECT(hh[i] == n * (n - 1) / 2, "host memory on a stream: element %d is %d", i, hh[i]);
  free(hh);
  /* A blocking host call after stream work queues behind it. */
  int32_t one = 1;
  GWCHECK(gw_allreduce(&one, &one, 1, GW_INT32, GW_SUM, comm, NULL), comm);
  EXPECT(one == n, "blocking call after stream calls: %d", one);
  /* Device buffers with no stream: the default stream, and the call blocks. */
  for (size_t i = 0; i < count; i++) h[i] = 2;
  DCHECK(dv->memcpy_async(din, h, count * 4, NULL));
  DCHECK(dv->stream_sync(NULL));
  GWCHECK(gw_allreduce(din, dout, count, GW_INT32, GW_SUM, comm, NULL), comm);
  DCHECK(dv->memcpy_async(h, dout, count * 4, NULL));
  DCHECK(dv->stream_sync(NULL));
  for (size_t i = 0; i < count; i++) EXPECT(h[i] == 2 * n, "no stream: element %zu is %d", i, h[i]);
  /* ... blocks until the result is in place for any stream, not only for the
   * default one: read here on another stream at once.  Staged sizes (below the
   * device ring's 64 KiB), whose last piece is copied out by the default
   * stream after the host reduced it; blocking, gw_wait, and gw_test polled
   * until it says done. */
  const size_t small = 3000; /* 12 KB: staged, in one piece */
  for (int it = 0; it < 60; it++) {
    for (size_t i = 0; i < small; i++) h[i] = (int32_t)(it * 7 + (int)i % 13 + rank);
    DCHECK(dv->memcpy_async(din, h, small * 4, NULL));
    DCHECK(dv->stream_sync(NULL));
    if (it % 3 == 1) {
      GWCHECK(gw_iallreduce(din, dout, small, GW_INT32, GW_SUM, comm, NULL, &req), comm);
      GWCHECK(gw_wait(&req), comm);
    } else if (it % 3 == 2) {
      GWCHECK(gw_iallreduce(din, dout, small, GW_INT32, GW_SUM, comm, NULL, &req), comm);
      int done = 0;
      for (int polls = 0; polls < 300000 && !done; polls++) {
        GWCHECK(gw_test(&req, &done), comm);
        if (!done) usleep(100);
      }
      EXPECT(done && !req, "iteration %d: gw_test never said done", it);
    } else {
      GWCHECK(gw_allreduce(din, dout, small, GW_INT32, GW_SUM, comm, NULL), comm);
    }
    DCHECK(dv->memcpy_async(h, dout, small * 4, s));
    DCHECK(dv->stream_sync(s));
    for (size_t i = 0; i < small; i++) {
      const int32_t sum = n * (it * 7 + (int)i % 13) + n * (n - 1) / 2;
      if (h[i] != sum) {
        EXPECT(0, "no stream, iteration %d (%s): element %zu is %d, expected %d: the call returned before its "
               "result was copied out", it, it % 3 == 1 ? "gw_wait" : it % 3 == 2 ? "gw_test" : "blocking", i, h[i],
               sum);
        break;
      }
    }
  }
  DCHECK(dv->free(din));
  DCHECK(dv->free(dout));
  DCHECK(dv->host_free(h));
  DCHECK(dv->stream_destroy(s));
  return 0;
}

START_TEST(ordering) {
  /* The emulator's copies late by up to 2 ms each: a call that returns (or a
   * gw_test that says done) before the default stream copied the result out
   * is then caught reading the old data.  A GPU ignores it. */
  setenv("GW_DEV_EMU_DELAY_US", "2000", 1);
  ck_assert_int_eq(run_ranks(2, body_ordering, NULL, 300), 0);
  unsetenv("GW_DEV_EMU_DELAY_US");
}

/* ---- misuse ------------------------------------------------------------------------------------ */
static int expect_error(gw_result_t r, gw_result_t code, gw_comm_t comm, const char *needle, int rank) {
  EXPECT(r == code, "expected %s, got %s (%s)", gw_strerror(code), gw_strerror(r), gw_comm_last_error(comm));
  EXPECT(strstr(gw_comm_last_error(comm), needle), "message '%s' lacks '%s'", gw_comm_last_error(comm), needle);
  return 0;
}

struct fresh_arg {
  gw_comm_t comm;
  int destroy;        /* else a host-buffer allreduce of rank + 1 */
  int in_use, device; /* the thread's device after it */
  int32_t sum;
};

static void *on_fresh_thread(void *p) {
  struct fresh_arg *a = p;
  int rank = 0;
  gw_comm_rank(a->comm, &rank);
  a->sum = rank + 1;
  if (a->destroy) gw_comm_destroy(a->comm);
  else if (gw_allreduce(&a->sum, &a->sum, 1, GW_INT32, GW_SUM, a->comm, NULL) != GW_SUCCESS) a->sum = -1;
  if (dv->device_in_use(&a->in_use) == 0 && a->in_use) dv->get_device(&a->device);
  return NULL;
}

static int body_misuse(int rank, int n, const char *master, void *arg) {
  (void)arg;
  dv = gw__dev();
  int ndev = 0;
  DCHECK(dv->device_count(&ndev));
  /* Rank 1 picks its device before init: the communicator keeps it. */
  if (rank == 1) DCHECK(dv->set_device(ndev - 1));
  gw_comm_t comm;
  GWCHECK(gw_comm_init(&comm, n, rank, master), NULL);
  int dev = -2;
  GWCHECK(gw_comm_device(comm, &dev), comm);
  EXPECT(dev == (rank == 1 ? ndev - 1 : 0), "bound to device %d", dev);
  int32_t host[16] = {0}, *d = NULL;
  gw_dev_stream_t s;
  DCHECK(dv->stream_create(&s));
  DCHECK(dv->alloc((void **)&d, 64));
  if (expect_error(gw_allreduce(d, host, 16, GW_INT32, GW_SUM, comm, s), GW_ERR_INVALID_ARGUMENT, comm,
                   "sendbuf is device memory but recvbuf is host memory", rank))
    return 1;
  if (expect_error(gw_allgather(host, d, 4, GW_INT32, comm, NULL), GW_ERR_INVALID_ARGUMENT, comm,
                   "sendbuf is host memory but recvbuf is device memory", rank))
    return 1;
  /* A device buffer far shorter than the count (64 bytes for 4 GiB, so that
   * the end lies past every allocation of this process, CUDA packing small
   * ones together): refused (its copies and kernels would fault, and a CUDA
   * fault kills the context). */
  if (expect_error(gw_allreduce(d, d, (size_t)1 << 30, GW_INT32, GW_SUM, comm, s), GW_ERR_INVALID_ARGUMENT, comm,
                   "the buffer is shorter than the call's count", rank))
    return 1;
  if (ndev > 1) {
    /* Memory of another device than the communicator's. */
    int other = (dev + 1) % ndev, *od = NULL;
    DCHECK(dv->set_device(other));
    DCHECK(dv->alloc((void **)&od, 64));
    DCHECK(dv->set_device(dev));
    char want[128];
    snprintf(want, sizeof want, "recvbuf is memory of device %d", other);
    if (expect_error(gw_allreduce(d, od, 16, GW_INT32, GW_SUM, comm, s), GW_ERR_INVALID_ARGUMENT, comm, want, rank))
      return 1;
    /* a bucketer over it: refused at create (its first bucket's allreduce
     * refused it, failing the communicator on every rank) */
    const size_t b16[] = {0, 16};
    gw_bucketer_t bk = NULL;
    snprintf(want, sizeof want, "gw_bucketer_create: buf is memory of device %d", other);
    if (expect_error(gw_bucketer_create(comm, od, 16, GW_INT32, GW_SUM, b16, 1, &bk), GW_ERR_INVALID_ARGUMENT, comm,
                     want, rank))
      return 1;
    DCHECK(dv->free(od));
    /* A stream of another device than the communicator's. */
    gw_dev_stream_t os;
    DCHECK(dv->set_device(other));
    DCHECK(dv->stream_create(&os));
    DCHECK(dv->set_device(dev));
    snprintf(want, sizeof want, "the stream is device %d's, but this communicator is bound to device %d", other, dev);
    if (expect_error(gw_allreduce(d, d, 16, GW_INT32, GW_SUM, comm, os), GW_ERR_INVALID_ARGUMENT, comm, want, rank))
      return 1;
    /* ... and as a bucketer's stream: refused when set */
    GWCHECK(gw_bucketer_create(comm, d, 16, GW_INT32, GW_SUM, b16, 1, &bk), comm);
    if (expect_error(gw_bucketer_set_stream(bk, os), GW_ERR_INVALID_ARGUMENT, comm, want, rank) ||
        expect_error(gw_bucketer_set_compute_stream(bk, os), GW_ERR_INVALID_ARGUMENT, comm, want, rank))
      return 1;
    gw_bucketer_destroy(bk);
    DCHECK(dv->stream_destroy(os));
  }
  if (!strcmp(dv->name, "emulated")) {
    /* A stream being captured into a CUDA graph is refused (the emulator can
     * pretend one is; on a GPU the capture itself would be needed). */
    gw__dev_emu_set_capturing(s, 1);
    if (expect_error(gw_allreduce(d, d, 16, GW_INT32, GW_SUM, comm, s), GW_ERR_UNSUPPORTED, comm,
                     "captured into a CUDA graph", rank))
      return 1;
    gw__dev_emu_set_capturing(s, 0);
  }
  /* The communicator still works after refused calls. */
  int32_t v = rank;
  GWCHECK(gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, s), comm);
  DCHECK(dv->stream_sync(s));
  EXPECT(v == n * (n - 1) / 2, "after misuse: %d", v);
  /* A host-buffer call from such a thread likewise (its pointer checks). */
  pthread_t t;
  struct fresh_arg fa = {comm, 0, -1, -1, 0};
  EXPECT(pthread_create(&t, NULL, on_fresh_thread, &fa) == 0 && pthread_join(t, NULL) == 0, "thread");
  EXPECT(fa.sum == n * (n + 1) / 2, "rank %d: the fresh thread's allreduce gave %d", rank, (int)fa.sum);
  EXPECT(fa.in_use == 0 || fa.device == dev, "rank %d: a host call on a communicator of device %d left the thread "
         "on device %d (in use %d)", rank, dev, fa.device, fa.in_use);
  if (comm->devring) {
    /* On the device ring, device buffers on one rank and host buffers on the
     * other in the same call are a mismatch (the payload would be in the wrong
     * place), reported on both: rank 0's asynchronously. */
    gw_result_t r = rank == 0 ? gw_allreduce(d, d, 16, GW_INT32, GW_SUM, comm, s)
                              : gw_allreduce(host, host, 16, GW_INT32, GW_SUM, comm, NULL);
    DCHECK(dv->stream_sync(s));
    gw_result_t async = GW_SUCCESS;
    GWCHECK(gw_comm_get_async_error(comm, &async), comm);
    EXPECT((rank == 0 ? r == GW_SUCCESS && async == GW_ERR_INVALID_ARGUMENT : r == GW_ERR_INVALID_ARGUMENT),
           "host/device mismatch: returned %s, async %s", gw_strerror(r), gw_strerror(async));
    EXPECT(strstr(gw_comm_last_error(comm), "differ") && strstr(gw_comm_last_error(comm), "on device memory"),
           "message: %s", gw_comm_last_error(comm));
  }
  /* Destroyed from a thread that never used a device (as a Python thread
   * pool's): the communicator's device, rank 1's the last, must not make the
   * thread current on device 0 (a context there: half a GB on a GPU). */
  struct fresh_arg fd = {comm, 1, -1, -1, 0};
  EXPECT(pthread_create(&t, NULL, on_fresh_thread, &fd) == 0 && pthread_join(t, NULL) == 0, "thread");
  EXPECT(fd.in_use == 0 || fd.device == dev, "rank %d: destroying a communicator of device %d left the thread on "
         "device %d (in use %d)", rank, dev, fd.device, fd.in_use);

  /* A communicator bound to no device refuses streams and device memory. */
  setenv("GW_DEVICE", "none", 1);
  GWCHECK(gw_comm_init(&comm, 1, 0, NULL), NULL);
  GWCHECK(gw_comm_device(comm, &dev), comm);
  EXPECT(dev == -1, "GW_DEVICE=none bound device %d", dev);
  if (expect_error(gw_allreduce(host, host, 16, GW_INT32, GW_SUM, comm, s), GW_ERR_INVALID_ARGUMENT, comm,
                   "bound to no device", rank))
    return 1;
  if (expect_error(gw_allreduce(d, d, 16, GW_INT32, GW_SUM, comm, NULL), GW_ERR_INVALID_ARGUMENT, comm,
                   "bound to no device", rank))
    return 1;
  gw_comm_destroy(comm);
  unsetenv("GW_DEVICE");
  setenv("GW_DEVICE", "99", 1);
  EXPECT(gw_comm_init(&comm, 1, 0, NULL) == GW_ERR_INVALID_ARGUMENT, "GW_DEVICE=99 accepted");
  EXPECT(strstr(gw_comm_last_error(NULL), "GW_DEVICE=99"), "message: %s", gw_comm_last_error(NULL));
  unsetenv("GW_DEVICE");
  DCHECK(dv->free(d));
  DCHECK(dv->stream_destroy(s));
  return 0;
}

/* The emulator's device memory (a memfd each) is close-on-exec: a program a
 * rank runs must not keep it alive.  In a child of its own (run_in_child):
 * this process forks the ranks, and must not have set up a device. */
static int emulated_memory_closes_on_exec(void *arg) {
  (void)arg;
  dv = gw__dev();
  void *p = NULL;
  ck_assert_msg(dv->alloc(&p, 4096) == 0, "%s", dv->error());
  DIR *d = opendir("/proc/self/fd");
  ck_assert_ptr_nonnull(d);
  int seen = 0;
  for (struct dirent *e; (e = readdir(d));) {
    char link[300], to[256];
    snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(link, to, sizeof to - 1);
    if (n <= 0) continue;
    to[n] = 0;
    if (!strstr(to, "memfd:gw-dev-emu")) continue;
    seen++;
    ck_assert_msg(fcntl(atoi(e->d_name), F_GETFD) & FD_CLOEXEC, "fd %s (%s) is not close-on-exec", e->d_name, to);
  }
  closedir(d);
  ck_assert_msg(seen > 0, "no emulated device memory among this process's descriptors");
  ck_assert_int_eq(dv->free(p), 0);
  return 0;
}

/* GW_DEV_STAGE_BYTES past 1 GiB: 1 GiB (each of the two pinned staging
 * buffers; 8G ran the machine out of memory at the first staged call).  In a
 * child of its own: the setting is read once per process. */
static int stage_bytes_capped(void *arg) {
  setenv("GW_DEV_STAGE_BYTES", (const char *)arg, 1);
  return gw__dev_stage_bytes_own() == (size_t)1 << 30 ? 0 : 1;
}

START_TEST(misuse) {
  if (getenv("GW_DEV_EMULATE")) ck_assert_int_eq(run_in_child(emulated_memory_closes_on_exec, NULL), 0);
  ck_assert_int_eq(run_in_child(stage_bytes_capped, "8G"), 0);
  ck_assert_int_eq(run_in_child(stage_bytes_capped, "0x7fffffffffffffff"), 0);
  /* GW_DEV_CHUNK_BYTES out of range: the nearest of 4 KiB .. 1 GiB (4 GiB
   * overflowed the 32-bit byte count of a chunk's header), 256-byte aligned */
  ck_assert_uint_eq(gw__devring_chunk((int64_t)1 << 32), (size_t)1 << 30);
  ck_assert_uint_eq(gw__devring_chunk(INT64_MAX), (size_t)1 << 30);
  ck_assert_uint_eq(gw__devring_chunk(-1), 4096);
  ck_assert_uint_eq(gw__devring_chunk(70000), 70144);
  ck_assert_uint_eq(gw__devring_chunk(4 << 20), 4 << 20);
  ck_assert_int_eq(run_ranks_raw(2, body_misuse, NULL, 120), 0);
  if (getenv("GW_DEV_EMULATE")) ck_assert_int_eq(run_ranks_raw(2, device_setup_retry, NULL, 120), 0);
}
END_TEST

/* ---- IPC ------------------------------------------------------------------------------------------ */
static int body_ipc(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  dv = gw__dev();
  const size_t bytes = 1 << 20;
  uint8_t *h;
  void *mine = NULL;
  struct gw_dev_ipc handle;
  DCHECK(dv->host_alloc((void **)&h, bytes));
  if (rank == 0) {
    DCHECK(dv->alloc(&mine, bytes));
    for (size_t i = 0; i < bytes; i++) h[i] = (uint8_t)(i * 31 + 7);
    DCHECK(dv->memcpy_async(mine, h, bytes, NULL));
    DCHECK(dv->stream_sync(NULL));
    DCHECK(dv->ipc_get(mine, &handle));
    EXPECT(dv->ipc_open(&handle, &(void *){NULL}) != 0, "opened its own IPC handle");
  }
  GWCHECK(gw_broadcast(&handle, &handle, sizeof handle, GW_UINT8, 0, comm, NULL), comm);
  if (rank == 1) {
    void *peer = NULL;
    DCHECK(dv->ipc_open(&handle, &peer));
    int is_dev = 0, dev = -1;
    DCHECK(dv->ptr_kind(peer, &is_dev, &dev));
    EXPECT(is_dev, "an IPC mapping is not device memory");
    DCHECK(dv->memcpy_async(h, peer, bytes, NULL));
    DCHECK(dv->stream_sync(NULL));
    for (size_t i = 0; i < bytes; i++) EXPECT(h[i] == (uint8_t)(i * 31 + 7), "byte %zu is %u", i, h[i]);
    memset(h, 0x5a, bytes);
    DCHECK(dv->memcpy_async(peer, h, bytes, NULL));
    DCHECK(dv->stream_sync(NULL));
    DCHECK(dv->ipc_close(peer));
  }
  GWCHECK(gw_barrier(comm), comm);
  if (rank == 0) {
    DCHECK(dv->memcpy_async(h, mine, bytes, NULL));
    DCHECK(dv->stream_sync(NULL));
    for (size_t i = 0; i < bytes; i++) EXPECT(h[i] == 0x5a, "byte %zu is %u after the peer wrote", i, h[i]);
    DCHECK(dv->free(mine));
  }
  DCHECK(dv->host_free(h));
  return 0;
}

START_TEST(ipc) { ck_assert_int_eq(run_ranks(2, body_ipc, NULL, 120), 0); }
END_TEST

/* In a child, so this process never initializes CUDA (its forks could not use it). */
static int device_present(void) {
  pid_t pid = fork();
  if (pid == 0) {
    const struct gw_dev_ops *d = gw__dev();
    if (!d) fprintf(stderr, "SKIP: %s\n", gw__dev_absent_reason());
    _exit(d ? 0 : 77);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 0;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void device_add_case(Suite *s, const char *name, const TTest *test) {
  TCase *tc = tcase_create(name);
  tcase_add_test(tc, test);
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
}

int main(void) {
  if (!device_present()) return 77;
  Suite *s = suite_create(getenv("GW_DEV_EMULATE") ? "device-emu" : "gpu");
  TCase *tc = tcase_create("grid");
  tcase_add_test(tc, grid);
  tcase_set_timeout(tc, 1300);
  suite_add_tcase(s, tc);
  device_add_stream_cases(s); /* test_device_streams.c */
  const char *names[] = {"ordering", "misuse", "ipc"};
  const TTest *tests[] = {ordering, misuse, ipc};
  device_add_bucketer_case(s); /* test_device_bucket.c */
  device_add_settings_case(s); /* test_device_settings.c */
  for (int i = 0; i < 3; i++) device_add_case(s, names[i], tests[i]);
  device_add_failure_cases(s); /* test_device_failures.c */
  return run_suite(s);
}
