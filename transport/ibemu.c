/* ibemu.c - a user-space emulator of the verbs in ibv.h, so the ib transport
 * can be tested on machines without an HCA (GW_IB_EMULATE=1).  It connects RC
 * queue pairs of processes on one host (network and UTS namespaces may differ;
 * the PID namespace and uid must be shared) and keeps libibverbs' contract:
 * its types, its return conventions, key and bounds checks on both ends, RNR
 * retries, transport retries with the QP's timeout, in-order completions,
 * flushes once a QP is in the error state.
 *
 * What is emulated: devices gwemu0.. (GW_IB_EMULATE_DEVICES, default 1) with one
 * active port (GW_IB_EMULATE_LINK=ib|eth; efa: a device of no transport
 * type that makes no RC queue pairs, as AWS's EFA), GID tables as a ConnectX
 * has them (16 entries, the rest empty: InfiniBand: 2 used; RoCE: link-local
 * and IPv4-mapped, each as v1 and v2, or v1 only with GW_IB_EMULATE_ROCE=v1; QPs whose GIDs differ in type do not
 * reach each other, as on a wire), PDs, MRs (GW_IB_EMULATE_MEMLOCK
 * simulates `ulimit -l`), CQs, RC QPs, RDMA WRITE and RDMA WRITE WITH IMM, async
 * events (non-blocking: a responder's QP_ACCESS_ERR; PORT_ERR / PORT_ACTIVE and
 * DEVICE_FATAL from the test hooks gw__ibemu_set_port / gw__ibemu_device_fatal,
 * a port down reaching nobody; destroy_qp waits for its events' acks).  Not
 * emulated: SEND, READ, atomics, UD/UC, SRQ, completion channels, memory
 * windows, path migration.  GW_IB_EMULATE_DELAY_US=N holds every
 * send WR back N microseconds after its post, as a DMA engine reads its source
 * some time after the post returns (by default a write whose responder is
 * ready completes inside the post, which hides code that reuses a source too
 * early).  The verbs contract that a send buffer belongs to the HCA until a
 * polled completion covers its WR is checked: a sample of every source (up to
 * four 64-byte windows per SGE) is hashed at the post and again when a
 * completion reports it, and a source changed in between aborts the process
 * with the WR named (a retransmission after a lost ack would send the new
 * bytes; an HCA may read the source at any time before that completion).
 *
 * How: every context owns a memfd "segment" holding what a remote must see (MR
 * table, per QP its state and receive-queue counters, inbound completions),
 * announced by its LID in a host-wide registry /dev/shm/gw-ibemu-lids-<uid>.  A
 * requester maps a remote segment with pidfd_getfd, checks keys and bounds
 * there, moves the data itself with process_vm_writev (memcpy in the same
 * process) and publishes the inbound completion with a release store; the
 * receiver sees it when it polls.  Work that cannot complete yet (receiver not
 * ready, remote unreachable) stays queued and is retried whenever the owner
 * posts to that QP or polls any CQ of the context.  The registry (1 MiB, one per uid) is
 * the only file; everything else dies with its process, and a dead process's
 * LID is taken over by the next one that needs it.  As with real verbs, a
 * context belongs to the process that opened it: open devices after fork().
 * Here: contexts, PDs, MRs, CQs, QPs and the data path; the registry and
 * segments are in ibemu_fabric.c, the device list, port, GID table and async
 * events in ibemu_device.c. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core.h"
#include "ibv.h"

#include "ibemu.h"

static void *fail(int err) {
  errno = err;
  return NULL;
}

/* bytes registered by this process, all contexts (GW_IB_EMULATE_MEMLOCK) */
static _Atomic uint64_t memlocked;

/* ---- contexts ---------------------------------------------------------------------- */

static struct ibv_context *emu_open_device(struct ibv_device *dev) {
  if (gw__ibemu_device_index(dev) < 0) return fail(EINVAL);
  int rerr = gw__ibemu_registry_open();
  if (rerr) return fail(rerr);
  const char *link = gw__ibemu_link();
  if (strcmp(link, "ib") && strcmp(link, "eth") && strcmp(link, "efa")) {
    GW_WARN(GW_SUB_INIT, "ibemu: GW_IB_EMULATE_LINK=%s is not ib, eth or efa", link);
    return fail(EINVAL);
  }
  struct emu_ctx *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->eth = !strcmp(link, "eth");
  c->efa = !strcmp(link, "efa");
  const char *roce = gw__env_str("GW_IB_EMULATE_ROCE", "v1v2");
  if (strcmp(roce, "v1") && strcmp(roce, "v1v2")) {
    GW_WARN(GW_SUB_INIT, "ibemu: GW_IB_EMULATE_ROCE=%s is not v1 or v1v2", roce);
    free(c);
    return fail(EINVAL);
  }
  c->roce_v2 = c->eth && !strcmp(roce, "v1v2");
  c->pid = getpid();
  if (!(c->seg = gw__ibemu_seg_create(&c->memfd))) goto fail_free;
  while (c->nonce == 0)
    if (getrandom(&c->nonce, sizeof c->nonce, 0) != sizeof c->nonce) goto fail_seg;
  for (int i = 0; i < MAX_QP; i++) c->qp_gen[i] = (uint16_t)(c->nonce >> 20);
  for (int i = 0; i < MAX_MR; i++) c->mr_gen[i] = (uint32_t)(c->nonce >> 40);
  c->seg->hdr.h.magic = EMU_MAGIC;
  c->seg->hdr.h.nonce = c->nonce;
  c->seg->hdr.h.pid = c->pid;
  atomic_store(&c->seg->hdr.h.alive, 1);
  if (!(c->lid = gw__ibemu_lid_claim(c->pid, c->memfd, c->nonce))) {
    errno = ENOSPC;
    goto fail_seg;
  }
  /* Peers that are not root reach us under Yama's ptrace_scope=1 too. */
  (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->ctx.mutex, NULL);
  c->ctx.device = dev;
  c->ctx.cmd_fd = c->ctx.async_fd = -1;
  c->ctx.num_comp_vectors = 1;
  GW_INFO(GW_SUB_INIT, "ibemu: opened %s as lid %u (%s)", dev->name, c->lid, link);
  return &c->ctx;
fail_seg:;
  int e = errno;
  munmap(c->seg, SEG_SIZE);
  close(c->memfd);
  errno = e;
fail_free:
  free(c);
  return NULL;
}

