/* test_train_weights.c - what gw-train's training computes, compared on the
 * weights it saves (test_train.c's runs, narrow ResNet-18, synthetic data):
 * - data parallelism is exact: 2 ranks x batch 8 with --sync-bn end 4 steps at
 *   the same weights as 1 rank x batch 16 (the same 16 samples per step: the
 *   sampler's global order is shared), within 2% of how far training moved each
 *   tensor (summation order differs; on this network PyTorch against itself
 *   differs by ~3% after 3 steps, see test/fixtures/make_resnet_fixtures.py), BN
 *   running statistics within 1e-3;
 * - a bfloat16 gradient wire and --amp bf16 against float32; loss scaling and
 *   its skipped steps; --wd-all.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "test_train.h"

/* The starting weights (--steps 0, the seed's initialization) into `name`. */
static void save_init(const char *name) {
  char p[512];
  path(p, sizeof p, name);
  struct run r;
  train(&r, (const char *const[]){NULL}, "1", (const char *const[]){"--steps", "0", "--save-weights", p, NULL});
  expect_ok(&r);
  gwrun_free(&r);
}

/* Calls fn on each float tensor of the weights files a and b (BN's running
 * statistics only with `running`), with its starting values from init. */
typedef void (*tensor_fn)(const struct gw_st_tensor *t, const float *init, const float *a, const float *b, size_t n,
                          void *ctx);
static void each_tensor(const char *init, const char *a, const char *b, int running, tensor_fn fn, void *ctx) {
  struct gw_st_file *f0 = open_st(init), *f1 = open_st(a), *f2 = open_st(b);
  for (int i = 0; i < f1->ntensors; i++) {
    const struct gw_st_tensor *t = &f1->tensors[i];
    if (t->dtype != GW_FLOAT32 || (!running && strstr(t->name, "running_"))) continue;
    size_t n, n0, n2;
    float *va = floats(f1, t->name, &n), *z = floats(f0, t->name, &n0), *vb = floats(f2, t->name, &n2);
    ck_assert_msg(n == n0 && n == n2, "%s: %zu, %zu and %zu elements", t->name, n0, n, n2);
    fn(t, z, va, vb, n, ctx);
    free(va), free(z), free(vb);
  }
  gw_st_free(f0), gw_st_free(f1), gw_st_free(f2);
}

/* Gradients over a bfloat16 wire (--grad-wire bf16): one step moves the
 * weights as with float32 gradients up to bfloat16's rounding (each rank's
 * gradient and the result rounded once, 2 x 2^-9: each tensor's difference at
 * most 1% of the step, measured 0.47% at worst), and they do differ (the wire
 * was used).  (After 3 steps the differences grow to 5% in the batch-norm
 * parameters: small batches amplify them, as any perturbation.) */
struct wire_cmp {
  double worst, total_diff;
};

static void wire_tensor(const struct gw_st_tensor *t, const float *z, const float *a, const float *b, size_t n,
                        void *ctx) {
  struct wire_cmp *c = ctx;
  double moved = 0, diff = 0;
  for (size_t k = 0; k < n; k++) {
    moved += ((double)a[k] - z[k]) * ((double)a[k] - z[k]);
    diff += ((double)a[k] - b[k]) * ((double)a[k] - b[k]);
  }
  moved = sqrt(moved), diff = sqrt(diff), c->total_diff += diff;
  ck_assert_msg(diff <= 0.01 * moved + 1e-7, "%s: the bfloat16 wire moved it %.3g away from float32 (the step "
                "moved it %.3g)", t->name, diff, moved);
  if (moved > 0) c->worst = fmax(c->worst, diff / moved);
}

