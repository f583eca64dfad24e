/* cudnn_kernels_math.cuh - the arithmetic of cudnn_kernels.cu, as __host__
 * __device__ functions: what one thread of a kernel computes for one element,
 * one window, one channel from its sums, one row of the loss, and how a
 * reduction walks its values.  The kernels call these; a host test
 * (test/test_cudnn_kernels_host.cu) runs the same functions over host arrays.
 *
 * Not a kernel file: nothing here launches or touches device memory by itself.
 *
 * Activations (x, y, dx, dy, logits, dlogits) are float, bf16 (bfloat16
 * storage) or f16 (IEEE float16 storage; rounded to nearest even, subnormals
 * kept, the bits of model/half.h's gw_f32_to_f16): the functions that read them are templates over the element type T;
 * every load widens to float (widen), the arithmetic is the same for both, and
 * every store rounds once to T (narrow<T>: for bf16 from float, to nearest even,
 * a NaN kept a quiet NaN, bit for bit model/half.h's gw_f32_to_bf16, so the cpu
 * and cudnn backends store the same bits).  The conversion is integer bit
 * arithmetic here, the same on the host and the device (not cuda_bf16.h's
 * __float2bfloat16_rn, which makes every NaN the canonical 0x7fff).
 *
 * Rounding: every multiply-add the device could contract into an FMA is written
 * as an explicit fma(), and nothing else is contractible, so the host and the
 * device compute the same bits (exp/log excepted: the device's double exp and
 * log may differ from glibc's in the last bit).  Do not build with
 * -use_fast_math.  Sums run in double, as backend_cpu_kernels.c's. */
#ifndef GW_MODEL_CUDNN_KERNELS_MATH_CUH
#define GW_MODEL_CUDNN_KERNELS_MATH_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bits.cuh"

#define GWK_HD __host__ __device__ __forceinline__

namespace gwk {

/* ---- activation elements ----------------------------------------------------------------------
 * bf16: a bfloat16 as its 16 bits (the upper half of a float32's).  A struct,
 * not a bare uint16_t, so an activation pointer of the wrong type does not convert. */
struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2, "bf16 is 2 bytes");

using gwcu::f32_bits;
using gwcu::f32_from_bits;
/* Exact: a bf16 is a float32 with 16 low zero bits. */
GWK_HD float bf16_bits_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }
/* Round to nearest, ties to even (overflow to +-inf); a NaN keeps its sign and
 * upper payload and gets the quiet bit (model/half.h's gw_f32_to_bf16). */
GWK_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* f16: an IEEE float16 as its 16 bits (1 sign, 5 exponent, 10 mantissa). */
struct f16 {
  uint16_t bits;
};
static_assert(sizeof(f16) == 2, "f16 is 2 bytes");

/* An infinity or NaN (exponent all ones) as float32: the sign, the payload on
 * top (a NaN stays one). */
GWK_HD float f16_special_to_f32(uint16_t h) {
  return f32_from_bits((uint32_t)(h & 0x8000u) << 16 | 0x7f800000u | (uint32_t)(h & 0x3ffu) << 13);
}
/* A float32 NaN's float16: the sign, the upper payload, the quiet bit. */
GWK_HD uint16_t f32_nan_to_f16_bits(uint32_t u) {
  return (uint16_t)((u >> 16 & 0x8000u) | 0x7e00u | (u >> 13 & 0x3ffu));
}

/* Exact, subnormals included (model/half.h's gw_f16_to_f32). */
GWK_HD float f16_bits_to_f32(uint16_t h) {
#ifdef __CUDA_ARCH__
  /* Every float16 but a NaN is exact in float32: the hardware's conversion
   * gives these bits in one instruction (the loop below for subnormals, and
   * the branches, made the float16 batch-norm and add kernels 2.5x slower
   * than their bf16 forms on an H200); a NaN keeps its payload (f16_special_to_f32). */
  if ((h & 0x7fffu) <= 0x7c00u) return __half2float(__ushort_as_half(h));
  return f16_special_to_f32(h); /* (without the subnormal loop below in the kernels' code) */
#endif
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0x1f) {
    return f16_special_to_f32(h);
  } else if (e) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else if (!m) {
    u = sign;
  } else {
    uint32_t sh = 0;
    while (!(m & 0x400u)) m <<= 1, sh++;
    u = sign | ((113u - sh) << 23) | ((m & 0x3ffu) << 13);
  }
  return f32_from_bits(u);
}
/* Round to nearest, ties to even, subnormals included, 65520 and above to
 * infinity; a NaN keeps its sign and upper payload and gets the quiet bit
 * (model/half.h's gw_f32_to_f16, and the F16C instructions'). */
