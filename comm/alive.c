/* alive.c - whether a rank on this machine still runs, told by a lock rather
 * than by its pid.
 *
 * Waits look every second or so whether the rank they wait for died (prims.c,
 * gw__peer_alive).  A pid says so only inside one pid namespace, and only
 * until the kernel hands the pid to another process; ranks in containers that
 * share /dev/shm (and so talk over shm) but not their pid namespace (a
 * Kubernetes pod's containers, docker --ipc=shareable) had no check at all: a
 * killed peer cost the whole GW_TIMEOUT.
 *
 * Each rank creates a file in /dev/shm and takes an open-file-description
 * lock (F_OFD_SETLK) on its first byte; the kernel drops the lock when the
 * last descriptor of that open file goes, which a process's exit does (a kill
 * -9 too, before it is even a zombie).  The ranks sharing that /dev/shm open
 * each other's files after the rendezvous and test the lock (F_OFD_GETLK)
 * when a wait drags on: no lock, no rank.  Locks know nothing of pids, so
 * this works across pid namespaces and is not fooled by a reused pid.
 *
 * The files live only during gw_comm_init: each rank unlinks its own once
 * every rank has opened the others' (the settings check after the rendezvous
 * is an allgather, so a rank past it knows everyone passed the opening), so
 * nothing stays in /dev/shm however the process ends.  A rank killed inside
 * gw_comm_init leaves its file; the name has the shape of a shm segment's
 * (job hash, rank twice, pid) so gw-run removes it with those.
 *
 * A child forked without exec (a data loader worker) would share the open
 * file and so keep the lock while it lives, and across pid namespaces nothing
 * else tells the rank gone: a fork handler closes the lock's descriptor in
 * the child (the open file, and the lock, stay the parent's alone). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm.h"

static bool lock_byte0(int fd, int cmd, struct flock *fl) {
  *fl = (struct flock){.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  return fcntl(fd, cmd, fl) == 0;
}

/* The communicators holding a lock, for the fork handler. */
static pthread_mutex_t holders_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gw_comm **holders;
static int nholders, holders_cap;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) { pthread_mutex_lock(&holders_mu); }
static void fork_parent(void) { pthread_mutex_unlock(&holders_mu); }
/* In the child: its copies of the descriptors go (the communicator is of no
 * use there), so the lock lasts exactly as long as the rank. */
