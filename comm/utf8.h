/* utf8.h - the two pieces of JSON string decoding that model/safetensors.c
 * (strict: a weights file's header) and gw-run (lenient: a PyTorch
 * program's error file, tools/gw-run-cause.c) share: four hex digits of a
 * \uXXXX escape, and a code point written as UTF-8.  Header only: gw-run
 * links no libgradwire. */
#ifndef GW_UTF8_H
#define GW_UTF8_H

/* The four hex digits at p (before end) into *v: 0, or -1 when there are not four. */
static inline int gw__hex4(const char *p, const char *end, unsigned *v) {
  if (end - p < 4) return -1;
  *v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                 : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                 : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                        : 16u;
    if (d == 16) return -1;
    *v = *v << 4 | d;
  }
  return 0;
}

/* cp (at most 0x10ffff) as UTF-8 at d (room for 4 bytes): the end. */
static inline char *gw__put_utf8(char *d, unsigned cp) {
  if (cp < 0x80) {
    *d++ = (char)cp;
  } else if (cp < 0x800) {
    *d++ = (char)(0xc0 | cp >> 6);
    *d++ = (char)(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    *d++ = (char)(0xe0 | cp >> 12);
    *d++ = (char)(0x80 | (cp >> 6 & 0x3f));
    *d++ = (char)(0x80 | (cp & 0x3f));
  } else {
    *d++ = (char)(0xf0 | cp >> 18);
    *d++ = (char)(0x80 | (cp >> 12 & 0x3f));
    *d++ = (char)(0x80 | (cp >> 6 & 0x3f));
    *d++ = (char)(0x80 | (cp & 0x3f));
  }
  return d;
}

#endif
