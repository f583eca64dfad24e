/* test_cudnn_kernels_host.cu - the arithmetic of the cudnn backend's kernels
 * (model/cudnn_kernels_math.cuh) run on the host, against independent
 * references written here in long double.  Host code only: no GPU, no kernel
 * launch.  Where the kernels split work over threads and blocks (the
 * per-channel sums, the loss row, the average pool), the test replays the same
 * split serially (pieces, threads, the pairwise tree), so index mistakes show up
 * as missing or doubled values, not only arithmetic ones.
 *
 * Every test that touches activations runs twice: with float activations and
 * with bf16 ones (loads widened to float, stores rounded once, as the kernels'
 * gwk::widen / gwk::narrow).  A bf16 store is checked two ways: its bits must be
 * this file's own rounding (test_bf16: rint on the scaled value, not bit
 * tricks) of the float the same arithmetic gives, and its value must be within
 * bf16 rounding of the long-double reference.  The vector paths (load4 / store4
 * quads, load8 / store8 octets: the packing of bf16 pairs into words) are
 * replayed and must give the same bits as the element-wise path.
 *
 * Tolerances are stated where they are checked; each is the output's rounding
 * (float, or bf16 after float) plus a bound on the double arithmetic before it.
 * Exit 0 when everything holds, 1 (with what failed) otherwise. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cudnn_kernels_math.cuh"
#include "half.h"

using namespace gwk;

namespace {

int failures, checks;
constexpr double kF = 5.9604644775390625e-08; /* 2^-24: float rounding, relative */
constexpr double kD = 1.1102230246251565e-16; /* 2^-53: double rounding, relative */
/* A bf16 store of a double result: rounded to float, then to bf16 (8 bits):
 * within 2^-8 + 2^-24 (+ their product) of the double, relative. */
constexpr double kB = 3.90625e-03 + 1.2e-7;

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

uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

/* ---- the reference bf16 ----------------------------------------------------------------------------
 * Written from the format, not from the kernels' bit arithmetic: a bf16 is
 * sign, 8 exponent bits, 7 fraction bits (float32's upper half).  Rounding
 * scales |f| so the last kept bit is the units digit and rounds with rint (the
 * default mode: to nearest, ties to even); a NaN keeps its sign and its 7 upper
 * fraction bits and gets the quiet bit (the bf16 fraction's top bit). */
double ref_bf16_value(uint16_t h) { /* NaN for every NaN pattern */
  const int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  double v;
  if (e == 0xff) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp((double)m, -133); /* subnormal: m * 2^-126 / 2^7 */
  else v = ldexp(128.0 + m, e - 127 - 7);
  return sign ? -v : v;
}
uint16_t ref_bf16_round(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = (uint16_t)((u >> 31) << 15);
  if (f != f) return (uint16_t)(sign | 0x7f80u | 0x40u | ((u >> 16) & 0x7fu));
  const double a = fabs((double)f);
  if (a == INFINITY) return (uint16_t)(sign | 0x7f80u);
  if (a == 0) return sign;
  int e;
  frexp(a, &e);                           /* a in [2^(e-1), 2^e) */
  const int qe = e - 8 > -133 ? e - 8 : -133; /* 8 significant bits; no smaller step than 2^-133 */
  const double v = ldexp(rint(ldexp(a, -qe)), qe);
  if (v >= 0x1p128) return (uint16_t)(sign | 0x7f80u); /* overflow: inf */
  const uint32_t vb = bits_of((float)v);                /* exact: 8 bits */
  if (vb & 0xffffu) {
    fprintf(stderr, "ref_bf16_round(%a): %a is no bf16\n", (double)f, v);
    abort();
  }
  return (uint16_t)(sign | (vb >> 16));
}

/* Per activation type: the value of an element (by the reference), the element
 * a value rounds to (by the reference), whether a stored element is the
 * reference rounding of a float, and the relative tolerance of a stored result. */
