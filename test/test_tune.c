/* test_tune.c - the cost model (comm/tune.c): what the built-in table picks
 * for small and large allreduces, overrides, the tuning file (a written file
 * reads back; a damaged one is refused naming its line and changes nothing),
 * and ranks that disagree on GW_PROTO or the table failing at init. */
#include <check.h>
#include <errno.h>
#include <sched.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm.h"
#include "harness.h"
#include "tune.h"

/* Makes the file of the mkstemp template path (emptied, closed). */
static void make_temp(char *path) {
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
}

/* Removes a tuning file and the PATH.lock its writer leaves (kept there on
 * purpose: unlinking a lock another writer holds would let a third take a new
 * one), so runs do not pile locks up in /tmp. */
static void remove_tuned(const char *path) {
  char lock[4200];
  snprintf(lock, sizeof lock, "%s.lock", path);
  unlink(path);
  unlink(lock);
}

static struct gw_pick_args args(int n, size_t bytes) {
  return (struct gw_pick_args){.nranks = n, .coll = GW_COLL_ALLREDUCE, .bytes = bytes, .algo = GW_ALGO_AUTO,
                               .proto = -1, .tree_ok = true, .ll_ok = true, .exchange_max = 256 << 10};
}

START_TEST(test_default_picks) {
  struct gw_model m;
  gw__model_defaults(&m);
  for (int n = 2; n <= 64; n *= 2) {
    struct gw_pick_args a = args(n, 8);
    int algo, proto;
    gw__model_pick(&m, &a, &algo, &proto);
    ck_assert_msg(algo != GW_ALGO_RING || proto == GW_PROTO_LL, "n=%d, 8 B: picked %s/%s", n, gw__algo_name(algo),
                  gw__proto_name(proto));
    if (n >= 4) ck_assert_msg(algo == GW_ALGO_TREE, "n=%d, 8 B: picked %s", n, gw__algo_name(algo));
    a = args(n, 64u << 20);
    gw__model_pick(&m, &a, &algo, &proto);
    ck_assert_msg(algo == GW_ALGO_RING && proto == GW_PROTO_SIMPLE, "n=%d, 64 MiB: picked %s/%s", n,
                  gw__algo_name(algo), gw__proto_name(proto));
  }
  /* 2 ranks, as docs/architecture.md says: the exchange, LL to 252 B (0.14 +
   * B/4400 against 0.18 + B/14500 us), simple above. */
  const size_t at[] = {248, 252, 256, 260};
  for (int i = 0; i < 4; i++) {
    struct gw_pick_args a = args(2, at[i]);
    int algo, proto;
    gw__model_pick(&m, &a, &algo, &proto);
    ck_assert_msg(algo == GW_ALGO_EXCHANGE && proto == (at[i] <= 252 ? GW_PROTO_LL : GW_PROTO_SIMPLE),
                  "2 ranks, %zu B: picked %s/%s", at[i], gw__algo_name(algo), gw__proto_name(proto));
  }
}
END_TEST

/* With recursive doubling connected (more than 2 ranks), 8 B goes to it: log2 n
 * hops (+2 when n is not a power of two) against the tree's 2 log2 n; 64 MiB
 * stays on the ring, where every step moving all of the data would cost log2 n
 * times the ring's bytes; its hop count drives the crossover. */
START_TEST(test_rd_picks) {
  struct gw_model m;
  gw__model_defaults(&m);
  for (int n = 3; n <= 64; n++) {
    struct gw_pick_args a = args(n, 8);
    a.rd_ok = true;
    int algo, proto;
    gw__model_pick(&m, &a, &algo, &proto);
    ck_assert_msg(algo == GW_ALGO_EXCHANGE, "n=%d, 8 B with recursive doubling: picked %s", n, gw__algo_name(algo));
    a.bytes = 64u << 20;
    gw__model_pick(&m, &a, &algo, &proto);
    ck_assert_msg(algo == GW_ALGO_RING, "n=%d, 64 MiB: picked %s", n, gw__algo_name(algo));
    a.bytes = 1u << 20; /* past GW_EXCHANGE_MAX_BYTES: never recursive doubling */
    gw__model_pick(&m, &a, &algo, &proto);
    ck_assert_msg(algo != GW_ALGO_EXCHANGE, "n=%d, 1 MiB: picked exchange past its limit", n);
  }
}
END_TEST

