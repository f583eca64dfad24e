/* gw-train-loop.c - the data-parallel training job of gw-train.
 *
 * Per step: take the next batch (prefetched by loader threads), forward, loss and
 * backward; as backward finishes each layer's gradients the executor reports the
 * final prefix of the gradient buffer and the bucketer starts the allreduce (AVG)
 * of every bucket that became complete, on the communicator's progress thread,
 * while backward goes on; then wait for the buckets, SGD step.  The step's
 * compute time, communication time (first bucket start to last done) and exposed
 * communication (backward end to last done) are logged.
 *
 * With a device backend (cudnn) the weights, their gradients and the momentum
 * live on the device ("resident"): the buckets are allreduced in device memory
 * on a communication stream ordered after backward's kernels by an event per
 * bucket (the bucketer's compute stream, as DDP), the loss scaler's check and
 * the optimizer run there, and nothing crosses PCIe per step but the loss and
 * the overflow verdict.  The host copies are brought up to date only for
 * checkpoints, evaluation and the final weights.  --host-step keeps the older
 * arrangement (master weights on the host) for comparison.
 *
 * Every rank starts from rank 0's weights (broadcast), so the replicas stay
 * identical; BN running statistics are rank 0's before each evaluation and in
 * checkpoints, as PyTorch DDP's broadcast_buffers.
 */
#include "gw_config.h"

#if GW_HAVE_ONEDNN || GW_HAVE_CUDNN

#include "gw-train-job.h"

#include <signal.h>
#include <stdatomic.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the host copies of a resident run */

/* Brings the host model (weights, BN statistics) and the momentum up to date
 * from the backend, where a resident run keeps them. */
static int host_from_backend(struct trainer *t, const char *what) {
  if (!t->resident) return 0;
  if (gw_exec_download_model(t->e) != GW_SUCCESS) return train_fail(t, what, gw_model_last_error());
  if (t->mom_dev && t->ops->download(t->b, gw_sgd_momentum(t->sgd), t->mom_dev, t->np * sizeof(float)) != GW_SUCCESS)
    return train_fail(t, what, gw_model_last_error());
  return 0;
}

/* The other way: after the broadcast of the initial weights or a resume. */
int trainer_backend_from_host(struct trainer *t) {
  if (!t->resident) return 0;
  if (gw_exec_upload_model(t->e) != GW_SUCCESS) return train_fail(t, "setup", gw_model_last_error());
  if (t->mom_dev && t->ops->upload(t->b, t->mom_dev, gw_sgd_momentum(t->sgd), t->np * sizeof(float)) != GW_SUCCESS)
    return train_fail(t, "setup", gw_model_last_error());
  return 0;
}

/* ---- checkpoints: rank 0 writes (gw-train-resume.c reads them back) */

/* warn (the saves that only clear an evaluation's pending mark, a signal's
 * that does not stop): a failed write is said with `warn` after it and the
 * run goes on (the file it would have replaced stays as it was, unless it
 * failed after the rename); NULL: a failed write ends the run. */
static const char *const PENDING_WARN = "the checkpoint of this step may still say the evaluation is pending: a "
                                        "resume from it would evaluate the epoch again";
static const char *const SIGNAL_WARN = "training goes on; the next checkpoint is tried as planned";
static int save_state_as(struct trainer *t, const struct ckpt_state *st, const char *warn) {
  char err[600];
  /* saved_step moves only once the file is there (rank 0's; the others save
   * nothing): a failed warn-only save of a signal's checkpoint said "saved"
   * and, on the last step, skipped the end-of-run save, the run exiting 0
   * without its last state. */
  if (!t->o->checkpoint_dir || t->rank != 0) return t->saved_step = t->st.step, 0;
  if (host_from_backend(t, "checkpoint") != 0) return -1;
  if (!ckpt_save(t->o->checkpoint_dir, t->o->keep_checkpoints, t->m, t->sgd, st, t->config, err, sizeof err))
    return t->saved_step = t->st.step, 0;
  if (!warn) return train_fail(t, "checkpoint", err);
  log_text(&t->log, "warning: checkpoint of step %lld: %s (%s)", (long long)t->st.step, err, warn);
  return 0;
}

static int save_checkpoint_as(struct trainer *t, const char *warn) { return save_state_as(t, &t->st, warn); }
static int save_checkpoint(struct trainer *t) { return save_checkpoint_as(t, NULL); }

/* ---- evaluation: every validation sample exactly once across ranks */

static int eval_batch(struct trainer *t, const struct gw_batch *bt, struct eval_counts *c) {
  const int B = t->o->batch, k = gw_dataset_classes(t->val_ds);
  size_t sample = gw_dataset_sample_floats(t->val_ds);
  const float *x = bt->x;
  if (bt->n < B) { /* the last, short batch: pad with its own last sample */
    memcpy(t->pad_x, bt->x, (size_t)bt->n * sample * sizeof(float));
    for (int i = bt->n; i < B; i++) memcpy(t->pad_x + (size_t)i * sample, bt->x + (size_t)(bt->n - 1) * sample,
                                           sample * sizeof(float));
    x = t->pad_x;
  }
  struct gw_exec *e = t->e_eval ? t->e_eval : t->e;
  if (gw_exec_forward(e, x, 0) != GW_SUCCESS || gw_exec_logits(e, t->logits) != GW_SUCCESS)
    return train_fail(t, "evaluation", gw_model_last_error());
  eval_score_batch(t->logits, k, bt, t->rank, t->world, gw_dataset_size(t->val_ds), t->o->label_smoothing, c);
  return 0;
}

