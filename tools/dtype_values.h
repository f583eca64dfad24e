/* dtype_values.h - reads and writes one element of any gradwire dtype as a
 * double, for tools and tests that fill and check buffers.  Written apart from
 * the library's kernels (it uses the compiler's _Float16), so a test that checks
 * the kernels with it is not checking them against themselves.  Not for the data
 * path: one element at a time, through a switch. */
#ifndef GW_DTYPE_VALUES_H
#define GW_DTYPE_VALUES_H

#include <stdint.h>
#include <string.h>

#include "gradwire.h"

static inline double gw_value_load(const void *buf, gw_dtype_t dt, size_t i) {
  switch (dt) {
    case GW_INT8: return ((const int8_t *)buf)[i];
    case GW_UINT8: return ((const uint8_t *)buf)[i];
    case GW_INT32: return ((const int32_t *)buf)[i];
    case GW_INT64: return (double)((const int64_t *)buf)[i];
    case GW_FLOAT16: {
      _Float16 h;
      memcpy(&h, (const char *)buf + 2 * i, 2);
      return (double)h;
    }
    case GW_BFLOAT16: {
      uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case GW_FLOAT32: return ((const float *)buf)[i];
    case GW_FLOAT64: return ((const double *)buf)[i];
    default: return 0;
  }
}

/* Element i of an integer dtype as int64, not through a double (int64
 * products wrap far past 2^53). */
static inline int64_t gw_value_load_int(const void *buf, gw_dtype_t dt, size_t i) {
  switch (dt) {
    case GW_INT8: return ((const int8_t *)buf)[i];
    case GW_UINT8: return ((const uint8_t *)buf)[i];
    case GW_INT32: return ((const int32_t *)buf)[i];
    default: return ((const int64_t *)buf)[i];
  }
}

/* Stores v rounded to the dtype (floats: to nearest even; integers: converted). */
static inline void gw_value_store(void *buf, gw_dtype_t dt, size_t i, double v) {
  switch (dt) {
    case GW_INT8: ((int8_t *)buf)[i] = (int8_t)(int64_t)v; break;
    case GW_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    case GW_INT32: ((int32_t *)buf)[i] = (int32_t)(int64_t)v; break;
    case GW_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case GW_FLOAT16: {
      _Float16 h = (_Float16)v;
      memcpy((char *)buf + 2 * i, &h, 2);
      break;
    }
    case GW_BFLOAT16: {
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      ((uint16_t *)buf)[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      break;
    }
    case GW_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case GW_FLOAT64: ((double *)buf)[i] = v; break;
    default: break;
  }
}
#endif
