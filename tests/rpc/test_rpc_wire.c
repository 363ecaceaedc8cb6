/* The service's hand-written LookupResponse (rpc/codec.c): the rows are
 * written by the store straight into the answer, each table's rows 4-byte
 * aligned in it behind a padding field that protobuf decoders skip. For
 * plans of tables with many dims and table ids (one- to three-byte varints)
 * and Lookups of many id counts (so every alignment comes up), the answer
 * decodes with protobuf-c to exactly the rows of an in-process store, every
 * table's rows start at a multiple of 4 in the answer, and nothing else is
 * in it but the incarnation. Also the Push's repeated-id check (a hash set
 * since the qsort went): a repeat anywhere is refused naming the row.
 * Then the requests' in-place decoding: a Lookup or Push with
 * ids_fixed (protobuf-c's packing, and the client's hand-written one,
 * rpc/codec_impl.h) at every alignment in memory is answered exactly as the same
 * request with varint ids (the old encoding), its ids read in place when
 * aligned (Stats' request_ids_in_place / _copied); both fields in one
 * table, and cut, overlong and garbled fields, are refused naming the
 * field and its offset. A PushLookup (a push and the next step's Lookup in
 * one call) answers the rows of its Push then its Lookup, is refused
 * whole, or after its push, saying which, and deferred for budget whole
 * (its push applied once). */
#include <check.h>

#include "tests/check_main.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/codec_impl.h"
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


/* ---- requests decoded in place ---- */

/* Stats' request id counts of svc. */
static void ids_stats(rpc_service *svc, uint64_t *in_place, uint64_t *copied) {
  rpc_reply r;
  rpc_service_handle(svc, RPC_STATS, NULL, 0, &r);
  ck_assert_msg(r.status == RPC_OK, "stats: %s", r.msg);
  Shardrec__V1__StatsResponse *a = shardrec__v1__stats_response__unpack(NULL, r.out_len, r.out);
  ck_assert_ptr_nonnull(a);
  *in_place = a->request_ids_in_place;
  *copied = a->request_ids_copied;
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  free(r.out);
}

/* req[len] handed to svc from off bytes past a 16-byte aligned address. */
static void handle_at(rpc_service *svc, rpc_method m, const uint8_t *req, size_t len, size_t off,
                      rpc_reply *r) {
  static _Alignas(16) uint8_t buf[1 << 20];
  ck_assert_uint_le(off + len, sizeof buf);
  memcpy(buf + off, req, len);
  rpc_service_handle(svc, m, buf + off, len, r);
}

enum { ENC_VARINT, ENC_PBC_FIXED, ENC_HAND, N_ENC };

/* The request of tables tab[k] (dims from the plan) in encoding e:
 * protobuf-c with ids, protobuf-c with ids_fixed, or rpc__lookup_encode's.
 * Lookup: grads NULL. Caller frees. */
static uint8_t *encode_req(int e, char *fp, int64_t step, const int *tab, int k,
                           uint64_t (*ids)[300], const size_t *cnt, const float *grads,
                           size_t *len) {
  Shardrec__V1__RequestHeader h;
  header(&h, fp, step);
  if (e == ENC_HAND) {
    rpc_wire_table wt[NT];
    for (int j = 0; j < k; j++)
      wt[j] = (rpc_wire_table){.table_id = tids[tab[j]], .ids = ids[j], .n = cnt[j],
                               .grads = grads, .dim = dims[tab[j]]};
    return grads ? rpc__push_encode(&h, 0.25f, wt, (size_t)k, len)
                 : rpc__lookup_encode(&h, wt, (size_t)k, 0, len);
  }
  Shardrec__V1__TableIds ti[NT], *tip[NT];
  Shardrec__V1__TableGrads tg[NT], *tgp[NT];
  for (int j = 0; j < k; j++) {
    shardrec__v1__table_ids__init(&ti[j]);
    shardrec__v1__table_grads__init(&tg[j]);
    ti[j].table_id = tg[j].table_id = tids[tab[j]];
    if (e == ENC_VARINT) ti[j].n_ids = tg[j].n_ids = cnt[j], ti[j].ids = tg[j].ids = ids[j];
    else ti[j].n_ids_fixed = tg[j].n_ids_fixed = cnt[j], ti[j].ids_fixed = tg[j].ids_fixed = ids[j];
    tg[j].grads.data = (uint8_t *)grads;
    tg[j].grads.len = cnt[j] * (size_t)dims[tab[j]] * sizeof(float);
    tip[j] = &ti[j];
    tgp[j] = &tg[j];
  }
  Shardrec__V1__LookupRequest lq = SHARDREC__V1__LOOKUP_REQUEST__INIT;
  Shardrec__V1__PushRequest pq = SHARDREC__V1__PUSH_REQUEST__INIT;
  lq.header = pq.header = &h;
  lq.n_tables = pq.n_tables = (size_t)k;
  lq.tables = tip;
  pq.tables = tgp;
  pq.learning_rate = 0.25f;
  ProtobufCMessage *msg = grads ? &pq.base : &lq.base;
  *len = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = malloc(*len);
  protobuf_c_message_pack(msg, buf);
  return buf;
}

/* Lookups of several tables (1 to 4, in several orders) and id counts
 * with ids_fixed, each at memory offsets 0..7, are answered with exactly
 * the bytes of the same Lookup with varint ids; the hand-written ones put
 * every table's ids at a multiple of 8 in the message and protobuf-c
 * reads them back; aligned ids are read in place, the rest copied. */
