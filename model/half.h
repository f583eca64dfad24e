/* half.h - bfloat16 <-> float32 conversions for the model side (the activations
 * of mixed precision): round to nearest even, NaN kept a (quiet) NaN, as
 * PyTorch's and oneDNN's.  comm/ has its own (reduce_cvt.h): the model uses
 * only gradwire.h's types, never comm/ internals. */
#ifndef GW_MODEL_HALF_H
#define GW_MODEL_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline float gw_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint16_t gw_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
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

#endif
