/* shm.c - the shared-memory transport: one connection is a POSIX shared-memory
 * segment created by the receiver, holding a control block (head/tail counters on
 * their own cache lines, one chunk header per slot), the slots, and per slot
 * the lines of a low-latency (LL) chunk.  Simple format: the sender writes
 * chunks by direct stores into the slot (the collective reduces straight into
 * it), then publishes by storing the chunk's position into the slot's header
 * line; the receiver polls that line, consumes in place and advances head.  A
 * chunk of at most GW_SHM_INLINE bytes travels inside its header line, so a
 * small message costs the receiver one cache-line transfer, not three.  LL
 * format (small chunks, when the collective asks): the payload continues in
 * lines of 56 data bytes plus the chunk's position, each stored with release
 * order after its data, so the receiver watches all of them at once while it
 * waits (each line's transfer overlaps the others' and the header's instead of
 * the data being fetched after the header); the chunk is taken once its header
 * line, stored last, and every line carry its position.  Positions only grow, so
 * the lines are reused without clearing.  Segments are created 0600,
 * pre-faulted once, and unlinked as soon as both sides have mapped them, so no
 * crash leaves files in /dev/shm after setup.  Not here: waiting (the caller's
 * policy) and any notion of a collective. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "transport.h"

#define SHM_MAGIC 0x67777368u /* "gwsh" */
#define SHM_MAX_SLOTS 64

#define GW_SHM_INLINE 24
/* One cache line per slot: the flag, the header and a small payload together. */
struct shm_line {
  _Atomic uint64_t pos; /* 1 + the chunk's position in the stream once published */
  struct gw_chunk_hdr hdr;
  uint8_t inline_data[GW_SHM_INLINE];
};
_Static_assert(sizeof(struct shm_line) == GW_CACHELINE, "a slot header is one cache line");
/* Counters shared between processes: a lock-based fallback (libatomic's
 * per-process locks) would tear them across processes. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");

/* One line of an LL chunk: data, then the flag (1 + the chunk's position). */
#define LL_LINE_DATA 56
struct ll_line {
  uint8_t data[LL_LINE_DATA];
  _Atomic uint64_t flag;
};
_Static_assert(sizeof(struct ll_line) == GW_CACHELINE, "an LL line is one cache line");
/* An LL chunk: GW_SHM_INLINE bytes in the header line and up to LL_LINES lines;
 * its capacity is rounded down to a cache line, so blocks stay aligned.  The
 * staging buffer holds all the lines' bytes (LL_STAGE_BYTES), so whole lines
 * are always copied. */
#define LL_LINES 64
#define LL_CHUNK_BYTES 3584
#define LL_STAGE_BYTES GW_ALIGN_UP(GW_SHM_INLINE + LL_LINES * LL_LINE_DATA, GW_CACHELINE)
_Static_assert(LL_CHUNK_BYTES % 64 == 0 && LL_CHUNK_BYTES <= GW_SHM_INLINE + LL_LINES * LL_LINE_DATA, "LL capacity");
/* Set in the header line's flag: the chunk is in the LL format. */
#define LL_BIT (1ull << 63)

struct shm_ctrl {
  _Atomic uint64_t head; /* chunks released; written by the receiver only */
  char pad1[GW_CACHELINE - sizeof(uint64_t)];
  uint32_t magic, nslots, slot_bytes, pad2;
  char pad2b[GW_CACHELINE - 4 * sizeof(uint32_t)];
  _Atomic uint64_t word; /* shared_word: for the layers above, zero at setup */
  char pad3[GW_CACHELINE - sizeof(uint64_t)];
  _Atomic uint64_t dflag[2][GW_CACHELINE / sizeof(uint64_t)]; /* dev_flag: [which][0], a line each */
  struct shm_line line[SHM_MAX_SLOTS];
  /* recv_abandon: the receiver's reason, then the flag (release). */
  _Atomic uint64_t abandoned;
  char why[GW_ERRMSG_MAX];
  /* waiting: [is_send] what that end published it runs, a seqlock (ver odd
   * while written, 0 never), a line each */
  struct shm_waiting {
    _Alignas(GW_CACHELINE) _Atomic uint64_t ver;
    _Atomic uint64_t d[3];
    char pad[GW_CACHELINE - 4 * sizeof(uint64_t)];
  } waiting[2];
};
_Static_assert(sizeof(struct gw_opdesc) == 3 * sizeof(uint64_t), "an operation's descriptor is three words");
_Static_assert(offsetof(struct shm_ctrl, waiting) % GW_CACHELINE == 0, "a line for each end's publication");

