/* cudnn_kernels.h - the cudnn backend's own CUDA kernels (cudnn_kernels.cu), for
 * what cuDNN and cuBLAS do not do the way backend.h defines it: batch norm (with
 * the saved 1/sqrt(var + eps) and PyTorch's running-statistics rule, and the
 * SyncBatchNorm phases), ReLU, the residual add, max and global average pooling,
 * the fully connected layer's bias, and softmax cross-entropy with label smoothing.
 *
 * C callable.  Every pointer is device memory; `stream` is the backend's
 * cudaStream_t; each function enqueues its kernels on it and returns the launch's
 * cudaError_t as an int (0: enqueued).  Tensors are in backend.h's plain
 * layouts: NCHW, or NHWC where a launcher takes nhwc != 0 (the same results,
 * bit for bit: each channel's values are summed in the same order), shapes as
 * struct gw_op_desc; the caller (backend_cudnn.c) has
 * checked the op kind and shapes.  Sums accumulate in double, as the cpu backend's
 * (backend_cpu_kernels.c), so both agree to float rounding.
 *
 * Mixed precision: activation tensors (void *: x, y, dx, dy, the logits and
 * dlogits) have the dtype `act`, GW_FLOAT32, GW_BFLOAT16 or GW_FLOAT16 (gw_dtype_t as an
 * int; any other value returns cudaErrorInvalidValue before anything else);
 * parameters, their gradients, BN statistics, sums and the loss are float or
 * double as typed.  Every activation is read as float (exact), the arithmetic is
 * the float32 path's, and every activation written is rounded once from float
 * to `act` (bf16: to nearest even, a NaN kept a quiet NaN: model/half.h's
 * gw_f32_to_bf16, the cpu backend's, bit for bit).  Results do not depend
 * on the launch geometry or on timing (no atomics on floating point): the same
 * inputs give the same bits on every run.  The arithmetic is in
 * cudnn_kernels_math.cuh (host-tested by test/test_cudnn_kernels_host.cu).
 *
 * An output with no elements returns 0 without launching; a reduction over no
 * values writes its empty result (sums 0; the loss of n = 0 rows is 0 / 0 = NaN,
 * as the cpu backend's).  Index limits: n * h * w, c * h * w and c * p * q
 * below 2^31 (else cudaErrorInvalidValue). */
#ifndef GW_MODEL_CUDNN_KERNELS_H
#define GW_MODEL_CUDNN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Batch norm over x [n, c, h, w] per channel; count = n * h * w values per channel
 * on this rank (SyncBatchNorm passes the count over all ranks where it says).
 * sums [2c] doubles, mean / rstd / gamma / beta / running_* [c] floats. */

/* sums[ch] = sum x, sums[c + ch] = sum x^2 (backend.h bn_sums).  This and
 * bn_bwd_sums take 16 * c * ceil(n * h * w / 8192) bytes of scratch for the
 * per-block partials, stream-ordered on `stream` (cudaMallocFromPoolAsync from a
 * private pool of the current device, freed after the kernels): safe from any
 * thread and stream, and under graph capture; may return cudaErrorMemoryAllocation. */
int gw__cu_bn_sums(const struct gw_op_desc *d, int act, int nhwc, const void *x, double *sums, void *stream);
/* From sums over `count` values: mean = s / count, var = s2 / count - mean^2
 * (biased, clamped at 0), rstd = 1 / sqrt(var + eps).  When running_mean is not
 * NULL also PyTorch's update with d->momentum and the unbiased variance
 * var * count / (count - 1) (count >= 2), computed in double, rounded once;
 * running_var must then be given too.  sums from bn_sums lose about
 * log2(mean^2 / var) of double's 53 bits to the cancellation in var (the cpu
 * backend's single-rank training path takes two passes instead): negligible
 * unless |mean| is ~1e5 times the spread or more. */
int gw__cu_bn_stats(const struct gw_op_desc *d, const double *sums, double count, float *mean, float *rstd,
                    float *running_mean, float *running_var, void *stream);
