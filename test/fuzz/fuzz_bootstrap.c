/* fuzz_bootstrap.c - libFuzzer target for the rendezvous parsers: the bytes a
 * stranger (or a broken peer) sends are fed through a socket pair to rank 0's
 * hello reader (a read at a time, as its poll loop does) and token check, to
 * rank 0's allgather receive, and, as rank 0's answer, to a rank's allgather
 * receive.  Built by test/fuzz.sh with clang -fsanitize=fuzzer,address,undefined;
 * includes bootstrap.c to reach its static parsers (and sock.c, which its
 * connect uses). */
#include "../../comm/bootstrap.c"
#include "../../comm/bootstrap_root.c"
#include "../../comm/hmac.c"
#include "../../comm/netname.c"
#include "../../comm/forkfd.c"
#include "../../transport/sock.c"

#include <sys/socket.h>

/* A socket pair whose read end holds data (up to the socket buffer), then EOF. */
static int feed(const uint8_t *data, size_t len) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  int big = 1 << 20;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  size_t n = len > 65536 ? 65536 : len;
  if (n && send(sv[0], data, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) n = 0;
  shutdown(sv[0], SHUT_WR);
  /* keep sv[0] open for writes by the code under test; close it afterwards */
  return sv[1] | (sv[0] << 16);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  static int quiet = 0;
  if (!quiet) {
    setenv("GW_DEBUG", "NONE", 1);
    quiet = 1;
  }
  double deadline = gw__now() + 0.05;
  /* 1: rank 0 reads a hello and checks its proof of the token */
  int fds = feed(data, len);
  if (fds < 0) return 0;
  int rd = fds & 0xffff, wr = fds >> 16;
  struct gw_bootstrap hb = {.rank = 0, .nranks = 2};
  struct boot_pending p = {.fd = rd, .deadline = deadline, .challenge = {1, 2, 3}};
  snprintf(p.who, sizeof p.who, "fuzz");
  struct boot_strangers st = {0};
  bool whole = false;
  while (p.fd >= 0 && !whole) whole = root_read_hello(&hb, &p, &st); /* the data, then EOF: never waits */
  if (whole) {
    struct gw_boot_hello h;
    memcpy(&h, p.buf + sizeof(struct gw_boot_frame), sizeof h);
    (void)hello_mac_ok(&h, p.challenge, "token");
  }
  if (p.fd >= 0) close(rd); /* a refused one was closed by the reader */
  close(wr);

  /* 2: rank 0 receives rank 1's allgather contribution */
  fds = feed(data, len);
  if (fds < 0) return 0;
  rd = fds & 0xffff, wr = fds >> 16;
  int socks0[2] = {-1, rd};
  struct gw_bootstrap root = {.rank = 0, .nranks = 2, .socks = socks0, .timeout_s = 0.05};
  uint8_t mine[16] = {0}, all[32];
  struct gw_errctx err;
  (void)gw__bootstrap_allgather(&root, mine, all, sizeof mine, &err);
  close(rd);
  close(wr);

  /* 3: rank 1 receives rank 0's answer (the table, or an ERROR frame) */
  fds = feed(data, len);
  if (fds < 0) return 0;
  rd = fds & 0xffff, wr = fds >> 16;
  int socks1[1] = {rd};
  struct gw_bootstrap peer = {.rank = 1, .nranks = 2, .socks = socks1, .timeout_s = 0.05};
  (void)gw__bootstrap_allgather(&peer, mine, all, sizeof mine, &err);
  close(rd);
  close(wr);

  /* 4: the master address parser */
  char text[128], host[64], port[16];
  size_t tl = len < sizeof text - 1 ? len : sizeof text - 1;
  memcpy(text, data, tl);
  text[tl] = 0;
  (void)gw__parse_host_port(text, host, sizeof host, port, sizeof port);
  return 0;
}
