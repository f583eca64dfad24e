/* test_cudnn_kernels_host.cu - the arithmetic of the cudnn backend's kernels
 * (model/cudnn_kernels_math.cuh) run on the host, against independent
 * references written here in long double.  Host code only: no GPU, no kernel
 * launch.  Where the kernels split work over threads and blocks (the
 * per-channel sums, the loss row, the average pool), the test replays the same
 * split serially (pieces, threads, the pairwise tree), so index mistakes show up
 * as missing or doubled values, not only arithmetic ones.
 *
 * Tolerances are stated where they are checked; each is float rounding plus a
 * bound on the double arithmetic before it.  Exit 0 when everything holds, 1
 * (with what failed) otherwise. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cudnn_kernels_math.cuh"

using namespace gwk;

namespace {

int failures, checks;
const double kF = 5.9604644775390625e-08; /* 2^-24: float rounding, relative */
const double kD = 1.1102230246251565e-16; /* 2^-53: double rounding, relative */

#define CHECK(cond, ...)                                              \
  do {                                                                \
    checks++;                                                         \
    if (!(cond)) {                                                    \
      if (failures++ < 40) {                                          \
        fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
        fprintf(stderr, __VA_ARGS__);                                 \
        fputc('\n', stderr);                                          \
      }                                                               \
    }                                                                 \
  } while (0)

/* splitmix64: the same data every run. */
uint64_t rng_state = 0x9e3779b97f4a7c15ull;
uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double unif(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); } /* [0, 1) */
float sym(void) { return (float)(2 * unif() - 1); }                               /* [-1, 1) */

bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ---- fast division ------------------------------------------------------------------------- */
void test_fastdiv(void) {
  const uint32_t ds[] = {1, 2, 3, 4, 5, 7, 49, 64, 196, 3136, 12544, 100352, (1u << 20) + 1, 2147483647u, 2147483648u};
  for (uint32_t d : ds) {
    const FastDiv f = fastdiv_make(d);
    const uint32_t ns[] = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 2147483646u, 2147483647u};
    for (uint32_t n : ns)
      if (n < 2147483648u) CHECK(fastdiv(f, n) == n / d, "%u / %u gave %u", n, d, fastdiv(f, n));
    for (int i = 0; i < 20000; i++) {
      const uint32_t n = (uint32_t)(rnd() >> 33); /* < 2^31 */
      if (fastdiv(f, n) != n / d) {
        CHECK(fastdiv(f, n) == n / d, "%u / %u gave %u", n, d, fastdiv(f, n));
        break;
      }
    }
  }
  for (int i = 0; i < 200000; i++) {
    const uint32_t d = 1 + (uint32_t)(rnd() % 2147483647u), n = (uint32_t)(rnd() >> 33);
    if (fastdiv(fastdiv_make(d), n) != n / d) {
      CHECK(false, "%u / %u gave %u", n, d, fastdiv(fastdiv_make(d), n));
      break;
    }
  }
}

/* ---- the per-channel reduction, replayed ---------------------------------------------------------
 * What k_chan_partials + k_chan_finish compute: pieces of kPiece values, each a
 * block of kRedThreads threads (chan_thread, then tree_sum), then per channel
 * thread t sums partials t, t + B, ..., then tree_sum.  `setup(acc, ch)` is the
 * device accumulator's begin(). */
