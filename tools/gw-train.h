/* gw-train.h - the pieces of gw-train shared by its files:
 *   gw-train.c        options and main()
 *   gw-train-setup.c  setup: the communicator, options and data agreed across ranks, model, loaders
 *   gw-train-loop.c   the training loop with bucketed allreduce, checkpoint saves, evaluation
 *   gw-train-resume.c the learning-rate schedule, --resume's state shared from rank 0
 *   gw-train-job.h    the trainer those three share
 *   gw-train-ckpt.c   checkpoint files (atomic, checksummed, last K kept) written and read
 *   gw-train-signals.c SIGUSR1/2 and SIGTERM: a checkpoint, a stop
 *   gw-train-log.c    metrics JSON lines, the progress line, the gnuplot plot
 */
#ifndef GW_TRAIN_H
#define GW_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gradwire.h"
#include "outpath.h"
#include "resnet.h"

enum gw_schedule { GW_SCHED_COSINE = 0, GW_SCHED_STEP = 1 };
enum { GW_MAX_MILESTONES = 16 };

struct train_opts {
  struct gw_model_config model;
  const char *model_name;
  int classes_given, in_channels_given, image_size_given, stem_given;
  const char *image_size_flag; /* how the image size was given: --image-size or --train-crop-size (messages) */
  const char *data;         /* fashion-mnist[:DIR] | imagenet:DIR | synthetic */
  long epochs, steps;       /* exactly one is set (> 0), or steps == 0 */
  int batch;                /* per rank */
  double lr;                /* base LR for a global batch of 256 */
  double momentum, wd, label_smoothing, warmup_epochs;
  int nesterov;
  int wd_all; /* --wd-all: decay BN parameters and biases too */
  enum gw_schedule schedule;
  int schedule_given;
  /* --lr-milestones: epochs from the start at which the step schedule
   * multiplies the rate by --lr-gamma (none: at 1/3 and 2/3 of the steps
   * after the warmup) */
  double milestones[GW_MAX_MILESTONES];
  int n_milestones;
  double lr_gamma;          /* the step schedule's factor (default 0.1) */
  int lr_gamma_given;
  double warmup_start;      /* --warmup-start-factor F: warmup from F x peak; 0: from peak / warmup steps */
  int sync_bn, no_overlap, augment, drop_last;
  int val_crop;   /* --val-crop-size: imagenet's evaluation center crop, the evaluation's image size (0: image size) */
  int val_resize; /* --val-resize-size: imagenet's evaluation resize (0: the evaluation's crop * 256 / 224) */
  int host_step;            /* --host-step: a device backend's master weights and optimizer on the host */
  double bucket_mb, first_bucket_mb;
  int grad_wire; /* gw_dtype_t the gradients travel as (--grad-wire) */
  const char *checkpoint_dir;
  long checkpoint_every;    /* steps; 0: only at epoch ends */
  int keep_checkpoints, keep_given;
  int resume;
  const char *metrics, *plot;
  int threads, loader_threads;
  const char *backend;      /* "cpu" (oneDNN) or "cudnn" (--backend) */
  int tf32;                 /* cudnn: TF32 tensor cores for fp32 convolutions and fc (--tf32) */
  int tf32_given;
  int amp;                  /* activations' gw_dtype_t: GW_FLOAT32, GW_BFLOAT16 or GW_FLOAT16 (--amp) */
  int layout;               /* GW_LAYOUT_NCHW or GW_LAYOUT_NHWC (--layout); -1: the backend's default */
  int loss_scale_dynamic;   /* --loss-scale dynamic: halve on overflow, double after 2000 good steps */
  double loss_scale;        /* --loss-scale N, or dynamic's start: 0 = no scaling */
  double loss_scale_init;   /* --loss-scale-init (0: not given) */
  int loss_scale_given;     /* --loss-scale was on the command line */
  long log_every;           /* steps between plain log lines */
  int eval;                 /* evaluate at each epoch end */
  int test_only;            /* --test-only: evaluate --load-weights once, train nothing */
  const char *save_weights, *load_weights;
  int64_t synthetic_samples;
  int synthetic_given;
  int data_given;           /* --data was on the command line (--steps 0 then takes its shape) */
};

/* gw-train.c: the options every rank must share (they decide the sequence of
 * collectives or the arithmetic; paths, threads and logging left out), as
 * "key=value" words; returns the length (as snprintf). */
size_t train_opts_describe(const struct train_opts *o, char *buf, size_t len);
/* (compared by opt_words_diff, optwords.h) */

