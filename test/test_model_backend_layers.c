/* test_model_backend_layers.c - the model-backend test's layers other than the
 * convolution: ReLU and add (exact); batch norm training / inference / backward,
 * the running-statistics update to the bit, finite differences; max pool and
 * global average pool; fully connected; softmax cross-entropy with label
 * smoothing.  Same backend, helpers and tolerances as test_model_backend.c. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model_backend_util.h"


/* ReLU forward (out of place and in place) and backward from the output, exactly:
 * y = max(x, 0), dx = y > 0 ? dy : 0 (PyTorch's threshold_backward).  Some inputs
 * are exactly 0 and -0. */
START_TEST(test_relu) {
  static const int shapes[][4] = {{2, 3, 7, 5}, {1, 16, 8, 8}, {3, 5, 1, 1}, {2, 64, 14, 14}};
  struct gw_backend *b = backend();
  for (size_t si = 0; si < 4; si++) {
    const int *s = shapes[si];
    struct gw_op_desc d = same_desc(GW_LAYER_RELU, s[0], s[1], s[2], s[3]);
    size_t n = (size_t)s[0] * s[1] * s[2] * s[3];
    struct tensor x = tensor_new(b, n), y = tensor_new(b, n), dy = tensor_new(b, n), dx = tensor_new(b, n);
    fill(x.h, n, 21 + si), fill(dy.h, n, 22 + si);
    for (size_t i = 0; i < n; i += 7) x.h[i] = (i % 14) ? 0.f : -0.f;
    up(x), up(dy), nan_up(y), nan_up(dx);
    struct gw_op *op = NULL;
    ck_assert_msg(be->op_create(b, &d, &op) == GW_SUCCESS, "%s", gw_model_last_error());
    ck_assert(be->relu_fwd(op, x.d, y.d) == GW_SUCCESS);
    ck_assert(be->relu_bwd(op, y.d, dy.d, dx.d) == GW_SUCCESS);
    down(y), down(dx);
    for (size_t i = 0; i < n; i++) {
      float want = x.h[i] > 0 ? x.h[i] : 0.f;
      ck_assert_msg(y.h[i] == want, "relu shape %zu y[%zu] = %g, want %g", si, i, (double)y.h[i], (double)want);
      float gwant = y.h[i] > 0 ? dy.h[i] : 0.f;
      ck_assert_msg(dx.h[i] == gwant, "relu shape %zu dx[%zu] = %g, want %g", si, i, (double)dx.h[i], (double)gwant);
    }
    ck_assert(be->relu_fwd(op, x.d, x.d) == GW_SUCCESS); /* in place */
    down(x);
    ck_assert(memcmp(x.h, y.h, n * 4) == 0 || n == 0);
    for (size_t i = 0; i < n; i++) ck_assert(x.h[i] == y.h[i]);
    be->op_destroy(op);
    struct tensor all[] = {x, y, dy, dx};
    tensors_free(all, 4);
  }
  be->destroy(b);
}
END_TEST

