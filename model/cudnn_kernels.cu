/* cudnn_kernels.cu - the cudnn backend's own CUDA kernels and their C launchers
 * (cudnn_kernels.h): batch norm, ReLU, add, max and global average pooling,
 * the fully connected bias, softmax cross-entropy.  The arithmetic lives in
 * cudnn_kernels_math.cuh (__host__ __device__, tested on the host); this file
 * is the parallel structure around it.  Not the backend itself
 * (backend_cudnn.c checks shapes and calls these).
 *
 * Determinism: no floating-point atomics anywhere, and every reduction has a
 * shape fixed by the tensor's shape alone, never by the device or the grid:
 *   - per channel (bn_sums, bn_bwd_sums): the count = n * h * w values of a
 *     channel are split into pieces of gwk::kPiece (8192) values; one block of
 *     gwk::kRedThreads (256) threads per (piece, channel) adds its piece in
 *     double (each thread a fixed set of quads, then a pairwise tree) and writes
 *     the partial; a second kernel, one block per channel, adds the channel's
 *     partials (thread t: partials t, t + 256, ..., then the tree).  BN over
 *     [256, 64, 112, 112] makes 392 x 64 = 25088 blocks: the whole device is busy;
 *   - per plane (avgpool): one warp per plane, lanes strided, a shuffle tree;
 *   - per row (loss): one block per row, then one block for the mean;
 *   - per column (bias_grad): 8 threads per column, each a fixed set of rows,
 *     then their 8 sums in order.
 * Element-wise kernels are grid-stride loops over quads (per channel) or octets
 * (flat), vector loads and stores when the addresses allow, the same arithmetic
 * either way.
 *
 * Activations are float, bf16 or f16 (act = GW_FLOAT32, GW_BFLOAT16 or
 * GW_FLOAT16): every kernel that touches them is a template over the element
 * type (float, gwk::bf16, gwk::f16),
 * instantiated for both, and the launchers pick the instance once per call;
 * nothing branches per element.  Loads widen to float (gwk::widen), stores
 * round once (gwk::narrow), the arithmetic between is the float version's, so
 * a bf16 result is the float path's result on the widened inputs, rounded.
 * Vectors: a quad is a float4 or 8 bytes of bf16 (uint2), an octet two float4
 * or 16 bytes of bf16 (uint4).
 *
 * Scratch (the per-channel partials, 2 * c * pieces doubles: 400 KB for the
 * largest ResNet-50 BN at batch 256): taken with cudaMallocFromPoolAsync on the
 * caller's stream right before the two kernels and given back with cudaFreeAsync
 * right after them, so it is stream-ordered: any number of threads and streams
 * may call at once, and under CUDA graph capture it becomes the graph's own
 * allocation node.  It comes from a private memory pool per device (made on
 * first use under a mutex, never destroyed) whose release threshold keeps its
 * memory (a few MB at most) instead of handing it back to the driver at every
 * synchronization, as the default pool's threshold of 0 would; the default pool
 * is left as it is for the rest of the process (and used instead where a
 * private pool cannot be made).  The device is the current one
 * (cudaGetDevice), which must be the stream's, as for any launch.
 *
 * Index limits: per-sample and per-channel indices are 32-bit (fast division):
 * n * h * w, c * h * w and c * p * q must be below 2^31 (ResNet-50 at batch 256:
 * 3.2M and 0.8M); larger shapes return cudaErrorInvalidValue.
 *
 * Must not be built with -use_fast_math (the math header's rounding). */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cudnn_kernels_dev.cuh"

namespace {
using gwcu::kMaxDevCache;             /* devices whose pools are kept */

/* ---- scratch: a private stream-ordered pool per device ----------------------------------------------- */
pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
cudaMemPool_t pools[kMaxDevCache];
bool pool_failed[kMaxDevCache]; /* no private pool there: the default one */

/* The private pool of device dev, made on first use; NULL where none can be made. */
cudaMemPool_t pool_of(int dev) {
  if (dev < 0 || dev >= kMaxDevCache) return nullptr;
  pthread_mutex_lock(&pool_mu);
  cudaMemPool_t pool = pools[dev];
  if (!pool && !pool_failed[dev]) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaError_t e = cudaMemPoolCreate(&pool, &props);
    if (e == cudaSuccess) {
      uint64_t keep = UINT64_MAX; /* never trim: the pool holds a few MB at most */
      e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      if (e != cudaSuccess) (void)cudaMemPoolDestroy(pool);
    }
    if (e == cudaSuccess) {
      pools[dev] = pool;
    } else {
      (void)cudaGetLastError();
      pool = nullptr;
      pool_failed[dev] = true;
    }
  }
  pthread_mutex_unlock(&pool_mu);
  return pool;
}

cudaError_t pool_alloc(void **p, size_t bytes, cudaStream_t st) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  cudaMemPool_t pool = pool_of(dev);
  return pool ? cudaMallocFromPoolAsync(p, bytes, pool, st) : cudaMallocAsync(p, bytes, st);
}

