/* resnet.c - builds the ResNet description of resnet.h from a config: checks the
 * config, walks the network in forward order appending layers, activations,
 * parameters and BN buffers under torchvision's names, then lays the parameters
 * out in reverse forward order and allocates the storage.
 *
 * It does not initialize values (init.c) or run anything (the backends).  The
 * forward walk mirrors torchvision's ResNet.__init__ / _make_layer / block
 * constructors, so the creation order here IS named_parameters() order.
 */
#include "resnet.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model_internal.h"

static _Thread_local char last_error[GW_MODEL_ERRMSG_MAX];

const char *gw_model_last_error(void) { return last_error; }

gw_result_t gw__model_vfail(gw_result_t code, const char *fmt, va_list ap) {
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  return code;
}

gw_result_t gw__model_fail(gw_result_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  gw__model_vfail(code, fmt, ap);
  va_end(ap);
  return code;
}

gw_result_t gw__model_prefix(gw_result_t code, const char *fmt, ...) {
  char inner[sizeof last_error];
  memcpy(inner, last_error, sizeof inner); /* formatted over below */
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof last_error)
    snprintf(last_error + n, sizeof last_error - (size_t)n, ": %s", inner[0] ? inner : "(no message recorded)");
  return code;
}

void gw_model_config_default(struct gw_model_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->depth = 50;
  cfg->classes = 1000;
  cfg->in_channels = 3;
  cfg->image_size = 224;
  cfg->stem = GW_STEM_IMAGENET;
  cfg->width_divisor = 1;
  cfg->zero_init_residual = 0;
  cfg->seed = 0;
}

int gw_model_depth_from_name(const char *name, int *depth) {
  static const int depths[] = {18, 34, 50, 101, 152};
  if (!name) return -1;
  if (strncmp(name, "resnet", 6) == 0) name += 6;
  for (size_t i = 0; i < sizeof depths / sizeof depths[0]; i++) {
    char buf[8];
    snprintf(buf, sizeof buf, "%d", depths[i]);
    if (strcmp(name, buf) == 0) {
      *depth = depths[i];
      return 0;
    }
  }
  return -1;
}

/* Blocks per stage and block type, as torchvision's resnetNN() functions. */
static int stage_blocks(int depth, int blocks[4], int *bottleneck) {
  static const struct { int depth, bottleneck, blocks[4]; } table[] = {
      {18, 0, {2, 2, 2, 2}},  {34, 0, {3, 4, 6, 3}},   {50, 1, {3, 4, 6, 3}},
      {101, 1, {3, 4, 23, 3}}, {152, 1, {3, 8, 36, 3}},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    if (table[i].depth != depth) continue;
    memcpy(blocks, table[i].blocks, sizeof table[i].blocks);
    *bottleneck = table[i].bottleneck;
    return 0;
  }
  return -1;
}

static int out_size(int in, int kernel, int stride, int pad) { return (in + 2 * pad - kernel) / stride + 1; }

#define GW_MODEL_MAX_IMAGE 8192

static gw_result_t check_config(const struct gw_model_config *cfg) {
  int blocks[4], bottleneck;
  if (stage_blocks(cfg->depth, blocks, &bottleneck) != 0)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "unknown ResNet depth %d: use 18, 34, 50, 101 or 152", cfg->depth);
  if (cfg->classes < 1)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "classes must be at least 1 (got %d)", cfg->classes);
  if (cfg->in_channels < 1)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "in_channels must be at least 1 (got %d)",
                          cfg->in_channels);
  if (cfg->stem != GW_STEM_IMAGENET && cfg->stem != GW_STEM_SMALL)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "unknown stem %d: use imagenet (%d) or small (%d)",
                          (int)cfg->stem, GW_STEM_IMAGENET, GW_STEM_SMALL);
  if (cfg->width_divisor < 1 || 64 % cfg->width_divisor != 0)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "width divisor %d does not divide the stem width 64: use 1, 2, 4, 8, 16, 32 or 64",
                          cfg->width_divisor);
  if (cfg->image_size > GW_MODEL_MAX_IMAGE)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "image size %d is larger than the %d this build supports",
                          cfg->image_size, GW_MODEL_MAX_IMAGE);
  /* A stride-2 layer on a 1x1 input gives 1x1 (its padding covers the
   * kernel), as in PyTorch, which trains such shapes: only batch norm's
   * "more than 1 value per channel" limits them, checked where the batch is
   * known (gw_exec_check_train). */
  if (cfg->image_size < 1)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "image size must be at least 1 (got %d)", cfg->image_size);
  return GW_SUCCESS;
}

