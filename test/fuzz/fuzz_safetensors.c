/* fuzz_safetensors.c - libFuzzer target for the safetensors reader
 * (model/safetensors.c).  The input is read as a whole file, or behind a made-up
 * 8-byte length (so the fuzzer reaches the JSON parser without first guessing a
 * length that fits), or with each byte a JSON token of the header's vocabulary, or
 * as records of well-formed tensors with one range or length perhaps off by one
 * (so ranges and the tiling are reached, hit and missed, from an empty corpus).
 * Whatever parses is read through completely (every data byte, every lookup) and
 * written back through the writer's header builder; that rewrite must parse to the
 * same tensors.  Built by test/fuzz.sh with clang -fsanitize=fuzzer,address,
 * undefined; includes safetensors.c and safetensors_write.c to reach the
 * writer's static helpers without touching the disk. */
#include "../../model/safetensors.c"
#include "../../model/safetensors_write.c"

#include "model_fail_stub.h"

static void must(int cond, const char *what) {
  if (!cond) {
    fprintf(stderr, "fuzz_safetensors: %s (%s)\n", what, fuzz_error);
    abort();
  }
}

/* Reads every byte the file claims, so ASan sees any range past the buffer. */
static unsigned touch(const struct gw_st_file *f) {
  unsigned sum = 0;
  for (int i = 0; i < f->ntensors; i++) {
    const struct gw_st_tensor *t = &f->tensors[i];
    for (size_t b = 0; b < t->nbytes; b++) sum += ((const unsigned char *)t->data)[b];
    must(gw_st_find(f, t->name) == t, "a parsed name is not found");
  }
  for (int i = 0; i < f->nmeta; i++) must(gw_st_metadata(f, f->meta[2 * i]) != NULL, "a metadata key is not found");
  return sum;
}

/* The writer's header plus the data, in memory. */
static char *rewrite(const struct gw_st_file *f, size_t *len) {
  const char **kv = NULL;
  int nkv = 0;
  struct sbuf h = {0};
  must(check_for_write("<fuzz>", f->tensors, f->ntensors) == GW_SUCCESS, "a parsed file is refused by the writer");
  const char **list = calloc(2 * (size_t)f->nmeta + 1, sizeof *list);
  must(list != NULL, "oom");
  if (f->nmeta) memcpy(list, f->meta, 2 * (size_t)f->nmeta * sizeof *list);
  must(collect_metadata("<fuzz>", list, &kv, &nkv) == GW_SUCCESS, "parsed metadata is refused by the writer");
  must(build_header("<fuzz>", &h, f->tensors, f->ntensors, kv, nkv) == GW_SUCCESS, "header build failed");
  size_t total = 8 + h.len;
  for (int i = 0; i < f->ntensors; i++) total += f->tensors[i].nbytes;
  char *out = malloc(total), *p = out + 8;
  must(out != NULL, "oom");
  for (int i = 0; i < 8; i++) out[i] = (char)((uint64_t)h.len >> (8 * i));
  memcpy(p, h.p, h.len);
  p += h.len;
  for (int i = 0; i < f->ntensors; i++) {
    if (f->tensors[i].nbytes) memcpy(p, f->tensors[i].data, f->tensors[i].nbytes);
    p += f->tensors[i].nbytes;
  }
  free(h.p);
  free(kv);
  free(list);
  *len = total;
  return out;
}

static void same(const struct gw_st_file *a, const struct gw_st_file *b) {
  must(a->ntensors == b->ntensors && a->nmeta == b->nmeta, "rewrite changed the counts");
  for (int i = 0; i < a->ntensors; i++) {
    const struct gw_st_tensor *x = &a->tensors[i], *y = gw_st_find(b, x->name);
    must(y && x->dtype_name == y->dtype_name && x->ndim == y->ndim && x->nbytes == y->nbytes,
         "rewrite changed a tensor");
    must(memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof x->shape[0]) == 0, "rewrite changed a shape");
    must(x->nbytes == 0 || memcmp(x->data, y->data, x->nbytes) == 0, "rewrite changed data");
  }
  for (int i = 0; i < a->nmeta; i++)
    must(strcmp(a->meta[2 * i + 1], gw_st_metadata(b, a->meta[2 * i])) == 0, "rewrite changed metadata");
}

static void one(const uint8_t *data, size_t len) {
  struct gw_st_file *f = NULL, *g = NULL;
  if (gw_st_parse(&f, data, len, "<fuzz>") != GW_SUCCESS) {
    must(f == NULL && fuzz_error[0] != 0, "a failure without a message");
    return;
  }
  volatile unsigned sink = touch(f);
  (void)sink;
  size_t rlen;
  char *r = rewrite(f, &rlen);
  must(gw_st_parse(&g, r, rlen, "<rewrite>") == GW_SUCCESS, "the writer's output does not parse");
  same(f, g);
  gw_st_free(g);
  free(r);
  gw_st_free(f);
}

