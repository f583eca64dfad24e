/* exec.c - the executor of exec.h: plans memory for one batch size, then runs
 * the layer list forward and backward through a backend's table.
 *
 * Planning (once):
 * - activation storage: one buffer per activation, except that a ReLU or a
 *   residual add writes over its input when that input has no other reader and
 *   the layer that produced it does not need its own output in backward (only a
 *   ReLU does).  In ResNet this puts bn -> relu and bn3 -> add -> relu in one
 *   buffer, about a third of the activation memory.
 * - activation gradients: the gradient of activation a is first written by its
 *   last reader and last read by its producer, so backward needs it only in that
 *   window; buffers are handed out from a pool by best fit over those windows.
 * - an activation read by two layers (a block's input) gets its gradient from
 *   both: the later reader (first in backward) writes it, the earlier one adds
 *   its contribution through a scratch buffer.
 */
#include "exec.h"
#include "half.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

struct exec_layer {
  struct gw_op *op;
  struct gw_op *acc;      /* ADD op of the input's shape when this layer adds into a gradient */
  void *workspace;        /* MAXPOOL: argmax positions */
  float *save_mean, *save_rstd; /* BN: batch statistics for backward */
  int acc_in, acc_in2;    /* not the last reader of in / in2: add to the gradient, don't overwrite */
  size_t ready_after;     /* gradient elements final once backward has passed this layer */
  /* Fusion (when e->fusable and no SyncBatchNorm): a BN leads a group (fuse 1:
   * bn -> relu, 2: bn -> add -> relu) whose other layers are members (skipped);
   * the group's output act, and for 2 the add layer and the residual's act. */
  int fuse, member, out_act, add_layer, z_act;
  int path_act;           /* member: its input on the group's path (gradient shared with its output's), else -1 */
};

struct gw_exec {
  struct gw_model *m;
  const struct gw_backend_ops *ops;
  struct gw_backend *b;
  struct gw_exec_config cfg;
  struct exec_layer *L;   /* [nlayers] */
  int fusable;            /* the backend has bn_act_* and cfg.no_fuse is 0: fused groups were planned */
  struct gw_op *loss_op;
  int act_dt;             /* the backend's activation dtype (gw_dtype_t) */
  size_t esz;             /* bytes per activation element */
  int nhwc;               /* the backend's activations are channels-last (GW_LAYOUT_NHWC) */
  void **act;             /* [nacts] storage (in-place layers share) */
  void **grad;            /* [nacts] gradient buffer during its window (NULL for the input) */
  void *scratch;          /* a second reader's contribution before it is added */
  void *host_in;          /* the input batch in the backend's dtype and layout (16-bit or NHWC), made on the
                             host; also the logits' 16-bit copy */
  void **owned;           /* every allocation, freed at the end */
  int nowned, cap_owned;
  float *params, *grads, *running; /* the model's storage, or backend copies */
  int32_t *labels;        /* backend copy of the labels given to backward */
  /* gw_exec_stage: per slot [input batch | labels] in backend memory and the
   * labels on the host (checked at staging); the host image of a slot being
   * filled; the slot staged and not yet taken (-1: none), the slot the last
   * staged forward took (-1: none yet), whether the last forward was staged. */
  void *slot_buf[2];
  int32_t *slot_labels[2];
  void *stage_host;       /* NULL where the backend lends stage_buffer's */
  int stage_ready;
  size_t slot_lab_off, slot_bytes;
  int staged, last_slot, fwd_staged;
  void *act0;             /* the input buffer of host batches */
  int trained_forward;    /* the last forward was a training one: backward may run */
  float loss_scale;       /* gw_exec_set_loss_scale: dlogits are multiplied by it */
  gw_exec_sum_fn sync_sum; /* SyncBatchNorm's cross-rank sum, or NULL */
  void *sync_arg;
  double *sums;           /* backend memory, [2 * max BN channels + 1] */
  double *host_sums;      /* the same on the host, where they are summed across ranks */
  float *host_stats;      /* [4 * max BN channels]: mean, rstd, running mean, running var */
  size_t bytes;
  /* gw_exec_set_profile: per layer and the loss, the totals; whether the last
   * forward took its marks (0 .. nlayers; backward's follow them). */
  struct gw_exec_layer_time *prof;
  int profiling, prof_steps, prof_fwd_marked;
};

static size_t act_elems(const struct gw_exec *e, int a) {
  const struct gw_act *s = &e->m->acts[a];
  return (size_t)e->cfg.batch * s->c * s->h * s->w;
}

static void *ex_alloc(struct gw_exec *e, size_t bytes, const char *what) {
  if (e->nowned == e->cap_owned) {
    int cap = e->cap_owned ? e->cap_owned * 2 : 64;
    void **o = realloc(e->owned, (size_t)cap * sizeof *o);
    if (!o) {
      gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory growing its list of allocations to %d (for %s)", cap,
                     what);
      return NULL;
    }
    e->owned = o, e->cap_owned = cap;
  }
  void *p = e->ops->alloc(e->b, bytes);
  if (!p) {
    gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory allocating %zu bytes for %s", bytes, what);
    return NULL;
  }
  e->owned[e->nowned++] = p;
  e->bytes += bytes;
  return p;
}

#define EX_ALLOC(ptr, e, bytes, what)                                    \
  do {                                                                   \
    if (!((ptr) = ex_alloc((e), (bytes), (what)))) return GW_ERR_SYSTEM; \
  } while (0)

/* ---- planning */

/* Per activation: how many layers read it and the index of the last one. */
static void readers(const struct gw_model *m, int *count, int *last) {
  for (int a = 0; a < m->nacts; a++) count[a] = 0, last[a] = -1;
  for (int i = 0; i < m->nlayers; i++) {
    const struct gw_layer *l = &m->layers[i];
    count[l->in]++, last[l->in] = i;
    if (l->in2 >= 0) count[l->in2]++, last[l->in2] = i;
  }
  last[m->nacts - 1] = m->nlayers; /* the logits: read by the loss */
}

/* Whether layer i writes its output over its input: a ReLU or add whose
 * input has no other reader and was not made by a ReLU (producer[]: the
 * layers so far; the input image never). */
