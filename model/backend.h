/* backend.h - the one table of operations a compute backend provides to run the
 * layers of resnet.h: the cpu backend (oneDNN, backend_cpu.c) now, a cuDNN one
 * beside it later, chosen by the trainer without the model code changing.
 *
 * This is an interface, not an executor: it does not decide the order of layers,
 * where activations live or when gradients are ready (the training loop does).
 *
 * Conventions every backend follows:
 * - Tensors are fp32 (activations: the backend's act dtype, gw_act_t) in PyTorch's plain layouts: activations NCHW, conv weights
 *   OIHW, fc weight [classes, features]; in memory the backend can address (host
 *   for cpu, device for cudnn: see alloc/upload/download).  A backend may reorder
 *   internally (oneDNN's blocked formats) but every pointer crossing this table is
 *   plain, so any tensor can be compared with PyTorch's directly.  A backend
 *   created with layout GW_LAYOUT_NHWC keeps activations channels-last instead
 *   (PyTorch's channels_last: [n, h, w, c] in memory; shapes are still given as
 *   n, c, h, w); parameters keep their layouts either way.
 * - A layer is planned once (op_create: shapes, batch size and algorithm fixed,
 *   primitives and scratch memory made) and run many times with new pointers.
 * - Outputs are overwritten, never accumulated (where a tensor has two consumers,
 *   as a block's input has, the executor sums the two gradients with `add`).
 * - Every call returns gw_result_t; on failure gw_model_last_error() says which
 *   operation, which shape and what the library reported.
 */
#ifndef GW_MODEL_BACKEND_H
#define GW_MODEL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "gw_config.h"
#include "resnet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One instance: engine, stream, thread settings.  A backend runs one call at
 * a time (the cpu backend's reordered copies share one arena; it refuses a
 * second call while one runs): threads that compute at once each make their
 * own.  Executors on one backend run one after another. */
struct gw_backend;
struct gw_op;       /* one planned layer */
struct gw_sgd_run;      /* sgd.h */
struct gw_sgd_scalars;  /* sgd_math.h */

struct gw_backend_config {
  int threads;      /* cpu: compute threads for this backend's calls, applied on the thread making
                       each call (OpenMP's count is per thread); 0: the process's default, OpenMP's
                       count when the first cpu backend was created */
  int tf32;         /* cudnn: 1 lets fp32 convolutions and the fc layer run on TF32 tensor
                       cores (inputs rounded to 10-bit mantissas: PyTorch's default for
                       convolutions); 0 keeps full fp32 (engines with tensor-core, Winograd
                       or FFT numerics are not used) */
  int act;          /* the activations' dtype (mixed precision): 0 or GW_FLOAT32,
                       GW_BFLOAT16 (cpu: oneDNN's bf16 primitives, AVX512 at least)
                       or GW_FLOAT16 (cudnn only: needs loss scaling, the range
                       ends at 65504); parameters, their gradients, BN statistics and the loss stay
                       float32 whatever it is.  A backend refuses what it cannot do
                       (GW_ERR_UNSUPPORTED). */
  int layout;       /* the activations' memory layout: GW_LAYOUT_NCHW (0, the default) or
                       GW_LAYOUT_NHWC (channels last: the layout of tensor-core convolutions, so
                       cuDNN need not transpose around each one).  Batch norm and pooling give
                       the same bits either way (each channel's values are summed in the same
                       order; except the cpu backend's max pool backward, whose oneDNN kernels
                       add overlapping windows in another order per layout); a fully connected
                       layer over several positions still takes its features in PyTorch's
                       [c, h, w] order. */
};

/* gw_backend_config.layout. */
enum { GW_LAYOUT_NCHW = 0, GW_LAYOUT_NHWC = 1 };

/* The layout a trainer takes when none is given (gw-train, model_bench): the
 * one measured faster end to end for ResNet-50 on the backend named ("cpu",
 * "cudnn"), its activations' dtype and the images' side.  cudnn: NHWC with
 * 16-bit activations (bf16 1.11x NCHW on an H200), NCHW for float32 and TF32
 * (NHWC not measured).  cpu: NHWC below 56 px (28x28: 1.17x float32, 1.22x
 * bf16; 32x32: 1.12x; oneDNN's blocked kernels then pay more for the
 * transposes to and from NCHW around every convolution than they gain),
 * NCHW from there (56 and 112 even, 224: NCHW 1.17x). */
int gw_backend_default_layout(const char *backend, int act, int image_size);

/* An activation tensor: the x, y, dx and dy of every layer, the logits and their
 * gradient.  Its elements are of the backend's activation dtype (act_dtype):
 * float32 unless the backend was created with another. */
