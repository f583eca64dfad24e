/* test_reduce.c - the host reduction kernels: every SIMD build this CPU can run
 * against a scalar reference written here, for every dtype and op, odd lengths,
 * both outputs, in-place aliasing and the AVG division; NaN through MAX and
 * MIN; and the fp16/bf16
 * conversions against the compiler's _Float16 and an independent bf16 rounding;
 * the widened ring step (gw__fold_reduce) against its parts. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "reduce.h"

static const char *variants[] = {"generic", "avx2", "avx512"};

static uint32_t mix_bits(int i) {
  uint32_t x = (uint32_t)i * 2654435761u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  return x ^ (x >> 15);
}

/* The scalar reference: exact integer semantics, fp16/bf16 via float with one rounding. */
static void ref_elem(gw_dtype_t dt, int kop, uint32_t div, const void *a, const void *b, size_t i, void *out) {
  if (test_is_float(dt)) {
    double x = gw_value_load(a, dt, i), y = gw_value_load(b, dt, i), r;
    if (dt == GW_FLOAT16 || dt == GW_BFLOAT16 || dt == GW_FLOAT32) {
      float fx = (float)x, fy = (float)y, fr;
      fr = kop == GW_KOP_SUM ? fx + fy : kop == GW_KOP_PROD ? fx * fy : kop == GW_KOP_MAX ? (fx > fy ? fx : fy) : (fx < fy ? fx : fy);
      if (div > 1) fr /= (float)div;
      r = fr;
    } else {
      r = kop == GW_KOP_SUM ? x + y : kop == GW_KOP_PROD ? x * y : kop == GW_KOP_MAX ? (x > y ? x : y) : (x < y ? x : y);
      if (div > 1) r /= div;
    }
    if (dt == GW_BFLOAT16) { /* round to nearest even, independently of the library */
      float f = (float)r;
      uint32_t u;
      memcpy(&u, &f, 4);
      uint32_t lsb = (u >> 16) & 1, rest = u & 0xffff;
      uint32_t hi = u >> 16;
      if (rest > 0x8000 || (rest == 0x8000 && lsb)) hi++;
      *(uint16_t *)out = (uint16_t)hi;
    } else {
      gw_value_store(out, dt, 0, r);
    }
    return;
  }
  int64_t x, y, r;
  size_t es = gw_dtype_size(dt);
  uint64_t ux = 0, uy = 0;
  memcpy(&ux, (const char *)a + i * es, es);
  memcpy(&uy, (const char *)b + i * es, es);
  int sh = 64 - 8 * (int)es;
  if (dt == GW_UINT8) x = (int64_t)ux, y = (int64_t)uy;
  else x = (int64_t)(ux << sh) >> sh, y = (int64_t)(uy << sh) >> sh;
  switch (kop) {
    case GW_KOP_SUM: r = (int64_t)((uint64_t)x + (uint64_t)y); break;
    case GW_KOP_PROD: r = (int64_t)((uint64_t)x * (uint64_t)y); break;
    case GW_KOP_MAX: r = x > y ? x : y; break;
    default: r = x < y ? x : y; break;
  }
  if (kop == GW_KOP_SUM && div > 1) {
    /* wrap to the type first, then divide in the type */
    uint64_t w = (uint64_t)r;
    int64_t t = dt == GW_UINT8 ? (int64_t)(uint8_t)w : (int64_t)(w << sh) >> sh;
    r = t / (int64_t)div;
  }
  memcpy(out, &r, es);
}

static void fill(void *buf, gw_dtype_t dt, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) {
    uint64_t h = mix64(seed * 1000003 + i);
    if (test_is_float(dt)) gw_value_store(buf, dt, i, ((double)(h >> 11) * 0x1p-53) * 8 - 4);
    else memcpy((char *)buf + i * gw_dtype_size(dt), &h, gw_dtype_size(dt));
  }
}