/* ---- per-channel reductions ---------------------------------------------------------------------------
 * Pass 1: block (piece, channel) -> part[ch * pieces + piece] and
 * part[(c + ch) * pieces + piece].  Pass 2: block ch -> out[ch], out[c + ch]. */
template <class Acc>
__global__ void __launch_bounds__(gwk::kRedThreads)
    k_chan_partials(Acc proto, int c, uint32_t count, FastDiv hwd, uint32_t pieces, bool vec, double *part) {
  __shared__ double sa[gwk::kRedThreads], sb[gwk::kRedThreads];
  const uint32_t piece = blockIdx.x;
  const uint32_t j0 = piece * gwk::kPiece, j1 = count - j0 < gwk::kPiece ? count : j0 + gwk::kPiece;
  const size_t hw = hwd.d, sample_stride = (size_t)c * hw;
  for (int ch = blockIdx.y; ch < c; ch += gridDim.y) {
    Acc acc = proto;
    acc.begin(ch);
    gwk::chan_thread(acc, j0, j1, (int)threadIdx.x, hwd, (size_t)ch * hw, sample_stride, vec);
    block_sum2<gwk::kRedThreads>(acc.s, acc.s2, sa, sb);
    if (threadIdx.x == 0) {
      part[(size_t)ch * pieces + piece] = acc.s;
      part[((size_t)c + ch) * pieces + piece] = acc.s2;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(gwk::kRedThreads)
    k_chan_finish(const double *part, int c, uint32_t pieces, int groups, double *out) {
  __shared__ double sa[gwk::kRedThreads], sb[gwk::kRedThreads];
  const size_t per = (size_t)pieces * (size_t)groups; /* groups: the NHWC sums' blocks per piece, else 1 */
  for (int ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const double *p1 = part + (size_t)ch * per, *p2 = part + ((size_t)c + ch) * per;
    double a = 0, b = 0;
    for (uint32_t i = threadIdx.x; i < pieces; i += gwk::kRedThreads)
      a += gwk::nhwc_group_fold(p1 + (size_t)i * groups, groups),
          b += gwk::nhwc_group_fold(p2 + (size_t)i * groups, groups);
    block_sum2<gwk::kRedThreads>(a, b, sa, sb);
    if (threadIdx.x == 0) out[ch] = a, out[c + ch] = b;
    __syncthreads();
  }
}

/* The accumulators of the two reductions, with what they read per channel. */
template <class T>
struct SumsAccDev : gwk::SumsAcc<T> {
  __device__ void begin(int) { this->s = 0, this->s2 = 0; }
};
template <class T>
struct BwdSumsAccDev : gwk::BwdSumsAcc<T> {
  const float *mean_p, *rstd_p;
  __device__ void begin(int ch) { this->mean = mean_p[ch], this->rstd = rstd_p[ch], this->s = 0, this->s2 = 0; }
};

template <class Acc>
int chan_reduce(const ChanShape &s, const Acc &proto, bool vec, double *sums, cudaStream_t st) {
  const uint32_t pieces = (s.count + gwk::kPiece - 1) / gwk::kPiece;
  const int cy = s.c < kMaxGridY ? s.c : kMaxGridY;
  (void)cudaGetLastError();
  if (pieces == 0) { /* no values: every sum is 0 */
    k_chan_finish<<<s.c, gwk::kRedThreads, 0, st>>>(nullptr, s.c, 0, 1, sums);
    return launched();
  }
  double *part = nullptr;
  cudaError_t e = pool_alloc((void **)&part, sizeof(double) * 2 * (size_t)s.c * pieces, st);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return (int)e;
  }
  k_chan_partials<Acc><<<dim3(pieces, cy), gwk::kRedThreads, 0, st>>>(proto, s.c, s.count,
                                                                      gwk::fastdiv_make(s.hw ? s.hw : 1), pieces,
                                                                      vec, part);
  k_chan_finish<<<s.c, gwk::kRedThreads, 0, st>>>(part, s.c, pieces, 1, sums);
  e = cudaGetLastError();
  const cudaError_t f = cudaFreeAsync(part, st);
  if (f != cudaSuccess) (void)cudaGetLastError();
  return (int)(e != cudaSuccess ? e : f);
}

/* ---- flat element-wise kernels (relu, add, cast) ---------------------------------------------------- */
struct ReluOp {
  static constexpr bool kBinary = false; /* reads a only */
  __device__ float operator()(float a, float) const { return gwk::relu(a); }
};
struct ReluBwdOp {
  static constexpr bool kBinary = true;
  __device__ float operator()(float y, float dy) const { return gwk::relu_bwd(y, dy); }
};
struct AddOp {
  static constexpr bool kBinary = true;
  __device__ float operator()(float a, float b) const { return gwk::add_rn(a, b); }
};

/* out[i] = f(a[i], b[i]) over n values (b unread by a unary f).  Octets
 * (gwk::load8 / store8) when vec (a, b, out 16-byte aligned), then the tail
 * one by one.  Each thread reads its values before writing them, so out may
 * alias a or b. */
template <class T, class F>
__global__ void __launch_bounds__(kThreads) k_flat(F f, size_t n, const T *a, const T *b, T *out, bool vec) {
  const size_t stride = (size_t)gridDim.x * blockDim.x, noct = vec ? n / 8 : 0;
  const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (size_t o = t0; o < noct; o += stride) {
    const gwk::Vals<8> x = gwk::load8(a + 8 * o);
    gwk::Vals<8> y = x;
    if (F::kBinary) y = gwk::load8(b + 8 * o);
    gwk::Vals<8> r;
    for (int l = 0; l < 8; l++) r.v[l] = f(x.v[l], y.v[l]);
    gwk::store8(out + 8 * o, r);
  }
  for (size_t i = 8 * noct + t0; i < n; i += stride) {
    const float x = widen(a[i]);
    out[i] = narrow<T>(f(x, F::kBinary ? widen(b[i]) : x));
  }
}

template <class T, class F>
int launch_flat(size_t n, const void *a, const void *b, void *out, cudaStream_t st) {
  if (n == 0) return 0;
  const bool vec = aligned16(a) && aligned16(b) && aligned16(out);
  (void)cudaGetLastError();
  k_flat<T, F><<<grid_for(vec ? (n + 7) / 8 : n), kThreads, 0, st>>>(F{}, n, (const T *)a, (const T *)b, (T *)out,
                                                                     vec);
  return launched();
}
template <class T>
int relu_fwd_t(size_t n, const void *x, void *y, cudaStream_t st) {
  return launch_flat<T, ReluOp>(n, x, x, y, st);
}
template <class T>
int relu_bwd_t(size_t n, const void *y, const void *dy, void *dx, cudaStream_t st) {
  return launch_flat<T, ReluBwdOp>(n, y, dy, dx, st);
}
template <class T>
int add_t(size_t n, const void *a, const void *b, void *y, cudaStream_t st) {
  return launch_flat<T, AddOp>(n, a, b, y, st);
}

/* dst[i] = src[i] converted (widened, then rounded once to D), octets when vec. */
template <class D, class S>
__global__ void __launch_bounds__(kThreads) k_cast(size_t n, const S *src, D *dst, bool vec) {
  const size_t stride = (size_t)gridDim.x * blockDim.x, noct = vec ? n / 8 : 0;
  const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (size_t o = t0; o < noct; o += stride) gwk::store8(dst + 8 * o, gwk::load8(src + 8 * o));
  for (size_t i = 8 * noct + t0; i < n; i += stride) dst[i] = narrow<D>(widen(src[i]));
}

template <class D, class S>
int launch_cast(size_t n, void *dst, const void *src, cudaStream_t st) {
  const bool vec = aligned16(dst) && aligned16(src);
  (void)cudaGetLastError();
  k_cast<D, S><<<grid_for(vec ? (n + 7) / 8 : n), kThreads, 0, st>>>(n, (const S *)src, (D *)dst, vec);
  return launched();
}

/* The size of an element of dtype, 0 for a dtype cast does not take. */
size_t act_size(int dtype) { return dtype == GW_FLOAT32 ? 4 : dtype == GW_BFLOAT16 || dtype == GW_FLOAT16 ? 2 : 0; }

/* ---- batch norm per channel ------------------------------------------------------------------------------- */
__global__ void k_bn_stats(int c, const double *sums, double count, double eps, double momentum, float *mean,
                           float *rstd, float *running_mean, float *running_var) {
  for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x) {
    const gwk::BnStats r = gwk::bn_stats_from_sums(sums[ch], sums[c + ch], count, eps);
    mean[ch] = (float)r.mean;
    rstd[ch] = (float)r.rstd;
    if (running_mean)
      gwk::bn_running_update(r.mean, r.var, count, momentum, &running_mean[ch], &running_var[ch]);
  }
}

__global__ void k_bn_param_grads(int c, const double *sums, float *dgamma, float *dbeta) {
  for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x) {
    dgamma[ch] = (float)sums[c + ch];
    dbeta[ch] = (float)sums[ch];
  }
}

