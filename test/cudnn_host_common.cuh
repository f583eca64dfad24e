/* cudnn_host_common.cuh - what the two files of the cudnn-kernels-host test
 * share (test_cudnn_kernels_host.cu: the conversions, the per-channel sums,
 * batch norm, ReLU's patterns and main; test_cudnn_kernels_host_layers.cu: the
 * flat ops, casts, pooling, bias and loss): the check counter, the data, the
 * reference bf16 and f16 written from the formats, and per activation type its
 * reference value, rounding and tolerance (Act<T>).  See
 * test_cudnn_kernels_host.cu for what the test is. */
#ifndef GW_TEST_CUDNN_HOST_COMMON_CUH
#define GW_TEST_CUDNN_HOST_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cudnn_kernels_math.cuh"
#include "half.h"

using namespace gwk;

namespace gwt {

extern int failures, checks; /* test_cudnn_kernels_host.cu */
constexpr double kF = 5.9604644775390625e-08; /* 2^-24: float rounding, relative */
constexpr double kD = 1.1102230246251565e-16; /* 2^-53: double rounding, relative */
/* A bf16 store of a double result: rounded to float, then to bf16 (8 bits):
 * within 2^-8 + 2^-24 (+ their product) of the double, relative. */
constexpr double kB = 3.90625e-03 + 1.2e-7;
/* The same for f16 (11 bits) where the result is a normal f16. */
constexpr double kH = 4.8828125e-04 + 1.2e-7;

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
inline uint64_t rng_state = 0x9e3779b97f4a7c15ull;
inline uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline double unif(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); } /* [0, 1) */
inline float sym(void) { return (float)(2 * unif() - 1); }                               /* [-1, 1) */

inline uint32_t bits_of(float f) { return gw_f32_bits(f); } /* half.h's */
inline float float_of(uint32_t u) { return gw_f32_from_bits(u); }
inline bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

/* ---- the reference bf16 ----------------------------------------------------------------------------
 * Written from the format, not from the kernels' bit arithmetic: a bf16 is
 * sign, 8 exponent bits, 7 fraction bits (float32's upper half).  Rounding
 * scales |f| so the last kept bit is the units digit and rounds with rint (the
 * default mode: to nearest, ties to even); a NaN keeps its sign and its 7 upper
 * fraction bits and gets the quiet bit (the bf16 fraction's top bit). */
inline double ref_bf16_value(uint16_t h) { /* NaN for every NaN pattern */
  const int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  double v;
  if (e == 0xff) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp((double)m, -133); /* subnormal: m * 2^-126 / 2^7 */
  else v = ldexp(128.0 + m, e - 127 - 7);
  return sign ? -v : v;
}
inline uint16_t ref_bf16_round(float f) {
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
/* ---- the reference f16 ---------------------------------------------------------------------------
 * From the format too: 1 sign, 5 exponent bits (bias 15), 10 fraction bits;
 * subnormals are m * 2^-24; a NaN keeps sign and upper payload, quiet. */
inline double ref_f16_value(uint16_t h) { /* NaN for every NaN pattern */
  const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0x1f) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp((double)m, -24);
  else v = ldexp(1024.0 + m, e - 15 - 10);
  return sign ? -v : v;
}
inline uint16_t ref_f16_round(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = (uint16_t)((u >> 31) << 15);
  if (f != f) return (uint16_t)(sign | 0x7c00u | 0x200u | ((u >> 13) & 0x3ffu));
  const double a = fabs((double)f);
  if (a == INFINITY) return (uint16_t)(sign | 0x7c00u);
  if (a == 0) return sign;
  int e;
  frexp(a, &e);                             /* a in [2^(e-1), 2^e) */
  const int qe = e - 11 > -24 ? e - 11 : -24; /* 11 significant bits; no smaller step than 2^-24 */
  const double v = ldexp(rint(ldexp(a, -qe)), qe);
  if (v >= 65536.0) return (uint16_t)(sign | 0x7c00u); /* 65520 and above round here: inf */
  /* encode v (exact in f16) */
  if (v < 0x1p-14) return (uint16_t)(sign | (uint16_t)ldexp(v, 24));
  int ve;
  const double fr = frexp(v, &ve); /* v = fr * 2^ve, fr in [0.5, 1) */
  const uint32_t mant = (uint32_t)ldexp(fr, 11) - 1024u;
  return (uint16_t)(sign | (uint32_t)(ve - 1 + 15) << 10 | mant);
}

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

template <>
struct Act<f16> {
  static constexpr const char *name = "f16";
  static constexpr double kO = kH;
  static float val(f16 v) { return (float)ref_f16_value(v.bits); }
  static f16 make(double v) { return f16{ref_f16_round((float)v)}; }
  static bool stored(f16 t, float f) { return t.bits == ref_f16_round(f); }
};

template <class T>
bool same_elems(const std::vector<T> &a, const std::vector<T> &b) {
  /* (empty vectors have no data pointer, which memcmp may not be given) */
  return a.size() == b.size() && (a.empty() || memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/* test_cudnn_kernels_host_layers.cu: the flat ops, the casts, pooling, the fc
 * bias and the loss, each for every activation type it applies to. */
void test_layers(void);

/* ---- the per-channel reduction, replayed ---------------------------------------------------------
 * What k_chan_partials + k_chan_finish compute: pieces of kPiece values, each a
 * block of kRedThreads threads (chan_thread, then tree_sum), then per channel
 * thread t sums partials t, t + B, ..., then tree_sum.  `setup(acc, ch)` is the
 * device accumulator's begin(). */
/* The second pass (k_chan_finish), either layout: channel ch's sums from its
 * partials part[ch * P + p * groups + g] and part[(c + ch) * P + ...], P =
 * pieces * groups, each piece's groups folded first. */
inline void replay_chan_finish(const std::vector<double> &part, int c, uint32_t pieces, std::vector<double> &out,
                               int groups = 1) {
  double a[kRedThreads], b[kRedThreads];
  const size_t per = (size_t)pieces * (size_t)groups;
  for (int ch = 0; ch < c; ch++) {
    for (int t = 0; t < kRedThreads; t++) {
      a[t] = b[t] = 0;
      for (uint32_t i = (uint32_t)t; i < pieces; i += kRedThreads)
        a[t] += nhwc_group_fold(&part[(size_t)ch * per + (size_t)i * groups], groups),
            b[t] += nhwc_group_fold(&part[((size_t)c + ch) * per + (size_t)i * groups], groups);
    }
    out[ch] = tree_sum(a, kRedThreads);
    out[c + ch] = tree_sum(b, kRedThreads);
  }
}

template <class Acc, class Setup>
inline void replay_chan(Acc proto, Setup setup, int n, int c, uint32_t hw, bool vec, std::vector<double> &out) {
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
  }
  replay_chan_finish(part, c, pieces, out);
}

/* test_cudnn_kernels_host_nhwc.cu: the channels-last kernels' arithmetic
 * against the NCHW ones', bit for bit. */
void test_nhwc(void);

} /* namespace gwt */

#endif
