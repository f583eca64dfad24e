/* backend_cpu_kernels.c - batch norm, global average pool and softmax
 * cross-entropy for the cpu backend, as plain C loops (see backend_cpu_kernels.h).
 *
 * Why not oneDNN here: its batch norm returns the variance, not 1/sqrt(var + eps),
 * and keeps no running statistics, so the saved statistics of backend.h would have
 * to be converted back and forth (losing precision when var is far below eps); the
 * other two are a sum per channel or row.  All of them are bound by memory
 * bandwidth, not arithmetic, so a loop over channels in parallel (OpenMP, when the
 * build has it) costs little.  Sums run in double, as PyTorch's CPU kernels
 * accumulate float in double (at::acc_type<float, false>). */
#include <math.h>
#include <stddef.h>

#include "backend_cpu_kernels.h"

#ifdef _OPENMP
#define OMP_FOR _Pragma("omp parallel for schedule(static)")
#else
#define OMP_FOR
#endif

/* Channel ch of sample n of an NCHW tensor with hw values per plane. */
#define PLANE(t, n, ch, c, hw) ((t) + ((size_t)(n) * (c) + (ch)) * (hw))

void gw__cpu_bn_fwd_train(const struct gw_op_desc *d, const float *x, const float *gamma, const float *beta, float *y,
                          float *save_mean, float *save_rstd, float *running_mean, float *running_var) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w, m = (size_t)d->n * hw;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    /* Two passes (mean, then squared deviations): exact enough where the mean is
     * large next to the spread, where sum(x^2) - m mean^2 would cancel. */
    double s = 0;
    for (int n = 0; n < d->n; n++) {
      const float *p = PLANE(x, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) s += p[i];
    }
    double mean = s / (double)m, ss = 0;
    for (int n = 0; n < d->n; n++) {
      const float *p = PLANE(x, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) ss += ((double)p[i] - mean) * ((double)p[i] - mean);
    }
    double var = ss / (double)m, rstd = 1.0 / sqrt(var + (double)d->eps);
    double scale = (double)gamma[ch] * rstd, shift = (double)beta[ch] - mean * scale;
    for (int n = 0; n < d->n; n++) {
      const float *p = PLANE(x, n, ch, c, hw);
      float *q = PLANE(y, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) q[i] = (float)((double)p[i] * scale + shift);
    }
    save_mean[ch] = (float)mean;
    save_rstd[ch] = (float)rstd;
    /* PyTorch's batch_norm_cpu_update_stats_template, in double, rounded once:
     * running = momentum * batch + (1 - momentum) * running, with the unbiased
     * variance ss / (m - 1). */
    double mom = (double)d->momentum;
    running_mean[ch] = (float)(mom * mean + (1 - mom) * (double)running_mean[ch]);
    running_var[ch] = (float)(mom * (ss / (double)(m - 1)) + (1 - mom) * (double)running_var[ch]);
  }
}

void gw__cpu_bn_fwd_infer(const struct gw_op_desc *d, const float *x, const float *gamma, const float *beta,
                          const float *running_mean, const float *running_var, float *y) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double scale = (double)gamma[ch] / sqrt((double)running_var[ch] + (double)d->eps);
    double shift = (double)beta[ch] - (double)running_mean[ch] * scale;
    for (int n = 0; n < d->n; n++) {
      const float *p = PLANE(x, n, ch, c, hw);
      float *q = PLANE(y, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) q[i] = (float)((double)p[i] * scale + shift);
    }
  }
}

/* With xhat = (x - mean) * rstd over the m = n * h * w values of a channel:
 * dbeta = sum dy, dgamma = sum dy * xhat,
 * dx = gamma * rstd / m * (m * dy - dbeta - xhat * dgamma). */
void gw__cpu_bn_bwd(const struct gw_op_desc *d, const float *x, const float *dy, const float *gamma,
                    const float *save_mean, const float *save_rstd, float *dx, float *dgamma, float *dbeta) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w, m = (size_t)d->n * hw;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double mean = save_mean[ch], rstd = save_rstd[ch], sdy = 0, sdyx = 0;
    for (int n = 0; n < d->n; n++) {
      const float *p = PLANE(x, n, ch, c, hw), *g = PLANE(dy, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) {
        sdy += g[i];
        sdyx += (double)g[i] * (((double)p[i] - mean) * rstd);
      }
    }
    double k = (double)gamma[ch] * rstd, a = sdy / (double)m, bq = sdyx / (double)m;
    for (int n = 0; n < d->n; n++) {
      const float *p = PLANE(x, n, ch, c, hw), *g = PLANE(dy, n, ch, c, hw);
      float *q = PLANE(dx, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) q[i] = (float)(k * ((double)g[i] - a - ((double)p[i] - mean) * rstd * bq));
    }
    dgamma[ch] = (float)sdyx;
    dbeta[ch] = (float)sdy;
  }
}

