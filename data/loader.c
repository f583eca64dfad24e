/* loader.c - the prefetching loader of loader.h.
 *
 * The stream is a sequence of batches numbered 0, 1, ... from the last seek.
 * Batch seq lives in slot seq % nslots.  Workers claim batch numbers in order
 * under the mutex (so the claim cursor, not thread timing, decides which samples a
 * batch holds), decode outside it, and mark the slot ready; the consumer takes
 * slot head % nslots when it is ready and frees it on its next call.  A slot is
 * reused only after the consumer freed it, so ready slots can never be mistaken
 * for a later batch.
 *
 * Shards (a rank's indices for one epoch) are computed once per epoch into a small
 * cache with reference counts: with a short epoch and a deep queue, workers can be
 * decoding batches of two or more epochs at once.  The worker that computes one
 * does it outside the mutex (a shuffle of every index of the data set), so the
 * consumer can take a batch that is ready meanwhile; workers that want the same
 * epoch wait for it. */
#include "loader.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_internal.h"

#define MAX_THREADS 256

enum slot_state { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY };

struct slot {
  enum slot_state state;
  int64_t seq;
  struct gw_batch b;
  float *x;      /* [batch, c, h, w], 64-byte aligned, touched once at init */
  int32_t *y;    /* [batch] */
  uint8_t *stand_in; /* [batch]: 1 where a later sample replaced a skipped one */
  gw_result_t err;
  char msg[GW_MODEL_ERRMSG_MAX]; /* err's message, or the last skip's reason when err is GW_SUCCESS */
};

struct shard_entry {
  int64_t epoch; /* -1: holds nothing */
  int refs;
  int computing; /* a worker is writing idx outside the mutex */
  int64_t *idx;  /* [num_samples] */
};

struct gw_loader {
  const struct gw_dataset *ds;
  struct gw_sampler sampler;
  struct gw_loader_config cfg;
  size_t sample_floats;
  int64_t ns; /* the rank's shard length */

  pthread_mutex_t mu;
  pthread_cond_t space; /* a slot was freed, the stream ended, or stop */
  pthread_cond_t ready; /* a slot is ready, or the stream ended */
  pthread_cond_t shard_done; /* a shard entry's computation ended */
  pthread_t *threads;
  int running;
  atomic_int stop;      /* read by workers between files, without the mutex */

  struct slot *slots;
  int nslots;
  struct shard_entry *shards;
  int nshards;

  /* The claim cursor (under mu): the next batch a worker takes. */
  int64_t start_epoch, claim_epoch, claim_pos, claim_seq;
  int64_t end_seq; /* the batch number where the stream ends; -1 while unknown */

  /* The consumer's side (its thread only; head also read under mu). */
  int64_t head;    /* the next batch to hand out */
  int held;        /* slot (head - 1) % nslots is with the consumer */
  int64_t epoch, position;
  gw_result_t failed;
  char failed_msg[GW_MODEL_ERRMSG_MAX];
  int64_t skipped;
  char last_skip[GW_MODEL_ERRMSG_MAX];
};

void gw_loader_config_default(struct gw_loader_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->batch = 1;
  cfg->threads = 1;
}

/* ---- the stream's geometry -------------------------------------------------- */

/* Moves a cursor with no batch left in its epoch to the next epoch's start. */
static void normalize(const struct gw_loader *l, int64_t *epoch, int64_t *pos) {
  int64_t left = l->ns - *pos;
  if (left <= 0 || (l->cfg.drop_last_batch && left < l->cfg.batch)) {
    (*epoch)++;
    *pos = 0;
  }
}

int64_t gw_loader_batches_per_epoch(const struct gw_loader *l) {
  return l->cfg.drop_last_batch ? l->ns / l->cfg.batch : (l->ns + l->cfg.batch - 1) / l->cfg.batch;
}

/* A sample's augmentation key: a function of (seed, epoch, index) only, so thread
 * count and resume cannot change it. */
static uint64_t sample_key(uint64_t seed, int64_t epoch, int64_t index) {
  return gw__mix64(gw__mix64(gw__mix64(seed ^ 0x6a09e667f3bcc908ull) ^ (uint64_t)epoch) ^ (uint64_t)index);
}

/* The key of the sample at shard position pos: sample_key, and for a padded
 * list's repeat (entry k >= n, copy k / n of order[k % n]) that key mixed with
 * the copy's number: a repeat on another rank got the very crop and flip of
 * the first (PyTorch's workers draw new ones). */
