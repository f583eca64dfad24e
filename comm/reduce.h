/* reduce.h - host reduction kernels: dst0 = dst1 = a OP b over n elements, for
 * every dtype and op, vectorized for the CPU found at run time (AVX-512, AVX2 or
 * plain x86-64).  fp16/bf16 are widened to fp32 for the operation and rounded once
 * (round to nearest even).  Integer SUM/PROD wrap around (two's complement), as in
 * NCCL.  Knows nothing of ranks or connections. */
#ifndef GW_REDUCE_H
#define GW_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "gradwire.h"

/* The ops the kernels implement; GW_AVG is GW_SUM with a final division. */
enum { GW_KOP_SUM = 0, GW_KOP_PROD = 1, GW_KOP_MAX = 2, GW_KOP_MIN = 3, GW_NUM_KOPS = 4 };

/* dst0[i] = (a[i] OP b[i]) / div (div 0 or 1: no division); dst1 (may be NULL)
 * gets the same value.  dst0/dst1 may be the same array as a or b (same index
 * only); nothing else may overlap. */
typedef void (*gw_reduce_fn)(void *dst0, void *dst1, const void *a, const void *b, size_t n,
                             uint32_t div);
typedef gw_reduce_fn gw_reduce_table_t[GW_NUM_DTYPES][GW_NUM_KOPS];

extern const gw_reduce_table_t gw__reduce_table_generic;
#ifdef GW_HAVE_X86_SIMD
extern const gw_reduce_table_t gw__reduce_table_avx2;
extern const gw_reduce_table_t gw__reduce_table_avx512;
#endif
/* The same instruction-set builds of the float32 <-> 16-bit array conversions
 * (bf16 != 0: bfloat16, else float16); gw__cvt_* below pick one. */
#define GW_DECL_CVT(SUF)                                                      \
  void gw__cvt_to16_##SUF(int bf16, uint16_t *d, const float *s, size_t n); \
  void gw__cvt_from16_##SUF(int bf16, float *d, const uint16_t *s, size_t n);
GW_DECL_CVT(generic)
#ifdef GW_HAVE_X86_SIMD
GW_DECL_CVT(avx2)
GW_DECL_CVT(avx512)
#endif

/* A widened operation's reduction step in one pass (gw__fold_reduce below),
 * per instruction-set build: [bf16][op]. */
typedef void (*gw_fold_fn)(uint16_t *slot, float *wide, const uint16_t *recv, const float *local, size_t n,
                           uint32_t div, float scale, int local_first);
typedef gw_fold_fn gw_fold_table_t[2][GW_NUM_KOPS];
extern const gw_fold_table_t gw__fold_table_generic;
#ifdef GW_HAVE_X86_SIMD
extern const gw_fold_table_t gw__fold_table_avx2;
extern const gw_fold_table_t gw__fold_table_avx512;
#endif
/* The one-pass kernels of the table named as gw__reduce_table_named names
 * them (NULL where that one is), for tests. */
const gw_fold_table_t *gw__fold_table_named(const char *name);

/* The table for this CPU (GW_SIMD=generic|avx2|avx512 forces a lower one). */
const gw_reduce_table_t *gw__reduce_table(void);
const char *gw__reduce_simd_name(void);
/* A specific table by name, or NULL if this CPU or build cannot run it (tests). */
const gw_reduce_table_t *gw__reduce_table_named(const char *name);

static inline gw_reduce_fn gw__reduce_fn(gw_dtype_t dt, gw_op_t op) {
  return (*gw__reduce_table())[dt][op == GW_AVG ? GW_KOP_SUM : (int)op];
}

/* dst0 = dst1 = src (dst1 may be NULL). */
void gw__copy2(void *dst0, void *dst1, const void *src, size_t bytes);
/* dst = src with non-temporal stores: for large outputs that will not be read
 * again soon, it saves the read-for-ownership of every destination line. */
void gw__copy_stream(void *dst, const void *src, size_t bytes);

/* Arrays between float32 and a 16-bit dtype (GW_FLOAT16 or GW_BFLOAT16),
 * rounding to nearest even (the gradient bucketer's wire format). */
void gw__cvt_from_f32(gw_dtype_t to, void *dst, const float *src, size_t n);
/* The same of src[i] * scale (multiplied in float32, then rounded once to 16 bits). */
void gw__cvt_from_f32_scaled(gw_dtype_t to, void *dst, const float *src, size_t n, float scale);
void gw__cvt_to_f32(gw_dtype_t from, float *dst, const void *src, size_t n);
/* A reduction step of a 16-bit allreduce whose local operand is float32 (a
 * widened operation's ring step, struct gw_op): out = red(recv, round(local *
 * scale)), or red(round(local * scale), recv) when local_first, rounded as
 * red rounds, where red is the wire dtype's kernel of op (GW_AVG: GW_SUM);
 * out goes to slot (NULL: nowhere) and, widened, to wide (NULL: nowhere; may
 * be local itself, element for element).  One pass (gw_fold_table_t of the
 * CPU's table), the bits of those three passes but where SUM or PROD meet
 * two NaNs: the first operand's, whichever table runs it (reduce_impl.c). */
void gw__fold_reduce(gw_op_t op, gw_dtype_t wire, void *slot, float *wide, const void *recv, const float *local,
                     size_t n, uint32_t div, float scale, int local_first);

/* Scalar conversions, exact and round-to-nearest-even (exposed for tests). */
float gw__half_to_float(uint16_t h);
uint16_t gw__float_to_half(float f);
float gw__bf16_to_float(uint16_t h);
uint16_t gw__float_to_bf16(float f);

#endif
