/* dev_emu.c - the device emulator (GW_DEV_EMULATE=N): the device layer's
 * contract (dev.h) in host memory, so the stream-ordered collectives and what
 * sits on them are tested without a GPU.
 *   - Device memory is a memfd mapping, recorded in a registry of ranges; that
 *     registry is what makes a pointer "device" (ptr_kind).  Another process
 *     maps it from an IPC handle (pid, fd, size) with pidfd_getfd, as the verbs
 *     emulator reaches its peers' segments.
 *   - A stream is a thread that runs its work items in order (copies,
 *     reductions through the host kernels, flag writes and waits, sleeps).
 *     Created streams are independent, as cudaStreamNonBlocking ones are; the
 *     default (NULL) stream is one more such thread per process (the legacy
 *     stream's implicit synchronization with other streams is not emulated).
 *   - free, host_free and ipc_close wait until every stream of the calling
 *     thread's device has finished what was queued on it before the call, as cudaFree,
 *     cudaFreeHost and cudaIpcCloseMemHandle synchronize the device: code
 *     that frees while a stream waits for something that comes only after the
 *     free hangs here as it does on a GPU (with a note on stderr after 10 s).
 *   - Devices are numbers 0..N-1 chosen per thread with set_device; nothing
 *     else differs between them.  ptr_kind on a thread that chose none makes
 *     it use device 0, as CUDA runtime calls make device 0's primary context
 *     current on such a thread.
 * What it cannot show: a kernel's speed, or the host touching device memory by
 * mistake (it is host memory here). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "dev.h"

static void device_sync_all(const char *what);

static int emu_ndev = 1;
static _Thread_local char emu_errbuf[256];
static _Thread_local int cur_dev;
static _Thread_local bool dev_chosen;

__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(emu_errbuf, sizeof emu_errbuf, fmt, ap);
  va_end(ap);
  return 1;
}

static const char *emu_error(void) { return emu_errbuf; }

/* gw__dev_emu_fault_after (tests): the n-th stream item run from then on
 * faults, as a kernel's illegal address does on a GPU: it and every item after
 * it, on every stream, do nothing (a flag wait too: a dead context runs
 * nothing), and every later call that would reach the device fails, sticky,
 * as a CUDA context's error makes every runtime call fail.  Frees, closes and
 * stream destroys still release (the process's memory is host memory here;
 * cudaFree returns the error and the context is lost anyway). */
static _Atomic long fault_items_left = -1;
static atomic_bool faulted;
#define EMU_STICKY "an illegal memory access was encountered (the device emulator's injected fault; sticky, as cudaErrorIllegalAddress)"

void gw__dev_emu_fault_after(long n) {
  atomic_store(&faulted, false);
  atomic_store(&fault_items_left, n);
}

/* 1 with the sticky error once the emulated device faulted. */
static int sticky(void) { return atomic_load(&faulted) ? fail("%s", EMU_STICKY) : 0; }

/* On the stream's thread, before an item: whether it runs. */
static bool item_runs(void) {
  long left = atomic_load(&fault_items_left);
  while (left > 0 && !atomic_compare_exchange_weak(&fault_items_left, &left, left - 1)) {
  }
  if (left == 1) atomic_store(&faulted, true);
  return !atomic_load(&faulted);
}

/* ---- the registry of mappings ------------------------------------------------------ */
enum { R_DEVICE = 1, R_HOST = 2, R_IPC = 3 }; /* own device memory, pinned host, opened by IPC */
struct range {
  char *base;
  size_t size;
  int kind, device, fd;
};
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct range *ranges;
static int nranges, cap_ranges;

static int reg_add(struct range r) {
  pthread_mutex_lock(&reg_mu);
  if (nranges == cap_ranges) {
    int ncap = cap_ranges ? 2 * cap_ranges : 16;
    struct range *n = realloc(ranges, (size_t)ncap * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&reg_mu);
      return fail("emulated device: out of memory for the allocation registry");
    }
    ranges = n, cap_ranges = ncap;
  }
  ranges[nranges++] = r;
  pthread_mutex_unlock(&reg_mu);
  return 0;
}

/* Removes the range starting at p of one of the kinds in mask (bits 1 << kind). */
static bool reg_take(const void *p, unsigned mask, struct range *out) {
  bool found = false;
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < nranges; i++) {
    if (ranges[i].base == p && (mask & (1u << ranges[i].kind))) {
      *out = ranges[i];
      ranges[i] = ranges[--nranges];
      found = true;
      break;
    }
  }
  pthread_mutex_unlock(&reg_mu);
  return found;
}