static int runs_in_place(const struct gw_model *m, int i, const int *count, const int *producer) {
  const struct gw_layer *l = &m->layers[i];
  const int p = producer[l->in];
  return (l->kind == GW_LAYER_RELU || l->kind == GW_LAYER_ADD) && l->in != 0 && count[l->in] == 1 && p >= 0 &&
         m->layers[p].kind != GW_LAYER_RELU;
}

static gw_result_t plan_activations(struct gw_exec *e, const int *count, int *producer) {
  const struct gw_model *m = e->m;
  for (int a = 0; a < m->nacts; a++) producer[a] = -1;
  EX_ALLOC(e->act[0], e, act_elems(e, 0) * e->esz, "the input batch");
  e->act0 = e->act[0];
  for (int i = 0; i < m->nlayers; i++) {
    const struct gw_layer *l = &m->layers[i];
    producer[l->out] = i;
    if (runs_in_place(m, i, count, producer)) e->act[l->out] = e->act[l->in];
    else EX_ALLOC(e->act[l->out], e, act_elems(e, l->out) * e->esz, l->name);
  }
  return GW_SUCCESS;
}

/* The gradient pool: best-fit reuse of buffers over each gradient's window
 * (and an inference executor's activations over theirs). */
struct pool {
  void **buf;
  size_t *size;
  int *busy;
  int n;
};

static void *pool_take(struct gw_exec *e, struct pool *p, size_t elems, const char *what) {
  int best = -1;
  for (int i = 0; i < p->n; i++)
    if (!p->busy[i] && p->size[i] >= elems && (best < 0 || p->size[i] < p->size[best])) best = i;
  if (best < 0) {
    best = p->n;
    p->buf[best] = ex_alloc(e, elems * e->esz, what);
    if (!p->buf[best]) return NULL;
    p->size[best] = elems;
    p->n++;
  }
  p->busy[best] = 1;
  return p->buf[best];
}

static void pool_give(struct pool *p, const void *buf) {
  for (int i = 0; i < p->n; i++)
    if (p->buf[i] == buf) p->busy[i] = 0;
}

/* An inference executor's activations: as plan_activations (the same
 * in-place outputs, so the same fused groups), but each buffer goes back to a
 * pool once the last reader of its activation has run, three layers later:
 * a fused group (bn -> relu, bn -> add -> relu: at most three layers in one
 * call) reads its layers' inputs while it writes their outputs, so no output
 * of a group may take a buffer that one of the group's reads let go.  An
 * activation whose buffer an in-place output took is not given back (the
 * output's reader does that); the logits never are. */
static gw_result_t plan_activations_infer(struct gw_exec *e, const int *count, const int *last, int *producer) {
  const struct gw_model *m = e->m;
  enum { LAG = 3 };
  for (int a = 0; a < m->nacts; a++) producer[a] = -1;
  EX_ALLOC(e->act[0], e, act_elems(e, 0) * e->esz, "the input batch");
  e->act0 = e->act[0];
  struct pool p = {calloc((size_t)m->nacts + 1, sizeof(void *)), calloc((size_t)m->nacts + 1, sizeof(size_t)),
                   calloc((size_t)m->nacts + 1, sizeof(int)), 0};
  char *handed = calloc((size_t)m->nacts, 1);
  gw_result_t res = GW_ERR_SYSTEM;
  if (!p.buf || !p.size || !p.busy || !handed) {
    gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory planning activations");
    goto out;
  }
  for (int i = 0; i < m->nlayers + LAG; i++) {
    if (i < m->nlayers) {
      const struct gw_layer *l = &m->layers[i];
      producer[l->out] = i;
      if (runs_in_place(m, i, count, producer)) e->act[l->out] = e->act[l->in], handed[l->in] = 1;
      else if (!(e->act[l->out] = pool_take(e, &p, act_elems(e, l->out), "activations"))) goto out;
    }
    if (i < LAG) continue;
    const struct gw_layer *r = &m->layers[i - LAG]; /* its reads are LAG layers back: give back what they ended */
    const int ins[2] = {r->in, r->in2};
    for (int k = 0; k < 2; k++)
      if (ins[k] > 0 && last[ins[k]] == i - LAG && !handed[ins[k]]) pool_give(&p, e->act[ins[k]]);
  }
  res = GW_SUCCESS;
out:
  free(p.buf), free(p.size), free(p.busy), free(handed);
  return res;
}

static gw_result_t take_grad(struct gw_exec *e, struct pool *p, int a, const int *last, int step) {
  if (a <= 0 || last[a] != step) return GW_SUCCESS; /* the input has none; others start at their last reader */
  e->grad[a] = pool_take(e, p, act_elems(e, a), "activation gradients");
  return e->grad[a] ? GW_SUCCESS : GW_ERR_SYSTEM;
}

/* Groups BN with the layers after it that can run inside its call: a ReLU in
 * place on its output (bn -> relu), or the residual add of its output and
 * another (the add in place on either) followed by a ReLU in place (bn -> add
 * -> relu), when BN's output has no other reader and BN writes its input's
 * gradient directly (not added).  The group's output is the ReLU's. */
static void plan_fusion(struct gw_exec *e, const int *count, const int *last) {
  const struct gw_model *m = e->m;
  const struct gw_backend_ops *o = e->ops;
  e->fusable = !e->cfg.no_fuse && o->bn_act_fwd_train && o->bn_act_fwd_infer && o->bn_act_bwd;
  for (int i = 0; e->fusable && i + 1 < m->nlayers; i++) {
    const struct gw_layer *b = &m->layers[i], *n1 = &m->layers[i + 1];
    struct exec_layer *x = &e->L[i];
    if (b->kind != GW_LAYER_BN || count[b->out] != 1 || (b->in != 0 && last[b->in] != i)) continue;
    if (n1->kind == GW_LAYER_RELU && n1->in == b->out && e->act[n1->out] == e->act[b->out]) {
      x->fuse = 1, x->out_act = n1->out, e->L[i + 1].member = 1, e->L[i + 1].path_act = b->out;
      continue;
    }
    if (i + 2 >= m->nlayers) continue;
    const struct gw_layer *n2 = &m->layers[i + 2];
    /* the add may run in place on either input (on the other, for a
     * downsampling shortcut's BN): the group writes wherever the ReLU does */
    if (n1->kind == GW_LAYER_ADD && (n1->in == b->out || n1->in2 == b->out) && count[n1->out] == 1 &&
        n2->kind == GW_LAYER_RELU && n2->in == n1->out && e->act[n2->out] == e->act[n1->out]) {
      x->fuse = 2, x->out_act = n2->out, x->add_layer = i + 1, x->z_act = n1->in == b->out ? n1->in2 : n1->in;
      e->L[i + 1].member = e->L[i + 2].member = 1;
      e->L[i + 1].path_act = b->out, e->L[i + 2].path_act = n1->out;
    }
  }
}

