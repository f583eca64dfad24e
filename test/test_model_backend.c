/* test_model_backend.c - the cpu backend (model/backend_cpu.c, oneDNN) against
 * naive references written here in double precision: convolution forward over a
 * grid of shapes (strides, paddings, 1x1 / 3x3 / 7x7 kernels, non-square inputs)
 * and over every convolution of two small ResNets, plus the messages for shapes it
 * refuses.  Exits 77 (skipped) when the build has no oneDNN.
 *
 * Tolerance: |y - ref| <= 1e-5 * sum_i |x_i * w_i| for each output, i.e. relative
 * to the magnitude of the terms summed; a float sum of n terms in any order is
 * within about n * 2^-24 of that (worst case), and in practice sqrt(n) * 2^-24, so
 * 1e-5 is loose enough for every reduction order oneDNN picks and tight enough to
 * catch any wrong index (which moves a result by a whole term).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw_config.h"
#include "harness.h"

#if GW_HAVE_ONEDNN

#include "backend.h"
#include "resnet.h"

static const struct gw_backend_ops *be = &gw_backend_cpu;

static struct gw_backend *backend(void) {
  struct gw_backend_config cfg = {.threads = 1};
  struct gw_backend *b = NULL;
  gw_result_t r = be->create(&cfg, &b);
  ck_assert_msg(r == GW_SUCCESS, "%s", gw_model_last_error());
  return b;
}

static void fill(float *x, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) x[i] = (float)((double)(mix64(seed * 7919 + i) >> 11) * 0x1p-52 - 1.0);
}

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
static void check_conv(struct gw_backend *b, const struct gw_op_desc *d, const float *given_w, const char *label) {
  size_t nx = (size_t)d->n * d->c * d->h * d->w, nw = (size_t)d->k * d->c * d->kernel * d->kernel;
  size_t ny = (size_t)d->n * d->k * d->p * d->q;
  float *x = be->alloc(b, nx * sizeof(float)), *w = be->alloc(b, nw * sizeof(float));
  float *y = be->alloc(b, ny * sizeof(float)), *y2 = be->alloc(b, ny * sizeof(float));
  double *ref = malloc(ny * sizeof(double)), *mag = malloc(ny * sizeof(double));
  ck_assert(x && w && y && y2 && ref && mag);
  struct gw_op *op = NULL;
  gw_result_t r = be->op_create(b, d, &op);
  ck_assert_msg(r == GW_SUCCESS, "%s: %s", label, gw_model_last_error());
  for (int round = 0; round < 2; round++) {
    float *out = round ? y2 : y;
    fill(x, nx, 1000 + (uint64_t)round);
    if (given_w) memcpy(w, given_w, nw * sizeof(float));
    else fill(w, nw, 2000 + (uint64_t)round);
    for (size_t i = 0; i < ny; i++) out[i] = NAN; /* every output must be written */
    r = be->conv_fwd(op, x, w, out);
    ck_assert_msg(r == GW_SUCCESS, "%s: %s", label, gw_model_last_error());
    conv_ref(d, x, w, ref, mag);
    size_t bad = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < ny; i++) {
      double err = fabs((double)out[i] - ref[i]), tol = 1e-5 * mag[i];
      if (!(err <= tol)) {
        if (!bad) first = i;
        bad++;
      }
      if (mag[i] > 0 && err / mag[i] > worst) worst = err / mag[i];
    }
    ck_assert_msg(bad == 0, "%s (round %d): %zu of %zu outputs off, first [%zu] = %.9g, want %.9g (terms %.3g)", label,
                  round, bad, ny, first, (double)out[first], ref[first], mag[first]);
    ck_assert_msg(worst < 1e-5, "%s: worst relative error %g", label, worst);
  }
  be->op_destroy(op);
  be->dealloc(b, x);
  be->dealloc(b, w);
  be->dealloc(b, y);
  be->dealloc(b, y2);
  free(ref);
  free(mag);
}

static struct gw_op_desc conv_desc(int n, int c, int h, int w, int k, int kernel, int stride, int pad) {
  struct gw_op_desc d = {.kind = GW_LAYER_CONV, .n = n, .c = c, .h = h, .w = w, .k = k,
                         .kernel = kernel, .stride = stride, .pad = pad};
  d.p = (h + 2 * pad - kernel) / stride + 1;
  d.q = (w + 2 * pad - kernel) / stride + 1;
  return d;
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

static void expect_refused(struct gw_backend *b, struct gw_op_desc d, gw_result_t code, const char *substring) {
  struct gw_op *op = (struct gw_op *)b; /* must come back NULL */
  ck_assert_int_eq(be->op_create(b, &d, &op), code);
  ck_assert_ptr_null(op);
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
  d.kind = GW_LAYER_BN;
  expect_refused(b, d, GW_ERR_UNSUPPORTED, "only convolutions are implemented so far");
  be->destroy(b);
  be->destroy(NULL);
  be->op_destroy(NULL);
  struct gw_backend_config cfg = {.threads = -1};
  ck_assert_int_eq(be->create(&cfg, &b), GW_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(b);
  ck_assert_str_eq(be->name, "cpu");
}
END_TEST

int main(void) {
  Suite *s = suite_create("model-backend");
  TCase *tc = tcase_create("cpu");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_conv_fwd_grid);
  tcase_add_test(tc, test_conv_fwd_model_layers);
  tcase_add_test(tc, test_refused);
  suite_add_tcase(s, tc);
  return run_suite(s);
}

#else

int main(void) {
  printf("model-backend: built without oneDNN, skipped\n");
  return 77;
}

#endif
