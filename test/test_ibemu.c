/* test_ibemu.c - the user-space verbs emulator (transport/ibemu.c) against the
 * verbs contract: devices, ports and GIDs; the RC state machine and its errnos;
 * RDMA WRITE and WRITE WITH IMM between two processes (a forked responder driven
 * over pipes) and within one; key, bounds and protection errors on both ends;
 * receiver-not-ready and dead-remote retries with their timing; flushes; SQ, RQ
 * and CQ limits; the simulated locked-memory limit.  Every child process runs
 * under alarm(), so a hang fails the test instead of stalling it. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ibv.h"
#include "ibemu.h"

static const struct gw_ibv *V = &gw__ibv_emu;
static int in_child;

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

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint8_t pat(uint64_t i, uint32_t seed) { return (uint8_t)(((i * 2654435761u) >> 13) ^ seed); }
static void fill(uint8_t *p, size_t len, uint32_t seed) {
  for (size_t i = 0; i < len; i++) p[i] = pat(i, seed);
}
static size_t mismatches(const uint8_t *p, size_t len, uint32_t seed) {
  size_t bad = 0;
  for (size_t i = 0; i < len; i++) bad += p[i] != pat(i, seed);
  return bad;
}

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
static const struct params defaults = {14, 7, 7, 1, -1};

static void ep_open(struct ep *e, int dev, size_t len, int cqe) {
  int n = 0;
  struct ibv_device **list = V->get_device_list(&n);
  REQUIRE(list && n > dev, "device %d of %d", dev, n);
  memset(e, 0, sizeof *e);
  e->ctx = V->open_device(list[dev]);
  V->free_device_list(list);
  REQUIRE(e->ctx, "open_device: %s", strerror(errno));
  REQUIRE(V->query_port(e->ctx, 1, &e->port) == 0, "query_port");
  e->pd = V->alloc_pd(e->ctx);
  e->cq = V->create_cq(e->ctx, cqe, NULL, NULL, 0);
  e->len = len;
  e->buf = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
  REQUIRE(e->pd && e->cq && e->buf, "pd/cq/buffer");
  memset(e->buf, 0, len);
  e->mr = V->reg_mr(e->pd, e->buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(e->mr, "reg_mr: %s", strerror(errno));
}

static struct ibv_qp *ep_qp(struct ep *e, uint32_t sq, uint32_t rq, uint32_t inl) {
  struct ibv_qp_init_attr a = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
                               .cap = {.max_send_wr = sq, .max_recv_wr = rq, .max_send_sge = 4,
                                       .max_recv_sge = 1, .max_inline_data = inl}};
  struct ibv_qp *qp = V->create_qp(e->pd, &a);
  REQUIRE(qp, "create_qp: %s", strerror(errno));
  return qp;
}

static struct info ep_info(struct ep *e, struct ibv_qp *qp) {
  struct info i = {.lid = e->port.lid, .qpn = qp ? qp->qp_num : 0, .rkey = e->mr->rkey,
                   .addr = (uintptr_t)e->buf};
  for (int k = 0; k < 2; k++) REQUIRE(V->query_gid(e->ctx, 1, k, &i.gid[k]) == 0, "query_gid");
  return i;
}

static void ep_close(struct ep *e) {
  REQUIRE(V->dereg_mr(e->mr) == 0 && V->destroy_cq(e->cq) == 0 && V->dealloc_pd(e->pd) == 0, "teardown");
  REQUIRE(V->close_device(e->ctx) == 0, "close_device");
  free(e->buf);
}

static int to_init(struct ibv_qp *qp) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                          .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE};
  return V->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct ibv_qp *qp, const struct info *peer, const struct params *p) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096, .dest_qp_num = peer->qpn,
                          .max_dest_rd_atomic = 1, .min_rnr_timer = p->min_rnr_timer,
                          .ah_attr = {.dlid = peer->lid, .port_num = 1}};
  if (p->gid_index >= 0) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer->gid[p->gid_index];
    a.ah_attr.grh.sgid_index = (uint8_t)p->gid_index;
    a.ah_attr.grh.hop_limit = 1;
  }
  return V->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct ibv_qp *qp, const struct params *p) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .timeout = p->timeout, .retry_cnt = p->retry_cnt,
                          .rnr_retry = p->rnr_retry, .max_rd_atomic = 1};
  return V->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void qp_connect(struct ibv_qp *qp, const struct info *peer, const struct params *p) {
  int r1 = to_init(qp), r2 = to_rtr(qp, peer, p), r3 = to_rts(qp, p);
  REQUIRE(!r1 && !r2 && !r3, "connect: %d %d %d", r1, r2, r3);
}

static int post_write(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sge, int nsge, uint64_t raddr,
                      uint32_t rkey, int imm, uint32_t immval, unsigned flags) {
  struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = sge, .num_sge = nsge, .send_flags = flags,
                           .opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                           .imm_data = htonl(immval), .wr.rdma = {.remote_addr = raddr, .rkey = rkey}},
                     *bad = NULL;
  int r = V->post_send(qp, &wr, &bad);
  REQUIRE(r == 0 || bad == &wr, "bad_wr not set on failure %d", r);
  return r;
}

static int post_recvs(struct ibv_qp *qp, int n, uint64_t *next_id) {
  for (int i = 0; i < n; i++) {
    struct ibv_recv_wr wr = {.wr_id = (*next_id)++}, *bad = NULL;
    int r = V->post_recv(qp, &wr, &bad);
    if (r) return r;
  }
  return 0;
}

/* Polls until n completions or the timeout; returns how many came. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n, double timeout) {
  int got = 0;
  double end = now() + timeout;
  while (got < n && now() < end) {
    int k = V->poll_cq(cq, n - got, wc + got);
    REQUIRE(k >= 0, "poll_cq %d", k);
    got += k;
  }
  return got;
}

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

static void chan_put(int fd, const void *p, size_t len) { REQUIRE(write(fd, p, len) == (ssize_t)len, "pipe write"); }
static int chan_get(int fd, void *p, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t k = read(fd, (char *)p + got, len - got);
    if (k <= 0) return 0;
    got += (size_t)k;
  }
  return 1;
}

#define RBUF ((2u << 20) + 8192)

/* Polls n inbound completions; with seq, checks imm = seed + i, consecutive
 * wr_ids and success, and reposts a receive for each. */
