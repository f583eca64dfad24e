/* gw-train-resume.c - the learning-rate schedule, and --resume: rank 0 reads
 * the newest whole checkpoint (ckpt_load_latest), every rank gets its state
 * and weights by broadcast, and what the resume changes is said (other
 * options than the saved run's; a schedule whose rate at the step it goes on
 * from is not the saved run's).  Split from gw-train-loop.c, which saves the
 * checkpoints this reads. */
#include "gw_config.h"

#if GW_HAVE_ONEDNN || GW_HAVE_CUDNN

#include "gw-train-job.h"
#include "optwords.h"

/* A schedule: linear warmup to the peak (from peak / warmup steps, or from
 * start x peak as torchvision's LinearLR), then cosine to 0 or steps of gamma
 * at the milestones (steps from the start: every step from one on runs at
 * gamma times the rate before), by default at 1/3 and 2/3 of the rest. */
struct schedule {
  double peak;
  int64_t warmup, total;
  int steps; /* GW_SCHED_STEP */
  double gamma, start;
  int64_t ms[GW_MAX_MILESTONES];
  int nms;
};
static double rate(const struct schedule *s, int64_t step) {
  double f = 1;
  if (step < s->warmup)
    f = s->start > 0 ? s->start + (1 - s->start) * (double)step / (double)s->warmup
                     : (double)(step + 1) / (double)s->warmup;
  if (s->steps && s->nms) {
    for (int i = 0; i < s->nms && step >= s->ms[i]; i++) f *= s->gamma;
    return s->peak * f;
  }
  if (step < s->warmup) return s->peak * f;
  int64_t rest = s->total - s->warmup;
  double p = rest > 0 ? (double)(step - s->warmup) / (double)rest : 1.0;
  /* 0.01 itself where gamma is the default (0.1 x 0.1 is 0.010000000000000002):
   * the rates checkpoints of the fixed schedule were trained at */
  const double g2 = s->gamma == 0.1 ? 0.01 : s->gamma * s->gamma;
  if (s->steps) return s->peak * (p < 1.0 / 3 ? 1.0 : p < 2.0 / 3 ? s->gamma : g2);
  return s->peak * 0.5 * (1.0 + cos(M_PI * p));
}
/* Milestones in epochs (a list as --lr-milestones takes it) as steps. */
static void milestone_steps(struct schedule *s, const double *epochs, int n, int64_t spe) {
  s->nms = n;
  for (int i = 0; i < n; i++) s->ms[i] = (int64_t)llround(epochs[i] * (double)spe);
}
double trainer_lr_at(const struct trainer *t, int64_t step) {
  const struct train_opts *o = t->o;
  struct schedule s = {t->peak_lr, t->warmup_steps, t->total_steps, o->schedule == GW_SCHED_STEP, o->lr_gamma,
                       o->warmup_start, {0}, 0};
  milestone_steps(&s, o->milestones, o->n_milestones, t->spe);
  return rate(&s, step);
}

static int share_state(struct trainer *t) {
  int64_t s[11] = {t->st.step, t->st.epoch, t->st.position, t->st.sgd_steps, t->st.loss_count, 0, 0,
                   t->st.good_steps, t->st.overflows, t->st.eval_epoch, 0};
  memcpy(&s[5], &t->st.loss_sum, sizeof(double));
  memcpy(&s[6], &t->st.loss_scale, sizeof(double));
  memcpy(&s[10], &t->st.eval_train_loss, sizeof(double));
  if (train_bcast(t, s, 11, GW_INT64, "sharing the resumed state") != 0) return -1;
  t->st.step = s[0], t->st.epoch = s[1], t->st.position = s[2], t->st.sgd_steps = s[3], t->st.loss_count = s[4];
  memcpy(&t->st.loss_sum, &s[5], sizeof(double));
  memcpy(&t->st.loss_scale, &s[6], sizeof(double));
  t->st.good_steps = s[7], t->st.overflows = s[8], t->st.eval_epoch = s[9];
  memcpy(&t->st.eval_train_loss, &s[10], sizeof(double));
  float *mom = gw_sgd_momentum(t->sgd);
  if (train_bcast(t, gw_model_params(t->m), t->np, GW_FLOAT32, "sharing the resumed weights") != 0) return -1;
  if (mom && train_bcast(t, mom, t->np, GW_FLOAT32, "sharing the resumed momentum") != 0) return -1;
  if (train_bcast(t, gw_model_running(t->m), t->nrun, GW_FLOAT32, "sharing the resumed BN statistics") != 0) return -1;
  return train_bcast(t, gw_model_counters(t->m), t->ncounters, GW_INT64, "sharing the resumed BN counters");
}

