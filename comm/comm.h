/* comm.h - the communicator's internal state, shared by comm.c (lifecycle,
 * connections), enqueue.c (API entry points, progress thread), channels.c,
 * prims.c (what the algorithms wait with), ring.c and tree.c (the algorithms).
 * Not installed. */
#ifndef GW_COMM_H
#define GW_COMM_H

#include <pthread.h>
#include <stdbool.h>

#include "bootstrap.h"
#include "core.h"
#include "reduce.h"
#include "transport.h"
#include "tune.h"

enum gw_coll {
  GW_COLL_ALLREDUCE = 1,
  GW_COLL_BROADCAST = 2,
  GW_COLL_ALLGATHER = 3,
  GW_COLL_REDUCE_SCATTER = 4,
  GW_COLL_BARRIER = 5,
  GW_COLL_ABORT = 6, /* not a collective: a failing rank's notice to its ring successor */
  GW_COLL_STATUS = 7, /* not a collective: whom a rank past its deadline waits on (struct gw_wait_status) */
};
const char *gw__coll_name(int coll);

#define GW_MAX_CHANNELS 8
struct gw_channels;

/* GW_ALGO: which allreduce algorithm; auto lets the cost model (tune.c) pick. */
enum gw_algo { GW_ALGO_AUTO = 0, GW_ALGO_RING = 1, GW_ALGO_EXCHANGE = 2, GW_ALGO_TREE = 3 };

/* gw_opdesc.pad: the operation's buffers are device memory on the device ring
 * (a rank with host buffers in the same call is a mismatch, caught by the
 * header check); and the algorithm (bits 1-2, enum gw_algo) and protocol (bit
 * 3, enum gw_proto) it runs with, set by gw__run_op: ranks that chose
 * differently (GW_EXCHANGE_MAX_BYTES, gw_comm_set_algo at different points)
 * can move the same chunks over the same connections (the exchange and the
 * ring at 2 ranks) and compute different results, so the header check
 * compares the choice too. */
#define GW_DESC_DEVICE 1u
#define GW_DESC_ALGO_SHIFT 1
#define GW_DESC_PROTO_SHIFT 3
/* A piece of a staged device call that more pieces follow (device.c): the
 * pieces' headers carry the piece's count, so ranks whose calls differ by a
 * whole number of pieces would pair one call's extra pieces with the next
 * call's first; at the shorter call's last piece the headers differ. */
#define GW_DESC_MORE (1u << 4)
/* A bucketer's average divided on each rank before a sum
 * (gw_bucketer_set_divide_first): the descriptor's op is then sum, and a
 * rank that set it against one that did not was named as calling sum
 * against avg; the mark says why. */
#define GW_DESC_DIVIDED (1u << 5)

/* An allreduce a bucketer starts carries in its descriptor's root (-1 for a
 * caller's own call) which bucketer (its number on the communicator) and
 * which bucket it is: two bucketers on one communicator whose buckets start
 * in different orders on different ranks paired one's bucket with the
 * other's without a word where the sizes matched; the header check now
 * refuses it and says both.  A number is 1 to GW_BUCKETER_NUMBERS - 1, the
 * lowest that no live bucketer of the communicator holds on any rank
 * (gw_bucketer_create agrees on it), so it fits its 14 bits and no two live
 * bucketers share one (numbered by creation they wrapped after 16383
 * bucketers, and a live one's buckets then passed for a newer one's).
 * Bucket indices past 16 bits wrap: a bucketer's buckets start in order. */
#define GW_BUCKETER_NUMBERS 16384
static inline int32_t gw__desc_bucket_tag(uint32_t bucketer, uint32_t bucket) {
  return -2 - (int32_t)((bucketer & 0x3fffu) << 16 | (bucket & 0xffffu));
}
static inline bool gw__desc_bucket_of(int32_t root, uint32_t *bucketer, uint32_t *bucket) {
  if (root > -2) return false;
  const uint32_t v = (uint32_t)(-2 - root);
  *bucketer = v >> 16, *bucket = v & 0xffffu;
  return true;
}

