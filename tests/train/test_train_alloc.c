/* Out of memory in the engine: each allocation of trainer_create,
 * trainer_lookup_early and job_batches_init failed in turn returns SR_ENOMEM
 * (or NULL with "out of memory"), crashes nothing, and a retry once memory
 * is back works. The allocator fails on the Nth call (tests/common/
 * fail_alloc.h, linked with --wrap). */
#include <check.h>
#include <string.h>

#include "common/status.h"
#include "tests/check_main.h"
#include "tests/common/fail_alloc.h"
#include "train/job_impl.h"

typedef struct {
  emb_plan *plan;
  emb_store *store;
  dense_config cfg;
  dense_opt_config oc;
} world;

static void world_open(world *w) {
  uint64_t rows[DS_NUM_SPARSE];
  for (int i = 0; i < DS_NUM_SPARSE; i++) rows[i] = 40;
  emb_plan_params pp = {.n_tables = DS_NUM_SPARSE, .rows = rows, .dim = 4,
                        .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1}, .seed = 3, .n_shards = 1};
  char err[512];
  ck_assert_int_eq(emb_plan_create(&pp, &w->plan, err, sizeof err), 0);
  w->store = emb_store_create_local(w->plan, err, sizeof err);
  ck_assert_msg(w->store != NULL, "%s", err);
  dense_config cfg = {.n_dense = 13, .bot = {13, 8, 4}, .n_bot = 3, .top = {8, 1}, .n_top = 2,
                      .n_sparse = DS_NUM_SPARSE, .emb_dim = 4,
                      .interaction = DENSE_INTERACT_DOT, .max_batch = 8};
  w->cfg = cfg;
  w->oc = dense_opt_defaults(DENSE_OPT_SGD);
}

static void world_close(world *w) {
  emb_store_destroy(w->store);
  emb_plan_free(w->plan);
}

/* A batch of n samples, sample i's id in table f = (i * 7 + f) % 40. */
static void batch_fill(ds_batch *b, int n, int salt) {
  b->n = n;
  ck_assert_int_eq(ds_batch_reserve_ids(b, (size_t)n * DS_NUM_SPARSE), 0);
  size_t id = 0;
  for (int f = 0; f < DS_NUM_SPARSE; f++) {
    uint32_t *off = ds_batch_offsets(b, f);
    for (int i = 0; i < n; i++) {
      off[i] = (uint32_t)id;
      b->ids[id++] = (uint64_t)((i * 7 + f + salt) % 40);
    }
    off[n] = (uint32_t)id;
  }
  for (int i = 0; i < n; i++) {
    b->labels[i] = (float)(i % 2);
    for (int k = 0; k < DS_NUM_DENSE; k++) b->dense[i * DS_NUM_DENSE + k] = 0.1f * (float)k;
  }
}

/* trainer_create with its Nth allocation failing, for every N it makes. */
START_TEST(test_trainer_create_oom) {
  world w;
  world_open(&w);
  char err[512];
  int failures = 0;
  for (long n = 1; n < 10000; n++) {
    err[0] = 0;
    fail_alloc_arm(n);
    trainer *t = trainer_create(w.plan, w.store, &w.cfg, &w.oc, 1, err, sizeof err);
    long failed = fail_alloc_failed;
    fail_alloc_arm(0);
    if (!failed) { /* every allocation of it has been failed once */
      ck_assert_ptr_nonnull(t);
      trainer_destroy(t);
      break;
    }
    ck_assert_msg(t == NULL, "allocation %ld failed and trainer_create still succeeded", n);
    ck_assert_msg(strstr(err, "out of memory") != NULL, "allocation %ld: '%s'", n, err);
    failures++;
  }
  ck_assert_int_gt(failures, 5);
  world_close(&w);
}
END_TEST

/* trainer_lookup_early's buffers are made at its first call: any of them
 * failing leaves the trainer as it was, so the retry allocates them all and
 * the prefetched step runs (before, a retry found pcap set and prows NULL). */
START_TEST(test_prefetch_retry_after_oom) {
  world w;
  world_open(&w);
  char err[512];
  ds_batch b, next;
  ck_assert_int_eq(ds_batch_init(&b, 8), 0);
  ck_assert_int_eq(ds_batch_init(&next, 8), 0);
  batch_fill(&b, 8, 0);
  batch_fill(&next, 8, 3);
  for (long n = 1; n <= 5; n++) {
    trainer *t = trainer_create(w.plan, w.store, &w.cfg, &w.oc, 1, err, sizeof err);
    ck_assert_ptr_nonnull(t);
    fail_alloc_arm(n);
    int rc = trainer_lookup_early(t, &next, 1);
    fail_alloc_arm(0);
    ck_assert_int_eq(rc, SR_ENOMEM);
    ck_assert_ptr_nonnull(strstr(trainer_errmsg(t), "out of memory"));
    ck_assert_int_eq(trainer_lookup_early(t, &next, 1), 0);
    float loss0 = 0, loss1 = 0;
    ck_assert_int_eq(trainer_step(t, &b, 0, 0.1f, 0.1f, &loss0), 0); /* begins next's lookup */
    ck_assert_int_eq(trainer_step(t, &next, 1, 0.1f, 0.1f, &loss1), 0); /* uses it */
    ck_assert(loss0 > 0 && loss1 > 0);
    trainer_destroy(t);
  }
  ds_batch_free(&b);
  ds_batch_free(&next);
  world_close(&w);
}
END_TEST

/* job_batches_init with its Nth allocation failing: SR_ENOMEM, and the
 * half-made buffers are freed by job_batches_free. */
START_TEST(test_job_batches_oom) {
  int failures = 0;
  for (long n = 1; n < 1000; n++) {
    job_batches q;
    fail_alloc_arm(n);
    int rc = job_batches_init(&q, 64, 1, 3, 1);
    long failed = fail_alloc_failed;
    fail_alloc_arm(0);
    job_batches_free(&q);
    if (!failed) {
      ck_assert_int_eq(rc, 0);
      break;
    }
    ck_assert_int_eq(rc, SR_ENOMEM);
    failures++;
  }
  ck_assert_int_ge(failures, 4); /* four batches, each several buffers */
}
END_TEST

int main(void) {
  Suite *s = suite_create("train_alloc");
  TCase *tc = tcase_create("oom");
  tcase_add_test(tc, test_trainer_create_oom);
  tcase_add_test(tc, test_prefetch_retry_after_oom);
  tcase_add_test(tc, test_job_batches_oom);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
