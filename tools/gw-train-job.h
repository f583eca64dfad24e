/* gw-train-job.h - what gw-train-setup.c, gw-train-loop.c and
 * gw-train-resume.c share: the trainer, and the helpers they use. */
#ifndef GW_TRAIN_JOB_H
#define GW_TRAIN_JOB_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "dataset.h"
#include "exec.h"
#include "gw-train.h"
#include "loader.h"
#include "sampler.h"
#include "sgd.h"
#include "sgd_math.h"

struct trainer {
  const struct train_opts *o;
  int64_t saved_step; /* the step of the last checkpoint written or resumed */
  int64_t skips_told, skips_told_at; /* unreadable training samples logged, and when */
  int64_t skipped_all, skipped_epoch; /* every rank's so far (the last step's sums), at the last epoch's end */
  /* A device backend's first step in this process: its allreduces start after
   * backward is queued and are waited for before the optimizer (see
   * overlapping()). */
  int warming;
  /* Whether rank 0 loads --load-weights (same_options_everywhere): its
   * weights are the ones broadcast. */
  int rank0_loads;
  /* The steps this process ran and the seconds of those after its first (the
   * run's throughput: evaluations and checkpoints left out, and the first
   * step's start-up, cuDNN's engine timing or oneDNN's first primitives). */
  int64_t steps_run;
  double timed_s;
  gw_comm_t comm; /* NULL when alone */
  int rank, world;
  int threads; /* the backend's compute threads (--threads, or the CPUs it may use over the ranks here sharing them) */
  struct gw_dataset *train_ds, *val_ds;
  struct gw_sampler train_s, val_s;
  struct gw_loader *train_ld, *val_ld;
  struct gw_model *m;
  const struct gw_backend_ops *ops; /* --backend */
  struct gw_backend *b;
  struct gw_exec *e;
  /* --val-crop-size other than the training's image size: the model at the
   * evaluation's size (the same tensors: a ResNet's do not depend on it) and
   * its executor, given the trained values before each evaluation; else NULL */
  struct gw_model *m_eval;
  struct gw_exec *e_eval;
  struct gw_sgd *sgd;
  gw_bucketer_t bk;
  int resident;  /* device backend: weights, gradients, momentum stay in its memory (see the top) */
  float *mom_dev; /* resident: the momentum buffer there (NULL without momentum) */
  void *grads_reg; /* gw_comm_register of the gradients (over ib: sent from directly) */
  size_t np, nrun, ncounters;
  size_t marked;            /* gradient elements handed to the bucketer this step */
  size_t downloaded;        /* device backends: gradient elements copied to the host this step */
  size_t bounds[4096];      /* the buckets' bounds (nb + 1), where the device path copies gradients down */
  int nb;
  gw_result_t ready_err;
  char ready_msg[512];      /* device backends: a failed download during backward */
  int64_t spe, total_steps, warmup_steps; /* steps per epoch, in all, of warmup */
  int64_t epochs;
  double peak_lr;
  struct ckpt_state st;
  /* Rank 0, resumed with an evaluation pending: the state as the checkpoint
   * had it (before this run's loss-scale rule and options replaced them), so
   * the re-save that marks the evaluation done changes nothing else. */
  struct ckpt_state *as_loaded;
  struct train_log log;
  char config[512];         /* the run as checkpoints name it (gw-train-setup.c) */
  char config_legacy[4608]; /* as they named it before: --data's text (up to PATH_MAX), not its samples */
  float *pad_x, *logits;
  int32_t *pad_y;
};

/* Prints the message once (rank-prefixed when there are several) and returns
 * -1; records it for gw-run (gw_record_failure) as this rank's own failure,
 * or with train_fail_of_others as one it stops for because another rank
 * failed (which that rank says). */
int train_fail(const struct trainer *t, const char *what, const char *detail);
int train_fail_of_others(const struct trainer *t, const char *what, const char *detail);
int train_comm_fail(const struct trainer *t, const char *what, gw_result_t r);
/* Rank 0's buffer to every rank / a sum of doubles over the ranks; no-ops when
 * alone; 0, or -1 having said why. */
int train_bcast(struct trainer *t, void *buf, size_t count, gw_dtype_t dtype, const char *what);
int train_allreduce_d(struct trainer *t, double *buf, size_t n, const char *what);

/* gw-train-setup.c: everything before the first step; 0 or -1 (said). */
int trainer_setup(struct trainer *t);
/* gw-train-resume.c: the learning rate of a step (0-based) by the run's
 * schedule, and --resume (rank 0 reads, everyone gets its state). */
double trainer_lr_at(const struct trainer *t, int64_t step);
int trainer_resume(struct trainer *t);
/* gw-train-loop.c: the device copies made current from the host's. */
int trainer_backend_from_host(struct trainer *t);

#endif