START_TEST(test_ids_fixed_lookup) {
  emb_plan *plan = plan_make();
  char err[512], fp[EMB_FP_HEX];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  emb_store *st = emb_store_create_local(plan, err, sizeof err);
  emb_store *loc = emb_store_create_local(plan, err, sizeof err);
  int shard = 0;
  rpc_service_opts so = {.shards = &shard, .n_shards = 1};
  rpc_service *svc = rpc_service_create(plan, st, &so, err, sizeof err);
  ck_assert_msg(svc != NULL, "%s", err);
  fill(svc, loc, fp);
  static uint64_t ids[NT][300];
  static const size_t ns[] = {1, 2, 7, 40, 300};
  int in_place_calls = 0, copied_calls = 0;
  for (size_t c = 0; c < sizeof ns / sizeof *ns; c++)
    for (int first = 0; first < NT; first++) {
      const int k = 1 + (first + (int)c) % NT;
      int tab[NT];
      size_t cnt[NT], total = 0;
      for (int j = 0; j < k; j++) {
        tab[j] = (first + j) % NT;
        cnt[j] = ns[c] + (size_t)j;
        if (cnt[j] > 300) cnt[j] = 300;
        for (size_t i = 0; i < cnt[j]; i++) ids[j][i] = (i * 613 + c * 7 + (size_t)j) % 1000;
        total += cnt[j];
      }
      size_t len;
      uint8_t *req = encode_req(ENC_VARINT, fp, 2, tab, k, ids, cnt, NULL, &len);
      rpc_reply want;
      handle_at(svc, RPC_LOOKUP, req, len, 0, &want);
      ck_assert_msg(want.status == RPC_OK, "varint lookup: %s", want.msg);
      free(req);
      for (int e = ENC_PBC_FIXED; e < N_ENC; e++) {
        req = encode_req(e, fp, 2, tab, k, ids, cnt, NULL, &len);
        if (e == ENC_HAND) { /* any decoder reads it; every table's ids 8-aligned in it */
          Shardrec__V1__LookupRequest *q = shardrec__v1__lookup_request__unpack(NULL, len, req);
          ck_assert_ptr_nonnull(q);
          ck_assert_uint_eq(q->n_tables, (size_t)k);
          for (int j = 0; j < k; j++) {
            ck_assert_uint_eq(q->tables[j]->table_id, tids[tab[j]]);
            ck_assert_uint_eq(q->tables[j]->n_ids, 0);
            ck_assert_uint_eq(q->tables[j]->n_ids_fixed, cnt[j]);
            ck_assert(!memcmp(q->tables[j]->ids_fixed, ids[j], cnt[j] * 8));
            long off = find(req, len, (const uint8_t *)ids[j], cnt[j] * 8);
            ck_assert_msg(off >= 0 && off % 8 == 0, "table %d: ids at offset %ld", j, off);
          }
          shardrec__v1__lookup_request__free_unpacked(q, NULL);
        }
        for (size_t off = 0; off < 8; off++) {
          uint64_t p0, c0, p1, c1;
          ids_stats(svc, &p0, &c0);
          rpc_reply r;
          handle_at(svc, RPC_LOOKUP, req, len, off, &r);
          ck_assert_msg(r.status == RPC_OK, "enc %d off %zu: %s", e, off, r.msg);
          ck_assert_uint_eq(r.out_len, want.out_len);
          ck_assert_msg(!memcmp(r.out, want.out, want.out_len),
                        "enc %d off %zu n %zu: the answer differs from the varint request's", e,
                        off, ns[c]);
          free(r.out);
          ids_stats(svc, &p1, &c1);
          ck_assert_uint_eq((p1 - p0) + (c1 - c0), total);
          if (e == ENC_HAND && off == 0) { /* aligned: all read in place */
            ck_assert_uint_eq(p1 - p0, total);
            in_place_calls++;
          }
          if (e == ENC_HAND && off % 8) { /* none is aligned: all copied */
            ck_assert_uint_eq(c1 - c0, total);
            copied_calls++;
          }
        }
        free(req);
      }
      free(want.out);
    }
  ck_assert_int_eq(in_place_calls, 20);
  ck_assert_int_eq(copied_calls, 140);
  rpc_service_destroy(svc);
  emb_store_destroy(st);
  emb_store_destroy(loc);
  emb_plan_free(plan);
}
END_TEST

/* The same Pushes (several tables, several steps) sent to three services
 * as varint ids, protobuf-c ids_fixed and hand-written ids_fixed (at
 * offsets 0, 3, 6 and 9 bytes, which leave the ids and the gradients
 * aligned or not; gradients are read where they lie) leave exactly the
 * same rows, and the varint one's are the in-process store's. */
