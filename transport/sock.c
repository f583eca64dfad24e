/* sock.c - see sock.h. */
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "core.h"
#include "sock.h"
#include "transport.h"

void gw__sock_pack(const struct sockaddr_storage *a, struct gw_sockaddr_packed *out) {
  memset(out, 0, sizeof *out);
  out->family = a->ss_family;
  if (a->ss_family == AF_INET) {
    out->port = ntohs(((const struct sockaddr_in *)a)->sin_port);
    memcpy(out->addr, &((const struct sockaddr_in *)a)->sin_addr, 4);
  } else {
    out->port = ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
    memcpy(out->addr, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
  }
}

bool gw__sock_unpack(const struct gw_sockaddr_packed *p, const struct sockaddr_storage *local,
                     struct sockaddr_storage *a, socklen_t *len) {
  memset(a, 0, sizeof *a);
  if (p->family == AF_INET) {
    struct sockaddr_in *in4 = (struct sockaddr_in *)a;
    in4->sin_family = AF_INET;
    in4->sin_port = htons(p->port);
    memcpy(&in4->sin_addr, p->addr, 4);
    *len = sizeof *in4;
    return true;
  }
  if (p->family == AF_INET6) {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)a;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(p->port);
    memcpy(&in6->sin6_addr, p->addr, 16);
    /* A link-local address means something only with its link: ours, the
     * link this rank reaches the peer over (the peer's interface index means
     * nothing here; without one connect() fails with EINVAL). */
    if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr) && local && local->ss_family == AF_INET6)
      in6->sin6_scope_id = ((const struct sockaddr_in6 *)local)->sin6_scope_id;
    *len = sizeof *in6;
    return true;
  }
  return false;
}

void gw__sock_addr_str(const struct sockaddr_storage *a, char *buf, size_t len) {
  char host[96] = "?";
  int port = 0;
  if (a->ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)a;
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (a->ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)a;
    char ip[INET6_ADDRSTRLEN] = "?", ifn[IF_NAMESIZE] = "";
    inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
    if (in6->sin6_scope_id && !if_indextoname(in6->sin6_scope_id, ifn)) snprintf(ifn, sizeof ifn, "%u", in6->sin6_scope_id);
    snprintf(host, sizeof host, "[%s%s%s]", ip, ifn[0] ? "%" : "", ifn);
    port = ntohs(in6->sin6_port);
  }
  snprintf(buf, len, "%s:%d", host, port);
}

int gw__sock_listen(const struct sockaddr_storage *local, socklen_t len, int backlog, struct sockaddr_storage *bound) {
  *bound = *local;
  if (bound->ss_family == AF_INET) ((struct sockaddr_in *)bound)->sin_port = 0;
  else ((struct sockaddr_in6 *)bound)->sin6_port = 0;
  int fd = gw__sock_socket(bound->ss_family, SOCK_STREAM, 0);
  socklen_t al = len;
  if (fd < 0) return -1;
  if (bind(fd, (struct sockaddr *)bound, al) != 0 || listen(fd, backlog) != 0 ||
      getsockname(fd, (struct sockaddr *)bound, &al) != 0) {
    gw__sock_close(fd);
    return -1;
  }
  return fd;
}

/* Polls fd for events until the deadline: 1 ready, 0 past the deadline
 * (errno ETIMEDOUT), -1 an error.  A signal caught meanwhile (a profiler's,
 * a data loader's SIGCHLD) is not one. */
static int poll_until(int fd, short events, double deadline) {
  for (;;) {
    struct pollfd pfd = {.fd = fd, .events = events};
    int ms = gw__ms_until(deadline);
    int pr = ms > 0 ? poll(&pfd, 1, ms) : 0;
    if (pr > 0) return 1;
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) errno = ETIMEDOUT;
    return pr == 0 ? 0 : -1;
  }
}

