/* reduce_impl.c - the reduction kernels, compiled once per instruction set
 * (meson builds this file three times with GW_SIMD_SUFFIX = generic, avx2,
 * avx512 and matching -m flags); reduce.c picks the table at run time.  Plain
 * loops over restrict pointers that the compiler vectorizes at -O3, plus explicit
 * eight-lane code for the 16-bit floats where the build has AVX2 (F16C for
 * fp16; integer rounding for bf16 in the AVX2 build only).  No dispatch or
 * policy here. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "reduce.h"
#include "reduce_cvt.h"

#ifndef GW_SIMD_SUFFIX
#error "GW_SIMD_SUFFIX must name the instruction set this file is built for"
#endif
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define TABLE CAT(gw__reduce_table_, GW_SIMD_SUFFIX)

/* Aliasing: dst0 may be the same array as a or b (in-place collectives), element
 * for element.  The loops read a[i] and b[i] before writing dst[i], so restrict is
 * honoured in effect and the vectorizer needs no overlap checks. */
#define LOOP(T, EXPR)                                                                \
  T *restrict o0 = (T *)d0;                                                          \
  T *restrict o1 = (T *)d1;                                                          \
  const T *restrict x = (const T *)a;                                                \
  const T *restrict y = (const T *)b;                                                \
  if (o1) {                                                                          \
    for (size_t i = 0; i < n; i++) {                                                 \
      T v_ = EXPR;                                                                   \
      o0[i] = v_;                                                                    \
      o1[i] = v_;                                                                    \
    }                                                                                \
  } else {                                                                           \
    for (size_t i = 0; i < n; i++) o0[i] = EXPR;                                     \
  }

/* Integers: SUM/PROD in the unsigned type so overflow wraps without UB. */
#define DEF_INT(NAME, T, UT)                                                         \
  static void NAME##_sum(void *d0, void *d1, const void *a, const void *b, size_t n,  \
                         uint32_t div) {                                              \
    if (div > 1) { /* divided in int64: (T)div would be 0 or negative for int8 */   \
      const int64_t dv = (int64_t)div;                                               \
      LOOP(T, (T)((int64_t)(T)((UT)x[i] + (UT)y[i]) / dv))                           \
    } else {                                                                         \
      LOOP(T, (T)((UT)x[i] + (UT)y[i]))                                              \
    }                                                                                \
  }                                                                                  \
  static void NAME##_prod(void *d0, void *d1, const void *a, const void *b, size_t n, \
                          uint32_t div) {                                             \
    (void)div;                                                                       \
    LOOP(T, (T)((UT)x[i] * (UT)y[i]))                                                \
  }                                                                                  \
  static void NAME##_max(void *d0, void *d1, const void *a, const void *b, size_t n,  \
                         uint32_t div) {                                              \
    (void)div;                                                                       \
    LOOP(T, x[i] > y[i] ? x[i] : y[i])                                               \
  }                                                                                  \
  static void NAME##_min(void *d0, void *d1, const void *a, const void *b, size_t n,  \
                         uint32_t div) {                                              \
    (void)div;                                                                       \
    LOOP(T, x[i] < y[i] ? x[i] : y[i])                                               \
  }

DEF_INT(i8, int8_t, uint8_t)
DEF_INT(u8, uint8_t, uint8_t)
DEF_INT(i32, int32_t, uint32_t)
DEF_INT(i64, int64_t, uint64_t)

/* fp32 / fp64: computed in the type itself.  AVG divides (not multiplies by 1/n)
 * so that exactly representable means stay exact.  MAX/MIN propagate NaN (a
 * NaN operand is the result, the first one when both are): with a plain
 * `x > y ? x : y` a NaN survived as the second operand only, so whether a
 * NaN input came out depended on the rank's place in the ring, the count and
 * the algorithm. */
