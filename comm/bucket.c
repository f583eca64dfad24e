/* bucket.c - the gradient bucketer of gradwire.h: bookkeeping over a caller's
 * contiguous gradient buffer that starts each bucket's in-place allreduce as
 * soon as it (and every bucket before it) is completely marked ready.
 *
 * Why "every bucket before it": the allreduces of a communicator must be issued
 * in the same order on every rank, but gradients can finish in a different order
 * on different ranks (a backend that runs layers concurrently, or a caller that
 * marks in a different order).  Starting strictly in bucket order makes the
 * sequence identical by construction; with the model's reverse layout the
 * buckets complete in that order anyway, so nothing waits in practice.
 *
 * Marked ranges are kept as a sorted set of disjoint intervals, so marking an
 * element twice is caught (it would otherwise let a bucket start with one of
 * its gradients still being written: silent corruption).  A step marks one range
 * per layer, so the set stays small.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bucket.h"
#include "comm.h"
#include "core.h"
#include "gradwire.h"
#include "dev.h"

#define fail gw__bucket_fail /* bucket.h */

struct interval {
  size_t lo, hi; /* [lo, hi) */
};

struct gw_bucketer {
  gw_comm_t comm;
  char *buf;
  size_t count, esize;
  gw_dtype_t dtype;
  gw_op_t op;
  uint32_t number;         /* on the communicator (gw__bucket_agree_number; its allreduces carry it: gw__desc_bucket_tag) */
  size_t *bounds;          /* [n + 1] */
  int n;
  size_t *ready;           /* [n] elements marked in each bucket this step */
  gw_request_t *req;       /* [n] */
  int next;                /* first bucket not started */
  size_t marked;           /* elements marked this step */
  size_t twice_lo, twice_hi; /* the step's first range marked again (refused); hi 0: none */
  struct interval *iv;     /* marked ranges, sorted, disjoint, merged */
  int niv, cap_iv;
  double first_start, last_ready;
  struct gw_bucketer_times last; /* of the last completed step */
  /* gw_bucketer_set_wire: the dtype buckets travel in (== dtype: as they are),
   * and a 16-bit buffer of count elements: a device wire's buckets are cast
   * into it; a host wire's only where the algorithm does not convert inside
   * its steps (enqueue.c's run_through_wire_buf; the ring and the exchange
   * never touch it). */
  gw_dtype_t wire;
  char *wbuf;
  int wire_dev; /* wbuf is device memory (device gradients): converted by cast_async on the stream */
  int divide_first; /* gw_bucketer_set_divide_first */
  void *stream; /* gw_bucketer_set_stream, or own_stream */
  gw_dev_stream_t own_stream; /* made by set_compute_stream when no stream was given */
  /* gw_bucketer_set_compute_stream: the stream the gradients are written on,
   * an event per bucket recorded on it when the bucket starts (the allreduce's
   * stream waits for it), and one recorded on the allreduce's stream after the
   * last bucket that compute then waits for. */
  void *compute;
  gw_dev_event_t *ev; /* [n + 1], made on first use */
  /* The first failure to start a bucket this step (its message as the
   * communicator had it): nothing more starts, and wait returns it. */
  gw_result_t failed;
  char failmsg[GW_ERRMSG_MAX];
  /* The first mark of this step that was refused (overlap, outside, the
   * settings): wait's report of an incomplete step says it (the caller's own
   * report of it may be gone by then: later errors replace the message). */
  char refused[GW_ERRMSG_MAX];
  pthread_mutex_t mu; /* every call but create and destroy may come from several threads */
};