template <class T>
struct Act;
template <>
struct Act<float> {
  static constexpr const char *name = "f32";
  static constexpr double kO = kF;
  static float val(float v) { return v; }
  static float make(double v) { return (float)v; }
  static bool stored(float t, float f) { return same_bits(t, f) || (t != t && f != f); }
};
template <>
struct Act<bf16> {
  static constexpr const char *name = "bf16";
  static constexpr double kO = kB;
  static float val(bf16 v) { return (float)ref_bf16_value(v.bits); }
  static bf16 make(double v) { return bf16{ref_bf16_round((float)v)}; }
  static bool stored(bf16 t, float f) { return t.bits == ref_bf16_round(f); }
};

template <class T>
bool same_elems(const std::vector<T> &a, const std::vector<T> &b) {
  /* (empty vectors have no data pointer, which memcmp may not be given) */
  return a.size() == b.size() && (a.empty() || memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/* ---- the bf16 conversion itself --------------------------------------------------------------------- */
void test_bf16(void) {
  /* widening: every pattern, exactly (a NaN keeps all its bits) */
  size_t bad_w = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = widen(bf16{(uint16_t)h});
    const double want = ref_bf16_value((uint16_t)h);
    const bool ok = want != want ? (f != f && bits_of(f) == h << 16)
                                 : ((double)f == want && (bits_of(f) >> 31) == (h >> 15));
    if (!ok && bad_w++ < 3) fprintf(stderr, "  widen(0x%04x) = %a, want %a\n", h, (double)f, want);
  }
  CHECK(bad_w == 0, "%zu of 65536 bf16 patterns widened wrongly", bad_w);

  /* rounding: around every bf16 pattern (h << 16 plus low halves: exact, just
   * above, below / at / above the tie, just below the next), then random floats;
   * each against the reference, model/half.h (the cpu backend's) and, but for
   * NaN, cuda_bf16.h's host __float2bfloat16_rn */
  const uint32_t lows[] = {0, 1, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xfffe, 0xffff};
  size_t bad_r = 0, bad_half = 0, bad_nv = 0, cases = 0;
  auto one = [&](uint32_t u) {
    const float f = float_of(u);
    const uint16_t got = f32_to_bf16_bits(f), want = ref_bf16_round(f);
    cases++;
    if (got != want && bad_r++ < 5) fprintf(stderr, "  bf16(0x%08x) = 0x%04x, want 0x%04x\n", u, got, want);
    bad_half += got != gw_f32_to_bf16(f);
    if (f == f) {
      const __nv_bfloat16 nv = __float2bfloat16_rn(f);
      uint16_t nb;
      memcpy(&nb, &nv, sizeof nb);
      bad_nv += nb != got;
    }
    bad_r += narrow<bf16>(f).bits != got;
  };
  for (uint32_t h = 0; h < 65536; h++) {
    for (uint32_t lo : lows) one(h << 16 | lo);
    one(h << 16 | (uint32_t)(rnd() & 0xffff));
  }
  for (int i = 0; i < 2000000; i++) one((uint32_t)rnd());
  CHECK(bad_r == 0, "%zu of %zu floats rounded to bf16 wrongly", bad_r, cases);
  CHECK(bad_half == 0, "%zu of %zu floats rounded differently from model/half.h", bad_half, cases);
  CHECK(bad_nv == 0, "%zu of %zu non-NaN floats rounded differently from __float2bfloat16_rn", bad_nv, cases);

  /* named cases, the expected bits written out */
  const struct {
    uint32_t f;
    uint16_t b;
    const char *what;
  } named[] = {
      {0x3f800000, 0x3f80, "1"},
      {0x3f808000, 0x3f80, "1 + 2^-8: a tie, to the even 1"},
      {0x3f818000, 0x3f82, "a tie from an odd bf16: up to even"},
      {0x3f808001, 0x3f81, "just above a tie: up"},
      {0x3f807fff, 0x3f80, "just below a tie: down"},
      {0xbf818000, 0xbf82, "a negative tie: to even, away from 0"},
      {0x7f7fffff, 0x7f80, "FLT_MAX: overflows to inf"},
      {0x7f7f7fff, 0x7f7f, "just below the tie at the top: the largest bf16"},
      {0x7f7f8000, 0x7f80, "the tie at the top: to even, inf"},
      {0xff7fffff, 0xff80, "-FLT_MAX: -inf"},
      {0x7f800000, 0x7f80, "inf"},
      {0xff800000, 0xff80, "-inf"},
      {0x80000000, 0x8000, "-0"},
      {0x00000001, 0x0000, "the smallest float denormal: 0"},
      {0x00008000, 0x0000, "a denormal tie: to the even 0"},
      {0x00018000, 0x0002, "a denormal tie from an odd: up"},
      {0x00010000, 0x0001, "the smallest bf16 denormal"},
      {0x807fffff, 0x8080, "the largest negative float denormal: up to -2^-126"},
      {0x7fc00000, 0x7fc0, "the quiet NaN"},
      {0x7f800001, 0x7fc0, "a signaling NaN with a low payload: quiet"},
      {0xff812345, 0xffc1, "a negative signaling NaN: sign and upper payload kept, quiet"},
      {0x7fffffff, 0x7fff, "a NaN with every bit"},
  };
  for (const auto &c : named) {
    const uint16_t got = f32_to_bf16_bits(float_of(c.f));
    CHECK(got == c.b, "bf16(0x%08x) = 0x%04x, want 0x%04x (%s)", c.f, got, c.b, c.what);
  }

  /* the vector packing: quads and octets against element by element */
  alignas(16) bf16 in[64], out4[64], out8[64], want[64];
  alignas(16) float fin[64];
  for (int i = 0; i < 64; i++) {
    in[i].bits = (uint16_t)rnd();
    fin[i] = float_of((uint32_t)rnd());
    want[i] = narrow<bf16>(fin[i]);
  }
  size_t bad_v = 0;
  for (int i = 0; i < 64; i += 8) {
    const Vals<8> v8 = load8(in + i);
    const Quad a = load4(in + i), b = load4(in + i + 4);
    for (int l = 0; l < 8; l++) {
      const uint32_t w = bits_of(widen(in[i + l]));
      bad_v += bits_of(v8.v[l]) != w;
      bad_v += bits_of(l < 4 ? a.v[l] : b.v[l - 4]) != w;
    }
    Vals<8> f8;
    Quad fa, fb;
    for (int l = 0; l < 8; l++) f8.v[l] = fin[i + l], (l < 4 ? fa.v[l] : fb.v[l - 4]) = fin[i + l];
    store8(out8 + i, f8);
    store4(out4 + i, fa);
    store4(out4 + i + 4, fb);
  }
  CHECK(bad_v == 0, "%zu bf16 vector loads differ from the elements", bad_v);
  CHECK(memcmp(out8, want, sizeof want) == 0, "store8 of bf16 differs from the elements");
  CHECK(memcmp(out4, want, sizeof want) == 0, "store4 of bf16 differs from the elements");
}

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

/* x [n, c, h, w] of T: channel ch centered at center[ch] with spread spread[ch]. */
template <class T>
std::vector<T> make_x(const Shape &sh, const std::vector<double> &center, const std::vector<double> &spread) {
  const size_t hw = (size_t)sh.h * sh.w;
  std::vector<T> x((size_t)sh.n * sh.c * hw);
  for (int s = 0; s < sh.n; s++)
    for (int ch = 0; ch < sh.c; ch++)
      for (size_t i = 0; i < hw; i++)
        x[((size_t)s * sh.c + ch) * hw + i] = Act<T>::make(center[ch] + spread[ch] * sym());
  return x;
}

/* The bn forward pieces: sums, stats, running update, apply (train and infer). */
template <class T>
void test_bn_forward(void) {
  typedef Act<T> A;
  const double eps = 1e-5, mom = 0.1;
  for (const Shape &sh : kBnShapes) {
    const size_t hw = (size_t)sh.h * sh.w, m = (size_t)sh.n * hw, total = m * sh.c;
    std::vector<double> center(sh.c), spread(sh.c);
    for (int ch = 0; ch < sh.c; ch++) {
      /* channel 0: mean far larger than the spread (1e5 times for float; bf16
       * steps by 4 near 1000, so there 30 times); others ordinary */
      center[ch] = ch == 0 ? 1000.0 : 0.5 * sym();
      spread[ch] = ch == 0 ? (sizeof(T) == 2 ? 30.0 : 0.01) : 0.2 + unif();
    }
    const std::vector<T> x = make_x<T>(sh, center, spread);

    std::vector<double> sums, sums_vec;
    SumsAcc<T> proto = {x.data(), 0, 0};
    replay_chan(proto, [](SumsAcc<T> &, int) {}, sh.n, sh.c, (uint32_t)hw, false, sums);
    if (hw % 4 == 0) {
      replay_chan(proto, [](SumsAcc<T> &, int) {}, sh.n, sh.c, (uint32_t)hw, true, sums_vec);
      CHECK(same_elems(sums, sums_vec),
            "%s [%d,%d,%d,%d]: the quad path summed differently", A::name, sh.n, sh.c, sh.h, sh.w);
    }

    /* apply, whole tensor: element by element (k_chan_elem's one) and by quads within planes (its quad) */
    std::vector<T> y1(total), y4(total), yi1(total), yi4(total);
    for (int ch = 0; ch < sh.c; ch++) {
      long double rs = 0, rs2 = 0, ra = 0, ra2 = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const long double v = A::val(x[((size_t)s * sh.c + ch) * hw + i]);
          rs += v, rs2 += v * v, ra += fabsl(v), ra2 += v * v;
        }
      /* sums: any order of m double additions is within m * 2^-53 * sum|terms| */
      const double tol1 = (double)m * kD * (double)ra + 1e-300, tol2 = (double)m * kD * (double)ra2 + 1e-300;
      CHECK(fabs(sums[ch] - (double)rs) <= tol1, "%s [%d,%d,%d,%d] ch %d: sum x %.17g, want %.17Lg", A::name, sh.n,
            sh.c, sh.h, sh.w, ch, sums[ch], rs);
      CHECK(fabs(sums[sh.c + ch] - (double)rs2) <= tol2, "%s [%d,%d,%d,%d] ch %d: sum x^2 %.17g, want %.17Lg",
            A::name, sh.n, sh.c, sh.h, sh.w, ch, sums[sh.c + ch], rs2);

      /* stats against the two-pass reference (the cpu backend's form) */
      const long double mean = rs / m;
      long double ss = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const long double dv = A::val(x[((size_t)s * sh.c + ch) * hw + i]) - mean;
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
      CHECK(fabsl(rstd_f - rstd) <= rstd_rel * rstd, "%s [%d,%d,%d,%d] ch %d: rstd %.9g, want %.12Lg (rel tol %.3g)",
            A::name, sh.n, sh.c, sh.h, sh.w, ch, (double)rstd_f, rstd, rstd_rel);
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
      size_t bad = 0, bad_i = 0, bad_round = 0;
      for (int s = 0; s < sh.n; s++) {
        const size_t base = ((size_t)s * sh.c + ch) * hw;
        for (size_t i = 0; i < hw; i++) {
          const float xv = A::val(x[base + i]);
          const float yf = bn_affine_apply(widen(x[base + i]), af), yif = bn_affine_apply(widen(x[base + i]), ai);
          y1[base + i] = narrow<T>(yf), yi1[base + i] = narrow<T>(yif);
          bad_round += !A::stored(y1[base + i], yf) + !A::stored(yi1[base + i], yif);
          const long double want = ((long double)xv - mean_f) * rstd_f * gamma + beta;
          /* the output's rounding plus the double terms' rounding (x * scale and shift are large where mean is) */
          const double tol = A::kO * fabsl(want) + 4 * kD * (fabs(xv * af.scale) + fabs(af.shift)) + 1e-38;
          bad += !(fabsl(A::val(y1[base + i]) - want) <= tol);
          const long double want_i = ((long double)xv - rm_f) / sqrtl((long double)rv_f + eps) * gamma + beta;
          const double tol_i = A::kO * fabsl(want_i) + 4 * kD * (fabs(xv * ai.scale) + fabs(ai.shift)) + 1e-38;
          bad_i += !(fabsl(A::val(yi1[base + i]) - want_i) <= tol_i);
        }
        for (size_t i = 0; hw % 4 == 0 && i < hw; i += 4) {
          Quad q = load4(x.data() + base + i), qi = q;
          for (int l = 0; l < 4; l++) q.v[l] = bn_affine_apply(q.v[l], af), qi.v[l] = bn_affine_apply(qi.v[l], ai);
          store4(y4.data() + base + i, q);
          store4(yi4.data() + base + i, qi);
        }
      }
      CHECK(bad == 0, "%s [%d,%d,%d,%d] ch %d: %zu training outputs off", A::name, sh.n, sh.c, sh.h, sh.w, ch, bad);
      CHECK(bad_i == 0, "%s [%d,%d,%d,%d] ch %d: %zu inference outputs off", A::name, sh.n, sh.c, sh.h, sh.w, ch,
            bad_i);
      CHECK(bad_round == 0, "%s [%d,%d,%d,%d] ch %d: %zu outputs not the rounding of the float result", A::name,
            sh.n, sh.c, sh.h, sh.w, ch, bad_round);
    }
    if (hw % 4 == 0)
      CHECK(same_elems(y1, y4) && same_elems(yi1, yi4), "%s [%d,%d,%d,%d]: the quad path applied differently",
            A::name, sh.n, sh.c, sh.h, sh.w);
  }
}