#define DEF_FLT(NAME, T)                                                             \
  static void NAME##_sum(void *d0, void *d1, const void *a, const void *b, size_t n,  \
                         uint32_t div) {                                              \
    if (div > 1) {                                                                   \
      const T dv = (T)div;                                                           \
      LOOP(T, (x[i] + y[i]) / dv)                                                    \
    } else {                                                                         \
      LOOP(T, x[i] + y[i])                                                           \
    }                                                                                \
  }                                                                                  \
  static void NAME##_prod(void *d0, void *d1, const void *a, const void *b, size_t n, \
                          uint32_t div) {                                             \
    (void)div;                                                                       \
    LOOP(T, x[i] * y[i])                                                             \
  }                                                                                  \
  static void NAME##_max(void *d0, void *d1, const void *a, const void *b, size_t n,  \
                         uint32_t div) {                                              \
    (void)div;                                                                       \
    LOOP(T, x[i] > y[i] || x[i] != x[i] || (x[i] == y[i] && signbit(y[i])) ? x[i] : y[i]) \
  }                                                                                  \
  static void NAME##_min(void *d0, void *d1, const void *a, const void *b, size_t n,  \
                         uint32_t div) {                                              \
    (void)div;                                                                       \
    LOOP(T, x[i] < y[i] || x[i] != x[i] || (x[i] == y[i] && signbit(x[i])) ? x[i] : y[i]) \
  }

DEF_FLT(f32, float)
DEF_FLT(f64, double)

/* fp16 / bf16: widen to fp32, operate, round once to nearest even. */
static inline float op_sum(float p, float q) { return p + q; }
static inline float op_prod(float p, float q) { return p * q; }
/* MAX/MIN order the zeros as IEEE 754-2019 maximum/minimum do (+0 above -0):
 * of two equal operands the selection took the second, so a ring gave -0 for
 * some blocks and +0 for others in one call, by the order of the operands
 * there (equal nonzero values are the same value either way). */
static inline float op_max(float p, float q) { return p > q || p != p || (p == q && signbit(q)) ? p : q; }
static inline float op_min(float p, float q) { return p < q || p != p || (p == q && signbit(p)) ? p : q; }

/* Without a division the loop has none (x / 1 is x: the same bits, at a
 * third of the time here). */
#define DEF_H16_SCALAR(NAME, TOF, FROMF, OP)                                         \
  static void NAME(void *d0, void *d1, const void *a, const void *b, size_t n,        \
                   uint32_t div) {                                                    \
    if (div > 1) {                                                                   \
      const float dv = (float)div;                                                   \
      LOOP(uint16_t, FROMF(OP(TOF(x[i]), TOF(y[i])) / dv))                            \
    } else {                                                                         \
      LOOP(uint16_t, FROMF(OP(TOF(x[i]), TOF(y[i]))))                                 \
    }                                                                                \
  }

#if defined(__F16C__) && defined(__AVX2__)
/* Eight lanes at a time: LOAD8 widens eight 16-bit values, ROUND8 narrows
 * eight floats as FROMF does; the tail is the scalar kernel's. */
#define DEF_H16_VEC(NAME, LOAD8, ROUND8, TOF, FROMF, OP, VOP)                         \
  static void NAME(void *d0, void *d1, const void *a, const void *b, size_t n,        \
                   uint32_t div) {                                                    \
    uint16_t *o0 = (uint16_t *)d0, *o1 = (uint16_t *)d1;                             \
    const uint16_t *x = (const uint16_t *)a, *y = (const uint16_t *)b;               \
    const float dv = div > 1 ? (float)div : 1.0f;                                    \
    const __m256 vdv = _mm256_set1_ps(dv);                                           \
    size_t i = 0;                                                                    \
    for (; i + 8 <= n; i += 8) {                                                     \
      __m256 r = VOP(LOAD8(x + i), LOAD8(y + i));                                    \
      if (div > 1) r = _mm256_div_ps(r, vdv);                                        \
      __m128i h = ROUND8(r);                                                         \
      _mm_storeu_si128((__m128i *)(o0 + i), h);                                      \
      if (o1) _mm_storeu_si128((__m128i *)(o1 + i), h);                              \
    }                                                                                \
    for (; i < n; i++) {                                                             \
      const float v = OP(TOF(x[i]), TOF(y[i]));                                      \
      uint16_t h = FROMF(div > 1 ? v / dv : v);                                      \
      o0[i] = h;                                                                     \
      if (o1) o1[i] = h;                                                             \
    }                                                                                \
  }
/* max/min: match the scalar op_max / op_min (p when greater, a NaN, or equal
 * with the sign that orders zeros, else q).  The blend takes p where the
 * mask's sign bit is set: equal & the sign operand itself is that mask. */
