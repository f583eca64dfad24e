/* test_bucket.c - the gradient bucketer (comm/bucket.c) on real ranks:
 * - gw_bucket_bounds: DDP's first-small-then-large split, rounding, refusals;
 * - 3 ranks marking the same buffer ready in DIFFERENT orders per rank (forward,
 *   backward, shuffled, in pieces straddling buckets): every element equals the
 *   exact sum (small integers in float32) after wait, over several steps with one
 *   bucketer;
 * - GW_AVG on 2 ranks (exact: halves of even integers);
 * - marking an element twice, or outside the buffer, is refused with a message;
 *   a bucket never completed makes wait fail naming it, after the buckets that
 *   were started finished, and fails the communicator (a peer that marked
 *   everything hears of it at once, with the reason), and so does destroy
 *   after a step whose only mark was refused; a bucket that cannot start keeps
 *   its reason for later marks and wait; a stream with no device to use is
 *   refused when set;
 * - the step's timestamps are ordered;
 * - a 16-bit wire (gw_bucketer_set_wire, bfloat16 and float16, SUM and AVG) on
 *   3 ranks: every result is a value of the wire dtype, within the rounding
 *   bound of the exact float32 sum, and bit-identical on every rank; back to
 *   float32 the sums are exact again; wrong wire dtypes and a change during a
 *   step are refused.
 */
#include <check.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "comm.h"   /* comm->test_paused */
#include "dev.h"    /* gw__dev: the emulator's streams */
#include "reduce.h" /* gw__cvt_* */

START_TEST(test_bounds) {
  size_t b[16];
  /* 100 floats, first bucket 40 bytes (10 elements), then 120 bytes (30). */
  ck_assert_int_eq(gw_bucket_bounds(100, 4, 40, 120, b, 16), 4);
  size_t want[] = {0, 10, 40, 70, 100};
  for (int i = 0; i < 5; i++) ck_assert_uint_eq(b[i], want[i]);
  /* Rounded up to whole elements; a last partial bucket. */
  ck_assert_int_eq(gw_bucket_bounds(10, 8, 9, 17, b, 16), 4); /* 2, then 3 elements */
  ck_assert_uint_eq(b[1], 2);
  ck_assert_uint_eq(b[2], 5);
  ck_assert_uint_eq(b[3], 8);
  ck_assert_uint_eq(b[4], 10);
  /* One bucket when everything fits in the first. */
  ck_assert_int_eq(gw_bucket_bounds(5, 4, 1 << 20, 1 << 20, b, 16), 1);
  ck_assert_uint_eq(b[1], 5);
  ck_assert_int_eq(gw_bucket_bounds(100, 4, 4, 4, b, 16), -1); /* 100 buckets do not fit in 16 bounds */
  ck_assert_int_eq(gw_bucket_bounds(0, 4, 4, 4, b, 16), -1);
}
END_TEST

#define N 100003 /* elements: not a multiple of anything */

/* Rank-dependent order of marking: the bucketer must still start buckets in the
 * same order on every rank. */
static void mark_all(gw_bucketer_t bk, int rank, int step, int *err) {
  size_t pieces = 37, len = (N + pieces - 1) / pieces;
  size_t order[37];
  for (size_t i = 0; i < pieces; i++) order[i] = i;
  if ((rank + step) % 3 == 1)
    for (size_t i = 0; i < pieces; i++) order[i] = pieces - 1 - i;
  if ((rank + step) % 3 == 2)
    for (size_t i = pieces - 1; i > 0; i--) {
      size_t j = mix64(i * 131 + (size_t)rank) % (i + 1), t = order[i];
      order[i] = order[j], order[j] = t;
    }
  for (size_t i = 0; i < pieces && !*err; i++) {
    size_t lo = order[i] * len, hi = lo + len < N ? lo + len : N;
    if (gw_bucketer_ready(bk, lo, hi - lo) != GW_SUCCESS) *err = 1;
  }
}

static int body_sum(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  float *g = malloc(N * sizeof(float));
  size_t bounds[64];
  int nb = gw_bucket_bounds(N, sizeof(float), 4000, 40000, bounds, 64);
  EXPECT(nb == 11, "%d buckets", nb);
  gw_bucketer_t bk;
  EXPECT(gw_bucketer_create(comm, g, N, GW_FLOAT32, GW_SUM, bounds, nb, &bk) == GW_SUCCESS, "%s",
         gw_comm_last_error(comm));
  for (int step = 0; step < 4; step++) {
    for (size_t i = 0; i < N; i++) g[i] = (float)((i * 7 + (size_t)rank * 3 + (size_t)step) % 1000);
    int err = 0;
    mark_all(bk, rank, step, &err);
    EXPECT(!err, "step %d: ready failed: %s", step, gw_comm_last_error(comm));
    EXPECT(gw_bucketer_wait(bk) == GW_SUCCESS, "step %d: %s", step, gw_comm_last_error(comm));
    for (size_t i = 0; i < N; i++) {
      float want = 0;
      for (int r = 0; r < n; r++) want += (float)((i * 7 + (size_t)r * 3 + (size_t)step) % 1000);
      EXPECT(g[i] == want, "step %d element %zu: %g, want %g", step, i, (double)g[i], (double)want);
    }
    struct gw_bucketer_times t;
    EXPECT(gw_bucketer_times(bk, &t) == GW_SUCCESS, "times");
    EXPECT(t.first_start > 0 && t.done >= t.first_start && t.done >= t.last_ready, "times out of order");
  }
  gw_bucketer_destroy(bk);
  free(g);
  return 0;
}

START_TEST(test_sum_any_order) { ck_assert_int_eq(run_ranks(3, body_sum, NULL, 120), 0); }
END_TEST

static int body_avg(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  enum { M = 5000 };
  float g[M];
  for (int i = 0; i < M; i++) g[i] = (float)(2 * (i % 50) + 2 * rank);
  size_t bounds[8];
  int nb = gw_bucket_bounds(M, sizeof(float), 1000, 8000, bounds, 8);
  gw_bucketer_t bk;
  EXPECT(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_AVG, bounds, nb, &bk) == GW_SUCCESS, "create");
  EXPECT(gw_bucketer_ready(bk, 0, M) == GW_SUCCESS, "ready");
  EXPECT(gw_bucketer_wait(bk) == GW_SUCCESS, "%s", gw_comm_last_error(comm));
  for (int i = 0; i < M; i++) EXPECT(g[i] == (float)(2 * (i % 50) + 1), "element %d: %g", i, (double)g[i]);
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_avg) { ck_assert_int_eq(run_ranks(2, body_avg, NULL, 60), 0); }
END_TEST

static float wire_val(int r, int i) { return (float)((double)(mix64((uint64_t)(i * 7 + r)) >> 11) * 0x1p-52 - 1.0); }

