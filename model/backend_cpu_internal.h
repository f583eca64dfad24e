/* backend_cpu_internal.h - the inside of the cpu backend, shared by its files:
 * backend_cpu.c (lifecycle, memory, the argument/step machinery, the table) and
 * backend_cpu_prims.c (planning each kind of oneDNN primitive).  Not part of
 * backend.h's interface. */
#ifndef GW_MODEL_BACKEND_CPU_INTERNAL_H
#define GW_MODEL_BACKEND_CPU_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "backend.h"
#include "backend_cpu_kernels.h"
#include "model_internal.h"

struct gw_backend {
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  int threads;
  int act;                /* gw_dtype_t of the activations: GW_FLOAT32 or GW_BFLOAT16 */
  dnnl_data_type_t adt;   /* the same for oneDNN */
  int nhwc;               /* activations channels-last (backend.h GW_LAYOUT_NHWC) */
  dnnl_format_tag_t atag; /* their oneDNN tag: dnnl_nchw or dnnl_nhwc */
  double *marks;          /* mark: the clock per slot, grown to the highest slot used */
  int nmarks;
  void *stage[2];         /* stage_buffer's, per slot */
  size_t stage_cap[2];
  /* The reordered copies of every step's arguments (oneDNN's blocked layouts)
   * live in one arena, at offsets of their step: a step reorders its inputs
   * in, runs and reorders its outputs out before it returns (step_run waits),
   * so no copy outlives its step and one step's worth serves them all (each
   * op had its own, allocated at creation: activation-sized, several per
   * convolution, never shared).  Grown at a step's run to the largest need. */
  void *arena;
  size_t arena_cap, arena_need;
  atomic_int running; /* a step is running (step_run): a second at once is refused */
};

/* One tensor argument: the plain memory the caller's pointer goes into, and when
 * oneDNN wants another layout, the reordered copy and the reorder primitive. */
struct arg {
  dnnl_memory_t user;     /* plain layout, data handle set per call */
  dnnl_memory_t internal; /* NULL when oneDNN takes the plain layout; its data in the backend's arena */
  dnnl_primitive_t reorder;
  bool own_unblock;       /* an output reordered by gw__cpu_unblock instead (reorder NULL) */
  struct gw_cpu_unblock unblock;
  size_t at;              /* internal's offset in the arena */
};

/* One primitive and its arguments in execution order (inputs are reordered in
 * before, outputs out after). */
#define STEP_MAX_ARGS 4
struct step {
  dnnl_primitive_t prim;
  int nargs;
  int id[STEP_MAX_ARGS];        /* DNNL_ARG_* */
  int is_output[STEP_MAX_ARGS];
  struct arg a[STEP_MAX_ARGS];
  size_t arena_bytes; /* its arguments' reordered copies, end to end */
};

struct gw_op {
  struct gw_backend *b;
  struct gw_op_desc d;
  struct step fwd;      /* CONV: src, weights -> dst; RELU: src -> dst */
  struct step bwd_data; /* CONV: diff_dst, weights -> diff_src; RELU: dst, diff_dst -> diff_src */
  struct step bwd_wei;  /* CONV: src, diff_dst -> diff_weights; FC: also diff_bias */
  size_t workspace_bytes; /* MAXPOOL: the argmax positions backward needs */
  /* CONV planned as an inner product (gw__cpu_conv_create: an output of one
   * position) or on a subsampled view (a strided 1x1): the bytes of dx / dw
   * to zero before the backward writes the part it read (0: it reads all) */
  size_t zero_dx_bytes, zero_dw_bytes;
  int as_inner_product;
  int subsampled; /* CONV 1x1 strided, planned unstrided on a subsampled view of its input */
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

/* A call that already recorded its message: keep its code, clean up. */
#define GW_MODEL_TRY_GOTO(call)                                                                \
  do {                                                                                          \
    res = (call);                                                                               \
    if (res != GW_SUCCESS) goto fail;                                                           \
  } while (0)

/* Adds argument `id` to a step: `plain` is the caller's layout, `chosen` the one
 * the primitive descriptor settled on (a reorder between them when they differ). */
gw_result_t gw__cpu_step_arg(struct gw_backend *b, struct step *st, int id, const dnnl_memory_desc_t *plain,
                             const dnnl_memory_desc_t *chosen, int is_output, const char *what);

/* Planners: fill op->fwd / bwd_data / bwd_wei for op->d (already checked). */
gw_result_t gw__cpu_conv_create(struct gw_op *op, const char *what);
gw_result_t gw__cpu_relu_create(struct gw_op *op, const char *what);
gw_result_t gw__cpu_maxpool_create(struct gw_op *op, const char *what);
gw_result_t gw__cpu_fc_create(struct gw_op *op, const char *what);
int gw__cpu_conv_is_inner_product(const struct gw_op *op);
int gw__cpu_conv_is_subsampled(const struct gw_op *op);
/* Whether an output's reorder out of `chosen` into `plain` can be gw__cpu_unblock's (t: its plan). */
bool gw__cpu_plan_unblock(struct gw_cpu_unblock *t, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *chosen);
int gw__cpu_op_unblocks(const struct gw_op *op);

#endif
