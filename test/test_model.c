/* test_model.c - the ResNet description (model/resnet.h): torchvision's parameter
 * counts for every depth, tensor names, shapes and order, the reverse-forward
 * offsets, activation shapes, configs counted by hand, rejected configs and their
 * messages, and the initialization's statistics and determinism.  No layer runs
 * here (see test_model_backend.c). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "resnet.h"

static struct gw_model *make(int depth, int classes, int in_channels, int image, enum gw_stem stem, int div,
                             uint64_t seed) {
  struct gw_model_config cfg;
  gw_model_config_default(&cfg);
  cfg.depth = depth, cfg.classes = classes, cfg.in_channels = in_channels, cfg.image_size = image;
  cfg.stem = stem, cfg.width_divisor = div, cfg.seed = seed;
  struct gw_model *m = NULL;
  gw_result_t r = gw_model_init(&m, &cfg);
  ck_assert_msg(r == GW_SUCCESS, "resnet%d: %s", depth, gw_model_last_error());
  return m;
}

static const struct gw_tensor *must_find(const struct gw_model *m, const char *name) {
  const struct gw_tensor *t = gw_model_find(m, name);
  ck_assert_msg(t != NULL, "no tensor named %s", name);
  return t;
}

static void assert_shape(const struct gw_tensor *t, int ndim, int64_t a, int64_t b, int64_t c, int64_t d) {
  int64_t want[4] = {a, b, c, d};
  ck_assert_msg(t->ndim == ndim, "%s: ndim %d, want %d", t->name, t->ndim, ndim);
  for (int i = 0; i < ndim; i++)
    ck_assert_msg(t->shape[i] == want[i], "%s: dim %d is %lld, want %lld", t->name, i, (long long)t->shape[i],
                  (long long)want[i]);
}

/* torchvision: sum(p.numel() for p in resnetNN().parameters()) and len(list(...)). */
START_TEST(test_torchvision_counts) {
  static const struct { int depth; size_t params; int tensors, buffers; } want[] = {
      {18, 11689512, 62, 60},    {34, 21797672, 110, 108},  {50, 25557032, 161, 159},
      {101, 44549160, 314, 312}, {152, 60192808, 467, 465},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    struct gw_model *m = make(want[i].depth, 1000, 3, 224, GW_STEM_IMAGENET, 1, 0);
    ck_assert_msg(gw_model_num_params(m) == want[i].params, "resnet%d: %zu parameters, torchvision has %zu",
                  want[i].depth, gw_model_num_params(m), want[i].params);
    ck_assert_int_eq(gw_model_num_param_tensors(m), want[i].tensors);
    ck_assert_int_eq(gw_model_num_buffer_tensors(m), want[i].buffers);
    gw_model_free(m);
  }
}
END_TEST

