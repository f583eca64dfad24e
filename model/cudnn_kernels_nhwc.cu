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
 * its first call with the lanes and groups (run_planned).  Before (until
 * 2026-12), thread t kept
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

#include <mutex>
#include <type_traits>
#include <vector>

#include "cudnn_kernels_dev.cuh"

namespace {

/* ---- batch norm's per-channel sums ------------------------------------------------------------------- */
/* Blocks (tile of 32 L channels, piece, group), grid.y striding over the
 * pieces, grid.z the groups (the plan's; 1 where L = 2);
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
   * is large (by default), so always one group there (a run-time count of
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

/* ---- how a shape's sums run: a plan (the bits are the same for every one) ----------------------------
 * Lanes: two channels per lane (one 4-byte load per row of bf16, 8 of
 * float) where every row's pair is one aligned load (c even, the tensors
 * aligned for two elements; not float's backward, whose three tensors'
 * batches spill registers at two), else one (64 bytes per warp and row of
 * bf16: whole sectors still, twice the blocks, fewer registers).  Groups:
 * blocks per piece with one channel per lane (nhwc_group_depth; always 1 with
 * two).  Variant: gwk::kNhwcVariants.
 *
 * Each shape's first call, outside a stream capture, times every plan on
 * its stream (cuda events, three rounds, the first a warm-up, each plan's
 * better time of the other two) and keeps the fastest per (device, kind,
 * dtype, c, count, pairs possible), like cudnn.benchmark; the call then runs
 * it once more.  Each plan's sums in its warm-up are compared with the rules'
 * plan's on the same inputs: one that differs is said and never chosen (the
 * variants were written for the same bits; a kernel first run on a new GPU
 * cannot cost a run its results).  The rules below give the default plan (variant 0), what
 * ran before (until 2026-12-04): two channels where the 64-channel tiles
 * still make two waves of blocks (2 per SM: __launch_bounds__), else one
 * channel with the fewest of 1, 2, 4, 8 blocks per piece that make two blocks
 * per SM (the 8 warps of one block per SM cannot keep enough loads in
 * flight; ResNet-50's later layers, c 512-2048 at 28x28 to 7x7 over a batch
 * of 256, make only 32-224 blocks of 32 channels).  The knobs (tests, A/B
 * runs), read at every call, each force their part and turn the timing off:
 * GW_BN_NHWC_PAIRS=1/0 two channels per lane always / never where possible,
 * GW_BN_NHWC_GROUPS=1/2/4/8 the blocks per piece, GW_BN_NHWC_KERNEL=0/1/2
 * the variant; any other value is auto.  With GW_CUDNN_KERNEL_TIMES set, each
 * choice is printed with the times, and the time spent choosing is left out
 * of the call site's (gw__cu_tune_seconds). */
struct NhwcPlan {
  int lanes, groups, variant;
};

int env_digit(const char *name, const char *allowed) {
  const char *v = getenv(name);
  if (v && v[0] && !v[1] && strchr(allowed, v[0])) return v[0] - '0';
  return -1; /* unset or auto */
}
struct Knobs {
  int pairs, groups, kernel; /* -1: auto */
  bool any() const { return pairs >= 0 || groups >= 0 || kernel >= 0; }
};
Knobs knobs(void) {
  return Knobs{env_digit("GW_BN_NHWC_PAIRS", "01"), env_digit("GW_BN_NHWC_GROUPS", "1248"),
               env_digit("GW_BN_NHWC_KERNEL", "012")};
}

uint32_t nhwc_pieces(const ChanShape &s) { return (s.count + gwk::kPiece - 1) / gwk::kPiece; }
unsigned nhwc_tiles(const ChanShape &s, int lanes) { return (unsigned)((s.c + 32 * lanes - 1) / (32 * lanes)); }

NhwcPlan plan_default(const ChanShape &s, bool pairs_possible, const Knobs &k) {
  const int sms0 = sm_count();
  const uint64_t sms = (uint64_t)(sms0 > 0 ? sms0 : 128), pieces = nhwc_pieces(s);
  NhwcPlan p;
  const bool big = (uint64_t)nhwc_tiles(s, 2) * pieces >= 4 * sms;
  p.lanes = pairs_possible && (k.pairs >= 0 ? k.pairs == 1 : big) ? 2 : 1;
  p.groups = 1;
  if (p.lanes == 1 && k.groups > 0) {
    p.groups = k.groups;
  } else if (p.lanes == 1) {
    const uint64_t blocks = (uint64_t)nhwc_tiles(s, 1) * pieces;
    while (p.groups < gwk::kNhwcMaxGroups && blocks * (uint64_t)p.groups < 2 * sms) p.groups *= 2;
  }
  p.variant = k.kernel >= 0 ? k.kernel : 0;
  return p;
}

/* A reduction's grid with L channels per lane: tiles x pieces x groups. */
struct NhwcGrid {
  uint32_t pieces;
  unsigned tiles, gy;
  int groups;
};
template <int L>
NhwcGrid nhwc_grid(const ChanShape &s, int groups) {
  NhwcGrid g;
  g.pieces = nhwc_pieces(s);
  g.tiles = nhwc_tiles(s, L);
  g.gy = g.pieces < kMaxGridY ? g.pieces : kMaxGridY;
  g.groups = L == 1 ? groups : 1;
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

template <class F>
int by_variant(int v, F &&f) {
  static_assert(gwk::kNhwcVariants == 3, "one case per variant");
  switch (v) {
  case 1: return f(std::integral_constant<int, 1>{});
  case 2: return f(std::integral_constant<int, 2>{});
  default: return f(std::integral_constant<int, 0>{});
  }
}

/* launch(std::integral_constant<int, L>, std::integral_constant<int, V>,
 * groups) runs the plan's kernels; Pairs: whether two lanes are instantiated. */
template <bool Pairs, class F>
int launch_plan(const NhwcPlan &p, const F &launch) {
  return by_variant(p.variant, [&](auto vc) {
    if constexpr (Pairs) {
      if (p.lanes == 2) return launch(std::integral_constant<int, 2>{}, vc, 1);
    }
    return launch(std::integral_constant<int, 1>{}, vc, p.groups);
  });
}

struct TuneKey {
  int dev, kind, dtype, pairs, c; /* kind: 0 bn_sums, 1 bn_bwd_sums, 2 the same with the ReLU mask */
  uint32_t count;
  bool operator==(const TuneKey &o) const {
    return dev == o.dev && kind == o.kind && dtype == o.dtype && pairs == o.pairs && c == o.c && count == o.count;
  }
};
std::mutex tune_mu;
std::vector<std::pair<TuneKey, NhwcPlan>> tuned; /* at most kTuneMax shapes; past that, the default plan */
constexpr size_t kTuneMax = 4096;
thread_local long long tune_ns = 0; /* this thread's: GW_CUDNN_KERNEL_TIMES subtracts it from its own calls */
constexpr int kMaxPlans = gwk::kNhwcVariants * 5; /* one lane with 1, 2, 4, 8 groups, two lanes */

long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Whether two plans' sums are the same: bit for bit, or both NaN (a NaN's
 * payload is not part of the contract: widened on the bits, variant 2 may
 * keep another than the conversion instruction's). */
bool same_sums(const double *a, const double *b, size_t n, size_t *at) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(double)) != 0 && !(a[i] != a[i] && b[i] != b[i])) {
      *at = i;
      return false;
    }
  return true;
}

