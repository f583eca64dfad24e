/* test_cudnn_kernels_host.cu - the arithmetic of the cudnn backend's kernels
 * (model/cudnn_kernels_math.cuh) run on the host, against independent
 * references written here in long double.  Host code only: no GPU, no kernel
 * launch.  Where the kernels split work over threads and blocks (the
 * per-channel sums, the loss row, the average pool), the test replays the same
 * split serially (pieces, threads, the pairwise tree), so index mistakes show up
 * as missing or doubled values, not only arithmetic ones.
 *
 * Every test that touches activations runs with float activations and with bf16
 * ones (loads widened to float, stores rounded once, as the kernels'
 * gwk::widen / gwk::narrow); the flat ops and the casts with f16 ones too (the
 * arithmetic is the same float arithmetic for every type: what f16 adds is its
 * conversions and packing, tested like bf16's).  A bf16 store is checked two ways: its bits must be
 * this file's own rounding (test_bf16: rint on the scaled value, not bit
 * tricks) of the float the same arithmetic gives, and its value must be within
 * bf16 rounding of the long-double reference.  The vector paths (load4 / store4
 * quads, load8 / store8 octets: the packing of bf16 pairs into words) are
 * replayed and must give the same bits as the element-wise path.
 *
 * Tolerances are stated where they are checked; each is the output's rounding
 * (float, or bf16 after float) plus a bound on the double arithmetic before it.
 * Exit 0 when everything holds, 1 (with what failed) otherwise. */
#include <type_traits>

#include "cudnn_host_common.cuh"

namespace gwt {
int failures, checks;
}

using namespace gwt;

namespace {

/* The vector packing of a 16-bit type: quads and octets against element by element. */
template <class H>
void check_packing(const char *name) {
  alignas(16) H in[64], out4[64], out8[64], want[64];
  alignas(16) float fin[64];
  for (int i = 0; i < 64; i++) {
    in[i].bits = (uint16_t)rnd();
    fin[i] = float_of((uint32_t)rnd());
    want[i] = narrow<H>(fin[i]);
  }
  size_t bad_v = 0;
  for (int i = 0; i < 64; i += 8) {
    const Vals<8> v8 = load8(in + i);
    const Quad a = load4(in + i), b = load4(in + i + 4);
    for (int l = 0; l < 8; l++) {
      const uint32_t w = bits_of(widen(in[i + l]));
      bad_v += bits_of(v8.v[l]) != w;
      bad_v += bits_of(l < 4 ? a.v[l] : b.v[l - 4]) != w;
    }
    Vals<8> f8;
    Quad fa, fb;
    for (int l = 0; l < 8; l++) f8.v[l] = fin[i + l], (l < 4 ? fa.v[l] : fb.v[l - 4]) = fin[i + l];
    store8(out8 + i, f8);
    store4(out4 + i, fa);
    store4(out4 + i + 4, fb);
  }
  CHECK(bad_v == 0, "%zu %s vector loads differ from the elements", bad_v, name);
  CHECK(memcmp(out8, want, sizeof want) == 0, "store8 of %s differs from the elements", name);
  CHECK(memcmp(out4, want, sizeof want) == 0, "store4 of %s differs from the elements", name);
}

/* ---- the bf16 conversion itself --------------------------------------------------------------------- */
void test_bf16(void) {
  /* widening: every pattern, exactly (a NaN keeps all its bits) */
  size_t bad_w = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = widen(bf16{(uint16_t)h});
    const double want = ref_bf16_value((uint16_t)h);
    const bool ok = want != want ? (f != f && bits_of(f) == h << 16)
                                 : ((double)f == want && (bits_of(f) >> 31) == (h >> 15));
    if (!ok && bad_w++ < 3) fprintf(stderr, "  widen(0x%04x) = %a, want %a\n", h, (double)f, want);
  }
  CHECK(bad_w == 0, "%zu of 65536 bf16 patterns widened wrongly", bad_w);

  /* rounding: around every bf16 pattern (h << 16 plus low halves: exact, just
   * above, below / at / above the tie, just below the next), then random floats;
   * each against the reference, model/half.h (the cpu backend's) and, but for
   * NaN, cuda_bf16.h's host __float2bfloat16_rn */
  const uint32_t lows[] = {0, 1, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xfffe, 0xffff};
  size_t bad_r = 0, bad_half = 0, bad_nv = 0, cases = 0;
  auto one = [&](uint32_t u) {
    const float f = float_of(u);
    const uint16_t got = f32_to_bf16_bits(f), want = ref_bf16_round(f);
    cases++;
    if (got != want && bad_r++ < 5) fprintf(stderr, "  bf16(0x%08x) = 0x%04x, want 0x%04x\n", u, got, want);
    bad_half += got != gw_f32_to_bf16(f);
    if (f == f) {
      const __nv_bfloat16 nv = __float2bfloat16_rn(f);
      uint16_t nb;
      memcpy(&nb, &nv, sizeof nb);
      bad_nv += nb != got;
    }
    bad_r += narrow<bf16>(f).bits != got;
  };
  for (uint32_t h = 0; h < 65536; h++) {
    for (uint32_t lo : lows) one(h << 16 | lo);
    one(h << 16 | (uint32_t)(rnd() & 0xffff));
  }
  for (int i = 0; i < 2000000; i++) one((uint32_t)rnd());
  CHECK(bad_r == 0, "%zu of %zu floats rounded to bf16 wrongly", bad_r, cases);
  CHECK(bad_half == 0, "%zu of %zu floats rounded differently from model/half.h", bad_half, cases);
  CHECK(bad_nv == 0, "%zu of %zu non-NaN floats rounded differently from __float2bfloat16_rn", bad_nv, cases);

