/* test_data_loader.c - the loader and the folder dataset where something other
 * than a bad file goes wrong:
 * - a worker thread that cannot start (GW_LOADER_TEST_FAIL_THREAD) after
 *   others claimed batches: the retried stream equals an undisturbed one;
 * - a stop (free) while workers search a shard of unreadable samples returns
 *   within a file, not a shard;
 * - a dataset error from one of several workers reaches gw_loader_next, after
 *   the batches before it, naming the sample, and stays until a seek;
 * - out of descriptors (RLIMIT_NOFILE, in a child process) and out of memory
 *   for the decoded image (RLIMIT_AS): errors naming the file, not samples
 *   quietly replaced.
 * A scripted dataset (this file's) gives each sample a fate and a decode time. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data_internal.h"
#include "harness.h"
#include "loader.h"
#include "sampler.h"
#include "test_data.h"

/* ---- a scripted dataset ------------------------------------------------------------ */

/* Sample i is fate[i]: 'o' decoded (values from i and key), 's' skipped, 'e' an
 * error; every get first sleeps sleep_us. */
struct scripted {
  struct gw_dataset base;
  char *fate;
  int sleep_us;
  atomic_long gets;
};

static gw_result_t scripted_get(const struct gw_dataset *ds, int64_t index, int train, uint64_t key, float *out,
                                int32_t *label) {
  struct scripted *d = (struct scripted *)ds;
  (void)train;
  atomic_fetch_add(&d->gets, 1);
  if (d->sleep_us) usleep((useconds_t)d->sleep_us);
  if (d->fate[index] == 's') return gw__model_fail(GW_DATA_SKIPPED, "scripted/%lld.jpg: unreadable", (long long)index);
  if (d->fate[index] == 'e')
    return gw__model_fail(GW_ERR_SYSTEM, "scripted/%lld.jpg: the disk went away", (long long)index);
  for (size_t i = 0; i < gw_dataset_sample_floats(ds); i++) out[i] = (float)index + (float)((key >> i) & 1023) / 1024;
  *label = (int32_t)(index % ds->classes);
  return GW_SUCCESS;
}

static void scripted_destroy(struct gw_dataset *ds) {
  free(((struct scripted *)ds)->fate);
  free(ds);
}

static const struct gw_dataset_ops SCRIPTED_OPS = {scripted_get, scripted_destroy};

/* n samples of 1 x 4 x 4, all 'o'. */
static struct scripted *scripted_new(int64_t n, int sleep_us) {
  struct scripted *d = calloc(1, sizeof *d);
  d->fate = malloc((size_t)n);
  memset(d->fate, 'o', (size_t)n);
  d->base.ops = &SCRIPTED_OPS;
  d->base.size = n;
  d->base.c = 1;
  d->base.h = d->base.w = 4;
  d->base.classes = 10;
  snprintf(d->base.description, sizeof d->base.description, "scripted (%lld samples)", (long long)n);
  d->sleep_us = sleep_us;
  atomic_init(&d->gets, 0);
  return d;
}

static struct gw_loader *scripted_loader(struct scripted *d, int shuffle, int batch, int threads, int depth,
                                         int64_t epochs) {
  struct gw_sampler s;
  ck_assert_int_eq(gw_sampler_init(&s, d->base.size, 1, 0, shuffle, 0, 9), GW_SUCCESS);
  struct gw_loader_config cfg;
  gw_loader_config_default(&cfg);
  cfg.batch = batch, cfg.threads = threads, cfg.depth = depth, cfg.train = 1, cfg.epochs = epochs, cfg.seed = 4;
  struct gw_loader *l;
  ck_assert_msg(gw_loader_init(&l, &d->base, &s, &cfg) == GW_SUCCESS, "%s", gw_data_last_error());
  return l;
}

/* Every batch of a finite stream, x then y, one after another. */
struct stream {
  float *x;
  int32_t *y;
  int64_t meta[64][3]; /* epoch, position, n */
  int n;
};

static void take_all(struct gw_loader *l, struct stream *st, int batch, size_t floats) {
  const struct gw_batch *b;
  st->n = 0;
  for (;;) {
    ck_assert_msg(gw_loader_next(l, &b) == GW_SUCCESS, "%s", gw_data_last_error());
    if (!b) break;
    ck_assert_int_lt(st->n, 64);
    memcpy(st->x + (size_t)st->n * batch * floats, b->x, (size_t)b->n * floats * sizeof(float));
    memcpy(st->y + (size_t)st->n * batch, b->y, (size_t)b->n * sizeof(int32_t));
    st->meta[st->n][0] = b->epoch, st->meta[st->n][1] = b->position, st->meta[st->n][2] = b->n;
    st->n++;
  }
}