static void responder_poll(struct ep *e, struct ibv_qp *qp, const struct cmd *c, struct reply *r, uint64_t *rid) {
  double end = now() + c->timeout;
  uint64_t want_id = 0;
  while (r->n < c->n && now() < end) {
    struct ibv_wc wc;
    int k = V->poll_cq(e->cq, 1, &wc);
    REQUIRE(k >= 0, "poll");
    if (!k) continue;
    if (r->n < 16) r->wc[r->n] = wc;
    if (c->seq) {
      if (r->n == 0) want_id = wc.wr_id;
      r->rc += wc.status != IBV_WC_SUCCESS || ntohl(wc.imm_data) != c->seed + (uint32_t)r->n ||
               wc.wr_id != want_id++ || !(wc.wc_flags & IBV_WC_WITH_IMM);
      REQUIRE(post_recvs(qp, 1, rid) == 0, "repost");
    }
    r->n++;
  }
  r->state = qp->state;
}

static int responder(struct chan *ch) {
  struct ep e;
  ep_open(&e, 0, RBUF, 4096);
  struct ibv_qp *qp = NULL;
  uint64_t rid = 0;
  struct cmd c;
  while (chan_get(ch->rd, &c, sizeof c)) {
    struct reply r = {0};
    switch (c.op) {
    case CMD_QP:
      if (qp) REQUIRE(V->destroy_qp(qp) == 0, "destroy_qp");
      qp = ep_qp(&e, 64, 512, 0);
      qp_connect(qp, &c.peer, &c.prm);
      r.rc = post_recvs(qp, c.n, &rid);
      r.info = ep_info(&e, qp);
      break;
    case CMD_RECV: r.rc = post_recvs(qp, c.n, &rid); break;
    case CMD_POLL: responder_poll(&e, qp, &c, &r, &rid); break;
    case CMD_CHECK: r.rc = (int)mismatches(e.buf + c.off, c.len, c.seed); break;
    case CMD_REREG: /* the old rkey dies; a new MR takes its place */
      REQUIRE(V->dereg_mr(e.mr) == 0, "dereg");
      e.mr = V->reg_mr(e.pd, e.buf, e.len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
      REQUIRE(e.mr, "rereg");
      r.info = ep_info(&e, qp);
      break;
    case CMD_EXIT:
      if (qp) V->destroy_qp(qp);
      ep_close(&e);
      chan_put(ch->wr, &r, sizeof r);
      return 0;
    }
    chan_put(ch->wr, &r, sizeof r);
  }
  return 1;
}

static struct chan spawn_responder(void) {
  int down[2], up[2];
  REQUIRE(pipe(down) == 0 && pipe(up) == 0, "pipe");
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    in_child = 1;
    alarm(60);
    close(down[1]), close(up[0]);
    struct chan ch = {down[0], up[1], 0};
    _exit(responder(&ch));
  }
  close(down[0]), close(up[1]);
  return (struct chan){up[0], down[1], pid};
}

static struct reply rpc(struct chan *ch, struct cmd c) {
  struct reply r;
  chan_put(ch->wr, &c, sizeof c);
  REQUIRE(chan_get(ch->rd, &r, sizeof r), "the responder died (command %d)", c.op);
  return r;
}

static void rpc_send(struct chan *ch, struct cmd c) { chan_put(ch->wr, &c, sizeof c); }
static struct reply rpc_wait(struct chan *ch) {
  struct reply r;
  REQUIRE(chan_get(ch->rd, &r, sizeof r), "the responder died");
  return r;
}

static void finish(struct chan *ch) {
  rpc(ch, (struct cmd){.op = CMD_EXIT});
  int st = 0;
  REQUIRE(waitpid(ch->pid, &st, 0) == ch->pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "responder status %d", st);
  close(ch->rd), close(ch->wr);
}

/* A fresh QP here, connected both ways to a fresh QP of the responder, which
 * posts nrecv receives; returns the responder's info. */
static struct info pair(struct chan *ch, struct ep *e, struct ibv_qp *qp, const struct params *mine,
                        const struct params *theirs, int nrecv) {
  struct reply r = rpc(ch, (struct cmd){.op = CMD_QP, .n = nrecv, .peer = ep_info(e, qp), .prm = *theirs});
  REQUIRE(r.rc == 0, "responder post_recv %d", r.rc);
  qp_connect(qp, &r.info, mine);
  return r.info;
}

/* ---- 1. devices, ports, GIDs ----------------------------------------------------------- */
static void check_port(const char *link) {
  setenv("GW_IB_EMULATE_LINK", link, 1);
  int eth = !strcmp(link, "eth");
  struct ep a, b;
  ep_open(&a, 1, 4096, 16);
  ep_open(&b, 2, 4096, 16);
  ck_assert_int_eq(a.port.state, IBV_PORT_ACTIVE);
  ck_assert_int_eq(a.port.active_mtu, IBV_MTU_4096);
  /* mlx5's table: InfiniBand 0 link-local, 1 IPv4-mapped; RoCE 0/1 link-local
   * v1/v2, 2/3 IPv4-mapped v1/v2 */
  const int n = eth ? 4 : 2;
  ck_assert_int_eq(a.port.gid_tbl_len, n);
  ck_assert_int_eq(a.port.link_layer, eth ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND);
  struct info ia = ep_info(&a, NULL), ib = ep_info(&b, NULL);
  uint16_t la = (uint16_t)(ia.gid[0].raw[14] << 8 | ia.gid[0].raw[15]);
  uint16_t lb = (uint16_t)(ib.gid[0].raw[14] << 8 | ib.gid[0].raw[15]);
  ck_assert(la != 0 && lb != 0 && la != lb);
  ck_assert_int_eq(a.port.lid, eth ? 0 : la);
  for (int i = 0; i < n; i++) {
    struct ibv_gid_entry e;
    ck_assert_int_eq(V->query_gid_ex(a.ctx, 1, (uint32_t)i, &e, 0), 0);
    const int v4 = eth ? i >= 2 : i == 1;
    ck_assert_int_eq(e.gid_type, !eth ? IBV_GID_TYPE_IB : i % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1);
    ck_assert(e.gid_index == (uint32_t)i && e.port_num == 1);
    if (v4) ck_assert(e.gid.raw[10] == 0xff && e.gid.raw[11] == 0xff && e.gid.raw[12] == 127);
    else ck_assert(e.gid.raw[0] == 0xfe && e.gid.raw[1] == 0x80);
    ck_assert_int_eq(e.gid.raw[14] << 8 | e.gid.raw[15], la);
    union ibv_gid g;
    ck_assert_int_eq(V->query_gid(a.ctx, 1, i, &g), 0);
    ck_assert(!memcmp(g.raw, e.gid.raw, 16));
  }
  struct ibv_port_attr pa;
  union ibv_gid g;
  struct ibv_gid_entry e;
  ck_assert_int_eq(V->query_port(a.ctx, 2, &pa), EINVAL);
  ck_assert_int_eq(V->query_gid(a.ctx, 1, n, &g), EINVAL);
  ck_assert_int_eq(V->query_gid(a.ctx, 1, -1, &g), EINVAL);
  ck_assert_int_eq(V->query_gid_ex(a.ctx, 1, (uint32_t)n, &e, 0), EINVAL);
  ep_close(&a);
  ep_close(&b);
}

