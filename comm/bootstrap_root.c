/* bootstrap_root.c - rank 0's side of the rendezvous: it challenges every
 * connection, waits for all the hellos under way at once, checks each proof
 * of the job token, and takes the ranks in (a restarted rank in place of one
 * whose process exited), or tells the joined ranks why the job cannot start. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "bootstrap_internal.h"
#include "hmac.h"
#include "sock.h"

/* Whether h proves the token for the challenge it answers (constant time). */
static bool hello_mac_ok(const struct gw_boot_hello *h, const uint8_t challenge[GW_BOOT_NONCE], const char *token) {
  uint8_t want[32];
  gw__boot_mac(token, 0, challenge, NULL, h->rank, h->nranks, want);
  return gw__equal_ct(want, h->mac, sizeof want);
}

static void refuse(int fd, const char *why, double deadline) {
  gw__boot_send_frame(fd, GW_BOOT_ERROR, why, strlen(why), deadline);
  gw__boot_close_gracefully(fd, GW_MIN(deadline, gw__now() + 2.0));
}

/* Whether the peer of a joined rank's socket has closed it (its process
 * exited): the end of its stream is seen even behind data it sent first. */
static bool peer_gone(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
  return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Rank 0, once every rank joined: takes out those whose process exited
 * since (a pod restarted, a rank killed while it waited for the last one),
 * so a new process for that rank can still take its place; completing with
 * a dead connection failed every rank at the next exchange.  One poll per
 * rank, only when the count is full.  Returns how many are still joined. */
static int root_drop_exited(struct gw_bootstrap *bs, int joined) {
  for (int r = 1; r < bs->nranks; r++)
    if (bs->socks[r] >= 0 && peer_gone(bs->socks[r])) {
      GW_WARN(GW_SUB_BOOT, "rank 0: rank %d joined the rendezvous at %s, then its process exited (its connection "
              "closed) before the job started; waiting for a new rank %d for the rest of the %.0f s",
              r, bs->master, r, bs->timeout_s);
      gw__sock_close(bs->socks[r]);
      bs->socks[r] = BOOT_EXITED;
      joined--;
    }
  return joined;
}

/* A connection rank 0 accepted and challenged, whose hello is still coming:
 * rank 0 waits for all of them at once, so a stranger that connects and says
 * nothing (a health check, a port scan that holds the connection) costs the
 * job nothing; each handshake waited in turn, 5 s for each silent one, and a
 * few of them outlasted the rendezvous' timeout. */
struct boot_pending {
  int fd;
  double since, deadline; /* accepted then; its BOOT_HELLO_S to say hello (closing: to close) */
  bool closing;    /* refused (a wrong token): its reason sent, our side shut, drained until it closes */
  size_t got;      /* bytes of the hello frame read so far */
  uint8_t challenge[GW_BOOT_NONCE];
  uint8_t buf[sizeof(struct gw_boot_frame) + sizeof(struct gw_boot_hello)];
  char who[64];
};
/* Hellos waited for at once; past it, the oldest is closed for the next
 * (accepting waited for a slot: 256 silent strangers kept every rank out). */
#define BOOT_MAX_PENDING 256

/* The connections that were no rank of this job (no hello in time, no
 * gradwire hello, a wrong token, closed for a newer one), for the message
 * of a rendezvous that ends with ranks missing: they may have held it. */
struct boot_strangers {
  unsigned n, pushed; /* every one; those closed for a newer connection */
  char last[64];      /* the last one's address */
};

static void stranger(struct boot_strangers *st, const char *who) {
  st->n++;
  snprintf(st->last, sizeof st->last, "%s", who);
}
/* The least a connection waits before a newer one may push it out of a
 * full set of slots (gw__boot_accept_all). */
#define BOOT_PUSH_AGE_S 1.0
/* How long a connection may take to say hello (root_accept_one). */
#define BOOT_HELLO_S 30.0

/* Rank 0's message when the deadline passed with ranks missing; the ranks
 * that joined hear it too (which are missing, not merely that rank 0 went). */
static gw_result_t root_missing(struct gw_bootstrap *bs, int joined, const struct boot_strangers *st,
                                struct gw_errctx *err) {
  char missing[256] = "";
  size_t used = 0;
  for (int r = 1; r < bs->nranks && used < sizeof missing - 16; r++)
    if (bs->socks[r] < 0)
      used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d%s", used ? "," : "", r,
                               bs->socks[r] == BOOT_EXITED ? " (joined, then exited)" : "");
  char bound[NI_MAXHOST] = "?"; /* a host name that resolves to loopback (Debian's 127.0.1.1) is told here */
  struct sockaddr_storage la;
  socklen_t ll = sizeof la;
  if (getsockname(bs->listen_fds[0], (struct sockaddr *)&la, &ll) == 0)
    getnameinfo((struct sockaddr *)&la, ll, bound, sizeof bound, NULL, 0, NI_NUMERICHOST);
  /* the strangers before the list of missing ranks, which may run to
   * the message's end (the joined ranks read 300 bytes of it) */
  char others[320] = "";
  if (st->n)
    snprintf(others, sizeof others, " (%u connection%s that %s no rank of this job came meanwhile, the last from "
             "%s%s)", st->n, st->n == 1 ? "" : "s", st->n == 1 ? "was" : "were", st->last,
             st->pushed ? "; silent ones filled the waiting slots: a missing rank may have queued behind them" : "");
  gw_result_t res = gw__err(err, GW_ERR_TIMEOUT,
                            "rank 0: only %d of %d ranks reached the rendezvous at %s (listening on %s) within "
                            "%.0f s%s; missing ranks: %s", joined, bs->nranks, bs->master, bound, bs->timeout_s,
                            others, missing);
  gw__boot_broadcast_error(bs, -1, err ? err->msg : "rank 0: ranks are missing at the rendezvous");
  return res;
}