START_TEST(test_kernels_match_reference) {
  static const size_t lens[] = {0, 1, 3, 15, 16, 17, 63, 255, 1000, 4099};
  uint8_t a[4099 * 8], b[4099 * 8], o0[4099 * 8], o1[4099 * 8], want[8];
  int tested = 0;
  for (size_t v = 0; v < 3; v++) {
    const gw_reduce_table_t *t = gw__reduce_table_named(variants[v]);
    if (!t) continue;
    tested++;
    /* 200 and 256 ranks: (int8_t)div would be negative or 0 (a division trap) */
    static const uint32_t divs[] = {0, 3, 200, 256};
    for (int dt = 0; dt < GW_NUM_DTYPES; dt++)
      for (int kop = 0; kop < GW_NUM_KOPS; kop++)
        for (size_t di = 0; di < sizeof divs / sizeof *divs; di++) {
          const uint32_t div = divs[di];
          if (div && kop != GW_KOP_SUM) continue;
          for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            size_t n = lens[li], es = gw_dtype_size(dt);
            fill(a, dt, n, 1 + li);
            fill(b, dt, n, 100 + li);
            memset(o0, 0, sizeof o0);
            memset(o1, 0, sizeof o1);
            (*t)[dt][kop](o0, o1, a, b, n, div);
            for (size_t i = 0; i < n; i++) {
              ref_elem(dt, kop, div, a, b, i, want);
              ck_assert_msg(!memcmp(o0 + i * es, want, es) && !memcmp(o1 + i * es, want, es),
                            "%s %s kop %d div %u n %zu element %zu differs", variants[v], gw_dtype_name(dt), kop, div, n, i);
            }
            /* in place: dst0 == a, no second output */
            memcpy(o0, a, n * es);
            (*t)[dt][kop](o0, NULL, o0, b, n, div);
            for (size_t i = 0; i < n; i++) {
              ref_elem(dt, kop, div, a, b, i, want);
              ck_assert_msg(!memcmp(o0 + i * es, want, es), "%s %s in place element %zu differs", variants[v],
                            gw_dtype_name(dt), i);
            }
          }
        }
  }
  ck_assert_int_ge(tested, 1);
}
END_TEST

/* MAX and MIN propagate NaN: the result is a NaN wherever either operand is
 * one (with `x > y ? x : y` a NaN survived as the second operand only, so a
 * ring's NaN came out or not by the rank's place), the rest as usual, and
 * every table the CPU runs gives the generic table's bits (fp16 NaNs
 * included: the F16C path kept their payloads). */
START_TEST(test_nan_max_min) {
  enum { N = 37 };
  static const gw_dtype_t dts[] = {GW_FLOAT16, GW_BFLOAT16, GW_FLOAT32, GW_FLOAT64};
  static const uint64_t nans[] = {0xfd32, 0xffc1, 0xffc12345, 0x7ff4000000000001ull}; /* payload, sign */
  uint8_t a[N * 8], b[N * 8], out[N * 8], ref[N * 8];
  const gw_reduce_table_t *generic = gw__reduce_table_named("generic");
  ck_assert_ptr_nonnull(generic);
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    for (int kop = GW_KOP_MAX; kop <= GW_KOP_MIN; kop++) {
      const gw_dtype_t dt = dts[d];
      const size_t es = gw_dtype_size(dt);
      fill(a, dt, N, 7);
      fill(b, dt, N, 8);
      for (size_t i = 0; i < N; i++) {
        if (i % 3 == 0) memcpy(a + i * es, &nans[d], es);
        if (i % 5 == 0) memcpy(b + i * es, &nans[d], es);
        if (i % 7 == 0) memcpy(b + i * es, a + i * es, es); /* equal operands (or both NaN) */
      }
      (*generic)[dt][kop](ref, NULL, a, b, N, 0);
      for (size_t i = 0; i < N; i++) {
        const double x = gw_value_load(a, dt, i), y = gw_value_load(b, dt, i), r = gw_value_load(ref, dt, i);
        const double want = isnan(x) || isnan(y) ? NAN : kop == GW_KOP_MAX ? fmax(x, y) : fmin(x, y);
        ck_assert_msg(isnan(want) ? isnan(r) : r == want, "%s kop %d element %zu: %g and %g gave %g",
                      gw_dtype_name(dt), kop, i, x, y, r);
      }
      for (size_t v = 1; v < 3; v++) {
        const gw_reduce_table_t *t = gw__reduce_table_named(variants[v]);
        if (!t) continue;
        (*t)[dt][kop](out, NULL, a, b, N, 0);
        for (size_t i = 0; i < N; i++)
          ck_assert_msg(!memcmp(out + i * es, ref + i * es, es), "%s %s kop %d element %zu: other bits than generic's",
                        variants[v], gw_dtype_name(dt), kop, i);
      }
    }
}
END_TEST

/* MAX and MIN order the zeros (+0 above -0) whichever operand holds which:
 * the selection took the second of two equal operands, so one ring call gave
 * -0 in some blocks and +0 in others by the operands' order there.  Every
 * table, both orders, every float type (the SIMD bodies and their scalar
 * tails: 37 elements). */
