/* sock.h - what the network transports (tcp, ib) share: a connection's error
 * message, and socket chores: a listening socket
 * on the communicator's address and its packed form for a connection handle,
 * blocking setup I/O with a deadline, tuning of a data socket (non-blocking,
 * no Nagle, keepalive), and the receiver's way back to its sender (waiting
 * and abandon records).  Never on a data path. */
#ifndef GW_SOCK_H
#define GW_SOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core.h"

/* An address as it travels inside a connection handle. */
struct gw_sockaddr_packed {
  uint16_t family, port;
  uint8_t addr[16];
};

void gw__sock_pack(const struct sockaddr_storage *a, struct gw_sockaddr_packed *out);
/* False for a family other than IPv4/IPv6 (a malformed handle). */
/* local: this rank's own address (conn params), whose interface a peer's
 * link-local IPv6 address is reached over (its scope); may be NULL. */
bool gw__sock_unpack(const struct gw_sockaddr_packed *p, const struct sockaddr_storage *local,
                     struct sockaddr_storage *a, socklen_t *len);
void gw__sock_addr_str(const struct sockaddr_storage *a, char *buf, size_t len);

/* Listens on `local` (its port ignored: the kernel picks one); *bound gets the
 * address with the port.  Returns the socket, or -1 with errno set. */
int gw__sock_listen(const struct sockaddr_storage *local, socklen_t len, int backlog, struct sockaddr_storage *bound);
/* connect() that gives up at the (absolute, gw__now) deadline: a peer whose
 * firewall drops the SYNs would hold a blocking one for the kernel's two
 * minutes of retries.  0, or -1 with errno set (ETIMEDOUT at the deadline);
 * the socket's flags are as before. */
int gw__sock_connect_deadline(int fd, const struct sockaddr *a, socklen_t al, double deadline);
/* Connects and sends `len` bytes of hello before the deadline; -1 with errno set. */
int gw__sock_connect_hello(const struct sockaddr_storage *a, socklen_t al, const void *hello, size_t len,
                           double deadline);
/* The connections a listener has accepted whose hello is not whole yet,
 * read side by side: one at a time, each silent stranger held every
 * connection behind it for 5 s, and a few of them made a peer's streams
 * time out, blamed on the peer.  A connection is dropped when it sends no
 * whole hello within 5 s, closes, or (GW_ACCEPT_PENDING held) when a newer
 * one comes (the oldest goes, once it has waited 1 s, after a last read),
 * or, out of descriptors, for the next; each is counted as a stranger.  Between the
 * caller's calls the set keeps them; gw__accept_set_close closes what is
 * left. */
#define GW_ACCEPT_PENDING 32
/* A connection listener's backlog: its peer's connect completes in the
 * kernel before the listener accepts (setup may accept only after an
 * exchange the peer reaches once connected), so strangers that filled a
 * backlog of 4 (ib's) kept the peer out until the timeout. */
#define GW_LISTEN_BACKLOG 128
#define GW_HELLO_MAX 256
struct gw_accept_pending {
  int fd;
  size_t got;
  double since; /* accepted then */
  char addr[64];
  unsigned char buf[GW_HELLO_MAX];
};
struct gw_accept_set {
  int n;
  unsigned strangers; /* dropped: no whole hello in 5 s, closed, pushed out, or refused by the caller */
  char stranger[64];  /* the last one's address */
  struct gw_accept_pending p[GW_ACCEPT_PENDING];
};
void gw__accept_set_init(struct gw_accept_set *s);
void gw__accept_set_close(struct gw_accept_set *s);
/* A connection the caller refused (its hello was not the one awaited),
 * counted among the strangers, closed. */
void gw__accept_set_refused(struct gw_accept_set *s, int fd, const char *addr);
/* " (N connections that were not its came: the last from ADDR)" when the
 * set met strangers, else "": for a timeout's message. */
void gw__accept_set_said(const struct gw_accept_set *s, char *buf, size_t len);
/* Waits for a connection on a listening socket whose `len` (at most
 * GW_HELLO_MAX) bytes of hello are whole, and copies them to hello and its
 * address ("host:port") to addr.  Returns the socket, or -1 once the
 * deadline has passed (errno ETIMEDOUT) or this process cannot accept (errno
 * EMFILE and the like: see gw__sock_accept_error).  Checking the hello is
 * the caller's. */
int gw__sock_accept_hello(struct gw_accept_set *s, int listen_fd, void *hello, size_t len, double deadline,
                          char *addr, size_t addrlen);
/* The error of a gw__sock_accept_hello that failed other than by its deadline. */
struct gw_conn;
gw_result_t gw__sock_accept_error(const struct gw_conn *c, const char *what, struct gw_errctx *err);
/* Sends or receives exactly len bytes before the (absolute, gw__now) deadline. */
bool gw__sock_io_deadline(int fd, void *buf, size_t len, bool sending, double deadline);
/* Makes a connected socket a data socket: non-blocking, TCP_NODELAY, and TCP
 * keepalive after GW_SOCKET_KEEPALIVE seconds of silence (default 10; 3 probes 2 s
 * apart), so a peer whose machine vanished turns into a socket error. */
