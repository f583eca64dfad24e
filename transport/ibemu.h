/* ibemu.h - the verbs emulator's data structures, shared by ibemu.c (the verbs
 * themselves: objects, posting, executing, polling) and ibemu_fabric.c (where
 * things are: the LID registry, GIDs, the shared segments and reaching a
 * responder's).  Tests only (GW_IB_EMULATE=1).  Not installed. */
#ifndef GW_IBEMU_H
#define GW_IBEMU_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ibv.h"

#define EMU_MAGIC 0x756d656269777767ull /* "gwibemu" */
#define MAX_DEVICES 16
#define MAX_PKEYS 8
#define GID_TABLE 16 /* a port's GID table entries (a ConnectX has 256, most of them empty) */
#define MAX_QP 1024    /* QP slots per context; qp_num = generation << 10 | slot */
#define MAX_MR 4096    /* MR slots per context; key = generation << 12 | slot */
#define RQ_SLOTS 4096  /* inbound completion slots per QP (>= MAX_WR) */
#define MAX_WR 4096
#define MAX_SGE 16
#define MAX_INLINE 256
#define MAX_CQE (1 << 22)
#define NLIDS 65536
#define RQ_CLOSED UINT64_MAX /* rq `claimed` while the QP takes no inbound messages */
#define BLOCKED (-1)         /* a send WR that cannot complete yet */
#define MR_ACCESS_OK                                                                       \
  (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |            \
   IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING)
#define SEND_FLAGS_OK (IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE)

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "the segment is shared between processes: its atomics must be lock-free");

/* ---- the shared segment: only atomics on naturally aligned words ------------- */
struct seg_mr {
  _Atomic uint32_t key; /* 0 while the slot is free; written last (release) */
  _Atomic uint32_t access, pd, pad;
  _Atomic uint64_t addr, length;
};
struct seg_in { /* one inbound WRITE_WITH_IMM, at slot claimed % RQ_SLOTS */
  _Atomic uint64_t seq; /* claimed index + 1, published last (release) */
  _Atomic uint32_t imm, byte_len;
};
struct seg_qp {
  _Atomic uint32_t qpn; /* 0 while the slot is free */
  _Atomic uint32_t state, pd, access, min_rnr_timer;
  _Atomic uint32_t gid_type; /* RoCE: the type of the GID its address vector sends from */
  _Atomic uint32_t access_err; /* a requester's write was refused here (IBV_EVENT_QP_ACCESS_ERR) */
  _Atomic uint32_t rq_psn; /* the first packet sequence number its receive side expects (RTR) */
  _Atomic uint32_t pkey;   /* the P_Key at its INIT's pkey_index (host order) */
  _Atomic uint64_t posted;  /* receives posted by the owner, ever (release) */
  _Atomic uint64_t claimed; /* receives taken by senders, ever; RQ_CLOSED when closed */
  uint64_t pad2[4];
  struct seg_in in[RQ_SLOTS];
};
struct seg_hdr {
  uint64_t magic, nonce;
  int32_t pid;
  _Atomic uint32_t alive;
  _Atomic uint32_t port_down; /* its port is down (or the device failed): nothing reaches it */
};
struct seg {
  union {
    struct seg_hdr h;
    char page[4096];
  } hdr;
  struct seg_mr mr[MAX_MR];
  struct seg_qp qp[MAX_QP];
};
#define SEG_SIZE sizeof(struct seg) /* about 64 MiB, sparse: untouched pages cost nothing */

/* ---- process-local objects ------------------------------------------------------ */
struct swr { /* a posted send WR, as the requester keeps it */
  uint64_t wr_id, raddr;
  uint32_t rkey, imm, len;
  int with_imm, signaled, inl, nsge, started, rnr_count, status;
  double t_first, t_rnr; /* first attempt; when the running RNR timer expires */
  double t_post;         /* posted (GW_IB_EMULATE_DELAY_US counts from here) */
  uint64_t src_hash;     /* a sample of the source bytes at the post (src_sample) */
  int hashed;            /* src_hash was taken (not inline, the source was readable) */
};
struct emu_ctx;
struct emu_pd {
  struct ibv_pd pd;
  int refs;
  struct emu_pd *next;
};
struct emu_cq {
  struct ibv_cq cq;
  int refs, overrun;
  struct emu_cq *next;
};
struct emu_mr {
  struct ibv_mr mr;
  int slot;
  uint64_t locked;
};
struct emu_qp {
  struct ibv_qp qp;
  struct emu_ctx *ctx;
  struct seg_qp *sh;
  struct emu_cq *scq, *rcq;
  struct ibv_qp_cap cap;
  int sig_all, errored;
  struct ibv_ah_attr ah;
  uint32_t dest_qpn;
  uint64_t dest_nonce; /* the context the QP reached first: a later owner of its LID is not it */
  uint8_t timeout, retry_cnt, rnr_retry;
  uint32_t sq_psn; /* its first packet's sequence number (RTS) */
  struct swr *sq;
  struct ibv_sge *sge; /* max_send_sge per SQ entry */
  uint8_t *inl;        /* max_inline_data per SQ entry */
  uint64_t sq_head, sq_rep, sq_exec, sq_tail; /* covered <= reported <= executed <= posted */
  uint64_t sq_cqes;                           /* completions made, not yet polled */
  uint64_t *rq_wrid;
  uint64_t rq_post, rq_cons;
  int access_reported, unacked; /* its access error event taken; events taken, not acked */
};
struct remote { /* a mapped remote segment, by LID */
  uint16_t lid;
  int32_t pid;
  int pidfd, exited;
  uint64_t nonce;
  double checked; /* when its process was last seen alive */
  struct seg *seg;
};
struct emu_ctx {
  struct ibv_context ctx;
  pthread_mutex_t lock;
  int memfd, eth;
  int roce_v2; /* RoCE: the GID table has v2 entries (GW_IB_EMULATE_ROCE) */
  int efa;     /* GW_IB_EMULATE_LINK=efa: a device without RC queue pairs (AWS EFA's SRD) */
  int32_t pid;
  uint16_t lid;
  uint64_t nonce;
  struct seg *seg;
  struct emu_qp *qps[MAX_QP];
  uint16_t qp_gen[MAX_QP];
  struct emu_qp *live[MAX_QP];
  int nlive;
  unsigned rot;
  struct emu_mr *mrs[MAX_MR];
  uint32_t mr_gen[MAX_MR];
  struct emu_pd *pds;
  struct emu_cq *cqs;
  uint32_t handles;
  struct remote *rem;
  int nrem, caprem;
  int port_down, fatal;
  enum ibv_event_type events[16]; /* port and device events not yet taken */
  int nevents;
};

