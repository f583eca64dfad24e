/* test_data_transform.c - the training transform's geometry and the
 * resampler's values, without JPEG files:
 * - gw__view_train (RandomResizedCrop + flip) over many keys and image
 *   shapes: the box lies inside the image, its area is 8% to 100% of the
 *   image's and its aspect ratio 3/4 to 4/3 (up to the rounding of its sides),
 *   both ends of each range are reached, the box's place is spread over the
 *   image, and about half the views are flipped;
 * - gw__resample through fixed views of a gradient image (red grows with x,
 *   green with y): pixel values at known places after a crop, an offset, a
 *   flip and a 2x reduction, so swapped axes or a vertical flip fail. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_data.h"
#include "transform.h"

/* ---- the evaluation view: torchvision's Resize(R) + CenterCrop(S) ------------------ */
/* The longer side int(R * long / short), the crop's corner round((side - S) / 2)
 * as Python rounds (half to even): hand-derived from torchvision's code. */
START_TEST(view_val_sizes) {
  static const struct {
    int w, h, size, resize, rw, rh, ox, oy;
  } cases[] = {
      {500, 375, 299, 342, 456, 342, 78, 22}, /* Inception's 342/299: 78.5 -> 78, 21.5 -> 22 */
      {375, 500, 299, 342, 342, 456, 22, 78}, /* portrait */
      {500, 375, 224, 0, 341, 256, 58, 16},   /* the default: 224 * 256 / 224 */
      {500, 375, 224, 256, 341, 256, 58, 16}, /* the same, given */
      {640, 480, 160, 232, 309, 232, 74, 36}, /* 309.33 -> 309; 74.5 -> 74 */
      {300, 300, 224, 224, 224, 224, 0, 0},   /* resize = crop: the whole image */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct gw__view v;
    gw__view_val(&v, cases[i].w, cases[i].h, cases[i].size, cases[i].resize);
    ck_assert_msg(v.x == 0 && v.y == 0 && v.w == cases[i].w && v.h == cases[i].h && !v.flip, "case %zu: box", i);
    ck_assert_msg(v.rw == cases[i].rw && v.rh == cases[i].rh && v.ox == cases[i].ox && v.oy == cases[i].oy,
                  "case %zu: resized %dx%d crop at (%d, %d), expected %dx%d at (%d, %d)", i, v.rw, v.rh, v.ox, v.oy,
                  cases[i].rw, cases[i].rh, cases[i].ox, cases[i].oy);
  }
}
END_TEST

/* ---- the training view's statistics ---------------------------------------------- */

struct shape {
  int w, h;
};

