/* gw-train-setup.c - gw-train's job from launch to the first step: joining
 * the communicator, checking that every rank runs the same options and data,
 * the model, backend, optimizer, bucketer and loaders, the schedule, output
 * checks and a resume.  The loop itself is gw-train-loop.c. */
#include "gw_config.h"

#if GW_HAVE_ONEDNN || GW_HAVE_CUDNN

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h" /* gw__fnv */
#include "gw-train-job.h"
#include "optwords.h"
#include "safetensors.h"

/* Prints the message once (rank-prefixed when there are several) and returns -1. */
/* Said once (rank-prefixed when there are several), and recorded for gw-run,
 * which names the rank a failure began at: own, or another rank's failure
 * this rank stops for (so that the abort gw_train_run makes next is not
 * recorded as this rank's own).  A communicator's failure was recorded by
 * the library when it happened: the record then does nothing. */
static int fail_recorded(const struct trainer *t, const char *what, const char *detail, int own) {
  char line[1200];
  snprintf(line, sizeof line, "gw-train: rank %d: %.200s: %.900s", t->rank, what, detail);
  gw_record_failure(line, own);
  if (t->world > 1) fprintf(stderr, "gw-train: rank %d: %s: %s\n", t->rank, what, detail);
  else fprintf(stderr, "gw-train: %s: %s\n", what, detail);
  return -1;
}

int train_fail(const struct trainer *t, const char *what, const char *detail) {
  return fail_recorded(t, what, detail, 1);
}

int train_fail_of_others(const struct trainer *t, const char *what, const char *detail) {
  return fail_recorded(t, what, detail, 0);
}

int train_comm_fail(const struct trainer *t, const char *what, gw_result_t r) {
  char d[600];
  snprintf(d, sizeof d, "%s (%s)", gw_comm_last_error(t->comm), gw_strerror(r));
  return train_fail(t, what, d);
}

/* ---- communication helpers: no-ops when alone */

static int setup_comm(struct trainer *t) {
  t->world = 1;
  if (!gw_env_launched()) return 0; /* alone: a shell, or a batch script's own environment */
  gw_result_t r = gw_comm_init_env(&t->comm);
  if (r != GW_SUCCESS) {
    fprintf(stderr, "gw-train: joining the job failed: %s\n", gw_comm_last_error(NULL));
    return -1;
  }
  gw_comm_rank(t->comm, &t->rank);
  gw_comm_size(t->comm, &t->world);
  return 0;
}

int train_bcast(struct trainer *t, void *buf, size_t count, gw_dtype_t dtype, const char *what) {
  if (!t->comm || !count) return 0;
  gw_result_t r = gw_broadcast(buf, buf, count, dtype, 0, t->comm, NULL);
  return r == GW_SUCCESS ? 0 : train_comm_fail(t, what, r);
}

int train_allreduce_d(struct trainer *t, double *buf, size_t n, const char *what) {
  if (!t->comm) return 0;
  gw_result_t r = gw_allreduce(buf, buf, n, GW_FLOAT64, GW_SUM, t->comm, NULL);
  return r == GW_SUCCESS ? 0 : train_comm_fail(t, what, r);
}

static gw_result_t sync_bn_sum(void *arg, double *buf, size_t n) {
  return gw_allreduce(buf, buf, n, GW_FLOAT64, GW_SUM, (gw_comm_t)arg, NULL);
}

/* ---- setup */

/* Every rank must run with rank 0's options: ranks launched by hand (srun,
 * torchrun) with another --batch, --epochs or --sync-bn would issue other
 * sequences of collectives and pair mismatched allreduces, or wait until
 * GW_TIMEOUT.  Also keeps them for the checkpoints. */
/* A refusal every rank reaches together (the ranks found they differ): each
 * says its part, and none leaves before all have (gw-run stops the others
 * when the first exits, and a slower rank's message naming what differs on it
 * was lost).  own: this rank's part names what differs here (recorded for
 * gw-run as where the failure began); else it points to the others' logs. */
static int fail_together(struct trainer *t, const char *what, const char *detail, bool own) {
  (own ? train_fail : train_fail_of_others)(t, what, detail);
  fflush(stdout), fflush(stderr);
  if (t->comm) gw_barrier(t->comm); /* (one rank has none: the library warned of a NULL communicator) */
  return -1;
}

static int same_options_everywhere(struct trainer *t) {
  char mine[sizeof t->st.options], r0[sizeof t->st.options], diff[1200], detail[1400];
  memset(mine, 0, sizeof mine);
  if (train_opts_describe(t->o, mine, sizeof mine) >= sizeof mine) return train_fail(t, "options", "too long to compare");
  memcpy(t->st.options, mine, sizeof mine);
  if (t->world == 1) return 0;
  /* --resume too (not kept: a resume is not a changed option): a rank
   * without it would skip rank 0's resume broadcasts and pair the first
   * gradient allreduce with them. */
  const size_t used = strlen(mine);
  snprintf(mine + used, sizeof mine - used, " resume=%d", t->o->resume);
  memcpy(r0, mine, sizeof r0);
  if (train_bcast(t, r0, sizeof r0, GW_UINT8, "comparing the options with rank 0's") != 0) return -1;
  r0[sizeof r0 - 1] = 0;
  double differ = opt_words_diff(r0, mine, NULL, diff, sizeof diff) > 0;
  if (train_allreduce_d(t, &differ, 1, "comparing the options with rank 0's") != 0) return -1;
  if (differ == 0) return 0;
  if (diff[0]) snprintf(detail, sizeof detail, "this rank's options are not rank 0's (rank 0's -> this rank's): %s", diff);
  else snprintf(detail, sizeof detail, "%.0f rank(s) run with options other than rank 0's (their logs say which)", differ);
  return fail_together(t, "options", detail, diff[0] != 0);
}

/* --load-weights, --checkpoint-dir, --metrics and --plot are rank 0's: its
 * weights are broadcast, and it saves and writes.  Given on another rank but
 * not on rank 0, or with another value than rank 0's, they were ignored
 * without a word; given on rank 0 alone is how a job whose file is on rank
 * 0's machine only runs. */
