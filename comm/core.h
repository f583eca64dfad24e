/* core.h - internal definitions shared by comm/ and transport/: logging, tunables,
 * error reporting, timing and the waiting policy.  Not installed; users see only
 * gradwire.h. */
#ifndef GW_CORE_H
#define GW_CORE_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "gradwire.h"

/* ---- logging: GW_DEBUG=WARN|INFO|TRACE, GW_DEBUG_SUBSYS=INIT,BOOT,SHM,COLL,... */
enum gw_log_level { GW_LOG_NONE = 0, GW_LOG_WARN = 1, GW_LOG_INFO = 2, GW_LOG_TRACE = 3 };
enum gw_subsys {
  GW_SUB_INIT = 1u << 0,
  GW_SUB_BOOT = 1u << 1,
  GW_SUB_SHM = 1u << 2,
  GW_SUB_COLL = 1u << 3,
  GW_SUB_PROXY = 1u << 4, /* the progress thread */
  GW_SUB_ENV = 1u << 5,
  GW_SUB_TUNE = 1u << 6, /* the cost model's table and choices */
  GW_SUB_ALL = ~0u
};

/* The most ranks a communicator takes (gw_comm_init, and the world sizes
 * gw_comm_init_env reads): a larger one failed as "out of memory" when its
 * tables could not be had, or waited out the rendezvous when they could. */
#define GW_MAX_NRANKS (1 << 20)

