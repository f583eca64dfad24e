/* backend_cpu.c - the cpu backend of backend.h on oneDNN (C API, libdnnl 2.6+).
 *
 * Every operation is planned once: op_create builds oneDNN's primitive with the
 * layouts left to oneDNN ("any"), and when its choice differs from the plain
 * PyTorch layout the caller's tensors cross this table in, it also builds the
 * reorders; the reordered copies of every op live in one arena per backend
 * (step_run), which is why a backend runs one call at a time.
 * This is what PyTorch's own CPU convolution does, so comparisons are like for
 * like.
 *
 * Every entry of the table is implemented.  This file holds the lifecycle
 * (threads through OpenMP, the runtime this oneDNN is built with), memory, the
 * argument/step machinery that runs a planned primitive on the caller's pointers,
 * op_create's checks and the table.  The oneDNN planners (convolution forward and
 * both backwards, ReLU, max pool, fully connected) are in backend_cpu_prims.c;
 * batch norm, global average pool and the loss are plain C loops in
 * backend_cpu_kernels.c (why: see there); the residual add is a loop here.  The
 * structures shared between them are in backend_cpu_internal.h.  Everything else
 * in this file is static.
 */
#include "gw_config.h"

#if GW_HAVE_ONEDNN

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#include <pthread.h>
#endif

#include "backend_cpu_internal.h"
#include "backend_cpu_kernels.h"
#include "sgd.h"

/* OpenMP's thread count is a setting of the calling thread (omp_set_num_threads
 * changes that thread's only, and keeps it), so a backend applies its own on
 * whichever thread calls it, at each entry that plans or runs an op
 * (op_create: oneDNN sizes some plans by it; op_entry).  threads 0
 * applies the process's default: OpenMP's count when the first cpu backend was
 * created, before any backend set one. */
#ifdef _OPENMP
static int omp_default_threads;
static pthread_once_t omp_default_once = PTHREAD_ONCE_INIT;
static void read_omp_default(void) { omp_default_threads = omp_get_max_threads(); }

static void use_threads(const struct gw_backend *b) {
  const int want = b->threads ? b->threads : omp_default_threads;
  if (omp_get_max_threads() != want) omp_set_num_threads(want);
}
#else
static void use_threads(const struct gw_backend *b) { (void)b; }
#endif

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
  b->act = cfg && cfg->act ? cfg->act : GW_FLOAT32;
  if (b->act != GW_FLOAT32 && b->act != GW_BFLOAT16) {
    int act = b->act;
    free(b);
    return gw__model_fail(GW_ERR_UNSUPPORTED, "cpu backend: activations of dtype %d%s: only float32 and bfloat16", act,
                          act == GW_FLOAT16 ? " (float16: oneDNN has no float16 training on this CPU)" : "");
  }
  b->adt = b->act == GW_BFLOAT16 ? dnnl_bf16 : dnnl_f32;
  if ((res = gw__backend_layout("cpu", cfg, &b->nhwc)) != GW_SUCCESS) {
    free(b);
    return res;
  }
  b->atag = b->nhwc ? dnnl_nhwc : dnnl_nchw;
#ifdef _OPENMP
  pthread_once(&omp_default_once, read_omp_default);
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
  free(b->marks);
  free(b->stage[0]), free(b->stage[1]);
  free(b->arena);
  free(b);
}

static gw_result_t cpu_mark(struct gw_backend *b, int slot) {
  if (slot < 0 || slot >= GW_BACKEND_MARKS)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: mark %d is not in [0, %d)", slot, GW_BACKEND_MARKS);
  if (slot >= b->nmarks) {
    int n = b->nmarks ? b->nmarks : 64;
    while (n <= slot) n *= 2;
    double *m = realloc(b->marks, (size_t)n * sizeof *m);
    if (!m) return gw__model_fail(GW_ERR_SYSTEM, "cpu backend: out of memory for %d time marks", n);
    for (int i = b->nmarks; i < n; i++) m[i] = NAN;
    b->marks = m, b->nmarks = n;
  }
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  b->marks[slot] = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  return GW_SUCCESS;
}