/* The sums the last launch wrote into sums (nvals doubles), on the host. */
int fetch_sums(double *host, const double *sums, size_t nvals, cudaStream_t st) {
  int r = (int)cudaMemcpyAsync(host, sums, nvals * sizeof(double), cudaMemcpyDeviceToHost, st);
  if (r == 0) r = (int)cudaStreamSynchronize(st);
  return r;
}

/* Times the n plans (ms[i]: plan i's better time of two after a warm-up);
 * a plan other than idef (the rules') that fails to launch is left out
 * (infinite time: a GPU without the shared memory it takes), and so is one
 * whose sums (nvals doubles at sums) in its warm-up differ from the rules'
 * plan's on these same inputs (every plan has the same bits by design: one
 * that differs is a defect, said on stderr with the first channel that
 * differs, never chosen); any other failure of a launch, an
 * event or a copy is returned as is. */
template <bool Pairs, class F>
int time_plans(const NhwcPlan *plans, int n, int idef, const F &launch, cudaStream_t st, double *sums, size_t nvals,
               float *ms) {
  cudaEvent_t ev[2] = {nullptr, nullptr};
  double *ref = (double *)malloc(2 * nvals * sizeof(double)), *got = ref ? ref + nvals : nullptr;
  cudaError_t e = ref ? cudaEventCreate(&ev[0]) : cudaErrorMemoryAllocation;
  if (e == cudaSuccess) e = cudaEventCreate(&ev[1]);
  int r = (int)e;
  bool out[kMaxPlans] = {};
  for (int i = 0; i < n; i++) ms[i] = INFINITY;
  /* the reference: the rules' plan's sums */
  if (r == 0) r = launch_plan<Pairs>(plans[idef], launch);
  if (r == 0) r = fetch_sums(ref, sums, nvals, st);
  for (int round = 0; r == 0 && round < 3; round++)
    for (int i = 0; r == 0 && i < n; i++) {
      if (out[i]) continue;
      float t = 0;
      r = (int)cudaEventRecord(ev[0], st);
      if (r == 0) r = launch_plan<Pairs>(plans[i], launch);
      if (r != 0 && i != idef && cudaPeekAtLastError() == cudaSuccess) {
        ms[i] = INFINITY, out[i] = true, r = 0; /* refused, the context fine (not sticky): not a plan for this GPU */
        continue;
      }
      if (r == 0) r = (int)cudaEventRecord(ev[1], st);
      if (r == 0) r = (int)cudaEventSynchronize(ev[1]);
      if (r == 0) r = (int)cudaEventElapsedTime(&t, ev[0], ev[1]);
      if (r == 0 && round > 0 && t < ms[i]) ms[i] = t;
      size_t at = 0;
      if (r == 0 && round == 0 && i != idef && (r = fetch_sums(got, sums, nvals, st)) == 0 &&
          !same_sums(ref, got, nvals, &at)) {
        const size_t c = nvals / 2;
        fprintf(stderr, "gradwire cudnn: bn sums NHWC plan L%d G%d v%d gave other sums than the rules' plan L%d G%d v%d "
                "on the same inputs (%zu channels, channel %zu's %s: %a, the rules' %a): one of the two is a defect (the "
                "rules' plan, where every other plan differs alike); this one is left out of the timing\n",
                plans[i].lanes, plans[i].groups, plans[i].variant, plans[idef].lanes, plans[idef].groups,
                plans[idef].variant, c, at % c, at < c ? "first sum" : "second sum", got[at], ref[at]);
        ms[i] = INFINITY, out[i] = true;
      }
    }
  for (cudaEvent_t x : ev)
    if (x) (void)cudaEventDestroy(x);
  free(ref);
  return r;
}

