/* imagefolder.c - ImageNet-style class folders (imagefolder_scan.c finds the
 * files): get() reads one JPEG, decodes it with libjpeg-turbo to RGB (grayscale
 * and CMYK files too, as PIL's convert("RGB") would), or a PNG with libpng
 * (imagefolder_png.c; a file is decoded by what its bytes are, not its name,
 * as PIL opens it), and applies torchvision's
 * transforms (transform.c): RandomResizedCrop + flip for training, Resize +
 * CenterCrop for validation, normalized with ImageNet's mean and std.
 *
 * A file that cannot be read, is not a JPEG or ends early is GW_DATA_SKIPPED with a
 * message naming it, never an error: one bad image among a million must not stop
 * a run (the loader substitutes and counts).  What is not the file's fault (no
 * descriptor or memory left) is an error naming the file and the reason: every
 * file after it would fail the same way, and substituting would quietly train
 * on whichever few samples happened to get through. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "imagefolder.h"
#include "transform.h"

#define MAX_FILE_BYTES (256u << 20)     /* no photo is larger; a bound against reading anything */
/* Decoded size bound, for the same reason: GW__MAX_PIXELS, PIL's; 16384 x
 * 16384 before, which a padded file (comments count as bytes below) could
 * claim for 0.8 GB per loader thread. */
#define MAX_PIXELS GW__MAX_PIXELS
/* Pixels per byte of file beyond which a header's size is not believed: a
 * photo compresses tens to a few hundred times, a flat frame a thousand, and a
 * 300-byte file claiming 16384 x 16384 would have each loader thread allocate
 * a gigabyte before its data is looked at. */
#define MAX_PIXELS_PER_BYTE 2000ull

static const float MEAN[3] = {0.485f, 0.456f, 0.406f};
static const float STD[3] = {0.229f, 0.224f, 0.225f};

gw_result_t gw__folder_add(struct gw__folder *f, const char *path, int32_t label) {
  size_t len = strlen(path) + 1;
  if (f->base.size == f->cap) {
    int64_t cap = f->cap ? 2 * f->cap : 1024;
    size_t *at = realloc(f->path_at, (size_t)cap * sizeof *at);
    if (at) f->path_at = at;
    int32_t *labels = realloc(f->labels, (size_t)cap * sizeof *labels);
    if (labels) f->labels = labels;
    if (!at || !labels) return gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory for the file list");
    f->cap = cap;
  }
  if (f->paths_len + len > f->paths_cap) {
    size_t cap = f->paths_cap ? 2 * f->paths_cap : 1 << 16;
    while (cap < f->paths_len + len) cap *= 2;
    char *p = realloc(f->paths, cap);
    if (!p) return gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory for the file list");
    f->paths = p;
    f->paths_cap = cap;
  }
  memcpy(f->paths + f->paths_len, path, len);
  f->path_at[f->base.size] = f->paths_len;
  f->labels[f->base.size++] = label;
  f->paths_len += len;
  return GW_SUCCESS;
}

/* Whether errno e, from opening or reading a file, is the file's own fault (a
 * skip): it is missing, unreachable, not allowed, damaged on disk or no plain
 * file.  Anything else (EMFILE, ENFILE, ENOMEM, ENOBUFS and the unforeseen) is
 * the process's or the machine's state, an error. */
static bool file_errno(int e) {
  switch (e) {
    case ENOENT: case ENOTDIR: case ENAMETOOLONG: case ELOOP: case EACCES: case EPERM: case EISDIR:
    case EIO: case ENXIO: case ENODEV: case EOVERFLOW: case EFBIG: case ESTALE: case EAGAIN:
      return true;
    default:
      return false;
  }
}

/* A failed open, fstat or read of path (errno e): a skip, or an error. */
static gw_result_t read_failed(const char *path, const char *what, int e) {
  if (file_errno(e)) return gw__model_fail(GW_DATA_SKIPPED, "%s: %s: %s", path, what, strerror(e));
  return gw__model_fail(GW_ERR_SYSTEM, "imagenet: %s: %s: %s (not the file's fault: every later file would fail too%s)",
                        path, what, strerror(e), e == EMFILE ? "; raise `ulimit -n` or use fewer loader threads" : "");
}