static gw_result_t cpu_mark_elapsed(struct gw_backend *b, int from, int to, double *seconds) {
  if (from < 0 || to < 0 || from >= b->nmarks || to >= b->nmarks || isnan(b->marks[from]) || isnan(b->marks[to]))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: mark_elapsed(%d, %d): a mark never taken", from, to);
  *seconds = b->marks[to] - b->marks[from];
  return GW_SUCCESS;
}

static int cpu_act_dtype(const struct gw_backend *b) { return b->act; }
static int cpu_layout(const struct gw_backend *b) { return b->nhwc ? GW_LAYOUT_NHWC : GW_LAYOUT_NCHW; }

static void *cpu_alloc(struct gw_backend *b, size_t bytes) {
  void *p = NULL;
  if (bytes > SIZE_MAX - 63) return NULL; /* rounded up, it wrapped to 0 */
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

static void step_free(struct step *st) {
  if (st->prim) dnnl_primitive_destroy(st->prim);
  for (int i = 0; i < st->nargs; i++) arg_free(&st->a[i]);
  memset(st, 0, sizeof *st);
}

static void cpu_op_destroy(struct gw_op *op) {
  if (!op) return;
  step_free(&op->fwd);
  step_free(&op->bwd_data);
  step_free(&op->bwd_wei);
  free(op);
}

/* An output out of oneDNN's blocked layout by gw__cpu_unblock (the weight
 * gradients: oneDNN 2.6 reorders the 1x1 convolutions' "ABcd16b64a" to plain
 * at ~3.4 GB/s on this machine's two cores, 2048 x 1024 in 2.45 ms, the loop
 * at ~18 GB/s, 0.46 ms; "ABcd16b16a" both at ~17-18 GB/s; about 7 ms of a
 * 28x28 batch-64 step's ~170):
 * where `chosen` has two inner blocks on two dims, no padding and no offset,
 * `plain` no blocks (a view with an offset too: the inner products' taps),
 * both of one 2- or 4-byte type (arg_init: not with GW_CPU_UNBLOCK=0,
 * oneDNN's reorder always, for A/B runs).  test_model_backend checks it
 * against oneDNN's. */
bool gw__cpu_plan_unblock(struct gw_cpu_unblock *t, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *chosen) {
  const int nd = chosen->ndims;
  if (nd < 2 || nd > 6 || plain->ndims != nd || plain->data_type != chosen->data_type) return false;
  if (chosen->format_kind != dnnl_blocked || plain->format_kind != dnnl_blocked) return false;
  if (chosen->offset0 || plain->offset0 < 0 || chosen->extra.flags || plain->extra.flags) return false;
  const dnnl_blocking_desc_t *cb = &chosen->format_desc.blocking, *pb = &plain->format_desc.blocking;
  if (cb->inner_nblks != 2 || pb->inner_nblks != 0 || cb->inner_idxs[0] == cb->inner_idxs[1]) return false;
  const dnnl_data_type_t dt = chosen->data_type;
  if (dt != dnnl_f32 && dt != dnnl_bf16 && dt != dnnl_f16) return false;
  *t = (struct gw_cpu_unblock){.ndims = nd, .p = (int)cb->inner_idxs[0], .q = (int)cb->inner_idxs[1],
                               .bp = (int)cb->inner_blks[0], .bq = (int)cb->inner_blks[1], .esize = dt == dnnl_f32 ? 4 : 2,
                               .doff = plain->offset0};
  if (t->p < 0 || t->p >= nd || t->q < 0 || t->q >= nd || t->bp < 1 || t->bq < 1) return false;
  for (int d = 0; d < nd; d++) {
    const int64_t blk = d == t->p ? t->bp : d == t->q ? t->bq : 1;
    if (chosen->dims[d] != plain->dims[d] || chosen->padded_dims[d] != chosen->dims[d] ||
        plain->padded_dims[d] != plain->dims[d] || chosen->dims[d] % blk)
      return false;
    t->nb[d] = chosen->dims[d] / blk;
    t->sstride[d] = cb->strides[d];
    t->dstride[d] = pb->strides[d];
  }
  return true;
}

/* How many of an op's outputs gw__cpu_unblock reorders (test_model_backend). */
int gw__cpu_op_unblocks(const struct gw_op *op) {
  int n = 0;
  const struct step *steps[] = {&op->fwd, &op->bwd_data, &op->bwd_wei};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < steps[k]->nargs; i++) n += steps[k]->a[i].own_unblock;
  return n;
}

