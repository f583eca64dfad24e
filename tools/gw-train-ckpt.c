/* gw-train-ckpt.c - checkpoints: DIR/ckpt-<step>.safetensors holding the
 * parameters, the momentum buffer, the BN statistics and counters, and the
 * training state (step, where the data continues, the epoch's loss so far), with
 * metadata naming the run's configuration and an FNV-1a 64 checksum over every
 * tensor's bytes and (format version 2) the metadata.  Written atomically by the
 * safetensors writer (temporary file, fsync, rename, directory fsync), so a
 * crash leaves the previous checkpoint whole; the newest `keep` are kept.  On
 * resume the newest file that parses, passes its checksum and matches the
 * configuration is used; a damaged newer one is named in a warning, skipped,
 * and moved aside to ckpt-<step>.safetensors.refused (.refused.1, .2, ... when
 * an earlier refusal's copy has that name: never deleted nor replaced, it may
 * be worth a look; never counted among the newest `keep` nor overwritten when
 * the run reaches its step again).  Temporary files of a save that a dead
 * writer left behind are removed when the directory is opened, and those of
 * --save-weights' file before it is written.
 */
#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h" /* gw__fnv */
#include "gw-train.h"
#include "gw-train-ckpt-dir.h"
#include "optwords.h"
#include "safetensors.h"
#include "sgd.h"

static size_t buffer_elems(const struct gw_model *m, enum gw_tensor_kind kind) {
  size_t n = 0;
  for (int i = 0; i < gw_model_num_buffer_tensors(m); i++)
    if (gw_model_buffer_tensor(m, i)->kind == kind) n += gw_model_buffer_tensor(m, i)->numel;
  return n;
}

/* The checkpoint's tensors, in file order; n is how many. */
struct ckpt_tensors {
  struct gw_st_tensor t[7];
  int n;
  int64_t state[5];
  double loss_sum;
  double scaler[3]; /* loss scale, good steps, overflows (whole numbers exact in a double) */
};

static void add(struct ckpt_tensors *c, const char *name, gw_dtype_t dtype, const void *data, size_t numel) {
  struct gw_st_tensor *t = &c->t[c->n++];
  memset(t, 0, sizeof *t);
  t->name = name, t->dtype = dtype, t->ndim = 1, t->shape[0] = (int64_t)numel;
  t->nbytes = numel * gw_st_dtype_size(dtype), t->data = data;
}

static void describe(struct ckpt_tensors *c, struct gw_model *m, struct gw_sgd *sgd, const struct ckpt_state *st) {
  c->n = 0;
  size_t np = gw_model_num_params(m);
  add(c, "params", GW_FLOAT32, gw_model_params(m), np);
  if (gw_sgd_momentum(sgd)) add(c, "momentum", GW_FLOAT32, gw_sgd_momentum(sgd), np);
  add(c, "running", GW_FLOAT32, gw_model_running(m), buffer_elems(m, GW_TENSOR_RUNNING));
  add(c, "counters", GW_INT64, gw_model_counters(m), buffer_elems(m, GW_TENSOR_COUNTER));
  int64_t s[5] = {st->step, st->epoch, st->position, st->sgd_steps, st->loss_count};
  memcpy(c->state, s, sizeof s);
  c->loss_sum = st->loss_sum;
  add(c, "state", GW_INT64, c->state, 5);
  add(c, "loss_sum", GW_FLOAT64, &c->loss_sum, 1);
  c->scaler[0] = st->loss_scale, c->scaler[1] = (double)st->good_steps, c->scaler[2] = (double)st->overflows;
  add(c, "scaler", GW_FLOAT64, c->scaler, 3); /* last: older checkpoints end before it */
}

/* Format version 2 (the "format_version" key; version 1 had none): the
 * checksum covers these metadata entries too, in this order, after the
 * tensors (a version 1 file's covers the tensors alone, and still loads). */
#define CKPT_VERSION "2" /* a change to describe()'s tensors or to covered[] makes a new version */
static const char *const covered[] = {"format_version", "format", "config", "options", "eval_pending"};
enum { NCOVERED = sizeof covered / sizeof covered[0] };

