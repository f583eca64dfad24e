/* test_collectives.c - the correctness grid, run as real processes: world sizes
 * {1,2,3,4,7,8} x counts {0,1,2,7,1023,65537,4194307} x every dtype x every op,
 * in place and out of place, against a serial reference computed here.  Integer
 * results must be exact (wrap-around included); floating results must be within
 * the stated tolerance:
 *   SUM:  |got - ref| <= (n + 1) * u * sum_r |x_r|
 *   AVG:  |got - ref| <= (n + 2) * u * sum_r |x_r| / n
 *   PROD: |got - ref| <= (n + 1) * 1.01 * u * |ref|
 *   MAX/MIN, broadcast, allgather: exact
 * where u is the dtype's unit roundoff (fp16 2^-11, bf16 2^-8, fp32 2^-24, fp64
 * 2^-53): each of the n - 1 ring steps rounds once to the dtype.  Every rank must
 * also end with bit-identical allreduce results (in place too), so each rank
 * checks only its own stripe of an allreduce against the reference (the check
 * was 90% of the grid's time).  Check's case name selects the world size
 * (GW_TEST_NRANKS=8 runs 8 ranks), so meson runs the sizes in parallel;
 * GW_TEST_MAX_COUNT leaves out larger counts (the 64-rank run keeps to small
 * ones: 64 processes on 2 cores), GW_TEST_COUNTS=0,1,... replaces the list (the
 * tree's runs add the counts around its half split and chunk boundaries, the
 * LL runs (GW_PROTO=ll) those around LL's inline bytes, lines and chunks).  The
 * allreduce grid and the barrier are the Check case "allreduce", the other
 * collectives "grid", so CK_RUN_CASE can pick one.  `--tree` runs the tree's
 * own tests instead: the shape of both trees for every world size up to 300, a
 * rank killed during a tree allreduce, a tree allreduce against a ring
 * collective (both also in the LL format), ranks that disagree on GW_ALGO, and
 * a NaN through MAX and MIN by every algorithm. */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "comm.h" /* gw__tree_shape */
#include "harness.h"

#define MAX_COUNT 4194307u
static size_t counts[64];
static size_t NCOUNTS;

static void init_counts(void) {
  const char *cap = getenv("GW_TEST_MAX_COUNT"), *list = getenv("GW_TEST_COUNTS");
  size_t max = cap ? (size_t)strtoull(cap, NULL, 10) : SIZE_MAX;
  if (!list) list = "0,1,2,7,1023,65537,4194307";
  NCOUNTS = 0;
  for (char *end = NULL; !end || *end; list = end + 1) {
    size_t c = (size_t)strtoull(list, &end, 10);
    if (end == list || (*end && *end != ',') || c > MAX_COUNT || NCOUNTS == sizeof counts / sizeof counts[0]) {
      fprintf(stderr, "GW_TEST_COUNTS: '%s' is not a list of counts up to %u\n", list, MAX_COUNT);
      exit(2);
    }
    if (c <= max) counts[NCOUNTS++] = c;
  }
}
#define TAB 65536

/* ---- inputs: per dtype and op class a table of values, indexed by (rank, i) ---- */
static double ftab[2][TAB];  /* float inputs: [0] sum/avg/max/min in [-1,1], [1] prod in [0.875,1.125] */
static double rtab[GW_NUM_DTYPES][2][TAB]; /* the same, rounded to each float dtype and read back */
static uint64_t itab[TAB];   /* integer inputs: random bits */
static double unit[GW_NUM_DTYPES]; /* unit roundoff, 0 for integers */

static void init_stored(void);

static void init_tables(void) {
  for (int i = 0; i < TAB; i++) {
    double u = (double)(mix64((uint64_t)i) >> 11) * 0x1p-53;
    ftab[0][i] = 2 * u - 1;
    ftab[1][i] = 0.875 + 0.25 * u;
    itab[i] = mix64((uint64_t)i + 0x12345);
  }
  for (int dt = 0; dt < GW_NUM_DTYPES; dt++)
    if ((unit[dt] = test_unit_roundoff(dt)) > 0)
      for (int k = 0; k < 2; k++)
        for (int i = 0; i < TAB; i++) {
          uint8_t tmp[8];
          gw_value_store(tmp, dt, 0, ftab[k][i]);
          rtab[dt][k][i] = gw_value_load(tmp, dt, 0);
        }
  init_stored();
}

static inline size_t idx(int r, size_t i) { return ((uint32_t)i * 2654435761u + (uint32_t)r * 40503u + (uint32_t)(i >> 16) * 97u) >> 16; }
static inline double fval(int op, int r, size_t i) { return ftab[op == GW_PROD][idx(r, i)]; }

/* 16-bit floats get inputs whose reductions are exact in them at any order,
 * so one rank's contribution missing or doubled shows (a rounding tolerance
 * at 64 ranks exceeded a whole contribution): integers -2..2 to sum (partial
 * sums stay integers of at most 2n, exact in bfloat16's 8 bits up to n = 64),
 * and to multiply +-2 on even ranks, +-1/2 on odd ones (products +-1 or +-2). */
