/* Tests for 16-bit tables (embedding/precision.h): the plan's precision
 * field, init values of the format, the stochastic rounding of updates
 * keyed by (seed, table_id, row_id, step, element) and nothing else, the
 * finiteness check of a rounded update, and the in-process store holding
 * the rounded values. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "common/status.h"
#include "embedding/optim.h"
#include "embedding/plan.h"
#include "embedding/precision.h"
#include "embedding/shard.h"
#include "embedding/store.h"

enum { DIM = 64 };

static emb_plan *make_plan(emb_precision prec, emb_optim_kind k) {
  static const uint64_t rows[] = {1000, 500, 0};
  emb_plan_params pp;
  memset(&pp, 0, sizeof pp);
  pp.n_tables = 3;
  pp.rows = rows;
  pp.dim = DIM;
  pp.pooling = EMB_POOL_SUM;
  pp.optim.kind = k;
  pp.optim.eps = -1;
  pp.seed = 99;
  pp.n_shards = 2;
  pp.precision = prec;
  char err[256];
  emb_plan *p = NULL;
  ck_assert_msg(emb_plan_create(&pp, &p, err, sizeof err) == 0, "create: %s", err);
  return p;
}

static int is_f16(float x) { return sr_f16_to_f32(sr_f32_to_f16(x)) == x; }
static int is_bf16(float x) { return sr_bf16_to_f32(sr_f32_to_bf16(x)) == x; }

START_TEST(test_plan_field) {
  emb_plan *a = make_plan(EMB_PREC_FP32, EMB_OPT_SGD), *b = make_plan(EMB_PREC_FP16, EMB_OPT_SGD);
  char *ca = emb_plan_canonical(a, 1), *cb = emb_plan_canonical(b, 1);
  ck_assert_ptr_null(strstr(ca, "precision")); /* fp32 plans read as they always did */
  ck_assert_ptr_nonnull(strstr(cb, "\"precision\":\"fp16\""));
  char fa[EMB_FP_HEX], fb[EMB_FP_HEX];
  ck_assert_int_eq(emb_plan_model_fingerprint(a, fa), 0);
  ck_assert_int_eq(emb_plan_model_fingerprint(b, fb), 0);
  ck_assert_str_ne(fa, fb);
  emb_plan *c = NULL;
  char err[256];
  ck_assert_int_eq(emb_plan_parse(cb, "p.json", &c, err, sizeof err), 0);
  for (int t = 0; t < 3; t++) ck_assert_int_eq(c->tables[t].precision, EMB_PREC_FP16);
  emb_plan_free(c);
  /* One table in bf16 by hand; a bad value is named with its table. */
  char *txt = strdup(ca), *at = strstr(txt, "\"placement\"");
  size_t n = strlen(txt) + 64;
  char *edited = malloc(n);
  snprintf(edited, n, "%.*s\"precision\":\"bf16\",%s", (int)(at - txt), txt, at);
  ck_assert_int_eq(emb_plan_parse(edited, "p.json", &c, err, sizeof err), 0);
  ck_assert_int_eq(c->tables[0].precision, EMB_PREC_BF16);
  ck_assert_int_eq(c->tables[1].precision, EMB_PREC_FP32);
  emb_plan_free(c);
  snprintf(edited, n, "%.*s\"precision\":\"fp8\",%s", (int)(at - txt), txt, at);
  ck_assert_int_eq(emb_plan_parse(edited, "p.json", &c, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "p.json") && strstr(err, "tables[0].precision"), "%s", err);
  /* A plan in another precision does not grow this one. */
  char why[128];
  ck_assert_int_eq(emb_plan_grows(a, b, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "precision"), "%s", why);
  free(edited);
  free(txt);
  free(ca);
  free(cb);
  emb_plan_free(a);
  emb_plan_free(b);
}
END_TEST

