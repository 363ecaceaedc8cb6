/* 16-bit floats (common/half.h): the plain C and F16C conversions give the
 * same bits for all 65536 halves and a sweep of floats, both round to
 * nearest even (against the compiler's _Float16 and a neighbour search),
 * bf16 likewise (its bulk conversions, of every length, the one-value
 * functions' bits on a sweep of floats), and the stochastic roundings pick one of the two
 * neighbours, unbiased, from the bits they are given. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/half.h"
#include "common/rng.h"

static uint32_t fbits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float bitsf(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* The value of half h by its definition, in double. */
static double f16_value(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

/* Check's asserts talk to the runner on every call: the loops below count
 * their faults and keep the first, and assert once. */
typedef struct {
  long n;
  char first[160];
} faults;

#define FAULT(f, ...)                                                          \
  do {                                                                         \
    if (!(f)->n++) snprintf((f)->first, sizeof (f)->first, __VA_ARGS__);       \
  } while (0)

START_TEST(test_f16_every_half) {
  static float c[65536], v[65536];
  static uint16_t all[65536];
  faults f = {0, ""};
  for (uint32_t h = 0; h < 65536; h++) all[h] = (uint16_t)h;
  sr_f16_decode(all, c, 65536, SR_HALF_C);
  for (uint32_t h = 0; h < 65536; h++) {
    double want = f16_value((uint16_t)h);
    const int same_sign = (fbits(c[h]) >> 31) == (h >> 15);
    if (isnan(want)) { /* a quiet NaN of the same sign and payload */
      if (!isnan(c[h]) || !same_sign || ((fbits(c[h]) >> 13) & 0x3ff) != ((h & 0x3ff) | 0x200) ||
          sr_f32_to_f16(c[h]) != (h | 0x200))
        FAULT(&f, "NaN half %04x: %08x", h, fbits(c[h]));
    } else if ((double)c[h] != want || !same_sign || sr_f32_to_f16(c[h]) != h) { /* round trip */
      FAULT(&f, "half %04x: %08x (%g), back %04x", h, fbits(c[h]), c[h], sr_f32_to_f16(c[h]));
    }
  }
  ck_assert_msg(f.n == 0, "%ld faults; first: %s", f.n, f.first);
  if (!sr_half_f16c_available()) return;
  sr_f16_decode(all, v, 65536, SR_HALF_F16C);
  for (uint32_t h = 0; h < 65536; h++)
    if (fbits(c[h]) != fbits(v[h])) FAULT(&f, "half %04x: C %08x, F16C %08x", h, fbits(c[h]), fbits(v[h]));
  ck_assert_msg(f.n == 0, "%ld faults; first: %s", f.n, f.first);
}
END_TEST

/* h is x rounded to nearest, ties to even, among the finite halves and
 * infinity (past 65520). */
static int f16_is_rne(float x, uint16_t h) {
  double ax = fabs((double)x), v = fabs(f16_value(h));
  if (((h & 0x8000) != 0) != (signbit(x) != 0)) return 0;
  if (ax >= 65520.0) return (h & 0x7fff) == 0x7c00;
  uint16_t m = h & 0x7fff;
  double below = m ? f16_value((uint16_t)(m - 1)) : -1, above = m < 0x7bff ? f16_value((uint16_t)(m + 1)) : 65536;
  double d = fabs(ax - v);
  if (d > ax - below && below >= 0) return 0;
  if (d > above - ax) return 0;
  if ((d == ax - below || d == above - ax) && d > 0) return (m & 1) == 0;
  return 1;
}

START_TEST(test_f16_sweep) {
  enum { N = 4096 };
  float x[N];
  uint16_t c[N], v[N];
  const int f16c = sr_half_f16c_available();
  uint64_t checked = 0;
  faults f = {0, ""};
  /* Every 1021st float (a prime stride: every exponent, both signs, NaNs,
   * and low bits of every kind), and every float around 1.0 and 65504
   * whose low 13 bits decide a tie. */
  for (uint64_t u = 0; u < (1ULL << 32) + 2 * 65536; u += (uint64_t)N * 1021) {
    for (int k = 0; k < N; k++) {
      uint64_t w = u + (uint64_t)k * 1021;
      x[k] = w < (1ULL << 32) ? bitsf((uint32_t)w)
                               : bitsf((w & 1 ? 0x477fe000u : 0x3f800000u) + (uint32_t)(w & 0x3fff));
    }
    sr_f16_encode(x, c, N, SR_HALF_C);
    if (f16c) sr_f16_encode(x, v, N, SR_HALF_F16C);
    for (int k = 0; k < N; k++) {
      if (f16c && c[k] != v[k]) FAULT(&f, "float %08x: C %04x, F16C %04x", fbits(x[k]), c[k], v[k]);
      if (isnan(x[k])) {
        if (c[k] != (((fbits(x[k]) >> 16) & 0x8000) | 0x7e00 | ((fbits(x[k]) >> 13) & 0x3ff)))
          FAULT(&f, "NaN %08x: %04x", fbits(x[k]), c[k]);
        continue;
      }
      if (!f16_is_rne(x[k], c[k])) FAULT(&f, "float %08x (%g): %04x", fbits(x[k]), x[k], c[k]);
#ifdef __FLT16_MAX__
      _Float16 r = (_Float16)x[k];
      uint16_t rb;
      memcpy(&rb, &r, 2);
      if (c[k] != rb) FAULT(&f, "float %08x: %04x, the compiler's %04x", fbits(x[k]), c[k], rb);
#endif
      checked++;
    }
  }
  ck_assert_msg(f.n == 0, "%ld faults; first: %s", f.n, f.first);
  /* The edges: ties at the smallest subnormal, the largest normal, overflow. */
  const struct { float x; uint16_t h; } edge[] = {
      {0x1p-25f, 0x0000}, {0x1.000002p-25f, 0x0001}, {0x1.8p-24f, 0x0002}, {0x1p-14f, 0x0400},
      {65504.0f, 0x7bff}, {65519.99f, 0x7bff}, {65520.0f, 0x7c00}, {-65520.0f, 0xfc00},
      {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 0x1.8p-10f, 0x3c02}, {INFINITY, 0x7c00}};
  for (size_t k = 0; k < sizeof edge / sizeof edge[0]; k++) {
    ck_assert_msg(sr_f32_to_f16(edge[k].x) == edge[k].h, "%a: %04x", edge[k].x, sr_f32_to_f16(edge[k].x));
    if (f16c) {
      uint16_t h[8];
      float in[8] = {edge[k].x, edge[k].x, edge[k].x, edge[k].x, edge[k].x, edge[k].x, edge[k].x, edge[k].x};
      sr_f16_encode(in, h, 8, SR_HALF_F16C);
      ck_assert_uint_eq(h[0], edge[k].h);
    }
  }
  ck_assert_uint_gt(checked, 1000000);
}
END_TEST

/* Every length: the F16C kernel's tail (n not a multiple of 8) is the C
 * kernel's. */
START_TEST(test_f16_lengths) {
  float x[40], y[40], z[40];
  uint16_t a[40], b[40];
  sr_rng r;
  sr_rng_init(&r, 7, 0);
  for (int n = 0; n <= 40; n++) {
    for (int k = 0; k < 40; k++) x[k] = (float)sr_rng_normal(&r) * 100.0f;
    memset(a, 0xab, sizeof a);
    memset(b, 0xab, sizeof b);
    sr_f16_encode(x, a, (size_t)n, SR_HALF_AUTO);
    sr_f16_encode(x, b, (size_t)n, SR_HALF_C);
    ck_assert_mem_eq(a, b, sizeof a); /* past n untouched by both */
    sr_f16_decode(a, y, (size_t)n, SR_HALF_AUTO);
    sr_f16_decode(a, z, (size_t)n, SR_HALF_C);
    ck_assert_mem_eq(y, z, (size_t)n * sizeof *y);
  }
}
END_TEST

START_TEST(test_bf16) {
  for (uint32_t h = 0; h < 65536; h++) {
    float v = sr_bf16_to_f32((uint16_t)h);
    ck_assert_uint_eq(fbits(v), h << 16);
    if (!isnan(v)) ck_assert_uint_eq(sr_f32_to_bf16(v), h);
    else ck_assert_uint_eq(sr_f32_to_bf16(v), h | 0x40);
  }
  /* Round to nearest even on the low 16 bits; overflow to infinity. */
  ck_assert_uint_eq(sr_f32_to_bf16(bitsf(0x3f808000)), 0x3f80); /* tie, even below */
  ck_assert_uint_eq(sr_f32_to_bf16(bitsf(0x3f818000)), 0x3f82); /* tie, even above */
  ck_assert_uint_eq(sr_f32_to_bf16(bitsf(0x3f808001)), 0x3f81);
  ck_assert_uint_eq(sr_f32_to_bf16(bitsf(0x3f807fff)), 0x3f80);
  ck_assert_uint_eq(sr_f32_to_bf16(bitsf(0x7f7fffff)), 0x7f80);
  ck_assert_uint_eq(sr_f32_to_bf16(bitsf(0xff7f8000)), 0xff80);
  float x[3] = {1.5f, -2.0f, 0x1.fep0f};
  uint16_t h[3];
  float y[3];
  sr_bf16_encode(x, h, 3);
  sr_bf16_decode(h, y, 3);
  ck_assert_mem_eq(x, y, sizeof x);
}
END_TEST

/* The bulk bf16 conversions (8 at a time where SSE2 runs) against the
 * one-value functions: every 1021st float and each length up to 40. */
START_TEST(test_bf16_bulk) {
  enum { N = 4096 };
  static float x[N], y[N];
  static uint16_t c[N];
  faults f = {0, ""};
  for (uint64_t u = 0; u < (1ULL << 32); u += (uint64_t)N * 1021) {
    for (int k = 0; k < N; k++) x[k] = bitsf((uint32_t)(u + (uint64_t)k * 1021));
    sr_bf16_encode(x, c, N);
    sr_bf16_decode(c, y, N);
    for (int k = 0; k < N; k++) {
      if (c[k] != sr_f32_to_bf16(x[k])) FAULT(&f, "float %08x: bulk %04x, one %04x", fbits(x[k]), c[k], sr_f32_to_bf16(x[k]));
      if (fbits(y[k]) != (uint32_t)c[k] << 16) FAULT(&f, "bf16 %04x: bulk %08x", c[k], fbits(y[k]));
    }
  }
  ck_assert_msg(f.n == 0, "%ld faults; first: %s", f.n, f.first);
  float a[40], b[40];
  uint16_t h[40], g[40];
  for (int n = 0; n <= 40; n++) {
    for (int k = 0; k < 40; k++) a[k] = (float)(k * 7 - 100) * 0.3f + (float)n;
    memset(h, 0xab, sizeof h);
    memset(g, 0xab, sizeof g);
    for (int k = 0; k < n; k++) g[k] = sr_f32_to_bf16(a[k]);
    sr_bf16_encode(a, h, (size_t)n);
    ck_assert_mem_eq(h, g, sizeof h); /* past n untouched */
    memset(b, 0xab, sizeof b);
    sr_bf16_decode(h, b, (size_t)n);
    for (int k = 0; k < n; k++) ck_assert_uint_eq(fbits(b[k]), (uint32_t)h[k] << 16);
    ck_assert_uint_eq(fbits(b[n < 40 ? n : 39]), n < 40 ? 0xabababab : fbits(b[39]));
  }
}
END_TEST

/* The bulk roundings are the scalar ones, value by value, at every length
 * and offset (the eight-wide groups and the tails), over groups all in the
 * common range and groups with an exception in them: subnormal halves,
 * past 65504, infinities, NaNs, zeros, bf16's largest values. */
START_TEST(test_stochastic_bulk) {
  enum { N = 203 };
  static float x[N];
  static uint32_t bits[N];
  static uint16_t got[N + 1];
  const float odd[] = {0x1p-20f, -0x1p-26f, 65510.0f, 70000.0f, INFINITY, -INFINITY, NAN, 0.0f,
                       -0.0f, 0x1.fffffep127f, -0x1.ff8p127f, 0x1p-140f};
  sr_rng r;
  sr_rng_init(&r, 23, 0);
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < N; i++) {
      x[i] = (float)((sr_rng_uniform(&r) - 0.5) * 8.0);
      bits[i] = sr_rng_u32(&r);
    }
    if (round % 2) /* an exception in some groups */
      for (int i = round; i < N; i += 29) x[i] = odd[(size_t)(i + round) % (sizeof odd / sizeof *odd)];
    for (int len = round; len <= N - round; len += 37) {
      const float *xs = x + round;
      const uint32_t *bs = bits + round;
      for (int fmt = 0; fmt < 2; fmt++) {
        got[len] = 0xabab;
        if (fmt) sr_bf16_round_stochastic_n(xs, bs, got, (size_t)len);
        else sr_f16_round_stochastic_n(xs, bs, got, (size_t)len);
        for (int i = 0; i < len; i++) {
          const uint16_t want = fmt ? sr_bf16_round_stochastic(xs[i], bs[i])
                                    : sr_f16_round_stochastic(xs[i], bs[i]);
          ck_assert_msg(got[i] == want, "%s round %d len %d at %d (x %a): 0x%04x, want 0x%04x",
                        fmt ? "bf16" : "fp16", round, len, i, (double)xs[i], got[i], want);
        }
        ck_assert_uint_eq(got[len], 0xabab);
      }
    }
  }
}
END_TEST

