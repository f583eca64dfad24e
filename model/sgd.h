/* sgd.h - stochastic gradient descent with momentum over the model's one
 * contiguous parameter buffer, with PyTorch's torch.optim.SGD semantics:
 *
 *   d = g + wd * p            (weight decay only on tensors that take it)
 *   buf = d                   (first step)
 *   buf = momentum * buf + (1 - dampening) * d   (later steps)
 *   d = nesterov ? d + momentum * buf : buf
 *   p = p - lr * d
 *
 * Weight decay is applied per tensor: by default to conv and fc weights only,
 * never to batch-norm parameters or biases (every 1-D parameter of a ResNet).
 */
#ifndef GW_MODEL_SGD_H
#define GW_MODEL_SGD_H

#include <stddef.h>
#include <stdint.h>

#include "resnet.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gw_sgd_config {
  float momentum;      /* 0 disables the momentum buffer */
  float dampening;     /* PyTorch's default 0 */
  float weight_decay;  /* L2 on tensors with 2 or more dimensions */
  int nesterov;        /* needs momentum > 0 and dampening 0, as PyTorch */
  int decay_all;       /* non-zero: weight decay on every tensor (PyTorch's plain SGD) */
};

struct gw_sgd;

gw_result_t gw_sgd_create(const struct gw_model *m, const struct gw_sgd_config *cfg, struct gw_sgd **out);
void gw_sgd_free(struct gw_sgd *s); /* accepts NULL */

/* One step over params[num_params] with grads[num_params] at learning rate lr. */
gw_result_t gw_sgd_step(struct gw_sgd *s, float *params, const float *grads, float lr);

/* For a backend stepping in its own memory (backend.h sgd_step): the runs of
 * consecutive parameters that share a weight decay (in increasing offset order,
 * tiling the buffer), and one step's scalars at learning rate lr with the
 * gradients multiplied by grad_scale first (1 for none).  After such a step the
 * caller counts it with gw_sgd_set_steps(s, gw_sgd_steps(s) + 1). */
struct gw_sgd_run {
  size_t offset, len;
  float wd;
};
const struct gw_sgd_run *gw_sgd_runs(const struct gw_sgd *s, int *nruns);
struct gw_sgd_scalars;
void gw_sgd_scalars_at(const struct gw_sgd *s, float lr, float grad_scale, struct gw_sgd_scalars *out);
/* The host step over runs (what gw_sgd_step does; the cpu backend's sgd_step):
 * momentum NULL when the optimizer has none. */
void gw_sgd_apply(const struct gw_sgd_run *runs, int nruns, float *params, const float *grads, float *momentum,
                  const struct gw_sgd_scalars *sc);

/* The momentum buffer [num_params] (same layout as the parameters) and the
 * number of steps taken, for checkpoints; set_steps(0) restarts as a fresh
 * optimizer (the next step copies the gradient into the buffer). */
float *gw_sgd_momentum(struct gw_sgd *s);
int64_t gw_sgd_steps(const struct gw_sgd *s);
void gw_sgd_set_steps(struct gw_sgd *s, int64_t steps);

#ifdef __cplusplus
}
#endif
#endif /* GW_MODEL_SGD_H */
