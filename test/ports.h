/* ports.h - a free loopback port for a test's listener, from below the
 * kernel's ephemeral range (ip_local_port_range): a port taken by bind(0)
 * comes from that range, and in the moment between releasing it and the
 * listener's bind, another process's connect() could take it as its own
 * ephemeral port (the tests of suite 'waits' run at once, many of them
 * connecting).  span ports in a row (P .. P + span - 1), each bindable on
 * 127.0.0.1 when checked; -1 when none was found.  Header-only: test/harness.c
 * and test/gwrun_helpers.c (which does not link the harness) both use it. */
#ifndef GW_TEST_PORTS_H
#define GW_TEST_PORTS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static inline bool test_port_bindable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  const bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

static inline int test_free_ports(int span) {
  int lo = 32768, hi = 60999;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    fclose(f);
  }
  const int first = 10000, last = lo - span; /* [first, last] below the ephemeral range */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t r = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_nsec;
  for (int tries = 0; last > first && tries < 200; tries++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    const int p = first + (int)(r % (uint64_t)(last - first));
    bool ok = true;
    for (int k = 0; k < span && ok; k++) ok = test_port_bindable(p + k);
    if (ok) return p;
  }
  return -1;
}

#endif
