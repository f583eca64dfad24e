/* kernels.cu - the CUDA kernels of the device layer and their C launchers
 * (declared at the bottom of dev.h):
 *   - gw__cuda_reduce: dst0[i] = dst1[i] = (a[i] OP b[i]) / div for every
 *     gw_dtype_t and GW_KOP_*, bit for bit what the host kernels
 *     (comm/reduce_impl.c, the generic table) compute;
 *   - gw__cuda_flag_write / gw__cuda_flag_wait: order a stream with a host
 *     thread through a 64-bit flag in mapped pinned memory;
 *   - gw__cuda_sleep: a kernel that takes a given time (tests);
 *   - gw__cuda_cast: float32 to or from float16 / bfloat16 (the bucketer's
 *     16-bit gradient wire on device buffers), reduce_cvt.h's conversions;
 *   - gw__cuda_copy: dst0 = dst1 = src by the reduction's kernel (the device
 *     ring's copies: one read for two outputs, on the SMs).
 *
 * Bit-exactness with the host, by construction:
 *   - integers: the host's expressions, SUM/PROD in the unsigned type, AVG as
 *     (T)((int64_t)(T)(a + b) / (int64_t)div);
 *   - fp32/fp64: each operation with an explicit round-to-nearest intrinsic
 *     (__fadd_rn ...), so nothing is contracted into an FMA; subnormals are kept
 *     (this file must not be built with -use_fast_math or -ftz=true);
 *   - fp16/bf16: the host's bit-twiddling conversions (reduce_cvt.h) ported
 *     as they are, the operation in fp32, a division by (float)div when
 *     div > 1 (for every op, as the host does), one rounding;
 *   - NaN: a GPU operation that yields NaN gives the canonical NaN, an x86 one
 *     (SSE/AVX, which the host kernels run on) gives the NaN operand, quieted,
 *     or the "default NaN" 0xffc00000 (invalid operations such as inf - inf).
 *     x86_nan() rebuilds the x86 result wherever the device's is a NaN, so NaN
 *     payloads and signs match too.  When both operands are NaN, x86 returns
 *     the one in the instruction's first source, which is the compiler's
 *     choice: gcc 12 -O3 builds the generic fp32/fp64 loops with a first and
 *     the fp16/bf16 loops with b first, and so does this file.  (The host
 *     tables do not agree among themselves there: the AVX-512 loops'
 *     remainders may pick the other NaN; the generic table is the reference.
 *     fp16 NaNs leave every table as 0x7e00 and the sign.)
 *     MAX/MIN are the host's selections `x > y || x != x || (x == y &&
 *     signbit(y)) ? x : y` and its mirror for MIN (a NaN operand wins: never
 *     fmaxf, which drops it; +0 is above -0), so they pass NaN bits on
 *     exactly as the host does.
 * Everything the element code needs is __host__ __device__: on the host it
 * computes what the device computes (canonical NaNs included), so a CPU-only
 * test can run the kernel bodies against the host kernels.
 *
 * Layout: when dst0, dst1 (if any), a and b have the same address modulo 16
 * (the usual case: all 16-byte aligned), the elements up to the first 16-byte
 * boundary ("head") and after the last whole 16-byte chunk ("tail") are done
 * one by one and the rest as uint4 loads and stores; otherwise everything is
 * done one element at a time, and bytewise if a pointer is not even aligned to
 * its element size (a misaligned access would be a sticky error that kills the
 * context).  Grid-stride loops over a grid that fills the device once (blocks
 * resident per SM, from the occupancy API, times the SM count; cached per
 * device). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* reduce.h (and the gradwire.h it includes) by its path from here: the
 * gwkernels target is built with cuda/'s include directories only. */
extern "C" {
#include "../comm/reduce.h"
#include "dev.h"
}
#include "bits.cuh"
#include "dev_cache.cuh"

namespace {

constexpr int kThreads = 512;   /* threads per block of the reduction */
using gwcu::kMaxDevCache;
using gwcu::sm_count;

/* ---- bits and fp32/fp64 arithmetic ------------------------------------------------------ */
using gwcu::f32_bits;
using gwcu::f32_from_bits;
__host__ __device__ __forceinline__ uint64_t d2u(double d) {
#ifdef __CUDA_ARCH__
  return (uint64_t)__double_as_longlong(d);
#else
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
#endif
}
__host__ __device__ __forceinline__ double u2d(uint64_t u) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double((long long)u);
#else
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
#endif
}