START_TEST(test_resnet50_names_and_order) {
  struct gw_model *m = make(50, 1000, 3, 224, GW_STEM_IMAGENET, 1, 0);
  int n = gw_model_num_param_tensors(m);
  size_t total = gw_model_num_params(m);
  /* named_parameters() order, first and last tensors. */
  static const char *const head[] = {"conv1.weight",           "bn1.weight",
                                     "bn1.bias",               "layer1.0.conv1.weight",
                                     "layer1.0.bn1.weight",    "layer1.0.bn1.bias",
                                     "layer1.0.conv2.weight",  "layer1.0.bn2.weight",
                                     "layer1.0.bn2.bias",      "layer1.0.conv3.weight",
                                     "layer1.0.bn3.weight",    "layer1.0.bn3.bias",
                                     "layer1.0.downsample.0.weight", "layer1.0.downsample.1.weight",
                                     "layer1.0.downsample.1.bias",   "layer1.1.conv1.weight"};
  for (int i = 0; i < (int)(sizeof head / sizeof head[0]); i++)
    ck_assert_str_eq(gw_model_param_tensor(m, i)->name, head[i]);
  static const char *const tail[] = {"layer4.2.conv3.weight", "layer4.2.bn3.weight", "layer4.2.bn3.bias",
                                     "fc.weight", "fc.bias"};
  for (int i = 0; i < 5; i++) ck_assert_str_eq(gw_model_param_tensor(m, n - 5 + i)->name, tail[i]);
  ck_assert_ptr_null(gw_model_param_tensor(m, n));

  /* Shapes in PyTorch's layouts. */
  assert_shape(must_find(m, "conv1.weight"), 4, 64, 3, 7, 7);
  assert_shape(must_find(m, "bn1.weight"), 1, 64, 0, 0, 0);
  assert_shape(must_find(m, "layer1.0.conv1.weight"), 4, 64, 64, 1, 1);
  assert_shape(must_find(m, "layer1.0.conv3.weight"), 4, 256, 64, 1, 1);
  assert_shape(must_find(m, "layer1.0.downsample.0.weight"), 4, 256, 64, 1, 1);
  assert_shape(must_find(m, "layer2.0.conv1.weight"), 4, 128, 256, 1, 1);
  assert_shape(must_find(m, "layer2.0.conv2.weight"), 4, 128, 128, 3, 3);
  assert_shape(must_find(m, "layer3.5.bn3.bias"), 1, 1024, 0, 0, 0);
  assert_shape(must_find(m, "layer4.0.downsample.0.weight"), 4, 2048, 1024, 1, 1);
  assert_shape(must_find(m, "fc.weight"), 2, 1000, 2048, 0, 0);
  assert_shape(must_find(m, "fc.bias"), 1, 1000, 0, 0, 0);
  /* Only the first block of each stage has a projection. */
  ck_assert_ptr_null(gw_model_find(m, "layer1.1.downsample.0.weight"));
  ck_assert_ptr_null(gw_model_find(m, "layer5.0.conv1.weight"));
  ck_assert_ptr_null(gw_model_find(m, "fc"));

  /* Reverse forward order: fc.bias at 0, fc.weight after it, conv1.weight last. */
  ck_assert_uint_eq(must_find(m, "fc.bias")->offset, 0);
  ck_assert_uint_eq(must_find(m, "fc.weight")->offset, 1000);
  ck_assert_uint_eq(must_find(m, "layer4.2.bn3.bias")->offset, 1000 + 2048000);
  ck_assert_uint_eq(must_find(m, "conv1.weight")->offset, total - 64 * 3 * 7 * 7);
  for (int i = 0; i < n; i++) {
    const struct gw_tensor *t = gw_model_param_tensor(m, i);
    size_t end = i == 0 ? total : gw_model_param_tensor(m, i - 1)->offset;
    ck_assert_msg(t->offset + t->numel == end, "%s: [%zu, %zu) does not end where %s starts", t->name,
                  t->offset, t->offset + t->numel, i ? gw_model_param_tensor(m, i - 1)->name : "the buffer end");
    ck_assert_int_eq(t->kind, GW_TENSOR_PARAM);
    ck_assert_int_eq(t->dtype, GW_FLOAT32);
    ck_assert_ptr_eq(gw_model_tensor_data(m, t), gw_model_params(m) + t->offset);
    ck_assert_ptr_eq(gw_model_find(m, t->name), t);
  }
  ck_assert_uint_eq(gw_model_param_tensor(m, n - 1)->offset, 0);
  gw_model_free(m);
}
END_TEST

