/* backend_cudnn_conv.c - the cudnn backend's convolutions on cuDNN's graph API
 * (backend descriptors, plain C): one operation graph per direction, the
 * execution plan chosen at the first call of a shape by timing the allowed
 * candidates on the caller's buffers and kept by the backend for every op of
 * that shape (see backend_cudnn.c's header for the numerics rules). */
#include "gw_config.h"

#if GW_HAVE_CUDNN

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cudnn_internal.h"

static const char *const dir_name[NDIRS] = {"conv_fwd", "conv_bwd_data", "conv_bwd_weights"};

/* ---- the convolution graphs ---- */

/* A descriptor with its attributes set in one go; destroyed on every path. */
struct attr {
  cudnnBackendAttributeName_t name;
  cudnnBackendAttributeType_t type;
  int64_t count;
  const void *value;
};

static gw_result_t make_desc(cudnnBackendDescriptorType_t type, const struct attr *a, int n, int finalize,
                             cudnnBackendDescriptor_t *out, const char *what) {
  cudnnBackendDescriptor_t d = NULL;
  *out = NULL;
  DNN_TRY(cudnnBackendCreateDescriptor(type, &d), what);
  for (int i = 0; i < n; i++) {
    cudnnStatus_t st = cudnnBackendSetAttribute(d, a[i].name, a[i].type, a[i].count, (void *)a[i].value);
    if (st != CUDNN_STATUS_SUCCESS) {
      gw_result_t r = gw__cudnn_dnn_fail(st, what, "cudnnBackendSetAttribute");
      cudnnBackendDestroyDescriptor(d);
      return r;
    }
  }
  if (finalize) {
    cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) {
      gw_result_t r = gw__cudnn_dnn_fail(st, what, "cudnnBackendFinalize");
      cudnnBackendDestroyDescriptor(d);
      return r;
    }
  }
  *out = d;
  return GW_SUCCESS;
}

static void destroy_all(cudnnBackendDescriptor_t *d, int n) {
  for (int i = 0; i < n; i++)
    if (d[i]) cudnnBackendDestroyDescriptor(d[i]);
}

/* A tensor of dims [n, c, h, w] in the plain layout (NCHW / OIHW) or channels
 * last (NHWC / OHWI), id uid. */
static gw_result_t make_tensor(int64_t uid, cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w, int nhwc,
                               int64_t align, cudnnBackendDescriptor_t *out, const char *what) {
  int64_t dims[4] = {n, c, h, w}, strides[4] = {c * h * w, h * w, w, 1};
  if (nhwc) strides[1] = 1, strides[2] = w * c, strides[3] = c;
  struct attr a[] = {{CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt},
                     {CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims},
                     {CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides},
                     {CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid},
                     {CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align}};
  return make_desc(CUDNN_BACKEND_TENSOR_DESCRIPTOR, a, 5, 1, out, what);
}

enum { UID_X = 'x', UID_W = 'w', UID_Y = 'y' };

