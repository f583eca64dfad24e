/* sgd_math.h - torch.optim.SGD's rule for one parameter (sgd.h), written once
 * for the host loops (sgd.c, the cpu backend) and the cudnn backend's kernel
 * (cudnn_optim.cu), so that both compute the same bits: every product and sum
 * is rounded on its own (on the device __fmul_rn / __fadd_rn, which the
 * compiler never contracts into an FMA; the host builds are C11 without
 * contraction), and p - x is p + (-x), exactly the same in IEEE arithmetic.
 *
 *   g' = g * grad_scale       (mixed precision's unscale; 1 leaves g as it is)
 *   d  = g' + wd * p
 *   b  = first ? d : momentum * b + (1 - dampening) * d     (only with a buffer)
 *   d  = nesterov ? d + momentum * b : b                      (only with a buffer)
 *   p  = p - lr * d
 */
#ifndef GW_MODEL_SGD_MATH_H
#define GW_MODEL_SGD_MATH_H

#ifdef __CUDA_ARCH__
#define GW_SGD_MUL(a, b) __fmul_rn((a), (b))
#define GW_SGD_ADD(a, b) __fadd_rn((a), (b))
#else
#define GW_SGD_MUL(a, b) ((a) * (b))
#define GW_SGD_ADD(a, b) ((a) + (b))
#endif
#ifdef __CUDACC__
#define GW_SGD_FN static __host__ __device__ __forceinline__
#else
#define GW_SGD_FN static inline
#endif

/* One step's scalars (keep = 1 - dampening). */
struct gw_sgd_scalars {
  float lr, momentum, keep, grad_scale;
  int nesterov, first;
};

/* Steps *p with gradient g; buf is the element's momentum, NULL without momentum. */
GW_SGD_FN void gw_sgd_elem(float *p, float g, float *buf, float wd, const struct gw_sgd_scalars *s) {
  float d = GW_SGD_ADD(GW_SGD_MUL(g, s->grad_scale), GW_SGD_MUL(wd, *p));
  if (buf) {
    float b = s->first ? d : GW_SGD_ADD(GW_SGD_MUL(s->momentum, *buf), GW_SGD_MUL(s->keep, d));
    *buf = b;
    d = s->nesterov ? GW_SGD_ADD(d, GW_SGD_MUL(s->momentum, b)) : b;
  }
  *p = GW_SGD_ADD(*p, -GW_SGD_MUL(s->lr, d));
}

#endif /* GW_MODEL_SGD_MATH_H */