static inline __m256 vpick(__m256 p, __m256 q, __m256 p_wins, __m256 sign_of) {
  const __m256 eq_signed = _mm256_and_ps(_mm256_cmp_ps(p, q, _CMP_EQ_OQ), sign_of);
  return _mm256_blendv_ps(q, p, _mm256_or_ps(_mm256_or_ps(p_wins, eq_signed), _mm256_cmp_ps(p, p, _CMP_UNORD_Q)));
}
static inline __m256 vmax(__m256 p, __m256 q) { return vpick(p, q, _mm256_cmp_ps(p, q, _CMP_GT_OQ), q); }
static inline __m256 vmin(__m256 p, __m256 q) { return vpick(p, q, _mm256_cmp_ps(p, q, _CMP_LT_OQ), p); }

/* float16 with the F16C conversion instructions.  A NaN lane is narrowed as
 * the scalar cvt_f2h narrows it (0x7e00 and the sign): the instruction would
 * keep the payload, so ranks whose tables differ (F16C or not) could end
 * with other bits. */
static inline __m256 f16_widen8(__m128i h) { return _mm256_cvtph_ps(h); }
static inline __m256 f16_load8(const uint16_t *p) { return f16_widen8(_mm_loadu_si128((const __m128i *)p)); }
static inline __m128i f16_round8(__m256 r) {
  const __m256 sign = _mm256_and_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)));
  const __m256 quiet = _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  return _mm256_cvtps_ph(_mm256_blendv_ps(r, quiet, _mm256_cmp_ps(r, r, _CMP_UNORD_Q)), _MM_FROUND_TO_NEAREST_INT);
}
DEF_H16_VEC(f16_sum, f16_load8, f16_round8, cvt_h2f, cvt_f2h, op_sum, _mm256_add_ps)
DEF_H16_VEC(f16_prod, f16_load8, f16_round8, cvt_h2f, cvt_f2h, op_prod, _mm256_mul_ps)
DEF_H16_VEC(f16_max, f16_load8, f16_round8, cvt_h2f, cvt_f2h, op_max, vmax)
DEF_H16_VEC(f16_min, f16_load8, f16_round8, cvt_h2f, cvt_f2h, op_min, vmin)

/* bfloat16, eight lanes, in the AVX2 build: the scalar cvt_bf2f / cvt_f2bf
 * in integer vector operations, where the compiler's own vectorization of
 * the scalar loop ran at a fifth of float32's speed (0.25 against 0.05 ns
 * per element here; these 0.19, and the narrowing 0.16 -> 0.12 ns).  The
 * AVX-512 build keeps the compiler's sixteen lanes of the scalar loop
 * (0.11 ns; these took 0.20).  Every value the rounding leaves fits 16
 * bits, so the unsigned-saturating pack is exact. */
