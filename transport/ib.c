/* ib.c - the InfiniBand (and RoCE) verbs transport: the connection of DESIGN.md
 * between machines, the way NCCL's net_ib moves data.  The receiver owns the
 * slot FIFO, registered for remote writes; the sender stages each chunk in its
 * own registered slot and writes it, header first, straight into the receiver's
 * slot with RDMA WRITE WITH IMM (one write per queue pair when a chunk is split
 * over GW_IB_QPS_PER_CONN reliable-connected QPs); the immediate carries the
 * chunk's position and part count, and consumes a receive the receiver posted
 * ahead.  The receiver hands slots back by writing the released position into
 * the sender's registered credit array (an 8-byte RDMA WRITE), which the sender
 * polls in its own memory: credits, so a write never lands in an unread slot.
 * Sends are unsignaled except every sig_every-th per QP, so the send queue never
 * overflows and completions stay rare.  A staging slot (or credit word) is
 * written again only once the peer released it and a polled completion covers
 * its last write (a zero-length signaled write is posted when none would):
 * the HCA may read a source again until then, to retransmit after a lost ack.
 * Every failed work request completes
 * anyway, with a status this file turns into an error naming both ranks and the
 * device, with a hint.
 *
 * Connection setup is out of band: the receiver's QP numbers, address (LID/GID),
 * slot address and rkey travel in the connection handle through the bootstrap;
 * the sender sends its own over a TCP socket to the receiver, which stays open as
 * the connection's liveness channel (a peer that dies closes it at once, long
 * before the HCA's retry timeout would say so) and carries the receiver's "ready"
 * byte so no write reaches a QP that is not yet ready to receive.  Not librdmacm:
 * its connection manager needs IP addresses on the IB interfaces (IPoIB) and its
 * own event loop, while every rank already reaches every other over the
 * bootstrap's network; NCCL makes the same choice.
 *
 * Verbs are called through one table (ibv.h): libibverbs, or the user-space
 * emulator when GW_IB_EMULATE=1 (tests on machines without an HCA).  The ports
 * and the registration cache, which outlive connections, are in ib_dev.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
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

#define IB_MAX_QPS 8
#define IB_MAX_HELD 4 /* registrations one connection holds at once (an operation reads at most two) */
#define IB_HDR_BYTES 64u /* the chunk header at the start of every slot */
#define IB_MIN_PART (64u << 10)
#define IB_HANDLE_MAGIC 0x32697767u /* "gwi2": with the partition key */
#define IB_HELLO_MAGIC 0x6c686268u
#define IB_READY_BYTE 'R'
/* After the ready byte the receiver writes to the liveness socket only once,
 * if its rank fails (recv_abandon): this byte, a 2-byte length (host order:
 * both ends are one job's), the reason. */
#define IB_ABANDON_BYTE 'A'
#define IB_ABANDON_MAX 480
#define IB_RECV_WRID (1ull << 63) /* receive work requests: this bit + QP index */
static bool ib_can_connect(const struct gw_peer_info *self, const struct gw_peer_info *peer) {
  return (self->caps & GW_CAP_IB) && (peer->caps & GW_CAP_IB);
}

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
  /* The peer closed, and this end's queue pair failed after it (a credit write
   * to the gone sender, the receives flushed): no error of this connection's
   * until something is still to come from it (a chunk: the peer's end then). */
  bool quiet;
  /* Sender: what the receiver wrote after its ready byte (recv_abandon). */
  uint8_t ab_buf[3 + IB_ABANDON_MAX];
  uint32_t ab_got;
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

/* The credit words, registered: pages of their own, so what registration does
 * to its pages (MADV_DONTFORK under RDMAV_FORK_SAFE on older kernels) touches
 * nothing else of the heap.  Zeroed; NULL when out of memory. */
static uint64_t *credit_words(uint32_t n) {
  void *m = mmap(NULL, (size_t)n * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return m == MAP_FAILED ? NULL : m;
}

static void credit_words_free(uint64_t *w, uint32_t n) {
  if (w) munmap(w, (size_t)n * sizeof(uint64_t));
}

static void conn_free(struct ib_conn *t) {
  const struct gw_ibv *v = gw__ib_devs.v;
  for (uint32_t i = 0; i < IB_MAX_QPS; i++)
    if (t->q[i].qp) v->destroy_qp(t->q[i].qp);
  gw__ib_reg_release(t->held, &t->nheld); /* nothing reads them any more */
  if (t->cq) v->destroy_cq(t->cq);
  if (t->mr) v->dereg_mr(t->mr);
  if (t->credit_mr) v->dereg_mr(t->credit_mr);
  if (t->credit_src_mr) v->dereg_mr(t->credit_src_mr);
  credit_words_free(t->credit_src, t->nslots);
  if (t->buf) munmap(t->buf, t->buf_bytes);
  credit_words_free(t->credits, t->nslots);
  free(t->got);
  free(t->need);
  free(t->arrived);
  free(t->reads);
  if (t->fd >= 0) close(t->fd);
  if (t->listen_fd >= 0) close(t->listen_fd);
  free(t);
}

/* ibv_reg_mr with the hint a user needs when it fails. */
static struct ibv_mr *reg(struct gw_conn *c, struct ib_conn *t, void *addr, size_t len, int access,
                          struct gw_errctx *err, gw_result_t *res) {
  struct ibv_mr *mr = gw__ib_devs.v->reg_mr(t->port->pd, addr, len, access);
  if (mr) return mr;
  int e = errno;
  *res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot register %zu bytes with %s for rank %d: %s%s", c->self, len,
                 t->port->name, c->peer, strerror(e),
                 e == ENOMEM ? " (the locked-memory limit is too low: raise `ulimit -l`, e.g. to unlimited, "
                               "or lower GW_SHM_SLOTS / GW_SHM_SLOT_BYTES)"
                             : "");
  return NULL;
}

