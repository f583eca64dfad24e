/* backend_cudnn_internal.h - the inside of the cudnn backend, shared by its
 * files: backend_cudnn.c (lifecycle, memory, errors, the ops other than the
 * convolutions, the table) and backend_cudnn_conv.c (the convolutions on cuDNN's
 * graph API: graphs, engine choice by timing, the plan cache).  Not part of
 * backend.h's interface. */
#ifndef GW_MODEL_BACKEND_CUDNN_INTERNAL_H
#define GW_MODEL_BACKEND_CUDNN_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <stdint.h>

#include "backend.h"
#include "cudnn_kernels.h"
#include "model_internal.h"

#define BE "cudnn"

struct gw_backend {
  int device;
  int tf32;
  int first_that_runs; /* GW_CUDNN_DETERMINISTIC: deterministic engines only, the first of the heuristics' order that runs */
  int act;             /* the activations' gw_dtype_t: GW_FLOAT32, GW_BFLOAT16 or GW_FLOAT16 */
  int nhwc;            /* activations channels-last (backend.h GW_LAYOUT_NHWC) */
  cudaStream_t stream;
  cudnnHandle_t dnn;
  cublasHandle_t blas;
  void *ws;            /* the convolutions' workspace */
  size_t ws_bytes;
  size_t ws_limit;     /* the most a candidate plan may ask for */
  cudaEvent_t ev0, ev1; /* plan timing */
  cudaEvent_t *marks;  /* mark: an event per slot, made at its first use */
  int nmarks;
  struct plan_entry *plans; /* chosen plans, shared by ops of one shape */
  int nplans, cap_plans;
  /* sgd_step: the runs last given, on the device and their host copy (uploaded
   * again only when they change), the longest run; nonfinite's device flag. */
  struct gw_sgd_run *runs_dev, *runs_host;
  int nruns;
  size_t max_len;
  int *flag;
  /* upload_async / upload_order: the copy stream (made at the first transfer)
   * and per slot a pinned staging buffer, an event after its last transfer and
   * one after the work that last read its destination. */
  cudaStream_t copy_stream;
  struct stage_slot {
    void *pinned;
    size_t cap;
    cudaEvent_t copied, freed;
    int freed_recorded;
  } slot[2];
};

enum { DIR_FWD, DIR_BWD_DATA, DIR_BWD_FILTER, NDIRS }; /* the convolution's three graphs */

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
  float *row_loss, *loss;          /* LOSS: [n], and [2] on the device: the loss, then the first row with a
                                      bad label (an int32's bits) */
  int32_t *host_labels;            /* LOSS: the labels, fetched to name a bad one */
  void *wt, *dwt;                  /* CONV, FC: the weights as the library takes them and their gradient as it
                                      gives it, where that is not the caller's float32 OIHW: rounded to the
                                      activations' 16 bits, or channels last (OHWI) in NHWC; NULL otherwise */
  char what[160];
};

/* 1 for an NHWC fc over several positions, whose weights the GEMMs take
 * permuted to [k, h, w, c] (backend_cudnn.c). */
int gw__cudnn_fc_permuted(const struct gw_op *op);

/* The messages of a failed CUDA / cuDNN call (backend_cudnn.c). */
/* The backend's table (backend_cudnn.c), which the module's entry hands out
 * (backend_cudnn_module.c). */
extern const struct gw_backend_ops gw__cudnn_ops;
gw_result_t gw__cudnn_cuda_fail(cudaError_t e, const char *what, const char *call);
gw_result_t gw__cudnn_dnn_fail(cudnnStatus_t st, const char *what, const char *call);
const char *gw__cudnn_blas_name(cublasStatus_t st);
/* Grows the convolutions' workspace to at least bytes (waits for the stream first). */
gw_result_t gw__cudnn_ensure_workspace(struct gw_backend *b, size_t bytes, const char *what);

/* The convolutions (backend_cudnn_conv.c): op_create's check that cuDNN has an
 * allowed engine for each direction, the three entry points of the table, and
 * the plans' release (backend destroy). */
gw_result_t gw__cudnn_conv_check(struct gw_op *op);
gw_result_t gw__cudnn_conv_fwd(struct gw_op *op, const gw_act_t *x, const float *w, gw_act_t *y);
gw_result_t gw__cudnn_conv_bwd_data(struct gw_op *op, const gw_act_t *dy, const float *w, gw_act_t *dx);
gw_result_t gw__cudnn_conv_bwd_weights(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, float *dw);

#define CU_TRY(call, what)                                                                     \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) return gw__cudnn_cuda_fail(e_, (what), #call);                                 \
  } while (0)
#define DNN_TRY(call, what)                                                                    \
  do {                                                                                          \
    cudnnStatus_t s_ = (call);                                                                  \
    if (s_ != CUDNN_STATUS_SUCCESS) return gw__cudnn_dnn_fail(s_, (what), #call);                         \
  } while (0)
#define BLAS_TRY(call, what)                                                                   \
  do {                                                                                          \
    cublasStatus_t s_ = (call);                                                                 \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                            \
      return gw__model_fail(GW_ERR_INTERNAL, BE " backend: %s: %s failed: %s (%d)", (what), #call, \
                            gw__cudnn_blas_name(s_), (int)s_);                                            \
  } while (0)
/* GW_CUDNN_KERNEL_TIMES=1 (a diagnostic): the GPU time of every launch of our
 * kernels and every cuDNN execution, by call site, summed until a backend is
 * destroyed, which prints the table to stderr (biggest first) and empties it.
 * Each timed call is bracketed by device synchronizations, so the figures are
 * the work's own plus a launch (a few us) and the run is slower: not for
 * throughput, and where other streams of the process work at the same time
 * (gw-train's allreduces) their work counts too.  ktime_start returns 0 when
 * off. */
double gw__cudnn_ktime_start(void);
void gw__cudnn_ktime_add(const char *call, const char *what, double t0);
void gw__cudnn_ktimes_print(void);
/* Our kernels' launchers return a cudaError_t as int. */
#define KERNEL_TRY(call, what)                            \
  do {                                                    \
    const double kt0_ = gw__cudnn_ktime_start();          \
    CU_TRY((cudaError_t)(call), what);                    \
    if (kt0_ > 0) gw__cudnn_ktime_add(#call, what, kt0_); \
  } while (0)
#define STREAM(op) ((void *)(op)->b->stream)
#define ACT(op) ((op)->b->act)
#define NHWC(op) ((op)->b->nhwc)

#endif
