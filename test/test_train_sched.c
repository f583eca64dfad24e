/* test_train_sched.c - gw-train's schedule and what it says about it:
 * - the learning rate of every step is the closed form (linear scaling by the
 *   global batch, linear warmup over --warmup-epochs, then cosine or steps of
 *   10x), straight and across a resume in the middle of the warmup; steps of
 *   a factor at milestones after a warmup from a fraction of the peak, as
 *   torchvision's schedulers give them, and a resume with a moved milestone;
 *   a warmup longer than the run not squeezed into it (said); a step skipped
 *   for a non-finite loss left out of the epoch's mean;
 * - a resume with more --steps says the schedule now spans them, with the rates
 *   before and after; one with nothing left to train says so;
 * - a --steps run ending inside an epoch says its last steps go unevaluated;
 * - --test-only scores saved weights as their run's last evaluation did;
 * - the evaluation over 3 ranks counts every sample once (31: padding left out),
 *   and the training samples a shard's whole batches leave out are said; its
 *   loss is the training's, label-smoothed as PyTorch's criterion;
 * - the run's throughput at its end, from the steps' seconds; --metrics to a
 *   FIFO;
 * - the default compute threads are the cores over the ranks on this machine as
 *   the rendezvous found them, whatever the launcher's variables say. */
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gw-train.h" /* eval_score_batch */
#include "gwrun_helpers.h"
#include "loader.h"
#include "test_train.h"

/* 32 samples, batch 8: 4 steps per epoch; peak lr 0.4 * 8 / 256 = 0.0125. */
#define SCHED_ARGS                                                                                             \
  "--data", "synthetic", "--synthetic-samples", "32", "--model", "resnet18", "--width-divisor", "8",           \
      "--in-channels", "3", "--image-size", "16", "--classes", "4", "--stem", "small", "--threads", "1",        \
      "--batch", "8", "--lr", "0.4"
static const double peak = 0.4 * 8 / 256;

/* The schedule's rate at step k (0-based) of total, warmup steps first. */
static double closed_form(int64_t k, int64_t total, int64_t warmup, int step_schedule) {
  if (k < warmup) return peak * (double)(k + 1) / (double)warmup;
  double p = (double)(k - warmup) / (double)(total - warmup);
  if (step_schedule) return peak * (p < 1.0 / 3 ? 1.0 : p < 2.0 / 3 ? 0.1 : 0.01);
  return peak * 0.5 * (1.0 + cos(M_PI * p));
}

static void run1(struct run *r, const char *const *env, const char *const *extra) {
  train_from(r, env, "1", (const char *const[]){SCHED_ARGS, NULL}, extra);
}

static void expect_rates(const char *metrics, int64_t total, int64_t warmup, int step_schedule, const char *what) {
  char lr[16][32];
  ck_assert_int_le(total, 16);
  ck_assert_msg(metrics_by_step(metrics, "lr", lr, (int)total) >= total, "%s: fewer than %lld steps in %s", what,
                (long long)total, metrics);
  for (int64_t k = 0; k < total; k++) {
    double want = closed_form(k, total, warmup, step_schedule), got = atof(lr[k]);
    ck_assert_msg(fabs(got - want) <= 1e-5 * peak, "%s: step %lld ran at lr %s, the schedule says %.6g", what,
                  (long long)k + 1, lr[k], want);
  }
}

/* Every step's rate: cosine and step schedules with a 1-epoch warmup over 3
 * epochs, and the cosine run again stopped at step 2 (inside the warmup) and
 * resumed. */