/* bn_stats on its own (no activations) */
void test_bn_stats_edges(void) {
  const double eps = 1e-5;
  /* A constant channel: var 0 exactly (clamped, never negative), rstd = 1 / sqrt(eps). */
  const BnStats z = bn_stats_from_sums(3 * 0.1f, 3 * (double)0.1f * (double)0.1f, 3, eps);
  CHECK(z.var >= 0 && fabs(z.rstd - 1 / sqrt(z.var + eps)) <= 4 * kD * z.rstd, "var %.17g rstd %.17g", z.var,
        z.rstd);
  const BnStats neg = bn_stats_from_sums(1.0, 0.9, 1.0, eps); /* s2 / count < mean^2: clamped */
  CHECK(neg.var == 0 && neg.rstd == 1 / sqrt(eps), "var %.17g", neg.var);
  const BnStats nan_in = bn_stats_from_sums(NAN, 1.0, 2.0, eps);
  CHECK(nan_in.var != nan_in.var && nan_in.rstd != nan_in.rstd, "a NaN input must stay NaN");
}

template <class T>
void test_bn_backward(void) {
  typedef Act<T> A;
  for (const Shape &sh : kBnShapes) {
    const size_t hw = (size_t)sh.h * sh.w, m = (size_t)sh.n * hw, total = m * sh.c;
    std::vector<double> center(sh.c), spread(sh.c, 1.0);
    for (int ch = 0; ch < sh.c; ch++) center[ch] = ch == 0 ? 200.0 : sym();
    const std::vector<T> x = make_x<T>(sh, center, spread);
    std::vector<T> dy(total);
    std::vector<float> mean(sh.c), rstd(sh.c), gamma(sh.c);
    for (T &g : dy) g = A::make(sym());
    for (int ch = 0; ch < sh.c; ch++)
      mean[ch] = (float)center[ch] + 0.01f * sym(), rstd[ch] = 1.7f + sym(), gamma[ch] = 0.5f + (float)unif();

    std::vector<double> sums, sums_vec;
    BwdSumsAcc<T> proto = {x.data(), dy.data(), 0, 0, 0, 0};
    auto setup = [&](BwdSumsAcc<T> &a, int ch) { a.mean = mean[ch], a.rstd = rstd[ch]; };
    replay_chan(proto, setup, sh.n, sh.c, (uint32_t)hw, false, sums);
    if (hw % 4 == 0) {
      replay_chan(proto, setup, sh.n, sh.c, (uint32_t)hw, true, sums_vec);
      CHECK(same_elems(sums, sums_vec),
            "%s [%d,%d,%d,%d]: the quad path summed differently", A::name, sh.n, sh.c, sh.h, sh.w);
    }
    std::vector<T> dx1(total), dx4(total);
    for (int ch = 0; ch < sh.c; ch++) {
      long double sdy = 0, sdyx = 0, ady = 0, adyx = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const size_t o = ((size_t)s * sh.c + ch) * hw + i;
          const long double g = A::val(dy[o]), xh = ((long double)A::val(x[o]) - mean[ch]) * rstd[ch];
          sdy += g, sdyx += g * xh, ady += fabsl(g), adyx += fabsl(g * xh);
        }
      /* the per-term xhat is rounded in double too: one more rounding per term */
      CHECK(fabs(sums[ch] - (double)sdy) <= m * kD * (double)ady + 1e-300, "%s ch %d: sum dy %.17g, want %.17Lg",
            A::name, ch, sums[ch], sdy);
      CHECK(fabs(sums[sh.c + ch] - (double)sdyx) <= (m + 2) * kD * (double)adyx + 1e-300,
            "%s ch %d: sum dy xhat %.17g, want %.17Lg", A::name, ch, sums[sh.c + ch], sdyx);

      const BnBwd p = bn_bwd_channel(gamma[ch], mean[ch], rstd[ch], sums[ch], sums[sh.c + ch], (double)m);
      const long double k = (long double)gamma[ch] * rstd[ch], a = sdy / m, b = sdyx / m;
      size_t bad = 0, bad_round = 0;
      for (int s = 0; s < sh.n; s++) {
        const size_t base = ((size_t)s * sh.c + ch) * hw;
        for (size_t i = 0; i < hw; i++) {
          const size_t o = base + i;
          const float f = bn_bwd_apply(widen(x[o]), widen(dy[o]), p);
          dx1[o] = narrow<T>(f);
          bad_round += !A::stored(dx1[o], f);
          const long double g = A::val(dy[o]), xh = ((long double)A::val(x[o]) - mean[ch]) * rstd[ch];
          const long double want = k * (g - a - xh * b);
          const double tol =
              A::kO * fabsl(want) + 8 * kD * fabsl(k) * (fabsl(g) + fabsl(a) + fabsl(xh * b)) + 1e-38;
          bad += !(fabsl(A::val(dx1[o]) - want) <= tol);
        }
        for (size_t i = 0; hw % 4 == 0 && i < hw; i += 4) {
          const Quad qx = load4(x.data() + base + i), qg = load4(dy.data() + base + i);
          Quad r;
          for (int l = 0; l < 4; l++) r.v[l] = bn_bwd_apply(qx.v[l], qg.v[l], p);
          store4(dx4.data() + base + i, r);
        }
      }
      CHECK(bad == 0, "%s [%d,%d,%d,%d] ch %d: %zu of dx off", A::name, sh.n, sh.c, sh.h, sh.w, ch, bad);
      CHECK(bad_round == 0, "%s [%d,%d,%d,%d] ch %d: %zu of dx not the rounding of the float result", A::name, sh.n,
            sh.c, sh.h, sh.w, ch, bad_round);
    }
    if (hw % 4 == 0)
      CHECK(same_elems(dx1, dx4), "%s [%d,%d,%d,%d]: the quad path gave other dx", A::name, sh.n, sh.c, sh.h, sh.w);
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

  /* bf16, every pattern: y = x for x > 0 and for a NaN (made quiet), else +0;
   * dx = dy where y > 0, else +0 */
  size_t bad = 0, bad_b = 0;
  const uint16_t dys[] = {0x3f80, 0xc0a0, 0x8001, 0x7f80};
  for (uint32_t h = 0; h < 65536; h++) {
    const double v = ref_bf16_value((uint16_t)h);
    const uint16_t want_y = v != v ? (uint16_t)(h | 0x40) : v > 0 ? (uint16_t)h : 0;
    const bf16 y = narrow<bf16>(relu(widen(bf16{(uint16_t)h})));
    bad += y.bits != want_y;
    for (uint16_t g : dys)
      bad_b += narrow<bf16>(relu_bwd(widen(bf16{(uint16_t)h}), widen(bf16{g}))).bits != (v > 0 ? g : 0);
  }
  CHECK(bad == 0, "bf16 relu: %zu of 65536 patterns wrong", bad);
  CHECK(bad_b == 0, "bf16 relu_bwd: %zu cases wrong", bad_b);
}

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