/* A value of the format stays; any other goes to one of its two
 * neighbours: up when u < p, so bits 0 always go up and all-ones down. */
START_TEST(test_stochastic_neighbours) {
  const float same[] = {0.0f, -0.0f, 1.0f, -1.5f, 65504.0f, 0x1p-24f, 0x1p-14f};
  for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
    ck_assert_uint_eq(sr_f16_round_stochastic(same[k], 0), sr_f32_to_f16(same[k]));
    ck_assert_uint_eq(sr_bf16_round_stochastic(same[k], 0), sr_f32_to_bf16(same[k]));
  }
  const float x = 1.0f + 0x1p-12f; /* 1/4 of the way from 1 to the next half */
  ck_assert_uint_eq(sr_f16_round_stochastic(x, 0), 0x3c01);
  ck_assert_uint_eq(sr_f16_round_stochastic(x, 0xffffffffu), 0x3c00);
  ck_assert_uint_eq(sr_f16_round_stochastic(-x, 0), 0xbc01);
  ck_assert_uint_eq(sr_f16_round_stochastic(x, 0x3fffffffu), 0x3c01); /* u just below 1/4 */
  ck_assert_uint_eq(sr_f16_round_stochastic(x, 0x40000000u), 0x3c00); /* u = 1/4 */
  ck_assert_uint_eq(sr_bf16_round_stochastic(bitsf(0x3f804000), 0x3fffffffu), 0x3f81);
  ck_assert_uint_eq(sr_bf16_round_stochastic(bitsf(0x3f804000), 0x40000000u), 0x3f80);
  /* Subnormal halves, the top of the range, infinities and NaNs. */
  ck_assert_uint_eq(sr_f16_round_stochastic(0x1p-26f, 0), 0x0001);
  ck_assert_uint_eq(sr_f16_round_stochastic(0x1p-26f, 0xffffffffu), 0x0000);
  ck_assert_uint_eq(sr_f16_round_stochastic(65510.0f, 0), 0x7c00);
  ck_assert_uint_eq(sr_f16_round_stochastic(65510.0f, 0xffffffffu), 0x7bff);
  ck_assert_uint_eq(sr_f16_round_stochastic(1e6f, 0xffffffffu), 0x7c00);
  ck_assert_uint_eq(sr_f16_round_stochastic(-INFINITY, 0), 0xfc00);
  ck_assert(isnan(sr_f16_to_f32(sr_f16_round_stochastic(NAN, 0))));
  ck_assert_uint_eq(sr_bf16_round_stochastic(bitsf(0x7f7fffff), 0), 0x7f80);
  ck_assert_uint_eq(sr_bf16_round_stochastic(bitsf(0x7f7fffff), 0xffffffffu), 0x7f7f);
}
END_TEST