static int body_wire(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  enum { M = 50000 };
  static float g[M];
  size_t bounds[64];
  int nb = gw_bucket_bounds(M, sizeof(float), 4096, 65536, bounds, 64);
  for (int wi = 0; wi < 2; wi++) {
    gw_dtype_t wire = wi == 0 ? GW_BFLOAT16 : GW_FLOAT16;
    double u = wire == GW_BFLOAT16 ? 0x1p-8 : 0x1p-11;
    for (int avg = 0; avg < 2; avg++) {
      gw_bucketer_t bk;
      EXPECT(gw_bucketer_create(comm, g, M, GW_FLOAT32, avg ? GW_AVG : GW_SUM, bounds, nb, &bk) == GW_SUCCESS,
             "create");
      EXPECT(gw_bucketer_set_wire(bk, wire) == GW_SUCCESS, "%s", gw_comm_last_error(comm));
      for (int i = 0; i < M; i++) g[i] = wire_val(rank, i);
      for (int i = M; i > 0; i -= 1000) EXPECT(gw_bucketer_ready(bk, (size_t)(i - 1000), 1000) == GW_SUCCESS, "ready");
      EXPECT(gw_bucketer_set_wire(bk, GW_FLOAT32) == GW_ERR_INVALID_ARGUMENT, "wire changed during a step");
      EXPECT(gw_bucketer_wait(bk) == GW_SUCCESS, "%s", gw_comm_last_error(comm));
      uint64_t h = 1469598103934665603ull;
      for (int i = 0; i < M; i++) {
        double exact = 0, mag = 0;
        for (int r = 0; r < n; r++) exact += wire_val(r, i), mag += fabs(wire_val(r, i));
        double tol = (n + 1) * u * mag;
        if (avg) exact /= n, tol = (n + 2) * u * mag / n;
        uint16_t w;
        float back;
        gw__cvt_from_f32(wire, &w, &g[i], 1);
        gw__cvt_to_f32(wire, &back, &w, 1);
        EXPECT(back == g[i], "%s: element %d = %.9g is not a %s value", gw_dtype_name(wire), i, (double)g[i],
               gw_dtype_name(wire));
        EXPECT(fabs(g[i] - exact) <= tol, "%s %s: element %d = %.9g, exact %.9g, bound %.3g", gw_dtype_name(wire),
               avg ? "avg" : "sum", i, (double)g[i], exact, tol);
        uint32_t bits;
        memcpy(&bits, &g[i], 4);
        h = (h ^ bits) * 1099511628211ull;
      }
      uint64_t hmax = h, hmin = h;
      EXPECT(gw_allreduce(&hmax, &hmax, 1, GW_INT64, GW_MAX, comm, NULL) == GW_SUCCESS &&
                 gw_allreduce(&hmin, &hmin, 1, GW_INT64, GW_MIN, comm, NULL) == GW_SUCCESS && hmax == hmin,
             "%s: the ranks' results differ", gw_dtype_name(wire));
      /* Back to float32: exact sums of small integers again. */
      EXPECT(gw_bucketer_set_wire(bk, GW_FLOAT32) == GW_SUCCESS, "set float32");
      for (int i = 0; i < M; i++) g[i] = (float)(i % 1000 + rank);
      EXPECT(gw_bucketer_ready(bk, 0, M) == GW_SUCCESS && gw_bucketer_wait(bk) == GW_SUCCESS, "float32 step");
      for (int i = 0; i < M; i++) {
        double want = (double)n * (i % 1000) + n * (n - 1) / 2.0;
        if (avg) want = (float)want / (float)n;
        EXPECT(g[i] == (float)want, "float32 again: element %d = %g, expected %g", i, (double)g[i], want);
      }
      gw_bucketer_destroy(bk);
    }
  }
  /* A float16 average whose mean fits but whose partial sums do not (2 x 40000 >
   * 65504), divide-first: divided on the way into the wire, not an infinity. */
  {
    gw_bucketer_t bk;
    float big[64];
    size_t bb[] = {0, 64};
    EXPECT(gw_bucketer_create(comm, big, 64, GW_FLOAT32, GW_AVG, bb, 1, &bk) == GW_SUCCESS &&
               gw_bucketer_set_wire(bk, GW_FLOAT16) == GW_SUCCESS &&
               gw_bucketer_set_divide_first(bk, 1) == GW_SUCCESS, "create avg: %s", gw_comm_last_error(comm));
    for (int i = 0; i < 64; i++) big[i] = 40000.0f + 96.0f * (float)rank;
    EXPECT(gw_bucketer_ready(bk, 0, 64) == GW_SUCCESS && gw_bucketer_wait(bk) == GW_SUCCESS, "%s",
           gw_comm_last_error(comm));
    const double mean = 40000.0 + 96.0 * (n - 1) / 2.0;
    for (int i = 0; i < 64; i++)
      EXPECT(fabs(big[i] - mean) <= 64.0, "float16 average of ~40000s: element %d = %g, mean %g", i, (double)big[i],
             mean);
    gw_bucketer_destroy(bk);
  }
  /* Refusals: only float32 buffers, only 16-bit floats. */
  gw_bucketer_t bk;
  int32_t ib[64];
  size_t b2[] = {0, 64};
  EXPECT(gw_bucketer_create(comm, ib, 64, GW_INT32, GW_SUM, b2, 1, &bk) == GW_SUCCESS, "create int32");
  EXPECT(gw_bucketer_set_wire(bk, GW_BFLOAT16) == GW_ERR_INVALID_ARGUMENT, "int32 over bfloat16 accepted");
  EXPECT(strstr(gw_comm_last_error(comm), "int32 gradients can travel as themselves"), "message: %s",
         gw_comm_last_error(comm));
  gw_bucketer_destroy(bk);
  EXPECT(gw_bucketer_create(comm, g, 64, GW_FLOAT32, GW_SUM, b2, 1, &bk) == GW_SUCCESS, "create");
  EXPECT(gw_bucketer_set_wire(bk, GW_INT8) == GW_ERR_INVALID_ARGUMENT, "int8 wire accepted");
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_wire) { ck_assert_int_eq(run_ranks(3, body_wire, NULL, 300), 0); }
END_TEST

/* A host wire converts inside each bucket's allreduce (ring and two-rank
 * exchange: in their steps, counted in comm->folded_ops; the trees,
 * recursive doubling and one rank: a pass each way around the 16-bit
 * operation).  Either way every result is bit for bit what the conversions
 * around a plain 16-bit allreduce of the same bucket give: each rank's
 * float32 gradients rounded to the wire (times 1/n first with divide-first),
 * the bucket allreduced in the wire dtype, widened back.  Buckets of 1, 999,
 * 32334 and 36667 elements (odd tails, several ring rounds and channels
 * where the environment asks for small slots and two channels), every
 * algorithm and both protocols, bfloat16 and float16, sum, average,
 * divide-first average, and max over NaNs whose payloads and signs differ by
 * rank (which operand comes first shows); the path of each bucketer step is
 * the one forced. */
