/* ibv.h - the verbs the ib transport uses, called through one table that is
 * either the real libibverbs (ibv_real.c) or the user-space emulator
 * (ibemu.c, for tests on machines without an HCA; GW_IB_EMULATE=1).  The types
 * are libibverbs' own (infiniband/verbs.h), so the transport is the same code
 * either way and the emulator is held to the real library's contract:
 *   - functions that return int return 0 or an errno value (post_send,
 *     post_recv, modify_qp, query_*, destroy_*, dereg_mr); functions that return
 *     a pointer return NULL and set errno;
 *   - poll_cq returns the number of completions written (>= 0) or < 0 on error;
 *   - every failed work request produces a completion, signaled or not, and a QP
 *     in the error state flushes (IBV_WC_WR_FLUSH_ERR) what is queued on it.
 * Built only when libibverbs' headers exist (GW_HAVE_IBVERBS). */
#ifndef GW_IBV_H
#define GW_IBV_H

#include <infiniband/verbs.h>

struct gw_ibv {
  const char *name; /* "libibverbs" or "emulator" */
  /* ibv_fork_init: registered pages not copied into a forked child (kernels
   * before 5.13 made them copy-on-write, the HCA then reading pages the
   * process no longer uses); before any registration; 0 or an errno value. */
  int (*fork_init)(void);
  struct ibv_device **(*get_device_list)(int *num_devices);
  void (*free_device_list)(struct ibv_device **list);
  const char *(*get_device_name)(struct ibv_device *device);
  struct ibv_context *(*open_device)(struct ibv_device *device);
  int (*close_device)(struct ibv_context *context);
  int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
  int (*query_port)(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr);
  int (*query_gid)(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid);
  /* the GID with its type (IB, RoCE v1, RoCE v2); ENODATA for an empty entry */
  int (*query_gid_ex)(struct ibv_context *context, uint32_t port_num, uint32_t gid_index, struct ibv_gid_entry *entry,
                      uint32_t flags);
  /* the P_Key at a port's index, in network byte order (as ibv_query_pkey) */
  int (*query_pkey)(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
  int (*dealloc_pd)(struct ibv_pd *pd);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
  int (*dereg_mr)(struct ibv_mr *mr);
  struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
                              struct ibv_comp_channel *channel, int comp_vector);
  int (*destroy_cq)(struct ibv_cq *cq);
  int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
  struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
  int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
  int (*destroy_qp)(struct ibv_qp *qp);
  int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
  int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
  /* Never blocks: -1 with errno EAGAIN when no event is pending (the real
   * table opens devices with a non-blocking async_fd).  A QP or CQ an event
   * names is not destroyed before the event is acknowledged. */
  int (*get_async_event)(struct ibv_context *context, struct ibv_async_event *event);
  void (*ack_async_event)(struct ibv_async_event *event);
};

extern const struct gw_ibv gw__ibv_real; /* ibv_real.c: thin wrappers over libibverbs */
extern const struct gw_ibv gw__ibv_emu;  /* ibemu.c: the emulator */

/* The table in use: the emulator when GW_IB_EMULATE=1, else libibverbs. */
const struct gw_ibv *gw__ibv(void);

#endif
