/* test_safetensors.c - weights files (model/safetensors.h, gw_model_save_weights /
 * gw_model_load_weights of resnet.h): a model round trip bit for bit, a file
 * written byte for byte as known, a hand-made file parsed, every kind of corrupt
 * file refused with a message naming the tensor (a big wrong one without being
 * read, a FIFO without hanging), load_weights refusing mismatched files without
 * touching the model, the writer's atomicity under injected I/O failures
 * (GW_SAFETENSORS_FAIL), and a save through a symbolic link or over a file with
 * its own mode keeping both.  Everything runs on temporary files. */
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "resnet.h"
#include "safetensors.h"

/* ---- helpers ------------------------------------------------------------------ */

static char tmpdir[64];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/gw_st_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

/* Removes tmpdir and the plain files in it. */
static void remove_tmpdir(void) {
  DIR *d = opendir(tmpdir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(p);
  }
  closedir(d);
  rmdir(tmpdir);
}

static const char *in_tmp(const char *name) {
  static char p[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
  return p[k];
}

static int count_files(void) {
  DIR *d = opendir(tmpdir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d) closedir(d);
  return n;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  ck_assert_int_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

static struct gw_model *make(int depth, uint64_t seed) {
  struct gw_model_config cfg;
  gw_model_config_default(&cfg);
  cfg.depth = depth, cfg.classes = 10, cfg.image_size = 32, cfg.stem = GW_STEM_SMALL;
  cfg.width_divisor = 8, cfg.seed = seed;
  struct gw_model *m = NULL;
  ck_assert_msg(gw_model_init(&m, &cfg) == GW_SUCCESS, "%s", gw_model_last_error());
  return m;
}

/* Buffers that are not their reset values, so the round trip shows they travel. */
static void scramble_buffers(struct gw_model *m, uint64_t seed) {
  for (int i = 0; i < gw_model_num_buffer_tensors(m); i++) {
    const struct gw_tensor *t = gw_model_buffer_tensor(m, i);
    void *d = gw_model_tensor_data(m, t);
    for (size_t k = 0; k < t->numel; k++) {
      uint64_t r = mix64(seed ^ (uint64_t)i << 32 ^ k);
      if (t->dtype == GW_INT64) ((int64_t *)d)[k] = (int64_t)(r >> 40);
      else ((float *)d)[k] = (float)(r >> 40) / (float)(1 << 20);
    }
  }
}

/* Every value of the model, for "bit for bit" and "untouched" checks. */
struct snapshot {
  float *params, *running;
  int64_t *counters;
  size_t np, nr, nc;
};

static struct snapshot snap(struct gw_model *m) {
  struct snapshot s = {.np = gw_model_num_params(m)};
  for (int i = 0; i < gw_model_num_buffer_tensors(m); i++) {
    const struct gw_tensor *t = gw_model_buffer_tensor(m, i);
    if (t->dtype == GW_INT64) s.nc += t->numel;
    else s.nr += t->numel;
  }
  s.params = malloc(s.np * sizeof(float));
  s.running = malloc(s.nr * sizeof(float));
  s.counters = malloc(s.nc * sizeof(int64_t));
  memcpy(s.params, gw_model_params(m), s.np * sizeof(float));
  memcpy(s.running, gw_model_running(m), s.nr * sizeof(float));
  memcpy(s.counters, gw_model_counters(m), s.nc * sizeof(int64_t));
  return s;
}

static int snap_equal(struct gw_model *m, const struct snapshot *s) {
  return memcmp(s->params, gw_model_params(m), s->np * sizeof(float)) == 0 &&
         memcmp(s->running, gw_model_running(m), s->nr * sizeof(float)) == 0 &&
         memcmp(s->counters, gw_model_counters(m), s->nc * sizeof(int64_t)) == 0;
}

static void snap_free(struct snapshot *s) {
  free(s->params);
  free(s->running);
  free(s->counters);
}

#define ASSERT_MSG_HAS(needle)                                                                  \
  ck_assert_msg(strstr(gw_model_last_error(), (needle)) != NULL, "message \"%s\" lacks \"%s\"", \
                gw_model_last_error(), (needle))

/* ---- the model round trip ------------------------------------------------------ */

static void roundtrip(int depth) {
  make_tmpdir();
  const char *path = in_tmp("w.safetensors");
  struct gw_model *a = make(depth, 1), *b = make(depth, 2);
  scramble_buffers(a, 11);
  ck_assert_msg(gw_model_save_weights(a, path) == GW_SUCCESS, "%s", gw_model_last_error());
  struct snapshot sa = snap(a);
  ck_assert(!snap_equal(b, &sa));
  ck_assert_msg(gw_model_load_weights(b, path) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_msg(snap_equal(b, &sa), "resnet%d: loaded values differ from saved ones", depth);

  /* What is in the file: every tensor under its name, the metadata, aligned data. */
  struct gw_st_file *f;
  ck_assert_msg(gw_st_open(&f, path) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_int_eq(f->ntensors, gw_model_num_param_tensors(a) + gw_model_num_buffer_tensors(a));
  ck_assert_str_eq(gw_st_metadata(f, "format"), "pt");
  char want[96];
  snprintf(want, sizeof want, "resnet%d classes=10 in_channels=3 image_size=32 stem=small width_divisor=8", depth);
  ck_assert_str_eq(gw_st_metadata(f, "gradwire_model"), want);
  ck_assert_ptr_null(gw_st_metadata(f, "nothing"));
  const struct gw_st_tensor *c = gw_st_find(f, "bn1.num_batches_tracked");
  ck_assert_ptr_nonnull(c);
  ck_assert_int_eq(c->dtype, GW_INT64);
  ck_assert_int_eq(c->ndim, 0);
  ck_assert_uint_eq(c->nbytes, 8);
  const struct gw_st_tensor *w = gw_st_find(f, "conv1.weight");
  ck_assert_str_eq(w->dtype_name, "F32");
  ck_assert_int_eq(w->ndim, 4);
  ck_assert(w->shape[0] == 8 && w->shape[1] == 3 && w->shape[2] == 3 && w->shape[3] == 3);
  ck_assert_ptr_null(gw_st_find(f, "conv1.weigh"));
  ck_assert_int_eq((int)(((const char *)f->tensors[0].data - (const char *)f->owned) % 8), 0);
  gw_st_free(f);
  snap_free(&sa);
  gw_model_free(a);
  gw_model_free(b);
  remove_tmpdir();
}

START_TEST(test_roundtrip_resnet18) { roundtrip(18); }
END_TEST

START_TEST(test_roundtrip_resnet50) { roundtrip(50); }
END_TEST

/* A file in another tensor order (safetensors.torch sorts by dtype and name)
 * loads the same. */
START_TEST(test_load_any_order) {
  make_tmpdir();
  struct gw_model *a = make(18, 1), *b = make(18, 2);
  scramble_buffers(a, 5);
  ck_assert(gw_model_save_weights(a, in_tmp("a")) == GW_SUCCESS);
  struct gw_st_file *f;
  ck_assert(gw_st_open(&f, in_tmp("a")) == GW_SUCCESS);
  int n = f->ntensors;
  struct gw_st_tensor *rev = malloc((size_t)n * sizeof *rev);
  for (int i = 0; i < n; i++) rev[i] = f->tensors[n - 1 - i];
  ck_assert_msg(gw_st_write(in_tmp("b"), rev, n, NULL) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_msg(gw_model_load_weights(b, in_tmp("b")) == GW_SUCCESS, "%s", gw_model_last_error());
  struct snapshot sa = snap(a);
  ck_assert(snap_equal(b, &sa));
  snap_free(&sa);
  free(rev);
  gw_st_free(f);
  gw_model_free(a);
  gw_model_free(b);
  remove_tmpdir();
}
END_TEST

/* ---- byte-exact files ------------------------------------------------------------ */

#define TINY_HEADER                                                                    \
  "{\"__metadata__\":{\"format\":\"pt\"},"                                             \
  "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"                    \
  "\"b\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]}}      "

START_TEST(test_write_exact_bytes) {
  make_tmpdir();
  const float av[2] = {1.0f, -2.0f};
  const int64_t bv = 7;
  struct gw_st_tensor t[2] = {
      {.name = "a", .dtype = GW_FLOAT32, .ndim = 1, .shape = {2}, .nbytes = 8, .data = av},
      {.name = "b", .dtype = GW_INT64, .ndim = 0, .nbytes = 8, .data = &bv},
  };
  const char *const meta[] = {"format", "pt", NULL};
  ck_assert_msg(gw_st_write(in_tmp("tiny"), t, 2, meta) == GW_SUCCESS, "%s", gw_model_last_error());
  static const unsigned char prefix[8] = {144, 0, 0, 0, 0, 0, 0, 0};
  static const unsigned char data[16] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0, 7, 0, 0, 0, 0, 0, 0, 0};
  ck_assert_int_eq(sizeof TINY_HEADER - 1, 144);
  size_t len;
  char *got = slurp(in_tmp("tiny"), &len);
  ck_assert_uint_eq(len, 8 + 144 + 16);
  ck_assert(memcmp(got, prefix, 8) == 0);
  ck_assert_msg(memcmp(got + 8, TINY_HEADER, 144) == 0, "header: %.144s", got + 8);
  ck_assert(memcmp(got + 152, data, 16) == 0);
  free(got);
  ck_assert_int_eq(count_files(), 1); /* no temporary file left behind */
  remove_tmpdir();
}
END_TEST

/* prefix(strlen(header)) + header + dlen bytes (data, or 0xab) into a static buffer. */
static const unsigned char *file_of(const char *header, const void *data, size_t dlen, size_t *len) {
  static unsigned char b[4096];
  size_t n = strlen(header);
  ck_assert(8 + n + dlen <= sizeof b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, header, n);
  if (data) memcpy(b + 8 + n, data, dlen);
  else memset(b + 8 + n, 0xab, dlen);
  *len = 8 + n + dlen;
  return b;
}

START_TEST(test_parse_hand_made) {
  /* Blanks everywhere JSON allows them, escapes, a BOOL tensor (no gw_dtype_t), a
   * zero-size tensor, a scalar, and a non-BMP character as a surrogate pair. */
  const char *h =
      " \n{ \"__metadata__\" : { \"k\\u00e9\" : \"v\\\"\\\\\\/\\n\\t\" , \"x\":\"\\ud83d\\ude00\" } ,"
      "\t\"w\\\"q\" : {\"shape\":[ 2 , 1 ],\"dtype\":\"F16\",\"data_offsets\":[0,4]},"
      "\"flags\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[4,7]},"
      "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[7,7]},"
      "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[7,8]} }   ";
  const unsigned char data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  size_t len;
  const unsigned char *buf = file_of(h, data, 8, &len);
  struct gw_st_file *f;
  ck_assert_msg(gw_st_parse(&f, buf, len, "hand") == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_int_eq(f->ntensors, 4);
  ck_assert_int_eq(f->nmeta, 2);
  ck_assert_str_eq(gw_st_metadata(f, "k\xc3\xa9"), "v\"\\/\n\t");
  ck_assert_str_eq(gw_st_metadata(f, "x"), "\xf0\x9f\x98\x80");
  ck_assert_str_eq(f->tensors[0].name, "w\"q"); /* header order kept */
  const struct gw_st_tensor *w = gw_st_find(f, "w\"q");
  ck_assert(w->dtype == GW_FLOAT16 && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 1 && w->nbytes == 4);
  ck_assert_ptr_eq(w->data, buf + len - 8);
  const struct gw_st_tensor *fl = gw_st_find(f, "flags");
  ck_assert_int_eq(fl->dtype, GW_NUM_DTYPES);
  ck_assert_str_eq(fl->dtype_name, "BOOL");
  ck_assert_int_eq(((const unsigned char *)fl->data)[0], 5);
  ck_assert_uint_eq(gw_st_find(f, "empty")->nbytes, 0);
  const struct gw_st_tensor *s = gw_st_find(f, "s");
  ck_assert(s->ndim == 0 && s->nbytes == 1 && *(const unsigned char *)s->data == 8);
  gw_st_free(f);

  /* An empty file is valid: "{}" and no data. */
  buf = file_of("{}      ", NULL, 0, &len);
  ck_assert(gw_st_parse(&f, buf, len, NULL) == GW_SUCCESS);
  ck_assert_int_eq(f->ntensors, 0);
  ck_assert_ptr_null(gw_st_find(f, "a"));
  gw_st_free(f);
}
END_TEST

/* ---- rejections ------------------------------------------------------------------ */

#define T_A(shape, offs) "\"a\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":" offs "}"
#define T_B(shape, offs) "\"b\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":" offs "}"

static const struct bad_case {
  const char *header;
  size_t dlen;
  const char *msg1, *msg2;
} bad_cases[] = {
    {"{" T_A("[2]", "[0,8]") ",}", 8, "not valid JSON", "expected '\"'"}, /* the next key is missing */
    {"{" T_A("[2]", "[0,8]"), 8, "not valid JSON", "expected ',' or '}'"},
    {"{" T_A("[2]", "[0,8]") "} x", 8, "not valid JSON", "bytes after"},
    {"[]", 0, "not valid JSON", "expected '{'"},
    {"", 0, "not valid JSON", "expected '{'"},
    {"{\"a\":1}", 0, "not valid JSON", "tensor \"a\""},
    {"{\"a\x01\":{}}", 0, "not valid JSON", "control character"},
    {"{\"a\\x\":{}}", 0, "not valid JSON", "unknown escape"},
    {"{\"a\\udc00\":{}}", 0, "not valid JSON", "lone low surrogate"},
    {"{\"a\\ud800x\":{}}", 0, "not valid JSON", "high surrogate"},
    {"{\"a\\u00\":{}}", 0, "not valid JSON", "four hex digits"},
    {"{\"a\\u0000\":{}}", 0, "not valid JSON", "\\u0000"},
    {"{\"a\":{\"dtype\":\"F32", 0, "not valid JSON", "unterminated string"},
    {"{\"a\":{\"dtype\":\"F32\\", 0, "not valid JSON", "unterminated string"},
    {"{" T_A("[02]", "[0,8]") "}", 8, "not valid JSON", "leading zero"},
    {"{" T_A("[true]", "[0,8]") "}", 8, "not valid JSON", "expected a number"},
    {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor \"a\"", "unknown dtype \"F33\""},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"foo\":1}}", 8, "tensor \"a\"",
     "unknown key \"foo\""},
    {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor \"a\"",
     "\"dtype\" appears twice"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "tensor \"a\"", "no \"data_offsets\""},
    {"{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ \"k\"", "must be strings"},
    {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__ appears twice", NULL},
    {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "__metadata__ key \"k\" appears twice", NULL},
    {"{" T_A("[2]", "[0,8]") "," T_A("[2]", "[8,16]") "}", 16, "tensor \"a\"", "appears twice"},
    {"{" T_A("[-1]", "[0,8]") "}", 8, "tensor \"a\"", "shape entry is negative"},
    {"{" T_A("[2.0]", "[0,8]") "}", 8, "tensor \"a\"", "shape entry is not an integer"},
    {"{" T_A("[1e3]", "[0,8]") "}", 8, "tensor \"a\"", "shape entry is not an integer"},
    {"{" T_A("[1,1,1,1,1,1,1,1,2]", "[0,8]") "}", 8, "tensor \"a\"", "more than 8 entries in shape"},
    {"{" T_A("[99999999999999999999]", "[0,8]") "}", 8, "tensor \"a\"", "does not fit in 64 bits"},
    {"{" T_A("[9223372036854775808]", "[0,8]") "}", 8, "tensor \"a\"", "too large"},
    {"{" T_A("[4294967296,4294967296,16]", "[0,8]") "}", 8, "tensor \"a\"", "overflows"},
    {"{" T_A("[2]", "[0,8,9]") "}", 8, "tensor \"a\"", "more than 2 entries in data_offsets"},
    {"{" T_A("[2]", "[0]") "}", 8, "tensor \"a\"", "data_offsets has 1 entries"},
    {"{" T_A("[2]", "[-1,8]") "}", 8, "tensor \"a\"", "data_offsets entry is negative"},
    {"{" T_A("[2]", "[8,0]") "}", 8, "tensor \"a\"", "begin after end"},
    {"{" T_A("[4]", "[0,16]") "}", 8, "tensor \"a\"", "end past the data section (8 bytes"},
    {"{" T_A("[3]", "[0,8]") "}", 8, "tensor \"a\"", "shape [3] of F32 is 12 bytes but data_offsets [0, 8] hold 8"},
    {"{" T_A("[2]", "[0,8]") "," T_B("[2]", "[4,12]") "}", 12, "tensor \"b\"", "overlap tensor \"a\" [0, 8]"},
    {"{" T_B("[2]", "[12,20]") "," T_A("[2]", "[0,8]") "}", 20, "tensor \"b\"", "data bytes [8, 12) before it"},
    {"{" T_A("[2]", "[4,12]") "}", 12, "tensor \"a\"", "data bytes [0, 4) before it"},
    {"{" T_A("[2]", "[0,8]") "}", 12, "tensor \"a\"", "data bytes [8, 12) at the end"},
    {"{}", 4, "data bytes [0, 4) at the end", NULL},
};

START_TEST(test_rejections) {
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    const struct bad_case *c = &bad_cases[i];
    size_t len;
    const unsigned char *buf = file_of(c->header, NULL, c->dlen, &len);
    struct gw_st_file *f = (struct gw_st_file *)1;
    gw_result_t r = gw_st_parse(&f, buf, len, "bad.safetensors");
    ck_assert_msg(r == GW_ERR_INVALID_ARGUMENT, "case %zu (%s) parsed: %d", i, c->header, (int)r);
    ck_assert_ptr_null(f);
    ASSERT_MSG_HAS("bad.safetensors: ");
    ASSERT_MSG_HAS(c->msg1);
    if (c->msg2) ASSERT_MSG_HAS(c->msg2);
  }
}
END_TEST

/* The 8-byte length: too short a file, a length over the limit or past the end. */
START_TEST(test_rejected_lengths) {
  struct gw_st_file *f;
  unsigned char b[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
  ck_assert(gw_st_parse(&f, b, 16, "x") == GW_SUCCESS);
  gw_st_free(f);
  ck_assert_int_eq(gw_st_parse(&f, b, 5, "x"), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("x: 5 bytes, shorter than the 8-byte header length");
  ck_assert_int_eq(gw_st_parse(&f, b, 15, "x"), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("x: header length 8 but only 7 bytes follow");
  b[0] = 0, b[3] = 0x10; /* 268435456 */
  ck_assert_int_eq(gw_st_parse(&f, b, 16, "x"), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("header length 268435456 is over the 100000000-byte limit");
  memset(b, 0xff, 8);
  ck_assert_int_eq(gw_st_parse(&f, b, 16, "x"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(gw_st_parse(&f, NULL, 0, NULL), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("<buffer>: 0 bytes");
}
END_TEST

/* A real file cut short anywhere is refused, and the message names the file. */
START_TEST(test_truncated_files) {
  make_tmpdir();
  struct gw_model *m = make(18, 1);
  const char *path = in_tmp("w.safetensors");
  ck_assert(gw_model_save_weights(m, path) == GW_SUCCESS);
  size_t len;
  char *whole = slurp(path, &len);
  size_t cuts[] = {0, 7, 8, 100, len / 2, len - 8, len - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    FILE *o = fopen(in_tmp("cut"), "wb");
    fwrite(whole, 1, cuts[i], o);
    fclose(o);
    struct gw_st_file *f;
    ck_assert_msg(gw_st_open(&f, in_tmp("cut")) == GW_ERR_INVALID_ARGUMENT, "cut at %zu parsed", cuts[i]);
    ASSERT_MSG_HAS(in_tmp("cut"));
    if (cuts[i] > len / 4) ASSERT_MSG_HAS("end past the data section");
    ck_assert_int_eq(gw_model_load_weights(m, in_tmp("cut")), GW_ERR_INVALID_ARGUMENT);
  }
  struct gw_st_file *f;
  ck_assert_int_eq(gw_st_open(&f, in_tmp("nothing")), GW_ERR_SYSTEM);
  ASSERT_MSG_HAS("No such file or directory");
  ck_assert_int_eq(gw_st_open(&f, tmpdir), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("not a regular file");
  free(whole);
  gw_model_free(m);
  remove_tmpdir();
}
END_TEST

/* A FIFO is refused at once, not waited on for a writer that never comes (the
 * alarm, with its default action rather than Check's handler, turns a hang into
 * a failure). */
START_TEST(test_fifo_refused) {
  make_tmpdir();
  const char *path = in_tmp("fifo");
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  signal(SIGALRM, SIG_DFL);
  alarm(10);
  struct gw_st_file *f;
  ck_assert_int_eq(gw_st_open(&f, path), GW_ERR_INVALID_ARGUMENT);
  alarm(0);
  ASSERT_MSG_HAS(path);
  ASSERT_MSG_HAS("not a regular file (a FIFO)");
  remove_tmpdir();
}
END_TEST

static long max_rss_kib(void) {
  struct rusage ru;
  ck_assert_int_eq(getrusage(RUSAGE_SELF, &ru), 0);
  return ru.ru_maxrss;
}

/* A 1 GiB file (sparse: costs no disk) that is not safetensors, or whose header
 * leaves its data unaccounted for, is refused having read no more than its
 * header: the peak memory grows by far less than the file. */
START_TEST(test_big_wrong_file_not_read) {
  static const struct { const char *header; const char *msg; } cases[] = {
      {NULL, "header length 18446744073709551615 is over the 100000000-byte limit"},
      {"{}      ", "data bytes [0, 1073741808) at the end belong to no tensor"},
  };
  make_tmpdir();
  const char *path = in_tmp("big");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t len = 8;
    static const unsigned char ff[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const void *head = cases[i].header ? file_of(cases[i].header, NULL, 0, &len) : ff;
    FILE *o = fopen(path, "wb");
    ck_assert_uint_eq(fwrite(head, 1, len, o), len);
    ck_assert_int_eq(ftruncate(fileno(o), 1L << 30), 0);
    fclose(o);
    long before = max_rss_kib();
    struct gw_st_file *f;
    ck_assert_int_eq(gw_st_open(&f, path), GW_ERR_INVALID_ARGUMENT);
    ASSERT_MSG_HAS(path);
    ASSERT_MSG_HAS(cases[i].msg);
    long grew = max_rss_kib() - before;
    ck_assert_msg(grew < 64 * 1024, "case %zu: refusing the file took %ld KiB", i, grew);
  }
  remove_tmpdir();
}
END_TEST

/* A well-formed file of another model (here one 1 GiB tensor, sparse) is
 * refused by gw_model_load_weights from its header: the names are checked
 * before the data is read (it was read whole first: a 14 GB language model's
 * file went out of memory instead of "missing: conv1.weight"). */
START_TEST(test_big_other_model_not_read) {
  make_tmpdir();
  struct gw_model *m = make(18, 1);
  const char *path = in_tmp("other-model");
  size_t len;
  const unsigned char *head =
      file_of("{\"x\":{\"dtype\":\"U8\",\"shape\":[1073741824],\"data_offsets\":[0,1073741824]}}", NULL, 0, &len);
  FILE *o = fopen(path, "wb");
  ck_assert_uint_eq(fwrite(head, 1, len, o), len);
  ck_assert_int_eq(ftruncate(fileno(o), (off_t)len + (1L << 30)), 0);
  fclose(o);
  long before = max_rss_kib();
  ck_assert_int_eq(gw_model_load_weights(m, path), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("missing: conv1.weight");
  ASSERT_MSG_HAS(path);
  long grew = max_rss_kib() - before;
  ck_assert_msg(grew < 64 * 1024, "refusing another model's file took %ld KiB", grew);
  gw_model_free(m);
  remove_tmpdir();
}
END_TEST

/* ---- load_weights refusing mismatched files ---------------------------------- */

/* Saves m, then rewrites it through edit(tensors, &n) as name. */
typedef void (*edit_fn)(struct gw_st_tensor *t, int *n);

static const char *edited(struct gw_model *m, const char *name, edit_fn edit) {
  ck_assert(gw_model_save_weights(m, in_tmp("orig")) == GW_SUCCESS);
  struct gw_st_file *f;
  ck_assert(gw_st_open(&f, in_tmp("orig")) == GW_SUCCESS);
  int n = f->ntensors;
  struct gw_st_tensor *t = calloc((size_t)n + 1, sizeof *t);
  memcpy(t, f->tensors, (size_t)n * sizeof *t);
  edit(t, &n);
  const char *path = in_tmp(name);
  ck_assert_msg(gw_st_write(path, t, n, NULL) == GW_SUCCESS, "%s", gw_model_last_error());
  free(t);
  gw_st_free(f);
  return path;
}

static struct gw_st_tensor *by_name(struct gw_st_tensor *t, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(t[i].name, name) == 0) return &t[i];
  ck_abort_msg("no %s", name);
  return NULL;
}

static void half_conv(struct gw_st_tensor *t, int *n) {
  struct gw_st_tensor *c = by_name(t, *n, "layer1.0.conv1.weight");
  c->shape[0] /= 2, c->nbytes /= 2;
}

static void drop_fc_bias(struct gw_st_tensor *t, int *n) {
  struct gw_st_tensor *c = by_name(t, *n, "fc.bias");
  *c = t[--*n];
}

static void add_foo(struct gw_st_tensor *t, int *n) {
  static const float v = 1;
  t[(*n)++] =
      (struct gw_st_tensor){.name = "foo", .dtype = GW_FLOAT32, .ndim = 1, .shape = {1}, .nbytes = 4, .data = &v};
}

static void running_mean_i32(struct gw_st_tensor *t, int *n) { by_name(t, *n, "bn1.running_mean")->dtype = GW_INT32; }

/* fc.weight wrong and conv1.weight missing: conv1 comes first in table order. */
static void two_problems(struct gw_st_tensor *t, int *n) {
  struct gw_st_tensor *fc = by_name(t, *n, "fc.weight");
  fc->shape[0] = 1, fc->nbytes /= 10;
  struct gw_st_tensor *c = by_name(t, *n, "conv1.weight");
  *c = t[--*n];
}

static void counter_as_vector(struct gw_st_tensor *t, int *n) {
  struct gw_st_tensor *c = by_name(t, *n, "layer2.1.bn2.num_batches_tracked");
  c->ndim = 1, c->shape[0] = 1;
}

/* Every batch norm's num_batches_tracked dropped, as torchvision's older
 * checkpoints lack them. */
static void drop_counters(struct gw_st_tensor *t, int *n) {
  for (int i = 0; i < *n;)
    if (strstr(t[i].name, "num_batches_tracked")) t[i] = t[--*n];
    else i++;
}

/* A file without the num_batches_tracked counters loads (they become 0, as
 * PyTorch's load_state_dict fills them for a new model); everything else
 * comes from the file. */
START_TEST(test_load_without_counters) {
  make_tmpdir();
  struct gw_model *a = make(18, 1), *b = make(18, 2);
  scramble_buffers(b, 3);
  const char *path = edited(a, "nocounters", drop_counters);
  ck_assert_msg(gw_model_load_weights(b, path) == GW_SUCCESS, "%s", gw_model_last_error());
  for (int i = 0; i < gw_model_num_buffer_tensors(b); i++) {
    const struct gw_tensor *t = gw_model_buffer_tensor(b, i);
    if (t->kind == GW_TENSOR_COUNTER) ck_assert_int_eq(*(const int64_t *)gw_model_tensor_data(b, t), 0);
  }
  ck_assert_msg(!memcmp(gw_model_params(a), gw_model_params(b), gw_model_num_params(a) * sizeof(float)),
                "the parameters did not come from the file");
  gw_model_free(a);
  gw_model_free(b);
  remove_tmpdir();
}
END_TEST

START_TEST(test_load_refusals) {
  static const struct { const char *file; edit_fn edit; const char *msg; } cases[] = {
      {"shape", half_conv, "layer1.0.conv1.weight: shape [8, 8, 3, 3] in model, [4, 8, 3, 3] in "},
      {"missing", drop_fc_bias, "missing: fc.bias"},
      {"unexpected", add_foo, "unexpected: foo"},
      {"dtype", running_mean_i32, "bn1.running_mean: dtype F32 in model, I32 in "},
      {"first", two_problems, "missing: conv1.weight"},
      {"scalar", counter_as_vector, "layer2.1.bn2.num_batches_tracked: shape [] in model, [1] in "},
  };
  make_tmpdir();
  struct gw_model *a = make(18, 1), *b = make(18, 2);
  scramble_buffers(b, 3);
  struct snapshot sb = snap(b);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *path = edited(a, cases[i].file, cases[i].edit);
    ck_assert_msg(gw_model_load_weights(b, path) == GW_ERR_INVALID_ARGUMENT, "%s loaded", cases[i].file);
    ASSERT_MSG_HAS(cases[i].msg);
    ASSERT_MSG_HAS(path);
    ck_assert_msg(snap_equal(b, &sb), "%s: the refused load changed the model", cases[i].file);
  }
  snap_free(&sb);
  gw_model_free(a);
  gw_model_free(b);
  remove_tmpdir();
}
END_TEST

/* ---- the writer: refusals and atomicity --------------------------------------- */

START_TEST(test_write_refusals) {
  make_tmpdir();
  float v[4] = {0};
  struct gw_st_tensor t[2] = {
      {.name = "a", .dtype = GW_FLOAT32, .ndim = 1, .shape = {2}, .nbytes = 8, .data = v},
      {.name = "a", .dtype = GW_FLOAT32, .ndim = 1, .shape = {2}, .nbytes = 8, .data = v},
  };
  ck_assert_int_eq(gw_st_write(in_tmp("x"), t, 2, NULL), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("tensor \"a\": appears twice");
  t[1].name = "b", t[1].nbytes = 12;
  ck_assert_int_eq(gw_st_write(in_tmp("x"), t, 2, NULL), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("tensor \"b\": nbytes 12 does not match shape [2] of F32");
  t[1].nbytes = 8, t[1].dtype = GW_NUM_DTYPES, t[1].dtype_name = "F7";
  ck_assert_int_eq(gw_st_write(in_tmp("x"), t, 2, NULL), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("tensor \"b\": no safetensors dtype");
  t[1].dtype_name = "I16", t[1].shape[0] = 4; /* a dtype gradwire has no gw_dtype_t for */
  const char *const odd[] = {"k", NULL};
  ck_assert_int_eq(gw_st_write(in_tmp("x"), t, 2, odd), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("__metadata__ key \"k\" has no value");
  t[1].name = "__metadata__";
  ck_assert_int_eq(gw_st_write(in_tmp("x"), t, 2, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(count_files(), 0);
  t[1].name = "b";
  ck_assert_msg(gw_st_write(in_tmp("x"), t, 2, NULL) == GW_SUCCESS, "%s", gw_model_last_error());
  struct gw_st_file *f;
  ck_assert(gw_st_open(&f, in_tmp("x")) == GW_SUCCESS);
  ck_assert_str_eq(gw_st_find(f, "b")->dtype_name, "I16");
  gw_st_free(f);
  remove_tmpdir();
}
END_TEST

START_TEST(test_atomic_write) {
  make_tmpdir();
  struct gw_model *a = make(18, 1), *b = make(18, 2);
  const char *path = in_tmp("w.safetensors");
  ck_assert(gw_model_save_weights(a, path) == GW_SUCCESS);
  size_t len0;
  char *before = slurp(path, &len0);
  static const char *const steps[] = {"create", "chmod", "write", "fsync", "rename"};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    setenv("GW_SAFETENSORS_FAIL", steps[i], 1);
    ck_assert_msg(gw_model_save_weights(b, path) == GW_ERR_SYSTEM, "%s: saved", steps[i]);
    ASSERT_MSG_HAS(path);
    ASSERT_MSG_HAS("Input/output error");
    unsetenv("GW_SAFETENSORS_FAIL");
    size_t len;
    char *now = slurp(path, &len);
    ck_assert_msg(len == len0 && memcmp(now, before, len) == 0, "%s: the old file changed", steps[i]);
    free(now);
    ck_assert_msg(count_files() == 1, "%s: a temporary file was left behind", steps[i]);
  }
  /* The directory sync after the rename: EINVAL (a file system that cannot
   * sync directories) is a warning and the save stands; EIO fails it, with
   * the new file already in place. */
  setenv("GW_SAFETENSORS_FAIL", "dirsync", 1);
  ck_assert_msg(gw_model_save_weights(b, path) == GW_SUCCESS, "dirsync EINVAL: %s", gw_model_last_error());
  /* A file system that keeps no modes (vfat: fchmod's EPERM) saves too. */
  setenv("GW_SAFETENSORS_FAIL", "chmod-eperm", 1);
  ck_assert_msg(gw_model_save_weights(a, path) == GW_SUCCESS, "chmod EPERM: %s", gw_model_last_error());
  ck_assert_int_eq(count_files(), 1);
  struct snapshot sa = snap(a);
  ck_assert(gw_model_load_weights(b, path) == GW_SUCCESS);
  ck_assert(snap_equal(b, &sa));
  snap_free(&sa);
  ck_assert(gw_model_save_weights(b, path) == GW_SUCCESS);
  /* An empty name is refused before anything is written. */
  unsetenv("GW_SAFETENSORS_FAIL");
  ck_assert_int_eq(gw_model_save_weights(b, ""), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("an empty file name");
  setenv("GW_SAFETENSORS_FAIL", "dirsync-eio", 1);
  ck_assert_int_eq(gw_model_save_weights(a, path), GW_ERR_SYSTEM);
  ASSERT_MSG_HAS("syncing its directory");
  unsetenv("GW_SAFETENSORS_FAIL");
  ck_assert_int_eq(count_files(), 1);
  ck_assert(gw_model_save_weights(a, path) == GW_SUCCESS);
  /* A directory that does not exist: nothing is created anywhere. */
  char missing[128];
  snprintf(missing, sizeof missing, "%s/no/such/dir/w.safetensors", tmpdir);
  ck_assert_int_eq(gw_model_save_weights(b, missing), GW_ERR_SYSTEM);
  ASSERT_MSG_HAS(missing);
  ASSERT_MSG_HAS("No such file or directory");
  ck_assert_int_eq(count_files(), 1);
  /* Without the hook the same save replaces the file. */
  ck_assert(gw_model_save_weights(b, path) == GW_SUCCESS);
  ck_assert(gw_model_load_weights(a, path) == GW_SUCCESS);
  struct snapshot sb = snap(b);
  ck_assert(snap_equal(a, &sb));
  ck_assert_int_eq(count_files(), 1);
  snap_free(&sb);
  free(before);
  gw_model_free(a);
  gw_model_free(b);
  remove_tmpdir();
}
END_TEST

/* One F32 tensor "a" = v into path; its value read back. */
static gw_result_t save_value(const char *path, float v) {
  struct gw_st_tensor t = {.name = "a", .dtype = GW_FLOAT32, .ndim = 1, .shape = {1}, .nbytes = 4, .data = &v};
  return gw_st_write(path, &t, 1, NULL);
}

static float load_value(const char *path) {
  struct gw_st_file *f;
  ck_assert_msg(gw_st_open(&f, path) == GW_SUCCESS, "%s", gw_model_last_error());
  float v;
  memcpy(&v, gw_st_find(f, "a")->data, sizeof v);
  gw_st_free(f);
  return v;
}

static mode_t mode_of(const char *path) {
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  return st.st_mode & 07777;
}

/* A file over the file-size limit (ulimit -f) is refused before anything is
 * written: the old file kept, no temporary file (SIGXFSZ's default action,
 * as here, killed the writer with one half written); exactly the limit is
 * written. */
START_TEST(test_write_over_size_limit) {
  make_tmpdir();
  static float v[1024]; /* 4096 bytes of data, the file a little more */
  struct gw_st_tensor t = {.name = "a", .dtype = GW_FLOAT32, .ndim = 1, .shape = {1024}, .nbytes = sizeof v, .data = v};
  const char *path = in_tmp("w.safetensors");
  ck_assert(gw_st_write(path, &t, 1, NULL) == GW_SUCCESS);
  size_t len0;
  char *before = slurp(path, &len0);
  struct rlimit old, low;
  ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
  low = old, low.rlim_cur = len0 - 1;
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &low), 0);
  ck_assert_uint_eq(gw_st_file_size_limit(), len0 - 1);
  v[0] = 1;
  ck_assert_int_eq(gw_st_write(path, &t, 1, NULL), GW_ERR_INVALID_ARGUMENT);
  char want[160];
  snprintf(want, sizeof want, "the file would be %zu bytes, over this process's file-size limit (ulimit -f) of %zu",
           len0, len0 - 1);
  ASSERT_MSG_HAS(want);
  ck_assert_int_eq(count_files(), 1);
  size_t len;
  char *now = slurp(path, &len);
  ck_assert(len == len0 && memcmp(now, before, len) == 0);
  free(now);
  low.rlim_cur = len0;
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &low), 0);
  ck_assert_msg(gw_st_write(path, &t, 1, NULL) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
  ck_assert_int_eq(load_value(path), 1);
  free(before);
  remove_tmpdir();
}
END_TEST

/* A save replaces the file's contents, not what the name is: a symbolic link
 * stays a link to the file now saved, and a file replaced keeps its mode (the
 * umask decides only a new file's); a link to nothing is refused. */
START_TEST(test_save_keeps_link_and_mode) {
  make_tmpdir();
  umask(022);
  const char *real = in_tmp("real.safetensors"), *link = in_tmp("link.safetensors");
  ck_assert(save_value(real, 1) == GW_SUCCESS);
  ck_assert_int_eq(mode_of(real), 0644);
  ck_assert_int_eq(chmod(real, 0600), 0);
  ck_assert_msg(save_value(real, 2) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert_int_eq(mode_of(real), 0600);
  ck_assert_int_eq(symlink("real.safetensors", link), 0);
  ck_assert_msg(save_value(link, 3) == GW_SUCCESS, "%s", gw_model_last_error());
  struct stat st;
  ck_assert_int_eq(lstat(link, &st), 0);
  ck_assert_msg(S_ISLNK(st.st_mode), "the save replaced the symbolic link");
  ck_assert(load_value(real) == 3);
  ck_assert_int_eq(mode_of(real), 0600);
  ck_assert_int_eq(count_files(), 2); /* no temporary file left */
  const char *dangling = in_tmp("dangling.safetensors");
  ck_assert_int_eq(symlink("nowhere/w.safetensors", dangling), 0);
  ck_assert_int_eq(save_value(dangling, 4), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS(dangling);
  ASSERT_MSG_HAS("a symbolic link to \"nowhere/w.safetensors\", which does not exist");
  ck_assert_int_eq(lstat(dangling, &st), 0);
  ck_assert(S_ISLNK(st.st_mode));
  ck_assert_int_eq(count_files(), 3);
  /* Not a regular file, named or through a link: refused, left as it was (a
   * link to /dev/null, followed and renamed over, replaced the device node as
   * root) */
  const char *fifo = in_tmp("fifo"), *to_fifo = in_tmp("to-fifo.safetensors");
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  ck_assert_int_eq(symlink("fifo", to_fifo), 0);
  ck_assert_int_eq(save_value(fifo, 5), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("not a regular file (a FIFO): not replaced");
  ck_assert_int_eq(save_value(to_fifo, 6), GW_ERR_INVALID_ARGUMENT);
  ASSERT_MSG_HAS("not a regular file (a FIFO): not replaced");
  ck_assert(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
  ck_assert_int_eq(count_files(), 5);
  remove_tmpdir();
}
END_TEST

int main(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("safetensors");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_roundtrip_resnet18);
  tcase_add_test(tc, test_roundtrip_resnet50);
  tcase_add_test(tc, test_load_any_order);
  tcase_add_test(tc, test_write_exact_bytes);
  tcase_add_test(tc, test_big_other_model_not_read);
  tcase_add_test(tc, test_parse_hand_made);
  tcase_add_test(tc, test_rejections);
  tcase_add_test(tc, test_rejected_lengths);
  tcase_add_test(tc, test_truncated_files);
  tcase_add_test(tc, test_fifo_refused);
  tcase_add_test(tc, test_big_wrong_file_not_read);
  tcase_add_test(tc, test_load_refusals);
  tcase_add_test(tc, test_load_without_counters);
  tcase_add_test(tc, test_write_refusals);
  tcase_add_test(tc, test_atomic_write);
  tcase_add_test(tc, test_write_over_size_limit);
  tcase_add_test(tc, test_save_keeps_link_and_mode);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
