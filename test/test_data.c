/* test_data.c - the trainer's data side (data/): Fashion-MNIST against values read
 * independently with Python, its refusal of damaged files; the ImageNet-style
 * folder dataset on a tiny tree of JPEGs made here (class order, the validation
 * and training transforms, bad files skipped); the distributed sampler against
 * PyTorch DistributedSampler's rules (test_data_sampler.c); the loader's bit-identical batches for any
 * thread count and after a seek, skip substitution, and shutdown mid-epoch.
 * Every file is written under a temporary directory.  The Fashion-MNIST cases on
 * the installed dataset are left out (and say so) when it is not installed. */
#include <check.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>


#include "data_internal.h" /* gw__folder_set_val_resize */
#include "dataset.h"
#include "harness.h"
#include "loader.h"
#include "sampler.h"
#include "test_data.h"

/* ---- temporary files ------------------------------------------------------------ */

char tmpdir[64];

void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/gw_data_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

void remove_tmpdir(void) { nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

const char *in_tmp(const char *name) {
  static char p[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
  return p[k];
}

void mkdirs(const char *rel) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", tmpdir, rel);
  for (char *s = p + strlen(tmpdir) + 1; *s; s++)
    if (*s == '/') {
      *s = '\0';
      mkdir(p, 0755);
      *s = '/';
    }
  mkdir(p, 0755);
}

void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot create %s", path);
  ck_assert_uint_eq(fwrite(data, 1, len, f), len);
  fclose(f);
}

void expect_error(gw_result_t res, const char *part1, const char *part2) {
  const char *msg = gw_data_last_error();
  ck_assert_msg(res != GW_SUCCESS, "expected a failure mentioning %s", part2);
  ck_assert_msg(strstr(msg, part1) && strstr(msg, part2), "message \"%s\" should name \"%s\" and \"%s\"", msg, part1,
                part2);
}

/* ---- Fashion-MNIST on the installed files --------------------------------------- */

int fmnist_installed(void) { return access(FMNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) == 0; }

/* Expected values, read with Python's gzip module from Debian's
 * dataset-fashion-mnist:
 *   im = gzip.open(split + '-images-idx3-ubyte.gz').read()
 *   lb = gzip.open(split + '-labels-idx1-ubyte.gz').read()
 *   list(lb[8:18]); list(im[16 + 14*28 : 16 + 15*28]); sum(im[16:16+784]); lb[-1] */
struct fmnist_expect {
  enum gw_split split;
  int64_t size;
  int per_class;
  int first_labels[10];
  int row14[28];  /* image 0, row 14 */
  long image0_sum;
  int last_label;
};

static const struct fmnist_expect FMNIST_EXPECT[2] = {
  {GW_SPLIT_TRAIN, 60000, 6000, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5},
   {0, 0, 1, 4, 6, 7, 2, 0, 0, 0, 0, 0, 237, 226, 217, 223, 222, 219, 222, 221, 216, 223, 229, 215, 218, 255, 77, 0},
   76247, 5},
  {GW_SPLIT_VAL, 10000, 1000, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7},
   {0, 0, 0, 0, 0, 0, 2, 4, 1, 0, 0, 0, 98, 136, 110, 109, 110, 162, 135, 144, 149, 159, 167, 144, 158, 169, 119, 0},
   33456, 5},
};

static float fmnist_norm(int v) { return ((float)v / 255.0f - 0.2860f) / 0.3530f; }
static int fmnist_raw(float x) { return (int)lrintf((x * 0.3530f + 0.2860f) * 255.0f); }

START_TEST(fmnist_values) {
  const struct fmnist_expect *e = &FMNIST_EXPECT[_i];
  struct gw_dataset *ds;
  ck_assert_msg(gw_dataset_open(&ds, "fashion-mnist", e->split, NULL) == GW_SUCCESS, "%s", gw_data_last_error());
  int c, h, w;
  gw_dataset_shape(ds, &c, &h, &w);
  ck_assert_int_eq(gw_dataset_size(ds), e->size);
  ck_assert(c == 1 && h == 28 && w == 28);
  ck_assert_int_eq(gw_dataset_classes(ds), 10);
  ck_assert_str_eq(gw_dataset_class_name(ds, 0), "T-shirt/top");
  ck_assert_str_eq(gw_dataset_class_name(ds, 9), "Ankle boot");
  float x[784];
  int32_t y;
  int hist[10] = {0};
  for (int64_t i = 0; i < e->size; i++) {
    ck_assert_int_eq(gw_dataset_get(ds, i, 0, 0, x, &y), GW_SUCCESS);
    ck_assert(y >= 0 && y < 10);
    hist[y]++;
    if (i < 10) ck_assert_int_eq(y, e->first_labels[i]);
    if (i == e->size - 1) ck_assert_int_eq(y, e->last_label);
  }
  for (int k = 0; k < 10; k++) ck_assert_int_eq(hist[k], e->per_class);
  ck_assert_int_eq(gw_dataset_get(ds, 0, 0, 0, x, &y), GW_SUCCESS);
  long sum = 0;
  for (int i = 0; i < 784; i++) sum += fmnist_raw(x[i]);
  ck_assert_int_eq(sum, e->image0_sum);
  for (int i = 0; i < 28; i++) ck_assert_float_eq_tol(x[14 * 28 + i], fmnist_norm(e->row14[i]), 1e-6);
  ck_assert_int_ne(gw_dataset_get(ds, e->size, 0, 0, x, &y), GW_SUCCESS); /* out of range */
  gw_dataset_free(ds);
}
END_TEST

/* The augmented sample is the plain one shifted by up to 2 pixels (zeros coming
 * in) and maybe mirrored; the same key gives the same bits. */