static void qp_free(struct emu_qp *q);
static void mr_free(struct emu_mr *m);

/* Frees what the caller left behind, as closing a real context does. */
static int emu_close_device(struct ibv_context *ibctx) {
  struct emu_ctx *c = CTX(ibctx);
  if (!c) return EINVAL;
  atomic_store(&c->seg->hdr.h.alive, 0);
  gw__ibemu_lid_release(c->lid);
  int left = c->nlive;
  while (c->nlive) qp_free(c->live[0]);
  for (int i = 0; i < MAX_MR; i++)
    if (c->mrs[i]) mr_free(c->mrs[i]), left++;
  for (struct emu_cq *q; (q = c->cqs); left++) c->cqs = q->next, free(q);
  for (struct emu_pd *p; (p = c->pds); left++) c->pds = p->next, free(p);
  if (left) GW_INFO(GW_SUB_INIT, "ibemu: close_device freed %d objects still in use", left);
  for (int i = 0; i < c->nrem; i++) {
    if (c->rem[i].seg) munmap(c->rem[i].seg, SEG_SIZE), close(c->rem[i].pidfd);
  }
  free(c->rem);
  munmap(c->seg, SEG_SIZE);
  close(c->memfd);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->ctx.mutex);
  free(c);
  return 0;
}

/* ---- protection domains and memory regions --------------------------------------- */
static struct ibv_pd *emu_alloc_pd(struct ibv_context *ibctx) {
  struct emu_ctx *c = CTX(ibctx);
  struct emu_pd *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  pthread_mutex_lock(&c->lock);
  p->pd.context = ibctx;
  p->pd.handle = ++c->handles;
  p->next = c->pds;
  c->pds = p;
  pthread_mutex_unlock(&c->lock);
  return &p->pd;
}

/* Real verbs refuse to free a PD that MRs or QPs still use (EBUSY); so do we. */
static int emu_dealloc_pd(struct ibv_pd *pd) {
  struct emu_ctx *c = CTX(pd->context);
  struct emu_pd *p = PD(pd);
  pthread_mutex_lock(&c->lock);
  int busy = p->refs > 0;
  if (!busy) {
    struct emu_pd **pp = &c->pds;
    while (*pp != p) pp = &(*pp)->next;
    *pp = p->next;
  }
  pthread_mutex_unlock(&c->lock);
  if (busy) return EBUSY;
  free(p);
  return 0;
}

static uint64_t pinned_bytes(const void *addr, size_t len) {
  uint64_t a = (uintptr_t)addr, end = a + len;
  return ((end + 4095) & ~(uint64_t)4095) - (a & ~(uint64_t)4095);
}

/* ibv_fork_init's contract: EINVAL once memory was registered (too late to
 * mark it); the emulator has no pages to protect, it records the call. */
static _Atomic int emu_registered, emu_fork_inited;
static int emu_fork_init(void) {
  if (atomic_load(&emu_registered)) return EINVAL;
  atomic_store(&emu_fork_inited, 1);
  return 0;
}
int gw__ibemu_fork_inited(void) { return atomic_load(&emu_fork_inited); }

static struct ibv_mr *emu_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
  struct emu_ctx *c = CTX(pd->context);
  atomic_store(&emu_registered, 1);
  if (c->fatal) return fail(EIO); /* as a detached device's: every call fails */
  if (!addr || !len || (access & ~MR_ACCESS_OK) ||
      ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)))
    return fail(EINVAL);
  /* GW_IB_EMULATE_MEMLOCK stands for RLIMIT_MEMLOCK: pages pinned by this process. */
  uint64_t pin = pinned_bytes(addr, len);
  int64_t limit = gw__env_int("GW_IB_EMULATE_MEMLOCK", -1);
  if (limit >= 0 && atomic_fetch_add(&memlocked, pin) + pin > (uint64_t)limit) {
    atomic_fetch_sub(&memlocked, pin);
    return fail(ENOMEM);
  } else if (limit < 0) {
    atomic_fetch_add(&memlocked, pin);
  }
  struct emu_mr *m = calloc(1, sizeof *m);
  pthread_mutex_lock(&c->lock);
  int slot = 0;
  while (slot < MAX_MR && c->mrs[slot]) slot++;
  if (!m || slot == MAX_MR) {
    pthread_mutex_unlock(&c->lock);
    atomic_fetch_sub(&memlocked, pin);
    free(m);
    return fail(ENOMEM);
  }
  c->mr_gen[slot] = c->mr_gen[slot] % 0xfffff + 1;
  uint32_t key = c->mr_gen[slot] << 12 | (uint32_t)slot;
  struct seg_mr *s = &c->seg->mr[slot];
  atomic_thread_fence(memory_order_release); /* the key went to 0 before these (seqlock) */
  atomic_store_explicit(&s->addr, (uintptr_t)addr, memory_order_relaxed);
  atomic_store_explicit(&s->length, len, memory_order_relaxed);
  atomic_store_explicit(&s->access, (uint32_t)access, memory_order_relaxed);
  atomic_store_explicit(&s->pd, pd->handle, memory_order_relaxed);
  atomic_store_explicit(&s->key, key, memory_order_release);
  *m = (struct emu_mr){.mr = {.context = pd->context, .pd = pd, .addr = addr, .length = len,
                              .handle = key, .lkey = key, .rkey = key},
                       .slot = slot, .locked = pin};
  c->mrs[slot] = m;
  PD(pd)->refs++;
  pthread_mutex_unlock(&c->lock);
  return &m->mr;
}

