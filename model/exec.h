/* exec.h - runs a model (resnet.h) on a backend (backend.h) at one batch size:
 * forward in training or evaluation mode, then the loss and backward, which
 * writes every parameter gradient into the model's one contiguous gradient
 * buffer and reports, as it goes, how much of that buffer is final.
 *
 * Because parameters are laid out in reverse forward order, backward finishes
 * them from offset 0 upward: the report is a single growing count ("gradients
 * [0, ready) will not change again this step"), which is exactly what a
 * gradient bucketer needs to start a bucket's allreduce while backward goes on.
 *
 * Batch norm and what follows it (bn -> relu, bn -> add -> relu) run as one
 * fused call of the backend where it has them (backend.h bn_act_*): one pass
 * over memory instead of two or three, the same values.  SyncBatchNorm turns
 * the fusion off (its phases run between the ranks' sums).
 *
 * Memory is planned once at creation: every activation backward needs is kept
 * (ReLU and the residual add run in place where nothing needs their input
 * afterwards), and activation gradients share a small pool of buffers whose
 * lifetimes are worked out from the layer graph.
 */
#ifndef GW_MODEL_EXEC_H
#define GW_MODEL_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "resnet.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gw_exec;

struct gw_exec_config {
  int batch;              /* samples per forward, >= 1 */
  float label_smoothing;  /* of the cross-entropy, in [0, 1] */
  int no_fuse;            /* 1: run every layer by itself (default 0: batch norm fused with the ReLU,
                             or the residual add and ReLU, after it where the backend can; the same
                             values either way) */
  int inference;          /* 1: evaluation only (gw_exec_forward with train 0; training forwards and
                             backward refused): no gradients, no batch statistics kept, and each
                             activation's memory reused once its last reader has run (a ResNet-50's
                             forward then holds a few activations instead of all of them) */
};

/* Called during backward with the number of leading gradient elements that are
 * final; the values only grow within a step and the last call says
 * gw_model_num_params().  Runs on the thread calling gw_exec_backward. */
typedef void (*gw_grad_ready_fn)(void *arg, size_t ready);

/* Plans every layer of m on backend b (ops) for cfg->batch samples and allocates
 * activations and work memory.  The model must outlive the executor.  With a
 * host-memory backend the executor computes on the model's own parameter,
 * gradient and statistics storage; otherwise it keeps backend copies (see
 * gw_exec_upload_model / gw_exec_download_model). */
gw_result_t gw_exec_create(struct gw_model *m, const struct gw_backend_ops *ops, struct gw_backend *b,
                           const struct gw_exec_config *cfg, struct gw_exec **out);
void gw_exec_free(struct gw_exec *e); /* accepts NULL */

/* The input pipeline: the next batch goes up while this one computes.  Copies
 * images (as gw_exec_forward takes them) and labels (checked here, as backward
 * checks them) into the executor's staging slot, converted to the activation
 * dtype on the host, and queues their transfer on the backend's copy stream
 * (backend.h upload_async: through pinned memory); returns without waiting for
 * it.  The next gw_exec_forward(e, NULL, train) takes the staged batch (its
 * work waits for the transfer on the device) and gw_exec_backward(e, NULL, ...)
 * its labels.  Two slots in turn: staging never touches the batch the last
 * staged forward took, so it may run while that step's backward computes;
 * staging again before the forward replaces the staged batch. */
gw_result_t gw_exec_stage(struct gw_exec *e, const float *images, const int32_t *labels);

/* Forward over `images` (host, NCHW fp32 [batch, in_channels, size, size]), or
 * the staged batch when images is NULL.
 * train != 0: batch statistics, running statistics updated (momentum 0.1,
 * unbiased variance) and num_batches_tracked incremented, activations kept for
 * backward; train == 0: running statistics, nothing updated.
 * A layer that fails fails the call with the backend's code; its message
 * (gw_model_last_error) is the backend's with "executor: forward of layer
 * NAME (INDEX): " in front (backward's likewise, "executor: the loss: " for
 * the loss). */
gw_result_t gw_exec_forward(struct gw_exec *e, const float *images, int train);

/* The logits of the last forward, copied to host memory [batch, classes]. */
gw_result_t gw_exec_logits(struct gw_exec *e, float *host_logits);

/* After a training forward: the mean label-smoothed cross-entropy over the batch
 * against `labels` (host, [batch], each in [0, classes); NULL after a staged
 * forward: the staged labels) into *loss, then
 * backward through every layer into the gradient buffer (overwritten, not
 * accumulated).  ready (may be NULL) is called as gradients become final. */