/* vals: the covered entries' values (NULL: absent), or NULL for version 1. */
static uint64_t checksum(const struct ckpt_tensors *c, const char *const *vals) {
  uint64_t h = GW_FNV_START;
  for (int i = 0; i < c->n; i++) h = gw__fnv(h, c->t[i].data, c->t[i].nbytes);
  for (int i = 0; vals && i < NCOVERED; i++) {
    const unsigned char present = vals[i] != NULL; /* an absent entry differs from an empty one */
    h = gw__fnv(h, covered[i], strlen(covered[i]) + 1);
    h = gw__fnv(h, &present, 1);
    if (present) h = gw__fnv(h, vals[i], strlen(vals[i]) + 1);
  }
  return h;
}

/* The first value of kind's tensors in v (laid out as the model's storage of
 * that kind) that is inf or NaN, named in where with `what` after the
 * tensor's name; 1 if there is one. */
static int scan_kind(const struct gw_model *m, enum gw_tensor_kind kind, const float *v, const char *what,
                     char *where, size_t len) {
  const int params = kind == GW_TENSOR_PARAM;
  const int n = params ? gw_model_num_param_tensors(m) : gw_model_num_buffer_tensors(m);
  for (int i = 0; i < n; i++) {
    const struct gw_tensor *t = params ? gw_model_param_tensor(m, i) : gw_model_buffer_tensor(m, i);
    if (t->kind != kind) continue;
    for (size_t k = 0; k < t->numel; k++)
      if (!isfinite(v[t->offset + k])) {
        snprintf(where, len, "%s%s[%zu] = %g", t->name, what, k, (double)v[t->offset + k]);
        return 1;
      }
  }
  return 0;
}

int ckpt_nonfinite(const struct gw_model *m, const float *params, const float *momentum, const float *running,
                   char *where, size_t len) {
  return (params && scan_kind(m, GW_TENSOR_PARAM, params, "", where, len)) ||
         (momentum && scan_kind(m, GW_TENSOR_PARAM, momentum, " (its momentum)", where, len)) ||
         scan_kind(m, GW_TENSOR_RUNNING, running, "", where, len);
}

/* A variance below 0, which no run writes (a flipped sign bit, with no
 * checksum to catch it; a checkpoint edited under a valid one): below -eps
 * the evaluation's normalization took its square root, NaN throughout.  1
 * with the first named in where ("layer1.0.bn2.running_var[0] = -0.13"). */
static int negative_variance(struct gw_model *m, char *where, size_t len) {
  const float *run = gw_model_running(m);
  for (int i = 0; i < gw_model_num_buffer_tensors(m); i++) {
    const struct gw_tensor *t = gw_model_buffer_tensor(m, i);
    const size_t nl = strlen(t->name);
    if (t->kind != GW_TENSOR_RUNNING || nl < 11 || strcmp(t->name + nl - 11, "running_var") != 0) continue;
    for (size_t k = 0; k < t->numel; k++)
      if (run[t->offset + k] < 0) {
        snprintf(where, len, "%s[%zu] = %g", t->name, k, (double)run[t->offset + k]);
        return 1;
      }
  }
  return 0;
}

static int loaded_weights_finite(struct gw_model *m, const char *path, char *err, size_t len) {
  /* A test hook: the tests of what a model holding a NaN does (the
   * evaluation's score, the metrics, the refused saves) load one. */
  const char *hook = getenv("GW_TRAIN_TEST_LOAD_NONFINITE");
  if (hook && !strcmp(hook, "1")) return 0;
  char where[160];
  if (ckpt_nonfinite(m, gw_model_params(m), NULL, gw_model_running(m), where, sizeof where)) {
    snprintf(err, len, "%s holds a value that is not finite, %s: refused (a model to train, evaluate or save holds "
             "finite values only)", path, where);
    return -1;
  }
  if (negative_variance(m, where, sizeof where)) {
    snprintf(err, len, "%s holds a batch-norm variance below 0, %s: refused (the file is damaged)", path, where);
    return -1;
  }
  return 0;
}

