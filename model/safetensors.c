/* safetensors.c - the safetensors reader and writer of safetensors.h.
 *
 * The reader parses the header with a small strict JSON parser that follows the
 * header's schema (an object of tensor objects plus one object of strings), so it
 * never needs to skip an arbitrary value and nests at most two objects deep
 * whatever the input: a key it does not know is an error, not something to step
 * over.  Decoded strings go into one arena as
 * large as the header, which is enough because a decoded string plus its NUL is
 * never longer than its quoted form.  Every range is checked against the buffer
 * before anything points into it.
 *
 * The writer builds the header in memory, then writes the file atomically (a
 * temporary file next to the target, fsync, rename, fsync of the directory), so a
 * crash or an error never leaves a half-written weights file under the real name.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data are little-endian and this file does not byte-swap"
#endif

/* Names are printed up to this many bytes, so a huge name cannot push the rest of
 * a message out of gw_model_last_error()'s buffer. */
#define NAME_SHOWN 160

/* ---- dtypes ----------------------------------------------------------------- */

struct dtype_info {
  const char *name;
  size_t size;
  gw_dtype_t gw; /* GW_NUM_DTYPES: none */
};

/* Every fixed-size dtype of the format (sub-byte ones such as F4 are not accepted). */
static const struct dtype_info dtypes[] = {
    {"F32", 4, GW_FLOAT32},    {"F16", 2, GW_FLOAT16},     {"BF16", 2, GW_BFLOAT16},
    {"F64", 8, GW_FLOAT64},    {"I64", 8, GW_INT64},       {"I32", 4, GW_INT32},
    {"I8", 1, GW_INT8},        {"U8", 1, GW_UINT8},        {"I16", 2, GW_NUM_DTYPES},
    {"U16", 2, GW_NUM_DTYPES}, {"U32", 4, GW_NUM_DTYPES},  {"U64", 8, GW_NUM_DTYPES},
    {"BOOL", 1, GW_NUM_DTYPES}, {"F8_E4M3", 1, GW_NUM_DTYPES}, {"F8_E5M2", 1, GW_NUM_DTYPES},
};
#define NUM_DTYPE_INFO (sizeof dtypes / sizeof dtypes[0])

static const struct dtype_info *dtype_by_name(const char *name) {
  for (size_t i = 0; name && i < NUM_DTYPE_INFO; i++)
    if (strcmp(dtypes[i].name, name) == 0) return &dtypes[i];
  return NULL;
}

static const struct dtype_info *dtype_by_gw(gw_dtype_t dtype) {
  for (size_t i = 0; i < NUM_DTYPE_INFO; i++)
    if (dtypes[i].gw == dtype && dtype != GW_NUM_DTYPES) return &dtypes[i];
  return NULL;
}

const char *gw_st_dtype_name(gw_dtype_t dtype) {
  const struct dtype_info *d = dtype_by_gw(dtype);
  return d ? d->name : NULL;
}

size_t gw_st_dtype_size(gw_dtype_t dtype) {
  const struct dtype_info *d = dtype_by_gw(dtype);
  return d ? d->size : 0;
}

/* The writer's view: the gradwire dtype, or the name when there is none. */
static const struct dtype_info *dtype_of(const struct gw_st_tensor *t) {
  return t->dtype == GW_NUM_DTYPES ? dtype_by_name(t->dtype_name) : dtype_by_gw(t->dtype);
}

/* product(shape) x elem into *bytes; -1 for a negative entry, -2 on overflow (as
 * the reference implementation, an overflow is an error even if a later dim is 0). */