/* ---- the builder: append-only arrays; an allocation failure is remembered and
 * reported once at the end, so the walk below stays readable. */

static void *grow(void *p, int n, int *cap, size_t elem, int *oom) {
  if (n < *cap) return p;
  int ncap = *cap ? *cap * 2 : 64;
  void *q = realloc(p, (size_t)ncap * elem);
  if (!q) {
    *oom = 1;
    return NULL;
  }
  *cap = ncap;
  return q;
}

static int add_act(struct gw_model *m, int c, int h, int w) {
  struct gw_act *a = grow(m->acts, m->nacts, &m->cap_acts, sizeof *a, &m->oom);
  if (!a) return 0;
  m->acts = a;
  a[m->nacts] = (struct gw_act){c, h, w};
  return m->nacts++;
}

static struct gw_layer *add_layer(struct gw_model *m, enum gw_layer_kind kind, const char *name, int in) {
  struct gw_layer *l = grow(m->layers, m->nlayers, &m->cap_layers, sizeof *l, &m->oom);
  if (!l) return NULL;
  m->layers = l;
  l += m->nlayers++;
  memset(l, 0, sizeof *l);
  l->kind = kind;
  snprintf(l->name, sizeof l->name, "%s", name);
  l->in = in;
  l->in2 = l->out = -1;
  l->weight = l->bias = -1;
  l->running_mean = l->running_var = l->num_batches_tracked = -1;
  return l;
}

/* Appends a tensor named "<module>.<field>"; returns its index or -1. */
static int add_tensor(struct gw_model *m, enum gw_tensor_kind kind, const char *module, const char *field,
                      int ndim, const int64_t *shape) {
  struct gw_tensor **tab = kind == GW_TENSOR_PARAM ? &m->params_t : &m->buffers_t;
  int *n = kind == GW_TENSOR_PARAM ? &m->nparams_t : &m->nbuffers_t;
  int *cap = kind == GW_TENSOR_PARAM ? &m->cap_params_t : &m->cap_buffers_t;
  struct gw_tensor *t = grow(*tab, *n, cap, sizeof *t, &m->oom);
  if (!t) return -1;
  *tab = t;
  t += *n;
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s.%s", module, field);
  t->kind = kind;
  t->dtype = kind == GW_TENSOR_COUNTER ? GW_INT64 : GW_FLOAT32;
  t->ndim = ndim;
  t->numel = 1;
  for (int d = 0; d < ndim; d++) {
    t->shape[d] = shape[d];
    t->numel *= (size_t)shape[d];
  }
  t->layer = m->nlayers - 1;
  /* Buffers are stored in creation order; parameters get their offsets at the end. */
  if (kind == GW_TENSOR_RUNNING) {
    t->offset = m->num_running;
    m->num_running += t->numel;
  } else if (kind == GW_TENSOR_COUNTER) {
    t->offset = m->num_counters;
    m->num_counters += t->numel;
  }
  return (*n)++;
}

static int conv(struct gw_model *m, const char *name, int in, int c_out, int kernel, int stride, int pad) {
  if (m->oom) return 0;
  struct gw_act a = m->acts[in];
  struct gw_layer *l = add_layer(m, GW_LAYER_CONV, name, in);
  if (!l) return 0;
  l->kernel = kernel, l->stride = stride, l->pad = pad;
  int64_t shape[4] = {c_out, a.c, kernel, kernel};
  l->weight = add_tensor(m, GW_TENSOR_PARAM, name, "weight", 4, shape);
  int out = add_act(m, c_out, out_size(a.h, kernel, stride, pad), out_size(a.w, kernel, stride, pad));
  if (!m->oom) m->layers[m->nlayers - 1].out = out;
  return out;
}

