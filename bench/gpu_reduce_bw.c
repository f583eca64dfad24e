/* gpu_reduce_bw.c - the CUDA reduction kernel (gw__cuda_reduce) against
 * cudaMemcpyAsync device to device on the first GPU: float32, bfloat16 and
 * float16 SUM at 64 MiB, 256 MiB and 1 GiB per input, timed with CUDA events
 * (reduction and copy in turn: 3 warm-up pairs and at least 200 ms, then the
 * best and mean of 20 pairs).  A reduction moves 3x the bytes
 * of an input (two reads, one write), a copy 2x (one read, one write); ratio is
 * reduce GB/s over copy GB/s, both from the best run.
 *
 * It also checks results, and exits 1 if any is wrong:
 *   - every timed size: the first and last 64 MiB of the output, bit for bit
 *     against the host kernels (the generic table of comm/reduce_impl.c, the
 *     one the device kernels reproduce, NaNs included);
 *   - every dtype x op x divisor on small arrays with special values (NaN
 *     payloads, infinities, subnormals), at aligned, out-of-phase and
 *     misaligned offsets, with and without dst1, in place; nothing outside the
 *     outputs may change;
 *   - the flags, by the kernels and by the device layer (stream memory
 *     operations where the driver has them): a wait that holds a stream
 *     until the host writes, a write the host sees; the sleep kernel's duration.
 *
 * Usage: gpu_reduce_bw [--csv FILE]   (exit 77 when no GPU is visible)
 * CSV columns: dtype,bytes,reduce_GBps,copy_GBps,ratio (best runs; bytes per input). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "dev.h"
#include "gradwire.h"
#include "reduce.h"

#define WARMUP 3
#define ITERS 20
#define PERIOD ((size_t)64 << 20) /* the inputs repeat with this period (bytes) */
#define MAXBYTES ((size_t)1 << 30)

static int failed;

