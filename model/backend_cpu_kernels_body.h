/* backend_cpu_kernels_body.h - the cpu backend's loops (backend_cpu_kernels.c),
 * written once for any activation element type and either layout:
 * backend_cpu_kernels.c includes it once per (type, layout) with
 *   T        the element type of activation tensors (float, uint16_t for bfloat16)
 *   IN(v)    an element as float
 *   OUT(x)   a float or double as an element (rounded once from float for bf16)
 *   KFN(n)   the name of the instance of loop n
 *   CB       channels per block (1 for NCHW; NHWC: a cache line's worth)
 *   AT(n, i, ch)  the offset of sample n, position i < hw, channel ch (with c and
 *            hw in scope).
 * Parameters, statistics, sums and the loss are float / double whatever T is.
 *
 * Every per-channel loop runs over blocks of CB channels (in parallel), and
 * within a block over the samples, then the positions, then the block's
 * channels: so each channel's values are summed in the same order (sample by
 * sample, position by position) in both layouts, and NHWC gives NCHW's bits.
 * NCHW's blocks are single channels (the inner loop runs over a plane, unit
 * stride); NHWC's innermost loop runs over the block's channels, which are
 * adjacent in memory.  Both vectorize. */

/* g where y > 0, else +0: ReLU's backward, as bits (no branch: the mask is
 * about half set, in no pattern a branch predictor could follow). */
static inline float KFN(keep_if_pos)(float y, float g) {
  uint32_t u;
  memcpy(&u, &g, sizeof u);
  u &= 0u - (uint32_t)(y > 0);
  memcpy(&g, &u, sizeof g);
  return g;
}

/* y = x * scale + shift over the block's channels, through the fused tail
 * (before rounding: rounded as bn would store it, plus z's element as the
 * residual add computes it (in float, rounded once), then ReLU, a NaN passing:
 * the bits of the separate ops).  One straight loop nest per case, so each
 * vectorizes.  y may alias x or z. */
static void KFN(apply_block)(const struct gw_op_desc *d, const T *x, const T *z, int relu, const double *scale,
                             const double *shift, T *y, int cb) {
  const int c = d->c, nb = NB(cb);
  const size_t hw = (size_t)d->h * d->w;
  if (!z && !relu) {
    BLOCK_LOOP(y[at] = OUT((double)IN(x[at]) * scale[k] + shift[k]));
  } else if (!z) {
    BLOCK_LOOP(const float r = IN(OUT((double)IN(x[at]) * scale[k] + shift[k])); y[at] = OUT(r <= 0 ? 0.0f : r));
  } else {
    BLOCK_LOOP(const float r = IN(OUT(IN(OUT((double)IN(x[at]) * scale[k] + shift[k])) + IN(z[at])));
               y[at] = relu ? OUT(r <= 0 ? 0.0f : r) : OUT(r));
  }
}

static void KFN(bn_fwd_train)(const struct gw_op_desc *d, const T *x, const T *z, int relu, const float *gamma,
                              const float *beta, T *y, float *save_mean, float *save_rstd, float *running_mean,
                              float *running_var) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w, m = (size_t)d->n * hw;
  OMP_FOR
  for (int cb = 0; cb < c; cb += CB) {
    const int nb = NB(cb);
    double s[CB], ss[CB], mean[CB], scale[CB], shift[CB];
    for (int k = 0; k < nb; k++) s[k] = 0, ss[k] = 0;
    /* Two passes (mean, then squared deviations): exact enough where the mean is
     * large next to the spread, where sum(x^2) - m mean^2 would cancel. */
    BLOCK_LOOP(s[k] += IN(x[at]));
    for (int k = 0; k < nb; k++) mean[k] = s[k] / (double)m;
    BLOCK_LOOP(ss[k] += ((double)IN(x[at]) - mean[k]) * ((double)IN(x[at]) - mean[k]));
    for (int k = 0; k < nb; k++) {
      const int ch = cb + k;
      double var = ss[k] / (double)m, rstd = 1.0 / sqrt(var + (double)d->eps);
      scale[k] = (double)gamma[ch] * rstd, shift[k] = (double)beta[ch] - mean[k] * scale[k];
      save_mean[ch] = (float)mean[k];
      save_rstd[ch] = (float)rstd;
      /* PyTorch's batch_norm_cpu_update_stats_template, in double, rounded once:
       * running = momentum * batch + (1 - momentum) * running, with the unbiased
       * variance ss / (m - 1). */
      double mom = (double)d->momentum;
      running_mean[ch] = (float)(mom * mean[k] + (1 - mom) * (double)running_mean[ch]);
      running_var[ch] = (float)(mom * (ss[k] / (double)(m - 1)) + (1 - mom) * (double)running_var[ch]);
    }
    KFN(apply_block)(d, x, z, relu, scale, shift, y, cb);
  }
}