/* The operation graph of one direction: x [n,c,h,w], w [k,c,r,r], y [n,k,p,q]. */
static gw_result_t conv_graph(struct gw_op *op, int dir, int64_t align, cudnnBackendDescriptor_t *graph) {
  const struct gw_op_desc *d = &op->d;
  const char *what = dir_name[dir];
  cudnnBackendDescriptor_t t[3] = {NULL, NULL, NULL}, conv = NULL, oper = NULL;
  gw_result_t res;
  *graph = NULL;
  /* All three in the activations' dtype and layout: with 16 bits or NHWC the
   * weights are a copy (rounded, channels last) and the weight gradient comes
   * out so and is widened / transposed back (conv_run); compute in float32
   * either way. */
  cudnnDataType_t dt = op->b->act == GW_BFLOAT16  ? CUDNN_DATA_BFLOAT16
                       : op->b->act == GW_FLOAT16 ? CUDNN_DATA_HALF
                                                  : CUDNN_DATA_FLOAT;
  const int nhwc = op->b->nhwc; /* then the weights channels last too (conv_run's copy) */
  if ((res = make_tensor(UID_X, dt, d->n, d->c, d->h, d->w, nhwc, align, &t[0], what)) != GW_SUCCESS ||
      (res = make_tensor(UID_W, dt, d->k, d->c, d->kernel, d->kernel, nhwc, align, &t[1], what)) != GW_SUCCESS ||
      (res = make_tensor(UID_Y, dt, d->n, d->k, d->p, d->q, nhwc, align, &t[2], what)) != GW_SUCCESS)
    goto out;
  {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    int64_t dims = 2, one[2] = {1, 1}, stride[2] = {d->stride, d->stride}, pad[2] = {d->pad, d->pad};
    struct attr a[] = {{CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp},
                       {CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode},
                       {CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims},
                       {CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one},
                       {CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride},
                       {CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad},
                       {CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad}};
    if ((res = make_desc(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, a, 7, 1, &conv, what)) != GW_SUCCESS) goto out;
  }
  {
    float alpha = 1, beta = 0;
    static const cudnnBackendDescriptorType_t kind[NDIRS] = {
        CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
    static const cudnnBackendAttributeName_t names[NDIRS][6] = {
        {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA}};
    struct attr a[] = {{names[dir][0], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t[0]},
                       {names[dir][1], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t[1]},
                       {names[dir][2], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t[2]},
                       {names[dir][3], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv},
                       {names[dir][4], CUDNN_TYPE_FLOAT, 1, &alpha},
                       {names[dir][5], CUDNN_TYPE_FLOAT, 1, &beta}};
    if ((res = make_desc(kind[dir], a, 6, 1, &oper, what)) != GW_SUCCESS) goto out;
  }
  {
    struct attr a[] = {{CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &oper},
                       {CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &op->b->dnn}};
    res = make_desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, a, 2, 1, graph, what);
  }
out:
  destroy_all(t, 3);
  destroy_all(&conv, 1);
  destroy_all(&oper, 1);
  return res;
}

/* A cuDNN call that failed on a path that goes on without it leaves its
 * message behind; read it so a later failure reports its own. */
static void drain_dnn_error(void) {
  char drop[256];
  cudnnGetLastErrorString(drop, sizeof drop);
}

/* What an engine's numerical notes may say: never down-converted inputs (below
 * the tensors' own precision).  A level allows more:
 *   NUM_STRICT  full fp32 arithmetic: no tensor cores, no reduced-precision
 *               reductions, no Winograd or FFT;
 *   NUM_FP32    the same with Winograd and FFT (where nothing else runs);
 *   NUM_TC      tensor cores (bfloat16 activations: fp32 accumulation), still no
 *               reduced-precision reductions; Winograd/FFT as a last resort;
 *   NUM_TF32    anything else (cfg->tf32 on fp32 tensors). */
enum { NUM_STRICT, NUM_FP32, NUM_TC, NUM_TC_ANY, NUM_TF32 };

static int notes_allowed(cudnnBackendDescriptor_t cfg, int level, int deterministic) {
  cudnnBackendDescriptor_t engine = NULL;
  int ok = 0;
  int64_t got = 0;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &engine) ==
          CUDNN_STATUS_SUCCESS &&
      cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &got, notes) == CUDNN_STATUS_SUCCESS) {
    ok = 1;
    for (int64_t i = 0; i < got; i++)
      switch (notes[i]) {
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: ok = 0; break;
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
        if (deterministic) ok = 0;
        break;
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
        if (level < NUM_TC) ok = 0;
        break;
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
        if (level != NUM_TF32) ok = 0;
        break;
      case CUDNN_NUMERICAL_NOTE_FFT:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13:
        if (level == NUM_STRICT || level == NUM_TC) ok = 0;
        break;
      default: break;
      }
  } else {
    drain_dnn_error();
  }
  cudnnBackendDestroyDescriptor(engine);
  return ok;
}