/* Walks backward's order, giving each gradient a buffer at its last reader and
 * returning it after its producer.  Assignments are fixed for every step.
 * Inside a fusable group the gradient goes back along the path in one buffer
 * (the ReLU's and the add's backward run in place on it, unfused): so the
 * fused BN finds its output gradient where the group's ends, and neither mode
 * needs more memory than the layers one by one. */
static gw_result_t plan_gradients(struct gw_exec *e, const int *last) {
  const struct gw_model *m = e->m;
  int nmax = 2 * m->nacts + 1;
  struct pool p = {calloc((size_t)nmax, sizeof(void *)), calloc((size_t)nmax, sizeof(size_t)),
                   calloc((size_t)nmax, sizeof(int)), 0};
  gw_result_t res = GW_ERR_SYSTEM;
  if (!p.buf || !p.size || !p.busy) {
    gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory planning gradients");
    goto out;
  }
  if (take_grad(e, &p, m->nacts - 1, last, m->nlayers) != GW_SUCCESS) goto out;
  for (int i = m->nlayers - 1; i >= 0; i--) {
    const struct gw_layer *l = &m->layers[i];
    const int path = e->L[i].member ? e->L[i].path_act : -1;
    const int ins[2] = {l->in, l->in2};
    for (int k = 0; k < 2; k++) {
      if (ins[k] < 0) continue;
      if (ins[k] == path) e->grad[path] = e->grad[l->out]; /* handed on: released by the path's producer */
      else if (take_grad(e, &p, ins[k], last, i) != GW_SUCCESS) goto out;
    }
    if (path < 0) pool_give(&p, e->grad[l->out]);
  }
  res = GW_SUCCESS;
out:
  free(p.buf), free(p.size), free(p.busy);
  return res;
}

static gw_result_t plan_layer(struct gw_exec *e, int i, const int *last) {
  const struct gw_model *m = e->m;
  const struct gw_layer *l = &m->layers[i];
  struct exec_layer *x = &e->L[i];
  struct gw_op_desc d;
  gw_model_op_desc(m, i, e->cfg.batch, &d);
  if (l->in == 0 && l->kind != GW_LAYER_CONV)
    return gw__model_fail(GW_ERR_UNSUPPORTED, "executor: layer %s reads the input image; only a convolution may",
                          l->name);
  GW_MODEL_TRY(e->ops->op_create(e->b, &d, &x->op));
  x->acc_in = !e->cfg.inference && l->in != 0 && last[l->in] != i;
  x->acc_in2 = !e->cfg.inference && l->in2 >= 0 && last[l->in2] != i;
  if (x->acc_in && l->kind != GW_LAYER_ADD) {
    const struct gw_act *s = &m->acts[l->in];
    struct gw_op_desc a = {.kind = GW_LAYER_ADD, .n = e->cfg.batch, .c = s->c, .h = s->h, .w = s->w,
                           .k = s->c, .p = s->h, .q = s->w};
    GW_MODEL_TRY(e->ops->op_create(e->b, &a, &x->acc));
  }
  if (l->kind == GW_LAYER_MAXPOOL) EX_ALLOC(x->workspace, e, e->ops->workspace_bytes(x->op), l->name);
  if (l->kind == GW_LAYER_BN && !e->cfg.inference) { /* the batch statistics, for backward */
    size_t c = (size_t)m->acts[l->in].c * sizeof(float);
    EX_ALLOC(x->save_mean, e, c, l->name);
    EX_ALLOC(x->save_rstd, e, c, l->name);
  }
  return GW_SUCCESS;
}

/* ready_after[i]: the end of the furthest parameter of layers i..last, which in
 * reverse forward order is everything backward has finished by then. */
static void plan_ready(struct gw_exec *e) {
  const struct gw_model *m = e->m;
  size_t ready = 0;
  for (int i = m->nlayers - 1; i >= 0; i--) {
    const struct gw_layer *l = &m->layers[i];
    int p[2] = {l->weight, l->bias};
    for (int k = 0; k < 2; k++) {
      if (p[k] < 0) continue;
      const struct gw_tensor *t = &m->params_t[p[k]];
      if (t->offset + t->numel > ready) ready = t->offset + t->numel;
    }
    e->L[i].ready_after = ready;
  }
}

/* Parameters, gradients and statistics: the model's own for host backends. */
static gw_result_t plan_model_storage(struct gw_exec *e) {
  struct gw_model *m = e->m;
  if (e->ops->host_memory) {
    e->params = m->param_data, e->grads = m->grad_data, e->running = m->running_data;
    return GW_SUCCESS;
  }
  EX_ALLOC(e->params, e, m->num_params * sizeof(float), "parameters");
  if (!e->cfg.inference) EX_ALLOC(e->grads, e, m->num_params * sizeof(float), "gradients");
  EX_ALLOC(e->running, e, (m->num_running ? m->num_running : 1) * sizeof(float), "running statistics");
  return gw_exec_upload_model(e);
}