static void die_cuda(cudaError_t e, const char *what, int line) {
  fprintf(stderr, "gpu_reduce_bw: %s (line %d): %s: %s\n", what, line, cudaGetErrorName(e), cudaGetErrorString(e));
  exit(1);
}
#define CK(call)                                     \
  do {                                               \
    cudaError_t e_ = (call);                         \
    if (e_ != cudaSuccess) die_cuda(e_, #call, __LINE__); \
  } while (0)
#define CKR(call)                                                   \
  do {                                                              \
    int e_ = (call);                                                \
    if (e_ != 0) die_cuda((cudaError_t)e_, #call, __LINE__);        \
  } while (0)

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static const size_t esize[GW_NUM_DTYPES] = {1, 1, 4, 8, 2, 2, 4, 8};
static const char *dname[GW_NUM_DTYPES] = {"int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t get_elem(const unsigned char *p, size_t i, size_t es) {
  uint64_t v = 0;
  memcpy(&v, p + i * es, es);
  return v;
}
static void put_elem(unsigned char *p, size_t i, size_t es, uint64_t v) { memcpy(p + i * es, &v, es); }

static int is_nan_bits(int dt, uint64_t v) {
  switch (dt) {
  case GW_FLOAT16: return (v & 0x7fff) > 0x7c00;
  case GW_BFLOAT16: return (v & 0x7fff) > 0x7f80;
  case GW_FLOAT32: return (v & 0x7fffffffu) > 0x7f800000u;
  case GW_FLOAT64: return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
  default: return 0;
  }
}

/* ---- small arrays: every dtype, op, divisor and layout ----------------------------------- */
static const uint64_t sp_f16[] = {0, 0x8000, 1, 0x8001, 0x3ff, 0x400, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00,
                                  0xfe00, 0x7c01, 0x7d23, 0xfd00, 0x3c00, 0xbc00, 0x3c01};
static const uint64_t sp_bf16[] = {0, 0x8000, 1, 0x8001, 0x7f, 0x80, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0,
                                   0xffc0, 0x7f81, 0x7fa3, 0xffa0, 0x3f80, 0xbf80, 0x3f81};
static const uint64_t sp_f32[] = {0, 0x80000000u, 1, 0x80000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu,
                                  0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
                                  0x7fa12345u, 0xffa00000u, 0x7fc12345u, 0x3f800000u, 0xbf800000u, 0x3f800001u};
static const uint64_t sp_f64[] = {0, 1ull << 63, 1, 0x000fffffffffffffull, 0x7fefffffffffffffull,
                                  0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull,
                                  0xfff8000000000000ull, 0x7ff0000000000001ull, 0x7ff4000012345678ull,
                                  0x3ff0000000000000ull, 0xbff0000000000000ull};
static const uint64_t sp_int[] = {0, 1, 2, 3, ~0ull, 0x80, 0x7f, 0x80000000u, 0x7fffffffu, 1ull << 63};

static uint64_t gen_value(int dt) {
  const uint64_t *sp = sp_int;
  size_t nsp = sizeof sp_int / sizeof *sp_int;
  if (dt == GW_FLOAT16) sp = sp_f16, nsp = sizeof sp_f16 / sizeof *sp;
  if (dt == GW_BFLOAT16) sp = sp_bf16, nsp = sizeof sp_bf16 / sizeof *sp;
  if (dt == GW_FLOAT32) sp = sp_f32, nsp = sizeof sp_f32 / sizeof *sp;
  if (dt == GW_FLOAT64) sp = sp_f64, nsp = sizeof sp_f64 / sizeof *sp;
  uint64_t r = rnd();
  switch (r & 3) {
  case 0: return sp[(r >> 8) % nsp];
  case 1: return rnd();
  default: { /* ordinary numbers near 1 (small integers for the integer types) */
    uint64_t m = rnd();
    if (dt == GW_FLOAT16) return (m & 0x83ff) | (0x3800 + ((m >> 20) & 0x0c00));
    if (dt == GW_BFLOAT16) return (m & 0x807f) | (0x3e00 + ((m >> 20) & 0x0380));
    if (dt == GW_FLOAT32) return (m & 0x807fffffu) | (0x3e000000u + ((m >> 40) & 0x03800000u));
    if (dt == GW_FLOAT64) return (m & 0x800fffffffffffffull) | (0x3fc0000000000000ull + ((m >> 2) & 0x0070000000000000ull));
    return m & 15;
  }
  }
}

#define SMALL_MAX 4099 /* elements */
#define PAD 64
#define SMALL_BUF (SMALL_MAX * 8 + 3 * PAD)

struct small {
  unsigned char *dev[4];  /* d0, d1, a, b (device, SMALL_BUF each, 256-aligned) */
  unsigned char *host[4]; /* what was uploaded, then what came back */
  unsigned char *ref, *alt, *va, *vb;
  long cases, mismatches, nan_only, guard_errors, alt_diff, alt_nan_only;
};

/* One case: the kernel on the device against the generic host table.
 * mode 0: separate buffers, 1: dst0 == a, 2: dst0 == b. */
static void small_case(struct small *S, int dt, int kop, uint32_t div, size_t n, const size_t off[4], int with_d1,
                       int mode) {
  const size_t es = esize[dt], bytes = n * es;
  for (size_t i = 0; i < n; i++) put_elem(S->va, i, es, gen_value(dt)), put_elem(S->vb, i, es, gen_value(dt));
  for (int k = 0; k < 4; k++) memset(S->host[k], 0xa5 + k, SMALL_BUF);
  memcpy(S->host[2] + PAD + off[2], S->va, bytes);
  memcpy(S->host[3] + PAD + off[3], S->vb, bytes);
  for (int k = 0; k < 4; k++) CK(cudaMemcpy(S->dev[k], S->host[k], SMALL_BUF, cudaMemcpyHostToDevice));
  unsigned char *p[4];
  for (int k = 0; k < 4; k++) p[k] = S->dev[k] + PAD + off[k];
  unsigned char *d0 = mode == 1 ? p[2] : mode == 2 ? p[3] : p[0];
  unsigned char *d1 = with_d1 ? p[1] : NULL;
  CKR(gw__cuda_reduce(d0, d1, p[2], p[3], n, dt, kop, div, NULL));
  CK(cudaDeviceSynchronize());
  unsigned char *back[4];
  for (int k = 0; k < 4; k++) {
    back[k] = malloc(SMALL_BUF);
    if (!back[k]) exit(1);
    CK(cudaMemcpy(back[k], S->dev[k], SMALL_BUF, cudaMemcpyDeviceToHost));
  }
  /* the reference on aligned copies (va/vb/ref are malloc'd, so aligned) */
  (gw__reduce_table_generic)[dt][kop](S->ref, NULL, S->va, S->vb, n, div);
  (*gw__reduce_table())[dt][kop](S->alt, NULL, S->va, S->vb, n, div);
  S->cases++;
  const int outk[2] = {mode == 1 ? 2 : mode == 2 ? 3 : 0, with_d1 ? 1 : -1};
  for (int o = 0; o < 2; o++) {
    if (outk[o] < 0) continue;
    const unsigned char *got = back[outk[o]] + PAD + off[outk[o]];
    if (memcmp(got, S->ref, bytes) == 0) continue;
    for (size_t i = 0; i < n; i++) {
      uint64_t g = get_elem(got, i, es), w = get_elem(S->ref, i, es);
      if (g == w) continue;
      S->mismatches++;
      if (is_nan_bits(dt, g) && is_nan_bits(dt, w)) S->nan_only++;
      if (S->mismatches <= 10)
        fprintf(stderr,
                "MISMATCH %s op %d div %u n %zu offsets %zu/%zu/%zu/%zu dst1 %d mode %d: [%zu] a 0x%llx b 0x%llx: "
                "device 0x%llx, host 0x%llx\n",
                dname[dt], kop, div, n, off[0], off[1], off[2], off[3], with_d1, mode, i,
                (unsigned long long)get_elem(S->va, i, es), (unsigned long long)get_elem(S->vb, i, es),
                (unsigned long long)g, (unsigned long long)w);
    }
  }
  /* bytes outside the outputs: as uploaded */
  for (int k = 0; k < 4; k++) {
    int is_out = k == outk[0] || k == outk[1];
    size_t lo = PAD + off[k], hi = lo + bytes;
    if (!is_out) lo = hi = 0; /* the whole buffer must be as uploaded */
    if (memcmp(back[k], S->host[k], lo) != 0 || memcmp(back[k] + hi, S->host[k] + hi, SMALL_BUF - hi) != 0) {
      S->guard_errors++;
      fprintf(stderr, "WRITE OUTSIDE THE OUTPUT: %s op %d n %zu buffer %d offsets %zu/%zu/%zu/%zu mode %d\n",
              dname[dt], kop, n, k, off[0], off[1], off[2], off[3], mode);
    }
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t g = get_elem(S->alt, i, es), w = get_elem(S->ref, i, es);
    if (g != w) {
      S->alt_diff++;
      if (is_nan_bits(dt, g) && is_nan_bits(dt, w)) S->alt_nan_only++;
    }
  }
  for (int k = 0; k < 4; k++) free(back[k]);
}

static void check_small(void) {
  struct small S;
  memset(&S, 0, sizeof S);
  for (int k = 0; k < 4; k++) {
    CK(cudaMalloc((void **)&S.dev[k], SMALL_BUF));
    S.host[k] = malloc(SMALL_BUF);
  }
  S.ref = malloc(SMALL_BUF), S.alt = malloc(SMALL_BUF), S.va = malloc(SMALL_BUF), S.vb = malloc(SMALL_BUF);
  if (!S.host[0] || !S.host[1] || !S.host[2] || !S.host[3] || !S.ref || !S.alt || !S.va || !S.vb) exit(1);
  const uint32_t divs[] = {0, 3, 1000};
  const size_t ns[] = {1, 17, 100, SMALL_MAX};
  for (int dt = 0; dt < GW_NUM_DTYPES; dt++) {
    const size_t es = esize[dt];
    for (int kop = 0; kop < GW_NUM_KOPS; kop++)
      for (size_t di = 0; di < sizeof divs / sizeof *divs; di++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
          for (int layout = 0; layout < 5; layout++) {
            size_t off[4] = {0, 0, 0, 0};
            size_t phase = (size_t)(rnd() % (16 / es)) * es;
            int mode = 0, with_d1 = 0;
            switch (layout) {
            case 0: break;                                       /* all 16-byte aligned */
            case 1: off[0] = off[1] = off[2] = off[3] = phase, with_d1 = 1; break; /* same phase: head + tail */
            case 2: off[2] = phase, off[3] = (phase + es) % 16; break;           /* out of phase: scalar */
            case 3: off[3] = es > 1 ? 1 : 0, with_d1 = 1; break;                 /* not element aligned */
            case 4: off[2] = off[3] = phase, mode = 1 + (int)(rnd() & 1); break;  /* in place */
            }
            small_case(&S, dt, kop, divs[di], ns[ni], off, with_d1, mode);
          }
  }
  printf("small arrays: %ld cases, %ld mismatching elements (%ld of them NaN against NaN), %ld writes outside "
         "the outputs\n",
         S.cases, S.mismatches, S.nan_only, S.guard_errors);
  if (S.alt_diff)
    printf("note: this CPU's host table (%s) differs from the generic one on %ld elements (%ld NaN against NaN)\n",
           gw__reduce_simd_name(), S.alt_diff, S.alt_nan_only);
  /* NaN against NaN passes: which NaN two NaN inputs give is the compiler's
   * choice on the host (the TSan build's differs), any NaN is right */
  if (S.mismatches > S.nan_only || S.guard_errors) failed = 1;
  for (int k = 0; k < 4; k++) {
    CK(cudaFree(S.dev[k]));
    free(S.host[k]);
  }
  free(S.ref), free(S.alt), free(S.va), free(S.vb);
}

/* ---- flags and sleep --------------------------------------------------------------------------- */
/* One way of ordering a stream with the host: a wait for flags[0] >= 5, then
 * flags[1] = 7; the stream must hold before the host's write and let the
 * flag through soon after it. */
typedef int (*flag_fn)(uint64_t *flag, uint64_t v, cudaStream_t s);
static int kern_write(uint64_t *f, uint64_t v, cudaStream_t s) { return gw__cuda_flag_write(f, v, (void *)s); }
static int kern_wait(uint64_t *f, uint64_t v, cudaStream_t s) { return gw__cuda_flag_wait(f, v, (void *)s); }
static int dev_write(uint64_t *f, uint64_t v, cudaStream_t s) { return gw__dev()->flag_write(f, v, (gw_dev_stream_t)(void *)s); }
static int dev_wait(uint64_t *f, uint64_t v, cudaStream_t s) { return gw__dev()->flag_wait(f, v, (gw_dev_stream_t)(void *)s); }

static void check_flag_pair(const char *how, flag_fn wait, flag_fn write) {
  uint64_t *flags;
  cudaStream_t s;
  CK(cudaHostAlloc((void **)&flags, 2 * sizeof *flags, cudaHostAllocMapped | cudaHostAllocPortable));
  flags[0] = flags[1] = 0;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CKR(wait(&flags[0], 5, s));
  CKR(write(&flags[1], 7, s));
  double t0 = now_s();
  while (now_s() - t0 < 0.05) {
  }
  cudaError_t q = cudaStreamQuery(s);
  uint64_t before = atomic_load_explicit((_Atomic uint64_t *)&flags[1], memory_order_acquire);
  int ok = q == cudaErrorNotReady && before == 0;
  if (q == cudaErrorNotReady) (void)cudaGetLastError();
  atomic_store_explicit((_Atomic uint64_t *)&flags[0], 5, memory_order_release);
  t0 = now_s();
  while (atomic_load_explicit((_Atomic uint64_t *)&flags[1], memory_order_acquire) != 7 && now_s() - t0 < 5) {
  }
  uint64_t after = atomic_load_explicit((_Atomic uint64_t *)&flags[1], memory_order_acquire);
  double waited = now_s() - t0;
  if (after != 7) {
    fprintf(stderr, "gpu_reduce_bw: flags by %s: the host never saw the flag (hung stream?)\n", how);
    exit(1); /* the stream may spin forever: no synchronize */
  }
  CK(cudaStreamSynchronize(s));
  printf("flags by %s: stream held before the host's write: %s; flag seen %.1f us after it\n", how,
         ok ? "yes" : "NO", waited * 1e6);
  if (!ok) failed = 1;
  CK(cudaStreamDestroy(s));
  CK(cudaFreeHost(flags));
}

static void check_flags(void) {
  check_flag_pair("kernels", kern_wait, kern_write);
  /* the device layer's: stream memory operations where the driver has them */
  if (gw__dev()) check_flag_pair(getenv("GW_DEV_FLAG_KERNEL") ? "the device layer (GW_DEV_FLAG_KERNEL)" : "the device layer",
                                 dev_wait, dev_write);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, s));
  CKR(gw__cuda_sleep(0.05, s));
  CK(cudaEventRecord(e1, s));
  CK(cudaStreamSynchronize(s));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  int sleep_ok = ms >= 49.0f && ms < 1000.0f;
  printf("sleep(50 ms) took %.2f ms: %s\n", ms, sleep_ok ? "ok" : "FAILED");
  if (!sleep_ok) failed = 1;
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(s));
}

