/* gw-perf - collective bandwidth test shaped like nccl-tests' all_reduce_perf.
 * Launch one process per rank (gw-run -n 2 gw-perf ...).  For each size it times
 * out-of-place and in-place runs, reports time, algbw and busbw (nccl-tests
 * definitions) and the number of wrong elements, and writes the same figures as
 * CSV or JSON.  `--tune FILE` instead times allreduce for every algorithm and
 * protocol at a few sizes and writes the fitted cost model (GW_TUNING_FILE).
 * Uses the public API (gradwire.h), and the device layer (dev.h) for -D, which
 * puts the buffers in device memory and orders every call on one stream (CUDA,
 * or the emulator under GW_DEV_EMULATE). */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "decimal.h"
#include "dev.h"
#include "dtype_values.h"
#include "gradwire.h"
#include "gw-perf.h"
#include "gw-perf-run.h"
#include "optwords.h"
#include "outpath.h"
#include "tune.h"

enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCE_SCATTER, C_BROADCAST };
static const char *coll_names[] = {"allreduce", "allgather", "reduce_scatter", "broadcast"};

struct opts {
  size_t min_bytes, max_bytes;
  double factor;
  size_t step_bytes; /* -i: above 0, sizes step by this many bytes instead of by -f */
  int iters, warmup, check, coll, root, reg, device;
  int dtypes[GW_NUM_DTYPES], ndtypes;
  int ops[GW_NUM_OPS], nops;
  const char *csv, *json, *tune;
  double min_bw; /* --min-bw: the closing average below this fails the run (0: none) */
};

enum { MAX_SIZES = 10000 }; /* sizes one run measures, at most */

static int rank = -1, nranks; /* rank -1 until the communicator is made */

/* Says what failed on stderr and exits with status (1: a failure or wrong
 * results, 2: a bad command line, output files included; gw-train exits 2
 * for what its flags say alone, 1 for what its setup finds wrong with them:
 * its data, its model, its files). */
static void vsay(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));
static void vsay(const char *fmt, va_list ap) {
  /* one write: a rank stopped by gw-run right after (every rank failing the
   * same check) printed a bare prefix when the line went out in pieces */
  char line[1024];
  int n = rank >= 0 ? snprintf(line, sizeof line, "gw-perf: rank %d: ", rank) : snprintf(line, sizeof line, "gw-perf: ");
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  n += m < 0 ? 0 : m > (int)(sizeof line - (size_t)n - 2) ? (int)(sizeof line - (size_t)n - 2) : m;
  line[n++] = '\n';
  fflush(stdout);
  if (write(STDERR_FILENO, line, (size_t)n) < 0) { /* nothing else to tell it on */
  }
}
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsay(fmt, ap);
  va_end(ap);
}
static void vdie(int status, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0), noreturn));
static void vdie(int status, const char *fmt, va_list ap) {
  vsay(fmt, ap);
  exit(status);
}
static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vdie(1, fmt, ap);
}
/* A flag's value or a combination of flags refused. */
void gwp_bad_use(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vdie(2, fmt, ap);
}

/* The size after sz: times -f (at least a byte more), or plus -i's bytes. */
static double next_size(const struct opts *o, double sz) {
  if (o->step_bytes) return sz + (double)o->step_bytes;
  return sz * o->factor < sz + 1 ? sz + 1 : sz * o->factor;
}