static inline bool is_half(gw_dtype_t dt) { return dt == GW_FLOAT16 || dt == GW_BFLOAT16; }
static double hval(int op, int r, size_t i) {
  uint64_t bits = itab[idx(r, i)];
  if (op == GW_PROD) return (bits & 1 ? -1.0 : 1.0) * (r % 2 ? 0.5 : 2.0);
  return (double)(int)(bits % 5) - 2.0;
}
static inline uint64_t ival(int r, size_t i) { return itab[idx(r, i)]; }

/* Integer semantics of the type: wrap, sign-extend, and compare in the type. */
static int64_t norm(gw_dtype_t dt, uint64_t u) {
  switch (dt) {
    case GW_INT8: return (int8_t)u;
    case GW_UINT8: return (uint8_t)u;
    case GW_INT32: return (int32_t)u;
    default: return (int64_t)u;
  }
}

/* The bits each float input is stored as, per dtype and table (through
 * gw_value_store once, at init): the fills copy them, a loop per dtype with no
 * conversion per element (the grid's own filling and checking were most of
 * its time, far more than the collectives it checks).  16-bit types: the
 * five summands -2..2 and the four factors (+-2, +-1/2). */
static float f32tab[2][TAB];
static float h16[65536]; /* every float16 bit pattern's value (a conversion per element was 4% of the grid) */
static uint16_t hsum[2][5], hprod[2][2][2]; /* [bf16?][value + 2], [bf16?][odd rank][sign bit] */

static void init_stored(void) {
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < TAB; i++) gw_value_store(&f32tab[k][i], GW_FLOAT32, 0, ftab[k][i]);
  for (uint32_t b = 0; b < 65536; b++) {
    const uint16_t bits = (uint16_t)b;
    h16[b] = (float)gw_value_load(&bits, GW_FLOAT16, 0);
  }
  for (int b = 0; b < 2; b++) {
    const gw_dtype_t dt = b ? GW_BFLOAT16 : GW_FLOAT16;
    for (int v = 0; v < 5; v++) gw_value_store(&hsum[b][v], dt, 0, v - 2.0);
    for (int odd = 0; odd < 2; odd++)
      for (int neg = 0; neg < 2; neg++) gw_value_store(&hprod[b][odd][neg], dt, 0, (neg ? -1.0 : 1.0) * (odd ? 0.5 : 2.0));
  }
}

#define FILL(T, EXPR)                                        \
  do {                                                       \
    T *b_ = buf;                                             \
    for (size_t i = 0; i < n; i++) b_[i] = (T)(EXPR);        \
  } while (0)

/* What rank r contributes at elements first .. first + n - 1, stored as dt:
 * for 16-bit types hval's values, for the others fval's and ival's. */
static void fill_input(void *buf, gw_dtype_t dt, int op, int r, size_t n, size_t first) {
  const int k = op == GW_PROD, hb = dt == GW_BFLOAT16;
  switch (dt) {
    case GW_INT8: FILL(int8_t, ival(r, first + i)); break;
    case GW_UINT8: FILL(uint8_t, ival(r, first + i)); break;
    case GW_INT32: FILL(int32_t, (uint32_t)ival(r, first + i)); break;
    case GW_INT64: FILL(int64_t, ival(r, first + i)); break;
    case GW_FLOAT16:
    case GW_BFLOAT16:
      if (k) FILL(uint16_t, hprod[hb][r % 2][itab[idx(r, first + i)] & 1]);
      else FILL(uint16_t, hsum[hb][itab[idx(r, first + i)] % 5]);
      break;
    case GW_FLOAT32: FILL(float, f32tab[k][idx(r, first + i)]); break;
    case GW_FLOAT64: FILL(double, ftab[k][idx(r, first + i)]); break;
    default: break;
  }
}

/* The reference of one combination for `len` elements of the inputs from
 * `first`, computed once and held to both of its results (out of place and in
 * place; it was computed anew for each): integers exact in the type (wrap
 * included), floats as double with each element's tolerance.  Rank by rank,
 * in rank order, as a serial reduction would. */
static struct {
  int64_t *iv;
  double *fv, *tol, *v; /* v: one rank's values */
  size_t cap;
} ref;

static void ref_reserve(size_t len) {
  if (len <= ref.cap) return;
  free(ref.iv), free(ref.fv), free(ref.tol), free(ref.v);
  ref.iv = malloc(len * sizeof *ref.iv), ref.fv = malloc(len * sizeof *ref.fv), ref.tol = malloc(len * sizeof *ref.tol);
  ref.v = malloc(len * sizeof *ref.v);
  if (!ref.iv || !ref.fv || !ref.tol || !ref.v) {
    fprintf(stderr, "out of memory for the reference of %zu elements\n", len);
    exit(98);
  }
  ref.cap = len;
}

#define EACH(BODY)                                  \
  do {                                              \
    for (size_t j = 0; j < len; j++) { BODY; }      \
  } while (0)

