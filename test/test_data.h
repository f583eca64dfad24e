/* test_data.h - what test_data.c's cases share with test_data_hostile.c's and
 * test_data_loader.c's:
 * the temporary tree, IDX and JPEG writers, the error check. */
#ifndef GW_TEST_DATA_H
#define GW_TEST_DATA_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "dataset.h"
#include "gw_config.h"

/* What the folder scan lists and decodes (PNG where libpng was found). */
#if GW_HAVE_PNG
#define NAMES ".jpg, .jpeg or .png"
#define DECODED "JPEG and PNG"
#else
#define NAMES ".jpg or .jpeg"
#define DECODED "JPEG files"
#endif

extern char tmpdir[64]; /* made by make_tmpdir */
/* Debian's dataset-fashion-mnist, and whether it is there. */
#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
int fmnist_installed(void);
void make_tmpdir(void);
void remove_tmpdir(void);
/* tmpdir/name (one of four rotating buffers). */
const char *in_tmp(const char *name);
/* tmpdir/rel and every directory above it. */
void mkdirs(const char *rel);
void write_file(const char *path, const void *data, size_t len);
/* res is a failure whose message names part1 and part2. */
void expect_error(gw_result_t res, const char *part1, const char *part2);

/* A train split of n images (rows x cols) and labels; *_bytes cut the data short. */
struct idx_spec {
  uint32_t image_magic, label_magic, images, labels, rows, cols;
  size_t image_bytes, label_bytes;
  unsigned char bad_label;
};
void put_be32(unsigned char *p, uint32_t v);
void write_gz(const char *path, const unsigned char *data, size_t len);
void write_idx(const struct idx_spec *s);
struct idx_spec good_idx(void); /* 3 images of 28 x 28, 3 labels */
gw_result_t open_tmp_fmnist(void);

/* A JPEG of w x h at tmpdir/rel (gray, or a constant colour rgb, else a
 * pattern), cut to `keep` of its length; returns its full length. */
size_t write_jpeg(const char *rel, int w, int h, int gray, const unsigned char *rgb, double keep);
/* The ImageNet-style tree of test_data.c (classes ant, cat, dog). */
void make_tree(void);

/* test_data_hostile.c's cases. */
void add_fmnist_hostile_tests(TCase *tc);
void add_folder_hostile_tests(TCase *tc);
/* test_data_loader.c's: faults other than bad files. */
void add_loader_fault_tests(TCase *tc);
void add_folder_limit_tests(TCase *tc);
/* test_data_transform.c's: the training view and the resampler. */
void add_transform_tests(TCase *tc);
/* test_data_png.c's: PNG decoding against PIL (nothing without libpng). */
void add_png_tests(TCase *tc);
void add_sampler_tests(TCase *tc);

#endif
