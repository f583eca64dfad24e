/* bootstrap.c - TCP rendezvous and small allgathers through rank 0 (a star: the
 * blobs are small and this runs only at setup).  Every socket wait is bounded by a
 * deadline and every failure names the rank, the peer and the address.  A
 * connection that does not present the job token is refused and logged. */
#include <errno.h>
#include <stdatomic.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_internal.h"
#include "hmac.h"
#include "netname.h"
#include "sock.h"

#define BOOT_MAX_PAYLOAD (64u << 20)

bool gw__parse_host_port(const char *s, char *host, size_t hostlen, char *port, size_t portlen) {
  if (!s || !*s) return false;
  const char *colon;
  const char *h0 = s;
  size_t hl;
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':') return false;
    h0 = s + 1;
    hl = (size_t)(close - h0);
    colon = close + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon) return false;
    hl = (size_t)(colon - s);
    if (memchr(s, ':', hl)) return false; /* bare IPv6 needs brackets */
  }
  if (hl == 0 || hl >= hostlen) return false;
  const char *p = colon + 1;
  size_t pl = strlen(p);
  if (pl == 0 || pl >= portlen) return false;
  char *end;
  long v = strtol(p, &end, 10);
  if (*end || v < 1 || v > 65535) return false;
  memcpy(host, h0, hl);
  host[hl] = 0;
  memcpy(port, p, pl + 1);
  return true;
}

/* Sends or receives exactly len bytes before the deadline.  Returns GW_SUCCESS,
 * GW_ERR_TIMEOUT, or GW_ERR_REMOTE when the peer closed or reset the socket. */
static gw_result_t io_all(int fd, void *buf, size_t len, bool sending, double deadline) {
  uint8_t *p = buf;
  while (len > 0) {
    struct pollfd pfd = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
    int ms = gw__ms_until(deadline);
    int pr = poll(&pfd, 1, ms > 0 ? ms : 0);
    if (pr < 0) {
      if (errno == EINTR) continue;
      return GW_ERR_SYSTEM;
    }
    if (pr == 0) return GW_ERR_TIMEOUT;
    /* Never blocking: a frame larger than the socket buffer (rank 0's
     * allgather answer) must not outlive the deadline towards a stopped peer. */
    ssize_t n = sending ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, len, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return GW_ERR_REMOTE;
    }
    if (n == 0) return GW_ERR_REMOTE;
    p += n;
    len -= (size_t)n;
  }
  return GW_SUCCESS;
}

gw_result_t gw__boot_send_frame(int fd, uint32_t kind, const void *data, size_t len, double deadline) {
  struct gw_boot_frame f = {.magic = GW_BOOT_MAGIC, .kind = kind, .len = len};
  GW_CHECK(io_all(fd, &f, sizeof f, true, deadline));
  if (len) GW_CHECK(io_all(fd, (void *)data, len, true, deadline));
  return GW_SUCCESS;
}

/* Receives one frame header and checks it; the payload is read by the caller. */
/* A frame that is not what this build sends (another service on the port, or
 * ranks of different builds): GW_ERR_INVALID_ARGUMENT, which peer_fail words
 * as such rather than as a lost connection. */
#define BOOT_FOREIGN GW_ERR_INVALID_ARGUMENT

static gw_result_t recv_frame_hdr(int fd, struct gw_boot_frame *f, double deadline) {
  GW_CHECK(io_all(fd, f, sizeof *f, false, deadline));
  if (f->magic != GW_BOOT_MAGIC || f->len > BOOT_MAX_PAYLOAD) return BOOT_FOREIGN;
  return GW_SUCCESS;
}

/* Reads an ERROR frame's text into msg (after its header was read). */
static void read_error_text(int fd, const struct gw_boot_frame *f, char *msg, size_t len, double deadline) {
  size_t n = f->len < len - 1 ? f->len : len - 1;
  if (io_all(fd, msg, n, false, deadline) != GW_SUCCESS) n = 0;
  msg[n] = 0;
  /* printable only: before the proof, anything listening on the master's
   * port may send it (control characters reached the terminal) */
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)msg[i] < 0x20 || ((unsigned char)msg[i] >= 0x7f && (unsigned char)msg[i] < 0xa0)) msg[i] = '?';
}

void gw__boot_sock_opts(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* getaddrinfo's result: 0 or an EAI_* code (gai_strerror). */
static int resolve(const char *host, const char *port, bool passive, struct addrinfo **res) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = passive ? AI_PASSIVE : 0};
  return getaddrinfo(host, port, &hints, res);
}

