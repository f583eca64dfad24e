/* ib_conn.h - what the ib transport's two halves share: the connection's
 * state and wire structs (ib.c: completions, liveness, the data path;
 * ib_setup.c: creating and connecting a connection). */
#ifndef GW_IB_CONN_H
#define GW_IB_CONN_H

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ib_dev.h"
#include "ibv.h"
#include "sock.h"
#include "transport.h"


#define IB_MAX_QPS GW_IB_MAX_QPS
#define IB_MAX_HELD 4 /* registrations one connection holds at once (an operation reads at most two) */
#define IB_HDR_BYTES 64u /* the chunk header at the start of every slot */
#define IB_MIN_PART (64u << 10)
#define IB_HANDLE_MAGIC 0x32697767u /* "gwi2": with the partition key */
#define IB_HELLO_MAGIC 0x6c686268u
#define IB_READY_BYTE 'R'
/* After the ready byte the receiver writes to the liveness socket waiting
 * records (ib_waiting: this byte, then the operation it waits in, host order:
 * both ends are one job's), and once, if its rank fails (recv_abandon), the
 * abandon byte, a 2-byte length and the reason. */
#define IB_WAIT_BYTE 'W'
#define IB_WAIT_BYTES (1 + sizeof(struct gw_opdesc))
_Static_assert(IB_WAIT_BYTES <= GW_WAY_BACK_MAX, "a waiting record fits the way back");
#define IB_ABANDON_BYTE 'A'
#define IB_ABANDON_MAX 480
#define IB_RECV_WRID (1ull << 63) /* receive work requests: this bit + QP index */

/* ---- connection state ----------------------------------------------------------------- */
struct ib_qpx {
  struct ibv_qp *qp;
  uint64_t posted; /* send work requests posted */
  uint64_t done;   /* of them, known complete (a signaled completion covers all before it) */
  uint64_t direct; /* the last write that reads user memory: the operation waits for it */
  uint64_t last_sig; /* the last signaled write */
  uint32_t unsig;  /* unsignaled since the last signaled one */
};

/* The handle the receiver publishes: everything the sender needs to connect. */
struct ib_handle {
  uint32_t magic;
  uint8_t nqps, nslots, mtu, eth;
  struct gw_sockaddr_packed addr; /* the receiver's liveness socket */
  uint64_t nonce;
  uint64_t slots_addr;
  uint32_t slots_rkey, slot_bytes;
  uint32_t qpn[IB_MAX_QPS];
  uint8_t gid[16];
  uint16_t lid;
  uint8_t rail; /* the index of the receiver's port among its process's */
  int8_t gid_type; /* RoCE: IBV_GID_TYPE_* of its GID, -1 unknown */
  uint16_t pkey;   /* its QPs' partition key (host order) */
};
_Static_assert(sizeof(struct ib_handle) <= GW_CONN_HANDLE_BYTES, "ib handle fits the opaque handle");

/* What the sender tells the receiver over the socket. */
struct ib_hello {
  uint32_t magic;
  int32_t sender;
  uint64_t job_hash, nonce;
  uint64_t credit_addr;
  uint32_t credit_rkey, nqps;
  uint32_t qpn[IB_MAX_QPS];
  uint8_t gid[16];
  uint16_t lid;
  uint8_t mtu, eth;
  int8_t gid_type;
  uint16_t pkey;
};
_Static_assert(sizeof(struct ib_hello) <= GW_HELLO_MAX, "a hello the accept set can hold");

#define IB_DIRECT_MIN (16u << 10) /* smaller chunks are cheaper to copy into a slot */