/* Sets up one argument of step st: `plain` is the caller's layout, `chosen`
 * oneDNN's.  The reorder goes plain -> chosen for inputs and chosen -> plain
 * for outputs; the reordered copy takes the next place in the step's part of
 * the arena (its data handle set at each run). */
static gw_result_t arg_init(struct gw_backend *b, struct step *st, struct arg *a, const dnnl_memory_desc_t *plain,
                            const dnnl_memory_desc_t *chosen, int is_output, const char *what) {
  gw_result_t res = GW_SUCCESS;
  dnnl_primitive_desc_t rpd = NULL;
  DNNL_TRY(dnnl_memory_create(&a->user, plain, b->engine, DNNL_MEMORY_NONE), what);
  if (dnnl_memory_desc_equal(plain, chosen)) return GW_SUCCESS;
  DNNL_TRY(dnnl_memory_create(&a->internal, chosen, b->engine, DNNL_MEMORY_NONE), what);
  const char *env = getenv("GW_CPU_UNBLOCK");
  a->own_unblock = is_output && !(env && !strcmp(env, "0")) && gw__cpu_plan_unblock(&a->unblock, plain, chosen);
  if (!a->own_unblock) {
    if (is_output) DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, chosen, b->engine, plain, b->engine, NULL), what);
    else DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, plain, b->engine, chosen, b->engine, NULL), what);
    DNNL_TRY(dnnl_primitive_create(&a->reorder, rpd), what);
    dnnl_primitive_desc_destroy(rpd);
  }
  /* counted once made (the size includes a blocked layout's padding, which
   * oneDNN 2.x zeroes at each set_data_handle: the arena's bytes are other
   * steps' before) */
  const size_t bytes = dnnl_memory_desc_get_size(chosen);
  a->at = st->arena_bytes;
  st->arena_bytes += (bytes + 4095) / 4096 * 4096; /* each copy page-aligned */
  if (st->arena_bytes > b->arena_need) b->arena_need = st->arena_bytes;
  return GW_SUCCESS;
fail:
  if (rpd) dnnl_primitive_desc_destroy(rpd);
  return res;
}

static gw_result_t run_reorder(struct gw_backend *b, struct arg *a, int is_output, const char *what) {
  gw_result_t res = GW_SUCCESS;
  if (a->own_unblock) { /* the primitive's results first (step_run_on waits for the stream only at the end) */
    void *from = NULL, *to = NULL;
    DNNL_TRY(dnnl_stream_wait(b->stream), what);
    DNNL_TRY(dnnl_memory_get_data_handle(a->internal, &from), what);
    DNNL_TRY(dnnl_memory_get_data_handle(a->user, &to), what);
    gw__cpu_unblock(&a->unblock, from, to);
    return GW_SUCCESS;
  }
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, is_output ? a->internal : a->user},
                             {DNNL_ARG_TO, is_output ? a->user : a->internal}};
  DNNL_TRY(dnnl_primitive_execute(a->reorder, b->stream, 2, args), what);
  return GW_SUCCESS;
fail:
  return res;
}


/* Adds argument `id` to a step: `plain` is the caller's layout, `chosen` the one
 * the primitive descriptor settled on. */