/* One operation as the algorithms see it. */
struct gw_op {
  struct gw_opdesc desc; /* seq, count, root, coll, dtype, op */
  const void *sendbuf;
  void *recvbuf;
  uint8_t algo, proto; /* enum gw_algo (never auto), enum gw_proto: gw__run_op's choice */
  /* The communicator's GW_ALGO / GW_PROTO (gw_comm_set_algo) when the call was
   * made: the choice for a queued operation is made later, on the progress
   * thread, and must not see a later gw_comm_set_algo. */
  int8_t want_algo, want_proto;
  /* Stream-ordered operations (device.c): the caller's stream, whether the
   * buffers are device memory, the ticket of its start/done flags, and (staged
   * device buffers, or the stream-ordered device ring) the ticket of the
   * operation of its kind before it, whose stream must be done with the
   * staging buffers, or the ring's twins and counters, first (0: none). */
  bool ordered, device_mem;
  void *stream;
  uint64_t ticket, after;
  /* The bucketer's 16-bit wire on host gradients (gw__iallreduce_widened):
   * sendbuf and recvbuf hold float32 while desc.dtype is the wire's 16-bit
   * dtype.  The ring and the two-rank exchange convert inside their steps
   * (each input element times scale, rounded once; each result widened from
   * the 16-bit value sent on); the other algorithms run on wire_buf (count
   * 16-bit elements) between a conversion pass each way, on the thread that
   * runs the operation.  Bit for bit the same results either way. */
  bool widened;
  float scale;
  void *wire_buf;
};

/* A ring: this rank receives from prev and sends to next.  Ranks of one machine
 * are contiguous in it, so the ring crosses the network once each way per node. */
struct gw_ring {
  int index;   /* this rank's position */
  int *order;  /* [nranks] rank at each position */
  int *pos_of; /* [nranks] position of each rank */
  int prev, next;
  struct gw_conn send; /* to next */
  struct gw_conn recv; /* from prev */
};

/* One of the double binary tree's two trees, as this rank sees it (tree.c):
 * ranks of the parent and children (-1 where none; down[0] is set whenever a
 * child exists) and a connection each way to each of them. */
#define GW_NTREES 2
struct gw_tree {
  int up;
  int down[2];
  /* The part of the grace period a wait on down[i] takes before blaming it
   * when the child has sent nothing of the operation (struct prims's
   * grace_part; one that did send waits on someone else, and the wait takes
   * the whole grace): 0 for a leaf, whose first send waits for no one, so it
   * is named the straggler at once; for an interior child, which waits on its
   * own children first, less the deeper it is, so that the parent of the
   * deepest straggler reports first and its notice reaches the others before
   * their later deadlines. */
  float down_grace[2];
  /* The same for the wait on the parent's downward chunk: above every wait on
   * a child, and growing with this rank's depth, so that when the straggler is
   * the root the ranks nearest it report first. */
  float up_grace;
  struct gw_conn send_up, recv_up;
  struct gw_conn send_down[2], recv_down[2];
};
/* All six connections of a tree, connected or not, for code that treats them
 * alike (closing, abort notices, watching). */
static inline void gw__tree_conns(struct gw_tree *t, struct gw_conn *out[6]) {
  out[0] = &t->send_up, out[1] = &t->recv_up;
  out[2] = &t->send_down[0], out[3] = &t->recv_down[0];
  out[4] = &t->send_down[1], out[5] = &t->recv_down[1];
}

/* Recursive doubling's links (rd.c): [0, npartners) the partners of each
 * step, then the extra (folded) position's or its home's, both directions. */
#define GW_RD_MAX 16
/* The most ranks it runs at: log2 of the largest power of two at or below the
 * rank count partners, plus the extra link, within GW_RD_MAX (2^15 <= n <
 * 2^16 takes 15 + 1).  More ranks leave the exchange to the ring. */
#define GW_RD_MAX_RANKS ((1 << GW_RD_MAX) - 1)
struct gw_rd {
  int npartners, nlinks;
  int peer[GW_RD_MAX]; /* ranks */
  struct gw_conn send[GW_RD_MAX], recv[GW_RD_MAX];
};

/* One directed connection this rank takes part in, for gw__connect.  Each
 * graph (a ring channel, a tree) has its own connections, so several may join
 * the same two ranks. */
#define GW_GRAPH_TREE(t) (GW_MAX_CHANNELS + (t)) /* graphs 0..GW_MAX_CHANNELS-1 are the ring channels */
#define GW_GRAPH_RD (GW_MAX_CHANNELS + GW_NTREES) /* recursive doubling (rd.c) */
struct gw_link {
  struct gw_conn *conn; /* filled in by gw__connect */
  int peer;
  bool is_send;
  int graph;
};