/* A port of the link layer want_eth (0 InfiniBand, 1 RoCE, -1 either), or
 * NULL when this process has none of that kind.  The receiving end takes the
 * next one round robin (connections spread over the rails); the sending end
 * (peer_gid set: the receiver's port) the one on the receiver's rail: the same
 * index among its ports with the same GID subnet prefix, else any with that
 * prefix, else round robin.  Chosen apart, the ends of every connection could
 * sit on different rails: separate subnets never reach each other (the writes
 * fail after the retry timeout), joined ones cross the spine. */
static struct ib_port *pick_port(int want_eth, int peer_rail, const uint8_t *peer_gid) {
  const int n = gw__ib_devs.n;
  /* A port whose device failed for good (IBV_EVENT_DEVICE_FATAL) takes no new
   * connection: a communicator made after one failed on it went there again
   * and failed at its first send. */
  gw__ib_events(true);
  if (peer_gid) {
    for (int pass = 0; pass < 2; pass++)
      for (int k = 0; k < n; k++) {
        struct ib_port *pt = &gw__ib_devs.ports[k];
        if ((want_eth >= 0 && pt->eth != (want_eth == 1)) || memcmp(pt->gid.raw, peer_gid, 8) != 0 ||
            atomic_load(&pt->fatal))
          continue;
        if (pass == 1 || k == peer_rail) return pt;
      }
  }
  unsigned first = atomic_fetch_add(&gw__ib_devs.next, 1);
  for (int k = 0; k < n; k++) {
    struct ib_port *pt = &gw__ib_devs.ports[(first + (unsigned)k) % (unsigned)n];
    if ((want_eth < 0 || pt->eth == (want_eth == 1)) && !atomic_load(&pt->fatal)) return pt;
  }
  return NULL;
}

/* GW_IB_SL and GW_IB_TC, checked: out of range, modify_qp said only EINVAL
 * (under the GID index hint) for a service level, and a traffic class of 256
 * was taken as 0 (on RoCE, perhaps a lossy class). */
static gw_result_t sl_tc(struct gw_conn *c, uint8_t *sl, uint8_t *tc, struct gw_errctx *err) {
  const int64_t s = gw__env_int("GW_IB_SL", 0), t = gw__env_int("GW_IB_TC", 0);
  if (s < 0 || s > 15)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_IB_SL=%s is not a service level (0..15)", c->self,
                   gw__env_str("GW_IB_SL", ""));
  if (t < 0 || t > 255)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_IB_TC=%s is not a traffic class (0..255)", c->self,
                   gw__env_str("GW_IB_TC", ""));
  *sl = (uint8_t)s, *tc = (uint8_t)t;
  return GW_SUCCESS;
}

/* Everything both ends create: the port (as pick_port chooses), the slots
 * (staging or receive), the CQ and the QPs in INIT. */
static gw_result_t conn_create(struct gw_conn *c, const struct gw_conn_params *p, uint32_t nqps, int buf_access,
                               int want_eth, int peer_rail, const uint8_t *peer_gid, struct ib_conn **out,
                               struct gw_errctx *err) {
  if (!gw__ib_available())
    return gw__err(err, GW_ERR_UNSUPPORTED, "rank %d: no active ib port (GW_IB_HCA, GW_IB_EMULATE)", c->self);
  struct ib_port *port = pick_port(want_eth, peer_rail, peer_gid);
  if (!port)
    return gw__err(err, GW_ERR_UNSUPPORTED, "rank %d: rank %d's ib port is %s, none of this rank's is", c->self,
                   c->peer, want_eth ? "RoCE (Ethernet)" : "InfiniBand");
  /* The QP's ack timeout (4.096 us x 2^N per try) and retries, which decide
   * how soon a dead peer is noticed: out of range, modify_qp says only EINVAL;
   * 0 is "never" on hardware (the emulator took it for 14). */
  const int64_t qto = gw__env_int("GW_IB_TIMEOUT", 18), qrc = gw__env_int("GW_IB_RETRY_CNT", 7);
  if (qto < 1 || qto > 31)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_IB_TIMEOUT=%lld is not in 1..31 (each try waits "
                   "4.096 us x 2^N; 0, no timeout, would leave a dead peer unnoticed)", c->self, (long long)qto);
  if (qrc < 0 || qrc > 7)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_IB_RETRY_CNT=%lld is not in 0..7", c->self,
                   (long long)qrc);
  const int64_t roce = gw__env_int("GW_IB_ROCE_VERSION", 2);
  if (roce != 1 && roce != 2)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_IB_ROCE_VERSION=%s is not 1 or 2", c->self,
                   gw__env_str("GW_IB_ROCE_VERSION", ""));
  uint8_t sl = 0, tc = 0;
  GW_CHECK(sl_tc(c, &sl, &tc, err));
  struct ib_conn *t = calloc(1, sizeof *t);
  if (!t) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
  t->qp_timeout = (uint8_t)qto, t->qp_retry_cnt = (uint8_t)qrc, t->sl = sl, t->tc = tc;
  const struct gw_ibv *v = gw__ib_devs.v;
  gw_result_t res = GW_SUCCESS;
  t->fd = t->listen_fd = -1;
  t->port = port;
  snprintf(t->where, sizeof t->where, " on %s", t->port->name);
  t->nslots = p->nslots;
  t->slot_bytes = p->slot_bytes;
  t->stride = IB_HDR_BYTES + p->slot_bytes;
  t->nqps = nqps;
  t->depth = t->nslots + 8;
  /* Often enough that a slot's writes are covered by a completion before the
   * slot comes round again on each QP (nslots / nqps writes per QP a cycle when
   * chunks are single parts), so reusing it seldom needs a fence. */
  t->sig_every = GW_MAX(1u, GW_MIN(t->depth / 4, t->nslots / (2 * t->nqps)));
  t->job_hash = p->job_hash;
  t->timeout_s = p->timeout_s > 0 ? p->timeout_s : 60;
  t->test_bad_rkey = (int)gw__env_int("GW_IB_TEST_BAD_RKEY", 0);
  t->buf_bytes = (size_t)t->nslots * t->stride;
  if (!(t->reads = calloc((size_t)t->nslots * IB_MAX_QPS, sizeof *t->reads))) {
    free(t);
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
  }
  void *m = mmap(NULL, t->buf_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (m == MAP_FAILED) {
    t->buf = NULL;
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot allocate %zu bytes of ib slots: %s", c->self, t->buf_bytes,
                  strerror(errno));
    goto fail;
  }
  t->buf = m;
  if (!(t->mr = reg(c, t, t->buf, t->buf_bytes, buf_access, err, &res))) goto fail;
  int cqe = (int)(nqps * (t->nslots + t->depth) + 16);
  t->cq = v->create_cq(t->port->ctx, cqe, &t->async_err, NULL, 0);
  if (!t->cq) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot create a completion queue of %d on %s: %s", c->self, cqe,
                  t->port->name, strerror(errno));
    goto fail;
  }
  for (uint32_t i = 0; i < nqps; i++) {
    struct ibv_qp_init_attr ia = {.qp_context = &t->async_err, .send_cq = t->cq, .recv_cq = t->cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = t->depth, .max_recv_wr = t->nslots, .max_send_sge = 2,
                                          .max_recv_sge = 1, .max_inline_data = 0}};
    t->q[i].qp = v->create_qp(t->port->pd, &ia);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = (uint16_t)t->port->pkey_index,
                            .port_num = t->port->num,
                            .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE};
    int e = t->q[i].qp ? v->modify_qp(t->q[i].qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                                           IBV_QP_ACCESS_FLAGS)
                       : errno;
    if (e) {
      res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot create queue pair %u of %u on %s for rank %d: %s", c->self,
                    i + 1, nqps, t->port->name, c->peer, strerror(e));
      goto fail;
    }
  }
  *out = t;
  return GW_SUCCESS;