gw_result_t gw__cpu_step_arg(struct gw_backend *b, struct step *st, int id, const dnnl_memory_desc_t *plain,
                             const dnnl_memory_desc_t *chosen, int is_output, const char *what) {
  int i = st->nargs++;
  st->id[i] = id;
  st->is_output[i] = is_output;
  return arg_init(b, st, &st->a[i], plain, chosen, is_output, what);
}

/* oneDNN takes non-const handles for inputs too; it does not write them. */
static gw_result_t set_handle(struct arg *a, const void *p, const char *what) {
  gw_result_t res = GW_SUCCESS;
  DNNL_TRY(dnnl_memory_set_data_handle(a->user, (void *)p), what);
  return GW_SUCCESS;
fail:
  return res;
}

/* Runs a step on the caller's pointers (ptr[i] for argument i, in the order the
 * step's arguments were added) and waits for it. */
static gw_result_t step_run_on(struct gw_backend *b, struct step *st, const void *const *ptr, const char *what) {
  gw_result_t res = GW_SUCCESS;
  dnnl_exec_arg_t args[STEP_MAX_ARGS];
  if (!st->prim) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: %s: not planned for this op", what);
  if (st->arena_bytes > b->arena_cap) { /* the largest step so far: the arena grows to every step's need */
    free(b->arena); /* nothing in it outlives a step */
    b->arena = NULL, b->arena_cap = 0;
    if (posix_memalign(&b->arena, 4096, b->arena_need) != 0) {
      b->arena = NULL;
      return gw__model_fail(GW_ERR_SYSTEM, "cpu backend: %s: out of memory for %zu bytes of reordered copies", what,
                            b->arena_need);
    }
    b->arena_cap = b->arena_need;
  }
  for (int i = 0; i < st->nargs; i++) {
    GW_MODEL_TRY(set_handle(&st->a[i], ptr[i], what));
    if (st->a[i].internal)
      DNNL_TRY(dnnl_memory_set_data_handle(st->a[i].internal, (char *)b->arena + st->a[i].at), what);
    /* (an internal copy has its reorder: oneDNN's primitive, or gw__cpu_unblock for an output) */
    if (!st->is_output[i] && st->a[i].internal) GW_MODEL_TRY(run_reorder(b, &st->a[i], 0, what));
    args[i].arg = st->id[i];
    args[i].memory = st->a[i].internal ? st->a[i].internal : st->a[i].user;
  }
  DNNL_TRY(dnnl_primitive_execute(st->prim, b->stream, st->nargs, args), what);
  for (int i = 0; i < st->nargs; i++)
    if (st->is_output[i] && st->a[i].internal) GW_MODEL_TRY(run_reorder(b, &st->a[i], 1, what));
  DNNL_TRY(dnnl_stream_wait(b->stream), what);
  return GW_SUCCESS;
fail:
  return res;
}

/* One call at a time on a backend (backend.h): the arena is every step's.
 * Two at once are refused, not left to write over each other's copies. */
static gw_result_t step_run(struct gw_backend *b, struct step *st, const void *const *ptr, const char *what) {
  if (atomic_exchange(&b->running, 1))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: %s: another call is running on this backend (a "
                          "backend runs one call at a time: give each thread its own)", what);
  gw_result_t r = step_run_on(b, st, ptr, what);
  atomic_store(&b->running, 0);
  return r;
}

static gw_result_t cpu_op_create(struct gw_backend *b, const struct gw_op_desc *d, struct gw_op **out) {
  char what[160];
  *out = NULL;
  gw_result_t res = gw__backend_check_desc("cpu", d, what, sizeof what);
  if (res != GW_SUCCESS) return res;
  struct gw_op *op = calloc(1, sizeof *op);
  if (!op) return gw__model_fail(GW_ERR_SYSTEM, "cpu backend: out of memory");
  use_threads(b);
  op->b = b;
  op->d = *d;
  if (d->kind == GW_LAYER_CONV) res = gw__cpu_conv_create(op, what);
  else if (d->kind == GW_LAYER_RELU) res = gw__cpu_relu_create(op, what);
  else if (d->kind == GW_LAYER_MAXPOOL) res = gw__cpu_maxpool_create(op, what);
  else if (d->kind == GW_LAYER_FC) res = gw__cpu_fc_create(op, what);
  if (res != GW_SUCCESS) {
    cpu_op_destroy(op);
    return res;
  }
  *out = op;
  return GW_SUCCESS;
}

