/* Tests for common/: status codes and the Philox generator. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/status.h"

START_TEST(test_strerror) {
  ck_assert_str_eq(sr_strerror(0), "success");
  ck_assert_str_eq(sr_strerror(SR_EINVAL), "invalid argument");
  ck_assert_str_eq(sr_strerror(SR_ECHECKSUM), "checksum mismatch");
  ck_assert_str_eq(sr_errname(SR_EFORMAT), "SR_EFORMAT");
  ck_assert_str_eq(sr_strerror(-9999), "unknown error");
}
END_TEST

/* Known-answer vectors from Random123's kat_vectors (philox4x32 10). */
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

int main(void) {
  Suite *s = suite_create("common");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_strerror);
  tcase_add_test(tc, test_philox_kat);
  tcase_add_test(tc, test_rng_stream);
  tcase_add_test(tc, test_u01);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
