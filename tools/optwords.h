/* optwords.h - options as "key=value" words (and bare flag words after the
 * first word), compared: gw-train's across ranks and against a checkpoint's,
 * gw-perf's across ranks. */
#ifndef GW_OPTWORDS_H
#define GW_OPTWORDS_H

#include <stddef.h>

/* Lists "key A -> B" in out for each key of words a whose value in b differs
 * (or is missing), keys in skip (NULL-terminated) aside, then "word on -> off"
 * or "off -> on" for a bare word after the first (a flag: drop_last) in one
 * of a and b only; returns how many. */
int opt_words_diff(const char *a, const char *b, const char *const *skip, char *out, size_t len);

#endif