bool gw__sock_io_deadline(int fd, void *buf, size_t len, bool sending, double deadline) {
  uint8_t *b = buf;
  while (len) {
    if (poll_until(fd, sending ? POLLOUT : POLLIN, deadline) <= 0) return false;
    /* Never blocking: a send larger than the socket buffer must not outlive the deadline. */
    ssize_t n = sending ? send(fd, b, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, b, len, MSG_DONTWAIT);
    if (n <= 0) {
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n == 0) errno = ECONNRESET;
      return false;
    }
    b += n;
    len -= (size_t)n;
  }
  return true;
}

int gw__sock_connect_deadline(int fd, const struct sockaddr *a, socklen_t al, double deadline) {
  const int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) return -1;
  int r = connect(fd, a, al);
  while (r != 0 && (errno == EINPROGRESS || errno == EINTR)) {
    if (poll_until(fd, POLLOUT, deadline) <= 0) break;
    int e = 0;
    socklen_t el = sizeof e;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) break;
    if (e == 0) r = 0;
    errno = e;
    break;
  }
  const int saved = errno;
  if (fcntl(fd, F_SETFL, fl) != 0 && r == 0) return -1;
  errno = saved;
  return r == 0 ? 0 : -1;
}

int gw__sock_connect_hello(const struct sockaddr_storage *a, socklen_t al, const void *hello, size_t len,
                           double deadline) {
  int fd = gw__sock_socket(a->ss_family, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (gw__sock_connect_deadline(fd, (const struct sockaddr *)a, al, deadline) != 0 ||
      !gw__sock_io_deadline(fd, (void *)hello, len, true, deadline)) {
    gw__sock_close(fd);
    return -1;
  }
  return fd;
}

void gw__accept_set_init(struct gw_accept_set *s) {
  s->n = 0, s->strangers = 0, s->stranger[0] = 0;
}

void gw__accept_set_refused(struct gw_accept_set *s, int fd, const char *addr) {
  s->strangers++;
  snprintf(s->stranger, sizeof s->stranger, "%s", addr);
  gw__sock_close(fd);
}

static void drop_pending(struct gw_accept_set *s, int i) {
  gw__accept_set_refused(s, s->p[i].fd, s->p[i].addr);
  s->p[i] = s->p[--s->n];
}

void gw__accept_set_close(struct gw_accept_set *s) {
  for (int i = 0; i < s->n; i++) gw__sock_close(s->p[i].fd);
  s->n = 0;
}

void gw__accept_set_said(const struct gw_accept_set *s, char *buf, size_t len) {
  if (!s->strangers) snprintf(buf, len, "%s", "");
  else
    snprintf(buf, len, " (%u connection%s that %s not its came, the last from %s: another program on this port?)",
             s->strangers, s->strangers == 1 ? "" : "s", s->strangers == 1 ? "was" : "were", s->stranger);
}

/* Reads what pending connection i has sent; 1 when its hello is whole, -1
 * when it closed or failed (dropped), 0 to wait on. */
static int read_pending(struct gw_accept_set *s, int i, size_t len) {
  struct gw_accept_pending *q = &s->p[i];
  for (;;) {
    const ssize_t n = recv(q->fd, q->buf + q->got, len - q->got, MSG_DONTWAIT);
    if (n > 0 && (q->got += (size_t)n) == len) return 1;
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    drop_pending(s, i);
    return -1;
  }
}

/* A pending connection's time to send its whole hello, and the least it
 * waits before a newer connection may push it out of a full set (a peer's
 * hello comes within milliseconds of its connect, or a retransmission
 * later: one pushed out at once, by a burst of 32 strangers, was lost, as its
 * sender does not connect again). */
#define HELLO_WAIT_S 5.0
#define PUSH_AGE_S 1.0

static int oldest_pending(const struct gw_accept_set *s) {
  int o = -1;
  for (int i = 0; i < s->n; i++)
    if (o < 0 || s->p[i].since < s->p[o].since) o = i;
  return o;
}

/* Takes pending connection i out of the set with its whole hello. */
static int take_pending(struct gw_accept_set *s, int i, void *hello, size_t len, char *addr, size_t addrlen) {
  const int fd = s->p[i].fd;
  memcpy(hello, s->p[i].buf, len);
  snprintf(addr, addrlen, "%s", s->p[i].addr);
  s->p[i] = s->p[--s->n];
  return fd;
}

int gw__sock_accept_hello(struct gw_accept_set *s, int listen_fd, void *hello, size_t len, double deadline,
                          char *addr, size_t addrlen) {
  if (len > GW_HELLO_MAX) {
    errno = EINVAL;
    return -1;
  }
  for (;;) {
    const double now = gw__now();
    for (int i = s->n - 1; i >= 0; i--) /* its own 5 s over (not cut short by the deadline: no stranger for that) */
      if (now - s->p[i].since >= HELLO_WAIT_S) drop_pending(s, i);
    if (now >= deadline) {
      errno = ETIMEDOUT;
      return -1;
    }
    /* With the set full, the listener waits until its oldest may be pushed out. */
    const int o = oldest_pending(s);
    const bool room = s->n < GW_ACCEPT_PENDING || now - s->p[o].since >= PUSH_AGE_S;
    double wake = room ? deadline : GW_MIN(deadline, s->p[o].since + PUSH_AGE_S);
    struct pollfd pf[GW_ACCEPT_PENDING + 1];
    pf[0] = (struct pollfd){.fd = room ? listen_fd : -1, .events = POLLIN};
    for (int i = 0; i < s->n; i++) {
      pf[i + 1] = (struct pollfd){.fd = s->p[i].fd, .events = POLLIN};
      wake = GW_MIN(wake, s->p[i].since + HELLO_WAIT_S);
    }
    const int nfds = s->n + 1;
    const int pr = poll(pf, (nfds_t)nfds, gw__ms_until(wake));
    if (pr < 0 && errno != EINTR) return -1;
    if (pr <= 0) continue;
    /* the pending ones first, from the last (a dropped one's place takes the
     * last, already looked at) */
    for (int k = nfds - 1; k >= 1; k--)
      if (pf[k].revents && read_pending(s, k - 1, len) == 1) return take_pending(s, k - 1, hello, len, addr, addrlen);
    if (!pf[0].revents) continue;
    struct sockaddr_storage from;
    socklen_t fl = sizeof from;
    const int fd = gw__sock_accept(listen_fd, (struct sockaddr *)&from, &fl);
    /* Out of descriptors: pending ones are closed for the next (strangers
     * may hold them), else it is this process's failure, said at once (the
     * listener stays readable: retrying would spin until the deadline and
     * blame the peer). */
    if (fd < 0 && (errno == EMFILE || errno == ENFILE) && s->n) {
      drop_pending(s, oldest_pending(s));
      continue;
    }
    if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) return -1;
    /* A listener that is no socket or not listening stays readable: retrying
     * would spin until the deadline.  Anything else (a connection that went
     * before it was taken, a signal, the network errors Linux passes on
     * through accept) means: the next one. */
    if (fd < 0 && (errno == EBADF || errno == EINVAL || errno == ENOTSOCK || errno == EFAULT)) return -1;
    if (fd < 0) continue;
    int got = -1;
    if (s->n == GW_ACCEPT_PENDING) { /* the oldest goes, after a last look at what it sent */
      const int old = oldest_pending(s);
      const int r = read_pending(s, old, len);
      if (r == 1) got = take_pending(s, old, hello, len, addr, addrlen);
      else if (r == 0) drop_pending(s, old);
    }
    struct gw_accept_pending *q = &s->p[s->n++];
    q->fd = fd, q->got = 0, q->since = gw__now();
    gw__sock_addr_str(&from, q->addr, sizeof q->addr);
    if (got >= 0) return got;
  }
}