START_TEST(test_devices) {
  setenv("GW_IB_EMULATE_DEVICES", "3", 1);
  int n = -1;
  struct ibv_device **list = V->get_device_list(&n);
  ck_assert_int_eq(n, 3);
  ck_assert_str_eq(V->get_device_name(list[0]), "gwemu0");
  ck_assert_str_eq(V->get_device_name(list[2]), "gwemu2");
  ck_assert_ptr_null(list[3]);
  struct ibv_context *ctx = V->open_device(list[1]);
  V->free_device_list(list);
  ck_assert_ptr_nonnull(ctx);
  struct ibv_device_attr da;
  ck_assert_int_eq(V->query_device(ctx, &da), 0);
  ck_assert(da.max_qp_wr == 4096 && da.max_sge == 16 && da.phys_port_cnt == 1 && da.max_mr > 0);
  ck_assert_int_eq(V->close_device(ctx), 0);
  check_port("ib");
  check_port("eth");
}
END_TEST

/* ---- 2. the QP state machine and the post checks ------------------------------------ */
START_TEST(test_state_machine) {
  struct ep e;
  ep_open(&e, 0, 4096, 64);
  struct ibv_qp *qp = ep_qp(&e, 4, 4, 16), *other = ep_qp(&e, 4, 4, 0);
  struct info self = ep_info(&e, qp);
  struct params p = defaults;
  struct ibv_sge sge = {(uintptr_t)e.buf, 8, e.mr->lkey};
  uint64_t rid = 0;
  ck_assert_int_eq(qp->state, IBV_QPS_RESET);
  ck_assert_int_eq(post_write(qp, 1, &sge, 1, self.addr, self.rkey, 0, 0, 0), EINVAL);
  ck_assert_int_eq(post_recvs(qp, 1, &rid), EINVAL);
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
  ck_assert_int_eq(V->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
  a.port_num = 2;
  ck_assert_int_eq(V->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
                   EINVAL);
  ck_assert_int_eq(to_rtr(qp, &self, &p), EINVAL); /* RESET -> RTR skips INIT */
  ck_assert_int_eq(to_init(qp), 0);
  ck_assert_int_eq(qp->state, IBV_QPS_INIT);
  ck_assert_int_eq(post_write(qp, 1, &sge, 1, self.addr, self.rkey, 0, 0, 0), EINVAL);
  ck_assert_int_eq(post_recvs(qp, 1, &rid), 0);
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096, .dest_qp_num = qp->qp_num,
                           .ah_attr = {.dlid = self.lid, .port_num = 1}};
  ck_assert_int_eq(V->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC),
                   EINVAL); /* no MIN_RNR_TIMER */
  ck_assert_int_eq(to_rts(qp, &p), EINVAL);
  ck_assert_int_eq(to_rtr(qp, &self, &p), 0); /* loopback to itself */
  ck_assert_int_eq(post_write(qp, 1, &sge, 1, self.addr, self.rkey, 0, 0, 0), EINVAL);
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7};
  ck_assert_int_eq(V->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_SQ_PSN |
                                            IBV_QP_MAX_QP_RD_ATOMIC),
                   EINVAL); /* no RNR_RETRY */
  ck_assert_int_eq(to_rts(qp, &p), 0);
  ck_assert_int_eq(qp->state, IBV_QPS_RTS);
  /* Bad WRs in RTS: opcode, too many SGEs, inline too long. */
  struct ibv_send_wr wr = {.opcode = IBV_WR_SEND, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
  ck_assert_int_eq(V->post_send(qp, &wr, &bad), EINVAL);
  ck_assert_ptr_eq(bad, &wr);
  struct ibv_sge five[5] = {sge, sge, sge, sge, sge};
  ck_assert_int_eq(post_write(qp, 1, five, 5, self.addr, self.rkey, 0, 0, IBV_SEND_SIGNALED), EINVAL);
  struct ibv_sge big = {(uintptr_t)e.buf, 17, e.mr->lkey};
  ck_assert_int_eq(post_write(qp, 1, &big, 1, self.addr, self.rkey, 0, 0, IBV_SEND_INLINE), EINVAL);
  /* A good one: loopback into itself, consuming the receive posted in INIT. */
  fill(e.buf, 8, 5);
  ck_assert_int_eq(post_write(qp, 7, &sge, 1, self.addr + 64, self.rkey, 1, 42, IBV_SEND_SIGNALED), 0);
  struct ibv_wc wc[4];
  ck_assert_int_eq(poll_n(e.cq, wc, 2, 5), 2);
  ck_assert_int_eq(mismatches(e.buf + 64, 8, 5), 0);
  /* Unsupported creations and busy objects. */
  struct ibv_qp_init_attr ud = {.send_cq = e.cq, .recv_cq = e.cq, .qp_type = IBV_QPT_UD, .cap = {1, 1, 1, 1, 0}};
  errno = 0;
  ck_assert_ptr_null(V->create_qp(e.pd, &ud));
  ck_assert_int_eq(errno, EOPNOTSUPP);
  ck_assert_int_eq(V->destroy_cq(e.cq), EBUSY);
  ck_assert_int_eq(V->dealloc_pd(e.pd), EBUSY);
  /* The error state flushes what is posted afterwards; RESET clears and restarts. */
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_ERR};
  ck_assert_int_eq(V->modify_qp(qp, &a, IBV_QP_STATE), 0);
  ck_assert_int_eq(post_write(qp, 8, &sge, 1, self.addr, self.rkey, 0, 0, 0), 0);
  ck_assert_int_eq(post_recvs(qp, 1, &rid), 0);
  ck_assert_int_eq(poll_n(e.cq, wc, 2, 5), 2);
  ck_assert(wc[0].status == IBV_WC_WR_FLUSH_ERR && wc[1].status == IBV_WC_WR_FLUSH_ERR);
  a.qp_state = IBV_QPS_RESET;
  ck_assert_int_eq(V->modify_qp(qp, &a, IBV_QP_STATE), 0);
  ck_assert_int_eq(V->poll_cq(e.cq, 4, wc), 0);
  qp_connect(qp, &self, &p);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  ck_assert_int_eq(V->destroy_qp(other), 0);
  ep_close(&e);
}
END_TEST

