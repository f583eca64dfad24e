/* test_model_backend_layout.c - NHWC against NCHW on one backend (part of the
 * model-backend test): batch norm (every entry: training, inference, backward,
 * fused with ReLU and with the residual add + ReLU, and SyncBatchNorm's four
 * phases), max pool and global average pool give the same bits in both layouts
 * (backend.h: each channel's values are summed in the same order; the cpu
 * backend's max pool backward, oneDNN's, only up to rounding), for every
 * activation dtype the backend takes.  Shapes include channel counts that fill
 * no whole block of the NHWC loops (5, 40) and planes of odd sizes.
 * Convolutions and the fc layer (whose weights an NHWC backend transposes)
 * give the same values up to their libraries' summation orders; the whole
 * suite run with "nhwc" (model-backend-nhwc) holds them to the references. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "model_backend_util.h"

/* The two backends (NCHW, NHWC) of one activation dtype. */
struct pair {
  struct gw_backend *b[2];
  int act;
  size_t esz;
};

/* Makes the pair; 0 when the backend does not take act (nothing to compare). */
static int pair_make(struct pair *p, int act) {
  p->act = act;
  p->esz = act == GW_FLOAT32 ? 4 : 2;
  for (int l = 0; l < 2; l++) {
    struct gw_backend_config cfg = strict_config();
    cfg.act = act, cfg.layout = l ? GW_LAYOUT_NHWC : GW_LAYOUT_NCHW;
    p->b[l] = NULL;
    gw_result_t r = be->create(&cfg, &p->b[l]);
    if (r == GW_ERR_UNSUPPORTED && l == 0) return 0;
    ck_assert_msg(r == GW_SUCCESS, "layout %d, dtype %d: %s", l, act, gw_model_last_error());
  }
  return 1;
}

static void pair_free(struct pair *p) {
  for (int l = 0; l < 2; l++) be->destroy(p->b[l]);
}

/* An element-size-generic NCHW <-> NHWC transpose of [n, c, h, w]. */
static void transpose_raw(void *dst, const void *src, size_t esz, const int *s, int to_nhwc) {
  const size_t hw = (size_t)s[2] * s[3];
  for (int n = 0; n < s[0]; n++)
    for (int c = 0; c < s[1]; c++)
      for (size_t i = 0; i < hw; i++) {
        const size_t a = ((size_t)n * s[1] + c) * hw + i, b = ((size_t)n * hw + i) * s[1] + c;
        memcpy((char *)dst + esz * (to_nhwc ? b : a), (const char *)src + esz * (to_nhwc ? a : b), esz);
      }
}

static size_t elems(const int *s) { return (size_t)s[0] * s[1] * s[2] * s[3]; }

/* An activation in both backends from NCHW float values (converted to the
 * dtype, transposed for the NHWC one): t[0] in p->b[0], t[1] in p->b[1]. */
static void act_put(const struct pair *p, void *const t[2], const float *nchw, const int *s) {
  const size_t n = elems(s);
  void *raw = malloc(n * p->esz), *tr = malloc(n * p->esz);
  ck_assert(raw && tr);
  if (p->esz == 4) memcpy(raw, nchw, n * 4);
  else gw_f32_to_half_n(p->act == GW_FLOAT16, raw, nchw, n);
  transpose_raw(tr, raw, p->esz, s, 1);
  to_backend(p->b[0], t[0], raw, n * p->esz);
  to_backend(p->b[1], t[1], tr, n * p->esz);
  free(raw), free(tr);
}

/* Both backends' copies of an activation, downloaded and the NHWC one put back
 * in NCHW order: the same bytes, or the test fails naming the first element. */
static void act_same(const struct pair *p, void *const t[2], const int *s, const char *what) {
  const size_t n = elems(s);
  char *a = malloc(n * p->esz), *raw = malloc(n * p->esz), *b = malloc(n * p->esz);
  ck_assert(a && raw && b);
  from_backend(p->b[0], a, t[0], n * p->esz);
  from_backend(p->b[1], raw, t[1], n * p->esz);
  transpose_raw(b, raw, p->esz, s, 0);
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(!memcmp(a + i * p->esz, b + i * p->esz, p->esz),
                  "%s (dtype %d, [%d, %d, %d, %d]): element %zu (NCHW order) differs between NCHW and NHWC", what,
                  p->act, s[0], s[1], s[2], s[3], i);
  free(a), free(raw), free(b);
}