START_TEST(test_signed_zeros) {
  enum { N = 37 };
  static const gw_dtype_t dts[] = {GW_FLOAT16, GW_BFLOAT16, GW_FLOAT32, GW_FLOAT64};
  static const uint64_t negz[] = {0x8000, 0x8000, 0x80000000u, 0x8000000000000000ull};
  uint8_t a[N * 8], b[N * 8], out[N * 8];
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    for (int kop = GW_KOP_MAX; kop <= GW_KOP_MIN; kop++)
      for (size_t v = 0; v < 3; v++) {
        const gw_reduce_table_t *t = gw__reduce_table_named(variants[v]);
        if (!t) continue;
        const gw_dtype_t dt = dts[d];
        const size_t es = gw_dtype_size(dt);
        memset(a, 0, sizeof a), memset(b, 0, sizeof b);
        for (size_t i = 0; i < N; i++) memcpy((i % 2 ? a : b) + i * es, &negz[d], es); /* -0 in a, then in b */
        (*t)[dt][kop](out, NULL, a, b, N, 0);
        for (size_t i = 0; i < N; i++) {
          uint64_t bits = 0;
          memcpy(&bits, out + i * es, es);
          const uint64_t want = kop == GW_KOP_MAX ? 0 : negz[d];
          ck_assert_msg(bits == want, "%s %s %s element %zu (-0 in %s): bits %llx, want %llx", variants[v],
                        gw_dtype_name(dt), kop == GW_KOP_MAX ? "max" : "min", i, i % 2 ? "a" : "b",
                        (unsigned long long)bits, (unsigned long long)want);
        }
      }
}
END_TEST

/* The array conversions of every instruction-set build against the scalar
 * ones: every 16-bit pattern widened (NaN payloads aside), and floats around
 * every rounding case narrowed, NaNs to the same bits. */
START_TEST(test_array_conversions) {
  typedef void (*to16_fn)(int, uint16_t *, const float *, size_t);
  typedef void (*from16_fn)(int, float *, const uint16_t *, size_t);
  to16_fn to16[] = {gw__cvt_to16_generic,
#ifdef GW_HAVE_X86_SIMD
                    gw__cvt_to16_avx2, gw__cvt_to16_avx512
#endif
  };
  from16_fn from16[] = {gw__cvt_from16_generic,
#ifdef GW_HAVE_X86_SIMD
                        gw__cvt_from16_avx2, gw__cvt_from16_avx512
#endif
  };
  enum { N = 65536 };
  static uint16_t h[N], h2[N];
  static float f[N], g[N];
  for (size_t v = 0; v < sizeof to16 / sizeof *to16; v++) {
    if (!gw__reduce_table_named(variants[v])) continue; /* this CPU cannot run it */
    for (int bf = 0; bf < 2; bf++) {
      for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
      from16[v](bf, f, h, N);
      for (int i = 0; i < N; i++) {
        float want = bf ? gw__bf16_to_float(h[i]) : gw__half_to_float(h[i]);
        ck_assert_msg(!memcmp(&f[i], &want, 4) || (want != want && f[i] != f[i]), "%s %s widen 0x%04x", variants[v],
                      bf ? "bf16" : "fp16", i);
      }
      /* halfway and near-halfway floats between neighbours, out of range, and
       * NaNs (narrowed to the scalar conversion's bits: F16C kept payloads) */
      for (int i = 0; i < N; i++) {
        uint32_t u = ((uint32_t)i << 16) | (uint32_t)(mix_bits(i) & 0xffff);
        memcpy(&g[i], &u, 4);
      }
      to16[v](bf, h2, g, N);
      for (int i = 0; i < N; i++) {
        uint16_t want = bf ? gw__float_to_bf16(g[i]) : gw__float_to_half(g[i]);
        ck_assert_msg(h2[i] == want, "%s %s narrow %a: 0x%04x, want 0x%04x", variants[v], bf ? "bf16" : "fp16",
                      (double)g[i], h2[i], want);
      }
    }
  }
}
END_TEST

