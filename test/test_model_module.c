/* test_model_module.c - the cudnn backend as a module of its own (libgwcudnn.so,
 * model/backend_module.h, model/backend_load.c), without a GPU: the module is
 * found beside the build tree and hands out the whole table, create says there
 * is no GPU (or works where there is one), a named module that is missing or is
 * not ours is refused with the path and the reason, the failure is given again
 * on every call, a module of another ABI refuses the program, programs built
 * with cuDNN do not load its libraries until asked, and gw-train moved out of
 * the build tree says where it looked.  Each case runs in its own process
 * (Check's fork mode), so each loads the module afresh. */
#include <check.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "gw_config.h"
#include "backend_module.h"
#include "harness.h"
#include "resnet.h"

/* Whether a library whose name contains `part` is mapped into this process. */
static int mapped(const char *part) {
  FILE *f = fopen("/proc/self/maps", "r");
  ck_assert_ptr_nonnull(f);
  char line[1024];
  int found = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, part)) found = 1;
  fclose(f);
  return found;
}

START_TEST(test_loads_lazily_with_whole_table) {
  unsetenv("GW_CUDNN_MODULE");
  /* This program uses the model library and was built with cuDNN, yet nothing
   * of cuDNN or cuBLAS is loaded before it asks for the backend. */
  ck_assert_msg(!mapped("libcublas") && !mapped("libcudnn") && !mapped(GW_BACKEND_MODULE_FILE),
                "cuDNN or cuBLAS loaded before the backend was asked for");
  const struct gw_backend_ops *ops = gw_backend_cudnn_ops();
  ck_assert_msg(ops != NULL, "module not loaded: %s", gw_model_last_error());
  ck_assert(mapped(GW_BACKEND_MODULE_FILE) && mapped("libcudnn") && mapped("libcublas"));
  ck_assert_str_eq(ops->name, "cudnn");
  ck_assert_int_eq(ops->host_memory, 0);
  /* Every entry from create on is a function. */
  typedef void (*fn_t)(void);
  const size_t first = offsetof(struct gw_backend_ops, create);
  for (size_t off = first; off + sizeof(fn_t) <= sizeof *ops; off += sizeof(fn_t)) {
    fn_t f;
    memcpy(&f, (const char *)ops + off, sizeof f);
    ck_assert_msg(f != NULL, "the module's table has no function at byte %zu", off);
  }
  ck_assert_ptr_eq(gw_backend_cudnn_ops(), ops); /* loaded once */
  /* create: no GPU here says so through the program's error channel; a GPU works. */
  struct gw_backend_config cfg = {0};
  struct gw_backend *b = NULL;
  gw_result_t r = ops->create(&cfg, &b);
  if (r == GW_SUCCESS) {
    ops->destroy(b);
  } else {
    ck_assert_int_eq(r, GW_ERR_UNSUPPORTED);
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(gw_model_last_error(), "cudnn backend: no usable GPU"), "message: %s",
                  gw_model_last_error());
  }
  /* The module's checks report through the program too: a bad config. */
  cfg.tf32 = 7;
  ck_assert_int_eq(ops->create(&cfg, &b), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(gw_model_last_error(), "tf32 0 or 1 (got 0, 7)"), "message: %s", gw_model_last_error());
}
END_TEST

START_TEST(test_named_module_missing) {
  setenv("GW_CUDNN_MODULE", "/nonexistent-gw/libgwcudnn.so", 1);
  ck_assert_ptr_null(gw_backend_cudnn_ops());
  const char *e = gw_model_last_error();
  ck_assert_msg(strstr(e, "cannot load its module") && strstr(e, "/nonexistent-gw/libgwcudnn.so") &&
                    strstr(e, "No such file"), "message: %s", e);
  /* Asked again: the same failure, and the message is there again. */
  char first[1024];
  snprintf(first, sizeof first, "%s", e);
  unsetenv("GW_CUDNN_MODULE");
  ck_assert_ptr_null(gw_backend_cudnn_ops());
  ck_assert_str_eq(gw_model_last_error(), first);
}
END_TEST