/* Every entry that runs an op starts here: the op's kind checked, and the
 * backend's thread count applied (oneDNN's primitives and the loops of
 * backend_cpu_kernels.c both run OpenMP parallel regions). */
static gw_result_t op_entry(const struct gw_op *op, int kind, const char *what) {
  use_threads(op->b);
  return gw__backend_expect_kind("cpu", op->d.kind, kind, what);
}

static gw_result_t cpu_conv_fwd(struct gw_op *op, const gw_act_t *x, const float *w, gw_act_t *y) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_CONV, "conv_fwd"));
  const void *ptr[] = {x, w, y};
  return step_run(op->b, &op->fwd, ptr, "conv_fwd");
}

static gw_result_t cpu_conv_bwd_data(struct gw_op *op, const gw_act_t *dy, const float *w, gw_act_t *dx) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_CONV, "conv_bwd_data"));
  const void *ptr[] = {dy, w, dx};
  if (op->zero_dx_bytes) memset(dx, 0, op->zero_dx_bytes); /* inputs never read (inner product, view) */
  return step_run(op->b, &op->bwd_data, ptr, "conv_bwd_data");
}

static gw_result_t cpu_conv_bwd_weights(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, float *dw) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_CONV, "conv_bwd_weights"));
  const void *ptr[] = {x, dy, dw};
  if (op->zero_dw_bytes) memset(dw, 0, op->zero_dw_bytes); /* the taps an inner product never used */
  return step_run(op->b, &op->bwd_wei, ptr, "conv_bwd_weights");
}

static gw_result_t cpu_relu_fwd(struct gw_op *op, const gw_act_t *x, gw_act_t *y) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_RELU, "relu_fwd"));
  const void *ptr[] = {x, y};
  return step_run(op->b, &op->fwd, ptr, "relu_fwd");
}

static gw_result_t cpu_relu_bwd(struct gw_op *op, const gw_act_t *y, const gw_act_t *dy, gw_act_t *dx) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_RELU, "relu_bwd"));
  const void *ptr[] = {y, dy, dx};
  return step_run(op->b, &op->bwd_data, ptr, "relu_bwd");
}

/* A plain loop: memory-bound, and the compiler vectorizes it; y may alias a or b. */
static gw_result_t cpu_add(struct gw_op *op, const gw_act_t *a, const gw_act_t *b, gw_act_t *y) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_ADD, "add"));
  gw__cpu_add((size_t)op->d.n * op->d.c * op->d.h * op->d.w, op->b->act, a, b, y);
  return GW_SUCCESS;
}

/* Batch norm in training, the fused tail (z, relu) included when asked. */
static gw_result_t bn_train(struct gw_op *op, const gw_act_t *x, const gw_act_t *z, int relu, const float *gamma,
                            const float *beta, gw_act_t *y, float *save_mean, float *save_rstd, float *running_mean,
                            float *running_var, const char *what) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_BN, what));
  const struct gw_op_desc *d = &op->d;
  if ((size_t)d->n * d->h * d->w < 2)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "cpu backend: %s: batch %d of %dx%d has one value per channel; training needs more "
                          "(as PyTorch)",
                          what, d->n, d->h, d->w);
  gw__cpu_bn_fwd_train(d, op->b->act, op->b->nhwc, x, z, relu, gamma, beta, y, save_mean, save_rstd, running_mean, running_var);
  return GW_SUCCESS;
}

static gw_result_t cpu_bn_act_fwd_train(struct gw_op *op, const gw_act_t *x, const gw_act_t *z, const float *gamma,
                                        const float *beta, gw_act_t *y, float *save_mean, float *save_rstd,
                                        float *running_mean, float *running_var) {
  return bn_train(op, x, z, 1, gamma, beta, y, save_mean, save_rstd, running_mean, running_var, "bn_act_fwd_train");
}