static bool reg_find(const void *p, struct range *out) {
  const char *c = p;
  bool found = false;
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < nranges && !found; i++) {
    if (c >= ranges[i].base && c < ranges[i].base + ranges[i].size) {
      *out = ranges[i];
      found = true;
    }
  }
  pthread_mutex_unlock(&reg_mu);
  return found;
}

/* ---- devices -------------------------------------------------------------------------- */
static int emu_device_count(int *n) {
  *n = emu_ndev;
  return 0;
}

static int emu_get_device(int *dev) {
  *dev = cur_dev;
  return 0;
}

static int emu_set_device(int dev) {
  if (dev < 0 || dev >= emu_ndev)
    return fail("set_device(%d): the emulator has %d device(s) (GW_DEV_EMULATE=%d)", dev, emu_ndev, emu_ndev);
  cur_dev = dev;
  dev_chosen = true;
  return 0;
}

static int emu_device_in_use(int *yes) {
  *yes = dev_chosen;
  return 0;
}

static int emu_ptr_kind(const void *p, int *is_device, int *device) {
  struct range r;
  *is_device = 0;
  *device = -1;
  if (p && reg_find(p, &r) && r.kind != R_HOST) *is_device = 1, *device = r.device;
  dev_chosen = true; /* cudaPointerGetAttributes initializes the current device's context */
  return 0;
}

/* ---- memory --------------------------------------------------------------------------- */
static size_t page_round(size_t bytes) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return (bytes ? bytes + pg - 1 : pg) / pg * pg;
}

/* IPC peers are siblings, not ancestors: let them reach this process's
 * memfds under Yama's ptrace_scope=1 too (as the verbs emulator does). */
static pthread_once_t ptracer_once = PTHREAD_ONCE_INIT;
static void allow_ptracers(void) { (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); }

static int emu_alloc(void **p, size_t bytes) {
  if (sticky()) return 1;
  pthread_once(&ptracer_once, allow_ptracers);
  size_t size = page_round(bytes);
  /* close-on-exec: a program a rank runs must not keep emulated device memory alive */
  int fd = (int)syscall(SYS_memfd_create, "gw-dev-emu", (unsigned)MFD_CLOEXEC);
  if (fd < 0) return fail("alloc(%zu): memfd_create: %s", bytes, strerror(errno));
  if (ftruncate(fd, (off_t)size) != 0) {
    int e = errno;
    close(fd);
    return fail("alloc(%zu): ftruncate: %s", bytes, strerror(e));
  }
  void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (m == MAP_FAILED) {
    int e = errno;
    close(fd);
    return fail("alloc(%zu): out of memory (mmap: %s)", bytes, strerror(e));
  }
  if (reg_add((struct range){.base = m, .size = size, .kind = R_DEVICE, .device = cur_dev, .fd = fd})) {
    munmap(m, size);
    close(fd);
    return 1;
  }
  *p = m;
  return 0;
}

static int emu_free(void *p) {
  struct range r;
  if (!p) return 0;
  device_sync_all("free");
  if (!reg_take(p, 1u << R_DEVICE, &r)) return fail("free(%p): not the start of an emulated device allocation", p);
  munmap(r.base, r.size);
  close(r.fd);
  return 0;
}

/* A test hook: GW_DEV_EMU_FAIL_HOST_ALLOC=BYTES:N makes the N-th host_alloc of
 * exactly BYTES fail (pinned memory running out part way through a setup). */
static bool host_alloc_fails(size_t bytes) {
  static _Atomic long seen;
  const char *v = getenv("GW_DEV_EMU_FAIL_HOST_ALLOC");
  unsigned long long want = 0;
  long nth = 0;
  if (!v || sscanf(v, "%llu:%ld", &want, &nth) != 2 || want != bytes) return false;
  return atomic_fetch_add(&seen, 1) + 1 == nth;
}

static int emu_host_alloc(void **p, size_t bytes) {
  if (sticky()) return 1;
  if (host_alloc_fails(bytes)) return fail("host_alloc(%zu): out of memory (GW_DEV_EMU_FAIL_HOST_ALLOC)", bytes);
  size_t size = page_round(bytes);
  void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (m == MAP_FAILED) return fail("host_alloc(%zu): out of memory (mmap: %s)", bytes, strerror(errno));
  if (reg_add((struct range){.base = m, .size = size, .kind = R_HOST, .device = -1, .fd = -1})) {
    munmap(m, size);
    return 1;
  }
  *p = m;
  return 0;
}