static void mr_free(struct emu_mr *m) {
  struct emu_ctx *c = CTX(m->mr.context);
  atomic_store_explicit(&c->seg->mr[m->slot].key, 0, memory_order_release);
  c->mrs[m->slot] = NULL;
  PD(m->mr.pd)->refs--;
  atomic_fetch_sub(&memlocked, m->locked);
  free(m);
}

/* The key is invalid for remote writers from the moment this returns. */
static int emu_dereg_mr(struct ibv_mr *mr) {
  struct emu_ctx *c = CTX(mr->context);
  pthread_mutex_lock(&c->lock);
  mr_free(MR(mr));
  pthread_mutex_unlock(&c->lock);
  return 0;
}

/* [addr, addr+len) lies in the MR of `key` in segment s, of PD pd, with `need`
 * access.  A seqlock read: the key is read again after the fields. */
static int mr_check(struct seg *s, uint32_t key, uint32_t pd, uint64_t addr, uint64_t len, uint32_t need) {
  struct seg_mr *m = &s->mr[key % MAX_MR];
  if (key == 0 || atomic_load_explicit(&m->key, memory_order_acquire) != key) return 0;
  uint64_t a = atomic_load_explicit(&m->addr, memory_order_relaxed);
  uint64_t l = atomic_load_explicit(&m->length, memory_order_relaxed);
  uint32_t acc = atomic_load_explicit(&m->access, memory_order_relaxed);
  uint32_t p = atomic_load_explicit(&m->pd, memory_order_relaxed);
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&m->key, memory_order_relaxed) != key) return 0;
  return p == pd && (acc & need) == need && addr >= a && len <= l && addr - a <= l - len;
}

/* ---- completion queues ------------------------------------------------------------- */
static struct ibv_cq *emu_create_cq(struct ibv_context *ibctx, int cqe, void *cq_context,
                                    struct ibv_comp_channel *channel, int comp_vector) {
  struct emu_ctx *c = CTX(ibctx);
  if (channel) return fail(EOPNOTSUPP);
  if (cqe < 1 || cqe > MAX_CQE || comp_vector != 0) return fail(EINVAL);
  struct emu_cq *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  pthread_mutex_lock(&c->lock);
  q->cq.context = ibctx;
  q->cq.cq_context = cq_context;
  q->cq.handle = ++c->handles;
  q->cq.cqe = cqe; /* exactly what was asked: overruns show here first */
  q->next = c->cqs;
  c->cqs = q;
  pthread_mutex_unlock(&c->lock);
  return &q->cq;
}

static int emu_destroy_cq(struct ibv_cq *cq) {
  struct emu_ctx *c = CTX(cq->context);
  struct emu_cq *q = CQ(cq);
  pthread_mutex_lock(&c->lock);
  int busy = q->refs > 0;
  if (!busy) {
    struct emu_cq **pp = &c->cqs;
    while (*pp != q) pp = &(*pp)->next;
    *pp = q->next;
  }
  pthread_mutex_unlock(&c->lock);
  if (busy) return EBUSY;
  free(q);
  return 0;
}

/* ---- queue pairs ---------------------------------------------------------------------- */
static struct ibv_qp *emu_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
  struct emu_ctx *c = CTX(pd->context);
  struct ibv_qp_cap *cap = &a->cap;
  if (a->qp_type != IBV_QPT_RC || a->srq || c->efa) return fail(EOPNOTSUPP);
  if (!a->send_cq || !a->recv_cq || a->send_cq->context != pd->context || a->recv_cq->context != pd->context ||
      cap->max_send_wr < 1 || cap->max_send_wr > MAX_WR || cap->max_recv_wr > MAX_WR ||
      cap->max_send_sge > MAX_SGE || cap->max_recv_sge > MAX_SGE || cap->max_inline_data > MAX_INLINE)
    return fail(EINVAL);
  struct emu_qp *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->sq = calloc(cap->max_send_wr, sizeof *q->sq);
  q->sge = calloc((size_t)cap->max_send_wr * (cap->max_send_sge ? cap->max_send_sge : 1), sizeof *q->sge);
  q->inl = malloc((size_t)cap->max_send_wr * (cap->max_inline_data ? cap->max_inline_data : 1));
  q->rq_wrid = calloc(cap->max_recv_wr ? cap->max_recv_wr : 1, sizeof *q->rq_wrid);
  pthread_mutex_lock(&c->lock);
  int slot = 0;
  while (slot < MAX_QP && c->qps[slot]) slot++;
  if (!q->sq || !q->sge || !q->inl || !q->rq_wrid || slot == MAX_QP) {
    pthread_mutex_unlock(&c->lock);
    free(q->sq), free(q->sge), free(q->inl), free(q->rq_wrid), free(q);
    return fail(ENOMEM);
  }
  c->qp_gen[slot] = (uint16_t)(c->qp_gen[slot] % 16383 + 1);
  q->ctx = c;
  q->sh = &c->seg->qp[slot];
  q->scq = CQ(a->send_cq), q->rcq = CQ(a->recv_cq);
  q->cap = *cap;
  q->sig_all = a->sq_sig_all;
  /* The receive counters only grow, across QPs of this slot too, so an inbound
   * entry left by an earlier incarnation never matches a later index. */
  q->rq_post = q->rq_cons = atomic_load(&q->sh->posted);
  atomic_store(&q->sh->claimed, RQ_CLOSED);
  atomic_store(&q->sh->state, IBV_QPS_RESET);
  atomic_store(&q->sh->pd, pd->handle);
  atomic_store(&q->sh->access, 0);
  atomic_store(&q->sh->min_rnr_timer, 0);
  atomic_store(&q->sh->access_err, 0);
  q->qp = (struct ibv_qp){.context = pd->context, .qp_context = a->qp_context, .pd = pd,
                          .send_cq = a->send_cq, .recv_cq = a->recv_cq, .handle = (uint32_t)slot,
                          .qp_num = (uint32_t)c->qp_gen[slot] << 10 | (uint32_t)slot,
                          .state = IBV_QPS_RESET, .qp_type = IBV_QPT_RC};
  atomic_store_explicit(&q->sh->qpn, q->qp.qp_num, memory_order_release);
  c->qps[slot] = q;
  c->live[c->nlive++] = q;
  PD(pd)->refs++, q->scq->refs++, q->rcq->refs++;
  pthread_mutex_unlock(&c->lock);
  return &q->qp;
}

