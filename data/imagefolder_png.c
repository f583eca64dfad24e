/* imagefolder_png.c - PNG files of the class folders, decoded with libpng to
 * 8-bit RGB as PIL's Image.open(...).convert("RGB") gives them (torchvision's
 * ImageFolder loader), pixel for pixel:
 *   - grayscale of 1, 2 or 4 bits scaled to 0..255 (x255, x85, x17), every
 *     grayscale copied to the three channels;
 *   - 16 bits per sample: the high byte (PIL's RGB;16B, RGBA;16B and LA;16B
 *     unpackers), except 16-bit grayscale, which PIL opens as 32-bit integers
 *     ("I") and converts to RGB by clipping at 255: values past 255 are white;
 *   - a palette's colours; alpha and tRNS dropped, not composited (convert
 *     drops them); gamma, sRGB and ICC chunks ignored (so does convert);
 *   - interlaced (Adam7) files as plain ones;
 *   - a palette shorter than its depth allows: grey (i, i, i) past its end,
 *     PIL's ramp under it; unknown chunks, critical ones too, ignored.
 * Stricter than PIL (such files are skipped, where PIL decodes them): a bad
 * CRC on any chunk PIL does not check (IDAT's), an image stream without its
 * Adler-32 or cut right after its data, interlace method 2, a palette image
 * without PLTE, a malformed PLTE or IHDR.
 * The same bounds as the JPEG path (imagefolder.c): PIL's decompression-bomb
 * limit, and a bound on pixels per byte of file so that a tiny file cannot
 * ask each loader thread for gigabytes.  A damaged or truncated file is
 * GW_DATA_SKIPPED naming it; running out of memory is an error. */
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "imagefolder.h"

/* Deflate's largest ratio is about 1032:1: no honest PNG's raw image (rows
 * of packed samples, each after its filter byte) exceeds the file's length
 * that many times (a 13000 x 13000 all-zero 1-bit image at zlib's level 9
 * comes to 1024 raw bytes per byte).  So a tiny file cannot ask each loader
 * thread for gigabytes (libpng zero-fills a whole row's buffer, and we the
 * image's), at any bit depth. */
#define PNG_MAX_RAW_PER_BYTE 1040ull

struct png_job {
  const char *path;
  const unsigned char *buf;
  size_t len, at;
  char msg[200];
  int out_of_memory;
  unsigned char *rgb, *wide;
  png_bytep *rows;
  int w, h;
};

static void read_mem(png_structp png, png_bytep out, size_t n) {
  struct png_job *j = png_get_io_ptr(png);
  if (n > j->len - j->at) png_error(png, "the file ends early");
  memcpy(out, j->buf + j->at, n);
  j->at += n;
}

static void on_error(png_structp png, png_const_charp m) {
  struct png_job *j = png_get_error_ptr(png);
  snprintf(j->msg, sizeof j->msg, "%s", m);
  j->out_of_memory |= strstr(m, "Out of memory") != NULL || strstr(m, "out of memory") != NULL;
  png_longjmp(png, 1);
}

/* An unknown chunk, critical ones included (PIL skips those that come before
 * the image data as it does ancillary ones): handled, by ignoring it. */
static int ignore_chunk(png_structp png, png_unknown_chunkp chunk) {
  (void)png, (void)chunk;
  return 1;
}

static void on_warning(png_structp png, png_const_charp m) {
  (void)png, (void)m; /* recoverable (a benign error: an unknown chunk's oddity): decoded, as PIL does */
}

bool gw__is_png(const unsigned char *buf, size_t len) { return len >= 8 && png_sig_cmp(buf, 0, 8) == 0; }

