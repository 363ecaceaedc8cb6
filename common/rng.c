#include "common/rng.h"

#include <math.h>

#include "common/sys.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
  uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  *lo = (uint32_t)p;
}

sr_philox_out sr_philox(uint64_t key, uint64_t c0, uint64_t c1) {
  uint32_t c[4] = {(uint32_t)c0, (uint32_t)(c0 >> 32), (uint32_t)c1, (uint32_t)(c1 >> 32)};
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int round = 0; round < 10; round++) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(PHILOX_M0, c[0], &hi0, &lo0);
    mulhilo(PHILOX_M1, c[2], &hi1, &lo1);
    uint32_t n0 = hi1 ^ c[1] ^ k0;
    uint32_t n1 = lo1;
    uint32_t n2 = hi0 ^ c[3] ^ k1;
    uint32_t n3 = lo0;
    c[0] = n0; c[1] = n1; c[2] = n2; c[3] = n3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  sr_philox_out o = {{c[0], c[1], c[2], c[3]}};
  return o;
}

#ifdef __SSE2__
#include <emmintrin.h>
#define PHILOX_LANES 4

/* m * x (x's four u32 lanes) as lo and hi u32 lanes. */
static inline void mulhilo4(__m128i x, __m128i m, __m128i *hi, __m128i *lo) {
  __m128i e = _mm_mul_epu32(x, m), o = _mm_mul_epu32(_mm_srli_epi64(x, 32), m);
  e = _mm_shuffle_epi32(e, _MM_SHUFFLE(3, 1, 2, 0)); /* lo0 lo2 hi0 hi2 */
  o = _mm_shuffle_epi32(o, _MM_SHUFFLE(3, 1, 2, 0)); /* lo1 lo3 hi1 hi3 */
  *lo = _mm_unpacklo_epi32(e, o);
  *hi = _mm_unpackhi_epi32(e, o);
}

/* Four counters (c0, c1 + i) side by side (SSE2, every x86-64), each
 * round's words one vector a word: sr_philox's bits. */
static void philox_lanes(uint64_t key, uint64_t c0, uint64_t c1, uint32_t *out) {
  uint32_t cl[4], ch[4];
  for (int i = 0; i < 4; i++) cl[i] = (uint32_t)(c1 + (uint64_t)i), ch[i] = (uint32_t)((c1 + (uint64_t)i) >> 32);
  __m128i a = _mm_set1_epi32((int)(uint32_t)c0), b = _mm_set1_epi32((int)(uint32_t)(c0 >> 32));
  __m128i c = _mm_loadu_si128((const __m128i *)(const void *)cl);
  __m128i d = _mm_loadu_si128((const __m128i *)(const void *)ch);
  const __m128i m0 = _mm_set1_epi32((int)PHILOX_M0), m1 = _mm_set1_epi32((int)PHILOX_M1);
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int round = 0; round < 10; round++) {
    __m128i hi0, lo0, hi1, lo1;
    mulhilo4(a, m0, &hi0, &lo0);
    mulhilo4(c, m1, &hi1, &lo1);
    a = _mm_xor_si128(_mm_xor_si128(hi1, b), _mm_set1_epi32((int)k0));
    b = lo1;
    c = _mm_xor_si128(_mm_xor_si128(hi0, d), _mm_set1_epi32((int)k1));
    d = lo0;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  /* Lanes to blocks: block i is (a[i], b[i], c[i], d[i]). */
  __m128i ab0 = _mm_unpacklo_epi32(a, b), ab1 = _mm_unpackhi_epi32(a, b);
  __m128i cd0 = _mm_unpacklo_epi32(c, d), cd1 = _mm_unpackhi_epi32(c, d);
  _mm_storeu_si128((__m128i *)(void *)out, _mm_unpacklo_epi64(ab0, cd0));
  _mm_storeu_si128((__m128i *)(void *)(out + 4), _mm_unpackhi_epi64(ab0, cd0));
  _mm_storeu_si128((__m128i *)(void *)(out + 8), _mm_unpacklo_epi64(ab1, cd1));
  _mm_storeu_si128((__m128i *)(void *)(out + 12), _mm_unpackhi_epi64(ab1, cd1));
}
#else
#define PHILOX_LANES 1
static void philox_lanes(uint64_t key, uint64_t c0, uint64_t c1, uint32_t *out) {
  sr_philox_out o = sr_philox(key, c0, c1);
  for (int k = 0; k < 4; k++) out[k] = o.v[k];
}
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PHILOX_AVX2 1
/* philox_lanes over eight counters (c0, c1 + i), AVX2: each 128-bit half
 * runs the SSE2 steps on four of them. */
__attribute__((target("avx2"))) static inline void mulhilo8(__m256i x, __m256i m, __m256i *hi,
                                                            __m256i *lo) {
  __m256i e = _mm256_mul_epu32(x, m), o = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
  e = _mm256_shuffle_epi32(e, _MM_SHUFFLE(3, 1, 2, 0));
  o = _mm256_shuffle_epi32(o, _MM_SHUFFLE(3, 1, 2, 0));
  *lo = _mm256_unpacklo_epi32(e, o);
  *hi = _mm256_unpackhi_epi32(e, o);
}