static void qp_free(struct emu_qp *q) {
  struct emu_ctx *c = q->ctx;
  atomic_store(&q->sh->state, IBV_QPS_RESET);
  atomic_store(&q->sh->claimed, RQ_CLOSED);
  atomic_store_explicit(&q->sh->qpn, 0, memory_order_release);
  c->qps[q->qp.handle] = NULL;
  for (int i = 0; i < c->nlive; i++)
    if (c->live[i] == q) c->live[i] = c->live[--c->nlive];
  PD(q->qp.pd)->refs--, q->scq->refs--, q->rcq->refs--;
  free(q->sq), free(q->sge), free(q->inl), free(q->rq_wrid), free(q);
}

/* Destroying a QP always succeeds; its pending completions go with it. */
static int emu_destroy_qp(struct ibv_qp *qp) {
  struct emu_ctx *c = QP(qp)->ctx;
  pthread_mutex_lock(&c->lock);
  while (QP(qp)->unacked) { /* as libibverbs: not before its async events are acknowledged */
    pthread_mutex_unlock(&c->lock);
    sched_yield();
    pthread_mutex_lock(&c->lock);
  }
  qp_free(QP(qp));
  pthread_mutex_unlock(&c->lock);
  return 0;
}

static void sq_complete(struct emu_qp *q, struct swr *w, int status) {
  w->status = status;
  if (status != IBV_WC_SUCCESS || w->signaled) q->sq_cqes++;
  q->sq_exec++;
}

/* The error state: queued sends are flushed, the receive queue takes no more
 * inbound messages and its receives are flushed as the owner polls. */
void gw__ibemu_enter_error(struct emu_qp *q) {
  atomic_store(&q->sh->state, IBV_QPS_ERR);
  q->qp.state = IBV_QPS_ERR;
  if (!q->errored) atomic_store(&q->sh->claimed, RQ_CLOSED);
  q->errored = 1;
  while (q->sq_exec < q->sq_tail) sq_complete(q, &q->sq[q->sq_exec % q->cap.max_send_wr], IBV_WC_WR_FLUSH_ERR);
}

/* Notices an error state set by a remote requester (remote access error). */
static int sync_error(struct emu_qp *q) {
  if (!q->errored && atomic_load(&q->sh->state) == IBV_QPS_ERR) gw__ibemu_enter_error(q);
  return q->errored;
}

static void qp_reset(struct emu_qp *q) {
  atomic_store(&q->sh->state, IBV_QPS_RESET);
  atomic_store(&q->sh->claimed, RQ_CLOSED);
  q->qp.state = IBV_QPS_RESET;
  q->errored = 0;
  q->sq_head = q->sq_rep = q->sq_exec = q->sq_tail;
  q->sq_cqes = 0;
  q->rq_cons = q->rq_post;
}

static int qp_modify(struct emu_qp *q, struct ibv_qp_attr *a, int mask) {
  if (!(mask & IBV_QP_STATE)) return EINVAL;
  sync_error(q);
  int cur = (int)atomic_load(&q->sh->state), to = (int)a->qp_state;
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) {
    if (mask != IBV_QP_STATE) return EINVAL;
    if (to == IBV_QPS_RESET) qp_reset(q);
    else gw__ibemu_enter_error(q);
    return 0;
  }
  if (gw__ibemu_qp_attrs(q, a, mask & ~IBV_QP_STATE, cur, to) != 0) return EINVAL;
  if (cur == IBV_QPS_RESET) atomic_store(&q->sh->claimed, q->rq_post);
  /* A CAS, so an error state set meanwhile by a remote requester stays. */
  uint32_t expect = (uint32_t)cur;
  if (!atomic_compare_exchange_strong(&q->sh->state, &expect, (uint32_t)to)) {
    sync_error(q);
    return EINVAL;
  }
  q->qp.state = (enum ibv_qp_state)to;
  return 0;
}

