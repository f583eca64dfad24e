/* test_model_half.c - model/half.h's conversions (the activations of mixed
 * precision, converted on the host by the executor and the cpu backend's
 * tests) against references that share none of its code, on any CPU:
 *
 * - float16 -> float32, all 65536 patterns, against the compiler's _Float16
 *   (GCC's soft-float or F16C: IEEE conversions): the same bits, except that a
 *   NaN is compared by half.h's rule (below);
 * - float32 -> float16 against (_Float16) casts: every float of the binades
 *   where float16 is subnormal or rounds to zero (2^-26 .. 2^-13) and of
 *   those around its largest value (32768 .. 131072: 65504, 65519.99, 65520)
 *   exhaustively, both signs (61 apart where the casts are soft-float);
 *   every upper 19 bits with the low 13 bits that decide the rounding
 *   (exact, +1, below / at / above the tie, all ones);
 *   every 4099th pattern of all 2^32; and a table of edge cases written out by
 *   hand (ties to even, the smallest subnormals, 65520, infinities, NaNs);
 * - float32 -> bfloat16 against round to nearest even done in double
 *   (frexp/ldexp for the quantum of the float's binade, nearbyint for the
 *   rounding, 2^128 as the value past the largest bfloat16): every upper 16
 *   bits with the deciding low bits, every float32 subnormal, every 4099th
 *   pattern, and a table by hand;
 * - bfloat16 -> float32, all 65536 patterns, against the value computed from
 *   sign, exponent and fraction in double, bit for bit (NaNs too: a shift).
 *
 * (Per-value checks count failures instead of calling ck_assert: Check
 * reports each ck_assert's place to the parent process, a system call.)
 *
 * NaNs (half.h: "kept a (quiet) NaN with its sign and upper payload"):
 * narrowing gives a NaN of the same sign with the quiet bit set and the
 * float's upper fraction bits below it; widening float16 keeps sign and all
 * ten fraction bits as they are (so a signaling NaN stays signaling, where
 * GCC's _Float16 and F16C set the quiet bit: the test states that difference
 * instead of hiding it).  Exits 77 for the float16 parts when the compiler has
 * no _Float16 (the bfloat16 parts still run). */
#include <check.h>
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "half.h"
#include "harness.h"


/* half.h's NaN rule for narrowing: a NaN of the same sign, quiet bit set, the
 * float's fraction bits below its quiet bit kept from the top (f16: 9 of
 * them, bf16: 6). */
static int nan_narrowed_ok(uint32_t u, uint16_t h, int f16) {
  const int frac_bits = f16 ? 10 : 7;
  const uint16_t exp_mask = f16 ? 0x7c00u : 0x7f80u, quiet = (uint16_t)(1u << (frac_bits - 1));
  const uint16_t payload = (uint16_t)((u >> (23 - frac_bits)) & (quiet - 1u));
  return (h & exp_mask) == exp_mask && (h & quiet) && (h & (quiet - 1u)) == payload &&
         (h >> 15) == (u >> 31);
}

/* ---- bfloat16, against arithmetic in double */

/* Round to nearest even of f as bfloat16 (8 significant bits, exponents of
 * float32, subnormals 2^-133 apart), computed on the value: the quantum of
 * f's binade, f / quantum rounded by nearbyint, overflow past 2^128 less half
 * a quantum to infinity.  f finite. */
static uint16_t ref_bf16(float f) {
  if (f == 0) return (uint16_t)(gw_f32_bits(f) >> 16);
  int e;
  frexp((double)f, &e); /* |f| in [2^(e-1), 2^e) */
  const double q = ldexp(1.0, e - 8 > -133 ? e - 8 : -133);
  double r = nearbyint((double)f / q) * q; /* exact: a power-of-two scale, then an integer */
  if (fabs(r) >= 0x1p128) r = copysign(INFINITY, r);
  const uint32_t u = gw_f32_bits((float)r); /* exact: 8 significant bits, in float's range */
  if (u & 0xffffu) ck_abort_msg("reference %a is not a bfloat16", r);
  return (uint16_t)(u >> 16);
}

