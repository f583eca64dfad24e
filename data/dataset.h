/* dataset.h - the trainer's datasets: a size, a sample shape, classes, and a get()
 * that decodes (and for training, augments) one sample into fp32 CHW, normalized.
 * Three kinds: Fashion-MNIST from its IDX .gz files, ImageNet-style class folders
 * of JPEGs and PNGs (torchvision's ImageFolder convention and transforms), and synthetic
 * samples for throughput runs.
 *
 * It is not a loader: nothing here shuffles, batches or runs threads (sampler.h and
 * loader.h do).  get() is safe to call from several threads at once.  Failures
 * return a gw_result_t and record a message for this thread, read with
 * gw_data_last_error() (the model's error channel: data and model share it).
 */
#ifndef GW_DATA_DATASET_H
#define GW_DATA_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "gradwire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* get()'s answer for a sample whose file cannot be read or decoded: not an error
 * (the loader substitutes another sample and counts it); gw_data_last_error()
 * says which file and why.  Outside gw_result_t's own codes on purpose. */
#define GW_DATA_SKIPPED ((gw_result_t)100)

enum gw_split {
  GW_SPLIT_TRAIN = 0, /* fashion-mnist train-*, imagenet DIR/train */
  GW_SPLIT_VAL = 1    /* fashion-mnist t10k-*, imagenet DIR/val */
};

struct gw_data_options {
  int image_size;            /* imagenet: output side in pixels (default 224) */
  int val_crop_size;         /* imagenet, GW_SPLIT_VAL: the center crop's side, the evaluation's image size
                                (default 0: image_size; torchvision's --val-crop-size) */
  int val_resize_size;       /* imagenet, GW_SPLIT_VAL: the shorter side before the center crop, at least
                                the crop (default 0: the crop * 256 / 224, torchvision's 256 for 224) */
  int augment;               /* fashion-mnist: flip + 2-pixel padded random crop on
                                train gets (default 0: none) */
  int64_t synthetic_samples; /* synthetic: samples (default 10000) */
  int synthetic_channels;    /* synthetic: sample shape (default 3 x 224 x 224) */
  int synthetic_size;
  int synthetic_classes;     /* default 1000 */
  uint64_t synthetic_seed;   /* the values are a function of (seed, split, index) */
};

struct gw_dataset;

void gw_data_options_default(struct gw_data_options *opt);

/* Opens "fashion-mnist[:DIR]" (DIR defaults to /usr/share/datasets/fashion-mnist),
 * "imagenet:DIR" or "synthetic"; opt NULL means the defaults.  On failure *ds is
 * NULL and gw_data_last_error() says why (GW_ERR_INVALID_ARGUMENT for a bad spec
 * or bad files, GW_ERR_SYSTEM for I/O and memory). */
gw_result_t gw_dataset_open(struct gw_dataset **ds, const char *spec, enum gw_split split,
                            const struct gw_data_options *opt);

/* The kinds directly.  fashion-mnist checks magic numbers, 28x28 images, equal
 * counts, labels < 10 and truncation; the message names the file. */
gw_result_t gw_dataset_fashion_mnist(struct gw_dataset **ds, const char *dir, enum gw_split split, int augment);
/* Classes are the sorted subdirectories of DIR/train (val's must be among them);
 * files are *.jpg / *.jpeg (and *.png where built with libpng) in any case,
 * anywhere below a class directory, in torchvision's order, decoded by what
 * their bytes are (JPEG or PNG), as PIL opens them.  image_size: the output side (224). */
gw_result_t gw_dataset_imagefolder(struct gw_dataset **ds, const char *dir, enum gw_split split, int image_size);
gw_result_t gw_dataset_synthetic(struct gw_dataset **ds, int64_t samples, int channels, int size, int classes,
                                 uint64_t seed);

void gw_dataset_free(struct gw_dataset *ds); /* accepts NULL */

int64_t gw_dataset_size(const struct gw_dataset *ds);
void gw_dataset_shape(const struct gw_dataset *ds, int *c, int *h, int *w);
size_t gw_dataset_sample_floats(const struct gw_dataset *ds); /* c * h * w */
int gw_dataset_classes(const struct gw_dataset *ds);
/* The name of class i ("T-shirt/top", a folder name); NULL when not known. */
const char *gw_dataset_class_name(const struct gw_dataset *ds, int i);
/* What was opened, for the log ("fashion-mnist train (60000 samples) from DIR"). */
const char *gw_dataset_description(const struct gw_dataset *ds);
/* A hash of the samples' identity: the file list below the root and the
 * labels (image folders), the labels (Fashion-MNIST), the generator's
 * parameters (synthetic).  Equal on ranks that opened the same data. */
uint64_t gw_dataset_fingerprint(const struct gw_dataset *ds);
/* A hash the ranks compare to see they opened the same samples: the
 * fingerprint, with the pixels too where they are in memory (Fashion-MNIST:
 * the labels alone passed ranks whose images differed). */
uint64_t gw_dataset_content_hash(const struct gw_dataset *ds);

/* Decodes sample index (0 <= index < size) into out [c, h, w] and its class into
 * *label.  train selects the training transform (augmentation); its randomness is
 * a pure function of key, so equal keys give equal bits.  Returns GW_SUCCESS,
 * GW_DATA_SKIPPED (bad file; out and *label undefined) or an error. */
gw_result_t gw_dataset_get(const struct gw_dataset *ds, int64_t index, int train, uint64_t key, float *out,
                           int32_t *label);

/* This thread's last data (or model) failure message; "" if none. */
const char *gw_data_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* GW_DATA_DATASET_H */