void print_choice(const TuneKey &key, const NhwcPlan *plans, int n, const float *ms, int def, int best) {
  static const char *const kinds[] = {"bn_sums", "bn_bwd_sums", "bn_bwd_sums+relu"};
  static const char *const types[] = {"float32", "bfloat16", "float16"};
  float per_v[gwk::kNhwcVariants];
  for (float &t : per_v) t = INFINITY;
  for (int i = 0; i < n; i++)
    if (ms[i] < per_v[plans[i].variant]) per_v[plans[i].variant] = ms[i];
  fprintf(stderr, "bn sums NHWC tuned: %s %s c %d count %u | default L%d G%d v%d %.1f us | chosen L%d G%d v%d %.1f us |"
          " best per variant", kinds[key.kind], types[key.dtype], key.c, key.count, plans[def].lanes, plans[def].groups,
          plans[def].variant, (double)ms[def] * 1e3, plans[best].lanes, plans[best].groups, plans[best].variant,
          (double)ms[best] * 1e3);
  for (int v = 0; v < gwk::kNhwcVariants; v++) fprintf(stderr, " v%d %.1f", v, (double)per_v[v] * 1e3);
  fputs(" us\n", stderr);
}

/* Runs the shape's plan: forced by the knobs, kept from its first call, or
 * timed now (key: all but the device set). */
