/* mpi_allreduce.c - Open MPI's MPI_Allreduce measured the way gw-perf measures ours.
 *
 * A peer harness for bench/compare.sh: float32 sum, out-of-place and in-place
 * (MPI_IN_PLACE), sizes from -b to -e stepping by a factor -f, the same table as
 * nccl-tests / gw-perf on rank 0 and the same CSV.  It is not a general MPI benchmark
 * (no other datatypes, operations or collectives) and it links nothing of gradwire.
 *
 * Buffers are allocated, initialised and freed once per size, as nccl-tests does, so
 * glibc's treatment of fresh pages shows in the figures; compare.sh runs it a second
 * time with GLIBC_TUNABLES set so that freed memory is kept, which changes exactly
 * that (Open MPI also mallocs a temporary buffer inside each large allreduce).  They
 * come from posix_memalign at a page boundary, as gw-perf's mmap'd buffers start, so
 * neither side gets an alignment the other does not (malloc gives 16 bytes).
 *
 * The check (-c 1, once per size after the timed runs) follows gw-perf's: the output
 * and the 64 bytes after it first hold all ones (NaN as float32), so an output left
 * unwritten never passes for a sum; those 64 bytes must still hold them afterwards,
 * and out of place the input must be unchanged.
 *
 * Time per size is the average per iteration on the slowest rank (MAX over ranks of
 * each rank's average).  algbw = bytes / time, busbw = algbw * 2(n-1)/n.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

struct options {
  size_t min_bytes;
  size_t max_bytes;
  size_t factor;
  int iters;
  int warmup;
  int check;
  const char *csv_path;
};

struct result {
  double time_us; /* average per iteration, slowest rank */
  double algbw;   /* GB/s, 1e9 bytes per second */
  double busbw;
  long long wrong; /* wrong elements summed over ranks, -1 when not checked */
};

static int g_rank, g_nranks;

static void die(const char *msg) {
  fprintf(stderr, "mpi_allreduce: rank %d: %s\n", g_rank, msg);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpi_allreduce [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
          "                     [-c 0|1] [--csv FILE]\n"
          "  float32 sum MPI_Allreduce, out-of-place and in-place, sizes in bytes\n"
          "  with optional suffix K, M or G (powers of 1024).  Defaults: -b 8 -e 256M\n"
          "  -f 2 -n 20 -w 5 -c 1.  Launch with mpirun; rank 0 prints the table.\n");
}

/* "8", "64K", "256M", "1G" -> bytes; 0 on a malformed or overflowing value. */
static size_t parse_size(const char *s) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) return 0;
  unsigned long long mult = 1;
  switch (*end) {
  case '\0': break;
  case 'k': case 'K': mult = 1ULL << 10; end++; break;
  case 'm': case 'M': mult = 1ULL << 20; end++; break;
  case 'g': case 'G': mult = 1ULL << 30; end++; break;
  default: return 0;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0' || v > SIZE_MAX / mult) return 0;
  return (size_t)(v * mult);
}

static int parse_int(const char *s, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < 0 || v > INT_MAX) return -1;
  *out = (int)v;
  return 0;
}

static int parse_args(int argc, char **argv, struct options *o) {
  *o = (struct options){8, (size_t)256 << 20, 2, 20, 5, 1, NULL};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      if (g_rank == 0) usage(stdout);
      return 1;
    }
    if (i + 1 >= argc) {
      if (g_rank == 0) fprintf(stderr, "mpi_allreduce: %s needs a value\n", a);
      return -1;
    }
    const char *v = argv[++i];
    int bad = 0;
    if (strcmp(a, "-b") == 0) bad = (o->min_bytes = parse_size(v)) == 0;
    else if (strcmp(a, "-e") == 0) bad = (o->max_bytes = parse_size(v)) == 0;
    else if (strcmp(a, "-f") == 0) bad = (o->factor = parse_size(v)) < 2;
    else if (strcmp(a, "-n") == 0) bad = parse_int(v, &o->iters) != 0 || o->iters < 1;
    else if (strcmp(a, "-w") == 0) bad = parse_int(v, &o->warmup) != 0;
    else if (strcmp(a, "-c") == 0) bad = parse_int(v, &o->check) != 0 || o->check > 1;
    else if (strcmp(a, "--csv") == 0) o->csv_path = v;
    else {
      if (g_rank == 0) {
        fprintf(stderr, "mpi_allreduce: unknown option %s\n", a);
        usage(stderr);
      }
      return -1;
    }
    if (bad) {
      if (g_rank == 0) fprintf(stderr, "mpi_allreduce: bad value '%s' for %s\n", v, a);
      return -1;
    }
  }
  if (o->min_bytes > o->max_bytes) {
    if (g_rank == 0) fprintf(stderr, "mpi_allreduce: -b is larger than -e\n");
    return -1;
  }
  return 0;
}

