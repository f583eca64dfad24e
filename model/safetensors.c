/* safetensors.c - the safetensors reader of safetensors.h, and what the
 * writer (safetensors_write.c) shares with it: dtypes, shapes, sorting.
 *
 * The reader parses the header with a small strict JSON parser that follows the
 * header's schema (an object of tensor objects plus one object of strings), so it
 * never needs to skip an arbitrary value and nests at most two objects deep
 * whatever the input: a key it does not know is an error, not something to step
 * over.  Decoded strings go into one arena as
 * large as the header, which is enough because a decoded string plus its NUL is
 * never longer than its quoted form.  Every range is checked against the buffer
 * before anything points into it.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_internal.h"
#include "safetensors_internal.h"
#include "utf8.h" /* comm/: \uXXXX and UTF-8, shared with gw-run */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data are little-endian and this file does not byte-swap"
#endif

/* ---- dtypes ----------------------------------------------------------------- */

/* Every fixed-size dtype of the format (sub-byte ones such as F4 are not accepted). */
static const struct gw__st_dtype dtypes[] = {
    {"F32", 4, GW_FLOAT32},    {"F16", 2, GW_FLOAT16},     {"BF16", 2, GW_BFLOAT16},
    {"F64", 8, GW_FLOAT64},    {"I64", 8, GW_INT64},       {"I32", 4, GW_INT32},
    {"I8", 1, GW_INT8},        {"U8", 1, GW_UINT8},        {"I16", 2, GW_NUM_DTYPES},
    {"U16", 2, GW_NUM_DTYPES}, {"U32", 4, GW_NUM_DTYPES},  {"U64", 8, GW_NUM_DTYPES},
    {"BOOL", 1, GW_NUM_DTYPES}, {"F8_E4M3", 1, GW_NUM_DTYPES}, {"F8_E5M2", 1, GW_NUM_DTYPES},
};
#define NUM_DTYPE_INFO (sizeof dtypes / sizeof dtypes[0])

static const struct gw__st_dtype *dtype_by_name(const char *name) {
  for (size_t i = 0; name && i < NUM_DTYPE_INFO; i++)
    if (strcmp(dtypes[i].name, name) == 0) return &dtypes[i];
  return NULL;
}

static const struct gw__st_dtype *dtype_by_gw(gw_dtype_t dtype) {
  for (size_t i = 0; i < NUM_DTYPE_INFO; i++)
    if (dtypes[i].gw == dtype && dtype != GW_NUM_DTYPES) return &dtypes[i];
  return NULL;
}

const char *gw_st_dtype_name(gw_dtype_t dtype) {
  const struct gw__st_dtype *d = dtype_by_gw(dtype);
  return d ? d->name : NULL;
}

size_t gw_st_dtype_size(gw_dtype_t dtype) {
  const struct gw__st_dtype *d = dtype_by_gw(dtype);
  return d ? d->size : 0;
}

/* The writer's view: the gradwire dtype, or the name when there is none. */
const struct gw__st_dtype *gw__st_dtype_of(const struct gw_st_tensor *t) {
  return t->dtype == GW_NUM_DTYPES ? dtype_by_name(t->dtype_name) : dtype_by_gw(t->dtype);
}

/* product(shape) x elem into *bytes; -1 for a negative entry, -2 on overflow (as
 * the reference implementation, an overflow is an error even if a later dim is 0). */
int gw__st_shape_bytes(const int64_t *shape, int ndim, size_t elem, size_t *bytes) {
  size_t n = elem;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] != 0 && n > SIZE_MAX / (uint64_t)shape[i]) return -2;
    n *= (size_t)shape[i];
  }
  *bytes = n;
  return 0;
}

void gw_st_format_shape(char *buf, size_t cap, const int64_t *shape, int ndim) {
  size_t used = 0;
  for (int i = 0; i <= ndim && used < cap; i++) {
    const char *sep = i == 0 ? "[" : ", ";
    int w = i < ndim ? snprintf(buf + used, cap - used, "%s%lld", sep, (long long)shape[i])
                     : snprintf(buf + used, cap - used, "%s]", ndim == 0 ? "[" : "");
    if (w < 0) return;
    used += (size_t)w;
  }
}