template <class Acc, class Setup>
void replay_chan(Acc proto, Setup setup, int n, int c, uint32_t hw, bool vec, std::vector<double> &out) {
  const uint32_t count = (uint32_t)n * hw, pieces = (count + kPiece - 1) / kPiece;
  const FastDiv hwd = fastdiv_make(hw ? hw : 1);
  out.assign(2 * (size_t)c, 0.0);
  std::vector<double> part(2 * (size_t)c * pieces);
  double a[kRedThreads], b[kRedThreads];
  for (int ch = 0; ch < c; ch++) {
    for (uint32_t p = 0; p < pieces; p++) {
      const uint32_t j0 = p * kPiece, j1 = count - j0 < kPiece ? count : j0 + kPiece;
      for (int t = 0; t < kRedThreads; t++) {
        Acc acc = proto;
        setup(acc, ch);
        acc.s = 0, acc.s2 = 0;
        chan_thread(acc, j0, j1, t, hwd, (size_t)ch * hw, (size_t)c * hw, vec);
        a[t] = acc.s, b[t] = acc.s2;
      }
      part[(size_t)ch * pieces + p] = tree_sum(a, kRedThreads);
      part[((size_t)c + ch) * pieces + p] = tree_sum(b, kRedThreads);
    }
    for (int t = 0; t < kRedThreads; t++) {
      a[t] = b[t] = 0;
      for (uint32_t i = (uint32_t)t; i < pieces; i += kRedThreads)
        a[t] += part[(size_t)ch * pieces + i], b[t] += part[((size_t)c + ch) * pieces + i];
    }
    out[ch] = tree_sum(a, kRedThreads);
    out[c + ch] = tree_sum(b, kRedThreads);
  }
}

/* Counts the visits of every element and those outside the channel. */
struct VisitAcc {
  int *hits;
  long *wrong;
  int ch, c;
  uint32_t hw;
  double s, s2;
  GWK_HD void add1(size_t off) {
    hits[off]++;
    if ((int)((off / hw) % (size_t)c) != ch) ++*wrong;
  }
  GWK_HD void add4(size_t off) {
    for (int i = 0; i < 4; i++) add1(off + i);
  }
};

struct Shape {
  int n, c, h, w;
};
const Shape kBnShapes[] = {{1, 1, 1, 1}, {2, 3, 5, 7},   {3, 2, 7, 7},    {4, 3, 8, 8},   {2, 1, 64, 65},
                           {5, 2, 41, 43}, {3, 2, 100, 100}, {1, 2, 91, 91}, {7, 3, 28, 28}, {16, 2, 7, 7}};

void test_chan_coverage(void) {
  for (const Shape &sh : kBnShapes) {
    const uint32_t hw = (uint32_t)(sh.h * sh.w);
    const size_t total = (size_t)sh.n * sh.c * hw;
    for (int vec = 0; vec < 2; vec++) {
      if (vec && hw % 4) continue;
      std::vector<int> hits(total, 0);
      long wrong = 0;
      VisitAcc proto = {hits.data(), &wrong, 0, sh.c, hw, 0, 0};
      std::vector<double> out;
      replay_chan(proto, [](VisitAcc &a, int ch) { a.ch = ch; }, sh.n, sh.c, hw, vec != 0, out);
      size_t bad = 0;
      for (size_t i = 0; i < total; i++) bad += hits[i] != 1;
      CHECK(bad == 0 && wrong == 0, "[%d,%d,%d,%d] vec %d: %zu elements not visited once, %ld outside the channel",
            sh.n, sh.c, sh.h, sh.w, vec, bad, wrong);
    }
  }
}

/* x [n, c, h, w]: channel ch centered at center[ch] with spread spread[ch]. */
std::vector<float> make_x(const Shape &sh, const std::vector<double> &center, const std::vector<double> &spread) {
  const size_t hw = (size_t)sh.h * sh.w;
  std::vector<float> x((size_t)sh.n * sh.c * hw);
  for (int s = 0; s < sh.n; s++)
    for (int ch = 0; ch < sh.c; ch++)
      for (size_t i = 0; i < hw; i++) x[((size_t)s * sh.c + ch) * hw + i] = (float)(center[ch] + spread[ch] * sym());
  return x;
}

