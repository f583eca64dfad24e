/* sampler.h - which dataset indices a rank reads in an epoch, with PyTorch's
 * DistributedSampler semantics: the epoch's order is a shuffle seeded by
 * (seed, epoch) (or 0 .. n-1 without shuffle, for evaluation); without drop_last
 * it is padded to ceil(n / world) * world entries by repeating from its start, with
 * drop_last cut to floor(n / world) * world; rank r takes entries r, r + world, ...
 *
 * The shuffle is our own (splitmix64 + Fisher-Yates), not torch.randperm: the same
 * rules, other permutations.  A sampler is a plain value with no state beyond its
 * configuration; the position within an epoch is the loader's. */
#ifndef GW_DATA_SAMPLER_H
#define GW_DATA_SAMPLER_H

#include <stdint.h>

#include "gradwire.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gw_sampler {
  int64_t n;           /* dataset size */
  int world, rank;
  int shuffle;
  int drop_last;
  uint64_t seed;
  int64_t num_samples; /* per rank: ceil(n / world), or floor(n / world) with drop_last */
};

/* The most samples a sampler takes (2^40: an epoch's order is n int64s). */
#define GW_SAMPLER_MAX_SAMPLES (1ll << 40)

/* Checks and fills s (GW_ERR_INVALID_ARGUMENT, with gw_data_last_error(), for
 * n < 1 or above GW_SAMPLER_MAX_SAMPLES, rank outside [0, world), or drop_last
 * leaving a rank nothing). */
gw_result_t gw_sampler_init(struct gw_sampler *s, int64_t n, int world, int rank, int shuffle, int drop_last,
                            uint64_t seed);

/* The epoch's whole order before padding or cutting: order [n]. */
gw_result_t gw_sampler_order(const struct gw_sampler *s, int64_t epoch, int64_t *order);

/* This rank's indices for the epoch: shard [num_samples]; GW_ERR_SYSTEM when out
 * of memory (it needs n indices of scratch). */
gw_result_t gw_sampler_shard(const struct gw_sampler *s, int64_t epoch, int64_t *shard);

#ifdef __cplusplus
}
#endif
#endif /* GW_DATA_SAMPLER_H */
