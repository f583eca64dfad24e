/* ibemu_device.c - the verbs emulator's devices (see ibemu.c): the device
 * list (gwemu0.., GW_IB_EMULATE_DEVICES), the device's and the port's
 * attributes, the GID table as a ConnectX lists it, and the asynchronous
 * events (port down and up, device failure from the test hooks, a
 * responder's access error per QP). */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "ibv.h"

#include "ibemu.h"

/* ---- devices --------------------------------------------------------------------- */
static struct ibv_device devices[MAX_DEVICES];
static pthread_once_t devices_once = PTHREAD_ONCE_INIT;

static void devices_init(void) {
  for (int i = 0; i < MAX_DEVICES; i++) {
    snprintf(devices[i].name, sizeof devices[i].name, "gwemu%d", i);
    snprintf(devices[i].dev_name, sizeof devices[i].dev_name, "uverbs-emu%d", i);
  }
}

const char *gw__ibemu_link(void) { return gw__env_str("GW_IB_EMULATE_LINK", "ib"); }

struct ibv_device **gw__ibemu_get_device_list(int *num) {
  pthread_once(&devices_once, devices_init);
  /* EFA lists itself with no node or transport type (rdma-core's efa provider) */
  const bool efa = !strcmp(gw__ibemu_link(), "efa");
  for (int i = 0; i < MAX_DEVICES; i++) {
    devices[i].node_type = efa ? IBV_NODE_UNSPECIFIED : IBV_NODE_CA;
    devices[i].transport_type = efa ? IBV_TRANSPORT_UNSPECIFIED : IBV_TRANSPORT_IB;
  }
  int64_t n = gw__env_int("GW_IB_EMULATE_DEVICES", 1);
  n = n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n;
  struct ibv_device **list = calloc((size_t)n + 1, sizeof *list);
  if (!list) return NULL;
  for (int i = 0; i < n; i++) list[i] = &devices[i];
  if (num) *num = (int)n;
  return list;
}

void gw__ibemu_free_device_list(struct ibv_device **list) { free(list); }
const char *gw__ibemu_get_device_name(struct ibv_device *d) { return d ? d->name : NULL; }

int gw__ibemu_device_index(const struct ibv_device *dev) {
  return dev && dev >= devices && dev < devices + MAX_DEVICES ? (int)(dev - devices) : -1;
}

/* ---- the port, its GIDs ------------------------------------------------------------ */
int gw__ibemu_query_device(struct ibv_context *ibctx, struct ibv_device_attr *a) {
  *a = (struct ibv_device_attr){
      .fw_ver = "gwemu-1.0", .node_guid = (uint64_t)gw__ibemu_device_index(ibctx->device) + 1, .max_mr_size = UINT64_MAX,
      .page_size_cap = 4096, .max_qp = MAX_QP, .max_qp_wr = MAX_WR, .device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN,
      .max_sge = MAX_SGE, .max_cq = 65536, .max_cqe = MAX_CQE, .max_mr = MAX_MR, .max_pd = 65536,
      .max_qp_rd_atom = 16, .max_qp_init_rd_atom = 16, .max_res_rd_atom = MAX_QP * 16, .max_pkeys = 1,
      .local_ca_ack_delay = 16, .phys_port_cnt = 1};
  a->sys_image_guid = a->node_guid;
  return 0;
}

/* Width 4x, speed EDR, physical state LinkUp; no LID on Ethernet. */
int gw__ibemu_query_port(struct ibv_context *ibctx, uint8_t port, struct ibv_port_attr *a) {
  struct emu_ctx *c = CTX(ibctx);
  if (port != 1) return EINVAL;
  *a = (struct ibv_port_attr){
      .state = c->port_down || c->fatal ? IBV_PORT_DOWN : IBV_PORT_ACTIVE, .max_mtu = IBV_MTU_4096,
      .active_mtu = IBV_MTU_4096, .gid_tbl_len = GID_TABLE,
      .max_msg_sz = 1u << 31, .pkey_tbl_len = (uint16_t)gw__ibemu_pkeys((uint16_t[MAX_PKEYS]){0}), .lid = c->eth || c->efa ? 0 : c->lid, .sm_lid = c->eth || c->efa ? 0 : 1,
      .max_vl_num = 1, .active_width = 2, .active_speed = 32, .phys_state = c->port_down || c->fatal ? 3 : 5,
      .link_layer = c->eth ? IBV_LINK_LAYER_ETHERNET : c->efa ? IBV_LINK_LAYER_UNSPECIFIED : IBV_LINK_LAYER_INFINIBAND};
  return 0;
}

/* The GID table: InfiniBand and RoCE v1 only, index 0 link-local and 1
 * IPv4-mapped; RoCE with v2: 0 and 1 link-local (v1, v2), 2 and 3 IPv4-mapped
 * (v1, v2), as mlx5 lists them; the rest of its GID_TABLE entries empty.  The
 * type; -1 for an empty entry (the GID zeroed), -2 past the table. */
int gw__ibemu_gid_entry(const struct emu_ctx *c, int index, union ibv_gid *gid) {
  if (index < 0 || index >= GID_TABLE) return -2;
  if (index >= (c->roce_v2 ? 4 : 2)) {
    memset(gid, 0, sizeof *gid);
    return -1;
  }
  gw__ibemu_lid_gid(c->lid, c->roce_v2 ? index / 2 : index, gid);
  return !c->eth ? IBV_GID_TYPE_IB : c->roce_v2 && index % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
}

int gw__ibemu_pkeys(uint16_t keys[MAX_PKEYS]) {
  const char *v = gw__env_str("GW_IB_EMULATE_PKEYS", "ffff");
  int n = 0;
  for (const char *p = v; *p && n < MAX_PKEYS;) {
    char *end;
    const unsigned long k = strtoul(p, &end, 16);
    if (end == p || k > 0xffff) break;
    keys[n++] = (uint16_t)k;
    p = *end == ',' ? end + 1 : end;
    if (*end != ',') break;
  }
  if (!n) keys[n++] = 0xffff;
  return n;
}

int gw__ibemu_query_pkey(struct ibv_context *ibctx, uint8_t port, int index, __be16 *pkey) {
  (void)ibctx;
  uint16_t keys[MAX_PKEYS];
  const int n = gw__ibemu_pkeys(keys);
  if (port != 1 || index < 0 || index >= n) return EINVAL;
  *pkey = htobe16(keys[index]);
  return 0;
}

/* An empty entry reads as the zero GID (rdma-core keeps that for ibv_query_gid). */
int gw__ibemu_query_gid(struct ibv_context *ibctx, uint8_t port, int index, union ibv_gid *gid) {
  if (port != 1 || gw__ibemu_gid_entry(CTX(ibctx), index, gid) == -2) return EINVAL;
  return 0;
}

int gw__ibemu_query_gid_ex(struct ibv_context *ibctx, uint32_t port, uint32_t index, struct ibv_gid_entry *e,
                            uint32_t flags) {
  if (port != 1 || flags) return EINVAL;
  int type = gw__ibemu_gid_entry(CTX(ibctx), (int)GW_MIN(index, (uint32_t)INT32_MAX), &e->gid);
  if (type < 0) return type == -1 ? ENODATA : EINVAL;
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
