/* test_cudnn_kernels_host_layers.cu - the second half of the cudnn-kernels-host
 * test (see test_cudnn_kernels_host.cu): the flat ops (ReLU, its backward, the
 * residual add), the casts, max and average pooling, the fc bias and the loss,
 * replayed on the host against long-double references. */
#include "cudnn_host_common.cuh"

using namespace gwt;

namespace {

/* k_flat replayed: octets (load8 / store8) over n / 8 of them, then the tail
 * element by element; the same bits as all element by element. */
template <class T, class F>
void flat_replay(F f, bool binary, size_t n, const T *a, const T *b, T *out, bool vec) {
  const size_t noct = vec ? n / 8 : 0;
  for (size_t o = 0; o < noct; o++) {
    const Vals<8> x = load8(a + 8 * o), y = binary ? load8(b + 8 * o) : x;
    Vals<8> r;
    for (int l = 0; l < 8; l++) r.v[l] = f(x.v[l], y.v[l]);
    store8(out + 8 * o, r);
  }
  for (size_t i = 8 * noct; i < n; i++) {
    const float x = widen(a[i]);
    out[i] = narrow<T>(f(x, binary ? widen(b[i]) : x));
  }
}

/* relu, relu_bwd and add over flat arrays (with NaN, inf, zeros, denormals,
 * and sums that round), against the reference per element. */
template <class T>
void test_flat(void) {
  typedef Act<T> A;
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1001}) {
    std::vector<T> a(n), b(n), y1(n), y8(n);
    std::vector<float> af(n), bf(n);
    for (size_t i = 0; i < n; i++) {
      const uint64_t r = rnd() % 40;
      const double v = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -0.0 : r == 3 ? 1e-39 : 8 * sym();
      a[i] = A::make(v), b[i] = A::make(r == 4 ? -v : 8 * sym());
      af[i] = A::val(a[i]), bf[i] = A::val(b[i]);
    }
    auto fr = [](float x, float) { return relu(x); };
    auto fb = [](float y, float g) { return relu_bwd(y, g); };
    auto fa = [](float x, float z) { return add_rn(x, z); };
    size_t bad = 0;
    flat_replay<T>(fr, false, n, a.data(), b.data(), y1.data(), false);
    flat_replay<T>(fr, false, n, a.data(), b.data(), y8.data(), true);
    for (size_t i = 0; i < n; i++) bad += !A::stored(y1[i], af[i] > 0 || af[i] != af[i] ? af[i] : 0.0f);
    CHECK(bad == 0 && same_elems(y1, y8), "%s relu n %zu: %zu wrong, octets %s", A::name, n, bad,
          same_elems(y1, y8) ? "agree" : "differ");
    flat_replay<T>(fb, true, n, a.data(), b.data(), y1.data(), false);
    flat_replay<T>(fb, true, n, a.data(), b.data(), y8.data(), true);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += !A::stored(y1[i], af[i] > 0 ? bf[i] : 0.0f);
    CHECK(bad == 0 && same_elems(y1, y8), "%s relu_bwd n %zu: %zu wrong", A::name, n, bad);
    flat_replay<T>(fa, true, n, a.data(), b.data(), y1.data(), false);
    flat_replay<T>(fa, true, n, a.data(), b.data(), y8.data(), true);
    bad = 0;
    /* a + b in double is exactly rounded to float by (float) (double has more than 2 * 24 + 2 bits) */
    for (size_t i = 0; i < n; i++) bad += !A::stored(y1[i], (float)((double)af[i] + (double)bf[i]));
    CHECK(bad == 0 && same_elems(y1, y8), "%s add n %zu: %zu wrong", A::name, n, bad);
  }
}