START_TEST(test_lr_schedule) {
  const char *const noenv[] = {NULL}, *const stop2[] = {"GW_TRAIN_STOP_AT_STEP=2", NULL};
  char m[3][512], dir[512];
  path(m[0], sizeof m[0], "sched-cos.jsonl");
  path(m[1], sizeof m[1], "sched-step.jsonl");
  path(m[2], sizeof m[2], "sched-resumed.jsonl");
  path(dir, sizeof dir, "sched-ckpt");
  struct run r;
  run1(&r, noenv, (const char *const[]){"--epochs", "3", "--warmup-epochs", "1", "--no-eval", "--metrics", m[0], NULL});
  expect_ok(&r);
  gwrun_free(&r);
  expect_rates(m[0], 12, 4, 0, "cosine");
  run1(&r, noenv,
       (const char *const[]){"--epochs", "3", "--warmup-epochs", "1", "--no-eval", "--schedule", "step", "--metrics", m[1],
                             NULL});
  expect_ok(&r);
  gwrun_free(&r);
  expect_rates(m[1], 12, 4, 1, "step schedule");
  /* checkpoints at every step: the stop at step 2 saves one there (without,
   * the "resume" found none and started over, which the rates could not tell) */
  const char *const resumed[] = {"--epochs", "3", "--warmup-epochs", "1", "--no-eval", "--metrics", m[2],
                                 "--checkpoint-dir", dir, "--checkpoint-every", "1", NULL};
  run1(&r, stop2, resumed);
  ck_assert_msg(strstr(r.out, "stopping after step 2"), "not stopped at step 2:\n%s\n%s", r.out, r.err);
  gwrun_free(&r);
  const char *const again[] = {"--epochs", "3", "--warmup-epochs", "1", "--no-eval", "--metrics", m[2],
                               "--checkpoint-dir", dir, "--checkpoint-every", "1", "--resume", NULL};
  run1(&r, noenv, again);
  expect_ok(&r);
  ck_assert_msg(!strstr(r.out, "learning-rate schedule now spans"), "a resume with the same length noted:\n%s", r.out);
  ck_assert_msg(strstr(r.out, "resumed from ") && strstr(r.out, "at step 2") && !strstr(r.out, "no checkpoint in"),
                "not resumed at step 2, or also said it found no checkpoint:\n%s", r.out);
  gwrun_free(&r);
  expect_rates(m[2], 12, 4, 0, "resumed in the warmup");
}
END_TEST

/* A warmup longer than the run climbs as the recipe's does, not squeezed into
 * the run (8 warmup steps, 4 run: 1/8 .. 4/8 of the peak; it ran 1/4 .. 1),
 * and the start says where the run ends on it.  A step the loss scaler skips
 * for a non-finite loss is left out of the epoch's mean (it made it nan).  A
 * warmup rounded to one step is said to be none. */
START_TEST(test_long_warmup_and_skipped_loss) {
  const char *const noenv[] = {NULL}, *const nan2[] = {"GW_TRAIN_NAN_LOSS_AT_STEP=2", NULL};
  char m[512];
  path(m, sizeof m, "sched-long-warmup.jsonl");
  struct run r;
  run1(&r, noenv, (const char *const[]){"--epochs", "1", "--warmup-epochs", "2", "--no-eval", "--metrics", m, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "note: the warmup (8 steps, --warmup-epochs 2) is longer than this run (4 steps): its "
                              "last step runs at lr 0.00625, 0.5 of the peak 0.0125"),
                "the long warmup not said:\n%s", r.out);
  gwrun_free(&r);
  expect_rates(m, 4, 8, 0, "warmup longer than the run");
  run1(&r, nan2, (const char *const[]){"--epochs", "1", "--no-eval", "--loss-scale", "dynamic", NULL});
  expect_ok(&r);
  const char *e = strstr(r.out, "epoch 1 done: mean training loss ");
  ck_assert_msg(e && strstr(e, " (over 3 steps; 1 skipped for a non-finite loss are left out)") &&
                    isfinite(atof(e + strlen("epoch 1 done: mean training loss "))),
                "the skipped step's nan in the epoch's mean:\n%s", r.out);
  /* the default 0.2 epochs at 4 steps each: 1 step, no warmup, said */
  ck_assert_msg(strstr(r.out, "note: --warmup-epochs 0.2 is 1 step at 4 steps per epoch: no warmup"),
                "a warmup of one step not said:\n%s", r.out);
  gwrun_free(&r);
  /* said at the run's start only (not on a resume past it); from a start
   * factor one step is a warmup, none is not; loss scaling with a float16
   * wire between 2 ranks is for something (not said), at 1 rank there is no
   * wire (said) */
  char dir[512];
  path(dir, sizeof dir, "sched-notes");
  static const struct {
    const char *ranks, *const args[12];
    int warmup_note, scale_note;
  } runs[] = {
      {"1", {"--steps", "2", "--no-eval", "--checkpoint-dir", NULL}, 1, 0},
      {"1", {"--steps", "4", "--no-eval", "--checkpoint-dir", NULL, "--resume"}, 0, 0},
      {"1", {"--steps", "1", "--no-eval", "--warmup-epochs", "0.25", "--warmup-start-factor", "0.5"}, 0, 0},
      {"1", {"--steps", "1", "--no-eval", "--warmup-epochs", "0.1", "--warmup-start-factor", "0.5"}, 1, 0},
      {"2", {"--steps", "1", "--no-eval", "--loss-scale", "dynamic", "--grad-wire", "fp16"}, 1, 0},
      {"1", {"--steps", "1", "--no-eval", "--loss-scale", "dynamic", "--grad-wire", "fp16"}, 1, 1}};
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    const char *args[12];
    memcpy(args, runs[k].args, sizeof args);
    if (k < 2) args[4] = dir;
    train_from(&r, noenv, runs[k].ranks, (const char *const[]){SCHED_ARGS, NULL}, args);
    expect_ok(&r);
    ck_assert_msg(!strstr(r.out, "note: --warmup-epochs ") == !runs[k].warmup_note &&
                      !strstr(r.out, "note: --loss-scale with ") == !runs[k].scale_note,
                  "run %zu: the warmup note %s, the loss-scale note %s:\n%s", k,
                  runs[k].warmup_note ? "wanted" : "not wanted", runs[k].scale_note ? "wanted" : "not wanted", r.out);
    gwrun_free(&r);
  }
}
END_TEST

