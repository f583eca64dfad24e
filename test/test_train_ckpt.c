/* test_train_ckpt.c - gw-train's checkpoints and --resume, end to end:
 * - resume is bit-exact: a 2-rank run interrupted after step 3
 *   (GW_TRAIN_STOP_AT_STEP) and resumed logs the same losses, bit for bit, for
 *   the later steps and writes byte-identical weights as an uninterrupted run
 *   (also with the weights on a pretend device, and with the loss scaler);
 * - a checkpoint of an older gw-train (no scaler state) still resumes;
 * - a damaged newest checkpoint (its tensors or its metadata) is refused by
 *   name, moved aside (an earlier refusal's copy kept), and the previous one
 *   used (and kept: pruning counts only this run's files); with none usable,
 *   --resume fails and says why;
 * - (the evaluation's pending mark, metadata damage and format versions: test_train_ckpt_meta.c);
 * - dead saves' temporary files go, in the folder and beside --save-weights;
 * - a folder of checkpoints is refused to a new run;
 * - the last step is saved; a run with other options is refused by name.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "gwrun_helpers.h"
#include "core.h"   /* gw__fnv */
#include "resnet.h" /* gw_model_last_error */
#include "safetensors.h"
#include "test_train.h"


static void copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  ck_assert_msg(a && b, "cannot copy %s to %s", from, to);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, a)) > 0) ck_assert_uint_eq(fwrite(buf, 1, n, b), n);
  ck_assert(!ferror(a) && fclose(b) == 0);
  fclose(a);
}

/* Seven steps uninterrupted against three, an interruption and a resume from
 * the checkpoint of step 2: the same losses (and the other metrics named in
 * keys) step by step and the same final weights, bit for bit.  env and flags
 * are added to every run. */
static void resume_case(const char *tag, const char *env1, const char *const *flags, const char *const *keys) {
  char full_w[512], full_m[512], part_w[512], part_m[512], full_d[512], part_d[512], name[128];
#define TAGGED(buf, what) (snprintf(name, sizeof name, "%s-" what, tag), path(buf, sizeof buf, name))
  TAGGED(full_w, "full.safetensors"), TAGGED(full_m, "full.jsonl"), TAGGED(full_d, "ckpt-full");
  TAGGED(part_w, "part.safetensors"), TAGGED(part_m, "part.jsonl"), TAGGED(part_d, "ckpt-part");
#undef TAGGED
  struct run r;
  const char *const env[] = {env1, NULL}, *const stop[] = {"GW_TRAIN_STOP_AT_STEP=3", env1, NULL};
  const char *common[32] = {"--steps", "7", "--batch", "8", "--checkpoint-every", "2", "--save-weights", NULL,
                            "--metrics", NULL, "--checkpoint-dir", NULL};
  int n = 12;
  for (int i = 0; flags[i]; i++) common[n++] = flags[i];
  common[7] = full_w, common[9] = full_m, common[11] = full_d;
  train(&r, env, "2", common);
  expect_ok(&r);
  gwrun_free(&r);
  common[7] = part_w, common[9] = part_m, common[11] = part_d;
  train(&r, stop, "2", common);
  ck_assert_msg(r.code != 0 && strstr(r.out, "stopping after step 3"), "the interrupted run: exit %d\n%s\n%s",
                r.code, r.out, r.err);
  gwrun_free(&r);
  common[n] = "--resume";
  train(&r, env, "2", common);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "resumed from") && strstr(r.out, "ckpt-2.safetensors at step 2"),
                "did not resume from step 2:\n%s", r.out);
  gwrun_free(&r);
  for (int k = 0; keys[k]; k++) {
    char lf[7][32], lp[7][32];
    memset(lf, 0, sizeof lf), memset(lp, 0, sizeof lp);
    ck_assert_int_eq(metrics_by_step(full_m, keys[k], lf, 7), 7);
    metrics_by_step(part_m, keys[k], lp, 7); /* steps 1-3, then 3-7 again after the resume: the later lines win */
    for (int s = 0; s < 7; s++)
      ck_assert_msg(strcmp(lf[s], lp[s]) == 0, "%s: step %d: %s %s uninterrupted, %s resumed", tag, s + 1, keys[k],
                    lf[s], lp[s]);
  }
  ck_assert_msg(same_file(full_w, part_w), "%s: the final weights differ between the uninterrupted and resumed runs",
                tag);
}

START_TEST(test_resume_is_bit_exact) {
  resume_case("plain", NULL, (const char *const[]){NULL}, (const char *const[]){"loss", NULL});
  /* The weights and momentum kept on a (pretend) device: checkpoints and the
   * resume go through the host copies. */
  resume_case("resident", "GW_TRAIN_CPU_AS_DEVICE=1", (const char *const[]){NULL},
              (const char *const[]){"loss", NULL});
}
END_TEST

/* The loss scaler's state is in the checkpoint: step 2 overflows (forced), the
 * scale halves to 32768 and step 2's checkpoint carries it and the overflow
 * count, so the resumed steps report what the uninterrupted ones do. */
START_TEST(test_resume_keeps_loss_scale) {
  resume_case("scaled", "GW_TRAIN_OVERFLOW_AT_STEP=2",
              (const char *const[]){"--amp", "bf16", "--loss-scale", "dynamic", NULL},
              (const char *const[]){"loss", "loss_scale", "overflows", NULL});
}
END_TEST

/* A run with a fixed --loss-scale resumed with a dynamic one starts the
 * dynamic scale at its own initial value (65536), not at the fixed 8. */
