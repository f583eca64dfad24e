/* test_device_streams.c - the device suite's cases on several streams and on
 * streams that share hardware queues (test_device.c runs them):
 *   - "streams": operations alternating between two streams that run out of
 *     step, staged or on the stream-ordered ring;
 *   - "queues": five streams, so some share a hardware queue with any stream
 *     the runtime uses (GW_DEV_EMU_CONNECTIONS=2);
 *   - "unqueued": an operation whose work cannot all be put on its stream
 *     (the emulator's injected launch failure);
 *   - "pieces_differ": staged calls whose counts differ by a whole piece;
 *   - "timeout_zero": a blocking staged call under a timeout of 0 (no limit);
 * and the "misuse" case's setup that failed part way (device_setup_retry). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "test_device.h"

/* A communicator on the host staging (GW_DEV_IPC=0) with 64 KiB pieces, the
 * device layer in dv; extra_env ("NAME=VALUE" or NULL) set first. */
static gw_result_t staged_comm(gw_comm_t *comm, int rank, int n, const char *master, const char *extra_env) {
  dv = gw__dev();
  setenv("GW_DEV_IPC", "0", 1);
  setenv("GW_DEV_STAGE_BYTES", "65536", 1);
  if (extra_env) putenv((char *)extra_env);
  return gw_comm_init(comm, n, rank, master);
}

/* ---- a setup that failed part way (misuse case) ------------------------------------------------- */
/* (Emulator: its hook fails the allocation.)  Pinned memory running out
 * after the first staging buffer: that call fails naming it, and the next one
 * makes what is missing and runs (the half-made state used to be kept, its
 * missing buffer then taken for a host address). */
int device_setup_retry(int rank, int n, const char *master, void *arg) {
  (void)arg;
  gw_comm_t comm;
  GWCHECK(staged_comm(&comm, rank, n, master, "GW_DEV_EMU_FAIL_HOST_ALLOC=65536:2"), NULL);
  const size_t count = 24576; /* 96 KiB: two pieces */
  int32_t *din, *dout, *h;
  DCHECK(dv->alloc((void **)&din, count * 4));
  DCHECK(dv->alloc((void **)&dout, count * 4));
  DCHECK(dv->host_alloc((void **)&h, count * 4));
  for (size_t i = 0; i < count; i++) h[i] = rank + 1 + (int32_t)(i % 7);
  DCHECK(dv->memcpy_async(din, h, count * 4, NULL));
  DCHECK(dv->stream_sync(NULL));
  gw_result_t r = gw_allreduce(din, dout, count, GW_INT32, GW_SUM, comm, NULL);
  EXPECT(r == GW_ERR_CUDA && strstr(gw_comm_last_error(comm), "allocating pinned staging memory"),
         "the failed setup: returned %s: %s", gw_strerror(r), gw_comm_last_error(comm));
  GWCHECK(gw_allreduce(din, dout, count, GW_INT32, GW_SUM, comm, NULL), comm);
  DCHECK(dv->memcpy_async(h, dout, count * 4, NULL));
  DCHECK(dv->stream_sync(NULL));
  for (size_t i = 0; i < count; i++)
    EXPECT(h[i] == n * (n + 1) / 2 + n * (int32_t)(i % 7), "after the retry: element %zu is %d", i, h[i]);
  gw_comm_destroy(comm);
  DCHECK(dv->free(din));
  DCHECK(dv->free(dout));
  DCHECK(dv->host_free(h));
  return 0;
}

/* ---- calls that differ by whole pieces ----------------------------------------------------------- */
/* Staged calls travel as pieces whose headers carry the piece's count: rank 0
 * with two pieces and rank 1 with three used to pass rank 0's call and pair
 * rank 1's third piece with rank 0's next call (gradients silently wrong in a
 * training loop).  The pieces that more follow say so, so both ranks fail at
 * rank 0's last piece, naming it. */