/* ---- lookups ------------------------------------------------------------------ */

static int cmp_tensor_name(const void *a, const void *b) {
  const struct gw_st_tensor *const *x = a, *const *y = b;
  return strcmp((*x)->name, (*y)->name);
}

/* Sorts by[0..n) by name; returns the first of two equal names, or NULL. */
const char *gw__st_sort_names(const struct gw_st_tensor **by, int n) {
  if (n > 1) qsort(by, (size_t)n, sizeof *by, cmp_tensor_name);
  for (int i = 1; i < n; i++)
    if (strcmp(by[i - 1]->name, by[i]->name) == 0) return by[i]->name;
  return NULL;
}

static int cmp_key(const void *a, const void *b) {
  const char *const *x = a, *const *y = b;
  return strcmp(x[0], y[0]);
}

/* Sorts (key, value) pairs by key; returns the first repeated key, or NULL. */
const char *gw__st_sort_pairs(const char **kv, int n) {
  if (n > 1) qsort(kv, (size_t)n, 2 * sizeof *kv, cmp_key);
  for (int i = 1; i < n; i++)
    if (strcmp(kv[2 * i - 2], kv[2 * i]) == 0) return kv[2 * i];
  return NULL;
}

const struct gw_st_tensor *gw_st_find(const struct gw_st_file *f, const char *name) {
  if (!f || !name || f->ntensors == 0) return NULL;
  struct gw_st_tensor key = {.name = name};
  const struct gw_st_tensor *pk = &key;
  const struct gw_st_tensor *const *hit =
      bsearch(&pk, f->by_name, (size_t)f->ntensors, sizeof *f->by_name, cmp_tensor_name);
  return hit ? *hit : NULL;
}

const char *gw_st_metadata(const struct gw_st_file *f, const char *key) {
  if (!f || !key || f->nmeta == 0) return NULL;
  const char *k[2] = {key, NULL};
  const char **hit = bsearch(k, f->meta, (size_t)f->nmeta, 2 * sizeof *f->meta, cmp_key);
  return hit ? hit[1] : NULL;
}

void gw_st_free(struct gw_st_file *f) {
  if (!f) return;
  free(f->tensors);
  free(f->meta);
  free(f->by_name);
  free(f->strings);
  free(f->owned);
  free(f);
}

/* ---- the header parser -------------------------------------------------------- */

struct jp {
  struct gw__st_where at;             /* the file; the tensor being read (NULL: none / metadata) */
  const char *start, *p, *end; /* the header text */
  const char *data;            /* the data section, data_len bytes */
  size_t data_len;
  char *arena;                 /* decoded strings (f->strings) */
  size_t used;
  struct gw_st_file *f;
  int cap_tensors, cap_meta, seen_meta;
};

gw_result_t gw__st_bad(const struct gw__st_where *w, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (w->tensor)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: tensor \"%.*s\": %s", w->label, NAME_SHOWN, w->tensor,
                          what);
  return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: %s", w->label, what);
}

static gw_result_t bad_json(struct jp *j, const char *what) {
  return gw__st_bad(&j->at, "header is not valid JSON at header byte %zu: %s", (size_t)(j->p - j->start), what);
}

/* The next non-blank byte (not consumed), or -1 at the end. */
static int peek(struct jp *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
  return j->p < j->end ? (unsigned char)*j->p : -1;
}

static gw_result_t expect(struct jp *j, char c) {
  if (peek(j) != (unsigned char)c) {
    char what[32];
    snprintf(what, sizeof what, "expected '%c'", c);
    return bad_json(j, what);
  }
  j->p++;
  return GW_SUCCESS;
}

/* \uXXXX (j->p at the 'u'), a surrogate pair as one code point; \u0000 is refused
 * because names and values are C strings. */