fail:
  conn_free(t);
  return res;
}

/* A QP through RTR and RTS towards the remote QP `qpn`, the sequence numbers
 * of queue pair i of the connection `nonce` from this end (receiver or not). */
static int qp_connect(struct ib_conn *t, struct ibv_qp *qp, uint32_t qpn, uint16_t lid, const uint8_t gid[16],
                      uint8_t mtu, uint64_t nonce, int receiver, uint32_t i, double deadline) {
  const struct ib_port *pt = t->port;
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                          .path_mtu = (enum ibv_mtu)GW_MIN((unsigned)pt->attr.active_mtu, (unsigned)mtu),
                          .dest_qp_num = qpn, .rq_psn = gw__ib_qp_psn(nonce, !receiver, i), .max_dest_rd_atomic = 1,
                          .min_rnr_timer = 12};
  a.ah_attr.dlid = lid;
  a.ah_attr.sl = t->sl;
  a.ah_attr.port_num = pt->num;
  if (pt->gid_index >= 0) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)pt->gid_index;
    a.ah_attr.grh.hop_limit = 255;
    a.ah_attr.grh.traffic_class = t->tc;
  }
  /* ETIMEDOUT: on RoCE the kernel resolves the peer's MAC for the address
   * vector, which times out when many connections start at once; tried
   * again, 100 ms more each time (as NCCL does), until the deadline. */
  int e;
  for (int tries = 1;; tries++) {
    e = gw__ib_devs.v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    const double pause = 0.1 * tries;
    if (e != ETIMEDOUT || gw__now() + pause > deadline) break;
    GW_WARN(GW_SUB_INIT, "queue pair %u on %s: the move to RTR timed out (address resolution?), try %d; again in "
            "%.1f s", i, pt->name, tries, pause);
    struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
  }
  if (e) return e;
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = t->qp_timeout, .retry_cnt = t->qp_retry_cnt,
                           .rnr_retry = 7, .sq_psn = gw__ib_qp_psn(nonce, receiver, i),
                           .max_rd_atomic = 1};
  return gw__ib_devs.v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                      IBV_QP_MAX_QP_RD_ATOMIC);
}

static int post_recv(struct ib_conn *t, uint32_t qi) {
  struct ibv_recv_wr wr = {.wr_id = IB_RECV_WRID | qi}, *bad;
  return gw__ib_devs.v->post_recv(t->q[qi].qp, &wr, &bad);
}

static uint32_t qps_per_conn(void) {
  int64_t n = gw__env_int("GW_IB_QPS_PER_CONN", 1);
  return (uint32_t)GW_MAX(1, GW_MIN(n, IB_MAX_QPS));
}

/* ---- setup ----------------------------------------------------------------------------- */
static gw_result_t ib_recv_setup(struct gw_conn *c, const struct gw_conn_params *p, struct gw_conn_handle *out,
                                 struct gw_errctx *err) {
  struct ib_conn *t;
  if (p->local_addr_len == 0) return gw__err(err, GW_ERR_INTERNAL, "rank %d: no local address for ib", c->self);
  GW_CHECK(conn_create(c, p, qps_per_conn(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, -1, -1, NULL, &t, err));
  gw_result_t res = GW_SUCCESS;
  t->got = calloc(t->nslots, 1);
  t->need = calloc(t->nslots, 1);
  t->arrived = calloc(t->nslots, sizeof *t->arrived);
  t->credit_src = credit_words(t->nslots);
  if (!t->got || !t->need || !t->arrived || !t->credit_src ||
      getrandom(&t->nonce, sizeof t->nonce, 0) != sizeof t->nonce) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory or entropy", c->self);
    goto fail;
  }
  if (!(t->credit_src_mr = reg(c, t, t->credit_src, t->nslots * sizeof(uint64_t), IBV_ACCESS_LOCAL_WRITE, err, &res)))
    goto fail;
  for (uint32_t i = 0; i < t->nqps; i++)
    for (uint32_t k = 0; k < t->nslots; k++) {
      int e = post_recv(t, i);
      if (e) {
        res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot post receives on %s: %s", c->self, t->port->name,
                      strerror(e));
        goto fail;
      }
    }
  struct sockaddr_storage a;
  t->listen_fd = gw__sock_listen(&p->local_addr, p->local_addr_len, 4, &a);
  if (t->listen_fd < 0) {
    char where[96];
    gw__sock_addr_str(&p->local_addr, where, sizeof where);
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot listen for rank %d on %s: %s (check GW_SOCKET_IFNAME)",
                  c->self, c->peer, where, strerror(errno));
    goto fail;
  }
  struct ib_handle h = {.magic = IB_HANDLE_MAGIC, .nqps = (uint8_t)t->nqps, .nslots = (uint8_t)t->nslots,
                        .mtu = (uint8_t)t->port->attr.active_mtu, .eth = t->port->eth, .nonce = t->nonce,
                        .slots_addr = (uintptr_t)t->buf, .slots_rkey = t->mr->rkey, .slot_bytes = t->slot_bytes,
                        .lid = t->port->attr.lid, .rail = (uint8_t)(t->port - gw__ib_devs.ports),
                        .gid_type = (int8_t)t->port->gid_type, .pkey = t->port->pkey};
  gw__sock_pack(&a, &h.addr);
  memcpy(h.gid, t->port->gid.raw, 16);
  for (uint32_t i = 0; i < t->nqps; i++) h.qpn[i] = t->q[i].qp->qp_num;
  memset(out, 0, sizeof *out);
  memcpy(out->bytes, &h, sizeof h);
  c->priv = t;
  return GW_SUCCESS;
