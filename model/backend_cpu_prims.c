/* backend_cpu_prims.c - planning the cpu backend's oneDNN primitives, one
 * function per layer kind: the forward primitive first, then the backward ones
 * with the forward primitive descriptor as their hint (oneDNN's rule), each with
 * its arguments and the reorders between PyTorch's plain layouts and the layouts
 * oneDNN chose.  Running them is backend_cpu.c's job (step_run). */
#include "gw_config.h"

#if GW_HAVE_ONEDNN

#include <stdlib.h>
#include <string.h>

#include "backend_cpu_internal.h"

/* The memory descriptor a primitive descriptor chose; query_at picks among
 * several of one kind (weights 1 is the bias). */
static const dnnl_memory_desc_t *query_at(const_dnnl_primitive_desc_t pd, dnnl_query_t q, int index) {
  return dnnl_primitive_desc_query_md(pd, q, index);
}

static const dnnl_memory_desc_t *query(const_dnnl_primitive_desc_t pd, dnnl_query_t q) { return query_at(pd, q, 0); }

/* Whether oneDNN's choice for a primitive is a reference (plain loop)
 * implementation: on a CPU without its dtype's instructions. */
static int is_ref_impl(const_dnnl_primitive_desc_t pd) {
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) return 1;
  return strstr(impl, "ref") != NULL;
}

/* Plans an inner product and both its backward passes on the caller's plain
 * layouts src, wei (float32: the weights and their gradient), bias (NULL: none)
 * and dst, oneDNN choosing its own for each (the same dtypes; its weights in
 * src's).  The fully connected layer's, and the convolutions of one output
 * position's.  With no_ref, returns GW_ERR_UNSUPPORTED with nothing planned
 * where oneDNN has none of the three, or would run one on a reference
 * implementation. */
static gw_result_t plan_inner_product(struct gw_op *op, const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                                      const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst, int no_ref,
                                      const char *what) {
  gw_result_t res = GW_SUCCESS;
  struct gw_backend *b = op->b;
  dnnl_primitive_desc_t pd = NULL, dpd = NULL, wpd = NULL;
  dnnl_memory_desc_t src_any, wei_any, dwei_any, dst_any;
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_any, src->ndims, src->dims, b->adt, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_any, wei->ndims, wei->dims, b->adt, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dwei_any, wei->ndims, wei->dims, dnnl_f32, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_any, dst->ndims, dst->dims, b->adt, dnnl_format_tag_any), what);
  dnnl_inner_product_desc_t ipd;
  /* with no_ref, none at all is as a reference one: declined (nothing planned yet) */
#define IP_PD(desc_init, out, hint)                                                               \
  do {                                                                                            \
    DNNL_TRY(desc_init, what);                                                                    \
    const dnnl_status_t st_pd_ = dnnl_primitive_desc_create(&(out), &ipd, NULL, b->engine, hint); \
    if (no_ref && (st_pd_ == dnnl_unimplemented || (st_pd_ == dnnl_success && is_ref_impl(out)))) { \
      res = GW_ERR_UNSUPPORTED;                                                                   \
      goto fail;                                                                                  \
    }                                                                                             \
    DNNL_TRY(st_pd_, what);                                                                       \
  } while (0)
  IP_PD(dnnl_inner_product_forward_desc_init(&ipd, dnnl_forward_training, &src_any, &wei_any, bias, &dst_any), pd,
        NULL);
  IP_PD(dnnl_inner_product_backward_data_desc_init(&ipd, &src_any, &wei_any, &dst_any), dpd, pd);
  IP_PD(dnnl_inner_product_backward_weights_desc_init(&ipd, &src_any, &dwei_any, bias, &dst_any), wpd, pd);
