/* gw-train-eval.c - scoring an evaluation batch: the training's loss (with its
 * label smoothing, as torchvision's evaluate() uses the training criterion),
 * plain cross-entropy and top-1 / top-5 per sample, each validation sample
 * counted exactly once across ranks.
 * The forward pass and the sums across ranks are gw-train-loop.c's. */
#include <math.h>
#include <stdbool.h>

#include "gw-train.h"
#include "loader.h"

/* The loss (PyTorch's CrossEntropyLoss(label_smoothing=ls): (1 - ls) x the
 * cross-entropy + ls x the mean over classes of -log p), the cross-entropy,
 * and whether the label is in the top 1 / 5.  A NaN logit ranks above every
 * number, and a NaN label's logit is in no top-k (a diverged model scores 0,
 * not 100%); the losses come out NaN.  A row with an infinite logit (fp32
 * overflowed: diverged too) is in no top-k either: ties of +inf ranked by
 * class index scored 10% and 48% with every logit +inf. */
static void score(const float *z, int k, int label, double ls, struct eval_counts *c) {
  double mx = z[0], s = 0, zsum = 0;
  int above = 0;
  bool unranked = isnan(z[label]);
  for (int j = 0; j < k; j++) unranked |= isinf(z[j]);
  for (int j = 1; j < k; j++) mx = z[j] > mx || isnan(z[j]) ? z[j] : mx;
  for (int j = 0; j < k; j++) {
    s += exp((double)z[j] - mx);
    zsum += z[j];
    above += j != label && (isnan(z[j]) || z[j] > z[label] || (z[j] == z[label] && j < label));
  }
  const double lse = mx + log(s), nll = lse - z[label];
  c->nll += nll;
  c->loss += ls > 0 ? (1 - ls) * nll + ls * (lse - zsum / k) : nll; /* 0 x inf is no term at 0 */
  c->top1 += !unranked && above < 1; /* a NaN label's logit, or an infinite logit, is in no top-k */
  c->top5 += !unranked && above < 5;
  c->n += 1;
}

void eval_score_batch(const float *logits, int k, const struct gw_batch *bt, int rank, int world, int64_t n,
                      double label_smoothing, struct eval_counts *c) {
  for (int i = 0; i < bt->n; i++) {
    /* The sampler pads the last shards by repeating the first samples: count
     * each sample once. */
    const int64_t global = rank + (int64_t)world * (bt->position + i);
    /* A sample standing in for an unreadable one is in the epoch at its own place too. */
    if (global < n && !bt->stand_in[i]) score(logits + (size_t)i * k, k, bt->y[i], label_smoothing, c);
    c->left_out += global < n && bt->stand_in[i];
  }
}