struct shm_handle {
  char name[64];
  uint64_t size;
  uint32_t nslots, slot_bytes;
};
_Static_assert(sizeof(struct shm_handle) <= GW_CONN_HANDLE_BYTES, "shm handle fits the opaque handle");

struct shm_conn {
  struct shm_ctrl *ctrl;
  uint8_t *slots;
  size_t map_size;
  uint32_t nslots, slot_bytes;
  uint64_t pos;       /* sender: next chunk to fill; receiver: next chunk to read */
  uint64_t peer_pos;  /* sender: cached copy of the receiver's head */
  struct ll_line *ll; /* [nslots][LL_LINES] in the segment */
  uint8_t *stage;     /* private, LL_STAGE_BYTES: the sender's chunk before it is
                         spread over lines, the receiver's after it is gathered */
  bool cur_ll;        /* sender: the room handed out is stage (an LL chunk) */
  char name[64];
  bool owner_unlinked;
};

static size_t data_offset(void) { return GW_ALIGN_UP(sizeof(struct shm_ctrl), 4096); }
static size_t ll_offset(uint32_t nslots, uint32_t slot_bytes) { return data_offset() + (size_t)nslots * slot_bytes; }
static size_t map_bytes(uint32_t nslots, uint32_t slot_bytes) {
  return ll_offset(nslots, slot_bytes) + (size_t)nslots * LL_LINES * sizeof(struct ll_line);
}

/* The LL lines and the private staging buffer of a mapped connection. */
static bool ll_attach(struct shm_conn *s, void *map) {
  s->ll = (struct ll_line *)((uint8_t *)map + ll_offset(s->nslots, s->slot_bytes));
  s->stage = aligned_alloc(GW_CACHELINE, LL_STAGE_BYTES);
  if (s->stage) memset(s->stage, 0, LL_STAGE_BYTES); /* whole lines are copied: no byte is ever undefined */
  return s->stage != NULL;
}

/* A segment's creator holds a write lock (an open file description's, on
 * byte 0) on it from its creation: the kernel keeps it while the creator maps
 * the segment, its descriptor closed or not, and drops it when the creator
 * unmaps or dies.  Whether someone holds that lock on the file at dirfd/name. */
