/* test_model_backend_train.c - the model-backend test's training entries, for a
 * trainer that keeps the weights on the backend: sgd_step gives the bits of the
 * host optimizer (gw_sgd_step, sgd.c) over a real model's runs of weight decay,
 * with plain, momentum and Nesterov steps and a loss-scale unscale fused in;
 * nonfinite finds one inf or NaN anywhere and nothing in finite data; stream is
 * NULL exactly for a host backend (cpu) and a CUDA stream otherwise; staged
 * uploads survive the optimizer's steps between them; time marks. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model_backend_util.h"
#include "sgd.h"
#include "sgd_math.h"

/* A ResNet-18 at 1/16 width: 100k parameters in runs with and without decay. */
static struct gw_model *small_model(void) {
  struct gw_model_config cfg;
  gw_model_config_default(&cfg);
  cfg.depth = 18, cfg.classes = 5, cfg.in_channels = 3, cfg.image_size = 16, cfg.stem = GW_STEM_SMALL;
  cfg.width_divisor = 16, cfg.seed = 3;
  struct gw_model *m = NULL;
  ck_assert_msg(gw_model_init(&m, &cfg) == GW_SUCCESS, "%s", gw_model_last_error());
  return m;
}

/* Three steps of sgd_step on the backend against gw_sgd_step on the host,
 * whose gradients are the backend's times the grad scale (what the fused
 * unscale computes): every parameter and momentum
 * value equal to the bit. */
static void sgd_case(const struct gw_sgd_config *cfg, float grad_scale, const char *label) {
  struct gw_backend *b = backend();
  struct gw_model *m = small_model();
  const size_t np = gw_model_num_params(m);
  struct gw_sgd *host = NULL, *dev = NULL;
  ck_assert(gw_sgd_create(m, cfg, &host) == GW_SUCCESS && gw_sgd_create(m, cfg, &dev) == GW_SUCCESS);
  int nruns = 0;
  const struct gw_sgd_run *runs = gw_sgd_runs(dev, &nruns);
  ck_assert_msg(cfg->decay_all ? nruns == 1 : nruns > 2, "%s: %d runs of weight decay", label, nruns);
  float *p = malloc(np * sizeof *p), *g = malloc(np * sizeof *g), *gh = malloc(np * sizeof *gh);
  float *back = malloc(np * sizeof *back);
  ck_assert(p && g && gh && back);
  fill(p, np, 11);
  struct tensor tp = tensor_of(b, p, np), tg = tensor_new(b, np), tm = tensor_new(b, np);
  const float lrs[3] = {0.1f, 0.05f, 0.3f};
  for (int step = 0; step < 3; step++) {
    fill(g, np, 100 + (uint64_t)step);
    memcpy(tg.h, g, np * sizeof *g);
    up(tg);
    for (size_t i = 0; i < np; i++) gh[i] = g[i] * grad_scale; /* the host's gradients come unscaled */
    struct gw_sgd_scalars sc;
    gw_sgd_scalars_at(dev, lrs[step], grad_scale, &sc);
    ck_assert_int_eq(sc.first, step == 0);
    ck_assert_msg(be->sgd_step(b, runs, nruns, tp.d, tg.d, cfg->momentum > 0 ? tm.d : NULL, &sc) == GW_SUCCESS,
                  "%s", gw_model_last_error());
    gw_sgd_set_steps(dev, gw_sgd_steps(dev) + 1);
    ck_assert(gw_sgd_step(host, p, gh, lrs[step]) == GW_SUCCESS);
  }
  from_backend(b, back, tp.d, np * sizeof *back);
  for (size_t i = 0; i < np; i++)
    ck_assert_msg(!memcmp(&back[i], &p[i], sizeof(float)), "%s: parameter %zu: %a on %s, %a on the host", label, i,
                  (double)back[i], chosen, (double)p[i]);
  if (cfg->momentum > 0) {
    from_backend(b, back, tm.d, np * sizeof *back);
    const float *hm = gw_sgd_momentum(host);
    for (size_t i = 0; i < np; i++)
      ck_assert_msg(!memcmp(&back[i], &hm[i], sizeof(float)), "%s: momentum %zu: %a on %s, %a on the host", label,
                    i, (double)back[i], chosen, (double)hm[i]);
  }
  tensor_free(tp), tensor_free(tg), tensor_free(tm);
  free(p), free(g), free(gh), free(back);
  gw_sgd_free(host), gw_sgd_free(dev);
  gw_model_free(m);
  be->destroy(b);
}

