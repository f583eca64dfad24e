/* test_train.c - gw-train end to end through gw-run (GW_RUN_BIN, GW_TRAIN_BIN),
 * on the synthetic dataset with a narrow ResNet-18 so each run takes seconds:
 * - what training computes against float32, one rank, the flags
 *   (test_train_weights.c);
 * - checkpoints and resume (test_train_ckpt.c; their metadata: test_train_ckpt_meta.c);
 * - an image folder with damaged files (test_train_data.c);
 * - bad and contradictory flags are refused before any work, naming the flag.
 * Exits 77 (skipped) when gw-train cannot train (built without oneDNN).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gradwire.h"
#include "gw_config.h"
#include "gwrun_helpers.h"
#include "resnet.h"
#include "safetensors.h"
#include "test_train.h"

char tmpdir[256];

const char *train_bin(void) { return getenv("GW_TRAIN_BIN"); }

void path(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmpdir, name); }

void train_from(struct run *r, const char *const *env, const char *ranks, const char *const *base,
                const char *const *extra) {
  const char *args[80] = {"-n", ranks, train_bin()};
  int n = 3;
  for (int i = 0; base[i]; i++) args[n++] = base[i];
  for (int i = 0; extra[i]; i++) args[n++] = extra[i];
  args[n] = NULL;
  gwrun_start(r, env, args);
  gwrun_wait(r, 120);
  ck_assert_msg(!r->timed_out, "gw-train did not finish in 120 s\nstdout:\n%s\nstderr:\n%s", r->out, r->err);
}

void train(struct run *r, const char *const *env, const char *ranks, const char *const *extra) {
  train_from(r, env, ranks, (const char *const[]){COMMON, NULL}, extra);
}

/* The value of `key` in each training line of a metrics file, by step;
 * returns how many lines had it. */
int metrics_by_step(const char *file, const char *key, char val[][32], int max) {
  FILE *f = fopen(file, "r");
  ck_assert_msg(f, "no metrics file %s", file);
  char line[1024], pat[64], fmt[96];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  snprintf(fmt, sizeof fmt, "%s%%31[^,}]", pat);
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    long long step;
    char l[32];
    const char *p = strstr(line, "\"step\":"), *q = strstr(line, pat);
    if (!strstr(line, "\"type\":\"train\"") || !p || !q || sscanf(p, "\"step\":%lld", &step) != 1 ||
        sscanf(q, fmt, l) != 1 || step < 1 || step > max)
      continue;
    snprintf(val[step - 1], 32, "%s", l);
    n++;
  }
  fclose(f);
  return n;
}

