/* test_train_ckpt_meta.c - gw-train's checkpoint metadata, end to end (the
 * rest of checkpoints and --resume: test_train_ckpt.c):
 * - an epoch's evaluation is not run again on a resume, and when the save that
 *   clears its pending mark fails, the run warns and the repeated evaluation's
 *   metrics line supersedes the first by the resume rule (both carry the step);
 * - a damaged metadata value or tensor dtype is refused as damage, and the
 *   resume falls back;
 * - format versions: version 1 files (with a pending evaluation too) still
 *   resume; an unknown or damaged version is refused, a newer one stops;
 * - a full disk: a checkpoint that does not fit ends the run naming it and
 *   the reason, the one before stays whole, no temporary file is left; the
 *   metrics file that does not fit is cut back to its last whole line, said
 *   once, and the training goes on; a metrics file ending in half a line gets
 *   its newline before the new lines;
 * - a loss that is not finite stops the run before the step's optimizer and
 *   any save (a loss-scaled run skips the step); gradients that are not
 *   finite reach the weights, whose checkpoint is refused.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gwrun_helpers.h"
#include "resnet.h" /* gw_model_last_error */
#include "safetensors.h"
#include "test_train.h"

/* An epoch evaluated at its end is saved again after the evaluation, without
 * the pending mark: a resume from its checkpoint goes on without evaluating it
 * again (it did, and the metrics got a second eval line for the epoch).  The
 * same file is written again: with --keep-checkpoints 2 both epochs' stay. */
START_TEST(test_epoch_evaluated_once) {
  char dir[512], metrics[512], c4[600], c8[600];
  path(dir, sizeof dir, "ckpt-evaluated");
  path(metrics, sizeof metrics, "evaluated.jsonl");
  snprintf(c4, sizeof c4, "%s/ckpt-4.safetensors", dir);
  snprintf(c8, sizeof c8, "%s/ckpt-8.safetensors", dir);
  const char *const noenv[] = {NULL}, *const eval[] = {EVAL_COMMON, NULL};
  const char *args[] = {"--epochs", "1", "--batch", "8", "--checkpoint-dir", dir, "--metrics", metrics,
                        "--keep-checkpoints", "2", NULL, NULL};
  struct run r;
  train_from(&r, noenv, "1", eval, args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "epoch 1 evaluation: top-1"), "epoch 1 was not evaluated:\n%s", r.out);
  gwrun_free(&r);
  args[1] = "2", args[10] = "--resume";
  train_from(&r, noenv, "1", eval, args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-4.safetensors at step 4") && !strstr(r.out, "epoch 1 evaluation") &&
                    strstr(r.out, "epoch 2 evaluation: top-1"),
                "the resume evaluated epoch 1 again, or not epoch 2:\n%s", r.out);
  gwrun_free(&r);
  size_t len;
  char *m = slurp("evaluated.jsonl", &len);
  int evals[2] = {0, 0};
  for (const char *p = m; (p = strstr(p, "{\"type\":\"eval\",\"epoch\":")); p++) {
    const long long e = atoll(p + strlen("{\"type\":\"eval\",\"epoch\":"));
    ck_assert_msg(e == 1 || e == 2, "an eval line of epoch %lld", e);
    evals[e - 1]++;
  }
  free(m);
  ck_assert_msg(evals[0] == 1 && evals[1] == 1, "eval lines: %d of epoch 1, %d of epoch 2 (one each)", evals[0],
                evals[1]);
  ck_assert_msg(exists(c4) && exists(c8), "keeping 2: expected ckpt-4 and ckpt-8");
}
END_TEST

/* Changes one character of a metadata value of the file at rel (under the
 * test folder) in place: the value's character at `at` from the start of
 * `key` (its opening text, a JSON key and the start of its value), or with
 * at = -1 the value's last, which must be a digit; to c, or with c = 0 to
 * the digit after it.  0, or -1 where the text is not there. */
