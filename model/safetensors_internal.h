/* safetensors_internal.h - what the safetensors reader (safetensors.c) and
 * writer (safetensors_write.c) share. */
#ifndef GW_MODEL_SAFETENSORS_INTERNAL_H
#define GW_MODEL_SAFETENSORS_INTERNAL_H

#include <sys/types.h>

#include "safetensors.h"

struct gw__st_dtype {
  const char *name;
  size_t size;
  gw_dtype_t gw; /* GW_NUM_DTYPES: none */
};

/* Names are printed up to this many bytes, so a huge name cannot push the rest of
 * a message out of gw_model_last_error()'s buffer. */
#define NAME_SHOWN 160

/* What a message is about: the file and, when there is one, the tensor. */
struct gw__st_where {
  const char *label;
  const char *tensor;
};

/* GW_ERR_INVALID_ARGUMENT with the message about w. */
__attribute__((format(printf, 2, 3))) gw_result_t gw__st_bad(const struct gw__st_where *w, const char *fmt, ...);

/* The writer's view of a tensor's dtype: the gradwire dtype, or the name when
 * there is none; NULL when the format has neither. */
const struct gw__st_dtype *gw__st_dtype_of(const struct gw_st_tensor *t);
/* product(shape) x elem into *bytes; -1 for a negative entry, -2 on overflow. */
int gw__st_shape_bytes(const int64_t *shape, int ndim, size_t elem, size_t *bytes);
/* Sort by name / by key; the first repeated name or key, or NULL. */
const char *gw__st_sort_names(const struct gw_st_tensor **by, int n);
const char *gw__st_sort_pairs(const char **kv, int n);
/* GW_ERR_SYSTEM with "path: what: strerror(errno)". */
gw_result_t gw__st_sys_fail(const char *path, const char *what);
/* "a directory", "a FIFO", ... for a file that is not regular. */
const char *gw__st_file_kind(mode_t m);

#endif