/* The levels conv_choose tries in turn, and a name for messages. */
static int levels_of(const struct gw_backend *b, int lv[2], const char **name) {
  if (b->act != GW_FLOAT32) {
    lv[0] = NUM_TC, lv[1] = NUM_TC_ANY;
    *name = b->act == GW_FLOAT16 ? "float16 (tensor cores, fp32 accumulation)"
                                 : "bfloat16 (tensor cores, fp32 accumulation)";
    return 2;
  }
  if (b->tf32) {
    lv[0] = NUM_TF32, *name = "TF32";
    return 1;
  }
  lv[0] = NUM_STRICT, lv[1] = NUM_FP32, *name = "full fp32";
  return 2;
}

/* Appends up to `cap` engine configs for the graph from heuristics mode `mode`
 * to cfg; on a failure of cuDNN's own, its message goes to why[]. */
static int heuristic_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode, cudnnBackendDescriptor_t *cfg,
                             int cap, char *why, size_t why_len) {
  cudnnBackendDescriptor_t heur = NULL;
  int64_t n = 0, got = 0;
  int made = 0;
  struct attr a[] = {{CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph},
                     {CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode}};
  if (make_desc(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, a, 2, 1, &heur, "heuristics") != GW_SUCCESS) {
    snprintf(why, why_len, "%s", gw_model_last_error());
    return 0;
  }
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL) !=
      CUDNN_STATUS_SUCCESS) {
    cudnnGetLastErrorString(why, why_len);
    n = 0;
  }
  if (n > cap) n = cap;
  for (; made < n; made++)
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[made]) != CUDNN_STATUS_SUCCESS) break;
  if (made > 0 && cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, made,
                                           &got, cfg) != CUDNN_STATUS_SUCCESS) {
    cudnnGetLastErrorString(why, why_len);
    got = 0;
  }
  for (int i = (int)got; i < made; i++) cudnnBackendDestroyDescriptor(cfg[i]);
  cudnnBackendDestroyDescriptor(heur);
  return (int)got;
}

#define MAX_CONFIGS 64 /* per heuristics mode */
#define MAX_TIMED 8    /* candidates that ran, per choice */

/* Every engine config of both heuristics modes (mode A's ranking first). */
static int all_configs(cudnnBackendDescriptor_t graph, cudnnBackendDescriptor_t *cfg, char *why, size_t why_len) {
  int n = heuristic_configs(graph, CUDNN_HEUR_MODE_A, cfg, MAX_CONFIGS, why, why_len);
  return n + heuristic_configs(graph, CUDNN_HEUR_MODE_FALLBACK, cfg + n, MAX_CONFIGS, why, why_len);
}

static cudnnStatus_t make_variant_pack(struct gw_backend *b, void *const ptr[3], cudnnBackendDescriptor_t *out) {
  int64_t uids[3] = {UID_X, UID_W, UID_Y};
  void *ws = b->ws;
  cudnnBackendDescriptor_t vp = NULL;
  cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  if ((st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids)) !=
          CUDNN_STATUS_SUCCESS ||
      (st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3,
                                     (void *)ptr)) != CUDNN_STATUS_SUCCESS ||
      (st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)) !=
          CUDNN_STATUS_SUCCESS ||
      (st = cudnnBackendFinalize(vp)) != CUDNN_STATUS_SUCCESS) {
    cudnnBackendDestroyDescriptor(vp);
    return st;
  }
  *out = vp;
  return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t plan_execute(struct gw_backend *b, cudnnBackendDescriptor_t plan, void *const ptr[3]) {
  cudnnBackendDescriptor_t vp = NULL;
  cudnnStatus_t st = make_variant_pack(b, ptr, &vp);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  st = cudnnBackendExecute(b->dnn, plan, vp);
  cudnnBackendDestroyDescriptor(vp);
  return st;
}

/* Times one candidate plan on the caller's buffers (the workspace already big
 * enough): one run to warm up, then the best of three executions.  < 0 when it
 * cannot run. */