/* GW_ALGO / GW_PROTO restrict the choice; what a transport cannot do is never picked. */
START_TEST(test_overrides) {
  struct gw_model m;
  gw__model_defaults(&m);
  int algo, proto;
  struct gw_pick_args a = args(8, 8);
  a.algo = GW_ALGO_RING;
  gw__model_pick(&m, &a, &algo, &proto);
  ck_assert_int_eq(algo, GW_ALGO_RING);
  a = args(8, 8);
  a.proto = GW_PROTO_SIMPLE;
  gw__model_pick(&m, &a, &algo, &proto);
  ck_assert_int_eq(proto, GW_PROTO_SIMPLE);
  a = args(8, 64u << 20);
  a.algo = GW_ALGO_TREE, a.proto = GW_PROTO_LL;
  gw__model_pick(&m, &a, &algo, &proto);
  ck_assert(algo == GW_ALGO_TREE && proto == GW_PROTO_LL);
  a.ll_ok = false, a.tree_ok = false; /* tcp, or a communicator without trees */
  gw__model_pick(&m, &a, &algo, &proto);
  ck_assert(algo == GW_ALGO_RING && proto == GW_PROTO_SIMPLE);
  a = args(8, 8);
  a.coll = GW_COLL_BROADCAST; /* only the ring runs it */
  gw__model_pick(&m, &a, &algo, &proto);
  ck_assert_int_eq(algo, GW_ALGO_RING);
  /* a forced algorithm whose every time is infinite is still the one picked
   * (it came out ring, which the setting had ruled out) */
  m.bw_gbps[GW_ALGO_TREE][GW_PROTO_SIMPLE] = m.bw_gbps[GW_ALGO_TREE][GW_PROTO_LL] = 1e-307;
  a = args(8, 64u << 20);
  a.algo = GW_ALGO_TREE;
  gw__model_pick(&m, &a, &algo, &proto);
  ck_assert_int_eq(algo, GW_ALGO_TREE);
}
END_TEST

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* Each damaged file is refused with its line named, and the table is unchanged. */
START_TEST(test_corrupt_file_refused) {
  static const struct { const char *text, *line; } bad[] = {
      {"# ok\nring simple 0.1 10\nring simple 0.1\n", ":3:"},
      {"tree ll 0.1 3\n\nbogus ll 0.1 3\n", ":3:"},
      {"ring ll 0.1 x3\n", ":1:"},
      {"ring simple -1 10\n", ":1:"},
      {"ring simple 0.1 0\n", ":1:"},
      {"ring simple 0.1 10\ntree simple 0.1 5\nring simple 0.2 10\n", ":3:"},
      {"ring fast 0.1 10\n", ":1:"},
      {"ring simple 0.1 1e-7\n", ":1:"}, /* an infinite time from some size on */
      {"ring simple 0.1 10 99999999999999999999\n", ":1:"},
  };
  char path[] = "/tmp/gw-tune-XXXXXX";
  make_temp(path);
  struct gw_model def, m;
  gw__model_defaults(&def);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_file(path, bad[i].text);
    m = def;
    struct gw_errctx err = {{0}};
    ck_assert_int_eq(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.msg, bad[i].line) && strstr(err.msg, path), "case %zu: %s", i, err.msg);
    ck_assert_msg(!memcmp(&m, &def, sizeof m), "case %zu changed the table", i);
  }
  struct gw_errctx err;
  write_file(path, "ring simple 0.1 10 99999999999999999999\n");
  ck_assert_int_eq(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "ranks must be a world size from 2 to 1048576"), "%s", err.msg);
  /* Lines of 512 characters or more: a comment may be, a row may not; a last
   * row of 511 without a newline is whole. */
  char text[1400], pad[900];
  memset(pad, ' ', sizeof pad - 1), pad[sizeof pad - 1] = 0;
  snprintf(text, sizeof text, "# %s end of a long comment\nring ll 0.25 4", pad);
  write_file(path, text);
  m = def;
  ck_assert_msg(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS, "a long comment: %s", err.msg);
  ck_assert(m.lat_us[GW_ALGO_RING][GW_PROTO_LL] == 0.25);
  snprintf(text, sizeof text, "ring ll 0.25 4%.*s", 511 - 14, pad);
  write_file(path, text);
  m = def;
  ck_assert_msg(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS, "a last row of 511: %s", err.msg);
  ck_assert(m.lat_us[GW_ALGO_RING][GW_PROTO_LL] == 0.25);
  snprintf(text, sizeof text, "ring ll 0.25 4%.*s\nring simple 1 2\n", 511 - 14, pad);
  write_file(path, text);
  m = def;
  ck_assert_msg(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS, "a row of 511 and its newline: %s", err.msg);
  ck_assert(m.lat_us[GW_ALGO_RING][GW_PROTO_LL] == 0.25 && m.lat_us[GW_ALGO_RING][GW_PROTO_SIMPLE] == 1 &&
            m.bw_gbps[GW_ALGO_RING][GW_PROTO_SIMPLE] == 2);
  FILE *nf = fopen(path, "w"); /* a NUL byte ends a C string: refused, not read as the row before it */
  ck_assert_ptr_nonnull(nf);
  fwrite("ring ll 0.25 4 # x\0y\nring simple 1 2\n", 1, 37, nf);
  fclose(nf);
  ck_assert_int_eq(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, ":1: a NUL byte"), "%s", err.msg);
  m = def;
  snprintf(text, sizeof text, "ring ll 0.25 4%.*s\n", 512 - 14, pad);
  write_file(path, text);
  ck_assert_int_eq(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, ":1: a row of 512 characters or more"), "%s", err.msg);
  /* What never ends or is no file: refused at once (init spun on /dev/zero,
   * and blocked opening a FIFO nobody writes). */
  m = def;
  ck_assert_int_eq(gw__model_load(&m, "/dev/zero", 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "/dev/zero: is not a regular file"), "%s", err.msg);
  char fifo[64];
  snprintf(fifo, sizeof fifo, "%s.fifo", path);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  ck_assert_int_eq(gw__model_load(&m, fifo, 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "is not a regular file"), "%s", err.msg);
  unlink(fifo);
  ck_assert_int_eq(truncate(path, 2 << 20), 0);
  ck_assert_int_eq(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "larger than 1 MiB"), "%s", err.msg);
  /* /proc's files say size 0: pagemap (hundreds of GB, mostly NUL bytes)
   * was read on, in init before the rendezvous, for good; kallsyms (MBs of
   * text) was taken line by line */
  static const char *const procs[] = {"/proc/kallsyms", "/proc/self/pagemap"};
  for (size_t i = 0; i < sizeof procs / sizeof *procs; i++) {
    struct stat psb; /* only where it is such a file here: regular, size 0, over 1 MiB to read (not masked) */
    FILE *pf = stat(procs[i], &psb) == 0 && S_ISREG(psb.st_mode) && psb.st_size == 0 ? fopen(procs[i], "r") : NULL;
    size_t got = 0, k;
    char chunk[4096];
    while (pf && got <= (1u << 20) && (k = fread(chunk, 1, sizeof chunk, pf)) > 0) got += k;
    if (pf) fclose(pf);
    if (got <= (1u << 20)) continue;
    const double t0 = test_now();
    ck_assert_int_eq(gw__model_load(&m, procs[i], 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.msg, "larger than 1 MiB") && test_now() - t0 < 10, "%s after %.1f s: %s", procs[i],
                  test_now() - t0, err.msg);
  }
  ck_assert(memcmp(&m, &def, sizeof m) == 0);
  /* no rows (gw-perf --tune writes some): refused, not the built-in table
   * taken for the file's without a word */
  static const char *const rowless[] = {"", "\n \t\n", "# gradwire tuning file\n# 2 ranks\n\n"};
  for (size_t i = 0; i < sizeof rowless / sizeof *rowless; i++) {
    write_file(path, rowless[i]);
    ck_assert_int_eq(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.msg, "no rows"), "case %zu: %s", i, err.msg);
  }
  write_file(path, "# comment\n  tree ll 0.5 2.5   # trailing\n");
  ck_assert_int_eq(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err), GW_SUCCESS);
  ck_assert(m.lat_us[GW_ALGO_TREE][GW_PROTO_LL] == 0.5 && m.bw_gbps[GW_ALGO_TREE][GW_PROTO_LL] == 2.5);
  ck_assert(m.lat_us[GW_ALGO_RING][GW_PROTO_SIMPLE] == def.lat_us[GW_ALGO_RING][GW_PROTO_SIMPLE]);
  remove_tuned(path);
}
END_TEST

