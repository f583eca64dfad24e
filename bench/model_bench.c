/* model_bench - training throughput of the model on a backend (cpu: oneDNN, or
 * cudnn: the GPU): forward, loss + backward and an SGD-with-momentum step on one
 * fixed random batch, the same work bench/model_bench_torch.py times in PyTorch.
 * The optimizer runs where the weights are (the backend's sgd_step), and the
 * batch goes in as gw-train feeds it: staged (converted to the activations'
 * dtype and layout, and on a GPU copied up on its own stream) while the step
 * before computes, after that step's backward is queued; so a device backend
 * computes on data already there, as PyTorch's side does.  --no-fuse runs
 * every layer by itself (no batch norm fused with its ReLU / residual add).
 * Ends with one line:
 *
 *   gradwire resnet50 224x224x3 batch 16 cpu threads 2, 49 fused BN groups: 12.3 img/s (median of 5 steps, ...)
 *
 * --profile N: N more steps after the timed ones, each layer timed on the
 * backend's stream (gw_exec_set_profile), printed before that line: the time
 * per kind of layer (convolutions, batch norm alone and fused, ...), forward
 * and backward, and the slowest layers.
 *
 * usage: model_bench [--depth 50] [--image-size 224] [--in-channels 3] [--classes 1000]
 *                    [--batch 16] [--backend cpu|cudnn] [--tf32 0|1] [--act fp32|bf16|fp16] [--no-fuse]
 *                    [--layout nchw|nhwc] [--threads T]
 *                    [--steps 5] [--warmup 2] [--profile N]
 * (--layout: by default gw-train's, gw_backend_default_layout)
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "gw_config.h"
#include "exec.h"
#include "sgd_math.h"
#include "resnet.h"
#include "sgd.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int arg_int(const char *s, const char *name, int lo) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*end || end == s || v < lo || v > 1 << 20) {
    fprintf(stderr, "model_bench: %s wants a whole number >= %d, got '%s'\n", name, lo, s);
    exit(2);
  }
  return (int)v;
}

/* ---- --profile: the executor's per-layer times, by kind and the slowest */

enum { K_CONV, K_BN, K_BN_RELU, K_BN_ADD_RELU, K_RELU, K_ADD, K_MAXPOOL, K_AVGPOOL, K_FC, K_LOSS, NK };
static const char *const kind_name[NK] = {"convolution", "batch norm", "bn + relu", "bn + add + relu", "relu",
                                          "add", "max pool", "avg pool", "fc", "loss"};

static int kind_of(const struct gw_exec_layer_time *t) {
  switch (t->kind) {
  case GW_LAYER_CONV: return K_CONV;
  case GW_LAYER_BN: return t->fused == 2 ? K_BN_ADD_RELU : t->fused ? K_BN_RELU : K_BN;
  case GW_LAYER_RELU: return K_RELU;
  case GW_LAYER_ADD: return K_ADD;
  case GW_LAYER_MAXPOOL: return K_MAXPOOL;
  case GW_LAYER_AVGPOOL: return K_AVGPOOL;
  case GW_LAYER_FC: return K_FC;
  default: return K_LOSS;
  }
}

static const struct gw_exec_layer_time *sort_base;
static int cmp_layer_time(const void *a, const void *b) {
  const struct gw_exec_layer_time *x = &sort_base[*(const int *)a], *y = &sort_base[*(const int *)b];
  double u = x->fwd_s + x->bwd_s, v = y->fwd_s + y->bwd_s;
  return (u < v) - (u > v);
}

static void print_profile(const struct gw_exec *e) {
  int n = 0, steps = 0;
  const struct gw_exec_layer_time *t = gw_exec_profile(e, &n, &steps);
  if (!t || steps < 1) return;
  double fwd[NK] = {0}, bwd[NK] = {0}, total = 0, tf = 0, tb = 0;
  int count[NK] = {0};
  for (int i = 0; i < n; i++) {
    int k = kind_of(&t[i]);
    fwd[k] += t[i].fwd_s, bwd[k] += t[i].bwd_s, tf += t[i].fwd_s, tb += t[i].bwd_s;
    count[k] += !t[i].member;
  }
  total = tf + tb;
  const double ms = 1e3 / steps;
  printf("profile (%d step%s, per step): forward %.2f ms, backward with the loss %.2f ms\n", steps,
         steps == 1 ? "" : "s", tf * ms, tb * ms);
  printf("  %-16s %6s %10s %10s %7s\n", "kind", "layers", "fwd ms", "bwd ms", "share");
  for (int k = 0; k < NK; k++)
    if (count[k])
      printf("  %-16s %6d %10.2f %10.2f %6.1f%%\n", kind_name[k], count[k], fwd[k] * ms, bwd[k] * ms,
             total > 0 ? 100 * (fwd[k] + bwd[k]) / total : 0.0);
  int *idx = malloc((size_t)n * sizeof *idx);
  if (!idx) return;
  for (int i = 0; i < n; i++) idx[i] = i;
  sort_base = t;
  qsort(idx, (size_t)n, sizeof *idx, cmp_layer_time);
  printf("  slowest layers (fwd + bwd ms):");
  for (int i = 0; i < n && i < 8; i++)
    printf("%s %s %.2f + %.2f", i ? "," : "", t[idx[i]].name, t[idx[i]].fwd_s * ms, t[idx[i]].bwd_s * ms);
  printf("\n");
  free(idx);
}

