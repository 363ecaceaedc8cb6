/* Tests for common/: status codes, the Philox generator, SHA-256, AUC, the
 * number scanners and the CPU time of named threads (the file-tree helpers
 * have their own suite, test_fs.c). */
#include <check.h>

#include "tests/check_main.h"
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "common/auc.h"
#include "common/num.h"
#include "common/rng.h"
#include "common/sha256.h"
#include "common/status.h"
#include "common/sys.h"

START_TEST(test_strerror) {
  ck_assert_str_eq(sr_strerror(0), "success");
  ck_assert_str_eq(sr_strerror(SR_EINVAL), "invalid argument");
  ck_assert_str_eq(sr_strerror(SR_ECHECKSUM), "checksum mismatch");
  ck_assert_str_eq(sr_errname(SR_EFORMAT), "SR_EFORMAT");
  ck_assert_str_eq(sr_strerror(-9999), "unknown error");
}
END_TEST

/* Known-answer vectors from Random123's kat_vectors (philox4x32 10). */
/* sr_philox_n is sr_philox over consecutive counters, for every length
 * (the 8-wide blocks and the tail), counters crossing a 32-bit boundary. */
START_TEST(test_philox_n) {
  static uint32_t out[4 * 40 + 4];
  const uint64_t keys[3] = {0, 0x299f31d0a4093822ULL, ~0ULL};
  const uint64_t c1s[3] = {0, 0xfffffffcULL, ((uint64_t)77 << 32) | 5};
  for (int k = 0; k < 3; k++)
    for (int c = 0; c < 3; c++)
      for (size_t n = 0; n <= 40; n++) {
        for (size_t i = 0; i < 4 * 40 + 4; i++) out[i] = 0xabababab;
        sr_philox_n(keys[k], 0x85a308d3243f6a88ULL + n, c1s[c], n, out);
        for (size_t i = 0; i < n; i++) {
          sr_philox_out o = sr_philox(keys[k], 0x85a308d3243f6a88ULL + n, c1s[c] + i);
          for (int w = 0; w < 4; w++)
            ck_assert_msg(out[4 * i + (size_t)w] == o.v[w], "key %d c1 %d n %zu block %zu word %d", k,
                          c, n, i, w);
        }
        ck_assert_uint_eq(out[4 * n], 0xabababab); /* nothing past n blocks */
      }
}
END_TEST

START_TEST(test_philox_kat) {
  sr_philox_out o = sr_philox(0, 0, 0);
  ck_assert_uint_eq(o.v[0], 0x6627e8d5u);
  ck_assert_uint_eq(o.v[1], 0xe169c58du);
  ck_assert_uint_eq(o.v[2], 0xbc57ac4cu);
  ck_assert_uint_eq(o.v[3], 0x9b00dbd8u);
  o = sr_philox(~0ULL, ~0ULL, ~0ULL);
  ck_assert_uint_eq(o.v[0], 0x408f276du);
  ck_assert_uint_eq(o.v[1], 0x41c83b0eu);
  ck_assert_uint_eq(o.v[2], 0xa20bc7c6u);
  ck_assert_uint_eq(o.v[3], 0x6d5451fdu);
  /* ctr = 243f6a88 85a308d3 13198a2e 03707344, key = a4093822 299f31d0 */
  o = sr_philox(0x299f31d0a4093822ULL, 0x85a308d3243f6a88ULL, 0x0370734413198a2eULL);
  ck_assert_uint_eq(o.v[0], 0xd16cfe09u);
  ck_assert_uint_eq(o.v[1], 0x94fdccebu);
  ck_assert_uint_eq(o.v[2], 0x5001e420u);
  ck_assert_uint_eq(o.v[3], 0x24126ea1u);
}
END_TEST