/* Residual add, exactly, out of place and into either input. */
START_TEST(test_add) {
  struct gw_backend *b = backend();
  struct gw_op_desc d = same_desc(GW_LAYER_ADD, 3, 5, 7, 9);
  size_t n = 3 * 5 * 7 * 9;
  struct tensor a = tensor_new(b, n), c = tensor_new(b, n), y = tensor_new(b, n), a2 = tensor_new(b, n);
  fill(a.h, n, 31), fill(c.h, n, 32);
  memcpy(a2.h, a.h, n * 4);
  up(a), up(c), up(a2), nan_up(y);
  struct gw_op *op = NULL;
  ck_assert_msg(be->op_create(b, &d, &op) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert(be->add(op, a.d, c.d, y.d) == GW_SUCCESS);
  down(y);
  for (size_t i = 0; i < n; i++) ck_assert_msg(y.h[i] == a.h[i] + c.h[i], "add [%zu]", i);
  ck_assert(be->add(op, a.d, c.d, a.d) == GW_SUCCESS);
  down(a);
  ck_assert(memcmp(a.h, y.h, n * 4) == 0);
  ck_assert(be->add(op, a2.d, c.d, c.d) == GW_SUCCESS);
  down(c);
  ck_assert(memcmp(c.h, y.h, n * 4) == 0);
  struct gw_op_desc cd = conv_desc(1, 3, 8, 8, 4, 3, 1, 1);
  struct gw_op *conv = NULL;
  ck_assert(be->op_create(b, &cd, &conv) == GW_SUCCESS);
  ck_assert_int_eq(be->add(conv, a.d, c.d, y.d), GW_ERR_INVALID_ARGUMENT); /* wrong kind */
  ck_assert(strstr(gw_model_last_error(), "add called on an op of kind 0"));
  be->op_destroy(conv);
  be->op_destroy(op);
  struct tensor all[] = {a, c, y, a2};
  tensors_free(all, 4);
  be->destroy(b);
}
END_TEST

/* Batch norm in double, straight from PyTorch's definitions: batch mean and biased
 * variance per channel normalize; running stats move by momentum toward the mean
 * and the UNBIASED variance; backward is the derivative of that normalization. */
struct bn_ref {
  double *y, *dx, *dgamma, *dbeta, *mean, *rstd, *rmean, *rvar;
};

static void bn_reference(const struct gw_op_desc *d, const float *x, const float *gamma, const float *beta,
                         const float *dy, const float *rmean0, const float *rvar0, struct bn_ref *r) {
  size_t hw = (size_t)d->h * d->w, m = (size_t)d->n * hw;
  for (int ch = 0; ch < d->c; ch++) {
    double s = 0, ss = 0;
    for (int n = 0; n < d->n; n++)
      for (size_t i = 0; i < hw; i++) s += x[((size_t)n * d->c + ch) * hw + i];
    double mean = s / m;
    for (int n = 0; n < d->n; n++)
      for (size_t i = 0; i < hw; i++) {
        double v = x[((size_t)n * d->c + ch) * hw + i] - mean;
        ss += v * v;
      }
    double var = ss / m, rstd = 1 / sqrt(var + (double)d->eps), sdy = 0, sdyxh = 0;
    for (int n = 0; n < d->n; n++)
      for (size_t i = 0; i < hw; i++) {
        size_t o = ((size_t)n * d->c + ch) * hw + i;
        double xh = (x[o] - mean) * rstd;
        r->y[o] = xh * gamma[ch] + beta[ch];
        sdy += dy[o], sdyxh += dy[o] * xh;
      }
    for (int n = 0; n < d->n; n++)
      for (size_t i = 0; i < hw; i++) {
        size_t o = ((size_t)n * d->c + ch) * hw + i;
        double xh = (x[o] - mean) * rstd;
        r->dx[o] = gamma[ch] * rstd * (dy[o] - sdy / m - xh * sdyxh / m);
      }
    r->dgamma[ch] = sdyxh, r->dbeta[ch] = sdy, r->mean[ch] = mean, r->rstd[ch] = rstd;
    double mom = (double)d->momentum;
    r->rmean[ch] = (1 - mom) * rmean0[ch] + mom * mean;
    r->rvar[ch] = (1 - mom) * rvar0[ch] + mom * ss / (m - 1);
  }
}

/* Training forward, backward and inference over several shapes, with channel
 * offsets (mean 3, scale up to 2) so centring matters.  Tolerances: y, dx and the
 * statistics within 2e-6 relative plus 1e-6 absolute (a handful of float roundings
 * on values of order 1); dgamma, dbeta (sums of m terms) within 1e-5 of the sum of
 * the magnitudes. */
START_TEST(test_bn) {
  static const int shapes[][4] = {{2, 3, 5, 7}, {4, 8, 4, 4}, {3, 5, 1, 1}, {1, 16, 9, 9}, {2, 64, 14, 14}};
  struct gw_backend *b = backend();
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int *s = shapes[si];
    struct gw_op_desc d = same_desc(GW_LAYER_BN, s[0], s[1], s[2], s[3]);
    d.eps = 1e-5, d.momentum = 0.1;
    size_t n = (size_t)s[0] * s[1] * s[2] * s[3], c = (size_t)s[1];
    struct tensor x = act_in(b, &d), y = act_in(b, &d), dy = act_in(b, &d), dx = act_in(b, &d);
    struct tensor gamma = tensor_new(b, c), beta = tensor_new(b, c), mean = tensor_new(b, c);
    struct tensor rstd = tensor_new(b, c), rmean = tensor_new(b, c), rvar = tensor_new(b, c);
    struct tensor dgamma = tensor_new(b, c), dbeta = tensor_new(b, c);
    double *dd = malloc((3 * n + 6 * c) * 8), *mag = malloc(c * 8);
    ck_assert(dd && mag);
    struct bn_ref r = {dd, dd + n, dd + 2 * n, dd + 2 * n + c, dd + 2 * n + 2 * c, dd + 2 * n + 3 * c,
                       dd + 2 * n + 4 * c, dd + 2 * n + 5 * c};
    fill(x.h, n, 41 + si), fill(dy.h, n, 42 + si), fill(gamma.h, c, 43 + si), fill(beta.h, c, 44 + si);
    for (size_t i = 0; i < n; i++) x.h[i] = x.h[i] * (float)(1 + (i / (s[2] * s[3])) % 2) + 3.f;
    float rm0[64], rv0[64];
    for (size_t i = 0; i < c; i++)
      rm0[i] = rmean.h[i] = 0.5f * (float)i, rv0[i] = rvar.h[i] = 1.f + 0.25f * (float)i;
    up(x), up(dy), up(gamma), up(beta), up(rmean), up(rvar);
    nan_up(y), nan_up(dx), nan_up(mean), nan_up(rstd), nan_up(dgamma), nan_up(dbeta);
    struct gw_op *op = NULL;
    ck_assert_msg(be->op_create(b, &d, &op) == GW_SUCCESS, "%s", gw_model_last_error());
    ck_assert_msg(be->bn_fwd_train(op, x.d, gamma.d, beta.d, y.d, mean.d, rstd.d, rmean.d, rvar.d) == GW_SUCCESS,
                  "%s", gw_model_last_error());
    ck_assert(be->bn_bwd(op, x.d, dy.d, gamma.d, mean.d, rstd.d, dx.d, dgamma.d, dbeta.d) == GW_SUCCESS);
    down(y), down(dx), down(mean), down(rstd), down(rmean), down(rvar), down(dgamma), down(dbeta);
    bn_reference(&d, x.h, gamma.h, beta.h, dy.h, rm0, rv0, &r);
    char l[96];
    snprintf(l, sizeof l, "bn %dx%dx%dx%d", s[0], s[1], s[2], s[3]);
    compare(y.h, r.y, NULL, n, 2e-6, 1e-6, l);
    compare(dx.h, r.dx, NULL, n, 2e-6, 1e-6, l);
    compare(mean.h, r.mean, NULL, c, 2e-6, 1e-6, l);
    compare(rstd.h, r.rstd, NULL, c, 2e-6, 1e-6, l);
    compare(rmean.h, r.rmean, NULL, c, 2e-6, 1e-6, l);
    compare(rvar.h, r.rvar, NULL, c, 2e-6, 1e-6, l);
    size_t hw = (size_t)s[2] * s[3];
    for (size_t ch = 0; ch < c; ch++) {
      mag[ch] = 0;
      for (int i = 0; i < s[0]; i++)
        for (size_t j = 0; j < hw; j++) mag[ch] += fabs(dy.h[((size_t)i * c + ch) * hw + j]) * 4;
    }
    compare(dgamma.h, r.dgamma, mag, c, 1e-5, 0, l);
    compare(dbeta.h, r.dbeta, mag, c, 1e-5, 0, l);
    /* Inference with the running stats just updated. */
    nan_up(y);
    ck_assert(be->bn_fwd_infer(op, x.d, gamma.d, beta.d, rmean.d, rvar.d, y.d) == GW_SUCCESS);
    down(y);
    for (size_t i = 0; i < n; i++) {
      size_t ch = (i / hw) % c;
      double want = (x.h[i] - (double)rmean.h[ch]) / sqrt((double)rvar.h[ch] + 1e-5) * gamma.h[ch] + beta.h[ch];
      ck_assert_msg(fabs(y.h[i] - want) <= 2e-6 * fabs(want) + 1e-6, "%s infer [%zu] = %.9g, want %.9g", l, i,
                    (double)y.h[i], want);
    }
    be->op_destroy(op);
    struct tensor all[] = {x, y, dy, dx, gamma, beta, mean, rstd, rmean, rvar, dgamma, dbeta};
    tensors_free(all, 12);
    free(dd), free(mag);
  }
  be->destroy(b);
}
END_TEST