/* The step schedule at milestones (epochs from the start) with a factor and a
 * warmup from a fraction of the peak, 4 steps per epoch: torchvision's
 * ChainedScheduler([LinearLR(start_factor=0.25, total_iters=4),
 * MultiStepLR(milestones=[6, 10], gamma=0.5)]) stepped per iteration gives
 * these factors of the peak.  A milestone past the end is said.  Stopped after
 * step 6 (its checkpoint: epoch 1's, step 4) and resumed with the milestone
 * moved from epoch 1 to 1.5: the resume names the saved run's rate at step 5
 * from its own milestones. */
START_TEST(test_lr_milestones) {
  static const double factor[12] = {0.25, 0.4375, 0.625, 0.8125, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25};
  const char *const noenv[] = {NULL}, *const stop6[] = {"GW_TRAIN_STOP_AT_STEP=6", NULL};
  char m[512], dir[512];
  path(m, sizeof m, "sched-milestones.jsonl");
  path(dir, sizeof dir, "sched-milestones");
  struct run r;
  run1(&r, noenv,
       (const char *const[]){"--epochs", "3", "--warmup-epochs", "1", "--warmup-start-factor", "0.25",
                             "--lr-milestones", "1.5,2.5,5", "--lr-gamma", "0.5", "--no-eval", "--metrics", m, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "note: 1 of the 3 --lr-milestones (from epoch 5) come at or after this run's end"),
                "the milestone past the end was not said:\n%s", r.out);
  gwrun_free(&r);
  char lr[12][32];
  ck_assert_int_ge(metrics_by_step(m, "lr", lr, 12), 12);
  for (int k = 0; k < 12; k++)
    ck_assert_msg(fabs(atof(lr[k]) - factor[k] * peak) <= 1e-5 * peak, "step %d ran at lr %s, want %.6g", k + 1,
                  lr[k], factor[k] * peak);
  const char *saved[] = {"--epochs", "3", "--warmup-epochs", "1", "--lr-milestones", "1", "--lr-gamma", "0.5",
                         "--no-eval", "--checkpoint-dir", dir, NULL, NULL, NULL};
  run1(&r, stop6, saved);
  ck_assert_msg(strstr(r.out, "stopping after step 6"), "not stopped at step 6:\n%s\n%s", r.out, r.err);
  gwrun_free(&r);
  saved[5] = "1.5", saved[11] = "--resume";
  run1(&r, noenv, saved);
  expect_ok(&r);
  char want[200];
  snprintf(want, sizeof want, "step 5 runs at lr %.4g, where the saved run's schedule gave %.4g", peak, 0.5 * peak);
  ck_assert_msg(strstr(r.out, want) && strstr(r.out, "lr_milestones 1 -> 1.5"),
                "the moved milestone was not said (%s):\n%s", want, r.out);
  gwrun_free(&r);
}
END_TEST

/* --steps 4 saved, resumed with --steps 8: the cosine over 4 steps ended near
 * 0, over 8 step 5 runs at half the peak; said with both figures, and step 5's
 * rate in the metrics is the one said.  Resumed again with no step left: said. */