static int body_pieces_differ(int rank, int n, const char *master, void *arg) {
  (void)arg;
  gw_comm_t comm;
  GWCHECK(staged_comm(&comm, rank, n, master, NULL), NULL);
  const size_t count = rank == 0 ? 32768 : 49152; /* 16384 int32 per piece: 2 and 3 pieces */
  int32_t *d;
  DCHECK(dv->alloc((void **)&d, 49152 * 4));
  gw_result_t r = gw_allreduce(d, d, count, GW_INT32, GW_SUM, comm, NULL), async = GW_SUCCESS;
  DCHECK(dv->stream_sync(NULL));
  GWCHECK(gw_comm_get_async_error(comm, &async), comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT || async == GW_ERR_INVALID_ARGUMENT, "returned %s, async %s: %s",
         gw_strerror(r), gw_strerror(async), gw_comm_last_error(comm));
  EXPECT(strstr(gw_comm_last_error(comm), "differ") && strstr(gw_comm_last_error(comm), "more to come"),
         "message: %s", gw_comm_last_error(comm));
  gw_comm_destroy(comm);
  DCHECK(dv->free(d));
  return 0;
}

START_TEST(pieces_differ) { ck_assert_int_eq(run_ranks_raw(2, body_pieces_differ, NULL, 120), 0); }
END_TEST

/* A timeout of 0 waits without a limit: a blocking staged call whose default
 * stream was still copying its result out (slow copies here) failed at once
 * as "not copied out after 0 s", though it had run on every rank. */
static int body_timeout_zero(int rank, int n, const char *master, void *arg) {
  (void)arg;
  gw_comm_t comm;
  GWCHECK(staged_comm(&comm, rank, n, master, "GW_DEV_EMU_DELAY_US=3000"), NULL);
  GWCHECK(gw_comm_set_timeout(comm, 0), comm);
  EXPECT(gw_comm_set_timeout(comm, NAN) == GW_ERR_INVALID_ARGUMENT && strstr(gw_comm_last_error(comm), "NaN"),
         "a NaN timeout was taken: %s", gw_comm_last_error(comm));
  const size_t count = 32768;
  int32_t *d, *h;
  DCHECK(dv->alloc((void **)&d, count * 4));
  DCHECK(dv->host_alloc((void **)&h, count * 4));
  for (size_t i = 0; i < count; i++) h[i] = (int32_t)i;
  DCHECK(dv->memcpy_async(d, h, count * 4, NULL));
  GWCHECK(gw_allreduce(d, d, count, GW_INT32, GW_SUM, comm, NULL), comm);
  DCHECK(dv->memcpy_async(h, d, count * 4, NULL));
  DCHECK(dv->stream_sync(NULL));
  for (size_t i = 0; i < count; i++) EXPECT(h[i] == n * (int32_t)i, "element %zu is %d", i, h[i]);
  gw_comm_destroy(comm);
  DCHECK(dv->free(d));
  DCHECK(dv->host_free(h));
  return 0;
}

START_TEST(timeout_zero) { ck_assert_int_eq(run_ranks_raw(2, body_timeout_zero, NULL, 120), 0); }
END_TEST

/* ---- two streams ------------------------------------------------------------------------------ */
/* Staged operations on two streams in turn with no host synchronization
 * between them: the staging buffers serve both, so each operation's stream
 * must wait until the one before it (on the other stream) has copied its last
 * piece out.  Run with GW_DEV_EMU_DELAY_US, so the two streams run out of
 * step; without that wait the pieces of one land in the other's output. */
#define STREAMS_ROUNDS 8
static int body_streams(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  dv = gw__dev();
  const size_t count = 100003; /* several staging pieces of 64 KiB */
  gw_dev_stream_t s[2];
  int32_t *din[STREAMS_ROUNDS], *dout[STREAMS_ROUNDS], *h[STREAMS_ROUNDS];
  for (int j = 0; j < 2; j++) DCHECK(dv->stream_create(&s[j]));
  for (int r = 0; r < STREAMS_ROUNDS; r++) {
    DCHECK(dv->alloc((void **)&din[r], count * 4));
    DCHECK(dv->alloc((void **)&dout[r], count * 4));
    DCHECK(dv->host_alloc((void **)&h[r], count * 4));
    for (size_t i = 0; i < count; i++) h[r][i] = (int32_t)(i % 1000) * (r + 1) + rank;
  }
  for (int r = 0; r < STREAMS_ROUNDS; r++) {
    DCHECK(dv->memcpy_async(din[r], h[r], count * 4, s[r % 2]));
    GWCHECK(gw_allreduce(din[r], dout[r], count, GW_INT32, GW_SUM, comm, s[r % 2]), comm);
    DCHECK(dv->memcpy_async(h[r], dout[r], count * 4, s[r % 2]));
  }
  for (int j = 0; j < 2; j++) DCHECK(dv->stream_sync(s[j]));
  gw_result_t async;
  EXPECT(gw_comm_get_async_error(comm, &async) == GW_SUCCESS && async == GW_SUCCESS, "async error: %s",
         gw_comm_last_error(comm));
  for (int r = 0; r < STREAMS_ROUNDS; r++)
    for (size_t i = 0; i < count; i++)
      EXPECT(h[r][i] == (int32_t)(n * (int)(i % 1000) * (r + 1) + n * (n - 1) / 2),
             "round %d (stream %d): element %zu is %d", r, r % 2, i, h[r][i]);
  for (int r = 0; r < STREAMS_ROUNDS; r++) {
    DCHECK(dv->free(din[r]));
    DCHECK(dv->free(dout[r]));
    DCHECK(dv->host_free(h[r]));
  }
  for (int j = 0; j < 2; j++) DCHECK(dv->stream_destroy(s[j]));
  return 0;
}

