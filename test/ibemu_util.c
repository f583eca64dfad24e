/* ibemu_util.c - the verbs emulator tests' shared helpers (ibemu_util.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "ibemu_util.h"

int in_child;

double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint8_t pat(uint64_t i, uint32_t seed) { return (uint8_t)(((i * 2654435761u) >> 13) ^ seed); }
void fill(uint8_t *p, size_t len, uint32_t seed) {
  for (size_t i = 0; i < len; i++) p[i] = pat(i, seed);
}
size_t mismatches(const uint8_t *p, size_t len, uint32_t seed) {
  size_t bad = 0;
  for (size_t i = 0; i < len; i++) bad += p[i] != pat(i, seed);
  return bad;
}

/* ---- one endpoint: context, PD, CQ, a registered buffer ------------------------- */
const struct params defaults = {14, 7, 7, 1, -1};

void ep_open(struct ep *e, int dev, size_t len, int cqe) {
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

struct ibv_qp *ep_qp(struct ep *e, uint32_t sq, uint32_t rq, uint32_t inl) {
  struct ibv_qp_init_attr a = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
                               .cap = {.max_send_wr = sq, .max_recv_wr = rq, .max_send_sge = 4,
                                       .max_recv_sge = 1, .max_inline_data = inl}};
  struct ibv_qp *qp = V->create_qp(e->pd, &a);
  REQUIRE(qp, "create_qp: %s", strerror(errno));
  return qp;
}

struct info ep_info(struct ep *e, struct ibv_qp *qp) {
  struct info i = {.lid = e->port.lid, .qpn = qp ? qp->qp_num : 0, .rkey = e->mr->rkey,
                   .addr = (uintptr_t)e->buf};
  for (int k = 0; k < 2; k++) REQUIRE(V->query_gid(e->ctx, 1, k, &i.gid[k]) == 0, "query_gid");
  return i;
}

void ep_close(struct ep *e) {
  REQUIRE(V->dereg_mr(e->mr) == 0 && V->destroy_cq(e->cq) == 0 && V->dealloc_pd(e->pd) == 0, "teardown");
  REQUIRE(V->close_device(e->ctx) == 0, "close_device");
  free(e->buf);
}

int to_init(struct ibv_qp *qp) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                          .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE};
  return V->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int to_rtr(struct ibv_qp *qp, const struct info *peer, const struct params *p) {
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

int to_rts(struct ibv_qp *qp, const struct params *p) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .timeout = p->timeout, .retry_cnt = p->retry_cnt,
                          .rnr_retry = p->rnr_retry, .max_rd_atomic = 1};
  return V->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

void qp_connect(struct ibv_qp *qp, const struct info *peer, const struct params *p) {
  int r1 = to_init(qp), r2 = to_rtr(qp, peer, p), r3 = to_rts(qp, p);
  REQUIRE(!r1 && !r2 && !r3, "connect: %d %d %d", r1, r2, r3);
}

int post_write(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sge, int nsge, uint64_t raddr, uint32_t rkey,
               int imm, uint32_t immval, unsigned flags) {
  struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = sge, .num_sge = nsge, .send_flags = flags,
                           .opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                           .imm_data = htonl(immval), .wr.rdma = {.remote_addr = raddr, .rkey = rkey}},
                     *bad = NULL;
  int r = V->post_send(qp, &wr, &bad);
  REQUIRE(r == 0 || bad == &wr, "bad_wr not set on failure %d", r);
  return r;
}

int post_recvs(struct ibv_qp *qp, int n, uint64_t *next_id) {
  for (int i = 0; i < n; i++) {
    struct ibv_recv_wr wr = {.wr_id = (*next_id)++}, *bad = NULL;
    int r = V->post_recv(qp, &wr, &bad);
    if (r) return r;
  }
  return 0;
}

/* Polls until n completions or the timeout; returns how many came. */
int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n, double timeout) {
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

struct chan spawn_responder(void) {
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

struct reply rpc(struct chan *ch, struct cmd c) {
  struct reply r;
  chan_put(ch->wr, &c, sizeof c);
  REQUIRE(chan_get(ch->rd, &r, sizeof r), "the responder died (command %d)", c.op);
  return r;
}

void rpc_send(struct chan *ch, struct cmd c) { chan_put(ch->wr, &c, sizeof c); }
struct reply rpc_wait(struct chan *ch) {
  struct reply r;
  REQUIRE(chan_get(ch->rd, &r, sizeof r), "the responder died");
  return r;
}

void finish(struct chan *ch) {
  rpc(ch, (struct cmd){.op = CMD_EXIT});
  int st = 0;
  REQUIRE(waitpid(ch->pid, &st, 0) == ch->pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "responder status %d", st);
  close(ch->rd), close(ch->wr);
}

/* A fresh QP here, connected both ways to a fresh QP of the responder, which
 * posts nrecv receives; returns the responder's info. */
struct info pair(struct chan *ch, struct ep *e, struct ibv_qp *qp, const struct params *mine,
                 const struct params *theirs, int nrecv) {
  struct reply r = rpc(ch, (struct cmd){.op = CMD_QP, .n = nrecv, .peer = ep_info(e, qp), .prm = *theirs});
  REQUIRE(r.rc == 0, "responder post_recv %d", r.rc);
  qp_connect(qp, &r.info, mine);
  return r.info;
}

void expect_status(struct ep *e, uint64_t wr_id, int status) {
  struct ibv_wc wc;
  ck_assert_int_eq(poll_n(e->cq, &wc, 1, 10), 1);
  ck_assert_msg(wc.wr_id == wr_id && (int)wc.status == status, "wr %llu status %d (%s), expected %llu %d",
                (unsigned long long)wc.wr_id, wc.status, ibv_wc_status_str(wc.status), (unsigned long long)wr_id,
                status);
}