static int shape_bytes(const int64_t *shape, int ndim, size_t elem, size_t *bytes) {
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
static const char *sort_names(const struct gw_st_tensor **by, int n) {
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
static const char *sort_pairs(const char **kv, int n) {
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

/* What a message is about: the file and, when there is one, the tensor. */
struct where {
  const char *label;
  const char *tensor;
};

struct jp {
  struct where at;             /* the file; the tensor being read (NULL: none / metadata) */
  const char *start, *p, *end; /* the header text */
  const char *data;            /* the data section, data_len bytes */
  size_t data_len;
  char *arena;                 /* decoded strings (f->strings) */
  size_t used;
  struct gw_st_file *f;
  int cap_tensors, cap_meta, seen_meta;
};

__attribute__((format(printf, 2, 3))) static gw_result_t bad(const struct where *w, const char *fmt, ...) {
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
  return bad(&j->at, "header is not valid JSON at header byte %zu: %s", (size_t)(j->p - j->start), what);
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

static int hex4(const char *p, const char *end, unsigned *v) {
  if (end - p < 4) return -1;
  *v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                 : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                 : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
    if (d == 16) return -1;
    *v = *v << 4 | d;
  }
  return 0;
}

static char *put_utf8(char *d, unsigned cp) {
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

/* \uXXXX (j->p at the 'u'), a surrogate pair as one code point; \u0000 is refused
 * because names and values are C strings. */
static gw_result_t unicode_escape(struct jp *j, char **d) {
  unsigned cp, lo;
  if (hex4(j->p + 1, j->end, &cp) != 0) return bad_json(j, "\\u needs four hex digits");
  j->p += 5;
  if (cp >= 0xdc00 && cp <= 0xdfff) return bad_json(j, "lone low surrogate");
  if (cp >= 0xd800 && cp <= 0xdbff) {
    if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || hex4(j->p + 2, j->end, &lo) != 0 ||
        lo < 0xdc00 || lo > 0xdfff)
      return bad_json(j, "high surrogate without a low one");
    j->p += 6;
    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
  }
  if (cp == 0) return bad_json(j, "\\u0000 in a string");
  *d = put_utf8(*d, cp);
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
  if (c == '-') return bad(&j->at, "%s is negative", what);
  if (c < '0' || c > '9') return bad_json(j, "expected a number");
  if (c == '0' && j->end - j->p > 1 && j->p[1] >= '0' && j->p[1] <= '9') return bad_json(j, "leading zero");
  int over = 0;
  for (*v = 0; j->p < j->end && *j->p >= '0' && *j->p <= '9'; j->p++) {
    unsigned dgt = (unsigned)(*j->p - '0');
    over |= *v > (UINT64_MAX - dgt) / 10;
    *v = *v * 10 + dgt;
  }
  if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')) return bad(&j->at, "%s is not an integer", what);
  if (over) return bad(&j->at, "%s does not fit in 64 bits", what);
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
    if (*n == max) return bad(&j->at, "more than %d entries in %s", max, what);
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
  if (peek(j) != '"') return bad(&j->at, "__metadata__ \"%.*s\": values must be strings", NAME_SHOWN, key);
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
  const struct dtype_info *dt;
  uint64_t off[2];
  unsigned seen; /* bits: 1 dtype, 2 shape, 4 data_offsets */
};

static gw_result_t tensor_member(struct jp *j, const char *key, void *vctx) {
  struct tensor_ctx *c = vctx;
  unsigned bit = strcmp(key, "dtype") == 0 ? 1u : strcmp(key, "shape") == 0 ? 2u
               : strcmp(key, "data_offsets") == 0 ? 4u : 0u;
  if (!bit) return bad(&j->at, "unknown key \"%.*s\" (expected dtype, shape, data_offsets)", NAME_SHOWN, key);
  if (c->seen & bit) return bad(&j->at, "key \"%s\" appears twice", key);
  c->seen |= bit;
  if (bit == 1) {
    const char *name;
    GW_MODEL_TRY(parse_string(j, &name));
    if (!(c->dt = dtype_by_name(name))) return bad(&j->at, "unknown dtype \"%.*s\"", NAME_SHOWN, name);
    return GW_SUCCESS;
  }
  if (bit == 4) {
    int n;
    GW_MODEL_TRY(parse_uint_array(j, c->off, 2, &n, "data_offsets"));
    return n == 2 ? GW_SUCCESS : bad(&j->at, "data_offsets has %d entries, not 2", n);
  }
  uint64_t dims[GW_ST_MAX_NDIM];
  GW_MODEL_TRY(parse_uint_array(j, dims, GW_ST_MAX_NDIM, &c->t->ndim, "shape"));
  for (int i = 0; i < c->t->ndim; i++) {
    if (dims[i] > INT64_MAX) return bad(&j->at, "shape entry %d is too large", i);
    c->t->shape[i] = (int64_t)dims[i];
  }
  return GW_SUCCESS;
}

/* A finished tensor object: every key given, the range inside the data section,
 * and its length what the shape and dtype say. */
static gw_result_t check_tensor(struct jp *j, struct tensor_ctx *c) {
  static const char *const keys[] = {"dtype", "shape", "data_offsets"};
  for (int i = 0; i < 3; i++)
    if (!(c->seen & 1u << i)) return bad(&j->at, "no \"%s\"", keys[i]);
  struct gw_st_tensor *t = c->t;
  uint64_t b = c->off[0], e = c->off[1];
  if (b > e)
    return bad(&j->at, "data_offsets [%llu, %llu]: begin after end", (unsigned long long)b, (unsigned long long)e);
  if (e > j->data_len)
    return bad(&j->at, "data_offsets [%llu, %llu] end past the data section (%zu bytes; truncated file?)",
               (unsigned long long)b, (unsigned long long)e, j->data_len);
  char shape[GW_ST_SHAPE_TEXT];
  gw_st_format_shape(shape, sizeof shape, t->shape, t->ndim);
  if (shape_bytes(t->shape, t->ndim, c->dt->size, &t->nbytes) != 0)
    return bad(&j->at, "shape %s of %s overflows", shape, c->dt->name);
  if (t->nbytes != e - b)
    return bad(&j->at, "shape %s of %s is %zu bytes but data_offsets [%llu, %llu] hold %llu", shape, c->dt->name,
               t->nbytes, (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b));
  t->dtype = c->dt->gw;
  t->dtype_name = c->dt->name;
  t->data = j->data + b;
  return GW_SUCCESS;
}

static gw_result_t top_member(struct jp *j, const char *key, void *ctx) {
  (void)ctx;
  struct gw_st_file *f = j->f;
  j->at.tensor = NULL;
  if (strcmp(key, "__metadata__") == 0) {
    if (j->seen_meta++) return bad(&j->at, "__metadata__ appears twice");
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

static size_t data_off(const struct jp *j, const struct gw_st_tensor *t) {
  return (size_t)((const char *)t->data - j->data);
}

static int cmp_range(const void *a, const void *b) {
  const struct gw_st_tensor *x = *(const struct gw_st_tensor *const *)a, *y = *(const struct gw_st_tensor *const *)b;
  if (x->data != y->data) return (const char *)x->data < (const char *)y->data ? -1 : 1;
  return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* The format requires the tensors to tile the data section: no overlap (two
 * tensors aliasing bytes) and no hole (bytes no tensor accounts for). */
static gw_result_t check_tiling(struct jp *j, const struct gw_st_tensor **by, int n) {
  if (n > 1) qsort(by, (size_t)n, sizeof *by, cmp_range);
  size_t at = 0;
  const struct gw_st_tensor *prev = NULL;
  for (int i = 0; i < n; i++) {
    size_t b = data_off(j, by[i]);
    j->at.tensor = by[i]->name;
    if (b < at)
      return bad(&j->at, "data_offsets [%zu, %zu] overlap tensor \"%.*s\" [%zu, %zu]", b, b + by[i]->nbytes, NAME_SHOWN,
                 prev->name, data_off(j, prev), at);
    if (b > at) return bad(&j->at, "data bytes [%zu, %zu) before it belong to no tensor", at, b);
    at = b + by[i]->nbytes;
    prev = by[i];
  }
  j->at.tensor = prev ? prev->name : NULL;
  if (at != j->data_len) return bad(&j->at, "data bytes [%zu, %zu) at the end belong to no tensor", at, j->data_len);
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
  const char *dup = sort_names(f->by_name, f->ntensors);
  const char *dup_key = sort_pairs(f->meta, f->nmeta);
  gw_result_t r;
  if (dup_key)
    r = bad(&j->at, "__metadata__ key \"%.*s\" appears twice", NAME_SHOWN, dup_key);
  else if (dup)
    r = bad(&(struct where){j->at.label, dup}, "appears twice");
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
 * may be filled in afterwards. */
static gw_result_t parse_at(struct gw_st_file **out, const char *h, size_t hlen, size_t data_len, const char *label) {
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
  *out = f;
  return GW_SUCCESS;
}

gw_result_t gw_st_parse(struct gw_st_file **out, const void *buf, size_t len, const char *label) {
  *out = NULL;
  if (!label) label = "<buffer>";
  if (!buf && len) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: NULL buffer", label);
  size_t hlen = 0;
  GW_MODEL_TRY(check_prefix(buf, len, label, &hlen));
  return parse_at(out, (const char *)buf + 8, hlen, len - 8 - hlen, label);
}

/* ---- files ------------------------------------------------------------------ */

static gw_result_t sys_fail(const char *path, const char *what) {
  return gw__model_fail(GW_ERR_SYSTEM, "%s: %s: %s", path, what, strerror(errno));
}

static const char *file_kind(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
       : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "an unknown kind";
}

/* path opened for reading, and its size.  Opened with O_NONBLOCK so that a FIFO
 * without a writer cannot hang the open() itself (the kind is only known once
 * it is open); anything but a regular file is then refused, and the flag cleared. */
static gw_result_t open_regular(const char *path, int *fd, size_t *size) {
  *fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (*fd < 0) return sys_fail(path, "cannot open");
  struct stat st;
  gw_result_t r = GW_SUCCESS;
  int fl;
  if (fstat(*fd, &st) != 0)
    r = sys_fail(path, "cannot stat");
  else if (!S_ISREG(st.st_mode))
    r = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
  else if ((fl = fcntl(*fd, F_GETFL)) < 0 || fcntl(*fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
    r = sys_fail(path, "cannot clear O_NONBLOCK");
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
    if (k < 0) return sys_fail(path, "read failed");
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
gw_result_t gw_st_open(struct gw_st_file **out, const char *path) {
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
  if (r == GW_SUCCESS) r = parse_at(out, b + 8, hlen, size - 8 - hlen, path);
  gw_st_free(*out); /* a check only: parsed again below, in the buffer the data goes to */
  *out = NULL;
  if (r == GW_SUCCESS) {
    if ((whole = realloc(b, size)))
      b = whole;
    else
      r = gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory for its %zu bytes", path, size);
  }
  if (r == GW_SUCCESS) r = read_exact(fd, path, b + 8 + hlen, size - 8 - hlen, 8 + hlen);
  if (r == GW_SUCCESS) r = parse_at(out, b + 8, hlen, size - 8 - hlen, path);
  close(fd);
  if (r != GW_SUCCESS) {
    free(b);
    return r;
  }
  (*out)->owned = b;
  return GW_SUCCESS;
}

/* ---- the writer --------------------------------------------------------------- */

/* A growing byte buffer; a failed allocation sticks in oom, checked once at the end. */
struct sbuf {
  char *p;
  size_t len, cap;
  int oom;
};

static void sb_put(struct sbuf *s, const char *x, size_t n) {
  if (s->oom) return;
  if (n > s->cap - s->len) {
    size_t ncap = s->cap ? s->cap : 256;
    while (ncap - s->len < n) ncap *= 2;
    char *q = realloc(s->p, ncap);
    if (!q) {
      s->oom = 1;
      return;
    }
    s->p = q, s->cap = ncap;
  }
  memcpy(s->p + s->len, x, n);
  s->len += n;
}

static void sb_str(struct sbuf *s, const char *x) { sb_put(s, x, strlen(x)); }

static void sb_u64(struct sbuf *s, uint64_t v) {
  char b[24];
  sb_put(s, b, (size_t)snprintf(b, sizeof b, "%llu", (unsigned long long)v));
}

/* A JSON string: quotes, backslashes and control bytes escaped, other bytes as is. */
static void sb_json(struct sbuf *s, const char *x) {
  sb_put(s, "\"", 1);
  for (; *x; x++) {
    unsigned char c = (unsigned char)*x;
    char e[8];
    if (c == '"' || c == '\\')
      sb_put(s, (char[]){'\\', (char)c}, 2);
    else if (c < 0x20)
      sb_put(s, e, (size_t)snprintf(e, sizeof e, "\\u%04x", c));
    else
      sb_put(s, x, 1);
  }
  sb_put(s, "\"", 1);
}

/* What the reader would refuse is refused here: a file we write always reads back. */
static gw_result_t check_for_write(const char *path, const struct gw_st_tensor *t, int n) {
  for (int i = 0; i < n; i++) {
    struct where w = {path, t[i].name};
    const struct dtype_info *dt = dtype_of(&t[i]);
    char shape[GW_ST_SHAPE_TEXT];
    size_t bytes = 0;
    if (!t[i].name || strcmp(t[i].name, "__metadata__") == 0)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: tensor %d: no name, or the reserved __metadata__", path, i);
    if (!dt) return bad(&w, "no safetensors dtype for dtype %d / \"%s\"", (int)t[i].dtype,
                        t[i].dtype_name ? t[i].dtype_name : "");
    if (t[i].ndim < 0 || t[i].ndim > GW_ST_MAX_NDIM) return bad(&w, "ndim %d is not 0..%d", t[i].ndim, GW_ST_MAX_NDIM);
    gw_st_format_shape(shape, sizeof shape, t[i].shape, t[i].ndim);
    if (shape_bytes(t[i].shape, t[i].ndim, dt->size, &bytes) != 0 || bytes != t[i].nbytes)
      return bad(&w, "nbytes %zu does not match shape %s of %s", t[i].nbytes, shape, dt->name);
    if (bytes && !t[i].data) return bad(&w, "no data");
  }
  const struct gw_st_tensor **by = malloc((n ? (size_t)n : 1) * sizeof *by);
  if (!by) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  for (int i = 0; i < n; i++) by[i] = &t[i];
  const char *dup = sort_names(by, n);
  gw_result_t r = dup ? bad(&(struct where){path, dup}, "appears twice") : GW_SUCCESS;
  free(by);
  return r;
}

/* metadata (key, value, ..., NULL) as sorted pairs in a malloc'd *kv. */
static gw_result_t collect_metadata(const char *path, const char *const *metadata, const char ***kv, int *nkv) {
  int n = 0;
  while (metadata && metadata[2 * n]) {
    if (!metadata[2 * n + 1])
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: __metadata__ key \"%s\" has no value", path,
                            metadata[2 * n]);
    n++;
  }
  *kv = malloc((n ? 2 * (size_t)n : 1) * sizeof **kv);
  if (!*kv) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  if (n) memcpy(*kv, metadata, 2 * (size_t)n * sizeof **kv);
  *nkv = n;
  const char *dup = sort_pairs(*kv, n);
  if (dup) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: __metadata__ key \"%s\" appears twice", path, dup);
  return GW_SUCCESS;
}

/* The header JSON, data_offsets packing the tensors in order, blank-padded to a
 * multiple of 8 bytes so the data section starts aligned (as the format's writers
 * do). */
static gw_result_t build_header(const char *path, struct sbuf *h, const struct gw_st_tensor *t, int n,
                                const char **kv, int nkv) {
  sb_str(h, "{");
  if (nkv) {
    sb_json(h, "__metadata__");
    for (int i = 0; i < nkv; i++) {
      sb_str(h, i ? "," : ":{");
      sb_json(h, kv[2 * i]);
      sb_str(h, ":");
      sb_json(h, kv[2 * i + 1]);
    }
    sb_str(h, "}");
  }
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    if (i || nkv) sb_str(h, ",");
    sb_json(h, t[i].name);
    sb_str(h, ":{\"dtype\":");
    sb_json(h, dtype_of(&t[i])->name);
    sb_str(h, ",\"shape\":[");
    for (int d = 0; d < t[i].ndim; d++) {
      if (d) sb_str(h, ",");
      sb_u64(h, (uint64_t)t[i].shape[d]);
    }
    sb_str(h, "],\"data_offsets\":[");
    sb_u64(h, off);
    sb_str(h, ",");
    sb_u64(h, off += t[i].nbytes);
    sb_str(h, "]}");
  }
  sb_str(h, "}");
  while (h->len % 8) sb_str(h, " ");
  if (h->oom) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory for the header", path);
  if (h->len > GW_ST_MAX_HEADER)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: a %zu-byte header is over the format's %u-byte limit", path,
                          h->len, GW_ST_MAX_HEADER);
  return GW_SUCCESS;
}

/* The test hook of safetensors.h: GW_SAFETENSORS_FAIL=step fails that step. */
static int fail_here(const char *step) {
  const char *e = getenv("GW_SAFETENSORS_FAIL");
  if (!e || strcmp(e, step) != 0) return 0;
  errno = EIO;
  return 1;
}

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  if (n && fail_here("write")) return -1;
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    p += k, n -= (size_t)k;
  }
  return 0;
}

static int write_contents(int fd, const struct sbuf *h, const struct gw_st_tensor *t, int n) {
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)h->len >> (8 * i));
  if (write_all(fd, len, 8) != 0 || write_all(fd, h->p, h->len) != 0) return -1;
  for (int i = 0; i < n; i++)
    if (write_all(fd, t[i].data, t[i].nbytes) != 0) return -1;
  return 0;
}

uint32_t gw_st_host_tag(void) {
  char id[512] = "";
  gethostname(id, 255);
  size_t n = strlen(id);
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t k = read(fd, id + n, sizeof id - n - 1);
    if (k > 0) n += (size_t)k;
    close(fd);
  }
  uint32_t h = 2166136261u; /* FNV-1a 32 */
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)id[i]) * 16777619u;
  return h;
}

