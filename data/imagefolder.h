/* imagefolder.h - the ImageNet-style folder dataset's inside, shared by
 * imagefolder.c (paths, decoding, transforms) and imagefolder_scan.c (finding the
 * classes and files). */
#ifndef GW_DATA_IMAGEFOLDER_H
#define GW_DATA_IMAGEFOLDER_H

#include <stddef.h>
#include <stdint.h>

#include "data_internal.h"

struct gw__folder {
  struct gw_dataset base;
  char *paths;          /* every sample's path, NUL-terminated, one after another */
  size_t paths_len, paths_cap;
  size_t *path_at;      /* [size]: offset of each sample's path in paths */
  int32_t *labels;      /* [size] */
  int64_t cap;          /* room in path_at and labels */
  int out_size;         /* output side in pixels (image_size) */
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

/* Appends one sample; GW_ERR_SYSTEM when out of memory. */
gw_result_t gw__folder_add(struct gw__folder *f, const char *path, int32_t label);

/* Fills f's classes (sorted subdirectories of DIR/train) and samples (split's). */
gw_result_t gw__folder_scan(struct gw__folder *f, const char *dir, enum gw_split split);

#endif