/* k_cast replayed, both directions, for each 16-bit type: octets then the tail. */
template <class H>
void test_cast_to(void) {
  typedef Act<H> A;
  for (size_t n : {0, 1, 7, 8, 9, 64, 1003}) {
    std::vector<float> f(n), back(n), back8(n);
    std::vector<H> h(n), h8(n);
    for (float &v : f) v = float_of((uint32_t)rnd());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) h[i] = narrow<H>(widen(f[i])), bad += !A::stored(h[i], f[i]);
    for (size_t o = 0; o < n / 8; o++) store8(h8.data() + 8 * o, load8(f.data() + 8 * o));
    for (size_t i = n / 8 * 8; i < n; i++) h8[i] = narrow<H>(widen(f[i]));
    CHECK(bad == 0 && same_elems(h, h8), "cast f32 -> %s n %zu: %zu wrong", A::name, n, bad);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
      back[i] = narrow<float>(widen(h[i]));
      const double want = A::val(h[i]);
      bad += !(want != want ? back[i] != back[i] : (double)back[i] == want);
    }
    for (size_t o = 0; o < n / 8; o++) store8(back8.data() + 8 * o, load8(h.data() + 8 * o));
    for (size_t i = n / 8 * 8; i < n; i++) back8[i] = narrow<float>(widen(h[i]));
    CHECK(bad == 0 && same_elems(back, back8), "cast %s -> f32 n %zu: %zu wrong", A::name, n, bad);
  }
}