START_TEST(test_ids_fixed_push) {
  emb_plan *plan = plan_make();
  char err[512], fp[EMB_FP_HEX];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  emb_store *st[N_ENC], *loc = emb_store_create_local(plan, err, sizeof err);
  rpc_service *svc[N_ENC];
  int shard = 0;
  rpc_service_opts so = {.shards = &shard, .n_shards = 1};
  for (int e = 0; e < N_ENC; e++) {
    st[e] = emb_store_create_local(plan, err, sizeof err);
    svc[e] = rpc_service_create(plan, st[e], &so, err, sizeof err);
    ck_assert_msg(svc[e] != NULL, "%s", err);
  }
  static uint64_t ids[NT][300];
  static float g[300 * 33];
  for (int step = 1; step <= 8; step++) {
    const int k = 1 + step % NT;
    int tab[NT];
    size_t cnt[NT];
    const uint64_t *ip[NT] = {0};
    size_t counts[NT] = {0};
    const float *gp[NT] = {0};
    for (int j = 0; j < k; j++) {
      tab[j] = (step + j) % NT;
      cnt[j] = (size_t)(step * 37 + j) % 300 + 1;
      for (size_t i = 0; i < cnt[j]; i++) ids[j][i] = (i * 331 + (size_t)step) % 1000; /* unique */
      ip[tab[j]] = ids[j];
      counts[tab[j]] = cnt[j];
      gp[tab[j]] = g;
    }
    for (int i = 0; i < 300 * 33; i++) g[i] = (float)((i * 31 + step) % 97) / 97.0f - 0.5f;
    emb_idset set = {NT, ip, counts};
    ck_assert_int_eq(emb_store_push(loc, step, 0.25f, &set, gp), 0);
    for (int e = 0; e < N_ENC; e++) {
      size_t len;
      uint8_t *req = encode_req(e, fp, step, tab, k, ids, cnt, g, &len);
      rpc_reply r;
      handle_at(svc[e], RPC_PUSH, req, len, e == ENC_HAND ? (size_t)step % 4 * 3 : 0, &r);
      ck_assert_msg(r.status == RPC_OK, "enc %d step %d: %s", e, step, r.msg);
      Shardrec__V1__PushResponse *a = shardrec__v1__push_response__unpack(NULL, r.out_len, r.out);
      ck_assert_ptr_nonnull(a);
      ck_assert(a->applied);
      size_t total = 0;
      for (int j = 0; j < k; j++) total += cnt[j];
      ck_assert_uint_eq(a->rows, total);
      shardrec__v1__push_response__free_unpacked(a, NULL);
      free(r.out);
      free(req);
    }
  }
  uint64_t p, c;
  ids_stats(svc[ENC_HAND], &p, &c);
  ck_assert(p > 0 && c > 0); /* offsets 0 (in place) and 4, 8 (ids copied, grads in place) */
  /* Every row of every table, as the three services and the store hold it. */
  static uint64_t all[NT][300];
  static float want[NT][1000 * 33];
  for (int lo = 0; lo < 1000; lo += 250) {
    int tab[NT];
    size_t cnt[NT];
    const uint64_t *ip[NT];
    size_t counts[NT];
    float *op[NT];
    for (int t = 0; t < NT; t++) {
      tab[t] = t;
      cnt[t] = counts[t] = 250;
      for (int i = 0; i < 250; i++) all[t][i] = (uint64_t)(lo + i);
      ip[t] = all[t];
      op[t] = want[t];
    }
    emb_idset set = {NT, ip, counts};
    ck_assert_int_eq(emb_store_lookup_begin(loc, 9, &set, op), 0);
    ck_assert_int_eq(emb_store_lookup_wait(loc), 0);
    size_t len;
    uint8_t *req = encode_req(ENC_VARINT, fp, 9, tab, NT, all, cnt, NULL, &len);
    rpc_reply r[N_ENC];
    for (int e = 0; e < N_ENC; e++) {
      handle_at(svc[e], RPC_LOOKUP, req, len, 0, &r[e]);
      ck_assert_msg(r[e].status == RPC_OK, "%s", r[e].msg);
    }
    /* (The answers differ in their incarnation only.) */
    for (int e = 0; e < N_ENC; e++) {
      Shardrec__V1__LookupResponse *a =
          shardrec__v1__lookup_response__unpack(NULL, r[e].out_len, r[e].out);
      ck_assert_ptr_nonnull(a);
      ck_assert_uint_eq(a->n_tables, NT);
      for (int t = 0; t < NT; t++)
        ck_assert_msg(a->tables[t]->rows.len == 250 * (size_t)dims[t] * 4 &&
                          !memcmp(a->tables[t]->rows.data, want[t], a->tables[t]->rows.len),
                      "encoding %d, table %d rows %d..: the pushes left other rows than the "
                      "store's", e, t, lo);
      shardrec__v1__lookup_response__free_unpacked(a, NULL);
    }
    for (int e = 0; e < N_ENC; e++) free(r[e].out);
    free(req);
  }
  for (int e = 0; e < N_ENC; e++) {
    rpc_service_destroy(svc[e]);
    emb_store_destroy(st[e]);
  }
  emb_store_destroy(loc);
  emb_plan_free(plan);
}
END_TEST

/* A request of header (fp, step 3) then one table field (field number
 * tables_field) of content tab[tlen], into out; *at gets the offset of the
 * table's content. Returns its length. */
static size_t raw_req(char *fp, int push, const uint8_t *tab, size_t tlen, uint8_t *out,
                      size_t *at) {
  Shardrec__V1__RequestHeader h;
  header(&h, fp, 3);
  size_t hl = shardrec__v1__request_header__get_packed_size(&h), n = 0;
  ck_assert_uint_lt(hl, 128);
  ck_assert_uint_lt(tlen, 128);
  out[n++] = 0x0a;
  out[n++] = (uint8_t)hl;
  n += shardrec__v1__request_header__pack(&h, out + n);
  if (push) { /* learning_rate 0.25 */
    const float lr = 0.25f;
    out[n++] = 0x15;
    memcpy(out + n, &lr, 4);
    n += 4;
  }
  out[n++] = push ? 0x1a : 0x12;
  out[n++] = (uint8_t)tlen;
  *at = n;
  memcpy(out + n, tab, tlen);
  return n + tlen;
}

/* req[len] at an exact-size heap copy (an overread is the sanitizers'),
 * refused INVALID_ARGUMENT with a message holding want. */
