/* The shard store (embedding/shard.h) when RocksDB fails: writes
 * (kv_writes_commit) and reads (kv_reader_get_sorted_cf, the MultiGets of
 * the misses) fail at the N-th call, by wrapping them at link time
 * (tests/CMakeLists.txt, WRAP).
 *
 * Asserts: a remove whose delete fails in the second of two databases
 * returns the failure naming the shards whose rows were removed and those
 * whose rows were kept; the first shard's rows read their init value, in
 * the cache and after being evicted (none written back over its delete),
 * the second shard's rows their pushed values, evicted or not; the next
 * checkpoint_delta lists as removed exactly the first shard's rows; the
 * same removal again removes the rest. A push larger than a chunk whose
 * read fails part way changes no row, or leaves every later call refused
 * until a restore. */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "embedding/removed_file.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"
#include "tests/embedding/shard_fixture.h"

#define NT FX_NT
#define DIM 8
static const uint64_t ROWS[NT] = {200000, 600, 0};

/* Injected failures: the fail_*-th call from now fails (0: none). */
static int commit_calls, commit_fail_at, get_calls, get_fail_at;

int __real_kv_writes_commit(kv_writes *w, kv_db *d, char *err, size_t errlen);
int __wrap_kv_writes_commit(kv_writes *w, kv_db *d, char *err, size_t errlen) {
  if (commit_fail_at && ++commit_calls == commit_fail_at) {
    snprintf(err, errlen, "injected write failure");
    return SR_EIO;
  }
  return __real_kv_writes_commit(w, d, err, errlen);
}

int __real_kv_reader_get_sorted_cf(kv_reader *r, kv_db *d, int cf, size_t n, const uint64_t *keys,
                                   const char **vals, size_t *lens, char *err, size_t errlen);
int __wrap_kv_reader_get_sorted_cf(kv_reader *r, kv_db *d, int cf, size_t n, const uint64_t *keys,
                                   const char **vals, size_t *lens, char *err, size_t errlen) {
  if (get_fail_at && ++get_calls == get_fail_at) {
    snprintf(err, errlen, "injected read failure");
    return SR_EIO;
  }
  return __real_kv_reader_get_sorted_cf(r, d, cf, n, keys, vals, lens, err, errlen);
}

/* Table 0's ids ids[n] as an id set (the other tables empty). */
typedef struct {
  const uint64_t *idp[NT];
  size_t counts[NT];
  emb_idset set;
} one_table;

static void one_make(one_table *o, const uint64_t *ids, size_t n) {
  memset(o, 0, sizeof *o);
  o->idp[0] = ids;
  o->counts[0] = n;
  o->set = (emb_idset){NT, o->idp, o->counts};
}

static int lookup0(emb_store *s, int64_t step, const uint64_t *ids, size_t n, float *out) {
  one_table o;
  one_make(&o, ids, n);
  float junk[1], *outs[NT] = {out, junk, junk};
  int rc = emb_store_lookup_begin(s, step, &o.set, outs);
  return rc ? rc : emb_store_lookup_wait(s);
}

static int push0(emb_store *s, int64_t step, const uint64_t *ids, size_t n, float g) {
  one_table o;
  one_make(&o, ids, n);
  float *gr = malloc(n * DIM * sizeof *gr), junk[1];
  ck_assert_ptr_nonnull(gr);
  for (size_t i = 0; i < n * DIM; i++) gr[i] = g + (float)(i % 7) * 0.01f;
  const float *grads[NT] = {gr, junk, junk};
  int rc = emb_store_push(s, step, 0.1f, &o.set, grads);
  free(gr);
  return rc;
}

#define NR 64       /* rows removed */
#define NOTHER 8000 /* rows that evict them */