/* ---- a worker that cannot start ---------------------------------------------------- */

/* Thread 2 of 3 fails to start once threads 0 and 1 each claimed a batch, and
 * they are stopped part way through decoding it (3 ms a sample, 8 a batch).
 * The call fails; the next one starts the stream over as if nothing had
 * happened: batch 0 is whole, and every batch equals an undisturbed run's. */
START_TEST(loader_thread_start_fails) {
  struct scripted *d = scripted_new(64, 3000);
  const size_t floats = gw_dataset_sample_floats(&d->base);
  struct stream ref = {calloc(64 * 8 * floats, sizeof(float)), calloc(64 * 8, sizeof(int32_t)), {{0}}, 0};
  struct stream got = {calloc(64 * 8 * floats, sizeof(float)), calloc(64 * 8, sizeof(int32_t)), {{0}}, 0};
  struct gw_loader *l = scripted_loader(d, 1, 8, 3, 0, 1);
  take_all(l, &ref, 8, floats);
  ck_assert_int_eq(ref.n, 8);
  gw_loader_free(l);

  l = scripted_loader(d, 1, 8, 3, 0, 1);
  setenv("GW_LOADER_TEST_FAIL_THREAD", "2", 1);
  const struct gw_batch *b = (const struct gw_batch *)1;
  expect_error(gw_loader_next(l, &b), "loader", "cannot start worker thread 2 of 3");
  unsetenv("GW_LOADER_TEST_FAIL_THREAD");
  ck_assert_ptr_null(b);
  int64_t epoch, pos;
  gw_loader_state(l, &epoch, &pos);
  ck_assert(epoch == 0 && pos == 0);
  take_all(l, &got, 8, floats);
  ck_assert_int_eq(got.n, 8);
  ck_assert(memcmp(got.meta, ref.meta, sizeof ref.meta) == 0);
  ck_assert_msg(memcmp(got.x, ref.x, 64 * floats * sizeof(float)) == 0, "the retried stream differs");
  ck_assert(memcmp(got.y, ref.y, 64 * sizeof(int32_t)) == 0);
  ck_assert_int_eq(gw_loader_skipped(l), 0);
  gw_loader_free(l);
  free(ref.x), free(ref.y), free(got.x), free(got.y);
  gw_dataset_free(&d->base);
}
END_TEST

/* ---- a stop during a long search --------------------------------------------------- */

/* Sample 0 is the only readable one of 3000 (5 ms each): after batch 0, both
 * workers search about 15 s for a stand-in.  gw_loader_free stops them within
 * a file (2 s allowed for a loaded machine). */
START_TEST(loader_stop_in_search) {
  struct scripted *d = scripted_new(3000, 5000);
  memset(d->fate + 1, 's', 2999);
  struct gw_loader *l = scripted_loader(d, 0, 1, 2, 2, 0);
  const struct gw_batch *b;
  ck_assert_msg(gw_loader_next(l, &b) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert(b && b->n == 1 && b->y[0] == 0 && !b->stand_in[0]);
  usleep(50 * 1000); /* the workers are well into batches 1 and 2 */
  const long before = atomic_load(&d->gets);
  const double t0 = test_now();
  gw_loader_free(l);
  const double took = test_now() - t0;
  ck_assert_msg(took < 2, "gw_loader_free took %.2f s (%ld files looked at meanwhile)", took,
                atomic_load(&d->gets) - before);
  gw_dataset_free(&d->base);
}
END_TEST

/* ---- an error from one of several workers ------------------------------------------ */

/* 40 samples in order, batches of 4, 3 workers: sample 29 fails (not a skip);
 * sample 13 is skipped, and its stand-in is augmented anew.
 * Batches 0-6 arrive whole; batch 7 (positions 28-31) is the error, naming the
 * sample, on this call and the next; a seek clears it. */
START_TEST(loader_worker_error) {
  struct scripted *d = scripted_new(40, 200);
  d->fate[29] = 'e';
  d->fate[13] = 's'; /* a skip on the way is still a skip */
  struct gw_loader *l = scripted_loader(d, 0, 4, 3, 0, 1);
  const struct gw_batch *b;
  for (int k = 0; k < 7; k++) {
    ck_assert_msg(gw_loader_next(l, &b) == GW_SUCCESS, "batch %d: %s", k, gw_data_last_error());
    ck_assert(b && b->position == 4 * k && b->n == 4);
    ck_assert_int_eq(b->skipped, k == 3);
    /* place 13's stand-in is sample 14, also at place 14: not its copy (the
     * augmentation key is the place's; it was the sample's alone) */
    if (k == 3)
      ck_assert_msg(b->stand_in[1] && b->y[1] == b->y[2] && memcmp(b->x + 16, b->x + 32, 16 * sizeof *b->x) != 0,
                    "the stand-in at place 13 is sample 14's exact copy");
  }
  for (int again = 0; again < 2; again++) {
    gw_result_t res = gw_loader_next(l, &b);
    ck_assert_int_eq(res, GW_ERR_SYSTEM);
    ck_assert_ptr_null(b);
    expect_error(res, "scripted/29.jpg", "the disk went away");
  }
  ck_assert_int_eq(gw_loader_skipped(l), 1);
  ck_assert_int_eq(gw_loader_seek(l, 0, 28), GW_SUCCESS); /* stops the workers */
  d->fate[29] = 'o';
  ck_assert_msg(gw_loader_next(l, &b) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert(b && b->position == 28 && b->y[1] == 29 % 10);
  gw_loader_free(l);
  gw_dataset_free(&d->base);
}
END_TEST

/* ---- limits of the process, in a child ------------------------------------------- */

/* Opens tmpdir's training split at 32 x 32 and runs body on it in a child
 * process, which must pass (exit 0; it says why on stderr otherwise): a limit
 * lowered there leaves this process alone.  Removes tmpdir. */
static void in_child(int (*body)(struct gw_dataset *ds)) {
  struct gw_dataset *ds;
  ck_assert_msg(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32) == GW_SUCCESS, "%s", gw_data_last_error());
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) _exit(body(ds));
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status 0x%x)", status);
  gw_dataset_free(ds);
  remove_tmpdir();
}

