/* backend_cpu_prims.c - planning the cpu backend's oneDNN primitives, one
 * function per layer kind: the forward primitive first, then the backward ones
 * with the forward primitive descriptor as their hint (oneDNN's rule), each with
 * its arguments and the reorders between PyTorch's plain layouts and the layouts
 * oneDNN chose.  Running them is backend_cpu.c's job (step_run). */
#include "gw_config.h"

#if GW_HAVE_ONEDNN

#include "backend_cpu_internal.h"

/* The memory descriptor a primitive descriptor chose; query_at picks among
 * several of one kind (weights 1 is the bias). */
static const dnnl_memory_desc_t *query_at(const_dnnl_primitive_desc_t pd, dnnl_query_t q, int index) {
  return dnnl_primitive_desc_query_md(pd, q, index);
}

static const dnnl_memory_desc_t *query(const_dnnl_primitive_desc_t pd, dnnl_query_t q) { return query_at(pd, q, 0); }

/* Plans the forward convolution and, with its primitive descriptor as the hint,
 * the two backward ones.  Each picks its own layouts, so each has its own
 * reorders. */
gw_result_t gw__cpu_conv_create(struct gw_op *op, const char *what) {
  gw_result_t res = GW_SUCCESS;
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
  dnnl_primitive_desc_t pd = NULL, bpd = NULL;
  dnnl_memory_desc_t src, wei, bias, dst, src_any, wei_any, dwei_any, dst_any;
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
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_any, nd, src_dims, b->adt, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_any, nd, wei_dims, b->adt, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dwei_any, nd, wei_dims, dnnl_f32, dnnl_format_tag_any), what);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_any, 2, dst_dims, b->adt, dnnl_format_tag_any), what);
  dnnl_inner_product_desc_t ipd;
  DNNL_TRY(dnnl_inner_product_forward_desc_init(&ipd, dnnl_forward_training, &src_any, &wei_any, &bias, &dst_any),
           what);
  DNNL_TRY(dnnl_primitive_desc_create(&pd, &ipd, NULL, b->engine, NULL), what);
  DNNL_TRY(dnnl_primitive_create(&op->fwd.prim, pd), what);
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_SRC, &src, query(pd, dnnl_query_src_md), 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_WEIGHTS, &wei, query(pd, dnnl_query_weights_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_BIAS, &bias, query_at(pd, dnnl_query_weights_md, 1), 0, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->fwd, DNNL_ARG_DST, &dst, query(pd, dnnl_query_dst_md), 1, what));

  DNNL_TRY(dnnl_inner_product_backward_data_desc_init(&ipd, &src_any, &wei_any, &dst_any), what);
  DNNL_TRY(dnnl_primitive_desc_create(&bpd, &ipd, NULL, b->engine, pd), what);
  DNNL_TRY(dnnl_primitive_create(&op->bwd_data.prim, bpd), what);
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DIFF_DST, &dst, query(bpd, dnnl_query_diff_dst_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_WEIGHTS, &wei, query(bpd, dnnl_query_weights_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_data, DNNL_ARG_DIFF_SRC, &src, query(bpd, dnnl_query_diff_src_md), 1, what));
  dnnl_primitive_desc_destroy(bpd);
  bpd = NULL;

  DNNL_TRY(dnnl_inner_product_backward_weights_desc_init(&ipd, &src_any, &dwei_any, &bias, &dst_any), what);
  DNNL_TRY(dnnl_primitive_desc_create(&bpd, &ipd, NULL, b->engine, pd), what);
  DNNL_TRY(dnnl_primitive_create(&op->bwd_wei.prim, bpd), what);
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_SRC, &src, query(bpd, dnnl_query_src_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_DIFF_DST, &dst, query(bpd, dnnl_query_diff_dst_md), 0, what));
  GW_MODEL_TRY_GOTO(
      gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_DIFF_WEIGHTS, &wei, query(bpd, dnnl_query_diff_weights_md), 1, what));
  GW_MODEL_TRY_GOTO(gw__cpu_step_arg(b, &op->bwd_wei, DNNL_ARG_DIFF_BIAS, &bias,
                                     query_at(bpd, dnnl_query_diff_weights_md, 1), 1, what));
fail:
  if (bpd) dnnl_primitive_desc_destroy(bpd);
  if (pd) dnnl_primitive_desc_destroy(pd);
  return res;
}

#endif /* GW_HAVE_ONEDNN */