static void ref_compute(gw_dtype_t dt, int op, int n, size_t first, size_t len) {
  ref_reserve(len);
  int64_t *iv = ref.iv;
  double *fv = ref.fv, *tol = ref.tol;
  if (unit[dt] == 0) {
    EACH(iv[j] = norm(dt, ival(0, first + j)));
    for (int r = 1; r < n; r++) switch (op) {
        case GW_SUM:
        case GW_AVG: EACH(iv[j] = norm(dt, (uint64_t)iv[j] + (uint64_t)norm(dt, ival(r, first + j)))); break;
        case GW_PROD: EACH(iv[j] = norm(dt, (uint64_t)iv[j] * (uint64_t)norm(dt, ival(r, first + j)))); break;
        case GW_MAX: EACH(int64_t v = norm(dt, ival(r, first + j)); iv[j] = v > iv[j] ? v : iv[j]); break;
        case GW_MIN: EACH(int64_t v = norm(dt, ival(r, first + j)); iv[j] = v < iv[j] ? v : iv[j]); break;
      }
    if (op == GW_AVG) EACH(iv[j] = norm(dt, (uint64_t)(iv[j] / n)));
    return;
  }
  /* tol holds the sum of magnitudes until the end; each rank's values first
   * (as read back from the dtype, in a loop of one kind), then folded in */
  const double *tab = rtab[dt][op == GW_PROD];
  for (int r = 0; r < n; r++) {
    double *v = r ? ref.v : fv; /* rank 0's straight into the result */
    if (is_half(dt)) EACH(v[j] = hval(op, r, first + j));
    else EACH(v[j] = tab[idx(r, first + j)]);
    if (r == 0) {
      EACH(tol[j] = fabs(fv[j]));
      continue;
    }
    switch (op) {
      case GW_SUM:
      case GW_AVG: EACH(tol[j] += fabs(v[j]); fv[j] += v[j]); break;
      case GW_PROD: EACH(tol[j] += fabs(v[j]); fv[j] *= v[j]); break;
      case GW_MAX: EACH(fv[j] = v[j] > fv[j] ? v[j] : fv[j]); break;
      case GW_MIN: EACH(fv[j] = v[j] < fv[j] ? v[j] : fv[j]); break;
    }
  }
  const double u = unit[dt];
  if (is_half(dt)) { /* exact, but for AVG's one division */
    if (op == GW_AVG) EACH(fv[j] /= n; tol[j] = 1.01 * u * fabs(fv[j]));
    else EACH(tol[j] = 0);
  } else if (op == GW_SUM) {
    EACH(tol[j] = (n + 1) * u * tol[j]);
  } else if (op == GW_AVG) {
    EACH(fv[j] /= n; tol[j] = (n + 2) * u * tol[j] / n);
  } else if (op == GW_PROD) {
    EACH(tol[j] = (n + 1) * 1.01 * u * fabs(fv[j]));
  } else {
    EACH(tol[j] = 0);
  }
}