static bool creator_holds(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return true; /* cannot tell: kept */
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  const bool held = fcntl(fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK;
  close(fd);
  return held;
}

/* When the process now at pid started, in seconds since the epoch, boot
 * being proc_boot_time's (/proc's start time counts clock ticks since boot);
 * 0 where it cannot be read. */
static double pid_start(int pid, double boot) {
  char buf[1024];
  const char *p = gw__proc_stat_fields(pid, 0, buf, sizeof buf);
  unsigned long long start = 0;
  /* after it: state (field 3) ... starttime (field 22) */
  if (!p || sscanf(p, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                   &start) != 1)
    return 0;
  const long tck = sysconf(_SC_CLK_TCK);
  return tck > 0 ? boot + (double)start / (double)tck : 0;
}

/* When this machine booted, in seconds since the epoch (the real time now
 * less the time since boot, to the clock's precision: /proc/stat's btime is
 * whole seconds); 0 when /proc is not this process's pid namespace's (a pid
 * of ours would name another process there). */
static double proc_boot_time(void) {
  char self[32], want[32];
  const ssize_t n = readlink("/proc/self", self, sizeof self - 1);
  snprintf(want, sizeof want, "%d", (int)getpid());
  if (n <= 0 || (self[n] = 0, strcmp(self, want) != 0)) return 0;
  struct timespec rt, bt;
  if (clock_gettime(CLOCK_REALTIME, &rt) != 0 || clock_gettime(CLOCK_BOOTTIME, &bt) != 0) return 0;
  const double boot = (double)(rt.tv_sec - bt.tv_sec) + (double)(rt.tv_nsec - bt.tv_nsec) * 1e-9;
  /* this process's own start, by that reckoning, must not lie ahead (a
   * sandbox whose /proc counts from another origin) */
  return pid_start(getpid(), boot) <= (double)rt.tv_sec + 1.0 ? boot : 0;
}

/* Whether the process now at pid started after time t (seconds since the
 * epoch): then it is not the one that made a file last changed at t, but a
 * later one given its pid.  False when it cannot tell (boot 0: see
 * proc_boot_time).  A wall clock stepped forward between the making and now
 * makes a creator look later than it was: its lock still keeps its file. */
static bool pid_started_after(int pid, double t, double boot) {
  if (!boot) return false;
  const double start = pid_start(pid, boot);
  return start > 0 && start > t + 0.02; /* two ticks' slack */
}

/* Leftovers of ranks killed during setup (before their peers unlinked the
 * names) under a launcher that does not sweep as gw-run does (torchrun, srun,
 * mpirun): this user's /dev/shm/gw-* files whose creator is gone.  Gone: its
 * pid, named in the file name with its pid namespace, is free in ours; or,
 * for another namespace, the file is older than SWEEP_AGE_S and nobody holds
 * its lock (a segment's creator does while it maps it, a rank its liveness
 * file's while its communicator lives).  The lock is what sees a container
 * restarted with the pod's /dev/shm kept (its new pid namespace never saw
 * the pids: those files stayed for good, each a FIFO's worth of the pod's
 * memory).  The age keeps a file just made, before its creator took the
 * lock.  In our own namespace a live pid keeps its file unless the process
 * at that pid started after the file was last changed and nobody holds the
 * lock: a container restarted in a new pid namespace that got the old one's
 * number (the kernel reuses them), its ranks the old ranks' pids (2, 3, ...
 * again), kept every crashed start's files for good until /dev/shm was full.
 * A creator whose lock failed keeps its segment for its peer: it started
 * before it made it.  Once per process, at the first gw_comm_init; the
 * number removed. */
#define SWEEP_AGE_S 60
static int sweep_leftovers(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  const double boot = proc_boot_time();
  const unsigned long long own_ns = (unsigned long long)gw__pidns_self();
  const uid_t uid = geteuid();
  const time_t now = time(NULL);
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    unsigned hash;
    int peer, self, pid, at = 0;
    if (sscanf(e->d_name, "gw-%8x-%d-%d-%d-%n", &hash, &peer, &self, &pid, &at) != 4 || !at || pid <= 0)
      continue;
    const char *dash = strrchr(e->d_name, '-');
    char *end = NULL;
    const unsigned long long ns = strtoull(dash + 1, &end, 10);
    struct stat st;
    if (!end || *end || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != uid)
      continue;
    /* (this process's own pid too: at its first init it has made none yet,
     * so a file of its pid is a former process's, one rank per container
     * restarted with the same pid) */
    const bool ours = own_ns && ns == own_ns;
    const bool pid_gone = ours && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    /* (its modification time is at or after its making: a creator never
     * started after it) */
    const bool pid_reused = ours && !pid_gone &&
                            pid_started_after(pid, (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9, boot);
    if (pid_gone || ((pid_reused || (!ours && now - st.st_mtime > SWEEP_AGE_S)) && !creator_holds(dirfd(d), e->d_name)))
      removed += unlinkat(dirfd(d), e->d_name, 0) == 0;
  }
  closedir(d);
  return removed;
}

static pthread_once_t sweep_once = PTHREAD_ONCE_INIT;
static _Atomic int swept;
static void sweep_now(void) { atomic_store(&swept, sweep_leftovers()); }

int gw__shm_sweep(void) {
  pthread_once(&sweep_once, sweep_now);
  return atomic_exchange(&swept, 0); /* told once */
}

/* The FIFOs this process made and holds (receiving ends): how much of
 * /dev/shm it took, for the message when there is no room for the next. */
static _Atomic int held_fifos;
static _Atomic unsigned long long held_bytes;

static bool shm_can_connect(const struct gw_peer_info *self, const struct gw_peer_info *peer) {
  return strcmp(self->node_id, peer->node_id) == 0 && self->shm_id == peer->shm_id && self->uid == peer->uid;
}

static gw_result_t shm_recv_setup(struct gw_conn *c, const struct gw_conn_params *p,
                                  struct gw_conn_handle *out, struct gw_errctx *err) {
  static _Atomic uint32_t counter;
  gw_result_t res = GW_SUCCESS;
  if (p->nslots < 2 || p->nslots > SHM_MAX_SLOTS || p->slot_bytes < 64 || p->slot_bytes % 64)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT,
                   "rank %d: shm FIFO of %u slots x %u bytes is not allowed (2..%d slots, bytes a multiple of 64)",
                   c->self, p->nslots, p->slot_bytes, SHM_MAX_SLOTS);
  struct shm_conn *s = calloc(1, sizeof *s);
  if (!s) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
  s->nslots = p->nslots;
  s->slot_bytes = p->slot_bytes;
  s->map_size = map_bytes(p->nslots, p->slot_bytes);
  /* Job, peers and creator in the name (gw-run removes what its dead ranks left:
   * a rank killed during setup leaves its segments behind), and random bits:
   * the rest repeats across runs (a requeued job keeps its token, a container
   * its pids), and a leftover of the same name would fail this one. */
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 8; tries++) {
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != sizeof rnd) rnd = gw__clock_bits() ^ (uint32_t)tries;
    snprintf(s->name, sizeof s->name, "/gw-%08llx-%d-%d-%d-%u-%08x-%llu",
             (unsigned long long)(p->job_hash & 0xffffffffu), c->peer, c->self, (int)getpid(),
             atomic_fetch_add(&counter, 1), rnd, (unsigned long long)gw__pidns_self());
    fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    const int e = errno;
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: shm_open(%s) failed: %s (%s)", c->self, s->name, strerror(e),
                  e == EMFILE || e == ENFILE ? "this rank is out of file descriptors: raise `ulimit -n`"
                  : e == ENOSPC ? "/dev/shm has no room for another file: see `df -i /dev/shm` and `df -h /dev/shm`"
                  : e == ENOMEM ? "this machine is out of memory"
                                : "is /dev/shm mounted and writable? GW_TRANSPORT=tcp runs without it");
    goto fail_free;
  }
  /* Held while this rank maps it (sweep_leftovers); without locks there, the
   * pid rule alone sees it left. */
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  if (fcntl(fd, F_OFD_SETLK, &fl) != 0)
    GW_INFO(GW_SUB_INIT, "rank %d: cannot lock %s (%s): another pid namespace's sweep may take it for a "
            "leftover after a minute", c->self, s->name, strerror(errno));
  /* A segment over the file-size limit (ulimit -f): sizing it raises SIGXFSZ,
   * whose default action killed the rank without a word. */
  struct rlimit fsz;
  if (getrlimit(RLIMIT_FSIZE, &fsz) == 0 && fsz.rlim_cur != RLIM_INFINITY && s->map_size > fsz.rlim_cur) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: the shared-memory FIFO from rank %d takes %zu bytes, over this "
                  "process's file-size limit (ulimit -f) of %llu bytes: raise it, or lower GW_SHM_SLOTS / "
                  "GW_SHM_SLOT_BYTES", c->self, c->peer, s->map_size, (unsigned long long)fsz.rlim_cur);
    goto fail_unlink;
  }
  if (ftruncate(fd, (off_t)s->map_size) != 0) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: sizing %s to %zu bytes failed: %s (is /dev/shm full?)",
                  c->self, s->name, s->map_size, strerror(errno));
    goto fail_unlink;
  }
  /* The pages reserved now: tmpfs sizes a file without them, MAP_POPULATE
   * skips what it cannot get, and the first store to a missing page is a
   * SIGBUS (a container's 64 MiB /dev/shm holds about eight FIFOs). */
  int fe;
  do /* tmpfs stops a long fallocate for any caught signal (a data loader's SIGCHLD) */
    fe = posix_fallocate(fd, 0, (off_t)s->map_size);
  while (fe == EINTR);
  if (fe != 0 && fe != EOPNOTSUPP && fe != EINVAL) {
    struct statvfs vs;
    char room[96] = "";
    if (statvfs("/dev/shm", &vs) == 0)
      snprintf(room, sizeof room, " (it has %.1f MiB free of %.1f MiB)", (double)vs.f_bavail * vs.f_frsize / 1048576.0,
               (double)vs.f_blocks * vs.f_frsize / 1048576.0);
    /* What this rank took already, so that /dev/shm can be sized (the
     * README's table gives a job's need). */
    const int held = atomic_load(&held_fifos);
    char holds[96] = "";
    if (held)
      snprintf(holds, sizeof holds, "; this process holds %d FIFO%s (%.1f MiB) already (README: \"How much /dev/shm\")",
               held, held == 1 ? "" : "s", (double)atomic_load(&held_bytes) / 1048576.0);
    const char *algo = gw__env_str("GW_ALGO", "");
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot reserve %zu bytes of /dev/shm%s for the FIFO from rank %d: "
                  "%s: %s, lower GW_SHM_SLOTS / GW_SHM_SLOT_BYTES (%u slots of %u bytes now)%s%s", c->self,
                  s->map_size, room, c->peer, strerror(fe),
                  fe == ENOMEM ? "the process's memory limit (a cgroup's) is reached: raise it"
                               : "enlarge /dev/shm (docker --shm-size, a Memory emptyDir on Kubernetes)",
                  s->nslots, s->slot_bytes,
                  strcasecmp(algo, "ring") ? ", or set GW_ALGO=ring (ring FIFOs only)" : "", holds);
    goto fail_unlink;
  }
  /* MAP_POPULATE: first-touch page faults are very slow on some machines, so all of
   * the FIFO is faulted in now, once per communicator, never on the data path. */
  void *m = mmap(NULL, s->map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (m == MAP_FAILED) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: mmap of %s (%zu bytes) failed: %s", c->self, s->name,
                  s->map_size, strerror(errno));
    goto fail_unlink;
  }
  close(fd);
  s->ctrl = m;
  s->slots = (uint8_t *)m + data_offset();
  if (!ll_attach(s, m)) {
    munmap(m, s->map_size);
    shm_unlink(s->name);
    free(s);
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
  }
  /* A fresh mapping is zero: no LL line carries a flag yet. */
  atomic_store(&s->ctrl->head, 0);
  for (uint32_t i = 0; i < SHM_MAX_SLOTS; i++) atomic_store(&s->ctrl->line[i].pos, 0);
  s->ctrl->nslots = s->nslots;
  s->ctrl->slot_bytes = s->slot_bytes;
  s->ctrl->magic = SHM_MAGIC;

  struct shm_handle h = {.size = s->map_size, .nslots = s->nslots, .slot_bytes = s->slot_bytes};
  snprintf(h.name, sizeof h.name, "%s", s->name);
  memset(out, 0, sizeof *out);
  memcpy(out->bytes, &h, sizeof h);
  c->priv = s;
  atomic_fetch_add(&held_fifos, 1);
  atomic_fetch_add(&held_bytes, s->map_size);
  return GW_SUCCESS;