/* Rank r's element i: a small integer, so any order of summation is exact in float32
 * for fewer than 2^16 ranks.  The period 257 is not a divisor of any power-of-two
 * chunk size, so a chunk reduced into the wrong place is caught. */
static float value_of(int r, size_t i) { return (float)((long)((i + 3 * (size_t)r) % 257) - 128); }

static void fill(float *buf, size_t count, int r) {
  for (size_t i = 0; i < count; i++) buf[i] = value_of(r, i);
}

static long long count_wrong(const float *buf, size_t count) {
  long long wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float expect = 0.0f;
    for (int r = 0; r < g_nranks; r++) expect += value_of(r, i);
    if (buf[i] != expect) wrong++;
  }
  return wrong;
}

static void allreduce(const float *send, float *recv, size_t count) {
  /* MPI counts are int; a larger request would need MPI-4's _c functions. */
  int rc = MPI_Allreduce(send == NULL ? MPI_IN_PLACE : send, recv, (int)count, MPI_FLOAT,
                         MPI_SUM, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) die("MPI_Allreduce failed");
}

/* send == NULL means in place on recv.  In place, the values grow by a factor of
 * nranks per iteration and may reach inf; that does not change the speed of float
 * addition on any CPU we run on, and the checked run starts from fresh values. */
static struct result measure(const float *send, float *recv, size_t count,
                             const struct options *o) {
  struct result res;
  for (int i = 0; i < o->warmup; i++) allreduce(send, recv, count);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < o->iters; i++) allreduce(send, recv, count);
  double mine = (MPI_Wtime() - t0) / o->iters, slowest;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  double bytes = (double)count * sizeof(float);
  res.time_us = slowest * 1e6;
  res.algbw = slowest > 0 ? bytes / slowest / 1e9 : 0.0;
  res.busbw = res.algbw * 2.0 * (g_nranks - 1) / g_nranks;
  res.wrong = -1;
  return res;
}

/* Bytes after the output that the check expects untouched (gw-perf's 64). */
enum { SLACK = 64 };

/* A page-aligned buffer of `bytes` plus SLACK, as gw-perf's buffers are aligned. */
static float *alloc_buffer(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 4096, bytes + SLACK) != 0) die("out of memory allocating the buffers");
  return p;
}

/* One fresh run from known values, counted on every rank and summed: wrong output
 * elements, bytes written past the output, and out of place input elements changed
 * (gw-perf's fill_run_check).  The output and the SLACK bytes after it first hold all
 * ones, a NaN that equals no sum; in place the input then goes over the output. */