static int is_shift_of(const float *aug, const float *plain) {
  for (int flip = 0; flip < 2; flip++)
    for (int dy = -2; dy <= 2; dy++)
      for (int dx = -2; dx <= 2; dx++) {
        int ok = 1;
        for (int y = 0; y < 28 && ok; y++)
          for (int x = 0; x < 28 && ok; x++) {
            int sy = y + dy, sx = (flip ? 27 - x : x) + dx;
            float v = sy >= 0 && sy < 28 && sx >= 0 && sx < 28 ? plain[sy * 28 + sx] : fmnist_norm(0);
            ok = fabsf(aug[y * 28 + x] - v) < 1e-5f;
          }
        if (ok) return 1;
      }
  return 0;
}

START_TEST(fmnist_augment) {
  struct gw_dataset *ds;
  ck_assert_int_eq(gw_dataset_fashion_mnist(&ds, FMNIST_DIR, GW_SPLIT_VAL, 1), GW_SUCCESS);
  float plain[784], a[784], b[784];
  int32_t y;
  int differs = 0;
  for (uint64_t key = 1; key <= 20; key++) {
    ck_assert_int_eq(gw_dataset_get(ds, 3, 0, key, plain, &y), GW_SUCCESS); /* train off: no augmentation */
    ck_assert_int_eq(gw_dataset_get(ds, 3, 1, key, a, &y), GW_SUCCESS);
    ck_assert_int_eq(gw_dataset_get(ds, 3, 1, key, b, &y), GW_SUCCESS);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    ck_assert(is_shift_of(a, plain));
    differs += memcmp(a, plain, sizeof a) != 0;
  }
  ck_assert_int_gt(differs, 10);
  gw_dataset_free(ds);
}
END_TEST

/* ---- Fashion-MNIST: damaged files ------------------------------------------------ */

void put_be32(unsigned char *p, uint32_t v) {
  for (int k = 0; k < 4; k++) p[k] = (unsigned char)(v >> (24 - 8 * k));
}

void write_gz(const char *path, const unsigned char *data, size_t len) {
  gzFile f = gzopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(gzwrite(f, data, (unsigned)len), (int)len);
  gzclose(f);
}

void write_idx(const struct idx_spec *s) {
  unsigned char *buf = calloc(1, 16 + s->image_bytes + s->label_bytes + 8);
  put_be32(buf, s->image_magic), put_be32(buf + 4, s->images), put_be32(buf + 8, s->rows), put_be32(buf + 12, s->cols);
  write_gz(in_tmp("train-images-idx3-ubyte.gz"), buf, 16 + s->image_bytes);
  memset(buf, 0, 8 + s->label_bytes);
  put_be32(buf, s->label_magic), put_be32(buf + 4, s->labels);
  if (s->label_bytes) buf[8 + s->label_bytes - 1] = s->bad_label;
  write_gz(in_tmp("train-labels-idx1-ubyte.gz"), buf, 8 + s->label_bytes);
  free(buf);
}

struct idx_spec good_idx(void) {
  struct idx_spec s = {0x803, 0x801, 3, 3, 28, 28, 3 * 784, 3, 0};
  return s;
}

gw_result_t open_tmp_fmnist(void) {
  struct gw_dataset *ds = NULL;
  gw_result_t res = gw_dataset_fashion_mnist(&ds, tmpdir, GW_SPLIT_TRAIN, 0);
  gw_dataset_free(ds);
  return res;
}

START_TEST(fmnist_bad_files) {
  make_tmpdir();
  struct idx_spec s = good_idx();
  write_idx(&s);
  ck_assert_msg(open_tmp_fmnist() == GW_SUCCESS, "%s", gw_data_last_error());
  s.image_magic = 0x801;
  write_idx(&s);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz", "magic");
  s = good_idx(), s.label_magic = 0x803;
  write_idx(&s);
  expect_error(open_tmp_fmnist(), "train-labels-idx1-ubyte.gz", "magic");
  s = good_idx(), s.image_bytes -= 100; /* the header promises more pixels than follow */
  write_idx(&s);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz", "truncated");
  s = good_idx(), s.rows = 32;
  write_idx(&s);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz", "32x28");
  s = good_idx(), s.labels = 2, s.label_bytes = 2;
  write_idx(&s);
  expect_error(open_tmp_fmnist(), "train-labels-idx1-ubyte.gz", "2 labels");
  s = good_idx(), s.bad_label = 12;
  write_idx(&s);
  expect_error(open_tmp_fmnist(), "train-labels-idx1-ubyte.gz", "label 12");
  /* A FIFO in a file's place (no writer): refused at once (gzopen waited in
   * open() forever). */
  s = good_idx();
  write_idx(&s);
  ck_assert_int_eq(unlink(in_tmp("train-images-idx3-ubyte.gz")), 0);
  ck_assert_int_eq(mkfifo(in_tmp("train-images-idx3-ubyte.gz"), 0600), 0);
  alarm(20);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz", "not a regular file");
  alarm(0);
  remove_tmpdir();
}
END_TEST

/* A .gz file cut in the middle of its compressed stream. */
START_TEST(fmnist_truncated_gzip) {
  make_tmpdir();
  struct idx_spec s = good_idx();
  s.images = s.labels = 300, s.image_bytes = 300 * 784, s.label_bytes = 300;
  unsigned char *noise = malloc(16 + s.image_bytes);
  for (size_t i = 0; i < 16 + s.image_bytes; i++) noise[i] = (unsigned char)mix64(i);
  put_be32(noise, 0x803), put_be32(noise + 4, 300), put_be32(noise + 8, 28), put_be32(noise + 12, 28);
  write_idx(&s);
  write_gz(in_tmp("train-images-idx3-ubyte.gz"), noise, 16 + s.image_bytes);
  FILE *f = fopen(in_tmp("train-images-idx3-ubyte.gz"), "rb");
  char *gz = malloc(1 << 20);
  size_t len = fread(gz, 1, 1 << 20, f);
  fclose(f);
  write_file(in_tmp("train-images-idx3-ubyte.gz"), gz, len / 2);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz", "truncated");
  unlink(in_tmp("train-images-idx3-ubyte.gz"));
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz", "cannot open");
  free(gz);
  free(noise);
  remove_tmpdir();
}
END_TEST