static int bn(struct gw_model *m, const char *name, int in, int block_last) {
  if (m->oom) return 0;
  struct gw_act a = m->acts[in];
  struct gw_layer *l = add_layer(m, GW_LAYER_BN, name, in);
  if (!l) return 0;
  l->block_last_bn = block_last;
  int64_t c = a.c;
  int w = add_tensor(m, GW_TENSOR_PARAM, name, "weight", 1, &c);
  int b = add_tensor(m, GW_TENSOR_PARAM, name, "bias", 1, &c);
  int rm = add_tensor(m, GW_TENSOR_RUNNING, name, "running_mean", 1, &c);
  int rv = add_tensor(m, GW_TENSOR_RUNNING, name, "running_var", 1, &c);
  int nb = add_tensor(m, GW_TENSOR_COUNTER, name, "num_batches_tracked", 0, NULL);
  int out = add_act(m, a.c, a.h, a.w);
  if (m->oom) return 0;
  l = &m->layers[m->nlayers - 1];
  l->weight = w, l->bias = b, l->running_mean = rm, l->running_var = rv, l->num_batches_tracked = nb;
  l->out = out;
  return out;
}

/* A layer without parameters whose output has the shape given. */
static int simple(struct gw_model *m, enum gw_layer_kind kind, const char *name, int in, int in2, int c, int h,
                  int w) {
  if (m->oom) return 0;
  struct gw_layer *l = add_layer(m, kind, name, in);
  if (!l) return 0;
  l->in2 = in2;
  int out = add_act(m, c, h, w);
  if (!m->oom) m->layers[m->nlayers - 1].out = out;
  return out;
}

static int relu(struct gw_model *m, const char *name, int in) {
  struct gw_act a = m->oom ? (struct gw_act){0, 0, 0} : m->acts[in];
  return simple(m, GW_LAYER_RELU, name, in, -1, a.c, a.h, a.w);
}

static int maxpool(struct gw_model *m, const char *name, int in, int kernel, int stride, int pad) {
  if (m->oom) return 0;
  struct gw_act a = m->acts[in];
  int out = simple(m, GW_LAYER_MAXPOOL, name, in, -1, a.c, out_size(a.h, kernel, stride, pad),
                   out_size(a.w, kernel, stride, pad));
  if (m->oom) return 0;
  struct gw_layer *l = &m->layers[m->nlayers - 1];
  l->kernel = kernel, l->stride = stride, l->pad = pad;
  return out;
}

static int fc(struct gw_model *m, const char *name, int in, int classes) {
  if (m->oom) return 0;
  struct gw_act a = m->acts[in];
  struct gw_layer *l = add_layer(m, GW_LAYER_FC, name, in);
  if (!l) return 0;
  int64_t wshape[2] = {classes, (int64_t)a.c * a.h * a.w}, bshape = classes;
  int w = add_tensor(m, GW_TENSOR_PARAM, name, "weight", 2, wshape);
  int b = add_tensor(m, GW_TENSOR_PARAM, name, "bias", 1, &bshape);
  int out = add_act(m, classes, 1, 1);
  if (m->oom) return 0;
  l = &m->layers[m->nlayers - 1];
  l->weight = w, l->bias = b, l->out = out;
  return out;
}

/* torchvision's BasicBlock (expansion 1) or Bottleneck (expansion 4, stride on
 * the 3x3 conv: v1.5).  The projection shortcut runs after the main branch, as in
 * torchvision's forward(), so creation order stays named_parameters() order. */
