/* resnet.h - the ResNet family (18/34/50/101/152 in torchvision's v1.5 layout) as
 * a description the trainer executes: a list of layers over numbered activations,
 * a table of named parameters living in ONE contiguous fp32 buffer laid out in
 * reverse forward order (so a gradient bucket is an (offset, length) range), a
 * table of batch-norm buffers (running statistics, batch counters), and
 * torchvision's initialization.
 *
 * It is not an executor: nothing here runs a layer (the backends in backend.h do),
 * and it knows nothing about communication.  Names, shapes and layouts follow
 * torchvision exactly (conv weights OIHW, fc weight [classes, features]) so weights
 * exchange with PyTorch by name without any transposition.
 */
#ifndef GW_MODEL_RESNET_H
#define GW_MODEL_RESNET_H

#include <stddef.h>
#include <stdint.h>

#include "gradwire.h"

#ifdef __cplusplus
extern "C" {
#endif

enum gw_stem {
  GW_STEM_IMAGENET = 0, /* 7x7/2 conv (pad 3) + BN + ReLU + 3x3/2 max pool (pad 1) */
  GW_STEM_SMALL = 1     /* 3x3/1 conv (pad 1) + BN + ReLU, no max pool (CIFAR-sized inputs) */
};

struct gw_model_config {
  int depth;              /* 18, 34 (basic blocks), 50, 101, 152 (bottlenecks) */
  int classes;            /* outputs of fc, >= 1 */
  int in_channels;        /* channels of the input image, >= 1 */
  int image_size;         /* input height = width in pixels */
  enum gw_stem stem;
  int width_divisor;      /* 1 = torchvision; the stem and stage widths 64/128/256/512
                             are divided by it (it must divide 64) */
  int zero_init_residual; /* non-zero: the last BN gamma of every block starts at 0 */
  uint64_t seed;          /* initialization; the same seed gives the same bits */
};

/* ResNet-50, 1000 classes, 3 channels, 224x224, imagenet stem, full width, seed 0. */
void gw_model_config_default(struct gw_model_config *cfg);

/* Fills cfg->depth from "resnet50" / "50"; returns -1 (cfg untouched) if unknown. */
int gw_model_depth_from_name(const char *name, int *depth);

enum gw_layer_kind {
  GW_LAYER_CONV = 0,    /* no bias (every conv is followed by BN) */
  GW_LAYER_BN = 1,      /* batch norm over N, H, W per channel */
  GW_LAYER_RELU = 2,
  GW_LAYER_MAXPOOL = 3, /* kernel/stride/pad as for conv */
  GW_LAYER_AVGPOOL = 4, /* global: H x W -> 1 x 1 */
  GW_LAYER_FC = 5,      /* y = x W^T + b over the flattened C x 1 x 1 input */
  GW_LAYER_ADD = 6      /* residual: out = in + in2 */
};

/* One activation: the shape of one sample (the batch dimension is the trainer's).
 * Activation 0 is the input image; the last one is the logits [classes, 1, 1]. */
struct gw_act {
  int c, h, w;
};

struct gw_layer {
  enum gw_layer_kind kind;
  char name[48];      /* module path ("conv1", "layer2.0.downsample.0", "layer1.1.relu2") */
  int in;             /* activation read */
  int in2;            /* ADD: the shortcut activation; -1 otherwise */
  int out;            /* activation written (always a new one: in-place is the executor's choice) */
  int kernel, stride, pad; /* CONV and MAXPOOL; 0 otherwise */
  int weight, bias;   /* indices into the parameter table, -1 when absent */
  int running_mean, running_var, num_batches_tracked; /* BN: indices into the buffer table; else -1 */
  int block_last_bn;  /* BN closing a block's main branch (bn3 / bn2): zero_init_residual's target */
};

enum gw_tensor_kind {
  GW_TENSOR_PARAM = 0,  /* trained; lives in gw_model_params(), gradient in gw_model_grads() */
  GW_TENSOR_RUNNING = 1, /* BN running_mean / running_var (fp32), in gw_model_running() */
  GW_TENSOR_COUNTER = 2  /* BN num_batches_tracked (int64, shape []), in gw_model_counters() */
};

struct gw_tensor {
  char name[64];         /* torchvision's name: "layer1.0.conv1.weight", "fc.bias", ... */
  enum gw_tensor_kind kind;
  gw_dtype_t dtype;      /* GW_FLOAT32, or GW_INT64 for counters */
  int ndim;              /* 0 (counter), 1 (BN, fc bias), 2 (fc weight), 4 (conv weight) */
  int64_t shape[4];      /* PyTorch's order: conv [out, in, kh, kw], fc [classes, features] */
  size_t numel;
  size_t offset;         /* elements from the start of the storage its kind lives in */
  int layer;             /* index of the layer that owns it */
};

struct gw_model;

/* Validates cfg, builds the layer list and the tables, allocates the parameter,
 * gradient (zeroed) and buffer storage, and initializes everything as torchvision
 * does with cfg->seed.  On failure *m is NULL and gw_model_last_error() says why
 * (GW_ERR_INVALID_ARGUMENT for a bad config, GW_ERR_SYSTEM when out of memory). */
gw_result_t gw_model_init(struct gw_model **m, const struct gw_model_config *cfg);
void gw_model_free(struct gw_model *m); /* accepts NULL */

/* The message of this thread's last gw_model_* failure ("" if none). */
const char *gw_model_last_error(void);
/* The longest message gw_model_last_error holds (with its NUL): room for a
 * path of PATH_MAX bytes and the reason after it. */
#define GW_MODEL_ERRMSG_MAX 4608

/* Re-initializes parameters (torchvision's scheme: kaiming_normal_ fan_out/relu for
 * convs, BN gamma 1 / beta 0, nn.Linear's default for fc) and resets the buffers
 * (running_mean 0, running_var 1, num_batches_tracked 0).  Each tensor draws from its
 * own stream keyed by (seed, name), so the result does not depend on table order. */
void gw_model_reset_parameters(struct gw_model *m, uint64_t seed, int zero_init_residual);

const struct gw_model_config *gw_model_get_config(const struct gw_model *m);

/* Parameters: the table is in torchvision's named_parameters() order (conv1.weight
 * first, fc.bias last); offsets run the other way (fc.bias at 0, conv1.weight ends
 * the buffer), so the gradients backward produces first come first. */
size_t gw_model_num_params(const struct gw_model *m);     /* scalars: 25,557,032 for resnet50 */
int gw_model_num_param_tensors(const struct gw_model *m);
const struct gw_tensor *gw_model_param_tensor(const struct gw_model *m, int i);
float *gw_model_params(struct gw_model *m);               /* [num_params] */
float *gw_model_grads(struct gw_model *m);                /* [num_params], same layout */

/* Buffers, in torchvision's named_buffers() order (per BN: running_mean,
 * running_var, num_batches_tracked). */
int gw_model_num_buffer_tensors(const struct gw_model *m);
const struct gw_tensor *gw_model_buffer_tensor(const struct gw_model *m, int i);
float *gw_model_running(struct gw_model *m);              /* every running_mean/var */
int64_t *gw_model_counters(struct gw_model *m);           /* every num_batches_tracked */

/* A parameter or buffer by its torchvision name; NULL if there is none. */
const struct gw_tensor *gw_model_find(const struct gw_model *m, const char *name);
/* Where a tensor's values live (float * or int64_t *, by t->dtype). */
void *gw_model_tensor_data(struct gw_model *m, const struct gw_tensor *t);

int gw_model_num_layers(const struct gw_model *m);
const struct gw_layer *gw_model_layer(const struct gw_model *m, int i);
int gw_model_num_acts(const struct gw_model *m);
const struct gw_act *gw_model_act(const struct gw_model *m, int i);

/* Weights as safetensors (weights.c): every parameter (F32) and buffer (running
 * statistics F32, num_batches_tracked I64 of shape []) under torchvision's names,
 * with metadata {"format": "pt", "gradwire_model": "resnet50 classes=10 ...",
 * "gradwire_checksum": FNV-1a 64 of the tensors by name and the description}.
 * Saving replaces path atomically.  Loading takes a file written here or by
 * safetensors.torch.save_file(model.state_dict()), and refuses, before changing
 * anything, one whose names, dtypes or shapes differ from the model's: the message
 * names the first differing tensor in table order (and both models' descriptions
 * where the file has one), then "missing: NAME" or "unexpected: NAME", and one whose
 * gradwire_checksum, where it has one, does not match its contents
 * (GW_ERR_INVALID_ARGUMENT; GW_ERR_SYSTEM for I/O). */
gw_result_t gw_model_save_weights(struct gw_model *m, const char *path);
gw_result_t gw_model_load_weights(struct gw_model *m, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* GW_MODEL_RESNET_H */
