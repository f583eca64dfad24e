/* test_model_backend.c - a backend of backend.h (the cpu one: oneDNN,
 * model/backend_cpu*.c; the cudnn one: model/backend_cudnn.c) against naive
 * references written here in double precision, the same checks for either:
 * convolution forward and both backwards over a grid of shapes (strides,
 * paddings, 1x1 / 3x3 / 5x5 / 7x7 kernels, odd and non-square inputs), forward
 * over every convolution of two small ResNets, and finite differences through the
 * backend's own forward; ReLU and add (exact); batch norm training / inference /
 * backward, the running-statistics update to the bit as PyTorch computes it, and
 * finite differences; max pool and global average pool forward and backward;
 * fully connected; softmax cross-entropy with label smoothing (closed form and
 * finite differences); every layer of three small ResNets planning; the messages
 * for what it refuses.
 *
 * The file holds the convolutions, the plans, the refusals and main();
 * test_model_backend_layers.c every other layer; model_backend_util.[ch] what
 * they share.
 *
 * Which backend: argv[1], "cpu" (the default) or "cudnn".  Exits 77 (skipped)
 * when this build has no such backend (no oneDNN, no cuDNN) or when its create()
 * says GW_ERR_UNSUPPORTED (cudnn on a machine without a usable GPU).
 *
 * Every tensor is kept on the host (filled and compared there) and crosses to the
 * backend's memory only through be->upload before a call and be->download after
 * (struct tensor below), since a backend's memory may be the device's.  Outputs
 * are prefilled with NaN on the host and uploaded, so an element the backend does
 * not write fails.  Each test states its tolerance, the same for every backend
 * (cuDNN in strict fp32 meets them); the convolutions' is:
 *
 * Tolerance: |y - ref| <= 1e-5 * sum_i |x_i * w_i| for each output, i.e. relative
 * to the magnitude of the terms summed; a float sum of n terms in any order is
 * within about n * 2^-24 of that (worst case), and in practice sqrt(n) * 2^-24, so
 * 1e-5 is loose enough for every reduction order a library picks and tight enough
 * to catch any wrong index (which moves a result by a whole term).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw_config.h"
#include "harness.h"

#include "backend.h"
#include "model_backend_util.h"
#if GW_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend_cpu_kernels.h"
#endif
#include "resnet.h"

#ifdef _OPENMP
#include <omp.h>
#include <pthread.h>
#endif

/* The direct convolution, in double: y [n, k, p, q] and the magnitude of the terms
 * summed into each output. */
static void conv_ref(const struct gw_op_desc *d, const float *x, const float *w, double *y, double *mag) {
  for (int n = 0; n < d->n; n++)
    for (int k = 0; k < d->k; k++)
      for (int p = 0; p < d->p; p++)
        for (int q = 0; q < d->q; q++) {
          double s = 0, a = 0;
          for (int c = 0; c < d->c; c++)
            for (int r = 0; r < d->kernel; r++) {
              int ih = p * d->stride - d->pad + r;
              if (ih < 0 || ih >= d->h) continue;
              for (int t = 0; t < d->kernel; t++) {
                int iw = q * d->stride - d->pad + t;
                if (iw < 0 || iw >= d->w) continue;
                double v = (double)x[(((size_t)n * d->c + c) * d->h + ih) * d->w + iw] *
                           (double)w[(((size_t)k * d->c + c) * d->kernel + r) * d->kernel + t];
                s += v;
                a += fabs(v);
              }
            }
          size_t o = (((size_t)n * d->k + k) * d->p + p) * d->q + q;
          y[o] = s;
          mag[o] = a;
        }
}

/* Runs one convolution through the backend (twice, with different buffers, so
 * stale data handles would show) and compares it with the reference.  `w` may be
 * given (model weights) or NULL (random). */
#if GW_HAVE_ONEDNN
int gw__cpu_conv_is_inner_product(const struct gw_op *op); /* backend_cpu_prims.c */
int gw__cpu_conv_is_subsampled(const struct gw_op *op);    /* backend_cpu_prims.c */
int gw__cpu_op_unblocks(const struct gw_op *op);           /* backend_cpu.c */
bool gw__cpu_plan_unblock(struct gw_cpu_unblock *t, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *chosen);
#endif

/* On cpu, a convolution of one output position is planned as an inner
 * product (unless GW_CPU_CONV_IP=0), and a strided 1x1 one whose input's
 * height the stride divides as an unstrided one on a subsampled view (unless
 * GW_CPU_CONV_SUBSAMPLE=0; oneDNN refuses the view of an odd height at
 * stride 2): the grids' shapes
 * of those kinds test them, not the direct convolution they fall back to. */
static void expect_planned(const struct gw_op_desc *d, const struct gw_op *op, const char *label) {
#if GW_HAVE_ONEDNN
  if (be != &gw_backend_cpu) return;
  const char *env = getenv("GW_CPU_CONV_IP");
  const int ip = d->p == 1 && d->q == 1 && !(env && !strcmp(env, "0"));
  if (ip)
    ck_assert_msg(gw__cpu_conv_is_inner_product(op), "%s: one output position, not planned as an inner product",
                  label);
  env = getenv("GW_CPU_CONV_SUBSAMPLE");
  if (!ip && d->kernel == 1 && d->pad == 0 && d->stride > 1 && d->h % d->stride == 0 && !(env && !strcmp(env, "0")))
    ck_assert_msg(gw__cpu_conv_is_subsampled(op), "%s: a strided 1x1, not planned on a subsampled view", label);
#else
  (void)d, (void)op, (void)label;
#endif
}

