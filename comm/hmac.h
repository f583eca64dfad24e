/* hmac.h - SHA-256 and HMAC-SHA256 for the rendezvous' challenge and
 * response (comm/bootstrap.c). */
#ifndef GW_HMAC_H
#define GW_HMAC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gw_sha256 {
  uint32_t h[8];
  uint64_t len;
  uint8_t buf[64];
  size_t fill;
};
void gw__sha256_init(struct gw_sha256 *s);
void gw__sha256_update(struct gw_sha256 *s, const void *data, size_t n);
void gw__sha256_final(struct gw_sha256 *s, uint8_t out[32]);
/* HMAC-SHA256 of the concatenation of parts[0..nparts) under key. */
void gw__hmac_sha256(const void *key, size_t klen, const void *const *parts, const size_t *lens, int nparts,
                     uint8_t out[32]);
/* Whether a and b hold the same n bytes, in time independent of where they differ. */
bool gw__equal_ct(const void *a, const void *b, size_t n);

#endif