fail_unlink:
  close(fd);
  shm_unlink(s->name);
fail_free:
  free(s);
  return res;
}

static gw_result_t shm_send_connect(struct gw_conn *c, const struct gw_conn_params *p,
                                    const struct gw_conn_handle *in, struct gw_errctx *err) {
  struct shm_handle h;
  memcpy(&h, in->bytes, sizeof h);
  h.name[sizeof h.name - 1] = 0;
  if (h.nslots != p->nslots || h.slot_bytes != p->slot_bytes || h.size != map_bytes(h.nslots, h.slot_bytes))
    return gw__err(err, GW_ERR_INVALID_ARGUMENT,
                   "rank %d: rank %d's shm FIFO has %u x %u bytes, this rank expects %u x %u "
                   "(set the same GW_SHM_SLOTS / GW_SHM_SLOT_BYTES on every rank)",
                   c->self, c->peer, h.nslots, h.slot_bytes, p->nslots, p->slot_bytes);
  struct shm_conn *s = calloc(1, sizeof *s);
  if (!s) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
  int fd = shm_open(h.name, O_RDWR, 0600);
  if (fd < 0) {
    /* Gone since rank peer published it: its creator removed it, failing
     * during setup (its own reason reaches the others; this rank's was taken
     * for the job's first failure, "the failure began at" this rank). */
    const int e = errno;
    gw_result_t res = e == ENOENT
        ? gw__err(err, GW_ERR_REMOTE, "rank %d: rank %d's segment %s is gone: rank %d removed it, failing during "
                  "setup (or something else removed /dev/shm files)", c->self, c->peer, h.name, c->peer)
        : gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot open rank %d's segment %s: %s", c->self, c->peer, h.name,
                  strerror(e));
    free(s);
    return res;
  }
  void *m = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int mmap_errno = errno;
  close(fd);
  /* Both ends are mapped now: drop the name so nothing outlives the processes. */
  shm_unlink(h.name);
  if (m == MAP_FAILED) {
    free(s);
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: mmap of rank %d's segment %s failed: %s", c->self,
                   c->peer, h.name, strerror(mmap_errno));
  }
  s->ctrl = m;
  s->map_size = h.size;
  s->slots = (uint8_t *)m + data_offset();
  s->nslots = h.nslots;
  s->slot_bytes = h.slot_bytes;
  snprintf(s->name, sizeof s->name, "%s", h.name);
  const bool fifo = s->ctrl->magic == SHM_MAGIC;
  if (!fifo || !ll_attach(s, m)) {
    munmap(m, h.size);
    free(s->stage);
    free(s);
    if (fifo) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory attaching rank %d's FIFO", c->self, c->peer);
    return gw__err(err, GW_ERR_REMOTE, "rank %d: segment %s from rank %d is not a gradwire FIFO",
                   c->self, h.name, c->peer);
  }
  c->priv = s;
  c->depth = s->nslots;
  return GW_SUCCESS;
}