/* ---- pooling ------------------------------------------------------------------------------------------------- */
/* Where a plane starts and how far apart its elements are: NCHW's plane (smp, ch)
 * is contiguous; NHWC's starts at channel ch of the sample's first row and
 * steps c. */
struct Plane {
  size_t base, cs;
};
template <bool kNhwc>
__device__ __forceinline__ Plane plane_of(int smp, uint32_t ch, int c, size_t plane_elems) {
  if (kNhwc) return Plane{(size_t)smp * plane_elems * (size_t)c + ch, (size_t)c};
  return Plane{((size_t)smp * c + ch) * plane_elems, 1};
}

/* grid.y: samples; x: the c * p * q outputs of one sample in the tensor's
 * order (NCHW: o = ch * pq + r; NHWC: o = r * c + ch, r = oh * q + ow); `cd` is
 * pq (NCHW) or c (NHWC). */
template <class T, bool kNhwc>
__global__ void __launch_bounds__(kThreads)
    k_maxpool_fwd(const T *x, T *y, int32_t *argmax, int n, int c, int h, int w, int kernel, int stride, int pad,
                  uint32_t len, FastDiv cd, FastDiv qd) {
  const uint32_t gs = gridDim.x * blockDim.x;
  for (int smp = blockIdx.y; smp < n; smp += gridDim.y)
    for (uint64_t o64 = blockIdx.x * blockDim.x + threadIdx.x; o64 < len; o64 += gs) { /* 64-bit: no wrap */
      const uint32_t o = (uint32_t)o64, a = gwk::fastdiv(cd, o), b = o - a * cd.d;
      const uint32_t ch = kNhwc ? b : a, r = kNhwc ? a : b, oh = gwk::fastdiv(qd, r), ow = r - oh * qd.d;
      const Plane pl = plane_of<kNhwc>(smp, ch, c, (size_t)h * w);
      int32_t am;
      const float v = gwk::maxpool_window(x + pl.base, h, w, (int)oh, (int)ow, kernel, stride, pad, &am, pl.cs);
      const size_t oi = (size_t)smp * len + o;
      y[oi] = narrow<T>(v); /* a value of x: exact (a NaN made quiet) */
      argmax[oi] = am;
    }
}