typedef void gw_act_t;

/* One layer at one batch size.  Shapes are per the layer kind (in memory as the
 * backend's layout says: [n, h, w, c] for NHWC):
 *   CONV     x [n, c, h, w], w [k, c, kernel, kernel], y [n, k, p, q]
 *   BN       x, y [n, c, h, w] (k = c, p = h, q = w); eps, momentum as PyTorch
 *   RELU, ADD x, y [n, c, h, w]
 *   MAXPOOL  x [n, c, h, w], y [n, c, p, q]
 *   AVGPOOL  x [n, c, h, w], y [n, c, 1, 1]
 *   FC       x [n, c * h * w], w [k, c * h * w], b [k], y [n, k]
 *   LOSS     logits [n, k], labels [n] (the softmax cross-entropy; see loss_fwd_bwd) */
enum { GW_OP_LOSS = 100 };
struct gw_op_desc {
  int kind;                  /* enum gw_layer_kind, or GW_OP_LOSS */
  int n;                     /* batch */
  int c, h, w;               /* input, one sample */
  int k, p, q;               /* output channels, height, width */
  int kernel, stride, pad;   /* CONV, MAXPOOL (pad on every side) */
  /* BN: 1e-5 and 0.1 in torchvision, doubles as PyTorch's (0.1f is
   * 0.10000000149: about one running statistic in ten came out one float
   * step off PyTorch's, the differences building up over steps) */
  double eps, momentum;
  float label_smoothing;     /* LOSS: 0 for plain cross-entropy */
};

/* The description of model layer i at batch size n (BN: eps 1e-5, momentum 0.1). */
void gw_model_op_desc(const struct gw_model *m, int layer, int n, struct gw_op_desc *d);

struct gw_backend_ops {
  const char *name;          /* "cpu", "cudnn" */
  int host_memory;           /* 1: alloc returns host memory the caller may read and write
                                directly (cpu); 0: device memory, reached through upload /
                                download / copy only */
  gw_result_t (*create)(const struct gw_backend_config *cfg, struct gw_backend **b);
  void (*destroy)(struct gw_backend *b);             /* accepts NULL */

  /* Memory the backend computes on (64-byte aligned host memory for cpu). */
  void *(*alloc)(struct gw_backend *b, size_t bytes);
  void (*dealloc)(struct gw_backend *b, void *p);
  gw_result_t (*upload)(struct gw_backend *b, void *dst, const void *host_src, size_t bytes);
  gw_result_t (*download)(struct gw_backend *b, void *host_dst, const void *src, size_t bytes);
  gw_result_t (*copy)(struct gw_backend *b, void *dst, const void *src, size_t bytes); /* backend to backend */
  /* The input pipeline: the next batch goes up while this one computes.
   * upload_async copies host_src (any host memory; the backend stages it in
   * pinned memory of its own, one buffer per slot) to dst on the backend's
   * copy stream and returns without waiting for the transfer; `slot` (0 or 1)
   * names the transfer: a slot's next upload_async first waits (host) for its
   * previous one.  upload_order(slot) makes the operations queued after it wait
   * (on the device) for the slot's last transfer, and marks every other slot's
   * destination free once the operations queued before it are done: the next
   * transfer of such a slot waits (on the device) for them.  So two slots used
   * in turn (stage one, compute on the other) never overwrite what is being
   * read.  A host backend copies at once. */
  gw_result_t (*upload_async)(struct gw_backend *b, void *dst, const void *host_src, size_t bytes, int slot);
  gw_result_t (*upload_order)(struct gw_backend *b, int slot);
  /* The slot's own host buffer (pinned for a device backend) of at least
   * `bytes`, once the slot's previous transfer has left it: the caller fills it
   * and passes it to upload_async as host_src (same slot, at most `bytes`),
   * which then sends it as it is instead of copying it in first.  Valid until
   * the slot's next stage_buffer or upload_async. */
  gw_result_t (*stage_buffer)(struct gw_backend *b, int slot, size_t bytes, void **host);

  /* The dtype of activation tensors (gw_dtype_t: GW_FLOAT32, GW_BFLOAT16 or GW_FLOAT16). */
  int (*act_dtype)(const struct gw_backend *b);
  /* Their layout (GW_LAYOUT_NCHW or GW_LAYOUT_NHWC). */
  int (*layout)(const struct gw_backend *b);

  gw_result_t (*op_create)(struct gw_backend *b, const struct gw_op_desc *d, struct gw_op **op);
  void (*op_destroy)(struct gw_op *op);              /* accepts NULL */

