/* backend_cpu_kernels_body.h - the cpu backend's loops (backend_cpu_kernels.c),
 * written once for any activation element type: backend_cpu_kernels.c includes
 * it once per type with
 *   T       the element type of activation tensors (float, uint16_t for bfloat16)
 *   IN(v)   an element as float
 *   OUT(x)  a float or double as an element (rounded once from float for bf16)
 *   KFN(n)  the name of the instance of loop n.
 * Parameters, statistics, sums and the loss are float / double whatever T is. */

/* The fused tail of batch norm's outputs (before rounding) over one plane:
 * rounded as bn would store them, plus z's elements as the residual add
 * computes them (in float, rounded once), then ReLU (a NaN passes): the bits of
 * the separate ops.  One straight loop per case, so each vectorizes. */
/* g where y > 0, else +0: ReLU's backward, as bits (no branch: the mask is
 * about half set, in no pattern a branch predictor could follow). */
static inline float KFN(keep_if_pos)(float y, float g) {
  uint32_t u;
  memcpy(&u, &g, sizeof u);
  u &= 0u - (uint32_t)(y > 0);
  memcpy(&g, &u, sizeof g);
  return g;
}

static void KFN(apply_plane)(const T *p, const T *zp, int relu, double scale, double shift, T *q, size_t hw) {
  if (!zp && !relu) {
    for (size_t i = 0; i < hw; i++) q[i] = OUT((double)IN(p[i]) * scale + shift);
  } else if (!zp) {
    for (size_t i = 0; i < hw; i++) {
      const float r = IN(OUT((double)IN(p[i]) * scale + shift));
      q[i] = OUT(r <= 0 ? 0.0f : r);
    }
  } else {
    for (size_t i = 0; i < hw; i++) {
      const float r = IN(OUT(IN(OUT((double)IN(p[i]) * scale + shift)) + IN(zp[i])));
      q[i] = relu ? OUT(r <= 0 ? 0.0f : r) : OUT(r);
    }
  }
}

static void KFN(bn_fwd_train)(const struct gw_op_desc *d, const T *x, const T *z, int relu, const float *gamma,
                              const float *beta, T *y, float *save_mean, float *save_rstd, float *running_mean,
                              float *running_var) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w, m = (size_t)d->n * hw;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    /* Two passes (mean, then squared deviations): exact enough where the mean is
     * large next to the spread, where sum(x^2) - m mean^2 would cancel. */
    double s = 0;
    for (int n = 0; n < d->n; n++) {
      const T *p = PLANE(x, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) s += IN(p[i]);
    }
    double mean = s / (double)m, ss = 0;
    for (int n = 0; n < d->n; n++) {
      const T *p = PLANE(x, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) ss += ((double)IN(p[i]) - mean) * ((double)IN(p[i]) - mean);
    }
    double var = ss / (double)m, rstd = 1.0 / sqrt(var + (double)d->eps);
    double scale = (double)gamma[ch] * rstd, shift = (double)beta[ch] - mean * scale;
    for (int n = 0; n < d->n; n++) {
      KFN(apply_plane)(PLANE(x, n, ch, c, hw), z ? PLANE(z, n, ch, c, hw) : NULL, relu, scale, shift,
                       PLANE(y, n, ch, c, hw), hw);
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

static void KFN(bn_fwd_infer)(const struct gw_op_desc *d, const T *x, const T *z, int relu, const float *gamma,
                              const float *beta, const float *running_mean, const float *running_var, T *y) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double scale = (double)gamma[ch] / sqrt((double)running_var[ch] + (double)d->eps);
    double shift = (double)beta[ch] - (double)running_mean[ch] * scale;
    for (int n = 0; n < d->n; n++) {
      KFN(apply_plane)(PLANE(x, n, ch, c, hw), z ? PLANE(z, n, ch, c, hw) : NULL, relu, scale, shift,
                       PLANE(y, n, ch, c, hw), hw);
    }
  }
}