  /* named cases, the expected bits written out */
  const struct {
    uint32_t f;
    uint16_t b;
    const char *what;
  } named[] = {
      {0x3f800000, 0x3f80, "1"},
      {0x3f808000, 0x3f80, "1 + 2^-8: a tie, to the even 1"},
      {0x3f818000, 0x3f82, "a tie from an odd bf16: up to even"},
      {0x3f808001, 0x3f81, "just above a tie: up"},
      {0x3f807fff, 0x3f80, "just below a tie: down"},
      {0xbf818000, 0xbf82, "a negative tie: to even, away from 0"},
      {0x7f7fffff, 0x7f80, "FLT_MAX: overflows to inf"},
      {0x7f7f7fff, 0x7f7f, "just below the tie at the top: the largest bf16"},
      {0x7f7f8000, 0x7f80, "the tie at the top: to even, inf"},
      {0xff7fffff, 0xff80, "-FLT_MAX: -inf"},
      {0x7f800000, 0x7f80, "inf"},
      {0xff800000, 0xff80, "-inf"},
      {0x80000000, 0x8000, "-0"},
      {0x00000001, 0x0000, "the smallest float denormal: 0"},
      {0x00008000, 0x0000, "a denormal tie: to the even 0"},
      {0x00018000, 0x0002, "a denormal tie from an odd: up"},
      {0x00010000, 0x0001, "the smallest bf16 denormal"},
      {0x807fffff, 0x8080, "the largest negative float denormal: up to -2^-126"},
      {0x7fc00000, 0x7fc0, "the quiet NaN"},
      {0x7f800001, 0x7fc0, "a signaling NaN with a low payload: quiet"},
      {0xff812345, 0xffc1, "a negative signaling NaN: sign and upper payload kept, quiet"},
      {0x7fffffff, 0x7fff, "a NaN with every bit"},
  };
  for (const auto &c : named) {
    const uint16_t got = f32_to_bf16_bits(float_of(c.f));
    CHECK(got == c.b, "bf16(0x%08x) = 0x%04x, want 0x%04x (%s)", c.f, got, c.b, c.what);
  }

  check_packing<bf16>("bf16");
}

/* ---- the f16 conversion ------------------------------------------------------------------------- */
void test_f16(void) {
  /* widening: every pattern, exactly (a NaN keeps its sign and payload, in the
   * float's upper fraction bits), and as model/half.h does */
  size_t bad_w = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = widen(f16{(uint16_t)h});
    const double want = ref_f16_value((uint16_t)h);
    const bool ok = want != want ? (f != f && bits_of(f) == ((h & 0x8000u) << 16 | 0x7f800000u | (h & 0x3ffu) << 13))
                                 : ((double)f == want && (bits_of(f) >> 31) == (h >> 15));
    if ((!ok || !same_bits(f, gw_f16_to_f32((uint16_t)h))) && bad_w++ < 3)
      fprintf(stderr, "  widen f16 0x%04x = %a, want %a\n", h, (double)f, want);
  }
  CHECK(bad_w == 0, "%zu of 65536 f16 patterns widened wrongly", bad_w);

  /* rounding: every float whose low 13 bits are one of the interesting values
   * (exact, just above, below / at / above the tie, just below the next f16),
   * over every upper 19 bits, then random floats; against the reference,
   * model/half.h and, but for NaN, cuda_fp16.h's host __float2half_rn */
  const uint32_t lows[] = {0, 1, 0x7ff, 0xfff, 0x1000, 0x1001, 0x17ff, 0x1ffe, 0x1fff};
  size_t bad_r = 0, bad_half = 0, bad_nv = 0, cases = 0;
  auto one = [&](uint32_t u) {
    const float f = float_of(u);
    const uint16_t got = f32_to_f16_bits(f), want = ref_f16_round(f);
    cases++;
    if (got != want && bad_r++ < 5) fprintf(stderr, "  f16(0x%08x) = 0x%04x, want 0x%04x\n", u, got, want);
    bad_half += got != gw_f32_to_f16(f);
    if (f == f) {
      const __half nv = __float2half_rn(f);
      uint16_t nb;
      memcpy(&nb, &nv, sizeof nb);
      bad_nv += nb != got;
    }
    bad_r += narrow<f16>(f).bits != got;
  };
  for (uint32_t hi = 0; hi < (1u << 19); hi++) {
    for (uint32_t lo : lows) one(hi << 13 | lo);
    one(hi << 13 | (uint32_t)(rnd() & 0x1fff));
  }
  for (int i = 0; i < 1000000; i++) one((uint32_t)rnd());
  CHECK(bad_r == 0, "%zu of %zu floats rounded to f16 wrongly", bad_r, cases);
  CHECK(bad_half == 0, "%zu of %zu floats rounded to f16 differently from model/half.h", bad_half, cases);
  CHECK(bad_nv == 0, "%zu of %zu non-NaN floats rounded differently from __float2half_rn", bad_nv, cases);

  const struct {
    uint32_t f;
    uint16_t h;
    const char *what;
  } named[] = {
      {0x3f800000, 0x3c00, "1"},
      {0x3f801000, 0x3c00, "1 + 2^-11: a tie, to the even 1"},
      {0x3f803000, 0x3c02, "a tie from an odd f16: up to even"},
      {0x477fe000, 0x7bff, "65504: the largest f16"},
      {0x477fefff, 0x7bff, "just below 65520: 65504"},
      {0x477ff000, 0x7c00, "65520, the tie at the top: to even, inf"},
      {0xc77ff000, 0xfc00, "-65520: -inf"},
      {0x38800000, 0x0400, "2^-14: the smallest normal f16"},
      {0x387fe000, 0x0400, "just below 2^-14, rounding up to it"},
      {0x33800000, 0x0001, "2^-24: the smallest f16 denormal"},
      {0x33000000, 0x0000, "2^-25: a tie, to the even 0"},
      {0x33000001, 0x0001, "just above 2^-25: up"},
      {0x33c00000, 0x0002, "1.5 * 2^-24: a tie from an odd denormal, up to even"},
      {0x80000000, 0x8000, "-0"},
      {0x7f800000, 0x7c00, "inf"},
      {0x7fc00000, 0x7e00, "the quiet NaN"},
      {0x7f800001, 0x7e00, "a signaling NaN with a low payload: quiet"},
      {0xff812345, 0xfe09, "a negative signaling NaN: sign and upper payload kept, quiet"},
  };
  for (const auto &c : named) {
    const uint16_t got = f32_to_f16_bits(float_of(c.f));
    CHECK(got == c.h, "f16(0x%08x) = 0x%04x, want 0x%04x (%s)", c.f, got, c.h, c.what);
  }

  check_packing<f16>("f16");
}