GWK_HD uint16_t f32_to_f16_bits(float f) {
#ifdef __CUDA_ARCH__
  /* The hardware rounds to nearest even, subnormals and overflow to infinity
   * included, as below; only a NaN's bits differ (its payload is kept below). */
  if (f == f) return __half_as_ushort(__float2half_rn(f));
  return f32_nan_to_f16_bits(f32_bits(f));
#else
  const uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f32_nan_to_f16_bits(u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (a >= 0x38800000u) {
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
  }
  if (a <= 0x33000000u) return (uint16_t)sign;
  const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  uint32_t q = m >> shift;
  q += rem > half || (rem == half && (q & 1u));
  return (uint16_t)(sign | q);
#endif
}

/* The two 16-bit types by their bits. */
template <class H>
GWK_HD float h16_widen(uint16_t bits);
template <>
GWK_HD float h16_widen<bf16>(uint16_t bits) {
  return bf16_bits_to_f32(bits);
}
template <>
GWK_HD float h16_widen<f16>(uint16_t bits) {
  return f16_bits_to_f32(bits);
}
template <class H>
GWK_HD uint16_t h16_narrow(float x);
template <>
GWK_HD uint16_t h16_narrow<bf16>(float x) {
  return f32_to_bf16_bits(x);
}
template <>
GWK_HD uint16_t h16_narrow<f16>(float x) {
  return f32_to_f16_bits(x);
}

/* ---- exact widening to double without the conversion unit ---------------------------------
 * A float32, bfloat16 or float16 placed bit for bit into a double's exponent
 * and mantissa fields reads as the value scaled by 2^(1023 - bias) (its
 * exponent field kept, 0 included: a subnormal lands on a double subnormal
 * with the same mantissa), so one exact multiply by 2^(bias - 1023) gives the
 * value: an integer shift or two and a double multiply (64 a clock per SM
 * on sm_90, where each float-to-double conversion is one of 16; a float16's
 * widening to float first is another).  Infinities and NaNs (the exponent
 * field all ones) take the conversions, so every result has (double) widen()'s
 * bits, NaN payloads included.  The NHWC sums' variant 2 reads its elements
 * this way (nhwc_direct). */
GWK_HD double f64_from_words(uint32_t hi, uint32_t lo) {
#ifdef __CUDA_ARCH__
  return __hiloint2double((int)hi, (int)lo);
#else
  const uint64_t u = (uint64_t)hi << 32 | lo;
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
#endif
}
GWK_HD double f32_to_f64_exact(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return (double)f;
  return f64_from_words((u & 0x80000000u) | (u & 0x7fffffffu) >> 3, u << 29) * 0x1p896;
}
GWK_HD double bf16_bits_to_f64(uint16_t b) {
  if ((b & 0x7f80u) == 0x7f80u) return (double)bf16_bits_to_f32(b);
  return f64_from_words((uint32_t)(b & 0x8000u) << 16 | (uint32_t)(b & 0x7fffu) << 13, 0) * 0x1p896;
}
GWK_HD double f16_bits_to_f64(uint16_t h) {
  if ((h & 0x7c00u) == 0x7c00u) return (double)f16_special_to_f32(h);
  return f64_from_words((uint32_t)(h & 0x8000u) << 16 | (uint32_t)(h & 0x7fffu) << 10, 0) * 0x1p1008;
}

/* An activation element as float (exact), and a float as one (rounded once). */
GWK_HD float widen(float v) { return v; }
GWK_HD float widen(bf16 v) { return bf16_bits_to_f32(v.bits); }
GWK_HD float widen(f16 v) { return f16_bits_to_f32(v.bits); }
/* An element as double (exactly (double)widen(v)), and whether it is > 0
 * (the ReLU mask), both on its bits: 0 < bits <= +inf's. */
GWK_HD double widen_d(float v) { return f32_to_f64_exact(v); }
GWK_HD double widen_d(bf16 v) { return bf16_bits_to_f64(v.bits); }
GWK_HD double widen_d(f16 v) { return f16_bits_to_f64(v.bits); }
GWK_HD bool positive(float v) { return f32_bits(v) - 1u < 0x7f800000u; }
GWK_HD bool positive(bf16 v) { return (uint32_t)v.bits - 1u < 0x7f80u; }
GWK_HD bool positive(f16 v) { return (uint32_t)v.bits - 1u < 0x7c00u; }
template <class T>
GWK_HD T narrow(float x);
template <>
GWK_HD float narrow<float>(float x) {
  return x;
}
template <>
GWK_HD bf16 narrow<bf16>(float x) {
  bf16 r;
  r.bits = f32_to_bf16_bits(x);
  return r;
}
template <>
GWK_HD f16 narrow<f16>(float x) {
  f16 r;
  r.bits = f32_to_f16_bits(x);
  return r;
}

/* a + b rounded to float, never contracted (the residual add, the bias). */
GWK_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/* ReLU (a NaN passes on, as PyTorch's and oneDNN's; -0 and every x <= 0 give
 * +0) and its backward. */
GWK_HD float relu(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }
/* dx = dy where y > 0, else 0 (backend.h: bwd takes the forward output). */
GWK_HD float relu_bwd(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

/* ---- fixed shapes of the reductions ---------------------------------------------------------
 * A result never depends on the grid: a per-channel reduction splits the
 * channel's count = n * h * w values into pieces of kPiece values (the last one
 * shorter), one block of kRedThreads threads per piece, whatever the device. */
constexpr int kRedThreads = 256;            /* threads of a reduction block (a power of two >= 64) */
constexpr int kQuadsPerThread = 8;          /* quads (4 values) one thread takes from a piece */
constexpr uint32_t kPiece = 4u * kRedThreads * kQuadsPerThread; /* 8192 values per block (32 KiB float, 16 bf16) */
constexpr int kWarp = 32;
constexpr int kLossThreads = 256;           /* threads of a loss block (one row each) */

/* Block sums run as a pairwise tree over the kRedThreads per-thread values:
 * for s = B/2, B/4, ..., 1: a[t] += a[t + s] for every t < s; the result is
 * a[0].  The device does the steps s >= 32 in shared memory and the last five
 * with __shfl_down_sync (the same pairing); this is the same order, serially,
 * for the host. */
template <class T>
GWK_HD T tree_sum(T *a, int nthreads) {
  for (int s = nthreads / 2; s > 0; s >>= 1)
    for (int t = 0; t < s; t++) a[t] += a[t + s];
  return a[0];
}

/* ---- division by a run-time constant -------------------------------------------------------
 * n / d for 1 <= d and n < 2^31 with a multiply-high and a shift (Granlund and
 * Montgomery; PyTorch's IntDivider), for the index arithmetic of every element. */
struct FastDiv {
  uint32_t d, m, s;
};
GWK_HD FastDiv fastdiv_make(uint32_t d) {
  FastDiv f;
  f.d = d;
  f.s = 0;
  while (f.s < 31 && (1u << f.s) < d) f.s++;
  f.m = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << f.s) - d)) / d + 1);
  return f;
}
GWK_HD uint32_t fastdiv(const FastDiv &f, uint32_t n) {
#ifdef __CUDA_ARCH__
  const uint32_t t = __umulhi(n, f.m);
#else
  const uint32_t t = (uint32_t)(((uint64_t)n * f.m) >> 32);
#endif
  return (t + n) >> f.s;
}

/* ---- per-channel reductions (bn_sums, bn_bwd_sums) -----------------------------------------
 * The values of channel ch of an NCHW tensor are numbered j = 0 .. count - 1,
 * count = n * hw: value j is sample j / hw, position j % hw, at offset
 * (j / hw) * c * hw + ch * hw + j % hw.  Piece p is j in [p * kPiece,
 * min((p + 1) * kPiece, count)).  Thread t of its block takes the quads
 * (4 consecutive j) starting at j0 + 4 t, j0 + 4 (t + B), ... and adds their
 * values in order of j into its own accumulator (acc.add1 per value, or acc.add4
 * for a whole quad when vec: hw % 4 == 0 and the tensors aligned for quads
 * (16 bytes for float, 8 for bf16), so a quad never crosses a plane; add4 adds
 * its 4 values in order, so both paths give the same bits).  Then the block's tree (tree_sum) makes the piece's
 * partial; a second pass gives channel ch's result from its partials the same
 * way (thread t adds partials t, t + B, ... in order, then the tree). */