/* grid.y: samples; x: the c * h * w inputs of one sample (each dx written
 * once), in the tensor's order as above; `cd` is hw (NCHW) or c (NHWC). */
template <class T, bool kNhwc>
__global__ void __launch_bounds__(kThreads)
    k_maxpool_bwd(const T *dy, const int32_t *argmax, T *dx, int n, int c, int p, int q, int kernel, FastDiv sd,
                  int pad, uint32_t len, FastDiv cd, FastDiv wd) {
  const uint32_t gs = gridDim.x * blockDim.x;
  for (int smp = blockIdx.y; smp < n; smp += gridDim.y)
    for (uint64_t i64 = blockIdx.x * blockDim.x + threadIdx.x; i64 < len; i64 += gs) { /* 64-bit: no wrap */
      const uint32_t i = (uint32_t)i64, a = gwk::fastdiv(cd, i), b = i - a * cd.d;
      const uint32_t ch = kNhwc ? b : a, r = kNhwc ? a : b, ih = gwk::fastdiv(wd, r), iw = r - ih * wd.d;
      const Plane pl = plane_of<kNhwc>(smp, ch, c, (size_t)p * q);
      dx[(size_t)smp * len + i] = narrow<T>(gwk::maxpool_gather(dy + pl.base, argmax + pl.base, p, q, (int)ih,
                                                                (int)iw, (int)wd.d, kernel, sd, pad, pl.cs));
    }
}

/* One warp per plane of hw values (planes in [n, c] order: y's). */
template <class T, bool kNhwc>
__global__ void __launch_bounds__(kThreads) k_avgpool_fwd(const T *x, T *y, size_t planes, int c, uint32_t hw) {
  const int lane = threadIdx.x % gwk::kWarp;
  const size_t warps = (size_t)gridDim.x * (kThreads / gwk::kWarp);
  for (size_t pl = (size_t)blockIdx.x * (kThreads / gwk::kWarp) + threadIdx.x / gwk::kWarp; pl < planes;
       pl += warps) {
    const size_t smp = pl / (size_t)c;
    const Plane at = plane_of<kNhwc>((int)smp, (uint32_t)(pl - smp * (size_t)c), c, hw);
    double s = gwk::avgpool_lane_sum(x + at.base, hw, lane, at.cs);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) y[pl] = narrow<T>(gwk::avgpool_finish(s, hw));
  }
}

/* ---- fully connected bias ------------------------------------------------------------------------------------ */
template <class T>
__global__ void __launch_bounds__(kThreads) k_bias_add(size_t total, int k, const float *b, T *y) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
    y[i] = narrow<T>(gwk::add_rn(widen(y[i]), b[i % (size_t)k]));
}

/* 32 columns per block, 8 row groups per column (gwk::bias_grad_group), the
 * groups added in order by the first row of threads. */
template <class T>
__global__ void __launch_bounds__(gwk::kBiasCols * gwk::kBiasGroups)
    k_bias_grad(int n, int k, const T *dy, float *db) {
  __shared__ double sh[gwk::kBiasGroups][gwk::kBiasCols];
  const int tx = threadIdx.x % gwk::kBiasCols, ty = threadIdx.x / gwk::kBiasCols;
  for (int j0 = blockIdx.x * gwk::kBiasCols; j0 < k; j0 += gridDim.x * gwk::kBiasCols) {
    const int j = j0 + tx;
    sh[ty][tx] = j < k ? gwk::bias_grad_group(dy, n, k, j, ty) : 0.0;
    __syncthreads();
    if (ty == 0 && j < k) {
      double s = 0;
      for (int g = 0; g < gwk::kBiasGroups; g++) s += sh[g][tx];
      db[j] = (float)s;
    }
    __syncthreads();
  }
}