gw_result_t gw_exec_backward(struct gw_exec *e, const int32_t *labels, float *loss, gw_grad_ready_fn ready,
                             void *ready_arg);

/* Mixed precision's loss scale: backward starts from the loss's gradient times
 * `scale`, so every gradient comes out multiplied by it (exactly, for a power of
 * two, unless a value overflows); the loss reported stays unscaled.  1 by
 * default; the caller unscales (and skips steps whose gradients overflowed). */
gw_result_t gw_exec_set_loss_scale(struct gw_exec *e, float scale);

/* SyncBatchNorm: from now on every training-mode batch norm normalizes with the
 * statistics of the batch over ALL ranks (forward: sum x, sum x^2 and the count;
 * backward: sum dy, sum dy * xhat), which `sum` adds up across ranks in place
 * (n doubles; every rank calls it in the same order, once per BN per pass).
 * The running statistics then follow the global batch, as PyTorch's
 * SyncBatchNorm.  The BN parameters' own gradients stay this rank's (the
 * gradient allreduce averages them like every other).  sum == NULL turns it off. */
typedef gw_result_t (*gw_exec_sum_fn)(void *arg, double *buf, size_t n);
void gw_exec_set_sync_bn(struct gw_exec *e, gw_exec_sum_fn sum, void *arg);

/* Whether training can run: every batch norm must see at least 2 values per
 * channel (batch x h x w, times `ranks` with SyncBatchNorm), or its variance is
 * undefined (PyTorch refuses too).  GW_ERR_INVALID_ARGUMENT naming the first
 * layer that would not, and the smallest batch that would do; checked before
 * any step, which otherwise fails in the middle of the first one (after
 * earlier layers moved their running statistics). */
gw_result_t gw_exec_check_train(const struct gw_exec *e, int ranks);

/* For device-memory backends: copy the model's host parameters and running
 * statistics to the backend (after loading weights or an optimizer step on the
 * host), and the backend's parameters, gradients and statistics back.  No-ops
 * for host-memory backends. */
gw_result_t gw_exec_upload_model(struct gw_exec *e);
gw_result_t gw_exec_download_model(struct gw_exec *e);

/* For device-memory backends, the parts that change in a training step: the
 * gradients [first, first + count) (during backward, once `ready` has passed
 * first + count: the download waits for the work that made them) and the BN
 * running statistics.  No-ops for host-memory backends. */
gw_result_t gw_exec_download_grads(struct gw_exec *e, size_t first, size_t count);
gw_result_t gw_exec_download_stats(struct gw_exec *e);

/* The parameters and gradients [gw_model_num_params] the executor computes on,
 * in the backend's memory (the model's own storage for host-memory backends):
 * for a trainer that keeps the weights there (an optimizer step with the
 * backend's sgd_step, the gradients reduced in place). */
float *gw_exec_params(const struct gw_exec *e);
float *gw_exec_grads(const struct gw_exec *e);

/* How many batch-norm groups run fused (0 with no_fuse, a backend without the
 * fused calls, or SyncBatchNorm on). */
int gw_exec_fused_groups(const struct gw_exec *e);

/* Profiles (backends with time marks, backend.h mark): while on, each
 * training step's layers are timed on the backend's stream, forward and
 * backward, and added up per layer.  Turning it on clears the totals and
 * fails with GW_ERR_UNSUPPORTED on a backend without marks; the marks cost a
 * few microseconds per layer, and backward waits at its end for the step's
 * (on a GPU: the host no longer runs ahead of the device there).
 * gw_exec_profile gives per layer (gw_model's layer order, members of a
 * fused group at 0: their time is their leading BN's) and for the loss
 * (index nlayers) the seconds summed over the `steps` profiled.  fused and
 * member say how the last step profiled ran (SyncBatchNorm, turned on at any
 * time, runs every layer by itself). */
struct gw_exec_layer_time {
  const char *name;       /* the layer's (resnet.h), "loss" for the last entry */
  int kind;               /* enum gw_layer_kind, -1 for the loss */
  int fused;              /* BN leading a fused group: 1 bn -> relu, 2 bn -> add -> relu; else 0 */
  int member;             /* 1: runs inside its group's BN (times 0) */
  double fwd_s, bwd_s;
};
gw_result_t gw_exec_set_profile(struct gw_exec *e, int on);
const struct gw_exec_layer_time *gw_exec_profile(const struct gw_exec *e, int *nentries, int *steps);

/* Bytes the executor allocated (activations, gradient pool, work memory). */
size_t gw_exec_memory_bytes(const struct gw_exec *e);

#ifdef __cplusplus
}
#endif
#endif /* GW_MODEL_EXEC_H */
