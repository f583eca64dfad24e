/* test_cudnn_kernels_host_nhwc.cu - part of the cudnn-kernels-host test: the
 * channels-last (NHWC) kernels' arithmetic replayed on the host against the
 * NCHW kernels' on the same values (transposed), bit for bit, as backend.h
 * promises:
 *   - batch norm's per-channel sums (k_chan_partials_nhwc: gwk::chan_thread_nhwc
 *     per thread of a tile, the block trees, the second pass) against
 *     replay_chan's NCHW ones, for SumsRule / SumsAcc and BwdSumsRule /
 *     BwdSumsAcc with and without the fused ReLU's mask, vector loads and not,
 *     on values whose double sums depend on their order (exponents over 40
 *     binades), channel counts that fill no tile (3, 5, 12) and shapes with
 *     several pieces; every element visited once, in its own channel;
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
 * kTile channels and piece, every thread's chan_thread_nhwc, then each
 * channel's tree over the threads; the pieces as replay_chan's (replay_chan_finish). */
template <class Rule>
void replay_chan_nhwc(const Rule &rule, int n, int c, uint32_t hw, bool vec, std::vector<double> &out) {
  const uint32_t count = (uint32_t)n * hw, pieces = (count + kPiece - 1) / kPiece;
  out.assign(2 * (size_t)c, 0.0);
  std::vector<double> part(2 * (size_t)c * pieces);
  static double a[kTile][kRedThreads], b[kTile][kRedThreads];
  for (int ch0 = 0; ch0 < c; ch0 += kTile) {
    const int nct = c - ch0 < kTile ? c - ch0 : kTile;
    for (uint32_t p = 0; p < pieces; p++) {
      const uint32_t j0 = p * kPiece, j1 = count - j0 < kPiece ? count : j0 + kPiece;
      for (int t = 0; t < kRedThreads; t++) {
        typename Rule::St st[kTile] = {};
        for (int k = 0; k < nct; k++) rule.begin(st[k], (uint32_t)(ch0 + k));
        chan_thread_nhwc(rule, st, nct, j0, j1, t, (uint32_t)c, (uint32_t)ch0, vec);
        for (int k = 0; k < nct; k++) a[k][t] = st[k].s, b[k][t] = st[k].s2;
      }
      for (int k = 0; k < nct; k++) {
        part[(size_t)(ch0 + k) * pieces + p] = tree_sum(a[k], kRedThreads);
        part[((size_t)c + ch0 + k) * pieces + p] = tree_sum(b[k], kRedThreads);
      }
    }
  }
  replay_chan_finish(part, c, pieces, out);
}

/* Counts the visits of every element of an NHWC tensor and those outside the
 * accumulator's channel. */
struct VisitRule {
  int *hits;
  long *wrong;
  int c;
  struct St {
    int ch;
    double s, s2;
  };
  GWK_HD void begin(St &st, uint32_t ch) const { st.ch = (int)ch; }
  GWK_HD void add1(St &st, size_t off) const {
    hits[off]++;
    if ((int)(off % (size_t)c) != st.ch) ++*wrong;
  }
  GWK_HD void add4(St &s0, St &s1, St &s2, St &s3, size_t off) const {
    add1(s0, off), add1(s1, off + 1), add1(s2, off + 2), add1(s3, off + 3);
  }
};

struct Shape4 {
  int n, c, h, w;
};
/* c: no whole tile (3, 5, 12), tiles (8, 16, 40); hw % 4 != 0 and several pieces (n * hw > 8192). */
const Shape4 kShapes[] = {{2, 3, 5, 7}, {3, 5, 4, 4}, {2, 12, 9, 9}, {4, 8, 7, 7},
                          {3, 16, 30, 31}, {2, 40, 3, 3}, {1, 4, 96, 97}};

void test_nhwc_coverage(void) {
  for (const Shape4 &sh : kShapes) {
    const uint32_t hw = (uint32_t)(sh.h * sh.w);
    const size_t total = (size_t)sh.n * sh.c * hw;
    for (int vec = 0; vec < 2; vec++) {
      if (vec && sh.c % 4) continue;
      std::vector<int> hits(total, 0);
      long wrong = 0;
      const VisitRule rule{hits.data(), &wrong, sh.c};
      std::vector<double> out;
      replay_chan_nhwc(rule, sh.n, sh.c, hw, vec != 0, out);
      size_t bad = 0;
      for (size_t i = 0; i < total; i++) bad += hits[i] != 1;
      CHECK(bad == 0 && wrong == 0, "NHWC [%d,%d,%d,%d] vec %d: %zu elements not visited once, %ld outside the channel",
            sh.n, sh.c, sh.h, sh.w, vec, bad, wrong);
    }
  }
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
    for (int vec = 0; vec < 2; vec++) {
      if (vec && sh.c % 4) continue;
      replay_chan_nhwc(SumsRule<T>{xt.data()}, sh.n, sh.c, (uint32_t)hw, vec != 0, got);
      CHECK(same_elems(ref, got), "%s bn_sums NHWC [%d,%d,%d,%d] vec %d: not NCHW's bits", name, sh.n, sh.c, sh.h, sh.w,
            vec);
    }
    for (int masked = 0; masked < 2; masked++) {
      BwdSumsAcc<T> b{};
      b.x = x.data(), b.dy = dy.data(), b.ym = masked ? ym.data() : nullptr;
      const float *m = mean.data(), *r = rstd.data();
      replay_chan(b, [m, r](BwdSumsAcc<T> &a, int ch) { a.mean = m[ch], a.rstd = r[ch]; }, sh.n, sh.c, (uint32_t)hw,
                  false, ref);
      for (int vec = 0; vec < 2; vec++) {
        if (vec && sh.c % 4) continue;
        const BwdSumsRule<T> rule{xt.data(), dyt.data(), masked ? ymt.data() : nullptr, m, r};
        replay_chan_nhwc(rule, sh.n, sh.c, (uint32_t)hw, vec != 0, got);
        CHECK(same_elems(ref, got), "%s bn_bwd_sums NHWC [%d,%d,%d,%d] mask %d vec %d: not NCHW's bits", name, sh.n,
              sh.c, sh.h, sh.w, masked, vec);
      }
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
            const float a = maxpool_gather(dy.data() + pl, arg.data() + pl, p, q, ih, iw, ps.w, ps.kernel, ps.stride,
                                           ps.pad);
            const float b = maxpool_gather(dyt.data() + plt, argt.data() + plt, p, q, ih, iw, ps.w, ps.kernel,
                                           ps.stride, ps.pad, (size_t)ps.c);
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
