/* decimal.h - the text the tools' fractional flags and variables take:
 * decimal, as a person writes it.  strtod also reads hexadecimal ("0x10",
 * "0x1p4") and skips white space before the number, so `--lr 0x10` was 16
 * and `-n " 1"` passed where `-b " 8"` was refused, while the integer flags
 * refused both.  True when s starts with a sign, a digit or a point and
 * holds no hexadecimal x or p; the caller's strtod and range checks do the
 * rest (inf and nan start with none of those). */
#ifndef GW_DECIMAL_H
#define GW_DECIMAL_H

#include <stdbool.h>
#include <string.h>

static inline bool gw_decimal_text(const char *s) {
  const char c = s[0];
  return (c == '+' || c == '-' || c == '.' || (c >= '0' && c <= '9')) && !strpbrk(s, "xXpP");
}

#endif