/* ---- widening straight to double (the NHWC sums' variant 2) -------------------------------------
 * widen_d against (double) of widen's float, bit for bit (NaN payloads and
 * signs, infinities, subnormals, zeros): every 16-bit pattern, every float
 * exponent with edge and random mantissas, random floats; positive() against
 * the float's > 0 (the ReLU mask). */
bool same_f64(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

template <class H>
size_t widen_d_bad16(void) {
  size_t bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    const H v{(uint16_t)h};
    const float f = widen(v);
    const bool ok = same_f64(widen_d(v), (double)f) && positive(v) == (f > 0.0f);
    if (!ok && bad++ < 3) fprintf(stderr, "  widen_d 0x%04x = %a, want %a\n", h, widen_d(v), (double)f);
  }
  return bad;
}

void test_widen_d(void) {
  CHECK(widen_d_bad16<bf16>() == 0, "bf16 widen_d / positive: patterns wrong");
  CHECK(widen_d_bad16<f16>() == 0, "f16 widen_d / positive: patterns wrong");
  size_t bad = 0, cases = 0;
  auto one = [&](uint32_t u) {
    const float f = float_of(u);
    cases++;
    const bool ok = same_f64(widen_d(f), (double)f) && positive(f) == (f > 0.0f);
    if (!ok && bad++ < 3) fprintf(stderr, "  widen_d 0x%08x = %a, want %a\n", u, widen_d(f), (double)f);
  };
  for (uint32_t e = 0; e < 256; e++)
    for (uint32_t sign : {0u, 1u})
      for (uint32_t m : {0u, 1u, 2u, 0x400000u, 0x7ffffeu, 0x7fffffu, (uint32_t)rnd() & 0x7fffffu})
        one(sign << 31 | e << 23 | m);
  for (int i = 0; i < 1000000; i++) one((uint32_t)rnd());
  CHECK(bad == 0, "%zu of %zu floats widened to double wrongly by widen_d", bad, cases);
}

/* ---- batch norm's apply passes on the bits ------------------------------------------------------
 * bn_fwd_elem and bn_bwd_elem (the device's apply passes, element and quad
 * forms) against the float path they replace, written out here: widen each
 * element, the float functions, narrow at each store.  Bit for bit, for every
 * 16-bit pattern in each operand's place (the others from a set with zeros,
 * subnormals, infinities, NaNs of both signs and kinds, random values), and
 * for floats the same set and random patterns.  dz (a copy, no arithmetic)
 * bit for bit always. */
template <class T>
T elem_bits(uint32_t u);
template <>
float elem_bits<float>(uint32_t u) {
  return float_of(u);
}
template <>
bf16 elem_bits<bf16>(uint32_t u) {
  return bf16{(uint16_t)u};
}
template <>
f16 elem_bits<f16>(uint32_t u) {
  return f16{(uint16_t)u};
}
inline uint32_t bits_elem(float v) { return bits_of(v); }
inline uint32_t bits_elem(bf16 v) { return v.bits; }
inline uint32_t bits_elem(f16 v) { return v.bits; }

/* Stored patterns worth every path, in this order for each type: +-0, +-the
 * smallest subnormal, +-1, +-the largest finite, +-inf, a quiet NaN, a
 * negative one with a payload, signalling NaNs, the smallest normal, 0.3,
 * -3.14; then random patterns. */
template <class T>
std::vector<T> edge_elems(int randoms) {
  static const uint32_t f32[] = {0u, 0x80000000u, 1u, 0x80000001u, 0x3f800000u, 0xbf800000u,
                                 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                 0x7f800001u, 0xff812345u, 0x00800000u, 0x3e99999au, 0xc0490fdbu};
  static const uint32_t b16[] = {0, 0x8000, 1, 0x8001, 0x3f80, 0xbf80, 0x7f7f, 0xff7f, 0x7f80,
                                 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0xff81, 0x0080, 0x3e9a, 0xc049};
  static const uint32_t h16[] = {0, 0x8000, 1, 0x8001, 0x3c00, 0xbc00, 0x7bff, 0xfbff, 0x7c00,
                                 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0xfd01, 0x0400, 0x34cd, 0xc248};
  const uint32_t *e = std::is_same<T, float>::value ? f32 : std::is_same<T, bf16>::value ? b16 : h16;
  std::vector<T> r;
  for (int i = 0; i < 17; i++) r.push_back(elem_bits<T>(e[i]));
  for (int i = 0; i < randoms; i++) r.push_back(elem_bits<T>((uint32_t)(rnd() >> (sizeof(T) == 4 ? 32 : 48))));
  return r;
}

