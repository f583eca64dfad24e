/* transform.h - torchvision's image transforms on decoded 8-bit images, for
 * imagefolder.c: the geometry of RandomResizedCrop + RandomHorizontalFlip
 * (training) and Resize + CenterCrop (validation), and one resampling pass that
 * applies that geometry with PIL's antialiased bilinear filter, flips and
 * normalizes straight into fp32 CHW.
 *
 * Not bit-identical to PIL (which rounds to 8 bits between its two passes; here the
 * intermediate stays fp32), and the random draws come from our RNG, not torch's:
 * the same distributions, other values. */
#ifndef GW_DATA_TRANSFORM_H
#define GW_DATA_TRANSFORM_H

#include <stdint.h>

#include "dataset.h"

/* Source box (x, y, w, h) is resized to rw x rh; the output is the out_w x out_h
 * window of that at (ox, oy), mirrored left-right when flip is set. */
struct gw__view {
  int x, y, w, h;
  int rw, rh;
  int ox, oy;
  int flip;
};

/* RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) + a flip with
 * probability 1/2, drawn from key, for an image of width x height. */
void gw__view_train(struct gw__view *v, int width, int height, int size, uint64_t key);

/* Resize(shorter side = resize) + CenterCrop(size); resize 0: size * 256 / 224
 * (torchvision's reference: 256 for 224). */
void gw__view_val(struct gw__view *v, int width, int height, int size, int resize);

/* Resamples src (interleaved, channels 1 or 3, width x height, rows of
 * width * channels bytes) through v into out [channels, out_h, out_w] as
 * (value / 255 - mean[c]) / std[c]: PIL's crop, resize (bilinear), crop and
 * flip, then torchvision's ToTensor and Normalize, bit for bit (tested
 * against them: test/fixtures/make_resample_fixtures.py).  GW_ERR_SYSTEM
 * when out of memory. */
gw_result_t gw__resample(const uint8_t *src, int width, int height, int channels, const struct gw__view *v,
                         int out_w, int out_h, const float *mean, const float *std, float *out);

#endif