extern int gw__log_level; /* set once by gw__log_init */
void gw__log_init(void);
void gw__log(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The rank printed in log lines of this process (-1 before a communicator exists). */
void gw__log_set_rank(int rank);

#define GW_WARN(sub, ...) gw__log(GW_LOG_WARN, (sub), __FILE__, __LINE__, __VA_ARGS__)
#define GW_INFO(sub, ...)                                                            \
  do {                                                                               \
    if (gw__log_level >= GW_LOG_INFO) gw__log(GW_LOG_INFO, (sub), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define GW_TRACE(sub, ...)                                                           \
  do {                                                                               \
    if (gw__log_level >= GW_LOG_TRACE) gw__log(GW_LOG_TRACE, (sub), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

/* Propagates a failure and leaves a trail at TRACE level (file:line -> code). */
#define GW_CHECK(call)                                                               \
  do {                                                                               \
    gw_result_t gw_check_res_ = (call);                                              \
    if (gw_check_res_ != GW_SUCCESS) {                                               \
      GW_TRACE(GW_SUB_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)gw_check_res_);   \
      return gw_check_res_;                                                          \
    }                                                                                \
  } while (0)
/* Same, but jumps to a cleanup label after storing the code in `res`. */
#define GW_CHECK_GOTO(call, res, label)                                              \
  do {                                                                               \
    (res) = (call);                                                                  \
    if ((res) != GW_SUCCESS) {                                                       \
      GW_TRACE(GW_SUB_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)(res));           \
      goto label;                                                                    \
    }                                                                                \
  } while (0)

/* ---- error messages ---------------------------------------------------------
 * An error context collects the detailed message of a failure.  Library code
 * fills it with gw__err(), which also logs it at WARN; the API layer copies it
 * into the communicator (gw_comm_last_error). */
#define GW_ERRMSG_MAX 512
struct gw_errctx {
  char msg[GW_ERRMSG_MAX];
};
/* Formats the message into ctx (may be NULL: then only logged) and returns code. */
gw_result_t gw__err(struct gw_errctx *ctx, gw_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* This process's first failure, for its launcher (GW_ERROR_FILE; failrec.c):
 * origin, its own finding; else news of another rank's failure.  Later
 * calls do nothing. */
void gw__record_failure(bool origin, const char *msg);
/* Reads GW_ERROR_FILE once, on a caller's thread (gw_comm_init). */
void gw__record_failure_init(void);
/* Thread-local message for failures with no communicator (init). */
void gw__set_thread_error(const char *msg);
const char *gw__thread_error(void);

/* ---- live handles --------------------------------------------------------------
 * The communicators and bucketers handed out and not yet destroyed, by
 * address: a destroy of one that is not live (destroyed already) is refused
 * instead of freeing it twice (a second gw_bucketer_destroy aborted in
 * free(); a second gw_comm_destroy wrote into freed memory and the next init
 * crashed).  Destroys look, and every bucketer call (a ready after destroy
 * read freed memory; communicators are pooled, never freed, and their
 * destroy gate refuses later calls).  Each is held with its kind: a
 * communicator given as a bucketer is refused (its memory was read as one's
 * and crashed).  A handle whose memory went to a new object of its kind
 * cannot be told from it (destroyed bucketers' memory is held back a while
 * first: bucket.c's quarantine). */
enum gw_live_kind { GW_LIVE_COMM = 1, GW_LIVE_BUCKETER = 2 };
void gw__live_add(const void *p, enum gw_live_kind kind);
void gw__live_remove(const void *p, enum gw_live_kind kind);
bool gw__live_has(const void *p, enum gw_live_kind kind);
/* gw__live_has, and if not, "FN: P is not a live communicator|bucketer
 * (destroyed already?)" (or "... is a live communicator, not a bucketer") as
 * the thread's error and a warning. */
bool gw__live_or_refuse(const void *p, enum gw_live_kind kind, const char *fn);
/* The same, and takes p out at once (two destroys racing: one wins). */
bool gw__live_take_or_refuse(const void *p, enum gw_live_kind kind, const char *fn);

/* ---- tunables: environment variables read once ------------------------------ */
int64_t gw__env_int(const char *name, int64_t dflt);
/* Whether name is unset, empty or an integer gw__env_int takes (settings
 * refused when out of range refuse a value that is no number too: "12abc"
 * ran as the default while "16" failed init). */
bool gw__env_int_parses(const char *name);
/* gw__env_int, and a value below min is warned about and dflt used
 * (GW_NT_THRESHOLD=-1 had meant "never" without a word). */
int64_t gw__env_int_min(const char *name, int64_t dflt, int64_t min);
/* This process's pid namespace (the inode of /proc/self/ns/pid), 0 if unknown:
 * the names this library makes in /dev/shm end with it, so a cleaner tells
 * which pid namespace the pid in them means something in. */
uint64_t gw__pidns_self(void);
double gw__env_double(const char *name, double dflt);
/* A time in seconds from the environment: a number (the C locale's, no white
 * space), finite and above 0, or 0 where zero_ok ("no limit"); unset or
 * empty: dflt.  False (and dflt in *out) for anything else: init refuses
 * GW_TIMEOUT's and GW_BOOTSTRAP_TIMEOUT's, the limits on every wait
 * (GW_TIMEOUT=-300 had turned every deadline off, and 5s was the default
 * with one line of warning among many). */
bool gw__env_seconds_checked(const char *name, double dflt, bool zero_ok, double *out);
const char *gw__env_str(const char *name, const char *dflt);
/* The bytes the tightest memory limit of this process's cgroups (v2, or v1's
 * memory controller, its own and every one above) leaves it: the limit less
 * what the cgroup holds; 0 where none is set (cpus.c). */
long long gw__cgroup_mem_left(void);
/* GW_PARAM(Foo, "GW_FOO", 42) defines `int64_t gw__param_Foo(void)` that reads the
 * variable on the first call and caches it, as NCCL_PARAM does; GW_PARAM_MIN
 * also refuses values below min (gw__env_int_min). */
#define GW_PARAM_MIN(fname, env, dflt, min)                                          \
  static inline int64_t gw__param_##fname(void) {                                    \
    static _Atomic int64_t cached_ = INT64_MIN;                                      \
    int64_t v_ = atomic_load_explicit(&cached_, memory_order_relaxed);               \
    if (v_ == INT64_MIN) {                                                           \
      v_ = gw__env_int_min(env, dflt, min);                                          \
      atomic_store_explicit(&cached_, v_, memory_order_relaxed);                     \
    }                                                                                \
    return v_;                                                                       \
  }
#define GW_PARAM(fname, env, dflt) GW_PARAM_MIN(fname, env, dflt, INT64_MIN)

/* ---- time and waiting ---------------------------------------------------------- */
double gw__now(void); /* monotonic seconds */
uint32_t gw__clock_bits(void); /* 32 bits of clock, pid and address: getrandom's stand-in for unique names */
/* Milliseconds from now to the deadline for poll(): 0 once past it, at most
 * INT_MAX (a far or infinite deadline must not overflow to a negative wait). */
int gw__ms_until(double deadline);

/* The waiting policy for every poll loop in the runtime: spin with a pause for
 * 50 us, then sched_yield until 2 ms, then sleep with growing intervals (up to
 * 100 us), so that more ranks than cores still make progress.  `deadline` is an absolute
 * gw__now() time, or 0 for none. */
struct gw_waiter {
  uint32_t iter;
  uint32_t quick; /* polls before the clock is read (fewer when the cores are contended) */
  double start;
  double deadline;
};
void gw__waiter_init(struct gw_waiter *w, double timeout_s);
/* One back-off step.  Returns false once the deadline has passed. */
bool gw__waiter_pause(struct gw_waiter *w);
/* Fixes the spin phase of every waiter of the process (GW_SPIN_US); without
 * it the phase adapts between 2 and 50 us to how busy the cores are. */
void gw__waiter_set_spin(double seconds);
/* +1 for each live communicator on an oversubscribed machine, -1 at its
 * end: while any is counted, waits yield at once (unless GW_SPIN_US is set). */
void gw__waiter_oversubscribed(int delta);
/* The spinning phase a wait takes now, in seconds. */
double gw__waiter_spin(void);
/* Past the spinning phase: a caller that can block on file descriptors (poll)
 * should do that instead of yielding or sleeping. */
bool gw__waiter_done_spinning(const struct gw_waiter *w);
/* The deadline has passed (checks the clock). */
bool gw__waiter_expired(const struct gw_waiter *w);

static inline void gw__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ---- misc -------------------------------------------------------------------- */
#define GW_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GW_MAX(a, b) ((a) > (b) ? (a) : (b))

/* FNV-1a 64 of n bytes, continuing from h (start: GW_FNV_START): the job token's
 * hash, dataset fingerprints, checkpoint checksums.  Not for anything hostile. */
#define GW_FNV_START 0xcbf29ce484222325ull
static inline uint64_t gw__fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
#define GW_DIV_UP(a, b) (((a) + (b)-1) / (b))
#define GW_ALIGN_UP(a, b) (GW_DIV_UP(a, b) * (b))
#define GW_CACHELINE 64

/* Host name plus boot id: ranks with the same node id share a machine. */
void gw__node_id(char *out, size_t len);

/* forkfd.c: every socket to a peer is made, accepted and closed through these
 * (close-on-exec, and recorded so that a child forked without exec closes
 * its copies: while one lived, a dead rank's peers on other machines saw its
 * sockets open).  gw__sock_close keeps errno; gw__sock_tracked says how many
 * are recorded (tests). */
int gw__sock_socket(int domain, int type, int protocol);
int gw__sock_accept(int listen_fd, struct sockaddr *addr, socklen_t *len);
void gw__sock_close(int fd);
int gw__sock_tracked(void);
/* forkfd.c too: a process-wide mutex held briefly, with no lock of the
 * runtime's taken under it but the logger's, is held across every fork from
 * the first call on (idempotent; before its first lock, where a thread of the
 * parent may hold it at a fork): otherwise the child's own communicator hung
 * on it for good. */
#include <pthread.h>
void gw__fork_guard(pthread_mutex_t *mu);
/* procstat.c: the fields of /proc/pid/stat (tid > 0: /proc/pid/task/tid/stat)
 * from the state letter on (field 3), read into buf; NULL where the file
 * cannot be read (the process or thread is gone) or is cut short. */
#include <sys/types.h>
const char *gw__proc_stat_fields(pid_t pid, pid_t tid, char *buf, size_t len);

#endif /* GW_CORE_H */