START_TEST(view_train_ranges) {
  const struct shape shapes[] = {{500, 375}, {375, 500}, {500, 500}, {64, 48}, {32, 32}, {1000, 200}, {200, 1000}};
  const int keys = 20000;
  long flips = 0, views = 0;
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    const int W = shapes[k].w, H = shapes[k].h;
    const double A = (double)W * H;
    double min_area = 2, max_area = 0, min_ratio = 9, max_ratio = 0, centre_x = 0, centre_y = 0;
    int at_left = 0, at_right = 0, at_top = 0, at_bottom = 0, wide = 0;
    double at_x = 0, at_y = 0; /* expected boxes at each edge: the place is uniform */
    for (int key = 1; key <= keys; key++) {
      struct gw__view v;
      gw__view_train(&v, W, H, 224, (uint64_t)key * 0x9e3779b97f4a7c15ull);
      ck_assert(v.rw == 224 && v.rh == 224 && v.ox == 0 && v.oy == 0);
      ck_assert_msg(v.w > 0 && v.h > 0 && v.x >= 0 && v.y >= 0 && v.x + v.w <= W && v.y + v.h <= H,
                    "%dx%d, key %d: box (%d, %d) %dx%d outside the image", W, H, key, v.x, v.y, v.w, v.h);
      /* Sides are rounded from exact ones of the right area and ratio. */
      ck_assert_msg((v.w + 0.5) * (v.h + 0.5) >= 0.08 * A && (v.w - 0.5) * (v.h - 0.5) <= A,
                    "%dx%d, key %d: a %dx%d box is outside 8%%-100%% of the area", W, H, key, v.w, v.h);
      ck_assert_msg((v.w + 0.5) / (v.h - 0.5) >= 3.0 / 4 && (v.w - 0.5) / (v.h + 0.5) <= 4.0 / 3,
                    "%dx%d, key %d: a %dx%d box is outside the ratios 3/4-4/3", W, H, key, v.w, v.h);
      const double area = v.w * v.h / A, ratio = (double)v.w / v.h;
      min_area = fmin(min_area, area), max_area = fmax(max_area, area);
      min_ratio = fmin(min_ratio, ratio), max_ratio = fmax(max_ratio, ratio);
      centre_x += (v.x + v.w / 2.0) / W, centre_y += (v.y + v.h / 2.0) / H;
      at_left += v.x == 0, at_right += v.x + v.w == W, at_top += v.y == 0, at_bottom += v.y + v.h == H;
      at_x += 1.0 / (W - v.w + 1), at_y += 1.0 / (H - v.h + 1);
      wide += v.w > v.h;
      flips += v.flip != 0;
      views++;
    }
    if (W >= 200 && H >= 200 && W == H) { /* room for every draw: the whole ranges, both ways alike */
      ck_assert_msg(min_area < 0.09 && max_area > 0.95, "%dx%d: areas %.3f-%.3f", W, H, min_area, max_area);
      ck_assert_msg(min_ratio < 0.76 && max_ratio > 1.31, "%dx%d: ratios %.3f-%.3f", W, H, min_ratio, max_ratio);
      ck_assert_msg(fabs((double)wide / keys - 0.5) < 0.03, "%dx%d: %d of %d wider than high", W, H, wide, keys);
    }
    if (W <= 2 * H && H <= 2 * W) { /* not clamped to the fallback: the box moves over the whole image */
      ck_assert_msg(fabs(centre_x / keys - 0.5) < 0.02 && fabs(centre_y / keys - 0.5) < 0.02,
                    "%dx%d: mean centre (%.3f, %.3f)", W, H, centre_x / keys, centre_y / keys);
      const double tol_x = 5 * sqrt(at_x) + 5, tol_y = 5 * sqrt(at_y) + 5;
      ck_assert_msg(fabs(at_left - at_x) < tol_x && fabs(at_right - at_x) < tol_x && fabs(at_top - at_y) < tol_y &&
                        fabs(at_bottom - at_y) < tol_y,
                    "%dx%d: boxes at the left %d, right %d (expected %.0f), top %d, bottom %d (expected %.0f)", W, H,
                    at_left, at_right, at_x, at_top, at_bottom, at_y);
    }
  }
  ck_assert_msg(fabs((double)flips / views - 0.5) < 0.01, "%ld of %ld views flipped", flips, views);
}
END_TEST

/* Equal keys give equal views; the flip does not follow the box. */
START_TEST(view_train_keys) {
  int flipped_small = 0, flipped_large = 0, small = 0;
  for (uint64_t key = 0; key < 4000; key++) {
    struct gw__view a, b;
    gw__view_train(&a, 300, 200, 224, key);
    gw__view_train(&b, 300, 200, 224, key);
    ck_assert(a.x == b.x && a.y == b.y && a.w == b.w && a.h == b.h && a.flip == b.flip);
    if (a.w * a.h < 0.5 * 300 * 200) small++, flipped_small += a.flip != 0;
    else flipped_large += a.flip != 0;
  }
  ck_assert_msg(fabs((double)flipped_small / small - 0.5) < 0.05, "%d of %d small boxes flipped", flipped_small, small);
  ck_assert_msg(fabs((double)flipped_large / (4000 - small) - 0.5) < 0.05, "%d of %d large boxes flipped",
                flipped_large, 4000 - small);
}
END_TEST