/* ---- softmax cross-entropy ------------------------------------------------------------------------------------ */
template <class T>
__global__ void __launch_bounds__(kLossThreads)
    k_loss_rows(const T *logits, const int32_t *labels, int n, int k, double s, double scale, float *row_loss,
                T *dlogits, int *bad) {
  __shared__ float smax[kLossThreads];
  __shared__ double sa[kLossThreads], sb[kLossThreads];
  __shared__ double s_lse;
  const int t = threadIdx.x;
  for (int row = blockIdx.x; row < n; row += gridDim.x) {
    const int label = labels[row];
    if (label < 0 || label >= k) { /* the whole block takes this branch: no barrier is split */
      if (t == 0) row_loss[row] = NAN, atomicMin(bad, row); /* integer: the first bad row, whatever the order */
      continue;
    }
    const T *z = logits + (size_t)row * k;
    float m = gwk::loss_thread_max(z, k, t, kLossThreads);
    smax[t] = m;
    __syncthreads();
    for (int o = kLossThreads / 2; o > 0; o >>= 1) {
      if (t < o) smax[t] = smax[t + o] > smax[t] ? smax[t + o] : smax[t];
      __syncthreads();
    }
    const float mx = smax[0];
    double se, zs;
    gwk::loss_thread_sums(z, k, t, kLossThreads, mx, &se, &zs);
    block_sum2<kLossThreads>(se, zs, sa, sb);
    if (t == 0) {
      const double lse = gwk::loss_lse(mx, se);
      row_loss[row] = (float)gwk::loss_row_value(lse, widen(z[label]), zs, s, k);
      s_lse = lse;
    }
    __syncthreads();
    const double lse = s_lse;
    T *g = dlogits + (size_t)row * k;
    for (int j = t; j < k; j += kLossThreads) g[j] = narrow<T>(gwk::loss_grad(widen(z[j]), lse, j == label, s, k, n, scale));
    __syncthreads(); /* smax, sa, sb, s_lse are reused by the next row */
  }
}

/* *loss = the mean of row_loss [n]: one block, thread t adds rows t, t + B, ...,
 * then the tree (n = 0 gives 0 / 0 = NaN, the mean of nothing, as the cpu backend). */
__global__ void __launch_bounds__(kLossThreads) k_loss_mean(const float *row_loss, int n, float *loss) {
  __shared__ double sa[kLossThreads], sb[kLossThreads];
  double a = 0, b = 0;
  for (int i = threadIdx.x; i < n; i += kLossThreads) a += (double)row_loss[i];
  block_sum2<kLossThreads>(a, b, sa, sb);
  if (threadIdx.x == 0) *loss = (float)(a / (double)n);
}

/* ---- the launchers, per element type ---------------------------------------------------------------------- */
template <class T>
int bn_sums_t(const struct gw_op_desc *d, const void *x, double *sums, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  if (s.c == 0) return 0;
  SumsAccDev<T> acc{};
  acc.x = (const T *)x;
  return chan_reduce(s, acc, s.hw % 4 == 0 && quad_aligned<T>(x), sums, st);
}

template <class T>
int bn_fwd_apply_t(const struct gw_op_desc *d, bool nhwc, const void *x, const void *z, int relu_on,
                   const float *gamma, const float *beta, const float *mean, const float *rstd, void *y,
                   cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  const BnAffineOp<T, TrainParams> op = {(const T *)x, (const T *)z, (T *)y, relu_on != 0,
                                         TrainParams{gamma, beta, mean, rstd}};
  return launch_bn_elem(s, op, quad_aligned<T>(x) && quad_aligned<T>(y) && quad_aligned<T>(z), nhwc, st);
}

template <class T>
int bn_fwd_infer_t(const struct gw_op_desc *d, bool nhwc, const void *x, const void *z, int relu_on,
                   const float *gamma, const float *beta, const float *running_mean, const float *running_var,
                   void *y, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  const BnAffineOp<T, InferParams> op = {(const T *)x, (const T *)z, (T *)y, relu_on != 0,
                                         InferParams{gamma, beta, running_mean, running_var, (double)d->eps}};
  return launch_bn_elem(s, op, quad_aligned<T>(x) && quad_aligned<T>(y) && quad_aligned<T>(z), nhwc, st);
}

template <class T>
int bn_bwd_sums_t(const struct gw_op_desc *d, const void *x, const void *ym, const void *dy, const float *mean,
                  const float *rstd, double *sums, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  if (s.c == 0) return 0;
  BwdSumsAccDev<T> acc{};
  acc.x = (const T *)x, acc.dy = (const T *)dy, acc.ym = (const T *)ym, acc.mean_p = mean, acc.rstd_p = rstd;
  return chan_reduce(s, acc, s.hw % 4 == 0 && quad_aligned<T>(x) && quad_aligned<T>(dy) && quad_aligned<T>(ym), sums,
                     st);
}