static gw_result_t unicode_escape(struct jp *j, char **d) {
  unsigned cp, lo;
  if (gw__hex4(j->p + 1, j->end, &cp) != 0) return bad_json(j, "\\u needs four hex digits");
  j->p += 5;
  if (cp >= 0xdc00 && cp <= 0xdfff) return bad_json(j, "lone low surrogate");
  if (cp >= 0xd800 && cp <= 0xdbff) {
    if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || gw__hex4(j->p + 2, j->end, &lo) != 0 ||
        lo < 0xdc00 || lo > 0xdfff)
      return bad_json(j, "high surrogate without a low one");
    j->p += 6;
    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
  }
  if (cp == 0) return bad_json(j, "\\u0000 in a string");
  *d = gw__put_utf8(*d, cp);
  return GW_SUCCESS;
}

/* A JSON string, decoded into the arena.  UTF-8 is not validated (names are
 * compared as bytes). */
static gw_result_t parse_string(struct jp *j, const char **out) {
  GW_MODEL_TRY(expect(j, '"'));
  char *d = j->arena + j->used, *s = d;
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  while (j->p < j->end && *j->p != '"') {
    unsigned char c = (unsigned char)*j->p;
    if (c < 0x20) return bad_json(j, "control character in a string");
    if (c != '\\') {
      *d++ = (char)c, j->p++;
      continue;
    }
    if (j->end - j->p < 2) return bad_json(j, "unterminated string");
    const char *e = j->p[1] ? strchr(from, j->p[1]) : NULL;
    if (e) {
      *d++ = to[e - from], j->p += 2;
    } else if (j->p[1] == 'u') {
      j->p++;
      GW_MODEL_TRY(unicode_escape(j, &d));
    } else {
      return bad_json(j, "unknown escape");
    }
  }
  if (j->p >= j->end) return bad_json(j, "unterminated string");
  j->p++;
  *d++ = 0;
  j->used = (size_t)(d - j->arena);
  *out = s;
  return GW_SUCCESS;
}

/* A non-negative JSON integer; what names it in messages ("shape entry"). */
static gw_result_t parse_uint(struct jp *j, uint64_t *v, const char *what) {
  int c = peek(j);
  if (c == '-') return gw__st_bad(&j->at, "%s is negative", what);
  if (c < '0' || c > '9') return bad_json(j, "expected a number");
  if (c == '0' && j->end - j->p > 1 && j->p[1] >= '0' && j->p[1] <= '9') return bad_json(j, "leading zero");
  int over = 0;
  for (*v = 0; j->p < j->end && *j->p >= '0' && *j->p <= '9'; j->p++) {
    unsigned dgt = (unsigned)(*j->p - '0');
    over |= *v > (UINT64_MAX - dgt) / 10;
    *v = *v * 10 + dgt;
  }
  if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')) return gw__st_bad(&j->at, "%s is not an integer", what);
  if (over) return gw__st_bad(&j->at, "%s does not fit in 64 bits", what);
  return GW_SUCCESS;
}

/* [int, int, ...] with at most max entries. */
static gw_result_t parse_uint_array(struct jp *j, uint64_t *out, int max, int *n, const char *what) {
  char entry[32];
  snprintf(entry, sizeof entry, "%s entry", what);
  GW_MODEL_TRY(expect(j, '['));
  *n = 0;
  if (peek(j) == ']') return j->p++, GW_SUCCESS;
  for (;;) {
    if (*n == max) return gw__st_bad(&j->at, "more than %d entries in %s", max, what);
    GW_MODEL_TRY(parse_uint(j, &out[(*n)++], entry));
    int c = peek(j);
    if (c != ',' && c != ']') return bad_json(j, "expected ',' or ']'");
    j->p++;
    if (c == ']') return GW_SUCCESS;
  }
}

/* Calls fn(j, key, ctx) for every member of an object; fn reads the value. */
typedef gw_result_t (*member_fn)(struct jp *j, const char *key, void *ctx);