static void KFN(bn_fwd_infer)(const struct gw_op_desc *d, const T *x, const T *z, int relu, const float *gamma,
                              const float *beta, const float *running_mean, const float *running_var, T *y) {
  const int c = d->c;
  OMP_FOR
  for (int cb = 0; cb < c; cb += CB) {
    const int nb = NB(cb);
    double scale[CB], shift[CB];
    for (int k = 0; k < nb; k++) {
      const int ch = cb + k;
      scale[k] = (double)gamma[ch] / sqrt((double)running_var[ch] + (double)d->eps);
      shift[k] = (double)beta[ch] - (double)running_mean[ch] * scale[k];
    }
    KFN(apply_block)(d, x, z, relu, scale, shift, y, cb);
  }
}

/* dx = gamma * rstd * (dy - sdy / m - xhat * sdyx / m) over the block's
 * channels, given per channel as mean, rstd, kk = gamma * rstd, a = sdy / m and
 * bq = sdyx / m.  With ym (the fused output, not NULL) dy is masked by ReLU
 * first, and dz (not NULL) gets the masked dy.  dx may alias dy. */
static void KFN(bwd_apply_block)(const struct gw_op_desc *d, const T *x, const T *ym, const T *dy,
                                 const double *mean, const double *rstd, const double *kk, const double *a,
                                 const double *bq, T *dx, T *dz, int cb) {
  const int c = d->c, nb = NB(cb);
  const size_t hw = (size_t)d->h * d->w;
  if (ym) {
    if (dz) BLOCK_LOOP(dz[at] = OUT(KFN(keep_if_pos)(IN(ym[at]), IN(dy[at]))));
    BLOCK_LOOP(const float gv = KFN(keep_if_pos)(IN(ym[at]), IN(dy[at]));
               dx[at] = OUT(kk[k] * ((double)gv - a[k] - ((double)IN(x[at]) - mean[k]) * rstd[k] * bq[k])));
  } else {
    BLOCK_LOOP(dx[at] = OUT(kk[k] * ((double)IN(dy[at]) - a[k] - ((double)IN(x[at]) - mean[k]) * rstd[k] * bq[k])));
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
  for (int cb = 0; cb < c; cb += CB) {
    const int nb = NB(cb);
    double mean[CB], rstd[CB], sdy[CB], sdyx[CB], kk[CB], a[CB], bq[CB];
    for (int k = 0; k < nb; k++) mean[k] = save_mean[cb + k], rstd[k] = save_rstd[cb + k], sdy[k] = 0, sdyx[k] = 0;
    if (ym) {
      BLOCK_LOOP(const float gv = KFN(keep_if_pos)(IN(ym[at]), IN(dy[at])); sdy[k] += gv;
                 sdyx[k] += (double)gv * (((double)IN(x[at]) - mean[k]) * rstd[k]));
    } else {
      BLOCK_LOOP(sdy[k] += IN(dy[at]); sdyx[k] += (double)IN(dy[at]) * (((double)IN(x[at]) - mean[k]) * rstd[k]));
    }
    for (int k = 0; k < nb; k++) {
      kk[k] = (double)gamma[cb + k] * rstd[k], a[k] = sdy[k] / (double)m, bq[k] = sdyx[k] / (double)m;
      dgamma[cb + k] = (float)sdyx[k];
      dbeta[cb + k] = (float)sdy[k];
    }
    KFN(bwd_apply_block)(d, x, ym, dy, mean, rstd, kk, a, bq, dx, dz, cb);
  }
}

/* SyncBatchNorm's phases: the same arithmetic as above, split where the sums
 * cross ranks. */
static void KFN(bn_sums)(const struct gw_op_desc *d, const T *x, double *sums) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int cb = 0; cb < c; cb += CB) {
    const int nb = NB(cb);
    double s[CB], sq[CB];
    for (int k = 0; k < nb; k++) s[k] = 0, sq[k] = 0;
    BLOCK_LOOP(s[k] += IN(x[at]); sq[k] += (double)IN(x[at]) * IN(x[at]));
    for (int k = 0; k < nb; k++) sums[cb + k] = s[k], sums[c + cb + k] = sq[k];
  }
}

static void KFN(bn_fwd_apply)(const struct gw_op_desc *d, const T *x, const float *gamma, const float *beta,
                              const float *mean, const float *rstd, T *y) {
  const int c = d->c;
  OMP_FOR
  for (int cb = 0; cb < c; cb += CB) {
    const int nb = NB(cb);
    double scale[CB], shift[CB];
    for (int k = 0; k < nb; k++) {
      const int ch = cb + k;
      scale[k] = (double)gamma[ch] * rstd[ch], shift[k] = (double)beta[ch] - (double)mean[ch] * scale[k];
    }
    KFN(apply_block)(d, x, NULL, 0, scale, shift, y, cb);
  }
}