/* ---- bandwidth ---------------------------------------------------------------------------------- */
struct timing {
  double best_ms, mean_ms;
};

/* which 0: reduce a + b -> dst; 1: copy a -> cdst. */
/* The reduction (into dst) and the copy (into dc), in turn: WARMUP pairs and
 * at least 200 ms of both first (the GPU's clocks rise from idle, and the first
 * size of each dtype follows the host's pattern fill), then ITERS pairs timed
 * with events, so both see the same clocks and the same L2 history. */
static void time_pair(void *dst, void *dc, const void *a, const void *b, size_t bytes, int dt, cudaStream_t s,
                      cudaEvent_t *ev, struct timing *r, struct timing *c) {
  const size_t n = bytes / esize[dt];
  const double t0 = now_s();
  for (int i = 0; i < WARMUP || now_s() - t0 < 0.2; i++) {
    CKR(gw__cuda_reduce(dst, NULL, a, b, n, dt, GW_KOP_SUM, 1, s));
    CK(cudaMemcpyAsync(dc, a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaStreamSynchronize(s));
  }
  for (int k = 0; k < ITERS; k++) {
    CK(cudaEventRecord(ev[4 * k], s));
    CKR(gw__cuda_reduce(dst, NULL, a, b, n, dt, GW_KOP_SUM, 1, s));
    CK(cudaEventRecord(ev[4 * k + 1], s));
    CK(cudaEventRecord(ev[4 * k + 2], s));
    CK(cudaMemcpyAsync(dc, a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(ev[4 * k + 3], s));
  }
  CK(cudaStreamSynchronize(s));
  struct timing *t[2] = {r, c};
  for (int w = 0; w < 2; w++) {
    *t[w] = (struct timing){1e30, 0};
    for (int k = 0; k < ITERS; k++) {
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, ev[4 * k + 2 * w], ev[4 * k + 2 * w + 1]));
      if (ms < t[w]->best_ms) t[w]->best_ms = ms;
      t[w]->mean_ms += ms / ITERS;
    }
  }
}

