/* gw-perf-tune.c - gw-perf --tune FILE: every algorithm and protocol of
 * float32 allreduce timed at a few sizes, the cost model's constants fitted
 * to them and written to FILE (gw_tune_write_comm). */
#include <stdio.h>

#include "gradwire.h"
#include "gw-perf-run.h"

static void tune_op(void *send, void *recv, size_t count) {
  gwp_check(gw_allreduce(send, recv, count, GW_FLOAT32, GW_SUM, gwp_comm(), NULL), "gw_allreduce");
}

/* Mean time of one allreduce of `bytes` (float32 sum), the best of three rounds,
 * as the slowest rank saw it (so every rank holds the same figure). */
static double tune_time(void *send, void *recv, size_t bytes) {
  size_t count = bytes / 4;
  int iters = bytes <= (64u << 10) ? 300 : 20;
  double best = 1e30;
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 5; i++) tune_op(send, recv, count);
    gwp_check(gw_barrier(gwp_comm()), "gw_barrier");
    double t0 = gwp_now();
    for (int i = 0; i < iters; i++) tune_op(send, recv, count);
    double t = (gwp_now() - t0) / iters * 1e6;
    gwp_check(gw_allreduce(&t, &t, 1, GW_FLOAT64, GW_MAX, gwp_comm(), NULL), "gw_allreduce(time)");
    best = t < best ? t : best;
  }
  return best;
}

/* Sizes per protocol: LL is for small messages, so its fit stays below 64 KiB;
 * simple reaches 16 MiB, where the output no longer stays in cache. */
int gwp_tune(const char *path) {
  gw_comm_t comm = gwp_comm();
  const int rank = gwp_rank(), nranks = gwp_nranks();
  static const char *algos[] = {"ring", "tree", "exchange"}, *protos[] = {"simple", "ll"};
  static const size_t sizes[2][4] = {{8, 4096, 256u << 10, 16u << 20}, {8, 512, 4096, 32768}};
  struct gw_tune_sample samples[3 * 2 * 4];
  int ns = 0;
  void *send = gwp_alloc_prefaulted(16u << 20), *recv = gwp_alloc_prefaulted(16u << 20);
  if (rank == 0) printf("# gw-perf --tune: %d ranks, float32 sum allreduce, best of 3 rounds (us)\n", nranks);
  for (int a = 0; a < 3; a++)
    for (int p = 0; p < 2; p++) {
      if (gw_comm_set_algo(comm, algos[a], protos[p]) != GW_SUCCESS) continue; /* alike on every rank */
      for (int s = 0; s < 4; s++) {
        samples[ns] = (struct gw_tune_sample){algos[a], protos[p], sizes[p][s], tune_time(send, recv, sizes[p][s])};
        if (rank == 0) { /* each row as measured: a job stopped midway keeps what it had */
          printf("%-8s %-6s %10zu B %10.2f us\n", algos[a], protos[p], sizes[p][s], samples[ns].time_us);
          fflush(stdout);
        }
        ns++;
      }
    }
  char note[128];
  snprintf(note, sizeof note, "%d ranks", nranks);
  if (rank == 0 && gw_tune_write_comm(comm, path, samples, ns, note) != GW_SUCCESS)
    gwp_die("%s", gw_comm_last_error(NULL));
  if (rank == 0) printf("# wrote %s (use it with GW_TUNING_FILE=%s)\n", path, path);
  gw_comm_destroy(comm);
  return 0;
}
