/* test_perf_values.c - gw-perf's check of reduction results (tools/gw-perf-values.c):
 * what the output holds before a run is refused at every element (an element
 * left unwritten never passes), results computed as the library computes them
 * (each step rounded to the dtype, AVG divided once) pass at every element for
 * every dtype and op from 1 to 600 ranks, a float average that left one
 * rank out is refused wherever it moved the mean by two of the dtype's steps,
 * and a product a rank off by a factor of 2 or more wherever it is. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dtype_values.h"
#include "gw-perf.h"
#include "harness.h"

static const gw_dtype_t dtypes[] = {GW_INT8,    GW_UINT8,    GW_INT32,   GW_INT64,
                                    GW_FLOAT16, GW_BFLOAT16, GW_FLOAT32, GW_FLOAT64};
static const int ops[] = {GW_SUM, GW_PROD, GW_MAX, GW_MIN, GW_AVG};
static const int rank_counts[] = {1, 2, 3, 4, 5, 7, 8, 9, 17, 64, 100, 300, 512, 600};
enum { ELEMS = 600 };

static bool is_float(gw_dtype_t dt) { return dt >= GW_FLOAT16 && dt <= GW_FLOAT64; }

/* v rounded to dt, through the bytes the library would hold. */
static double rounded(gw_dtype_t dt, double v) {
  uint8_t b[8];
  gw_value_store(b, dt, 0, v);
  return gw_value_load(b, dt, 0);
}

/* One reduction step as the library's host kernels take it: float16,
 * bfloat16 and float32 computed in float32, float64 in double, then rounded
 * to the dtype; MAX and MIN propagate NaN and order +0 above -0. */
static double step(gw_dtype_t dt, int op, double x, double y, int div) {
  double r;
  if (op == GW_MAX) r = x > y || x != x || (x == y && signbit(y)) ? x : y;
  else if (op == GW_MIN) r = x < y || x != x || (x == y && signbit(x)) ? x : y;
  else if (dt == GW_FLOAT64) r = op == GW_PROD ? x * y : x + y;
  else r = op == GW_PROD ? (float)x * (float)y : (float)x + (float)y;
  if (div > 1) r = dt == GW_FLOAT64 ? r / div : (double)((float)r / (float)div);
  return rounded(dt, r);
}

/* The float reduction at element i over n ranks in the order first, first +
 * 1, ... (wrapping), leaving rank `skip` out (-1: none), into out[0]. */
static void reduce_as_library(gw_dtype_t dt, int op, int n, size_t i, int first, int skip, uint8_t out[8]) {
  uint8_t b[8];
  int order[1024], m = 0;
  for (int k = 0; k < n; k++)
    if ((first + k) % n != skip) order[m++] = (first + k) % n;
  double acc = 0;
  for (int k = 0; k < m; k++) {
    gwp_input_elem(dt, order[k], i, b);
    const double v = gw_value_load(b, dt, 0);
    acc = k ? step(dt, op, acc, v, op == GW_AVG && k == m - 1 ? n : 1) : v;
  }
  if (op == GW_AVG && m == 1 && n > 1) acc = step(dt, GW_SUM, acc, 0.0, n); /* one rank left: divided alone */
  gw_value_store(out, dt, 0, acc);
}

START_TEST(test_output_fill_refused) {
  /* Integers: all ones (-1, or 255) passed where a sum of +-1..5 or a MAX or
   * MIN came out there, 8-27% of elements. */
  for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++)
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++)
      for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++) {
        gwp_choose_values(true, dtypes[d], ops[o], rank_counts[k]);
        int passed = 0, fixed_passed = 0;
        uint8_t fixed[8];
        const bool one = gwp_wrong_fixed(dtypes[d], ops[o], fixed);
        for (size_t i = 0; i < ELEMS; i++) {
          uint8_t b[8];
          gwp_wrong_elem(dtypes[d], ops[o], i, b);
          passed += gwp_reduce_ok(dtypes[d], ops[o], b, 0, i);
          fixed_passed += one && gwp_reduce_ok(dtypes[d], ops[o], fixed, 0, i);
        }
        ck_assert_msg(!passed && !fixed_passed,
                      "%s %s at %d ranks: %d (%d with the one value) of %d elements holding what was put there "
                      "before the run passed", gw_dtype_name(dtypes[d]), gw_op_name(ops[o]), rank_counts[k], passed,
                      fixed_passed, ELEMS);
        /* the one value where it can be (the per-element fill costs a reduction an element) */
        if (!(is_float(dtypes[d]) && (ops[o] == GW_MAX || ops[o] == GW_MIN)) && ops[o] != GW_PROD &&
            (ops[o] != GW_SUM || rank_counts[k] < 25))
          ck_assert_msg(one, "%s %s at %d ranks: no one value", gw_dtype_name(dtypes[d]), gw_op_name(ops[o]),
                        rank_counts[k]);
      }
}
END_TEST