/* ---- one measurement ---- */
struct result {
  size_t bytes, count;
  double time_us[2], algbw[2], busbw[2];
  long long wrong[2];
  char path[2][32]; /* what ran (gw_comm_last_path) */
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static gw_comm_t comm;

/* -D: the device layer, the stream every call goes on, and host mirrors of the
 * device buffers for filling and checking. */
static const struct gw_dev_ops *dev;
static gw_dev_stream_t stream;
static uint8_t *dsend, *drecv, *hsend, *hrecv;
static size_t dbytes;

static void check_dev(int r, const char *what) {
  if (r) die("%s failed: %s", what, dev->error());
}

/* The host mirror of a pointer into the device buffers. */
static uint8_t *mirror(const void *p) {
  const uint8_t *c = p;
  if (c >= dsend && c < dsend + dbytes) return hsend + (c - dsend);
  return hrecv + (c - drecv);
}

static void sync_stream(void) {
  if (dev) check_dev(dev->stream_sync(stream), "stream_sync");
}

static void check_gw(gw_result_t r, const char *what) {
  if (r != GW_SUCCESS) die("%s failed: %s: %s", what, gw_strerror(r), gw_comm_last_error(comm));
}

static void run_once(const struct opts *o, gw_dtype_t dt, int op, const void *send, void *recv, size_t count) {
  switch (o->coll) {
    case C_ALLREDUCE: check_gw(gw_allreduce(send, recv, count, dt, (gw_op_t)op, comm, stream), "gw_allreduce"); break;
    case C_ALLGATHER: check_gw(gw_allgather(send, recv, count, dt, comm, stream), "gw_allgather"); break;
    case C_REDUCE_SCATTER:
      check_gw(gw_reduce_scatter(send, recv, count, dt, (gw_op_t)op, comm, stream), "gw_reduce_scatter");
      break;
    case C_BROADCAST: check_gw(gw_broadcast(send, recv, count, dt, o->root, comm, stream), "gw_broadcast"); break;
  }
}

/* Where a run's buffers are: send and recv for the call (in place inside
 * recvbuf), the elements each holds, and how far the checked span of the
 * output reaches (in place the input may end later: reduce_scatter's holds
 * every rank's part). */
struct layout {
  uint8_t *send, *recv;
  size_t in_elems, out_elems, tail;
};

static struct layout layout_of(const struct opts *o, gw_dtype_t dt, uint8_t *sendbuf, uint8_t *recvbuf, size_t count,
                               bool in_place) {
  size_t es = gw_dtype_size(dt);
  struct layout l = {sendbuf, recvbuf, o->coll == C_REDUCE_SCATTER ? count * (size_t)nranks : count,
                     o->coll == C_ALLGATHER ? count * (size_t)nranks : count, 0};
  if (in_place) {
    l.send = recvbuf;
    if (o->coll == C_ALLGATHER) l.send = recvbuf + (size_t)rank * count * es;
    if (o->coll == C_REDUCE_SCATTER) l.recv = recvbuf + (size_t)rank * count * es;
  }
  l.tail = l.out_elems * es;
  if (in_place && l.send + l.in_elems * es > l.recv + l.tail) l.tail = (size_t)(l.send + l.in_elems * es - l.recv);
  return l;
}

/* The 64 bytes after the checked span: nothing may write there. */
enum { SLACK = 64 };

/* 1 when the ranks' outputs of an allreduce, allgather or broadcast are not
 * the same bits (each rank's may pass on its own: a float product past the
 * integers the dtype holds is checked to a tolerance), else 0: a hash of
 * this rank's bytes against every rank's, one allreduce (MAX of h and -h). */
static long long ranks_differ(const struct opts *o, const uint8_t *out, size_t bytes) {
  if (o->coll == C_REDUCE_SCATTER || nranks < 2) return 0;
  uint64_t h = 1469598103934665603ull, w; /* FNV-1a's constants, a word at a time */
  size_t b = 0;
  for (; b + 8 <= bytes; b += 8) memcpy(&w, out + b, 8), h = (h ^ w) * 1099511628211ull, h ^= h >> 29;
  for (; b < bytes; b++) h = (h ^ out[b]) * 1099511628211ull;
  int64_t hm[2] = {(int64_t)(h >> 2), -(int64_t)(h >> 2)};
  check_gw(gw_allreduce(hm, hm, 2, GW_INT64, GW_MAX, comm, NULL), "gw_allreduce(output hashes)");
  return hm[0] != -hm[1];
}

/* The number of wrong output elements (and bytes written past the output, and
 * out of place input elements changed) that the last run left, and 1 more
 * where the ranks' outputs differ (ranks_differ).  An allreduce whose outputs
 * are the same bits everywhere: each rank checks its 1/n of the elements
 * against the exact reduction (n ranks' inputs per element) and counts each
 * wrong one n times, the number every rank checking all of them gave (summed
 * over the ranks), at 1/n of the cost; outputs that differ are each checked
 * whole. */
static long long count_wrong(const struct opts *o, gw_dtype_t dt, int op, const struct layout *l, size_t count,
                             bool in_place) {
  size_t es = gw_dtype_size(dt);
  uint8_t *hs = dev ? mirror(l->send) : l->send, *hr = dev ? mirror(l->recv) : l->recv;
  if (dev) {
    check_dev(dev->memcpy_async(hr, l->recv, l->tail + SLACK, stream), "copying the output out");
    if (!in_place) check_dev(dev->memcpy_async(hs, l->send, l->in_elems * es, stream), "copying the input out");
    sync_stream();
  }
  long long wrong = 0;
  for (size_t b = 0; b < SLACK; b++) wrong += hr[l->tail + b] != 0xff;
  uint8_t e[8];
  for (size_t i = 0; !in_place && i < l->in_elems; i++)
    gwp_input_elem(dt, rank, i, e), wrong += memcmp(hs + i * es, e, es) != 0;
  const long long differ = ranks_differ(o, hr, l->out_elems * es);
  size_t lo = 0, hi = l->out_elems;
  long long times = 1, out_wrong = 0;
  if (o->coll == C_ALLREDUCE && !differ && nranks > 1)
    lo = l->out_elems * (size_t)rank / (size_t)nranks, hi = l->out_elems * (size_t)(rank + 1) / (size_t)nranks,
    times = nranks;
  for (size_t i = lo; i < hi; i++) {
    bool ok;
    switch (o->coll) {
      case C_ALLREDUCE: ok = gwp_reduce_ok(dt, op, hr, i, i); break;
      case C_REDUCE_SCATTER: ok = gwp_reduce_ok(dt, op, hr, i, (size_t)rank * count + i); break;
      case C_ALLGATHER: gwp_input_elem(dt, (int)(i / count), i % count, e), ok = !memcmp(hr + i * es, e, es); break;
      default: gwp_input_elem(dt, o->root, i, e), ok = !memcmp(hr + i * es, e, es); break;
    }
    out_wrong += !ok;
  }
  return wrong + out_wrong * times + differ;
}

/* This rank's input (value_of with the salt now) into l->send. */
static void fill_input(gw_dtype_t dt, const struct layout *l) {
  uint8_t *hs = dev ? mirror(l->send) : l->send;
  const size_t es = gw_dtype_size(dt);
  for (size_t i = 0; i < l->in_elems; i++) gwp_input_elem(dt, rank, i, hs + i * es);
  if (dev) check_dev(dev->memcpy_async(l->send, hs, l->in_elems * es, stream), "copying the input in");
}

/* The whole output and the 64 bytes after it all ones (NaN in floats; never
 * an allgather's or broadcast's input), a reduction's output elements values
 * its check refuses (gwp_wrong_elem: all ones is a likely integer result),
 * then this rank's input (in place over part of the output). */
static void clear_and_fill(const struct opts *o, gw_dtype_t dt, int op, const struct layout *l, size_t count) {
  uint8_t *hr = dev ? mirror(l->recv) : l->recv;
  memset(hr, 0xff, l->tail + SLACK);
  uint8_t fixed[8];
  if ((o->coll == C_ALLREDUCE || o->coll == C_REDUCE_SCATTER) && !gwp_wrong_fixed(dt, op, fixed)) {
    const size_t es = gw_dtype_size(dt), first = o->coll == C_REDUCE_SCATTER ? (size_t)rank * count : 0;
    for (size_t i = 0; i < l->out_elems; i++) gwp_wrong_elem(dt, op, first + i, hr + i * es);
  } else if (o->coll == C_ALLREDUCE || o->coll == C_REDUCE_SCATTER) {
    const size_t es = gw_dtype_size(dt);
    bool bytewise = true; /* one byte repeated (the floats' all-ones NaN): a memset */
    for (size_t b = 1; b < es; b++) bytewise &= fixed[b] == fixed[0];
    if (bytewise && fixed[0] != 0xff) memset(hr, fixed[0], l->out_elems * es); /* 0xff: there already */
    else if (!bytewise)
      for (size_t i = 0; i < l->out_elems; i++) memcpy(hr + i * es, fixed, es);
  }
  if (dev) check_dev(dev->memcpy_async(l->recv, hr, l->tail + SLACK, stream), "clearing the output");
  fill_input(dt, l);
}

/* Fills the input and returns the number of wrong output elements after one
 * run (-1: not checked, -c 0). */
static long long fill_run_check(const struct opts *o, gw_dtype_t dt, int op, const struct layout *l, size_t count,
                                bool in_place) {
  if (!o->check) {
    run_once(o, dt, op, l->send, l->recv, count);
    return -1;
  }
  /* The output first holds wrong values (an earlier run's correct output, or
   * an in-place allgather's other blocks left as they were, must not pass for
   * this run's), then the input goes in (in place, over part of the output:
   * there a collective that wrote nothing would still pass where this rank's
   * input is the result, as for MAX or MIN, which out-of-place runs catch). */
  clear_and_fill(o, dt, op, l, count);
  /* A test hook: the checked run left out, as a collective that writes
   * nothing would do; every size must then count wrong elements. */
  if (!getenv("GW_PERF_TEST_SKIP_CHECKED_RUN")) run_once(o, dt, op, l->send, l->recv, count);
  /* A test hook: 1 added to the first output element, as a rank whose value
   * there is 1 counted twice would. */
  if (getenv("GW_PERF_TEST_NUDGE") && gwp_is_float(dt)) {
    uint8_t *hr = dev ? mirror(l->recv) : l->recv;
    if (dev) check_dev(dev->memcpy_async(hr, l->recv, gw_dtype_size(dt), stream), "reading the output"), sync_stream();
    gw_value_store(hr, dt, 0, gw_value_load(hr, dt, 0) + 1.0);
    if (dev) check_dev(dev->memcpy_async(l->recv, hr, gw_dtype_size(dt), stream), "nudging the output");
  }
  /* A test hook: rank 1's largest float output one unit off in its last
   * place, within the checks' tolerance past the exact integers (a rank that
   * reduced in another order or with another kernel). */
  if (getenv("GW_PERF_TEST_RANK1_ULP") && gwp_is_float(dt) && rank == 1 && l->out_elems) {
    uint8_t *hr = dev ? mirror(l->recv) : l->recv;
    const size_t es = gw_dtype_size(dt);
    if (dev) check_dev(dev->memcpy_async(hr, l->recv, l->out_elems * es, stream), "reading the output"), sync_stream();
    size_t big = 0;
    for (size_t i = 1; i < l->out_elems; i++)
      if (fabs(gw_value_load(hr, dt, i)) > fabs(gw_value_load(hr, dt, big))) big = i;
    hr[big * es] ^= 1; /* little-endian: the mantissa's last bit */
    if (dev) check_dev(dev->memcpy_async(l->recv, hr, l->out_elems * es, stream), "changing the output");
  }
  return count_wrong(o, dt, op, l, count, in_place);
}

/* Whether the timed runs leave the checked result: they repeat one call on an
 * unchanged input, except in place, where a reduction's output is the next
 * run's input (allgather's and broadcast's in place repeat alike). */
static bool timed_output_checkable(const struct opts *o, bool in_place) {
  return !in_place || o->coll == C_ALLGATHER || o->coll == C_BROADCAST;
}

static double bus_factor(int coll) {
  switch (coll) {
    case C_ALLREDUCE: return 2.0 * (nranks - 1) / nranks;
    case C_ALLGATHER:
    case C_REDUCE_SCATTER: return (double)(nranks - 1) / nranks;
    default: return 1.0;
  }
}

/* The bytes a size measures: whole elements, and for allgather and
 * reduce_scatter whole elements per rank. */
static size_t per_rank_count(const struct opts *o, gw_dtype_t dt, size_t bytes) {
  size_t count = bytes / gw_dtype_size(dt);
  return o->coll == C_ALLGATHER || o->coll == C_REDUCE_SCATTER ? count / (size_t)nranks : count;
}
static size_t measured_bytes(const struct opts *o, gw_dtype_t dt, size_t bytes) {
  return per_rank_count(o, dt, bytes) * gw_dtype_size(dt) *
         ((o->coll == C_ALLGATHER || o->coll == C_REDUCE_SCATTER) ? (size_t)nranks : 1);
}

static void measure(const struct opts *o, gw_dtype_t dt, int op, uint8_t *sendbuf, uint8_t *recvbuf, size_t bytes,
                    struct result *res) {
  size_t count = per_rank_count(o, dt, bytes);
  res->bytes = measured_bytes(o, dt, bytes);
  res->count = count; /* per rank for allgather and reduce_scatter, as nccl-tests' count column */
  for (int ip = 0; ip < 2; ip++) {
    const struct layout l = layout_of(o, dt, sendbuf, recvbuf, count, ip == 1);
    long long wrong = fill_run_check(o, dt, op, &l, count, ip == 1);
    /* The timed runs on other inputs, where their result is checked after. */
    const bool check_timed = o->check && timed_output_checkable(o, ip == 1);
    /* The output cleared too: with -w 0 it held the checked run's result,
     * often the timed runs' too (MAX and MIN, small integers), so timed runs
     * that wrote nothing passed there. */
    if (check_timed) gwp_value_salt = 1, clear_and_fill(o, dt, op, &l, count);
    for (int i = 0; i < o->warmup; i++) run_once(o, dt, op, l.send, l.recv, count);
    /* The warmup runs left the timed runs' result in place: cleared, so that
     * timed runs that write nothing are caught too. */
    if (check_timed && o->warmup) clear_and_fill(o, dt, op, &l, count);
    /* A test hook: the timed runs left out, as runs that wrote nothing would do
     * (looked up before the clock starts: an environment scan is a good part
     * of an 8-byte allreduce, counted against gradwire only). */
    const bool skip_timed = getenv("GW_PERF_TEST_SKIP_TIMED_RUNS") != NULL;
    sync_stream();
    check_gw(gw_barrier(comm), "gw_barrier");
    double t0 = now();
    for (int i = 0; i < o->iters && !skip_timed; i++) run_once(o, dt, op, l.send, l.recv, count);
    sync_stream();
    double t = (now() - t0) / o->iters;
    check_gw(gw_comm_last_path(comm, res->path[ip], sizeof res->path[ip]), "gw_comm_last_path");
    /* The timed runs' own result is checked where they leave it (data at the
     * wrong place, a write past the end, or runs that wrote nothing: their
     * inputs differ from the checked run's), and the output is checked again
     * after a fresh fill, as nccl-tests does: what shows only on repeated
     * operations (stale flags or chunks, a cached registration, wrapped
     * counters) is caught too. */
    if (check_timed) {
      /* A test hook: one timed result spoilt, as a fault of repeated calls would. */
      if (getenv("GW_PERF_TEST_SPOIL_TIMED")) {
        uint8_t bad[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}; /* never moved data */
        if (o->coll == C_ALLREDUCE || o->coll == C_REDUCE_SCATTER)
          gwp_wrong_elem(dt, op, o->coll == C_REDUCE_SCATTER ? (size_t)rank * count : 0, bad);
        if (dev) check_dev(dev->memcpy_async(l.recv, bad, gw_dtype_size(dt), stream), "spoiling the output");
        else memcpy(l.recv, bad, gw_dtype_size(dt));
      }
      wrong += count_wrong(o, dt, op, &l, count, ip == 1);
      gwp_value_salt = 0;
    }
    if (o->check) wrong += fill_run_check(o, dt, op, &l, count, ip == 1);
    /* The slowest rank's time is the collective's time. */
    check_gw(gw_allreduce(&t, &t, 1, GW_FLOAT64, GW_MAX, comm, NULL), "gw_allreduce(time)");
    if (o->check) check_gw(gw_allreduce(&wrong, &wrong, 1, GW_INT64, GW_SUM, comm, NULL), "gw_allreduce(wrong)");
    res->time_us[ip] = t * 1e6;
    res->algbw[ip] = t > 0 ? (double)res->bytes / t / 1e9 : 0;
    res->busbw[ip] = res->algbw[ip] * bus_factor(o->coll);
    res->wrong[ip] = wrong;
  }
}

/* Before a sweep (each datatype and operation): the warmup's count of runs
 * at the largest size, then at the smallest, out of place, as nccl-tests'
 * TimeTest does.  Every buffer and FIFO slot a size will use has then been
 * used once: the first access through a page can cost a trap on virtual
 * machines with shadow page tables (5 us a page on this project's test
 * machine, read or write, MAP_POPULATE or not: 0.7 ms per 256 KiB FIFO
 * slot and end), which otherwise fell in the
 * timed runs of the first sizes that reach further into the slots
 * (out-of-place 16-256 KiB measured 3-4x their in-place times with -w 5). */
static void warm_sweep(const struct opts *o, gw_dtype_t dt, int op, uint8_t *sendbuf, uint8_t *recvbuf) {
  const size_t sizes[2] = {o->max_bytes, o->min_bytes};
  for (int k = 0; k < 2; k++) {
    const size_t count = per_rank_count(o, dt, sizes[k]);
    if (count == 0) continue;
    for (int i = 0; i < o->warmup; i++) run_once(o, dt, op, sendbuf, recvbuf, count);
  }
  sync_stream();
}

/* Host memory for the buffers, every rank of this machine's, against what the
 * machine has available: more, and the ranks were OOM-killed while faulting
 * their pages in (mmap succeeds under overcommit), which gw-run could only
 * report as a killed rank.  Decided by every rank together, each having read
 * its machine's figure before any rank allocates (a rank reading after
 * another's buffers were in would see them gone, and refuse alone). */
static void check_memory(size_t buf_bytes, bool device) {
  int local = 1;
  if (gw_comm_local_size(comm, &local) != GW_SUCCESS || local < 1) local = 1;
  FILE *f = fopen("/proc/meminfo", "r");
  unsigned long long kib = 0;
  char line[160];
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  if (f) fclose(f);
  /* A container's or a job's memory limit (its cgroup) is tighter than the
   * machine's: /proc/meminfo is the machine's, and the pre-faulted buffers
   * went past the limit, the kernel killing the ranks (a helper's probe).
   * The ranks of this machine are taken to share the cgroup. */
  const long long cg = gw__cgroup_mem_left();
  const bool by_cgroup = cg > 0 && (!kib || (unsigned long long)cg / 1024 < kib);
  if (by_cgroup) kib = (unsigned long long)cg / 1024 ? (unsigned long long)cg / 1024 : 1;
  /* the emulator's device memory is host memory too (memfd, pre-faulted) */
  const struct gw_dev_ops *d = device ? gw__dev() : NULL;
  const bool emulated = d && strcmp(d->name, "emulated") == 0;
  const double need = (emulated ? 4.0 : 2.0) * (double)buf_bytes * local, have = (double)kib * 1024;
  /* the worst machine's shortfall (need / have; 0 where it cannot tell) */
  double worst = kib ? need / (0.9 * have) : 0;
  check_gw(gw_allreduce(&worst, &worst, 1, GW_FLOAT64, GW_MAX, comm, NULL), "gw_allreduce(memory)");
  if (worst > 1 && !(kib && need > 0.9 * have))
    die("-e %zu: another machine of the job has too little memory available for the buffers (it says so)",
        buf_bytes - 64);
  if (worst > 1)
    die("-e %zu: the send and receive buffers (%s) of %d rank%s on this machine need %.1f GiB, and it has %.1f "
        "GiB available%s: lower -e", buf_bytes - 64,
        emulated ? "emulated device memory in host memory, and their pinned host copies"
        : device ? "their pinned host copies" : "host memory", local,
        local > 1 ? "s" : "", need / 1073741824.0, have / 1073741824.0,
        by_cgroup ? " under its cgroup's memory limit" : "");
}

static void *alloc_prefaulted(size_t bytes) {
  if (bytes == 0) bytes = 64;
  /* Pre-faulted once: first-touch page faults would otherwise dominate big sizes. */
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) die("cannot allocate %zu bytes: %s", bytes, strerror(errno));
  return p;
}