static uint64_t place_key(const struct gw_loader *l, int64_t epoch, int64_t pos, int64_t index) {
  const uint64_t key = sample_key(l->cfg.seed, epoch, index);
  const int64_t copy = (l->sampler.rank + pos * (int64_t)l->sampler.world) / l->sampler.n;
  return copy ? gw__mix64(key ^ (uint64_t)copy * 0x9e3779b97f4a7c15ull) : key;
}

static struct slot *slot_of(struct gw_loader *l, int64_t seq) { return &l->slots[seq % l->nslots]; }

/* ---- shard cache (under mu) --------------------------------------------------- */

/* The shard of epoch, computed if no entry holds it; NULL when out of memory.
 * There is always an unreferenced entry: nshards exceeds the worker count, and
 * a worker holds one reference at most.  The computation runs without the
 * mutex (the entry, referenced and marked computing, is neither reused nor
 * read meanwhile); a worker wanting an entry being computed waits for it, and
 * computes it itself if that failed. */
static const int64_t *shard_acquire(struct gw_loader *l, int64_t epoch) {
  for (;;) {
    struct shard_entry *victim = NULL, *hit = NULL;
    for (int i = 0; i < l->nshards && !hit; i++) {
      struct shard_entry *e = &l->shards[i];
      if (e->epoch == epoch) hit = e;
      else if (e->refs == 0 && (!victim || (e->idx && !victim->idx))) victim = e; /* reuse memory first */
    }
    if (hit) {
      hit->refs++;
      while (hit->computing) pthread_cond_wait(&l->shard_done, &l->mu);
      if (hit->epoch == epoch) return hit->idx;
      hit->refs--; /* its computation failed: try again */
      continue;
    }
    victim->epoch = -1;
    if (!victim->idx && !(victim->idx = malloc((size_t)l->ns * sizeof *victim->idx))) {
      gw__model_fail(GW_ERR_SYSTEM, "loader: out of memory for a shard of %lld indices", (long long)l->ns);
      return NULL;
    }
    victim->epoch = epoch;
    victim->refs = 1;
    victim->computing = 1;
    pthread_mutex_unlock(&l->mu);
    gw_result_t r = gw_sampler_shard(&l->sampler, epoch, victim->idx);
    pthread_mutex_lock(&l->mu);
    victim->computing = 0;
    pthread_cond_broadcast(&l->shard_done);
    if (r == GW_SUCCESS) return victim->idx;
    victim->epoch = -1;
    victim->refs--;
    return NULL;
  }
}

static void shard_release(struct gw_loader *l, const int64_t *idx) {
  for (int i = 0; i < l->nshards; i++)
    if (idx && l->shards[i].idx == idx) l->shards[i].refs--;
}

/* ---- workers ------------------------------------------------------------------ */

static void slot_fail(struct slot *s, gw_result_t err) {
  s->err = err;
  snprintf(s->msg, sizeof s->msg, "%s", gw_model_last_error());
}

/* The slot of a worker told to stop part way: its batch is incomplete.  Every
 * stop is followed by a reset of the stream, which drops it; were it ever
 * handed out, this error says so instead of passing on undecoded samples. */
static gw_result_t interrupted(struct slot *s) {
  s->err = GW_ERR_INTERNAL;
  snprintf(s->msg, sizeof s->msg, "loader: batch %lld was stopped part way and is incomplete (a bug: please report it)",
           (long long)s->seq);
  return s->err;
}

/* Decodes the sample at shard position pos into place i of the slot, moving on
 * through the shard (wrapping) past samples the dataset skips.  The stop flag
 * is looked at before each file: a shard of mostly unreadable files would
 * otherwise hold up a seek or free for up to a whole shard of opens. */
