/* model_backend_util.h - what the files of the model-backend test share
 * (test_model_backend.c: the convolutions, the plans, the refusals and main;
 * test_model_backend_layers.c: every other layer).  See test_model_backend.c's
 * header for what is tested and the tolerances. */
#ifndef GW_TEST_MODEL_BACKEND_UTIL_H
#define GW_TEST_MODEL_BACKEND_UTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "resnet.h"

/* The backend under test and its name (argv[1]): set by main() before the suite
 * runs (Check's forked test processes inherit them). */
extern const struct gw_backend_ops *be;
extern const char *chosen;
/* The activations' layout under test (argv[2] "nhwc": GW_LAYOUT_NHWC), given to
 * every backend strict_config() makes. */
extern int layout;

/* The configuration of every backend the checks make, strict: one thread (cpu),
 * and every other field 0 (cudnn: tf32 0, full fp32); a backend made with it. */
struct gw_backend_config strict_config(void);
struct gw_backend *backend(void);

void nan_fill(float *x, size_t n);
/* Host <-> backend copies of raw bytes, failing the test on an error. */
void to_backend(struct gw_backend *b, void *dst, const void *host_src, size_t bytes);
void from_backend(struct gw_backend *b, void *host_dst, const void *src, size_t bytes);

/* A tensor of n floats: h on the host (what the test fills, reads and compares),
 * d in the backend's memory (what the calls are given).  up() copies h to d before
 * a call, down() d to h after it; nan_up() makes an output: h all NaN, uploaded.
 * An activation (shape[0] > 0: n, c, h, w) is NCHW on the host whatever the
 * layout; up() and down() transpose it when the backend's is NHWC. */
struct tensor {
  struct gw_backend *b;
  float *h, *d;
  size_t n;
  int shape[4];
};

struct tensor tensor_new(struct gw_backend *b, size_t n);
/* An activation of [n, c, h, w]; act_in / act_out: the op's input [n, c, h, w]
 * or output [n, k, p, q]. */
struct tensor tensor_act(struct gw_backend *b, int n, int c, int h, int w);
struct tensor act_in(struct gw_backend *b, const struct gw_op_desc *d);
struct tensor act_out(struct gw_backend *b, const struct gw_op_desc *d);
/* NCHW <-> NHWC of [n, c, h, w] (to_nhwc 1: src NCHW, dst NHWC; 0: back). */
void transpose_act(float *dst, const float *src, int n, int c, int h, int w, int to_nhwc);
void up(struct tensor t);
void down(struct tensor t);
void nan_up(struct tensor t);
/* A tensor holding a copy of host values, uploaded. */
struct tensor tensor_of(struct gw_backend *b, const float *values, size_t n);
void tensor_free(struct tensor t);
void tensors_free(struct tensor *t, size_t n);

/* Deterministic values in [-1, 1). */
void fill(float *x, size_t n, uint64_t seed);
struct gw_op_desc conv_desc(int n, int c, int h, int w, int k, int kernel, int stride, int pad);
/* A layer whose output has its input's shape (k = c, p = h, q = w). */
struct gw_op_desc same_desc(int kind, int n, int c, int h, int w);
/* |out - ref| <= rel * mag + abs_tol for each element (mag: the magnitude of the
 * terms summed into it, or |ref| when NULL).  NaN fails. */
void compare(const float *out, const double *ref, const double *mag, size_t n, double rel, double abs_tol,
             const char *label);

/* test_model_backend_layers.c, test_model_backend_train.c: add their tests to tc. */
void add_layer_tests(TCase *tc);
void add_train_tests(TCase *tc);
/* test_model_backend_layout.c: NHWC against NCHW, bit for bit where backend.h says so. */
void add_layout_tests(TCase *tc);

#endif
