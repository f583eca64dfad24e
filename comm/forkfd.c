/* forkfd.c - the sockets to peers, closed in a child forked without exec.
 *
 * A child forked without exec (a data loader's worker, a helper process)
 * gets a copy of every descriptor.  While it lives, a socket of the rank's
 * stays open after the rank dies, so the peers on other machines see no end
 * of stream and no reset (the machine is alive: keepalives are answered),
 * and wait out GW_TIMEOUT instead of failing at once.  Every socket the
 * runtime makes (rendezvous, tcp streams, ib connections' sockets,
 * listeners) is made through here and recorded; a fork handler closes the
 * child's copies (the parent's stay open: a copy's close ends nothing).
 *
 * A descriptor is recorded and dropped with a mutex that the fork's prepare
 * handler takes, so no fork sees a closed descriptor still on the list (its
 * number may be another file by then, which the child would close).  A
 * socket is made under it too; an accepted one is recorded just after
 * accept4 (which must not run under the mutex: it may wait, and fork would
 * wait with it), so a fork in between leaves that child one copy. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"

static pthread_mutex_t ffd_mu = PTHREAD_MUTEX_INITIALIZER;
static int *ffd_fds;
static int ffd_n, ffd_cap;
static pthread_once_t ffd_once = PTHREAD_ONCE_INIT;

static void ffd_prepare(void) { pthread_mutex_lock(&ffd_mu); }
static void ffd_parent(void) { pthread_mutex_unlock(&ffd_mu); }
static void ffd_child(void) {
  for (int i = 0; i < ffd_n; i++) close(ffd_fds[i]);
  ffd_n = 0;
  pthread_mutex_unlock(&ffd_mu);
}
static void ffd_install(void) { pthread_atfork(ffd_prepare, ffd_parent, ffd_child); }

/* Under ffd_mu.  Out of memory, the socket goes unrecorded (a child forked
 * later keeps a copy: the old behaviour, not a failure). */
static void ffd_add_locked(int fd) {
  if (ffd_n == ffd_cap) {
    int c = ffd_cap ? 2 * ffd_cap : 64;
    int *n = realloc(ffd_fds, (size_t)c * sizeof *n);
    if (!n) return;
    ffd_fds = n, ffd_cap = c;
  }
  ffd_fds[ffd_n++] = fd;
}

int gw__sock_socket(int domain, int type, int protocol) {
  pthread_once(&ffd_once, ffd_install);
  pthread_mutex_lock(&ffd_mu);
  int fd = socket(domain, type | SOCK_CLOEXEC, protocol), e = errno;
  if (fd >= 0) ffd_add_locked(fd);
  pthread_mutex_unlock(&ffd_mu);
  errno = e;
  return fd;
}

int gw__sock_accept(int listen_fd, struct sockaddr *addr, socklen_t *len) {
  pthread_once(&ffd_once, ffd_install);
  int fd = accept4(listen_fd, addr, len, SOCK_CLOEXEC), e = errno;
  if (fd >= 0) {
    pthread_mutex_lock(&ffd_mu);
    ffd_add_locked(fd);
    pthread_mutex_unlock(&ffd_mu);
  }
  errno = e;
  return fd;
}

void gw__sock_close(int fd) {
  if (fd < 0) return;
  int e = errno;
  pthread_mutex_lock(&ffd_mu);
  for (int i = ffd_n - 1; i >= 0; i--)
    if (ffd_fds[i] == fd) {
      ffd_fds[i] = ffd_fds[--ffd_n];
      break;
    }
  close(fd);
  pthread_mutex_unlock(&ffd_mu);
  errno = e;
}

int gw__sock_tracked(void) {
  pthread_mutex_lock(&ffd_mu);
  int n = ffd_n;
  pthread_mutex_unlock(&ffd_mu);
  return n;
}

/* ---- leaf locks held across fork ------------------------------------------------ */
/* One handler takes them all, in the order they came, after this registry's
 * own lock.  Installed after the logger's (gw__log_init first), so it runs
 * before it: a fork's prepare handlers run in the reverse order of their
 * installation, and a leaf's holder may be waiting for the logger's lock
 * (ib's event lock logs under it).  Leaves are not taken under one another,
 * so any order of taking them is free of deadlock. */
enum { FORK_LEAVES = 8 };
static pthread_mutex_t leaves_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t *leaves[FORK_LEAVES];
static int nleaves;
static pthread_once_t leaves_once = PTHREAD_ONCE_INIT;

static void leaves_prepare(void) {
  pthread_mutex_lock(&leaves_mu);
  for (int i = 0; i < nleaves; i++) pthread_mutex_lock(leaves[i]);
}
static void leaves_after(void) {
  for (int i = nleaves; i-- > 0;) pthread_mutex_unlock(leaves[i]);
  pthread_mutex_unlock(&leaves_mu);
}
static void leaves_install(void) {
  gw__log_init();
  pthread_atfork(leaves_prepare, leaves_after, leaves_after);
}

void gw__fork_guard(pthread_mutex_t *mu) {
  pthread_once(&leaves_once, leaves_install);
  pthread_mutex_lock(&leaves_mu);
  int i = 0;
  while (i < nleaves && leaves[i] != mu) i++;
  if (i == nleaves) {
    static bool said;
    if (nleaves < FORK_LEAVES) leaves[nleaves++] = mu;
    else if (!said) /* a bug of gradwire's: a new leaf with no room (raise FORK_LEAVES) */
      said = true, GW_WARN(GW_SUB_INIT, "internal: more than %d locks held across fork: a forked child may hang on "
                           "one", FORK_LEAVES);
  }
  pthread_mutex_unlock(&leaves_mu);
}