static int evaluate(struct trainer *t, int64_t epoch, double train_loss) {
  if (!t->val_ld) return 0;
  if (host_from_backend(t, "evaluation") != 0) return -1;
  if (train_bcast(t, gw_model_running(t->m), t->nrun, GW_FLOAT32, "sharing rank 0's BN statistics") != 0) return -1;
  if (gw_loader_seek(t->val_ld, 0, 0) != GW_SUCCESS) return train_fail(t, "evaluation", gw_data_last_error());
  if (t->e_eval) { /* --val-crop-size: the model at the evaluation's size takes the trained values */
    memcpy(gw_model_params(t->m_eval), gw_model_params(t->m), t->np * sizeof(float));
    memcpy(gw_model_running(t->m_eval), gw_model_running(t->m), t->nrun * sizeof(float));
  }
  /* every rank's statistics are rank 0's from here on, on a device too (and
   * in the evaluation's executor, if any) */
  if (gw_exec_upload_model(t->e) != GW_SUCCESS || (t->e_eval && gw_exec_upload_model(t->e_eval) != GW_SUCCESS))
    return train_fail(t, "evaluation", gw_model_last_error());
  struct eval_counts c = {0};
  const struct gw_batch *bt;
  for (;;) {
    if (gw_loader_next(t->val_ld, &bt) != GW_SUCCESS) return train_fail(t, "evaluation data", gw_data_last_error());
    if (!bt) break;
    if (eval_batch(t, bt, &c) != 0) return -1;
  }
  const int64_t left_out = (int64_t)c.left_out; /* not the padding's repeats of them */
  if (left_out > 0)
    log_rank(&t->log, "warning: the evaluation left out %lld unreadable sample%s of this rank's share; the last "
             "unreadable file this rank met: %s",
             (long long)left_out, left_out > 1 ? "s" : "", gw_loader_last_skip(t->val_ld));
  if (train_allreduce_d(t, &c.top1, 5, "summing the evaluation") != 0) return -1;
  if (c.n == 0) { /* every sample unreadable: no figures (0 / 0) */
    char why[160];
    snprintf(why, sizeof why, "none of the %lld samples of %s is readable", (long long)gw_dataset_size(t->val_ds),
             t->o->test_only ? "the split evaluated" : "the evaluation split");
    return train_fail(t, "evaluation", why);
  }
  /* With fewer than 5 classes every label is in the top 5: no figure (null in
   * the metrics, n/a in the log; torchvision's accuracy() refuses topk > classes). */
  double top1 = c.top1 / c.n, top5 = gw_dataset_classes(t->val_ds) < 5 ? NAN : c.top5 / c.n;
  log_eval(&t->log, epoch, t->st.step, top1, top5, c.loss / c.n, c.nll / c.n, (int64_t)c.n);
  if (t->rank == 0 && t->o->plot) {
    char err[300];
    if (plot_epoch(t->o->plot, epoch, train_loss, top1, top5, err, sizeof err) != 0)
      log_text(&t->log, "warning: --plot: %s", err);
  }
  return 0;
}

/* ---- the step */

static void on_ready(void *arg, size_t ready) {
  struct trainer *t = arg;
  if (t->ready_err != GW_SUCCESS) return;
  t->ready_err = gw_bucketer_ready(t->bk, t->marked, ready - t->marked);
  t->marked = ready;
}

/* Whether this step's buckets go out during backward.  Not in a device
 * backend's first step: every kernel that step launches for the first time
 * (CUDA loads a kernel at its first launch, which may wait for the whole
 * device) and every convolution plan it chooses (timing, and growing the
 * workspace: cudaFree waits for the device) must not meet a communication
 * stream spinning on a flag; later steps launch nothing new. */
static int overlapping(const struct trainer *t) { return !t->o->no_overlap && !t->warming; }

/* A device backend's gradients come to the host bucket by bucket as backward
 * finishes them (each download waits only for the work queued so far), and each
 * bucket is handed to the bucketer at once when overlapping: the allreduce of the
 * early buckets runs while the GPU computes the rest.  Alone (no bucketer) they
 * come down in one piece at the end. */
static void on_ready_device(void *arg, size_t ready) {
  struct trainer *t = arg;
  if (t->ready_err != GW_SUCCESS) return;
  size_t upto = t->downloaded;
  for (int i = 1; t->bk && i <= t->nb; i++)
    if (t->bounds[i] <= ready) upto = t->bounds[i];
  if (ready == t->np) upto = ready;
  if (upto <= t->downloaded) return;
  if (gw_exec_download_grads(t->e, t->downloaded, upto - t->downloaded) != GW_SUCCESS) {
    t->ready_err = GW_ERR_INTERNAL;
    snprintf(t->ready_msg, sizeof t->ready_msg, "%s", gw_model_last_error());
    return;
  }
  t->downloaded = upto;
  if (t->bk && overlapping(t)) on_ready(t, upto);
}

/* Allreduces the gradients (the buckets already in flight when overlapping). */
static int finish_gradients(struct trainer *t, struct step_report *r, double t_bwd) {
  if (!t->bk) { /* one rank: no communication (null in the metrics) */
    r->comm_ms = r->exposed_ms = NAN;
    return 0;
  }
  gw_result_t res = t->ready_err;
  if (res == GW_SUCCESS && !overlapping(t)) res = gw_bucketer_ready(t->bk, 0, t->np);
  gw_result_t w = gw_bucketer_wait(t->bk); /* always: nothing may stay in flight */
  if (res == GW_SUCCESS) res = w;
  if (res == GW_SUCCESS && t->warming && t->resident) { /* the allreduces done before the optimizer's first launch */
    float one;
    if (t->ops->download(t->b, &one, gw_exec_grads(t->e), sizeof one) != GW_SUCCESS)
      return train_fail(t, "gradient allreduce", gw_model_last_error());
  }
  if (res != GW_SUCCESS) return train_comm_fail(t, "gradient allreduce", res);
  struct gw_bucketer_times bt;
  gw_bucketer_times(t->bk, &bt);
  r->comm_ms = 1e3 * (bt.done - bt.first_start);
  r->exposed_ms = 1e3 * (bt.done - t_bwd);
  return 0;
}