static size_t bf16_bad;

static void check_bf16_from(uint32_t u) {
  const float f = gw_f32_from_bits(u);
  const uint16_t got = gw_f32_to_bf16(f);
  int ok;
  if (isnan(f)) ok = nan_narrowed_ok(u, got, 0);
  else if (isinf(f)) ok = got == (uint16_t)(u >> 16);
  else ok = got == ref_bf16(f);
  if (!ok && bf16_bad++ < 5)
    fprintf(stderr, "  bf16(%a = 0x%08x) = 0x%04x, want 0x%04x\n", (double)f, u, got,
            isnan(f) || isinf(f) ? 0 : ref_bf16(f));
}

/* A value and the bits half.h must narrow it to. */
struct edge {
  float f;
  uint16_t want;
};

/* What both narrowings get, through check(bits) per float: every value of
 * the bits above the lowest 13 (float16) or 16 (bfloat16) with each low
 * pattern that decides the rounding (exact, +1, just below / at / just above
 * the tie, all ones); every 4099th pattern of all 2^32; the table written by
 * hand, whose bits half.h must give; NaNs of either sign, quiet and
 * signaling, payloads high and low, by half.h's rule.  The floats checked. */
static size_t sweep(int f16, void (*check)(uint32_t), const struct edge *table, size_t ntable) {
  const int low_bits = f16 ? 13 : 16;
  const uint32_t tie = 1u << (low_bits - 1), low[] = {0, 1, tie - 1, tie, tie + 1, 2 * tie - 1};
  const char *name = f16 ? "f16" : "bf16";
  size_t n = 0;
  for (uint64_t hi = 0; hi < (1ull << (32 - low_bits)); hi++)
    for (size_t k = 0; k < sizeof low / sizeof low[0]; k++, n++) check((uint32_t)(hi << low_bits) | low[k]);
  for (uint64_t u = 0; u < (1ull << 32); u += 4099, n++) check((uint32_t)u);
  for (size_t k = 0; k < ntable; k++, n++) {
    const uint16_t got = f16 ? gw_f32_to_f16(table[k].f) : gw_f32_to_bf16(table[k].f);
    ck_assert_msg(got == table[k].want, "%s(%a) = 0x%04x, want 0x%04x", name, (double)table[k].f, got,
                  table[k].want);
    check(gw_f32_bits(table[k].f));
  }
  static const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0x7fa00000, 0xffbfe000, 0x7fffffff, 0xff812345};
  for (size_t k = 0; k < sizeof nans / sizeof nans[0]; k++, n++) {
    const uint16_t h = f16 ? gw_f32_to_f16(gw_f32_from_bits(nans[k])) : gw_f32_to_bf16(gw_f32_from_bits(nans[k]));
    const float back = f16 ? gw_f16_to_f32(h) : gw_bf16_to_f32(h);
    ck_assert_msg(nan_narrowed_ok(nans[k], h, f16) && isnan(back), "%s(NaN 0x%08x) = 0x%04x", name, nans[k], h);
  }
  return n;
}

START_TEST(test_bf16_to_f32_all) {
  size_t bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    const uint32_t s = h >> 15, e = (h >> 7) & 0xffu, m = h & 0x7fu;
    const float got = gw_bf16_to_f32((uint16_t)h);
    int ok;
    if (e == 0xff) { /* infinity, or a NaN with every bit kept */
      ok = gw_f32_bits(got) == h << 16 && (m ? isnan(got) : isinf(got));
    } else {
      const double v = e ? ldexp(128.0 + m, (int)e - 134) : ldexp((double)m, -133);
      ok = (double)got == (s ? -v : v) && (gw_f32_bits(got) >> 31) == s;
    }
    if (!ok && bad++ < 5) fprintf(stderr, "  bf16 0x%04x -> %a (0x%08x)\n", h, (double)got, gw_f32_bits(got));
  }
  ck_assert_msg(bad == 0, "%zu of 65536 bfloat16 patterns widened wrongly", bad);
}
END_TEST