/* Unbiased: the mean of many roundings of x is x, to within the sampling
 * error, where rounding to nearest would be a whole step off the mean. */
START_TEST(test_stochastic_unbiased) {
  const float xs[] = {1.0f + 0x1p-12f, -3.14159265f, 0.0123456f, 1e-6f, 0x1.0007p+10f};
  sr_rng r;
  sr_rng_init(&r, 11, 3);
  enum { N = 200000 };
  for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
    for (int bf = 0; bf < 2; bf++) {
      double sum = 0;
      for (int i = 0; i < N; i++) {
        uint32_t b = sr_rng_u32(&r);
        sum += bf ? sr_bf16_to_f32(sr_bf16_round_stochastic(xs[k], b))
                  : sr_f16_to_f32(sr_f16_round_stochastic(xs[k], b));
      }
      double mean = sum / N, x = xs[k];
      double step = bf ? ldexp(1.0, ilogb(x) - 7) : ldexp(1.0, ilogb(x) < -14 ? -24 : ilogb(x) - 10);
      /* 5 standard errors of a coin of step's size: 5 * step / 2 / sqrt(N) */
      ck_assert_msg(fabs(mean - x) < 5 * step / 2 / sqrt((double)N) + 1e-12 * fabs(x),
                    "%s %a: mean %a", bf ? "bf16" : "fp16", x, mean);
    }
  }
}
END_TEST

