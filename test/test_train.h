/* test_train.h - what test_train.c's cases share with the other test_train_*.c. */
#ifndef GW_TEST_TRAIN_H
#define GW_TEST_TRAIN_H

#include <check.h>
#include <stddef.h>

#include "gwrun_helpers.h"

/* The tests' scratch folder (made by main, removed at the end). */
extern char tmpdir[256];

/* The gw-train binary under test (GW_TRAIN_BIN). */
const char *train_bin(void);
/* tmpdir/name. */
void path(char *out, size_t cap, const char *name);

/* A narrow ResNet-18 on 16x16 inputs, its seed and schedule. */
#define TINY_MODEL                                                                                               \
  "--model", "resnet18", "--width-divisor", "8", "--in-channels", "3", "--image-size", "16", "--classes", "4",   \
      "--stem", "small", "--seed", "5", "--warmup-epochs", "0", "--lr", "0.4"
/* It on 96 synthetic samples: each run takes seconds. */
#define COMMON "--data", "synthetic", "--synthetic-samples", "96", TINY_MODEL, "--no-eval", "--threads", "1"
/* With the evaluation, on 32 samples: 4 steps per epoch of batch 8. */
#define EVAL_COMMON "--data", "synthetic", "--synthetic-samples", "32", TINY_MODEL, "--threads", "1"

/* gw-run -n ranks gw-train COMMON extra..., waiting up to 120 s. */
void train(struct run *r, const char *const *env, const char *ranks, const char *const *extra);
/* The same with base... (NULL-terminated) instead of COMMON. */
void train_from(struct run *r, const char *const *env, const char *ranks, const char *const *base,
                const char *const *extra);
void expect_ok(struct run *r);
/* gw-train alone (1 rank) with args refused before any work, its message holding words. */
void refused(const char *const *args, const char *words);
/* Whether files a and b hold the same bytes (both must exist). */
int same_file(const char *a, const char *b);
/* The whole of file tmpdir/name (free it). */
char *slurp(const char *name, size_t *len);

/* The value of `key` in each training line of metrics file `file`, by step
 * (val[step - 1]); returns how many lines had it. */
int metrics_by_step(const char *file, const char *key, char val[][32], int max);

/* COMMON's initial weights, saved as tmpdir/init_name, written again to `out`
 * with every value of tensor `name` set to v. */
void weights_with(const char *init_name, const char *out, const char *name, float v);

struct gw_st_file;
/* The weights file tmpdir/name, opened (gw_st_free it). */
struct gw_st_file *open_st(const char *name);
/* Tensor `name` of f as floats, copied (free it); its count in *n. */
float *floats(struct gw_st_file *f, const char *name, size_t *n);

/* test_train_ckpt.c's, for the temporary files of dead and live saves:
 * whether a file exists; files standing for others' (temporary files,
 * names the writer never makes), one line each, modified age seconds ago;
 * a live writer's temporary file write-locked (an OFD lock) as gw_st_write
 * holds it until its rename, its descriptor returned (close it). */
int exists(const char *file);
void plant(const char *const *files, int n, long age);
int lock_live(const char *file);

/* test_train_weights.c's, test_train_ckpt.c's, test_train_sched.c's and test_train_restart.c's cases. */
void add_weights_tests(TCase *tc);
/* test_train_weights.c's runs whose weights are compared with another way to
 * the same result (the `numerics` case: 16-bit wires and AMP against float32,
 * 2 ranks against 1, weight decay, loss scaling). */
void add_weights_numerics_tests(TCase *tc);
void add_data_tests(TCase *tc); /* test_train_data.c */
void add_ranks_tests(TCase *tc); /* test_train_ranks.c */
void add_checkpoint_tests(TCase *tc);
/* test_train_ckpt_meta.c's cases (added by add_checkpoint_tests). */
void add_checkpoint_meta_tests(TCase *tc);
/* test_train_ckpt.c's checkpoint rewriters, shared with test_train_ckpt_meta.c:
 * rewrite_as rewrites checkpoint `file` in format `version` (NULL: version 1)
 * with the checksum its writer would make, leaving out tensor `skip` (NULL:
 * none), keeping its metadata or, with `config`, only format and that config;
 * as_version1 is rewrite_as(file, skip, config, NULL); four_steps trains 4
 * steps into dir (ckpt-2 and ckpt-4). */
void rewrite_as(const char *file, const char *skip, const char *config, const char *version);
void as_version1(const char *file, const char *skip, const char *config);
void four_steps(const char *dir);
void add_schedule_tests(TCase *tc);
void add_restart_tests(TCase *tc);

#endif
