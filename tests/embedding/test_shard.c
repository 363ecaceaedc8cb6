/* Tests for the shard store (embedding/shard.h): a bounded row cache over
 * RocksDB, checked bit for bit against the in-process local store. */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/rng.h"
#include "common/status.h"
#include "embedding/optim.h"
#include "embedding/shard.h"
#include "embedding/shard_impl.h"
#include "embedding/store.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"
#include "tests/embedding/shard_fixture.h"
#include "tests/embedding/nonfinite.h"

#define NT 3
static const uint64_t ROWS[NT] = {5000, 300, 0}; /* bounded, small bounded, unbounded */
#define MAXB 900

static emb_plan *make_plan(emb_optim_kind k, int n_shards, int row_wise) {
  return fx_plan(ROWS, 8, 99, k, n_shards, row_wise);
}

static char *tmpdir(void) { return tmpdir_make("shard"); }

static emb_store *make_shard(const emb_plan *p, const char *dir, uint64_t cache_rows) {
  return fx_shard(p, dir, cache_rows, 0);
}

typedef struct {
  uint64_t ids[NT][MAXB];
  size_t counts[NT];
  const uint64_t *idp[NT];
  float grads[NT][MAXB * 8];
  const float *gp[NT];
  float out[NT][MAXB * 8], out2[NT][MAXB * 8];
  float *op[NT], *op2[NT];
  emb_idset set;
} step_data;

/* Unique ids, skewed so some rows come back often. */
static void make_step(step_data *d, sr_rng *r, size_t n, const emb_plan *p) {
  for (int t = 0; t < NT; t++) {
    size_t c = fx_step_ids(r, ROWS[t], t == 1 ? n / 4 : n, d->ids[t]);
    d->counts[t] = c;
    d->idp[t] = d->ids[t];
    for (size_t k = 0; k < c * (size_t)p->tables[t].dim; k++)
      d->grads[t][k] = (float)(sr_rng_uniform(r) - 0.5);
    d->gp[t] = d->grads[t];
    d->op[t] = d->out[t];
    d->op2[t] = d->out2[t];
  }
  d->set.n_tables = NT;
  d->set.ids = d->idp;
  d->set.counts = d->counts;
}

static void lookup_both(emb_store *a, emb_store *b, step_data *d, const emb_plan *p) {
  ck_assert_int_eq(emb_store_lookup_begin(a, 0, &d->set, d->op), 0);
  ck_assert_int_eq(emb_store_lookup_wait(a), 0);
  int rc = emb_store_lookup_begin(b, 0, &d->set, d->op2);
  ck_assert_msg(rc == 0, "%s", emb_store_errmsg(b));
  ck_assert_int_eq(emb_store_lookup_wait(b), 0);
  for (int t = 0; t < NT; t++)
    ck_assert_msg(!memcmp(d->out[t], d->out2[t], d->counts[t] * (size_t)p->tables[t].dim * 4),
                  "table %d rows differ from the local store", t);
}

static void push_both(emb_store *a, emb_store *b, step_data *d, float lr) {
  ck_assert_int_eq(emb_store_push(a, 0, lr, &d->set, d->gp), 0);
  int rc = emb_store_push(b, 0, lr, &d->set, d->gp);
  ck_assert_msg(rc == 0, "%s", emb_store_errmsg(b));
}

typedef struct {
  uint64_t n, sum_bits;
  uint64_t ids[32768];
  float vals[32768][16];
} collect;

static int collect_fn(void *ctx, int table, uint64_t id, const float *v, int dim, const float *st,
                      int sl) {
  (void)table;
  collect *c = ctx;
  if (c->n < 32768) {
    c->ids[c->n] = id;
    memcpy(c->vals[c->n], v, 4 * (size_t)dim);
    if (sl) memcpy(c->vals[c->n] + dim, st, 4 * (size_t)sl);
  }
  c->n++;
  return 0;
}

static void compare_iterate(emb_store *a, emb_store *b, const emb_plan *p) {
  static collect ca, cb;
  for (int t = 0; t < NT; t++) {
    memset(&ca, 0, sizeof ca);
    memset(&cb, 0, sizeof cb);
    ck_assert_int_eq(emb_store_iterate(a, t, collect_fn, &ca), 0);
    int rc = emb_store_iterate(b, t, collect_fn, &cb);
    ck_assert_msg(rc == 0, "%s", emb_store_errmsg(b));
    ck_assert_uint_eq(ca.n, cb.n);
    ck_assert(ca.n <= 32768);
    int w = p->tables[t].dim + emb_optim_state_len(&p->tables[t].optim, p->tables[t].dim);
    for (uint64_t i = 0; i < ca.n; i++) {
      ck_assert_uint_eq(ca.ids[i], cb.ids[i]);
      if (i) ck_assert(cb.ids[i] > cb.ids[i - 1]);
      ck_assert_msg(!memcmp(ca.vals[i], cb.vals[i], 4 * (size_t)w), "table %d row %llu differs", t,
                    (unsigned long long)ca.ids[i]);
    }
  }
}

/* Many evict/reload cycles: a 1024-row cache under ~1800 unique rows a step
 * over ~25k rows; every value matches the local store, step after step. */