/* Host side only: the device's canonical NaN, so host runs of this code see
 * what the GPU computes before x86_nan() repairs it. */
#ifdef __CUDA_ARCH__
#define GW_ARITH(T, NAME, INTR, EXPR) \
  __host__ __device__ __forceinline__ T NAME(T x, T y) { return INTR(x, y); }
#else
__host__ __forceinline__ float canon(float r) { return r == r ? r : f32_from_bits(0x7fffffffu); }
__host__ __forceinline__ double canon(double r) { return r == r ? r : u2d(0x7fffffffffffffffull); }
#define GW_ARITH(T, NAME, INTR, EXPR) \
  __host__ __device__ __forceinline__ T NAME(T x, T y) { return canon(EXPR); }
#endif
GW_ARITH(float, op_add, __fadd_rn, x + y)
GW_ARITH(float, op_mul, __fmul_rn, x * y)
GW_ARITH(float, op_div, __fdiv_rn, x / y)
GW_ARITH(double, op_add, __dadd_rn, x + y)
GW_ARITH(double, op_mul, __dmul_rn, x * y)
GW_ARITH(double, op_div, __ddiv_rn, x / y)
#undef GW_ARITH

/* r = x OP y as the device computed it; when it is a NaN, the NaN that x86
 * produces for the same operation: the first operand if it is a NaN, else the
 * second, quieted; else (an invalid operation) the negative default NaN. */
__host__ __device__ __forceinline__ float x86_nan(float r, float x, float y) {
  if (r == r) return r;
  if (x != x) return f32_from_bits(f32_bits(x) | 0x00400000u);
  if (y != y) return f32_from_bits(f32_bits(y) | 0x00400000u);
  return f32_from_bits(0xffc00000u);
}
__host__ __device__ __forceinline__ double x86_nan(double r, double x, double y) {
  if (r == r) return r;
  if (x != x) return u2d(d2u(x) | 0x0008000000000000ull);
  if (y != y) return u2d(d2u(y) | 0x0008000000000000ull);
  return u2d(0xfff8000000000000ull);
}
/* s / dv with dv a finite number >= 2, as x86 divides: a NaN s comes out quieted. */
__host__ __device__ __forceinline__ float div_x86(float s, float dv) {
  return s == s ? op_div(s, dv) : f32_from_bits(f32_bits(s) | 0x00400000u);
}
__host__ __device__ __forceinline__ double div_x86(double s, double dv) {
  return s == s ? op_div(s, dv) : u2d(d2u(s) | 0x0008000000000000ull);
}

/* ---- fp16 / bf16 conversions: comm/reduce_cvt.h, line for line ------------------------ */
__host__ __device__ __forceinline__ float h2f(uint16_t h) {
#ifdef __CUDA_ARCH__
  /* Every fp16 but a NaN is exact in fp32, so the hardware's conversion gives
   * the same bits for them at a fraction of the instructions (the bit-twiddled
   * form kept fp16 reductions at 0.7 of the copy bandwidth on an H200); a NaN
   * keeps its payload below, as on the host. */
  if ((h & 0x7fffu) <= 0x7c00u) return __half2float(__ushort_as_half(h));
#endif
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = ((uint32_t)h & 0x7fffu) << 13;
  uint32_t exp = shifted_exp & o;
  o += (uint32_t)(127 - 15) << 23;
  if (exp == shifted_exp) {
    o += (uint32_t)(128 - 16) << 23; /* Inf / NaN */
  } else if (exp == 0) {             /* zero / subnormal: renormalize (exact) */
    o += 1u << 23;
    o = f32_bits(op_add(f32_from_bits(o), -f32_from_bits(113u << 23)));
  }
  o |= ((uint32_t)h & 0x8000u) << 16;
  return f32_from_bits(o);
}