START_TEST(test_buffers) {
  struct gw_model *m = make(50, 1000, 3, 224, GW_STEM_IMAGENET, 1, 0);
  int n = gw_model_num_buffer_tensors(m);
  ck_assert_str_eq(gw_model_buffer_tensor(m, 0)->name, "bn1.running_mean");
  ck_assert_str_eq(gw_model_buffer_tensor(m, 1)->name, "bn1.running_var");
  ck_assert_str_eq(gw_model_buffer_tensor(m, 2)->name, "bn1.num_batches_tracked");
  ck_assert_str_eq(gw_model_buffer_tensor(m, 3)->name, "layer1.0.bn1.running_mean");
  ck_assert_str_eq(gw_model_buffer_tensor(m, n - 1)->name, "layer4.2.bn3.num_batches_tracked");
  const struct gw_tensor *rv = must_find(m, "layer1.0.downsample.1.running_var");
  ck_assert_int_eq(rv->kind, GW_TENSOR_RUNNING);
  assert_shape(rv, 1, 256, 0, 0, 0);
  const struct gw_tensor *nb = must_find(m, "layer3.5.bn3.num_batches_tracked");
  ck_assert_int_eq(nb->kind, GW_TENSOR_COUNTER);
  ck_assert_int_eq(nb->dtype, GW_INT64);
  ck_assert_int_eq(nb->ndim, 0);
  ck_assert_uint_eq(nb->numel, 1);
  /* Buffers are not parameters: the parameter count above excludes them. */
  size_t running = 0, counters = 0;
  for (int i = 0; i < n; i++) {
    const struct gw_tensor *t = gw_model_buffer_tensor(m, i);
    if (t->kind == GW_TENSOR_RUNNING) {
      ck_assert_uint_eq(t->offset, running);
      ck_assert_ptr_eq(gw_model_tensor_data(m, t), gw_model_running(m) + t->offset);
      running += t->numel;
    } else {
      ck_assert_uint_eq(t->offset, counters);
      ck_assert_ptr_eq(gw_model_tensor_data(m, t), gw_model_counters(m) + t->offset);
      counters += t->numel;
    }
  }
  ck_assert_uint_eq(counters, 53); /* resnet50 has 53 batch norms */
  ck_assert_uint_eq(running, 2 * 26560); /* 2 x the BN channels: (sum of BN params) / 2 */
  gw_model_free(m);
}
END_TEST

static const struct gw_layer *layer_named(const struct gw_model *m, const char *name) {
  for (int i = 0; i < gw_model_num_layers(m); i++)
    if (strcmp(gw_model_layer(m, i)->name, name) == 0) return gw_model_layer(m, i);
  ck_abort_msg("no layer named %s", name);
  return NULL;
}

static void assert_act(const struct gw_model *m, int a, int c, int h, int w) {
  const struct gw_act *x = gw_model_act(m, a);
  ck_assert_msg(x->c == c && x->h == h && x->w == w, "activation %d is %dx%dx%d, want %dx%dx%d", a, x->c, x->h,
                x->w, c, h, w);
}

START_TEST(test_layers_and_shapes) {
  struct gw_model *m = make(50, 1000, 3, 224, GW_STEM_IMAGENET, 1, 0);
  assert_act(m, 0, 3, 224, 224);
  assert_act(m, layer_named(m, "conv1")->out, 64, 112, 112);
  assert_act(m, layer_named(m, "maxpool")->out, 64, 56, 56);
  /* v1.5: the stride sits on the 3x3 conv and on the projection. */
  const struct gw_layer *c1 = layer_named(m, "layer2.0.conv1"), *c2 = layer_named(m, "layer2.0.conv2");
  ck_assert_int_eq(c1->stride, 1);
  ck_assert_int_eq(c2->stride, 2);
  ck_assert_int_eq(c2->pad, 1);
  ck_assert_int_eq(layer_named(m, "layer2.0.downsample.0")->stride, 2);
  assert_act(m, c2->out, 128, 28, 28);
  const struct gw_layer *add = layer_named(m, "layer1.0.add");
  ck_assert_int_eq(add->kind, GW_LAYER_ADD);
  ck_assert_int_eq(add->in, layer_named(m, "layer1.0.bn3")->out);
  ck_assert_int_eq(add->in2, layer_named(m, "layer1.0.downsample.1")->out);
  /* Identity shortcut: the block's input. */
  ck_assert_int_eq(layer_named(m, "layer1.1.add")->in2, layer_named(m, "layer1.0.relu3")->out);
  assert_act(m, layer_named(m, "layer4.2.relu3")->out, 2048, 7, 7);
  assert_act(m, layer_named(m, "avgpool")->out, 2048, 1, 1);
  const struct gw_layer *last = gw_model_layer(m, gw_model_num_layers(m) - 1);
  ck_assert_str_eq(last->name, "fc");
  ck_assert_int_eq(last->out, gw_model_num_acts(m) - 1);
  assert_act(m, last->out, 1000, 1, 1);
  ck_assert_str_eq(gw_model_param_tensor(m, last->weight)->name, "fc.weight");
  ck_assert_str_eq(gw_model_buffer_tensor(m, layer_named(m, "bn1")->running_var)->name, "bn1.running_var");
  /* Every layer reads activations made before it (forward order). */
  for (int i = 0; i < gw_model_num_layers(m); i++) {
    const struct gw_layer *l = gw_model_layer(m, i);
    ck_assert_int_lt(l->in, l->out);
    ck_assert_int_lt(l->in2, l->out);
  }
  gw_model_free(m);

  /* Small stem: 3x3/1 conv, no max pool, 32 -> 32 -> 16 -> 8 -> 4. */
  m = make(18, 10, 3, 32, GW_STEM_SMALL, 8, 0);
  const struct gw_layer *stem = layer_named(m, "conv1");
  ck_assert_int_eq(stem->kernel, 3);
  ck_assert_int_eq(stem->stride, 1);
  assert_act(m, stem->out, 8, 32, 32);
  for (int i = 0; i < gw_model_num_layers(m); i++) ck_assert_int_ne(gw_model_layer(m, i)->kind, GW_LAYER_MAXPOOL);
  assert_act(m, layer_named(m, "layer4.1.relu2")->out, 64, 4, 4);
  ck_assert_ptr_null(gw_model_find(m, "layer1.0.downsample.0.weight")); /* basic block, same width */
  gw_model_free(m);
}
END_TEST

