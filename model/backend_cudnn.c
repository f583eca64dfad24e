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
 * - Mixed precision (cfg->act = GW_BFLOAT16 or GW_FLOAT16): activations in
 *   16 bits; the float32 weights are rounded into a 16-bit copy per op at each
 *   call, the weight gradients come out in 16 bits from cuDNN (widened into the
 *   caller's float32) and in float32 straight from cuBLAS; tensor-core engines
 *   with float32 accumulation; the kernels widen every load and round every
 *   store once.  float16 needs the trainer's loss scaling (its range ends at
 *   65504 and its smallest normal is 2^-14).
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

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "backend_cudnn_internal.h"
#include "sgd.h"

/* ---- errors ---- */

/* A fault that kills the context: every later call returns it, so the call
 * that reports it need not be the one that caused it (kernels run
 * asynchronously: an earlier layer's kernel or cuDNN call may have). */
static bool sticky_fault(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress: case cudaErrorLaunchFailure: case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress: case cudaErrorInvalidAddressSpace: case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError: case cudaErrorAssert: case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

gw_result_t gw__cudnn_cuda_fail(cudaError_t e, const char *what, const char *call) {
  /* Reported here: cleared, so a later library call (cuBLAS, cuDNN) that
   * reads the last error does not report this one as its own (a sticky error
   * stays whatever is done). */
  (void)cudaGetLastError();
  return gw__model_fail(e == cudaErrorMemoryAllocation ? GW_ERR_SYSTEM : GW_ERR_INTERNAL,
                        BE " backend: %s: %s failed: %s (%s)%s", what, call, cudaGetErrorString(e), cudaGetErrorName(e),
                        sticky_fault(e) ? "; the device's context is dead: the fault may come from earlier work on it "
                                          "(kernels run asynchronously; CUDA_LAUNCH_BLOCKING=1 names the call that "
                                          "faults)" : "");
}

gw_result_t gw__cudnn_dnn_fail(cudnnStatus_t st, const char *what, const char *call) {
  char detail[512] = "";
  cudnnGetLastErrorString(detail, sizeof detail);
  return gw__model_fail(GW_ERR_INTERNAL, BE " backend: %s: %s failed: %s%s%s", what, call, cudnnGetErrorString(st),
                        detail[0] ? ": " : "", detail);
}

const char *gw__cudnn_blas_name(cublasStatus_t st) {
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

/* ---- lifecycle and memory ---- */

/* ---- GW_CUDNN_KERNEL_TIMES (backend_cudnn_internal.h) ---- */
static pthread_mutex_t kt_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t kt_once = PTHREAD_ONCE_INIT;
static int kt_on;
static struct ktime {
  const char *call, *what; /* the call site's text and label (string literals) */
  double s;
  long n;
} kt[128];
static int nkt;

static double kt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void kt_init(void) {
  const char *v = getenv("GW_CUDNN_KERNEL_TIMES");
  kt_on = v && *v && strcmp(v, "0") != 0;
}

/* The time spent choosing kernel variants inside a call (gw__cu_tune_seconds)
 * is left out of its site's: t0 is the clock less the seconds chosen so far. */
double gw__cudnn_ktime_start(void) {
  pthread_once(&kt_once, kt_init);
  if (!kt_on) return 0;
  (void)cudaDeviceSynchronize();
  return kt_now() - gw__cu_tune_seconds();
}

void gw__cudnn_ktime_add(const char *call, const char *what, double t0) {
  (void)cudaDeviceSynchronize();
  const double dt = kt_now() - gw__cu_tune_seconds() - t0;
  pthread_mutex_lock(&kt_mu);
  int i = 0;
  while (i < nkt && (kt[i].call != call || kt[i].what != what)) i++;
  if (i == nkt && nkt < (int)(sizeof kt / sizeof kt[0])) kt[nkt++] = (struct ktime){call, what, 0, 0};
  if (i < nkt) kt[i].s += dt, kt[i].n++;
  pthread_mutex_unlock(&kt_mu);
}

static int kt_cmp(const void *a, const void *b) {
  const double x = ((const struct ktime *)a)->s, y = ((const struct ktime *)b)->s;
  return (x < y) - (x > y);
}

void gw__cudnn_ktimes_print(void) {
  pthread_mutex_lock(&kt_mu);
  if (nkt) {
    qsort(kt, (size_t)nkt, sizeof kt[0], kt_cmp);
    double all = 0;
    for (int i = 0; i < nkt; i++) all += kt[i].s;
    fprintf(stderr, "kernel times (GW_CUDNN_KERNEL_TIMES, GPU work between device synchronizations), %.1f ms in all:\n",
            all * 1e3);
    for (int i = 0; i < nkt; i++) {
      const char *c = kt[i].call;
      const int len = (int)(strchr(c, '(') ? strchr(c, '(') - c : (long)strlen(c));
      fprintf(stderr, "  %9.2f ms %6ld calls %9.1f us  %.*s [%s]\n", kt[i].s * 1e3, kt[i].n, kt[i].s * 1e6 / kt[i].n,
              len, c, kt[i].what);
    }
    nkt = 0; /* the next backend's table starts empty */
  }
  pthread_mutex_unlock(&kt_mu);
}

static void cudnn_destroy(struct gw_backend *b) {
  if (!b) return;
  gw__cudnn_ktimes_print();
  if (b->stream) cudaStreamSynchronize(b->stream);
  for (int i = 0; i < b->nplans; i++) cudnnBackendDestroyDescriptor(b->plans[i].plan);
  free(b->plans);
  if (b->ws) cudaFree(b->ws);
  if (b->copy_stream) cudaStreamSynchronize(b->copy_stream), cudaStreamDestroy(b->copy_stream);
  for (int i = 0; i < 2; i++) {
    if (b->slot[i].pinned) cudaFreeHost(b->slot[i].pinned);
    if (b->slot[i].copied) cudaEventDestroy(b->slot[i].copied);
    if (b->slot[i].freed) cudaEventDestroy(b->slot[i].freed);
  }
  if (b->runs_dev) cudaFree(b->runs_dev);
  if (b->flag) cudaFree(b->flag);
  free(b->runs_host);
  if (b->ev0) cudaEventDestroy(b->ev0);
  if (b->ev1) cudaEventDestroy(b->ev1);
  for (int i = 0; i < b->nmarks; i++)
    if (b->marks[i]) cudaEventDestroy(b->marks[i]);
  free(b->marks);
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
  char *end = NULL;
  errno = 0;
  long lim = mb && *mb ? strtol(mb, &end, 10) : 1024;
  if (mb && *mb && (end == mb || *end || errno || lim < 0 || lim > (1l << 30)))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: GW_CUDNN_WORKSPACE_MB=%s: a whole number of MiB, "
                          "0 to 2^30 (\"1G\" was taken as 1)", mb);
  b->ws_limit = (size_t)lim << 20;
  const char *det = getenv("GW_CUDNN_DETERMINISTIC");
  if (det && *det && strcmp(det, "0") && strcmp(det, "1"))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: GW_CUDNN_DETERMINISTIC=%s: 0 or 1", det);
  b->first_that_runs = det && !strcmp(det, "1");
  CU_TRY(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), "create");
  CU_TRY(cudaEventCreate(&b->ev0), "create");
  CU_TRY(cudaEventCreate(&b->ev1), "create");
  DNN_TRY(cudnnCreate(&b->dnn), "create");
  DNN_TRY(cudnnSetStream(b->dnn, b->stream), "create");
  BLAS_TRY(cublasCreate(&b->blas), "create");
  BLAS_TRY(cublasSetStream(b->blas, b->stream), "create");
  /* The fc layer's precision is each cublasGemmEx's compute type (fc_fwd), and
   * float32 throughout: cuBLAS's default math lets a split-K GEMM with 16-bit
   * output add its partial sums in 16 bits. */
  BLAS_TRY(cublasSetMathMode(b->blas, CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION), "create");
  return GW_SUCCESS;
}