static void pressure(emb_optim_kind k, int n_shards, int row_wise) {
  emb_plan *p = make_plan(k, n_shards, row_wise);
  char *dir = tmpdir();
  emb_store *loc, *sh;
  char err[256];
  loc = emb_store_create_local(p, err, sizeof err);
  sh = make_shard(p, dir, 1024);
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 7, (uint64_t)k);
  for (int step = 0; step < 40; step++) {
    make_step(&d, &r, step % 3 == 0 ? 800 : 300, p);
    lookup_both(loc, sh, &d, p);
    push_both(loc, sh, &d, 0.05f);
  }
  emb_shard_counters c;
  emb_shard_counters_get(sh, &c);
  ck_assert_msg(c.evictions > 10000 && c.writebacks > 5000 && c.rocks_found > 1000,
                "too little pressure: %llu evictions %llu writebacks %llu found",
                (unsigned long long)c.evictions, (unsigned long long)c.writebacks,
                (unsigned long long)c.rocks_found);
  /* The cache's figures through the store interface are these counters. */
  emb_store_figures g;
  ck_assert_int_eq(emb_store_figures_get(sh, &g), 0);
  ck_assert_uint_eq(g.evictions, c.evictions);
  ck_assert_uint_eq(g.cache_rows, c.cache_rows);
  ck_assert_uint_eq(g.cache_used, c.cache_used);
  /* Every row, as read back after all the cycles. */
  compare_iterate(loc, sh, p);
  /* And again through a fresh store over the same folder (durable). */
  ck_assert_int_eq(emb_store_flush(sh), 0);
  emb_store_destroy(sh);
  sh = make_shard(p, dir, 4096);
  compare_iterate(loc, sh, p);
  for (int step = 0; step < 5; step++) {
    make_step(&d, &r, 600, p);
    lookup_both(loc, sh, &d, p);
    push_both(loc, sh, &d, 0.05f);
  }
  compare_iterate(loc, sh, p);
  emb_store_destroy(sh);
  emb_store_destroy(loc);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}

START_TEST(test_pressure_adagrad) { pressure(EMB_OPT_ADAGRAD, 1, 0); }
END_TEST
START_TEST(test_pressure_rowwise_sharded) { pressure(EMB_OPT_ROWWISE_ADAGRAD, 3, 1); }
END_TEST
START_TEST(test_pressure_sgd_tablewise) { pressure(EMB_OPT_SGD, 2, 0); }
END_TEST

/* A row evicted twice before its write set goes is written once, its
 * newest record: two groups of 1024 rows taking turns in a cache of 1024,
 * four rounds of pushes, every evicted record held in the write buffers
 * (4 MiB) until the flush. The flush writes those 3072 records of 2048
 * rows as one set, then the 1024 dirty rows the cache holds as another:
 * 3072 rows written of 4096 records handed over. Every row reads back as
 * the local store's. */
START_TEST(test_twice_evicted_written_once) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 1, 0);
  char *dir = tmpdir(), err[1024];
  emb_shard_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cache_rows = 1024;
  cfg.write_buffer_bytes = 4 << 20;
  emb_store *sh = emb_store_create_shard(p, dir, &cfg, err, sizeof err);
  ck_assert_msg(sh != NULL, "%s", err);
  emb_store *loc = emb_store_create_local(p, err, sizeof err);
  ck_assert_ptr_nonnull(loc);
  static step_data d;
  for (int t = 0; t < NT; t++) d.idp[t] = d.ids[t], d.gp[t] = d.grads[t], d.op[t] = d.out[t];
  for (int t = 0; t < NT; t++) d.op2[t] = d.out2[t], d.counts[t] = 0;
  d.set = (emb_idset){NT, d.idp, d.counts};
  d.counts[0] = 512;
  for (int step = 0; step < 16; step++) { /* rounds of 4 steps: a group in two halves, twice */
    const uint64_t first = (uint64_t)((step / 4) % 2) * 1024 + (uint64_t)(step % 2) * 512;
    for (size_t k = 0; k < 512; k++) d.ids[0][k] = first + k;
    for (size_t k = 0; k < 512 * 8; k++) d.grads[0][k] = 0.01f * (float)(step + 1) + 1e-5f * (float)k;
    ck_assert_int_eq(emb_store_push(sh, step, 0.1f, &d.set, d.gp), 0);
    ck_assert_int_eq(emb_store_push(loc, step, 0.1f, &d.set, d.gp), 0);
  }
  emb_shard_counters c;
  emb_shard_counters_get(sh, &c);
  ck_assert_uint_eq(c.wb_rows, 0); /* nothing written yet: the buffers hold every record */
  ck_assert_uint_eq(c.writebacks, 3072);
  ck_assert_int_eq(emb_store_flush(sh), 0);
  emb_shard_counters_get(sh, &c);
  ck_assert_uint_eq(c.writebacks, 4096);
  ck_assert_uint_eq(c.wb_rows, 3072);
  for (int part = 0; part < 4; part++) {
    for (size_t k = 0; k < 512; k++) d.ids[0][k] = (uint64_t)part * 512 + k;
    lookup_both(loc, sh, &d, p);
  }
  emb_store_destroy(sh);
  emb_store_destroy(loc);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