START_TEST(streams) { ck_assert_int_eq(run_ranks(2, body_streams, NULL, 300), 0); }

/* ---- streams sharing hardware queues ------------------------------------------------------------ */
/* Run with GW_DEV_EMU_CONNECTIONS=2 (CUDA_DEVICE_MAX_CONNECTIONS=2): a
 * stream is given a queue when it is made, round robin, so of these streams
 * some share a queue with the engine's stream the device ring would use.  A
 * caller's stream waiting for the progress thread would then hold up the
 * ring's own work behind it for good; the progress thread finds an engine
 * stream that answers while the caller's waits. */
#define QUEUES_STREAMS 5
static int body_queues(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  dv = gw__dev();
  const size_t count = 1 << 18; /* on the device ring where there is one */
  gw_dev_stream_t s[QUEUES_STREAMS];
  int32_t *d, *h;
  DCHECK(dv->alloc((void **)&d, count * 4));
  DCHECK(dv->host_alloc((void **)&h, count * 4));
  for (int j = 0; j < QUEUES_STREAMS; j++) DCHECK(dv->stream_create(&s[j]));
  for (int round = 0; round < 2; round++) {
    for (int j = 0; j < QUEUES_STREAMS; j++) {
      for (size_t i = 0; i < count; i++) h[i] = (int32_t)(i % 77) + rank + j;
      DCHECK(dv->memcpy_async(d, h, count * 4, s[j]));
      GWCHECK(gw_allreduce(d, d, count, GW_INT32, GW_SUM, comm, s[j]), comm);
      DCHECK(dv->memcpy_async(h, d, count * 4, s[j]));
      DCHECK(dv->stream_sync(s[j]));
      for (size_t i = 0; i < count; i++)
        EXPECT(h[i] == (int32_t)(n * ((int)(i % 77) + j) + n * (n - 1) / 2), "round %d, stream %d: element %zu is %d",
               round, j, i, h[i]);
    }
  }
  for (int j = 0; j < QUEUES_STREAMS; j++) DCHECK(dv->stream_destroy(s[j]));
  DCHECK(dv->free(d));
  DCHECK(dv->host_free(h));
  return 0;
}

START_TEST(queues) { ck_assert_int_eq(run_ranks(2, body_queues, NULL, 120), 0); }

/* ---- an operation that cannot all be put on its stream --------------------------------------------- */
/* Rank 1's enqueues start failing part way through an operation's work (the
 * emulator's injected failure): on the stream-ordered ring the caller's
 * program is then partial (the stream never says it is done), staged its
 * pieces stop, synchronized the progress thread's chunks fail (1 MiB: about
 * 120 items on the stream-ordered ring at 64 KiB chunks).  Each way the
 * call or the communicator reports it, every rank's stream gets through
 * (nothing waits for work that never went in), and no rank hangs. */
/* The shared start of unqueued's and fault's: a warm stream, rank 1's
 * emulator told to fail `after` (inject), one allreduce that returns success
 * or the CUDA error.  16 chunks or more, so the failure comes mid-operation
 * on every rank (at the default 4 MiB chunks 1 MiB was one: rank 0 could
 * finish before rank 1 failed, and an idle rank hears of a peer's failure at
 * its next call). */