/* Equal values (== or both NaN: the fused ReLU may write +0 where a separate
 * one writes -0). */
static void same_values(const float *a, const float *b, size_t n, const char *label) {
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(a[i] == b[i] || (a[i] != a[i] && b[i] != b[i]), "%s [%zu]: fused %.9g, separate %.9g", label, i,
                  (double)a[i], (double)b[i]);
}

/* Batch norm fused with ReLU, and with the residual add and ReLU (backend.h
 * bn_act_*), against the separate calls on the same inputs: training outputs,
 * batch and running statistics, inference, and backward (dx, dgamma, dbeta, and
 * the residual's gradient), value for value.  About half of the outputs are
 * negative before the ReLU, so the mask matters. */
START_TEST(test_bn_fused) {
  static const int shapes[][4] = {{2, 3, 5, 7}, {4, 8, 4, 4}, {2, 16, 14, 14}};
  struct gw_backend *b = backend();
  if (!be->bn_act_fwd_train) {
    be->destroy(b);
    return; /* a backend without fusion: nothing to compare */
  }
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int with_z = 0; with_z < 2; with_z++) {
      const int *s = shapes[si];
      struct gw_op_desc d = same_desc(GW_LAYER_BN, s[0], s[1], s[2], s[3]), da = same_desc(GW_LAYER_ADD, s[0], s[1],
                                                                                          s[2], s[3]);
      struct gw_op_desc dr = same_desc(GW_LAYER_RELU, s[0], s[1], s[2], s[3]);
      d.eps = 1e-5, d.momentum = 0.1;
      const size_t n = (size_t)s[0] * s[1] * s[2] * s[3], c = (size_t)s[1];
      /* [0] fused, [1] separate */
      struct tensor x = act_in(b, &d), z = act_in(b, &d), dy = act_in(b, &d), gamma = tensor_new(b, c),
                    beta = tensor_new(b, c);
      struct tensor y[2], dx[2], dz[2], mean[2], rstd[2], rm[2], rv[2], dg[2], db[2], yi[2];
      fill(x.h, n, 71 + si), fill(z.h, n, 72 + si), fill(dy.h, n, 73 + si), fill(gamma.h, c, 74 + si);
      fill(beta.h, c, 75 + si);
      up(x), up(z), up(dy), up(gamma), up(beta);
      for (int k = 0; k < 2; k++) {
        y[k] = act_in(b, &d), dx[k] = act_in(b, &d), dz[k] = act_in(b, &d), yi[k] = act_in(b, &d);
        mean[k] = tensor_new(b, c), rstd[k] = tensor_new(b, c), dg[k] = tensor_new(b, c), db[k] = tensor_new(b, c);
        rm[k] = tensor_new(b, c), rv[k] = tensor_new(b, c);
        for (size_t i = 0; i < c; i++) rm[k].h[i] = 0.25f * (float)i, rv[k].h[i] = 1.f + 0.5f * (float)i;
        up(rm[k]), up(rv[k]);
        nan_up(y[k]), nan_up(dx[k]), nan_up(dz[k]), nan_up(yi[k]), nan_up(mean[k]), nan_up(rstd[k]);
        nan_up(dg[k]), nan_up(db[k]);
      }
      struct gw_op *op = NULL, *addop = NULL, *reluop = NULL;
      ck_assert(be->op_create(b, &d, &op) == GW_SUCCESS && be->op_create(b, &da, &addop) == GW_SUCCESS &&
                be->op_create(b, &dr, &reluop) == GW_SUCCESS);
      const void *zd = with_z ? z.d : NULL;
      /* fused */
      ck_assert_msg(be->bn_act_fwd_train(op, x.d, zd, gamma.d, beta.d, y[0].d, mean[0].d, rstd[0].d, rm[0].d,
                                         rv[0].d) == GW_SUCCESS, "%s", gw_model_last_error());
      ck_assert(be->bn_act_bwd(op, x.d, y[0].d, dy.d, gamma.d, mean[0].d, rstd[0].d, dx[0].d,
                               with_z ? dz[0].d : NULL, dg[0].d, db[0].d) == GW_SUCCESS);
      ck_assert(be->bn_act_fwd_infer(op, x.d, zd, gamma.d, beta.d, rm[0].d, rv[0].d, yi[0].d) == GW_SUCCESS);
      /* separate: bn, add, relu; relu_bwd, (the add passes it on), bn_bwd */
      ck_assert(be->bn_fwd_train(op, x.d, gamma.d, beta.d, y[1].d, mean[1].d, rstd[1].d, rm[1].d, rv[1].d) ==
                GW_SUCCESS);
      if (with_z) ck_assert(be->add(addop, y[1].d, z.d, y[1].d) == GW_SUCCESS);
      ck_assert(be->relu_fwd(reluop, y[1].d, y[1].d) == GW_SUCCESS);
      ck_assert(be->relu_bwd(reluop, y[1].d, dy.d, dz[1].d) == GW_SUCCESS);
      ck_assert(be->bn_bwd(op, x.d, dz[1].d, gamma.d, mean[1].d, rstd[1].d, dx[1].d, dg[1].d, db[1].d) == GW_SUCCESS);
      ck_assert(be->bn_fwd_infer(op, x.d, gamma.d, beta.d, rm[1].d, rv[1].d, yi[1].d) == GW_SUCCESS);
      if (with_z) ck_assert(be->add(addop, yi[1].d, z.d, yi[1].d) == GW_SUCCESS);
      ck_assert(be->relu_fwd(reluop, yi[1].d, yi[1].d) == GW_SUCCESS);
      char l[96];
      for (int k = 0; k < 2; k++) {
        down(y[k]), down(dx[k]), down(dz[k]), down(yi[k]), down(mean[k]), down(rstd[k]), down(dg[k]), down(db[k]);
        down(rm[k]), down(rv[k]);
      }
      size_t negative = 0;
      for (size_t i = 0; i < n; i++) negative += y[1].h[i] == 0;
      ck_assert_msg(negative > n / 10 && negative < n - n / 10, "%zu of %zu outputs cut by the ReLU", negative, n);
#define SAME(t, cnt, what) (snprintf(l, sizeof l, "bn%s %dx%dx%dx%d %s", with_z ? "+add" : "", s[0], s[1], s[2], s[3], \
                                     what), same_values(t[0].h, t[1].h, cnt, l))
      SAME(y, n, "y"), SAME(mean, c, "mean"), SAME(rstd, c, "rstd"), SAME(rm, c, "running mean");
      SAME(rv, c, "running var"), SAME(dx, n, "dx"), SAME(dg, c, "dgamma"), SAME(db, c, "dbeta");
      SAME(yi, n, "inference y");
      if (with_z) SAME(dz, n, "dz");
