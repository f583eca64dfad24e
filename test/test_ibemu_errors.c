/* test_ibemu_errors.c - the verbs emulator's errors (cases of test_ibemu's
 * suite): a send source changed before its completion was polled (the
 * emulator aborts naming the WR); async events (port down and up, a refused
 * write's QP_ACCESS_ERR, device failure); key, bounds and protection errors on
 * both ends; receiver-not-ready and dead-remote retries with their timing. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ibemu_util.h"

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
  /* The right QP, but a first packet sequence number other than the one it
   * expects (its RTR's rq_psn, 0 here): retried, then RETRY_EXC_ERR. */
  struct ibv_qp *qp3 = ep_qp(&e, 8, 1, 0);
  ck_assert_int_eq(to_init(qp3), 0);
  ck_assert_int_eq(to_rtr(qp3, &peer, &mine), 0);
  struct ibv_qp_attr rts = {.qp_state = IBV_QPS_RTS, .timeout = mine.timeout, .retry_cnt = mine.retry_cnt,
                            .rnr_retry = mine.rnr_retry, .sq_psn = 0x123456, .max_rd_atomic = 1};
  ck_assert_int_eq(V->modify_qp(qp3, &rts, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                               IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC), 0);
  ck_assert_int_eq(post_write(qp3, 1, &sge, 1, peer.addr, peer.rkey, 0, 0, 0), 0);
  expect_status(&e, 1, IBV_WC_RETRY_EXC_ERR);
  ck_assert_int_eq(V->destroy_qp(qp3), 0);
  rts.sq_psn = 1u << 24; /* not 24 bits */
  qp3 = ep_qp(&e, 8, 1, 0);
  ck_assert_int_eq(to_init(qp3), 0);
  ck_assert_int_eq(to_rtr(qp3, &peer, &mine), 0);
  ck_assert_int_eq(V->modify_qp(qp3, &rts, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                               IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC), EINVAL);
  ck_assert_int_eq(V->destroy_qp(qp3), 0);
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

void ibemu_add_error_tests(TCase *tc);
void ibemu_add_error_tests(TCase *tc) {
  tcase_add_test(tc, test_source_reuse);
  tcase_add_test(tc, test_access_errors);
  tcase_add_test(tc, test_rnr);
  tcase_add_test(tc, test_unreachable);
  tcase_add_test(tc, test_async_events);
}
