/* weights.c - a model's parameters and batch-norm buffers to and from a
 * safetensors file under torchvision's names (gw_model_save_weights /
 * gw_model_load_weights of resnet.h), so weights move between gradwire and
 * torchvision's resnet (safetensors.torch.load_file + load_state_dict) as they are.
 *
 * It is not a checkpoint: no gradients, optimizer state or step counter.  Loading is
 * all or nothing: every name, dtype and shape is checked before the first value is
 * copied, so a refused file leaves the model exactly as it was.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h" /* gw__fnv */
#include "model_internal.h"
#include "safetensors.h"

/* Both tables as one sequence, parameters first (the order the file is written in
 * and mismatches are reported in). */
static int num_tensors(const struct gw_model *m) { return m->nparams_t + m->nbuffers_t; }

static const struct gw_tensor *tensor_at(const struct gw_model *m, int i) {
  return i < m->nparams_t ? &m->params_t[i] : &m->buffers_t[i - m->nparams_t];
}

/* The config, for the file's metadata: enough to rebuild a matching model. */
static void describe(const struct gw_model_config *c, char *buf, size_t cap) {
  snprintf(buf, cap, "resnet%d classes=%d in_channels=%d image_size=%d stem=%s width_divisor=%d", c->depth,
           c->classes, c->in_channels, c->image_size, c->stem == GW_STEM_SMALL ? "small" : "imagenet",
           c->width_divisor);
}

/* The "gradwire_checksum" metadata entry gw-train's files carry (PyTorch
 * ignores it): FNV-1a 64 over each tensor of the model's table, its name and
 * then its bytes (data[i]; NULL: absent, a counter older files lack), and the
 * "gradwire_model" entry, the tensors in their names' order.  A flipped bit loaded silently before (a negative
 * running variance, a weight of 1e37: an evaluation of NaN or nonsense that
 * exited 0).  Files without the entry (torchvision's, or from before it)
 * load unchecked, as they did. */
static int weights_sum(const struct gw_model *m, const void *const *data, const char *desc, uint64_t *sum) {
  uint64_t h = GW_FNV_START;
  /* in name order: a model whose table another build orders otherwise sums
   * the same (the file's order is the writer's) */
  const int n = num_tensors(m);
  int *order = malloc((size_t)n * sizeof *order);
  if (!order) return -1;
  for (int i = 0; i < n; i++) { /* insertion sort: a few hundred names */
    int j = i;
    for (; j > 0 && strcmp(tensor_at(m, order[j - 1])->name, tensor_at(m, i)->name) > 0; j--) order[j] = order[j - 1];
    order[j] = i;
  }
  for (int k = 0; k < n; k++) {
    const int i = order[k];
    const struct gw_tensor *t = tensor_at(m, i);
    const unsigned char present = data[i] != NULL;
    h = gw__fnv(h, t->name, strlen(t->name) + 1);
    h = gw__fnv(h, &present, 1);
    if (present) h = gw__fnv(h, data[i], t->numel * gw_st_dtype_size(t->dtype));
  }
  free(order);
  *sum = desc ? gw__fnv(h, desc, strlen(desc) + 1) : h;
  return 0;
}

gw_result_t gw_model_save_weights(struct gw_model *m, const char *path) {
  if (!m || !path) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "gw_model_save_weights: NULL model or path");
  int n = num_tensors(m);
  struct gw_st_tensor *ts = calloc((size_t)n, sizeof *ts);
  if (!ts) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  for (int i = 0; i < n; i++) {
    const struct gw_tensor *t = tensor_at(m, i);
    ts[i].name = t->name;
    ts[i].dtype = t->dtype;
    ts[i].ndim = t->ndim;
    memcpy(ts[i].shape, t->shape, sizeof t->shape);
    ts[i].nbytes = t->numel * gw_st_dtype_size(t->dtype);
    ts[i].data = gw_model_tensor_data(m, t);
  }
  char desc[160], sum[20];
  describe(&m->cfg, desc, sizeof desc);
  const void **data = malloc((size_t)n * sizeof *data);
  if (!data) {
    free(ts);
    return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  }
  for (int i = 0; i < n; i++) data[i] = ts[i].data;
  uint64_t h;
  const int summed = weights_sum(m, data, desc, &h);
  free(data);
  if (summed != 0) {
    free(ts);
    return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  }
  snprintf(sum, sizeof sum, "%016" PRIx64, h);
  /* "format": "pt" is what safetensors.torch writes; transformers checks it. */
  const char *const meta[] = {"format", "pt", "gradwire_model", desc, "gradwire_checksum", sum, NULL};
  gw_result_t r = gw_st_write(path, ts, n, meta);
  free(ts);
  return r;
}

static int same_shape(const struct gw_tensor *t, const struct gw_st_tensor *s) {
  if (t->ndim != s->ndim) return 0;
  for (int d = 0; d < t->ndim; d++)
    if (t->shape[d] != s->shape[d]) return 0;
  return 1;
}