template <class T>
T ref_fwd(T x, const BnAffine &a, bool has_z, T z, bool relu_on) {
  T r = narrow<T>(bn_affine_apply(widen(x), a));
  if (has_z) r = narrow<T>(add_rn(widen(r), widen(z)));
  if (relu_on) r = narrow<T>(relu(widen(r)));
  return r;
}
template <class T>
T ref_bwd(T x, T dy, bool has_ym, T ym, const BnBwd &p, T *dz) {
  const float g = has_ym ? relu_bwd(widen(ym), widen(dy)) : widen(dy);
  *dz = narrow<T>(g);
  return narrow<T>(bn_bwd_apply(widen(x), g, p));
}

template <class T>
void test_bn_elems(void) {
  const bool wide = sizeof(T) == 4;
  const char *name = Act<T>::name;
  /* every pattern (16-bit) or the edges and 2^16 random floats, in turn in each operand's place */
  std::vector<T> all;
  if (wide) {
    all = edge_elems<T>(1 << 16);
  } else {
    for (uint32_t u = 0; u < 65536; u++) all.push_back(elem_bits<T>(u));
  }
  const std::vector<T> few = edge_elems<T>(6);
  /* masks: +-0, +-the smallest subnormal, +-1, +inf, a NaN */
  const T masks[] = {few[0], few[1], few[2], few[3], few[4], few[5], few[8], few[10]};
  /* channels: ordinary, one that overflows T (a huge scale), a NaN scale, a zero one */
  const BnAffine affs[] = {bn_affine_train(1.25f, -0.5f, 0.1f, 2.0f), bn_affine_infer(0.75f, 0.25f, -3.0f, 4.0f, 1e-5),
                           {1e30, -1e-3}, {NAN, 0.0}, {0.0, -0.0}};
  const BnBwd bwds[] = {bn_bwd_channel(1.25f, 0.1f, 2.0f, 3.5, -1.25, 64.0), bn_bwd_channel(0.5f, -7.0f, 0.01f, 1e-9, 1e9, 3.0),
                        bn_bwd_channel(2.0f, 0.0f, 1e20f, 0.0, 0.0, 1.0)};
  size_t bad_f = 0, bad_b = 0, n_f = 0, n_b = 0;
  auto fwd = [&](T x, const BnAffine &a, bool has_z, T z, bool relu_on) {
    n_f++;
    const T got = bn_fwd_elem<T>(x, a, has_z, z, relu_on), want = ref_fwd<T>(x, a, has_z, z, relu_on);
    /* NaNs made by arithmetic: the GPU's are canonical, the host's carry a
     * payload of whichever operand the compiler put first: any NaN for a NaN */
    if (bits_elem(got) != bits_elem(want) && !(is_nan(got) && is_nan(want)) && bad_f++ < 3)
      fprintf(stderr, "  %s bn_fwd_elem(x 0x%x, z %d 0x%x, relu %d) = 0x%x, want 0x%x\n", name, bits_elem(x), has_z,
              bits_elem(z), relu_on, bits_elem(got), bits_elem(want));
  };
  auto bwd = [&](T x, T dy, bool has_ym, T ym, const BnBwd &p) {
    n_b++;
    T dz, dz_want;
    const T got = bn_bwd_elem<T>(x, dy, has_ym, ym, p, &dz), want = ref_bwd<T>(x, dy, has_ym, ym, p, &dz_want);
    if (((bits_elem(got) != bits_elem(want) && !(is_nan(got) && is_nan(want))) || bits_elem(dz) != bits_elem(dz_want)) &&
        bad_b++ < 3)
      fprintf(stderr, "  %s bn_bwd_elem(x 0x%x, dy 0x%x, ym %d 0x%x) = 0x%x dz 0x%x, want 0x%x dz 0x%x\n", name,
              bits_elem(x), bits_elem(dy), has_ym, bits_elem(ym), bits_elem(got), bits_elem(dz), bits_elem(want),
              bits_elem(dz_want));
  };
  for (const BnAffine &a : affs)
    for (int relu_on = 0; relu_on < 2; relu_on++) {
      for (T x : all) fwd(x, a, false, T(), relu_on != 0);
      for (T z : few)
        for (T x : all) fwd(x, a, true, z, relu_on != 0);
      for (T x : few)
        for (T z : all) fwd(x, a, true, z, relu_on != 0);
    }
  for (const BnBwd &p : bwds)
    for (T o : few)
      for (T v : all) {
        bwd(v, o, false, T(), p);
        bwd(o, v, false, T(), p);
        for (T m : masks) bwd(v, o, true, m, p), bwd(o, v, true, m, p);
        bwd(o, o, true, v, p);
      }
  CHECK(bad_f == 0, "%s: %zu of %zu forward elements differ from the float path's", name, bad_f, n_f);
  CHECK(bad_b == 0, "%s: %zu of %zu backward elements differ from the float path's", name, bad_b, n_b);
  /* Raw4: the elements in memory order, a store writes them back as read */
  T src[4] = {all[1], all[2], all[3], all[4]}, dst[4];
  Raw4<T> q;
  q.load(src);
  q.store(dst);
  CHECK(memcmp(src, dst, sizeof src) == 0 && bits_elem(q.v[2]) == bits_elem(src[2]), "%s: Raw4 reordered", name);
}

