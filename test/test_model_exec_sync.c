/* test_model_exec_sync.c - SyncBatchNorm (gw_exec_set_sync_bn) on several
 * ranks against one process with the global batch, and profiles taken with
 * it; a case of its own
 * (CK_RUN_CASE=sync) in the model-exec test, with the rig of
 * test_model_exec.h. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw_config.h"
#include "harness.h"

#if GW_HAVE_ONEDNN

#include "test_model_exec.h"

/* SyncBatchNorm: ranks with parts of a batch, statistics summed across them,
 * must match one process with the whole batch (a ResNet-18 at 1/16 width):
 * each rank's logits, the loss, the gradients and the running statistics.
 * Ranks may hold different batches (the value counts are summed too), so rank
 * r scales its loss's gradient by b_r / B (gw_exec_set_loss_scale) and the
 * gradients are summed: the gradient of the whole batch's mean loss.
 * Tolerance per tensor: |a - b| <= tol * max |b| + tol * 1e-2.  What differs:
 * the variance (E[x^2] - mean^2 in double here, two-pass in the single
 * process), b_r / B rounded to float, oneDNN's convolutions at another batch
 * size, and the statistics batch norm applies: SyncBatchNorm's bn_fwd_apply
 * takes them rounded to float (as the cpu backend's backward, the cudnn
 * backend and PyTorch use them), the cpu backend's plain bn_fwd_train applies
 * them unrounded, which moves y by the mean's rounding times |mean| / spread.
 * Measured here: 2.2e-6 at 16x16, 6.3e-6 with 5 values per channel in layer4,
 * 7.6e-5 with 3 (where the spread is small next to the mean; SyncBatchNorm on
 * one rank against plain batch norm on the same batch differs as much, and
 * by 0 with plain batch norm applying the rounded statistics).  tol: 1e-4,
 * 5e-4 for the 3-value case. */
struct sync_case {
  int image;    /* the image size: 8 makes layer4 1x1 */
  int batch[4]; /* per rank */
  double tol;
};

static gw_result_t allreduce_doubles(void *arg, double *buf, size_t n) {
  return gw_allreduce(buf, buf, n, GW_FLOAT64, GW_SUM, (gw_comm_t)arg, NULL);
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
  double scale = 0, err = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
  for (size_t i = 0; i < n && !isnan(err); i++) { /* a NaN stays the answer (a later finite one replaced it) */
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= err)) err = d;
  }
  return err / (scale + 1e-2);
}

static int body_sync_bn(gw_comm_t comm, int rank, int nranks, void *arg) {
  const struct sync_case *sc = arg;
  int first = 0, total = 0;
  for (int r = 0; r < nranks; r++) first += r < rank ? sc->batch[r] : 0, total += sc->batch[r];
  const int mine = sc->batch[rank];
  struct gw_model_config cfg;
  small_config(&cfg, 18);
  cfg.image_size = sc->image;
  const struct gw_backend_config bc = {.threads = 1};
  struct rig whole, part;
  rig_up_cfg(&whole, &gw_backend_cpu, &cfg, total, &bc);
  rig_up_cfg(&part, &gw_backend_cpu, &cfg, mine, &bc);
  /* One value per channel on this rank: plain batch norm refuses, SyncBatchNorm over the ranks takes it. */
  const int alone_ok = (size_t)mine * (sc->image / 8) * (sc->image / 8) >= 2; /* layer4: image / 8 square */
  EXPECT((gw_exec_check_train(part.e, nranks) == GW_SUCCESS) == alone_ok, "plain batch norm at batch %d: %s", mine,
         gw_model_last_error());
  gw_exec_set_sync_bn(part.e, allreduce_doubles, comm);
  EXPECT(gw_exec_check_train(part.e, nranks) == GW_SUCCESS, "SyncBatchNorm refused: %s", gw_model_last_error());
  /* no ranks: refused by name (SyncBatchNorm's hint divided by zero) */
  EXPECT(gw_exec_check_train(part.e, 0) == GW_ERR_INVALID_ARGUMENT && strstr(gw_model_last_error(), "0 ranks"),
         "check_train with 0 ranks: %s", gw_model_last_error());
  EXPECT(gw_exec_set_loss_scale(part.e, (float)mine / (float)total) == GW_SUCCESS, "loss scale");
  const size_t sample = (size_t)cfg.in_channels * cfg.image_size * cfg.image_size, np = gw_model_num_params(whole.m);
  memcpy(part.x, whole.x + (size_t)first * sample, (size_t)mine * sample * sizeof(float));
  memcpy(part.y, whole.y + first, (size_t)mine * sizeof(int32_t));
  float lw = train_step(&whole, NULL, NULL), lp = train_step(&part, NULL, NULL);
  float *logits_w = malloc((size_t)total * 3 * sizeof(float)), *logits_p = malloc((size_t)mine * 3 * sizeof(float));
  EXPECT(gw_exec_logits(whole.e, logits_w) == GW_SUCCESS && gw_exec_logits(part.e, logits_p) == GW_SUCCESS, "logits");
  double d = max_rel_diff(logits_p, logits_w + (size_t)first * 3, (size_t)mine * 3), worst[3] = {d, 0, 0};
  EXPECT(d <= sc->tol, "rank %d: logits differ from the whole batch's by %.3g", rank, d);
  float loss = lp * (float)mine / (float)total;
  EXPECT(gw_allreduce(&loss, &loss, 1, GW_FLOAT32, GW_SUM, comm, NULL) == GW_SUCCESS, "loss allreduce");
  EXPECT(fabsf(loss - lw) <= 1e-5f * fabsf(lw), "loss %.9g over the ranks, %.9g whole", (double)loss, (double)lw);
  EXPECT(gw_allreduce(gw_model_grads(part.m), gw_model_grads(part.m), np, GW_FLOAT32, GW_SUM, comm, NULL) ==
             GW_SUCCESS, "grad allreduce");
  for (int t = 0; t < gw_model_num_param_tensors(whole.m); t++) {
    const struct gw_tensor *tt = gw_model_param_tensor(whole.m, t);
    d = max_rel_diff(gw_model_grads(part.m) + tt->offset, gw_model_grads(whole.m) + tt->offset, tt->numel);
    worst[1] = fmax(worst[1], d);
    EXPECT(d <= sc->tol, "gradient of %s differs by %.3g", tt->name, d);
  }
  for (int t = 0; t < gw_model_num_buffer_tensors(whole.m); t++) {
    const struct gw_tensor *tt = gw_model_buffer_tensor(whole.m, t);
    if (tt->kind != GW_TENSOR_RUNNING) continue;
    d = max_rel_diff(gw_model_tensor_data(part.m, tt), gw_model_tensor_data(whole.m, tt), tt->numel);
    worst[2] = fmax(worst[2], d);
    EXPECT(d <= sc->tol, "%s differs by %.3g", tt->name, d);
  }
  printf("sync batch norm, image %d, rank %d of batch %d in %d: largest differences: logits %.2g, gradients %.2g, "
         "running statistics %.2g\n", sc->image, rank, mine, total, worst[0], worst[1], worst[2]);
  free(logits_w), free(logits_p);
  rig_down(&whole, &gw_backend_cpu);
  rig_down(&part, &gw_backend_cpu);
  return 0;
}

