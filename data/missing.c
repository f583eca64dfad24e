/* missing.c - the datasets whose library was not found when the build was
 * configured (data/meson.build compiles this file in their place): asking for
 * one is an error that says what to install.  Where this happens: the GPU check
 * machine (scripts/gpu-check.sh), which trains on synthetic data only. */
#include "gw_config.h"

#include "data_internal.h"

#if !GW_HAVE_ZLIB
gw_result_t gw_dataset_fashion_mnist(struct gw_dataset **ds, const char *dir, enum gw_split split, int augment) {
  (void)split, (void)augment;
  *ds = NULL;
  return gw__model_fail(GW_ERR_UNSUPPORTED,
                        "fashion-mnist (%s): this build has no zlib to read its .gz files (apt-get install zlib1g-dev, "
                        "then reconfigure); --data synthetic needs nothing",
                        dir);
}
#endif

#if !GW_HAVE_TURBOJPEG
gw_result_t gw_dataset_imagefolder(struct gw_dataset **ds, const char *dir, enum gw_split split, int image_size) {
  (void)split, (void)image_size;
  *ds = NULL;
  return gw__model_fail(GW_ERR_UNSUPPORTED,
                        "imagenet:%s: this build has no libjpeg-turbo to decode JPEGs (apt-get install "
                        "libturbojpeg0-dev, then reconfigure); --data synthetic needs nothing",
                        dir);
}
#endif