/* Init values: the fp32 init rounded to nearest of the format. */
START_TEST(test_init_values) {
  emb_plan *a = make_plan(EMB_PREC_FP32, EMB_OPT_SGD), *h = make_plan(EMB_PREC_FP16, EMB_OPT_SGD),
           *b = make_plan(EMB_PREC_BF16, EMB_OPT_SGD);
  float x[DIM], y[DIM], z[DIM];
  int differ = 0;
  for (uint64_t r = 0; r < 50; r++) {
    emb_row_init(a, 0, r, x);
    emb_row_init(h, 0, r, y);
    emb_row_init(b, 0, r, z);
    for (int j = 0; j < DIM; j++) {
      ck_assert_uint_eq(sr_f32_to_f16(x[j]), sr_f32_to_f16(y[j]));
      ck_assert(is_f16(y[j]));
      ck_assert_uint_eq(sr_f32_to_bf16(x[j]), sr_f32_to_bf16(z[j]));
      ck_assert(is_bf16(z[j]));
      differ += x[j] != y[j];
    }
  }
  ck_assert_int_gt(differ, 50 * DIM / 2); /* the rounding did something */
  emb_plan_free(a);
  emb_plan_free(h);
  emb_plan_free(b);
}
END_TEST

/* A row of values half way between two neighbours of the format: each
 * element goes either way with probability 1/2. */
static void halfway_row(emb_precision prec, float *w) {
  for (int j = 0; j < DIM; j++) {
    float lo = 0.25f + (float)j / 256.0f;
    w[j] = prec == EMB_PREC_FP16 ? lo + 0x1p-13f : lo + 0x1p-10f; /* fp16 step 2^-12, bf16 2^-9 */
  }
}

START_TEST(test_round_key) {
  for (emb_precision prec = EMB_PREC_FP16; prec <= EMB_PREC_BF16; prec++) {
    emb_plan *p = make_plan(prec, EMB_OPT_SGD);
    float base[DIM], w[DIM], in[DIM];
    halfway_row(prec, in);
    memcpy(base, in, sizeof in);
    emb_row_round(p, 1, 7, 3, base);
    int up = 0;
    for (int j = 0; j < DIM; j++) {
      ck_assert(prec == EMB_PREC_FP16 ? is_f16(base[j]) : is_bf16(base[j]));
      float step = prec == EMB_PREC_FP16 ? 0x1p-13f : 0x1p-10f;
      ck_assert(base[j] == in[j] - step || base[j] == in[j] + step);
      up += base[j] > in[j];
    }
    ck_assert(up > 8 && up < DIM - 8); /* elements are rounded apart */
    /* The same key: the same bits. */
    memcpy(w, in, sizeof in);
    emb_row_round(p, 1, 7, 3, w);
    ck_assert_mem_eq(w, base, sizeof w);
    /* Each part of the key changes it: row, step, table, seed. */
    memcpy(w, in, sizeof in);
    emb_row_round(p, 1, 8, 3, w);
    ck_assert(memcmp(w, base, sizeof w) != 0);
    memcpy(w, in, sizeof in);
    emb_row_round(p, 1, 7, 4, w);
    ck_assert(memcmp(w, base, sizeof w) != 0);
    memcpy(w, in, sizeof in);
    emb_row_round(p, 0, 7, 3, w);
    ck_assert(memcmp(w, base, sizeof w) != 0);
    p->seed++;
    memcpy(w, in, sizeof in);
    emb_row_round(p, 1, 7, 3, w);
    ck_assert(memcmp(w, base, sizeof w) != 0);
    p->seed--;
    /* The table's id, not its position, keys it. */
    emb_plan *q = emb_plan_clone(p);
    emb_table tmp = q->tables[0];
    q->tables[0] = q->tables[1];
    q->tables[1] = tmp;
    memcpy(w, in, sizeof in);
    emb_row_round(q, 0, 7, 3, w);
    ck_assert_mem_eq(w, base, sizeof w);
    emb_plan_free(q);
    emb_plan_free(p);
  }
  /* fp32: untouched. */
  emb_plan *p = make_plan(EMB_PREC_FP32, EMB_OPT_SGD);
  float w[DIM], in[DIM];
  halfway_row(EMB_PREC_FP16, in);
  memcpy(w, in, sizeof in);
  emb_row_round(p, 1, 7, 3, w);
  ck_assert_mem_eq(w, in, sizeof w);
  emb_plan_free(p);
}
END_TEST

/* Small updates still move an fp16 weight on average: 1000 steps of an
 * update a tenth of a step of the format. */