/* The file's tensor for the model's t, or a failure saying what differs. */
static gw_result_t match_one(const struct gw_tensor *t, const struct gw_st_file *f, const char *path,
                             const struct gw_st_tensor **out) {
  const struct gw_st_tensor *s = gw_st_find(f, t->name);
  if (!s)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: missing: %s (the model has it; saved from another config?)",
                          path, t->name);
  if (s->dtype != t->dtype)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: dtype %s in model, %s in %s", t->name,
                          gw_st_dtype_name(t->dtype), s->dtype_name, path);
  if (!same_shape(t, s)) {
    char want[GW_ST_SHAPE_TEXT], got[GW_ST_SHAPE_TEXT];
    gw_st_format_shape(want, sizeof want, t->shape, t->ndim);
    gw_st_format_shape(got, sizeof got, s->shape, s->ndim);
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: shape %s in model, %s in %s", t->name, want, got, path);
  }
  *out = s;
  return GW_SUCCESS;
}

/* src[i] := the file's tensor for model tensor i; then no file tensor may be left
 * over.  The first mismatch in table order is the one reported. */
static gw_result_t match_all(const struct gw_model *m, const struct gw_st_file *f, const char *path,
                             const struct gw_st_tensor **src) {
  char *used = calloc(f->ntensors ? (size_t)f->ntensors : 1, 1);
  if (!used) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  gw_result_t r = GW_SUCCESS;
  for (int i = 0; i < num_tensors(m) && r == GW_SUCCESS; i++) {
    /* A batch norm's num_batches_tracked may be absent (torchvision's older
     * checkpoints saved without it): 0, as PyTorch's load_state_dict fills
     * it for a new model. */
    const struct gw_tensor *t = tensor_at(m, i);
    if (t->kind == GW_TENSOR_COUNTER && !gw_st_find(f, t->name)) {
      src[i] = NULL;
      continue;
    }
    r = match_one(t, f, path, &src[i]);
    if (r == GW_SUCCESS) used[src[i] - f->tensors] = 1;
  }
  for (int j = 0; j < f->ntensors && r == GW_SUCCESS; j++)
    if (!used[j])
      r = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: unexpected: %s (the model has no tensor of that name)", path,
                         f->tensors[j].name);
  free(used);
  return r;
}

/* The header's check (gw_st_open_checked): the names, dtypes and shapes
 * before the data is read, so another model's file, however big, is refused
 * having read its header only. */
static gw_result_t match_header(const struct gw_st_file *h, const char *path, void *arg) {
  const struct gw_model *m = arg;
  const struct gw_st_tensor **src = calloc((size_t)num_tensors(m) + 1, sizeof *src);
  if (!src) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  gw_result_t r = match_all(m, h, path, src);
  free(src);
  /* A file of gradwire's names the model it holds: which setting differs
   * (it said the first tensor whose shape did, alone) */
  const char *theirs = gw_st_metadata(h, "gradwire_model");
  char mine[160];
  describe(&m->cfg, mine, sizeof mine);
  if (r != GW_SUCCESS && r != GW_ERR_SYSTEM && theirs && strcmp(theirs, mine) != 0) {
    char first[GW_MODEL_ERRMSG_MAX];
    snprintf(first, sizeof first, "%s", gw_model_last_error());
    return gw__model_fail(r, "%.600s (the file holds %.160s; this model is %s)", first, theirs, mine);
  }
  return r;
}

/* The file's own checksum, where it has one (weights_sum). */
static gw_result_t check_sum(const struct gw_model *m, const struct gw_st_file *f, const char *path,
                             const struct gw_st_tensor *const *src) {
  const char *want = gw_st_metadata(f, "gradwire_checksum");
  if (!want) return GW_SUCCESS;
  const int n = num_tensors(m);
  const void **data = malloc((size_t)n * sizeof *data);
  if (!data) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  for (int i = 0; i < n; i++) data[i] = src[i] ? src[i]->data : NULL;
  char have[20];
  uint64_t h;
  const int summed = weights_sum(m, data, gw_st_metadata(f, "gradwire_model"), &h);
  free(data);
  if (summed != 0) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  snprintf(have, sizeof have, "%016" PRIx64, h);
  if (!strcmp(have, want)) return GW_SUCCESS;
  return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: its gradwire_checksum %.40s does not match its contents (%s): "
                        "the file is damaged, or another program changed its tensors and kept gradwire's metadata "
                        "(without that entry it loads unchecked)", path, want, have);
}

gw_result_t gw_model_load_weights(struct gw_model *m, const char *path) {
  if (!m || !path) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "gw_model_load_weights: NULL model or path");
  struct gw_st_file *f;
  GW_MODEL_TRY(gw_st_open_checked(&f, path, match_header, m));
  int n = num_tensors(m);
  const struct gw_st_tensor **src = calloc((size_t)n, sizeof *src);
  gw_result_t r = src ? match_all(m, f, path, src) : gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  if (r == GW_SUCCESS) r = check_sum(m, f, path, src);
  for (int i = 0; i < n && r == GW_SUCCESS; i++) {
    const struct gw_tensor *t = tensor_at(m, i);
    if (src[i]) memcpy(gw_model_tensor_data(m, t), src[i]->data, src[i]->nbytes);
    else memset(gw_model_tensor_data(m, t), 0, t->numel * gw_st_dtype_size(t->dtype));
  }
  free(src);
  gw_st_free(f);
  return r;
}