static gw_result_t fill_sample(struct gw_loader *l, struct slot *s, const int64_t *shard, int64_t pos, int i) {
  float *out = s->x + (size_t)i * l->sample_floats;
  for (int64_t k = 0; k < l->ns; k++) {
    if (atomic_load(&l->stop)) return interrupted(s);
    const int64_t at = (pos + k) % l->ns, index = shard[at];
    /* a stand-in's key is its place's too: the sample at `at` gets place_key
     * on its own turn, usually in the same batch, and the stand-in was its
     * exact copy, crop and flip alike */
    uint64_t key = place_key(l, s->b.epoch, at, index);
    if (k) key = gw__mix64(key ^ ((uint64_t)pos + 1) * 0xbf58476d1ce4e5b9ull);
    gw_result_t r = gw_dataset_get(l->ds, index, l->cfg.train, key, out, &s->y[i]);
    s->stand_in[i] = k > 0;
    /* One count per place whose own sample was skipped (loader.h), however
     * many files the search went past: the next place searches them again. */
    s->b.skipped += r == GW_SUCCESS && k > 0;
    if (r != GW_DATA_SKIPPED) return r;
    snprintf(s->msg, sizeof s->msg, "%s", gw_model_last_error());
    /* An evaluation scores a stand-in nowhere (it is in the epoch at its
     * own place): a blank one at once, no search (a share with nothing
     * readable took its size squared of failed reads), so that a rank whose
     * whole share is unreadable leaves those samples out as one rank
     * holding them all would (it failed the job, after an epoch's training,
     * at 2 ranks and not at 1). */
    if (l->cfg.blank_unreadable) {
      memset(out, 0, l->sample_floats * sizeof *out);
      s->y[i] = 0, s->stand_in[i] = 1, s->b.skipped++;
      return GW_SUCCESS;
    }
  }
  return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                        "loader: rank %d: none of the %lld samples of its shard is readable (%s)", l->sampler.rank,
                        (long long)l->ns, s->msg);
}

static void fill(struct gw_loader *l, struct slot *s, const int64_t *shard) {
  s->err = GW_SUCCESS;
  s->msg[0] = '\0';
  s->b.skipped = 0;
  for (int i = 0; i < s->b.n; i++) {
    gw_result_t r = fill_sample(l, s, shard, s->b.position + i, i);
    if (r != GW_SUCCESS) {
      if (s->err == GW_SUCCESS) slot_fail(s, r);
      return;
    }
  }
}

/* Takes the next batch number for slot s and advances the cursor (under mu);
 * returns 0, or -1 when the stream has ended there. */
static int claim(struct gw_loader *l, struct slot *s) {
  if (l->cfg.epochs > 0 && l->claim_epoch >= l->start_epoch + l->cfg.epochs) {
    l->end_seq = l->claim_seq;
    pthread_cond_broadcast(&l->ready);
    pthread_cond_broadcast(&l->space);
    return -1;
  }
  int64_t left = l->ns - l->claim_pos;
  s->seq = l->claim_seq++;
  s->state = SLOT_FILLING;
  s->b.epoch = l->claim_epoch;
  s->b.position = l->claim_pos;
  s->b.n = (int)(left < l->cfg.batch ? left : l->cfg.batch);
  l->claim_pos += s->b.n;
  normalize(l, &l->claim_epoch, &l->claim_pos);
  return 0;
}

static void *worker_main(void *arg) {
  struct gw_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!atomic_load(&l->stop) && l->end_seq < 0 && slot_of(l, l->claim_seq)->state != SLOT_FREE)
      pthread_cond_wait(&l->space, &l->mu);
    struct slot *s = slot_of(l, l->claim_seq);
    if (atomic_load(&l->stop) || l->end_seq >= 0 || claim(l, s) != 0) break;
    const int64_t *shard = shard_acquire(l, s->b.epoch);
    if (!shard) slot_fail(s, GW_ERR_SYSTEM);
    pthread_mutex_unlock(&l->mu);
    if (shard) fill(l, s, shard);
    pthread_mutex_lock(&l->mu);
    shard_release(l, shard);
    s->state = SLOT_READY;
    pthread_cond_broadcast(&l->ready);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* ---- lifecycle -------------------------------------------------------------- */

static void stop_workers(struct gw_loader *l) {
  if (!l->running) return;
  pthread_mutex_lock(&l->mu);
  atomic_store(&l->stop, 1);
  pthread_cond_broadcast(&l->space);
  pthread_mutex_unlock(&l->mu);
  for (int i = 0; i < l->running; i++) pthread_join(l->threads[i], NULL);
  l->running = 0;
  atomic_store(&l->stop, 0);
}

static void reset_stream(struct gw_loader *l, int64_t epoch, int64_t position);

/* Starts the workers.  When one cannot start, those started are stopped, and
 * the stream is put back where it was: they may have claimed batches and left
 * them part decoded, which a later call would otherwise hand out.  Test hook:
 * GW_LOADER_TEST_FAIL_THREAD=N fails the start of thread N as if out of
 * resources, once the threads started before it have claimed N batches. */