START_TEST(bad_specs) {
  struct gw_dataset *ds = (struct gw_dataset *)1;
  expect_error(gw_dataset_open(&ds, "cifar10", GW_SPLIT_TRAIN, NULL), "cifar10", "fashion-mnist[:DIR]");
  ck_assert_ptr_null(ds);
  expect_error(gw_dataset_open(&ds, "imagenet", GW_SPLIT_TRAIN, NULL), "imagenet", "imagenet:DIR");
  /* a colon and no DIR: refused (fashion-mnist's read the default folder) */
  expect_error(gw_dataset_open(&ds, "imagenet:", GW_SPLIT_TRAIN, NULL), "no DIR after the colon", "imagenet:DIR");
  expect_error(gw_dataset_open(&ds, "fashion-mnist:", GW_SPLIT_TRAIN, NULL), "no DIR after the colon",
               "fashion-mnist:DIR");
  ck_assert_ptr_null(ds);
  expect_error(gw_dataset_open(&ds, "synthetic:10", GW_SPLIT_TRAIN, NULL), "synthetic:10", "no argument");
  expect_error(gw_dataset_open(&ds, "synthetic:", GW_SPLIT_TRAIN, NULL), "synthetic:", "no argument");
  expect_error(gw_dataset_open(&ds, "imagenet:/nonexistent/x", GW_SPLIT_TRAIN, NULL), "/nonexistent/x/train",
               "cannot open");
  expect_error(gw_dataset_synthetic(&ds, 0, 3, 8, 10, 0), "synthetic", "positive");
}
END_TEST

/* ---- ImageNet-style folders ----------------------------------------------------------- */

/* A w x h image with 1 (gray) or 3 channels: constant colour rgb, or noise when
 * rgb is NULL.  Returns the JPEG size. */
size_t write_jpeg(const char *rel, int w, int h, int gray, const unsigned char *rgb, double keep) {
  int ch = gray ? 1 : 3;
  unsigned char *px = malloc((size_t)w * h * ch);
  for (size_t i = 0; i < (size_t)w * h * ch; i++)
    px[i] = rgb ? rgb[i % ch] : (unsigned char)(((i / ch) % w + (i / ch) / w * 3 + (mix64(i) & 31)) & 255);
  tjhandle tj = tjInitCompress();
  unsigned char *jpg = NULL;
  unsigned long len = 0;
  ck_assert_int_eq(tjCompress2(tj, px, w, 0, h, gray ? TJPF_GRAY : TJPF_RGB, &jpg, &len,
                               gray ? TJSAMP_GRAY : TJSAMP_444, 95, 0), 0);
  write_file(in_tmp(rel), jpg, (size_t)(len * keep));
  tjFree(jpg);
  tjDestroy(tj);
  free(px);
  return len;
}

/* Decodes a JPEG of the tree back (the reference for expected values). */
static unsigned char *read_jpeg(const char *rel, int *w, int *h) {
  FILE *f = fopen(in_tmp(rel), "rb");
  ck_assert_ptr_nonnull(f);
  static unsigned char buf[1 << 21];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  tjhandle tj = tjInitDecompress();
  int ss, cs;
  ck_assert_int_eq(tjDecompressHeader3(tj, buf, len, w, h, &ss, &cs), 0);
  unsigned char *px = malloc((size_t)*w * *h * 3);
  ck_assert_int_eq(tjDecompress2(tj, buf, len, px, *w, 0, *h, TJPF_RGB, 0), 0);
  tjDestroy(tj);
  return px;
}

static const unsigned char COLOUR[3] = {200, 90, 30};
static const float IMNET_MEAN[3] = {0.485f, 0.456f, 0.406f}, IMNET_STD[3] = {0.229f, 0.224f, 0.225f};

/* The tree (classes ant, cat, dog; sorted order is not creation order):
 *   train: ant/e.jpg | cat/a.jpg cat/b.JPEG cat/sub/c.jpg (gray) | dog/bad.jpg
 *          (truncated) dog/d.jpeg dog/text.jpg (not a JPEG) dog/notes.txt (ignored)
 *   val:   cat/const.jpg (constant colour) cat/gray.jpg dog/big.jpg (512x512)
 *          dog/mid.jpg (256x256) */
void make_tree(void) {
  make_tmpdir();
  const char *dirs[] = {"train/dog", "train/cat/sub", "train/ant", "val/cat", "val/dog"};
  for (int i = 0; i < 5; i++) mkdirs(dirs[i]);
  write_jpeg("train/cat/a.jpg", 64, 48, 0, NULL, 1);
  write_jpeg("train/cat/b.JPEG", 40, 30, 0, COLOUR, 1);
  write_jpeg("train/cat/sub/c.jpg", 50, 70, 1, NULL, 1);
  write_jpeg("train/dog/d.jpeg", 100, 80, 0, NULL, 1);
  ck_assert_uint_gt(write_jpeg("train/dog/bad.jpg", 160, 120, 0, NULL, 0.6), 4000);
  write_file(in_tmp("train/dog/text.jpg"), "hello, not an image\n", 20);
  write_file(in_tmp("train/dog/notes.txt"), "notes\n", 6);
  write_jpeg("train/ant/e.jpg", 32, 32, 0, NULL, 1);
  write_jpeg("val/cat/const.jpg", 300, 200, 0, COLOUR, 1);
  write_jpeg("val/cat/gray.jpg", 90, 120, 1, NULL, 1);
  write_jpeg("val/dog/big.jpg", 512, 512, 0, NULL, 1);
  write_jpeg("val/dog/mid.jpg", 256, 256, 0, NULL, 1);
}

#define OUT_FLOATS (3 * 224 * 224)

/* Gets a sample into a buffer with a guard after it, checking the guard. */
static gw_result_t get_guarded(struct gw_dataset *ds, int64_t i, int train, uint64_t key, float *out, int32_t *y) {
  for (int k = 0; k < 64; k++) out[OUT_FLOATS + k] = -12345.0f;
  gw_result_t res = gw_dataset_get(ds, i, train, key, out, y);
  for (int k = 0; k < 64; k++) ck_assert_float_eq(out[OUT_FLOATS + k], -12345.0f);
  return res;
}

