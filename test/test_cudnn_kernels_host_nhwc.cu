/* test_cudnn_kernels_host_nhwc.cu - part of the cudnn-kernels-host test: the
 * channels-last (NHWC) kernels' arithmetic replayed on the host against the
 * NCHW kernels' on the same values (transposed), bit for bit, as backend.h
 * promises:
 *   - batch norm's per-channel sums (k_chan_partials_nhwc: each warp's lanes
 *     walking their leaves with gwk::nhwc_warp_tree, the warps joined by
 *     tree_sum, the second pass) against replay_chan's NCHW ones, for
 *     SumsLeaf / SumsAcc and BwdSumsLeaf / BwdSumsAcc with and without the
 *     fused ReLU's mask, in each variant (gwk::kNhwcVariants: the tree's
 *     stack in registers or as shared memory holds it, the batches, the
 *     widening to double), one channel per lane with 1, 2, 4 and 8 blocks per
 *     piece (groups) and two with one, on values whose double sums depend on their order
 *     (exponents over 40 binades), channel counts that fill no tile (3, 5,
 *     12, 40, 70, 130) and shapes with several pieces; every element fetched
 *     once, each slot used once after its fetch, and each (virtual) warp's
 *     leaves its residue class of threads in tree order; the element-wise
 *     passes' grid that keeps a thread on one quad of channels;
 *   - max pool's window and gather with the elements c apart, average pool's
 *     lane sums likewise;
 *   - the weight transposes (perm_source) against the direct index formulas,
 *     and back again. */
#include "cudnn_host_common.cuh"

