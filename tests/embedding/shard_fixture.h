/* What the shard store's suites (test_shard.c, test_shard_prefetch.c) make
 * their stores from: a plan of three tables (bounded, small bounded,
 * unbounded; table 1 at dim 4 for mixed widths), a temporary folder, and a
 * shard store with small RocksDB buffers. */
#ifndef SHARDREC_TESTS_EMBEDDING_SHARD_FIXTURE_H
#define SHARDREC_TESTS_EMBEDDING_SHARD_FIXTURE_H

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "embedding/plan.h"
#include "embedding/shard.h"
#include "embedding/store.h"

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

/* A new folder /tmp/shardrec-TAG-XXXXXX (free() the name). */
static inline char *fx_tmpdir(const char *tag) {
  char *d = malloc(strlen(tag) + 32);
  ck_assert_ptr_nonnull(d);
  strcpy(d, "/tmp/shardrec-");
  strcat(d, tag);
  strcat(d, "-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(d));
  return d;
}

/* A shard store over dir caching cache_rows rows with 4 MiB RocksDB block
 * cache and write buffers; threads 0: the default store threads. */
static inline emb_store *fx_shard(const emb_plan *p, const char *dir, uint64_t cache_rows,
                                  int threads) {
  char err[1024];
  emb_shard_config c;
  memset(&c, 0, sizeof c);
  c.cache_rows = cache_rows;
  c.block_cache_bytes = 4 << 20;
  c.write_buffer_bytes = 4 << 20;
  c.threads = threads;
  emb_store *s = emb_store_create_shard(p, dir, &c, err, sizeof err);
  ck_assert_msg(s != NULL, "%s", err);
  return s;
}

#endif
