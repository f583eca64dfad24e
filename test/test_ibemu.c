/* test_ibemu.c - the user-space verbs emulator (transport/ibemu.c) against the
 * verbs contract: devices, ports and GIDs; the RC state machine and its errnos;
 * RDMA WRITE and WRITE WITH IMM between two processes (a forked responder driven
 * over pipes) and within one; flushes; SQ, RQ and CQ limits; the simulated
 * locked-memory limit; RoCE routing by GID.  The error cases (source reuse,
 * async events, key, bounds and protection errors, receiver not ready, dead
 * remotes) are in test_ibemu_errors.c, the helpers in ibemu_util.c.  Every
 * child process runs under alarm(), so a hang fails the test instead of
 * stalling it. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ibemu_util.h"

/* test_ibemu_errors.c */
void ibemu_add_error_tests(TCase *tc);

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
   * v1/v2, 2/3 IPv4-mapped v1/v2; the table's other entries are empty */
  const int n = eth ? 4 : 2;
  ck_assert_int_eq(a.port.gid_tbl_len, GID_TABLE);
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
  /* empty entries: the zero GID from query_gid (as libibverbs keeps it),
   * ENODATA from query_gid_ex; past the table EINVAL */
  static const uint8_t zero[16];
  memset(g.raw, 0xa5, sizeof g.raw);
  ck_assert_int_eq(V->query_gid(a.ctx, 1, n, &g), 0);
  ck_assert(!memcmp(g.raw, zero, 16));
  ck_assert_int_eq(V->query_gid_ex(a.ctx, 1, (uint32_t)n, &e, 0), ENODATA);
  ck_assert_int_eq(V->query_gid_ex(a.ctx, 1, GID_TABLE - 1, &e, 0), ENODATA);
  ck_assert_int_eq(V->query_gid(a.ctx, 1, GID_TABLE, &g), EINVAL);
  ck_assert_int_eq(V->query_gid(a.ctx, 1, -1, &g), EINVAL);
  ck_assert_int_eq(V->query_gid_ex(a.ctx, 1, GID_TABLE, &e, 0), EINVAL);
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

/* ---- 5. limits: locked memory, reg_mr's checks, a full RQ, a CQ overrun ------------ */
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
  tcase_add_test(tc, test_limits);
  tcase_add_test(tc, test_eth_gid);
  ibemu_add_error_tests(tc);
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