/* Fills host pattern buffers (PERIOD bytes) with ordinary numbers of dtype dt. */
static void fill_pattern(int dt, unsigned char *ha, unsigned char *hb) {
  const size_t n = PERIOD / esize[dt];
  for (size_t i = 0; i < n; i++) {
    float x = (float)((int64_t)(rnd() >> 40) - (1 << 23)) / (float)(1 << 23); /* [-1, 1) */
    float y = (float)((int64_t)(rnd() >> 40) - (1 << 23)) / (float)(1 << 23);
    if (dt == GW_FLOAT32) {
      memcpy(ha + 4 * i, &x, 4);
      memcpy(hb + 4 * i, &y, 4);
    } else {
      uint16_t hx = dt == GW_BFLOAT16 ? gw__float_to_bf16(x) : gw__float_to_half(x);
      uint16_t hy = dt == GW_BFLOAT16 ? gw__float_to_bf16(y) : gw__float_to_half(y);
      memcpy(ha + 2 * i, &hx, 2);
      memcpy(hb + 2 * i, &hy, 2);
    }
  }
}

/* Output bytes [at, at + PERIOD) against the reference of one period. */
static void check_window(const unsigned char *ddst, size_t at, const unsigned char *ref, unsigned char *hbuf, int dt,
                         size_t bytes) {
  CK(cudaMemcpy(hbuf, ddst + at, PERIOD, cudaMemcpyDeviceToHost));
  if (memcmp(hbuf, ref, PERIOD) == 0) return;
  const size_t es = esize[dt];
  for (size_t i = 0; i < PERIOD / es; i++) {
    if (get_elem(hbuf, i, es) != get_elem(ref, i, es)) {
      fprintf(stderr, "MISMATCH %s SUM at %zu MiB, element %zu: device 0x%llx, host 0x%llx\n", dname[dt],
              bytes >> 20, at / es + i, (unsigned long long)get_elem(hbuf, i, es),
              (unsigned long long)get_elem(ref, i, es));
      break;
    }
  }
  failed = 1;
}