static int body_wire_fold(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  enum { M = 70001 };
  static float g[M], mine[M];
  static uint16_t ref[M];
  size_t bounds[] = {0, 1, 1000, 33334, M};
  const int nb = 4;
  const char *algos[][2] = {{"ring", "simple"}, {"ring", "ll"}, {"exchange", "simple"}, {"tree", "simple"},
                            {"auto", "auto"}};
  static const char *const modes[] = {"sum", "avg", "divide-first avg", "max"};
  for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++) {
    if (n == 1 && a > 0) break; /* one rank: no algorithm runs */
    EXPECT(gw_comm_set_algo(comm, algos[a][0], algos[a][1]) == GW_SUCCESS, "set %s/%s: %s", algos[a][0],
           algos[a][1], gw_comm_last_error(comm));
    const bool forced = strcmp(algos[a][0], "auto") != 0;
    const bool folds = n > 1 && (!strcmp(algos[a][0], "ring") || (!strcmp(algos[a][0], "exchange") && n == 2));
    for (int wi = 0; wi < 2; wi++) {
      const gw_dtype_t wire = wi ? GW_FLOAT16 : GW_BFLOAT16;
      for (int mode = 0; mode < 4; mode++) {
        const gw_op_t op = mode == 3 ? GW_MAX : mode ? GW_AVG : GW_SUM;
        gw_bucketer_t bk;
        EXPECT(gw_bucketer_create(comm, g, M, GW_FLOAT32, op, bounds, nb, &bk) == GW_SUCCESS &&
                   gw_bucketer_set_wire(bk, wire) == GW_SUCCESS &&
                   gw_bucketer_set_divide_first(bk, mode == 2) == GW_SUCCESS,
               "create: %s", gw_comm_last_error(comm));
        for (int i = 0; i < M; i++) {
          mine[i] = wire_val(rank, i) * (float)(1 + i % 37) * 0.25f;
          if (mode == 3 && i % 7 == 0) { /* NaNs of this rank's payload and sign */
            const uint32_t bits = (rank % 2 ? 0xff800000u : 0x7f800000u) | (uint32_t)(rank + 1) << 16 | 0x1234;
            memcpy(&mine[i], &bits, 4);
          }
          g[i] = mine[i];
        }
        const uint64_t folded = atomic_load(&((struct gw_comm *)comm)->folded_ops);
        for (int k = nb - 1; k >= 0; k--)
          EXPECT(gw_bucketer_ready(bk, bounds[k], bounds[k + 1] - bounds[k]) == GW_SUCCESS, "ready: %s",
                 gw_comm_last_error(comm));
        EXPECT(gw_bucketer_wait(bk) == GW_SUCCESS, "wait: %s", gw_comm_last_error(comm));
        const uint64_t now_folded = atomic_load(&((struct gw_comm *)comm)->folded_ops);
        EXPECT(!forced || now_folded - folded == (folds ? (uint64_t)nb : 0), "%s/%s on %d ranks: %llu of %d buckets "
               "folded, expected %d", algos[a][0], algos[a][1], n, (unsigned long long)(now_folded - folded), nb,
               folds ? nb : 0);
        char path[64];
        EXPECT(gw_comm_last_path(comm, path, sizeof path) == GW_SUCCESS, "path");
        const char *slash = strchr(path, '/');
        EXPECT(!forced || n == 1 || (slash && !strncmp(path, algos[a][0], strlen(algos[a][0])) &&
                                     !strcmp(slash + 1, algos[a][1])),
               "the last bucket went %s, not %s/%s", path, algos[a][0], algos[a][1]);
        gw_bucketer_destroy(bk);
        /* the reference: conversion passes around a 16-bit allreduce per bucket */
        gw__cvt_from_f32_scaled(wire, ref, mine, M, mode == 2 ? 1.0f / (float)n : 1.0f);
        for (int k = 0; k < nb; k++)
          EXPECT(gw_allreduce(ref + bounds[k], ref + bounds[k], bounds[k + 1] - bounds[k], wire,
                              mode == 2 ? GW_SUM : op, comm, NULL) == GW_SUCCESS,
                 "reference: %s", gw_comm_last_error(comm));
        for (int i = 0; i < M; i++) {
          float want;
          gw__cvt_to_f32(wire, &want, &ref[i], 1);
          uint32_t gb, wb;
          memcpy(&gb, &g[i], 4), memcpy(&wb, &want, 4);
          EXPECT(gb == wb, "%s/%s %s %s on %d ranks: element %d = %a (0x%08x), the conversions around a %s "
                 "allreduce give %a (0x%08x)", algos[a][0], algos[a][1], gw_dtype_name(wire), modes[mode], n, i,
                 (double)g[i], gb, gw_dtype_name(wire), (double)want, wb);
        }
      }
    }
  }
  return 0;
}

START_TEST(test_wire_fold) {
  ck_assert_int_eq(run_ranks(3, body_wire_fold, NULL, 300), 0);
  ck_assert_int_eq(run_ranks(2, body_wire_fold, NULL, 300), 0);
  ck_assert_int_eq(run_ranks(1, body_wire_fold, NULL, 300), 0);
  /* small slots and two channels for every size: many rounds, channel
   * slices; and the AVX2 kernels where the CPU has AVX-512 */
  setenv("GW_SHM_SLOT_BYTES", "4096", 1), setenv("GW_NCHANNELS", "2", 1), setenv("GW_CHANNEL_MIN_BYTES", "0", 1);
  setenv("GW_SIMD", "avx2", 1);
  int r3 = run_ranks(3, body_wire_fold, NULL, 300), r2 = run_ranks(2, body_wire_fold, NULL, 300);
  unsetenv("GW_SHM_SLOT_BYTES"), unsetenv("GW_NCHANNELS"), unsetenv("GW_CHANNEL_MIN_BYTES"), unsetenv("GW_SIMD");
  ck_assert_int_eq(r3, 0);
  ck_assert_int_eq(r2, 0);
}
END_TEST

/* The small cases' bucketer: M float32 elements summed in 3 buckets,
 * [0, 100) [100, 600) [600, M). */
enum { M = 1000 };
static gw_result_t create3(gw_comm_t comm, float *g, gw_bucketer_t *bk) {
  static const size_t bounds[] = {0, 100, 600, M};
  return gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, bounds, 3, bk);
}

