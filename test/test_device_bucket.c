/* test_device_bucket.c - the device suite's "bucketer" case (test_device.c
 * runs it): the gradient bucketer over device gradients written on its stream
 * behind slow work and marked ready at once (exact sums, three steps); with a
 * separate compute stream ordered by events; with a float16 wire converted on
 * the device; a complete step destroyed without its wait; host gradients
 * with a 16-bit wire refused beside a stream; and host gradients on one rank
 * against device gradients on another refused at create (bucketer_sides). */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dev.h"
#include "harness.h"
#include "test_device.h"

/* ---- the gradient bucketer on device memory and a stream ------------------------------------------ */
/* The compute stream's gate: a host flag its stream waits on, opened by the
 * test once every bucket is marked ready, or by this watchdog after 10 s if
 * marking waited for the stream (then `forced` says so).  A sleep on the stream
 * with a deadline on marking (150 ms against 100 ms) raced with a loaded machine. */
struct gate {
  uint64_t *flag; /* host memory the compute stream waits on */
  atomic_int marked, forced;
};

static void *gate_watchdog(void *arg) {
  struct gate *g = arg;
  for (int i = 0; i < 1000 && !atomic_load(&g->marked); i++) usleep(10000);
  if (!atomic_load(&g->marked)) { /* marking waits for the stream: let it go, and say so */
    atomic_store(&g->forced, 1);
    atomic_store((_Atomic uint64_t *)g->flag, 1);
  }
  return NULL;
}

/* "Backward" writes the gradients behind slow work and marks them ready
 * at once: the allreduces must wait for the writes.  *separate == 0: all on one
 * stream (the caller's ordering).  *separate == 1: DDP's arrangement, gradients
 * written on a compute stream, each bucket's allreduce on a communication stream
 * that the bucketer orders behind the compute stream's work (an event per
 * bucket), marking ready must not wait for that work, and the "optimizer" queued
 * on the compute stream after gw_bucketer_wait sees the results. */