static gw_result_t shm_recv_connect(struct gw_conn *c, struct gw_errctx *err) {
  (void)err;
  struct shm_conn *s = c->priv;
  /* The sender unlinked already; this covers a sender that died after mapping. */
  shm_unlink(s->name);
  s->owner_unlinked = true;
  return GW_SUCCESS;
}

static gw_result_t shm_send_slot(struct gw_conn *c, size_t bytes, void **buf, size_t *cap) {
  struct shm_conn *s = c->priv;
  if (s->pos - s->peer_pos >= s->nslots) {
    s->peer_pos = atomic_load_explicit(&s->ctrl->head, memory_order_acquire);
    if (s->pos - s->peer_pos >= s->nslots) return GW_INPROGRESS;
  }
  uint32_t slot = (uint32_t)(s->pos % s->nslots);
  s->cur_ll = c->proto == GW_PROTO_LL && bytes > GW_SHM_INLINE && bytes <= LL_CHUNK_BYTES;
  if (bytes <= GW_SHM_INLINE) {
    *buf = s->ctrl->line[slot].inline_data;
    *cap = GW_SHM_INLINE;
  } else if (s->cur_ll) {
    *buf = s->stage;
    *cap = LL_CHUNK_BYTES;
  } else {
    *buf = s->slots + (size_t)slot * s->slot_bytes;
    *cap = s->slot_bytes;
  }
  return GW_SUCCESS;
}

