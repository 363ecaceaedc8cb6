#include "common/half.h"

#include <math.h>
#include <stdatomic.h>

#include "common/sys.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define SR_HALF_X86 1
#endif

static inline uint32_t f_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float bits_f(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

uint16_t sr_f32_to_f16(float x) {
  const uint32_t u = f_bits(x);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN: quiet */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);           /* >= 65520: infinity */
  if (a >= 0x38800000u) {                                             /* a normal half: >= 2^-14 */
    uint32_t r = a - 0x38000000u;                                     /* exponent rebiased 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);                                   /* to nearest, ties to even */
    return (uint16_t)(sign | (r >> 13));
  }
  /* Below 2^-14: a subnormal half or zero. Adding 0.5f puts the half's
   * step (2^-24) at the float's last bit, so the float addition (round to
   * nearest even) is the rounding; the bits above 0.5f are the half's. */
  const float s = bits_f(a) + 0.5f;
  return (uint16_t)(sign | (f_bits(s) - 0x3f000000u));
}

float sr_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_f(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0)); /* inf, NaN (quiet) */
  if (e == 0) {
    float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
    return bits_f(sign | f_bits(v));
  }
  return bits_f(sign | ((e + 112u) << 23) | (m << 13));
}

#ifdef SR_HALF_X86
/* F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know
 * "f16c"); "avx" also says the OS saves the YMM registers. */
static int f16c_cpuid(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  return (c & bit_F16C) && __builtin_cpu_supports("avx");
}

int sr_half_f16c_available(void) {
  static atomic_int avail = -1; /* asked once, from any thread */
  int a = atomic_load_explicit(&avail, memory_order_relaxed);
  if (a < 0) atomic_store_explicit(&avail, a = f16c_cpuid(), memory_order_relaxed);
  return a;
}

__attribute__((target("avx,f16c"))) static size_t enc_f16c(const float *in, uint16_t *out,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128((__m128i *)(out + i), h);
  }
  return i;
}

__attribute__((target("avx,f16c"))) static size_t dec_f16c(const uint16_t *in, float *out,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
  return i;
}
#else
int sr_half_f16c_available(void) { return 0; }
static size_t enc_f16c(const float *in, uint16_t *out, size_t n) { return (void)in, (void)out, (void)n, 0; }
static size_t dec_f16c(const uint16_t *in, float *out, size_t n) { return (void)in, (void)out, (void)n, 0; }
#endif

/* The F16C kernel where asked for (or picked) and run by this CPU. */
static int use_f16c(sr_half_kernel k) { return k != SR_HALF_C && sr_half_f16c_available(); }

void sr_f16_encode(const float *in, uint16_t *out, size_t n, sr_half_kernel k) {
  size_t i = use_f16c(k) ? enc_f16c(in, out, n) : 0;
  for (; i < n; i++) out[i] = sr_f32_to_f16(in[i]);
}

void sr_f16_decode(const uint16_t *in, float *out, size_t n, sr_half_kernel k) {
  size_t i = use_f16c(k) ? dec_f16c(in, out, n) : 0;
  for (; i < n; i++) out[i] = sr_f16_to_f32(in[i]);
}

#ifdef __SSE2__
/* 4 floats' bits u to bf16 as sr_f32_to_bf16 does, in the low halves of
 * the 32-bit lanes (high halves zero). */
static inline __m128i bf16_round4(__m128i u) {
  const __m128i abs = _mm_and_si128(u, _mm_set1_epi32(0x7fffffff));
  const __m128i nan = _mm_cmpgt_epi32(abs, _mm_set1_epi32(0x7f800000)); /* both non-negative */
  const __m128i odd = _mm_and_si128(_mm_srli_epi32(u, 16), _mm_set1_epi32(1));
  const __m128i r = _mm_srli_epi32(_mm_add_epi32(u, _mm_add_epi32(_mm_set1_epi32(0x7fff), odd)), 16);
  const __m128i q = _mm_or_si128(_mm_srli_epi32(u, 16), _mm_set1_epi32(0x40));
  return _mm_or_si128(_mm_and_si128(nan, q), _mm_andnot_si128(nan, r));
}

