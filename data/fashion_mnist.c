/* fashion_mnist.c - Fashion-MNIST read straight from its IDX .gz files with zlib
 * (train-* for the training split, t10k-* for the test split), held in memory as
 * bytes (47 MB for train) and normalized per get() with the dataset's mean 0.2860
 * and std 0.3530.  Training gets may augment as the usual torchvision recipe does:
 * RandomCrop(28, padding=2) with zero padding, then RandomHorizontalFlip.
 *
 * IDX: a big-endian header (magic 0x00000803 + count, rows, cols for images;
 * 0x00000801 + count for labels) followed by unsigned bytes.  Every header field
 * and the data length are checked, and a message names the file. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data_internal.h"

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_LABELS_MAGIC 0x00000801u
#define SIDE 28
#define PIXELS (SIDE * SIDE)
#define CLASSES 10
#define PAD 2 /* RandomCrop's zero padding on each side */
#define MAX_COUNT 10000000u /* far above the 60000 of train: a bound against absurd headers */

static const float MEAN = 0.2860f, STD = 0.3530f;

static const char *const CLASS_NAMES[CLASSES] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

struct fmnist {
  struct gw_dataset base;
  uint8_t *pixels; /* [size, 28, 28] */
  uint8_t *labels; /* [size] */
  int augment;
};

/* The gzip reader: zlib's inflate over the file, member after member, in
 * our own loop rather than gzread's: gzread took whatever follows the last
 * member, when it is no gzip header, for the file's clean end (junk
 * appended to a file passed), and its read-ahead put the trailer's check
 * error wherever its buffer happened to end.  A file that does not start
 * with gzip's magic bytes is read as it is (as gzread did). */
struct gz_in {
  int fd;
  bool raw;         /* no gzip header: the bytes as they are */
  bool member_done; /* inflate ended a member: what follows is looked at when more is wanted */
  bool ended;       /* the last member's trailer checked, and the file's end reached */
  int err;          /* errno of a failed read */
  uint64_t out, out_checked; /* bytes decoded, and those of members whose trailers were checked */
  z_stream s;
  unsigned char in[1 << 17];
};

enum gz_status {
  GZ_OK,   /* all that was asked for */
  GZ_END,  /* the file ended after a whole member (or, raw, at its end) */
  GZ_CUT,  /* the file ended inside a member */
  GZ_BAD,  /* zlib refused the data: s.msg */
  GZ_JUNK, /* after a member, bytes that are no gzip member */
  GZ_SYS   /* a read failed: err */
};

/* More of the file after what the input buffer holds: bytes read, 0 at its end, -1 (err). */
static ssize_t gz_fill(struct gz_in *g) {
  if (g->s.avail_in && g->s.next_in != g->in) memmove(g->in, g->s.next_in, g->s.avail_in);
  g->s.next_in = g->in;
  ssize_t n;
  do n = read(g->fd, g->in + g->s.avail_in, sizeof g->in - g->s.avail_in);
  while (n < 0 && errno == EINTR);
  if (n < 0) g->err = errno;
  else g->s.avail_in += (uInt)n;
  return n;
}

/* After a member's end: another member (its two magic bytes), the file's end, or junk. */
static enum gz_status gz_next_member(struct gz_in *g) {
  while (g->s.avail_in < 2) {
    const ssize_t n = gz_fill(g);
    if (n < 0) return GZ_SYS;
    if (n == 0) break;
  }
  if (!g->s.avail_in) return g->ended = true, GZ_END;
  if (g->s.avail_in < 2 || g->s.next_in[0] != 0x1f || g->s.next_in[1] != 0x8b) return GZ_JUNK;
  g->member_done = false;
  return inflateReset(&g->s) == Z_OK ? GZ_OK : GZ_BAD;
}

