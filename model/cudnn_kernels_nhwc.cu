/* cudnn_kernels_nhwc.cu - the cudnn backend's channels-last (NHWC) kernels:
 * batch norm's per-channel sums and the weight transposes (OIHW <-> OHWI,
 * with the activations' dtype) that NHWC convolutions need.  Batch norm's
 * element-wise passes and the average pool's backward are
 * cudnn_kernels_dev.cuh's per-channel kernel in its NHWC form, and the pools
 * cudnn_kernels.cu's kernels with the elements c apart, all launched from
 * cudnn_kernels.cu.
 *
 * Every result has the NCHW kernels' bits (backend.h): each channel's values
 * are summed in the same order (gwk::chan_thread_nhwc walks chan_thread's
 * values), and every element is computed by the same function.
 *
 * The per-channel sums: a block of kRedThreads threads per (tile of
 * gwk::kTile adjacent channels, piece of kPiece values), grid.x the tiles (so
 * blocks that read the same rows run side by side), grid.y the pieces; thread t
 * keeps one accumulator per channel of its tile (registers: the tile loops are
 * unrolled) and reads kTile adjacent channels of a row at once (32 bytes of
 * float; 4 at a time with vector loads where c % 4 == 0).  Then each channel's
 * block tree, the partials as NCHW's, and cudnn_kernels.cu's second pass.
 *
 * Index limits as NCHW's (n * h * w and c * h * w below 2^31). */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cudnn_kernels_dev.cuh"

namespace {

using gwk::kTile;

/* ---- batch norm's per-channel sums ------------------------------------------------------------------- */
template <class Rule>
__global__ void __launch_bounds__(gwk::kRedThreads)
    k_chan_partials_nhwc(Rule rule, int c, uint32_t count, uint32_t pieces, bool vec, double *part) {
  __shared__ double sa[gwk::kRedThreads], sb[gwk::kRedThreads];
  const int ch0 = (int)blockIdx.x * kTile;
  const int nct = c - ch0 < kTile ? c - ch0 : kTile; /* the same for the whole block */
  typename Rule::St st[kTile] = {};
  for (uint32_t piece = blockIdx.y; piece < pieces; piece += gridDim.y) {
    const uint32_t j0 = piece * gwk::kPiece, j1 = count - j0 < gwk::kPiece ? count : j0 + gwk::kPiece;
#pragma unroll
    for (int k = 0; k < kTile; k++)
      if (k < nct) rule.begin(st[k], (uint32_t)(ch0 + k));
    gwk::chan_thread_nhwc(rule, st, nct, j0, j1, (int)threadIdx.x, (uint32_t)c, (uint32_t)ch0, vec);
#pragma unroll
    for (int k = 0; k < kTile; k++) {
      if (k < nct) {
        double a = st[k].s, b = st[k].s2;
        block_sum2<gwk::kRedThreads>(a, b, sa, sb);
        if (threadIdx.x == 0) {
          part[(size_t)(ch0 + k) * pieces + piece] = a;
          part[((size_t)c + ch0 + k) * pieces + piece] = b;
        }
        __syncthreads();
      }
    }
  }
}

template <class Rule>
int chan_reduce_nhwc(const ChanShape &s, const Rule &rule, bool vec, double *sums, cudaStream_t st) {
  const uint32_t pieces = (s.count + gwk::kPiece - 1) / gwk::kPiece;
  if (pieces == 0) return gwkd::chan_finish(nullptr, s.c, 0, sums, st); /* no values: every sum is 0 */
  double *part = nullptr;
  cudaError_t e = gwkd::scratch_alloc((void **)&part, sizeof(double) * 2 * (size_t)s.c * pieces, st);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return (int)e;
  }
  const unsigned tiles = (unsigned)((s.c + kTile - 1) / kTile), gy = pieces < kMaxGridY ? pieces : kMaxGridY;
  (void)cudaGetLastError();
  k_chan_partials_nhwc<Rule><<<dim3(tiles, gy), gwk::kRedThreads, 0, st>>>(rule, s.c, s.count, pieces, vec, part);
  int r = launched();
  if (r == 0) r = gwkd::chan_finish(part, s.c, pieces, sums, st);
  e = cudaFreeAsync(part, st);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return r != 0 ? r : (int)e;
}