/* Accepts one connection on listener fd and sends it a challenge: *p is the
 * pending hello (p->fd -1 when there is none to wait for).  Only running out
 * of descriptors or memory is an error (the ranks that joined hear why),
 * except that out of descriptors with hellos pending (can_free) is
 * GW_INPROGRESS: the caller frees one (strangers may hold them). */
static gw_result_t root_accept_one(struct gw_bootstrap *bs, int lfd, int joined, bool can_free,
                                   struct boot_pending *p, double deadline, struct boot_strangers *st,
                                   struct gw_errctx *err) {
  struct sockaddr_storage from;
  socklen_t fl = sizeof from;
  p->fd = gw__sock_accept(lfd, (struct sockaddr *)&from, &fl);
  if (p->fd < 0 && can_free && (errno == EMFILE || errno == ENFILE)) return GW_INPROGRESS;
  if (p->fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
    const int e = errno;
    gw_result_t res = gw__err(err, GW_ERR_SYSTEM, "rank 0: cannot accept rank connections at %s: %s%s (%d of %d "
                              "joined)", bs->master, strerror(e),
                              e == EMFILE || e == ENFILE ? "; raise `ulimit -n` above the number of ranks" : "",
                              joined, bs->nranks);
    gw__boot_broadcast_error(bs, -1, err ? err->msg : "rank 0: cannot accept more rank connections");
    return res;
  }
  if (p->fd < 0) return GW_SUCCESS;
  /* A test hook: the first N connections closed as they come, as rank 0
   * closes one whose hello packet loss held back past BOOT_HELLO_S. */
  static int drop = -1;
  if (drop < 0) drop = (int)GW_MAX(0, gw__env_int("GW_TEST_BOOT_DROP_HELLOS", 0));
  if (drop > 0) {
    drop--;
    gw__sock_close(p->fd);
    p->fd = -1;
    return GW_SUCCESS;
  }
  gw__boot_sock_opts(p->fd);
  char who[NI_MAXHOST] = "?";
  getnameinfo((struct sockaddr *)&from, fl, who, sizeof who, NULL, 0, NI_NUMERICHOST);
  snprintf(p->who, sizeof p->who, "%s", who);
  /* A hello is waited for BOOT_HELLO_S (the rendezvous' own deadline comes
   * first): a stranger holds a pending slot no longer, and the others' hellos
   * are waited for beside it.  5 s was short of TCP's retransmissions under
   * packet loss (1 s, 2 s, 4 s ...): a rank's hello came after rank 0 had
   * closed its connection (the rank now connects again, too). */
  p->since = gw__now();
  p->deadline = GW_MIN(deadline, p->since + BOOT_HELLO_S);
  p->got = 0;
  p->closing = false;
  gw__boot_nonce(p->challenge);
  if (gw__boot_send_frame(p->fd, GW_BOOT_CHALLENGE, p->challenge, sizeof p->challenge, p->deadline) != GW_SUCCESS) {
    GW_WARN(GW_SUB_BOOT, "rank 0: refused a connection from %s to %s: not a gradwire hello", p->who, bs->master);
    stranger(st, p->who);
    gw__sock_close(p->fd);
    p->fd = -1;
  }
  return GW_SUCCESS;
}