#undef IP_PD
  DNNL_TRY(dnnl_primitive_create(&op->fwd.prim, pd), what);
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_SRC, src, query(pd, dnnl_query_src_md), 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_WEIGHTS, wei, query(pd, dnnl_query_weights_md), 0, what));
  if (bias)
    GW_MODEL_TRY_GOTO(
        gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_BIAS, bias, query_at(pd, dnnl_query_weights_md, 1), 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_DST, dst, query(pd, dnnl_query_dst_md), 1, what));
  DNNL_TRY(dnnl_primitive_create(&op->bwd_data.prim, dpd), what);
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DIFF_DST, dst, query(dpd, dnnl_query_diff_dst_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_WEIGHTS, wei, query(dpd, dnnl_query_weights_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DIFF_SRC, src, query(dpd, dnnl_query_diff_src_md), 1, what));
  DNNL_TRY(dnnl_primitive_create(&op->bwd_wei.prim, wpd), what);
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_SRC, src, query(wpd, dnnl_query_src_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_DIFF_DST, dst, query(wpd, dnnl_query_diff_dst_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_DIFF_WEIGHTS, wei, query(wpd, dnnl_query_diff_weights_md), 1, what));
  if (bias)
    GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_DIFF_BIAS, bias,
                                       query_at(wpd, dnnl_query_diff_weights_md, 1), 1, what));
fail:
  if (wpd) dnnl_primitive_desc_destroy(wpd);
  if (dpd) dnnl_primitive_desc_destroy(dpd);
  if (pd) dnnl_primitive_desc_destroy(pd);
  return res;
}

/* A convolution whose output has one position (P = Q = 1) reads one
 * rectangle of its input against one rectangle of taps: it is an inner
 * product (a GEMM of the batch against the channels x taps), which oneDNN
 * runs on its GEMM kernels where its direct convolution kernels, made for
 * larger images, ran ResNet-50's last stage at 28x28 (1x1 images: 1x1 and
 * center-tap 3x3 convolutions; 2x2 -> 1x1 with stride 2) at a fifth to a
 * half of that speed, the backward for weights slowest.  The rectangles are
 * strided views of the caller's tensors: input rows and columns 0 .. r-1
 * with r = min(H, K - pad), taps from (pad, pad); the backward's outputs are
 * zeroed outside them first (cpu_conv_bwd_*).  GW_CPU_CONV_IP=0 plans every
 * convolution as one (A/B runs, tests).  Returns GW_ERR_UNSUPPORTED, nothing
 * planned, where it does not apply or oneDNN would run it on a reference
 * implementation (bfloat16 without the CPU's instructions). */
static gw_result_t conv_as_inner_product(struct gw_op *op, const char *what) {
  gw_result_t res = GW_SUCCESS;
  const struct gw_op_desc *d = &op->d;
  struct gw_backend *b = op->b;
  const char *env = getenv("GW_CPU_CONV_IP");
  if (d->p != 1 || d->q != 1 || (env && !strcmp(env, "0"))) return GW_ERR_UNSUPPORTED;
  const int64_t K = d->kernel, H = d->h, W = d->w, C = d->c;
  const int64_t hr = H < K - d->pad ? H : K - d->pad, wr = W < K - d->pad ? W : K - d->pad;
  if (hr <= 0 || wr <= 0) return GW_ERR_UNSUPPORTED; /* every tap on the padding */
  dnnl_memory_desc_t src, wei, dst;
  dnnl_dims_t src_dims = {d->n, C, hr, wr}, wei_dims = {d->k, C, hr, wr}, dst_dims = {d->n, d->k};
  dnnl_dims_t src_strides = {C * H * W, H * W, W, 1}, wei_strides = {C * K * K, K * K, K, 1};
  if (b->nhwc) src_strides[1] = 1, src_strides[2] = W * C, src_strides[3] = C;
  DNNL_TRY(dnnl_memory_desc_init_by_strides(&src, 4, src_dims, b->adt, src_strides), what);
  DNNL_TRY(dnnl_memory_desc_init_by_strides(&wei, 4, wei_dims, dnnl_f32, wei_strides), what);
  wei.offset0 = d->pad * K + d->pad; /* the first tap read (the weights' gradient: the same view) */
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst, 2, dst_dims, b->adt, dnnl_nc), what);
  GW_MODEL_TRY_GOTO(plan_inner_product(op, &src, &wei, NULL, &dst, 1, what));
  op->as_inner_product = 1;
  const size_t es = b->adt == dnnl_bf16 ? 2 : 4;
  op->zero_dx_bytes = hr * wr < H * W ? (size_t)(d->n * C * H * W) * es : 0;
  op->zero_dw_bytes = hr * wr < K * K ? (size_t)(d->k * C * K * K) * sizeof(float) : 0;
fail:
  return res;
}