START_TEST(test_f32_to_bf16) {
  ck_assert_int_eq(fegetround(), FE_TONEAREST);
  bf16_bad = 0;
  size_t n = 0;
  for (uint32_t m = 0; m < (1u << 23); m++, n += 2) /* every float32 subnormal */
    check_bf16_from(m), check_bf16_from(0x80000000u | m);
  static const struct edge table[] = {
      {1.0f, 0x3f80},           {0x1.01p0f, 0x3f80} /* tie, to even */, {0x1.03p0f, 0x3f82} /* tie, to even */,
      {0x1.0101p0f, 0x3f81},    {-0x1.018p0f, 0xbf81},  {0x1.fep127f, 0x7f7f} /* largest */,
      {0x1.ffp127f, 0x7f80} /* tie past the largest: infinity */,   {0x1.fefffep127f, 0x7f7f},
      {0x1p-133f, 0x0001} /* smallest subnormal */, {0x1p-134f, 0x0000} /* tie, to even: 0 */,
      {0x1.0002p-134f, 0x0001} /* 2^-134 + 2^-149 */, {0x1.8p-133f, 0x0002} /* tie, to even */, {-0.0f, 0x8000},
      {INFINITY, 0x7f80},       {-INFINITY, 0xff80},
  };
  n += sweep(0, check_bf16_from, table, sizeof table / sizeof table[0]);
  ck_assert_msg(bf16_bad == 0, "%zu of %zu floats rounded to bfloat16 wrongly", bf16_bad, n);
}
END_TEST

/* ---- float16, against the compiler's _Float16 */

#ifdef __FLT16_MAX__
/* The compiler's casts: F16C's instructions where the CPU has them (GCC
 * emits vcvtps2ph / vcvtph2ps for a function built for it), else its
 * soft-float routines (80 ns a conversion here: the exhaustive binades are
 * then walked 61 floats apart). */
static uint16_t soft_narrow(float f) {
  const _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}

static float soft_widen(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, sizeof h);
  return (float)h;
}

static uint16_t (*cast_narrow)(float) = soft_narrow;
static float (*cast_widen)(uint16_t) = soft_widen;
static uint32_t exhaustive_step = 61;

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("f16c"))) static uint16_t f16c_narrow(float f) {
  const _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}

__attribute__((target("f16c"))) static float f16c_widen(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, sizeof h);
  return (float)h;
}
#endif

static void pick_casts(void) {
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_supports("f16c")) cast_narrow = f16c_narrow, cast_widen = f16c_widen, exhaustive_step = 1;
#else
  exhaustive_step = 1; /* other CPUs convert float16 in hardware */
#endif
}

static size_t f16_bad;

static void check_f16_from(uint32_t u) {
  const float f = gw_f32_from_bits(u);
  const uint16_t got = gw_f32_to_f16(f), want = cast_narrow(f);
  const int ok = isnan(f) ? nan_narrowed_ok(u, got, 1) && (want & 0x7fffu) > 0x7c00u : got == want;
  if (!ok && f16_bad++ < 5) fprintf(stderr, "  f16(%a = 0x%08x) = 0x%04x, _Float16 0x%04x\n", (double)f, u, got, want);
}