static gw_result_t cudnn_create(const struct gw_backend_config *cfg, struct gw_backend **out) {
  *out = NULL;
  if (cfg && (cfg->threads < 0 || cfg->tf32 < 0 || cfg->tf32 > 1))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: threads must be >= 0 and tf32 0 or 1 (got %d, %d)",
                          cfg->threads, cfg->tf32);
  if (cfg && cfg->act && cfg->act != GW_FLOAT32 && cfg->act != GW_BFLOAT16 && cfg->act != GW_FLOAT16)
    return gw__model_fail(GW_ERR_UNSUPPORTED, BE " backend: activations of dtype %d: float32, bfloat16 or float16",
                          cfg->act);
  int nhwc = 0;
  GW_MODEL_TRY(gw__backend_layout(BE, cfg, &nhwc));
  struct gw_backend *b = calloc(1, sizeof *b);
  if (!b) return gw__model_fail(GW_ERR_SYSTEM, BE " backend: out of memory");
  b->nhwc = nhwc;
  gw_result_t res = cudnn_create_on(b, cfg);
  if (res != GW_SUCCESS) {
    cudnn_destroy(b);
    return res;
  }
  *out = b;
  return GW_SUCCESS;
}

static int cudnn_act_dtype(const struct gw_backend *b) { return b->act; }
static int cudnn_layout(const struct gw_backend *b) { return b->nhwc ? GW_LAYOUT_NHWC : GW_LAYOUT_NCHW; }

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
  /* And a staged input's copy into it (the next batch, taken before a stop
   * or an error): cudaFree need not wait for another stream's work. */
  if (b->copy_stream) cudaStreamSynchronize(b->copy_stream);
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

