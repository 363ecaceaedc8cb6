#include "embedding/bag16.h"

#include "common/sys.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BAG16_X86 1
#endif

/* o[j] += r[j] widened, j < dim (plain C). */
static void add_c(float *o, const uint16_t *r, int dim, int bf16) {
  if (bf16)
    for (int j = 0; j < dim; j++) o[j] += sr_bf16_to_f32(r[j]);
  else
    for (int j = 0; j < dim; j++) o[j] += sr_f16_to_f32(r[j]);
}

#ifdef BAG16_X86
/* The same adds, 8 at a time; the tail in C. */
__attribute__((target("avx2,f16c"))) static void add_avx2(float *o, const uint16_t *r, int dim,
                                                          int bf16) {
  int j = 0;
  for (; j + 8 <= dim; j += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(r + j));
    __m256 v = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                    : _mm256_cvtph_ps(h);
    _mm256_storeu_ps(o + j, _mm256_add_ps(_mm256_loadu_ps(o + j), v));
  }
  add_c(o + j, r + j, dim - j, bf16);
}
#endif

void emb_bag_forward16(emb_pooling pool, emb_precision prec, sr_half_kernel k, int dim, int n,
                       const uint32_t *offsets, const uint32_t *inverse, const uint16_t *rows,
                       float *out, size_t out_stride) {
  const int bf16 = prec == EMB_PREC_BF16;
  void (*add)(float *, const uint16_t *, int, int) = add_c;
#ifdef BAG16_X86
  if (k != SR_HALF_C && sr_cpu_avx2() && sr_half_f16c_available()) add = add_avx2;
#else
  (void)k;
#endif
  const uint32_t base = offsets[0];
  for (int i = 0; i < n; i++) {
    float *o = out + (size_t)i * out_stride;
    for (int j = 0; j < dim; j++) o[j] = 0.0f;
    uint32_t b = offsets[i] - base, e = offsets[i + 1] - base;
    for (uint32_t q = b; q < e; q++) add(o, rows + (size_t)inverse[q] * (size_t)dim, dim, bf16);
    if (pool == EMB_POOL_MEAN && e > b) {
      const float len = (float)(e - b);
      for (int j = 0; j < dim; j++) o[j] /= len;
    }
  }
}
