/* fuzz_jpeg.c - libFuzzer target for the image folder's reading of one JPEG
 * (data/imagefolder.c): the header checks, the pixels-per-byte bound, the
 * end-of-image walk (has_end), libjpeg-turbo's decode with TJFLAG_LIMITSCANS,
 * and both transforms' geometry and resampling (data/transform.c) on whatever
 * decodes; no input may come back as the machine's failure (GW_ERR_SYSTEM,
 * which stops a run).  Odd first bytes take the input as is; even ones as edits of a small
 * valid JPEG made here (bytes overwritten, then a cut), so the decoder's inner
 * paths are reached from an empty corpus.  Built by test/fuzz.sh with clang
 * -fsanitize=fuzzer,address,undefined; includes both files to reach decode(). */
#include "../../data/imagefolder.c"
#include "../../data/transform.c"

#include "fuzz_views.h"
#include "model_fail_stub.h"

/* What imagefolder.c's opening needs but never gets here. */
gw_result_t gw__folder_scan(struct gw__folder *f, const char *dir, enum gw_split split) {
  (void)f, (void)dir, (void)split;
  return GW_ERR_UNSUPPORTED;
}
void gw_dataset_free(struct gw_dataset *ds) { (void)ds; }
int gw__data_open_nowait(const char *path) { /* dataset.c's: files are not read here */
  (void)path;
  errno = ENOENT;
  return -1;
}

/* A 24 x 16 colour JPEG (4:2:0, quality 75), made once. */
static unsigned char *base;
static unsigned long base_len;
static void make_base(void) {
  unsigned char px[24 * 16 * 3];
  for (size_t i = 0; i < sizeof px; i++) px[i] = (unsigned char)(i * 37 + (i >> 5));
  tjhandle tj = tjInitCompress();
  if (!tj || tjCompress2(tj, px, 24, 0, 16, TJPF_RGB, &base, &base_len, TJSAMP_420, 75, 0) != 0) abort();
  tjDestroy(tj);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!base) make_base();
  if (size < 1) return 0;
  const unsigned char *jpg = data + 1;
  size_t len = size - 1;
  unsigned char *edited = NULL;
  if (!(data[0] & 1)) { /* edits: (offset, value) pairs over the base, the last byte a cut */
    edited = malloc(base_len);
    memcpy(edited, base, base_len);
    size_t k = 1;
    for (; k + 2 < size; k += 2) edited[data[k] % base_len] = data[k + 1];
    len = k < size ? base_len * data[k] / 255 : base_len;
    jpg = edited;
  }
  tjhandle tj = tjInitDecompress();
  unsigned char *rgb = NULL;
  int w = 0, h = 0;
  const gw_result_t r = tj ? decode(tj, "fuzz", jpg, len, &rgb, &w, &h) : GW_ERR_SYSTEM;
  /* A file's bytes are a skip or an image, never the machine's failure
   * (GW_ERR_SYSTEM stops the run: out of descriptors or memory). */
  if (tj && r == GW_ERR_SYSTEM) abort();
  if (r == GW_SUCCESS) fuzz_views(rgb, w, h, (uint64_t)size * 0x9e3779b97f4a7c15ull, MEAN, STD);
  free(rgb);
  free(edited);
  if (tj) tjDestroy(tj);
  return 0;
}
