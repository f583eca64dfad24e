/* backend_cpu_kernels.c - batch norm, global average pool and softmax
 * cross-entropy for the cpu backend, as plain C loops (see backend_cpu_kernels.h).
 *
 * Why not oneDNN here: its batch norm returns the variance, not 1/sqrt(var + eps),
 * and keeps no running statistics, so the saved statistics of backend.h would have
 * to be converted back and forth (losing precision when var is far below eps); the
 * other two are a sum per channel or row.  All of them are bound by memory
 * bandwidth, not arithmetic, so a loop over channels in parallel (OpenMP, when the
 * build has it) costs little.  Sums run in double, as PyTorch's CPU kernels
 * accumulate float in double (at::acc_type<float, false>).  The loops are
 * written once (backend_cpu_kernels_body.h) and made here for float32 and
 * bfloat16 activations. */
#include <math.h>
#include <stddef.h>

#include "backend_cpu_kernels.h"
#include "half.h"

#ifdef _OPENMP
#define OMP_FOR _Pragma("omp parallel for schedule(static)")
#else
#define OMP_FOR
#endif

/* The body's loop nest over a block of channels [cb, cb + nb): samples, then
 * positions, then the block's channels; `at` is the element's offset.  With d,
 * c, hw, cb and nb in scope. */
#define NB(cb) (CB == 1 ? 1 : (c - (cb) < CB ? c - (cb) : CB))
#define BLOCK_LOOP(...)                                                                  \
  for (int n_ = 0; n_ < d->n; n_++)                                                      \
    for (size_t i_ = 0; i_ < hw; i_++)                                                   \
      for (int k = 0; k < nb; k++) {                                                     \
        const size_t at = AT(n_, i_, cb + k);                                            \
        __VA_ARGS__;                                                                     \
      }

/* ---- the loops: float32 and bfloat16 activations, each NCHW and NHWC */
#define AT_NCHW(n, i, ch) (((size_t)(n) * c + (size_t)(ch)) * hw + (i))
#define AT_NHWC(n, i, ch) (((size_t)(n) * hw + (i)) * c + (size_t)(ch))

#define T float
#define IN(v) (v)
#define OUT(x) ((float)(x))
#define CB 1
#define AT AT_NCHW
#define FLAT_LOOPS 1
#define KFN(name) name##_f32
#include "backend_cpu_kernels_body.h"
#undef KFN
#undef CB
#undef AT
#undef FLAT_LOOPS
#define CB 16 /* 64 bytes */
#define AT AT_NHWC
#define FLAT_LOOPS 0
#define KFN(name) name##_f32_nhwc
#include "backend_cpu_kernels_body.h"
#undef KFN
#undef CB
#undef AT
#undef FLAT_LOOPS
#undef T
#undef IN
#undef OUT

#define T uint16_t
#define IN(v) gw_bf16_to_f32(v)
#define OUT(x) gw_f32_to_bf16((float)(x))
#define CB 1
#define AT AT_NCHW
#define FLAT_LOOPS 1
#define KFN(name) name##_bf16
#include "backend_cpu_kernels_body.h"
#undef KFN
#undef CB
#undef AT
#undef FLAT_LOOPS
#define CB 32 /* 64 bytes */
#define AT AT_NHWC
#define FLAT_LOOPS 0
#define KFN(name) name##_bf16_nhwc
#include "backend_cpu_kernels_body.h"
#undef KFN
#undef CB
#undef AT
#undef FLAT_LOOPS
#undef T
#undef IN
#undef OUT

/* ---- the entry points: the instance for the activations' dtype */
#define DISPATCH(name, ...)                                                              \
  do {                                                                                   \
    if (act == GW_BFLOAT16) name##_bf16(__VA_ARGS__);                                    \
    else name##_f32(__VA_ARGS__);                                                        \
  } while (0)
/* The same for the loops that depend on the layout too. */
#define DISPATCH_L(name, ...)                                                            \
  do {                                                                                   \
    if (act == GW_BFLOAT16 && nhwc) name##_bf16_nhwc(__VA_ARGS__);                       \
    else if (act == GW_BFLOAT16) name##_bf16(__VA_ARGS__);                               \
    else if (nhwc) name##_f32_nhwc(__VA_ARGS__);                                         \
    else name##_f32(__VA_ARGS__);                                                        \
  } while (0)

void gw__cpu_bn_fwd_train(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *z, int relu,
                          const float *gamma, const float *beta, void *y, float *save_mean, float *save_rstd,
                          float *running_mean, float *running_var) {
  DISPATCH_L(bn_fwd_train, d, x, z, relu, gamma, beta, y, save_mean, save_rstd, running_mean, running_var);
}

