/* optwords.c - options as "key=value" words, compared (optwords.h): gw-train's
 * across ranks and against a checkpoint's, gw-perf's across ranks. */
#include "optwords.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value of word `key=` in a words string; its length in *vlen. */
static const char *word_value(const char *words, const char *key, size_t klen, size_t *vlen) {
  for (const char *p = words; *p;) {
    const char *end = strchr(p, ' ');
    if (!end) end = p + strlen(p);
    if ((size_t)(end - p) > klen && !strncmp(p, key, klen) && p[klen] == '=') {
      *vlen = (size_t)(end - p) - klen - 1;
      return p + klen + 1;
    }
    p = *end ? end + 1 : end;
  }
  return NULL;
}

/* Whether words holds the bare word (no '=') w of length wlen after its first word. */
static int has_flag_word(const char *words, const char *w, size_t wlen) {
  const char *p = strchr(words, ' ');
  while (p && *p) {
    p++;
    const size_t l = strcspn(p, " ");
    if (l == wlen && !strncmp(p, w, wlen)) return 1;
    p += l;
  }
  return 0;
}

/* The bare words (flags on: drop_last) after the first in `from` and not in
 * `other`, said as "WORD on -> off" (off -> on when !on_in_a). */
static int flag_words_diff(const char *from, const char *other, int on_in_a, int n, char *out, size_t len,
                           size_t *used) {
  for (const char *p = strchr(from, ' '); p && *p;) {
    p++;
    const size_t l = strcspn(p, " ");
    /* (once each: a word repeated, in an edited checkpoint's config, was said as often) */
    char *seen = strndup(from, (size_t)(p - from));
    const int again = seen && has_flag_word(seen, p, l);
    free(seen);
    if (l && !again && !memchr(p, '=', l) && !has_flag_word(other, p, l)) {
      int w = snprintf(out + *used, len - *used, "%s%.*s %s", n ? ", " : "", (int)l, p,
                       on_in_a ? "on -> off" : "off -> on");
      if (w > 0) *used += (size_t)w < len - *used ? (size_t)w : len - *used - 1;
      n++;
    }
    p += l;
  }
  return n;
}

int opt_words_diff(const char *a, const char *b, const char *const *skip, char *out, size_t len) {
  int n = 0;
  size_t used = 0;
  out[0] = 0;
  for (const char *p = a; *p;) {
    const char *eq = strchr(p, '='), *end = strchr(p, ' ');
    if (!end) end = p + strlen(p);
    if (eq && eq < end) {
      size_t klen = (size_t)(eq - p), blen = 0;
      int skipped = 0;
      for (int i = 0; skip && skip[i]; i++) skipped |= strlen(skip[i]) == klen && !strncmp(skip[i], p, klen);
      const char *bv = word_value(b, p, klen, &blen);
      const size_t alen = (size_t)(end - eq - 1);
      if (!skipped && (!bv || blen != alen || strncmp(bv, eq + 1, alen) != 0)) {
        int w = snprintf(out + used, len - used, "%s%.*s %.*s -> %.*s", n ? ", " : "", (int)klen, p, (int)alen,
                         eq + 1, bv ? (int)blen : 6, bv ? bv : "(none)");
        if (w > 0) used += (size_t)w < len - used ? (size_t)w : len - used - 1;
        n++;
      }
    }
    p = *end ? end + 1 : end;
  }
  n = flag_words_diff(a, b, 1, n, out, len, &used);
  return flag_words_diff(b, a, 0, n, out, len, &used);
}