/* gw-train-setup.c: the data options the flags give (the synthetic set's
 * shape, the image size), and the model's configuration for dataset ds: its
 * shape and classes, which the flags given must agree with (-1 and why in d
 * when they do not). */
struct gw_data_options;
struct gw_dataset;
void train_data_options(const struct train_opts *o, struct gw_data_options *d);
int data_model_config(const struct train_opts *o, const struct gw_dataset *ds, struct gw_model_config *cfg,
                      char *d, size_t dlen);

/* Everything the loop needs, made once. */
struct trainer;

/* gw-train-signals.c: SIGUSR1 and SIGUSR2 from now on ask for a checkpoint;
 * SIGTERM, while on, for a checkpoint and the end; what came since the last
 * take (each 0 or 1), cleared. */
void trainer_catch_requests(void);
void trainer_catch_stop(int on);
void trainer_signals_take(int *ckpt, int *stop);
/* gw-train-loop.c: runs the whole job; returns the process exit code. */
int gw_train_run(const struct train_opts *o);

/* ---- checkpoints (gw-train-ckpt.c) */
struct ckpt_state {
  int64_t step;       /* optimizer steps taken */
  int64_t epoch, position; /* the loader's state: where the data continues */
  int64_t sgd_steps;
  double loss_sum;    /* of the current epoch so far, for the epoch's mean */
  int64_t loss_count;
  /* The loss scaler: the scale now (0: none), steps since it last changed, steps
   * skipped for overflow.  A checkpoint from before they were saved has none
   * (has_scaler 0 after loading it): the run then keeps its initial scale. */
  double loss_scale;
  int64_t good_steps, overflows;
  int has_scaler;
  /* An epoch saved at its end whose evaluation has not finished (0: none), and
   * its mean training loss: a resume evaluates it first (a job killed during
   * the evaluation used to skip it, and the last epoch's result was lost). */
  int64_t eval_epoch;
  double eval_train_loss;
  /* train_opts_describe of the run that saved it (metadata; "" from an older
   * gw-train): a resume notes what changed. */
  char options[1536];
};
struct gw_model;
struct gw_sgd;
/* Rank 0 only: writes DIR/ckpt-<step>.safetensors atomically with a checksum and
 * removes all but the newest keep.  config describes the run (checked on resume). */
int ckpt_save(const char *dir, int keep, struct gw_model *m, struct gw_sgd *sgd, const struct ckpt_state *st,
              const char *config, char *err, size_t errlen);
/* Whether params (momentum, when not NULL: the same layout) or running (the
 * BN statistics) hold an inf or a NaN: 1 with the first named in where
 * ("layer1.0.bn1.running_var[3] = nan"), else 0.  ckpt_save refuses such a
 * checkpoint, and --save-weights such a file. */
int ckpt_nonfinite(const struct gw_model *m, const float *params, const float *momentum, const float *running,
                   char *where, size_t len);
/* --load-weights: a weights file (torchvision's names, as --save-weights
 * writes), or a checkpoint of gw-train (ckpt-N.safetensors) of this model
 * (model_name, and the classes, input channels, stem and width of m: any
 * image size, data, world or batch): its weights, BN statistics and
 * counters, its checksum checked.  Then every value must be finite (training
 * from an inf failed at the first step blaming the learning rate; a run
 * without training saved it again).  0, or -1 with err naming the file and
 * what is wrong. */
int load_weights(struct gw_model *m, const char *path, const char *model_name, char *err, size_t len);

/* Rank 0, before training: dir exists (made if missing; its parent must
 * exist) and is writable, and holds no checkpoint unless resuming: a new run
 * would overwrite another's files and prune them.  0, or -1 with err. */
int ckpt_prepare_dir(const char *dir, int resume, char *err, size_t errlen);
/* Rank 0, before --save-weights writes file: removes file's temporary files
 * that saves which died left (as ckpt_prepare_dir does in the checkpoint
 * folder); a live writer's stay. */
void weights_remove_stale_temps(const char *file);
/* Loads the newest valid checkpoint of dir written by a run described as
 * config (or legacy_config: as older gw-trains described it; may be NULL),
 * whose data has steps_per_epoch batches of batch samples (each rank's); a
 * corrupt or other run's newer one is reported in err_note (and skipped).
 * Returns 0 on success, 1 when dir holds none, -1 on an error (err says which
 * file and why). */