/* Counted by hand, see the breakdown. */
START_TEST(test_hand_counted_configs) {
  /* resnet18, small stem, widths 8/16/32/64, 10 classes, 3 channels:
   *   conv1 3x3 3->8: 216, bn1: 16
   *   layer1 2 x (576 + 16 + 576 + 16)                                   =   2368
   *   layer2 (1152+32+2304+32 + downsample 128+32) + (2304+32+2304+32)  =   8352
   *   layer3 (4608+64+9216+64 + 512+64) + (9216+64+9216+64)             =  33088
   *   layer4 (18432+128+36864+128 + 2048+128) + (36864+128+36864+128)   = 131712
   *   fc 64*10 + 10                                                     =    650
   *   total 216 + 16 + 2368 + 8352 + 33088 + 131712 + 650               = 176402 */
  struct gw_model *m = make(18, 10, 3, 32, GW_STEM_SMALL, 8, 0);
  ck_assert_uint_eq(gw_model_num_params(m), 176402);
  gw_model_free(m);
  /* resnet50 with 1 input channel and 10 classes: conv1 loses 64*2*49 = 6272,
   * fc 2048*990 + 990 = 2028510: 25557032 - 6272 - 2028510. */
  m = make(50, 10, 1, 28, GW_STEM_IMAGENET, 1, 0);
  ck_assert_uint_eq(gw_model_num_params(m), 23522250);
  gw_model_free(m);
  /* resnet50 small stem: conv1 3x3 instead of 7x7: 64*3*(49-9) = 7680 fewer. */
  m = make(50, 1000, 3, 32, GW_STEM_SMALL, 1, 0);
  ck_assert_uint_eq(gw_model_num_params(m), 25557032 - 7680);
  gw_model_free(m);
  /* The verification config of issue 6 (resnet50/8, 32x32, 10 classes), counted
   * with an independent formula: 375762. */
  m = make(50, 10, 3, 32, GW_STEM_SMALL, 8, 0);
  ck_assert_uint_eq(gw_model_num_params(m), 375762);
  assert_shape(must_find(m, "layer4.2.conv3.weight"), 4, 256, 64, 1, 1);
  assert_shape(must_find(m, "fc.weight"), 2, 10, 256, 0, 0);
  gw_model_free(m);
}
END_TEST

static void expect_rejected(struct gw_model_config cfg, const char *substring) {
  struct gw_model *m = (struct gw_model *)&cfg; /* must come back NULL */
  gw_result_t r = gw_model_init(&m, &cfg);
  ck_assert_int_eq(r, GW_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(gw_model_last_error(), substring) != NULL, "message \"%s\" does not say \"%s\"",
                gw_model_last_error(), substring);
}