static gw_result_t cpu_bn_fwd_train(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta,
                                    gw_act_t *y, float *save_mean, float *save_rstd, float *running_mean,
                                    float *running_var) {
  return bn_train(op, x, NULL, 0, gamma, beta, y, save_mean, save_rstd, running_mean, running_var, "bn_fwd_train");
}

static gw_result_t cpu_bn_act_fwd_infer(struct gw_op *op, const gw_act_t *x, const gw_act_t *z, const float *gamma,
                                        const float *beta, const float *running_mean, const float *running_var,
                                        gw_act_t *y) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_BN, "bn_act_fwd_infer"));
  gw__cpu_bn_fwd_infer(&op->d, op->b->act, op->b->nhwc, x, z, 1, gamma, beta, running_mean, running_var, y);
  return GW_SUCCESS;
}

static gw_result_t cpu_bn_fwd_infer(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta,
                                    const float *running_mean, const float *running_var, gw_act_t *y) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_BN, "bn_fwd_infer"));
  gw__cpu_bn_fwd_infer(&op->d, op->b->act, op->b->nhwc, x, NULL, 0, gamma, beta, running_mean, running_var, y);
  return GW_SUCCESS;
}

static gw_result_t cpu_bn_act_bwd(struct gw_op *op, const gw_act_t *x, const gw_act_t *y, const gw_act_t *dy,
                                  const float *gamma, const float *save_mean, const float *save_rstd, gw_act_t *dx,
                                  gw_act_t *dz, float *dgamma, float *dbeta) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_BN, "bn_act_bwd"));
  if (!y) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: bn_act_bwd needs the fused output y");
  gw__cpu_bn_bwd(&op->d, op->b->act, op->b->nhwc, x, y, dy, gamma, save_mean, save_rstd, dx, dz, dgamma, dbeta);
  return GW_SUCCESS;
}

static gw_result_t cpu_bn_bwd(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *gamma,
                              const float *save_mean, const float *save_rstd, gw_act_t *dx, float *dgamma, float *dbeta) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_BN, "bn_bwd"));
  gw__cpu_bn_bwd(&op->d, op->b->act, op->b->nhwc, x, NULL, dy, gamma, save_mean, save_rstd, dx, NULL, dgamma, dbeta);
  return GW_SUCCESS;
}

static gw_result_t cpu_bn_sums(struct gw_op *op, const gw_act_t *x, double *sums) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_BN, "bn_sums"));
  gw__cpu_bn_sums(&op->d, op->b->act, op->b->nhwc, x, sums);
  return GW_SUCCESS;
}

static gw_result_t cpu_bn_fwd_apply(struct gw_op *op, const gw_act_t *x, const float *gamma, const float *beta,
                                    const float *mean, const float *rstd, gw_act_t *y) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_BN, "bn_fwd_apply"));
  gw__cpu_bn_fwd_apply(&op->d, op->b->act, op->b->nhwc, x, gamma, beta, mean, rstd, y);
  return GW_SUCCESS;
}

static gw_result_t cpu_bn_bwd_sums(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *mean,
                                   const float *rstd, double *sums) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_BN, "bn_bwd_sums"));
  gw__cpu_bn_bwd_sums(&op->d, op->b->act, op->b->nhwc, x, dy, mean, rstd, sums);
  return GW_SUCCESS;
}

static gw_result_t cpu_bn_bwd_apply(struct gw_op *op, const gw_act_t *x, const gw_act_t *dy, const float *gamma,
                                    const float *mean, const float *rstd, const double *sums, double count,
                                    gw_act_t *dx) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_BN, "bn_bwd_apply"));
  gw__cpu_bn_bwd_apply(&op->d, op->b->act, op->b->nhwc, x, dy, gamma, mean, rstd, sums, count, dx);
  return GW_SUCCESS;
}