template <class T>
int bn_bwd_apply_t(const struct gw_op_desc *d, bool nhwc, const void *x, const void *ym, const void *dy, const float *gamma,
                   const float *mean, const float *rstd, const double *sums, double count, void *dx, void *dz,
                   cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  const BnBwdApplyOp<T> op = {(const T *)x, (const T *)dy, (const T *)ym, gamma, mean, rstd, sums, (T *)dx, (T *)dz,
                              s.c, count};
  return launch_bn_elem(s, op,
                        quad_aligned<T>(x) && quad_aligned<T>(dy) && quad_aligned<T>(dx) && quad_aligned<T>(ym) &&
                            quad_aligned<T>(dz),
                        nhwc, st);
}

/* The window checks of both max pool directions: 0, or an error. */
int maxpool_ok(const struct gw_op_desc *d, ChanShape *s) {
  if (int e = nchw_ok(d, s)) return e;
  if (d->p < 0 || d->q < 0 || d->kernel < 1 || d->stride < 1 || d->pad < 0) return (int)cudaErrorInvalidValue;
  if ((uint64_t)d->p * (uint64_t)d->q * (uint64_t)d->c >= kIndexLimit) return (int)cudaErrorInvalidValue;
  /* the window arithmetic in int (ih + pad, oh * stride) */
  if ((uint64_t)d->h + 2 * (uint64_t)d->pad >= kIndexLimit || (uint64_t)d->w + 2 * (uint64_t)d->pad >= kIndexLimit)
    return (int)cudaErrorInvalidValue;
  return 0;
}

template <class T>
int maxpool_fwd_t(const struct gw_op_desc *d, bool nhwc, const void *x, void *y, int32_t *argmax, cudaStream_t st) {
  ChanShape s;
  if (int e = maxpool_ok(d, &s)) return e;
  const uint32_t pq = (uint32_t)d->p * (uint32_t)d->q, len = pq * (uint32_t)d->c;
  if (d->n == 0 || len == 0) return 0;
  const dim3 grid((len + kThreads - 1) / kThreads, d->n < kMaxGridY ? (unsigned)d->n : (unsigned)kMaxGridY);
  const FastDiv qd = gwk::fastdiv_make((uint32_t)d->q);
  (void)cudaGetLastError();
  if (nhwc)
    k_maxpool_fwd<T, true><<<grid, kThreads, 0, st>>>((const T *)x, (T *)y, argmax, d->n, d->c, d->h, d->w, d->kernel,
                                                       d->stride, d->pad, len, gwk::fastdiv_make((uint32_t)d->c), qd);
  else
    k_maxpool_fwd<T, false><<<grid, kThreads, 0, st>>>((const T *)x, (T *)y, argmax, d->n, d->c, d->h, d->w,
                                                        d->kernel, d->stride, d->pad, len, gwk::fastdiv_make(pq), qd);
  return launched();
}

template <class T>
int maxpool_bwd_t(const struct gw_op_desc *d, bool nhwc, const void *dy, const int32_t *argmax, void *dx,
                  cudaStream_t st) {
  ChanShape s;
  if (int e = maxpool_ok(d, &s)) return e;
  const uint32_t len = (uint32_t)s.c * s.hw;
  if (s.n == 0 || len == 0) return 0;
  const dim3 grid((len + kThreads - 1) / kThreads, s.n < kMaxGridY ? (unsigned)s.n : (unsigned)kMaxGridY);
  const FastDiv cd = gwk::fastdiv_make(nhwc ? (uint32_t)s.c : s.hw), wd = gwk::fastdiv_make((uint32_t)d->w);
  const FastDiv sd = gwk::fastdiv_make((uint32_t)d->stride);
  (void)cudaGetLastError();
  if (nhwc)
    k_maxpool_bwd<T, true><<<grid, kThreads, 0, st>>>((const T *)dy, argmax, (T *)dx, d->n, d->c, d->p, d->q,
                                                       d->kernel, sd, d->pad, len, cd, wd);
  else
    k_maxpool_bwd<T, false><<<grid, kThreads, 0, st>>>((const T *)dy, argmax, (T *)dx, d->n, d->c, d->p, d->q,
                                                        d->kernel, sd, d->pad, len, cd, wd);
  return launched();
}

template <class T>
int avgpool_fwd_t(const struct gw_op_desc *d, bool nhwc, const void *x, void *y, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  const size_t planes = (size_t)s.n * (size_t)s.c;
  if (planes == 0) return 0;
  const size_t per_block = kThreads / gwk::kWarp;
  const unsigned blocks = grid_for((planes + per_block - 1) / per_block * kThreads);
  (void)cudaGetLastError();
  if (nhwc) k_avgpool_fwd<T, true><<<blocks, kThreads, 0, st>>>((const T *)x, (T *)y, planes, s.c, s.hw);
  else k_avgpool_fwd<T, false><<<blocks, kThreads, 0, st>>>((const T *)x, (T *)y, planes, s.c, s.hw);
  return launched();
}

template <class T>
int avgpool_bwd_t(const struct gw_op_desc *d, bool nhwc, const void *dy, void *dx, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  const AvgpoolBwdOp<T> op = {(const T *)dy, (T *)dx, s.c, s.hw};
  return launch_chan_elem(s, op, (nhwc ? s.c : s.hw) % 4 == 0 && quad_aligned<T>(dx), st, nhwc);
}