/* The bn forward pieces: sums, stats, running update, apply (train and infer). */
void test_bn_forward(void) {
  const double eps = 1e-5, mom = 0.1;
  for (const Shape &sh : kBnShapes) {
    const size_t hw = (size_t)sh.h * sh.w, m = (size_t)sh.n * hw;
    std::vector<double> center(sh.c), spread(sh.c);
    for (int ch = 0; ch < sh.c; ch++) {
      /* channel 0: mean far larger than the spread (1e5 times); others ordinary */
      center[ch] = ch == 0 ? 1000.0 : 0.5 * sym();
      spread[ch] = ch == 0 ? 0.01 : 0.2 + unif();
    }
    const std::vector<float> x = make_x(sh, center, spread);

    std::vector<double> sums, sums_vec;
    SumsAcc proto = {x.data(), 0, 0};
    replay_chan(proto, [](SumsAcc &, int) {}, sh.n, sh.c, (uint32_t)hw, false, sums);
    if (hw % 4 == 0) {
      replay_chan(proto, [](SumsAcc &, int) {}, sh.n, sh.c, (uint32_t)hw, true, sums_vec);
      CHECK(memcmp(sums.data(), sums_vec.data(), sums.size() * sizeof(double)) == 0,
            "[%d,%d,%d,%d]: the float4 path summed differently", sh.n, sh.c, sh.h, sh.w);
    }

    for (int ch = 0; ch < sh.c; ch++) {
      long double rs = 0, rs2 = 0, ra = 0, ra2 = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const long double v = x[((size_t)s * sh.c + ch) * hw + i];
          rs += v, rs2 += v * v, ra += fabsl(v), ra2 += v * v;
        }
      /* sums: any order of m double additions is within m * 2^-53 * sum|terms| */
      const double tol1 = (double)m * kD * (double)ra + 1e-300, tol2 = (double)m * kD * (double)ra2 + 1e-300;
      CHECK(fabs(sums[ch] - (double)rs) <= tol1, "[%d,%d,%d,%d] ch %d: sum x %.17g, want %.17Lg", sh.n, sh.c, sh.h,
            sh.w, ch, sums[ch], rs);
      CHECK(fabs(sums[sh.c + ch] - (double)rs2) <= tol2, "[%d,%d,%d,%d] ch %d: sum x^2 %.17g, want %.17Lg", sh.n,
            sh.c, sh.h, sh.w, ch, sums[sh.c + ch], rs2);

      /* stats against the two-pass reference (the cpu backend's form) */
      const long double mean = rs / m;
      long double ss = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const long double dv = x[((size_t)s * sh.c + ch) * hw + i] - mean;
          ss += dv * dv;
        }
      const long double var = ss / m, rstd = 1 / sqrtl(var + eps);
      const BnStats st = bn_stats_from_sums(sums[ch], sums[sh.c + ch], (double)m, eps);
      const float mean_f = (float)st.mean, rstd_f = (float)st.rstd;
      CHECK(fabsl(mean_f - mean) <= (kF + 1e-12) * fabsl(mean) + 1e-30, "ch %d: mean %.9g, want %.12Lg", ch,
            (double)mean_f, mean);
      /* var = E[x^2] - mean^2 cancels: allow 64 double roundings of E[x^2] */
      const double evar = 64 * kD * (sums[sh.c + ch] / (double)m);
      const double rstd_rel = kF + 0.5 * evar / (double)(var + eps);
      CHECK(fabsl(rstd_f - rstd) <= rstd_rel * rstd, "[%d,%d,%d,%d] ch %d: rstd %.9g, want %.12Lg (rel tol %.3g)",
            sh.n, sh.c, sh.h, sh.w, ch, (double)rstd_f, rstd, rstd_rel);
      CHECK(fabsl(st.var - var) <= evar + 1e-12 * var, "ch %d: var %.17g, want %.17Lg", ch, st.var, var);

      /* running statistics, PyTorch's rule with the unbiased variance */
      if (m >= 2) {
        float rm = 0.25f, rv = 1.5f;
        bn_running_update(st.mean, st.var, (double)m, mom, &rm, &rv);
        const long double want_rm = mom * mean + (1 - mom) * 0.25L;
        const long double want_rv = mom * var * m / (m - 1) + (1 - mom) * 1.5L;
        CHECK(fabsl(rm - want_rm) <= 2 * kF * fabsl(want_rm), "ch %d: running_mean %.9g, want %.12Lg", ch,
              (double)rm, want_rm);
        CHECK(fabsl(rv - want_rv) <= 2 * kF * fabsl(want_rv) + mom * evar * m / (m - 1),
              "ch %d: running_var %.9g, want %.12Lg", ch, (double)rv, want_rv);
      }

      /* apply with the rounded statistics: y = (x - mean) rstd gamma + beta */
      const float gamma = 0.5f + (float)unif(), beta = sym();
      const BnAffine af = bn_affine_train(gamma, beta, mean_f, rstd_f);
      const float rm_f = (float)mean, rv_f = (float)var;
      const BnAffine ai = bn_affine_infer(gamma, beta, rm_f, rv_f, eps);
      size_t bad = 0, bad_i = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const float xv = x[((size_t)s * sh.c + ch) * hw + i];
          const long double want = ((long double)xv - mean_f) * rstd_f * gamma + beta;
          /* float rounding plus the double terms' rounding (x * scale and shift are large where mean is) */
          const double tol = kF * fabsl(want) + 4 * kD * (fabs(xv * af.scale) + fabs(af.shift)) + 1e-38;
          bad += !(fabsl(bn_affine_apply(xv, af) - want) <= tol);
          const long double want_i = ((long double)xv - rm_f) / sqrtl((long double)rv_f + eps) * gamma + beta;
          const double tol_i = kF * fabsl(want_i) + 4 * kD * (fabs(xv * ai.scale) + fabs(ai.shift)) + 1e-38;
          bad_i += !(fabsl(bn_affine_apply(xv, ai) - want_i) <= tol_i);
        }
      CHECK(bad == 0, "[%d,%d,%d,%d] ch %d: %zu training outputs off", sh.n, sh.c, sh.h, sh.w, ch, bad);
      CHECK(bad_i == 0, "[%d,%d,%d,%d] ch %d: %zu inference outputs off", sh.n, sh.c, sh.h, sh.w, ch, bad_i);
    }
  }
  /* A constant channel: var 0 exactly (clamped, never negative), rstd = 1 / sqrt(eps). */
  const BnStats z = bn_stats_from_sums(3 * 0.1f, 3 * (double)0.1f * (double)0.1f, 3, eps);
  CHECK(z.var >= 0 && fabs(z.rstd - 1 / sqrt(z.var + eps)) <= 4 * kD * z.rstd, "var %.17g rstd %.17g", z.var,
        z.rstd);
  const BnStats neg = bn_stats_from_sums(1.0, 0.9, 1.0, eps); /* s2 / count < mean^2: clamped */
  CHECK(neg.var == 0 && neg.rstd == 1 / sqrt(eps), "var %.17g", neg.var);
  const BnStats nan_in = bn_stats_from_sums(NAN, 1.0, 2.0, eps);
  CHECK(nan_in.var != nan_in.var && nan_in.rstd != nan_in.rstd, "a NaN input must stay NaN");
}