static gw_result_t plan(struct gw_exec *e) {
  const struct gw_model *m = e->m;
  int *count = calloc((size_t)m->nacts, sizeof(int)), *last = calloc((size_t)m->nacts, sizeof(int));
  int *producer = calloc((size_t)m->nacts, sizeof(int));
  gw_result_t res = GW_ERR_SYSTEM;
  if (!count || !last || !producer) {
    gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory planning");
    goto out;
  }
  readers(m, count, last);
  res = e->cfg.inference ? plan_activations_infer(e, count, last, producer) : plan_activations(e, count, producer);
  if (res != GW_SUCCESS) goto out;
  plan_fusion(e, count, last);
  if (!e->cfg.inference && (res = plan_gradients(e, last)) != GW_SUCCESS) goto out;
  size_t max_elems = 0;
  for (int i = 0; i < m->nlayers; i++) {
    if ((res = plan_layer(e, i, last)) != GW_SUCCESS) goto out;
    if (e->L[i].acc_in && act_elems(e, m->layers[i].in) > max_elems) max_elems = act_elems(e, m->layers[i].in);
    /* a fused add's second input accumulates through the scratch too */
    if (e->L[i].acc_in2 && act_elems(e, m->layers[i].in2) > max_elems) max_elems = act_elems(e, m->layers[i].in2);
  }
  plan_ready(e);
  res = GW_ERR_SYSTEM;
  size_t maxc = 1;
  for (int i = 0; i < m->nlayers; i++)
    if (m->layers[i].kind == GW_LAYER_BN && (size_t)m->acts[m->layers[i].in].c > maxc)
      maxc = (size_t)m->acts[m->layers[i].in].c;
  if (!(e->sums = ex_alloc(e, (2 * maxc + 1) * sizeof(double), "batch-norm sums"))) goto out;
  if (!(e->host_sums = malloc((2 * maxc + 1) * sizeof(double))) || !(e->host_stats = malloc(4 * maxc * sizeof(float)))) {
    gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory");
    goto out;
  }
  if (max_elems && !(e->scratch = ex_alloc(e, max_elems * e->esz, "gradient scratch"))) goto out;
  if (e->esz != sizeof(float) || e->nhwc) { /* the input batch, or the logits, converted on the host */
    size_t n = act_elems(e, 0), nl = act_elems(e, m->nacts - 1);
    if (!(e->host_in = malloc((n > nl ? n : nl) * e->esz))) {
      gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory");
      goto out;
    }
  }
  if (!(e->labels = ex_alloc(e, (size_t)e->cfg.batch * sizeof(int32_t), "labels"))) goto out;
  struct gw_op_desc d = {.kind = GW_OP_LOSS, .n = e->cfg.batch, .k = m->cfg.classes, .c = m->cfg.classes,
                         .h = 1, .w = 1, .p = 1, .q = 1, .label_smoothing = e->cfg.label_smoothing};
  if ((res = e->ops->op_create(e->b, &d, &e->loss_op)) != GW_SUCCESS) goto out;
  res = plan_model_storage(e);
out:
  free(count), free(last), free(producer);
  return res;
}

gw_result_t gw_exec_create(struct gw_model *m, const struct gw_backend_ops *ops, struct gw_backend *b,
                           const struct gw_exec_config *cfg, struct gw_exec **out) {
  *out = NULL;
  if (!m || !ops || !b || !cfg)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: model, backend and config are required");
  if (cfg->batch < 1)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: batch must be at least 1 (got %d)", cfg->batch);
  if (!(cfg->label_smoothing >= 0 && cfg->label_smoothing <= 1))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: label smoothing %g must be in [0, 1]",
                          (double)cfg->label_smoothing);
  struct gw_exec *e = calloc(1, sizeof *e);
  if (!e) return gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory");
  e->m = m, e->ops = ops, e->b = b, e->cfg = *cfg;
  e->loss_scale = 1;
  e->staged = -1, e->last_slot = -1;
  e->act_dt = ops->act_dtype(b);
  if (e->act_dt != GW_FLOAT32 && e->act_dt != GW_BFLOAT16 && e->act_dt != GW_FLOAT16) {
    int dt = e->act_dt;
    free(e);
    return gw__model_fail(GW_ERR_UNSUPPORTED, "executor: the backend's activations are of dtype %d: the executor "
                          "takes float32, bfloat16 and float16", dt);
  }
  e->esz = e->act_dt == GW_FLOAT32 ? sizeof(float) : sizeof(uint16_t);
  e->nhwc = ops->layout && ops->layout(b) == GW_LAYOUT_NHWC;
  e->L = calloc((size_t)m->nlayers, sizeof *e->L);
  e->act = calloc((size_t)m->nacts, sizeof *e->act);
  e->grad = calloc((size_t)m->nacts, sizeof *e->grad);
  gw_result_t res = GW_ERR_SYSTEM;
  if (!e->L || !e->act || !e->grad) gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory");
  else res = plan(e);
  if (res != GW_SUCCESS) {
    gw_exec_free(e);
    return res;
  }
  *out = e;
  return GW_SUCCESS;
}

void gw_exec_free(struct gw_exec *e) {
  if (!e) return;
  if (e->L)
    for (int i = 0; i < e->m->nlayers; i++) {
      e->ops->op_destroy(e->L[i].op);
      e->ops->op_destroy(e->L[i].acc);
    }
  e->ops->op_destroy(e->loss_op);
  for (int i = 0; i < e->nowned; i++) e->ops->dealloc(e->b, e->owned[i]);
  free(e->owned), free(e->L), free(e->act), free(e->grad);
  free(e->host_sums), free(e->host_stats), free(e->host_in);
  free(e->stage_host), free(e->slot_labels[0]), free(e->slot_labels[1]);
  free(e->prof);
  free(e);
}

size_t gw_exec_memory_bytes(const struct gw_exec *e) { return e->bytes; }

/* ---- running */

static float *P(struct gw_exec *e, int t) { return e->params + e->m->params_t[t].offset; }
static float *G(struct gw_exec *e, int t) { return e->grads + e->m->params_t[t].offset; }
static float *R(struct gw_exec *e, int t) { return e->running + e->m->buffers_t[t].offset; }

/* ---- SyncBatchNorm: the phases of backend.h with the sums crossing ranks */

gw_result_t gw_exec_check_train(const struct gw_exec *e, int ranks) {
  if (ranks < 1)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: gw_exec_check_train: %d ranks (at least 1)", ranks);
  const int per = e->sync_sum ? ranks : 1;
  for (int i = 0; i < e->m->nlayers; i++) {
    const struct gw_layer *l = &e->m->layers[i];
    if (l->kind != GW_LAYER_BN) continue;
    const struct gw_act *a = &e->m->acts[l->in];
    const size_t hw = (size_t)a->h * a->w, values = (size_t)e->cfg.batch * hw * (size_t)per;
    if (values < 2)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                            "executor: batch norm %s sees %zu value%s per channel (batch %d of %dx%d%s); training "
                            "needs at least 2: a batch of %zu, a larger image size%s",
                            l->name, values, values == 1 ? "" : "s", e->cfg.batch, a->h, a->w,
                            per > 1 ? " on each rank" : "", (2 + hw * per - 1) / (hw * per),
                            e->sync_sum ? "" : " or SyncBatchNorm over several ranks");
  }
  return GW_SUCCESS;
}