/* As act_same, within tol (as floats) instead of to the bit. */
static void act_close(const struct pair *p, void *const t[2], const int *s, double tol, const char *what) {
  const size_t n = elems(s);
  char *a = malloc(n * p->esz), *raw = malloc(n * p->esz), *b = malloc(n * p->esz);
  float *fa = malloc(n * sizeof(float)), *fb = malloc(n * sizeof(float));
  ck_assert(a && raw && b && fa && fb);
  from_backend(p->b[0], a, t[0], n * p->esz);
  from_backend(p->b[1], raw, t[1], n * p->esz);
  transpose_raw(b, raw, p->esz, s, 0);
  if (p->esz == 4) {
    memcpy(fa, a, n * 4), memcpy(fb, b, n * 4);
  } else {
    gw_half_to_f32_n(p->act == GW_FLOAT16, fa, (const uint16_t *)a, n);
    gw_half_to_f32_n(p->act == GW_FLOAT16, fb, (const uint16_t *)b, n);
  }
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(fabs((double)fa[i] - fb[i]) <= tol, "%s (dtype %d, [%d, %d, %d, %d]): element %zu (NCHW order) is "
                  "%.9g in NCHW, %.9g in NHWC (tolerance %g)", what, p->act, s[0], s[1], s[2], s[3], i,
                  (double)fa[i], (double)fb[i], tol);
  free(a), free(raw), free(b), free(fa), free(fb);
}

/* A float vector of c values (parameters, statistics, sums) in both backends. */
static void vec_put(const struct pair *p, void *const t[2], const void *v, size_t bytes) {
  for (int l = 0; l < 2; l++) to_backend(p->b[l], t[l], v, bytes);
}

static void vec_same(const struct pair *p, void *const t[2], size_t bytes, const char *what) {
  char *a = malloc(bytes), *b = malloc(bytes);
  ck_assert(a && b);
  from_backend(p->b[0], a, t[0], bytes);
  from_backend(p->b[1], b, t[1], bytes);
  ck_assert_msg(!memcmp(a, b, bytes), "%s (dtype %d): differs between NCHW and NHWC", what, p->act);
  free(a), free(b);
}

/* Fills the two layouts' copies of an output with different bytes (0xa5 and
 * 0x5a: far apart as any float type), so one no call wrote differs. */
static void poison(const struct pair *p, void *const t[2], size_t bytes) {
  unsigned char *h = malloc(bytes);
  ck_assert(h);
  for (int l = 0; l < 2; l++) {
    memset(h, l ? 0x5a : 0xa5, bytes);
    to_backend(p->b[l], t[l], h, bytes);
  }
  free(h);
}

/* k buffers of `bytes` in each backend: bufs[i][layout], poisoned. */
static void bufs_alloc(const struct pair *p, void *bufs[][2], int k, size_t bytes) {
  for (int i = 0; i < k; i++) {
    for (int l = 0; l < 2; l++) ck_assert(bufs[i][l] = be->alloc(p->b[l], bytes));
    poison(p, bufs[i], bytes);
  }
}

static void bufs_free(const struct pair *p, void *bufs[][2], int k) {
  for (int i = 0; i < k; i++)
    for (int l = 0; l < 2; l++) be->dealloc(p->b[l], bufs[i][l]);
}

static const int act_dtypes[] = {GW_FLOAT32, GW_BFLOAT16, GW_FLOAT16};

/* Values whose double sums depend on their order: along each plane, +2^40 and
 * -2^40 in turn between values of order 1, so what a small value keeps of its
 * bits depends on whether the sum is near 2^40 when it comes (float32 and
 * bfloat16 only: every sum of float16 values this short is exact in double). */
static void cancelling(float *h, const int *s) {
  const size_t hw = (size_t)s[2] * s[3];
  for (size_t e = 0; e < elems(s); e++) {
    const size_t i = e % hw;
    if (i % 4 == 0 && i + 2 < hw) h[e] = 0x1p40f; /* each with its -2^40: the sum is of order 1 */
    else if (i % 4 == 2) h[e] = -0x1p40f;
    else h[e] = h[e] * 3.f + 1.f;
  }
}

