/* netname.h - what a host name resolves to here, for the checks that a
 * master address other machines must reach is not a loopback one (the
 * library's srun path, gw-run's --master).  Compiled into both: gw-run does
 * not link the library. */
#ifndef GW_NETNAME_H
#define GW_NETNAME_H

#include <stdbool.h>
#include <stddef.h>

/* Whether host is a name (not a numeric address: 127.0.0.1 stays allowed,
 * for tests on one machine) whose every address here is a loopback one; out
 * gets the first. */
bool gw__name_is_loopback(const char *host, char *out, size_t outsz);

/* Whether host is a link-local IPv6 address (fe80::/10, numeric) given
 * without its interface (%zone): no socket can use one (EINVAL), which was
 * said as a port in use or a rank not running, after the whole deadline. */
bool gw__addr_needs_zone(const char *host);

#endif