void gw_exec_set_sync_bn(struct gw_exec *e, gw_exec_sum_fn sum, void *arg) {
  e->sync_sum = sum;
  e->sync_arg = arg;
}

/* The backend's partial sums [2c] plus this rank's value count, summed over
 * every rank into e->host_sums [2c + 1]. */
static gw_result_t sum_across_ranks(struct gw_exec *e, const struct gw_layer *l, int c) {
  GW_MODEL_TRY(e->ops->download(e->b, e->host_sums, e->sums, 2 * (size_t)c * sizeof(double)));
  const struct gw_act *a = &e->m->acts[l->in];
  e->host_sums[2 * c] = (double)e->cfg.batch * a->h * a->w;
  gw_result_t res = e->sync_sum(e->sync_arg, e->host_sums, 2 * (size_t)c + 1);
  if (res != GW_SUCCESS)
    return gw__model_fail(res, "executor: SyncBatchNorm %s: summing statistics across ranks failed (gw_result_t %d)",
                          l->name, (int)res);
  return GW_SUCCESS;
}

static gw_result_t sync_bn_forward(struct gw_exec *e, const struct gw_layer *l, struct exec_layer *x) {
  const struct gw_backend_ops *o = e->ops;
  const int c = e->m->acts[l->in].c;
  struct gw_op_desc d; /* the layer's eps and momentum: those of the unsynced batch norm */
  gw_model_op_desc(e->m, (int)(l - e->m->layers), e->cfg.batch, &d);
  const double momentum = d.momentum, eps = d.eps;
  float *mean = e->host_stats, *rstd = mean + c, *rmean = rstd + c, *rvar = rmean + c;
  GW_MODEL_TRY(o->bn_sums(x->op, e->act[l->in], e->sums));
  GW_MODEL_TRY(sum_across_ranks(e, l, c));
  double count = e->host_sums[2 * c];
  if (count < 2)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: SyncBatchNorm %s sees %.0f values per channel; "
                          "training needs more", l->name, count);
  GW_MODEL_TRY(o->download(e->b, rmean, R(e, l->running_mean), (size_t)c * sizeof(float)));
  GW_MODEL_TRY(o->download(e->b, rvar, R(e, l->running_var), (size_t)c * sizeof(float)));
  for (int ch = 0; ch < c; ch++) {
    double mu = e->host_sums[ch] / count, var = e->host_sums[c + ch] / count - mu * mu;
    if (var < 0) var = 0; /* rounding of E[x^2] - mean^2 */
    mean[ch] = (float)mu;
    rstd[ch] = (float)(1.0 / sqrt(var + eps));
    rmean[ch] = (float)(momentum * mu + (1 - momentum) * (double)rmean[ch]);
    rvar[ch] = (float)(momentum * var * count / (count - 1) + (1 - momentum) * (double)rvar[ch]);
  }
  GW_MODEL_TRY(o->upload(e->b, x->save_mean, mean, (size_t)c * sizeof(float)));
  GW_MODEL_TRY(o->upload(e->b, x->save_rstd, rstd, (size_t)c * sizeof(float)));
  GW_MODEL_TRY(o->bn_fwd_apply(x->op, e->act[l->in], P(e, l->weight), P(e, l->bias), x->save_mean, x->save_rstd,
                               e->act[l->out]));
  /* The running statistics last: a refused call moves nothing (forward_layer
   * counts the batch only on success; they moved before a failed apply). */
  GW_MODEL_TRY(o->upload(e->b, R(e, l->running_mean), rmean, (size_t)c * sizeof(float)));
  return o->upload(e->b, R(e, l->running_var), rvar, (size_t)c * sizeof(float));
}

static gw_result_t sync_bn_backward(struct gw_exec *e, const struct gw_layer *l, struct exec_layer *x, const void *dy,
                                    void *dx) {
  const struct gw_backend_ops *o = e->ops;
  const int c = e->m->acts[l->in].c;
  float *dgamma = e->host_stats, *dbeta = dgamma + c;
  GW_MODEL_TRY(o->bn_bwd_sums(x->op, e->act[l->in], dy, x->save_mean, x->save_rstd, e->sums));
  GW_MODEL_TRY(o->download(e->b, e->host_sums, e->sums, 2 * (size_t)c * sizeof(double)));
  for (int ch = 0; ch < c; ch++) dbeta[ch] = (float)e->host_sums[ch], dgamma[ch] = (float)e->host_sums[c + ch];
  GW_MODEL_TRY(o->upload(e->b, G(e, l->weight), dgamma, (size_t)c * sizeof(float)));
  GW_MODEL_TRY(o->upload(e->b, G(e, l->bias), dbeta, (size_t)c * sizeof(float)));
  GW_MODEL_TRY(sum_across_ranks(e, l, c));
  GW_MODEL_TRY(o->upload(e->b, e->sums, e->host_sums, 2 * (size_t)c * sizeof(double)));
  return o->bn_bwd_apply(x->op, e->act[l->in], dy, P(e, l->weight), x->save_mean, x->save_rstd, e->sums,
                         e->host_sums[2 * c], dx);
}

/* Whether fused groups run as one call now (SyncBatchNorm's phases cannot). */
static int fusing(const struct gw_exec *e) { return e->fusable && !e->sync_sum; }

