/* gw-perf-values.c - what gw-perf's ranks put in their inputs, and what each
 * output element must then be (gw-perf.h; why, in docs/architecture.md's
 * tools entry on gw-perf's check). */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype_values.h"
#include "gw-perf.h"

static int nranks = 1; /* the job's, from gwp_choose_values */

/* What rank r puts at element i: from a hash of (r, i), so any two ranks'
 * inputs differ at most elements whatever their distance (a reduction that
 * counts one rank twice and another not at all, or an allgather that swaps
 * two ranks' blocks, shows), and so does a shift of the data.
 * - Reductions: +-1..5 in units of 2^-value_frac_bits (gwp_choose_values: floats
 *   take as many fraction bits as keep every partial sum exact, so the low
 *   bytes of an element carry data too; integers and products whole numbers;
 *   fewer for float sums of many ranks).  Both signs: a signed dtype compared
 *   as unsigned, a float compared as an integer, or a conversion that drops
 *   the sign shows.  Float MAX and MIN also take signed zeros (one element in
 *   8: two ranks' opposite zeros meet often enough to show) and NaNs (one in
 *   256), which the library's rules order (+0 above -0) and propagate.
 * - Allgather and broadcast move data only: every bit of an element is the
 *   hash's (never all ones, which the output holds before a run). */
static int value_span = 5;
static int value_frac_bits;
/* value_frac_bits' powers of two and value_of's modulus, set with them: an
 * element's value is a product, not ldexp (libm's scalbn per value and rank
 * was a third of a checked run's time; a power of two scales exactly) */
static double value_unit = 1, value_units = 1;
static uint64_t value_mod = 5;
/* Above 0: the values are 0 or 1, 1 for about one rank in value_sparse (float
 * sums of more ranks than the dtype holds integers: see gwp_choose_values). */