START_TEST(test_rng_stream) {
  sr_rng a, b;
  sr_rng_init(&a, 42, 7);
  sr_rng_init(&b, 42, 7);
  for (int i = 0; i < 1000; i++) ck_assert_uint_eq(sr_rng_u32(&a), sr_rng_u32(&b));
  sr_rng_init(&b, 42, 8);
  int same = 0;
  for (int i = 0; i < 1000; i++) same += sr_rng_u32(&a) == sr_rng_u32(&b);
  ck_assert_int_lt(same, 5);
  /* Moments of uniform and normal draws. */
  double su = 0, sn = 0, sn2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; i++) {
    double u = sr_rng_uniform(&a);
    ck_assert(u >= 0.0 && u < 1.0);
    su += u;
    double z = sr_rng_normal(&a);
    sn += z;
    sn2 += z * z;
  }
  ck_assert_double_eq_tol(su / n, 0.5, 0.005);
  ck_assert_double_eq_tol(sn / n, 0.0, 0.01);
  ck_assert_double_eq_tol(sn2 / n, 1.0, 0.015);
  /* below() stays in range and hits every value. */
  int seen[7] = {0};
  for (int i = 0; i < 7000; i++) {
    uint64_t v = sr_rng_below(&a, 7);
    ck_assert_uint_lt(v, 7);
    seen[v]++;
  }
  for (int i = 0; i < 7; i++) ck_assert_int_gt(seen[i], 850);
}
END_TEST

START_TEST(test_u01) {
  ck_assert(sr_u01f(0) == 0.0f);
  ck_assert(sr_u01f(0xffffffffu) < 1.0f);
  ck_assert(sr_u01d(0xffffffffu, 0xffffffffu) < 1.0);
}
END_TEST

/* FIPS 180-2 vectors: "abc", the empty string, the 448-bit two-block one. */
START_TEST(test_sha256_vectors) {
  char hex[SR_SHA256_HEX];
  ck_assert_int_eq(sr_sha256_hex("abc", 3, hex), 0);
  ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  ck_assert_int_eq(sr_sha256_hex("", 0, hex), 0);
  ck_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  ck_assert_int_eq(sr_sha256_hex(m, strlen(m), hex), 0);
  ck_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  unsigned char raw[SR_SHA256_LEN];
  ck_assert_int_eq(sr_sha256("abc", 3, raw), 0);
  ck_assert_uint_eq(raw[0], 0xba);
  ck_assert_uint_eq(raw[31], 0xad);
}
END_TEST

/* Incremental updates in uneven pieces give the one-shot digest; a context
 * is unusable after final. */
START_TEST(test_sha256_incremental) {
  enum { N = 100003 };
  unsigned char *buf = malloc(N), one[SR_SHA256_LEN], inc[SR_SHA256_LEN];
  for (int i = 0; i < N; i++) buf[i] = (unsigned char)(i * 131 + 7);
  ck_assert_int_eq(sr_sha256(buf, N, one), 0);
  sr_sha256_ctx h;
  ck_assert_int_eq(sr_sha256_init(&h), 0);
  size_t at = 0, step = 1;
  while (at < N) {
    size_t k = N - at < step ? N - at : step;
    ck_assert_int_eq(sr_sha256_update(&h, buf + at, k), 0);
    at += k;
    step = step * 3 + 1;
  }
  ck_assert_int_eq(sr_sha256_update(&h, buf, 0), 0);
  ck_assert_int_eq(sr_sha256_final(&h, inc), 0);
  ck_assert_mem_eq(one, inc, SR_SHA256_LEN);
  ck_assert_ptr_null(h.md);
  ck_assert_int_eq(sr_sha256_update(&h, buf, 1), SR_EBACKEND);
  ck_assert_int_eq(sr_sha256_final(&h, inc), SR_EBACKEND);
  sr_sha256_abort(&h);
  sr_sha256_abort(NULL);
  free(buf);
}
END_TEST