/* A cache larger than the rows touched writes nothing until a flush. */
START_TEST(test_big_cache_writes_nothing) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 1, 0);
  char *dir = tmpdir();
  emb_store *sh = make_shard(p, dir, 200000);
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 3, 3);
  for (int step = 0; step < 10; step++) {
    make_step(&d, &r, 400, p);
    ck_assert_int_eq(emb_store_lookup_begin(sh, 0, &d.set, d.op2), 0);
    ck_assert_int_eq(emb_store_push(sh, 0, 0.1f, &d.set, d.gp), 0);
  }
  emb_shard_counters c;
  emb_shard_counters_get(sh, &c);
  ck_assert_uint_eq(c.evictions, 0);
  ck_assert_uint_eq(c.writebacks, 0);
  ck_assert_int_eq(emb_store_flush(sh), 0);
  emb_shard_counters_get(sh, &c);
  ck_assert_uint_gt(c.writebacks, 1000);
  emb_store_destroy(sh);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

/* Step's lookup of d's rows from st (pinned: read in place, as a server's
 * answer is, into no buffer of d's), then its push. */
static void lookup_push(emb_store *st, int64_t step, step_data *d, int pinned) {
  if (pinned) {
    static const float *rp[NT][MAXB];
    const float **rows[NT] = {rp[0], rp[1], rp[2]};
    emb_pins *pins = NULL;
    ck_assert_int_eq(st->ops->lookup_pinned(st, step, &d->set, rows, &pins), 0);
    st->ops->pins_release(pins);
  } else {
    ck_assert_int_eq(emb_store_lookup_begin(st, step, &d->set, d->op), 0);
    ck_assert_int_eq(emb_store_lookup_wait(st), 0);
  }
  ck_assert_int_eq(emb_store_push(st, step, 0.1f, &d->set, d->gp), 0);
}

/* Rows used in many steps stay cached through a run of rows used once
 * that passes twice the cache's size through it (GCLOCK; under CLOCK the
 * hand's second pass evicted them first), and read the same bits as the
 * in-process store's; whether the lookups gather the rows or pin them in
 * place (a server's answers). */
static void often_used_outlast_scan(int pinned) {
  enum { CACHE = 1024, HOT = 256, T = 2 }; /* the unbounded table */
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 1, 0);
  char *dir = tmpdir(), err[256];
  emb_store *sh = make_shard(p, dir, CACHE), *loc = emb_store_create_local(p, err, sizeof err);
  ck_assert_ptr_nonnull(sh);
  ck_assert_ptr_nonnull(loc);
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 9, 9);
  d.counts[0] = d.counts[1] = 0;
  for (int t = 0; t < NT; t++) {
    d.idp[t] = d.ids[t];
    d.gp[t] = d.grads[t];
    d.op[t] = d.out[t];
    d.op2[t] = d.out2[t];
  }
  d.set = (emb_idset){NT, d.idp, d.counts};
  d.counts[T] = HOT;
  for (int step = 0; step < 16; step++) {
    /* 8 steps of the often used rows 0..255, then 8 steps of 256 rows
     * each used once: 2 x CACHE rows */
    uint64_t base = step < 8 ? 0 : 100000 + HOT * (uint64_t)step;
    for (int i = 0; i < HOT; i++) d.ids[T][i] = base + (uint64_t)i;
    for (int k = 0; k < HOT * 8; k++) d.grads[T][k] = (float)(sr_rng_uniform(&r) - 0.5);
    lookup_push(sh, step, &d, pinned);
    lookup_push(loc, step, &d, 0);
  }
  emb_store_stats a, b;
  emb_shard_counters c;
  ck_assert_int_eq(emb_shard_counters_get(sh, &c), 0);
  ck_assert_uint_ge(c.evictions, 4 * HOT); /* the scan did pass through a full cache */
  ck_assert_int_eq(emb_store_stats_get(sh, &a), 0);
  for (int i = 0; i < HOT; i++) d.ids[T][i] = (uint64_t)i;
  ck_assert_int_eq(emb_store_lookup_begin(sh, 99, &d.set, d.op), 0);
  ck_assert_int_eq(emb_store_lookup_wait(sh), 0);
  ck_assert_int_eq(emb_store_lookup_begin(loc, 99, &d.set, d.op2), 0);
  ck_assert_int_eq(emb_store_lookup_wait(loc), 0);
  ck_assert_int_eq(emb_store_stats_get(sh, &b), 0);
  ck_assert_uint_eq(b.lookups - a.lookups, HOT);
  ck_assert_msg(b.hits - a.hits == HOT, "%llu of the %d often used rows were still cached",
                (unsigned long long)(b.hits - a.hits), HOT);
  ck_assert(memcmp(d.out[T], d.out2[T], HOT * 8 * sizeof(float)) == 0);
  emb_store_destroy(sh);
  emb_store_destroy(loc);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
/* Uses of table t's row id counted so far (F_USES; -1: not cached). */
static int uses_of(emb_store *b, uint32_t t, uint64_t id) {
  shstore *s = (shstore *)b;
  uint32_t s1 = s->map[probe(s, key_tag(t, id), t, id)].slot1;
  return s1 ? (int)((slot_meta(s, s1 - 1)->flags & F_USES) / F_USES_ONE) : -1;
}

/* A step's first use of a cached row counts once, whether its prefetch or
 * its lookup (gathered or pinned) meets it first; a row read in, by either,
 * and a push count none. */