/* Fusion (backend.h bn_act_*): the forward kernels take z (the residual, added
 * after the BN output's rounding, in float, rounded once; NULL: none) and relu
 * (non-zero: ReLU last), y may alias x or z; the backward ones take ym (the
 * fused output: dy is masked by ym > 0 first; NULL: no mask) and bwd_apply
 * writes the masked dy to dz (NULL: not wanted). */
/* y = (x - mean) * rstd * gamma + beta (backend.h bn_fwd_apply). */
int gw__cu_bn_fwd_apply(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *z, int relu,
                        const float *gamma, const float *beta, const float *mean, const float *rstd, void *y,
                        void *stream);
/* Inference: y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta. */
int gw__cu_bn_fwd_infer(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *z, int relu,
                        const float *gamma, const float *beta, const float *running_mean, const float *running_var,
                        void *y, void *stream);
/* sums[ch] = sum dy, sums[c + ch] = sum dy * (x - mean) * rstd (backend.h bn_bwd_sums). */
int gw__cu_bn_bwd_sums(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *ym, const void *dy,
                       const float *mean, const float *rstd, double *sums, void *stream);
/* dx = gamma * rstd * (dy - sums[ch] / count - xhat * sums[c + ch] / count) (backend.h bn_bwd_apply). */
int gw__cu_bn_bwd_apply(const struct gw_op_desc *d, int act, int nhwc, const void *x, const void *ym, const void *dy,
                        const float *gamma, const float *mean, const float *rstd, const double *sums, double count,
                        void *dx, void *dz, void *stream);
/* dgamma[ch] = sums[c + ch], dbeta[ch] = sums[ch], rounded to float. */
int gw__cu_bn_param_grads(const struct gw_op_desc *d, const double *sums, float *dgamma, float *dbeta, void *stream);

/* Element-wise over n activations: y = max(x, 0) (y may alias x; a NaN passes, as
 * PyTorch's and oneDNN's ReLU); dx = dy where y > 0, else 0 (dx may alias dy);
 * y = a + b in float, rounded once (y may alias a or b; wholly, not in part). */
int gw__cu_relu_fwd(size_t n, int act, const void *x, void *y, void *stream);
int gw__cu_relu_bwd(size_t n, int act, const void *y, const void *dy, void *dx, void *stream);
int gw__cu_add(size_t n, int act, const void *a, const void *b, void *y, void *stream);

/* Max pool (d->kernel, d->stride, d->pad on every side; padding never wins):
 * y [n, c, p, q] and argmax [n, c, p, q], the index within the input plane
 * (ih * w + iw) of the value taken (the first in row-major window order on ties,
 * as PyTorch; a NaN is taken as the max, `v > max || isnan(v)`, so with several
 * NaNs the last one; a window wholly in the padding gives -inf and -1).
 * Backward: dx [n, c, h, w] = the sum (in double, windows in row-major order) of
 * dy over the windows whose argmax is that position (a gather: every element of
 * dx written; no atomics). */
int gw__cu_maxpool_fwd(const struct gw_op_desc *d, int act, int nhwc, const void *x, void *y, int32_t *argmax, void *stream);
int gw__cu_maxpool_bwd(const struct gw_op_desc *d, int act, int nhwc, const void *dy, const int32_t *argmax, void *dx,
                       void *stream);

/* Global average pool: y [n, c] = mean over h * w of x [n, c, h, w]; dx = dy / (h * w). */
int gw__cu_avgpool_fwd(const struct gw_op_desc *d, int act, int nhwc, const void *x, void *y, void *stream);
int gw__cu_avgpool_bwd(const struct gw_op_desc *d, int act, int nhwc, const void *dy, void *dx, void *stream);

/* Fully connected bias: y [n, k] (act) += b [k] (float), in float, rounded once;
 * db [k] (float) = sum over n of dy [n, k] (act), in double, rounded once. */
int gw__cu_bias_add(int n, int k, int act, const float *b, void *y, void *stream);
int gw__cu_bias_grad(int n, int k, int act, const void *dy, float *db, void *stream);

