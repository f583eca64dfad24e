/* test_cuda_kernels_host.cu - the device layer's kernel bodies (cuda/kernels.cu)
 * run on the host, against the host kernels (comm/reduce_impl.c's generic table,
 * reduce_cvt.h's conversions) bit for bit.  No GPU, no launch: kernels.cu is
 * included here, and what a kernel's threads would do is replayed serially for
 * every thread of an imagined grid (reduce_body with each tid of
 * several strides), so the split into head, 16-byte chunks and tail, the
 * two-chunks-per-trip loop and the bytewise fallback are covered as well as the
 * arithmetic: a missed or doubled element shows, and so does a write outside
 * the output (guard bytes around every buffer).
 *
 * The reduction: every dtype x op, with and without the AVG division, one and
 * two outputs, in place (dst0 = a, dst0 = b), pointers sharing their 16-byte
 * phase (vector path, with and without a head), not sharing it (element path)
 * and off their element size (bytewise path), lengths around the vector width;
 * inputs are random bits, so NaNs (with payloads, both signs), infinities and
 * subnormals are all in there: kernels.cu claims the host's bits for them too
 * (which of two NaN operands comes out is the host compiler's choice, so there
 * any NaN passes).
 * The copy (the same body with OpCopy): one and two outputs, every phase.  The float32 <-> 16-bit
 * conversions (h2f, f2h, bf2f, f2bf): every 16-bit pattern, and float bits
 * around every rounding boundary.
 * Exit 0 when everything holds, 1 (with the first failures) otherwise. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "../cuda/kernels.cu"

namespace {

int failures, checks;

void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void check(bool ok, const char *fmt, ...) {
  checks++;
  if (ok) return;
  if (++failures <= 20) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
  }
}

uint64_t rng_state = 0x9e3779b97f4a7c15ull;
uint64_t rnd() {
  uint64_t x = rng_state;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return rng_state = x;
}
void fill_random(unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(rnd() >> 56);
}

const int kDtypes[] = {GW_INT8, GW_UINT8, GW_INT32, GW_INT64, GW_FLOAT16, GW_BFLOAT16, GW_FLOAT32, GW_FLOAT64};
const char *const kDtypeNames[] = {"int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"};
const size_t kSizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
const size_t kLengths[] = {0, 1, 3, 7, 8, 15, 16, 17, 33, 100, 257, 1000};
const size_t kStrides[] = {1, 5, 64};
constexpr size_t kGuard = 32, kMaxBytes = 1000 * 8 + 64;
constexpr unsigned char kCanary = 0xa5;

/* A buffer with guard bytes on both sides; data at base + kGuard + off. */
struct Buf {
  alignas(64) unsigned char mem[kGuard + kMaxBytes + 16 + kGuard];
  unsigned char *at(size_t off) { return mem + kGuard + off; }
  void guard() { memset(mem, kCanary, sizeof mem); }
  /* Bytes outside [off, off + bytes) that changed. */
  size_t stray(size_t off, size_t bytes) const {
    size_t bad = 0;
    for (size_t i = 0; i < sizeof mem; i++)
      if ((i < kGuard + off || i >= kGuard + off + bytes) && mem[i] != kCanary) bad++;
    return bad;
  }
};

/* Pointer placements: every offset a byte count from a 64-byte boundary. */
struct Place {
  const char *name;
  size_t a, b, d0, d1; /* multiples of the element size unless stated */
  bool bytes_off;      /* add 1 byte to every offset (elements of 2+ bytes: the bytewise path) */
};
const Place kPlaces[] = {
    {"aligned", 0, 0, 0, 0, false},
    {"same phase with a head", 4, 4, 4, 4, false},
    {"different phases", 0, 8, 4, 12, false},
    {"off the element size", 0, 0, 0, 0, true},
};

Buf A, B, D0, D1, RA, RB, R0, R1;