static void check_conv(struct gw_backend *b, const struct gw_op_desc *d, const float *given_w, const char *label) {
  size_t nx = (size_t)d->n * d->c * d->h * d->w, nw = (size_t)d->k * d->c * d->kernel * d->kernel;
  size_t ny = (size_t)d->n * d->k * d->p * d->q;
  struct tensor x = act_in(b, d), w = tensor_new(b, nw), y = act_out(b, d), y2 = act_out(b, d);
  double *ref = malloc(ny * sizeof(double)), *mag = malloc(ny * sizeof(double));
  ck_assert(ref && mag);
  struct gw_op *op = NULL;
  gw_result_t r = be->op_create(b, d, &op);
  ck_assert_msg(r == GW_SUCCESS, "%s: %s", label, gw_model_last_error());
  expect_planned(d, op, label);
  for (int round = 0; round < 2; round++) {
    struct tensor o = round ? y2 : y;
    fill(x.h, nx, 1000 + (uint64_t)round);
    if (given_w) memcpy(w.h, given_w, nw * sizeof(float));
    else fill(w.h, nw, 2000 + (uint64_t)round);
    up(x), up(w), nan_up(o); /* every output must be written */
    r = be->conv_fwd(op, x.d, w.d, o.d);
    ck_assert_msg(r == GW_SUCCESS, "%s: %s", label, gw_model_last_error());
    down(o);
    conv_ref(d, x.h, w.h, ref, mag);
    size_t bad = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < ny; i++) {
      double err = fabs((double)o.h[i] - ref[i]), tol = 1e-5 * mag[i];
      if (!(err <= tol)) {
        if (!bad) first = i;
        bad++;
      }
      if (mag[i] > 0 && err / mag[i] > worst) worst = err / mag[i];
    }
    ck_assert_msg(bad == 0, "%s (round %d): %zu of %zu outputs off, first [%zu] = %.9g, want %.9g (terms %.3g)", label,
                  round, bad, ny, first, (double)o.h[first], ref[first], mag[first]);
    ck_assert_msg(worst < 1e-5, "%s: worst relative error %g", label, worst);
  }
  be->op_destroy(op);
  struct tensor all[] = {x, w, y, y2};
  tensors_free(all, 4);
  free(ref);
  free(mag);
}



START_TEST(test_conv_fwd_grid) {
  static const int shapes[][8] = {
      /* n, c, h, w, k, kernel, stride, pad */
      {2, 3, 11, 11, 5, 3, 1, 1},   /* odd sizes, 3 input channels */
      {2, 4, 9, 9, 8, 3, 2, 1},     /* stride 2, odd input */
      {1, 3, 33, 33, 16, 7, 2, 3},  /* imagenet stem on a small image */
      {3, 16, 8, 8, 32, 1, 2, 0},   /* projection shortcut */
      {2, 16, 7, 7, 16, 1, 1, 0},   /* bottleneck 1x1 */
      {2, 32, 14, 14, 64, 3, 1, 1}, /* larger 3x3 */
      {2, 5, 10, 7, 6, 3, 2, 1},    /* non-square input */
      {1, 8, 6, 6, 8, 3, 1, 0},     /* no padding */
      {2, 1, 28, 28, 8, 3, 1, 1},   /* one input channel (Fashion-MNIST) */
      {1, 24, 5, 5, 40, 5, 3, 2},   /* kernel 5, stride 3 */
      {2, 8, 1, 1, 16, 3, 2, 1},    /* stride 2 on 1x1 (images under 17 px): 1x1 */
      {2, 8, 1, 1, 16, 1, 2, 0},    /* projection shortcut on 1x1 */
      {2, 3, 1, 1, 8, 7, 2, 3},     /* imagenet stem on a 1x1 image */
      /* one output position (the cpu backend's inner product: a rectangle of
       * input against one of taps, the rest of dx and dw zero) */
      {2, 8, 2, 2, 16, 3, 2, 1},    /* 2x2 -> 1x1, stride 2 (28x28's layer4.0.conv2) */
      {2, 8, 2, 2, 16, 1, 2, 0},    /* its shortcut: input (0, 0) alone */
      {2, 6, 4, 4, 8, 3, 4, 1},     /* rows and columns 0-1 of 4 */
      {1, 4, 3, 3, 8, 3, 1, 0},     /* the whole window, no padding */
      {2, 5, 3, 2, 7, 3, 3, 1},     /* non-square: 2x2 of 3x2 */
      /* strided 1x1s (the cpu backend's subsampled view where the stride
       * divides the input: the shortcut above, and here stride 3) */
      {2, 16, 7, 7, 32, 1, 2, 0},   /* odd input: the strided form */
      {1, 8, 9, 6, 16, 1, 3, 0},    /* stride 3, non-square */
      {2, 4, 8, 7, 8, 1, 2, 0},     /* odd width alone */
  };
  struct gw_backend *b = backend();
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int *s = shapes[i];
    struct gw_op_desc d = conv_desc(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
    char label[96];
    snprintf(label, sizeof label, "n%d c%d %dx%d k%d kernel%d stride%d pad%d", s[0], s[1], s[2], s[3], s[4], s[5],
             s[6], s[7]);
    check_conv(b, &d, NULL, label);
  }
  be->destroy(b);
}
END_TEST

/* An op made and run before a larger one runs still gives the same bits
 * after it: the cpu backend's reordered copies live in one arena, grown to
 * the largest step and re-pointed at each run (a stale pointer into the old
 * one is a use after free under ASan). */