START_TEST(test_bf16_wire_close_to_fp32) {
  char f32[512], b16[512];
  path(f32, sizeof f32, "w-f32.safetensors");
  path(b16, sizeof b16, "w-bf16.safetensors");
  struct run r;
  const char *const noenv[] = {NULL};
  save_init("w-init.safetensors");
  train(&r, noenv, "2", (const char *const[]){"--steps", "1", "--batch", "8", "--save-weights", f32, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  train(&r, noenv, "2",
        (const char *const[]){"--steps", "1", "--batch", "8", "--grad-wire", "bf16", "--save-weights", b16, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  struct wire_cmp c = {0, 0};
  each_tensor("w-init.safetensors", "w-f32.safetensors", "w-bf16.safetensors", 0, wire_tensor, &c);
  ck_assert_msg(c.total_diff > 0, "the bfloat16 wire gave the float32 weights bit for bit: was it used?");
  printf("bfloat16 gradient wire vs float32 after 1 step: worst tensor differs by %.4f of its update\n", c.worst);
}
END_TEST

/* Mixed precision (--amp bf16): 2 ranks, 3 steps from the same start as float32.
 * The updates point the same way (cosine of the whole weight change >= 0.8,
 * measured 0.94;
 * in these narrow networks a 0.2% change of the input alone moves early
 * gradients by 10-25%, so no tighter bound is meaningful: test_model_bf16 holds
 * the arithmetic to its exact emulation), are not identical (bfloat16 was
 * used), the loss is finite and the job says what it ran. */
struct amp_cmp {
  double dot, n1, n2;
};

static void amp_tensor(const struct gw_st_tensor *t, const float *z, const float *a, const float *b, size_t n,
                       void *ctx) {
  struct amp_cmp *c = ctx;
  for (size_t k = 0; k < n; k++) {
    ck_assert_msg(isfinite(b[k]), "%s[%zu] is %g after bfloat16 steps", t->name, k, (double)b[k]);
    double u = (double)a[k] - z[k], v = (double)b[k] - z[k];
    c->dot += u * v, c->n1 += u * u, c->n2 += v * v;
  }
}

START_TEST(test_amp_bf16_follows_fp32) {
  char f32[512], b16[512];
  path(f32, sizeof f32, "amp-f32.safetensors");
  path(b16, sizeof b16, "amp-bf16.safetensors");
  struct run r;
  const char *const noenv[] = {NULL};
  save_init("amp-init.safetensors");
  train(&r, noenv, "2", (const char *const[]){"--steps", "3", "--batch", "8", "--save-weights", f32, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  train(&r, noenv, "2",
        (const char *const[]){"--steps", "3", "--batch", "8", "--amp", "bf16", "--save-weights", b16, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "bf16 activations") != NULL, "the job does not say bf16:\n%s", r.out);
  gwrun_free(&r);
  struct amp_cmp c = {0, 0, 0};
  each_tensor("amp-init.safetensors", "amp-f32.safetensors", "amp-bf16.safetensors", 0, amp_tensor, &c);
  double cosine = c.dot / sqrt(c.n1 * c.n2), rel = sqrt(c.n1 + c.n2 - 2 * c.dot) / sqrt(c.n1);
  printf("--amp bf16 vs float32 after 3 steps: cosine of the weight updates %.4f, relative distance %.4f\n", cosine,
         rel);
  ck_assert_msg(cosine >= 0.8, "bfloat16's update points elsewhere: cosine %.4f with float32's", cosine);
  ck_assert_msg(rel > 0, "bfloat16 training gave float32's weights bit for bit: was it used?");
}
END_TEST

/* --wd-all: weight decay on the 1-D tensors too (BN gamma and beta, biases).
 * One step without momentum from the same start: every tensor of 2 or more
 * dimensions is bit for bit the default run's, and each 1-D element moved
 * further by exactly lr x wd x its starting value (BN gammas start at 1). */
struct wd_cmp {
  double lr, wd;
  int decayed;
};

static void wd_tensor(const struct gw_st_tensor *t, const float *z, const float *a, const float *b, size_t n,
                      void *ctx) {
  struct wd_cmp *c = ctx;
  for (size_t k = 0; k < n; k++) {
    if (t->ndim >= 2) {
      ck_assert_msg(a[k] == b[k], "%s[%zu]: %.9g with --wd-all, %.9g without (decayed either way)", t->name, k,
                    (double)b[k], (double)a[k]);
      continue;
    }
    const double want = c->lr * c->wd * z[k], got = (double)a[k] - b[k];
    ck_assert_msg(fabs(got - want) <= 1e-6, "%s[%zu] (from %g): --wd-all moved it %.3g further, lr x wd x p is %.3g",
                  t->name, k, (double)z[k], got, want);
    c->decayed += want != 0;
  }
}

START_TEST(test_wd_all) {
  char def[512], all[512], metrics[512];
  path(def, sizeof def, "wd-default.safetensors");
  path(all, sizeof all, "wd-all.safetensors");
  path(metrics, sizeof metrics, "wd-all.jsonl");
  struct run r;
  const char *const noenv[] = {NULL};
  save_init("wd-init.safetensors");
  const char *args[] = {"--steps", "1", "--batch", "8", "--momentum", "0", "--wd", "0.5", "--save-weights", def,
                        NULL, NULL, NULL, NULL};
  train(&r, noenv, "1", args);
  expect_ok(&r);
  gwrun_free(&r);
  args[9] = all, args[10] = "--wd-all", args[11] = "--metrics", args[12] = metrics;
  train(&r, noenv, "1", args);
  expect_ok(&r);
  gwrun_free(&r);
  char lr[1][32];
  ck_assert_int_eq(metrics_by_step(metrics, "lr", lr, 1), 1);
  struct wd_cmp c = {atof(lr[0]), 0.5, 0};
  each_tensor("wd-init.safetensors", "wd-default.safetensors", "wd-all.safetensors", 0, wd_tensor, &c);
  ck_assert_msg(c.decayed > 0, "no 1-D element started non-zero: nothing tested");
}
END_TEST

/* Loss scaling.  A power-of-two scale changes nothing but the exponents: 3
 * steps with --loss-scale dynamic (65536) give the unscaled run's weights bit
 * for bit.  A step whose gradients overflow (forced by the test hook
 * GW_TRAIN_OVERFLOW_AT_STEP) is skipped: after 2 steps with the second
 * overflowing, the parameters are those after 1 step (the BN running statistics
 * moved, as in PyTorch: forward ran), the scale halved and the overflow counted
 * in the metrics, and the job says so. */
static void load_params(const char *name, float **out, size_t *n) {
  struct gw_st_file *f = open_st(name);
  size_t total = 0, cap = 0;
  *out = NULL;
  for (int i = 0; i < f->ntensors; i++) {
    const struct gw_st_tensor *t = &f->tensors[i];
    if (t->dtype != GW_FLOAT32 || strstr(t->name, "running_")) continue;
    size_t k;
    float *v = floats(f, t->name, &k);
    if (total + k > cap) {
      cap = 2 * (total + k);
      *out = realloc(*out, cap * sizeof(float));
      ck_assert(*out);
    }
    memcpy(*out + total, v, k * sizeof(float));
    total += k;
    free(v);
  }
  *n = total;
  gw_st_free(f);
}

START_TEST(test_loss_scaling) {
  char plain[512], scaled[512], one[512], two[512], metrics[512];
  path(plain, sizeof plain, "ls-plain.safetensors");
  path(scaled, sizeof scaled, "ls-scaled.safetensors");
  path(one, sizeof one, "ls-one.safetensors");
  path(two, sizeof two, "ls-two.safetensors");
  path(metrics, sizeof metrics, "ls-metrics.jsonl");
  struct run r;
  /* Step 2 overflows on rank 1 only: the verdict is agreed, so both ranks
   * skip it (rank 0, which saw nothing, included). */
  const char *const noenv[] = {NULL},
                    *const overflow2[] = {"GW_TRAIN_OVERFLOW_AT_STEP=2", "GW_TRAIN_OVERFLOW_RANK=1", NULL};
  char ck1[512], ck2[512];
  path(ck1, sizeof ck1, "ls-ckpt-one");
  path(ck2, sizeof ck2, "ls-ckpt-two");
  train(&r, noenv, "2", (const char *const[]){"--steps", "3", "--batch", "8", "--amp", "bf16", "--save-weights",
                                              plain, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  train(&r, noenv, "2", (const char *const[]){"--steps", "3", "--batch", "8", "--amp", "bf16", "--loss-scale",
                                              "dynamic", "--save-weights", scaled, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "note: --loss-scale with bfloat16 activations and a float32 gradient wire: both have "
                              "float32's range"), "loss scaling without float16 not noted:\n%s", r.out);
  gwrun_free(&r);
  size_t n1, n2;
  float *a, *b;
  load_params("ls-plain.safetensors", &a, &n1);
  load_params("ls-scaled.safetensors", &b, &n2);
  ck_assert(n1 == n2 && n1 > 0);
  ck_assert_msg(!memcmp(a, b, n1 * sizeof(float)), "a loss scale of 65536 changed the weights");
  free(a), free(b);
  train(&r, noenv, "2", (const char *const[]){"--steps", "1", "--batch", "8", "--amp", "bf16", "--loss-scale",
                                              "dynamic", "--save-weights", one, "--checkpoint-dir", ck1, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  train(&r, overflow2, "2", (const char *const[]){"--steps", "2", "--batch", "8", "--amp", "bf16", "--loss-scale",
                                                  "dynamic", "--metrics", metrics, "--save-weights", two,
                                                  "--checkpoint-dir", ck2, "--checkpoint-every", "1", NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "step 2: the gradients overflowed at loss scale 65536; step skipped (1 so far), scale "
                              "now 32768"), "no overflow report:\n%s", r.out);
  gwrun_free(&r);
  load_params("ls-one.safetensors", &a, &n1);
  load_params("ls-two.safetensors", &b, &n2);
  ck_assert(n1 == n2);
  ck_assert_msg(!memcmp(a, b, n1 * sizeof(float)), "the overflowed step changed the parameters");
  free(a), free(b);
  /* ... nor the momentum buffer or the optimizer's step count (state[3]) */
  struct gw_st_file *f1 = open_st("ls-ckpt-one/ckpt-1.safetensors"), *f2 = open_st("ls-ckpt-two/ckpt-2.safetensors");
  a = floats(f1, "momentum", &n1), b = floats(f2, "momentum", &n2);
  ck_assert_msg(n1 == n2 && !memcmp(a, b, n1 * sizeof(float)), "the overflowed step changed the momentum buffer");
  free(a), free(b);
  const struct gw_st_tensor *s1 = gw_st_find(f1, "state"), *s2 = gw_st_find(f2, "state");
  ck_assert(s1 && s2 && s1->nbytes >= 4 * sizeof(int64_t) && s1->nbytes == s2->nbytes);
  int64_t st1[5] = {0}, st2[5] = {0};
  memcpy(st1, s1->data, 4 * sizeof(int64_t)), memcpy(st2, s2->data, 4 * sizeof(int64_t));
  ck_assert_msg(st1[3] == 1 && st2[3] == 1, "optimizer steps: %lld after one step, %lld after one and a skipped one",
                (long long)st1[3], (long long)st2[3]);
  gw_st_free(f1), gw_st_free(f2);
  FILE *f = fopen(metrics, "r");
  ck_assert(f);
  char line[1024];
  int steps = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, "\"train\"")) continue;
    steps++;
    ck_assert_msg(strstr(line, steps == 1 ? "\"loss_scale\":65536,\"overflows\":0" : "\"loss_scale\":65536,\"overflows\":1"),
                  "metrics of step %d: %s", steps, line);
  }
  fclose(f);
  ck_assert_int_eq(steps, 2);
}
END_TEST

static void batch_tensor(const struct gw_st_tensor *t, const float *z, const float *a, const float *b, size_t n,
                         void *ctx) {
  double *worst = ctx, moved = 0, err = 0, scale = 0;
  int running = strstr(t->name, "running_") != NULL;
  for (size_t k = 0; k < n; k++) {
    moved = fmax(moved, fabs((double)a[k] - z[k]));
    scale = fmax(scale, fabs(a[k]));
    err = fmax(err, fabs((double)a[k] - b[k]));
  }
  double bound = running ? 1e-3 * scale + 1e-6 : 0.02 * moved + 1e-6;
  ck_assert_msg(err <= bound, "%s: 2 ranks x 8 differ from 1 rank x 16 by %.3g (bound %.3g; training moved it %.3g)",
                t->name, err, bound, moved);
  *worst = fmax(*worst, err / bound);
}

START_TEST(test_two_ranks_equal_one_rank_double_batch) {
  char one[512], two[512];
  path(one, sizeof one, "one.safetensors");
  path(two, sizeof two, "two.safetensors");
  struct run r;
  const char *const noenv[] = {NULL};
  save_init("init.safetensors");
  train(&r, noenv, "1", (const char *const[]){"--steps", "4", "--batch", "16", "--sync-bn", "--save-weights", one, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  train(&r, noenv, "2", (const char *const[]){"--steps", "4", "--batch", "8", "--sync-bn", "--save-weights", two, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  double worst = 0;
  each_tensor("init.safetensors", "one.safetensors", "two.safetensors", 1, batch_tensor, &worst);
  printf("2 ranks x batch 8 vs 1 rank x batch 16 after 4 steps: worst difference %.3f of its bound\n", worst);
}
END_TEST

/* --steps 0 with --data builds the model in the data's shape, as training
 * would: weights saved for Fashion-MNIST (10 classes of 1x28x28) start a run
 * on it; a flag that disagrees with the data is refused, whether or not the
 * others are given; without --data, torchvision's shape. */
START_TEST(test_steps0_takes_data_shape) {
  char p[512];
  path(p, sizeof p, "fm-init.safetensors");
  const char *const noenv[] = {NULL};
  const char *const base[] = {"--data", "fashion-mnist", "--model", "resnet18", "--width-divisor", "16", "--stem",
                              "small", "--threads", "1", "--no-eval", NULL};
  struct run r;
  train_from(&r, noenv, "1", base, (const char *const[]){"--steps", "0", "--save-weights", p, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "resnet18, 10 classes, 1 input channels, 28x28, small stem"), "%s", r.out);
  gwrun_free(&r);
  train_from(&r, noenv, "1", base, (const char *const[]){"--steps", "1", "--batch", "8", "--load-weights", p, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  train_from(&r, noenv, "1", base, (const char *const[]){"--steps", "0", "--classes", "5", NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "the data has 10 classes of 1x28x28 images, not as given: --classes 5"),
                "exit %d\n%s", r.code, r.err);
  gwrun_free(&r);
  /* All three given: still checked against the data (training refuses them). */
  train_from(&r, noenv, "1", base,
             (const char *const[]){"--steps", "0", "--classes", "5", "--in-channels", "1", "--image-size", "28",
                                   NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "not as given: --classes 5"), "exit %d\n%s", r.code, r.err);
  gwrun_free(&r);
  train_from(&r, noenv, "1", base,
             (const char *const[]){"--steps", "0", "--classes", "10", "--in-channels", "1", "--image-size", "28",
                                   NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "resnet18, 10 classes, 1 input channels, 28x28"), "%s", r.out);
  gwrun_free(&r);
  /* Without --data: torchvision's resnet18() (what loads there without changes). */
  train_from(&r, noenv, "1", (const char *const[]){"--model", "resnet18", "--width-divisor", "16", NULL},
             (const char *const[]){"--steps", "0", NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "resnet18, 1000 classes, 3 input channels, 224x224, imagenet stem"), "%s", r.out);
  gwrun_free(&r);
}
END_TEST

/* --save-weights' file: the temporary files of saves to it that died go
 * before it is written (they stayed forever, a whole model each), by the
 * checkpoint folder's rule (a dead writer's, also one named with a live pid;
 * a live writer's, locked, stays), after training and with --steps 0.
 * Another file's, and names the writer never makes, are left. */
/* A weights file holding a NaN or an infinity is refused where it is loaded,
 * naming the file and the tensor: training from it failed at its first step
 * blaming the learning rate (a running variance's NaN only when the weights
 * were saved at the end, the run lost), and --steps 0 saved it again. */
START_TEST(test_load_weights_nonfinite) {
  char bad[512], out[512];
  path(bad, sizeof bad, "nf-bad.safetensors");
  path(out, sizeof out, "nf-out.safetensors");
  struct run r;
  const char *const noenv[] = {NULL};
  static const struct {
    const char *tensor, *shown;
    float v;
    const char *said;
  } cases[] = {{"conv1.weight", "conv1.weight[0] = nan", NAN, "holds a value that is not finite"},
               {"bn1.running_var", "bn1.running_var[0] = inf", INFINITY, "holds a value that is not finite"},
               /* a flipped sign bit: the evaluation's NaN throughout, exit 0 */
               {"bn1.running_var", "bn1.running_var[0] = -5", -5, "holds a batch-norm variance below 0"}};
  for (int k = 0; k < 3; k++) {
    weights_with("nf-good.safetensors", bad, cases[k].tensor, cases[k].v);
    for (int steps = 0; steps < 2; steps++) {
      unlink(out);
      train(&r, noenv, "1",
            (const char *const[]){"--steps", steps ? "1" : "0", "--batch", "8", "--load-weights", bad,
                                  "--save-weights", out, NULL});
      ck_assert_msg(r.code != 0 && strstr(r.err, bad) && strstr(r.err, cases[k].said) &&
                        strstr(r.err, cases[k].shown),
                    "--steps %d --load-weights with %s: exit %d\n%s", steps, cases[k].shown, r.code, r.err);
      ck_assert_msg(!exists(out), "--steps %d: a model loaded with %s was saved", steps, cases[k].shown);
      gwrun_free(&r);
    }
  }
}
END_TEST

/* A weights file of gw-train's carries a checksum (gradwire_checksum): one
 * flipped bit of a tensor is refused by it, naming the file (a weight of
 * 1e37 evaluated to nonsense, exit 0).  Another width's file names both
 * models (only the first tensor whose shape differed was said). */
START_TEST(test_load_weights_checksum) {
  char good[512], flipped[512];
  path(good, sizeof good, "sum-good.safetensors");
  path(flipped, sizeof flipped, "sum-flipped.safetensors");
  struct run r;
  const char *const noenv[] = {NULL};
  train(&r, noenv, "1", (const char *const[]){"--steps", "0", "--save-weights", good, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  train(&r, noenv, "1", (const char *const[]){"--steps", "0", "--load-weights", good, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  size_t len;
  char *bytes = slurp("sum-good.safetensors", &len);
  ck_assert(len > 100);
  /* an exponent bit of the first float of the data (conv1.weight's: the
   * writer's first), after the 8-byte header length and the header */
  uint64_t hl = 0;
  memcpy(&hl, bytes, 8);
  ck_assert(8 + hl + 4 <= len);
  bytes[8 + hl + 3] ^= 0x40;
  FILE *f = fopen(flipped, "wb");
  ck_assert(f && fwrite(bytes, 1, len, f) == len && fclose(f) == 0);
  free(bytes);
  train(&r, noenv, "1", (const char *const[]){"--steps", "0", "--load-weights", flipped, NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, flipped) && strstr(r.err, "its gradwire_checksum") &&
                    strstr(r.err, "does not match its contents"),
                "a flipped bit: exit %d\n%s", r.code, r.err);
  gwrun_free(&r);
  /* COMMON's width divisor is 8 */
  train(&r, noenv, "1", (const char *const[]){"--steps", "0", "--width-divisor", "16", "--load-weights", good, NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "(the file holds resnet18 ") && strstr(r.err, "width_divisor=8; this "
                    "model is resnet18 ") && strstr(r.err, "width_divisor=16)"),
                "another width: exit %d\n%s", r.code, r.err);
  gwrun_free(&r);
}
END_TEST

/* A checkpoint goes on at another world size or batch through
 * --load-weights (a resume there is refused, and now says so): its weights,
 * BN statistics and counters, exactly (the weights saved from it equal those
 * a resume at its step saves); another model's checkpoint, and a damaged one,
 * are refused naming what. */
START_TEST(test_load_weights_from_checkpoint) {
  char dir[512], ckpt[600], w_resumed[512], w_loaded[512], damaged[512];
  path(dir, sizeof dir, "lw-ckpt");
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-2.safetensors", dir);
  path(w_resumed, sizeof w_resumed, "lw-resumed.safetensors");
  path(w_loaded, sizeof w_loaded, "lw-loaded.safetensors");
  path(damaged, sizeof damaged, "lw-damaged.safetensors");
  struct run r;
  const char *const noenv[] = {NULL};
  train(&r, noenv, "1", (const char *const[]){"--steps", "2", "--batch", "8", "--checkpoint-dir", dir, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  /* at 2 ranks of 4: refused as a resume, with the way on */
  train(&r, noenv, "2",
        (const char *const[]){"--steps", "3", "--batch", "4", "--checkpoint-dir", dir, "--resume", NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "world 1 -> 2, batch 8 -> 4") &&
                    strstr(r.err, "start a new run from its weights: --load-weights with that file"),
                "a resume at another world and batch: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  train(&r, noenv, "2", (const char *const[]){"--steps", "1", "--batch", "4", "--load-weights", ckpt, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  /* the values: a resume with nothing left saves the checkpoint's (a
   * --load-weights beside it is said to be unused) */
  train(&r, noenv, "1",
        (const char *const[]){"--steps", "2", "--batch", "8", "--checkpoint-dir", dir, "--resume", "--save-weights",
                              w_resumed, "--load-weights", ckpt, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "resumed from ") && strstr(r.out, "is not used: the weights are the checkpoint's") &&
                    !strstr(r.out, "no checkpoint in"),
                "a resume beside --load-weights:\n%s", r.out);
  gwrun_free(&r);
  train(&r, noenv, "1", (const char *const[]){"--steps", "0", "--load-weights", ckpt, "--save-weights", w_loaded, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  ck_assert_msg(same_file(w_resumed, w_loaded), "the weights loaded from %s are not the checkpoint's", ckpt);
  /* another model (more classes) */
  train(&r, noenv, "1",
        (const char *const[]){"--steps", "1", "--batch", "8", "--classes", "5", "--load-weights", ckpt, NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "a checkpoint of another model (resnet18 classes=4 ") &&
                    strstr(r.err, "this run's: resnet18 classes=5 "),
                "another model's checkpoint: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  /* one byte of its weights changed: the checksum says so */
  FILE *in = fopen(ckpt, "rb"), *out = fopen(damaged, "wb");
  ck_assert(in && out);
  char buf[1 << 16];
  size_t n, at = 0;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
    if (at + n > 6000 && at <= 6000) buf[6000 - at] ^= 0x10;
    ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    at += n;
  }
  fclose(in);
  ck_assert_int_eq(fclose(out), 0);
  train(&r, noenv, "1", (const char *const[]){"--steps", "0", "--load-weights", damaged, NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "checkpoint refused: its checksum") && strstr(r.err, "the file is damaged"),
                "a damaged checkpoint as weights: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

START_TEST(test_weights_stale_temps_removed) {
  char weights[512], dead[600], reused[600], live[600], other[600], odd[600], dead0[600];
  path(weights, sizeof weights, "w-temps.safetensors");
  const unsigned tag = gw_st_host_tag();
  snprintf(dead, sizeof dead, "%s.tmp.%08x.999999999.0", weights, tag);
  snprintf(reused, sizeof reused, "%s.tmp.%08x.%ld.4", weights, tag, (long)getpid());
  snprintf(live, sizeof live, "%s.tmp.%08x.%ld.3", weights, tag, (long)getpid());
  snprintf(dead0, sizeof dead0, "%s.tmp.%08x.999999999.1", weights, tag);
  path(other, sizeof other, "old-w-temps.safetensors"); /* another file, whose name ends in this one's */
  const size_t n = strlen(other);
  snprintf(other + n, sizeof other - n, ".tmp.%08x.999999999.0", tag);
  snprintf(odd, sizeof odd, "%s.tmp.%08x.999999999.x", weights, tag);
  plant((const char *const[]){dead, reused, live, other, odd}, 5, 3600);
  const int live_fd = lock_live(live);
  struct run r;
  const char *const noenv[] = {NULL};
  train(&r, noenv, "1", (const char *const[]){"--steps", "1", "--batch", "8", "--save-weights", weights, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  ck_assert_msg(exists(weights) && !exists(dead) && !exists(reused) && exists(live),
                "the dead saves' temporary files should go (also one named with a live pid), the live one's stay");
  ck_assert_msg(exists(other) && exists(odd), "another file's temporary file, or a name no save makes, was removed");
  plant((const char *const[]){dead0}, 1, 3600);
  /* a save killed seconds ago (a restart's SIGKILL): unlocked, its pid no
   * process (it was kept while under 10 s old) */
  char fresh_dead[600];
  snprintf(fresh_dead, sizeof fresh_dead, "%s.tmp.%08x.999999999.2", weights, tag);
  plant((const char *const[]){fresh_dead}, 1, 3);
  train(&r, noenv, "1", (const char *const[]){"--steps", "0", "--save-weights", weights, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  ck_assert_msg(!exists(dead0) && !exists(fresh_dead) && exists(live),
                "--steps 0: the dead saves' temporary files should go (a fresh one too), the live one's stay");
  close(live_fd);
  /* Saved through a symbolic link into another folder: the writer's
   * temporary files are next to the file it names, and are looked for there. */
  char real_dir[512], link[512], far[600];
  path(real_dir, sizeof real_dir, "w-temps-real");
  path(link, sizeof link, "w-temps-link.safetensors");
  snprintf(far, sizeof far, "%s/w.safetensors.tmp.%08x.999999999.0", real_dir, tag);
  ck_assert(mkdir(real_dir, 0755) == 0 && symlink("w-temps-real/w.safetensors", link) == 0);
  plant((const char *const[]){far}, 1, 3600);
  char real_file[600];
  snprintf(real_file, sizeof real_file, "%s/w.safetensors", real_dir);
  size_t wlen; /* the link names a file: weights an earlier save wrote (another file is not replaced) */
  char *w = slurp("w-temps.safetensors", &wlen);
  FILE *wf = fopen(real_file, "wb");
  ck_assert(wf && fwrite(w, 1, wlen, wf) == wlen && fclose(wf) == 0);
  free(w);
  train(&r, noenv, "1", (const char *const[]){"--steps", "0", "--save-weights", link, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  struct stat sb;
  ck_assert_msg(!exists(far), "a dead save's temporary file next to the linked file stayed");
  ck_assert_msg(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "the save replaced the symbolic link");
}
END_TEST

/* Outputs named as the run's input or as the checkpoint folder's own files:
 * refused before any work (the metrics were appended to --load-weights's
 * file, the plot written over it; --save-weights over ckpt-N was taken for a
 * damaged checkpoint at the next resume), the input left as it was. */
START_TEST(test_outputs_spare_inputs) {
  char w[512], dir[512], in_dir[600], want[1400];
  path(w, sizeof w, "spare-w.safetensors");
  FILE *f = fopen(w, "w");
  ck_assert_ptr_nonnull(f);
  fputs("the weights", f);
  fclose(f);
  refused((const char *const[]){"--steps", "2", "--load-weights", w, "--metrics", w, NULL},
          "is --load-weights's file: the run would write over the weights it starts from");
  snprintf(want, sizeof want, "--plot %s is --load-weights's file", w);
  refused((const char *const[]){"--steps", "2", "--load-weights", w, "--plot", w, NULL}, want);
  path(dir, sizeof dir, "spare-ck");
  snprintf(in_dir, sizeof in_dir, "%s/ckpt-4.safetensors", dir);
  refused((const char *const[]){"--steps", "2", "--checkpoint-dir", dir, "--save-weights", in_dir, NULL},
          "is a name of --checkpoint-dir's own files (ckpt-<step>.safetensors*, .gw-train.lock)");
  snprintf(in_dir, sizeof in_dir, "%s/./.gw-train.lock", dir);
  snprintf(want, sizeof want, "--metrics %s is a name of --checkpoint-dir's own files", in_dir);
  refused((const char *const[]){"--steps", "2", "--checkpoint-dir", dir, "--metrics", in_dir, NULL}, want);
  /* Another name of the same file (a hard link): the path comparison let
   * it through, and the metrics were appended to the weights. */
  char hard[600];
  snprintf(hard, sizeof hard, "%s.hard", w);
  unlink(hard);
  ck_assert_int_eq(link(w, hard), 0);
  refused((const char *const[]){"--steps", "2", "--load-weights", w, "--metrics", hard, NULL},
          "is --load-weights's file: the run would write over the weights it starts from");
  refused((const char *const[]){"--steps", "2", "--save-weights", w, "--metrics", hard, NULL},
          "--metrics and --save-weights name the same file");
  /* a hard link of a checkpoint in the folder, and a checkpoint name in
   * another run's folder (one with a lock file: --save-weights replaced its
   * checkpoint) */
  char ck[700], lock[700], other[700];
  ck_assert_int_eq(mkdir(dir, 0755) == 0 || errno == EEXIST, 1);
  snprintf(ck, sizeof ck, "%s/ckpt-2.safetensors", dir);
  unlink(hard);
  f = fopen(ck, "w");
  ck_assert_ptr_nonnull(f);
  fputs("a checkpoint", f);
  fclose(f);
  ck_assert_int_eq(link(ck, hard), 0);
  snprintf(want, sizeof want, "--metrics %s is another name (a hard link) of %s", hard, dir);
  refused((const char *const[]){"--steps", "2", "--checkpoint-dir", dir, "--metrics", hard, NULL}, want);
  /* --save-weights is renamed into place, replacing that name only: a hard
   * link that keeps a checkpoint from the pruning may take it (the run gets
   * to its data) */
  refused((const char *const[]){"--steps", "2", "--checkpoint-dir", dir, "--resume", "--save-weights", hard,
                                "--data", "imagenet:/nonexistent", NULL},
          "imagenet: cannot open /nonexistent/train");
  snprintf(lock, sizeof lock, "%s/.gw-train.lock", dir);
  f = fopen(lock, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  snprintf(other, sizeof other, "%s/ckpt-4.safetensors", dir);
  refused((const char *const[]){"--steps", "2", "--save-weights", other, NULL},
          "is a name of a checkpoint folder's own files (the folder has a .gw-train.lock)");
  /* fine-tuning a checkpoint in place is that run's files' owner's call: it
   * gets past the options (and fails on the file, no checkpoint here) ... */
  refused((const char *const[]){"--steps", "2", "--load-weights", ck, "--save-weights", ck, NULL},
          "(not a safetensors file?)");
  /* ... unless a running gw-train holds the folder (this process, here) */
  const int lfd = open(lock, O_RDWR);
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  ck_assert_int_eq(lfd >= 0 && fcntl(lfd, F_OFD_SETLK, &fl) == 0, 1);
  refused((const char *const[]){"--steps", "2", "--load-weights", ck, "--save-weights", ck, NULL},
          "and a running gw-train holds that folder (.gw-train.lock)");
  close(lfd);
  unlink(hard), unlink(ck), unlink(lock);
  /* names no save or pruning touches there are the user's to take (a bare
   * "ckpt-" prefix was refused) */
  char metrics[600];
  snprintf(metrics, sizeof metrics, "%s/ckpt-metrics.jsonl", dir);
  struct run r;
  train(&r, (const char *const[]){NULL}, "1",
        (const char *const[]){"--steps", "1", "--checkpoint-dir", dir, "--metrics", metrics, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  ck_assert_msg(exists(metrics), "no %s", metrics);
  char back[64] = "";
  f = fopen(w, "r");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(fgets(back, sizeof back, f));
  fclose(f);
  ck_assert_str_eq(back, "the weights");
}
END_TEST

void add_weights_tests(TCase *tc) {
  tcase_add_test(tc, test_outputs_spare_inputs);
  tcase_add_test(tc, test_load_weights_checksum);
  tcase_add_test(tc, test_steps0_takes_data_shape);
  tcase_add_test(tc, test_weights_stale_temps_removed);
  tcase_add_test(tc, test_load_weights_nonfinite);
  tcase_add_test(tc, test_load_weights_from_checkpoint);
}

void add_weights_numerics_tests(TCase *tc) {
  tcase_add_test(tc, test_bf16_wire_close_to_fp32);
  tcase_add_test(tc, test_amp_bf16_follows_fp32);
  tcase_add_test(tc, test_wd_all);
  tcase_add_test(tc, test_loss_scaling);
  tcase_add_test(tc, test_two_ranks_equal_one_rank_double_batch);
}
