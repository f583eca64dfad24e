/* transform.c - the geometry of torchvision's RandomResizedCrop / Resize /
 * CenterCrop and a separable resampler with PIL's bilinear filter (a triangle whose
 * support widens by the shrink factor, so downscaling averages instead of
 * aliasing), which writes normalized fp32 CHW.  See transform.h. */
#include "transform.h"

#include <math.h>
#include <stdlib.h>

#include "data_internal.h"

#define RRC_ATTEMPTS 10
#define RRC_SCALE_MIN 0.08
#define RRC_SCALE_MAX 1.0
#define RRC_RATIO_MIN (3.0 / 4.0)
#define RRC_RATIO_MAX (4.0 / 3.0)

/* Python's round(): halves go to the even neighbour, as rint() does by default. */
static int py_round(double x) { return (int)rint(x); }

/* torchvision's fallback when no attempt fits: the whole image clamped to the
 * ratio range, centred. */
static void rrc_fallback(struct gw__view *v, int width, int height) {
  double in_ratio = (double)width / height;
  v->w = width;
  v->h = height;
  if (in_ratio < RRC_RATIO_MIN) v->h = py_round(width / RRC_RATIO_MIN);
  else if (in_ratio > RRC_RATIO_MAX) v->w = py_round(height * RRC_RATIO_MAX);
  v->y = (height - v->h) / 2;
  v->x = (width - v->w) / 2;
}

void gw__view_train(struct gw__view *v, int width, int height, int size, uint64_t key) {
  struct gw_rng r;
  gw__rng_from_key(&r, key);
  double area = (double)width * height;
  double log_lo = log(RRC_RATIO_MIN), log_hi = log(RRC_RATIO_MAX);
  int found = 0;
  for (int attempt = 0; attempt < RRC_ATTEMPTS && !found; attempt++) {
    double target = area * (RRC_SCALE_MIN + (RRC_SCALE_MAX - RRC_SCALE_MIN) * gw__rng_uniform(&r));
    double aspect = exp(log_lo + (log_hi - log_lo) * gw__rng_uniform(&r));
    int w = py_round(sqrt(target * aspect)), h = py_round(sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      v->y = (int)gw__rng_below(&r, (uint64_t)(height - h + 1));
      v->x = (int)gw__rng_below(&r, (uint64_t)(width - w + 1));
      v->w = w;
      v->h = h;
      found = 1;
    }
  }
  if (!found) rrc_fallback(v, width, height);
  v->rw = v->rh = size;
  v->ox = v->oy = 0;
  v->flip = gw__rng_uniform(&r) < 0.5;
}

void gw__view_val(struct gw__view *v, int width, int height, int size, int resize) {
  /* torchvision's reference pairs Resize(256) with CenterCrop(224); other output
   * sizes keep that 0.875 crop fraction unless given (--val-resize-size). */
  if (resize <= 0) resize = size * 256 / 224;
  int shorter = width <= height ? width : height, longer = width <= height ? height : width;
  int scaled_long = (int)((double)resize * longer / shorter); /* Python's int(size * long / short) */
  v->x = v->y = 0;
  v->w = width;
  v->h = height;
  v->rw = width <= height ? resize : scaled_long;
  v->rh = width <= height ? scaled_long : resize;
  v->ox = py_round((v->rw - size) / 2.0);
  v->oy = py_round((v->rh - size) / 2.0);
  v->flip = 0;
}

/* Filter taps of one axis: output sample i reads count[i] inputs from first[i]
 * with weights w[i * ksize ...], fixed point with PREC fraction bits. */
struct taps {
  int ksize;
  int *first, *count;
  int32_t *w;
};

/* Pillow's resampler (libImaging/Resample.c) to the bit: its coefficients
 * are rounded to fixed point with 22 fraction bits (32 - 8 - 2), each pass
 * sums integers from half a unit up and clips to a byte, and the horizontal
 * pass's bytes are what the vertical pass reads.  It kept floats between the
 * passes and at the end, so a pixel could differ from PIL's by one in 255
 * (an evaluation's loss by about 0.4% on a small set: a helper's probe). */
#define PREC 22

static void taps_free(struct taps *t) {
  free(t->first);
  free(t->count);
  free(t->w);
}

/* PIL's precompute_coeffs and normalize_coeffs_8bpc for the bilinear filter:
 * outputs out0 .. out0 + n - 1 of resizing the input range [in0, in0 + len)
 * to full_out samples.  Taps never reach outside that range (crop, then
 * resize).  In double as PIL's, the filter's argument multiplied by the
 * reciprocal of the scale as PIL's is (a division differs in the last bit). */