#define BOTH(call)                                                                                    \
  for (int l = 0; l < 2; l++) ck_assert_msg((call) == GW_SUCCESS, "layout %d: %s", l, gw_model_last_error())

enum { X, Z, DY, Y, DX, DZ, NA };             /* activations */
enum { GAMMA, BETA, MEAN, RSTD, RM, RV, DG, DB, SUMS, NV }; /* per channel */

static void bn_case(const struct pair *p, const int *s, uint64_t seed, int cancel) {
  struct gw_op_desc d = same_desc(GW_LAYER_BN, s[0], s[1], s[2], s[3]);
  d.eps = 1e-5, d.momentum = 0.1;
  const size_t n = elems(s), c = (size_t)s[1];
  void *a[NA][2], *v[NV][2];
  bufs_alloc(p, a, NA, n * p->esz);
  bufs_alloc(p, v, NV, 2 * c * sizeof(double));
  float *h = malloc(n * sizeof(float)), *hc = malloc(2 * c * sizeof(float));
  ck_assert(h && hc);
  for (int i = X; i <= DY; i++) {
    fill(h, n, seed + (uint64_t)i);
    if (i == X && cancel) cancelling(h, s);
    else if (i == X)
      for (size_t e = 0; e < n; e++) h[e] = h[e] * 2.f + 0.5f; /* a mean and spread away from 0 and 1 */
    act_put(p, a[i], h, s);
  }
  for (int i = GAMMA; i <= BETA; i++) {
    fill(hc, c, seed + 10 + (uint64_t)i);
    vec_put(p, v[i], hc, c * sizeof(float));
  }
  struct gw_op *op[2];
  BOTH(be->op_create(p->b[l], &d, &op[l]));
  const size_t cb = c * sizeof(float);
  for (int fused = 0; fused < 3; fused++) { /* plain, + ReLU, + residual add + ReLU */
    if (fused && !be->bn_act_fwd_train) break;
    for (size_t i = 0; i < c; i++) hc[i] = 0.1f * (float)i, hc[c + i] = 1.f + 0.25f * (float)i;
    vec_put(p, v[RM], hc, cb), vec_put(p, v[RV], hc + c, cb);
    const int zi = fused == 2 ? Z : -1;
    for (int i = Y; i <= DZ; i++) poison(p, a[i], n * p->esz); /* what this round's calls write */
    for (int i = MEAN; i <= RSTD; i++) poison(p, v[i], cb);
    for (int i = DG; i <= DB; i++) poison(p, v[i], cb);
#define ZP(l) (zi >= 0 ? a[Z][l] : NULL)
    if (!fused) {
      BOTH(be->bn_fwd_train(op[l], a[X][l], v[GAMMA][l], v[BETA][l], a[Y][l], v[MEAN][l], v[RSTD][l], v[RM][l],
                            v[RV][l]));
      BOTH(be->bn_bwd(op[l], a[X][l], a[DY][l], v[GAMMA][l], v[MEAN][l], v[RSTD][l], a[DX][l], v[DG][l], v[DB][l]));
    } else {
      BOTH(be->bn_act_fwd_train(op[l], a[X][l], ZP(l), v[GAMMA][l], v[BETA][l], a[Y][l], v[MEAN][l], v[RSTD][l],
                                v[RM][l], v[RV][l]));
      BOTH(be->bn_act_bwd(op[l], a[X][l], a[Y][l], a[DY][l], v[GAMMA][l], v[MEAN][l], v[RSTD][l], a[DX][l],
                          zi >= 0 ? a[DZ][l] : NULL, v[DG][l], v[DB][l]));
      if (zi >= 0) act_same(p, a[DZ], s, "bn_act_bwd dz");
    }
    char what[64];
    snprintf(what, sizeof what, "batch norm training (fusion %d)", fused);
    act_same(p, a[Y], s, what);
    act_same(p, a[DX], s, what);
    vec_same(p, v[MEAN], cb, "save_mean"), vec_same(p, v[RSTD], cb, "save_rstd");
    vec_same(p, v[RM], cb, "running_mean"), vec_same(p, v[RV], cb, "running_var");
    vec_same(p, v[DG], cb, "dgamma"), vec_same(p, v[DB], cb, "dbeta");
    poison(p, a[Y], n * p->esz);
    if (!fused) BOTH(be->bn_fwd_infer(op[l], a[X][l], v[GAMMA][l], v[BETA][l], v[RM][l], v[RV][l], a[Y][l]));
    else BOTH(be->bn_act_fwd_infer(op[l], a[X][l], ZP(l), v[GAMMA][l], v[BETA][l], v[RM][l], v[RV][l], a[Y][l]));
    act_same(p, a[Y], s, "batch norm inference");
#undef ZP
  }
  /* SyncBatchNorm's phases, with the statistics of the training call above
   * (their outputs poisoned: Y and DX still hold the equal results of it). */
  poison(p, v[SUMS], 2 * c * sizeof(double));
  BOTH(be->bn_sums(op[l], a[X][l], v[SUMS][l]));
  vec_same(p, v[SUMS], 2 * c * sizeof(double), "bn_sums");
  poison(p, a[Y], n * p->esz);
  BOTH(be->bn_fwd_apply(op[l], a[X][l], v[GAMMA][l], v[BETA][l], v[MEAN][l], v[RSTD][l], a[Y][l]));
  act_same(p, a[Y], s, "bn_fwd_apply");
  poison(p, v[SUMS], 2 * c * sizeof(double));
  BOTH(be->bn_bwd_sums(op[l], a[X][l], a[DY][l], v[MEAN][l], v[RSTD][l], v[SUMS][l]));
  vec_same(p, v[SUMS], 2 * c * sizeof(double), "bn_bwd_sums");
  poison(p, a[DX], n * p->esz);
  BOTH(be->bn_bwd_apply(op[l], a[X][l], a[DY][l], v[GAMMA][l], v[MEAN][l], v[RSTD][l], v[SUMS][l],
                        (double)s[0] * s[2] * s[3], a[DX][l]));
  act_same(p, a[DX], s, "bn_bwd_apply");
  for (int l = 0; l < 2; l++) be->op_destroy(op[l]);
  bufs_free(p, a, NA);
  bufs_free(p, v, NV);
  free(h), free(hc);
}