START_TEST(test_bad_configs) {
  struct gw_model_config base, c;
  gw_model_config_default(&base);
  c = base, c.depth = 42;
  expect_rejected(c, "unknown ResNet depth 42: use 18, 34, 50, 101 or 152");
  c = base, c.classes = 0;
  expect_rejected(c, "classes must be at least 1 (got 0)");
  c = base, c.in_channels = -3;
  expect_rejected(c, "in_channels must be at least 1 (got -3)");
  c = base, c.width_divisor = 3;
  expect_rejected(c, "width divisor 3 does not divide");
  c = base, c.width_divisor = 0;
  expect_rejected(c, "width divisor 0");
  c = base, c.width_divisor = 128;
  expect_rejected(c, "width divisor 128");
  c = base, c.stem = (enum gw_stem)7;
  expect_rejected(c, "unknown stem 7");
  c = base, c.image_size = 0;
  expect_rejected(c, "image size must be at least 1 (got 0)");
  c = base, c.image_size = 100000;
  expect_rejected(c, "image size 100000 is larger");
  ck_assert_int_eq(gw_model_init(NULL, &base), GW_ERR_INVALID_ARGUMENT);
  struct gw_model *m = NULL;
  ck_assert_int_eq(gw_model_init(&m, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(gw_model_last_error(), "gw_model_init: NULL argument");
  gw_model_free(NULL);

  /* Images too small for every stride-2 layer to halve them: a 1x1 input
   * stays 1x1 through them (PyTorch trains these shapes too), down to 1x1
   * images; and the message cleared by a success. */
  m = make(18, 10, 3, 17, GW_STEM_IMAGENET, 8, 0);
  ck_assert_str_eq(gw_model_last_error(), "");
  assert_act(m, gw_model_layer(m, gw_model_num_layers(m) - 3)->out, 64, 1, 1); /* layer4 output */
  gw_model_free(m);
  const int small[][2] = {{16, GW_STEM_IMAGENET}, {8, GW_STEM_IMAGENET}, {1, GW_STEM_IMAGENET}, {4, GW_STEM_SMALL},
                          {1, GW_STEM_SMALL}};
  for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
    m = make(18, 10, 3, small[i][0], (enum gw_stem)small[i][1], 8, 0);
    for (int l = 0; l < gw_model_num_layers(m); l++) {
      const struct gw_layer *ly = gw_model_layer(m, l);
      if (ly->out >= 0) ck_assert_int_ge(gw_model_act(m, ly->out)->h, 1);
    }
    assert_act(m, gw_model_layer(m, gw_model_num_layers(m) - 3)->out, 64, 1, 1);
    gw_model_free(m);
  }

  int d = 0;
  ck_assert_int_eq(gw_model_depth_from_name("resnet101", &d), 0);
  ck_assert_int_eq(d, 101);
  ck_assert_int_eq(gw_model_depth_from_name("34", &d), 0);
  ck_assert_int_eq(d, 34);
  ck_assert_int_eq(gw_model_depth_from_name("resnet51", &d), -1);
  ck_assert_int_eq(gw_model_depth_from_name("resnet", &d), -1);
  ck_assert_int_eq(d, 34);
}
END_TEST

static void stats(const float *x, size_t n, double *mean, double *std) {
  double s = 0, s2 = 0;
  for (size_t i = 0; i < n; i++) s += x[i];
  *mean = s / (double)n;
  for (size_t i = 0; i < n; i++) s2 += (x[i] - *mean) * (x[i] - *mean);
  *std = sqrt(s2 / (double)n);
}

/* Elements with |x| > bound (Check's asserts are too slow for millions of values). */
static size_t count_outside(const float *x, size_t n, double bound) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += !(fabs(x[i]) <= bound);
  return bad;
}

static const float *data(struct gw_model *m, const char *name, size_t *n) {
  const struct gw_tensor *t = must_find(m, name);
  *n = t->numel;
  return gw_model_tensor_data(m, t);
}