/* ---- fast division ------------------------------------------------------------------------- */
void test_fastdiv(void) {
  const uint32_t ds[] = {1, 2, 3, 4, 5, 7, 49, 64, 196, 3136, 12544, 100352, (1u << 20) + 1, 2147483647u, 2147483648u};
  for (uint32_t d : ds) {
    const FastDiv f = fastdiv_make(d);
    const uint32_t ns[] = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 2147483646u, 2147483647u};
    for (uint32_t n : ns)
      if (n < 2147483648u) CHECK(fastdiv(f, n) == n / d, "%u / %u gave %u", n, d, fastdiv(f, n));
    for (int i = 0; i < 20000; i++) {
      const uint32_t n = (uint32_t)(rnd() >> 33); /* < 2^31 */
      if (fastdiv(f, n) != n / d) {
        CHECK(fastdiv(f, n) == n / d, "%u / %u gave %u", n, d, fastdiv(f, n));
        break;
      }
    }
  }
  for (int i = 0; i < 200000; i++) {
    const uint32_t d = 1 + (uint32_t)(rnd() % 2147483647u), n = (uint32_t)(rnd() >> 33);
    if (fastdiv(fastdiv_make(d), n) != n / d) {
      CHECK(false, "%u / %u gave %u", n, d, fastdiv(fastdiv_make(d), n));
      break;
    }
  }
}

/* Counts the visits of every element and those outside the channel. */
struct VisitAcc {
  int *hits;
  long *wrong;
  int ch, c;
  uint32_t hw;
  double s, s2;
  GWK_HD void add1(size_t off) {
    hits[off]++;
    if ((int)((off / hw) % (size_t)c) != ch) ++*wrong;
  }
  GWK_HD void add4(size_t off) {
    for (int i = 0; i < 4; i++) add1(off + i);
  }
};

struct Shape {
  int n, c, h, w;
};
const Shape kBnShapes[] = {{1, 1, 1, 1}, {2, 3, 5, 7},   {3, 2, 7, 7},    {4, 3, 8, 8},   {2, 1, 64, 65},
                           {5, 2, 41, 43}, {3, 2, 100, 100}, {1, 2, 91, 91}, {7, 3, 28, 28}, {16, 2, 7, 7}};

void test_chan_coverage(void) {
  for (const Shape &sh : kBnShapes) {
    const uint32_t hw = (uint32_t)(sh.h * sh.w);
    const size_t total = (size_t)sh.n * sh.c * hw;
    for (int vec = 0; vec < 2; vec++) {
      if (vec && hw % 4) continue;
      std::vector<int> hits(total, 0);
      long wrong = 0;
      VisitAcc proto = {hits.data(), &wrong, 0, sh.c, hw, 0, 0};
      std::vector<double> out;
      replay_chan(proto, [](VisitAcc &a, int ch) { a.ch = ch; }, sh.n, sh.c, hw, vec != 0, out);
      size_t bad = 0;
      for (size_t i = 0; i < total; i++) bad += hits[i] != 1;
      CHECK(bad == 0 && wrong == 0, "[%d,%d,%d,%d] vec %d: %zu elements not visited once, %ld outside the channel",
            sh.n, sh.c, sh.h, sh.w, vec, bad, wrong);
    }
  }
}

/* x [n, c, h, w] of T: channel ch centered at center[ch] with spread spread[ch]. */
template <class T>
std::vector<T> make_x(const Shape &sh, const std::vector<double> &center, const std::vector<double> &spread) {
  const size_t hw = (size_t)sh.h * sh.w;
  std::vector<T> x((size_t)sh.n * sh.c * hw);
  for (int s = 0; s < sh.n; s++)
    for (int ch = 0; ch < sh.c; ch++)
      for (size_t i = 0; i < hw; i++)
        x[((size_t)s * sh.c + ch) * hw + i] = Act<T>::make(center[ch] + spread[ch] * sym());
  return x;
}

