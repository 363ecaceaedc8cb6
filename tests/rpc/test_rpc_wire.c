/* The service's hand-written LookupResponse (rpc/service.c): the rows are
 * written by the store straight into the answer, each table's rows 4-byte
 * aligned in it behind a padding field that protobuf decoders skip. For
 * plans of tables with many dims and table ids (one- to three-byte varints)
 * and Lookups of many id counts (so every alignment comes up), the answer
 * decodes with protobuf-c to exactly the rows of an in-process store, every
 * table's rows start at a multiple of 4 in the answer, and nothing else is
 * in it but the incarnation. Also the Push's repeated-id check (a hash set
 * since the qsort went): a repeat anywhere is refused naming the row. */
#include <check.h>

#include "tests/check_main.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"

#define NT 4

static const int dims[NT] = {1, 3, 16, 33};
static const uint32_t tids[NT] = {0, 127, 300, 70000};

static emb_plan *plan_make(void) {
  char json[2048];
  size_t at = (size_t)snprintf(json, sizeof json, "{\"format\": 1, \"seed\": \"9\", \"n_shards\": 1, \"tables\": [");
  for (int t = 0; t < NT; t++)
    at += (size_t)snprintf(json + at, sizeof json - at,
                           "%s{\"table_id\": %u, \"name\": \"t%d\", \"rows\": 1000, \"dim\": %d, "
                           "\"pooling\": \"sum\", \"optimizer\": {\"name\": \"sgd\"}, "
                           "\"placement\": {\"kind\": \"table\", \"shards\": [0]}}",
                           t ? ", " : "", tids[t], t, dims[t]);
  snprintf(json + at, sizeof json - at, "]}");
  emb_plan *p;
  char err[512];
  ck_assert_msg(emb_plan_parse(json, "test", &p, err, sizeof err) == 0, "%s", err);
  return p;
}

static void header(Shardrec__V1__RequestHeader *h, char *fp, int64_t step) {
  shardrec__v1__request_header__init(h);
  h->plan_fingerprint = fp;
  h->job_id = "wire";
  h->step = step;
  h->world_size = 1;
}

/* A push of random gradients to every row of every table, so that stored
 * rows differ from their initial values. */