START_TEST(test_half_conversions_exact) {
  /* every half converts to the float the compiler computes, and back to itself */
  for (uint32_t h = 0; h < 65536; h++) {
    _Float16 x;
    uint16_t hh = (uint16_t)h;
    memcpy(&x, &hh, 2);
    float f = gw__half_to_float(hh);
    if (isnan((float)x)) {
      ck_assert(isnan(f));
      continue;
    }
    ck_assert_msg(f == (float)x, "half 0x%04x -> %g, expected %g", h, f, (double)(float)x);
    ck_assert_uint_eq(gw__float_to_half(f), hh);
  }
  /* floats round to nearest even exactly as the compiler's conversion */
  for (uint64_t i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)mix64(i);
    float f;
    memcpy(&f, &u, 4);
    if (isnan(f)) continue;
    _Float16 x = (_Float16)f;
    uint16_t want;
    memcpy(&want, &x, 2);
    ck_assert_msg(gw__float_to_half(f) == want, "float %a -> 0x%04x, expected 0x%04x", (double)f, gw__float_to_half(f), want);
  }
}
END_TEST

START_TEST(test_bf16_conversions) {
  ck_assert_uint_eq(gw__float_to_bf16(1.0f), 0x3f80);
  ck_assert_uint_eq(gw__float_to_bf16(1.00390625f), 0x3f80);      /* tie, even stays */
  ck_assert_uint_eq(gw__float_to_bf16(1.01171875f), 0x3f82);      /* tie, odd rounds up */
  ck_assert_uint_eq(gw__float_to_bf16(-2.0f), 0xc000);
  ck_assert(gw__float_to_bf16(NAN) != 0x7f80 && (gw__float_to_bf16(NAN) & 0x7f80) == 0x7f80);
  ck_assert_uint_eq(gw__float_to_bf16(INFINITY), 0x7f80);
  ck_assert(gw__bf16_to_float(0x3f80) == 1.0f);
}
END_TEST

/* The table's name a process picks (the choice is made once per process). */
static void simd_chosen(void *out, size_t cap) { snprintf(out, cap, "%s", gw__reduce_simd_name()); }

/* GW_SIMD naming no table is ignored (warned): the best table the CPU has, as
 * unset; it took the slowest, generic. A known name is honoured. */
START_TEST(test_simd_unknown_name_ignored) {
  char best[32] = "", bogus[32] = "", generic[32] = "";
  test_in_child_with_env("GW_SIMD", NULL, simd_chosen, best, sizeof best);
  test_in_child_with_env("GW_SIMD", "bogus", simd_chosen, bogus, sizeof bogus);
  test_in_child_with_env("GW_SIMD", "GENERIC", simd_chosen, generic, sizeof generic);
  ck_assert_str_eq(bogus, best);
  ck_assert_str_eq(generic, "generic");
}
END_TEST

/* gw__fold_reduce (a widened ring step: float32 local data into a 16-bit
 * reduction) gives what its three parts give one after another over whole
 * arrays: the local values times the scale rounded to the wire, the wire's
 * kernel, the result widened; every combination of scale, division, the
 * local values first, either output left out, in place (the widened result
 * over the local values); every op, with NaNs of other payloads and signs
 * on both sides (which operand comes first shows; SUM and PROD of two NaNs
 * give the first one's, a rule the three passes do not keep), zeros,
 * subnormals, infinities, values that overflow on rounding, signaling NaNs
 * received; lengths around the three passes' piece size and the one
 * pass's eight lanes; nothing written past n or to a left-out output.
 * In a child per table (the table is chosen once per process); "ok" or the
 * first difference. */
static bool nan16(int bf, uint16_t h) { return bf ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00; }
/* Local values of the edges: zeros, a float32 subnormal, float16's
 * subnormals, what rounds to float16's infinity or largest value, float32's
 * largest, infinities. */
static const float specials[] = {0.0f, -0.0f, 1e-40f, -3e-6f, 6e-8f, 65520.0f, 65519.0f, -FLT_MAX, INFINITY, -INFINITY};
/* Received 16-bit values of the edges: zeros, subnormals, infinities, a
 * signaling NaN, the largest finite (float16 / bfloat16). */
static const uint16_t raw16[2][8] = {{0x0000, 0x8000, 0x0001, 0x83ff, 0x7c00, 0xfc00, 0x7c01, 0x7bff},
                                     {0x0000, 0x8000, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7f81, 0x7f7f}};

