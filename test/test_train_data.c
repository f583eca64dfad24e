/* test_train_data.c - gw-train on an ImageNet-style folder with damaged
 * files (part of test_train's gw-train case): training goes on, the metrics,
 * the epochs' totals and the evaluation count the samples replaced or left
 * out, once each over the ranks; --val-resize-size and --val-crop-size. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gwrun_helpers.h"
#include "test_train.h"
#include <turbojpeg.h>

/* A JPEG of w x h pseudo-random pixels at path, cut to `keep` of its length. */
static void write_jpeg(const char *file, int w, int h, unsigned seed, double keep) {
  unsigned char *px = malloc((size_t)w * h * 3);
  for (size_t i = 0; i < (size_t)w * h * 3; i++) px[i] = (unsigned char)((i * 2654435761u + seed * 97u) >> 13);
  tjhandle tj = tjInitCompress();
  unsigned char *jpg = NULL;
  unsigned long len = 0;
  ck_assert_int_eq(tjCompress2(tj, px, w, 0, h, TJPF_RGB, &jpg, &len, TJSAMP_444, 90, 0), 0);
  FILE *f = fopen(file, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(jpg, 1, (size_t)(len * keep), f), (size_t)(len * keep));
  fclose(f);
  tjFree(jpg);
  tjDestroy(tj);
  free(px);
}

/* ROOT/SPLIT/cat and ROOT/SPLIT/dog made; with junk, each holding x.jpg of
 * that text (no picture). */
static void class_dirs(const char *root, const char *split, const char *const classes[2], const char *junk) {
  char dir[700], file[800];
  snprintf(dir, sizeof dir, "%s/%s", root, split);
  mkdir(dir, 0777);
  for (int c = 0; c < 2; c++) {
    snprintf(dir, sizeof dir, "%s/%s/%s", root, split, classes[c]);
    ck_assert_int_eq(mkdir(dir, 0777), 0);
    if (!junk) continue;
    snprintf(file, sizeof file, "%s/x.jpg", dir);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fputs(junk, f);
    fclose(f);
  }
}

/* An ImageNet-style tree with a truncated JPEG and a text file posing as one:
 * training goes on, and the metrics count the samples that were replaced. */
