/* The collective interface: the one-rank CPU collective (runs everywhere;
 * float and byte operations), and a one-rank NCCL smoke test on a device
 * buffer (skipped, exit 77, with "skipped: no GPU" where there is none;
 * absent from builds without NCCL). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "dense/collective.h"
#ifdef SHARDREC_HAVE_NCCL
#include "gpu_skip.h"
#endif

START_TEST(test_single) {
  dense_coll *c = dense_coll_single_create();
  ck_assert_ptr_nonnull(c);
  ck_assert_int_eq(c->rank, 0);
  ck_assert_int_eq(c->size, 1);
  float buf[5] = {1, -2, 3.5f, 0, 1e30f}, want[5];
  memcpy(want, buf, sizeof buf);
  ck_assert_int_eq(dense_coll_all_reduce_sum(c, buf, 5), 0);
  ck_assert(memcmp(buf, want, sizeof buf) == 0);
  ck_assert_int_eq(dense_coll_broadcast(c, buf, 5, 0), 0);
  ck_assert(memcmp(buf, want, sizeof buf) == 0);
  ck_assert_int_eq(dense_coll_broadcast(c, buf, 5, 1), SR_EINVAL);
  ck_assert_int_eq(dense_coll_all_reduce_sum(c, NULL, 5), SR_EINVAL);
  ck_assert_int_eq(dense_coll_barrier(c), 0);
  dense_coll_destroy(c);
  dense_coll_destroy(NULL);
}
END_TEST

/* The byte operations on one rank: broadcast leaves the bytes, all-gather
 * copies send into recv (also in place), n = 0 touches nothing; bad
 * arguments are refused with the reason. */
START_TEST(test_single_bytes) {
  dense_coll *c = dense_coll_single_create();
  ck_assert_ptr_nonnull(c);
  unsigned char buf[7] = {0, 1, 0x7f, 0x80, 0xff, 42, 9}, want[7], recv[8];
  memcpy(want, buf, sizeof buf);
  ck_assert_int_eq(dense_coll_broadcast_bytes(c, buf, sizeof buf, 0), 0);
  ck_assert(memcmp(buf, want, sizeof buf) == 0);
  memset(recv, 0xee, sizeof recv);
  ck_assert_int_eq(dense_coll_allgather_bytes(c, buf, sizeof buf, recv), 0);
  ck_assert(memcmp(recv, want, sizeof buf) == 0);
  ck_assert_int_eq(recv[7], 0xee); /* size * n bytes written, no more */
  memset(recv, 0xee, sizeof recv);
  ck_assert_int_eq(dense_coll_allgather_bytes(c, buf, 0, recv), 0);
  ck_assert_int_eq(recv[0], 0xee);
  ck_assert_int_eq(dense_coll_allgather_bytes(c, buf, sizeof buf, buf), 0); /* in place */
  ck_assert(memcmp(buf, want, sizeof buf) == 0);

  ck_assert_int_eq(dense_coll_broadcast_bytes(c, buf, sizeof buf, 1), SR_EINVAL);
  ck_assert_msg(strstr(dense_coll_errmsg(c), "root 1"), "%s", dense_coll_errmsg(c));
  ck_assert_int_eq(dense_coll_broadcast_bytes(c, buf, sizeof buf, -1), SR_EINVAL);
  ck_assert_int_eq(dense_coll_broadcast_bytes(c, NULL, 3, 0), SR_EINVAL);
  ck_assert_msg(strstr(dense_coll_errmsg(c), "NULL"), "%s", dense_coll_errmsg(c));
  ck_assert_int_eq(dense_coll_broadcast_bytes(c, NULL, 0, 0), 0);
  ck_assert_int_eq(dense_coll_allgather_bytes(c, buf, 3, NULL), SR_EINVAL);
  ck_assert_msg(strstr(dense_coll_errmsg(c), "receive"), "%s", dense_coll_errmsg(c));
  ck_assert_int_eq(dense_coll_allgather_bytes(c, NULL, 3, recv), SR_EINVAL);
  ck_assert_msg(strstr(dense_coll_errmsg(c), "send"), "%s", dense_coll_errmsg(c));
  ck_assert_int_eq(dense_coll_broadcast_bytes(NULL, buf, 3, 0), SR_EINVAL);
  ck_assert_int_eq(dense_coll_allgather_bytes(NULL, buf, 3, recv), SR_EINVAL);
  dense_coll_destroy(c);
}
END_TEST

#ifdef SHARDREC_HAVE_NCCL
START_TEST(test_nccl_one_rank) {
  cuda_be();
  char err[256];
  dense_coll *c = dense_coll_nccl_create(0, 1, 0, dense_cuda_stream(), err,
                                         sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  size_t n = 1 << 20;
  float *h = malloc(n * 4), *back = malloc(n * 4);
  fill_uniform(h, n, 5, -1, 1);
  float *d = to_dev(h, n);
  ck_assert_msg(dense_coll_all_reduce_sum(c, d, n) == 0, "%s",
                dense_coll_errmsg(c));
  ck_assert_msg(dense_coll_broadcast(c, d, n, 0) == 0, "%s",
                dense_coll_errmsg(c));
  ck_assert_msg(dense_coll_barrier(c) == 0, "%s", dense_coll_errmsg(c));
  from_dev(back, d, n); /* ordered after the collective on the stream */
  ck_assert_msg(memcmp(h, back, n * 4) == 0,
                "one-rank all-reduce changed the buffer");
  /* bytes: broadcast leaves them, a one-rank all-gather copies them */
  void *d2 = NULL;
  ck_assert_msg(dense_cuda_malloc(&d2, n * 4) == 0, "%s",
                dense_cuda_last_error());
  ck_assert_msg(dense_coll_broadcast_bytes(c, d, n * 4, 0) == 0, "%s",
                dense_coll_errmsg(c));
  ck_assert_msg(dense_coll_allgather_bytes(c, d, n * 4, d2) == 0, "%s",
                dense_coll_errmsg(c));
  ck_assert_msg(dense_coll_barrier(c) == 0, "%s", dense_coll_errmsg(c));
  from_dev(back, (const float *)d2, n);
  ck_assert_msg(memcmp(h, back, n * 4) == 0,
                "one-rank all-gather of bytes: recv differs from send");
  dense_cuda_free(d2);
  dense_cuda_free(d);
  free(h), free(back);
  dense_coll_destroy(c);
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("collective");
  TCase *tc = tcase_create("collective");
  tcase_add_test(tc, test_single);
  tcase_add_test(tc, test_single_bytes);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  if (failed) return 1;
#ifdef SHARDREC_HAVE_NCCL
  SR_SKIP_NO_GPU("test_collective (NCCL one-rank smoke test)");
  Suite *s2 = suite_create("nccl");
  TCase *t2 = tcase_create("nccl");
  tcase_set_timeout(t2, 120);
  tcase_add_test(t2, test_nccl_one_rank);
  suite_add_tcase(s2, t2);
  sr = srunner_create(s2);
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
#endif
  return failed ? 1 : 0;
}
