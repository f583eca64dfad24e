/* ibv_real.c - the verbs table over the real libibverbs.  Several verbs are
 * inline functions or macros in infiniband/verbs.h (post_send, post_recv,
 * poll_cq, query_port, reg_mr), so each entry is a small function. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>

#include "core.h"
#include "ibv.h"

static struct ibv_device **real_get_device_list(int *n) { return ibv_get_device_list(n); }
static void real_free_device_list(struct ibv_device **l) { ibv_free_device_list(l); }
static const char *real_get_device_name(struct ibv_device *d) { return ibv_get_device_name(d); }
/* The async event fd non-blocking, so polling it never waits. */
static struct ibv_context *real_open_device(struct ibv_device *d) {
  struct ibv_context *c = ibv_open_device(d);
  if (c) {
    int fl = fcntl(c->async_fd, F_GETFL);
    if (fl < 0 || fcntl(c->async_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
      int e = errno;
      ibv_close_device(c);
      errno = e;
      return NULL;
    }
  }
  return c;
}
static int real_get_async_event(struct ibv_context *c, struct ibv_async_event *ev) {
  return ibv_get_async_event(c, ev);
}
static void real_ack_async_event(struct ibv_async_event *ev) { ibv_ack_async_event(ev); }
static int real_close_device(struct ibv_context *c) { return ibv_close_device(c); }
static int real_query_device(struct ibv_context *c, struct ibv_device_attr *a) { return ibv_query_device(c, a); }
static int real_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
  return ibv_query_port(c, port, a);
}
static int real_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid) {
  return ibv_query_gid(c, port, index, gid);
}
static int real_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index, struct ibv_gid_entry *e,
                             uint32_t flags) {
  return ibv_query_gid_ex(c, port, index, e, flags);
}
static int real_query_pkey(struct ibv_context *c, uint8_t port, int index, __be16 *pkey) {
  return ibv_query_pkey(c, port, index, pkey);
}
static struct ibv_pd *real_alloc_pd(struct ibv_context *c) { return ibv_alloc_pd(c); }
static int real_dealloc_pd(struct ibv_pd *pd) { return ibv_dealloc_pd(pd); }
static struct ibv_mr *real_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
  return ibv_reg_mr(pd, addr, len, access);
}
static int real_dereg_mr(struct ibv_mr *mr) { return ibv_dereg_mr(mr); }
static struct ibv_cq *real_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch, int vec) {
  return ibv_create_cq(c, cqe, ctx, ch, vec);
}
static int real_destroy_cq(struct ibv_cq *cq) { return ibv_destroy_cq(cq); }
static int real_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { return ibv_poll_cq(cq, n, wc); }
static struct ibv_qp *real_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) { return ibv_create_qp(pd, a); }
static int real_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) { return ibv_modify_qp(qp, a, mask); }
static int real_destroy_qp(struct ibv_qp *qp) { return ibv_destroy_qp(qp); }
static int real_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  return ibv_post_send(qp, wr, bad);
}
static int real_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  return ibv_post_recv(qp, wr, bad);
}

static int real_fork_init(void) { return ibv_fork_init(); }

const struct gw_ibv gw__ibv_real = {
    .name = "libibverbs",
    .fork_init = real_fork_init,
    .get_device_list = real_get_device_list,
    .free_device_list = real_free_device_list,
    .get_device_name = real_get_device_name,
    .open_device = real_open_device,
    .close_device = real_close_device,
    .query_device = real_query_device,
    .query_port = real_query_port,
    .query_gid = real_query_gid,
    .query_gid_ex = real_query_gid_ex,
    .query_pkey = real_query_pkey,
    .alloc_pd = real_alloc_pd,
    .dealloc_pd = real_dealloc_pd,
    .reg_mr = real_reg_mr,
    .dereg_mr = real_dereg_mr,
    .create_cq = real_create_cq,
    .destroy_cq = real_destroy_cq,
    .poll_cq = real_poll_cq,
    .create_qp = real_create_qp,
    .modify_qp = real_modify_qp,
    .destroy_qp = real_destroy_qp,
    .post_send = real_post_send,
    .post_recv = real_post_recv,
    .get_async_event = real_get_async_event,
    .ack_async_event = real_ack_async_event,
};

const struct gw_ibv *gw__ibv(void) {
  return gw__env_int("GW_IB_EMULATE", 0) ? &gw__ibv_emu : &gw__ibv_real;
}