int ckpt_save(const char *dir, int keep, struct gw_model *m, struct gw_sgd *sgd, const struct ckpt_state *st,
              const char *config, char *err, size_t errlen) {
  char where[160];
  if (ckpt_nonfinite(m, gw_model_params(m), gw_sgd_momentum(sgd), gw_model_running(m), where, sizeof where)) {
    snprintf(err, errlen, "not saved: the model holds a value that is not finite, %s (the checkpoints already in %s "
             "are kept)", where, dir);
    return -1;
  }
  if (ckpt_make_dir(dir) != 0) {
    snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
    return -1;
  }
  struct ckpt_tensors c;
  describe(&c, m, sgd, st);
  char sum[32], path[4096], pending[64];
  snprintf(path, sizeof path, "%s/ckpt-%" PRId64 ".safetensors", dir, st->step);
  snprintf(pending, sizeof pending, "%" PRId64 " %.17g", st->eval_epoch, st->eval_train_loss);
  const char *const vals[NCOVERED] = {CKPT_VERSION, "gradwire-checkpoint", config, st->options,
                                      st->eval_epoch ? pending : NULL};
  snprintf(sum, sizeof sum, "%016" PRIx64, checksum(&c, vals));
  const char *meta[2 * NCOVERED + 3];
  int n = 0;
  for (int i = 0; i < NCOVERED; i++)
    if (vals[i]) meta[n++] = covered[i], meta[n++] = vals[i];
  meta[n++] = "checksum", meta[n++] = sum, meta[n] = NULL;
  if (gw_st_write(path, c.t, c.n, meta) != GW_SUCCESS) {
    snprintf(err, errlen, "%s", gw_model_last_error());
    return -1;
  }
  ckpt_prune(dir, keep);
  return 0;
}

/* Whether a checkpoint's configuration names the training samples (this
 * gw-train's), not --data's text (an older one's). */
static bool names_samples(const char *cfg) { return cfg && strstr(cfg, " data=train:") != NULL; }

/* Whether f is whole: its checksum over its tensors (in the writer's order:
 * describe()'s) and, from format version 2, its metadata.  0, -1 + why, or
 * NEWER + why: a later gw-train's format (not the file's fault). */
enum { NEWER = -2 };
static int verify(const struct gw_st_file *f, char *why, size_t whylen) {
  static const char *const order[] = {"params", "momentum", "running", "counters", "state", "loss_sum", "scaler"};
  const char *version = gw_st_metadata(f, "format_version"), *sum = gw_st_metadata(f, "checksum");
  struct ckpt_tensors c = {.n = 0};
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    const struct gw_st_tensor *t = gw_st_find(f, order[i]);
    if (t) c.t[c.n++] = *t;
  }
  const char *vals[NCOVERED];
  for (int k = 0; k < NCOVERED; k++) vals[k] = gw_st_metadata(f, covered[k]);
  char have[32];
  if (version && strcmp(version, CKPT_VERSION) != 0) {
    char *end;
    errno = 0;
    const long long v = strtoll(version, &end, 10);
    /* A version-2 file whose version alone was damaged ("2" to "3" or "6" is
     * one bit) still matches its checksum as version 2: a newer writer's
     * checksum covers its own version string (every later format must keep
     * format_version among the covered entries, or its files would read as
     * damaged version-2 files here). */
    vals[0] = CKPT_VERSION;
    snprintf(have, sizeof have, "%016" PRIx64, checksum(&c, vals));
    if (sum && strcmp(sum, have) == 0) {
      snprintf(why, whylen, "its format version '%.20s' was damaged: the rest of the file is a version %s "
               "checkpoint", version, CKPT_VERSION);
      return -1;
    }
    if (version[0] >= '1' && version[0] <= '9' && !*end && !errno && v > atoll(CKPT_VERSION)) {
      snprintf(why, whylen, "a newer gw-train wrote it (format version %lld; this one reads %s and, without the "
               "key, 1)", v, CKPT_VERSION);
      return NEWER;
    }
    snprintf(why, whylen, "its format version '%.20s' is not one gw-train writes (%s; version 1 files have no "
             "format_version): the file is damaged", version, CKPT_VERSION);
    return -1;
  }
  /* A tensor no gw-train writes is outside the checksum: damage (a name's
   * bytes) or a foreign file. */
  for (int i = 0; i < f->ntensors; i++) {
    int known = 0;
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) known |= !strcmp(f->tensors[i].name, order[k]);
    if (!known) {
      snprintf(why, whylen, "it holds a tensor '%.40s' that no gw-train writes: the file is damaged",
               f->tensors[i].name);
      return -1;
    }
  }
  /* A damaged key would otherwise go unnoticed: "format_version" misspelt
   * reads as version 1, whose checksum leaves the metadata out. */
  for (int i = 0; i < f->nmeta; i++) {
    int known = !strcmp(f->meta[2 * i], "checksum");
    for (int k = 0; k < NCOVERED; k++) known |= !strcmp(f->meta[2 * i], covered[k]);
    if (!known) {
      snprintf(why, whylen, "its metadata has a key '%.40s' that no gw-train writes: the file is damaged",
               f->meta[2 * i]);
      return -1;
    }
  }
  snprintf(have, sizeof have, "%016" PRIx64, checksum(&c, version ? vals : NULL));
  if (!sum || strcmp(sum, have) != 0) {
    snprintf(why, whylen, "its checksum %s does not match its contents (%s): the file is damaged", sum ? sum : "(none)",
             have);
    return -1;
  }
  return 0;
}