/* gw_tune_write fits times made by a known model back to its constants. */
START_TEST(test_fit_roundtrip) {
  struct gw_model truth;
  gw__model_defaults(&truth);
  static const size_t sizes[] = {8, 4096, 1 << 18, 1 << 22};
  struct gw_tune_sample s[8];
  int ns = 0;
  for (int p = 0; p < 2; p++)
    for (int i = 0; i < 4; i++)
      s[ns++] = (struct gw_tune_sample){"ring", p ? "ll" : "simple", sizes[i],
                                        gw__model_time(&truth, GW_ALGO_RING, p, GW_COLL_ALLREDUCE, sizes[i], 4, 0)};
  char path[] = "/tmp/gw-tune-XXXXXX";
  make_temp(path);
  ck_assert_int_eq(gw_tune_write(path, 4, s, ns, "test"), GW_SUCCESS);
  struct gw_model m;
  memset(&m, 0, sizeof m);
  struct gw_errctx err;
  ck_assert_msg(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS, "%s", err.msg);
  for (int p = 0; p < 2; p++) {
    ck_assert_double_eq_tol(m.lat_us[GW_ALGO_RING][p], truth.lat_us[GW_ALGO_RING][p], 1e-3);
    ck_assert_double_eq_tol(m.bw_gbps[GW_ALGO_RING][p], truth.bw_gbps[GW_ALGO_RING][p], 1e-2);
  }
  remove_tuned(path);
}
END_TEST

/* Four tree/simple samples at 4 ranks, timed by the built-in table (*truth)
 * for trees of `levels` levels (0: flat). */
static void tree_samples(struct gw_model *truth, int levels, struct gw_tune_sample s[4]) {
  static const size_t sizes[] = {8, 4096, 1 << 18, 1 << 22};
  gw__model_defaults(truth);
  for (int i = 0; i < 4; i++)
    s[i] = (struct gw_tune_sample){"tree", "simple", sizes[i],
                                   gw__model_time(truth, GW_ALGO_TREE, 0, GW_COLL_ALLREDUCE, sizes[i], 4, levels)};
}

/* A tree of hierarchical depth (several machines: 5 levels at 4 ranks here)
 * is fitted by the steps it took: the per-step latency comes back, where a fit
 * by world size alone (2 levels) made it 2.5 times too high. */