static gw_result_t parse_object(struct jp *j, member_fn fn, void *ctx) {
  GW_MODEL_TRY(expect(j, '{'));
  if (peek(j) == '}') return j->p++, GW_SUCCESS;
  for (;;) {
    const char *key;
    GW_MODEL_TRY(parse_string(j, &key));
    GW_MODEL_TRY(expect(j, ':'));
    GW_MODEL_TRY(fn(j, key, ctx));
    int c = peek(j);
    if (c != ',' && c != '}') return bad_json(j, "expected ',' or '}'");
    j->p++;
    if (c == '}') return GW_SUCCESS;
  }
}

/* Returns p, grown if needed so that index n fits, or NULL (p still valid). */
static void *grow(void *p, int n, int *cap, size_t elem) {
  if (n < *cap) return p;
  if (*cap > (1 << 28)) return NULL;
  int ncap = *cap ? *cap * 2 : 16;
  void *q = realloc(p, (size_t)ncap * elem);
  if (q) *cap = ncap;
  return q;
}

static gw_result_t no_memory(struct jp *j) {
  return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory reading the header", j->at.label);
}

static gw_result_t meta_member(struct jp *j, const char *key, void *ctx) {
  (void)ctx;
  if (peek(j) != '"') return gw__st_bad(&j->at, "__metadata__ \"%.*s\": values must be strings", NAME_SHOWN, key);
  struct gw_st_file *f = j->f;
  const char **meta = grow(f->meta, 2 * f->nmeta + 1, &j->cap_meta, sizeof *f->meta);
  if (!meta) return no_memory(j);
  f->meta = meta;
  f->meta[2 * f->nmeta] = key;
  GW_MODEL_TRY(parse_string(j, &f->meta[2 * f->nmeta + 1]));
  f->nmeta++;
  return GW_SUCCESS;
}

struct tensor_ctx {
  struct gw_st_tensor *t;
  const struct gw__st_dtype *dt;
  uint64_t off[2];
  unsigned seen; /* bits: 1 dtype, 2 shape, 4 data_offsets */
};

static gw_result_t tensor_member(struct jp *j, const char *key, void *vctx) {
  struct tensor_ctx *c = vctx;
  unsigned bit = strcmp(key, "dtype") == 0 ? 1u : strcmp(key, "shape") == 0 ? 2u
               : strcmp(key, "data_offsets") == 0 ? 4u : 0u;
  if (!bit) return gw__st_bad(&j->at, "unknown key \"%.*s\" (expected dtype, shape, data_offsets)", NAME_SHOWN, key);
  if (c->seen & bit) return gw__st_bad(&j->at, "key \"%s\" appears twice", key);
  c->seen |= bit;
  if (bit == 1) {
    const char *name;
    GW_MODEL_TRY(parse_string(j, &name));
    if (!(c->dt = dtype_by_name(name))) return gw__st_bad(&j->at, "unknown dtype \"%.*s\"", NAME_SHOWN, name);
    return GW_SUCCESS;
  }
  if (bit == 4) {
    int n;
    GW_MODEL_TRY(parse_uint_array(j, c->off, 2, &n, "data_offsets"));
    return n == 2 ? GW_SUCCESS : gw__st_bad(&j->at, "data_offsets has %d entries, not 2", n);
  }
  uint64_t dims[GW_ST_MAX_NDIM];
  GW_MODEL_TRY(parse_uint_array(j, dims, GW_ST_MAX_NDIM, &c->t->ndim, "shape"));
  for (int i = 0; i < c->t->ndim; i++) {
    if (dims[i] > INT64_MAX) return gw__st_bad(&j->at, "shape entry %d is too large", i);
    c->t->shape[i] = (int64_t)dims[i];
  }
  return GW_SUCCESS;
}

/* A finished tensor object: every key given, the range inside the data section,
 * and its length what the shape and dtype say. */