START_TEST(test_longer_resume_said) {
  const char *const noenv[] = {NULL};
  char dir[512], metrics[512];
  path(dir, sizeof dir, "sched-longer");
  path(metrics, sizeof metrics, "sched-longer.jsonl");
  struct run r;
  run1(&r, noenv, (const char *const[]){"--steps", "4", "--warmup-epochs", "0", "--no-eval", "--checkpoint-dir", dir, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  const char *const longer[] = {"--steps", "8", "--warmup-epochs", "0", "--no-eval", "--checkpoint-dir", dir,
                                "--resume", "--metrics", metrics, NULL};
  run1(&r, noenv, longer);
  expect_ok(&r);
  char want[200];
  snprintf(want, sizeof want, "now spans 8 steps (the saved run's: 4): step 5 runs at lr %.4g, where the saved run's "
           "last step ran at %.4g", closed_form(4, 8, 0, 0), closed_form(3, 4, 0, 0));
  ck_assert_msg(strstr(r.out, want) && strstr(r.out, "steps 4 -> 8"), "the longer schedule was not said (%s):\n%s",
                want, r.out);
  gwrun_free(&r);
  char lr[8][32];
  ck_assert_int_ge(metrics_by_step(metrics, "lr", lr, 8), 4);
  ck_assert_msg(fabs(atof(lr[4]) - closed_form(4, 8, 0, 0)) <= 1e-5 * peak, "step 5 ran at lr %s", lr[4]);
  run1(&r, noenv, longer);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "nothing left to train: the checkpoint is at step 8 and this run ends at step 8"),
                "a resume with nothing left did not say so:\n%s", r.out);
  gwrun_free(&r);
  /* Stopped in the warmup, whose rates do not stretch: the next step's rate
   * is the saved run's, said as such (it said "at lr X, where the saved
   * run's schedule gave X"). */
  char warm[512];
  path(warm, sizeof warm, "sched-longer-warmup");
  const char *const stop4[] = {"GW_TRAIN_STOP_AT_STEP=4", NULL}; /* the first epoch's end: saved */
  const char *in_warmup[] = {"--steps", "12", "--warmup-epochs", "2", "--no-eval", "--checkpoint-dir", warm, NULL, NULL};
  run1(&r, stop4, in_warmup);
  ck_assert_msg(strstr(r.out, "stopping after step 4"), "not stopped at step 4:\n%s\n%s", r.out, r.err);
  gwrun_free(&r);
  in_warmup[1] = "16", in_warmup[7] = "--resume";
  run1(&r, noenv, in_warmup);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "now spans 16 steps (the saved run's: 12): step 5 runs at the saved run's lr ") &&
                    !strstr(r.out, "where the saved run's schedule gave"),
                "the warmup's unchanged rate was not said as such:\n%s", r.out);
  gwrun_free(&r);
}
END_TEST

/* The same by --epochs (the saved description's steps are -1 then), and a
 * resume of the same length at another --lr: the rate at the next step is
 * said against the saved run's own schedule (its rate, not this run's). */
START_TEST(test_epochs_resume_said) {
  const char *const noenv[] = {NULL};
  char dir[512];
  path(dir, sizeof dir, "sched-epochs");
  struct run r;
  run1(&r, noenv, (const char *const[]){"--epochs", "1", "--warmup-epochs", "0", "--no-eval", "--checkpoint-dir", dir,
                                        NULL});
  expect_ok(&r);
  gwrun_free(&r);
  run1(&r, noenv, (const char *const[]){"--epochs", "2", "--warmup-epochs", "0", "--no-eval", "--checkpoint-dir", dir,
                                        "--resume", NULL});
  expect_ok(&r);
  char want[200];
  snprintf(want, sizeof want, "now spans 8 steps (the saved run's: 4): step 5 runs at lr %.4g, where the saved run's "
           "last step ran at %.4g", closed_form(4, 8, 0, 0), closed_form(3, 4, 0, 0));
  ck_assert_msg(strstr(r.out, want), "the longer --epochs schedule was not said (%s):\n%s", want, r.out);
  gwrun_free(&r);
  char dir2[512];
  path(dir2, sizeof dir2, "sched-lr");
  const char *const stop4[] = {"GW_TRAIN_STOP_AT_STEP=4", NULL};
  run1(&r, stop4, (const char *const[]){"--steps", "8", "--warmup-epochs", "0", "--no-eval", "--checkpoint-dir", dir2,
                                        NULL});
  gwrun_free(&r);
  run1(&r, noenv, (const char *const[]){"--steps", "8", "--warmup-epochs", "0", "--no-eval", "--checkpoint-dir", dir2,
                                        "--resume", "--lr", "0.2", NULL});
  expect_ok(&r);
  snprintf(want, sizeof want, "now spans 8 steps (the saved run's: 8): step 5 runs at lr %.4g, where the saved run's "
           "schedule gave %.4g", closed_form(4, 8, 0, 0) / 2, closed_form(4, 8, 0, 0));
  ck_assert_msg(strstr(r.out, want), "the lower rate was not said (%s):\n%s", want, r.out);
  gwrun_free(&r);
}
END_TEST

