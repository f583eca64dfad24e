/* backend_load.c - finds and loads the cudnn backend's module (backend_module.h)
 * on first use.  Where it looks, first found wins:
 *   1. $GW_CUDNN_MODULE (a path; nothing else is tried when it is set);
 *   2. ../model/ beside the running program (the build tree: tools/, test/ and
 *      bench/ are model/'s siblings, wherever the tree was moved or copied);
 *   3. the directory meson installs it into (GW_BACKEND_MODULE_INSTALL_DIR).
 * A failure is kept and given again on every later call: the first message
 * says which files were tried and what the loader said about each. */
#include "gw_config.h"

#if GW_HAVE_CUDNN

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_module.h"
#include "model_internal.h"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const struct gw_backend_ops *loaded;
static char load_error[1536];

/* Opens `path` and asks it for its table; on failure appends why to load_error.
 * Nothing opened is closed again, not even on failure: what a library loaded
 * with it (cuDNN's and cuBLAS's C++ runtimes) may have registered exit
 * handlers and pools that unloading would leave dangling. */
static const struct gw_backend_ops *try_path(const char *path) {
  const size_t used = strlen(load_error);
  char *msg = load_error + used;
  const size_t room = sizeof load_error - used;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(msg, room, "%s%s", used ? "; " : "", e ? e : path);
    return NULL;
  }
  gw_backend_module_entry_fn entry;
  /* POSIX's way from a data pointer to a function pointer (dlsym's manual). */
  *(void **)(&entry) = dlsym(h, GW_BACKEND_MODULE_ENTRY);
  if (!entry) {
    snprintf(msg, room, "%s%s: no symbol %s: not gradwire's cudnn backend module", used ? "; " : "", path,
             GW_BACKEND_MODULE_ENTRY);
    return NULL;
  }
  static const struct gw_backend_module_host host = {.abi = GW_BACKEND_MODULE_ABI,
                                                     .ops_size = sizeof(struct gw_backend_ops),
                                                     .version = GW_VERSION_STRING,
                                                     .vfail = gw__model_vfail,
                                                     .last_error = gw_model_last_error};
  char why[512] = "";
  const struct gw_backend_ops *ops = entry(&host, why, sizeof why);
  if (!ops) {
    snprintf(msg, room, "%s%s: %s", used ? "; " : "", path, why);
    return NULL;
  }
  return ops;
}

/* The directory of the running program, with a trailing '/', or "" when
 * /proc/self/exe cannot be read. */
static void program_dir(char *dir, size_t len) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  dir[0] = 0;
  if (n <= 0) return;
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return;
  slash[1] = 0;
  snprintf(dir, len, "%s", exe);
}

static void load(void) {
  const char *env = getenv("GW_CUDNN_MODULE");
  if (env && *env) {
    loaded = try_path(env);
  } else {
    char dir[PATH_MAX], path[PATH_MAX + 64];
    program_dir(dir, sizeof dir);
    if (dir[0]) {
      snprintf(path, sizeof path, "%s../model/%s", dir, GW_BACKEND_MODULE_FILE);
      if (access(path, F_OK) == 0) loaded = try_path(path);
    }
    if (!loaded) {
      snprintf(path, sizeof path, "%s/%s", GW_BACKEND_MODULE_INSTALL_DIR, GW_BACKEND_MODULE_FILE);
      if (access(path, F_OK) == 0) loaded = try_path(path);
    }
    if (!loaded && !load_error[0])
      snprintf(load_error, sizeof load_error, "no %s in %s../model/ (the build tree) or %s/ (installed); "
               "GW_CUDNN_MODULE=PATH names it", GW_BACKEND_MODULE_FILE, dir[0] ? dir : "(unknown)/",
               GW_BACKEND_MODULE_INSTALL_DIR);
  }
}

const struct gw_backend_ops *gw_backend_cudnn_ops(void) {
  pthread_once(&load_once, load);
  if (!loaded) gw__model_fail(GW_ERR_UNSUPPORTED, "cudnn backend: cannot load its module: %s", load_error);
  return loaded;
}

#endif /* GW_HAVE_CUDNN */