START_TEST(test_named_library_not_ours) {
  /* A real shared library that is not the module: libc's math library. */
  setenv("GW_CUDNN_MODULE", "libm.so.6", 1);
  ck_assert_ptr_null(gw_backend_cudnn_ops());
  const char *e = gw_model_last_error();
  ck_assert_msg(strstr(e, "libm.so.6: no symbol " GW_BACKEND_MODULE_ENTRY) &&
                    strstr(e, "not gradwire's cudnn backend module"), "message: %s", e);
}
END_TEST

static gw_result_t host_vfail(gw_result_t code, const char *fmt, va_list ap) {
  (void)fmt, (void)ap;
  return code;
}
static const char *host_last_error(void) { return ""; }

START_TEST(test_other_abi_refused) {
  const char *path = getenv("GW_TEST_CUDNN_MODULE");
  ck_assert_ptr_nonnull(path);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "%s", dlerror());
  gw_backend_module_entry_fn entry;
  *(void **)(&entry) = dlsym(h, GW_BACKEND_MODULE_ENTRY);
  ck_assert_ptr_nonnull(entry);
  struct gw_backend_module_host host = {.abi = GW_BACKEND_MODULE_ABI, .ops_size = sizeof(struct gw_backend_ops),
                                        .version = GW_VERSION_STRING, .vfail = host_vfail,
                                        .last_error = host_last_error};
  char why[512] = "";
  ck_assert_ptr_nonnull(entry(&host, why, sizeof why));
  host.abi = GW_BACKEND_MODULE_ABI + 1;
  ck_assert_ptr_null(entry(&host, why, sizeof why));
  ck_assert_msg(strstr(why, "rebuild both from one tree"), "why: %s", why);
  host.abi = GW_BACKEND_MODULE_ABI;
  host.ops_size = sizeof(struct gw_backend_ops) - sizeof(void *); /* a program with one entry fewer */
  why[0] = 0;
  ck_assert_ptr_null(entry(&host, why, sizeof why));
  ck_assert_msg(strstr(why, "a table of"), "why: %s", why);
  host.ops_size = sizeof(struct gw_backend_ops);
  host.version = "0.0.0-other";
  ck_assert_ptr_null(entry(&host, why, sizeof why));
  ck_assert_msg(strstr(why, "the program 0.0.0-other"), "why: %s", why);
  /* Not closed: unloading cuDNN's and cuBLAS's C++ runtimes leaves their
   * pools behind (LeakSanitizer reported them), as the loader knows. */
}
END_TEST

/* gw-train copied out of the build tree, with no module beside it: the message
 * names where it looked and how to name the module. */
START_TEST(test_program_moved_out_of_tree) {
  const char *train = getenv("GW_TRAIN_BIN");
  ck_assert_ptr_nonnull(train);
  char dir[] = "/tmp/gw_mod_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char bin[64], cmd[1024], out[64];
  snprintf(bin, sizeof bin, "%s/bin", dir);
  snprintf(out, sizeof out, "%s/out", dir);
  snprintf(cmd, sizeof cmd, "mkdir -p %s && cp '%s' %s/ && env -u GW_CUDNN_MODULE %s/gw-train --backend cudnn "
           "--data synthetic --steps 1 > %s 2>&1", bin, train, bin, bin, out);
  int st = system(cmd);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0);
  FILE *f = fopen(out, "r");
  ck_assert_ptr_nonnull(f);
  char text[4096] = "";
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
  char want[160];
  snprintf(want, sizeof want, "no " GW_BACKEND_MODULE_FILE " in %s/../model/ (the build tree)", bin);
  ck_assert_msg(strstr(text, "--backend: cudnn backend: cannot load its module") && strstr(text, want) &&
                    strstr(text, "GW_CUDNN_MODULE=PATH names it"), "gw-train said: %s", text);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model-module");
  TCase *tc = tcase_create("module");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_loads_lazily_with_whole_table);
  tcase_add_test(tc, test_named_module_missing);
  tcase_add_test(tc, test_named_library_not_ours);
  tcase_add_test(tc, test_other_abi_refused);
  tcase_add_test(tc, test_program_moved_out_of_tree);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
