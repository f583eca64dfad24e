/* test_model_torch.c - gradwire's ResNets (cpu backend) against PyTorch, tensor by
 * tensor, from the committed fixture test/fixtures/resnet_w8.safetensors (made by
 * test/fixtures/make_resnet_fixtures.py from weights gradwire exported; its
 * docstring says what is in it and why there are two networks).  Compared (every
 * tensor that differs is printed, where the differences start says which layer
 * computed wrong; a group fails on its first):
 *   ResNet-50 at 1/8 width, 16x16 inputs (a batch whose ReLU inputs all keep
 *   1.5e-5 from zero: the fixture script says why): logits and loss of a
 *   training-mode forward, every parameter gradient, running statistics and num_batches_tracked after it;
 *   ResNet-18 at 1/8 width: every parameter and buffer after 3 steps of SGD with
 *   momentum (forward, backward, step, on the same batch).
 *
 * Tolerances, for each tensor (max over its elements):
 *   one step:  |ours - torch| <= rtol * max |torch| + 1e-6 with rtol 2e-4 for
 *              logits, loss and statistics, 2e-3 for gradients (a sum over the
 *              batch and every position, through 50 layers of BN).  fp32 with a
 *              different summation order on each side gives about 1e-6 relative
 *              per layer; a wrong index or formula moves a tensor by whole percent.
 *   3 steps:   |ours - torch| <= 0.1 * max |torch - initial| + 1e-6, i.e. within a
 *              tenth of how far training moved the tensor.  After 3 steps rounding
 *              has been amplified by the training itself (PyTorch against itself,
 *              oneDNN on vs off, differs by ~3% of the update on this network);
 *              a missing momentum or a wrong learning rate is off by 50-100%.
 * Arguments (any order): the backend, "cpu" (default), "cudnn" (the GPU, float32
 * without TF32: several full training steps there against PyTorch, with the
 * optimizer on the device as gw-train runs it) or "cpu-dev" (the cpu backend
 * posing as device memory: every tensor crosses upload/download and the
 * optimizer is the backend's sgd_step, the cudnn run's path on this machine);
 * the layout, "nchw" (default) or "nhwc" (channels-last activations); "nofuse":
 * batch norm, ReLU and the residual add as separate layers.  Same
 * tolerances everywhere.  Exits 77 (skipped) when the backend is not in the
 * build or, for cudnn, without a GPU.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw_config.h"
#include "harness.h"

#if GW_HAVE_ONEDNN || GW_HAVE_CUDNN

#include "backend.h"
#include "core.h" /* gw__fnv */
#include "exec.h"
#include "resnet.h"
#include "safetensors.h"
#include "sgd.h"
#include "sgd_math.h"

/* What make_resnet_fixtures.py's R50 and R18 say (metadata "r50.config" and
 * "r18.config" must match). */
#define R50_SIZE 16
#define R50_BATCH 4
#define R50_CONFIG "depth=50 classes=10 in_channels=3 image_size=16 stem=small width_divisor=8 seed=1 batch=4"
#define R18_CONFIG "depth=18 classes=10 in_channels=3 image_size=32 stem=small width_divisor=8 seed=2 batch=8"
#define STEP3_RTOL 0.1

static int layout;                     /* GW_LAYOUT_NCHW or GW_LAYOUT_NHWC */
static int no_fuse;                    /* "nofuse": batch norm, ReLU and the residual add layer by layer */
static const struct gw_backend_ops *be; /* the backend under test */
static struct gw_st_file *fx;

static int failures;           /* tensors that differ beyond their bound, */
static char first_failure[512]; /* the first of them */

static void load_fixture(void) {
  failures = 0;
  const char *dir = getenv("GW_FIXTURES");
  char path[4096];
  snprintf(path, sizeof path, "%s/resnet_w8.safetensors", dir ? dir : "test/fixtures");
  ck_assert_msg(gw_st_open(&fx, path) == GW_SUCCESS, "%s", gw_model_last_error());
  const char *c50 = gw_st_metadata(fx, "r50.config"), *c18 = gw_st_metadata(fx, "r18.config");
  ck_assert_msg(c50 && c18 && strcmp(c50, R50_CONFIG) == 0 && strcmp(c18, R18_CONFIG) == 0,
                "%s was made for '%s' and '%s', this test runs '%s' and '%s'", path, c50 ? c50 : "?", c18 ? c18 : "?",
                R50_CONFIG, R18_CONFIG);
}

static const struct gw_st_tensor *ref(const char *name, size_t numel, gw_dtype_t dtype) {
  const struct gw_st_tensor *t = gw_st_find(fx, name);
  ck_assert_msg(t, "the fixture has no tensor %s", name);
  ck_assert_msg(t->dtype == dtype && t->nbytes == numel * gw_st_dtype_size(dtype),
                "fixture tensor %s: %s of %zu bytes, expected %zu elements of %s", name, t->dtype_name, t->nbytes,
                numel, gw_st_dtype_name(dtype));
  return t;
}