/* ---- 3. two processes: data, immediates, ordering, SQ limits ---------------------- */
static void write_and_check(struct chan *ch, struct ep *e, struct ibv_qp *qp, const struct info *peer,
                            size_t size, int nsge, uint32_t seed, uint64_t *rid) {
  int imm = rid != NULL; /* then the responder's next receive, *rid, is consumed */
  size_t off = 4096 + 3;
  fill(e->buf, size, seed);
  struct ibv_sge sge[4];
  size_t at = 0;
  for (int i = 0; i < nsge; i++) { /* uneven pieces, the last one takes the rest */
    size_t piece = i == nsge - 1 ? size - at : (size - at) / 3;
    sge[i] = (struct ibv_sge){(uintptr_t)e->buf + at, (uint32_t)piece, e->mr->lkey};
    at += piece;
  }
  ck_assert_int_eq(post_write(qp, size, sge, nsge, peer->addr + off, peer->rkey, imm, seed, IBV_SEND_SIGNALED), 0);
  struct ibv_wc wc;
  ck_assert_int_eq(poll_n(e->cq, &wc, 1, 10), 1);
  ck_assert(wc.status == IBV_WC_SUCCESS && wc.wr_id == size && wc.opcode == IBV_WC_RDMA_WRITE);
  if (imm) {
    struct reply r = rpc(ch, (struct cmd){.op = CMD_POLL, .n = 1, .timeout = 10});
    ck_assert_int_eq(r.n, 1);
    ck_assert(r.wc[0].status == IBV_WC_SUCCESS && r.wc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
              (r.wc[0].wc_flags & IBV_WC_WITH_IMM) && ntohl(r.wc[0].imm_data) == seed &&
              r.wc[0].byte_len == size && r.wc[0].qp_num == peer->qpn && r.wc[0].wr_id == (*rid)++);
  }
  ck_assert_int_eq(rpc(ch, (struct cmd){.op = CMD_CHECK, .off = off, .len = size, .seed = seed}).rc, 0);
}

START_TEST(test_two_processes) {
  struct chan ch = spawn_responder();
  struct ep e;
  ep_open(&e, 0, RBUF, 64);
  enum { DEPTH = 64 };
  struct ibv_qp *qp = ep_qp(&e, DEPTH, 1, 0);
  struct info peer = pair(&ch, &e, qp, &defaults, &defaults, 4);
  static const size_t sizes[] = {1, 4096, (1u << 20) + 3};
  uint64_t rid = 0; /* the responder's receives have wr_id 0, 1, ... */
  for (int i = 0; i < 3; i++) {
    write_and_check(&ch, &e, qp, &peer, sizes[i], i == 0 ? 1 : 3, 10 + (uint32_t)i, NULL);
    write_and_check(&ch, &e, qp, &peer, sizes[i], i == 0 ? 1 : 3, 20 + (uint32_t)i, &rid);
  }
  write_and_check(&ch, &e, qp, &peer, 0, 0, 30, &rid); /* an immediate alone */

  /* 1000 writes with immediates, every 16th signaled, while the responder
   * checks their order; the SQ never overflows when completions are polled. */
  ck_assert_int_eq(rpc(&ch, (struct cmd){.op = CMD_RECV, .n = 500}).rc, 0);
  rpc_send(&ch, (struct cmd){.op = CMD_POLL, .n = 1000, .seq = 1, .seed = 1000, .timeout = 30});
  uint64_t covered = 0, expect_wr = 15;
  for (uint32_t i = 0; i < 1000;) {
    struct ibv_wc wc[8];
    int k = V->poll_cq(e.cq, 8, wc);
    for (int j = 0; j < k; j++) {
      ck_assert(wc[j].status == IBV_WC_SUCCESS && wc[j].wr_id == expect_wr);
      covered = wc[j].wr_id + 1, expect_wr += 16;
    }
    if (i - covered >= DEPTH) continue;
    struct ibv_sge sge = {(uintptr_t)e.buf + (i % 64) * 8, 8, e.mr->lkey};
    unsigned flags = i % 16 == 15 ? IBV_SEND_SIGNALED : 0;
    ck_assert_int_eq(post_write(qp, i, &sge, 1, peer.addr + (i % 64) * 8, peer.rkey, 1, 1000 + i, flags), 0);
    i++;
  }
  struct ibv_wc wc[8];
  while (expect_wr < 1000) {
    int k = poll_n(e.cq, wc, 1, 10);
    ck_assert_int_eq(k, 1);
    ck_assert(wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == expect_wr);
    expect_wr += 16;
  }
  struct reply r = rpc_wait(&ch);
  ck_assert_int_eq(r.n, 1000);
  ck_assert_int_eq(r.rc, 0);

  /* SQ full: unsignaled writes stay outstanding until a later signaled one is
   * polled, so with a signaled write first and DEPTH-1 unsignaled behind it the
   * queue is full, and polling the first frees only its own slot. */
  struct ibv_sge one = {(uintptr_t)e.buf, 1, e.mr->lkey};
  ck_assert_int_eq(post_write(qp, 4999, &one, 1, peer.addr, peer.rkey, 0, 0, IBV_SEND_SIGNALED), 0);
  ck_assert_int_eq(poll_n(e.cq, wc, 1, 10), 1); /* covers the unsignaled tail of the 1000 */
  for (int i = 0; i < DEPTH; i++)
    ck_assert_int_eq(post_write(qp, 5000 + i, &one, 1, peer.addr, peer.rkey, 0, 0, i == 0 ? IBV_SEND_SIGNALED : 0),
                     0);
  ck_assert_int_eq(post_write(qp, 6000, &one, 1, peer.addr, peer.rkey, 0, 0, 0), ENOMEM);
  ck_assert_int_eq(poll_n(e.cq, wc, 1, 10), 1);
  ck_assert_int_eq(wc[0].wr_id, 5000);
  ck_assert_int_eq(post_write(qp, 6001, &one, 1, peer.addr, peer.rkey, 0, 0, IBV_SEND_SIGNALED), 0);
  ck_assert_int_eq(post_write(qp, 6002, &one, 1, peer.addr, peer.rkey, 0, 0, 0), ENOMEM);
  ck_assert_int_eq(poll_n(e.cq, wc, 1, 10), 1);
  ck_assert_int_eq(wc[0].wr_id, 6001);
  ck_assert_int_eq(post_write(qp, 6003, &one, 1, peer.addr, peer.rkey, 0, 0, IBV_SEND_SIGNALED), 0);
  ck_assert_int_eq(poll_n(e.cq, wc, 1, 10), 1);
  finish(&ch);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  ep_close(&e);
}
END_TEST