/* The copy stream and the slots' events, at the first transfer. */
static gw_result_t staging_ready(struct gw_backend *b) {
  if (b->copy_stream) return GW_SUCCESS;
  /* Each made once: a failed first try (out of resources) left the ones made
   * and the next try made them again over their handles (leaked). */
  for (int i = 0; i < 2; i++) {
    if (!b->slot[i].copied)
      CU_TRY(cudaEventCreateWithFlags(&b->slot[i].copied, cudaEventDisableTiming), "upload_async");
    if (!b->slot[i].freed)
      CU_TRY(cudaEventCreateWithFlags(&b->slot[i].freed, cudaEventDisableTiming), "upload_async");
  }
  CU_TRY(cudaStreamCreateWithFlags(&b->copy_stream, cudaStreamNonBlocking), "upload_async");
  return GW_SUCCESS;
}

/* The slot's pinned buffer, at least `bytes`, free of its previous transfer. */
static gw_result_t slot_pinned(struct gw_backend *b, int slot, size_t bytes, const char *what) {
  GW_MODEL_TRY(staging_ready(b));
  struct stage_slot *s = &b->slot[slot];
  /* The slot's previous transfer has left the pinned buffer before it is refilled. */
  CU_TRY(cudaEventSynchronize(s->copied), what);
  if (bytes > s->cap) {
    if (s->pinned) cudaFreeHost(s->pinned);
    s->pinned = NULL, s->cap = 0;
    CU_TRY(cudaHostAlloc(&s->pinned, bytes, cudaHostAllocDefault), what);
    s->cap = bytes;
  }
  return GW_SUCCESS;
}

static gw_result_t cudnn_stage_buffer(struct gw_backend *b, int slot, size_t bytes, void **host) {
  if (slot < 0 || slot > 1 || !host)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: stage_buffer: slot %d (0 or 1), %p", slot,
                          (void *)host);
  GW_MODEL_TRY(slot_pinned(b, slot, bytes ? bytes : 1, "stage_buffer (pinned staging memory)"));
  *host = b->slot[slot].pinned;
  return GW_SUCCESS;
}

static gw_result_t cudnn_upload_async(struct gw_backend *b, void *dst, const void *src, size_t bytes, int slot) {
  if (slot < 0 || slot > 1 || (bytes && (!dst || !src)))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: upload_async: slot %d (0 or 1), %zu bytes from %p "
                          "to %p", slot, bytes, src, dst);
  struct stage_slot *s = &b->slot[slot];
  /* Filled in place (stage_buffer): sent as it is. */
  const int in_place = s->pinned && src == s->pinned && bytes <= s->cap;
  if (!in_place) GW_MODEL_TRY(slot_pinned(b, slot, bytes, "upload_async (the slot's previous transfer, pinned memory)"));
  if (!bytes) return GW_SUCCESS;
  if (!in_place) memcpy(s->pinned, src, bytes);
  if (s->freed_recorded) CU_TRY(cudaStreamWaitEvent(b->copy_stream, s->freed, 0), "upload_async");
  CU_TRY(cudaMemcpyAsync(dst, s->pinned, bytes, cudaMemcpyHostToDevice, b->copy_stream), "upload_async");
  CU_TRY(cudaEventRecord(s->copied, b->copy_stream), "upload_async");
  return GW_SUCCESS;
}

static gw_result_t cudnn_upload_order(struct gw_backend *b, int slot) {
  if (slot < 0 || slot > 1) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: upload_order: slot %d", slot);
  GW_MODEL_TRY(staging_ready(b));
  CU_TRY(cudaStreamWaitEvent(b->stream, b->slot[slot].copied, 0), "upload_order");
  struct stage_slot *other = &b->slot[slot ^ 1];
  CU_TRY(cudaEventRecord(other->freed, b->stream), "upload_order");
  other->freed_recorded = 1;
  return GW_SUCCESS;
}

gw_result_t gw__cudnn_ensure_workspace(struct gw_backend *b, size_t bytes, const char *what) {
  if (bytes <= b->ws_bytes) return GW_SUCCESS;
  CU_TRY(cudaStreamSynchronize(b->stream), what);
  if (b->ws) cudaFree(b->ws);
  b->ws = NULL;
  b->ws_bytes = 0;
  CU_TRY(cudaMalloc(&b->ws, bytes), what);
  b->ws_bytes = bytes;
  return GW_SUCCESS;
}

