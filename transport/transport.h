/* transport.h - the one interface between comm/ and the transports.  A transport
 * moves chunks over one directed edge between two ranks (a "connection"): a FIFO
 * of slots in memory the receiver owns, with head/tail counters.  It knows nothing
 * about collectives; comm/ decides what goes into a chunk.
 *
 * Lifecycle: the receiver calls recv_setup (allocates the FIFO, fills a fixed-size
 * opaque handle), the handle travels through the bootstrap, the sender calls
 * send_connect with it, then the receiver calls recv_connect (both attached).
 * Data path calls never block: they return GW_INPROGRESS for "not yet, call again"
 * and the caller applies the waiting policy and the deadline. */
#ifndef GW_TRANSPORT_H
#define GW_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <sys/socket.h>

#include "core.h"
#include "gw_config.h"

/* What every chunk carries besides its payload: which operation it belongs to, so
 * a receiver can tell a peer that called something else (DESIGN.md: sequence
 * number plus operation fingerprint; here the full descriptor, so the error can
 * name both calls). */
struct gw_opdesc {
  uint64_t seq;   /* the communicator's operation number, from 1 */
  uint64_t count; /* the count argument of the call */
  int32_t root;   /* broadcast root, else -1 or a bucketer's bucket (gw__desc_bucket_tag) */
  uint8_t coll;   /* enum gw_coll */
  uint8_t dtype;
  uint8_t op;
  uint8_t pad;
};

struct gw_chunk_hdr {
  struct gw_opdesc op;
  uint32_t bytes; /* payload bytes in this chunk */
  uint32_t step;  /* running chunk number within the operation (diagnostics) */
};
_Static_assert(sizeof(struct gw_chunk_hdr) == 32, "chunk header is 32 bytes");

/* A rank whose wait ran past its deadline tells the ranks it sends to whom it
 * waits on (comm/prims.c): the payload of a chunk whose header says
 * GW_COLL_STATUS.  It carries no data and no step of the operation; a
 * receiver keeps the last one on the connection and releases it. */
struct gw_wait_status {
  int32_t waits_on;    /* the rank the sender waits on for data; -1: the wait it told of is over */
  int32_t end;         /* the last rank of the line of waits the sender knows: waits_on, or one
                          further on that the statuses from waits_on told of */
  uint16_t hops;       /* ranks from the sender to end (1: end is waits_on) */
  uint8_t end_started; /* the rank that waits on `end` had data of the operation from it */
  uint8_t pad;
};
_Static_assert(sizeof(struct gw_wait_status) == 12, "wait status is 12 bytes");

/* What ranks publish about themselves at the rendezvous. */
struct gw_peer_info {
  int32_t rank;
  int32_t pid;
  char node_id[192]; /* host name + boot id: equal strings share a machine */
  char host[64];     /* for messages */
  uint32_t caps;     /* GW_CAP_*: what this rank can connect with besides shm and tcp */
  /* Containers on one machine (one host name and boot id) may not share
   * /dev/shm or see each other's processes: shm only between ranks with the
   * same /dev/shm (its device and inode), and a peer's pid means something
   * only in the same pid namespace (its inode); 0 where unknown. */
  uint64_t shm_id, pidns;
  /* The file in /dev/shm this rank holds a lock on while it runs (comm/alive.c),
   * its device and inode; empty where it could not make one. */
  char alive_name[64];
  uint64_t alive_dev, alive_ino;
  /* The CPUs this rank may run on (its affinity, the first 1024): whether
   * ranks on one machine share cores (comm.c, the waiting policy). */
  uint64_t cpus[16];
  /* How many CPUs it may use: cpus' count, or the machine's when unknown,
   * capped by its cgroup's quota (comm.c: whether the job is oversubscribed
   * anywhere, which every rank works out alike from the table). */
  int32_t ncpus;
  /* Its effective user: shm segments and liveness files are 0600, so shm
   * only between ranks of one user (containers sharing /dev/shm may run as
   * different users: init failed opening the peer's segment instead of
   * taking tcp). */
  uint32_t uid;
};
#define GW_CAP_IB 1u /* an active InfiniBand/RoCE port (or the verbs emulator) */
#define GW_CAP_DEVICE 2u /* bound to a device that can map its peers' memory (comm/device.c) */
#define GW_CAP_DEVLAYER 4u /* has a device layer: device buffers can at least be staged (comm/device.c) */