static int emu_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
  struct emu_ctx *c = QP(qp)->ctx;
  /* GW_IB_EMULATE_RTR_TIMEOUTS=N: the first N moves to RTR of this process
   * fail with ETIMEDOUT, as RoCE's neighbour resolution of the peer's MAC
   * does when many connections start at once (tests). */
  static _Atomic long rtr_timeouts = -1;
  long left = atomic_load(&rtr_timeouts);
  if (left < 0) atomic_compare_exchange_strong(&rtr_timeouts, &left, GW_MAX(0, gw__env_int("GW_IB_EMULATE_RTR_TIMEOUTS", 0)));
  if ((mask & IBV_QP_STATE) && a->qp_state == IBV_QPS_RTR)
    for (left = atomic_load(&rtr_timeouts); left > 0;)
      if (atomic_compare_exchange_weak(&rtr_timeouts, &left, left - 1)) return ETIMEDOUT;
  pthread_mutex_lock(&c->lock);
  int r = qp_modify(QP(qp), a, mask);
  pthread_mutex_unlock(&c->lock);
  return r;
}


/* ---- executing send WRs (the requester's side of the wire) ------------------------ */
/* The IB spec's RNR timer encoding, in milliseconds. */
static const double rnr_ms[32] = {655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32,
                                  0.48,   0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36,
                                  20.48,  30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52};

/* Unreachable: retried until 4.096 us * 2^timeout * (retry_cnt + 1) have passed
 * since the first attempt.  timeout 0 ("infinite" in the spec) counts as 14. */
static int unreachable(struct emu_qp *q, struct swr *w, double now) {
  double span = 4.096e-6 * (double)(1u << (q->timeout ? q->timeout : 14)) * (q->retry_cnt + 1);
  return now - w->t_first >= span ? IBV_WC_RETRY_EXC_ERR : BLOCKED;
}

/* Receiver not ready: a NAK counts as a retry once the responder's timer ran out
 * (attempts in between are free); rnr_retry 7 retries forever. */
static int rnr_nak(struct emu_qp *q, struct swr *w, struct seg_qp *rq, double now) {
  if (now < w->t_rnr) return BLOCKED;
  if (q->rnr_retry != 7 && w->rnr_count >= q->rnr_retry) return IBV_WC_RNR_RETRY_EXC_ERR;
  w->rnr_count++;
  w->t_rnr = now + 1e-3 * rnr_ms[atomic_load(&rq->min_rnr_timer) % 32];
  return BLOCKED;
}

/* A hash of up to four 64-byte windows of each SGE of w (start, thirds, end),
 * read with process_vm_readv so an unmapped source fails instead of faulting:
 * 0 when it cannot be read. */
static int src_sample(const struct ibv_sge *sge, int nsge, uint64_t *hash) {
  struct iovec remote[MAX_SGE * 4], local;
  uint8_t buf[MAX_SGE * 4 * 64];
  size_t n = 0, total = 0;
  for (int i = 0; i < nsge; i++) {
    const uint64_t a = sge[i].addr, len = sge[i].length;
    if (!len) continue;
    if (len <= 256) {
      remote[n++] = (struct iovec){(void *)(uintptr_t)a, len}, total += len;
      continue;
    }
    const uint64_t at[4] = {0, len / 3 & ~63ull, 2 * len / 3 & ~63ull, len - 64};
    for (int k = 0; k < 4; k++) remote[n++] = (struct iovec){(void *)(uintptr_t)(a + at[k]), 64}, total += 64;
  }
  uint64_t h = 0xcbf29ce484222325ull;
  if (total) {
    local = (struct iovec){buf, total};
    if (process_vm_readv(getpid(), &local, 1, remote, n, 0) != (ssize_t)total) return 0;
    for (size_t i = 0; i < total; i++) h = (h ^ buf[i]) * 0x100000001b3ull;
  }
  *hash = h;
  return 1;
}

static const struct ibv_sge *swr_sge(const struct emu_qp *q, const struct swr *w) {
  return &q->sge[(w - q->sq) * (q->cap.max_send_sge ? q->cap.max_send_sge : 1)];
}

/* The WRs a polled completion covers, [from, to]: their sources must be what
 * they were at the post. */
static void src_check(const struct emu_qp *q, uint64_t from, uint64_t to) {
  for (uint64_t i = from; i <= to; i++) {
    const struct swr *w = &q->sq[i % q->cap.max_send_wr];
    uint64_t h;
    if (!w->hashed || w->status != IBV_WC_SUCCESS || !src_sample(swr_sge(q, w), w->nsge, &h) || h == w->src_hash)
      continue;
    char sges[MAX_SGE * 40] = "";
    for (int k = 0; k < w->nsge; k++) /* which one changed is not known: every SGE named */
      snprintf(sges + strlen(sges), sizeof sges - strlen(sges), "%s%u bytes at %#llx", k ? ", " : "",
               swr_sge(q, w)[k].length, (unsigned long long)swr_sge(q, w)[k].addr);
    fprintf(stderr, "ibemu (pid %d): the source of send WR wr_id %llu on QP %u (%u bytes: %s) changed before a "
            "polled completion covered it: a send buffer belongs to the HCA until then\n", (int)getpid(),
            (unsigned long long)w->wr_id, q->qp.qp_num, w->len, sges);
    abort();
  }
}

static int local_iov(struct emu_qp *q, const struct swr *w, struct iovec *iov, int *niov) {
  const struct ibv_sge *sge = swr_sge(q, w);
  uint32_t pd = q->qp.pd->handle;
  *niov = 0;
  if (w->inl) {
    iov[0] = (struct iovec){&q->inl[(size_t)(w - q->sq) * q->cap.max_inline_data], w->len};
    *niov = w->len > 0;
    return 1;
  }
  for (int i = 0; i < w->nsge; i++) {
    if (!sge[i].length) continue;
    if (!mr_check(q->ctx->seg, sge[i].lkey, pd, sge[i].addr, sge[i].length, 0)) return 0;
    iov[(*niov)++] = (struct iovec){(void *)(uintptr_t)sge[i].addr, sge[i].length};
  }
  return 1;
}