/* Up to len bytes of the data into buf, *got of them. */
static enum gz_status gz_read(struct gz_in *g, void *buf, size_t len, size_t *got) {
  *got = 0;
  while (*got < len) {
    if (g->ended) return GZ_END;
    if (g->member_done) {
      const enum gz_status st = gz_next_member(g);
      if (st != GZ_OK) return st;
    }
    const uInt room = len - *got > (1u << 30) ? 1u << 30 : (uInt)(len - *got);
    if (!g->s.avail_in) {
      const ssize_t n = gz_fill(g);
      if (n < 0) return GZ_SYS;
      if (n == 0) return g->raw ? (g->ended = true, GZ_END) : GZ_CUT;
    }
    if (g->raw) {
      const uInt n = g->s.avail_in < room ? g->s.avail_in : room;
      memcpy((unsigned char *)buf + *got, g->s.next_in, n);
      g->s.next_in += n, g->s.avail_in -= n, *got += n;
      continue;
    }
    g->s.next_out = (Bytef *)buf + *got;
    g->s.avail_out = room;
    const int r = inflate(&g->s, Z_NO_FLUSH);
    *got += room - g->s.avail_out;
    g->out += room - g->s.avail_out;
    if (r == Z_STREAM_END) g->member_done = true, g->out_checked = g->out;
    else if (r == Z_MEM_ERROR) return g->err = ENOMEM, GZ_SYS;
    else if (r != Z_OK && r != Z_BUF_ERROR) return GZ_BAD;
  }
  return GZ_OK;
}

/* Where the reader is in the file (the bytes read less those not yet
 * decoded), and the bytes after it. */
static long long gz_offset(const struct gz_in *g) {
  const off_t at = lseek(g->fd, 0, SEEK_CUR);
  return at < 0 ? -1 : (long long)at - g->s.avail_in;
}
static long long gz_left(const struct gz_in *g) {
  struct stat st;
  const long long at = gz_offset(g);
  return at < 0 || fstat(g->fd, &st) != 0 ? -1 : (long long)st.st_size - at;
}

static void gz_close(struct gz_in *g) {
  if (!g) return;
  if (!g->raw) inflateEnd(&g->s);
  close(g->fd);
  free(g);
}

/* Whether zlib's error is the gzip trailer's check failing: the CRC-32 (or
 * the length) of all the data, so the damage may be anywhere in the file. */
static bool zlib_check_failed(const struct gz_in *g) {
  const char *why = g->s.msg ? g->s.msg : "";
  return !strcmp(why, "incorrect data check") || !strcmp(why, "incorrect length check");
}

/* zlib's refusal, named: the checksum's failure, or the damage where it was met. */
static gw_result_t zlib_refused(const struct gz_in *g, const char *path, const char *what, size_t at, size_t total) {
  const char *why = g->s.msg ? g->s.msg : "bad data";
  if (zlib_check_failed(g))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: corrupt: its gzip checksum does not match the "
                          "data (zlib: %s): the file is damaged somewhere in it", path, why);
  if (!what)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: damaged after its %zu items, near byte %lld of "
                          "the file (zlib: %s)", path, total, gz_offset(g), why);
  return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: corrupt: zlib failed reading %s, %zu of its %zu "
                        "bytes in, near byte %lld of the file: %s", path, what, at, total, gz_offset(g), why);
}

/* Reads exactly len bytes; anything short is a truncated file.  For the
 * message: `before` bytes of `what` were read already, of `total`. */
static gw_result_t read_exact(struct gz_in *g, const char *path, void *buf, size_t len, const char *what,
                              size_t before, size_t total) {
  size_t got = 0;
  const enum gz_status st = gz_read(g, buf, len, &got);
  if (st == GZ_OK) return GW_SUCCESS;
  if (st == GZ_SYS)
    return gw__model_fail(GW_ERR_SYSTEM, "fashion-mnist: %s: cannot read %s: %s", path, what, strerror(g->err));
  if (st == GZ_BAD) return zlib_refused(g, path, what, before + got, total);
  if (st == GZ_JUNK)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: truncated: %s needs %zu bytes, its gzip stream "
                          "ends after %zu (followed by %lld bytes that are no gzip data)", path, what, total,
                          before + got, gz_left(g));
  return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: truncated: %s needs %zu bytes, the file ends "
                        "after %zu", path, what, total, before + got);
}