static void sync_case(int nranks, struct sync_case sc) {
  ck_assert_msg(run_ranks(nranks, body_sync_bn, &sc, 120) == 0, "image %d, batches %d %d %d %d", sc.image,
                sc.batch[0], sc.batch[1], sc.batch[2], sc.batch[3]);
}

/* 2 ranks of 3 on 16x16 images. */
START_TEST(test_sync_bn_matches_global_batch) { sync_case(2, (struct sync_case){16, {3, 3}, 1e-4}); }
END_TEST

/* Batch 1 per rank on 8x8 images: layer4 is 1x1, one value per channel on each
 * rank (plain batch norm refuses it), three over the ranks. */
START_TEST(test_sync_bn_one_value_per_rank) { sync_case(3, (struct sync_case){8, {1, 1, 1}, 5e-4}); }
END_TEST

/* Batches of 1 and 4 on 8x8 images (rank 0 alone would be refused), and of 2
 * and 5 on 16x16: the counts are summed, not taken as equal. */
START_TEST(test_sync_bn_uneven_batches) {
  sync_case(2, (struct sync_case){8, {1, 4}, 1e-4});
  sync_case(2, (struct sync_case){16, {2, 5}, 1e-4});
}
END_TEST

/* SyncBatchNorm on one rank: the sum across ranks is this rank's own. */
static gw_result_t sum_alone(void *arg, double *buf, size_t n) {
  (void)arg, (void)buf, (void)n;
  return GW_SUCCESS;
}

/* A profile turned on before SyncBatchNorm (which runs the fused groups layer
 * by layer): every layer is timed in both directions, the ReLUs and residual
 * adds that were a group's members included, and none is marked fused. */
START_TEST(test_profile_then_sync_bn) {
  struct rig r;
  rig_up(&r, &gw_backend_cpu, 50, 2);
  ck_assert_int_gt(gw_exec_fused_groups(r.e), 0);
  ck_assert_msg(gw_exec_set_profile(r.e, 1) == GW_SUCCESS, "%s", gw_model_last_error());
  gw_exec_set_sync_bn(r.e, sum_alone, NULL);
  ck_assert_int_eq(gw_exec_fused_groups(r.e), 0);
  train_step(&r, NULL, NULL);
  int n = 0, steps = 0;
  const struct gw_exec_layer_time *t = gw_exec_profile(r.e, &n, &steps);
  ck_assert_int_eq(steps, 1);
  for (int i = 0; i + 1 < n; i++)
    ck_assert_msg(t[i].fwd_s > 0 && t[i].bwd_s > 0 && !t[i].member && !t[i].fused,
                  "%s (kind %d): forward %g s, backward %g s, member %d, fused %d", t[i].name, t[i].kind, t[i].fwd_s,
                  t[i].bwd_s, t[i].member, t[i].fused);
  rig_down(&r, &gw_backend_cpu);
}
END_TEST

TCase *exec_sync_tcase(void) {
  TCase *tc = tcase_create("sync");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_sync_bn_matches_global_batch);
  tcase_add_test(tc, test_sync_bn_one_value_per_rank);
  tcase_add_test(tc, test_sync_bn_uneven_batches);
  tcase_add_test(tc, test_profile_then_sync_bn);
  return tc;
}

#endif
