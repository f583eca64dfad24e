/* half.h - bfloat16 and float16 <-> float32 conversions for the model side (the
 * activations of mixed precision): round to nearest even, NaN kept a (quiet)
 * NaN with its sign and upper payload, as PyTorch's, oneDNN's and the F16C
 * instructions'.  Widening keeps a NaN's bits (float16: its ten fraction bits
 * at the top of float's), so a signaling float16 NaN stays signaling where
 * F16C and GCC's _Float16 set its quiet bit; narrowing never makes one.
 * Integer arithmetic only, so cudnn_kernels_math.cuh's device versions give
 * the same bits (host-tested; test_model_half.c checks these against
 * _Float16 casts and arithmetic in double on any CPU).  comm/ has its own
 * (reduce_cvt.h): the model uses only gradwire.h's types, never comm/
 * internals. */
#ifndef GW_MODEL_HALF_H
#define GW_MODEL_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A float's bits, and the float of given bits (also the tests'). */
static inline uint32_t gw_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float gw_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline float gw_bf16_to_f32(uint16_t h) { return gw_f32_from_bits((uint32_t)h << 16); }

static inline uint16_t gw_f32_to_bf16(float f) {
  uint32_t u = gw_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN: stays one, quiet */
  u += 0x7fffu + ((u >> 16) & 1u);                                            /* to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

static inline void gw_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = gw_f32_to_bf16(src[i]);
}

static inline void gw_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = gw_bf16_to_f32(src[i]);
}

/* float16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; subnormals below
 * 2^-14, largest finite 65504 (65520 and above round to infinity). */
static inline float gw_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else if (!m) {
    u = sign;
  } else { /* subnormal: m * 2^-24, normalized */
    uint32_t s = 0;
    while (!(m & 0x400u)) m <<= 1, s++;
    u = sign | ((113u - s) << 23) | ((m & 0x3ffu) << 13);
  }
  return gw_f32_from_bits(u);
}

static inline uint16_t gw_f32_to_f16(float f) {
  const uint32_t u = gw_f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN: stays one, quiet */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                     /* >= 65520: infinity */
  if (a >= 0x38800000u) {                                                       /* normal: rebias, round */
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
  }
  if (a <= 0x33000000u) return (uint16_t)sign; /* <= 2^-25: to zero (2^-25 is a tie, to even) */
  /* subnormal: the 24-bit significand in units of 2^-24, to nearest even */
  const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e; /* 14..24 */
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  uint32_t q = m >> shift;
  q += rem > half || (rem == half && (q & 1u));
  return (uint16_t)(sign | q);
}

/* dst [n] = src [n] as float16 (f16 != 0) or bfloat16, and back. */
static inline void gw_f32_to_half_n(int f16, uint16_t *dst, const float *src, size_t n) {
  if (f16)
    for (size_t i = 0; i < n; i++) dst[i] = gw_f32_to_f16(src[i]);
  else
    gw_f32_to_bf16_n(dst, src, n);
}

static inline void gw_half_to_f32_n(int f16, float *dst, const uint16_t *src, size_t n) {
  if (f16)
    for (size_t i = 0; i < n; i++) dst[i] = gw_f16_to_f32(src[i]);
  else
    gw_bf16_to_f32_n(dst, src, n);
}

#endif