/* The definition, in double: lo and hi the format's neighbours of |x|
 * (toward zero and the next one up, infinity past the largest finite, as
 * 65536 or 2^128 for the step), up when (bits >> 8) / 2^24 < (|x| - lo) /
 * (hi - lo). */
static uint16_t sr_reference(float x, uint32_t bits, int bf) {
  double ax = fabs((double)x);
  uint16_t t = 0; /* the largest of the format's magnitudes <= ax */
  for (int b = 14; b >= 0; b--) {
    uint16_t c = (uint16_t)(t | (1u << b));
    double v = bf ? (double)sr_bf16_to_f32(c) : f16_value(c);
    if (c < (bf ? 0x7f80 : 0x7c00) && v <= ax) t = c;
  }
  double lo = bf ? (double)sr_bf16_to_f32(t) : f16_value(t);
  double hi = t + 1 == (bf ? 0x7f80 : 0x7c00) ? (bf ? ldexp(1, 128) : 65536.0)
                                               : (bf ? (double)sr_bf16_to_f32((uint16_t)(t + 1))
                                                     : f16_value((uint16_t)(t + 1)));
  double p = (ax - lo) / (hi - lo), u = (double)(bits >> 8) / 16777216.0;
  uint16_t m = (uint16_t)(u < p ? t + 1 : t);
  return (uint16_t)((signbit(x) ? 0x8000 : 0) | m);
}