/* Reads exactly len bytes into a new buffer *data, grown as they arrive: a
 * header claiming ten million items in a file of a few bytes costs no more
 * than the file holds before it is found truncated. */
static gw_result_t read_grown(struct gz_in *g, const char *path, uint8_t **data, size_t len, const char *what) {
  size_t cap = len < (16u << 20) ? len : (16u << 20), got = 0;
  *data = malloc(cap ? cap : 1);
  if (!*data) return gw__model_fail(GW_ERR_SYSTEM, "fashion-mnist: out of memory for %s", path);
  while (got < len) {
    if (got == cap) {
      cap = len - cap < cap ? len : 2 * cap;
      uint8_t *p = realloc(*data, cap);
      if (!p) return gw__model_fail(GW_ERR_SYSTEM, "fashion-mnist: out of memory for %s", path);
      *data = p;
    }
    GW_MODEL_TRY(read_exact(g, path, *data + got, cap - got, what, got, len));
    got = cap;
  }
  return GW_SUCCESS;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Opened without waiting (O_NONBLOCK), and only a regular file is read: a
 * FIFO put in the dataset's place (no writer) hung gzopen's open() forever. */
static gw_result_t open_gz(struct gz_in **out, const char *path) {
  *out = NULL;
  const int fd = gw__data_open_nowait(path);
  struct stat st;
  if (fd < 0)
    return gw__model_fail(GW_ERR_SYSTEM, "fashion-mnist: cannot open %s: %s (is dataset-fashion-mnist installed?)",
                          path, strerror(errno));
  const bool looked = fstat(fd, &st) == 0, regular = looked && S_ISREG(st.st_mode);
  if (!regular || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    const int e = errno;
    close(fd);
    if (looked && !regular)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s is not a regular file", path);
    return gw__model_fail(GW_ERR_SYSTEM, "fashion-mnist: cannot open %s: %s", path, strerror(e));
  }
  struct gz_in *g = calloc(1, sizeof *g);
  if (!g) {
    close(fd);
    return gw__model_fail(GW_ERR_SYSTEM, "fashion-mnist: cannot open %s: out of memory", path);
  }
  g->fd = fd;
  g->s.next_in = g->in;
  ssize_t n = 1;
  while (g->s.avail_in < 2 && n > 0) n = gz_fill(g);
  if (n < 0) {
    const gw_result_t r = gw__model_fail(GW_ERR_SYSTEM, "fashion-mnist: cannot read %s: %s", path, strerror(g->err));
    g->raw = true, gz_close(g);
    return r;
  }
  g->raw = g->s.avail_in < 2 || g->in[0] != 0x1f || g->in[1] != 0x8b;
  if (!g->raw && inflateInit2(&g->s, 16 + MAX_WBITS) != Z_OK) { /* gzip only */
    g->raw = true, gz_close(g);
    return gw__model_fail(GW_ERR_SYSTEM, "fashion-mnist: cannot open %s: out of memory", path);
  }
  *out = g;
  return GW_SUCCESS;
}

/* Reads the header fields after the magic number: nfields big-endian words. */
static gw_result_t read_header(struct gz_in *g, const char *path, uint32_t magic, uint32_t *fields, int nfields) {
  uint8_t h[16];
  GW_MODEL_TRY(read_exact(g, path, h, 4 * (size_t)(nfields + 1), "the IDX header", 0, 4 * (size_t)(nfields + 1)));
  if (be32(h) != magic)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT,
                          "fashion-mnist: %s: bad magic number 0x%08x (an IDX %s file starts with 0x%08x)", path,
                          be32(h), magic == IDX_IMAGES_MAGIC ? "image" : "label", magic);
  for (int i = 0; i < nfields; i++) fields[i] = be32(h + 4 * (i + 1));
  if (fields[0] == 0 || fields[0] > MAX_COUNT)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: implausible item count %u", path, fields[0]);
  return GW_SUCCESS;
}