/* Test hooks: GW_TRAIN_OVERFLOW_AT_STEP=N makes step N's gradients overflow,
 * GW_TRAIN_NAN_LOSS_AT_STEP=N its loss a NaN (on every rank, or with
 * GW_TRAIN_OVERFLOW_RANK=r on rank r only), so the skip, the backoff and the
 * stop can be tested exactly.  Whether `var`'s step is this one here. */
static int hooked_here(const struct trainer *t, const char *var) {
  const char *at = getenv(var), *on = getenv("GW_TRAIN_OVERFLOW_RANK");
  return at && atoll(at) == t->st.step + 1 && (!on || atoi(on) == t->rank);
}

/* GW_TRAIN_OVERFLOW_AT_STEP's step: one gradient made infinite, checked
 * or not. */
static int poison_hook(struct trainer *t) {
  if (!hooked_here(t, "GW_TRAIN_OVERFLOW_AT_STEP")) return 0;
  float inf = INFINITY;
  if (!t->resident) gw_model_grads(t->m)[t->np / 2] = inf;
  else if (t->ops->upload(t->b, gw_exec_grads(t->e) + t->np / 2, &inf, sizeof inf) != GW_SUCCESS)
    return train_fail(t, "GW_TRAIN_OVERFLOW_AT_STEP", gw_model_last_error());
  return 0;
}

/* Whether any of this step's (reduced, scaled) gradients is inf or NaN: on
 * the backend for a resident run (one flag comes back), else on the host. */
static int overflowed(struct trainer *t, int *over) {
  const size_t np = t->np;
  if (t->resident) {
    if (t->ops->nonfinite(t->b, gw_exec_grads(t->e), np, over) != GW_SUCCESS)
      return train_fail(t, "loss scaling", gw_model_last_error());
    return 0;
  }
  const float *g = gw_model_grads(t->m);
  int finite = 1;
  for (size_t i = 0; i < np; i++) finite &= isfinite(g[i]) != 0;
  *over = !finite;
  return 0;
}

/* Loss scaling, after the allreduce: gradients that are all finite are
 * divided by the scale (exact for a power of two; a resident run's optimizer
 * does it, given *inv) and the step goes on; any inf or NaN (`over`, agreed by
 * every rank) skips the optimizer step, counts it, and with --loss-scale
 * dynamic halves the scale, which doubles again after 2000 steps without
 * overflow (PyTorch's GradScaler's rule).  Returns 1 when the step is to be
 * skipped. */
static int unscale(struct trainer *t, int over, double lsum, float *inv) {
  if (over) {
    t->st.overflows++, t->st.good_steps = 0;
    double was = t->st.loss_scale;
    /* Not below 1: the check is on the scaled gradients, and unscaling by a
     * factor above 1 could overflow after it (GradScaler checks after). */
    if (t->o->loss_scale_dynamic && t->st.loss_scale >= 2) t->st.loss_scale *= 0.5;
    log_text(&t->log, "step %lld: %s at loss scale %g; step skipped (%lld so far), scale now %g",
             (long long)t->st.step + 1,
             isnan(lsum) ? "the loss is nan" : isinf(lsum) ? "the loss is inf" : "the gradients overflowed", was,
             (long long)t->st.overflows, t->st.loss_scale);
    return 1;
  }
  *inv = (float)(1.0 / t->st.loss_scale);
  if (!t->resident) {
    float *g = gw_model_grads(t->m);
    for (size_t i = 0; i < t->np; i++) g[i] *= *inv;
  }
  if (t->o->loss_scale_dynamic && ++t->st.good_steps == 2000 && t->st.loss_scale < 1e38)
    t->st.loss_scale *= 2, t->st.good_steps = 0;
  return 0;
}

/* A float16 wire without loss scaling: the ring's partial sums are float16
 * between ranks, so gradients that fit can sum past 65504 on the way.  An
 * infinity (or NaN) there would reach every weight through the optimizer;
 * the step is skipped and counted as an overflow instead, and said.  1 when
 * skipped, -1 on an error. */
static int wire_overflowed(struct trainer *t, int over) {
  if (!over) return 0;
  t->st.overflows++;
  log_text(&t->log, "step %lld: the gradients overflowed on the float16 wire (a gradient or a sum beyond 65504); step "
           "skipped (%lld so far); --grad-wire bf16 has float32's range", (long long)t->st.step + 1,
           (long long)t->st.overflows);
  return 1;
}

/* What a stop leaves to resume from, for its message. */
static void last_checkpoint_said(const struct trainer *t, char *last, size_t len) {
  if (!t->o->checkpoint_dir) snprintf(last, len, "no --checkpoint-dir: nothing to resume from");
  else if (t->saved_step > 0)
    snprintf(last, len, "the last checkpoint, of step %lld, is whole (--resume continues from it)",
             (long long)t->saved_step);
  else snprintf(last, len, "no checkpoint was saved yet");
}