static long long check(float *send, float *recv, size_t count, int in_place) {
  const unsigned char *after = (const unsigned char *)(recv + count);
  memset(recv, 0xff, count * sizeof(float) + SLACK);
  fill(in_place ? recv : send, count, g_rank);
  allreduce(in_place ? NULL : send, recv, count);
  long long mine = count_wrong(recv, count), total;
  for (size_t b = 0; b < SLACK; b++) mine += after[b] != 0xff;
  for (size_t i = 0; !in_place && i < count; i++) mine += send[i] != value_of(g_rank, i);
  MPI_Allreduce(&mine, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

/* nccl-tests' widths: fewer decimals as the time grows, so columns stay aligned. */
static void print_time(double us) {
  if (us >= 10000.0) printf("  %7.0f", us);
  else if (us >= 100.0) printf("  %7.1f", us);
  else printf("  %7.2f", us);
}

static void print_result(const struct result *r) {
  print_time(r->time_us);
  printf("  %6.2f  %6.2f  ", r->algbw, r->busbw);
  if (r->wrong < 0) printf("%5s", "N/A");
  else printf("%5lld", r->wrong);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_nranks);

  struct options o;
  int rc = parse_args(argc, argv, &o);
  if (rc != 0) {
    MPI_Finalize();
    return rc < 0 ? 2 : 0;
  }

  FILE *csv = NULL;
  if (g_rank == 0 && o.csv_path != NULL) {
    csv = fopen(o.csv_path, "w");
    if (csv == NULL) {
      fprintf(stderr, "mpi_allreduce: cannot write %s: %s\n", o.csv_path, strerror(errno));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fprintf(csv, "size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
                 "ip_time_us,ip_algbw,ip_busbw,ip_wrong\n");
  }

  if (g_rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    char *nl = strchr(version, '\n');
    if (nl != NULL) *nl = '\0';
    char *comma = strchr(version, ',');
    if (comma != NULL) *comma = '\0';
    printf("# mpi_allreduce: %d ranks, %s, iters %d, warmup %d, check %d\n", g_nranks,
           version, o.iters, o.warmup, o.check);
    /* The header of nccl-tests and gw-perf, character for character. */
    printf("#                                                       out-of-place"
           "                       in-place\n");
    printf("#       size         count      type   redop    root     time   algbw   busbw"
           " #wrong     time   algbw   busbw #wrong\n");
    printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
           "            (us)  (GB/s)  (GB/s)\n");
    fflush(stdout);
  }

  /* Open MPI sets up some per-peer state lazily (vader's fast boxes after 16
   * messages to a peer); that is connection set-up, so it is done here rather than
   * inside the first size's timed loop, where it added about 10 us. */
  for (int i = 0; i < 32; i++) {
    float one = 1.0f;
    MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  (void)MPI_Wtime();
  /* Then the warmup's count at the largest size and at the smallest, out of
   * place, as nccl-tests (and gw-perf) do before a sweep: every FIFO page the
   * sizes reach has been written once before any timing. */
  for (int k = 0; k < 2; k++) {
    size_t count = (k == 0 ? o.max_bytes : o.min_bytes) / sizeof(float);
    if (count == 0 || count > INT_MAX) continue;
    float *send = alloc_buffer(count * sizeof(float)), *recv = alloc_buffer(count * sizeof(float));
    fill(send, count, g_rank);
    for (int i = 0; i < o.warmup; i++) allreduce(send, recv, count);
    free(send);
    free(recv);
  }

  double busbw_sum = 0.0;
  int n_results = 0;
  long long wrong_total = 0;
  for (size_t size = o.min_bytes; size <= o.max_bytes;) {
    size_t count = size / sizeof(float);
    if (count > 0 && count <= INT_MAX) {
      size_t bytes = count * sizeof(float);
      float *send = alloc_buffer(bytes), *recv = alloc_buffer(bytes);
      fill(send, count, g_rank);
      memcpy(recv, send, bytes);

      struct result oop = measure(send, recv, count, &o);
      memcpy(recv, send, bytes);
      struct result ip = measure(NULL, recv, count, &o);
      if (o.check) {
        oop.wrong = check(send, recv, count, 0);
        ip.wrong = check(send, recv, count, 1);
        wrong_total += oop.wrong + ip.wrong;
      }
      free(send);
      free(recv);

      /* "Avg bus bandwidth" is the mean over the out-of-place and the in-place
       * result of every size, as nccl-tests computes it (gw-perf does the same). */
      busbw_sum += oop.busbw + ip.busbw;
      n_results += 2;
      if (g_rank == 0) {
        printf("%12zu  %12zu  %8s  %6s  %6d", bytes, count, "float32", "sum", -1);
        print_result(&oop);
        print_result(&ip);
        printf("\n");
        fflush(stdout);
        if (csv != NULL)
          fprintf(csv, "%zu,%zu,float32,sum,-1,%.3f,%.4f,%.4f,%lld,%.3f,%.4f,%.4f,%lld\n",
                  bytes, count, oop.time_us, oop.algbw, oop.busbw, oop.wrong, ip.time_us,
                  ip.algbw, ip.busbw, ip.wrong);
      }
    } else if (count > INT_MAX && g_rank == 0) {
      fprintf(stderr, "mpi_allreduce: skipping %zu B: more than INT_MAX elements\n", size);
    }
    if (size > SIZE_MAX / o.factor) break;
    size *= o.factor;
  }

  if (g_rank == 0) {
    printf("# Out of bounds values : %lld %s\n", wrong_total, wrong_total ? "ERROR" : "OK");
    printf("# Avg bus bandwidth    : %g\n", n_results > 0 ? busbw_sum / n_results : 0.0);
    fflush(stdout);
  }
  if (csv != NULL && fclose(csv) != 0) {
    fprintf(stderr, "mpi_allreduce: writing %s failed\n", o.csv_path);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return wrong_total > 0 ? 1 : 0;
}