/* The model's words of a run's configuration (its name, classes, input
 * channels, stem and width: not the image size, which weights do not fix,
 * nor the run's data, world or batch), as ckpt_model_words writes them; 0
 * when one is missing. */
static int config_model_words(const char *cfg, char *out, size_t cap) {
  static const char *const keys[] = {"classes", "in_channels", "stem", "width_divisor"};
  int n = snprintf(out, cap, "%.*s", (int)strcspn(cfg, " "), cfg);
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    char k[32];
    snprintf(k, sizeof k, " %s=", keys[i]);
    const char *v = strstr(cfg, k);
    if (!v || n < 0 || (size_t)n >= cap) return 0;
    v += strlen(k);
    n += snprintf(out + n, cap - (size_t)n, "%s%.*s", k, (int)strcspn(v, " "), v);
  }
  return n > 0 && (size_t)n < cap;
}

/* Checks f against the model and the run, then copies it in; 0 or -1 + why.
 * legacy: the run as older gw-trains described it (NULL: not taken);
 * name_step: the step its file name says. */
static int load_one(struct gw_st_file *f, int64_t name_step, struct gw_model *m, struct gw_sgd *sgd,
                    struct ckpt_state *st, const char *config, const char *legacy, int64_t spe, int64_t batch,
                    char *why, size_t whylen) {
  const int v = verify(f, why, whylen);
  if (v != 0) return v;
  const char *cfg = gw_st_metadata(f, "config");
  if (!cfg || (strcmp(cfg, config) != 0 && (!legacy || strcmp(cfg, legacy) != 0))) {
    /* What differs first (world 2 -> 1): the two whole descriptions are
     * long, and a long folder name cut the message before the part that
     * differed. */
    const char *mine = cfg && !names_samples(cfg) && legacy ? legacy : config;
    /* the model's name leads without a key, so the word diff skips it */
    char words[360] = "", named[100] = "", diff[480];
    if (cfg && opt_words_diff(cfg, mine, NULL, words, sizeof words) <= 0) words[0] = 0;
    const int name_len = (int)strcspn(mine, " "), their_len = cfg ? (int)strcspn(cfg, " ") : 0;
    if (cfg && (their_len != name_len || strncmp(cfg, mine, (size_t)name_len) != 0))
      snprintf(named, sizeof named, "model %.*s -> %.*s", their_len > 40 ? 40 : their_len, cfg,
               name_len > 40 ? 40 : name_len, mine);
    snprintf(diff, sizeof diff, "%s%s%s", named, named[0] && words[0] ? ", " : "", words);
    /* another world or batch on the same model: its weights can go on */
    char ours[400], theirs[400];
    const bool regroup = cfg && (strstr(diff, "world ") || strstr(diff, "batch ")) &&
                         config_model_words(cfg, theirs, sizeof theirs) &&
                         config_model_words(mine, ours, sizeof ours) && !strcmp(ours, theirs);
    snprintf(why, whylen, "it is from another run%s%s (%s; this run is %s)%s", diff[0] ? ": " : "", diff,
             cfg ? cfg : "no configuration", mine,
             regroup ? "; to go on with another world size or batch, start a new run from its weights: "
                       "--load-weights with that file (momentum and the schedule start anew)" : "");
    return -1;
  }
  struct ckpt_tensors want;
  struct ckpt_state zero = {0};
  describe(&want, m, sgd, &zero);
  /* Checkpoints written before the loss scaler was saved lack its tensor (the
   * last one); they load without it. */
  st->has_scaler = gw_st_find(f, "scaler") != NULL;
  if (!st->has_scaler) want.n--;
  if (!gw_st_find(f, "momentum") != !gw_sgd_momentum(sgd)) {
    snprintf(why, whylen, "it was written by a run %s momentum buffer and this run has %s (--momentum); to go on "
             "with the other --momentum, start a new run from its weights: --load-weights with that file (the "
             "schedule starts anew)", gw_sgd_momentum(sgd) ? "without a" : "with a",
             gw_sgd_momentum(sgd) ? "one" : "none");
    return -1;
  }
  struct ckpt_tensors got = want;
  for (int i = 0; i < want.n; i++) {
    /* The configuration matched, so the model and its tensors are this run's:
     * anything else here is damage (a header edited or corrupted in place). */
    const struct gw_st_tensor *t = gw_st_find(f, want.t[i].name);
    if (!t) {
      snprintf(why, whylen, "it has no tensor %s: the file is damaged", want.t[i].name);
      return -1;
    }
    if (t->dtype != want.t[i].dtype) {
      snprintf(why, whylen, "its tensor %s is %s, not %s: the file is damaged", want.t[i].name, t->dtype_name,
               gw_st_dtype_name(want.t[i].dtype));
      return -1;
    }
    if (t->nbytes != want.t[i].nbytes) {
      snprintf(why, whylen, "its tensor %s has %zu bytes, not %zu: the file is damaged", want.t[i].name, t->nbytes,
               want.t[i].nbytes);
      return -1;
    }
    got.t[i].data = t->data;
  }
  /* The step inside is the one its name says: a file copied to another name
   * (ckpt-100 as ckpt-999, to force a resume from it) resumed at its own step
   * while the name ordered the pruning, which then deleted every new save
   * below 999 as it was written.  The checksum does not cover the name. */
  for (int i = 0; i < want.n; i++) {
    int64_t step;
    if (want.t[i].data != want.state) continue;
    memcpy(&step, got.t[i].data, sizeof step);
    if (step != name_step) {
      snprintf(why, whylen, "it holds step %" PRId64 " under the name of step %" PRId64 " (renamed?)", step,
               name_step);
      return -1;
    }
  }
  /* Metadata a writer before these had none of. */
  const char *pending = gw_st_metadata(f, "eval_pending"), *options = gw_st_metadata(f, "options");
  long long pe = 0;
  double pl = 0;
  int end = 0;
  if (pending && (sscanf(pending, "%lld %lf%n", &pe, &pl, &end) != 2 || pending[end] || pe < 1)) {
    snprintf(why, whylen, "its pending evaluation '%.60s' is not readable: the file is damaged", pending);
    return -1;
  }
  if (st->has_scaler) {
    double sc[3];
    memcpy(sc, got.t[want.n - 1].data, sizeof sc);
    if (!(sc[0] >= 0 && sc[0] <= 3.4e38) || !(sc[1] >= 0 && sc[1] < 9e18) || !(sc[2] >= 0 && sc[2] < 9e18)) {
      snprintf(why, whylen, "its loss scaler state (%g, %g, %g) is not usable", sc[0], sc[1], sc[2]);
      return -1;
    }
  }
  for (int i = 0; i < want.n; i++) memcpy((void *)want.t[i].data, got.t[i].data, want.t[i].nbytes);
  /* What a save never writes, under a valid checksum (a writer's bug, a hand
   * edit): refused as --load-weights refuses it, not trained on (a NaN in the
   * running statistics trained an epoch, then no save was possible; a
   * negative loss count printed a negative mean loss; epoch 1e12 at step 4
   * said "epoch 1000000000001 done").  A refused file's values are replaced
   * by the next one's, or the resume stops. */
  const int64_t *sv = want.state;
  if (sv[0] < 0 || sv[1] < 0 || sv[1] > sv[0] || sv[2] < 0 || sv[3] < 0 || sv[4] < 0 || sv[4] > sv[0] ||
      !isfinite(want.loss_sum) || pe > sv[1] + 1 || pe > sv[0]) {
    snprintf(why, whylen, "its training state (step %" PRId64 ", epoch %" PRId64 ", position %" PRId64
             ", sgd steps %" PRId64 ", losses %" PRId64 " summing to %g, pending evaluation %lld) is not one a run "
             "saves: the file is damaged", sv[0], sv[1], sv[2], sv[3], sv[4], want.loss_sum, pe);
    return -1;
  }
  /* The data's place is where that many steps leave it: each step takes
   * one batch, and an epoch's end puts the position back to 0 (a step, epoch
   * or position set apart skipped or repeated data unsaid, and the log said
   * "epoch 6/2").  This gw-train's configuration matched: the batches per
   * epoch are the saved run's (an older gw-train's, naming --data's text,
   * does not fix the sample count: not checked). */
  const int64_t batches = batch > 0 ? sv[2] / batch : 0;
  if (spe > 0 && batch > 0 && !strcmp(gw_st_metadata(f, "config"), config) &&
      (sv[2] % batch || batches >= spe || (sv[0] - batches) % spe || (sv[0] - batches) / spe != sv[1])) {
    snprintf(why, whylen, "its training state (step %" PRId64 ", epoch %" PRId64 ", position %" PRId64 ") is not "
             "where a run's steps leave the data (%" PRId64 " batches of %" PRId64 " per epoch): the file is damaged",
             sv[0], sv[1], sv[2], spe, batch);
    return -1;
  }
  char bad_value[160];
  if (ckpt_nonfinite(m, gw_model_params(m), gw_sgd_momentum(sgd), gw_model_running(m), bad_value,
                     sizeof bad_value)) {
    snprintf(why, whylen, "it holds a value that is not finite, %s (saves refuse those): the file is damaged",
             bad_value);
    return -1;
  }
  if (negative_variance(m, bad_value, sizeof bad_value)) {
    snprintf(why, whylen, "it holds a batch-norm variance below 0, %s (no run writes one): the file is damaged",
             bad_value);
    return -1;
  }
  st->step = want.state[0], st->epoch = want.state[1], st->position = want.state[2];
  st->sgd_steps = want.state[3], st->loss_count = want.state[4], st->loss_sum = want.loss_sum;
  if (st->has_scaler)
    st->loss_scale = want.scaler[0], st->good_steps = (int64_t)want.scaler[1], st->overflows = (int64_t)want.scaler[2];
  st->eval_epoch = pending ? pe : 0, st->eval_train_loss = pending ? pl : 0;
  snprintf(st->options, sizeof st->options, "%s", options ? options : "");
  return 0;
}