static int outputs_follow_rank0(struct trainer *t) {
  const struct train_opts *o = t->o;
  static const char *const flags[4] = {"--load-weights", "--checkpoint-dir", "--metrics", "--plot"};
  const bool given[4] = {o->load_weights != NULL, o->checkpoint_dir != NULL, o->metrics != NULL, o->plot != NULL};
  int32_t r0[4];
  for (int i = 0; i < 4; i++) r0[i] = given[i];
  const char *what = "comparing --load-weights, --checkpoint-dir, --metrics and --plot with rank 0's";
  if (t->world > 1 && train_bcast(t, r0, 4, GW_INT32, what) != 0) return -1;
  t->rank0_loads = r0[0];
  /* every rank knows: rank 0's weights are the ones evaluated (on rank 0
   * alone, as for training, where the file is on its machine only) */
  if (o->test_only && !r0[0])
    return train_fail(t, "--test-only", "rank 0 has no --load-weights FILE (weights, or a checkpoint): nothing to "
                      "evaluate");
  if (t->world == 1) return 0;
  const char *flag = NULL;
  for (int i = 0; i < 4 && !flag; i++)
    if (given[i] && !r0[i]) flag = flags[i];
  /* Given on both with other values (another --checkpoint-dir, --metrics,
   * --plot or --keep-checkpoints): as ignored here, and were unsaid.
   * (--load-weights: its file's contents are compared in the loading.) */
  enum { NV = 4, VLEN = 4096 };
  static const char *const vflags[NV] = {"--checkpoint-dir", "--metrics", "--plot", "--keep-checkpoints"};
  char(*vals)[2][VLEN] = calloc(NV, sizeof *vals); /* [flag][mine, rank 0's] */
  if (!vals) return train_fail(t, "setup", "out of memory");
  const char *mine[NV] = {o->checkpoint_dir, o->metrics, o->plot, NULL};
  char keep[16];
  snprintf(keep, sizeof keep, "%d", o->keep_checkpoints);
  /* rank 0's count, given or its default; another rank's only where given */
  if (o->checkpoint_dir && (o->keep_given || t->rank == 0)) mine[3] = keep;
  for (int i = 0; i < NV; i++) snprintf(vals[i][0], VLEN, "%s", mine[i] ? mine[i] : "");
  for (int i = 0; i < NV; i++) memcpy(vals[i][1], vals[i][0], VLEN);
  for (int i = 0; i < NV; i++)
    if (train_bcast(t, vals[i][1], VLEN, GW_UINT8, what) != 0) return free(vals), -1;
  int other = -1;
  for (int i = 0; i < NV && !flag && other < 0; i++)
    if (vals[i][0][0] && vals[i][1][0] && strcmp(vals[i][0], vals[i][1]) != 0) other = i;
  double bad = flag != NULL || other >= 0;
  if (train_allreduce_d(t, &bad, 1, what) != 0) return free(vals), -1;
  if (bad == 0) return free(vals), 0;
  char detail[600];
  if (flag)
    snprintf(detail, sizeof detail, "this rank has %s and rank 0 has not: it would be ignored (rank 0's weights are "
             "broadcast, and rank 0 saves and writes the metrics and plot): give it to rank 0", flag);
  else if (other >= 0)
    snprintf(detail, sizeof detail, "this rank's %s %.200s is not rank 0's %.200s: it would be ignored (rank 0 saves "
             "and writes the metrics and plot): give every rank rank 0's, or none", vflags[other], vals[other][0],
             vals[other][1]);
  else
    snprintf(detail, sizeof detail, "%.0f rank(s) have --load-weights, --checkpoint-dir, --metrics, --plot or "
             "--keep-checkpoints that rank 0 has not, or with other values than rank 0's (their logs say which)", bad);
  free(vals);
  return fail_together(t, "options", detail, flag != NULL || other >= 0);
}

/* Every rank must have opened the same samples: ranks that scanned a folder
 * while files came or went, or read another copy, would shard different lists
 * (overlapping, with gaps) and could take different numbers of steps. */
static int same_data_everywhere(struct trainer *t) {
  if (t->world == 1) return 0;
  const struct gw_dataset *ds[2] = {t->train_ds != t->val_ds ? t->train_ds : NULL, t->val_ds};
  int64_t mine[6] = {0}, r0[6];
  for (int k = 0; k < 2; k++)
    if (ds[k])
      mine[3 * k] = gw_dataset_size(ds[k]), mine[3 * k + 1] = gw_dataset_classes(ds[k]),
                 mine[3 * k + 2] = (int64_t)gw_dataset_content_hash(ds[k]);
  memcpy(r0, mine, sizeof r0);
  if (train_bcast(t, r0, 6, GW_INT64, "comparing the data with rank 0's") != 0) return -1;
  double differ = memcmp(mine, r0, sizeof mine) != 0;
  if (train_allreduce_d(t, &differ, 1, "comparing the data with rank 0's") != 0) return -1;
  for (int k = 0; k < 2 && differ > 0; k++) {
    if (!memcmp(&mine[3 * k], &r0[3 * k], 3 * sizeof *mine)) continue;
    char detail[400];
    snprintf(detail, sizeof detail,
             "this rank's %s split (%lld samples, %lld classes, hashed %016llx) is not rank "
             "0's (%lld samples, %lld classes, %016llx): every rank must see the same files",
             k ? "evaluation" : "training", (long long)mine[3 * k], (long long)mine[3 * k + 1],
             (unsigned long long)mine[3 * k + 2], (long long)r0[3 * k], (long long)r0[3 * k + 1],
             (unsigned long long)r0[3 * k + 2]);
    return fail_together(t, "--data", detail, true);
  }
  if (differ > 0) {
    char detail[160];
    snprintf(detail, sizeof detail, "%.0f rank(s) opened other data than rank 0 (their logs say what differs)", differ);
    return fail_together(t, "--data", detail, false);
  }
  return 0;
}

void train_data_options(const struct train_opts *o, struct gw_data_options *d) {
  gw_data_options_default(d);
  d->augment = o->augment;
  d->val_resize_size = o->val_resize;
  d->val_crop_size = o->val_crop;
  d->synthetic_samples = o->synthetic_samples;
  d->synthetic_channels = o->model.in_channels;
  d->synthetic_size = o->model.image_size;
  d->synthetic_classes = o->model.classes;
  d->synthetic_seed = o->model.seed;
  if (o->image_size_given) d->image_size = o->model.image_size;
}

