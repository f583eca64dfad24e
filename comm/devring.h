/* devring.h - the device ring (devring.c) as device.c drives it: its state,
 * and what the two files share.  Not installed. */
#ifndef GW_DEVRING_H
#define GW_DEVRING_H

#include <stdatomic.h>
#include <stdbool.h>

#include "comm.h"
#include "dev.h"

/* The device ring of a communicator (set up at init, used by the progress thread). */
struct gw_devring {
  const struct gw_dev_ops *ops;
  gw_dev_stream_t stream; /* synchronized: the engine's (devstate's), set before each operation */
  char *recv_twin;        /* own device memory: twins of the slots ring 0's prev writes */
  char *send_twin;        /* the next rank's recv_twin, mapped by IPC */
  size_t chunk;
  uint32_t nslots;
  bool copy_engine;       /* GW_DEV_COPY_ENGINE */
  uint64_t min_bytes;     /* GW_DEV_RING_MIN_BYTES: smaller operations are staged */
  /* Stream-ordered (GW_DEV_ASYNC): the counters of ring 0's connections
   * (transport dev_flag), in pages registered with the device.  They count
   * device chunks (the twins' own sequence, apart from the host FIFO's
   * positions): "ready" the chunks a sender's stream wrote into the
   * receiver's twins, "read" the chunks the receiver's stream has read. */
  bool async;
  uint64_t *ready_in, *read_in;   /* receiving: this stream waits on ready_in, writes read_in */
  uint64_t *ready_out, *read_out; /* sending: writes ready_out, waits on read_out */
  void *reg[2];                   /* the registered pages (NULL: none) */
  size_t reg_bytes;
  /* The caller's side (gw__ring_emit, under the ticket order): the device
   * chunks received and sent by the operations emitted so far. */
  uint64_t dseq_in, dseq_out;
  /* Synchronized: a flag of the devstate's the engine stream writes after
   * each chunk's work (and its count), polled with a deadline instead of
   * synchronizing the stream without one (gw__dev_engine_wait). */
  uint64_t *chunk_flag;
  uint64_t chunk_seq;
};

/* Until the engine stream s got through what was enqueued on it (it writes
 * *flag = ++*seq behind that, polled here): GW_ERR_TIMEOUT after the
 * communicator's timeout (a hardware queue held by a stream that waits for
 * this very operation), GW_ERR_ABORTED on an abort.  Where it gives up, the
 * communicator's device state is abandoned (that work may run later). */
gw_result_t gw__dev_engine_wait(struct gw_comm *comm, gw_dev_stream_t s, uint64_t *flag, uint64_t *seq,
                                struct gw_errctx *err);

/* Some destroy in this process gave up an operation whose stream never got
 * to it (device.c): that stream may wait forever, and freeing or unmapping
 * device memory waits for every stream of the device (CUDA synchronizes
 * there), so from then on no communicator frees, unmaps or unregisters
 * device memory (leaked, with a warning). */
extern _Atomic bool gw__dev_given_up;

/* "rank R: WHAT failed: <the device layer's message>". */
gw_result_t gw__dev_fail(struct gw_errctx *err, const struct gw_comm *comm, const char *what);
/* This rank's own GW_DEV_STAGE_BYTES (rank 0's is agreed at init), 4 KiB
 * to GW_DEV_STAGE_MAX: each of the two staging buffers is pinned host
 * memory of that size, made at a communicator's first staged call (8G ran
 * the machine out of memory there, with no word of the setting). */
#define GW_DEV_STAGE_MAX ((int64_t)1 << 30)
size_t gw__dev_stage_bytes_own(void);
/* The device ring's chunk for GW_DEV_CHUNK_BYTES=asked: 4 KiB .. 1 GiB (a
 * chunk's byte count travels in 32 bits; the twin holds nslots of them), the
 * nearest outside that (init says so), rounded up to 256 bytes. */
size_t gw__devring_chunk(int64_t asked);
/* After a stream-ordered ring operation's headers ran on the host (res):
 * waits until the caller's stream says it finished the operation's device
 * work, releasing it where a neighbour's never comes, then the barrier that
 * makes the result good everywhere or nowhere. */
struct gw_ring_end {
  const uint64_t *finished; /* the caller's stream's flag, done at want */
  uint64_t want;
  const _Atomic uint64_t *unqueued; /* the ticket the caller could not put on its stream whole */
  const char *unqueued_why;         /* why (valid once *unqueued is the ticket) */
  uint64_t ticket;
  gw_dev_stream_t query; /* a stream of ours, asked for device faults (NULL: none) */
};
gw_result_t gw__dev_ring_end(struct gw_comm *comm, const struct gw_op *op, gw_result_t res,
                             const struct gw_ring_end *e, struct gw_errctx *err);

/* Sets the counters this rank's stream waits on past anything it waits for
 * (an operation that failed before its stream got to it). */
void gw__dev_ring_release(struct gw_comm *comm);

#endif