/* gw-perf-run.h: the pieces above, for gw-perf-tune.c */
gw_comm_t gwp_comm(void) { return comm; }
int gwp_rank(void) { return rank; }
int gwp_nranks(void) { return nranks; }
void gwp_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vdie(1, fmt, ap);
}
void gwp_check(gw_result_t r, const char *what) { check_gw(r, what); }
double gwp_now(void) { return now(); }
void *gwp_alloc_prefaulted(size_t bytes) { return alloc_prefaulted(bytes); }

/* The options every rank must run with, as "key=value" words (optwords.h):
 * the sweep, the checks, the collective and its buffers, --tune; and whether
 * rank 0's own flags are given (--csv, --json: rank 0 writes them; --min-bw:
 * rank 0 decides), which may be given on rank 0 alone (its machine has the
 * folder) but not on another rank alone (nothing was written, or the run
 * stopped there alone).  -a and -p the library compares (GW_ALGO, GW_PROTO). */
static void describe_opts(const struct opts *o, char *buf, size_t cap) {
  char dts[256] = "", ops[128] = "";
  for (int i = 0, at = 0; i < o->ndtypes && at < (int)sizeof dts; i++)
    at += snprintf(dts + at, sizeof dts - (size_t)at, "%s%s", i ? "," : "", gw_dtype_name((gw_dtype_t)o->dtypes[i]));
  for (int i = 0, at = 0; i < o->nops && at < (int)sizeof ops; i++)
    at += snprintf(ops + at, sizeof ops - (size_t)at, "%s%s", i ? "," : "", gw_op_name((gw_op_t)o->ops[i]));
  snprintf(buf, cap, "gw-perf -b=%zu -e=%zu -f=%.17g -i=%zu -n=%d -w=%d -c=%d -C=%s -r=%d -R=%d -D=%d -d=%s -o=%s "
           "--min-bw=%s --csv=%s --json=%s --tune=%s", o->min_bytes, o->max_bytes, o->factor, o->step_bytes,
           o->iters, o->warmup, o->check, coll_names[o->coll], o->root, o->reg, o->device, dts, ops, o->min_bw > 0 ? "given" : "none",
           o->csv ? "given" : "none", o->json ? "given" : "none", o->tune ? "given" : "none");
}