/* On cudnn three more shapes take several pieces of the per-channel sums
 * (n h w > 8192) with channels that fill no tile, the last more than 256
 * pieces (the second pass chains pieces per thread, and the grid's y walks
 * them), and every shape runs twelve times: one channel per lane in the NHWC
 * sums (GW_BN_NHWC_PAIRS=0) and one block per piece (GW_BN_NHWC_GROUPS=1);
 * two channels per lane where c is even (the backward sums take two for the
 * 16-bit types only; always one block per piece); one channel per lane with the blocks per
 * piece the kernels choose (8 for these small grids); with 2; and with 4
 * (what ResNet-50's last stage takes on 132 SMs); all five in variant 0 of
 * the kernels (GW_BN_NHWC_KERNEL), then variants 1 and 2 with one channel
 * per lane (1 and 8 blocks per piece, 2 and 4) and two, and each shape's
 * timed plan (all three knobs auto).
 * (The cpu backend's loops have no pieces, and its large shapes would cost
 * 40 s.) */
START_TEST(test_layout_bn_bits) {
  static const int shapes[][4] = {{2, 64, 7, 7}, {3, 5, 4, 6}, {2, 40, 3, 3}, {4, 16, 1, 1}, {4, 130, 48, 48},
                                  {3, 70, 57, 61}, {40, 6, 240, 240}};
  static const struct {
    const char *pairs, *groups, *kernel;
  } passes[] = {{"0", "1", "0"}, {"1", "1", "0"}, {"0", "auto", "0"}, {"0", "2", "0"}, {"0", "4", "0"},
                {"0", "1", "1"}, {"1", "1", "1"}, {"0", "8", "1"},    {"0", "2", "2"}, {"0", "4", "2"},
                {"1", "1", "2"}, {"auto", "auto", "auto"}};
  const int cudnn = strcmp(chosen, "cudnn") == 0, nshapes = cudnn ? 7 : 4;
  for (int pass = 0; pass < (cudnn ? (int)(sizeof passes / sizeof passes[0]) : 1); pass++) {
    /* read by the cudnn kernels at each call */
    setenv("GW_BN_NHWC_PAIRS", passes[pass].pairs, 1);
    setenv("GW_BN_NHWC_GROUPS", passes[pass].groups, 1);
    setenv("GW_BN_NHWC_KERNEL", passes[pass].kernel, 1);
    for (size_t di = 0; di < sizeof act_dtypes / sizeof act_dtypes[0]; di++) {
      struct pair p;
      if (!pair_make(&p, act_dtypes[di])) continue;
      for (int si = 0; si < nshapes; si++) bn_case(&p, shapes[si], 100 + 10 * (uint64_t)si, 0);
      if (p.act != GW_FLOAT16) bn_case(&p, shapes[2], 150, 1);
      pair_free(&p);
    }
  }
  unsetenv("GW_BN_NHWC_PAIRS");
  unsetenv("GW_BN_NHWC_GROUPS");
  unsetenv("GW_BN_NHWC_KERNEL");
}
END_TEST