START_TEST(test_library_results_pass) {
  for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
    if (!is_float(dtypes[d])) continue; /* integers: exact, one answer */
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++)
      for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++) {
        const int n = rank_counts[k];
        gwp_choose_values(true, dtypes[d], ops[o], n);
        for (int first = 0; first < n && first < 3; first++) /* other orders of the same ranks */
          for (size_t i = 0; i < ELEMS; i++) {
            uint8_t b[8];
            reduce_as_library(dtypes[d], ops[o], n, i, first, -1, b);
            ck_assert_msg(gwp_reduce_ok(dtypes[d], ops[o], b, 0, i),
                          "%s %s at %d ranks from rank %d: element %zu's right result %.17g refused",
                          gw_dtype_name(dtypes[d]), gw_op_name(ops[o]), n, first, i, gw_value_load(b, dtypes[d], 0));
          }
      }
  }
}
END_TEST

/* The dtype's spacing at v: its neighbour away from zero minus v. */
static double spacing(gw_dtype_t dt, double v) {
  const int digits = dt == GW_FLOAT16 ? 11 : dt == GW_BFLOAT16 ? 8 : dt == GW_FLOAT32 ? 24 : 53;
  int e;
  frexp(fabs(v), &e);
  return ldexp(1.0, e - digits);
}

START_TEST(test_avg_missing_rank_refused) {
  const gw_dtype_t fdt[] = {GW_FLOAT16, GW_BFLOAT16, GW_FLOAT32, GW_FLOAT64};
  for (size_t d = 0; d < 4; d++)
    for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++) {
      const int n = rank_counts[k];
      if (n < 2) continue;
      gwp_choose_values(true, fdt[d], GW_AVG, n);
      int moved = 0, caught = 0;
      for (size_t i = 0; i < ELEMS; i++) {
        uint8_t right[8], wrong[8];
        const int skip = (int)(i % (size_t)n);
        reduce_as_library(fdt[d], GW_AVG, n, i, 0, -1, right);
        reduce_as_library(fdt[d], GW_AVG, n, i, 0, skip, wrong);
        const double r = gw_value_load(right, fdt[d], 0), w = gw_value_load(wrong, fdt[d], 0);
        const bool refused = !gwp_reduce_ok(fdt[d], GW_AVG, wrong, 0, i);
        moved += w != r, caught += refused;
        if (fabs(w - r) >= 2 * spacing(fdt[d], fmax(fabs(w), fabs(r))))
          ck_assert_msg(refused, "%s avg at %d ranks, element %zu: rank %d left out (%.17g for %.17g) passed",
                        gw_dtype_name(fdt[d]), n, i, skip, w, r);
      }
      /* 512 ranks' bfloat16 zeros and ones: the means are exact (a sum of at
       * most 256 ones over a power of two), so every one lost shows; the old
       * check's tolerance let 89% of them pass. */
      if (n == 512) ck_assert_msg(caught == moved, "%s avg at 512 ranks: %d of %d results a rank short caught",
                                  gw_dtype_name(fdt[d]), caught, moved);
      if (n <= 9) ck_assert_msg(caught == ELEMS, "%s avg at %d ranks: %d of %d results a rank short caught",
                                gw_dtype_name(fdt[d]), n, caught, ELEMS);
    }
}
END_TEST

/* Products of many ranks (past the integers the dtype holds: checked to a
 * tolerance) with a rank left out or counted twice: every result off by a
 * factor of 2 or more, or of the other sign, is refused, also where one of
 * the two overflowed (an infinite exact product took a tolerance of the
 * largest value itself, and 17 in 855 results a rank short passed at 100
 * ranks of bfloat16). */