gw_result_t gw__sock_accept_error(const struct gw_conn *c, const char *what, struct gw_errctx *err) {
  int e = errno;
  const char *hint;
  (void)gw__sock_errno_kind(e, &hint);
  return gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot accept rank %d's (%s) %s: %s%s", c->self, c->peer, c->peer_host,
                 what, strerror(e), hint);
}

/* GW_SOCKET_KEEPALIVE's idle seconds: Linux takes 1..32767 s (more was
 * refused, and the system's 2 hours applied) and a wider value is no int
 * (4294967295 was -1, off): clamped, said.  0: off; a negative value is
 * warned about and the default used (it turned dead-peer detection off
 * without a word). */
GW_PARAM_MIN(SocketKeepalive, "GW_SOCKET_KEEPALIVE", 10, 0)

static int keepalive_idle(void) {
  const int64_t v = gw__param_SocketKeepalive();
  static _Atomic bool told;
  if (v > 32767 && !atomic_exchange(&told, true))
    GW_WARN(GW_SUB_ENV, "GW_SOCKET_KEEPALIVE=%lld is more than Linux's 32767 s: using 32767", (long long)v);
  return v <= 0 ? 0 : v > 32767 ? 32767 : (int)v;
}
#define KEEPALIVE_INTVL 2
#define KEEPALIVE_CNT 3

