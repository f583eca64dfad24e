/* backend_cudnn_module.c - the entry of the cudnn backend's module
 * (libgwcudnn.so, backend_module.h): checks that the program that loads it was
 * built against the same table, and sends the backend's error messages into
 * the program's gw_model_last_error (and reads them back from there).
 * Everything else in the module is hidden (built with -fvisibility=hidden), so
 * its copies of backend_check.c and of this gw__model_fail never meet the
 * program's. */
#include <stdio.h>
#include <string.h>

#include "backend_cudnn_internal.h"
#include "backend_module.h"
#include "gw_config.h"

static gw_result_t (*host_vfail)(gw_result_t, const char *, va_list);
static const char *(*host_last_error)(void);

const char *gw_model_last_error(void) { return host_last_error ? host_last_error() : ""; }

gw_result_t gw__model_fail(gw_result_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (host_vfail) host_vfail(code, fmt, ap);
  va_end(ap);
  return code;
}

__attribute__((visibility("default"))) const struct gw_backend_ops *
gw_backend_module_cudnn(const struct gw_backend_module_host *host, char *why, size_t why_len);

const struct gw_backend_ops *gw_backend_module_cudnn(const struct gw_backend_module_host *host, char *why,
                                                     size_t why_len) {
  if (!host || host->abi != GW_BACKEND_MODULE_ABI || host->ops_size != sizeof(struct gw_backend_ops) ||
      !host->version || strcmp(host->version, GW_VERSION_STRING) || !host->vfail || !host->last_error) {
    snprintf(why, why_len, "the module is gradwire %s (module ABI %d, a table of %zu bytes), the program %s (ABI %u, "
             "%zu bytes): rebuild both from one tree", GW_VERSION_STRING, GW_BACKEND_MODULE_ABI,
             sizeof(struct gw_backend_ops), host && host->version ? host->version : "?", host ? host->abi : 0,
             host ? host->ops_size : 0);
    return NULL;
  }
  host_vfail = host->vfail;
  host_last_error = host->last_error;
  return &gw__cudnn_ops;
}