template <class Acc>
GWK_HD void chan_thread(Acc &acc, uint32_t j0, uint32_t j1, int t, const FastDiv &hwd, size_t chan_off,
                        size_t sample_stride, bool vec) {
  for (uint32_t j = j0 + 4u * (uint32_t)t; j < j1; j += 4u * kRedThreads) {
    if (vec && j + 4 <= j1) {
      const uint32_t s = fastdiv(hwd, j);
      acc.add4((size_t)s * sample_stride + chan_off + (j - s * hwd.d));
    } else {
      const uint32_t e1 = j + 4 < j1 ? j + 4 : j1;
      for (uint32_t e = j; e < e1; e++) {
        const uint32_t s = fastdiv(hwd, e);
        acc.add1((size_t)s * sample_stride + chan_off + (e - s * hwd.d));
      }
    }
  }
}

/* ---- vector loads and stores ------------------------------------------------------------------
 * W consecutive activation elements as floats.  Quads (W = 4) serve the
 * per-channel kernels (a float4, or 8 bytes of bf16: a plane of hw % 4 == 0
 * values splits into quads, as ResNet's 14 x 14 = 196 does, and not into 8s);
 * octets (W = 8: two float4, or a uint4 of bf16) the flat ones.  The caller
 * guarantees the alignment (W * sizeof(T) bytes, 16 at most).  The host reads
 * the same words with memcpy, so the bf16 packing below is host-tested: the
 * element at the lower address is the low half of a 32-bit word (little endian,
 * host and device). */
template <int W>
struct Vals {
  float v[W];
};
typedef Vals<4> Quad;

/* Two 16-bit elements in a 32-bit word, the lower address in the low half. */
template <class H>
GWK_HD void h16_unpack(uint32_t word, float *v) {
  v[0] = h16_widen<H>((uint16_t)(word & 0xffffu));
  v[1] = h16_widen<H>((uint16_t)(word >> 16));
}
template <class H>
GWK_HD uint32_t h16_pack(float lo, float hi) {
  return (uint32_t)h16_narrow<H>(lo) | (uint32_t)h16_narrow<H>(hi) << 16;
}

GWK_HD Quad load4(const float *p) {
  Quad q;
#ifdef __CUDA_ARCH__
  const float4 f = *reinterpret_cast<const float4 *>(p);
  q.v[0] = f.x, q.v[1] = f.y, q.v[2] = f.z, q.v[3] = f.w;
#else
  for (int i = 0; i < 4; i++) q.v[i] = p[i];
#endif
  return q;
}
GWK_HD void store4(float *p, const Quad &q) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<float4 *>(p) = make_float4(q.v[0], q.v[1], q.v[2], q.v[3]);
#else
  for (int i = 0; i < 4; i++) p[i] = q.v[i];
#endif
}
template <class H>
GWK_HD Quad load4(const H *p) {
  static_assert(sizeof(H) == 2, "load4 of a 16-bit type");
  uint32_t w[2];
#ifdef __CUDA_ARCH__
  const uint2 u = *reinterpret_cast<const uint2 *>(p);
  w[0] = u.x, w[1] = u.y;
#else
  memcpy(w, p, sizeof w);
#endif
  Quad q;
  for (int i = 0; i < 2; i++) h16_unpack<H>(w[i], q.v + 2 * i);
  return q;
}
template <class H>
GWK_HD void store4(H *p, const Quad &q) {
  static_assert(sizeof(H) == 2, "store4 of a 16-bit type");
  uint32_t w[2];
  for (int i = 0; i < 2; i++) w[i] = h16_pack<H>(q.v[2 * i], q.v[2 * i + 1]);
#ifdef __CUDA_ARCH__
  *reinterpret_cast<uint2 *>(p) = make_uint2(w[0], w[1]);
#else
  memcpy(p, w, sizeof w);
#endif
}

GWK_HD Vals<8> load8(const float *p) {
  const Quad a = load4(p), b = load4(p + 4);
  Vals<8> r;
  for (int i = 0; i < 4; i++) r.v[i] = a.v[i], r.v[4 + i] = b.v[i];
  return r;
}
GWK_HD void store8(float *p, const Vals<8> &r) {
  Quad a, b;
  for (int i = 0; i < 4; i++) a.v[i] = r.v[i], b.v[i] = r.v[4 + i];
  store4(p, a);
  store4(p + 4, b);
}
template <class H>
GWK_HD Vals<8> load8(const H *p) {
  static_assert(sizeof(H) == 2, "load8 of a 16-bit type");
  uint32_t w[4];
#ifdef __CUDA_ARCH__
  const uint4 u = *reinterpret_cast<const uint4 *>(p);
  w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
#else
  memcpy(w, p, sizeof w);
#endif
  Vals<8> r;
  for (int i = 0; i < 4; i++) h16_unpack<H>(w[i], r.v + 2 * i);
  return r;
}
template <class H>
GWK_HD void store8(H *p, const Vals<8> &r) {
  static_assert(sizeof(H) == 2, "store8 of a 16-bit type");
  uint32_t w[4];
  for (int i = 0; i < 4; i++) w[i] = h16_pack<H>(r.v[2 * i], r.v[2 * i + 1]);
#ifdef __CUDA_ARCH__
  *reinterpret_cast<uint4 *>(p) = make_uint4(w[0], w[1], w[2], w[3]);
#else
  memcpy(p, w, sizeof w);
#endif
}

/* One value into the sums of bn_sums (a float widened exactly: callers pass
 * floats or widen_d's doubles): s += x, s2 += x^2 (x * x is exact in
 * double); and of bn_bwd_sums: s += g, s2 += g * xhat with xhat = (x - mean) *
 * rstd (g: dy, masked by a fused ReLU).  Both layouts' reductions call these. */
GWK_HD void sums_step(double &s, double &s2, double v) {
  s += v;
  s2 = fma(v, v, s2);
}
GWK_HD void bwd_sums_step(double &s, double &s2, double x, double g, double mean, double rstd) {
  const double xh = (x - mean) * rstd;
  s += g;
  s2 = fma(g, xh, s2);
}

/* bn_sums: s = sum x, s2 = sum x^2. */
template <class T>
struct SumsAcc {
  const T *x;
  double s, s2;
  GWK_HD void one(float xv) { sums_step(s, s2, xv); }
  GWK_HD void add1(size_t off) { one(widen(x[off])); }
  GWK_HD void add4(size_t off) {
    const Quad q = load4(x + off);
    for (int i = 0; i < 4; i++) one(q.v[i]);
  }
};

/* bn_bwd_sums: s = sum dy, s2 = sum dy * xhat with xhat = (x - mean) * rstd. */
template <class T>
struct BwdSumsAcc {
  const T *x, *dy;
  const T *ym; /* fused ReLU (backend.h bn_act_bwd): dy masked by the fused output; NULL: none */
  double mean, rstd;
  double s, s2;
  GWK_HD void one(float xv, float gv) { bwd_sums_step(s, s2, xv, gv, mean, rstd); }
  GWK_HD void add1(size_t off) {
    const float g = widen(dy[off]);
    one(widen(x[off]), ym ? relu_bwd(widen(ym[off]), g) : g);
  }
  GWK_HD void add4(size_t off) {
    const Quad a = load4(x + off), b = load4(dy + off);
    if (ym) {
      const Quad m = load4(ym + off);
      for (int i = 0; i < 4; i++) one(a.v[i], relu_bwd(m.v[i], b.v[i]));
    } else {
      for (int i = 0; i < 4; i++) one(a.v[i], b.v[i]);
    }
  }
};