/* Reads what has come of p's hello.  Returns true when the whole frame is
 * in; closes p (p->fd -1) when it is no gradwire hello or its peer went. */
static bool root_read_hello(struct gw_bootstrap *bs, struct boot_pending *p, struct boot_strangers *st) {
  if (p->closing) { /* refused: what it sends is drained until it closes */
    char sink[512];
    const ssize_t n = recv(p->fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
      gw__sock_close(p->fd);
      p->fd = -1;
    }
    return false;
  }
  ssize_t n = recv(p->fd, p->buf + p->got, sizeof p->buf - p->got, MSG_DONTWAIT);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  bool bad = n <= 0;
  if (n > 0) p->got += (size_t)n;
  struct gw_boot_frame f;
  if (!bad && p->got >= sizeof f) {
    memcpy(&f, p->buf, sizeof f);
    bad = f.magic != GW_BOOT_MAGIC || f.kind != GW_BOOT_HELLO || f.len != sizeof(struct gw_boot_hello);
  }
  if (bad) {
    GW_WARN(GW_SUB_BOOT, "rank 0: refused a connection from %s to %s: not a gradwire hello", p->who, bs->master);
    stranger(st, p->who);
    gw__sock_close(p->fd);
    p->fd = -1;
    return false;
  }
  return p->got == sizeof p->buf;
}

/* Rank 0 takes p's whole hello: the rank joins, or the connection is
 * refused (a wrong token), or the job cannot go on (ranks that disagree on
 * the world size, a rank twice): that error, which every rank joined so far
 * hears.  p->fd is -1 after, whatever became of it. */