/* Softmax cross-entropy with label smoothing s = d->label_smoothing over logits
 * [n, k] (n = d->n, k = d->k) and labels [n] in [0, k) (a row whose label is
 * not: nothing indexed with it, its row loss NaN, and *bad (one int, device) =
 * the first such row; else *bad = 0x7f7f7f7f, so one download after the
 * kernels brings the verdict with the loss),
 * PyTorch's CrossEntropyLoss(label_smoothing=s, reduction='mean'):
 *   row loss = logsumexp(z) - (1 - s) z[label] - (s / k) sum_j z[j]
 *   dlogits[i, j] = (softmax(z_i)[j] - (1 - s) [j == label_i] - s / k) / n * grad_scale
 * (in double, rounded once: a power-of-two grad_scale scales exactly); row_loss [n] is scratch; *loss (one float, device) = the mean of the row losses.
 * Sums in double. */
int gw__cu_loss_fwd_bwd(const struct gw_op_desc *d, int act, const void *logits, const int32_t *labels,
                        float grad_scale, float *row_loss, float *loss, int *bad, void *dlogits, void *stream);

/* dst [n] (dst_dtype) = src [n] (src_dtype), float32 to or from GW_BFLOAT16 or
 * GW_FLOAT16 (any other pair: cudaErrorInvalidValue): float32 -> 16 bits rounds
 * to nearest even, a NaN kept a quiet NaN; 16 bits -> float32 is exact; equal dtypes copy
 * (cudaMemcpyAsync).  dst and src must not overlap (cudaErrorInvalidValue),
 * except dst == src with equal dtypes: nothing to do, 0.  n = 0: 0. */
int gw__cu_cast(size_t n, int dst_dtype, void *dst, int src_dtype, const void *src, void *stream);

/* dst [n] = src [n] (GW_FLOAT32, GW_BFLOAT16 or GW_FLOAT16) widened to double
 * by the integer path the NHWC sums' variant 2 reads with (gwk::widen_d):
 * exactly (double) of the float widening, NaN payloads included (the GPU
 * check's test; any other dtype: cudaErrorInvalidValue). */
int gw__cu_widen_f64(size_t n, int src_dtype, const void *src, double *dst, void *stream);

/* Seconds spent so far choosing the NHWC batch-norm sums' variant per shape
 * (cudnn_kernels_nhwc.cu, GW_BN_NHWC_KERNEL): GW_CUDNN_KERNEL_TIMES leaves it
 * out of the call sites' times. */
double gw__cu_tune_seconds(void);

/* The weights of an NHWC convolution (cudnn_kernels_nhwc.cu): [k][c][rs] (OIHW,
 * rs = kernel * kernel) to [k][rs][c] (OHWI) when to_last, else back, converted
 * from src_dtype to dst_dtype as gw__cu_cast converts (float32 to float32, or
 * one of them float32 and the other GW_BFLOAT16 / GW_FLOAT16; else
 * cudaErrorInvalidValue, as for dst == src). */
int gw__cu_cast_perm(int k, int c, int rs, int to_last, int dst_dtype, void *dst, int src_dtype, const void *src,
                     void *stream); /* k * c * rs below 2^31 */

/* Training (cudnn_optim.cu).  sgd_step: sgd_math.h's rule over the runs (device
 * memory, nruns <= 65535; max_len the longest run's length) of params / grads /
 * momentum (NULL without momentum), the host's bits.  nonfinite: *flag (device
 * int) = 1 when any of x [n] is inf or NaN, else 0. */
struct gw_sgd_run;
struct gw_sgd_scalars;
int gw__cu_sgd_step(const struct gw_sgd_run *runs, int nruns, size_t max_len, float *params, const float *grads,
                    float *momentum, const struct gw_sgd_scalars *sc, void *stream);
int gw__cu_nonfinite(const float *x, size_t n, int *flag, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* GW_MODEL_CUDNN_KERNELS_H */
