/* What the shard store's suites (test_shard.c, test_shard_prefetch.c,
 * test_shard_pinned.c) make their stores from, and the plan test_store.c
 * and tests/reshard/test_reshard_ckpt.c make theirs from: a plan of three tables (bounded, small bounded,
 * unbounded; table 1 at dim 4 for mixed widths) and a
 * shard store with small RocksDB buffers. */
#ifndef SHARDREC_TESTS_EMBEDDING_SHARD_FIXTURE_H
#define SHARDREC_TESTS_EMBEDDING_SHARD_FIXTURE_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "embedding/plan.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "storage/kv.h"
#include "tests/support/files.h"

#define FX_NT 3

/* rows[FX_NT] (0: unbounded), dim for tables 0 and 2, the plan's seed. */
static inline emb_plan *fx_plan(const uint64_t *rows, int dim, uint64_t seed, emb_optim_kind k,
                                int n_shards, int row_wise) {
  emb_plan_params pp;
  memset(&pp, 0, sizeof pp);
  pp.n_tables = FX_NT;
  pp.rows = rows;
  pp.dim = dim;
  pp.optim.kind = k;
  pp.optim.eps = -1;
  pp.optim.init_acc = k == EMB_OPT_SGD ? 0 : 0.05;
  pp.seed = seed;
  pp.n_shards = n_shards;
  pp.row_wise = row_wise;
  char err[256];
  emb_plan *p = NULL;
  ck_assert_int_eq(emb_plan_create(&pp, &p, err, sizeof err), 0);
  p->tables[1].dim = 4; /* mixed widths */
  return p;
}

/* want distinct ids of a table of rows rows (0: unbounded, 64-bit hashed
 * ids drawn from 20000) into ids, skewed: a quarter of the draws from the
 * first 5% of the range, so that steps come back to the same rows. */
static inline size_t fx_step_ids(sr_rng *r, uint64_t rows, size_t want, uint64_t *ids) {
  const uint64_t bound = rows ? rows : 20000;
  size_t c = 0;
  while (c < want) {
    uint64_t id = sr_rng_below(r, 4) == 0 ? sr_rng_below(r, bound / 20 + 1) : sr_rng_below(r, bound);
    if (!rows) id = id * 0x9E3779B97F4A7C15ULL; /* 64-bit hashed ids */
    int dup = 0;
    for (size_t k = 0; k < c && !dup; k++) dup = ids[k] == id;
    if (!dup) ids[c++] = id;
  }
  return c;
}

/* A shard store over dir caching cache_rows rows; threads 0: the default
 * store threads. Its write-back buffers take 256 KiB (16 KiB each, a write
 * set every 12): rows written back reach RocksDB within a step or two
 * here, where the default 16 MiB would hold every row the tests evict. */
static inline emb_store *fx_shard(const emb_plan *p, const char *dir, uint64_t cache_rows,
                                  int threads) {
  char err[1024];
  emb_shard_config c;
  memset(&c, 0, sizeof c);
  c.cache_rows = cache_rows;
  c.write_buffer_bytes = 256 << 10;
  c.threads = threads;
  emb_store *s = emb_store_create_shard(p, dir, &c, err, sizeof err);
  ck_assert_msg(s != NULL, "%s", err);
  return s;
}

/* Row `id` of table 0 in dir/shard-0 written with layout version 9 (a
 * future one) at dim 8, for the refusals on read. */
static inline void fx_put_future_row(const char *dir, uint64_t id) {
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/shard-0", dir);
  uint32_t ids[FX_NT] = {0, 1, 2};
  kv_db *db;
  ck_assert_int_eq(kv_open(path, FX_NT, ids, NULL, &db, err, sizeof err), 0);
  unsigned char row[8 + 4 * 8];
  float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  kv_row_encode(8, 0, v, row);
  row[2] = 9; /* a future layout */
  kv_writes *w = kv_writes_create();
  ck_assert_ptr_nonnull(w);
  kv_writes_put(w, db, 0, id, row, sizeof row);
  ck_assert_int_eq(kv_writes_commit(w, db, err, sizeof err), 0);
  kv_writes_destroy(w);
  ck_assert_int_eq(kv_flush(db, err, sizeof err), 0); /* the writes skip the WAL */
  kv_close(db);
}

#endif