/* Worst error relative to the bound over everything compared, per category. */
static double worst[4];
enum { W_FWD, W_GRAD, W_STEP1, W_STEP3 };

/* max |ours - torch| <= rtol * max |torch - base| + 1e-6, where base is NULL
 * (zero: relative to the tensor's size) or the values before training (relative
 * to how far training moved the tensor). */
static void compare_from(const char *name, const float *ours, const float *base, size_t numel, double rtol,
                         int category) {
  const struct gw_st_tensor *t = ref(name, numel, GW_FLOAT32);
  float *r = malloc(numel * sizeof(float) + 1);
  memcpy(r, t->data, numel * sizeof(float));
  double scale = 0, err = 0;
  size_t at = 0;
  for (size_t i = 0; i < numel; i++) scale = fmax(scale, fabs(r[i] - (base ? base[i] : 0.0f)));
  for (size_t i = 0; i < numel && !isnan(err); i++) {
    double d = fabs((double)ours[i] - r[i]);
    if (!(d <= err)) err = d, at = i; /* NaN counts as the worst: the first one stays (a later finite one replaced it) */
  }
  double bound = rtol * scale + 1e-6;
  if (getenv("GW_TORCH_VERBOSE")) printf("%-50s %.3g of the bound\n", name, err / bound);
  if (!(err <= bound)) {
    char msg[sizeof first_failure];
    snprintf(msg, sizeof msg, "%s differs from PyTorch: element %zu is %.9g, PyTorch %.9g (max |diff| %.3g > %.3g)",
             name, at, (double)ours[at], (double)r[at], err, bound);
    printf("%s\n", msg);
    fflush(stdout); /* a failing case ends its process without flushing */
    if (!failures++) memcpy(first_failure, msg, sizeof msg);
  }
  worst[category] = fmax(worst[category], err / bound);
  free(r);
}

/* Every tensor of a group is compared (each one that differs is printed: where
 * the differences start says which layer computed wrong), then the group
 * fails on the first. */
static void settle(void) {
  ck_assert_msg(failures == 0, "%s (%d tensors differ in all, printed above)", first_failure, failures);
}

static void compare(const char *name, const float *ours, size_t numel, double rtol, int category) {
  compare_from(name, ours, NULL, numel, rtol, category);
}

/* Buffers: counters exactly; running statistics by compare_from with base (the
 * values before training, or NULL) and rtol. */
static void compare_buffers(struct gw_model *m, const char *prefix, const float *base, double rtol, int category) {
  for (int i = 0; i < gw_model_num_buffer_tensors(m); i++) {
    const struct gw_tensor *t = gw_model_buffer_tensor(m, i);
    char name[160];
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    if (t->kind == GW_TENSOR_COUNTER) {
      int64_t want;
      memcpy(&want, ref(name, 1, GW_INT64)->data, sizeof want);
      ck_assert_msg(*(int64_t *)gw_model_tensor_data(m, t) == want, "%s: %lld, PyTorch %lld", name,
                    (long long)*(int64_t *)gw_model_tensor_data(m, t), (long long)want);
    } else {
      compare_from(name, gw_model_tensor_data(m, t), base ? base + t->offset : NULL, t->numel, rtol, category);
    }
  }
}

/* One network of the fixture, set up as the script set it up. */
struct net {
  const char *prefix; /* "r50." */
  struct gw_model *m;
  struct gw_backend *b;
  struct gw_exec *e;
  float *x;
  int32_t *y;
  int batch;
};

static void net_up(struct net *n, const char *prefix, int depth, uint64_t seed, int size, int batch) {
  char name[64];
  memset(n, 0, sizeof *n);
  n->prefix = prefix, n->batch = batch;
  struct gw_model_config cfg;
  gw_model_config_default(&cfg);
  cfg.depth = depth, cfg.classes = 10, cfg.in_channels = 3, cfg.image_size = size, cfg.stem = GW_STEM_SMALL;
  cfg.width_divisor = 8, cfg.seed = seed;
  ck_assert(gw_model_init(&n->m, &cfg) == GW_SUCCESS);
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx",
           (unsigned long long)gw__fnv(GW_FNV_START, gw_model_params(n->m), gw_model_num_params(n->m) * sizeof(float)));
  snprintf(name, sizeof name, "%sinit_fnv1a64", prefix);
  const char *want = gw_st_metadata(fx, name);
  ck_assert_msg(want && strcmp(want, hash) == 0,
                "resnet%d initializes to weights with hash %s, the fixture was made from %s: the initialization "
                "changed; remake the fixture with test/fixtures/make_resnet_fixtures.py",
                depth, hash, want ? want : "(none)");
  struct gw_backend_config bc = {.threads = 1, .layout = layout};
  ck_assert_msg(be->create(&bc, &n->b) == GW_SUCCESS, "%s", gw_model_last_error());
  struct gw_exec_config ec = {.batch = batch, .label_smoothing = 0.1f, .no_fuse = no_fuse};
  ck_assert_msg(gw_exec_create(n->m, be, n->b, &ec, &n->e) == GW_SUCCESS, "%s", gw_model_last_error());
  size_t nx = (size_t)batch * 3 * size * size;
  n->x = malloc(nx * sizeof(float));
  n->y = malloc((size_t)batch * sizeof(int32_t));
  snprintf(name, sizeof name, "%sinput", prefix);
  memcpy(n->x, ref(name, nx, GW_FLOAT32)->data, nx * sizeof(float));
  snprintf(name, sizeof name, "%slabels", prefix);
  memcpy(n->y, ref(name, (size_t)batch, GW_INT32)->data, (size_t)batch * sizeof(int32_t));
}