static float time_plan(struct gw_backend *b, cudnnBackendDescriptor_t plan, void *const ptr[3]) {
  cudnnBackendDescriptor_t vp = NULL;
  float best = -1;
  if (make_variant_pack(b, ptr, &vp) != CUDNN_STATUS_SUCCESS) return -1;
  if (cudnnBackendExecute(b->dnn, plan, vp) == CUDNN_STATUS_SUCCESS) {
    best = 0;
    for (int i = 0; i < 3 && best >= 0; i++) {
      float ms = 0;
      if (cudaEventRecord(b->ev0, b->stream) != cudaSuccess ||
          cudnnBackendExecute(b->dnn, plan, vp) != CUDNN_STATUS_SUCCESS ||
          cudaEventRecord(b->ev1, b->stream) != cudaSuccess || cudaEventSynchronize(b->ev1) != cudaSuccess ||
          cudaEventElapsedTime(&ms, b->ev0, b->ev1) != cudaSuccess)
        best = -1;
      else if (i == 0 || ms < best)
        best = ms;
    }
  }
  cudnnBackendDestroyDescriptor(vp);
  if (best < 0) {
    drain_dnn_error();
    cudaGetLastError(); /* a launch failure of a candidate is not sticky */
  }
  return best;
}

/* The stream's sticky error (an earlier kernel's fault: an illegal address),
 * or cudaSuccess while the context still works.  A candidate that fails on
 * a dead context says nothing about the engine: without this every one failed
 * the same way and the fault was reported as "no cuDNN engine runs it". */
static cudaError_t context_fault(struct gw_backend *b) {
  const cudaError_t e = cudaStreamQuery(b->stream);
  return e == cudaSuccess || e == cudaErrorNotReady ? cudaSuccess : e;
}

/* Times the candidates of cfg[0..ncfg) allowed at `level` (deterministic ones
 * only when asked); the fastest that ran goes to *best (NULL if none ran), or
 * with b->first_that_runs the first in the heuristics' order that ran.  Counts
 * what it saw for the message; *fault: the context failed (stops). */
static void choose_among(struct gw_op *op, const char *what, cudnnBackendDescriptor_t *cfg, int ncfg, int level,
                         int deterministic, void *const ptr[3], cudnnBackendDescriptor_t *best, int64_t *best_ws,
                         int *best_i, float *best_ms, int *allowed, int *ran, cudaError_t *fault) {
  struct gw_backend *b = op->b;
  for (int i = 0; i < ncfg && *ran < MAX_TIMED && !(b->first_that_runs && *best) && !*fault; i++) {
    if (!notes_allowed(cfg[i], level, deterministic)) continue;
    (*allowed)++;
    cudnnBackendDescriptor_t plan = NULL;
    struct attr a[] = {{CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &b->dnn},
                       {CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]}};
    if (make_desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, a, 2, 1, &plan, what) != GW_SUCCESS) continue;
    int64_t ws = 0, got = 0;
    if (cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &ws) !=
            CUDNN_STATUS_SUCCESS ||
        ws < 0 || (size_t)ws > b->ws_limit) {
      drain_dnn_error();
      cudnnBackendDestroyDescriptor(plan);
      continue;
    }
    if (gw__cudnn_ensure_workspace(b, (size_t)ws, what) != GW_SUCCESS) { /* too big for what is free now: the next */
      cudaGetLastError();
      cudnnBackendDestroyDescriptor(plan);
      continue;
    }
    float ms = time_plan(b, plan, ptr);
    if (ms < 0) *fault = context_fault(b);
    if (ms >= 0) (*ran)++;
    if (ms >= 0 && (*best_ms < 0 || ms < *best_ms)) {
      if (*best) cudnnBackendDestroyDescriptor(*best);
      *best = plan, *best_ms = ms, *best_ws = ws, *best_i = i;
    } else {
      cudnnBackendDestroyDescriptor(plan);
    }
  }
}

/* GW_CUDNN_PLANS=1: every chosen plan is said on stderr (the shape, the
 * engine's global index and numerical notes, how it was chosen), to tell
 * which engine computed what when results differ. */