gw_result_t gw__bucket_fail(gw_comm_t comm, gw_result_t code, const char *fmt, ...) {
  char msg[GW_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct gw_errctx err;
  /* which rank says it, as the collectives' messages do */
  if (comm && strncmp(msg, "rank ", 5) != 0) gw__err(&err, code, "rank %d: %s", comm->rank, msg);
  else gw__err(&err, code, "%s", msg);
  if (comm) gw__comm_set_error(comm, err.msg);
  else gw__set_thread_error(err.msg);
  return code;
}

/* A mark of this step refused (fail()'s report, and b->refused keeps the
 * first such message, bare: the report of the incomplete step quotes it). */
static gw_result_t refuse(struct gw_bucketer *b, gw_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static gw_result_t refuse(struct gw_bucketer *b, gw_result_t code, const char *fmt, ...) {
  char msg[GW_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!b->refused[0]) snprintf(b->refused, sizeof b->refused, "%s", msg);
  return fail(b->comm, code, "%s", msg);
}

/* A child forked without exec: the bucketer is its parent's (its lock may have
 * been held at the fork, its requests and connections are the parent's, and a
 * step it failed told the parent's peers to stop): refused before anything of
 * it is touched. */
static gw_result_t parents(gw_bucketer_t b, const char *fn) {
  if (!gw__comm_forked_away(b->comm)) return GW_SUCCESS;
  return fail(NULL, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: this bucketer's communicator belongs to process %ld, which "
              "forked this one (pid %ld); a child cannot use it", b->comm->rank, fn, (long)b->comm->owner_pid,
              (long)getpid());
}

/* A bucketer a call may use: live (one destroyed already is refused before
 * its freed memory is read) and this process's. */
static gw_result_t usable(gw_bucketer_t b, const char *fn) {
  if (!gw__live_or_refuse(b, GW_LIVE_BUCKETER, fn)) return GW_ERR_INVALID_ARGUMENT;
  return parents(b, fn);
}

int gw_bucket_bounds(size_t count, size_t elem_size, size_t first_bytes, size_t bucket_bytes, size_t *bounds,
                     int max_bounds) {
  if (!count || !elem_size || !first_bytes || !bucket_bytes || !bounds || max_bounds < 2) return -1;
  size_t first = first_bytes / elem_size + (first_bytes % elem_size != 0); /* rounded up, without overflow */
  size_t rest = bucket_bytes / elem_size + (bucket_bytes % elem_size != 0);
  int n = 0;
  bounds[0] = 0;
  for (size_t at = 0; at < count; n++) {
    if (n + 2 > max_bounds) return -1;
    size_t len = n == 0 ? first : rest;
    at = count - at <= len ? count : at + len;
    bounds[n + 1] = at;
  }
  return n;
}

/* What each bucket's allreduce checks of the buffer (device memory of the
 * communicator's device, or host memory) or of a stream (its device, not
 * under capture), checked when it is given: refused at a bucket's start, it
 * failed the communicator on every rank for a setting. */
static gw_result_t dev_args(gw_comm_t comm, const char *fn, const void *buf, size_t count, gw_dtype_t dtype,
                            void *stream, int *is_dev) {
  struct gw_errctx err;
  gw_result_t r =
      buf ? gw__dev_check_buffer(comm, fn, "buf", buf, count * gw_dtype_size(dtype), is_dev, &err) : GW_SUCCESS;
  if (r == GW_SUCCESS && stream) r = gw__dev_check_stream(comm, fn, stream, &err);
  if (r != GW_SUCCESS) gw__comm_set_error(comm, err.msg);
  return r;
}

static gw_result_t check_create(gw_comm_t comm, const void *buf, size_t count, gw_dtype_t dtype, gw_op_t op,
                                const size_t *bounds, int nbuckets, int *is_dev) {
  if (!comm) return fail(NULL, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_create: comm is NULL");
  if (!buf || !count || !gw_dtype_size(dtype) || (unsigned)op >= GW_NUM_OPS)
    return fail(comm, GW_ERR_INVALID_ARGUMENT,
                "gw_bucketer_create: needs a buffer, a count > 0, a known dtype and op (got %p, %zu, %d, %d)", buf,
                count, (int)dtype, (int)op);
  /* the collectives' bound (enqueue.c): past it a 16-bit wire buffer's size
   * (count * 2) wrapped, and the casts wrote past its end */
  if (count > (SIZE_MAX / 2) / gw_dtype_size(dtype) / (size_t)comm->nranks)
    return fail(comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_create: count %zu is too large for %s elements", count,
                gw_dtype_name(dtype));
  /* as every collective on it would refuse it (enqueue.c): accepted here, the
   * first step failed the communicator on every rank */
  if ((uintptr_t)buf % gw_dtype_size(dtype) != 0)
    return fail(comm, GW_ERR_INVALID_ARGUMENT,
                "gw_bucketer_create: buf %p is not aligned to its %zu-byte elements (the collectives need that)", buf,
                gw_dtype_size(dtype));
  if (!bounds || nbuckets < 1)
    return fail(comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_create: needs bounds and nbuckets >= 1 (got %p, %d)",
                (const void *)bounds, nbuckets);
  if (bounds[0] != 0 || bounds[nbuckets] != count)
    return fail(comm, GW_ERR_INVALID_ARGUMENT,
                "gw_bucketer_create: bounds must run from 0 to count %zu, but bounds[0] is %zu and bounds[%d] "
                "(nbuckets) is %zu", count, bounds[0], nbuckets, bounds[nbuckets]);
  for (int i = 0; i < nbuckets; i++)
    if (bounds[i + 1] <= bounds[i])
      return fail(comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_create: bucket %d [%zu, %zu) is empty or reversed", i,
                  bounds[i], bounds[i + 1]);
  return dev_args(comm, "gw_bucketer_create", buf, count, dtype, NULL, is_dev);
}

static gw_result_t bucketer_make(gw_comm_t comm, void *buf, size_t count, gw_dtype_t dtype, gw_op_t op,
                                 const size_t *bounds, int nbuckets, gw_bucketer_t *out);

gw_result_t gw_bucketer_create(gw_comm_t comm, void *buf, size_t count, gw_dtype_t dtype, gw_op_t op,
                               const size_t *bounds, int nbuckets, gw_bucketer_t *out) {
  if (out) *out = NULL;
  if (!comm) return fail(NULL, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_create: comm is NULL");
  /* Through the destroy gate: a bucketer counted after destroy's check would
   * use a freed communicator (and a forked child's is refused). */
  gw_result_t res = gw__comm_enter(comm, "gw_bucketer_create");
  if (res != GW_SUCCESS) return res;
  res = bucketer_make(comm, buf, count, dtype, op, bounds, nbuckets, out);
  gw__comm_leave(comm);
  return res;
}

static gw_result_t bucketer_make(gw_comm_t comm, void *buf, size_t count, gw_dtype_t dtype, gw_op_t op,
                                 const size_t *bounds, int nbuckets, gw_bucketer_t *out) {
  int is_dev = 0;
  gw_result_t res = check_create(comm, buf, count, dtype, op, bounds, nbuckets, &is_dev);
  if (res == GW_SUCCESS && !out) res = fail(comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_create: out is NULL");
  /* Memory before the ranks agree: a rank out of it after they agreed kept
   * none while its peers held bucketers (create "refuses on every rank"),
   * and its retry's allgather met their first bucket's allreduce. */
  struct gw_bucketer *b = NULL;
  if (res == GW_SUCCESS) {
    const bool nomem = gw__env_int("GW_TEST_BUCKETER_NOMEM", 0) != 0; /* tests: this rank's allocation fails */
    b = nomem ? NULL : calloc(1, sizeof *b);
    if (b) {
      b->bounds = malloc((size_t)(nbuckets + 1) * sizeof *b->bounds);
      b->ready = calloc((size_t)nbuckets, sizeof *b->ready);
      b->req = calloc((size_t)nbuckets, sizeof *b->req);
    }
    if (!b || !b->bounds || !b->ready || !b->req)
      res = fail(comm, GW_ERR_SYSTEM, "gw_bucketer_create: out of memory for %d buckets", nbuckets);
  }
  uint32_t number = 0;
  if ((res = gw__bucket_agree_layout(comm, count, dtype, op, bounds, nbuckets, is_dev, res)) != GW_SUCCESS ||
      (res = gw__bucket_agree_number(comm, &number)) != GW_SUCCESS) {
    if (b) free(b->bounds), free(b->ready), free(b->req);
    free(b);
    return res;
  }
  memcpy(b->bounds, bounds, (size_t)(nbuckets + 1) * sizeof *b->bounds);
  pthread_mutex_init(&b->mu, NULL);
  b->comm = comm, b->buf = buf, b->count = count, b->esize = gw_dtype_size(dtype);
  b->dtype = dtype, b->op = op, b->n = nbuckets, b->wire = dtype;
  atomic_fetch_add(&comm->bucketers, 1);
  b->number = number;
  atomic_fetch_or(&comm->bucketer_numbers[number / 64], 1ull << (number % 64));
  gw__live_add(b, GW_LIVE_BUCKETER);
  *out = b;
  return GW_SUCCESS;
}

/* Index of the first interval with hi > x (the one x may fall into or precede). */
static int iv_search(const struct gw_bucketer *b, size_t x) {
  int lo = 0, hi = b->niv;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (b->iv[mid].hi <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Adds [lo, hi) to the set; -1 if it overlaps what is there, -2 out of memory. */
static int iv_add(struct gw_bucketer *b, size_t lo, size_t hi) {
  int i = iv_search(b, lo);
  if (i < b->niv && b->iv[i].lo < hi) return -1;
  int join_left = i > 0 && b->iv[i - 1].hi == lo, join_right = i < b->niv && b->iv[i].lo == hi;
  if (join_left && join_right) {
    b->iv[i - 1].hi = b->iv[i].hi;
    memmove(&b->iv[i], &b->iv[i + 1], (size_t)(b->niv - i - 1) * sizeof *b->iv);
    b->niv--;
  } else if (join_left) {
    b->iv[i - 1].hi = hi;
  } else if (join_right) {
    b->iv[i].lo = lo;
  } else {
    if (b->niv == b->cap_iv) {
      int cap = b->cap_iv ? 2 * b->cap_iv : 64;
      struct interval *v = realloc(b->iv, (size_t)cap * sizeof *v);
      if (!v) return -2;
      b->iv = v, b->cap_iv = cap;
    }
    memmove(&b->iv[i + 1], &b->iv[i], (size_t)(b->niv - i) * sizeof *b->iv);
    b->iv[i] = (struct interval){lo, hi};
    b->niv++;
  }
  return 0;
}

/* First bucket whose range ends after x. */
static int bucket_of(const struct gw_bucketer *b, size_t x) {
  int lo = 0, hi = b->n - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (b->bounds[mid + 1] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* gw_bucketer_set_divide_first: the average divides before the sum, in
 * float32 on the way into the 16-bit wire (NCCL's floating average): the
 * ring's partial sums are 16-bit, and n ranks' float16 gradients that fit
 * summed past 65504 (an infinity where the mean was finite).  Off, the
 * average is a sum divided once at the end: exact for exact sums, and small
 * gradients keep float16's subnormal bits. */
static bool prescaled(const struct gw_bucketer *b) {
  return b->divide_first && b->wire != b->dtype && b->op == GW_AVG && b->comm->nranks > 1;
}

static gw_result_t start_buckets(struct gw_bucketer *b) {
  const float scale = prescaled(b) ? 1.0f / (float)b->comm->nranks : 1.0f;
  const uint8_t marks = prescaled(b) ? GW_DESC_DIVIDED : 0;
  while (b->next < b->n && b->ready[b->next] == b->bounds[b->next + 1] - b->bounds[b->next]) {
    int k = b->next;
    void *p = b->buf + b->bounds[k] * b->esize;
    size_t n = b->bounds[k + 1] - b->bounds[k];
    if (k == 0) b->first_start = gw__now();
    if (b->wire != b->dtype && !b->wire_dev) { /* converted by the operation itself, both ways (enqueue.c) */
      gw_result_t res = gw__iallreduce_widened(p, b->wbuf + b->bounds[k] * 2, n, b->wire, prescaled(b) ? GW_SUM : b->op,
                                               scale, b->comm, &b->req[k],
                                               gw__desc_bucket_tag(b->number, (uint32_t)k), marks);
      if (res != GW_SUCCESS) return res; /* the communicator holds the message */
      b->next++;
      continue;
    }
    if (b->compute) { /* the allreduce's stream waits for what compute has queued so far */
      const struct gw_dev_ops *d = gw__dev();
      if (d->event_record(b->ev[k], (gw_dev_stream_t)b->compute) ||
          d->stream_wait_event((gw_dev_stream_t)b->stream, b->ev[k]))
        return fail(b->comm, GW_ERR_CUDA, "gw_bucketer_ready: ordering bucket %d after the compute stream: %s", k,
                    d->error());
    }
    if (b->wire != b->dtype && b->wire_dev) { /* the same on the device, on the allreduce's stream */
      void *w = b->wbuf + b->bounds[k] * 2;
      if (gw__dev()->cast_async(w, b->wire, p, b->dtype, n, scale, (gw_dev_stream_t)b->stream))
        return fail(b->comm, GW_ERR_CUDA, "gw_bucketer_ready: converting bucket %d to %s: %s", k,
                    gw_dtype_name(b->wire), gw__dev()->error());
      p = w;
    }
    gw_result_t res = gw__iallreduce_tagged(p, p, n, b->wire, prescaled(b) ? GW_SUM : b->op, b->comm, b->stream,
                                            &b->req[k], gw__desc_bucket_tag(b->number, (uint32_t)k), marks);
    if (res != GW_SUCCESS) return res; /* the communicator holds the message */
    b->next++;
  }
  return GW_SUCCESS;
}

/* Bucket k could not start (the communicator holds why): kept for wait, which
 * would otherwise report the step as merely incomplete. */
static gw_result_t start_failed(struct gw_bucketer *b, gw_result_t code) {
  b->failed = code;
  snprintf(b->failmsg, sizeof b->failmsg, "%s", gw_comm_last_error(b->comm));
  return code;
}

static gw_result_t start_ready_buckets(struct gw_bucketer *b) {
  gw_result_t res = start_buckets(b);
  return res == GW_SUCCESS ? res : start_failed(b, res);
}

/* What the settings must allow before a step marks anything (they may have
 * been changed in either order since the last step). */
static gw_result_t check_step(struct gw_bucketer *b) {
  if (b->wire != b->dtype && b->wire_dev && !b->stream)
    return refuse(b, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_ready: device gradients with a %s wire need a "
                  "stream to convert on (gw_bucketer_set_stream or gw_bucketer_set_compute_stream)",
                  gw_dtype_name(b->wire));
  /* Host conversions run inside each bucket's allreduce, on the host, in no
   * stream's order: a stream's earlier writes may not be there yet, and its
   * later work could read the values before they are converted back. */
  if (b->wire != b->dtype && !b->wire_dev && (b->compute || b->stream))
    return refuse(b, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_ready: host gradients with a %s wire are converted "
                  "on the host, in no order with the %s stream's work: drop that stream or the wire "
                  "format", gw_dtype_name(b->wire), b->compute ? "compute" : "allreduce");
  return GW_SUCCESS;
}

static gw_result_t mark_locked(struct gw_bucketer *b, size_t offset, size_t count) {
  if (offset > b->count || count > b->count - offset)
    return refuse(b, GW_ERR_INVALID_ARGUMENT,
                  "gw_bucketer_ready: offset %zu + count %zu is outside the buffer of %zu elements", offset, count,
                  b->count);
  /* A communicator that failed already (a bucket's allreduce on the progress
   * thread, a peer's notice, an abort): said at once, not only by the mark
   * that completes a bucket or by the wait (gradwire.h). */
  const int comm_failed = atomic_load(&b->comm->failed);
  if (comm_failed && !b->failed) {
    /* kept as a failed start's reason is: the wait says it, not "incomplete" */
    b->failed = comm_failed;
    gw__comm_first_error(b->comm, b->failmsg, sizeof b->failmsg);
    return fail(b->comm, comm_failed, "gw_bucketer_ready: the communicator has failed (first error: %.400s)",
                b->failmsg);
  }
  /* after a failed start every later mark of the step says it, empty ones too (gradwire.h) */
  if (b->failed)
    return fail(b->comm, b->failed, "gw_bucketer_ready: a bucket of this step could not start: %s", b->failmsg);
  if (count == 0) return GW_SUCCESS;
  if (b->marked == 0) GW_CHECK(check_step(b));
  int r = iv_add(b, offset, offset + count);
  if (r == -1 && !b->twice_hi) b->twice_lo = offset, b->twice_hi = offset + count;
  if (r == -1)
    return refuse(b, GW_ERR_INVALID_ARGUMENT,
                  "gw_bucketer_ready: [%zu, %zu) overlaps a range already marked ready in this step (each gradient "
                  "element is marked once per step)",
                  offset, offset + count);
  if (r == -2) return refuse(b, GW_ERR_SYSTEM, "gw_bucketer_ready: out of memory for [%zu, %zu)", offset,
                             offset + count);
  for (int k = bucket_of(b, offset); k < b->n && b->bounds[k] < offset + count; k++) {
    size_t lo = b->bounds[k] > offset ? b->bounds[k] : offset;
    size_t hi = b->bounds[k + 1] < offset + count ? b->bounds[k + 1] : offset + count;
    b->ready[k] += hi - lo;
  }
  b->marked += count;
  if (b->marked == b->count) b->last_ready = gw__now();
  return start_ready_buckets(b);
}

gw_result_t gw_bucketer_ready(gw_bucketer_t b, size_t offset, size_t count) {
  if (!b) return fail(NULL, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_ready: bucketer is NULL");
  GW_CHECK(usable(b, "gw_bucketer_ready"));
  pthread_mutex_lock(&b->mu);
  const int prev = gw__dev_switch(b->comm); /* events, casts: on the communicator's device */
  gw_result_t res = mark_locked(b, offset, count);
  gw__dev_switch_back(prev);
  pthread_mutex_unlock(&b->mu);
  return res;
}

static void reset(struct gw_bucketer *b) {
  memset(b->ready, 0, (size_t)b->n * sizeof *b->ready);
  b->next = 0, b->marked = 0, b->niv = 0;
  b->first_start = b->last_ready = 0;
  b->failed = GW_SUCCESS;
  b->refused[0] = 0;
  b->twice_lo = b->twice_hi = 0;
}

/* The step ends with buckets this rank never started while other ranks may
 * have started them and wait in their allreduces (or would pair them with
 * this rank's next step's: other gradients summed in silently).  So the
 * communicator fails here, and its peers are told now, with msg, as they are
 * of any failure (gw__comm_fail_caller: also beside another thread's call). */
static void fail_comm_for_step(struct gw_bucketer *b, gw_result_t code, const char *msg) {
  struct gw_comm *c = b->comm;
  if (atomic_load(&c->aborted)) return; /* the caller's abort tells the peers, at the next call or destroy */
  struct gw_errctx err;
  gw__err(&err, code, "%s", msg);
  gw__comm_fail_caller(c, code, &err);
}

/* Waits for every started bucket; returns the first failure. */
/* Every started bucket's allreduce waited for: the first failure's code, and
 * its message in first_msg (if given; the later buckets' refusals came after
 * it and would be the communicator's last error). */
static gw_result_t wait_started(struct gw_bucketer *b, char *first_msg, size_t len) {
  gw_result_t first = GW_SUCCESS;
  for (int k = 0; k < b->next; k++) {
    gw_result_t res = gw_wait(&b->req[k]);
    if (first == GW_SUCCESS && res != GW_SUCCESS && first_msg)
      snprintf(first_msg, len, "%s", gw_comm_last_error(b->comm));
    if (first == GW_SUCCESS) first = res;
  }
  return first;
}

/* A step that ends with a bucket not started (never completely marked, or
 * one could not start) fails the communicator with its error, whatever else
 * failed too; errors of a complete step are only returned. */

/* Later work on the compute stream (gw_bucketer_set_compute_stream) comes
 * after everything the allreduces' stream does to the buffer of the buckets
 * started: non-zero when the device refused. */
static int order_compute(struct gw_bucketer *b) {
  if (!b->compute || b->next == 0) return 0;
  const struct gw_dev_ops *d = gw__dev();
  return d->event_record(b->ev[b->n], (gw_dev_stream_t)b->stream) ||
         d->stream_wait_event((gw_dev_stream_t)b->compute, b->ev[b->n]);
}

static gw_result_t wait_locked(struct gw_bucketer *b) {
  const int incomplete = b->next < b->n ? b->next : -1;
  const size_t had = incomplete >= 0 ? b->ready[incomplete] : 0;
  const gw_result_t failed = b->failed;
  gw_result_t res = GW_SUCCESS;
  char msg[2 * GW_ERRMSG_MAX]; /* the refused mark's message inside (fail cuts it to GW_ERRMSG_MAX) */
  /* A device wire: the reduced buckets back into float32 on the allreduces'
   * stream, after each bucket's allreduce and before compute's event below. */
  for (int k = 0; b->wire != b->dtype && b->wire_dev && k < b->next; k++)
    if (gw__dev()->cast_async(b->buf + b->bounds[k] * b->esize, b->dtype, b->wbuf + b->bounds[k] * 2, b->wire,
                              b->bounds[k + 1] - b->bounds[k], 1.0f, (gw_dev_stream_t)b->stream)) {
      res = GW_ERR_CUDA;
      snprintf(msg, sizeof msg, "rank %d: gw_bucketer_wait: converting bucket %d back to %s: %s", b->comm->rank, k,
               gw_dtype_name(b->dtype), gw__dev()->error());
      break;
    }
  /* The host waits for every started bucket first, then the compute stream
   * is ordered after the allreduces: a wait put on it while a bucket's
   * synchronized device ring still enqueues chunks could hold the hardware
   * queue that ring's engine stream shares with it, for good. */
  char first[GW_ERRMSG_MAX] = "";
  gw_result_t w = wait_started(b, first, sizeof first);
  if (res == GW_SUCCESS && w != GW_SUCCESS) {
    res = w;
    snprintf(msg, sizeof msg, "%s", first);
  }
  /* Later work on compute sees the reduced gradients; also after a failed
   * allreduce or cast back (whatever the allreduces' stream still does to the
   * buffer comes before compute's next use or a stream-ordered free of it). */
  if (order_compute(b) && res == GW_SUCCESS) {
    res = GW_ERR_CUDA;
    snprintf(msg, sizeof msg, "rank %d: gw_bucketer_wait: ordering the compute stream after the allreduces: %s",
             b->comm->rank, gw__dev()->error());
  }
  if (res == GW_SUCCESS && failed && incomplete < 0) {
    /* every bucket was reduced; the communicator failed since (a peer's
     * notice or an abort seen by a mark after the last bucket started) */
    res = failed;
    snprintf(msg, sizeof msg, "rank %d: gw_bucketer_wait: every bucket of the step was reduced, but the communicator "
             "has failed since: %s", b->comm->rank, b->failmsg);
  } else if (res == GW_SUCCESS && failed) { /* the reason a bucket did not start, not that it was left */
    res = failed;
    snprintf(msg, sizeof msg, "rank %d: gw_bucketer_wait: bucket %d of %d and those after it were not reduced: %s",
             b->comm->rank, incomplete, b->n, b->failmsg);
  } else if (res == GW_SUCCESS && incomplete >= 0) {
    res = GW_ERR_INVALID_ARGUMENT;
    snprintf(msg, sizeof msg,
             "rank %d: gw_bucketer_wait: bucket %d of %d [%zu, %zu) has only %zu of its %zu elements marked ready, "
             "so it and the buckets after it were not reduced (the communicator is failed: other ranks may wait in "
             "them)%s%s",
             b->comm->rank, incomplete, b->n, b->bounds[incomplete], b->bounds[incomplete + 1], had,
             b->bounds[incomplete + 1] - b->bounds[incomplete], b->refused[0] ? "; the step's first refused mark: " : "",
             b->refused);
  } else if (res == GW_SUCCESS && b->twice_hi) {
    /* Every bucket was reduced (on every rank: the communicator goes on), but
     * a range marked twice was likely written twice, maybe while its bucket
     * was on the wire, and then this rank's gradients are not the others'. */
    res = GW_ERR_INVALID_ARGUMENT;
    snprintf(msg, sizeof msg, "rank %d: gw_bucketer_wait: every bucket was reduced, but [%zu, %zu) was marked ready "
             "again in this step (refused), so this rank's gradients may not match the other ranks' (was it "
             "written again, maybe while its bucket was being reduced?)", b->comm->rank, b->twice_lo, b->twice_hi);
  } else if (res == GW_SUCCESS) {
    b->last = (struct gw_bucketer_times){b->first_start, b->last_ready, gw__now()};
  }
  reset(b);
  if (res == GW_SUCCESS) return res;
  if (incomplete >= 0) fail_comm_for_step(b, res, msg); /* `failed` alone: the communicator has failed already */
  return fail(b->comm, res, "%s", msg);
}

gw_result_t gw_bucketer_wait(gw_bucketer_t b) {
  if (!b) return fail(NULL, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_wait: bucketer is NULL");
  GW_CHECK(usable(b, "gw_bucketer_wait"));
  pthread_mutex_lock(&b->mu);
  const int prev = gw__dev_switch(b->comm);
  gw_result_t res = wait_locked(b);
  gw__dev_switch_back(prev);
  pthread_mutex_unlock(&b->mu);
  return res;
}

static gw_result_t set_wire(gw_bucketer_t b, gw_dtype_t wire) {
  if (b->next || b->marked)
    return fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_wire: a step is under way (call it between "
                "gw_bucketer_wait and the next gw_bucketer_ready)");
  if (wire == b->dtype) {
    b->wire = wire;
    return GW_SUCCESS;
  }
  if ((unsigned)wire >= GW_NUM_DTYPES)
    return fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_wire: %d is no gw_dtype_t", (int)wire);
  if (b->dtype != GW_FLOAT32 || (wire != GW_BFLOAT16 && wire != GW_FLOAT16))
    return fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_wire: %s gradients can travel as themselves%s, "
                "not as %s", gw_dtype_name(b->dtype), b->dtype == GW_FLOAT32 ? ", bfloat16 or float16" : "",
                gw_dtype_name(wire));
  /* Device gradients convert on the device into a device buffer, host ones on the host. */
  const struct gw_dev_ops *d = gw__dev();
  int is_dev = 0, dev = -1;
  if (d) d->ptr_kind(b->buf, &is_dev, &dev);
  if (!b->wbuf) {
    void *w = NULL;
    int cur = -1, ok; /* on the gradients' device, whichever the calling thread uses */
    if (is_dev) (void)gw__dev_enter(dev, &cur);
    ok = is_dev ? d->alloc(&w, b->count * 2) == 0 : (w = malloc(b->count * 2)) != NULL;
    if (!ok)
      fail(b->comm, GW_ERR_SYSTEM, "gw_bucketer_set_wire: out of %s memory for %zu wire elements%s%s",
           is_dev ? "device" : "host", b->count, is_dev ? ": " : "", is_dev ? d->error() : "");
    if (cur >= 0) d->set_device(cur);
    if (!ok) return GW_ERR_SYSTEM;
    b->wbuf = w, b->wire_dev = is_dev;
  }
  b->wire = wire;
  return GW_SUCCESS;
}

/* The settings are changed under the lock a step's marks take: "only between
 * steps" holds against a mark on another thread. */
gw_result_t gw_bucketer_set_wire(gw_bucketer_t b, gw_dtype_t wire) {
  if (!b) return fail(NULL, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_wire: bucketer is NULL");
  GW_CHECK(usable(b, "gw_bucketer_set_wire"));
  pthread_mutex_lock(&b->mu);
  gw_result_t res = set_wire(b, wire);
  pthread_mutex_unlock(&b->mu);
  return res;
}

gw_result_t gw_bucketer_set_divide_first(gw_bucketer_t b, int on) {
  if (!b) return fail(NULL, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_divide_first: bucketer is NULL");
  GW_CHECK(usable(b, "gw_bucketer_set_divide_first"));
  pthread_mutex_lock(&b->mu);
  gw_result_t res = GW_SUCCESS;
  if (b->next || b->marked)
    res = fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_divide_first: a step is under way (call it "
               "between gw_bucketer_wait and the next gw_bucketer_ready)");
  else
    b->divide_first = on != 0;
  pthread_mutex_unlock(&b->mu);
  return res;
}

/* The stream set_compute_stream made, when no step is under way: everything on
 * it has run once it is idle (destroy waits for it). */
static void drop_own_stream(struct gw_bucketer *b) {
  if (!b->own_stream) return;
  gw__dev()->stream_sync(b->own_stream);
  gw__dev()->stream_destroy(b->own_stream);
  if (b->stream == b->own_stream) b->stream = NULL;
  b->own_stream = NULL;
}

static gw_result_t set_stream(gw_bucketer_t b, void *stream) {
  if (b->next || b->marked)
    return fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_stream: a step is under way (call it between "
                "gw_bucketer_wait and the next gw_bucketer_ready)");
  if (b->compute && (!stream || stream == b->compute))
    return fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_stream: %s while a compute stream is set (turn "
                "it off first with gw_bucketer_set_compute_stream(b, NULL))",
                stream ? "the compute stream itself" : "no stream");
  /* Refused here, as set_compute_stream refuses, rather than at the first
   * bucket's start, which would fail the communicator for a setting. */
  if (stream && !gw__dev())
    return fail(b->comm, GW_ERR_UNSUPPORTED, "gw_bucketer_set_stream: a stream was given, but %s",
                gw__dev_absent_reason());
  if (stream && b->comm->device < 0)
    return fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_stream: a stream was given, but the "
                "communicator is bound to no device (GW_DEVICE=none)");
  if (stream) GW_CHECK(dev_args(b->comm, "gw_bucketer_set_stream", NULL, 0, b->dtype, stream, NULL));
  if (stream != b->own_stream) drop_own_stream(b);
  b->stream = stream;
  return GW_SUCCESS;
}

gw_result_t gw_bucketer_set_stream(gw_bucketer_t b, void *stream) {
  if (!b) return fail(NULL, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_stream: bucketer is NULL");
  GW_CHECK(usable(b, "gw_bucketer_set_stream"));
  pthread_mutex_lock(&b->mu);
  gw_result_t res = set_stream(b, stream);
  pthread_mutex_unlock(&b->mu);
  return res;
}

static gw_result_t set_compute_stream(gw_bucketer_t b, void *compute) {
  if (b->next || b->marked)
    return fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_compute_stream: a step is under way (call it "
                "between gw_bucketer_wait and the next gw_bucketer_ready)");
  if (!compute) {
    b->compute = NULL;
    drop_own_stream(b); /* back to the stream (or none) the caller gave */
    return GW_SUCCESS;
  }
  const struct gw_dev_ops *d = gw__dev();
  if (!d)
    return fail(b->comm, GW_ERR_UNSUPPORTED, "gw_bucketer_set_compute_stream: no device layer (%s)",
                gw__dev_absent_reason());
  if (b->comm->device < 0)
    return fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_compute_stream: the communicator is bound to no "
                "device (GW_DEVICE=none)");
  GW_CHECK(dev_args(b->comm, "gw_bucketer_set_compute_stream", NULL, 0, b->dtype, compute, NULL));
  if (b->stream == compute)
    return fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_compute_stream: the allreduces' stream "
                "(gw_bucketer_set_stream) is the compute stream: on one stream backward would wait for "
                "communication");
  if (!b->stream) { /* none given: one of our own */
    if (d->stream_create(&b->own_stream))
      return fail(b->comm, GW_ERR_CUDA, "gw_bucketer_set_compute_stream: creating the allreduces' stream: %s",
                  d->error());
    b->stream = b->own_stream;
  }
  if (!b->ev) {
    gw_dev_event_t *ev = calloc((size_t)b->n + 1, sizeof *ev);
    if (!ev) {
      drop_own_stream(b);
      return fail(b->comm, GW_ERR_SYSTEM, "gw_bucketer_set_compute_stream: out of memory");
    }
    for (int i = 0; i <= b->n; i++)
      if (d->event_create(&ev[i])) {
        char msg[GW_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", d->error());
        while (i-- > 0) d->event_destroy(ev[i]);
        free(ev);
        drop_own_stream(b); /* as before the call: no stream of ours without a compute stream */
        return fail(b->comm, GW_ERR_CUDA, "gw_bucketer_set_compute_stream: creating events: %s", msg);
      }
    b->ev = ev;
  }
  b->compute = compute;
  return GW_SUCCESS;
}

gw_result_t gw_bucketer_set_compute_stream(gw_bucketer_t b, void *compute) {
  if (!b) return fail(NULL, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_set_compute_stream: bucketer is NULL");
  GW_CHECK(usable(b, "gw_bucketer_set_compute_stream"));
  pthread_mutex_lock(&b->mu);
  const int prev = gw__dev_switch(b->comm); /* its stream and events made on the communicator's device */
  gw_result_t res = set_compute_stream(b, compute);
  gw__dev_switch_back(prev);
  pthread_mutex_unlock(&b->mu);
  return res;
}

gw_result_t gw_bucketer_times(gw_bucketer_t b, struct gw_bucketer_times *t) {
  if (!b) return fail(NULL, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_times: a NULL bucketer");
  GW_CHECK(usable(b, "gw_bucketer_times")); /* before b is read */
  if (!t) return fail(b->comm, GW_ERR_INVALID_ARGUMENT, "gw_bucketer_times: a NULL times pointer");
  pthread_mutex_lock(&b->mu);
  *t = b->last;
  pthread_mutex_unlock(&b->mu);
  return GW_SUCCESS;
}

/* Destroyed bucketers' memory is kept for the next QUARANTINE destroys
 * before it goes back to malloc, which hands the last freed block of a size
 * straight back: a handle used after its destroy (a second destroy) named
 * the next bucketer made, and destroyed it.  Past that, as with
 * communicators, an old handle may name a new bucketer (gradwire.h). */
enum { QUARANTINE = 64 };
static pthread_mutex_t quarantine_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gw_bucketer *quarantine[QUARANTINE];
static unsigned quarantine_next;

static void quarantine_free(struct gw_bucketer *b) {
  gw__fork_guard(&quarantine_mu); /* a parent's thread here at a fork: the child's destroy hung */
  pthread_mutex_lock(&quarantine_mu);
  struct gw_bucketer *old = quarantine[quarantine_next % QUARANTINE];
  quarantine[quarantine_next++ % QUARANTINE] = b;
  pthread_mutex_unlock(&quarantine_mu);
  free(old);
}

void gw_bucketer_destroy(gw_bucketer_t b) {
  if (!b || !gw__live_take_or_refuse(b, GW_LIVE_BUCKETER, "gw_bucketer_destroy")) return;
  if (parents(b, "gw_bucketer_destroy") != GW_SUCCESS) { /* a child's copy goes with the child */
    gw__live_add(b, GW_LIVE_BUCKETER);
    return;
  }
  /* Under the lock the marks and waits take: one running on another thread
   * ends first (two waits of the same requests freed them twice). */
  pthread_mutex_lock(&b->mu);
  const int prev = gw__dev_switch(b->comm);
  /* A complete step not waited for ends as its wait would have ended it
   * (a 16-bit wire converted back, the compute stream ordered after it);
   * otherwise the buffer held the local gradients (a device wire) or the
   * reduced ones (a host wire) depending on the wire. */
  if (b->n > 0 && b->next == b->n) {
    (void)wait_locked(b);
  } else {
    wait_started(b, NULL, 0);
    /* A step left part way too: a staged allreduce on a stream of the
     * caller's may still copy into the buffer, which compute's next work (a
     * stream-ordered free) must follow. */
    (void)order_compute(b);
  }
  /* A step left part way (see fail_comm_for_step), also one whose every mark
   * was refused: the peers went on into its buckets. */
  if (b->next < b->n && (b->marked || b->next || b->refused[0] || b->failed)) {
    char msg[2 * GW_ERRMSG_MAX]; /* fail_comm_for_step cuts it to GW_ERRMSG_MAX */
    const char *why = b->failed ? b->failmsg : b->refused;
    snprintf(msg, sizeof msg, "rank %d: gw_bucketer_destroy: a step was left part way (%d of %d buckets started)%s%s",
             b->comm->rank, b->next, b->n, why[0] ? (b->failed ? "; a bucket could not start: " :
             "; the step's first refused mark: ") : "", why);
    fail_comm_for_step(b, GW_ERR_INVALID_ARGUMENT, msg);
  }
  pthread_mutex_unlock(&b->mu);
  pthread_mutex_destroy(&b->mu);
  drop_own_stream(b);
  for (int i = 0; b->ev && i <= b->n; i++) gw__dev()->event_destroy(b->ev[i]);
  free(b->ev);
  if (b->wire_dev) gw__dev()->free(b->wbuf);
  else free(b->wbuf);
  free(b->bounds), free(b->ready), free(b->req), free(b->iv);
  atomic_fetch_and(&b->comm->bucketer_numbers[b->number / 64], ~(1ull << (b->number % 64)));
  atomic_fetch_sub(&b->comm->bucketers, 1);
  quarantine_free(b);
  gw__dev_switch_back(prev);
}
