/* test_model_exec_errors.c - what the executor says when a layer fails: the
 * cpu backend's table wrapped so that one entry fails at its n-th call with a
 * message of its own, and gw_model_last_error() must name the direction, the
 * layer and its index in front of that message, kept whole.  A case of its own
 * (CK_RUN_CASE=errors) in the model-exec test, with the rig of
 * test_model_exec.h. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "gw_config.h"
#include "harness.h"

#if GW_HAVE_ONEDNN

#include "model_internal.h" /* gw__model_fail, struct gw_model */
#include "test_model_exec.h"

/* Per wrapped entry: calls so far and the call that fails (0: none). */
static int fwd_calls, fwd_fail_at, bwd_calls, bwd_fail_at, loss_calls, loss_fail_at;

static gw_result_t failing_conv_fwd(struct gw_op *op, const gw_act_t *x, const float *w, gw_act_t *y) {
  if (++fwd_calls == fwd_fail_at)
    return gw__model_fail(GW_ERR_INTERNAL, "test backend: conv_fwd: injected failure at call %d", fwd_calls);
  return gw_backend_cpu.conv_fwd(op, x, w, y);
}

static gw_result_t failing_conv_bwd_weights(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, float *dw) {
  if (++bwd_calls == bwd_fail_at)
    return gw__model_fail(GW_ERR_SYSTEM, "test backend: conv_bwd_weights: injected failure at call %d", bwd_calls);
  return gw_backend_cpu.conv_bwd_weights(op, x, dy, dw);
}

static gw_result_t failing_loss(struct gw_op *op, const gw_act_t *logits, const int32_t *labels, float grad_scale,
                                float *loss, gw_act_t *dlogits) {
  if (++loss_calls == loss_fail_at) return gw__model_fail(GW_ERR_INTERNAL, "test backend: loss_fwd_bwd: injected");
  return gw_backend_cpu.loss_fwd_bwd(op, logits, labels, grad_scale, loss, dlogits);
}

/* The index of the n-th convolution (from 1) in forward order, or from the
 * end when backward. */
static int nth_conv(const struct gw_model *m, int n, int backward) {
  for (int k = 0; k < m->nlayers; k++) {
    const int i = backward ? m->nlayers - 1 - k : k;
    if (m->layers[i].kind == GW_LAYER_CONV && --n == 0) return i;
  }
  ck_abort_msg("the model has fewer convolutions");
  return -1;
}

static void expect_message(const char *want) {
  ck_assert_msg(strcmp(gw_model_last_error(), want) == 0, "message:\n  %s\nwanted:\n  %s", gw_model_last_error(),
                want);
}

/* ResNet-50 (fused groups: the conv after a bn -> relu group) and ResNet-18
 * unfused: forward's 5th convolution fails, then backward's 3rd weight
 * gradient (counted from the end), then the loss; the code is the backend's and
 * the executor still runs a step afterwards. */
static void errors_case(int depth, int no_fuse) {
  struct gw_backend_ops ops = gw_backend_cpu;
  ops.conv_fwd = failing_conv_fwd, ops.conv_bwd_weights = failing_conv_bwd_weights, ops.loss_fwd_bwd = failing_loss;
  fwd_calls = bwd_calls = loss_calls = 0;
  fwd_fail_at = 5, bwd_fail_at = 0, loss_fail_at = 0;
  struct rig r;
  rig_up(&r, &ops, depth, 2);
  if (no_fuse) { /* the same model planned again without fused groups */
    gw_exec_free(r.e);
    struct gw_exec_config ec = {.batch = 2, .no_fuse = 1};
    ck_assert(gw_exec_create(r.m, &ops, r.b, &ec, &r.e) == GW_SUCCESS);
  }
  const struct gw_model *m = r.m;
  char want[512];
  float loss;
  ck_assert_int_eq(gw_exec_forward(r.e, r.x, 1), GW_ERR_INTERNAL);
  int i = nth_conv(m, 5, 0);
  snprintf(want, sizeof want, "executor: forward of layer %s (%d): test backend: conv_fwd: injected failure at call 5",
           m->layers[i].name, i);
  expect_message(want);
  ck_assert_int_eq(gw_exec_backward(r.e, r.y, &loss, NULL, NULL), GW_ERR_INVALID_ARGUMENT); /* no training forward */

  bwd_calls = 0, bwd_fail_at = 3;
  ck_assert_msg(gw_exec_forward(r.e, r.x, 1) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_int_eq(gw_exec_backward(r.e, r.y, &loss, NULL, NULL), GW_ERR_SYSTEM);
  i = nth_conv(m, 3, 1);
  snprintf(want, sizeof want,
           "executor: backward of layer %s (%d): test backend: conv_bwd_weights: injected failure at call 3",
           m->layers[i].name, i);
  expect_message(want);

  loss_calls = 0, loss_fail_at = 1;
  ck_assert(gw_exec_forward(r.e, r.x, 1) == GW_SUCCESS);
  ck_assert_int_eq(gw_exec_backward(r.e, r.y, &loss, NULL, NULL), GW_ERR_INTERNAL);
  expect_message("executor: the loss: test backend: loss_fwd_bwd: injected");

  train_step(&r, NULL, NULL); /* nothing fails any more */
  rig_down(&r, &ops);
}

START_TEST(test_layer_failure_named) {
  errors_case(50, 0);
  errors_case(18, 1);
}
END_TEST

TCase *exec_errors_tcase(void) {
  TCase *tc = tcase_create("errors");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_layer_failure_named);
  return tc;
}

#endif