void test_bn_backward(void) {
  for (const Shape &sh : kBnShapes) {
    const size_t hw = (size_t)sh.h * sh.w, m = (size_t)sh.n * hw, total = m * sh.c;
    std::vector<double> center(sh.c), spread(sh.c, 1.0);
    for (int ch = 0; ch < sh.c; ch++) center[ch] = ch == 0 ? 200.0 : sym();
    const std::vector<float> x = make_x(sh, center, spread);
    std::vector<float> dy(total), mean(sh.c), rstd(sh.c), gamma(sh.c);
    for (float &g : dy) g = sym();
    for (int ch = 0; ch < sh.c; ch++)
      mean[ch] = (float)center[ch] + 0.01f * sym(), rstd[ch] = 1.7f + sym(), gamma[ch] = 0.5f + (float)unif();

    std::vector<double> sums, sums_vec;
    BwdSumsAcc proto = {x.data(), dy.data(), 0, 0, 0, 0};
    auto setup = [&](BwdSumsAcc &a, int ch) { a.mean = mean[ch], a.rstd = rstd[ch]; };
    replay_chan(proto, setup, sh.n, sh.c, (uint32_t)hw, false, sums);
    if (hw % 4 == 0) {
      replay_chan(proto, setup, sh.n, sh.c, (uint32_t)hw, true, sums_vec);
      CHECK(memcmp(sums.data(), sums_vec.data(), sums.size() * sizeof(double)) == 0,
            "[%d,%d,%d,%d]: the float4 path summed differently", sh.n, sh.c, sh.h, sh.w);
    }
    for (int ch = 0; ch < sh.c; ch++) {
      long double sdy = 0, sdyx = 0, ady = 0, adyx = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const size_t o = ((size_t)s * sh.c + ch) * hw + i;
          const long double xh = ((long double)x[o] - mean[ch]) * rstd[ch];
          sdy += dy[o], sdyx += dy[o] * xh, ady += fabsl(dy[o]), adyx += fabsl(dy[o] * xh);
        }
      /* the per-term xhat is rounded in double too: one more rounding per term */
      CHECK(fabs(sums[ch] - (double)sdy) <= m * kD * (double)ady + 1e-300, "ch %d: sum dy %.17g, want %.17Lg", ch,
            sums[ch], sdy);
      CHECK(fabs(sums[sh.c + ch] - (double)sdyx) <= (m + 2) * kD * (double)adyx + 1e-300,
            "ch %d: sum dy xhat %.17g, want %.17Lg", ch, sums[sh.c + ch], sdyx);

      const BnBwd p = bn_bwd_channel(gamma[ch], mean[ch], rstd[ch], sums[ch], sums[sh.c + ch], (double)m);
      const long double k = (long double)gamma[ch] * rstd[ch], a = sdy / m, b = sdyx / m;
      size_t bad = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const size_t o = ((size_t)s * sh.c + ch) * hw + i;
          const long double xh = ((long double)x[o] - mean[ch]) * rstd[ch];
          const long double want = k * (dy[o] - a - xh * b);
          const double tol =
              kF * fabsl(want) + 8 * kD * fabsl(k) * (fabs(dy[o]) + fabsl(a) + fabsl(xh * b)) + 1e-38;
          bad += !(fabsl(bn_bwd_apply(x[o], dy[o], p) - want) <= tol);
        }
      CHECK(bad == 0, "[%d,%d,%d,%d] ch %d: %zu of dx off", sh.n, sh.c, sh.h, sh.w, ch, bad);
    }
  }
}