START_TEST(test_sgd_step_bits) {
  sgd_case(&(struct gw_sgd_config){.momentum = 0, .weight_decay = 1e-4f}, 1.0f, "plain");
  sgd_case(&(struct gw_sgd_config){.momentum = 0.9f, .weight_decay = 5e-5f}, 1.0f, "momentum");
  sgd_case(&(struct gw_sgd_config){.momentum = 0.9f, .weight_decay = 1e-4f, .nesterov = 1}, 1.0f / 65536,
           "nesterov, unscaled by 1/65536");
  sgd_case(&(struct gw_sgd_config){.momentum = 0.8f, .dampening = 0.25f, .weight_decay = 3e-4f, .decay_all = 1},
           0.5f, "dampening, decay on every tensor, unscaled by 1/2");
}
END_TEST

START_TEST(test_nonfinite) {
  struct gw_backend *b = backend();
  const size_t n = 300001; /* not a multiple of any block */
  struct tensor t = tensor_new(b, n);
  fill(t.h, n, 9);
  up(t);
  int found = -1;
  ck_assert(be->nonfinite(b, t.d, n, &found) == GW_SUCCESS);
  ck_assert_msg(found == 0, "finite data reported as overflowed on %s", chosen);
  const size_t at[] = {0, 77777, n - 1};
  const float bad[] = {INFINITY, -INFINITY, NAN};
  for (size_t k = 0; k < 3; k++) {
    fill(t.h, n, 9);
    t.h[at[k]] = bad[k];
    up(t);
    found = -1;
    ck_assert(be->nonfinite(b, t.d, n, &found) == GW_SUCCESS);
    ck_assert_msg(found == 1, "%g at %zu of %zu not found on %s", (double)bad[k], at[k], n, chosen);
    found = -1; /* only the elements asked about count */
    if (at[k] > 0) ck_assert(be->nonfinite(b, t.d, at[k], &found) == GW_SUCCESS && found == 0);
  }
  found = -1;
  ck_assert(be->nonfinite(b, t.d, 0, &found) == GW_SUCCESS && found == 0);
  ck_assert(be->nonfinite(b, t.d, n, NULL) == GW_ERR_INVALID_ARGUMENT);
  tensor_free(t);
  ck_assert_msg((be->stream(b) == NULL) == (be->host_memory != 0), "%s: stream %p with host_memory %d", chosen,
                be->stream(b), be->host_memory);
  be->destroy(b);
}
END_TEST

/* The order gw-train's resident step takes: a batch staged (upload_async),
 * the optimizer's first sgd_step (its runs uploaded), then the staged batch
 * read (upload_order) and the next staged into the other slot, each slot
 * twice: every transfer arrives whole, and the optimizer's work in between
 * leaves the staging alone (a first version's run upload tore the copy stream
 * and the pinned buffers down). */