static size_t cpu_workspace_bytes(struct gw_op *op) { return op->workspace_bytes; }

static gw_result_t cpu_maxpool_fwd(struct gw_op *op, const gw_act_t *x, gw_act_t *y, void *workspace) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_MAXPOOL, "maxpool_fwd"));
  const void *ptr[] = {x, y, workspace};
  return step_run(op->b, &op->fwd, ptr, "maxpool_fwd");
}

static gw_result_t cpu_maxpool_bwd(struct gw_op *op, const gw_act_t *dy, const void *workspace, gw_act_t *dx) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_MAXPOOL, "maxpool_bwd"));
  const void *ptr[] = {dy, workspace, dx};
  return step_run(op->b, &op->bwd_data, ptr, "maxpool_bwd");
}

static gw_result_t cpu_avgpool_fwd(struct gw_op *op, const gw_act_t *x, gw_act_t *y) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_AVGPOOL, "avgpool_fwd"));
  gw__cpu_avgpool_fwd(&op->d, op->b->act, op->b->nhwc, x, y);
  return GW_SUCCESS;
}

static gw_result_t cpu_avgpool_bwd(struct gw_op *op, const gw_act_t *dy, gw_act_t *dx) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_AVGPOOL, "avgpool_bwd"));
  gw__cpu_avgpool_bwd(&op->d, op->b->act, op->b->nhwc, dy, dx);
  return GW_SUCCESS;
}

static gw_result_t cpu_fc_fwd(struct gw_op *op, const gw_act_t *x, const float *w, const float *b, gw_act_t *y) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_FC, "fc_fwd"));
  const void *ptr[] = {x, w, b, y};
  return step_run(op->b, &op->fwd, ptr, "fc_fwd");
}

static gw_result_t cpu_fc_bwd(struct gw_op *op, const gw_act_t *x, const float *w, const gw_act_t *dy, gw_act_t *dx, float *dw,
                              float *db) {
  GW_MODEL_TRY(op_entry(op, GW_LAYER_FC, "fc_bwd"));
  const void *pd[] = {dy, w, dx}, *pw[] = {x, dy, dw, db};
  GW_MODEL_TRY(step_run(op->b, &op->bwd_data, pd, "fc_bwd (data)"));
  return step_run(op->b, &op->bwd_wei, pw, "fc_bwd (weights)");
}

static gw_result_t cpu_loss_fwd_bwd(struct gw_op *op, const gw_act_t *logits, const int32_t *labels, float grad_scale,
                                    float *loss,
                                    gw_act_t *dlogits) {
  GW_MODEL_TRY(op_entry(op, GW_OP_LOSS, "loss_fwd_bwd"));
  for (int i = 0; i < op->d.n; i++)
    if (labels[i] < 0 || labels[i] >= op->d.k)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                            "cpu backend: loss_fwd_bwd: label %d of sample %d is not in [0, %d)", (int)labels[i], i,
                            op->d.k);
  if (!(grad_scale > 0 && grad_scale < INFINITY))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: loss_fwd_bwd: gradient scale %g must be finite and > 0",
                          (double)grad_scale);
  gw__cpu_loss_fwd_bwd(&op->d, op->b->act, logits, labels, grad_scale, loss, dlogits);
  return GW_SUCCESS;
}

/* ---- the input pipeline: nothing to overlap on the host */

static gw_result_t cpu_upload_async(struct gw_backend *b, void *dst, const void *src, size_t bytes, int slot) {
  if (slot < 0 || slot > 1 || (bytes && (!dst || !src)))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: upload_async: slot %d (0 or 1), %zu bytes from %p "
                          "to %p", slot, bytes, src, dst);
  return cpu_copy(b, dst, src, bytes);
}

/* A buffer per slot, so the executor's staging path is the device backends'
 * (filled in place, then copied by upload_async). */