/* path.tmp.<host tag>.<pid>.<k>: in path's directory (so rename is atomic), a name no other
 * writer of this process or another one uses (O_EXCL), created with 0666 so the
 * umask decides a new file's mode as it would for a plain open() (a file
 * replaced passes its own mode on: write_atomic).  Write
 * locked (an OFD lock, held until the rename) so a cleaner can tell a live
 * writer's temporary file from a dead one's: pids are reused, a container's
 * restarted writer often has its predecessor's. */
static int create_temp(const char *path, char **tmp) {
  static _Atomic unsigned counter;
  size_t cap = strlen(path) + 48;
  char *name = malloc(cap);
  if (!name) return errno = ENOMEM, -1;
  for (int tries = 0; tries < 64; tries++) {
    snprintf(name, cap, "%s.tmp.%08x.%ld.%u", path, gw_st_host_tag(), (long)getpid(), atomic_fetch_add(&counter, 1));
    int fd = fail_here("create") ? -1 : open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
      (void)fcntl(fd, F_OFD_SETLK, &fl); /* a file system without locks: the cleaner falls back to the pid */
      return *tmp = name, fd;
    }
    if (errno != EEXIST) break;
  }
  int e = errno;
  free(name);
  errno = e;
  return -1;
}

/* After the rename: the directory entry itself must reach the disk.  A file
 * system that cannot fsync a directory (EINVAL, ENOTSUP, EROFS: some network
 * and overlay mounts) gets a warning, once: the file is complete and in place,
 * and failing the save there ended runs at their first checkpoint. */