START_TEST(test_uses_counted_once_a_step) {
  enum { N = 8, T = 2 };
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 1, 0);
  char *dir = tmpdir();
  emb_store *sh = make_shard(p, dir, 1024);
  static step_data d;
  for (int t = 0; t < NT; t++) {
    d.idp[t] = d.ids[t];
    d.gp[t] = d.grads[t];
    d.op[t] = d.out[t];
    d.counts[t] = t == T ? N : 0;
  }
  d.set = (emb_idset){NT, d.idp, d.counts};
  for (int i = 0; i < N; i++) d.ids[T][i] = 7 + (uint64_t)i;
  memset(d.grads, 0, sizeof d.grads);
  /* step: 0, 1 prefetched then looked up; 2 looked up; 3 looked up pinned */
  const int want[4] = {0, 1, 2, 3};
  for (int step = 0; step < 4; step++) {
    if (step < 2) ck_assert_int_eq(emb_store_prefetch(sh, step, &d.set), 0);
    lookup_push(sh, step, &d, step == 3);
    for (int i = 0; i < N; i++)
      ck_assert_msg(uses_of(sh, T, d.ids[T][i]) == want[step], "step %d: row %d has %d uses",
                    step, i, uses_of(sh, T, d.ids[T][i]));
  }
  emb_store_destroy(sh);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

START_TEST(test_often_used_rows_outlast_a_scan) { often_used_outlast_scan(0); }
END_TEST

START_TEST(test_often_used_rows_outlast_a_scan_pinned) { often_used_outlast_scan(1); }
END_TEST

/* A process that trains 5 steps on a store over dir (every row written
 * back: a flush), marks it clean when `mark`, and dies without closing it
 * (_exit: no destructor, no RocksDB close); what a lookup of the last
 * step's ids gave after its push goes to dir/rows.bin. */
static void crash_after(const emb_plan *p, const char *dir, int mark, step_data *d) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    emb_store *sh = make_shard(p, dir, 200000);
    sr_rng r;
    sr_rng_init(&r, 5, 5);
    for (int step = 0; step < 5; step++) {
      make_step(d, &r, 400, p);
      if (emb_store_lookup_begin(sh, step, &d->set, d->op) || emb_store_lookup_wait(sh) ||
          emb_store_push(sh, step, 0.1f, &d->set, d->gp))
        _exit(3);
    }
    if (emb_store_lookup_begin(sh, 5, &d->set, d->op) || emb_store_lookup_wait(sh) ||
        emb_store_flush(sh) || (mark && emb_shard_mark_clean(sh)))
      _exit(4);
    char path[512];
    snprintf(path, sizeof path, "%s/rows.bin", dir);
    FILE *f = fopen(path, "wb");
    for (int t = 0; t < NT; t++)
      if (!f || fwrite(d->out[t], 4, d->counts[t] * (size_t)p->tables[t].dim, f) !=
                    d->counts[t] * (size_t)p->tables[t].dim)
        _exit(5);
    _exit(fclose(f) ? 6 : 0);
  }
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed: %d", st);
  sr_rng r; /* the child's last step's ids, here too */
  sr_rng_init(&r, 5, 5);
  for (int step = 0; step < 5; step++) make_step(d, &r, 400, p);
}

/* A store that dies after a flush (its rows ingested into RocksDB, on
 * disk) keeps every row, but is seen at the next open as not stopped
 * cleanly (a crash at another moment loses the rows still in its write
 * buffers, and removals skip RocksDB's write-ahead log), and stays so
 * across a clean stop until its rows are accepted
 * (emb_shard_accept_unclean); one that marked itself clean is reopened
 * clean, with every row. One case a test: crash_after forks before this process
 * touches RocksDB (a child forked after would inherit RocksDB's thread
 * pool without its threads, and its flush would wait for ever). */
static void crash_case(int mark) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 1, 0);
  static step_data d;
  char *dir = tmpdir();
  crash_after(p, dir, mark, &d);
  emb_store *sh = make_shard(p, dir, 200000);
  ck_assert_int_eq(emb_shard_unclean(sh), !mark);
  ck_assert_int_eq(emb_store_unclean(sh), !mark); /* the same through the interface */
  char path[512];
  snprintf(path, sizeof path, "%s/rows.bin", dir);
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(emb_store_lookup_begin(sh, 0, &d.set, d.op), 0);
  ck_assert_int_eq(emb_store_lookup_wait(sh), 0);
  for (int t = 0; t < NT; t++) {
    const size_t n = d.counts[t] * (size_t)p->tables[t].dim;
    ck_assert_uint_eq(fread(d.out2[t], 4, n, f), n);
    ck_assert_msg(!memcmp(d.out[t], d.out2[t], n * 4), "table %d: rows lost", t);
  }
  fclose(f);
  if (!mark) {
    /* A clean stop does not make the crash's rows whole: still unclean at
     * the next open, until they are accepted as they are. */
    ck_assert_int_eq(emb_shard_mark_clean(sh), 0);
    emb_store_destroy(sh);
    sh = make_shard(p, dir, 200000);
    ck_assert_int_eq(emb_shard_unclean(sh), 1);
    emb_shard_accept_unclean(sh);
    ck_assert_int_eq(emb_shard_unclean(sh), 0);
    ck_assert_int_eq(emb_shard_mark_clean(sh), 0);
    emb_store_destroy(sh);
    sh = make_shard(p, dir, 200000);
    ck_assert_int_eq(emb_shard_unclean(sh), 0);
  }
  emb_store_destroy(sh);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
START_TEST(test_crash_after_flush_unclean) { crash_case(0); }
END_TEST
START_TEST(test_crash_after_mark_keeps_rows) { crash_case(1); }
END_TEST