/* ---- 4. loopback in one process: one context, and two contexts --------------------- */
/* Completions from both CQs (one CQ when a == b) until n came, in any order. */
static int poll_both(struct ep *a, struct ep *b, struct ibv_wc *wc, int n, double timeout) {
  int got = 0;
  double end = now() + timeout;
  while (got < n && now() < end) {
    got += V->poll_cq(a->cq, n - got, wc + got);
    if (b != a && got < n) got += V->poll_cq(b->cq, n - got, wc + got);
  }
  return got;
}

static void loopback(struct ep *a, struct ep *b) {
  struct ibv_qp *qa = ep_qp(a, 8, 8, 64), *qb = ep_qp(b, 8, 8, 64);
  struct info ia = ep_info(a, qa), ib = ep_info(b, qb);
  qp_connect(qa, &ib, &defaults);
  qp_connect(qb, &ia, &defaults);
  uint8_t *src = a->buf + (512 << 10);
  fill(src, 100000, 77);
  struct ibv_sge sge = {(uintptr_t)src, 100000, a->mr->lkey};
  ck_assert_int_eq(post_write(qa, 1, &sge, 1, ib.addr + 8192, ib.rkey, 0, 0, 0), 0);
  /* Inline data is taken at post time: the WR is blocked (no receive yet), the
   * source is changed, the receiver posts, and the original bytes arrive. */
  char msg[16] = "inline payload!";
  struct ibv_sge isge = {(uintptr_t)msg, sizeof msg, 0};
  ck_assert_int_eq(post_write(qa, 2, &isge, 1, ib.addr, ib.rkey, 1, 99, IBV_SEND_INLINE | IBV_SEND_SIGNALED), 0);
  memset(msg, 'X', sizeof msg);
  struct ibv_wc wc[2];
  ck_assert_int_eq(poll_both(a, b, wc, 1, 0.05), 0);
  uint64_t rid = 500;
  ck_assert_int_eq(post_recvs(qb, 1, &rid), 0);
  ck_assert_int_eq(poll_both(a, b, wc, 2, 5), 2);
  struct ibv_wc *snd = wc[0].opcode == IBV_WC_RDMA_WRITE ? &wc[0] : &wc[1], *rcv = snd == wc ? &wc[1] : &wc[0];
  ck_assert(snd->status == IBV_WC_SUCCESS && snd->wr_id == 2 && snd->qp_num == qa->qp_num);
  ck_assert(rcv->status == IBV_WC_SUCCESS && rcv->opcode == IBV_WC_RECV_RDMA_WITH_IMM && rcv->wr_id == 500 &&
            ntohl(rcv->imm_data) == 99 && rcv->byte_len == 16 && rcv->qp_num == qb->qp_num);
  ck_assert_str_eq((char *)b->buf, "inline payload!");
  ck_assert_int_eq(mismatches(b->buf + 8192, 100000, 77), 0);
  ck_assert_int_eq(V->destroy_qp(qa), 0);
  ck_assert_int_eq(V->destroy_qp(qb), 0);
}

START_TEST(test_loopback) {
  setenv("GW_IB_EMULATE_DEVICES", "2", 1);
  struct ep a, b;
  ep_open(&a, 0, 1 << 20, 16);
  loopback(&a, &a);
  ep_open(&b, 1, 1 << 20, 16);
  loopback(&a, &b);
  ep_close(&a);
  ep_close(&b);
}
END_TEST

/* A send buffer belongs to the HCA until a polled completion covers its WR:
 * changed before that (here an unsignaled write's source, rewritten before the
 * signaled write after it was polled), the emulator aborts naming the WR.
 * Changed after that, nothing happens. */
static void reuse_source(int early) {
  struct ep a;
  ep_open(&a, 0, 1 << 20, 16);
  struct ibv_qp *qa = ep_qp(&a, 8, 8, 0), *qb = ep_qp(&a, 8, 8, 0);
  struct info ia = ep_info(&a, qa), ib = ep_info(&a, qb);
  qp_connect(qa, &ib, &defaults);
  qp_connect(qb, &ia, &defaults);
  uint8_t *src = a.buf + (512 << 10);
  fill(src, 4096, 5);
  struct ibv_sge sge = {(uintptr_t)src, 4096, a.mr->lkey}, sge2 = {(uintptr_t)src + 8192, 64, a.mr->lkey};
  struct ibv_wc wc;
  REQUIRE(post_write(qa, 1, &sge, 1, ib.addr, ib.rkey, 0, 0, early ? 0 : IBV_SEND_SIGNALED) == 0, "post 1");
  if (!early) REQUIRE(poll_n(a.cq, &wc, 1, 5) == 1 && wc.wr_id == 1, "completion 1");
  src[2700] ^= 0xff; /* a byte of the third window (the sample: 64 bytes at 0, 1/3, 2/3, end) */
  REQUIRE(post_write(qa, 2, &sge2, 1, ib.addr + 8192, ib.rkey, 0, 0, IBV_SEND_SIGNALED) == 0, "post 2");
  REQUIRE(poll_n(a.cq, &wc, 1, 5) == 1 && wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS, "completion 2");
  REQUIRE(mismatches(a.buf, 2600, 5) == 0, "data");
  REQUIRE(V->destroy_qp(qa) == 0 && V->destroy_qp(qb) == 0, "destroy");
  ep_close(&a);
}

