/* cudnn_kernels_nhwc.cu - the cudnn backend's channels-last (NHWC) kernels:
 * batch norm's per-channel sums and the weight transposes (OIHW <-> OHWI,
 * with the activations' dtype) that NHWC convolutions need.  Batch norm's
 * element-wise passes and the average pool's backward are
 * cudnn_kernels_dev.cuh's per-channel kernel in its NHWC form, and the pools
 * cudnn_kernels.cu's kernels with the elements c apart, all launched from
 * cudnn_kernels.cu.
 *
 * Every result has the NCHW kernels' bits (backend.h): each channel's values
 * are summed in the same order (into chan_thread's accumulators, joined by
 * tree_sum's additions), and every element is computed by the same function.
 *
 * The per-channel sums (cudnn_kernels_math.cuh says how the order stays
 * NCHW's): a block of kNhwcWarps warps per (tile of 32 L adjacent channels,
 * piece of kPiece values), grid.x the tiles, grid.y the pieces, grid.z the
 * piece's groups (G blocks share a piece in small grids); lane l of each
 * warp owns L adjacent channels (L = 2: one 4-byte load of bf16 per row, a
 * warp's 128 bytes coalesced), so no lane ever talks to another; each warp
 * walks its 32 / G of chan_thread's threads one after another, keeping
 * log2(32 / G) partial sums; shared memory joins the 8 warps.  Then the
 * partials as NCHW's, each piece's G first, in cudnn_kernels.cu's second
 * pass.  Three variants of the kernels (gwk::kNhwcVariants: where the tree's
 * partial sums wait, the batch, the widening), same bits, timed per shape on
 * its first call (run_tuned).  Before (until 2026-12), thread t kept
 * 8 channels' accumulators and read chan_thread's rows itself: 16 bytes of
 * bf16 per row, rows 4 apart between lanes, so every load took a sector of
 * its own and batch norm was 61% of the NHWC step on the H200.
 *
 * Index limits as NCHW's (n * h * w and c * h * w below 2^31). */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <math.h>
#include <stdio.h>
#include <time.h>

#include <atomic>
#include <mutex>
#include <type_traits>
#include <vector>

#include "cudnn_kernels_dev.cuh"