static int body_refusals(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  float g[M];
  gw_bucketer_t bk;
  /* bounds that miss the buffer's ends say which end and the values (four
   * faults had one message without them) */
  const size_t short_end[] = {0, 500, M - 1}, late_start[] = {1, 500, M};
  EXPECT(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, short_end, 2, &bk) == GW_ERR_INVALID_ARGUMENT &&
             strstr(gw_comm_last_error(comm), "bounds[0] is 0 and bounds[2] (nbuckets) is 999"),
         "bounds short of the count: %s", gw_comm_last_error(comm));
  EXPECT(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, late_start, 2, &bk) == GW_ERR_INVALID_ARGUMENT &&
             strstr(gw_comm_last_error(comm), "bounds[0] is 1 and"),
         "bounds not from 0: %s", gw_comm_last_error(comm));
  EXPECT(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, NULL, 2, &bk) == GW_ERR_INVALID_ARGUMENT &&
             strstr(gw_comm_last_error(comm), "needs bounds and nbuckets >= 1"),
         "NULL bounds: %s", gw_comm_last_error(comm));
  EXPECT(create3(comm, g, &bk) == GW_SUCCESS, "create");
  /* A complete step with a range marked twice: reduced, but wait fails, naming
   * the mark; the communicator goes on (the steps below run on it). */
  for (int i = 0; i < M; i++) g[i] = 1.0f;
  EXPECT(gw_bucketer_ready(bk, 0, M) == GW_SUCCESS, "ready");
  EXPECT(gw_bucketer_ready(bk, 10, 20) == GW_ERR_INVALID_ARGUMENT, "double marking accepted");
  EXPECT(gw_bucketer_wait(bk) == GW_ERR_INVALID_ARGUMENT, "a step with a refused mark passed");
  EXPECT(strstr(gw_comm_last_error(comm), "every bucket was reduced, but [10, 30) was marked ready again"),
         "message: %s", gw_comm_last_error(comm));
  EXPECT(g[0] == 2.0f && g[M - 1] == 2.0f, "the step was not reduced: %g %g", (double)g[0], (double)g[M - 1]);
  EXPECT(gw_bucketer_ready(bk, 0, 50) == GW_SUCCESS, "ready after a complete step: %s", gw_comm_last_error(comm));
  EXPECT(gw_bucketer_ready(bk, 40, 20) == GW_ERR_INVALID_ARGUMENT, "double marking accepted");
  EXPECT(strstr(gw_comm_last_error(comm), "[40, 60) overlaps"), "message: %s", gw_comm_last_error(comm));
  EXPECT(gw_bucketer_ready(bk, 990, 20) == GW_ERR_INVALID_ARGUMENT, "outside accepted");
  EXPECT(strstr(gw_comm_last_error(comm), "offset 990 + count 20 is outside"), "message: %s", gw_comm_last_error(comm));
  EXPECT(gw_bucketer_ready(bk, 5, SIZE_MAX - 1) == GW_ERR_INVALID_ARGUMENT, "a wrapping range accepted");
  EXPECT(strstr(gw_comm_last_error(comm), "offset 5 + count 18446744073709551614 is outside"), "message: %s",
         gw_comm_last_error(comm));
  /* Bucket 0 completes and starts; bucket 1 never completes; wait names it. */
  for (int i = 0; i < M; i++) g[i] = 1.0f;
  EXPECT(gw_bucketer_ready(bk, 50, 50) == GW_SUCCESS, "ready");
  EXPECT(gw_bucketer_ready(bk, 100, 499) == GW_SUCCESS, "ready");
  EXPECT(gw_bucketer_wait(bk) == GW_ERR_INVALID_ARGUMENT, "incomplete bucket not reported");
  EXPECT(strstr(gw_comm_last_error(comm), "bucket 1 of 3 [100, 600) has only 499 of its 500"), "message: %s",
         gw_comm_last_error(comm));
  /* the first refused mark, whose own message later calls replaced */
  EXPECT(strstr(gw_comm_last_error(comm), "first refused mark: gw_bucketer_ready: [40, 60) overlaps"), "message: %s",
         gw_comm_last_error(comm));
  EXPECT(g[0] == 2.0f && g[100] == 1.0f, "bucket 0 was reduced (%g), bucket 1 was not (%g)", (double)g[0],
         (double)g[100]);
  /* The communicator cannot go on (a peer may wait in bucket 1): later calls say so. */
  EXPECT(gw_bucketer_ready(bk, 0, M) != GW_SUCCESS || gw_bucketer_wait(bk) != GW_SUCCESS,
         "a step ran on the communicator of an incomplete one");
  EXPECT(strstr(gw_comm_last_error(comm), "has only 499 of its 500"), "the first error is lost: %s",
         gw_comm_last_error(comm));
  /* An empty mark is still checked; bounds that would overflow a size_t. */
  EXPECT(gw_bucketer_ready(bk, M + 1, 0) == GW_ERR_INVALID_ARGUMENT, "an empty mark outside the buffer accepted");
  size_t one[2];
  EXPECT(gw_bucket_bounds(M, 4, SIZE_MAX, SIZE_MAX, one, 2) == 1 && one[1] == M, "SIZE_MAX first bucket");
  size_t bad[] = {0, 500, 400, M};
  gw_bucketer_t b2;
  EXPECT(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, bad, 3, &b2) == GW_ERR_INVALID_ARGUMENT && !b2,
         "reversed bounds accepted");
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_refusals) { ck_assert_int_eq(run_ranks(2, body_refusals, NULL, 60), 0); }
END_TEST

/* A buffer not aligned to its elements: refused at create, on every rank, the
 * communicator still good (accepted, the first step failed it everywhere). */
static int body_misaligned(gw_comm_t comm, int rank, int n, void *arg) {
  (void)rank, (void)arg;
  float g[65];
  size_t whole[] = {0, 64};
  gw_bucketer_t b = NULL;
  EXPECT(gw_bucketer_create(comm, (char *)g + 2, 64, GW_FLOAT32, GW_SUM, whole, 1, &b) == GW_ERR_INVALID_ARGUMENT &&
             !b && strstr(gw_comm_last_error(comm), "is not aligned to its 4-byte elements"),
         "a misaligned buffer: %s", gw_comm_last_error(comm));
  /* a count every collective refuses (a 16-bit wire buffer's size wrapped past
   * it, and the casts wrote past its end: a helper's probe under ASan) */
  const size_t huge[] = {0, 16, (size_t)1 << 62};
  EXPECT(gw_bucketer_create(comm, g, (size_t)1 << 62, GW_FLOAT32, GW_SUM, huge, 2, &b) == GW_ERR_INVALID_ARGUMENT &&
             !b && strstr(gw_comm_last_error(comm), "count 4611686018427387904 is too large for float32 elements"),
         "a count past the collectives' bound: %s", gw_comm_last_error(comm));
  float x = 1;
  EXPECT(gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL) == GW_SUCCESS && x == (float)n,
         "the communicator after the refusal: %s", gw_comm_last_error(comm));
  return 0;
}

START_TEST(test_misaligned) { ck_assert_int_eq(run_ranks(2, body_misaligned, NULL, 60), 0); }
END_TEST

/* Layouts that differ across ranks but whose bucket sizes line up (rank 2 has
 * one bucket fewer of the same size): refused on every rank, naming rank 2,
 * instead of each step summing rank 2's bucket 0 with the others' bucket 2;
 * a rank refusing its own arguments is named by the others at once; then
 * one that agrees works. */