START_TEST(test_layout_pool_bits) {
  static const int mp[][7] = {/* n, c, h, w, kernel, stride, pad */
                              {2, 16, 9, 9, 3, 2, 1}, {1, 5, 8, 7, 3, 2, 1}, {2, 40, 6, 6, 2, 2, 0},
                              {2, 64, 56, 56, 3, 2, 1}};
  static const int ap[][4] = {{2, 24, 7, 7}, {3, 5, 2, 3}, {2, 40, 1, 1}, {2, 24, 7, 7}}; /* the last: cancelling */
  for (size_t di = 0; di < sizeof act_dtypes / sizeof act_dtypes[0]; di++) {
    struct pair p;
    if (!pair_make(&p, act_dtypes[di])) continue;
    for (size_t si = 0; si < sizeof mp / sizeof mp[0]; si++) {
      const int *m = mp[si];
      struct gw_op_desc d = conv_desc(m[0], m[1], m[2], m[3], m[1], m[4], m[5], m[6]);
      d.kind = GW_LAYER_MAXPOOL;
      const int sx[4] = {d.n, d.c, d.h, d.w}, sy[4] = {d.n, d.c, d.p, d.q};
      void *x[1][2], *y[1][2], *dy[1][2], *dx[1][2], *ws[2];
      bufs_alloc(&p, x, 1, elems(sx) * p.esz), bufs_alloc(&p, dx, 1, elems(sx) * p.esz);
      bufs_alloc(&p, y, 1, elems(sy) * p.esz), bufs_alloc(&p, dy, 1, elems(sy) * p.esz);
      float *h = malloc(elems(sx) * sizeof(float));
      ck_assert(h);
      fill(h, elems(sx), 300 + si);
      for (size_t e = 0; e < elems(sx); e += 7) h[e] = h[e > 0 ? e - 1 : 0]; /* ties */
      act_put(&p, x[0], h, sx);
      fill(h, elems(sy), 310 + si);
      act_put(&p, dy[0], h, sy);
      struct gw_op *op[2];
      BOTH(be->op_create(p.b[l], &d, &op[l]));
      for (int l = 0; l < 2; l++) ck_assert(ws[l] = be->alloc(p.b[l], be->workspace_bytes(op[l])));
      BOTH(be->maxpool_fwd(op[l], x[0][l], y[0][l], ws[l]));
      BOTH(be->maxpool_bwd(op[l], dy[0][l], ws[l], dx[0][l]));
      act_same(&p, y[0], sy, "maxpool_fwd");
      /* oneDNN's max pool backward adds the values of overlapping windows in
       * another order per layout, rounding at each add (up to 4 values here,
       * |dy| < 1): the same values up to those roundings.  Ours (cudnn) add
       * in double in one order and round once in both. */
      if (be->host_memory) act_close(&p, dx[0], sx, 4 * (p.esz == 2 ? 0x1p-7 : 0x1p-23), "maxpool_bwd");
      else act_same(&p, dx[0], sx, "maxpool_bwd");
      for (int l = 0; l < 2; l++) be->op_destroy(op[l]), be->dealloc(p.b[l], ws[l]);
      bufs_free(&p, x, 1), bufs_free(&p, dx, 1), bufs_free(&p, y, 1), bufs_free(&p, dy, 1);
      free(h);
    }
    for (size_t si = 0; si < sizeof ap / sizeof ap[0]; si++) {
      if (si == 3 && p.act == GW_FLOAT16) continue;
      struct gw_op_desc d = same_desc(GW_LAYER_AVGPOOL, ap[si][0], ap[si][1], ap[si][2], ap[si][3]);
      d.p = d.q = 1;
      const int sx[4] = {d.n, d.c, d.h, d.w}, sy[4] = {d.n, d.c, 1, 1};
      void *x[1][2], *y[1][2], *dy[1][2], *dx[1][2];
      bufs_alloc(&p, x, 1, elems(sx) * p.esz), bufs_alloc(&p, dx, 1, elems(sx) * p.esz);
      bufs_alloc(&p, y, 1, elems(sy) * p.esz), bufs_alloc(&p, dy, 1, elems(sy) * p.esz);
      float *h = malloc(elems(sx) * sizeof(float));
      ck_assert(h);
      fill(h, elems(sx), 320 + si);
      if (si == 3) cancelling(h, sx);
      act_put(&p, x[0], h, sx);
      fill(h, elems(sy), 330 + si);
      act_put(&p, dy[0], h, sy);
      struct gw_op *op[2];
      BOTH(be->op_create(p.b[l], &d, &op[l]));
      BOTH(be->avgpool_fwd(op[l], x[0][l], y[0][l]));
      BOTH(be->avgpool_bwd(op[l], dy[0][l], dx[0][l]));
      act_same(&p, y[0], sy, "avgpool_fwd");
      act_same(&p, dx[0], sx, "avgpool_bwd");
      for (int l = 0; l < 2; l++) be->op_destroy(op[l]);
      bufs_free(&p, x, 1), bufs_free(&p, dx, 1), bufs_free(&p, y, 1), bufs_free(&p, dy, 1);
      free(h);
    }
    pair_free(&p);
  }
}
END_TEST

