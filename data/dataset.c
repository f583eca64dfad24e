/* dataset.c - what every dataset kind shares: opening by spec string, the
 * accessors, the range check in front of get(), and freeing.  The kinds themselves
 * live in fashion_mnist.c, imagefolder.c and synthetic.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data_internal.h"
#include "gw_config.h"

#define FASHION_MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

const char *gw_data_last_error(void) { return gw_model_last_error(); }

void gw_data_options_default(struct gw_data_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->image_size = 224;
  opt->augment = 0;
  opt->synthetic_samples = 10000;
  opt->synthetic_channels = 3;
  opt->synthetic_size = 224;
  opt->synthetic_classes = 1000;
  opt->synthetic_seed = 0;
}

/* "NAME" or "NAME:ARG": returns ARG ("" when absent), or NULL when spec is not NAME. */
static const char *spec_arg(const char *spec, const char *name) {
  size_t n = strlen(name);
  if (strncmp(spec, name, n) != 0) return NULL;
  if (spec[n] == '\0') return "";
  return spec[n] == ':' ? spec + n + 1 : NULL;
}

gw_result_t gw_dataset_open(struct gw_dataset **ds, const char *spec, enum gw_split split,
                            const struct gw_data_options *opt) {
  struct gw_data_options def;
  if (!opt) {
    gw_data_options_default(&def);
    opt = &def;
  }
  *ds = NULL;
  const char *arg;
  if (!spec) spec = "";
  /* a colon with nothing after it is refused, not read as no DIR at all
   * ("fashion-mnist:" read the default folder; "imagenet:" was unknown) */
  const char *colon = strchr(spec, ':');
  if (colon && !colon[1] && (spec_arg(spec, "fashion-mnist") || spec_arg(spec, "imagenet")))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "dataset \"%s\": no DIR after the colon (%s)", spec,
                          spec_arg(spec, "imagenet") ? "imagenet:DIR"
                                                     : "fashion-mnist:DIR, or fashion-mnist for " FASHION_MNIST_DEFAULT_DIR);
  if ((arg = spec_arg(spec, "fashion-mnist")))
    return gw_dataset_fashion_mnist(ds, *arg ? arg : FASHION_MNIST_DEFAULT_DIR, split, opt->augment);
  if ((arg = spec_arg(spec, "imagenet")) && !*arg)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "dataset \"imagenet\" needs its folder: imagenet:DIR (DIR/train, DIR/val)");
  if (arg) {
    const int side = split == GW_SPLIT_VAL && opt->val_crop_size ? opt->val_crop_size : opt->image_size;
    gw_result_t res = gw_dataset_imagefolder(ds, arg, split, side);
#if GW_HAVE_TURBOJPEG
    if (res == GW_SUCCESS && split == GW_SPLIT_VAL && opt->val_resize_size &&
        (res = gw__folder_set_val_resize(*ds, opt->val_resize_size)))
      gw_dataset_free(*ds), *ds = NULL;
#endif
    return res;
  }
  if ((arg = spec_arg(spec, "synthetic")) && (*arg || strchr(spec, ':')))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "dataset \"%s\": synthetic takes no argument (its shape comes from "
                          "the model's flags)", spec);
  if (arg) {
    /* The validation split draws other values than the training one. */
    uint64_t seed = opt->synthetic_seed ^ (split == GW_SPLIT_VAL ? 0x5eed5eed5eed5eedull : 0);
    return gw_dataset_synthetic(ds, opt->synthetic_samples, opt->synthetic_channels, opt->synthetic_size,
                                opt->synthetic_classes, seed);
  }
  return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                        "unknown dataset \"%s\": use fashion-mnist[:DIR], imagenet:DIR or synthetic", spec);
}

uint64_t gw_dataset_fingerprint(const struct gw_dataset *ds) { return ds->fingerprint; }
uint64_t gw_dataset_content_hash(const struct gw_dataset *ds) { return ds->content ? ds->content : ds->fingerprint; }

gw_result_t gw__dataset_set_classes(struct gw_dataset *ds, const char *const *names, int n) {
  ds->class_names = calloc((size_t)n, sizeof *ds->class_names);
  if (!ds->class_names) return gw__model_fail(GW_ERR_SYSTEM, "dataset: out of memory for %d class names", n);
  for (int i = 0; i < n; i++) {
    ds->class_names[i] = strdup(names[i]);
    if (!ds->class_names[i]) return gw__model_fail(GW_ERR_SYSTEM, "dataset: out of memory for class names");
  }
  return GW_SUCCESS;
}

void gw_dataset_free(struct gw_dataset *ds) {
  if (!ds) return;
  if (ds->class_names)
    for (int i = 0; i < ds->classes; i++) free(ds->class_names[i]);
  free(ds->class_names);
  ds->ops->destroy(ds);
}

int64_t gw_dataset_size(const struct gw_dataset *ds) { return ds->size; }

void gw_dataset_shape(const struct gw_dataset *ds, int *c, int *h, int *w) {
  *c = ds->c;
  *h = ds->h;
  *w = ds->w;
}

size_t gw_dataset_sample_floats(const struct gw_dataset *ds) { return (size_t)ds->c * ds->h * ds->w; }

int gw_dataset_classes(const struct gw_dataset *ds) { return ds->classes; }

const char *gw_dataset_class_name(const struct gw_dataset *ds, int i) {
  if (!ds->class_names || i < 0 || i >= ds->classes) return NULL;
  return ds->class_names[i];
}

const char *gw_dataset_description(const struct gw_dataset *ds) { return ds->description; }

gw_result_t gw_dataset_get(const struct gw_dataset *ds, int64_t index, int train, uint64_t key, float *out,
                           int32_t *label) {
  if (index < 0 || index >= ds->size)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: sample %lld out of range [0, %lld)", ds->description,
                          (long long)index, (long long)ds->size);
  return ds->ops->get(ds, index, train, key, out, label);
}

int gw__data_open_nowait(const char *path) {
  int fd;
  do fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  struct stat st;
  if (fd < 0 && errno == EWOULDBLOCK && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
    do fd = open(path, O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
  }
  return fd;
}