  /* Convolution without bias.  bwd_data: dx [n, c, h, w] from dy [n, k, p, q];
   * bwd_weights: dw [k, c, kernel, kernel] from x and dy. */
  gw_result_t (*conv_fwd)(struct gw_op *op, const gw_act_t *x, const float *w, gw_act_t *y);
  gw_result_t (*conv_bwd_data)(struct gw_op *op, const gw_act_t *dy, const float *w, gw_act_t *dx);
  gw_result_t (*conv_bwd_weights)(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, float *dw);

  /* Batch norm.  Training: normalizes with the batch statistics, writes them to
   * save_mean / save_rstd [c] (1/sqrt(var + eps), biased var) for backward, and
   * updates running_mean / running_var [c] with momentum and the UNBIASED variance
   * (PyTorch's rule).  Inference uses the running statistics. */
  gw_result_t (*bn_fwd_train)(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta, gw_act_t *y,
                              float *save_mean, float *save_rstd, float *running_mean, float *running_var);
  gw_result_t (*bn_fwd_infer)(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta,
                              const float *running_mean, const float *running_var, gw_act_t *y);
  gw_result_t (*bn_bwd)(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *gamma,
                        const float *save_mean, const float *save_rstd, gw_act_t *dx, float *dgamma, float *dbeta);

  /* Batch norm in phases, for statistics shared across ranks (SyncBatchNorm): the
   * executor sums the per-rank partial sums over all ranks between the phases.
   * bn_sums:      sums[ch] = sum x, sums[c + ch] = sum x^2 over this rank's n*h*w
   *               values of channel ch (double: the global variance is
   *               E[x^2] - mean^2; its rounding grows as (mean / std)^2 times
   *               the values summed: at mean 1e3 x std about 1e-7 typical
   *               over 400k values, the level of float statistics; a shift by
   *               a per-channel constant every rank shares would remove it).
   * bn_fwd_apply: y = (x - mean) * rstd * gamma + beta with the given statistics.
   * bn_bwd_sums:  sums[ch] = sum dy, sums[c + ch] = sum dy * (x - mean) * rstd.
   * bn_bwd_apply: dx = gamma * rstd * (dy - sums[ch] / count - xhat * sums[c + ch] / count)
   *               with the sums and the value count over every rank. */
  gw_result_t (*bn_sums)(struct gw_op *op, const gw_act_t *x, double *sums);
  gw_result_t (*bn_fwd_apply)(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta,
                              const float *mean, const float *rstd, gw_act_t *y);
  gw_result_t (*bn_bwd_sums)(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *mean,
                             const float *rstd, double *sums);
  gw_result_t (*bn_bwd_apply)(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *gamma,
                              const float *mean, const float *rstd, const double *sums, double count, gw_act_t *dx);

  /* Batch norm fused with what follows it in a ResNet (the executor's bn -> relu
   * and bn -> add -> relu): y = relu(bn(x) + z), without "+ z" when z is NULL;
   * the same values as bn_fwd_train / bn_fwd_infer, then add, then relu_fwd
   * (each result rounded to the activation dtype where the separate op would
   * round it).  y may alias x or z.  bn_act_bwd: with g = (y > 0 ? dy : 0), y
   * the fused output: bn_bwd with g as its dy, and dz = g when dz is not NULL
   * (the residual's gradient).  dx may alias dy.  Optional: NULL in a backend
   * without them (the executor then runs the layers one by one). */
  gw_result_t (*bn_act_fwd_train)(struct gw_op *op, const gw_act_t *x, const gw_act_t *z, const float *gamma,
                                  const float *beta, gw_act_t *y, float *save_mean, float *save_rstd,
                                  float *running_mean, float *running_var);
  gw_result_t (*bn_act_fwd_infer)(struct gw_op *op, const gw_act_t *x, const gw_act_t *z, const float *gamma,
                                  const float *beta, const float *running_mean, const float *running_var,
                                  gw_act_t *y);
  gw_result_t (*bn_act_bwd)(struct gw_op *op, const gw_act_t *x, const gw_act_t *y, const gw_act_t *dy,
                            const float *gamma, const float *save_mean, const float *save_rstd, gw_act_t *dx,
                            gw_act_t *dz, float *dgamma, float *dbeta);

  /* ReLU (y may alias x; bwd takes the forward output y). */
  gw_result_t (*relu_fwd)(struct gw_op *op, const gw_act_t *x, gw_act_t *y);
  gw_result_t (*relu_bwd)(struct gw_op *op, const gw_act_t *y, const gw_act_t *dy, gw_act_t *dx);