struct gw_request {
  struct gw_request *next; /* queue link */
  struct gw_request *live_next; /* the live handles' table (enqueue.c), while the caller holds it */
  uint64_t id;                  /* its handle's value (enqueue.c): never one of an earlier request */
  struct gw_comm *comm;
  struct gw_op op;
  _Atomic int done;
  gw_result_t result;
  /* result's message (progress thread; NULL: success, or no memory for it):
   * what its wait reports, the communicator's last error having moved on to
   * the refusals of the requests queued after it */
  char *msg;
  bool detached; /* nobody waits: the progress thread frees it (stream-ordered calls) */
  double unsettled_since; /* gw_test: when it first found the host part done, the result not copied out (0: not yet) */
  double unsettled_limit; /* GW_TIMEOUT then: the limit of that wait (a wait under way keeps its limit) */
};
struct gw_devstate;

struct gw_comm {
  /* The gate, first: a destroyed communicator's memory is kept for the next
   * one (comm.c, comm_alloc), and these (and `aborting`, below) are never cleared, so a call
   * that raced the destroy (a second destroy, an accessor on a watchdog
   * thread) counts itself in and out of memory that is still there, and is
   * refused.  inside: threads inside a call on it (gw__comm_enter: a
   * collective, gw_wait, gw_test, registration, the setters,
   * gw_bucketer_create, and a destroy deciding).  destroying:
   * GW_DESTROY_CHECKING while destroy counts them (a call entering meanwhile
   * waits for the verdict), GW_DESTROY_GOING once it goes ahead (a call
   * entering then is refused), GW_DESTROY_FREE while the memory waits for
   * reuse or the next communicator is being made (refused the same way).  peeking: threads in an accessor
   * (gw_comm_last_error, gw_comm_get_async_error, gw_comm_rank, ...; a
   * watchdog polls them beside the training thread), not a reason to refuse
   * destroy, which waits for them once it goes ahead (gw__comm_peek). */
  _Atomic int inside;
  _Atomic int destroying;
  _Atomic int peeking;
  /* gw_comm_abort calls between their look at destroying and their flag's
   * store: the next communicator made in this memory opens only once none is
   * (comm.c): a stale handle's abort that saw the old one alive and was held
   * up past the new one's init set the flag on the new one. */
  _Atomic int aborting;
  struct gw_comm *pool_next; /* while kept for reuse */
  int rank, nranks, local_rank, local_size; /* local: on this machine (node id) */
  _Atomic double timeout_s; /* every wait on the data path (gw_comm_set_timeout: any thread, any time) */
  enum gw_algo algo;  /* GW_ALGO, or gw_comm_set_algo */
  int proto;          /* GW_PROTO: enum gw_proto, or -1 for the model's choice */
  struct gw_model model;  /* built-in, or GW_TUNING_FILE's */
  bool model_from_file;   /* GW_TUNING_FILE's was loaded (a file refused leaves the built-in one) */
  int tclass;             /* GW_TCLASS_*: the slowest transport the ring crosses (the tuning file's rows' key) */
  /* The cost model's recent picks (choose in enqueue.c), direct-mapped by size
   * and collective: a training loop or a benchmark calls the same few shapes
   * over and over, and a pick weighs six algorithm/protocol pairs.  Everything
   * the model decides from is fixed at init but the caller's GW_ALGO/GW_PROTO
   * (part of the key).  Only the thread running operations touches it, one
   * operation at a time (inline, or the progress thread: they hand over
   * through inline_busy and pending). */
  struct gw_pick_memo {
    size_t bytes;
    uint8_t coll, algo, proto, valid;
    int8_t want_algo, want_proto;
  } pick_memo[8];
  bool tree_ok;       /* the trees are connected (GW_ALGO auto or tree) */
  bool connected;     /* every connection made (init's end: a failure then is told on them) */
  bool oversubscribed; /* more ranks on this rank's cores than cores: waits yield at once */
  bool oversub_counted; /* in gw__waiter_oversubscribed's count (GW_SPIN_US unset) */
  int tree_levels;    /* hierarchical trees: their depth (the cost model's); 0: flat */
  /* GW_EXCHANGE_MAX_BYTES and GW_CHANNEL_MIN_BYTES, agreed at init (they
   * decide an operation's algorithm and channels). */
  size_t exchange_max, channel_min_bytes;
  uint32_t ll_chunk_bytes; /* LL chunk capacity of every connection; 0: some have no LL */
  struct gw_bootstrap *bs;
  struct gw_peer_info *peers; /* [nranks] */
  struct gw_ring rings[GW_MAX_CHANNELS]; /* same order, own connections */
  int nchannels;
  struct gw_channels *channels; /* worker threads for channels 1..n-1 */
  struct gw_tree trees[GW_NTREES]; /* connected at init unless GW_ALGO=ring|exchange */
  bool rd_ok;                      /* recursive doubling connected (more than 2 ranks, GW_ALGO auto|exchange) */
  struct gw_rd rd;
  struct gw_conn_params conn_params;
  /* Liveness locks (alive.c): our own file, its path while it has a name (only
   * during init), and the descriptors of the files of the ranks sharing our
   * /dev/shm ([nranks], -1 for the others). */
  int alive_own;
  bool alive_named;
  char alive_path[96];
  int *alive_fds;
  int device;                /* the device this rank is bound to, -1 for none (device.c) */
  struct gw_devstate *dev;   /* stream flags and staging, made on first use */
  struct gw_devring *devring; /* the device ring (device.c), NULL when not every rank has one */
  uint64_t dev_stage_bytes;   /* GW_DEV_STAGE_BYTES agreed at init (rank 0's); 0: this rank's own */
  bool dev_abandoned;         /* destroy gave up an operation whose stream may still wait: leave its buffers */