START_TEST(test_f16_to_f32_all) {
  size_t bad = 0, signaling = 0;
  pick_casts();
  for (uint32_t h = 0; h < 65536; h++) {
    const float got = gw_f16_to_f32((uint16_t)h), want = cast_widen((uint16_t)h);
    int ok;
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) { /* NaN: sign and all ten fraction bits kept */
      const uint32_t g = gw_f32_bits(got);
      ok = isnan(got) && isnan(want) && (g >> 31) == (h >> 15) && ((g >> 13) & 0x3ffu) == (h & 0x3ffu) &&
           !(g & 0x1fffu);
      signaling += !(h & 0x200u) && gw_f32_bits(got) != gw_f32_bits(want);
    } else {
      ok = gw_f32_bits(got) == gw_f32_bits(want);
    }
    if (!ok && bad++ < 5)
      fprintf(stderr, "  f16 0x%04x -> 0x%08x, _Float16 0x%08x\n", h, gw_f32_bits(got), gw_f32_bits(want));
  }
  ck_assert_msg(bad == 0, "%zu of 65536 float16 patterns widened wrongly", bad);
  /* The one difference: 2 x 511 signaling NaNs stay signaling in half.h. */
  ck_assert_msg(signaling == 2 * 511 || signaling == 0, "%zu signaling NaNs differ from _Float16", signaling);
}
END_TEST

START_TEST(test_f32_to_f16) {
  pick_casts();
  f16_bad = 0;
  size_t n = 0;
  /* Exhaustive: float exponents 101..113 (2^-26 .. 2^-13: float16's
   * subnormals, its rounding to zero and its smallest normals) and 142..143
   * (32768 .. 131072: the largest finite float16 and the way to infinity). */
  static const uint32_t binades[][2] = {{101, 113}, {142, 143}};
  for (size_t b = 0; b < 2; b++)
    for (uint32_t e = binades[b][0]; e <= binades[b][1]; e++)
      for (uint32_t m = 0; m < (1u << 23); m += exhaustive_step, n += 2)
        check_f16_from(e << 23 | m), check_f16_from(0x80000000u | e << 23 | m);
  static const struct edge table[] = {
      {1.0f, 0x3c00},           {0x1.002p0f, 0x3c00} /* tie, to even */, {0x1.006p0f, 0x3c02} /* tie, to even */,
      {0x1.002002p0f, 0x3c01},  {65504.0f, 0x7bff} /* largest */,       {65519.99609375f, 0x7bff},
      {65520.0f, 0x7c00} /* tie past the largest: infinity */,       {-65520.0f, 0xfc00},
      {0x1p-24f, 0x0001} /* smallest subnormal */,  {0x1p-25f, 0x0000} /* tie, to even: 0 */,
      {0x1.000002p-25f, 0x0001}, {0x1.8p-24f, 0x0002} /* tie, to even */,  {0x1.4p-23f, 0x0002} /* 2.5: tie, even */,
      {0x1.ff8p-15f, 0x03ff} /* the largest subnormal */, {0x1.ffcp-15f, 0x0400} /* its tie up, to even */,
      {-0.0f, 0x8000},
      {INFINITY, 0x7c00},       {-INFINITY, 0xfc00},
  };
  n += sweep(1, check_f16_from, table, sizeof table / sizeof table[0]);
  ck_assert_msg(f16_bad == 0, "%zu of %zu floats rounded to float16 differently from _Float16", f16_bad, n);
}
END_TEST

/* Every float16 but NaN survives widening and narrowing unchanged. */
START_TEST(test_f16_round_trip) {
  for (uint32_t h = 0; h < 65536; h++)
    if ((h & 0x7fffu) <= 0x7c00u && gw_f32_to_f16(gw_f16_to_f32((uint16_t)h)) != h)
      ck_abort_msg("0x%04x came back as 0x%04x", h, gw_f32_to_f16(gw_f16_to_f32((uint16_t)h)));
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("model-half");
  TCase *tc = tcase_create("half");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_bf16_to_f32_all);
  tcase_add_test(tc, test_f32_to_bf16);
#ifdef __FLT16_MAX__
  tcase_add_test(tc, test_f16_to_f32_all);
  tcase_add_test(tc, test_f32_to_f16);
  tcase_add_test(tc, test_f16_round_trip);
#endif
  suite_add_tcase(s, tc);
  int r = run_suite(s);
#ifndef __FLT16_MAX__
  if (r == 0) {
    printf("model-half: this compiler has no _Float16: the float16 checks skipped\n");
    return 77;
  }
#endif
  return r;
}
