/* cudnn_kernels_dev.cuh - what the cudnn backend's kernel files share
 * (cudnn_kernels.cu: NCHW and layout-free kernels, the C launchers;
 * cudnn_kernels_nhwc.cu: the channels-last ones): launch helpers, the block
 * reduction, the per-channel element-wise kernel (either layout) and its
 * operations, and the few host functions one file defines for the other.
 * Device code only (nvcc); everything but the gwkd declarations is local to
 * each file that includes it. */
#ifndef GW_MODEL_CUDNN_KERNELS_DEV_CUH
#define GW_MODEL_CUDNN_KERNELS_DEV_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cudnn_kernels.h"
#include "cudnn_kernels_math.cuh"
#include "dev_cache.cuh"

/* Defined in cudnn_kernels.cu. */
namespace gwkd {
/* Stream-ordered scratch from the backend's private pool of the current device
 * (cudnn_kernels.cu's header says why); freed with cudaFreeAsync on the same
 * stream after its last reader. */
cudaError_t scratch_alloc(void **p, size_t bytes, cudaStream_t st);
/* The per-channel reductions' second pass: sums[ch] and sums[c + ch] from the
 * partials part[ch * P + piece * groups + g] and part[(c + ch) * P + ...],
 * P = pieces * groups (groups: the NHWC sums' blocks per piece, else 1), each
 * piece's groups folded first (gwk::nhwc_group_fold). */
int chan_finish(const double *part, int c, uint32_t pieces, int groups, double *sums, cudaStream_t st);
}

/* Defined in cudnn_kernels_nhwc.cu: the channels-last forms of batch norm's
 * sums (cudnn_kernels.h's launchers' arguments, the same results). */
namespace gwkd {
int nhwc_bn_sums(const struct gw_op_desc *d, int act, const void *x, double *sums, cudaStream_t st);
int nhwc_bn_bwd_sums(const struct gw_op_desc *d, int act, const void *x, const void *ym, const void *dy,
                     const float *mean, const float *rstd, double *sums, cudaStream_t st);
}

namespace {

using gwk::bf16;
using gwk::f16;
using gwk::FastDiv;
using gwk::kLossThreads;
using gwk::narrow;
using gwk::widen;

constexpr int kThreads = 256;        /* element-wise and other blocks */
constexpr int kMaxGridY = 65535;     /* grid.y and grid.z limit */
constexpr uint32_t kIndexLimit = 1u << 31; /* the fast division's range */

/* ---- launch helpers ----------------------------------------------------------------------------- */
/* The SM count of the current device (0 when unknown). */
inline int sm_count(void) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return gwcu::sm_count(dev);
}

/* The most blocks a grid-stride loop gets: 8 resident blocks of kThreads per
 * SM, 4 waves (the results never depend on this). */
inline size_t grid_cap(void) {
  const int sms = sm_count();
  return (size_t)(sms > 0 ? sms : 128) * 32;
}

/* Blocks for a grid-stride loop over `work` items, one per thread. */
inline unsigned grid_for(size_t work) {
  size_t need = work / kThreads + (work % kThreads != 0);
  const size_t cap = grid_cap();
  if (need > cap) need = cap;
  return (unsigned)(need > 0 ? need : 1);
}

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
/* Aligned for a quad of T (gwk::load4 / store4): 16 bytes for float, 8 for bf16. */
/* Aligned for N adjacent elements of T in one load (N a power of two). */
template <int N, class T>
inline bool elems_aligned(const void *p) {
  return ((uintptr_t)p & (N * sizeof(T) - 1)) == 0;
}
template <class T>
inline bool quad_aligned(const void *p) {
  return elems_aligned<4, T>(p);
}

/* The launchers' instance for the activations' dtype: fn<float> or fn<bf16>
 * with the same arguments, or cudaErrorInvalidValue for any other act. */
#define BY_ACT(act, fn, ...)                                                       \
  ((act) == GW_FLOAT32    ? fn<float>(__VA_ARGS__)                                 \
   : (act) == GW_BFLOAT16 ? fn<bf16>(__VA_ARGS__)                                  \
   : (act) == GW_FLOAT16  ? fn<f16>(__VA_ARGS__)                                   \
                          : (int)cudaErrorInvalidValue)

/* Launch bookkeeping: clear an older error before launching, report this one. */
inline int launched(void) { return (int)cudaGetLastError(); }