/* ---- ops ---- */

static void cudnn_op_destroy(struct gw_op *op) {
  if (!op) return;
  /* The plans are the backend's (shared by shape). */
  if (op->sums || op->row_loss || op->loss || op->wt) cudaStreamSynchronize(op->b->stream);
  cudaFree(op->wt);
  cudaFree(op->dwt);
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
    if (res == GW_SUCCESS) res = op_alloc(op, (void **)&op->loss, 2 * sizeof(float)); /* the loss, the bad row */
    if (res == GW_SUCCESS && !(op->host_labels = malloc((size_t)d->n * sizeof(int32_t))))
      res = gw__model_fail(GW_ERR_SYSTEM, BE " backend: out of memory");
  }
  /* The weights as the library takes them: rounded to 16 bits, and channels
   * last (OHWI) for NHWC convolutions and an NHWC fc over several positions. */
  const int fc_perm = gw__cudnn_fc_permuted(op);
  if (res == GW_SUCCESS && ((d->kind == GW_LAYER_CONV && (b->act != GW_FLOAT32 || (b->nhwc && d->kernel > 1))) ||
                            (d->kind == GW_LAYER_FC && (b->act != GW_FLOAT32 || fc_perm)))) {
    size_t nw = d->kind == GW_LAYER_FC ? (size_t)d->k * d->c * d->h * d->w
                                       : (size_t)d->k * d->c * d->kernel * d->kernel;
    size_t esz = b->act == GW_FLOAT32 ? sizeof(float) : 2;
    res = op_alloc(op, &op->wt, nw * esz);
    if (res == GW_SUCCESS && d->kind == GW_LAYER_CONV) res = op_alloc(op, &op->dwt, nw * esz);
    if (res == GW_SUCCESS && fc_perm) res = op_alloc(op, &op->dwt, nw * sizeof(float));
  }
  /* Plans are chosen at the first call (they are timed on its buffers); that
   * cuDNN has engines for the shape at all is checked here. */
  if (res == GW_SUCCESS && d->kind == GW_LAYER_CONV) res = gw__cudnn_conv_check(op);
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

/* Batch norm in training, the fused tail (z, relu) included when asked. */
static gw_result_t bn_train(struct gw_op *op, const gw_act_t *x, const gw_act_t *z, int relu, const float *gamma,
                            const float *beta, gw_act_t *y, float *save_mean, float *save_rstd, float *running_mean,
                            float *running_var, const char *what) {
  EXPECT(GW_LAYER_BN, what);
  const struct gw_op_desc *d = &op->d;
  double count = (double)d->n * d->h * d->w;
  if (count < 2)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          BE " backend: %s: batch %d of %dx%d has one value per channel; training needs more "
                             "(as PyTorch)",
                          what, d->n, d->h, d->w);
  KERNEL_TRY(gw__cu_bn_sums(d, ACT(op), NHWC(op), x, op->sums, STREAM(op)), what);
  KERNEL_TRY(gw__cu_bn_stats(d, op->sums, count, save_mean, save_rstd, running_mean, running_var, STREAM(op)), what);
  KERNEL_TRY(gw__cu_bn_fwd_apply(d, ACT(op), NHWC(op), x, z, relu, gamma, beta, save_mean, save_rstd, y, STREAM(op)), what);
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_fwd_train(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta,
                                      gw_act_t *y, float *save_mean, float *save_rstd, float *running_mean,
                                      float *running_var) {
  return bn_train(op, x, NULL, 0, gamma, beta, y, save_mean, save_rstd, running_mean, running_var, "bn_fwd_train");
}

static gw_result_t cudnn_bn_act_fwd_train(struct gw_op *op, const gw_act_t *x, const gw_act_t *z, const float *gamma,
                                          const float *beta, gw_act_t *y, float *save_mean, float *save_rstd,
                                          float *running_mean, float *running_var) {
  return bn_train(op, x, z, 1, gamma, beta, y, save_mean, save_rstd, running_mean, running_var, "bn_act_fwd_train");
}