static int plans_said(void) {
  const char *v = getenv("GW_CUDNN_PLANS");
  return v && *v && strcmp(v, "0") != 0;
}

static void say_plan(const struct gw_op *op, int dir, int ai, cudnnBackendDescriptor_t cfg, int level, int det,
                     float ms, int64_t ws, int allowed, int ran) {
  static const char *const level_name[] = {"strict", "fp32", "tc", "tc-any", "tf32"};
  static const char *const note_name[] = {"tensor_core", "down_convert", "reduced_precision", "fft", "nondet",
                                          "winograd", "wino4x4", "wino6x6", "wino13x13", "strict_nan"};
  cudnnBackendDescriptor_t engine = NULL;
  int64_t index = -1, got = 0;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  char said[160] = "";
  size_t len = 0;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) == CUDNN_STATUS_SUCCESS &&
      cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &engine) ==
          CUDNN_STATUS_SUCCESS) {
    cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, &index);
    if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &got, notes) == CUDNN_STATUS_SUCCESS)
      for (int64_t i = 0; i < got && len < sizeof said - 20; i++) {
        const unsigned n = (unsigned)notes[i];
        len += (size_t)snprintf(said + len, sizeof said - len, "%s%s", len ? "," : "",
                                n < sizeof note_name / sizeof note_name[0] ? note_name[n] : "other");
      }
  }
  drain_dnn_error();
  if (engine) cudnnBackendDestroyDescriptor(engine);
  const struct gw_op_desc *d = &op->d;
  fprintf(stderr,
          BE " plan: %s %s n%d c%d %dx%d k%d r%d s%d p%d%s: engine %lld [%s], %s%s, %.3f ms, workspace %lld B "
             "(%d allowed, %d ran)\n",
          op->what, dir_name[dir], d->n, d->c, d->h, d->w, d->k, d->kernel, d->stride, d->pad,
          ai ? " unaligned" : "", (long long)index, said, level_name[level], det ? " deterministic" : "", ms,
          (long long)ws, allowed, ran);
}

static struct conv_key conv_key_of(const struct gw_op_desc *d, int dir, int ai) {
  struct conv_key k;
  memset(&k, 0, sizeof k); /* compared with memcmp */
  k.n = d->n, k.c = d->c, k.h = d->h, k.w = d->w, k.k = d->k, k.p = d->p, k.q = d->q;
  k.kernel = d->kernel, k.stride = d->stride, k.pad = d->pad, k.dir = dir, k.ai = ai;
  return k;
}

/* The plan of direction dir for pointers of alignment class ai: an earlier op's
 * of the same shape, or chosen now by timing the allowed candidates on ptr
 * (outputs are overwritten by the call anyway). */
