/* backend_cudnn.c - the cudnn backend of backend.h: CUDA on one GPU.
 *
 * - Convolutions (forward, backward data, backward filter) go through cuDNN's
 *   graph API (the backend descriptors of cudnn_graph.h, plain C), since cuDNN 9
 *   marks the legacy convolution calls deprecated.  Each direction of each op is
 *   one operation graph; its execution plan is chosen once per shape, at the
 *   first call, by timing up to 8 candidates the heuristics (mode A, then
 *   fallback) propose on the caller's own buffers, as PyTorch's cudnn.benchmark
 *   does, and kept by the backend for every op of that shape.  Plans are made for
 *   16-byte aligned pointers, and separately (on first need) for 4-byte aligned
 *   ones, since tensors inside the model's one parameter buffer need not be
 *   16-byte aligned.  Engines that down-convert inputs are never used; with
 *   cfg->tf32 == 0 neither are tensor cores or reduced-precision reductions, and
 *   Winograd and FFT only where nothing else runs, so results meet full fp32
 *   tolerances.  The cuDNN library loaded must be 9.x.
 * - The fully connected layer is cuBLAS (cublasGemmEx, float32 accumulation;
 *   TF32 tensor cores only with cfg->tf32), its bias a kernel of ours.
 * - Mixed precision (cfg->act = GW_BFLOAT16): activations in bfloat16; the
 *   float32 weights are rounded into a bfloat16 copy per op at each call, the
 *   weight gradients come out in bfloat16 from cuDNN (widened into the caller's
 *   float32) and in float32 straight from cuBLAS; tensor-core engines with float32
 *   accumulation; the kernels widen every load and round every store once.
 * - Batch norm, ReLU, the residual add, pooling and the loss are our own kernels
 *   (cudnn_kernels.cu): backend.h wants batch norm's saved 1/sqrt(var + eps), the
 *   running statistics updated as PyTorch does, and the SyncBatchNorm phases,
 *   which cuDNN's normalization graphs do not give in that form; the others are
 *   memory-bound loops.  Fusing them into the convolutions' graphs is the next step
 *   for speed (docs/architecture.md).
 *
 * Everything is enqueued on the backend's own stream in call order; upload and
 * download (and the loss, which returns a host float) wait for the stream, so a
 * failure of an earlier kernel is reported there at the latest.  The workspace of
 * the convolutions is one device buffer that grows to the largest chosen plan's
 * need (GW_CUDNN_WORKSPACE_MB caps what a candidate may ask for, default 1024).
 */
#include "gw_config.h"

#if GW_HAVE_CUDNN

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cudnn_kernels.h"
#include "model_internal.h"

#define BE "cudnn"

struct gw_backend {
  int device;
  int tf32;
  int act;             /* the activations' gw_dtype_t: GW_FLOAT32 or GW_BFLOAT16 */
  cudaStream_t stream;
  cudnnHandle_t dnn;
  cublasHandle_t blas;
  void *ws;            /* the convolutions' workspace */
  size_t ws_bytes;
  size_t ws_limit;     /* the most a candidate plan may ask for */
  cudaEvent_t ev0, ev1; /* plan timing */
  struct plan_entry *plans; /* chosen plans, shared by ops of one shape */
  int nplans, cap_plans;
};

enum { DIR_FWD, DIR_BWD_DATA, DIR_BWD_FILTER, NDIRS };
static const char *const dir_name[NDIRS] = {"conv_fwd", "conv_bwd_data", "conv_bwd_weights"};

/* A chosen convolution plan, kept by the backend for every op of the same
 * shape, direction and alignment class (ResNet-50's 53 convolutions have far
 * fewer shapes, and each is timed once). */
struct conv_key {
  int n, c, h, w, k, p, q, kernel, stride, pad, dir, ai;
};
struct plan_entry {
  struct conv_key key;
  cudnnBackendDescriptor_t plan;
  int64_t ws;
};

struct gw_op {
  struct gw_backend *b;
  struct gw_op_desc d;
  int plan[NDIRS][2]; /* [direction][0: 16-byte aligned pointers, 1: 4-byte]: 1 + index in b->plans, 0 none */
  double *sums;                    /* BN: [2c] scratch */
  float *row_loss, *loss;          /* LOSS: [n] and [1] on the device */
  int32_t *host_labels;            /* LOSS: the labels checked on the host */
  void *w16, *dw16;                /* CONV, FC with 16-bit activations: the weights rounded, the weight gradient */
  char what[160];
};

