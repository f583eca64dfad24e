/* fuzz_tune.c - libFuzzer target for the tuning file (comm/tune.c): arbitrary
 * bytes as GW_TUNING_FILE, loaded for a few world sizes and every transport
 * class, checked as gw-perf --tune checks a file it will replace, and merged
 * with fitted rows by the writer.  No crash, over-read or leak is allowed; a
 * file loaded must leave every constant in the loader's ranges (or the table
 * untouched when refused), and the writer's result must load.  Built by
 * test/fuzz.sh; includes tune.c to reach its statics. */
#include "../../comm/tune.c"

#include <sys/mman.h>

/* tune.c's gw_tune_write_comm takes a communicator: not reached here */
bool gw__comm_peek(struct gw_comm *comm, const char *fn) { return (void)comm, (void)fn, false; }
void gw__comm_unpeek(struct gw_comm *comm) { (void)comm; }

static char dir[64];
static void remove_dir(void) { rmdir(dir); }

static bool in_ranges(const struct gw_model *m, const struct gw_model *def) {
  for (int a = GW_ALGO_RING; a < GW_MODEL_NALGOS; a++)
    for (int p = 0; p < GW_MODEL_NPROTOS; p++) {
      const bool same = m->lat_us[a][p] == def->lat_us[a][p] && m->bw_gbps[a][p] == def->bw_gbps[a][p];
      if (!same && !(m->lat_us[a][p] >= 0 && m->lat_us[a][p] < 1e6 && m->bw_gbps[a][p] >= 1e-6 &&
                     m->bw_gbps[a][p] < 1e5))
        return false;
    }
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  if (!dir[0]) {
    setenv("GW_DEBUG", "NONE", 1);
    snprintf(dir, sizeof dir, "/tmp/gw-fuzz-tune-XXXXXX");
    if (!mkdtemp(dir)) __builtin_trap();
    atexit(remove_dir);
  }
  char path[96];
  snprintf(path, sizeof path, "%s/t", dir);
  FILE *f = fopen(path, "w");
  if (!f) __builtin_trap();
  if (len) fwrite(data, 1, len, f);
  fclose(f);
  struct gw_model def;
  gw__model_defaults(&def);
  for (int n = 2; n <= 4; n++)
    for (int t = GW_TCLASS_NONE; t <= GW_TCLASS_TCP; t++) {
      struct gw_model m = def;
      struct gw_errctx err;
      int applied = -1;
      const gw_result_t r = gw__model_load(&m, path, n, t, &applied, &err);
      if (r != GW_SUCCESS && (memcmp(&m, &def, sizeof m) || applied != 0)) __builtin_trap(); /* refused: untouched */
      if (r == GW_SUCCESS && (!in_ranges(&m, &def) || applied < 0)) __builtin_trap();
    }
  char why[200];
  if (gw__tune_replaceable(path, why, sizeof why) == 0) {
    /* the writer keeps what it may and adds 2-rank tcp rows: the result loads */
    struct gw_tune_sample s[2] = {{"ring", "simple", 8, 10.0}, {"ring", "simple", 1 << 20, 300.0}};
    if (gw__tune_write(path, 2, 0, GW_TCLASS_TCP, s, 2, "fuzz") == GW_SUCCESS) {
      struct gw_model m = def;
      struct gw_errctx err;
      int applied = 0;
      if (gw__model_load(&m, path, 2, GW_TCLASS_TCP, &applied, &err) != GW_SUCCESS || applied < 1) __builtin_trap();
    }
  }
  unlink(path);
  char lock[104];
  snprintf(lock, sizeof lock, "%s.lock", path);
  unlink(lock);
  return 0;
}
