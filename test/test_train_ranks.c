/* test_train_ranks.c - gw-train's ranks started by hand with different
 * options or data: refused at once, naming each difference; and the options'
 * words compared (optwords.c). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "gradwire.h"
#include "gwrun_helpers.h"
#include "optwords.h"
#include "test_train.h"

/* Two ranks through `sh -c`: rank 0 runs with the words rank0, rank 1 with
 * rank1, after the narrow model's options and --steps 1 --no-eval. */
static void two_ranks_differ(struct run *r, const char *rank0, const char *rank1) {
  char script[2400];
  snprintf(script, sizeof script,
           "w='%s'; [ \"$GW_RANK\" = 1 ] && w='%s'; exec '%s' --data synthetic --model resnet18 --width-divisor 8 "
           "--in-channels 3 --image-size 16 --classes 4 --stem small --threads 1 --steps 1 --no-eval $w",
           rank0, rank1, train_bin());
  const char *args[] = {"-n", "2", "sh", "-c", script, NULL};
  const char *const noenv[] = {NULL};
  gwrun_start(r, noenv, args);
  gwrun_wait(r, 120);
}

/* Ranks that opened different data (here 96 and 97 synthetic samples; in life a
 * folder scanned while files came or went) are refused, naming the split; and
 * --drop-last that leaves a rank nothing. */