START_TEST(test_init_statistics) {
  struct gw_model *m = make(50, 1000, 3, 224, GW_STEM_IMAGENET, 1, 1234);
  size_t n;
  double mean, std;
  /* kaiming_normal_(fan_out, relu): std sqrt(2 / (out * kh * kw)). */
  static const struct { const char *name; double fan_out; } convs[] = {
      {"layer4.0.conv2.weight", 512 * 9}, {"layer3.0.conv3.weight", 1024}, {"conv1.weight", 64 * 49},
      {"layer4.0.downsample.0.weight", 2048}};
  for (int i = 0; i < 4; i++) {
    const float *w = data(m, convs[i].name, &n);
    stats(w, n, &mean, &std);
    double want = sqrt(2.0 / convs[i].fan_out);
    ck_assert_msg(fabs(std / want - 1) < 0.05, "%s: std %g, want %g within 5%%", convs[i].name, std, want);
    ck_assert_msg(fabs(mean) < 0.05 * want, "%s: mean %g", convs[i].name, mean);
  }
  /* Normal, not merely the right variance: 68.27% within one std, 95.45% within two. */
  const float *w = data(m, "layer4.0.conv2.weight", &n);
  double sd = sqrt(2.0 / (512 * 9));
  size_t in1 = 0, in2 = 0;
  for (size_t i = 0; i < n; i++) in1 += fabs(w[i]) < sd, in2 += fabs(w[i]) < 2 * sd;
  ck_assert_msg(fabs((double)in1 / n - 0.6827) < 0.003, "within 1 std: %g", (double)in1 / n);
  ck_assert_msg(fabs((double)in2 / n - 0.9545) < 0.002, "within 2 std: %g", (double)in2 / n);

  /* BN: gamma exactly 1, beta exactly 0; buffers 0 / 1 / 0. */
  for (int i = 0; i < gw_model_num_layers(m); i++) {
    const struct gw_layer *l = gw_model_layer(m, i);
    if (l->kind != GW_LAYER_BN) continue;
    const struct gw_tensor *g = gw_model_param_tensor(m, l->weight), *b = gw_model_param_tensor(m, l->bias);
    const float *gv = gw_model_tensor_data(m, g), *bv = gw_model_tensor_data(m, b);
    const float *rm = gw_model_tensor_data(m, gw_model_buffer_tensor(m, l->running_mean));
    const float *rv = gw_model_tensor_data(m, gw_model_buffer_tensor(m, l->running_var));
    size_t bad = 0;
    for (size_t k = 0; k < g->numel; k++) bad += gv[k] != 1.0f || bv[k] != 0.0f || rm[k] != 0.0f || rv[k] != 1.0f;
    ck_assert_msg(bad == 0, "%s: %zu channels not initialized to gamma 1, beta 0, mean 0, var 1", l->name, bad);
    ck_assert_int_eq(*(int64_t *)gw_model_tensor_data(m, gw_model_buffer_tensor(m, l->num_batches_tracked)), 0);
  }

  /* fc: nn.Linear's default, uniform(+-1/sqrt(2048)) for both (variance bound^2 / 3). */
  double bound = 1.0 / sqrt(2048.0);
  const float *fw = data(m, "fc.weight", &n);
  stats(fw, n, &mean, &std);
  ck_assert_uint_eq(count_outside(fw, n, bound), 0);
  ck_assert_msg(fabs(std / (bound / sqrt(3.0)) - 1) < 0.01, "fc.weight std %g", std);
  ck_assert(fabs(mean) < 0.01 * bound);
  const float *fb = data(m, "fc.bias", &n);
  stats(fb, n, &mean, &std);
  ck_assert_uint_eq(count_outside(fb, n, bound), 0);
  ck_assert_msg(fabs(std / (bound / sqrt(3.0)) - 1) < 0.1, "fc.bias std %g", std);

  /* Gradients start at zero. */
  ck_assert_uint_eq(count_outside(gw_model_grads(m), gw_model_num_params(m), 0.0), 0);
  gw_model_free(m);
}
END_TEST