START_TEST(test_imagefolder_bad_files_skipped) {
  char root[512], dir[700], file[800], metrics[512];
  path(root, sizeof root, "folder");
  path(metrics, sizeof metrics, "folder.jsonl");
  static const char *const splits[] = {"train", "val"}, *const classes[] = {"cat", "dog"};
  for (int s = 0; s < 2; s++)
    for (int c = 0; c < 2; c++) {
      snprintf(dir, sizeof dir, "%s/%s", root, splits[s]);
      mkdir(root, 0777), mkdir(dir, 0777);
      snprintf(dir, sizeof dir, "%s/%s/%s", root, splits[s], classes[c]);
      ck_assert_int_eq(mkdir(dir, 0777), 0);
      for (int i = 0; i < 4; i++) {
        snprintf(file, sizeof file, "%s/img%d.jpg", dir, i);
        write_jpeg(file, 40 + 8 * i, 36, (unsigned)(s * 100 + c * 10 + i), 1.0);
      }
    }
  snprintf(file, sizeof file, "%s/train/cat/truncated.jpg", root);
  write_jpeg(file, 64, 64, 7, 0.3);
  snprintf(file, sizeof file, "%s/train/dog/notes.jpg", root);
  FILE *f = fopen(file, "w");
  fputs("not a picture\n", f);
  fclose(f);
  /* In the validation set too: the sample put in its place is scored once, at
   * its own place, so the evaluation counts the 8 readable ones.  The first
   * in the list (cat/), which 2 ranks' padding repeats. */
  snprintf(file, sizeof file, "%s/val/cat/a-notes.jpg", root);
  f = fopen(file, "w");
  fputs("not a picture either\n", f);
  fclose(f);
  char spec[600];
  snprintf(spec, sizeof spec, "imagenet:%s", root);
  struct run r;
  const char *const noenv[] = {NULL};
  char weights[512];
  path(weights, sizeof weights, "folder.safetensors");
  const char *args[] = {"-n", "1", train_bin(), "--data", spec, "--image-size", "32", "--model", "resnet18",
                        "--width-divisor", "16", "--batch", "5", "--epochs", "2", "--threads", "1",
                        "--metrics", metrics, "--save-weights", weights, NULL};
  gwrun_start(&r, noenv, args);
  gwrun_wait(&r, 120);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "evaluation: top-1") && strstr(r.out, "over 8 samples") &&
                    !strstr(r.out, "over 9 samples"),
                "no evaluation over the 8 readable validation samples:\n%s", r.out);
  /* and the epochs' totals (the per-rank warnings come now and then) */
  ck_assert_msg(strstr(r.out, "unreadable training samples replaced by readable ones (all ranks; 4 in this run so far)"),
                "no total of the 4 replaced samples at the last epoch's end:\n%s", r.out);
  gwrun_free(&r);
  f = fopen(metrics, "r");
  ck_assert_ptr_nonnull(f);
  char line[1024];
  long long skipped = -1;
  while (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "\"skipped\":");
    if (p) skipped = atoll(p + 10);
  }
  fclose(f);
  /* 10 training files, 2 unreadable, 2 epochs of 2 batches of 5: each bad file's
   * place is replaced once per epoch (a search passing over the other bad file
   * is no second replacement), so exactly 4. */
  ck_assert_msg(skipped == 4, "the metrics count %lld skipped samples, expected 4", skipped);
  /* 2 ranks: 10 places for the 9 validation files, the last repeating the
   * first, the unreadable one: one sample left out, said by rank 0 alone
   * (rank 1 warned of the padding's repeat too) */
  const char *two[] = {"-n", "2", train_bin(), "--data", spec, "--image-size", "32", "--model", "resnet18",
                       "--width-divisor", "16", "--batch", "1", "--threads", "1", "--test-only", "--load-weights",
                       weights, NULL};
  gwrun_start(&r, noenv, two);
  gwrun_wait(&r, 120);
  expect_ok(&r);
  const char *said = strstr(r.err, "rank 0: warning: the evaluation left out 1 unreadable sample of");
  ck_assert_msg(strstr(r.out, "over 8 samples") && said && !strstr(said + 20, "the evaluation left out") &&
                    !strstr(r.err, "rank 1: warning: the evaluation left out"),
                "2 ranks: not one unreadable sample said once over 8 samples:\n%s\n%s", r.out, r.err);
  gwrun_free(&r);
  /* --val-resize-size: taken by the evaluation (40 around the 32 crop), and
   * one below the image size refused before anything opens */
  const char *resized[] = {"-n", "1", train_bin(), "--data", spec, "--image-size", "32", "--model", "resnet18",
                           "--width-divisor", "16", "--batch", "5", "--epochs", "1", "--threads", "1",
                           "--val-resize-size", "40", NULL};
  gwrun_start(&r, noenv, resized);
  gwrun_wait(&r, 120);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "over 8 samples"), "no evaluation:\n%s", r.out);
  gwrun_free(&r);
  resized[18] = "31";
  gwrun_start(&r, noenv, resized);
  gwrun_wait(&r, 120);
  ck_assert_msg(r.code != 0 && strstr(r.err, "--val-resize-size 31 is smaller than the evaluation's crop 32 (--image-size)"),
                "exit %d\n%s", r.code, r.err);
  gwrun_free(&r);
  /* --val-crop-size: trained on 32x32 crops, evaluated on 40x40 center
   * crops by a model at that size given the trained values, which scores
   * exactly what --test-only of the saved weights at 40 scores (the same
   * weights, BN statistics and crops); a resize below that crop is refused */
  char weights40[512], scored[3][160];
  path(weights40, sizeof weights40, "folder-crop40.safetensors");
  const char *crop40[] = {"-n", "1", train_bin(), "--data", spec, "--image-size", "32", "--model", "resnet18",
                          "--width-divisor", "16", "--batch", "5", "--epochs", "1", "--threads", "1",
                          "--val-crop-size", "40", "--save-weights", weights40, NULL};
  const char *at40[][3] = {{"--val-crop-size", "40", NULL}, {"--image-size", "40", NULL}};
  for (int k = 0; k < 3; k++) {
    const char *only[] = {"-n", "1", train_bin(), "--data", spec, "--model", "resnet18", "--width-divisor", "16",
                          "--batch", "5", "--threads", "1", "--test-only", "--load-weights", weights40,
                          k ? at40[k - 1][0] : NULL, k ? at40[k - 1][1] : NULL, NULL};
    gwrun_start(&r, noenv, k ? only : crop40);
    gwrun_wait(&r, 120);
    expect_ok(&r);
    const char *ev = strstr(r.out, "evaluation: top-1");
    ck_assert_msg(ev && strstr(ev, "over 8 samples"), "run %d: no evaluation:\n%s", k, r.out);
    ck_assert_msg(k || strstr(r.out, "evaluation on 40x40 center crops (--val-crop-size), training on 32x32"),
                  "the crop is not said:\n%s", r.out);
    snprintf(scored[k], sizeof scored[k], "%.*s", (int)strcspn(ev, "\n"), ev);
    gwrun_free(&r);
  }
  ck_assert_msg(!strcmp(scored[0], scored[1]) && !strcmp(scored[0], scored[2]),
                "the evaluation at --val-crop-size 40 scored\n  %s\n--test-only at 40 scored\n  %s\n  %s", scored[0],
                scored[1], scored[2]);
  crop40[18] = "48", crop40[19] = "--val-resize-size", crop40[20] = "44";
  gwrun_start(&r, noenv, crop40);
  gwrun_wait(&r, 120);
  ck_assert_msg(r.code != 0 && strstr(r.err, "--val-resize-size 44 is smaller than the evaluation's crop 48 "
                                              "(--val-crop-size)"), "exit %d\n%s", r.code, r.err);
  gwrun_free(&r);
  /* --test-only opens the evaluation split alone (the classes are train's
   * folder names, not its files): a tree whose training folders hold no
   * image, which training refuses, evaluates the saved weights. */
  char root2[512], spec2[600];
  path(root2, sizeof root2, "folder-eval-only");
  mkdir(root2, 0777);
  class_dirs(root2, "train", classes, NULL);
  snprintf(dir, sizeof dir, "%s/val", root);
  snprintf(file, sizeof file, "%s/val", root2);
  ck_assert_int_eq(symlink(dir, file), 0);
  snprintf(spec2, sizeof spec2, "imagenet:%s", root2);
  const char *eval_only[] = {"-n", "1", train_bin(), "--data", spec2, "--model", "resnet18", "--width-divisor", "16",
                             "--batch", "5", "--threads", "1", "--test-only", "--load-weights", weights, NULL};
  gwrun_start(&r, noenv, eval_only);
  gwrun_wait(&r, 120);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "on imagenet val") && strstr(r.out, "over 8 samples"), "stdout:\n%s", r.out);
  gwrun_free(&r);
  const char *train_there[] = {"-n", "1", train_bin(), "--data", spec2, "--model", "resnet18", "--width-divisor",
                               "16", "--batch", "5", "--threads", "1", "--steps", "1", NULL};
  gwrun_start(&r, noenv, train_there);
  gwrun_wait(&r, 120);
  ck_assert_msg(r.code != 0 && strstr(r.err, "--data"), "training on empty folders: exit %d\n%s", r.code, r.err);
  gwrun_free(&r);
  /* One class folder (as --classes 1): the loss is 0 and nothing trains; refused */
  char root3[512], spec3[600];
  path(root3, sizeof root3, "folder-one-class");
  mkdir(root3, 0777);
  for (int s = 0; s < 2; s++) {
    snprintf(dir, sizeof dir, "%s/%s", root3, splits[s]);
    mkdir(dir, 0777);
    snprintf(dir, sizeof dir, "%s/%s/cat", root, splits[s]);
    snprintf(file, sizeof file, "%s/%s/cat", root3, splits[s]);
    ck_assert_int_eq(symlink(dir, file), 0);
  }
  snprintf(spec3, sizeof spec3, "imagenet:%s", root3);
  train_there[4] = spec3;
  gwrun_start(&r, noenv, train_there);
  gwrun_wait(&r, 120);
  ck_assert_msg(r.code != 0 && strstr(r.err, "the data has 1 class: the loss is 0 and nothing trains"),
                "training on one class: exit %d\n%s", r.code, r.err);
  gwrun_free(&r);
  /* An evaluation split of unreadable files: refused before the first step
   * (it failed the job at the first evaluation, after an epoch) */
  char root4[512], spec4[600];
  path(root4, sizeof root4, "folder-bad-val");
  mkdir(root4, 0777);
  snprintf(dir, sizeof dir, "%s/train", root);
  snprintf(file, sizeof file, "%s/train", root4);
  ck_assert_int_eq(symlink(dir, file), 0);
  class_dirs(root4, "val", classes, "no picture\n");
  snprintf(spec4, sizeof spec4, "imagenet:%s", root4);
  train_there[4] = spec4;
  gwrun_start_prog(&r, train_bin(), noenv, train_there + 3); /* one rank without gw-run: no communicator */
  gwrun_wait(&r, 120);
  ck_assert_msg(r.code != 0 && strstr(r.err, "--data (evaluation split): none of the 2 samples of the evaluation "
                                              "split is readable") && !strstr(r.out, "rank x batch") &&
                    !strstr(r.err, "comm is NULL"), /* (one rank has none: the library warned of it) */
                "an unreadable evaluation split: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

void add_data_tests(TCase *tc) { tcase_add_test(tc, test_imagefolder_bad_files_skipped); }