namespace {

/* ---- batch norm's per-channel sums ------------------------------------------------------------------- */
/* Blocks (tile of 32 L channels, piece, group), grid.y striding over the
 * pieces, grid.z the groups (nhwc_groups; 1 where L = 2);
 * Leaf is SumsLeaf or BwdSumsLeaf with its tensors set (for variant V: its
 * batch and widening), Prep sets a lane's per-channel constants (BwdSumsLeaf's
 * mean and rstd); variants 1 and 2 keep the tree's stack in shared memory
 * (40 KiB at L = 2, with ss 48: the static limit). */
template <int L, int V, class Leaf, class Prep>
__global__ void __launch_bounds__(gwk::kRedThreads, 2)
    k_chan_partials_nhwc(Leaf proto, Prep prep, int c, uint32_t count, uint32_t pieces, double *part) {
  constexpr bool kSmem = gwk::nhwc_smem_stack<V>();
  __shared__ double stk[kSmem ? gwk::kNhwcDepth * 2 * L * gwk::kRedThreads : 1];
  /* block g of the piece's groups; two channels per lane only where the grid
   * is large (pairs_ok), so always one group there (a run-time count of
   * leaves spilled the bf16 backward's registers) */
  const int groups = L == 1 ? (int)gridDim.z : 1, g = L == 1 ? (int)blockIdx.z : 0;
  static_assert(gwk::kNhwcWarps * 32 == gwk::kRedThreads, "a block's warps are its threads");
  constexpr int kTileCh = 32 * L;
  __shared__ double ss[gwk::kNhwcWarps][kTileCh], ss2[gwk::kNhwcWarps][kTileCh];
  const int w = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  const int ch0 = (int)blockIdx.x * kTileCh, mine = lane * L; /* the lane's first channel in the tile */
  const bool active = ch0 + mine < c; /* c % L == 0 when L > 1: a lane has all its channels or none */
  Leaf leaf = proto;
  leaf.ch = (uint32_t)(ch0 + mine);
  if (active) prep(leaf);
  for (uint32_t piece = blockIdx.y; piece < pieces; piece += gridDim.y) {
    const uint32_t j0 = piece * gwk::kPiece, j1 = count - j0 < gwk::kPiece ? count : j0 + gwk::kPiece;
    if (active) {
      gwk::PieceLeaf<Leaf> one{leaf, j0, j1};
      gwk::Sums2<L> v;
      if constexpr (kSmem) {
        gwk::SmemStack<L> sk{stk + threadIdx.x, gwk::kRedThreads};
        v = gwk::nhwc_warp_tree<L>(g + groups * w, one, groups, sk);
      } else {
        v = gwk::nhwc_warp_tree<L>(g + groups * w, one, groups);
      }
#pragma unroll
      for (int k = 0; k < L; k++) ss[w][mine + k] = v.s[k], ss2[w][mine + k] = v.s2[k];
    }
    __syncthreads();
    const int tc = (int)threadIdx.x; /* thread tc finishes channel ch0 + tc: tree_sum's last steps */
    if (tc < kTileCh && ch0 + tc < c) {
      double a[gwk::kNhwcWarps], b[gwk::kNhwcWarps];
#pragma unroll
      for (int i = 0; i < gwk::kNhwcWarps; i++) a[i] = ss[i][tc], b[i] = ss2[i][tc];
      const size_t at = (size_t)piece * (size_t)groups + (size_t)g, per = (size_t)pieces * (size_t)groups;
      part[(size_t)(ch0 + tc) * per + at] = gwk::tree_sum(a, gwk::kNhwcWarps);
      part[((size_t)c + ch0 + tc) * per + at] = gwk::tree_sum(b, gwk::kNhwcWarps);
    }
    __syncthreads();
  }
}

struct NoPrep {
  template <class Leaf>
  __device__ void operator()(Leaf &) const {}
};
struct MeanRstdPrep {
  const float *mean, *rstd;
  template <class Leaf>
  __device__ void operator()(Leaf &l) const { l.begin(mean, rstd); }
};

/* Two channels per lane (one 4-byte load per row of bf16, 8 of float) where
 * every row's pair is one aligned load (c even, the tensors aligned for two
 * elements) and the 64-channel tiles still make at least two waves of blocks
 * (2 per SM: __launch_bounds__); else one channel per lane (64 bytes per
 * warp and row of bf16: whole sectors still), twice the blocks, fewer
 * registers.  ResNet-50's later layers (c 512-2048 at 28x28 to 7x7 over a
 * batch of 256) make only 64-200 blocks of 64 channels.  The bits do not
 * depend on the choice. */
inline bool pairs_ok(const ChanShape &s, bool aligned) {
  if (!aligned || s.c % 2 != 0) return false;
  /* GW_BN_NHWC_PAIRS=1 / 0: always / never where possible (tests, A/B runs) */
  const char *force = getenv("GW_BN_NHWC_PAIRS");
  if (force && (force[0] == '0' || force[0] == '1') && !force[1]) return force[0] == '1';
  const uint64_t pieces = (s.count + gwk::kPiece - 1) / gwk::kPiece, tiles = ((uint64_t)s.c + 63) / 64;
  const int sms = sm_count();
  return tiles * pieces >= 4 * (uint64_t)(sms > 0 ? sms : 128);
}

/* Blocks per piece with one channel per lane (nhwc_group_depth): the fewest
 * of 1, 2, 4, 8 that make at least two blocks per SM (the 8 warps of one
 * block per SM cannot keep enough loads in flight), since ResNet-50's small
 * layers make 32-224 blocks of 32 channels ([256,512,7,7]: 16 tiles of 2
 * pieces).  The bits do not depend on it. */
inline int nhwc_groups(uint64_t blocks) {
  /* GW_BN_NHWC_GROUPS=1/2/4/8: always that many (tests, A/B runs) */
  const char *force = getenv("GW_BN_NHWC_GROUPS");
  if (force && (force[0] == '1' || force[0] == '2' || force[0] == '4' || force[0] == '8') && !force[1])
    return force[0] - '0';
  const int sms = sm_count();
  const uint64_t want = 2 * (uint64_t)(sms > 0 ? sms : 128);
  int g = 1;
  while (g < gwk::kNhwcMaxGroups && blocks * (uint64_t)g < want) g *= 2;
  return g;
}

/* A reduction's grid with L channels per lane: tiles x pieces x groups. */
struct NhwcGrid {
  uint32_t pieces;
  unsigned tiles, gy;
  int groups;
};
template <int L>
NhwcGrid nhwc_grid(const ChanShape &s) {
  NhwcGrid g;
  g.pieces = (s.count + gwk::kPiece - 1) / gwk::kPiece;
  g.tiles = (unsigned)((s.c + 32 * L - 1) / (32 * L));
  g.gy = g.pieces < kMaxGridY ? g.pieces : kMaxGridY;
  g.groups = L == 1 && g.pieces ? nhwc_groups((uint64_t)g.tiles * g.pieces) : 1;
  return g;
}

template <int L, int V, class Leaf, class Prep>
int chan_reduce_nhwc(const ChanShape &s, const NhwcGrid &grid, const Leaf &leaf, const Prep &prep, double *sums,
                     cudaStream_t st) {
  const uint32_t pieces = grid.pieces; /* > 0: the callers finish empty shapes */
  const unsigned tiles = grid.tiles, gy = grid.gy;
  const int groups = grid.groups;
  double *part = nullptr;
  cudaError_t e = gwkd::scratch_alloc((void **)&part, sizeof(double) * 2 * (size_t)s.c * pieces * (size_t)groups, st);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return (int)e;
  }
  (void)cudaGetLastError();
  k_chan_partials_nhwc<L, V, Leaf, Prep><<<dim3(tiles, gy, (unsigned)groups), gwk::kRedThreads, 0, st>>>(
      leaf, prep, s.c, s.count, pieces, part);
  int r = launched();
  if (r == 0) r = gwkd::chan_finish(part, s.c, pieces, groups, sums, st);
  e = cudaFreeAsync(part, st);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return r != 0 ? r : (int)e;
}