  /* Operations run one at a time, in call order: inline on the caller's thread
   * when nothing is queued, else on the progress thread.  mu guards the queue and
   * the thread's state; the inline path takes no lock. */
  pthread_mutex_t mu;
  pthread_cond_t work_cv, done_cv;
  struct gw_request *q_head, *q_tail;
  bool shutdown, thread_started;
  _Atomic bool stopping; /* shutdown, readable without mu */
  pthread_t thread;
  _Atomic int pending;       /* operations queued or running on the progress thread */
  _Atomic bool inline_busy;  /* a blocking call is running on its caller's thread */
  /* What gw_comm_destroy refuses to free the communicator under: threads
   * inside a call on it (`inside`, at the top), bucketers, and requests
   * handed out and not yet freed by gw_wait / gw_test. */
  _Atomic int bucketers;
  /* bit k: bucketer number k is a live bucketer's on this rank (gw__desc_bucket_tag) */
  _Atomic uint64_t bucketer_numbers[GW_BUCKETER_NUMBERS / 64];
  _Atomic int requests;
  /* The process that made it and the fork generation then (alive.c): in a
   * child forked without exec every call on it is refused. */
  long owner_pid;
  unsigned fork_gen;
  _Atomic uint64_t next_seq;
  /* The latest collective's path (gw_comm_last_path): 0 before any, else
   * 1 << 24 | device ring << 16 | protocol << 8 | algorithm. */
  _Atomic uint32_t last_path;
  /* Widened operations the ring converted inside its steps (tests tell the
   * fold from the passes by it). */
  _Atomic uint64_t folded_ops;

  /* Once an operation fails the ring may hold half-sent chunks, so the
   * communicator refuses further operations with the first failure's code. */
  _Atomic int failed;
  _Atomic bool aborted; /* gw_comm_abort: every wait gives up */
  _Atomic int test_paused; /* tests: a blocking call is in GW_TEST_INLINE_PAUSE_US's or _HOLD_US's pause */
  pthread_mutex_t err_mu;
  char last_error[GW_ERRMSG_MAX];
  char first_error[GW_ERRMSG_MAX];
  char abort_reason[GW_ERRMSG_MAX]; /* an abort of the library's own (the bucketer's), under err_mu; "" else */
};

/* Connects links[0..nlinks) over the transport each pair allows (shm on one
 * machine, else tcp), with one rendezvous round for all of them; every rank
 * calls it at the same point, with at most max_recv receiving links. */
/* comm.c: a failed init's message as the thread's error, res passed on. */
gw_result_t gw__init_fail(struct gw_errctx *err, gw_result_t res);
/* comm_env.c: the job token every rank of one launch shares (GW_JOB_TOKEN,
 * else the launcher's id); false when none; and the launcher's local rank
 * (NULL when none says). */
bool gw__job_token(char *out, size_t len);
const char *gw__env_local_rank(void);
/* The first host of a Slurm hostlist ("node[07-09,12],gpu1" -> "node07",
 * "rack[1-2]-n[3,5]" -> "rack1-n3"); false when it is not one. */