/* Nothing may follow the items: two files joined would pass for one, and
 * junk appended to the gzip stream is a damaged file.  The gzip trailer (its
 * CRC-32 of everything) may be checked only here, when the items ended with
 * the last inflate's output. */
static gw_result_t check_end(struct gz_in *g, const char *path, uint32_t items, size_t data_bytes) {
  unsigned char extra[1 << 16];
  size_t got = 0;
  enum gz_status st = gz_read(g, extra, 1, &got);
  if (st == GZ_OK) {
    /* what follows read to its end (256 MiB at most): a damaged stream often
     * decodes past the items and fails its check only there, which is
     * damage, not a second file */
    for (size_t drained = 0; st == GZ_OK && drained < (256u << 20); drained += got)
      st = gz_read(g, extra, sizeof extra, &got);
    if (st != GZ_BAD && st != GZ_SYS)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: data follows its %u items (a damaged file, "
                            "or two joined)", path, items);
  }
  switch (st) {
  case GZ_OK:
  case GZ_END: return GW_SUCCESS;
  case GZ_CUT: /* the input ended inside the gzip stream: its trailer (the CRC-32) is missing, and the items it
                * would have checked loaded unchecked; or a member after the items' own is cut short */
    if (g->out_checked >= data_bytes)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: truncated: a gzip member after its %u items "
                            "is cut short (the items' own members are whole and checked): the file is damaged", path,
                            items);
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: truncated: the gzip stream ends after its %u "
                          "items without its trailer (the checksum of the data): the file is cut short", path, items);
  case GZ_JUNK: {
    const long long left = gz_left(g);
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: damaged: %lld byte%s after its gzip stream, "
                          "from byte %lld, %s no gzip data (its %u items are whole and checked)", path, left,
                          left == 1 ? "" : "s", gz_offset(g), left == 1 ? "is" : "are", items);
  }
  case GZ_BAD: return zlib_refused(g, path, NULL, 0, items);
  case GZ_SYS: break;
  }
  return gw__model_fail(GW_ERR_SYSTEM, "fashion-mnist: %s: cannot read it: %s", path, strerror(g->err));
}

/* Reads an IDX file whole: images (magic 0x803: count, rows, cols; 28x28 bytes
 * each) or labels (0x801: count; one byte each) into a new buffer *data. */
static gw_result_t load_idx(const char *path, uint32_t magic, uint8_t **data, uint32_t *count) {
  int images = magic == IDX_IMAGES_MAGIC;
  struct gz_in *g;
  GW_MODEL_TRY(open_gz(&g, path));
  uint32_t hdr[3] = {0};
  gw_result_t res = read_header(g, path, magic, hdr, images ? 3 : 1);
  if (res == GW_SUCCESS && images && (hdr[1] != SIDE || hdr[2] != SIDE))
    res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: images are %ux%u, expected %dx%d", path,
                         hdr[1], hdr[2], SIDE, SIDE);
  size_t bytes = (size_t)hdr[0] * (images ? PIXELS : 1);
  if (res == GW_SUCCESS) res = read_grown(g, path, data, bytes, images ? "the pixels" : "the labels");
  if (res == GW_SUCCESS) res = check_end(g, path, hdr[0], (images ? 16 : 8) + bytes);
  *count = hdr[0];
  gz_close(g);
  return res;
}

static gw_result_t check_labels(const struct fmnist *d, const char *path, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    if (d->labels[i] >= CLASSES)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s: label %u of item %u is not below %d", path,
                            d->labels[i], i, CLASSES);
  return GW_SUCCESS;
}

