/* backend_cpu.c - the cpu backend of backend.h on oneDNN (C API, libdnnl 2.6+).
 *
 * Every operation is planned once: op_create builds oneDNN's primitive with the
 * layouts left to oneDNN ("any"), and when its choice differs from the plain
 * PyTorch layout the caller's tensors cross this table in, it also builds the
 * reorders and keeps the reordered copies in memory oneDNN allocates for the op.
 * This is what PyTorch's own CPU convolution does, so comparisons are like for
 * like.
 *
 * Implemented: create/destroy (thread count through OpenMP, the runtime this
 * oneDNN is built with), memory, CONV planning and conv_fwd.  Not yet (NULL in
 * the table): conv backward (data, weights), batch norm, ReLU, pooling, fc, add and
 * the loss; they follow the same pattern (forward primitive descriptor kept as the
 * hint for the backward ones).  Everything else in this file is static.
 */
#include "gw_config.h"

#if GW_HAVE_ONEDNN

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "model_internal.h"

struct gw_backend {
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  int threads;
};

/* One tensor argument: the plain memory the caller's pointer goes into, and when
 * oneDNN wants another layout, the reordered copy and the reorder primitive. */
struct arg {
  dnnl_memory_t user;     /* plain layout, data handle set per call */
  dnnl_memory_t internal; /* NULL when oneDNN takes the plain layout */
  dnnl_primitive_t reorder;
};

struct gw_op {
  struct gw_backend *b;
  struct gw_op_desc d;
  dnnl_primitive_t prim;
  struct arg src, wei, dst;
};

#define DNNL_TRY(call, what)                                                                   \
  do {                                                                                          \
    dnnl_status_t st_ = (call);                                                                 \
    if (st_ != dnnl_success) {                                                                  \
      res = gw__model_fail(GW_ERR_INTERNAL, "cpu backend: %s: %s failed: %s", (what), #call,    \
                           dnnl_status2str(st_));                                               \
      goto fail;                                                                                \
    }                                                                                           \
  } while (0)

static gw_result_t cpu_create(const struct gw_backend_config *cfg, struct gw_backend **out) {
  gw_result_t res = GW_SUCCESS;
  *out = NULL;
  struct gw_backend *b = calloc(1, sizeof *b);
  if (!b) return gw__model_fail(GW_ERR_SYSTEM, "cpu backend: out of memory");
  b->threads = cfg ? cfg->threads : 0;
  if (b->threads < 0) {
    free(b);
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: threads must be 0 (default) or more, got %d",
                          cfg->threads);
  }
#ifdef _OPENMP
  if (b->threads > 0) omp_set_num_threads(b->threads);
#endif
  DNNL_TRY(dnnl_engine_create(&b->engine, dnnl_cpu, 0), "creating the engine");
  DNNL_TRY(dnnl_stream_create(&b->stream, b->engine, dnnl_stream_default_flags), "creating the stream");
  *out = b;
  return GW_SUCCESS;
fail:
  if (b->engine) dnnl_engine_destroy(b->engine);
  free(b);
  return res;
}

static void cpu_destroy(struct gw_backend *b) {
  if (!b) return;
  if (b->stream) dnnl_stream_destroy(b->stream);
  if (b->engine) dnnl_engine_destroy(b->engine);
  free(b);
}

static void *cpu_alloc(struct gw_backend *b, size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? (bytes + 63) / 64 * 64 : 64) != 0) return NULL;
  return p;
}

static void cpu_dealloc(struct gw_backend *b, void *p) { free(p); }

static gw_result_t cpu_copy(struct gw_backend *b, void *dst, const void *src, size_t bytes) {
  memcpy(dst, src, bytes);
  return GW_SUCCESS;
}

static void arg_free(struct arg *a) {
  if (a->reorder) dnnl_primitive_destroy(a->reorder);
  if (a->internal) dnnl_memory_destroy(a->internal);
  if (a->user) dnnl_memory_destroy(a->user);
  memset(a, 0, sizeof *a);
}

