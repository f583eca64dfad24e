/* test_model_exec.c - the executor (model/exec.c) and SGD (model/sgd.c) on the
 * cpu backend, without PyTorch (test_model_torch.c compares with PyTorch's
 * fixtures):
 * (Whole-network finite differences are not here on purpose: on networks this
 * small the loss is too rough at any step size fp32 allows (ReLU kinks, batch
 * statistics over few values; directional differences along each tensor's own
 * gradient still miss by 5-10%), so such a test either fails or tests nothing.
 * Each layer's backward is checked by finite differences in test_model_backend.c
 * and the whole network's against PyTorch in test_model_torch.c, to 5e-5.)
 * - the grad-ready reports: growing, ending at the parameter count, and every
 *   announced prefix already final when announced;
 * - running statistics and num_batches_tracked: updated by training forwards
 *   only; evaluation forwards change nothing and repeat exactly;
 * - SyncBatchNorm on several ranks equals one process with the whole batch
 *   (logits, loss, gradients, running statistics): test_model_exec_sync.c;
 * - a device-memory backend (the cpu one with host_memory = 0, so every tensor
 *   crosses upload/download/copy) gives bit-identical results, also with its
 *   input staged ahead (gw_exec_stage);
 * - an inference executor: the training one's evaluation logits bit for bit,
 *   in under half its memory; what it refuses;
 * - profiles (gw_exec_set_profile): unchanged results, every layer timed, fused
 *   groups' members at 0, steps counted only while on;
 * - what it refuses: backward without a training forward, a label out of range,
 *   a bad batch;
 * - a failing layer's message names the layer: test_model_exec_errors.c;
 * - SGD against a double-precision reference of torch.optim.SGD's formula, with
 *   and without Nesterov, and weight decay only on weights of 2+ dimensions;
 *   what it refuses (infinite or NaN settings and learning rates).
 * Exits 77 (skipped) without oneDNN.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw_config.h"
#include "harness.h"

#if GW_HAVE_ONEDNN

#include "model_internal.h" /* num_running */
#include "sgd.h"
#include "sgd_math.h" /* struct gw_sgd_scalars */
#include "test_model_exec.h"

void small_config(struct gw_model_config *cfg, int depth) {
  gw_model_config_default(cfg);
  cfg->depth = depth;
  cfg->classes = 3;
  cfg->in_channels = 2;
  cfg->image_size = depth == 18 ? 16 : 64;
  cfg->stem = depth == 18 ? GW_STEM_SMALL : GW_STEM_IMAGENET;
  cfg->width_divisor = 16;
  cfg->seed = 7;
}

