/* debug.c - logging, error messages, environment tunables, clocks and the waiting
 * policy used by every poll loop.  No communication happens here. */
#include <errno.h>
#include <ctype.h>
#include <limits.h>
#include <locale.h>
#include <pthread.h>
#include <sched.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "envint.h"

int gw__log_level = GW_LOG_WARN;
static unsigned log_subsys = GW_SUB_ALL;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
/* The rank in log lines: the calling thread's (set by gw_comm_init and the
 * threads a communicator starts), else the one set last in the process; a
 * process in several communicators (a sub-communicator) logged every
 * thread's lines under the rank set last. */
static _Atomic int log_rank = -1;
static _Thread_local int log_rank_here = -1;
static char log_host[64];
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;

static const struct {
  const char *name;
  unsigned bit;
} subsys_names[] = {{"INIT", GW_SUB_INIT}, {"BOOT", GW_SUB_BOOT}, {"SHM", GW_SUB_SHM},
                    {"COLL", GW_SUB_COLL}, {"PROXY", GW_SUB_PROXY}, {"ENV", GW_SUB_ENV}, {"TUNE", GW_SUB_TUNE},
                    {"ALL", GW_SUB_ALL}};

static void log_init_once(void) {
  const char *lvl = getenv("GW_DEBUG");
  if (lvl && *lvl) { /* empty: unset, as for every variable */
    if (!strcasecmp(lvl, "NONE")) gw__log_level = GW_LOG_NONE;
    else if (!strcasecmp(lvl, "WARN")) gw__log_level = GW_LOG_WARN;
    else if (!strcasecmp(lvl, "INFO")) gw__log_level = GW_LOG_INFO;
    else if (!strcasecmp(lvl, "TRACE")) gw__log_level = GW_LOG_TRACE;
    else fprintf(stderr, "gradwire: GW_DEBUG=%s is not one of NONE, WARN, INFO, TRACE; using WARN\n", lvl);
  }
  /* GW_DEBUG_SUBSYS=INIT,COLL selects; a leading ^ excludes (NCCL's syntax). */
  const char *sub = getenv("GW_DEBUG_SUBSYS");
  if (sub && *sub) {
    bool invert = sub[0] == '^';
    unsigned mask = 0;
    char buf[256];
    /* said, not silent: names past the buffer were dropped, and a list of
     * none (",,,") hid every subsystem's lines */
    if (snprintf(buf, sizeof buf, "%s", sub + (invert ? 1 : 0)) >= (int)sizeof buf)
      fprintf(stderr, "gradwire: GW_DEBUG_SUBSYS: longer than %zu characters: the names after that are not read\n",
              sizeof buf - 1);
    if (!buf[strspn(buf, ",")])
      fprintf(stderr, "gradwire: GW_DEBUG_SUBSYS='%s' names no subsystem: %s\n", sub,
              invert ? "every subsystem's lines are shown" : "no subsystem's lines are shown");
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
      bool found = false;
      for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
        if (!strcasecmp(tok, subsys_names[i].name)) {
          mask |= subsys_names[i].bit;
          found = true;
        }
      if (!found) fprintf(stderr, "gradwire: GW_DEBUG_SUBSYS: unknown subsystem '%s'\n", tok);
    }
    log_subsys = invert ? ~mask : mask;
  }
  if (gethostname(log_host, sizeof log_host) != 0) snprintf(log_host, sizeof log_host, "?");
  log_host[sizeof log_host - 1] = 0;
  char *dot = strchr(log_host, '.');
  if (dot) *dot = 0;
}

/* A thread of the parent inside the logger at a fork left the lock held in
 * the child for good: the child's first message hung. */
static void log_fork_prepare(void) { pthread_mutex_lock(&log_mutex); }
static void log_fork_after(void) { pthread_mutex_unlock(&log_mutex); }
static pthread_once_t log_fork_once = PTHREAD_ONCE_INIT;
static void log_fork_install(void) { pthread_atfork(log_fork_prepare, log_fork_after, log_fork_after); }

