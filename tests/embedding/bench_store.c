/* Benchmark: lookup + push rate of the in-process store at the DLRM Kaggle
 * shape (26 tables, dim 16, batch 2048 one-hot ids per table, deduplicated).
 * Prints figures; not a test.
 *   bench_emb_store [rows_per_table=1000000] [steps=50] [optimizer=adagrad] [prefill=1]
 * prefill=1 pushes every row once first (steady state: every row stored);
 * prefill=0 measures the growth phase (rows created on first push, fresh
 * pages, map rehashes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/sys.h"
#include "embedding/bag.h"
#include "embedding/store.h"

/* Thread CPU time: the figures stay meaningful on a shared, loaded machine
 * (run it on an idle one for wall-clock figures; they agree there). */
static double now(void) { return (double)sr_thread_cpu_ns() * 1e-9; }

int main(int argc, char **argv) {
  const uint64_t rows = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
  const int steps = argc > 2 ? atoi(argv[2]) : 50;
  emb_optim_kind kind = EMB_OPT_ADAGRAD;
  if (argc > 3 && emb_optim_parse(argv[3], &kind)) return 2;
  enum { T = 26, B = 2048, D = 16 };
  uint64_t sizes[T];
  for (int t = 0; t < T; t++) sizes[t] = rows;
  emb_plan_params pp = {0};
  pp.n_tables = T;
  pp.rows = sizes;
  pp.dim = D;
  pp.optim.kind = kind;
  pp.optim.eps = -1;
  pp.n_shards = 4;
  char err[256];
  emb_plan *plan;
  if (emb_plan_create(&pp, &plan, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
  emb_store *s = emb_store_create_local(plan, err, sizeof err);
  emb_dedup *dd = emb_dedup_create(B);
  static uint64_t raw[T][B], uniq[T][B];
  static uint32_t inv[T][B];
  static float out[T][B * D], grad[T][B * D];
  size_t counts[T];
  const uint64_t *idp[T];
  float *op[T];
  const float *gp[T];
  for (int t = 0; t < T; t++) idp[t] = uniq[t], op[t] = out[t], gp[t] = grad[t];
  emb_idset set = {T, idp, counts};
  sr_rng r;
  sr_rng_init(&r, 1, 2);
  for (int t = 0; t < T; t++)
    for (int k = 0; k < B * D; k++) grad[t][k] = (float)(sr_rng_uniform(&r) - 0.5) * 1e-3f;
  const int prefill = argc > 4 ? atoi(argv[4]) : 1;
  double tp0 = now();
  for (uint64_t base = 0; prefill && base < rows; base += B) {
    for (int t = 0; t < T; t++) {
      counts[t] = rows - base < B ? (size_t)(rows - base) : B;
      for (size_t k = 0; k < counts[t]; k++) uniq[t][k] = base + k;
    }
    if (emb_store_push(s, -1, 0.0f, &set, gp)) return fprintf(stderr, "%s\n", emb_store_errmsg(s)), 1;
  }
  if (prefill) printf("prefill: %.2f s\n", now() - tp0);
  double t_lookup = 0, t_push = 0, t_dedup = 0;
  uint64_t n_rows = 0;
  const int warm = steps / 5 + 1;
  for (int step = 0; step < warm + steps; step++) {
    double a = now();
    for (int t = 0; t < T; t++) {
      /* Zipf-ish: half the ids from a hot 1% of the table. */
      for (int k = 0; k < B; k++)
        raw[t][k] = (k & 1) ? sr_rng_below(&r, rows / 100 + 1) : sr_rng_below(&r, rows);
      emb_dedup_run(dd, raw[t], B, uniq[t], inv[t], &counts[t]);
    }
    double b = now();
    if (emb_store_lookup_begin(s, step, &set, op) || emb_store_lookup_wait(s)) return 1;
    double c = now();
    if (emb_store_push(s, step, 0.01f, &set, gp)) return fprintf(stderr, "%s\n", emb_store_errmsg(s)), 1;
    double d = now();
    if (step >= warm) {
      t_dedup += b - a;
      t_lookup += c - b;
      t_push += d - c;
      for (int t = 0; t < T; t++) n_rows += counts[t];
    }
  }
  emb_store_stats st;
  emb_store_stats_get(s, &st);
  printf("tables %d x %llu rows, dim %d, %s, batch %d, %s: %.0f unique rows/step\n", T,
         (unsigned long long)rows, D, emb_optim_name(kind), B, prefill ? "prefilled" : "growing",
         (double)n_rows / steps);
  printf("per step (thread CPU time): dedup %.3f ms, lookup %.3f ms, push %.3f ms\n", 1e3 * t_dedup / steps,
         1e3 * t_lookup / steps, 1e3 * t_push / steps);
  printf("lookup %.1f M rows/s, push %.1f M rows/s, lookup+push %.1f M rows/s; rows held %llu (%.1f MiB)\n",
         n_rows / t_lookup * 1e-6, n_rows / t_push * 1e-6, n_rows / (t_lookup + t_push) * 1e-6,
         (unsigned long long)st.rows, st.bytes / 1048576.0);
  emb_dedup_destroy(dd);
  emb_store_destroy(s);
  emb_plan_free(plan);
  return 0;
}