static gw_result_t root_listen(struct gw_bootstrap *bs, const char *host, const char *port,
                               struct gw_errctx *err) {
  struct addrinfo *ai = NULL;
  const int gai = resolve(host, port, true, &ai);
  if (gai != 0)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank 0: cannot resolve master address %s: %s", bs->master,
                   gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
  int last_errno = 0;
  /* Bind only to the addresses named by the master address, never to all
   * interfaces: each of them (it bound the first alone, and a rank whose
   * resolver or route took another, the IPv4 one of a name with an IPv6 one
   * first, was refused until its deadline, "is rank 0 running?"). */
  for (struct addrinfo *a = ai; a && bs->nlisten < BOOT_MAX_LISTEN; a = a->ai_next) {
    int fd = gw__sock_socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* its own address alone (not for a v4-mapped one: bind refuses that then) */
    if (a->ai_family == AF_INET6 && !IN6_IS_ADDR_V4MAPPED(&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr))
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      bs->listen_fds[bs->nlisten++] = fd;
      continue;
    }
    last_errno = errno;
    gw__sock_close(fd);
  }
  freeaddrinfo(ai);
  if (bs->nlisten) {
    GW_INFO(GW_SUB_BOOT, "rank 0: rendezvous listening at %s (%d address%s)", bs->master, bs->nlisten,
            bs->nlisten == 1 ? "" : "es");
    return GW_SUCCESS;
  }
  /* In use: also this job's own rank 0, started twice (two processes given
   * GW_RANK=0 met here, and the second was told only of another job). */
  return gw__err(err, GW_ERR_SYSTEM, "rank 0: cannot listen at master address %s: %s (%s)", bs->master,
                 strerror(last_errno),
                 last_errno == EADDRINUSE ? "is the port in use by another job, or by another process started as "
                                            "rank 0 of this one: was rank 0 given to two processes?"
                 : last_errno == EADDRNOTAVAIL ? "is the address not one of this machine's?"
                 : last_errno == EMFILE || last_errno == ENFILE ? "this rank is out of file descriptors: raise `ulimit -n`"
                                               : "is the port in use by another job, or is the address not one of "
                                                 "this machine's?");
}

static gw_result_t peer_connect(struct gw_bootstrap *bs, const char *host, const char *port,
                                double deadline, struct gw_errctx *err) {
  int last_errno = 0, last_gai = 0, gai = 0;
  /* a lookup answered, or a connect was answered or had a millisecond at
   * least (a tiny GW_BOOTSTRAP_TIMEOUT may leave none: a try with no time
   * said "no answer from master after 0 s (Connection timed out)") */
  bool tried = false;
  long sleep_us = 1000;
  /* The name's addresses, looked up again every 2 s at most (a late DNS
   * record, a moved service): every retry looked it up, every ~100 ms, and
   * thousands of ranks waiting for a late rank 0 asked the name server as
   * often each. */
  struct addrinfo *ai = NULL;
  double resolved_at = 0;
  while (gw__now() < deadline) {
    if (resolved_at == 0 || gw__now() - resolved_at >= 2.0) {
      if (ai) freeaddrinfo(ai), ai = NULL;
      /* A name that does not resolve yet is retried (a Kubernetes service's DNS
       * record may come after its pod), and named if it never does. */
      gai = resolve(host, port, false, &ai);
      const int e = errno;
      tried |= gai != 0;
      resolved_at = gw__now();
      if (gai != 0) ai = NULL, last_gai = gai, last_errno = gai == EAI_SYSTEM ? e : 0;
      else last_gai = 0;
    }
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
      int fd = gw__sock_socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) {
        last_errno = errno, tried = true; /* an answer too (EAFNOSUPPORT, EMFILE, ...) */
        continue;
      }
      /* Each address for at most 10 s: one that drops SYNs must not hold
       * the rest (or the whole rendezvous) for the kernel's 2 minutes. */
      const double start = gw__now(), until = GW_MIN(deadline, start + 10.0);
      if (gw__sock_connect_deadline(fd, a->ai_addr, a->ai_addrlen, until) == 0) {
        freeaddrinfo(ai);
        gw__boot_sock_opts(fd);
        bs->socks[0] = fd;
        return GW_SUCCESS;
      }
      /* (a try with no time keeps the last real answer: "refused" stayed
       * "timed out" when the deadline came during the last one) */
      if (errno != ETIMEDOUT || until - start >= 1e-3) last_errno = errno, tried = true;
      gw__sock_close(fd);
    }
    /* This rank out of descriptors (a socket, or the resolver's files): no
     * wait fixes it, said at once (it retried until the deadline, then blamed
     * rank 0 with "no route").  Memory or socket buffers may come back: retried. */
    const char *hint;
    if ((gai == 0 || gai == EAI_SYSTEM) && (last_errno == EMFILE || last_errno == ENFILE) &&
        gw__sock_errno_kind(last_errno, &hint) == GW_ERR_SYSTEM) {
      if (ai) freeaddrinfo(ai);
      return gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot connect to master %s: %s%s", bs->rank, bs->master,
                     strerror(last_errno), hint);
    }
    /* Rank 0 may not be listening yet: retry with a growing pause, spread
     * (ranks started together came back together) */
    const long pause_us = sleep_us / 2 + (long)(gw__clock_bits() % (uint32_t)sleep_us);
    struct timespec ts = {0, pause_us * 1000};
    nanosleep(&ts, NULL);
    if (sleep_us < 100000) sleep_us *= 2;
  }
  if (ai) freeaddrinfo(ai);
  if (!tried) /* it said "no answer ... after 0 s (no route)" */
    return gw__err(err, GW_ERR_TIMEOUT, "rank %d: GW_BOOTSTRAP_TIMEOUT (%g s) ran out before a connection to master "
                   "%s could be tried", bs->rank, bs->timeout_s, bs->master);
  if (last_gai && last_gai != EAI_SYSTEM)
    return gw__err(err, GW_ERR_TIMEOUT, "rank %d: cannot resolve the master's name in %s for %.0f s: %s", bs->rank,
                   bs->master, bs->timeout_s, gai_strerror(last_gai));
  return gw__err(err, GW_ERR_TIMEOUT, "rank %d: no answer from master %s after %g s (%s); is rank 0 running?",
                 bs->rank, bs->master, bs->timeout_s, last_errno ? strerror(last_errno) : "no route");
}