static int body_bucketer(gw_comm_t comm, int rank, int n, void *arg) {
  const int separate = *(const int *)arg;
  dv = gw__dev();
  enum { M = 100000 };
  gw_dev_stream_t s, compute;
  float *g, *h;
  DCHECK(dv->stream_create(&s));
  compute = s;
  if (separate) DCHECK(dv->stream_create(&compute));
  DCHECK(dv->alloc((void **)&g, M * 4));
  DCHECK(dv->host_alloc((void **)&h, M * 4));
  size_t bounds[64];
  int nb = gw_bucket_bounds(M, 4, 4096, 65536, bounds, 64);
  gw_bucketer_t bk;
  GWCHECK(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, bounds, nb, &bk), comm);
  /* separate 2: no allreduce stream given: the bucketer makes and owns one;
   * 3: the same with a float16 wire (converted on the device; the sums are
   * small integers, exact in float16). */
  if (separate < 2) GWCHECK(gw_bucketer_set_stream(bk, s), comm);
  if (separate == 3) GWCHECK(gw_bucketer_set_wire(bk, GW_FLOAT16), comm);
  if (separate == 1)
    EXPECT(gw_bucketer_set_compute_stream(bk, s) == GW_ERR_INVALID_ARGUMENT, "the same stream for both accepted");
  if (separate) GWCHECK(gw_bucketer_set_compute_stream(bk, compute), comm);
  struct gate gate = {.flag = NULL};
  if (separate) DCHECK(dv->host_alloc((void **)&gate.flag, 64));
  for (int step = 0; step < 3; step++) {
    for (int i = 0; i < M; i++) h[i] = (float)(i % 100 + rank + step);
    pthread_t watchdog;
    if (separate) { /* the gradients' writes held until marking is over: they must not hold marking */
      atomic_store((_Atomic uint64_t *)gate.flag, 0);
      atomic_store(&gate.marked, 0);
      atomic_store(&gate.forced, 0);
      DCHECK(dv->flag_wait(gate.flag, 1, compute));
      EXPECT(pthread_create(&watchdog, NULL, gate_watchdog, &gate) == 0, "pthread_create");
    } else {
      DCHECK(dv->sleep_async(0.05, compute));
    }
    DCHECK(dv->memcpy_async(g, h, M * 4, compute));
    for (int i = M; i > 0; i -= 10000) GWCHECK(gw_bucketer_ready(bk, (size_t)(i - 10000), 10000), comm);
    if (separate) {
      atomic_store(&gate.marked, 1);
      pthread_join(watchdog, NULL);
      EXPECT(!atomic_load(&gate.forced), "step %d: marking ready waited for the compute stream", step);
      int idle = 1; /* the gate held the gradients' writes until now */
      DCHECK(dv->stream_idle(compute, &idle));
      EXPECT(!idle, "step %d: the compute stream finished before its gate opened", step);
      atomic_store((_Atomic uint64_t *)gate.flag, 1);
    }
    GWCHECK(gw_bucketer_wait(bk), comm);
    DCHECK(dv->memcpy_async(h, g, M * 4, compute));
    DCHECK(dv->stream_sync(compute));
    for (int i = 0; i < M; i++) {
      float want = (float)(n * (i % 100 + step) + n * (n - 1) / 2);
      EXPECT(h[i] == want, "step %d: element %d is %g, expected %g", step, i, (double)h[i], (double)want);
    }
  }
  if (separate == 3) { /* a complete step destroyed without its wait: converted back and ordered all the same */
    gw_bucketer_t b2;
    GWCHECK(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, bounds, nb, &b2), comm);
    GWCHECK(gw_bucketer_set_wire(b2, GW_FLOAT16), comm);
    GWCHECK(gw_bucketer_set_compute_stream(b2, compute), comm);
    for (int i = 0; i < M; i++) h[i] = (float)(i % 100 + rank + 5);
    DCHECK(dv->memcpy_async(g, h, M * 4, compute));
    GWCHECK(gw_bucketer_ready(b2, 0, M), comm);
    gw_bucketer_destroy(b2);
    DCHECK(dv->memcpy_async(h, g, M * 4, compute));
    DCHECK(dv->stream_sync(compute));
    for (int i = 0; i < M; i++)
      if (h[i] != (float)(n * (i % 100 + 5) + n * (n - 1) / 2)) {
        EXPECT(0, "destroyed without a wait: element %d is %g", i, (double)h[i]);
        break;
      }
  }
  if (separate == 3) { /* a float16 average, divide-first: divided on the device on the way into the wire
                        * (partial sums of 40000s overflow float16 past 2 ranks); a scale lost made it a sum */
    gw_bucketer_t b3;
    GWCHECK(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_AVG, bounds, nb, &b3), comm);
    GWCHECK(gw_bucketer_set_wire(b3, GW_FLOAT16), comm);
    GWCHECK(gw_bucketer_set_stream(b3, s), comm);
    GWCHECK(gw_bucketer_set_divide_first(b3, 1), comm);
    for (int i = 0; i < M; i++) h[i] = 40000.0f + 96.0f * (float)rank;
    DCHECK(dv->memcpy_async(g, h, M * 4, s));
    DCHECK(dv->stream_sync(s));
    GWCHECK(gw_bucketer_ready(b3, 0, M), comm);
    GWCHECK(gw_bucketer_wait(b3), comm);
    gw_bucketer_destroy(b3);
    DCHECK(dv->memcpy_async(h, g, M * 4, s));
    DCHECK(dv->stream_sync(s));
    const double mean = 40000.0 + 96.0 * (n - 1) / 2.0;
    for (int i = 0; i < M; i++)
      if (!(fabs(h[i] - mean) <= 64.0)) {
        EXPECT(0, "float16 average on the device: element %d is %g, mean %g", i, (double)h[i], mean);
        break;
      }
  }
  if (separate) GWCHECK(gw_bucketer_set_compute_stream(bk, NULL), comm);
  if (separate == 3) /* the wire kept, its stream (the bucketer's own) gone: refused before anything is marked */
    EXPECT(gw_bucketer_ready(bk, 0, 10) == GW_ERR_INVALID_ARGUMENT && strstr(gw_comm_last_error(comm), "need a stream"),
           "a device wire without a stream: %s", gw_comm_last_error(comm));
  gw_bucketer_destroy(bk);
  if (separate == 1) { /* host gradients converted on the host in no stream's order: refused with a compute stream */
    GWCHECK(gw_bucketer_create(comm, h, M, GW_FLOAT32, GW_SUM, bounds, nb, &bk), comm);
    GWCHECK(gw_bucketer_set_wire(bk, GW_BFLOAT16), comm);
    GWCHECK(gw_bucketer_set_compute_stream(bk, compute), comm);
    EXPECT(gw_bucketer_ready(bk, 0, 10) == GW_ERR_INVALID_ARGUMENT &&
               strstr(gw_comm_last_error(comm), "host gradients with a bfloat16 wire"),
           "a host wire with a compute stream: %s", gw_comm_last_error(comm));
    GWCHECK(gw_bucketer_set_compute_stream(bk, NULL), comm);
    /* nor for the allreduce stream's (host buffers are ordered on it) */
    GWCHECK(gw_bucketer_set_stream(bk, s), comm);
    EXPECT(gw_bucketer_ready(bk, 0, 10) == GW_ERR_INVALID_ARGUMENT &&
               strstr(gw_comm_last_error(comm), "host gradients with a bfloat16 wire") &&
               strstr(gw_comm_last_error(comm), "the allreduce stream's work"),
           "a host wire with an allreduce stream: %s", gw_comm_last_error(comm));
    GWCHECK(gw_bucketer_set_stream(bk, NULL), comm);
    gw_bucketer_destroy(bk);
  }
  DCHECK(dv->free(g));
  DCHECK(dv->host_free(h));
  DCHECK(dv->stream_destroy(s));
  if (separate) DCHECK(dv->stream_destroy(compute));
  if (separate) DCHECK(dv->host_free(gate.flag));
  return 0;
}