void rig_up_cfg(struct rig *r, const struct gw_backend_ops *ops, const struct gw_model_config *cfg, int batch,
                const struct gw_backend_config *bc) {
  memset(r, 0, sizeof *r);
  r->batch = batch;
  ck_assert_msg(gw_model_init(&r->m, cfg) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_msg(ops->create(bc, &r->b) == GW_SUCCESS, "%s", gw_model_last_error());
  struct gw_exec_config ec = {.batch = batch, .label_smoothing = 0.1f};
  ck_assert_msg(gw_exec_create(r->m, ops, r->b, &ec, &r->e) == GW_SUCCESS, "%s", gw_model_last_error());
  size_t n = (size_t)batch * cfg->in_channels * cfg->image_size * cfg->image_size;
  r->x = malloc(n * sizeof(float));
  r->y = malloc((size_t)batch * sizeof(int32_t));
  for (size_t i = 0; i < n; i++) r->x[i] = (float)((double)(mix64(i + 11) >> 11) / 9007199254740992.0 * 2 - 1);
  for (int i = 0; i < batch; i++) r->y[i] = (int32_t)(mix64(1000 + (uint64_t)i) % (uint64_t)cfg->classes);
}

void rig_up_with(struct rig *r, const struct gw_backend_ops *ops, int depth, int batch,
                 const struct gw_backend_config *bc) {
  struct gw_model_config cfg;
  small_config(&cfg, depth);
  rig_up_cfg(r, ops, &cfg, batch, bc);
}

void rig_up(struct rig *r, const struct gw_backend_ops *ops, int depth, int batch) {
  struct gw_backend_config bc = {.threads = 1};
  rig_up_with(r, ops, depth, batch, &bc);
}

void rig_down(struct rig *r, const struct gw_backend_ops *ops) {
  gw_exec_free(r->e);
  ops->destroy(r->b);
  gw_model_free(r->m);
  free(r->x), free(r->y);
}

float train_step(struct rig *r, gw_grad_ready_fn fn, void *arg) {
  float loss = NAN;
  ck_assert_msg(gw_exec_forward(r->e, r->x, 1) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_msg(gw_exec_backward(r->e, r->y, &loss, fn, arg) == GW_SUCCESS, "%s", gw_model_last_error());
  return loss;
}

/* Every report: the prefix [previous, ready) is copied at the time of the
 * report; at the end the copies must equal the final gradients bit for bit. */
struct ready_log {
  const float *grads;
  float *shadow;
  size_t last;
  int calls, regressions;
};

static void on_ready(void *arg, size_t ready) {
  struct ready_log *l = arg;
  if (ready <= l->last) l->regressions++;
  else memcpy(l->shadow + l->last, l->grads + l->last, (ready - l->last) * sizeof(float));
  l->last = ready > l->last ? ready : l->last;
  l->calls++;
}

START_TEST(test_grad_ready_reports) {
  struct rig r;
  rig_up(&r, &gw_backend_cpu, 50, 2);
  size_t np = gw_model_num_params(r.m);
  struct ready_log log = {gw_model_grads(r.m), malloc(np * sizeof(float)), 0, 0, 0};
  memset(gw_model_grads(r.m), 0xff, np * sizeof(float)); /* NaN: anything unwritten shows */
  train_step(&r, on_ready, &log);
  ck_assert_int_eq(log.regressions, 0);
  ck_assert_uint_eq(log.last, np);
  ck_assert_int_ge(log.calls, gw_model_num_param_tensors(r.m) / 3); /* one per layer with parameters */
  ck_assert_msg(memcmp(log.shadow, gw_model_grads(r.m), np * sizeof(float)) == 0,
                "a gradient changed after its prefix was reported final");
  for (size_t i = 0; i < np; i++) ck_assert_msg(isfinite(gw_model_grads(r.m)[i]), "gradient %zu unwritten", i);
  free(log.shadow);
  rig_down(&r, &gw_backend_cpu);
}
END_TEST

START_TEST(test_running_statistics) {
  struct rig r;
  rig_up(&r, &gw_backend_cpu, 18, 4);
  size_t nrun = 0;
  for (int i = 0; i < gw_model_num_buffer_tensors(r.m); i++) {
    const struct gw_tensor *t = gw_model_buffer_tensor(r.m, i);
    if (t->kind == GW_TENSOR_RUNNING) nrun += t->numel;
  }
  float *before = malloc(nrun * sizeof(float));
  memcpy(before, gw_model_running(r.m), nrun * sizeof(float));
  int nclasses = gw_model_get_config(r.m)->classes;
  float *l1 = malloc((size_t)r.batch * nclasses * sizeof(float)), *l2 = malloc((size_t)r.batch * nclasses * sizeof(float));
  ck_assert(gw_exec_forward(r.e, r.x, 0) == GW_SUCCESS);
  ck_assert(gw_exec_logits(r.e, l1) == GW_SUCCESS);
  ck_assert_msg(memcmp(before, gw_model_running(r.m), nrun * sizeof(float)) == 0, "eval changed running stats");
  for (int i = 0; i < gw_model_num_buffer_tensors(r.m); i++) {
    const struct gw_tensor *t = gw_model_buffer_tensor(r.m, i);
    if (t->kind == GW_TENSOR_COUNTER)
      ck_assert_msg(*(int64_t *)gw_model_tensor_data(r.m, t) == 0, "%s counted an eval forward", t->name);
  }
  train_step(&r, NULL, NULL);
  train_step(&r, NULL, NULL);
  ck_assert_msg(memcmp(before, gw_model_running(r.m), nrun * sizeof(float)) != 0, "training kept running stats");
  for (int i = 0; i < gw_model_num_buffer_tensors(r.m); i++) {
    const struct gw_tensor *t = gw_model_buffer_tensor(r.m, i);
    if (t->kind == GW_TENSOR_COUNTER)
      ck_assert_msg(*(int64_t *)gw_model_tensor_data(r.m, t) == 2, "%s = %lld after 2 steps", t->name,
                    (long long)*(int64_t *)gw_model_tensor_data(r.m, t));
  }
  /* Evaluation now uses the updated statistics, and repeats exactly. */
  ck_assert(gw_exec_forward(r.e, r.x, 0) == GW_SUCCESS);
  ck_assert(gw_exec_logits(r.e, l2) == GW_SUCCESS);
  ck_assert(memcmp(l1, l2, (size_t)r.batch * nclasses * sizeof(float)) != 0);
  ck_assert(gw_exec_forward(r.e, r.x, 0) == GW_SUCCESS);
  ck_assert(gw_exec_logits(r.e, l1) == GW_SUCCESS);
  ck_assert(memcmp(l1, l2, (size_t)r.batch * nclasses * sizeof(float)) == 0);
  free(before), free(l1), free(l2);
  rig_down(&r, &gw_backend_cpu);
}
END_TEST

/* a on the cpu backend, b on the same pretending its memory is a device's
 * (dev: host_memory = 0, so every tensor crosses upload/download/copy). */
static void rig_pair(struct rig *a, struct rig *b, struct gw_backend_ops *dev, int depth, int batch) {
  *dev = gw_backend_cpu;
  dev->host_memory = 0;
  rig_up(a, &gw_backend_cpu, depth, batch);
  rig_up(b, dev, depth, batch);
}

START_TEST(test_device_memory_path) {
  struct gw_backend_ops dev;
  struct rig a, b;
  rig_pair(&a, &b, &dev, 50, 2);
  float la = train_step(&a, NULL, NULL), lb = train_step(&b, NULL, NULL);
  ck_assert_msg(la == lb, "loss %.9g on host memory, %.9g through upload/download", la, lb);
  size_t np = gw_model_num_params(a.m);
  /* The model's host copy of the gradients is stale until downloaded: a range
   * of them, then the rest, then everything. */
  float *g = gw_model_grads(b.m);
  memset(g, 0, np * sizeof(float));
  ck_assert(gw_exec_download_grads(b.e, 7, 100) == GW_SUCCESS);
  ck_assert(g[6] == 0 && g[107] == 0 && memcmp(g + 7, gw_model_grads(a.m) + 7, 100 * sizeof(float)) == 0);
  ck_assert_int_eq(gw_exec_download_grads(b.e, np - 5, 6), GW_ERR_INVALID_ARGUMENT);
  ck_assert(strstr(gw_model_last_error(), "not within"));
  ck_assert_int_eq(gw_exec_download_grads(b.e, np + 1, 0), GW_ERR_INVALID_ARGUMENT);
  ck_assert(gw_exec_download_grads(b.e, 0, np) == GW_SUCCESS);
  ck_assert(memcmp(gw_model_grads(a.m), g, np * sizeof(float)) == 0);
  /* every statistic, poisoned first (10 were compared: a download that
   * stopped after the first layer passed) */
  const size_t nr = a.m->num_running;
  memset(gw_model_running(b.m), 0xff, nr * sizeof(float));
  ck_assert(gw_exec_download_stats(b.e) == GW_SUCCESS);
  ck_assert(memcmp(gw_model_running(a.m), gw_model_running(b.m), nr * sizeof(float)) == 0);
  memset(gw_model_running(b.m), 0xff, nr * sizeof(float));
  memset(gw_model_grads(b.m), 0xff, np * sizeof(float));
  memset(gw_model_params(b.m), 0xff, np * sizeof(float));
  ck_assert(gw_exec_download_model(b.e) == GW_SUCCESS);
  ck_assert(memcmp(gw_model_params(a.m), gw_model_params(b.m), np * sizeof(float)) == 0);
  ck_assert(memcmp(gw_model_grads(a.m), gw_model_grads(b.m), np * sizeof(float)) == 0);
  ck_assert(memcmp(gw_model_running(a.m), gw_model_running(b.m), nr * sizeof(float)) == 0);
  /* A host-side change reaches the backend only when uploaded. */
  gw_model_params(b.m)[0] += 1.0f;
  gw_model_params(a.m)[0] += 1.0f;
  ck_assert(gw_exec_upload_model(b.e) == GW_SUCCESS);
  la = train_step(&a, NULL, NULL), lb = train_step(&b, NULL, NULL);
  ck_assert_msg(la == lb, "after upload: loss %.9g vs %.9g", la, lb);
  rig_down(&a, &gw_backend_cpu);
  rig_down(&b, &dev);
}
END_TEST

/* The input pipeline (gw_exec_stage): through a device-memory backend, a staged
 * batch gives the host batch's loss and gradients bit for bit, also when the
 * next batch is staged between forward and backward (it must not land in the
 * slot backward still reads), across an evaluation forward of a host batch,
 * and when staging twice replaces the staged batch. */
static void expect_same_step(struct rig *a, struct rig *b, float la, float lb, const char *when) {
  ck_assert_msg(la == lb, "%s: loss %.9g from the host batch, %.9g staged", when, la, lb);
  ck_assert(gw_exec_download_grads(b->e, 0, gw_model_num_params(b->m)) == GW_SUCCESS);
  ck_assert_msg(!memcmp(gw_model_grads(a->m), gw_model_grads(b->m), gw_model_num_params(a->m) * sizeof(float)),
                "%s: the gradients differ", when);
}

START_TEST(test_staged_input) {
  /* the batch converted by 3 threads (samples 0, 1 and 2-3), as big ones are */
  setenv("GW_STAGE_THREADS", "3", 1);
  struct gw_backend_ops dev;
  struct rig a, b;
  rig_pair(&a, &b, &dev, 18, 4);
  const size_t n = (size_t)4 * 2 * 16 * 16;
  float *x2 = malloc(n * sizeof(float)), *l1 = malloc(4 * 3 * sizeof(float)), *l2 = malloc(4 * 3 * sizeof(float));
  int32_t y2[4] = {2, 0, 0, 1}, bad[4] = {0, 1, 3, 0};
  for (size_t i = 0; i < n; i++) x2[i] = 0.5f - a.x[n - 1 - i];
  float la = NAN, lb = NAN;
  ck_assert_int_eq(gw_exec_forward(b.e, NULL, 1), GW_ERR_INVALID_ARGUMENT);
  ck_assert(strstr(gw_model_last_error(), "none staged"));
  ck_assert_int_eq(gw_exec_stage(b.e, b.x, bad), GW_ERR_INVALID_ARGUMENT);
  ck_assert(strstr(gw_model_last_error(), "label 3 of sample 2"));
  /* Step 1: stage, forward, stage the next batch, backward. */
  ck_assert_msg(gw_exec_stage(b.e, b.x, b.y) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert(gw_exec_forward(b.e, NULL, 1) == GW_SUCCESS);
  ck_assert(gw_exec_stage(b.e, x2, y2) == GW_SUCCESS);
  ck_assert(gw_exec_backward(b.e, NULL, &lb, NULL, NULL) == GW_SUCCESS);
  la = train_step(&a, NULL, NULL);
  expect_same_step(&a, &b, la, lb, "step 1");
  /* An evaluation of a host batch in between leaves the staged one alone. */
  ck_assert(gw_exec_forward(a.e, a.x, 0) == GW_SUCCESS && gw_exec_logits(a.e, l1) == GW_SUCCESS);
  ck_assert(gw_exec_forward(b.e, b.x, 0) == GW_SUCCESS && gw_exec_logits(b.e, l2) == GW_SUCCESS);
  ck_assert(!memcmp(l1, l2, 4 * 3 * sizeof(float)));
  /* Step 2 takes the batch staged during step 1. */
  ck_assert(gw_exec_forward(b.e, NULL, 1) == GW_SUCCESS);
  ck_assert(gw_exec_backward(b.e, NULL, &lb, NULL, NULL) == GW_SUCCESS);
  ck_assert(gw_exec_forward(a.e, x2, 1) == GW_SUCCESS && gw_exec_backward(a.e, y2, &la, NULL, NULL) == GW_SUCCESS);
  expect_same_step(&a, &b, la, lb, "step 2");
  /* Staging twice: the second batch replaces the first. */
  ck_assert(gw_exec_stage(b.e, x2, y2) == GW_SUCCESS && gw_exec_stage(b.e, b.x, b.y) == GW_SUCCESS);
  ck_assert(gw_exec_forward(b.e, NULL, 1) == GW_SUCCESS);
  ck_assert(gw_exec_backward(b.e, NULL, &lb, NULL, NULL) == GW_SUCCESS);
  la = train_step(&a, NULL, NULL);
  expect_same_step(&a, &b, la, lb, "step 3 (staged twice)");
  /* A staged forward's backward may still be given labels of its own. */
  ck_assert(gw_exec_stage(b.e, x2, y2) == GW_SUCCESS && gw_exec_forward(b.e, NULL, 1) == GW_SUCCESS);
  ck_assert(gw_exec_backward(b.e, b.y, &lb, NULL, NULL) == GW_SUCCESS);
  ck_assert(gw_exec_forward(a.e, x2, 1) == GW_SUCCESS && gw_exec_backward(a.e, a.y, &la, NULL, NULL) == GW_SUCCESS);
  expect_same_step(&a, &b, la, lb, "step 4 (labels given)");
  /* Backward without labels after a host batch's forward is refused. */
  ck_assert(gw_exec_forward(b.e, b.x, 1) == GW_SUCCESS);
  ck_assert_int_eq(gw_exec_backward(b.e, NULL, &lb, NULL, NULL), GW_ERR_INVALID_ARGUMENT);
  free(x2), free(l1), free(l2);
  rig_down(&a, &gw_backend_cpu);
  rig_down(&b, &dev);
}
END_TEST

/* Batch norm fused with its ReLU / residual add + ReLU (the default) against
 * every layer by itself: the same loss, gradients, running statistics and
 * logits, bit for bit, on a ResNet-18 (basic blocks) and a ResNet-50
 * (bottlenecks, downsampling shortcuts), training and evaluation. */
static void fused_case(int depth) {
  struct rig a, b;
  rig_up(&a, &gw_backend_cpu, depth, 3);
  rig_up(&b, &gw_backend_cpu, depth, 3);
  gw_exec_free(b.e);
  struct gw_exec_config ec = {.batch = 3, .label_smoothing = 0.1f, .no_fuse = 1};
  ck_assert(gw_exec_create(b.m, &gw_backend_cpu, b.b, &ec, &b.e) == GW_SUCCESS);
  /* ResNet-18: 2 per basic block (bn1 -> relu, bn2 -> add -> relu) + the stem's; ResNet-50: 3 per bottleneck + 1 */
  const int want = depth == 18 ? 2 * 8 + 1 : 3 * 16 + 1;
  ck_assert_int_eq(gw_exec_fused_groups(a.e), want);
  ck_assert_int_eq(gw_exec_fused_groups(b.e), 0);
  const size_t np = gw_model_num_params(a.m), nr = a.m->num_running; /* every BN's (the first 10 were) */
  for (int step = 0; step < 2; step++) {
    float la = train_step(&a, NULL, NULL), lb = train_step(&b, NULL, NULL);
    ck_assert_msg(la == lb, "resnet%d step %d: loss %.9g fused, %.9g unfused", depth, step, la, lb);
    ck_assert_msg(!memcmp(gw_model_grads(a.m), gw_model_grads(b.m), np * sizeof(float)),
                  "resnet%d step %d: gradients differ fused / unfused", depth, step);
    ck_assert(!memcmp(gw_model_running(a.m), gw_model_running(b.m), nr * sizeof(float)));
  }
  float la[3 * 3], lb[3 * 3];
  ck_assert(gw_exec_forward(a.e, a.x, 0) == GW_SUCCESS && gw_exec_logits(a.e, la) == GW_SUCCESS);
  ck_assert(gw_exec_forward(b.e, b.x, 0) == GW_SUCCESS && gw_exec_logits(b.e, lb) == GW_SUCCESS);
  ck_assert_msg(!memcmp(la, lb, sizeof la), "resnet%d: evaluation logits differ fused / unfused", depth);
  rig_down(&a, &gw_backend_cpu);
  rig_down(&b, &gw_backend_cpu);
}

START_TEST(test_fused_equals_unfused) {
  fused_case(18);
  fused_case(50);
}
END_TEST

/* An inference executor (gw_exec_config.inference, gw-train's --val-crop-size
 * evaluation) on a trained model: the training executor's evaluation logits
 * bit for bit, fused and unfused, on host memory and through upload (the
 * device path: a separate executor needs the trained statistics uploaded), in
 * under half the memory (no gradients, activations reused three layers after
 * their last reader); training forwards, backward and gradients refused. */
static void inference_case(int depth, int no_fuse, int device) {
  struct gw_backend_ops dev;
  struct rig a, unused;
  if (device) rig_pair(&unused, &a, &dev, depth, 3);
  else rig_up(&a, &gw_backend_cpu, depth, 3);
  const struct gw_backend_ops *ops = device ? &dev : &gw_backend_cpu;
  for (int step = 0; step < 2; step++) train_step(&a, NULL, NULL); /* running statistics of their own */
  struct gw_exec *inf = NULL;
  struct gw_exec_config ec = {.batch = 3, .label_smoothing = 0.1f, .no_fuse = no_fuse, .inference = 1};
  ck_assert_msg(gw_exec_create(a.m, ops, a.b, &ec, &inf) == GW_SUCCESS, "%s", gw_model_last_error());
  if (device) ck_assert(gw_exec_download_stats(a.e) == GW_SUCCESS && gw_exec_upload_model(inf) == GW_SUCCESS);
  float la[3 * 3], lb[3 * 3];
  const size_t n = (size_t)3 * gw_model_get_config(a.m)->in_channels * gw_model_get_config(a.m)->image_size *
                   gw_model_get_config(a.m)->image_size;
  for (int k = 0; k < 2; k++) { /* twice, on another batch: the reused buffers hold the first forward's values */
    if (k)
      for (size_t i = 0; i < n; i++) a.x[i] = -0.5f * a.x[i] + 0.25f;
    ck_assert(gw_exec_forward(a.e, a.x, 0) == GW_SUCCESS && gw_exec_logits(a.e, la) == GW_SUCCESS);
    ck_assert_msg(gw_exec_forward(inf, a.x, 0) == GW_SUCCESS, "%s", gw_model_last_error());
    ck_assert(gw_exec_logits(inf, lb) == GW_SUCCESS);
    ck_assert_msg(!memcmp(la, lb, sizeof la), "resnet%d%s%s: the inference executor's logits differ (%.9g vs %.9g)",
                  depth, no_fuse ? " unfused" : "", device ? " device" : "", (double)la[0], (double)lb[0]);
  }
  const size_t mt = gw_exec_memory_bytes(a.e), mi = gw_exec_memory_bytes(inf);
  ck_assert_msg(2 * mi < mt, "resnet%d: inference executor %zu bytes, training %zu", depth, mi, mt);
  ck_assert_int_eq(gw_exec_forward(inf, a.x, 1), GW_ERR_INVALID_ARGUMENT);
  ck_assert(strstr(gw_model_last_error(), "evaluation forwards only"));
  float loss;
  ck_assert_int_eq(gw_exec_backward(inf, a.y, &loss, NULL, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(strstr(gw_model_last_error(), "no backward"));
  if (device) ck_assert_int_eq(gw_exec_download_grads(inf, 0, 1), GW_ERR_INVALID_ARGUMENT);
  gw_exec_free(inf);
  rig_down(&a, ops);
  if (device) rig_down(&unused, &gw_backend_cpu);
}

START_TEST(test_inference_executor) {
  for (int d = 0; d < 2; d++)
    for (int nf = 0; nf < 2; nf++) inference_case(d ? 50 : 18, nf, 0);
  inference_case(50, 0, 1);
}
END_TEST

/* Profiles (gw_exec_set_profile): the same loss and gradients as without, bit
 * for bit; one entry per layer and one for the loss; every layer that runs
 * timed in both directions, a fused group's members at 0 and its BN marked;
 * steps counted only while on and only for a forward marked; a backend
 * without time marks refused with a message. */
START_TEST(test_profile) {
  struct rig a, b;
  rig_up(&a, &gw_backend_cpu, 50, 2);
  rig_up(&b, &gw_backend_cpu, 50, 2);
  ck_assert_msg(gw_exec_set_profile(b.e, 1) == GW_SUCCESS, "%s", gw_model_last_error());
  const size_t np = gw_model_num_params(a.m);
  for (int step = 0; step < 2; step++) {
    float la = train_step(&a, NULL, NULL), lb = train_step(&b, NULL, NULL);
    ck_assert_msg(la == lb, "step %d: loss %.9g plain, %.9g profiled", step, la, lb);
    ck_assert(!memcmp(gw_model_grads(a.m), gw_model_grads(b.m), np * sizeof(float)));
  }
  int n = 0, steps = 0, fused = 0, members = 0;
  const struct gw_exec_layer_time *t = gw_exec_profile(b.e, &n, &steps);
  const int nl = a.m->nlayers;
  ck_assert_int_eq(n, nl + 1);
  ck_assert_int_eq(steps, 2);
  for (int i = 0; i < nl; i++) {
    ck_assert_str_eq(t[i].name, a.m->layers[i].name);
    ck_assert_int_eq(t[i].kind, (int)a.m->layers[i].kind);
    fused += t[i].fused != 0, members += t[i].member;
    if (t[i].member)
      ck_assert_msg(t[i].fwd_s == 0 && t[i].bwd_s == 0 && !t[i].fused, "member %s timed", t[i].name);
    else
      ck_assert_msg(t[i].fwd_s > 0 && t[i].bwd_s > 0 && t[i].fwd_s < 60 && t[i].bwd_s < 60,
                    "%s: forward %g s, backward %g s", t[i].name, t[i].fwd_s, t[i].bwd_s);
    if (t[i].fused) ck_assert_int_eq(t[i].kind, GW_LAYER_BN);
  }
  ck_assert_int_eq(fused, gw_exec_fused_groups(b.e));
  ck_assert_int_eq(members, 2 * 16 + 33); /* bn -> add -> relu: 2 members, bn -> relu: 1 */
  ck_assert_str_eq(t[nl].name, "loss");
  ck_assert(t[nl].kind == -1 && t[nl].fwd_s == 0 && t[nl].bwd_s > 0);
  /* Off: nothing more is added; an evaluation forward is not a step. */
  ck_assert(gw_exec_set_profile(b.e, 0) == GW_SUCCESS);
  train_step(&b, NULL, NULL);
  gw_exec_profile(b.e, NULL, &steps);
  ck_assert_int_eq(steps, 2);
  /* On again: cleared; a forward before it is not counted, nor an evaluation. */
  ck_assert(gw_exec_forward(b.e, b.x, 1) == GW_SUCCESS);
  ck_assert(gw_exec_set_profile(b.e, 1) == GW_SUCCESS);
  t = gw_exec_profile(b.e, &n, &steps);
  ck_assert(steps == 0 && t[0].fwd_s == 0 && t[nl].bwd_s == 0);
  float loss;
  ck_assert(gw_exec_backward(b.e, b.y, &loss, NULL, NULL) == GW_SUCCESS);
  ck_assert(gw_exec_forward(b.e, b.x, 0) == GW_SUCCESS);
  gw_exec_profile(b.e, NULL, &steps);
  ck_assert_int_eq(steps, 0);
  train_step(&b, NULL, NULL);
  gw_exec_profile(b.e, NULL, &steps);
  ck_assert_int_eq(steps, 1);
  /* A backend without marks. */
  struct gw_backend_ops nomark = gw_backend_cpu;
  nomark.mark = NULL;
  struct gw_exec *e2;
  struct gw_exec_config ec = {.batch = 2};
  ck_assert(gw_exec_create(a.m, &nomark, a.b, &ec, &e2) == GW_SUCCESS);
  ck_assert_int_eq(gw_exec_set_profile(e2, 1), GW_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(gw_model_last_error(), "no time marks"), "%s", gw_model_last_error());
  ck_assert(gw_exec_profile(e2, &n, &steps) == NULL && n == 0 && steps == 0);
  gw_exec_free(e2);
  rig_down(&a, &gw_backend_cpu);
  rig_down(&b, &gw_backend_cpu);
}
END_TEST

/* Channels-last activations (GW_LAYOUT_NHWC) against NCHW: the same loss,
 * gradients, running statistics and logits bit for bit (oneDNN convolves both
 * in the same internal layout; batch norm and average pooling sum in the same
 * order), on ResNet-18 (small stem) in float32 and bfloat16 and ResNet-50
 * (the ImageNet stem: its max pool's backward is oneDNN's, whose sums over
 * overlapping windows may round differently per layout, so within 1e-5 of the
 * largest value there), a host batch and a staged
 * one through device-style memory (the executor transposes the input). */
/* a and b equal bit for bit (tol 0), or each within tol of the largest |a|. */
static int close_to(const float *a, const float *b, size_t n, float tol) {
  if (tol == 0) return !memcmp(a, b, n * sizeof(float));
  float big = 0;
  for (size_t i = 0; i < n; i++) big = fabsf(a[i]) > big ? fabsf(a[i]) : big;
  for (size_t i = 0; i < n; i++)
    if (!(fabsf(a[i] - b[i]) <= tol * big)) return 0;
  return 1;
}

static void layout_case(int depth, int act) {
  struct gw_backend_ops dev = gw_backend_cpu;
  dev.host_memory = 0;
  struct rig a, b;
  struct gw_backend_config ca = {.threads = 1, .act = act}, cb = ca;
  cb.layout = GW_LAYOUT_NHWC;
  rig_up_with(&a, &gw_backend_cpu, depth, 3, &ca);
  rig_up_with(&b, &dev, depth, 3, &cb);
  ck_assert_int_eq(dev.layout(b.b), GW_LAYOUT_NHWC);
  const size_t np = gw_model_num_params(a.m), nr = a.m->num_running;
  for (int step = 0; step < 3; step++) {
    float la = train_step(&a, NULL, NULL), lb = NAN;
    if (step == 2) { /* staged */
      ck_assert(gw_exec_stage(b.e, b.x, b.y) == GW_SUCCESS && gw_exec_forward(b.e, NULL, 1) == GW_SUCCESS);
      ck_assert(gw_exec_backward(b.e, NULL, &lb, NULL, NULL) == GW_SUCCESS);
    } else {
      lb = train_step(&b, NULL, NULL);
    }
    ck_assert(gw_exec_download_model(b.e) == GW_SUCCESS);
    const float tol = depth == 18 ? 0 : 1e-5f; /* 0: bit for bit */
    ck_assert_msg(fabsf(la - lb) <= tol * fabsf(la), "resnet%d act %d step %d: loss %.9g NCHW, %.9g NHWC", depth, act,
                  step, la, lb);
    ck_assert_msg(close_to(gw_model_grads(a.m), gw_model_grads(b.m), np, tol),
                  "resnet%d act %d step %d: gradients differ NCHW / NHWC", depth, act, step);
    ck_assert_msg(close_to(gw_model_running(a.m), gw_model_running(b.m), nr, tol),
                  "resnet%d act %d step %d: running statistics differ NCHW / NHWC", depth, act, step);
  }
  float la[3 * 3], lb[3 * 3];
  ck_assert(gw_exec_forward(a.e, a.x, 0) == GW_SUCCESS && gw_exec_logits(a.e, la) == GW_SUCCESS);
  ck_assert(gw_exec_forward(b.e, b.x, 0) == GW_SUCCESS && gw_exec_logits(b.e, lb) == GW_SUCCESS);
  ck_assert_msg(close_to(la, lb, 9, depth == 18 ? 0 : 1e-5f), "resnet%d act %d: evaluation logits differ NCHW / NHWC",
                depth, act);
  rig_down(&a, &gw_backend_cpu);
  rig_down(&b, &dev);
}

START_TEST(test_nhwc_equals_nchw) {
  layout_case(18, GW_FLOAT32);
  layout_case(50, GW_FLOAT32);
  layout_case(18, GW_BFLOAT16);
}
END_TEST

START_TEST(test_refusals) {
  struct rig r;
  rig_up(&r, &gw_backend_cpu, 18, 2);
  float loss;
  ck_assert_int_eq(gw_exec_backward(r.e, r.y, &loss, NULL, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(gw_model_last_error(), "training forward"));
  ck_assert(gw_exec_forward(r.e, r.x, 0) == GW_SUCCESS);
  ck_assert_int_eq(gw_exec_backward(r.e, r.y, &loss, NULL, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(gw_exec_forward(r.e, r.x, 1) == GW_SUCCESS);
  r.y[1] = 3; /* 3 classes: 0..2 */
  ck_assert_int_eq(gw_exec_backward(r.e, r.y, &loss, NULL, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_model_last_error(), "label 3 of sample 1"), "%s", gw_model_last_error());
  r.y[1] = 0;
  ck_assert(gw_exec_backward(r.e, r.y, &loss, NULL, NULL) == GW_SUCCESS); /* the forward is still usable */
  ck_assert_int_eq(gw_exec_backward(r.e, r.y, &loss, NULL, NULL), GW_ERR_INVALID_ARGUMENT); /* once per forward */
  struct gw_exec *e = NULL;
  struct gw_exec_config bad = {.batch = 0};
  ck_assert_int_eq(gw_exec_create(r.m, &gw_backend_cpu, r.b, &bad, &e), GW_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(e);
  bad.batch = 2, bad.label_smoothing = 1.5f;
  ck_assert_int_eq(gw_exec_create(r.m, &gw_backend_cpu, r.b, &bad, &e), GW_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(gw_model_last_error(), "label smoothing"));
  rig_down(&r, &gw_backend_cpu);
}
END_TEST

/* torch.optim.SGD's update in double precision, element by element. */
static void sgd_reference(double *p, double *buf, const float *g, size_t n, double lr, double mu, double damp,
                          double wd, int nesterov, int first) {
  for (size_t i = 0; i < n; i++) {
    double d = g[i] + wd * p[i];
    buf[i] = first ? d : mu * buf[i] + (1 - damp) * d;
    p[i] -= lr * (nesterov ? d + mu * buf[i] : buf[i]);
  }
}

/* scale != 1: the gradients come multiplied by scale (a loss scale) and the
 * step runs through the backend's path (runs, scalars with grad_scale
 * 1 / scale, gw_sgd_apply) against the reference on the unscaled ones. */
static void sgd_case(int nesterov, float damp, float scale) {
  struct gw_model_config cfg;
  small_config(&cfg, 18);
  struct gw_model *m;
  ck_assert(gw_model_init(&m, &cfg) == GW_SUCCESS);
  size_t n = gw_model_num_params(m);
  float *p = gw_model_params(m), *g = gw_model_grads(m);
  double *rp = malloc(n * sizeof(double)), *rb = malloc(n * sizeof(double));
  struct gw_sgd_config sc = {.momentum = 0.9f, .dampening = damp, .weight_decay = 5e-3f, .nesterov = nesterov};
  struct gw_sgd *s;
  ck_assert_msg(gw_sgd_create(m, &sc, &s) == GW_SUCCESS, "%s", gw_model_last_error());
  for (size_t i = 0; i < n; i++) rp[i] = p[i];
  for (int step = 0; step < 3; step++) {
    for (size_t i = 0; i < n; i++) g[i] = (float)((double)(mix64(i * 3 + (size_t)step) >> 40) / 16777216.0 - 0.5);
    if (scale == 1.0f) {
      ck_assert(gw_sgd_step(s, p, g, 0.1f) == GW_SUCCESS);
    } else {
      float *gs = malloc(n * sizeof(float));
      for (size_t i = 0; i < n; i++) gs[i] = g[i] * scale; /* a power of two: exact */
      int nruns = 0;
      const struct gw_sgd_run *runs = gw_sgd_runs(s, &nruns);
      struct gw_sgd_scalars sc2;
      gw_sgd_scalars_at(s, 0.1f, 1.0f / scale, &sc2);
      gw_sgd_apply(runs, nruns, p, gs, gw_sgd_momentum(s), &sc2);
      gw_sgd_set_steps(s, gw_sgd_steps(s) + 1);
      free(gs);
    }
    for (int t = 0; t < gw_model_num_param_tensors(m); t++) {
      const struct gw_tensor *tt = gw_model_param_tensor(m, t);
      double wd = tt->ndim >= 2 ? (double)sc.weight_decay : 0.0;
      sgd_reference(rp + tt->offset, rb + tt->offset, g + tt->offset, tt->numel, (double)0.1f, (double)0.9f,
                    (double)damp, wd, nesterov, step == 0);
    }
    for (size_t i = 0; i < n; i++)
      ck_assert_msg(fabs(p[i] - rp[i]) <= 1e-6 * (1 + fabs(rp[i])), "step %d, element %zu: %.9g vs %.9g", step, i,
                    (double)p[i], rp[i]);
  }
  ck_assert_int_eq(gw_sgd_steps(s), 3);
  gw_sgd_free(s);
  gw_model_free(m);
  free(rp), free(rb);
}

START_TEST(test_sgd_momentum) { sgd_case(0, 0.0f, 1.0f); }
END_TEST
START_TEST(test_sgd_nesterov) { sgd_case(1, 0.0f, 1.0f); }
END_TEST
START_TEST(test_sgd_dampening) { sgd_case(0, 0.25f, 1.0f); }
END_TEST
/* the loss scale's division inside the step (the cpu backend's sgd_step path,
 * which test_sgd_step_bits holds to gw_sgd_step only) */
START_TEST(test_sgd_grad_scale) {
  sgd_case(0, 0.0f, 1024.0f);
  sgd_case(1, 0.0f, 1.0f / 64);
  sgd_case(0, 0.25f, 4096.0f);
}
END_TEST

START_TEST(test_sgd_decay_targets) {
  struct gw_model_config cfg;
  small_config(&cfg, 18);
  struct gw_model *m;
  ck_assert(gw_model_init(&m, &cfg) == GW_SUCCESS);
  size_t n = gw_model_num_params(m);
  float *p = gw_model_params(m), *g = gw_model_grads(m), *before = malloc(n * sizeof(float));
  memcpy(before, p, n * sizeof(float));
  memset(g, 0, n * sizeof(float));
  struct gw_sgd_config sc = {.weight_decay = 0.5f};
  struct gw_sgd *s;
  ck_assert(gw_sgd_create(m, &sc, &s) == GW_SUCCESS);
  ck_assert(gw_sgd_step(s, p, g, 0.1f) == GW_SUCCESS);
  for (int t = 0; t < gw_model_num_param_tensors(m); t++) {
    const struct gw_tensor *tt = gw_model_param_tensor(m, t);
    size_t i = tt->offset;
    float want = tt->ndim >= 2 ? before[i] - 0.1f * (0.5f * before[i]) : before[i];
    ck_assert_msg(p[i] == want, "%s: %.9g, want %.9g (decay %s)", tt->name, (double)p[i], (double)want,
                  tt->ndim >= 2 ? "on" : "off");
  }
  ck_assert_int_eq(gw_sgd_step(s, p, g, -1.0f), GW_ERR_INVALID_ARGUMENT);
  gw_sgd_free(s);
  struct gw_sgd_config bad = {.momentum = 0, .nesterov = 1};
  ck_assert_int_eq(gw_sgd_create(m, &bad, &s), GW_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(gw_model_last_error(), "Nesterov"));
  gw_model_free(m);
  free(before);
}
END_TEST

/* gw_sgd_create refuses a momentum, weight decay or dampening that is
 * infinite, NaN or out of range, naming the field; gw_sgd_step an infinite,
 * NaN or negative learning rate. */
START_TEST(test_sgd_refusals) {
  struct gw_model_config cfg;
  small_config(&cfg, 18);
  struct gw_model *m;
  ck_assert(gw_model_init(&m, &cfg) == GW_SUCCESS);
  const struct {
    struct gw_sgd_config c;
    const char *field;
  } bad[] = {
      {{.momentum = INFINITY}, "momentum"},          {{.momentum = NAN}, "momentum"},
      {{.momentum = -0.5f}, "momentum"},             {{.weight_decay = INFINITY}, "weight decay"},
      {{.weight_decay = NAN}, "weight decay"},       {{.weight_decay = -1e-4f}, "weight decay"},
      {{.momentum = 0.9f, .dampening = INFINITY}, "dampening"},
      {{.momentum = 0.9f, .dampening = NAN}, "dampening"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    struct gw_sgd *s = (struct gw_sgd *)&s;
    ck_assert_int_eq(gw_sgd_create(m, &bad[k].c, &s), GW_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(s);
    ck_assert_msg(strncmp(gw_model_last_error(), "sgd: ", 5) == 0 &&
                      strncmp(gw_model_last_error() + 5, bad[k].field, strlen(bad[k].field)) == 0,
                  "case %zu: %s", k, gw_model_last_error());
  }
  struct gw_sgd_config ok = {.momentum = 0.9f, .weight_decay = 1e-4f};
  struct gw_sgd *s;
  ck_assert(gw_sgd_create(m, &ok, &s) == GW_SUCCESS);
  const float lrs[] = {INFINITY, -INFINITY, NAN, -0.1f};
  for (size_t k = 0; k < sizeof lrs / sizeof lrs[0]; k++) {
    ck_assert_int_eq(gw_sgd_step(s, gw_model_params(m), gw_model_grads(m), lrs[k]), GW_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(gw_model_last_error(), "learning rate"), "%s", gw_model_last_error());
  }
  ck_assert_int_eq(gw_sgd_steps(s), 0);
  gw_sgd_free(s);
  gw_model_free(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model-exec");
  TCase *tc = tcase_create("exec");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_grad_ready_reports);
  tcase_add_test(tc, test_running_statistics);
  tcase_add_test(tc, test_device_memory_path);
  tcase_add_test(tc, test_staged_input);
  tcase_add_test(tc, test_fused_equals_unfused);
  tcase_add_test(tc, test_inference_executor);
  tcase_add_test(tc, test_profile);
  tcase_add_test(tc, test_nhwc_equals_nchw);
  tcase_add_test(tc, test_refusals);
  tcase_add_test(tc, test_sgd_momentum);
  tcase_add_test(tc, test_sgd_nesterov);
  tcase_add_test(tc, test_sgd_dampening);
  tcase_add_test(tc, test_sgd_grad_scale);
  tcase_add_test(tc, test_sgd_decay_targets);
  tcase_add_test(tc, test_sgd_refusals);
  suite_add_tcase(s, tc);
  suite_add_tcase(s, exec_sync_tcase());
  suite_add_tcase(s, exec_errors_tcase());
  return run_suite(s);
}

#else

int main(void) {
  printf("model-exec: built without oneDNN, skipped\n");
  return 77;
}

#endif
