/* bootstrap_internal.h - what bootstrap.c (the frames, a rank's side, the
 * exchanges) and bootstrap_root.c (rank 0 taking the ranks in) share. */
#ifndef GW_BOOTSTRAP_INTERNAL_H
#define GW_BOOTSTRAP_INTERNAL_H

#include "bootstrap.h"

/* Addresses of the master's name rank 0 listens on (an A and an AAAA record,
 * several A records): a rank whose resolver or route takes another one than
 * rank 0's first reaches it all the same. */
#define BOOT_MAX_LISTEN 4
/* Rank 0's socks[r] for a rank whose connection closed before the
 * rendezvous completed: not joined, told as such if it never comes back. */
#define BOOT_EXITED (-2)

struct gw_bootstrap {
  int rank, nranks;
  int *socks;      /* rank 0: socks[r] for r >= 1 (BOOT_EXITED: joined, then its process exited); others: socks[0] */
  char (*from)[64]; /* rank 0: the address rank r joined from (its messages name it; the master is rank 0's own) */
  int listen_fds[BOOT_MAX_LISTEN], nlisten; /* rank 0, until everyone joined */
  bool told_error; /* rank 0 sent ERROR frames: close those sockets gracefully */
  char master[300];
  double timeout_s;
};

gw_result_t gw__boot_send_frame(int fd, uint32_t kind, const void *data, size_t len, double deadline);
void gw__boot_sock_opts(int fd);
/* A fresh nonce (getrandom's, else the clock's). */
void gw__boot_nonce(uint8_t out[GW_BOOT_NONCE]);
/* Shuts our side, reads until the peer closes or the deadline, closes: the
 * peer reads our last frame (a reset would drop it). */
void gw__boot_close_gracefully(int fd, double deadline);
/* Rank 0 tells every joined rank but skip why the job cannot go on. */
void gw__boot_broadcast_error(struct gw_bootstrap *bs, int skip, const char *msg);
/* Rank 0: takes ranks 1..n-1 in until all have joined or the deadline passes. */
gw_result_t gw__boot_accept_all(struct gw_bootstrap *bs, const char *token, double deadline, struct gw_errctx *err);

#endif