struct injected {
  gw_dev_stream_t s;
  int32_t *d;
  size_t count;
  gw_result_t r;
};
static int injected_call(gw_comm_t comm, int rank, void (*inject)(long), long after, struct injected *x) {
  const char *cb = getenv("GW_DEV_CHUNK_BYTES");
  const size_t chunk = cb && atol(cb) > 0 ? (size_t)atol(cb) : (size_t)4 << 20;
  x->count = chunk * 4 > ((size_t)1 << 18) ? chunk * 4 : (size_t)1 << 18;
  if (warm_stream(comm, rank, x->count, &x->s, &x->d)) return 1;
  if (rank == 1) inject(after);
  x->r = gw_allreduce(x->d, x->d, x->count, GW_INT32, GW_SUM, comm, x->s);
  EXPECT(x->r == GW_SUCCESS || x->r == GW_ERR_CUDA, "rank %d: the call returned %d: %s", rank, (int)x->r,
         gw_comm_last_error(comm));
  return 0;
}

/* Until the communicator reports the failure (the peers hear of it through
 * the abort notice), up to 10 s; 1 when it does not. */
static int async_failure(gw_comm_t comm, int rank) {
  gw_result_t async = GW_SUCCESS;
  for (int i = 0; i < 1000 && async == GW_SUCCESS; i++) {
    EXPECT(gw_comm_get_async_error(comm, &async) == GW_SUCCESS, "get_async_error");
    if (async == GW_SUCCESS) usleep(10000);
  }
  EXPECT(async != GW_SUCCESS, "rank %d: the operation was reported good", rank);
  return 0;
}

static int body_unqueued(gw_comm_t comm, int rank, int n, void *arg) {
  dv = gw__dev();
  if (strcmp(dv->name, "emulated") != 0) return 0; /* the failure is injected in the emulator */
  struct injected x;
  if (injected_call(comm, rank, gw__dev_emu_fail_pushes_after, *(const long *)arg, &x)) return 1;
  gw_dev_stream_t s = x.s;
  int32_t *d = x.d;
  const size_t count = x.count;
  const gw_result_t r = x.r;
  DCHECK(dv->stream_sync(s)); /* its stream got through */
  if (async_failure(comm, rank)) return 1;
  if (rank == 1) gw__dev_emu_fail_pushes_after(-1);
  /* Where the caller's enqueue failed, what went in may still run: the
   * communicator takes no more stream-ordered calls (refused as a failed
   * communicator's, naming the enqueue's failure, once that is known). */
  if (r == GW_ERR_CUDA)
    EXPECT(gw_allreduce(d, d, count, GW_INT32, GW_SUM, comm, s) == GW_ERR_CUDA &&
               (strstr(gw_comm_last_error(comm), "takes no more stream-ordered calls") ||
                (strstr(gw_comm_last_error(comm), "earlier") && strstr(gw_comm_last_error(comm), "injected"))),
           "rank %d: a call after the failed enqueue: %s", rank, gw_comm_last_error(comm));
  DCHECK(dv->free(d));
  DCHECK(dv->stream_destroy(s));
  (void)n;
  return 0;
}

/* Early (before the stream says it started) and late (the progress thread has
 * seen it start: it must notice the rest never comes). */
START_TEST(unqueued) {
  static const long afters[] = {1, 7, 20};
  for (int i = 0; i < 3; i++) ck_assert_int_eq(run_ranks(2, body_unqueued, (void *)&afters[i], 120), 0);
}
END_TEST

/* ---- a device that faults (sticky) part way through an operation ---------------------------------- */
/* Rank 1's emulated device faults at its `after`-th stream item of the
 * operation (a kernel's illegal address: from then on its streams run nothing
 * and every call reaching the device fails, as a CUDA context's sticky error).
 * Rank 1 reports the device's error; rank 0, healthy, hears of it, its stream
 * gets through (nothing of it waits for what the dead device would have
 * written), and no rank hangs, in the call, the stream or destroy. */