fail:
  conn_free(t);
  return res;
}

static gw_result_t ib_send_connect(struct gw_conn *c, const struct gw_conn_params *p, const struct gw_conn_handle *in,
                                   struct gw_errctx *err) {
  struct ib_handle h;
  memcpy(&h, in->bytes, sizeof h);
  struct sockaddr_storage a;
  socklen_t al;
  if (h.magic != IB_HANDLE_MAGIC || h.nqps < 1 || h.nqps > IB_MAX_QPS || !gw__sock_unpack(&h.addr, &p->local_addr, &a, &al))
    return gw__err(err, GW_ERR_REMOTE, "rank %d: rank %d sent a malformed ib handle", c->self, c->peer);
  if (h.nslots != p->nslots || h.slot_bytes != p->slot_bytes)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT,
                   "rank %d: rank %d uses %u slots of %u bytes, this rank %u of %u: GW_SHM_SLOTS and "
                   "GW_SHM_SLOT_BYTES must agree on every rank", c->self, c->peer, h.nslots, h.slot_bytes,
                   p->nslots, p->slot_bytes);
  struct ib_conn *t; /* the receiver decides nqps; a port of its link layer */
  GW_CHECK(conn_create(c, p, h.nqps, IBV_ACCESS_LOCAL_WRITE, h.eth ? 1 : 0, h.rail, h.gid, &t, err));
  gw_result_t res = GW_SUCCESS;
  t->raddr = h.slots_addr;
  t->rkey = h.slots_rkey;
  t->credits = credit_words(t->nslots);
  if (!t->credits) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
    goto fail;
  }
  memset(t->credits, 0, t->nslots * sizeof(uint64_t));
  t->credit_mr = reg(c, t, t->credits, t->nslots * sizeof(uint64_t), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                     err, &res);
  if (!t->credit_mr) goto fail;
  struct ib_hello hello = {.magic = IB_HELLO_MAGIC, .sender = c->self, .job_hash = t->job_hash, .nonce = h.nonce,
                           .credit_addr = (uintptr_t)t->credits, .credit_rkey = t->credit_mr->rkey, .nqps = t->nqps,
                           .lid = t->port->attr.lid, .mtu = (uint8_t)t->port->attr.active_mtu, .eth = t->port->eth,
                           .gid_type = (int8_t)t->port->gid_type, .pkey = t->port->pkey};
  memcpy(hello.gid, t->port->gid.raw, 16);
  for (uint32_t i = 0; i < t->nqps; i++) hello.qpn[i] = t->q[i].qp->qp_num;
  char where[96];
  gw__sock_addr_str(&a, where, sizeof where);
  /* RoCE versions that differ: the hello still goes (briefly tried), so the
   * receiver learns it from there instead of waiting for this rank. */
  gw_result_t agree = gw__ib_roce_agree(t->port, h.gid_type, c->self, c->peer, err);
  if (agree == GW_SUCCESS) agree = gw__ib_pkey_agree(t->port, h.pkey, c->self, c->peer, err);
  t->fd = gw__sock_connect_hello(&a, al, &hello, sizeof hello, gw__now() + (agree ? 2.0 : t->timeout_s));
  if ((res = agree)) goto fail;
  if (t->fd < 0) {
    res = gw__err(err, GW_ERR_REMOTE, "rank %d: cannot connect to rank %d (%s) at %s: %s", c->self, c->peer,
                  c->peer_host, where, strerror(errno));
    goto fail;
  }
  gw__sock_tune(t->fd);
  for (uint32_t i = 0; i < t->nqps; i++) {
    int e = qp_connect(t, t->q[i].qp, h.qpn[i], h.lid, h.gid, h.mtu, h.nonce, 0, i, gw__now() + t->timeout_s);
    if (e) {
      res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot connect queue pair %u on %s to rank %d's: %s%s", c->self, i,
                    t->port->name, c->peer, strerror(e),
                    t->port->eth && e != ETIMEDOUT ? " (check GW_IB_GID_INDEX)" : "");
      goto fail;
    }
  }
  c->priv = t;
  c->depth = t->nslots; /* a slot frees when the receiver's credit for it arrives */
  snprintf(c->desc + strlen(c->desc), sizeof c->desc - strlen(c->desc), " %s", t->port->name);
  return GW_SUCCESS;
fail:
  conn_free(t);
  return res;
}