static gw_result_t sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  gw_result_t r = GW_SUCCESS;
  int bad = fd < 0 ? errno : fail_here("dirsync-eio") ? EIO : fail_here("dirsync") ? EINVAL : fsync(fd) ? errno : 0;
  if (fd >= 0 && (bad == EINVAL || bad == ENOTSUP || bad == EROFS)) {
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1))
      fprintf(stderr, "gradwire: warning: %s: written, but its directory cannot be synced here (%s): the new name "
              "may not survive a power loss on this file system\n", path, strerror(bad));
  } else if (bad) {
    errno = bad;
    r = sys_fail(path, "written, but syncing its directory failed");
  }
  if (fd >= 0) close(fd);
  free(dir);
  return r;
}

/* Where a save of path goes, into *real (malloc'd): path itself or, when path is
 * a symbolic link, the file it names, so that the link stays a link (as a plain
 * open() and write through it would leave it) with the temporary file, the
 * rename and the directory sync beside the real file.  *mode: the permission
 * bits of the file replaced, or -1 where there is none.  A link to nothing is
 * refused: following it would create a file wherever it points (the mount
 * point of an unmounted volume, say), which is more likely a mistake; so is
 * anything but a regular file (a link to /dev/null, followed, and the rename
 * would replace the device node as root). */