__host__ __device__ __forceinline__ uint16_t f2h(float ff) {
#ifdef __CUDA_ARCH__
  /* The hardware rounds to nearest even, subnormals and overflow to infinity
   * included, as the code below does; only a NaN differs (0x7e00 here). */
  if (ff == ff) return __half_as_ushort(__float2half_rn(ff));
#endif
  const uint32_t f32infty = 255u << 23, f16max = (127u + 16u) << 23;
  const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t f = f32_bits(ff);
  uint32_t sign = f & 0x80000000u;
  uint16_t o;
  f ^= sign;
  if (f >= f16max) {
    o = (f > f32infty) ? 0x7e00 : 0x7c00; /* NaN stays NaN, overflow -> Inf */
  } else if (f < (113u << 23)) {
    /* subnormal or zero: the float adder does the rounding (subnormal f included) */
    o = (uint16_t)(f32_bits(op_add(f32_from_bits(f), f32_from_bits(denorm_magic))) - denorm_magic);
  } else {
    uint32_t mant_odd = (f >> 13) & 1u;
    f += ((uint32_t)(15 - 127) << 23) + 0xfffu;
    f += mant_odd;
    o = (uint16_t)(f >> 13);
  }
  return (uint16_t)(o | (sign >> 16));
}

__host__ __device__ __forceinline__ float bf2f(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

__host__ __device__ __forceinline__ uint16_t f2bf(float f) {
  uint32_t u = f32_bits(f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x40u; /* keep NaN a (quiet) NaN */
  return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? nan : rounded);
}

/* ---- the element operations --------------------------------------------------------------
 * Each is a small struct: S the stored type, P the divisor's type, dv the
 * divisor and avg whether to divide (div > 1).  Which ops divide follows the
 * host: SUM only for integers, fp32 and fp64; every op for fp16 and bf16. */
template <typename T, typename UT, int K>
struct OpInt {
  typedef T S;
  typedef int64_t P; /* divided in int64: the rank count fits whatever T is */
  int64_t dv;
  int avg;
  __host__ __device__ __forceinline__ T operator()(T x, T y) const {
    if constexpr (K == GW_KOP_SUM) {
      T s = (T)((UT)x + (UT)y);
      return avg ? (T)((int64_t)s / dv) : s;
    } else if constexpr (K == GW_KOP_PROD) {
      return (T)((UT)x * (UT)y);
    } else if constexpr (K == GW_KOP_MAX) {
      return x > y ? x : y;
    } else {
      return x < y ? x : y;
    }
  }
};
template <int K> using OpI8 = OpInt<int8_t, uint8_t, K>;
template <int K> using OpU8 = OpInt<uint8_t, uint8_t, K>;
template <int K> using OpI32 = OpInt<int32_t, uint32_t, K>;
template <int K> using OpI64 = OpInt<int64_t, uint64_t, K>;

template <typename T, int K>
struct OpFlt {
  typedef T S;
  typedef T P;
  T dv;
  int avg;
  __host__ __device__ __forceinline__ T operator()(T x, T y) const {
    if constexpr (K == GW_KOP_SUM) {
      T s = x86_nan(op_add(x, y), x, y);
      return avg ? div_x86(s, dv) : s;
    } else if constexpr (K == GW_KOP_PROD) {
      return x86_nan(op_mul(x, y), x, y);
    } else if constexpr (K == GW_KOP_MAX) { /* zeros ordered as the host's (+0 above -0) */
      return x > y || x != x || (x == y && signbit(y)) ? x : y;
    } else {
      return x < y || x != x || (x == y && signbit(x)) ? x : y;
    }
  }
};
template <int K> using OpF32 = OpFlt<float, K>;
template <int K> using OpF64 = OpFlt<double, K>;

template <bool BF16, int K>
struct OpH16 {
  typedef uint16_t S;
  typedef float P;
  float dv;
  int avg;
  __host__ __device__ __forceinline__ uint16_t operator()(uint16_t x, uint16_t y) const {
    const float p = BF16 ? bf2f(x) : h2f(x), q = BF16 ? bf2f(y) : h2f(y);
    float r;
    /* (q, p): when both are NaN the host's fp16/bf16 loops (gcc -O3) return
     * the second one; fp32/fp64 return the first (see the head comment). */
    if constexpr (K == GW_KOP_SUM) {
      r = x86_nan(op_add(p, q), q, p);
    } else if constexpr (K == GW_KOP_PROD) {
      r = x86_nan(op_mul(p, q), q, p);
    } else if constexpr (K == GW_KOP_MAX) {
      r = p > q || p != p || (p == q && signbit(q)) ? p : q;
    } else {
      r = p < q || p != p || (p == q && signbit(p)) ? p : q;
    }
    if (avg) r = div_x86(r, dv);
    return BF16 ? f2bf(r) : f2h(r);
  }
};
template <int K> using OpF16 = OpH16<false, K>;
template <int K> using OpBF16 = OpH16<true, K>;

/* The copy (gw__cuda_copy): words of W bytes, b never read. */
template <typename W> struct OpCopyW {
  typedef W S;
  __host__ __device__ __forceinline__ W operator()(W x, W) const { return x; }
};
typedef OpCopyW<unsigned char> OpCopy;
template <class Op> struct Unary {
  static constexpr bool v = false;
};
template <typename W> struct Unary<OpCopyW<W>> {
  static constexpr bool v = true;
};

/* ---- the reduction body --------------------------------------------------------------------
 * Pointers travel as bytes so that nothing assumes more alignment than the
 * host checked.  Elements [head, head + nvec * V) go as nvec uint4 chunks
 * (V = 16 / sizeof(S)); the other nscalar = n - nvec * V elements (the head and
 * the tail) one by one: scalar k is element k when k < head, else k + nvec * V.
 * BYTES: some pointer is not aligned to sizeof(S); nvec is 0 and every element
 * is read and written bytewise.  tid/stride: this thread's place in the grid
 * (test_cuda_kernels_host calls this for every tid of an imagined grid). */
template <typename S, bool BYTES>
__host__ __device__ __forceinline__ S load_elem(const unsigned char *p, size_t i) {
  if constexpr (BYTES) {
    S v;
    memcpy(&v, p + i * sizeof(S), sizeof(S));
    return v;
  } else {
    return reinterpret_cast<const S *>(p)[i];
  }
}
template <typename S, bool BYTES>
__host__ __device__ __forceinline__ void store_elem(unsigned char *p, size_t i, S v) {
  if constexpr (BYTES) {
    memcpy(p + i * sizeof(S), &v, sizeof(S));
  } else {
    reinterpret_cast<S *>(p)[i] = v;
  }
}

/* float16 SUM without a division, the gradients' case: eight lanes by four
 * packed half additions (HADD2, round to nearest) instead of sixteen
 * conversions to float32, eight additions and eight conversions back, which
 * kept this kernel at 0.85 of the copy's bandwidth on an H200.  The same bits:
 * float32 (24 bits) holds the exact sum of two float16 (11 bits) to more than
 * 2 x 11 + 1 bits, so rounding it to float32 first and then to float16 gives
 * the once-rounded sum (double rounding is innocuous at p' >= 2p + 2),
 * subnormals, overflow to infinity and the sign of zero included.  A NaN in
 * any lane sends the whole chunk to the element path, which reproduces x86's
 * NaN.  On the host, cuda_fp16.h's __hadd2_rn adds in float32 and rounds,
 * so test_cuda_kernels_host checks the lanes and the fallback. */
template <class Op> struct F16Sum {
  static constexpr bool v = false;
};
template <> struct F16Sum<OpF16<GW_KOP_SUM>> {
  static constexpr bool v = true;
};
__host__ __device__ __forceinline__ bool f16_sum_vec(const uint4 ua, const uint4 ub, uint4 &ur) {
  uint32_t xa[4], xb[4], xr[4];
  memcpy(xa, &ua, sizeof ua);
  memcpy(xb, &ub, sizeof ub);
  bool nan = false;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int e = 0; e < 4; e++) {
    /* the lower address in .x, the low half of the word */
    const __half2 ha = __halves2half2(__ushort_as_half((unsigned short)(xa[e] & 0xffffu)),
                                      __ushort_as_half((unsigned short)(xa[e] >> 16)));
    const __half2 hb = __halves2half2(__ushort_as_half((unsigned short)(xb[e] & 0xffffu)),
                                      __ushort_as_half((unsigned short)(xb[e] >> 16)));
    const __half2 hr = __hadd2_rn(ha, hb);
    xr[e] = (uint32_t)__half_as_ushort(__low2half(hr)) | (uint32_t)__half_as_ushort(__high2half(hr)) << 16;
    nan |= (xr[e] & 0x7fffu) > 0x7c00u || ((xr[e] >> 16) & 0x7fffu) > 0x7c00u;
  }
  memcpy(&ur, xr, sizeof ur);
  return !nan;
}