static gw_result_t root_admit(struct gw_bootstrap *bs, const char *token, struct boot_pending *p, int *joined,
                              struct boot_strangers *st, struct gw_errctx *err) {
  struct gw_boot_hello h;
  memcpy(&h, p->buf + sizeof(struct gw_boot_frame), sizeof h);
  const int fd = p->fd;
  const char *who = p->who;
  const double hello_deadline = p->deadline;
  p->fd = -1;
  if (!hello_mac_ok(&h, p->challenge, token)) {
    GW_WARN(GW_SUB_BOOT, "rank 0: refused a connection from %s claiming rank %d: wrong job token", who, h.rank);
    stranger(st, who);
    /* Told why, then drained beside the others until it closes (2 s at
     * most): the drain held the whole rendezvous 2 s per such stranger. */
    static const char why[] = "wrong job token (GW_JOB_TOKEN differs from rank 0's)";
    gw__boot_send_frame(fd, GW_BOOT_ERROR, why, sizeof why - 1, GW_MIN(hello_deadline, gw__now() + 0.1));
    shutdown(fd, SHUT_WR);
    p->fd = fd, p->closing = true, p->deadline = gw__now() + 2.0;
    return GW_SUCCESS;
  }
  if (h.nranks == bs->nranks && h.rank >= 1 && h.rank < bs->nranks && bs->socks[h.rank] >= 0 &&
      peer_gone(bs->socks[h.rank])) {
    /* Its earlier process exited before the others came (a pod restarted
     * by Kubernetes, a rank relaunched by hand): the new one takes its
     * place.  A live earlier connection is a duplicate, refused below. */
    GW_INFO(GW_SUB_BOOT, "rank 0: rank %d joined again from %s; its earlier connection is closed (that process "
            "exited): the new one takes its place", h.rank, who);
    gw__sock_close(bs->socks[h.rank]);
    bs->socks[h.rank] = -1;
    (*joined)--;
  }
  if (h.nranks != bs->nranks || h.rank < 1 || h.rank >= bs->nranks || bs->socks[h.rank] >= 0) {
    char why[200];
    if (h.nranks != bs->nranks)
      snprintf(why, sizeof why, "world size mismatch: rank %d says %d ranks, rank 0 says %d", h.rank, h.nranks, bs->nranks);
    else if (h.rank < 1 || h.rank >= bs->nranks)
      snprintf(why, sizeof why, "rank %d is out of range for %d ranks", h.rank, bs->nranks);
    else
      snprintf(why, sizeof why, "rank %d joined twice (from %s)", h.rank, who);
    refuse(fd, why, hello_deadline);
    /* A job whose ranks disagree cannot run: tell everyone who joined so far. */
    for (int r = 1; r < bs->nranks; r++)
      if (bs->socks[r] >= 0) gw__boot_send_frame(bs->socks[r], GW_BOOT_ERROR, why, strlen(why), hello_deadline);
    bs->told_error = true;
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank 0: %s", why);
  }
  /* This rank 0 knows the token too: the rank trusts what it sends after. */
  uint8_t proof[32];
  gw__boot_mac(token, 1, p->challenge, h.nonce, h.rank, h.nranks, proof);
  if (gw__boot_send_frame(fd, GW_BOOT_PROOF, proof, sizeof proof, hello_deadline) != GW_SUCCESS) {
    GW_WARN(GW_SUB_BOOT, "rank 0: rank %d (from %s) went during its hello", h.rank, who);
    gw__sock_close(fd);
    return GW_SUCCESS;
  }
  bs->socks[h.rank] = fd;
  snprintf(bs->from[h.rank], sizeof bs->from[h.rank], "%s", who);
  (*joined)++;
  GW_TRACE(GW_SUB_BOOT, "rank 0: rank %d joined from %s", h.rank, who);
  return GW_SUCCESS;
}

/* Rank 0: accepts ranks 1..n-1 until all have joined or the deadline passes,
 * every hello under way waited for at once. */