static gw_result_t fmnist_get(const struct gw_dataset *ds, int64_t index, int train, uint64_t key, float *out,
                              int32_t *label) {
  const struct fmnist *d = (const struct fmnist *)ds;
  const uint8_t *src = d->pixels + (size_t)index * PIXELS;
  int dy = 0, dx = 0, flip = 0; /* crop offset into the image padded by PAD, and the flip */
  if (train && d->augment) {
    struct gw_rng r;
    gw__rng_from_key(&r, key);
    dy = (int)gw__rng_below(&r, 2 * PAD + 1) - PAD;
    dx = (int)gw__rng_below(&r, 2 * PAD + 1) - PAD;
    flip = gw__rng_uniform(&r) < 0.5;
  }
  /* Precomputed affine form of (v / 255 - mean) / std. */
  const float scale = 1.0f / (255.0f * STD), shift = -MEAN / STD;
  for (int y = 0; y < SIDE; y++) {
    for (int x = 0; x < SIDE; x++) {
      int sy = y + dy, sx = (flip ? SIDE - 1 - x : x) + dx;
      int v = (sy >= 0 && sy < SIDE && sx >= 0 && sx < SIDE) ? src[sy * SIDE + sx] : 0;
      out[y * SIDE + x] = (float)v * scale + shift;
    }
  }
  *label = d->labels[index];
  return GW_SUCCESS;
}

static void fmnist_destroy(struct gw_dataset *ds) {
  struct fmnist *d = (struct fmnist *)ds;
  free(d->pixels);
  free(d->labels);
  free(d);
}

static const struct gw_dataset_ops FMNIST_OPS = {fmnist_get, fmnist_destroy};

static gw_result_t fmnist_load(struct fmnist *d, const char *dir, enum gw_split split) {
  const char *prefix = split == GW_SPLIT_TRAIN ? "train" : "t10k";
  char ipath[4096], lpath[4096];
  int n = snprintf(ipath, sizeof ipath, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
  snprintf(lpath, sizeof lpath, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
  if (n < 0 || (size_t)n >= sizeof ipath)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: the directory name %s is too long", dir);
  uint32_t nimages = 0, nlabels = 0;
  GW_MODEL_TRY(load_idx(ipath, IDX_IMAGES_MAGIC, &d->pixels, &nimages));
  GW_MODEL_TRY(load_idx(lpath, IDX_LABELS_MAGIC, &d->labels, &nlabels));
  GW_MODEL_TRY(check_labels(d, lpath, nlabels));
  if (nimages != nlabels)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "fashion-mnist: %s has %u images but %s has %u labels", ipath,
                          nimages, lpath, nlabels);
  d->base.size = nimages;
  d->base.fingerprint = gw__fnv(GW_FNV_START, d->labels, nlabels);
  d->base.content = gw__fnv(d->base.fingerprint, d->pixels, (size_t)nimages * PIXELS); /* ~60 ms for 47 MB */
  snprintf(d->base.description, sizeof d->base.description, "fashion-mnist %s (%u samples) from %s",
           split == GW_SPLIT_TRAIN ? "train" : "test", nimages, dir);
  return gw__dataset_set_classes(&d->base, CLASS_NAMES, CLASSES);
}

gw_result_t gw_dataset_fashion_mnist(struct gw_dataset **ds, const char *dir, enum gw_split split, int augment) {
  *ds = NULL;
  struct fmnist *d = calloc(1, sizeof *d);
  if (!d) return gw__model_fail(GW_ERR_SYSTEM, "fashion-mnist: out of memory");
  d->base.ops = &FMNIST_OPS;
  d->base.c = 1;
  d->base.h = d->base.w = SIDE;
  d->base.classes = CLASSES;
  d->augment = augment;
  gw_result_t res = fmnist_load(d, dir, split);
  if (res != GW_SUCCESS) {
    gw_dataset_free(&d->base);
    return res;
  }
  *ds = &d->base;
  return GW_SUCCESS;
}