/* Whether the evaluation split has a readable sample, found at the start: a
 * split of unreadable files failed the job at its first evaluation, after an
 * epoch's training (the checkpoint before it kept the epoch, --save-weights
 * was never written).  Reads the split's samples in order up to the first
 * readable one (one, as a rule).  Collective: a rank whose copy of the files
 * differs fails with the others (fail_together), each saying its part. */
static int some_eval_sample_readable(struct trainer *t) {
  const int64_t n = gw_dataset_size(t->val_ds);
  float *x = malloc(gw_dataset_sample_floats(t->val_ds) * sizeof *x);
  char last[200] = "", why[400] = "";
  gw_result_t r = x ? GW_DATA_SKIPPED : GW_ERR_SYSTEM;
  for (int64_t i = 0; x && i < n && r == GW_DATA_SKIPPED; i++) {
    int32_t label;
    if ((r = gw_dataset_get(t->val_ds, i, 0, 0, x, &label)) == GW_DATA_SKIPPED)
      snprintf(last, sizeof last, "%s", gw_data_last_error());
  }
  free(x);
  if (r == GW_DATA_SKIPPED)
    snprintf(why, sizeof why, "none of the %lld samples of the evaluation split is readable (the last: %s); "
             "--no-eval trains without it", (long long)n, last);
  else if (r != GW_SUCCESS)
    snprintf(why, sizeof why, "%s", x ? gw_data_last_error() : "out of memory");
  double bad = why[0] != 0;
  if (train_allreduce_d(t, &bad, 1, "comparing the evaluation splits' reads") != 0) return -1;
  if (bad == 0) return 0;
  char others[160];
  snprintf(others, sizeof others, "%.0f rank(s) found no readable sample in the evaluation split (their logs say "
           "why)", bad);
  return fail_together(t, "--data (evaluation split)", why[0] ? why : others, why[0] != 0);
}

static int open_data(struct trainer *t) {
  const struct train_opts *o = t->o;
  struct gw_data_options d;
  train_data_options(o, &d);
  if (o->test_only) { /* the evaluation split alone gives the model's shape: no scan of ImageNet's 1.28M files */
    if (gw_dataset_open(&t->val_ds, o->data, GW_SPLIT_VAL, &d) != GW_SUCCESS)
      return train_fail(t, "--data (evaluation split)", gw_data_last_error());
    t->train_ds = t->val_ds; /* (freed once) */
    return same_data_everywhere(t);
  }
  if (gw_dataset_open(&t->train_ds, o->data, GW_SPLIT_TRAIN, &d) != GW_SUCCESS)
    return train_fail(t, "--data", gw_data_last_error());
  if (o->eval && gw_dataset_open(&t->val_ds, o->data, GW_SPLIT_VAL, &d) != GW_SUCCESS)
    return train_fail(t, "--data (evaluation split)", gw_data_last_error());
  if (same_data_everywhere(t) != 0 || (t->val_ds && some_eval_sample_readable(t) != 0)) return -1;
  /* Every step takes a whole batch from each rank's share of the data. */
  int64_t n = gw_dataset_size(t->train_ds), share = o->drop_last ? n / t->world : (n + t->world - 1) / t->world;
  if (o->drop_last && share == 0) {
    char detail[200];
    snprintf(detail, sizeof detail, "the %lld training samples are fewer than the %d ranks, so a rank's share is "
             "empty (without --drop-last the shares are padded)", (long long)n, t->world);
    return train_fail(t, "--drop-last", detail);
  }
  if (share < o->batch) {
    char detail[200];
    snprintf(detail, sizeof detail, "a rank's share of the %lld training samples (%lld) is less than one batch of %d",
             (long long)n, (long long)share, o->batch);
    return train_fail(t, "--batch", detail);
  }
  return 0;
}

int data_model_config(const struct train_opts *o, const struct gw_dataset *ds, struct gw_model_config *cfg,
                      char *d, size_t dlen) {
  int c, h, w;
  gw_dataset_shape(ds, &c, &h, &w);
  *cfg = o->model;
  int classes = gw_dataset_classes(ds);
  /* --test-only builds the model from the evaluation split: at --val-crop-size where given */
  const int side = o->test_only && o->val_crop ? o->val_crop : o->model.image_size;
  const int side_given = o->test_only && o->val_crop ? 1 : o->image_size_given;
  if ((o->in_channels_given && o->model.in_channels != c) || (side_given && side != h) ||
      (o->classes_given && o->model.classes != classes) || h != w) {
    char given[160] = "";
    size_t k = 0;
    if (o->classes_given && o->model.classes != classes)
      k += (size_t)snprintf(given + k, sizeof given - k, " --classes %d", o->model.classes);
    if (o->in_channels_given && o->model.in_channels != c && k < sizeof given)
      k += (size_t)snprintf(given + k, sizeof given - k, " --in-channels %d", o->model.in_channels);
    if (side_given && side != h && k < sizeof given)
      snprintf(given + k, sizeof given - k, " %s %d", o->test_only && o->val_crop ? "--val-crop-size" : o->image_size_flag,
               side);
    if (h != w) snprintf(d, dlen, "its %dx%d images are not square", h, w);
    else
      snprintf(d, dlen, "the data has %d classes of %dx%dx%d images, not as given:%s (left out, they are the "
               "data's)", classes, c, h, w, given);
    return -1;
  }
  if (classes < 2) { /* (as --classes 1 is refused) */
    snprintf(d, dlen, "the data has %d class%s: the loss is 0 and nothing trains (a folder per class, two or more)",
             classes, classes == 1 ? "" : "es");
    return -1;
  }
  cfg->in_channels = c, cfg->image_size = h, cfg->classes = classes;
  return 0;
}

/* The model takes the dataset's shape; options given must agree with it. */
static int model_config(struct trainer *t, struct gw_model_config *cfg) {
  char d[300];
  return data_model_config(t->o, t->train_ds, cfg, d, sizeof d) != 0 ? train_fail(t, t->o->data, d) : 0;
}

/* This machine, as the ranks' CPU sets are compared: host name and boot id. */
static uint64_t machine_id(void) {
  char id[320] = "";
  if (gethostname(id, 256) != 0) id[0] = 0;
  id[255] = 0;
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    size_t n = strlen(id);
    if (!fgets(id + n, (int)(sizeof id - n), f)) id[n] = 0;
    fclose(f);
  }
  return gw__fnv(GW_FNV_START, id, strlen(id));
}