/* --steps 6 with the evaluation on (4 steps per epoch): its last 2 steps are
 * never evaluated, and the run says so at the start. */
START_TEST(test_unevaluated_steps_said) {
  const char *const noenv[] = {NULL};
  struct run r;
  run1(&r, noenv, (const char *const[]){"--steps", "6", NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "this run ends at step 6, 2 steps into epoch 2 (4 steps each)") &&
                    strstr(r.out, "epoch 1 evaluation"),
                "the unevaluated steps were not said:\n%s", r.out);
  gwrun_free(&r);
  run1(&r, noenv, (const char *const[]){"--steps", "8", NULL});
  expect_ok(&r);
  ck_assert_msg(!strstr(r.out, "not evaluated"), "a run ending at an epoch's end was told otherwise:\n%s", r.out);
  gwrun_free(&r);
}
END_TEST

/* The run's throughput at its end: images over the seconds of the steps after
 * the first (a mean of the rates would weigh a fast step more), the same in
 * the log and in the metrics' summary line, and consistent with the steps'
 * own rates. */
START_TEST(test_run_summary) {
  char m[512];
  path(m, sizeof m, "sched-summary.jsonl");
  struct run r;
  run1(&r, (const char *const[]){NULL},
       (const char *const[]){"--steps", "5", "--warmup-epochs", "0", "--no-eval", "--metrics", m, NULL});
  expect_ok(&r);
  const char *said = strstr(r.out, "5 steps run: ");
  ck_assert_msg(said && strstr(said, "img/s over the 4 after the first"), "no summary:\n%s", r.out);
  const double logged = atof(said + strlen("5 steps run: "));
  gwrun_free(&r);
  char ips[5][32];
  ck_assert_int_eq(metrics_by_step(m, "img_per_s", ips, 5), 5);
  double seconds = 0;
  for (int k = 1; k < 5; k++) seconds += 8 / atof(ips[k]);
  size_t len;
  char *text = slurp("sched-summary.jsonl", &len);
  const char *line = strstr(text, "{\"type\":\"summary\",\"steps\":5,\"timed_steps\":4,\"seconds\":");
  const char *v = line ? strstr(line, "\"img_per_s\":") : NULL;
  const double summary = v ? atof(v + strlen("\"img_per_s\":")) : -1;
  free(text);
  ck_assert_msg(summary > 0 && fabs(summary - 32 / seconds) <= 0.01 * summary && fabs(logged - summary) <= 0.1,
                "summary %.2f img/s, logged %.1f; the steps' own rates give %.2f", summary, logged, 32 / seconds);
}
END_TEST

/* --metrics to a FIFO (as /dev/stdout piped into jq): written as it goes,
 * nothing cut back or sought (a seek to check the last line stopped the run
 * at its start: "Illegal seek"). */
struct fifo_reader {
  char path[512];
  char buf[8192];
  size_t len;
};
static void *read_fifo(void *arg) {
  struct fifo_reader *f = arg;
  FILE *in = fopen(f->path, "r");
  if (in) f->len = fread(f->buf, 1, sizeof f->buf - 1, in), fclose(in);
  f->buf[f->len] = 0;
  return NULL;
}

START_TEST(test_metrics_fifo) {
  static struct fifo_reader f;
  path(f.path, sizeof f.path, "metrics.fifo");
  unlink(f.path);
  ck_assert(mkfifo(f.path, 0600) == 0);
  pthread_t th;
  ck_assert(pthread_create(&th, NULL, read_fifo, &f) == 0);
  struct run r;
  run1(&r, (const char *const[]){NULL},
       (const char *const[]){"--steps", "2", "--warmup-epochs", "0", "--no-eval", "--metrics", f.path, NULL});
  const int code = r.code;
  if (code != 0) { /* the reader still waits for a writer: give it one */
    int fd = open(f.path, O_WRONLY | O_NONBLOCK);
    if (fd >= 0) close(fd);
  }
  pthread_join(th, NULL);
  ck_assert_msg(code == 0, "a FIFO for --metrics: exit %d\n%s", code, r.err);
  gwrun_free(&r);
  ck_assert_msg(strstr(f.buf, "{\"type\":\"start\"}\n{\"type\":\"train\",\"step\":1,") &&
                    strstr(f.buf, "{\"type\":\"train\",\"step\":2,") && strstr(f.buf, "{\"type\":\"summary\""),
                "the FIFO's lines:\n%s", f.buf);
}
END_TEST