static gw_result_t resolve_target(const char *path, char **real, int *mode) {
  struct stat st;
  *real = NULL, *mode = -1;
  int exists = lstat(path, &st) == 0;
  if (exists && S_ISLNK(st.st_mode)) {
    if (!(*real = realpath(path, NULL))) {
      if (errno != ENOENT) return sys_fail(path, "cannot follow the symbolic link");
      char to[4096];
      ssize_t k = readlink(path, to, sizeof to - 1);
      to[k > 0 ? k : 0] = 0;
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: a symbolic link to \"%s\", which does not exist: not "
                            "saved (create the file it names, or remove the link)", path, to);
    }
    if (stat(*real, &st) != 0) return sys_fail(*real, "cannot stat the file its symbolic link names");
  } else if (!(*real = strdup(path))) {
    return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  }
  if (exists && !S_ISREG(st.st_mode)) { /* renamed over, a device node (as root) or a FIFO would be gone */
    gw_result_t r = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: not a regular file (%s): not replaced", *real,
                                   file_kind(st.st_mode));
    free(*real);
    *real = NULL;
    return r;
  }
  if (exists) *mode = (int)(st.st_mode & 07777);
  return GW_SUCCESS;
}

/* mode: the replaced file's permissions, given to the temporary file before any
 * data is in it (-1: a new file, the umask's). */