/* The bn forward pieces: sums, stats, running update, apply (train and infer). */
template <class T>
void test_bn_forward(void) {
  typedef Act<T> A;
  const double eps = 1e-5, mom = 0.1;
  for (const Shape &sh : kBnShapes) {
    const size_t hw = (size_t)sh.h * sh.w, m = (size_t)sh.n * hw, total = m * sh.c;
    std::vector<double> center(sh.c), spread(sh.c);
    for (int ch = 0; ch < sh.c; ch++) {
      /* channel 0: mean far larger than the spread (1e5 times for float; bf16
       * steps by 4 near 1000, so there 30 times); others ordinary */
      center[ch] = ch == 0 ? 1000.0 : 0.5 * sym();
      spread[ch] = ch == 0 ? (sizeof(T) == 2 ? 30.0 : 0.01) : 0.2 + unif();
    }
    const std::vector<T> x = make_x<T>(sh, center, spread);

    std::vector<double> sums, sums_vec;
    SumsAcc<T> proto = {x.data(), 0, 0};
    replay_chan(proto, [](SumsAcc<T> &, int) {}, sh.n, sh.c, (uint32_t)hw, false, sums);
    if (hw % 4 == 0) {
      replay_chan(proto, [](SumsAcc<T> &, int) {}, sh.n, sh.c, (uint32_t)hw, true, sums_vec);
      CHECK(same_elems(sums, sums_vec),
            "%s [%d,%d,%d,%d]: the quad path summed differently", A::name, sh.n, sh.c, sh.h, sh.w);
    }

    /* apply, whole tensor: element by element (k_chan_elem's one) and by quads within planes (its quad) */
    std::vector<T> y1(total), y4(total), yi1(total), yi4(total);
    for (int ch = 0; ch < sh.c; ch++) {
      long double rs = 0, rs2 = 0, ra = 0, ra2 = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const long double v = A::val(x[((size_t)s * sh.c + ch) * hw + i]);
          rs += v, rs2 += v * v, ra += fabsl(v), ra2 += v * v;
        }
      /* sums: any order of m double additions is within m * 2^-53 * sum|terms| */
      const double tol1 = (double)m * kD * (double)ra + 1e-300, tol2 = (double)m * kD * (double)ra2 + 1e-300;
      CHECK(fabs(sums[ch] - (double)rs) <= tol1, "%s [%d,%d,%d,%d] ch %d: sum x %.17g, want %.17Lg", A::name, sh.n,
            sh.c, sh.h, sh.w, ch, sums[ch], rs);
      CHECK(fabs(sums[sh.c + ch] - (double)rs2) <= tol2, "%s [%d,%d,%d,%d] ch %d: sum x^2 %.17g, want %.17Lg",
            A::name, sh.n, sh.c, sh.h, sh.w, ch, sums[sh.c + ch], rs2);

      /* stats against the two-pass reference (the cpu backend's form) */
      const long double mean = rs / m;
      long double ss = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const long double dv = A::val(x[((size_t)s * sh.c + ch) * hw + i]) - mean;
          ss += dv * dv;
        }
      const long double var = ss / m, rstd = 1 / sqrtl(var + eps);
      const BnStats st = bn_stats_from_sums(sums[ch], sums[sh.c + ch], (double)m, eps);
      const float mean_f = (float)st.mean, rstd_f = (float)st.rstd;
      CHECK(fabsl(mean_f - mean) <= (kF + 1e-12) * fabsl(mean) + 1e-30, "ch %d: mean %.9g, want %.12Lg", ch,
            (double)mean_f, mean);
      /* var = E[x^2] - mean^2 cancels: allow 64 double roundings of E[x^2] */
      const double evar = 64 * kD * (sums[sh.c + ch] / (double)m);
      const double rstd_rel = kF + 0.5 * evar / (double)(var + eps);
      CHECK(fabsl(rstd_f - rstd) <= rstd_rel * rstd, "%s [%d,%d,%d,%d] ch %d: rstd %.9g, want %.12Lg (rel tol %.3g)",
            A::name, sh.n, sh.c, sh.h, sh.w, ch, (double)rstd_f, rstd, rstd_rel);
      CHECK(fabsl(st.var - var) <= evar + 1e-12 * var, "ch %d: var %.17g, want %.17Lg", ch, st.var, var);

      /* running statistics, PyTorch's rule with the unbiased variance */
      if (m >= 2) {
        float rm = 0.25f, rv = 1.5f;
        bn_running_update(st.mean, st.var, (double)m, mom, &rm, &rv);
        const long double want_rm = mom * mean + (1 - mom) * 0.25L;
        const long double want_rv = mom * var * m / (m - 1) + (1 - mom) * 1.5L;
        CHECK(fabsl(rm - want_rm) <= 2 * kF * fabsl(want_rm), "ch %d: running_mean %.9g, want %.12Lg", ch,
              (double)rm, want_rm);
        CHECK(fabsl(rv - want_rv) <= 2 * kF * fabsl(want_rv) + mom * evar * m / (m - 1),
              "ch %d: running_var %.9g, want %.12Lg", ch, (double)rv, want_rv);
      }

      /* apply with the rounded statistics: y = (x - mean) rstd gamma + beta */
      const float gamma = 0.5f + (float)unif(), beta = sym();
      const BnAffine af = bn_affine_train(gamma, beta, mean_f, rstd_f);
      const float rm_f = (float)mean, rv_f = (float)var;
      const BnAffine ai = bn_affine_infer(gamma, beta, rm_f, rv_f, eps);
      size_t bad = 0, bad_i = 0, bad_round = 0;
      for (int s = 0; s < sh.n; s++) {
        const size_t base = ((size_t)s * sh.c + ch) * hw;
        for (size_t i = 0; i < hw; i++) {
          const float xv = A::val(x[base + i]);
          const float yf = bn_affine_apply(widen(x[base + i]), af), yif = bn_affine_apply(widen(x[base + i]), ai);
          y1[base + i] = narrow<T>(yf), yi1[base + i] = narrow<T>(yif);
          bad_round += !A::stored(y1[base + i], yf) + !A::stored(yi1[base + i], yif);
          const long double want = ((long double)xv - mean_f) * rstd_f * gamma + beta;
          /* the output's rounding plus the double terms' rounding (x * scale and shift are large where mean is) */
          const double tol = A::kO * fabsl(want) + 4 * kD * (fabs(xv * af.scale) + fabs(af.shift)) + 1e-38;
          bad += !(fabsl(A::val(y1[base + i]) - want) <= tol);
          const long double want_i = ((long double)xv - rm_f) / sqrtl((long double)rv_f + eps) * gamma + beta;
          const double tol_i = A::kO * fabsl(want_i) + 4 * kD * (fabs(xv * ai.scale) + fabs(ai.shift)) + 1e-38;
          bad_i += !(fabsl(A::val(yi1[base + i]) - want_i) <= tol_i);
        }
        for (size_t i = 0; hw % 4 == 0 && i < hw; i += 4) {
          /* the device's quads: bn_fwd_elem on a Raw4 */
          Raw4<T> a, q, qi;
          a.load(x.data() + base + i);
          for (int l = 0; l < 4; l++)
            q.v[l] = bn_fwd_elem<T>(a.v[l], af, false, T(), false), qi.v[l] = bn_fwd_elem<T>(a.v[l], ai, false, T(), false);
          q.store(y4.data() + base + i);
          qi.store(yi4.data() + base + i);
        }
      }
      CHECK(bad == 0, "%s [%d,%d,%d,%d] ch %d: %zu training outputs off", A::name, sh.n, sh.c, sh.h, sh.w, ch, bad);
      CHECK(bad_i == 0, "%s [%d,%d,%d,%d] ch %d: %zu inference outputs off", A::name, sh.n, sh.c, sh.h, sh.w, ch,
            bad_i);
      CHECK(bad_round == 0, "%s [%d,%d,%d,%d] ch %d: %zu outputs not the rounding of the float result", A::name,
            sh.n, sh.c, sh.h, sh.w, ch, bad_round);
    }
    if (hw % 4 == 0)
      CHECK(same_elems(y1, y4) && same_elems(yi1, yi4), "%s [%d,%d,%d,%d]: the quad path applied differently",
            A::name, sh.n, sh.c, sh.h, sh.w);
  }
}