static int set_meta_char(const char *rel, const char *key, long at, int c) {
  size_t len;
  char *file = slurp(rel, &len);
  const char *k = memmem(file, len, key, strlen(key)); /* after the length's 0 bytes */
  const char *end = k ? strchr(k + strlen(key), '"') : NULL, *p = !end ? NULL : at < 0 ? end - 1 : k + at;
  const long off = p ? (long)(p - file) : -1;
  const int was = p ? *p : 0;
  free(file);
  if (!p || (c == 0 && (was < '0' || was > '9'))) return -1;
  char full[600];
  path(full, sizeof full, rel);
  FILE *f = fopen(full, "r+b");
  ck_assert(f && fseek(f, off, SEEK_SET) == 0);
  ck_assert(fputc(c ? c : was == '9' ? '8' : was + 1, f) != EOF && fclose(f) == 0);
  return 0;
}

/* The checksum covers the metadata (format version 2): one digit changed in
 * the pending evaluation's training loss (the file still parses, and the
 * value reads) makes the checkpoint refused by name as damaged, and the
 * resume falls back to the one before. */
START_TEST(test_metadata_damage_refused) {
  char dir[512], c8[600];
  path(dir, sizeof dir, "ckpt-meta");
  snprintf(c8, sizeof c8, "%s/ckpt-8.safetensors", dir);
  const char *const stop[] = {"GW_TRAIN_STOP_BEFORE_EVAL=2", NULL}, *const noenv[] = {NULL},
                    *const eval[] = {EVAL_COMMON, NULL};
  const char *args[] = {"--epochs", "2", "--batch", "8", "--checkpoint-dir", dir, NULL, NULL};
  struct run r;
  train_from(&r, stop, "1", eval, args);
  ck_assert_msg(r.code != 0 && strstr(r.out, "stopping before the evaluation of epoch 2"),
                "the interrupted run: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  ck_assert_msg(!set_meta_char("ckpt-meta/ckpt-8.safetensors", "\"eval_pending\":\"2 ", -1, 0),
                "no pending evaluation of epoch 2 ending in a digit in %s", c8);
  args[6] = "--resume";
  train_from(&r, noenv, "1", eval, args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-8.safetensors refused: its checksum") && strstr(r.out, "damaged") &&
                    strstr(r.out, "ckpt-4.safetensors at step 4") && strstr(r.out, "epoch 2 evaluation: top-1"),
                "expected ckpt-8 refused as damaged, and epoch 2 trained again from ckpt-4:\n%s", r.out);
  gwrun_free(&r);
}
END_TEST

/* A tensor's dtype flipped in the header (F32 to I32: same size, and the
 * checksum covers the tensors' bytes and the metadata, not the header's
 * dtypes): the resume refuses the file as damaged, naming the tensor and
 * both dtypes (it said "missing or has the wrong size"), and falls back. */
START_TEST(test_tensor_dtype_damage_refused) {
  char dir[512];
  path(dir, sizeof dir, "ckpt-dtype");
  const char *const noenv[] = {NULL}, *const eval[] = {EVAL_COMMON, NULL};
  const char *args[] = {"--epochs", "2", "--batch", "8", "--checkpoint-dir", dir, NULL, NULL};
  struct run r;
  train_from(&r, noenv, "1", eval, args);
  expect_ok(&r);
  gwrun_free(&r);
  const char *key = "\"params\":{\"dtype\":\"";
  ck_assert_msg(!set_meta_char("ckpt-dtype/ckpt-8.safetensors", key, (long)strlen(key), 'I'),
                "no tensor params in ckpt-8's header");
  args[6] = "--resume";
  train_from(&r, noenv, "1", eval, args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-8.safetensors refused: its tensor params is I32, not F32: the file is damaged") &&
                    strstr(r.out, "ckpt-4.safetensors at step 4"),
                "expected ckpt-8 refused naming the dtypes, and the resume from ckpt-4:\n%s", r.out);
  gwrun_free(&r);
  /* A tensor no gw-train writes (outside the checksum, which still matches):
   * refused as damage naming it, not taken. */
  char c8[600];
  path(c8, sizeof c8, "ckpt-dtype/ckpt-8.safetensors");
  struct gw_st_file *f = NULL;
  ck_assert_msg(gw_st_open(&f, c8) == GW_SUCCESS, "the resumed run's ckpt-8: %s", gw_model_last_error());
  struct gw_st_tensor t[17];
  const char *meta[34];
  ck_assert(f->ntensors < 16 && f->nmeta < 16);
  for (int i = 0; i < f->ntensors; i++) t[i] = f->tensors[i];
  static const float extra[2] = {1, 2};
  t[f->ntensors] = (struct gw_st_tensor){.name = "extra", .dtype = GW_FLOAT32, .ndim = 1, .shape = {2},
                                         .nbytes = sizeof extra, .data = extra};
  for (int i = 0; i < 2 * f->nmeta; i++) meta[i] = f->meta[i];
  meta[2 * f->nmeta] = NULL;
  ck_assert_msg(gw_st_write(c8, t, f->ntensors + 1, meta) == GW_SUCCESS, "%s", gw_model_last_error());
  gw_st_free(f);
  /* A FIFO with a save's temporary name: the stale-file cleaner's open of it
   * waited for a writer forever (left alone now). */
  char fifo[700];
  snprintf(fifo, sizeof fifo, "%s.tmp.%08x.%d.0", c8, gw_st_host_tag(), 1);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  train_from(&r, noenv, "1", eval, args);
  expect_ok(&r);
  ck_assert_msg(exists(fifo), "the FIFO was removed");
  unlink(fifo);
  ck_assert_msg(strstr(r.out, "ckpt-8.safetensors refused: it holds a tensor 'extra' that no gw-train writes") &&
                    strstr(r.out, "ckpt-4.safetensors at step 4"),
                "expected ckpt-8 refused naming the extra tensor, and the resume from ckpt-4:\n%s", r.out);
  gwrun_free(&r);
}
END_TEST