static void expect_refused(rpc_service *svc, rpc_method m, const uint8_t *req, size_t len,
                           const char *want) {
  uint8_t *copy = malloc(len ? len : 1);
  memcpy(copy, req, len);
  rpc_reply r;
  rpc_service_handle(svc, m, copy, len, &r);
  free(copy);
  ck_assert_msg(r.status == RPC_INVALID_ARGUMENT, "want '%s': status %d (%s)", want, r.status,
                r.msg);
  ck_assert_msg(strstr(r.msg, want) != NULL, "want '%s' in: %s", want, r.msg);
  ck_assert_ptr_null(r.out);
}

/* One id given as a single fixed64 field, not packed (protobuf's parsers
 * take both forms of a repeated field), is answered as the same id as a
 * varint; a request of more tables than the plan has is refused at the
 * entry past them, before the decoder's scratch grows with them. */
START_TEST(test_unpacked_fixed_and_too_many_tables) {
  emb_plan *plan = plan_make();
  char err[512], fp[EMB_FP_HEX];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  emb_store *st = emb_store_create_local(plan, err, sizeof err);
  int shard = 0;
  rpc_service_opts so = {.shards = &shard, .n_shards = 1};
  rpc_service *svc = rpc_service_create(plan, st, &so, err, sizeof err);
  ck_assert_msg(svc != NULL, "%s", err);
  uint8_t req[512], req2[512];
  size_t at, len, len2;
  /* table_id 300 (ac 02: dim 16), id 5 */
  const uint8_t unpacked[] = {0x08, 0xac, 0x02, 0x19, 5, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t varint[] = {0x08, 0xac, 0x02, 0x12, 0x01, 5};
  len = raw_req(fp, 0, unpacked, sizeof unpacked, req, &at);
  len2 = raw_req(fp, 0, varint, sizeof varint, req2, &at);
  for (size_t off = 0; off < 8; off++) {
    rpc_reply a, b;
    handle_at(svc, RPC_LOOKUP, req, len, off, &a);
    ck_assert_msg(a.status == RPC_OK, "offset %zu: status %d (%s)", off, a.status, a.msg);
    handle_at(svc, RPC_LOOKUP, req2, len2, off, &b);
    ck_assert_int_eq(b.status, RPC_OK);
    ck_assert_uint_eq(a.out_len, b.out_len);
    ck_assert(!memcmp(a.out, b.out, a.out_len));
    free(a.out);
    free(b.out);
  }
  /* NT + 1 table entries, each table 0 with no ids. */
  Shardrec__V1__RequestHeader h;
  header(&h, fp, 3);
  size_t n = 0, hl = shardrec__v1__request_header__get_packed_size(&h), last = 0;
  req[n++] = 0x0a;
  req[n++] = (uint8_t)hl;
  n += shardrec__v1__request_header__pack(&h, req + n);
  for (int k = 0; k <= NT; k++) {
    last = n;
    req[n++] = 0x12, req[n++] = 0x02, req[n++] = 0x08, req[n++] = 0x00;
  }
  char want[160];
  snprintf(want, sizeof want, "tables[%d] at offset %zu: more tables than the plan's", NT, last);
  expect_refused(svc, RPC_LOOKUP, req, n, want);
  rpc_service_destroy(svc);
  emb_store_destroy(st);
  emb_plan_free(plan);
}
END_TEST

/* A table with both ids and ids_fixed is refused naming it (Lookup and
 * Push); cut, overlong and garbled fields are refused naming the field
 * and its offset in the request; every prefix of a good request is
 * answered or refused with a message, and nothing was pushed. */
START_TEST(test_bad_requests_refused) {
  emb_plan *plan = plan_make();
  char err[512], fp[EMB_FP_HEX], want[200];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  emb_store *st = emb_store_create_local(plan, err, sizeof err);
  int shard = 0;
  rpc_service_opts so = {.shards = &shard, .n_shards = 1};
  rpc_service *svc = rpc_service_create(plan, st, &so, err, sizeof err);
  ck_assert_msg(svc != NULL, "%s", err);
  uint8_t req[512];
  size_t at, len;
  /* table_id 300 (ac 02), ids [5], ids_fixed [6] */
  const uint8_t both[] = {0x08, 0xac, 0x02, 0x12, 0x01, 0x05, 0x1a, 0x08, 6, 0, 0, 0, 0, 0, 0, 0};
  len = raw_req(fp, 0, both, sizeof both, req, &at);
  expect_refused(svc, RPC_LOOKUP, req, len, "tables[0].table_id 300: both ids and ids_fixed");
  const uint8_t both_push[] = {0x08, 0x00, 0x12, 0x01, 0x05, 0x22, 0x08, 6, 0, 0, 0, 0, 0, 0,
                               0, 0x1a, 0x04, 0, 0, 0, 0};
  len = raw_req(fp, 1, both_push, sizeof both_push, req, &at);
  expect_refused(svc, RPC_PUSH, req, len, "tables[0].table_id 0: both ids and ids_fixed");
  /* ids_fixed of 12 bytes */
  const uint8_t twelve[] = {0x08, 0x00, 0x1a, 0x0c, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0};
  len = raw_req(fp, 0, twelve, sizeof twelve, req, &at);
  snprintf(want, sizeof want, "tables[0].ids_fixed at offset %zu: length not a multiple of 8", at + 4);
  expect_refused(svc, RPC_LOOKUP, req, len, want);
  /* an 11-byte varint among packed ids */
  const uint8_t overlong[] = {0x08, 0x00, 0x12, 0x0c, 0x03, 0xff, 0xff, 0xff, 0xff, 0xff,
                              0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  len = raw_req(fp, 0, overlong, sizeof overlong, req, &at);
  snprintf(want, sizeof want, "tables[0].ids at offset %zu: varint longer than 10 bytes", at + 5);
  expect_refused(svc, RPC_LOOKUP, req, len, want);
  /* packed ids whose last varint is cut off */
  const uint8_t cutvar[] = {0x08, 0x00, 0x12, 0x02, 0x03, 0x85};
  len = raw_req(fp, 0, cutvar, sizeof cutvar, req, &at);
  snprintf(want, sizeof want, "tables[0].ids at offset %zu: last varint cut off", at + 5);
  expect_refused(svc, RPC_LOOKUP, req, len, want);
  /* table_id as bytes; a group; grads as a varint (Push) */
  const uint8_t tid_len[] = {0x0a, 0x01, 0x00};
  len = raw_req(fp, 0, tid_len, sizeof tid_len, req, &at);
  snprintf(want, sizeof want, "tables[0].table_id at offset %zu: wire type 2", at);
  expect_refused(svc, RPC_LOOKUP, req, len, want);
  const uint8_t group[] = {0x08, 0x00, 0x23, 0x24};
  len = raw_req(fp, 0, group, sizeof group, req, &at);
  snprintf(want, sizeof want, "tables[0] field 4 at offset %zu: wire type 3", at + 2);
  expect_refused(svc, RPC_LOOKUP, req, len, want);
  const uint8_t grads_var[] = {0x08, 0x00, 0x22, 0x08, 6, 0, 0, 0, 0, 0, 0, 0, 0x18, 0x01};
  len = raw_req(fp, 1, grads_var, sizeof grads_var, req, &at);
  snprintf(want, sizeof want, "tables[0].grads at offset %zu: wire type 0", at + 12);
  expect_refused(svc, RPC_PUSH, req, len, want);
  /* a table longer than the request */
  const uint8_t t3[] = {0x08, 0x00, 0x1a};
  len = raw_req(fp, 0, t3, sizeof t3, req, &at);
  req[at - 1] = 50;
  snprintf(want, sizeof want, "not a valid shardrec.v1.LookupRequest (%zu bytes): tables at offset %zu: length past the end", len, at - 1);
  expect_refused(svc, RPC_LOOKUP, req, len, want);
  /* a header whose job_id runs past the header */
  const uint8_t hdr[] = {0x0a, 0x04, 0x12, 0x05, 'a', 'b'};
  expect_refused(svc, RPC_LOOKUP, hdr, sizeof hdr, "header.job_id at offset 3: length past the end");
  /* a tag cut off at the end */
  const uint8_t tag[] = {0x0a, 0x00, 0x80};
  expect_refused(svc, RPC_PUSH, tag, sizeof tag, "the request at offset 2: field tag cut off");
  /* Every prefix of a good Push and Lookup: answered when it ends where a
   * field of the request ends (a request with fewer fields), else refused
   * with a message. */
  static uint64_t ids[NT][300];
  static float g[300 * 33];
  int tab[2] = {1, 3};
  size_t cnt[2] = {5, 9};
  for (int j = 0; j < 2; j++)
    for (size_t i = 0; i < cnt[j]; i++) ids[j][i] = i * 3 + (size_t)j;
  for (int push = 0; push < 2; push++) {
    uint8_t *good = encode_req(ENC_HAND, fp, 4, tab, 2, ids, cnt, push ? g : NULL, &len);
    uint8_t *ends = calloc(len + 1, 1); /* ends[k]: a field of the request ends at k */
    for (size_t k = 0; k < len;) { /* tags and lengths of one or two bytes here */
      const uint8_t wt = good[k++] & 7;
      size_t n = wt == 5 ? 4 : good[k] < 0x80 ? good[k++] : (good[k] & 0x7f) | (size_t)good[k + 1] << 7;
      if (wt == 2 && n >= 0x80) k += 2;
      k += n;
      ends[k] = 1;
    }
    ck_assert(ends[len]);
    for (size_t cut = 0; cut < len; cut++) {
      uint8_t *copy = malloc(cut ? cut : 1);
      memcpy(copy, good, cut);
      rpc_reply r;
      rpc_service_handle(svc, push ? RPC_PUSH : RPC_LOOKUP, copy, cut, &r);
      free(copy);
      ck_assert_msg((r.status == RPC_OK) == (ends[cut] != 0), "push %d cut %zu of %zu: %d (%s)",
                    push, cut, len, r.status, r.msg);
      if (r.status != RPC_OK) {
        ck_assert_msg(r.msg[0] != 0, "cut %zu: refused without a message", cut);
        ck_assert_ptr_null(r.out);
      }
      free(r.out);
    }
    free(ends);
    free(good);
  }
  rpc_service_destroy(svc);
  emb_store_destroy(st);
  emb_plan_free(plan);
}
END_TEST

/* Whether two LookupResponses (of two services: their incarnations
 * differ) answer the same tables with the same bytes of rows. */
static int same_answer(const rpc_reply *ra, const rpc_reply *rb) {
  Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, ra->out_len, ra->out),
                               *b = shardrec__v1__lookup_response__unpack(NULL, rb->out_len, rb->out);
  ck_assert(a && b && a->incarnation != b->incarnation);
  int same = a->n_tables == b->n_tables;
  for (size_t i = 0; same && i < a->n_tables; i++)
    same = a->tables[i]->table_id == b->tables[i]->table_id &&
           a->tables[i]->rows.len == b->tables[i]->rows.len && a->tables[i]->rows.len &&
           !memcmp(a->tables[i]->rows.data, b->tables[i]->rows.data, a->tables[i]->rows.len);
  shardrec__v1__lookup_response__free_unpacked(a, NULL);
  shardrec__v1__lookup_response__free_unpacked(b, NULL);
  return same;
}

/* A Lookup of look[len] to services a and b answers the same rows. */
static void same_rows(rpc_service *a, rpc_service *b, const uint8_t *look, size_t len,
                      const char *when) {
  rpc_reply ra, rb;
  rpc_service_handle(a, RPC_LOOKUP, look, len, &ra);
  rpc_service_handle(b, RPC_LOOKUP, look, len, &rb);
  ck_assert_msg(ra.status == RPC_OK && rb.status == RPC_OK, "%s: %s / %s", when, ra.msg, rb.msg);
  ck_assert_msg(same_answer(&ra, &rb), "%s: the rows differ", when);
  free(ra.out);
  free(rb.out);
}

/* A Push of tables tab[2] (ids, cnt, gradients g) at step by rank 0 of a
 * job of world ranks with learning rate lr, in the client's encoding; with
 * parts > 1 the first of that many parts. */
static uint8_t *push_req(char *fp, int64_t step, int world, int parts, float lr, const int *tab,
                         uint64_t (*ids)[300], const size_t *cnt, const float *g, size_t *len) {
  Shardrec__V1__RequestHeader h;
  header(&h, fp, step);
  h.world_size = world;
  h.parts = parts;
  rpc_wire_table wt[2];
  for (int j = 0; j < 2; j++)
    wt[j] = (rpc_wire_table){.table_id = tids[tab[j]], .ids = ids[j], .n = cnt[j], .grads = g,
                             .dim = dims[tab[j]]};
  return rpc__push_encode(&h, lr, wt, 2, len);
}

/* A PushLookup of push[pl] and look[ll] to b: refused FAILED_PRECONDITION
 * with a message holding want. */
static void precondition_refused(rpc_service *b, const uint8_t *push, size_t pl,
                                 const uint8_t *look, size_t ll, const char *want) {
  size_t fl;
  uint8_t *fused = rpc__push_lookup_encode(push, pl, look, ll, &fl);
  rpc_reply r;
  rpc_service_handle(b, RPC_PUSH_LOOKUP, fused, fl, &r);
  ck_assert_msg(r.status == RPC_FAILED_PRECONDITION && strstr(r.msg, want), "%d: %s", r.status,
                r.msg);
  free(fused);
}

/* A PushLookup is its Push, then its Lookup: over 6 steps (each looking up
 * the rows it pushes), its answer has the rows of a Lookup sent after the
 * Push to a twin service, wherever the request lies in memory; the
 * client's encoding puts both parts at a multiple of 8, so that every id
 * of both is read in place, and protobuf-c reads it as the
 * PushLookupRequest of the two. Refused, saying what: a part missing,
 * given twice or of another wire type; a job of two ranks (nothing
 * pushed); a part of a push (nothing pushed); a push refused ("push: ",
 * nothing pushed); a Lookup refused after its push was taken
 * (RPC_MSG_AFTER_PUSH, the push applied). The in-flight budget is all
 * given back. */
START_TEST(test_push_lookup) {
  emb_plan *plan = plan_make();
  char err[512], fp[EMB_FP_HEX], want[200];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  int shard = 0;
  rpc_service_opts so = {.shards = &shard, .n_shards = 1};
  emb_store *sa = emb_store_create_local(plan, err, sizeof err),
            *sb = emb_store_create_local(plan, err, sizeof err);
  rpc_service *a = rpc_service_create(plan, sa, &so, err, sizeof err),
              *b = rpc_service_create(plan, sb, &so, err, sizeof err);
  ck_assert_msg(a && b, "%s", err);
  static uint64_t ids[NT][300];
  static float g[300 * 33];
  const int tab[2] = {2, 3};
  size_t cnt[2], pl, ll, fl;
  uint8_t *look = NULL;
  for (int step = 1; step <= 6; step++) {
    for (int j = 0; j < 2; j++) {
      cnt[j] = 50 + (size_t)step * 7 + (size_t)j;
      for (size_t i = 0; i < cnt[j]; i++) ids[j][i] = (i * 7 + (size_t)step * 3) % 1000;
    }
    for (int i = 0; i < 300 * 33; i++) g[i] = (float)((i * 13 + step) % 89) / 89.0f - 0.5f;
    uint8_t *push = encode_req(ENC_HAND, fp, step, tab, 2, ids, cnt, g, &pl);
    free(look);
    look = encode_req(ENC_HAND, fp, step + 1, tab, 2, ids, cnt, NULL, &ll);
    rpc_reply ra, rb;
    rpc_service_handle(a, RPC_PUSH, push, pl, &ra);
    ck_assert_msg(ra.status == RPC_OK, "%s", ra.msg);
    free(ra.out);
    rpc_service_handle(a, RPC_LOOKUP, look, ll, &ra);
    ck_assert_msg(ra.status == RPC_OK, "%s", ra.msg);
    uint8_t *fused = rpc__push_lookup_encode(push, pl, look, ll, &fl);
    uint64_t in0, cp0, in1, cp1;
    ids_stats(b, &in0, &cp0);
    handle_at(b, RPC_PUSH_LOOKUP, fused, fl, (size_t)step - 1, &rb);
    ck_assert_msg(rb.status == RPC_OK, "step %d: %s", step, rb.msg);
    ck_assert_msg(same_answer(&ra, &rb),
                  "step %d: the PushLookup's rows are not those of a Lookup after the Push", step);
    ids_stats(b, &in1, &cp1);
    if (step == 1) /* at an aligned address: every id of both parts read where it lies */
      ck_assert_msg(in1 - in0 == 2 * (cnt[0] + cnt[1]) && cp1 == cp0,
                    "%llu ids read in place, %llu copied", (unsigned long long)(in1 - in0),
                    (unsigned long long)(cp1 - cp0));
    Shardrec__V1__PushLookupRequest *q =
        shardrec__v1__push_lookup_request__unpack(NULL, fl, fused);
    ck_assert_ptr_nonnull(q);
    ck_assert(q->push && q->lookup && q->push->n_tables == 2 && q->lookup->n_tables == 2);
    ck_assert_int_eq(q->push->header->step, step);
    ck_assert_int_eq(q->lookup->header->step, step + 1);
    shardrec__v1__push_lookup_request__free_unpacked(q, NULL);
    free(ra.out);
    free(rb.out);
    free(fused);
    free(push);
  }
  /* Malformed: the lookup missing, the push twice, the lookup a varint. */
  size_t push_len;
  uint8_t *push = push_req(fp, 10, 1, 0, 0.25f, tab, ids, cnt, g, &push_len);
  uint8_t *bad = malloc(push_len + 16);
  bad[0] = 0x0a;
  size_t n = (size_t)(rpc__varint_put(bad + 1, push_len) - bad);
  memcpy(bad + n, push, push_len);
  n += push_len;
  snprintf(want, sizeof want, "PushLookupRequest (%zu bytes): lookup at offset %zu: missing", n, n);
  expect_refused(b, RPC_PUSH_LOOKUP, bad, n, want);
  bad[n] = 0x10, bad[n + 1] = 0x01;
  snprintf(want, sizeof want, "lookup at offset %zu: wire type 0 is not this field's", n);
  expect_refused(b, RPC_PUSH_LOOKUP, bad, n + 2, want);
  bad[n] = 0x0a, bad[n + 1] = 0x00;
  snprintf(want, sizeof want, "push at offset %zu: given twice", n);
  expect_refused(b, RPC_PUSH_LOOKUP, bad, n + 2, want);
  free(bad);
  same_rows(a, b, look, ll, "after the malformed ones");
  /* Two ranks, and a part of a push (its Lookup would not wait for the
   * other parts): refused, nothing pushed. */
  uint8_t *two = push_req(fp, 10, 2, 0, 0.25f, tab, ids, cnt, g, &pl);
  precondition_refused(b, two, pl, look, ll, "PushLookup is for jobs of one rank (world_size 2)");
  free(two);
  uint8_t *part = push_req(fp, 10, 1, 2, 0.25f, tab, ids, cnt, g, &pl);
  precondition_refused(b, part, pl, look, ll, "PushLookup takes a whole push (parts 2)");
  free(part);
  same_rows(a, b, look, ll, "after the two-rank one and the part");
  /* The push refused: nothing pushed. */
  uint8_t *nan_lr = push_req(fp, 10, 1, 0, NAN, tab, ids, cnt, g, &pl);
  uint8_t *fused = rpc__push_lookup_encode(nan_lr, pl, look, ll, &fl);
  expect_refused(b, RPC_PUSH_LOOKUP, fused, fl, "push: learning_rate nan: must be finite");
  free(fused);
  free(nan_lr);
  same_rows(a, b, look, ll, "after the refused push");
  /* The Lookup refused (a table not in the plan) after the push was taken:
   * the push is applied, as a Push of it to a is. */
  Shardrec__V1__RequestHeader h;
  header(&h, fp, 11);
  rpc_wire_table wt = {.table_id = 5, .ids = ids[0], .n = 3, .dim = 1};
  size_t bl;
  uint8_t *badlook = rpc__lookup_encode(&h, &wt, 1, 0, &bl);
  fused = rpc__push_lookup_encode(push, push_len, badlook, bl, &fl);
  snprintf(want, sizeof want, "%s: tables[0]", RPC_MSG_AFTER_PUSH);
  expect_refused(b, RPC_PUSH_LOOKUP, fused, fl, want);
  rpc_reply r;
  rpc_service_handle(a, RPC_PUSH, push, push_len, &r);
  ck_assert_msg(r.status == RPC_OK, "%s", r.msg);
  free(r.out);
  same_rows(a, b, look, ll, "after the refused Lookup");
  /* Every call's share of the in-flight budget given back: the push's
   * before its Lookup ran, the Lookup's with its answer; the 13 calls
   * counted, refused ones too. */
  rpc_service_handle(b, RPC_STATS, NULL, 0, &r);
  ck_assert_int_eq(r.status, RPC_OK);
  Shardrec__V1__StatsResponse *st = shardrec__v1__stats_response__unpack(NULL, r.out_len, r.out);
  ck_assert_ptr_nonnull(st);
  ck_assert_msg(st->inflight_bytes == 0 && st->push_lookup_calls == 13,
                "%llu bytes still held; %llu PushLookup calls",
                (unsigned long long)st->inflight_bytes, (unsigned long long)st->push_lookup_calls);
  shardrec__v1__stats_response__free_unpacked(st, NULL);
  free(r.out);
  free(fused);
  free(badlook);
  free(push);
  free(look);
  rpc_service_destroy(a);
  rpc_service_destroy(b);
  emb_store_destroy(sa);
  emb_store_destroy(sb);
  emb_plan_free(plan);
}
END_TEST

/* The service's calls with a token, as the server makes them: a call that
 * finds no room in the in-flight budget is deferred (RPC_DEFERRED, nothing
 * done) and handled again later. */
static int server_token;

/* req[len] of method m to svc with the server's token. */
static void handle_tok(rpc_service *svc, rpc_method m, const uint8_t *req, size_t len,
                       rpc_reply *r) {
  rpc_service_handle_call(svc, m, req, len, &server_token, 10, r);
}

/* A PushLookup deferred for budget is handled again whole. Beside a large
 * Lookup whose answer is not yet sent (the holder): with room for the push
 * but not for the Lookup's answer, the push is taken and the Lookup
 * deferred, and the call handled again finds the push a retry (the rows
 * are those of one push: a twin service's after one Push); with no room
 * for the push, nothing is pushed (the rows of an untouched twin), and the
 * call handled again pushes once. */
START_TEST(test_push_lookup_deferred) {
  emb_plan *plan = plan_make();
  char err[512], fp[EMB_FP_HEX];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  int shard = 0;
  static uint64_t ids[NT][300];
  static float g[300 * 33];
  for (int i = 0; i < 300 * 33; i++) g[i] = (float)((i * 17) % 71) / 71.0f - 0.5f;
  for (size_t i = 0; i < 300; i++) ids[0][i] = ids[1][i] = i;
  const int tab[2] = {2, 3}, hold_tab[1] = {3};
  size_t cnt[2] = {10, 10}, hold_cnt[1] = {300}, look_cnt[2] = {300, 300}, pl, ll, hl, fl;
  uint8_t *push = push_req(fp, 1, 1, 0, 0.25f, tab, ids, cnt, g, &pl);
  uint8_t *look = encode_req(ENC_HAND, fp, 2, tab, 2, ids, look_cnt, NULL, &ll);
  uint8_t *hold = encode_req(ENC_HAND, fp, 1, hold_tab, 1, ids, hold_cnt, NULL, &hl);
  uint8_t *fused = rpc__push_lookup_encode(push, pl, look, ll, &fl);
  /* Services: [0] the twin that gets Push then Lookup, [1] untouched, [2]
   * the holder's share measured, then [3] room for the holder and the push
   * (not the Lookup's answer), [4] the holder and not the push. */
  emb_store *st[5];
  rpc_service *sv[5];
  rpc_reply h, r, t;
  size_t held = 0;
  for (int k = 0; k < 5; k++) {
    rpc_service_opts so = {.shards = &shard, .n_shards = 1};
    if (k == 3) so.inflight_bytes = held + 3 * pl + 1024;
    if (k == 4) so.inflight_bytes = held + 3 * pl - 1;
    st[k] = emb_store_create_local(plan, err, sizeof err);
    sv[k] = rpc_service_create(plan, st[k], &so, err, sizeof err);
    ck_assert_msg(sv[k] != NULL, "%s", err);
    if (k != 2) continue;
    handle_tok(sv[2], RPC_LOOKUP, hold, hl, &h);
    ck_assert_msg(h.status == RPC_OK, "%s", h.msg);
    held = h.held;
    free(h.out);
    rpc_service_release(sv[2], h.held);
  }
  ck_assert_uint_gt(2 * ll + 3 * (size_t)(300 * 16 + 300 * 33) * 4, 3 * pl + 1024);
  rpc_service_handle(sv[0], RPC_PUSH, push, pl, &t);
  ck_assert_int_eq(t.status, RPC_OK);
  free(t.out);
  rpc_service_handle(sv[0], RPC_LOOKUP, look, ll, &t);
  ck_assert_int_eq(t.status, RPC_OK);
  for (int k = 3; k <= 4; k++) {
    handle_tok(sv[k], RPC_LOOKUP, hold, hl, &h);
    ck_assert_msg(h.status == RPC_OK && h.held == held, "%d: holder: %d %s", k, h.status, h.msg);
    handle_tok(sv[k], RPC_PUSH_LOOKUP, fused, fl, &r);
    ck_assert_msg(r.status == RPC_DEFERRED && !r.out, "%d: beside the holder: %d (%s)", k,
                  r.status, r.msg);
    free(h.out);
    rpc_service_release(sv[k], h.held);
    if (k == 3) same_rows(sv[0], sv[k], look, ll, "the Lookup deferred: its push taken");
    else same_rows(sv[1], sv[k], look, ll, "the push deferred: nothing pushed");
    handle_tok(sv[k], RPC_PUSH_LOOKUP, fused, fl, &r);
    ck_assert_msg(r.status == RPC_OK, "%d: again: %d (%s)", k, r.status, r.msg);
    ck_assert_msg(same_answer(&t, &r), "%d: the rows are not those after one push", k);
    free(r.out);
    rpc_service_release(sv[k], r.held);
  }
  free(t.out);
  for (int k = 0; k < 5; k++) {
    rpc_service_destroy(sv[k]);
    emb_store_destroy(st[k]);
  }
  free(fused);
  free(hold);
  free(look);
  free(push);
  emb_plan_free(plan);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_wire");
  TCase *tc = tcase_create("wire");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_lookup_answer_layout);
  tcase_add_test(tc, test_push_repeated_ids);
  tcase_add_test(tc, test_ids_fixed_lookup);
  tcase_add_test(tc, test_ids_fixed_push);
  tcase_add_test(tc, test_bad_requests_refused);
  tcase_add_test(tc, test_unpacked_fixed_and_too_many_tables);
  tcase_add_test(tc, test_push_lookup);
  tcase_add_test(tc, test_push_lookup_deferred);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