/* Each float of a vector of n within tol of the largest |value| in the NCHW
 * backend's copy. */
static void vec_close(const struct pair *p, void *const t[2], size_t n, double tol, const char *what) {
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
  ck_assert(a && b);
  from_backend(p->b[0], a, t[0], n * sizeof(float));
  from_backend(p->b[1], b, t[1], n * sizeof(float));
  double big = 0;
  for (size_t i = 0; i < n; i++) big = fabs((double)a[i]) > big ? fabs((double)a[i]) : big;
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(fabs((double)a[i] - b[i]) <= tol * big, "%s (dtype %d): element %zu is %.9g in NCHW, %.9g in NHWC "
                  "(tolerance %g of %g)", what, p->act, i, (double)a[i], (double)b[i], tol, big);
  free(a), free(b);
}

/* The largest |x| of an activation in the NCHW backend, for act_close's scale. */
static double act_max(const struct pair *p, void *const t[2], const int *s) {
  const size_t n = elems(s);
  char *raw = malloc(n * p->esz);
  float *f = malloc(n * sizeof(float));
  ck_assert(raw && f);
  from_backend(p->b[0], raw, t[0], n * p->esz);
  if (p->esz == 4) memcpy(f, raw, n * 4);
  else gw_half_to_f32_n(p->act == GW_FLOAT16, f, (const uint16_t *)raw, n);
  double big = 0;
  for (size_t i = 0; i < n; i++) big = fabs((double)f[i]) > big ? fabs((double)f[i]) : big;
  free(raw), free(f);
  return big;
}

/* Convolutions (forward, both backwards: the weights transposed for NHWC
 * inside the backend) and the fc layer (over several positions, whose weights
 * an NHWC backend permutes, and over one): the same values in both layouts up
 * to the libraries' own summation orders, within a few roundings of the
 * activations' dtype of the largest value (float32: 1e-5). */