static gw_result_t write_atomic(const char *path, int mode, const struct sbuf *h, const struct gw_st_tensor *t, int n) {
  char *tmp = NULL;
  int fd = create_temp(path, &tmp);
  if (fd < 0) return sys_fail(path, "cannot create a temporary file next to it");
  gw_result_t r = GW_SUCCESS;
  if (mode >= 0 && (fail_here("chmod") || fchmod(fd, (mode_t)mode) != 0))
    r = sys_fail(path, "cannot give the temporary file the mode of the file it replaces");
  else if (write_contents(fd, h, t, n) != 0)
    r = sys_fail(path, "writing the temporary file failed");
  else if (fail_here("fsync") || fsync(fd) != 0)
    r = sys_fail(path, "fsync of the temporary file failed");
  /* Renamed while still open: the lock marks it live until it has its name.
   * A close that fails after that (fsync succeeded: the data is on disk) is
   * a warning: the file is complete and in place, and the old one is gone. */
  const int renamed = r == GW_SUCCESS && !fail_here("rename") && rename(tmp, path) == 0;
  if (r == GW_SUCCESS && !renamed) r = sys_fail(path, "cannot rename the temporary file over it");
  if (close(fd) != 0 && renamed)
    fprintf(stderr, "gradwire: warning: %s: written and renamed, but closing it failed: %s\n", path, strerror(errno));
  if (r != GW_SUCCESS) unlink(tmp);
  free(tmp);
  return r == GW_SUCCESS ? sync_dir(path) : r;
}

gw_result_t gw_st_write(const char *path, const struct gw_st_tensor *t, int n, const char *const *metadata) {
  if (!path || n < 0 || (n > 0 && !t))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "gw_st_write: no path, or no tensors for n = %d", n);
  const char **kv = NULL;
  char *real = NULL;
  int nkv = 0, mode = -1;
  struct sbuf h = {0};
  gw_result_t r = check_for_write(path, t, n);
  if (r == GW_SUCCESS) r = collect_metadata(path, metadata, &kv, &nkv);
  if (r == GW_SUCCESS) r = build_header(path, &h, t, n, kv, nkv);
  if (r == GW_SUCCESS) r = resolve_target(path, &real, &mode);
  if (r == GW_SUCCESS) r = write_atomic(real, mode, &h, t, n);
  free(real);
  free(kv);
  free(h.p);
  return r;
}