namespace {

using namespace gwt;

/* [n, c, hw] NCHW -> [n, hw, c]. */
template <class T>
std::vector<T> to_nhwc(const std::vector<T> &x, int n, int c, size_t hw) {
  std::vector<T> y(x.size());
  for (int s = 0; s < n; s++)
    for (int ch = 0; ch < c; ch++)
      for (size_t i = 0; i < hw; i++) y[((size_t)s * hw + i) * c + ch] = x[((size_t)s * c + ch) * hw + i];
  return y;
}

/* What k_chan_partials_nhwc + the second pass compute, replayed: per tile of
 * 32 L channels, piece and group (block g of the piece's groups), every
 * warp's lanes (gwk::nhwc_warp_tree over virtual warp g + groups w's leaves),
 * then each channel's tree_sum over the warps' values; the pieces as
 * replay_chan's (replay_chan_finish), each first folded over its groups.
 * prep(leaf) sets a lane's per-channel constants, as the kernel's Prep. */
template <int L, class Leaf, class Prep, bool Smem = false>
void replay_chan_nhwc(const Leaf &proto, const Prep &prep, int n, int c, uint32_t hw, std::vector<double> &out,
                      int groups = 1) {
  const uint32_t count = (uint32_t)n * hw, pieces = (count + kPiece - 1) / kPiece;
  const size_t per = (size_t)pieces * (size_t)groups;
  const int tile = 32 * L;
  out.assign(2 * (size_t)c, 0.0);
  std::vector<double> part(2 * (size_t)c * per);
  for (int ch0 = 0; ch0 < c; ch0 += tile) {
    for (uint32_t p = 0; p < pieces; p++) {
      const uint32_t j0 = p * kPiece, j1 = count - j0 < kPiece ? count : j0 + kPiece;
      for (int g = 0; g < groups; g++) {
        double ss[kNhwcWarps][64], ss2[kNhwcWarps][64];
        for (int w = 0; w < kNhwcWarps; w++) {
          for (int lane = 0; lane < 32; lane++) {
            const int mine = lane * L;
            if (ch0 + mine >= c) continue;
            Leaf leaf = proto;
            leaf.ch = (uint32_t)(ch0 + mine);
            prep(leaf);
            PieceLeaf<Leaf> one{leaf, j0, j1};
            Sums2<L> v;
            if constexpr (Smem) { /* the stack as the kernel's shared memory holds it, one thread's */
              double stk[kNhwcDepth * 2 * L];
              for (double &d : stk) d = NAN; /* a level read before it is written shows */
              SmemStack<L> sk{stk, 1};
              v = nhwc_warp_tree<L>(g + groups * w, one, groups, sk);
            } else {
              v = nhwc_warp_tree<L>(g + groups * w, one, groups);
            }
            for (int k = 0; k < L; k++) ss[w][mine + k] = v.s[k], ss2[w][mine + k] = v.s2[k];
          }
        }
        for (int tc = 0; tc < tile && ch0 + tc < c; tc++) {
          double a[kNhwcWarps], b[kNhwcWarps];
          for (int i = 0; i < kNhwcWarps; i++) a[i] = ss[i][tc], b[i] = ss2[i][tc];
          part[(size_t)(ch0 + tc) * per + (size_t)p * groups + g] = tree_sum(a, kNhwcWarps);
          part[((size_t)c + ch0 + tc) * per + (size_t)p * groups + g] = tree_sum(b, kNhwcWarps);
        }
      }
    }
  }
  replay_chan_finish(part, c, pieces, out, groups);
}

struct NoPrep {
  template <class Leaf>
  void operator()(Leaf &) const {}
};

/* Counts the fetches of every element of an NHWC tensor (each must come once,
 * and be used once, in its own slot), B quads per batch. */
template <int L, int B = 4>
struct VisitLeaf {
  int *hits;
  long *bad;
  size_t c;
  uint32_t ch;
  int fetched[4 * B];
  Sums2<L> acc;
  GWK_HD void fetch(uint32_t e, int s) {
    if (fetched[s] >= 0) ++*bad; /* a slot fetched twice before its use */
    fetched[s] = 1;
    for (int k = 0; k < L; k++) hits[(size_t)e * c + ch + (uint32_t)k]++;
  }
  GWK_HD void use(int s) {
    if (fetched[s] != 1) ++*bad;
    fetched[s] = -1;
  }
  GWK_HD Sums2<L> operator()(uint32_t t, uint32_t j0, uint32_t j1) {
    for (int &f : fetched) f = -1;
    acc.zero();
    nhwc_thread_rows<B>(j0, j1, t, *this);
    return acc;
  }
};

struct Shape4 {
  int n, c, h, w;
};
/* c: tiles partly filled (3, 5, 12, 40), whole (64), several (70, 130, 256);
 * hw % 4 != 0 and several pieces (n * hw > 8192). */
const Shape4 kShapes[] = {{2, 3, 5, 7},    {3, 5, 4, 4},   {2, 12, 9, 9},  {4, 8, 7, 7},   {3, 16, 30, 31},
                          {2, 40, 3, 3},   {1, 4, 96, 97}, {2, 64, 9, 9},  {1, 70, 13, 13}, {2, 130, 7, 7},
                          {1, 256, 3, 3}};

template <int L, int B = 4>
void coverage_one(const Shape4 &sh, int groups) {
  const uint32_t hw = (uint32_t)(sh.h * sh.w);
  const size_t total = (size_t)sh.n * sh.c * hw;
  std::vector<int> hits(total, 0);
  long bad = 0;
  VisitLeaf<L, B> leaf{};
  leaf.hits = hits.data(), leaf.bad = &bad, leaf.c = (size_t)sh.c;
  std::vector<double> out;
  replay_chan_nhwc<L>(leaf, NoPrep{}, sh.n, sh.c, hw, out, groups);
  size_t wrong = 0;
  for (size_t i = 0; i < total; i++) wrong += hits[i] != 1;
  CHECK(wrong == 0 && bad == 0,
        "NHWC [%d,%d,%d,%d] %d per lane, %d groups, %d quads a batch: %zu elements not fetched once, %ld slots misused",
        sh.n, sh.c, sh.h, sh.w, L, groups, B, wrong, bad);
}

void test_nhwc_coverage(void) {
  /* The leaves of each (virtual) warp: its residue class of threads t, each
   * once, in tree_sum's order: leaf k's partner under the lowest split, k ^ 1,
   * is the thread 128 away. */
  for (int groups = 1; groups <= kNhwcMaxGroups; groups *= 2)
    for (int v = 0; v < kNhwcWarps * groups; v++) {
      int seen[kRedThreads] = {0}, pairs_off = 0;
      const int leaves = kNhwcLeaves / groups;
      for (int k = 0; k < leaves; k++) {
        seen[nhwc_leaf_thread(v, k, groups)]++;
        if (leaves > 1 && k % 2 == 0) pairs_off += nhwc_leaf_thread(v, k + 1, groups) != nhwc_leaf_thread(v, k, groups) + 128;
      }
      int missing = 0;
      for (int t = 0; t < kRedThreads; t++) missing += seen[t] != (t % (kNhwcWarps * groups) == v);
      CHECK(missing == 0 && pairs_off == 0, "groups %d, virtual warp %d's leaves: %d threads not taken once, %d pairs "
            "not 128 apart", groups, v, missing, pairs_off);
    }
  for (const Shape4 &sh : kShapes)
    for (int groups : {1, 8}) {
      coverage_one<1>(sh, groups);
      coverage_one<1, 1>(sh, groups);
      coverage_one<1, 8>(sh, groups);
      if (sh.c % 2 == 0 && groups == 1) coverage_one<2>(sh, groups), coverage_one<2, 1>(sh, groups);
    }
  /* k_bn_elem_nhwc's grid: every quad of a thread starts at the same channel,
   * with the fewest blocks at or above the wanted number. */
  int bad_grid = 0;
  for (uint32_t c = 4; c <= 4096; c += 4) {
    for (uint32_t want : {1u, 7u, 100u, 4224u}) {
      const uint32_t g = nhwc_fixed_blocks(c, 256, want);
      bool ok = g >= want && (uint64_t)g * 1024 % c == 0;
      for (uint32_t h = want; ok && h < g; h++) ok = (uint64_t)h * 1024 % c != 0; /* none smaller */
      bad_grid += !ok;
    }
  }
  CHECK(bad_grid == 0, "nhwc_fixed_blocks: %d grids wrong", bad_grid);
}

/* f(std::integral_constant<int, V>) for every variant of the NHWC sums. */
template <class F>
void for_variants(F &&f) {
  static_assert(kNhwcVariants == 3, "one call per variant");
  f(std::integral_constant<int, 0>{});
  f(std::integral_constant<int, 1>{});
  f(std::integral_constant<int, 2>{});
}

/* f(std::integral_constant<int, L>, groups) for the lanes and groups the
 * kernels take with c channels: one channel per lane with 1 to 8 groups,
 * two (c even) with one group (pairs_ok). */
template <class F>
void for_lanes_groups(int c, F &&f) {
  for (int groups = 1; groups <= kNhwcMaxGroups; groups *= 2) f(std::integral_constant<int, 1>{}, groups);
  if (c % 2 == 0) f(std::integral_constant<int, 2>{}, 1);
}

/* Values over 40 binades, so the order of a double sum shows in its bits. */
template <class T>
std::vector<T> wide_values(size_t n) {
  std::vector<T> x(n);
  for (size_t i = 0; i < n; i++) x[i] = Act<T>::make(ldexp((double)sym(), (int)(rnd() % 41) - 20));
  return x;
}

template <class T>
void test_nhwc_sums(void) {
  const char *name = Act<T>::name;
  for (const Shape4 &sh : kShapes) {
    const size_t hw = (size_t)sh.h * sh.w, total = (size_t)sh.n * sh.c * hw;
    std::vector<T> x = wide_values<T>(total), dy = wide_values<T>(total), ym = wide_values<T>(total);
    std::vector<float> mean(sh.c), rstd(sh.c);
    for (int ch = 0; ch < sh.c; ch++) mean[ch] = sym(), rstd[ch] = (float)(0.5 + unif());
    const std::vector<T> xt = to_nhwc(x, sh.n, sh.c, hw), dyt = to_nhwc(dy, sh.n, sh.c, hw),
                         ymt = to_nhwc(ym, sh.n, sh.c, hw);
    std::vector<double> ref, got;
    SumsAcc<T> acc{};
    acc.x = x.data();
    replay_chan(acc, [](SumsAcc<T> &, int) {}, sh.n, sh.c, (uint32_t)hw, false, ref);
    for_variants([&](auto vc) {
      constexpr int V = decltype(vc)::value;
      for_lanes_groups(sh.c, [&](auto lc, int groups) {
        constexpr int L = decltype(lc)::value;
        SumsLeaf<T, L, nhwc_sums_batch<T, L, V>(), nhwc_direct<V>()> leaf{};
        leaf.x = xt.data(), leaf.c = (size_t)sh.c;
        replay_chan_nhwc<L, decltype(leaf), NoPrep, nhwc_smem_stack<V>()>(leaf, NoPrep{}, sh.n, sh.c, (uint32_t)hw,
                                                                         got, groups);
        CHECK(same_elems(ref, got), "%s bn_sums NHWC [%d,%d,%d,%d] variant %d, %d per lane, %d groups: not NCHW's bits",
              name, sh.n, sh.c, sh.h, sh.w, V, L, groups);
      });
    });
    for (int masked = 0; masked < 2; masked++) {
      BwdSumsAcc<T> b{};
      b.x = x.data(), b.dy = dy.data(), b.ym = masked ? ym.data() : nullptr;
      const float *m = mean.data(), *r = rstd.data();
      replay_chan(b, [m, r](BwdSumsAcc<T> &a, int ch) { a.mean = m[ch], a.rstd = r[ch]; }, sh.n, sh.c, (uint32_t)hw,
                  false, ref);
      auto prep = [m, r](auto &leaf) { leaf.begin(m, r); };
      for_variants([&](auto vc) {
        constexpr int V = decltype(vc)::value;
        for_lanes_groups(sh.c, [&](auto lc, int groups) {
          constexpr int L = decltype(lc)::value;
          BwdSumsLeaf<T, L, nhwc_bwd_batch<L, V>(), nhwc_direct<V>()> leaf{};
          leaf.x = xt.data(), leaf.dy = dyt.data(), leaf.ym = masked ? ymt.data() : nullptr, leaf.c = (size_t)sh.c;
          replay_chan_nhwc<L, decltype(leaf), decltype(prep), nhwc_smem_stack<V>()>(leaf, prep, sh.n, sh.c,
                                                                                   (uint32_t)hw, got, groups);
          CHECK(same_elems(ref, got),
                "%s bn_bwd_sums NHWC [%d,%d,%d,%d] mask %d, variant %d, %d per lane, %d groups: not NCHW's bits", name,
                sh.n, sh.c, sh.h, sh.w, masked, V, L, groups);
        });
      });
    }
  }
}

/* Max pool and average pool over NHWC planes (elements c apart) against the
 * NCHW planes: the same values, argmax positions and gathered sums. */
template <class T>
void test_nhwc_pools(void) {
  const char *name = Act<T>::name;
  struct P {
    int n, c, h, w, kernel, stride, pad;
  };
  const P shapes[] = {{2, 3, 9, 9, 3, 2, 1}, {1, 8, 12, 11, 3, 2, 1}, {2, 5, 8, 8, 2, 2, 0}, {1, 4, 7, 7, 3, 1, 1}};
  for (const P &ps : shapes) {
    const int p = (ps.h + 2 * ps.pad - ps.kernel) / ps.stride + 1, q = (ps.w + 2 * ps.pad - ps.kernel) / ps.stride + 1;
    const size_t hw = (size_t)ps.h * ps.w, pq = (size_t)p * q;
    std::vector<T> x = wide_values<T>((size_t)ps.n * ps.c * hw);
    for (size_t i = 5; i < x.size(); i += 11) x[i] = x[i - 3]; /* ties */
    std::vector<T> dy = wide_values<T>((size_t)ps.n * ps.c * pq);
    const std::vector<T> xt = to_nhwc(x, ps.n, ps.c, hw), dyt = to_nhwc(dy, ps.n, ps.c, pq);
    std::vector<int32_t> arg((size_t)ps.n * ps.c * pq), argt(arg.size());
    size_t bad = 0;
    for (int s = 0; s < ps.n; s++)
      for (int ch = 0; ch < ps.c; ch++)
        for (int oh = 0; oh < p; oh++)
          for (int ow = 0; ow < q; ow++) {
            const size_t o = ((size_t)s * ps.c + ch) * pq + (size_t)oh * q + ow;
            const size_t ot = ((size_t)s * pq + (size_t)oh * q + ow) * ps.c + ch;
            const float a = maxpool_window(x.data() + ((size_t)s * ps.c + ch) * hw, ps.h, ps.w, oh, ow, ps.kernel,
                                           ps.stride, ps.pad, &arg[o]);
            const float b = maxpool_window(xt.data() + (size_t)s * hw * ps.c + ch, ps.h, ps.w, oh, ow, ps.kernel,
                                           ps.stride, ps.pad, &argt[ot], (size_t)ps.c);
            bad += !same_bits(a, b) || arg[o] != argt[ot];
          }
    CHECK(bad == 0, "%s maxpool window NHWC [%d,%d,%d,%d]: %zu outputs differ from NCHW", name, ps.n, ps.c, ps.h, ps.w,
          bad);
    bad = 0;
    for (int s = 0; s < ps.n; s++)
      for (int ch = 0; ch < ps.c; ch++)
        for (int ih = 0; ih < ps.h; ih++)
          for (int iw = 0; iw < ps.w; iw++) {
            const size_t pl = ((size_t)s * ps.c + ch) * pq, plt = (size_t)s * pq * ps.c + ch;
            const FastDiv sd = fastdiv_make((uint32_t)ps.stride);
            const float a = maxpool_gather(dy.data() + pl, arg.data() + pl, p, q, ih, iw, ps.w, ps.kernel, sd, ps.pad);
            const float b = maxpool_gather(dyt.data() + plt, argt.data() + plt, p, q, ih, iw, ps.w, ps.kernel, sd,
                                           ps.pad, (size_t)ps.c);
            bad += !same_bits(a, b);
          }
    CHECK(bad == 0, "%s maxpool gather NHWC [%d,%d,%d,%d]: %zu inputs differ from NCHW", name, ps.n, ps.c, ps.h, ps.w,
          bad);
    bad = 0;
    for (int s = 0; s < ps.n; s++)
      for (int ch = 0; ch < ps.c; ch++)
        for (int l = 0; l < kWarp; l++) {
          const double a = avgpool_lane_sum(x.data() + ((size_t)s * ps.c + ch) * hw, (uint32_t)hw, l);
          const double b = avgpool_lane_sum(xt.data() + (size_t)s * hw * ps.c + ch, (uint32_t)hw, l, (size_t)ps.c);
          bad += memcmp(&a, &b, sizeof a) != 0;
        }
    CHECK(bad == 0, "%s avgpool lanes NHWC [%d,%d,%d,%d]: %zu lane sums differ from NCHW", name, ps.n, ps.c, ps.h,
          ps.w, bad);
  }
}

/* perm_source: OIHW -> OHWI takes w[kk][cc][r] to position (kk * rs + r) * c + cc,
 * and the way back undoes it. */
void test_perm(void) {
  const size_t dims[][3] = {{4, 3, 9}, {2, 64, 1}, {5, 7, 49}, {1, 1, 1}, {3, 16, 25}, {64, 512, 9}};
  for (const auto &d : dims) {
    const size_t k = d[0], c = d[1], rs = d[2], total = k * c * rs;
    const FastDiv cd = fastdiv_make((uint32_t)c), rsd = fastdiv_make((uint32_t)rs);
    size_t bad = 0;
    std::vector<int> seen(total, 0);
    for (size_t kk = 0; kk < k; kk++)
      for (size_t cc = 0; cc < c; cc++)
        for (size_t r = 0; r < rs; r++) {
          const uint32_t oihw = (uint32_t)((kk * c + cc) * rs + r), ohwi = (uint32_t)((kk * rs + r) * c + cc);
          bad += perm_source(ohwi, cd, rsd, true) != oihw || perm_source(oihw, cd, rsd, false) != ohwi;
          seen[perm_source(ohwi, cd, rsd, true)]++;
        }
    for (size_t e = 0; e < total; e++) bad += seen[e] != 1;
    CHECK(bad == 0, "perm_source [%zu][%zu][%zu]: %zu wrong", k, c, rs, bad);
  }
}

} /* namespace */

void gwt::test_nhwc(void) {
  test_nhwc_coverage();
  test_nhwc_sums<float>();
  test_nhwc_sums<bf16>();
  test_nhwc_sums<f16>();
  test_nhwc_pools<float>();
  test_nhwc_pools<bf16>();
  test_nhwc_pools<f16>();
  test_perm();
}
