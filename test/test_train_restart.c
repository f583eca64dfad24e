/* test_train_restart.c - gw-run --max-restarts with gw-train --resume, and
 * gw-train's signals (SIGTERM: checkpoint and stop; SIGUSR1: checkpoint): a job
 * whose ranks all fail after step 3 (GW_TRAIN_STOP_AT_STEP, on the first
 * attempt only: GW_RESTART_COUNT 0) is started again by gw-run, resumes from
 * the checkpoint of step 2 and ends with the weights of an uninterrupted run,
 * bit for bit; with no restarts left, the job's failure stands. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "gwrun_helpers.h"
#include "test_train.h"

/* The ranks' shell: the first attempt stops after step 3 (exit 75). */
static const char stop_first[] =
    "if [ \"$GW_RESTART_COUNT\" = 0 ]; then export GW_TRAIN_STOP_AT_STEP=3; fi; "
    "echo \"attempt $GW_RESTART_COUNT of $GW_MAX_RESTARTS\"; exec \"$0\" \"$@\"";

/* gw-run -n 2 --max-restarts restarts sh -c stop_first gw-train COMMON extra... */
static void train_restarting(struct run *r, const char *restarts, const char *const *extra) {
  const char *args[80] = {"-n", "2", "--max-restarts", restarts, "sh", "-c", stop_first, train_bin(), COMMON};
  int n = 0;
  while (args[n]) n++;
  for (int i = 0; extra[i]; i++) args[n++] = extra[i];
  args[n] = NULL;
  gwrun_start(r, (const char *const[]){NULL}, args);
  gwrun_wait(r, 120);
  ck_assert_msg(!r->timed_out, "did not finish in 120 s\nstdout:\n%s\nstderr:\n%s", r->out, r->err);
}

