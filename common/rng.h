/* Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
 *
 * A counter-based generator maps (key, counter) to random bits with no state,
 * so any value can be computed anywhere in any order: an embedding row's
 * initial value is a function of (seed, table_id, row_id) alone, and a shard
 * that has never seen a row computes the same bits as any other shard would.
 * Deterministic across machines: integer arithmetic only, and the float
 * conversions below use exact operations. */
#ifndef SHARDREC_COMMON_RNG_H
#define SHARDREC_COMMON_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t v[4];
} sr_philox_out;

/* Philox4x32-10 of counter (c0, c1) under key (k). Pure function. */
sr_philox_out sr_philox(uint64_t key, uint64_t c0, uint64_t c1);

/* sr_philox(key, c0, c1 + i) for i < n, into out[4 i .. 4 i + 3]: the same
 * bits, 8 counters at a time with AVX2 where the CPU has it, then 4 at a
 * time with SSE2 (every x86-64), one at a time elsewhere. */
void sr_philox_n(uint64_t key, uint64_t c0, uint64_t c1, size_t n, uint32_t *out);

/* Uniform float in [0, 1) from 24 random bits (exact). */
static inline float sr_u01f(uint32_t bits) {
  return (float)(bits >> 8) * (1.0f / 16777216.0f);
}

/* Uniform double in [0, 1) from 53 random bits (exact). */
static inline double sr_u01d(uint32_t hi, uint32_t lo) {
  uint64_t x = ((uint64_t)hi << 21) ^ (uint64_t)(lo >> 11);
  return (double)(x & ((1ULL << 53) - 1)) * (1.0 / 9007199254740992.0);
}

/* Mix a 64-bit value (splitmix64 finaliser). Used to derive keys from seeds
 * and hashed ids; a bijection on uint64. */
static inline uint64_t sr_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* A small sequential stream over Philox, for code that wants "the next"
 * number (weight init, data generation). Same (key, stream) -> same sequence.
 * State is plain data: copy it to checkpoint it. */
typedef struct {
  uint64_t key;
  uint64_t stream;
  uint64_t ctr;     /* next counter block */
  uint32_t buf[4];  /* unread outputs of the current block */
  int left;         /* number of unread words in buf */
  int has_spare;    /* Box-Muller keeps its second normal */
  double spare;
} sr_rng;

void sr_rng_init(sr_rng *r, uint64_t key, uint64_t stream);
uint32_t sr_rng_u32(sr_rng *r);
uint64_t sr_rng_u64(sr_rng *r);
/* Uniform double in [0, 1). */
double sr_rng_uniform(sr_rng *r);
/* Standard normal (Box-Muller, double precision). */
double sr_rng_normal(sr_rng *r);
/* Uniform integer in [0, n), n > 0 (Lemire's method, unbiased). */
uint64_t sr_rng_below(sr_rng *r, uint64_t n);

#endif