static gw_result_t forward_layer(struct gw_exec *e, int i, int train) {
  const struct gw_layer *l = &e->m->layers[i];
  struct exec_layer *x = &e->L[i];
  const struct gw_backend_ops *o = e->ops;
  void *in = e->act[l->in], *out = e->act[l->out];
  if (x->member && fusing(e)) return GW_SUCCESS; /* done by its group's BN */
  const int fuse = x->fuse && fusing(e);
  const void *z = fuse && x->fuse == 2 ? e->act[x->z_act] : NULL;
  if (fuse) out = e->act[x->out_act];
  switch (l->kind) {
  case GW_LAYER_CONV: return o->conv_fwd(x->op, in, P(e, l->weight), out);
  case GW_LAYER_BN:
    if (!train && fuse)
      return o->bn_act_fwd_infer(x->op, in, z, P(e, l->weight), P(e, l->bias), R(e, l->running_mean),
                                 R(e, l->running_var), out);
    if (!train)
      return o->bn_fwd_infer(x->op, in, P(e, l->weight), P(e, l->bias), R(e, l->running_mean),
                             R(e, l->running_var), out);
    {
      gw_result_t r = e->sync_sum ? sync_bn_forward(e, l, x)
                      : fuse ? o->bn_act_fwd_train(x->op, in, z, P(e, l->weight), P(e, l->bias), out, x->save_mean,
                                                   x->save_rstd, R(e, l->running_mean), R(e, l->running_var))
                             : o->bn_fwd_train(x->op, in, P(e, l->weight), P(e, l->bias), out, x->save_mean,
                                               x->save_rstd, R(e, l->running_mean), R(e, l->running_var));
      /* Counted once the statistics moved (a refused call moves nothing). */
      if (r == GW_SUCCESS) e->m->counter_data[e->m->buffers_t[l->num_batches_tracked].offset]++;
      return r;
    }
  case GW_LAYER_RELU: return o->relu_fwd(x->op, in, out);
  case GW_LAYER_MAXPOOL: return o->maxpool_fwd(x->op, in, out, x->workspace);
  case GW_LAYER_AVGPOOL: return o->avgpool_fwd(x->op, in, out);
  case GW_LAYER_FC: return o->fc_fwd(x->op, in, P(e, l->weight), P(e, l->bias), out);
  case GW_LAYER_ADD: return o->add(x->op, in, e->act[l->in2], out);
  }
  return gw__model_fail(GW_ERR_INTERNAL, "executor: layer %s has unknown kind %d", l->name, (int)l->kind);
}

static gw_result_t check_labels(const struct gw_exec *e, const int32_t *labels) {
  if (!labels) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: backward needs the labels");
  for (int i = 0; i < e->cfg.batch; i++)
    if (labels[i] < 0 || labels[i] >= e->m->cfg.classes)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: label %d of sample %d is not a class in [0, %d)",
                            (int)labels[i], i, e->m->cfg.classes);
  return GW_SUCCESS;
}

static gw_result_t stage_alloc(struct gw_exec *e) {
  size_t in = act_elems(e, 0) * e->esz;
  e->slot_lab_off = (in + 255) / 256 * 256;
  e->slot_bytes = e->slot_lab_off + (size_t)e->cfg.batch * sizeof(int32_t);
  for (int i = 0; i < 2; i++) { /* what a failed earlier call made is kept */
    if (!e->slot_buf[i]) EX_ALLOC(e->slot_buf[i], e, e->slot_bytes, "a staged input batch");
    if (!e->slot_labels[i] && !(e->slot_labels[i] = malloc((size_t)e->cfg.batch * sizeof(int32_t))))
      return gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory");
  }
  /* A backend with stage_buffer lends its own (pinned) buffers instead. */
  if (!e->ops->stage_buffer && !e->stage_host && !(e->stage_host = malloc(e->slot_bytes)))
    return gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory");
  e->stage_ready = 1;
  return GW_SUCCESS;
}

gw_result_t gw_exec_stage(struct gw_exec *e, const float *images, const int32_t *labels) {
  if (!images) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: staging needs an input batch");
  GW_MODEL_TRY(check_labels(e, labels));
  if (!e->stage_ready) GW_MODEL_TRY(stage_alloc(e));
  /* Never the slot the last staged forward took: its backward may still read it. */
  int slot = e->staged >= 0 ? e->staged : e->last_slot >= 0 ? e->last_slot ^ 1 : 0;
  e->staged = -1; /* until the transfer is queued */
  /* Converted straight into the backend's pinned buffer where it lends one (no
   * copy of the whole batch on the host before the transfer). */
  void *host = e->stage_host;
  if (e->ops->stage_buffer) GW_MODEL_TRY(e->ops->stage_buffer(e->b, slot, e->slot_bytes, &host));
  gw__exec_input(host, images, e->cfg.batch, &e->m->acts[0], e->act_dt, e->nhwc);
  memcpy((char *)host + e->slot_lab_off, labels, (size_t)e->cfg.batch * sizeof(int32_t));
  GW_MODEL_TRY(e->ops->upload_async(e->b, e->slot_buf[slot], host, e->slot_bytes, slot));
  memcpy(e->slot_labels[slot], labels, (size_t)e->cfg.batch * sizeof(int32_t));
  e->staged = slot;
  return GW_SUCCESS;
}

/* A layer's call failed: its message (a backend's names the operation and
 * what the library said) gets which layer and which direction in front. */
static gw_result_t layer_failed(const struct gw_exec *e, gw_result_t r, const char *direction, int i) {
  return gw__model_prefix(r, "executor: %s of layer %s (%d)", direction, e->m->layers[i].name, i);
}

gw_result_t gw_exec_forward(struct gw_exec *e, const float *images, int train) {
  e->trained_forward = 0;
  if (train && e->cfg.inference)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: an inference executor runs evaluation forwards only");
  if (!images) { /* the staged batch */
    if (e->staged < 0)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: forward needs an input batch (none given, none staged)");
    const int slot = e->staged;
    GW_MODEL_TRY(e->ops->upload_order(e->b, slot));
    e->act[0] = e->slot_buf[slot];
    e->staged = -1, e->last_slot = slot, e->fwd_staged = 1;
  } else {
    size_t n = act_elems(e, 0);
    e->act[0] = e->act0, e->fwd_staged = 0;
    if (e->host_in) { /* 16-bit or NHWC activations: the batch converted on the host, then up */
      gw__exec_input(e->host_in, images, e->cfg.batch, &e->m->acts[0], e->act_dt, e->nhwc);
      GW_MODEL_TRY(e->ops->upload(e->b, e->act[0], e->host_in, n * e->esz));
    } else {
      GW_MODEL_TRY(e->ops->upload(e->b, e->act[0], images, n * sizeof(float)));
    }
  }
  e->prof_fwd_marked = 0;
  if (e->profiling) GW_MODEL_TRY(e->ops->mark(e->b, 0));
  for (int i = 0; i < e->m->nlayers; i++) {
    gw_result_t r = forward_layer(e, i, train);
    if (r != GW_SUCCESS) return layer_failed(e, r, "forward", i);
    if (e->profiling) GW_MODEL_TRY(e->ops->mark(e->b, i + 1));
  }
  e->prof_fwd_marked = e->profiling && train;
  e->trained_forward = train != 0;
  return GW_SUCCESS;
}