/* Moves the payload into the responder: BLOCKED when it is gone. */
static int copy_out(struct emu_ctx *c, int32_t pid, const struct iovec *iov, int niov, const struct swr *w) {
  if (w->len == 0) return IBV_WC_SUCCESS;
  if (pid == c->pid) {
    char *d = (char *)(uintptr_t)w->raddr;
    for (int i = 0; i < niov; d += iov[i].iov_len, i++) memmove(d, iov[i].iov_base, iov[i].iov_len);
    return IBV_WC_SUCCESS;
  }
  struct iovec r = {(void *)(uintptr_t)w->raddr, w->len};
  ssize_t n = process_vm_writev(pid, iov, (unsigned long)niov, &r, 1, 0);
  if (n == (ssize_t)w->len) return IBV_WC_SUCCESS;
  if (n < 0 && errno == ESRCH) return BLOCKED;
  if (n < 0 && errno == EPERM) {
    GW_WARN(GW_SUB_INIT, "ibemu: process_vm_writev to pid %d: %s (ptrace permission)", (int)pid, strerror(errno));
    return BLOCKED;
  }
  return IBV_WC_REM_ACCESS_ERR; /* the registered memory is no longer mapped there */
}

/* A remote access error puts the responder's QP into the error state as well,
 * with an IBV_EVENT_QP_ACCESS_ERR for its owner. */
static void remote_error(struct seg_qp *rq) {
  atomic_store(&rq->access_err, 1);
  for (uint32_t s = IBV_QPS_RTR; s <= IBV_QPS_RTS; s++) {
    uint32_t expect = s;
    atomic_compare_exchange_strong(&rq->state, &expect, IBV_QPS_ERR);
  }
}

enum { CLAIM_OK, CLAIM_RNR, CLAIM_CLOSED };

static int rq_claim(struct seg_qp *rq, uint64_t *slot) {
  uint64_t c = atomic_load_explicit(&rq->claimed, memory_order_acquire);
  for (;;) {
    if (c == RQ_CLOSED) return CLAIM_CLOSED;
    if (c >= atomic_load_explicit(&rq->posted, memory_order_acquire)) return CLAIM_RNR;
    if (atomic_compare_exchange_weak(&rq->claimed, &c, c + 1)) break;
  }
  *slot = c;
  return CLAIM_OK;
}

/* One attempt at a send WR: its completion status, or BLOCKED. */
static int sq_exec_one(struct emu_qp *q, struct swr *w, double now) {
  struct iovec iov[MAX_SGE];
  int niov;
  if (!local_iov(q, w, iov, &niov)) return IBV_WC_LOC_PROT_ERR;
  int32_t pid = 0;
  struct seg *rs = gw__ibemu_qp_remote(q, &pid);
  struct seg_qp *rq = rs ? &rs->qp[q->dest_qpn % MAX_QP] : NULL;
  uint32_t rstate = rq ? atomic_load(&rq->state) : 0;
  if (!rq || atomic_load(&rq->qpn) != q->dest_qpn || (rstate != IBV_QPS_RTR && rstate != IBV_QPS_RTS))
    return unreachable(q, w, now);
  if (q->ctx->port_down || q->ctx->fatal || atomic_load(&rs->hdr.h.port_down))
    return unreachable(q, w, now); /* a link down at either end */
  if (q->ctx->eth && atomic_load(&rq->gid_type) != atomic_load(&q->sh->gid_type))
    return unreachable(q, w, now); /* RoCE v1 and v2 frames: neither end takes the other's */
  /* Packet sequence numbers that do not line up: the responder NAKs (or drops,
   * outside its window) every packet, and the requester retries to its end.
   * (Packets count from both first numbers alike, so the first ones decide.) */
  if (atomic_load(&rq->rq_psn) != q->sq_psn) return unreachable(q, w, now);
  /* Partitions: the same key (its low 15 bits), and not both limited members
   * (the top bit clear): else the switch or the port drops the packets. */
  const uint32_t kr = atomic_load(&rq->pkey), ks = atomic_load(&q->sh->pkey);
  if ((kr & 0x7fff) != (ks & 0x7fff) || !((kr | ks) & 0x8000)) return unreachable(q, w, now);
  /* A zero-length write checks no R_Key (IB spec), so it may carry rkey 0. */
  if (w->len > 0 && (!(atomic_load(&rq->access) & IBV_ACCESS_REMOTE_WRITE) ||
                     !mr_check(rs, w->rkey, atomic_load(&rq->pd), w->raddr, w->len, IBV_ACCESS_REMOTE_WRITE))) {
    remote_error(rq);
    return IBV_WC_REM_ACCESS_ERR;
  }
  uint64_t slot = 0;
  if (w->with_imm) {
    int r = rq_claim(rq, &slot);
    if (r == CLAIM_RNR) return rnr_nak(q, w, rq, now);
    if (r == CLAIM_CLOSED) return unreachable(q, w, now);
  }
  int st = copy_out(q->ctx, pid, iov, niov, w);
  if (st == BLOCKED) return unreachable(q, w, now); /* a claimed receive dies with its process */
  if (st != IBV_WC_SUCCESS) {
    remote_error(rq);
    return st;
  }
  if (w->with_imm) {
    struct seg_in *e = &rq->in[slot % RQ_SLOTS];
    atomic_store_explicit(&e->imm, w->imm, memory_order_relaxed);
    atomic_store_explicit(&e->byte_len, w->len, memory_order_relaxed);
    atomic_store_explicit(&e->seq, slot + 1, memory_order_release);
  }
  return IBV_WC_SUCCESS;
}

