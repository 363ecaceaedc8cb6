/* train/keep.h: the bounded tables' decisions, step by step, on batches
 * made here.
 *
 * Asserts: an id gets a row in the step whose batch brings its samples to
 * admit_after (two samples of one batch count twice), not before; a count
 * under admit_after is forgotten after admit_window steps without its id;
 * an admitted id is expired at the first boundary with last <= step -
 * expire_after, not one step earlier; above capacity lru removes the
 * oldest last first, ties to the lowest row id, and lfu the fewest samples
 * first; removed ids come out in ascending order and count from zero when
 * seen again; a table without bounds has a row for every id and is never
 * decided on; the figures (admitted, refused, expired, evicted, rows)
 * follow; keep_save then keep_load gives back entries that decide as the
 * saved ones do, and a file with a flipped byte, or of another plan, is
 * refused, naming the file, with the entries unchanged. */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "datasets/batch.h"
#include "embedding/plan.h"
#include "tests/support/files.h"
#include "train/keep.h"

static emb_plan *plan_of(emb_keep_cfg k) {
  uint64_t rows[2] = {1000, 1000};
  emb_plan_params pp = {.n_tables = 2, .rows = rows, .dim = 4, .optim = {.eps = -1},
                        .seed = 1, .n_shards = 1};
  emb_plan *p;
  char err[256];
  ck_assert_int_eq(emb_plan_create(&pp, &p, err, sizeof err), 0);
  p->tables[0].keep = k; /* table 1: no bounds */
  return p;
}

/* A batch of n samples whose feature 0 and 1 hold ids[i] (one id each). */
static void batch_of(ds_batch *b, const uint64_t *ids, int n) {
  ck_assert_int_eq(ds_batch_reserve_ids(b, (size_t)n * 2), 0);
  b->n = n;
  for (int f = 0; f < 2; f++) {
    uint32_t *off = ds_batch_offsets(b, f);
    for (int i = 0; i <= n; i++) off[i] = (uint32_t)(f * n + i);
    for (int i = 0; i < n; i++) b->ids[f * n + i] = ids[i];
  }
}

static void observe(keep *k, ds_batch *b, int64_t step, const uint64_t *ids, int n) {
  batch_of(b, ids, n);
  ck_assert_int_eq(keep_observe(k, b, step), 0);
}

/* The ids decided at step's boundary for table 0 are want[n] (in order). */
static void decide_is(keep *k, int64_t step, const uint64_t *want, size_t n) {
  emb_idset gone;
  ck_assert_int_eq(keep_decide(k, step, &gone), 0);
  ck_assert_int_eq(gone.counts[1], 0);
  ck_assert_msg(gone.counts[0] == n, "step %lld: %zu ids removed, not %zu", (long long)step,
                gone.counts[0], n);
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(gone.ids[0][i] == want[i], "step %lld: removed[%zu] = %llu, not %llu",
                  (long long)step, i, (unsigned long long)gone.ids[0][i],
                  (unsigned long long)want[i]);
}

START_TEST(test_admit_expire) {
  emb_plan *p = plan_of((emb_keep_cfg){.admit_after = 2, .admit_window = 3, .expire_after = 3});
  char err[256];
  keep *k = keep_create(p, err, sizeof err);
  ds_batch b;
  ck_assert_int_eq(ds_batch_init(&b, 8), 0);
  observe(k, &b, 0, (const uint64_t[]){5, 7, 7, 9}, 4);
  ck_assert(!keep_has_row(k, 0, 5));
  ck_assert(keep_has_row(k, 0, 7)); /* two samples in one batch */
  ck_assert(keep_has_row(k, 1, 5)); /* no bounds: every id */
  decide_is(k, 0, NULL, 0);
  observe(k, &b, 1, (const uint64_t[]){5}, 1);
  ck_assert(keep_has_row(k, 0, 5));
  decide_is(k, 1, NULL, 0);
  decide_is(k, 2, NULL, 0);
  decide_is(k, 3, (const uint64_t[]){7}, 1); /* last 0 <= 3 - 3; 9's count forgotten */
  decide_is(k, 4, (const uint64_t[]){5}, 1);
  ck_assert(!keep_has_row(k, 0, 7));
  keep_table_stats st = keep_stats(k, 0);
  ck_assert_uint_eq(st.admitted, 2);
  ck_assert_uint_eq(st.refused, 2); /* 5 and 9 at step 0 */
  ck_assert_uint_eq(st.expired, 2);
  ck_assert_uint_eq(st.rows, 0);
  ck_assert_uint_eq(st.counting, 0);
  observe(k, &b, 5, (const uint64_t[]){9, 7}, 2); /* counts from zero again */
  ck_assert(!keep_has_row(k, 0, 9) && !keep_has_row(k, 0, 7));
  keep_destroy(k);
  ds_batch_free(&b);
  emb_plan_free(p);
}
END_TEST

