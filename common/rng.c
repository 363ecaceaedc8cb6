#include "common/rng.h"

#include <math.h>

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