/* ---- element-wise --------------------------------------------------------------------------------- */
void test_relu(void) {
  const float in[] = {-1.0f, -0.0f, 0.0f, 1.0f, NAN, INFINITY, -INFINITY, 1e-45f, -1e-45f, 3.5f};
  const float want[] = {0.0f, 0.0f, 0.0f, 1.0f, NAN, INFINITY, 0.0f, 1e-45f, 0.0f, 3.5f};
  for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
    const float y = relu(in[i]);
    CHECK(same_bits(y, want[i]) || (y != y && want[i] != want[i]), "relu(%g) = %g", (double)in[i], (double)y);
    const float dx = relu_bwd(y, 2.5f);
    CHECK(dx == (y > 0 ? 2.5f : 0.0f), "relu_bwd(%g) = %g", (double)y, (double)dx);
  }
  CHECK(relu_bwd(NAN, 1.0f) == 0.0f, "relu_bwd at a NaN output is 0 (y > 0 is false)");
}

/* ---- max pool ---------------------------------------------------------------------------------- */
struct PoolShape {
  int h, w, kernel, stride, pad;
};
const PoolShape kPools[] = {{112, 112, 3, 2, 1}, {7, 9, 3, 2, 1}, {5, 5, 2, 2, 0}, {6, 7, 3, 1, 1}, {1, 1, 1, 1, 0},
                            {8, 8, 3, 3, 1},     {9, 9, 5, 2, 2}, {4, 6, 2, 1, 1}, {13, 11, 4, 3, 2}, {3, 3, 3, 1, 1}};

/* The PyTorch rule restated: any NaN in the window -> the last NaN; else the
 * largest value at its first position (all -inf: the first position). */
int32_t ref_argmax(const float *plane, int h, int w, int h0, int w0, int kernel) {
  int32_t first = -1, last_nan = -1, best = -1;
  float mx = -INFINITY;
  for (int ih = h0; ih < h0 + kernel; ih++)
    for (int iw = w0; iw < w0 + kernel; iw++) {
      if (ih < 0 || iw < 0 || ih >= h || iw >= w) continue;
      const int32_t at = ih * w + iw;
      const float v = plane[at];
      if (first < 0) first = at;
      if (v != v) last_nan = at;
      else if (best < 0 ? v > -INFINITY : v > mx) mx = v, best = at;
    }
  if (last_nan >= 0) return last_nan;
  return best >= 0 ? best : first;
}