void gw__cpu_bn_fwd_infer(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *z, int relu,
                          const float *gamma, const float *beta, const float *running_mean, const float *running_var,
                          void *y) {
  DISPATCH_L(bn_fwd_infer, d, x, z, relu, gamma, beta, running_mean, running_var, y);
}

void gw__cpu_bn_bwd(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *ym, const void *dy,
                    const float *gamma, const float *save_mean, const float *save_rstd, void *dx, void *dz,
                    float *dgamma, float *dbeta) {
  DISPATCH_L(bn_bwd, d, x, ym, dy, gamma, save_mean, save_rstd, dx, dz, dgamma, dbeta);
}

void gw__cpu_bn_sums(const struct gw_op_desc *d, int act, int nhwc, const void *x, double *sums) {
  DISPATCH_L(bn_sums, d, x, sums);
}

void gw__cpu_bn_fwd_apply(const struct gw_op_desc *d, int act, int nhwc, const void *x, const float *gamma, const float *beta,
                          const float *mean, const float *rstd, void *y) {
  DISPATCH_L(bn_fwd_apply, d, x, gamma, beta, mean, rstd, y);
}

void gw__cpu_bn_bwd_sums(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *dy, const float *mean,
                         const float *rstd, double *sums) {
  DISPATCH_L(bn_bwd_sums, d, x, dy, mean, rstd, sums);
}

void gw__cpu_bn_bwd_apply(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *dy, const float *gamma,
                          const float *mean, const float *rstd, const double *sums, double count, void *dx) {
  DISPATCH_L(bn_bwd_apply, d, x, dy, gamma, mean, rstd, sums, count, dx);
}

void gw__cpu_avgpool_fwd(const struct gw_op_desc *d, int act, int nhwc, const void *x, void *y) {
  DISPATCH_L(avgpool_fwd, d, x, y);
}

void gw__cpu_avgpool_bwd(const struct gw_op_desc *d, int act, int nhwc, const void *dy, void *dx) {
  DISPATCH_L(avgpool_bwd, d, dy, dx);
}

void gw__cpu_loss_fwd_bwd(const struct gw_op_desc *d, int act, const void *logits, const int32_t *labels,
                          float grad_scale, float *loss, void *dlogits) {
  DISPATCH(loss_fwd_bwd, d, logits, labels, grad_scale, loss, dlogits);
}

void gw__cpu_add(size_t n, int act, const void *a, const void *b, void *y) { DISPATCH(add, n, a, b, y); }

/* ---- out of oneDNN's blocked weights layouts (backend_cpu_kernels.h)
 * oneDNN 2.6's own reorder from ABcd16b64a ran at ~3.4 GB/s on two cores
 * here (2048 x 1024 in 2.45 ms; this loop 0.46 ms).  One tile (bp x bq
 * elements, contiguous in the blocked copy) per outer block; the outer blocks
 * in the blocked copy's order when its strides fall with the dims (oneDNN's
 * "AB.." layouts), so reads run on, and the writes of neighbouring tiles
 * (the spatial positions, in a plain OIHW copy next to each other) meet in
 * the same cache lines. */
#define UNBLOCK_TILE(T)                                                 \
  do {                                                                  \
    const T *s_ = (const T *)src + sb;                                  \
    T *d_ = (T *)dst + db;                                              \
    for (int iq = 0; iq < bq; iq++)                                     \
      for (int ip = 0; ip < bp; ip++) d_[iq * dq + ip * dp] = s_[ip * bq + iq]; \
  } while (0)

void gw__cpu_unblock(const struct gw_cpu_unblock *t, const void *src, void *dst) {
  int64_t total = 1;
  for (int d = 0; d < t->ndims; d++) total *= t->nb[d];
  const int bp = t->bp, bq = t->bq;
  const int64_t dp = t->dstride[t->p], dq = t->dstride[t->q];
  dst = (char *)dst + t->doff * (int64_t)t->esize;
  OMP_FOR
  for (int64_t k = 0; k < total; k++) {
    int64_t rem = k, sb = 0, db = 0;
    for (int d = t->ndims - 1; d >= 0; d--) {
      const int64_t i = rem % t->nb[d];
      rem /= t->nb[d];
      sb += i * t->sstride[d];
      db += i * (d == t->p ? bp : d == t->q ? bq : 1) * t->dstride[d];
    }
    if (t->esize == 4) UNBLOCK_TILE(uint32_t);
    else UNBLOCK_TILE(uint16_t);
  }
}