static gw_result_t check_tensor(struct jp *j, struct tensor_ctx *c) {
  static const char *const keys[] = {"dtype", "shape", "data_offsets"};
  for (int i = 0; i < 3; i++)
    if (!(c->seen & 1u << i)) return gw__st_bad(&j->at, "no \"%s\"", keys[i]);
  struct gw_st_tensor *t = c->t;
  uint64_t b = c->off[0], e = c->off[1];
  if (b > e)
    return gw__st_bad(&j->at, "data_offsets [%llu, %llu]: begin after end", (unsigned long long)b, (unsigned long long)e);
  if (e > j->data_len)
    return gw__st_bad(&j->at, "data_offsets [%llu, %llu] end past the data section (%zu bytes; truncated file?)",
               (unsigned long long)b, (unsigned long long)e, j->data_len);
  char shape[GW_ST_SHAPE_TEXT];
  gw_st_format_shape(shape, sizeof shape, t->shape, t->ndim);
  if (gw__st_shape_bytes(t->shape, t->ndim, c->dt->size, &t->nbytes) != 0)
    return gw__st_bad(&j->at, "shape %s of %s overflows", shape, c->dt->name);
  if (t->nbytes != e - b)
    return gw__st_bad(&j->at, "shape %s of %s is %zu bytes but data_offsets [%llu, %llu] hold %llu", shape, c->dt->name,
               t->nbytes, (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b));
  t->dtype = c->dt->gw;
  t->dtype_name = c->dt->name;
  /* the offset until the header is checked (parse_at points it into the
   * data then): the check-only parse of gw_st_open has no data section in
   * memory, and a pointer past its buffer is undefined even uncompared */
  t->data = (const void *)(uintptr_t)b;
  return GW_SUCCESS;
}

static gw_result_t top_member(struct jp *j, const char *key, void *ctx) {
  (void)ctx;
  struct gw_st_file *f = j->f;
  j->at.tensor = NULL;
  if (strcmp(key, "__metadata__") == 0) {
    if (j->seen_meta++) return gw__st_bad(&j->at, "__metadata__ appears twice");
    return parse_object(j, meta_member, NULL);
  }
  struct gw_st_tensor *ts = grow(f->tensors, f->ntensors, &j->cap_tensors, sizeof *f->tensors);
  if (!ts) return no_memory(j);
  f->tensors = ts;
  struct tensor_ctx c = {.t = &f->tensors[f->ntensors]};
  memset(c.t, 0, sizeof *c.t);
  c.t->name = j->at.tensor = key;
  GW_MODEL_TRY(parse_object(j, tensor_member, &c));
  GW_MODEL_TRY(check_tensor(j, &c));
  f->ntensors++;
  j->at.tensor = NULL;
  return GW_SUCCESS;
}

/* A tensor's offset in the data section, while parsing (check_tensor). */
static size_t data_off(const struct gw_st_tensor *t) { return (size_t)(uintptr_t)t->data; }