#define GW_CONN_HANDLE_BYTES 128
struct gw_conn_handle {
  uint8_t bytes[GW_CONN_HANDLE_BYTES];
};

struct gw_conn_params {
  uint32_t nslots;     /* FIFO depth */
  uint32_t slot_bytes; /* payload bytes per slot, a multiple of 64 */
  uint64_t job_hash;   /* makes names unique per job; proves a tcp peer is of this job */
  double timeout_s;    /* connection setup deadline */
  uint32_t nstreams;   /* tcp: sockets per connection (GW_SOCKET_NSTREAMS) */
  struct sockaddr_storage local_addr; /* tcp: the address to listen on (port ignored) */
  socklen_t local_addr_len;
};

struct gw_transport;
/* Queue pairs one ib connection may stripe over (GW_IB_QPS_PER_CONN, 1..this;
 * init refuses others). */
#define GW_IB_MAX_QPS 8

struct gw_conn {
  const struct gw_transport *tp;
  int self, peer;   /* ranks */
  bool is_send;     /* which end this is */
  char peer_host[64]; /* for messages */
  void *priv;       /* the transport's state */
  char desc[96];    /* "rank 0 -> rank 1 via shm", for messages */
  uint64_t seen_seq; /* receiving end: 1 + the operation (seq) of the last chunk
                        that arrived, 0 before any (comm/prims.c: a peer that started
                        an operation is not the straggler a timeout should name) */
  /* Receiving end: the last wait status the sender told (comm/prims.c), in
   * operation status_seq - 1 (0: none yet). */
  uint64_t status_seq;
  struct gw_wait_status status;
  /* Sending end: sent_n chunks were posted in operation sent_seq (comm/prims.c
   * counts them); depth is set by the transport at send_connect: the chunks
   * its FIFO holds, where room only frees when the receiver releases a chunk,
   * so a full FIFO after more than depth posts of one operation proves the
   * peer took some of them (a slot wait then takes the grace); 0 where room
   * can free without that (tcp: the kernels' buffers take the bytes). */
  uint64_t sent_seq;
  uint32_t sent_n, depth;
  /* Receiving end, set by comm/prims.c around a recv_peek that only looks for
   * an abort notice on a connection that may owe nothing more in this
   * operation: a transport then says GW_INPROGRESS where it would fail because
   * the sender closed (tcp, ib), since a peer may leave once it sent its part. */
  bool look;
  /* Hints from the collective for its next data-path call (comm/prims.c sets
   * them; a transport without a low-latency format ignores both):
   * proto: the format the next send_slot should prepare (sending end), or the
   * next chunk most likely has (receiving end; its header says for sure).
   * expect: receiving end, the payload bytes the next chunk should have, so a
   * receiver can watch the lines of a low-latency chunk before its header lands. */
  uint8_t proto;   /* enum gw_proto */
  uint32_t expect;
  /* Set by the layer above: close leaves shared memory mapped (comm/device.c:
   * a page registered with CUDA that could not be unregistered safely). */
  bool keep_mapped;
};

/* The chunk formats.  SIMPLE: payload in the slot, published by the header's
 * flag (stored last).  LL (low latency): every 64-byte line of the payload
 * carries its own flag, so the receiver reads the data as each line lands,
 * with no separate flag round trip; at most the transport's ll_chunk_bytes. */
enum gw_proto { GW_PROTO_SIMPLE = 0, GW_PROTO_LL = 1 };

struct gw_transport {
  const char *name;
  /* Largest payload of a low-latency (LL) chunk; 0: no LL format (tcp: a
   * socket delivers a frame whole, so flags in the data would buy nothing). */
  uint32_t ll_chunk_bytes;
  /* Whether this transport can connect the two ranks (shm: same machine). */
  bool (*can_connect)(const struct gw_peer_info *self, const struct gw_peer_info *peer);
  gw_result_t (*recv_setup)(struct gw_conn *c, const struct gw_conn_params *p,
                            struct gw_conn_handle *out, struct gw_errctx *err);
  gw_result_t (*send_connect)(struct gw_conn *c, const struct gw_conn_params *p,
                              const struct gw_conn_handle *in, struct gw_errctx *err);
  gw_result_t (*recv_connect)(struct gw_conn *c, struct gw_errctx *err);