START_TEST(test_ranks_must_see_same_data) {
  struct run r;
  two_ranks_differ(&r, "--synthetic-samples 96 --batch 8", "--synthetic-samples 97 --batch 8");
  ck_assert_msg(r.code != 0 && strstr(r.err, "training split (97 samples") && strstr(r.err, "is not rank 0's (96 samples") &&
                    strstr(r.err, "every rank must see the same files"),
                "different data on rank 1: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  /* --drop-last with fewer samples than ranks: no --batch helps, so it is
   * --drop-last that is named (--batch was) */
  two_ranks_differ(&r, "--synthetic-samples 1 --batch 1 --drop-last", "--synthetic-samples 1 --batch 1 --drop-last");
  ck_assert_msg(r.code != 0 && strstr(r.err, ": --drop-last: the 1 training samples are fewer than the 2 ranks"),
                "--drop-last with 1 sample at 2 ranks: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* The options' words compared (a checkpoint's against this run's, rank 0's
 * against another's): values, and bare words each said once (a word repeated
 * in an edited checkpoint was said as often as it came: "z on -> off, z on ->
 * off, ..."). */
START_TEST(test_option_words_diff) {
  char out[400];
  ck_assert_int_eq(opt_words_diff("m a=1 b=2 z z z", "m a=1 b=3", NULL, out, sizeof out), 2);
  ck_assert_str_eq(out, "b 2 -> 3, z on -> off");
  ck_assert_int_eq(opt_words_diff("m a=1", "m a=1 y y", NULL, out, sizeof out), 1);
  ck_assert_str_eq(out, "y off -> on");
  static const char *const skip[] = {"b", NULL};
  ck_assert_int_eq(opt_words_diff("m a=1 b=2", "m a=2 b=3", skip, out, sizeof out), 1);
  ck_assert_str_eq(out, "a 1 -> 2");
  ck_assert_int_eq(opt_words_diff("m a=1 z", "m a=1 z", NULL, out, sizeof out), 0);
}
END_TEST

/* Ranks started by hand with different options (here --lr and --batch on
 * rank 1; then --resume on rank 0 only) are refused at once, naming each difference, before any data is
 * opened (they would have paired mismatched collectives, or trained apart). */
START_TEST(test_ranks_must_share_options) {
  struct run r;
  /* (--layout in words: it said "layout 0 -> -1") */
  two_ranks_differ(&r, "--batch 8 --lr 0.4 --layout nchw", "--batch 4 --lr 0.2");
  ck_assert_msg(r.code != 0 && strstr(r.err, "rank 1: options: this rank's options are not rank 0's") &&
                    strstr(r.err, "batch 8 -> 4, lr 0.4 -> 0.2") && strstr(r.err, "layout nchw -> auto") &&
                    strstr(r.err, "rank 0: options: 1 rank(s)"),
                "different options on rank 1: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  /* --resume on rank 0 only: rank 1 would skip the resume's broadcasts */
  char dir[512], rank0[600], rank1[600];
  path(dir, sizeof dir, "ckpt-resume-one-rank");
  snprintf(rank0, sizeof rank0, "--batch 8 --checkpoint-dir %s --resume", dir);
  snprintf(rank1, sizeof rank1, "--batch 8 --checkpoint-dir %s", dir);
  two_ranks_differ(&r, rank0, rank1);
  ck_assert_msg(r.code != 0 && strstr(r.err, "rank 1: options: this rank's options are not rank 0's") &&
                    strstr(r.err, "resume 1 -> 0"),
                "--resume on rank 0 only: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  /* --checkpoint-dir on rank 1 alone (rank 0 saves: nothing was saved,
   * silently); another --load-weights file on rank 1 (rank 0's weights were
   * broadcast over it without a word); --load-weights on rank 0 alone runs
   * (a file on rank 0's machine only) */
  char a[512], b[512];
  path(a, sizeof a, "lw-a.safetensors");
  path(b, sizeof b, "lw-b.safetensors");
  weights_with("lw-a.safetensors", b, "fc.bias", 0.5f);
  static const char *const want[3] = {"rank 1: options: this rank has --checkpoint-dir and rank 0 has not",
                                      "rank 1: --load-weights: this rank's", NULL};
  for (int k = 0; k < 3; k++) {
    if (k == 0) snprintf(rank0, sizeof rank0, "--batch 8"), snprintf(rank1, sizeof rank1, "--batch 8 --checkpoint-dir %s", dir);
    else snprintf(rank0, sizeof rank0, "--batch 8 --load-weights %s", a);
    if (k == 1) snprintf(rank1, sizeof rank1, "--batch 8 --load-weights %s", b);
    if (k == 2) snprintf(rank1, sizeof rank1, "--batch 8");
    two_ranks_differ(&r, rank0, rank1);
    ck_assert_msg(want[k] ? r.code != 0 && strstr(r.err, want[k]) : r.code == 0, "rank 0's %s, rank 1's %s: exit %d\n%s\n%s",
                  rank0, rank1, r.code, r.out, r.err);
    gwrun_free(&r);
  }
  /* --metrics or --plot on rank 1 alone: rank 0 writes them (nothing was
   * written, silently) */
  char m1[512];
  path(m1, sizeof m1, "metrics-rank1.jsonl");
  snprintf(rank1, sizeof rank1, "--batch 8 --metrics %s", m1);
  two_ranks_differ(&r, "--batch 8", rank1);
  ck_assert_msg(r.code != 0 && strstr(r.err, "rank 1: options: this rank has --metrics and rank 0 has not"),
                "--metrics on rank 1 alone: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  /* another value than rank 0's: as ignored (it was, unsaid) */
  char m0[512], want1[1200];
  path(m0, sizeof m0, "metrics-rank0.jsonl");
  snprintf(rank0, sizeof rank0, "--batch 8 --metrics %s", m0);
  two_ranks_differ(&r, rank0, rank1);
  snprintf(want1, sizeof want1, "rank 1: options: this rank's --metrics %s is not rank 0's %s: it would be ignored",
           m1, m0);
  /* rank 0 has the flag too, with another value: it said only "that rank 0 has not" */
  ck_assert_msg(r.code != 0 && strstr(r.err, want1) && strstr(r.err, "that rank 0 has not, or with other values"),
                "--metrics differing: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  snprintf(rank0, sizeof rank0, "--batch 8 --checkpoint-dir %s", dir);
  snprintf(rank1, sizeof rank1, "--batch 8 --checkpoint-dir %s --keep-checkpoints 1", dir);
  two_ranks_differ(&r, rank0, rank1);
  ck_assert_msg(r.code != 0 && strstr(r.err, "rank 1: options: this rank's --keep-checkpoints 1 is not rank 0's 3"),
                "--keep-checkpoints differing: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

void add_ranks_tests(TCase *tc) {
  tcase_add_test(tc, test_option_words_diff);
  tcase_add_test(tc, test_ranks_must_share_options);
  tcase_add_test(tc, test_ranks_must_see_same_data);
}