/* bn_stats on its own (no activations) */
void test_bn_stats_edges(void) {
  const double eps = 1e-5;
  /* A constant channel: var 0 exactly (clamped, never negative), rstd = 1 / sqrt(eps). */
  const BnStats z = bn_stats_from_sums(3 * 0.1f, 3 * (double)0.1f * (double)0.1f, 3, eps);
  CHECK(z.var >= 0 && fabs(z.rstd - 1 / sqrt(z.var + eps)) <= 4 * kD * z.rstd, "var %.17g rstd %.17g", z.var,
        z.rstd);
  const BnStats neg = bn_stats_from_sums(1.0, 0.9, 1.0, eps); /* s2 / count < mean^2: clamped */
  CHECK(neg.var == 0 && neg.rstd == 1 / sqrt(eps), "var %.17g", neg.var);
  const BnStats nan_in = bn_stats_from_sums(NAN, 1.0, 2.0, eps);
  CHECK(nan_in.var != nan_in.var && nan_in.rstd != nan_in.rstd, "a NaN input must stay NaN");
}

template <class T>
void test_bn_backward(void) {
  typedef Act<T> A;
  for (const Shape &sh : kBnShapes) {
    const size_t hw = (size_t)sh.h * sh.w, m = (size_t)sh.n * hw, total = m * sh.c;
    std::vector<double> center(sh.c), spread(sh.c, 1.0);
    for (int ch = 0; ch < sh.c; ch++) center[ch] = ch == 0 ? 200.0 : sym();
    const std::vector<T> x = make_x<T>(sh, center, spread);
    std::vector<T> dy(total);
    std::vector<float> mean(sh.c), rstd(sh.c), gamma(sh.c);
    for (T &g : dy) g = A::make(sym());
    for (int ch = 0; ch < sh.c; ch++)
      mean[ch] = (float)center[ch] + 0.01f * sym(), rstd[ch] = 1.7f + sym(), gamma[ch] = 0.5f + (float)unif();

    std::vector<double> sums, sums_vec;
    BwdSumsAcc<T> proto = {x.data(), dy.data(), nullptr, 0, 0, 0, 0};
    auto setup = [&](BwdSumsAcc<T> &a, int ch) { a.mean = mean[ch], a.rstd = rstd[ch]; };
    replay_chan(proto, setup, sh.n, sh.c, (uint32_t)hw, false, sums);
    if (hw % 4 == 0) {
      replay_chan(proto, setup, sh.n, sh.c, (uint32_t)hw, true, sums_vec);
      CHECK(same_elems(sums, sums_vec),
            "%s [%d,%d,%d,%d]: the quad path summed differently", A::name, sh.n, sh.c, sh.h, sh.w);
    }
    {
      /* A fused ReLU's mask (ym: about half positive, some zeros and NaNs): the
       * sums of dy masked in the accumulator equal those of a masked copy. */
      std::vector<T> ym(total), dym(total);
      for (size_t o = 0; o < total; o++) {
        const uint64_t r = rnd() % 10;
        ym[o] = A::make(r == 0 ? 0.0 : r == 1 ? NAN : sym());
        dym[o] = A::val(ym[o]) > 0 ? dy[o] : A::make(0.0);
      }
      std::vector<double> masked, copied;
      BwdSumsAcc<T> pm = {x.data(), dy.data(), ym.data(), 0, 0, 0, 0}, pc = {x.data(), dym.data(), nullptr, 0, 0, 0, 0};
      for (int vec = 0; vec < (hw % 4 == 0 ? 2 : 1); vec++) {
        replay_chan(pm, setup, sh.n, sh.c, (uint32_t)hw, vec != 0, masked);
        replay_chan(pc, setup, sh.n, sh.c, (uint32_t)hw, vec != 0, copied);
        CHECK(same_elems(masked, copied), "%s [%d,%d,%d,%d]: masked sums (%s) differ from a masked copy's", A::name,
              sh.n, sh.c, sh.h, sh.w, vec ? "quads" : "elements");
      }
    }
    std::vector<T> dx1(total), dx4(total);
    for (int ch = 0; ch < sh.c; ch++) {
      long double sdy = 0, sdyx = 0, ady = 0, adyx = 0;
      for (int s = 0; s < sh.n; s++)
        for (size_t i = 0; i < hw; i++) {
          const size_t o = ((size_t)s * sh.c + ch) * hw + i;
          const long double g = A::val(dy[o]), xh = ((long double)A::val(x[o]) - mean[ch]) * rstd[ch];
          sdy += g, sdyx += g * xh, ady += fabsl(g), adyx += fabsl(g * xh);
        }
      /* the per-term xhat is rounded in double too: one more rounding per term */
      CHECK(fabs(sums[ch] - (double)sdy) <= m * kD * (double)ady + 1e-300, "%s ch %d: sum dy %.17g, want %.17Lg",
            A::name, ch, sums[ch], sdy);
      CHECK(fabs(sums[sh.c + ch] - (double)sdyx) <= (m + 2) * kD * (double)adyx + 1e-300,
            "%s ch %d: sum dy xhat %.17g, want %.17Lg", A::name, ch, sums[sh.c + ch], sdyx);

      const BnBwd p = bn_bwd_channel(gamma[ch], mean[ch], rstd[ch], sums[ch], sums[sh.c + ch], (double)m);
      const long double k = (long double)gamma[ch] * rstd[ch], a = sdy / m, b = sdyx / m;
      size_t bad = 0, bad_round = 0;
      for (int s = 0; s < sh.n; s++) {
        const size_t base = ((size_t)s * sh.c + ch) * hw;
        for (size_t i = 0; i < hw; i++) {
          const size_t o = base + i;
          const float f = bn_bwd_apply(widen(x[o]), widen(dy[o]), p);
          dx1[o] = narrow<T>(f);
          bad_round += !A::stored(dx1[o], f);
          const long double g = A::val(dy[o]), xh = ((long double)A::val(x[o]) - mean[ch]) * rstd[ch];
          const long double want = k * (g - a - xh * b);
          const double tol =
              A::kO * fabsl(want) + 8 * kD * fabsl(k) * (fabsl(g) + fabsl(a) + fabsl(xh * b)) + 1e-38;
          bad += !(fabsl(A::val(dx1[o]) - want) <= tol);
        }
        for (size_t i = 0; hw % 4 == 0 && i < hw; i += 4) {
          Raw4<T> qx, qg, r, d;
          qx.load(x.data() + base + i);
          qg.load(dy.data() + base + i);
          for (int l = 0; l < 4; l++) r.v[l] = bn_bwd_elem<T>(qx.v[l], qg.v[l], false, T(), p, &d.v[l]);
          r.store(dx4.data() + base + i);
        }
      }
      CHECK(bad == 0, "%s [%d,%d,%d,%d] ch %d: %zu of dx off", A::name, sh.n, sh.c, sh.h, sh.w, ch, bad);
      CHECK(bad_round == 0, "%s [%d,%d,%d,%d] ch %d: %zu of dx not the rounding of the float result", A::name, sh.n,
            sh.c, sh.h, sh.w, ch, bad_round);
    }
    if (hw % 4 == 0)
      CHECK(same_elems(dx1, dx4), "%s [%d,%d,%d,%d]: the quad path gave other dx", A::name, sh.n, sh.c, sh.h, sh.w);
  }
}