static gw_result_t conv_choose(struct gw_op *op, int dir, int ai, void *const ptr[3]) {
  struct gw_backend *b = op->b;
  const char *what = dir_name[dir];
  struct conv_key key = conv_key_of(&op->d, dir, ai);
  for (int i = 0; i < b->nplans; i++)
    if (!memcmp(&b->plans[i].key, &key, sizeof key)) {
      op->plan[dir][ai] = i + 1;
      return GW_SUCCESS;
    }
  if (b->nplans == b->cap_plans) {
    int cap = b->cap_plans ? 2 * b->cap_plans : 32;
    struct plan_entry *p = realloc(b->plans, (size_t)cap * sizeof *p);
    if (!p) return gw__model_fail(GW_ERR_SYSTEM, BE " backend: out of memory");
    b->plans = p, b->cap_plans = cap;
  }
  cudnnBackendDescriptor_t graph = NULL, cfg[2 * MAX_CONFIGS], best = NULL;
  char why[256] = "";
  GW_MODEL_TRY(conv_graph(op, dir, ai ? 4 : 16, &graph));
  int ncfg = all_configs(graph, cfg, why, sizeof why);
  int64_t best_ws = 0;
  int allowed = 0, ran = 0, best_i = -1, best_det = 0, best_lv = 0;
  float best_ms = -1;
  int lv[2];
  const char *numerics;
  int nlv = levels_of(b, lv, &numerics);
  cudaError_t fault = context_fault(b); /* an earlier kernel's, before any candidate is blamed */
  /* Deterministic engines at every level first (a resumed run must repeat the
   * same bits: engines with atomics do not), then any allowed one, unless
   * GW_CUDNN_DETERMINISTIC forbids it. */
  for (int det = 1; det >= b->first_that_runs && !best && !fault; det--)
    for (int i = 0; i < nlv && !best && !fault; i++) {
      choose_among(op, what, cfg, ncfg, lv[i], det, ptr, &best, &best_ws, &best_i, &best_ms, &allowed, &ran, &fault);
      best_det = det, best_lv = lv[i];
    }
  if (fault) {
    destroy_all(cfg, ncfg);
    cudnnBackendDestroyDescriptor(graph);
    if (best) cudnnBackendDestroyDescriptor(best);
    return gw__cudnn_cuda_fail(fault, op->what, "choosing a convolution engine (the device failed earlier)");
  }
  if (best && plans_said()) say_plan(op, dir, ai, cfg[best_i], best_lv, best_det, best_ms, best_ws, allowed, ran);
  destroy_all(cfg, ncfg);
  cudnnBackendDestroyDescriptor(graph);
  if (!best)
    return gw__model_fail(GW_ERR_UNSUPPORTED,
                          BE " backend: %s: %s: no cuDNN engine runs it (%d proposed, %d allowed with %s numerics, "
                             "none ran; workspace limit %zu MiB)%s%s",
                          op->what, what, ncfg, allowed, numerics, b->ws_limit >> 20,
                          why[0] ? ": " : "", why);
  b->plans[b->nplans] = (struct plan_entry){key, best, best_ws};
  op->plan[dir][ai] = ++b->nplans;
  return GW_SUCCESS;
}

/* op_create's check that cuDNN has an engine for each direction of the shape
 * that the numerics mode allows, so a model that cannot run is refused when it is
 * planned rather than at its first step. */
gw_result_t gw__cudnn_conv_check(struct gw_op *op) {
  for (int dir = 0; dir < NDIRS; dir++) {
    cudnnBackendDescriptor_t graph = NULL, cfg[2 * MAX_CONFIGS];
    char why[256] = "";
    GW_MODEL_TRY(conv_graph(op, dir, 16, &graph));
    int n = all_configs(graph, cfg, why, sizeof why), ok = 0;
    int lv[2];
    const char *numerics;
    int last = lv[levels_of(op->b, lv, &numerics) - 1];
    for (int i = 0; i < n && !ok; i++) ok = notes_allowed(cfg[i], last, op->b->first_that_runs);
    destroy_all(cfg, n);
    cudnnBackendDestroyDescriptor(graph);
    if (!ok)
      return gw__model_fail(GW_ERR_UNSUPPORTED,
                            BE " backend: %s: %s: cuDNN proposes no engine with %s numerics for this shape (%d "
                               "proposed)%s%s",
                            op->what, dir_name[dir], numerics, n, why[0] ? ": " : "", why);
  }
  return GW_SUCCESS;
}