/* Before a checkpoint's data is read (gw_st_open_checked): a file without a
 * configuration is not gw-train's, and one of this run's configuration
 * holds describe()'s bytes with a momentum buffer at most; either, however
 * big (twice that: a smaller excess is read, for verify() to name the
 * damage), is refused having read its header only (a foreign 100 GB file named ckpt-N was read whole
 * first: out of memory, which stopped the resume instead of falling back).
 * A file of another configuration is another run's checkpoint (its size is
 * a model's): read, for load_one to say what differs. */
struct header_want {
  const char *config, *legacy;
  size_t max_bytes;
  char why[600];
};

static gw_result_t ckpt_header_check(const struct gw_st_file *h, const char *path, void *arg) {
  (void)path; /* the caller names the file */
  struct header_want *w = arg;
  const char *cfg = gw_st_metadata(h, "config");
  size_t bytes = 0;
  for (int i = 0; i < h->ntensors; i++) bytes += h->tensors[i].nbytes;
  if (!cfg)
    snprintf(w->why, sizeof w->why, "no \"config\" in its metadata (%d tensor%s, %zu bytes): not a checkpoint of "
             "gw-train", h->ntensors, h->ntensors == 1 ? "" : "s", bytes);
  else if ((!strcmp(cfg, w->config) || (w->legacy && !strcmp(cfg, w->legacy))) && bytes / 2 > w->max_bytes)
    snprintf(w->why, sizeof w->why, "its tensors hold %zu bytes, over twice the %zu of a checkpoint of this run's "
             "configuration: the file is damaged", bytes, w->max_bytes);
  else
    return GW_SUCCESS;
  return GW_ERR_INVALID_ARGUMENT;
}