/* ---- block reductions ------------------------------------------------------------------------------ */
/* The sums over a block of B threads of a and b, in gwk::tree_sum's pairing
 * (shared memory for the steps s >= 32, then shuffles); valid in thread 0.
 * sa, sb: B doubles of shared memory each; the caller syncs before reusing them. */
template <int B>
__device__ __forceinline__ void block_sum2(double &a, double &b, double *sa, double *sb) {
  static_assert(B >= 64 && (B & (B - 1)) == 0, "a power of two of at least two warps");
  const int t = threadIdx.x;
  sa[t] = a, sb[t] = b;
  __syncthreads();
#pragma unroll
  for (int s = B / 2; s >= 32; s >>= 1) {
    if (t < s) sa[t] += sa[t + s], sb[t] += sb[t + s];
    __syncthreads();
  }
  if (t < 32) {
    a = sa[t], b = sb[t];
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      a += __shfl_down_sync(0xffffffffu, a, s);
      b += __shfl_down_sync(0xffffffffu, b, s);
    }
  }
}

/* count values per channel, each channel's [n, hw] planes strided c * hw apart. */
struct ChanShape {
  int n, c;
  uint32_t hw, count;
};

/* Shape checks shared by the per-channel kernels (either layout): 0 when fine,
 * else an error. */
inline int nchw_ok(const struct gw_op_desc *d, ChanShape *s) {
  if (d->n < 0 || d->c < 0 || d->h < 0 || d->w < 0) return (int)cudaErrorInvalidValue;
  const uint64_t hw = (uint64_t)d->h * (uint64_t)d->w;
  if (hw * (uint64_t)d->n >= kIndexLimit || hw * (uint64_t)d->c >= kIndexLimit) return (int)cudaErrorInvalidValue;
  /* the launchers round c up to tiles of 64 channels in int arithmetic */
  if ((uint64_t)d->c + 256 >= kIndexLimit) return (int)cudaErrorInvalidValue;
  s->n = d->n, s->c = d->c, s->hw = (uint32_t)hw, s->count = (uint32_t)(hw * (uint64_t)d->n);
  return 0;
}

/* ---- per-channel element-wise kernels -------------------------------------------------------------------
 * grid.y walks the samples, grid.x the quads of one sample's c * hw values.
 * The channel of element i of a sample is i / hw (NCHW: `div` is hw) or
 * i % c (NHWC: `div` is c).  Op::params(sample, ch) gives what a channel
 * needs, Op::one applies it to one element and Op::quad to four adjacent ones
 * (vec: gwk::load4 / store4, every tensor aligned for a quad of its type;
 * NCHW needs hw % 4 == 0, where a quad lies in one plane and takes one P;
 * NHWC needs c % 4 == 0, where a quad spans 4 channels and takes 4).  quad
 * gets the lanes' P from a functor: Same (one P) or Lanes (one each). */
template <class P>
struct Same {
  const P &p;
  __device__ const P &operator()(int) const { return p; }
};
template <class P>
struct Lanes {
  const P *p;
  __device__ const P &operator()(int l) const { return p[l]; }
};

template <class Op, bool kNhwc>
__global__ void __launch_bounds__(kThreads) k_chan_elem(Op op, int n, uint32_t len, FastDiv div, bool vec) {
  typedef typename Op::P P;
  const uint32_t nquads = (len + 3) / 4, stride = gridDim.x * blockDim.x;
  for (int smp = blockIdx.y; smp < n; smp += gridDim.y) {
    const size_t base = (size_t)smp * len;
    for (uint32_t qd = blockIdx.x * blockDim.x + threadIdx.x; qd < nquads; qd += stride) {
      const uint32_t i = 4 * qd;
      if (vec && kNhwc) {
        const uint32_t ch0 = i - gwk::fastdiv(div, i) * div.d;
        P p[4];
#pragma unroll
        for (int l = 0; l < 4; l++) p[l] = op.params(smp, ch0 + (uint32_t)l);
        op.quad(base + i, Lanes<P>{p});
      } else if (vec) {
        const P p = op.params(smp, gwk::fastdiv(div, i));
        op.quad(base + i, Same<P>{p});
      } else {
        const uint32_t e1 = i + 4 < len ? i + 4 : len;
        uint32_t last = UINT32_MAX;
        P prm{};
        for (uint32_t e = i; e < e1; e++) {
          const uint32_t q = gwk::fastdiv(div, e), ch = kNhwc ? e - q * div.d : q;
          if (ch != last) prm = op.params(smp, ch), last = ch;
          op.one(base + e, prm);
        }
      }
    }
  }
}