/* Lines after the header line that an LL chunk of `bytes` fills. */
static size_t ll_nlines(size_t bytes) {
  return bytes <= GW_SHM_INLINE ? 0 : GW_DIV_UP(bytes - GW_SHM_INLINE, LL_LINE_DATA);
}

/* Spreads the staged chunk over its header line and LL lines; each line's flag
 * is stored after its data with release order (a plain store on x86), so no
 * fence is needed anywhere. */
static void ll_scatter(struct shm_conn *s, uint32_t slot, size_t bytes, uint64_t flag) {
  struct ll_line *lines = s->ll + (size_t)slot * LL_LINES;
  memcpy(s->ctrl->line[slot].inline_data, s->stage, GW_SHM_INLINE);
  /* Whole lines are copied with a constant size (a few vector moves, no call);
   * the staging buffer has room past the end, so the last one may be whole too. */
  for (size_t i = 0, n = ll_nlines(bytes); i < n; i++) {
    memcpy(lines[i].data, s->stage + GW_SHM_INLINE + i * LL_LINE_DATA, LL_LINE_DATA);
    atomic_store_explicit(&lines[i].flag, flag, memory_order_release);
  }
}

static gw_result_t shm_send_post(struct gw_conn *c, const struct gw_chunk_hdr *h) {
  struct shm_conn *s = c->priv;
  uint32_t slot = (uint32_t)(s->pos % s->nslots);
  struct shm_line *l = &s->ctrl->line[slot];
  bool ll = s->cur_ll && h->bytes > GW_SHM_INLINE;
  if (ll) ll_scatter(s, slot, h->bytes, s->pos + 1);
  l->hdr = *h;
  s->pos++;
  atomic_store_explicit(&l->pos, s->pos | (ll ? LL_BIT : 0), memory_order_release);
  return GW_SUCCESS;
}