static int body_layouts(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  float g[300];
  const size_t three[] = {0, 100, 200, 300}, two[] = {0, 100, 200};
  gw_bucketer_t bk = NULL;
  gw_result_t r = rank == 2 ? gw_bucketer_create(comm, g, 200, GW_FLOAT32, GW_SUM, two, 2, &bk)
                            : gw_bucketer_create(comm, g, 300, GW_FLOAT32, GW_SUM, three, 3, &bk);
  const char *e = gw_comm_last_error(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && !bk && strstr(e, "the bucket layouts differ across ranks") &&
             strstr(e, rank == 2 ? "rank 0 has 3 over 300" : "rank 2 has 2 over 200"),
         "differing layouts: %s: %s", gw_strerror(r), e);
  /* the same sizes, other bounds */
  const size_t other[] = {0, 150, 200, 300};
  r = gw_bucketer_create(comm, g, 300, GW_FLOAT32, GW_SUM, rank == 1 ? other : three, 3, &bk);
  e = gw_comm_last_error(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && !bk && strstr(e, "the bounds between the buckets differ") &&
             strstr(e, rank == 1 ? "rank 0 has 3 over 300 float32 elements (sum)" : "rank 1 has 3 over 300"),
         "differing bounds: %s: %s", gw_strerror(r), e);
  /* the same counts, another dtype or op: named (the counts alone matched) */
  r = gw_bucketer_create(comm, g, 300, rank == 1 ? GW_BFLOAT16 : GW_FLOAT32, rank == 2 ? GW_AVG : GW_SUM, three, 3,
                         &bk);
  e = gw_comm_last_error(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && !bk && !strstr(e, "the bounds between") &&
             strstr(e, rank == 0 ? "rank 1 has 3 over 300 bfloat16 elements (sum)"
                                 : rank == 1 ? "this rank has 3 buckets over 300 bfloat16 elements (sum), rank 0 has"
                                             : "this rank has 3 buckets over 300 float32 elements (avg), rank 0 has"),
         "differing dtype and op: %s: %s", gw_strerror(r), e);
  /* Rank 1's own arguments refused (bounds past the count): it still takes
   * part, so the others fail at once naming it (they waited GW_TIMEOUT). */
  const size_t past[] = {0, 100, 200, 400};
  const double t0 = test_now();
  r = gw_bucketer_create(comm, g, 300, GW_FLOAT32, GW_SUM, rank == 1 ? past : three, 3, &bk);
  e = gw_comm_last_error(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && !bk && test_now() - t0 < 10 &&
             (rank == 1 ? !strstr(e, "refused its own") : strstr(e, "rank 1 refused its own arguments") != NULL),
         "rank 1's arguments refused: %s after %.1f s: %s", gw_strerror(r), test_now() - t0, e);
  /* Rank 2 out of memory for its bucketer: every rank refuses (the others
   * held bucketers, rank 2 none, and the next collective paired rank 2's with
   * their first bucket's allreduce). */
  if (rank == 2) setenv("GW_TEST_BUCKETER_NOMEM", "1", 1);
  r = gw_bucketer_create(comm, g, 300, GW_FLOAT32, GW_SUM, three, 3, &bk);
  unsetenv("GW_TEST_BUCKETER_NOMEM");
  e = gw_comm_last_error(comm);
  EXPECT(r != GW_SUCCESS && !bk &&
             (rank == 2 ? strstr(e, "out of memory") != NULL : strstr(e, "rank 2 refused its own arguments") != NULL),
         "rank 2 out of memory: %s: %s", gw_strerror(r), e);
  EXPECT(gw_bucketer_create(comm, g, 300, GW_FLOAT32, GW_SUM, three, 3, &bk) == GW_SUCCESS, "%s",
         gw_comm_last_error(comm));
  for (int i = 0; i < 300; i++) g[i] = (float)(i + rank);
  EXPECT(gw_bucketer_ready(bk, 0, 300) == GW_SUCCESS && gw_bucketer_wait(bk) == GW_SUCCESS, "%s",
         gw_comm_last_error(comm));
  for (int i = 0; i < 300; i++) EXPECT(g[i] == (float)(n * i + n * (n - 1) / 2), "element %d: %g", i, (double)g[i]);
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_layouts_differ) { ck_assert_int_eq(run_ranks(3, body_layouts, NULL, 60), 0); }
END_TEST

/* Two bucketers on one communicator with buckets of one size: a step that
 * starts them in the same order on every rank sums each with itself; one
 * whose order differs across ranks (rank 0 marks A first, rank 1 B) summed
 * A's gradients with B's on every rank, all calls successful.  Now each
 * bucketer's allreduces carry its number, and both ranks fail naming both. */