START_TEST(bucketer) {
  for (int separate = 0; separate < 4; separate++)
    ck_assert_int_eq(run_ranks(nranks_env(), body_bucketer, &separate, 120), 0);
}
END_TEST

/* A device call failing inside a step (emulator: the enqueue after `after`
 * pushes on rank 0): the event ordering a bucket after the compute stream,
 * the cast to the wire, or an allreduce.  Every failure ready and wait return
 * is GW_ERR_CUDA (the bucketer's own device calls said GW_ERR_INTERNAL, "a
 * bug in gradwire"), the step fails on rank 0 and its peer hears of it. */
static int body_bucketer_fault(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  dv = gw__dev();
  if (strcmp(dv->name, "emulated") != 0) return 0; /* the failure is injected in the emulator */
  enum { M = 20000 };
  gw_dev_stream_t cs;
  float *g, *h;
  EXPECT(gw_comm_set_timeout(comm, 30) == GW_SUCCESS, "timeout");
  DCHECK(dv->stream_create(&cs));
  DCHECK(dv->alloc((void **)&g, M * 4));
  DCHECK(dv->host_alloc((void **)&h, M * 4));
  size_t bounds[16];
  const int nb = gw_bucket_bounds(M, 4, 4000, 20000, bounds, 16);
  gw_bucketer_t bk;
  GWCHECK(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, bounds, nb, &bk), comm);
  GWCHECK(gw_bucketer_set_wire(bk, GW_BFLOAT16), comm);
  GWCHECK(gw_bucketer_set_compute_stream(bk, cs), comm);
  for (int i = 0; i < M; i++) h[i] = 1;
  DCHECK(dv->memcpy_async(g, h, M * 4, cs));
  DCHECK(dv->stream_sync(cs));
  if (rank == 0) gw__dev_emu_fail_pushes_after(*(const long *)arg);
  const gw_result_t r = gw_bucketer_ready(bk, 0, M);
  if (rank == 0) gw__dev_emu_fail_pushes_after(-1);
  const gw_result_t w = gw_bucketer_wait(bk);
  if (rank == 0)
    EXPECT((r == GW_SUCCESS || r == GW_ERR_CUDA) && w == GW_ERR_CUDA, "rank 0: ready %s, wait %s: %s",
           gw_strerror(r), gw_strerror(w), gw_comm_last_error(comm));
  else
    EXPECT(w != GW_SUCCESS, "rank 1: the step was reported good");
  gw_bucketer_destroy(bk);
  DCHECK(dv->stream_sync(cs));
  DCHECK(dv->free(g));
  DCHECK(dv->host_free(h));
  DCHECK(dv->stream_destroy(cs));
  return 0;
}