static int body_fault(gw_comm_t comm, int rank, int n, void *arg) {
  dv = gw__dev();
  if (strcmp(dv->name, "emulated") != 0) return 0; /* the fault is injected in the emulator */
  struct injected x;
  if (injected_call(comm, rank, gw__dev_emu_fault_after, *(const long *)arg, &x)) return 1;
  const int synced = dv->stream_sync(x.s); /* returns: on rank 1 with the device's error */
  EXPECT(rank == 1 ? synced != 0 : synced == 0, "rank %d: stream_sync gave %d", rank, synced);
  if (async_failure(comm, rank)) return 1;
  const char *why = gw_comm_last_error(comm);
  EXPECT(strstr(why, "illegal memory access") && (rank == 1 || strstr(why, "rank 1")),
         "rank %d: the failure does not name the fault (and rank 1): %s", rank, why);
  gw_result_t again = gw_allreduce(x.d, x.d, x.count, GW_INT32, GW_SUM, comm, x.s);
  EXPECT(again != GW_SUCCESS, "rank %d: a call after the fault returned %d", rank, (int)again);
  DCHECK(dv->free(x.d));
  DCHECK(dv->stream_destroy(x.s));
  if (rank == 1) gw__dev_emu_fault_after(-1);
  (void)n;
  return 0;
}

START_TEST(fault) {
  static const long afters[] = {1, 7, 40};
  for (int i = 0; i < 3; i++) ck_assert_int_eq(run_ranks(2, body_fault, (void *)&afters[i], 120), 0);
}
END_TEST

/* ---- no hardware queue left for the synchronized ring ---------------------------------------------- */
/* Two streams in the two queues (GW_DEV_EMU_CONNECTIONS=2, synchronized ring,
 * every stream item 1 ms late): an operation on s0 is still running when one
 * on s1 goes in.  The ring's engine, the only one not behind s0's wait,
 * shares s1's queue, and its next chunk queues behind s1's wait for the
 * operation after it: no queue is free.  The engine wait gives up after the
 * communicator's timeout naming the queues (it waited for good), the streams
 * get through, and the communicator reports it. */
static int body_queue_taken(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  dv = gw__dev();
  const char *q = getenv("GW_DEV_EMU_CONNECTIONS"), *as = getenv("GW_DEV_ASYNC");
  /* only where it is set up so (meson's device-emu-queue-taken) */
  if (strcmp(dv->name, "emulated") != 0 || !q || strcmp(q, "2") || !as || strcmp(as, "0") ||
      !getenv("GW_DEV_EMU_DELAY_US"))
    return 0;
  EXPECT(gw_comm_set_timeout(comm, 4) == GW_SUCCESS, "timeout");
  const size_t big = 1 << 22, small = 1 << 18;
  gw_dev_stream_t s0, s1;
  DCHECK(dv->stream_create(&s0));
  DCHECK(dv->stream_create(&s1));
  int32_t *a, *b;
  DCHECK(dv->alloc((void **)&a, big * 4));
  DCHECK(dv->alloc((void **)&b, small * 4));
  double t0 = test_now();
  EXPECT(gw_allreduce(a, a, big, GW_INT32, GW_SUM, comm, s0) == GW_SUCCESS, "call on s0");
  usleep(100000);
  EXPECT(gw_allreduce(b, b, small, GW_INT32, GW_SUM, comm, s1) == GW_SUCCESS, "call on s1");
  DCHECK(dv->stream_sync(s0));
  DCHECK(dv->stream_sync(s1));
  gw_result_t async = GW_SUCCESS;
  for (int i = 0; i < 2000 && async == GW_SUCCESS; i++) {
    EXPECT(gw_comm_get_async_error(comm, &async) == GW_SUCCESS, "get_async_error");
    if (async == GW_SUCCESS) usleep(10000);
  }
  EXPECT(async != GW_SUCCESS, "rank %d: both operations reported good", rank);
  EXPECT(test_now() - t0 < 60, "rank %d: %.1f s", rank, test_now() - t0);
  fprintf(stderr, "rank %d: %s\n", rank, gw_comm_last_error(comm));
  DCHECK(dv->free(a));
  DCHECK(dv->free(b));
  DCHECK(dv->stream_destroy(s0));
  DCHECK(dv->stream_destroy(s1));
  return 0;
}

START_TEST(queue_taken) { ck_assert_int_eq(run_ranks(2, body_queue_taken, NULL, 120), 0); }
END_TEST

void device_add_stream_cases(Suite *s) {
  const char *names[] = {"streams", "queues", "unqueued", "fault", "queue_taken", "pieces_differ", "timeout_zero"};
  const TTest *tests[] = {streams, queues, unqueued, fault, queue_taken, pieces_differ, timeout_zero};
  for (int i = 0; i < 7; i++) {
    TCase *tc = tcase_create(names[i]);
    tcase_add_test(tc, tests[i]);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
  }
}