/* Checkpoint, change rows, restore: back to the checkpoint's rows, not the
 * live folder's. */
START_TEST(test_checkpoint_restore) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 2, 1);
  char *dir = tmpdir(), *ck = tmpdir();
  char ckp[512];
  snprintf(ckp, sizeof ckp, "%s/shards", ck);
  char err[256];
  emb_store *loc = emb_store_create_local(p, err, sizeof err), *sh = make_shard(p, dir, 1024);
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 5, 5);
  for (int step = 0; step < 10; step++) {
    make_step(&d, &r, 500, p);
    lookup_both(loc, sh, &d, p);
    push_both(loc, sh, &d, 0.05f);
  }
  char lck[512];
  snprintf(lck, sizeof lck, "%s/local", ck);
  ck_assert_int_eq(emb_store_checkpoint(loc, lck), 0);
  int rc = emb_store_checkpoint(sh, ckp);
  ck_assert_msg(rc == 0, "%s", emb_store_errmsg(sh));
  for (int step = 0; step < 5; step++) {
    make_step(&d, &r, 500, p);
    push_both(loc, sh, &d, 0.5f);
  }
  ck_assert_int_eq(emb_store_restore(loc, lck), 0);
  rc = emb_store_restore(sh, ckp);
  ck_assert_msg(rc == 0, "%s", emb_store_errmsg(sh));
  compare_iterate(loc, sh, p);
  make_step(&d, &r, 500, p);
  lookup_both(loc, sh, &d, p);
  /* A missing checkpoint folder is refused and changes nothing. */
  char bad[600];
  snprintf(bad, sizeof bad, "%s/nope", ck);
  ck_assert_int_ne(emb_store_restore(sh, bad), 0);
  ck_assert_ptr_nonnull(strstr(emb_store_errmsg(sh), "nope"));
  lookup_both(loc, sh, &d, p);
  emb_store_destroy(sh);
  emb_store_destroy(loc);
  sr_rmtree(dir);
  sr_rmtree(ck);
  free(dir);
  free(ck);
  emb_plan_free(p);
}
END_TEST

/* The names in folder, sorted, joined by spaces, into buf. */
static void names_in(const char *folder, char *buf, size_t len) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls %s | tr '\\n' ' '", folder);
  FILE *f = popen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = 0;
  pclose(f);
}

/* A restore whose checkpoint cannot become the store's databases: loop 0,
 * a shard folder that cannot be copied (a link to nowhere in it); loop 1,
 * a table file the database open refuses (shard 1's, after shard 0 opened
 * from its copy). The restore fails and leaves the store as it was: every
 * lookup and the rows (the cache's dirty ones too) the local store's that
 * was not restored, nothing left beside the databases; put right, the same
 * checkpoint restores. */
START_TEST(test_failed_restore_keeps_rows) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 2, 1);
  char *dir = tmpdir(), *ck = tmpdir(), ckp[512], lck[512], err[256], names[512];
  snprintf(ckp, sizeof ckp, "%s/shards", ck);
  snprintf(lck, sizeof lck, "%s/local", ck);
  emb_store *loc = emb_store_create_local(p, err, sizeof err), *sh = make_shard(p, dir, 1024);
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 8, 8);
  for (int step = 0; step < 10; step++) {
    make_step(&d, &r, 500, p);
    lookup_both(loc, sh, &d, p);
    push_both(loc, sh, &d, 0.05f);
  }
  ck_assert_int_eq(emb_store_checkpoint(loc, lck), 0);
  ck_assert_msg(emb_store_checkpoint(sh, ckp) == 0, "%s", emb_store_errmsg(sh));
  for (int step = 0; step < 3; step++) { /* rows past the checkpoint, some dirty in the cache */
    make_step(&d, &r, 500, p);
    push_both(loc, sh, &d, 0.5f);
  }
  char bad[1024], kept[1100];
  snprintf(bad, sizeof bad, "%s/shard-1/zz-nowhere", ckp);
  if (_i == 0) {
    ck_assert_int_eq(symlink("/nonexistent/file", bad), 0);
  } else { /* a table file's bytes replaced; the original kept aside */
    char **files;
    int n;
    snprintf(bad, sizeof bad, "%s/shard-1", ckp);
    ck_assert_int_eq(sr_list_dir(bad, &files, &n), 0);
    int k = 0;
    while (k < n && !strstr(files[k], ".sst")) k++;
    ck_assert_int_lt(k, n);
    snprintf(bad, sizeof bad, "%s/shard-1/%s", ckp, files[k]);
    sr_paths_free(files, n);
    snprintf(kept, sizeof kept, "%s.kept", bad);
    ck_assert_int_eq(rename(bad, kept), 0);
    FILE *f = fopen(bad, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 4096; i++) fputc('x', f);
    fclose(f);
  }
  int rc = emb_store_restore(sh, ckp);
  ck_assert_int_ne(rc, 0);
  ck_assert_msg(_i == 1 || strstr(emb_store_errmsg(sh), "zz-nowhere"), "%s", emb_store_errmsg(sh));
  ck_assert_msg(_i == 0 || strstr(emb_store_errmsg(sh), "as they were"), "%s", emb_store_errmsg(sh));
  names_in(dir, names, sizeof names);
  ck_assert_str_eq(names, "shard-0 shard-1 ");
  make_step(&d, &r, 500, p);
  lookup_both(loc, sh, &d, p); /* the rows before the restore, cached or not */
  push_both(loc, sh, &d, 0.05f);
  compare_iterate(loc, sh, p);
  if (_i == 0) ck_assert_int_eq(unlink(bad), 0);
  else ck_assert_int_eq(rename(kept, bad), 0);
  ck_assert_int_eq(emb_store_restore(loc, lck), 0);
  ck_assert_msg(emb_store_restore(sh, ckp) == 0, "%s", emb_store_errmsg(sh));
  compare_iterate(loc, sh, p);
  make_step(&d, &r, 500, p);
  lookup_both(loc, sh, &d, p);
  names_in(dir, names, sizeof names);
  ck_assert_str_eq(names, "shard-0 shard-1 ");
  emb_store_destroy(sh);
  emb_store_destroy(loc);
  sr_rmtree(dir);
  sr_rmtree(ck);
  free(dir);
  free(ck);
  emb_plan_free(p);
}
END_TEST