  /* Max pool keeps the argmax positions in `workspace` (workspace_bytes(op) bytes,
   * the executor's memory) for backward. */
  size_t (*workspace_bytes)(struct gw_op *op);
  gw_result_t (*maxpool_fwd)(struct gw_op *op, const gw_act_t *x, gw_act_t *y, void *workspace);
  gw_result_t (*maxpool_bwd)(struct gw_op *op, const gw_act_t *dy, const void *workspace, gw_act_t *dx);

  /* Global average pool. */
  gw_result_t (*avgpool_fwd)(struct gw_op *op, const gw_act_t *x, gw_act_t *y);
  gw_result_t (*avgpool_bwd)(struct gw_op *op, const gw_act_t *dy, gw_act_t *dx);

  /* Fully connected: y = x w^T + b; backward gives dx, dw, db. */
  gw_result_t (*fc_fwd)(struct gw_op *op, const gw_act_t *x, const float *w, const float *b, gw_act_t *y);
  gw_result_t (*fc_bwd)(struct gw_op *op, const gw_act_t *x, const float *w, const gw_act_t *dy, gw_act_t *dx, float *dw,
                        float *db);

  /* Residual add, also the sum of two gradients: y = a + b (y may alias a or b). */
  gw_result_t (*add)(struct gw_op *op, const gw_act_t *a, const gw_act_t *b, gw_act_t *y);

  /* Softmax cross-entropy with label smoothing, mean over the batch (PyTorch's
   * CrossEntropyLoss(label_smoothing=s)): *loss (host) and dlogits [n, k], the
   * latter multiplied by grad_scale (mixed precision's loss scale: a power of
   * two keeps every gradient exactly scaled; 1 for none), *loss unscaled. */
  gw_result_t (*loss_fwd_bwd)(struct gw_op *op, const gw_act_t *logits, const int32_t *labels, float grad_scale,
                              float *loss, gw_act_t *dlogits);

  /* Training in backend memory, for a trainer that keeps the master weights,
   * their gradients and the momentum there (gw-train on a GPU: nothing crosses
   * to the host per step but the loss).
   * sgd_step:  sgd_math.h's rule (with its grad_scale: the loss scaler's
   *            unscale, fused) over the runs (sgd.h: gw_sgd_runs, host memory)
   *            of params / grads / momentum [num_params] (momentum NULL
   *            without one), in backend memory: the bits of gw_sgd_step on
   *            the host.
   * nonfinite: *found (host) = 1 when any of x [n] is inf or NaN, else 0; waits
   *            for the work queued before it.
   * stream:    the CUDA stream (cudaStream_t) the backend computes on, for
   *            ordering another stream's work (the gradient allreduce) after
   *            it; NULL for a backend whose calls are done when they return. */
  gw_result_t (*sgd_step)(struct gw_backend *b, const struct gw_sgd_run *runs, int nruns, float *params,
                          const float *grads, float *momentum, const struct gw_sgd_scalars *sc);
  gw_result_t (*nonfinite)(struct gw_backend *b, const float *x, size_t n, int *found);
  void *(*stream)(struct gw_backend *b);

  /* Time marks, for profiles (gw_exec_set_profile); NULL where a backend has
   * none.  mark:  mark number `slot` (0 <= slot < GW_BACKEND_MARKS, reused
   *               freely) taken after the work queued so far (on a GPU an
   *               event on the stream: nothing waits); the cpu backend, whose
   *               calls return with their work done, reads the clock.
   * mark_elapsed: *seconds from mark `from` to mark `to`, waiting for both. */
  gw_result_t (*mark)(struct gw_backend *b, int slot);
  gw_result_t (*mark_elapsed)(struct gw_backend *b, int from, int to, double *seconds);
};
#define GW_BACKEND_MARKS 4096

#if GW_HAVE_ONEDNN
/* oneDNN on the host (backend_cpu*.c): every entry implemented, each checked
 * against a naive double-precision reference in test/test_model_backend.c. */
extern const struct gw_backend_ops gw_backend_cpu;
#endif

#if GW_HAVE_CUDNN
/* CUDA on the device current when create is called (backend_cudnn.c): cuDNN's
 * graph API for the convolutions, cuBLAS for the fully connected layer, its own
 * kernels (cudnn_kernels.cu) for the rest.  Memory is device memory; everything
 * runs in order on one stream of the backend's; upload and download wait for it.
 * create returns GW_ERR_UNSUPPORTED when there is no usable GPU.
 * The backend is a module of its own (libgwcudnn.so, backend_module.h), loaded
 * at the first call: the table, or NULL with gw_model_last_error() saying
 * which files were tried and why each failed (then every call fails alike). */
const struct gw_backend_ops *gw_backend_cudnn_ops(void);
#endif

#ifdef __cplusplus
}
#endif
#endif /* GW_MODEL_BACKEND_H */
