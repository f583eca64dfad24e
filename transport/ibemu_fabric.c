/* ibemu_fabric.c - where the verbs emulator's things are (see ibemu.h): the
 * host-wide LID registry (/dev/shm/gw-ibemu-lids-<uid>, {pid, memfd number,
 * nonce} per LID; a dead process's LID is taken over by the next one that
 * needs it), the GIDs that encode a LID, each context's shared segment (a
 * memfd), and reaching a responder's segment with pidfd_getfd. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core.h"
#include "ibv.h"
#include "ibemu.h"

/* ---- the LID registry: {pid, memfd number, nonce} per LID ------------------------- */
struct lid_ent {
  _Atomic int32_t pid, fd;
  _Atomic uint64_t nonce; /* written last when claimed (release), cleared first on release */
};
static struct lid_ent *registry;
static int registry_errno;
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;

static void registry_init(void) {
  char path[64];
  snprintf(path, sizeof path, "/dev/shm/gw-ibemu-lids-%u", (unsigned)getuid());
  size_t size = NLIDS * sizeof(struct lid_ent);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_uid != getuid() ||
      ((size_t)st.st_size < size && ftruncate(fd, (off_t)size) != 0)) {
    registry_errno = fd < 0 ? errno : EACCES;
    GW_WARN(GW_SUB_INIT, "ibemu: cannot use the LID registry %s: %s", path, strerror(registry_errno));
    if (fd >= 0) close(fd);
    return;
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  registry_errno = errno;
  close(fd);
  if (p != MAP_FAILED) registry = p;
}