#define CHILD_EXPECT(cond, ...)          \
  do {                                   \
    if (!(cond)) {                       \
      fprintf(stderr, __VA_ARGS__);      \
      fprintf(stderr, " [line %d]\n", __LINE__); \
      return 1;                          \
    }                                    \
  } while (0)

/* Sample 0 of ds is an error (not a skip) whose message names file and why. */
static int expect_get_error(struct gw_dataset *ds, const char *file, const char *why) {
  static float out[3 * 32 * 32];
  int32_t y;
  gw_result_t res = gw_dataset_get(ds, 0, 1, 7, out, &y);
  const char *msg = gw_data_last_error();
  CHILD_EXPECT(res == GW_ERR_SYSTEM && strstr(msg, file) && strstr(msg, why),
               "get: result %d, \"%s\": expected an error naming %s and \"%s\"", res, msg, file, why);
  return 0;
}

/* Runs under(ds) with the soft limit of resource at cur, then checks that
 * sample 0 decodes with the limit back. */
static int under_limit(struct gw_dataset *ds, int resource, rlim_t cur, int (*under)(struct gw_dataset *ds)) {
  struct rlimit was, lim;
  CHILD_EXPECT(getrlimit(resource, &was) == 0, "getrlimit: %s", strerror(errno));
  lim = was;
  lim.rlim_cur = cur;
  CHILD_EXPECT(setrlimit(resource, &lim) == 0, "setrlimit: %s", strerror(errno));
  if (under(ds)) return 1;
  CHILD_EXPECT(setrlimit(resource, &was) == 0, "setrlimit: %s", strerror(errno));
  static float out[3 * 32 * 32];
  int32_t y;
  CHILD_EXPECT(gw_dataset_get(ds, 0, 1, 7, out, &y) == GW_SUCCESS, "get with the limit back: %s", gw_data_last_error());
  return 0;
}

/* Out of descriptors: sample 0 is an error naming its file and the reason,
 * directly and through a loader of 3 workers. */
static int descriptors_gone(struct gw_dataset *ds) {
  if (expect_get_error(ds, "train/ant/e.jpg", strerror(EMFILE)) || expect_get_error(ds, "train/ant/e.jpg", "ulimit -n"))
    return 1;
  struct gw_sampler s;
  gw_sampler_init(&s, gw_dataset_size(ds), 1, 0, 0, 0, 0);
  struct gw_loader_config cfg;
  gw_loader_config_default(&cfg);
  cfg.batch = 2, cfg.threads = 3;
  struct gw_loader *l;
  CHILD_EXPECT(gw_loader_init(&l, ds, &s, &cfg) == GW_SUCCESS, "loader: %s", gw_data_last_error());
  const struct gw_batch *b;
  gw_result_t res = gw_loader_next(l, &b);
  const char *msg = gw_data_last_error();
  CHILD_EXPECT(res == GW_ERR_SYSTEM && !b && strstr(msg, "train/ant/e.jpg") && strstr(msg, strerror(EMFILE)),
               "loader: result %d, \"%s\": expected the worker's error naming the file", res, msg);
  CHILD_EXPECT(gw_loader_skipped(l) == 0, "loader: %lld samples replaced", (long long)gw_loader_skipped(l));
  gw_loader_free(l);
  return 0;
}