/* ---- the resampler through fixed views --------------------------------------------- */

#define GW 80 /* the gradient image: red 3x, green 4y, blue 2x + y */
#define GH 50

static uint8_t *gradient(void) {
  uint8_t *px = malloc(GW * GH * 3);
  for (int y = 0; y < GH; y++)
    for (int x = 0; x < GW; x++) {
      px[(y * GW + x) * 3] = (uint8_t)(3 * x);
      px[(y * GW + x) * 3 + 1] = (uint8_t)(4 * y);
      px[(y * GW + x) * 3 + 2] = (uint8_t)(2 * x + y);
    }
  return px;
}

static const float ZERO[3] = {0, 0, 0}, ONE[3] = {1, 1, 1};

/* Output (c, row j, column i) of an out_w x out_h result. */
static float at(const float *out, int out_w, int out_h, int c, int j, int i) {
  return out[((size_t)c * out_h + j) * out_w + i];
}

/* A box of the image's own scale is copied: output (j, i) is source
 * (y + oy + j, x + ox + i), or column out_w - 1 - i when flipped. */
START_TEST(resample_crop_and_flip) {
  uint8_t *px = gradient();
  float out[3 * 16 * 32];
  for (int flip = 0; flip < 2; flip++)
    for (int off = 0; off < 2; off++) {
      const int ox = off ? 4 : 0, oy = off ? 2 : 0, ow = off ? 20 : 32, oh = off ? 10 : 16;
      struct gw__view v = {.x = 10, .y = 20, .w = 32, .h = 16, .rw = 32, .rh = 16, .ox = ox, .oy = oy, .flip = flip};
      ck_assert_int_eq(gw__resample(px, GW, GH, 3, &v, ow, oh, ZERO, ONE, out), GW_SUCCESS);
      for (int c = 0; c < 3; c++)
        for (int j = 0; j < oh; j++)
          for (int i = 0; i < ow; i++) {
            const int sx = 10 + ox + i, sy = 20 + oy + j, col = flip ? ow - 1 - i : i;
            const float want = px[(sy * GW + sx) * 3 + c] / 255.0f;
            ck_assert_msg(fabsf(at(out, ow, oh, c, j, col) - want) < 1e-6f,
                          "flip %d offset %d: channel %d at (%d, %d) is %g, source (%d, %d) is %g", flip, off, c, j,
                          col, at(out, ow, oh, c, j, col), sy, sx, want);
          }
    }
  free(px);
}
END_TEST

/* A 64 x 40 box at (8, 6) halved to 32 x 20: PIL's bilinear taps at a factor
 * of 2 are [1, 3, 3, 1] / 8 around source 2i + 0.5 of the box, so inside the
 * border a linear ramp keeps its line: red 3 (8 + 2i + 0.5), green 4 (6 + 2j
 * + 0.5), each rounded to a byte as PIL rounds (half up). */
START_TEST(resample_halved_ramp) {
  uint8_t *px = gradient();
  float out[3 * 20 * 32];
  for (int flip = 0; flip < 2; flip++) {
    struct gw__view v = {.x = 8, .y = 6, .w = 64, .h = 40, .rw = 32, .rh = 20, .flip = flip};
    ck_assert_int_eq(gw__resample(px, GW, GH, 3, &v, 32, 20, ZERO, ONE, out), GW_SUCCESS);
    for (int j = 1; j < 19; j++)
      for (int i = 1; i < 31; i++) {
        const int col = flip ? 31 - i : i;
        /* (PIL's bytes: 3 (8 + 2i + 0.5) = 25.5 + 6i rounds half up) */
        const float r = 26 + 6 * i, g = 4 * (6 + 2 * j + 0.5f);
        ck_assert_msg(fabsf(at(out, 32, 20, 0, j, col) * 255 - r) < 1e-3f && fabsf(at(out, 32, 20, 1, j, col) * 255 - g) < 1e-3f,
                      "flip %d: (%d, %d) is (%g, %g), want (%g, %g)", flip, j, col, at(out, 32, 20, 0, j, col) * 255,
                      at(out, 32, 20, 1, j, col) * 255, r, g);
      }
  }
  free(px);
}
END_TEST