static void fold_check(void *out, size_t cap) {
  enum { N = 5003, PAD = 8 };
  static float local[N + PAD], wide[N + PAD], want_wide[N];
  static uint16_t recv[N], slot[N + PAD], mine[N], want[N];
  static const size_t lens[] = {0, 1, 7, 2047, 2048, 2049, 5003};
  snprintf(out, cap, "ok");
  for (int bf = 0; bf < 2; bf++) {
    const gw_dtype_t dt = bf ? GW_BFLOAT16 : GW_FLOAT16;
    for (int o = 0; o < 4; o++) {
      static const gw_op_t ops[] = {GW_SUM, GW_PROD, GW_MAX, GW_MIN};
      const int max = o >= 2;
      const gw_reduce_fn red = gw__reduce_fn(dt, ops[o]);
      for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
        for (int variant = 0; variant < 64; variant++) {
          const size_t n = lens[li];
          const float scale = variant & 1 ? 1.0f / 3.0f : 1.0f;
          const int local_first = variant >> 1 & 1, no_slot = variant >> 2 & 1, in_place = variant >> 3 & 1;
          const int no_wide = variant >> 4 & 1;
          const uint32_t div = (variant >> 5 & 1) && ops[o] == GW_SUM ? 3 : 0;
          if (in_place && no_wide) continue;
          for (size_t i = 0; i < n; i++) {
            local[i] = (float)(((double)(mix64(i + 77 * li) >> 11) * 0x1p-53) * 8 - 4);
            float r = (float)(((double)(mix64(i + 5 + 1000 * li) >> 11) * 0x1p-53) * 8 - 4);
            if (i % 11 == 4) local[i] = specials[(i / 11) % (sizeof specials / sizeof *specials)];
            if (i % 5 == 0 || i % 7 == 3) { /* a NaN here: quiet with its own payload, or signaling and negative */
              const uint32_t bits = i % 5 == 0 ? 0x7fc12345u : 0xff800001u;
              memcpy(&local[i], &bits, 4);
            }
            if (i % 3 == 0) { /* and there: negative, another payload */
              const uint32_t bits = 0xffc50000u;
              memcpy(&r, &bits, 4);
            }
            gw__cvt_from_f32(dt, &recv[i], &r, 1);
            /* beside each local edge value, each received one in turn (all
             * pairs within 880 elements), signaling NaNs no rank of ours sends too */
            if (i % 11 == 4) recv[i] = raw16[bf][(i / 110) % 8];
          }
          gw__cvt_from_f32_scaled(dt, mine, local, n, scale);
          red(want, NULL, local_first ? mine : recv, local_first ? recv : mine, n, div);
          /* SUM and PROD of two NaNs: the first operand's (the rule, not the
           * three passes' chance) */
          for (size_t i = 0; i < n && !max; i++)
            if (nan16(bf, mine[i]) && nan16(bf, recv[i])) {
              const uint16_t first = local_first ? mine[i] : recv[i];
              want[i] = bf ? (uint16_t)(first | 0x40) : (uint16_t)(0x7e00 | (first & 0x8000));
            }
          gw__cvt_to_f32(dt, want_wide, want, n);
          memset(slot, 0xee, sizeof slot), memset(wide, 0xee, sizeof wide);
          for (size_t i = n; i < N + PAD; i++) memset(&local[i], 0xee, 4);
          float *w = no_wide ? NULL : in_place ? local : wide;
          gw__fold_reduce(ops[o], dt, no_slot ? NULL : slot, w, recv, local, n, div, scale, local_first);
          for (size_t i = 0; i < n; i++)
            if ((!no_slot && slot[i] != want[i]) || (w && memcmp(&w[i], &want_wide[i], 4))) {
              snprintf(out, cap, "%s %s %s n %zu variant %d element %zu: slot 0x%04x wide %a, want 0x%04x %a",
                       gw__reduce_simd_name(), gw_dtype_name(dt), gw_op_name(ops[o]), n, variant, i, slot[i],
                       w ? (double)w[i] : 0.0, want[i], (double)want_wide[i]);
              return;
            }
          for (size_t i = 0; i < N + PAD; i++) {
            uint32_t lb, wb;
            memcpy(&lb, &local[i], 4), memcpy(&wb, &wide[i], 4);
            const bool slot_bad = (no_slot || i >= n) && slot[i] != 0xeeee;
            const bool wide_bad = (w != wide || i >= n) && wb != 0xeeeeeeeeu;
            if (slot_bad || wide_bad || (i >= n && lb != 0xeeeeeeeeu)) {
              snprintf(out, cap, "%s %s n %zu variant %d: element %zu written where nothing should be",
                       gw__reduce_simd_name(), gw_dtype_name(dt), n, variant, i);
              return;
            }
          }
        }
    }
  }
}

