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

/* SyncBatchNorm: 2 ranks with half the batch each and statistics summed across
 * them must match one process with the whole batch: the logits of each half, the
 * running statistics, and the gradients averaged over the ranks.
 * Tolerance: |a - b| <= 1e-4 * max |b| + 1e-6 per tensor (the global variance is
 * E[x^2] - mean^2 in double here, two-pass in the single process: a few ulps). */
static gw_result_t allreduce_doubles(void *arg, double *buf, size_t n) {
  return gw_allreduce(buf, buf, n, GW_FLOAT64, GW_SUM, (gw_comm_t)arg, NULL);
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
  double scale = 0, err = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= err)) err = d;
  }
  return err / (scale + 1e-2);
}

static int body_sync_bn(gw_comm_t comm, int rank, int nranks, void *arg) {
  (void)arg;
  const int half = 3;
  struct rig whole, part;
  rig_up(&whole, &gw_backend_cpu, 18, 2 * half);
  rig_up(&part, &gw_backend_cpu, 18, half);
  gw_exec_set_sync_bn(part.e, allreduce_doubles, comm);
  size_t sample = 2 * 16 * 16, np = gw_model_num_params(whole.m);
  memcpy(part.x, whole.x + (size_t)rank * half * sample, (size_t)half * sample * sizeof(float));
  memcpy(part.y, whole.y + rank * half, (size_t)half * sizeof(int32_t));
  float lw = train_step(&whole, NULL, NULL), lp = train_step(&part, NULL, NULL);
  float logits_w[6 * 3], logits_p[3 * 3];
  EXPECT(gw_exec_logits(whole.e, logits_w) == GW_SUCCESS && gw_exec_logits(part.e, logits_p) == GW_SUCCESS, "logits");
  double d = max_rel_diff(logits_p, logits_w + rank * half * 3, (size_t)half * 3);
  EXPECT(d <= 1e-4, "rank %d: logits differ from the whole batch's by %.3g", rank, d);
  float mean_loss = lp;
  EXPECT(gw_allreduce(&mean_loss, &mean_loss, 1, GW_FLOAT32, GW_AVG, comm, NULL) == GW_SUCCESS, "loss allreduce");
  EXPECT(fabsf(mean_loss - lw) <= 1e-5f * fabsf(lw), "mean loss %.9g vs %.9g", (double)mean_loss, (double)lw);
  EXPECT(gw_allreduce(gw_model_grads(part.m), gw_model_grads(part.m), np, GW_FLOAT32, GW_AVG, comm, NULL) ==
             GW_SUCCESS, "grad allreduce");
  for (int t = 0; t < gw_model_num_param_tensors(whole.m); t++) {
    const struct gw_tensor *tt = gw_model_param_tensor(whole.m, t);
    d = max_rel_diff(gw_model_grads(part.m) + tt->offset, gw_model_grads(whole.m) + tt->offset, tt->numel);
    EXPECT(d <= 1e-4, "gradient of %s differs by %.3g", tt->name, d);
  }
  for (int t = 0; t < gw_model_num_buffer_tensors(whole.m); t++) {
    const struct gw_tensor *tt = gw_model_buffer_tensor(whole.m, t);
    if (tt->kind != GW_TENSOR_RUNNING) continue;
    d = max_rel_diff(gw_model_tensor_data(part.m, tt), gw_model_tensor_data(whole.m, tt), tt->numel);
    EXPECT(d <= 1e-4, "%s differs by %.3g", tt->name, d);
  }
  rig_down(&whole, &gw_backend_cpu);
  rig_down(&part, &gw_backend_cpu);
  (void)nranks;
  return 0;
}

START_TEST(test_sync_bn_matches_global_batch) { ck_assert_int_eq(run_ranks(2, body_sync_bn, NULL, 120), 0); }
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
  tcase_add_test(tc, test_profile_then_sync_bn);
  return tc;
}

#endif