static int emu_host_free(void *p) {
  struct range r;
  if (!p) return 0;
  device_sync_all("host_free");
  if (!reg_take(p, 1u << R_HOST, &r)) return fail("host_free(%p): not from host_alloc", p);
  munmap(r.base, r.size);
  return 0;
}

/* Host memory of the process is the emulated device's already: registering
 * only checks what CUDA would refuse. */
static int emu_host_register(void *p, size_t bytes) {
  if (!p || (uintptr_t)p % 4096 || !bytes) return fail("host_register(%p, %zu): not a page-aligned range", p, bytes);
  return 0;
}

static int emu_host_unregister(void *p) { return p ? 0 : fail("host_unregister(NULL)"); }

/* ---- IPC -------------------------------------------------------------------------------- */
#define IPC_MAGIC 0x47574456u /* "GWDV" */
struct emu_ipc {
  uint32_t magic;
  int32_t pid, fd, device;
  uint64_t size;
};
_Static_assert(sizeof(struct emu_ipc) <= GW_DEV_IPC_BYTES, "the IPC handle must fit");

static int emu_ipc_get(void *base, struct gw_dev_ipc *h) {
  if (sticky()) return 1;
  struct range r;
  if (!reg_find(base, &r) || r.kind != R_DEVICE || r.base != (char *)base)
    return fail("ipc_get(%p): not the start of a device allocation made by this process", base);
  struct emu_ipc e = {.magic = IPC_MAGIC, .pid = (int32_t)getpid(), .fd = r.fd, .device = r.device, .size = r.size};
  memset(h, 0, sizeof *h);
  memcpy(h->bytes, &e, sizeof e);
  return 0;
}

static int emu_ipc_open(const struct gw_dev_ipc *h, void **p) {
  if (sticky()) return 1;
  struct emu_ipc e;
  memcpy(&e, h->bytes, sizeof e);
  if (e.magic != IPC_MAGIC) return fail("ipc_open: not an emulated device IPC handle");
  if (e.pid == (int32_t)getpid()) return fail("ipc_open: the handle was made by this process (CUDA refuses that too)");
  int pidfd = (int)syscall(SYS_pidfd_open, e.pid, 0);
  if (pidfd < 0) return fail("ipc_open: process %d is gone (pidfd_open: %s)", e.pid, strerror(errno));
  int fd = (int)syscall(SYS_pidfd_getfd, pidfd, e.fd, 0);
  int err = errno;
  close(pidfd);
  if (fd < 0)
    return fail("ipc_open: cannot reach the memory of process %d (pidfd_getfd: %s; needs ptrace permission, "
                "e.g. the same user and kernel.yama.ptrace_scope 0 or 1 with a common parent)", e.pid, strerror(err));
  void *m = mmap(NULL, e.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = errno;
  close(fd);
  if (m == MAP_FAILED) return fail("ipc_open: mmap of %llu bytes: %s", (unsigned long long)e.size, strerror(err));
  if (reg_add((struct range){.base = m, .size = e.size, .kind = R_IPC, .device = e.device, .fd = -1})) {
    munmap(m, e.size);
    return 1;
  }
  *p = m;
  return 0;
}

static int emu_ipc_close(void *p) {
  struct range r;
  device_sync_all("ipc_close");
  if (!reg_take(p, 1u << R_IPC, &r)) return fail("ipc_close(%p): not a mapping made by ipc_open", p);
  munmap(r.base, r.size);
  return 0;
}

/* ---- streams ---------------------------------------------------------------------------- */
enum { IT_COPY, IT_REDUCE, IT_CAST, IT_FLAG_WRITE, IT_FLAG_WAIT, IT_SLEEP };

/* An event: a counter the recording stream's item raises to the record's
 * number, which a waiting stream's item waits for (as flag_write / flag_wait);
 * freed when destroyed and no queued item refers to it. */
struct gw_dev_event {
  _Atomic uint64_t done;     /* the last record completed */
  uint64_t recorded;         /* records enqueued (by the recording thread) */
  _Atomic int refs;          /* 1 for the owner until destroyed, +1 per queued item */
};

static void event_unref(struct gw_dev_event *ev) {
  if (ev && atomic_fetch_sub(&ev->refs, 1) == 1) free(ev);
}

struct item {
  struct item *next;
  int kind, dtype, kop;
  void *dst0, *dst1;
  const void *a, *b;
  size_t n;
  uint32_t div;
  float scale; /* IT_CAST to 16 bits */
  uint64_t *flag;
  uint64_t v;
  double seconds;
  struct gw_dev_event *ev; /* referenced by a flag item on an event's counter */
  struct conn *conn;       /* the work queue it went into (GW_DEV_EMU_CONNECTIONS), or NULL */
  uint64_t cticket;        /* its place in that queue */
};

struct gw_dev_stream {
  pthread_mutex_t mu;
  pthread_cond_t work_cv, idle_cv;
  struct item *head, *tail;
  uint64_t enqueued, finished;
  bool stop;
  _Atomic bool capturing; /* gw__dev_emu_set_capturing */
  int device;                                 /* the creating thread's (free synchronizes one device) */
  struct gw_dev_stream *prev_all, *next_all; /* every live stream (all_mu) */
  int refs;                                  /* device_sync_all's holds (all_mu) */
  bool gone;                                 /* its thread ended; freed at the last release (all_mu) */
  struct conn *conn;                         /* its device's work queue (GW_DEV_EMU_CONNECTIONS), or NULL */
};

/* Every stream of the process, for the implicit synchronization of free. */
static pthread_mutex_t all_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gw_dev_stream *all_streams;

static void all_add(struct gw_dev_stream *s) {
  pthread_mutex_lock(&all_mu);
  s->next_all = all_streams;
  if (all_streams) all_streams->prev_all = s;
  all_streams = s;
  pthread_mutex_unlock(&all_mu);
}

static void all_unlink(struct gw_dev_stream *s) { /* under all_mu */
  if (s->prev_all) s->prev_all->next_all = s->next_all;
  else all_streams = s->next_all;
  if (s->next_all) s->next_all->prev_all = s->prev_all;
}

static void stream_free(struct gw_dev_stream *s) {
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->work_cv);
  pthread_cond_destroy(&s->idle_cv);
  free(s);
}