#define CTX(c) ((struct emu_ctx *)(c))
#define QP(q) ((struct emu_qp *)(q))
#define CQ(q) ((struct emu_cq *)(q))
#define PD(p) ((struct emu_pd *)(p))
#define MR(m) ((struct emu_mr *)(m))

/* ---- ibemu.c ------------------------------------------------------------------------ */
/* The error state: queued sends are flushed, the receive queue takes no more
 * inbound messages and its receives are flushed as the owner polls. */
void gw__ibemu_enter_error(struct emu_qp *q);
/* ibemu_qp_attrs.c: checks the attributes `rest` (the mask without
 * IBV_QP_STATE) of the RC transition cur -> to and applies them to q; 0, or
 * EINVAL for a transition or attribute the kernel would refuse (nothing applied). */
int gw__ibemu_qp_attrs(struct emu_qp *q, const struct ibv_qp_attr *a, int rest, int cur, int to);

/* ---- ibemu_device.c ----------------------------------------------------------------- */
/* The emulator's ibv_get/free_device_list, ibv_get_device_name,
 * ibv_query_device, ibv_query_port, ibv_query_gid(_ex), ibv_get/ack_async_event. */
struct ibv_device **gw__ibemu_get_device_list(int *num);
void gw__ibemu_free_device_list(struct ibv_device **list);
const char *gw__ibemu_get_device_name(struct ibv_device *d);
int gw__ibemu_query_device(struct ibv_context *ctx, struct ibv_device_attr *a);
/* dev's index among the emulator's devices, or -1 when it is not one of them. */
int gw__ibemu_device_index(const struct ibv_device *dev);
int gw__ibemu_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a);
int gw__ibemu_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
int gw__ibemu_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey);
/* The P_Key table (GW_IB_EMULATE_PKEYS: hex keys, comma-separated, up to
 * MAX_PKEYS; default ffff): its length, the keys into keys[] (host order). */
int gw__ibemu_pkeys(uint16_t keys[MAX_PKEYS]);
int gw__ibemu_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index, struct ibv_gid_entry *e,
                           uint32_t flags);
int gw__ibemu_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev);
void gw__ibemu_ack_async_event(struct ibv_async_event *ev);
/* GID index of c's table into gid; its IBV_GID_TYPE_*, or -1 past the table. */
int gw__ibemu_gid_entry(const struct emu_ctx *c, int index, union ibv_gid *gid);
const char *gw__ibemu_link(void); /* GW_IB_EMULATE_LINK: ib, eth or efa */
/* Whether fork_init was called (and before any registration: it fails after). */
int gw__ibemu_fork_inited(void);
/* Test hooks: the port goes down (up = 0: its QPs reach nobody and nobody
 * them, IBV_EVENT_PORT_ERR) or comes back (IBV_EVENT_PORT_ACTIVE); the device
 * fails (IBV_EVENT_DEVICE_FATAL, every QP in the error state, for good). */
void gw__ibemu_set_port(struct ibv_context *ctx, int up);
void gw__ibemu_device_fatal(struct ibv_context *ctx);

/* ---- ibemu_fabric.c ----------------------------------------------------------------- */
/* Opens the host-wide LID registry once; 0 or an errno value. */
int gw__ibemu_registry_open(void);
/* Claims a free LID (>= 1) for this process's context behind memfd fd; 0 when
 * none is left.  Release gives it back. */
uint16_t gw__ibemu_lid_claim(int32_t pid, int fd, uint64_t nonce);
void gw__ibemu_lid_release(uint16_t lid);
/* GID index 0 or 1 of a LID, and the LID a GID of either form names (0: none). */
void gw__ibemu_lid_gid(uint16_t lid, int index, union ibv_gid *g);
uint16_t gw__ibemu_gid_lid(const union ibv_gid *g);
/* A context's shared segment (a sealed memfd, mapped), or NULL with errno set. */
struct seg *gw__ibemu_seg_create(int *memfd);
/* The responder's segment for q and its pid, or NULL while it cannot be reached. */
struct seg *gw__ibemu_qp_remote(struct emu_qp *q, int32_t *pid);

#endif
