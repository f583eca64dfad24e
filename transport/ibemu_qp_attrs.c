/* ibemu_qp_attrs.c - the verbs emulator's queue-pair transitions (see ibemu.c):
 * which attributes each RC transition requires and allows (the kernel's
 * qp_state_table), their checks, and applying them to the QP. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core.h"
#include "ibv.h"

#include "ibemu.h"

/* The RC transitions with their required and optional attributes (the kernel's
 * qp_state_table); path migration is not emulated, so ALT_PATH is refused. */
static const struct {
  enum ibv_qp_state from, to;
  int req, opt;
} transitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER},
};

static int attrs_valid(struct emu_qp *q, const struct ibv_qp_attr *a, int mask, int cur) {
  const struct ibv_ah_attr *ah = &a->ah_attr;
  if ((mask & IBV_QP_CUR_STATE) && (int)a->cur_qp_state != cur) return 0;
  if ((mask & IBV_QP_PORT) && a->port_num != 1) return 0;
  uint16_t keys[MAX_PKEYS];
  if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index >= gw__ibemu_pkeys(keys)) return 0;
  if ((mask & IBV_QP_ACCESS_FLAGS) && (a->qp_access_flags & ~MR_ACCESS_OK)) return 0;
  union ibv_gid g;
  if ((mask & IBV_QP_AV) && (ah->port_num != 1 || (q->ctx->eth && !ah->is_global) ||
                             (ah->is_global && gw__ibemu_gid_entry(q->ctx, ah->grh.sgid_index, &g) < 0)))
    return 0;
  if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096)) return 0;
  if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > 0xffffff) return 0;
  if ((mask & IBV_QP_RQ_PSN) && a->rq_psn > 0xffffff) return 0;
  if ((mask & IBV_QP_SQ_PSN) && a->sq_psn > 0xffffff) return 0;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31) return 0;
  if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31) return 0;
  if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) return 0;
  if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) return 0;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > 16) return 0;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > 16) return 0;
  return 1;
}

static void attrs_apply(struct emu_qp *q, const struct ibv_qp_attr *a, int mask) {
  int32_t pid;
  if (mask & IBV_QP_ACCESS_FLAGS) atomic_store(&q->sh->access, (uint32_t)a->qp_access_flags);
  if (mask & IBV_QP_PKEY_INDEX) {
    uint16_t keys[MAX_PKEYS];
    gw__ibemu_pkeys(keys);
    atomic_store(&q->sh->pkey, keys[a->pkey_index]);
  }
  if (mask & IBV_QP_AV) {
    q->ah = a->ah_attr, q->dest_nonce = 0, (void)gw__ibemu_qp_remote(q, &pid);
    union ibv_gid g;
    const struct ibv_global_route *grh = &a->ah_attr.grh;
    atomic_store(&q->sh->gid_type, a->ah_attr.is_global ? (uint32_t)gw__ibemu_gid_entry(q->ctx, grh->sgid_index, &g)
                                                         : IBV_GID_TYPE_IB);
  }
  if (mask & IBV_QP_DEST_QPN) q->dest_qpn = a->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) atomic_store(&q->sh->rq_psn, a->rq_psn);
  if (mask & IBV_QP_SQ_PSN) q->sq_psn = a->sq_psn;
  if (mask & IBV_QP_MIN_RNR_TIMER) atomic_store(&q->sh->min_rnr_timer, a->min_rnr_timer);
  if (mask & IBV_QP_TIMEOUT) q->timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) q->retry_cnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) q->rnr_retry = a->rnr_retry;
}

int gw__ibemu_qp_attrs(struct emu_qp *q, const struct ibv_qp_attr *a, int rest, int cur, int to) {
  for (size_t i = 0; i < sizeof transitions / sizeof transitions[0]; i++) {
    if ((int)transitions[i].from != cur || (int)transitions[i].to != to) continue;
    if ((rest & transitions[i].req) != transitions[i].req ||
        (rest & ~(transitions[i].req | transitions[i].opt)) || !attrs_valid(q, a, rest, cur))
      return EINVAL;
    attrs_apply(q, a, rest);
    return 0;
  }
  return EINVAL;
}