static int taps_init(struct taps *t, int in0, int len, int full_out, int out0, int n) {
  double scale = (double)len / full_out;
  double fscale = scale > 1.0 ? scale : 1.0;
  double support = fscale; /* the triangle's support of 1, widened when shrinking */
  double ss = 1.0 / fscale;
  t->ksize = (int)ceil(support) * 2 + 1;
  t->first = malloc(sizeof(int) * (size_t)n);
  t->count = malloc(sizeof(int) * (size_t)n);
  t->w = malloc(sizeof(int32_t) * (size_t)n * (size_t)t->ksize);
  double *k = malloc(sizeof(double) * (size_t)t->ksize);
  if (!t->first || !t->count || !t->w || !k) {
    free(k);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    double center = (out0 + i + 0.5) * scale;
    int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
    if (lo < 0) lo = 0;
    if (hi > len) hi = len;
    int cnt = hi - lo < t->ksize ? hi - lo : t->ksize;
    double sum = 0;
    for (int j = 0; j < cnt; j++) {
      double d = fabs((j + lo - center + 0.5) * ss);
      k[j] = d < 1.0 ? 1.0 - d : 0.0;
      sum += k[j];
    }
    int32_t *w = t->w + (size_t)i * t->ksize;
    for (int j = 0; j < cnt; j++) {
      double v = sum != 0.0 ? k[j] / sum : k[j];
      w[j] = (int32_t)(v < 0 ? -0.5 + v * (1 << PREC) : 0.5 + v * (1 << PREC));
    }
    t->first[i] = in0 + lo;
    t->count[i] = cnt;
  }
  free(k);
  return 0;
}

/* PIL's clip8: the sum's integer part, clamped to a byte. */
static inline uint8_t clip8(int64_t acc) {
  acc >>= PREC;
  return (uint8_t)(acc < 0 ? 0 : acc > 255 ? 255 : acc);
}

/* Horizontal pass: rows [y0, y1) of src through tx into tmp [y1 - y0, n, ch]. */
static void pass_x(const uint8_t *src, int width, int ch, int y0, int y1, const struct taps *tx, int n, uint8_t *tmp) {
  for (int y = y0; y < y1; y++) {
    const uint8_t *row = src + (size_t)y * width * ch;
    uint8_t *dst = tmp + (size_t)(y - y0) * n * ch;
    for (int i = 0; i < n; i++) {
      const int32_t *w = tx->w + (size_t)i * tx->ksize;
      const uint8_t *p = row + (size_t)tx->first[i] * ch;
      for (int c = 0; c < ch; c++) {
        int64_t acc = 1 << (PREC - 1);
        for (int k = 0; k < tx->count[i]; k++) acc += (int64_t)w[k] * p[k * ch + c];
        dst[i * ch + c] = clip8(acc);
      }
    }
  }
}

/* Vertical pass over tmp (rows from y0) into normalized, optionally mirrored
 * CHW: each byte through lut[c] (torchvision's ToTensor and Normalize in
 * float32: (v / 255 - mean) / std, as torch computes it). */
static void pass_y(const uint8_t *tmp, int y0, int ch, const struct taps *ty, int out_w, int out_h, int flip,
                   const float (*lut)[256], float *out) {
  for (int c = 0; c < ch; c++) {
    for (int j = 0; j < out_h; j++) {
      const int32_t *w = ty->w + (size_t)j * ty->ksize;
      const uint8_t *col = tmp + (size_t)(ty->first[j] - y0) * out_w * ch + c;
      float *dst = out + ((size_t)c * out_h + j) * out_w;
      for (int i = 0; i < out_w; i++) {
        int64_t acc = 1 << (PREC - 1);
        for (int k = 0; k < ty->count[j]; k++) acc += (int64_t)w[k] * col[((size_t)k * out_w + i) * ch];
        dst[flip ? out_w - 1 - i : i] = lut[c][clip8(acc)];
      }
    }
  }
}

gw_result_t gw__resample(const uint8_t *src, int width, int height, int channels, const struct gw__view *v,
                         int out_w, int out_h, const float *mean, const float *std, float *out) {
  (void)height; /* the view lies inside the image by construction */
  struct taps tx = {0}, ty = {0};
  uint8_t *tmp = NULL;
  gw_result_t res = GW_SUCCESS;
  if (taps_init(&tx, v->x, v->w, v->rw, v->ox, out_w) || taps_init(&ty, v->y, v->h, v->rh, v->oy, out_h)) {
    res = gw__model_fail(GW_ERR_SYSTEM, "image transform: out of memory");
    goto done;
  }
  /* Only the source rows some output row reads go through the horizontal pass. */
  int y0 = ty.first[0], y1 = ty.first[out_h - 1] + ty.count[out_h - 1];
  tmp = malloc((size_t)(y1 - y0) * out_w * channels);
  if (!tmp) {
    res = gw__model_fail(GW_ERR_SYSTEM, "image transform: out of memory");
    goto done;
  }
  float lut[3][256];
  for (int c = 0; c < channels; c++)
    for (int b = 0; b < 256; b++) {
      const float unit = (float)b / 255.0f; /* rounded to float, as torch's div(255), then sub_ and div_ */
      lut[c][b] = (unit - mean[c]) / std[c];
    }
  pass_x(src, width, channels, y0, y1, &tx, out_w, tmp);
  pass_y(tmp, y0, channels, &ty, out_w, out_h, v->flip, (const float (*)[256])lut, out);
done:
  free(tmp);
  taps_free(&ty);
  taps_free(&tx);
  return res;
}
