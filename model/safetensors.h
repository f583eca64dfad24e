/* safetensors.h - reads and writes the safetensors format
 * (https://github.com/huggingface/safetensors), the way weights travel between
 * gradwire and PyTorch: an 8-byte little-endian header length N, N bytes of JSON
 * naming each tensor's dtype, shape and byte range, then the raw data.
 *
 * The reader is strict, because its input may come from anywhere: it checks the
 * JSON grammar, every key, every shape and range, and that the tensors tile the data
 * section exactly; it never reads past the buffer it is given.  It is not a tensor
 * library: it does no dtype conversion and no byte swapping (gradwire runs on
 * little-endian machines only, as the format's data does).  The model-level
 * save/load that uses it is in weights.c (declared in resnet.h).
 *
 * Errors are gw_result_t: GW_ERR_INVALID_ARGUMENT for a malformed file or bad
 * arguments, GW_ERR_SYSTEM for I/O (with strerror); the message, naming the file,
 * the tensor and what is wrong, is readable with gw_model_last_error().
 */
#ifndef GW_MODEL_SAFETENSORS_H
#define GW_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "gradwire.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GW_ST_MAX_NDIM 8
/* The reference implementation's limit on N (its MAX_HEADER_SIZE). */
#define GW_ST_MAX_HEADER 100000000u

struct gw_st_tensor {
  const char *name;        /* NUL-terminated; never "__metadata__" */
  gw_dtype_t dtype;        /* GW_NUM_DTYPES for a format dtype gradwire has no
                              gw_dtype_t for (BOOL, I16, U16, U32, U64, F8_E4M3, F8_E5M2) */
  const char *dtype_name;  /* the format's name ("F32", "BOOL", ...); the reader always
                              sets it; the writer reads it only when dtype is GW_NUM_DTYPES */
  int ndim;                /* 0 (a scalar) .. GW_ST_MAX_NDIM */
  int64_t shape[GW_ST_MAX_NDIM]; /* [ndim], row-major (PyTorch's order), each >= 0 */
  size_t nbytes;           /* product(shape) x element size, checked both ways */
  const void *data;        /* [nbytes] little-endian; not aligned in general: memcpy it */
};

/* A parsed file.  Tensors keep the header's order; their data point into the
 * buffer given to gw_st_parse (which must outlive this) or into the copy that
 * gw_st_open read. */
struct gw_st_file {
  int ntensors;
  struct gw_st_tensor *tensors;  /* [ntensors] */
  int nmeta;
  const char **meta;             /* [2 * nmeta]: key, value, key, value, ... sorted by key */
  /* private */
  const struct gw_st_tensor **by_name; /* [ntensors] sorted by name, for lookups */
  char *strings;                 /* every decoded name, key and value */
  void *owned;                   /* the file's bytes, when gw_st_open read them */
};

/* Parses buf[0..len) as a whole safetensors file; label names it in messages (a
 * path, or NULL for "<buffer>").  On failure *out is NULL. */
gw_result_t gw_st_parse(struct gw_st_file **out, const void *buf, size_t len, const char *label);
/* Reads the file at path and parses it: the header first, checked against the
 * file's size, and the data only once it has been (a wrong file, however big,
 * is refused having read at most its header).  Anything but a regular file is
 * refused without waiting on it (a FIFO without a writer). */
gw_result_t gw_st_open(struct gw_st_file **out, const char *path);
/* gw_st_open with a check of the header before any data is read or has
 * memory: check(header, path, arg) sees the file's tensors (names, dtypes,
 * shapes, nbytes; data NULL) and metadata; anything but GW_SUCCESS (with its
 * message in gw_model_last_error) is returned as it is, nothing more read.
 * A file that is not what the caller wants (another model's weights, a 14 GB
 * language model) is refused by its header, however big its data.  check
 * NULL: gw_st_open. */
typedef gw_result_t (*gw_st_check_fn)(const struct gw_st_file *header, const char *path, void *arg);
gw_result_t gw_st_open_checked(struct gw_st_file **out, const char *path, gw_st_check_fn check, void *arg);
void gw_st_free(struct gw_st_file *f); /* accepts NULL */

/* The tensor named name, or NULL (a binary search). */
const struct gw_st_tensor *gw_st_find(const struct gw_st_file *f, const char *name);
/* The __metadata__ value under key, or NULL. */
const char *gw_st_metadata(const struct gw_st_file *f, const char *key);

/* The format's name of a gradwire dtype ("F32", ...) and its element size in
 * bytes; NULL / 0 if out of range. */
const char *gw_st_dtype_name(gw_dtype_t dtype);
size_t gw_st_dtype_size(gw_dtype_t dtype);
/* "[64, 3, 7, 7]" ("[]" for a scalar) into buf, truncated to cap (>= 1) bytes;
 * GW_ST_SHAPE_TEXT bytes hold any shape. */
#define GW_ST_SHAPE_TEXT 200
void gw_st_format_shape(char *buf, size_t cap, const int64_t *shape, int ndim);

/* Writes tensors t[0..n) (data in that order, no padding between them) and
 * metadata (NULL, or key, value, ..., NULL) to path atomically: into a temporary
 * file in the same directory, fsync, rename over path, fsync the directory.  On
 * any failure the temporary file is removed and whatever was at path is left as
 * it was.  Names must be unique and nbytes must match shape and dtype.
 *
 * A file replaced keeps its permission bits (the umask decides only a new
 * file's).  Where path is a symbolic link, the file it names is replaced (its
 * directory holds the temporary file and is synced) and the link stays; a link
 * to nothing is refused (GW_ERR_INVALID_ARGUMENT), nothing created.
 *
 * The temporary file, PATH.tmp.<host tag>.<pid>.<k>, is write-locked (an OFD
 * lock) until its rename, so a cleaner on the same machine (gw_st_host_tag)
 * can tell a live writer's from one a dead save left.  After the
 * rename the directory is synced; a file system that cannot sync directories
 * (EINVAL, ENOTSUP, EROFS) gets a warning on stderr, not an error, and so
 * does one that keeps no file modes (fchmod's EPERM or EOPNOTSUPP: vfat,
 * CIFS): the new file then has the mode the mount gives.  An empty PATH is
 * GW_ERR_INVALID_ARGUMENT.
 * For tests, GW_SAFETENSORS_FAIL=create|chmod|write|fsync|rename|dirsync-eio makes that
 * step fail with EIO, =dirsync makes the directory sync fail with EINVAL and
 * =chmod-eperm the mode's fchmod with EPERM (read at every call, unlike GW_* tunables, so one test can succeed and
 * then fail). */
gw_result_t gw_st_write(const char *path, const struct gw_st_tensor *t, int n, const char *const *metadata);
/* This process's file-size limit (RLIMIT_FSIZE, `ulimit -f`) in bytes,
 * UINT64_MAX where there is none: gw_st_write refuses a file larger than it
 * (GW_ERR_INVALID_ARGUMENT, nothing created, the file there kept). */
uint64_t gw_st_file_size_limit(void);
/* This machine and boot (host name and boot id, hashed): the tag in the
 * temporary files' names, whose pids and locks mean something here only. */
uint32_t gw_st_host_tag(void);

#ifdef __cplusplus
}
#endif
#endif /* GW_MODEL_SAFETENSORS_H */