/* Against torchvision on PIL images (fixtures/resample.bin, made by
 * fixtures/make_resample_fixtures.py): every view of a random 53 x 41 image
 * (halved, shrunk by 3.1 and 10, enlarged, one pixel enlarged, a window of a
 * resize, mirrored, unlike factors across and down) gives torchvision's
 * tensor bit for bit: PIL's crop, resize and flip, then ToTensor and
 * Normalize with ImageNet's mean and std.  Values in float between PIL's two
 * passes and at the end differed by up to one in 255. */
START_TEST(resample_as_pil) {
  static const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  const char *dir = getenv("GW_FIXTURES");
  ck_assert_msg(dir, "GW_FIXTURES is not set (meson sets it to test/fixtures)");
  char path[4096];
  snprintf(path, sizeof path, "%s/resample.bin", dir);
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f, "cannot open %s", path);
  char magic[4];
  uint32_t head[3];
  ck_assert(fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GWRS", 4) && fread(head, 4, 3, f) == 3);
  const uint32_t w = head[0], h = head[1], nviews = head[2];
  ck_assert(w > 0 && w < 1000 && h > 0 && h < 1000 && nviews > 0 && nviews < 100);
  uint8_t *px = malloc((size_t)w * h * 3);
  ck_assert(px && fread(px, 3, (size_t)w * h, f) == (size_t)w * h);
  for (uint32_t n = 0; n < nviews; n++) {
    int32_t p[11];
    ck_assert(fread(p, 4, 11, f) == 11);
    struct gw__view v = {.x = p[0], .y = p[1], .w = p[2], .h = p[3], .rw = p[4], .rh = p[5], .ox = p[6], .oy = p[7],
                         .flip = p[10]};
    const int ow = p[8], oh = p[9];
    ck_assert(ow > 0 && ow <= 256 && oh > 0 && oh <= 256);
    const size_t count = (size_t)3 * ow * oh;
    float *want = malloc(count * sizeof *want), *got = malloc(count * sizeof *got);
    ck_assert(want && got && fread(want, sizeof *want, count, f) == count);
    ck_assert_int_eq(gw__resample(px, (int)w, (int)h, 3, &v, ow, oh, mean, std, got), GW_SUCCESS);
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < count; i++)
      if (memcmp(&got[i], &want[i], sizeof got[i]) && !differ++) first = i;
    ck_assert_msg(!differ,
                  "view %u (box %d,%d %dx%d -> %dx%d, window %d,%d %dx%d, flip %d): %zu of %zu values differ from "
                  "torchvision's, the first (channel %zu, row %zu, column %zu) %.9g against %.9g (%.2f of a byte)",
                  n, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], ow, oh, p[10], differ, count,
                  first / ((size_t)ow * oh), first / ow % oh, first % ow, got[first], want[first],
                  (got[first] - want[first]) * std[first / ((size_t)ow * oh)] * 255);
    free(want);
    free(got);
  }
  ck_assert_msg(fgetc(f) == EOF, "%s: bytes after its %u views", path, nviews);
  fclose(f);
  free(px);
}
END_TEST

void add_transform_tests(TCase *tc) {
  tcase_add_test(tc, view_val_sizes);
  tcase_add_test(tc, view_train_ranges);
  tcase_add_test(tc, view_train_keys);
  tcase_add_test(tc, resample_crop_and_flip);
  tcase_add_test(tc, resample_halved_ramp);
  tcase_add_test(tc, resample_as_pil);
}