/* 8 at a time (SSE2, every x86-64): the C kernel's bits. */
static size_t enc_bf16_sse2(const float *in, uint16_t *out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i a = bf16_round4(_mm_loadu_si128((const __m128i *)(const void *)(in + i)));
    __m128i b = bf16_round4(_mm_loadu_si128((const __m128i *)(const void *)(in + i + 4)));
    /* Sign-extend the low halves so that the signed pack keeps their bits. */
    a = _mm_srai_epi32(_mm_slli_epi32(a, 16), 16);
    b = _mm_srai_epi32(_mm_slli_epi32(b, 16), 16);
    _mm_storeu_si128((__m128i *)(void *)(out + i), _mm_packs_epi32(a, b));
  }
  return i;
}

static size_t dec_bf16_sse2(const uint16_t *in, float *out, size_t n) {
  size_t i = 0;
  const __m128i z = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
    _mm_storeu_si128((__m128i *)(void *)(out + i), _mm_unpacklo_epi16(z, h));
    _mm_storeu_si128((__m128i *)(void *)(out + i + 4), _mm_unpackhi_epi16(z, h));
  }
  return i;
}
#else
static size_t enc_bf16_sse2(const float *in, uint16_t *out, size_t n) { return (void)in, (void)out, (void)n, 0; }
static size_t dec_bf16_sse2(const uint16_t *in, float *out, size_t n) { return (void)in, (void)out, (void)n, 0; }
#endif

void sr_bf16_encode(const float *in, uint16_t *out, size_t n) {
  for (size_t i = enc_bf16_sse2(in, out, n); i < n; i++) out[i] = sr_f32_to_bf16(in[i]);
}

void sr_bf16_decode(const uint16_t *in, float *out, size_t n) {
  for (size_t i = dec_bf16_sse2(in, out, n); i < n; i++) out[i] = sr_bf16_to_f32(in[i]);
}

/* lo (toward zero, bits t) of |x|'s neighbours and its step ulp: the
 * shared tail of the two stochastic roundings. */
static uint16_t round_up_or_not(float ax, float lo, float ulp, uint16_t t, uint32_t bits) {
  if (lo == ax) return t;
  const float p = (ax - lo) / ulp; /* exact: ax - lo is (Sterbenz), ulp is a power of two */
  const float u = (float)(bits >> 8) * (1.0f / 16777216.0f);
  return (uint16_t)(u < p ? t + 1 : t);
}

uint16_t sr_f16_round_stochastic(float x, uint32_t bits) {
  const uint32_t u = f_bits(x), a = u & 0x7fffffffu;
  if (a >= 0x38800000u && a < 0x47800000u) {
    /* A normal half's range (or up to 65536, whose step up is infinity):
     * |x| - lo over the step is the 13 bits dropped over 2^13, so u < p is
     * bits >> 19 < those bits. The same answer as below, sooner. */
    const uint32_t low = a & 0x1fffu, t = (a - 0x38000000u) >> 13;
    return (uint16_t)(((u >> 16) & 0x8000u) | (t + ((bits >> 19) < low)));
  }
  const float ax = fabsf(x);
  if (!(ax <= 65504.0f * 2)) return sr_f32_to_f16(x); /* inf, NaN, or far past the range */
  const uint16_t sign = (uint16_t)((f_bits(x) >> 16) & 0x8000u);
  uint16_t t = sr_f32_to_f16(ax);
  float lo = sr_f16_to_f32(t);
  if (lo > ax) lo = sr_f16_to_f32(--t); /* toward zero (infinity steps back to 65504) */
  const int e = t >> 10;
  const float ulp = ldexpf(1.0f, e ? e - 25 : -24);
  return (uint16_t)(sign | round_up_or_not(ax, lo, ulp, t, bits));
}

uint16_t sr_bf16_round_stochastic(float x, uint32_t bits) {
  const uint32_t u = f_bits(x), a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sr_f32_to_bf16(x); /* inf, NaN */
  /* Toward zero is the top half; |x| - lo over the step (2^(e-134), or
   * 2^-133 for e = 0) is the low 16 bits over 2^16, so u < p is
   * bits >> 16 < those bits (a carry into the exponent is the next value,
   * past the largest finite one infinity). */
  const uint32_t t = a >> 16, low = a & 0xffffu;
  return (uint16_t)(((u >> 16) & 0x8000u) | (t + ((bits >> 16) < low)));
}

