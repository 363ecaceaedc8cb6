/* Lookup answers of 16-bit tables (rpc/codec.c): an fp16 or bf16 table's
 * rows travel as 2-byte values of its format, the in-process store's rows
 * to the bit, 4-byte aligned in the answer, beside an fp32 table's float
 * rows in the same answer; at dim 128 the answer is about half the bytes of
 * the fp32 plan's. */
#include <check.h>

#include "tests/check_main.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"

#define NT 3
#define MAXD 128

/* Tables of dims[] in precisions precs[] (JSON names). */
static emb_plan *plan_make(const int *dims, const char *const *precs) {
  char json[2048];
  size_t at = (size_t)snprintf(json, sizeof json, "{\"format\": 1, \"seed\": \"9\", \"n_shards\": 1, \"tables\": [");
  for (int t = 0; t < NT; t++)
    at += (size_t)snprintf(json + at, sizeof json - at,
                           "%s{\"table_id\": %d, \"name\": \"t%d\", \"rows\": 1000, \"dim\": %d, "
                           "\"pooling\": \"sum\", \"optimizer\": {\"name\": \"sgd\"}, \"precision\": \"%s\", "
                           "\"placement\": {\"kind\": \"table\", \"shards\": [0]}}",
                           t ? ", " : "", 10 + t, t, dims[t], precs[t]);
  snprintf(json + at, sizeof json - at, "]}");
  emb_plan *p;
  char err[512];
  ck_assert_msg(emb_plan_parse(json, "test", &p, err, sizeof err) == 0, "%s", err);
  return p;
}

static void header(Shardrec__V1__RequestHeader *h, char *fp, int64_t step) {
  shardrec__v1__request_header__init(h);
  h->plan_fingerprint = fp;
  h->job_id = "half";
  h->step = step;
  h->world_size = 1;
}

typedef struct {
  emb_plan *plan;
  emb_store *st, *loc; /* the server's store; an in-process one pushed alike */
  rpc_service *svc;
  char fp[EMB_FP_HEX];
} fixture;