static void net_down(struct net *n) {
  gw_exec_free(n->e);
  be->destroy(n->b);
  gw_model_free(n->m);
  free(n->x), free(n->y);
}

static void train_step(struct net *n, float *loss) {
  ck_assert_msg(gw_exec_forward(n->e, n->x, 1) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_msg(gw_exec_backward(n->e, n->y, loss, NULL, NULL) == GW_SUCCESS, "%s", gw_model_last_error());
}

/* A device-memory backend computes on its own copies: the model's host
 * parameters, gradients and statistics are brought back to compare. */
static void to_host(struct net *n) {
  if (!be->host_memory) ck_assert_msg(gw_exec_download_model(n->e) == GW_SUCCESS, "%s", gw_model_last_error());
}

static size_t running_elems(const struct gw_model *m) {
  size_t nrun = 0;
  for (int i = 0; i < gw_model_num_buffer_tensors(m); i++)
    if (gw_model_buffer_tensor(m, i)->kind == GW_TENSOR_RUNNING) nrun += gw_model_buffer_tensor(m, i)->numel;
  return nrun;
}

START_TEST(test_resnet50_one_step) {
  load_fixture();
  struct net n;
  net_up(&n, "r50.", 50, 1, R50_SIZE, R50_BATCH);
  float logits[R50_BATCH * 10], loss;
  char name[160];
  ck_assert(gw_exec_forward(n.e, n.x, 1) == GW_SUCCESS);
  ck_assert(gw_exec_logits(n.e, logits) == GW_SUCCESS);
  compare("r50.logits", logits, R50_BATCH * 10, 2e-4, W_FWD);
  ck_assert(gw_exec_backward(n.e, n.y, &loss, NULL, NULL) == GW_SUCCESS);
  to_host(&n);
  compare("r50.loss", &loss, 1, 2e-4, W_FWD);
  settle();
  for (int i = 0; i < gw_model_num_param_tensors(n.m); i++) {
    const struct gw_tensor *t = gw_model_param_tensor(n.m, i);
    snprintf(name, sizeof name, "r50.grad.%s", t->name);
    compare(name, gw_model_grads(n.m) + t->offset, t->numel, 2e-3, W_GRAD);
  }
  compare_buffers(n.m, "r50.step1.", NULL, 2e-4, W_STEP1);
  settle();
  printf("resnet50 against PyTorch, worst error / bound: forward %.3f, gradients %.3f, statistics %.3f\n", worst[W_FWD],
         worst[W_GRAD], worst[W_STEP1]);
  net_down(&n);
  gw_st_free(fx);
}
END_TEST

START_TEST(test_resnet18_three_sgd_steps) {
  load_fixture();
  struct net n;
  net_up(&n, "r18.", 18, 2, 32, 8);
  size_t np = gw_model_num_params(n.m), nrun = running_elems(n.m);
  float *params0 = malloc(np * sizeof(float)), *running0 = malloc(nrun * sizeof(float)), loss;
  memcpy(params0, gw_model_params(n.m), np * sizeof(float));
  memcpy(running0, gw_model_running(n.m), nrun * sizeof(float));
  struct gw_sgd *s;
  struct gw_sgd_config sc = {.momentum = 0.9f, .weight_decay = 1e-4f};
  ck_assert(gw_sgd_create(n.m, &sc, &s) == GW_SUCCESS);
  /* On a device backend the optimizer runs there (sgd_step), its momentum too. */
  float *mom = NULL;
  int nruns = 0;
  const struct gw_sgd_run *runs = gw_sgd_runs(s, &nruns);
  if (!be->host_memory) {
    ck_assert(mom = be->alloc(n.b, np * sizeof(float)));
    ck_assert(be->upload(n.b, mom, gw_sgd_momentum(s), np * sizeof(float)) == GW_SUCCESS);
  }
  for (int step = 0; step < 3; step++) {
    train_step(&n, &loss);
    if (be->host_memory) {
      ck_assert(gw_sgd_step(s, gw_model_params(n.m), gw_model_grads(n.m), 0.01f) == GW_SUCCESS);
      continue;
    }
    struct gw_sgd_scalars at;
    gw_sgd_scalars_at(s, 0.01f, 1.0f, &at);
    ck_assert_msg(be->sgd_step(n.b, runs, nruns, gw_exec_params(n.e), gw_exec_grads(n.e), mom, &at) == GW_SUCCESS,
                  "%s", gw_model_last_error());
    gw_sgd_set_steps(s, gw_sgd_steps(s) + 1);
  }
  to_host(&n);
  if (mom) be->dealloc(n.b, mom);
  char name[160];
  for (int i = 0; i < gw_model_num_param_tensors(n.m); i++) {
    const struct gw_tensor *t = gw_model_param_tensor(n.m, i);
    snprintf(name, sizeof name, "r18.step3.%s", t->name);
    compare_from(name, gw_model_tensor_data(n.m, t), params0 + t->offset, t->numel, STEP3_RTOL, W_STEP3);
  }
  compare_buffers(n.m, "r18.step3.", running0, STEP3_RTOL, W_STEP3);
  settle();
  printf("resnet18 against PyTorch after 3 SGD steps, worst error / bound: %.3f\n", worst[W_STEP3]);
  gw_sgd_free(s);
  net_down(&n);
  free(params0), free(running0);
  gw_st_free(fx);
}
END_TEST

/* Makes the backend under test: 0, 77 when this machine cannot (said why), 1
 * on another failure. */
static int probe_child(void *arg) {
  const char *which = arg;
  struct gw_backend *probe = NULL;
  struct gw_backend_config bc = {.threads = 1, .layout = layout};
  gw_result_t r = be->create(&bc, &probe);
  if (r == GW_ERR_UNSUPPORTED) {
    printf("model-torch: %s, skipped\n", gw_model_last_error());
    return 77;
  }
  if (r != GW_SUCCESS) {
    fprintf(stderr, "model-torch: the %s backend: %s\n", which, gw_model_last_error());
    return 1;
  }
  be->destroy(probe);
  return 0;
}

int main(int argc, char **argv) {
  const char *which = "cpu";
  layout = GW_LAYOUT_NCHW;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "nchw") || !strcmp(argv[i], "nhwc")) {
      layout = !strcmp(argv[i], "nhwc") ? GW_LAYOUT_NHWC : GW_LAYOUT_NCHW;
    } else if (!strcmp(argv[i], "cpu") || !strcmp(argv[i], "cudnn") || !strcmp(argv[i], "cpu-dev")) {
      which = argv[i];
    } else if (!strcmp(argv[i], "nofuse")) {
      no_fuse = 1;
    } else {
      fprintf(stderr, "usage: %s [cpu|cudnn|cpu-dev] [nchw|nhwc] [nofuse]  (the backend, cpu by default; the "
              "activations' layout, nchw by default; batch norm, ReLU and the residual add unfused)\n", argv[0]);
      return 2;
    }
  }
