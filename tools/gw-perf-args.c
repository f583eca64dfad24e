/* gw-perf-args.c - gw-perf's help text and the parsers of its flags' values
 * (sizes with K/M/G suffixes, bounded integers); a refused value exits 2
 * through gwp_bad_use (gw-perf.c, which reads the command line). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "decimal.h"
#include "gw-perf-run.h"

void gwp_usage(FILE *f) {
  fprintf(f,
          "usage: gw-run -n N gw-perf [options]\n"
          "  -b, --minbytes SIZE   smallest size (default 8; K/M/G suffixes)\n"
          "  -e, --maxbytes SIZE   largest size (default 64M, at most 64G)\n"
          "  -f, --stepfactor F    multiply the size by F each step (default 2)\n"
          "  -i, --stepbytes SIZE  add SIZE bytes each step instead (linear steps)\n"
          "  -n, --iters N         timed iterations per size (default 20)\n"
          "  -w, --warmup_iters N  untimed iterations per size, and before each sweep at the largest size then\n"
          "                        the smallest, as nccl-tests (default 5)\n"
          "  -d, --datatype T      int8|uint8|int32|int64|float16|bfloat16|float32|float64|all (default float32;\n"
          "                        also char, int, long, half, fp16, bf16, float, double; any case)\n"
          "  -o, --op OP           sum|prod|max|min|avg|all (default sum; avg on integers: the sum as the type\n"
          "                        wraps it, divided by the ranks, toward zero, as NCCL)\n"
          "  -c, --check 0|1       verify results (default 1)\n"
          "  -a, --algo NAME       auto|ring|tree|exchange (allreduce; exchange: one hop at 2 ranks, recursive doubling above; default auto)\n"
          "  -p, --proto NAME      auto|simple|ll (ll: shared memory only; default auto)\n"
          "  -R, --register        register the buffers (gw_comm_register): over ib, chunks go straight from them\n"
          "  -D, --device          buffers in device memory, calls ordered on a stream (times to the stream's end)\n"
          "      --tune FILE       measure every algorithm and protocol, write the fitted cost model to FILE\n"
          "  -C, --collective NAME allreduce|allgather|reduce_scatter|broadcast (default allreduce)\n"
          "  -r, --root R          broadcast root (default 0)\n"
          "      --csv FILE        write the results as CSV (rank 0)\n"
          "      --json FILE       write the results as JSON (rank 0)\n"
          "      --min-bw GBPS     fail (exit 1) when the closing average bus bandwidth is below GBPS (as\n"
          "                        nccl-tests' NCCL_TESTS_MIN_BW)\n"
          "  -g, --ngpus 1, -t, --nthreads 1  accepted as nccl-tests' (a rank is a process with one GPU: more ranks\n"
          "                        with gw-run -n); its -a, -p, -C, -R and -c N mean other things there\n"
          "  -h, --help            this text\n"
          "exit status: 0 every result right, 1 wrong results or a failure, 2 a bad command line\n");
}

size_t gwp_parse_size(const char *s, const char *what) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  double mul = 1;
  if (*end == 'k' || *end == 'K') mul = 1024.0, end++;
  else if (*end == 'm' || *end == 'M') mul = 1048576.0, end++;
  else if (*end == 'g' || *end == 'G') mul = 1073741824.0, end++;
  if (*end == 'B' || *end == 'b') end++;
  if (errno || end == s || *end || !gw_decimal_text(s) || !(v >= 0)) gwp_bad_use("%s '%s' is not a size", what, s);
  if (!(v * mul <= 64.0 * 1073741824.0)) gwp_bad_use("%s '%s' is above the largest size gw-perf takes, 64G", what, s);
  if (v * mul != floor(v * mul)) gwp_bad_use("%s '%s' is not a whole number of bytes", what, s);
  return (size_t)(v * mul);
}

int gwp_parse_int_arg(const char *s, int lo, int hi, const char *what) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || !gw_decimal_text(s) || v < lo || v > hi)
    gwp_bad_use("%s '%s' is not an integer in %d..%d", what, s, lo, hi);
  return (int)v;
}