/* One batch scored: two samples by hand, PyTorch's
 * CrossEntropyLoss(label_smoothing=0.1) summed (worked in double from
 * logsumexp), plain cross-entropy beside it; a stand-in and the sampler's
 * padding (place 3 of a 3-sample split) not counted. */
/* --test-only: the weights a run saved, evaluated alone, score what that run's
 * last evaluation said, at 1 rank and at 2 (each sample once), with a
 * metrics line of epoch 0; what would train or save is refused by name. */
START_TEST(test_test_only) {
  const char *const noenv[] = {NULL};
  char w[512], m[512], dir[512], ckpt[600];
  path(w, sizeof w, "test-only.safetensors");
  path(m, sizeof m, "test-only.jsonl");
  path(dir, sizeof dir, "test-only-ckpt");
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-4.safetensors", dir);
  struct run r;
  run1(&r, noenv, (const char *const[]){"--epochs", "1", "--save-weights", w, "--checkpoint-dir", dir, NULL});
  expect_ok(&r);
  const char *e = strstr(r.out, "epoch 1 evaluation: ");
  ck_assert_msg(e, "no evaluation:\n%s", r.out);
  char want[200];
  snprintf(want, sizeof want, "gw-train: %.*s", (int)strcspn(e + 8, "\n"), e + 8); /* "evaluation: top-1 ..." */
  gwrun_free(&r);
  /* the weights file at 1 rank and 2; the checkpoint; batches larger than
   * the training set and of 1 (training rules, not an evaluation's) */
  static const char *const batch[4] = {"8", "4", "64", "1"};
  for (int k = 0; k < 4; k++) {
    unlink(m); /* a metrics file is appended to */
    train_from(&r, noenv, k == 1 ? "2" : "1", (const char *const[]){SCHED_ARGS, NULL},
               (const char *const[]){"--test-only", "--load-weights", k == 2 ? ckpt : w, "--batch", batch[k],
                                     "--metrics", m, NULL});
    expect_ok(&r);
    ck_assert_msg(strstr(r.out, "evaluating resnet18 from ") && strstr(r.out, want) && !strstr(r.out, "step 1/") &&
                      !strstr(r.out, "note:"),
                  "--test-only (case %d) did not score %s alone:\n%s", k, want + 10, r.out);
    gwrun_free(&r);
    char line[512] = "";
    int evals = 0, others = 0, marks = 0;
    FILE *f = fopen(m, "r");
    ck_assert(f);
    while (fgets(line, sizeof line, f)) {
      marks += !strcmp(line, "{\"type\":\"test_only\"}\n");
      evals += strstr(line, "{\"type\":\"eval\",\"epoch\":0,\"step\":0,") && strstr(line, "\"samples\":32}");
      others += !strstr(line, "\"type\":\"eval\"") && !strstr(line, "\"type\":\"test_only\"");
    }
    fclose(f);
    ck_assert_msg(marks == 1 && evals == 1 && others == 0, "metrics (case %d): %d test_only, %d evaluation, %d other lines",
                  k, marks, evals, others);
  }
  static const char *const refusals[][3] = {{"--steps", "2", "--steps does not apply"},
                                            {"--epochs", "1", "--epochs does not apply"},
                                            {"--save-weights", "/tmp/x.safetensors", "--save-weights does not apply"},
                                            {"--checkpoint-dir", "/tmp/x", "--checkpoint-dir does not apply"},
                                            {"--checkpoint-every", "2", "--checkpoint-every does not apply"},
                                            {"--no-eval", NULL, "--no-eval contradicts it"},
                                            {"--plot", "/tmp/p.png", "--plot does not apply"},
                                            {"--drop-last", NULL, "--drop-last does not apply"}};
  for (size_t k = 0; k < sizeof refusals / sizeof refusals[0]; k++) {
    run1(&r, noenv, (const char *const[]){"--test-only", "--load-weights", w, refusals[k][0], refusals[k][1], NULL});
    ck_assert_msg(r.code == 2 && strstr(r.err, refusals[k][2]), "--test-only %s: exit %d\n%s", refusals[k][0], r.code,
                  r.err);
    gwrun_free(&r);
  }
  run1(&r, noenv, (const char *const[]){"--test-only", NULL});
  ck_assert_msg(r.code == 1 && strstr(r.err, "--test-only: rank 0 has no --load-weights"), "exit %d\n%s", r.code,
                r.err);
  gwrun_free(&r);
}
END_TEST