/* ---- which variant (gwk::kNhwcVariants: the same bits) ---------------------------------------------
 * GW_BN_NHWC_KERNEL=0/1/2 runs that one (tests, A/B runs); else each shape's
 * first call, outside a stream capture, runs every variant three times on
 * its stream, timed by events (the first round a warm-up), and the fastest
 * by its better time is kept for the shape, like cudnn.benchmark; the call
 * then runs it once more.  With GW_CUDNN_KERNEL_TIMES set, each choice is
 * printed with the times, and the time spent choosing is left out of the
 * call site's (gw__cu_tune_seconds). */
struct TuneKey {
  int dev, kind, dtype, lanes, groups, c; /* kind: 0 bn_sums, 1 bn_bwd_sums, 2 the same with the ReLU mask */
  uint32_t count;
  bool operator==(const TuneKey &o) const {
    return dev == o.dev && kind == o.kind && dtype == o.dtype && lanes == o.lanes && groups == o.groups &&
           c == o.c && count == o.count;
  }
};
std::mutex tune_mu;
std::vector<std::pair<TuneKey, int>> tuned; /* at most kTuneMax shapes; past that, untuned ones run variant 0 */
constexpr size_t kTuneMax = 4096;
std::atomic<long long> tune_ns{0};

int forced_variant(void) {
  const char *v = getenv("GW_BN_NHWC_KERNEL");
  if (v && v[0] >= '0' && v[0] < '0' + gwk::kNhwcVariants && !v[1]) return v[0] - '0';
  return -1;
}

long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

template <class F>
int by_variant(int v, F &&f) {
  static_assert(gwk::kNhwcVariants == 3, "one case per variant");
  switch (v) {
  case 1: return f(std::integral_constant<int, 1>{});
  case 2: return f(std::integral_constant<int, 2>{});
  default: return f(std::integral_constant<int, 0>{});
  }
}

/* Times run(v) for every variant (best of two after a warm-up), returns the
 * fastest in *best; a failed launch or event is returned as is. */