/* What a restore killed midway leaves, at the next open: a copy beside a
 * whole database (killed while copying) is removed and the marked store
 * opens clean; a database moved aside with nothing in its place (killed
 * between renames) opens unclean, never as an empty shard. */
START_TEST(test_restore_cut_short) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 2, 1);
  char *dir = tmpdir(), tag[SR_TMP_TAG_MAX], dead[SR_TMP_TAG_MAX + 32], path[1024], from[1024],
       names[512];
  ck_assert_int_eq(sr_tmp_tag(tag, sizeof tag), 0);
  long pid;
  unsigned long long start;
  int used = 0;
  ck_assert_int_eq(sscanf(tag, "tmp-%ld-%llu-%n", &pid, &start, &used), 2);
  snprintf(dead, sizeof dead, "tmp-%ld-%llu-%s", pid, start + 1, tag + used); /* owner gone */
  emb_store *sh = make_shard(p, dir, 1024);
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 9, 9);
  make_step(&d, &r, 500, p);
  ck_assert_int_eq(emb_store_push(sh, 0, 0.1f, &d.set, d.gp), 0);
  ck_assert_int_eq(emb_shard_mark_clean(sh), 0);
  emb_store_destroy(sh);
  snprintf(path, sizeof path, "%s/shard-1.%s", dir, dead);
  ck_assert_int_eq(mkdir(path, 0777), 0);
  sh = make_shard(p, dir, 1024);
  ck_assert_int_eq(emb_shard_unclean(sh), 0);
  names_in(dir, names, sizeof names);
  ck_assert_str_eq(names, "shard-0 shard-1 ");
  emb_store_destroy(sh); /* no mark now */
  snprintf(from, sizeof from, "%s/shard-1", dir);
  snprintf(path, sizeof path, "%s/shard-1.old.%s", dir, dead);
  ck_assert_int_eq(rename(from, path), 0);
  sh = make_shard(p, dir, 1024);
  ck_assert_int_eq(emb_shard_unclean(sh), 1);
  names_in(dir, names, sizeof names);
  ck_assert_str_eq(names, "shard-0 shard-1 ");
  emb_store_destroy(sh);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

/* Each store says what it is and what its checkpoint(path) writes, and
 * writes exactly that: the local store a table file per table, the shard
 * store a database per hosted shard and nothing else (so the stores of
 * other shards can write beside it under one path). */
START_TEST(test_kind_and_checkpoint_layout) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 3, 1);
  char *dir = tmpdir(), *ck = tmpdir(), err[1024], got[512], path[600];
  emb_store *loc = emb_store_create_local(p, err, sizeof err);
  emb_shard_config c;
  memset(&c, 0, sizeof c);
  c.cache_rows = 2048;
  int hosted[2] = {2, 0};
  c.n_hosted = 2;
  c.hosted = hosted;
  emb_store *sh = emb_store_create_shard(p, dir, &c, err, sizeof err);
  ck_assert_msg(sh != NULL, "%s", err);
  ck_assert_int_eq(emb_store_kind_of(loc), EMB_STORE_LOCAL);
  ck_assert_int_eq(emb_store_checkpoint_layout(loc), EMB_CKPT_TABLE_FILES);
  ck_assert_int_eq(emb_store_kind_of(sh), EMB_STORE_SHARD);
  ck_assert_int_eq(emb_store_checkpoint_layout(sh), EMB_CKPT_SHARD_FOLDERS);
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 8, 1);
  make_step(&d, &r, 300, p);
  ck_assert_int_eq(emb_store_push(loc, 0, 0.1f, &d.set, d.gp), 0);
  snprintf(path, sizeof path, "%s/local", ck);
  ck_assert_int_eq(emb_store_checkpoint(loc, path), 0);
  names_in(path, got, sizeof got);
  ck_assert_str_eq(got, "table-0.bin table-1.bin table-2.bin ");
  ckpt_shards_layout l;
  ck_assert_int_eq(ckpt_dir_shards_layout(path, &l, err, sizeof err), 0);
  ck_assert_int_eq(l, CKPT_SHARDS_TABLES);
  snprintf(path, sizeof path, "%s/shards", ck);
  ck_assert_msg(emb_store_checkpoint(sh, path) == 0, "%s", emb_store_errmsg(sh));
  names_in(path, got, sizeof got);
  ck_assert_str_eq(got, "shard-0 shard-2 ");
  ck_assert_int_eq(ckpt_dir_shards_layout(path, &l, err, sizeof err), 0);
  ck_assert_int_eq(l, CKPT_SHARDS_DBS);
  emb_store_destroy(sh);
  emb_store_destroy(loc);
  sr_rmtree(dir);
  sr_rmtree(ck);
  free(dir);
  free(ck);
  emb_plan_free(p);
}
END_TEST