int main(int argc, char **argv) {
  const char *csv_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      csv_path = argv[++i];
    } else {
      fprintf(stderr, "usage: %s [--csv FILE]\n", argv[0]);
      return strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev < 1) {
    printf("gpu_reduce_bw: no GPU visible (%s); skipped\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
    return 77;
  }
  CK(cudaSetDevice(0));
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("gpu_reduce_bw: %s, %d SMs, %.0f GiB; host reference: the generic table (this CPU's: %s)\n", prop.name,
         prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30), gw__reduce_simd_name());

  check_flags();
  check_small();

  FILE *csv = NULL;
  if (csv_path) {
    csv = fopen(csv_path, "w");
    if (!csv) {
      perror(csv_path);
      return 1;
    }
    fprintf(csv, "dtype,bytes,reduce_GBps,copy_GBps,ratio\n");
  }
  unsigned char *da, *db, *dd, *dc;
  CK(cudaMalloc((void **)&da, MAXBYTES));
  CK(cudaMalloc((void **)&db, MAXBYTES));
  CK(cudaMalloc((void **)&dd, MAXBYTES));
  CK(cudaMalloc((void **)&dc, MAXBYTES));
  unsigned char *ha = malloc(PERIOD), *hb = malloc(PERIOD), *ref = malloc(PERIOD), *hbuf = malloc(PERIOD);
  if (!ha || !hb || !ref || !hbuf) {
    fprintf(stderr, "gpu_reduce_bw: out of host memory\n");
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev[4 * ITERS];
  for (int i = 0; i < 4 * ITERS; i++) CK(cudaEventCreate(&ev[i]));

  const int dts[3] = {GW_FLOAT32, GW_BFLOAT16, GW_FLOAT16};
  const size_t sizes[3] = {(size_t)64 << 20, (size_t)256 << 20, (size_t)1 << 30};
  printf("\nSUM of two inputs vs cudaMemcpyAsync device to device; GB/s = 1e9 bytes/s, best / mean of %d runs\n", ITERS);
  printf("%-9s %9s  %21s  %21s  %6s\n", "dtype", "bytes", "reduce GB/s (3x)", "copy GB/s (2x)", "ratio");
  for (int d = 0; d < 3; d++) {
    const int dt = dts[d];
    fill_pattern(dt, ha, hb);
    gw__reduce_table_generic[dt][GW_KOP_SUM](ref, NULL, ha, hb, PERIOD / esize[dt], 1);
    CK(cudaMemcpy(da, ha, PERIOD, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb, PERIOD, cudaMemcpyHostToDevice));
    for (size_t at = PERIOD; at < MAXBYTES; at += PERIOD) {
      CK(cudaMemcpy(da + at, da, PERIOD, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy(db + at, db, PERIOD, cudaMemcpyDeviceToDevice));
    }
    for (int z = 0; z < 3; z++) {
      const size_t bytes = sizes[z];
      CK(cudaMemsetAsync(dd, 0xff, bytes, s)); /* on s: a non-blocking stream does not wait for the legacy one */
      struct timing r, c;
      time_pair(dd, dc, da, db, bytes, dt, s, ev, &r, &c);
      check_window(dd, 0, ref, hbuf, dt, bytes);
      check_window(dd, bytes - PERIOD, ref, hbuf, dt, bytes);
      double rb = 3.0 * (double)bytes / (r.best_ms * 1e6), rm = 3.0 * (double)bytes / (r.mean_ms * 1e6);
      double cb = 2.0 * (double)bytes / (c.best_ms * 1e6), cm = 2.0 * (double)bytes / (c.mean_ms * 1e6);
      printf("%-9s %5zu MiB  %9.1f / %9.1f  %9.1f / %9.1f  %6.3f\n", dname[dt], bytes >> 20, rb, rm, cb, cm, rb / cb);
      if (csv) fprintf(csv, "%s,%zu,%.1f,%.1f,%.4f\n", dname[dt], bytes, rb, cb, rb / cb), fflush(csv);
    }
  }
  if (csv) fclose(csv);
  for (int i = 0; i < 4 * ITERS; i++) CK(cudaEventDestroy(ev[i]));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dd));
  CK(cudaFree(dc));
  free(ha), free(hb), free(ref), free(hbuf);
  if (failed) {
    printf("gpu_reduce_bw: FAILED (results differ from the host kernels; see above)\n");
    return 1;
  }
  printf("gpu_reduce_bw: results bit-identical to the host kernels\n");
  return 0;
}