/* The save after an epoch's evaluation only clears the pending mark: when it
 * fails (here: giving the new file the old one's mode) the run says so and
 * goes on, the checkpoint as it was (a resume evaluates the epoch again).
 * The metrics then hold two eval lines of the epoch: both carry the step its
 * training ended at, and the second follows the resume line of that step,
 * so the documented rule (lines after a resume supersede earlier ones of the
 * same step) drops the first (eval lines had no step, and a parser counted
 * the epoch twice). */
START_TEST(test_failed_resave_warns) {
  char dir[512], metrics[512];
  path(dir, sizeof dir, "ckpt-resave");
  path(metrics, sizeof metrics, "resave.jsonl");
  const char *const failing[] = {"GW_SAFETENSORS_FAIL=chmod", NULL}, *const noenv[] = {NULL},
                    *const eval[] = {EVAL_COMMON, NULL};
  const char *args[] = {"--epochs", "1", "--batch", "8", "--checkpoint-dir", dir, "--metrics", metrics, NULL, NULL};
  struct run r;
  train_from(&r, failing, "1", eval, args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "epoch 1 evaluation: top-1") && strstr(r.out, "warning: checkpoint of step 4:") &&
                    strstr(r.out, "may still say the evaluation is pending"),
                "expected the evaluation, then a warning for the save after it:\n%s", r.out);
  gwrun_free(&r);
  args[8] = "--resume";
  train_from(&r, noenv, "1", eval, args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-4.safetensors at step 4") && strstr(r.out, "epoch 1 evaluation: top-1"),
                "the checkpoint before the failed save should resume with the evaluation pending:\n%s", r.out);
  gwrun_free(&r);
  size_t len;
  char *m = slurp("resave.jsonl", &len);
  const char *line = "{\"type\":\"eval\",\"epoch\":1,\"step\":4,";
  const char *first = strstr(m, line), *second = first ? strstr(first + 1, line) : NULL;
  const char *resume = first ? strstr(first, "{\"type\":\"resume\",\"step\":4}") : NULL;
  ck_assert_msg(first && second && resume && resume < second && !strstr(second + strlen(line), "\"type\":\"eval\""),
                "expected an eval line of epoch 1 at step 4, the resume at step 4, the eval line again:\n%s", m);
  free(m);
  /* Any other save failing ends the run (a run without its checkpoints
   * exited 0 while they were warn-only too). */
  char dir2[512];
  path(dir2, sizeof dir2, "ckpt-resave-write");
  const char *const writes[] = {"GW_SAFETENSORS_FAIL=write", NULL};
  train(&r, writes, "1", (const char *const[]){"--steps", "4", "--batch", "8", "--checkpoint-dir", dir2,
                                               "--checkpoint-every", "2", NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "checkpoint") && !strstr(r.out, "warning: checkpoint"),
                "a failed periodic checkpoint: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* A checkpoint of format version 1 with every later key (options, a pending
 * evaluation; as gw-train wrote them before format_version): the resume
 * takes it, evaluates the epoch once and saves it again as version 2, without
 * the mark. */