static gw_result_t cpu_stage_buffer(struct gw_backend *b, int slot, size_t bytes, void **host) {
  if (slot < 0 || slot > 1 || !host)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: stage_buffer: slot %d (0 or 1), %p", slot,
                          (void *)host);
  if (bytes > b->stage_cap[slot] || !b->stage[slot]) {
    void *p = realloc(b->stage[slot], bytes ? bytes : 1);
    if (!p) return gw__model_fail(GW_ERR_SYSTEM, "cpu backend: stage_buffer: out of memory for %zu bytes", bytes);
    b->stage[slot] = p, b->stage_cap[slot] = bytes;
  }
  *host = b->stage[slot];
  return GW_SUCCESS;
}

static gw_result_t cpu_upload_order(struct gw_backend *b, int slot) {
  (void)b;
  if (slot < 0 || slot > 1) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: upload_order: slot %d", slot);
  return GW_SUCCESS;
}

/* ---- training in backend memory (host memory here) */

static gw_result_t cpu_sgd_step(struct gw_backend *b, const struct gw_sgd_run *runs, int nruns, float *params,
                                const float *grads, float *momentum, const struct gw_sgd_scalars *sc) {
  (void)b;
  if (nruns < 0 || (nruns && (!runs || !params || !grads)) || !sc)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: sgd_step needs runs, parameters, gradients and "
                          "scalars (got %d runs)", nruns);
  gw_sgd_apply(runs, nruns, params, grads, momentum, sc);
  return GW_SUCCESS;
}

static gw_result_t cpu_nonfinite(struct gw_backend *b, const float *x, size_t n, int *found) {
  (void)b;
  if ((n && !x) || !found) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "cpu backend: nonfinite needs x and found");
  int ok = 1;
  for (size_t i = 0; i < n; i++) ok &= isfinite(x[i]) != 0;
  *found = !ok;
  return GW_SUCCESS;
}

static void *cpu_stream(struct gw_backend *b) {
  (void)b;
  return NULL;
}

const struct gw_backend_ops gw_backend_cpu = {
    .name = "cpu",
    .host_memory = 1,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .dealloc = cpu_dealloc,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .upload_async = cpu_upload_async,
    .upload_order = cpu_upload_order,
    .stage_buffer = cpu_stage_buffer,
    .act_dtype = cpu_act_dtype,
    .layout = cpu_layout,
    .op_create = cpu_op_create,
    .op_destroy = cpu_op_destroy,
    .conv_fwd = cpu_conv_fwd,
    .conv_bwd_data = cpu_conv_bwd_data,
    .conv_bwd_weights = cpu_conv_bwd_weights,
    .relu_fwd = cpu_relu_fwd,
    .relu_bwd = cpu_relu_bwd,
    .add = cpu_add,
    .bn_fwd_train = cpu_bn_fwd_train,
    .bn_fwd_infer = cpu_bn_fwd_infer,
    .bn_bwd = cpu_bn_bwd,
    .bn_act_fwd_train = cpu_bn_act_fwd_train,
    .bn_act_fwd_infer = cpu_bn_act_fwd_infer,
    .bn_act_bwd = cpu_bn_act_bwd,
    .bn_sums = cpu_bn_sums,
    .bn_fwd_apply = cpu_bn_fwd_apply,
    .bn_bwd_sums = cpu_bn_bwd_sums,
    .bn_bwd_apply = cpu_bn_bwd_apply,
    .workspace_bytes = cpu_workspace_bytes,
    .maxpool_fwd = cpu_maxpool_fwd,
    .maxpool_bwd = cpu_maxpool_bwd,
    .avgpool_fwd = cpu_avgpool_fwd,
    .avgpool_bwd = cpu_avgpool_bwd,
    .fc_fwd = cpu_fc_fwd,
    .fc_bwd = cpu_fc_bwd,
    .loss_fwd_bwd = cpu_loss_fwd_bwd,
    .sgd_step = cpu_sgd_step,
    .nonfinite = cpu_nonfinite,
    .stream = cpu_stream,
    .mark = cpu_mark,
    .mark_elapsed = cpu_mark_elapsed,
};

#endif /* GW_HAVE_ONEDNN */