#if !defined(__AVX512F__)
#define GW_BF16_LANES8 1
static inline __m256 bf_load8(const uint16_t *p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline __m128i bf_round8(__m256 r) {
  const __m256i u = _mm256_castps_si256(r);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i v = _mm256_blendv_epi8(rounded, quiet, is_nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}
DEF_H16_VEC(bf16_sum, bf_load8, bf_round8, cvt_bf2f, cvt_f2bf, op_sum, _mm256_add_ps)
DEF_H16_VEC(bf16_prod, bf_load8, bf_round8, cvt_bf2f, cvt_f2bf, op_prod, _mm256_mul_ps)
DEF_H16_VEC(bf16_max, bf_load8, bf_round8, cvt_bf2f, cvt_f2bf, op_max, vmax)
DEF_H16_VEC(bf16_min, bf_load8, bf_round8, cvt_bf2f, cvt_f2bf, op_min, vmin)
#else
DEF_H16_SCALAR(bf16_sum, cvt_bf2f, cvt_f2bf, op_sum)
DEF_H16_SCALAR(bf16_prod, cvt_bf2f, cvt_f2bf, op_prod)
DEF_H16_SCALAR(bf16_max, cvt_bf2f, cvt_f2bf, op_max)
DEF_H16_SCALAR(bf16_min, cvt_bf2f, cvt_f2bf, op_min)
#endif

#else
DEF_H16_SCALAR(f16_sum, cvt_h2f, cvt_f2h, op_sum)
DEF_H16_SCALAR(f16_prod, cvt_h2f, cvt_f2h, op_prod)
DEF_H16_SCALAR(f16_max, cvt_h2f, cvt_f2h, op_max)
DEF_H16_SCALAR(f16_min, cvt_h2f, cvt_f2h, op_min)
DEF_H16_SCALAR(bf16_sum, cvt_bf2f, cvt_f2bf, op_sum)
DEF_H16_SCALAR(bf16_prod, cvt_bf2f, cvt_f2bf, op_prod)
DEF_H16_SCALAR(bf16_max, cvt_bf2f, cvt_f2bf, op_max)
DEF_H16_SCALAR(bf16_min, cvt_bf2f, cvt_f2bf, op_min)
#endif

/* A widened operation's reduction step (reduce.h, gw__fold_reduce) in one
 * pass: the local float32 values times the scale (not applied when it is 1,
 * as the rounding pass did not), rounded to the wire and widened again (the
 * 16-bit value this rank contributes), the op with the received values in
 * the order asked, the division, one rounding; the result to the slot and/or
 * widened to the float32 output.  The same operations in the same order as
 * the three passes it replaces (the rounding, the wire dtype's kernel, the
 * widening), so the same bits, but for one thing: SUM and PROD give a NaN
 * first operand as the result (of two NaNs the three passes gave the first
 * one's only as the compiler ordered the instruction's operands, and in the
 * loops specialized here it ordered them alike for both orders: the
 * two-rank exchange's ranks, one with its own values first, the other with
 * the received ones, ended with NaNs of other signs or payloads;
 * test_fold_exchange_agrees; every table follows the rule, the generic
 * one too, so ranks on machines of other instruction sets agree).  float16
 * in eight lanes with F16C (the generic build: the scalar conversions);
 * bfloat16 rounded inside each float's 32 bits (no packing to 16 bits and
 * back but into the slot), a plain loop per combination of the flags that
 * the compiler vectorizes, in every build.  Nanoseconds per element, 16 K elements in L1 (to the
 * slot / to the slot and the output with a division), the three passes ->
 * this, in one sitting: AVX-512 bf16 0.17 / 0.24 -> 0.13 / 0.17, fp16 0.19 /
 * 0.27 -> 0.16 / 0.23; AVX2 bf16 0.33 / 0.42 -> 0.31 / 0.38, fp16 0.21 /
 * 0.32 -> 0.17 / 0.25 (float32's own sum 0.07 / 0.10). */
/* The scalar conversions' loop: the generic build's float16 kernels, and
 * the tail of the eight-lane ones. */
#define DEF_FOLD_SCALAR(NAME, TOF, FROMF, OP, NAN_FIRST)                               \
  static void NAME(uint16_t *slot, float *wide, const uint16_t *recv, const float *local, size_t n, \
                   uint32_t div, float scale, int local_first) {                      \
    const float dv = div > 1 ? (float)div : 1.0f;                                    \
    for (size_t i = 0; i < n; i++) {                                                 \
      const float mine = TOF(FROMF(scale != 1.0f ? local[i] * scale : local[i]));     \
      const float theirs = TOF(recv[i]);                                             \
      const float first = local_first ? mine : theirs;                               \
      const float v = NAN_FIRST && first != first ? first : local_first ? OP(mine, theirs) : OP(theirs, mine); \
      const uint16_t h = FROMF(div > 1 ? v / dv : v);                                \
      if (slot) slot[i] = h;                                                         \
      if (wide) wide[i] = TOF(h);                                                    \
    }                                                                                \
  }
DEF_FOLD_SCALAR(fold1_f16_sum, cvt_h2f, cvt_f2h, op_sum, 1)
DEF_FOLD_SCALAR(fold1_f16_prod, cvt_h2f, cvt_f2h, op_prod, 1)
DEF_FOLD_SCALAR(fold1_f16_max, cvt_h2f, cvt_f2h, op_max, 0)
DEF_FOLD_SCALAR(fold1_f16_min, cvt_h2f, cvt_f2h, op_min, 0)

#if defined(__F16C__) && defined(__AVX2__)
#define DEF_FOLD_VEC(NAME, WIDEN8, ROUND8, ROUND8_ANY_NAN, VOP, NAN_FIRST, TAIL)        \
  static void NAME(uint16_t *slot, float *wide, const uint16_t *recv, const float *local, size_t n, \
                   uint32_t div, float scale, int local_first) {                      \
    const __m256 vdv = _mm256_set1_ps(div > 1 ? (float)div : 1.0f), vsc = _mm256_set1_ps(scale); \
    const int scaled = scale != 1.0f;                                                \
    size_t i = 0;                                                                    \
    for (; i + 8 <= n; i += 8) {                                                     \
      __m256 l = _mm256_loadu_ps(local + i);                                         \
      if (scaled) l = _mm256_mul_ps(l, vsc);                                         \
      const __m256 mine = WIDEN8(ROUND8_ANY_NAN(l));                                 \
      const __m256 theirs = WIDEN8(_mm_loadu_si128((const __m128i *)(recv + i)));   \
      __m256 r = local_first ? VOP(mine, theirs) : VOP(theirs, mine);                \
      if (NAN_FIRST) r = nan_first8(r, local_first ? mine : theirs);                 \
      if (div > 1) r = _mm256_div_ps(r, vdv);                                        \
      const __m128i h = ROUND8(r);                                                   \
      if (slot) _mm_storeu_si128((__m128i *)(slot + i), h);                          \
      if (wide) _mm256_storeu_ps(wide + i, WIDEN8(h));                               \
    }                                                                                \
    if (i < n)                                                                       \
      TAIL(slot ? slot + i : NULL, wide ? wide + i : NULL, recv + i, local + i, n - i, div, scale, local_first); \
  }
/* This rank's operand needs no NaN of the scalar bits: whatever its payload,
 * the op passes on a NaN of its sign, which the result's rounding makes
 * those bits. */
static inline __m128i f16_round8_any_nan(__m256 r) { return _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT); }
/* SUM and PROD: the first operand where it is a NaN (max and min say so
 * themselves). */
static inline __m256 nan_first8(__m256 r, __m256 first) {
  return _mm256_blendv_ps(r, first, _mm256_cmp_ps(first, first, _CMP_UNORD_Q));
}
DEF_FOLD_VEC(fold_f16_sum, f16_widen8, f16_round8, f16_round8_any_nan, _mm256_add_ps, 1, fold1_f16_sum)
DEF_FOLD_VEC(fold_f16_prod, f16_widen8, f16_round8, f16_round8_any_nan, _mm256_mul_ps, 1, fold1_f16_prod)
DEF_FOLD_VEC(fold_f16_max, f16_widen8, f16_round8, f16_round8_any_nan, vmax, 0, fold1_f16_max)
DEF_FOLD_VEC(fold_f16_min, f16_widen8, f16_round8, f16_round8_any_nan, vmin, 0, fold1_f16_min)
#define F16_FOLD(OP) fold_f16_##OP
#else
#define F16_FOLD(OP) fold1_f16_##OP
#endif

/* bfloat16 rounded in place: cvt_bf2f(cvt_f2bf(f)) without leaving the
 * float's 32 bits (a NaN quieted as cvt_f2bf quiets it). */
static inline float bf_keep(float f) {
  const uint32_t u = cvt_f2u(f);
  const uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
  return cvt_u2f(r & 0xffff0000u);
}
/* One loop per combination, each a plain loop the compiler vectorizes (the
 * flags are constants where fold_bf16_loop is expanded). */
static inline __attribute__((always_inline)) void fold_bf16_loop(
    uint16_t *restrict slot, float *wide, const uint16_t *restrict recv, const float *local, size_t n, float dv,
    float scale, const int op, const int lf, const int div, const int to_slot, const int to_wide) {
  for (size_t i = 0; i < n; i++) {
    const float l = local[i];
    const float mine = bf_keep(scale != 1.0f ? l * scale : l), theirs = cvt_bf2f(recv[i]);
    const float p = lf ? mine : theirs;
    float q = lf ? theirs : mine;
    /* SUM and PROD of a NaN p: p with itself, p's NaN whichever operand the
     * instruction takes first (a select of the result kept AVX2 from vectorizing) */
    if (op == GW_KOP_SUM || op == GW_KOP_PROD) q = cvt_u2f((cvt_f2u(p) & 0x7fffffffu) > 0x7f800000u ? cvt_f2u(p) : cvt_f2u(q));
    float v = op == GW_KOP_SUM ? p + q : op == GW_KOP_PROD ? p * q : op == GW_KOP_MAX ? op_max(p, q) : op_min(p, q);
    if (div) v = v / dv;
    const float r = bf_keep(v);
    if (to_slot) slot[i] = (uint16_t)(cvt_f2u(r) >> 16);
    if (to_wide) wide[i] = r;
  }
}
#define FOLD_BF16(OPNAME, KOP)                                                                         \
  static void fold_bf16_##OPNAME(uint16_t *slot, float *wide, const uint16_t *recv, const float *local, \
                                 size_t n, uint32_t div, float scale, int lf) {                        \
    const float dv = (float)div;                                                                       \
    const int d = div > 1;                                                                             \
    if (slot && wide) {                                                                                \
      if (lf) d ? fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 1, 1, 1, 1)               \
              : fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 1, 0, 1, 1);                \
      else d ? fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 0, 1, 1, 1)                  \
             : fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 0, 0, 1, 1);                 \
    } else if (slot) {                                                                                 \
      if (lf) d ? fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 1, 1, 1, 0)               \
              : fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 1, 0, 1, 0);                \
      else d ? fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 0, 1, 1, 0)                  \
             : fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 0, 0, 1, 0);                 \
    } else if (wide) {                                                                                 \
      if (lf) d ? fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 1, 1, 0, 1)               \
              : fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 1, 0, 0, 1);                \
      else d ? fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 0, 1, 0, 1)                  \
             : fold_bf16_loop(slot, wide, recv, local, n, dv, scale, KOP, 0, 0, 0, 1);                 \
    }                                                                                                  \
  }