/* A loss that is not finite (any rank's: the sum is) with no loss scaling:
 * its gradients would take every weight to NaN through the optimizer, and
 * the checkpoints after it (pruning the good ones) would hold it.  The run
 * stops before the optimizer step, with exit 1 and nothing saved (forward
 * has already moved BN's running statistics with the batch's, NaN too).  A
 * loss-scaled run skips such a step instead, as GradScaler does (an fp16
 * overflow in the last layers is worth a skip); should the statistics have
 * taken the NaN, the step's look at them stops the run (stats_stop), and no
 * checkpoint is written with it (ckpt_save).  Gradients
 * are checked only where a loss scale or a float16 wire asks (a pass over
 * them each step); a NaN gradient under a finite loss reaches the weights,
 * whose next checkpoint is refused and whose next loss stops the run. */
static int nonfinite_stop(struct trainer *t, double lsum) {
  char d[640], last[160];
  const long long step = (long long)t->st.step + 1;
  if (t->rank != 0) {
    snprintf(d, sizeof d, "stopping with the others at step %lld (a loss that is not finite: rank 0 says more)", step);
    return train_fail_of_others(t, "training", d);
  }
  last_checkpoint_said(t, last, sizeof last);
  snprintf(d, sizeof d, "step %lld: the loss is %s (summed over the ranks); stopping before its optimizer step and "
           "saving nothing, since the weights would all take it; %s. Lower --lr or lengthen --warmup-epochs%s",
           step, isnan(lsum) ? "nan" : "inf", last,
           t->o->amp == GW_FLOAT16 ? ", or use --loss-scale dynamic (float16 activations overflow past 65504)" : "");
  return train_fail(t, "training", d);
}

/* Batch-norm running statistics gone infinite or NaN under a finite loss
 * (training normalizes with the batch's own statistics: a weight near
 * float32's largest took a variance to inf, and the loss never told): every
 * later evaluation and save would take them, and the run went on to its first
 * save (or, with --save-weights alone, to its end) and lost it all.  Seen
 * where the statistics are on the host after each step (a host backend, or
 * one that copies them back); a resident device run finds them at its next
 * evaluation or save.  Test hook: GW_TRAIN_NAN_STATS_AT_STEP=N puts an inf
 * in step N's (on GW_TRAIN_OVERFLOW_RANK's rank, or every rank). */
static int stats_nonfinite(struct trainer *t, char *where, size_t len) {
  if (t->resident) return 0;
  float *run = gw_model_running(t->m);
  if (hooked_here(t, "GW_TRAIN_NAN_STATS_AT_STEP") && t->nrun) run[t->nrun - 1] = INFINITY;
  return ckpt_nonfinite(t->m, NULL, NULL, run, where, len);
}

static int stats_stop(struct trainer *t, const char *where) {
  char d[700], last[160];
  const long long step = (long long)t->st.step + 1;
  if (!where[0]) {
    snprintf(d, sizeof d, "stopping with the others at step %lld (another rank's batch-norm statistics are not "
             "finite: its log says more)", step);
    return train_fail_of_others(t, "training", d);
  }
  last_checkpoint_said(t, last, sizeof last);
  snprintf(d, sizeof d, "step %lld: a batch-norm running statistic is not finite, %s, under a finite loss (the "
           "model diverged; evaluations and saves would take it): stopping; %s. Lower --lr or lengthen "
           "--warmup-epochs, or check --load-weights's values", step, where, last);
  return train_fail(t, "training", d);
}

/* The optimizer step: on the backend (resident; the unscale by inv fused), or
 * on the host's master weights (whose gradients are unscaled already). */
static int optimizer_step(struct trainer *t, double lr, float inv) {
  if (!t->resident) {
    if (gw_sgd_step(t->sgd, gw_model_params(t->m), gw_model_grads(t->m), (float)lr) != GW_SUCCESS)
      return train_fail(t, "optimizer", gw_model_last_error());
    return 0;
  }
  struct gw_sgd_scalars sc;
  int nruns = 0;
  const struct gw_sgd_run *runs = gw_sgd_runs(t->sgd, &nruns);
  gw_sgd_scalars_at(t->sgd, (float)lr, inv, &sc);
  if (t->ops->sgd_step(t->b, runs, nruns, gw_exec_params(t->e), gw_exec_grads(t->e), t->mom_dev, &sc) != GW_SUCCESS)
    return train_fail(t, "optimizer", gw_model_last_error());
  gw_sgd_set_steps(t->sgd, gw_sgd_steps(t->sgd) + 1);
  return 0;
}

/* A training batch taken from the loader: the batch (valid until the next
 * take), where it sits in its epoch, the loader's state after it (what a
 * checkpoint taken after its step records), and for a device backend whether
 * it went to the executor's staging slot (its transfer overlapping the step
 * before: gw_exec_stage). */
struct taken {
  const struct gw_batch *bt;
  int64_t epoch, position;     /* of the batch */
  int64_t next_epoch, next_position; /* the loader's state after it */
  int staged;
  int ahead;                   /* taken during the step before (its wait counted there) */
  double ms;                   /* waiting for it */
};

static int take_batch(struct trainer *t, struct taken *k) {
  double t0 = now();
  if (gw_loader_next(t->train_ld, &k->bt) != GW_SUCCESS) return train_fail(t, "training data", gw_data_last_error());
  if (!k->bt) return train_fail(t, "training data", "the loader ended before the last step");
  k->epoch = k->bt->epoch, k->position = k->bt->position;
  gw_loader_state(t->train_ld, &k->next_epoch, &k->next_position);
  k->staged = !t->ops->host_memory, k->ahead = 0;
  if (k->staged && gw_exec_stage(t->e, k->bt->x, k->bt->y) != GW_SUCCESS)
    return train_fail(t, "staging the input", gw_model_last_error());
  k->ms = 1e3 * (now() - t0);
  return 0;
}

