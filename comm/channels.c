/* channels.c - runs one operation on several rings at once (GW_NCHANNELS): the
 * caller's thread drives channel 0 and one thread per further channel drives its
 * own ring, each on its slice of the data, so several sockets (tcp) or cores
 * (reductions in host memory) work on one operation.  With one channel (the
 * default) no thread exists and the operation runs on the caller's thread.  Not
 * here: the algorithms (ring.c) or how data is sliced (gw__ring_run_channel). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

struct gw_channels {
  struct gw_comm *comm;
  pthread_t threads[GW_MAX_CHANNELS];
  int nthreads;
  _Atomic uint64_t gen;  /* bumped once per operation */
  _Atomic int done;      /* channel threads finished with the current operation */
  _Atomic bool stop;
  pthread_mutex_t mu; /* with cv: idle channel threads sleep, no spinning */
  pthread_cond_t cv;
  /* Under mu, with gen: a thread takes all three in one snapshot (read apart,
   * a thread that saw one generation and the next operation's op and nuse
   * would run that operation twice). */
  const struct gw_op *op;
  int nuse; /* channels the current operation uses */
  gw_result_t res[GW_MAX_CHANNELS];
  struct gw_errctx err[GW_MAX_CHANNELS];
};

struct worker_arg {
  struct gw_channels *chans;
  int ch;
};

static void *channel_main(void *argp) {
  struct worker_arg arg = *(struct worker_arg *)argp;
  free(argp);
  struct gw_channels *chans = arg.chans;
  gw__log_set_rank(chans->comm->rank);
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&chans->mu);
    while (atomic_load_explicit(&chans->gen, memory_order_acquire) == seen && !atomic_load(&chans->stop))
      pthread_cond_wait(&chans->cv, &chans->mu);
    seen = atomic_load_explicit(&chans->gen, memory_order_acquire);
    const struct gw_op *op = chans->op;
    const int nuse = chans->nuse;
    pthread_mutex_unlock(&chans->mu);
    if (atomic_load(&chans->stop)) break;
    if (arg.ch >= nuse) continue; /* a smaller operation: not this channel's */
    chans->err[arg.ch].msg[0] = 0;
    chans->res[arg.ch] = gw__ring_run_channel(chans->comm, arg.ch, nuse, op, &chans->err[arg.ch]);
    atomic_fetch_add_explicit(&chans->done, 1, memory_order_release);
  }
  return NULL;
}

gw_result_t gw__channels_start(struct gw_comm *comm, struct gw_errctx *err) {
  if (comm->nchannels <= 1) return GW_SUCCESS;
  struct gw_channels *chans = calloc(1, sizeof *chans);
  if (!chans) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", comm->rank);
  chans->comm = comm;
  pthread_mutex_init(&chans->mu, NULL);
  pthread_cond_init(&chans->cv, NULL);
  comm->channels = chans;
  for (int ch = 1; ch < comm->nchannels; ch++) {
    struct worker_arg *a = malloc(sizeof *a);
    if (a) *a = (struct worker_arg){chans, ch};
    const int e = a ? pthread_create(&chans->threads[chans->nthreads], NULL, channel_main, a) : ENOMEM;
    if (e) {
      free(a);
      return gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot start the thread of channel %d (GW_NCHANNELS=%d): %s%s",
                     comm->rank, ch, comm->nchannels, strerror(e), gw__thread_limit_hint(e));
    }
    chans->nthreads++;
  }
  return GW_SUCCESS;
}

void gw__channels_stop(struct gw_comm *comm) {
  struct gw_channels *chans = comm->channels;
  if (!chans) return;
  pthread_mutex_lock(&chans->mu);
  atomic_store(&chans->stop, true);
  pthread_cond_broadcast(&chans->cv);
  pthread_mutex_unlock(&chans->mu);
  for (int i = 0; i < chans->nthreads; i++) pthread_join(chans->threads[i], NULL);
  pthread_cond_destroy(&chans->cv);
  pthread_mutex_destroy(&chans->mu);
  free(chans);
  comm->channels = NULL;
}

/* How many channels an operation uses: one per GW_CHANNEL_MIN_BYTES of data (1
 * MiB), so small operations stay on one ring and wake no thread.  Every rank
 * computes the same number from the same call. */
static int channels_for(const struct gw_comm *comm, const struct gw_op *op) {
  size_t bytes = op->desc.count * gw_dtype_size((gw_dtype_t)op->desc.dtype);
  if (op->desc.coll == GW_COLL_ALLGATHER || op->desc.coll == GW_COLL_REDUCE_SCATTER) bytes *= (size_t)comm->nranks;
  size_t n = bytes / comm->channel_min_bytes;
  return (int)GW_MAX((size_t)1, GW_MIN(n, (size_t)comm->nchannels));
}

gw_result_t gw__ring_run(struct gw_comm *comm, struct gw_op *op, struct gw_errctx *err) {
  struct gw_channels *chans = comm->channels;
  int nuse = chans ? channels_for(comm, op) : 1;
  if (nuse == 1) return gw__ring_run_channel(comm, 0, 1, op, err);
  atomic_store_explicit(&chans->done, 0, memory_order_relaxed);
  pthread_mutex_lock(&chans->mu);
  chans->op = op;
  chans->nuse = nuse;
  atomic_fetch_add_explicit(&chans->gen, 1, memory_order_release);
  pthread_cond_broadcast(&chans->cv);
  pthread_mutex_unlock(&chans->mu);
  gw_result_t res = gw__ring_run_channel(comm, 0, nuse, op, err);
  /* No deadline here: every channel enforces GW_TIMEOUT on its own waits. */
  struct gw_waiter w;
  gw__waiter_init(&w, 0);
  while (atomic_load_explicit(&chans->done, memory_order_acquire) < nuse - 1) gw__waiter_pause(&w);
  for (int ch = 1; ch < nuse && res == GW_SUCCESS; ch++)
    if (chans->res[ch] != GW_SUCCESS) {
      res = chans->res[ch];
      snprintf(err->msg, sizeof err->msg, "%s", chans->err[ch].msg);
    }
  return res;
}