/* Both roundings against the definition: floats of every range (subnormal
 * halves, normal ones, up to 65536, tiny and huge bf16 values) with random
 * bits and bits on either side of the threshold. */
START_TEST(test_stochastic_definition) {
  sr_rng r;
  sr_rng_init(&r, 21, 0);
  faults f = {0, ""};
  long n = 0;
  for (int k = 0; k < 200000; k++) {
    uint32_t xb = sr_rng_u32(&r);
    int bf = k & 1;
    if (!bf) xb = (xb & 0x80000000u) | (0x33000000u + xb % (0x47800000u - 0x33000000u));
    float x = bitsf(xb);
    if (!isfinite(x)) continue;
    uint32_t bits[3] = {sr_rng_u32(&r), 0, 0};
    /* the threshold: the bits whose u equals p, and the ones below it */
    uint32_t low = bf ? (xb & 0xffffu) << 16 : 0;
    if (!bf && (xb & 0x7fffffffu) >= 0x38800000u) low = (xb & 0x1fffu) << 19;
    bits[1] = low, bits[2] = low ? low - 1 : 0;
    for (int j = 0; j < 3; j++, n++) {
      uint16_t got = bf ? sr_bf16_round_stochastic(x, bits[j]) : sr_f16_round_stochastic(x, bits[j]);
      uint16_t want = sr_reference(x, bits[j], bf);
      if (got != want) FAULT(&f, "%s %08x bits %08x: %04x, the definition %04x", bf ? "bf16" : "fp16",
                             xb, bits[j], got, want);
    }
  }
  ck_assert_msg(f.n == 0, "%ld faults of %ld; first: %s", f.n, n, f.first);
}
END_TEST

int main(void) {
  Suite *s = suite_create("half");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_f16_every_half);
  tcase_add_test(tc, test_f16_sweep);
  tcase_add_test(tc, test_f16_lengths);
  tcase_add_test(tc, test_bf16);
  tcase_add_test(tc, test_bf16_bulk);
  tcase_add_test(tc, test_stochastic_neighbours);
  tcase_add_test(tc, test_stochastic_bulk);
  tcase_add_test(tc, test_stochastic_unbiased);
  tcase_add_test(tc, test_stochastic_definition);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
