/* reduce.c - picks the reduction kernels for this CPU once (AVX-512, AVX2 or plain
 * x86-64; GW_SIMD forces a lower level), plus the copy helper and the exported
 * scalar conversions.  The kernels themselves are in reduce_impl.c. */
#include <pthread.h>
#include <string.h>
#include <strings.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "core.h"
#include "reduce.h"
#include "reduce_cvt.h"

static const gw_reduce_table_t *chosen;
static const char *chosen_name = "generic";
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

const gw_reduce_table_t *gw__reduce_table_named(const char *name) {
  if (!strcasecmp(name, "generic")) return &gw__reduce_table_generic;
#ifdef GW_HAVE_X86_SIMD
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("f16c");
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!strcasecmp(name, "avx2")) return avx2 ? &gw__reduce_table_avx2 : NULL;
  if (!strcasecmp(name, "avx512")) return avx512 ? &gw__reduce_table_avx512 : NULL;
#endif
  return NULL;
}

static void choose(void) {
  static const char *order[] = {"avx512", "avx2", "generic"};
  const char *want = gw__env_str("GW_SIMD", NULL);
  bool known = want == NULL;
  for (size_t i = 0; !known && i < sizeof order / sizeof order[0]; i++) known = !strcasecmp(want, order[i]);
  if (!known) GW_WARN(GW_SUB_INIT, "GW_SIMD=%s is not one of avx512, avx2, generic; ignored", want);
  /* an unknown name is ignored: the best the CPU has (it left every table
   * unreached, so the slowest was taken) */
  bool reached = !known || want == NULL;
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    if (!reached && !strcasecmp(want, order[i])) reached = true;
    if (!reached) continue;
    const gw_reduce_table_t *t = gw__reduce_table_named(order[i]);
    if (t) {
      chosen = t;
      chosen_name = order[i];
      break;
    }
  }
  if (!chosen) chosen = &gw__reduce_table_generic, chosen_name = "generic";
  GW_INFO(GW_SUB_INIT, "host reduction kernels: %s", chosen_name);
}

const gw_reduce_table_t *gw__reduce_table(void) {
  pthread_once(&choose_once, choose);
  return chosen;
}

const char *gw__reduce_simd_name(void) {
  pthread_once(&choose_once, choose);
  return chosen_name;
}

void gw__copy2(void *dst0, void *dst1, const void *src, size_t bytes) {
  if (dst0 != src) memcpy(dst0, src, bytes);
  if (dst1) memcpy(dst1, src, bytes);
}

void gw__copy_stream(void *dst, const void *src, size_t bytes) {
#if defined(__x86_64__)
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > bytes) head = bytes;
  memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)(d + 16), b);
    _mm_stream_si128((__m128i *)(d + 32), c);
    _mm_stream_si128((__m128i *)(d + 48), e);
  }
  memcpy(d, s, bytes);
  _mm_sfence(); /* streaming stores are weakly ordered: finish them before anything is published */
#else
  memcpy(dst, src, bytes);
#endif
}

float gw__half_to_float(uint16_t h) { return cvt_h2f(h); }
uint16_t gw__float_to_half(float f) { return cvt_f2h(f); }
float gw__bf16_to_float(uint16_t h) { return cvt_bf2f(h); }
uint16_t gw__float_to_bf16(float f) { return cvt_f2bf(f); }

/* The conversions of the instruction set the kernels were chosen for. */
void gw__cvt_from_f32(gw_dtype_t to, void *dst, const float *src, size_t n) {
  const gw_reduce_table_t *t = gw__reduce_table();
  int bf = to == GW_BFLOAT16;
#ifdef GW_HAVE_X86_SIMD
  if (t == &gw__reduce_table_avx512) return gw__cvt_to16_avx512(bf, dst, src, n);
  if (t == &gw__reduce_table_avx2) return gw__cvt_to16_avx2(bf, dst, src, n);
#endif
  (void)t;
  gw__cvt_to16_generic(bf, dst, src, n);
}

void gw__cvt_from_f32_scaled(gw_dtype_t to, void *dst, const float *src, size_t n, float scale) {
  if (scale == 1.0f) return gw__cvt_from_f32(to, dst, src, n);
  float tmp[1024]; /* scaled in pieces that stay in L1, then converted as above */
  for (size_t at = 0; at < n; at += 1024) {
    const size_t k = n - at < 1024 ? n - at : 1024;
    for (size_t i = 0; i < k; i++) tmp[i] = src[at + i] * scale;
    gw__cvt_from_f32(to, (uint16_t *)dst + at, tmp, k);
  }
}

void gw__cvt_to_f32(gw_dtype_t from, float *dst, const void *src, size_t n) {
  const gw_reduce_table_t *t = gw__reduce_table();
  int bf = from == GW_BFLOAT16;
#ifdef GW_HAVE_X86_SIMD
  if (t == &gw__reduce_table_avx512) return gw__cvt_from16_avx512(bf, dst, src, n);
  if (t == &gw__reduce_table_avx2) return gw__cvt_from16_avx2(bf, dst, src, n);
#endif
  (void)t;
  gw__cvt_from16_generic(bf, dst, src, n);
}

/* The one-pass kernels built with the reduction table t (NULL: none). */
static const gw_fold_table_t *fold_of(const gw_reduce_table_t *t) {
#ifdef GW_HAVE_X86_SIMD
  if (t == &gw__reduce_table_avx512) return &gw__fold_table_avx512;
  if (t == &gw__reduce_table_avx2) return &gw__fold_table_avx2;
#endif
  return t ? &gw__fold_table_generic : NULL;
}

const gw_fold_table_t *gw__fold_table_named(const char *name) { return fold_of(gw__reduce_table_named(name)); }

void gw__fold_reduce(gw_op_t op, gw_dtype_t wire, void *slot, float *wide, const void *recv, const float *local,
                     size_t n, uint32_t div, float scale, int local_first) {
  const gw_fold_table_t *f = fold_of(gw__reduce_table());
  (*f)[wire == GW_BFLOAT16][op == GW_AVG ? GW_KOP_SUM : (int)op](slot, wide, recv, local, n, div, scale, local_first);
}
