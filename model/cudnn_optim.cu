/* cudnn_optim.cu - the cudnn backend's training kernels (backend.h sgd_step and
 * nonfinite): the optimizer step and the loss scaler's overflow check run where
 * the weights and gradients live, so a trainer keeping them on the GPU moves
 * nothing across PCIe per step.
 *
 * The step is sgd_math.h's rule, the host's (sgd.c) bit for bit: one launch for
 * the whole buffer, grid.y one run of equal weight decay, grid.x a grid-stride
 * loop over the run's elements (each element is independent, so the geometry
 * never changes a result). */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cudnn_kernels.h"
#include "sgd.h"
#include "sgd_math.h"

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocksPerRun = 64;

__global__ void __launch_bounds__(kThreads)
    k_sgd(const struct gw_sgd_run *runs, float *p, const float *g, float *buf, struct gw_sgd_scalars sc) {
  const struct gw_sgd_run r = runs[blockIdx.y];
  const size_t stride = (size_t)gridDim.x * kThreads;
  for (size_t i = (size_t)blockIdx.x * kThreads + threadIdx.x; i < r.len; i += stride) {
    const size_t j = r.offset + i;
    gw_sgd_elem(&p[j], g[j], buf ? &buf[j] : nullptr, r.wd, &sc);
  }
}

__global__ void __launch_bounds__(kThreads) k_nonfinite(const float *x, size_t n, int *flag) {
  int bad = 0;
  for (size_t i = (size_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += (size_t)gridDim.x * kThreads)
    bad |= !isfinite(x[i]);
  /* Every writer stores the same 1: no atomics needed. */
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

} // namespace

extern "C" int gw__cu_sgd_step(const struct gw_sgd_run *runs, int nruns, size_t max_len, float *params,
                               const float *grads, float *momentum, const struct gw_sgd_scalars *sc, void *stream) {
  if (nruns < 0 || nruns > 65535 || !sc) return (int)cudaErrorInvalidValue;
  if (nruns == 0 || max_len == 0) return 0;
  size_t bx = (max_len + kThreads - 1) / kThreads;
  if (bx > kMaxBlocksPerRun) bx = kMaxBlocksPerRun;
  (void)cudaGetLastError();
  k_sgd<<<dim3((unsigned)bx, (unsigned)nruns), kThreads, 0, (cudaStream_t)stream>>>(runs, params, grads, momentum,
                                                                                      *sc);
  return (int)cudaGetLastError();
}

extern "C" int gw__cu_nonfinite(const float *x, size_t n, int *flag, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), st);
  if (e != cudaSuccess || n == 0) return (int)e;
  size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 4096) blocks = 4096;
  (void)cudaGetLastError();
  k_nonfinite<<<(unsigned)blocks, kThreads, 0, st>>>(x, n, flag);
  return (int)cudaGetLastError();
}