#undef SAME
      be->op_destroy(op), be->op_destroy(addop), be->op_destroy(reluop);
      struct tensor all[] = {x, z, dy, gamma, beta};
      tensors_free(all, 5);
      for (int k = 0; k < 2; k++) {
        struct tensor mine[] = {y[k], dx[k], dz[k], yi[k], mean[k], rstd[k], dg[k], db[k], rm[k], rv[k]};
        tensors_free(mine, 10);
      }
    }
  be->destroy(b);
}
END_TEST

/* The running-stat update to the bit, as PyTorch computes it on the CPU (in double,
 * rounded to float once): x chosen so the batch statistics are exact (channel 0:
 * 1, 2, 3, 4 -> mean 2.5, unbiased var 5/3; channel 1: 0, 0, 8, 8 -> mean 4, var
 * 64/3), then running = momentum * batch + (1 - momentum) * running, for momentum
 * 0.1 and 1; and training refuses one value per channel, as PyTorch does. */
START_TEST(test_bn_running_stats_exact) {
  struct gw_backend *b = backend();
  struct gw_op_desc d = same_desc(GW_LAYER_BN, 2, 2, 1, 2);
  d.eps = 1e-5;
  /* [n=2][c=2][1][2] */
  const float xv[8] = {1, 2, 0, 0, 3, 4, 8, 8}, ones[2] = {1, 1}, zeros[2] = {0, 0};
  struct tensor x = act_in(b, &d), gamma = tensor_of(b, ones, 2), beta = tensor_of(b, zeros, 2);
  memcpy(x.h, xv, sizeof xv);
  up(x);
  struct tensor y = act_in(b, &d), mean = tensor_new(b, 2), rstd = tensor_new(b, 2);
  struct tensor rm = tensor_new(b, 2), rv = tensor_new(b, 2);
  const float rm0[2] = {0.3f, -1.7f}, rv0[2] = {0.9f, 2.2f};
  for (int mi = 0; mi < 2; mi++) {
    d.momentum = mi ? 1.0 : 0.1;
    struct gw_op *op = NULL;
    ck_assert(be->op_create(b, &d, &op) == GW_SUCCESS);
    memcpy(rm.h, rm0, sizeof rm0), memcpy(rv.h, rv0, sizeof rv0);
    up(rm), up(rv), nan_up(y), nan_up(mean), nan_up(rstd);
    ck_assert(be->bn_fwd_train(op, x.d, gamma.d, beta.d, y.d, mean.d, rstd.d, rm.d, rv.d) == GW_SUCCESS);
    down(rm), down(rv), down(mean), down(rstd);
    const double bm[2] = {2.5, 4}, bv[2] = {5.0 / 3.0, 64.0 / 3.0};
    for (int ch = 0; ch < 2; ch++) {
      const double mom = mi ? 1.0 : 0.1; /* PyTorch's momentum, a double */
      float want_m = (float)(mom * bm[ch] + (1 - mom) * (double)rm0[ch]);
      float want_v = (float)(mom * bv[ch] + (1 - mom) * (double)rv0[ch]);
      ck_assert_msg(rm.h[ch] == want_m, "momentum %g channel %d running_mean %.9g, want %.9g", mom, ch,
                    (double)rm.h[ch], (double)want_m);
      ck_assert_msg(rv.h[ch] == want_v, "momentum %g channel %d running_var %.9g, want %.9g", mom, ch,
                    (double)rv.h[ch], (double)want_v);
      ck_assert(mean.h[ch] == (float)bm[ch]);
      ck_assert(rstd.h[ch] == (float)(1 / sqrt(bv[ch] * 3 / 4 + 1e-5)));
    }
    be->op_destroy(op);
  }
  d = same_desc(GW_LAYER_BN, 1, 2, 1, 1);
  d.eps = 1e-5, d.momentum = 0.1;
  struct gw_op *op = NULL;
  ck_assert(be->op_create(b, &d, &op) == GW_SUCCESS);
  memcpy(rm.h, zeros, sizeof zeros), memcpy(rv.h, ones, sizeof ones);
  up(rm), up(rv);
  ck_assert_int_eq(be->bn_fwd_train(op, x.d, gamma.d, beta.d, y.d, mean.d, rstd.d, rm.d, rv.d),
                   GW_ERR_INVALID_ARGUMENT);
  ck_assert(strstr(gw_model_last_error(), "one value per channel"));
  ck_assert(be->bn_fwd_infer(op, x.d, gamma.d, beta.d, rm.d, rv.d, y.d) == GW_SUCCESS); /* inference is fine */
  be->op_destroy(op);
  struct tensor all[] = {x, gamma, beta, y, mean, rstd, rm, rv};
  tensors_free(all, 8);
  be->destroy(b);
}
END_TEST