START_TEST(test_zero_init_residual) {
  for (int depth = 18; depth <= 50; depth += 32) {
    struct gw_model_config cfg;
    gw_model_config_default(&cfg);
    cfg.depth = depth, cfg.width_divisor = 16, cfg.image_size = 64, cfg.zero_init_residual = 1;
    struct gw_model *m;
    ck_assert_int_eq(gw_model_init(&m, &cfg), GW_SUCCESS);
    const char *last = depth == 50 ? ".bn3.weight" : ".bn2.weight";
    int zeroed = 0;
    for (int i = 0; i < gw_model_num_param_tensors(m); i++) {
      const struct gw_tensor *t = gw_model_param_tensor(m, i);
      const struct gw_layer *l = gw_model_layer(m, t->layer);
      if (l->kind != GW_LAYER_BN || l->weight != i) continue;
      size_t len = strlen(t->name), ll = strlen(last);
      int want_zero = len > ll && strcmp(t->name + len - ll, last) == 0 && strncmp(t->name, "layer", 5) == 0;
      float want = want_zero ? 0.0f : 1.0f;
      const float *v = gw_model_tensor_data(m, t);
      size_t bad = 0;
      for (size_t k = 0; k < t->numel; k++) bad += v[k] != want;
      ck_assert_msg(bad == 0, "%s: %zu values are not %g", t->name, bad, want);
      zeroed += want_zero;
    }
    ck_assert_int_eq(zeroed, depth == 50 ? 16 : 8); /* one per block */
    gw_model_free(m);
  }
}
END_TEST

START_TEST(test_init_deterministic) {
  struct gw_model *a = make(50, 10, 3, 32, GW_STEM_SMALL, 8, 7), *b = make(50, 10, 3, 32, GW_STEM_SMALL, 8, 7);
  struct gw_model *c = make(50, 10, 3, 32, GW_STEM_SMALL, 8, 8);
  size_t bytes = gw_model_num_params(a) * sizeof(float);
  ck_assert_int_eq(memcmp(gw_model_params(a), gw_model_params(b), bytes), 0);
  ck_assert_int_ne(memcmp(gw_model_params(a), gw_model_params(c), bytes), 0);
  /* Re-initializing c with a's seed reproduces a, buffers included. */
  gw_model_counters(c)[0] = 5;
  gw_model_running(c)[0] = 3.0f;
  gw_model_grads(c)[0] = 1.0f;
  gw_model_reset_parameters(c, 7, 0);
  ck_assert_int_eq(memcmp(gw_model_params(a), gw_model_params(c), bytes), 0);
  ck_assert_int_eq(gw_model_counters(c)[0], 0);
  ck_assert(gw_model_running(c)[0] == 0.0f);
  ck_assert(gw_model_grads(c)[0] == 0.0f);
  /* Each tensor has its own stream keyed by its name: another class count leaves
   * every conv as it was. */
  struct gw_model *d = make(50, 100, 3, 32, GW_STEM_SMALL, 8, 7);
  size_t n1, n2;
  const float *x = data(a, "layer3.2.conv2.weight", &n1), *y = data(d, "layer3.2.conv2.weight", &n2);
  ck_assert_uint_eq(n1, n2);
  ck_assert_int_eq(memcmp(x, y, n1 * sizeof(float)), 0);
  /* ...and different tensors of one shape differ. */
  const float *z = data(a, "layer3.3.conv2.weight", &n2);
  ck_assert_int_ne(memcmp(x, z, n1 * sizeof(float)), 0);
  gw_model_free(a);
  gw_model_free(b);
  gw_model_free(c);
  gw_model_free(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model");
  TCase *tc = tcase_create("resnet");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_torchvision_counts);
  tcase_add_test(tc, test_resnet50_names_and_order);
  tcase_add_test(tc, test_buffers);
  tcase_add_test(tc, test_layers_and_shapes);
  tcase_add_test(tc, test_hand_counted_configs);
  tcase_add_test(tc, test_bad_configs);
  tcase_add_test(tc, test_init_statistics);
  tcase_add_test(tc, test_zero_init_residual);
  tcase_add_test(tc, test_init_deterministic);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
