/* ib_dev.h - what the ib transport's two files share (not installed):
 * ib_dev.c holds the process-wide state (the HCA ports, opened once, and the
 * registration cache of gw_comm_register, and the messages that need no
 * connection), ib.c the connections. */
#ifndef GW_IB_DEV_H
#define GW_IB_DEV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "ibv.h"

#define IB_MAX_PORTS 16

struct ib_port {
  char name[64];
  uint8_t num;
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_port_attr attr;
  union ibv_gid gid;
  int gid_index; /* -1: route by LID (InfiniBand without GW_IB_GID_INDEX) */
  int gid_type;  /* IBV_GID_TYPE_* of that GID; -1 when the provider cannot say */
  bool eth;      /* RoCE: link layer Ethernet, routed by GID */
  int pkey_index; /* the QPs' partition: GW_IB_PKEY, else the first full-member key's index */
  uint16_t pkey;  /* the key there (host order; the top bit: full membership) */
  /* From the device's async events (gw__ib_events): the link is down now
   * (IBV_EVENT_PORT_ERR until IBV_EVENT_PORT_ACTIVE); the device failed for
   * good (IBV_EVENT_DEVICE_FATAL). */
  atomic_int link_down, fatal;
};

/* Reads the async events of every open device (at most every 10 ms unless
 * now; never blocks): port and device events set the port's link_down / fatal; an event
 * on a QP or CQ stores its type + 1 in the atomic_int the QP's qp_context (the
 * CQ's cq_context) points at, when it has one. */
void gw__ib_events(bool now);

/* Both ends of a connection in one partition, not both limited members
 * (whose packets the fabric drops): else an error naming the keys. */
gw_result_t gw__ib_pkey_agree(const struct ib_port *port, uint16_t peer_pkey, int self, int peer,
                              struct gw_errctx *err);

/* The first packet sequence number (24 bits) of queue pair i of the connection
 * `nonce`, at its sending (receiver 0) or receiving (1) end. */
uint32_t gw__ib_qp_psn(uint64_t nonce, int receiver, uint32_t i);

/* "RoCE v2", "RoCE v1", "InfiniBand" or "unknown type" (an IBV_GID_TYPE_*). */
const char *gw__ib_gid_type_name(int type);

/* Messages: a hint on what a failed completion's status means; what an
 * async error event on a connection's QP or CQ means (is_send: the
 * sender's side; the text into msg[n], its error code returned); the error
 * when a RoCE connection's ends use GIDs of different types (both ends'
 * types named), else GW_SUCCESS. */
const char *gw__ib_status_hint(enum ibv_wc_status s);
gw_result_t gw__ib_async_text(int ev, bool is_send, int peer, char *msg, size_t n);
gw_result_t gw__ib_roce_agree(const struct ib_port *port, int peer_type, int self, int peer, struct gw_errctx *err);

/* Every open port of the process (gw__ib_available opens them once). */
struct gw_ib_devs {
  pthread_once_t once;
  const struct gw_ibv *v;
  int n;
  struct ib_port ports[IB_MAX_PORTS];
  atomic_uint next; /* round robin over the ports, per connection */
};
extern struct gw_ib_devs gw__ib_devs;

/* The lkey on port p of a gw_comm_register registration covering
 * [src, src + len), or 0 (none, or held[] full).  The registration is added to
 * held[*nheld] (at most max) unless already there: its MRs stay until
 * gw__ib_reg_release, even if deregistered meanwhile. */
struct ib_reg;
uint32_t gw__ib_reg_hold(int p, const void *src, size_t len, struct ib_reg **held, int *nheld, int max);
/* Drops every hold in held[] (call once the writes reading them completed or
 * their queue pairs are destroyed); *nheld becomes 0. */
void gw__ib_reg_release(struct ib_reg **held, int *nheld);
/* Counts a chunk sent straight from user memory (gw__ib_stat(1), tests). */
void gw__ib_count_direct(void);

#endif
