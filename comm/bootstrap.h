/* bootstrap.h - the out-of-band rendezvous: rank 0 serves a TCP socket at the
 * master address; every other rank connects, proves it belongs to the job with the
 * job token, and from then on small blobs (peer info, connection handles) are
 * allgathered through rank 0.  Used at setup time only, never on the data path. */
#ifndef GW_BOOTSTRAP_H
#define GW_BOOTSTRAP_H

#include <stddef.h>
#include <sys/socket.h>

#include "core.h"

struct gw_bootstrap;

/* Joins the rendezvous at master ("host:port" or "[v6]:port").  Every wait ends
 * after timeout_s seconds with a message naming who did not answer. */
gw_result_t gw__bootstrap_init(struct gw_bootstrap **out, int rank, int nranks, const char *master,
                               const char *token, double timeout_s, struct gw_errctx *err);
/* all[r * size .. ] = rank r's `mine`, on every rank. */
gw_result_t gw__bootstrap_allgather(struct gw_bootstrap *bs, const void *mine, void *all, size_t size,
                                    struct gw_errctx *err);
/* Routes records to the ranks they are for: each rank gives `count` records
 * of `size` bytes whose first 4 bytes are an int32 destination rank (-1:
 * none); each rank gets the records for it, at most max_out, in out (with
 * their origin ranks in origin[], in origin order) and their number in *nout.
 * Rank 0 relays them, sending each rank only its own: O(n k) bytes where an
 * allgather of the same records is O(n^2 k) (36 GB from rank 0 for the
 * connection handles at 4096 ranks). */
gw_result_t gw__bootstrap_route(struct gw_bootstrap *bs, const void *recs, int count, size_t size, void *out,
                                int32_t *origin, int max_out, int *nout, struct gw_errctx *err);
/* Payload bytes rank 0 has sent in answers (allgather, route) so far (tests). */
uint64_t gw__bootstrap_root_bytes(void);
gw_result_t gw__bootstrap_barrier(struct gw_bootstrap *bs, struct gw_errctx *err);
/* This rank failed on its own during setup (an interface with no address, a
 * full /dev/shm): the others hear msg at their next exchange, not "lost the
 * bootstrap connection to rank r" (rank 0 tells them all; another rank tells
 * rank 0, which names it to the rest).  Best effort, a second at most. */
void gw__bootstrap_fail(struct gw_bootstrap *bs, const char *msg);
void gw__bootstrap_free(struct gw_bootstrap *bs);

/* The address other ranks can reach this one at: GW_SOCKET_IFNAME's address when
 * set, else the local end of the route to the master (rank 0: the master
 * address itself).  The port is unspecified. */
gw_result_t gw__bootstrap_local_addr(struct gw_bootstrap *bs, struct sockaddr_storage *addr, socklen_t *len,
                                     struct gw_errctx *err);

/* Splits "host:port" / "[v6]:port"; false when malformed. */
bool gw__parse_host_port(const char *s, char *host, size_t hostlen, char *port, size_t portlen);

/* The wire format of the hello, exposed for the tests and the fuzzer.  The
 * job token never travels: rank 0 sends a CHALLENGE (a fresh nonce), the rank
 * answers with a HELLO carrying HMAC-SHA256(token, "gradwire rank" | that
 * nonce | rank | nranks) and a nonce of its own, and rank 0 answers a rank it
 * admits with a PROOF, HMAC-SHA256(token, "gradwire root" | the rank's nonce |
 * its own | rank | nranks), which the rank checks before it trusts anything
 * rank 0 sends (the peers' addresses).  "GWB2": the token went in the clear to
 * whatever listened on the master port first (a port squatter learned it, and
 * could answer as rank 0). */
#define GW_BOOT_MAGIC 0x32425747u /* "GWB2" */
#define GW_BOOT_TOKEN_MAX 128
#define GW_BOOT_NONCE 16
enum { GW_BOOT_HELLO = 1, GW_BOOT_DATA = 2, GW_BOOT_ERROR = 3, GW_BOOT_CHALLENGE = 4, GW_BOOT_PROOF = 5 };
struct gw_boot_frame {
  uint32_t magic;
  uint32_t kind;
  uint64_t len; /* payload bytes following */
};
struct gw_boot_hello {
  int32_t rank;
  int32_t nranks;
  uint8_t nonce[GW_BOOT_NONCE]; /* the rank's, for rank 0's proof */
  uint8_t mac[32];
};
/* The MACs of the exchange (bootstrap.c): which 0 the rank's, 1 rank 0's. */
void gw__boot_mac(const char *token, int which, const uint8_t challenge[GW_BOOT_NONCE],
                  const uint8_t rank_nonce[GW_BOOT_NONCE], int32_t rank, int32_t nranks, uint8_t out[32]);

#endif