/* Max pool (3x3/2 pad 1 as in the stem, and others) against the naive window max;
 * backward routes each dy to its window's argmax (first on ties, never hit with
 * random data) and sums where windows overlap.  y exactly; dx (sums of up to 9
 * values where windows overlap) within 1e-6 of the sum of their magnitudes. */
START_TEST(test_maxpool) {
  static const int shapes[][7] = {/* n, c, h, w, kernel, stride, pad */
                                  {2, 3, 16, 16, 3, 2, 1}, {1, 4, 17, 13, 3, 2, 1}, {3, 2, 7, 7, 3, 2, 1},
                                  {2, 5, 8, 8, 2, 2, 0},   {1, 3, 9, 10, 3, 1, 1},  {2, 8, 2, 2, 3, 2, 1},
                                  {2, 3, 1, 1, 3, 2, 1}}; /* the stem's pool on a 1x1 input */
  struct gw_backend *b = backend();
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int *s = shapes[si];
    struct gw_op_desc d = conv_desc(s[0], s[1], s[2], s[3], s[1], s[4], s[5], s[6]);
    d.kind = GW_LAYER_MAXPOOL;
    size_t nx = (size_t)d.n * d.c * d.h * d.w, ny = (size_t)d.n * d.c * d.p * d.q;
    struct tensor x = act_in(b, &d), dx = act_in(b, &d), y = act_out(b, &d), dy = act_out(b, &d);
    const float *xh = x.h, *dyh = dy.h;
    double *rdx = calloc(nx, 8), *mdx = calloc(nx, 8), *ry = malloc(ny * 8);
    ck_assert(rdx && mdx && ry);
    fill(x.h, nx, 51 + si), fill(dy.h, ny, 52 + si);
    up(x), up(dy), nan_up(y), nan_up(dx);
    struct gw_op *op = NULL;
    ck_assert_msg(be->op_create(b, &d, &op) == GW_SUCCESS, "%s", gw_model_last_error());
    size_t wsb = be->workspace_bytes(op);
    ck_assert(wsb > 0);
    void *ws = be->alloc(b, wsb); /* the backend's memory, never read here */
    ck_assert(ws);
    ck_assert(be->maxpool_fwd(op, x.d, y.d, ws) == GW_SUCCESS);
    ck_assert(be->maxpool_bwd(op, dy.d, ws, dx.d) == GW_SUCCESS);
    down(y), down(dx);
    for (int n = 0; n < d.n; n++)
      for (int c = 0; c < d.c; c++)
        for (int p = 0; p < d.p; p++)
          for (int q = 0; q < d.q; q++) {
            double best = -INFINITY;
            size_t arg = 0;
            for (int r = 0; r < d.kernel; r++)
              for (int t = 0; t < d.kernel; t++) {
                int ih = p * d.stride - d.pad + r, iw = q * d.stride - d.pad + t;
                if (ih < 0 || ih >= d.h || iw < 0 || iw >= d.w) continue;
                size_t xi = (((size_t)n * d.c + c) * d.h + ih) * d.w + iw;
                if (xh[xi] > best) best = xh[xi], arg = xi;
              }
            size_t o = (((size_t)n * d.c + c) * d.p + p) * d.q + q;
            ry[o] = best;
            rdx[arg] += dyh[o], mdx[arg] += fabs(dyh[o]);
          }
    char l[64];
    snprintf(l, sizeof l, "maxpool shape %zu", si);
    compare(y.h, ry, NULL, ny, 0, 0, l);
    compare(dx.h, rdx, mdx, nx, 1e-6, 0, l);
    be->op_destroy(op);
    be->dealloc(b, ws);
    struct tensor all[] = {x, dx, y, dy};
    tensors_free(all, 4);
    free(rdx), free(mdx), free(ry);
  }
  be->destroy(b);
}
END_TEST

/* Global average pool: y = mean over h x w, dx = dy / (h w) everywhere.  1e-6
 * relative plus 1e-7 absolute. */
START_TEST(test_avgpool) {
  static const int shapes[][4] = {{2, 3, 7, 7}, {4, 16, 1, 1}, {1, 5, 3, 9}, {2, 64, 4, 4}};
  struct gw_backend *b = backend();
  for (size_t si = 0; si < 4; si++) {
    const int *s = shapes[si];
    struct gw_op_desc d = same_desc(GW_LAYER_AVGPOOL, s[0], s[1], s[2], s[3]);
    d.p = d.q = 1;
    size_t hw = (size_t)s[2] * s[3], planes = (size_t)s[0] * s[1];
    struct tensor x = act_in(b, &d), dx = act_in(b, &d);
    struct tensor y = tensor_new(b, planes), dy = tensor_new(b, planes);
    double *ry = malloc(planes * 8), *rdx = malloc(planes * hw * 8);
    ck_assert(ry && rdx);
    fill(x.h, planes * hw, 61 + si), fill(dy.h, planes, 62 + si);
    up(x), up(dy), nan_up(y), nan_up(dx);
    struct gw_op *op = NULL;
    ck_assert_msg(be->op_create(b, &d, &op) == GW_SUCCESS, "%s", gw_model_last_error());
    ck_assert(be->avgpool_fwd(op, x.d, y.d) == GW_SUCCESS);
    ck_assert(be->avgpool_bwd(op, dy.d, dx.d) == GW_SUCCESS);
    down(y), down(dx);
    for (size_t pl = 0; pl < planes; pl++) {
      double sum = 0;
      for (size_t i = 0; i < hw; i++) sum += x.h[pl * hw + i], rdx[pl * hw + i] = (double)dy.h[pl] / hw;
      ry[pl] = sum / hw;
    }
    compare(y.h, ry, NULL, planes, 1e-6, 1e-7, "avgpool y");
    compare(dx.h, rdx, NULL, planes * hw, 1e-6, 1e-7, "avgpool dx");
    be->op_destroy(op);
    struct tensor all[] = {x, dx, y, dy};
    tensors_free(all, 4);
    free(ry), free(rdx);
  }
  be->destroy(b);
}
END_TEST