template <class T>
int bias_add_t(int n, int k, const float *b, void *y, cudaStream_t st) {
  if (n < 0 || k < 0) return (int)cudaErrorInvalidValue;
  const size_t total = (size_t)n * (size_t)k;
  if (total == 0) return 0;
  (void)cudaGetLastError();
  k_bias_add<T><<<grid_for(total), kThreads, 0, st>>>(total, k, b, (T *)y);
  return launched();
}

template <class T>
int bias_grad_t(int n, int k, const void *dy, float *db, cudaStream_t st) {
  if (n < 0 || k < 0) return (int)cudaErrorInvalidValue;
  if (k == 0) return 0;
  (void)cudaGetLastError(); /* n == 0: db = 0, the sum of nothing */
  k_bias_grad<T><<<(k + gwk::kBiasCols - 1) / gwk::kBiasCols, gwk::kBiasCols * gwk::kBiasGroups, 0, st>>>(
      n, k, (const T *)dy, db);
  return launched();
}

template <class T>
int loss_fwd_bwd_t(const struct gw_op_desc *d, const void *logits, const int32_t *labels, float grad_scale,
                   float *row_loss, float *loss, int *bad, void *dlogits, cudaStream_t st) {
  if (d->n < 0 || d->k < 1) return (int)cudaErrorInvalidValue;
  (void)cudaGetLastError();
  const cudaError_t e = cudaMemsetAsync(bad, 0x7f, sizeof *bad, st); /* 0x7f7f7f7f: no bad row */
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return (int)e;
  }
  if (d->n > 0)
    k_loss_rows<T><<<d->n, kLossThreads, 0, st>>>((const T *)logits, labels, d->n, d->k, (double)d->label_smoothing,
                                                  (double)grad_scale, row_loss, (T *)dlogits, bad);
  k_loss_mean<<<1, kLossThreads, 0, st>>>(row_loss, d->n, loss);
  return launched();
}

} /* namespace */

cudaError_t gwkd::scratch_alloc(void **p, size_t bytes, cudaStream_t st) { return pool_alloc(p, bytes, st); }

int gwkd::chan_finish(const double *part, int c, uint32_t pieces, int groups, double *sums, cudaStream_t st) {
  (void)cudaGetLastError();
  k_chan_finish<<<c, gwk::kRedThreads, 0, st>>>(part, c, pieces, groups, sums);
  return launched();
}

/* ---- the C launchers ---------------------------------------------------------------------------------------- */
extern "C" int gw__cu_bn_sums(const struct gw_op_desc *d, int act, int nhwc, const void *x, double *sums,
                              void *stream) {
  if (nhwc) return gwkd::nhwc_bn_sums(d, act, x, sums, (cudaStream_t)stream);
  return BY_ACT(act, bn_sums_t, d, x, sums, (cudaStream_t)stream);
}

extern "C" int gw__cu_bn_stats(const struct gw_op_desc *d, const double *sums, double count, float *mean,
                               float *rstd, float *running_mean, float *running_var, void *stream) {
  if (d->c <= 0) return d->c < 0 ? (int)cudaErrorInvalidValue : 0;
  (void)cudaGetLastError();
  k_bn_stats<<<(d->c + kThreads - 1) / kThreads, kThreads, 0, (cudaStream_t)stream>>>(
      d->c, sums, count, (double)d->eps, (double)d->momentum, mean, rstd, running_mean, running_var);
  return launched();
}

extern "C" int gw__cu_bn_fwd_apply(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *z,
                                   int relu, const float *gamma, const float *beta, const float *mean,
                                   const float *rstd, void *y, void *stream) {
  return BY_ACT(act, bn_fwd_apply_t, d, nhwc != 0, x, z, relu, gamma, beta, mean, rstd, y, (cudaStream_t)stream);
}

extern "C" int gw__cu_bn_fwd_infer(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *z,
                                   int relu, const float *gamma, const float *beta, const float *running_mean,
                                   const float *running_var, void *y, void *stream) {
  return BY_ACT(act, bn_fwd_infer_t, d, nhwc != 0, x, z, relu, gamma, beta, running_mean, running_var, y,
                (cudaStream_t)stream);
}

extern "C" int gw__cu_bn_bwd_sums(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *ym,
                                  const void *dy, const float *mean, const float *rstd, double *sums, void *stream) {
  if (nhwc) return gwkd::nhwc_bn_bwd_sums(d, act, x, ym, dy, mean, rstd, sums, (cudaStream_t)stream);
  return BY_ACT(act, bn_bwd_sums_t, d, x, ym, dy, mean, rstd, sums, (cudaStream_t)stream);
}

extern "C" int gw__cu_bn_bwd_apply(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *ym,
                                   const void *dy, const float *gamma, const float *mean, const float *rstd,
                                   const double *sums, double count, void *dx, void *dz, void *stream) {
  return BY_ACT(act, bn_bwd_apply_t, d, nhwc != 0, x, ym, dy, gamma, mean, rstd, sums, count, dx, dz,
                (cudaStream_t)stream);
}