gw_result_t gw_exec_logits(struct gw_exec *e, float *host_logits) {
  int a = e->m->nacts - 1;
  size_t n = act_elems(e, a);
  /* [batch, classes]: the same in either layout */
  if (e->esz == sizeof(float)) return e->ops->download(e->b, host_logits, e->act[a], n * sizeof(float));
  GW_MODEL_TRY(e->ops->download(e->b, e->host_in, e->act[a], n * e->esz));
  gw_half_to_f32_n(e->act_dt == GW_FLOAT16, host_logits, e->host_in, n);
  return GW_SUCCESS;
}

/* The gradient of an input: written straight into its buffer by the last
 * reader, into the scratch (then added) by an earlier one. */
static void *dx_target(struct gw_exec *e, const struct gw_layer *l, const struct exec_layer *x) {
  if (l->in == 0) return NULL;
  return x->acc_in ? e->scratch : e->grad[l->in];
}

static gw_result_t add_into(struct gw_exec *e, struct gw_op *op, int a, const void *contribution, int accumulate) {
  if (accumulate) return e->ops->add(op, e->grad[a], contribution, e->grad[a]);
  if (e->grad[a] == contribution) return GW_SUCCESS; /* the path's own buffer (plan_gradients) */
  return e->ops->copy(e->b, e->grad[a], contribution, act_elems(e, a) * e->esz);
}

/* A fused group's backward in its BN's call: dy is the group output's
 * gradient, masked by the ReLU inside; the residual's gradient (bn -> add ->
 * relu) is written or, where it has other readers, added to. */
static gw_result_t backward_fused(struct gw_exec *e, const struct gw_layer *l, struct exec_layer *x, void *dx) {
  const struct gw_backend_ops *o = e->ops;
  void *dz = NULL;
  int acc_z = 0;
  struct exec_layer *ax = NULL;
  if (x->fuse == 2) {
    ax = &e->L[x->add_layer];
    const struct gw_layer *al = &e->m->layers[x->add_layer];
    acc_z = al->in == x->z_act ? ax->acc_in : ax->acc_in2;
    dz = acc_z ? e->scratch : e->grad[x->z_act];
  }
  GW_MODEL_TRY(o->bn_act_bwd(x->op, e->act[l->in], e->act[x->out_act], e->grad[x->out_act], P(e, l->weight),
                             x->save_mean, x->save_rstd, dx, dz, G(e, l->weight), G(e, l->bias)));
  if (acc_z) GW_MODEL_TRY(o->add(ax->op, e->grad[x->z_act], e->scratch, e->grad[x->z_act]));
  return GW_SUCCESS;
}

static gw_result_t backward_layer(struct gw_exec *e, int i) {
  const struct gw_layer *l = &e->m->layers[i];
  struct exec_layer *x = &e->L[i];
  const struct gw_backend_ops *o = e->ops;
  const void *dy = e->grad[l->out], *in = e->act[l->in];
  void *dx = dx_target(e, l, x);
  if (x->member && fusing(e)) return GW_SUCCESS;   /* in its group's BN */
  if (x->fuse && fusing(e)) return backward_fused(e, l, x, dx); /* BN writes its input's gradient directly */
  switch (l->kind) {
  case GW_LAYER_CONV:
    if (dx) GW_MODEL_TRY(o->conv_bwd_data(x->op, dy, P(e, l->weight), dx));
    GW_MODEL_TRY(o->conv_bwd_weights(x->op, in, dy, G(e, l->weight)));
    break;
  case GW_LAYER_BN:
    if (e->sync_sum) GW_MODEL_TRY(sync_bn_backward(e, l, x, dy, dx));
    else
      GW_MODEL_TRY(o->bn_bwd(x->op, in, dy, P(e, l->weight), x->save_mean, x->save_rstd, dx, G(e, l->weight),
                             G(e, l->bias)));
    break;
  case GW_LAYER_RELU: GW_MODEL_TRY(o->relu_bwd(x->op, e->act[l->out], dy, dx)); break;
  case GW_LAYER_MAXPOOL: GW_MODEL_TRY(o->maxpool_bwd(x->op, dy, x->workspace, dx)); break;
  case GW_LAYER_AVGPOOL: GW_MODEL_TRY(o->avgpool_bwd(x->op, dy, dx)); break;
  case GW_LAYER_FC:
    GW_MODEL_TRY(o->fc_bwd(x->op, in, P(e, l->weight), dy, dx, G(e, l->weight), G(e, l->bias)));
    break;
  case GW_LAYER_ADD:
    /* Both inputs receive dy unchanged. */
    GW_MODEL_TRY(add_into(e, x->op, l->in, dy, x->acc_in));
    return add_into(e, x->op, l->in2, dy, x->acc_in2);
  }
  if (dx && x->acc_in) GW_MODEL_TRY(o->add(x->acc, e->grad[l->in], e->scratch, e->grad[l->in]));
  return GW_SUCCESS;
}


/* ---- profiles: marks 0 .. nl around forward's layers, nl + 1 and nl + 2
 * around the loss, then one after each layer's backward (last layer first) */

static int prof_slots(const struct gw_model *m) { return 2 * m->nlayers + 3; }

/* Which layers lead a fused group or run inside one, as the executor runs
 * them now: read again for each step collected, since gw_exec_set_sync_bn
 * (which runs the groups unfused) may come after gw_exec_set_profile. */
static void prof_roles(struct gw_exec *e) {
  for (int i = 0; i < e->m->nlayers; i++)
    e->prof[i].fused = fusing(e) ? e->L[i].fuse : 0, e->prof[i].member = fusing(e) ? e->L[i].member : 0;
}