#ifdef SR_HALF_X86
/* 32-bit lanes (each at most 0xffff) to 16 bits, in order. */
__attribute__((target("avx2"))) static inline __m128i pack16(__m256i v) {
  const __m256i p = _mm256_packus_epi32(v, v); /* per 128-bit half: lanes 0-3, 0-3, 4-7, 4-7 */
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

/* Eight at a time while all eight are normal halves' range (the scalar's
 * first branch, the same arithmetic); a group with any other falls back. */
__attribute__((target("avx2"))) static size_t sr_f16_n_avx2(const float *x, const uint32_t *bits,
                                                           uint16_t *out, size_t n) {
  size_t i = 0;
  const __m256i absm = _mm256_set1_epi32(0x7fffffff), lo = _mm256_set1_epi32(0x38800000 - 1),
                hi = _mm256_set1_epi32(0x47800000 - 1), low13 = _mm256_set1_epi32(0x1fff),
                bias = _mm256_set1_epi32(0x38000000), sgn = _mm256_set1_epi32(0x8000);
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
    const __m256i a = _mm256_and_si256(u, absm);
    /* a >= 0x38800000 && a < 0x47800000 (both non-negative as signed) */
    const __m256i in = _mm256_andnot_si256(_mm256_cmpgt_epi32(a, hi), _mm256_cmpgt_epi32(a, lo));
    if (_mm256_movemask_epi8(in) != -1) {
      for (size_t k = i; k < i + 8; k++) out[k] = sr_f16_round_stochastic(x[k], bits[k]);
      continue;
    }
    const __m256i low = _mm256_and_si256(a, low13);
    const __m256i t = _mm256_srli_epi32(_mm256_sub_epi32(a, bias), 13);
    const __m256i r = _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(bits + i)), 19);
    const __m256i up = _mm256_cmpgt_epi32(low, r); /* r < low: -1 */
    const __m256i h = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), sgn),
                                      _mm256_sub_epi32(t, up));
    _mm_storeu_si128((__m128i *)(void *)(out + i), pack16(h));
  }
  return i;
}

/* Eight at a time while none is infinite or NaN (the scalar's arithmetic). */
__attribute__((target("avx2"))) static size_t sr_bf16_n_avx2(const float *x, const uint32_t *bits,
                                                            uint16_t *out, size_t n) {
  size_t i = 0;
  const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000 - 1),
                low16 = _mm256_set1_epi32(0xffff), sgn = _mm256_set1_epi32(0x8000);
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
    const __m256i a = _mm256_and_si256(u, absm);
    if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(a, inf))) {
      for (size_t k = i; k < i + 8; k++) out[k] = sr_bf16_round_stochastic(x[k], bits[k]);
      continue;
    }
    const __m256i t = _mm256_srli_epi32(a, 16), low = _mm256_and_si256(a, low16);
    const __m256i r = _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(bits + i)), 16);
    const __m256i up = _mm256_cmpgt_epi32(low, r);
    const __m256i h = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), sgn),
                                      _mm256_sub_epi32(t, up));
    _mm_storeu_si128((__m128i *)(void *)(out + i), pack16(h));
  }
  return i;
}
#else
static size_t sr_f16_n_avx2(const float *x, const uint32_t *bits, uint16_t *out, size_t n) {
  return (void)x, (void)bits, (void)out, (void)n, 0;
}
static size_t sr_bf16_n_avx2(const float *x, const uint32_t *bits, uint16_t *out, size_t n) {
  return (void)x, (void)bits, (void)out, (void)n, 0;
}
#endif

void sr_f16_round_stochastic_n(const float *x, const uint32_t *bits, uint16_t *out, size_t n) {
  size_t i = sr_cpu_avx2() ? sr_f16_n_avx2(x, bits, out, n) : 0;
  for (; i < n; i++) out[i] = sr_f16_round_stochastic(x[i], bits[i]);
}

void sr_bf16_round_stochastic_n(const float *x, const uint32_t *bits, uint16_t *out, size_t n) {
  size_t i = sr_cpu_avx2() ? sr_bf16_n_avx2(x, bits, out, n) : 0;
  for (; i < n; i++) out[i] = sr_bf16_round_stochastic(x[i], bits[i]);
}