/* One step on batch k; when `next` is not NULL the following batch is taken
 * (and staged, for a device backend) once backward is queued, so its transfer
 * overlaps this step's backward and communication. */
static int train_step(struct trainer *t, const struct taken *k, struct taken *next, struct step_report *r) {
  const struct train_opts *o = t->o;
  const struct gw_batch *bt = k->bt;
  double t0 = now();
  float loss = 0;
  t->marked = 0, t->downloaded = 0, t->ready_err = GW_SUCCESS, t->ready_msg[0] = 0;
  /* --host-step on a device backend: the host model (weights, BN statistics) is
   * the master that the optimizer, checkpoints and broadcasts use, so it goes
   * up before the step, and the gradients (during backward) and the statistics
   * (after it) come back down.  A resident run moves none of it. */
  const int copies = !t->ops->host_memory && !t->resident;
  if (copies && gw_exec_upload_model(t->e) != GW_SUCCESS) return train_fail(t, "forward", gw_model_last_error());
  if (t->st.loss_scale && gw_exec_set_loss_scale(t->e, (float)t->st.loss_scale) != GW_SUCCESS)
    return train_fail(t, "--loss-scale", gw_model_last_error());
  if (gw_exec_forward(t->e, k->staged ? NULL : bt->x, 1) != GW_SUCCESS)
    return train_fail(t, "forward", gw_model_last_error());
  gw_grad_ready_fn ready = copies ? on_ready_device : t->bk && overlapping(t) ? on_ready : NULL;
  if (gw_exec_backward(t->e, k->staged ? NULL : bt->y, &loss, ready, t) != GW_SUCCESS)
    return train_fail(t, "backward", gw_model_last_error());
  if (t->ready_msg[0]) return train_fail(t, "backward", t->ready_msg);
  /* this rank's unreadable samples up to this step's batch (not the next one,
   * taken below on a device backend) */
  const int64_t skipped = gw_loader_skipped(t->train_ld);
  if (next && take_batch(t, next) != 0) return -1;
  if (copies && gw_exec_download_stats(t->e) != GW_SUCCESS) return train_fail(t, "backward", gw_model_last_error());
  double t_bwd = now();
  if (finish_gradients(t, r, t_bwd) != 0) return -1;
  double t_comm = now(), lr = trainer_lr_at(t, t->st.step);
  /* Whether the reduced gradients overflowed rides with the loss's sum: every
   * rank holds the same sums, but the skip (and the scale, the step count)
   * must agree even if one rank's ever differed, or the replicas part. */
  const int checks = t->st.loss_scale || (o->grad_wire == GW_FLOAT16 && t->bk);
  int over = 0;
  if (poison_hook(t) != 0 || (checks && overflowed(t, &over) != 0)) return -1;
  if (hooked_here(t, "GW_TRAIN_NAN_LOSS_AT_STEP")) loss = NAN;
  int ckpt, stop;
  trainer_signals_take(&ckpt, &stop);
  /* and the unreadable samples so far: the metrics' count is every rank's
   * (it was rank 0's alone) */
  char bad_stat[200] = "";
  const int stats_bad = stats_nonfinite(t, bad_stat, sizeof bad_stat);
  double sums[6] = {loss, over, ckpt, stop, (double)skipped, stats_bad};
  if (train_allreduce_d(t, sums, 6, "averaging the loss") != 0) return -1;
  const double lsum = sums[0];
  over = sums[1] > 0;
  r->sig_ckpt = (int)sums[2], r->sig_stop = (int)sums[3];
  r->skipped = t->skipped_all = (int64_t)sums[4];
  r->loss_scale = t->st.loss_scale;
  if (!isfinite(lsum) && !t->st.loss_scale) return nonfinite_stop(t, lsum);
  if (sums[5] > 0) return stats_stop(t, stats_bad ? bad_stat : "");
  float inv = 1.0f;
  int skip = t->st.loss_scale ? unscale(t, over || !isfinite(lsum), lsum, &inv) : checks ? wire_overflowed(t, over) : 0;
  r->overflows = t->st.overflows;
  if (!skip && optimizer_step(t, lr, inv) != 0) return -1;
  double t_end = now();
  r->loss = lsum / t->world;
  r->lr = lr;
  /* forward, backward, optimizer: not the wait for the next batch, taken
   * before t_bwd (it is data_ms's) */
  r->compute_ms = 1e3 * ((t_bwd - t0) + (t_end - t_comm)) - (next ? next->ms : 0);
  /* The data wait: this batch's when taken just before the step (outside it),
   * the next one's when taken during it (inside it). */
  r->data_ms = (k->ahead ? 0 : k->ms) + (next ? next->ms : 0);
  r->step_s = t_end - t0 + (k->ahead ? 0 : k->ms / 1e3);
  r->img_per_s = (double)o->batch * t->world / r->step_s;
  t->warming = 0;
  return 0;
}

/* A test hook: GW_TRAIN_STOP_BEFORE_EVAL=E ends the job as an interruption
 * would (exit 75) after epoch E's checkpoint, before its evaluation. */
enum { STOPPED = 75 };
/* SIGTERM's stop with nothing saved (no --checkpoint-dir): not resumable, so
 * not 75; 128 + SIGTERM, as the signal's default action would end it. */
enum { STOPPED_UNSAVED = 128 + SIGTERM };
static int stop_before_eval(int64_t epoch) {
  const char *s = getenv("GW_TRAIN_STOP_BEFORE_EVAL");
  return s && atoll(s) == epoch;
}