static gw_result_t ib_recv_connect(struct gw_conn *c, struct gw_errctx *err) {
  struct ib_conn *t = c->priv;
  double deadline = gw__now() + t->timeout_s;
  struct ib_hello hello;
  for (;;) {
    int fd = gw__sock_accept_hello(t->listen_fd, &hello, sizeof hello, deadline);
    if (fd < 0 && errno != ETIMEDOUT) return gw__sock_accept_error(c, "ib connection", err);
    if (fd < 0)
      return gw__err(err, GW_ERR_TIMEOUT, "rank %d: rank %d (%s) did not connect its ib queue pairs within %.0f s",
                     c->self, c->peer, c->peer_host, t->timeout_s);
    if (hello.magic == IB_HELLO_MAGIC && hello.job_hash == t->job_hash && hello.nonce == t->nonce &&
        hello.sender == c->peer && hello.nqps == t->nqps) {
      t->fd = fd;
      break;
    }
    GW_WARN(GW_SUB_ALL, "rank %d: refused a connection that is not rank %d's ib connection of this job", c->self,
            c->peer);
    close(fd);
  }
  close(t->listen_fd);
  t->listen_fd = -1;
  t->raddr = hello.credit_addr;
  t->rkey = hello.credit_rkey;
  GW_CHECK(gw__ib_roce_agree(t->port, hello.gid_type, c->self, c->peer, err));
  GW_CHECK(gw__ib_pkey_agree(t->port, hello.pkey, c->self, c->peer, err));
  for (uint32_t i = 0; i < t->nqps; i++) {
    int e = qp_connect(t, t->q[i].qp, hello.qpn[i], hello.lid, hello.gid, hello.mtu, t->nonce, 1, i, deadline);
    if (e)
      return gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot connect queue pair %u on %s to rank %d's: %s%s", c->self, i,
                     t->port->name, c->peer, strerror(e),
                     t->port->eth && e != ETIMEDOUT ? " (check GW_IB_GID_INDEX)" : "");
  }
  char ready = IB_READY_BYTE;
  if (!gw__sock_io_deadline(t->fd, &ready, 1, true, deadline))
    return gw__err(err, GW_ERR_REMOTE, "rank %d: rank %d (%s) closed its ib connection during setup", c->self,
                   c->peer, c->peer_host);
  gw__sock_tune(t->fd);
  t->ready = true; /* connected: the liveness socket is looked at every 10 ms, not at every poll */
  snprintf(c->desc + strlen(c->desc), sizeof c->desc - strlen(c->desc), " %s", t->port->name);
  return GW_SUCCESS;
}

/* ---- completions, liveness ---------------------------------------------------------------- */
static struct ib_qpx *qpx_of(struct ib_conn *t, uint32_t qp_num, uint32_t *index) {
  for (uint32_t i = 0; i < t->nqps; i++)
    if (t->q[i].qp->qp_num == qp_num) {
      if (index) *index = i;
      return &t->q[i];
    }
  return NULL;
}

/* A receive completion: one part of the chunk at the position in its immediate. */
static gw_result_t on_arrival(struct gw_conn *c, struct ib_conn *t, const struct ibv_wc *wc) {
  uint32_t qi;
  if (!qpx_of(t, wc->qp_num, &qi)) return fail(c, t, GW_ERR_INTERNAL, "a completion of an unknown queue pair");
  uint32_t imm = ntohl(wc->imm_data), p24 = imm >> 8, nparts = (imm >> 4) & 15, part = imm & 15;
  uint64_t pos = t->pos + ((p24 - (uint32_t)(t->pos & 0xffffff)) & 0xffffff);
  if (pos >= t->pos + t->nslots || nparts < 1 || nparts > t->nqps || part >= nparts)
    return fail(c, t, GW_ERR_REMOTE, "a write with a malformed immediate 0x%08x (next chunk %" PRIu64 ")", imm,
                t->pos);
  uint32_t s = (uint32_t)(pos % t->nslots);
  if (t->got[s] && t->need[s] != nparts)
    return fail(c, t, GW_ERR_REMOTE, "chunk %" PRIu64 " arrives in both %u and %u parts", pos, t->need[s], nparts);
  t->need[s] = (uint8_t)nparts;
  if (++t->got[s] > nparts) return fail(c, t, GW_ERR_REMOTE, "chunk %" PRIu64 " has too many parts", pos);
  t->arrived[s] += wc->byte_len;
  int e = post_recv(t, qi);
  if (e) return fail(c, t, GW_ERR_SYSTEM, "cannot post a receive: %s", strerror(e));
  return GW_SUCCESS;
}

static void check_socket(struct ib_conn *t, bool now);

/* What the device's async events say about this connection: an error event
 * on its QPs or CQ, or its device failed, fails it at once, naming the event
 * (the completions after it say only "flushed", or never come).  now: read
 * the events at once (a failed completion is being explained). */
static gw_result_t check_async(struct gw_conn *c, struct ib_conn *t, bool now) {
  gw__ib_events(now);
  if (atomic_load(&t->port->fatal))
    return fail(c, t, GW_ERR_SYSTEM, "the device failed (IBV_EVENT_DEVICE_FATAL): the HCA needs a reset (see "
                "dmesg); other ports or GW_TRANSPORT=tcp until then");
  const int ev = atomic_load(&t->async_err) - 1;
  if (ev < 0) return GW_SUCCESS;
  char msg[GW_ERRMSG_MAX];
  const gw_result_t code = gw__ib_async_text(ev, c->is_send, c->peer, msg, sizeof msg);
  return fail(c, t, code, "%s", msg);
}

/* "; this rank's port reported its link down ..." when it did, for messages
 * (the events read first: a peer whose writes stopped reaching this port may
 * have given up before this port's event was read). */
static const char *link_note(const struct ib_conn *t) {
  gw__ib_events(true);
  return atomic_load(&t->port->link_down) ? "; this rank's port reported its link down (IBV_EVENT_PORT_ERR)" : "";
}