/* Word `key` of the saved run's description (train_opts_describe) into buf;
 * 0 when it has none. */
static int saved_word(const char *opts, const char *key, char *buf, size_t len) {
  char k[40];
  snprintf(k, sizeof k, " %s=", key);
  const char *p = strstr(opts, k);
  if (!p) return 0;
  p += strlen(k);
  snprintf(buf, len, "%.*s", (int)strcspn(p, " "), p);
  return 1;
}

/* The saved run's schedule, from its description: its length (--epochs, or
 * --steps when that was -1), rate, warmup and kind.  The world, batch and
 * steps per epoch are the checkpoint's configuration, the same as this run's.
 * 0 when the description lacks a word (an older gw-train's). */
/* Word `key` as a number within [lo, hi] into *v; 0 when absent, no number
 * or out of range (a checkpoint's words are checksummed, but one edited with
 * its checksum made again gave warmup_epochs=1e308: an overflow, undefined). */
static int saved_num(const char *opts, const char *key, double lo, double hi, double *v) {
  char w[40], *end;
  if (!saved_word(opts, key, w, sizeof w)) return 0;
  *v = strtod(w, &end);
  return end != w && !*end && *v >= lo && *v <= hi; /* (NaN fails both) */
}

static int saved_schedule(const struct trainer *t, struct schedule *s) {
  char kind[32];
  double epochs, steps, lr, warmup;
  const char *o = t->st.options;
  /* the flags' own ranges, or wider (--steps to LONG_MAX / 2): epochs x steps per epoch stays far from overflow */
  if (!saved_num(o, "epochs", -1, 1e9, &epochs) || !saved_num(o, "steps", -1, 4.7e18, &steps) ||
      !saved_num(o, "lr", 0, 1e3, &lr) || !saved_num(o, "warmup_epochs", 0, 1e9, &warmup) ||
      !saved_word(o, "schedule", kind, sizeof kind))
    return 0;
  s->total = epochs >= 1 ? (int64_t)epochs * t->spe : (int64_t)steps;
  s->warmup = (int64_t)llround(warmup * (double)t->spe);
  s->peak = lr * (double)t->o->batch * t->world / 256.0;
  s->steps = !strcmp(kind, "step");
  /* Words an older gw-train did not write: its fixed steps of 0.1 and warmup. */
  char ms[GW_MAX_MILESTONES * 24 + 8], start[32];
  if (!saved_num(o, "lr_gamma", 0, 1e3, &s->gamma)) s->gamma = 0.1;
  s->start = 0;
  if (saved_word(o, "warmup_start", start, sizeof start) && strcmp(start, "auto") &&
      !saved_num(o, "warmup_start", 0, 1, &s->start))
    return 0;
  double epochs_at[GW_MAX_MILESTONES];
  int n = 0;
  if (saved_word(o, "lr_milestones", ms, sizeof ms) && strcmp(ms, "none"))
    for (char *p = ms, *end; n < GW_MAX_MILESTONES && *p; p = end + (*end == ',')) {
      epochs_at[n] = strtod(p, &end);
      if (end == p || !(epochs_at[n] >= 0 && epochs_at[n] <= 1e9)) return 0;
      n++;
    }
  milestone_steps(s, epochs_at, n, t->spe);
  return s->total > 0;
}

/* A resume whose options change the learning-rate schedule (more or fewer
 * --steps or --epochs stretch it over the new length; another --lr, warmup or
 * schedule): the rate at the step the run goes on from jumps (a finished
 * 4-step cosine run resumed for 8 goes from 0.15 to 0.5 of the peak).
 * Allowed, but said with the figures. */