/* With xhat = (x - mean) * rstd over the m = n * h * w values of a channel:
 * dbeta = sum dy, dgamma = sum dy * xhat,
 * dx = gamma * rstd / m * (m * dy - dbeta - xhat * dgamma).
 * With ym (the fused output, not NULL) dy is masked by ReLU first, and dz (not
 * NULL) gets the masked dy. */
static void KFN(bn_bwd)(const struct gw_op_desc *d, const T *x, const T *ym, const T *dy, const float *gamma,
                        const float *save_mean, const float *save_rstd, T *dx, T *dz, float *dgamma, float *dbeta) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w, m = (size_t)d->n * hw;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double mean = save_mean[ch], rstd = save_rstd[ch], sdy = 0, sdyx = 0;
    for (int n = 0; n < d->n; n++) {
      const T *p = PLANE(x, n, ch, c, hw), *g = PLANE(dy, n, ch, c, hw);
      if (ym) {
        const T *yp = PLANE(ym, n, ch, c, hw);
        for (size_t i = 0; i < hw; i++) {
          const float gv = KFN(keep_if_pos)(IN(yp[i]), IN(g[i]));
          sdy += gv;
          sdyx += (double)gv * (((double)IN(p[i]) - mean) * rstd);
        }
      } else {
        for (size_t i = 0; i < hw; i++) {
          sdy += IN(g[i]);
          sdyx += (double)IN(g[i]) * (((double)IN(p[i]) - mean) * rstd);
        }
      }
    }
    double k = (double)gamma[ch] * rstd, a = sdy / (double)m, bq = sdyx / (double)m;
    for (int n = 0; n < d->n; n++) {
      const T *p = PLANE(x, n, ch, c, hw), *g = PLANE(dy, n, ch, c, hw);
      T *q = PLANE(dx, n, ch, c, hw);
      if (ym) {
        const T *yp = PLANE(ym, n, ch, c, hw);
        T *zq = dz ? PLANE(dz, n, ch, c, hw) : NULL;
        if (zq)
          for (size_t i = 0; i < hw; i++) zq[i] = OUT(KFN(keep_if_pos)(IN(yp[i]), IN(g[i])));
        for (size_t i = 0; i < hw; i++) {
          const float gv = KFN(keep_if_pos)(IN(yp[i]), IN(g[i]));
          q[i] = OUT(k * ((double)gv - a - ((double)IN(p[i]) - mean) * rstd * bq));
        }
      } else {
        for (size_t i = 0; i < hw; i++) q[i] = OUT(k * ((double)IN(g[i]) - a - ((double)IN(p[i]) - mean) * rstd * bq));
      }
    }
    dgamma[ch] = (float)sdyx;
    dbeta[ch] = (float)sdy;
  }
}

/* SyncBatchNorm's phases: the same arithmetic as above, split where the sums
 * cross ranks. */
static void KFN(bn_sums)(const struct gw_op_desc *d, const T *x, double *sums) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double s = 0, sq = 0;
    for (int n = 0; n < d->n; n++) {
      const T *p = PLANE(x, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) s += IN(p[i]), sq += (double)IN(p[i]) * IN(p[i]);
    }
    sums[ch] = s, sums[c + ch] = sq;
  }
}

static void KFN(bn_fwd_apply)(const struct gw_op_desc *d, const T *x, const float *gamma, const float *beta,
                          const float *mean, const float *rstd, T *y) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double scale = (double)gamma[ch] * rstd[ch], shift = (double)beta[ch] - (double)mean[ch] * scale;
    for (int n = 0; n < d->n; n++) {
      const T *p = PLANE(x, n, ch, c, hw);
      T *q = PLANE(y, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) q[i] = OUT((double)IN(p[i]) * scale + shift);
    }
  }
}