START_TEST(test_resume_version1_pending) {
  char dir[512], c4[600];
  path(dir, sizeof dir, "ckpt-v1");
  snprintf(c4, sizeof c4, "%s/ckpt-4.safetensors", dir);
  const char *const stop[] = {"GW_TRAIN_STOP_BEFORE_EVAL=1", NULL}, *const noenv[] = {NULL},
                    *const eval[] = {EVAL_COMMON, NULL};
  const char *args[] = {"--epochs", "1", "--batch", "8", "--checkpoint-dir", dir, NULL, NULL};
  struct run r;
  train_from(&r, stop, "1", eval, args);
  ck_assert_msg(r.code != 0 && strstr(r.out, "stopping before the evaluation of epoch 1"),
                "the interrupted run: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  as_version1(c4, NULL, NULL);
  struct gw_st_file *f = NULL;
  ck_assert(gw_st_open(&f, c4) == GW_SUCCESS);
  ck_assert_msg(!gw_st_metadata(f, "format_version") && gw_st_metadata(f, "eval_pending") &&
                    gw_st_metadata(f, "options"), "not a version 1 file with a pending evaluation");
  gw_st_free(f);
  args[6] = "--resume";
  train_from(&r, noenv, "1", eval, args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-4.safetensors at step 4") && strstr(r.out, "epoch 1 evaluation: top-1") &&
                    !strstr(r.out, "refused"),
                "the version 1 file was not resumed with its evaluation:\n%s", r.out);
  gwrun_free(&r);
  ck_assert(gw_st_open(&f, c4) == GW_SUCCESS);
  ck_assert_msg(gw_st_metadata(f, "format_version") && !strcmp(gw_st_metadata(f, "format_version"), "2") &&
                    !gw_st_metadata(f, "eval_pending"), "the file was not saved again as version 2 without the mark");
  gw_st_free(f);
}
END_TEST

/* Format versions: a checkpoint of a newer format (3, its checksum made as a
 * writer of version 3 would) stops the resume, by name, and stays where it is
 * (falling back would redo steps and move a good file aside); a version no
 * gw-train writes ("1": version 1 has no key) is damage, refused by name, and
 * the resume falls back to the one before. */
START_TEST(test_format_versions) {
  char dir[512], c4[600];
  path(dir, sizeof dir, "ckpt-version");
  snprintf(c4, sizeof c4, "%s/ckpt-4.safetensors", dir);
  struct run r;
  const char *const noenv[] = {NULL};
  const char *const args[] = {"--steps", "6", "--batch", "8", "--checkpoint-dir", dir, "--checkpoint-every", "2",
                              "--resume", NULL};
  four_steps(dir);
  const char *key = "\"format_version\":\"";
  rewrite_as(c4, NULL, NULL, "3");
  train(&r, noenv, "1", args);
  ck_assert_msg(r.code != 0 && strstr(r.err, "cannot resume from") && strstr(r.err, "ckpt-4.safetensors") &&
                    strstr(r.err, "a newer gw-train wrote it (format version 3") && strstr(r.err, "not falling back"),
                "a newer format: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  struct stat sb;
  ck_assert_msg(stat(c4, &sb) == 0, "the newer checkpoint was moved away");
  ck_assert_int_eq(set_meta_char("ckpt-version/ckpt-4.safetensors", key, (long)strlen(key), '1'), 0);
  train(&r, noenv, "1", args);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-4.safetensors refused: its format version '1' is not one gw-train writes") &&
                    strstr(r.out, "ckpt-2.safetensors at step 2"),
                "format version '1': expected ckpt-4 refused as damaged and ckpt-2 used:\n%s", r.out);
  gwrun_free(&r);
}
END_TEST

/* A version-2 checkpoint whose format_version alone was damaged ("2" to
 * "3" is one bit) is not taken for a newer gw-train's (that stopped the
 * resume and kept the file in the way): its checksum still matches it as
 * version 2, so it is refused as damaged and the resume falls back. */
START_TEST(test_format_version_bit_flip) {
  char dir[512];
  path(dir, sizeof dir, "ckpt-version-flip");
  struct run r;
  const char *const noenv[] = {NULL};
  four_steps(dir);
  const char *key = "\"format_version\":\"";
  ck_assert_int_eq(set_meta_char("ckpt-version-flip/ckpt-4.safetensors", key, (long)strlen(key), '3'), 0);
  train(&r, noenv, "1", (const char *const[]){"--steps", "5", "--batch", "8", "--checkpoint-dir", dir,
                                              "--checkpoint-every", "2", "--resume", NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-4.safetensors refused: its format version '3' was damaged") &&
                    strstr(r.out, "ckpt-2.safetensors at step 2"),
                "a flipped format version: expected ckpt-4 refused as damaged and ckpt-2 used:\n%s\n%s", r.out,
                r.err);
  gwrun_free(&r);
}
END_TEST

/* A checkpoint renamed to a later step (ckpt-2 copied to ckpt-9, to force a
 * resume from it) is refused by name and moved aside: it resumed at step 2
 * while its name ordered the pruning, which then deleted every new save
 * below 9 as it was written (with --keep-checkpoints 1). */
START_TEST(test_renamed_checkpoint_refused) {
  char dir[512], c2[600], c9[600], cmd[1400];
  path(dir, sizeof dir, "ckpt-renamed");
  snprintf(c2, sizeof c2, "%s/ckpt-2.safetensors", dir);
  snprintf(c9, sizeof c9, "%s/ckpt-9.safetensors", dir);
  struct run r;
  const char *const noenv[] = {NULL};
  four_steps(dir);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", c2, c9);
  ck_assert_int_eq(system(cmd), 0);
  train(&r, noenv, "1", (const char *const[]){"--steps", "6", "--batch", "8", "--checkpoint-dir", dir,
                                              "--checkpoint-every", "2", "--keep-checkpoints", "1", "--resume", NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-9.safetensors refused: it holds step 2 under the name of step 9") &&
                    strstr(r.out, "ckpt-4.safetensors at step 4"),
                "expected ckpt-9 refused and ckpt-4 used:\n%s\n%s", r.out, r.err);
  gwrun_free(&r);
  char c6[600];
  snprintf(c6, sizeof c6, "%s/ckpt-6.safetensors", dir);
  ck_assert_msg(access(c6, F_OK) == 0 && access(c9, F_OK) != 0, "ckpt-6 pruned, or ckpt-9 still in the way");
}
END_TEST


/* A tmpfs of `size` at tmpdir/name in this test's own mount namespace (the
 * test process is Check's fork: the mounts go with it); 0, or -1 where that
 * cannot be done here (not root, no namespaces, or unforked). */
static int small_disk(const char *name, const char *size, char *out, size_t cap) {
  const char *fork_mode = getenv("CK_FORK");
  path(out, cap, name);
  if ((fork_mode && strcmp(fork_mode, "no") == 0) || mkdir(out, 0755) != 0) return -1;
  char opts[32];
  snprintf(opts, sizeof opts, "size=%s", size);
  static int ns;
  if (!ns && (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)) return -1;
  ns = 1;
  return mount("tmpfs", out, "tmpfs", 0, opts);
}

START_TEST(test_full_disk) {
  char ckdisk[512], mdisk[512], dir[600], metrics[600];
  if (small_disk("full-ckpt", "2m", ckdisk, sizeof ckdisk) != 0 ||
      small_disk("full-metrics", "4k", mdisk, sizeof mdisk) != 0) {
    printf("test_full_disk: cannot mount a tmpfs in a mount namespace here (not root? CK_FORK=no?): not run\n");
    return;
  }
  /* One checkpoint (1.4 MB) fits in 2 MB, the second does not. */
  snprintf(dir, sizeof dir, "%s/ckpt", ckdisk);
  struct run r;
  train(&r, (const char *const[]){NULL}, "2",
        (const char *const[]){"--steps", "6", "--batch", "8", "--checkpoint-dir", dir, "--checkpoint-every", "2",
                              NULL});
  ck_assert_msg(r.code != 0 && strstr(r.err, "ckpt-4.safetensors") && strstr(r.err, "No space left on device"),
                "a checkpoint on a full disk: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  /* ckpt-2 resumes (its checksum holds), from a copy on a disk with room. */
  char copy_dir[600], copy[700];
  path(copy_dir, sizeof copy_dir, "full-copy");
  snprintf(copy, sizeof copy, "%s/ckpt-2.safetensors", copy_dir);
  size_t len;
  char *bytes = slurp("full-ckpt/ckpt/ckpt-2.safetensors", &len);
  FILE *cf = mkdir(copy_dir, 0755) == 0 ? fopen(copy, "wb") : NULL;
  ck_assert(cf && fwrite(bytes, 1, len, cf) == len && fclose(cf) == 0);
  free(bytes);
  train(&r, (const char *const[]){NULL}, "2",
        (const char *const[]){"--steps", "3", "--batch", "8", "--checkpoint-dir", copy_dir, "--resume", NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-2.safetensors at step 2"), "ckpt-2 did not resume:\n%s", r.out);
  gwrun_free(&r);
  DIR *d = opendir(dir);
  ck_assert(d);
  for (struct dirent *e; (e = readdir(d));)
    ck_assert_msg(!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, ".gw-train.lock") ||
                      !strcmp(e->d_name, "ckpt-2.safetensors"),
                  "left in the checkpoint folder: %s", e->d_name);
  closedir(d);

  /* About 20 training lines fit in 4 KiB: the run goes on to its end. */
  snprintf(metrics, sizeof metrics, "%s/m.jsonl", mdisk);
  train(&r, (const char *const[]){NULL}, "1",
        (const char *const[]){"--steps", "40", "--batch", "8", "--metrics", metrics, NULL});
  expect_ok(&r);
  const char *w = strstr(r.err, "warning: --metrics");
  long long held = -1;
  const char *up = w ? strstr(w, "training lines up to step ") : NULL;
  if (up) held = atoll(up + strlen("training lines up to step "));
  ck_assert_msg(w && strstr(w, "No space left on device") && held > 5 && held < 40 &&
                    !strstr(w + 1, "warning: --metrics"),
                "one warning for the full metrics disk:\n%s", r.err);
  gwrun_free(&r);
  char *m = slurp("full-metrics/m.jsonl", &len);
  ck_assert_msg(len > 0 && m[len - 1] == '\n', "the metrics file ends in half a line");
  long long lines = 0, last = -1;
  for (char *p = m; p < m + len; p = strchr(p, '\n') + 1, lines++) {
    ck_assert_msg(p[0] == '{' && strchr(p, '\n')[-1] == '}', "not a whole line: %.80s", p);
    const char *s = strstr(p, "\"step\":");
    if (s && s < strchr(p, '\n')) last = atoll(s + 7);
  }
  free(m);
  ck_assert_msg(lines == held + 1 && last == held, "%lld lines, the last of step %lld; the warning said %lld", lines,
                last, held);

  /* An older file ending in half a line: the new lines start on their own. */
  char partial[600];
  path(partial, sizeof partial, "partial.jsonl");
  FILE *pf = fopen(partial, "w");
  ck_assert(pf && fputs("{\"type\":\"train\",\"step\":7,\"lo", pf) >= 0 && fclose(pf) == 0);
  train(&r, (const char *const[]){NULL}, "1",
        (const char *const[]){"--steps", "1", "--batch", "8", "--metrics", partial, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  m = slurp("partial.jsonl", &len);
  const char *want = "{\"type\":\"train\",\"step\":7,\"lo\n{\"type\":\"start\"}\n{\"type\":\"train\",\"step\":1,";
  ck_assert_msg(strncmp(m, want, strlen(want)) == 0,
                "the half line kept, then the new lines:\n%s", m);
  free(m);
}
END_TEST

/* A loss that is not finite (rank 1's only, at step 3), with no loss
 * scaling: the run stops (exit 1) before the optimizer step, rank 0 says why
 * and which checkpoint is whole, and nothing after step 2 is saved.
 * Gradients made infinite at step 3 on every rank, as reduced ones are (no
 * loss scale: unchecked), reach the
 * weights, whose checkpoint of step 3 is refused: exit 1, step 2's the
 * newest.  A loss-scaled run skips a step whose loss is not finite (as
 * GradScaler does) and goes on. */
START_TEST(test_nonfinite_step_stops) {
  char dir[512], dir2[512], c2[600], c3[600];
  path(dir, sizeof dir, "ckpt-nonfinite");
  path(dir2, sizeof dir2, "ckpt-nonfinite-grads");
  snprintf(c2, sizeof c2, "%s/ckpt-2.safetensors", dir);
  snprintf(c3, sizeof c3, "%s/ckpt-3.safetensors", dir);
  struct run r;
  train(&r, (const char *const[]){"GW_TRAIN_NAN_LOSS_AT_STEP=3", "GW_TRAIN_OVERFLOW_RANK=1", NULL}, "2",
        (const char *const[]){"--steps", "5", "--batch", "8", "--checkpoint-dir", dir, "--checkpoint-every", "1", NULL});
  ck_assert_msg(r.code == 1 && strstr(r.err, "step 3: the loss is nan (summed over the ranks)") &&
                    strstr(r.err, "the last checkpoint, of step 2, is whole") &&
                    strstr(r.err, "rank 1: training: stopping with the others at step 3"),
                "loss not finite: exit %d\n%s\n%s", r.code, r.out, r.err);
  ck_assert_msg(access(c2, F_OK) == 0 && access(c3, F_OK) != 0, "checkpoints: step 2's should be there, not step 3's");
  gwrun_free(&r);
  train(&r, (const char *const[]){"GW_TRAIN_OVERFLOW_AT_STEP=3", NULL}, "2", /* reduced gradients: every rank's */
        (const char *const[]){"--steps", "5", "--batch", "8", "--checkpoint-dir", dir2, "--checkpoint-every", "1", NULL});
  snprintf(c2, sizeof c2, "%s/ckpt-2.safetensors", dir2);
  snprintf(c3, sizeof c3, "%s/ckpt-3.safetensors", dir2);
  ck_assert_msg(r.code == 1 && strstr(r.err, "checkpoint: not saved: the model holds a value that is not finite, ") &&
                    access(c2, F_OK) == 0 && access(c3, F_OK) != 0,
                "gradients not finite: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  /* batch-norm statistics gone infinite under a finite loss (rank 0's): the
   * run stops at that step, naming it (it trained on to its first save, which
   * was refused, or to its end with --save-weights alone) */
  char dir3[512];
  path(dir3, sizeof dir3, "ckpt-nonfinite-stats");
  snprintf(c2, sizeof c2, "%s/ckpt-2.safetensors", dir3);
  snprintf(c3, sizeof c3, "%s/ckpt-3.safetensors", dir3);
  train(&r, (const char *const[]){"GW_TRAIN_NAN_STATS_AT_STEP=3", "GW_TRAIN_OVERFLOW_RANK=0", NULL}, "2",
        (const char *const[]){"--steps", "5", "--batch", "8", "--checkpoint-dir", dir3, "--checkpoint-every", "1", NULL});
  ck_assert_msg(r.code == 1 && strstr(r.err, "step 3: a batch-norm running statistic is not finite, ") &&
                    strstr(r.err, "= inf, under a finite loss") && strstr(r.err, "the last checkpoint, of step 2, is whole") &&
                    strstr(r.err, "rank 1: training: stopping with the others at step 3") && access(c2, F_OK) == 0 &&
                    access(c3, F_OK) != 0,
                "statistics not finite: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  train(&r, (const char *const[]){"GW_TRAIN_NAN_LOSS_AT_STEP=2", "GW_TRAIN_OVERFLOW_RANK=0", NULL}, "2",
        (const char *const[]){"--steps", "3", "--batch", "8", "--amp", "bf16", "--loss-scale", "dynamic", NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "step 2: the loss is nan at loss scale 65536; step skipped (1 so far), scale now 32768"),
                "a loss-scaled run's NaN loss not skipped:\n%s", r.out);
  gwrun_free(&r);
}
END_TEST

void add_checkpoint_meta_tests(TCase *tc) {
  tcase_add_test(tc, test_nonfinite_step_stops);
  tcase_add_test(tc, test_renamed_checkpoint_refused);
  tcase_add_test(tc, test_epoch_evaluated_once);
  tcase_add_test(tc, test_failed_resave_warns);
  tcase_add_test(tc, test_metadata_damage_refused);
  tcase_add_test(tc, test_tensor_dtype_damage_refused);
  tcase_add_test(tc, test_format_versions);
  tcase_add_test(tc, test_format_version_bit_flip);
  tcase_add_test(tc, test_resume_version1_pending);
  tcase_add_test(tc, test_full_disk);
}