static double send_delay(void) {
  static _Atomic double delay = -1;
  double d = atomic_load_explicit(&delay, memory_order_relaxed);
  if (d < 0) atomic_store(&delay, d = GW_MAX(0.0, gw__env_double("GW_IB_EMULATE_DELAY_US", 0)) * 1e-6);
  return d;
}

/* Runs queued WRs in order until one blocks; a failure puts the QP in error. */
static void sq_progress(struct emu_qp *q) {
  while (q->sq_exec < q->sq_tail && !sync_error(q)) {
    struct swr *w = &q->sq[q->sq_exec % q->cap.max_send_wr];
    double now = gw__now();
    if (now - w->t_post < send_delay()) return; /* the "DMA engine" has not read it yet */
    if (!w->started) w->started = 1, w->t_first = now;
    int st = sq_exec_one(q, w, now);
    if (st == BLOCKED) return;
    sq_complete(q, w, st);
    if (st != IBV_WC_SUCCESS) gw__ibemu_enter_error(q);
  }
}

static int sq_append(struct emu_qp *q, const struct ibv_send_wr *wr) {
  uint32_t state = atomic_load(&q->sh->state);
  if ((state != IBV_QPS_RTS && state != IBV_QPS_ERR) ||
      (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) || wr->num_sge < 0 ||
      (uint32_t)wr->num_sge > q->cap.max_send_sge || (wr->send_flags & ~(unsigned)SEND_FLAGS_OK))
    return EINVAL;
  uint64_t len = 0;
  for (int i = 0; i < wr->num_sge; i++) len += wr->sg_list[i].length;
  if (len > 1u << 31 || ((wr->send_flags & IBV_SEND_INLINE) && len > q->cap.max_inline_data)) return EINVAL;
  if (q->sq_tail - q->sq_head >= q->cap.max_send_wr) return ENOMEM;
  size_t i = q->sq_tail % q->cap.max_send_wr;
  struct swr *w = &q->sq[i];
  *w = (struct swr){.wr_id = wr->wr_id, .raddr = wr->wr.rdma.remote_addr, .rkey = wr->wr.rdma.rkey,
                    .imm = wr->imm_data, .len = (uint32_t)len,
                    .with_imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM,
                    .signaled = q->sig_all || (wr->send_flags & IBV_SEND_SIGNALED),
                    .inl = !!(wr->send_flags & IBV_SEND_INLINE), .nsge = wr->num_sge, .status = BLOCKED,
                    .t_post = gw__now()};
  if (w->inl) { /* inline data is copied now; its buffers need no MR */
    uint8_t *d = &q->inl[i * q->cap.max_inline_data];
    for (int k = 0; k < wr->num_sge; d += wr->sg_list[k].length, k++)
      memcpy(d, (void *)(uintptr_t)wr->sg_list[k].addr, wr->sg_list[k].length);
  } else if (wr->num_sge) {
    memcpy(&q->sge[i * (q->cap.max_send_sge ? q->cap.max_send_sge : 1)], wr->sg_list,
           (size_t)wr->num_sge * sizeof *wr->sg_list);
    w->hashed = src_sample(wr->sg_list, wr->num_sge, &w->src_hash);
  }
  q->sq_tail++;
  return 0;
}

/* Posting also runs the QP's queue: a write whose responder is ready completes
 * before this returns.  WRs before *bad_wr are posted, as in libibverbs. */
static int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr) {
  struct emu_qp *q = QP(qp);
  pthread_mutex_lock(&q->ctx->lock);
  sync_error(q);
  int err = 0;
  for (; wr && !(err = sq_append(q, wr)); wr = wr->next) {}
  if (err && bad_wr) *bad_wr = wr;
  if (q->errored) gw__ibemu_enter_error(q); /* flushes what was just posted */
  else sq_progress(q);
  pthread_mutex_unlock(&q->ctx->lock);
  return err;
}

/* Receive SGEs are not used (WRITE_WITH_IMM places no data by them). */
static int emu_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
  struct emu_qp *q = QP(qp);
  int err = 0;
  pthread_mutex_lock(&q->ctx->lock);
  sync_error(q);
  for (; wr; wr = wr->next) {
    if (atomic_load(&q->sh->state) == IBV_QPS_RESET || wr->num_sge < 0 ||
        (uint32_t)wr->num_sge > q->cap.max_recv_sge)
      err = EINVAL;
    else if (q->rq_post - q->rq_cons >= q->cap.max_recv_wr)
      err = ENOMEM;
    if (err) break;
    q->rq_wrid[q->rq_post % q->cap.max_recv_wr] = wr->wr_id;
    atomic_store_explicit(&q->sh->posted, ++q->rq_post, memory_order_release);
  }
  if (err && bad_wr) *bad_wr = wr;
  pthread_mutex_unlock(&q->ctx->lock);
  return err;
}

/* ---- polling ----------------------------------------------------------------------- */
static int sq_drain(struct emu_qp *q, struct ibv_wc *wc, int max) {
  int n = 0;
  for (; n < max && q->sq_rep < q->sq_exec; q->sq_rep++) {
    struct swr *w = &q->sq[q->sq_rep % q->cap.max_send_wr];
    if (w->status == IBV_WC_SUCCESS && !w->signaled) continue;
    if (w->status == IBV_WC_SUCCESS) src_check(q, q->sq_head, q->sq_rep);
    wc[n++] = (struct ibv_wc){.wr_id = w->wr_id, .status = (enum ibv_wc_status)w->status,
                              .opcode = IBV_WC_RDMA_WRITE, .byte_len = w->len, .qp_num = q->qp.qp_num};
    q->sq_head = q->sq_rep + 1; /* a polled completion frees every earlier WR */
    q->sq_cqes--;
  }
  return n;
}