/* ---- per-channel reductions over NHWC (channels-last) tensors --------------------------------
 * Value j of channel ch is at j * c + ch.  Both layouts give the same bits:
 * each channel's values go into the accumulator of chan_thread's thread t in
 * chan_thread's order, and the piece's partial makes the same additions of
 * the same operands as tree_sum over those kRedThreads accumulators, only
 * evaluated in another order (which a sum of two operands does not see).
 *
 * A block: kNhwcWarps warps over one piece and a tile of 32 * L adjacent
 * channels; lane l of every warp owns channels ch0 + L l .. ch0 + L l + L - 1,
 * so a warp reads 32 L adjacent values of a row at once (128 bytes of bf16
 * with L = 2: coalesced, where reading chan_thread's rows per thread, 4 rows
 * apart, was not).  Warp w walks the threads t of its leaves (nhwc_leaf_thread)
 * one after another, each as chan_thread would (nhwc_thread_rows), and
 * combines them as it goes (nhwc_warp_tree): the value tree_sum holds in a[w]
 * after its step s = kNhwcWarps.  The block's shared memory then takes the
 * kNhwcWarps warps' values, and tree_sum over them (steps s = 4, 2, 1) is
 * the partial.  The second pass as NCHW's. */
constexpr int kNhwcWarps = 8;                           /* warps of a block */
constexpr int kNhwcLeaves = kRedThreads / kNhwcWarps;   /* threads t one warp walks: 32 */
constexpr int kNhwcDepth = 5;                           /* log2(kNhwcLeaves) */
static_assert(1 << kNhwcDepth == kNhwcLeaves, "the leaves of one warp make a whole binary tree");
constexpr int kNhwcMaxGroups = 8; /* blocks sharing one piece: kNhwcWarps * 8 = 64 warps of 4 leaves */

/* Groups: a piece's 8 warps as above, but G blocks of them (G = 1, 2, 4, 8;
 * small grids take more, so more warps read at once).  Block g's warp w is
 * the virtual warp v = g + G w of a block of 8 G warps: tree_sum's a[v] after
 * its step s = 8 G, a tree over the threads t = v (mod 8 G), 32 / G leaves.
 * Block g joins its 8 warps by tree_sum's steps 4 G, 2 G, G, which pair warp
 * w with w + 4, w + 2, w + 1 of the same block, into a[g] after step G; the
 * second pass takes the piece's G values by tree_sum's last steps
 * (nhwc_group_fold) before adding up the pieces as NCHW's. */
GWK_HD int nhwc_group_depth(int groups) { /* log2 of a virtual warp's leaves */
  int d = kNhwcDepth;
  for (int g = groups; g > 1; g >>= 1) d--;
  return d;
}

/* tree_sum's a[v] after its step s = 8 G is a binary tree over the threads
 * t = v (mod 8 G): a[v] = a'[v] + a'[v + 8 G], where a' is a after step 16 G,
 * and so on down to step 128 (a[t] + a[t + 128] of the leaves).  Its leaves
 * from left to right: the k-th (k = 0 .. 32 / G - 1) takes offset 8 G at the
 * top split when k's highest bit is set, ..., 128 at the bottom split when its
 * lowest is: t = v + 8 G * (k with its d bits reversed), d = log2(32 / G). */
GWK_HD uint32_t nhwc_leaf_thread(int v, int k, int groups = 1) {
  const int d = nhwc_group_depth(groups);
  uint32_t r = 0;
  for (int b = 0; b < d; b++) r |= (((uint32_t)k >> b) & 1u) << (d - 1 - b);
  return (uint32_t)v + (uint32_t)(kNhwcWarps * groups) * r;
}

/* A piece's value from its G blocks' values p[0 .. G - 1]: tree_sum over them
 * (steps G / 2 .. 1), unrolled so the device keeps a[] in registers. */
GWK_HD double nhwc_group_fold(const double *p, int groups) {
  double a[kNhwcMaxGroups];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int g = 0; g < kNhwcMaxGroups; g++) a[g] = g < groups ? p[g] : 0.0;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int s = kNhwcMaxGroups / 2; s > 0; s >>= 1)
    if (s < groups)
      for (int t = 0; t < s; t++) a[t] += a[t + s];
  return a[0];
}

/* The L channels' sums of one lane: what an accumulator of chan_thread holds
 * for each. */
template <int L>
struct Sums2 {
  double s[L], s2[L];
  GWK_HD void zero() {
    for (int k = 0; k < L; k++) s[k] = 0, s2[k] = 0;
  }
  GWK_HD void add(const Sums2 &o) { /* tree_sum's a[t] += a[t + s] */
    for (int k = 0; k < L; k++) s[k] += o.s[k], s2[k] += o.s2[k];
  }
};

/* Where nhwc_warp_tree's partial sums wait, one Sums2 per level: in
 * registers (RegStack: the device unrolls the levels, so every index is a
 * constant), or in shared memory (SmemStack: the thread's doubles stride
 * apart, a warp's lanes side by side, so a level's load or store takes no
 * bank twice; 5 levels of 2 L doubles, 40 KiB a block of 256 threads at
 * L = 2), which frees 40 of the 128 registers at L = 2 for loads in flight. */
template <int L>
struct RegStack {
  Sums2<L> a[kNhwcDepth];
  GWK_HD Sums2<L> get(int lvl) const { return a[lvl]; }
  GWK_HD void put(int lvl, const Sums2<L> &x) { a[lvl] = x; }
};
template <int L>
struct SmemStack {
  double *base; /* the thread's first double */
  int stride;   /* between its doubles: the block's threads (1 on the host) */
  GWK_HD Sums2<L> get(int lvl) const {
    Sums2<L> x;
    for (int k = 0; k < L; k++)
      x.s[k] = base[(lvl * 2 * L + k) * stride], x.s2[k] = base[(lvl * 2 * L + L + k) * stride];
    return x;
  }
  GWK_HD void put(int lvl, const Sums2<L> &x) {
    for (int k = 0; k < L; k++)
      base[(lvl * 2 * L + k) * stride] = x.s[k], base[(lvl * 2 * L + L + k) * stride] = x.s2[k];
  }
};