START_TEST(test_remove_fails_in_second_database) {
  emb_plan *p = fx_plan(ROWS, DIM, 11, EMB_OPT_ADAGRAD, 2, 1);
  char *dir = tmpdir_make("rmfail");
  emb_store *s = fx_shard(p, tmp_join(dir, "a"), 1024, -1);
  emb_store *fresh = fx_shard(p, tmp_join(dir, "f"), 1024, -1);
  static uint64_t ids[NR], other[NOTHER];
  static float init[NR * DIM], pushed[NR * DIM], got[NR * DIM], junk[250 * DIM];
  for (int i = 0; i < NR; i++) ids[i] = (uint64_t)i;
  for (int i = 0; i < NOTHER; i++) other[i] = 10000 + (uint64_t)i;
  ck_assert_int_eq(lookup0(fresh, 0, ids, NR, init), 0);
  int64_t step = 0;
  ck_assert_msg(push0(s, step++, ids, NR, 1.0f) == 0, "%s", emb_store_errmsg(s));
  ck_assert_msg(emb_store_checkpoint(s, tmp_join(dir, "ck")) == 0, "%s", emb_store_errmsg(s));
  /* pushed again: dirty in the cache and in the change set */
  ck_assert_msg(push0(s, step++, ids, NR, -0.5f) == 0, "%s", emb_store_errmsg(s));
  ck_assert_int_eq(lookup0(s, step++, ids, NR, pushed), 0);

  one_table rm;
  one_make(&rm, ids, NR);
  commit_calls = 0;
  commit_fail_at = 2; /* the second database's WriteBatch */
  int rc = emb_store_remove(s, step++, &rm.set);
  commit_fail_at = 0;
  ck_assert_int_eq(rc, SR_EIO);
  const char *msg = emb_store_errmsg(s);
  ck_assert_msg(strstr(msg, "shard 1: injected write failure") &&
                    strstr(msg, "shards 0 were removed") && strstr(msg, "shards 1 kept"),
                "%s", msg);

  size_t n_first = 0;
  for (int pass = 0; pass < 2; pass++) { /* cached, then after eviction */
    ck_assert_int_eq(lookup0(s, step++, ids, NR, got), 0);
    for (int i = 0; i < NR; i++) {
      const int first = emb_plan_shard_of(p, 0, ids[i]) == 0;
      n_first += (size_t)(first && !pass);
      const float *want = first ? init + i * DIM : pushed + i * DIM;
      ck_assert_msg(!memcmp(got + i * DIM, want, DIM * sizeof(float)),
                    "row %d (shard %d) %s: %g, not its %s value %g", i, !first,
                    pass ? "after eviction" : "cached", (double)got[i * DIM],
                    first ? "init" : "pushed", (double)want[0]);
    }
    for (int k = 0; k < NOTHER / 250 && !pass; k++)
      ck_assert_int_eq(lookup0(s, step++, other + 250 * k, 250, junk), 0);
  }
  ck_assert(n_first > 0 && n_first < NR);

  /* the delta lists as removed the first shard's rows, and only those */
  ck_assert_msg(emb_store_checkpoint_delta(s, tmp_join(dir, "d")) == 0, "%s", emb_store_errmsg(s));
  char fp[EMB_FP_HEX], path[4096], err[1024];
  ck_assert_int_eq(emb_plan_model_fingerprint(p, fp), 0);
  ck_assert_int_eq(ckpt_dir_removed_file(tmp_join(dir, "d"), p->tables[0].table_id, path, sizeof path), 0);
  uint64_t *listed;
  size_t n_listed;
  ck_assert_msg(emb_rmfile_read(path, &p->tables[0], fp, &listed, &n_listed, err, sizeof err) == 0,
                "%s", err);
  ck_assert_uint_eq(n_listed, n_first);
  for (size_t k = 0; k < n_listed; k++)
    ck_assert_msg(emb_plan_shard_of(p, 0, listed[k]) == 0, "row %llu listed as removed",
                  (unsigned long long)listed[k]);
  free(listed);

  /* the same removal again removes the rest */
  ck_assert_msg(emb_store_remove(s, step++, &rm.set) == 0, "%s", emb_store_errmsg(s));
  ck_assert_int_eq(lookup0(s, step++, ids, NR, got), 0);
  ck_assert(!memcmp(got, init, sizeof got));

  emb_store_destroy(s);
  emb_store_destroy(fresh);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

#define NP 1500 /* rows pushed: three chunks of a 1024-row cache */

/* A call other than restore refused with the push's failure. */
static void assert_refused(emb_store *s, int rc, const char *what) {
  ck_assert_msg(rc != 0, "%s after a push applied in part: accepted", what);
  const char *msg = emb_store_errmsg(s);
  ck_assert_msg(strstr(msg, "injected read failure") && strstr(msg, "until a restore"),
                "%s: %s", what, msg);
}

/* A push larger than a chunk whose f-th MultiGet fails, for f from 1 on
 * until the push meets no failure: either no row changed, or every later
 * lookup, push, flush, checkpoint, remove and clean stop is refused,
 * naming the read failure, until a restore, after which the store holds
 * the checkpoint's rows (and works). Both cases are met. */
START_TEST(test_push_fails_part_way) {
  emb_plan *p = fx_plan(ROWS, DIM, 11, EMB_OPT_ADAGRAD, 1, 0);
  char *dir = tmpdir_make("pushfail");
  emb_store *fresh = fx_shard(p, tmp_join(dir, "f"), 4096, -1);
  static uint64_t ids[NP];
  static float init[NP * DIM], got[NP * DIM];
  for (int i = 0; i < NP; i++) ids[i] = (uint64_t)i * 7;
  ck_assert_int_eq(lookup0(fresh, 0, ids, NP, init), 0);
  emb_store_destroy(fresh);
  int unchanged = 0, refused = 0;
  for (int f = 1;; f++) {
    char sub[32];
    snprintf(sub, sizeof sub, "s%d", f);
    char *d = strdup(tmp_join(dir, sub)), ck[4096];
    snprintf(ck, sizeof ck, "%s.ck", d);
    emb_store *s = fx_shard(p, d, 1024, -1); /* chunk 512 */
    ck_assert_msg(emb_store_checkpoint(s, ck) == 0, "%s", emb_store_errmsg(s));
    get_calls = 0;
    get_fail_at = f;
    int rc = push0(s, 1, ids, NP, 1.0f);
    const int reached = get_calls >= f;
    get_fail_at = 0;
    if (!reached) {
      ck_assert_msg(rc == 0, "%s", emb_store_errmsg(s));
      emb_store_destroy(s);
      free(d);
      break;
    }
    ck_assert_int_ne(rc, 0);
    rc = lookup0(s, 2, ids, NP, got);
    if (!rc) {
      ck_assert_msg(!memcmp(got, init, sizeof got), "read failure %d: rows changed", f);
      unchanged++;
    } else {
      refused++;
      assert_refused(s, rc, "lookup");
      assert_refused(s, push0(s, 3, ids, 10, 1.0f), "push");
      assert_refused(s, emb_store_flush(s), "flush");
      assert_refused(s, emb_store_checkpoint(s, tmp_join(dir, "ck2")), "checkpoint");
      one_table o;
      one_make(&o, ids, 10);
      assert_refused(s, emb_store_remove(s, 4, &o.set), "remove");
      assert_refused(s, emb_shard_mark_clean(s), "mark_clean");
      ck_assert_msg(emb_store_restore(s, ck) == 0, "%s", emb_store_errmsg(s));
      ck_assert_msg(lookup0(s, 5, ids, NP, got) == 0, "%s", emb_store_errmsg(s));
      ck_assert_msg(!memcmp(got, init, sizeof got), "restored rows differ");
      ck_assert_msg(push0(s, 6, ids, NP, 1.0f) == 0, "%s", emb_store_errmsg(s));
    }
    emb_store_destroy(s);
    sr_rmtree(d);
    sr_rmtree(ck);
    free(d);
  }
  ck_assert_msg(unchanged > 0 && refused > 0, "failures with no row changed %d, refused %d",
                unchanged, refused);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("emb_shard_faults");
  TCase *tc = tcase_create("faults");
  tcase_add_test(tc, test_remove_fails_in_second_database);
  tcase_add_test(tc, test_push_fails_part_way);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