/* A strided 1x1 convolution without padding reads every stride-th row and
 * column of its input and nothing else: it is an unstrided one on that
 * subsampled view.  oneDNN 2.6 runs the strided form (its jit kernels for
 * 1x1 with a stride) at 0.8x the unstrided form's speed on the view
 * (ResNet-50 at 32x32, batch 64, two threads: layer2.0's and layer3.0's
 * shortcuts 4.8 and 5.3 ms forward + backward, 3.8 and 4.2 on the view;
 * docs/architecture.md); the view costs only the gather that the
 * reorder into oneDNN's layout does anyway, and dx zeroed where the backward
 * does not write it.  With the view as src_plain (every step's source and
 * diff_source) the convolution is planned at stride 1.  oneDNN 2.6 refuses a
 * view whose rows seem to reach past the next image's start (h < stride x p:
 * an odd h at stride 2), which keeps the strided form, as
 * GW_CPU_CONV_SUBSAMPLE=0 does everywhere (A/B runs, tests).  Sets
 * op->subsampled where it applies. */
static void subsample_view(struct gw_op *op, dnnl_memory_desc_t *src_plain) {
  const struct gw_op_desc *d = &op->d;
  const char *env = getenv("GW_CPU_CONV_SUBSAMPLE");
  if (d->kernel != 1 || d->pad != 0 || d->stride < 2 || (env && !strcmp(env, "0"))) return;
  dnnl_dims_t dims = {d->n, d->c, d->p, d->q}, strides;
  for (int i = 0; i < 4; i++) strides[i] = src_plain->format_desc.blocking.strides[i];
  strides[2] *= d->stride, strides[3] *= d->stride;
  dnnl_memory_desc_t view;
  if (dnnl_memory_desc_init_by_strides(&view, 4, dims, src_plain->data_type, strides) != dnnl_success) return;
  *src_plain = view;
  op->subsampled = 1;
  op->zero_dx_bytes = (size_t)d->n * d->c * d->h * d->w * dnnl_data_type_size(view.data_type);
}

/* Plans the forward convolution and, with its primitive descriptor as the hint,
 * the two backward ones.  Each picks its own layouts, so each has its own
 * reorders.  One with an output of one position: as an inner product
 * (conv_as_inner_product), where that applies. */
gw_result_t gw__cpu_conv_create(struct gw_op *op, const char *what) {
  gw_result_t res = conv_as_inner_product(op, what);
  if (res != GW_ERR_UNSUPPORTED) return res;
  res = GW_SUCCESS;
  const struct gw_op_desc *d = &op->d;
  struct gw_backend *b = op->b;
  dnnl_primitive_desc_t pd = NULL, bpd = NULL;
  dnnl_memory_desc_t src_plain, wei_plain, dst_plain, src_any, wei_any, dwei_any, dst_any;
  dnnl_dims_t src_dims = {d->n, d->c, d->h, d->w}, wei_dims = {d->k, d->c, d->kernel, d->kernel},
              dst_dims = {d->n, d->k, d->p, d->q}, strides = {d->stride, d->stride}, pads = {d->pad, d->pad};
  /* Activations in the backend's dtype; the weights are float32 in the caller's
   * memory and in the activations' dtype inside (the reorder converts), and
   * their gradient is float32 throughout (mixed precision's master copy). */
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_plain, 4, src_dims, b->adt, b->atag), what);
  subsample_view(op, &src_plain);
  if (op->subsampled) src_dims[2] = d->p, src_dims[3] = d->q, strides[0] = strides[1] = 1;
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_plain, 4, wei_dims, dnnl_f32, dnnl_oihw), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_plain, 4, dst_dims, b->adt, b->atag), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_any, 4, src_dims, b->adt, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_any, 4, wei_dims, b->adt, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dwei_any, 4, wei_dims, dnnl_f32, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_any, 4, dst_dims, b->adt, dnnl_format_tag_any), what);
  /* Direct, not auto: Winograd's error is far larger than the plain sum's. */
  dnnl_convolution_desc_t cd;
  DNNL_TRY(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &src_any, &wei_any,
                                              NULL, &dst_any, strides, pads, pads),
           what);
  DNNL_TRY(dnnl_primitive_desc_create(&pd, &cd, NULL, b->engine, NULL), what);
  DNNL_TRY(dnnl_primitive_create(&op->fwd.prim, pd), what);
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_SRC, &src_plain, query(pd, dnnl_query_src_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_WEIGHTS, &wei_plain, query(pd, dnnl_query_weights_md), 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_DST, &dst_plain, query(pd, dnnl_query_dst_md), 1, what));

  DNNL_TRY(dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &src_any, &wei_any, &dst_any, strides,
                                                    pads, pads),
           what);
  DNNL_TRY(dnnl_primitive_desc_create(&bpd, &cd, NULL, b->engine, pd), what);
  DNNL_TRY(dnnl_primitive_create(&op->bwd_data.prim, bpd), what);
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DIFF_DST, &dst_plain, query(bpd, dnnl_query_diff_dst_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_WEIGHTS, &wei_plain, query(bpd, dnnl_query_weights_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DIFF_SRC, &src_plain, query(bpd, dnnl_query_diff_src_md), 1, what));
  dnnl_primitive_desc_destroy(bpd);
  bpd = NULL;

  DNNL_TRY(dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &src_any, &dwei_any, NULL,
                                                       &dst_any, strides, pads, pads),
           what);
  DNNL_TRY(dnnl_primitive_desc_create(&bpd, &cd, NULL, b->engine, pd), what);
  DNNL_TRY(dnnl_primitive_create(&op->bwd_wei.prim, bpd), what);
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_SRC, &src_plain, query(bpd, dnnl_query_src_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_DIFF_DST, &dst_plain, query(bpd, dnnl_query_diff_dst_md), 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_DIFF_WEIGHTS, &wei_plain,
                                     query(bpd, dnnl_query_diff_weights_md), 1, what));