START_TEST(test_small_updates_accumulate) {
  emb_plan *p = make_plan(EMB_PREC_FP16, EMB_OPT_SGD);
  float w[DIM], g[DIM];
  for (int j = 0; j < DIM; j++) w[j] = 1.0f, g[j] = -0x1p-10f / 10.0f; /* step at 1.0: 2^-10 */
  for (int64_t s = 0; s < 1000; s++) emb_optim_apply_at(p, 0, 5, s, 1.0f, g, w, NULL);
  double mean = 0;
  for (int j = 0; j < DIM; j++) mean += w[j] / DIM;
  /* Expected 1 + 100 * 2^-10 = 1.0977; round-to-nearest would stay at 1. */
  ck_assert_msg(fabs(mean - (1.0 + 100 * 0x1p-10)) < 0.01, "mean %g", mean);
  emb_plan_free(p);
}
END_TEST

/* An update that an fp32 row holds but an fp16 row cannot (past 65504)
 * fails the check, and apply_at's own verdict is the same. */
START_TEST(test_check_overflow) {
  emb_plan *h = make_plan(EMB_PREC_FP16, EMB_OPT_ROWWISE_ADAGRAD),
           *a = make_plan(EMB_PREC_FP32, EMB_OPT_ROWWISE_ADAGRAD);
  float w[DIM], st[1] = {0}, g[DIM], scratch[DIM + 1];
  for (int j = 0; j < DIM; j++) w[j] = 65504.0f, g[j] = -1.0f;
  ck_assert_int_eq(emb_optim_check_at(a, 0, 1, 1, 100.0f, g, w, st, scratch), 1);
  ck_assert_int_eq(emb_optim_check_at(h, 0, 1, 1, 100.0f, g, w, st, scratch), 0);
  ck_assert_int_eq(emb_optim_check_at(h, 0, 1, 1, 1e-6f, g, w, st, scratch), 1);
  /* Near each format's top the check is the push's own outcome, rounding
   * included: apply_at, then every float finite. Rows whose weights stay
   * within the format, rows past it that round down, rows that round up. */
  const float tops[2] = {65504.0f, 0x1.fep127f}; /* fp16's largest; bf16's */
  for (int f = 0; f < 2; f++) {
    emb_plan *q = make_plan(f ? EMB_PREC_BF16 : EMB_PREC_FP16, EMB_OPT_ROWWISE_ADAGRAD);
    int seen[2] = {0, 0};
    for (uint64_t row = 0; row < 400; row++) {
      float w2[DIM], st2[1] = {1.0f}, g2[DIM], ref[DIM + 1];
      for (int j = 0; j < DIM; j++) {
        w2[j] = tops[f] * (1.0f - 0x1p-9f * (float)((row * 7 + (uint64_t)j) % 5));
        g2[j] = (row % 3 == 0) ? -1.0f : 0.0f;
      }
      const float lr = tops[f] * 0x1p-12f * (float)(row % 4);
      memcpy(ref, w2, sizeof w2);
      ref[DIM] = st2[0];
      const int verdict = emb_optim_apply_at(q, 0, row, 5, lr, g2, ref, ref + DIM);
      int want = 1;
      for (int j = 0; j <= DIM; j++) want &= isfinite(ref[j]) != 0;
      ck_assert_int_eq(verdict, want);
      ck_assert_int_eq(emb_optim_check_at(q, 0, row, 5, lr, g2, w2, st2, scratch), want);
      seen[want]++;
    }
    ck_assert_msg(seen[0] > 0 && seen[1] > 0, "format %d: %d refused, %d taken", f, seen[0], seen[1]);
    emb_plan_free(q);
  }
  emb_plan_free(h);
  emb_plan_free(a);
}
END_TEST

/* The in-process store: pushed rows are the fp32 update of the held value,
 * rounded with the push's step as key. */
