/* ibemu_port.c - the verbs emulator's port (see ibemu.c): the port's
 * attributes, its GID table as a ConnectX lists it, and the asynchronous
 * events (port down and up, device failure from the test hooks, a
 * responder's access error per QP). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core.h"
#include "ibv.h"

#include "ibemu.h"

/* Width 4x, speed EDR, physical state LinkUp; no LID on Ethernet. */
int gw__ibemu_query_port(struct ibv_context *ibctx, uint8_t port, struct ibv_port_attr *a) {
  struct emu_ctx *c = CTX(ibctx);
  if (port != 1) return EINVAL;
  *a = (struct ibv_port_attr){
      .state = c->port_down || c->fatal ? IBV_PORT_DOWN : IBV_PORT_ACTIVE, .max_mtu = IBV_MTU_4096,
      .active_mtu = IBV_MTU_4096, .gid_tbl_len = c->roce_v2 ? 4 : 2,
      .max_msg_sz = 1u << 31, .pkey_tbl_len = 1, .lid = c->eth ? 0 : c->lid, .sm_lid = c->eth ? 0 : 1,
      .max_vl_num = 1, .active_width = 2, .active_speed = 32, .phys_state = c->port_down || c->fatal ? 3 : 5,
      .link_layer = c->eth ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND};
  return 0;
}

/* The GID table: InfiniBand and RoCE v1 only, index 0 link-local and 1
 * IPv4-mapped; RoCE with v2: 0 and 1 link-local (v1, v2), 2 and 3 IPv4-mapped
 * (v1, v2), as mlx5 lists them.  The type, or -1 past the table. */
int gw__ibemu_gid_entry(const struct emu_ctx *c, int index, union ibv_gid *gid) {
  if (index < 0 || index >= (c->roce_v2 ? 4 : 2)) return -1;
  gw__ibemu_lid_gid(c->lid, c->roce_v2 ? index / 2 : index, gid);
  return !c->eth ? IBV_GID_TYPE_IB : c->roce_v2 && index % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
}

int gw__ibemu_query_gid(struct ibv_context *ibctx, uint8_t port, int index, union ibv_gid *gid) {
  if (port != 1 || gw__ibemu_gid_entry(CTX(ibctx), index, gid) < 0) return EINVAL;
  return 0;
}

int gw__ibemu_query_gid_ex(struct ibv_context *ibctx, uint32_t port, uint32_t index, struct ibv_gid_entry *e,
                            uint32_t flags) {
  if (port != 1 || flags) return EINVAL;
  int type = gw__ibemu_gid_entry(CTX(ibctx), (int)GW_MIN(index, (uint32_t)INT32_MAX), &e->gid);
  if (type < 0) return EINVAL;
  e->gid_index = index, e->port_num = port, e->gid_type = (uint32_t)type, e->ndev_ifindex = 0;
  return 0;
}


/* ---- async events ------------------------------------------------------------------ */
static void push_event(struct emu_ctx *c, enum ibv_event_type t) {
  if (c->nevents < (int)(sizeof c->events / sizeof c->events[0])) c->events[c->nevents++] = t;
}

void gw__ibemu_set_port(struct ibv_context *ibctx, int up) {
  struct emu_ctx *c = CTX(ibctx);
  pthread_mutex_lock(&c->lock);
  if (c->port_down == !up) {
    pthread_mutex_unlock(&c->lock);
    return;
  }
  c->port_down = !up;
  atomic_store(&c->seg->hdr.h.port_down, (uint32_t)(c->port_down || c->fatal));
  push_event(c, up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR);
  pthread_mutex_unlock(&c->lock);
}

void gw__ibemu_device_fatal(struct ibv_context *ibctx) {
  struct emu_ctx *c = CTX(ibctx);
  pthread_mutex_lock(&c->lock);
  if (!c->fatal) {
    c->fatal = 1;
    atomic_store(&c->seg->hdr.h.port_down, 1);
    for (int i = 0; i < c->nlive; i++) gw__ibemu_enter_error(c->live[i]);
    push_event(c, IBV_EVENT_DEVICE_FATAL);
  }
  pthread_mutex_unlock(&c->lock);
}

/* Port and device events in order, then a QP access error per QP. */
int gw__ibemu_get_async_event(struct ibv_context *ibctx, struct ibv_async_event *ev) {
  struct emu_ctx *c = CTX(ibctx);
  int got = 0;
  pthread_mutex_lock(&c->lock);
  if (c->nevents) {
    *ev = (struct ibv_async_event){.event_type = c->events[0], .element.port_num = 1};
    if (c->events[0] == IBV_EVENT_DEVICE_FATAL) ev->element.port_num = 0;
    memmove(c->events, c->events + 1, (size_t)--c->nevents * sizeof c->events[0]);
    got = 1;
  }
  for (int i = 0; i < c->nlive && !got; i++) {
    struct emu_qp *q = c->live[i];
    if (q->access_reported || !atomic_load(&q->sh->access_err)) continue;
    q->access_reported = 1, q->unacked++;
    *ev = (struct ibv_async_event){.event_type = IBV_EVENT_QP_ACCESS_ERR, .element.qp = &q->qp};
    got = 1;
  }
  pthread_mutex_unlock(&c->lock);
  if (!got) errno = EAGAIN;
  return got ? 0 : -1;
}

void gw__ibemu_ack_async_event(struct ibv_async_event *ev) {
  if (ev->event_type != IBV_EVENT_QP_ACCESS_ERR && ev->event_type != IBV_EVENT_QP_FATAL &&
      ev->event_type != IBV_EVENT_QP_REQ_ERR)
    return;
  struct emu_ctx *c = QP(ev->element.qp)->ctx;
  pthread_mutex_lock(&c->lock);
  QP(ev->element.qp)->unacked--;
  pthread_mutex_unlock(&c->lock);
}