__attribute__((target("avx2"))) static void philox_lanes8(uint64_t key, uint64_t c0, uint64_t c1,
                                                          uint32_t *out) {
  uint32_t cl[8], ch[8];
  for (int i = 0; i < 8; i++) cl[i] = (uint32_t)(c1 + (uint64_t)i), ch[i] = (uint32_t)((c1 + (uint64_t)i) >> 32);
  __m256i a = _mm256_set1_epi32((int)(uint32_t)c0), b = _mm256_set1_epi32((int)(uint32_t)(c0 >> 32));
  __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)cl);
  __m256i d = _mm256_loadu_si256((const __m256i *)(const void *)ch);
  const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int round = 0; round < 10; round++) {
    __m256i hi0, lo0, hi1, lo1;
    mulhilo8(a, m0, &hi0, &lo0);
    mulhilo8(c, m1, &hi1, &lo1);
    a = _mm256_xor_si256(_mm256_xor_si256(hi1, b), _mm256_set1_epi32((int)k0));
    b = lo1;
    c = _mm256_xor_si256(_mm256_xor_si256(hi0, d), _mm256_set1_epi32((int)k1));
    d = lo0;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  /* Per half as philox_lanes: v0 holds blocks 0 and 4, v1 1 and 5, ... */
  __m256i ab0 = _mm256_unpacklo_epi32(a, b), ab1 = _mm256_unpackhi_epi32(a, b);
  __m256i cd0 = _mm256_unpacklo_epi32(c, d), cd1 = _mm256_unpackhi_epi32(c, d);
  __m256i v0 = _mm256_unpacklo_epi64(ab0, cd0), v1 = _mm256_unpackhi_epi64(ab0, cd0);
  __m256i v2 = _mm256_unpacklo_epi64(ab1, cd1), v3 = _mm256_unpackhi_epi64(ab1, cd1);
  _mm256_storeu_si256((__m256i *)(void *)out, _mm256_permute2x128_si256(v0, v1, 0x20));
  _mm256_storeu_si256((__m256i *)(void *)(out + 8), _mm256_permute2x128_si256(v2, v3, 0x20));
  _mm256_storeu_si256((__m256i *)(void *)(out + 16), _mm256_permute2x128_si256(v0, v1, 0x31));
  _mm256_storeu_si256((__m256i *)(void *)(out + 24), _mm256_permute2x128_si256(v2, v3, 0x31));
}
#endif

void sr_philox_n(uint64_t key, uint64_t c0, uint64_t c1, size_t n, uint32_t *out) {
  size_t i = 0;
#ifdef PHILOX_AVX2
  if (n >= 8 && sr_cpu_avx2())
    for (; i + 8 <= n; i += 8) philox_lanes8(key, c0, c1 + i, out + 4 * i);
#endif
  for (; i + PHILOX_LANES <= n; i += PHILOX_LANES) philox_lanes(key, c0, c1 + i, out + 4 * i);
  for (; i < n; i++) {
    sr_philox_out o = sr_philox(key, c0, c1 + i);
    for (int k = 0; k < 4; k++) out[4 * i + (size_t)k] = o.v[k];
  }
}

void sr_rng_init(sr_rng *r, uint64_t key, uint64_t stream) {
  r->key = key;
  r->stream = stream;
  r->ctr = 0;
  r->left = 0;
  r->has_spare = 0;
  r->spare = 0.0;
}

uint32_t sr_rng_u32(sr_rng *r) {
  if (r->left == 0) {
    sr_philox_out o = sr_philox(r->key, r->ctr++, r->stream);
    for (int i = 0; i < 4; i++) r->buf[i] = o.v[i];
    r->left = 4;
  }
  return r->buf[4 - r->left--];
}

uint64_t sr_rng_u64(sr_rng *r) {
  uint64_t hi = sr_rng_u32(r);
  return (hi << 32) | sr_rng_u32(r);
}

double sr_rng_uniform(sr_rng *r) {
  uint32_t hi = sr_rng_u32(r);
  uint32_t lo = sr_rng_u32(r);
  return sr_u01d(hi, lo);
}

double sr_rng_normal(sr_rng *r) {
  if (r->has_spare) {
    r->has_spare = 0;
    return r->spare;
  }
  double u1, u2;
  do {
    u1 = sr_rng_uniform(r);
  } while (u1 <= 0.0);
  u2 = sr_rng_uniform(r);
  double rad = sqrt(-2.0 * log(u1));
  double th = 6.283185307179586476925 * u2;
  r->spare = rad * sin(th);
  r->has_spare = 1;
  return rad * cos(th);
}

uint64_t sr_rng_below(sr_rng *r, uint64_t n) {
  /* Lemire's nearly divisionless method on 64 bits. */
  uint64_t x = sr_rng_u64(r);
  __uint128_t m = (__uint128_t)x * n;
  uint64_t l = (uint64_t)m;
  if (l < n) {
    uint64_t t = (0 - n) % n;
    while (l < t) {
      x = sr_rng_u64(r);
      m = (__uint128_t)x * n;
      l = (uint64_t)m;
    }
  }
  return (uint64_t)(m >> 64);
}