static const char *const rank0_flags[] = {"--csv", "--json", "--min-bw", NULL};

/* Every rank's options against rank 0's: one that differs ran other sizes or
 * checks than its peers (their calls then mismatched, "collective calls
 * differ", naming no flag) or stopped alone (--min-bw: rank 0 decides).
 * Each rank that differs names the flags; the others say that it does. */
static void same_options_everywhere(struct opts *o) {
  char mine[1024], r0[1024], diff[900];
  memset(mine, 0, sizeof mine);
  describe_opts(o, mine, sizeof mine);
  memcpy(r0, mine, sizeof r0);
  if (gw_broadcast(r0, r0, sizeof r0, GW_UINT8, 0, comm, NULL) != GW_SUCCESS)
    die("comparing the options with rank 0's: %s", gw_comm_last_error(comm));
  r0[sizeof r0 - 1] = 0;
  char why[1000] = "";
  if (opt_words_diff(r0, mine, rank0_flags, diff, sizeof diff) > 0)
    snprintf(why, sizeof why, "this rank's options are not rank 0's (rank 0's -> this rank's): %s", diff);
  for (int i = 0; rank0_flags[i] && !why[0]; i++) {
    char none[32];
    snprintf(none, sizeof none, " %s=none", rank0_flags[i]);
    if (strstr(r0, none) && !strstr(mine, none))
      snprintf(why, sizeof why, "%s is given here and not on rank 0 (%s: give it to rank 0)", rank0_flags[i],
               i < 2 ? "rank 0 writes the file" : "rank 0 decides");
  }
  const int differs = why[0] != 0;
  int32_t last = differs ? rank + 1 : 0; /* the highest rank that differs, plus one */
  if (gw_allreduce(&last, &last, 1, GW_INT32, GW_MAX, comm, NULL) != GW_SUCCESS)
    die("comparing the options with rank 0's: %s", gw_comm_last_error(comm));
  if (last) {
    /* Every rank says its part before any exits: gw-run stops the others at
     * the first exit, and the line of the rank that names the flags was lost
     * when rank 0 got there first. */
    if (differs) say("%s", why);
    else say("rank %d runs with options other than rank 0's (its message names them)", last - 1);
    fflush(NULL);
    gw_barrier(comm);
    exit(2);
  }
  /* rank 0's --min-bw on every rank (given to rank 0 alone): each decides
   * alike whether the run failed, and all wait for rank 0 before exiting 1
   * (a rank without it exited 0 and left rank 0's barrier without it) */
  if (gw_broadcast(&o->min_bw, &o->min_bw, 1, GW_FLOAT64, 0, comm, NULL) != GW_SUCCESS)
    die("taking rank 0's --min-bw: %s", gw_comm_last_error(comm));
}

