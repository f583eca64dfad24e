/* sgd.c - torch.optim.SGD over contiguous ranges.  The parameter table is
 * turned once into runs of consecutive elements with the same weight decay, so
 * the step is a few long loops the compiler vectorizes. */
#include "sgd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "sgd_math.h"


struct gw_sgd {
  struct gw_sgd_config cfg;
  size_t n;
  struct gw_sgd_run *runs;
  int nruns;
  float *buf;     /* momentum, [n] */
  int64_t steps;
};

/* The table lists tensors in forward order and lays them out in reverse, so
 * walking it backward visits offsets in increasing order; neighbours with the
 * same decay merge into one run. */
static int build_runs(struct gw_sgd *s, const struct gw_model *m) {
  int nt = gw_model_num_param_tensors(m);
  s->runs = calloc((size_t)nt + 1, sizeof *s->runs);
  if (!s->runs) return -1;
  size_t end = 0;
  for (int i = nt - 1; i >= 0; i--) {
    const struct gw_tensor *t = gw_model_param_tensor(m, i);
    float wd = (s->cfg.decay_all || t->ndim >= 2) ? s->cfg.weight_decay : 0.0f;
    if (t->offset != end) return -2; /* not the layout resnet.h promises */
    struct gw_sgd_run *last = s->nruns ? &s->runs[s->nruns - 1] : NULL;
    if (last && last->wd == wd) last->len += t->numel;
    else s->runs[s->nruns++] = (struct gw_sgd_run){t->offset, t->numel, wd};
    end += t->numel;
  }
  return end == s->n ? 0 : -2;
}

gw_result_t gw_sgd_create(const struct gw_model *m, const struct gw_sgd_config *cfg, struct gw_sgd **out) {
  *out = NULL;
  /* isfinite: a comparison alone lets +inf through (NaN fails them all). */
  if (!isfinite(cfg->momentum) || cfg->momentum < 0)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "sgd: momentum %g must be finite and >= 0", (double)cfg->momentum);
  if (!isfinite(cfg->weight_decay) || cfg->weight_decay < 0)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "sgd: weight decay %g must be finite and >= 0",
                          (double)cfg->weight_decay);
  if (!(cfg->dampening >= 0 && cfg->dampening <= 1))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "sgd: dampening %g must be in [0, 1]", (double)cfg->dampening);
  if (cfg->nesterov && (cfg->momentum <= 0 || cfg->dampening != 0))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "sgd: Nesterov momentum requires a momentum and zero dampening");
  struct gw_sgd *s = calloc(1, sizeof *s);
  if (!s) return gw__model_fail(GW_ERR_SYSTEM, "sgd: out of memory");
  s->cfg = *cfg;
  s->n = gw_model_num_params(m);
  int built = build_runs(s, m);
  if (built == -2) {
    gw_sgd_free(s);
    return gw__model_fail(GW_ERR_INTERNAL, "sgd: the parameter tensors do not tile the parameter buffer");
  }
  if (built != 0 || (cfg->momentum > 0 && !(s->buf = calloc(s->n ? s->n : 1, sizeof(float))))) {
    gw_sgd_free(s);
    return gw__model_fail(GW_ERR_SYSTEM, "sgd: out of memory for %zu parameters", gw_model_num_params(m));
  }
  *out = s;
  return GW_SUCCESS;
}

void gw_sgd_free(struct gw_sgd *s) {
  if (!s) return;
  free(s->runs), free(s->buf);
  free(s);
}

/* One loop per case, so each is a straight loop the compiler vectorizes. */
static void run_plain(float *restrict p, const float *restrict g, size_t n, float wd, const struct gw_sgd_scalars *sc) {
  const struct gw_sgd_scalars c = *sc;
  for (size_t i = 0; i < n; i++) gw_sgd_elem(&p[i], g[i], NULL, wd, &c);
}

static void run_momentum(float *restrict p, const float *restrict g, float *restrict buf, size_t n, float wd,
                         const struct gw_sgd_scalars *sc) {
  const struct gw_sgd_scalars c = *sc;
  for (size_t i = 0; i < n; i++) gw_sgd_elem(&p[i], g[i], &buf[i], wd, &c);
}

void gw_sgd_apply(const struct gw_sgd_run *runs, int nruns, float *params, const float *grads, float *momentum,
                  const struct gw_sgd_scalars *sc) {
  for (int r = 0; r < nruns; r++) {
    const struct gw_sgd_run *u = &runs[r];
    if (momentum) run_momentum(params + u->offset, grads + u->offset, momentum + u->offset, u->len, u->wd, sc);
    else run_plain(params + u->offset, grads + u->offset, u->len, u->wd, sc);
  }
}

const struct gw_sgd_run *gw_sgd_runs(const struct gw_sgd *s, int *nruns) {
  *nruns = s->nruns;
  return s->runs;
}

void gw_sgd_scalars_at(const struct gw_sgd *s, float lr, float grad_scale, struct gw_sgd_scalars *out) {
  out->lr = lr, out->momentum = s->cfg.momentum, out->keep = 1.0f - s->cfg.dampening;
  out->grad_scale = grad_scale, out->nesterov = s->cfg.nesterov, out->first = s->steps == 0;
}

gw_result_t gw_sgd_step(struct gw_sgd *s, float *params, const float *grads, float lr) {
  if (!params || !grads) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "sgd: parameters and gradients required");
  if (!isfinite(lr) || lr < 0 || lr > 1e6f)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "sgd: learning rate %g must be finite, in [0, 1e6]", (double)lr);
  struct gw_sgd_scalars sc;
  gw_sgd_scalars_at(s, lr, 1.0f, &sc);
  gw_sgd_apply(s->runs, s->nruns, params, grads, s->buf, &sc);
  s->steps++;
  return GW_SUCCESS;
}

float *gw_sgd_momentum(struct gw_sgd *s) { return s->buf; }
int64_t gw_sgd_steps(const struct gw_sgd *s) { return s->steps; }
void gw_sgd_set_steps(struct gw_sgd *s, int64_t steps) { s->steps = steps < 0 ? 0 : steps; }