/* One uint4 of elements: r = a OP b lane by lane (a itself for the copy). */
template <class Op>
__host__ __device__ __forceinline__ uint4 op_vec(const Op &op, const uint4 ua, const uint4 ub) {
  if constexpr (Unary<Op>::v) return ua;
  if constexpr (F16Sum<Op>::v) {
    uint4 ur;
    if (!op.avg && f16_sum_vec(ua, ub, ur)) return ur;
  }
  typedef typename Op::S S;
  constexpr int V = 16 / (int)sizeof(S);
  static_assert(16 % sizeof(S) == 0, "elements must tile a uint4");
  S x[V], y[V], r[V];
  memcpy(x, &ua, sizeof ua);
  memcpy(y, &ub, sizeof ub);
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int e = 0; e < V; e++) r[e] = op(x[e], y[e]);
  uint4 ur;
  memcpy(&ur, r, sizeof ur);
  return ur;
}

template <class Op, bool BYTES>
__host__ __device__ __forceinline__ void reduce_body(const Op op, unsigned char *d0, unsigned char *d1,
                                                     const unsigned char *a, const unsigned char *b, size_t head,
                                                     size_t nvec, size_t nscalar, size_t tid, size_t stride) {
  typedef typename Op::S S;
  constexpr int V = 16 / (int)sizeof(S);
  if constexpr (!BYTES) {
    const size_t off = head * sizeof(S); /* a 16-byte boundary for every pointer */
    const uint4 *va = reinterpret_cast<const uint4 *>(a + off);
    const uint4 *vb = reinterpret_cast<const uint4 *>(b + off);
    uint4 *vd0 = reinterpret_cast<uint4 *>(d0 + off);
    uint4 *vd1 = d1 ? reinterpret_cast<uint4 *>(d1 + off) : nullptr;
    /* Two chunks per trip, all four loads issued before the first use.  Every
     * load of a trip precedes its stores, so dst0/dst1 may be a or b (same
     * index); j + stride < nvec cannot overflow (nvec < 2^60).  The copy reads
     * a only. */
    constexpr bool one = Unary<Op>::v;
    size_t j = tid;
    for (; j + stride < nvec; j += 2 * stride) {
      const uint4 a0 = va[j], a1 = va[j + stride];
      const uint4 b0 = one ? a0 : vb[j], b1 = one ? a1 : vb[j + stride];
      const uint4 r0 = op_vec(op, a0, b0), r1 = op_vec(op, a1, b1);
      vd0[j] = r0;
      vd0[j + stride] = r1;
      if (vd1) {
        vd1[j] = r0;
        vd1[j + stride] = r1;
      }
    }
    if (j < nvec) {
      const uint4 r0 = one ? va[j] : op_vec(op, va[j], vb[j]);
      vd0[j] = r0;
      if (vd1) vd1[j] = r0;
    }
  }
  const size_t skip = nvec * (size_t)V;
  for (size_t k = tid; k < nscalar; k += stride) {
    const size_t i = k < head ? k : k + skip;
    const S x = load_elem<S, BYTES>(a, i), r = Unary<Op>::v ? x : op(x, load_elem<S, BYTES>(b, i));
    store_elem<S, BYTES>(d0, i, r);
    if (d1) store_elem<S, BYTES>(d1, i, r);
  }
}