/* Inbound completions in order; in the error state what has not arrived is flushed. */
static int rq_drain(struct emu_qp *q, struct ibv_wc *wc, int max) {
  int n = 0;
  for (; n < max && q->rq_cons < q->rq_post; q->rq_cons++) {
    struct seg_in *e = &q->sh->in[q->rq_cons % RQ_SLOTS];
    struct ibv_wc *x = &wc[n];
    *x = (struct ibv_wc){.wr_id = q->rq_wrid[q->rq_cons % q->cap.max_recv_wr], .qp_num = q->qp.qp_num};
    if (atomic_load_explicit(&e->seq, memory_order_acquire) == q->rq_cons + 1) {
      x->status = IBV_WC_SUCCESS, x->opcode = IBV_WC_RECV_RDMA_WITH_IMM, x->wc_flags = IBV_WC_WITH_IMM;
      x->imm_data = atomic_load_explicit(&e->imm, memory_order_relaxed);
      x->byte_len = atomic_load_explicit(&e->byte_len, memory_order_relaxed);
    } else if (q->errored) {
      x->status = IBV_WC_WR_FLUSH_ERR, x->opcode = IBV_WC_RECV;
    } else {
      break;
    }
    n++;
  }
  return n;
}

/* Completions this CQ holds or will hold for what has already happened. */
static uint64_t cq_pending(struct emu_ctx *c, struct emu_cq *cq) {
  uint64_t n = 0;
  for (int i = 0; i < c->nlive; i++) {
    struct emu_qp *q = c->live[i];
    if (q->scq == cq) n += q->sq_cqes;
    uint64_t claimed = atomic_load(&q->sh->claimed);
    if (q->rcq == cq) n += q->errored ? q->rq_post - q->rq_cons : claimed == RQ_CLOSED ? 0 : claimed - q->rq_cons;
  }
  return n;
}

/* More completions than the CQ has entries is an overrun: on hardware the CQ
 * and its QPs go to the error state.  Here every later poll fails (EOVERFLOW). */
static int cq_overrun(struct emu_ctx *c, struct emu_cq *cq, uint64_t pending) {
  if (!cq->overrun)
    GW_WARN(GW_SUB_INIT, "ibemu: CQ overrun: %llu completions for %d entries (create the CQ larger)",
            (unsigned long long)pending, cq->cq.cqe);
  cq->overrun = 1;
  for (int i = 0; i < c->nlive; i++)
    if (c->live[i]->scq == cq || c->live[i]->rcq == cq) gw__ibemu_enter_error(c->live[i]);
  errno = EOVERFLOW;
  return -1;
}

/* Retries the blocked (or held back) sends of every QP of the context, as an
 * HCA runs them whatever the process polls: a rank waiting on one
 * connection's CQ while its write to another peer was held back
 * (GW_IB_EMULATE_DELAY_US) waited for ever (the tree and the exchange at 3
 * ranks post to one peer and wait on another); then reports. */
static int emu_poll_cq(struct ibv_cq *ibcq, int max, struct ibv_wc *wc) {
  struct emu_ctx *c = CTX(ibcq->context);
  struct emu_cq *cq = CQ(ibcq);
  if (max < 0) return -1;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < c->nlive; i++) {
    sq_progress(c->live[i]);
    if (c->live[i]->rcq == cq) sync_error(c->live[i]);
  }
  uint64_t pending = cq_pending(c, cq);
  if (cq->overrun || pending > (uint64_t)cq->cq.cqe) {
    int r = cq_overrun(c, cq, pending);
    pthread_mutex_unlock(&c->lock);
    return r;
  }
  int n = 0;
  for (int k = 0; k < c->nlive && n < max; k++) { /* rotating start: no QP starves */
    struct emu_qp *q = c->live[(c->rot + (unsigned)k) % (unsigned)c->nlive];
    if (q->scq == cq) n += sq_drain(q, wc + n, max - n);
    if (q->rcq == cq) n += rq_drain(q, wc + n, max - n);
  }
  c->rot++;
  pthread_mutex_unlock(&c->lock);
  return n;
}

const struct gw_ibv gw__ibv_emu = {
    .name = "emulator",
    .get_device_list = gw__ibemu_get_device_list,
    .free_device_list = gw__ibemu_free_device_list,
    .get_device_name = gw__ibemu_get_device_name,
    .open_device = emu_open_device,
    .close_device = emu_close_device,
    .query_device = gw__ibemu_query_device,
    .query_port = gw__ibemu_query_port,
    .query_gid = gw__ibemu_query_gid,
    .query_gid_ex = gw__ibemu_query_gid_ex,
    .query_pkey = gw__ibemu_query_pkey,
    .alloc_pd = emu_alloc_pd,
    .dealloc_pd = emu_dealloc_pd,
    .reg_mr = emu_reg_mr,
    .fork_init = emu_fork_init,
    .dereg_mr = emu_dereg_mr,
    .create_cq = emu_create_cq,
    .destroy_cq = emu_destroy_cq,
    .poll_cq = emu_poll_cq,
    .create_qp = emu_create_qp,
    .modify_qp = emu_modify_qp,
    .destroy_qp = emu_destroy_qp,
    .post_send = emu_post_send,
    .post_recv = emu_post_recv,
    .get_async_event = gw__ibemu_get_async_event,
    .ack_async_event = gw__ibemu_ack_async_event,
};