/* The whole file in a new buffer; unreadable is a skip, no memory or
 * descriptor an error.  Opened without blocking and checked to be a regular
 * file: a FIFO put where a listed file was would hang a loader thread in open. */
static gw_result_t read_file(const char *path, unsigned char **buf, size_t *len) {
  const int fd = gw__data_open_nowait(path); /* a leased sample waited for: skipped, it varied run to run */
  struct stat st;
  if (fd < 0) return read_failed(path, "cannot read", errno);
  if (fstat(fd, &st) != 0) {
    gw_result_t res = read_failed(path, "cannot read", errno);
    close(fd);
    return res;
  }
  gw_result_t res = GW_SUCCESS;
  if (!S_ISREG(st.st_mode))
    res = gw__model_fail(GW_DATA_SKIPPED, "%s: not a regular file", path);
  else if (st.st_size <= 0 || (uint64_t)st.st_size > MAX_FILE_BYTES)
    res = gw__model_fail(GW_DATA_SKIPPED, "%s: %lld bytes is no plausible image", path, (long long)st.st_size);
  else if (!(*buf = malloc((size_t)st.st_size)))
    res = gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory reading %s", path);
  size_t got = 0;
  while (res == GW_SUCCESS && got < (size_t)st.st_size) {
    ssize_t r = read(fd, *buf + got, (size_t)st.st_size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) res = read_failed(path, "read failed", errno);
    else if (r == 0) res = gw__model_fail(GW_DATA_SKIPPED, "%s: read failed: short file", path);
    else got += (size_t)r;
  }
  *len = (size_t)st.st_size;
  close(fd);
  return res;
}

/* Whether the JPEG in b ends: an end-of-image marker (FF D9) after the main
 * image's first start of scan.  The marker segments before it are walked by
 * their lengths (an EXIF thumbnail inside APP1 has a scan and an end of its
 * own), and entropy-coded data cannot hold FF D9 (a data FF is followed by 00).
 * libjpeg reports truncation only as a warning, and only the first warning of
 * a decode is kept: one about damage earlier in the data hid it. */
static bool has_end(const unsigned char *b, size_t n) {
  size_t p = 2;
  while (p + 4 <= n) {
    if (b[p] != 0xff) { /* extraneous bytes before a marker: libjpeg skips them too */
      p++;
      continue;
    }
    while (p + 1 < n && b[p + 1] == 0xff) p++; /* fill bytes */
    if (p + 4 > n) return false;
    const unsigned m = b[p + 1];
    const size_t seg = (size_t)b[p + 2] << 8 | b[p + 3];
    if (m == 0xd8 || (m >= 0xd0 && m <= 0xd7) || m == 0x01) { /* no length */
      p += 2;
      continue;
    }
    p += 2 + seg;
    if (m == 0xda) break;
  }
  for (size_t i = p; i + 1 < n; i++)
    if (b[i] == 0xff && b[i + 1] == 0xd9) return true;
  return false;
}

/* libjpeg keeps Adobe CMYK inverted, so (as PIL's CMYK -> RGB) r = c * k / 255. */
static void cmyk_to_rgb(unsigned char *px, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const unsigned char *s = px + 4 * i;
    unsigned k = s[3];
    unsigned char r = (unsigned char)((s[0] * k + 127) / 255), g = (unsigned char)((s[1] * k + 127) / 255),
                  b = (unsigned char)((s[2] * k + 127) / 255);
    px[3 * i] = r;
    px[3 * i + 1] = g;
    px[3 * i + 2] = b;
  }
}

/* Whether a call that returned -1 only warned, about recoverable damage
 * (extraneous bytes and the like, in files PIL reads without complaint), and
 * not about missing data.  The error code alone cannot tell: TurboJPEG 2.1
 * says TJERR_WARNING for a fatal error that came after a warning in the same
 * call (and then nothing or part of the image was written), so the message
 * must be one of libjpeg's warnings (jerror.h: JWRN_*; no fatal error's text
 * starts so). */