void gw__boot_mac(const char *token, int which, const uint8_t challenge[GW_BOOT_NONCE],
                  const uint8_t rank_nonce[GW_BOOT_NONCE], int32_t rank, int32_t nranks, uint8_t out[32]) {
  static const char *const label[2] = {"gradwire rank", "gradwire root"};
  uint8_t rn[8];
  for (int i = 0; i < 4; i++) rn[i] = (uint8_t)((uint32_t)rank >> 8 * i), rn[4 + i] = (uint8_t)((uint32_t)nranks >> 8 * i);
  const void *parts[] = {label[which], challenge, rank_nonce, rn};
  const size_t lens[] = {strlen(label[which]) + 1, GW_BOOT_NONCE, which ? GW_BOOT_NONCE : 0, sizeof rn};
  gw__hmac_sha256(token, strlen(token), parts, lens, 4, out);
}

/* A nonce: getrandom's bits, else the clock's (unique, if guessable: the
 * token stays secret either way; a guessable challenge only lets a recorded
 * hello be replayed to rank 0 by a stranger, who then cannot go on). */
void gw__boot_nonce(uint8_t out[GW_BOOT_NONCE]) {
  if (getrandom(out, GW_BOOT_NONCE, GRND_NONBLOCK) == GW_BOOT_NONCE) return;
  for (int i = 0; i < GW_BOOT_NONCE; i += 4) {
    const uint32_t v = gw__clock_bits() ^ (uint32_t)i;
    memcpy(out + i, &v, 4);
  }
}

/* Closes a socket the peer may still have written to without a reset: a reset
 * would make the peer's kernel drop our last frame (the reason it was refused)
 * before the peer reads it.  Shut our side, read until the peer closes or a
 * short deadline passes, then close. */
void gw__boot_close_gracefully(int fd, double deadline) {
  shutdown(fd, SHUT_WR);
  char sink[512];
  for (;;) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int ms = gw__ms_until(deadline);
    if (ms <= 0) break;
    int ready = poll(&pfd, 1, ms);
    if (ready < 0 && errno == EINTR) continue; /* a signal (a DataLoader's SIGCHLD) is no end of the drain */
    if (ready <= 0) break;
    ssize_t got = recv(fd, sink, sizeof sink, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
  }
  gw__sock_close(fd);
}

/* Rank 0 tells ranks first.. n-1 why the job cannot go on (best effort). */
/* Every rank but `skip` (the one that failed: a stuck reader would take the
 * second that the others' notices have) hears msg; ranks already answered
 * in this exchange read it at their next (they reported "lost the bootstrap
 * connection to rank 0" when it closed). */
void gw__boot_broadcast_error(struct gw_bootstrap *bs, int skip, const char *msg) {
  double deadline = gw__now() + 1.0;
  bs->told_error = true;
  for (int r = 1; r < bs->nranks; r++)
    if (r != skip && bs->socks[r] >= 0) gw__boot_send_frame(bs->socks[r], GW_BOOT_ERROR, msg, strlen(msg), deadline);
}

static gw_result_t peer_fail(struct gw_bootstrap *bs, gw_result_t r, int peer, double waited_s,
                             struct gw_errctx *err);

/* A rank reads rank 0's next frame of the hello: `kind` with exactly len
 * bytes into buf, or rank 0's refusal (an ERROR frame, told as such). */
