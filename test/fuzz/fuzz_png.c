/* fuzz_png.c - libFuzzer target for the image folder's PNG decoding
 * (data/imagefolder_png.c): the signature, libpng's chunk reading with every
 * CRC checked, the size bounds, the transforms to PIL's 8-bit RGB (palettes,
 * 16-bit samples, grayscale clipping, alpha and tRNS dropped, Adam7), and
 * both transforms' geometry and resampling on whatever decodes; no input may
 * come back as the machine's failure (GW_ERR_SYSTEM, which stops a run).
 * Odd first bytes take the input as is; even ones as edits of a small valid
 * PNG made here (its colour type, bit depth and interlacing chosen by the
 * first byte; bytes overwritten, then a cut), so the decoder's inner paths
 * are reached from an empty corpus.  Built by test/fuzz.sh with clang
 * -fsanitize=fuzzer,address,undefined and -DGW_HAVE_PNG=1. */
#include "../../data/imagefolder_png.c"
#include "../../data/transform.c"

#include "fuzz_views.h"
#include "model_fail_stub.h"

struct membuf {
  unsigned char *p;
  size_t n, cap;
};
static void put(png_structp png, png_bytep d, size_t n) {
  struct membuf *m = png_get_io_ptr(png);
  if (m->n + n > m->cap) {
    m->cap = (m->n + n) * 2;
    m->p = realloc(m->p, m->cap);
    if (!m->p) abort();
  }
  memcpy(m->p + m->n, d, n);
  m->n += n;
}
static void flush(png_structp png) { (void)png; }

/* The 8 bases: 20 x 13 of each kind (gray 1 and 16 bits, RGB 8, palette 4,
 * gray+alpha 8, RGBA 16; the last two interlaced), made once. */
static struct membuf bases[8];
static void make_base(int k) {
  static const int kinds[8][3] = {{PNG_COLOR_TYPE_GRAY, 1, 0},      {PNG_COLOR_TYPE_GRAY, 16, 0},
                                  {PNG_COLOR_TYPE_RGB, 8, 0},       {PNG_COLOR_TYPE_PALETTE, 4, 0},
                                  {PNG_COLOR_TYPE_GRAY_ALPHA, 8, 0}, {PNG_COLOR_TYPE_RGB_ALPHA, 16, 0},
                                  {PNG_COLOR_TYPE_RGB, 8, 1},       {PNG_COLOR_TYPE_PALETTE, 8, 1}};
  const int type = kinds[k][0], depth = kinds[k][1], w = 20, h = 13;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!info || setjmp(png_jmpbuf(png))) abort();
  png_set_write_fn(png, &bases[k], put, flush);
  png_set_IHDR(png, info, w, h, depth, type, kinds[k][2] ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (type == PNG_COLOR_TYPE_PALETTE) {
    png_color pal[256];
    for (int i = 0; i < 256; i++) pal[i].red = (png_byte)(i * 7), pal[i].green = (png_byte)(i * 13), pal[i].blue = (png_byte)i;
    png_set_PLTE(png, info, pal, 1 << depth);
    png_byte trns[4] = {0, 64, 128, 255};
    png_set_tRNS(png, info, trns, 4, NULL);
  }
  png_write_info(png, info);
  const size_t row = png_get_rowbytes(png, info);
  unsigned char *px = malloc(row * h);
  if (!px) abort();
  for (size_t i = 0; i < row * h; i++) px[i] = (unsigned char)(i * 37 + (i >> 5));
  png_bytep rows[13];
  for (int y = 0; y < h; y++) rows[y] = px + (size_t)y * row;
  png_write_image(png, rows);
  png_write_end(png, NULL);
  png_destroy_write_struct(&png, &info);
  free(px);
}

static const float MEAN[3] = {0.485f, 0.456f, 0.406f}, STD[3] = {0.229f, 0.224f, 0.225f};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const unsigned char *file = data + 1;
  size_t len = size - 1;
  unsigned char *edited = NULL;
  if (!(data[0] & 1)) { /* edits: (offset, value) pairs over a base, the last byte a cut */
    const int k = (data[0] >> 1) & 7;
    if (!bases[k].p) make_base(k);
    const struct membuf *b = &bases[k];
    edited = malloc(b->n);
    if (!edited) abort();
    memcpy(edited, b->p, b->n);
    size_t i = 1;
    for (; i + 2 < size; i += 2) edited[data[i] % b->n] = data[i + 1];
    len = i < size ? b->n * data[i] / 255 : b->n;
    file = edited;
  }
  unsigned char *rgb = NULL;
  int w = 0, h = 0;
  const gw_result_t r = gw__is_png(file, len) ? gw__decode_png("fuzz", file, len, &rgb, &w, &h) : GW_DATA_SKIPPED;
  /* A file's bytes are a skip or an image, never the machine's failure. */
  if (r == GW_ERR_SYSTEM) abort();
  if (r == GW_SUCCESS) {
    fuzz_views(rgb, w, h, (uint64_t)size * 0x9e3779b97f4a7c15ull, MEAN, STD);
  } else if (rgb) {
    abort(); /* a failure hands back no image */
  }
  free(rgb);
  free(edited);
  return 0;
}