/* ---- errors ---- */

static gw_result_t cuda_fail(cudaError_t e, const char *what, const char *call) {
  return gw__model_fail(e == cudaErrorMemoryAllocation ? GW_ERR_SYSTEM : GW_ERR_INTERNAL,
                        BE " backend: %s: %s failed: %s (%s)", what, call, cudaGetErrorString(e), cudaGetErrorName(e));
}

static gw_result_t dnn_fail(cudnnStatus_t st, const char *what, const char *call) {
  char detail[512] = "";
  cudnnGetLastErrorString(detail, sizeof detail);
  return gw__model_fail(GW_ERR_INTERNAL, BE " backend: %s: %s failed: %s%s%s", what, call, cudnnGetErrorString(st),
                        detail[0] ? ": " : "", detail);
}

static const char *blas_name(cublasStatus_t st) {
  switch (st) {
  case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
  case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
  case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
  default: return "error";
  }
}

#define CU_TRY(call, what)                                                                     \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) return cuda_fail(e_, (what), #call);                                 \
  } while (0)
#define DNN_TRY(call, what)                                                                    \
  do {                                                                                          \
    cudnnStatus_t s_ = (call);                                                                  \
    if (s_ != CUDNN_STATUS_SUCCESS) return dnn_fail(s_, (what), #call);                         \
  } while (0)
#define BLAS_TRY(call, what)                                                                   \
  do {                                                                                          \
    cublasStatus_t s_ = (call);                                                                 \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                            \
      return gw__model_fail(GW_ERR_INTERNAL, BE " backend: %s: %s failed: %s (%d)", (what), #call, \
                            blas_name(s_), (int)s_);                                            \
  } while (0)
/* Our kernels' launchers return a cudaError_t as int. */
#define KERNEL_TRY(call, what) CU_TRY((cudaError_t)(call), what)
#define STREAM(op) ((void *)(op)->b->stream)
#define ACT(op) ((op)->b->act)

/* ---- lifecycle and memory ---- */

static void cudnn_destroy(struct gw_backend *b) {
  if (!b) return;
  if (b->stream) cudaStreamSynchronize(b->stream);
  for (int i = 0; i < b->nplans; i++) cudnnBackendDestroyDescriptor(b->plans[i].plan);
  free(b->plans);
  if (b->ws) cudaFree(b->ws);
  if (b->ev0) cudaEventDestroy(b->ev0);
  if (b->ev1) cudaEventDestroy(b->ev1);
  if (b->blas) cublasDestroy(b->blas);
  if (b->dnn) cudnnDestroy(b->dnn);
  if (b->stream) cudaStreamDestroy(b->stream);
  free(b);
}

static gw_result_t cudnn_create_on(struct gw_backend *b, const struct gw_backend_config *cfg) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1)
    return gw__model_fail(GW_ERR_UNSUPPORTED, BE " backend: no usable GPU (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA devices");
  CU_TRY(cudaGetDevice(&b->device), "create");
  /* Built against one cuDNN 9 header.  Everything used here (the graph API's
   * descriptors and attributes, no DEVICEPROP) exists since 9.0, so any 9.x
   * library is taken, though NVIDIA promises compatibility only with newer
   * minors: scripts/gpu-check.sh builds against the library's own headers. */
  size_t v = cudnnGetVersion();
  if (v / 10000 != CUDNN_MAJOR)
    return gw__model_fail(GW_ERR_UNSUPPORTED, BE " backend: the cuDNN library loaded is %zu.%zu.%zu, built against "
                          "%d.%d.%d (needs %d.x)", v / 10000, v / 100 % 100, v % 100, CUDNN_MAJOR, CUDNN_MINOR,
                          CUDNN_PATCHLEVEL, CUDNN_MAJOR);
  b->tf32 = cfg ? cfg->tf32 : 0;
  b->act = cfg && cfg->act ? cfg->act : GW_FLOAT32;
  const char *mb = getenv("GW_CUDNN_WORKSPACE_MB");
  long lim = mb && *mb ? strtol(mb, NULL, 10) : 1024;
  if (lim < 0) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: GW_CUDNN_WORKSPACE_MB=%s is negative", mb);
  b->ws_limit = (size_t)lim << 20;
  CU_TRY(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), "create");
  CU_TRY(cudaEventCreate(&b->ev0), "create");
  CU_TRY(cudaEventCreate(&b->ev1), "create");
  DNN_TRY(cudnnCreate(&b->dnn), "create");
  DNN_TRY(cudnnSetStream(b->dnn, b->stream), "create");
  BLAS_TRY(cublasCreate(&b->blas), "create");
  BLAS_TRY(cublasSetStream(b->blas, b->stream), "create");
  /* The fc layer's precision is each cublasGemmEx's compute type (fc_fwd). */
  return GW_SUCCESS;
}