static gw_result_t poll_cq(struct gw_conn *c, struct ib_conn *t) {
  struct ibv_wc wc[16];
  int n;
  while ((n = gw__ib_devs.v->poll_cq(t->cq, 16, wc)) > 0) {
    for (int i = 0; i < n; i++) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        if (t->failed || t->quiet) continue;
        /* The receiving end after its sender closed: the credit writes to the
         * sender's destroyed queue pair fail (after the retry timeout) and
         * take this one's receives with them; every chunk sent may have been
         * delivered already, and recv_peek names the peer if one is missing. */
        if (!c->is_send) check_socket(t, true);
        if (!c->is_send && t->eof) {
          t->quiet = true;
          continue;
        }
        GW_CHECK(check_async(c, t, true)); /* an event that says why comes first */
        if (wc[i].status == IBV_WC_WR_FLUSH_ERR && t->eof)
          return fail(c, t, GW_ERR_REMOTE, "rank %d closed the connection (it exited or failed)%s", c->peer,
                      link_note(t));
        return fail(c, t, GW_ERR_REMOTE, "%s failed: %s (status %d): %s%s",
                    (wc[i].wr_id & IB_RECV_WRID) ? "a receive" : "an RDMA write",
                    ibv_wc_status_str(wc[i].status), (int)wc[i].status, gw__ib_status_hint(wc[i].status), link_note(t));
      }
      if (wc[i].wr_id & IB_RECV_WRID) {
        if (c->is_send) return fail(c, t, GW_ERR_INTERNAL, "a receive completion on the sending end");
        GW_CHECK(on_arrival(c, t, &wc[i]));
      } else {
        struct ib_qpx *q = qpx_of(t, wc[i].qp_num, NULL);
        if (q && wc[i].wr_id > q->done) q->done = wc[i].wr_id;
      }
    }
  }
  if (n < 0) return fail(c, t, GW_ERR_SYSTEM, "polling the completion queue failed (%d)", n);
  return t->failed;
}

/* The liveness socket, looked at about every 10 ms (now: at once): the
 * receiver's ready byte, or the peer closing it (exit, crash, kill). */
static void check_socket(struct ib_conn *t, bool now) {
  double at = gw__now();
  if (t->eof || (t->ready && !now && at < t->next_check)) return; /* before ready: at every look */
  t->next_check = at + 0.01;
  uint8_t b[sizeof t->ab_buf];
  /* the ready byte alone; once ready (sender), what follows is the abandon frame */
  const size_t want = t->ready && t->ab_got < sizeof t->ab_buf ? sizeof t->ab_buf - t->ab_got : 1;
  ssize_t n = recv(t->fd, b, want, MSG_DONTWAIT);
  if (n > 0 && !t->ready) {
    if (b[0] == IB_READY_BYTE) t->ready = true;
  } else if (n > 0 && t->ab_got < sizeof t->ab_buf) {
    memcpy(t->ab_buf + t->ab_got, b, (size_t)n);
    t->ab_got += (uint32_t)n;
  } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    t->eof = true;
  }
}

static gw_result_t peer_gone(struct gw_conn *c, struct ib_conn *t, const char *waiting) {
  GW_CHECK(check_async(c, t, true)); /* an error event here is why the peer gave up */
  return fail(c, t, GW_ERR_REMOTE, "rank %d closed the connection (it exited or died) while this rank waited for %s%s",
              c->peer, waiting, link_note(t));
}

/* One RDMA write; signaled every sig_every-th on its QP, or when asked. */
static int post_write(struct ib_conn *t, struct ib_qpx *q, struct ibv_sge *sge, int nsge, uint64_t raddr,
                      uint32_t rkey, bool imm, uint32_t imm_data, bool signal) {
  struct ibv_send_wr wr = {.sg_list = sge, .num_sge = nsge,
                           .opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                           .send_flags = 0, .imm_data = htonl(imm_data)},
                     *bad;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  if (signal || ++q->unsig >= t->sig_every) wr.send_flags |= IBV_SEND_SIGNALED, q->unsig = 0;
  wr.wr_id = q->posted + 1;
  int e = gw__ib_devs.v->post_send(q->qp, &wr, &bad);
  if (!e && (wr.send_flags & IBV_SEND_SIGNALED)) q->last_sig = wr.wr_id;
  if (!e) q->posted++;
  return e;
}

static bool sq_room(const struct ib_conn *t, const struct ib_qpx *q) { return q->posted - q->done + 1 < t->depth; }

/* A zero-length signaled write: its completion covers every write before it. */
static int post_fence(struct ib_conn *t, struct ib_qpx *q) {
  struct ibv_sge sge = {.addr = (uintptr_t)t->buf, .length = 0, .lkey = t->mr->lkey};
  return post_write(t, q, &sge, 0, t->raddr, t->rkey, false, 0, true);
}

/* Whether write `wr` on q is covered by a polled completion (*ok), so what it
 * reads may be written again.  When no signaled write at or after it is
 * posted (unsignaled writes complete silently), posts a fence so one comes. */
static gw_result_t reads_done(struct gw_conn *c, struct ib_conn *t, struct ib_qpx *q, uint64_t wr, bool *ok) {
  *ok = q->done >= wr;
  if (*ok || q->last_sig >= wr || !sq_room(t, q)) return GW_SUCCESS;
  int e = post_fence(t, q);
  return e ? fail(c, t, GW_ERR_SYSTEM, "ibv_post_send (fence) failed: %s", strerror(e)) : GW_SUCCESS;
}

/* ---- data path: sender ------------------------------------------------------------------- */
static gw_result_t ib_send_slot(struct gw_conn *c, size_t bytes, void **buf, size_t *cap) {
  struct ib_conn *t = c->priv;
  (void)bytes;
  if (t->failed) return t->failed;
  GW_CHECK(poll_cq(c, t));
  check_socket(t, false);
  GW_CHECK(check_async(c, t, false));
  bool room = t->ready;
  const uint32_t s = (uint32_t)(t->pos % t->nslots);
  if (room && t->pos >= t->nslots) {
    uint64_t want = t->pos - t->nslots + 1;
    room = __atomic_load_n(&t->credits[s], __ATOMIC_ACQUIRE) == want;
  }
  if (room) { /* the slot's last writes are ours again: every QP's fence posted at once */
    bool all = true;
    for (uint32_t i = 0; i < t->nqps; i++) {
      bool done;
      GW_CHECK(reads_done(c, t, &t->q[i], t->reads[s * IB_MAX_QPS + i], &done));
      all = all && done;
    }
    room = all;
  }
  for (uint32_t i = 0; room && i < t->nqps; i++) room = sq_room(t, &t->q[i]);
  if (!room) return t->eof ? peer_gone(c, t, "a free slot") : GW_INPROGRESS;
  *buf = t->buf + (size_t)s * t->stride + IB_HDR_BYTES;
  *cap = t->slot_bytes;
  return GW_SUCCESS;
}