template <class Op, bool BYTES>
__global__ void __launch_bounds__(kThreads)
    k_reduce(const Op op, unsigned char *d0, unsigned char *d1, const unsigned char *a, const unsigned char *b,
             size_t head, size_t nvec, size_t nscalar) {
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  reduce_body<Op, BYTES>(op, d0, d1, a, b, head, nvec, nscalar, tid, stride);
}

/* ---- launching ---------------------------------------------------------------------------- */
/* How the n elements split (see reduce_body). */
struct Plan {
  size_t head, nvec, nscalar;
  bool bytes;
};

__host__ Plan plan_reduce(const void *d0, const void *d1, const void *a, const void *b, size_t n, size_t es) {
  const uintptr_t pd0 = (uintptr_t)d0, pd1 = (uintptr_t)d1, pa = (uintptr_t)a, pb = (uintptr_t)b;
  Plan p = {n, 0, n, false};
  if (((pd0 | pd1 | pa | pb) % es) != 0) {
    p.bytes = true;
    return p;
  }
  const uintptr_t m = pa & 15u;
  if ((pb & 15u) != m || (pd0 & 15u) != m || (d1 && (pd1 & 15u) != m)) return p; /* no common 16-byte phase */
  size_t head = (size_t)((16u - m) & 15u) / es;
  if (head > n) head = n;
  p.head = head;
  p.nvec = (n - head) / (16 / es);
  p.nscalar = n - p.nvec * (16 / es);
  return p;
}