void gw__log_init(void) {
  pthread_once(&log_once, log_init_once);
  pthread_once(&log_fork_once, log_fork_install);
}

void gw__log_set_rank(int rank) {
  log_rank_here = rank;
  atomic_store(&log_rank, rank);
}
static int log_rank_now(void) { return log_rank_here >= 0 ? log_rank_here : atomic_load(&log_rank); }

void gw__log(int level, unsigned subsys, const char *file, int line, const char *fmt, ...) {
  gw__log_init();
  if (level > gw__log_level) return;
  /* Warnings always print; finer levels are filtered by subsystem. */
  if (level > GW_LOG_WARN && !(subsys & log_subsys)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *lname = level == GW_LOG_WARN ? "WARN" : level == GW_LOG_INFO ? "INFO" : "TRACE";
  pthread_mutex_lock(&log_mutex);
  if (level == GW_LOG_TRACE)
    fprintf(stderr, "%s:%d:%d [gradwire] %s %s:%d %s\n", log_host, (int)getpid(),
            log_rank_now(), lname, file, line, msg);
  else
    fprintf(stderr, "%s:%d:%d [gradwire] %s %s\n", log_host, (int)getpid(), log_rank_now(),
            lname, msg);
  fflush(stderr);
  pthread_mutex_unlock(&log_mutex);
}

/* ---- errors ------------------------------------------------------------------ */
static _Thread_local char thread_err[GW_ERRMSG_MAX];

gw_result_t gw__err(struct gw_errctx *ctx, gw_result_t code, const char *fmt, ...) {
  char buf[GW_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (ctx) snprintf(ctx->msg, sizeof ctx->msg, "%s", buf);
  gw__log(GW_LOG_WARN, GW_SUB_ALL, __FILE__, __LINE__, "%s (%s)", buf, gw_strerror(code));
  return code;
}

void gw__set_thread_error(const char *msg) { snprintf(thread_err, sizeof thread_err, "%s", msg); }
const char *gw__thread_error(void) { return thread_err; }

const char *gw_strerror(gw_result_t r) {
  switch (r) {
    case GW_SUCCESS: return "success";
    case GW_ERR_INVALID_ARGUMENT: return "invalid argument";
    case GW_ERR_SYSTEM: return "system error";
    case GW_ERR_TIMEOUT: return "timeout";
    case GW_ERR_REMOTE: return "remote (peer) failure";
    case GW_ERR_INTERNAL: return "internal error";
    case GW_ERR_UNSUPPORTED: return "unsupported";
    case GW_ERR_CUDA: return "CUDA error";
    case GW_INPROGRESS: return "in progress";
    case GW_ERR_ABORTED: return "aborted";
  }
  return "unknown result code";
}

/* ---- environment ----------------------------------------------------------------- */
uint64_t gw__pidns_self(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* " N", or " (automatic)" for a negative default: every setting read with one
 * takes it for "unset, chosen at run time" (GW_SPIN_US's adaptive spin,
 * GW_EXCHANGE_MAX_BYTES's auto, ...), and its warning said "the default -1". */
static const char *default_text(int64_t dflt, char buf[32]) {
  if (dflt < 0) return " (automatic)";
  snprintf(buf, 32, " %lld", (long long)dflt);
  return buf;
}

int64_t gw__env_int(const char *name, int64_t dflt) {
  const char *s = getenv(name);
  if (!s || !*s) return dflt;
  long long v;
  if (!gw__parse_env_int(s, &v)) {
    char d[32];
    GW_WARN(GW_SUB_ENV, "%s=%s is not an integer in range; using the default%s", name, s, default_text(dflt, d));
    return dflt;
  }
  GW_INFO(GW_SUB_ENV, "%s set to %lld", name, v);
  return v;
}

/* The live handles (core.h): communicators and bucketers, by address and kind. */
struct live_handle {
  const void *p;
  enum gw_live_kind kind;
};
static pthread_mutex_t handles_mu = PTHREAD_MUTEX_INITIALIZER;
static struct live_handle *handles;
static size_t nhandles, handles_cap;
static bool handles_lost; /* one not counted (out of memory): every address taken for live */
/* Held across fork, as the other process-wide locks: a child's init or
 * destroy must not find it locked for good by a parent's thread. */
static void handles_fork_prepare(void) { pthread_mutex_lock(&handles_mu); }
static void handles_fork_after(void) { pthread_mutex_unlock(&handles_mu); }
static pthread_once_t handles_fork_once = PTHREAD_ONCE_INIT;
static void handles_fork_install(void) { pthread_atfork(handles_fork_prepare, handles_fork_after, handles_fork_after); }

static const char *kind_name(enum gw_live_kind kind) { return kind == GW_LIVE_COMM ? "communicator" : "bucketer"; }

void gw__live_add(const void *p, enum gw_live_kind kind) {
  pthread_once(&handles_fork_once, handles_fork_install);
  pthread_mutex_lock(&handles_mu);
  if (nhandles == handles_cap) {
    const size_t cap = handles_cap ? 2 * handles_cap : 16;
    struct live_handle *grown = realloc(handles, cap * sizeof *grown);
    if (grown) handles = grown, handles_cap = cap;
  }
  if (nhandles < handles_cap) handles[nhandles++] = (struct live_handle){p, kind};
  else handles_lost = true;
  pthread_mutex_unlock(&handles_mu);
}

/* p's kind among the live handles (taken out when `take` and of `kind`),
 * 0 when p is none; `kind` itself when handles were lost. */
static int live_find(const void *p, enum gw_live_kind kind, bool take) {
  pthread_mutex_lock(&handles_mu);
  int found = handles_lost ? (int)kind : 0;
  for (size_t i = 0; i < nhandles; i++)
    if (handles[i].p == p) {
      found = (int)handles[i].kind;
      if (take && handles[i].kind == kind) handles[i] = handles[--nhandles];
      break;
    }
  pthread_mutex_unlock(&handles_mu);
  return found;
}

void gw__live_remove(const void *p, enum gw_live_kind kind) { (void)live_find(p, kind, true); }

bool gw__live_has(const void *p, enum gw_live_kind kind) { return live_find(p, kind, false) == (int)kind; }

/* "FN: P is not a live KIND" (or is another kind's handle) as the thread's error and a warning. */
static void not_live(const void *p, int found, enum gw_live_kind kind, const char *fn) {
  char m[200];
  if (found)
    snprintf(m, sizeof m, "%s: %p is a live %s, not a %s: nothing done", fn, p, kind_name((enum gw_live_kind)found),
             kind_name(kind));
  else
    snprintf(m, sizeof m, "%s: %p is not a live %s (destroyed already?): nothing done", fn, p, kind_name(kind));
  gw__set_thread_error(m);
  GW_WARN(GW_SUB_INIT, "%s", m);
}

bool gw__live_or_refuse(const void *p, enum gw_live_kind kind, const char *fn) {
  const int found = live_find(p, kind, false);
  if (found == (int)kind) return true;
  not_live(p, found, kind, fn);
  return false;
}

bool gw__live_take_or_refuse(const void *p, enum gw_live_kind kind, const char *fn) {
  const int found = live_find(p, kind, true);
  if (found == (int)kind) return true;
  not_live(p, found, kind, fn);
  return false;
}

bool gw__env_int_parses(const char *name) {
  const char *s = getenv(name);
  long long v;
  return !s || !*s || gw__parse_env_int(s, &v);
}

int64_t gw__env_int_min(const char *name, int64_t dflt, int64_t min) {
  const int64_t v = gw__env_int(name, dflt);
  if (v >= min || v == dflt) return v; /* (a default below min means "automatic") */
  char d[32];
  GW_WARN(GW_SUB_ENV, "%s=%s is below its least value %lld; using the default%s", name, getenv(name), (long long)min,
          default_text(dflt, d));
  return dflt;
}

/* A number in the environment as the C locale reads it (a host program in a
 * locale with decimal commas read "2.5" as 2, or refused it), and no
 * white space before it (strtod skips it there, and " 5" passed where
 * "5 " did not). */
static locale_t c_locale; /* (made once; (locale_t)0 if it could not be: then strtod's) */
static void make_c_locale(void) { c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

static double env_strtod(const char *s, char **end) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, make_c_locale);
  if (isspace((unsigned char)s[0])) {
    *end = (char *)s;
    return 0;
  }
  return c_locale ? strtod_l(s, end, c_locale) : strtod(s, end);
}

double gw__env_double(const char *name, double dflt) {
  const char *s = getenv(name);
  if (!s || !*s) return dflt;
  char *end = NULL;
  double v = env_strtod(s, &end);
  if (end == s || *end || v != v) { /* NaN compares false with everything: a timeout of NaN never expired */
    GW_WARN(GW_SUB_ENV, "%s=%s is not a number; using the default %g", name, s, dflt);
    return dflt;
  }
  GW_INFO(GW_SUB_ENV, "%s set to %g", name, v);
  return v;
}

bool gw__env_seconds_checked(const char *name, double dflt, bool zero_ok, double *out) {
  *out = dflt;
  const char *s = getenv(name);
  if (!s || !*s) return true;
  char *end = NULL;
  const double v = env_strtod(s, &end);
  if (end == s || *end || !isfinite(v) || !(v > 0 || (zero_ok && v == 0))) return false;
  GW_INFO(GW_SUB_ENV, "%s set to %g", name, v);
  *out = v;
  return true;
}

const char *gw__env_str(const char *name, const char *dflt) {
  const char *s = getenv(name);
  return (s && *s) ? s : dflt;
}

/* ---- time and waiting ----------------------------------------------------------- */
double gw__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Where getrandom cannot answer: the realtime clock's nanoseconds, the pid
 * and a stack address folded into 32 bits (a double's seconds times 1e9
 * exceeded 32 bits: converting it was undefined, and saturated on aarch64:
 * every rank drew the same "random" bits). */
uint32_t gw__clock_bits(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int here;
  uint64_t v = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 40) ^
               (uint64_t)(uintptr_t)&here;
  v ^= v >> 33, v *= 0xff51afd7ed558ccdull, v ^= v >> 33;
  return (uint32_t)(v ^ (v >> 32));
}

int gw__ms_until(double deadline) {
  double ms = (deadline - gw__now()) * 1000.0;
  return ms <= 0 ? 0 : ms >= (double)INT_MAX ? INT_MAX : (int)ms + (ms > (int)ms);
}

/* Time-based phases, so the policy means the same whether a poll is a load from
 * shared memory (shm) or a system call (tcp): spin for 50 us (catches almost
 * every handoff when ranks have cores of their own), then yield until 2 ms (with
 * more ranks than cores, lets the rank we wait for run), then sleep with
 * growing intervals up to 100 us.  The spin phase adapts: when a yield hands
 * the core to someone else for a while (more ranks than cores, or other load),
 * the rank we wait for is likely queued behind us on our own core and every
 * microsecond spent spinning delays it, so the process spins only 2 us from
 * then on (Open MPI yields at once when oversubscribed); when yields come back
 * at once (nobody else wants the core), spinning costs no one anything and the
 * phase grows back to 50 us.  Measured with two other CPU-bound processes on
 * this 2-core machine: 2-rank 8 B allreduce 58 us with a fixed 50 us spin, 9
 * us with 2 us.  GW_SPIN_US fixes the phase instead (gw__waiter_set_spin). */
#define QUICK_SPINS 128
#define YIELD_S 2e-3
#define SPIN_MIN_S 2e-6
#define SPIN_MAX_S 50e-6
static _Atomic double spin_s = SPIN_MAX_S;
static _Atomic bool spin_fixed;
/* Live communicators whose machine runs more ranks than cores: while there is
 * one, waits yield at once (unless GW_SPIN_US fixed the phase).  A count, not
 * a setting: it was a fixed 0 for the process's life, so a communicator made
 * after an oversubscribed one was destroyed never spun again. */
static _Atomic int oversub_comms;

void gw__waiter_set_spin(double seconds) {
  atomic_store_explicit(&spin_s, seconds, memory_order_relaxed);
  atomic_store_explicit(&spin_fixed, true, memory_order_relaxed);
}

void gw__waiter_oversubscribed(int delta) { atomic_fetch_add_explicit(&oversub_comms, delta, memory_order_relaxed); }

/* The spinning phase a wait takes now. */
double gw__waiter_spin(void) {
  if (!atomic_load_explicit(&spin_fixed, memory_order_relaxed) &&
      atomic_load_explicit(&oversub_comms, memory_order_relaxed) > 0)
    return 0;
  return atomic_load_explicit(&spin_s, memory_order_relaxed);
}

static _Atomic uint32_t fast_yields; /* in a row, since the last slow one */

/* One yield took `took` seconds: see above.  The phase shrinks at the first
 * slow yield but grows only after 256 fast ones in a row: with more ranks
 * than cores many yields find nobody else on the core, and growing on each
 * of them brought the 50 us spin back at once (4 ranks, 8 B: ~100 us). */
static void adapt_spin(double took) {
  if (atomic_load_explicit(&spin_fixed, memory_order_relaxed)) return;
  if (took > 20e-6) {
    atomic_store_explicit(&fast_yields, 0, memory_order_relaxed);
    atomic_store_explicit(&spin_s, SPIN_MIN_S, memory_order_relaxed);
  } else if (took < 5e-6 && atomic_fetch_add_explicit(&fast_yields, 1, memory_order_relaxed) >= 255) {
    atomic_store_explicit(&fast_yields, 0, memory_order_relaxed);
    double s = atomic_load_explicit(&spin_s, memory_order_relaxed);
    atomic_store_explicit(&spin_s, GW_MIN(2 * s, SPIN_MAX_S), memory_order_relaxed);
  }
}

void gw__waiter_init(struct gw_waiter *w, double timeout_s) {
  w->iter = 0;
  /* The first polls do not read the clock (~6 us of pauses); on contended
   * cores even that delays the rank we wait for, so yield almost at once. */
  w->quick = gw__waiter_spin() <= SPIN_MIN_S ? 4 : QUICK_SPINS;
  w->start = 0;
  w->deadline = timeout_s > 0 ? timeout_s : 0; /* made absolute on the first slow pause */
}

bool gw__waiter_pause(struct gw_waiter *w) {
  uint32_t it = w->iter++;
  if (it < w->quick) {
    gw__cpu_relax();
    return true;
  }
  double now = gw__now();
  if (it == w->quick) {
    w->start = now;
    if (w->deadline > 0) w->deadline += now;
  }
  double waited = now - w->start;
  if (waited < gw__waiter_spin()) {
    for (int i = 0; i < 16; i++) gw__cpu_relax();
  } else if (waited < YIELD_S) {
    sched_yield();
    adapt_spin(gw__now() - now);
  } else {
    long ns = waited < 20e-3 ? 2000 : waited < 200e-3 ? 20000 : 100000;
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
  }
  return !(w->deadline > 0 && now > w->deadline);
}

bool gw__waiter_done_spinning(const struct gw_waiter *w) {
  return w->iter > w->quick && gw__now() - w->start >= gw__waiter_spin();
}

bool gw__waiter_expired(const struct gw_waiter *w) {
  return w->iter > w->quick && w->deadline > 0 && gw__now() > w->deadline;
}

/* ---- node identity ------------------------------------------------------------- */
void gw__node_id(char *out, size_t len) {
  char host[128] = "?";
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = 0;
  char boot[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
    fclose(f);
    boot[strcspn(boot, "\n")] = 0;
  }
  snprintf(out, len, "%s/%s", host, boot);
}