fail:
  if (bpd) dnnl_primitive_desc_destroy(bpd);
  if (pd) dnnl_primitive_desc_destroy(pd);
  return res;
}

/* ReLU in place of PyTorch's: forward on the plain layout, backward from the
 * forward output (relu_use_dst_for_bwd), so the input need not be kept. */
gw_result_t gw__cpu_relu_create(struct gw_op *op, const char *what) {
  gw_result_t res = GW_SUCCESS;
  const struct gw_op_desc *d = &op->d;
  struct gw_backend *b = op->b;
  dnnl_primitive_desc_t pd = NULL, bpd = NULL;
  dnnl_memory_desc_t md;
  dnnl_dims_t dims = {d->n, d->c, d->h, d->w};
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&md, 4, dims, b->adt, b->atag), what);
  dnnl_eltwise_desc_t ed;
  DNNL_TRY(dnnl_eltwise_forward_desc_init(&ed, dnnl_forward_training, dnnl_eltwise_relu_use_dst_for_bwd, &md, 0.f, 0.f),
           what);
  DNNL_TRY(dnnl_primitive_desc_create(&pd, &ed, NULL, b->engine, NULL), what);
  DNNL_TRY(dnnl_primitive_create(&op->fwd.prim, pd), what);
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_SRC, &md, &md, 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_DST, &md, &md, 1, what));
  DNNL_TRY(dnnl_eltwise_backward_desc_init(&ed, dnnl_eltwise_relu_use_dst_for_bwd, &md, &md, 0.f, 0.f), what);
  DNNL_TRY(dnnl_primitive_desc_create(&bpd, &ed, NULL, b->engine, pd), what);
  DNNL_TRY(dnnl_primitive_create(&op->bwd_data.prim, bpd), what);
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DST, &md, &md, 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DIFF_DST, &md, &md, 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DIFF_SRC, &md, &md, 1, what));
fail:
  if (bpd) dnnl_primitive_desc_destroy(bpd);
  if (pd) dnnl_primitive_desc_destroy(pd);
  return res;
}

/* Max pool as PyTorch's (padding never wins: oneDNN pads with -inf), planned for
 * training so the forward keeps the argmax positions in the workspace argument,
 * which is the caller's memory (backend.h's workspace_bytes). */