/* Element i of a float dtype is a NaN. */
bool is_nan(int dt, const unsigned char *p, size_t i) {
  uint64_t u = 0;
  switch (dt) {
  case GW_FLOAT16: memcpy(&u, p + 2 * i, 2); return (u & 0x7c00) == 0x7c00 && (u & 0x3ff);
  case GW_BFLOAT16: memcpy(&u, p + 2 * i, 2); return (u & 0x7f80) == 0x7f80 && (u & 0x7f);
  case GW_FLOAT32: memcpy(&u, p + 4 * i, 4); return (u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu);
  case GW_FLOAT64:
    memcpy(&u, p + 8 * i, 8);
    return (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (u & 0xfffffffffffffull);
  default: return false;
  }
}

/* Element i of the kernel's output against the host's: the same bits, except
 * where both operands were NaNs: which one x86 passes on is the host
 * compiler's choice, which differs between builds of the host kernels (gcc -O3
 * against a sanitizer's -O2 build; see kernels.cu's head comment), so there a
 * NaN is all that is asked. */
bool same_elem(int dt, size_t es, const unsigned char *got, const unsigned char *want, size_t i) {
  if (!memcmp(got + i * es, want + i * es, es)) return true;
  return is_nan(dt, RA.mem, i) && is_nan(dt, RB.mem, i) && is_nan(dt, got, i) && is_nan(dt, want, i);
}

/* What the launcher does, without the launch: plan, then every thread's part. */
template <class Op>
void replay_reduce(const Op &op, void *d0, void *d1, const void *a, const void *b, size_t n, size_t stride) {
  const Plan p = plan_reduce(d0, d1, a, b, n, sizeof(typename Op::S));
  for (size_t tid = 0; tid < stride; tid++) {
    if (p.bytes)
      reduce_body<Op, true>(op, (unsigned char *)d0, (unsigned char *)d1, (const unsigned char *)a,
                            (const unsigned char *)b, p.head, p.nvec, p.nscalar, tid, stride);
    else
      reduce_body<Op, false>(op, (unsigned char *)d0, (unsigned char *)d1, (const unsigned char *)a,
                             (const unsigned char *)b, p.head, p.nvec, p.nscalar, tid, stride);
  }
}

void test_reduce() {
  static const uint32_t divs[] = {0, 3};
  for (int di = 0; di < 8; di++) {
    const int dt = kDtypes[di];
    const size_t es = kSizes[di];
    for (int kop = 0; kop < GW_NUM_KOPS; kop++)
      for (uint32_t div : divs)
        for (const Place &pl : kPlaces) {
          if (pl.bytes_off && es == 1) continue;
          const size_t bo = pl.bytes_off ? 1 : 0;
          const size_t oa = pl.a + bo, ob = pl.b + bo, o0 = pl.d0 + bo, o1 = pl.d1 + bo;
          for (size_t n : kLengths)
            for (int outs = 1; outs <= 2; outs++)
              for (int alias = 0; alias < 3; alias++) { /* 1: dst0 is a, 2: dst0 is b */
                const size_t stride = kStrides[(n + (size_t)alias + (size_t)outs) % 3];
                const size_t bytes = n * es;
                A.guard(), B.guard(), D0.guard(), D1.guard();
                fill_random(A.at(oa), bytes);
                fill_random(B.at(ob), bytes);
                /* Zeros of both signs facing each other (MAX/MIN order them,
                 * +0 above -0; random bits never pair them). */
                const bool flt = dt == GW_FLOAT16 || dt == GW_BFLOAT16 || dt == GW_FLOAT32 || dt == GW_FLOAT64;
                for (size_t i = 0; flt && i + 1 < n; i += 4)
                  for (size_t k = 0; k < 2; k++) {
                    memset(A.at(oa) + (i + k) * es, 0, es), memset(B.at(ob) + (i + k) * es, 0, es);
                    (k ? B.at(ob) : A.at(oa))[(i + k) * es + es - 1] = 0x80;
                  }
                /* The reference on its own aligned copies. */
                memcpy(RA.mem, A.at(oa), bytes);
                memcpy(RB.mem, B.at(ob), bytes);
                gw__reduce_table_generic[dt][kop](R0.mem, outs == 2 ? R1.mem : nullptr, RA.mem, RB.mem, n, div);
                unsigned char *d0 = alias == 1 ? A.at(oa) : alias == 2 ? B.at(ob) : D0.at(o0);
                unsigned char *d1 = outs == 2 ? D1.at(o1) : nullptr;
                const int r = by_dtype(dt, kop, div, [&](auto op) {
                  replay_reduce(op, d0, d1, alias == 1 ? (const void *)d0 : A.at(oa),
                                alias == 2 ? (const void *)d0 : B.at(ob), n, stride);
                  return 0;
                });
                check(r == 0, "%s op %d: by_dtype refused", kDtypeNames[di], kop);
                const size_t o_d0 = alias == 1 ? oa : alias == 2 ? ob : o0;
                const Buf &bd0 = alias == 1 ? A : alias == 2 ? B : D0;
                size_t first = SIZE_MAX;
                for (size_t i = 0; i < n && first == SIZE_MAX; i++)
                  if (!same_elem(dt, es, d0, R0.mem, i) || (d1 && !same_elem(dt, es, d1, R1.mem, i))) first = i;
                uint64_t va = 0, vb = 0, got = 0, want = 0; /* the first differing element's bits */
                if (first != SIZE_MAX) {
                  memcpy(&va, RA.mem + first * es, es), memcpy(&vb, RB.mem + first * es, es);
                  memcpy(&got, d0 + first * es, es), memcpy(&want, R0.mem + first * es, es);
                }
                check(first == SIZE_MAX,
                      "%s op %d div %u, %s, n %zu, %d output(s), alias %d, stride %zu: element %zu differs "
                      "from the host kernel (a %#llx, b %#llx: %#llx, host %#llx)",
                      kDtypeNames[di], kop, div, pl.name, n, outs, alias, stride, first, (unsigned long long)va,
                      (unsigned long long)vb, (unsigned long long)got, (unsigned long long)want);
                const size_t stray0 = bd0.stray(o_d0, bytes), stray1 = d1 ? D1.stray(o1, bytes) : 0;
                check(stray0 == 0 && stray1 == 0, "%s op %d, %s, n %zu: %zu + %zu bytes written outside the output",
                      kDtypeNames[di], kop, pl.name, n, stray0, stray1);
                if (alias != 1) check(A.stray(oa, bytes) == 0, "%s: a's guards changed", kDtypeNames[di]);
                if (alias != 2) check(B.stray(ob, bytes) == 0, "%s: b's guards changed", kDtypeNames[di]);
              }
        }
  }
}

/* The copy (gw__cuda_copy: the reduction's plan and body with the word
 * by_copy_width picks, b = a): one and two outputs, every phase, lengths
 * around 16 bytes; words of 8, 4 and 2 bytes where the phases differ. */
void test_copy() {
  static const size_t lengths[] = {0, 1, 15, 16, 17, 31, 33, 100, 1000, 4097};
  static const size_t offs[][3] = {{0, 0, 0}, {5, 5, 5}, {0, 3, 9},  {1, 1, 2},
                                   {7, 7, 7}, {0, 4, 12}, {2, 6, 10}, {8, 0, 24}};
  /* the word: the widest that divides every pointer and the length */
  check(copy_width(A.at(0), D1.at(24), D0.at(8), 1000) == 8 && copy_width(A.at(0), nullptr, D0.at(4), 1000) == 4 &&
            copy_width(A.at(2), nullptr, D0.at(6), 1000) == 2 && copy_width(A.at(0), nullptr, D0.at(8), 1001) == 1,
        "copy_width picks the wrong word");
  for (const auto &o : offs)
    for (size_t n : lengths)
      for (int outs = 1; outs <= 2; outs++)
        for (size_t stride : kStrides) {
          A.guard(), D0.guard(), D1.guard();
          fill_random(A.at(o[0]), n);
          unsigned char *d1 = outs == 2 ? D1.at(o[2]) : nullptr;
          by_copy_width(D0.at(o[1]), d1, A.at(o[0]), n, [&](auto op, size_t words) {
            replay_reduce(op, D0.at(o[1]), d1, A.at(o[0]), A.at(o[0]), words, stride);
            return 0;
          });
          const bool same = !memcmp(D0.at(o[1]), A.at(o[0]), n) && (!d1 || !memcmp(d1, A.at(o[0]), n));
          check(same, "copy of %zu bytes (offsets %zu, %zu, %zu), %d output(s), stride %zu: wrong bytes", n, o[0],
                o[1], o[2], outs, stride);
          const size_t stray = D0.stray(o[1], n) + (d1 ? D1.stray(o[2], n) : 0) + A.stray(o[0], n);
          check(stray == 0, "copy of %zu bytes (offsets %zu, %zu, %zu): %zu bytes outside the outputs changed", n,
                o[0], o[1], o[2], stray);
        }
}

/* float32 <-> float16 / bfloat16: kernels.cu's conversions against reduce_cvt.h's. */
uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

void test_conversions() {
  size_t bad_h = 0, bad_bf = 0, bad_to_h = 0, bad_to_bf = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    bad_h += bits(h2f((uint16_t)h)) != bits(gw__half_to_float((uint16_t)h));
    bad_bf += bits(bf2f((uint16_t)h)) != bits(gw__bf16_to_float((uint16_t)h));
  }
  /* Floats around every 16-bit value's rounding boundaries (the 13 / 16 bits
   * dropped at 0, 1, half, half +- 1, all ones), both signs, and random ones. */
  static const uint32_t low13[] = {0, 1, 0xfff, 0x1000, 0x1001, 0x1fff};
  static const uint32_t low16[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (uint32_t hi = 0; hi < 65536; hi++) {
    for (uint32_t lo : low16) {
      const float f = from_bits(hi << 16 | lo);
      bad_to_bf += f2bf(f) != gw__float_to_bf16(f);
    }
    for (int k = 0; k < 2; k++) {
      const float f = from_bits((hi << 16 & 0x80000000u) | ((rnd() >> 33) & 0x7fffe000u) | low13[(hi + k) % 6]);
      bad_to_h += f2h(f) != gw__float_to_half(f);
    }
  }
  for (uint32_t e = 0; e < 256; e++) /* every exponent, fp16's subnormal and overflow ranges included */
    for (uint32_t lo : low13)
      for (uint32_t m = 0; m < 1024; m += 7) {
        const float f = from_bits(e << 23 | m << 13 | lo);
        bad_to_h += f2h(f) != gw__float_to_half(f);
        bad_to_h += f2h(-f) != gw__float_to_half(-f);
      }
  check(bad_h == 0, "%zu float16 values widen differently", bad_h);
  check(bad_bf == 0, "%zu bfloat16 values widen differently", bad_bf);
  check(bad_to_h == 0, "%zu floats round to float16 differently", bad_to_h);
  check(bad_to_bf == 0, "%zu floats round to bfloat16 differently", bad_to_bf);
}

} /* namespace */

int main(void) {
  test_reduce();
  test_copy();
  test_conversions();
  if (failures) {
    fprintf(stderr, "test_cuda_kernels_host: %d of %d checks failed\n", failures, checks);
    return 1;
  }
  printf("test_cuda_kernels_host: all %d checks passed\n", checks);
  return 0;
}