template <class Op>
int launch_chan_elem(const ChanShape &s, const Op &op, bool vec, cudaStream_t st, bool nhwc = false) {
  const uint32_t len = (uint32_t)s.c * s.hw;
  if (s.n == 0 || len == 0) return 0;
  const unsigned gy = s.n < kMaxGridY ? (unsigned)s.n : (unsigned)kMaxGridY;
  /* the whole grid within the grid-stride cap, spread over the samples */
  const size_t per_sample = grid_cap() / gy;
  unsigned gx = grid_for((len + 3) / 4);
  if (gx > per_sample) gx = (unsigned)(per_sample > 0 ? per_sample : 1);
  (void)cudaGetLastError();
  if (nhwc)
    k_chan_elem<Op, true><<<dim3(gx, gy), kThreads, 0, st>>>(op, s.n, len, gwk::fastdiv_make((uint32_t)s.c), vec);
  else
    k_chan_elem<Op, false><<<dim3(gx, gy), kThreads, 0, st>>>(op, s.n, len, gwk::fastdiv_make(s.hw), vec);
  return launched();
}

/* An op whose params come from a table P [c] (Op::params(0, ch) computed once
 * per call: batch norm's do not depend on the sample), the same values: the
 * element-wise kernel would otherwise recompute them per quad (NCHW) or per
 * element (NHWC), and batch norm's hold double divisions and square roots
 * (slow on GPUs with little FP64). */
template <class Op>
struct Tabled {
  typedef typename Op::P P;
  Op op;
  const P *tab;
  __device__ P params(int, uint32_t ch) const { return tab[ch]; }
  __device__ void one(size_t i, const P &p) const { op.one(i, p); }
  template <class PF>
  __device__ void quad(size_t i, const PF &p) const {
    op.quad(i, p);
  }
};

/* NHWC, c % 4 == 0, every tensor aligned for quads, params independent of the
 * sample (Tabled): quads q0, q0 + stride, ... of the flat tensor, where the
 * grid (gwk::nhwc_fixed_blocks) makes every one of a thread's quads start at
 * the same channel, so its 4 parameter sets are read once; each element is
 * k_chan_elem's (Op::quad on the same index). */
template <class Op>
__global__ void __launch_bounds__(kThreads) k_bn_elem_nhwc(Op op, size_t nquads, uint32_t c) {
  typedef typename Op::P P;
  const size_t stride = (size_t)gridDim.x * blockDim.x, q0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (q0 >= nquads) return;
  const uint32_t ch0 = (uint32_t)((4 * q0) % c);
  P p[4];
#pragma unroll
  for (int l = 0; l < 4; l++) p[l] = op.params(0, ch0 + (uint32_t)l);
  for (size_t q = q0; q < nquads; q += stride) op.quad(4 * q, Lanes<P>{p});
}

template <class Op>
__global__ void __launch_bounds__(kThreads) k_chan_table(Op op, int c, typename Op::P *tab) {
  for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x)
    tab[ch] = op.params(0, (uint32_t)ch);
}

/* launch_chan_elem for batch norm's ops, through a table in stream-ordered
 * scratch; vec needs `aligned` and hw % 4 == 0 (NCHW) or c % 4 == 0 (NHWC,
 * where k_bn_elem_nhwc reads each thread's parameters once). */
template <class Op>
int launch_bn_elem(const ChanShape &s, const Op &op, bool aligned, bool nhwc, cudaStream_t st) {
  if (s.n == 0 || s.c == 0 || s.hw == 0) return 0;
  typename Op::P *tab = nullptr;
  cudaError_t e = gwkd::scratch_alloc((void **)&tab, sizeof *tab * (size_t)s.c, st);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return (int)e;
  }
  (void)cudaGetLastError();
  k_chan_table<Op><<<(s.c + kThreads - 1) / kThreads, kThreads, 0, st>>>(op, s.c, tab);
  int r = launched();
  const size_t nquads = (size_t)s.n * s.hw * (size_t)s.c / 4;
  const unsigned want = grid_for(nquads);
  const unsigned gx = nhwc && s.c % 4 == 0 ? gwk::nhwc_fixed_blocks((uint32_t)s.c, kThreads, want) : 0;
  /* (a c with few factors of 2 over a small tensor would round the grid far
   * past its work: the general kernel then) */
  if (r == 0 && nhwc && aligned && s.c % 4 == 0 && gx <= 2 * want + 2) {
    k_bn_elem_nhwc<Tabled<Op>><<<gx, kThreads, 0, st>>>(Tabled<Op>{op, tab}, nquads, (uint32_t)s.c);
    r = launched();
  } else if (r == 0) {
    r = launch_chan_elem(s, Tabled<Op>{op, tab}, aligned && (nhwc ? s.c : s.hw) % 4 == 0, st, nhwc);
  }
  e = cudaFreeAsync(tab, st);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return r != 0 ? r : (int)e;
}