int same_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa && fb;
  while (same) {
    int ca = fgetc(fa), cb = fgetc(fb);
    if (ca != cb) same = 0;
    if (ca == EOF || cb == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

void expect_ok(struct run *r) {
  ck_assert_msg(r->code == 0, "gw-train exited %d\nstdout:\n%s\nstderr:\n%s", r->code, r->out, r->err);
}

/* The tensor named name of file f, as floats (copied: data may be unaligned). */
float *floats(struct gw_st_file *f, const char *name, size_t *n) {
  const struct gw_st_tensor *t = gw_st_find(f, name);
  ck_assert_msg(t && t->dtype == GW_FLOAT32, "no float tensor %s", name);
  *n = t->nbytes / sizeof(float);
  float *v = malloc(t->nbytes + 1);
  memcpy(v, t->data, t->nbytes);
  return v;
}

struct gw_st_file *open_st(const char *name) {
  char p[512];
  path(p, sizeof p, name);
  struct gw_st_file *f = NULL;
  ck_assert_msg(gw_st_open(&f, p) == GW_SUCCESS, "%s", gw_model_last_error());
  return f;
}

char *slurp(const char *name, size_t *len) {
  char p[512];
  path(p, sizeof p, name);
  FILE *f = fopen(p, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", p);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  rewind(f);
  char *b = malloc(*len + 1);
  ck_assert(b && fread(b, 1, *len, f) == *len);
  b[*len] = 0;
  fclose(f);
  return b;
}

/* The trainer's device paths, driven by the cpu backend pretending its memory
 * is a device's (GW_TRAIN_CPU_AS_DEVICE=1): resident (the default: weights,
 * gradients and momentum stay in backend memory, the buckets are allreduced
 * there during backward, the backend's sgd_step) and --host-step (the model
 * goes up before each step, the gradients come down bucket by bucket during
 * backward, the optimizer on the host).  Both give the host path's weights bit
 * for bit, also with loss scaling and a forced overflow (the backend's
 * nonfinite check, the unscale fused into the step), with a bfloat16
 * gradient wire, and at one rank (no bucketer). */
static void same_weights(const char *what, const char *a_file, const char *b_file) {
  size_t n1, n2;
  char *a = slurp(a_file, &n1), *b = slurp(b_file, &n2);
  ck_assert_msg(n1 == n2 && !memcmp(a, b, n1), "weights trained %s differ from the host path's", what);
  free(a), free(b);
}

static void device_paths_case(const char *tag, const char *ranks, const char *env1, const char *const *flags) {
  char host[512], res[512], hs[512], hn[128], rn[128], sn[128];
  snprintf(hn, sizeof hn, "%s-host.safetensors", tag), path(host, sizeof host, hn);
  snprintf(rn, sizeof rn, "%s-resident.safetensors", tag), path(res, sizeof res, rn);
  snprintf(sn, sizeof sn, "%s-hoststep.safetensors", tag), path(hs, sizeof hs, sn);
  const char *const env[] = {env1, NULL}, *const devenv[] = {"GW_TRAIN_CPU_AS_DEVICE=1", env1, NULL};
  const char *args[32] = {"--steps", "3", "--batch", "8", "--save-weights", host};
  int n = 6;
  for (int i = 0; flags[i]; i++) args[n++] = flags[i];
  struct run r;
  train(&r, env, ranks, args);
  expect_ok(&r);
  gwrun_free(&r);
  args[5] = res;
  train(&r, devenv, ranks, args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "(device memory; weights, gradients and optimizer there)") &&
                    strstr(r.out, strcmp(ranks, "1") ? "allreduce overlapped with backward" : "no allreduce"),
                "%s: the resident device path (with overlap at more ranks) was not taken:\n%s", tag, r.out);
  gwrun_free(&r);
  args[5] = hs, args[n] = "--host-step";
  train(&r, devenv, ranks, args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "master weights and optimizer on the host: --host-step"),
                "%s: --host-step was not taken:\n%s", tag, r.out);
  gwrun_free(&r);
  char what[160];
  snprintf(what, sizeof what, "(%s) with the weights on the backend", tag);
  same_weights(what, hn, rn);
  snprintf(what, sizeof what, "(%s) with --host-step", tag);
  same_weights(what, hn, sn);
}

START_TEST(test_device_path_equals_host) {
  device_paths_case("fp32", "2", NULL, (const char *const[]){NULL});
  device_paths_case("scaled", "2", "GW_TRAIN_OVERFLOW_AT_STEP=2",
                    (const char *const[]){"--amp", "bf16", "--loss-scale", "dynamic", "--nesterov", NULL});
  device_paths_case("wire", "2", NULL, (const char *const[]){"--grad-wire", "bf16", NULL});
  /* one rank: no bucketer (the gradients come down in one piece for --host-step) */
  device_paths_case("one-rank", "1", "GW_TRAIN_OVERFLOW_AT_STEP=2",
                    (const char *const[]){"--amp", "bf16", "--loss-scale", "dynamic", NULL});
}
END_TEST

/* Channels-last activations (--layout nhwc, the default on cpu at 28x28) train the same weights as NCHW,
 * bit for bit (backend.h; the small stem has no max pool), on the host path
 * and on the resident device path (the cpu backend pretending: staged input
 * transposed by the executor), at 2 ranks, float32 and bfloat16. */
START_TEST(test_nhwc_equals_nchw) {
  static const char *const amp[] = {"off", "bf16"};
  for (int k = 0; k < 2; k++) {
    char ref[512], host[512], res[512], name[3][64];
    snprintf(name[0], 64, "layout-%s-nchw.safetensors", amp[k]), path(ref, sizeof ref, name[0]);
    snprintf(name[1], 64, "layout-%s-nhwc.safetensors", amp[k]), path(host, sizeof host, name[1]);
    snprintf(name[2], 64, "layout-%s-nhwc-dev.safetensors", amp[k]), path(res, sizeof res, name[2]);
    const char *const env[] = {NULL}, *const devenv[] = {"GW_TRAIN_CPU_AS_DEVICE=1", NULL};
    const char *args[] = {"--steps", "3", "--batch", "8", "--amp", amp[k], "--save-weights", ref, "--layout", "nchw",
                          NULL};
    struct run r;
    train(&r, env, "2", args);
    expect_ok(&r);
    ck_assert_msg(!strstr(r.out, "(NHWC)"), "--layout nchw was not taken:\n%s", r.out);
    gwrun_free(&r);
    args[7] = host, args[8] = NULL; /* the default on cpu for 28x28 images: NHWC (gw_backend_default_layout) */
    train(&r, env, "2", args);
    expect_ok(&r);
    ck_assert_msg(strstr(r.out, "on cpu (NHWC)"), "the default layout for 28x28 on cpu is not NHWC:\n%s", r.out);
    gwrun_free(&r);
    args[7] = res, args[8] = "--layout", args[9] = "nhwc";
    train(&r, devenv, "2", args);
    expect_ok(&r);
    ck_assert_msg(strstr(r.out, "(NHWC) (device memory; weights, gradients and optimizer there)"),
                  "the resident path in NHWC was not taken:\n%s", r.out);
    gwrun_free(&r);
    char what[96];
    snprintf(what, sizeof what, "in NHWC (--amp %s)", amp[k]);
    same_weights(what, name[0], name[1]);
    snprintf(what, sizeof what, "in NHWC on the device path (--amp %s)", amp[k]);
    same_weights(what, name[0], name[2]);
  }
}
END_TEST

#if GW_HAVE_IBVERBS
/* The gradients travel over the ib transport (the verbs emulator), sent
 * straight from the registered gradient buffer: the same weights as over shm,
 * bit for bit (the reductions run in the same order whatever moves the bytes). */
START_TEST(test_over_ib_equals_shm) {
  char shm[512], ib[512];
  path(shm, sizeof shm, "shm.safetensors");
  path(ib, sizeof ib, "ib.safetensors");
  struct run r;
  const char *const noenv[] = {NULL}, *const ibenv[] = {"GW_TRANSPORT=ib", "GW_IB_EMULATE=1", NULL};
  train(&r, noenv, "2", (const char *const[]){"--steps", "3", "--batch", "8", "--save-weights", shm, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  train(&r, ibenv, "2", (const char *const[]){"--steps", "3", "--batch", "8", "--save-weights", ib, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  size_t n1, n2;
  char *a = slurp("shm.safetensors", &n1), *b = slurp("ib.safetensors", &n2);
  ck_assert_msg(n1 == n2 && !memcmp(a, b, n1), "weights trained over ib differ from those over shm");
  free(a), free(b);
}
END_TEST
#endif


/* COMMON's initial weights, saved as tmpdir/init_name, written again to `out`
 * with every value of tensor `name` set to v. */
void weights_with(const char *init_name, const char *out, const char *name, float v) {
  char init[512];
  path(init, sizeof init, init_name);
  struct run r;
  const char *const noenv[] = {NULL};
  train(&r, noenv, "1", (const char *const[]){"--steps", "0", "--save-weights", init, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  struct gw_st_file *f = open_st(init_name);
  struct gw_st_tensor t[512];
  ck_assert_int_le(f->ntensors, 512);
  float *vals = NULL;
  for (int i = 0; i < f->ntensors; i++) {
    t[i] = f->tensors[i];
    if (!strcmp(t[i].name, name)) {
      vals = malloc(t[i].nbytes);
      for (size_t j = 0; j < t[i].nbytes / sizeof(float); j++) vals[j] = v;
      t[i].data = vals;
    }
  }
  ck_assert_msg(vals != NULL, "no %s in %s", name, init);
  ck_assert_msg(gw_st_write(out, t, f->ntensors, NULL) == GW_SUCCESS, "%s", gw_model_last_error());
  gw_st_free(f);
  free(vals);
}

/* A diverged model (NaN logits) scores 0% in the evaluation, not 100%: a NaN
 * compares false with everything, which used to leave the label on top.  Its
 * metrics stay JSON: the NaN loss is null (printf's nan broke every parser).
 * The NaN is in bn1's running variance, which training does not use (a NaN
 * training loss stops the run: test_nonfinite_step_stops) but evaluation does. */
START_TEST(test_nan_logits_score_zero) {
  char nan[512], metrics[512];
  path(nan, sizeof nan, "nan.safetensors");
  path(metrics, sizeof metrics, "nan-metrics.jsonl");
  struct run r;
  /* loaded as it is; resident on the (emulated) device, where the steps do not
   * look at the statistics (a host run stops at its first: test_nonfinite_model_not_saved) */
  const char *const hook_env[] = {"GW_TRAIN_TEST_LOAD_NONFINITE=1", "GW_TRAIN_CPU_AS_DEVICE=1", NULL};
  weights_with("nan-init.safetensors", nan, "bn1.running_var", NAN);
  /* COMMON without --no-eval */
  const char *args[] = {"-n", "1", train_bin(), "--data", "synthetic", "--synthetic-samples", "32", "--model",
                        "resnet18", "--width-divisor", "8", "--in-channels", "3", "--image-size", "16", "--classes",
                        "4", "--stem", "small", "--threads", "1", "--epochs", "1", "--batch", "16", "--lr", "0",
                        "--load-weights", nan, "--metrics", metrics, NULL};
  gwrun_start(&r, hook_env, args);
  gwrun_wait(&r, 120);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "evaluation: top-1 0.00%, top-5 n/a (fewer than 5 classes), loss nan"),
                "NaN logits did not score 0:\n%s", r.out);
  gwrun_free(&r);
  FILE *mf = fopen(metrics, "r");
  ck_assert_msg(mf != NULL, "no metrics file %s", metrics);
  char line[1024];
  int train_null = 0, eval_null = 0;
  while (fgets(line, sizeof line, mf)) {
    ck_assert_msg(!strstr(line, "nan") && !strstr(line, "inf"), "a metrics line JSON cannot read: %s", line);
    train_null += strstr(line, "\"type\":\"train\"") && strstr(line, "\"loss\":null");
    eval_null += strstr(line, "\"type\":\"eval\"") && strstr(line, "\"loss\":null") &&
                 strstr(line, "\"top5\":null"); /* 4 classes: no top-5 */
  }
  fclose(mf);
  ck_assert_msg(train_null == 0 && eval_null == 1, "NaN losses as null: %d train lines (0 wanted), %d eval (1)",
                train_null, eval_null);
}
END_TEST

/* A model holding a NaN (here bn1's running variance, loaded so) is never
 * saved: --save-weights writes nothing and a checkpoint is refused, each
 * naming the value, and the run ends with exit 1. */
START_TEST(test_nonfinite_model_not_saved) {
  char nan[512], w[512], dir[512], c1[600];
  path(nan, sizeof nan, "nan-var.safetensors");
  path(w, sizeof w, "nan-var-out.safetensors");
  path(dir, sizeof dir, "ckpt-nan-var");
  snprintf(c1, sizeof c1, "%s/ckpt-1.safetensors", dir);
  weights_with("nan-var-init.safetensors", nan, "bn1.running_var", NAN);
  struct run r;
  /* on the host the first step sees the statistics and stops, naming them (the
   * run trained on to its save, refused); resident on a device, the save's
   * check (below) is what sees them */
  const char *const host_env[] = {"GW_TRAIN_TEST_LOAD_NONFINITE=1", NULL}; /* loaded as it is */
  train(&r, host_env, "1", (const char *const[]){"--steps", "3", "--batch", "8", "--load-weights", nan,
                                              "--save-weights", w, NULL});
  ck_assert_msg(r.code == 1 && strstr(r.err, "step 1: a batch-norm running statistic is not finite, "
                                             "bn1.running_var[0] = nan, under a finite loss") && access(w, F_OK) != 0,
                "a host run with NaN statistics: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  const char *const hook_env[] = {"GW_TRAIN_TEST_LOAD_NONFINITE=1", "GW_TRAIN_CPU_AS_DEVICE=1", NULL};
  train(&r, hook_env, "1", (const char *const[]){"--steps", "1", "--batch", "8", "--load-weights", nan,
                                              "--save-weights", w, NULL});
  ck_assert_msg(r.code == 1 && strstr(r.err, "--save-weights: not written: the model holds a value that is not "
                                             "finite, bn1.running_var[0] = nan") && access(w, F_OK) != 0,
                "--save-weights of a NaN: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  train(&r, hook_env, "1", (const char *const[]){"--steps", "2", "--batch", "8", "--load-weights", nan,
                                              "--checkpoint-dir", dir, "--checkpoint-every", "1", NULL});
  ck_assert_msg(r.code == 1 && strstr(r.err, "checkpoint: not saved: the model holds a value that is not finite, "
                                             "bn1.running_var[0] = nan (the checkpoints already in") &&
                    access(c1, F_OK) != 0,
                "a checkpoint of a NaN: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* Every float32 value of weights file tmpdir/name is finite. */
static void expect_finite_weights(const char *name) {
  struct gw_st_file *f = open_st(name);
  for (int i = 0; i < f->ntensors; i++) {
    if (f->tensors[i].dtype != GW_FLOAT32) continue;
    size_t n;
    float *v = floats(f, f->tensors[i].name, &n);
    for (size_t j = 0; j < n; j++)
      ck_assert_msg(isfinite(v[j]), "%s: %s[%zu] = %g", name, f->tensors[i].name, j, v[j]);
    free(v);
  }
  gw_st_free(f);
}

/* A float16 gradient wire without loss scaling: the last block's batch norm
 * scaled up 1e6 makes the fc's gradients sum past 65504 on the ring, whose
 * partial sums are float16.  The step is skipped and said, and the weights
 * stay finite (the infinity went into every weight through SGD before). */
START_TEST(test_fp16_wire_overflow_skipped) {
  char big[512], out[512];
  path(big, sizeof big, "wire-big.safetensors");
  path(out, sizeof out, "wire-out.safetensors");
  struct run r;
  const char *const noenv[] = {NULL};
  weights_with("wire-init.safetensors", big, "layer4.1.bn2.weight", 1e6f);
  /* bfloat16 has float32's range: the same gradients train to finite
   * weights (so they are finite before the wire) */
  train(&r, noenv, "2",
        (const char *const[]){"--steps", "1", "--grad-wire", "bfloat16", "--load-weights", big, "--save-weights", out,
                              NULL});
  expect_ok(&r);
  gwrun_free(&r);
  expect_finite_weights("wire-out.safetensors");
  train(&r, noenv, "2",
        (const char *const[]){"--steps", "1", "--grad-wire", "float16", "--load-weights", big, "--save-weights", out,
                              NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "step 1: the gradients overflowed on the float16 wire"),
                "no overflow said:\n%s\n%s", r.out, r.err);
  gwrun_free(&r);
  expect_finite_weights("wire-out.safetensors");
}
END_TEST

/* Refused before any work: exit 2 and a message naming the flag.  gw-train
 * alone (one rank, no communicator), not under gw-run: the options are read
 * before either matters, and a second process per case cost 7 s under ASan. */
void refused(const char *const *args, const char *words) {
  struct run r;
  const char *const noenv[] = {NULL};
  gwrun_start_prog(&r, train_bin(), noenv, args);
  gwrun_wait(&r, 60);
  /* (the outputs' ends: Check's messages hold 4 KiB) */
  const size_t no = strlen(r.out), ne = strlen(r.err);
  ck_assert_msg(r.code != 0 && strstr(r.err, words), "expected a refusal mentioning '%.300s', got exit %d\n%s\n%s",
                words, r.code, r.out + (no > 1000 ? no - 1000 : 0), r.err + (ne > 2000 ? ne - 2000 : 0));
  gwrun_free(&r);
}

START_TEST(test_bad_flags) {
  refused((const char *const[]){"--epochs", "1", "--steps", "2", NULL}, "not both");
  refused((const char *const[]){"--steps", "2", "--resume", NULL}, "--resume needs --checkpoint-dir");
  refused((const char *const[]){"--steps", "2", "--bogus", NULL}, "--bogus");
  refused((const char *const[]){"--steps", "2", "--batch", "0", NULL}, "--batch");
  refused((const char *const[]){"--steps", "2", "--classes", "1", NULL}, "--classes wants a whole number in [2, ");
  refused((const char *const[]){"--steps", "2", "--lr", "fast", NULL}, "--lr");
  /* hexadecimal, which strtod reads (--lr 0x10 was 16), and a space before a whole number */
  refused((const char *const[]){"--steps", "2", "--lr", "0x10", NULL}, "--lr wants a number in [0, 1000], got '0x10'");
  refused((const char *const[]){"--steps", " 2", NULL}, "--steps wants a whole number");
  refused((const char *const[]){"--steps", "2", "--grad-wire", "int8", NULL}, "--grad-wire 'int8'");
  refused((const char *const[]){"--steps", "2", "--amp", "fp16", NULL}, "--amp fp16 needs --backend cudnn");
  refused((const char *const[]){"--steps", "2", "--loss-scale", "huge", NULL}, "--loss-scale");
  refused((const char *const[]){"--steps", "2", "--loss-scale", "0.5", NULL}, "of at least 1");
  refused((const char *const[]){"--steps", "2", "--loss-scale-init", "1024", NULL}, "needs --loss-scale dynamic");
  refused((const char *const[]){"--steps", "2", "--backend", "tpu", NULL}, "--backend 'tpu'");
  refused((const char *const[]){"--steps", "2", "--layout", "nchwc", NULL}, "--layout 'nchwc' is not nchw or nhwc");
  refused((const char *const[]){"--steps", "2", "--first-bucket-mb", "0", NULL},
          "--first-bucket-mb wants a number in [0.000976562, 1.04858e+06], got '0'");
  refused((const char *const[]){"--steps", "2", "--first-bucket-mb", "1M", NULL}, "--first-bucket-mb");
  refused((const char *const[]){NULL}, "--epochs E or --steps S");
  refused((const char *const[]){"--steps", "2", "--data", "imagenet:/nonexistent", NULL}, "/nonexistent");
  refused((const char *const[]){"--steps", "2", "--data", "fashion-mnist:", NULL}, "no DIR after the colon");
  refused((const char *const[]){"--steps", "2", "--width-divisor", "3", NULL}, "'3' is not a power of two");
  refused((const char *const[]){"--steps", "2", "--data", "synthetic", "--classes", "5", "--batch", "100000",
                                "--synthetic-samples", "10", NULL},
          "--batch");
  /* batch 1 with layer4 at 1x1: one value per channel, refused before any step */
  refused((const char *const[]){"--steps", "1", "--data", "synthetic", "--image-size", "32", "--model", "resnet18",
                                "--width-divisor", "8", "--batch", "1", "--synthetic-samples", "8", "--no-eval", NULL},
          "batch norm layer4.0.bn1 sees 1 value per channel (batch 1 of 1x1); training needs at least 2: a batch of 2");
  refused((const char *const[]){"--steps", "2", "--synthetic-samples", "2305843009213693953", NULL},
          "--synthetic-samples wants a whole number in [1, 100000000]");
  /* two outputs under one name: one would replace the other */
  refused((const char *const[]){"--steps", "2", "--metrics", "/tmp/gw-same.out", "--save-weights",
                                "/tmp/../tmp/gw-same.out", NULL},
          "--metrics and --save-weights name the same file");
  refused((const char *const[]){"--steps", "2", "--plot", "/tmp/gw-p.png", "--metrics", "/tmp/gw-p.png.dat", NULL},
          "--metrics and --plot (its data, PNG.dat) name the same file");
  /* new files in / are distinct (the check took every one for "//"): this run gets to its data */
  refused((const char *const[]){"--steps", "2", "--metrics", "/gw-m.jsonl", "--save-weights", "/gw-w.safetensors",
                                "--plot", "/gw-p.png", "--data", "imagenet:/nonexistent", NULL},
          "imagenet: cannot open /nonexistent/train");
  refused((const char *const[]){"--steps", "2", "--plot", "/tmp/it's.png", NULL},
          "a quote or a line break in the path");
  refused((const char *const[]){"--steps", "2", "--load-weights", "", NULL}, "--load-weights: an empty file name");
  /* a directory where the plot's data or script goes; a mount that takes no
   * files though access() says yes to root (/proc): refused before the work */
  char pd[512], pdat[520];
  path(pd, sizeof pd, "side.png");
  snprintf(pdat, sizeof pdat, "%s.gp", pd);
  ck_assert_int_eq(mkdir(pdat, 0700), 0);
  char want[1200];
  snprintf(want, sizeof want, "--plot's script %s: is a directory", pdat);
  refused((const char *const[]){"--steps", "2", "--plot", pd, NULL}, want);
  rmdir(pdat);
  refused((const char *const[]){"--steps", "2", "--save-weights", "/proc/gw-w.safetensors", NULL},
          geteuid() == 0 ? "--save-weights /proc/gw-w.safetensors: cannot create files in /proc: "
                         : "--save-weights /proc/gw-w.safetensors: cannot write into /proc: ");
  /* an unknown short option in a bundle is named, not the argument before it */
  refused((const char *const[]){"--steps", "5", "-xy", NULL}, "unknown option or missing value: '-x'");
  /* the loader's batches in flight past half the machine's memory (they were OOM-killed) */
  refused((const char *const[]){"--steps", "1", "--data", "synthetic", "--image-size", "4096", "--batch", "64",
                                "--loader-threads", "256", "--synthetic-samples", "128", "--no-eval", NULL},
          "(--loader-threads 256, plus 2)");
  refused((const char *const[]){"--steps", "2", "--keep-checkpoints", "2", NULL},
          "--keep-checkpoints needs --checkpoint-dir");
  refused((const char *const[]){"--steps", "2", "--plot", "p.png", "--no-eval", NULL}, "drop --no-eval");
  refused((const char *const[]){"--steps", "2", "--tf32", "off", NULL}, "--tf32 applies to --backend cudnn");
  /* The schedule's: milestones with cosine, a factor cosine would ignore, out of order, zero. */
  refused((const char *const[]){"--steps", "2", "--schedule", "cosine", "--lr-milestones", "1", NULL},
          "--lr-milestones applies to --schedule step, not cosine");
  refused((const char *const[]){"--steps", "2", "--lr-gamma", "0.5", NULL},
          "--lr-gamma applies to --schedule step, not cosine (the default; --lr-milestones implies step)");
  refused((const char *const[]){"--steps", "2", "--lr-milestones", "30,20", NULL},
          "--lr-milestones '30,20': 20 is not after 30");
  refused((const char *const[]){"--steps", "2", "--lr-milestones", "30,", NULL},
          "--lr-milestones wants epochs in (0, 1e6] separated by commas, got '30,'");
  refused((const char *const[]){"--steps", "2", "--lr-milestones", "0", NULL}, "--lr-milestones wants epochs");
  refused((const char *const[]){"--steps", "2", "--schedule", "step", "--lr-gamma", "0", NULL},
          "--lr-gamma 0 would stop the training");
  refused((const char *const[]){"--steps", "2", "--warmup-start-factor", "1.5", NULL},
          "--warmup-start-factor wants a number in [0, 1]");
  refused((const char *const[]){"--steps", "2", "--warmup-epochs", "0", "--warmup-start-factor", "0.1", NULL},
          "--warmup-start-factor needs a warmup");
  /* Flags that would have done nothing, and a seed strtoull would have wrapped. */
  refused((const char *const[]){"--steps", "2", "--data", "imagenet:/x", "--augment", NULL},
          "--augment applies to fashion-mnist: imagenet:/x always trains on random resized crops and flips");
  refused((const char *const[]){"--steps", "2", "--data", "synthetic", "--augment", NULL},
          "--augment applies to fashion-mnist: synthetic has nothing to augment");
  refused((const char *const[]){"--steps", "2", "--data", "synthetic", "--val-resize-size", "256", NULL},
          "--val-resize-size applies to imagenet:DIR data: synthetic is not resized for its evaluation");
  refused((const char *const[]){"--steps", "2", "--data", "imagenet:/x", "--val-resize-size", "256", "--no-eval", NULL},
          "--val-resize-size sets the evaluation's resize: it needs the evaluation (drop --no-eval)");
  refused((const char *const[]){"--steps", "2", "--val-resize-size", "4", NULL}, "--val-resize-size");
  refused((const char *const[]){"--steps", "2", "--data", "synthetic", "--val-crop-size", "224", NULL},
          "--val-crop-size applies to imagenet:DIR data: synthetic is evaluated at its own size");
  refused((const char *const[]){"--steps", "2", "--data", "imagenet:/x", "--val-crop-size", "224", "--no-eval", NULL},
          "--val-crop-size sets the evaluation's crop: it needs the evaluation (drop --no-eval)");
  refused((const char *const[]){"--steps", "2", "--val-crop-size", "4", NULL}, "--val-crop-size");
  refused((const char *const[]){"--test-only", "--load-weights", "w", "--data", "imagenet:/x", "--val-crop-size", "48",
                                 "--train-crop-size", "40", NULL},
          "--test-only evaluates at the evaluation's crop: --val-crop-size 48 with --train-crop-size 40 (the "
          "training's size) is ambiguous: give one");
  refused((const char *const[]){"--steps", "2", "--train-crop-size", "0", NULL}, "--train-crop-size");
  refused((const char *const[]){"--steps", "2", "--synthetic-samples", "10", NULL},
          "--synthetic-samples applies to --data synthetic, not fashion-mnist");
  refused((const char *const[]){"--steps", "2", "--seed", " -1", NULL}, "--seed wants a non-negative whole number");
  /* Output paths, checked before the data is even opened. */
  refused((const char *const[]){"--steps", "2", "--save-weights", "/nonexistent-gw/w.safetensors", NULL},
          "--save-weights /nonexistent-gw/w.safetensors: its directory /nonexistent-gw does not exist");
  refused((const char *const[]){"--steps", "2", "--save-weights", tmpdir, NULL}, "is a directory");
  /* What the writer would refuse at the end, refused before training: a
   * symbolic link to nothing, and a file renaming over it would replace. */
  char dangling[512], fifo[512];
  path(dangling, sizeof dangling, "dangling-w.safetensors");
  path(fifo, sizeof fifo, "w.fifo");
  unlink(dangling), unlink(fifo);
  ck_assert(symlink("/nonexistent-gw/w.safetensors", dangling) == 0 && mkfifo(fifo, 0600) == 0);
  refused((const char *const[]){"--steps", "2", "--save-weights", dangling, NULL},
          "dangling-w.safetensors: a symbolic link that cannot be followed: what it names does not exist");
  refused((const char *const[]){"--steps", "2", "--save-weights", fifo, NULL}, "w.fifo: not a regular file");
  /* the plot's FIFO held gnuplot, and so the run, for ever; the metrics'
   * without a reader held the run in open() */
  refused((const char *const[]){"--steps", "2", "--plot", fifo, NULL}, "w.fifo: not a regular file");
  refused((const char *const[]){"--steps", "2", "--metrics", fifo, NULL}, "w.fifo: a FIFO with no reader");
  /* a link to nothing as the metrics: open() makes what it names, where it
   * names (the link's own directory was checked) */
  refused((const char *const[]){"--steps", "2", "--metrics", dangling, NULL},
          "dangling-w.safetensors -> /nonexistent-gw/w.safetensors: its directory /nonexistent-gw does not exist");
  /* A name with no room for its temporary file's suffix (255 here): it failed
   * only when written, after the training. */
  char longname[700], base[241];
  memset(base, 'w', sizeof base - 1), base[sizeof base - 1] = 0;
  path(longname, sizeof longname, base);
  refused((const char *const[]){"--steps", "2", "--save-weights", longname, NULL},
          "the file name is 240 characters long; at most 223 here");
  /* the plot's temporary names add 8 (".dat.tmp"), not the weights' 32: 240
   * passes (the run goes on to its data), 250 does not */
  refused((const char *const[]){"--steps", "2", "--plot", longname, "--data", "imagenet:/nonexistent", NULL},
          "imagenet: cannot open /nonexistent/train");
  char longer[700], base250[251];
  memset(base250, 'p', sizeof base250 - 1), base250[sizeof base250 - 1] = 0;
  path(longer, sizeof longer, base250);
  refused((const char *const[]){"--steps", "2", "--plot", longer, NULL},
          "the file name is 250 characters long; at most 247 here (its temporary file's name adds 8 to it");
  refused((const char *const[]){"--steps", "2", "--checkpoint-dir", "/dev/null/gw/a", NULL},
          "--checkpoint-dir /dev/null/gw/a: cannot create it");
  refused((const char *const[]){"--steps", "2", "--checkpoint-dir", "/proc/self/status", NULL}, "not a directory");
  /* before the data (it was opened after the data and the model) */
  refused((const char *const[]){"--steps", "2", "--metrics", "/nonexistent-gw/m.jsonl", "--data",
                                 "imagenet:/nonexistent", NULL},
          "--metrics /nonexistent-gw/m.jsonl: its directory /nonexistent-gw does not exist");
  refused((const char *const[]){"--steps", "2", "--classes", "5", NULL},
          "not as given: --classes 5 (left out, they are the data's)");
  refused((const char *const[]){"--steps", "2", "--data", "synthetic", "--host-step", NULL},
          "--host-step: the cpu backend's weights");
  /* Names past PATH_MAX, with their temporary file's: refused before training
   * (the weights were not written after it, the message cut off before its
   * reason); "./" steps make one of existing folders. */
  char deep[4200];
  int used = snprintf(deep, sizeof deep, "%s/", tmpdir);
  while (used < 4060) used += snprintf(deep + used, sizeof deep - (size_t)used, "./");
  snprintf(deep + used, sizeof deep - (size_t)used, "w.safetensors");
  refused((const char *const[]){"--steps", "2", "--save-weights", deep, NULL},
          "so that its temporary file's name (up to 32 bytes longer) stays within PATH_MAX");
  snprintf(deep + used, sizeof deep - (size_t)used, "%0100d.jsonl", 0);
  refused((const char *const[]){"--steps", "2", "--metrics", deep, NULL}, "; at most 4095 (PATH_MAX)");
  /* --metrics onto a file that holds no metrics (saved weights): refused, the
   * file kept (the lines went on its end, and the weights no longer loaded) */
  char weights[512];
  path(weights, sizeof weights, "not-metrics.safetensors");
  FILE *f = fopen(weights, "wb");
  ck_assert(f && fwrite("\x02\0\0\0\0\0\0\0{}", 1, 10, f) == 10 && fclose(f) == 0);
  refused((const char *const[]){"--steps", "2", "--metrics", weights, NULL},
          "not-metrics.safetensors: holds something other than metrics (JSON lines, one object each, as gw-train "
          "writes them): it begins with binary data");
  struct stat st;
  ck_assert_msg(stat(weights, &st) == 0 && st.st_size == 10, "the refused metrics file changed");
  /* --save-weights and --plot onto a file they did not write (the run's own
   * dataset, notes, safetensors from elsewhere): refused, the file kept (it
   * was replaced without a word) */
  refused((const char *const[]){"--steps", "2", "--save-weights", weights, NULL},
          "not-metrics.safetensors: holds safetensors that gw-train did not write: name a new file");
  char notes[512];
  path(notes, sizeof notes, "notes.txt");
  f = fopen(notes, "w");
  ck_assert(f && fputs("precious\n", f) >= 0 && fclose(f) == 0);
  refused((const char *const[]){"--steps", "2", "--save-weights", notes, NULL},
          "notes.txt: holds something other than weights (no safetensors file)");
  refused((const char *const[]){"--epochs", "1", "--plot", notes, NULL}, "notes.txt: holds something other than a PNG image");
  /* The loaders' batches in flight against what a cgroup's memory limit
   * leaves (a fake v2 tree: 1 GiB at the job's level), not against the
   * machine's memory (in a container the machine's passed). */
  {
    char cg[512], file[700], fs_env[600], proc_env[760];
    path(cg, sizeof cg, "cgroup");
    snprintf(file, sizeof file, "%s/job", cg);
    ck_assert(mkdir(cg, 0755) == 0 && mkdir(file, 0755) == 0);
    const char *const files[3][2] = {{"cgroup.controllers", ""}, {"job/memory.max", "1073741824\n"},
                                     {"job/memory.current", "0\n"}};
    for (int i = 0; i < 3; i++) {
      snprintf(file, sizeof file, "%s/%s", cg, files[i][0]);
      f = fopen(file, "w");
      ck_assert(f && fputs(files[i][1], f) >= 0 && fclose(f) == 0);
    }
    snprintf(file, sizeof file, "%s/proc-cgroup", cg);
    f = fopen(file, "w");
    ck_assert(f && fputs("0::/job\n", f) >= 0 && fclose(f) == 0);
    snprintf(fs_env, sizeof fs_env, "GW_TEST_CGROUP_FS=%s", cg);
    snprintf(proc_env, sizeof proc_env, "GW_TEST_PROC_CGROUP=%s", file);
    const char *const env[] = {fs_env, proc_env, NULL};
    /* 4 batches (2 loader threads + 2) of 256 x 3x224x224 floats: 588 MiB, over half of 1 GiB */
    const char *const args[] = {"--data", "synthetic", "--image-size", "224", "--batch", "256", "--loader-threads", "2",
                                "--steps", "1", "--no-eval", "--model", "resnet18", "--width-divisor", "64", NULL};
    struct run r;
    gwrun_start_prog(&r, train_bin(), env, args);
    gwrun_wait(&r, 120);
    ck_assert_msg(r.code != 0 && strstr(r.err, "over half its 1.0 GiB (what its cgroup's memory limit leaves): lower "
                                               "--loader-threads"),
                  "the cgroup's limit: exit %d\n%s", r.code, r.err);
    gwrun_free(&r);
  }
  /* and onto the data or script beside the image (PNG.dat, PNG.gp): weights
   * saved under such a name were replaced without a word (a helper's probe) */
  char side_png[512], side[600];
  path(side_png, sizeof side_png, "side.png");
  for (int i = 0; i < 2; i++) {
    snprintf(side, sizeof side, "%s.%s", side_png, i ? "gp" : "dat");
    f = fopen(side, "w");
    ck_assert(f && fputs("precious\n", f) >= 0 && fclose(f) == 0);
    refused((const char *const[]){"--epochs", "1", "--plot", side_png, NULL},
            i ? "side.png.gp holds something other than a gnuplot script gw-train wrote: name a new file"
              : "side.png.dat holds something other than the plot's data gw-train wrote: name a new file");
    ck_assert_msg(stat(side, &st) == 0 && st.st_size == 9, "the refused %s changed", side);
    ck_assert_int_eq(unlink(side), 0);
  }
  /* --steps 0 (converting a checkpoint to weights) too: it skipped the check */
  refused((const char *const[]){"--steps", "0", "--save-weights", notes, NULL},
          "notes.txt: holds something other than weights (no safetensors file)");
  ck_assert_msg(stat(weights, &st) == 0 && st.st_size == 10 && stat(notes, &st) == 0 && st.st_size == 9,
                "a refused output file changed");
  /* weights from elsewhere (no gradwire_model): refused as an output, but
   * fine-tuned in place as the run's own --load-weights file */
  char foreign[512];
  path(foreign, sizeof foreign, "foreign-w.safetensors");
  weights_with("foreign-init.safetensors", foreign, "fc.bias", 0.25f);
  refused((const char *const[]){"--steps", "0", "--save-weights", foreign, NULL},
          "foreign-w.safetensors: holds safetensors that gw-train did not write");
  struct run r;
  train(&r, (const char *const[]){NULL}, "1",
        (const char *const[]){"--steps", "0", "--load-weights", foreign, "--save-weights", foreign, NULL});
  expect_ok(&r);
  gwrun_free(&r);
}
END_TEST

/* --first-bucket-mb sizes the first bucket (--bucket-mb the others): the run
 * names its buckets (176012 float gradients: 16384, then 65536 at most), and
 * its checkpoints keep the option among the run's. */
START_TEST(test_first_bucket_mb) {
  char dir[512];
  path(dir, sizeof dir, "ckpt-buckets");
  struct run r;
  const char *const noenv[] = {NULL};
  train(&r, noenv, "2", (const char *const[]){"--steps", "2", "--batch", "8", "--bucket-mb", "0.25",
                                              "--first-bucket-mb", "0.0625", "--checkpoint-dir", dir, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "allreduce overlapped with backward in 4 buckets (the first 0.0625 MiB, then 0.25 MiB)"),
                "the buckets were not named:\n%s", r.out);
  gwrun_free(&r);
  struct gw_st_file *f = open_st("ckpt-buckets/ckpt-2.safetensors");
  const char *opts = gw_st_metadata(f, "options");
  ck_assert_msg(opts && strstr(opts, " bucket_mb=0.25 first_bucket_mb=0.0625 "), "the saved options: %s", opts);
  gw_st_free(f);
}
END_TEST

/* One rank makes no allreduce (the log said so, yet a bucketer ran no-op
 * allreduces and the wait after them for the device was logged as exposed
 * communication): the metrics' comm figures are null, the log names none, a
 * --grad-wire is said to do nothing; two ranks still report theirs. */
START_TEST(test_one_rank_no_comm) {
  char m1[512], m2[512], v[2][32];
  path(m1, sizeof m1, "one-rank.jsonl");
  path(m2, sizeof m2, "two-ranks.jsonl");
  struct run r;
  const char *const noenv[] = {NULL};
  train(&r, noenv, "1", (const char *const[]){"--steps", "2", "--batch", "8", "--grad-wire", "bf16", "--metrics", m1,
                                              NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "no allreduce") && strstr(r.err, "--grad-wire bf16 has nothing to do"),
                "one rank's log:\n%s\n%s", r.out, r.err);
  ck_assert_msg(strstr(r.out, " img/s") && !strstr(r.out, "exposed comm"), "one rank's steps:\n%s", r.out);
  gwrun_free(&r);
  ck_assert_int_eq(metrics_by_step(m1, "comm_exposed_ms", v, 2), 2);
  ck_assert_msg(!strcmp(v[0], "null") && !strcmp(v[1], "null"), "one rank's exposed comm: %s, %s", v[0], v[1]);
  ck_assert_int_eq(metrics_by_step(m1, "comm_ms", v, 2), 2);
  ck_assert_msg(!strcmp(v[0], "null") && !strcmp(v[1], "null"), "one rank's comm: %s, %s", v[0], v[1]);
  train(&r, noenv, "2", (const char *const[]){"--steps", "2", "--batch", "4", "--metrics", m2, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "exposed comm"), "two ranks' steps:\n%s", r.out);
  gwrun_free(&r);
  ck_assert_int_eq(metrics_by_step(m2, "comm_ms", v, 2), 2);
  ck_assert_msg(strcmp(v[0], "null") && atof(v[1]) > 0, "two ranks' comm: %s, %s", v[0], v[1]);
  /* gw-train started by hand (no launcher's rank variables, gw-run's and
   * torchrun's names both unset: no communicator)
   * says the same note, and names no SyncBatchNorm (none runs there) */
  const char *direct[] = {"-n", "1", "env", "-u", "GW_RANK", "-u", "RANK", train_bin(), COMMON, "--steps", "1",
                          "--batch", "8", "--grad-wire", "fp16", "--sync-bn", NULL};
  gwrun_start(&r, noenv, direct);
  gwrun_wait(&r, 120);
  expect_ok(&r);
  ck_assert_msg(strstr(r.err, "--grad-wire fp16 has nothing to do") && strstr(r.out, "no allreduce") &&
                    !strstr(r.out, "SyncBatchNorm"),
                "gw-train without a launcher:\n%s\n%s", r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* --plot draws a point at each epoch's end: a run that ends before one says
 * so at the start (it used to end silently with no file). */
START_TEST(test_plot_nothing_to_draw) {
  char png[512];
  path(png, sizeof png, "never.png");
  struct run r;
  const char *const noenv[] = {NULL};
  /* COMMON without --no-eval (the plot needs the evaluation) */
  const char *args[] = {"-n", "1", train_bin(), "--data", "synthetic", "--synthetic-samples", "96", "--model",
                        "resnet18", "--width-divisor", "8", "--in-channels", "3", "--image-size", "16", "--classes",
                        "4", "--stem", "small", "--threads", "1", "--steps", "2", "--batch", "8", "--plot", png, NULL};
  gwrun_start(&r, noenv, args);
  gwrun_wait(&r, 120);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "nothing will be drawn") || strstr(r.err, "nothing will be drawn"),
                "no warning that a 2-step run draws nothing:\n%s\n%s", r.out, r.err);
  gwrun_free(&r);
  ck_assert_msg(access(png, F_OK) != 0, "%s was written", png);
}
END_TEST

/* gw-train with args under a file-size limit (ulimit -f) of `bytes`, set
 * by prlimit for it alone (this process's own files are Check's). */
static void train_fsize(struct run *r, const char *bytes, const char *const *args) {
  const char *argv[64];
  char lim[64];
  snprintf(lim, sizeof lim, "--fsize=%s", bytes);
  int n = 0;
  argv[n++] = lim, argv[n++] = "--", argv[n++] = train_bin();
  for (int i = 0; args[i]; i++) {
    ck_assert_int_lt(n, 62);
    argv[n++] = args[i];
  }
  argv[n] = NULL;
  const char *const noenv[] = {NULL};
  gwrun_start_prog(r, "/usr/bin/prlimit", noenv, argv);
  gwrun_wait(r, 120);
}

/* A file-size limit (ulimit -f): files that cannot fit it are refused once the
 * model is built, before the training (a save past it was SIGXFSZ's, whose
 * default action ended the rank after its training, unexplained); --metrics
 * past it is said once and the training goes on (it was killed too). */
START_TEST(test_file_size_limit) {
  if (access("/usr/bin/prlimit", X_OK) != 0) { /* (util-linux: scripts/deps.sh installs it) */
    fprintf(stderr, "test_file_size_limit: no /usr/bin/prlimit here: not run\n");
    return;
  }
  char ck[512], w[512], m[512];
  path(ck, sizeof ck, "fsz-ckpt");
  path(w, sizeof w, "fsz.safetensors");
  path(m, sizeof m, "fsz-metrics.jsonl");
#define FSZ_COMMON "--data", "synthetic", "--synthetic-samples", "16", "--model", "resnet18", "--width-divisor", "8", \
    "--in-channels", "3", "--image-size", "16", "--classes", "4", "--stem", "small", "--threads", "1", "--steps", "2", \
    "--batch", "8", "--no-eval"
  static const char *const want[2] = {
      "--save-weights: its files will be over 704048 bytes (the model's 176012 parameters in float32), past this "
      "process's file-size limit (ulimit -f) of 65536 bytes",
      "--checkpoint-dir: its files will be over 1408096 bytes (the model's 176012 parameters and their momentum"};
  struct run r;
  for (int k = 0; k < 2; k++) {
    train_fsize(&r, "65536", (const char *const[]){FSZ_COMMON, k ? "--checkpoint-dir" : "--save-weights", k ? ck : w,
                                                   NULL});
    ck_assert_msg(r.code != 0 && strstr(r.err, want[k]), "expected a refusal mentioning '%s', got exit %d\n%s\n%s",
                  want[k], r.code, r.out, r.err);
    gwrun_free(&r);
  }
  /* without momentum (--momentum 0) a checkpoint holds none: one that fits is not refused */
  train_fsize(&r, "1000000", (const char *const[]){FSZ_COMMON, "--momentum", "0", "--checkpoint-dir", ck, NULL});
  ck_assert_msg(r.code == 0, "--momentum 0 --checkpoint-dir under a limit its checkpoints fit: exit %d\n%s\n%s",
                r.code, r.out, r.err);
  gwrun_free(&r);
  char saved[600];
  snprintf(saved, sizeof saved, "%s/ckpt-2.safetensors", ck);
  ck_assert_msg(access(saved, F_OK) == 0, "no %s", saved);
  unlink(saved);
  /* metrics 8 bytes short of the limit: the next line does not fit (its
   * start goes in, and is cut back) */
  FILE *f = fopen(m, "w");
  ck_assert_ptr_nonnull(f);
  fputs("{\"pad\": \"", f); /* 9 bytes, and 3 at the end */
  for (long i = 0; i < 65536 - 8 - 12; i++) fputc('x', f);
  fputs("\"}\n", f);
  ck_assert_int_eq(fclose(f), 0);
  train_fsize(&r, "65536", (const char *const[]){FSZ_COMMON, "--metrics", m, NULL});
#undef FSZ_COMMON
  ck_assert_msg(r.code == 0 && strstr(r.err, "warning: --metrics") && strstr(r.err, "File too large"),
                "--metrics past ulimit -f: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  struct stat sb;
  ck_assert(stat(m, &sb) == 0 && sb.st_size == 65536 - 8);
  ck_assert_msg(access(w, F_OK) != 0, "%s was written", w);
  unlink(m);
  rmdir(ck);
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("train");
  TCase *tc = tcase_create("gw-train");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_bad_flags);
  add_ranks_tests(tc);
  tcase_add_test(tc, test_first_bucket_mb);
  tcase_add_test(tc, test_one_rank_no_comm);
  tcase_add_test(tc, test_plot_nothing_to_draw);
  tcase_add_test(tc, test_file_size_limit);
  add_weights_tests(tc);
  add_checkpoint_tests(tc);
  add_restart_tests(tc);
  tcase_add_test(tc, test_nan_logits_score_zero);
  tcase_add_test(tc, test_nonfinite_model_not_saved);
  tcase_add_test(tc, test_fp16_wire_overflow_skipped);
  add_data_tests(tc);
  suite_add_tcase(s, tc);
  /* Runs whose weights must equal (or stay near) another way's: the same
   * model code as the cases above, compared numerically. */
  TCase *num = tcase_create("numerics");
  tcase_set_timeout(num, 600);
  add_weights_numerics_tests(num);
  tcase_add_test(num, test_device_path_equals_host);
  tcase_add_test(num, test_nhwc_equals_nchw);
#if GW_HAVE_IBVERBS
  tcase_add_test(num, test_over_ib_equals_shm);
#endif
  suite_add_tcase(s, num);
  TCase *sched = tcase_create("schedule");
  tcase_set_timeout(sched, 600);
  add_schedule_tests(sched);
  suite_add_tcase(s, sched);
  return s;
}

int main(void) {
#if !GW_HAVE_ONEDNN
  (void)make_suite;
  printf("train: gw-train was built without oneDNN and cannot train here; skipped\n");
  return 77;
#else
  if (!train_bin()) {
    fprintf(stderr, "train: set GW_TRAIN_BIN to the gw-train binary\n");
    return 1;
  }
  snprintf(tmpdir, sizeof tmpdir, "/tmp/gw-train-test.XXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  int rc = gwrun_main("test_train", make_suite);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "train: could not remove %s\n", tmpdir);
  return rc;
#endif
}