/* The shard counters of a shard store; any other store (or none) refused,
 * the output untouched. Through the store interface: the local store has
 * no figures (SR_EUNSUPPORTED, the output untouched) and is never unclean;
 * a fresh shard store's figures are its empty cache's. */
START_TEST(test_counters_refuse_other_kinds) {
  emb_plan *p = make_plan(EMB_OPT_SGD, 1, 0);
  char *dir = tmpdir(), err[256];
  emb_store *loc = emb_store_create_local(p, err, sizeof err), *sh = make_shard(p, dir, 2048);
  emb_shard_counters c, before;
  memset(&c, 0xab, sizeof c);
  before = c;
  ck_assert_int_eq(emb_shard_counters_get(loc, &c), SR_EINVAL);
  ck_assert(memcmp(&c, &before, sizeof c) == 0);
  ck_assert_int_eq(emb_shard_counters_get(NULL, &c), SR_EINVAL);
  ck_assert_int_eq(emb_shard_counters_get(sh, &c), 0);
  ck_assert_uint_eq(c.cache_rows, 2048);
  ck_assert_uint_eq(c.cache_used, 0);
  emb_store_figures g, gbefore;
  memset(&g, 0xab, sizeof g);
  gbefore = g;
  ck_assert_int_eq(emb_store_figures_get(loc, &g), SR_EUNSUPPORTED);
  ck_assert(memcmp(&g, &gbefore, sizeof g) == 0);
  ck_assert_int_eq(emb_store_unclean(loc), 0);
  ck_assert_int_eq(emb_store_figures_get(sh, &g), 0);
  ck_assert_uint_eq(g.cache_rows, 2048);
  ck_assert_uint_eq(g.cache_used, 0);
  ck_assert_uint_eq(g.evictions, 0);
  ck_assert_int_eq(emb_store_unclean(sh), 0);
  emb_store_destroy(sh);
  emb_store_destroy(loc);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

/* A row written with another layout version is refused on read, by name. */
START_TEST(test_row_version_refused) {
  emb_plan *p = make_plan(EMB_OPT_SGD, 1, 0);
  char *dir = tmpdir();
  emb_store *sh = make_shard(p, dir, 2048);
  emb_store_destroy(sh);
  fx_put_future_row(dir, 42);
  sh = make_shard(p, dir, 2048);
  static step_data d;
  memset(&d, 0, sizeof d);
  d.ids[0][0] = 42;
  d.counts[0] = 1;
  for (int t = 0; t < NT; t++) {
    d.idp[t] = d.ids[t];
    d.op[t] = d.out[t];
  }
  d.set.n_tables = NT;
  d.set.ids = d.idp;
  d.set.counts = d.counts;
  ck_assert_int_eq(emb_store_lookup_begin(sh, 0, &d.set, d.op), SR_EVERSION);
  ck_assert_ptr_nonnull(strstr(emb_store_errmsg(sh), "version 9"));
  ck_assert_ptr_nonnull(strstr(emb_store_errmsg(sh), "row 42"));
  emb_store_destroy(sh);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

/* A push is applied whole or not at all: a row that would turn non-finite
 * (after the other rows of the push were updated in place, in the one pass
 * a push of at most a chunk of rows takes) refuses it and leaves every row
 * as it was, with fp32, fp16 and bf16 weights. */
START_TEST(test_push_nonfinite_refused) {
  const emb_optim_kind kinds[] = {EMB_OPT_SGD, EMB_OPT_ADAGRAD, EMB_OPT_ROWWISE_ADAGRAD};
  for (int i = 0; i < 9; i++) {
    emb_plan *p = make_plan(kinds[i % 3], 2, 1);
    for (int t = 0; t < p->n_tables; t++) p->tables[t].precision = (emb_precision)(i / 3);
    char *dir = tmpdir(), *tdir = tmpdir();
    emb_store *s = make_shard(p, dir, EMB_SHARD_MIN_CACHE_ROWS),
              *twin = make_shard(p, tdir, EMB_SHARD_MIN_CACHE_ROWS);
    nonfinite_check(s, twin, p);
    ck_assert_int_eq(emb_store_flush(s), 0);
    ck_assert_int_eq(emb_store_flush(twin), 0);
    emb_store_destroy(s);
    emb_store_destroy(twin);
    /* What reached RocksDB is finite too, and the twin's. */
    s = make_shard(p, dir, EMB_SHARD_MIN_CACHE_ROWS);
    twin = make_shard(p, tdir, EMB_SHARD_MIN_CACHE_ROWS);
    nonfinite_check(s, twin, p);
    emb_store_destroy(s);
    emb_store_destroy(twin);
    sr_rmtree(dir);
    sr_rmtree(tdir);
    free(dir);
    free(tdir);
    emb_plan_free(p);
  }
}
END_TEST

/* A push of more rows than a chunk (half the cache), most of them no
 * longer cached, is checked whole before any row changes: its last row
 * turning non-finite refuses it, and no row changed, in the cache or in
 * RocksDB. */
START_TEST(test_push_nonfinite_refused_in_chunks) {
  for (int prec = EMB_PREC_FP32; prec <= EMB_PREC_BF16; prec++) {
    emb_plan *p = make_plan(EMB_OPT_ROWWISE_ADAGRAD, 1, 0);
    for (int t = 0; t < p->n_tables; t++) p->tables[t].precision = (emb_precision)prec;
    char *dir = tmpdir();
    emb_store *s = make_shard(p, dir, EMB_SHARD_MIN_CACHE_ROWS); /* chunks of 512 rows */
    static step_data d;
    memset(&d, 0, sizeof d);
    for (int t = 0; t < NT; t++) d.idp[t] = d.ids[t], d.gp[t] = d.grads[t], d.op[t] = d.out[t],
                                d.op2[t] = d.out2[t];
    d.counts[0] = MAXB;
    for (size_t r = 0; r < MAXB; r++) d.ids[0][r] = 3 * r;
    for (size_t k = 0; k < MAXB * 8; k++) d.grads[0][k] = 0.01f * (float)(1 + k % 5);
    d.set = (emb_idset){.n_tables = NT, .ids = d.idp, .counts = d.counts};
    ck_assert_msg(emb_store_push(s, 1, 0.1f, &d.set, d.gp) == 0, "%s", emb_store_errmsg(s));
    ck_assert_int_eq(emb_store_lookup_begin(s, 2, &d.set, d.op), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s), 0);
    for (size_t r = 0; r < MAXB; r++) d.ids[0][r] = 3 * r + 1; /* other rows fill the cache */
    ck_assert_int_eq(emb_store_lookup_begin(s, 2, &d.set, d.op2), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s), 0);
    for (size_t r = 0; r < MAXB; r++) d.ids[0][r] = 3 * r;
    emb_shard_counters c0;
    ck_assert_int_eq(emb_shard_counters_get(s, &c0), 0);
    d.grads[0][(MAXB - 1) * 8 + 3] = 3e38f; /* the accumulator of the push's last row: inf */
    ck_assert_int_eq(emb_store_push(s, 2, 1e4f, &d.set, d.gp), SR_ERANGE);
    ck_assert_msg(strstr(emb_store_errmsg(s), "row 2697:"), "%s", emb_store_errmsg(s));
    ck_assert_ptr_nonnull(strstr(emb_store_errmsg(s), "nothing applied"));
    emb_shard_counters c1;
    ck_assert_int_eq(emb_shard_counters_get(s, &c1), 0);
    ck_assert_msg(c1.evictions > c0.evictions, "the push never left the cache (%llu evictions)",
                  (unsigned long long)(c1.evictions - c0.evictions));
    ck_assert_int_eq(emb_store_lookup_begin(s, 2, &d.set, d.op2), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s), 0);
    ck_assert_mem_eq(d.out2[0], d.out[0], MAXB * 8 * sizeof(float));
    emb_store_destroy(s);
    sr_rmtree(dir);
    free(dir);
    emb_plan_free(p);
  }
}
END_TEST