/* Fully connected y = x W^T + b (W [out, in] as PyTorch's Linear) and its three
 * gradients against double sums; 1e-5 of the sum of the terms' magnitudes. */
START_TEST(test_fc) {
  static const int shapes[][5] = {/* n, c, h, w, k */
                                  {4, 64, 1, 1, 10}, {3, 7, 1, 1, 5}, {1, 2048, 1, 1, 1000}, {5, 3, 2, 3, 11},
                                  {64, 32, 1, 1, 10}};
  struct gw_backend *b = backend();
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int *s = shapes[si];
    struct gw_op_desc d = {.kind = GW_LAYER_FC, .n = s[0], .c = s[1], .h = s[2], .w = s[3], .k = s[4], .p = 1, .q = 1};
    size_t N = (size_t)s[0], F = (size_t)s[1] * s[2] * s[3], K = (size_t)s[4];
    struct tensor tx = act_in(b, &d), tw = tensor_new(b, K * F), tbias = tensor_new(b, K);
    struct tensor ty = tensor_new(b, N * K), tdy = tensor_new(b, N * K), tdx = act_in(b, &d);
    struct tensor tdw = tensor_new(b, K * F), tdb = tensor_new(b, K);
    const float *x = tx.h, *w = tw.h, *bias = tbias.h, *dy = tdy.h; /* the host values, for the reference */
    double *ry = calloc(N * K, 8), *my = calloc(N * K, 8), *rdx = calloc(N * F, 8), *mdx = calloc(N * F, 8);
    double *rdw = calloc(K * F, 8), *mdw = calloc(K * F, 8), *rdb = calloc(K, 8), *mdb = calloc(K, 8);
    ck_assert(ry && my && rdx && mdx && rdw && mdw && rdb && mdb);
    fill(tx.h, N * F, 71 + si), fill(tw.h, K * F, 72 + si), fill(tbias.h, K, 73 + si), fill(tdy.h, N * K, 74 + si);
    up(tx), up(tw), up(tbias), up(tdy), nan_up(ty), nan_up(tdx), nan_up(tdw), nan_up(tdb);
    struct gw_op *op = NULL;
    ck_assert_msg(be->op_create(b, &d, &op) == GW_SUCCESS, "%s", gw_model_last_error());
    ck_assert_msg(be->fc_fwd(op, tx.d, tw.d, tbias.d, ty.d) == GW_SUCCESS, "%s", gw_model_last_error());
    ck_assert_msg(be->fc_bwd(op, tx.d, tw.d, tdy.d, tdx.d, tdw.d, tdb.d) == GW_SUCCESS, "%s", gw_model_last_error());
    down(ty), down(tdx), down(tdw), down(tdb);
    for (size_t n = 0; n < N; n++)
      for (size_t k = 0; k < K; k++) {
        size_t o = n * K + k;
        ry[o] = bias[k], my[o] = fabs(bias[k]);
        rdb[k] += dy[o], mdb[k] += fabs(dy[o]);
        for (size_t f = 0; f < F; f++) {
          double xw = (double)x[n * F + f] * w[k * F + f], gw = (double)dy[o] * w[k * F + f],
                 gx = (double)dy[o] * x[n * F + f];
          ry[o] += xw, my[o] += fabs(xw);
          rdx[n * F + f] += gw, mdx[n * F + f] += fabs(gw);
          rdw[k * F + f] += gx, mdw[k * F + f] += fabs(gx);
        }
      }
    char l[64];
    snprintf(l, sizeof l, "fc shape %zu", si);
    compare(ty.h, ry, my, N * K, 1e-5, 0, l);
    compare(tdx.h, rdx, mdx, N * F, 1e-5, 0, l);
    compare(tdw.h, rdw, mdw, K * F, 1e-5, 0, l);
    compare(tdb.h, rdb, mdb, K, 1e-5, 0, l);
    be->op_destroy(op);
    struct tensor all[] = {tx, tw, tbias, ty, tdy, tdx, tdw, tdb};
    tensors_free(all, 8);
    double *ds[] = {ry, my, rdx, mdx, rdw, mdw, rdb, mdb};
    for (int i = 0; i < 8; i++) free(ds[i]);
  }
  be->destroy(b);
}
END_TEST

/* Softmax cross-entropy with label smoothing, mean over the batch, in PyTorch's
 * terms: loss = mean_i[(1 - s) * -log p_i[y_i] + s * mean_j(-log p_ij)], and
 * its gradient by central differences of that double reference (step 1e-4) as
 * well as in closed form.  Large logits (around 80) check the max subtraction.
 * 1e-6 relative plus 1e-7 absolute. */
static double loss_ref(int n, int k, const double *z, const int32_t *labels, double s) {
  double total = 0;
  for (int i = 0; i < n; i++) {
    double mx = -INFINITY, sum = 0, nll_all = 0;
    for (int j = 0; j < k; j++) mx = fmax(mx, z[i * k + j]);
    for (int j = 0; j < k; j++) sum += exp(z[i * k + j] - mx);
    double lse = mx + log(sum);
    for (int j = 0; j < k; j++) nll_all += lse - z[i * k + j];
    total += (1 - s) * (lse - z[i * k + labels[i]]) + s * nll_all / k;
  }
  return total / n;
}