/* Virtual warp v's value (groups G): leaf(t) gives thread t's Sums2; the
 * leaves in order, each merged with the subtrees it completes (a binary
 * counter: leaf k completes one per trailing 1 bit of k), so at most
 * log2(32 / G) partial sums wait, in stack.  The device unrolls the levels
 * and the leaves by two only (all 32 copies of a leaf's loads made kernels of
 * 170-430 KB; by two, fewer registers than not at all). */
template <int L, class Leaf, class Stack>
GWK_HD Sums2<L> nhwc_warp_tree(int v, Leaf &leaf, int groups, Stack &stack) {
  const int depth = nhwc_group_depth(groups), leaves = 1 << depth;
  Sums2<L> out = {}; /* every level is written before it is read */
#ifdef __CUDA_ARCH__
#pragma unroll 2
#endif
  for (int k = 0; k < leaves; k++) {
    Sums2<L> x = leaf(nhwc_leaf_thread(v, k, groups));
    bool kept = false;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int lvl = 0; lvl < kNhwcDepth; lvl++) {
      if (kept || lvl >= depth) continue;
      if ((k >> lvl) & 1) { /* the right child: its left sibling waits at this level */
        Sums2<L> left = stack.get(lvl);
        left.add(x);
        x = left;
      } else {
        stack.put(lvl, x);
        kept = true;
      }
    }
    if (!kept) out = x; /* k = leaves - 1 closes the whole tree */
  }
  return out;
}
template <int L, class Leaf>
GWK_HD Sums2<L> nhwc_warp_tree(int v, Leaf &leaf, int groups = 1) {
  RegStack<L> stack = {};
  return nhwc_warp_tree<L>(v, leaf, groups, stack);
}

/* A leaf (SumsLeaf, BwdSumsLeaf) bound to its piece: nhwc_warp_tree's leaf(t). */
template <class Leaf>
struct PieceLeaf {
  Leaf &leaf;
  uint32_t j0, j1;
  GWK_HD auto operator()(uint32_t t) { return leaf(t, j0, j1); }
};

/* Thread t's values of piece [j0, j1), chan_thread's rows in chan_thread's
 * order, B quads at a time: f.fetch(e, slot) for every row e of the B quads
 * first (the device issues their loads together), then f.use(slot) in the
 * same order.  slot = 4 i + r for row r of the batch's quad i. */
template <int B, class F>
GWK_HD void nhwc_thread_rows(uint32_t j0, uint32_t j1, uint32_t t, F &f) {
  static_assert(kQuadsPerThread % B == 0, "whole batches");
  const uint32_t q0 = j0 + 4u * t, step = 4u * (uint32_t)kRedThreads;
  for (int i0 = 0; i0 < kQuadsPerThread; i0 += B) {
    if (q0 + step * (uint32_t)i0 >= j1) break;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int s = 0; s < 4 * B; s++) {
      const uint32_t e = q0 + step * (uint32_t)(i0 + s / 4) + (uint32_t)(s % 4);
      if (e < j1) f.fetch(e, s);
    }
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int s = 0; s < 4 * B; s++) {
      const uint32_t e = q0 + step * (uint32_t)(i0 + s / 4) + (uint32_t)(s % 4);
      if (e < j1) f.use(s);
    }
  }
}

/* L adjacent elements of a row as stored, in one load (L = 2 needs 2 *
 * sizeof(T) alignment), widened by get(k): a pair of 16-bit elements stays one
 * 32-bit word (the lower address in the low half, as h16_unpack) until used. */
template <class T, int L>
struct Raw {
  T v[L];
  GWK_HD void load(const T *p) {
#ifdef __CUDA_ARCH__
    if constexpr (L == 2 && sizeof(T) == 4) {
      const float2 f = *reinterpret_cast<const float2 *>(p);
      memcpy(v, &f, sizeof f);
    } else {
      for (int k = 0; k < L; k++) v[k] = p[k];
    }
#else
    memcpy(v, p, sizeof v);
#endif
  }
  GWK_HD float get(int k) const { return widen(v[k]); }
  GWK_HD double getd(int k) const { return widen_d(v[k]); }
  GWK_HD bool pos(int k) const { return positive(v[k]); }
};
template <class H>
struct RawPair16 {
  uint32_t w;
  GWK_HD void load(const H *p) {
#ifdef __CUDA_ARCH__
    w = *reinterpret_cast<const uint32_t *>(p);
#else
    memcpy(&w, p, sizeof w);
#endif
  }
  GWK_HD H elem(int k) const { return H{(uint16_t)(k ? w >> 16 : w & 0xffffu)}; }
  GWK_HD float get(int k) const { return widen(elem(k)); }
  GWK_HD double getd(int k) const { return widen_d(elem(k)); }
  GWK_HD bool pos(int k) const { return positive(elem(k)); }
};
template <>
struct Raw<bf16, 2> : RawPair16<bf16> {};
template <>
struct Raw<f16, 2> : RawPair16<f16> {};

/* Four adjacent elements as stored, in one load or store (alignment: 4 *
 * sizeof(T), as load4's): batch norm's apply passes (bn_fwd_elem, bn_bwd_elem). */
template <class T>
struct Raw4 {
  T v[4];
  GWK_HD void load(const T *p) {
#ifdef __CUDA_ARCH__
    if constexpr (sizeof(T) == 4) {
      const float4 f = *reinterpret_cast<const float4 *>(p);
      memcpy(v, &f, sizeof f);
    } else {
      const uint2 u = *reinterpret_cast<const uint2 *>(p);
      memcpy(v, &u, sizeof u);
    }
#else
    memcpy(v, p, sizeof v);
#endif
  }
  GWK_HD void store(T *p) const {
#ifdef __CUDA_ARCH__
    if constexpr (sizeof(T) == 4) {
      float4 f;
      memcpy(&f, v, sizeof f);
      *reinterpret_cast<float4 *>(p) = f;
    } else {
      uint2 u;
      memcpy(&u, v, sizeof u);
      *reinterpret_cast<uint2 *>(p) = u;
    }
#else
    memcpy(p, v, sizeof v);
#endif
  }
};

/* The NHWC sums kernels come in kNhwcVariants variants with the same bits
 * (the host replays run each); the backend times them once per shape and
 * keeps the fastest (cudnn_kernels_nhwc.cu, GW_BN_NHWC_KERNEL):
 *   0: the tree's stack in registers (RegStack), each element widened to
 *      float, then to double, by the conversion unit;
 *   1: the stack in shared memory (SmemStack) and twice the rows per batch
 *      in the registers that frees (more loads in flight);
 *   2: as 1, each element widened straight to double by widen_d and the
 *      fused ReLU's mask tested on the bits (no conversions at all). */
constexpr int kNhwcVariants = 3;
template <int V>
__host__ __device__ constexpr bool nhwc_smem_stack() { return V >= 1; }
template <int V>
__host__ __device__ constexpr bool nhwc_direct() { return V == 2; }