START_TEST(test_local_store_rows) {
  for (emb_precision prec = EMB_PREC_FP16; prec <= EMB_PREC_BF16; prec++) {
    emb_plan *p = make_plan(prec, EMB_OPT_ROWWISE_ADAGRAD);
    char err[256];
    emb_store *s = emb_store_create_local(p, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    uint64_t id0[2] = {3, 999}, id1[1] = {4}, id2[1] = {1ULL << 60};
    const uint64_t *ids[3] = {id0, id1, id2};
    size_t counts[3] = {2, 1, 1};
    emb_idset set = {3, ids, counts};
    float g0[2 * DIM], g1[DIM], g2[DIM], o0[2 * DIM], o1[DIM], o2[DIM];
    for (int j = 0; j < 2 * DIM; j++) g0[j] = 0.001f * (float)(j - DIM);
    for (int j = 0; j < DIM; j++) g1[j] = g2[j] = 0.01f;
    const float *grads[3] = {g0, g1, g2};
    float *outs[3] = {o0, o1, o2};
    for (int64_t step = 10; step < 13; step++)
      ck_assert_int_eq(emb_store_push(s, step, 0.05f, &set, grads), 0);
    ck_assert_int_eq(emb_store_lookup_begin(s, 13, &set, outs), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s), 0);
    /* By hand: init, three updates. */
    float w[DIM], st[1];
    emb_row_init(p, 0, 999, w);
    emb_optim_state_init(&p->tables[0].optim, DIM, st);
    for (int64_t step = 10; step < 13; step++)
      emb_optim_apply_at(p, 0, 999, step, 0.05f, g0 + DIM, w, st);
    ck_assert_mem_eq(o0 + DIM, w, sizeof w);
    for (int j = 0; j < DIM; j++)
      ck_assert(prec == EMB_PREC_FP16 ? is_f16(o0[j]) && is_f16(o2[j]) : is_bf16(o0[j]) && is_bf16(o2[j]));
    /* Bytes held: 2 a weight and the row-wise accumulator, 132 at dim 64
     * (fp32: 260), 0.51x. */
    emb_store_stats sts;
    ck_assert_int_eq(emb_store_stats_get(s, &sts), 0);
    ck_assert_uint_eq(sts.rows, 4);
    ck_assert_uint_eq(sts.bytes, 4 * (2 * DIM + 4));
    /* A checkpoint restores to the same bits. */
    char dir[] = "/tmp/sr_test_precision_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_msg(emb_store_checkpoint(s, dir) == 0, "%s", emb_store_errmsg(s));
    emb_store *s2 = emb_store_create_local(p, err, sizeof err);
    ck_assert_msg(emb_store_restore(s2, dir) == 0, "%s", emb_store_errmsg(s2));
    float r0[2 * DIM], r1[DIM], r2[DIM];
    float *routs[3] = {r0, r1, r2};
    ck_assert_int_eq(emb_store_lookup_begin(s2, 13, &set, routs), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s2), 0);
    ck_assert_mem_eq(r0, o0, sizeof r0);
    ck_assert_mem_eq(r1, o1, sizeof r1);
    ck_assert_mem_eq(r2, o2, sizeof r2);
    emb_store_destroy(s2);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    emb_store_destroy(s);
    emb_plan_free(p);
  }
}
END_TEST

/* The shard store's cache holds 16-bit weights too: a cache of the same
 * MiB holds nearly twice the rows at dim 64 with row-wise Adagrad (slots
 * of a 16-byte header and 132 bytes, rounded to 16, against 276). */
START_TEST(test_shard_cache_rows) {
  emb_plan *a = make_plan(EMB_PREC_FP32, EMB_OPT_ROWWISE_ADAGRAD),
           *h = make_plan(EMB_PREC_FP16, EMB_OPT_ROWWISE_ADAGRAD),
           *b = make_plan(EMB_PREC_BF16, EMB_OPT_ROWWISE_ADAGRAD);
  uint64_t ra = emb_shard_rows_for_mb(a, 64), rh = emb_shard_rows_for_mb(h, 64),
           rb = emb_shard_rows_for_mb(b, 64);
  ck_assert_uint_eq(rh, rb);
  ck_assert_msg(rh * 10 > ra * 16, "fp32 %llu rows, fp16 %llu", (unsigned long long)ra,
                (unsigned long long)rh);
  emb_plan_free(a);
  emb_plan_free(h);
  emb_plan_free(b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("precision");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_plan_field);
  tcase_add_test(tc, test_init_values);
  tcase_add_test(tc, test_round_key);
  tcase_add_test(tc, test_small_updates_accumulate);
  tcase_add_test(tc, test_check_overflow);
  tcase_add_test(tc, test_local_store_rows);
  tcase_add_test(tc, test_shard_cache_rows);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