static int epoch_end(struct trainer *t, int64_t epoch) {
  const int64_t left_out = t->spe - t->st.loss_count; /* the epoch's non-finite losses (skipped steps) */
  /* every step's loss non-finite: no mean (nan), not 0 */
  const double mean = t->st.loss_count ? t->st.loss_sum / (double)t->st.loss_count : left_out > 0 ? NAN : 0;
  if (left_out > 0 && left_out <= t->spe)
    log_text(&t->log, "epoch %lld done: mean training loss %.4f (over %lld steps; %lld skipped for a non-finite loss "
             "are left out)", (long long)epoch + 1, mean, (long long)t->st.loss_count, (long long)left_out);
  else
    log_text(&t->log, "epoch %lld done: mean training loss %.4f", (long long)epoch + 1, mean);
  /* the warnings above come now and then, each rank's own: the epoch's total */
  if (t->skipped_all > t->skipped_epoch)
    log_text(&t->log, "epoch %lld: %lld unreadable training sample%s replaced by readable ones (all ranks; %lld in "
             "this run so far)", (long long)epoch + 1, (long long)(t->skipped_all - t->skipped_epoch),
             t->skipped_all - t->skipped_epoch > 1 ? "s" : "", (long long)t->skipped_all);
  t->skipped_epoch = t->skipped_all;
  t->st.loss_sum = 0, t->st.loss_count = 0;
  /* Saved before the evaluation (which changes nothing saved), so a job that
   * ends during it keeps the epoch; the checkpoint says the evaluation is
   * pending, so a resume runs it before going on. */
  if (t->o->eval) t->st.eval_epoch = epoch + 1, t->st.eval_train_loss = mean;
  if (save_checkpoint(t) != 0) return -1;
  if (t->o->eval && stop_before_eval(epoch + 1)) {
    log_text(&t->log, "stopping before the evaluation of epoch %lld (GW_TRAIN_STOP_BEFORE_EVAL)", (long long)epoch + 1);
    return STOPPED;
  }
  t->st.eval_epoch = 0;
  if (!t->o->eval) return 0;
  /* Done: the checkpoint says so, or every resume from it would evaluate the
   * epoch again (a second eval line in the metrics).  The same file is
   * written again (ckpt-<step>: no other of the newest kept is pruned); a
   * failure there only costs that evaluation, so it does not end the run. */
  return evaluate(t, epoch + 1, mean) != 0 ? -1 : save_checkpoint_as(t, PENDING_WARN);
}

/* A test hook: GW_TRAIN_STOP_AT_STEP=N ends the job right after step N (and its
 * checkpoint) as an interruption would, exit code 75, so resume can be tested
 * deterministically. */
static int interrupted_here(struct trainer *t) {
  const char *s = getenv("GW_TRAIN_STOP_AT_STEP");
  if (!s || atoll(s) != t->st.step) return 0;
  log_text(&t->log, "stopping after step %lld (GW_TRAIN_STOP_AT_STEP)", (long long)t->st.step);
  return 1;
}

/* A test hook: GW_TRAIN_TEST_SIGNAL=R:S:USR1|TERM|TERM2 makes rank R raise
 * that signal at itself after step S (the others hear of it through the
 * sums), S -1: at the end of the setup, before any step or evaluation;
 * TERM2: SIGTERM twice at once, as a process group's delivery. */
static void test_signal(const struct trainer *t, long long at) {
  const char *s = getenv("GW_TRAIN_TEST_SIGNAL");
  long long rank, step;
  char name[8];
  if (!s || sscanf(s, "%lld:%lld:%7s", &rank, &step, name) != 3 || rank != t->rank || step != at) return;
  raise(!strncmp(name, "TERM", 4) ? SIGTERM : SIGUSR1);
  if (!strcmp(name, "TERM2")) raise(SIGTERM);
}

/* After a step whose sums said a signal reached some rank: the checkpoint
 * (unless this step's is saved already), then the job goes on (0) or stops
 * (STOPPED).  A failed save ends the job only when it was to stop. */
static int signalled(struct trainer *t, const struct step_report *r) {
  const int stop = r->sig_stop > 0, n = stop ? r->sig_stop : r->sig_ckpt;
  const char *sig = stop ? "SIGTERM" : "SIGUSR1/SIGUSR2", *what = "no --checkpoint-dir: nothing saved";
  if (stop && !t->o->checkpoint_dir) { /* it said "--resume continues from there", with nothing to resume */
    log_text(&t->log, "SIGTERM reached %d rank%s: %s at step %lld; stopping (a rerun starts over: --checkpoint-dir "
             "keeps the progress)", n, n > 1 ? "s" : "", what, (long long)t->st.step);
    return STOPPED_UNSAVED;
  }
  if (t->o->checkpoint_dir) {
    if (t->saved_step != t->st.step && save_checkpoint_as(t, stop ? NULL : SIGNAL_WARN) != 0) return -1;
    what = t->saved_step == t->st.step ? "checkpoint saved" : "the checkpoint could not be saved (above)";
  }
  log_text(&t->log, "%s reached %d rank%s: %s at step %lld%s", sig, n, n > 1 ? "s" : "", what, (long long)t->st.step,
           stop ? "; stopping (--resume continues from there)" : "; training goes on");
  return stop ? STOPPED : 0;
}

static int run_steps_caught(struct trainer *t);
static int run_steps(struct trainer *t) {
  trainer_catch_stop(1);
  const int rc = run_steps_caught(t);
  trainer_catch_stop(0);
  return rc;
}