/* Rank 0 writes the output files: checked now, not after the measurement.
 * A refusal is told to every rank, and all exit 2 together: the peers, left
 * waiting in the next collective, exited 1 on rank 0's departure, and
 * gw-run's status was whichever exit it saw first (a flaky test). */
static void rank0_outputs_ok(const struct opts *o) {
  char err[1200] = "", why[1300] = "";
  if (rank == 0) {
    const char *flag[3] = {"--tune", "--csv", "--json"}, *file[3] = {o->tune, o->csv, o->json};
    /* the tuning file is replaced whole (a rename): a device or FIFO is refused */
    for (int i = 0; i < 3 && !why[0]; i++)
      if (file[i] && (i == 0 ? replaced_path_ok(flag[i], file[i], OUTPATH_TEMP_TUNE, err, sizeof err)
                             : output_path_ok(flag[i], file[i], err, sizeof err)) != 0)
        snprintf(why, sizeof why, "%s", err);
    /* and it replaces a tuning file only (a checkpoint given by mistake was replaced) */
    if (!why[0] && o->tune && gw__tune_replaceable(o->tune, err, sizeof err) != 0)
      snprintf(why, sizeof why, "--tune %s: %s", o->tune, err);
  }
  int32_t refused = why[0] != 0;
  if (nranks > 1 && gw_broadcast(&refused, &refused, 1, GW_INT32, 0, comm, NULL) != GW_SUCCESS)
    die("taking rank 0's check of its output files: %s", gw_comm_last_error(comm));
  if (!refused) return;
  if (rank == 0) say("%s", why);
  else say("rank 0 refused its output file (its message names it)");
  fflush(NULL);
  if (nranks > 1) gw_barrier(comm);
  exit(2);
}