gw_result_t gw_exec_set_profile(struct gw_exec *e, int on) {
  e->profiling = 0, e->prof_fwd_marked = 0;
  if (!on) return GW_SUCCESS;
  if (!e->ops->mark || !e->ops->mark_elapsed)
    return gw__model_fail(GW_ERR_UNSUPPORTED, "executor: the %s backend has no time marks to profile with",
                          e->ops->name);
  if (prof_slots(e->m) > GW_BACKEND_MARKS)
    return gw__model_fail(GW_ERR_UNSUPPORTED, "executor: %d layers need %d time marks to profile, backends keep %d",
                          e->m->nlayers, prof_slots(e->m), GW_BACKEND_MARKS);
  const int nl = e->m->nlayers;
  if (!e->prof && !(e->prof = calloc((size_t)nl + 1, sizeof *e->prof)))
    return gw__model_fail(GW_ERR_SYSTEM, "executor: out of memory for a profile");
  for (int i = 0; i <= nl; i++) {
    const struct gw_layer *l = i < nl ? &e->m->layers[i] : NULL;
    e->prof[i] = (struct gw_exec_layer_time){.name = l ? l->name : "loss", .kind = l ? (int)l->kind : -1};
  }
  prof_roles(e);
  e->prof_steps = 0, e->profiling = 1;
  return GW_SUCCESS;
}

static gw_result_t profile_collect(struct gw_exec *e) {
  const struct gw_backend_ops *o = e->ops;
  const int nl = e->m->nlayers, base = nl + 1;
  double s;
  prof_roles(e);
  for (int i = 0; i < nl; i++) {
    if (e->prof[i].member) continue;
    GW_MODEL_TRY(o->mark_elapsed(e->b, i, i + 1, &s));
    e->prof[i].fwd_s += s;
    const int after = base + 2 + (nl - 1 - i);
    GW_MODEL_TRY(o->mark_elapsed(e->b, after - 1, after, &s));
    e->prof[i].bwd_s += s;
  }
  GW_MODEL_TRY(o->mark_elapsed(e->b, base, base + 1, &s));
  e->prof[nl].bwd_s += s;
  e->prof_steps++;
  return GW_SUCCESS;
}

const struct gw_exec_layer_time *gw_exec_profile(const struct gw_exec *e, int *nentries, int *steps) {
  if (nentries) *nentries = e->prof ? e->m->nlayers + 1 : 0;
  if (steps) *steps = e->prof_steps;
  return e->prof;
}

gw_result_t gw_exec_backward(struct gw_exec *e, const int32_t *labels, float *loss, gw_grad_ready_fn ready,
                             void *ready_arg) {
  if (e->cfg.inference)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: an inference executor has no backward");
  if (!e->trained_forward)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "executor: backward needs a training forward first (the last forward was evaluation, "
                          "failed, or already went backward)");
  int32_t *dev_labels = e->labels;
  if (!labels && e->fwd_staged) { /* the staged batch's, checked when staged */
    dev_labels = (int32_t *)(void *)((char *)e->slot_buf[e->last_slot] + e->slot_lab_off);
  } else {
    GW_MODEL_TRY(check_labels(e, labels));
    GW_MODEL_TRY(e->ops->upload(e->b, e->labels, labels, (size_t)e->cfg.batch * sizeof(int32_t)));
  }
  e->trained_forward = 0; /* backward reuses gradient buffers: one backward per forward */
  int logits = e->m->nacts - 1;
  float host_loss = 0;
  const int nl = e->m->nlayers, mark = e->profiling && e->prof_fwd_marked, base = nl + 1;
  if (mark) GW_MODEL_TRY(e->ops->mark(e->b, base));
  gw_result_t r =
      e->ops->loss_fwd_bwd(e->loss_op, e->act[logits], dev_labels, e->loss_scale, &host_loss, e->grad[logits]);
  if (r != GW_SUCCESS) return gw__model_prefix(r, "executor: the loss");
  if (mark) GW_MODEL_TRY(e->ops->mark(e->b, base + 1));
  if (loss) *loss = host_loss;
  size_t reported = 0;
  for (int i = nl - 1; i >= 0; i--) {
    if ((r = backward_layer(e, i)) != GW_SUCCESS) return layer_failed(e, r, "backward", i);
    if (mark) GW_MODEL_TRY(e->ops->mark(e->b, base + 2 + (nl - 1 - i)));
    if (ready && e->L[i].ready_after > reported) ready(ready_arg, reported = e->L[i].ready_after);
  }
  return mark ? profile_collect(e) : GW_SUCCESS;
}

gw_result_t gw_exec_set_loss_scale(struct gw_exec *e, float scale) {
  if (!(scale > 0 && scale < INFINITY))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: loss scale %g must be finite and > 0", (double)scale);
  e->loss_scale = scale;
  return GW_SUCCESS;
}

int gw_exec_fused_groups(const struct gw_exec *e) {
  int n = 0;
  for (int i = 0; fusing(e) && i < e->m->nlayers; i++) n += e->L[i].fuse != 0;
  return n;
}

float *gw_exec_params(const struct gw_exec *e) { return e->params; }
float *gw_exec_grads(const struct gw_exec *e) { return e->grads; }

gw_result_t gw_exec_upload_model(struct gw_exec *e) {
  struct gw_model *m = e->m;
  if (e->ops->host_memory) return GW_SUCCESS;
  GW_MODEL_TRY(e->ops->upload(e->b, e->params, m->param_data, m->num_params * sizeof(float)));
  return e->ops->upload(e->b, e->running, m->running_data, m->num_running * sizeof(float));
}

gw_result_t gw_exec_download_grads(struct gw_exec *e, size_t first, size_t count) {
  struct gw_model *m = e->m;
  if (first > m->num_params || count > m->num_params - first)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: gradients [%zu, +%zu) are not within the %zu of the model",
                          first, count, m->num_params);
  if (e->ops->host_memory || count == 0) return GW_SUCCESS;
  if (!e->grads) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "executor: an inference executor has no gradients");
  return e->ops->download(e->b, m->grad_data + first, e->grads + first, count * sizeof(float));
}

gw_result_t gw_exec_download_stats(struct gw_exec *e) {
  struct gw_model *m = e->m;
  if (e->ops->host_memory) return GW_SUCCESS;
  return e->ops->download(e->b, m->running_data, e->running, m->num_running * sizeof(float));
}

gw_result_t gw_exec_download_model(struct gw_exec *e) {
  struct gw_model *m = e->m;
  if (e->ops->host_memory) return GW_SUCCESS;
  GW_MODEL_TRY(e->ops->download(e->b, m->param_data, e->params, m->num_params * sizeof(float)));
  if (e->grads) GW_MODEL_TRY(e->ops->download(e->b, m->grad_data, e->grads, m->num_params * sizeof(float)));
  return e->ops->download(e->b, m->running_data, e->running, m->num_running * sizeof(float));
}