int gw__sock_keepalive_ms(void) {
  const int idle = keepalive_idle();
  return idle ? (idle + KEEPALIVE_INTVL * KEEPALIVE_CNT) * 1000 : 0;
}

void gw__sock_tune(int fd) {
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int idle_set = keepalive_idle();
  if (idle_set > 0) {
    /* Probes every second from the first second of silence, as many as the
     * setting's bound allows (idle + 3 x 2 s; past 127 s, Linux's most
     * probes, further apart): a vanished peer is noticed as late as before,
     * and a wait that times out sees probes unanswered (net_stalled: "the
     * network is not delivering"), where after 10 s of idle nothing had been
     * probed yet. */
    const int bound = idle_set + KEEPALIVE_INTVL * KEEPALIVE_CNT;
    int intvl = (bound - 1 + 126) / 127, cnt = (bound - 1) / intvl; /* past 127 s: probes further apart */
    int idle = bound - intvl * cnt;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    /* No TCP_USER_TIMEOUT: Linux (>= 5.11) applies it to a zero window too,
     * so a live peer that merely does not read for that long (late to an
     * operation: a checkpoint, an evaluation) had its senders' connections
     * closed, "Connection timed out" (test_late_rank_kept).  A sender whose
     * peer's machine vanished with data unacknowledged (keepalive probes only
     * idle connections) is ended by the communicator's deadline, or sooner by
     * a rank whose receiving side's keepalive saw it and told the others. */
  }
}