static int cmp_range(const void *a, const void *b) {
  const struct gw_st_tensor *x = *(const struct gw_st_tensor *const *)a, *y = *(const struct gw_st_tensor *const *)b;
  if (data_off(x) != data_off(y)) return data_off(x) < data_off(y) ? -1 : 1;
  return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* The format requires the tensors to tile the data section: no overlap (two
 * tensors aliasing bytes) and no hole (bytes no tensor accounts for). */
static gw_result_t check_tiling(struct jp *j, const struct gw_st_tensor **by, int n) {
  if (n > 1) qsort(by, (size_t)n, sizeof *by, cmp_range);
  size_t at = 0;
  const struct gw_st_tensor *prev = NULL;
  for (int i = 0; i < n; i++) {
    size_t b = data_off(by[i]);
    j->at.tensor = by[i]->name;
    if (b < at)
      return gw__st_bad(&j->at, "data_offsets [%zu, %zu] overlap tensor \"%.*s\" [%zu, %zu]", b, b + by[i]->nbytes, NAME_SHOWN,
                 prev->name, data_off(prev), at);
    if (b > at) return gw__st_bad(&j->at, "data bytes [%zu, %zu) before it belong to no tensor", at, b);
    at = b + by[i]->nbytes;
    prev = by[i];
  }
  j->at.tensor = prev ? prev->name : NULL;
  if (at != j->data_len) return gw__st_bad(&j->at, "data bytes [%zu, %zu) at the end belong to no tensor", at, j->data_len);
  return GW_SUCCESS;
}

/* The object, then nothing but the writer's padding blanks. */
static gw_result_t parse_header(struct jp *j) {
  GW_MODEL_TRY(parse_object(j, top_member, NULL));
  if (peek(j) != -1) return bad_json(j, "bytes after the header's object");
  return GW_SUCCESS;
}

/* Names unique, metadata keys unique, tensors tiling the data section. */
static gw_result_t check_whole(struct jp *j) {
  struct gw_st_file *f = j->f;
  size_t n = f->ntensors ? (size_t)f->ntensors : 1;
  const struct gw_st_tensor **by_range = malloc(n * sizeof *by_range);
  f->by_name = malloc(n * sizeof *f->by_name);
  if (!by_range || !f->by_name) {
    free(by_range);
    return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory checking the header", j->at.label);
  }
  for (int i = 0; i < f->ntensors; i++) f->by_name[i] = by_range[i] = &f->tensors[i];
  const char *dup = gw__st_sort_names(f->by_name, f->ntensors);
  const char *dup_key = gw__st_sort_pairs(f->meta, f->nmeta);
  gw_result_t r;
  if (dup_key)
    r = gw__st_bad(&j->at, "__metadata__ key \"%.*s\" appears twice", NAME_SHOWN, dup_key);
  else if (dup)
    r = gw__st_bad(&(struct gw__st_where){j->at.label, dup}, "appears twice");
  else
    r = check_tiling(j, by_range, f->ntensors);
  free(by_range);
  return r;
}

/* The 8-byte length and its bounds; *hlen is N. */
static gw_result_t check_prefix(const unsigned char *b, size_t len, const char *label, size_t *hlen) {
  if (len < 8)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: %zu bytes, shorter than the 8-byte header length (truncated?)",
                          label, len);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
  if (n > GW_ST_MAX_HEADER)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "%s: header length %llu is over the %u-byte limit (not a safetensors file?)", label,
                          (unsigned long long)n, GW_ST_MAX_HEADER);
  if (n > len - 8)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: header length %llu but only %zu bytes follow (truncated?)",
                          label, (unsigned long long)n, len - 8);
  *hlen = (size_t)n;
  return GW_SUCCESS;
}

/* Parses the header h[0..hlen) of a file whose data section, data_len bytes,
 * follows it in memory; the data section is not read (only pointed into), so it
 * may be filled in afterwards.  !with_data: the buffer ends with the header
 * (a check only): the tensors' data stay NULL. */
static gw_result_t parse_at(struct gw_st_file **out, const char *h, size_t hlen, size_t data_len, const char *label,
                            bool with_data) {
  struct gw_st_file *f = calloc(1, sizeof *f);
  char *arena = malloc(hlen + 1);
  if (!f || !arena) {
    free(f);
    free(arena);
    return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory for a %zu-byte header", label, hlen);
  }
  f->strings = arena;
  struct jp j = {.at = {label, NULL}, .start = h, .p = h, .end = h + hlen, .data = h + hlen,
                 .data_len = data_len, .arena = arena, .f = f};
  gw_result_t r = parse_header(&j);
  if (r == GW_SUCCESS) r = check_whole(&j);
  if (r != GW_SUCCESS) {
    gw_st_free(f);
    return r;
  }
  for (int i = 0; i < f->ntensors; i++) f->tensors[i].data = with_data ? j.data + data_off(&f->tensors[i]) : NULL;
  *out = f;
  return GW_SUCCESS;
}

gw_result_t gw_st_parse(struct gw_st_file **out, const void *buf, size_t len, const char *label) {
  *out = NULL;
  if (!label) label = "<buffer>";
  if (!buf && len) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: NULL buffer", label);
  size_t hlen = 0;
  GW_MODEL_TRY(check_prefix(buf, len, label, &hlen));
  return parse_at(out, (const char *)buf + 8, hlen, len - 8 - hlen, label, true);
}

/* ---- files ------------------------------------------------------------------ */