int main(int argc, char **argv) {
  signal(SIGXFSZ, SIG_IGN); /* past ulimit -f, --csv / --json / --tune writes fail with EFBIG, said */
  struct opts o = {.min_bytes = 8, .max_bytes = 64u << 20, .factor = 2, .iters = 20, .warmup = 5, .check = 1,
                   .coll = C_ALLREDUCE, .root = 0};
  o.dtypes[o.ndtypes++] = GW_FLOAT32;
  o.ops[o.nops++] = GW_SUM;
  const char *algo_flag = NULL;
  char given[32] = ""; /* the short options given, for those that do not apply */
  static const struct option longopts[] = {
      {"minbytes", required_argument, 0, 'b'}, {"maxbytes", required_argument, 0, 'e'},
      {"stepfactor", required_argument, 0, 'f'}, {"stepbytes", required_argument, 0, 'i'},
      {"iters", required_argument, 0, 'n'},
      {"warmup_iters", required_argument, 0, 'w'}, {"datatype", required_argument, 0, 'd'},
      {"op", required_argument, 0, 'o'}, {"check", required_argument, 0, 'c'},
      {"algo", required_argument, 0, 'a'}, {"collective", required_argument, 0, 'C'},
      {"root", required_argument, 0, 'r'}, {"csv", required_argument, 0, 1},
      {"json", required_argument, 0, 2}, {"help", no_argument, 0, 'h'}, {"proto", required_argument, 0, 'p'},
      {"tune", required_argument, 0, 3}, {"register", no_argument, 0, 'R'}, {"device", no_argument, 0, 'D'},
      {"ngpus", required_argument, 0, 'g'}, {"nthreads", required_argument, 0, 't'},
      {"min-bw", required_argument, 0, 4}, {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "b:e:f:i:n:w:d:o:c:a:C:r:p:g:t:RDh", longopts, NULL)) != -1) {
    if (c > ' ' && c < 127 && !strchr(given, c) && strlen(given) + 1 < sizeof given) given[strlen(given)] = (char)c;
    switch (c) {
      case 'b': o.min_bytes = gwp_parse_size(optarg, "-b"); break;
      case 'e': o.max_bytes = gwp_parse_size(optarg, "-e"); break;
      case 'f': {
        char *end;
        errno = 0;
        o.factor = strtod(optarg, &end);
        /* inf (or 1e999) measured one size and said nothing of the rest */
        if (errno || end == optarg || *end || !gw_decimal_text(optarg) || !(o.factor > 1.0 && isfinite(o.factor)))
          gwp_bad_use("-f '%s' must be a number greater than 1", optarg);
        break;
      }
      case 'i':
        o.step_bytes = gwp_parse_size(optarg, "-i");
        if (!o.step_bytes) gwp_bad_use("-i '%s' must be at least one byte", optarg);
        break;
      case 'n': o.iters = gwp_parse_int_arg(optarg, 1, 1000000, "-n"); break;
      case 'w': o.warmup = gwp_parse_int_arg(optarg, 0, 1000000, "-w"); break;
      case 'c': o.check = gwp_parse_int_arg(optarg, 0, 1, "-c"); break;
      case 'r': o.root = gwp_parse_int_arg(optarg, 0, 1 << 20, "-r"); break;
      case 'g':
      case 't': /* nccl-tests' GPUs per thread and threads per process: one each here */
        if (strcmp(optarg, "1"))
          gwp_bad_use("-%c '%s': a gw-perf rank is one process with one GPU (nccl-tests' -g 1 -t 1); start N ranks with "
              "gw-run -n N", c, optarg);
        break;
      case 'R': o.reg = 1; break;
      case 'D': o.device = 1; break;
      case 'd':
        o.ndtypes = 0;
        if (!strcasecmp(optarg, "all")) {
          for (int i = 0; i < GW_NUM_DTYPES; i++) o.dtypes[o.ndtypes++] = i;
        } else {
          int dt = gw_dtype_from_name(optarg);
          if (dt < 0)
            gwp_bad_use("-d '%s' is not a dtype (int8 uint8 int32 int64 float16 bfloat16 float32 float64 all)", optarg);
          o.dtypes[o.ndtypes++] = dt;
        }
        break;
      case 'o':
        o.nops = 0;
        if (!strcasecmp(optarg, "all")) {
          for (int i = 0; i < GW_NUM_OPS; i++) o.ops[o.nops++] = i;
        } else {
          int op = gw_op_from_name(optarg);
          if (op < 0) gwp_bad_use("-o '%s' is not an op (sum prod max min avg all)", optarg);
          o.ops[o.nops++] = op;
        }
        break;
      case 'a':
        /* The library reads GW_ALGO when the communicator is made, just below. */
        if (strcmp(optarg, "ring") && strcmp(optarg, "tree") && strcmp(optarg, "exchange") && strcmp(optarg, "auto"))
          gwp_bad_use("-a '%s': unknown algorithm (available: auto, ring, tree, exchange)", optarg);
        setenv("GW_ALGO", optarg, 1);
        algo_flag = optarg;
        break;
      case 'p':
        if (strcmp(optarg, "simple") && strcmp(optarg, "ll") && strcmp(optarg, "auto"))
          gwp_bad_use("-p '%s': unknown protocol (available: auto, simple, ll)", optarg);
        setenv("GW_PROTO", optarg, 1);
        break;
      case 3: o.tune = optarg; break;
      case 4: {
        char *end;
        errno = 0;
        o.min_bw = strtod(optarg, &end);
        if (errno || end == optarg || *end || !gw_decimal_text(optarg) || !(o.min_bw > 0) || isinf(o.min_bw))
          gwp_bad_use("--min-bw '%s' must be a bus bandwidth in GB/s above 0", optarg);
        break;
      }
      case 'C': {
        int found = -1;
        for (int i = 0; i < 4; i++)
          if (!strcmp(optarg, coll_names[i])) found = i;
        if (found < 0) gwp_bad_use("-C '%s' is not one of allreduce, allgather, reduce_scatter, broadcast", optarg);
        o.coll = found;
        break;
      }
      case 1: o.csv = optarg; break;
      case 2: o.json = optarg; break;
      case 'h': gwp_usage(stdout); return 0;
      default: gwp_usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    gwp_usage(stderr);
    gwp_bad_use("unexpected argument '%s'", argv[optind]);
  }
  if (o.min_bytes > o.max_bytes) gwp_bad_use("-b %zu is larger than -e %zu", o.min_bytes, o.max_bytes);
  if (strchr(given, 'f') && strchr(given, 'i')) gwp_bad_use("-f and -i both say how the size steps: give one of them");
  { /* a factor just above 1 (or a small -i) steps a byte at a time: millions of sizes would run for days */
    long nsizes = 0;
    for (double sz = (double)o.min_bytes; sz <= (double)o.max_bytes && nsizes <= MAX_SIZES; nsizes++)
      sz = next_size(&o, sz);
    if (nsizes > MAX_SIZES && o.step_bytes)
      gwp_bad_use("-b %zu -e %zu -i %zu makes more than %d steps: take a larger -i or a narrower range", o.min_bytes,
          o.max_bytes, o.step_bytes, MAX_SIZES);
    if (nsizes > MAX_SIZES)
      gwp_bad_use("-b %zu -e %zu -f %.15g makes more than %d steps: take a larger -f or a narrower range", o.min_bytes,
          o.max_bytes, o.factor, MAX_SIZES);
  }
  /* The tree and the exchange reduce: the other collectives always take the
   * ring, so -a would name an algorithm the measurement never ran. */
  if (algo_flag && (!strcmp(algo_flag, "tree") || !strcmp(algo_flag, "exchange")) && o.coll != C_ALLREDUCE)
    gwp_bad_use("-a %s applies to allreduce only: %s always runs on the ring (drop -a, or -a ring)", algo_flag,
        coll_names[o.coll]);
  if (o.reg && o.device) /* (refused only after the rendezvous and the memory check) */
    gwp_bad_use("-R and -D: registering device memory is not supported yet");
  if (o.csv && o.json && same_output_file(o.csv, o.json))
    gwp_bad_use("--csv %s and --json %s name the same file (one would overwrite the other)", o.csv, o.json);
  if (o.tune && (o.csv || o.json || o.min_bw))
    gwp_bad_use("--tune writes the tuning file only: --csv, --json and --min-bw do not apply (run gw-perf without --tune "
            "for them)");
  /* --tune measures its own sizes of float32 allreduce with every algorithm
   * and protocol on host memory: anything else would be ignored, or (an
   * algorithm forced) drop this world size's rows of the others from the file. */
  for (const char *g = given; o.tune && *g; g++)
    if (*g != 'h') gwp_bad_use("--tune measures its own sizes, algorithms and protocols: -%c does not apply", *g);
  for (int i = 0; o.tune && i < 2; i++) {
    const char *v = getenv(i ? "GW_PROTO" : "GW_ALGO");
    if (v && *v && strcasecmp(v, "auto")) /* (the library takes AUTO too) */
      gwp_bad_use("--tune measures every algorithm and protocol: unset %s (it is %s)", i ? "GW_PROTO" : "GW_ALGO", v);
  }
  if (strchr(given, 'o') && o.coll != C_ALLREDUCE && o.coll != C_REDUCE_SCATTER)
    gwp_bad_use("-o applies to allreduce and reduce_scatter: %s reduces nothing", coll_names[o.coll]);
  if (strchr(given, 'r') && o.coll != C_BROADCAST) gwp_bad_use("-r (the root) applies to -C broadcast only");
  gw_result_t r = gw_comm_init_env(&comm);
  if (r != GW_SUCCESS) die("gw_comm_init_env failed: %s: %s", gw_strerror(r), gw_comm_last_error(NULL));
  gw_comm_rank(comm, &rank);
  gw_comm_size(comm, &nranks);
  if (nranks > 1) same_options_everywhere(&o);
  if (o.root >= nranks) gwp_bad_use("-r %d is not a rank of %d", o.root, nranks);
  if (o.tune && nranks < 2) /* (the file's rows are for world sizes of 2 and more: refused after the whole measurement) */
    gwp_bad_use("--tune measures between ranks: run it on 2 ranks or more (gw-run -n 2 gw-perf --tune %s)", o.tune);
  rank0_outputs_ok(&o);
  if (o.coll != C_ALLREDUCE && o.coll != C_REDUCE_SCATTER) o.nops = 1, o.ops[0] = GW_SUM;
  /* A sweep whose every size rounds down to no element (of a rank's share,
   * for allgather and reduce_scatter) measured empty operations under sizes
   * that said otherwise, and passed.  -e 0 asks for the empty one. */
  for (int di = 0; di < o.ndtypes && o.max_bytes > 0; di++) {
    const gw_dtype_t dt = (gw_dtype_t)o.dtypes[di];
    const bool shared = o.coll == C_ALLGATHER || o.coll == C_REDUCE_SCATTER;
    const size_t need = gw_dtype_size(dt) * (shared ? (size_t)nranks : 1);
    if (measured_bytes(&o, dt, o.max_bytes) == 0)
      gwp_bad_use("-e %zu: no size up to it holds a whole %s element (%zu bytes)%s%s%s, so %s would measure nothing: "
              "take -e %zu or more", o.max_bytes, gw_dtype_name(dt), gw_dtype_size(dt),
              shared ? " for each rank (" : "", shared ? coll_names[o.coll] : "", shared ? " splits the size)" : "",
              gw_dtype_name(dt), need);
  }

  if (o.tune) return gwp_tune(o.tune);
  size_t buf_bytes = o.max_bytes + 64;
  check_memory(buf_bytes, o.device);
  uint8_t *sendbuf, *recvbuf;
  if (o.device) {
    if (!(dev = gw__dev())) die("-D: no device: %s", gw__dev_absent_reason());
    dbytes = buf_bytes;
    check_dev(dev->stream_create(&stream), "stream_create");
    check_dev(dev->alloc((void **)&dsend, dbytes), "allocating device memory");
    check_dev(dev->alloc((void **)&drecv, dbytes), "allocating device memory");
    check_dev(dev->host_alloc((void **)&hsend, dbytes), "allocating pinned host memory");
    check_dev(dev->host_alloc((void **)&hrecv, dbytes), "allocating pinned host memory");
    sendbuf = dsend, recvbuf = drecv;
  } else {
    sendbuf = alloc_prefaulted(buf_bytes), recvbuf = alloc_prefaulted(buf_bytes);
  }
  void *reg_send = NULL, *reg_recv = NULL;
  if (o.reg && (gw_comm_register(comm, sendbuf, buf_bytes, &reg_send) != GW_SUCCESS ||
                gw_comm_register(comm, recvbuf, buf_bytes, &reg_recv) != GW_SUCCESS))
    die("-R: %s", gw_comm_last_error(comm));

  FILE *csv = NULL, *json = NULL;
  if (rank == 0 && o.csv) {
    csv = fopen(o.csv, "w");
    if (!csv) die("cannot write %s: %s", o.csv, strerror(errno));
    fprintf(csv, "size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,"
                 "ip_wrong,oop_path,ip_path\n");
  }
  if (rank == 0 && o.json) {
    json = fopen(o.json, "w");
    if (!json) die("cannot write %s: %s", o.json, strerror(errno));
    gwp_json_begin(json, coll_names[o.coll], nranks);
  }
  if (rank == 0) {
    printf("# gw-perf: %s, %d ranks, %d iterations, %d warmup, check %d, %s memory\n", coll_names[o.coll], nranks,
           o.iters, o.warmup, o.check, dev ? (strcmp(dev->name, "cuda") ? "emulated device" : "device") : "host");
    /* time: each rank's mean over the -n runs, the slowest rank's (nccl-tests
     * takes the ranks' mean by default); #wrong: elements, plus bytes written
     * past the output and (out of place) input elements changed */
    printf("# time: the slowest rank's mean; path: what ran (algorithm/protocol, or the device ring)\n");
    printf("# #wrong: over a size's checks (before the timed runs, their own result, after a fresh fill), wrong\n"
           "# elements plus bytes written past the output and (out of place) input elements changed, summed\n"
           "# over the ranks; and where the ranks' results are not the same bits, every rank counts 1 per check\n");
    printf("#                                                       out-of-place                       in-place\n");
    printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong  path\n");
    printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n");
    fflush(stdout);
  }
  double bw_sum = 0;
  int bw_n = 0;
  long long total_wrong = 0;
  bool first_json = true;
  for (int di = 0; di < o.ndtypes; di++)
    for (int oi = 0; oi < o.nops; oi++) {
      warm_sweep(&o, (gw_dtype_t)o.dtypes[di], o.ops[oi], sendbuf, recvbuf);
      for (double sz = (double)o.min_bytes, last = -1; sz <= (double)o.max_bytes; sz = next_size(&o, sz)) {
        gw_dtype_t dt = (gw_dtype_t)o.dtypes[di];
        /* sizes round down to whole elements (per rank for allgather and
         * reduce_scatter): each measured size once */
        const double whole = (double)measured_bytes(&o, dt, (size_t)sz);
        if (whole == last) continue;
        last = whole;
        struct result res;
        gwp_choose_values(o.coll == C_ALLREDUCE || o.coll == C_REDUCE_SCATTER, dt, o.ops[oi], nranks);
        measure(&o, dt, o.ops[oi], sendbuf, recvbuf, (size_t)sz, &res);
        if (o.check) total_wrong += res.wrong[0] + res.wrong[1];
        /* both columns, as nccl-tests' average */
        bw_sum += res.busbw[0] + res.busbw[1];
        bw_n += 2;
        if (rank != 0) continue;
        const char *opn = (o.coll == C_ALLREDUCE || o.coll == C_REDUCE_SCATTER) ? gw_op_name((gw_op_t)o.ops[oi]) : "none";
        int root = o.coll == C_BROADCAST ? o.root : -1;
        /* Unchecked (-c 0): "N/A" (nccl-tests' way), empty in the CSV, null in the JSON. */
        char num[2][24];
        const char *w[2], *wc[2], *wj[2];
        for (int k = 0; k < 2; k++) {
          snprintf(num[k], sizeof num[k], "%lld", res.wrong[k]);
          w[k] = o.check ? num[k] : "N/A", wc[k] = o.check ? num[k] : "", wj[k] = o.check ? num[k] : "null";
        }
        char path[72]; /* one name when both ran alike */
        if (strcmp(res.path[0], res.path[1])) snprintf(path, sizeof path, "%s,%s", res.path[0], res.path[1]);
        else snprintf(path, sizeof path, "%s", res.path[0]);
        char tm[2][24]; /* 7 wide: 1 decimal from 100 us on, none from 10 ms, as nccl-tests */
        for (int k = 0; k < 2; k++)
          snprintf(tm[k], sizeof tm[k], "%7.*f", res.time_us[k] < 1e2 ? 2 : res.time_us[k] < 1e4 ? 1 : 0,
                   res.time_us[k]);
        printf("%12zu  %12zu  %8s  %6s  %6d  %s  %6.2f  %6.2f  %5s  %s  %6.2f  %6.2f  %5s  %s\n", res.bytes, res.count,
               gw_dtype_name(dt), opn, root, tm[0], res.algbw[0], res.busbw[0], w[0], tm[1], res.algbw[1],
               res.busbw[1], w[1], path);
        fflush(stdout);
        if (csv)
          fprintf(csv, "%zu,%zu,%s,%s,%d,%.3f,%.4f,%.4f,%s,%.3f,%.4f,%.4f,%s,%s,%s\n", res.bytes, res.count,
                  gw_dtype_name(dt), opn, root, res.time_us[0], res.algbw[0], res.busbw[0], wc[0],
                  res.time_us[1], res.algbw[1], res.busbw[1], wc[1], res.path[0], res.path[1]);
        if (csv) fflush(csv); /* whole rows so far, should the run be stopped (a time limit) */
        if (json) {
          char row[1536];
          snprintf(row, sizeof row,
                  "%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"root\": %d, "
                  "\"oop_time_us\": %.3f, \"oop_algbw\": %.4f, \"oop_busbw\": %.4f, \"oop_wrong\": %s, "
                  "\"ip_time_us\": %.3f, \"ip_algbw\": %.4f, \"ip_busbw\": %.4f, \"ip_wrong\": %s, "
                  "\"oop_path\": \"%s\", \"ip_path\": \"%s\"}",
                  first_json ? "" : ",", res.bytes, res.count, gw_dtype_name(dt), opn, root, res.time_us[0],
                  res.algbw[0], res.busbw[0], wj[0], res.time_us[1], res.algbw[1], res.busbw[1], wj[1],
                  res.path[0], res.path[1]);
          gwp_json_row(json, row);
          first_json = false;
        }
      }
    }
  double avg = bw_n ? bw_sum / bw_n : 0;
  /* the same on every rank: each time is the slowest rank's */
  const bool slow = o.min_bw > 0 && !(avg >= o.min_bw);
  if (rank == 0) {
    if (o.check) printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    else printf("# Out of bounds values : N/A (not checked: -c 0)\n");
    if (o.min_bw > 0) printf("# Avg bus bandwidth    : %g %s (--min-bw %g)\n", avg, slow ? "FAILED" : "OK", o.min_bw);
    else printf("# Avg bus bandwidth    : %g\n", avg);
    fflush(stdout);
  }
  /* A full disk must not pass for a finished run with a cut file, nor a
   * table that never reached standard output (a full disk, a closed pipe) for one that did. */
  const int csv_errno = errno; /* (the CSV's failed write's, said below) */
  errno = 0;
  const bool out_failed = rank == 0 && (fflush(stdout) != 0 || ferror(stdout));
  const int out_errno = errno ? errno : EIO; /* (a failed earlier write's errno is gone: EIO then) */
  errno = csv_errno;
  if (csv && (ferror(csv) | fclose(csv))) die("--csv %s: writing failed: %s", o.csv, strerror(errno));
  if (json) {
    char tw[24] = "null";
    if (o.check) snprintf(tw, sizeof tw, "%lld", total_wrong);
    gwp_json_end(json, avg, o.check, tw);
    if (ferror(json) | fclose(json)) die("--json %s: writing failed: %s", o.json, strerror(errno));
  }
  if (out_failed) die("writing the results to standard output failed: %s", strerror(out_errno));
  /* Wrong results exit 1, and gw-run stops the job at the first rank that
   * fails: every rank waits here until rank 0 has written its table (the
   * count is every rank's sum, so all agree to wait). */
  if (total_wrong > 0 || slow) check_gw(gw_barrier(comm), "gw_barrier (before exiting with a failure)");
  gw_comm_deregister(comm, reg_send);
  gw_comm_deregister(comm, reg_recv);
  if (dev) {
    sync_stream();
    dev->free(dsend), dev->free(drecv), dev->host_free(hsend), dev->host_free(hrecv);
    dev->stream_destroy(stream);
  }
  gw_comm_destroy(comm);
  return total_wrong || slow ? 1 : 0;
}