static void KFN(bn_bwd_sums)(const struct gw_op_desc *d, const T *x, const T *dy, const float *mean,
                             const float *rstd, double *sums) {
  const int c = d->c;
  const size_t hw = (size_t)d->h * d->w;
  OMP_FOR
  for (int cb = 0; cb < c; cb += CB) {
    const int nb = NB(cb);
    double mu[CB], r[CB], sdy[CB], sdyx[CB];
    for (int k = 0; k < nb; k++) mu[k] = mean[cb + k], r[k] = rstd[cb + k], sdy[k] = 0, sdyx[k] = 0;
    BLOCK_LOOP(sdy[k] += IN(dy[at]); sdyx[k] += (double)IN(dy[at]) * (((double)IN(x[at]) - mu[k]) * r[k]));
    for (int k = 0; k < nb; k++) sums[cb + k] = sdy[k], sums[c + cb + k] = sdyx[k];
  }
}

static void KFN(bn_bwd_apply)(const struct gw_op_desc *d, const T *x, const T *dy, const float *gamma,
                              const float *mean, const float *rstd, const double *sums, double count, T *dx) {
  const int c = d->c;
  OMP_FOR
  for (int cb = 0; cb < c; cb += CB) {
    const int nb = NB(cb);
    double mu[CB], r[CB], kk[CB], a[CB], bq[CB];
    for (int k = 0; k < nb; k++) {
      const int ch = cb + k;
      mu[k] = mean[ch], r[k] = rstd[ch], kk[k] = (double)gamma[ch] * r[k];
      a[k] = sums[ch] / count, bq[k] = sums[c + ch] / count;
    }
    KFN(bwd_apply_block)(d, x, NULL, dy, mu, r, kk, a, bq, dx, NULL, cb);
  }
}

/* y [n, c] = the mean over each plane, summed position by position. */
static void KFN(avgpool_fwd)(const struct gw_op_desc *d, const T *x, T *y) {
  const int c = d->c, nblocks = (c + CB - 1) / CB;
  const size_t hw = (size_t)d->h * d->w, tasks = (size_t)d->n * nblocks;
  OMP_FOR
  for (size_t t = 0; t < tasks; t++) {
    const int n = (int)(t / nblocks), cb = (int)(t % nblocks) * CB, nb = NB(cb);
    double s[CB];
    for (int k = 0; k < nb; k++) s[k] = 0;
    for (size_t i = 0; i < hw; i++)
      for (int k = 0; k < nb; k++) s[k] += IN(x[AT(n, i, cb + k)]);
    for (int k = 0; k < nb; k++) y[(size_t)n * c + cb + k] = OUT(s[k] / (double)hw);
  }
}

static void KFN(avgpool_bwd)(const struct gw_op_desc *d, const T *dy, T *dx) {
  const int c = d->c, nblocks = (c + CB - 1) / CB;
  const size_t hw = (size_t)d->h * d->w, tasks = (size_t)d->n * nblocks;
  OMP_FOR
  for (size_t t = 0; t < tasks; t++) {
    const int n = (int)(t / nblocks), cb = (int)(t % nblocks) * CB, nb = NB(cb);
    T g[CB];
    for (int k = 0; k < nb; k++) g[k] = OUT((double)IN(dy[(size_t)n * c + cb + k]) / (double)hw);
    for (size_t i = 0; i < hw; i++)
      for (int k = 0; k < nb; k++) dx[AT(n, i, cb + k)] = g[k];
  }
}

#if FLAT_LOOPS /* once per type (the NCHW instance): these do not depend on the layout */
/* PyTorch's CrossEntropyLoss(label_smoothing=s), mean over the batch: with
 * log p = log_softmax(logits) per row, loss_i = (1 - s) * -log p[label] +
 * s * mean_j(-log p_j), and dlogits = (softmax - (1 - s) * onehot - s / k) / n. */
static void KFN(loss_fwd_bwd)(const struct gw_op_desc *d, const T *logits, const int32_t *labels, float grad_scale,
                              float *loss, T *dlogits) {
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
    /* mean_j(-log p_j) = lse - mean_j(z_j); only with smoothing (PyTorch's
     * branch): a logit of -inf makes it infinite, and 0 x inf NaN */
    total += (1 - s) * (lse - IN(z[labels[n]])) + (s > 0 ? s * (lse - zsum / k) : 0);
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
#endif
