/* model_fail_stub.h - resnet.c's error recorder for the fuzz targets that
 * include a model/ or data/ file without the rest of the model: the message
 * goes into fuzz_error.  Included once per target (each is a program of its own). */
#include <stdarg.h>
#include <stdio.h>

static char fuzz_error[512];
gw_result_t gw__model_fail(gw_result_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(fuzz_error, sizeof fuzz_error, fmt, ap);
  va_end(ap);
  return code;
}