/* What cudaFree does first: waits for everything queued so far on every
 * stream of the calling thread's device.  The streams and their counts are
 * taken under all_mu at the call (each held, so none is freed meanwhile), then
 * waited for without it, so other threads still make and end streams. */
static void device_sync_all(const char *what) {
  const int dev = cur_dev;
  pthread_mutex_lock(&all_mu);
  size_t n = 0;
  for (struct gw_dev_stream *s = all_streams; s; s = s->next_all) n += s->device == dev;
  struct hold {
    struct gw_dev_stream *s;
    uint64_t target;
  } *h = calloc(n ? n : 1, sizeof *h);
  size_t k = 0;
  for (struct gw_dev_stream *s = all_streams; s && h; s = s->next_all) {
    if (s->device != dev) continue;
    pthread_mutex_lock(&s->mu);
    h[k].target = s->enqueued;
    pthread_mutex_unlock(&s->mu);
    h[k++].s = s;
    s->refs++;
  }
  pthread_mutex_unlock(&all_mu);
  if (!h) { /* out of memory: no synchronization (a test may pass that hangs on a GPU) */
    fprintf(stderr, "gradwire device emulator: %s: out of memory, not synchronized\n", what);
    return;
  }
  for (size_t i = 0; i < k; i++) {
    struct gw_dev_stream *s = h[i].s;
    pthread_mutex_lock(&s->mu);
    bool noted = false;
    while (s->finished < h[i].target) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += 10;
      if (pthread_cond_timedwait(&s->idle_cv, &s->mu, &ts) == ETIMEDOUT && !noted) {
        fprintf(stderr, "gradwire device emulator: %s has waited 10 s for a stream to finish its queued work "
                "(CUDA synchronizes the device there too): a hang on a GPU\n", what);
        noted = true;
      }
    }
    pthread_mutex_unlock(&s->mu);
  }
  pthread_mutex_lock(&all_mu);
  for (size_t i = 0; i < k; i++) {
    struct gw_dev_stream *s = h[i].s;
    if (--s->refs == 0 && s->gone) stream_free(s);
  }
  pthread_mutex_unlock(&all_mu);
  free(h);
}