gw_result_t gw__boot_accept_all(struct gw_bootstrap *bs, const char *token, double deadline,
                                   struct gw_errctx *err) {
  struct boot_pending *pend = calloc(BOOT_MAX_PENDING, sizeof *pend);
  struct pollfd *pfd = calloc(BOOT_MAX_LISTEN + BOOT_MAX_PENDING, sizeof *pfd);
  gw_result_t res = GW_SUCCESS;
  int joined = 1, npend = 0;
  struct boot_strangers st = {0};
  if (!pend || !pfd) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank 0: out of memory for the rendezvous");
    goto out;
  }
  while (joined < bs->nranks || (joined = root_drop_exited(bs, joined)) < bs->nranks) {
    /* the listeners, then the hellos.  With every slot taken the oldest
     * makes room for the next connection once it has waited BOOT_PUSH_AGE_S
     * (a rank says hello within milliseconds, a retransmission later): the
     * listeners wait until then. */
    const bool room = npend < BOOT_MAX_PENDING || gw__now() - pend[0].since >= BOOT_PUSH_AGE_S;
    const int nl = room ? bs->nlisten : 0;
    double until = room ? deadline : GW_MIN(deadline, pend[0].since + BOOT_PUSH_AGE_S);
    for (int i = 0; i < nl; i++) pfd[i] = (struct pollfd){.fd = bs->listen_fds[i], .events = POLLIN};
    for (int i = 0; i < npend; i++) {
      pfd[nl + i] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
      until = GW_MIN(until, pend[i].deadline);
    }
    const int ms = gw__ms_until(until);
    const int pr = poll(pfd, (nfds_t)(nl + npend), ms > 0 ? ms : 0);
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) {
      res = gw__err(err, GW_ERR_SYSTEM, "rank 0: waiting for ranks at the rendezvous at %s: poll: %s", bs->master,
                    strerror(errno));
      gw__boot_broadcast_error(bs, -1, err ? err->msg : "rank 0: the rendezvous failed");
      goto out;
    }
    const double now = gw__now();
    for (int i = 0; i < npend && res == GW_SUCCESS; i++) {
      struct boot_pending *p = &pend[i];
      if (pr > 0 && (pfd[nl + i].revents & (POLLIN | POLLHUP | POLLERR))) {
        if (root_read_hello(bs, p, &st)) res = root_admit(bs, token, p, &joined, &st, err);
      } else if (now >= p->deadline) {
        /* (the time it had: the rendezvous' end may come before BOOT_HELLO_S) */
        if (!p->closing) {
          GW_WARN(GW_SUB_BOOT, "rank 0: refused a connection from %s to %s: no gradwire hello within %.0f s",
                  p->who, bs->master, now - p->since);
          stranger(&st, p->who);
        }
        gw__sock_close(p->fd);
        p->fd = -1;
      }
    }
    int kept = 0; /* the hellos still coming, in the order they came */
    for (int i = 0; i < npend; i++)
      if (pend[i].fd >= 0) pend[kept++] = pend[i];
    npend = kept;
    for (int i = 0; i < nl && pr > 0 && res == GW_SUCCESS; i++)
      if (pfd[i].revents & POLLIN) {
        if (npend == BOOT_MAX_PENDING) { /* the oldest goes, after a last look at what it sent */
          const bool was_closing = pend[0].closing;
          if (!was_closing && root_read_hello(bs, &pend[0], &st))
            res = root_admit(bs, token, &pend[0], &joined, &st, err);
          if (res != GW_SUCCESS) break;
          if (pend[0].fd >= 0 && !was_closing && !pend[0].closing) {
            if (!st.pushed)
              GW_WARN(GW_SUB_BOOT, "rank 0: all %d waiting slots at %s are held by connections that have not said "
                      "hello: closing the oldest for each new one (from %s first, silent %.1f s)", BOOT_MAX_PENDING,
                      bs->master, pend[0].who, now - pend[0].since);
            st.pushed++;
            stranger(&st, pend[0].who);
          }
          if (pend[0].fd >= 0) gw__sock_close(pend[0].fd);
          memmove(pend, pend + 1, (size_t)--npend * sizeof *pend);
        }
        res = root_accept_one(bs, bs->listen_fds[i], joined, npend > 0, &pend[npend], deadline, &st, err);
        if (res == GW_INPROGRESS) {
          /* out of descriptors with hellos pending: the oldest one, most
           * likely a stranger (a rank says hello within milliseconds), makes
           * room; the connection waiting in the backlog comes next pass */
          GW_WARN(GW_SUB_BOOT, "rank 0: out of file descriptors at %s: closed the connection from %s, which has not "
                  "said hello for %.1f s, to accept the next", bs->master, pend[0].who, now - pend[0].since);
          gw__sock_close(pend[0].fd);
          memmove(pend, pend + 1, (size_t)--npend * sizeof *pend);
          res = GW_SUCCESS;
          break;
        }
        if (pend[npend].fd >= 0) npend++;
      }
    if (res != GW_SUCCESS) goto out;
    if (joined < bs->nranks && gw__now() >= deadline) { /* also while connections keep coming */
      res = root_missing(bs, joined, &st, err);
      goto out;
    }
  }
out:
  if (pend)
    for (int i = 0; i < npend; i++)
      if (pend[i].fd >= 0) gw__sock_close(pend[i].fd);
  free(pend);
  free(pfd);
  return res;
}