/* k_cast replayed, both directions: octets then the tail. */
void test_cast(void) {
  for (size_t n : {0, 1, 7, 8, 9, 64, 1003}) {
    std::vector<float> f(n), back(n), back8(n);
    std::vector<bf16> h(n), h8(n);
    for (float &v : f) v = float_of((uint32_t)rnd());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) h[i] = narrow<bf16>(widen(f[i])), bad += h[i].bits != ref_bf16_round(f[i]);
    for (size_t o = 0; o < n / 8; o++) store8(h8.data() + 8 * o, load8(f.data() + 8 * o));
    for (size_t i = n / 8 * 8; i < n; i++) h8[i] = narrow<bf16>(widen(f[i]));
    CHECK(bad == 0 && same_elems(h, h8), "cast f32 -> bf16 n %zu: %zu wrong", n, bad);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
      back[i] = narrow<float>(widen(h[i]));
      const double want = ref_bf16_value(h[i].bits);
      bad += !(want != want ? (back[i] != back[i] && bits_of(back[i]) == (uint32_t)h[i].bits << 16)
                            : (double)back[i] == want);
    }
    for (size_t o = 0; o < n / 8; o++) store8(back8.data() + 8 * o, load8(h.data() + 8 * o));
    for (size_t i = n / 8 * 8; i < n; i++) back8[i] = narrow<float>(widen(h[i]));
    CHECK(bad == 0 && same_elems(back, back8), "cast bf16 -> f32 n %zu: %zu wrong", n, bad);
  }
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
      for (size_t o = 0; o < (size_t)p * q; o++) acc[(size_t)arg[o]] += dyf[o];
      size_t bad_dx = 0;
      for (int ih = 0; ih < h; ih++)
        for (int iw = 0; iw < w; iw++) {
          const T g = narrow<T>(maxpool_gather(dy.data(), arg.data(), p, q, ih, iw, w, ps.kernel, ps.stride, ps.pad));
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
}

} /* namespace */

int main(void) {
  test_bf16();
  test_fastdiv();
  test_chan_coverage();
  test_bn_stats_edges();
  test_bn_forward<float>();
  test_bn_forward<bf16>();
  test_bn_backward<float>();
  test_bn_backward<bf16>();
  test_relu();
  test_flat<float>();
  test_flat<bf16>();
  test_cast();
  test_maxpool<float>();
  test_maxpool<bf16>();
  test_avgpool<float>();
  test_avgpool<bf16>();
  test_bias<float>();
  test_bias<bf16>();
  test_loss<float>();
  test_loss<bf16>();
  if (failures) {
    fprintf(stderr, "test_cudnn_kernels_host: %d of %d checks failed\n", failures, checks);
    return 1;
  }
  printf("test_cudnn_kernels_host: all %d checks passed\n", checks);
  return 0;
}