START_TEST(test_source_reuse) {
  reuse_source(0);
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    in_child = 1;
    dup2(fds[1], 2);
    close(fds[0]);
    reuse_source(1);
    _exit(0);
  }
  close(fds[1]);
  char out[1024] = "";
  size_t n = 0;
  ssize_t k;
  while (n < sizeof out - 1 && (k = read(fds[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)k;
  out[n] = 0;
  close(fds[0]);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "the reused source went unnoticed (status %#x): %s", st,
                out);
  ck_assert_msg(strstr(out, "send WR wr_id 1 on QP") && strstr(out, "4096 bytes"), "%s", out);
}
END_TEST

/* ---- 5. errors ------------------------------------------------------------------------ */
static void expect_status(struct ep *e, uint64_t wr_id, int status) {
  struct ibv_wc wc;
  ck_assert_int_eq(poll_n(e->cq, &wc, 1, 10), 1);
  ck_assert_msg(wc.wr_id == wr_id && (int)wc.status == status, "wr %llu status %d (%s), expected %llu %d",
                (unsigned long long)wc.wr_id, wc.status, ibv_wc_status_str(wc.status), (unsigned long long)wr_id,
                status);
}

/* Async events, non-blocking: none pending is EAGAIN; the port going down
 * (IBV_EVENT_PORT_ERR, the port DOWN, writes either way unreachable) and
 * back (IBV_EVENT_PORT_ACTIVE); a refused write gives the responder's QP an
 * IBV_EVENT_QP_ACCESS_ERR naming it; a device failure (IBV_EVENT_DEVICE_FATAL)
 * flushes every QP. */
static void expect_event(struct ep *e, enum ibv_event_type type, struct ibv_qp *qp) {
  struct ibv_async_event ev;
  ck_assert_int_eq(V->get_async_event(e->ctx, &ev), 0);
  ck_assert_msg(ev.event_type == type, "event %s, expected %s", ibv_event_type_str(ev.event_type),
                ibv_event_type_str(type));
  if (qp) ck_assert_ptr_eq(ev.element.qp, qp);
  V->ack_async_event(&ev);
  errno = 0;
  ck_assert_int_eq(V->get_async_event(e->ctx, &ev), -1);
  ck_assert_int_eq(errno, EAGAIN);
}

START_TEST(test_async_events) {
  struct ep a;
  ep_open(&a, 0, 1 << 16, 16);
  struct ibv_async_event ev;
  ck_assert_int_eq(V->get_async_event(a.ctx, &ev), -1);
  ck_assert_int_eq(errno, EAGAIN);
  struct params p = defaults;
  p.timeout = 1, p.retry_cnt = 0;
  struct ibv_qp *qa = ep_qp(&a, 8, 8, 0), *qb = ep_qp(&a, 8, 8, 0);
  struct info ia = ep_info(&a, qa), ib = ep_info(&a, qb);
  qp_connect(qa, &ib, &p);
  qp_connect(qb, &ia, &p);
  struct ibv_sge sge = {(uintptr_t)a.buf, 64, a.mr->lkey};
  gw__ibemu_set_port(a.ctx, 0);
  expect_event(&a, IBV_EVENT_PORT_ERR, NULL);
  struct ibv_port_attr pa;
  ck_assert_int_eq(V->query_port(a.ctx, 1, &pa), 0);
  ck_assert_int_eq(pa.state, IBV_PORT_DOWN);
  ck_assert_int_eq(post_write(qa, 1, &sge, 1, ib.addr + 4096, ib.rkey, 0, 0, IBV_SEND_SIGNALED), 0);
  expect_status(&a, 1, IBV_WC_RETRY_EXC_ERR);
  gw__ibemu_set_port(a.ctx, 1);
  expect_event(&a, IBV_EVENT_PORT_ACTIVE, NULL);
  ck_assert_int_eq(V->query_port(a.ctx, 1, &pa), 0);
  ck_assert_int_eq(pa.state, IBV_PORT_ACTIVE);
  ck_assert_int_eq(V->destroy_qp(qa), 0);
  ck_assert_int_eq(V->destroy_qp(qb), 0);
  /* a write with a wrong rkey: the requester's completion, the responder's event */
  qa = ep_qp(&a, 8, 8, 0), qb = ep_qp(&a, 8, 8, 0);
  ia = ep_info(&a, qa), ib = ep_info(&a, qb);
  qp_connect(qa, &ib, &p);
  qp_connect(qb, &ia, &p);
  ck_assert_int_eq(post_write(qa, 2, &sge, 1, ib.addr + 4096, ib.rkey ^ 0x100, 0, 0, IBV_SEND_SIGNALED), 0);
  expect_status(&a, 2, IBV_WC_REM_ACCESS_ERR);
  expect_event(&a, IBV_EVENT_QP_ACCESS_ERR, qb);
  ck_assert_int_eq(V->destroy_qp(qa), 0);
  ck_assert_int_eq(V->destroy_qp(qb), 0);
  /* the device fails: its QPs flush what they hold */
  qa = ep_qp(&a, 8, 8, 0);
  ia = ep_info(&a, qa);
  qp_connect(qa, &ia, &p);
  uint64_t rid = 40;
  ck_assert_int_eq(post_recvs(qa, 1, &rid), 0);
  gw__ibemu_device_fatal(a.ctx);
  expect_event(&a, IBV_EVENT_DEVICE_FATAL, NULL);
  expect_status(&a, 40, IBV_WC_WR_FLUSH_ERR);
  ck_assert_int_eq(V->destroy_qp(qa), 0);
  ep_close(&a);
}
END_TEST

/* The responder's QP was put in error by our access error: its receives flush. */
static void expect_remote_flushed(struct chan *ch, int nrecv) {
  struct reply r = rpc(ch, (struct cmd){.op = CMD_POLL, .n = nrecv, .timeout = 5});
  ck_assert_int_eq(r.n, nrecv);
  for (int i = 0; i < nrecv; i++) ck_assert_int_eq(r.wc[i].status, IBV_WC_WR_FLUSH_ERR);
  ck_assert_int_eq(r.state, IBV_QPS_ERR);
}

START_TEST(test_access_errors) {
  struct chan ch = spawn_responder();
  struct ep e;
  ep_open(&e, 0, 1 << 16, 64);
  struct ibv_sge sge = {(uintptr_t)e.buf, 64, e.mr->lkey};
  /* A bad rkey: REM_ACCESS_ERR here, later WRs flushed, the remote QP in error. */
  struct ibv_qp *qp = ep_qp(&e, 8, 1, 0);
  struct info peer = pair(&ch, &e, qp, &defaults, &defaults, 2);
  ck_assert_int_eq(post_write(qp, 1, &sge, 1, peer.addr, peer.rkey ^ 0x1000, 0, 0, 0), 0);
  ck_assert_int_eq(post_write(qp, 2, &sge, 1, peer.addr, peer.rkey, 0, 0, 0), 0);
  expect_status(&e, 1, IBV_WC_REM_ACCESS_ERR);
  expect_status(&e, 2, IBV_WC_WR_FLUSH_ERR);
  ck_assert_int_eq(qp->state, IBV_QPS_ERR);
  ck_assert_int_eq(post_write(qp, 3, &sge, 1, peer.addr, peer.rkey, 0, 0, 0), 0);
  expect_status(&e, 3, IBV_WC_WR_FLUSH_ERR);
  expect_remote_flushed(&ch, 2);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  /* Out of bounds at the remote (one byte past the MR). */
  qp = ep_qp(&e, 8, 1, 0);
  peer = pair(&ch, &e, qp, &defaults, &defaults, 1);
  ck_assert_int_eq(post_write(qp, 4, &sge, 1, peer.addr + RBUF - 63, peer.rkey, 0, 0, 0), 0);
  expect_status(&e, 4, IBV_WC_REM_ACCESS_ERR);
  expect_remote_flushed(&ch, 1);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  /* A bad lkey, and a local SGE past the MR: LOC_PROT_ERR. */
  qp = ep_qp(&e, 8, 1, 0);
  peer = pair(&ch, &e, qp, &defaults, &defaults, 0);
  struct ibv_sge bad = {(uintptr_t)e.buf, 64, e.mr->lkey + 1};
  ck_assert_int_eq(post_write(qp, 5, &bad, 1, peer.addr, peer.rkey, 0, 0, 0), 0);
  expect_status(&e, 5, IBV_WC_LOC_PROT_ERR);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  qp = ep_qp(&e, 8, 1, 0);
  peer = pair(&ch, &e, qp, &defaults, &defaults, 0);
  bad = (struct ibv_sge){(uintptr_t)e.buf + (1 << 16) - 8, 64, e.mr->lkey};
  ck_assert_int_eq(post_write(qp, 6, &bad, 1, peer.addr, peer.rkey, 0, 0, 0), 0);
  expect_status(&e, 6, IBV_WC_LOC_PROT_ERR);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  /* The rkey of a deregistered MR (the responder registers the same buffer anew). */
  qp = ep_qp(&e, 8, 1, 0);
  peer = pair(&ch, &e, qp, &defaults, &defaults, 1);
  ck_assert_int_eq(post_write(qp, 7, &sge, 1, peer.addr, peer.rkey, 0, 0, IBV_SEND_SIGNALED), 0);
  expect_status(&e, 7, IBV_WC_SUCCESS);
  struct info fresh = rpc(&ch, (struct cmd){.op = CMD_REREG}).info;
  ck_assert_uint_ne(fresh.rkey, peer.rkey);
  ck_assert_int_eq(post_write(qp, 8, &sge, 1, peer.addr, peer.rkey, 0, 0, 0), 0);
  expect_status(&e, 8, IBV_WC_REM_ACCESS_ERR);
  expect_remote_flushed(&ch, 1);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  finish(&ch);
  ep_close(&e);
}
END_TEST

START_TEST(test_rnr) {
  struct chan ch = spawn_responder();
  struct ep e;
  ep_open(&e, 0, 4096, 64);
  struct ibv_sge sge = {(uintptr_t)e.buf, 16, e.mr->lkey};
  /* rnr_retry 0: the first NAK fails the WR; 3 retries with a 1.28 ms timer:
   * fails after at least 3 timer periods. */
  for (int retries = 0; retries <= 3; retries += 3) {
    struct params mine = defaults, theirs = defaults;
    mine.rnr_retry = (uint8_t)retries;
    theirs.min_rnr_timer = 14; /* 1.28 ms */
    struct ibv_qp *qp = ep_qp(&e, 8, 1, 0);
    struct info peer = pair(&ch, &e, qp, &mine, &theirs, 0);
    double t0 = now();
    ck_assert_int_eq(post_write(qp, 10, &sge, 1, peer.addr, peer.rkey, 1, 1, 0), 0);
    expect_status(&e, 10, IBV_WC_RNR_RETRY_EXC_ERR);
    double took = now() - t0;
    ck_assert_msg(took >= retries * 1.28e-3 && took < 2, "rnr_retry %d failed after %.4f s", retries, took);
    ck_assert_int_eq(qp->state, IBV_QPS_ERR);
    ck_assert_int_eq(V->destroy_qp(qp), 0);
  }
  /* rnr_retry 7: waits as long as it takes, completes once a receive is posted. */
  struct ibv_qp *qp = ep_qp(&e, 8, 1, 0);
  struct info peer = pair(&ch, &e, qp, &defaults, &defaults, 0);
  fill(e.buf, 16, 3);
  ck_assert_int_eq(post_write(qp, 11, &sge, 1, peer.addr, peer.rkey, 1, 77, IBV_SEND_SIGNALED), 0);
  struct ibv_wc wc;
  ck_assert_int_eq(poll_n(e.cq, &wc, 1, 0.1), 0);
  ck_assert_int_eq(rpc(&ch, (struct cmd){.op = CMD_RECV, .n = 1}).rc, 0);
  expect_status(&e, 11, IBV_WC_SUCCESS);
  struct reply r = rpc(&ch, (struct cmd){.op = CMD_POLL, .n = 1, .timeout = 5});
  ck_assert(r.n == 1 && r.wc[0].status == IBV_WC_SUCCESS && ntohl(r.wc[0].imm_data) == 77);
  ck_assert_int_eq(rpc(&ch, (struct cmd){.op = CMD_CHECK, .len = 16, .seed = 3}).rc, 0);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  finish(&ch);
  ep_close(&e);
}
END_TEST

START_TEST(test_unreachable) {
  struct chan ch = spawn_responder();
  struct ep e;
  ep_open(&e, 0, 4096, 64);
  struct ibv_sge sge = {(uintptr_t)e.buf, 16, e.mr->lkey};
  struct params mine = defaults;
  mine.timeout = 10, mine.retry_cnt = 7;
  const double span = 4.096e-6 * 1024 * 8; /* 33.6 ms */
  /* A QP number nobody has: retried, then RETRY_EXC_ERR. */
  struct ibv_qp *qp = ep_qp(&e, 8, 1, 0);
  struct info peer = pair(&ch, &e, qp, &mine, &defaults, 1);
  struct info wrong = peer;
  wrong.qpn ^= 0x400;
  struct ibv_qp *qp2 = ep_qp(&e, 8, 1, 0);
  qp_connect(qp2, &wrong, &mine);
  double t0 = now();
  ck_assert_int_eq(post_write(qp2, 1, &sge, 1, peer.addr, peer.rkey, 0, 0, 0), 0);
  expect_status(&e, 1, IBV_WC_RETRY_EXC_ERR);
  ck_assert_double_ge(now() - t0, span);
  ck_assert_int_eq(qp2->state, IBV_QPS_ERR);
  ck_assert_int_eq(V->destroy_qp(qp2), 0);
  /* The responder killed: RETRY_EXC_ERR after the computed time, not before. */
  ck_assert_int_eq(post_write(qp, 2, &sge, 1, peer.addr, peer.rkey, 1, 5, IBV_SEND_SIGNALED), 0);
  expect_status(&e, 2, IBV_WC_SUCCESS);
  kill(ch.pid, SIGKILL);
  int st;
  ck_assert_int_eq(waitpid(ch.pid, &st, 0), ch.pid);
  t0 = now();
  ck_assert_int_eq(post_write(qp, 3, &sge, 1, peer.addr, peer.rkey, 0, 0, 0), 0);
  ck_assert_int_eq(post_write(qp, 4, &sge, 1, peer.addr, peer.rkey, 0, 0, 0), 0);
  expect_status(&e, 3, IBV_WC_RETRY_EXC_ERR);
  double took = now() - t0;
  ck_assert_msg(took >= span && took < 3, "dead remote detected after %.4f s (expected >= %.4f)", took, span);
  expect_status(&e, 4, IBV_WC_WR_FLUSH_ERR);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  close(ch.rd), close(ch.wr);
  ep_close(&e);
}
END_TEST

START_TEST(test_limits) {
  /* Locked memory: GW_IB_EMULATE_MEMLOCK bytes in all. */
  setenv("GW_IB_EMULATE_MEMLOCK", "1M", 1);
  struct ep e;
  ep_open(&e, 0, 4096, 2);
  uint8_t *big = aligned_alloc(4096, 1 << 20);
  struct ibv_mr *m1 = V->reg_mr(e.pd, big, 512 << 10, IBV_ACCESS_LOCAL_WRITE);
  ck_assert_ptr_nonnull(m1);
  errno = 0;
  ck_assert_ptr_null(V->reg_mr(e.pd, big + (512 << 10), 512 << 10, IBV_ACCESS_LOCAL_WRITE));
  ck_assert_int_eq(errno, ENOMEM);
  ck_assert_int_eq(V->dereg_mr(m1), 0);
  m1 = V->reg_mr(e.pd, big, 768 << 10, IBV_ACCESS_LOCAL_WRITE);
  ck_assert_ptr_nonnull(m1);
  ck_assert_int_eq(V->dereg_mr(m1), 0);
  unsetenv("GW_IB_EMULATE_MEMLOCK");
  /* reg_mr's argument checks. */
  errno = 0;
  ck_assert_ptr_null(V->reg_mr(e.pd, big, 4096, IBV_ACCESS_REMOTE_WRITE));
  ck_assert_int_eq(errno, EINVAL);
  ck_assert_ptr_null(V->reg_mr(e.pd, big, 0, IBV_ACCESS_LOCAL_WRITE));
  ck_assert_ptr_null(V->reg_mr(e.pd, NULL, 4096, IBV_ACCESS_LOCAL_WRITE));
  free(big);
  /* RQ full: ENOMEM. */
  struct ibv_qp *qp = ep_qp(&e, 8, 2, 0);
  struct info self = ep_info(&e, qp);
  qp_connect(qp, &self, &defaults);
  uint64_t rid = 0;
  ck_assert_int_eq(post_recvs(qp, 2, &rid), 0);
  ck_assert_int_eq(post_recvs(qp, 1, &rid), ENOMEM);
  /* A CQ of 2 entries with 3 signaled completions: an overrun is reported
   * (poll_cq < 0), never a silent loss. */
  struct ibv_sge sge = {(uintptr_t)e.buf, 8, e.mr->lkey};
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(post_write(qp, (uint64_t)i, &sge, 1, self.addr + 64, self.rkey, 0, 0, IBV_SEND_SIGNALED), 0);
  struct ibv_wc wc[4];
  ck_assert_int_lt(V->poll_cq(e.cq, 4, wc), 0);
  ck_assert_int_eq(qp->state, IBV_QPS_ERR);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  ep_close(&e);
}
END_TEST

/* ---- 6. Ethernet link layer: routing by GID (both forms) ------------------------- */
START_TEST(test_eth_gid) {
  setenv("GW_IB_EMULATE_LINK", "eth", 1);
  struct chan ch = spawn_responder();
  struct ep e;
  ep_open(&e, 0, 1 << 16, 64);
  ck_assert_int_eq(e.port.lid, 0);
  struct ibv_qp *qp = ep_qp(&e, 8, 1, 0);
  struct info self = ep_info(&e, qp);
  ck_assert_int_eq(to_init(qp), 0);
  ck_assert_int_eq(to_rtr(qp, &self, &defaults), EINVAL); /* RoCE needs a GRH */
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  for (int gidx = 0; gidx < 2; gidx++) {
    struct params p = defaults;
    p.gid_index = gidx;
    qp = ep_qp(&e, 8, 1, 0);
    struct info peer = pair(&ch, &e, qp, &p, &p, 1);
    ck_assert_int_eq(peer.lid, 0);
    uint64_t rid = (uint64_t)gidx;
    write_and_check(&ch, &e, qp, &peer, 5000, 2, 60 + (uint32_t)gidx, &rid);
    ck_assert_int_eq(V->destroy_qp(qp), 0);
  }
  /* A GID that is not one of ours: unreachable. */
  struct params p = defaults;
  p.gid_index = 0, p.timeout = 1, p.retry_cnt = 0;
  qp = ep_qp(&e, 8, 1, 0);
  struct info peer = pair(&ch, &e, qp, &p, &p, 0);
  peer.gid[0].raw[9] ^= 1;
  struct ibv_qp *lost = ep_qp(&e, 8, 1, 0);
  qp_connect(lost, &peer, &p);
  struct ibv_sge sge = {(uintptr_t)e.buf, 8, e.mr->lkey};
  ck_assert_int_eq(post_write(lost, 9, &sge, 1, peer.addr, peer.rkey, 0, 0, 0), 0);
  expect_status(&e, 9, IBV_WC_RETRY_EXC_ERR);
  ck_assert_int_eq(V->destroy_qp(lost), 0);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  /* Our GID RoCE v1 (index 0), the responder's v2 (index 1): frames neither
   * end takes, so unreachable as well. */
  struct params theirs = p;
  theirs.gid_index = 1;
  qp = ep_qp(&e, 8, 1, 0);
  peer = pair(&ch, &e, qp, &p, &theirs, 1);
  ck_assert_int_eq(post_write(qp, 10, &sge, 1, peer.addr, peer.rkey, 1, 7, 0), 0);
  expect_status(&e, 10, IBV_WC_RETRY_EXC_ERR);
  ck_assert_int_eq(V->destroy_qp(qp), 0);
  finish(&ch);
  ep_close(&e);
}
END_TEST

/* Each test starts from the defaults (they also run unforked: CK_FORK=no). */
static void clear_env(void) {
  unsetenv("GW_IB_EMULATE_DEVICES");
  unsetenv("GW_IB_EMULATE_LINK");
  unsetenv("GW_IB_EMULATE_MEMLOCK");
}

static Suite *ibemu_suite(void) {
  Suite *s = suite_create("ibemu");
  TCase *tc = tcase_create("verbs");
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, clear_env, NULL);
  tcase_add_test(tc, test_devices);
  tcase_add_test(tc, test_state_machine);
  tcase_add_test(tc, test_two_processes);
  tcase_add_test(tc, test_loopback);
  tcase_add_test(tc, test_source_reuse);
  tcase_add_test(tc, test_access_errors);
  tcase_add_test(tc, test_rnr);
  tcase_add_test(tc, test_unreachable);
  tcase_add_test(tc, test_limits);
  tcase_add_test(tc, test_eth_gid);
  tcase_add_test(tc, test_async_events);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(ibemu_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