static void fork_child(void) {
  for (int i = 0; i < nholders; i++) {
    close(holders[i]->alive_own);
    holders[i]->alive_own = -1;
    holders[i]->alive_named = false; /* the parent's file: not the child's to unlink */
  }
  nholders = 0;
  pthread_mutex_unlock(&holders_mu);
}
static void install_fork_handler(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

/* Every communicator's, liveness or not (single-rank ones have none). */
_Atomic unsigned gw__fork_gen;
static pthread_once_t gen_once = PTHREAD_ONCE_INIT;
static void bump_fork_gen(void) { atomic_fetch_add(&gw__fork_gen, 1); }
static void install_gen_handler(void) { pthread_atfork(NULL, NULL, bump_fork_gen); }
unsigned gw__fork_generation(void) {
  pthread_once(&gen_once, install_gen_handler);
  return atomic_load(&gw__fork_gen);
}

/* Under holders_mu (no fork in between: the prepare handler takes it). */
static void holders_add_locked(struct gw_comm *c) {
  if (nholders == holders_cap) {
    int cap = holders_cap ? 2 * holders_cap : 8;
    struct gw_comm **h = realloc(holders, (size_t)cap * sizeof *h);
    if (h) holders = h, holders_cap = cap;
  }
  if (nholders < holders_cap) holders[nholders++] = c;
  else GW_WARN(GW_SUB_INIT, "rank %d: out of memory: a child forked without exec keeps this rank's liveness lock",
               c->rank);
}

/* The lock's descriptor closed and the communicator out of the registry at
 * once, so no fork sees one without the other. */
static void holders_close(struct gw_comm *c) {
  pthread_mutex_lock(&holders_mu);
  for (int i = 0; i < nholders; i++)
    if (holders[i] == c) holders[i] = holders[--nholders];
  if (c->alive_own >= 0) close(c->alive_own);
  c->alive_own = -1;
  pthread_mutex_unlock(&holders_mu);
}

void gw__alive_create(struct gw_comm *c, struct gw_peer_info *me) {
  c->alive_own = -1;
  /* The file opened and registered for the fork handler with no fork in
   * between (a child would keep a descriptor nobody closes). */
  pthread_once(&fork_once, install_fork_handler);
  pthread_mutex_lock(&holders_mu);
  const char *why = NULL;
  char *path = c->alive_path;
  for (int tries = 0; c->alive_own < 0 && tries < 8; tries++) {
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != sizeof rnd) rnd = gw__clock_bits() ^ (uint32_t)tries;
    snprintf(me->alive_name, sizeof me->alive_name, "gw-%08llx-%d-%d-%d-live-%08x-%llu",
             (unsigned long long)(c->conn_params.job_hash & 0xffffffffu), c->rank, c->rank, (int)getpid(), rnd,
             (unsigned long long)gw__pidns_self());
    snprintf(path, sizeof c->alive_path, "/dev/shm/%s", me->alive_name);
    c->alive_own = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (c->alive_own < 0 && errno != EEXIST) break;
  }
  if (c->alive_own >= 0) holders_add_locked(c);
  pthread_mutex_unlock(&holders_mu);
  struct flock fl;
  struct stat st;
  if (c->alive_own < 0) why = "cannot create it";
  else if (!lock_byte0(c->alive_own, F_OFD_SETLK, &fl)) why = "cannot lock it";
  else if (fstat(c->alive_own, &st) != 0) why = "cannot stat it";
  if (why) {
    GW_INFO(GW_SUB_INIT, "rank %d: /dev/shm/%s: %s (%s): peers on this machine watch this rank by its pid only",
            c->rank, me->alive_name, why, strerror(errno));
    if (c->alive_own >= 0) {
      unlink(path);
      holders_close(c);
    }
    me->alive_name[0] = 0;
    return;
  }
  me->alive_dev = (uint64_t)st.st_dev;
  me->alive_ino = (uint64_t)st.st_ino;
  c->alive_named = true;
}

/* After the rendezvous: open the files of the ranks that share this /dev/shm.
 * Only the very file each one created counts (its device and inode): a
 * machine's containers may each have their own /dev/shm. */
gw_result_t gw__alive_open_peers(struct gw_comm *c, struct gw_errctx *err) {
  const struct gw_peer_info *me = &c->peers[c->rank];
  c->alive_fds = malloc((size_t)c->nranks * sizeof *c->alive_fds);
  if (!c->alive_fds) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->rank);
  int watched = 0;
  for (int r = 0; r < c->nranks; r++) {
    const struct gw_peer_info *pi = &c->peers[r];
    c->alive_fds[r] = -1;
    if (r == c->rank || !pi->alive_name[0] || strcmp(pi->node_id, me->node_id) != 0 || pi->shm_id != me->shm_id ||
        pi->uid != me->uid)
      continue;
    char path[96];
    snprintf(path, sizeof path, "/dev/shm/%.*s", (int)sizeof pi->alive_name, pi->alive_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_dev == pi->alive_dev && (uint64_t)st.st_ino == pi->alive_ino) {
      c->alive_fds[r] = fd;
      watched++;
    } else if (fd >= 0) {
      close(fd);
    }
  }
  GW_INFO(GW_SUB_INIT, "rank %d: watches %d ranks on this machine by their locks in /dev/shm", c->rank, watched);
  return GW_SUCCESS;
}

void gw__alive_unlink_own(struct gw_comm *c) {
  if (!c->alive_named) return;
  unlink(c->alive_path);
  c->alive_named = false;
}

bool gw__alive_lock_gone(const struct gw_comm *c, int peer) {
  if (!c->alive_fds || c->alive_fds[peer] < 0) return false;
  struct flock fl;
  return lock_byte0(c->alive_fds[peer], F_OFD_GETLK, &fl) && fl.l_type == F_UNLCK;
}

void gw__alive_free(struct gw_comm *c) {
  gw__alive_unlink_own(c);
  if (c->alive_fds) {
    for (int r = 0; r < c->nranks; r++)
      if (c->alive_fds[r] >= 0) close(c->alive_fds[r]);
    free(c->alive_fds);
    c->alive_fds = NULL;
  }
  holders_close(c);
}