gw_result_t gw__conn_fail(const struct gw_conn *c, gw_result_t *failed, char *msg, const char *where, gw_result_t code,
                          const char *fmt, ...) {
  if (*failed) return *failed;
  char what[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(msg, GW_ERRMSG_MAX, "rank %d: %s connection %s rank %d (%s)%s: %s", c->self, c->tp ? c->tp->name : "?",
           c->is_send ? "to" : "from", c->peer, c->peer_host, where, what);
  *failed = code;
  return code;
}

/* ifa's address is the socket's: the same family and bytes (a v4-mapped v6
 * address as the v4 one). */
static bool same_address(const struct sockaddr *ifa, const struct sockaddr_storage *me) {
  if (ifa->sa_family == AF_INET && me->ss_family == AF_INET)
    return ((const struct sockaddr_in *)ifa)->sin_addr.s_addr == ((const struct sockaddr_in *)me)->sin_addr.s_addr;
  if (ifa->sa_family == AF_INET6 && me->ss_family == AF_INET6)
    return !memcmp(&((const struct sockaddr_in6 *)ifa)->sin6_addr, &((const struct sockaddr_in6 *)me)->sin6_addr,
                   sizeof(struct in6_addr));
  return false;
}

enum gw_local_link gw__sock_local_down(int fd, char *why, size_t len) {
  struct sockaddr_storage me;
  socklen_t sl = sizeof me;
  if (fd < 0 || getsockname(fd, (struct sockaddr *)&me, &sl) != 0) return GW_LOCAL_UP;
  if (me.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&((struct sockaddr_in6 *)&me)->sin6_addr)) {
    struct sockaddr_in v4 = {.sin_family = AF_INET};
    memcpy(&v4.sin_addr, &((struct sockaddr_in6 *)&me)->sin6_addr.s6_addr[12], 4);
    memset(&me, 0, sizeof me);
    memcpy(&me, &v4, sizeof v4);
  }
  if (me.ss_family != AF_INET && me.ss_family != AF_INET6) return GW_LOCAL_UP;
  char addr[INET6_ADDRSTRLEN] = "?";
  inet_ntop(me.ss_family, me.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&me)->sin_addr
                                                  : (const void *)&((struct sockaddr_in6 *)&me)->sin6_addr,
            addr, sizeof addr);
  struct ifaddrs *ifs;
  if (getifaddrs(&ifs) != 0) return GW_LOCAL_UP;
  const struct ifaddrs *hit = NULL;
  for (const struct ifaddrs *i = ifs; i && !hit; i = i->ifa_next)
    if (i->ifa_addr && same_address(i->ifa_addr, &me)) hit = i;
  enum gw_local_link link = GW_LOCAL_DOWN;
  if (!hit)
    snprintf(why, len, "this machine no longer has the address %s the connection was made from: its interface went "
             "away or lost it", addr);
  else if (!(hit->ifa_flags & IFF_UP))
    snprintf(why, len, "this machine's interface %.32s, %s, is down", hit->ifa_name, addr);
  else if (!(hit->ifa_flags & IFF_RUNNING))
    snprintf(why, len, "this machine's interface %.32s, %s, has no link (its cable, its switch port, or the machine "
             "at the other end of a direct cable)", hit->ifa_name, addr), link = GW_LOCAL_NO_LINK;
  else
    link = GW_LOCAL_UP;
  freeifaddrs(ifs);
  return link;
}

/* A stall counts from 2 s without an answer: several retransmissions at any
 * sane round trip, or two keepalive probes (gw__sock_tune probes each second). */
#define STALL_MS 2000

void gw__sock_stall_add(int fd, struct gw_sock_stall *st) {
  struct tcp_info ti;
  socklen_t sl = sizeof ti;
  memset(&ti, 0, sizeof ti);
  /* bytes in flight with a retransmission timeout since the last answer, or
   * two probes (keepalive's, or a zero window's) unanswered: the moment
   * right after a first send or probe following a long idle, when the last
   * answer is old but nothing was due yet, does not count */
  if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &sl) != 0 ||
      !((ti.tcpi_unacked > 0 && ti.tcpi_retransmits > 0) || ti.tcpi_probes >= 2) || ti.tcpi_last_ack_recv < STALL_MS)
    return;
  int out = 0, unsent = 0; /* bytes queued, and of them not sent yet */
  if (ioctl(fd, SIOCOUTQ, &out) == 0 && ioctl(fd, SIOCOUTQNSD, &unsent) == 0 && out > unsent)
    st->unacked += out - unsent;
  st->retrans += ti.tcpi_retransmits; /* (since the last answer) */
  st->probes = GW_MAX(st->probes, (unsigned)ti.tcpi_probes);
  if (st->fd < 0 || ti.tcpi_last_ack_recv > st->ms) st->ms = ti.tcpi_last_ack_recv, st->fd = fd;
}