/* Blocks of this kernel resident at once on one SM of device dev, cached per
 * kernel and device (1 when the occupancy API cannot tell). */
template <class Op, bool BYTES>
__host__ int blocks_per_sm(int dev) {
  static int cache[kMaxDevCache];
  return gwcu::cached_per_device(cache, dev, 1, [](int *v) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(v, k_reduce<Op, BYTES>, kThreads, 0);
  });
}

template <class Op, bool BYTES>
__host__ int launch_plan(const Op op, const Plan &p, void *d0, void *d1, const void *a, const void *b,
                         cudaStream_t st) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return (int)e;
  const size_t work = p.nvec > p.nscalar ? p.nvec : p.nscalar; /* threads that have something to do */
  const size_t needed = (work + kThreads - 1) / kThreads;
  int sms = sm_count(dev);
  size_t full = (size_t)(sms > 0 ? sms : 1) * (size_t)blocks_per_sm<Op, BYTES>(dev);
  const unsigned blocks = (unsigned)(needed < full ? needed : full);
  return (int)gwcu::launch(k_reduce<Op, BYTES>, blocks, kThreads, st, op, (unsigned char *)d0, (unsigned char *)d1,
                           (const unsigned char *)a, (const unsigned char *)b, p.head, p.nvec, p.nscalar);
}

template <class Op>
__host__ int launch_reduce(const Op op, void *d0, void *d1, const void *a, const void *b, size_t n,
                           cudaStream_t st) {
  const Plan p = plan_reduce(d0, d1, a, b, n, sizeof(typename Op::S));
  return p.bytes ? launch_plan<Op, true>(op, p, d0, d1, a, b, st) : launch_plan<Op, false>(op, p, d0, d1, a, b, st);
}

/* The element operation for (dtype, kop, div), handed to f (a generic lambda
 * that launches it; a CPU test runs it instead).  The divisors are converted
 * as the host kernels convert them (for the integer types, modulo 2^bits). */
template <template <int> class OpT, class F>
__host__ int by_kop(int kop, typename OpT<GW_KOP_SUM>::P dv, int avg, F &&f) {
  switch (kop) {
  case GW_KOP_SUM: return f(OpT<GW_KOP_SUM>{dv, avg});
  case GW_KOP_PROD: return f(OpT<GW_KOP_PROD>{dv, avg});
  case GW_KOP_MAX: return f(OpT<GW_KOP_MAX>{dv, avg});
  case GW_KOP_MIN: return f(OpT<GW_KOP_MIN>{dv, avg});
  default: return (int)cudaErrorInvalidValue;
  }
}

template <class F>
__host__ int by_dtype(int dtype, int kop, uint32_t div, F &&f) {
  const int avg = div > 1;
  switch (dtype) {
  case GW_INT8: return by_kop<OpI8>(kop, (int64_t)div, avg, f);
  case GW_UINT8: return by_kop<OpU8>(kop, (int64_t)div, avg, f);
  case GW_INT32: return by_kop<OpI32>(kop, (int64_t)div, avg, f);
  case GW_INT64: return by_kop<OpI64>(kop, (int64_t)div, avg, f);
  case GW_FLOAT16: return by_kop<OpF16>(kop, avg ? (float)div : 1.0f, avg, f);
  case GW_BFLOAT16: return by_kop<OpBF16>(kop, avg ? (float)div : 1.0f, avg, f);
  case GW_FLOAT32: return by_kop<OpF32>(kop, (float)div, avg, f);
  case GW_FLOAT64: return by_kop<OpF64>(kop, (double)div, avg, f);
  default: return (int)cudaErrorInvalidValue;
  }
}