/* GW_DEV_EMU_DELAY_US=N (tests): every copy and reduction first sleeps a
 * random 0..N-1 us, so one rank's stream runs late against another's, as on
 * GPUs, and any order between them that is not enforced shows as wrong data. */
static long delay_us_max = -1;
static pthread_once_t delay_once = PTHREAD_ONCE_INIT;
static void delay_read(void) {
  const char *v = getenv("GW_DEV_EMU_DELAY_US");
  delay_us_max = v && *v ? strtol(v, NULL, 10) : 0;
}

static void maybe_delay(void) {
  static _Thread_local unsigned seed;
  pthread_once(&delay_once, delay_read);
  if (delay_us_max <= 0) return;
  if (!seed) seed = (unsigned)getpid() * 2654435761u ^ (unsigned)(uintptr_t)&seed;
  long us = (long)(rand_r(&seed) % (unsigned)delay_us_max);
  struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void run_item(const struct item *it) {
  if (it->kind == IT_COPY || it->kind == IT_REDUCE) maybe_delay();
  switch (it->kind) {
  case IT_COPY:
    memmove(it->dst0, it->a, it->n);
    if (it->dst1) memmove(it->dst1, it->a, it->n);
    break;
  case IT_REDUCE:
    gw__dev_host_reduce()(it->dst0, it->dst1, it->a, it->b, it->n, it->dtype, it->kop, it->div);
    break;
  case IT_CAST: /* dtype: the destination's, kop: the source's */
    gw__dev_host_cast()(it->dst0, it->dtype, it->a, it->kop, it->n, it->scale);
    break;
  case IT_FLAG_WRITE:
    if (it->ev) { /* an event's counter only grows (records on several streams may finish out of order) */
      uint64_t cur = atomic_load_explicit(&it->ev->done, memory_order_relaxed);
      while (cur < it->v && !atomic_compare_exchange_weak_explicit(&it->ev->done, &cur, it->v, memory_order_release,
                                                                   memory_order_relaxed)) {
      }
    } else {
      atomic_store_explicit((_Atomic uint64_t *)it->flag, it->v, memory_order_release);
    }
    break;
  case IT_FLAG_WAIT: {
    struct gw_waiter w;
    gw__waiter_init(&w, 0);
    while (atomic_load_explicit((_Atomic uint64_t *)it->flag, memory_order_acquire) < it->v) gw__waiter_pause(&w);
    break;
  }
  case IT_SLEEP: {
    struct timespec ts = {.tv_sec = (time_t)it->seconds,
                          .tv_nsec = (long)((it->seconds - (double)(time_t)it->seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    break;
  }
  }
}

/* GW_DEV_EMU_CONNECTIONS=N (tests): the streams of a device share N work
 * queues, as a CUDA context's share CUDA_DEVICE_MAX_CONNECTIONS hardware
 * queues (8 by default): a stream is given one when it is made, round robin
 * (the default stream first), and the items of every stream in a queue run
 * in the order they were enqueued, so a wait blocks everything queued behind
 * it on the other streams too.  Code that makes a stream wait for work the
 * host enqueues only later deadlocks here with N = 1, as on a GPU (the
 * driver's stream memory operations warn of it).  0 or unset: every stream
 * runs on its own. */
struct conn {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t next, serving; /* the next ticket to give, the one that may run */
};

#define EMU_MAX_DEVICES 64
static long conns_per_dev = -1;
static struct conn *conns;       /* [EMU_MAX_DEVICES][conns_per_dev] */
static unsigned conn_rr[EMU_MAX_DEVICES];
static pthread_once_t conns_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t conn_rr_mu = PTHREAD_MUTEX_INITIALIZER;

static void conns_read(void) {
  const char *v = getenv("GW_DEV_EMU_CONNECTIONS");
  long n = v && *v ? strtol(v, NULL, 10) : 0;
  conns_per_dev = n > 32 ? 32 : n > 0 ? n : 0;
  if (!conns_per_dev) return;
  conns = calloc((size_t)EMU_MAX_DEVICES * (size_t)conns_per_dev, sizeof *conns);
  if (!conns) {
    fprintf(stderr, "gradwire device emulator: GW_DEV_EMU_CONNECTIONS: out of memory, streams run apart\n");
    conns_per_dev = 0;
    return;
  }
  for (long i = 0; i < EMU_MAX_DEVICES * conns_per_dev; i++) {
    pthread_mutex_init(&conns[i].mu, NULL);
    pthread_cond_init(&conns[i].cv, NULL);
  }
}

/* The emulated number of work queues per device (0: unlimited). */
static int emu_queues(void) {
  pthread_once(&conns_once, conns_read);
  return (int)conns_per_dev;
}

static struct conn *conn_assign(int dev) {
  if (!emu_queues() || dev < 0 || dev >= EMU_MAX_DEVICES) return NULL;
  pthread_mutex_lock(&conn_rr_mu);
  unsigned k = conn_rr[dev]++ % (unsigned)conns_per_dev;
  pthread_mutex_unlock(&conn_rr_mu);
  return &conns[(size_t)dev * (size_t)conns_per_dev + k];
}

/* The stream's thread before and after running an item: its turn in the queue. */
static void conn_enter(const struct item *it) {
  if (!it->conn) return;
  pthread_mutex_lock(&it->conn->mu);
  while (it->conn->serving != it->cticket) pthread_cond_wait(&it->conn->cv, &it->conn->mu);
  pthread_mutex_unlock(&it->conn->mu);
}

static void conn_leave(const struct item *it) {
  if (!it->conn) return;
  pthread_mutex_lock(&it->conn->mu);
  it->conn->serving++;
  pthread_cond_broadcast(&it->conn->cv);
  pthread_mutex_unlock(&it->conn->mu);
}

/* The stream's thread.  It owns the stream once stop is set and frees it after
 * the last item, as cudaStreamDestroy lets queued work finish. */
static void *stream_main(void *arg) {
  struct gw_dev_stream *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
    if (!s->head) break;
    struct item *it = s->head;
    pthread_mutex_unlock(&s->mu);
    conn_enter(it);
    if (item_runs()) run_item(it);
    conn_leave(it);
    event_unref(it->ev);
    pthread_mutex_lock(&s->mu);
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    free(it);
    s->finished++;
    pthread_cond_broadcast(&s->idle_cv);
  }
  pthread_mutex_unlock(&s->mu);
  /* Off the list; freed now, or by the last device_sync_all holding it. */
  pthread_mutex_lock(&all_mu);
  all_unlink(s);
  s->gone = true;
  const bool free_now = s->refs == 0;
  pthread_mutex_unlock(&all_mu);
  if (free_now) stream_free(s);
  return NULL;
}

static int stream_new(struct gw_dev_stream **out) {
  struct gw_dev_stream *s = calloc(1, sizeof *s);
  if (!s) return fail("stream_create: out of memory");
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->idle_cv, NULL);
  s->device = cur_dev;
  s->conn = conn_assign(cur_dev);
  pthread_t th;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&th, &attr, stream_main, s);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    free(s);
    return fail("stream_create: pthread_create: %s", strerror(rc));
  }
  all_add(s);
  *out = s;
  return 0;
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static struct gw_dev_stream *default_stream;
static void default_make(void) {
  if (stream_new(&default_stream)) default_stream = NULL;
}

static struct gw_dev_stream *resolve(gw_dev_stream_t s) {
  if (s) return s;
  pthread_once(&default_once, default_make);
  if (!default_stream) fail("the default stream could not be started");
  return default_stream;
}

static int emu_stream_create(gw_dev_stream_t *out) { return sticky() ? 1 : stream_new(out); }

static int emu_stream_destroy(gw_dev_stream_t s) {
  if (!s) return fail("stream_destroy: the default stream cannot be destroyed");
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static int emu_stream_sync(gw_dev_stream_t s0) {
  struct gw_dev_stream *s = resolve(s0);
  if (!s) return 1;
  pthread_mutex_lock(&s->mu);
  uint64_t target = s->enqueued;
  while (s->finished < target) pthread_cond_wait(&s->idle_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return sticky();
}

static int emu_stream_idle(gw_dev_stream_t s0, int *idle) {
  if (sticky()) return 1; /* cudaStreamQuery: the context's error */
  struct gw_dev_stream *s = resolve(s0);
  if (!s) return 1;
  pthread_mutex_lock(&s->mu);
  *idle = s->finished == s->enqueued;
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static int emu_stream_capturing(gw_dev_stream_t s0, int *yes) {
  struct gw_dev_stream *s = resolve(s0);
  if (!s) return 1;
  *yes = atomic_load(&s->capturing);
  return 0;
}

static int emu_stream_device(gw_dev_stream_t s0, int *dev) {
  struct gw_dev_stream *s = resolve(s0);
  if (!s) return 1;
  *dev = s0 ? s->device : cur_dev; /* the default stream: the calling thread's device's */
  return 0;
}

void gw__dev_emu_set_capturing(gw_dev_stream_t s0, int on) {
  struct gw_dev_stream *s = resolve(s0);
  if (s) atomic_store(&s->capturing, on != 0);
}

/* A stream's queue holds at most GW_DEV_EMU_QUEUE items (1024): as a CUDA
 * stream's, a launch into a full one blocks until the stream runs some, so
 * code that enqueues without bound ahead of a stream that waits for another
 * process hangs here as on a GPU. */
static long queue_max = -1;
static pthread_once_t queue_once = PTHREAD_ONCE_INIT;
static void queue_read(void) {
  const char *v = getenv("GW_DEV_EMU_QUEUE");
  queue_max = v && *v ? strtol(v, NULL, 10) : 1024;
  if (queue_max < 1) queue_max = 1;
}

/* gw__dev_emu_fail_pushes_after (tests): enqueueing fails once this many more
 * items went in (-1: never), each failure 100 ms late. */
static _Atomic long pushes_left = -1;

void gw__dev_emu_fail_pushes_after(long n) { atomic_store(&pushes_left, n); }

static int push(gw_dev_stream_t s0, const struct item *tmpl) {
  if (sticky()) return 1;
  long left = atomic_load(&pushes_left);
  while (left > 0 && !atomic_compare_exchange_weak(&pushes_left, &left, left - 1)) {
  }
  if (left == 0) { /* after what went in ran (so a waiting host saw it start) */
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    return fail("enqueue: failure injected by the test (gw__dev_emu_fail_pushes_after)");
  }
  struct gw_dev_stream *s = resolve(s0);
  if (!s) return 1;
  struct item *it = malloc(sizeof *it);
  if (!it) return fail("out of memory for a stream's work item");
  *it = *tmpl;
  it->next = NULL;
  pthread_once(&queue_once, queue_read);
  pthread_mutex_lock(&s->mu);
  while (s->enqueued - s->finished >= (uint64_t)queue_max && !s->stop) pthread_cond_wait(&s->idle_cv, &s->mu);
  it->conn = s->conn;
  if (it->conn) { /* under s->mu: the stream's items take their places in its order */
    pthread_mutex_lock(&it->conn->mu);
    it->cticket = it->conn->next++;
    pthread_mutex_unlock(&it->conn->mu);
  }
  if (s->tail) s->tail->next = it;
  else s->head = it;
  s->tail = it;
  s->enqueued++;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static int emu_memcpy_async(void *dst, const void *src, size_t bytes, gw_dev_stream_t s) {
  if (!bytes) return 0;
  if (!dst || !src) return fail("memcpy_async(%p, %p, %zu): NULL pointer", dst, src, bytes);
  return push(s, &(struct item){.kind = IT_COPY, .dst0 = dst, .a = src, .n = bytes});
}

static int emu_copy_async(void *dst0, void *dst1, const void *src, size_t bytes, gw_dev_stream_t s) {
  if (!bytes) return 0;
  if (!dst0 || !src) return fail("copy_async(%p, %p, %p, %zu): NULL pointer", dst0, dst1, src, bytes);
  return push(s, &(struct item){.kind = IT_COPY, .dst0 = dst0, .dst1 = dst1, .a = src, .n = bytes});
}

static int emu_reduce_async(void *dst0, void *dst1, const void *a, const void *b, size_t n, int dtype, int kop,
                            uint32_t div, gw_dev_stream_t s) {
  if (!n) return 0;
  if (!gw__dev_host_reduce()) return fail("reduce_async: the emulator has no host reduction (internal)");
  return push(s, &(struct item){.kind = IT_REDUCE, .dst0 = dst0, .dst1 = dst1, .a = a, .b = b, .n = n,
                                .dtype = dtype, .kop = kop, .div = div});
}

static int emu_cast_async(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n, float scale,
                          gw_dev_stream_t s) {
  if (!n) return 0;
  if (!dst || !src) return fail("cast_async(%p, %p, %zu): NULL pointer", dst, src, n);
  const int to16 = src_dtype == GW_FLOAT32 && (dst_dtype == GW_FLOAT16 || dst_dtype == GW_BFLOAT16);
  const int from16 = dst_dtype == GW_FLOAT32 && (src_dtype == GW_FLOAT16 || src_dtype == GW_BFLOAT16);
  if (!to16 && !from16) return fail("cast_async: dtype %d to %d is not float32 to or from 16 bits", src_dtype, dst_dtype);
  if (!gw__dev_host_cast()) return fail("cast_async: the emulator has no host conversion (internal)");
  return push(s, &(struct item){.kind = IT_CAST, .dst0 = dst, .a = src, .n = n, .dtype = dst_dtype, .kop = src_dtype,
                                .scale = scale});
}

static int emu_flag_write(uint64_t *flag, uint64_t v, gw_dev_stream_t s) {
  return push(s, &(struct item){.kind = IT_FLAG_WRITE, .flag = flag, .v = v});
}

static int emu_flag_wait(const uint64_t *flag, uint64_t v, gw_dev_stream_t s) {
  return push(s, &(struct item){.kind = IT_FLAG_WAIT, .flag = (uint64_t *)flag, .v = v});
}

static int emu_event_create(gw_dev_event_t *out) {
  struct gw_dev_event *ev = calloc(1, sizeof *ev);
  if (!ev) return fail("event_create: out of memory");
  atomic_init(&ev->refs, 1);
  *out = ev;
  return 0;
}

static int emu_event_destroy(gw_dev_event_t ev) {
  event_unref(ev);
  return 0;
}

static int emu_event_record(gw_dev_event_t ev, gw_dev_stream_t s) {
  atomic_fetch_add(&ev->refs, 1);
  int rc = push(s, &(struct item){.kind = IT_FLAG_WRITE, .flag = (uint64_t *)&ev->done, .v = ev->recorded + 1,
                                  .ev = ev});
  if (rc) event_unref(ev);
  else ev->recorded++;
  return rc;
}

static int emu_stream_wait_event(gw_dev_stream_t s, gw_dev_event_t ev) {
  atomic_fetch_add(&ev->refs, 1);
  int rc = push(s, &(struct item){.kind = IT_FLAG_WAIT, .flag = (uint64_t *)&ev->done, .v = ev->recorded, .ev = ev});
  if (rc) event_unref(ev);
  return rc;
}

static int emu_sleep_async(double seconds, gw_dev_stream_t s) {
  return push(s, &(struct item){.kind = IT_SLEEP, .seconds = seconds > 0 ? seconds : 0});
}

static int emu_preload(void) { return 0; } /* nothing is loaded lazily here */

/* GW_DEV_EMU_NO_PEER=1 (tests): no device reaches another's memory, as GPUs
 * without a peer-to-peer path. */
static int emu_can_access_peer(int dev, int peer, int *yes) {
  const char *v = getenv("GW_DEV_EMU_NO_PEER");
  *yes = dev == peer || !(v && *v && strcmp(v, "0") != 0);
  return 0;
}

static const struct gw_dev_ops emu_ops = {
    .name = "emulated",
    .device_count = emu_device_count,
    .get_device = emu_get_device,
    .set_device = emu_set_device,
    .device_in_use = emu_device_in_use,
    .ptr_kind = emu_ptr_kind,
    .alloc = emu_alloc,
    .free = emu_free,
    .host_alloc = emu_host_alloc,
    .host_free = emu_host_free,
    .host_register = emu_host_register,
    .host_unregister = emu_host_unregister,
    .stream_create = emu_stream_create,
    .stream_destroy = emu_stream_destroy,
    .stream_sync = emu_stream_sync,
    .stream_idle = emu_stream_idle,
    .stream_capturing = emu_stream_capturing,
    .stream_device = emu_stream_device,
    .memcpy_async = emu_memcpy_async,
    .copy_async = emu_copy_async,
    .reduce_async = emu_reduce_async,
    .cast_async = emu_cast_async,
    .flag_write = emu_flag_write,
    .flag_wait = emu_flag_wait,
    .event_create = emu_event_create,
    .event_destroy = emu_event_destroy,
    .event_record = emu_event_record,
    .stream_wait_event = emu_stream_wait_event,
    .sleep_async = emu_sleep_async,
    .preload = emu_preload,
    .queues = emu_queues,
    .can_access_peer = emu_can_access_peer,
    .ipc_get = emu_ipc_get,
    .ipc_open = emu_ipc_open,
    .ipc_close = emu_ipc_close,
    .error = emu_error,
};

const struct gw_dev_ops *gw__dev_emu_ops(int ndevices) {
  emu_ndev = ndevices > 0 ? ndevices : 1;
  return &emu_ops;
}