/* A file streamed past the 1 MiB read size: the buffer's digest and size. */
START_TEST(test_sha256_file) {
  enum { N = (1 << 20) + 12345 };
  unsigned char *buf = malloc(N), raw[SR_SHA256_LEN];
  for (int i = 0; i < N; i++) buf[i] = (unsigned char)(i ^ (i >> 9));
  char path[] = "/tmp/sr_test_sha_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, buf, N), N);
  close(fd);
  char want[SR_SHA256_HEX], got[SR_SHA256_HEX];
  ck_assert_int_eq(sr_sha256(buf, N, raw), 0);
  sr_sha256_to_hex(raw, want);
  uint64_t size = 0;
  ck_assert_int_eq(sr_sha256_file(path, got, &size), 0);
  ck_assert_str_eq(got, want);
  ck_assert_uint_eq(size, N);
  ck_assert_int_eq(sr_sha256_file(path, got, NULL), 0);
  unlink(path);
  ck_assert_int_eq(sr_sha256_file(path, got, &size), SR_EIO);
  free(buf);
}
END_TEST

/* AUC by hand: ties are half a step (as scikit-learn's roc_auc_score), -0
 * ties +0, one class is NAN, a NaN score is refused. */
START_TEST(test_auc_by_hand) {
  double a;
  float s1[4] = {0.1f, 0.4f, 0.35f, 0.8f};
  uint8_t y1[4] = {0, 0, 1, 1};
  ck_assert_int_eq(sr_auc(s1, y1, 4, &a), 0);
  ck_assert(a == 0.75);
  float s2[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  uint8_t y2[4] = {0, 1, 0, 1};
  ck_assert_int_eq(sr_auc(s2, y2, 4, &a), 0);
  ck_assert(a == 0.5);
  /* one tie across classes among distinct scores: (2 + 0.5) / 3 */
  float s3[5] = {0.9f, 0.6f, 0.6f, 0.2f, 0.1f};
  uint8_t y3[5] = {1, 1, 0, 0, 0};
  ck_assert_int_eq(sr_auc(s3, y3, 5, &a), 0);
  ck_assert(fabs(a - (5.5 / 6.0)) < 1e-15);
  float s5[4] = {-0.0f, 0.0f, -1.0f, 2.0f};
  uint8_t y5[4] = {1, 0, 0, 7}; /* nonzero is positive */
  ck_assert_int_eq(sr_auc(s5, y5, 4, &a), 0);
  ck_assert(a == 0.875);
  uint8_t y6[4] = {1, 1, 1, 1};
  ck_assert_int_eq(sr_auc(s1, y6, 4, &a), 0);
  ck_assert(isnan(a));
  ck_assert_int_eq(sr_auc(s1, y1, 0, &a), 0);
  ck_assert(isnan(a));
  float sn[2] = {NAN, 0.5f};
  uint8_t yn[2] = {0, 1};
  a = 0;
  ck_assert_int_eq(sr_auc(sn, yn, 2, &a), SR_EINVAL);
  ck_assert(isnan(a));
  /* inputs unchanged */
  ck_assert(s1[0] == 0.1f && s1[3] == 0.8f && y1[2] == 1);
}
END_TEST

/* Against the O(P*N) pair count on random scores with many ties (scores on a
 * coarse grid, negatives too): the radix sort and the group walk agree. */
START_TEST(test_auc_pairs) {
  enum { N = 3000 };
  float s[N];
  uint8_t y[N];
  sr_rng r;
  sr_rng_init(&r, 11, 0);
  for (int i = 0; i < N; i++) {
    s[i] = (float)((int)(sr_rng_uniform(&r) * 64) - 20) / 8.0f;
    y[i] = sr_rng_uniform(&r) < 0.3 + 0.05 * s[i];
  }
  double pairs = 0, pos = 0, neg = 0;
  for (int i = 0; i < N; i++) {
    if (!y[i]) continue;
    pos++;
    for (int j = 0; j < N; j++)
      if (!y[j]) pairs += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
  }
  for (int j = 0; j < N; j++) neg += !y[j];
  double a;
  ck_assert_int_eq(sr_auc(s, y, N, &a), 0);
  ck_assert_msg(fabs(a - pairs / (pos * neg)) < 1e-12, "auc %.17g pairs %.17g", a, pairs / (pos * neg));
  ck_assert(a > 0.55 && a < 1.0);
  uint64_t k[N];
  for (int i = 0; i < N; i++) k[i] = sr_auc_key(s[i], y[i]);
  double b;
  ck_assert_int_eq(sr_auc_keys(k, N, &b), 0);
  ck_assert(a == b);
  for (int i = 1; i < N; i++) ck_assert_uint_le(k[i - 1] >> 1, k[i] >> 1);
}
END_TEST

/* Plain decimal numbers only: the syntax each scanner takes, the ends of
 * each type, and what is refused (space, '+', hexadecimal, inf, nan, an
 * empty token) or out of the type's range. */
START_TEST(test_num) {
  long long i;
  uint64_t u;
  double d;
  struct { const char *s; int rc; long long v; } ints[] = {
      {"0", 0, 0}, {"-0", 0, 0}, {"007", 0, 7}, {"-5", 0, -5},
      {"9223372036854775807", 0, LLONG_MAX}, {"-9223372036854775808", 0, LLONG_MIN},
      {"9223372036854775808", SR_ERANGE, 0}, {"-9223372036854775809", SR_ERANGE, 0},
      {"99999999999999999999999", SR_ERANGE, 0}, {"18446744073709551616", SR_ERANGE, 0},
      {"", SR_EINVAL, 0}, {"-", SR_EINVAL, 0}, {" 5", SR_EINVAL, 0}, {"5 ", SR_EINVAL, 0},
      {"+5", SR_EINVAL, 0}, {"0x10", SR_EINVAL, 0}, {"1e3", SR_EINVAL, 0}, {"1.0", SR_EINVAL, 0},
      {"--5", SR_EINVAL, 0}, {"5-", SR_EINVAL, 0}};
  for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
    i = 12345;
    ck_assert_msg(sr_num_int(ints[k].s, strlen(ints[k].s), &i) == ints[k].rc, "'%s'", ints[k].s);
    ck_assert_msg(i == (ints[k].rc ? 12345 : ints[k].v), "'%s': %lld", ints[k].s, i);
  }
  /* a token of a longer string: only its n bytes are read */
  ck_assert_int_eq(sr_num_int("42,7", 2, &i), 0);
  ck_assert_int_eq(i, 42);
  ck_assert_int_eq(sr_num_u64("18446744073709551615", 20, &u), 0);
  ck_assert(u == UINT64_MAX);
  ck_assert_int_eq(sr_num_u64("18446744073709551616", 20, &u), SR_ERANGE);
  ck_assert_int_eq(sr_num_u64("-1", 2, &u), SR_ERANGE);
  ck_assert_int_eq(sr_num_u64("-0", 2, &u), 0);
  ck_assert(u == 0);
  ck_assert_int_eq(sr_num_u64(" 1", 2, &u), SR_EINVAL);
  struct { const char *s; int rc; double v; } dbl[] = {
      {"0.01", 0, 0.01}, {"-2.5e-3", 0, -2.5e-3}, {"1E+2", 0, 100}, {".5", 0, 0.5},
      {"5.", 0, 5}, {"16", 0, 16}, {"1e-400", 0, 0}, {"1e400", SR_ERANGE, 0},
      {"-1e400", SR_ERANGE, 0}, {"0x10", SR_EINVAL, 0}, {" 5", SR_EINVAL, 0},
      {"5 ", SR_EINVAL, 0}, {"+5", SR_EINVAL, 0}, {"inf", SR_EINVAL, 0}, {"nan", SR_EINVAL, 0},
      {"infinity", SR_EINVAL, 0}, {"", SR_EINVAL, 0}, {".", SR_EINVAL, 0}, {"1e", SR_EINVAL, 0},
      {"e5", SR_EINVAL, 0}, {"1.2.3", SR_EINVAL, 0}};
  for (size_t k = 0; k < sizeof dbl / sizeof dbl[0]; k++) {
    d = 777;
    ck_assert_msg(sr_num_double(dbl[k].s, &d) == dbl[k].rc, "'%s'", dbl[k].s);
    ck_assert_msg(d == (dbl[k].rc ? 777 : dbl[k].v), "'%s': %g", dbl[k].s, d);
  }
  /* JSON numbers: what is not finite is null. */
  char j[SR_JNUM_MAX];
  ck_assert_str_eq(sr_jnum(j, 0.25, 17), "0.25");
  ck_assert_str_eq(sr_jnum(j, 1.0 / 3.0, 9), "0.333333333");
  ck_assert_str_eq(sr_jnum(j, -1e300, 17), "-1.0000000000000001e+300");
  ck_assert_str_eq(sr_jnum(j, NAN, 17), "null");
  ck_assert_str_eq(sr_jnum(j, -INFINITY, 9), "null");
}
END_TEST