START_TEST(test_eval_scores) {
  const float z[4][3] = {{2, 1, 0}, {0, 3, -1}, {9, 0, 0}, {9, 0, 0}};
  const int32_t y[4] = {0, 2, 1, 1};
  const uint8_t stand_in[4] = {0, 0, 1, 1}; /* the last place is the sampler's padding */
  const struct gw_batch bt = {.y = y, .n = 4, .stand_in = stand_in, .position = 0};
  struct eval_counts c = {0};
  eval_score_batch(&z[0][0], 3, &bt, 0, 1, 3, 0.1, &c);
  ck_assert_msg(c.n == 2 && c.top1 == 1 && c.top5 == 2, "n %g top-1 %g top-5 %g (2, 1, 2)", c.n, c.top1, c.top5);
  ck_assert_msg(c.left_out == 1, "%g places left out (1: the padding's stand-in is no other sample)", c.left_out);
  ck_assert_msg(fabs(c.loss - 4.4068232015351425) < 1e-6 && fabs(c.nll - 4.47348986820181) < 1e-6,
                "loss %.9g (4.40682320), cross-entropy %.9g (4.47348987)", c.loss, c.nll);
  struct eval_counts plain = {0};
  eval_score_batch(&z[0][0], 3, &bt, 0, 1, 3, 0, &plain);
  ck_assert_msg(plain.loss == plain.nll && fabs(plain.nll - c.nll) < 1e-12, "without smoothing: %.9g and %.9g",
                plain.loss, plain.nll);
  /* Overflowed logits (a diverged model): in no top-k, as NaN.  Every logit
   * +inf ranked the ties by class index (label 0 on top); one +inf at the
   * label, or a -inf elsewhere, put the label first.  The finite row still
   * counts. */
  const float inf = INFINITY, zi[4][3] = {{inf, inf, inf}, {0, inf, 0}, {5, 0, -inf}, {1, 2, 0}};
  const int32_t yi[4] = {0, 1, 0, 1};
  const uint8_t none[4] = {0, 0, 0, 0};
  const struct gw_batch bi = {.y = yi, .n = 4, .stand_in = none, .position = 0};
  struct eval_counts ci = {0};
  eval_score_batch(&zi[0][0], 3, &bi, 0, 1, 4, 0, &ci);
  ck_assert_msg(ci.n == 4 && ci.top1 == 1 && ci.top5 == 1, "n %g top-1 %g top-5 %g (4, 1, 1)", ci.n, ci.top1,
                ci.top5);
}
END_TEST

/* 3 ranks, 31 validation samples in batches of 4: each rank's share is padded
 * to 11; the evaluation counts the 31 once each.  Then batches of 11 take the
 * padding's 2 repeats, said (they went unsaid), starting from the first
 * run's weights, said too (--help alone said momentum starts anew). */
START_TEST(test_eval_over_ranks) {
  const char *const noenv[] = {NULL};
  char weights[512];
  path(weights, sizeof weights, "eval-ranks.safetensors");
  const char *args[] = {"-n", "3", train_bin(), "--data", "synthetic", "--synthetic-samples", "31", "--model",
                        "resnet18", "--width-divisor", "8", "--in-channels", "3", "--image-size", "16", "--classes",
                        "4", "--stem", "small", "--threads", "1", "--batch", "4", "--epochs", "1", "--save-weights",
                        weights, NULL};
  struct run r;
  gwrun_start(&r, noenv, args);
  gwrun_wait(&r, 180);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "epoch 1 evaluation") && strstr(r.out, "over 31 samples"),
                "the evaluation over 3 ranks did not count 31 samples:\n%s", r.out);
  /* training: shares of 11 (padded: 33 places for 31 samples), 2 whole
   * batches of 4 each: places 24..32 left out, 2 of them padding */
  ck_assert_msg(strstr(r.out, "each rank's share of 11 training samples is 2 batches of 4: 7 of the 31 samples are "
                              "left out of each epoch"),
                "the samples left out of each epoch were not said:\n%s", r.out);
  gwrun_free(&r);
  const char *again[] = {"-n", "3", train_bin(), "--data", "synthetic", "--synthetic-samples", "31", "--model",
                         "resnet18", "--width-divisor", "8", "--in-channels", "3", "--image-size", "16", "--classes",
                         "4", "--stem", "small", "--threads", "1", "--batch", "11", "--steps", "1", "--no-eval",
                         "--load-weights", weights, NULL};
  gwrun_start(&r, noenv, again);
  gwrun_wait(&r, 180);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "note: the 3 ranks' shares are padded to the same length with repeats: 2 of the 31 "
                              "samples are taken twice each epoch"),
                "the repeats were not said:\n%s", r.out);
  char want[700];
  snprintf(want, sizeof want, "starting from the weights of %s (momentum and the learning-rate schedule start anew)",
           weights);
  ck_assert_msg(strstr(r.out, want), "the weights' file was not said:\n%s", r.out);
  gwrun_free(&r);
}
END_TEST

