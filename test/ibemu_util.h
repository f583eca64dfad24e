/* ibemu_util.h - what the verbs emulator's tests share (test_ibemu.c,
 * test_ibemu_errors.c): endpoints (context, PD, CQ, a registered buffer),
 * queue pairs taken through INIT, RTR and RTS, writes and receives posted and
 * polled, and a responder in a forked process driven over pipes. */
#ifndef GW_TEST_IBEMU_UTIL_H
#define GW_TEST_IBEMU_UTIL_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#include "ibv.h"
#include "ibemu.h"

#define V (&gw__ibv_emu)

/* Set in forked helpers: REQUIRE prints and exits 1 there. */
extern int in_child;

/* A failed check: in a forked helper it prints and exits 1, in the test it aborts. */
#define REQUIRE(cond, ...)                                                           \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      if (in_child) {                                                                \
        fprintf(stderr, "ibemu child %s:%d: ", __FILE__, __LINE__);                  \
        fprintf(stderr, __VA_ARGS__);                                                \
        fputc('\n', stderr);                                                         \
        _exit(1);                                                                    \
      }                                                                              \
      ck_abort_msg(__VA_ARGS__);                                                     \
    }                                                                                \
  } while (0)

/* ---- one endpoint: context, PD, CQ, a registered buffer ------------------------- */
struct ep {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_mr *mr;
  uint8_t *buf;
  size_t len;
  struct ibv_port_attr port;
};
struct info { /* what a peer needs to reach a QP and a buffer */
  uint16_t lid;
  uint32_t qpn, rkey;
  uint64_t addr;
  union ibv_gid gid[2];
};
struct params {
  uint8_t timeout, retry_cnt, rnr_retry, min_rnr_timer;
  int gid_index; /* -1: route by LID */
};
extern const struct params defaults; /* timeout 14, 7 retries, 7 RNR retries, RNR timer 1, by LID */

/* ---- the responder: a forked process driven by commands over pipes --------------- */
enum { CMD_QP = 1, CMD_RECV, CMD_POLL, CMD_CHECK, CMD_REREG, CMD_EXIT };
struct cmd {
  int op, n, seq;
  struct info peer;
  struct params prm;
  uint64_t off, len;
  uint32_t seed;
  double timeout;
};
struct reply {
  int rc, n, state;
  struct info info;
  struct ibv_wc wc[16];
};
struct chan {
  int rd, wr;
  pid_t pid;
};
#define RBUF ((2u << 20) + 8192)

double now(void); /* CLOCK_MONOTONIC, seconds */
/* A byte pattern by seed; the bytes of p[0, len) that differ from it. */
void fill(uint8_t *p, size_t len, uint32_t seed);
size_t mismatches(const uint8_t *p, size_t len, uint32_t seed);

/* Opens device dev with a CQ of cqe entries and a zeroed buffer of len bytes
 * registered for local and remote writes. */
void ep_open(struct ep *e, int dev, size_t len, int cqe);
struct ibv_qp *ep_qp(struct ep *e, uint32_t sq, uint32_t rq, uint32_t inl); /* an RC QP on e's CQ */
struct info ep_info(struct ep *e, struct ibv_qp *qp);                        /* qp may be NULL */
void ep_close(struct ep *e);
/* The state changes (their modify_qp result), and all three (REQUIREd). */
int to_init(struct ibv_qp *qp);
int to_rtr(struct ibv_qp *qp, const struct info *peer, const struct params *p);
int to_rts(struct ibv_qp *qp, const struct params *p);
void qp_connect(struct ibv_qp *qp, const struct info *peer, const struct params *p);
/* One RDMA WRITE (WITH IMM when imm); post_send's result. */
int post_write(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sge, int nsge, uint64_t raddr, uint32_t rkey,
               int imm, uint32_t immval, unsigned flags);
int post_recvs(struct ibv_qp *qp, int n, uint64_t *next_id); /* n receives, wr_ids from *next_id */
/* Polls until n completions or the timeout; returns how many came. */
int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n, double timeout);
/* The next completion on e's CQ (within 10 s) is wr_id's with that status. */
void expect_status(struct ep *e, uint64_t wr_id, int status);

/* The responder: started (alarm 60 s), a command and its reply, a command
 * sent and its reply awaited apart, told to exit and reaped (exit 0 REQUIREd). */
struct chan spawn_responder(void);
struct reply rpc(struct chan *ch, struct cmd c);
void rpc_send(struct chan *ch, struct cmd c);
struct reply rpc_wait(struct chan *ch);
void finish(struct chan *ch);
/* A fresh QP here, connected both ways to a fresh QP of the responder, which
 * posts nrecv receives; returns the responder's info. */
struct info pair(struct chan *ch, struct ep *e, struct ibv_qp *qp, const struct params *mine,
                 const struct params *theirs, int nrecv);

#endif