/* ---- element-wise --------------------------------------------------------------------------------- */
void test_relu(void) {
  const float in[] = {-1.0f, -0.0f, 0.0f, 1.0f, NAN, INFINITY, -INFINITY, 1e-45f, -1e-45f, 3.5f};
  const float want[] = {0.0f, 0.0f, 0.0f, 1.0f, NAN, INFINITY, 0.0f, 1e-45f, 0.0f, 3.5f};
  for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
    const float y = relu(in[i]);
    CHECK(same_bits(y, want[i]) || (y != y && want[i] != want[i]), "relu(%g) = %g", (double)in[i], (double)y);
    const float dx = relu_bwd(y, 2.5f);
    CHECK(dx == (y > 0 ? 2.5f : 0.0f), "relu_bwd(%g) = %g", (double)y, (double)dx);
  }
  CHECK(relu_bwd(NAN, 1.0f) == 0.0f, "relu_bwd at a NaN output is 0 (y > 0 is false)");

  /* bf16, every pattern: y = x for x > 0 and for a NaN (made quiet), else +0;
   * dx = dy where y > 0, else +0 */
  size_t bad = 0, bad_b = 0;
  const uint16_t dys[] = {0x3f80, 0xc0a0, 0x8001, 0x7f80};
  for (uint32_t h = 0; h < 65536; h++) {
    const double v = ref_bf16_value((uint16_t)h);
    const uint16_t want_y = v != v ? (uint16_t)(h | 0x40) : v > 0 ? (uint16_t)h : 0;
    const bf16 y = narrow<bf16>(relu(widen(bf16{(uint16_t)h})));
    bad += y.bits != want_y;
    for (uint16_t g : dys)
      bad_b += narrow<bf16>(relu_bwd(widen(bf16{(uint16_t)h}), widen(bf16{g}))).bits != (v > 0 ? g : 0);
  }
  CHECK(bad == 0, "bf16 relu: %zu of 65536 patterns wrong", bad);
  CHECK(bad_b == 0, "bf16 relu_bwd: %zu cases wrong", bad_b);
}

} /* namespace */

int main(void) {
  test_bf16();
  test_f16();
  test_widen_d();
  test_bn_elems<float>();
  test_bn_elems<bf16>();
  test_bn_elems<f16>();
  test_fastdiv();
  test_chan_coverage();
  test_bn_stats_edges();
  test_bn_forward<float>();
  test_bn_forward<bf16>();
  test_bn_backward<float>();
  test_bn_backward<bf16>();
  test_relu();
  test_layers();
  test_nhwc();
  if (failures) {
    fprintf(stderr, "test_cudnn_kernels_host: %d of %d checks failed\n", failures, checks);
    return 1;
  }
  printf("test_cudnn_kernels_host: all %d checks passed\n", checks);
  return 0;
}