/* y = bn(x) per channel, through the fused tail (z: the residual or NULL;
 * relu) when asked (backend.h bn_act_*): the channel's affine from the batch
 * statistics (Train) or the running ones (Infer). */
template <class T, class Params>
struct BnAffineOp {
  const T *x, *z;
  T *y;
  bool relu_on;
  Params prm;
  typedef gwk::BnAffine P;
  __device__ P params(int, uint32_t ch) const { return prm(ch); }
  __device__ void one(size_t i, const P &p) const {
    y[i] = gwk::bn_fwd_elem<T>(x[i], p, z != nullptr, z ? z[i] : T(), relu_on);
  }
  template <class PF>
  __device__ void quad(size_t i, const PF &p) const {
    gwk::Raw4<T> a, b = {}, o;
    a.load(x + i);
    if (z) b.load(z + i);
    for (int l = 0; l < 4; l++) o.v[l] = gwk::bn_fwd_elem<T>(a.v[l], p(l), z != nullptr, b.v[l], relu_on);
    o.store(y + i);
  }
};
struct TrainParams {
  const float *gamma, *beta, *mean, *rstd;
  __device__ gwk::BnAffine operator()(uint32_t ch) const {
    return gwk::bn_affine_train(gamma[ch], beta[ch], mean[ch], rstd[ch]);
  }
};
struct InferParams {
  const float *gamma, *beta, *rmean, *rvar;
  double eps;
  __device__ gwk::BnAffine operator()(uint32_t ch) const {
    return gwk::bn_affine_infer(gamma[ch], beta[ch], rmean[ch], rvar[ch], eps);
  }
};

/* dx from the channel's sums; with ym (a fused ReLU) dy masked by the fused
 * output first, and dz (not NULL) = the masked dy (the residual's gradient). */
template <class T>
struct BnBwdApplyOp {
  const T *x, *dy, *ym;
  const float *gamma, *mean, *rstd;
  const double *sums;
  T *dx, *dz;
  int c;
  double count;
  typedef gwk::BnBwd P;
  __device__ P params(int, uint32_t ch) const {
    return gwk::bn_bwd_channel(gamma[ch], mean[ch], rstd[ch], sums[ch], sums[c + ch], count);
  }
  __device__ void one(size_t i, const P &p) const {
    T g;
    dx[i] = gwk::bn_bwd_elem<T>(x[i], dy[i], ym != nullptr, ym ? ym[i] : T(), p, &g);
    if (dz) dz[i] = g;
  }
  template <class PF>
  __device__ void quad(size_t i, const PF &p) const {
    gwk::Raw4<T> a, g, m = {}, r, d;
    a.load(x + i);
    g.load(dy + i);
    if (ym) m.load(ym + i);
    for (int l = 0; l < 4; l++) r.v[l] = gwk::bn_bwd_elem<T>(a.v[l], g.v[l], ym != nullptr, m.v[l], p(l), &d.v[l]);
    if (dz) d.store(dz + i);
    r.store(dx + i);
  }
};

/* dx = dy / hw over the plane: the value is computed (in float) once per plane
 * and rounded to T at each store (the same bits each time). */
template <class T>
struct AvgpoolBwdOp {
  const T *dy;
  T *dx;
  int c;
  uint32_t hw;
  typedef float P;
  __device__ P params(int smp, uint32_t ch) const {
    return gwk::avgpool_bwd_value(widen(dy[(size_t)smp * c + ch]), hw);
  }
  __device__ void one(size_t i, const P &p) const { dx[i] = narrow<T>(p); }
  template <class PF>
  __device__ void quad(size_t i, const PF &p) const {
    gwk::Quad q;
    for (int l = 0; l < 4; l++) q.v[l] = p(l);
    gwk::store4(dx + i, q);
  }
};

} /* namespace */

#endif