/* Past the largest value by a factor of 2, 100 ranks' bfloat16 product
 * (each step rounded: within 47% of the exact one) can only be infinite: a
 * finite 0.7 of the largest value passed (the tolerance was 39% of it). */
START_TEST(test_prod_overflow_bounds) {
  const double big = 0x1.fep127;
  gwp_choose_values(true, GW_BFLOAT16, GW_PROD, 100);
  int tried = 0;
  for (size_t i = 0; i < ELEMS; i++) {
    double d = 1;
    for (int r = 0; r < 100; r++) {
      uint8_t b[8];
      gwp_input_elem(GW_BFLOAT16, r, i, b);
      d *= gw_value_load(b, GW_BFLOAT16, 0);
    }
    if (fabs(d) < 2 * big) continue;
    uint8_t got[8];
    gw_value_store(got, GW_BFLOAT16, 0, copysign(0.7 * big, d));
    ck_assert_msg(!gwp_reduce_ok(GW_BFLOAT16, GW_PROD, got, 0, i), "element %zu: %.17g passed for %.17g", i,
                  gw_value_load(got, GW_BFLOAT16, 0), d);
    gw_value_store(got, GW_BFLOAT16, 0, copysign(INFINITY, d));
    ck_assert_msg(gwp_reduce_ok(GW_BFLOAT16, GW_PROD, got, 0, i), "element %zu: the overflow refused", i);
    tried++;
  }
  ck_assert_msg(tried > 50, "only %d elements past twice the largest value", tried);
}
END_TEST

START_TEST(test_prod_rank_off_refused) {
  const gw_dtype_t fdt[] = {GW_FLOAT16, GW_BFLOAT16, GW_FLOAT32, GW_FLOAT64};
  for (size_t d = 0; d < 4; d++)
    for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++) {
      const int n = rank_counts[k];
      if (n < 2) continue;
      gwp_choose_values(true, fdt[d], GW_PROD, n);
      for (int twice = 0; twice < 2; twice++)
        for (size_t i = 0; i < ELEMS; i++) {
          uint8_t right[8], wrong[8];
          const int off = (int)(i % (size_t)n);
          reduce_as_library(fdt[d], GW_PROD, n, i, 0, -1, right);
          if (twice) { /* rank off counted twice: one more factor of its value */
            uint8_t b[8];
            gwp_input_elem(fdt[d], off, i, b);
            gw_value_store(wrong, fdt[d], 0, step(fdt[d], GW_PROD, gw_value_load(right, fdt[d], 0),
                                                  gw_value_load(b, fdt[d], 0), 1));
          } else {
            reduce_as_library(fdt[d], GW_PROD, n, i, 0, off, wrong);
          }
          const double r = gw_value_load(right, fdt[d], 0), w = gw_value_load(wrong, fdt[d], 0);
          if (isinf(r) && isinf(w) && signbit(r) == signbit(w)) continue; /* both past the range: the same */
          /* one of them infinite: far when the other is below an eighth of
           * the largest value (the tolerance, compounded over 100 steps of
           * bfloat16, is 47%: near the top an overflow is a right result) */
          const double big = fdt[d] == GW_FLOAT16    ? 65504
                             : fdt[d] == GW_BFLOAT16 ? 0x1.fep127
                             : fdt[d] == GW_FLOAT32  ? 0x1.fffffep127
                                                     : DBL_MAX;
          const bool far = signbit(r) != signbit(w) ||
                           (isinf(r) != isinf(w) ? fmin(fabs(r), fabs(w)) < big / 8
                                                 : fabs(w) >= 2 * fabs(r) || fabs(r) >= 2 * fabs(w));
          if (far)
            ck_assert_msg(!gwp_reduce_ok(fdt[d], GW_PROD, wrong, 0, i),
                          "%s prod at %d ranks, element %zu: rank %d %s (%.17g for %.17g) passed",
                          gw_dtype_name(fdt[d]), n, i, off, twice ? "counted twice" : "left out", w, r);
        }
    }
}
END_TEST

int main(void) {
  Suite *s = suite_create("perf-values");
  TCase *tc = tcase_create("check");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_output_fill_refused);
  tcase_add_test(tc, test_library_results_pass);
  tcase_add_test(tc, test_avg_missing_rank_refused);
  tcase_add_test(tc, test_prod_rank_off_refused);
  tcase_add_test(tc, test_prod_overflow_bounds);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