static gw_result_t hello_frame(struct gw_bootstrap *bs, uint32_t kind, void *buf, size_t len, double deadline,
                               double waited_s, bool *lost, struct gw_errctx *err) {
  const int fd = bs->socks[0];
  struct gw_boot_frame f;
  gw_result_t r = recv_frame_hdr(fd, &f, deadline);
  if (r == GW_SUCCESS && f.kind == GW_BOOT_ERROR) {
    char msg[300];
    read_error_text(fd, &f, msg, sizeof msg, deadline);
    return gw__err(err, GW_ERR_REMOTE, "rank %d: the master %s ended the rendezvous: %s", bs->rank, bs->master, msg);
  }
  if (r == GW_SUCCESS && (f.kind != kind || f.len != len)) r = BOOT_FOREIGN;
  if (r == GW_SUCCESS) r = io_all(fd, buf, len, false, deadline);
  *lost = r != GW_SUCCESS && r != GW_ERR_TIMEOUT && r != BOOT_FOREIGN;
  return r == GW_SUCCESS ? r : peer_fail(bs, r, 0, waited_s, err);
}

/* A rank's side of the hello: rank 0's challenge answered, its proof checked.
 * *lost: the connection went before the proof came (rank 0 gave up on a
 * hello that packet loss held back past its window, or a stranger's end):
 * worth connecting again while the deadline allows. */
static gw_result_t peer_hello(struct gw_bootstrap *bs, const char *token, double deadline, bool *lost,
                              struct gw_errctx *err) {
  /* Rank 0 answers once it accepts this connection, promptly once it runs:
   * a little longer than the rendezvous' deadline, as for its answers later. */
  const double grace = GW_MIN(bs->timeout_s, 10.0), waited = bs->timeout_s + grace;
  deadline += grace;
  uint8_t challenge[GW_BOOT_NONCE], proof[32], want[32];
  *lost = false;
  gw_result_t r = hello_frame(bs, GW_BOOT_CHALLENGE, challenge, sizeof challenge, deadline, waited, lost, err);
  if (r != GW_SUCCESS) return r;
  struct gw_boot_hello h = {.rank = bs->rank, .nranks = bs->nranks};
  gw__boot_nonce(h.nonce);
  gw__boot_mac(token, 0, challenge, NULL, h.rank, h.nranks, h.mac);
  if (gw__boot_send_frame(bs->socks[0], GW_BOOT_HELLO, &h, sizeof h, deadline) != GW_SUCCESS) {
    *lost = true;
    return gw__err(err, GW_ERR_REMOTE, "rank %d: master %s closed the connection during the hello", bs->rank,
                   bs->master);
  }
  r = hello_frame(bs, GW_BOOT_PROOF, proof, sizeof proof, deadline, waited, lost, err);
  if (r != GW_SUCCESS) return r;
  gw__boot_mac(token, 1, challenge, h.nonce, h.rank, h.nranks, want);
  if (!gw__equal_ct(want, proof, sizeof want))
    return gw__err(err, GW_ERR_REMOTE, "rank %d: the master at %s does not know this job's token (its proof is "
                   "wrong): another job's rank 0, or something else holds that port; nothing was sent to it but a "
                   "proof of the token", bs->rank, bs->master);
  return GW_SUCCESS;
}

static void close_listeners(struct gw_bootstrap *bs) {
  for (int i = 0; i < bs->nlisten; i++) gw__sock_close(bs->listen_fds[i]);
  bs->nlisten = 0;
}

gw_result_t gw__bootstrap_init(struct gw_bootstrap **out, int rank, int nranks, const char *master,
                               const char *token, double timeout_s, struct gw_errctx *err) {
  gw_result_t res;
  *out = NULL;
  if (strlen(token) > GW_BOOT_TOKEN_MAX)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_JOB_TOKEN is longer than %d characters",
                   rank, GW_BOOT_TOKEN_MAX);
  struct gw_bootstrap *bs = calloc(1, sizeof *bs);
  if (!bs) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", rank);
  bs->rank = rank;
  bs->nranks = nranks;
  bs->timeout_s = timeout_s;
  snprintf(bs->master, sizeof bs->master, "%s", master);
  bs->socks = malloc(sizeof(int) * (size_t)(rank == 0 ? nranks : 1));
  if (!bs->socks) {
    free(bs);
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", rank);
  }
  for (int r = 0; r < (rank == 0 ? nranks : 1); r++) bs->socks[r] = -1;
  if (rank == 0 && !(bs->from = calloc((size_t)nranks, sizeof *bs->from))) {
    free(bs->socks);
    free(bs);
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", rank);
  }

  char host[256], port[16];
  if (!gw__parse_host_port(master, host, sizeof host, port, sizeof port)) {
    res = gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: master address '%s' is not HOST:PORT", rank, master);
    goto fail;
  }
  if (gw__addr_needs_zone(host)) {
    res = gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: master address '%s' is a link-local IPv6 address without "
                  "its interface: give it as [%s%%IFACE]:%s (each machine's own interface name)", rank, master, host,
                  port);
    goto fail;
  }
  double deadline = gw__now() + timeout_s;
  if (rank == 0) {
    GW_CHECK_GOTO(root_listen(bs, host, port, err), res, fail);
    GW_CHECK_GOTO(gw__boot_accept_all(bs, token, deadline, err), res, fail);
    /* Everyone is in: the port is let go.  Kept, it took a later job's ranks
     * (another job on the same port whose rank 0 could not bind) into its
     * backlog unanswered, and they failed after the timeout and its grace
     * blaming a missing rank; refused, they say rank 0 is not there. */
    if (nranks > 1) close_listeners(bs);
  } else {
    /* A hello whose connection went (rank 0 stopped waiting for it: lost
     * packets held it back past rank 0's window) is tried again on a new
     * connection while the deadline allows: the rank gave up at once,
     * blaming rank 0 ("did it exit?"), and rank 0 waited for it. */
    for (bool lost = true; lost;) {
      GW_CHECK_GOTO(peer_connect(bs, host, port, deadline, err), res, fail);
      res = peer_hello(bs, token, deadline, &lost, err);
      if (res == GW_SUCCESS) break;
      if (!lost || gw__now() >= deadline) goto fail;
      GW_WARN(GW_SUB_BOOT, "rank %d: the connection to master %s went during the hello (%s); connecting again",
              rank, master, err ? err->msg : "");
      gw__sock_close(bs->socks[0]);
      bs->socks[0] = -1;
    }
  }
  *out = bs;
  return GW_SUCCESS;