static inline float bf16_value(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The `len` elements of out from element `at` against the reference (its
 * element j for out's at + j): 1 with the first mismatches said (up to 5),
 * 0 when all hold.  One loop per dtype. */
static int ref_check(const void *out, size_t at, gw_dtype_t dt, int op, int n, size_t len, int rank, const char *what) {
  int bad = 0;
  for (size_t j = 0; j < len && bad < 5; j++) {
    /* the common case first: a run of matches, one type's loop */
    size_t k = j;
    switch (dt) {
#define RUN(T, GOOD) \
  for (const T *o_ = (const T *)out + at; k < len; k++) { const T x = o_[k]; if (!(GOOD)) break; }
      case GW_INT8: RUN(int8_t, x == ref.iv[k]); break;
      case GW_UINT8: RUN(uint8_t, x == ref.iv[k]); break;
      case GW_INT32: RUN(int32_t, x == ref.iv[k]); break;
      case GW_INT64: RUN(int64_t, x == ref.iv[k]); break;
      case GW_FLOAT32: RUN(float, fabs((double)x - ref.fv[k]) <= ref.tol[k]); break;
      case GW_FLOAT64: RUN(double, fabs(x - ref.fv[k]) <= ref.tol[k]); break;
      case GW_FLOAT16: RUN(uint16_t, fabs((double)h16[x] - ref.fv[k]) <= ref.tol[k]); break;
      case GW_BFLOAT16: RUN(uint16_t, fabs((double)bf16_value(x) - ref.fv[k]) <= ref.tol[k]); break;
      default: break;
#undef RUN
    }
    if (k == len) break;
    j = k;
    bad++;
    if (unit[dt] == 0)
      fprintf(stderr, "rank %d: %s %s/%s n=%d element %zu: got %" PRId64 ", expected %" PRId64 "\n", rank, what,
              gw_dtype_name(dt), gw_op_name(op), n, at + j, gw_value_load_int(out, dt, at + j), ref.iv[j]);
    else
      fprintf(stderr, "rank %d: %s %s/%s n=%d element %zu: got %.9g, expected %.9g (tolerance %.3g)\n", rank, what,
              gw_dtype_name(dt), gw_op_name(op), n, at + j, gw_value_load(out, dt, at + j), ref.fv[j], ref.tol[j]);
  }
  return bad > 0;
}

/* Test buffers: pre-faulted, and with GW_TEST_REGISTER=1 registered with the
 * communicator (gw_comm_register), so chunks over ib leave straight from them. */
static struct {
  void *p, *handle;
} regs[8];

static void *big_alloc(gw_comm_t comm, size_t bytes) {
  void *p = mmap(NULL, bytes + 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(98);
  }
  if (getenv("GW_TEST_REGISTER") && atoi(getenv("GW_TEST_REGISTER")))
    for (size_t i = 0; i < sizeof regs / sizeof regs[0]; i++)
      if (!regs[i].p) {
        if (gw_comm_register(comm, p, bytes + 64, &regs[i].handle) != GW_SUCCESS) {
          fprintf(stderr, "gw_comm_register: %s\n", gw_comm_last_error(comm));
          exit(97);
        }
        regs[i].p = p;
        break;
      }
  return p;
}

static void big_free(gw_comm_t comm, void *p, size_t bytes) {
  for (size_t i = 0; i < sizeof regs / sizeof regs[0]; i++)
    if (regs[i].p == p) {
      gw_comm_deregister(comm, regs[i].handle);
      regs[i].p = NULL;
    }
  munmap(p, bytes + 64);
}

/* A hash of the bytes (results are up to 32 MiB per rank): four lanes of 8
 * bytes, independent chains (one chain was bound by its multiplies' latency),
 * folded at the end. */
static uint64_t hash_bytes(const void *p, size_t len) {
  const uint8_t *b = p;
  uint64_t h[4] = {1469598103934665603ull ^ len, 0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull}, w;
  size_t i = 0;
  for (; i + 32 <= len; i += 32)
    for (int l = 0; l < 4; l++) {
      memcpy(&w, b + i + 8 * l, 8);
      h[l] = (h[l] ^ w) * 0x9e3779b97f4a7c15ull;
      h[l] ^= h[l] >> 29;
    }
  uint64_t x = h[0];
  for (int l = 1; l < 4; l++) x = (x ^ h[l]) * 0x9e3779b97f4a7c15ull, x ^= x >> 29;
  for (; i < len; i++) x = (x ^ b[i]) * 1099511628211ull;
  return x;
}

#define CALL(expr, what)                                                                         \
  do {                                                                                           \
    gw_result_t r_ = (expr);                                                                     \
    if (r_ != GW_SUCCESS) {                                                                      \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, what, gw_strerror(r_), gw_comm_last_error(comm)); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

/* Every rank must end with the same bits (DDP's replicas stay identical), which
 * the hashes show; given that, each rank checks its own stripe of the result
 * against the reference, so the check costs one reference per element instead
 * of one per rank and element. */
static int same_everywhere(gw_comm_t comm, int rank, int n, const void *buf, size_t bytes, const char *what,
                           gw_dtype_t dt, int op, size_t count) {
  uint64_t h = hash_bytes(buf, bytes), hashes[256]; /* n <= 256 in every test */
  if (n > 256) return 1;
  CALL(gw_allgather(&h, hashes, 1, GW_INT64, comm, NULL), "gw_allgather(hash)");
  for (int r = 0; r < n; r++)
    if (hashes[r] != h) {
      fprintf(stderr, "rank %d: %s %s/%s count %zu: result differs from rank %d's\n", rank, what, gw_dtype_name(dt),
              gw_op_name(op), count, r);
      return 1;
    }
  return 0;
}

/* A per-rank count whose n blocks fit MAX_COUNT + n elements. */
static size_t capped(size_t count, int n) { return count * (size_t)n > MAX_COUNT ? MAX_COUNT / (size_t)n + 1 : count; }

/* Every body's buffers: the largest count of the list, n times over (the
 * allgather's and reduce_scatter's blocks, capped), and 64 elements of slack,
 * 8 bytes each.  Sized to the list, not to MAX_COUNT: 64 ranks populating
 * 32 MiB buffers they never used cost seconds per case. */
static size_t buf_bytes(int n) {
  size_t most = 0;
  for (size_t ci = 0; ci < NCOUNTS; ci++) {
    size_t all = capped(counts[ci], n) * (size_t)n;
    if (all > most) most = all;
  }
  return (most + 64) * 8;
}

static int body_allreduce(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  const bool forced_ll = getenv("GW_PROTO") && !strcmp(getenv("GW_PROTO"), "ll");
  const char *algo = getenv("GW_ALGO"),
             *forced_algo = algo && (!strcmp(algo, "tree") || !strcmp(algo, "exchange") || !strcmp(algo, "ring"))
                                ? algo : NULL;
  const size_t bytes = buf_bytes(n);
  uint8_t *send = big_alloc(comm, bytes), *recv = big_alloc(comm, bytes);
  for (size_t ci = 0; ci < NCOUNTS; ci++)
    for (int dt = 0; dt < GW_NUM_DTYPES; dt++)
      for (int op = 0; op < GW_NUM_OPS; op++) {
        size_t count = counts[ci], es = gw_dtype_size(dt);
        size_t lo = count * (size_t)rank / (size_t)n, hi = count * (size_t)(rank + 1) / (size_t)n;
        fill_input(send, dt, op, rank, count, 0);
        memset(recv, 0xa5, count * es);
        CALL(gw_allreduce(send, recv, count, dt, op, comm, NULL), "gw_allreduce");
        if ((forced_ll || forced_algo) && n > 1 && count > 0) {
          /* the LL, tree and exchange runs: that did run (a fallback, an
           * unknown GW_ALGO's too, only warns: the grid passed on the ring);
           * read before same_everywhere's own collective replaces it */
          char path[64] = "", want[32];
          snprintf(want, sizeof want, "%s/", forced_algo ? forced_algo : "");
          if (gw_comm_last_path(comm, path, sizeof path) != GW_SUCCESS || (forced_ll && !strstr(path, "/ll")) ||
              (forced_algo && strncmp(path, want, strlen(want)))) {
            fprintf(stderr, "rank %d: GW_ALGO=%s GW_PROTO=%s, count %zu: %s ran\n", rank,
                    forced_algo ? forced_algo : "", forced_ll ? "ll" : "", count, path);
            return 1;
          }
        }
        if (same_everywhere(comm, rank, n, recv, count * es, "allreduce", dt, op, count)) return 1;
        ref_compute(dt, op, n, lo, hi - lo);
        if (ref_check(recv, lo, dt, op, n, hi - lo, rank, "allreduce")) return 1;
        /* in place */
        memcpy(recv, send, count * es);
        CALL(gw_allreduce(recv, recv, count, dt, op, comm, NULL), "gw_allreduce(in place)");
        if (same_everywhere(comm, rank, n, recv, count * es, "allreduce in place", dt, op, count)) return 1;
        if (ref_check(recv, lo, dt, op, n, hi - lo, rank, "allreduce in place")) return 1;
      }
  big_free(comm, send, bytes);
  big_free(comm, recv, bytes);
  return 0;
}


static int body_reduce_scatter(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  const size_t bytes = buf_bytes(n);
  uint8_t *send = big_alloc(comm, bytes), *recv = big_alloc(comm, bytes);
  for (size_t ci = 0; ci < NCOUNTS; ci++)
    for (int dt = 0; dt < GW_NUM_DTYPES; dt++)
      for (int op = 0; op < GW_NUM_OPS; op++) {
        size_t rc = capped(counts[ci], n), es = gw_dtype_size(dt);
        fill_input(send, dt, op, rank, rc * (size_t)n, 0);
        memset(recv, 0xa5, rc * es); /* not the last in-place result: an output never written shows */
        CALL(gw_reduce_scatter(send, recv, rc, dt, op, comm, NULL), "gw_reduce_scatter");
        ref_compute(dt, op, n, (size_t)rank * rc, rc);
        if (ref_check(recv, 0, dt, op, n, rc, rank, "reduce_scatter")) return 1;
        /* in place: the result lands in this rank's block of the input */
        memcpy(recv, send, rc * (size_t)n * es);
        uint8_t *mine = recv + (size_t)rank * rc * es;
        CALL(gw_reduce_scatter(recv, mine, rc, dt, op, comm, NULL), "gw_reduce_scatter(in place)");
        if (ref_check(mine, 0, dt, op, n, rc, rank, "reduce_scatter in place")) return 1;
      }
  big_free(comm, send, bytes);
  big_free(comm, recv, bytes);
  return 0;
}

static int same_bits(const void *a, const void *b, size_t bytes, int rank, const char *what, gw_dtype_t dt, size_t count) {
  if (bytes == 0 || memcmp(a, b, bytes) == 0) return 0;
  fprintf(stderr, "rank %d: %s %s count %zu: wrong data\n", rank, what, gw_dtype_name(dt), count);
  return 1;
}

static int body_allgather(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  const size_t bytes = buf_bytes(n);
  uint8_t *send = big_alloc(comm, bytes), *recv = big_alloc(comm, bytes);
  uint8_t *expect = big_alloc(comm, bytes);
  for (size_t ci = 0; ci < NCOUNTS; ci++)
    for (int dt = 0; dt < GW_NUM_DTYPES; dt++) {
      size_t sc = capped(counts[ci], n), es = gw_dtype_size(dt);
      for (int r = 0; r < n; r++) fill_input(expect + (size_t)r * sc * es, dt, GW_SUM, r, sc, 0);
      fill_input(send, dt, GW_SUM, rank, sc, 0);
      memset(recv, 0x5a, sc * (size_t)n * es);
      CALL(gw_allgather(send, recv, sc, dt, comm, NULL), "gw_allgather");
      if (same_bits(recv, expect, sc * (size_t)n * es, rank, "allgather", dt, sc)) return 1;
      memset(recv, 0x5a, sc * (size_t)n * es);
      memcpy(recv + (size_t)rank * sc * es, send, sc * es);
      CALL(gw_allgather(recv + (size_t)rank * sc * es, recv, sc, dt, comm, NULL), "gw_allgather(in place)");
      if (same_bits(recv, expect, sc * (size_t)n * es, rank, "allgather in place", dt, sc)) return 1;
    }
  big_free(comm, send, bytes);
  big_free(comm, recv, bytes);
  big_free(comm, expect, bytes);
  return 0;
}

static int body_broadcast(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  const size_t bytes = buf_bytes(n);
  uint8_t *send = big_alloc(comm, bytes), *recv = big_alloc(comm, bytes), *expect = big_alloc(comm, bytes);
  int roots[2] = {0, n - 1};
  for (size_t ci = 0; ci < NCOUNTS; ci++)
    for (int dt = 0; dt < GW_NUM_DTYPES; dt++)
      for (int ri = 0; ri < (n > 1 ? 2 : 1); ri++) {
        int root = roots[ri];
        size_t count = counts[ci], es = gw_dtype_size(dt);
        fill_input(expect, dt, GW_SUM, root, count, 0);
        fill_input(send, dt, GW_SUM, rank, count, 0);
        memset(recv, 0x33, count * es);
        CALL(gw_broadcast(send, recv, count, dt, root, comm, NULL), "gw_broadcast");
        if (same_bits(recv, expect, count * es, rank, "broadcast", dt, count)) return 1;
        memcpy(recv, send, count * es);
        CALL(gw_broadcast(recv, recv, count, dt, root, comm, NULL), "gw_broadcast(in place)");
        if (same_bits(recv, expect, count * es, rank, "broadcast in place", dt, count)) return 1;
      }
  big_free(comm, send, bytes);
  big_free(comm, recv, bytes);
  big_free(comm, expect, bytes);
  return 0;
}

/* No rank may leave a barrier before the last one entered it. */
static int body_barrier(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  double entered[256];
  if (n > 256) return 1;
  /* ranks enter 20 ms apart (5 ms at 64 ranks: the last one waited 1.3 s) */
  const long apart_us = 320000L / (n > 16 ? n : 16);
  for (int round = 0; round < 3; round++) {
    struct timespec ts = {0, (long)((rank + round) % n) * apart_us * 1000L};
    nanosleep(&ts, NULL);
    double t_in = test_now();
    CALL(gw_barrier(comm), "gw_barrier");
    double t_out = test_now();
    CALL(gw_allgather(&t_in, entered, 1, GW_FLOAT64, comm, NULL), "gw_allgather(times)");
    for (int r = 0; r < n; r++)
      if (entered[r] > t_out) {
        fprintf(stderr, "rank %d left barrier %d at %.6f before rank %d entered at %.6f\n", rank, round, t_out, r, entered[r]);
        return 1;
      }
  }
  for (int i = 0; i < 100; i++) CALL(gw_barrier(comm), "gw_barrier (loop)");
  return 0;
}

static int nranks_of_case(void) {
  const char *c = getenv("GW_TEST_NRANKS");
  return c ? atoi(c) : 2;
}

#define GRID_TEST(NAME, BODY)                                                                    \
  START_TEST(NAME) {                                                                             \
    int n = nranks_of_case();                                                                    \
    ck_assert_int_eq(run_ranks(n, BODY, NULL, 1500), 0);                                         \
  }                                                                                              \
  END_TEST

GRID_TEST(test_allreduce_grid, body_allreduce)
GRID_TEST(test_reduce_scatter_grid, body_reduce_scatter)
GRID_TEST(test_allgather_grid, body_allgather)
GRID_TEST(test_broadcast_grid, body_broadcast)
GRID_TEST(test_barrier, body_barrier)

/* ---- the tree's own tests (--tree) ---------------------------------------- */

/* Tree t of n positions given by up[] and down[][]: one root, parents and
 * children agree, no cycle, depth at most max_depth.  Counts into interior[]
 * the positions with children. */
static void check_links(int n, int t, const int *up, int (*down)[2], int max_depth, int *interior) {
  int roots = 0;
  for (int p = 0; p < n; p++) {
    roots += up[p] < 0;
    ck_assert_msg(up[p] < 0 || down[up[p]][0] == p || down[up[p]][1] == p,
                  "n=%d tree %d: %d's parent %d does not list it", n, t, p, up[p]);
    ck_assert_msg(down[p][1] < 0 || down[p][0] >= 0, "n=%d tree %d: %d has a second child only", n, t, p);
    for (int i = 0; i < 2; i++) {
      int c = down[p][i];
      ck_assert_msg(c < n && (c < 0 || up[c] == p), "n=%d tree %d: %d's child %d has another parent", n, t, p, c);
    }
    interior[p] += down[p][0] >= 0;
    int depth = 0;
    for (int q = p; up[q] >= 0; q = up[q]) ck_assert_msg(++depth <= max_depth, "n=%d tree %d: %d too deep", n, t, p);
  }
  ck_assert_msg(roots == 1, "n=%d tree %d: %d roots", n, t, roots);
}

static int ceil_log2(int n) {
  int d = 0;
  while ((1 << d) < n) d++;
  return d;
}

/* The flat trees: depth at most log2(n) + 1. */
static void check_tree(int n, int t, int *interior) {
  int up[300], down[300][2];
  for (int p = 0; p < n; p++) gw__tree_shape(n, p, t, &up[p], down[p]);
  check_links(n, t, up, down, ceil_log2(n) + 1, interior);
}

/* Every position forwards data in one tree only (NCCL's property), except
 * position 0 for an odd world size: tree 0's root, with one child. */
START_TEST(test_tree_shape) {
  for (int n = 1; n <= 300; n++) {
    int interior[300] = {0};
    check_tree(n, 0, interior);
    check_tree(n, 1, interior);
    for (int p = 0; p < n; p++)
      ck_assert_msg(interior[p] <= 1 || (p == 0 && n % 2 == 1), "n=%d: %d is interior in both trees", n, p);
  }
}
END_TEST

/* The hierarchical trees (several machines, a chain inside each), for 2..12
 * machines with 1..6 ranks each, uniform and uneven: sound trees no deeper than
 * the chain times the machines' tree depth, and the network crossed only by a
 * machine's head going up and its tail going down, once each per tree. */
START_TEST(test_tree_shape_hier) {
  for (int nodes = 2; nodes <= 12; nodes++)
    for (int layout = 0; layout < 7; layout++) {
      int node_of[80], n = 0, lmax = 0;
      for (int k = 0; k < nodes; k++) {
        int l = layout < 6 ? layout + 1 : 1 + (k * 7) % 4;
        lmax = l > lmax ? l : lmax;
        for (int j = 0; j < l; j++) node_of[n++] = k;
      }
      for (int t = 0; t < 2; t++) {
        int up[80], down[80][2], interior[80] = {0}, ups_out[12] = {0}, downs_out[12] = {0};
        for (int p = 0; p < n; p++) gw__tree_shape_hier(n, node_of, p, t, &up[p], down[p]);
        check_links(n, t, up, down, lmax * (ceil_log2(nodes) + 1), interior);
        for (int p = 0; p < n; p++) {
          ups_out[node_of[p]] += up[p] >= 0 && node_of[up[p]] != node_of[p];
          for (int i = 0; i < 2; i++) downs_out[node_of[p]] += down[p][i] >= 0 && node_of[down[p][i]] != node_of[p];
        }
        int roots = 0;
        for (int k = 0; k < nodes; k++) {
          ck_assert_msg(ups_out[k] <= 1, "%d machines layout %d tree %d: machine %d goes up %d times", nodes, layout,
                        t, k, ups_out[k]);
          ck_assert_msg(downs_out[k] <= 2, "machine %d has %d children machines", k, downs_out[k]);
          roots += ups_out[k] == 0;
        }
        ck_assert_msg(roots == 1, "%d machines layout %d tree %d: %d root machines", nodes, layout, t, roots);
      }
    }
}
END_TEST

/* Recursive doubling's links for every world size to 300 and near the
 * largest it takes (2^15 .. 2^16 - 1, sampled positions): partners distinct,
 * in range and mutual, the extra position (beyond the power of two) mutual
 * and no partner, and every position's links within GW_RD_MAX. */
static void check_rd_pos(int n, int pos) {
  int partners[GW_RD_MAX], extra, np = gw__rd_shape(n, pos, &extra, partners);
  ck_assert_msg(np + (extra >= 0) <= GW_RD_MAX, "n %d pos %d: %d links", n, pos, np + (extra >= 0));
  for (int i = 0; i < np; i++) {
    const int q = partners[i];
    ck_assert_msg(q >= 0 && q < n && q != pos && q != extra, "n %d pos %d: partner %d (extra %d)", n, pos, q, extra);
    for (int j = 0; j < i; j++) ck_assert_msg(partners[j] != q, "n %d pos %d: partner %d twice", n, pos, q);
    int back[GW_RD_MAX], e2, nb = gw__rd_shape(n, q, &e2, back), found = 0;
    for (int j = 0; j < nb; j++) found += back[j] == pos;
    ck_assert_msg(found == 1, "n %d: %d has partner %d, not the other way", n, pos, q);
  }
  if (extra >= 0) {
    int back[GW_RD_MAX], e2;
    (void)gw__rd_shape(n, extra, &e2, back);
    ck_assert_msg(extra < n && e2 == pos, "n %d: %d's extra is %d, whose extra is %d", n, pos, extra, e2);
  }
}

START_TEST(test_rd_shape) {
  for (int n = 1; n <= 300; n++)
    for (int pos = 0; pos < n; pos++) check_rd_pos(n, pos);
  const int big[] = {1 << 15, (1 << 15) + 1, 40000, GW_RD_MAX_RANKS};
  for (int k = 0; k < 4; k++)
    for (int pos = 0; pos < big[k]; pos += pos < 64 || pos > big[k] - 64 ? 1 : 997) check_rd_pos(big[k], pos);
}
END_TEST

/* rank 1 dies on purpose, so exactly one rank fails; the notice travels up and
 * down the tree (5 ranks: rank 1 is a leaf two hops from the root). */
START_TEST(test_tree_killed_rank) {
  double limit = 15;
  setenv("GW_ALGO", "tree", 1);
  ck_assert_int_eq(run_ranks(3, body_rank1_killed, &limit, 90), 1);
  ck_assert_int_eq(run_ranks(5, body_rank1_killed, &limit, 90), 1);
  setenv("GW_PROTO", "ll", 1); /* the LL format's waits notice a dead peer alike */
  ck_assert_int_eq(run_ranks(5, body_rank1_killed, &limit, 90), 1);
  unsetenv("GW_PROTO");
  unsetenv("GW_ALGO");
}
END_TEST

/* The tree and the ring use different connections, yet a tree allreduce
 * against a ring allgather fails on every rank within seconds, naming both
 * calls: waits look at the other algorithm's connections. */
static int body_tree_vs_ring(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  gw_comm_set_timeout(comm, 60);
  int32_t buf[64] = {0};
  double t0 = test_now();
  gw_result_t r = rank == 0 ? gw_allreduce(buf, buf, 8, GW_INT32, GW_MAX, comm, NULL)
                            : gw_allgather(buf, buf + 8, 8, GW_INT32, comm, NULL);
  const char *msg = gw_comm_last_error(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT || r == GW_ERR_REMOTE, "returned %s: %s", gw_strerror(r), msg);
  EXPECT(test_now() - t0 < 10, "took %.1f s to notice", test_now() - t0);
  EXPECT(strstr(msg, "allgather") && strstr(msg, "allreduce"), "message does not name both calls: %s", msg);
  return 0;
}

START_TEST(test_tree_vs_ring_named) {
  setenv("GW_ALGO", "tree", 1);
  ck_assert_int_eq(run_ranks(3, body_tree_vs_ring, NULL, 90), 0);
  setenv("GW_PROTO", "ll", 1); /* LL chunks carry the same header, checked alike */
  ck_assert_int_eq(run_ranks(3, body_tree_vs_ring, NULL, 90), 0);
  unsetenv("GW_PROTO");
  setenv("GW_TRANSPORT", "tcp", 1);
  ck_assert_int_eq(run_ranks(3, body_tree_vs_ring, NULL, 90), 0);
  unsetenv("GW_TRANSPORT");
  unsetenv("GW_ALGO");
}
END_TEST

/* Ranks that disagree on GW_ALGO would wait for each other on different
 * connections: gw_comm_init refuses, naming the setting. */
static int raw_algo_differs(int rank, int n, const char *master, void *arg) {
  (void)arg;
  setenv("GW_ALGO", rank == 1 ? "ring" : "tree", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && strstr(gw_comm_last_error(NULL), "GW_ALGO"), "init returned %s: %s",
         gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_tree_algo_must_agree) { ck_assert_int_eq(run_ranks_raw(3, raw_algo_differs, NULL, 90), 0); }
END_TEST

/* A NaN on one rank makes MAX and MIN NaN at every element on every rank, by
 * every algorithm: with `x > y ? x : y` it came out in the blocks the NaN's
 * rank owned in the ring (a third of them at 3 ranks), everywhere in the
 * exchange, and by its position in the tree. */
static int body_nan_max(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  static const char *algos[] = {"ring", "tree", "exchange"};
  enum { COUNT = 48 };
  float buf[COUNT];
  for (int a = 0; a < 3; a++)
    for (int op = 0; op < 2; op++) {
      EXPECT(gw_comm_set_algo(comm, algos[a], "simple") == GW_SUCCESS, "set_algo %s: %s", algos[a],
             gw_comm_last_error(comm));
      for (int i = 0; i < COUNT; i++) buf[i] = rank == 1 ? NAN : (float)(rank + i);
      gw_result_t r = gw_allreduce(buf, buf, COUNT, GW_FLOAT32, op ? GW_MIN : GW_MAX, comm, NULL);
      EXPECT(r == GW_SUCCESS, "%s: %s", algos[a], gw_comm_last_error(comm));
      for (int i = 0; i < COUNT; i++)
        EXPECT(isnan(buf[i]), "%s %s: element %d is %g, not NaN", algos[a], op ? "min" : "max", i, buf[i]);
      /* the same shape each time: the cost model's remembered pick must follow the setting */
      char path[32], want[32];
      snprintf(want, sizeof want, "%s/simple", algos[a]);
      EXPECT(gw_comm_last_path(comm, path, sizeof path) == GW_SUCCESS && !strcmp(path, want), "%s asked for, %s ran",
             want, path);
    }
  return 0;
}

START_TEST(test_nan_max_every_algo) { ck_assert_int_eq(run_ranks(3, body_nan_max, NULL, 90), 0); }
END_TEST

static int run_tree_tests(void) {
  Suite *s = suite_create("tree");
  TCase *tc = tcase_create("tree");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_tree_shape);
  tcase_add_test(tc, test_tree_shape_hier);
  tcase_add_test(tc, test_rd_shape);
  tcase_add_test(tc, test_tree_killed_rank);
  tcase_add_test(tc, test_nan_max_every_algo);
  tcase_add_test(tc, test_tree_vs_ring_named);
  tcase_add_test(tc, test_tree_algo_must_agree);
  suite_add_tcase(s, tc);
  return run_suite(s);
}

/* Launched by gw-run (one process per rank, possibly on several machines): run
 * every grid body on one communicator from the environment, no Check. */
static int run_from_env(void) {
  gw_comm_t comm;
  gw_result_t r = gw_comm_init_env(&comm);
  if (r != GW_SUCCESS) {
    fprintf(stderr, "gw_comm_init_env failed: %s\n", gw_comm_last_error(NULL));
    return 1;
  }
  int rank, n;
  gw_comm_rank(comm, &rank);
  gw_comm_size(comm, &n);
  static const struct {
    const char *name;
    rank_body_fn fn;
  } bodies[] = {{"allreduce", body_allreduce}, {"reduce_scatter", body_reduce_scatter},
                {"allgather", body_allgather}, {"broadcast", body_broadcast}, {"barrier", body_barrier}};
  int failed = 0;
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    int rc = bodies[i].fn(comm, rank, n, NULL);
    if (rank == 0 || rc) printf("%s grid on %d ranks: %s\n", bodies[i].name, n, rc ? "FAILED" : "ok");
    failed |= rc;
    if (rc) break; /* the communicator is unusable after a failure */
  }
  gw_comm_destroy(comm);
  return failed;
}

int main(int argc, char **argv) {
  init_counts();
  /* once, before the ranks fork: they share the pages (12 MiB that each of 64
   * ranks filled and first-touched per case) */
  init_tables();
  if (argc > 1 && !strcmp(argv[1], "--from-env")) return run_from_env();
  if (argc > 1 && !strcmp(argv[1], "--tree")) return run_tree_tests();
  Suite *s = suite_create("collectives");
  TCase *reduce = tcase_create("allreduce"), *grid = tcase_create("grid");
  tcase_set_timeout(reduce, 1800);
  tcase_set_timeout(grid, 1800);
  tcase_add_test(reduce, test_allreduce_grid);
  tcase_add_test(reduce, test_barrier);
  tcase_add_test(grid, test_reduce_scatter_grid);
  tcase_add_test(grid, test_allgather_grid);
  tcase_add_test(grid, test_broadcast_grid);
  suite_add_tcase(s, reduce);
  suite_add_tcase(s, grid);
  return run_suite(s);
}