/* Without --threads, 2 ranks on this machine share its cores, also where the
 * launcher's variable says otherwise (GW_LOCAL_WORLD_SIZE=1 here; under
 * torchrun, srun or mpirun it is not set at all). */
START_TEST(test_default_threads) {
  cpu_set_t set;
  ck_assert_int_eq(sched_getaffinity(0, sizeof set, &set), 0);
  const int want = CPU_COUNT(&set) / 2 > 0 ? CPU_COUNT(&set) / 2 : 1;
  char script[1200];
  snprintf(script, sizeof script,
           "GW_LOCAL_WORLD_SIZE=1 exec '%s' --data synthetic --synthetic-samples 32 --model resnet18 "
           "--width-divisor 8 --in-channels 3 --image-size 16 --classes 4 --stem small --batch 8 --steps 1 --no-eval "
           "--backend cpu",
           train_bin());
  const char *const noenv[] = {NULL}, *args[] = {"-n", "2", "sh", "-c", script, NULL};
  struct run r;
  gwrun_start(&r, noenv, args);
  gwrun_wait(&r, 120);
  expect_ok(&r);
  char said[64];
  snprintf(said, sizeof said, ", %d thread%s per rank", want, want > 1 ? "s" : "");
  ck_assert_msg(strstr(r.out, said), "2 ranks on %d cores: expected '%s':\n%s", CPU_COUNT(&set), said, r.out);
  gwrun_free(&r);
  /* Ranks a launcher bound to cores of their own keep them (GW_TRAIN_TEST_CPUS
   * stands for the affinity): 4 each, not 4 over 2 ranks; ranks whose cores
   * overlap share them. */
  const char *const cases[][3] = {{"0-3", "4-7", "4 threads per rank"}, {"0-3", "2-5", "2 threads per rank"}};
  for (int c = 0; c < 2; c++) {
    snprintf(script, sizeof script,
             "c='%s'; [ \"$GW_RANK\" = 1 ] && c='%s'; GW_TRAIN_TEST_CPUS=$c exec '%s' --data synthetic "
             "--synthetic-samples 32 --model resnet18 --width-divisor 8 --in-channels 3 --image-size 16 --classes 4 "
             "--stem small --batch 8 --steps 1 --no-eval --backend cpu",
             cases[c][0], cases[c][1], train_bin());
    gwrun_start(&r, noenv, args);
    gwrun_wait(&r, 120);
    expect_ok(&r);
    ck_assert_msg(strstr(r.out, cases[c][2]), "cores %s and %s: expected '%s':\n%s", cases[c][0], cases[c][1],
                  cases[c][2], r.out);
    gwrun_free(&r);
  }
  /* --threads on one rank only: the other still finds its default (the
   * comparison of cores runs on every rank; it ran only where --threads was
   * left out, a collective mismatch against the other's next call) */
  snprintf(script, sizeof script,
           "t=''; [ \"$GW_RANK\" = 1 ] && t='--threads 1'; GW_TRAIN_TEST_CPUS=0-3 exec '%s' $t --data synthetic "
           "--synthetic-samples 32 --model resnet18 --width-divisor 8 --in-channels 3 --image-size 16 --classes 4 "
           "--stem small --batch 8 --steps 1 --no-eval --backend cpu",
           train_bin());
  gwrun_start(&r, noenv, args);
  gwrun_wait(&r, 120);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "2 threads per rank"), "--threads on rank 1 only: expected rank 0's 2 threads:\n%s",
                r.out);
  gwrun_free(&r);
}
END_TEST

void add_schedule_tests(TCase *tc) {
  tcase_add_test(tc, test_lr_schedule);
  tcase_add_test(tc, test_long_warmup_and_skipped_loss);
  tcase_add_test(tc, test_lr_milestones);
  tcase_add_test(tc, test_longer_resume_said);
  tcase_add_test(tc, test_epochs_resume_said);
  tcase_add_test(tc, test_unevaluated_steps_said);
  tcase_add_test(tc, test_eval_scores);
  tcase_add_test(tc, test_test_only);
  tcase_add_test(tc, test_run_summary);
  tcase_add_test(tc, test_metrics_fifo);
  tcase_add_test(tc, test_eval_over_ranks);
  tcase_add_test(tc, test_default_threads);
}