static int run_steps_caught(struct trainer *t) {
  /* A device backend takes each batch during the step before (staged). */
  const int ahead = !t->ops->host_memory;
  struct taken k = {0}, next = {0};
  int have_next = 0;
  t->saved_step = t->st.step; /* what a resume started from, or nothing yet */
  if (t->st.eval_epoch) { /* resumed from an epoch's end whose evaluation did not finish */
    const int64_t e = t->st.eval_epoch;
    t->st.eval_epoch = 0;
    /* Done, the checkpoint says so: without it a later resume (one with no
     * steps left saves nothing else) would evaluate the epoch again. */
    /* The checkpoint as it was but for that (this run's loss-scale rule and
     * options must not replace the saved ones before a step of this run). */
    if (t->as_loaded) t->as_loaded->eval_epoch = 0;
    if (t->o->eval && (evaluate(t, e, t->st.eval_train_loss) != 0 ||
                       save_state_as(t, t->as_loaded ? t->as_loaded : &t->st, PENDING_WARN) != 0))
      return -1;
  }
  while (t->st.step < t->total_steps) {
    if (have_next) k = next, k.ahead = 1, have_next = 0;
    else if (take_batch(t, &k) != 0) return -1;
    struct step_report r = {0};
    const int take_next = ahead && t->st.step + 1 < t->total_steps;
    if (train_step(t, &k, take_next ? &next : NULL, &r) != 0) return -1;
    have_next = take_next;
    if (t->steps_run++ > 0) t->timed_s += r.step_s;
    t->st.step++;
    t->st.sgd_steps = gw_sgd_steps(t->sgd);
    t->st.epoch = k.next_epoch, t->st.position = k.next_position;
    /* a step the loss scaler skipped for a non-finite loss: out of the mean
     * (one made the whole epoch's nan) */
    if (isfinite(r.loss)) t->st.loss_sum += r.loss, t->st.loss_count++;
    r.step = t->st.step, r.steps_total = t->total_steps, r.epoch = k.epoch, r.epochs = t->epochs;
    r.step_in_epoch = k.position / t->o->batch + 1, r.steps_per_epoch = t->spe;
    /* Unreadable samples, each rank its own (its loader's): the first at once,
     * then at most every 100 steps, with the latest reason (naming the file);
     * every rank's at each epoch's end (epoch_end). */
    const int64_t mine = gw_loader_skipped(t->train_ld);
    if (mine > t->skips_told && (!t->skips_told || t->st.step >= t->skips_told_at + 100)) {
      log_rank(&t->log, "warning: %lld training sample%s unreadable so far, each replaced by the next readable one "
               "of this rank's shard; the latest: %s", (long long)mine, mine > 1 ? "s" : "",
               gw_loader_last_skip(t->train_ld));
      t->skips_told = mine, t->skips_told_at = t->st.step;
    }
    log_step(&t->log, &r, t->st.step % t->o->log_every == 0 || t->st.step == t->total_steps);
    int last_of_epoch = r.step_in_epoch == t->spe;
    if (last_of_epoch) {
      const int rc = epoch_end(t, k.epoch);
      if (rc != 0) return rc;
    }
    if (!last_of_epoch && t->o->checkpoint_every && t->st.step % t->o->checkpoint_every == 0 &&
        save_checkpoint(t) != 0)
      return -1;
    if (r.sig_ckpt || r.sig_stop) {
      const int rc = signalled(t, &r);
      if (rc != 0) return rc;
    }
    if (interrupted_here(t)) return STOPPED;
    test_signal(t, t->st.step);
  }
  /* The end of a run between checkpoints (--steps): its last state, so a later
   * --resume with more steps continues from there. */
  return t->saved_step != t->st.step && t->o->checkpoint_dir ? save_checkpoint(t) : 0;
}

/* ---- the job */

