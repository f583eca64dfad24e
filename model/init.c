/* init.c - torchvision's initialization of a ResNet: kaiming_normal_(mode=fan_out,
 * nonlinearity=relu) for every conv, BN gamma 1 and beta 0 (gamma 0 for the last BN
 * of each block with zero_init_residual), and nn.Linear's own default for fc
 * (kaiming_uniform_ with a = sqrt(5) for the weight, uniform(+-1/sqrt(fan_in)) for
 * the bias); BN buffers reset to running_mean 0, running_var 1, no batches seen.
 *
 * It draws from rng.h's streams, one per tensor keyed by (seed, name), so values
 * are reproducible bit for bit but not PyTorch's own random numbers.
 */
#include <math.h>
#include <string.h>

#include "model_internal.h"
#include "rng.h"

static void fill_normal(float *dst, size_t n, double std, struct gw_rng *r) {
  for (size_t i = 0; i < n; i++) dst[i] = (float)(std * gw__rng_normal(r));
}

static void fill_uniform(float *dst, size_t n, double bound, struct gw_rng *r) {
  for (size_t i = 0; i < n; i++) dst[i] = (float)(bound * (2.0 * gw__rng_uniform(r) - 1.0));
}

static void fill_const(float *dst, size_t n, float v) {
  for (size_t i = 0; i < n; i++) dst[i] = v;
}

static void init_param(struct gw_model *m, const struct gw_tensor *t, uint64_t seed, int zero_init_residual) {
  const struct gw_layer *l = &m->layers[t->layer];
  float *dst = m->param_data + t->offset;
  int is_weight = l->weight >= 0 && &m->params_t[l->weight] == t;
  struct gw_rng r;
  gw__rng_init(&r, seed, t->name);
  switch (l->kind) {
    case GW_LAYER_CONV: {
      /* fan_out = out_channels * kh * kw; gain sqrt(2) for relu. */
      double fan_out = (double)t->shape[0] * (double)t->shape[2] * (double)t->shape[3];
      fill_normal(dst, t->numel, sqrt(2.0) / sqrt(fan_out), &r);
      break;
    }
    case GW_LAYER_BN:
      if (is_weight) fill_const(dst, t->numel, zero_init_residual && l->block_last_bn ? 0.0f : 1.0f);
      else fill_const(dst, t->numel, 0.0f);
      break;
    case GW_LAYER_FC: {
      double fan_in = (double)m->params_t[l->weight].shape[1];
      if (is_weight) {
        /* kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + a^2)), bound gain * sqrt(3 / fan_in),
         * which is 1 / sqrt(fan_in). */
        double gain = sqrt(2.0 / (1.0 + 5.0));
        fill_uniform(dst, t->numel, gain * sqrt(3.0 / fan_in), &r);
      } else {
        fill_uniform(dst, t->numel, 1.0 / sqrt(fan_in), &r);
      }
      break;
    }
    default:
      break;
  }
}

void gw_model_reset_parameters(struct gw_model *m, uint64_t seed, int zero_init_residual) {
  for (int i = 0; i < m->nparams_t; i++) init_param(m, &m->params_t[i], seed, zero_init_residual);
  for (int i = 0; i < m->nbuffers_t; i++) {
    const struct gw_tensor *t = &m->buffers_t[i];
    if (t->kind == GW_TENSOR_COUNTER) {
      m->counter_data[t->offset] = 0;
    } else {
      int is_var = &m->buffers_t[m->layers[t->layer].running_var] == t;
      fill_const(m->running_data + t->offset, t->numel, is_var ? 1.0f : 0.0f);
    }
  }
  memset(m->grad_data, 0, m->num_params * sizeof(float));
}