extern "C" int gw__cu_bn_param_grads(const struct gw_op_desc *d, const double *sums, float *dgamma, float *dbeta,
                                     void *stream) {
  if (d->c <= 0) return d->c < 0 ? (int)cudaErrorInvalidValue : 0;
  (void)cudaGetLastError();
  k_bn_param_grads<<<(d->c + kThreads - 1) / kThreads, kThreads, 0, (cudaStream_t)stream>>>(d->c, sums, dgamma,
                                                                                            dbeta);
  return launched();
}

extern "C" int gw__cu_relu_fwd(size_t n, int act, const void *x, void *y, void *stream) {
  return BY_ACT(act, relu_fwd_t, n, x, y, (cudaStream_t)stream);
}

extern "C" int gw__cu_relu_bwd(size_t n, int act, const void *y, const void *dy, void *dx, void *stream) {
  return BY_ACT(act, relu_bwd_t, n, y, dy, dx, (cudaStream_t)stream);
}

extern "C" int gw__cu_add(size_t n, int act, const void *a, const void *b, void *y, void *stream) {
  return BY_ACT(act, add_t, n, a, b, y, (cudaStream_t)stream);
}

extern "C" int gw__cu_maxpool_fwd(const struct gw_op_desc *d, int act, int nhwc, const void *x, void *y,
                                  int32_t *argmax, void *stream) {
  return BY_ACT(act, maxpool_fwd_t, d, nhwc != 0, x, y, argmax, (cudaStream_t)stream);
}

extern "C" int gw__cu_maxpool_bwd(const struct gw_op_desc *d, int act, int nhwc, const void *dy,
                                  const int32_t *argmax, void *dx, void *stream) {
  return BY_ACT(act, maxpool_bwd_t, d, nhwc != 0, dy, argmax, dx, (cudaStream_t)stream);
}

extern "C" int gw__cu_avgpool_fwd(const struct gw_op_desc *d, int act, int nhwc, const void *x, void *y,
                                  void *stream) {
  return BY_ACT(act, avgpool_fwd_t, d, nhwc != 0, x, y, (cudaStream_t)stream);
}

extern "C" int gw__cu_avgpool_bwd(const struct gw_op_desc *d, int act, int nhwc, const void *dy, void *dx,
                                  void *stream) {
  return BY_ACT(act, avgpool_bwd_t, d, nhwc != 0, dy, dx, (cudaStream_t)stream);
}

extern "C" int gw__cu_bias_add(int n, int k, int act, const float *b, void *y, void *stream) {
  return BY_ACT(act, bias_add_t, n, k, b, y, (cudaStream_t)stream);
}

extern "C" int gw__cu_bias_grad(int n, int k, int act, const void *dy, float *db, void *stream) {
  return BY_ACT(act, bias_grad_t, n, k, dy, db, (cudaStream_t)stream);
}

extern "C" int gw__cu_loss_fwd_bwd(const struct gw_op_desc *d, int act, const void *logits, const int32_t *labels,
                                   float grad_scale, float *row_loss, float *loss, int *bad, void *dlogits,
                                   void *stream) {
  return BY_ACT(act, loss_fwd_bwd_t, d, logits, labels, grad_scale, row_loss, loss, bad, dlogits,
                (cudaStream_t)stream);
}

extern "C" int gw__cu_cast(size_t n, int dst_dtype, void *dst, int src_dtype, const void *src, void *stream) {
  const size_t dsz = act_size(dst_dtype), ssz = act_size(src_dtype);
  if (dsz == 0 || ssz == 0) return (int)cudaErrorInvalidValue;
  if (n == 0 || (dst_dtype == src_dtype && dst == src)) return 0;
  if (n > SIZE_MAX / 4) return (int)cudaErrorInvalidValue;
  /* any other overlap: refused (the kernel and cudaMemcpyAsync need disjoint buffers) */
  const uintptr_t d0 = (uintptr_t)dst, s0 = (uintptr_t)src;
  if (d0 < s0 + n * ssz && s0 < d0 + n * dsz) return (int)cudaErrorInvalidValue;
  cudaStream_t st = (cudaStream_t)stream;
  if (dst_dtype == src_dtype) {
    (void)cudaGetLastError();
    const cudaError_t e = cudaMemcpyAsync(dst, src, n * dsz, cudaMemcpyDeviceToDevice, st);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return (int)e;
  }
  if (dst_dtype == GW_FLOAT32) return src_dtype == GW_BFLOAT16 ? launch_cast<float, bf16>(n, dst, src, st)
                                                               : launch_cast<float, f16>(n, dst, src, st);
  if (src_dtype != GW_FLOAT32) return (int)cudaErrorInvalidValue; /* 16 bits to 16 bits: not needed */
  return dst_dtype == GW_BFLOAT16 ? launch_cast<bf16, float>(n, dst, src, st)
                                  : launch_cast<f16, float>(n, dst, src, st);
}