/* The default compute threads: the cores this process may run on (its
 * affinity), shared by the ranks on this machine whose CPU sets overlap it.
 * Unbound ranks (gw-run, torchrun) share every core; ranks a launcher bound
 * to cores of their own (srun --cpus-per-task, mpirun's binding) keep theirs
 * (dividing those again left 1 thread of 4); the ranks on this machine are
 * found by comparing, not from a launcher's variable (GW_LOCAL_WORLD_SIZE was
 * gw-run's alone: under torchrun every rank took every core).  Collective:
 * every rank calls it, with --threads or without (a rank may set its own: one
 * that did while another did not ran a broadcast against the other's
 * allgather, and both failed with a collective mismatch naming neither). */
static int default_threads(struct trainer *t, int *threads) {
  struct claim {
    uint64_t machine;
    cpu_set_t set;
  } mine = {machine_id(), {{0}}};
  /* A test hook: GW_TRAIN_TEST_CPUS=A-B stands for an affinity of cores A..B
   * (a machine of 2 cores cannot show ranks bound to 4 each). */
  const char *fake = getenv("GW_TRAIN_TEST_CPUS");
  int a, b;
  if (fake && sscanf(fake, "%d-%d", &a, &b) == 2 && a >= 0 && a <= b && b < CPU_SETSIZE) {
    CPU_ZERO(&mine.set);
    for (int c = a; c <= b; c++) CPU_SET(c, &mine.set);
  } else if (sched_getaffinity(0, sizeof mine.set, &mine.set) != 0 || CPU_COUNT(&mine.set) == 0) {
    CPU_ZERO(&mine.set);
    for (long c = 0, n = sysconf(_SC_NPROCESSORS_ONLN); c < n && c < CPU_SETSIZE; c++) CPU_SET((int)c, &mine.set);
  }
  int sharers = 1;
  if (t->comm && t->world > 1) {
    struct claim *all = calloc((size_t)t->world, sizeof *all);
    if (!all) return train_fail(t, "setup", "out of memory");
    gw_result_t r = gw_allgather(&mine, all, sizeof mine, GW_UINT8, t->comm, NULL);
    sharers = 0;
    for (int i = 0; r == GW_SUCCESS && i < t->world; i++) {
      cpu_set_t both;
      CPU_AND(&both, &all[i].set, &mine.set);
      sharers += all[i].machine == mine.machine && CPU_COUNT(&both) > 0;
    }
    free(all);
    if (r != GW_SUCCESS) return train_comm_fail(t, "comparing the ranks' cores", r);
  }
  *threads = CPU_COUNT(&mine.set) / (sharers > 0 ? sharers : 1);
  if (*threads < 1) *threads = 1;
  return 0;
}

static size_t count_buffers(const struct gw_model *m, enum gw_tensor_kind kind) {
  size_t n = 0;
  for (int i = 0; i < gw_model_num_buffer_tensors(m); i++)
    if (gw_model_buffer_tensor(m, i)->kind == kind) n += gw_model_buffer_tensor(m, i)->numel;
  return n;
}

/* The same values on every rank that loads --load-weights: rank 0's are
 * broadcast over the others', so another file on another rank was ignored
 * without a word. */
static int same_loaded_weights(struct trainer *t) {
  if (t->world == 1 || !t->rank0_loads) return 0; /* (rank 0 loads when any rank does: outputs_follow_rank0) */
  uint64_t h = gw__fnv(GW_FNV_START, gw_model_params(t->m), t->np * sizeof(float));
  h = gw__fnv(h, gw_model_running(t->m), t->nrun * sizeof(float));
  uint64_t r0 = h;
  if (train_bcast(t, &r0, sizeof r0, GW_UINT8, "comparing the loaded weights with rank 0's") != 0) return -1;
  double differ = t->o->load_weights && r0 != h; /* a rank without the flag takes rank 0's */
  if (train_allreduce_d(t, &differ, 1, "comparing the loaded weights with rank 0's") != 0) return -1;
  if (differ == 0) return 0;
  char d[600];
  if (t->o->load_weights && r0 != h)
    snprintf(d, sizeof d, "this rank's %s holds other values than rank 0's file (rank 0's weights are the ones "
             "trained: give every rank the same file)", t->o->load_weights);
  else
    snprintf(d, sizeof d, "%.0f rank(s) loaded other values than rank 0's %s (their logs say which)", differ,
             t->o->load_weights);
  return fail_together(t, "--load-weights", d, t->o->load_weights && r0 != h);
}