struct ib_conn {
  struct ib_port *port;
  uint32_t nslots, slot_bytes, stride, nqps, depth, sig_every;
  struct ibv_cq *cq;
  struct ib_qpx q[IB_MAX_QPS];
  uint8_t *buf; /* sender: staging slots; receiver: the slots the sender writes */
  size_t buf_bytes;
  struct ibv_mr *mr;
  uint64_t *credits; /* sender: entry pos % nslots = pos + 1 once chunk pos was released */
  struct ibv_mr *credit_mr;
  uint64_t raddr; /* sender: the receiver's slots; receiver: the sender's credits */
  uint32_t rkey;
  uint64_t pos;            /* sender: chunks posted; receiver: next chunk to deliver */
  uint8_t *got, *need;     /* receiver, per slot: parts arrived, parts expected */
  uint32_t *arrived;       /* receiver, per slot: bytes its parts' writes carried */
  uint64_t credits_posted; /* receiver: releases written to the sender so far */
  /* Receiver: where each slot's credit is written from, registered: no inline
   * data (some providers have none, and NCCL uses none by default).  Entry
   * p % nslots is written again for chunk p + nslots once the write of credit
   * p is known complete (reads, below). */
  uint64_t *credit_src;
  struct ibv_mr *credit_src_mr;
  /* Per slot and QP (sender) or per credit word on QP 0 (receiver): the last
   * write that reads it.  A source belongs to the HCA until a polled
   * completion covers its write, not merely until the peer has the data: a
   * lost ack makes the HCA send it again, from the buffer as it is then. */
  uint64_t *reads;
  int fd, listen_fd;
  bool ready; /* sender: the receiver's QPs are ready (its byte arrived); receiver: connected */
  bool eof;   /* the peer closed the liveness socket */
  int eof_errno; /* or it failed with this error (keepalive's ETIMEDOUT: the machine or the network) */
  /* The peer closed, and this end's queue pair failed after it (a credit write
   * to the gone sender, the receives flushed): no error of this connection's
   * until something is still to come from it (a chunk: the peer's end then). */
  bool quiet;
  /* Sender: what the receiver wrote after its ready byte and this end has
   * not consumed: waiting records are taken out (the latest kept in
   * peer_wait), an abandon frame stays at the front. */
  uint8_t ab_buf[3 + IB_ABANDON_MAX];
  uint32_t ab_got;
  bool peer_waits;
  struct gw_opdesc peer_wait;
  atomic_flag sock_lock; /* the liveness socket's reading (ib.c: check_socket) */
  /* Receiver: the waiting record still to go and the operation it published
   * last (sock.h's way back; recv_abandon may come from another thread). */
  struct gw_way_back back;
  uint64_t nonce, job_hash;
  double timeout_s, next_check;
  uint8_t qp_timeout, qp_retry_cnt; /* GW_IB_TIMEOUT, GW_IB_RETRY_CNT, read by qp_connect */
  uint8_t sl, tc;                   /* GW_IB_SL, GW_IB_TC */
  gw_result_t failed;
  char failmsg[GW_ERRMSG_MAX];
  char where[80]; /* " on mlx5_0:1", for messages */
  uint32_t direct_lkey; /* sender: of the registration direct_ok found */
  /* Sender: the registrations its writes from user memory read, held until
   * those writes completed (ib_progress) or the queue pairs are gone. */
  struct ib_reg *held[IB_MAX_HELD];
  int nheld;
  /* An async event on its QPs or CQ (their qp_context / cq_context point
   * here; gw__ib_events stores the IBV_EVENT_* type + 1: CQ_ERR is 0). */
  atomic_int async_err;
  int test_bad_rkey; /* GW_IB_TEST_BAD_RKEY: the Nth data write uses a wrong rkey (tests) */
  uint32_t writes;
};

#define fail(c, t, code, ...) gw__conn_fail((c), &(t)->failed, (t)->failmsg, (t)->where, (code), __VA_ARGS__)

/* ib_setup.c */
void gw__ib_conn_free(struct ib_conn *t);
int gw__ib_post_recv(struct ib_conn *t, uint32_t qi);
gw_result_t gw__ib_recv_setup(struct gw_conn *c, const struct gw_conn_params *p, struct gw_conn_handle *out,
                              struct gw_errctx *err);
gw_result_t gw__ib_send_connect(struct gw_conn *c, const struct gw_conn_params *p, const struct gw_conn_handle *in,
                                struct gw_errctx *err);
gw_result_t gw__ib_recv_connect(struct gw_conn *c, struct gw_errctx *err);

#endif
