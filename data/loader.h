/* loader.h - the prefetching batch loader: worker threads decode whole batches of
 * a rank's shard (sampler.h) into a bounded queue of reused buffers, and the
 * trainer takes them strictly in sampler order.
 *
 * Every batch is a pure function of (dataset, sampler, seed, epoch, position):
 * augmentation keys come from (seed, epoch, sample index), so the bits are the
 * same for any number of threads and after gw_loader_seek() to a saved state.  A
 * sample the dataset skips (a bad file) is replaced by the next index of the
 * shard (wrapping), deterministically, and counted.
 *
 * The stream of batches runs on across epochs (epoch e's last batch, then epoch
 * e + 1's first) until cfg.epochs have been delivered, or forever with 0.
 * Not thread-safe itself: one consumer thread calls next / seek / state. */
#ifndef GW_DATA_LOADER_H
#define GW_DATA_LOADER_H

#include <stdint.h>

#include "dataset.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gw_loader_config {
  int batch;           /* samples per batch, >= 1 */
  int threads;         /* worker threads, >= 1 */
  int depth;           /* batches decoded ahead; 0: threads + 1 */
  int train;           /* passed to gw_dataset_get: augmentation on */
  int blank_unreadable; /* an unreadable sample's place gets zeros and label 0 at once (stand_in
                           1), not the next readable one: an evaluation's, which scores no
                           stand-in (0: the search) */
  int drop_last_batch; /* drop an epoch's final batch when it is short */
  int64_t epochs;      /* epochs the stream delivers from its start (seek); 0: endless */
  uint64_t seed;       /* augmentation seed */
};

struct gw_batch {
  const float *x;     /* [n, c, h, w] */
  const int32_t *y;   /* [n] */
  int n;              /* batch, or fewer for an epoch's short final batch */
  int skipped;        /* samples of this batch that replaced a skipped one */
  const uint8_t *stand_in; /* [n]: 1 where the sample stands in for a skipped one
                              (the next readable one of the shard, so it is in
                              the epoch twice; blank_unreadable: zeros, label
                              0): an evaluation scores none */
  int64_t epoch;
  int64_t position;   /* the first sample's place in the rank's shard */
};

struct gw_loader;

/* batch = 1, threads = 1, depth 0, train 0, drop_last_batch 0, epochs 0, seed 0. */
void gw_loader_config_default(struct gw_loader_config *cfg);

/* ds must outlive the loader; the sampler is copied.  No thread starts until the
 * first gw_loader_next, so a seek right after init wastes nothing. */
gw_result_t gw_loader_init(struct gw_loader **l, const struct gw_dataset *ds, const struct gw_sampler *s,
                           const struct gw_loader_config *cfg);
/* Stops the workers (each finishes at most the file it is decoding, also while
 * it searches past unreadable ones) and frees everything; accepts NULL. */
void gw_loader_free(struct gw_loader *l);

/* The next batch in order, valid until the next call of gw_loader_next,
 * gw_loader_seek or gw_loader_free.  *batch is NULL once cfg.epochs have been
 * delivered.  Blocks only while that batch is not decoded yet.  An error (a
 * dataset failure other than a skip, or, without blank_unreadable, no readable sample in the shard) repeats
 * on every later call until a seek.  Worker threads that cannot all start
 * (GW_ERR_SYSTEM) leave the stream where it was; a later call tries again. */
gw_result_t gw_loader_next(struct gw_loader *l, const struct gw_batch **batch);

/* Restarts the stream at (epoch, position in the rank's shard); what the workers
 * had decoded is dropped.  position may equal the shard's length (the next epoch). */
gw_result_t gw_loader_seek(struct gw_loader *l, int64_t epoch, int64_t position);

/* Where the stream continues after the batches taken so far: the state to
 * checkpoint and hand to gw_loader_seek on resume. */
void gw_loader_state(const struct gw_loader *l, int64_t *epoch, int64_t *position);

int64_t gw_loader_batches_per_epoch(const struct gw_loader *l);

/* Samples replaced in the batches taken since init, and the last reason. */
int64_t gw_loader_skipped(const struct gw_loader *l);
const char *gw_loader_last_skip(const struct gw_loader *l); /* "" if none */

#ifdef __cplusplus
}
#endif
#endif /* GW_DATA_LOADER_H */
