/* imagefolder.h - the ImageNet-style folder dataset's inside, shared by
 * imagefolder.c (paths, decoding, transforms) and imagefolder_scan.c (finding the
 * classes and files). */
#ifndef GW_DATA_IMAGEFOLDER_H
#define GW_DATA_IMAGEFOLDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data_internal.h"
#include "gw_config.h"
#ifndef GW_HAVE_PNG /* a configuration without it (the fuzz targets') */
#define GW_HAVE_PNG 0
#endif

struct gw__folder {
  struct gw_dataset base;
  char *paths;          /* every sample's path, NUL-terminated, one after another */
  size_t paths_len, paths_cap;
  size_t *path_at;      /* [size]: offset of each sample's path in paths */
  int32_t *labels;      /* [size] */
  int64_t cap;          /* room in path_at and labels */
  int out_size;         /* output side in pixels (image_size) */
  int val_resize;       /* evaluation's shorter side before the center crop; 0: out_size * 256 / 224 */
  /* Directories below the classes the scan left out (a link back to a
   * directory it was already in, past MAX_DEPTH levels, unreadable), and the
   * first one with why, for the dataset's description. */
  int64_t scan_skipped;
  char scan_note[320];
  /* Files named *.jpg / *.jpeg the scan left out because they could not be
   * looked at (a link to nothing or in a loop, no permission), and the first
   * one with why. */
  int64_t scan_files_skipped;
  char scan_file_note[240];
  /* Image files of other formats (torchvision's ImageFolder extensions: .png,
   * .ppm, .bmp, .pgm, .tif, .tiff, .webp), which are not decoded here: how
   * many were left out, and the first. */
  int64_t scan_other_images;
  char scan_other_note[240];
};

/* Decoded size bound, PIL's (Image.MAX_IMAGE_PIXELS times 2, past which it
 * refuses a file as a decompression bomb, as torchvision's loaders then do). */
#define GW__MAX_PIXELS 178956970ull

#if GW_HAVE_PNG
/* Whether buf starts with PNG's signature (the format is the file's, not its
 * name's: PIL opens what it recognizes). */
bool gw__is_png(const unsigned char *buf, size_t len);
/* Decodes a PNG into a new 8-bit RGB image [h, w, 3] as PIL's convert("RGB")
 * gives it (imagefolder_png.c); GW_DATA_SKIPPED naming path when damaged. */
gw_result_t gw__decode_png(const char *path, const unsigned char *buf, size_t len, unsigned char **rgb, int *w,
                           int *h);
#endif

/* Appends one sample; GW_ERR_SYSTEM when out of memory. */
gw_result_t gw__folder_add(struct gw__folder *f, const char *path, int32_t label);

/* Fills f's classes (sorted subdirectories of DIR/train) and samples (split's). */
gw_result_t gw__folder_scan(struct gw__folder *f, const char *dir, enum gw_split split);

#endif