static int block(struct gw_model *m, const char *prefix, int x, int width, int stride, int bottleneck) {
  char n[48];
  int out_c = bottleneck ? width * 4 : width;
  int c_in = m->oom ? 0 : m->acts[x].c;
  int y;
#define NAME(suffix) (snprintf(n, sizeof n, "%s.%s", prefix, suffix), n)
  if (bottleneck) {
    y = conv(m, NAME("conv1"), x, width, 1, 1, 0);
    y = bn(m, NAME("bn1"), y, 0);
    y = relu(m, NAME("relu1"), y);
    y = conv(m, NAME("conv2"), y, width, 3, stride, 1);
    y = bn(m, NAME("bn2"), y, 0);
    y = relu(m, NAME("relu2"), y);
    y = conv(m, NAME("conv3"), y, out_c, 1, 1, 0);
    y = bn(m, NAME("bn3"), y, 1);
  } else {
    y = conv(m, NAME("conv1"), x, width, 3, stride, 1);
    y = bn(m, NAME("bn1"), y, 0);
    y = relu(m, NAME("relu1"), y);
    y = conv(m, NAME("conv2"), y, width, 3, 1, 1);
    y = bn(m, NAME("bn2"), y, 1);
  }
  int shortcut = x;
  if (stride != 1 || c_in != out_c) {
    shortcut = conv(m, NAME("downsample.0"), x, out_c, 1, stride, 0);
    shortcut = bn(m, NAME("downsample.1"), shortcut, 0);
  }
  if (m->oom) return 0;
  struct gw_act a = m->acts[y];
  y = simple(m, GW_LAYER_ADD, NAME("add"), y, shortcut, a.c, a.h, a.w);
  y = relu(m, NAME(bottleneck ? "relu3" : "relu2"), y);
#undef NAME
  return y;
}

static void build(struct gw_model *m) {
  const struct gw_model_config *cfg = &m->cfg;
  int blocks[4] = {0, 0, 0, 0}, bottleneck = 0;
  stage_blocks(cfg->depth, blocks, &bottleneck);
  int base = 64 / cfg->width_divisor;
  int x = add_act(m, cfg->in_channels, cfg->image_size, cfg->image_size);
  if (cfg->stem == GW_STEM_IMAGENET) {
    x = conv(m, "conv1", x, base, 7, 2, 3);
    x = bn(m, "bn1", x, 0);
    x = relu(m, "relu", x);
    x = maxpool(m, "maxpool", x, 3, 2, 1);
  } else {
    x = conv(m, "conv1", x, base, 3, 1, 1);
    x = bn(m, "bn1", x, 0);
    x = relu(m, "relu", x);
  }
  for (int s = 0; s < 4; s++) {
    for (int b = 0; b < blocks[s]; b++) {
      char prefix[32];
      snprintf(prefix, sizeof prefix, "layer%d.%d", s + 1, b);
      x = block(m, prefix, x, base << s, s > 0 && b == 0 ? 2 : 1, bottleneck);
    }
  }
  if (m->oom) return;
  struct gw_act a = m->acts[x];
  x = simple(m, GW_LAYER_AVGPOOL, "avgpool", x, -1, a.c, 1, 1);
  fc(m, "fc", x, cfg->classes);
}

/* Reverse forward order: the last parameter created (fc.bias) starts the buffer. */
static void assign_offsets(struct gw_model *m) {
  size_t off = 0;
  for (int i = m->nparams_t - 1; i >= 0; i--) {
    m->params_t[i].offset = off;
    off += m->params_t[i].numel;
  }
  m->num_params = off;
}

static void *alloc_aligned(size_t n, size_t elem) {
  if (elem && n > (SIZE_MAX - 63) / elem) return NULL;
  size_t bytes = (n * elem + 63) / 64 * 64;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
  memset(p, 0, bytes);
  return p;
}

gw_result_t gw_model_init(struct gw_model **out, const struct gw_model_config *cfg) {
  last_error[0] = '\0';
  if (!out || !cfg) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "gw_model_init: NULL argument");
  *out = NULL;
  gw_result_t res = check_config(cfg);
  if (res != GW_SUCCESS) return res;
  struct gw_model *m = calloc(1, sizeof *m);
  if (!m) return gw__model_fail(GW_ERR_SYSTEM, "out of memory building the model description");
  m->cfg = *cfg;
  build(m);
  if (m->oom) {
    gw_model_free(m);
    return gw__model_fail(GW_ERR_SYSTEM, "out of memory building the model description");
  }
  assign_offsets(m);
  m->param_data = alloc_aligned(m->num_params, sizeof(float));
  m->grad_data = alloc_aligned(m->num_params, sizeof(float));
  m->running_data = alloc_aligned(m->num_running, sizeof(float));
  m->counter_data = alloc_aligned(m->num_counters, sizeof(int64_t));
  if (!m->param_data || !m->grad_data || !m->running_data || !m->counter_data) {
    size_t mib = (2 * m->num_params * sizeof(float)) >> 20;
    gw_model_free(m);
    return gw__model_fail(GW_ERR_SYSTEM,
                          "out of memory allocating %zu MiB of parameters and gradients for resnet%d",
                          mib, cfg->depth);
  }
  gw_model_reset_parameters(m, cfg->seed, cfg->zero_init_residual);
  *out = m;
  return GW_SUCCESS;
}