START_TEST(test_layout_conv_fc) {
  static const int convs[][8] = {/* n, c, h, w, k, kernel, stride, pad */
                                 {2, 8, 9, 9, 16, 3, 1, 1}, {2, 16, 8, 8, 8, 1, 2, 0}, {1, 4, 15, 15, 8, 7, 2, 3}};
  static const int fcs[][5] = {/* n, c, h, w, k */ {3, 8, 2, 3, 5}, {4, 16, 1, 1, 10}};
  for (size_t di = 0; di < sizeof act_dtypes / sizeof act_dtypes[0]; di++) {
    struct pair p;
    if (!pair_make(&p, act_dtypes[di])) continue;
    const double tol = p.act == GW_FLOAT32 ? 1e-5 : p.act == GW_BFLOAT16 ? 4 * 0x1p-8 : 4 * 0x1p-11;
    for (size_t si = 0; si < sizeof convs / sizeof convs[0] + sizeof fcs / sizeof fcs[0]; si++) {
      const int fc = si >= sizeof convs / sizeof convs[0];
      struct gw_op_desc d;
      if (!fc) {
        const int *v = convs[si];
        d = conv_desc(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
      } else {
        const int *v = fcs[si - sizeof convs / sizeof convs[0]];
        d = (struct gw_op_desc){.kind = GW_LAYER_FC, .n = v[0], .c = v[1], .h = v[2], .w = v[3], .k = v[4],
                                .p = 1, .q = 1};
      }
      const int sx[4] = {d.n, d.c, d.h, d.w}, sy[4] = {d.n, d.k, d.p, d.q};
      const size_t nw = (size_t)d.k * d.c * (fc ? (size_t)d.h * d.w : (size_t)d.kernel * d.kernel);
      void *x[1][2], *y[1][2], *dy[1][2], *dx[1][2], *w[1][2], *dw[1][2], *bias[1][2], *db[1][2];
      bufs_alloc(&p, x, 1, elems(sx) * p.esz), bufs_alloc(&p, dx, 1, elems(sx) * p.esz);
      bufs_alloc(&p, y, 1, elems(sy) * p.esz), bufs_alloc(&p, dy, 1, elems(sy) * p.esz);
      bufs_alloc(&p, w, 1, nw * sizeof(float)), bufs_alloc(&p, dw, 1, nw * sizeof(float));
      bufs_alloc(&p, bias, 1, (size_t)d.k * sizeof(float)), bufs_alloc(&p, db, 1, (size_t)d.k * sizeof(float));
      float *h = malloc((elems(sx) + elems(sy) + nw) * sizeof(float));
      ck_assert(h);
      fill(h, elems(sx), 400 + si), act_put(&p, x[0], h, sx);
      fill(h, elems(sy), 410 + si), act_put(&p, dy[0], h, sy);
      fill(h, nw, 420 + si), vec_put(&p, w[0], h, nw * sizeof(float));
      fill(h, (size_t)d.k, 430 + si), vec_put(&p, bias[0], h, (size_t)d.k * sizeof(float));
      struct gw_op *op[2];
      BOTH(be->op_create(p.b[l], &d, &op[l]));
      if (!fc) {
        BOTH(be->conv_fwd(op[l], x[0][l], w[0][l], y[0][l]));
        BOTH(be->conv_bwd_data(op[l], dy[0][l], w[0][l], dx[0][l]));
        BOTH(be->conv_bwd_weights(op[l], x[0][l], dy[0][l], dw[0][l]));
      } else {
        BOTH(be->fc_fwd(op[l], x[0][l], w[0][l], bias[0][l], y[0][l]));
        BOTH(be->fc_bwd(op[l], x[0][l], w[0][l], dy[0][l], dx[0][l], dw[0][l], db[0][l]));
        vec_close(&p, db[0], (size_t)d.k, tol, "fc db");
      }
      char what[64];
      snprintf(what, sizeof what, "%s %zu: y", fc ? "fc" : "conv", si);
      act_close(&p, y[0], sy, tol * act_max(&p, y[0], sy), what);
      snprintf(what, sizeof what, "%s %zu: dx", fc ? "fc" : "conv", si);
      act_close(&p, dx[0], sx, tol * act_max(&p, dx[0], sx), what);
      snprintf(what, sizeof what, "%s %zu: dw", fc ? "fc" : "conv", si);
      vec_close(&p, dw[0], nw, tol, what);
      for (int l = 0; l < 2; l++) be->op_destroy(op[l]);
      void *(*all[])[2] = {x, y, dy, dx, w, dw, bias, db};
      for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) bufs_free(&p, all[i], 1);
      free(h);
    }
    pair_free(&p);
  }
}
END_TEST

void add_layout_tests(TCase *tc) {
  tcase_add_test(tc, test_layout_conv_fc);
  tcase_add_test(tc, test_layout_bn_bits);
  tcase_add_test(tc, test_layout_pool_bits);
}