static void cpu_op_destroy(struct gw_op *op) {
  if (!op) return;
  if (op->prim) dnnl_primitive_destroy(op->prim);
  arg_free(&op->src);
  arg_free(&op->wei);
  arg_free(&op->dst);
  free(op);
}

/* Sets up one argument: `plain` is the caller's layout, `chosen` oneDNN's.  The
 * reorder goes plain -> chosen for inputs and chosen -> plain for outputs. */
static gw_result_t arg_init(struct gw_backend *b, struct arg *a, const dnnl_memory_desc_t *plain,
                            const dnnl_memory_desc_t *chosen, int is_output, const char *what) {
  gw_result_t res = GW_SUCCESS;
  dnnl_primitive_desc_t rpd = NULL;
  DNNL_TRY(dnnl_memory_create(&a->user, plain, b->engine, DNNL_MEMORY_NONE), what);
  if (dnnl_memory_desc_equal(plain, chosen)) return GW_SUCCESS;
  DNNL_TRY(dnnl_memory_create(&a->internal, chosen, b->engine, DNNL_MEMORY_ALLOCATE), what);
  if (is_output) DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, chosen, b->engine, plain, b->engine, NULL), what);
  else DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, plain, b->engine, chosen, b->engine, NULL), what);
  DNNL_TRY(dnnl_primitive_create(&a->reorder, rpd), what);
  dnnl_primitive_desc_destroy(rpd);
  return GW_SUCCESS;
fail:
  if (rpd) dnnl_primitive_desc_destroy(rpd);
  return res;
}

static gw_result_t run_reorder(struct gw_backend *b, struct arg *a, int is_output, const char *what) {
  gw_result_t res = GW_SUCCESS;
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, is_output ? a->internal : a->user},
                             {DNNL_ARG_TO, is_output ? a->user : a->internal}};
  DNNL_TRY(dnnl_primitive_execute(a->reorder, b->stream, 2, args), what);
  return GW_SUCCESS;
fail:
  return res;
}

static int conv_out(int in, int kernel, int stride, int pad) { return (in + 2 * pad - kernel) / stride + 1; }

static gw_result_t conv_create(struct gw_op *op, char *what) {
  gw_result_t res = GW_SUCCESS;
  const struct gw_op_desc *d = &op->d;
  struct gw_backend *b = op->b;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_memory_desc_t src_plain, wei_plain, dst_plain, src_any, wei_any, dst_any;
  dnnl_dims_t src_dims = {d->n, d->c, d->h, d->w}, wei_dims = {d->k, d->c, d->kernel, d->kernel},
              dst_dims = {d->n, d->k, d->p, d->q}, strides = {d->stride, d->stride}, pads = {d->pad, d->pad};
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_plain, 4, src_dims, dnnl_f32, dnnl_nchw), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_plain, 4, wei_dims, dnnl_f32, dnnl_oihw), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_plain, 4, dst_dims, dnnl_f32, dnnl_nchw), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_any, 4, src_dims, dnnl_f32, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_any, 4, wei_dims, dnnl_f32, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_any, 4, dst_dims, dnnl_f32, dnnl_format_tag_any), what);
  /* Direct, not auto: Winograd's error is far larger than the plain sum's. */
  dnnl_convolution_desc_t cd;
  DNNL_TRY(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &src_any,
                                              &wei_any, NULL, &dst_any, strides, pads, pads),
           what);
  DNNL_TRY(dnnl_primitive_desc_create(&pd, &cd, NULL, b->engine, NULL), what);
  DNNL_TRY(dnnl_primitive_create(&op->prim, pd), what);
  res = arg_init(b, &op->src, &src_plain, dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), 0, what);
  if (res == GW_SUCCESS)
    res = arg_init(b, &op->wei, &wei_plain, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), 0, what);
  if (res == GW_SUCCESS)
    res = arg_init(b, &op->dst, &dst_plain, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), 1, what);
  dnnl_primitive_desc_destroy(pd);
  return res;
fail:
  if (pd) dnnl_primitive_desc_destroy(pd);
  return res;
}

