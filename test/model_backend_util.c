/* model_backend_util.c - what the files of the model-backend test share: the
 * backend under test, its configuration, host tensors crossing to it by upload /
 * download, fills, descriptions and the comparison with a reference
 * (model_backend_util.h). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model_backend_util.h"

/* The backend under test and its name (argv[1]): set by main() before the suite
 * runs (Check's forked test processes inherit them). */
const struct gw_backend_ops *be;
const char *chosen;
int layout = GW_LAYOUT_NCHW;

/* The configuration of every backend the checks make, strict: one thread (cpu),
 * and every other field 0 (cudnn: tf32 0, full fp32). */
struct gw_backend_config strict_config(void) {
  struct gw_backend_config cfg = {.threads = 1, .layout = layout};
  return cfg;
}

struct gw_backend *backend(void) {
  struct gw_backend_config cfg = strict_config();
  struct gw_backend *b = NULL;
  gw_result_t r = be->create(&cfg, &b);
  ck_assert_msg(r == GW_SUCCESS, "%s", gw_model_last_error());
  return b;
}

void nan_fill(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = NAN;
}

/* Host <-> backend copies of raw bytes, failing the test on an error. */
void to_backend(struct gw_backend *b, void *dst, const void *host_src, size_t bytes) {
  gw_result_t r = be->upload(b, dst, host_src, bytes);
  ck_assert_msg(r == GW_SUCCESS, "upload of %zu bytes: %s", bytes, gw_model_last_error());
}

void from_backend(struct gw_backend *b, void *host_dst, const void *src, size_t bytes) {
  gw_result_t r = be->download(b, host_dst, src, bytes);
  ck_assert_msg(r == GW_SUCCESS, "download of %zu bytes: %s", bytes, gw_model_last_error());
}


struct tensor tensor_new(struct gw_backend *b, size_t n) {
  struct tensor t = {b, malloc(n * sizeof(float)), be->alloc(b, n * sizeof(float)), n, {0, 0, 0, 0}};
  ck_assert_msg(t.h && t.d, "allocating a tensor of %zu floats", n);
  nan_fill(t.h, n);
  return t;
}

struct tensor tensor_act(struct gw_backend *b, int n, int c, int h, int w) {
  struct tensor t = tensor_new(b, (size_t)n * c * h * w);
  t.shape[0] = n, t.shape[1] = c, t.shape[2] = h, t.shape[3] = w;
  return t;
}
struct tensor act_in(struct gw_backend *b, const struct gw_op_desc *d) { return tensor_act(b, d->n, d->c, d->h, d->w); }
struct tensor act_out(struct gw_backend *b, const struct gw_op_desc *d) {
  return tensor_act(b, d->n, d->k, d->p, d->q);
}

void transpose_act(float *dst, const float *src, int n, int c, int h, int w, int to_nhwc) {
  const size_t hw = (size_t)h * w;
  for (int s = 0; s < n; s++)
    for (int ch = 0; ch < c; ch++)
      for (size_t i = 0; i < hw; i++) {
        const size_t nchw = ((size_t)s * c + ch) * hw + i, nhwc = ((size_t)s * hw + i) * c + ch;
        if (to_nhwc) dst[nhwc] = src[nchw];
        else dst[nchw] = src[nhwc];
      }
}

/* The tensor's host copy in the backend's layout (a new buffer), or NULL when
 * it is the same as the host's. */
static float *in_backend_layout(struct tensor t) {
  if (layout != GW_LAYOUT_NHWC || t.shape[0] == 0) return NULL;
  float *tmp = malloc(t.n * sizeof(float));
  ck_assert(tmp);
  return tmp;
}

void up(struct tensor t) {
  float *tmp = in_backend_layout(t);
  if (tmp) transpose_act(tmp, t.h, t.shape[0], t.shape[1], t.shape[2], t.shape[3], 1);
  to_backend(t.b, t.d, tmp ? tmp : t.h, t.n * sizeof(float));
  free(tmp);
}
void down(struct tensor t) {
  float *tmp = in_backend_layout(t);
  from_backend(t.b, tmp ? tmp : t.h, t.d, t.n * sizeof(float));
  if (tmp) transpose_act(t.h, tmp, t.shape[0], t.shape[1], t.shape[2], t.shape[3], 0);
  free(tmp);
}

void nan_up(struct tensor t) {
  nan_fill(t.h, t.n);
  up(t);
}

/* A tensor holding a copy of host values, uploaded. */
struct tensor tensor_of(struct gw_backend *b, const float *values, size_t n) {
  struct tensor t = tensor_new(b, n);
  memcpy(t.h, values, n * sizeof(float));
  up(t);
  return t;
}

void tensor_free(struct tensor t) {
  free(t.h);
  be->dealloc(t.b, t.d);
}

void tensors_free(struct tensor *t, size_t n) {
  for (size_t i = 0; i < n; i++) tensor_free(t[i]);
}

void fill(float *x, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) x[i] = (float)((double)(mix64(seed * 7919 + i) >> 11) * 0x1p-52 - 1.0);
}

struct gw_op_desc conv_desc(int n, int c, int h, int w, int k, int kernel, int stride, int pad) {
  struct gw_op_desc d = {.kind = GW_LAYER_CONV, .n = n, .c = c, .h = h, .w = w, .k = k,
                         .kernel = kernel, .stride = stride, .pad = pad};
  d.p = (h + 2 * pad - kernel) / stride + 1;
  d.q = (w + 2 * pad - kernel) / stride + 1;
  return d;
}

/* Compares out [n] with a double reference: |out - ref| <= rel * mag + abs_tol for
 * each element (mag: the magnitude of the terms summed into it).  NaN fails. */
void compare(const float *out, const double *ref, const double *mag, size_t n, double rel, double abs_tol,
                    const char *label) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    double err = fabs((double)out[i] - ref[i]), tol = rel * (mag ? mag[i] : fabs(ref[i])) + abs_tol;
    if (!(err <= tol)) {
      if (!bad) first = i;
      bad++;
    }
  }
  ck_assert_msg(bad == 0, "%s: %zu of %zu off, first [%zu] = %.9g, want %.9g (terms %.3g)", label, bad, n, first,
                (double)out[first], ref[first], mag ? mag[first] : fabs(ref[first]));
}

struct gw_op_desc same_desc(int kind, int n, int c, int h, int w) {
  struct gw_op_desc d = {.kind = kind, .n = n, .c = c, .h = h, .w = w, .k = c, .p = h, .q = w};
  return d;
}