START_TEST(test_fit_tree_levels) {
  struct gw_model truth;
  struct gw_tune_sample s[4];
  tree_samples(&truth, 5, s);
  char path[] = "/tmp/gw-tune-XXXXXX";
  make_temp(path);
  struct gw_model m;
  struct gw_errctx err;
  for (int levels = 0; levels <= 5; levels += 5) {
    ck_assert_int_eq(gw__tune_write(path, 4, levels, GW_TCLASS_NONE, s, 4, "test"), GW_SUCCESS);
    gw__model_defaults(&m);
    ck_assert_msg(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS, "%s", err.msg);
    const double want = truth.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] * (levels ? 1 : 2.5);
    ck_assert_msg(fabs(m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] - want) < 1e-3, "%d levels: %.4f us per step, not %.4f",
                  levels, m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE], want);
    ck_assert_double_eq_tol(m.bw_gbps[GW_ALGO_TREE][GW_PROTO_SIMPLE], truth.bw_gbps[GW_ALGO_TREE][GW_PROTO_SIMPLE],
                            1e-2);
  }
  ck_assert_int_eq(gw_tune_write_comm(NULL, path, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  /* a destroyed communicator: refused as such (its stale world size went
   * into the file's row; one of 1 rank said "fewer than 2 ranks") */
  gw_comm_t gone;
  ck_assert_int_eq(gw_comm_init(&gone, 1, 0, NULL), GW_SUCCESS);
  ck_assert_int_eq(gw_comm_destroy(gone), GW_SUCCESS);
  ck_assert_int_eq(gw_tune_write_comm(gone, path, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_comm_last_error(NULL), "gw_tune_write_comm: ") &&
                    strstr(gw_comm_last_error(NULL), "is not a live communicator"),
                "%s", gw_comm_last_error(NULL));
  s[2].proto = NULL; /* was a NULL dereference */
  ck_assert_int_eq(gw_tune_write(path, 4, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_comm_last_error(NULL), "sample 2 names algorithm 'tree' and protocol '(null)'"), "%s",
                gw_comm_last_error(NULL));
  s[2].proto = "auto";
  ck_assert_int_eq(gw_tune_write(path, 4, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  s[2].proto = "simple";
  /* more ranks than a communicator may have: said as such (it was "no
   * algorithm and protocol could be fitted") */
  ck_assert_int_eq(gw_tune_write(path, (1 << 20) + 1, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_comm_last_error(NULL), "more ranks than a communicator may have"), "%s",
                gw_comm_last_error(NULL));
  /* nothing to fit (every sample of one size): refused, the file as it was
   * (a header and no rows was written, and success said) */
  write_file(path, "tree simple 0.7 7 2\n");
  tree_samples(&truth, 5, s);
  for (int i = 0; i < 4; i++) s[i].bytes = 4096;
  ck_assert_int_eq(gw_tune_write(path, 4, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_comm_last_error(NULL), "no algorithm and protocol could be fitted"), "%s",
                gw_comm_last_error(NULL));
  char kept[64] = {0};
  FILE *f = fopen(path, "r");
  ck_assert(f && fread(kept, 1, sizeof kept - 1, f) > 0 && fclose(f) == 0);
  ck_assert_msg(!strcmp(kept, "tree simple 0.7 7 2\n"), "the file was rewritten: %s", kept);
  remove_tuned(path);
}
END_TEST

/* Rows for a world size apply only there and win over untagged ones;
 * gw_tune_write keeps the other sizes' rows of the file it rewrites. */
START_TEST(test_rows_per_world_size) {
  char path[] = "/tmp/gw-tune-XXXXXX";
  make_temp(path);
  write_file(path, "tree simple 0.9 8 4\ntree simple 0.5 9\ntree simple 0.7 7 2\nring ll 0.3 3 8\n");
  struct gw_model def, m;
  gw__model_defaults(&def);
  struct gw_errctx err;
  m = def;
  ck_assert_msg(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS, "%s", err.msg);
  ck_assert(m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == 0.9 && m.bw_gbps[GW_ALGO_TREE][GW_PROTO_SIMPLE] == 8);
  ck_assert(m.lat_us[GW_ALGO_RING][GW_PROTO_LL] == def.lat_us[GW_ALGO_RING][GW_PROTO_LL]); /* 8 ranks' row */
  m = def;
  ck_assert(gw__model_load(&m, path, 3, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS && m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == 0.5);
  write_file(path, "tree simple 0.9 8 4\ntree simple 0.8 8 4\n"); /* two rows for 4 ranks */
  ck_assert_int_eq(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
  /* ... refused at every world size (it was at 4 only), naming the second */
  for (int n = 2; n <= 8; n += 6) {
    m = def;
    ck_assert_int_eq(gw__model_load(&m, path, n, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.msg, ":2: a second row") && !memcmp(&m, &def, sizeof m), "%d ranks: %s", n, err.msg);
  }
  write_file(path, "ring ll 0.3 3\ntree simple 0.9 8\nring ll 0.4 3\n");
  ck_assert_int_eq(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, ":3: a second row for this algorithm and protocol without"), "%s", err.msg);
  write_file(path, "tree simple 0.9 8 1\n");
  ck_assert_int_eq(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err), GW_ERR_INVALID_ARGUMENT);
  /* rewrite for 4 ranks: the 2-rank row stays (its second is dropped: kept, it
   * would have every load refuse the file), the old 4-rank row goes */
  write_file(path, "# old\ntree simple 0.7 7 2\ntree simple 0.9 8 4\ntree simple 0.6 6 2\n");
  struct gw_model truth;
  struct gw_tune_sample s[4];
  tree_samples(&truth, 0, s);
  ck_assert_int_eq(gw_tune_write(path, 4, s, 4, "test"), GW_SUCCESS);
  m = def;
  ck_assert(gw__model_load(&m, path, 2, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS && m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == 0.7);
  m = def;
  ck_assert(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS);
  ck_assert_double_eq_tol(m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE], truth.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE], 1e-3);
  remove_tuned(path);
}
END_TEST

/* Rows tagged with a transport apply only to communicators whose ring
 * crosses it at worst, over the untagged and the world size's rows (a file
 * fitted over tcp, loaded over shm, mixed its rows with the built-in ones and
 * picked LL at every size); a rewrite replaces its own transport's rows and
 * the world size's untagged ones, and keeps the other transports'. */
START_TEST(test_rows_per_transport) {
  char path[] = "/tmp/gw-tune-XXXXXX";
  make_temp(path);
  write_file(path, "ring simple 1 2 2\nring simple 3 4 2 tcp\nring simple 5 6 2 shm\ntree ll 7 8 2 ib\n"
                   "ring simple 9 10 4 TCP\n");
  struct gw_model def, m;
  gw__model_defaults(&def);
  struct gw_errctx err;
  static const struct { int tclass; double ring_lat; int applied; } want[] = {
      {GW_TCLASS_NONE, 1, 1}, {GW_TCLASS_SHM, 5, 2}, {GW_TCLASS_IB, 1, 2}, {GW_TCLASS_TCP, 3, 2}};
  for (int i = 0; i < 4; i++) {
    m = def;
    int applied = -1;
    ck_assert_msg(gw__model_load(&m, path, 2, want[i].tclass, &applied, &err) == GW_SUCCESS, "%s", err.msg);
    ck_assert_msg(m.lat_us[GW_ALGO_RING][GW_PROTO_SIMPLE] == want[i].ring_lat && applied == want[i].applied,
                  "over %s: ring latency %g, %d rows", gw__tclass_name(want[i].tclass),
                  m.lat_us[GW_ALGO_RING][GW_PROTO_SIMPLE], applied);
    ck_assert(m.fitted_here[GW_ALGO_RING][GW_PROTO_SIMPLE]);
    const bool ib = want[i].tclass == GW_TCLASS_IB;
    ck_assert(m.lat_us[GW_ALGO_TREE][GW_PROTO_LL] == (ib ? 7 : def.lat_us[GW_ALGO_TREE][GW_PROTO_LL]));
  }
  m = def;
  int applied = -1; /* a world size with no row of its own over shm: none taken, said by the count */
  ck_assert(gw__model_load(&m, path, 4, GW_TCLASS_SHM, &applied, &err) == GW_SUCCESS && applied == 0);
  ck_assert(!memcmp(&m, &def, sizeof m));
  static const char *const bad[][2] = {
      {"ring simple 1 2 2 rdma\n", ":1: unknown transport (shm, ib, tcp)"},
      {"ring simple 1 2 2 tcp\nring simple 1 2 2 tcp\n", ":2: a second row for this algorithm, protocol, world size "
                                                         "and transport"},
      {"ring simple 1 2 2 tcp x\n", ":1: expected 4 to 6 fields"},
      {"ring simple 1 2 tcp\n", ":1: ranks must be a world size"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_file(path, bad[i][0]);
    m = def;
    ck_assert_int_eq(gw__model_load(&m, path, 2, GW_TCLASS_TCP, NULL, &err), GW_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.msg, bad[i][1]) && !memcmp(&m, &def, sizeof m), "%s: %s", bad[i][0], err.msg);
  }
  /* rewritten over tcp at 2 ranks: its tcp row and the untagged 2-rank row
   * (measured over a transport unknown) go; shm's, and 4 ranks', stay */
  write_file(path, "tree simple 1 2 2 shm\ntree simple 3 4 2\ntree simple 5 6 2 tcp\ntree simple 7 8 4 tcp\n");
  struct gw_model truth;
  struct gw_tune_sample s[4];
  tree_samples(&truth, 0, s);
  ck_assert_int_eq(gw__tune_write(path, 2, 0, GW_TCLASS_TCP, s, 4, "test"), GW_SUCCESS);
  m = def;
  ck_assert(gw__model_load(&m, path, 2, GW_TCLASS_SHM, NULL, &err) == GW_SUCCESS);
  ck_assert(m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == 1);
  m = def;
  ck_assert(gw__model_load(&m, path, 4, GW_TCLASS_TCP, NULL, &err) == GW_SUCCESS);
  ck_assert(m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == 7);
  m = def;
  ck_assert(gw__model_load(&m, path, 2, GW_TCLASS_IB, NULL, &err) == GW_SUCCESS); /* the untagged 2-rank row went */
  ck_assert(m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == def.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE]);
  m = def;
  ck_assert(gw__model_load(&m, path, 2, GW_TCLASS_TCP, NULL, &err) == GW_SUCCESS);
  ck_assert(m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] != 5 && m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] != 3);
  FILE *f = fopen(path, "r");
  char all[4096];
  size_t got = f ? fread(all, 1, sizeof all - 1, f) : 0;
  all[got] = 0;
  if (f) fclose(f);
  ck_assert_msg(strstr(all, " 2 tcp\n") && !strstr(all, "tree simple 3 4 2\n"), "%s", all);
  /* gw_tune_write, for no communicator, replaces the size's rows of every
   * transport (kept, they won over the rows it wrote) */
  ck_assert_int_eq(gw_tune_write(path, 2, s, 4, "test"), GW_SUCCESS);
  double fitted = -1;
  for (int t = GW_TCLASS_NONE; t <= GW_TCLASS_TCP; t++) {
    m = def;
    ck_assert(gw__model_load(&m, path, 2, t, NULL, &err) == GW_SUCCESS);
    if (t == GW_TCLASS_NONE) fitted = m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE];
    ck_assert_msg(m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == fitted && fitted != 1 && fitted != 5 && fitted !=
                  def.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE], "over %s: %g", gw__tclass_name(t),
                  m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE]);
  }
  remove_tuned(path);
}
END_TEST