template <bool Pairs, class F>
int run_planned(TuneKey key, const ChanShape &s, bool pairs_possible, const F &launch, double *sums, cudaStream_t st) {
  const Knobs k = knobs();
  const NhwcPlan def = plan_default(s, Pairs && pairs_possible, k);
  if (k.any()) return launch_plan<Pairs>(def, launch);
  if (cudaGetDevice(&key.dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return launch_plan<Pairs>(def, launch);
  }
  {
    std::lock_guard<std::mutex> lk(tune_mu);
    for (const auto &t : tuned)
      if (t.first == key) return launch_plan<Pairs>(t.second, launch);
    if (tuned.size() >= kTuneMax) return launch_plan<Pairs>(def, launch);
  }
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError(); /* no synchronizing inside a capture */
    return launch_plan<Pairs>(def, launch);
  }
  const long long t0 = now_ns();
  NhwcPlan plans[kMaxPlans];
  int n = 0, idef = 0;
  for (int v = 0; v < gwk::kNhwcVariants; v++) {
    for (int g = 1; g <= gwk::kNhwcMaxGroups; g *= 2) plans[n++] = NhwcPlan{1, g, v};
    if (Pairs && pairs_possible) plans[n++] = NhwcPlan{2, 1, v};
  }
  for (int i = 0; i < n; i++)
    if (plans[i].lanes == def.lanes && plans[i].groups == def.groups && plans[i].variant == def.variant) idef = i;
  float ms[kMaxPlans];
  const int r = time_plans<Pairs>(plans, n, idef, launch, st, sums, 2 * (size_t)s.c, ms);
  int best = idef; /* the default unless another is faster */
  if (r != 0) { /* an event or the rules' plan failed: if not sticky, the rules' plan as without timing */
    (void)cudaGetLastError();
    if (cudaPeekAtLastError() != cudaSuccess) {
      tune_ns += now_ns() - t0;
      return r;
    }
  } else {
    for (int i = 0; i < n; i++)
      if (ms[i] < ms[best]) best = i;
  }
  {
    std::lock_guard<std::mutex> lk(tune_mu);
    tuned.push_back({key, plans[best]});
  }
  const char *kt = getenv("GW_CUDNN_KERNEL_TIMES");
  if (r == 0 && kt && *kt && strcmp(kt, "0") != 0) print_choice(key, plans, n, ms, idef, best);
  tune_ns += now_ns() - t0;
  return launch_plan<Pairs>(plans[best], launch);
}

template <class T>
constexpr int dtype_tag() { return std::is_same<T, float>::value ? 0 : std::is_same<T, gwk::bf16>::value ? 1 : 2; }

template <class T>
int bn_sums_t(const struct gw_op_desc *d, const void *x, double *sums, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  if (s.c == 0) return 0;
  if (nhwc_pieces(s) == 0) return gwkd::chan_finish(nullptr, s.c, 0, 1, sums, st); /* no values: every sum is 0 */
  const bool pairs = elems_aligned<2, T>(x) && s.c % 2 == 0;
  auto launch = [&](auto lc, auto vc, int groups) {
    constexpr int L = decltype(lc)::value, V = decltype(vc)::value;
    gwk::SumsLeaf<T, L, gwk::nhwc_sums_batch<T, L, V>(), gwk::nhwc_direct<V>()> leaf{};
    leaf.x = (const T *)x, leaf.c = (size_t)s.c;
    return chan_reduce_nhwc<L, V>(s, nhwc_grid<L>(s, groups), leaf, NoPrep{}, sums, st);
  };
  return run_planned<true>(TuneKey{0, 0, dtype_tag<T>(), pairs, s.c, s.count}, s, pairs, launch, sums, st);
}

/* Pairs for the 16-bit types: float's spill registers here (three tensors'
 * batches): one per lane.  (float16 joined bf16 once its widening became the
 * hardware's conversion: 128 registers, no spills, ptxas -v on sm_80/sm_90.) */
template <class T>
int bn_bwd_sums_t(const struct gw_op_desc *d, const void *x, const void *ym, const void *dy, const float *mean,
                  const float *rstd, double *sums, cudaStream_t st) {
  ChanShape s;
  if (int e = nchw_ok(d, &s)) return e;
  if (s.c == 0) return 0;
  if (nhwc_pieces(s) == 0) return gwkd::chan_finish(nullptr, s.c, 0, 1, sums, st);
  constexpr bool kPairs = sizeof(T) == 2;
  const bool pairs = kPairs && s.c % 2 == 0 && elems_aligned<2, T>(x) && elems_aligned<2, T>(dy) &&
                     (!ym || elems_aligned<2, T>(ym));
  const MeanRstdPrep prep{mean, rstd};
  auto launch = [&](auto lc, auto vc, int groups) {
    constexpr int L = decltype(lc)::value, V = decltype(vc)::value;
    gwk::BwdSumsLeaf<T, L, gwk::nhwc_bwd_batch<L, V>(), gwk::nhwc_direct<V>()> leaf{};
    leaf.x = (const T *)x, leaf.dy = (const T *)dy, leaf.ym = (const T *)ym, leaf.c = (size_t)s.c;
    return chan_reduce_nhwc<L, V>(s, nhwc_grid<L>(s, groups), leaf, prep, sums, st);
  };
  return run_planned<kPairs>(TuneKey{0, ym ? 2 : 1, dtype_tag<T>(), pairs, s.c, s.count}, s, pairs, launch, sums, st);
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

extern "C" double gw__cu_tune_seconds(void) { return (double)tune_ns * 1e-9; }

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
