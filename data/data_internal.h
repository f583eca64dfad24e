/* data_internal.h - the inside of struct gw_dataset (a table of operations and the
 * common description each kind fills in), shared by the files of data/.  Not for
 * the trainer: it uses dataset.h. */
#ifndef GW_DATA_INTERNAL_H
#define GW_DATA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core.h" /* gw__fnv */
#include "dataset.h"
#include "model_internal.h" /* gw__model_fail: data reports through the model's channel */
#include "rng.h"

struct gw_dataset_ops {
  /* index is already range-checked. */
  gw_result_t (*get)(const struct gw_dataset *ds, int64_t index, int train, uint64_t key, float *out,
                     int32_t *label);
  /* Frees what the kind owns and the containing object (class names excluded). */
  void (*destroy)(struct gw_dataset *ds);
};

/* Each kind embeds this as its first member. */
struct gw_dataset {
  const struct gw_dataset_ops *ops;
  int64_t size;
  int c, h, w;
  int classes;
  char **class_names; /* [classes] or NULL, owned (freed by gw_dataset_free) */
  char description[640];
  /* A hash of what the samples are (the file list and labels; for generated
   * data, what generates it), so ranks can check they opened the same data. */
  uint64_t fingerprint;
  /* What the ranks compare (gw_dataset_content_hash): where the samples'
   * bytes are in memory anyway (Fashion-MNIST), their hash with the labels';
   * 0: the fingerprint.  Checkpoints keep the fingerprint, which saved ones name. */
  uint64_t content;
};

/* Uniform integer in [0, bound) without modulo bias (bound >= 1). */
static inline uint64_t gw__rng_below(struct gw_rng *r, uint64_t bound) {
  uint64_t threshold = (0 - bound) % bound; /* 2^64 mod bound: the biased low values */
  uint64_t x;
  do x = gw__rng_next(r);
  while (x < threshold);
  return x % bound;
}

/* A stream whose whole state is key (the loader derives keys per sample). */
static inline void gw__rng_from_key(struct gw_rng *r, uint64_t key) {
  r->state = key;
  r->has_spare = 0;
  r->spare = 0;
}

/* Copies n names into ds->class_names; GW_ERR_SYSTEM when out of memory. */
/* imagenet: the evaluation's resize of the shorter side before the center
 * crop (0: image size * 256 / 224), at least the image size. */
gw_result_t gw__folder_set_val_resize(struct gw_dataset *ds, int resize);
gw_result_t gw__dataset_set_classes(struct gw_dataset *ds, const char *const *names, int n);

/* path opened for reading without waiting on what is not a regular file (a
 * FIFO without a writer hung open()): O_NONBLOCK, left set for the caller to
 * check fstat's S_ISREG.  A regular file another process holds a write lease
 * on (Samba's oplocks, an NFS server's delegation: EWOULDBLOCK) is opened
 * again waiting, as any reader waits, until the holder gives way (the kernel
 * breaks the lease after lease-break-time at most).  The fd, or -1 with
 * errno. */
int gw__data_open_nowait(const char *path);

#endif