bool gw__slurm_first_host(const char *list, char *out, size_t len);
/* Every rank's GW_ALGO, GW_PROTO, GW_TRANSPORT, channels, chunk sizes and cost
 * model must match: compared once at init (comm_settings.c). */
gw_result_t gw__check_settings_agree(struct gw_comm *c, struct gw_errctx *err);
/* GW_ALGO (auto at 1 rank for the exchange) and GW_PROTO (-1: auto); a word
 * that is none of theirs reads as auto here and is refused by
 * gw__settings_refused (comm_settings.c). */
enum gw_algo gw__settings_algo(int nranks);
int gw__settings_proto(void);
/* Whether init refuses a setting for what it is, whatever its range (a word
 * that is none of GW_ALGO's or GW_PROTO's, an integer setting given no
 * number); the message into buf. */
bool gw__settings_refused(int rank, char *buf, size_t len);
/* gw_iallreduce with the descriptor's root set to tag (gw__desc_bucket_tag)
 * and marks (GW_DESC_DIVIDED or 0) in its pad. */
gw_result_t gw__iallreduce_tagged(const void *sendbuf, void *recvbuf, size_t count, gw_dtype_t dtype, gw_op_t op,
                                  gw_comm_t comm, void *stream, gw_request_t *req, int32_t tag, uint8_t marks);
/* The same in place on count float32 elements at buf that travel as the
 * 16-bit dtype wire (struct gw_op's widened; wire_buf: count elements of it). */
gw_result_t gw__iallreduce_widened(float *buf, void *wire_buf, size_t count, gw_dtype_t wire, gw_op_t op, float scale,
                                   gw_comm_t comm, gw_request_t *req, int32_t tag, uint8_t marks);
gw_result_t gw__connect(struct gw_comm *c, const struct gw_link *links, int nlinks, int max_recv,
                        struct gw_errctx *err);

/* Runs one operation to completion (any thread; the caller serializes). */
gw_result_t gw__run_op(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err);
/* A failed (or, between operations, aborted: failed now) communicator's
 * refusal naming its first error; GW_SUCCESS while it can run. */
gw_result_t gw__refuse_if_failed(struct gw_comm *comm, const struct gw_op *op, struct gw_errctx *err);
/* Runs op on every channel (channels.c): channel 0 on the calling thread, the
 * others on the communicator's channel threads, each on its slice of the data. */
gw_result_t gw__ring_run(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err);
gw_result_t gw__channels_start(struct gw_comm *comm, struct gw_errctx *err);
void gw__channels_stop(struct gw_comm *comm);
/* Ring algorithms on one channel (ring.c). */
gw_result_t gw__ring_run_channel(struct gw_comm *comm, int ch, int nch, const struct gw_op *op, struct gw_errctx *err);
/* The double binary tree (tree.c): position pos's parent and children in tree
 * t (0 or 1) of n positions, -1 where none; the trees' connections; allreduce
 * (and the barrier) over both trees. */
void gw__tree_shape(int n, int pos, int t, int *up, int down[2]);
void gw__tree_shape_hier(int n, const int *node_of, int pos, int t, int *up, int down[2]);
gw_result_t gw__tree_connect(struct gw_comm *comm, struct gw_errctx *err);
int gw__rd_shape(int n, int pos, int *extra, int partners[GW_RD_MAX]);
gw_result_t gw__rd_connect(struct gw_comm *comm, struct gw_errctx *err);
gw_result_t gw__rd_run(struct gw_comm *comm, const struct gw_op *op, struct gw_errctx *err);
/* Every connection besides the rings' (the trees' and recursive doubling's),
 * connected or not; returns how many (at most GW_EXTRA_CONNS). */
#define GW_EXTRA_CONNS (6 * GW_NTREES + 2 * GW_RD_MAX)
int gw__extra_conns(struct gw_comm *comm, struct gw_conn *out[GW_EXTRA_CONNS]);
gw_result_t gw__tree_run(struct gw_comm *comm, const struct gw_op *op, struct gw_errctx *err);
/* Best effort: tells every peer this rank sends to (ring successors, tree
 * neighbours) that it failed, with the message, so they fail at once instead of
 * waiting for their deadline (and pass it on). */
void gw__send_abort(struct gw_comm *comm, const struct gw_opdesc *desc, const char *msg);