fail:
  gw__bootstrap_free(bs);
  return res;
}

/* waited_s: how long the wait that failed lasted (the timeout, plus the grace
 * for rank 0's answer). */
static gw_result_t peer_fail(struct gw_bootstrap *bs, gw_result_t r, int peer, double waited_s,
                             struct gw_errctx *err) {
  /* where the peer is: rank 0's address for the others; for rank 0, where
   * the rank joined from (the master's address named rank 0 itself) */
  char from[80];
  const bool joined = bs->rank == 0 && bs->from && peer > 0 && peer < bs->nranks && bs->from[peer][0];
  if (joined) snprintf(from, sizeof from, "from %s", bs->from[peer]);
  const char *where = joined ? from : bs->master;
  /* This rank's own side gone (its interface down, its address lost): its
   * failure, said so (a master whose interface went down blamed a peer for
   * not answering); the network to the peer stalled: said beside the wait. */
  const int fd = bs->rank == 0 ? (peer > 0 && peer < bs->nranks ? bs->socks[peer] : -1) : bs->socks[0];
  char here[300] = "", net[420] = "";
  if (fd >= 0 && (r == GW_ERR_TIMEOUT || r == GW_ERR_REMOTE)) {
    if (gw__sock_local_down(fd, here, sizeof here) == GW_LOCAL_DOWN)
      return gw__err(err, GW_ERR_SYSTEM, "rank %d: the rendezvous at %s failed on this rank's side, waiting for rank "
                     "%d: %s", bs->rank, bs->master, peer, here);
    struct gw_sock_stall st = {.fd = -1};
    gw__sock_stall_add(fd, &st);
    char text[400];
    if (gw__sock_stall_text(&st, where, text, sizeof text)) snprintf(net, sizeof net, "; %s", text);
  }
  if (r == GW_ERR_TIMEOUT && net[0])
    return gw__err(err, GW_ERR_TIMEOUT, "rank %d: rank %d did not answer within %.0f s during the rendezvous at %s%s",
                   bs->rank, peer, waited_s, bs->master, net);
  if (r == GW_ERR_TIMEOUT)
    return gw__err(err, GW_ERR_TIMEOUT,
                   "rank %d: rank %d%s%s%s did not answer within %.0f s during the rendezvous at %s%s", bs->rank, peer,
                   joined ? " (" : "", joined ? from : "", joined ? ")" : "", waited_s, bs->master,
                   peer == 0 ? " (rank 0 answers once every rank has reached this point: look for a rank that is "
                               "missing, slow or failed)"
                             : "");
  if (r == BOOT_FOREIGN)
    return gw__err(err, GW_ERR_REMOTE, "rank %d: the bootstrap connection to rank %d (%s) carried something that is "
                   "not this build's rendezvous: is another service listening on that port, or do the ranks run "
                   "different gradwire builds?", bs->rank, peer, where);
  return gw__err(err, GW_ERR_REMOTE, "rank %d: lost the bootstrap connection to rank %d (%s): did it exit?",
                 bs->rank, peer, where);
}

static _Atomic uint64_t root_bytes; /* payload rank 0 sent in answers (tests) */

uint64_t gw__bootstrap_root_bytes(void) { return atomic_load(&root_bytes); }

/* Rank 0: every other rank's `size` bytes into all[r * size], each rank's wait
 * its own timeout; on a failure the others hear why. */