template <class F>
int tune_variants(const F &run, cudaStream_t st, float ms[gwk::kNhwcVariants], int *best) {
  cudaEvent_t ev[2] = {nullptr, nullptr};
  cudaError_t e = cudaEventCreate(&ev[0]);
  if (e == cudaSuccess) e = cudaEventCreate(&ev[1]);
  int r = (int)e;
  for (int v = 0; v < gwk::kNhwcVariants; v++) ms[v] = INFINITY;
  for (int round = 0; r == 0 && round < 3; round++)
    for (int v = 0; r == 0 && v < gwk::kNhwcVariants; v++) {
      float t = 0;
      r = (int)cudaEventRecord(ev[0], st);
      if (r == 0) r = by_variant(v, run);
      if (r == 0) r = (int)cudaEventRecord(ev[1], st);
      if (r == 0) r = (int)cudaEventSynchronize(ev[1]);
      if (r == 0) r = (int)cudaEventElapsedTime(&t, ev[0], ev[1]);
      if (r == 0 && round > 0 && t < ms[v]) ms[v] = t;
    }
  for (cudaEvent_t x : ev)
    if (x) (void)cudaEventDestroy(x);
  *best = 0;
  for (int v = 1; v < gwk::kNhwcVariants; v++)
    if (ms[v] < ms[*best]) *best = v;
  return r;
}

/* run(std::integral_constant<int, V>) launches variant V of the reduction
 * that key names. */
template <class F>
int run_tuned(TuneKey key, const F &run, cudaStream_t st) {
  int v = forced_variant();
  if (v >= 0) return by_variant(v, run);
  if (cudaGetDevice(&key.dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return by_variant(0, run);
  }
  {
    std::lock_guard<std::mutex> lk(tune_mu);
    for (const auto &t : tuned)
      if (t.first == key) return by_variant(t.second, run);
    if (tuned.size() >= kTuneMax) return by_variant(0, run);
  }
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError(); /* no synchronizing inside a capture: the default, untimed */
    return by_variant(0, run);
  }
  const long long t0 = now_ns();
  float ms[gwk::kNhwcVariants];
  int r = tune_variants(run, st, ms, &v);
  if (r != 0) return r;
  {
    std::lock_guard<std::mutex> lk(tune_mu);
    tuned.push_back({key, v});
  }
  const char *kt = getenv("GW_CUDNN_KERNEL_TIMES");
  if (kt && *kt && strcmp(kt, "0") != 0) {
    static const char *const kinds[] = {"bn_sums", "bn_bwd_sums", "bn_bwd_sums+relu"};
    static const char *const types[] = {"float32", "bfloat16", "float16"};
    fprintf(stderr, "bn sums NHWC variant %d chosen: %s %s c %d count %u, %d per lane, %d groups:", v,
            kinds[key.kind], types[key.dtype], key.c, key.count, key.lanes, key.groups);
    for (int i = 0; i < gwk::kNhwcVariants; i++) fprintf(stderr, " v%d %.1f us", i, (double)ms[i] * 1e3);
    fputc('\n', stderr);
  }
  tune_ns += now_ns() - t0;
  return by_variant(v, run);
}

template <class T>
constexpr int dtype_tag() { return std::is_same<T, float>::value ? 0 : std::is_same<T, gwk::bf16>::value ? 1 : 2; }

/* The reduction with L channels per lane: bn_sums' leaf, or bn_bwd_sums', in
 * the variant run_tuned picks. */
template <class T, int L>
int sums_nhwc(const ChanShape &s, const void *x, double *sums, cudaStream_t st) {
  const NhwcGrid grid = nhwc_grid<L>(s);
  if (grid.pieces == 0) return gwkd::chan_finish(nullptr, s.c, 0, 1, sums, st); /* no values: every sum is 0 */
  auto run = [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    gwk::SumsLeaf<T, L, gwk::nhwc_sums_batch<T, L, V>(), gwk::nhwc_direct<V>()> leaf{};
    leaf.x = (const T *)x, leaf.c = (size_t)s.c;
    return chan_reduce_nhwc<L, V>(s, grid, leaf, NoPrep{}, sums, st);
  };
  return run_tuned(TuneKey{0, 0, dtype_tag<T>(), L, grid.groups, s.c, s.count}, run, st);
}
template <class T, int L>
int bwd_sums_nhwc(const ChanShape &s, const void *x, const void *ym, const void *dy, const MeanRstdPrep &prep,
                  double *sums, cudaStream_t st) {
  const NhwcGrid grid = nhwc_grid<L>(s);
  if (grid.pieces == 0) return gwkd::chan_finish(nullptr, s.c, 0, 1, sums, st);
  auto run = [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    gwk::BwdSumsLeaf<T, L, gwk::nhwc_bwd_batch<L, V>(), gwk::nhwc_direct<V>()> leaf{};
    leaf.x = (const T *)x, leaf.dy = (const T *)dy, leaf.ym = (const T *)ym, leaf.c = (size_t)s.c;
    return chan_reduce_nhwc<L, V>(s, grid, leaf, prep, sums, st);
  };
  return run_tuned(TuneKey{0, ym ? 2 : 1, dtype_tag<T>(), L, grid.groups, s.c, s.count}, run, st);
}