/* Whether the first n lines of slot's LL chunk carry flag.  Reads them all, so
 * their transfers overlap when the receiver waits on several. */
static bool ll_ready(const struct shm_conn *s, uint32_t slot, size_t n, uint64_t flag) {
  const struct ll_line *lines = s->ll + (size_t)slot * LL_LINES;
  bool ready = true;
  for (size_t i = 0; i < n; i++) ready &= atomic_load_explicit(&lines[i].flag, memory_order_acquire) == flag;
  return ready;
}

static void ll_gather(struct shm_conn *s, uint32_t slot, size_t bytes) {
  const struct ll_line *lines = s->ll + (size_t)slot * LL_LINES;
  memcpy(s->stage, s->ctrl->line[slot].inline_data, GW_SHM_INLINE);
  for (size_t i = 0, n = ll_nlines(bytes); i < n; i++)
    memcpy(s->stage + GW_SHM_INLINE + i * LL_LINE_DATA, lines[i].data, LL_LINE_DATA);
}

static gw_result_t shm_recv_peek(struct gw_conn *c, const struct gw_chunk_hdr **h, const void **data) {
  struct shm_conn *s = c->priv;
  uint32_t slot = (uint32_t)(s->pos % s->nslots);
  struct shm_line *l = &s->ctrl->line[slot];
  uint64_t flag = atomic_load_explicit(&l->pos, memory_order_acquire);
  if ((flag & ~LL_BIT) != s->pos + 1) {
    /* Watch the lines the expected chunk will fill while its header is not here. */
    if (c->proto == GW_PROTO_LL && c->expect <= LL_CHUNK_BYTES)
      (void)ll_ready(s, slot, ll_nlines(c->expect), s->pos + 1);
    return GW_INPROGRESS;
  }
  *h = &l->hdr;
  if (!(flag & LL_BIT)) {
    *data = l->hdr.bytes <= GW_SHM_INLINE ? (const void *)l->inline_data
                                          : (const void *)(s->slots + (size_t)slot * s->slot_bytes);
    return GW_SUCCESS;
  }
  if (l->hdr.bytes > LL_CHUNK_BYTES) return GW_ERR_REMOTE; /* not a chunk this transport sends */
  if (!ll_ready(s, slot, ll_nlines(l->hdr.bytes), s->pos + 1)) return GW_INPROGRESS;
  ll_gather(s, slot, l->hdr.bytes);
  *data = s->stage;
  return GW_SUCCESS;
}

static gw_result_t shm_recv_release(struct gw_conn *c) {
  struct shm_conn *s = c->priv;
  s->pos++;
  atomic_store_explicit(&s->ctrl->head, s->pos, memory_order_release);
  return GW_SUCCESS;
}