/* A thread named "srtest:burn" (by sr_thread_name) that spins until its own
 * CPU time reaches 40 ms, says so, and stays alive until released. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int burnt, release;
} burner;

static void *burn_main(void *arg) {
  burner *b = arg;
  sr_thread_name("srtest:burn");
  volatile uint64_t x = 1;
  while (sr_thread_cpu_ns() < 40000000u) x = x * 6364136223846793005ull + 1;
  pthread_mutex_lock(&b->mu);
  b->burnt = 1;
  pthread_cond_broadcast(&b->cv);
  while (!b->release) pthread_cond_wait(&b->cv, &b->mu);
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

/* The named thread's CPU is counted, from its name's prefix; the calling
 * thread's (not so named) and an unmatched prefix's are not. */
START_TEST(test_named_threads_cpu) {
  burner b = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, burn_main, &b), 0);
  pthread_mutex_lock(&b.mu);
  while (!b.burnt) pthread_cond_wait(&b.cv, &b.mu);
  pthread_mutex_unlock(&b.mu);
  const uint64_t mine0 = sr_thread_cpu_ns();
  while (sr_thread_cpu_ns() - mine0 < 60000000u) { /* this thread: 60 ms, more than the other's 40 */
  }
  const uint64_t named = sr_named_threads_cpu_ns("srtest:"), none = sr_named_threads_cpu_ns("srtest:x");
  const uint64_t all = sr_process_cpu_ns();
  pthread_mutex_lock(&b.mu);
  b.release = 1;
  pthread_cond_broadcast(&b.cv);
  pthread_mutex_unlock(&b.mu);
  pthread_join(th, NULL);
  ck_assert_msg(named >= 40000000u && named < 60000000u, "named thread: %llu ns",
                (unsigned long long)named);
  ck_assert_msg(named < all, "named %llu ns of the process's %llu", (unsigned long long)named,
                (unsigned long long)all);
  ck_assert_msg(none == 0, "no thread so named, yet %llu ns", (unsigned long long)none);
}
END_TEST

int main(void) {
  Suite *s = suite_create("common");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_strerror);
  tcase_add_test(tc, test_philox_kat);
  tcase_add_test(tc, test_philox_n);
  tcase_add_test(tc, test_rng_stream);
  tcase_add_test(tc, test_u01);
  tcase_add_test(tc, test_sha256_vectors);
  tcase_add_test(tc, test_sha256_incremental);
  tcase_add_test(tc, test_sha256_file);
  tcase_add_test(tc, test_auc_by_hand);
  tcase_add_test(tc, test_auc_pairs);
  tcase_add_test(tc, test_num);
  tcase_add_test(tc, test_named_threads_cpu);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