template <class T>
int bn_sums_t(const struct gw_op_desc *d, const void *x, double *sums, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  if (s.c == 0) return 0;
  return pairs_ok(s, elems_aligned<2, T>(x)) ? sums_nhwc<T, 2>(s, x, sums, st) : sums_nhwc<T, 1>(s, x, sums, st);
}

template <class T>
int bn_bwd_sums_t(const struct gw_op_desc *d, const void *x, const void *ym, const void *dy, const float *mean,
                  const float *rstd, double *sums, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  if (s.c == 0) return 0;
  const MeanRstdPrep prep{mean, rstd};
  /* Pairs for the 16-bit types: float's spill registers here (three tensors'
   * batches): one per lane.  (float16 joined bf16 once its widening became the
   * hardware's conversion: 128 registers, no spills, ptxas -v on sm_80/sm_90.) */
  if constexpr (sizeof(T) == 2) {
    if (pairs_ok(s, elems_aligned<2, T>(x) && elems_aligned<2, T>(dy) && (!ym || elems_aligned<2, T>(ym))))
      return bwd_sums_nhwc<T, 2>(s, x, ym, dy, prep, sums, st);
  }
  return bwd_sums_nhwc<T, 1>(s, x, ym, dy, prep, sums, st);
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

template <class S>
__global__ void __launch_bounds__(kThreads) k_widen_f64(size_t n, const S *src, double *dst) {
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
    dst[e] = gwk::widen_d(src[e]);
}

template <class S>
int launch_widen_f64(size_t n, const void *src, double *dst, cudaStream_t st) {
  (void)cudaGetLastError();
  k_widen_f64<S><<<grid_for(n), kThreads, 0, st>>>(n, (const S *)src, dst);
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

extern "C" int gw__cu_widen_f64(size_t n, int src_dtype, const void *src, double *dst, void *stream) {
  if (n == 0) return 0;
  cudaStream_t st = (cudaStream_t)stream;
  if (src_dtype == GW_FLOAT32) return launch_widen_f64<float>(n, src, dst, st);
  if (src_dtype == GW_BFLOAT16) return launch_widen_f64<gwk::bf16>(n, src, dst, st);
  if (src_dtype == GW_FLOAT16) return launch_widen_f64<gwk::f16>(n, src, dst, st);
  return (int)cudaErrorInvalidValue;
}

extern "C" double gw__cu_tune_seconds(void) { return (double)tune_ns.load() * 1e-9; }

extern "C" int gw__cu_cast_perm(int k, int c, int rs, int to_last, int dst_dtype, void *dst, int src_dtype,
                                const void *src, void *stream) {
  if (k < 0 || c < 0 || rs < 0) return (int)cudaErrorInvalidValue;
  const size_t total = (size_t)k * (size_t)c * (size_t)rs;
  if (total == 0) return 0;
  if (total >= kIndexLimit) return (int)cudaErrorInvalidValue; /* 32-bit indices (fast division) */
  const bool last = to_last != 0;
  cudaStream_t st = (cudaStream_t)stream;
  /* a transpose needs two disjoint buffers (a partial overlap would race) */
  const size_t dsz = dst_dtype == GW_FLOAT32 ? 4 : 2, ssz = src_dtype == GW_FLOAT32 ? 4 : 2;
  const uintptr_t d0 = (uintptr_t)dst, s0 = (uintptr_t)src;
  if (d0 < s0 + total * ssz && s0 < d0 + total * dsz) return (int)cudaErrorInvalidValue;
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