static gw_result_t check_conv_desc(const struct gw_op_desc *d, const char *what) {
  if (d->n < 1 || d->c < 1 || d->h < 1 || d->w < 1 || d->k < 1 || d->kernel < 1 || d->stride < 1 || d->pad < 0)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: %s: every size must be positive", what);
  if (d->h + 2 * d->pad < d->kernel || d->w + 2 * d->pad < d->kernel)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: %s: the %dx%d kernel is larger than the padded input",
                          what, d->kernel, d->kernel);
  int p = conv_out(d->h, d->kernel, d->stride, d->pad), q = conv_out(d->w, d->kernel, d->stride, d->pad);
  if (d->p != p || d->q != q)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: %s: output %dx%d given, the geometry makes %dx%d",
                          what, d->p, d->q, p, q);
  return GW_SUCCESS;
}

static gw_result_t cpu_op_create(struct gw_backend *b, const struct gw_op_desc *d, struct gw_op **out) {
  char what[160];
  *out = NULL;
  snprintf(what, sizeof what, "op kind %d, batch %d, %dx%dx%d -> %dx%dx%d, kernel %d stride %d pad %d", d->kind,
           d->n, d->c, d->h, d->w, d->k, d->p, d->q, d->kernel, d->stride, d->pad);
  if (d->kind != GW_LAYER_CONV)
    return gw__model_fail(GW_ERR_UNSUPPORTED, "cpu backend: %s: only convolutions are implemented so far", what);
  gw_result_t res = check_conv_desc(d, what);
  if (res != GW_SUCCESS) return res;
  struct gw_op *op = calloc(1, sizeof *op);
  if (!op) return gw__model_fail(GW_ERR_SYSTEM, "cpu backend: out of memory");
  op->b = b;
  op->d = *d;
  res = conv_create(op, what);
  if (res != GW_SUCCESS) {
    cpu_op_destroy(op);
    return res;
  }
  *out = op;
  return GW_SUCCESS;
}

/* oneDNN takes non-const handles for inputs too; it does not write them. */
static gw_result_t set_handle(struct arg *a, const void *p, const char *what) {
  gw_result_t res = GW_SUCCESS;
  DNNL_TRY(dnnl_memory_set_data_handle(a->user, (void *)p), what);
  return GW_SUCCESS;
fail:
  return res;
}

static gw_result_t cpu_conv_fwd(struct gw_op *op, const float *x, const float *w, float *y) {
  gw_result_t res = GW_SUCCESS;
  const char *what = "conv_fwd";
  struct gw_backend *b = op->b;
  if (op->d.kind != GW_LAYER_CONV)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: conv_fwd called on an op of kind %d", op->d.kind);
  GW_MODEL_TRY(set_handle(&op->src, x, what));
  GW_MODEL_TRY(set_handle(&op->wei, w, what));
  GW_MODEL_TRY(set_handle(&op->dst, y, what));
  if (op->src.reorder) GW_MODEL_TRY(run_reorder(b, &op->src, 0, what));
  if (op->wei.reorder) GW_MODEL_TRY(run_reorder(b, &op->wei, 0, what));
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, op->src.internal ? op->src.internal : op->src.user},
                             {DNNL_ARG_WEIGHTS, op->wei.internal ? op->wei.internal : op->wei.user},
                             {DNNL_ARG_DST, op->dst.internal ? op->dst.internal : op->dst.user}};
  DNNL_TRY(dnnl_primitive_execute(op->prim, b->stream, 3, args), what);
  if (op->dst.reorder) GW_MODEL_TRY(run_reorder(b, &op->dst, 1, what));
  DNNL_TRY(dnnl_stream_wait(b->stream), what);
  return GW_SUCCESS;
fail:
  return res;
}

const struct gw_backend_ops gw_backend_cpu = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .dealloc = cpu_dealloc,
    .upload = cpu_copy,
    .download = cpu_copy,
    .op_create = cpu_op_create,
    .op_destroy = cpu_op_destroy,
    .conv_fwd = cpu_conv_fwd,
};

#endif /* GW_HAVE_ONEDNN */