/* ---- flags and sleep ------------------------------------------------------------------------ */
__global__ void k_flag_write(uint64_t *flag, uint64_t v) {
  __threadfence_system(); /* what this stream did before is visible before the flag */
  *(volatile uint64_t *)flag = v;
}

__global__ void k_flag_wait(const uint64_t *flag, uint64_t v) {
  while (*(const volatile uint64_t *)flag < v) __nanosleep(256);
  __threadfence_system();
}

__device__ __forceinline__ uint64_t global_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void k_sleep(uint64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) __nanosleep(1000);
}

/* float32 <-> 16 bits, element by element (grid-stride; no alignment needed). */
template <bool BF16>
__global__ void k_cast_to16(uint16_t *dst, const float *src, size_t n, float scale) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = BF16 ? f2bf(src[i] * scale) : f2h(src[i] * scale);
}
template <bool BF16>
__global__ void k_cast_from16(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = BF16 ? bf2f(src[i]) : h2f(src[i]);
}

} /* namespace */

/* ---- the C launchers -------------------------------------------------------------------------- */
extern "C" int gw__cuda_cast(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n, float scale,
                             void *stream) {
  if (n == 0) return (int)cudaSuccess;
  if (!dst || !src) return (int)cudaErrorInvalidValue;
  const int to16 = src_dtype == GW_FLOAT32 && (dst_dtype == GW_FLOAT16 || dst_dtype == GW_BFLOAT16);
  const int from16 = dst_dtype == GW_FLOAT32 && (src_dtype == GW_FLOAT16 || src_dtype == GW_BFLOAT16);
  if (!to16 && !from16) return (int)cudaErrorInvalidValue;
  const int bf = (to16 ? dst_dtype : src_dtype) == GW_BFLOAT16;
  size_t blocks = (n + 255) / 256;
  if (blocks > 8192) blocks = 8192;
  cudaStream_t st = (cudaStream_t)stream;
  const unsigned g = (unsigned)blocks;
  if (to16) return (int)gwcu::launch(bf ? k_cast_to16<true> : k_cast_to16<false>, g, 256, st, (uint16_t *)dst,
                                     (const float *)src, n, scale);
  return (int)gwcu::launch(bf ? k_cast_from16<true> : k_cast_from16<false>, g, 256, st, (float *)dst,
                           (const uint16_t *)src, n);
}

/* The copy's word: the widest of 8, 4, 2 and 1 bytes that every pointer and
 * the length are multiples of.  Pointers that share their 16-byte phase copy
 * in 16-byte chunks whatever the word; the others word by word, where bytes
 * ran at a fraction of the copy bandwidth (an allgather's blocks of an odd
 * float count lie 4, 8 or 12 bytes off the twins' phase). */
__host__ size_t copy_width(const void *d0, const void *d1, const void *src, size_t bytes) {
  const uintptr_t all = (uintptr_t)d0 | (uintptr_t)d1 | (uintptr_t)src | (uintptr_t)bytes;
  return all % 8 == 0 ? 8 : all % 4 == 0 ? 4 : all % 2 == 0 ? 2 : 1;
}

/* f(op, words) with the copy of copy_width's word (CPU tests replay it). */
template <class F> __host__ int by_copy_width(const void *d0, const void *d1, const void *src, size_t bytes, F &&f) {
  switch (copy_width(d0, d1, src, bytes)) {
  case 8: return f(OpCopyW<unsigned long long>{}, bytes / 8);
  case 4: return f(OpCopyW<unsigned int>{}, bytes / 4);
  case 2: return f(OpCopyW<unsigned short>{}, bytes / 2);
  default: return f(OpCopy{}, bytes);
  }
}

/* The reduction's kernel with OpCopyW: 16-byte chunks between a head and a
 * tail of words when the pointers share their 16-byte phase, else words. */
extern "C" int gw__cuda_copy(void *dst0, void *dst1, const void *src, size_t bytes, void *stream) {
  if (bytes == 0) return (int)cudaSuccess;
  if (!dst0 || !src) return (int)cudaErrorInvalidValue;
  return by_copy_width(dst0, dst1, src, bytes, [&](auto op, size_t words) {
    return launch_reduce(op, dst0, dst1, src, src, words, (cudaStream_t)stream);
  });
}