void test_cast(void) {
  test_cast_to<bf16>();
  test_cast_to<f16>();
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

template <class T>
void test_maxpool(void) {
  typedef Act<T> A;
  for (const PoolShape &ps : kPools) {
    const int h = ps.h, w = ps.w, p = (h + 2 * ps.pad - ps.kernel) / ps.stride + 1;
    const int q = (w + 2 * ps.pad - ps.kernel) / ps.stride + 1;
    for (int variant = 0; variant < 3; variant++) {
      /* 0: ties (values in {0..3}) with NaN and -inf sprinkled; 1: random values
       * (in bf16 with many ties too); 2: all -inf */
      std::vector<T> x((size_t)h * w);
      std::vector<float> xf((size_t)h * w);
      for (size_t i = 0; i < x.size(); i++) {
        double v;
        if (variant == 2) {
          v = -INFINITY;
        } else if (variant == 0) {
          const uint64_t r = rnd() % 100;
          v = r < 3 ? NAN : r < 6 ? -INFINITY : (double)(r % 4);
        } else {
          v = sym();
        }
        x[i] = A::make(v), xf[i] = A::val(x[i]);
      }
      std::vector<T> y((size_t)p * q), dy((size_t)p * q);
      std::vector<float> dyf((size_t)p * q);
      std::vector<int32_t> arg((size_t)p * q);
      size_t bad = 0;
      for (int oh = 0; oh < p; oh++)
        for (int ow = 0; ow < q; ow++) {
          const size_t o = (size_t)oh * q + ow;
          y[o] = narrow<T>(maxpool_window(x.data(), h, w, oh, ow, ps.kernel, ps.stride, ps.pad, &arg[o]));
          const int32_t want = ref_argmax(xf.data(), h, w, oh * ps.stride - ps.pad, ow * ps.stride - ps.pad, ps.kernel);
          const bool ok = arg[o] == want && want >= 0 && A::stored(y[o], xf[(size_t)want]);
          if (!ok && bad++ < 3)
            fprintf(stderr, "  %s maxpool %dx%d k%d s%d p%d variant %d at (%d,%d): argmax %d, want %d\n", A::name, h,
                    w, ps.kernel, ps.stride, ps.pad, variant, oh, ow, arg[o], want);
          dy[o] = A::make(sym()), dyf[o] = A::val(dy[o]);
        }
      CHECK(bad == 0, "%s maxpool %dx%d k%d s%d p%d variant %d: %zu outputs wrong", A::name, h, w, ps.kernel,
            ps.stride, ps.pad, variant, bad);

      /* backward: the gather against a scatter over the outputs in row-major order,
       * both in double: the same additions in the same order, so the same bits
       * (then rounded to float, then to T) */
      std::vector<double> acc((size_t)h * w, 0.0);
      const FastDiv sd = fastdiv_make((uint32_t)ps.stride);
      for (size_t o = 0; o < (size_t)p * q; o++) acc[(size_t)arg[o]] += dyf[o];
      size_t bad_dx = 0;
      for (int ih = 0; ih < h; ih++)
        for (int iw = 0; iw < w; iw++) {
          const T g = narrow<T>(maxpool_gather(dy.data(), arg.data(), p, q, ih, iw, w, ps.kernel, sd, ps.pad));
          bad_dx += !A::stored(g, (float)acc[(size_t)ih * w + iw]);
        }
      CHECK(bad_dx == 0, "%s maxpool bwd %dx%d k%d s%d p%d variant %d: %zu of dx differ from the scatter", A::name,
            h, w, ps.kernel, ps.stride, ps.pad, variant, bad_dx);
    }
  }
  /* Ties: a plane of equal values gives every window's first in-plane position. */
  const T ones[9] = {A::make(1), A::make(1), A::make(1), A::make(1), A::make(1),
                     A::make(1), A::make(1), A::make(1), A::make(1)};
  int32_t a = -2;
  maxpool_window(ones, 3, 3, 0, 0, 3, 2, 1, &a);
  CHECK(a == 0, "%s tie at the corner window: %d", A::name, a);
  maxpool_window(ones, 3, 3, 1, 1, 3, 2, 1, &a);
  CHECK(a == 4, "%s tie at window (1,1) (rows 1-3, cols 1-3 clipped): %d", A::name, a);
  /* A window entirely in the padding: -inf and -1. */
  const T v = narrow<T>(maxpool_window(ones, 3, 3, 0, 0, 1, 1, 1, &a));
  CHECK(a == -1 && A::val(v) == -INFINITY, "%s padding-only window: %d %g", A::name, a, (double)A::val(v));
}

/* ---- global average pool --------------------------------------------------------------------------- */
template <class T>
void test_avgpool(void) {
  typedef Act<T> A;
  const uint32_t hws[] = {1, 7, 31, 32, 33, 49, 64, 100, 1000, 12544};
  for (uint32_t hw : hws) {
    for (int variant = 0; variant < 2; variant++) {
      std::vector<T> x(hw);
      for (T &v : x) v = A::make(variant ? 1000.0f + (sizeof(T) == 2 ? 40.0f : 0.001f) * sym() : sym());
      double lanes[kWarp];
      for (int l = 0; l < kWarp; l++) lanes[l] = avgpool_lane_sum(x.data(), hw, l);
      const float yf = avgpool_finish(tree_sum(lanes, kWarp), hw);
      const T y = narrow<T>(yf);
      long double s = 0, a = 0;
      for (T v : x) s += A::val(v), a += fabsf(A::val(v));
      const long double want = s / hw;
      CHECK(fabsl(A::val(y) - want) <= A::kO * fabsl(want) + hw * kD * a / hw + 1e-38,
            "%s avgpool hw %u: %.9g, want %.12Lg", A::name, hw, (double)A::val(y), want);
      CHECK(A::stored(y, yf), "%s avgpool hw %u: not the rounding of %.9g", A::name, hw, (double)yf);
    }
    const T g = A::make(0.37);
    const float gf = A::val(g);
    const T dx = narrow<T>(avgpool_bwd_value(widen(g), hw));
    CHECK(A::stored(dx, (float)((double)gf / hw)), "%s avgpool bwd hw %u", A::name, hw);
    CHECK(fabsl(A::val(dx) - (long double)gf / hw) <= A::kO * gf / hw, "%s avgpool bwd hw %u", A::name, hw);
  }
}

/* ---- fully connected bias ------------------------------------------------------------------------- */
template <class T>
void test_bias(void) {
  typedef Act<T> A;
  for (int n : {0, 1, 7, 8, 9, 256})
    for (int k : {1, 10, 33, 1000}) {
      std::vector<T> dy((size_t)n * k), y((size_t)n * k);
      std::vector<float> b(k);
      for (T &v : dy) v = A::make(sym());
      for (float &v : b) v = sym();
      size_t bad = 0, bad_add = 0;
      for (int j = 0; j < k; j++) {
        double s = 0; /* what k_bias_grad does: the groups, then their sums in order */
        for (int g = 0; g < kBiasGroups; g++) s += bias_grad_group(dy.data(), n, k, j, g);
        long double want = 0, a = 0;
        for (int r = 0; r < n; r++) {
          const float v = A::val(dy[(size_t)r * k + j]);
          want += v, a += fabsf(v);
        }
        bad += !(fabsl((float)s - want) <= kF * fabsl(want) + n * kD * a + (n == 0 ? 0 : 1e-38));
        /* bias add, as k_bias_add: y = dy + b in float, rounded once (the double sum of
         * two floats rounds to float exactly) */
        for (int r = 0; r < n; r++) {
          const size_t i = (size_t)r * k + j;
          y[i] = narrow<T>(add_rn(widen(dy[i]), b[j]));
          bad_add += !A::stored(y[i], (float)((double)A::val(dy[i]) + (double)b[j]));
        }
      }
      CHECK(bad == 0, "%s bias grad n %d k %d: %zu columns off", A::name, n, k, bad);
      CHECK(bad_add == 0, "%s bias add n %d k %d: %zu outputs wrong", A::name, n, k, bad_add);
    }
}

/* ---- loss ---------------------------------------------------------------------------------------------- */
/* What k_loss_rows computes for one row (the block's split, replayed); gf: the
 * gradient before its store, g: as stored. */
template <class T>
double replay_loss_row(const T *z, int k, int label, double s, int n, float *gf, T *g) {
  float mx = -INFINITY;
  double se[kLossThreads], zs[kLossThreads];
  for (int t = 0; t < kLossThreads; t++) {
    const float m = loss_thread_max(z, k, t, kLossThreads);
    mx = m > mx ? m : mx;
  }
  for (int t = 0; t < kLossThreads; t++) loss_thread_sums(z, k, t, kLossThreads, mx, &se[t], &zs[t]);
  const double sumexp = tree_sum(se, kLossThreads), zsum = tree_sum(zs, kLossThreads);
  const double lse = loss_lse(mx, sumexp);
  for (int j = 0; j < k; j++) gf[j] = loss_grad(widen(z[j]), lse, j == label, s, k, n), g[j] = narrow<T>(gf[j]);
  return loss_row_value(lse, widen(z[label]), zsum, s, k);
}

template <class T>
void test_loss(void) {
  typedef Act<T> A;
  const int ns[] = {1, 3, 7, 300};
  const int ks[] = {1, 2, 10, 37, 1000, 1001};
  for (int n : ns)
    for (int k : ks)
      for (int variant = 0; variant < 2; variant++)
        for (double s : {0.0, 0.1}) {
          if (n == 300 && k > 100) continue;
          /* variant 1: logits around +-1000, where exp() without the max subtracted overflows */
          std::vector<T> z((size_t)n * k), g((size_t)n * k), g_serial(k);
          std::vector<float> gf(k);
          std::vector<int32_t> labels(n);
          for (T &v : z) v = A::make(variant ? 1000.0 * (rnd() & 1 ? 1 : -1) + 5 * sym() : 4 * sym());
          for (int32_t &l : labels) l = (int32_t)(rnd() % (uint64_t)k);
          const float sf = (float)s; /* the desc's label_smoothing is a float */
          const double sd = sf;
          std::vector<float> row_loss(n);
          long double want_total = 0, abs_total = 0;
          size_t bad_g = 0, bad_row = 0, bad_round = 0;
          for (int r = 0; r < n; r++) {
            const T *zr = z.data() + (size_t)r * k;
            const double rl = replay_loss_row(zr, k, labels[r], sd, n, gf.data(), g.data() + (size_t)r * k);
            const double rl_serial = loss_row(zr, k, labels[r], sd, n, g_serial.data());
            /* A power-of-two loss scale scales each gradient exactly. */
            {
              const float mx0 = loss_thread_max(zr, k, 0, 1);
              double se0, zs0;
              loss_thread_sums(zr, k, 0, 1, mx0, &se0, &zs0);
              const double lse0 = loss_lse(mx0, se0);
              for (int j = 0; j < k; j++)
                CHECK(loss_grad(widen(zr[j]), lse0, j == labels[r], sd, k, n, 65536.0) ==
                          65536.0f * loss_grad(widen(zr[j]), lse0, j == labels[r], sd, k, n),
                      "loss_grad scaled by 65536 is not exactly 65536 times (row %d, class %d)", r, j);
            }
            row_loss[r] = (float)rl;
            /* reference: -sum_j q_j log softmax_j in long double */
            std::vector<long double> zl(k);
            for (int j = 0; j < k; j++) zl[j] = A::val(zr[j]);
            long double mx = zl[0];
            for (int j = 1; j < k; j++) mx = zl[j] > mx ? zl[j] : mx;
            long double se = 0, zabs = 0;
            for (int j = 0; j < k; j++) se += expl(zl[j] - mx), zabs += fabsl(zl[j]);
            const long double lse = mx + logl(se);
            long double want = 0, gsum = 0, gabs = 0;
            for (int j = 0; j < k; j++) {
              const long double qj = (1 - (long double)sd) * (j == labels[r]) + (long double)sd / k;
              want += qj * (lse - zl[j]);
              const long double pj = expl(zl[j] - lse), wg = (pj - qj) / n;
              const T gt = g[(size_t)r * k + j];
              const float gj = A::val(gt), gs = A::val(g_serial[j]);
              /* the output's rounding of a double result: lse is good to a few roundings of
               * |lse|, which exp turns into a relative error of p_j; p - q rounds at 1 */
              bad_g += !(fabsl(gj - wg) <= A::kO * fabsl(wg) + 8 * kD * (1 + fabsl(lse) * pj) / n + 1e-38);
              bad_g += !same_bits(gj, gs) && !(fabsf(gj - gs) <= A::kO * fabsf(gj));
              bad_round += !A::stored(gt, gf[j]);
              gsum += gj, gabs += fabsf(gj);
            }
            /* row loss: double arithmetic on terms of size |lse| + |z| */
            const double tol = 64 * kD * (double)(fabsl(lse) + zabs / k + fabsl(zl[labels[r]]) + fabsl(mx)) + 1e-300;
            bad_row += !(fabsl(rl - want) <= tol) || !(fabs(rl - rl_serial) <= tol);
            if (bad_row == 1 && !(fabsl(rl - want) <= tol))
              fprintf(stderr, "  %s loss n %d k %d s %g row %d: %.17g, want %.17Lg\n", A::name, n, k, sd, r, rl, want);
            /* the gradient of a row sums to 0: sum_j (p_j - q_j) = 1 - 1 */
            CHECK(fabsl(gsum) <= 2 * A::kO * gabs + 8 * kD * k / n, "%s n %d k %d row %d: dlogits sum to %.3Lg",
                  A::name, n, k, r, gsum);
            want_total += want, abs_total += fabsl(want);
          }
          CHECK(bad_g == 0, "%s loss n %d k %d variant %d s %g: %zu of dlogits off", A::name, n, k, variant, sd, bad_g);
          CHECK(bad_round == 0, "%s loss n %d k %d variant %d s %g: %zu of dlogits not the rounding of the float",
                A::name, n, k, variant, sd, bad_round);
          CHECK(bad_row == 0, "%s loss n %d k %d variant %d s %g: %zu row losses off", A::name, n, k, variant, sd,
                bad_row);
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
                "%s loss n %d k %d variant %d s %g: %.9g, want %.12Lg", A::name, n, k, variant, sd, (double)loss,
                want_mean);
        }
  /* A logit of -inf without smoothing (a float16 logit below -65504): a
   * finite loss, as PyTorch's (0 x the infinite smoothing term was NaN). */
  {
    const T z[3] = {A::make(0.0), A::make(-INFINITY), A::make(0.0)};
    T g[3];
    const double rl = loss_row(z, 3, 0, 0.0, 1, g);
    CHECK(fabs(rl - log(2.0)) < 1e-12, "%s loss of {0, -inf, 0} label 0 without smoothing: %.17g, want log 2",
          A::name, rl);
    CHECK(A::val(g[1]) == 0 && fabsf(A::val(g[0]) + 0.5f) < 1e-2f, "%s dlogits of {0, -inf, 0}: %g %g %g", A::name,
          (double)A::val(g[0]), (double)A::val(g[1]), (double)A::val(g[2]));
  }
}

} /* namespace */

void gwt::test_layers(void) {
  test_flat<float>();
  test_flat<bf16>();
  test_flat<f16>();
  test_cast();
  test_maxpool<float>();
  test_maxpool<bf16>();
  test_avgpool<float>();
  test_avgpool<bf16>();
  test_bias<float>();
  test_bias<bf16>();
  test_loss<float>();
  test_loss<bf16>();
}
