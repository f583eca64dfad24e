/* envint.h - how a GW_* integer setting is spelled, for the library
 * (gw__env_int, comm/debug.c) and gw-run (GW_SOCKET_KEEPALIVE, which its
 * links between nodes follow: tools/gw-run-io.c), so both read one value the
 * same way.  Decimal, or hexadecimal after 0x (a leading zero is no octal:
 * 010 was 8, and 08 "not an integer"); leading blanks and a sign as strtoll
 * takes them; an optional K, M or G suffix (powers of 1024: most tunables are
 * sizes).  Header only: gw-run links no libgradwire. */
#ifndef GW_ENVINT_H
#define GW_ENVINT_H

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* s (non-empty) into *v: false when it is not such an integer or out of range. */
static inline bool gw__parse_env_int(const char *s, long long *v) {
  char *end = NULL;
  const char *digits = s + strspn(s, " \t+-");
  const int saved = errno;
  errno = 0;
  long long x = strtoll(s, &end, digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X') ? 16 : 10);
  bool ok = errno == 0 && end != s;
  if (ok && *end) {
    long long mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1LL << 10;
    else if (*end == 'm' || *end == 'M') mul = 1LL << 20;
    else if (*end == 'g' || *end == 'G') mul = 1LL << 30;
    if (mul != 1 && end[1] == 0) {
      if (x > LLONG_MAX / mul || x < LLONG_MIN / mul) ok = false; /* it wrapped to a small size */
      else x *= mul;
      end++;
    }
  }
  errno = saved;
  if (!ok || *end) return false;
  *v = x;
  return true;
}

#endif