/* Everything that may longjmp; the caller's setjmp frees what j holds. */
static gw_result_t read_png(png_structp png, png_infop info, struct png_job *j) {
  png_set_read_fn(png, j, read_mem);
  /* A bad CRC on any chunk fails the file, as PIL refuses it (libpng's
   * default drops a damaged ancillary chunk and decodes). */
  png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
  png_set_read_user_chunk_fn(png, NULL, ignore_chunk);
  /* libpng's default of 1000000 a side refused wide images PIL reads; the
   * bounds below are the ones that matter */
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  png_uint_32 w, h;
  int depth, type, interlace;
  png_get_IHDR(png, info, &w, &h, &depth, &type, &interlace, NULL, NULL);
  const unsigned long long px = (unsigned long long)w * h,
                           raw = ((unsigned long long)w * png_get_channels(png, info) * depth + 7) / 8 + 1;
  if (w == 0 || h == 0 || px > GW__MAX_PIXELS || raw * h > PNG_MAX_RAW_PER_BYTE * j->len)
    return gw__model_fail(GW_DATA_SKIPPED, "%s: %ux%u pixels from %zu bytes is too large to decode", j->path,
                          (unsigned)w, (unsigned)h, j->len);
  j->w = (int)w, j->h = (int)h;
  const int gray16 = depth == 16 && type == PNG_COLOR_TYPE_GRAY;
  if (type == PNG_COLOR_TYPE_PALETTE) {
    /* PIL starts a palette as a grey ramp and lays PLTE over it: an index
     * past a short PLTE is grey (i, i, i), where libpng's would be black */
    png_colorp given;
    int n = 0;
    if (png_get_PLTE(png, info, &given, &n) && n < 1 << depth) {
      png_color full[256];
      for (int i = 0; i < 256; i++) full[i].red = full[i].green = full[i].blue = (png_byte)i;
      memcpy(full, given, (size_t)n * sizeof *full);
      png_set_PLTE(png, info, full, 1 << depth);
    }
    png_set_palette_to_rgb(png);
  }
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16 && !gray16) png_set_strip_16(png); /* the high byte */
  png_set_strip_alpha(png);                           /* alpha, or a palette's tRNS expanded to it */
  if (!gray16 && (type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA)) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row = png_get_rowbytes(png, info), want = (size_t)w * (gray16 ? 2 : 3);
  if (row != want)
    return gw__model_fail(GW_DATA_SKIPPED, "%s: a PNG of %d-bit samples, colour type %d, that decodes to %zu bytes "
                          "a row, not %zu", j->path, depth, type, row, want);
  /* Zeroed: no path may hand on bytes the decoder never wrote. */
  j->rgb = calloc(px, 3);
  j->wide = gray16 ? malloc(px * 2) : NULL;
  j->rows = malloc(h * sizeof *j->rows);
  if (!j->rgb || (gray16 && !j->wide) || !j->rows)
    return gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory decoding %s (%ux%u pixels)", j->path, (unsigned)w,
                          (unsigned)h);
  unsigned char *to = gray16 ? j->wide : j->rgb;
  for (png_uint_32 y = 0; y < h; y++) j->rows[y] = to + (size_t)y * row;
  png_read_image(png, j->rows);
  if (gray16)
    for (size_t i = 0; i < px; i++) {
      const unsigned v = (unsigned)j->wide[2 * i] << 8 | j->wide[2 * i + 1];
      j->rgb[3 * i] = j->rgb[3 * i + 1] = j->rgb[3 * i + 2] = (unsigned char)(v > 255 ? 255 : v);
    }
  return GW_SUCCESS;
}

/* The setjmp's frame: nothing here changes between it and a longjmp (j lives
 * in the caller's frame, out of the rule on such locals). */
static gw_result_t read_guarded(png_structp png, png_infop info, struct png_job *j) {
  if (setjmp(png_jmpbuf(png)))
    return j->out_of_memory ? gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory decoding %s: %s", j->path, j->msg)
                            : gw__model_fail(GW_DATA_SKIPPED, "%s: cannot decode the PNG: %s", j->path, j->msg);
  return read_png(png, info, j);
}

gw_result_t gw__decode_png(const char *path, const unsigned char *buf, size_t len, unsigned char **rgb, int *w,
                           int *h) {
  *rgb = NULL, *w = *h = 0;
  struct png_job job = {.path = path, .buf = buf, .len = len}, *j = &job;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, j, on_error, on_warning);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!info) {
    png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
    return gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory decoding %s", path);
  }
  const gw_result_t res = read_guarded(png, info, j);
  png_destroy_read_struct(&png, &info, NULL);
  free(j->wide);
  free(j->rows);
  if (res == GW_SUCCESS) *rgb = j->rgb, *w = j->w, *h = j->h;
  else free(j->rgb);
  return res;
}
