/* backend_module.h - what the cudnn backend's module (libgwcudnn.so) and the
 * program that loads it (backend_load.c) agree on.  The module holds the whole
 * backend and links cuDNN, cuBLAS and cuBLASLt; programs link none of them and
 * load the module the first time they ask for the backend
 * (gw_backend_cudnn_ops, backend.h), so a process that never uses the GPU
 * backend never loads those libraries (cuBLASLt's initializers alone took
 * 0.4 s of every process's start here) and runs where they are missing. */
#ifndef GW_MODEL_BACKEND_MODULE_H
#define GW_MODEL_BACKEND_MODULE_H

#include <stdarg.h>
#include <stddef.h>

#include "backend.h"

/* Bumped when this header or struct gw_backend_ops changes meaning without
 * changing size; a module of another ABI is refused with a message. */
#define GW_BACKEND_MODULE_ABI 2 /* 2: gw_op_desc's eps and momentum are doubles */

/* What the program lends the module: where its error messages go (the
 * program's gw_model_last_error, which the module cannot see). */
struct gw_backend_module_host {
  unsigned abi;      /* GW_BACKEND_MODULE_ABI */
  size_t ops_size;   /* sizeof(struct gw_backend_ops) */
  const char *version; /* GW_VERSION_STRING */
  gw_result_t (*vfail)(gw_result_t code, const char *fmt, va_list ap);
  const char *(*last_error)(void); /* gw_model_last_error */
};

/* The module's one exported symbol: its backend table, or NULL when `host`
 * was built for another ABI (then *why says what differs). */
#define GW_BACKEND_MODULE_ENTRY "gw_backend_module_cudnn"
typedef const struct gw_backend_ops *(*gw_backend_module_entry_fn)(const struct gw_backend_module_host *host,
                                                                   char *why, size_t why_len);

/* The module's name in the build tree (model/) and where meson installs it. */
#define GW_BACKEND_MODULE_FILE "libgwcudnn.so"

#endif