START_TEST(test_capacity_lru_lfu) {
  for (int lfu = 0; lfu < 2; lfu++) {
    emb_plan *p = plan_of((emb_keep_cfg){.capacity = 3, .evict = lfu ? EMB_EVICT_LFU : EMB_EVICT_LRU});
    char err[256];
    keep *k = keep_create(p, err, sizeof err);
    ds_batch b;
    ck_assert_int_eq(ds_batch_init(&b, 8), 0);
    observe(k, &b, 0, (const uint64_t[]){40, 40, 40, 30}, 4);
    decide_is(k, 0, NULL, 0);
    observe(k, &b, 1, (const uint64_t[]){13, 12, 11}, 3);
    /* 5 rows, 3 kept. lru: 30 and 40 (step 0), 30 first. lfu: one sample
     * each but 40's three: 30 (oldest), then 11 (lowest id of step 1). */
    if (lfu) decide_is(k, 1, (const uint64_t[]){11, 30}, 2);
    else decide_is(k, 1, (const uint64_t[]){30, 40}, 2);
    ck_assert_uint_eq(keep_stats(k, 0).evicted, 2);
    ck_assert_uint_eq(keep_stats(k, 0).rows, 3);
    keep_destroy(k);
    ds_batch_free(&b);
    emb_plan_free(p);
  }
}
END_TEST

START_TEST(test_save_load) {
  emb_plan *p = plan_of((emb_keep_cfg){.admit_after = 2, .expire_after = 2, .capacity = 2});
  char err[512], *dir = tmpdir_make("keep");
  keep *k = keep_create(p, err, sizeof err), *k2 = keep_create(p, err, sizeof err);
  ds_batch b;
  ck_assert_int_eq(ds_batch_init(&b, 8), 0);
  observe(k, &b, 0, (const uint64_t[]){1, 1, 2, 2, 3, 4}, 6);
  decide_is(k, 0, NULL, 0);
  observe(k, &b, 1, (const uint64_t[]){3, 5}, 2);
  const char *path = tmp_join(dir, KEEP_FILE);
  ck_assert_msg(keep_save(k, path, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(keep_load(k2, path, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(keep_stats(k2, 0).refused, keep_stats(k, 0).refused);
  /* The same decisions from here on. */
  decide_is(k, 1, (const uint64_t[]){1}, 1);
  decide_is(k2, 1, (const uint64_t[]){1}, 1);
  decide_is(k, 3, (const uint64_t[]){2, 3}, 2);
  decide_is(k2, 3, (const uint64_t[]){2, 3}, 2);
  /* Damaged: refused, k2 as it was (holding nothing now). */
  size_t n;
  unsigned char *bytes = (unsigned char *)slurp_file(path, &n, 1);
  bytes[20] ^= 1;
  file_put_bytes(path, bytes, n);
  free(bytes);
  ck_assert_int_eq(keep_load(k2, path, err, sizeof err), SR_ECHECKSUM);
  ck_assert_msg(strstr(err, path) != NULL, "%s", err);
  ck_assert_uint_eq(keep_stats(k2, 0).rows, 0);
  ck_assert_uint_eq(keep_stats(k2, 0).expired, 2);
  /* Another plan: its bounded table is not this one's. */
  emb_plan *q = plan_of((emb_keep_cfg){0});
  q->tables[1].keep.expire_after = 3;
  keep *k3 = keep_create(q, err, sizeof err);
  ck_assert_int_eq(keep_save(k, path, err, sizeof err), 0);
  ck_assert_int_eq(keep_load(k3, path, err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "not a bounded table") != NULL, "%s", err);
  keep_destroy(k3);
  emb_plan_free(q);
  keep_destroy(k);
  keep_destroy(k2);
  ds_batch_free(&b);
  emb_plan_free(p);
  free(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("train_keep");
  TCase *tc = tcase_create("keep");
  tcase_add_test(tc, test_admit_expire);
  tcase_add_test(tc, test_capacity_lru_lfu);
  tcase_add_test(tc, test_save_load);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