START_TEST(folder_classes_and_skips) {
  make_tree();
  struct gw_dataset *ds;
  char spec[128];
  snprintf(spec, sizeof spec, "imagenet:%s", tmpdir);
  ck_assert_msg(gw_dataset_open(&ds, spec, GW_SPLIT_TRAIN, NULL) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert_int_eq(gw_dataset_classes(ds), 3);
  ck_assert_str_eq(gw_dataset_class_name(ds, 0), "ant");
  ck_assert_str_eq(gw_dataset_class_name(ds, 1), "cat");
  ck_assert_str_eq(gw_dataset_class_name(ds, 2), "dog");
  ck_assert_int_eq(gw_dataset_size(ds), 7);
  /* torchvision's order: class, then directory, then name. */
  const int labels[7] = {0, 1, 1, 1, 2, 2, 2};
  const char *skipped[7] = {NULL, NULL, NULL, NULL, "train/dog/bad.jpg", NULL, "train/dog/text.jpg"};
  float *out = malloc((OUT_FLOATS + 64) * sizeof *out);
  for (int i = 0; i < 7; i++) {
    int32_t y = -1;
    gw_result_t res = get_guarded(ds, i, 1, 7, out, &y);
    if (skipped[i]) {
      ck_assert_int_eq(res, GW_DATA_SKIPPED);
      ck_assert_msg(strstr(gw_data_last_error(), skipped[i]), "%s", gw_data_last_error());
    } else {
      ck_assert_msg(res == GW_SUCCESS, "sample %d: %s", i, gw_data_last_error());
      ck_assert_int_eq(y, labels[i]);
    }
  }
  free(out);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST

/* Class directories whose names are not all UTF-8 (an old archive's
 * Latin-1) are numbered in Python's order, which torchvision's labels follow:
 * str comparison of the names as os.fsdecode gives them (each byte outside a
 * well-formed sequence is U+DC00 + byte).  Byte order put "\x80a" before
 * "\xc3\xa9", and the overlong, surrogate and past-U+10FFFF forms before
 * U+E000. */
START_TEST(folder_python_order) {
  make_tmpdir();
  /* Python: sorted(os.fsdecode(n) for n in names), as bytes again. */
  static const char *const order[] = {"z",          "\xc3\xa9",         "\x80" "a",          "\xc3",
                                      "\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xee\x80\x80",
                                      "\xf0\x9f\x98\x80"};
  const int n = (int)(sizeof order / sizeof order[0]);
  for (int i = n - 1; i >= 0; i--) {
    char rel[64];
    snprintf(rel, sizeof rel, "train/%s", order[i]);
    mkdirs(rel);
    snprintf(rel, sizeof rel, "train/%s/x.jpg", order[i]);
    write_jpeg(rel, 8, 8, 0, NULL, 1.0);
  }
  struct gw_dataset *ds;
  ck_assert_msg(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 8) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert_int_eq(gw_dataset_classes(ds), n);
  for (int i = 0; i < n; i++)
    ck_assert_msg(!strcmp(gw_dataset_class_name(ds, i), order[i]), "class %d is not Python's %d-th name", i, i);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST

/* A 24x8 JPEG with luma sampled 3x1 (cjpeg -sample 3x1,1x1,1x1): TurboJPEG
 * 2.1's header call has no name for that subsampling and fails, with the
 * size read; its decoder reads the file, as PIL does.  It was skipped as "not
 * a JPEG". */
static const unsigned char sampled_3x1[] = {
0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 0x4a, 0x46, 0x49, 0x46, 0x00, 0x01,
  0x01, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0xff, 0xdb, 0x00, 0x43,
  0x00, 0x08, 0x06, 0x06, 0x07, 0x06, 0x05, 0x08, 0x07, 0x07, 0x07, 0x09,
  0x09, 0x08, 0x0a, 0x0c, 0x14, 0x0d, 0x0c, 0x0b, 0x0b, 0x0c, 0x19, 0x12,
  0x13, 0x0f, 0x14, 0x1d, 0x1a, 0x1f, 0x1e, 0x1d, 0x1a, 0x1c, 0x1c, 0x20,
  0x24, 0x2e, 0x27, 0x20, 0x22, 0x2c, 0x23, 0x1c, 0x1c, 0x28, 0x37, 0x29,
  0x2c, 0x30, 0x31, 0x34, 0x34, 0x34, 0x1f, 0x27, 0x39, 0x3d, 0x38, 0x32,
  0x3c, 0x2e, 0x33, 0x34, 0x32, 0xff, 0xdb, 0x00, 0x43, 0x01, 0x09, 0x09,
  0x09, 0x0c, 0x0b, 0x0c, 0x18, 0x0d, 0x0d, 0x18, 0x32, 0x21, 0x1c, 0x21,
  0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32,
  0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32,
  0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32,
  0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32,
  0x32, 0x32, 0xff, 0xc0, 0x00, 0x11, 0x08, 0x00, 0x08, 0x00, 0x18, 0x03,
  0x01, 0x31, 0x00, 0x02, 0x11, 0x01, 0x03, 0x11, 0x01, 0xff, 0xc4, 0x00,
  0x16, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x04, 0x06, 0xff, 0xc4, 0x00,
  0x22, 0x10, 0x00, 0x02, 0x01, 0x03, 0x03, 0x05, 0x01, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x11, 0x31,
  0x00, 0x05, 0x21, 0x06, 0x12, 0x22, 0x32, 0x41, 0x13, 0xff, 0xc4, 0x00,
  0x15, 0x01, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0xff, 0xc4, 0x00, 0x26,
  0x11, 0x00, 0x01, 0x01, 0x05, 0x07, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x03, 0x04, 0x41, 0x61,
  0x05, 0x13, 0x14, 0x15, 0x21, 0x22, 0x32, 0x43, 0x71, 0x81, 0xb1, 0xc1,
  0xff, 0xda, 0x00, 0x0c, 0x03, 0x01, 0x00, 0x02, 0x11, 0x03, 0x11, 0x00,
  0x3f, 0x00, 0x73, 0x6e, 0xe9, 0x8a, 0x3a, 0x08, 0x3f, 0x69, 0xcc, 0x69,
  0x1a, 0xdb, 0xb9, 0xdd, 0x82, 0xa2, 0xdc, 0x80, 0x2e, 0xc7, 0x8f, 0xba,
  0x0a, 0xce, 0xaa, 0xa1, 0xa1, 0x8c, 0x25, 0x04, 0x4b, 0x29, 0x36, 0xb4,
  0xb3, 0x29, 0x54, 0x3e, 0xb8, 0x4f, 0x66, 0xc9, 0x1f, 0x2c, 0x79, 0xe4,
  0x6a, 0x7d, 0xe5, 0xdd, 0xb7, 0xd9, 0xd1, 0xe4, 0x69, 0x1c, 0x8f, 0x57,
  0x94, 0x0f, 0x1e, 0x05, 0xfb, 0x50, 0x78, 0xae, 0x39, 0xb6, 0x73, 0x9d,
  0x4b, 0xb3, 0x9a, 0xc6, 0x5e, 0xf4, 0x9d, 0xf1, 0xa9, 0x9a, 0xbe, 0x0f,
  0x25, 0x98, 0x24, 0x8b, 0x3e, 0x1f, 0x1a, 0xb1, 0xbc, 0xe8, 0x81, 0x59,
  0xab, 0xb2, 0x7d, 0xb7, 0xff, 0xd9
};

START_TEST(folder_unusual_sampling) {
  make_tmpdir();
  mkdirs("train/cat");
  write_file(in_tmp("train/cat/odd.jpg"), sampled_3x1, sizeof sampled_3x1);
  struct gw_dataset *ds;
  ck_assert_int_eq(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32), GW_SUCCESS);
  float *out = malloc((OUT_FLOATS + 64) * sizeof *out);
  int32_t y = -1;
  gw_result_t res = get_guarded(ds, 0, 0, 7, out, &y);
  ck_assert_msg(res == GW_SUCCESS && y == 0, "a 3x1-sampled JPEG: %s", gw_data_last_error());
  free(out);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST

/* (v / 255 - mean) / std, the expected value of a pixel v. */
static float imnet_norm(int v, int c) { return ((float)v / 255.0f - IMNET_MEAN[c]) / IMNET_STD[c]; }

START_TEST(folder_constant_colour) {
  make_tree();
  struct gw_dataset *ds;
  ck_assert_int_eq(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_VAL, 224), GW_SUCCESS);
  ck_assert_int_eq(gw_dataset_size(ds), 4);
  /* val/ has no ant: said (it was "2 classes", the training's count, as if all were there) */
  ck_assert_msg(strstr(gw_dataset_description(ds), "imagenet val (4 images, 2 of the training split's 3 classes: no "
                                                   "folder here for 1, ant, which the scores leave out) from "),
                "%s", gw_dataset_description(ds));
  int w, h;
  unsigned char *ref = read_jpeg("val/cat/const.jpg", &w, &h); /* JPEG may shift the colour slightly */
  for (int i = 0; i < w * h * 3; i++) ck_assert_int_eq(ref[i], ref[i % 3]);
  for (int c = 0; c < 3; c++) ck_assert_int_le(abs(ref[c] - COLOUR[c]), 3);
  float *out = malloc((OUT_FLOATS + 64) * sizeof *out);
  int32_t y;
  for (int train = 0; train < 2; train++) { /* any crop of a constant image is the colour */
    ck_assert_int_eq(get_guarded(ds, 0, train, 99, out, &y), GW_SUCCESS);
    ck_assert_int_eq(y, 1);
    for (int i = 0; i < OUT_FLOATS; i++) {
      int c = i / (224 * 224);
      ck_assert_float_eq_tol(out[i], imnet_norm(ref[c], c), 1e-5);
    }
  }
  /* A grayscale JPEG comes out with three equal channels. */
  ck_assert_int_eq(get_guarded(ds, 1, 0, 0, out, &y), GW_SUCCESS);
  for (int i = 0; i < 224 * 224; i++) {
    float v0 = out[i] * IMNET_STD[0] + IMNET_MEAN[0];
    ck_assert_float_eq_tol(out[224 * 224 + i] * IMNET_STD[1] + IMNET_MEAN[1], v0, 1e-5);
    ck_assert_float_eq_tol(out[2 * 224 * 224 + i] * IMNET_STD[2] + IMNET_MEAN[2], v0, 1e-5);
  }
  free(ref);
  free(out);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST

/* Validation geometry against hand-derived cases: a 256 x 256 image is not
 * resampled and the crop starts at (16, 16); a 512 x 512 image is halved by PIL's
 * bilinear filter, whose taps at a factor of 2 are [1, 3, 3, 1] / 8, each
 * pass rounded to bytes as PIL's. */
START_TEST(folder_val_geometry) {
  make_tree();
  struct gw_dataset *ds;
  ck_assert_int_eq(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_VAL, 224), GW_SUCCESS);
  float *out = malloc((OUT_FLOATS + 64) * sizeof *out);
  int32_t y;
  int w, h;
  unsigned char *mid = read_jpeg("val/dog/mid.jpg", &w, &h);
  ck_assert_int_eq(get_guarded(ds, 3, 0, 0, out, &y), GW_SUCCESS);
  ck_assert_int_eq(y, 2);
  for (int c = 0; c < 3; c++)
    for (int i = 0; i < 224; i++)
      for (int j = 0; j < 224; j++)
        ck_assert_float_eq_tol(out[(c * 224 + i) * 224 + j], imnet_norm(mid[((i + 16) * 256 + j + 16) * 3 + c], c),
                               1e-5);
  unsigned char *big = read_jpeg("val/dog/big.jpg", &w, &h);
  ck_assert_int_eq(get_guarded(ds, 2, 0, 0, out, &y), GW_SUCCESS);
  const float taps[4] = {0.125f, 0.375f, 0.375f, 0.125f};
  for (int c = 0; c < 3; c++)
    for (int i = 0; i < 224; i += 7)
      for (int j = 0; j < 224; j += 5) {
        int sy = 2 * (i + 16) - 1, sx = 2 * (j + 16) - 1;
        /* PIL's passes: each row's sum a byte (half up), then the column's
         * (sums of eighths of bytes: exact in float) */
        float v = 0;
        for (int a = 0; a < 4; a++) {
          float row = 0;
          for (int b = 0; b < 4; b++) row += taps[b] * big[((sy + a) * 512 + sx + b) * 3 + c];
          v += taps[a] * floorf(row + 0.5f);
        }
        ck_assert_float_eq_tol(out[(c * 224 + i) * 224 + j], imnet_norm((int)floorf(v + 0.5f), c), 1e-6);
      }
  free(mid);
  free(big);
  free(out);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST

/* --val-resize-size through the dataset: 256 is the default's 224 * 256 / 224
 * (the same floats); 288 resamples otherwise; below the image size refused,
 * by gw_dataset_open's option too. */
START_TEST(folder_val_resize) {
  make_tree();
  struct gw_dataset *ds, *dr;
  ck_assert_int_eq(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_VAL, 224), GW_SUCCESS);
  ck_assert_int_eq(gw_dataset_imagefolder(&dr, tmpdir, GW_SPLIT_VAL, 224), GW_SUCCESS);
  float *a = malloc((OUT_FLOATS + 64) * sizeof *a), *b = malloc((OUT_FLOATS + 64) * sizeof *b);
  int32_t y;
  ck_assert_int_eq(gw__folder_set_val_resize(dr, 256), GW_SUCCESS);
  ck_assert_int_eq(get_guarded(ds, 2, 0, 0, a, &y), GW_SUCCESS); /* big.jpg, 512 x 512 */
  ck_assert_int_eq(get_guarded(dr, 2, 0, 0, b, &y), GW_SUCCESS);
  ck_assert(memcmp(a, b, OUT_FLOATS * sizeof *a) == 0);
  ck_assert_int_eq(gw__folder_set_val_resize(dr, 288), GW_SUCCESS);
  ck_assert_int_eq(get_guarded(dr, 2, 0, 0, b, &y), GW_SUCCESS);
  ck_assert(memcmp(a, b, OUT_FLOATS * sizeof *a) != 0);
  /* training views are not the evaluation's: unchanged */
  ck_assert_int_eq(get_guarded(ds, 2, 1, 7, a, &y), GW_SUCCESS);
  ck_assert_int_eq(get_guarded(dr, 2, 1, 7, b, &y), GW_SUCCESS);
  ck_assert(memcmp(a, b, OUT_FLOATS * sizeof *a) == 0);
  expect_error(gw__folder_set_val_resize(dr, 200), "imagenet", "200 pixels (the shorter side) is smaller than the "
               "image size 224");
  gw_dataset_free(dr);
  struct gw_data_options opt;
  gw_data_options_default(&opt);
  opt.val_resize_size = 100;
  char spec[128];
  snprintf(spec, sizeof spec, "imagenet:%s", tmpdir);
  expect_error(gw_dataset_open(&dr, spec, GW_SPLIT_VAL, &opt), "imagenet", "is smaller than the image size 224");
  ck_assert_ptr_null(dr);
  free(a), free(b);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST

START_TEST(folder_train_keys) {
  make_tree();
  struct gw_dataset *ds;
  ck_assert_int_eq(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 224), GW_SUCCESS);
  float *a = malloc((OUT_FLOATS + 64) * sizeof *a), *b = malloc((OUT_FLOATS + 64) * sizeof *b);
  int32_t y;
  for (int64_t i = 1; i <= 3; i++) { /* cat/a (colour), cat/b (constant), cat/sub/c (gray) */
    ck_assert_int_eq(get_guarded(ds, i, 1, 1234, a, &y), GW_SUCCESS);
    ck_assert_int_eq(get_guarded(ds, i, 1, 1234, b, &y), GW_SUCCESS);
    ck_assert(memcmp(a, b, OUT_FLOATS * sizeof *a) == 0);
    if (i == 2) continue; /* a constant image looks the same through any crop */
    int differs = 0;
    for (uint64_t key = 1; key <= 4; key++) {
      ck_assert_int_eq(get_guarded(ds, i, 1, key, b, &y), GW_SUCCESS);
      differs += memcmp(a, b, OUT_FLOATS * sizeof *a) != 0;
    }
    ck_assert_int_eq(differs, 4);
  }
  free(a);
  free(b);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST


/* ---- loader ------------------------------------------------------------------------- */

/* Everything a stream delivered, in order. */
struct capture {
  int nbatches;
  float *x;
  int32_t *y;
  int64_t meta[256][3]; /* epoch, position, n */
  size_t floats;        /* per batch */
  int batch;
};

static void capture_init(struct capture *c, const struct gw_dataset *ds, int batch, int max) {
  memset(c, 0, sizeof *c);
  c->batch = batch;
  c->floats = (size_t)batch * gw_dataset_sample_floats(ds);
  c->x = calloc((size_t)max * c->floats, sizeof *c->x);
  c->y = calloc((size_t)max * batch, sizeof *c->y);
}

static void capture_free(struct capture *c) {
  free(c->x);
  free(c->y);
}

/* Takes up to max batches (all of a finite stream when max is large). */
static void run_stream(struct gw_loader *l, struct capture *c, int max) {
  const struct gw_batch *b;
  while (c->nbatches < max) {
    ck_assert_msg(gw_loader_next(l, &b) == GW_SUCCESS, "%s", gw_data_last_error());
    if (!b) break;
    int k = c->nbatches++;
    memcpy(c->x + k * c->floats, b->x, (size_t)b->n * (c->floats / c->batch) * sizeof(float));
    memcpy(c->y + k * c->batch, b->y, (size_t)b->n * sizeof(int32_t));
    c->meta[k][0] = b->epoch, c->meta[k][1] = b->position, c->meta[k][2] = b->n;
  }
}

static void assert_same_batches(const struct capture *a, int from, const struct capture *b, int count) {
  for (int k = 0; k < count; k++) {
    ck_assert_msg(memcmp(a->meta[from + k], b->meta[k], sizeof a->meta[0]) == 0, "batch %d: other place", from + k);
    ck_assert_msg(memcmp(a->x + (from + k) * a->floats, b->x + k * b->floats, a->floats * sizeof(float)) == 0,
                  "batch %d: other pixels", from + k);
    ck_assert(memcmp(a->y + (from + k) * a->batch, b->y + k * b->batch, a->batch * sizeof(int32_t)) == 0);
  }
}

/* The training tree at 32 x 32, 2 ranks (rank 1: 4 samples, incl. the two bad
 * files for some epochs), batch 3, shuffle, 3 epochs of 2 batches each. */
static struct gw_loader *tree_loader(struct gw_dataset *ds, int threads, int depth) {
  struct gw_sampler s;
  ck_assert_int_eq(gw_sampler_init(&s, gw_dataset_size(ds), 2, 1, 1, 0, 5), GW_SUCCESS);
  struct gw_loader_config cfg;
  gw_loader_config_default(&cfg);
  cfg.batch = 3, cfg.threads = threads, cfg.depth = depth, cfg.train = 1, cfg.epochs = 3, cfg.seed = 11;
  struct gw_loader *l;
  ck_assert_msg(gw_loader_init(&l, ds, &s, &cfg) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert_int_eq(gw_loader_batches_per_epoch(l), 2);
  return l;
}

START_TEST(loader_threads_and_seek) {
  make_tree();
  struct gw_dataset *ds;
  ck_assert_int_eq(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32), GW_SUCCESS);
  struct capture ref, other, resumed;
  capture_init(&ref, ds, 3, 8);
  capture_init(&other, ds, 3, 8);
  capture_init(&resumed, ds, 3, 8);
  struct gw_loader *l = tree_loader(ds, 1, 1);
  run_stream(l, &ref, 100);
  ck_assert_int_eq(ref.nbatches, 6);
  const int64_t meta[6][3] = {{0, 0, 3}, {0, 3, 1}, {1, 0, 3}, {1, 3, 1}, {2, 0, 3}, {2, 3, 1}};
  ck_assert(memcmp(ref.meta, meta, sizeof meta) == 0);
  int64_t skipped_ref = gw_loader_skipped(l);
  ck_assert_msg(skipped_ref > 0, "seed 5 put no unreadable file into rank 1's shards: the stand-ins go untested");
  gw_loader_free(l);
  for (int depth = 0; depth <= 5; depth += 5) { /* 3 threads, default and deep queue */
    l = tree_loader(ds, 3, depth);
    other.nbatches = 0;
    run_stream(l, &other, 100);
    ck_assert_int_eq(other.nbatches, 6);
    assert_same_batches(&ref, 0, &other, 6);
    ck_assert_int_eq(gw_loader_skipped(l), skipped_ref);
    gw_loader_free(l);
  }
  /* Resume in the middle of epoch 1 from the state after 3 batches. */
  l = tree_loader(ds, 2, 0);
  other.nbatches = 0;
  run_stream(l, &other, 3);
  int64_t epoch, pos;
  gw_loader_state(l, &epoch, &pos);
  ck_assert(epoch == 1 && pos == 3);
  gw_loader_free(l);
  l = tree_loader(ds, 3, 0);
  ck_assert_int_eq(gw_loader_seek(l, epoch, pos), GW_SUCCESS);
  run_stream(l, &resumed, 3);
  assert_same_batches(&ref, 3, &resumed, 3);
  gw_loader_free(l);
  capture_free(&ref), capture_free(&other), capture_free(&resumed);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST

/* Unshuffled, one rank, one batch of all 7: bad.jpg (position 4) becomes the next
 * index, d.jpeg; text.jpg (6, the last) wraps around to e.jpg (0). */
START_TEST(loader_skip_substitution) {
  make_tree();
  struct gw_dataset *ds;
  ck_assert_int_eq(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32), GW_SUCCESS);
  struct gw_sampler s;
  gw_sampler_init(&s, 7, 1, 0, 0, 0, 0);
  struct gw_loader_config cfg;
  gw_loader_config_default(&cfg);
  cfg.batch = 7, cfg.threads = 2, cfg.epochs = 2;
  struct gw_loader *l;
  ck_assert_int_eq(gw_loader_init(&l, ds, &s, &cfg), GW_SUCCESS);
  const struct gw_batch *b;
  ck_assert_int_eq(gw_loader_next(l, &b), GW_SUCCESS);
  ck_assert_int_eq(b->n, 7);
  ck_assert_int_eq(b->skipped, 2);
  const int32_t labels[7] = {0, 1, 1, 1, 2, 2, 0};
  for (int i = 0; i < 7; i++) ck_assert_int_eq(b->y[i], labels[i]);
  for (int i = 0; i < 7; i++) ck_assert_int_eq(b->stand_in[i], i == 4 || i == 6); /* the replaced places */
  size_t f = gw_dataset_sample_floats(ds);
  ck_assert(memcmp(b->x + 4 * f, b->x + 5 * f, f * sizeof(float)) == 0);
  ck_assert(memcmp(b->x + 6 * f, b->x, f * sizeof(float)) == 0);
  ck_assert_int_eq(gw_loader_skipped(l), 2);
  ck_assert_msg(strstr(gw_loader_last_skip(l), "text.jpg"), "%s", gw_loader_last_skip(l));
  ck_assert_int_eq(gw_loader_next(l, &b), GW_SUCCESS);
  ck_assert_int_eq(gw_loader_skipped(l), 4);
  ck_assert_int_eq(gw_loader_next(l, &b), GW_SUCCESS);
  ck_assert_ptr_null(b); /* two epochs delivered */
  ck_assert_int_eq(gw_loader_next(l, &b), GW_SUCCESS);
  ck_assert_ptr_null(b);
  gw_loader_free(l);
  gw_dataset_free(ds);
  /* Two bad files side by side (dog/bad.jpg, dog/bad2.jpg at 4 and 5): both
   * places take d.jpeg, and the count is one a place, as loader.h says (the
   * second place searches bad2.jpg again: that is no third replacement). */
  write_file(in_tmp("train/dog/bad2.jpg"), "not a JPEG either\n", 18);
  ck_assert_int_eq(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32), GW_SUCCESS);
  gw_sampler_init(&s, 8, 1, 0, 0, 0, 0);
  cfg.batch = 8, cfg.epochs = 1;
  ck_assert_int_eq(gw_loader_init(&l, ds, &s, &cfg), GW_SUCCESS);
  ck_assert_int_eq(gw_loader_next(l, &b), GW_SUCCESS);
  int stand_ins = 0;
  for (int i = 0; i < 8; i++) stand_ins += b->stand_in[i];
  for (int i = 0; i < 8; i++) ck_assert_int_eq(b->stand_in[i], i == 4 || i == 5 || i == 7);
  ck_assert(memcmp(b->x + 4 * f, b->x + 6 * f, f * sizeof(float)) == 0);
  ck_assert(memcmp(b->x + 5 * f, b->x + 6 * f, f * sizeof(float)) == 0);
  ck_assert_int_eq(b->skipped, stand_ins);
  ck_assert_int_eq(gw_loader_skipped(l), 3);
  gw_loader_free(l);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST

START_TEST(loader_shutdown_mid_epoch) {
  struct gw_dataset *ds;
  ck_assert_int_eq(gw_dataset_synthetic(&ds, 5000, 3, 64, 10, 1), GW_SUCCESS);
  struct gw_sampler s;
  gw_sampler_init(&s, 5000, 2, 0, 1, 1, 3);
  struct gw_loader_config cfg;
  gw_loader_config_default(&cfg);
  cfg.batch = 32, cfg.threads = 3, cfg.depth = 4, cfg.drop_last_batch = 1;
  struct gw_loader *l;
  for (int taken = 0; taken < 4; taken++) {
    ck_assert_int_eq(gw_loader_init(&l, ds, &s, &cfg), GW_SUCCESS);
    const struct gw_batch *b = NULL;
    for (int k = 0; k < taken; k++) {
      ck_assert_int_eq(gw_loader_next(l, &b), GW_SUCCESS);
      ck_assert(b && b->n == 32 && b->position == 32 * k);
    }
    if (taken == 3) ck_assert_int_eq(gw_loader_seek(l, 4, 64), GW_SUCCESS); /* seek with workers running */
    double t0 = test_now();
    gw_loader_free(l);
    ck_assert_double_lt(test_now() - t0, 2.0);
  }
  /* An endless stream runs across epochs; drop_last_batch: 78 batches of 32 per epoch. */
  ck_assert_int_eq(gw_loader_init(&l, ds, &s, &cfg), GW_SUCCESS);
  ck_assert_int_eq(gw_loader_batches_per_epoch(l), 78);
  ck_assert_int_eq(gw_loader_seek(l, 0, 77 * 32), GW_SUCCESS);
  const struct gw_batch *b;
  ck_assert_int_eq(gw_loader_next(l, &b), GW_SUCCESS);
  ck_assert(b->epoch == 0 && b->position == 77 * 32);
  ck_assert_int_eq(gw_loader_next(l, &b), GW_SUCCESS);
  ck_assert(b->epoch == 1 && b->position == 0);
  expect_error(gw_loader_seek(l, 0, 5000), "loader", "cannot seek");
  gw_loader_free(l);
  cfg.batch = 3000;
  expect_error(gw_loader_init(&l, ds, &s, &cfg), "loader", "no full batch");
  gw_dataset_free(ds);
}
END_TEST

static Suite *data_suite(void) {
  Suite *s = suite_create("data");
  TCase *tc = tcase_create("fashion-mnist");
  tcase_set_timeout(tc, 60);
  if (fmnist_installed()) {
    tcase_add_loop_test(tc, fmnist_values, 0, 2);
    tcase_add_test(tc, fmnist_augment);
  } else {
    fprintf(stderr, "test_data: %s not installed: the Fashion-MNIST value cases are skipped\n", FMNIST_DIR);
  }
  tcase_add_test(tc, fmnist_bad_files);
  tcase_add_test(tc, fmnist_truncated_gzip);
  add_fmnist_hostile_tests(tc);
  tcase_add_test(tc, bad_specs);
  suite_add_tcase(s, tc);
  tc = tcase_create("imagefolder");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, folder_classes_and_skips);
  tcase_add_test(tc, folder_python_order);
  tcase_add_test(tc, folder_unusual_sampling);
  tcase_add_test(tc, folder_constant_colour);
  tcase_add_test(tc, folder_val_geometry);
  tcase_add_test(tc, folder_val_resize);
  tcase_add_test(tc, folder_train_keys);
  add_folder_hostile_tests(tc);
  add_folder_limit_tests(tc);
  suite_add_tcase(s, tc);
  tc = tcase_create("png");
  suite_add_tcase(s, tc);
  add_png_tests(tc);
  tc = tcase_create("transform");
  tcase_set_timeout(tc, 60);
  add_transform_tests(tc);
  suite_add_tcase(s, tc);
  tc = tcase_create("sampler");
  tcase_set_timeout(tc, 60);
  add_sampler_tests(tc);
  suite_add_tcase(s, tc);
  tc = tcase_create("loader");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, loader_threads_and_seek);
  tcase_add_test(tc, loader_skip_substitution);
  tcase_add_test(tc, loader_shutdown_mid_epoch);
  add_loader_fault_tests(tc);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return run_suite(data_suite()); }
