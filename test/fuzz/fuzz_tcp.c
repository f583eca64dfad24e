/* fuzz_tcp.c - libFuzzer target for the tcp transport's receive side: arbitrary
 * bytes arrive on a connection's sockets (first input byte: how many streams) and
 * the receiver parses frames into its slots, delivering and releasing chunks, as
 * the collectives would.  No crash, over-read or hang is allowed; malformed input
 * must end in an error.  Built by test/fuzz.sh; includes tcp.c to reach its
 * statics. */
#include "../../comm/forkfd.c"
#include "../../transport/sock.c"
#include "../../transport/tcp.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  static int quiet = 0;
  if (!quiet) {
    setenv("GW_DEBUG", "NONE", 1);
    quiet = 1;
  }
  if (len < 1) return 0;
  uint32_t nstreams = 1 + data[0] % 3;
  data++, len--;
  struct gw_conn_params p = {.nslots = 4, .slot_bytes = 128 << 10, .nstreams = nstreams, .timeout_s = 1};
  struct tcp_conn *t = conn_new(&p);
  struct gw_conn c = {.tp = &gw__tcp_transport, .self = 1, .peer = 0, .is_send = false, .priv = t};
  struct gw_errctx err;
  if (!t || alloc_slots(&c, t, &err) != GW_SUCCESS) return 0;
  t->rslot = calloc(t->nslots, sizeof *t->rslot);
  int writers[TCP_MAX_STREAMS];
  /* the input is dealt to the streams in turn, in 61-byte pieces */
  for (uint32_t s = 0; s < nstreams; s++) {
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
    int big = 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    t->rs[s].fd = sv[1];
    writers[s] = sv[0];
  }
  size_t off = 0;
  for (uint32_t k = 0; off < len && off < (1u << 20); k++) {
    size_t n = len - off < 61 ? len - off : 61;
    if (send(writers[k % nstreams], data + off, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) break;
    off += n;
  }
  for (uint32_t s = 0; s < nstreams; s++) shutdown(writers[s], SHUT_WR);
  for (int i = 0; i < 100000; i++) {
    const struct gw_chunk_hdr *h;
    const void *d;
    gw_result_t r = tcp_recv_peek(&c, &h, &d);
    if (r == GW_SUCCESS) {
      if (h->bytes > t->slot_bytes) __builtin_trap(); /* must have been refused */
      volatile uint8_t sink = 0;
      for (uint32_t b = 0; b < h->bytes; b += 4096) sink ^= ((const uint8_t *)d)[b];
      (void)sink;
      tcp_recv_release(&c);
      continue;
    }
    if (r != GW_INPROGRESS) break; /* an error: fine */
    /* nothing complete and everything read: the peer "closed" (check_owed ends it) */
    if (i > 1000) break;
  }
  for (uint32_t s = 0; s < nstreams; s++) close(writers[s]);
  tcp_close(&c);
  return 0;
}