static void fill(rpc_service *svc, emb_store *loc, char *fp) {
  static uint64_t ids[1000];
  static float g[1000 * 33];
  for (int i = 0; i < 1000; i++) ids[i] = (uint64_t)i;
  for (int i = 0; i < 1000 * 33; i++) g[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
  Shardrec__V1__TableGrads tg[NT], *tgp[NT];
  const uint64_t *ip[NT];
  size_t counts[NT];
  const float *gp[NT];
  for (int t = 0; t < NT; t++) {
    shardrec__v1__table_grads__init(&tg[t]);
    tg[t].table_id = tids[t];
    tg[t].n_ids = 1000;
    tg[t].ids = ids;
    tg[t].grads.data = (uint8_t *)g;
    tg[t].grads.len = 1000 * (size_t)dims[t] * sizeof(float);
    tgp[t] = &tg[t];
    ip[t] = ids;
    counts[t] = 1000;
    gp[t] = g;
  }
  Shardrec__V1__RequestHeader h;
  header(&h, fp, 1);
  Shardrec__V1__PushRequest q = SHARDREC__V1__PUSH_REQUEST__INIT;
  q.header = &h;
  q.learning_rate = 0.5f;
  q.n_tables = NT;
  q.tables = tgp;
  size_t len = shardrec__v1__push_request__get_packed_size(&q);
  uint8_t *buf = malloc(len);
  shardrec__v1__push_request__pack(&q, buf);
  rpc_reply r;
  rpc_service_handle(svc, RPC_PUSH, buf, len, &r);
  ck_assert_msg(r.status == RPC_OK, "fill: %s", r.msg);
  free(r.out);
  free(buf);
  emb_idset set = {NT, ip, counts};
  ck_assert_int_eq(emb_store_push(loc, 1, 0.5f, &set, gp), 0);
}

/* The offset of needle[n] in hay[m] (unique with random rows), or -1. */
static long find(const uint8_t *hay, size_t m, const uint8_t *needle, size_t n) {
  for (size_t i = 0; i + n <= m; i++)
    if (!memcmp(hay + i, needle, n)) return (long)i;
  return -1;
}

START_TEST(test_lookup_answer_layout) {
  emb_plan *plan = plan_make();
  char err[512], fp[EMB_FP_HEX];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  emb_store *st = emb_store_create_local(plan, err, sizeof err);
  emb_store *loc = emb_store_create_local(plan, err, sizeof err);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(loc);
  int shard = 0;
  rpc_service_opts so = {.shards = &shard, .n_shards = 1};
  rpc_service *svc = rpc_service_create(plan, st, &so, err, sizeof err);
  ck_assert_msg(svc != NULL, "%s", err);
  fill(svc, loc, fp);
  static uint64_t ids[NT][64];
  static float want[NT][64 * 33];
  int checked = 0, aligned_rows = 0;
  /* Tables in several orders and subsets, id counts 1..40: the padding
   * takes every size. */
  for (int n = 1; n <= 40; n++)
    for (int first = 0; first < NT; first++) {
      const int k = 1 + (n + first) % NT; /* tables in this Lookup */
      Shardrec__V1__TableIds ti[NT], *tip[NT];
      const uint64_t *ip[NT] = {0};
      size_t counts[NT] = {0};
      float *op[NT];
      static float dummy[1];
      for (int t = 0; t < NT; t++) op[t] = dummy;
      for (int j = 0; j < k; j++) {
        const int t = (first + j) % NT;
        const size_t cnt = (size_t)(n + 3 * j);
        for (size_t i = 0; i < cnt; i++) ids[t][i] = (uint64_t)((i * 37 + (size_t)n * 11 + (size_t)t) % 1000);
        shardrec__v1__table_ids__init(&ti[j]);
        ti[j].table_id = tids[t];
        ti[j].n_ids = cnt;
        ti[j].ids = ids[t];
        tip[j] = &ti[j];
        ip[t] = ids[t];
        counts[t] = cnt;
        op[t] = want[t];
      }
      emb_idset set = {NT, ip, counts};
      ck_assert_int_eq(emb_store_lookup_begin(loc, 2, &set, op), 0);
      ck_assert_int_eq(emb_store_lookup_wait(loc), 0);
      Shardrec__V1__RequestHeader h;
      header(&h, fp, 2);
      Shardrec__V1__LookupRequest q = SHARDREC__V1__LOOKUP_REQUEST__INIT;
      q.header = &h;
      q.n_tables = (size_t)k;
      q.tables = tip;
      uint8_t buf[4096];
      size_t len = shardrec__v1__lookup_request__pack(&q, buf);
      rpc_reply r;
      rpc_service_handle(svc, RPC_LOOKUP, buf, len, &r);
      ck_assert_msg(r.status == RPC_OK, "lookup n=%d: %s", n, r.msg);
      Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, r.out_len, r.out);
      ck_assert_msg(a != NULL, "n=%d first=%d: the answer does not decode", n, first);
      ck_assert_uint_eq(a->n_tables, (size_t)k);
      ck_assert(a->incarnation != 0);
      size_t rows_bytes = 0;
      for (int j = 0; j < k; j++) {
        const int t = (first + j) % NT;
        const Shardrec__V1__TableRows *tr = a->tables[j];
        ck_assert_uint_eq(tr->table_id, tids[t]);
        ck_assert_int_eq(tr->dim, dims[t]);
        ck_assert_uint_eq(tr->rows.len, counts[t] * (size_t)dims[t] * sizeof(float));
        ck_assert_msg(!memcmp(tr->rows.data, want[t], tr->rows.len),
                      "n=%d table %u: rows differ from the in-process store's", n, tids[t]);
        long off = find(r.out, r.out_len, tr->rows.data, tr->rows.len);
        ck_assert_msg(off >= 0 && off % 4 == 0, "n=%d table %u: rows at offset %ld", n, tids[t], off);
        rows_bytes += tr->rows.len;
        aligned_rows++;
      }
      /* Per table at most 2 + 5 + 5 + 10 bytes of header and padding, then
       * the incarnation: nothing else rides along. */
      ck_assert_uint_le(r.out_len, rows_bytes + (size_t)k * 22 + 11);
      shardrec__v1__lookup_response__free_unpacked(a, NULL);
      free(r.out);
      checked++;
    }
  ck_assert_int_eq(checked, 160);
  ck_assert_int_gt(aligned_rows, 160);
  rpc_service_destroy(svc);
  emb_store_destroy(st);
  emb_store_destroy(loc);
  emb_plan_free(plan);
}
END_TEST

