/* test_model_exec.h - what the files of the model-exec test share: a small
 * ResNet on a backend with an executor, a batch of inputs and labels
 * (test_model_exec.c), and each file's cases.  See test_model_exec.c's header
 * for what is tested. */
#ifndef GW_TEST_MODEL_EXEC_H
#define GW_TEST_MODEL_EXEC_H

#include <check.h>
#include <stdint.h>

#include "backend.h"
#include "exec.h"
#include "resnet.h"

struct rig {
  struct gw_model *m;
  struct gw_backend *b;
  struct gw_exec *e;
  float *x;   /* [batch, in_channels, image_size, image_size] */
  int32_t *y; /* [batch] */
  int batch;
};

/* ResNet-`depth` at 1/16 width, 3 classes, 2 input channels: ResNet-18 on
 * 16x16 with the small stem, the others on 64x64 with the ImageNet stem. */
void small_config(struct gw_model_config *cfg, int depth);
/* A model of cfg, a backend made with bc, an executor for `batch` (label
 * smoothing 0.1) and deterministic inputs and labels (sample i's the same
 * whatever the batch); failing the test on an error. */
void rig_up_cfg(struct rig *r, const struct gw_backend_ops *ops, const struct gw_model_config *cfg, int batch,
                const struct gw_backend_config *bc);
/* The same with small_config(depth). */
void rig_up_with(struct rig *r, const struct gw_backend_ops *ops, int depth, int batch,
                 const struct gw_backend_config *bc);
/* The same with one thread. */
void rig_up(struct rig *r, const struct gw_backend_ops *ops, int depth, int batch);
void rig_down(struct rig *r, const struct gw_backend_ops *ops);
/* A training forward and backward of r->x, r->y; the loss. */
float train_step(struct rig *r, gw_grad_ready_fn fn, void *arg);

/* Each further file's case (test_model_exec_<name>.c, CK_RUN_CASE=<name>). */
TCase *exec_sync_tcase(void);
TCase *exec_errors_tcase(void);

#endif