/* How long keepalive takes to end a connection to a vanished machine
 * (GW_SOCKET_KEEPALIVE plus the probes), in ms; 0 where it is off. */
int gw__sock_keepalive_ms(void);
void gw__sock_tune(int fd);
/* Whose failure a socket call's errno says it is: GW_ERR_SYSTEM for this
 * rank's own (out of memory, socket buffers or descriptors, its network down
 * or without a route there), else GW_ERR_REMOTE (the peer or the path to it:
 * reset, refused, timed out, host unreachable); *hint: words to add for this
 * rank's own, or "". */
gw_result_t gw__sock_errno_kind(int e, const char **hint);
/* What to add to a failed listen of a transport's (errno e): the errno's
 * hint above, else the interface setting. */
const char *gw__sock_listen_hint(int e);
/* Whether this machine's side of fd's connection is gone: GW_LOCAL_DOWN when
 * the interface its local address is on is down or no interface has that
 * address any more (then a timeout or an unreachable peer on it is this
 * machine's failure, not the peer's), GW_LOCAL_NO_LINK when the interface is
 * up without a link (a cable, a switch port, or the machine at the other end
 * of a direct one: either side's); why (at least 256 bytes) says which,
 * "this machine's interface eth0, 10.0.0.2, is down".  GW_LOCAL_UP when the
 * interface is up, or when it cannot tell (no socket address, getifaddrs
 * failed). */
enum gw_local_link { GW_LOCAL_UP, GW_LOCAL_DOWN, GW_LOCAL_NO_LINK };
/* Bytes in flight or keepalive probes out on sockets, that the peer's kernel
 * has not answered (a stopped or busy peer's kernel answers both). */
struct gw_sock_stall {
  unsigned ms, retrans, probes; /* the longest silence, and over the stalled sockets */
  long long unacked;            /* bytes sent and not acknowledged */
  int fd;                       /* the socket silent longest; -1: none */
};
/* Adds fd (ignored when < 0) to st when it stalled: nothing answered for 2 s. */
void gw__sock_stall_add(int fd, struct gw_sock_stall *st);
/* "the network is not delivering: ..." into why[len], naming host and this
 * machine's interface where it is down; false (nothing written) when no
 * socket stalled. */
bool gw__sock_stall_text(const struct gw_sock_stall *st, const char *host, char *why, size_t len);
enum gw_local_link gw__sock_local_down(int fd, char *why, size_t len);

/* A connection's first failure, for the transport to report from its data-path
 * calls: formats "rank S: <transport> connection to|from rank P (host)<where>:
 * <what>" into msg (GW_ERRMSG_MAX bytes) and sets *failed to code; a later
 * failure keeps the first.  Returns *failed. */
struct gw_conn;
gw_result_t gw__conn_fail(const struct gw_conn *c, gw_result_t *failed, char *msg, const char *where, gw_result_t code,
                          const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* The receiver's way back to its sender on one socket (tcp's stream 0, ib's
 * liveness socket): waiting records, at last an abandon record, one at a
 * time, sent without blocking, in parts when the socket is full and never
 * mixed with another (the sender takes them in, so the socket does not stay
 * full).  The receiver's threads and any that waits on the communicator
 * touch it: under lock, tried, never waited for (each use is best effort or
 * comes again).  Zeroed memory is a fresh one. */
#define GW_WAY_BACK_MAX 64
struct gw_way_back {
  atomic_flag lock;
  bool bounded;           /* TCP_USER_TIMEOUT set on the socket */
  uint32_t len, left;     /* the record in out, and how many of its last bytes are still to go */
  uint64_t published_seq; /* the operation the last waiting record named */
  uint8_t out[GW_WAY_BACK_MAX];
};
struct gw_opdesc;
/* Under w->lock: sends what is left of the record; true once nothing is.  A
 * socket error ends the record and is stored in *err (when err is not NULL). */
bool gw__way_back_flush(int fd, struct gw_way_back *w, _Atomic int *err);
/* The receiver's part of transport.h's waiting: once per operation, after a
 * wait of a second or more before it sent anything in it (awaited), the
 * record head (hlen bytes) followed by mine goes back; what is left of the
 * last record goes first.  Tries the lock; false when it was busy. */
bool gw__way_back_waiting(int fd, struct gw_way_back *w, const void *head, size_t hlen, const struct gw_opdesc *mine,
                          double waited, bool awaited, _Atomic int *err);
/* The receiver's rank failed: rec (len bytes) goes back in one non-blocking
 * send after what is left of the last record; left out when that cannot go
 * whole (best effort; the lock is held a moment by a waiting look). */
void gw__way_back_abandon(int fd, struct gw_way_back *w, const void *rec, size_t len, _Atomic int *err);

#endif
