/* prims.h - what every algorithm (ring.c, tree.c) builds its primitives from
 * (prims.c): waiting for room on a sending connection or for a chunk on a
 * receiving one, under the runtime's waiting policy, the deadline, dead-peer
 * detection and gw_comm_abort; checking each received header against this
 * rank's own call; flushing queued sends before an operation completes; the
 * abort notice.  Not here: which connection carries what (the algorithms), or
 * how data is reduced (reduce.h).  Not installed. */
#ifndef GW_PRIMS_H
#define GW_PRIMS_H

#include "comm.h"
#include "dev.h"

/* The most connections one algorithm uses on one rank: recursive doubling's
 * links (both trees have 12, the ring two). */
#define GW_PRIMS_MAX_CONNS (2 * GW_RD_MAX)

/* One operation on one rank as an algorithm runs it. */
struct prims {
  struct gw_comm *comm;
  const struct gw_op *op;
  struct gw_errctx *err;
  /* Every connection of the algorithm: all of them are pumped (tcp moves queued
   * bytes only when asked) and polled while any one is waited on, and the
   * sending ones are flushed before the operation completes. */
  struct gw_conn **conns; /* the runner's array, of room for all it adds */
  int nconns;
  /* The other algorithm's receiving connections: a peer that called another
   * collective sends there, so a wait that drags on looks at them to name the
   * difference (or an abort notice) instead of waiting for the deadline. */
  struct gw_conn **watch; /* likewise; runners keep both arrays on their stack, not
                            in the struct, so starting an operation zeroes little */
  int nwatch;
  struct gw_ring *ring; /* the ring's channel (ring.c only) */
  const void *in;       /* this rank's part of the input (NULL when empty) */
  void *out;            /* and of the output */
  size_t count;         /* elements moved (per rank's block for RS/AG) */
  size_t stride;        /* RS/AG: elements between consecutive ranks' blocks */
  gw_reduce_fn red;
  size_t es;            /* element size */
  /* A widened operation (struct gw_op; the ring's allreduce and the two-rank
   * exchange only): in and out hold float32 (ues, the user's element size, is
   * 4) while es and the slots are the 16-bit wire's; each primitive converts
   * on its way (ring.c).  Otherwise ues == es (set by ring.c only: the
   * tree and recursive doubling never see a widened operation). */
  bool fold;
  float fscale; /* the factor of every input element on its way into the wire */
  size_t ues;
  uint32_t sent;        /* chunks sent so far (the header's step, for diagnostics) */
  size_t chunk_bytes;   /* the most one chunk carries: a slot, or an LL chunk */
  bool stream_out;      /* write the user's output with non-temporal stores */
  /* How the next receive judges a peer that has sent nothing of this
   * operation on this connection when the deadline passes (gw__wait_recv).
   * 0 (the default): it cannot be waiting on anyone first, so it has not
   * started, and is blamed at once.  Above 0 (up to 1): it may be inside the
   * operation, waiting on another rank before its first send here (recursive
   * doubling's later steps, a tree's interior child or parent, a ring
   * broadcast past the root's successor); the wait then takes this part of
   * the grace period for the notice of the rank that names the real
   * straggler instead of blaming this peer.  The algorithms stagger it (a
   * ring broadcast by distance from the root, the tree by depth, recursive
   * doubling by step), so that the rank that waits on the straggler reports
   * first and its notice reaches the others before their own, later,
   * deadlines.  A peer that did send here is inside the operation and
   * blocked on someone else: whatever this says, that wait takes the whole
   * grace, longer than any of the staggered ones (in a pipelined
   * multi-chunk operation such waits are everywhere, and a short one
   * reported first and its vague notice pre-empted the straggler's naming). */
  double grace_part;
  /* The part of the grace a wait takes, when grace_part is 0, on a peer
   * that has not started this operation but may still be finishing the one
   * before (the ring's allreduce, reduce-scatter and allgather: a rank's last
   * step there is a receive, after its last send here), blocked behind a
   * straggler whose neighbour names it at its own deadline, which may come a
   * little after this one.  The message still says "has not started it".  At
   * 4 ranks with one stopped mid-operation, the rank two behind it had
   * finished the operation, waited on its healthy predecessor in the next
   * one and blamed it just before the stopped rank's naming arrived (a
   * loaded machine spread the deadlines).  Below the whole grace of waits on
   * peers that sent: in one of these collectives the rank waiting on a
   * straggler that never called reports first, and its notice reaches the
   * others.  Matched to the ring's own collectives only: after a broadcast,
   * tree or recursive doubling, whose waits take larger parts, a rank that
   * finished it may still blame a predecessor that waits in it (not worse
   * than without: it blamed it at its deadline). */
  double prev_part;
  /* The last wait status this operation told the ranks it sends to (told:
   * any yet), so that a wait tells again only when what it knows changed. */
  bool told;
  int32_t told_end;
  /* Device buffers on the device ring (devring.c): the payload moves between
   * device-memory twins of the slots, by copies and kernels on `stream`;
   * NULL for host memory.  Synchronized, the progress thread does both, on
   * the engine's stream.  Stream-ordered (dev->async), the caller's thread
   * emits every primitive's device work onto the caller's stream at the call
   * (emit: no host FIFO), and the progress thread runs the same schedule for
   * the headers alone. */
  struct gw_devring *dev;
  gw_dev_stream_t stream;
  bool emit;
};