static void fx_open(fixture *f, const int *dims, const char *const *precs) {
  char err[512];
  f->plan = plan_make(dims, precs);
  ck_assert_int_eq(emb_plan_fingerprint(f->plan, f->fp), 0);
  f->st = emb_store_create_local(f->plan, err, sizeof err);
  f->loc = emb_store_create_local(f->plan, err, sizeof err);
  int shard = 0;
  rpc_service_opts so = {.shards = &shard, .n_shards = 1};
  f->svc = rpc_service_create(f->plan, f->st, &so, err, sizeof err);
  ck_assert_msg(f->svc != NULL, "%s", err);
  /* Rows 0..499 of every table pushed once, through the service and into loc. */
  static uint64_t ids[500];
  static float g[500 * MAXD];
  for (int i = 0; i < 500; i++) ids[i] = (uint64_t)i;
  for (int i = 0; i < 500 * MAXD; i++) g[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
  Shardrec__V1__TableGrads tg[NT], *tgp[NT];
  const uint64_t *ip[NT];
  size_t counts[NT];
  const float *gp[NT];
  for (int t = 0; t < NT; t++) {
    shardrec__v1__table_grads__init(&tg[t]);
    tg[t].table_id = (uint32_t)(10 + t);
    tg[t].n_ids = 500;
    tg[t].ids = ids;
    tg[t].grads.data = (uint8_t *)g;
    tg[t].grads.len = 500 * (size_t)dims[t] * sizeof(float);
    tgp[t] = &tg[t];
    ip[t] = ids;
    counts[t] = 500;
    gp[t] = g;
  }
  Shardrec__V1__RequestHeader h;
  header(&h, f->fp, 1);
  Shardrec__V1__PushRequest q = SHARDREC__V1__PUSH_REQUEST__INIT;
  q.header = &h;
  q.learning_rate = 0.5f;
  q.n_tables = NT;
  q.tables = tgp;
  size_t len = shardrec__v1__push_request__get_packed_size(&q);
  uint8_t *buf = malloc(len);
  shardrec__v1__push_request__pack(&q, buf);
  rpc_reply r;
  rpc_service_handle(f->svc, RPC_PUSH, buf, len, &r);
  ck_assert_msg(r.status == RPC_OK, "push: %s", r.msg);
  free(r.out);
  free(buf);
  emb_idset set = {NT, ip, counts};
  ck_assert_int_eq(emb_store_push(f->loc, 1, 0.5f, &set, gp), 0);
}

static void fx_close(fixture *f) {
  rpc_service_destroy(f->svc);
  emb_store_destroy(f->st);
  emb_store_destroy(f->loc);
  emb_plan_free(f->plan);
}

/* A Lookup of n ids (pushed and never-pushed rows) of every table; the
 * answer checked against loc's rows; its length returned. */
static size_t lookup_check(fixture *f, size_t n) {
  static uint64_t ids[1000];
  static float want[NT][1000 * MAXD];
  for (size_t i = 0; i < n; i++) ids[i] = (i * 37) % 1000;
  Shardrec__V1__TableIds ti[NT], *tip[NT];
  const uint64_t *ip[NT];
  size_t counts[NT];
  float *op[NT];
  for (int t = 0; t < NT; t++) {
    shardrec__v1__table_ids__init(&ti[t]);
    ti[t].table_id = (uint32_t)(10 + t);
    ti[t].n_ids = n;
    ti[t].ids = ids;
    tip[t] = &ti[t];
    ip[t] = ids;
    counts[t] = n;
    op[t] = want[t];
  }
  emb_idset set = {NT, ip, counts};
  ck_assert_int_eq(emb_store_lookup_begin(f->loc, 2, &set, op), 0);
  ck_assert_int_eq(emb_store_lookup_wait(f->loc), 0);
  Shardrec__V1__RequestHeader h;
  header(&h, f->fp, 2);
  Shardrec__V1__LookupRequest q = SHARDREC__V1__LOOKUP_REQUEST__INIT;
  q.header = &h;
  q.n_tables = NT;
  q.tables = tip;
  static uint8_t buf[32768];
  size_t len = shardrec__v1__lookup_request__pack(&q, buf);
  rpc_reply r;
  rpc_service_handle(f->svc, RPC_LOOKUP, buf, len, &r);
  ck_assert_msg(r.status == RPC_OK, "lookup: %s", r.msg);
  Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, r.out_len, r.out);
  ck_assert_ptr_nonnull(a);
  ck_assert_uint_eq(a->n_tables, NT);
  for (int t = 0; t < NT; t++) {
    const emb_table *tb = &f->plan->tables[t];
    const Shardrec__V1__TableRows *tr = a->tables[t];
    const size_t nv = n * (size_t)tb->dim;
    ck_assert_uint_eq(tr->rows.len, nv * (size_t)emb_precision_bytes(tb->precision));
    static float got[1000 * MAXD];
    static uint16_t h16[1000 * MAXD];
    if (tb->precision == EMB_PREC_FP32) {
      memcpy(got, tr->rows.data, tr->rows.len);
    } else {
      memcpy(h16, tr->rows.data, tr->rows.len);
      if (tb->precision == EMB_PREC_FP16) sr_f16_decode(h16, got, nv, SR_HALF_C);
      else sr_bf16_decode(h16, got, nv);
    }
    ck_assert_msg(!memcmp(got, want[t], nv * sizeof(float)), "n=%zu table %d (%s): rows differ", n,
                  t, emb_precision_name(tb->precision));
    /* The rows start 4-byte aligned in the answer. */
    const uint8_t *at = NULL;
    for (size_t i = 0; i + tr->rows.len <= r.out_len && !at; i++)
      if (!memcmp(r.out + i, tr->rows.data, tr->rows.len)) at = r.out + i;
    ck_assert_ptr_nonnull(at);
    ck_assert_uint_eq((size_t)(at - r.out) % 4, 0);
  }
  shardrec__v1__lookup_response__free_unpacked(a, NULL);
  free(r.out);
  return r.out_len;
}

START_TEST(test_rows16_in_answers) {
  const int dims[NT] = {16, 33, 7};
  const char *const precs[NT] = {"fp32", "fp16", "bf16"};
  fixture f;
  fx_open(&f, dims, precs);
  for (size_t n = 1; n <= 9; n++) lookup_check(&f, n);
  lookup_check(&f, 1000);
  fx_close(&f);
}
END_TEST

START_TEST(test_answer_bytes_halved) {
  const int dims[NT] = {128, 128, 128};
  const char *const p32[NT] = {"fp32", "fp32", "fp32"}, *const p16[NT] = {"fp16", "bf16", "fp16"};
  fixture a, b;
  fx_open(&a, dims, p32);
  fx_open(&b, dims, p16);
  size_t la = lookup_check(&a, 1000), lb = lookup_check(&b, 1000);
  ck_assert_msg(2 * lb <= la + 64 && 2 * lb >= la - 64, "fp32 %zu bytes, 16-bit %zu", la, lb);
  fx_close(&a);
  fx_close(&b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_half");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_rows16_in_answers);
  tcase_add_test(tc, test_answer_bytes_halved);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