/* Writes the chunk in slot pos % nslots, header first, split over the QPs:
 * from the staging slot, or (src != NULL) the header from the staging slot and
 * the payload straight from registered user memory (lkey), gathered by the
 * first part's two SGEs; those writes are signaled and remembered in
 * q->direct, and progress waits for them, so the caller may reuse src once
 * its operation completes. */
static gw_result_t post_chunk(struct gw_conn *c, struct ib_conn *t, const struct gw_chunk_hdr *h, const void *src,
                              uint32_t lkey) {
  uint32_t s = (uint32_t)(t->pos % t->nslots), total = IB_HDR_BYTES + h->bytes;
  uint8_t *slot = t->buf + (size_t)s * t->stride;
  memcpy(slot, h, sizeof *h);
  uint32_t nparts = gw__nparts(total, t->nqps, IB_MIN_PART);
  for (uint32_t k = 0; k < nparts; k++) {
    uint32_t off, len;
    gw__part_of(total, nparts, k, &off, &len);
    const uint32_t qi = (uint32_t)((t->pos + k) % t->nqps);
    struct ib_qpx *q = &t->q[qi];
    struct ibv_sge sge[2] = {{.addr = (uintptr_t)(slot + off), .length = len, .lkey = t->mr->lkey}};
    int nsge = 1;
    if (src) { /* the payload part of [off, off + len) comes from src */
      uint32_t hdr_len = off < IB_HDR_BYTES ? GW_MIN(len, IB_HDR_BYTES - off) : 0;
      struct ibv_sge payload = {.addr = (uintptr_t)src + (off + hdr_len - IB_HDR_BYTES), .length = len - hdr_len,
                                .lkey = lkey};
      if (hdr_len) sge[0].length = hdr_len, sge[1] = payload, nsge = 2;
      else sge[0] = payload;
    }
    uint32_t rkey = t->rkey;
    if (t->test_bad_rkey && ++t->writes == (uint32_t)t->test_bad_rkey) rkey ^= 0x5a5a00u;
    uint32_t imm = (uint32_t)(t->pos & 0xffffff) << 8 | nparts << 4 | k;
    int e = post_write(t, q, sge, nsge, t->raddr + (uint64_t)s * t->stride + off, rkey, true, imm, src != NULL);
    if (e) return fail(c, t, GW_ERR_SYSTEM, "ibv_post_send failed: %s", strerror(e));
    t->reads[s * IB_MAX_QPS + qi] = q->posted;
    if (src) q->direct = q->posted;
  }
  if (src) gw__ib_count_direct();
  t->pos++;
  return GW_SUCCESS;
}

static gw_result_t ib_send_post(struct gw_conn *c, const struct gw_chunk_hdr *h) {
  return post_chunk(c, c->priv, h, NULL, 0);
}

/* Whether a chunk of `bytes` from src can go straight from user memory: big
 * enough, and inside a gw_comm_register'ed range. */
static bool ib_direct_ok(struct gw_conn *c, const void *src, size_t bytes) {
  struct ib_conn *t = c->priv;
  if (bytes < IB_DIRECT_MIN || !src) return false;
  t->direct_lkey = gw__ib_reg_hold((int)(t->port - gw__ib_devs.ports), src, bytes, t->held, &t->nheld, IB_MAX_HELD);
  return t->direct_lkey != 0;
}

static gw_result_t ib_send_direct(struct gw_conn *c, const struct gw_chunk_hdr *h, const void *src) {
  struct ib_conn *t = c->priv;
  return post_chunk(c, t, h, src, t->direct_lkey);
}

/* ---- data path: receiver ------------------------------------------------------------------ */
/* Tells the sender about every slot released so far (an 8-byte write of the
 * released position into its credit array), as far as the send queue has room. */
static gw_result_t push_credits(struct gw_conn *c, struct ib_conn *t) {
  struct ib_qpx *q = &t->q[0];
  /* Not to a sender that closed: nobody would read them, and the writes
   * would fail after the retry timeout. */
  while (t->credits_posted < t->pos && !t->eof && !t->quiet) {
    if (!sq_room(t, q)) {
      GW_CHECK(poll_cq(c, t));
      if (!sq_room(t, q)) return GW_SUCCESS; /* later: recv_peek and progress come back here */
    }
    const uint64_t p = t->credits_posted;
    const uint32_t w = (uint32_t)(p % t->nslots);
    bool free_word;
    GW_CHECK(reads_done(c, t, q, t->reads[w], &free_word));
    if (!free_word) { /* once more after a poll: else the credit waits for the next peek or progress */
      GW_CHECK(poll_cq(c, t));
      GW_CHECK(reads_done(c, t, q, t->reads[w], &free_word));
      if (!free_word) return GW_SUCCESS;
    }
    uint64_t *src = &t->credit_src[w];
    *src = p + 1;
    struct ibv_sge sge = {.addr = (uintptr_t)src, .length = sizeof *src, .lkey = t->credit_src_mr->lkey};
    int e = post_write(t, q, &sge, 1, t->raddr + w * sizeof(uint64_t), t->rkey, false, 0, false);
    if (e) return fail(c, t, GW_ERR_SYSTEM, "ibv_post_send (credit) failed: %s", strerror(e));
    t->reads[w] = q->posted;
    t->credits_posted++;
  }
  return GW_SUCCESS;
}