static int pid_dead(int32_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

/* Claims a free LID (its pid 0 or dead) for this context; 0 when none is left.
 * The search starts at a random LID, so a LID freed by a dead process is rarely
 * taken again at once (a peer may still be trying to reach the dead one). */
uint16_t gw__ibemu_lid_claim(int32_t pid, int fd, uint64_t nonce) {
  for (unsigned k = 0; k < NLIDS - 1; k++) {
    unsigned lid = 1 + (unsigned)((nonce + k) % (NLIDS - 1));
    struct lid_ent *e = &registry[lid];
    int32_t p = atomic_load(&e->pid);
    if (p != 0 && !pid_dead(p)) continue;
    if (!atomic_compare_exchange_strong(&e->pid, &p, pid)) continue;
    atomic_store(&e->nonce, 0);
    atomic_store(&e->fd, fd);
    atomic_store_explicit(&e->nonce, nonce, memory_order_release);
    return (uint16_t)lid;
  }
  return 0;
}

void gw__ibemu_lid_release(uint16_t lid) {
  atomic_store(&registry[lid].nonce, 0);
  atomic_store(&registry[lid].fd, -1);
  atomic_store_explicit(&registry[lid].pid, 0, memory_order_release);
}

/* A consistent {pid, fd, nonce} of a LID in use; false when none.  The segment's
 * own nonce is checked after mapping, so a torn read cannot reach a wrong one. */
static int lid_read(uint16_t lid, int32_t *pid, int *fd, uint64_t *nonce) {
  struct lid_ent *e = &registry[lid];
  *nonce = atomic_load_explicit(&e->nonce, memory_order_acquire);
  *pid = atomic_load(&e->pid);
  *fd = atomic_load(&e->fd);
  return *nonce != 0 && *pid > 0 && *fd >= 0 && atomic_load(&e->nonce) == *nonce;
}

/* ---- GIDs: index 0 fe80::6777:656d:7500:<lid>, index 1 ::ffff:127.103.<lid> ------- */
void gw__ibemu_lid_gid(uint16_t lid, int index, union ibv_gid *g) {
  static const uint8_t magic[6] = {'g', 'w', 'e', 'm', 'u', 0};
  memset(g, 0, sizeof *g);
  if (index == 0) {
    g->raw[0] = 0xfe, g->raw[1] = 0x80;
    memcpy(g->raw + 8, magic, sizeof magic);
  } else {
    g->raw[10] = g->raw[11] = 0xff;
    g->raw[12] = 127, g->raw[13] = 'g';
  }
  g->raw[14] = (uint8_t)(lid >> 8), g->raw[15] = (uint8_t)lid;
}

uint16_t gw__ibemu_gid_lid(const union ibv_gid *g) {
  uint16_t lid = (uint16_t)(g->raw[14] << 8 | g->raw[15]);
  union ibv_gid want;
  for (int i = 0; i < 2; i++) {
    gw__ibemu_lid_gid(lid, i, &want);
    if (!memcmp(want.raw, g->raw, sizeof want.raw)) return lid;
  }
  return 0;
}

int gw__ibemu_registry_open(void) {
  pthread_once(&registry_once, registry_init);
  return registry ? 0 : registry_errno ? registry_errno : EACCES;
}

/* ---- segments ------------------------------------------------------------------------ */
struct seg *gw__ibemu_seg_create(int *memfd) {
  *memfd = memfd_create("gw-ibemu", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (*memfd < 0) return NULL;
  /* Sealed against shrinking, so a mapping peer can never fault past its end. */
  if (ftruncate(*memfd, SEG_SIZE) == 0 &&
      fcntl(*memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    void *p = mmap(NULL, SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, *memfd, 0);
    if (p != MAP_FAILED) return p;
  }
  int e = errno;
  close(*memfd);
  errno = e;
  return NULL;
}

/* ---- reaching the responder -------------------------------------------------------- */
static struct seg *seg_attach(int32_t pid, int fd, uint64_t nonce, int *pidfd_out) {
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0) return NULL;
  int mfd = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
  int seals = mfd >= 0 ? fcntl(mfd, F_GET_SEALS) : -1;
  struct stat st;
  struct seg *s = MAP_FAILED;
  /* Only a sealed memfd of the right size is mapped: it cannot shrink under us. */
  if (seals > 0 && (seals & F_SEAL_SHRINK) && fstat(mfd, &st) == 0 && (size_t)st.st_size == SEG_SIZE)
    s = mmap(NULL, SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  if (mfd >= 0) close(mfd);
  if (s != MAP_FAILED && s->hdr.h.magic == EMU_MAGIC && s->hdr.h.nonce == nonce && s->hdr.h.pid == pid) {
    *pidfd_out = pidfd;
    return s;
  }
  if (s != MAP_FAILED) munmap(s, SEG_SIZE);
  close(pidfd);
  return NULL;
}

static int process_exited(int pidfd) {
  struct pollfd p = {.fd = pidfd, .events = POLLIN};
  return poll(&p, 1, 0) != 0;
}

static struct remote *remote_slot(struct emu_ctx *c, uint16_t lid) {
  for (int i = 0; i < c->nrem; i++)
    if (c->rem[i].lid == lid) return &c->rem[i];
  if (c->nrem == c->caprem) {
    int cap = c->caprem ? 2 * c->caprem : 8;
    struct remote *r = realloc(c->rem, (size_t)cap * sizeof *r);
    if (!r) return NULL;
    c->rem = r, c->caprem = cap;
  }
  c->rem[c->nrem] = (struct remote){.lid = lid, .pidfd = -1};
  return &c->rem[c->nrem++];
}

/* The segment behind a LID and its process, or NULL while it cannot be reached
 * (unknown LID, closed context, dead process). */
static struct seg *remote_seg(struct emu_ctx *c, uint16_t lid, int32_t *pid) {
  if (lid == 0) return NULL;
  if (lid == c->lid) {
    *pid = c->pid;
    return c->seg;
  }
  int32_t rpid;
  int rfd;
  uint64_t nonce;
  struct remote *r;
  if (!lid_read(lid, &rpid, &rfd, &nonce) || !(r = remote_slot(c, lid))) return NULL;
  if (r->seg && r->nonce != nonce) {
    munmap(r->seg, SEG_SIZE), close(r->pidfd);
    r->seg = NULL;
  }
  if (!r->seg) {
    if (!(r->seg = seg_attach(rpid, rfd, nonce, &r->pidfd))) return NULL;
    r->pid = rpid, r->nonce = nonce, r->exited = 0, r->checked = 0;
  }
  /* A crashed process leaves alive = 1; its pidfd says so (a system call, so at
   * most once a millisecond: writes with data see ESRCH at once anyway). */
  double t = gw__now();
  if (t - r->checked >= 1e-3) r->checked = t, r->exited = process_exited(r->pidfd);
  if (!atomic_load(&r->seg->hdr.h.alive) || r->exited) return NULL;
  *pid = r->pid;
  return r->seg;
}

/* The responder's segment for q.  A QP stays bound to the context it reached
 * first (from RTR on): if that one died and another took its LID, the other is
 * unreachable for this QP, as a new machine behind an old address would be. */
struct seg *gw__ibemu_qp_remote(struct emu_qp *q, int32_t *pid) {
  struct seg *rs = remote_seg(q->ctx, q->ah.is_global ? gw__ibemu_gid_lid(&q->ah.grh.dgid) : q->ah.dlid, pid);
  if (rs && !q->dest_nonce) q->dest_nonce = rs->hdr.h.nonce;
  return rs && rs->hdr.h.nonce == q->dest_nonce ? rs : NULL;
}
