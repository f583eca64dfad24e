/* transport.c - chooses the transport for a pair of ranks: shm inside a machine;
 * between machines ib when both ranks have an active InfiniBand/RoCE port (or
 * the verbs emulator), else tcp.  GW_TRANSPORT restricts the choice (e.g. tcp or
 * ib inside one machine). */
#include <string.h>
#include <strings.h>

#include "transport.h"

static const struct gw_transport *const all_transports[] = {
    &gw__shm_transport,
#if GW_HAVE_IBVERBS
    &gw__ib_transport,
#endif
    &gw__tcp_transport,
};

/* Every name GW_TRANSPORT may hold, built here or not. */
static const char *const wanted_names[] = {"shm", "ib", "tcp"};

int32_t gw__transport_wanted(void) {
  const char *want = gw__env_str("GW_TRANSPORT", NULL);
  if (!want || !*want) return 0;
  for (int32_t i = 0; i < (int32_t)(sizeof wanted_names / sizeof wanted_names[0]); i++)
    if (!strcasecmp(want, wanted_names[i])) return i + 1; /* (as GW_ALGO and GW_PROTO: SHM was no transport) */
  return -1;
}

const char *gw__transport_wanted_name(int32_t w) {
  if (w == 0) return "(unset)";
  if (w < 0 || w > (int32_t)(sizeof wanted_names / sizeof wanted_names[0])) return "(not a transport)";
  return wanted_names[w - 1];
}

uint32_t gw__transport_caps(void) {
  uint32_t caps = 0;
#if GW_HAVE_IBVERBS
  const char *want = gw__env_str("GW_TRANSPORT", NULL);
  if ((!want || !strcasecmp(want, "ib")) && gw__ib_usable()) caps |= GW_CAP_IB;
#endif
  return caps;
}

const struct gw_transport *gw__transport_select(const struct gw_peer_info *self,
                                                const struct gw_peer_info *peer) {
  const char *want = gw__env_str("GW_TRANSPORT", NULL);
  for (size_t i = 0; i < sizeof all_transports / sizeof all_transports[0]; i++) {
    const struct gw_transport *t = all_transports[i];
    if (want && strcasecmp(want, t->name) != 0) continue;
    if (t->can_connect(self, peer)) return t;
  }
  return NULL;
}