/* Quads per batch of nhwc_thread_rows (loads in flight per lane), as many as
 * fit the kernel's 128 registers (sm_90, ptxas -v).  With the stack in
 * registers: the sums 4 (16 rows), 2 for float pairs; the backward's three
 * tensors 2, 1 for pairs; no spills.  With it in shared memory: the sums 8,
 * 4 for float pairs; the backward 4 (so 4 times the rows in flight for
 * 16-bit pairs); no spills but variant 1's one-channel sums (16 bytes).  The
 * bits do not depend on it. */
template <class T, int L, int V = 0>
__host__ __device__ constexpr int nhwc_sums_batch() { return (L == 2 && sizeof(T) == 4 ? 2 : 4) * (nhwc_smem_stack<V>() ? 2 : 1); }
template <int L, int V = 0>
__host__ __device__ constexpr int nhwc_bwd_batch() { return nhwc_smem_stack<V>() ? 4 : L == 2 ? 1 : 2; }

/* bn_sums over NHWC: one lane's leaf, channels ch .. ch + L - 1 of rows c apart;
 * SumsAcc's sums. */
template <class T, int L, int B, bool D = false>
struct SumsLeaf {
  const T *x;
  size_t c;
  uint32_t ch;
  Raw<T, L> raw[4 * B];
  Sums2<L> acc;
  GWK_HD void fetch(uint32_t e, int s) { raw[s].load(x + (size_t)e * c + ch); }
  GWK_HD void use(int s) {
    for (int k = 0; k < L; k++) {
      if constexpr (D)
        sums_step(acc.s[k], acc.s2[k], raw[s].getd(k));
      else
        sums_step(acc.s[k], acc.s2[k], raw[s].get(k));
    }
  }
  GWK_HD Sums2<L> operator()(uint32_t t, uint32_t j0, uint32_t j1) {
    acc.zero();
    nhwc_thread_rows<B>(j0, j1, t, *this);
    return acc;
  }
};

/* bn_bwd_sums over NHWC: BwdSumsAcc's sums; the lane's channels' mean and rstd
 * read once. */
template <class T, int L, int B, bool D = false>
struct BwdSumsLeaf {
  const T *x, *dy, *ym; /* ym: the fused output (dy masked by ym > 0), or NULL */
  size_t c;
  uint32_t ch;
  double mean[L], rstd[L];
  Raw<T, L> rx[4 * B], rdy[4 * B], rym[4 * B];
  Sums2<L> acc;
  GWK_HD void begin(const float *m, const float *r) {
    for (int k = 0; k < L; k++) mean[k] = m[ch + k], rstd[k] = r[ch + k];
  }
  GWK_HD void fetch(uint32_t e, int s) {
    const size_t off = (size_t)e * c + ch;
    rx[s].load(x + off);
    rdy[s].load(dy + off);
    if (ym) rym[s].load(ym + off);
  }
  GWK_HD void use(int s) {
    for (int k = 0; k < L; k++) {
      if constexpr (D) { /* relu_bwd's dy or +0, on the bits */
        const double g = ym && !rym[s].pos(k) ? 0.0 : rdy[s].getd(k);
        bwd_sums_step(acc.s[k], acc.s2[k], rx[s].getd(k), g, mean[k], rstd[k]);
      } else {
        const float g = rdy[s].get(k);
        bwd_sums_step(acc.s[k], acc.s2[k], rx[s].get(k), ym ? relu_bwd(rym[s].get(k), g) : g, mean[k], rstd[k]);
      }
    }
  }
  GWK_HD Sums2<L> operator()(uint32_t t, uint32_t j0, uint32_t j1) {
    acc.zero();
    nhwc_thread_rows<B>(j0, j1, t, *this);
    return acc;
  }
};

/* ---- NHWC element-wise passes with per-channel parameters -------------------------------------
 * A grid-stride loop over the quads of an NHWC tensor (c % 4 == 0) keeps each
 * thread on the same 4 channels when the grid's stride, blocks * threads * 4
 * elements, is a multiple of c: the thread reads its channels' parameters once
 * instead of once per quad.  The least number of blocks at or above want with
 * that property. */
GWK_HD uint32_t nhwc_fixed_blocks(uint32_t c, uint32_t threads, uint32_t want) {
  uint32_t a = c, b = 4u * threads; /* gcd(c, 4 threads) */
  while (b) {
    const uint32_t r = a % b;
    a = b, b = r;
  }
  const uint32_t step = c / a;
  return (want + step - 1) / step * step;
}

/* Whether a stored element is a NaN, on its bits. */
GWK_HD bool is_nan(float v) { return (f32_bits(v) & 0x7fffffffu) > 0x7f800000u; }
GWK_HD bool is_nan(bf16 v) { return (v.bits & 0x7fffu) > 0x7f80u; }
GWK_HD bool is_nan(f16 v) { return (v.bits & 0x7fffu) > 0x7c00u; }
/* narrow<T>(widen(v)): v itself but for a NaN, which gets narrow's quiet bit. */
template <class T>
GWK_HD T restored(T v) {
  return is_nan(v) ? narrow<T>(widen(v)) : v;
}
/* narrow<T>(relu(widen(r))) on the bits: no conversion but for a NaN. */
template <class T>
GWK_HD T relu_elem(T r) {
  if (positive(r)) return r;
  return is_nan(r) ? restored(r) : narrow<T>(0.0f);
}

/* Batch norm's output v (float, before the store) through the fused tail: its
 * rounding to T, plus z (the residual add, in float, rounded once; has_z),
 * then ReLU (backend.h bn_act_*): the bits of the separate ops. */
template <class T>
GWK_HD T bn_tail(float v, bool has_z, T z, bool relu_on) {
  T r = narrow<T>(v);
  if (has_z) r = narrow<T>(add_rn(widen(r), widen(z)));
  if (relu_on) r = relu_elem(r);
  return r;
}

/* ---- batch norm, per channel and per element ------------------------------------------------ */
struct BnStats {
  double mean, var, rstd; /* var: biased, clamped at 0 */
};
/* From s = sum x and s2 = sum x^2 over count values: mean = s / count,
 * var = s2 / count - mean^2 (clamped at 0; a NaN stays NaN), rstd = 1 / sqrt(var + eps).
 * Where |mean| is large next to the spread, var loses about log2(mean^2 / var)
 * bits to the cancellation (double keeps 53): a mean 1e5 times the standard
 * deviation still leaves var good to ~1e-6. */