static int body_two_bucketers(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  float a[100], b[100];
  const size_t one[] = {0, 100};
  gw_bucketer_t ba = NULL, bb = NULL;
  EXPECT(gw_comm_set_timeout(comm, 30) == GW_SUCCESS, "timeout");
  EXPECT(gw_bucketer_create(comm, a, 100, GW_FLOAT32, GW_SUM, one, 1, &ba) == GW_SUCCESS &&
             gw_bucketer_create(comm, b, 100, GW_FLOAT32, GW_SUM, one, 1, &bb) == GW_SUCCESS,
         "create: %s", gw_comm_last_error(comm));
  for (int step = 0; step < 2; step++) {
    for (int i = 0; i < 100; i++) a[i] = (float)(1 + rank), b[i] = (float)(100 * (1 + rank));
    gw_bucketer_t first = step == 1 && rank == 1 ? bb : ba, second = first == ba ? bb : ba;
    const double t0 = test_now();
    gw_result_t r = gw_bucketer_ready(first, 0, 100);
    if (r == GW_SUCCESS) r = gw_bucketer_ready(second, 0, 100);
    gw_result_t ra = gw_bucketer_wait(ba), rb = gw_bucketer_wait(bb);
    const char *e = gw_comm_last_error(comm);
    if (step == 0) {
      EXPECT(r == GW_SUCCESS && ra == GW_SUCCESS && rb == GW_SUCCESS, "same order: %s", e);
      for (int i = 0; i < 100; i++)
        EXPECT(a[i] == (float)(n * (n + 1) / 2) && b[i] == (float)(100 * n * (n + 1) / 2), "element %d: %g %g", i,
               (double)a[i], (double)b[i]);
      continue;
    }
    EXPECT(ra != GW_SUCCESS && rb != GW_SUCCESS && test_now() - t0 < 20, "orders differ: %s %s after %.1f s: %s",
           gw_strerror(ra), gw_strerror(rb), test_now() - t0, e);
    /* the first error the communicator met names both calls (rank 0's call
     * was bucketer 1's, rank 1's bucketer 2's) */
    gw_result_t async = GW_SUCCESS;
    char why[GW_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", e);
    EXPECT(gw_comm_get_async_error(comm, &async) == GW_SUCCESS && async != GW_SUCCESS, "async %s",
           gw_strerror(async));
    EXPECT(strstr(why, "for bucket 0 of bucketer 1") && strstr(why, "for bucket 0 of bucketer 2"),
           "orders differ: the message names neither: %s", why);
  }
  gw_bucketer_destroy(ba);
  gw_bucketer_destroy(bb);
  return 0;
}

START_TEST(test_two_bucketers) { ck_assert_int_eq(run_ranks(2, body_two_bucketers, NULL, 90), 0); }
END_TEST

/* Rank 0 leaves bucket 1 unmarked, rank 1 marks everything: rank 1 waits in
 * bucket 1's allreduce and must hear of rank 0's failure at once (not at its
 * deadline, and not pair bucket 1 with rank 0's next step), with the reason. */
static int body_one_rank_incomplete(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  float g[M];
  gw_bucketer_t bk;
  EXPECT(gw_comm_set_timeout(comm, 60) == GW_SUCCESS, "timeout");
  EXPECT(create3(comm, g, &bk) == GW_SUCCESS, "create");
  for (int i = 0; i < M; i++) g[i] = 1.0f;
  double t0 = test_now();
  EXPECT(gw_bucketer_ready(bk, 0, rank == 0 ? 599 : M) == GW_SUCCESS, "ready: %s", gw_comm_last_error(comm));
  if (arg) usleep(100000); /* the wait comes while the progress thread pauses (below) */
  gw_result_t r = gw_bucketer_wait(bk);
  double took = test_now() - t0;
  const char *msg = gw_comm_last_error(comm);
  gw_result_t async = GW_SUCCESS;
  if (rank == 0) {
    EXPECT(r == GW_ERR_INVALID_ARGUMENT && strstr(msg, "bucket 1 of 3"), "rank 0: %s: %s", gw_strerror(r), msg);
    /* the communicator failed with the reason (not merely aborted) */
    EXPECT(gw_comm_get_async_error(comm, &async) == GW_SUCCESS && async == GW_ERR_INVALID_ARGUMENT,
           "rank 0: async error %s", gw_strerror(async));
  }
  else
    EXPECT(r != GW_SUCCESS && strstr(msg, "rank 0") && strstr(msg, "bucket 1 of 3"), "rank 1: %s: %s",
           gw_strerror(r), msg);
  EXPECT(took < 20, "rank %d waited %.1f s", rank, took);
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_one_rank_incomplete) {
  ck_assert_int_eq(run_ranks(2, body_one_rank_incomplete, NULL, 90), 0);
  /* the progress thread slow between an operation's end and its request's
   * "done" (0.4 s), the bucketer's wait in that gap: it must find nothing
   * pending once it sees the request done (it aborted instead of failing the
   * communicator with the reason) */
  setenv("GW_TEST_COMPLETE_PAUSE_US", "400000", 1);
  ck_assert_int_eq(run_ranks(2, body_one_rank_incomplete, (void *)"pause", 90), 0);
  unsetenv("GW_TEST_COMPLETE_PAUSE_US");
}
END_TEST

/* A stream the bucketer cannot use (no device layer, or a communicator bound
 * to none: GW_DEVICE=none) is refused when set, for its allreduces or as the
 * compute stream, and the communicator goes on. */
static int body_stream_refused(gw_comm_t comm, int rank, int n, void *arg) {
  (void)rank;
  float g[M];
  gw_bucketer_t bk;
  EXPECT(create3(comm, g, &bk) == GW_SUCCESS, "create");
  /* arg NULL: nothing asked of the environment, so only where no device
   * layer exists (a GPU machine binds the communicator to its device). */
  if (arg || !gw__dev()) {
    gw_result_t r = gw_bucketer_set_stream(bk, (void *)&g);
    EXPECT(r != GW_SUCCESS && strstr(gw_comm_last_error(comm), "gw_bucketer_set_stream: a stream was given"),
           "set_stream without a device: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
    r = gw_bucketer_set_compute_stream(bk, (void *)&g);
    EXPECT(r != GW_SUCCESS && strstr(gw_comm_last_error(comm), "gw_bucketer_set_compute_stream: "),
           "set_compute_stream without a device: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
  }
  for (int i = 0; i < M; i++) g[i] = 1.0f;
  EXPECT(gw_bucketer_ready(bk, 0, M) == GW_SUCCESS && gw_bucketer_wait(bk) == GW_SUCCESS, "the step: %s",
         gw_comm_last_error(comm));
  EXPECT(g[0] == (float)n && g[M - 1] == (float)n, "the sum is %g", (double)g[0]);
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_stream_refused) {
  ck_assert_int_eq(run_ranks(2, body_stream_refused, NULL, 60), 0); /* no device layer here (CPU machines) */
  setenv("GW_DEVICE", "none", 1);
  ck_assert_int_eq(run_ranks(2, body_stream_refused, (void *)"none", 60), 0);
  setenv("GW_DEV_EMULATE", "2", 1); /* a device layer, the communicator bound to none */
  ck_assert_int_eq(run_ranks(2, body_stream_refused, (void *)"none", 60), 0);
  unsetenv("GW_DEVICE"), unsetenv("GW_DEV_EMULATE"); /* the next tests' (CK_FORK=no) */
}
END_TEST

/* A bucket that cannot start (here: its stream is being captured into a
 * graph) keeps its reason: later marks and wait report it, not "never
 * completely marked". */
static int body_start_failure(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n, (void)rank;
  float g[M];
  gw_bucketer_t bk;
  gw_dev_stream_t st;
  EXPECT(gw__dev() && gw__dev()->stream_create(&st) == 0, "an emulated stream");
  EXPECT(create3(comm, g, &bk) == GW_SUCCESS, "create");
  EXPECT(gw_bucketer_set_stream(bk, st) == GW_SUCCESS, "set_stream: %s", gw_comm_last_error(comm));
  struct gw_bucketer_times t0;
  EXPECT(gw_bucketer_ready(bk, 0, M) == GW_SUCCESS && gw_bucketer_wait(bk) == GW_SUCCESS, "a good step: %s",
         gw_comm_last_error(comm));
  EXPECT(gw_bucketer_times(bk, &t0) == GW_SUCCESS && t0.first_start > 0 && t0.last_ready > 0 &&
             t0.done >= t0.first_start && t0.done >= t0.last_ready, "times of the good step");
  gw__dev_emu_set_capturing(st, 1);
  gw_result_t r = gw_bucketer_ready(bk, 0, 150);
  EXPECT(r != GW_SUCCESS && strstr(gw_comm_last_error(comm), "captured"), "bucket 0 started: %s: %s",
         gw_strerror(r), gw_comm_last_error(comm));
  EXPECT(gw_bucketer_ready(bk, 150, M - 150) == r && strstr(gw_comm_last_error(comm), "could not start"),
         "a later mark: %s", gw_comm_last_error(comm));
  EXPECT(gw_bucketer_wait(bk) == r, "wait");
  const char *msg = gw_comm_last_error(comm);
  EXPECT(strstr(msg, "bucket 0 of 3") && strstr(msg, "captured") && !strstr(msg, "marked ready"), "wait: %s", msg);
  struct gw_bucketer_times t1;
  EXPECT(gw_bucketer_times(bk, &t1) == GW_SUCCESS && memcmp(&t0, &t1, sizeof t0) == 0,
         "the times of a failed step replaced the last completed one's");
  gw__dev_emu_set_capturing(st, 0);
  gw_bucketer_destroy(bk);
  gw__dev()->stream_destroy(st);
  return 0;
}

/* Rank 0's only mark of a step is refused (outside the buffer) and it destroys
 * the bucketer without a wait; the others marked everything and wait in the
 * step's buckets.  They must hear of it at once, with the reason: a rank that
 * made a new bucketer would otherwise pair its next step with their step. */
static int body_destroy_after_refused(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  float g[M];
  gw_bucketer_t bk;
  EXPECT(gw_comm_set_timeout(comm, 60) == GW_SUCCESS, "timeout");
  EXPECT(create3(comm, g, &bk) == GW_SUCCESS, "create");
  for (int i = 0; i < M; i++) g[i] = 1.0f;
  if (rank == 0) {
    EXPECT(gw_bucketer_ready(bk, M, 1) == GW_ERR_INVALID_ARGUMENT, "a mark outside the buffer accepted");
    gw_bucketer_destroy(bk);
    gw_result_t async = GW_SUCCESS;
    EXPECT(gw_comm_get_async_error(comm, &async) == GW_SUCCESS && async == GW_ERR_INVALID_ARGUMENT,
           "rank 0: the communicator goes on (%s)", gw_strerror(async));
    return 0;
  }
  double t0 = test_now();
  EXPECT(gw_bucketer_ready(bk, 0, M) == GW_SUCCESS, "ready: %s", gw_comm_last_error(comm));
  gw_result_t r = gw_bucketer_wait(bk);
  const char *msg = gw_comm_last_error(comm);
  EXPECT(r != GW_SUCCESS && strstr(msg, "rank 0: gw_bucketer_destroy: a step was left part way (0 of 3") &&
             strstr(msg, "first refused mark: gw_bucketer_ready: offset 1000"),
         "rank %d: %s: %s", rank, gw_strerror(r), msg);
  EXPECT(test_now() - t0 < 20, "rank %d waited %.1f s", rank, test_now() - t0);
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_destroy_after_refused) { ck_assert_int_eq(run_ranks(3, body_destroy_after_refused, NULL, 90), 0); }
END_TEST

/* A mark refused for the settings (a host wire with a stream) changes
 * nothing: the settings can be put right and the step go on.  A wait after a
 * refused mark names it, not only the bucket left unmarked. */
static int body_refused_settings(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  float g[M];
  gw_bucketer_t bk;
  EXPECT(create3(comm, g, &bk) == GW_SUCCESS, "create");
  gw_dev_stream_t st;
  EXPECT(gw__dev() && gw__dev()->stream_create(&st) == 0, "an emulated stream");
  EXPECT(gw_bucketer_set_wire(bk, GW_BFLOAT16) == GW_SUCCESS && gw_bucketer_set_stream(bk, st) == GW_SUCCESS,
         "settings: %s", gw_comm_last_error(comm));
  for (int i = 0; i < M; i++) g[i] = (float)(i % 7 + rank);
  EXPECT(gw_bucketer_ready(bk, 0, 50) == GW_ERR_INVALID_ARGUMENT, "a host wire with a stream accepted");
  EXPECT(gw_bucketer_set_stream(bk, NULL) == GW_SUCCESS, "the settings put right after a refused mark: %s",
         gw_comm_last_error(comm));
  EXPECT(gw_bucketer_ready(bk, 0, M) == GW_SUCCESS && gw_bucketer_wait(bk) == GW_SUCCESS, "the step: %s",
         gw_comm_last_error(comm));
  for (int i = 0; i < M; i++) /* small integers: exact in bfloat16 */
    EXPECT(g[i] == (float)(n * (i % 7) + n * (n - 1) / 2), "element %d is %g", i, (double)g[i]);
  /* refused again, and the step left there */
  EXPECT(gw_bucketer_set_stream(bk, st) == GW_SUCCESS, "set_stream");
  EXPECT(gw_bucketer_ready(bk, 0, M) == GW_ERR_INVALID_ARGUMENT, "a host wire with a stream accepted");
  EXPECT(gw_bucketer_wait(bk) == GW_ERR_INVALID_ARGUMENT, "a step with nothing marked passed");
  const char *msg = gw_comm_last_error(comm);
  EXPECT(strstr(msg, "bucket 0 of 3 [0, 100) has only 0 of its 100") &&
             strstr(msg, "first refused mark: gw_bucketer_ready: host gradients with a bfloat16 wire"),
         "wait: %s", msg);
  gw_result_t async = GW_SUCCESS;
  EXPECT(gw_comm_get_async_error(comm, &async) == GW_SUCCESS && async != GW_SUCCESS, "the communicator goes on");
  EXPECT(gw_bucketer_set_stream(bk, NULL) == GW_SUCCESS, "set_stream");
  gw_bucketer_destroy(bk);
  gw__dev()->stream_destroy(st);
  return 0;
}

START_TEST(test_refused_settings) {
  setenv("GW_DEV_EMULATE", "2", 1); /* a stream to refuse with host gradients */
  ck_assert_int_eq(run_ranks(2, body_refused_settings, NULL, 60), 0);
  unsetenv("GW_DEV_EMULATE");
}
END_TEST

/* The step's failure while another thread's call holds the connections (its
 * inline path, paused by GW_TEST_INLINE_PAUSE_US): the notice cannot go out
 * beside it, so the communicator is aborted, and that call tells the peers the
 * bucketer's reason, not "aborted by gw_comm_abort" (never called). */
struct inline_call {
  gw_comm_t comm;
  gw_result_t r;
};

static void *inline_allreduce(void *arg) {
  struct inline_call *c = arg;
  int32_t v = 1;
  c->r = gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, c->comm, NULL);
  return NULL;
}

/* Until a blocking call on another thread is in its test pause (at most
 * 20 s); whether it got there (else the test would go on without the race). */
static bool wait_paused(gw_comm_t comm) {
  for (double t0 = test_now(); !atomic_load(&comm->test_paused) && test_now() - t0 < 20;) usleep(1000);
  return atomic_load(&comm->test_paused) != 0;
}

static int body_reason_beside_call(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  gw_comm_set_timeout(comm, 30);
  struct inline_call c = {comm, GW_SUCCESS};
  float g[M];
  gw_bucketer_t bk;
  EXPECT(create3(comm, g, &bk) == GW_SUCCESS, "create"); /* collective */
  if (rank == 1) {
    inline_allreduce(&c);
    EXPECT(c.r != GW_SUCCESS && strstr(gw_comm_last_error(comm), "gw_bucketer_wait") &&
               !strstr(gw_comm_last_error(comm), "gw_comm_abort"),
           "rank 1: %s: %s", gw_strerror(c.r), gw_comm_last_error(comm));
    gw_bucketer_destroy(bk);
    return 0;
  }
  pthread_t th;
  setenv("GW_TEST_INLINE_PAUSE_US", "30000000", 1); /* rank 0's next call; over at the abort */
  EXPECT(pthread_create(&th, NULL, inline_allreduce, &c) == 0, "pthread_create");
  EXPECT(wait_paused(comm), "the other thread's call never paused"); /* it holds the connections */
  EXPECT(gw_bucketer_wait(bk) == GW_ERR_INVALID_ARGUMENT, "a step with nothing marked passed");
  pthread_join(th, NULL);
  setenv("GW_TEST_INLINE_PAUSE_US", "0", 1); /* (not while the other thread runs: getenv there) */
  EXPECT(c.r == GW_ERR_ABORTED && strstr(gw_comm_last_error(comm), "gw_bucketer_wait"), "rank 0's call: %s: %s",
         gw_strerror(c.r), gw_comm_last_error(comm));
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_reason_beside_call) {
  setenv("GW_TEST_INLINE_PAUSE_US", "0", 1); /* armed: rank 0 sets it for one call */
  ck_assert_int_eq(run_ranks(2, body_reason_beside_call, NULL, 60), 0);
  unsetenv("GW_TEST_INLINE_PAUSE_US");
}
END_TEST

/* The same with the other thread's call past its last wait when the step
 * fails (held by GW_TEST_INLINE_HOLD_US before it lets the connections go):
 * it ends without telling anyone, so the notice goes from the bucketer's wait
 * once the connections are free.  Rank 1, in bucket 0's allreduce, hears the
 * reason within seconds, not when rank 0 destroys the communicator. */
static int body_reason_after_call(gw_comm_t comm, int rank, int n, void *arg) {
  _Atomic int *heard = arg; /* shared: rank 1 has its answer (rank 0's communicator stays until then) */
  (void)n;
  gw_comm_set_timeout(comm, 30);
  struct inline_call c = {comm, GW_SUCCESS};
  float g[M];
  gw_bucketer_t bk;
  EXPECT(create3(comm, g, &bk) == GW_SUCCESS, "create");
  if (rank == 1) {
    inline_allreduce(&c);
    EXPECT(c.r == GW_SUCCESS, "rank 1's allreduce: %s", gw_comm_last_error(comm));
    for (int i = 0; i < M; i++) g[i] = 1.0f;
    const double t0 = test_now();
    EXPECT(gw_bucketer_ready(bk, 0, M) == GW_SUCCESS, "ready: %s", gw_comm_last_error(comm));
    EXPECT(gw_bucketer_wait(bk) != GW_SUCCESS, "rank 1's step passed");
    const double took = test_now() - t0;
    atomic_store(heard, 1);
    EXPECT(strstr(gw_comm_last_error(comm), "gw_bucketer_wait") && took < 20, "rank 1 after %.1f s: %s", took,
           gw_comm_last_error(comm));
  } else {
    pthread_t th;
    setenv("GW_TEST_INLINE_HOLD_US", "30000000", 1); /* rank 0's next call; over at the abort */
    EXPECT(pthread_create(&th, NULL, inline_allreduce, &c) == 0, "pthread_create");
    EXPECT(wait_paused(comm), "the other thread's call never held"); /* it ran and holds the connections */
    EXPECT(gw_bucketer_wait(bk) == GW_ERR_INVALID_ARGUMENT, "a step with nothing marked passed");
    pthread_join(th, NULL);
    setenv("GW_TEST_INLINE_HOLD_US", "0", 1); /* (not while the other thread runs: getenv there) */
    /* the communicator stays until rank 1 heard (at most 30 s): its destroy would tell the peers too */
    for (double t0 = test_now(); !atomic_load(heard) && test_now() - t0 < 30;) usleep(10000);
  }
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_reason_after_call) {
  setenv("GW_TEST_INLINE_HOLD_US", "0", 1); /* armed: rank 0 sets it for one call */
  _Atomic int *heard = test_shared_int();
  ck_assert_int_eq(run_ranks(2, body_reason_after_call, (void *)heard, 60), 0);
  test_shared_free(heard);
  unsetenv("GW_TEST_INLINE_HOLD_US");
}
END_TEST

/* A mark on a communicator that failed already (here rank 1's abort, heard
 * by rank 0 in a barrier) returns the failure at once: it returned success
 * until a mark completed a bucket, or the wait. */
static int body_ready_after_failure(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  gw_comm_set_timeout(comm, 30);
  float g[M] = {0};
  gw_bucketer_t bk;
  EXPECT(create3(comm, g, &bk) == GW_SUCCESS, "create");
  if (rank == 1) gw_comm_abort(comm);
  EXPECT(gw_barrier(comm) != GW_SUCCESS, "rank %d: the barrier passed", rank);
  const gw_result_t r = gw_bucketer_ready(bk, 0, 1); /* completes no bucket */
  EXPECT(r == (rank == 1 ? GW_ERR_ABORTED : GW_ERR_REMOTE) &&
             strstr(gw_comm_last_error(comm), "gw_bucketer_ready: the communicator has failed (first error: ") &&
             strstr(gw_comm_last_error(comm), "rank 1: aborted by gw_comm_abort"),
         "rank %d: ready on a failed communicator: %s: %s", rank, gw_strerror(r), gw_comm_last_error(comm));
  /* the wait says why, not merely that the bucket was left incomplete */
  EXPECT(gw_bucketer_wait(bk) != GW_SUCCESS && strstr(gw_comm_last_error(comm), "rank 1: aborted by gw_comm_abort") &&
             !strstr(gw_comm_last_error(comm), "marked ready"),
         "rank %d: the step's wait: %s", rank, gw_comm_last_error(comm));
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_ready_after_failure) { ck_assert_int_eq(run_ranks(2, body_ready_after_failure, NULL, 60), 0); }
END_TEST

START_TEST(test_start_failure) {
  setenv("GW_DEV_EMULATE", "2", 1);
  ck_assert_int_eq(run_ranks(2, body_start_failure, NULL, 60), 0);
  unsetenv("GW_DEV_EMULATE");
}
END_TEST

void add_handle_tests(TCase *tc); /* test_bucket_handles.c */

int main(void) {
  Suite *s = suite_create("bucket");
  TCase *tc = tcase_create("bucket");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_bounds);
  tcase_add_test(tc, test_sum_any_order);
  tcase_add_test(tc, test_avg);
  tcase_add_test(tc, test_refusals);
  tcase_add_test(tc, test_misaligned);
  tcase_add_test(tc, test_layouts_differ);
  tcase_add_test(tc, test_two_bucketers);
  tcase_add_test(tc, test_one_rank_incomplete);
  tcase_add_test(tc, test_stream_refused);
  tcase_add_test(tc, test_start_failure);
  tcase_add_test(tc, test_ready_after_failure);
  tcase_add_test(tc, test_destroy_after_refused);
  tcase_add_test(tc, test_refused_settings);
  tcase_add_test(tc, test_reason_beside_call);
  tcase_add_test(tc, test_reason_after_call);
  tcase_add_test(tc, test_wire);
  tcase_add_test(tc, test_wire_fold);
  add_handle_tests(tc);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
