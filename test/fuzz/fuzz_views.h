/* fuzz_views.h - what the image fuzz targets do with a decoded image: both
 * transforms' geometry and resampling (data/transform.c, included by the
 * target), the evaluation view and a training view drawn from `key`. */
static void fuzz_views(const unsigned char *rgb, int w, int h, uint64_t key, const float *mean, const float *std) {
  static float out[3 * 32 * 32];
  struct gw__view v;
  gw__view_val(&v, w, h, 32, 0);
  gw__resample(rgb, w, h, 3, &v, 32, 32, mean, std, out);
  gw__view_train(&v, w, h, 32, key);
  gw__resample(rgb, w, h, 3, &v, 32, 32, mean, std, out);
}
