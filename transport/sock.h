/* sock.h - the socket chores the tcp and ib transports share: a listening socket
 * on the communicator's address and its packed form for a connection handle,
 * blocking setup I/O with a deadline, and tuning of a data socket (non-blocking,
 * no Nagle, keepalive).  Never on a data path. */
#ifndef GW_SOCK_H
#define GW_SOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* An address as it travels inside a connection handle. */
struct gw_sockaddr_packed {
  uint16_t family, port;
  uint8_t addr[16];
};

void gw__sock_pack(const struct sockaddr_storage *a, struct gw_sockaddr_packed *out);
/* False for a family other than IPv4/IPv6 (a malformed handle). */
bool gw__sock_unpack(const struct gw_sockaddr_packed *p, struct sockaddr_storage *a, socklen_t *len);
void gw__sock_addr_str(const struct sockaddr_storage *a, char *buf, size_t len);

/* Listens on `local` (its port ignored: the kernel picks one); *bound gets the
 * address with the port.  Returns the socket, or -1 with errno set. */
int gw__sock_listen(const struct sockaddr_storage *local, socklen_t len, int backlog, struct sockaddr_storage *bound);
/* Connects and sends `len` bytes of hello before the deadline; -1 with errno set. */
int gw__sock_connect_hello(const struct sockaddr_storage *a, socklen_t al, const void *hello, size_t len,
                           double deadline);
/* Waits for a connection on a listening socket and reads its `len` bytes of
 * hello (a connection that sends none within 5 s is dropped and the wait goes
 * on).  Returns the socket, or -1 once the deadline has passed.  Checking the
 * hello is the caller's. */
int gw__sock_accept_hello(int listen_fd, void *hello, size_t len, double deadline);
/* Sends or receives exactly len bytes before the (absolute, gw__now) deadline. */
bool gw__sock_io_deadline(int fd, void *buf, size_t len, bool sending, double deadline);
/* Makes a connected socket a data socket: non-blocking, TCP_NODELAY, and TCP
 * keepalive after GW_SOCKET_KEEPALIVE seconds of silence (default 10; 3 probes 2 s
 * apart), so a peer whose machine vanished turns into a socket error. */
void gw__sock_tune(int fd);

#endif