gw_result_t gw__cpu_maxpool_create(struct gw_op *op, const char *what) {
  gw_result_t res = GW_SUCCESS;
  const struct gw_op_desc *d = &op->d;
  struct gw_backend *b = op->b;
  dnnl_primitive_desc_t pd = NULL, bpd = NULL;
  dnnl_memory_desc_t src, dst;
  dnnl_dims_t src_dims = {d->n, d->c, d->h, d->w}, dst_dims = {d->n, d->c, d->p, d->q},
              strides = {d->stride, d->stride}, kernel = {d->kernel, d->kernel}, pads = {d->pad, d->pad};
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&src, 4, src_dims, b->adt, b->atag), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst, 4, dst_dims, b->adt, b->atag), what);
  dnnl_pooling_desc_t pdesc;
  DNNL_TRY(dnnl_pooling_forward_desc_init(&pdesc, dnnl_forward_training, dnnl_pooling_max, &src, &dst, strides, kernel,
                                          pads, pads),
           what);
  DNNL_TRY(dnnl_primitive_desc_create(&pd, &pdesc, NULL, b->engine, NULL), what);
  DNNL_TRY(dnnl_primitive_create(&op->fwd.prim, pd), what);
  const dnnl_memory_desc_t *ws = query(pd, dnnl_query_workspace_md);
  op->workspace_bytes = dnnl_memory_desc_get_size(ws);
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_SRC, &src, &src, 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_DST, &dst, &dst, 1, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_WORKSPACE, ws, ws, 1, what));
  DNNL_TRY(dnnl_pooling_backward_desc_init(&pdesc, dnnl_pooling_max, &src, &dst, strides, kernel, pads, pads), what);
  DNNL_TRY(dnnl_primitive_desc_create(&bpd, &pdesc, NULL, b->engine, pd), what);
  DNNL_TRY(dnnl_primitive_create(&op->bwd_data.prim, bpd), what);
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DIFF_DST, &dst, &dst, 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_WORKSPACE, ws, ws, 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DIFF_SRC, &src, &src, 1, what));
fail:
  if (bpd) dnnl_primitive_desc_destroy(bpd);
  if (pd) dnnl_primitive_desc_destroy(pd);
  return res;
}

/* Fully connected as oneDNN's inner product: src [n, f] with f = c * h * w
 * (NHWC over several positions: src [n, c, h, w] channels-last, weights
 * [k, c, h, w]),
 * weights [k, f] (PyTorch's Linear layout), bias [k], dst [n, k].  Backward is
 * two primitives: data (dx) and weights (dw, db). */
gw_result_t gw__cpu_fc_create(struct gw_op *op, const char *what) {
  gw_result_t res = GW_SUCCESS;
  const struct gw_op_desc *d = &op->d;
  struct gw_backend *b = op->b;
  dnnl_memory_desc_t src, wei, bias, dst;
  dnnl_dim_t f = (dnnl_dim_t)d->c * d->h * d->w;
  dnnl_dims_t src_dims = {d->n, f}, wei_dims = {d->k, f}, bias_dims = {d->k}, dst_dims = {d->n, d->k};
  int nd = 2;
  dnnl_format_tag_t src_tag = dnnl_nc, wei_tag = dnnl_oi;
  if (b->nhwc && (int64_t)d->h * d->w > 1) {
    /* Channels-last input over several positions: the layer as oneDNN's 4-d
     * inner product, so the weights keep PyTorch's [k, c, h, w] order. */
    nd = 4, src_tag = dnnl_nhwc, wei_tag = dnnl_oihw;
    src_dims[1] = d->c, src_dims[2] = d->h, src_dims[3] = d->w;
    wei_dims[1] = d->c, wei_dims[2] = d->h, wei_dims[3] = d->w;
  }
  /* Dtypes as the convolution's (bias and its gradient float32). */
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&src, nd, src_dims, b->adt, src_tag), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei, nd, wei_dims, dnnl_f32, wei_tag), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&bias, 1, bias_dims, dnnl_f32, dnnl_x), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst, 2, dst_dims, b->adt, dnnl_nc), what);
  return plan_inner_product(op, &src, &wei, &bias, &dst, 0, what);
fail:
  return res;
}

/* Tests: whether a convolution was planned as an inner product. */
int gw__cpu_conv_is_inner_product(const struct gw_op *op) { return op && op->as_inner_product; }

/* Tests: whether a convolution was planned on a subsampled view (subsample_view). */
int gw__cpu_conv_is_subsampled(const struct gw_op *op) { return op && op->subsampled; }

#endif /* GW_HAVE_ONEDNN */