static bool only_warned(tjhandle tj) {
  static const char *const warnings[] = {"Corrupt JPEG data", "Inconsistent progression sequence",
                                         "Unknown Adobe color transform code", "Warning: unknown JFIF revision",
                                         "Invalid SOS parameters for sequential JPEG",
                                         "Application transferred too many scanlines"};
  const char *e = tjGetErrorStr2(tj);
  if (tjGetErrorCode(tj) != TJERR_WARNING) return false;
  for (size_t i = 0; i < sizeof warnings / sizeof *warnings; i++)
    if (!strncmp(e, warnings[i], strlen(warnings[i]))) return true;
  return false; /* "Premature end of JPEG file" among them: the rest of the image is missing */
}

/* Whether the decoder failed to allocate memory: TurboJPEG's own "Memory
 * allocation failure", or libjpeg's "Insufficient memory (case N)" for N = 0,
 * 2 or 4, its failed mallocs (the other cases are requests too large to make,
 * which a file's header can cause: a skip). */
static int decoder_out_of_memory(tjhandle tj) {
  const char *e = tjGetErrorStr2(tj), *c = strstr(e, "Insufficient memory (case ");
  if (strstr(e, "Memory allocation failure")) return 1;
  if (!c) return 0;
  const char n = c[strlen("Insufficient memory (case ")];
  return n == '0' || n == '2' || n == '4';
}

/* The decoder's failure what (a step) on path: a skip, or an error when it ran
 * out of memory. */
static gw_result_t decoder_failed(tjhandle tj, const char *path, const char *what) {
  if (decoder_out_of_memory(tj))
    return gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory decoding %s: %s", path, tjGetErrorStr2(tj));
  return gw__model_fail(GW_DATA_SKIPPED, "%s: %s: %s", path, what, tjGetErrorStr2(tj));
}

/* What buf's header says it is, for a file the JPEG decoder refused: the
 * decoder's own words alone called a cut-short JPEG "not a JPEG". */
static const char *not_decoded_as(const unsigned char *buf, size_t len) {
  if (len >= 3 && buf[0] == 0xff && buf[1] == 0xd8 && buf[2] == 0xff) return "a damaged or cut-short JPEG";
  if (len >= 6 && (!memcmp(buf, "GIF87a", 6) || !memcmp(buf, "GIF89a", 6)))
    return GW_HAVE_PNG ? "a GIF image (JPEG and PNG are read)" : "a GIF image (JPEG is read)";
  if (len >= 12 && !memcmp(buf, "RIFF", 4) && !memcmp(buf + 8, "WEBP", 4))
    return GW_HAVE_PNG ? "a WebP image (JPEG and PNG are read)" : "a WebP image (JPEG is read)";
  if (len >= 14 && !memcmp(buf, "BM", 2))
    return GW_HAVE_PNG ? "a BMP image (JPEG and PNG are read)" : "a BMP image (JPEG is read)";
  return GW_HAVE_PNG ? "not a JPEG or PNG" : "not a JPEG";
}