static gw_result_t ib_recv_peek(struct gw_conn *c, const struct gw_chunk_hdr **h, const void **data) {
  struct ib_conn *t = c->priv;
  if (t->failed) return t->failed;
  uint32_t s = (uint32_t)(t->pos % t->nslots);
  if (!t->got[s] || t->got[s] < t->need[s]) {
    GW_CHECK(poll_cq(c, t));
    GW_CHECK(push_credits(c, t));
    if (!t->got[s] || t->got[s] < t->need[s]) {
      check_socket(t, false);
      GW_CHECK(check_async(c, t, false));
      if (!t->eof || c->look) return GW_INPROGRESS;
      /* The sender may have closed right after its last write landed (its
       * ack came before our completion was polled): look once more. */
      GW_CHECK(poll_cq(c, t));
      if (!t->got[s] || t->got[s] < t->need[s]) return peer_gone(c, t, "a chunk");
    }
  }
  const uint8_t *slot = t->buf + (size_t)s * t->stride;
  const struct gw_chunk_hdr *hdr = (const struct gw_chunk_hdr *)slot;
  if (hdr->bytes > t->slot_bytes || gw__nparts(IB_HDR_BYTES + hdr->bytes, t->nqps, IB_MIN_PART) != t->need[s])
    return fail(c, t, GW_ERR_REMOTE, "chunk %" PRIu64 " has a malformed header (%u bytes in %u parts)", t->pos,
                hdr->bytes, t->need[s]);
  /* Its parts' writes carried exactly the header and the bytes it announces
   * (fewer would leave the slot's older bytes to be taken for data). */
  if (t->arrived[s] != IB_HDR_BYTES + hdr->bytes)
    return fail(c, t, GW_ERR_REMOTE, "chunk %" PRIu64 " announces %u bytes but its writes carried %u", t->pos,
                hdr->bytes, t->arrived[s] - GW_MIN(t->arrived[s], (uint32_t)IB_HDR_BYTES));
  *h = hdr;
  *data = slot + IB_HDR_BYTES;
  return GW_SUCCESS;
}

static gw_result_t ib_recv_release(struct gw_conn *c) {
  struct ib_conn *t = c->priv;
  uint32_t s = (uint32_t)(t->pos % t->nslots);
  t->got[s] = t->need[s] = 0;
  t->arrived[s] = 0;
  t->pos++;
  return push_credits(c, t);
}

static gw_result_t ib_progress(struct gw_conn *c, struct gw_errctx *err) {
  struct ib_conn *t = c->priv;
  gw_result_t r = t->failed;
  if (!r) r = poll_cq(c, t);
  if (!r && !c->is_send) r = push_credits(c, t);
  if (!r) check_socket(t, false);
  if (!r) r = check_async(c, t, false);
  if (!r && c->is_send) {
    for (uint32_t i = 0; i < t->nqps && !r; i++)
      if (t->q[i].done < t->q[i].direct) {
        if (!t->eof) return GW_INPROGRESS;
        r = poll_cq(c, t); /* completions polled before the close was seen count */
        if (!r && t->q[i].done < t->q[i].direct) r = peer_gone(c, t, "its writes from user memory");
      }
    if (!r) gw__ib_reg_release(t->held, &t->nheld); /* every write from user memory completed */
  }
  if (r && err) gw__err(err, r, "%s", t->failmsg);
  return r;
}

/* Before the QPs go: a last signaled write on every QP with unsignaled writes
 * outstanding, so the data is known to have landed (not when the peer is
 * already gone).  As long as the queue pair itself would retry a lost packet
 * (its timeout, 4.096 us x 2^GW_IB_TIMEOUT, times GW_IB_RETRY_CNT + 1, and
 * twice that for the spec's slack; at most 60 s): a fixed 2 s was less than
 * one retransmission at the default timeout (1.07 s, up to 4x that), and
 * destroying the queue pair then loses the chunk. */
static void flush_sends(struct gw_conn *c, struct ib_conn *t) {
  const double tmo = 4.096e-6 * (double)(1ull << GW_MIN(31, t->qp_timeout));
  const double budget = GW_MIN(60.0, 2.0 * tmo * (double)(t->qp_retry_cnt + 1));
  double deadline = gw__now() + GW_MAX(2.0, budget);
  for (uint32_t i = 0; i < t->nqps && !t->failed; i++) {
    struct ib_qpx *q = &t->q[i];
    if (q->done == q->posted) continue;
    if (post_fence(t, q) != 0) return;
    while (q->done < q->posted && !t->failed && !t->eof && gw__now() < deadline) {
      poll_cq(c, t);
      check_socket(t, false);
    }
  }
}

/* The receiver's rank failed: its reason goes on the liveness socket, which
 * carries nothing else that way after the ready byte (its buffer is empty,
 * so one non-blocking send takes it). */
static void ib_recv_abandon(struct gw_conn *c, const char *why) {
  struct ib_conn *t = c->priv;
  if (!t || t->fd < 0 || !t->ready) return;
  uint8_t buf[3 + IB_ABANDON_MAX];
  const uint16_t len = (uint16_t)GW_MIN(strlen(why), (size_t)IB_ABANDON_MAX);
  buf[0] = IB_ABANDON_BYTE;
  memcpy(buf + 1, &len, 2), memcpy(buf + 3, why, len);
  (void)!send(t->fd, buf, 3 + (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
}

static bool ib_send_abandoned(struct gw_conn *c, char *why, size_t len) {
  struct ib_conn *t = c->priv;
  if (!t || t->fd < 0) return false;
  if (t->ready && !t->eof) check_socket(t, true);
  uint16_t wlen;
  if (t->ab_got < 3 || t->ab_buf[0] != IB_ABANDON_BYTE) return false;
  memcpy(&wlen, t->ab_buf + 1, 2);
  if (wlen > IB_ABANDON_MAX || t->ab_got < 3u + wlen) return false;
  snprintf(why, len, "%.*s", (int)wlen, (const char *)t->ab_buf + 3);
  return true;
}

static void ib_close(struct gw_conn *c) {
  struct ib_conn *t = c->priv;
  if (!t) return;
  if (c->is_send && t->ready) flush_sends(c, t);
  conn_free(t);
  c->priv = NULL;
}

const struct gw_transport gw__ib_transport = {
    .name = "ib",
    .ll_chunk_bytes = 0,
    .can_connect = ib_can_connect,
    .recv_setup = ib_recv_setup,
    .send_connect = ib_send_connect,
    .recv_connect = ib_recv_connect,
    .send_slot = ib_send_slot,
    .send_post = ib_send_post,
    .recv_peek = ib_recv_peek,
    .recv_release = ib_recv_release,
    .progress = ib_progress,
    .direct_ok = ib_direct_ok,
    .send_direct = ib_send_direct,
    .pollfds = NULL,
    .recv_abandon = ib_recv_abandon,
    .send_abandoned = ib_send_abandoned,
    .close = ib_close,
};