static gw_result_t cudnn_create(const struct gw_backend_config *cfg, struct gw_backend **out) {
  *out = NULL;
  if (cfg && (cfg->threads < 0 || cfg->tf32 < 0 || cfg->tf32 > 1))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: threads must be >= 0 and tf32 0 or 1 (got %d, %d)",
                          cfg->threads, cfg->tf32);
  if (cfg && cfg->act && cfg->act != GW_FLOAT32 && cfg->act != GW_BFLOAT16)
    return gw__model_fail(GW_ERR_UNSUPPORTED, BE " backend: activations of dtype %d: float32 or bfloat16 (float16 "
                          "needs loss scaling, not built)", cfg->act);
  struct gw_backend *b = calloc(1, sizeof *b);
  if (!b) return gw__model_fail(GW_ERR_SYSTEM, BE " backend: out of memory");
  gw_result_t res = cudnn_create_on(b, cfg);
  if (res != GW_SUCCESS) {
    cudnn_destroy(b);
    return res;
  }
  *out = b;
  return GW_SUCCESS;
}

static int cudnn_act_dtype(const struct gw_backend *b) { return b->act; }

static void *cudnn_alloc(struct gw_backend *b, size_t bytes) {
  void *p = NULL;
  (void)b;
  if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
    cudaGetLastError(); /* not sticky: clear it */
    return NULL;
  }
  return p;
}

static void cudnn_dealloc(struct gw_backend *b, void *p) {
  if (!p) return;
  cudaStreamSynchronize(b->stream); /* work still queued may use it */
  cudaFree(p);
}

static gw_result_t cudnn_upload(struct gw_backend *b, void *dst, const void *src, size_t bytes) {
  CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, b->stream), "upload");
  CU_TRY(cudaStreamSynchronize(b->stream), "upload (or an operation before it)");
  return GW_SUCCESS;
}

static gw_result_t cudnn_download(struct gw_backend *b, void *dst, const void *src, size_t bytes) {
  CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, b->stream), "download");
  CU_TRY(cudaStreamSynchronize(b->stream), "download (or an operation before it)");
  return GW_SUCCESS;
}

static gw_result_t cudnn_copy(struct gw_backend *b, void *dst, const void *src, size_t bytes) {
  CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b->stream), "copy");
  return GW_SUCCESS;
}