static int setup_model(struct trainer *t) {
  const struct train_opts *o = t->o;
  struct gw_model_config cfg;
  if (model_config(t, &cfg) != 0) return -1;
  if (gw_model_init(&t->m, &cfg) != GW_SUCCESS) return train_fail(t, "model", gw_model_last_error());
  char why[1200];
  if (o->load_weights && load_weights(t->m, o->load_weights, o->model_name, why, sizeof why) != 0)
    return train_fail(t, "--load-weights", why);
  t->np = gw_model_num_params(t->m);
  t->nrun = count_buffers(t->m, GW_TENSOR_RUNNING);
  t->ncounters = count_buffers(t->m, GW_TENSOR_COUNTER);
  if (same_loaded_weights(t) != 0) return -1;
  if (default_threads(t, &t->threads) != 0) return -1;
  if (o->threads) t->threads = o->threads;
  struct gw_backend_config bc = {.threads = t->threads, .tf32 = o->tf32,
                                 .act = o->amp, .layout = o->layout};
  /* What was measured faster end to end (backend.h): NHWC with 16-bit
   * activations on cudnn, and on cpu for images under 56 px; else NCHW. */
  if (o->layout < 0) bc.layout = gw_backend_default_layout(o->backend, o->amp, cfg.image_size);
#if GW_HAVE_CUDNN
  if (!strcmp(o->backend, "cudnn") && !(t->ops = gw_backend_cudnn_ops()))
    return train_fail(t, "--backend", gw_model_last_error());
#endif
#if GW_HAVE_ONEDNN
  /* A test hook: GW_TRAIN_CPU_AS_DEVICE=1 runs the cpu backend as if its memory
   * were a device's (host_memory = 0), so the loop's device path (copies up
   * before the step and down after backward, allreduce after backward) is tested
   * without a GPU, against the host path. */
  static struct gw_backend_ops cpu_as_device;
  if (!strcmp(o->backend, "cpu")) t->ops = &gw_backend_cpu;
  if (t->ops == &gw_backend_cpu && getenv("GW_TRAIN_CPU_AS_DEVICE") && !strcmp(getenv("GW_TRAIN_CPU_AS_DEVICE"), "1")) {
    cpu_as_device = gw_backend_cpu;
    cpu_as_device.host_memory = 0;
    t->ops = &cpu_as_device;
  }
#endif
  if (!t->ops) return train_fail(t, "--backend", "not in this build"); /* gw-train.c refused it already */
  if (t->ops->create(&bc, &t->b) != GW_SUCCESS) return train_fail(t, "--backend", gw_model_last_error());
  if (o->host_step && t->ops->host_memory)
    return train_fail(t, "--host-step", "the cpu backend's weights and optimizer are on the host already (it applies to "
                                  "--backend cudnn)");
  /* --test-only: an inference executor (no gradients, activations reused) */
  struct gw_exec_config ec = {.batch = o->batch, .label_smoothing = (float)o->label_smoothing,
                              .inference = o->test_only};
  if (gw_exec_create(t->m, t->ops, t->b, &ec, &t->e) != GW_SUCCESS)
    return train_fail(t, "model", gw_model_last_error());
  if (t->val_ds && !o->test_only && o->val_crop && o->val_crop != cfg.image_size) {
    struct gw_model_config ce = cfg;
    ce.image_size = o->val_crop;
    struct gw_exec_config ee = ec;
    ee.inference = 1; /* no gradients, activations reused: a few of them at the evaluation's size */
    if (gw_model_init(&t->m_eval, &ce) != GW_SUCCESS || gw_exec_create(t->m_eval, t->ops, t->b, &ee, &t->e_eval))
      return train_fail(t, "--val-crop-size", gw_model_last_error());
    if (gw_model_num_params(t->m_eval) != t->np || count_buffers(t->m_eval, GW_TENSOR_RUNNING) != t->nrun)
      return train_fail(t, "--val-crop-size", "the model at the evaluation's size has other tensors");
  }
  t->st.loss_scale = o->loss_scale_dynamic && o->loss_scale_init ? o->loss_scale_init : o->loss_scale;
  struct gw_sgd_config sc = {.momentum = (float)o->momentum, .weight_decay = (float)o->wd, .nesterov = o->nesterov,
                           .decay_all = o->wd_all};
  if (gw_sgd_create(t->m, &sc, &t->sgd) != GW_SUCCESS) return train_fail(t, "optimizer", gw_model_last_error());
  t->resident = !t->ops->host_memory && !o->host_step;
  t->warming = !t->ops->host_memory;
  if (t->resident && !o->test_only && gw_sgd_momentum(t->sgd) &&
      !(t->mom_dev = t->ops->alloc(t->b, t->np * sizeof(float)))) {
    char d[160];
    snprintf(d, sizeof d, "out of %s memory for the momentum buffer (%zu MiB)", t->ops->name,
             t->np * sizeof(float) >> 20);
    return train_fail(t, "optimizer", d);
  }
  /* What a resumed run must share with the saved one: the model, and what
   * fixes the data order and the steps per epoch: the training samples (their
   * number and the hash of their file list and labels, not --data's text: the
   * same files elsewhere resume, other files under the same name or another
   * --synthetic-samples do not), world, batch, seed and --drop-last (named
   * only when on, so older checkpoints of default runs match).  Checkpoints
   * written before named --data's text instead: config_legacy, still taken. */
  char data_id[64];
  snprintf(data_id, sizeof data_id, "train:%lld:%016llx", (long long)gw_dataset_size(t->train_ds),
           (unsigned long long)gw_dataset_fingerprint(t->train_ds));
  for (int legacy = 0; legacy < 2; legacy++) {
    char *buf = legacy ? t->config_legacy : t->config;
    const size_t cap = legacy ? sizeof t->config_legacy : sizeof t->config;
    int len = snprintf(buf, cap,
                       "%s classes=%d in_channels=%d image_size=%d stem=%s width_divisor=%d data=%s world=%d batch=%d "
                       "seed=%llu%s", o->model_name, cfg.classes, cfg.in_channels, cfg.image_size,
                       cfg.stem == GW_STEM_SMALL ? "small" : "imagenet", cfg.width_divisor, legacy ? o->data : data_id,
                       t->world, o->batch, (unsigned long long)cfg.seed, o->drop_last ? " drop_last" : "");
    /* Cut short, it would lose what follows the data (a resume with another
     * world size or batch would pass). */
    if (len < 0 || (size_t)len >= cap) return train_fail(t, "--data", "the name is too long");
  }
  /* One model everywhere: rank 0's. */
  if (train_bcast(t, gw_model_params(t->m), t->np, GW_FLOAT32, "broadcasting the initial weights") != 0) return -1;
  return train_bcast(t, gw_model_running(t->m), t->nrun, GW_FLOAT32, "broadcasting the BN statistics");
}