#define CHECK(call)                                                                 \
  do {                                                                              \
    if ((call) != GW_SUCCESS) {                                                     \
      fprintf(stderr, "model_bench: %s: %s\n", #call, gw_model_last_error());      \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

int main(int argc, char **argv) {
#if !GW_HAVE_ONEDNN && !GW_HAVE_CUDNN
  (void)argc, (void)argv;
  fprintf(stderr, "model_bench: built without a backend (oneDNN or cuDNN)\n");
  return 77;
#else
  struct gw_model_config cfg;
  gw_model_config_default(&cfg);
  int batch = 16, threads = 0, steps = 5, warmup = 2, profile = 0, tf32 = 0, act = GW_FLOAT32, no_fuse = 0, layout = -1;
  const struct gw_backend_ops *ops = NULL;
#if GW_HAVE_ONEDNN
  ops = &gw_backend_cpu;
#else
  ops = gw_backend_cudnn_ops();
#endif
  static const struct option lo[] = {{"depth", 1, 0, 'd'},   {"image-size", 1, 0, 's'}, {"in-channels", 1, 0, 'c'},
                                     {"classes", 1, 0, 'k'}, {"batch", 1, 0, 'b'},      {"threads", 1, 0, 't'},
                                     {"steps", 1, 0, 'n'},   {"warmup", 1, 0, 'w'},     {"backend", 1, 0, 'B'},
                                     {"tf32", 1, 0, 'T'},    {"act", 1, 0, 'A'},        {"no-fuse", 0, 0, 'F'},
                                     {"layout", 1, 0, 'L'},  {"profile", 1, 0, 'P'},    {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'd': cfg.depth = arg_int(optarg, "--depth", 18); break;
    case 's': cfg.image_size = arg_int(optarg, "--image-size", 1); break;
    case 'c': cfg.in_channels = arg_int(optarg, "--in-channels", 1); break;
    case 'k': cfg.classes = arg_int(optarg, "--classes", 1); break;
    case 'b': batch = arg_int(optarg, "--batch", 1); break;
    case 't': threads = arg_int(optarg, "--threads", 0); break;
    case 'n': steps = arg_int(optarg, "--steps", 1); break;
    case 'w': warmup = arg_int(optarg, "--warmup", 0); break;
    case 'T': tf32 = arg_int(optarg, "--tf32", 0) != 0; break;
    case 'F': no_fuse = 1; break;
    case 'P': profile = arg_int(optarg, "--profile", 0); break;
    case 'L':
      if (!strcmp(optarg, "nchw")) layout = GW_LAYOUT_NCHW;
      else if (!strcmp(optarg, "nhwc")) layout = GW_LAYOUT_NHWC;
      else {
        fprintf(stderr, "model_bench: --layout is nchw or nhwc, not '%s'\n", optarg);
        return 2;
      }
      break;
    case 'A':
      if (!strcmp(optarg, "fp32")) act = GW_FLOAT32;
      else if (!strcmp(optarg, "bf16")) act = GW_BFLOAT16;
      else if (!strcmp(optarg, "fp16")) act = GW_FLOAT16;
      else {
        fprintf(stderr, "model_bench: --act is fp32, bf16 or fp16, not '%s'\n", optarg);
        return 2;
      }
      break;
    case 'B':
      ops = NULL;
#if GW_HAVE_ONEDNN
      if (!strcmp(optarg, "cpu")) ops = &gw_backend_cpu;
#endif
#if GW_HAVE_CUDNN
      if (!strcmp(optarg, "cudnn") && !(ops = gw_backend_cudnn_ops())) {
        fprintf(stderr, "model_bench: --backend cudnn: %s\n", gw_model_last_error());
        return 1;
      }
#endif
      if (!ops) {
        fprintf(stderr, "model_bench: --backend %s is not in this build\n", optarg);
        return 77;
      }
      break;
    default: fprintf(stderr, "model_bench: unknown option (see the header of bench/model_bench.c)\n"); return 2;
    }
  }
  if (!ops) { /* the default backend's module did not load */
    fprintf(stderr, "model_bench: %s\n", gw_model_last_error());
    return 1;
  }
  struct gw_model *m;
  struct gw_backend *b;
  struct gw_exec *e;
  struct gw_sgd *sgd;
  CHECK(gw_model_init(&m, &cfg));
  if (layout < 0) layout = gw_backend_default_layout(ops->name, act, cfg.image_size); /* gw-train's default */
  struct gw_backend_config bc = {.threads = threads, .tf32 = tf32, .act = act, .layout = layout};
  gw_result_t r = ops->create(&bc, &b);
  if (r == GW_ERR_UNSUPPORTED) {
    fprintf(stderr, "model_bench: %s\n", gw_model_last_error());
    return 77;
  }
  CHECK(r);
  struct gw_exec_config ec = {.batch = batch, .label_smoothing = 0.1f, .no_fuse = no_fuse};
  CHECK(gw_exec_create(m, ops, b, &ec, &e));
  struct gw_sgd_config sc = {.momentum = 0.9f, .weight_decay = 1e-4f};
  CHECK(gw_sgd_create(m, &sc, &sgd));
  /* The optimizer where the weights are (as gw-train keeps them): the
   * backend's sgd_step on its own copies, the momentum there too. */
  const size_t np = gw_model_num_params(m);
  float *mom = ops->alloc(b, np * sizeof(float));
  if (!mom) return 1;
  CHECK(ops->upload(b, mom, gw_sgd_momentum(sgd), np * sizeof(float)));
  int nruns = 0;
  const struct gw_sgd_run *runs = gw_sgd_runs(sgd, &nruns);
  size_t n = (size_t)batch * cfg.in_channels * cfg.image_size * cfg.image_size;
  float *x = malloc(n * sizeof(float));
  int32_t *y = malloc((size_t)batch * sizeof(int32_t));
  if (!x || !y) return 1;
  srand(1);
  for (size_t i = 0; i < n; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
  for (int i = 0; i < batch; i++) y[i] = rand() % cfg.classes;
  double *t = calloc((size_t)steps, sizeof(double));
  float loss = 0;
  CHECK(gw_exec_stage(e, x, y));
  /* Where the host's time goes in a timed step (means): the forward's calls,
   * the loss (which waits for the forward: a device backend returns the loss
   * value), the backward's calls, staging the next batch, the optimizer's calls,
   * and the final wait for the device.  A phase that is not a wait and takes
   * longer than the device's work leaves the device idle. */
  enum { PH_FWD, PH_BWD, PH_STAGE, PH_SGD, PH_WAIT, PH_N };
  double ph[PH_N] = {0};
  for (int s = 0; s < warmup + steps + profile; s++) {
    if (s == warmup + steps) CHECK(gw_exec_set_profile(e, 1)); /* after the timed steps */
    double tp[PH_N + 1];
    tp[0] = now();
    CHECK(gw_exec_forward(e, NULL, 1)); /* the staged batch */
    tp[1] = now();
    CHECK(gw_exec_backward(e, NULL, &loss, NULL, NULL));
    tp[2] = now();
    CHECK(gw_exec_stage(e, x, y)); /* the next step's, while this one's backward runs */
    tp[3] = now();
    struct gw_sgd_scalars scal;
    gw_sgd_scalars_at(sgd, 0.01f, 1.0f, &scal);
    CHECK(ops->sgd_step(b, runs, nruns, gw_exec_params(e), gw_exec_grads(e), mom, &scal));
    gw_sgd_set_steps(sgd, gw_sgd_steps(sgd) + 1);
    tp[4] = now();
    int over = 0; /* waits for the step (the next loss would too) */
    CHECK(ops->nonfinite(b, &mom[0], 1, &over));
    tp[5] = now();
    if (s >= warmup && s < warmup + steps) {
      t[s - warmup] = tp[PH_N] - tp[0];
      for (int k = 0; k < PH_N; k++) ph[k] += (tp[k + 1] - tp[k]) / steps;
    }
  }
  printf("host per step (mean ms): forward calls %.2f, loss and backward calls %.2f (the loss waits for the forward), "
         "staging the next batch %.2f, optimizer calls %.2f, waiting for the device %.2f\n", ph[PH_FWD] * 1e3,
         ph[PH_BWD] * 1e3, ph[PH_STAGE] * 1e3, ph[PH_SGD] * 1e3, ph[PH_WAIT] * 1e3);
  if (profile) print_profile(e);
  qsort(t, (size_t)steps, sizeof *t, cmp_double);
  double med = t[steps / 2];
  printf("gradwire resnet%d %dx%dx%d batch %d %s%s%s %s threads %d, %d fused BN groups: %.2f img/s (median of %d "
         "steps, %.3f s/step, loss %.3f, %.0f MiB work memory)\n",
         cfg.depth, cfg.image_size, cfg.image_size, cfg.in_channels, batch, ops->name,
         ops->host_memory ? "" : tf32 ? " tf32" : " fp32",
         act == GW_BFLOAT16 ? " bf16 activations" : act == GW_FLOAT16 ? " fp16 activations" : "",
         layout == GW_LAYOUT_NHWC ? "NHWC" : "NCHW", threads,
         gw_exec_fused_groups(e), batch / med, steps, med, (double)loss, (double)gw_exec_memory_bytes(e) / (1 << 20));
  ops->dealloc(b, mom);
  free(t), free(x), free(y);
  gw_sgd_free(sgd);
  gw_exec_free(e);
  ops->destroy(b);
  gw_model_free(m);
  return 0;
#endif
}