static void KFN(bn_bwd_sums)(const struct gw_op_desc *d, const T *x, const T *dy, const float *mean,
                         const float *rstd, double *sums) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double mu = mean[ch], r = rstd[ch], sdy = 0, sdyx = 0;
    for (int n = 0; n < d->n; n++) {
      const T *p = PLANE(x, n, ch, c, hw), *g = PLANE(dy, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) sdy += IN(g[i]), sdyx += (double)IN(g[i]) * (((double)IN(p[i]) - mu) * r);
    }
    sums[ch] = sdy, sums[c + ch] = sdyx;
  }
}

static void KFN(bn_bwd_apply)(const struct gw_op_desc *d, const T *x, const T *dy, const float *gamma,
                          const float *mean, const float *rstd, const double *sums, double count, T *dx) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int ch = 0; ch < c; ch++) {
    double mu = mean[ch], r = rstd[ch], k = (double)gamma[ch] * r;
    double a = sums[ch] / count, bq = sums[c + ch] / count;
    for (int n = 0; n < d->n; n++) {
      const T *p = PLANE(x, n, ch, c, hw), *g = PLANE(dy, n, ch, c, hw);
      T *q = PLANE(dx, n, ch, c, hw);
      for (size_t i = 0; i < hw; i++) q[i] = OUT(k * ((double)IN(g[i]) - a - ((double)IN(p[i]) - mu) * r * bq));
    }
  }
}

static void KFN(avgpool_fwd)(const struct gw_op_desc *d, const T *x, T *y) {
  const size_t hw = (size_t)d->h * d->w, planes = (size_t)d->n * d->c;
  OMP_FOR
  for (size_t pl = 0; pl < planes; pl++) {
    double s = 0;
    for (size_t i = 0; i < hw; i++) s += IN(x[pl * hw + i]);
    y[pl] = OUT(s / (double)hw);
  }
}

static void KFN(avgpool_bwd)(const struct gw_op_desc *d, const T *dy, T *dx) {
  const size_t hw = (size_t)d->h * d->w, planes = (size_t)d->n * d->c;
  OMP_FOR
  for (size_t pl = 0; pl < planes; pl++) {
    T g = OUT((double)IN(dy[pl]) / (double)hw);
    for (size_t i = 0; i < hw; i++) dx[pl * hw + i] = g;
  }
}

/* PyTorch's CrossEntropyLoss(label_smoothing=s), mean over the batch: with
 * log p = log_softmax(logits) per row, loss_i = (1 - s) * -log p[label] +
 * s * mean_j(-log p_j), and dlogits = (softmax - (1 - s) * onehot - s / k) / n. */
static void KFN(loss_fwd_bwd)(const struct gw_op_desc *d, const T *logits, const int32_t *labels, float grad_scale,
                              float *loss,
                          T *dlogits) {
  const int k = d->k;
  const double s = d->label_smoothing;
  double total = 0;
  for (int n = 0; n < d->n; n++) {
    const T *z = logits + (size_t)n * k;
    T *g = dlogits + (size_t)n * k;
    double mx = IN(z[0]), sum = 0, zsum = 0;
    for (int j = 1; j < k; j++) mx = IN(z[j]) > mx ? IN(z[j]) : mx;
    for (int j = 0; j < k; j++) sum += exp((double)IN(z[j]) - mx), zsum += IN(z[j]);
    double lse = mx + log(sum);
    /* mean_j(-log p_j) = lse - mean_j(z_j) */
    total += (1 - s) * (lse - IN(z[labels[n]])) + s * (lse - zsum / k);
    for (int j = 0; j < k; j++) {
      double t = (1 - s) * (j == labels[n]) + s / k;
      g[j] = OUT((exp((double)IN(z[j]) - lse) - t) / d->n * grad_scale);
    }
  }
  *loss = (float)(total / d->n);
}

/* The residual add (also the sum of two gradients): in float, rounded once. */
static void KFN(add)(size_t n, const T *a, const T *b, T *y) {
  for (size_t i = 0; i < n; i++) y[i] = OUT(IN(a[i]) + IN(b[i]));
}