/* The cost model's inputs that hold for every operation of comm (comm.c). */
/* algo, proto: what the call asked for (gw_op's want_*, taken at the call:
 * gw_comm_set_algo may change the communicator's meanwhile, on another thread). */
void gw__pick_base(const struct gw_comm *comm, int algo, int proto, struct gw_pick_args *a);

/* Marks the communicator failed by res (the first failure wins: it is kept
 * and told to the peers). */
void gw__comm_fail(struct gw_comm *comm, const struct gw_opdesc *desc, gw_result_t res, struct gw_errctx *err);
/* The same from a caller's thread outside any operation, with other calls
 * possibly on the connections (enqueue.c). */
void gw__comm_fail_caller(struct gw_comm *comm, gw_result_t res, struct gw_errctx *err);
/* Why a wait on peer ran out when its process (on this machine) is stopped
 * (SIGSTOP, a debugger): GW_ERR_TIMEOUT naming it, into err; GW_SUCCESS when
 * it is not stopped or not ours to look at (prims.c). */
gw_result_t gw__stopped_peer_error(struct gw_comm *comm, int peer, const struct gw_opdesc *d, const char *what,
                                   double waited, struct gw_errctx *err);
/* What to raise when pthread_create failed with e ("" but for EAGAIN). */
const char *gw__thread_limit_hint(int e);
/* Whether this process is a child forked (without exec) from comm's owner:
 * then nothing of comm may be used (its locks may have been held at the fork,
 * its connections and FIFOs are the parent's). */
bool gw__comm_forked_away(const struct gw_comm *comm);
/* An accessor's gate: false (this thread's error says so) when the
 * communicator is being destroyed; else it may be read until
 * gw__comm_unpeek.  A forked child's copy is read as it is (no count: nobody
 * frees it under the child). */
bool gw__comm_peek(struct gw_comm *comm, const char *fn);
void gw__comm_unpeek(struct gw_comm *comm);
/* Why the communicator was aborted: the library's own reason, or gw_comm_abort. */
void gw__abort_reason(struct gw_comm *comm, char *out, size_t len);

/* Device memory and streams (device.c). */
gw_result_t gw__dev_bind(struct gw_comm *comm, struct gw_errctx *err);
void gw__dev_thread_start(struct gw_comm *comm);
/* GW_CAP_DEVICE when this rank can join a device ring (published at the rendezvous). */
uint32_t gw__dev_caps(void);
/* After the rings are connected: the device-memory twins of ring 0's slots,
 * when every rank can have them (one collective step for all ranks). */
gw_result_t gw__dev_ring_setup(struct gw_comm *comm, struct gw_errctx *err);
/* The caller's side of a stream-ordered device-ring operation: the ring's
 * schedule for op with every primitive's device work put on stream now
 * (ring.c; the progress thread runs it again for the headers). */
gw_result_t gw__ring_emit(struct gw_comm *comm, const struct gw_op *op, void *stream, struct gw_errctx *err);
/* The device ring's chunk size, or 0 when op does not run on it. */
size_t gw__dev_ring_chunk(const struct gw_comm *comm, const struct gw_op *op);
void gw__dev_ring_free(struct gw_comm *comm);
/* Whether the device ring is stream-ordered (GW_DEV_ASYNC on every rank). */
bool gw__dev_ring_async(const struct gw_comm *comm);
/* One buffer of a call to come (a bucketer's), checked as gw__dev_check
 * checks a call's: host memory, or the communicator's device's for `bytes`;
 * *is_dev (when not NULL) says which. */
gw_result_t gw__dev_check_buffer(struct gw_comm *comm, const char *fn, const char *name, const void *p, size_t bytes,
                                 int *is_dev, struct gw_errctx *err);
/* A stream to come (a bucketer's), checked as gw__dev_check checks a call's. */
gw_result_t gw__dev_check_stream(struct gw_comm *comm, const char *fn, void *stream, struct gw_errctx *err);
/* Classifies the buffers (host or device) and sets op's stream fields. */
gw_result_t gw__dev_check(struct gw_comm *comm, const char *fn, struct gw_op *op, void *stream, size_t send_elems,
                          size_t recv_elems, struct gw_errctx *err);
/* How many hardware work queues the device's streams share (GW_DEV_QUEUES,
 * else the device layer's; 0: each stream its own). */