START_TEST(test_fold_reduce) {
  for (size_t v = 0; v < 3; v++) {
    if (!gw__reduce_table_named(variants[v])) continue;
    char res[300] = "";
    test_in_child_with_env("GW_SIMD", variants[v], fold_check, res, sizeof res);
    ck_assert_msg(!strcmp(res, "ok"), "%s: %s", variants[v], res);
  }
}
END_TEST

/* The two-rank exchange on a 16-bit wire: both ranks reduce the same pair,
 * rank 0 with its own values first (local_first), rank 1 with the received
 * ones first, and must end with the same bits, NaNs included: SUM and PROD
 * where both operands are NaNs of other payloads and signs (a NaN's sign
 * survives float16's rounding, its payload bfloat16's) gave the first
 * operand's only as the compiler happened to order the instruction's
 * operands in each specialized loop; now rank 0's (the first operand's) by
 * rule.  Every pair of the CPU's tables, generic included (the ranks may
 * run on machines of other instruction sets), with and without a scale. */
START_TEST(test_fold_exchange_agrees) {
  enum { N = 1003 };
  static float a[N], b[N], wide0[N], wide1[N];
  static uint16_t a16[N], b16[N], slot0[N], slot1[N];
  for (int bf = 0; bf < 2; bf++)
    for (int kop = GW_KOP_SUM; kop <= GW_KOP_PROD; kop++)
      for (int scaled = 0; scaled < 2; scaled++) {
        const gw_dtype_t dt = bf ? GW_BFLOAT16 : GW_FLOAT16;
        const float scale = scaled ? 1.0f / 3.0f : 1.0f;
        for (size_t i = 0; i < N; i++) {
          a[i] = (float)(((double)(mix64(i + 11) >> 11) * 0x1p-53) * 8 - 4);
          b[i] = (float)(((double)(mix64(i + 12345) >> 11) * 0x1p-53) * 8 - 4);
          const uint32_t na = 0x7fc12345u, nb = 0xffe54321u; /* quiet, other payloads and signs */
          if (i % 3 == 0) memcpy(&a[i], &na, 4);
          if (i % 2 == 0) memcpy(&b[i], &nb, 4);
        }
        /* what each rank sends the other: its values times the scale, rounded */
        gw__cvt_from_f32_scaled(dt, a16, a, N, scale);
        gw__cvt_from_f32_scaled(dt, b16, b, N, scale);
        for (size_t t0 = 0; t0 < 3; t0++)
          for (size_t t1 = 0; t1 < 3; t1++) {
            const gw_fold_table_t *f0 = gw__fold_table_named(variants[t0]), *f1 = gw__fold_table_named(variants[t1]);
            if (!f0 || !f1) continue;
            for (uint32_t div = 0; div <= 2; div += 2) {
              const uint32_t d = kop == GW_KOP_SUM ? div : 0;
              (*f0)[bf][kop](slot0, wide0, b16, a, N, d, scale, 1);
              (*f1)[bf][kop](slot1, wide1, a16, b, N, d, scale, 0);
              for (size_t i = 0; i < N; i++) {
                ck_assert_msg(slot0[i] == slot1[i] && !memcmp(&wide0[i], &wide1[i], 4),
                              "%s %s scale %g: rank 0 on %s 0x%04x, rank 1 on %s 0x%04x at element %zu",
                              gw_dtype_name(dt), kop == GW_KOP_SUM ? "sum" : "prod", (double)scale, variants[t0],
                              slot0[i], variants[t1], slot1[i], i);
                if (nan16(bf, a16[i]) && nan16(bf, b16[i])) {
                  const uint16_t want = bf ? (uint16_t)(a16[i] | 0x40) : (uint16_t)(0x7e00 | (a16[i] & 0x8000));
                  ck_assert_msg(slot0[i] == want, "%s: two NaNs gave 0x%04x, not rank 0's 0x%04x at element %zu",
                                variants[t0], slot0[i], want, i);
                }
              }
            }
          }
      }
}
END_TEST

int main(void) {
  Suite *s = suite_create("reduce");
  TCase *tc = tcase_create("kernels");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_kernels_match_reference);
  tcase_add_test(tc, test_simd_unknown_name_ignored);
  tcase_add_test(tc, test_nan_max_min);
  tcase_add_test(tc, test_signed_zeros);
  tcase_add_test(tc, test_half_conversions_exact);
  tcase_add_test(tc, test_array_conversions);
  tcase_add_test(tc, test_bf16_conversions);
  tcase_add_test(tc, test_fold_reduce);
  tcase_add_test(tc, test_fold_exchange_agrees);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