START_TEST(test_loss) {
  static const struct { int n, k; float s, scale; } cases[] = {
      {4, 10, 0.f, 3}, {4, 10, 0.1f, 3}, {1, 1000, 0.1f, 5}, {7, 3, 0.5f, 1}, {3, 5, 0.1f, 80}, {2, 2, 1.f, 2}};
  struct gw_backend *b = backend();
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int n = cases[ci].n, k = cases[ci].k;
    struct gw_op_desc d = {.kind = GW_OP_LOSS, .n = n, .k = k, .label_smoothing = cases[ci].s};
    struct tensor z = tensor_new(b, (size_t)n * k), tg = tensor_new(b, (size_t)n * k);
    const float *g = tg.h;
    float loss = NAN; /* host memory, as backend.h says */
    double *zd = malloc((size_t)n * k * 8), *rg = malloc((size_t)n * k * 8);
    int32_t labels[8], *dlabels = be->alloc(b, sizeof labels);
    ck_assert(zd && rg && dlabels);
    fill(z.h, (size_t)n * k, 81 + ci);
    for (int i = 0; i < n * k; i++) z.h[i] *= cases[ci].scale, zd[i] = z.h[i];
    for (int i = 0; i < n; i++) labels[i] = (int32_t)((i * 7 + 3) % k);
    up(z), nan_up(tg);
    to_backend(b, dlabels, labels, (size_t)n * sizeof labels[0]);
    struct gw_op *op = NULL;
    ck_assert_msg(be->op_create(b, &d, &op) == GW_SUCCESS, "%s", gw_model_last_error());
    ck_assert_msg(be->loss_fwd_bwd(op, z.d, dlabels, 1, &loss, tg.d) == GW_SUCCESS, "%s", gw_model_last_error());
    down(tg);
    /* With a loss scale (a power of two): every gradient exactly that many
     * times larger, the loss the same. */
    struct tensor ts = tensor_new(b, (size_t)n * k);
    float loss_scaled = NAN;
    nan_up(ts);
    ck_assert_msg(be->loss_fwd_bwd(op, z.d, dlabels, 65536, &loss_scaled, ts.d) == GW_SUCCESS, "%s",
                  gw_model_last_error());
    down(ts);
    ck_assert_msg(loss_scaled == loss, "case %zu: the loss %.9g moved with the scale (%.9g)", ci, (double)loss_scaled,
                  (double)loss);
    for (int i = 0; i < n * k; i++)
      ck_assert_msg(ts.h[i] == 65536.0f * g[i], "case %zu: scaled dlogits[%d] = %.9g, want 65536 x %.9g", ci, i,
                    (double)ts.h[i], (double)g[i]);
    tensor_free(ts);
    double s = cases[ci].s, want = loss_ref(n, k, zd, labels, s);
    ck_assert_msg(fabs(loss - want) <= 1e-6 * fabs(want) + 1e-7, "case %zu loss %.9g, want %.9g", ci, (double)loss,
                  want);
    for (int i = 0; i < n; i++) {
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j < k; j++) mx = fmax(mx, zd[i * k + j]);
      for (int j = 0; j < k; j++) sum += exp(zd[i * k + j] - mx);
      for (int j = 0; j < k; j++)
        rg[i * k + j] = (exp(zd[i * k + j] - mx) / sum - (1 - s) * (j == labels[i]) - s / k) / n;
    }
    char l[64];
    snprintf(l, sizeof l, "loss case %zu dlogits", ci);
    compare(g, rg, NULL, (size_t)n * k, 1e-6, 1e-7, l);
    for (int i = 0; i < n * k; i += (k > 20 ? 97 : 1)) { /* finite differences of the reference */
      double keep = zd[i], h = 1e-4, lp, lm;
      zd[i] = keep + h, lp = loss_ref(n, k, zd, labels, s);
      zd[i] = keep - h, lm = loss_ref(n, k, zd, labels, s);
      zd[i] = keep;
      double fd = (lp - lm) / (2 * h);
      ck_assert_msg(fabs(fd - g[i]) <= 1e-5 * fabs(fd) + 1e-6, "%s [%d] = %.9g, finite difference %.9g", l, i,
                    (double)g[i], fd);
    }
    be->op_destroy(op);
    tensor_free(z), tensor_free(tg), be->dealloc(b, dlabels);
    free(zd), free(rg);
  }
  /* A label out of range is refused (the labels are in the backend's memory too). */
  struct gw_op_desc d = {.kind = GW_OP_LOSS, .n = 2, .k = 3};
  struct gw_op *op = NULL;
  ck_assert(be->op_create(b, &d, &op) == GW_SUCCESS);
  const float zeros[6] = {0};
  struct tensor z = tensor_of(b, zeros, 6), g = tensor_new(b, 6);
  float loss;
  const int32_t bad[2] = {1, 3};
  int32_t *dbad = be->alloc(b, sizeof bad);
  ck_assert(dbad);
  to_backend(b, dbad, bad, sizeof bad);
  ck_assert_int_eq(be->loss_fwd_bwd(op, z.d, dbad, 1, &loss, g.d), GW_ERR_INVALID_ARGUMENT);
  ck_assert(strstr(gw_model_last_error(), "label 3 of sample 1 is not in [0, 3)"));
  const int32_t bad2[2] = {-1, 7}; /* the first bad sample is named */
  to_backend(b, dbad, bad2, sizeof bad2);
  ck_assert_int_eq(be->loss_fwd_bwd(op, z.d, dbad, 1, &loss, g.d), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_model_last_error(), "label -1 of sample 0 is not in [0, 3)"), "%s", gw_model_last_error());
  const int32_t good[2] = {1, 2};
  to_backend(b, dbad, good, sizeof good);
  loss = NAN; /* and the op works after a refusal: the loss of zero logits is log 3 */
  ck_assert_int_eq(be->loss_fwd_bwd(op, z.d, dbad, 1, &loss, g.d), GW_SUCCESS);
  ck_assert_msg(fabs((double)loss - log(3.0)) < 1e-6, "loss %.9g after a refused call, want log 3", (double)loss);
  ck_assert_int_eq(be->loss_fwd_bwd(op, z.d, dbad, 0, &loss, g.d), GW_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(be->loss_fwd_bwd(op, z.d, dbad, INFINITY, &loss, g.d), GW_ERR_INVALID_ARGUMENT);
  ck_assert(strstr(gw_model_last_error(), "gradient scale"));
  /* A logit of -inf without smoothing: PyTorch's loss is finite (its
   * smoothing term, infinite, is not taken at 0); 0 x inf made it NaN.  Row 0:
   * {0, -inf, 0} label 0, row 1: {-inf, 0, 0} label 2: each log 2. */
  const float minf[6] = {0, -INFINITY, 0, -INFINITY, 0, 0};
  const int32_t lab[2] = {0, 2};
  to_backend(b, dbad, lab, sizeof lab);
  struct tensor zi = tensor_of(b, minf, 6);
  loss = NAN;
  ck_assert_int_eq(be->loss_fwd_bwd(op, zi.d, dbad, 1, &loss, g.d), GW_SUCCESS);
  down(g);
  ck_assert_msg(fabs((double)loss - log(2.0)) < 1e-6, "loss %.9g with a -inf logit, want log 2", (double)loss);
  ck_assert_msg(g.h[1] == 0 && g.h[3] == 0 && fabs(g.h[0] + 0.25) < 1e-7 && fabs(g.h[5] + 0.25) < 1e-7,
                "dlogits with a -inf logit: %g %g %g %g %g %g", g.h[0], g.h[1], g.h[2], g.h[3], g.h[4], g.h[5]);
  tensor_free(zi);
  be->op_destroy(op);
  tensor_free(z), tensor_free(g), be->dealloc(b, dbad);
  be->destroy(b);
}
END_TEST