#if GW_HAVE_ONEDNN
  static struct gw_backend_ops cpu_dev;
  cpu_dev = gw_backend_cpu;
  cpu_dev.host_memory = 0;
  if (!strcmp(which, "cpu")) be = &gw_backend_cpu;
  if (!strcmp(which, "cpu-dev")) be = &cpu_dev;
#endif
#if GW_HAVE_CUDNN
  if (!strcmp(which, "cudnn") && !(be = gw_backend_cudnn_ops())) {
    printf("model-torch: %s\n", gw_model_last_error());
    return 1;
  }
#endif
  if (!be) {
    printf("model-torch: the %s backend is not in this build, skipped\n", which);
    return 77;
  }
  /* In a child: this process must not initialize a GPU (run_in_child says why;
   * every case failed with cudaErrorInitializationError on the H200). */
  const int probe = run_in_child(probe_child, (void *)which);
  if (probe != 0) return probe;
  printf("model-torch on the %s backend, %s activations%s\n", which, layout == GW_LAYOUT_NHWC ? "NHWC" : "NCHW",
         no_fuse ? ", unfused" : "");
  Suite *s = suite_create("model-torch");
  TCase *tc = tcase_create("fixture");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_resnet50_one_step);
  tcase_add_test(tc, test_resnet18_three_sgd_steps);
  suite_add_tcase(s, tc);
  return run_suite(s);
}

#else

int main(void) {
  printf("model-torch: built without a model backend (oneDNN or cuDNN), skipped\n");
  return 77;
}

#endif