/* The limit at the lowest free descriptor: none is left. */
static int no_descriptors(struct gw_dataset *ds) {
  int lowest = open("/dev/null", O_RDONLY);
  CHILD_EXPECT(lowest >= 0, "/dev/null: %s", strerror(errno));
  close(lowest);
  return under_limit(ds, RLIMIT_NOFILE, (rlim_t)lowest, descriptors_gone);
}

START_TEST(folder_out_of_descriptors) {
  make_tree();
  in_child(no_descriptors);
}
END_TEST

/* This process's address space in bytes (VmSize), 0 if unknown. */
static size_t vm_size(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  size_t kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmSize: %zu kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb * 1024;
}

static int memory_gone(struct gw_dataset *ds) { return expect_get_error(ds, "train/a/huge.jpg", "out of memory"); }

/* 12 MB of address space to spare: a 6000 x 4000 image (72 MB decoded,
 * beyond what malloc takes from its heap) does not fit. */
static int no_memory(struct gw_dataset *ds) {
  size_t vm = vm_size();
  CHILD_EXPECT(vm > 0, "no VmSize in /proc/self/status");
  return under_limit(ds, RLIMIT_AS, vm + (12u << 20), memory_gone);
}

START_TEST(folder_decode_out_of_memory) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  /* The sanitizers' allocators end the process when memory runs out (they do
   * not return NULL), and their shadow memory does not fit an address limit. */
  printf("folder_decode_out_of_memory: not run under a sanitizer\n");
  return;
#endif
  make_tmpdir();
  mkdirs("train/a");
  static const unsigned char grey[3] = {128, 128, 128};
  write_jpeg("train/a/huge.jpg", 6000, 4000, 0, grey, 1);
  in_child(no_memory);
}
END_TEST

/* The padded list's repeats (DistributedSampler without drop_last: 10000
 * samples on 3 ranks, entries 10000 and 10001 repeat order[0] and order[1])
 * are augmented anew: rank 1's last place holds sample 0 again, which got
 * the very crop and flip of rank 0's first place in every epoch. */
START_TEST(loader_padded_repeat_augmented_anew) {
  struct gw_dataset *ds;
  ck_assert_int_eq(gw_dataset_fashion_mnist(&ds, FMNIST_DIR, GW_SPLIT_VAL, 1), GW_SUCCESS);
  const int64_t n = gw_dataset_size(ds);
  ck_assert_int_eq(n % 3, 1);
  struct gw_loader_config cfg;
  gw_loader_config_default(&cfg);
  cfg.batch = 1, cfg.threads = 1, cfg.train = 1, cfg.seed = 7;
  float first[784], repeat[784];
  int differs = 0;
  for (int64_t epoch = 0; epoch < 6; epoch++) {
    for (int rank = 0; rank < 2; rank++) {
      struct gw_sampler s;
      ck_assert_int_eq(gw_sampler_init(&s, n, 3, rank, 0, 0, 0), GW_SUCCESS);
      struct gw_loader *l;
      ck_assert_int_eq(gw_loader_init(&l, ds, &s, &cfg), GW_SUCCESS);
      ck_assert_int_eq(gw_loader_seek(l, epoch, rank ? n / 3 : 0), GW_SUCCESS); /* rank 1's place 3333: entry 10000 */
      const struct gw_batch *b;
      ck_assert_msg(gw_loader_next(l, &b) == GW_SUCCESS, "%s", gw_data_last_error());
      memcpy(rank ? repeat : first, b->x, sizeof first);
      gw_loader_free(l);
    }
    differs += memcmp(first, repeat, sizeof first) != 0;
  }
  ck_assert_msg(differs >= 3, "sample 0 and its padded repeat differ in %d of 6 epochs", differs);
  gw_dataset_free(ds);
}
END_TEST

void add_loader_fault_tests(TCase *tc) {
  tcase_add_test(tc, loader_thread_start_fails);
  tcase_add_test(tc, loader_stop_in_search);
  tcase_add_test(tc, loader_worker_error);
  if (fmnist_installed()) tcase_add_test(tc, loader_padded_repeat_augmented_anew);
}

void add_folder_limit_tests(TCase *tc) {
  tcase_add_test(tc, folder_out_of_descriptors);
  tcase_add_test(tc, folder_decode_out_of_memory);
}