START_TEST(test_bad_config) {
  emb_plan *p = make_plan(EMB_OPT_SGD, 2, 0);
  char err[512];
  emb_shard_config c;
  memset(&c, 0, sizeof c);
  c.cache_rows = 10;
  ck_assert_ptr_null(emb_store_create_shard(p, "/tmp/x-never", &c, err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "cache"));
  c.cache_rows = 4096;
  c.write_buffer_bytes = 1000;
  ck_assert_ptr_null(emb_store_create_shard(p, "/tmp/x-never", &c, err, sizeof err));
  ck_assert_msg(strstr(err, "write-back buffers of 1000 bytes"), "%s", err);
  c.write_buffer_bytes = 0;
  int hosted[1] = {5};
  c.cache_rows = 4096;
  c.n_hosted = 1;
  c.hosted = hosted;
  ck_assert_ptr_null(emb_store_create_shard(p, "/tmp/x-never", &c, err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "hosted shard 5"));
  emb_plan_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("embedding_shard");
  TCase *tc = tcase_create("shard");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_pressure_adagrad);
  tcase_add_test(tc, test_pressure_rowwise_sharded);
  tcase_add_test(tc, test_pressure_sgd_tablewise);
  tcase_add_test(tc, test_big_cache_writes_nothing);
  tcase_add_test(tc, test_twice_evicted_written_once);
  tcase_add_test(tc, test_often_used_rows_outlast_a_scan);
  tcase_add_test(tc, test_often_used_rows_outlast_a_scan_pinned);
  tcase_add_test(tc, test_uses_counted_once_a_step);
  tcase_add_test(tc, test_crash_after_flush_unclean);
  tcase_add_test(tc, test_crash_after_mark_keeps_rows);
  tcase_add_test(tc, test_checkpoint_restore);
  tcase_add_loop_test(tc, test_failed_restore_keeps_rows, 0, 2);
  tcase_add_test(tc, test_restore_cut_short);
  tcase_add_test(tc, test_row_version_refused);
  tcase_add_test(tc, test_bad_config);
  tcase_add_test(tc, test_push_nonfinite_refused);
  tcase_add_test(tc, test_push_nonfinite_refused_in_chunks);
  tcase_add_test(tc, test_kind_and_checkpoint_layout);
  tcase_add_test(tc, test_counters_refuse_other_kinds);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