/* Batch norm training by central differences through the backend's own forward
 * (float, step 1e-2) on a tiny case: L = sum(y * g) against bn_bwd(dy = g) for dx,
 * dgamma and dbeta.  Float rounding of L over 2e-2 and the O(h^2) truncation stay
 * well inside 2e-3 * (1 + |fd|). */
START_TEST(test_bn_finite_difference) {
  struct gw_backend *b = backend();
  struct gw_op_desc d = same_desc(GW_LAYER_BN, 2, 2, 3, 3);
  d.eps = 1e-5, d.momentum = 0.1;
  enum { N = 36, C = 2 };
  struct tensor x = act_in(b, &d), g = act_in(b, &d), y = act_in(b, &d), dx = act_in(b, &d);
  struct tensor gamma = tensor_new(b, C), beta = tensor_new(b, C), mean = tensor_new(b, C), rstd = tensor_new(b, C);
  struct tensor rm = tensor_new(b, C), rv = tensor_new(b, C), dgamma = tensor_new(b, C), dbeta = tensor_new(b, C);
  fill(x.h, N, 91), fill(g.h, N, 92), fill(gamma.h, C, 93), fill(beta.h, C, 94);
  for (int i = 0; i < C; i++) rm.h[i] = 0, rv.h[i] = 1;
  up(x), up(g), up(gamma), up(beta), up(rm), up(rv), nan_up(dx), nan_up(dgamma), nan_up(dbeta);
  struct gw_op *op = NULL;
  ck_assert(be->op_create(b, &d, &op) == GW_SUCCESS);
  ck_assert(be->bn_fwd_train(op, x.d, gamma.d, beta.d, y.d, mean.d, rstd.d, rm.d, rv.d) == GW_SUCCESS);
  ck_assert(be->bn_bwd(op, x.d, g.d, gamma.d, mean.d, rstd.d, dx.d, dgamma.d, dbeta.d) == GW_SUCCESS);
  down(dx), down(dgamma), down(dbeta);
  struct tensor tensors[] = {x, gamma, beta}, grads[] = {dx, dgamma, dbeta};
  for (int t = 0; t < 3; t++)
    for (size_t i = 0; i < tensors[t].n; i++) {
      float keep = tensors[t].h[i];
      double l[2];
      for (int sgn = 0; sgn < 2; sgn++) {
        tensors[t].h[i] = keep + (sgn ? 1e-2f : -1e-2f);
        up(tensors[t]), nan_up(y);
        ck_assert(be->bn_fwd_train(op, x.d, gamma.d, beta.d, y.d, mean.d, rstd.d, rm.d, rv.d) == GW_SUCCESS);
        down(y);
        l[sgn] = 0;
        for (int j = 0; j < N; j++) l[sgn] += (double)y.h[j] * g.h[j];
      }
      double h = ((double)(keep + 1e-2f) - (double)(keep - 1e-2f)) / 2;
      tensors[t].h[i] = keep;
      up(tensors[t]);
      double fd = (l[1] - l[0]) / (2 * h);
      ck_assert_msg(fabs(fd - grads[t].h[i]) <= 2e-3 * (1 + fabs(fd)), "bn tensor %d [%zu]: backend %.7g, fd %.7g", t,
                    i, (double)grads[t].h[i], fd);
    }
  be->op_destroy(op);
  struct tensor all[] = {x, g, y, dx, gamma, beta, mean, rstd, rm, rv, dgamma, dbeta};
  tensors_free(all, 12);
  be->destroy(b);
}
END_TEST

void add_layer_tests(TCase *tc) {
  tcase_add_test(tc, test_relu);
  tcase_add_test(tc, test_add);
  tcase_add_test(tc, test_bn);
  tcase_add_test(tc, test_bn_running_stats_exact);
  tcase_add_test(tc, test_bn_fused);
  tcase_add_test(tc, test_maxpool);
  tcase_add_test(tc, test_avgpool);
  tcase_add_test(tc, test_fc);
  tcase_add_test(tc, test_loss);
  tcase_add_test(tc, test_bn_finite_difference);
}