  /* Sender: room for the next chunk of `bytes` bytes (*buf, *cap >= bytes), or
   * GW_INPROGRESS when the FIFO is full.  Calling it again before send_post with
   * the same size returns the same room.  Small chunks may travel inline with
   * their header (one cache line on shm). */
  gw_result_t (*send_slot)(struct gw_conn *c, size_t bytes, void **buf, size_t *cap);
  /* Sender: publishes the slot returned by send_slot with this header. */
  gw_result_t (*send_post)(struct gw_conn *c, const struct gw_chunk_hdr *h);
  /* Sender, optional (NULL: never): whether a chunk of `bytes` can be sent
   * straight from the caller's memory at src (registered with
   * gw_comm_register), instead of being copied into the slot. */
  bool (*direct_ok)(struct gw_conn *c, const void *src, size_t bytes);
  /* Sender: after send_slot gave room and direct_ok said yes, sends the chunk
   * with header h and its payload from src.  src must stay unchanged until
   * progress() returns GW_SUCCESS (the operation's flush waits for that). */
  gw_result_t (*send_direct)(struct gw_conn *c, const struct gw_chunk_hdr *h, const void *src);
  /* Receiver: the oldest unconsumed chunk, or GW_INPROGRESS. */
  gw_result_t (*recv_peek)(struct gw_conn *c, const struct gw_chunk_hdr **h, const void **data);
  /* Receiver: gives the chunk from recv_peek back to the sender. */
  gw_result_t (*recv_release)(struct gw_conn *c);
  /* Moves bytes that are queued in user space (NULL when the transport has none,
   * as shm).  Returns GW_SUCCESS when nothing is left to send, GW_INPROGRESS when
   * sends are still queued, or an error naming the peer.  The collectives call it
   * for every connection while they wait, and until it returns GW_SUCCESS on the
   * send side before an operation completes. */
  gw_result_t (*progress)(struct gw_conn *c, struct gw_errctx *err);
  /* Fills up to max pollfds that become ready when this connection can make
   * progress (data to read, room to write queued bytes); returns how many.  NULL
   * for transports that poll memory.  Lets a waiting rank sleep in the kernel
   * instead of spinning on system calls. */
  int (*pollfds)(struct gw_conn *c, struct pollfd *out, int max);
  /* Optional (NULL: none): the FIFO position of the chunk this end handles
   * next (sender: after send_slot, the one send_post publishes; receiver: the
   * one recv_peek shows).  Both ends count alike, so position modulo the FIFO
   * depth names the same slot on both: comm/device.c keeps a device-memory
   * twin of every slot and moves the payload there, while the chunk's header
   * (sequence number, checks, abort notices) still travels here. */
  uint64_t (*position)(const struct gw_conn *c);
  /* Optional (NULL: none): a word in memory both ends of the connection map,
   * zero at setup, for a handshake beside the FIFO (comm/device.c: the sender
   * says it unmapped the receiver's device twins before the receiver frees
   * them).  Valid until close. */
  _Atomic uint64_t *(*shared_word)(struct gw_conn *c);
  /* Optional (NULL: none): two more words both ends map, zero at setup, in
   * the first page of the mapping (comm/device.c registers that page with the
   * device layer, so both ends' streams write and wait on them): which 0, the
   * count of chunks whose payload the sender's stream has written ("ready"),
   * and 1, the count the receiver's stream has finished reading ("free"), as
   * positions + 1.  Valid until close. */
  uint64_t *(*dev_flag)(struct gw_conn *c, int which);
  /* Optional (NULL: the peer waits for its notice or its deadline): the
   * receiver's rank failed and takes nothing more from this connection; why
   * reaches the sender beside the FIFO (a sender waiting for room never sees
   * the abort notice queued behind data on the reverse connection).  Best
   * effort, once. */
  void (*recv_abandon)(struct gw_conn *c, const char *why);
  /* Optional, the sender's half: whether the receiver abandoned the
   * connection, and its reason into why[len]. */
  bool (*send_abandoned)(struct gw_conn *c, char *why, size_t len);

