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
  gw_dev_stream_t stream; /* the engine's (devstate's), set before each operation */
  char *recv_twin;        /* own device memory: twins of the slots ring 0's prev writes */
  char *send_twin;        /* the next rank's recv_twin, mapped by IPC */
  size_t chunk;
  uint32_t nslots;
  int dtype, kop;
  bool copy_engine;       /* GW_DEV_COPY_ENGINE */
  uint64_t min_bytes;     /* GW_DEV_RING_MIN_BYTES: smaller operations are staged */
  /* Stream-ordered (GW_DEV_ASYNC): the counters of ring 0's connections
   * (transport dev_flag; positions + 1), in pages registered with the device. */
  bool async;
  uint64_t *ready_in, *read_in;   /* receiving: this stream waits on ready_in, writes read_in */
  uint64_t *ready_out, *read_out; /* sending: writes ready_out, waits on read_out */
  void *reg[2];                   /* the registered pages (NULL: none) */
  size_t reg_bytes;
  uint64_t *last_fill;            /* [nslots]: 1 + the position that last filled each of the successor's twins */
  uint64_t in_base, out_base;     /* the connections' positions when the operation started (its stream idle) */
};

/* Some destroy in this process gave up an operation whose stream never got
 * to it (device.c): that stream may wait forever, and freeing or unmapping
 * device memory waits for every stream of the device (CUDA synchronizes
 * there), so from then on no communicator frees, unmaps or unregisters
 * device memory (leaked, with a warning). */
extern _Atomic bool gw__dev_given_up;

/* "rank R: WHAT failed: <the device layer's message>". */
gw_result_t gw__dev_fail(struct gw_errctx *err, const struct gw_comm *comm, const char *what);
/* This rank's own GW_DEV_STAGE_BYTES (rank 0's is agreed at init). */
size_t gw__dev_stage_bytes_own(void);
/* After a stream-ordered ring operation ran on the host (res): waits for the
 * engine's stream, releasing it where a neighbour's never comes, then the
 * barrier that makes the result good everywhere or nowhere. */
gw_result_t gw__dev_ring_end(struct gw_comm *comm, const struct gw_op *op, gw_result_t res, struct gw_errctx *err);

#endif