extern "C" int gw__cuda_reduce(void *dst0, void *dst1, const void *a, const void *b, size_t n, int dtype, int kop,
                               uint32_t div, void *stream) {
  if (n == 0) return (int)cudaSuccess;
  if (!dst0 || !a || !b) return (int)cudaErrorInvalidValue;
  cudaStream_t st = (cudaStream_t)stream;
  return by_dtype(dtype, kop, div, [&](auto op) { return launch_reduce(op, dst0, dst1, a, b, n, st); });
}

/* Every kernel of this file: each reduction for every dtype x op in both
 * forms, the casts, the flags and the sleep; also fills the occupancy cache
 * launch_plan reads.  Returns the first error. */
extern "C" int gw__cuda_preload(void) {
  static const int dtypes[] = {GW_INT8, GW_UINT8, GW_INT32, GW_INT64, GW_FLOAT16, GW_BFLOAT16, GW_FLOAT32, GW_FLOAT64};
  static const int kops[] = {GW_KOP_SUM, GW_KOP_PROD, GW_KOP_MAX, GW_KOP_MIN};
  int dev = 0;
  cudaError_t first = cudaGetDevice(&dev);
  cudaFuncAttributes at;
  auto load = [&](cudaError_t e) {
    if (e != cudaSuccess && first == cudaSuccess) first = e;
  };
  for (int dt : dtypes)
    for (int kop : kops)
      by_dtype(dt, kop, 1, [&](auto op) {
        typedef decltype(op) Op;
        load(cudaFuncGetAttributes(&at, k_reduce<Op, true>));
        load(cudaFuncGetAttributes(&at, k_reduce<Op, false>));
        (void)blocks_per_sm<Op, true>(dev), (void)blocks_per_sm<Op, false>(dev);
        return 0;
      });
  load(cudaFuncGetAttributes(&at, k_reduce<OpCopy, false>));
  load(cudaFuncGetAttributes(&at, k_reduce<OpCopyW<unsigned short>, false>));
  load(cudaFuncGetAttributes(&at, k_reduce<OpCopyW<unsigned int>, false>));
  load(cudaFuncGetAttributes(&at, k_reduce<OpCopyW<unsigned long long>, false>));
  (void)blocks_per_sm<OpCopy, false>(dev), (void)blocks_per_sm<OpCopyW<unsigned short>, false>(dev);
  (void)blocks_per_sm<OpCopyW<unsigned int>, false>(dev), (void)blocks_per_sm<OpCopyW<unsigned long long>, false>(dev);
  load(cudaFuncGetAttributes(&at, k_flag_write));
  load(cudaFuncGetAttributes(&at, k_flag_wait));
  load(cudaFuncGetAttributes(&at, k_sleep));
  load(cudaFuncGetAttributes(&at, k_cast_to16<true>));
  load(cudaFuncGetAttributes(&at, k_cast_to16<false>));
  load(cudaFuncGetAttributes(&at, k_cast_from16<true>));
  load(cudaFuncGetAttributes(&at, k_cast_from16<false>));
  (void)cudaGetLastError();
  return (int)first;
}

extern "C" int gw__cuda_flag_write(uint64_t *flag, uint64_t v, void *stream) {
  if (!flag) return (int)cudaErrorInvalidValue;
  return (int)gwcu::launch(k_flag_write, 1, 1, (cudaStream_t)stream, flag, v);
}

extern "C" int gw__cuda_flag_wait(const uint64_t *flag, uint64_t v, void *stream) {
  if (!flag) return (int)cudaErrorInvalidValue;
  return (int)gwcu::launch(k_flag_wait, 1, 1, (cudaStream_t)stream, flag, v);
}

extern "C" int gw__cuda_sleep(double seconds, void *stream) {
  if (!(seconds > 0)) return (int)cudaSuccess; /* 0, negative or NaN: nothing to wait for */
  const uint64_t ns = seconds >= 1.8e10 ? UINT64_MAX : (uint64_t)(seconds * 1e9);
  return (int)gwcu::launch(k_sleep, 1, 1, (cudaStream_t)stream, ns);
}
