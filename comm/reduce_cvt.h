/* reduce_cvt.h - branch-light fp16/bf16 <-> fp32 conversions (round to nearest
 * even), inlined into each SIMD build of the reduction kernels so the compiler can
 * vectorize them. */
#ifndef GW_REDUCE_CVT_H
#define GW_REDUCE_CVT_H
#include <stdint.h>
#include <string.h>

static inline uint32_t cvt_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float cvt_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float cvt_h2f(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = ((uint32_t)h & 0x7fffu) << 13;
  uint32_t exp = shifted_exp & o;
  o += (uint32_t)(127 - 15) << 23;
  if (exp == shifted_exp) {
    o += (uint32_t)(128 - 16) << 23; /* Inf / NaN */
  } else if (exp == 0) {             /* zero / subnormal: renormalize */
    o += 1u << 23;
    o = cvt_f2u(cvt_u2f(o) - cvt_u2f(113u << 23));
  }
  o |= ((uint32_t)h & 0x8000u) << 16;
  return cvt_u2f(o);
}

static inline uint16_t cvt_f2h(float ff) {
  const uint32_t f32infty = 255u << 23, f16max = (127u + 16u) << 23;
  const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t f = cvt_f2u(ff);
  uint32_t sign = f & 0x80000000u;
  uint16_t o;
  f ^= sign;
  if (f >= f16max) {
    o = (f > f32infty) ? 0x7e00 : 0x7c00; /* NaN stays NaN, overflow -> Inf */
  } else if (f < (113u << 23)) {
    /* subnormal or zero: the float adder does the rounding */
    o = (uint16_t)(cvt_f2u(cvt_u2f(f) + cvt_u2f(denorm_magic)) - denorm_magic);
  } else {
    uint32_t mant_odd = (f >> 13) & 1u;
    f += ((uint32_t)(15 - 127) << 23) + 0xfffu;
    f += mant_odd;
    o = (uint16_t)(f >> 13);
  }
  return (uint16_t)(o | (sign >> 16));
}

static inline float cvt_bf2f(uint16_t h) { return cvt_u2f((uint32_t)h << 16); }

static inline uint16_t cvt_f2bf(float f) {
  uint32_t u = cvt_f2u(f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x40u; /* keep NaN a (quiet) NaN */
  return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? nan : rounded);
}
#endif