struct probe {
  int is_ckpt;
};
/* Only a file with a run's configuration and gw-train's format (or, version
 * 1, its params tensor) is read as a checkpoint; a weights file, even one
 * with a "config" of its own, is left to the model's loader, unread here. */
static gw_result_t probe_header(const struct gw_st_file *h, const char *path, void *arg) {
  (void)path;
  struct probe *p = arg;
  const char *format = gw_st_metadata(h, "format");
  p->is_ckpt = gw_st_metadata(h, "config") && ((format && !strcmp(format, "gradwire-checkpoint")) ||
                                               gw_st_find(h, "params")); /* version 1 */
  return p->is_ckpt ? GW_SUCCESS : GW_ERR_INVALID_ARGUMENT;
}

static int ckpt_load_weights(const char *path, struct gw_model *m, const char *model_words, char *why,
                             size_t whylen) {
  struct probe p = {0};
  struct gw_st_file *f = NULL;
  if (gw_st_open_checked(&f, path, probe_header, &p) != GW_SUCCESS) {
    if (!p.is_ckpt) return 1;
    snprintf(why, whylen, "%s", gw_model_last_error());
    return -1;
  }
  const char *cfg = gw_st_metadata(f, "config");
  char theirs[400];
  int r = -1;
  if (!config_model_words(cfg, theirs, sizeof theirs))
    snprintf(why, whylen, "%s: a checkpoint whose configuration names no model (%.200s): the file is damaged", path,
             cfg);
  else if (strcmp(theirs, model_words) != 0)
    snprintf(why, whylen, "%s: a checkpoint of another model (%s; this run's: %s)", path, theirs, model_words);
  else if (verify(f, why, whylen) != 0) { /* damaged, or a newer gw-train's */
    char v[600];
    snprintf(v, sizeof v, "%s", why);
    snprintf(why, whylen, "%s: checkpoint refused: %s", path, v);
  } else {
    const struct { const char *name; gw_dtype_t dtype; void *dst; size_t numel; } want[3] = {
        {"params", GW_FLOAT32, gw_model_params(m), gw_model_num_params(m)},
        {"running", GW_FLOAT32, gw_model_running(m), buffer_elems(m, GW_TENSOR_RUNNING)},
        {"counters", GW_INT64, gw_model_counters(m), buffer_elems(m, GW_TENSOR_COUNTER)}};
    r = 0;
    for (int i = 0; i < 3 && r == 0; i++) {
      const struct gw_st_tensor *t = gw_st_find(f, want[i].name);
      if (!t || t->dtype != want[i].dtype || t->nbytes != want[i].numel * gw_st_dtype_size(want[i].dtype)) {
        snprintf(why, whylen, "%s: checkpoint refused: its tensor %s is missing or not this model's (%zu %s)", path,
                 want[i].name, want[i].numel, gw_st_dtype_name(want[i].dtype));
        r = -1;
      }
    }
    for (int i = 0; i < 3 && r == 0; i++)
      if (want[i].numel) memcpy(want[i].dst, gw_st_find(f, want[i].name)->data, gw_st_find(f, want[i].name)->nbytes);
  }
  gw_st_free(f);
  return r;
}