/* SyncBatchNorm's phases: the same arithmetic as above, split where the sums
 * cross ranks. */
void gw__cpu_bn_sums(const struct gw_op_desc *d, const float *x, double *sums) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double s = 0, sq = 0;
    for (int n = 0; n < d->n; n++) {
      const float *p = PLANE(x, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) s += p[i], sq += (double)p[i] * p[i];
    }
    sums[ch] = s, sums[c + ch] = sq;
  }
}

void gw__cpu_bn_fwd_apply(const struct gw_op_desc *d, const float *x, const float *gamma, const float *beta,
                          const float *mean, const float *rstd, float *y) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double scale = (double)gamma[ch] * rstd[ch], shift = (double)beta[ch] - (double)mean[ch] * scale;
    for (int n = 0; n < d->n; n++) {
      const float *p = PLANE(x, n, ch, c, hw);
      float *q = PLANE(y, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) q[i] = (float)((double)p[i] * scale + shift);
    }
  }
}

void gw__cpu_bn_bwd_sums(const struct gw_op_desc *d, const float *x, const float *dy, const float *mean,
                         const float *rstd, double *sums) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double mu = mean[ch], r = rstd[ch], sdy = 0, sdyx = 0;
    for (int n = 0; n < d->n; n++) {
      const float *p = PLANE(x, n, ch, c, hw), *g = PLANE(dy, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) sdy += g[i], sdyx += (double)g[i] * (((double)p[i] - mu) * r);
    }
    sums[ch] = sdy, sums[c + ch] = sdyx;
  }
}

void gw__cpu_bn_bwd_apply(const struct gw_op_desc *d, const float *x, const float *dy, const float *gamma,
                          const float *mean, const float *rstd, const double *sums, double count, float *dx) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double mu = mean[ch], r = rstd[ch], k = (double)gamma[ch] * r;
    double a = sums[ch] / count, bq = sums[c + ch] / count;
    for (int n = 0; n < d->n; n++) {
      const float *p = PLANE(x, n, ch, c, hw), *g = PLANE(dy, n, ch, c, hw);
      float *q = PLANE(dx, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) q[i] = (float)(k * ((double)g[i] - a - ((double)p[i] - mu) * r * bq));
    }
  }
}

void gw__cpu_avgpool_fwd(const struct gw_op_desc *d, const float *x, float *y) {
  const size_t hw = (size_t)d->h * d->w, planes = (size_t)d->n * d->c;
  OMP_FOR
  for (size_t pl = 0; pl < planes; pl++) {
    double s = 0;
    for (size_t i = 0; i < hw; i++) s += x[pl * hw + i];
    y[pl] = (float)(s / (double)hw);
  }
}

void gw__cpu_avgpool_bwd(const struct gw_op_desc *d, const float *dy, float *dx) {
  const size_t hw = (size_t)d->h * d->w, planes = (size_t)d->n * d->c;
  OMP_FOR
  for (size_t pl = 0; pl < planes; pl++) {
    float g = (float)((double)dy[pl] / (double)hw);
    for (size_t i = 0; i < hw; i++) dx[pl * hw + i] = g;
  }
}

/* PyTorch's CrossEntropyLoss(label_smoothing=s), mean over the batch: with
 * log p = log_softmax(logits) per row, loss_i = (1 - s) * -log p[label] +
 * s * mean_j(-log p_j), and dlogits = (softmax - (1 - s) * onehot - s / k) / n. */
void gw__cpu_loss_fwd_bwd(const struct gw_op_desc *d, const float *logits, const int32_t *labels, float *loss,
                          float *dlogits) {
  const int k = d->k;
  const double s = d->label_smoothing;
  double total = 0;
  for (int n = 0; n < d->n; n++) {
    const float *z = logits + (size_t)n * k;
    float *g = dlogits + (size_t)n * k;
    double mx = z[0], sum = 0, zsum = 0;
    for (int j = 1; j < k; j++) mx = z[j] > mx ? z[j] : mx;
    for (int j = 0; j < k; j++) sum += exp((double)z[j] - mx), zsum += z[j];
    double lse = mx + log(sum);
    /* mean_j(-log p_j) = lse - mean_j(z_j) */
    total += (1 - s) * (lse - z[labels[n]]) + s * (lse - zsum / k);
    for (int j = 0; j < k; j++) {
      double t = (1 - s) * (j == labels[n]) + s / k;
      g[j] = (float)((exp((double)z[j] - lse) - t) / d->n);
    }
  }
  *loss = (float)(total / d->n);
}