GWK_HD BnStats bn_stats_from_sums(double s, double s2, double count, double eps) {
  BnStats r;
  r.mean = s / count;
  r.var = fma(-r.mean, r.mean, s2 / count);
  if (r.var < 0) r.var = 0;
  r.rstd = 1.0 / sqrt(r.var + eps);
  return r;
}
/* PyTorch's running-statistics update, in double, each rounded once:
 * running = momentum * batch + (1 - momentum) * running, with the unbiased
 * variance var * count / (count - 1) (count >= 2; at count 1 it is inf or NaN,
 * as in the cpu backend). */
GWK_HD void bn_running_update(double mean, double var, double count, double momentum, float *running_mean,
                              float *running_var) {
  const double unbiased = var * count / (count - 1);
  *running_mean = (float)fma(momentum, mean, (1.0 - momentum) * (double)*running_mean);
  *running_var = (float)fma(momentum, unbiased, (1.0 - momentum) * (double)*running_var);
}

/* y = x * scale + shift with the channel's scale and shift in double (the cpu
 * backend's form: no rounding of x - mean in float).  The mean itself comes as
 * a float (save_mean, as PyTorch's), so where |mean| is large next to the
 * spread the output is off by up to half a float step of the mean times rstd. */
struct BnAffine {
  double scale, shift;
};
/* Training (and SyncBatchNorm) statistics: scale = gamma * rstd, shift = beta - mean * scale. */
GWK_HD BnAffine bn_affine_train(float gamma, float beta, float mean, float rstd) {
  BnAffine a;
  a.scale = (double)gamma * (double)rstd;
  a.shift = fma(-(double)mean, a.scale, (double)beta);
  return a;
}
/* Inference: scale = gamma / sqrt(running_var + eps), shift = beta - running_mean * scale. */
GWK_HD BnAffine bn_affine_infer(float gamma, float beta, float running_mean, float running_var, double eps) {
  BnAffine a;
  a.scale = (double)gamma / sqrt((double)running_var + eps);
  a.shift = fma(-(double)running_mean, a.scale, (double)beta);
  return a;
}
GWK_HD float bn_affine_apply_d(double x, const BnAffine &a) { return (float)fma(x, a.scale, a.shift); }
GWK_HD float bn_affine_apply(float x, const BnAffine &a) { return bn_affine_apply_d((double)x, a); }

/* Backward: dx = gamma * rstd * (dy - sdy / count - xhat * sdyx / count). */
struct BnBwd {
  double mean, rstd, k, a, b; /* k = gamma * rstd, a = sdy / count, b = sdyx / count */
};
GWK_HD BnBwd bn_bwd_channel(float gamma, float mean, float rstd, double sdy, double sdyx, double count) {
  BnBwd p;
  p.mean = mean;
  p.rstd = rstd;
  p.k = (double)gamma * p.rstd;
  p.a = sdy / count;
  p.b = sdyx / count;
  return p;
}
GWK_HD float bn_bwd_apply_d(double x, double dy, const BnBwd &p) {
  const double xh = (x - p.mean) * p.rstd;
  return (float)(p.k * fma(-xh, p.b, dy - p.a));
}
GWK_HD float bn_bwd_apply(float x, float dy, const BnBwd &p) { return bn_bwd_apply_d((double)x, (double)dy, p); }

/* ---- batch norm's apply passes, one stored element at a time -------------------------------
 * The bits of widening each element to float, the float functions above and
 * narrow<T> at each store, with the conversions that change nothing left out:
 * elements go straight to double (widen_d: exactly (double)widen(v)), the
 * ReLU and its mask work on the bits, and an element stored again unchanged
 * is copied (restored).  Per float16 element that is 2 conversions where the
 * float path took 8 (forward with ReLU: widen, to and from double, narrow,
 * ReLU's widen and narrow, the quad's widen and narrow again; backward: the
 * mask's, dy's and x's widenings, dz's narrowing, dy and x to double, back
 * and narrow), which Hopper issues at 16 a clock per SM. */
/* y from x with the channel's affine, then the tail (z: the residual, has_z). */
template <class T>
GWK_HD T bn_fwd_elem(T x, const BnAffine &a, bool has_z, T z, bool relu_on) {
  return bn_tail<T>(bn_affine_apply_d(widen_d(x), a), has_z, z, relu_on);
}
/* dx from x and dy, dy masked first by a fused ReLU's output ym (has_ym):
 * *dz gets the masked dy as stored (the residual's gradient). */
template <class T>
GWK_HD T bn_bwd_elem(T x, T dy, bool has_ym, T ym, const BnBwd &p, T *dz) {
  const bool keep = !has_ym || positive(ym); /* relu_bwd: ym > 0 */
  *dz = keep ? restored(dy) : narrow<T>(0.0f);
  return narrow<T>(bn_bwd_apply_d(widen_d(x), keep ? widen_d(dy) : 0.0, p));
}

/* ---- weights for NHWC convolutions ----------------------------------------------------------
 * Element e (< 2^31) of the destination of [k][c][rs] -> [k][rs][c] (to_last)
 * or back comes from this element of the source; cd and rsd divide by c and rs. */
GWK_HD uint32_t perm_source(uint32_t e, const FastDiv &cd, const FastDiv &rsd, bool to_last) {
  const uint32_t c = cd.d, rs = rsd.d;
  if (to_last) { /* e = (kk * rs + r) * c + cc */
    const uint32_t a = fastdiv(cd, e), cc = e - a * c, kk = fastdiv(rsd, a), r = a - kk * rs;
    return (kk * c + cc) * rs + r;
  }
  const uint32_t a = fastdiv(rsd, e), r = e - a * rs, kk = fastdiv(cd, a), cc = a - kk * c; /* e = (kk*c + cc)*rs + r */
  return (kk * rs + r) * c + cc;
}

/* ---- max pool --------------------------------------------------------------------------------
 * Output (oh, ow) of one plane [h, w]: the window rows oh * stride - pad + [0, kernel)
 * and columns likewise, clipped to the plane (padding never wins).  PyTorch's
 * rule (max_pool2d, CPU and CUDA): start from -inf at the first in-plane position
 * and take a value when `v > max || isnan(v)`, in row-major order; so ties keep
 * the first position, a NaN always wins (several NaNs: the last one), and a
 * window of -inf keeps its first position.  A window with no in-plane position
 * (pad >= kernel, which PyTorch refuses) gives -inf and argmax -1.  The plane's
 * elements are cs apart (1: NCHW; c: NHWC, the plane starting at its channel);
 * argmax is the position ih * w + iw in either layout. */