static void note_schedule_change(struct trainer *t) {
  struct schedule saved;
  const int64_t at = t->st.step;
  if (!saved_schedule(t, &saved) || at >= t->total_steps) return;
  const int ended = at >= saved.total; /* then its last step's rate */
  const double now_lr = trainer_lr_at(t, at), saved_lr = rate(&saved, ended ? saved.total - 1 : at);
  /* Milestones (and a warmup) do not stretch with the run's length: a longer
   * run on the same rates says nothing. */
  const int same_rate = fabs(now_lr - saved_lr) <= 1e-9 * fabs(saved_lr);
  if (same_rate && (saved.total == t->total_steps || (saved.nms && t->o->n_milestones))) return;
  if (same_rate) /* (in the warmup: the later steps' rates differ) */
    log_text(&t->log, "note: the learning-rate schedule now spans %lld steps (the saved run's: %lld): step %lld "
             "runs at the saved run's lr %.4g, later steps at other rates", (long long)t->total_steps,
             (long long)saved.total, (long long)at + 1, now_lr);
  else
    log_text(&t->log, "note: the learning-rate schedule now spans %lld steps (the saved run's: %lld): step %lld "
             "runs at lr %.4g, where the saved run's %s %.4g", (long long)t->total_steps, (long long)saved.total,
             (long long)at + 1, now_lr, ended ? "last step ran at" : "schedule gave", saved_lr);
}

int trainer_resume(struct trainer *t) {
  int found = 0;
  const double initial_scale = t->st.loss_scale;
  if (t->rank == 0) {
    char path[4096], note[2000], err[2000];
    note[0] = 0;
    int r = ckpt_load_latest(t->o->checkpoint_dir, t->m, t->sgd, &t->st, t->config, t->config_legacy, t->spe,
                             t->o->batch, path, sizeof path, note, sizeof note, err, sizeof err);
    /* The saved scale carries on only where this run scales dynamically and the
     * saved run did too (its options say "dynamic:"; an older gw-train's have
     * no loss_scale word: any saved scale); a fixed --loss-scale (or none) is
     * the flag's, also when resuming a fixed-scale run dynamically (its 8 went
     * on as the dynamic scale, while the note said dynamic:65536). */
    char saved_scale[40];
    const int saved_fixed = saved_word(t->st.options, "loss_scale", saved_scale, sizeof saved_scale) &&
                             strncmp(saved_scale, "dynamic:", 8) != 0;
    if (r == 0 && t->st.eval_epoch && (t->as_loaded = malloc(sizeof *t->as_loaded))) *t->as_loaded = t->st;
    if (r == 0 && t->st.has_scaler &&
        (!t->o->loss_scale_dynamic || !t->st.loss_scale || !initial_scale || saved_fixed))
      t->st.loss_scale = initial_scale, t->st.good_steps = 0;
    if (r == 0 && !t->st.has_scaler && initial_scale)
      log_text(&t->log, "note: the checkpoint has no loss scaler state (written by an older gw-train); the loss "
               "scale restarts at %g", initial_scale);
    if (note[0]) log_text(&t->log, "warning: %s", note);
    if (r == 0) {
      /* Changing options on a resume is allowed (a lower rate to finish, more
       * steps), but said: it is easily done by mistake.  These are not: they
       * change how the run is carried out, not what it computes. */
      static const char *const how[] = {"eval", "save_weights", "overlap", "bucket_mb", "first_bucket_mb",
                                        "backend", "layout", "host_step", NULL};
      char now_opts[sizeof t->st.options], changed[1200];
      train_opts_describe(t->o, now_opts, sizeof now_opts);
      if (t->st.options[0] && opt_words_diff(t->st.options, now_opts, how, changed, sizeof changed) > 0)
        log_text(&t->log, "note: resuming with options other than the saved run's: %s", changed);
      if (t->st.options[0]) note_schedule_change(t);
      snprintf(t->st.options, sizeof t->st.options, "%s", now_opts);
    }
    if (r < 0) {
      train_fail(t, "--resume", err);
      found = -1;
    } else {
      found = r == 0;
      if (found) {
        log_text(&t->log, "resumed from %s at step %lld", path, (long long)t->st.step);
        log_resumed(&t->log, t->st.step);
        /* torchvision's order too, but a user fine-tuning from a file hears it */
        if (t->o->load_weights)
          log_text(&t->log, "note: --load-weights %s is not used: the weights are the checkpoint's",
                   t->o->load_weights);
      } else {
        log_text(&t->log, "--resume: no checkpoint in %s yet; starting from the beginning", t->o->checkpoint_dir);
      }
    }
  }
  int64_t f = found;
  if (train_bcast(t, &f, 1, GW_INT64, "sharing the resume decision") != 0 || f < 0) return -1;
  if (f == 0) return 0;
  if (share_state(t) != 0) return -1;
  gw_sgd_set_steps(t->sgd, t->st.sgd_steps);
  if (gw_loader_seek(t->train_ld, t->st.epoch, t->st.position) != GW_SUCCESS)
    return train_fail(t, "resume", gw_data_last_error());
  return 0;
}

#endif
