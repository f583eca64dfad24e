/* sampler.c - PyTorch DistributedSampler's index rules over our own seeded
 * shuffle; see sampler.h. */
#include "sampler.h"

#include <stdlib.h>

#include "data_internal.h"

gw_result_t gw_sampler_init(struct gw_sampler *s, int64_t n, int world, int rank, int shuffle, int drop_last,
                            uint64_t seed) {
  if (n < 1 || world < 1 || rank < 0 || rank >= world)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "sampler: %lld samples, rank %d of %d: need n >= 1 and 0 <= rank < world",
                          (long long)n, rank, world);
  /* Every epoch's order is n indices in memory (8 bytes each): 2^40 of them
   * would be 8 TiB, and n * 8 must not wrap a size_t. */
  if (n > GW_SAMPLER_MAX_SAMPLES)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "sampler: %lld samples: at most %lld (2^40)", (long long)n,
                          (long long)GW_SAMPLER_MAX_SAMPLES);
  if (drop_last && n < world)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "sampler: drop_last with %lld samples over %d ranks leaves every rank nothing", (long long)n,
                          world);
  s->n = n;
  s->world = world;
  s->rank = rank;
  s->shuffle = shuffle;
  s->drop_last = drop_last;
  s->seed = seed;
  /* PyTorch: ceil((n - world) / world) with drop_last and a remainder, which is
   * floor(n / world); ceil(n / world) otherwise. */
  s->num_samples = drop_last ? n / world : (n + world - 1) / world;
  return GW_SUCCESS;
}

gw_result_t gw_sampler_order(const struct gw_sampler *s, int64_t epoch, int64_t *order) {
  for (int64_t i = 0; i < s->n; i++) order[i] = i;
  if (!s->shuffle) return GW_SUCCESS;
  struct gw_rng r;
  /* A stream per (seed, epoch); the constant keeps seed 0 epoch 0 off the zero state. */
  gw__rng_from_key(&r, gw__mix64(gw__mix64(s->seed + 0x243f6a8885a308d3ull) ^ (uint64_t)epoch));
  for (int64_t i = s->n - 1; i > 0; i--) { /* Fisher-Yates */
    int64_t j = (int64_t)gw__rng_below(&r, (uint64_t)i + 1);
    int64_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  return GW_SUCCESS;
}

gw_result_t gw_sampler_shard(const struct gw_sampler *s, int64_t epoch, int64_t *shard) {
  int64_t *order = malloc((size_t)s->n * sizeof *order);
  if (!order) return gw__model_fail(GW_ERR_SYSTEM, "sampler: out of memory for %lld indices", (long long)s->n);
  gw_sampler_order(s, epoch, order);
  /* Entry k of the padded list is order[k % n]: padding repeats from the start
   * (as often as needed when n < world), and with drop_last no k reaches n. */
  for (int64_t i = 0; i < s->num_samples; i++) shard[i] = order[(s->rank + i * s->world) % s->n];
  free(order);
  return GW_SUCCESS;
}
