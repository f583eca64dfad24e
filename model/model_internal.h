/* model_internal.h - the inside of struct gw_model, shared by the files of model/
 * that build, initialize and (later) execute it.  Not for the trainer's tools: they
 * use the accessors of resnet.h. */
#ifndef GW_MODEL_INTERNAL_H
#define GW_MODEL_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "resnet.h"

struct gw_model {
  struct gw_model_config cfg;
  struct gw_layer *layers; /* [nlayers] in forward order */
  int nlayers, cap_layers;
  struct gw_act *acts;     /* [nacts]: 0 is the input, nacts - 1 the logits */
  int nacts, cap_acts;
  struct gw_tensor *params_t;  /* [nparams_t] in named_parameters() order */
  int nparams_t, cap_params_t;
  struct gw_tensor *buffers_t; /* [nbuffers_t] in named_buffers() order */
  int nbuffers_t, cap_buffers_t;
  int oom;                 /* an allocation failed while building */

  size_t num_params;       /* scalars in param_data / grad_data */
  size_t num_running;      /* scalars in running_data */
  size_t num_counters;     /* entries in counter_data (one per BN) */
  float *param_data;       /* [num_params], reverse forward order, 64-byte aligned */
  float *grad_data;        /* [num_params], same layout */
  float *running_data;     /* [num_running]: per BN running_mean[C] then running_var[C] */
  int64_t *counter_data;   /* [num_counters]: per BN num_batches_tracked */
};

/* Records this thread's error message (gw_model_last_error) and returns code. */
gw_result_t gw__model_fail(gw_result_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
gw_result_t gw__model_vfail(gw_result_t code, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Puts fmt's text and ": " before this thread's last message (kept whole, as
 * far as the buffer holds it): where a failure happened, over what went wrong. */
gw_result_t gw__model_prefix(gw_result_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

struct gw_op_desc;
/* op_create's checks of d for backend `be` ("cpu", "cudnn"): the shapes of its
 * kind (backend.h), with a message naming the backend and the op.  Writes the op's
 * description into what[what_len] for the backend's own messages. */
gw_result_t gw__backend_check_desc(const char *be, const struct gw_op_desc *d, char *what, size_t what_len);
/* gw_backend_config.layout checked (a message naming the backend when it is
 * neither layout); *nhwc = 1 for GW_LAYOUT_NHWC.  cfg may be NULL (NCHW). */
struct gw_backend_config;
gw_result_t gw__backend_layout(const char *be, const struct gw_backend_config *cfg, int *nhwc);
/* An entry of the table called on an op of another kind. */
gw_result_t gw__backend_expect_kind(const char *be, int kind, int want, const char *what);

/* exec_input.c: the executor's input batch (float32 NCHW, batch samples of
 * shape a) as the backend's activations at dst (host memory): converted to
 * act_dt (GW_FLOAT32, GW_BFLOAT16 or GW_FLOAT16; round to nearest even) and
 * channels-last when nhwc, over a few threads for large batches. */
void gw__exec_input(void *dst, const float *images, int batch, const struct gw_act *a, int act_dt, int nhwc);

/* Returns a failure at once (the message is already recorded). */
#define GW_MODEL_TRY(call)                                                           \
  do {                                                                               \
    gw_result_t gw_model_try_res_ = (call);                                          \
    if (gw_model_try_res_ != GW_SUCCESS) return gw_model_try_res_;                   \
  } while (0)

#endif