static gw_result_t bn_infer(struct gw_op *op, const gw_act_t *x, const gw_act_t *z, int relu, const float *gamma,
                            const float *beta, const float *running_mean, const float *running_var, gw_act_t *y,
                            const char *what) {
  EXPECT(GW_LAYER_BN, what);
  KERNEL_TRY(gw__cu_bn_fwd_infer(&op->d, ACT(op), NHWC(op), x, z, relu, gamma, beta, running_mean, running_var, y, STREAM(op)),
             what);
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_fwd_infer(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta,
                                      const float *running_mean, const float *running_var, gw_act_t *y) {
  return bn_infer(op, x, NULL, 0, gamma, beta, running_mean, running_var, y, "bn_fwd_infer");
}

static gw_result_t cudnn_bn_act_fwd_infer(struct gw_op *op, const gw_act_t *x, const gw_act_t *z, const float *gamma,
                                          const float *beta, const float *running_mean, const float *running_var,
                                          gw_act_t *y) {
  return bn_infer(op, x, z, 1, gamma, beta, running_mean, running_var, y, "bn_act_fwd_infer");
}

/* Batch norm's backward, with a fused ReLU's mask (ym) and the residual's
 * gradient (dz) when asked. */
static gw_result_t bn_backward(struct gw_op *op, const gw_act_t *x, const gw_act_t *ym, const gw_act_t *dy,
                               const float *gamma, const float *save_mean, const float *save_rstd, gw_act_t *dx,
                               gw_act_t *dz, float *dgamma, float *dbeta, const char *what) {
  EXPECT(GW_LAYER_BN, what);
  const struct gw_op_desc *d = &op->d;
  double count = (double)d->n * d->h * d->w;
  KERNEL_TRY(gw__cu_bn_bwd_sums(d, ACT(op), NHWC(op), x, ym, dy, save_mean, save_rstd, op->sums, STREAM(op)), what);
  KERNEL_TRY(gw__cu_bn_param_grads(d, op->sums, dgamma, dbeta, STREAM(op)), what);
  KERNEL_TRY(gw__cu_bn_bwd_apply(d, ACT(op), NHWC(op), x, ym, dy, gamma, save_mean, save_rstd, op->sums, count, dx, dz,
                                 STREAM(op)),
             what);
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_bwd(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *gamma,
                                const float *save_mean, const float *save_rstd, gw_act_t *dx, float *dgamma,
                                float *dbeta) {
  return bn_backward(op, x, NULL, dy, gamma, save_mean, save_rstd, dx, NULL, dgamma, dbeta, "bn_bwd");
}

static gw_result_t cudnn_bn_act_bwd(struct gw_op *op, const gw_act_t *x, const gw_act_t *y, const gw_act_t *dy,
                                    const float *gamma, const float *save_mean, const float *save_rstd, gw_act_t *dx,
                                    gw_act_t *dz, float *dgamma, float *dbeta) {
  if (!y) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: bn_act_bwd needs the fused output y");
  return bn_backward(op, x, y, dy, gamma, save_mean, save_rstd, dx, dz, dgamma, dbeta, "bn_act_bwd");
}

static gw_result_t cudnn_bn_sums(struct gw_op *op, const gw_act_t *x, double *sums) {
  EXPECT(GW_LAYER_BN, "bn_sums");
  KERNEL_TRY(gw__cu_bn_sums(&op->d, ACT(op), NHWC(op), x, sums, STREAM(op)), "bn_sums");
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_fwd_apply(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta,
                                      const float *mean, const float *rstd, gw_act_t *y) {
  EXPECT(GW_LAYER_BN, "bn_fwd_apply");
  KERNEL_TRY(gw__cu_bn_fwd_apply(&op->d, ACT(op), NHWC(op), x, NULL, 0, gamma, beta, mean, rstd, y, STREAM(op)),
             "bn_fwd_apply");
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_bwd_sums(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *mean,
                                     const float *rstd, double *sums) {
  EXPECT(GW_LAYER_BN, "bn_bwd_sums");
  KERNEL_TRY(gw__cu_bn_bwd_sums(&op->d, ACT(op), NHWC(op), x, NULL, dy, mean, rstd, sums, STREAM(op)), "bn_bwd_sums");
  return GW_SUCCESS;
}

static gw_result_t cudnn_bn_bwd_apply(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *gamma,
                                      const float *mean, const float *rstd, const double *sums, double count,
                                      gw_act_t *dx) {
  EXPECT(GW_LAYER_BN, "bn_bwd_apply");
  if (!(count >= 1))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: bn_bwd_apply: count %g must be >= 1", count);
  KERNEL_TRY(gw__cu_bn_bwd_apply(&op->d, ACT(op), NHWC(op), x, NULL, dy, gamma, mean, rstd, sums, count, dx, NULL, STREAM(op)),
             "bn_bwd_apply");
  return GW_SUCCESS;
}

/* Max pool keeps one int32 argmax per output. */
static size_t cudnn_workspace_bytes(struct gw_op *op) {
  if (op->d.kind != GW_LAYER_MAXPOOL) return 0;
  return (size_t)op->d.n * op->d.c * op->d.p * op->d.q * sizeof(int32_t);
}

static gw_result_t cudnn_maxpool_fwd(struct gw_op *op, const gw_act_t *x, gw_act_t *y, void *workspace) {
  EXPECT(GW_LAYER_MAXPOOL, "maxpool_fwd");
  KERNEL_TRY(gw__cu_maxpool_fwd(&op->d, ACT(op), NHWC(op), x, y, workspace, STREAM(op)), "maxpool_fwd");
  return GW_SUCCESS;
}

static gw_result_t cudnn_maxpool_bwd(struct gw_op *op, const gw_act_t *dy, const void *workspace, gw_act_t *dx) {
  EXPECT(GW_LAYER_MAXPOOL, "maxpool_bwd");
  KERNEL_TRY(gw__cu_maxpool_bwd(&op->d, ACT(op), NHWC(op), dy, workspace, dx, STREAM(op)), "maxpool_bwd");
  return GW_SUCCESS;
}

static gw_result_t cudnn_avgpool_fwd(struct gw_op *op, const gw_act_t *x, gw_act_t *y) {
  EXPECT(GW_LAYER_AVGPOOL, "avgpool_fwd");
  KERNEL_TRY(gw__cu_avgpool_fwd(&op->d, ACT(op), NHWC(op), x, y, STREAM(op)), "avgpool_fwd");
  return GW_SUCCESS;
}

static gw_result_t cudnn_avgpool_bwd(struct gw_op *op, const gw_act_t *dy, gw_act_t *dx) {
  EXPECT(GW_LAYER_AVGPOOL, "avgpool_bwd");
  KERNEL_TRY(gw__cu_avgpool_bwd(&op->d, ACT(op), NHWC(op), dy, dx, STREAM(op)), "avgpool_bwd");
  return GW_SUCCESS;
}

/* C = A B (column-major, ops as cuBLAS's) with A and B in the activations'
 * dtype (the weights already rounded where they are 16-bit) and C in it too, or
 * in float32 when c_f32 (the weight gradient); float32 accumulation, on TF32
 * tensor cores only when asked for fp32 tensors (bfloat16 uses tensor cores). */
static cublasStatus_t gemm(struct gw_op *op, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const void *a, int lda, const void *bm, int ldb, void *c, int c_f32, int ldc) {
  const float one = 1, zero = 0;
  cudaDataType_t t = ACT(op) == GW_BFLOAT16 ? CUDA_R_16BF : ACT(op) == GW_FLOAT16 ? CUDA_R_16F : CUDA_R_32F;
  cublasComputeType_t ct = ACT(op) == GW_FLOAT32 && op->b->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  return cublasGemmEx(op->b->blas, ta, tb, m, n, k, &one, a, t, lda, bm, t, ldb, &zero, c, c_f32 ? CUDA_R_32F : t, ldc,
                      ct, CUBLAS_GEMM_DEFAULT);
}

/* An NHWC fc over several positions: its input's features are [h, w, c], so
 * the GEMMs take the weight as [k, h, w, c] (and give its gradient so). */
int gw__cudnn_fc_permuted(const struct gw_op *op) {
  return op->b->nhwc && op->d.kind == GW_LAYER_FC && (int64_t)op->d.h * op->d.w > 1;
}

/* The fc weight as the GEMMs take it: w itself for float32 activations, else
 * rounded into the op's 16-bit copy, permuted there where gw__cudnn_fc_permuted
 * (per call: the optimizer moves w). */
static gw_result_t fc_weights(struct gw_op *op, const float *w, const void **wa, const char *what) {
  const struct gw_op_desc *d = &op->d;
  *wa = w;
  if (gw__cudnn_fc_permuted(op))
    KERNEL_TRY(gw__cu_cast_perm(d->k, d->c, d->h * d->w, 1, ACT(op), op->wt, GW_FLOAT32, w, STREAM(op)), what);
  else if (ACT(op) != GW_FLOAT32)
    KERNEL_TRY(gw__cu_cast((size_t)d->k * d->c * d->h * d->w, ACT(op), op->wt, GW_FLOAT32, w, STREAM(op)), what);
  else
    return GW_SUCCESS;
  *wa = op->wt;
  return GW_SUCCESS;
}

/* Row-major x [n, f], w [k, f], y [n, k] are, to column-major cuBLAS, x^T [f, n],
 * w^T [f, k], y^T [k, n]:  y^T = w x^T  is  gemm(T, N) of w^T and x^T. */
static gw_result_t cudnn_fc_fwd(struct gw_op *op, const gw_act_t *x, const float *w, const float *bias, gw_act_t *y) {
  EXPECT(GW_LAYER_FC, "fc_fwd");
  const int n = op->d.n, k = op->d.k, f = op->d.c * op->d.h * op->d.w;
  const void *wa;
  GW_MODEL_TRY(fc_weights(op, w, &wa, "fc_fwd"));
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
  const void *wa;
  GW_MODEL_TRY(fc_weights(op, w, &wa, "fc_bwd"));
  BLAS_TRY(gemm(op, CUBLAS_OP_N, CUBLAS_OP_N, f, n, k, wa, f, dy, k, dx, 0, f), "fc_bwd (data)");
  const int perm = gw__cudnn_fc_permuted(op);
  BLAS_TRY(gemm(op, CUBLAS_OP_N, CUBLAS_OP_T, f, k, n, x, f, dy, k, perm ? op->dwt : dw, 1, f), "fc_bwd (weights)");
  if (perm) /* [k, h, w, c] back to PyTorch's [k, c, h, w] */
    KERNEL_TRY(gw__cu_cast_perm(k, op->d.c, op->d.h * op->d.w, 0, GW_FLOAT32, dw, GW_FLOAT32, op->dwt, STREAM(op)),
               "fc_bwd (weights)");
  KERNEL_TRY(gw__cu_bias_grad(n, k, ACT(op), dy, db, STREAM(op)), "fc_bwd (bias)");
  return GW_SUCCESS;
}

/* The labels are device memory: the kernel checks them (a row with a label
 * outside [0, k) is not computed and reported), and the loss comes back to the
 * host with that verdict in one download: the one wait of the call.  On a bad
 * label the labels are fetched to name it. */
static gw_result_t cudnn_loss_fwd_bwd(struct gw_op *op, const gw_act_t *logits, const int32_t *labels,
                                      float grad_scale, float *loss,
                                      gw_act_t *dlogits) {
  EXPECT(GW_OP_LOSS, "loss_fwd_bwd");
  const struct gw_op_desc *d = &op->d;
  if (!(grad_scale > 0 && grad_scale < INFINITY))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: loss_fwd_bwd: gradient scale %g must be finite and > 0",
                          (double)grad_scale);
  int *bad = (int *)(op->loss + 1);
  KERNEL_TRY(gw__cu_loss_fwd_bwd(d, ACT(op), logits, labels, grad_scale, op->row_loss, op->loss, bad, dlogits,
                                 STREAM(op)),
             "loss_fwd_bwd");
  float back[2];
  GW_MODEL_TRY(cudnn_download(op->b, back, op->loss, sizeof back));
  int32_t row;
  memcpy(&row, &back[1], sizeof row);
  if (row >= 0 && row < d->n) {
    GW_MODEL_TRY(cudnn_download(op->b, op->host_labels, labels, (size_t)d->n * sizeof(int32_t)));
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: loss_fwd_bwd: label %d of sample %d is not in [0, %d)",
                          (int)op->host_labels[row], (int)row, d->k);
  }
  *loss = back[0];
  return GW_SUCCESS;
}

/* ---- training in device memory (cudnn_optim.cu) */

/* The runs on the device: uploaded the first time and whenever they change
 * (one optimizer's runs never do). */
static gw_result_t runs_on_device(struct gw_backend *b, const struct gw_sgd_run *runs, int nruns) {
  const size_t bytes = (size_t)nruns * sizeof *runs;
  if (nruns == b->nruns && b->runs_host && !memcmp(runs, b->runs_host, bytes)) return GW_SUCCESS;
  CU_TRY(cudaStreamSynchronize(b->stream), "sgd_step"); /* an older step may still read them */
  if (b->runs_dev) cudaFree(b->runs_dev);
  free(b->runs_host);
  b->runs_dev = NULL, b->nruns = 0, b->max_len = 0;
  if (!(b->runs_host = malloc(bytes ? bytes : 1))) return gw__model_fail(GW_ERR_SYSTEM, BE " backend: out of memory");
  CU_TRY(cudaMalloc((void **)&b->runs_dev, bytes ? bytes : 1), "sgd_step");
  memcpy(b->runs_host, runs, bytes);
  /* On the backend's stream: a plain cudaMemcpy from pageable memory may return
   * before the data lands, and the stream (non-blocking) would not wait for
   * it.  runs_host outlives the copy (freed only after a sync). */
  CU_TRY(cudaMemcpyAsync(b->runs_dev, b->runs_host, bytes, cudaMemcpyHostToDevice, b->stream), "sgd_step");
  b->nruns = nruns;
  for (int i = 0; i < nruns; i++) b->max_len = runs[i].len > b->max_len ? runs[i].len : b->max_len;
  return GW_SUCCESS;
}

static gw_result_t cudnn_sgd_step(struct gw_backend *b, const struct gw_sgd_run *runs, int nruns, float *params,
                                  const float *grads, float *momentum, const struct gw_sgd_scalars *sc) {
  if (nruns < 0 || nruns > 65535 || (nruns && (!runs || !params || !grads)) || !sc)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: sgd_step needs runs (at most 65535), parameters, "
                          "gradients and scalars (got %d runs)", nruns);
  GW_MODEL_TRY(runs_on_device(b, runs, nruns));
  KERNEL_TRY(gw__cu_sgd_step(b->runs_dev, nruns, b->max_len, params, grads, momentum, sc, b->stream), "sgd_step");
  return GW_SUCCESS;
}

static gw_result_t cudnn_nonfinite(struct gw_backend *b, const float *x, size_t n, int *found) {
  if ((n && !x) || !found) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: nonfinite needs x and found");
  if (!b->flag) CU_TRY(cudaMalloc((void **)&b->flag, sizeof(int)), "nonfinite");
  KERNEL_TRY(gw__cu_nonfinite(x, n, b->flag, b->stream), "nonfinite");
  return cudnn_download(b, found, b->flag, sizeof(int));
}

static void *cudnn_stream(struct gw_backend *b) { return (void *)b->stream; }

/* ---- time marks: events on the stream */

static gw_result_t cudnn_mark(struct gw_backend *b, int slot) {
  if (slot < 0 || slot >= GW_BACKEND_MARKS)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: mark %d is not in [0, %d)", slot, GW_BACKEND_MARKS);
  if (slot >= b->nmarks) {
    int n = b->nmarks ? b->nmarks : 64;
    while (n <= slot) n *= 2;
    cudaEvent_t *m = realloc(b->marks, (size_t)n * sizeof *m);
    if (!m) return gw__model_fail(GW_ERR_SYSTEM, BE " backend: out of memory for %d time marks", n);
    memset(m + b->nmarks, 0, (size_t)(n - b->nmarks) * sizeof *m);
    b->marks = m, b->nmarks = n;
  }
  if (!b->marks[slot]) CU_TRY(cudaEventCreate(&b->marks[slot]), "mark");
  CU_TRY(cudaEventRecord(b->marks[slot], b->stream), "mark");
  return GW_SUCCESS;
}

static gw_result_t cudnn_mark_elapsed(struct gw_backend *b, int from, int to, double *seconds) {
  if (from < 0 || to < 0 || from >= b->nmarks || to >= b->nmarks || !b->marks[from] || !b->marks[to])
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, BE " backend: mark_elapsed(%d, %d): a mark never taken", from, to);
  float ms = 0;
  CU_TRY(cudaEventSynchronize(b->marks[to]), "mark_elapsed");
  CU_TRY(cudaEventSynchronize(b->marks[from]), "mark_elapsed");
  CU_TRY(cudaEventElapsedTime(&ms, b->marks[from], b->marks[to]), "mark_elapsed");
  *seconds = 1e-3 * (double)ms;
  return GW_SUCCESS;
}