template <class T>
GWK_HD float maxpool_window(const T *plane, int h, int w, int oh, int ow, int kernel, int stride, int pad,
                            int32_t *argmax, size_t cs = 1) {
  const int h0 = oh * stride - pad, w0 = ow * stride - pad;
  const int hs = h0 > 0 ? h0 : 0, ws = w0 > 0 ? w0 : 0;
  const int he = h0 + kernel < h ? h0 + kernel : h, we = w0 + kernel < w ? w0 + kernel : w;
  if (hs >= he || ws >= we) {
    *argmax = -1;
    return -INFINITY;
  }
  float m = -INFINITY;
  int32_t best = hs * w + ws;
  for (int ih = hs; ih < he; ih++)
    for (int iw = ws; iw < we; iw++) {
      const float v = widen(plane[(size_t)(ih * w + iw) * cs]);
      if (v > m || v != v) m = v, best = ih * w + iw;
    }
  *argmax = best;
  return m;
}

/* dx at input (ih, iw) of one plane: the sum, in double over the windows in
 * row-major order, of dy over the windows that contain (ih, iw) and whose argmax
 * is ih * w + iw (PyTorch's max_pool_backward_nchw gather, which sums in float).
 * Windows containing row ih: ph in [ceil((ih + pad - kernel + 1) / stride),
 * floor((ih + pad) / stride)], clipped to [0, p).  The stride comes as sd =
 * fastdiv_make(stride): a division by a run-time value is a long instruction
 * sequence on a GPU, and every dx took four. */
template <class T>
GWK_HD float maxpool_gather(const T *dy_plane, const int32_t *argmax_plane, int p, int q, int ih, int iw, int w,
                            int kernel, const FastDiv &sd, int pad, size_t cs = 1) {
  const int phs = ih + pad < kernel ? 0 : (int)fastdiv(sd, (uint32_t)(ih + pad - kernel)) + 1;
  const int pws = iw + pad < kernel ? 0 : (int)fastdiv(sd, (uint32_t)(iw + pad - kernel)) + 1;
  const int phe0 = (int)fastdiv(sd, (uint32_t)(ih + pad)) + 1, pwe0 = (int)fastdiv(sd, (uint32_t)(iw + pad)) + 1;
  const int phe = phe0 < p ? phe0 : p, pwe = pwe0 < q ? pwe0 : q;
  const int32_t me = ih * w + iw;
  double s = 0;
  for (int ph = phs; ph < phe; ph++)
    for (int pw = pws; pw < pwe; pw++)
      if (argmax_plane[(size_t)(ph * q + pw) * cs] == me) s += (double)widen(dy_plane[(size_t)(ph * q + pw) * cs]);
  return (float)s;
}

/* ---- global average pool ----------------------------------------------------------------------
 * One warp per plane (its values cs apart: 1 in NCHW, c in NHWC): lane l adds
 * values l, l + 32, ... in double, the 32 lane
 * sums go through tree_sum's pairing (shuffles), y = sum / hw rounded once. */
template <class T>
GWK_HD double avgpool_lane_sum(const T *plane, uint32_t hw, int lane, size_t cs = 1) {
  double s = 0;
  for (uint32_t i = (uint32_t)lane; i < hw; i += kWarp) s += (double)widen(plane[(size_t)i * cs]);
  return s;
}
GWK_HD float avgpool_finish(double sum, uint32_t hw) { return (float)(sum / (double)hw); }
GWK_HD float avgpool_bwd_value(float dy, uint32_t hw) { return (float)((double)dy / (double)hw); }

/* ---- fully connected bias gradient -----------------------------------------------------------
 * db[j] = sum over the n rows of dy[r, j]: kBiasGroups threads per column, group
 * g adding rows g, g + kBiasGroups, ... in order (bias_grad_group), then the
 * group sums added in order of g, all in double, rounded once. */
constexpr int kBiasCols = 32, kBiasGroups = 8; /* a block: 32 columns x 8 row groups */
template <class T>
GWK_HD double bias_grad_group(const T *dy, int n, int k, int j, int g) {
  double s = 0;
  for (int r = g; r < n; r += kBiasGroups) s += (double)widen(dy[(size_t)r * k + j]);
  return s;
}

/* ---- softmax cross-entropy with label smoothing s --------------------------------------------
 * With mx = max_j z_j, lse = mx + log(sum_j exp(z_j - mx)) (all in double):
 *   row loss = (1 - s)(lse - z[label]) + s (lse - sum_j z_j / k)
 *   dlogits_j = (exp(z_j - lse) - (1 - s)[j == label] - s / k) / n
 * loss_row below is the definition, serially; the device runs one block per
 * row: thread t takes j = t, t + B, ... for the max (loss_thread_max) and the
 * two sums (loss_thread_sums), the block combines the maxima (order-free) and
 * the sums by tree_sum's pairing, then uses loss_lse / loss_row_value /
 * loss_grad as loss_row does. */
template <class T>
GWK_HD float loss_thread_max(const T *z, int k, int t, int nthreads) {
  float m = -INFINITY;
  for (int j = t; j < k; j += nthreads) {
    const float v = widen(z[j]);
    m = v > m ? v : m;
  }
  return m;
}
template <class T>
GWK_HD void loss_thread_sums(const T *z, int k, int t, int nthreads, float mx, double *sumexp, double *zsum) {
  double se = 0, zs = 0;
  for (int j = t; j < k; j += nthreads) {
    const double v = widen(z[j]);
    se += exp(v - (double)mx);
    zs += v;
  }
  *sumexp = se, *zsum = zs;
}
GWK_HD double loss_lse(float mx, double sumexp) { return (double)mx + log(sumexp); }
/* The smoothing term only with smoothing (PyTorch's branch): a logit of -inf
 * (a float16 one below -65504) makes it infinite, and 0 x inf NaN.  The
 * same bits as the CPU backend's (1 - s) * a + 0. */
GWK_HD double loss_row_value(double lse, float zlabel, double zsum, double s, int k) {
  return s > 0 ? fma(1.0 - s, lse - (double)zlabel, s * (lse - zsum / (double)k)) : lse - (double)zlabel;
}
GWK_HD float loss_grad(float zj, double lse, bool is_label, double s, int k, int n, double scale = 1.0) {
  double t = s / (double)k;
  if (is_label) t += 1.0 - s;
  return (float)((exp((double)zj - lse) - t) / (double)n * scale);
}
/* One row, serially: returns the row loss (double), writes g [k]. */
template <class T>
GWK_HD double loss_row(const T *z, int k, int label, double s, int n, T *g) {
  const float mx = loss_thread_max(z, k, 0, 1);
  double se, zs;
  loss_thread_sums(z, k, 0, 1, mx, &se, &zs);
  const double lse = loss_lse(mx, se);
  for (int j = 0; j < k; j++) g[j] = narrow<T>(loss_grad(widen(z[j]), lse, j == label, s, k, n));
  return loss_row_value(lse, widen(z[label]), zs, s, k);
}

} /* namespace gwk */

#endif /* GW_MODEL_CUDNN_KERNELS_MATH_CUH */