/* The rewrite keeps only rows the loader takes (a bad one kept would have every
 * load refuse the file), writes no row for a fit whose times fall with the
 * size (it wrote 90000 GB/s, and the model then picked it for every size), and
 * goes through a new file renamed over the old one (nothing half written; no
 * temporary file left). */
START_TEST(test_rewrite_safe) {
  char path[] = "/tmp/gw-tune-XXXXXX";
  make_temp(path);
  write_file(path, "tree simple 0.7 7 2\nring ll 0.000 -3 2\nring simple 1 2 3 4 5 6\n"
                   "tree ll 0.12 14.5 8   # fitted on 8 ranks\n");
  struct gw_tune_sample s[8];
  static const size_t sizes[] = {8, 4096, 1 << 18, 1 << 22};
  for (int i = 0; i < 4; i++) {
    s[i] = (struct gw_tune_sample){"ring", "simple", sizes[i], 10.0 + (double)sizes[i] / 1e4};
    s[4 + i] = (struct gw_tune_sample){"ring", "ll", sizes[i], 100.0 - 10.0 * i}; /* falls with the size */
  }
  ck_assert_int_eq(gw_tune_write(path, 4, s, 8, "test"), GW_SUCCESS);
  struct gw_model def, m;
  gw__model_defaults(&def);
  struct gw_errctx err;
  m = def;
  ck_assert_msg(gw__model_load(&m, path, 2, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS, "the rewritten file is refused: %s", err.msg);
  ck_assert(m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == 0.7); /* the good kept row */
  m = def; /* the good row with a comment after it: kept (it was dropped), with its comment */
  ck_assert_msg(gw__model_load(&m, path, 8, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS, "%s", err.msg);
  ck_assert(m.lat_us[GW_ALGO_TREE][GW_PROTO_LL] == 0.12 && m.bw_gbps[GW_ALGO_TREE][GW_PROTO_LL] == 14.5);
  FILE *rf = fopen(path, "r");
  char all[4096];
  size_t got = rf ? fread(all, 1, sizeof all - 1, rf) : 0;
  all[got] = 0;
  if (rf) fclose(rf);
  ck_assert_msg(strstr(all, "tree ll 0.12 14.5 8   # fitted on 8 ranks\n"), "%s", all);
  /* what the writer is given: named */
  ck_assert_int_eq(gw_tune_write(path, 4, s, 1, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_comm_last_error(NULL), "fewer than 2 samples"), "%s", gw_comm_last_error(NULL));
  ck_assert_int_eq(gw_tune_write(path, 4, s, 8, "two\nlines"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_comm_last_error(NULL), "a note of several lines"), "%s", gw_comm_last_error(NULL));
  m = def;
  ck_assert_msg(gw__model_load(&m, path, 4, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS, "%s", err.msg);
  ck_assert(m.lat_us[GW_ALGO_RING][GW_PROTO_LL] == def.lat_us[GW_ALGO_RING][GW_PROTO_LL] &&
            m.bw_gbps[GW_ALGO_RING][GW_PROTO_LL] == def.bw_gbps[GW_ALGO_RING][GW_PROTO_LL]);
  ck_assert(m.bw_gbps[GW_ALGO_RING][GW_PROTO_SIMPLE] != def.bw_gbps[GW_ALGO_RING][GW_PROTO_SIMPLE]);
  char tmp[64];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  ck_assert_msg(access(tmp, F_OK) != 0, "%s left behind", tmp);
  /* A directory that cannot take the new file: an error, the old file whole. */
  char dir[] = "/tmp/gw-tune-dir-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char inside[96], blocker[120];
  snprintf(inside, sizeof inside, "%s/t", dir);
  write_file(inside, "tree simple 0.7 7 2\n");
  snprintf(blocker, sizeof blocker, "%s.tmp.%d", inside, (int)getpid());
  ck_assert_int_eq(mkdir(blocker, 0700), 0); /* fopen of the new file fails */
  ck_assert_int_eq(gw_tune_write(inside, 4, s, 8, "test"), GW_ERR_SYSTEM);
  m = def;
  ck_assert(gw__model_load(&m, inside, 2, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS && m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == 0.7);
  rmdir(blocker);
  remove_tuned(inside);
  rmdir(dir);
  remove_tuned(path);
}
END_TEST

/* What gw_tune_write replaces: a FIFO, a device or a file too large to be a
 * tuning file is refused as it is (the writer blocked on a FIFO for ever,
 * spun on /dev/zero, and put a regular file in /dev/null's place); through a
 * symbolic link the file it names is rewritten and the link stays. */
START_TEST(test_write_refuses_non_files) {
  struct gw_model truth;
  struct gw_tune_sample s[4];
  tree_samples(&truth, 0, s);
  char dir[] = "/tmp/gw-tune-dir-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char fifo[96], big[96], target[96], link[96];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  snprintf(big, sizeof big, "%s/big", dir);
  snprintf(target, sizeof target, "%s/target", dir);
  snprintf(link, sizeof link, "%s/link", dir);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  ck_assert_int_eq(gw_tune_write(fifo, 4, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_comm_last_error(NULL), "is not a regular file"), "%s", gw_comm_last_error(NULL));
  struct stat sb;
  ck_assert(stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
  ck_assert_int_eq(gw_tune_write("/dev/null", 4, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert(stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode));
  FILE *f = fopen(big, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 70000; i++) fputs("# not a tuning file\n", f); /* 1.4 MB */
  ck_assert_int_eq(fclose(f), 0);
  ck_assert_int_eq(gw_tune_write(big, 4, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_comm_last_error(NULL), "larger than 1 MiB"), "%s", gw_comm_last_error(NULL));
  ck_assert(stat(big, &sb) == 0 && sb.st_size == 70000 * 20);
  /* A tuning file that the new rows would take past 1 MiB: not written (it
   * was, and the loader then refused it all, as did the next --tune) */
  f = fopen(big, "w");
  ck_assert_ptr_nonnull(f);
  for (long i = 100, len = 0; len < (1 << 20) - 150; i++) len += fprintf(f, "ring simple 0.1 10 %ld\n", i);
  ck_assert_int_eq(fclose(f), 0);
  ck_assert(stat(big, &sb) == 0 && sb.st_size < (1 << 20));
  const off_t before = sb.st_size;
  ck_assert_int_eq(gw_tune_write(big, 4, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_comm_last_error(NULL), "more than the 1 MiB"), "%s", gw_comm_last_error(NULL));
  ck_assert(stat(big, &sb) == 0 && sb.st_size == before);
  ck_assert_int_eq(symlink(target, link), 0); /* to nothing yet: refused, the link kept */
  ck_assert_int_eq(gw_tune_write(link, 4, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
  write_file(target, "tree simple 0.7 7 2\n");
  ck_assert_int_eq(gw_tune_write(link, 4, s, 4, "test"), GW_SUCCESS);
  ck_assert(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
  struct gw_model m, def;
  gw__model_defaults(&def);
  struct gw_errctx err;
  m = def; /* the target has the kept 2-rank row and the new 4-rank ones */
  ck_assert(gw__model_load(&m, target, 2, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS && m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == 0.7);
  m = def;
  ck_assert(gw__model_load(&m, target, 4, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS);
  ck_assert_double_eq_tol(m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE], truth.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE], 1e-3);
  unlink(fifo);
  unlink(link);
  remove_tuned(big);
  remove_tuned(target);
  rmdir(dir);
}
END_TEST

/* Nor does it replace a regular file that is no tuning file: one with a NUL
 * byte (a checkpoint given by mistake) or lines of which none is a row the
 * loader takes (notes); gw-perf replaced both with its rows.  An empty file or
 * one of comments, and a tuning file with some bad rows (dropped), are
 * rewritten; gw__tune_replaceable (gw-perf's check before it measures) says
 * the same without writing. */
START_TEST(test_write_refuses_foreign_files) {
  struct gw_model truth;
  struct gw_tune_sample s[4];
  tree_samples(&truth, 0, s);
  char path[] = "/tmp/gw-tune-XXXXXX", why[300];
  make_temp(path);
  static const char bin[] = "\x20\0\0\0\0\0\0\0{\"w\":{}}";
  FILE *f = fopen(path, "w");
  ck_assert(f && fwrite(bin, 1, sizeof bin - 1, f) == sizeof bin - 1 && fclose(f) == 0);
  ck_assert_int_eq(gw__tune_replaceable(path, why, sizeof why), -1);
  ck_assert_msg(strstr(why, "holds a NUL byte (line 1): not a tuning file"), "%s", why);
  ck_assert_int_eq(gw_tune_write(path, 4, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_comm_last_error(NULL), "holds a NUL byte"), "%s", gw_comm_last_error(NULL));
  struct stat sb;
  ck_assert(stat(path, &sb) == 0 && sb.st_size == (off_t)sizeof bin - 1);
  const char *notes = "# shopping\nremember the milk\nring simple 1 2 3 4 5 6\n";
  write_file(path, notes);
  ck_assert_int_eq(gw__tune_replaceable(path, why, sizeof why), -1);
  ck_assert_msg(strstr(why, "has none of a tuning file's rows (line 2 of 3: \"remember the milk\")"), "%s", why);
  ck_assert_int_eq(gw_tune_write(path, 4, s, 4, "test"), GW_ERR_INVALID_ARGUMENT);
  ck_assert(stat(path, &sb) == 0 && sb.st_size == (off_t)strlen(notes));
  /* rewritten: empty, comments only, a tuning file with a bad row beside a
   * good one, and one the writer's header begins whatever else it holds (a
   * row cut short, NUL bytes: what a crash left) */
  static const char *const ok[] = {"", "# comments\n\n# only\n",
                                   "# gradwire tuning file (GW_TUNING_FILE), written by gw-perf --tune: 4 ranks\n"
                                   "ring simple 1.2",
                                   "remember the milk\ntree simple 0.7 7 2\n"};
  for (int i = 0; i < 4; i++) {
    write_file(path, ok[i]);
    ck_assert_msg(gw__tune_replaceable(path, why, sizeof why) == 0, "%d: %s", i, why);
    ck_assert_msg(gw_tune_write(path, 4, s, 4, "test") == GW_SUCCESS, "%d: %s", i, gw_comm_last_error(NULL));
  }
  static const char ours_nul[] = "# gradwire tuning file (GW_TUNING_FILE), written by gw-perf --tune\n\0\0\0\0";
  f = fopen(path, "w");
  ck_assert(f && fwrite(ours_nul, 1, sizeof ours_nul - 1, f) == sizeof ours_nul - 1 && fclose(f) == 0);
  ck_assert_msg(gw__tune_replaceable(path, why, sizeof why) == 0, "%s", why);
  ck_assert_msg(gw_tune_write(path, 4, s, 4, "test") == GW_SUCCESS, "%s", gw_comm_last_error(NULL));
  /* a header that only begins like the writer's is no proof */
  write_file(path, "# gradwire tuning files: my notes\nremember the milk\n");
  ck_assert_int_eq(gw__tune_replaceable(path, why, sizeof why), -1);
  write_file(path, ok[3]);
  ck_assert(gw_tune_write(path, 4, s, 4, "test") == GW_SUCCESS);
  struct gw_model m, def;
  gw__model_defaults(&def);
  struct gw_errctx err;
  m = def; /* the good row stayed */
  ck_assert(gw__model_load(&m, path, 2, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS && m.lat_us[GW_ALGO_TREE][GW_PROTO_SIMPLE] == 0.7);
  remove_tuned(path);
  ck_assert_int_eq(gw__tune_replaceable(path, why, sizeof why), 0); /* no file */
}
END_TEST

/* Oversubscribed cores (some rank's machine runs more ranks than it has
 * cores for them): every step costs a trip through the scheduler, so fewer
 * steps win: at 4 ranks recursive doubling up to its limit, where the 2-rank
 * table picks the ring from about 16 KiB (measured at 4 ranks on 2 cores,
 * 64 KiB: recursive doubling 24-29 us, the ring 47-48).  A row fitted for this
 * very world size measured the scheduler already and gets nothing added. */
START_TEST(test_oversub_picks) {
  struct gw_model m;
  gw__model_defaults(&m);
  struct gw_pick_args a = args(4, 64 << 10);
  a.rd_ok = true;
  int algo, proto;
  gw__model_pick(&m, &a, &algo, &proto);
  ck_assert_msg(algo == GW_ALGO_RING, "64 KiB, cores of their own: picked %s", gw__algo_name(algo));
  m.oversub_step_us = GW_MODEL_OVERSUB_STEP_US;
  gw__model_pick(&m, &a, &algo, &proto);
  ck_assert_msg(algo == GW_ALGO_EXCHANGE, "64 KiB, oversubscribed: picked %s", gw__algo_name(algo));
  a.bytes = 64u << 20;
  gw__model_pick(&m, &a, &algo, &proto);
  ck_assert_msg(algo == GW_ALGO_RING, "64 MiB, oversubscribed: picked %s", gw__algo_name(algo));
  /* the ring's row fitted at 4 ranks: its time has no scheduler added, the
   * exchange's (untagged) has; at 2 ranks neither row is this size's */
  char path[] = "/tmp/gw-tune-XXXXXX";
  make_temp(path);
  write_file(path, "ring simple 0.12 14.5 4\nexchange simple 0.18 14.5\n");
  struct gw_errctx err;
  for (int n = 2; n <= 4; n += 2) {
    gw__model_defaults(&m);
    ck_assert_msg(gw__model_load(&m, path, n, GW_TCLASS_NONE, NULL, &err) == GW_SUCCESS, "%s", err.msg);
    const double ring_bare = gw__model_time(&m, GW_ALGO_RING, GW_PROTO_SIMPLE, GW_COLL_ALLREDUCE, 4096, n, 0),
                 ex_bare = gw__model_time(&m, GW_ALGO_EXCHANGE, GW_PROTO_SIMPLE, GW_COLL_ALLREDUCE, 4096, n, 0);
    m.oversub_step_us = GW_MODEL_OVERSUB_STEP_US;
    const double ring = gw__model_time(&m, GW_ALGO_RING, GW_PROTO_SIMPLE, GW_COLL_ALLREDUCE, 4096, n, 0),
                 ex = gw__model_time(&m, GW_ALGO_EXCHANGE, GW_PROTO_SIMPLE, GW_COLL_ALLREDUCE, 4096, n, 0);
    ck_assert_msg(n == 4 ? ring == ring_bare : ring > ring_bare + 2 * (n - 1) * 4.9, "%d ranks: ring %g, bare %g", n,
                  ring, ring_bare);
    ck_assert_msg(ex > ex_bare + 4.9, "%d ranks: exchange %g, bare %g", n, ex, ex_bare);
  }
  remove_tuned(path);
}
END_TEST

/* Every rank works out the same oversubscription from the rendezvous table,
 * though only ranks 0 and 1 share a core (rank 2 has one of its own): the
 * model's tables agree (init compares their digests) and a 16 KiB allreduce
 * takes recursive doubling on every rank (the ring without the scheduler's
 * cost).  Needs 2 CPUs (any two this process may use). */
static int cpu_pair[2]; /* the first two CPUs this process may use (set before the ranks fork) */

static int raw_oversub_agree(int rank, int n, const char *master, void *arg) {
  (void)arg;
  static const char *const decide[] = {"GW_ALGO", "GW_PROTO", "GW_EXCHANGE_MAX_BYTES", "GW_TUNING_FILE"};
  for (size_t i = 0; i < sizeof decide / sizeof decide[0]; i++) unsetenv(decide[i]); /* the built-in choice */
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu_pair[rank == 2], &one);
  EXPECT(sched_setaffinity(0, sizeof one, &one) == 0, "sched_setaffinity: %s", strerror(errno));
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  EXPECT(r == GW_SUCCESS, "init: %s", gw_comm_last_error(NULL));
  static float x[4096];
  EXPECT(gw_allreduce(x, x, 4096, GW_FLOAT32, GW_SUM, comm, NULL) == GW_SUCCESS, "%s", gw_comm_last_error(comm));
  char path[32];
  EXPECT(gw_comm_last_path(comm, path, sizeof path) == GW_SUCCESS && !strcmp(path, "exchange/simple"),
         "rank %d: 16 KiB took %s", rank, path);
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(test_oversub_agree) {
  cpu_set_t mine;
  ck_assert_int_eq(sched_getaffinity(0, sizeof mine, &mine), 0);
  int found = 0;
  for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
    if (CPU_ISSET(c, &mine)) cpu_pair[found++] = c;
  if (found < 2) {
    printf("test_oversub_agree: 1 CPU here: not run\n");
    return;
  }
  ck_assert_int_eq(run_ranks_raw(3, raw_oversub_agree, NULL, 90), 0);
}
END_TEST

/* GW_EXCHANGE_MAX_BYTES unset: 2 ranks on shm (one channel) take the exchange
 * at every size (it ran the ring from 512 KiB, at about half the exchange's
 * bus bandwidth up to 8 MiB); over tcp, or with the variable set, the ring
 * past the cap. */
static char transport_file[64]; /* cases 3 and 4: a tuning file's row tagged tcp, then shm */

static int raw_exchange_cap(int rank, int n, const char *master, void *arg) {
  const int which = *(const int *)arg;
  static const char *const decide[] = {"GW_ALGO", "GW_PROTO", "GW_EXCHANGE_MAX_BYTES", "GW_TUNING_FILE",
                                       "GW_TRANSPORT", "GW_NCHANNELS"};
  for (size_t i = 0; i < sizeof decide / sizeof decide[0]; i++) unsetenv(decide[i]);
  if (which == 1) setenv("GW_TRANSPORT", "tcp", 1);
  if (which == 2) setenv("GW_EXCHANGE_MAX_BYTES", "262144", 1);
  if (which >= 3) setenv("GW_TUNING_FILE", transport_file, 1);
  gw_comm_t comm;
  EXPECT(gw_comm_init(&comm, n, rank, master) == GW_SUCCESS, "init: %s", gw_comm_last_error(NULL));
  static float x[1 << 20]; /* 4 MiB */
  for (int i = 0; i < 1 << 20; i++) x[i] = (float)(i % 1000 + rank);
  EXPECT(gw_allreduce(x, x, 1 << 20, GW_FLOAT32, GW_SUM, comm, NULL) == GW_SUCCESS, "%s", gw_comm_last_error(comm));
  for (int i = 0; i < 1 << 20; i++) EXPECT(x[i] == (float)(2 * (i % 1000) + 1), "element %d: %g", i, (double)x[i]);
  char path[32];
  const char *want = which == 0 || which == 3 ? "exchange/simple" : which == 4 ? "exchange/ll" : "ring/simple";
  EXPECT(gw_comm_last_path(comm, path, sizeof path) == GW_SUCCESS && !strcmp(path, want),
         "case %d, rank %d: 4 MiB took %s, not %s", which, rank, path, want);
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(test_exchange_cap) {
  for (int which = 0; which < 3; which++) ck_assert_int_eq(run_ranks_raw(2, raw_exchange_cap, &which, 60), 0);
}
END_TEST

/* A communicator loads the rows of its own transport only: an LL row fitted
 * over tcp, absurdly fast, is not taken by 2 ranks over shm (4 MiB stays
 * exchange/simple, the built-in pick; cases 3 and 4 of raw_exchange_cap), and
 * taken when tagged shm. */
START_TEST(test_transport_rows_picked) {
  static const char *const tags[] = {"tcp", "shm"};
  for (int i = 0; i < 2; i++) {
    snprintf(transport_file, sizeof transport_file, "/tmp/gw-tune-XXXXXX");
    make_temp(transport_file);
    char rows[64];
    snprintf(rows, sizeof rows, "exchange ll 0 90000 2 %s\n", tags[i]);
    write_file(transport_file, rows);
    int which = 3 + i;
    ck_assert_int_eq(run_ranks_raw(2, raw_exchange_cap, &which, 60), 0);
    unlink(transport_file);
  }
}
END_TEST

/* Ranks that would decide differently fail at init, naming what differs. */
static char other_file[64]; /* rank 1's tuning file (the ranks are forked after it is set) */

static int raw_settings_differ(int rank, int n, const char *master, void *arg) {
  const char *what = arg, *eq = strchr(what, '=');
  char var[64] = "";
  if (eq) snprintf(var, sizeof var, "%.*s", (int)(eq - what), what);
  if (eq && rank == 1) setenv(var, eq + 1, 1); /* VAR=value on rank 1 only: the message names its value */
  else if (!strcmp(what, "GW_PROTO")) setenv("GW_PROTO", rank == 1 ? "ll" : "simple", 1);
  else if (!eq) setenv("GW_TUNING_FILE", rank == 1 ? other_file : "/dev/null", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  const char *named = eq ? what : !strcmp(what, "GW_PROTO") ? (rank == 1 ? "GW_PROTO=simple" : "GW_PROTO=ll")
                                                             : "cost model";
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && strstr(gw_comm_last_error(NULL), named), "init returned %s: %s",
         gw_strerror(r), gw_comm_last_error(NULL));
  /* and only what differs (all nine settings, both ranks', hid it) */
  const char *msg = gw_comm_last_error(NULL);
  EXPECT((!strstr(msg, "GW_SHM_SLOTS=") || strstr(what, "GW_SHM_SLOTS=")) &&
             (!strstr(msg, "cost model") || !eq) && (!strstr(msg, "GW_ALGO=") || strstr(what, "GW_ALGO=")),
         "the message names settings that do not differ: %s", msg);
  if (!eq && strcmp(what, "GW_PROTO"))
    EXPECT(strstr(msg, rank == 1 ? other_file : "GW_TUNING_FILE=/dev/null"), "the message does not name this rank's "
           "tuning file: %s", msg);
  /* /dev/null is refused (no regular file): rank 0 runs the built-in table
   * and says so (it named the file as its model's source) */
  if (!eq && strcmp(what, "GW_PROTO") && rank != 1)
    EXPECT(strstr(msg, "(the built-in one: GW_TUNING_FILE=/dev/null was refused)"), "rank %d: %s", rank, msg);
  if (!eq && strcmp(what, "GW_PROTO") && rank == 1)
    EXPECT(strstr(msg, "(from GW_TUNING_FILE="), "rank 1: %s", msg);
  return 0;
}

START_TEST(test_settings_must_agree) {
  ck_assert_int_eq(run_ranks_raw(3, raw_settings_differ, "GW_PROTO", 90), 0);
  snprintf(other_file, sizeof other_file, "/tmp/gw-tune-other-%d", (int)getpid());
  write_file(other_file, "ring simple 1 1\n");
  ck_assert_int_eq(run_ranks_raw(3, raw_settings_differ, "GW_TUNING_FILE", 90), 0);
  unlink(other_file);
  /* every other setting the ranks compare (none was tested: dropped from the
   * comparison, a difference failed later or hung) */
  static const char *const one_differs[] = {"GW_NCHANNELS=2", "GW_SHM_SLOTS=4", "GW_SHM_SLOT_BYTES=65536",
                                            "GW_CHANNEL_MIN_BYTES=4096", "GW_ALGO=ring", "GW_EXCHANGE_MAX_BYTES=1024"};
  for (size_t i = 0; i < sizeof one_differs / sizeof one_differs[0]; i++)
    ck_assert_msg(run_ranks_raw(3, raw_settings_differ, (void *)one_differs[i], 90) == 0, "%s", one_differs[i]);
}
END_TEST

/* GW_TRANSPORT alike on every rank: a name that is no transport is said as
 * such (it read "no transport connects it with rank 1"), and the names are
 * taken in any case, as GW_ALGO's and GW_PROTO's. */
static int raw_transport_named(int rank, int n, const char *master, void *arg) {
  const char *v = arg;
  setenv("GW_TRANSPORT", v, 1);
  gw_comm_t comm;
  const gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  unsetenv("GW_TRANSPORT");
  if (!strcmp(v, "SHM")) {
    EXPECT(r == GW_SUCCESS, "GW_TRANSPORT=SHM: init returned %s: %s", gw_strerror(r), gw_comm_last_error(NULL));
  } else {
    char want[80];
    snprintf(want, sizeof want, "rank %d: GW_TRANSPORT=%s is not a transport: shm, ib or tcp", rank, v);
    EXPECT(r == GW_ERR_INVALID_ARGUMENT && strstr(gw_comm_last_error(NULL), want), "init returned %s: %s",
           gw_strerror(r), gw_comm_last_error(NULL));
  }
  return 0;
}

START_TEST(test_transport_name) {
  ck_assert_int_eq(run_ranks_raw(2, raw_transport_named, "bogus", 90), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_transport_named, "SHM", 90), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("tune");
  TCase *tc = tcase_create("tune");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_default_picks);
  tcase_add_test(tc, test_rd_picks);
  tcase_add_test(tc, test_oversub_picks);
  tcase_add_test(tc, test_oversub_agree);
  tcase_add_test(tc, test_exchange_cap);
  tcase_add_test(tc, test_rows_per_world_size);
  tcase_add_test(tc, test_rows_per_transport);
  tcase_add_test(tc, test_transport_rows_picked);
  tcase_add_test(tc, test_rewrite_safe);
  tcase_add_test(tc, test_write_refuses_non_files);
  tcase_add_test(tc, test_write_refuses_foreign_files);
  tcase_add_test(tc, test_overrides);
  tcase_add_test(tc, test_corrupt_file_refused);
  tcase_add_test(tc, test_fit_roundtrip);
  tcase_add_test(tc, test_fit_tree_levels);
  tcase_add_test(tc, test_settings_must_agree);
  tcase_add_test(tc, test_transport_name);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
