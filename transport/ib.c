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
#include "ib_conn.h"

static bool ib_can_connect(const struct gw_peer_info *self, const struct gw_peer_info *peer) {
  return (self->caps & GW_CAP_IB) && (peer->caps & GW_CAP_IB);
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
  int e = gw__ib_post_recv(t, qi);
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

/* The liveness socket's reading state (ready, eof, ab_buf, peer_wait) is
 * one thread's at a time: besides the connection's own channel thread, every
 * other channel's looks at it in a long wait (ib_waiting), and two readers
 * tore records and took a record's first byte for the ready byte. */
static void sock_lock(struct ib_conn *t) {
  while (atomic_flag_test_and_set_explicit(&t->sock_lock, memory_order_acquire)) sched_yield(); /* one recv() */
}
static void sock_unlock(struct ib_conn *t) { atomic_flag_clear_explicit(&t->sock_lock, memory_order_release); }

/* The liveness socket, looked at about every 10 ms (now: at once): the
 * receiver's ready byte, then its waiting records and abandon frame, or the
 * peer closing it (exit, crash, kill).  Under sock_lock. */
static void check_socket_locked(struct ib_conn *t, bool now) {
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
    /* waiting records taken out, the latest kept (ib_waiting) */
    while (t->ab_got >= IB_WAIT_BYTES && t->ab_buf[0] == IB_WAIT_BYTE) {
      memcpy(&t->peer_wait, t->ab_buf + 1, sizeof t->peer_wait);
      t->peer_waits = true;
      t->ab_got -= (uint32_t)IB_WAIT_BYTES;
      memmove(t->ab_buf, t->ab_buf + IB_WAIT_BYTES, t->ab_got);
    }
  } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    t->eof_errno = n < 0 ? errno : 0;
    t->eof = true;
  }
}

static void check_socket(struct ib_conn *t, bool now) {
  sock_lock(t);
  check_socket_locked(t, now);
  sock_unlock(t);
}

static gw_result_t peer_gone(struct gw_conn *c, struct ib_conn *t, const char *waiting) {
  GW_CHECK(check_async(c, t, true)); /* an error event here is why the peer gave up */
  const int e = t->eof_errno;
  if (e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH || e == EHOSTDOWN) /* nobody closed it */
    return fail(c, t, GW_ERR_REMOTE, "rank %d's machine stopped answering on the connection's liveness socket (%s: "
                "it went away, or the IP network to it failed) while this rank waited for %s%s", c->peer, strerror(e),
                waiting, link_note(t));
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
 * carries only waiting records that way after the ready byte (the sender
 * takes those in at its socket looks, so one non-blocking send takes it;
 * best effort, as the interface says: a record that cannot go whole first,
 * towards a sender that stopped looking, leaves it out). */
static void ib_recv_abandon(struct gw_conn *c, const char *why) {
  struct ib_conn *t = c->priv;
  if (!t || t->fd < 0 || !t->ready) return;
  uint8_t buf[3 + IB_ABANDON_MAX];
  const uint16_t len = (uint16_t)GW_MIN(strlen(why), (size_t)IB_ABANDON_MAX);
  buf[0] = IB_ABANDON_BYTE;
  memcpy(buf + 1, &len, 2), memcpy(buf + 3, why, len);
  gw__way_back_abandon(t->fd, &t->back, buf, 3 + (size_t)len, NULL); /* an error: eof says it */
}

/* As tcp's (transport.h): the receiver publishes the operation it has
 * waited in for a second or more on this connection before it sent
 * anything in it, once per operation, on the liveness socket; the sender
 * reads the latest (check_socket).  Over ib two ranks that called different
 * collectives and both wait before their first send (one rank's tree
 * allreduce, the others' broadcast) waited until the deadline. */
static bool ib_waiting(struct gw_conn *c, const struct gw_opdesc *mine, double waited, bool awaited,
                       struct gw_opdesc *theirs) {
  struct ib_conn *t = c->priv;
  if (!t || t->fd < 0) return false;
  if (c->is_send) {
    sock_lock(t);
    const bool was_ready = t->ready;
    check_socket_locked(t, true);
    if (!was_ready && t->ready) check_socket_locked(t, true); /* the ready byte came alone: what follows it */
    const bool got = t->peer_waits;
    if (got) *theirs = t->peer_wait;
    sock_unlock(t);
    return got;
  }
  const uint8_t head = IB_WAIT_BYTE;
  if (t->ready && !t->eof) gw__way_back_waiting(t->fd, &t->back, &head, 1, mine, waited, awaited, NULL);
  return false;
}

/* transport.h: the connection's liveness socket (over IP, beside the
 * fabric) checked for a stall (sock.h): a machine that went away, or a
 * network cut, leaves its bytes or keepalive probes unanswered. */
static bool ib_net_stalled(const struct gw_conn *c, char *why, size_t len) {
  const struct ib_conn *t = c->priv;
  if (!t) return false;
  struct gw_sock_stall st = {.fd = -1};
  gw__sock_stall_add(t->fd, &st);
  return gw__sock_stall_text(&st, c->peer_host, why, len);
}

static bool ib_send_abandoned(struct gw_conn *c, char *why, size_t len) {
  struct ib_conn *t = c->priv;
  if (!t || t->fd < 0) return false;
  sock_lock(t);
  if (t->ready && !t->eof) check_socket_locked(t, true);
  uint16_t wlen = 0;
  if (t->ab_got >= 3 && t->ab_buf[0] == IB_ABANDON_BYTE) memcpy(&wlen, t->ab_buf + 1, 2);
  const bool said =
      t->ab_got >= 3 && t->ab_buf[0] == IB_ABANDON_BYTE && wlen <= IB_ABANDON_MAX && t->ab_got >= 3u + wlen;
  if (said) snprintf(why, len, "%.*s", (int)wlen, (const char *)t->ab_buf + 3);
  sock_unlock(t);
  return said;
}

static void ib_close(struct gw_conn *c) {
  struct ib_conn *t = c->priv;
  if (!t) return;
  if (c->is_send && t->ready) flush_sends(c, t);
  gw__ib_conn_free(t);
  c->priv = NULL;
}

const struct gw_transport gw__ib_transport = {
    .name = "ib",
    .ll_chunk_bytes = 0,
    .can_connect = ib_can_connect,
    .recv_setup = gw__ib_recv_setup,
    .send_connect = gw__ib_send_connect,
    .recv_connect = gw__ib_recv_connect,
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
    .waiting = ib_waiting,
    .net_stalled = ib_net_stalled,
    .close = ib_close,
};
