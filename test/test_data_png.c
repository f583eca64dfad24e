/* test_data_png.c - PNG files in the class folders (data/imagefolder_png.c),
 * against PIL: every fixture of test/fixtures/png (made by
 * make_png_fixtures.py: each colour type and bit depth, palettes with and
 * without transparency and shorter than their indices, tRNS, 16-bit
 * grayscale past 255, interlaced, gamma and unknown critical chunks) decodes to the very bytes PIL's convert("RGB") gave, and the
 * damaged ones (a truncated file, a bad CRC) are skipped naming the file.
 * Through the dataset: a PNG named .png and one named .JPEG (ILSVRC-2012
 * holds one) are samples, the evaluation view of PIL's pixels exactly. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "gw_config.h"
#include "test_data.h"

#if GW_HAVE_PNG
#include "imagefolder.h"
#include "transform.h"

static const char *fixtures(void) {
  const char *d = getenv("GW_FIXTURES");
  ck_assert_msg(d, "GW_FIXTURES is not set (meson sets it to test/fixtures)");
  return d;
}

/* The whole of path into a new buffer. */
static unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f, "cannot open %s", path);
  ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
  const long n = ftell(f);
  ck_assert_int_ge(n, 0);
  rewind(f);
  unsigned char *b = malloc((size_t)n + 1);
  ck_assert(b && fread(b, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

static const char *const KINDS[] = {
    "gray1",    "gray2",       "gray4",    "gray8",    "gray16",    "gray16low",          "rgb8",
    "rgb16",    "palette1",    "palette2", "palette4", "palette8",  "palette8trns",       "graya8",
    "graya16",  "rgba8",       "rgba16",   "gray8trns", "rgb8trns", "rgb8interlaced",     "palette4interlaced",
    "gray16interlaced", "rgb8gamma", "palette8short", "palette1short", "rgb8critchunk"};

START_TEST(png_as_pil) {
  const char *name = KINDS[_i];
  char path[600];
  size_t len, want_len;
  snprintf(path, sizeof path, "%s/png/%s.png", fixtures(), name);
  unsigned char *file = slurp(path, &len);
  snprintf(path, sizeof path, "%s/png/%s.rgb", fixtures(), name);
  unsigned char *want = slurp(path, &want_len);
  ck_assert(gw__is_png(file, len));
  unsigned char *rgb = NULL;
  int w = 0, h = 0;
  ck_assert_msg(gw__decode_png(name, file, len, &rgb, &w, &h) == GW_SUCCESS, "%s: %s", name, gw_data_last_error());
  ck_assert_int_eq(w, 9);
  ck_assert_int_eq(h, 7);
  ck_assert_uint_eq(want_len, (size_t)w * h * 3);
  for (size_t i = 0; i < want_len; i++)
    ck_assert_msg(rgb[i] == want[i], "%s: byte %zu (pixel %zu, channel %zu) is %u, PIL's %u", name, i, i / 3, i % 3,
                  rgb[i], want[i]);
  free(rgb);
  free(want);
  free(file);
}
END_TEST

/* Refused as PIL refuses them, and one it reads (a bad IDAT CRC, which PIL
 * does not check): skipped, naming the file, the output untouched. */
START_TEST(png_damaged_skipped) {
  static const char *const bad[][2] = {{"truncated", "cannot decode the PNG"},
                                       {"badtextcrc", "CRC error"},
                                       {"badcrc", "CRC error"}};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    char path[600];
    size_t len;
    snprintf(path, sizeof path, "%s/png/%s.png", fixtures(), bad[k][0]);
    unsigned char *file = slurp(path, &len), *rgb = NULL;
    int w = 1, h = 1;
    const gw_result_t r = gw__decode_png(path, file, len, &rgb, &w, &h);
    ck_assert_msg(r == GW_DATA_SKIPPED && strstr(gw_data_last_error(), path) &&
                      strstr(gw_data_last_error(), bad[k][1]),
                  "%s: %d: %s", bad[k][0], r, gw_data_last_error());
    ck_assert(rgb == NULL && w == 0 && h == 0);
    /* every cut of the good file's tail is skipped too, never a crash */
    for (size_t cut = 8; k == 0 && cut < len; cut += 7) {
      ck_assert_int_eq(gw__decode_png(path, file, cut, &rgb, &w, &h), GW_DATA_SKIPPED);
      ck_assert(rgb == NULL);
    }
    free(file);
  }
  /* a header claiming more pixels than PIL opens (a decompression bomb) */
  size_t len;
  char path[600];
  snprintf(path, sizeof path, "%s/png/rgb8.png", fixtures());
  unsigned char *file = slurp(path, &len), *rgb = NULL;
  const unsigned char huge[8] = {0, 0, 0x40, 0, 0, 0, 0x40, 0}; /* 16384 x 16384 */
  memcpy(file + 16, huge, sizeof huge);
  const uint32_t crc = (uint32_t)crc32(crc32(0, NULL, 0), file + 12, 4 + 13); /* IHDR's type and data */
  put_be32(file + 29, crc);
  int w, h;
  ck_assert_int_eq(gw__decode_png("bomb.png", file, len, &rgb, &w, &h), GW_DATA_SKIPPED);
  ck_assert_msg(strstr(gw_data_last_error(), "bomb.png: 16384x16384 pixels from ") &&
                    strstr(gw_data_last_error(), "is too large to decode"),
                "%s", gw_data_last_error());
  free(file);
}
END_TEST

/* Through the dataset: a PNG named .png, and one named .JPEG, are samples
 * whose evaluation view is the resampling of PIL's pixels, bit for bit. */
START_TEST(png_in_folder) {
  make_tmpdir();
  mkdirs("train/a");
  mkdirs("train/b");
  char path[600];
  size_t len, want_len;
  snprintf(path, sizeof path, "%s/png/rgb8.png", fixtures());
  unsigned char *file = slurp(path, &len);
  write_file(in_tmp("train/a/x.png"), file, len);
  write_file(in_tmp("train/b/y.JPEG"), file, len);
  free(file);
  snprintf(path, sizeof path, "%s/png/rgb8.rgb", fixtures());
  unsigned char *want = slurp(path, &want_len);
  struct gw_dataset *ds;
  ck_assert_msg(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 8) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert_int_eq(gw_dataset_size(ds), 2);
  ck_assert_msg(!strstr(gw_dataset_description(ds), "other formats"), "%s", gw_dataset_description(ds));
  static const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  float got[3 * 8 * 8], ref[3 * 8 * 8];
  struct gw__view v;
  gw__view_val(&v, 9, 7, 8, 0);
  ck_assert_int_eq(gw__resample(want, 9, 7, 3, &v, 8, 8, mean, std, ref), GW_SUCCESS);
  for (int64_t i = 0; i < 2; i++) {
    int32_t label = -1;
    ck_assert_msg(gw_dataset_get(ds, i, 0, 0, got, &label) == GW_SUCCESS, "%s", gw_data_last_error());
    ck_assert_int_eq(label, (int32_t)i);
    ck_assert_msg(memcmp(got, ref, sizeof ref) == 0, "sample %lld differs from PIL's pixels resampled", (long long)i);
  }
  gw_dataset_free(ds);
  free(want);
  remove_tmpdir();
}
END_TEST

void add_png_tests(TCase *tc) {
  tcase_add_loop_test(tc, png_as_pil, 0, (int)(sizeof KINDS / sizeof KINDS[0]));
  tcase_add_test(tc, png_damaged_skipped);
  tcase_add_test(tc, png_in_folder);
}
#else
void add_png_tests(TCase *tc) { (void)tc; }
#endif