FOLD_BF16(sum, GW_KOP_SUM)
FOLD_BF16(prod, GW_KOP_PROD)
FOLD_BF16(max, GW_KOP_MAX)
FOLD_BF16(min, GW_KOP_MIN)
const gw_fold_table_t CAT(gw__fold_table_, GW_SIMD_SUFFIX) = {
    {F16_FOLD(sum), F16_FOLD(prod), F16_FOLD(max), F16_FOLD(min)},
    {fold_bf16_sum, fold_bf16_prod, fold_bf16_max, fold_bf16_min},
};

#define ROW(NAME) {NAME##_sum, NAME##_prod, NAME##_max, NAME##_min}
const gw_reduce_table_t TABLE = {
    [GW_INT8] = ROW(i8),     [GW_UINT8] = ROW(u8),      [GW_INT32] = ROW(i32),
    [GW_INT64] = ROW(i64),   [GW_FLOAT16] = ROW(f16),   [GW_BFLOAT16] = ROW(bf16),
    [GW_FLOAT32] = ROW(f32), [GW_FLOAT64] = ROW(f64),
};

/* float32 <-> 16-bit arrays (the bucketer's wire format): F16C for fp16 where
 * the build has it (NaNs narrowed to the scalar bits), integer rounding for
 * bf16 (the eight-lane helpers in the AVX2 build, the compiler's otherwise). */
void CAT(gw__cvt_to16_, GW_SIMD_SUFFIX)(int bf16, uint16_t *restrict d, const float *restrict s, size_t n) {
  size_t i = 0;
  if (bf16) {
#ifdef GW_BF16_LANES8
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(d + i), bf_round8(_mm256_loadu_ps(s + i)));
#endif
    for (; i < n; i++) d[i] = cvt_f2bf(s[i]);
    return;
  }
#if defined(__F16C__) && defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(d + i), f16_round8(_mm256_loadu_ps(s + i)));
#endif
  for (; i < n; i++) d[i] = cvt_f2h(s[i]);
}

void CAT(gw__cvt_from16_, GW_SIMD_SUFFIX)(int bf16, float *restrict d, const uint16_t *restrict s, size_t n) {
  size_t i = 0;
  if (bf16) {
#ifdef GW_BF16_LANES8
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, bf_load8(s + i));
#endif
    for (; i < n; i++) d[i] = cvt_bf2f(s[i]);
    return;
  }
#if defined(__F16C__) && defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, f16_load8(s + i));
#endif
  for (; i < n; i++) d[i] = cvt_h2f(s[i]);
}