/* The header's vocabulary; a byte picks one (modulo the count). */
static const char *const tokens[] = {
    "{", "}", "[", "]", ":", ",", " ", "\"a\"", "\"b\"", "\"c\"", "\"__metadata__\"", "\"dtype\"",
    "\"shape\"", "\"data_offsets\"", "\"F32\"", "\"I64\"", "\"BOOL\"", "\"F16\"", "\"U8\"", "0", "1", "2",
    "3", "4", "8", "12", "16", "24", "-1", "1.5", "\"\\u00e9\\ud83d\\ude00\"", "\"\\\"\"", "true", "\"x",
    "18446744073709551615", "4294967296"};
#define NUM_TOKENS (sizeof tokens / sizeof tokens[0])

/* data[1..) as tokens, then tail bytes of data section. */
static void from_tokens(const uint8_t *data, size_t len, size_t tail) {
  struct sbuf h = {0};
  sb_put(&h, "\0\0\0\0\0\0\0\0", 8);
  for (size_t i = 1; i < len; i++) sb_str(&h, tokens[data[i] % NUM_TOKENS]);
  size_t n = h.len - 8;
  for (size_t i = 0; i < tail; i++) sb_put(&h, "\x5a", 1);
  must(!h.oom, "oom");
  for (int i = 0; i < 8; i++) h.p[i] = (char)((uint64_t)n >> (8 * i));
  one((const uint8_t *)h.p, h.len);
  free(h.p);
}

/* data[1..) behind a length that leaves tail bytes of data section. */
static void behind_length(const uint8_t *data, size_t len, size_t tail) {
  if (tail > len - 1) tail = len - 1;
  size_t n = len - 1 - tail;
  uint8_t *buf = malloc(8 + len - 1);
  must(buf != NULL, "oom");
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
  memcpy(buf + 8, data + 1, len - 1);
  one(buf, 8 + len - 1);
  free(buf);
}

/* One tensor object of a generated header: name, dtype, shape from a 6-byte
 * record r (name, dtype, ndim, three dims), range [b, e); returns its size. */
static uint64_t record(struct sbuf *h, const uint8_t *r, int first, uint64_t b, int skew) {
  const struct gw__st_dtype *dt = &dtypes[r[1] % NUM_DTYPE_INFO];
  char s[256];
  int k = snprintf(s, sizeof s, "%s\"t%c\":{\"dtype\":\"%s\",\"shape\":[", first ? "" : ",", 'a' + r[0] % 16, dt->name);
  uint64_t bytes = dt->size;
  for (int d = 0; d < r[2] % 4; d++) {
    bytes *= r[3 + d] % 5u;
    k += snprintf(s + k, sizeof s - (size_t)k, "%s%u", d ? "," : "", r[3 + d] % 5u);
  }
  uint64_t e = b + bytes;
  if (skew == 4) b++, e++;          /* a hole before, an overlap after, or past the end */
  if (skew == 5 && e > b) e--;      /* the size no longer matches the shape */
  snprintf(s + k, sizeof s - (size_t)k, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)b,
           (unsigned long long)e);
  sb_str(h, s);
  return bytes;
}

/* Well-formed tensors (and metadata) from 6-byte records, laid end to end, with at
 * most one thing knocked off by one (p % 8: 4, 5 one record's range, 6, 7 the data
 * length), so the range and tiling checks see near misses as well as hits. */
static void from_records(const uint8_t *data, size_t len, int p) {
  int nrec = (int)((len - 1) / 6 < 64 ? (len - 1) / 6 : 64), victim = nrec ? p / 8 % nrec : -1;
  struct sbuf h = {0};
  sb_put(&h, "\0\0\0\0\0\0\0\0{", 9);
  int first = 1;
  for (int i = 0; i < nrec; i++) { /* records whose name byte is >= 0xe0 are metadata */
    const uint8_t *r = data + 1 + 6 * i;
    char s[64];
    if (r[0] < 0xe0) continue;
    snprintf(s, sizeof s, "%s\"k%c\":\"v\\u%02x%02x\"", first ? "\"__metadata__\":{" : ",", 'a' + r[1] % 4, r[2], r[3]);
    sb_str(&h, s);
    first = 0;
  }
  if (!first) sb_str(&h, "}");
  uint64_t at = 0;
  for (int i = 0; i < nrec; i++) {
    if (data[1 + 6 * i] >= 0xe0) continue;
    at += record(&h, data + 1 + 6 * i, first, at, i == victim ? p % 8 : 0);
    first = 0;
  }
  sb_str(&h, "}");
  size_t n = h.len - 8, dlen = (size_t)at + (p % 8 == 6) - (p % 8 == 7 && at > 0);
  for (size_t i = 0; i < dlen; i++) sb_put(&h, (const char *)&(uint8_t){(uint8_t)(i * 7)}, 1);
  must(!h.oom, "oom");
  for (int i = 0; i < 8; i++) h.p[i] = (char)((uint64_t)n >> (8 * i));
  one((const uint8_t *)h.p, h.len);
  free(h.p);
}

/* The first byte picks one reading per input (so coverage gained by one reading
 * is kept as that reading's): its low 2 bits the mode, the rest the data tail. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  fuzz_error[0] = 0;
  int mode = len ? data[0] & 3 : 0;
  size_t tail = len ? data[0] >> 2 : 0;
  if (mode == 0) one(data, len);
  else if (mode == 1) behind_length(data, len, tail);
  else if (mode == 2) from_tokens(data, len, tail % 16 * 4);
  else from_records(data, len, (int)tail);
  return 0;
}