static gw_result_t ensure_workspace(struct gw_backend *b, size_t bytes, const char *what) {
  if (bytes <= b->ws_bytes) return GW_SUCCESS;
  CU_TRY(cudaStreamSynchronize(b->stream), what);
  if (b->ws) cudaFree(b->ws);
  b->ws = NULL;
  b->ws_bytes = 0;
  CU_TRY(cudaMalloc(&b->ws, bytes), what);
  b->ws_bytes = bytes;
  return GW_SUCCESS;
}

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
      gw_result_t r = dnn_fail(st, what, "cudnnBackendSetAttribute");
      cudnnBackendDestroyDescriptor(d);
      return r;
    }
  }
  if (finalize) {
    cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) {
      gw_result_t r = dnn_fail(st, what, "cudnnBackendFinalize");
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

/* An fp32 tensor in the plain layout (NCHW / OIHW), id uid. */
static gw_result_t make_tensor(int64_t uid, cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w,
                               int64_t align, cudnnBackendDescriptor_t *out, const char *what) {
  int64_t dims[4] = {n, c, h, w}, strides[4] = {c * h * w, h * w, w, 1};
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
  /* All three in the activations' dtype: with bfloat16 the weights are a
   * bfloat16 copy and the weight gradient comes out in bfloat16 and is widened
   * (conv_run); compute in float32 either way. */
  cudnnDataType_t dt = op->b->act == GW_BFLOAT16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  if ((res = make_tensor(UID_X, dt, d->n, d->c, d->h, d->w, align, &t[0], what)) != GW_SUCCESS ||
      (res = make_tensor(UID_W, dt, d->k, d->c, d->kernel, d->kernel, align, &t[1], what)) != GW_SUCCESS ||
      (res = make_tensor(UID_Y, dt, d->n, d->k, d->p, d->q, align, &t[2], what)) != GW_SUCCESS)
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

static int notes_allowed(cudnnBackendDescriptor_t cfg, int level) {
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
    lv[0] = NUM_TC, lv[1] = NUM_TC_ANY, *name = "bfloat16 (tensor cores, fp32 accumulation)";
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

/* Times the candidates of cfg[0..ncfg) allowed at `level`; the fastest that ran
 * goes to *best (NULL if none ran).  Counts what it saw for the message. */
static void choose_among(struct gw_op *op, const char *what, cudnnBackendDescriptor_t *cfg, int ncfg, int level,
                         void *const ptr[3], cudnnBackendDescriptor_t *best, int64_t *best_ws, int *allowed,
                         int *ran) {
  struct gw_backend *b = op->b;
  float best_ms = -1;
  for (int i = 0; i < ncfg && *ran < MAX_TIMED; i++) {
    if (!notes_allowed(cfg[i], level)) continue;
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
    if (ensure_workspace(b, (size_t)ws, what) != GW_SUCCESS) { /* too big for what is free now: the next */
      cudaGetLastError();
      cudnnBackendDestroyDescriptor(plan);
      continue;
    }
    float ms = time_plan(b, plan, ptr);
    if (ms >= 0) (*ran)++;
    if (ms >= 0 && (best_ms < 0 || ms < best_ms)) {
      if (*best) cudnnBackendDestroyDescriptor(*best);
      *best = plan, best_ms = ms, *best_ws = ws;
    } else {
      cudnnBackendDestroyDescriptor(plan);
    }
  }
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
  int allowed = 0, ran = 0;
  int lv[2];
  const char *numerics;
  int nlv = levels_of(b, lv, &numerics);
  for (int i = 0; i < nlv && !best; i++) choose_among(op, what, cfg, ncfg, lv[i], ptr, &best, &best_ws, &allowed, &ran);
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
static gw_result_t conv_check(struct gw_op *op) {
  for (int dir = 0; dir < NDIRS; dir++) {
    cudnnBackendDescriptor_t graph = NULL, cfg[2 * MAX_CONFIGS];
    char why[256] = "";
    GW_MODEL_TRY(conv_graph(op, dir, 16, &graph));
    int n = all_configs(graph, cfg, why, sizeof why), ok = 0;
    int lv[2];
    const char *numerics;
    int last = lv[levels_of(op->b, lv, &numerics) - 1];
    for (int i = 0; i < n && !ok; i++) ok = notes_allowed(cfg[i], last);
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
  const int b16 = op->b->act != GW_FLOAT32;
  const size_t nw = (size_t)op->d.k * op->d.c * op->d.kernel * op->d.kernel;
  if (b16 && dir != DIR_BWD_FILTER) { /* the float32 weights rounded into the op's 16-bit copy */
    KERNEL_TRY(gw__cu_cast(nw, op->b->act, op->w16, GW_FLOAT32, ptr[1], STREAM(op)), dir_name[dir]);
    ptr[1] = op->w16;
  } else if (b16) { /* the weight gradient comes out 16-bit, then widened into the caller's float32 */
    ptr[1] = op->dw16;
  }
  int ai = 0;
  for (int i = 0; i < 3; i++)
    if ((uintptr_t)ptr[i] % 16) ai = 1;
  if (!op->plan[dir][ai]) GW_MODEL_TRY(conv_choose(op, dir, ai, ptr));
  const struct plan_entry *pl = &op->b->plans[op->plan[dir][ai] - 1];
  GW_MODEL_TRY(ensure_workspace(op->b, (size_t)pl->ws, dir_name[dir]));
  DNN_TRY(plan_execute(op->b, pl->plan, ptr), dir_name[dir]);
  if (b16 && dir == DIR_BWD_FILTER)
    KERNEL_TRY(gw__cu_cast(nw, GW_FLOAT32, (void *)p2, op->b->act, op->dw16, STREAM(op)), dir_name[dir]);
  return GW_SUCCESS;
}

static gw_result_t cudnn_conv_fwd(struct gw_op *op, const gw_act_t *x, const float *w, gw_act_t *y) {
  return conv_run(op, DIR_FWD, x, w, y);
}
static gw_result_t cudnn_conv_bwd_data(struct gw_op *op, const gw_act_t *dy, const float *w, gw_act_t *dx) {
  return conv_run(op, DIR_BWD_DATA, dy, w, dx);
}
static gw_result_t cudnn_conv_bwd_weights(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, float *dw) {
  return conv_run(op, DIR_BWD_FILTER, x, dy, dw);
}

/* ---- ops ---- */

static void cudnn_op_destroy(struct gw_op *op) {
  if (!op) return;
  /* The plans are the backend's (shared by shape). */
  if (op->sums || op->row_loss || op->loss || op->w16) cudaStreamSynchronize(op->b->stream);
  cudaFree(op->w16);
  cudaFree(op->dw16);
  cudaFree(op->sums);
  cudaFree(op->row_loss);
  cudaFree(op->loss);
  free(op->host_labels);
  free(op);
}

static gw_result_t op_alloc(struct gw_op *op, void **p, size_t bytes) {
  CU_TRY(cudaMalloc(p, bytes), op->what);
  return GW_SUCCESS;
}

static gw_result_t cudnn_op_create(struct gw_backend *b, const struct gw_op_desc *d, struct gw_op **out) {
  *out = NULL;
  struct gw_op *op = calloc(1, sizeof *op);
  if (!op) return gw__model_fail(GW_ERR_SYSTEM, BE " backend: out of memory");
  op->b = b;
  op->d = *d;
  gw_result_t res = gw__backend_check_desc(BE, d, op->what, sizeof op->what);
  if (res == GW_SUCCESS && d->kind == GW_LAYER_BN) res = op_alloc(op, (void **)&op->sums, 2 * (size_t)d->c * sizeof(double));
  if (res == GW_SUCCESS && d->kind == GW_OP_LOSS) {
    res = op_alloc(op, (void **)&op->row_loss, (size_t)d->n * sizeof(float));
    if (res == GW_SUCCESS) res = op_alloc(op, (void **)&op->loss, sizeof(float));
    if (res == GW_SUCCESS && !(op->host_labels = malloc((size_t)d->n * sizeof(int32_t))))
      res = gw__model_fail(GW_ERR_SYSTEM, BE " backend: out of memory");
  }
  if (res == GW_SUCCESS && b->act != GW_FLOAT32 && (d->kind == GW_LAYER_CONV || d->kind == GW_LAYER_FC)) {
    size_t nw = d->kind == GW_LAYER_FC ? (size_t)d->k * d->c * d->h * d->w
                                       : (size_t)d->k * d->c * d->kernel * d->kernel;
    res = op_alloc(op, &op->w16, nw * 2);
    if (res == GW_SUCCESS && d->kind == GW_LAYER_CONV) res = op_alloc(op, &op->dw16, nw * 2);
  }
  /* Plans are chosen at the first call (they are timed on its buffers); that
   * cuDNN has engines for the shape at all is checked here. */
  if (res == GW_SUCCESS && d->kind == GW_LAYER_CONV) res = conv_check(op);
  if (res != GW_SUCCESS) {
    cudnn_op_destroy(op);
    return res;
  }
  *out = op;
  return GW_SUCCESS;
}

#define EXPECT(want, what) GW_MODEL_TRY(gw__backend_expect_kind(BE, op->d.kind, (want), (what)))

static size_t elems(const struct gw_op_desc *d) { return (size_t)d->n * d->c * d->h * d->w; }

static gw_result_t cudnn_relu_fwd(struct gw_op *op, const gw_act_t *x, gw_act_t *y) {
  EXPECT(GW_LAYER_RELU, "relu_fwd");
  KERNEL_TRY(gw__cu_relu_fwd(elems(&op->d), ACT(op), x, y, STREAM(op)), "relu_fwd");
  return GW_SUCCESS;
}

static gw_result_t cudnn_relu_bwd(struct gw_op *op, const gw_act_t *y, const gw_act_t *dy, gw_act_t *dx) {
  EXPECT(GW_LAYER_RELU, "relu_bwd");
  KERNEL_TRY(gw__cu_relu_bwd(elems(&op->d), ACT(op), y, dy, dx, STREAM(op)), "relu_bwd");
  return GW_SUCCESS;
}

static gw_result_t cudnn_add(struct gw_op *op, const gw_act_t *a, const gw_act_t *b, gw_act_t *y) {
  EXPECT(GW_LAYER_ADD, "add");
  KERNEL_TRY(gw__cu_add(elems(&op->d), ACT(op), a, b, y, STREAM(op)), "add");
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_fwd_train(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta, gw_act_t *y,
                                      float *save_mean, float *save_rstd, float *running_mean, float *running_var) {
  EXPECT(GW_LAYER_BN, "bn_fwd_train");
  const struct gw_op_desc *d = &op->d;
  double count = (double)d->n * d->h * d->w;
  if (count < 2)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          BE " backend: bn_fwd_train: batch %d of %dx%d has one value per channel; training needs more "
                             "(as PyTorch)",
                          d->n, d->h, d->w);
  KERNEL_TRY(gw__cu_bn_sums(d, ACT(op), x, op->sums, STREAM(op)), "bn_fwd_train");
  KERNEL_TRY(gw__cu_bn_stats(d, op->sums, count, save_mean, save_rstd, running_mean, running_var, STREAM(op)),
             "bn_fwd_train");
  KERNEL_TRY(gw__cu_bn_fwd_apply(d, ACT(op), x, gamma, beta, save_mean, save_rstd, y, STREAM(op)), "bn_fwd_train");
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_fwd_infer(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta,
                                      const float *running_mean, const float *running_var, gw_act_t *y) {
  EXPECT(GW_LAYER_BN, "bn_fwd_infer");
  KERNEL_TRY(gw__cu_bn_fwd_infer(&op->d, ACT(op), x, gamma, beta, running_mean, running_var, y, STREAM(op)), "bn_fwd_infer");
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_bwd(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *gamma,
                                const float *save_mean, const float *save_rstd, gw_act_t *dx, float *dgamma,
                                float *dbeta) {
  EXPECT(GW_LAYER_BN, "bn_bwd");
  const struct gw_op_desc *d = &op->d;
  double count = (double)d->n * d->h * d->w;
  KERNEL_TRY(gw__cu_bn_bwd_sums(d, ACT(op), x, dy, save_mean, save_rstd, op->sums, STREAM(op)), "bn_bwd");
  KERNEL_TRY(gw__cu_bn_param_grads(d, op->sums, dgamma, dbeta, STREAM(op)), "bn_bwd");
  KERNEL_TRY(gw__cu_bn_bwd_apply(d, ACT(op), x, dy, gamma, save_mean, save_rstd, op->sums, count, dx, STREAM(op)), "bn_bwd");
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_sums(struct gw_op *op, const gw_act_t *x, double *sums) {
  EXPECT(GW_LAYER_BN, "bn_sums");
  KERNEL_TRY(gw__cu_bn_sums(&op->d, ACT(op), x, sums, STREAM(op)), "bn_sums");
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_fwd_apply(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta,
                                      const float *mean, const float *rstd, gw_act_t *y) {
  EXPECT(GW_LAYER_BN, "bn_fwd_apply");
  KERNEL_TRY(gw__cu_bn_fwd_apply(&op->d, ACT(op), x, gamma, beta, mean, rstd, y, STREAM(op)), "bn_fwd_apply");
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_bwd_sums(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *mean,
                                     const float *rstd, double *sums) {
  EXPECT(GW_LAYER_BN, "bn_bwd_sums");
  KERNEL_TRY(gw__cu_bn_bwd_sums(&op->d, ACT(op), x, dy, mean, rstd, sums, STREAM(op)), "bn_bwd_sums");
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_bwd_apply(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *gamma,
                                      const float *mean, const float *rstd, const double *sums, double count,
                                      gw_act_t *dx) {
  EXPECT(GW_LAYER_BN, "bn_bwd_apply");
  if (!(count >= 1))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: bn_bwd_apply: count %g must be >= 1", count);
  KERNEL_TRY(gw__cu_bn_bwd_apply(&op->d, ACT(op), x, dy, gamma, mean, rstd, sums, count, dx, STREAM(op)), "bn_bwd_apply");
  return GW_SUCCESS;
}

/* Max pool keeps one int32 argmax per output. */
static size_t cudnn_workspace_bytes(struct gw_op *op) {
  if (op->d.kind != GW_LAYER_MAXPOOL) return 0;
  return (size_t)op->d.n * op->d.c * op->d.p * op->d.q * sizeof(int32_t);
}

static gw_result_t cudnn_maxpool_fwd(struct gw_op *op, const gw_act_t *x, gw_act_t *y, void *workspace) {
  EXPECT(GW_LAYER_MAXPOOL, "maxpool_fwd");
  KERNEL_TRY(gw__cu_maxpool_fwd(&op->d, ACT(op), x, y, workspace, STREAM(op)), "maxpool_fwd");
  return GW_SUCCESS;
}

static gw_result_t cudnn_maxpool_bwd(struct gw_op *op, const gw_act_t *dy, const void *workspace, gw_act_t *dx) {
  EXPECT(GW_LAYER_MAXPOOL, "maxpool_bwd");
  KERNEL_TRY(gw__cu_maxpool_bwd(&op->d, ACT(op), dy, workspace, dx, STREAM(op)), "maxpool_bwd");
  return GW_SUCCESS;
}

static gw_result_t cudnn_avgpool_fwd(struct gw_op *op, const gw_act_t *x, gw_act_t *y) {
  EXPECT(GW_LAYER_AVGPOOL, "avgpool_fwd");
  KERNEL_TRY(gw__cu_avgpool_fwd(&op->d, ACT(op), x, y, STREAM(op)), "avgpool_fwd");
  return GW_SUCCESS;
}

static gw_result_t cudnn_avgpool_bwd(struct gw_op *op, const gw_act_t *dy, gw_act_t *dx) {
  EXPECT(GW_LAYER_AVGPOOL, "avgpool_bwd");
  KERNEL_TRY(gw__cu_avgpool_bwd(&op->d, ACT(op), dy, dx, STREAM(op)), "avgpool_bwd");
  return GW_SUCCESS;
}

/* C = A B (column-major, ops as cuBLAS's) with A and B in the activations'
 * dtype (the weights already rounded where they are 16-bit) and C in it too, or
 * in float32 when c_f32 (the weight gradient); float32 accumulation, on TF32
 * tensor cores only when asked for fp32 tensors (bfloat16 uses tensor cores). */
static cublasStatus_t gemm(struct gw_op *op, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const void *a, int lda, const void *bm, int ldb, void *c, int c_f32, int ldc) {
  const float one = 1, zero = 0;
  cudaDataType_t t = ACT(op) == GW_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasComputeType_t ct = ACT(op) == GW_FLOAT32 && op->b->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  return cublasGemmEx(op->b->blas, ta, tb, m, n, k, &one, a, t, lda, bm, t, ldb, &zero, c, c_f32 ? CUDA_R_32F : t, ldc,
                      ct, CUBLAS_GEMM_DEFAULT);
}

/* Row-major x [n, f], w [k, f], y [n, k] are, to column-major cuBLAS, x^T [f, n],
 * w^T [f, k], y^T [k, n]:  y^T = w x^T  is  gemm(T, N) of w^T and x^T. */
static gw_result_t cudnn_fc_fwd(struct gw_op *op, const gw_act_t *x, const float *w, const float *bias, gw_act_t *y) {
  EXPECT(GW_LAYER_FC, "fc_fwd");
  const int n = op->d.n, k = op->d.k, f = op->d.c * op->d.h * op->d.w;
  const void *wa = w;
  if (ACT(op) != GW_FLOAT32) {
    KERNEL_TRY(gw__cu_cast((size_t)k * f, ACT(op), op->w16, GW_FLOAT32, w, STREAM(op)), "fc_fwd");
    wa = op->w16;
  }
  BLAS_TRY(gemm(op, CUBLAS_OP_T, CUBLAS_OP_N, k, n, f, wa, f, x, f, y, 0, k), "fc_fwd");
  KERNEL_TRY(gw__cu_bias_add(n, k, ACT(op), bias, y, STREAM(op)), "fc_fwd");
  return GW_SUCCESS;
}

/* dx^T [f, n] = w^T dy^T: gemm(N, N) of w^T [f, k] and dy^T [k, n];
 * dw^T [f, k] = x^T dy:   gemm(N, T) of x^T [f, n] and dy^T [k, n]. */
static gw_result_t cudnn_fc_bwd(struct gw_op *op, const gw_act_t *x, const float *w, const gw_act_t *dy, gw_act_t *dx, float *dw,
                                float *db) {
  EXPECT(GW_LAYER_FC, "fc_bwd");
  const int n = op->d.n, k = op->d.k, f = op->d.c * op->d.h * op->d.w;
  const void *wa = w;
  if (ACT(op) != GW_FLOAT32) {
    KERNEL_TRY(gw__cu_cast((size_t)k * f, ACT(op), op->w16, GW_FLOAT32, w, STREAM(op)), "fc_bwd");
    wa = op->w16;
  }
  BLAS_TRY(gemm(op, CUBLAS_OP_N, CUBLAS_OP_N, f, n, k, wa, f, dy, k, dx, 0, f), "fc_bwd (data)");
  BLAS_TRY(gemm(op, CUBLAS_OP_N, CUBLAS_OP_T, f, k, n, x, f, dy, k, dw, 1, f), "fc_bwd (weights)");
  KERNEL_TRY(gw__cu_bias_grad(n, k, ACT(op), dy, db, STREAM(op)), "fc_bwd (bias)");
  return GW_SUCCESS;
}

/* The labels are device memory: they are fetched (n int32) and checked before
 * the kernel indexes with them; the loss comes back to the host, so this waits. */
static gw_result_t cudnn_loss_fwd_bwd(struct gw_op *op, const gw_act_t *logits, const int32_t *labels,
                                      float grad_scale, float *loss,
                                      gw_act_t *dlogits) {
  EXPECT(GW_OP_LOSS, "loss_fwd_bwd");
  const struct gw_op_desc *d = &op->d;
  GW_MODEL_TRY(cudnn_download(op->b, op->host_labels, labels, (size_t)d->n * sizeof(int32_t)));
  for (int i = 0; i < d->n; i++)
    if (op->host_labels[i] < 0 || op->host_labels[i] >= d->k)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                            BE " backend: loss_fwd_bwd: label %d of sample %d is not in [0, %d)",
                            (int)op->host_labels[i], i, d->k);
  if (!(grad_scale > 0 && grad_scale < INFINITY))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: loss_fwd_bwd: gradient scale %g must be finite and > 0",
                          (double)grad_scale);
  KERNEL_TRY(gw__cu_loss_fwd_bwd(d, ACT(op), logits, labels, grad_scale, op->row_loss, op->loss, dlogits, STREAM(op)),
             "loss_fwd_bwd");
  return cudnn_download(op->b, loss, op->loss, sizeof(float));
}

const struct gw_backend_ops gw_backend_cudnn = {
    .name = "cudnn",
    .host_memory = 0,
    .create = cudnn_create,
    .destroy = cudnn_destroy,
    .alloc = cudnn_alloc,
    .dealloc = cudnn_dealloc,
    .upload = cudnn_upload,
    .download = cudnn_download,
    .copy = cudnn_copy,
    .act_dtype = cudnn_act_dtype,
    .op_create = cudnn_op_create,
    .op_destroy = cudnn_op_destroy,
    .conv_fwd = cudnn_conv_fwd,
    .conv_bwd_data = cudnn_conv_bwd_data,
    .conv_bwd_weights = cudnn_conv_bwd_weights,
    .relu_fwd = cudnn_relu_fwd,
    .relu_bwd = cudnn_relu_bwd,
    .add = cudnn_add,
    .bn_fwd_train = cudnn_bn_fwd_train,
    .bn_fwd_infer = cudnn_bn_fwd_infer,
    .bn_bwd = cudnn_bn_bwd,
    .bn_sums = cudnn_bn_sums,
    .bn_fwd_apply = cudnn_bn_fwd_apply,
    .bn_bwd_sums = cudnn_bn_bwd_sums,
    .bn_bwd_apply = cudnn_bn_bwd_apply,
    .workspace_bytes = cudnn_workspace_bytes,
    .maxpool_fwd = cudnn_maxpool_fwd,
    .maxpool_bwd = cudnn_maxpool_bwd,
    .avgpool_fwd = cudnn_avgpool_fwd,
    .avgpool_bwd = cudnn_avgpool_bwd,
    .fc_fwd = cudnn_fc_fwd,
    .fc_bwd = cudnn_fc_bwd,
    .loss_fwd_bwd = cudnn_loss_fwd_bwd,
};

#endif /* GW_HAVE_CUDNN */