static gw_result_t start_workers(struct gw_loader *l) {
  const char *hook = getenv("GW_LOADER_TEST_FAIL_THREAD");
  const int fail_at = hook && *hook ? atoi(hook) : -1;
  for (int i = 0; i < l->cfg.threads; i++) {
    int rc;
    if (i == fail_at) {
      pthread_mutex_lock(&l->mu);
      while (l->claim_seq < i && l->end_seq < 0) {
        pthread_mutex_unlock(&l->mu);
        sched_yield();
        pthread_mutex_lock(&l->mu);
      }
      pthread_mutex_unlock(&l->mu);
      rc = EAGAIN;
    } else {
      rc = pthread_create(&l->threads[i], NULL, worker_main, l);
    }
    if (rc != 0) {
      stop_workers(l);
      reset_stream(l, l->epoch, l->position);
      return gw__model_fail(GW_ERR_SYSTEM, "loader: cannot start worker thread %d of %d: %s", i, l->cfg.threads,
                            strerror(rc));
    }
    l->running = i + 1;
  }
  return GW_SUCCESS;
}

/* Puts the stream at (epoch, position) with nothing decoded; workers are
 * stopped.  (epoch, position) is already normalized when it is the consumer's
 * state: a failed start of the workers calls this with it (no batch was taken
 * since the last reset, so that is where the stream starts). */
static void reset_stream(struct gw_loader *l, int64_t epoch, int64_t position) {
  normalize(l, &epoch, &position);
  l->start_epoch = l->claim_epoch = l->epoch = epoch;
  l->claim_pos = l->position = position;
  l->claim_seq = l->head = 0;
  l->end_seq = -1;
  l->held = 0;
  l->failed = GW_SUCCESS;
  for (int i = 0; i < l->nslots; i++) l->slots[i].state = SLOT_FREE;
}

static gw_result_t check_config(const struct gw_dataset *ds, const struct gw_sampler *s,
                                const struct gw_loader_config *c) {
  if (c->batch < 1 || c->threads < 1 || c->threads > MAX_THREADS || c->depth < 0 || c->epochs < 0)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "loader: batch %d, threads %d, depth %d, epochs %lld: need batch >= 1, 1 <= threads <= %d, "
                          "depth >= 0, epochs >= 0",
                          c->batch, c->threads, c->depth, (long long)c->epochs, MAX_THREADS);
  if (s->n != gw_dataset_size(ds))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "loader: the sampler covers %lld samples, %s has %lld",
                          (long long)s->n, gw_dataset_description(ds), (long long)gw_dataset_size(ds));
  if (c->drop_last_batch && s->num_samples < c->batch)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "loader: rank %d's %lld samples make no full batch of %d (drop_last_batch); "
                          "use a smaller batch",
                          s->rank, (long long)s->num_samples, c->batch);
  return GW_SUCCESS;
}

/* The slots' buffers, allocated once and written once so their pages are present
 * before the first batch is timed. */
static gw_result_t alloc_slots(struct gw_loader *l) {
  size_t xbytes = (size_t)l->cfg.batch * l->sample_floats * sizeof(float);
  xbytes = (xbytes + 63) / 64 * 64;
  /* Past half the machine's memory the pages written below got the rank
   * OOM-killed (the allocation itself succeeds under overcommit): said. */
  const double total = (double)l->nslots * (double)xbytes,
               phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  if (phys > 0 && total > phys / 2)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "loader: %d batches in flight (loader threads + 2) of %.1f MiB each (batch %d x %zu "
                          "floats) need %.1f GiB, over half this machine's %.1f GiB: use fewer loader threads, a "
                          "smaller batch or smaller images", l->nslots, (double)xbytes / 1048576.0, l->cfg.batch,
                          l->sample_floats, total / 1073741824.0, phys / 1073741824.0);
  for (int i = 0; i < l->nslots; i++) {
    struct slot *s = &l->slots[i];
    s->x = aligned_alloc(64, xbytes);
    s->y = calloc((size_t)l->cfg.batch, sizeof *s->y);
    s->stand_in = calloc((size_t)l->cfg.batch, 1);
    if (!s->x || !s->y || !s->stand_in)
      return gw__model_fail(GW_ERR_SYSTEM, "loader: out of memory for %d batches of %zu bytes", l->nslots, xbytes);
    memset(s->x, 0, xbytes);
    s->b.x = s->x;
    s->b.y = s->y;
    s->b.stand_in = s->stand_in;
  }
  return GW_SUCCESS;
}

static gw_result_t alloc_loader(struct gw_loader *l) {
  l->nslots = (l->cfg.depth ? l->cfg.depth : l->cfg.threads + 1) + 1; /* + the consumer's */
  l->nshards = l->cfg.threads + 1;
  l->slots = calloc((size_t)l->nslots, sizeof *l->slots);
  l->shards = calloc((size_t)l->nshards, sizeof *l->shards);
  l->threads = calloc((size_t)l->cfg.threads, sizeof *l->threads);
  if (!l->slots || !l->shards || !l->threads) return gw__model_fail(GW_ERR_SYSTEM, "loader: out of memory");
  for (int i = 0; i < l->nshards; i++) l->shards[i].epoch = -1;
  return alloc_slots(l);
}

