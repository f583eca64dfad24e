/* backend_cpu_kernels.h - the cpu backend's operations written as plain C loops
 * rather than oneDNN primitives (backend_cpu_kernels.c): batch norm, global
 * average pool and the loss.  Internal to backend_cpu.c, which checks the op kind
 * and shapes before calling them.  Shapes are those of struct gw_op_desc. */
#ifndef GW_MODEL_BACKEND_CPU_KERNELS_H
#define GW_MODEL_BACKEND_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* act: the activations' gw_dtype_t (GW_FLOAT32 or GW_BFLOAT16): x, y, dx, dy,
 * logits and dlogits hold such elements; everything else is float / double.
 * nhwc: the activations are channels-last (backend.h GW_LAYOUT_NHWC), else NCHW;
 * the results are the same bits either way (each channel's values are summed in
 * the same order).  x, y [n, c, h, w]; gamma, beta, save_mean, save_rstd, running_mean, running_var [c].
 * Needs n * h * w >= 2 (the unbiased variance divides by n * h * w - 1).
 * Fused (backend.h bn_act_*): z (the residual, or NULL) added and ReLU applied
 * (relu != 0) to the output; backward masks dy by the fused output ym (NULL:
 * no mask) and writes the masked dy to dz (NULL: not wanted). */
void gw__cpu_bn_fwd_train(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *z, int relu,
                          const float *gamma, const float *beta, void *y, float *save_mean, float *save_rstd,
                          float *running_mean, float *running_var);
void gw__cpu_bn_fwd_infer(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *z, int relu,
                          const float *gamma, const float *beta, const float *running_mean, const float *running_var,
                          void *y);
void gw__cpu_bn_bwd(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *ym, const void *dy,
                    const float *gamma, const float *save_mean, const float *save_rstd, void *dx, void *dz,
                    float *dgamma, float *dbeta);

/* The phases of SyncBatchNorm (backend.h: bn_sums ... bn_bwd_apply). */
void gw__cpu_bn_sums(const struct gw_op_desc *d, int act, int nhwc, const void *x, double *sums);
void gw__cpu_bn_fwd_apply(const struct gw_op_desc *d, int act, int nhwc, const void *x, const float *gamma, const float *beta,
                          const float *mean, const float *rstd, void *y);
void gw__cpu_bn_bwd_sums(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *dy, const float *mean,
                         const float *rstd, double *sums);
void gw__cpu_bn_bwd_apply(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *dy, const float *gamma,
                          const float *mean, const float *rstd, const double *sums, double count, void *dx);

/* x, dx [n, c, h, w]; y, dy [n, c]. */
void gw__cpu_avgpool_fwd(const struct gw_op_desc *d, int act, int nhwc, const void *x, void *y);
void gw__cpu_avgpool_bwd(const struct gw_op_desc *d, int act, int nhwc, const void *dy, void *dx);

/* logits, dlogits [n, k]; labels [n] in [0, k) (checked by the caller). */
void gw__cpu_loss_fwd_bwd(const struct gw_op_desc *d, int act, const void *logits, const int32_t *labels,
                          float grad_scale, float *loss, void *dlogits);

/* A copy out of one of oneDNN's blocked layouts with two inner blocks (its
 * weights' and weight gradients' "ABcd16b64a" and the like) into a plain one:
 * element (i_0 .. i_{ndims-1}) sits in the blocked copy at
 * sum_d (i_d / blk_d) * sstride[d] + (i_p % bp) * bq + (i_q % bq) and in the
 * plain one at sum_d i_d * dstride[d] (strides in elements; blk_d is bp for
 * dim p, bq for dim q, else 1), plus doff in the plain one (its oneDNN
 * offset0: a view that starts inside its buffer).  nb[d]: dims[d] / blk_d
 * (no padding).  esize: 2 or 4 bytes (copied as they are). */
struct gw_cpu_unblock {
  int ndims, p, q, bp, bq;
  size_t esize;
  int64_t doff;
  int64_t nb[6], sstride[6], dstride[6];
};
void gw__cpu_unblock(const struct gw_cpu_unblock *t, const void *src, void *dst);

/* y = a + b over n elements (y may alias a or b). */
void gw__cpu_add(size_t n, int act, const void *a, const void *b, void *y);

#endif
