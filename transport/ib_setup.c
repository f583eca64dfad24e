/* ib_setup.c - the ib transport's connections made: the port chosen, the
 * slots, CQ and QPs created, the handle published, the sender's hello over
 * the liveness socket, the QPs taken to RTS (ib.c has the rest and the whole
 * design). */
#include "ib_conn.h"

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

void gw__ib_conn_free(struct ib_conn *t) {
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
  gw__sock_close(t->fd);
  gw__sock_close(t->listen_fd);
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
  if (s < 0 || s > 15 || !gw__env_int_parses("GW_IB_SL")) /* (no number ran as 0, with a warning) */
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_IB_SL=%s is not a service level (0..15)", c->self,
                   gw__env_str("GW_IB_SL", ""));
  if (t < 0 || t > 255 || !gw__env_int_parses("GW_IB_TC"))
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
  if (qto < 1 || qto > 31 || !gw__env_int_parses("GW_IB_TIMEOUT"))
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_IB_TIMEOUT=%s is not in 1..31 (each try waits "
                   "4.096 us x 2^N; 0, no timeout, would leave a dead peer unnoticed)", c->self,
                   gw__env_str("GW_IB_TIMEOUT", ""));
  if (qrc < 0 || qrc > 7 || !gw__env_int_parses("GW_IB_RETRY_CNT"))
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_IB_RETRY_CNT=%s is not in 0..7", c->self,
                   gw__env_str("GW_IB_RETRY_CNT", ""));
  const int64_t roce = gw__env_int("GW_IB_ROCE_VERSION", 2);
  if ((roce != 1 && roce != 2) || !gw__env_int_parses("GW_IB_ROCE_VERSION"))
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
  gw__ib_conn_free(t);
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

int gw__ib_post_recv(struct ib_conn *t, uint32_t qi) {
  struct ibv_recv_wr wr = {.wr_id = IB_RECV_WRID | qi}, *bad;
  return gw__ib_devs.v->post_recv(t->q[qi].qp, &wr, &bad);
}

/* (init refused values out of 1..IB_MAX_QPS, and words: comm.c) */
static uint32_t qps_per_conn(void) {
  int64_t n = gw__env_int("GW_IB_QPS_PER_CONN", 1);
  return (uint32_t)GW_MAX(1, GW_MIN(n, IB_MAX_QPS));
}

/* ---- setup ----------------------------------------------------------------------------- */
gw_result_t gw__ib_recv_setup(struct gw_conn *c, const struct gw_conn_params *p, struct gw_conn_handle *out,
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
      int e = gw__ib_post_recv(t, i);
      if (e) {
        res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot post receives on %s: %s", c->self, t->port->name,
                      strerror(e));
        goto fail;
      }
    }
  struct sockaddr_storage a;
  t->listen_fd = gw__sock_listen(&p->local_addr, p->local_addr_len, GW_LISTEN_BACKLOG, &a);
  if (t->listen_fd < 0) {
    char where[96];
    gw__sock_addr_str(&p->local_addr, where, sizeof where);
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot listen for rank %d on %s: %s%s", c->self,
                  c->peer, where, strerror(errno), gw__sock_listen_hint(errno));
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
  gw__ib_conn_free(t);
  return res;
}

gw_result_t gw__ib_send_connect(struct gw_conn *c, const struct gw_conn_params *p, const struct gw_conn_handle *in,
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
  gw__ib_conn_free(t);
  return res;
}

gw_result_t gw__ib_recv_connect(struct gw_conn *c, struct gw_errctx *err) {
  struct ib_conn *t = c->priv;
  double deadline = gw__now() + t->timeout_s;
  struct ib_hello hello;
  struct gw_accept_set set;
  gw__accept_set_init(&set);
  for (;;) {
    char from[64];
    int fd = gw__sock_accept_hello(&set, t->listen_fd, &hello, sizeof hello, deadline, from, sizeof from);
    if (fd < 0) {
      const int e = errno;
      char strangers[160];
      gw__accept_set_said(&set, strangers, sizeof strangers);
      gw__accept_set_close(&set);
      errno = e;
      if (e != ETIMEDOUT) return gw__sock_accept_error(c, "ib connection", err);
      return gw__err(err, GW_ERR_TIMEOUT, "rank %d: rank %d (%s) did not connect its ib queue pairs within %.0f s%s",
                     c->self, c->peer, c->peer_host, t->timeout_s, strangers);
    }
    if (hello.magic == IB_HELLO_MAGIC && hello.job_hash == t->job_hash && hello.nonce == t->nonce &&
        hello.sender == c->peer && hello.nqps == t->nqps) {
      t->fd = fd;
      break;
    }
    GW_WARN(GW_SUB_ALL, "rank %d: refused a connection from %s that is not rank %d's ib connection of this job",
            c->self, from, c->peer);
    gw__accept_set_refused(&set, fd, from);
  }
  gw__accept_set_close(&set);
  gw__sock_close(t->listen_fd);
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
