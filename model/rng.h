/* rng.h - the model's deterministic random numbers: splitmix64 streams (a 64-bit
 * counter through a strong mixer), uniform and normal draws.  Streams are keyed by
 * (seed, a name) so a tensor's initial values depend only on the seed and its name.
 * Not PyTorch's generator: weights made here match PyTorch in distribution, and
 * exact comparisons go through exported weights instead. */
#ifndef GW_MODEL_RNG_H
#define GW_MODEL_RNG_H

#include <math.h>
#include <stdint.h>

struct gw_rng {
  uint64_t state;
  double spare;   /* the second value of the last Box-Muller pair */
  int has_spare;
};

static inline uint64_t gw__mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A stream for (seed, name): FNV-1a of the name, mixed with the seed. */
static inline void gw__rng_init(struct gw_rng *r, uint64_t seed, const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
  r->state = gw__mix64(seed ^ gw__mix64(h));
  r->has_spare = 0;
  r->spare = 0;
}

static inline uint64_t gw__rng_next(struct gw_rng *r) {
  r->state += 0x9e3779b97f4a7c15ull;
  return gw__mix64(r->state);
}

/* Uniform in [0, 1), 53 random bits. */
static inline double gw__rng_uniform(struct gw_rng *r) { return (double)(gw__rng_next(r) >> 11) * 0x1p-53; }

/* Standard normal (Box-Muller; u1 in (0, 1] so the logarithm is finite). */
static inline double gw__rng_normal(struct gw_rng *r) {
  if (r->has_spare) {
    r->has_spare = 0;
    return r->spare;
  }
  double u1 = (double)((gw__rng_next(r) >> 11) + 1) * 0x1p-53;
  double u2 = gw__rng_uniform(r);
  double rad = sqrt(-2.0 * log(u1)), ang = 6.283185307179586476925286766559 * u2;
  r->spare = rad * sin(ang);
  r->has_spare = 1;
  return rad * cos(ang);
}

#endif