START_TEST(test_resume_fixed_scale_as_dynamic) {
  char dir[512], m[512];
  path(dir, sizeof dir, "ckpt-fixed-dynamic");
  path(m, sizeof m, "fixed-dynamic.jsonl");
  struct run r;
  const char *const noenv[] = {NULL};
  train(&r, noenv, "1", (const char *const[]){"--steps", "2", "--batch", "8", "--amp", "bf16", "--loss-scale", "8",
                                              "--checkpoint-dir", dir, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  train(&r, noenv, "1", (const char *const[]){"--steps", "3", "--batch", "8", "--amp", "bf16", "--loss-scale",
                                              "dynamic", "--checkpoint-dir", dir, "--resume", "--metrics", m, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "loss_scale 8 -> dynamic:65536"), "no note of the change:\n%s", r.out);
  gwrun_free(&r);
  char v[3][32];
  memset(v, 0, sizeof v);
  metrics_by_step(m, "loss_scale", v, 3);
  ck_assert_msg(!strcmp(v[2], "65536"), "step 3 ran at loss scale '%s', not dynamic's 65536", v[2]);
}
END_TEST

/* Rewrites checkpoint `file` in format `version` with its checksum (FNV-1a
 * 64 over the tensors' bytes in file order, then, from version 2, each
 * covered metadata key, whether it is there, and its value) made as its
 * writer would.  Version NULL: as format version 1 was written, no
 * format_version and the checksum over the tensors alone.  Tensor `skip` is
 * left out (NULL: none).  Its metadata is kept (format, config, options,
 * eval_pending), or with `config` given, only format and that config (the
 * oldest writer's three keys). */
/* An edit of one tensor's bytes before the checksum is made (rewrite_with),
 * or (tensor NULL) the saved options replaced by `options`. */
struct tensor_edit {
  const char *tensor;
  size_t at;
  const void *bytes;
  size_t len;
  const char *options;
};

static void rewrite_with(const char *file, const char *skip, const char *config, const char *version,
                         const struct tensor_edit *edit) {
  struct gw_st_file *f = NULL;
  ck_assert_msg(gw_st_open(&f, file) == GW_SUCCESS, "%s", gw_model_last_error());
  struct gw_st_tensor keep[16];
  int n = 0;
  uint64_t h = GW_FNV_START;
  void *edited = NULL;
  for (int i = 0; i < f->ntensors; i++) {
    if (skip && !strcmp(f->tensors[i].name, skip)) continue;
    ck_assert(n < 16);
    keep[n] = f->tensors[i];
    if (edit && edit->tensor && !strcmp(keep[n].name, edit->tensor)) {
      ck_assert(edit->at + edit->len <= keep[n].nbytes && (edited = malloc(keep[n].nbytes)));
      memcpy(edited, keep[n].data, keep[n].nbytes);
      memcpy((char *)edited + edit->at, edit->bytes, edit->len);
      keep[n].data = edited;
    }
    h = gw__fnv(h, keep[n].data, keep[n].nbytes);
    n++;
  }
  ck_assert_msg(!edit || !edit->tensor || edited, "no tensor %s in %s", edit ? edit->tensor : "", file);
  ck_assert_int_eq(n, f->ntensors - (skip != NULL));
  const char *vals[] = {version, gw_st_metadata(f, "format"), config ? config : gw_st_metadata(f, "config"),
                        config       ? NULL
                        : edit && edit->options ? edit->options
                                                : gw_st_metadata(f, "options"),
                        config ? NULL : gw_st_metadata(f, "eval_pending")};
  static const char *const keys[] = {"format_version", "format", "config", "options", "eval_pending"};
  for (int k = 0; version && k < 5; k++) {
    const unsigned char present = vals[k] != NULL;
    h = gw__fnv(h, keys[k], strlen(keys[k]) + 1);
    h = gw__fnv(h, &present, 1);
    if (present) h = gw__fnv(h, vals[k], strlen(vals[k]) + 1);
  }
  char sum[32];
  snprintf(sum, sizeof sum, "%016llx", (unsigned long long)h);
  const char *meta[16] = {"checksum", sum};
  int m = 2;
  for (int k = 0; k < 5; k++)
    if (vals[k]) meta[m++] = keys[k], meta[m++] = vals[k];
  meta[m] = NULL;
  ck_assert_msg(gw_st_write(file, keep, n, meta) == GW_SUCCESS, "%s", gw_model_last_error());
  gw_st_free(f);
  free(edited);
}

void rewrite_as(const char *file, const char *skip, const char *config, const char *version) {
  rewrite_with(file, skip, config, version, NULL);
}

void as_version1(const char *file, const char *skip, const char *config) {
  rewrite_as(file, skip, config, NULL);
}

/* Rewrites checkpoint `file` as gw-train wrote it before the loss scaler was
 * saved: version 1 without "scaler", and the run named by --data's text
 * (data=synthetic, COMMON's), not by its samples. */
static void strip_scaler(const char *file) {
  struct gw_st_file *f = NULL;
  ck_assert_msg(gw_st_open(&f, file) == GW_SUCCESS, "%s", gw_model_last_error());
  char config[512];
  const char *now = gw_st_metadata(f, "config"), *data = strstr(now, " data=train:");
  ck_assert_msg(data, "no data=train: in the config '%s'", now);
  const char *after = strchr(data + 1, ' ');
  snprintf(config, sizeof config, "%.*s data=synthetic%s", (int)(data - now), now, after);
  gw_st_free(f);
  as_version1(file, "scaler", config);
}

/* A checkpoint of an older gw-train (no loss scaler state, the data named by
 * --data's text) still resumes: the scale restarts at its initial value, and
 * the run says so, and that the samples were not checked.  Behind a newer
 * checkpoint of other samples it is refused. */
START_TEST(test_resume_old_checkpoint) {
  char dir[512], c2[600];
  path(dir, sizeof dir, "ckpt-old");
  snprintf(c2, sizeof c2, "%s/ckpt-2.safetensors", dir);
  struct run r;
  const char *const noenv[] = {NULL};
  const char *args[] = {"--steps", "2", "--batch", "8", "--amp", "bf16", "--loss-scale", "dynamic",
                        "--checkpoint-dir", dir, "--checkpoint-every", "2", NULL, NULL};
  train(&r, noenv, "1", args);
  expect_ok(&r);
  gwrun_free(&r);
  strip_scaler(c2);
  args[1] = "3", args[12] = "--resume";
  train(&r, noenv, "1", args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-2.safetensors at step 2") &&
                    strstr(r.out, "no loss scaler state (written by an older gw-train); the loss scale restarts at "
                                  "65536") &&
                    strstr(r.out, "names --data's text (an older gw-train wrote it), not its samples"),
                "an old checkpoint was not resumed with a note:\n%s", r.out);
  gwrun_free(&r);
  /* An old file behind a newer one of other samples: the data changed since,
   * so neither is taken (the old one resumed from 100 steps back on the new
   * data, and the newer file was moved aside). */
  char dir2[512], c4[600];
  path(dir2, sizeof dir2, "ckpt-old-mixed");
  snprintf(c2, sizeof c2, "%s/ckpt-2.safetensors", dir2);
  snprintf(c4, sizeof c4, "%s/ckpt-4.safetensors", dir2);
  args[1] = "4", args[9] = dir2, args[12] = NULL;
  train(&r, noenv, "1", args);
  expect_ok(&r);
  gwrun_free(&r);
  strip_scaler(c2);
  const char *other[] = {"--steps", "6", "--batch", "8", "--amp", "bf16", "--loss-scale", "dynamic", "--checkpoint-dir",
                         dir2, "--resume", "--synthetic-samples", "64", NULL};
  train(&r, noenv, "1", other);
  ck_assert_msg(r.code != 0 && strstr(r.err, "the data changed since") && access(c4, F_OK) == 0 &&
                    access(c2, F_OK) == 0,
                "an old checkpoint behind one of other samples: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

static void flip_byte(const char *file, long from_end) {
  FILE *f = fopen(file, "r+b");
  ck_assert_msg(f, "cannot open %s", file);
  fseek(f, -from_end, SEEK_END);
  int c = fgetc(f);
  fseek(f, -from_end, SEEK_END);
  fputc(c ^ 0x40, f);
  fclose(f);
}

/* 4 steps into dir: ckpt-2 and ckpt-4. */
void four_steps(const char *dir) {
  struct run r;
  const char *const noenv[] = {NULL};
  train(&r, noenv, "1", (const char *const[]){"--steps", "4", "--batch", "8", "--checkpoint-dir", dir,
                                              "--checkpoint-every", "2", NULL});
  expect_ok(&r);
  gwrun_free(&r);
}

/* four_steps, then one byte of ckpt-4 (c4) flipped inside the data, where
 * only the checksum can tell. */
static void newest_damaged(const char *dir, const char *c4) {
  four_steps(dir);
  flip_byte(c4, 100);
}

START_TEST(test_damaged_checkpoint) {
  char dir[512], c2[600], c4[600];
  path(dir, sizeof dir, "ckpt-damage/of/a/new/run"); /* the folders above made too, as mkdir -p */
  snprintf(c2, sizeof c2, "%s/ckpt-2.safetensors", dir);
  snprintf(c4, sizeof c4, "%s/ckpt-4.safetensors", dir);
  struct run r;
  const char *const noenv[] = {NULL};
  newest_damaged(dir, c4);
  train(&r, noenv, "1", (const char *const[]){"--steps", "6", "--batch", "8", "--checkpoint-dir", dir,
                                              "--checkpoint-every", "2", "--resume", NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-4.safetensors refused") && strstr(r.out, "checksum") &&
                    strstr(r.out, "ckpt-2.safetensors at step 2"),
                "expected ckpt-4 refused and ckpt-2 used:\n%s", r.out);
  gwrun_free(&r);
  /* Now damage everything: resume must refuse, not start over. */
  char c6[600];
  snprintf(c6, sizeof c6, "%s/ckpt-6.safetensors", dir);
  flip_byte(c2, 100), flip_byte(c6, 100);
  ck_assert_int_eq(truncate(c4, 50), 0);
  train(&r, noenv, "1", (const char *const[]){"--steps", "8", "--batch", "8", "--checkpoint-dir", dir, "--resume",
                                              NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "no usable checkpoint"), "exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* four_steps in folder `pattern` (with i) under the test's directory (dir,
 * 512 bytes), its ckpt-4 (c4, 600) opened, and its format version (16). */
static struct gw_st_file *four_steps_named(const char *pattern, int i, char *dir, char *c4, char *version) {
  char name[64];
  snprintf(name, sizeof name, pattern, i);
  path(dir, 512, name);
  snprintf(c4, 600, "%s/ckpt-4.safetensors", dir);
  four_steps(dir);
  struct gw_st_file *f = NULL;
  ck_assert_msg(gw_st_open(&f, c4) == GW_SUCCESS, "%s", gw_model_last_error());
  snprintf(version, 16, "%s", gw_st_metadata(f, "format_version"));
  return f;
}

/* Values no save writes, under a checksum made as the writer's (a writer's
 * bug, a hand edit): refused as --load-weights refuses them, the resume
 * falling back to ckpt-2.  A NaN in the running statistics trained to the
 * epoch's end and then no save was possible; a negative loss count printed
 * a negative mean loss; a negative variance (bn1's, in the first 64 values)
 * trained and saved, and the save was refused by --load-weights; an epoch or
 * position that step 4 does not reach (96 samples, batch 8: 12 steps an
 * epoch, step 4 at epoch 0, position 32) logged "epoch 2/1", or skipped a
 * batch unsaid. */
START_TEST(test_resume_refuses_impossible_values) {
  const float nan = NAN;
  float minus1[64];
  for (int k = 0; k < 64; k++) minus1[k] = -1.0f;
  const int64_t minus3 = -3, one = 1, forty = 40;
  const struct tensor_edit edits[] = {{"running", 0, &nan, sizeof nan, NULL},
                                      {"state", 4 * sizeof(int64_t), &minus3, 8, NULL},
                                      {"running", 0, minus1, sizeof minus1, NULL},
                                      {"state", 1 * sizeof(int64_t), &one, 8, NULL},
                                      {"state", 2 * sizeof(int64_t), &forty, 8, NULL}};
  const char *why[] = {"holds a value that is not finite", "its training state (step 4, epoch 0, position",
                       "holds a batch-norm variance below 0, bn1.running_var[0] = -1 (no run writes one)",
                       "its training state (step 4, epoch 1, position 32) is not where a run's steps leave the data "
                       "(12 batches of 8 per epoch)",
                       "its training state (step 4, epoch 0, position 40) is not where"};
  for (int i = 0; i < 5; i++) {
    char dir[512], c4[600], version[16];
    gw_st_free(four_steps_named("ckpt-impossible-%d", i, dir, c4, version));
    rewrite_with(c4, NULL, NULL, version, &edits[i]);
    struct run r;
    train(&r, (const char *const[]){NULL}, "1", (const char *const[]){"--steps", "6", "--batch", "8",
                                                                       "--checkpoint-dir", dir, "--resume", NULL});
    expect_ok(&r);
    ck_assert_msg(strstr(r.out, "ckpt-4.safetensors refused") && strstr(r.out, why[i]) &&
                      strstr(r.out, "ckpt-2.safetensors at step 2"),
                  "expected ckpt-4 refused (%s) and ckpt-2 used:\n%s", why[i], r.out);
    gwrun_free(&r);
  }
}
END_TEST

/* A checkpoint whose saved options hold numbers out of any flag's range
 * (edited, the checksum made again): the resume's note on the schedule's
 * change read warmup_epochs=1e308 into an integer (undefined: UBSan stopped
 * the run) and printed a rate of 0 for the saved run.  Now the saved
 * schedule is taken as unknown, and nothing is said of it. */
START_TEST(test_resume_saved_schedule_out_of_range) {
  static const char *const words[][2] = {{"warmup_epochs=", "1e308"}, {"warmup_epochs=", "nan"},
                                         {"epochs=", "99999999999999999999"}, {"lr_milestones=", "1,1e300"}};
  for (int i = 0; i < 4; i++) {
    char dir[512], c4[600], opts[4096], version[16];
    struct gw_st_file *f = four_steps_named("ckpt-saved-sched-%d", i, dir, c4, version);
    const char *o = gw_st_metadata(f, "options");
    char key[40];
    snprintf(key, sizeof key, " %s", words[i][0]);
    const char *at = o ? strstr(o, key) : NULL;
    ck_assert_msg(at, "no '%s' in the saved options: %s", key, o ? o : "(none)");
    const int keep = (int)(at - o) + (int)strlen(key);
    snprintf(opts, sizeof opts, "%.*s%s%s", keep, o, words[i][1], at + strlen(key) + strcspn(at + strlen(key), " "));
    gw_st_free(f);
    const struct tensor_edit edit = {.options = opts};
    rewrite_with(c4, NULL, NULL, version, &edit);
    struct run r;
    train(&r, (const char *const[]){NULL}, "1", (const char *const[]){"--steps", "6", "--batch", "8",
                                                                       "--checkpoint-dir", dir, "--resume", NULL});
    expect_ok(&r);
    ck_assert_msg(strstr(r.out, "ckpt-4.safetensors at step 4") && !strstr(r.out, "learning-rate schedule now spans"),
                  "%s%s: expected a resume from step 4 with nothing said of the saved schedule:\n%s", words[i][0],
                  words[i][1], r.out);
    gwrun_free(&r);
  }
}
END_TEST

/* A foreign safetensors file named as the newest checkpoint (no gw-train
 * configuration; 64 GiB of tensor, sparse) is refused by its header and the
 * resume falls back: it was read whole first, and the allocation's failure
 * (out of memory) stopped the resume as a read error. */
START_TEST(test_big_foreign_checkpoint) {
  char dir[512], c9[600];
  path(dir, sizeof dir, "ckpt-foreign");
  snprintf(c9, sizeof c9, "%s/ckpt-9.safetensors", dir);
  four_steps(dir);
  static const char header[] = "{\"x\":{\"dtype\":\"U8\",\"shape\":[68719476736],\"data_offsets\":[0,68719476736]}}";
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((sizeof header - 1) >> (8 * i));
  FILE *o = fopen(c9, "wb");
  ck_assert_msg(o && fwrite(len8, 1, 8, o) == 8 && fwrite(header, 1, sizeof header - 1, o) == sizeof header - 1,
                "cannot write %s", c9);
  ck_assert_int_eq(ftruncate(fileno(o), (off_t)(8 + sizeof header - 1) + (1LL << 36)), 0);
  fclose(o);
  struct run r;
  const char *const noenv[] = {NULL};
  train(&r, noenv, "1", (const char *const[]){"--steps", "6", "--batch", "8", "--checkpoint-dir", dir,
                                              "--checkpoint-every", "2", "--resume", NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-9.safetensors refused") && strstr(r.out, "not a checkpoint of gw-train") &&
                    strstr(r.out, "ckpt-4.safetensors at step 4"),
                "expected the foreign ckpt-9 refused by its header and ckpt-4 used:\n%s\n%s", r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* A checkpoint folder that holds checkpoints is another run's unless --resume
 * says otherwise: a new run there is refused and leaves the files as they
 * were (it would have overwritten them, and pruned them to the newest K). */
START_TEST(test_checkpoint_dir_guarded) {
  char dir[512], c2[600], copy[600];
  path(dir, sizeof dir, "ckpt-guard");
  snprintf(c2, sizeof c2, "%s/ckpt-2.safetensors", dir);
  path(copy, sizeof copy, "ckpt-guard-2.safetensors");
  struct run r;
  const char *const noenv[] = {NULL};
  const char *args[] = {"--steps", "2", "--batch", "8", "--checkpoint-dir", dir, "--checkpoint-every", "1", NULL};
  train(&r, noenv, "1", args);
  expect_ok(&r);
  gwrun_free(&r);
  copy_file(c2, copy);
  args[1] = "1";
  train(&r, noenv, "1", args); /* a new run: its step 1 would write over ckpt-1 */
  ck_assert_msg(r.code != 0 && strstr(r.err, "already holds 2 checkpoints (the newest ckpt-2.safetensors)") &&
                    strstr(r.err, "--resume"),
                "a new run into a folder of checkpoints: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  ck_assert_msg(same_file(c2, copy), "the refused run changed ckpt-2");
  const char *resume[] = {"--steps", "3", "--batch", "8", "--checkpoint-dir", dir, "--checkpoint-every", "1",
                          "--resume", NULL};
  /* Another job is using the folder (its gw-train holds the folder's lock: a
   * duplicate submission, or a restarted job's old rank 0 still alive): the
   * resume is refused naming it, as its saves and pruning would delete the
   * other's checkpoints. */
  char lockf[600];
  snprintf(lockf, sizeof lockf, "%s/.gw-train.lock", dir);
  FILE *lf = fopen(lockf, "w");
  ck_assert(lf && fputs("otherhost 4242\n", lf) >= 0 && fclose(lf) == 0);
  int held = lock_live(lockf);
  train(&r, noenv, "1", resume);
  ck_assert_msg(r.code != 0 && strstr(r.err, "is in use by another gw-train (otherhost 4242)"),
                "a resume into a folder another gw-train uses: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  close(held);
  ck_assert_msg(same_file(c2, copy), "the refused resume changed ckpt-2");
  train(&r, noenv, "1", resume);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-2.safetensors at step 2"), "--resume did not continue:\n%s", r.out);
  gwrun_free(&r);
}
END_TEST

int exists(const char *file) { return access(file, F_OK) == 0; }

void plant(const char *const *files, int n, long age) {
  const struct timeval then[2] = {{time(NULL) - age, 0}, {time(NULL) - age, 0}};
  for (int i = 0; i < n; i++) {
    FILE *f = fopen(files[i], "w");
    ck_assert_msg(f, "cannot create %s", files[i]);
    fputs("not a checkpoint\n", f);
    fclose(f);
    ck_assert(utimes(files[i], then) == 0);
  }
}

int lock_live(const char *file) {
  int fd = open(file, O_RDWR);
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  ck_assert(fd >= 0 && fcntl(fd, F_OFD_SETLK, &fl) == 0);
  return fd;
}

/* Refused newer files are moved aside, out of the pruning's count: with
 * --keep-checkpoints 1 the run that resumed past a damaged ckpt-4 keeps its own
 * newest (it used to keep the damaged file and delete every good one), and the
 * last step is saved although it ends no epoch and is no multiple of
 * --checkpoint-every.  Temporary files of a dead writer go (unlocked and older
 * than a few seconds; also one named with a live pid, this process's, as a
 * restarted container's writer often has its predecessor's); a live one's
 * (write-locked, as gw_st_write holds it) stays; names the writer never makes
 * (ckpt-007, ckpt-+9) are not checkpoints. */
START_TEST(test_refused_moved_aside) {
  char dir[512], c2[600], c4[600], c5[600], c7[600], refused4[700], dead[700], live[700], odd1[600], odd2[600],
      reused[700], far_new[700], far_old[700], fresh_dead[700];
  path(dir, sizeof dir, "ckpt-aside");
  snprintf(c2, sizeof c2, "%s/ckpt-2.safetensors", dir);
  snprintf(c4, sizeof c4, "%s/ckpt-4.safetensors", dir);
  snprintf(c5, sizeof c5, "%s/ckpt-5.safetensors", dir);
  snprintf(c7, sizeof c7, "%s/ckpt-7.safetensors", dir);
  snprintf(refused4, sizeof refused4, "%s.refused", c4);
  const unsigned tag = gw_st_host_tag(); /* this machine's temporary files */
  snprintf(dead, sizeof dead, "%s/ckpt-6.safetensors.tmp.%08x.999999999.0", dir, tag); /* above any pid_max */
  snprintf(live, sizeof live, "%s/ckpt-6.safetensors.tmp.%08x.%ld.3", dir, tag, (long)getpid());
  snprintf(reused, sizeof reused, "%s/ckpt-6.safetensors.tmp.%08x.%ld.4", dir, tag, (long)getpid());
  /* a save killed seconds ago (a restart's SIGKILL): unlocked, so dead, with
   * the folder's lock held (it was kept while under 10 s old) */
  snprintf(fresh_dead, sizeof fresh_dead, "%s/ckpt-6.safetensors.tmp.%08x.999999999.7", dir, tag);
  /* another machine's (a shared directory), or this one's before a reboot:
   * with the folder's lock held, gone once a minute old (an hour before) */
  snprintf(far_new, sizeof far_new, "%s/ckpt-6.safetensors.tmp.%08x.999999999.5", dir, tag ^ 1u);
  snprintf(far_old, sizeof far_old, "%s/ckpt-6.safetensors.tmp.%08x.999999999.6", dir, tag ^ 1u);
  snprintf(odd1, sizeof odd1, "%s/ckpt-007.safetensors", dir);
  snprintf(odd2, sizeof odd2, "%s/ckpt-+9.safetensors", dir);
  struct run r;
  const char *const noenv[] = {NULL};
  newest_damaged(dir, c4);
  plant((const char *const[]){dead, live, reused}, 3, 3600);
  plant((const char *const[]){far_old}, 1, 120);
  plant((const char *const[]){odd1, odd2, far_new, fresh_dead}, 4, 0);
  const int live_fd = lock_live(live);
  /* Steps 3-5, saved at 3 and (the last step) 5, keeping one. */
  train(&r, noenv, "1", (const char *const[]){"--steps", "5", "--batch", "8", "--checkpoint-dir", dir,
                                              "--checkpoint-every", "3", "--keep-checkpoints", "1", "--resume",
                                              NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-4.safetensors refused") && strstr(r.out, "moved to") &&
                    strstr(r.out, "ckpt-2.safetensors at step 2") && !strstr(r.out, "ckpt-9") &&
                    !strstr(r.out, "ckpt-7"),
                "expected ckpt-4 refused and moved, ckpt-2 used, nothing of ckpt-007 or ckpt-+9:\n%s", r.out);
  gwrun_free(&r);
  ck_assert_msg(exists(refused4) && !exists(c4), "ckpt-4 was not moved to %s", refused4);
  ck_assert_msg(exists(c5) && !exists(c2), "keeping 1: expected ckpt-5 alone (the last step), not ckpt-2");
  ck_assert_msg(!exists(dead) && !exists(reused) && !exists(fresh_dead) && exists(live),
                "the dead writers' temporary files should go (also one named with a live pid), the live one's stay");
  ck_assert_msg(exists(far_new) && !exists(far_old), "another machine's: the fresh one kept, the 2-minute-old one gone");
  unlink(far_new);
  ck_assert_msg(exists(odd1) && exists(odd2), "files that are no checkpoints were touched");
  train(&r, noenv, "1", (const char *const[]){"--steps", "7", "--batch", "8", "--checkpoint-dir", dir,
                                              "--keep-checkpoints", "1", "--resume", NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-5.safetensors at step 5") && !strstr(r.out, "refused"),
                "expected a clean resume from ckpt-5:\n%s", r.out);
  gwrun_free(&r);
  ck_assert_msg(exists(c7) && !exists(c5) && exists(refused4), "expected ckpt-7 and the refused ckpt-4 kept");
  close(live_fd);
  unlink(live);
}
END_TEST

/* What changes the data order or the optimizer's state is refused on resume
 * with the reason: --drop-last (the steps per epoch), and momentum off where
 * the checkpoint has a buffer (it used to be called damaged). */
START_TEST(test_other_options_refused) {
  char dir[512];
  path(dir, sizeof dir, "ckpt-options");
  struct run r;
  const char *const noenv[] = {NULL};
  train(&r, noenv, "2", (const char *const[]){"--steps", "2", "--batch", "8", "--checkpoint-dir", dir, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  /* Another world size: refused, naming what differs first (a long folder
   * name cut the two whole descriptions before the world) */
  train(&r, noenv, "1", (const char *const[]){"--steps", "3", "--batch", "8", "--checkpoint-dir", dir, "--resume",
                                              NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "it is from another run: world 2 -> 1 ("),
                "1 rank resuming 2 ranks' run: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  train(&r, noenv, "2", (const char *const[]){"--steps", "2", "--batch", "8", "--checkpoint-dir", dir, "--resume",
                                              NULL});
  expect_ok(&r); /* nothing moved aside: the 2 ranks' run still resumes */
  gwrun_free(&r);
  train(&r, noenv, "2", (const char *const[]){"--steps", "3", "--batch", "8", "--checkpoint-dir", dir, "--resume",
                                              "--drop-last", NULL});
  /* named as what differs (a bare word: the two whole descriptions alone) */
  ck_assert_msg(r.code != 0 && strstr(r.err, "it is from another run: drop_last off -> on ("),
                "--drop-last on resume: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  train(&r, noenv, "2", (const char *const[]){"--steps", "3", "--batch", "8", "--checkpoint-dir", dir, "--resume",
                                              "--momentum", "0", NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "written by a run with a momentum buffer and this run has none") &&
                    strstr(r.err, "start a new run from its weights: --load-weights with that file") &&
                    !strstr(r.err, "damaged"),
                "--momentum 0 on resume: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* A resume from an older checkpoint runs epochs 2 and 3 again: the plot's
 * data has each epoch once (their rows are replaced, not added), and the
 * metrics mark the resume so readers know which lines supersede which. */
START_TEST(test_resume_redraws_epochs) {
  char dir[512], png[512], dat[600], metrics[512], c8[600], c12[600];
  path(dir, sizeof dir, "ckpt-plot");
  path(png, sizeof png, "resume.png");
  path(metrics, sizeof metrics, "resume.jsonl");
  snprintf(dat, sizeof dat, "%s.dat", png);
  snprintf(c8, sizeof c8, "%s/ckpt-8.safetensors", dir);
  snprintf(c12, sizeof c12, "%s/ckpt-12.safetensors", dir);
  const char *const noenv[] = {NULL};
  /* COMMON without --no-eval (the plot needs the evaluation): 32 samples, 4 steps per epoch */
  const char *args[] = {"-n", "1", train_bin(), "--data", "synthetic", "--synthetic-samples", "32", "--model",
                        "resnet18", "--width-divisor", "8", "--in-channels", "3", "--image-size", "16", "--classes",
                        "4", "--stem", "small", "--threads", "1", "--epochs", "3", "--batch", "8", "--plot", png,
                        "--metrics", metrics, "--checkpoint-dir", dir, NULL, NULL};
  struct run r;
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) { /* back to the end of epoch 1 */
      ck_assert_msg(unlink(c8) == 0 && unlink(c12) == 0, "no checkpoints of epochs 2 and 3 in %s", dir);
      args[sizeof args / sizeof args[0] - 2] = "--resume";
    }
    gwrun_start(&r, noenv, args);
    gwrun_wait(&r, 180);
    expect_ok(&r);
    ck_assert_msg(pass == 0 || strstr(r.out, "ckpt-4.safetensors at step 4"), "did not resume from step 4:\n%s",
                  r.out);
    gwrun_free(&r);
  }
  FILE *f = fopen(dat, "r");
  ck_assert_msg(f, "no %s", dat);
  char line[256];
  int rows = 0;
  while (fgets(line, sizeof line, f)) {
    long long e = 0;
    ck_assert_msg(sscanf(line, "%lld", &e) == 1 && e == rows + 1, "row %d of %s: %s", rows + 1, dat, line);
    rows++;
  }
  fclose(f);
  ck_assert_msg(rows == 3, "%s has %d rows for 3 epochs", dat, rows);
  /* The script draws the PNG again from its own folder and from anywhere (it
   * named its files from the training's working directory) */
  char cmd[1600], dir_of[512];
  snprintf(dir_of, sizeof dir_of, "%s", png);
  *strrchr(dir_of, '/') = 0;
  for (int from = 0; from < 2; from++) {
    ck_assert_int_eq(unlink(png), 0);
    if (from == 0) snprintf(cmd, sizeof cmd, "cd '%s' && gnuplot resume.png.gp 2>/dev/null", dir_of);
    else snprintf(cmd, sizeof cmd, "cd / && gnuplot '%s.gp' 2>/dev/null", png);
    ck_assert_msg(system(cmd) == 0 && access(png, F_OK) == 0, "%s drew no %s", cmd, png);
  }
  size_t len;
  char *m = slurp("resume.jsonl", &len);
  ck_assert_msg(m && strstr(m, "{\"type\":\"resume\",\"step\":4}\n"), "no resume line in the metrics");
  free(m);
}
END_TEST

/* A newest checkpoint that cannot be read for a reason not its own (here a
 * socket: open fails with ENXIO; in life EMFILE, ENOMEM, EIO) stops the
 * resume: falling back would quietly redo steps and move a good file aside.
 * A refused file that cannot be moved aside stops it too (left there, it would
 * count among the newest kept and the run's own saves would be pruned): here
 * every name it may take is an earlier refusal's (.refused, .refused.1 to
 * .refused.99). */
START_TEST(test_resume_stops_rather_than_roll_back) {
  char dir[512], c2[600], c4[600], refused[700], taken[100][720];
  path(dir, sizeof dir, "ckpt-stop");
  snprintf(c2, sizeof c2, "%s/ckpt-2.safetensors", dir);
  snprintf(c4, sizeof c4, "%s/ckpt-4.safetensors", dir);
  snprintf(refused, sizeof refused, "%s.refused", c4);
  struct run r;
  const char *const noenv[] = {NULL};
  const char *const resume[] = {"--steps", "6", "--batch", "8", "--checkpoint-dir", dir, "--resume", NULL};
  newest_damaged(dir, c4);
  for (int i = 0; i < 100; i++) {
    if (i) snprintf(taken[i], sizeof taken[i], "%s.%d", refused, i);
    else snprintf(taken[i], sizeof taken[i], "%s", refused);
    plant((const char *const[]){taken[i]}, 1, 0);
  }
  train(&r, noenv, "1", resume);
  ck_assert_msg(r.code != 0 && strstr(r.err, "cannot move the refused") && strstr(r.err, "ckpt-4.safetensors") &&
                    strstr(r.err, "all exist"),
                "a refused file that cannot be moved: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  ck_assert_msg(exists(c4) && exists(c2), "the checkpoints were touched");
  for (int i = 0; i < 100; i++) ck_assert_msg(unlink(taken[i]) == 0, "cannot remove %s", taken[i]);
  /* The newest is a socket */
  ck_assert_int_eq(unlink(c4), 0);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  ck_assert_msg(strlen(c4) < sizeof a.sun_path, "%s is too long for a socket name", c4);
  snprintf(a.sun_path, sizeof a.sun_path, "%s", c4);
  ck_assert_int_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  train(&r, noenv, "1", resume);
  ck_assert_msg(r.code != 0 && strstr(r.err, "cannot read the newest checkpoint") && strstr(r.err, "not falling back"),
                "an unreadable newest checkpoint: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  ck_assert_msg(exists(c2) && !exists(refused), "the older checkpoint should stay and nothing be moved aside");
  close(s);
  unlink(c4);
}
END_TEST

/* A job that ends after an epoch's checkpoint but before its evaluation (here
 * the last epoch's: the run then had no step left to trigger one) evaluates it
 * first thing on resume, and only once (the checkpoint says so after it).  The
 * resume also names the options that changed. */
START_TEST(test_resume_runs_pending_evaluation) {
  char dir[512];
  path(dir, sizeof dir, "ckpt-eval");
  /* COMMON without --no-eval: 32 samples, 4 steps per epoch, 2 epochs */
  const char *args[] = {"-n", "1", train_bin(), "--data", "synthetic", "--synthetic-samples", "32", "--model",
                        "resnet18", "--width-divisor", "8", "--in-channels", "3", "--image-size", "16", "--classes",
                        "4", "--stem", "small", "--threads", "1", "--epochs", "2", "--batch", "8", "--lr", "0.4",
                        "--checkpoint-dir", dir, NULL, NULL, NULL, NULL};
  const size_t end = sizeof args / sizeof args[0] - 4;
  const char *const stop[] = {"GW_TRAIN_STOP_BEFORE_EVAL=2", NULL}, *const noenv[] = {NULL};
  struct run r;
  gwrun_start(&r, stop, args);
  gwrun_wait(&r, 180);
  ck_assert_msg(r.code != 0 && strstr(r.out, "epoch 1 evaluation: top-1") && !strstr(r.out, "epoch 2 evaluation") &&
                    strstr(r.out, "stopping before the evaluation of epoch 2"),
                "the interrupted run: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  args[end] = "--resume", args[end + 1] = "--lr", args[end + 2] = "0.2";
  gwrun_start(&r, noenv, args);
  gwrun_wait(&r, 180);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-8.safetensors at step 8") && strstr(r.out, "epoch 2 evaluation: top-1") &&
                    !strstr(r.out, "epoch 1 evaluation"),
                "the resume did not evaluate epoch 2:\n%s", r.out);
  ck_assert_msg(strstr(r.out, "note: resuming with options other than the saved run's: lr 0.4 -> 0.2"),
                "the changed --lr was not named:\n%s", r.out);
  gwrun_free(&r);
  /* The save that marked the evaluation done kept the saved run's options
   * (and loss scaler): nothing of this run had been trained with yet. */
  char c8[600];
  snprintf(c8, sizeof c8, "%s/ckpt-8.safetensors", dir);
  struct gw_st_file *f = NULL;
  ck_assert_msg(gw_st_open(&f, c8) == GW_SUCCESS, "%s", gw_model_last_error());
  const char *opts = gw_st_metadata(f, "options");
  ck_assert_msg(!gw_st_metadata(f, "eval_pending") && opts && strstr(opts, " lr=0.4 ") && !strstr(opts, "lr=0.2"),
                "after the pending evaluation: eval_pending %s, options %s", gw_st_metadata(f, "eval_pending"),
                opts ? opts : "(none)");
  gw_st_free(f);
  /* Resumed again with no steps left: the evaluation was done, not again. */
  gwrun_start(&r, noenv, args);
  gwrun_wait(&r, 180);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-8.safetensors at step 8") && !strstr(r.out, "evaluation: top-1"),
                "the second resume evaluated again:\n%s", r.out);
  ck_assert_msg(strstr(r.out, "lr 0.4 -> 0.2"), "the second resume did not name the changed --lr:\n%s", r.out);
  gwrun_free(&r);
}
END_TEST

/* Checkpoints name the training samples, not --data's text: the same files
 * reached by another path (here a long one through a link, then the default
 * path) resume; another batch, or other samples under the same --data
 * (another --synthetic-samples), are refused naming both. */
START_TEST(test_data_named_by_samples) {
  char deep[1024], link[1100], spec[1200], dir[512], seg[201];
  memset(seg, 'd', 200), seg[200] = 0;
  path(deep, sizeof deep, seg);
  ck_assert_int_eq(mkdir(deep, 0777), 0);
  size_t n = strlen(deep);
  snprintf(deep + n, sizeof deep - n, "/%s", seg);
  ck_assert_int_eq(mkdir(deep, 0777), 0);
  snprintf(link, sizeof link, "%s/fashion", deep);
  ck_assert_int_eq(symlink("/usr/share/datasets/fashion-mnist", link), 0);
  snprintf(spec, sizeof spec, "fashion-mnist:%s", link);
  path(dir, sizeof dir, "ckpt-long");
  const char *args[] = {"-n", "1", train_bin(), "--data", spec, "--model", "resnet18", "--width-divisor", "16",
                        "--stem", "small", "--threads", "1", "--steps", "1", "--batch", "8", "--no-eval",
                        "--checkpoint-dir", dir, NULL, NULL};
  const char *const noenv[] = {NULL};
  struct run r;
  gwrun_start(&r, noenv, args);
  gwrun_wait(&r, 180);
  expect_ok(&r);
  gwrun_free(&r);
  args[16] = "4", args[20] = "--resume";
  gwrun_start(&r, noenv, args);
  gwrun_wait(&r, 180);
  ck_assert_msg(r.code != 0 && strstr(r.err, "from another run"), "a resume with another batch: exit %d\n%s\n%s",
                r.code, r.out, r.err);
  gwrun_free(&r);
  args[4] = "fashion-mnist", args[14] = "2", args[16] = "8";
  gwrun_start(&r, noenv, args);
  gwrun_wait(&r, 180);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "at step 1"), "the same samples under another path did not resume:\n%s", r.out);
  gwrun_free(&r);
  /* COMMON's 96 synthetic samples, then 64 */
  path(dir, sizeof dir, "ckpt-synthetic");
  const char *more[] = {"--steps", "1", "--batch", "8", "--checkpoint-dir", dir, NULL, NULL, NULL, NULL};
  train(&r, noenv, "1", more);
  expect_ok(&r);
  gwrun_free(&r);
  more[6] = "--resume", more[7] = "--synthetic-samples", more[8] = "64";
  train(&r, noenv, "1", more);
  ck_assert_msg(r.code != 0 && strstr(r.err, "from another run") && strstr(r.err, "data=train:96:") &&
                    strstr(r.err, "data=train:64:"),
                "a resume on other samples: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* Each refusal of a step's checkpoint keeps its copy: a second damaged
 * ckpt-4 goes to .refused.1, beside the first's .refused (it used to replace
 * it). */
START_TEST(test_refusals_kept) {
  char dir[512], c4[600], first[512], second[512], refused[700], refused1[700];
  path(dir, sizeof dir, "ckpt-twice");
  snprintf(c4, sizeof c4, "%s/ckpt-4.safetensors", dir);
  snprintf(refused, sizeof refused, "%s.refused", c4);
  snprintf(refused1, sizeof refused1, "%s.refused.1", c4);
  path(first, sizeof first, "twice-first.safetensors");
  path(second, sizeof second, "twice-second.safetensors");
  struct run r;
  const char *const noenv[] = {NULL};
  const char *const resume[] = {"--steps", "4", "--batch", "8", "--checkpoint-dir", dir, "--checkpoint-every", "2",
                                "--resume", NULL};
  newest_damaged(dir, c4);
  copy_file(c4, first);
  for (int pass = 0; pass < 2; pass++) { /* steps 3 and 4 again from ckpt-2, ckpt-4 saved again */
    train(&r, noenv, "1", resume);
    expect_ok(&r);
    ck_assert_msg(strstr(r.out, "ckpt-4.safetensors refused") && strstr(r.out, pass ? refused1 : refused) &&
                      strstr(r.out, "ckpt-2.safetensors at step 2"),
                  "refusal %d: expected ckpt-4 moved to %s:\n%s", pass + 1, pass ? refused1 : refused, r.out);
    gwrun_free(&r);
    if (pass == 0) flip_byte(c4, 100), copy_file(c4, second);
  }
  ck_assert_msg(same_file(refused, first) && same_file(refused1, second),
                "the refused copies are not the two damaged files, first and second");
}
END_TEST

void add_checkpoint_tests(TCase *tc) {
  tcase_add_test(tc, test_refusals_kept);
  tcase_add_test(tc, test_big_foreign_checkpoint);
  add_checkpoint_meta_tests(tc);
  tcase_add_test(tc, test_resume_stops_rather_than_roll_back);
  tcase_add_test(tc, test_resume_runs_pending_evaluation);
  tcase_add_test(tc, test_data_named_by_samples);
  tcase_add_test(tc, test_checkpoint_dir_guarded);
  tcase_add_test(tc, test_resume_is_bit_exact);
  tcase_add_test(tc, test_resume_keeps_loss_scale);
  tcase_add_test(tc, test_resume_fixed_scale_as_dynamic);
  tcase_add_test(tc, test_resume_old_checkpoint);
  tcase_add_test(tc, test_damaged_checkpoint);
  tcase_add_test(tc, test_resume_refuses_impossible_values);
  tcase_add_test(tc, test_resume_saved_schedule_out_of_range);
  tcase_add_test(tc, test_refused_moved_aside);
  tcase_add_test(tc, test_other_options_refused);
  tcase_add_test(tc, test_resume_redraws_epochs);
}