START_TEST(test_op_after_a_larger_one) {
  struct gw_backend *b = backend();
  const struct gw_op_desc ds = conv_desc(2, 16, 7, 7, 16, 3, 1, 1), dl = conv_desc(2, 32, 28, 28, 64, 3, 1, 1);
  struct gw_op *small = NULL, *large = NULL;
  ck_assert_msg(be->op_create(b, &ds, &small) == GW_SUCCESS, "%s", gw_model_last_error());
  struct tensor x = act_in(b, &ds), w = tensor_new(b, (size_t)16 * 16 * 9), y1 = act_out(b, &ds),
                y2 = act_out(b, &ds);
  fill(x.h, x.n, 5), fill(w.h, w.n, 6);
  up(x), up(w), nan_up(y1), nan_up(y2);
  ck_assert(be->conv_fwd(small, x.d, w.d, y1.d) == GW_SUCCESS);
  ck_assert_msg(be->op_create(b, &dl, &large) == GW_SUCCESS, "%s", gw_model_last_error());
  struct tensor lx = act_in(b, &dl), lw = tensor_new(b, (size_t)64 * 32 * 9), ly = act_out(b, &dl);
  fill(lx.h, lx.n, 7), fill(lw.h, lw.n, 8);
  up(lx), up(lw), nan_up(ly);
  ck_assert_msg(be->conv_fwd(large, lx.d, lw.d, ly.d) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_msg(be->conv_fwd(small, x.d, w.d, y2.d) == GW_SUCCESS, "%s", gw_model_last_error());
  down(y1), down(y2);
  ck_assert_msg(!memcmp(y1.h, y2.h, y1.n * sizeof(float)), "the small convolution's output changed after a larger "
                "one ran");
  be->op_destroy(small), be->op_destroy(large);
  struct tensor all[] = {x, w, y1, y2, lx, lw, ly};
  tensors_free(all, 7);
  be->destroy(b);
}
END_TEST

/* Every convolution of two small ResNets, with their initialized weights and the
 * geometry the model description gives. */
START_TEST(test_conv_fwd_model_layers) {
  struct gw_backend *b = backend();
  static const struct { int depth, image, div; enum gw_stem stem; } models[] = {
      {50, 32, 8, GW_STEM_SMALL}, {18, 64, 8, GW_STEM_IMAGENET}};
  for (int mi = 0; mi < 2; mi++) {
    struct gw_model_config cfg;
    gw_model_config_default(&cfg);
    cfg.depth = models[mi].depth, cfg.image_size = models[mi].image, cfg.width_divisor = models[mi].div;
    cfg.stem = models[mi].stem, cfg.classes = 10, cfg.seed = 3;
    struct gw_model *m = NULL;
    ck_assert_msg(gw_model_init(&m, &cfg) == GW_SUCCESS, "%s", gw_model_last_error());
    int convs = 0;
    for (int i = 0; i < gw_model_num_layers(m); i++) {
      const struct gw_layer *l = gw_model_layer(m, i);
      if (l->kind != GW_LAYER_CONV) continue;
      struct gw_op_desc d;
      gw_model_op_desc(m, i, 2, &d);
      char label[96];
      snprintf(label, sizeof label, "resnet%d %s", cfg.depth, l->name);
      check_conv(b, &d, gw_model_tensor_data(m, gw_model_param_tensor(m, l->weight)), label);
      convs++;
    }
    ck_assert_int_eq(convs, cfg.depth == 50 ? 53 : 20);
    gw_model_free(m);
  }
  be->destroy(b);
}
END_TEST


/* The gradients of the convolution, in double: dx [n, c, h, w] from dy and w, dw
 * [k, c, kernel, kernel] from x and dy, each with the magnitude of its terms. */
static void conv_bwd_ref(const struct gw_op_desc *d, const float *x, const float *w, const float *dy, double *dx,
                         double *dxmag, double *dw, double *dwmag) {
  size_t nx = (size_t)d->n * d->c * d->h * d->w, nw = (size_t)d->k * d->c * d->kernel * d->kernel;
  memset(dx, 0, nx * sizeof *dx), memset(dxmag, 0, nx * sizeof *dxmag);
  memset(dw, 0, nw * sizeof *dw), memset(dwmag, 0, nw * sizeof *dwmag);
  for (int n = 0; n < d->n; n++)
    for (int k = 0; k < d->k; k++)
      for (int p = 0; p < d->p; p++)
        for (int q = 0; q < d->q; q++) {
          double g = dy[(((size_t)n * d->k + k) * d->p + p) * d->q + q];
          for (int c = 0; c < d->c; c++)
            for (int r = 0; r < d->kernel; r++) {
              int ih = p * d->stride - d->pad + r;
              if (ih < 0 || ih >= d->h) continue;
              for (int t = 0; t < d->kernel; t++) {
                int iw = q * d->stride - d->pad + t;
                if (iw < 0 || iw >= d->w) continue;
                size_t xi = (((size_t)n * d->c + c) * d->h + ih) * d->w + iw;
                size_t wi = (((size_t)k * d->c + c) * d->kernel + r) * d->kernel + t;
                dx[xi] += g * w[wi], dxmag[xi] += fabs(g * w[wi]);
                dw[wi] += g * x[xi], dwmag[wi] += fabs(g * x[xi]);
              }
            }
        }
}

/* conv_bwd_data and conv_bwd_weights against conv_bwd_ref, twice with new
 * buffers, after a forward on the same op (so the steps share nothing stale). */
static void check_conv_bwd(struct gw_backend *b, const struct gw_op_desc *d, const char *label, int *unblocked) {
  size_t nx = (size_t)d->n * d->c * d->h * d->w, nw = (size_t)d->k * d->c * d->kernel * d->kernel;
  size_t ny = (size_t)d->n * d->k * d->p * d->q;
  struct tensor x = act_in(b, d), w = tensor_new(b, nw), y = act_out(b, d), dy = act_out(b, d);
  struct tensor dx = act_in(b, d), dw = tensor_new(b, nw);
  double *rdx = malloc(nx * 8), *mdx = malloc(nx * 8), *rdw = malloc(nw * 8), *mdw = malloc(nw * 8);
  ck_assert(rdx && mdx && rdw && mdw);
  struct gw_op *op = NULL;
  ck_assert_msg(be->op_create(b, d, &op) == GW_SUCCESS, "%s: %s", label, gw_model_last_error());
  expect_planned(d, op, label);
#if GW_HAVE_ONEDNN
  if (be == &gw_backend_cpu) *unblocked += gw__cpu_op_unblocks(op);
#else
  (void)unblocked;
#endif
  for (int round = 0; round < 2; round++) {
    fill(x.h, nx, 3000 + (uint64_t)round), fill(w.h, nw, 4000 + (uint64_t)round);
    fill(dy.h, ny, 5000 + (uint64_t)round);
    up(x), up(w), up(dy);
    ck_assert_msg(be->conv_fwd(op, x.d, w.d, y.d) == GW_SUCCESS, "%s: %s", label, gw_model_last_error());
    nan_up(dx), nan_up(dw);
    ck_assert_msg(be->conv_bwd_data(op, dy.d, w.d, dx.d) == GW_SUCCESS, "%s: %s", label, gw_model_last_error());
    ck_assert_msg(be->conv_bwd_weights(op, x.d, dy.d, dw.d) == GW_SUCCESS, "%s: %s", label, gw_model_last_error());
    down(dx), down(dw);
    conv_bwd_ref(d, x.h, w.h, dy.h, rdx, mdx, rdw, mdw);
    char l2[160];
    snprintf(l2, sizeof l2, "%s round %d dx", label, round);
    compare(dx.h, rdx, mdx, nx, 1e-5, 0, l2);
    snprintf(l2, sizeof l2, "%s round %d dw", label, round);
    compare(dw.h, rdw, mdw, nw, 1e-5, 0, l2);
  }
  be->op_destroy(op);
  struct tensor all[] = {x, w, y, dy, dx, dw};
  tensors_free(all, 6);
  free(rdx), free(mdx), free(rdw), free(mdw);
}

START_TEST(test_conv_bwd_grid) {
  static const int shapes[][8] = {
      /* n, c, h, w, k, kernel, stride, pad */
      {2, 3, 11, 11, 5, 3, 1, 1},  {2, 4, 9, 9, 8, 3, 2, 1},   {1, 3, 33, 33, 16, 7, 2, 3},
      {3, 16, 8, 8, 32, 1, 2, 0},  {2, 16, 7, 7, 16, 1, 1, 0}, {2, 32, 14, 14, 64, 3, 1, 1},
      {2, 5, 10, 7, 6, 3, 2, 1},   {1, 8, 6, 6, 8, 3, 1, 0},   {2, 1, 28, 28, 8, 3, 1, 1},
      {1, 24, 5, 5, 40, 5, 3, 2},  {2, 8, 1, 1, 16, 3, 2, 1},  {2, 8, 1, 1, 16, 1, 2, 0},
      {2, 3, 1, 1, 8, 7, 2, 3},    {2, 8, 2, 2, 16, 3, 2, 1},  {2, 8, 2, 2, 16, 1, 2, 0},
      {2, 6, 4, 4, 8, 3, 4, 1},    {1, 4, 3, 3, 8, 3, 1, 0},   {2, 5, 3, 2, 7, 3, 3, 1},
      {2, 64, 4, 4, 128, 1, 1, 0}, /* 1x1 with 64 / 128 channels (oneDNN's 16b64a weight-gradient blocks) */
      {2, 16, 7, 7, 32, 1, 2, 0},  {1, 8, 9, 6, 16, 1, 3, 0},  {2, 4, 8, 7, 8, 1, 2, 0}, /* strided 1x1s */
  };
  struct gw_backend *b = backend();
  int unblocked = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int *s = shapes[i];
    struct gw_op_desc d = conv_desc(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
    char label[96];
    snprintf(label, sizeof label, "bwd n%d c%d %dx%d k%d kernel%d stride%d pad%d", s[0], s[1], s[2], s[3], s[4],
             s[5], s[6], s[7]);
    check_conv_bwd(b, &d, label, &unblocked);
  }
#if GW_HAVE_ONEDNN
  /* the cpu backend's own reorder of the weight gradients out of oneDNN's
   * blocked layouts (gw__cpu_unblock) is what some of these shapes test */
  /* (oneDNN's weights layouts have two inner blocks with AVX2 and AVX-512;
   * capped below AVX2, ONEDNN_MAX_CPU_ISA, they may have other blockings) */
  const char *env = getenv("GW_CPU_UNBLOCK");
  if (be == &gw_backend_cpu && !(env && !strcmp(env, "0")) &&
      (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2)
    ck_assert_msg(unblocked > 0, "no shape's weight gradient came out of a blocked layout by gw__cpu_unblock");
#endif
  be->destroy(b);
}
END_TEST

/* Finite differences through the backend's own forward on a tiny convolution: with
 * L = sum(y * g), dL/dw = conv_bwd_weights(x, g) and dL/dx = conv_bwd_data(g, w).
 * L is linear in each, so a central difference with a large step (0.25) is exact
 * but for float rounding of y (about 1e-7 of |y|, over 2 * 0.25). */
START_TEST(test_conv_bwd_finite_difference) {
  struct gw_backend *b = backend();
  struct gw_op_desc d = conv_desc(2, 2, 5, 5, 3, 3, 2, 1);
  size_t nx = 2 * 2 * 5 * 5, nw = 3 * 2 * 3 * 3, ny = (size_t)2 * 3 * d.p * d.q;
  struct tensor x = act_in(b, &d), w = tensor_new(b, nw), y = act_out(b, &d), g = act_out(b, &d);
  struct tensor dx = act_in(b, &d), dw = tensor_new(b, nw);
  fill(x.h, nx, 11), fill(w.h, nw, 12), fill(g.h, ny, 13);
  up(x), up(w), up(g), nan_up(dx), nan_up(dw);
  struct gw_op *op = NULL;
  ck_assert_msg(be->op_create(b, &d, &op) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert(be->conv_bwd_data(op, g.d, w.d, dx.d) == GW_SUCCESS);
  ck_assert(be->conv_bwd_weights(op, x.d, g.d, dw.d) == GW_SUCCESS);
  down(dx), down(dw);
  const double h = 0.25;
  for (int which = 0; which < 2; which++) {
    struct tensor t = which ? w : x, grad = which ? dw : dx;
    for (size_t i = 0; i < t.n; i += 3) {
      double l[2];
      float keep = t.h[i];
      for (int sgn = 0; sgn < 2; sgn++) {
        t.h[i] = (float)(keep + (sgn ? h : -h));
        up(t), nan_up(y);
        ck_assert(be->conv_fwd(op, x.d, w.d, y.d) == GW_SUCCESS);
        down(y);
        l[sgn] = 0;
        for (size_t j = 0; j < ny; j++) l[sgn] += (double)y.h[j] * g.h[j];
      }
      t.h[i] = keep;
      up(t);
      double fd = (l[1] - l[0]) / (2 * h);
      ck_assert_msg(fabs(fd - grad.h[i]) <= 1e-4 * (1 + fabs(fd)), "%s[%zu]: backend %.7g, finite difference %.7g",
                    which ? "dw" : "dx", i, (double)grad.h[i], fd);
    }
  }
  be->op_destroy(op);
  struct tensor all[] = {x, w, y, g, dx, dw};
  tensors_free(all, 6);
  be->destroy(b);
}
END_TEST

#if GW_HAVE_ONEDNN
/* gw__cpu_unblock, the cpu backend's way out of oneDNN's blocked weight
 * layouts, against oneDNN's own reorder on the same bytes: bit for bit, into
 * a dense OIHW copy and into a strided view (the inner products' weights: a
 * rectangle of taps from an offset), each destination prefilled so a write
 * outside it, or an element missed, shows.  Blocked layouts it does not take
 * (one or three inner blocks, padded dims) are declined, not mangled. */
static void unblock_case(dnnl_engine_t eng, dnnl_stream_t st, int nd, const dnnl_dims_t dims, dnnl_format_tag_t tag,
                         dnnl_data_type_t dt, const dnnl_dims_t view_strides, int64_t offset0, size_t dst_elems,
                         int want_plan) {
  char label[96];
  snprintf(label, sizeof label, "%dD %lldx%lld tag %d dtype %d%s offset %lld", nd, (long long)dims[0],
           (long long)dims[1], (int)tag, (int)dt, view_strides ? " into a view" : "", (long long)offset0);
  dnnl_memory_desc_t blocked, plain;
  ck_assert(dnnl_memory_desc_init_by_tag(&blocked, nd, dims, dt, tag) == dnnl_success);
  if (view_strides) ck_assert(dnnl_memory_desc_init_by_strides(&plain, nd, dims, dt, view_strides) == dnnl_success);
  else ck_assert(dnnl_memory_desc_init_by_tag(&plain, nd, dims, dt, nd == 2 ? dnnl_ab : dnnl_abcd) == dnnl_success);
  plain.offset0 = offset0;
  struct gw_cpu_unblock t;
  const bool planned = gw__cpu_plan_unblock(&t, &plain, &blocked);
  ck_assert_msg(planned == (want_plan != 0), "%s: planned %d, expected %d", label, planned, want_plan);
  if (!planned) return;
  const size_t esize = dt == dnnl_f32 ? 4 : 2, src_bytes = dnnl_memory_desc_get_size(&blocked);
  const size_t dst_bytes = dst_elems * esize;
  unsigned char *src = malloc(src_bytes), *mine = malloc(dst_bytes), *theirs = malloc(dst_bytes);
  ck_assert(src && mine && theirs);
  uint64_t r = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < src_bytes; i += esize) { /* finite values: 0x3f.. / 0x40.. exponents */
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    const uint32_t v = 0x3f000000u | (uint32_t)(r & 0x00ffffffu);
    memcpy(src + i, esize == 4 ? (const void *)&v : (const void *)((const char *)&v + 2), esize);
  }
  memset(mine, 0xa5, dst_bytes), memset(theirs, 0xa5, dst_bytes);
  gw__cpu_unblock(&t, src, mine);
  dnnl_memory_t from, to;
  dnnl_primitive_desc_t rpd;
  dnnl_primitive_t reorder;
  ck_assert(dnnl_memory_create(&from, &blocked, eng, src) == dnnl_success);
  ck_assert(dnnl_memory_create(&to, &plain, eng, theirs) == dnnl_success);
  ck_assert(dnnl_reorder_primitive_desc_create(&rpd, &blocked, eng, &plain, eng, NULL) == dnnl_success);
  ck_assert(dnnl_primitive_create(&reorder, rpd) == dnnl_success);
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
  ck_assert(dnnl_primitive_execute(reorder, st, 2, args) == dnnl_success);
  ck_assert(dnnl_stream_wait(st) == dnnl_success);
  size_t first = dst_bytes;
  for (size_t i = 0; i < dst_bytes && first == dst_bytes; i++)
    if (mine[i] != theirs[i]) first = i;
  ck_assert_msg(first == dst_bytes, "%s: byte %zu of %zu differs from oneDNN's reorder (%02x vs %02x)", label, first,
                dst_bytes, first < dst_bytes ? mine[first] : 0, first < dst_bytes ? theirs[first] : 0);
  dnnl_primitive_destroy(reorder), dnnl_primitive_desc_destroy(rpd);
  dnnl_memory_destroy(from), dnnl_memory_destroy(to);
  free(src), free(mine), free(theirs);
}

START_TEST(test_cpu_unblock) {
  dnnl_engine_t eng;
  dnnl_stream_t st;
  ck_assert(dnnl_engine_create(&eng, dnnl_cpu, 0) == dnnl_success);
  ck_assert(dnnl_stream_create(&st, eng, dnnl_stream_default_flags) == dnnl_success);
  const dnnl_data_type_t dts[] = {dnnl_f32, dnnl_bf16};
  for (int k = 0; k < 2; k++) {
    const dnnl_data_type_t dt = dts[k];
    unblock_case(eng, st, 4, (dnnl_dims_t){64, 32, 3, 3}, dnnl_ABcd16b16a, dt, NULL, 0, 64 * 32 * 9, 1);
    unblock_case(eng, st, 4, (dnnl_dims_t){128, 64, 1, 1}, dnnl_ABcd16b64a, dt, NULL, 0, 128 * 64, 1);
    unblock_case(eng, st, 4, (dnnl_dims_t){32, 48, 3, 3}, dnnl_BAcd16a16b, dt, NULL, 0, 32 * 48 * 9, 1);
    unblock_case(eng, st, 4, (dnnl_dims_t){48, 32, 5, 2}, dnnl_ABcd16a16b, dt, NULL, 0, 48 * 32 * 10, 1);
    unblock_case(eng, st, 2, (dnnl_dims_t){128, 32}, dnnl_AB16b64a, dt, NULL, 0, 128 * 32, 1);
    /* taps of a 32 x 16 x 3 x 3 kernel as the inner products plan them: (0..1, 0..1)
     * (no padding), and (1..2, 1..2) from offset pad * K + pad = 4 (padding 1) */
    for (int64_t off = 0; off <= 4; off += 4)
      unblock_case(eng, st, 4, (dnnl_dims_t){32, 16, 2, 2}, dnnl_ABcd16b16a, dt, (dnnl_dims_t){16 * 9, 9, 3, 1}, off,
                   32 * 16 * 9, 1);
    /* declined: one inner block, three, padding (10 output channels in blocks of 16) */
    unblock_case(eng, st, 4, (dnnl_dims_t){32, 32, 3, 3}, dnnl_aBcd16b, dt, NULL, 0, 0, 0);
    unblock_case(eng, st, 4, (dnnl_dims_t){32, 32, 3, 3}, dnnl_ABcd4b16a4b, dt, NULL, 0, 0, 0);
    unblock_case(eng, st, 4, (dnnl_dims_t){10, 32, 3, 3}, dnnl_ABcd16b16a, dt, NULL, 0, 0, 0);
  }
  dnnl_stream_destroy(st);
  dnnl_engine_destroy(eng);
}
END_TEST
#endif

/* Every layer of three small ResNets plans on this backend from the description
 * the model gives (gw_model_op_desc), and the loss over its logits. */
START_TEST(test_model_layers_plan) {
  struct gw_backend *b = backend();
  static const struct { int depth, image, div; enum gw_stem stem; } models[] = {
      {50, 32, 8, GW_STEM_SMALL}, {18, 64, 8, GW_STEM_IMAGENET}, {34, 28, 16, GW_STEM_SMALL}};
  for (int mi = 0; mi < 3; mi++) {
    struct gw_model_config cfg;
    gw_model_config_default(&cfg);
    cfg.depth = models[mi].depth, cfg.image_size = models[mi].image, cfg.width_divisor = models[mi].div;
    cfg.stem = models[mi].stem, cfg.classes = 10, cfg.seed = 3;
    if (mi == 2) cfg.in_channels = 1;
    struct gw_model *m = NULL;
    ck_assert_msg(gw_model_init(&m, &cfg) == GW_SUCCESS, "%s", gw_model_last_error());
    int kinds[7] = {0};
    for (int i = 0; i < gw_model_num_layers(m); i++) {
      struct gw_op_desc d;
      gw_model_op_desc(m, i, 2, &d);
      struct gw_op *op = NULL;
      ck_assert_msg(be->op_create(b, &d, &op) == GW_SUCCESS, "resnet%d %s: %s", cfg.depth, gw_model_layer(m, i)->name,
                    gw_model_last_error());
      be->op_destroy(op);
      kinds[d.kind]++;
    }
    for (int k = 0; k < 7; k++)
      ck_assert_msg(kinds[k] > 0 || (k == GW_LAYER_MAXPOOL && cfg.stem == GW_STEM_SMALL),
                    "resnet%d: no layer of kind %d", cfg.depth, k);
    struct gw_op_desc ld = {.kind = GW_OP_LOSS, .n = 2, .k = cfg.classes, .label_smoothing = 0.1f};
    struct gw_op *op = NULL;
    ck_assert(be->op_create(b, &ld, &op) == GW_SUCCESS);
    be->op_destroy(op);
    gw_model_free(m);
  }
  be->destroy(b);
}
END_TEST

/* What op_create refuses, with a message that names the backend and says why
 * (every backend checks a description with model/backend_check.c, one wording). */
static void expect_refused(struct gw_backend *b, struct gw_op_desc d, gw_result_t code, const char *substring) {
  struct gw_op *op = (struct gw_op *)b; /* must come back NULL */
  ck_assert_int_eq(be->op_create(b, &d, &op), code);
  ck_assert_ptr_null(op);
  char prefix[64];
  snprintf(prefix, sizeof prefix, "%s backend: ", be->name);
  ck_assert_msg(strncmp(gw_model_last_error(), prefix, strlen(prefix)) == 0, "message \"%s\" does not start \"%s\"",
                gw_model_last_error(), prefix);
  ck_assert_msg(strstr(gw_model_last_error(), substring), "message \"%s\" does not say \"%s\"", gw_model_last_error(),
                substring);
}

START_TEST(test_refused) {
  struct gw_backend *b = backend();
  struct gw_op_desc d = conv_desc(1, 3, 2, 2, 4, 7, 1, 1);
  expect_refused(b, d, GW_ERR_INVALID_ARGUMENT, "the 7x7 kernel is larger than the padded input");
  d = conv_desc(1, 3, 8, 8, 4, 3, 1, 1);
  d.p = 7;
  expect_refused(b, d, GW_ERR_INVALID_ARGUMENT, "output 7x8 given, the geometry makes 8x8");
  d = conv_desc(0, 3, 8, 8, 4, 3, 1, 1);
  expect_refused(b, d, GW_ERR_INVALID_ARGUMENT, "every size must be positive");
  d.kind = 99;
  expect_refused(b, d, GW_ERR_UNSUPPORTED, "unknown op kind");
  d = conv_desc(1, 3, 8, 8, 4, 3, 2, 1);
  d.kind = GW_LAYER_MAXPOOL;
  expect_refused(b, d, GW_ERR_INVALID_ARGUMENT, "pooling keeps the channels");
  /* PyTorch refuses a max pool padded by more than half its window (windows
   * of padding alone); a pad near INT_MAX overflowed int in the geometry */
  d = conv_desc(1, 3, 4, 4, 3, 2, 1, 2);
  d.kind = GW_LAYER_MAXPOOL;
  expect_refused(b, d, GW_ERR_INVALID_ARGUMENT, "max pooling's padding 2 is more than half its 2x2 window");
  d = conv_desc(1, 3, 8, 8, 4, 3, 1, 1);
  d.pad = 1 << 30;
  expect_refused(b, d, GW_ERR_INVALID_ARGUMENT, "output 8x8 given, the geometry makes 2147483654x2147483654");
  struct gw_op_desc bn = {.kind = GW_LAYER_BN, .n = 2, .c = 3, .h = 4, .w = 4, .k = 3, .p = 4, .q = 4, .eps = 0};
  expect_refused(b, bn, GW_ERR_INVALID_ARGUMENT, "eps 0 must be > 0");
  struct gw_op_desc lo = {.kind = GW_OP_LOSS, .n = 2, .k = 3, .label_smoothing = 1.5f};
  expect_refused(b, lo, GW_ERR_INVALID_ARGUMENT, "label smoothing 1.5 must be in [0, 1]");
  be->destroy(b);
  be->destroy(NULL);
  be->op_destroy(NULL);
  struct gw_backend_config cfg = strict_config();
  cfg.threads = -1;
  ck_assert_int_eq(be->create(&cfg, &b), GW_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(b);
  cfg = strict_config();
  cfg.layout = 2;
  ck_assert_int_eq(be->create(&cfg, &b), GW_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(b);
  ck_assert_msg(strstr(gw_model_last_error(), "layout 2"), "%s", gw_model_last_error());
  if (!strcmp(chosen, "cudnn")) { /* "1G" was taken as 1 MiB: engines with no workspace only, silently */
    setenv("GW_CUDNN_WORKSPACE_MB", "1G", 1);
    cfg = strict_config();
    ck_assert_int_eq(be->create(&cfg, &b), GW_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(gw_model_last_error(), "GW_CUDNN_WORKSPACE_MB=1G"), "%s", gw_model_last_error());
    unsetenv("GW_CUDNN_WORKSPACE_MB");
  }
  cfg = strict_config();
  ck_assert_int_eq(be->create(&cfg, &b), GW_SUCCESS);
  ck_assert_int_eq(be->layout(b), layout);
  be->destroy(b);
  b = NULL;
  ck_assert_str_eq(be->name, chosen);
  ck_assert_int_eq(be->host_memory, strcmp(chosen, "cpu") == 0); /* cpu: host memory; cudnn: the device's */
}
END_TEST

#if GW_HAVE_ONEDNN && defined(_OPENMP)
/* The cpu backend's thread count (backend.h threads) is the one its calls run
 * with, on whichever thread makes them: OpenMP's count is a per-thread setting,
 * and a backend used to set it once, at create, on the creating thread, where
 * it stayed.  Seen as the count OpenMP gives the calling thread after a call
 * (what the call's parallel regions ran with; the thread's count is set to a
 * stray value before each call), for a ReLU (a oneDNN primitive) and a global
 * average pool (a loop of backend_cpu_kernels.c); threads 0 is the count this
 * process started with, also after a backend of another count ran here.
 * Needs Check's fork mode (the default): the default is read at the process's
 * first cpu backend. */
struct threads_probe {
  struct gw_backend *b;
  struct gw_op *op[2]; /* ReLU, global average pool */
  struct tensor x, y[2];
  int stray, seen[2];
};

static void *run_then_count(void *arg) {
  struct threads_probe *p = arg;
  for (int k = 0; k < 2; k++) {
    omp_set_num_threads(p->stray);
    const gw_result_t r =
        k == 0 ? be->relu_fwd(p->op[0], p->x.d, p->y[0].d) : be->avgpool_fwd(p->op[1], p->x.d, p->y[1].d);
    p->seen[k] = r == GW_SUCCESS ? omp_get_max_threads() : -1;
  }
  return NULL;
}

static void expect_counts(struct threads_probe *p, int other_thread, int want, const char *what) {
  pthread_t t;
  if (other_thread) {
    ck_assert_int_eq(pthread_create(&t, NULL, run_then_count, p), 0);
    pthread_join(t, NULL);
  } else {
    run_then_count(p);
  }
  ck_assert_msg(p->seen[0] == want && p->seen[1] == want, "%s, on %s thread: %d threads in a ReLU, %d in an average "
                "pool, want %d", what, other_thread ? "another" : "the creating", p->seen[0], p->seen[1], want);
}

static void probe_up(struct threads_probe *p, int threads, int stray) {
  struct gw_backend_config cfg = strict_config();
  cfg.threads = threads;
  ck_assert_msg(be->create(&cfg, &p->b) == GW_SUCCESS, "%s", gw_model_last_error());
  struct gw_op_desc d[2] = {same_desc(GW_LAYER_RELU, 2, 3, 4, 4), same_desc(GW_LAYER_AVGPOOL, 2, 3, 4, 4)};
  d[1].p = d[1].q = 1;
  p->x = act_in(p->b, &d[0]);
  fill(p->x.h, p->x.n, 5);
  up(p->x);
  for (int k = 0; k < 2; k++) {
    ck_assert_msg(be->op_create(p->b, &d[k], &p->op[k]) == GW_SUCCESS, "%s", gw_model_last_error());
    p->y[k] = act_out(p->b, &d[k]);
  }
  p->stray = stray;
}

static void probe_down(struct threads_probe *p) {
  tensor_free(p->x), tensor_free(p->y[0]), tensor_free(p->y[1]);
  be->op_destroy(p->op[0]), be->op_destroy(p->op[1]);
  be->destroy(p->b);
}

START_TEST(test_cpu_threads_per_call) {
  const int start = omp_get_max_threads(), more = start + 1;
  struct threads_probe p;
  probe_up(&p, more, start + 3);
  expect_counts(&p, 0, more, "threads start + 1");
  expect_counts(&p, 1, more, "threads start + 1");
  probe_down(&p);
  omp_set_num_threads(more); /* what the old backend left on this thread */
  probe_up(&p, 0, more);
  expect_counts(&p, 0, start, "threads 0 after a backend of start + 1");
  expect_counts(&p, 1, start, "threads 0");
  probe_down(&p);
}
END_TEST
#endif

/* The backend named `name` if this build has it, else NULL with *why set. */
static const struct gw_backend_ops *built_backend(const char *name, const char **why) {
  if (strcmp(name, "cpu") == 0) {
#if GW_HAVE_ONEDNN
    return &gw_backend_cpu;
#else
    *why = "this build has no oneDNN (GW_HAVE_ONEDNN is 0)";
    return NULL;
#endif
  }
  if (strcmp(name, "cudnn") == 0) {
#if GW_HAVE_CUDNN
    const struct gw_backend_ops *ops = gw_backend_cudnn_ops();
    if (!ops) { /* built, so a module that does not load is a failure, not a skip */
      printf("model-backend cudnn: %s\n", gw_model_last_error());
      exit(1);
    }
    return ops;
#else
    *why = "this build has no cuDNN (GW_HAVE_CUDNN is 0)";
    return NULL;
#endif
  }
  *why = "unknown backend";
  return NULL;
}

/* Makes one backend, in a child process (run_in_child says why).  Returns 0
 * when create() succeeded, 77 when it said GW_ERR_UNSUPPORTED (no usable
 * device), 1 on any other failure; prints why. */
static int probe_child(void *arg) {
  const char *name = arg;
  struct gw_backend_config cfg = strict_config();
  struct gw_backend *b = NULL;
  gw_result_t r = be->create(&cfg, &b);
  if (r == GW_ERR_UNSUPPORTED) printf("model-backend %s: skipped: %s\n", name, gw_model_last_error());
  else if (r != GW_SUCCESS) printf("model-backend %s: create failed (%d): %s\n", name, (int)r, gw_model_last_error());
  be->destroy(b);
  return r == GW_SUCCESS ? 0 : r == GW_ERR_UNSUPPORTED ? 77 : 1;
}

static int probe_backend(const char *name) { return run_in_child(probe_child, (void *)name); }

int main(int argc, char **argv) {
  chosen = argc > 1 ? argv[1] : "cpu";
  const char *why = "";
  if (argc > 3 || (strcmp(chosen, "cpu") != 0 && strcmp(chosen, "cudnn") != 0) ||
      (argc == 3 && strcmp(argv[2], "nchw") != 0 && strcmp(argv[2], "nhwc") != 0)) {
    fprintf(stderr, "usage: %s [cpu|cudnn [nchw|nhwc]]  (the backend to test, cpu by default, and the activations' "
                    "layout, nchw by default)\n", argv[0]);
    return 2;
  }
  if (argc == 3 && strcmp(argv[2], "nhwc") == 0) layout = GW_LAYOUT_NHWC;
  if (!(be = built_backend(chosen, &why))) {
    printf("model-backend %s: %s, skipped\n", chosen, why);
    return 77;
  }
  int probe = probe_backend(chosen);
  if (probe != 0) return probe;
  Suite *s = suite_create("model-backend");
  TCase *tc = tcase_create(chosen);
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_conv_fwd_grid);
  tcase_add_test(tc, test_op_after_a_larger_one);
  tcase_add_test(tc, test_conv_fwd_model_layers);
  tcase_add_test(tc, test_refused);
  tcase_add_test(tc, test_conv_bwd_grid);
  tcase_add_test(tc, test_conv_bwd_finite_difference);
  add_layer_tests(tc);
  tcase_add_test(tc, test_model_layers_plan);
  add_train_tests(tc);
  if (layout == GW_LAYOUT_NCHW) add_layout_tests(tc); /* it makes both layouts itself */
#if GW_HAVE_ONEDNN
  if (strcmp(chosen, "cpu") == 0 && layout == GW_LAYOUT_NCHW) tcase_add_test(tc, test_cpu_unblock);
#endif
  suite_add_tcase(s, tc);
#if GW_HAVE_ONEDNN && defined(_OPENMP)
  if (strcmp(chosen, "cpu") == 0) { /* a case of its own: CK_RUN_CASE=cpu-threads */
    TCase *threads = tcase_create("cpu-threads");
    tcase_add_test(threads, test_cpu_threads_per_call);
    suite_add_tcase(s, threads);
  }
#endif
  return run_suite(s);
}