static int setup_comm_parts(struct trainer *t) {
  const struct train_opts *o = t->o;
  /* One rank has nothing to reduce: no bucketer (its no-op allreduces waited on
   * the device after each bucket, and the log called that wait communication). */
  if (t->world == 1 && o->grad_wire != GW_FLOAT32 && !o->test_only)
    fprintf(stderr, "gw-train: note: one rank makes no allreduce: --grad-wire %s has nothing to do\n",
            o->grad_wire == GW_BFLOAT16 ? "bf16" : "fp16");
  if (!t->comm) return 0;
  if (o->sync_bn && !o->test_only) gw_exec_set_sync_bn(t->e, sync_bn_sum, t->comm);
  if (t->world == 1 || o->test_only) return 0; /* --test-only has no gradients to reduce */
  size_t *bounds = t->bounds;
  int nb = t->nb = gw_bucket_bounds(t->np, sizeof(float), (size_t)(o->first_bucket_mb * 1048576),
                                    (size_t)(o->bucket_mb * 1048576), bounds, 4096);
  if (nb < 1) return train_fail(t, "--bucket-mb", "too many buckets for the model (at most 4095)");
  /* The gradients live in one buffer for the whole run: registered once, the
   * allreduces over ib send their chunks straight from it (no-op without ib;
   * device memory goes through the transports' staging instead). */
  float *grads = t->resident ? gw_exec_grads(t->e) : gw_model_grads(t->m);
  void *compute = t->resident ? t->ops->stream(t->b) : NULL; /* NULL: host memory, calls done on return */
  gw_result_t r = GW_SUCCESS;
  if (!compute && (r = gw_comm_register(t->comm, grads, t->np * sizeof(float), &t->grads_reg)) != GW_SUCCESS)
    return train_comm_fail(t, "registering the gradients", r);
  r = gw_bucketer_create(t->comm, grads, t->np, GW_FLOAT32, GW_AVG, bounds, nb, &t->bk);
  if (r == GW_SUCCESS && o->grad_wire != GW_FLOAT32) r = gw_bucketer_set_wire(t->bk, (gw_dtype_t)o->grad_wire);
  /* Loss-scaled gradients on a float16 wire: divided before the sum, so the
   * scale the dynamic scaler finds is the world's n times larger, not its
   * partial sums' (without scaling, small gradients keep their bits instead). */
  if (r == GW_SUCCESS && o->grad_wire == GW_FLOAT16 && (o->loss_scale != 0 || o->loss_scale_dynamic))
    r = gw_bucketer_set_divide_first(t->bk, 1);
  /* Backward's kernels are queued, not done, when their gradients are reported
   * ready: the allreduces wait for them on the device, never the host. */
  if (r == GW_SUCCESS && compute) r = gw_bucketer_set_compute_stream(t->bk, compute);
  return r == GW_SUCCESS ? 0 : train_comm_fail(t, "bucketer", r);
}

static int setup_loaders(struct trainer *t) {
  const struct train_opts *o = t->o;
  uint64_t seed = o->model.seed;
  if (gw_sampler_init(&t->train_s, gw_dataset_size(t->train_ds), t->world, t->rank, 1, o->drop_last, seed) !=
      GW_SUCCESS)
    return train_fail(t, "sampler", gw_data_last_error());
  struct gw_loader_config lc;
  gw_loader_config_default(&lc);
  lc.batch = o->batch, lc.threads = o->loader_threads, lc.train = 1, lc.drop_last_batch = 1, lc.seed = seed;
  /* --test-only: no training loader (its threads and batches for nothing) */
  if (!o->test_only && gw_loader_init(&t->train_ld, t->train_ds, &t->train_s, &lc) != GW_SUCCESS)
    return train_fail(t, "loader", gw_data_last_error());
  t->spe = o->test_only ? 1 : gw_loader_batches_per_epoch(t->train_ld);
  if (t->spe < 1) {
    char d[200];
    snprintf(d, sizeof d, "a rank's share of the %lld training samples is less than one batch of %d",
             (long long)gw_dataset_size(t->train_ds), o->batch);
    return train_fail(t, "--batch", d);
  }
  if (!t->val_ds) return 0;
  if (gw_sampler_init(&t->val_s, gw_dataset_size(t->val_ds), t->world, t->rank, 0, 0, seed) != GW_SUCCESS)
    return train_fail(t, "sampler", gw_data_last_error());
  lc.train = 0, lc.drop_last_batch = 0, lc.epochs = 1;
  lc.blank_unreadable = 1; /* the evaluation scores no stand-in: no search for one */
  if (gw_loader_init(&t->val_ld, t->val_ds, &t->val_s, &lc) != GW_SUCCESS)
    return train_fail(t, "loader", gw_data_last_error());
  return 0;
}

static void plan_schedule(struct trainer *t) {
  const struct train_opts *o = t->o;
  t->total_steps = o->test_only ? 0 : o->epochs > 0 ? o->epochs * t->spe : o->steps;
  t->epochs = (t->total_steps + t->spe - 1) / t->spe;
  /* A warmup longer than the run is not squeezed into it: the rate climbs as
   * the recipe's does (torchvision's LinearLR, NVIDIA's per-step ramp), and
   * the run ends part way up (said at the start). */
  t->warmup_steps = (int64_t)llround(o->warmup_epochs * (double)t->spe);
  t->peak_lr = o->lr * (double)o->batch * t->world / 256.0;
}

/* An existing regular file that --metrics appends to holds JSON lines (an
 * earlier run's): each begins with '{' and none holds a NUL byte.  Anything
 * else (saved weights, a plot, a checkpoint) was taken and spoilt: the lines
 * went on its end, and the weights no longer loaded. */
static int metrics_file_ok(const char *path, char *err, size_t errlen) {
  char head[4096];
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0; /* write-only: appended to unchecked, as log_open does */
  const ssize_t n = read(fd, head, sizeof head);
  close(fd);
  if (n <= 0 || (head[0] == '{' && !memchr(head, 0, (size_t)n))) return 0;
  snprintf(err, errlen, "--metrics %.900s: holds something other than metrics (JSON lines, one object each, as "
           "gw-train writes them): it begins with %s; name a new file, or one an earlier run wrote", path,
           memchr(head, 0, (size_t)n) ? "binary data" : "something other than '{'");
  return -1;
}

/* --metrics is appended to: an existing file (or a FIFO, /dev/stdout) needs
 * only to take writes; a new one, a directory to be made in.  It was first
 * opened after the data and the model, so a bad one cost their setup. */
static int metrics_path_ok(const char *path, char *err, size_t errlen) {
  struct stat sb;
  if (path[0] && stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
    if (access(path, W_OK) != 0) {
      snprintf(err, errlen, "--metrics %.900s: cannot append to it: %s", path, strerror(errno));
      return -1;
    }
    return S_ISREG(sb.st_mode) ? metrics_file_ok(path, err, errlen) : 0;
  }
  return output_path_ok("--metrics", path, err, errlen);
}

/* What an existing file's safetensors header says: a file at all, written by
 * gw-train (weights carry gradwire_model), a checkpoint. */
struct replaced_probe {
  bool safetensors, ours, ckpt;
};
static gw_result_t probe_replaced(const struct gw_st_file *h, const char *path, void *arg) {
  (void)path;
  struct replaced_probe *p = arg;
  const char *format = gw_st_metadata(h, "format");
  p->safetensors = true;
  p->ours = gw_st_metadata(h, "gradwire_model") != NULL;
  p->ckpt = gw_st_metadata(h, "config") && ((format && !strcmp(format, "gradwire-checkpoint")) ||
                                            gw_st_find(h, "params")); /* (a version 1 checkpoint) */
  return GW_ERR_INVALID_ARGUMENT; /* the header was all we wanted: nothing more read */
}