START_TEST(test_restart_resumes) {
  char full_w[512], part_w[512], full_d[512], part_d[512];
  path(full_w, sizeof full_w, "restart-full.safetensors"), path(full_d, sizeof full_d, "restart-ckpt-full");
  path(part_w, sizeof part_w, "restart-part.safetensors"), path(part_d, sizeof part_d, "restart-ckpt-part");
  const char *common[] = {"--steps", "7", "--batch", "8", "--checkpoint-every", "2", "--resume",
                          "--save-weights", full_w, "--checkpoint-dir", full_d, NULL};
  struct run r;
  train(&r, (const char *const[]){NULL}, "2", common);
  expect_ok(&r);
  gwrun_free(&r);

  common[8] = part_w, common[10] = part_d;
  train_restarting(&r, "2", common);
  ck_assert_msg(r.code == 0, "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
  ck_assert_msg(strstr(r.out, "attempt 0 of 2") && strstr(r.out, "stopping after step 3") &&
                    strstr(r.err, "restarting the job (exit code 75): restart 1 of 2, 2 ranks") &&
                    strstr(r.out, "attempt 1 of 2") && !strstr(r.out, "attempt 2 of 2"),
                "expected one failed attempt and one restart:\nstdout:\n%s\nstderr:\n%s", r.out, r.err);
  ck_assert_msg(strstr(r.out, "resumed from") && strstr(r.out, "ckpt-2.safetensors at step 2"),
                "the restart did not resume from step 2:\n%s", r.out);
  gwrun_free(&r);
  ck_assert_msg(same_file(full_w, part_w), "the restarted job's final weights differ from the uninterrupted run's");
}
END_TEST

/* Without restarts left the first failure is the job's: exit 75, nothing
 * started again. */
START_TEST(test_restart_none_left) {
  char d[512];
  path(d, sizeof d, "restart-none");
  struct run r;
  train_restarting(&r, "0", (const char *const[]){"--steps", "5", "--batch", "8", "--checkpoint-dir", d, NULL});
  ck_assert_msg(r.code == 75 && strstr(r.out, "stopping after step 3") && !strstr(r.out, "attempt 1") &&
                    !strstr(r.err, "gw-run: restarting"),
                "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* SIGTERM (a scheduler's preemption) reaching one rank stops every rank at
 * the same step with a checkpoint, exit 75; --resume then ends with the
 * weights of an uninterrupted run, bit for bit.  It killed the ranks (the
 * default action), losing everything since the last checkpoint.  Rank 1
 * raises it after step 3 (GW_TRAIN_TEST_SIGNAL): heard in step 4's sums. */
START_TEST(test_sigterm_checkpoints_and_stops) {
  char full_w[512], part_w[512], full_d[512], part_d[512];
  path(full_w, sizeof full_w, "sigterm-full.safetensors"), path(full_d, sizeof full_d, "sigterm-ckpt-full");
  path(part_w, sizeof part_w, "sigterm-part.safetensors"), path(part_d, sizeof part_d, "sigterm-ckpt-part");
  const char *common[] = {"--steps", "7", "--batch", "8", "--resume", "--save-weights", full_w,
                          "--checkpoint-dir", full_d, NULL};
  struct run r;
  train(&r, (const char *const[]){NULL}, "2", common);
  expect_ok(&r);
  gwrun_free(&r);

  common[6] = part_w, common[8] = part_d;
  /* twice at once, as Slurm's SIGTERM to every process of the step reaches
   * a rank directly and through gw-run: one request, not a kill */
  train(&r, (const char *const[]){"GW_TRAIN_TEST_SIGNAL=1:3:TERM2", NULL}, "2", common);
  ck_assert_msg(r.code == 75 && strstr(r.out, "SIGTERM reached 1 rank: checkpoint saved at step 4; stopping"),
                "exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
  char ck[600];
  snprintf(ck, sizeof ck, "%s/ckpt-4.safetensors", part_d);
  ck_assert_msg(exists(ck) && !exists(part_w), "no checkpoint of step 4, or final weights of a stopped run");
  train(&r, (const char *const[]){NULL}, "2", common);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "ckpt-4.safetensors at step 4"), "did not resume from step 4:\n%s", r.out);
  gwrun_free(&r);
  ck_assert_msg(same_file(full_w, part_w), "the stopped and resumed job's final weights differ from the uninterrupted run's");
  /* Without --checkpoint-dir: nothing saved, and said so; not exit 75 (it
   * said "--resume continues from there" with nothing to resume) but 143, as
   * the signal's default action. */
  train(&r, (const char *const[]){"GW_TRAIN_TEST_SIGNAL=1:2:TERM", NULL}, "2",
        (const char *const[]){"--steps", "5", "--batch", "8", NULL});
  ck_assert_msg(r.code == 143 && strstr(r.out, "no --checkpoint-dir: nothing saved at step 3; stopping (a rerun starts "
                                        "over") && !strstr(r.out, "--resume continues"),
                "SIGTERM without --checkpoint-dir: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* SIGUSR1 (gw-run passes it on; `sbatch --signal=USR1@90`) to rank 0 after
 * step 2: a checkpoint of step 3 on every rank's agreement, the job going on
 * to its end.  It killed the ranks. */
START_TEST(test_sigusr1_checkpoints_and_goes_on) {
  char d[512], ck[600];
  path(d, sizeof d, "sigusr1-ckpt");
  struct run r;
  train(&r, (const char *const[]){"GW_TRAIN_TEST_SIGNAL=0:2:USR1", NULL}, "2",
        (const char *const[]){"--steps", "5", "--batch", "8", "--checkpoint-dir", d, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "SIGUSR1/SIGUSR2 reached 1 rank: checkpoint saved at step 3; training goes on"),
                "stdout:\n%s", r.out);
  gwrun_free(&r);
  snprintf(ck, sizeof ck, "%s/ckpt-3.safetensors", d);
  ck_assert_msg(exists(ck), "no checkpoint of step 3");
  snprintf(ck, sizeof ck, "%s/ckpt-5.safetensors", d);
  ck_assert_msg(exists(ck), "no checkpoint of step 5 (the run's end)");
  /* The signal's save failing (warn-only: training goes on) on the last
   * step: said as not saved, and the end-of-run save is still tried, which
   * fails the run (it said "checkpoint saved" and exited 0 with nothing). */
  path(d, sizeof d, "sigusr1-ckpt-fail");
  train(&r, (const char *const[]){"GW_TRAIN_TEST_SIGNAL=0:4:USR1", "GW_SAFETENSORS_FAIL=write", NULL}, "2",
        (const char *const[]){"--steps", "5", "--batch", "8", "--checkpoint-dir", d, NULL});
  ck_assert_msg(r.code != 0 && strstr(r.out, "the checkpoint could not be saved (above) at step 5") &&
                    strstr(r.out, "warning: checkpoint of step 5: ") && strstr(r.out, "training goes on; the next") &&
                    !strstr(r.out, "checkpoint saved"),
                "a failed save of the signal's checkpoint on the last step: exit %d\n%s\n%s", r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

/* SIGUSR1 before the first step (rank 1, at the end of the setup: a
 * dataset's scan, the rendezvous, a resume's load) asks for a checkpoint at
 * the first step, and during --test-only is heard and let be.  Its default
 * action killed the job (or cost a restart). */
START_TEST(test_sigusr1_during_setup) {
  char d[512], ck[600], w[512];
  path(d, sizeof d, "sigusr1-setup-ckpt");
  struct run r;
  train(&r, (const char *const[]){"GW_TRAIN_TEST_SIGNAL=1:-1:USR1", NULL}, "2",
        (const char *const[]){"--steps", "3", "--batch", "8", "--checkpoint-dir", d, NULL});
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "SIGUSR1/SIGUSR2 reached 1 rank: checkpoint saved at step 1; training goes on"),
                "stdout:\n%s", r.out);
  gwrun_free(&r);
  snprintf(ck, sizeof ck, "%s/ckpt-1.safetensors", d);
  ck_assert_msg(exists(ck), "no checkpoint of step 1");
  path(w, sizeof w, "sigusr1-setup-w.safetensors");
  train(&r, (const char *const[]){NULL}, "1", (const char *const[]){"--steps", "0", "--save-weights", w, NULL});
  expect_ok(&r);
  gwrun_free(&r);
  train_from(&r, (const char *const[]){"GW_TRAIN_TEST_SIGNAL=0:-1:USR1", NULL}, "2",
             (const char *const[]){EVAL_COMMON, NULL},
             (const char *const[]){"--test-only", "--load-weights", w, "--batch", "8", NULL});
  ck_assert_msg(r.code == 0 && strstr(r.out, "evaluation: top-1"), "--test-only with SIGUSR1: exit %d\n%s\n%s",
                r.code, r.out, r.err);
  gwrun_free(&r);
}
END_TEST

void add_restart_tests(TCase *tc) {
  tcase_add_test(tc, test_sigusr1_during_setup);
  tcase_add_test(tc, test_restart_resumes);
  tcase_add_test(tc, test_restart_none_left);
  tcase_add_test(tc, test_sigterm_checkpoints_and_stops);
  tcase_add_test(tc, test_sigusr1_checkpoints_and_goes_on);
}