int load_weights(struct gw_model *m, const char *path, const char *model_name, char *err, size_t len) {
  const struct gw_model_config *cfg = gw_model_get_config(m);
  char words[300];
  snprintf(words, sizeof words, "%s classes=%d in_channels=%d stem=%s width_divisor=%d", model_name, cfg->classes,
           cfg->in_channels, cfg->stem == GW_STEM_SMALL ? "small" : "imagenet", cfg->width_divisor);
  const int ck = ckpt_load_weights(path, m, words, err, len);
  if (ck < 0) return -1;
  if (ck == 1 && gw_model_load_weights(m, path) != GW_SUCCESS) {
    snprintf(err, len, "%s", gw_model_last_error());
    return -1;
  }
  return loaded_weights_finite(m, path, err, len);
}

int ckpt_load_latest(const char *dir, struct gw_model *m, struct gw_sgd *sgd, struct ckpt_state *st,
                     const char *config, const char *legacy_config, int64_t steps_per_epoch, int64_t batch,
                     char *path_out, size_t pathlen, char *err_note, size_t notelen, char *err, size_t errlen) {
  int64_t steps[MAX_CKPT];
  int n = ckpt_list_steps(dir, steps, MAX_CKPT);
  if (n < 0) return errno == ENOENT ? 1 : (snprintf(err, errlen, "cannot read %s: %s", dir, strerror(errno)), -1);
  char why[1200];
  size_t used = 0;
  int other_samples = 0; /* a newer file of this gw-train's was refused */
  err_note[0] = 0;
  struct header_want want = {.config = config, .legacy = legacy_config};
  {
    struct ckpt_tensors c;
    struct ckpt_state zero = {0};
    describe(&c, m, sgd, &zero);
    for (int k = 0; k < c.n; k++) want.max_bytes += c.t[k].nbytes;
    /* --momentum is outside the configuration: a file with the buffer is this run's too (refused by load_one, by name) */
    if (!gw_sgd_momentum(sgd)) want.max_bytes += gw_model_num_params(m) * sizeof(float);
  }
  for (int i = 0; i < n; i++) {
    snprintf(path_out, pathlen, "%s/ckpt-%" PRId64 ".safetensors", dir, steps[i]);
    struct gw_st_file *f = NULL;
    want.why[0] = 0;
    gw_result_t opened = gw_st_open_checked(&f, path_out, ckpt_header_check, &want);
    if (opened == GW_ERR_SYSTEM) {
      /* Not the file's fault (out of memory or descriptors, permissions, an
       * I/O error): falling back would quietly redo steps and move a good
       * file aside. */
      snprintf(err, errlen, "cannot read the newest checkpoint: %s (not falling back to an older one: fix that, or "
               "move the file away to resume from the one before)", gw_model_last_error());
      return -1;
    }
    int ok = opened == GW_SUCCESS;
    if (!ok) snprintf(why, sizeof why, "%s", want.why[0] ? want.why : gw_model_last_error());
    /* An older gw-train's file (the data named by --data's text) only while no
     * newer file naming other samples was refused: that one says the data
     * changed, which the older file cannot tell. */
    const char *cfg = ok ? gw_st_metadata(f, "config") : NULL;
    if (ok && other_samples && legacy_config && cfg && !strcmp(cfg, legacy_config)) {
      snprintf(why, sizeof why, "it names --data's text (an older gw-train wrote it), and a newer checkpoint here "
               "names other training samples than this run's: the data changed since");
      ok = 0;
    }
    const int loaded =
        ok ? load_one(f, steps[i], m, sgd, st, config, other_samples ? NULL : legacy_config, steps_per_epoch, batch,
                      why, sizeof why)
           : -1;
    if (loaded == NEWER) { /* as a read error: falling back would redo steps and move the newer file aside */
      gw_st_free(f);
      snprintf(err, errlen, "cannot resume from %s: %s (not falling back to an older checkpoint: resume with that "
               "gw-train, or move the file away to resume from the one before)", path_out, why);
      return -1;
    }
    ok = loaded == 0;
    const bool legacy_loaded = ok && !names_samples(cfg);
    if (!ok && names_samples(cfg) && strcmp(cfg, config) != 0) other_samples = 1;
    gw_st_free(f);
    if (ok) {
      /* The newer files refused: out of the way of this run's pruning and saves
       * (left there, a refused newer file would count among the newest kept
       * and this run's own saves would be pruned as they are written). */
      for (int j = 0; j < i; j++) {
        char from[4096], to[4200];
        snprintf(from, sizeof from, "%s/ckpt-%" PRId64 ".safetensors", dir, steps[j]);
        if (ckpt_move_aside(from, to, sizeof to) != 0) {
          if (errno == EEXIST)
            snprintf(err, errlen, "%s; cannot move the refused %s aside: %s.refused and .refused.1 to .refused.%d "
                     "all exist (earlier refusals'); move or remove some to resume", err_note, from, from,
                     MAX_REFUSED - 1);
          else
            snprintf(err, errlen, "%s; cannot move the refused %s aside (to %s): %s; move or remove it to resume",
                     err_note, from, to, strerror(errno));
          err_note[0] = 0;
          return -1;
        }
        int w = snprintf(err_note + used, notelen > used ? notelen - used : 0, "; moved to %s", to);
        if (w > 0) used += (size_t)w < notelen - used ? (size_t)w : notelen - used - 1;
      }
      if (legacy_loaded)
        snprintf(err_note + used, notelen > used ? notelen - used : 0, "%s%s names --data's text (an older gw-train "
                 "wrote it), not its samples: that they are the same files was not checked", used ? "; " : "",
                 path_out);
      return 0;
    }
    /* Remember what was wrong with each newer file; go on to the older one. */
    int w = snprintf(err_note + used, notelen > used ? notelen - used : 0, "%scheckpoint %s refused: %s",
                     used ? "; " : "", path_out, why);
    if (w > 0) used += (size_t)w < notelen - used ? (size_t)w : notelen - used - 1;
  }
  if (n == 0) return 1;
  snprintf(err, errlen, "no usable checkpoint in %s: %s", dir, err_note);
  err_note[0] = 0;
  return -1;
}