/* Decodes buf into a new RGB image [h, w, 3]. */
static gw_result_t decode(tjhandle tj, const char *path, const unsigned char *buf, size_t len, unsigned char **rgb,
                          int *w, int *h) {
  int subsamp, colorspace;
  *w = *h = 0;
  /* A warning while reading the markers (extraneous bytes and the like) fails
   * the header call in TurboJPEG 2.1 with the size read all the same: PIL reads
   * such files, and so do we. */
  /* And TurboJPEG 2.1 fails it for sampling factors its own tables do not
   * name (luma 3x1, chroma 2x1...), the size and colour space read all the
   * same: its decoder (libjpeg's) reads them, as PIL does (they were skipped). */
  if (tjDecompressHeader3(tj, buf, (unsigned long)len, w, h, &subsamp, &colorspace) != 0 &&
      !((only_warned(tj) || strstr(tjGetErrorStr2(tj), "Could not determine subsampling")) && *w > 0 && *h > 0))
    return decoder_failed(tj, path, not_decoded_as(buf, len));
  /* A stream of tables only ends its header at an end-of-image marker and is
   * "read" without a size: 0 x 0 would then ask the decoder for the stream's
   * own size, into no buffer (the fuzzer found it). */
  if (*w <= 0 || *h <= 0)
    return gw__model_fail(GW_DATA_SKIPPED, "%s: holds no image (%dx%d)", path, *w, *h);
  const unsigned long long px = (unsigned long long)*w * (unsigned long long)*h;
  if (px > MAX_PIXELS || px > MAX_PIXELS_PER_BYTE * len)
    return gw__model_fail(GW_DATA_SKIPPED, "%s: %dx%d pixels from %zu bytes is too large to decode", path, *w, *h,
                          len);
  if (!has_end(buf, len))
    return gw__model_fail(GW_DATA_SKIPPED, "%s: ends early (no end-of-image marker after its data)", path);
  int pf = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK ? TJPF_CMYK : TJPF_RGB;
  /* Zeroed: no path may hand on bytes the decoder never wrote (for large
   * images these are fresh pages, zero anyway). */
  *rgb = calloc((size_t)*w * (size_t)*h, (size_t)tjPixelSize[pf]);
  if (!*rgb)
    return gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory decoding %s (%dx%d pixels)", path, *w, *h);
  /* TJFLAG_LIMITSCANS: a progressive file of thousands of scans (minutes of
   * decoding) is refused. */
  if (tjDecompress2(tj, buf, (unsigned long)len, *rgb, *w, 0, *h, pf, TJFLAG_LIMITSCANS) != 0 && !only_warned(tj))
    return decoder_failed(tj, path, "cannot decode");
  if (pf == TJPF_CMYK) cmyk_to_rgb(*rgb, (size_t)*w * (size_t)*h);
  return GW_SUCCESS;
}

static gw_result_t folder_get(const struct gw_dataset *ds, int64_t index, int train, uint64_t key, float *out,
                              int32_t *label) {
  const struct gw__folder *f = (const struct gw__folder *)ds;
  const char *path = f->paths + f->path_at[index];
  unsigned char *file = NULL, *rgb = NULL;
  size_t len = 0;
  int w = 0, h = 0;
  /* A handle per call: TurboJPEG handles are not shareable between threads, and
   * making one costs little next to decoding a photo. */
  tjhandle tj = tjInitDecompress();
  gw_result_t res = tj ? read_file(path, &file, &len)
                       : gw__model_fail(GW_ERR_SYSTEM, "imagenet: cannot create a JPEG decoder: %s",
                                        tjGetErrorStr2(NULL));
#if GW_HAVE_PNG
  if (res == GW_SUCCESS && gw__is_png(file, len)) res = gw__decode_png(path, file, len, &rgb, &w, &h);
  else
#endif
  if (res == GW_SUCCESS) res = decode(tj, path, file, len, &rgb, &w, &h);
  if (res == GW_SUCCESS) {
    struct gw__view v;
    if (train) gw__view_train(&v, w, h, f->out_size, key);
    else gw__view_val(&v, w, h, f->out_size, f->val_resize);
    res = gw__resample(rgb, w, h, 3, &v, f->out_size, f->out_size, MEAN, STD, out);
  }
  *label = f->labels[index];
  free(rgb);
  free(file);
  if (tj) tjDestroy(tj);
  return res;
}

static void folder_destroy(struct gw_dataset *ds) {
  struct gw__folder *f = (struct gw__folder *)ds;
  free(f->paths);
  free(f->path_at);
  free(f->labels);
  free(f);
}

static const struct gw_dataset_ops FOLDER_OPS = {folder_get, folder_destroy};

