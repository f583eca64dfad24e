/* dev.c - picks the device layer once per process: the emulator when
 * GW_DEV_EMULATE asks for it, else CUDA when this build has it and the process
 * sees a GPU, else none (host memory only). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev.h"
#include "gw_config.h"

static pthread_once_t dev_once = PTHREAD_ONCE_INIT;
static const struct gw_dev_ops *dev_ops;
static char dev_reason[256];
static gw_dev_host_reduce_fn host_reduce;
static gw_dev_host_cast_fn host_cast;

static void dev_pick(void) {
  const char *e = getenv("GW_DEV_EMULATE");
  if (e && *e && strcmp(e, "0") != 0) {
    /* N >= 1 devices; anything else ("false", "no", "-1") used to turn the
     * emulator on with one device, so a run meant for the GPU measured the
     * emulator: no device at all then, with the reason */
    char *end;
    errno = 0;
    const long n = strtol(e, &end, 10);
    if (errno || end == e || *end || n < 1 || n > 1024) {
      snprintf(dev_reason, sizeof dev_reason,
               "GW_DEV_EMULATE=%.60s is not a number of emulated devices (1 to 1024; unset or 0 for the real ones)", e);
      return;
    }
    dev_ops = gw__dev_emu_ops((int)n);
    return;
  }
#if GW_HAVE_CUDA
  const char *why = NULL;
  dev_ops = gw__dev_cuda_ops(&why);
  if (!dev_ops) snprintf(dev_reason, sizeof dev_reason, "%s", why ? why : "no CUDA device");
#else
  snprintf(dev_reason, sizeof dev_reason,
           "this gradwire was built without CUDA (no nvcc/cudart at build time; GW_DEV_EMULATE=1 runs the emulator)");
#endif
}

const struct gw_dev_ops *gw__dev(void) {
  pthread_once(&dev_once, dev_pick);
  return dev_ops;
}

const char *gw__dev_absent_reason(void) {
  pthread_once(&dev_once, dev_pick);
  return dev_ops ? "" : dev_reason;
}

void gw__dev_set_host_reduce(gw_dev_host_reduce_fn fn) { host_reduce = fn; }

void gw__dev_set_host_cast(gw_dev_host_cast_fn fn) { host_cast = fn; }

gw_dev_host_cast_fn gw__dev_host_cast(void) { return host_cast; }

gw_dev_host_reduce_fn gw__dev_host_reduce(void) { return host_reduce; }