START_TEST(test_staging_around_sgd_step) {
  struct gw_backend *b = backend();
  struct gw_model *m = small_model();
  const size_t np = gw_model_num_params(m), nb = 50000;
  struct gw_sgd_config cfg = {.momentum = 0.9f, .weight_decay = 1e-4f};
  struct gw_sgd *sgd = NULL;
  ck_assert(gw_sgd_create(m, &cfg, &sgd) == GW_SUCCESS);
  int nruns = 0;
  const struct gw_sgd_run *runs = gw_sgd_runs(sgd, &nruns);
  float *p = malloc(np * sizeof *p), *src = malloc(nb * sizeof *src), *back = malloc(nb * sizeof *back);
  ck_assert(p && src && back);
  fill(p, np, 5);
  struct tensor tp = tensor_of(b, p, np), tg = tensor_of(b, p, np), tm = tensor_new(b, np);
  float *slot[2];
  for (int k = 0; k < 2; k++) ck_assert(slot[k] = be->alloc(b, nb * sizeof(float)));
  fill(src, nb, 40);
  ck_assert_msg(be->upload_async(b, slot[0], src, nb * sizeof(float), 0) == GW_SUCCESS, "%s", gw_model_last_error());
  for (int step = 0; step < 4; step++) {
    const int k = step % 2;
    struct gw_sgd_scalars sc;
    gw_sgd_scalars_at(sgd, 0.1f, 1.0f, &sc);
    ck_assert_msg(be->sgd_step(b, runs, nruns, tp.d, tg.d, tm.d, &sc) == GW_SUCCESS, "step %d: %s", step,
                  gw_model_last_error());
    gw_sgd_set_steps(sgd, gw_sgd_steps(sgd) + 1);
    ck_assert_msg(be->upload_order(b, k) == GW_SUCCESS, "step %d: %s", step, gw_model_last_error());
    from_backend(b, back, slot[k], nb * sizeof(float));
    fill(src, nb, 40 + (uint64_t)step);
    ck_assert_msg(!memcmp(back, src, nb * sizeof(float)), "step %d: slot %d does not hold its staged batch on %s", step,
                  k, chosen);
    fill(src, nb, 41 + (uint64_t)step);
    ck_assert_msg(be->upload_async(b, slot[k ^ 1], src, nb * sizeof(float), k ^ 1) == GW_SUCCESS, "step %d: %s", step,
                  gw_model_last_error());
  }
  for (int k = 0; k < 2; k++) be->dealloc(b, slot[k]);
  tensor_free(tp), tensor_free(tg), tensor_free(tm);
  free(p), free(src), free(back);
  gw_sgd_free(sgd);
  gw_model_free(m);
  be->destroy(b);
}
END_TEST

/* Time marks (profiles): taken after the work queued, elapsed between them
 * non-negative and in order, any slot below GW_BACKEND_MARKS usable and
 * reusable; a slot out of range or never taken is refused. */
START_TEST(test_marks) {
  struct gw_backend *b = backend();
  ck_assert(be->mark && be->mark_elapsed);
  const size_t n = 1 << 20;
  struct tensor t = tensor_new(b, n);
  int found = -1;
  double s01 = -1, s02 = -1, s12 = -1;
  ck_assert_msg(be->mark(b, 0) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert(be->nonfinite(b, t.d, n, &found) == GW_SUCCESS);
  ck_assert(be->mark(b, 1) == GW_SUCCESS);
  ck_assert(be->nonfinite(b, t.d, n, &found) == GW_SUCCESS);
  ck_assert(be->mark(b, GW_BACKEND_MARKS - 1) == GW_SUCCESS);
  ck_assert_msg(be->mark_elapsed(b, 0, 1, &s01) == GW_SUCCESS, "%s", gw_model_last_error());
  ck_assert(be->mark_elapsed(b, 0, GW_BACKEND_MARKS - 1, &s02) == GW_SUCCESS);
  ck_assert(be->mark_elapsed(b, 1, GW_BACKEND_MARKS - 1, &s12) == GW_SUCCESS);
  ck_assert_msg(s01 >= 0 && s12 >= 0 && s02 >= s01 && s02 >= s12 && s02 < 60, "marks: %g, %g, %g s on %s", s01, s12,
                s02, chosen);
  ck_assert(be->mark(b, 0) == GW_SUCCESS); /* reused: now after everything */
  ck_assert(be->mark_elapsed(b, 1, 0, &s01) == GW_SUCCESS && s01 >= 0);
  ck_assert_int_eq(be->mark(b, -1), GW_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(be->mark(b, GW_BACKEND_MARKS), GW_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(be->mark_elapsed(b, 0, 2, &s01), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_model_last_error(), "never taken"), "%s", gw_model_last_error());
  ck_assert_int_eq(be->mark_elapsed(b, 0, GW_BACKEND_MARKS, &s01), GW_ERR_INVALID_ARGUMENT);
  tensor_free(t);
  be->destroy(b);
}
END_TEST

void add_train_tests(TCase *tc) {
  tcase_add_test(tc, test_marks);
  tcase_add_test(tc, test_sgd_step_bits);
  tcase_add_test(tc, test_nonfinite);
  tcase_add_test(tc, test_staging_around_sgd_step);
}
