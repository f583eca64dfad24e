/* dev_cache.cuh - a value per device that the .cu files' launchers compute once
 * and then read without a lock (SM counts, occupancies): cuda/kernels.cu and
 * model/cudnn_kernels.cu. */
#ifndef GW_CUDA_DEV_CACHE_CUH
#define GW_CUDA_DEV_CACHE_CUH

#include <cuda_runtime.h>

namespace gwcu {

template <class T>
struct ident {
  using type = T;
};

/* Launches kernel k with these arguments and returns this launch's error
 * alone: cudaLaunchKernel reports it directly, so an error the caller's own
 * earlier launch left pending (non-sticky) is neither taken for ours nor
 * cleared (cudaGetLastError around a <<<>>> launch would do one or the
 * other).  The arguments convert to the kernel's parameter types. */
template <class... P>
inline cudaError_t launch(void (*k)(P...), unsigned grid, unsigned block, cudaStream_t st,
                          typename ident<P>::type... args) {
  void *argv[] = {(void *)&args...};
  return cudaLaunchKernel((const void *)k, dim3(grid), dim3(block), argv, 0, st);
}

constexpr int kMaxDevCache = 64; /* devices with a cache slot; others compute every time */

/* cache[dev] once it holds a positive value; else compute(&v), kept when it
 * succeeded with v >= 1; `fallback` when it failed (its error cleared). */
template <class F>
inline int cached_per_device(int *cache, int dev, int fallback, F compute) {
  int v = dev >= 0 && dev < kMaxDevCache ? __atomic_load_n(&cache[dev], __ATOMIC_RELAXED) : 0;
  if (v > 0) return v;
  if (compute(&v) != cudaSuccess || v < 1) {
    (void)cudaGetLastError();
    return fallback;
  }
  if (dev >= 0 && dev < kMaxDevCache) __atomic_store_n(&cache[dev], v, __ATOMIC_RELAXED);
  return v;
}

/* The SM count of device dev (0 when unknown). */
inline int sm_count(int dev) {
  static int cache[kMaxDevCache];
  return cached_per_device(cache, dev, 0,
                           [dev](int *v) { return cudaDeviceGetAttribute(v, cudaDevAttrMultiProcessorCount, dev); });
}

} // namespace gwcu

#endif