START_TEST(bucketer_fault) {
  static const long afters[] = {0, 2, 3, 6};
  for (size_t i = 0; i < sizeof afters / sizeof *afters; i++)
    ck_assert_msg(run_ranks(2, body_bucketer_fault, (void *)&afters[i], 90) == 0, "failing after %ld pushes",
                  afters[i]);
}
END_TEST

/* Rank 0's gradients in device memory, the others' in host memory: create
 * is refused on every rank naming both sides (on a device ring the first
 * bucket failed the communicator; through staging a bucket past one piece
 * did), and the communicator still works: a bucketer with every rank's
 * gradients on the device then reduces exactly. */
static int body_bucketer_sides(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  dv = gw__dev();
  enum { M = 50000 };
  float *g, *h;
  gw_dev_stream_t st;
  DCHECK(dv->stream_create(&st));
  DCHECK(dv->alloc((void **)&g, M * 4));
  DCHECK(dv->host_alloc((void **)&h, M * 4));
  size_t bounds[16];
  const int nb = gw_bucket_bounds(M, 4, 40000, 200000, bounds, 16);
  gw_bucketer_t bk = NULL;
  const gw_result_t r = gw_bucketer_create(comm, rank == 0 ? (void *)g : (void *)h, M, GW_FLOAT32, GW_SUM, bounds,
                                           nb, &bk);
  char want[96];
  snprintf(want, sizeof want, "this rank's gradients are in %s memory, rank %d's in %s memory", rank ? "host" : "device",
           rank ? 0 : 1, rank ? "device" : "host");
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && !bk && strstr(gw_comm_last_error(comm), want),
         "rank %d: host and device gradients across ranks: %s: %s", rank, gw_strerror(r), gw_comm_last_error(comm));
  GWCHECK(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, bounds, nb, &bk), comm);
  for (int i = 0; i < M; i++) h[i] = (float)(i % 7 + rank);
  DCHECK(dv->memcpy_async(g, h, M * 4, st));
  DCHECK(dv->stream_sync(st));
  GWCHECK(gw_bucketer_ready(bk, 0, M), comm);
  GWCHECK(gw_bucketer_wait(bk), comm);
  gw_bucketer_destroy(bk);
  DCHECK(dv->memcpy_async(h, g, M * 4, st));
  DCHECK(dv->stream_sync(st));
  for (int i = 0; i < M; i++)
    if (h[i] != (float)(n * (i % 7) + n * (n - 1) / 2)) {
      EXPECT(0, "after the refusal: element %d is %g", i, (double)h[i]);
      break;
    }
  DCHECK(dv->free(g));
  DCHECK(dv->host_free(h));
  DCHECK(dv->stream_destroy(st));
  return 0;
}

START_TEST(bucketer_sides) { ck_assert_int_eq(run_ranks(nranks_env(), body_bucketer_sides, NULL, 60), 0); }
END_TEST

void device_add_bucketer_case(Suite *s) {
  device_add_case(s, "bucketer", bucketer);
  device_add_case(s, "bucketer_fault", bucketer_fault);
  device_add_case(s, "bucketer_sides", bucketer_sides);
}