void test_maxpool(void) {
  for (const PoolShape &ps : kPools) {
    const int h = ps.h, w = ps.w, p = (h + 2 * ps.pad - ps.kernel) / ps.stride + 1;
    const int q = (w + 2 * ps.pad - ps.kernel) / ps.stride + 1;
    for (int variant = 0; variant < 3; variant++) {
      /* 0: ties (values in {0..3}) with NaN and -inf sprinkled; 1: random floats; 2: all -inf */
      std::vector<float> x((size_t)h * w);
      for (float &v : x) {
        if (variant == 2) {
          v = -INFINITY;
        } else if (variant == 0) {
          const uint64_t r = rnd() % 100;
          v = r < 3 ? NAN : r < 6 ? -INFINITY : (float)(r % 4);
        } else {
          v = sym();
        }
      }
      std::vector<float> y((size_t)p * q), dy((size_t)p * q);
      std::vector<int32_t> arg((size_t)p * q);
      size_t bad = 0;
      for (int oh = 0; oh < p; oh++)
        for (int ow = 0; ow < q; ow++) {
          const size_t o = (size_t)oh * q + ow;
          y[o] = maxpool_window(x.data(), h, w, oh, ow, ps.kernel, ps.stride, ps.pad, &arg[o]);
          const int32_t want = ref_argmax(x.data(), h, w, oh * ps.stride - ps.pad, ow * ps.stride - ps.pad, ps.kernel);
          const bool ok = arg[o] == want && want >= 0 && same_bits(y[o], x[(size_t)want]);
          if (!ok && bad++ < 3)
            fprintf(stderr, "  maxpool %dx%d k%d s%d p%d variant %d at (%d,%d): argmax %d, want %d\n", h, w,
                    ps.kernel, ps.stride, ps.pad, variant, oh, ow, arg[o], want);
          dy[o] = sym();
        }
      CHECK(bad == 0, "maxpool %dx%d k%d s%d p%d variant %d: %zu outputs wrong", h, w, ps.kernel, ps.stride, ps.pad,
            variant, bad);

      /* backward: the gather against a scatter over the outputs in row-major order,
       * both in double: the same additions in the same order, so the same bits */
      std::vector<double> acc((size_t)h * w, 0.0);
      for (size_t o = 0; o < (size_t)p * q; o++) acc[(size_t)arg[o]] += dy[o];
      size_t bad_dx = 0;
      for (int ih = 0; ih < h; ih++)
        for (int iw = 0; iw < w; iw++) {
          const float g =
              maxpool_gather(dy.data(), arg.data(), p, q, ih, iw, w, ps.kernel, ps.stride, ps.pad);
          bad_dx += !same_bits(g, (float)acc[(size_t)ih * w + iw]);
        }
      CHECK(bad_dx == 0, "maxpool bwd %dx%d k%d s%d p%d variant %d: %zu of dx differ from the scatter", h, w,
            ps.kernel, ps.stride, ps.pad, variant, bad_dx);
    }
  }
  /* Ties: a plane of equal values gives every window's first in-plane position. */
  const float ones[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  int32_t a = -2;
  maxpool_window(ones, 3, 3, 0, 0, 3, 2, 1, &a);
  CHECK(a == 0, "tie at the corner window: %d", a);
  maxpool_window(ones, 3, 3, 1, 1, 3, 2, 1, &a);
  CHECK(a == 4, "tie at window (1,1) (rows 1-3, cols 1-3 clipped): %d", a);
  /* A window entirely in the padding: -inf and -1. */
  const float v = maxpool_window(ones, 3, 3, 0, 0, 1, 1, 1, &a);
  CHECK(a == -1 && v == -INFINITY, "padding-only window: %d %g", a, (double)v);
}

/* ---- global average pool --------------------------------------------------------------------------- */
void test_avgpool(void) {
  const uint32_t hws[] = {1, 7, 31, 32, 33, 49, 64, 100, 1000, 12544};
  for (uint32_t hw : hws) {
    for (int variant = 0; variant < 2; variant++) {
      std::vector<float> x(hw);
      for (float &v : x) v = variant ? 1000.0f + 0.001f * sym() : sym();
      double lanes[kWarp];
      for (int l = 0; l < kWarp; l++) lanes[l] = avgpool_lane_sum(x.data(), hw, l);
      const float y = avgpool_finish(tree_sum(lanes, kWarp), hw);
      long double s = 0, a = 0;
      for (float v : x) s += v, a += fabsf(v);
      const long double want = s / hw;
      CHECK(fabsl(y - want) <= kF * fabsl(want) + hw * kD * a / hw + 1e-38, "avgpool hw %u: %.9g, want %.12Lg", hw,
            (double)y, want);
    }
    const float g = 0.37f;
    CHECK(same_bits(avgpool_bwd_value(g, hw), (float)((double)g / hw)), "avgpool bwd hw %u", hw);
    CHECK(fabsl(avgpool_bwd_value(g, hw) - (long double)g / hw) <= kF * g / hw, "avgpool bwd hw %u", hw);
  }
}

/* ---- bias gradient ------------------------------------------------------------------------------- */
void test_bias_grad(void) {
  for (int n : {0, 1, 7, 8, 9, 256})
    for (int k : {1, 10, 33, 1000}) {
      std::vector<float> dy((size_t)n * k);
      for (float &v : dy) v = sym();
      size_t bad = 0;
      for (int j = 0; j < k; j++) {
        double s = 0; /* what k_bias_grad does: the groups, then their sums in order */
        for (int g = 0; g < kBiasGroups; g++) s += bias_grad_group(dy.data(), n, k, j, g);
        long double want = 0, a = 0;
        for (int r = 0; r < n; r++) want += dy[(size_t)r * k + j], a += fabsf(dy[(size_t)r * k + j]);
        bad += !(fabsl((float)s - want) <= kF * fabsl(want) + n * kD * a + (n == 0 ? 0 : 1e-38));
      }
      CHECK(bad == 0, "bias grad n %d k %d: %zu columns off", n, k, bad);
    }
}

/* ---- loss ---------------------------------------------------------------------------------------------- */
/* What k_loss_rows computes for one row (the block's split, replayed). */
double replay_loss_row(const float *z, int k, int label, double s, int n, float *g) {
  float mx = -INFINITY;
  double se[kLossThreads], zs[kLossThreads];
  for (int t = 0; t < kLossThreads; t++) {
    const float m = loss_thread_max(z, k, t, kLossThreads);
    mx = m > mx ? m : mx;
  }
  for (int t = 0; t < kLossThreads; t++) loss_thread_sums(z, k, t, kLossThreads, mx, &se[t], &zs[t]);
  const double sumexp = tree_sum(se, kLossThreads), zsum = tree_sum(zs, kLossThreads);
  const double lse = loss_lse(mx, sumexp);
  for (int j = 0; j < k; j++) g[j] = loss_grad(z[j], lse, j == label, s, k, n);
  return loss_row_value(lse, z[label], zsum, s, k);
}

void test_loss(void) {
  const int ns[] = {1, 3, 7, 300};
  const int ks[] = {1, 2, 10, 37, 1000, 1001};
  for (int n : ns)
    for (int k : ks)
      for (int variant = 0; variant < 2; variant++)
        for (double s : {0.0, 0.1}) {
          if (n == 300 && k > 100) continue;
          /* variant 1: logits around +-1000, where exp() without the max subtracted overflows */
          std::vector<float> z((size_t)n * k), g((size_t)n * k), g_serial(k);
          std::vector<int32_t> labels(n);
          for (float &v : z) v = variant ? (float)(1000.0 * (rnd() & 1 ? 1 : -1) + 5 * sym()) : 4 * sym();
          for (int32_t &l : labels) l = (int32_t)(rnd() % (uint64_t)k);
          const float sf = (float)s; /* the desc's label_smoothing is a float */
          const double sd = sf;
          std::vector<float> row_loss(n);
          long double want_total = 0, abs_total = 0;
          size_t bad_g = 0, bad_row = 0;
          for (int r = 0; r < n; r++) {
            const float *zr = z.data() + (size_t)r * k;
            const double rl = replay_loss_row(zr, k, labels[r], sd, n, g.data() + (size_t)r * k);
            const double rl_serial = loss_row(zr, k, labels[r], sd, n, g_serial.data());
            row_loss[r] = (float)rl;
            /* reference: -sum_j q_j log softmax_j in long double */
            long double mx = zr[0];
            for (int j = 1; j < k; j++) mx = zr[j] > mx ? zr[j] : mx;
            long double se = 0, zabs = 0;
            for (int j = 0; j < k; j++) se += expl(zr[j] - mx), zabs += fabsl(zr[j]);
            const long double lse = mx + logl(se);
            long double want = 0, gsum = 0, gabs = 0;
            for (int j = 0; j < k; j++) {
              const long double qj = (1 - (long double)sd) * (j == labels[r]) + (long double)sd / k;
              want += qj * (lse - zr[j]);
              const long double pj = expl(zr[j] - lse), wg = (pj - qj) / n;
              const float gj = g[(size_t)r * k + j];
              /* float rounding of a double result: lse is good to a few roundings of |lse|,
               * which exp turns into a relative error of p_j; p - q rounds at 1 */
              bad_g += !(fabsl(gj - wg) <= kF * fabsl(wg) + 8 * kD * (1 + fabsl(lse) * pj) / n + 1e-38);
              bad_g += !same_bits(gj, g_serial[j]) && !(fabsf(gj - g_serial[j]) <= kF * fabsf(gj));
              gsum += gj, gabs += fabsf(gj);
            }
            /* row loss: double arithmetic on terms of size |lse| + |z| */
            const double tol = 64 * kD * (double)(fabsl(lse) + zabs / k + fabsl(zr[labels[r]]) + fabsl(mx)) + 1e-300;
            bad_row += !(fabsl(rl - want) <= tol) || !(fabs(rl - rl_serial) <= tol);
            if (bad_row == 1 && !(fabsl(rl - want) <= tol))
              fprintf(stderr, "  loss n %d k %d s %g row %d: %.17g, want %.17Lg\n", n, k, sd, r, rl, want);
            /* the gradient of a row sums to 0: sum_j (p_j - q_j) = 1 - 1 */
            CHECK(fabsl(gsum) <= 2 * kF * gabs + 8 * kD * k / n, "n %d k %d row %d: dlogits sum to %.3Lg", n, k, r, gsum);
            want_total += want, abs_total += fabsl(want);
          }
          CHECK(bad_g == 0, "loss n %d k %d variant %d s %g: %zu of dlogits off", n, k, variant, sd, bad_g);
          CHECK(bad_row == 0, "loss n %d k %d variant %d s %g: %zu row losses off", n, k, variant, sd, bad_row);
          /* the mean, as k_loss_mean: thread t adds rows t, t + B, ..., then the tree */
          double part[kLossThreads];
          for (int t = 0; t < kLossThreads; t++) {
            part[t] = 0;
            for (int i = t; i < n; i += kLossThreads) part[t] += (double)row_loss[i];
          }
          const float loss = (float)(tree_sum(part, kLossThreads) / (double)n);
          const long double want_mean = want_total / n;
          /* each row loss rounded to float, then the mean rounded */
          CHECK(fabsl(loss - want_mean) <= kF * fabsl(want_mean) + 2 * kF * abs_total / n + 1e-38,
                "loss n %d k %d variant %d s %g: %.9g, want %.12Lg", n, k, variant, sd, (double)loss, want_mean);
        }
}

} /* namespace */

int main(void) {
  test_fastdiv();
  test_chan_coverage();
  test_bn_forward();
  test_bn_backward();
  test_relu();
  test_maxpool();
  test_avgpool();
  test_bias_grad();
  test_loss();
  if (failures) {
    fprintf(stderr, "test_cudnn_kernels_host: %d of %d checks failed\n", failures, checks);
    return 1;
  }
  printf("test_cudnn_kernels_host: all %d checks passed\n", checks);
  return 0;
}
