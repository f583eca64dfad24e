/* test_cudnn_cast_gpu.c - the cudnn backend kernels' 16-bit conversions on a
 * real GPU (gw__cu_cast: every kernel loads and stores activations through the
 * same widen / narrow), bit for bit against model/half.h, the cpu backend's:
 *   - every float16 and bfloat16 pattern widened to float32 (NaN payloads and
 *     signs, infinities, subnormals);
 *   - float32 values narrowed: every 16-bit value, the midpoints between
 *     neighbours (ties to even) and one float step either side of each, NaNs
 *     with payloads of both signs, 65504..65520 and beyond, the float16
 *     subnormal range and float32's own subnormals, zeros.
 * The device takes the hardware's conversions for all but NaNs (float16), so
 * this is what shows they agree with the host code.  Each direction runs on an
 * aligned buffer (the vector path) and one element off (the scalar path).
 * Also the NHWC sums' widening straight to double (gw__cu_widen_f64) over
 * every 16-bit pattern and float32's exponents, against the host's (double).
 * Exits 77 (skipped) without a GPU; no Check needed (the GPU check's machine). */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudnn_kernels.h"
#include "gradwire.h"
#include "half.h"

static int failures;


#define CUDA_OK(call)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

/* n values through gw__cu_cast on the device, the input at element offset off
 * (1: unaligned, the scalar path). */
static void device_cast(size_t n, int dst_dt, void *dst, size_t dst_esz, int src_dt, const void *src, size_t src_esz,
                        int off) {
  char *dsrc = NULL, *ddst = NULL;
  CUDA_OK(cudaMalloc((void **)&dsrc, (n + 8) * src_esz));
  CUDA_OK(cudaMalloc((void **)&ddst, (n + 8) * dst_esz));
  CUDA_OK(cudaMemcpy(dsrc + off * src_esz, src, n * src_esz, cudaMemcpyHostToDevice));
  int r = gw__cu_cast(n, dst_dt, ddst + off * dst_esz, src_dt, dsrc + off * src_esz, NULL);
  if (r != 0) {
    fprintf(stderr, "gw__cu_cast: %s\n", cudaGetErrorString((cudaError_t)r));
    exit(1);
  }
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(dst, ddst + off * dst_esz, n * dst_esz, cudaMemcpyDeviceToHost));
  cudaFree(dsrc), cudaFree(ddst);
}

static float host_widen(int dt, uint16_t h) { return dt == GW_FLOAT16 ? gw_f16_to_f32(h) : gw_bf16_to_f32(h); }
static uint16_t host_narrow(int dt, float f) { return dt == GW_FLOAT16 ? gw_f32_to_f16(f) : gw_f32_to_bf16(f); }

static void check_widen(int dt, const char *name) {
  const size_t n = 65536;
  uint16_t *h = malloc(n * sizeof *h);
  float *got = malloc(n * sizeof *got);
  for (size_t i = 0; i < n; i++) h[i] = (uint16_t)i;
  for (int off = 0; off < 2; off++) {
    device_cast(n, GW_FLOAT32, got, sizeof(float), dt, h, sizeof(uint16_t), off);
    int bad = 0;
    for (size_t i = 0; i < n; i++)
      if (gw_f32_bits(got[i]) != gw_f32_bits(host_widen(dt, h[i])) && bad++ < 5)
        fprintf(stderr, "  %s 0x%04zx widened to 0x%08x on the device, 0x%08x on the host (%s path)\n", name, i,
                gw_f32_bits(got[i]), gw_f32_bits(host_widen(dt, h[i])), off ? "scalar" : "vector");
    if (bad) fprintf(stderr, "FAIL: %d of 65536 %s patterns widen differently on the device\n", bad, name);
    failures += bad != 0;
  }
  free(h), free(got);
}

/* The narrowing inputs: around every 16-bit value of dt, NaNs, range ends. */
static size_t narrow_inputs(int dt, float *v, size_t cap) {
  size_t n = 0;
#define PUT(x) (n < cap ? (void)(v[n++] = (x)) : (void)0)
  for (uint32_t i = 0; i < 65536; i++) {
    const float a = host_widen(dt, (uint16_t)i);
    if (a != a) continue;
    PUT(a);
    if (a - a != 0) continue; /* an infinity: nothing above it */
    /* the next pattern up in magnitude, same sign; past the largest finite,
     * infinity, whose "midpoint" is the overflow tie (half a step up: 65520,
     * bf16's 0x7f7f8000), the value where rounding turns to infinity */
    const float b = host_widen(dt, (uint16_t)(i + 1));
    const float mid = b - b != 0 ? gw_f32_from_bits(gw_f32_bits(a) + (dt == GW_FLOAT16 ? 0x1000u : 0x8000u))
                                 : (float)(((double)a + (double)b) / 2); /* exact: one more bit */
    PUT(mid);
    PUT(gw_f32_from_bits(gw_f32_bits(mid) + 1));
    PUT(gw_f32_from_bits(gw_f32_bits(mid) - 1));
  }
  static const uint32_t special[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fbfffffu,
                                     0xffffffffu, 0x7fffe000u, 0x7f802000u, 0x7f801fffu, 0x00000001u, 0x80000001u,
                                     0x007fffffu, 0x00400000u, 0x33000000u, 0x33000001u, 0x32ffffffu, 0xb3000000u,
                                     0x33800000u, 0x33c00000u, 0x387fe000u, 0x387ff000u, 0x38800000u, 0x477fe000u,
                                     0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u, 0x7f7fffffu, 0xff7fffffu,
                                     0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u};
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) PUT(gw_f32_from_bits(special[i]));
#undef PUT
  return n;
}