static gw_result_t conv_run(struct gw_op *op, int dir, const void *p0, const void *p1, const void *p2) {
  GW_MODEL_TRY(gw__backend_expect_kind(BE, op->d.kind, GW_LAYER_CONV, dir_name[dir]));
  /* In the order of the uids: x, w, y (for the backwards, dx / dw / dy take those places). */
  void *ptr[3];
  if (dir == DIR_FWD) ptr[0] = (void *)p0, ptr[1] = (void *)p1, ptr[2] = (void *)p2;          /* x, w, y */
  else if (dir == DIR_BWD_DATA) ptr[0] = (void *)p2, ptr[1] = (void *)p1, ptr[2] = (void *)p0; /* dx, w, dy */
  else ptr[0] = (void *)p0, ptr[1] = (void *)p2, ptr[2] = (void *)p1;                          /* x, dw, dy */
  /* The weights as the graph takes them: the caller's float32 OIHW, or a copy
   * rounded to 16 bits and / or channels last (OHWI: a 1x1 kernel's is the
   * same memory); the weight gradient likewise, converted back after. */
  const struct gw_op_desc *d = &op->d;
  const int rs = d->kernel * d->kernel, perm = op->b->nhwc && rs > 1;
  const size_t nw = (size_t)d->k * d->c * rs;
  /* float32 weights inside the parameter buffer need not be 16-byte aligned
   * (tensors are packed: 10 classes put every later one 8 bytes off), and
   * 4-byte plans may leave out the fastest engines: those go through an
   * aligned copy too, made at the first such call. */
  const int copy = op->b->act != GW_FLOAT32 || perm || (uintptr_t)ptr[1] % 16;
  if (copy && !op->wt) { /* both or neither: a failed second left a NULL gradient copy behind */
    void *wt = NULL, *dwt = NULL;
    cudaError_t e = cudaMalloc(&wt, nw * sizeof(float));
    if (e == cudaSuccess && (e = cudaMalloc(&dwt, nw * sizeof(float))) != cudaSuccess) cudaFree(wt);
    if (e != cudaSuccess) return gw__cudnn_cuda_fail(e, dir_name[dir], "cudaMalloc (the weight copies)");
    op->wt = wt, op->dwt = dwt;
  }
  if (copy && dir != DIR_BWD_FILTER) {
    if (perm) KERNEL_TRY(gw__cu_cast_perm(d->k, d->c, rs, 1, op->b->act, op->wt, GW_FLOAT32, ptr[1], STREAM(op)),
                         dir_name[dir]);
    else KERNEL_TRY(gw__cu_cast(nw, op->b->act, op->wt, GW_FLOAT32, ptr[1], STREAM(op)), dir_name[dir]);
    ptr[1] = op->wt;
  } else if (copy) {
    ptr[1] = op->dwt;
  }
  int ai = 0;
  for (int i = 0; i < 3; i++)
    if ((uintptr_t)ptr[i] % 16) ai = 1;
  if (!op->plan[dir][ai]) GW_MODEL_TRY(conv_choose(op, dir, ai, ptr));
  const struct plan_entry *pl = &op->b->plans[op->plan[dir][ai] - 1];
  GW_MODEL_TRY(gw__cudnn_ensure_workspace(op->b, (size_t)pl->ws, dir_name[dir]));
  const double kt0 = gw__cudnn_ktime_start();
  DNN_TRY(plan_execute(op->b, pl->plan, ptr), dir_name[dir]);
  if (kt0 > 0) gw__cudnn_ktime_add("cudnnBackendExecute", dir_name[dir], kt0);
  if (copy && dir == DIR_BWD_FILTER) {
    if (perm) KERNEL_TRY(gw__cu_cast_perm(d->k, d->c, rs, 0, GW_FLOAT32, (void *)p2, op->b->act, op->dwt, STREAM(op)),
                         dir_name[dir]);
    else KERNEL_TRY(gw__cu_cast(nw, GW_FLOAT32, (void *)p2, op->b->act, op->dwt, STREAM(op)), dir_name[dir]);
  }
  return GW_SUCCESS;
}

gw_result_t gw__cudnn_conv_fwd(struct gw_op *op, const gw_act_t *x, const float *w, gw_act_t *y) {
  return conv_run(op, DIR_FWD, x, w, y);
}
gw_result_t gw__cudnn_conv_bwd_data(struct gw_op *op, const gw_act_t *dy, const float *w, gw_act_t *dx) {
  return conv_run(op, DIR_BWD_DATA, dy, w, dx);
}
gw_result_t gw__cudnn_conv_bwd_weights(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, float *dw) {
  return conv_run(op, DIR_BWD_FILTER, x, dy, dw);
}

#endif /* GW_HAVE_CUDNN */