  /* Optional (NULL: none): for a rank whose wait drags on (comm/prims.c),
   * publishes `mine`, the operation this end runs (`waited` seconds so far;
   * awaited: the rank waits to receive on this connection and has sent
   * nothing in the operation), where the other end can read it, and reads
   * what the other end published into *theirs (true when it published one,
   * read whole).  shm: both ends, at once; tcp: an awaited receiving end
   * publishes once it waited 1 s, back on stream 0, and the sender reads;
   * ib: the same, on the connection's liveness socket.  Two ranks waiting in the same operation
   * number with other calls are a mismatch that no chunk shows when neither
   * sends first (one rank's tree allreduce, the others' broadcast). */
  bool (*waiting)(struct gw_conn *c, const struct gw_opdesc *mine, double waited, bool awaited,
                  struct gw_opdesc *theirs);

  /* Optional (NULL: cannot tell): whether the network has stopped delivering
   * between this end and the peer's machine, for a wait that timed out: the
   * connection's bytes sent and unacknowledged for seconds (a stopped or busy
   * peer's kernel still acknowledges).  why[len]: what it saw.  tcp: the
   * streams' sockets; ib: its liveness socket. */
  bool (*net_stalled)(const struct gw_conn *c, char *why, size_t len);

  /* Frees everything; accepts a connection that was never set up. */
  void (*close)(struct gw_conn *c);
};

extern const struct gw_transport gw__shm_transport;
/* Removes this user's /dev/shm leftovers of dead ranks (shm.c), once per
 * process; how many it removed (to the first call, 0 after). */
int gw__shm_sweep(void);
extern const struct gw_transport gw__tcp_transport;
#if GW_HAVE_IBVERBS
extern const struct gw_transport gw__ib_transport;
/* Whether this process has an ib port to use (opens the devices once). */
bool gw__ib_available(void);
/* Whether a port is left that did not fail for good (IBV_EVENT_DEVICE_FATAL):
 * what a new communicator offers its peers. */
bool gw__ib_usable(void);
/* The registration cache (gw_comm_register): registers [buf, buf + bytes) with
 * every open port, or takes a reference on a registration that covers it;
 * *handle is NULL when there is no ib port.  Deregister drops the reference. */
gw_result_t gw__ib_register(void *buf, size_t bytes, void **handle, struct gw_errctx *err);
void gw__ib_deregister(void *handle);
/* Tests: 0 = ibv_reg_mr calls by the cache, 1 = chunks sent from user memory,
 * 2 = ibv_dereg_mr calls by the cache. */
unsigned long gw__ib_stat(int which);
#endif

/* GW_TRANSPORT as a number the ranks compare at init (0 unset, -1 not a
 * transport's name), and the name back. */
int32_t gw__transport_wanted(void);
const char *gw__transport_wanted_name(int32_t w);

/* This rank's GW_CAP_* flags, for its gw_peer_info. */
uint32_t gw__transport_caps(void);

/* How a chunk of `bytes` is split over several streams or queue pairs: parts of
 * at least min_part bytes (64-byte aligned), at most nstreams of them. */
static inline uint32_t gw__nparts(uint32_t bytes, uint32_t nstreams, uint32_t min_part) {
  uint32_t n = bytes == 0 ? 1 : (uint32_t)GW_DIV_UP(bytes, min_part);
  return n < nstreams ? n : nstreams;
}
static inline void gw__part_of(uint32_t bytes, uint32_t nparts, uint32_t k, uint32_t *off, uint32_t *len) {
  uint32_t size = (uint32_t)GW_ALIGN_UP(GW_DIV_UP(bytes, nparts), 64);
  uint64_t o = (uint64_t)k * size;
  *off = o >= bytes ? bytes : (uint32_t)o;
  *len = GW_MIN(size, bytes - *off);
}

/* The transport for a pair of ranks, or NULL when none can connect them. */
const struct gw_transport *gw__transport_select(const struct gw_peer_info *self,
                                                const struct gw_peer_info *peer);

static inline void gw__conn_close(struct gw_conn *c) {
  if (c && c->tp) c->tp->close(c);
  if (c) c->tp = NULL;
}

#endif
