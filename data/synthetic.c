/* synthetic.c - samples made from (seed, index) alone, for throughput runs that
 * should measure the model and the communication, not the disk or the decoder:
 * values uniform in [-1, 1), a label uniform over the classes.  Nothing is
 * stored, so any size costs no memory. */
#include <stdio.h>
#include <stdlib.h>

#include "data_internal.h"

struct synthetic {
  struct gw_dataset base;
  uint64_t seed;
};

static gw_result_t synthetic_get(const struct gw_dataset *ds, int64_t index, int train, uint64_t key, float *out,
                                 int32_t *label) {
  const struct synthetic *s = (const struct synthetic *)ds;
  struct gw_rng r;
  /* The sample depends on (seed, index) only: train and key do not change it. */
  gw__rng_from_key(&r, gw__mix64(s->seed ^ gw__mix64((uint64_t)index + 0x51a7e71c5a3b1e5dull)));
  *label = (int32_t)gw__rng_below(&r, (uint64_t)ds->classes);
  size_t n = gw_dataset_sample_floats(ds);
  for (size_t i = 0; i < n; i++) out[i] = (float)((int64_t)(gw__rng_next(&r) >> 40) - (1 << 23)) * 0x1p-23f;
  return GW_SUCCESS;
}

static void synthetic_destroy(struct gw_dataset *ds) { free(ds); }

static const struct gw_dataset_ops SYNTHETIC_OPS = {synthetic_get, synthetic_destroy};

gw_result_t gw_dataset_synthetic(struct gw_dataset **ds, int64_t samples, int channels, int size, int classes,
                                 uint64_t seed) {
  *ds = NULL;
  if (samples < 1 || channels < 1 || size < 1 || classes < 1 || (int64_t)channels * size * size > (1 << 28))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "synthetic: %lld samples of %d x %d x %d, %d classes: every number must be positive and a "
                          "sample at most 2^28 values",
                          (long long)samples, channels, size, size, classes);
  struct synthetic *s = calloc(1, sizeof *s);
  if (!s) return gw__model_fail(GW_ERR_SYSTEM, "synthetic: out of memory");
  s->base.ops = &SYNTHETIC_OPS;
  s->base.size = samples;
  s->base.c = channels;
  s->base.h = s->base.w = size;
  s->base.classes = classes;
  s->seed = seed;
  const int64_t params[5] = {samples, channels, size, classes, (int64_t)seed};
  s->base.fingerprint = gw__fnv(GW_FNV_START, params, sizeof params);
  snprintf(s->base.description, sizeof s->base.description, "synthetic (%lld samples of %dx%dx%d, %d classes)",
           (long long)samples, channels, size, size, classes);
  *ds = &s->base;
  return GW_SUCCESS;
}