gw_result_t gw__folder_set_val_resize(struct gw_dataset *ds, int resize) {
  struct gw__folder *f = (struct gw__folder *)ds;
  if (ds->ops != &FOLDER_OPS)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "the evaluation resize applies to imagenet:DIR data");
  if (resize != 0 && (resize < f->out_size || resize > 8192))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "imagenet: an evaluation resize to %d pixels (the shorter side) %s the image size %d: the "
                          "center crop is taken from the resized image", resize,
                          resize < f->out_size ? "is smaller than" : "is past 8192, too far from", f->out_size);
  f->val_resize = resize;
  return GW_SUCCESS;
}

gw_result_t gw_dataset_imagefolder(struct gw_dataset **ds, const char *dir, enum gw_split split, int image_size) {
  *ds = NULL;
  if (image_size < 8 || image_size > 4096)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: image size %d is outside [8, 4096]", image_size);
  struct gw__folder *f = calloc(1, sizeof *f);
  if (!f) return gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory");
  f->base.ops = &FOLDER_OPS;
  f->base.c = 3;
  f->base.h = f->base.w = f->out_size = image_size;
  gw_result_t res = gw__folder_scan(f, dir, split);
  if (res != GW_SUCCESS) {
    gw_dataset_free(&f->base);
    return res;
  }
  /* The file list below dir (where dir is mounted may differ between
   * machines) and the labels. */
  const size_t root = strlen(dir);
  uint64_t h = GW_FNV_START;
  for (int64_t i = 0; i < f->base.size; i++) {
    const char *p = f->paths + f->path_at[i];
    h = gw__fnv(h, p + root, strlen(p + root) + 1);
  }
  f->base.fingerprint = gw__fnv(h, f->labels, (size_t)f->base.size * sizeof *f->labels);
  /* The evaluation's classes with images: a training class with no folder
   * (or an empty one; refused in the scan) in val/ is left out of its scores,
   * said here (the log's "evaluation on" line), not counted as there. */
  int present = f->base.classes, first_missing = -1;
  unsigned char *seen = split == GW_SPLIT_TRAIN ? NULL : calloc((size_t)f->base.classes, 1);
  if (seen) {
    for (int64_t i = 0; i < f->base.size; i++) seen[f->labels[i]] = 1;
    present = 0;
    for (int c = 0; c < f->base.classes; c++) {
      present += seen[c];
      if (!seen[c] && first_missing < 0) first_missing = c;
    }
    free(seen);
  }
  char classes[200];
  if (first_missing < 0) snprintf(classes, sizeof classes, "%d classes", f->base.classes);
  else snprintf(classes, sizeof classes, "%d of the training split's %d classes: no folder here for %d, %.60s%s, "
                "which the scores leave out", present, f->base.classes, f->base.classes - present,
                gw_dataset_class_name(&f->base, first_missing), f->base.classes - present > 1 ? " and more" : "");
  int n = snprintf(f->base.description, sizeof f->base.description, "imagenet %s (%lld images, %s) from %s",
                   split == GW_SPLIT_TRAIN ? "train" : "val", (long long)f->base.size, classes, dir);
  if (f->scan_skipped && n > 0 && (size_t)n < sizeof f->base.description)
    n += snprintf(f->base.description + n, sizeof f->base.description - (size_t)n,
                  "; %lld director%s left out (%s)", (long long)f->scan_skipped, f->scan_skipped > 1 ? "ies" : "y",
                  f->scan_note);
  if (f->scan_files_skipped && n > 0 && (size_t)n < sizeof f->base.description)
    n += snprintf(f->base.description + n, sizeof f->base.description - (size_t)n, "; %lld file%s left out (%s)",
                  (long long)f->scan_files_skipped, f->scan_files_skipped > 1 ? "s" : "", f->scan_file_note);
  if (f->scan_other_images && n > 0 && (size_t)n < sizeof f->base.description)
    snprintf(f->base.description + n, sizeof f->base.description - (size_t)n,
             "; %lld image file%s of other formats left out (only %s are decoded; the first: %s)",
             (long long)f->scan_other_images, f->scan_other_images > 1 ? "s" : "",
             GW_HAVE_PNG ? "JPEG and PNG" : "JPEG files", f->scan_other_note);
  *ds = &f->base;
  return GW_SUCCESS;
}