/* Whether a peer on this machine still runs (a zombie counts as dead); peers
 * elsewhere count as running (their transport watches them). */
bool gw__peer_alive(const struct gw_comm *comm, int peer);
/* A peer's abort notice at the head of receiving connection c (looked at, left
 * there), or at any of comm's receiving connections: GW_ERR_REMOTE with its
 * reason, else GW_SUCCESS.  For waits outside an operation's own connections
 * (the device ring's stream; a stream-ordered operation waiting for its stream)
 * on the thread that runs the operations. */
gw_result_t gw__notice_on(struct gw_comm *comm, struct gw_conn *c, struct gw_errctx *err);
gw_result_t gw__heard_abort(struct gw_comm *comm, struct gw_errctx *err);

/* The device ring's primitives (device.c), the device forms of ring.c's. */
gw_result_t gw__dprim_send(struct prims *p, const void *src, void *dst, size_t n);
gw_result_t gw__dprim_recv(struct prims *p, void *dst, size_t n);
gw_result_t gw__dprim_recv_reduce_send(struct prims *p, const void *src, size_t n);
gw_result_t gw__dprim_recv_reduce_copy_send(struct prims *p, const void *src, void *dst, size_t n, uint32_t div);
gw_result_t gw__dprim_recv_reduce_copy(struct prims *p, const void *src, void *dst, size_t n, uint32_t div,
                                       bool local_first);
gw_result_t gw__dprim_recv_copy_send(struct prims *p, void *dst, size_t n);

/* The chunk size of op's protocol (every connection an operation uses has the
 * same transport limits). */
static inline size_t gw__chunk_bytes(const struct gw_comm *c, const struct gw_op *op) {
  return op->proto == GW_PROTO_LL ? c->ll_chunk_bytes : c->conn_params.slot_bytes;
}

/* "#seq allreduce(count=.., dtype, op)[ for bucket k of bucketer b][, an
 * average divided first][ on device memory][ by algo/proto]", for messages;
 * GW_OPDESC_TEXT holds the longest. */
#define GW_OPDESC_TEXT 256
/* Whether a received header holds what no call of this job makes (prims.c,
 * check_header), why[len] saying which field. */
bool gw__header_impossible(const struct gw_opdesc *theirs, uint64_t my_seq, char *why, size_t len);
void gw__describe_op(const struct gw_opdesc *d, char *buf, size_t len);

/* What a rank puts before the message of an abort notice it received. */
#define GW_FORWARDED "stopped because another rank failed: "
/* The original failure behind any forwarding prefixes of an abort notice. */
const char *gw__root_cause(const char *msg);

/* Adds c, when it is connected, to the connections the operation uses. */
static inline void gw__use(struct prims *p, struct gw_conn *c) {
  if (c->tp) p->conns[p->nconns++] = c;
}
/* Adds c, when it is a connected receiving end, to those it watches. */
static inline void gw__watch(struct prims *p, struct gw_conn *c) {
  if (c->tp && !c->is_send) p->watch[p->nwatch++] = c;
}

/* Room for `bytes` on sending connection c (*slot), waiting as long as it takes. */
gw_result_t gw__wait_slot(struct prims *p, struct gw_conn *c, size_t bytes, void **slot);
/* Publishes the room from gw__wait_slot with this operation's header. */
gw_result_t gw__post(struct prims *p, struct gw_conn *c, size_t bytes);
/* Whether the chunk of `bytes` at src can leave straight from the caller's
 * memory on c (a registered range over a transport that can: ib). */
static inline bool gw__direct_ok(struct gw_conn *c, const void *src, size_t bytes) {
  return c->tp->direct_ok && c->tp->direct_ok(c, src, bytes);
}
/* After gw__wait_slot and a yes from gw__direct_ok: sends the chunk from src
 * instead of the slot (the operation's flush waits until src was read). */
gw_result_t gw__post_direct(struct prims *p, struct gw_conn *c, const void *src, size_t bytes);
/* The next chunk on receiving connection c, which must be `bytes` long and
 * belong to this rank's own call; a peer's abort notice or a different call
 * fails with a message naming the peer. */
gw_result_t gw__wait_recv(struct prims *p, struct gw_conn *c, const void **data, size_t bytes);
/* Gives the chunk from gw__wait_recv back to its sender. */
gw_result_t gw__release(struct prims *p, struct gw_conn *c);
/* Waits until every sending connection has moved its queued bytes out. */
gw_result_t gw__flush(struct prims *p);

static inline const uint8_t *cat(const void *base, size_t idx, size_t es) {
  return base ? (const uint8_t *)base + idx * es : NULL;
}
static inline uint8_t *at(void *base, size_t idx, size_t es) {
  return base ? (uint8_t *)base + idx * es : NULL;
}
/* Elements of the block [start, start + len) that lie inside [0, count). */
static inline size_t blk_len(size_t count, size_t start, size_t len) {
  return start >= count ? 0 : GW_MIN(len, count - start);
}

#endif