static void check_narrow(int dt, const char *name) {
  const size_t cap = 65536 * 4 + 64;
  float *v = malloc(cap * sizeof *v);
  uint16_t *got = malloc(cap * sizeof *got);
  const size_t n = narrow_inputs(dt, v, cap);
  for (int off = 0; off < 2; off++) {
    device_cast(n, dt, got, sizeof(uint16_t), GW_FLOAT32, v, sizeof(float), off);
    int bad = 0;
    for (size_t i = 0; i < n; i++)
      if (got[i] != host_narrow(dt, v[i]) && bad++ < 5)
        fprintf(stderr, "  float 0x%08x to %s: 0x%04x on the device, 0x%04x on the host (%s path)\n", gw_f32_bits(v[i]),
                name, got[i], host_narrow(dt, v[i]), off ? "scalar" : "vector");
    if (bad) fprintf(stderr, "FAIL: %d of %zu float32 values narrow to %s differently on the device\n", bad, n, name);
    failures += bad != 0;
  }
  printf("%s: 65536 patterns widened, %zu values narrowed, both paths\n", name, n);
  free(v), free(got);
}

/* gw__cu_widen_f64 (the NHWC sums' variant 2 widening on the integer path)
 * against C's (double) of the host's float: bit for bit but for NaNs, which
 * take the device's float-to-double conversion there (as every variant does)
 * and only need to stay NaNs.  n values of dt from src. */
static void check_widen_f64(int dt, const char *name, const void *src, size_t n) {
  const size_t esz = dt == GW_FLOAT32 ? 4 : 2;
  char *dsrc = NULL;
  double *ddst = NULL, *got = malloc(n * sizeof *got);
  CUDA_OK(cudaMalloc((void **)&dsrc, n * esz));
  CUDA_OK(cudaMalloc((void **)&ddst, n * sizeof(double)));
  CUDA_OK(cudaMemcpy(dsrc, src, n * esz, cudaMemcpyHostToDevice));
  int r = gw__cu_widen_f64(n, dt, dsrc, ddst, NULL);
  if (r != 0) {
    fprintf(stderr, "gw__cu_widen_f64: %s\n", cudaGetErrorString((cudaError_t)r));
    exit(1);
  }
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(got, ddst, n * sizeof(double), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    float f;
    if (dt == GW_FLOAT32)
      memcpy(&f, (const char *)src + 4 * i, 4);
    else
      f = host_widen(dt, ((const uint16_t *)src)[i]);
    const double want = (double)f;
    const int ok = want != want ? got[i] != got[i] : memcmp(&got[i], &want, sizeof want) == 0;
    if (!ok && bad++ < 5)
      fprintf(stderr, "  %s 0x%08x widened to double: %a on the device, %a on the host\n", name, gw_f32_bits(f),
              got[i], want);
  }
  if (bad) fprintf(stderr, "FAIL: %d of %zu %s values widen to double differently on the device\n", bad, n, name);
  failures += bad != 0;
  printf("%s: %zu values widened to double\n", name, n);
  cudaFree(dsrc), cudaFree(ddst), free(got);
}

static void check_widen_f64_all(void) {
  uint16_t *h = malloc(65536 * sizeof *h);
  for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
  check_widen_f64(GW_FLOAT16, "float16", h, 65536);
  check_widen_f64(GW_BFLOAT16, "bfloat16", h, 65536);
  free(h);
  /* float32: every exponent and sign with edge mantissas, then the float16
   * narrowing inputs (the subnormal range and the specials among them) */
  const size_t cap = 65536 * 4 + 64 + 512 * 6;
  float *v = malloc(cap * sizeof *v);
  size_t n = 0;
  static const uint32_t mant[] = {0, 1, 2, 0x400000u, 0x7ffffeu, 0x7fffffu};
  for (uint32_t e = 0; e < 512; e++) /* e's top bit: the sign */
    for (size_t m = 0; m < sizeof mant / sizeof mant[0]; m++) v[n++] = gw_f32_from_bits(e << 23 | mant[m]);
  n += narrow_inputs(GW_FLOAT16, v + n, cap - n);
  check_widen_f64(GW_FLOAT32, "float32", v, n);
  free(v);
}

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    cudaGetLastError();
    printf("cudnn-cast-gpu: no GPU, skipped\n");
    return 77;
  }
  check_widen(GW_FLOAT16, "float16");
  check_widen(GW_BFLOAT16, "bfloat16");
  check_narrow(GW_FLOAT16, "float16");
  check_narrow(GW_BFLOAT16, "bfloat16");
  check_widen_f64_all();
  printf("%s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