static gw_result_t root_gather(struct gw_bootstrap *bs, uint8_t *all, size_t size, struct gw_errctx *err) {
  double deadline = gw__now() + bs->timeout_s;
  for (int r = 1; r < bs->nranks; r++) {
    struct gw_boot_frame f;
    gw_result_t res = recv_frame_hdr(bs->socks[r], &f, deadline);
    if (res == GW_SUCCESS && f.kind == GW_BOOT_ERROR) { /* rank r failed on its own (gw__bootstrap_fail) */
      char msg[300];
      read_error_text(bs->socks[r], &f, msg, sizeof msg, deadline);
      res = gw__err(err, GW_ERR_REMOTE, "rank 0: rank %d failed: %s", r, msg);
      gw__boot_broadcast_error(bs, r, err ? err->msg : msg);
      return res;
    }
    if (res == GW_SUCCESS && (f.kind != GW_BOOT_DATA || f.len != size)) res = BOOT_FOREIGN;
    if (res == GW_SUCCESS) res = io_all(bs->socks[r], all + (size_t)r * size, size, false, deadline);
    if (res != GW_SUCCESS) {
      res = peer_fail(bs, res, r, bs->timeout_s, err);
      gw__boot_broadcast_error(bs, -1, err ? err->msg : "rank 0 failed during a bootstrap exchange");
      return res;
    }
  }
  return GW_SUCCESS;
}

/* Rank 0: answers rank r (each send with a fresh timeout: the answers of a
 * large job take a while in all, and a slow reader is named by its own). */
static gw_result_t root_answer(struct gw_bootstrap *bs, int r, const void *data, size_t len, struct gw_errctx *err) {
  gw_result_t res = gw__boot_send_frame(bs->socks[r], GW_BOOT_DATA, data, len, gw__now() + bs->timeout_s);
  if (res != GW_SUCCESS) {
    res = peer_fail(bs, res, r, bs->timeout_s, err);
    gw__boot_broadcast_error(bs, r, err ? err->msg : "rank 0 failed"); /* the others hear why */
    return res;
  }
  atomic_fetch_add(&root_bytes, len);
  return GW_SUCCESS;
}

/* Ranks 1..n-1: sends `size` bytes to rank 0 and reads its answer's header
 * (a DATA frame; an ERROR frame's text becomes the error). */
static gw_result_t send_and_await(struct gw_bootstrap *bs, const void *mine, size_t size, double *deadline,
                                  struct gw_boot_frame *f, struct gw_errctx *err) {
  gw_result_t res = gw__boot_send_frame(bs->socks[0], GW_BOOT_DATA, mine, size, *deadline);
  if (res != GW_SUCCESS) {
    /* Rank 0 may have ended the rendezvous and closed before this rank came
     * to send (a rank that refused a setting, or failed, as this one was
     * late): its error frame waits unread here, and says why; it was taken
     * for rank 0 gone ("did it exit?"). */
    struct gw_boot_frame e;
    if (recv_frame_hdr(bs->socks[0], &e, gw__now() + 0.5) == GW_SUCCESS && e.kind == GW_BOOT_ERROR) {
      char msg[300];
      read_error_text(bs->socks[0], &e, msg, sizeof msg, gw__now() + 0.5);
      return gw__err(err, GW_ERR_REMOTE, "rank %d: the master %s ended the rendezvous: %s", bs->rank, bs->master,
                     msg);
    }
    return peer_fail(bs, res, 0, bs->timeout_s, err);
  }
  /* Rank 0 answers by its own deadline, with the data or with why not (a
   * rank missing): this rank, whose deadline may have started earlier, waits
   * a little longer for that answer rather than blame rank 0 first. */
  const double grace = GW_MIN(bs->timeout_s, 10.0);
  *deadline += grace;
  res = recv_frame_hdr(bs->socks[0], f, *deadline);
  if (res != GW_SUCCESS) return peer_fail(bs, res, 0, bs->timeout_s + grace, err);
  if (f->kind == GW_BOOT_ERROR) {
    char msg[300];
    read_error_text(bs->socks[0], f, msg, sizeof msg, *deadline);
    return gw__err(err, GW_ERR_REMOTE, "rank %d: the master %s ended the rendezvous: %s", bs->rank, bs->master, msg);
  }
  if (f->kind != GW_BOOT_DATA) return peer_fail(bs, BOOT_FOREIGN, 0, bs->timeout_s + grace, err);
  return GW_SUCCESS;
}

