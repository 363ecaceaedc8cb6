/* 16-bit floats: IEEE binary16 ("fp16") and bfloat16 ("bf16").
 *
 * A 16-bit value is held as its bit pattern in a uint16_t. Conversions to
 * 16 bits round to nearest, ties to even (IEEE 754's default), with the
 * x86 F16C instructions' answers for every input: a value past the largest
 * finite one becomes infinity, a NaN stays a NaN with its sign, its quiet
 * bit set and the top bits of its payload. Conversions from 16 bits are
 * exact (every fp16 and bf16 value is a float).
 *
 * Two kernels do the bulk conversions of fp16: plain C (every CPU) and F16C
 * (vcvtps2ph / vcvtph2ps, where the CPU has them); both give the same bits
 * for every input (tests/common/test_half.c checks all 65536 halves and a
 * sweep of floats). SR_HALF_AUTO picks F16C where the CPU runs it. bf16 is
 * bit operations on the float's top half: its bulk conversions run 8
 * values at a time with SSE2 where the compiler targets it (every x86-64),
 * the one-value functions' bits for every input. */
#ifndef SHARDREC_COMMON_HALF_H
#define SHARDREC_COMMON_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum sr_half_kernel {
  SR_HALF_AUTO = 0, /* F16C where the CPU runs it, else C */
  SR_HALF_C = 1,    /* plain C */
  SR_HALF_F16C = 2, /* F16C; only where sr_half_f16c_available() */
} sr_half_kernel;

/* 1 when this CPU runs the F16C kernel (x86-64 with F16C and AVX), else 0
 * (asked of the CPU once; any thread may call it). */
int sr_half_f16c_available(void);

/* One value, plain C. */
uint16_t sr_f32_to_f16(float x);
float sr_f16_to_f32(uint16_t h);

static inline uint16_t sr_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float sr_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* Bulk: out[i] = conversion of in[i], i < n. The kernel as above (SR_HALF_F16C
 * where the CPU lacks it runs the C kernel). in and out do not overlap. */
void sr_f16_encode(const float *in, uint16_t *out, size_t n, sr_half_kernel k);
void sr_f16_decode(const uint16_t *in, float *out, size_t n, sr_half_kernel k);
void sr_bf16_encode(const float *in, uint16_t *out, size_t n);
void sr_bf16_decode(const uint16_t *in, float *out, size_t n);

/* Stochastic rounding of x to fp16 / bf16 with 32 random bits: of the two
 * neighbours lo <= |x| < hi of the format (hi past the largest finite value
 * is infinity), |x| goes up to hi with probability (|x| - lo) / (hi - lo),
 * to 24 bits: when u = (bits >> 8) / 2^24 < (|x| - lo) / (hi - lo). The sign
 * is kept; a value of the format stays as it is; infinities and NaNs are
 * converted as sr_f32_to_f16 / sr_f32_to_bf16 do. Every step is exact float
 * arithmetic, so every CPU gives the same bits. */
uint16_t sr_f16_round_stochastic(float x, uint32_t bits);
uint16_t sr_bf16_round_stochastic(float x, uint32_t bits);

/* Bulk: out[i] = sr_*_round_stochastic(x[i], bits[i]), i < n, the same
 * bits; AVX2 eight at a time where the CPU has it (eight values in the
 * common range, else those eight one by one). */
void sr_f16_round_stochastic_n(const float *x, const uint32_t *bits, uint16_t *out, size_t n);
void sr_bf16_round_stochastic_n(const float *x, const uint32_t *bits, uint16_t *out, size_t n);

#endif