static void announce(struct trainer *t) {
  const struct train_opts *o = t->o;
  char threads[48] = "", buckets[96] = "";
  if (t->bk && t->nb > 1)
    snprintf(buckets, sizeof buckets, " in %d buckets (the first %g MiB, then %g MiB)", t->nb, o->first_bucket_mb,
             o->bucket_mb);
  if (t->ops->host_memory)
    snprintf(threads, sizeof threads, ", %d thread%s per rank", t->threads, t->threads > 1 ? "s" : "");
  log_text(&t->log,
           "%s on %s: %d rank%s x batch %d on %s%s%s%s%s, %lld steps (%lld per epoch), peak lr %.4g, %s%s%s, %zu "
           "parameters",
           o->model_name, gw_dataset_description(t->train_ds), t->world, t->world > 1 ? "s" : "", o->batch,
           t->ops->name, t->ops->layout(t->b) == GW_LAYOUT_NHWC ? " (NHWC)" : "", threads,
           t->ops->host_memory ? ""
           : t->resident       ? " (device memory; weights, gradients and optimizer there)"
                               : " (device memory; master weights and optimizer on the host: --host-step)",
           o->amp == GW_BFLOAT16 ? ", bf16 activations" : o->amp == GW_FLOAT16 ? ", fp16 activations" : "",
           (long long)t->total_steps, (long long)t->spe,
           t->peak_lr,
           t->world == 1     ? "no allreduce"
           : o->no_overlap ? "allreduce after backward"
                             : "allreduce overlapped with backward",
           buckets, o->sync_bn && t->comm ? ", SyncBatchNorm" : "", t->np);
  /* the evaluation's split, with what its scan left out (said by --test-only
   * alone before) */
  if (o->eval && t->val_ds && t->val_ds != t->train_ds)
    log_text(&t->log, "evaluation on %s", gw_dataset_description(t->val_ds));
  if (t->e_eval) {
    const struct gw_model_config *tr = gw_model_get_config(t->m), *ev = gw_model_get_config(t->m_eval);
    log_text(&t->log, "evaluation on %dx%d center crops (--val-crop-size), training on %dx%d", ev->image_size,
             ev->image_size, tr->image_size, tr->image_size);
  }
  /* Training batches are whole: a share that is not a whole number of them
   * leaves its last places out of every epoch (other samples each epoch: the
   * order is shuffled).  Counted over the ranks, without the sampler's
   * padding (the list's last places, repeats of its first samples) and with
   * --drop-last's tail: the epoch takes the list's first world x steps x
   * batch places, the rest of the n samples are left out. */
  const int64_t share = t->train_s.num_samples, n = gw_dataset_size(t->train_ds);
  const int64_t taken = t->spe * o->batch * t->world, left = n - (taken < n ? taken : n);
  if (left > 0)
    log_text(&t->log, "note: each rank's share of %lld training samples is %lld batch%s of %d: %lld of the %lld "
             "samples %s left out of each epoch", (long long)share, (long long)t->spe, t->spe > 1 ? "es" : "",
             o->batch, (long long)left, (long long)n, left > 1 ? "are" : "is");
  /* and the sampler's padding that the batches take: repeats (said as the
   * samples left out are; they went unsaid: a helper's probe) */
  if (taken > n)
    log_text(&t->log, "note: the %d ranks' shares are padded to the same length with repeats: %lld of the %lld samples "
             "are taken twice each epoch (--drop-last leaves the tail out instead)", t->world,
             (long long)(taken - n), (long long)n);
  /* where the weights come from: a file's, momentum anew (said by --help
   * alone; a resume says its checkpoint and that the file is not used) */
  if (o->load_weights && t->st.step == 0)
    log_text(&t->log, "starting from the weights of %s (momentum and the learning-rate schedule start anew)",
             o->load_weights);
}

static void teardown(struct trainer *t) {
  log_close(&t->log);
  gw_bucketer_destroy(t->bk);
  gw_loader_free(t->train_ld);
  gw_loader_free(t->val_ld);
  gw_sgd_free(t->sgd);
  if (t->comm) gw_comm_deregister(t->comm, t->grads_reg); /* before the gradients' memory goes */
  gw_exec_free(t->e);
  gw_exec_free(t->e_eval);
  if (t->mom_dev) t->ops->dealloc(t->b, t->mom_dev);
  if (t->b) t->ops->destroy(t->b);
  gw_model_free(t->m);
  gw_model_free(t->m_eval);
  if (t->train_ds != t->val_ds) gw_dataset_free(t->train_ds); /* --test-only: one, the evaluation split */
  gw_dataset_free(t->val_ds);
  free(t->pad_x), free(t->logits), free(t->pad_y), free(t->as_loaded);
  if (t->comm) gw_comm_destroy(t->comm);
}

static int finish(struct trainer *t) {
  if (t->steps_run > 1 && t->timed_s > 0)
    log_summary(&t->log, t->steps_run, t->steps_run - 1, t->timed_s,
                (double)(t->steps_run - 1) * t->o->batch * t->world / t->timed_s);
  if (!t->o->save_weights) return 0;
  if (host_from_backend(t, "--save-weights") != 0) return -1;
  if (train_bcast(t, gw_model_running(t->m), t->nrun, GW_FLOAT32, "sharing rank 0's BN statistics") != 0) return -1;
  char where[160], d[320];
  if (t->rank == 0 &&
      ckpt_nonfinite(t->m, gw_model_params(t->m), NULL, gw_model_running(t->m), where, sizeof where)) {
    snprintf(d, sizeof d, "not written: the model holds a value that is not finite, %s", where);
    return train_fail(t, "--save-weights", d);
  }
  if (t->rank == 0 && gw_model_save_weights(t->m, t->o->save_weights) != GW_SUCCESS)
    return train_fail(t, "--save-weights", gw_model_last_error());
  if (t->rank == 0) log_text(&t->log, "weights written to %s", t->o->save_weights);
  return 0;
}

int gw_train_run(const struct train_opts *o) {
  struct trainer t;
  memset(&t, 0, sizeof t);
  t.o = o;
  t.log.rank = -1;
  int rc = trainer_setup(&t);
  if (rc == 0) test_signal(&t, -1);
  if (rc == 0 && t.rank == 0 && o->save_weights) weights_remove_stale_temps(o->save_weights);
  if (rc == 0 && o->test_only) {
    log_text(&t.log, "evaluating %s from %s on %s: %d rank%s x batch %d on %s", o->model_name, o->load_weights,
             gw_dataset_description(t.val_ds), t.world, t.world > 1 ? "s" : "", o->batch, t.ops->name);
    rc = evaluate(&t, 0, NAN);
  } else if (rc == 0) {
    announce(&t);
    rc = run_steps(&t);
  }
  if (rc == 0) rc = finish(&t);
  if (rc < 0 && t.comm) gw_comm_abort(t.comm); /* the other ranks fail at once instead of timing out */
  teardown(&t);
  return rc == STOPPED || rc == STOPPED_UNSAVED ? rc : rc == 0 ? 0 : 1;
}

#else /* neither oneDNN nor cuDNN */

int gw_train_run(const struct train_opts *o) {
  (void)o;
  fprintf(stderr, "gw-train: this build has no compute backend (neither oneDNN nor cuDNN was found when it was "
                  "configured: apt-get install libdnnl-dev, then reconfigure); only --steps 0 works\n");
  return 1;
}

#endif