gw_result_t gw_loader_init(struct gw_loader **lp, const struct gw_dataset *ds, const struct gw_sampler *s,
                           const struct gw_loader_config *cfg) {
  *lp = NULL;
  GW_MODEL_TRY(check_config(ds, s, cfg));
  struct gw_loader *l = calloc(1, sizeof *l);
  if (!l) return gw__model_fail(GW_ERR_SYSTEM, "loader: out of memory");
  l->ds = ds;
  l->sampler = *s;
  l->cfg = *cfg;
  l->sample_floats = gw_dataset_sample_floats(ds);
  l->ns = s->num_samples;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->space, NULL);
  pthread_cond_init(&l->ready, NULL);
  pthread_cond_init(&l->shard_done, NULL);
  atomic_init(&l->stop, 0);
  gw_result_t res = alloc_loader(l);
  if (res != GW_SUCCESS) {
    gw_loader_free(l);
    return res;
  }
  reset_stream(l, 0, 0);
  *lp = l;
  return GW_SUCCESS;
}

void gw_loader_free(struct gw_loader *l) {
  if (!l) return;
  stop_workers(l);
  for (int i = 0; l->slots && i < l->nslots; i++) {
    free(l->slots[i].x);
    free(l->slots[i].y);
    free(l->slots[i].stand_in);
  }
  for (int i = 0; l->shards && i < l->nshards; i++) free(l->shards[i].idx);
  free(l->slots);
  free(l->shards);
  free(l->threads);
  pthread_cond_destroy(&l->shard_done);
  pthread_cond_destroy(&l->ready);
  pthread_cond_destroy(&l->space);
  pthread_mutex_destroy(&l->mu);
  free(l);
}

/* ---- the consumer ---------------------------------------------------------------- */

/* Records a taken batch: the state to resume from and the skip count. */
static void take(struct gw_loader *l, const struct slot *s) {
  l->epoch = s->b.epoch;
  l->position = s->b.position + s->b.n;
  normalize(l, &l->epoch, &l->position);
  l->skipped += s->b.skipped;
  if (s->b.skipped) snprintf(l->last_skip, sizeof l->last_skip, "%s", s->msg);
}

/* Waits for batch head (under mu); NULL at the stream's end. */
static struct slot *wait_head(struct gw_loader *l) {
  while (l->end_seq != l->head && slot_of(l, l->head)->state != SLOT_READY) pthread_cond_wait(&l->ready, &l->mu);
  return l->end_seq == l->head ? NULL : slot_of(l, l->head);
}

gw_result_t gw_loader_next(struct gw_loader *l, const struct gw_batch **batch) {
  *batch = NULL;
  if (l->failed != GW_SUCCESS) return gw__model_fail(l->failed, "%s", l->failed_msg);
  if (!l->running) GW_MODEL_TRY(start_workers(l)); /* outside mu: a failed start joins */
  pthread_mutex_lock(&l->mu);
  if (l->held) {
    slot_of(l, l->head - 1)->state = SLOT_FREE;
    l->held = 0;
    pthread_cond_broadcast(&l->space);
  }
  struct slot *s = wait_head(l);
  if (s) {
    l->head++;
    l->held = 1;
  }
  pthread_mutex_unlock(&l->mu);
  if (!s) return GW_SUCCESS;
  if (s->err != GW_SUCCESS) {
    l->failed = s->err;
    snprintf(l->failed_msg, sizeof l->failed_msg, "%s", s->msg);
    return gw__model_fail(l->failed, "%s", l->failed_msg);
  }
  take(l, s);
  *batch = &s->b;
  return GW_SUCCESS;
}

gw_result_t gw_loader_seek(struct gw_loader *l, int64_t epoch, int64_t position) {
  if (epoch < 0 || position < 0 || position > l->ns)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "loader: cannot seek to epoch %lld position %lld (shard of %lld)",
                          (long long)epoch, (long long)position, (long long)l->ns);
  stop_workers(l);
  reset_stream(l, epoch, position);
  return GW_SUCCESS;
}

void gw_loader_state(const struct gw_loader *l, int64_t *epoch, int64_t *position) {
  *epoch = l->epoch;
  *position = l->position;
}

int64_t gw_loader_skipped(const struct gw_loader *l) { return l->skipped; }

const char *gw_loader_last_skip(const struct gw_loader *l) { return l->last_skip; }
