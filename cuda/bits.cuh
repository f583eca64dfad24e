/* bits.cuh - a float's bits and back, the same on the host and the device (the
 * .cu files' conversions and NaN handling are written on the bits, so that the
 * host tests run the very code the kernels run): cuda/kernels.cu and
 * model/cudnn_kernels_math.cuh. */
#ifndef GW_CUDA_BITS_CUH
#define GW_CUDA_BITS_CUH

#include <stdint.h>
#include <string.h>

namespace gwcu {

__host__ __device__ __forceinline__ uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

__host__ __device__ __forceinline__ float f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

} // namespace gwcu

#endif