/* A Push whose ids repeat (at the end, at the start, far apart) is refused
 * INVALID_ARGUMENT naming the table and the row, and changes nothing; one
 * without repeats (ids colliding in the hash set) is applied. */
START_TEST(test_push_repeated_ids) {
  emb_plan *plan = plan_make();
  char err[512], fp[EMB_FP_HEX];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  emb_store *st = emb_store_create_local(plan, err, sizeof err);
  int shard = 0;
  rpc_service_opts so = {.shards = &shard, .n_shards = 1};
  rpc_service *svc = rpc_service_create(plan, st, &so, err, sizeof err);
  ck_assert_msg(svc != NULL, "%s", err);
  static uint64_t ids[600];
  static float g[600];
  const size_t where[3][2] = {{598, 599}, {0, 1}, {3, 550}};
  for (int c = 0; c < 4; c++) {
    for (int i = 0; i < 600; i++) ids[i] = (uint64_t)i; /* 0..599: no repeat */
    uint64_t twice = 0;
    if (c < 3) {
      twice = ids[where[c][0]] = (uint64_t)(100 + c);
      ids[where[c][1]] = twice;
    }
    for (int i = 0; i < 600; i++) g[i] = 0.25f;
    Shardrec__V1__TableGrads tg, *tgp = &tg;
    shardrec__v1__table_grads__init(&tg);
    tg.table_id = tids[0];
    tg.n_ids = 600;
    tg.ids = ids;
    tg.grads.data = (uint8_t *)g;
    tg.grads.len = sizeof g;
    Shardrec__V1__RequestHeader h;
    header(&h, fp, 10 + c);
    Shardrec__V1__PushRequest q = SHARDREC__V1__PUSH_REQUEST__INIT;
    q.header = &h;
    q.learning_rate = 0.5f;
    q.n_tables = 1;
    q.tables = &tgp;
    static uint8_t buf[16384];
    size_t len = shardrec__v1__push_request__pack(&q, buf);
    rpc_reply r;
    rpc_service_handle(svc, RPC_PUSH, buf, len, &r);
    if (c < 3) {
      char want[128];
      snprintf(want, sizeof want, "tables[0].ids: row %llu given twice", (unsigned long long)twice);
      ck_assert_int_eq(r.status, RPC_INVALID_ARGUMENT);
      ck_assert_msg(strstr(r.msg, want) != NULL, "case %d: %s", c, r.msg);
      emb_store_stats ss;
      ck_assert_int_eq(emb_store_stats_get(st, &ss), 0);
      ck_assert_uint_eq(ss.pushes, 0);
    } else {
      ck_assert_msg(r.status == RPC_OK, "%s", r.msg);
    }
    free(r.out);
  }
  rpc_service_destroy(svc);
  emb_store_destroy(st);
  emb_plan_free(plan);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_wire");
  TCase *tc = tcase_create("wire");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_lookup_answer_layout);
  tcase_add_test(tc, test_push_repeated_ids);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
