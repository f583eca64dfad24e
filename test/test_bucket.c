/* test_bucket.c - the gradient bucketer (comm/bucket.c) on real ranks:
 * - gw_bucket_bounds: DDP's first-small-then-large split, rounding, refusals;
 * - 3 ranks marking the same buffer ready in DIFFERENT orders per rank (forward,
 *   backward, shuffled, in pieces straddling buckets): every element equals the
 *   exact sum (small integers in float32) after wait, over several steps with one
 *   bucketer;
 * - GW_AVG on 2 ranks (exact: halves of even integers);
 * - marking an element twice, or outside the buffer, is refused with a message;
 *   a bucket never completed makes wait fail naming it, after the buckets that
 *   were started finished, and the next step works;
 * - the step's timestamps are ordered.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

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

static int body_refusals(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  enum { M = 1000 };
  float g[M];
  size_t bounds[] = {0, 100, 600, M};
  gw_bucketer_t bk;
  EXPECT(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, bounds, 3, &bk) == GW_SUCCESS, "create");
  EXPECT(gw_bucketer_ready(bk, 0, 50) == GW_SUCCESS, "ready");
  EXPECT(gw_bucketer_ready(bk, 40, 20) == GW_ERR_INVALID_ARGUMENT, "double marking accepted");
  EXPECT(strstr(gw_comm_last_error(comm), "[40, 60) overlaps"), "message: %s", gw_comm_last_error(comm));
  EXPECT(gw_bucketer_ready(bk, 990, 20) == GW_ERR_INVALID_ARGUMENT, "outside accepted");
  /* Bucket 0 completes and starts; bucket 1 never completes; wait names it. */
  for (int i = 0; i < M; i++) g[i] = 1.0f;
  EXPECT(gw_bucketer_ready(bk, 50, 50) == GW_SUCCESS, "ready");
  EXPECT(gw_bucketer_ready(bk, 100, 499) == GW_SUCCESS, "ready");
  EXPECT(gw_bucketer_wait(bk) == GW_ERR_INVALID_ARGUMENT, "incomplete bucket not reported");
  EXPECT(strstr(gw_comm_last_error(comm), "bucket 1 of 3 [100, 600) has only 499 of its 500"), "message: %s",
         gw_comm_last_error(comm));
  EXPECT(g[0] == 2.0f && g[100] == 1.0f, "bucket 0 was reduced (%g), bucket 1 was not (%g)", (double)g[0],
         (double)g[100]);
  /* The next step starts clean. */
  for (int i = 0; i < M; i++) g[i] = (float)rank;
  EXPECT(gw_bucketer_ready(bk, 0, M) == GW_SUCCESS, "ready after a failed step");
  EXPECT(gw_bucketer_wait(bk) == GW_SUCCESS, "%s", gw_comm_last_error(comm));
  for (int i = 0; i < M; i++) EXPECT(g[i] == 1.0f, "element %d: %g", i, (double)g[i]);
  size_t bad[] = {0, 500, 400, M};
  gw_bucketer_t b2;
  EXPECT(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_SUM, bad, 3, &b2) == GW_ERR_INVALID_ARGUMENT && !b2,
         "reversed bounds accepted");
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_refusals) { ck_assert_int_eq(run_ranks(2, body_refusals, NULL, 60), 0); }
END_TEST

int main(void) {
  Suite *s = suite_create("bucket");
  TCase *tc = tcase_create("bucket");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_bounds);
  tcase_add_test(tc, test_sum_any_order);
  tcase_add_test(tc, test_avg);
  tcase_add_test(tc, test_refusals);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