gw_result_t gw__bootstrap_allgather(struct gw_bootstrap *bs, const void *mine, void *all, size_t size,
                                    struct gw_errctx *err) {
  uint8_t *out = all;
  size_t total = size * (size_t)bs->nranks;
  if (total > BOOT_MAX_PAYLOAD)
    return gw__err(err, GW_ERR_INTERNAL, "rank %d: bootstrap allgather of %zu bytes is too large", bs->rank, total);
  memmove(out + (size_t)bs->rank * size, mine, size);
  if (bs->nranks == 1) return GW_SUCCESS;
  if (bs->rank == 0) {
    GW_CHECK(root_gather(bs, out, size, err));
    for (int r = 1; r < bs->nranks; r++) GW_CHECK(root_answer(bs, r, out, total, err));
    return GW_SUCCESS;
  }
  double deadline = gw__now() + bs->timeout_s;
  struct gw_boot_frame f;
  GW_CHECK(send_and_await(bs, mine, size, &deadline, &f, err));
  if (f.len != total) return peer_fail(bs, BOOT_FOREIGN, 0, bs->timeout_s, err);
  gw_result_t res = io_all(bs->socks[0], out, total, false, deadline);
  return res != GW_SUCCESS ? peer_fail(bs, res, 0, bs->timeout_s, err) : GW_SUCCESS;
}

/* Appends the records of recs (count of size, from rank `from`) meant for
 * `to` to buf as (int32 origin, record) pairs; returns the new length. */
static size_t pack_for(uint8_t *buf, size_t len, const uint8_t *recs, int count, size_t size, int32_t from, int to) {
  for (int i = 0; i < count; i++) {
    int32_t dest;
    memcpy(&dest, recs + (size_t)i * size, sizeof dest);
    if (dest != to) continue;
    memcpy(buf + len, &from, 4);
    memcpy(buf + len + 4, recs + (size_t)i * size, size);
    len += 4 + size;
  }
  return len;
}

static gw_result_t unpack_routed(struct gw_bootstrap *bs, const uint8_t *buf, size_t len, size_t size, void *out,
                                 int32_t *origin, int max_out, int *nout, struct gw_errctx *err) {
  const size_t rec = 4 + size;
  if (len % rec || len / rec > (size_t)max_out)
    return gw__err(err, GW_ERR_INTERNAL, "rank %d: the rendezvous routed %zu bytes here, not up to %d records of %zu",
                   bs->rank, len, max_out, size);
  *nout = (int)(len / rec);
  for (int i = 0; i < *nout; i++) {
    memcpy(&origin[i], buf + (size_t)i * rec, 4);
    memcpy((uint8_t *)out + (size_t)i * size, buf + (size_t)i * rec + 4, size);
  }
  return GW_SUCCESS;
}

gw_result_t gw__bootstrap_route(struct gw_bootstrap *bs, const void *recs, int count, size_t size, void *out,
                                int32_t *origin, int max_out, int *nout, struct gw_errctx *err) {
  const size_t mine = (size_t)count * size, rec = 4 + size, n = (size_t)bs->nranks;
  if (mine > BOOT_MAX_PAYLOAD || (size_t)max_out * rec > BOOT_MAX_PAYLOAD || mine * n / n != mine)
    return gw__err(err, GW_ERR_INTERNAL, "rank %d: bootstrap route of %d records of %zu bytes is too large", bs->rank,
                   count, size);
  *nout = 0;
  uint8_t *buf = malloc(GW_MAX((size_t)max_out * rec, 1));
  if (!buf) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", bs->rank);
  gw_result_t res = GW_SUCCESS;
  if (bs->rank == 0) {
    uint8_t *all = malloc(GW_MAX(mine * n, 1));
    size_t *at = calloc(n + 1, sizeof *at), *fill = calloc(n, sizeof *fill);
    uint8_t *sorted = NULL;
    if (!all || !at || !fill) {
      res = gw__err(err, GW_ERR_SYSTEM, "rank 0: out of memory");
      gw__boot_broadcast_error(bs, -1, "rank 0 ran out of memory during a bootstrap exchange");
      goto root_out;
    }
    memcpy(all, recs, mine);
    if (n > 1) GW_CHECK_GOTO(root_gather(bs, all, mine, err), res, root_out);
    /* Bucketed by destination in one pass: at[r] is where rank r's answer starts. */
    for (size_t i = 0; i < n * (size_t)count; i++) {
      int32_t dest;
      memcpy(&dest, all + i * size, sizeof dest);
      if (dest >= 0 && (size_t)dest < n) at[dest + 1] += rec;
    }
    for (size_t r = 0; r < n; r++) at[r + 1] += at[r];
    sorted = malloc(GW_MAX(at[n], 1));
    if (!sorted) {
      res = gw__err(err, GW_ERR_SYSTEM, "rank 0: out of memory");
      gw__boot_broadcast_error(bs, -1, "rank 0 ran out of memory during a bootstrap exchange");
      goto root_out;
    }
    for (size_t o = 0; o < n; o++)
      for (int i = 0; i < count; i++) {
        const uint8_t *r0 = all + (o * (size_t)count + (size_t)i) * size;
        int32_t dest;
        memcpy(&dest, r0, sizeof dest);
        if (dest < 0 || (size_t)dest >= n) continue;
        pack_for(sorted + at[dest] + fill[dest], 0, r0, 1, size, (int32_t)o, dest);
        fill[dest] += rec;
      }
    for (size_t r = 1; r < n && res == GW_SUCCESS; r++) res = root_answer(bs, (int)r, sorted + at[r], at[r + 1] - at[r], err);
    if (res == GW_SUCCESS) res = unpack_routed(bs, sorted, at[1], size, out, origin, max_out, nout, err);
  root_out:
    free(sorted);
    free(fill);
    free(at);
    free(all);
  } else {
    double deadline = gw__now() + bs->timeout_s;
    struct gw_boot_frame f;
    res = send_and_await(bs, recs, mine, &deadline, &f, err);
    if (res == GW_SUCCESS && f.len > (size_t)max_out * rec)
      res = gw__err(err, GW_ERR_INTERNAL, "rank %d: the rendezvous routed %zu records here, more than the %d this rank "
                    "expects: the ranks disagree about their connections", bs->rank, (size_t)f.len / rec, max_out);
    if (res == GW_SUCCESS && (res = io_all(bs->socks[0], buf, f.len, false, deadline)) != GW_SUCCESS)
      res = peer_fail(bs, res, 0, bs->timeout_s, err);
    if (res == GW_SUCCESS) res = unpack_routed(bs, buf, f.len, size, out, origin, max_out, nout, err);
  }
  free(buf);
  return res;
}