int ckpt_load_latest(const char *dir, struct gw_model *m, struct gw_sgd *sgd, struct ckpt_state *st,
                     const char *config, const char *legacy_config, int64_t steps_per_epoch, int64_t batch,
                     char *path_out, size_t pathlen, char *err_note, size_t notelen, char *err, size_t errlen);

/* ---- output (gw-train-log.c) */
struct train_log {
  FILE *metrics;      /* NULL: none, or no more (a write failed: said once) */
  const char *metrics_path;
  long long metrics_end; /* the metrics file's size after its last whole line (-1: not a regular file) */
  int64_t metrics_step;  /* the step of the last training line written (-1: none) */
  int tty;            /* rank 0's stdout is a terminal: one live progress line */
  int rank;
  double start;
  int line_open;      /* a progress line without its newline is on screen */
  int64_t start_step; /* the step this process started from (the ETA's pace) */
};
struct step_report {
  int64_t step, steps_total, epoch, epochs;
  int64_t step_in_epoch, steps_per_epoch;
  double loss, lr, img_per_s;
  double step_s; /* the step's wall time, with the wait for its batch (img_per_s's) */
  double compute_ms, comm_ms, exposed_ms, data_ms;
  int64_t skipped;           /* unreadable training samples replaced so far, every rank's */
  double loss_scale;         /* 0: no loss scaling */
  int64_t overflows;         /* steps skipped so far because the scaled gradients overflowed */
  /* How many ranks a SIGUSR1/SIGUSR2 (checkpoint now) or a SIGTERM (checkpoint
   * and stop) reached before this step's sums: every rank holds the same. */
  int sig_ckpt, sig_stop;
};
int log_open(struct train_log *l, const char *metrics_path, int rank, char *err, size_t errlen);
/* A resume from step `step`: a {"type":"resume"} line in the metrics; the lines
 * after it supersede earlier ones of the same step (those steps run again). */
void log_resumed(struct train_log *l, int64_t step);
/* A {"type":TYPE} line in the metrics.  "start": a run from the beginning,
 * the lines before it (the file is appended to) are another run's;
 * "test_only": an evaluation alone follows (its line of epoch 0), no run's
 * start. */
void log_marker(struct train_log *l, const char *type);
/* Before training (rank 0): output_path_ok (outpath.h) for the PNG, and
 * gnuplot runs.  0, or -1 with err naming the flag and path. */
int plot_check(const char *png, char *err, size_t errlen);
/* Before writing (rank 0; --steps 0 too): --save-weights's path (outpath.h's
 * replaced_path_ok), and an existing file there is weights gw-train wrote,
 * load's (the run's --load-weights, or NULL) or empty.  0, or -1 with err. */
int weights_output_ok(const char *path, const char *load, char *err, size_t errlen);
void log_close(struct train_log *l);
void log_step(struct train_log *l, const struct step_report *r, int print);
/* An epoch's evaluation, at the step its training ended (a resume may
 * evaluate an epoch again: the metrics line then follows a resume line of
 * that step, and supersedes the earlier one as every line after it does). */
void log_eval(struct train_log *l, int64_t epoch, int64_t step, double top1, double top5, double loss,
              double nll, int64_t samples);
void log_text(struct train_log *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The end of a run: `steps` run by this process, the throughput over the
 * `timed` after its first (their `seconds`, batch wait included): a line, and
 * {"type":"summary"} in the metrics. */
void log_summary(struct train_log *l, int64_t steps, int64_t timed, double seconds, double img_per_s);
/* Evaluation sums (gw-train-eval.c): top-1 and top-5 hits, the training's
 * loss (label-smoothed as it), samples, plain cross-entropy. */
struct eval_counts {
  double top1, top5, loss, n, nll; /* summed over the ranks, in this order */
  double left_out;                 /* this rank's places whose sample was unreadable (not the padding's) */
};
struct gw_batch;
/* Scores batch bt's logits [bt->n, k] of this rank (of world) over a split of
 * n samples: each sample once (not the sampler's padding, not a stand-in for
 * an unreadable one). */
void eval_score_batch(const float *logits, int k, const struct gw_batch *bt, int rank, int world, int64_t n,
                      double label_smoothing, struct eval_counts *c);

/* A line from any rank, on its stderr, "gw-train: rank R: ...". */
void log_rank(struct train_log *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends (epoch, mean train loss, top1, top5) to the plot data and redraws the
 * PNG with gnuplot when it exists; returns 0, or -1 with a reason in err. */
int plot_epoch(const char *png, int64_t epoch, double train_loss, double top1, double top5, char *err,
               size_t errlen);

#endif