const struct gw_backend_ops gw__cudnn_ops = {
    .name = "cudnn",
    .host_memory = 0,
    .create = cudnn_create,
    .destroy = cudnn_destroy,
    .alloc = cudnn_alloc,
    .dealloc = cudnn_dealloc,
    .upload = cudnn_upload,
    .download = cudnn_download,
    .copy = cudnn_copy,
    .upload_async = cudnn_upload_async,
    .upload_order = cudnn_upload_order,
    .stage_buffer = cudnn_stage_buffer,
    .act_dtype = cudnn_act_dtype,
    .layout = cudnn_layout,
    .op_create = cudnn_op_create,
    .op_destroy = cudnn_op_destroy,
    .conv_fwd = gw__cudnn_conv_fwd,
    .conv_bwd_data = gw__cudnn_conv_bwd_data,
    .conv_bwd_weights = gw__cudnn_conv_bwd_weights,
    .relu_fwd = cudnn_relu_fwd,
    .relu_bwd = cudnn_relu_bwd,
    .add = cudnn_add,
    .bn_fwd_train = cudnn_bn_fwd_train,
    .bn_fwd_infer = cudnn_bn_fwd_infer,
    .bn_bwd = cudnn_bn_bwd,
    .bn_act_fwd_train = cudnn_bn_act_fwd_train,
    .bn_act_fwd_infer = cudnn_bn_act_fwd_infer,
    .bn_act_bwd = cudnn_bn_act_bwd,
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
    .sgd_step = cudnn_sgd_step,
    .nonfinite = cudnn_nonfinite,
    .stream = cudnn_stream,
    .mark = cudnn_mark,
    .mark_elapsed = cudnn_mark_elapsed,
};

#endif /* GW_HAVE_CUDNN */