bool gw__sock_stall_text(const struct gw_sock_stall *st, const char *host, char *why, size_t len) {
  if (st->fd < 0) return false;
  char here[300] = "";
  const enum gw_local_link link = gw__sock_local_down(st->fd, here, sizeof here);
  char what[320];
  if (st->unacked > 0)
    snprintf(what, sizeof what, "%lld bytes this rank sent to %s have gone unacknowledged for %.1f s (%u "
             "retransmissions)", st->unacked, host, st->ms / 1000.0, st->retrans);
  else
    snprintf(what, sizeof what, "%s has answered nothing this rank sent for %.1f s (%u probes unanswered)", host,
             st->ms / 1000.0, st->probes);
  snprintf(why, len, "the network is not delivering: %s%s%s", what,
           link != GW_LOCAL_UP ? ": " : " (a link, switch or firewall between the machines, or that machine is down)",
           link != GW_LOCAL_UP ? here : "");
  return true;
}

const char *gw__sock_listen_hint(int e) {
  const char *hint;
  gw__sock_errno_kind(e, &hint);
  return *hint ? hint : " (check GW_SOCKET_IFNAME)";
}

gw_result_t gw__sock_errno_kind(int e, const char **hint) {
  *hint = "";
  switch (e) {
    case EMFILE:
    case ENFILE: *hint = " (this rank is out of file descriptors: raise `ulimit -n`)"; return GW_ERR_SYSTEM;
    case ENOBUFS:
    case ENOMEM: *hint = " (this rank's machine is out of memory or socket buffers)"; return GW_ERR_SYSTEM;
    case ENETDOWN:
    case ENETUNREACH: *hint = " (this machine's network is down or has no route there)"; return GW_ERR_SYSTEM;
    default: return GW_ERR_REMOTE; /* reset, refused, timed out, host unreachable, closed (no errno) */
  }
}

bool gw__way_back_flush(int fd, struct gw_way_back *w, _Atomic int *err) {
  while (w->left) {
    const ssize_t n = send(fd, w->out + w->len - w->left, w->left, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      if (err) atomic_store_explicit(err, errno, memory_order_relaxed);
      w->left = 0;
    }
    if (n <= 0) return false;
    w->left -= (uint32_t)n;
  }
  return true;
}

bool gw__way_back_waiting(int fd, struct gw_way_back *w, const void *head, size_t hlen, const struct gw_opdesc *mine,
                          double waited, bool awaited, _Atomic int *err) {
  if (atomic_flag_test_and_set(&w->lock)) return false;
  if (gw__way_back_flush(fd, w, err) && awaited && waited >= 1.0 && mine->seq != w->published_seq &&
      hlen + sizeof *mine <= sizeof w->out) {
    /* Keepalive probes only a connection with nothing unacknowledged: a
     * record towards a machine that vanished would keep this side from
     * seeing it (the vanished-machine bound relies on the receivers), so
     * such data gets keepalive's time (TCP_USER_TIMEOUT, which also ends a
     * zero window that long). */
    const int ms = gw__sock_keepalive_ms();
    if (!w->bounded && ms > 0) setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
    w->bounded = true;
    memcpy(w->out, head, hlen), memcpy(w->out + hlen, mine, sizeof *mine);
    w->len = w->left = (uint32_t)(hlen + sizeof *mine);
    w->published_seq = mine->seq;
    gw__way_back_flush(fd, w, err);
  }
  atomic_flag_clear(&w->lock);
  return true;
}

void gw__way_back_abandon(int fd, struct gw_way_back *w, const void *rec, size_t len, _Atomic int *err) {
  for (int tries = 0; atomic_flag_test_and_set(&w->lock); tries++) { /* held a moment by a waiting look */
    if (tries > 10000) return;
    sched_yield();
  }
  if (gw__way_back_flush(fd, w, err)) (void)!send(fd, rec, len, MSG_DONTWAIT | MSG_NOSIGNAL);
  atomic_flag_clear(&w->lock);
}
