/* backend_check.c - the checks of a struct gw_op_desc that every backend makes in
 * op_create (backend.h: the shapes per layer kind), with one wording whichever
 * backend refuses. */
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "model_internal.h"

/* In 64 bits: a pad near INT_MAX overflowed int (undefined; in practice a
 * misleading message or a wrong expected size). */
static int64_t conv_out(int in, int kernel, int stride, int pad) {
  return ((int64_t)in + 2 * (int64_t)pad - kernel) / stride + 1;
}

static gw_result_t check_conv(const char *be, const struct gw_op_desc *d, const char *what) {
  if (d->n < 1 || d->c < 1 || d->h < 1 || d->w < 1 || d->k < 1 || d->kernel < 1 || d->stride < 1 || d->pad < 0)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: every size must be positive", be, what);
  if ((int64_t)d->h + 2 * (int64_t)d->pad < d->kernel || (int64_t)d->w + 2 * (int64_t)d->pad < d->kernel)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: the %dx%d kernel is larger than the padded input",
                          be, what, d->kernel, d->kernel);
  const int64_t p = conv_out(d->h, d->kernel, d->stride, d->pad), q = conv_out(d->w, d->kernel, d->stride, d->pad);
  if (d->p != p || d->q != q)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: output %dx%d given, the geometry makes %lldx%lld",
                          be, what, d->p, d->q, (long long)p, (long long)q);
  return GW_SUCCESS;
}

/* Layers whose x is [n, c, h, w]. */
static gw_result_t check_same(const char *be, const struct gw_op_desc *d, const char *what) {
  if (d->n < 1 || d->c < 1 || d->h < 1 || d->w < 1)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: every size must be positive", be, what);
  return GW_SUCCESS;
}

gw_result_t gw__backend_check_desc(const char *be, const struct gw_op_desc *d, char *what, size_t what_len) {
  gw_result_t res;
  snprintf(what, what_len, "op kind %d, batch %d, %dx%dx%d -> %dx%dx%d, kernel %d stride %d pad %d", d->kind, d->n,
           d->c, d->h, d->w, d->k, d->p, d->q, d->kernel, d->stride, d->pad);
  switch (d->kind) {
  case GW_LAYER_CONV: return check_conv(be, d, what);
  case GW_LAYER_MAXPOOL:
    res = check_conv(be, d, what);
    if (res == GW_SUCCESS && d->k != d->c)
      res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: pooling keeps the channels (k = c)", be, what);
    /* PyTorch's rule ("pad should be at most half of effective kernel size"):
     * more leaves windows with no input, whose gradient goes nowhere */
    if (res == GW_SUCCESS && 2 * d->pad > d->kernel)
      res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: max pooling's padding %d is more than half its "
                           "%dx%d window", be, what, d->pad, d->kernel, d->kernel);
    return res;
  case GW_LAYER_BN:
    res = check_same(be, d, what);
    if (res == GW_SUCCESS && !(d->eps > 0 && d->momentum >= 0 && d->momentum <= 1))
      res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: eps %g must be > 0 and momentum %g in [0, 1]", be,
                           what, (double)d->eps, (double)d->momentum);
    return res;
  case GW_LAYER_RELU:
  case GW_LAYER_ADD: return check_same(be, d, what);
  case GW_LAYER_AVGPOOL:
    res = check_same(be, d, what);
    if (res == GW_SUCCESS && (d->k != d->c || d->p != 1 || d->q != 1))
      res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: global pooling makes [n, c, 1, 1]", be, what);
    return res;
  case GW_LAYER_FC:
    res = check_same(be, d, what);
    if (res == GW_SUCCESS && d->k < 1)
      res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: every size must be positive", be, what);
    return res;
  case GW_OP_LOSS:
    if (d->n < 1 || d->k < 1)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: every size must be positive", be, what);
    if (!(d->label_smoothing >= 0 && d->label_smoothing <= 1))
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s: label smoothing %g must be in [0, 1]", be, what,
                            (double)d->label_smoothing);
    return GW_SUCCESS;
  default: return gw__model_fail(GW_ERR_UNSUPPORTED, "%s backend: %s: unknown op kind", be, what);
  }
}

gw_result_t gw__backend_expect_kind(const char *be, int kind, int want, const char *what) {
  if (kind != want)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: %s called on an op of kind %d", be, what, kind);
  return GW_SUCCESS;
}

gw_result_t gw__backend_layout(const char *be, const struct gw_backend_config *cfg, int *nhwc) {
  const int layout = cfg ? cfg->layout : GW_LAYOUT_NCHW;
  if (layout != GW_LAYOUT_NCHW && layout != GW_LAYOUT_NHWC)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s backend: layout %d: GW_LAYOUT_NCHW (0) or GW_LAYOUT_NHWC (1)",
                          be, layout);
  *nhwc = layout == GW_LAYOUT_NHWC;
  return GW_SUCCESS;
}

int gw_backend_default_layout(const char *backend, int act, int image_size) {
  if (backend && !strcmp(backend, "cudnn")) return act != GW_FLOAT32 ? GW_LAYOUT_NHWC : GW_LAYOUT_NCHW;
  return image_size > 0 && image_size < 56 ? GW_LAYOUT_NHWC : GW_LAYOUT_NCHW;
}