static uint64_t shm_position(const struct gw_conn *c) { return ((const struct shm_conn *)c->priv)->pos; }
static void shm_recv_abandon(struct gw_conn *c, const char *why) {
  struct shm_conn *s = c->priv;
  if (!s || !s->ctrl || atomic_load_explicit(&s->ctrl->abandoned, memory_order_relaxed)) return;
  snprintf(s->ctrl->why, sizeof s->ctrl->why, "%s", why);
  atomic_store_explicit(&s->ctrl->abandoned, 1, memory_order_release);
}

static bool shm_send_abandoned(struct gw_conn *c, char *why, size_t len) {
  struct shm_conn *s = c->priv;
  if (!s || !s->ctrl || !atomic_load_explicit(&s->ctrl->abandoned, memory_order_acquire)) return false;
  snprintf(why, len, "%.*s", (int)sizeof s->ctrl->why - 1, s->ctrl->why);
  return true;
}

static bool shm_waiting(struct gw_conn *c, const struct gw_opdesc *mine, double waited, bool awaited,
                        struct gw_opdesc *theirs) {
  (void)waited, (void)awaited;
  struct shm_conn *s = c->priv;
  if (!s || !s->ctrl) return false;
  uint64_t words[3];
  /* ours, unless another thread of this rank (a channel's) writes it now */
  struct shm_waiting *w = &s->ctrl->waiting[c->is_send];
  uint64_t v = atomic_load_explicit(&w->ver, memory_order_relaxed);
  if (!(v & 1) && atomic_compare_exchange_strong_explicit(&w->ver, &v, v + 1, memory_order_acquire,
                                                          memory_order_relaxed)) {
    atomic_thread_fence(memory_order_release);
    memcpy(words, mine, sizeof words);
    for (int i = 0; i < 3; i++) atomic_store_explicit(&w->d[i], words[i], memory_order_relaxed);
    atomic_store_explicit(&w->ver, v + 2, memory_order_release);
  }
  struct shm_waiting *o = &s->ctrl->waiting[!c->is_send];
  const uint64_t v1 = atomic_load_explicit(&o->ver, memory_order_acquire);
  if (v1 == 0 || (v1 & 1)) return false;
  for (int i = 0; i < 3; i++) words[i] = atomic_load_explicit(&o->d[i], memory_order_relaxed);
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&o->ver, memory_order_relaxed) != v1) return false;
  memcpy(theirs, words, sizeof words);
  return true;
}

static _Atomic uint64_t *shm_shared_word(struct gw_conn *c) { return &((struct shm_conn *)c->priv)->ctrl->word; }
static uint64_t *shm_dev_flag(struct gw_conn *c, int which) {
  return (uint64_t *)&((struct shm_conn *)c->priv)->ctrl->dflag[which & 1][0];
}
_Static_assert(offsetof(struct shm_ctrl, line) <= 4096, "the device flags lie in the mapping's first page");

static void shm_close(struct gw_conn *c) {
  struct shm_conn *s = c->priv;
  if (!s) return;
  if (!c->is_send && !s->owner_unlinked) shm_unlink(s->name);
  if (!c->is_send) atomic_fetch_sub(&held_fifos, 1), atomic_fetch_sub(&held_bytes, s->map_size);
  if (s->ctrl && !c->keep_mapped) munmap(s->ctrl, s->map_size);
  free(s->stage);
  free(s);
  c->priv = NULL;
}

const struct gw_transport gw__shm_transport = {
    .name = "shm",
    .ll_chunk_bytes = LL_CHUNK_BYTES,
    .can_connect = shm_can_connect,
    .recv_setup = shm_recv_setup,
    .send_connect = shm_send_connect,
    .recv_connect = shm_recv_connect,
    .send_slot = shm_send_slot,
    .position = shm_position,
    .shared_word = shm_shared_word,
    .recv_abandon = shm_recv_abandon,
    .send_abandoned = shm_send_abandoned,
    .waiting = shm_waiting,
    .dev_flag = shm_dev_flag,
    .send_post = shm_send_post,
    .recv_peek = shm_recv_peek,
    .recv_release = shm_recv_release,
    .close = shm_close,
};