/* An existing file --save-weights replaces holds weights gw-train wrote (an
 * earlier run's), or nothing: anything else was replaced without a word, the
 * run's own dataset file or a checkpoint's whole training state among them.
 * The run's own --load-weights file (fine-tuned in place) may be any weights
 * it loads, a checkpoint's excepted. */
static int weights_file_ok(const char *path, const char *load, char *err, size_t errlen) {
  if (!replaced_content_at_stake(path)) return 0;
  struct replaced_probe p = {0};
  struct gw_st_file *f = NULL;
  const gw_result_t r = gw_st_open_checked(&f, path, probe_replaced, &p);
  gw_st_free(f);
  if (!p.safetensors && r == GW_ERR_SYSTEM) { /* (unreadable: EACCES on a root-squashed mount, EIO) */
    snprintf(err, errlen, "--save-weights %.900s: cannot be read to see that it holds weights it may replace: %s",
             path, gw_model_last_error());
    return -1;
  }
  if (p.safetensors && !p.ckpt && (p.ours || (load && same_output_file(path, load)))) return 0;
  snprintf(err, errlen, "--save-weights %.900s: %s: name a new file, or one an earlier --save-weights wrote (or "
           "remove it first)", path,
           !p.safetensors ? "holds something other than weights (no safetensors file)"
           : p.ckpt       ? "is a checkpoint, whose training state bare weights would replace"
                          : "holds safetensors that gw-train did not write");
  return -1;
}

int weights_output_ok(const char *path, const char *load, char *err, size_t errlen) {
  return replaced_path_ok("--save-weights", path, OUTPATH_TEMP_WEIGHTS, err, errlen) != 0 ||
                 weights_file_ok(path, load, err, errlen) != 0
             ? -1
             : 0;
}

/* Rank 0's output paths, checked before any work: a bad one used to fail only
 * when first written (after the training, for --save-weights), or never; and
 * a checkpoint folder holding another run's files is refused unless resuming. */
static int check_outputs(const struct trainer *t) {
  const struct train_opts *o = t->o;
  if (t->rank != 0) return 0;
  char err[1200];
  if ((o->checkpoint_dir && ckpt_prepare_dir(o->checkpoint_dir, o->resume, err, sizeof err) != 0) ||
      (o->metrics && metrics_path_ok(o->metrics, err, sizeof err) != 0) || /* (in the folder just made, maybe) */
      (o->save_weights && weights_output_ok(o->save_weights, o->load_weights, err, sizeof err) != 0) ||
      (o->plot && plot_check(o->plot, err, sizeof err) != 0))
    return train_fail(t, "output files", err);
  return 0;
}

/* Rank 0's files past the file-size limit (ulimit -f), refused once the model's
 * size is known, before the training: their write would fail (or, without
 * gw-train's SIGXFSZ ignored, kill the rank) only after it.  Each file holds
 * at least its float32 tensors: the weights the parameters, a checkpoint the
 * parameters and their momentum (where there is one); gw_st_write checks the
 * exact size at each save. */
static int files_fit_limit(const struct trainer *t) {
  const struct train_opts *o = t->o;
  const uint64_t limit = gw_st_file_size_limit();
  if (t->rank != 0 || limit == UINT64_MAX) return 0;
  const uint64_t weights = (uint64_t)gw_model_num_params(t->m) * sizeof(float);
  const bool momentum = gw_sgd_momentum(t->sgd) != NULL; /* (none with --momentum 0: a checkpoint has none) */
  const uint64_t ckpt = momentum ? 2 * weights : weights;
  const bool is_weights = o->save_weights && weights > limit;
  const char *flag = is_weights ? "--save-weights" : o->checkpoint_dir && ckpt > limit ? "--checkpoint-dir" : NULL;
  if (!flag) return 0;
  char d[300];
  snprintf(d, sizeof d, "its files will be over %" PRIu64 " bytes (the model's %zu parameters%s in float32), past "
           "this process's file-size limit (ulimit -f) of %" PRIu64 " bytes: raise the limit",
           is_weights ? weights : ckpt, gw_model_num_params(t->m),
           !is_weights && momentum ? " and their momentum" : "", limit);
  return train_fail(t, flag, d);
}

/* The training loader's batches in flight (its threads' and two more) past
 * half the machine's memory: refused by the flags that size them, before the
 * model takes its own (the pages, written at once, got the rank OOM-killed;
 * the loader refuses too, naming no flag). */
static int loader_fits(struct trainer *t) {
  const struct train_opts *o = t->o;
  int c, h, w;
  gw_dataset_shape(t->train_ds, &c, &h, &w);
  int local = 1; /* the ranks of this machine: each has its loaders */
  if (t->comm && (gw_comm_local_size(t->comm, &local) != GW_SUCCESS || local < 1)) local = 1;
  /* the evaluation's has as many batches (of its own size: --val-crop-size);
   * --test-only has it alone */
  const int loaders = t->val_ds && !o->test_only ? 2 : 1;
  size_t val_floats = 0;
  if (loaders == 2) val_floats = gw_dataset_sample_floats(t->val_ds);
  const double batch_bytes = (double)o->batch * c * h * w * sizeof(float),
               all_batches = batch_bytes + (double)o->batch * (double)val_floats * sizeof(float),
               total = (double)(o->loader_threads + 2) * all_batches * local;
  double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  /* a container's or a job's cgroup limit is tighter (the machine's passed there) */
  const long long cg = gw__cgroup_mem_left();
  const bool by_cgroup = cg > 0 && (phys <= 0 || (double)cg < phys);
  if (by_cgroup) phys = (double)cg;
  if (phys <= 0 || total <= phys / 2) return 0;
  char d[500];
  const bool other = loaders == 2 && val_floats != (size_t)c * h * w; /* --val-crop-size */
  snprintf(d, sizeof d, "%d batches in flight (--loader-threads %d, plus 2) of %d x %dx%dx%d floats (%.1f MiB each), "
           "times %d loader%s%s and %d rank%s on this machine, need %.1f GiB, over half its %.1f GiB%s: lower "
           "--loader-threads, --batch or %s%s", o->loader_threads + 2, o->loader_threads, o->batch, c, h, w,
           batch_bytes / 1048576.0, loaders, loaders > 1 ? "s" : "", other ? " (the evaluation's at its crop)" : "",
           local, local > 1 ? "s" : "", total / 1073741824.0, phys / 1073741824.0,
           by_cgroup ? " (what its cgroup's memory limit leaves)" : "", o->image_size_flag, other ? " or --val-crop-size" : "");
  return train_fail(t, "loader", d);
}

