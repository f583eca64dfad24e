/* test_device_settings.c - the device suite's "settings" case (its other
 * cases: test_device.c). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h" /* comm->devring, comm->dev_stage_bytes */
#include "dev.h"
#include "harness.h"
#include "test_device.h"

/* ---- settings that differ between ranks ------------------------------------------------------------
 * Rank 1 sets its own GW_DEV_RING_MIN_BYTES, GW_DEV_STAGE_BYTES or
 * GW_DEV_CHUNK_BYTES, rank 0 keeps the suite's.  Rank 0's minimum and staging
 * size are every rank's (the ring stays); a chunk mismatch leaves the ring
 * out.  SET_ASYNC: rank 1 asks for the other GW_DEV_ASYNC than rank 0: the
 * ring stays, synchronized per chunk on both (a stream waiting on a counter
 * its neighbour never writes would hang).  Either way device-buffer
 * allreduces under and over the minimum, across many staging pieces of either
 * size, give exact sums. */
enum { SET_MIN, SET_STAGE, SET_CHUNK, SET_ASYNC, SET_MODES };

static int body_settings(int rank, int n, const char *master, void *arg) {
  const int mode = *(const int *)arg;
  if (rank == 1 && mode == SET_MIN) setenv("GW_DEV_RING_MIN_BYTES", "0", 1);
  if (rank == 1 && mode == SET_STAGE) setenv("GW_DEV_STAGE_BYTES", "8192", 1);
  if (rank == 1 && mode == SET_CHUNK) setenv("GW_DEV_CHUNK_BYTES", "131072", 1);
  const char *async_env = getenv("GW_DEV_ASYNC");
  const int async_asked = async_env && strcmp(async_env, "0") != 0;
  if (rank == 1 && mode == SET_ASYNC) setenv("GW_DEV_ASYNC", async_asked ? "0" : "1", 1);
  /* With equal settings every run of this suite has a ring unless IPC is off
   * (the -staged runs); the GPU suite's one GPU maps its own memory. */
  const char *ipc = getenv("GW_DEV_IPC");
  dv = gw__dev();
  const int want_ring = mode != SET_CHUNK && !(ipc && !strcmp(ipc, "0")) &&
                        (!one_queue() || (async_asked && mode != SET_ASYNC));
  gw_comm_t comm;
  GWCHECK(gw_comm_init(&comm, n, rank, master), NULL);
  const int ring = comm->devring != NULL;
  EXPECT(ring == want_ring, "mode %d: device ring %d, expected %d", mode, ring, want_ring);
  if (ring)
    EXPECT(gw__dev_ring_async(comm) == (async_asked && mode != SET_ASYNC), "mode %d: stream-ordered %d with "
           "GW_DEV_ASYNC=%s on rank 0", mode, (int)gw__dev_ring_async(comm), async_env ? async_env : "(unset)");
  uint64_t stages[2] = {0, 0};
  GWCHECK(gw_allgather(&comm->dev_stage_bytes, stages, 1, GW_INT64, comm, NULL), comm);
  const char *own = getenv("GW_DEV_STAGE_BYTES"); /* rank 0's, the suite's */
  const unsigned long long want_stage = own ? strtoull(own, NULL, 10) : 4u << 20;
  EXPECT(stages[0] == stages[1] && (rank != 0 || stages[0] == want_stage),
         "staging sizes %llu and %llu, rank 0's setting is %llu", (unsigned long long)stages[0],
         (unsigned long long)stages[1], want_stage);
  static const size_t counts[] = {1000, 70001, 1 << 18}; /* 4 KB, 280 KB, 1 MiB of int32 */
  const size_t maxc = 1 << 18;
  int32_t *d, *h = malloc(maxc * sizeof *h);
  gw_dev_stream_t st;
  DCHECK(dv->stream_create(&st));
  DCHECK(dv->alloc((void **)&d, maxc * sizeof *d));
  for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
    for (size_t i = 0; i < counts[c]; i++) h[i] = (int32_t)(i * 3 + (size_t)rank * 1000);
    DCHECK(dv->memcpy_async(d, h, counts[c] * sizeof *d, st));
    GWCHECK(gw_allreduce(d, d, counts[c], GW_INT32, GW_SUM, comm, st), comm);
    DCHECK(dv->memcpy_async(h, d, counts[c] * sizeof *d, st));
    DCHECK(dv->stream_sync(st));
    gw_result_t async;
    EXPECT(gw_comm_get_async_error(comm, &async) == GW_SUCCESS && async == GW_SUCCESS,
           "mode %d, count %zu: async error: %s", mode, counts[c], gw_comm_last_error(comm));
    for (size_t i = 0; i < counts[c]; i++)
      EXPECT(h[i] == (int32_t)(i * 6 + 1000), "mode %d, count %zu: element %zu is %d, expected %d", mode,
             counts[c], i, h[i], (int32_t)(i * 6 + 1000));
  }
  DCHECK(dv->free(d));
  DCHECK(dv->stream_destroy(st));
  free(h);
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(settings) {
  for (int mode = SET_MIN; mode < SET_MODES; mode++)
    ck_assert_msg(run_ranks_raw(2, body_settings, &mode, 120) == 0, "settings mode %d", mode);
}
END_TEST

void device_add_settings_case(Suite *s) { device_add_case(s, "settings", settings); }