template <class T>
int bn_sums_t(const struct gw_op_desc *d, const void *x, double *sums, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  if (s.c == 0) return 0;
  const gwk::SumsRule<T> rule{(const T *)x};
  return chan_reduce_nhwc(s, rule, s.c % 4 == 0 && quad_aligned<T>(x), sums, st);
}

template <class T>
int bn_bwd_sums_t(const struct gw_op_desc *d, const void *x, const void *ym, const void *dy, const float *mean,
                  const float *rstd, double *sums, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  if (s.c == 0) return 0;
  const gwk::BwdSumsRule<T> rule{(const T *)x, (const T *)dy, (const T *)ym, mean, rstd};
  return chan_reduce_nhwc(s, rule, s.c % 4 == 0 && quad_aligned<T>(x) && quad_aligned<T>(dy) && quad_aligned<T>(ym),
                          sums, st);
}

/* ---- weights for NHWC convolutions: [k][c][rs] <-> [k][rs][c], converted ----------------------------------- */
template <class D, class S>
__global__ void __launch_bounds__(kThreads)
    k_cast_perm(uint32_t total, FastDiv cd, FastDiv rsd, bool to_last, const S *src, D *dst) {
  for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (uint64_t)gridDim.x * blockDim.x)
    dst[e] = narrow<D>(widen(src[gwk::perm_source((uint32_t)e, cd, rsd, to_last)]));
}

template <class D, class S>
int launch_cast_perm(size_t total, size_t c, size_t rs, bool to_last, void *dst, const void *src, cudaStream_t st) {
  (void)cudaGetLastError();
  k_cast_perm<D, S><<<grid_for(total), kThreads, 0, st>>>((uint32_t)total, gwk::fastdiv_make((uint32_t)c),
                                                          gwk::fastdiv_make((uint32_t)rs), to_last, (const S *)src,
                                                          (D *)dst);
  return launched();
}

} /* namespace */

int gwkd::nhwc_bn_sums(const struct gw_op_desc *d, int act, const void *x, double *sums, cudaStream_t st) {
  return BY_ACT(act, bn_sums_t, d, x, sums, st);
}

int gwkd::nhwc_bn_bwd_sums(const struct gw_op_desc *d, int act, const void *x, const void *ym, const void *dy,
                           const float *mean, const float *rstd, double *sums, cudaStream_t st) {
  return BY_ACT(act, bn_bwd_sums_t, d, x, ym, dy, mean, rstd, sums, st);
}

extern "C" int gw__cu_cast_perm(int k, int c, int rs, int to_last, int dst_dtype, void *dst, int src_dtype,
                                const void *src, void *stream) {
  if (k < 0 || c < 0 || rs < 0) return (int)cudaErrorInvalidValue;
  const size_t total = (size_t)k * (size_t)c * (size_t)rs;
  if (total == 0) return 0;
  if (total >= kIndexLimit) return (int)cudaErrorInvalidValue; /* 32-bit indices (fast division) */
  const bool last = to_last != 0;
  cudaStream_t st = (cudaStream_t)stream;
  if (dst == src) return (int)cudaErrorInvalidValue; /* a transpose needs two buffers */
  if (src_dtype == GW_FLOAT32 && dst_dtype == GW_FLOAT32)
    return launch_cast_perm<float, float>(total, (size_t)c, (size_t)rs, last, dst, src, st);
  if (src_dtype == GW_FLOAT32 && dst_dtype == GW_BFLOAT16)
    return launch_cast_perm<gwk::bf16, float>(total, (size_t)c, (size_t)rs, last, dst, src, st);
  if (src_dtype == GW_FLOAT32 && dst_dtype == GW_FLOAT16)
    return launch_cast_perm<gwk::f16, float>(total, (size_t)c, (size_t)rs, last, dst, src, st);
  if (dst_dtype == GW_FLOAT32 && src_dtype == GW_BFLOAT16)
    return launch_cast_perm<float, gwk::bf16>(total, (size_t)c, (size_t)rs, last, dst, src, st);
  if (dst_dtype == GW_FLOAT32 && src_dtype == GW_FLOAT16)
    return launch_cast_perm<float, gwk::f16>(total, (size_t)c, (size_t)rs, last, dst, src, st);
  return (int)cudaErrorInvalidValue;
}