int trainer_setup(struct trainer *t) {
  if (setup_comm(t) != 0 || same_options_everywhere(t) != 0 || outputs_follow_rank0(t) != 0 ||
      check_outputs(t) != 0 || open_data(t) != 0 || loader_fits(t) != 0 || setup_model(t) != 0 || files_fit_limit(t) != 0 ||
      setup_comm_parts(t) != 0 || setup_loaders(t) != 0)
    return -1;
  /* setup_comm_parts turned SyncBatchNorm on (or not): the values per channel are known. */
  if (!t->o->test_only && gw_exec_check_train(t->e, t->world) != GW_SUCCESS)
    return train_fail(t, "--batch", gw_model_last_error());
  plan_schedule(t);
  /* pad_x: the evaluation's last batch, of its own size (--val-crop-size) */
  size_t sample = gw_dataset_sample_floats(t->val_ds ? t->val_ds : t->train_ds);
  t->pad_x = malloc((size_t)t->o->batch * sample * sizeof(float));
  t->logits = malloc((size_t)t->o->batch * gw_model_get_config(t->m)->classes * sizeof(float));
  if (!t->pad_x || !t->logits) return train_fail(t, "setup", "out of memory");
  char err[600];
  if (log_open(&t->log, t->o->metrics, t->rank, err, sizeof err) != 0) return train_fail(t, "--metrics", err);
  if (t->o->resume && trainer_resume(t) != 0) return -1;
  /* An evaluation alone is no run's start: its own marker, so a metrics file
   * it is appended to keeps its training run's lines */
  if (t->o->test_only) {
    log_marker(&t->log, "test_only");
    return trainer_backend_from_host(t);
  }
  if (t->st.step == 0) log_marker(&t->log, "start");
  if (t->st.step > 0 && t->st.step >= t->total_steps)
    log_text(&t->log, "note: nothing left to train: the checkpoint is at step %lld and this run ends at step %lld "
             "(--steps, --epochs)", (long long)t->st.step, (long long)t->total_steps);
  /* Evaluations run at epochs' ends: a --steps run ending inside one is told. */
  if (t->o->eval && t->val_ds && t->total_steps % t->spe && t->st.step < t->total_steps)
    log_text(&t->log, "note: this run ends at step %lld, %lld steps into epoch %lld (%lld steps each): the "
             "evaluation runs at epochs' ends, so those last steps are not evaluated", (long long)t->total_steps,
             (long long)(t->total_steps % t->spe), (long long)(t->total_steps / t->spe + 1), (long long)t->spe);
  /* Milestones the run never reaches (a --steps run, or fewer --epochs than the recipe's). */
  const struct train_opts *o = t->o;
  int past = 0;
  while (past < o->n_milestones && llround(o->milestones[o->n_milestones - 1 - past] * (double)t->spe) >= t->total_steps)
    past++;
  if (past)
    log_text(&t->log, "note: %d of the %d --lr-milestones (from epoch %g) come at or after this run's end (step "
             "%lld, %lld per epoch): the rate never drops there", past, o->n_milestones,
             o->milestones[o->n_milestones - past], (long long)t->total_steps, (long long)t->spe);
  if (t->warmup_steps > t->total_steps && t->st.step < t->total_steps && t->peak_lr > 0)
    log_text(&t->log, "note: the warmup (%lld steps, --warmup-epochs %g) is longer than this run (%lld steps): "
             "its last step runs at lr %.4g, %.3g of the peak %.4g", (long long)t->warmup_steps, o->warmup_epochs,
             (long long)t->total_steps, trainer_lr_at(t, t->total_steps - 1),
             trainer_lr_at(t, t->total_steps - 1) / t->peak_lr, t->peak_lr);
  /* A warmup rounded to at most one step is none: its first step runs at the
   * peak ((step + 1) / warmup), e.g. the default 0.2 epochs at 2 steps each
   * (from a start factor, one step is a warmup, none is not).  Said at the
   * run's start only. */
  if (o->warmup_epochs > 0 && (o->warmup_start > 0 ? t->warmup_steps == 0 : t->warmup_steps <= 1) &&
      t->st.step == 0 && t->total_steps > 0)
    log_text(&t->log, "note: --warmup-epochs %g is %lld step%s at %lld steps per epoch: no warmup, the first step "
             "runs at the peak rate", o->warmup_epochs, (long long)t->warmup_steps, t->warmup_steps == 1 ? "" : "s",
             (long long)t->spe);
  /* Loss scaling is for float16's range: with none in the step it only costs
   * a pass over the gradients (allowed: the scaler's tests run so on cpu). */
  const int fp16_wire = o->grad_wire == GW_FLOAT16 && t->world > 1; /* one rank has no wire */
  if ((o->loss_scale != 0 || o->loss_scale_dynamic) && o->amp != GW_FLOAT16 && !fp16_wire &&
      t->st.step < t->total_steps)
    log_text(&t->log, "note: --loss-scale with %s activations and a %s gradient wire: both have float32's range "
             "(scaling is for float16's, --amp fp16 or --grad-wire fp16); here it only costs a pass over the "
             "gradients each step", o->amp == GW_BFLOAT16 ? "bfloat16" : "float32",
             o->grad_wire == GW_BFLOAT16 && t->world > 1 ? "bfloat16" : "float32");
  /* The plot gets a point at each epoch's end: say so at once when none comes. */
  if (t->o->plot && t->total_steps / t->spe <= t->st.step / t->spe)
    log_text(&t->log, "warning: --plot %s: this run ends at step %lld, before the end of an epoch (%lld steps "
             "each): nothing will be drawn", t->o->plot, (long long)t->total_steps, (long long)t->spe);
  return trainer_backend_from_host(t);
}

#endif