static int value_sparse;
static bool value_specials; /* signed zeros and NaNs (float MAX and MIN) */
static bool value_bits;     /* data moves: the element's bits from the hash */
uint64_t gwp_value_salt;
static uint64_t value_hash(int r, size_t i) {
  uint64_t x = (((uint64_t)(unsigned)r << 40) ^ (uint64_t)i) ^ gwp_value_salt * 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull; /* splitmix64's finalizer */
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A reduction's input value (exact in the dtype). */
static double value_of(int r, size_t i) {
  const uint64_t x = value_hash(r, i);
  if (value_sparse) return x % (uint64_t)value_sparse == 0;
  const bool neg = x >> 63;
  if (value_specials && ((x >> 50) & 7) == 0) /* bits 50-57: a use of their own */
    return ((x >> 53) & 31) == 0 ? NAN : neg ? -0.0 : 0.0;
  const double v = (double)(x % value_mod + 1) * value_unit;
  return neg ? -v : v;
}

/* Rank r's input element i as the dtype's bytes (es of out). */
void gwp_input_elem(gw_dtype_t dt, int r, size_t i, uint8_t out[8]) {
  if (!value_bits) {
    gw_value_store(out, dt, 0, value_of(r, i));
    return;
  }
  const size_t es = gw_dtype_size(dt);
  uint64_t x = value_hash(r, i);
  if (es < 8 && (x & ((1ull << (8 * es)) - 1)) == (1ull << (8 * es)) - 1) x ^= 1;
  if (es == 8 && x == ~0ull) x ^= 1;
  memcpy(out, &x, es); /* little-endian: the low bytes */
}

/* IEEE 754-2019's maximum and minimum, as the library's MAX and MIN: a NaN
 * wins, +0 is above -0. */
static double ieee_max(double a, double b) {
  if (isnan(a) || isnan(b)) return NAN;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}
static double ieee_min(double a, double b) {
  if (isnan(a) || isnan(b)) return NAN;
  if (a == b) return signbit(a) ? a : b;
  return a < b ? a : b;
}

/* The reduction of value_of over all ranks at element i, exactly: as
 * integers modulo 2^64 (*u, what integer dtypes wrap from; MAX and MIN
 * compared as dt compares), and in double (*d: sums and products of these
 * values, exact while below 2^53 units), with *mag the largest magnitude a
 * partial result reaches (sums: the sum of magnitudes; products: the
 * product's). */
static void reduce_exact(gw_dtype_t dt, int op, size_t i, uint64_t *u, double *d, double *mag) {
  const bool ints = dt == GW_INT8 || dt == GW_UINT8 || dt == GW_INT32 || dt == GW_INT64;
  *d = value_of(0, i), *u = ints ? (uint64_t)(int64_t)*d : 0, *mag = fabs(*d);
  for (int r = 1; r < nranks; r++) {
    const double v = value_of(r, i);
    const uint64_t w = ints ? (uint64_t)(int64_t)v : 0; /* floats' values may be NaN */
    if (op == GW_SUM || op == GW_AVG) *u += w, *d += v, *mag += fabs(v);
    else if (op == GW_PROD) *u *= w, *d *= v, *mag = fabs(*d);
    else {
      const int cmp = dt == GW_UINT8 ? ((uint8_t)w > (uint8_t)*u) - ((uint8_t)w < (uint8_t)*u)
                                     : ((int64_t)w > (int64_t)*u) - ((int64_t)w < (int64_t)*u);
      if (op == GW_MAX) *u = cmp > 0 ? w : *u, *d = ieee_max(*d, v);
      else *u = cmp < 0 ? w : *u, *d = ieee_min(*d, v);
    }
  }
}

bool gwp_is_float(gw_dtype_t dt) {
  return dt == GW_FLOAT16 || dt == GW_BFLOAT16 || dt == GW_FLOAT32 || dt == GW_FLOAT64;
}

/* A float dtype's unit roundoff, and the integer up to which it holds every
 * one.  A test hook (GW_PERF_TEST_BF16_LIMIT=k): bfloat16 held integers only
 * up to k, so a few ranks stand for the rank counts where sums pass 256. */
static double unit_roundoff(gw_dtype_t dt) {
  static int bf16_limit = -1; /* read once: this runs per checked element */
  if (bf16_limit < 0) {
    const char *k = getenv("GW_PERF_TEST_BF16_LIMIT");
    bf16_limit = k && atoi(k) > 0 ? atoi(k) : 0;
  }
  if (dt == GW_BFLOAT16 && bf16_limit) return 1.0 / bf16_limit;
  return dt == GW_FLOAT16 ? 0x1p-11 : dt == GW_BFLOAT16 ? 0x1p-8 : dt == GW_FLOAT32 ? 0x1p-24 : 0x1p-53;
}

/* A float dtype's largest finite value. */
static double largest(gw_dtype_t dt) {
  return dt == GW_FLOAT16 ? 65504.0 : dt == GW_BFLOAT16 ? 0x1.fep127 : dt == GW_FLOAT32 ? 0x1.fffffep127 : DBL_MAX;
}

/* v rounded to dt (to infinity where it overflows float16). */
static double round_to(gw_dtype_t dt, double v) {
  uint8_t b[8];
  gw_value_store(b, dt, 0, v);
  return gw_value_load(b, dt, 0);
}

/* An integer dtype's result from the exact one modulo 2^64: wrapped to the
 * dtype as the library wraps (AVG: the wrapped sum divided in int64). */
static int64_t int_result(gw_dtype_t dt, int op, uint64_t u) {
  int64_t want;
  switch (dt) {
    case GW_INT8: want = (int8_t)u; break;
    case GW_UINT8: want = (uint8_t)u; break;
    case GW_INT32: want = (int32_t)u; break;
    default: want = (int64_t)u; break;
  }
  return op == GW_AVG ? want / nranks : want;
}

/* The dtype's neighbour of v (a value of it) towards +infinity (up) or
 * -infinity: one step of its bits. */
static double dtype_step(gw_dtype_t dt, double v, bool up) {
  uint8_t b[8] = {0};
  gw_value_store(b, dt, 0, v);
  const size_t es = gw_dtype_size(dt);
  uint64_t bits = 0, sign = 1ull << (8 * es - 1);
  memcpy(&bits, b, es); /* little-endian */
  if (v == 0) bits = up ? 1 : sign | 1;         /* the smallest subnormal of that sign */
  else if ((v > 0) == up) bits++;               /* away from zero */
  else bits--;                                  /* towards zero */
  memcpy(b, &bits, es);
  return gw_value_load(b, dt, 0);
}

/* Whether got is the reduction at element i.  Integers: exactly, wrapped to
 * the dtype as the library wraps (AVG: the wrapped sum divided in int64,
 * which truncates: a missing contribution smaller than n hides in it).
 * Floats: every partial sum or product of these values is a whole number of
 * units no larger in magnitude than *mag, so while that is within the units
 * the dtype holds exactly (float16 2048, bfloat16 256, float32 2^24) the
 * order of reduction cannot matter and the result must be exact: one missing
 * or doubled contribution shows at any rank count.  AVG there: the exact sum
 * divided once, so the result must be one of the dtype's two values around
 * the exact mean (the division rounds, bfloat16 and float16 a second time
 * from float32): a contribution missing shows where it moves the mean past
 * one of them, always while it is at least one step of the dtype times n
 * (not where, say, 512 ranks' bfloat16 zeros and ones lose a one).  Beyond
 * exactness each of the n - 1 steps may round (sums by a unit of the
 * magnitudes' sum, an average by that divided by n, products by a unit of
 * their own: compounded).  NaN must give NaN;
 * MAX and MIN's zeros must have the sign IEEE's maximum and minimum give. */
bool gwp_reduce_ok(gw_dtype_t dt, int op, const void *out, size_t i, size_t at) {
  uint64_t u;
  double d, mag;
  reduce_exact(dt, op, at, &u, &d, &mag);
  if (!gwp_is_float(dt)) return gw_value_load_int(out, dt, i) == int_result(dt, op, u);
  const double got = gw_value_load(out, dt, i), eps = unit_roundoff(dt);
  const bool exact = mag * value_units <= 1.0 / eps;
  const double want = round_to(dt, op == GW_AVG ? d / nranks : d);
  if (isnan(want)) return isnan(got);
  if (isnan(got)) return false;
  if (want == 0 && (op == GW_MAX || op == GW_MIN)) return got == 0 && signbit(got) == signbit(want);
  if (op == GW_AVG && exact) {
    const double mean = d / nranks; /* exact, or within 2^-53 of it: no dtype value between */
    return got == want || (want != mean && got == dtype_step(dt, want, mean > want));
  }
  if (exact) return got == want;
  if (op == GW_PROD) {
    /* Each of the n - 1 steps rounds by at most eps of its result, so the
     * library's product is within (1 + eps)^(n-1) - 1 of the exact one d,
     * relatively; near the dtype's largest value it may overflow where d
     * rounds to a finite value, or stay finite where d rounds to infinity
     * (the check compared with d's rounding: a finite result against an
     * infinite one took a tolerance of the largest value itself, 39% of it
     * at 100 ranks of bfloat16, and a rank left out passed). */
    const double rel = expm1((nranks - 1) * log1p(eps)), big = largest(dt);
    if (isinf(got)) return signbit(got) == signbit(d) && fabs(d) * (1 + rel) >= big;
    return !isinf(d) && signbit(got) == signbit(d) && fabs(got - d) <= rel * fabs(d);
  }
  double tol = (nranks + 1) * eps * (op == GW_SUM ? mag : mag / nranks);
  if (op == GW_AVG) tol += 2 * eps * fabs(want);
  return fabs(got - want) <= tol;
}

/* The inputs for one collective, dtype and op (the values block above).
 * Float sums and averages stay exact (and so are checked exactly) while n
 * ranks' magnitudes add up to at most the units the dtype holds (bfloat16
 * 256, float16 2048): +-1..5 with as many fraction bits as that leaves up
 * to limit / 5 ranks, +-1..limit / n up to limit ranks, past that 0 or 1
 * with about limit / 2 ones per element.  With 1..5 at any rank count, the
 * tolerance that rounding then needs grew with n until a missing rank passed
 * (bfloat16 from about 86 ranks; at 256 an output left untouched did).  MAX
 * and MIN take any value the dtype holds exactly; products whole numbers. */
void gwp_choose_values(bool reduction, gw_dtype_t dt, int op, int job_ranks) {
  nranks = job_ranks;
  value_sparse = 0, value_span = 5, value_frac_bits = 0;
  value_bits = !reduction;
  value_specials = !value_bits && gwp_is_float(dt) && (op == GW_MAX || op == GW_MIN);
  if (!value_bits && gwp_is_float(dt) && op != GW_PROD) {
    const double limit = 1.0 / unit_roundoff(dt);
    const double ranks = op == GW_MAX || op == GW_MIN ? 1 : nranks; /* values that add up */
    if (5.0 * ranks <= limit) value_frac_bits = (int)floor(log2(limit / (5.0 * ranks)));
    else if (ranks <= limit) value_span = (int)(limit / ranks);
    else value_sparse = (int)ceil(2.0 * ranks / limit);
  }
  value_unit = ldexp(1.0, -value_frac_bits), value_units = ldexp(1.0, value_frac_bits);
  value_mod = (uint64_t)value_span << value_frac_bits;
}

/* A value that gwp_reduce_ok refuses at element `at`, for the output to hold
 * before a run: an element the collective leaves unwritten must not pass by
 * chance (all ones is -1 in a signed integer, a common sum of +-1..5, and NaN
 * a float MAX's result where a rank's input is NaN).  Integers: the result
 * plus one; floats: NaN, or 1 where NaN is the result. */
void gwp_wrong_elem(gw_dtype_t dt, int op, size_t at, uint8_t out[8]) {
  uint64_t u;
  double d, mag;
  reduce_exact(dt, op, at, &u, &d, &mag);
  if (gwp_is_float(dt)) {
    gw_value_store(out, dt, 0, isnan(d) ? 1.0 : NAN);
    return;
  }
  const uint64_t w = (uint64_t)int_result(dt, op, u) + 1;
  memcpy(out, &w, gw_dtype_size(dt)); /* little-endian: the low bytes, wrapped */
}

/* One value refused at every element (into out, the dtype's bytes), where
 * the inputs make one such (false: gwp_wrong_elem per element, which costs
 * a reduction of every rank's value: the fill took more time than the
 * check).  Floats: NaN, except for MAX and MIN, whose inputs hold NaNs.
 * Integers: the dtype's lowest value (128 for uint8), which no MAX, MIN or
 * average of +-1..5 gives, nor a sum or product that cannot wrap. */
bool gwp_wrong_fixed(gw_dtype_t dt, int op, uint8_t out[8]) {
  memset(out, 0xff, 8);
  if (gwp_is_float(dt)) return !value_specials;
  const size_t es = gw_dtype_size(dt);
  const double top = ldexp(1.0, 8 * (int)es - 1); /* the magnitude past which a signed result wraps */
  bool fits = true;
  if (op == GW_SUM) fits = (double)value_span * nranks < top;
  if (op == GW_PROD) fits = nranks * log((double)value_span) < log(top);
  if (!fits) return false;
  memset(out, 0, 8);
  out[es - 1] = 0x80; /* little-endian: the sign bit */
  return true;
}