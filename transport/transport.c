/* transport.c - chooses the transport for a pair of ranks: shm inside a machine,
 * tcp between machines (and inside one when GW_TRANSPORT=tcp forces it). */
#include <string.h>

#include "transport.h"

static const struct gw_transport *const all_transports[] = {&gw__shm_transport, &gw__tcp_transport};

const struct gw_transport *gw__transport_select(const struct gw_peer_info *self,
                                                const struct gw_peer_info *peer) {
  const char *want = gw__env_str("GW_TRANSPORT", NULL);
  for (size_t i = 0; i < sizeof all_transports / sizeof all_transports[0]; i++) {
    const struct gw_transport *t = all_transports[i];
    if (want && strcmp(want, t->name) != 0) continue;
    if (t->can_connect(self, peer)) return t;
  }
  return NULL;
}