long gw__dev_queues(void);
/* Whether GW_DEV_QUEUES set that count (else the device layer said it). */
bool gw__dev_queues_set(void);
/* How many sequence numbers a stream-ordered op takes (its staging pieces). */
uint64_t gw__dev_npieces(const struct gw_comm *comm, const struct gw_op *op);
gw_result_t gw__dev_throttle(struct gw_comm *comm);
/* The entry of a call on comm (fn names it): refused where the communicator
 * is being destroyed or belongs to the parent of a forked child; else counted
 * in comm->inside until gw__comm_leave. */
gw_result_t gw__comm_enter(struct gw_comm *comm, const char *fn);
void gw__comm_leave(struct gw_comm *comm);
/* The communicator's GW_ALGO / GW_PROTO now (gw_comm_set_algo may change them
 * on another thread). */
void gw__comm_algo_setting(const struct gw_comm *comm, int8_t *algo, int8_t *proto);
/* Under comm->mu: takes op's ticket (and makes the flags on first use). */
gw_result_t gw__dev_reserve_locked(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err);
/* After op was queued for the progress thread, on the caller's thread: puts
 * op's work on its stream (a failure is also op's, reported by the progress
 * thread). */
gw_result_t gw__dev_enqueue(struct gw_comm *comm, const struct gw_op *op, struct gw_errctx *err);
gw_result_t gw__dev_run(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err);
void gw__dev_free(struct gw_comm *comm);
/* A call on device memory with no stream blocks until the result is in place
 * for any stream: a staged one's host part ends before the default stream's
 * last copies out.  settled: whether they ran (true for every other call);
 * settle: waits for them (GW_TIMEOUT; aborts), the message set. */
bool gw__dev_settled(const struct gw_comm *comm, const struct gw_op *op);
gw_result_t gw__dev_settle(struct gw_comm *comm, const struct gw_op *op);
/* One look (gw_test): *settled, or an error once the communicator was aborted
 * or `since` is `timeout` past, the wait's limit (0: none; the message set,
 * as gw__dev_settle's). */
gw_result_t gw__dev_settle_look(struct gw_comm *comm, const struct gw_op *op, double since, double timeout,
                                bool *settled);
/* The calling thread on comm's device (destroy frees its device memory
 * there); returns what to give gw__dev_switch_back (-1: nothing changed). */
int gw__dev_switch(struct gw_comm *comm);
void gw__dev_switch_back(int prev);
/* The calling thread onto `device` (a thread with no context yet stays there);
 * *prev for gw__dev_switch_back; 0, or 1 / 2 when asking / switching failed. */
int gw__dev_enter(int device, int *prev);

/* Records msg as the communicator's last error. */
void gw__comm_set_error(struct gw_comm *comm, const char *msg);
/* The communicator's first failure's message, copied under its lock. */
void gw__comm_first_error(struct gw_comm *comm, char *buf, size_t len);

/* Called by gw_comm_destroy: drains the queue and stops the progress thread. */
void gw__progress_stop(struct gw_comm *comm);

/* alive.c: liveness locks of the ranks on this machine. */
void gw__alive_create(struct gw_comm *c, struct gw_peer_info *me);
/* In this order: a call enters below GOING.  FREE: the memory waits in the
 * pool for reuse, or the next communicator is being made on it (gw_comm_abort
 * through a stale handle then sets nothing: the new one's init is no destroy
 * to tell the peers of). */
enum { GW_DESTROY_NO, GW_DESTROY_CHECKING, GW_DESTROY_GOING, GW_DESTROY_FREE };
/* The fork generation: bumped in every child forked without exec (a
 * handler installed by gw__fork_generation, which init calls); read on
 * every call, so a plain relaxed load there. */
unsigned gw__fork_generation(void);
extern _Atomic unsigned gw__fork_gen;
gw_result_t gw__alive_open_peers(struct gw_comm *c, struct gw_errctx *err);
void gw__alive_unlink_own(struct gw_comm *c);
/* Tests only (NULL otherwise): called inside gw_comm_abort between its look
 * at the gate and its flag's store, to hold an abort there. */
extern void (*_Atomic gw__abort_gap_hook)(void);
/* cpus.c: the CPUs this process may use, cpus its affinity mask (all 0: the
 * machine's), a cgroup's quota counted. */
int gw__usable_cpus(const uint64_t cpus[16]);
bool gw__alive_lock_gone(const struct gw_comm *c, int peer); /* true: that rank's process is gone */
void gw__alive_free(struct gw_comm *c);

#endif