gw_result_t gw__st_sys_fail(const char *path, const char *what) {
  return gw__model_fail(GW_ERR_SYSTEM, "%s: %s: %s", path, what, strerror(errno));
}

const char *gw__st_file_kind(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
       : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "an unknown kind";
}

/* path opened for reading, and its size.  Opened with O_NONBLOCK so that a FIFO
 * without a writer cannot hang the open() itself (the kind is only known once
 * it is open); anything but a regular file is then refused, and the flag cleared. */
static gw_result_t open_regular(const char *path, int *fd, size_t *size) {
  *fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (*fd < 0) return gw__st_sys_fail(path, "cannot open");
  struct stat st;
  gw_result_t r = GW_SUCCESS;
  int fl;
  if (fstat(*fd, &st) != 0)
    r = gw__st_sys_fail(path, "cannot stat");
  else if (!S_ISREG(st.st_mode))
    r = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: not a regular file (%s)", path, gw__st_file_kind(st.st_mode));
  else if ((fl = fcntl(*fd, F_GETFL)) < 0 || fcntl(*fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
    r = gw__st_sys_fail(path, "cannot clear O_NONBLOCK");
  if (r != GW_SUCCESS) {
    close(*fd);
    *fd = -1;
    return r;
  }
  *size = (size_t)st.st_size;
  return GW_SUCCESS;
}

/* Bytes [off, off + n) of the file, all of them: fewer (the file shrank since
 * it was measured) is an error. */
static gw_result_t read_exact(int fd, const char *path, void *buf, size_t n, size_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, (char *)buf + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return gw__st_sys_fail(path, "read failed");
    if (k == 0)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: ends at byte %zu, before the %zu its size said (did it "
                            "shrink while being read?)", path, off + got, off + n);
    got += (size_t)k;
  }
  return GW_SUCCESS;
}

/* The prefix and the header are read and checked against the file's size
 * before the data is read or even has memory: a file that is not safetensors,
 * or whose header does not account for exactly the bytes after it, is refused
 * having read at most its header (it used to be read whole first: 315 MB and
 * 2.6 s for a wrong 300 MB file).  The header is then parsed a second time,
 * in the buffer that holds the whole file, for its tensors to point into. */
gw_result_t gw_st_open(struct gw_st_file **out, const char *path) { return gw_st_open_checked(out, path, NULL, NULL); }

gw_result_t gw_st_open_checked(struct gw_st_file **out, const char *path, gw_st_check_fn check, void *arg) {
  *out = NULL;
  int fd = -1;
  size_t size = 0, hlen = 0;
  GW_MODEL_TRY(open_regular(path, &fd, &size));
  unsigned char prefix[8];
  char *b = NULL, *whole;
  gw_result_t r = size >= 8 ? read_exact(fd, path, prefix, 8, 0) : GW_SUCCESS;
  if (r == GW_SUCCESS) r = check_prefix(prefix, size, path, &hlen);
  if (r == GW_SUCCESS && !(b = malloc(8 + hlen)))
    r = gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory for a %zu-byte header", path, hlen);
  if (r == GW_SUCCESS) {
    memcpy(b, prefix, 8);
    r = read_exact(fd, path, b + 8, hlen, 8);
  }
  if (r == GW_SUCCESS) r = parse_at(out, b + 8, hlen, size - 8 - hlen, path, false);
  if (r == GW_SUCCESS && check) r = check(*out, path, arg);
  gw_st_free(*out); /* a check only: parsed again below, in the buffer the data goes to */
  *out = NULL;
  if (r == GW_SUCCESS) {
    if ((whole = realloc(b, size)))
      b = whole;
    else
      r = gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory for its %zu bytes", path, size);
  }
  if (r == GW_SUCCESS) r = read_exact(fd, path, b + 8 + hlen, size - 8 - hlen, 8 + hlen);
  if (r == GW_SUCCESS) r = parse_at(out, b + 8, hlen, size - 8 - hlen, path, true);
  close(fd);
  if (r != GW_SUCCESS) {
    free(b);
    return r;
  }
  (*out)->owned = b;
  return GW_SUCCESS;
}