gw_result_t gw__bootstrap_barrier(struct gw_bootstrap *bs, struct gw_errctx *err) {
  uint8_t one = 1;
  uint8_t *all = malloc((size_t)bs->nranks);
  if (!all) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", bs->rank);
  gw_result_t res = gw__bootstrap_allgather(bs, &one, all, 1, err);
  free(all);
  return res;
}

void gw__bootstrap_fail(struct gw_bootstrap *bs, const char *msg) {
  if (!bs || bs->nranks == 1) return;
  if (bs->rank == 0) {
    if (!bs->told_error) gw__boot_broadcast_error(bs, -1, msg);
  } else if (bs->socks[0] >= 0) {
    gw__boot_send_frame(bs->socks[0], GW_BOOT_ERROR, msg, strlen(msg), gw__now() + 1.0);
  }
}

void gw__bootstrap_free(struct gw_bootstrap *bs) {
  if (!bs) return;
  double deadline = gw__now() + 1.0;
  if (bs->socks)
    for (int r = 0; r < (bs->rank == 0 ? bs->nranks : 1); r++) {
      if (bs->socks[r] < 0) continue;
      if (bs->told_error) gw__boot_close_gracefully(bs->socks[r], deadline);
      else gw__sock_close(bs->socks[r]);
    }
  close_listeners(bs);
  free(bs->socks);
  free(bs->from);
  free(bs);
}

gw_result_t gw__bootstrap_local_addr(struct gw_bootstrap *bs, struct sockaddr_storage *addr, socklen_t *len,
                                     struct gw_errctx *err) {
  const char *ifname = gw__env_str("GW_SOCKET_IFNAME", NULL);
  memset(addr, 0, sizeof *addr);
  if (ifname) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
      return gw__err(err, GW_ERR_SYSTEM, "rank %d: getifaddrs failed: %s", bs->rank, strerror(errno));
    bool found = false;
    /* IPv4 first, then a global (or unique local) IPv6 address, then a
     * link-local one, of the named interface. */
    for (int pass = 0; pass < 3 && !found; pass++)
      for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || strcmp(i->ifa_name, ifname) != 0) continue;
        int want = pass == 0 ? AF_INET : AF_INET6;
        if (i->ifa_addr->sa_family != want) continue;
        if (pass > 0 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr) != (pass == 2))
          continue;
        *len = want == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
        memcpy(addr, i->ifa_addr, *len);
        found = true;
      }
    freeifaddrs(ifs);
    if (!found && if_nametoindex(ifname) == 0) /* (a name that is none was said as an interface without address) */
      return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_SOCKET_IFNAME=%s: this machine has no interface of "
                     "that name (`ip -brief address` lists them)", bs->rank, ifname);
    if (!found)
      return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_SOCKET_IFNAME=%s has no IP address on this machine",
                     bs->rank, ifname);
    return GW_SUCCESS;
  }
  /* rank 0: the rendezvous listener's address, which its accepted sockets share */
  int fd = bs->rank == 0 ? (bs->nlisten ? bs->listen_fds[0] : bs->socks[1]) : bs->socks[0];
  *len = sizeof *addr;
  if (fd < 0 || getsockname(fd, (struct sockaddr *)addr, len) != 0)
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot tell this rank's address towards %s: %s", bs->rank,
                   bs->master, strerror(errno));
  return GW_SUCCESS;
}