void gw_model_free(struct gw_model *m) {
  if (!m) return;
  free(m->counter_data);
  free(m->running_data);
  free(m->grad_data);
  free(m->param_data);
  free(m->buffers_t);
  free(m->params_t);
  free(m->layers);
  free(m->acts);
  free(m);
}

/* ---- accessors */

const struct gw_model_config *gw_model_get_config(const struct gw_model *m) { return &m->cfg; }
size_t gw_model_num_params(const struct gw_model *m) { return m->num_params; }
int gw_model_num_param_tensors(const struct gw_model *m) { return m->nparams_t; }
float *gw_model_params(struct gw_model *m) { return m->param_data; }
float *gw_model_grads(struct gw_model *m) { return m->grad_data; }
int gw_model_num_buffer_tensors(const struct gw_model *m) { return m->nbuffers_t; }
float *gw_model_running(struct gw_model *m) { return m->running_data; }
int64_t *gw_model_counters(struct gw_model *m) { return m->counter_data; }
int gw_model_num_layers(const struct gw_model *m) { return m->nlayers; }
int gw_model_num_acts(const struct gw_model *m) { return m->nacts; }

const struct gw_tensor *gw_model_param_tensor(const struct gw_model *m, int i) {
  return i >= 0 && i < m->nparams_t ? &m->params_t[i] : NULL;
}

const struct gw_tensor *gw_model_buffer_tensor(const struct gw_model *m, int i) {
  return i >= 0 && i < m->nbuffers_t ? &m->buffers_t[i] : NULL;
}

const struct gw_layer *gw_model_layer(const struct gw_model *m, int i) {
  return i >= 0 && i < m->nlayers ? &m->layers[i] : NULL;
}

const struct gw_act *gw_model_act(const struct gw_model *m, int i) {
  return i >= 0 && i < m->nacts ? &m->acts[i] : NULL;
}

const struct gw_tensor *gw_model_find(const struct gw_model *m, const char *name) {
  if (!name) return NULL;
  for (int i = 0; i < m->nparams_t; i++)
    if (strcmp(m->params_t[i].name, name) == 0) return &m->params_t[i];
  for (int i = 0; i < m->nbuffers_t; i++)
    if (strcmp(m->buffers_t[i].name, name) == 0) return &m->buffers_t[i];
  return NULL;
}

void *gw_model_tensor_data(struct gw_model *m, const struct gw_tensor *t) {
  switch (t->kind) {
    case GW_TENSOR_PARAM: return m->param_data + t->offset;
    case GW_TENSOR_RUNNING: return m->running_data + t->offset;
    case GW_TENSOR_COUNTER: return m->counter_data + t->offset;
  }
  return NULL;
}

void gw_model_op_desc(const struct gw_model *m, int layer, int n, struct gw_op_desc *d) {
  const struct gw_layer *l = &m->layers[layer];
  const struct gw_act *x = &m->acts[l->in], *y = &m->acts[l->out];
  memset(d, 0, sizeof *d);
  d->kind = (int)l->kind;
  d->n = n;
  d->c = x->c, d->h = x->h, d->w = x->w;
  d->k = y->c, d->p = y->h, d->q = y->w;
  d->kernel = l->kernel, d->stride = l->stride, d->pad = l->pad;
  if (l->kind == GW_LAYER_BN) d->eps = 1e-5, d->momentum = 0.1;
}
