/* The shard service's Remove (rpc/service_remove.c), bytes in, over an
 * in-process store of a 2-shard row-wise plan of which shard 0 is served:
 * pushed rows removed by Remove read their init value again (ids as
 * varints and as ids_fixed), rows not named keep their pushed values, and
 * the answer counts the ids; a row of the other shard, a table given
 * twice, both id fields in a table, rank 1 of a multi-rank job, another plan's
 * fingerprint, garbage and a read-only server are refused with a message
 * naming the field, nothing removed. */
#include <check.h>

#include "tests/check_main.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"

#define DIM 4

typedef struct {
  emb_plan *plan;
  emb_store *st;
  rpc_service *svc;
  char fp[EMB_FP_HEX];
} fixture;

static void fx_open(fixture *f, int read_only) {
  uint64_t rows[2] = {1000, 64};
  emb_plan_params pp = {.n_tables = 2, .rows = rows, .dim = DIM,
                        .optim = {.kind = EMB_OPT_SGD}, .seed = 3, .n_shards = 2,
                        .row_wise = 1};
  char err[256];
  ck_assert_msg(emb_plan_create(&pp, &f->plan, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(emb_plan_fingerprint(f->plan, f->fp), 0);
  f->st = emb_store_create_local(f->plan, err, sizeof err);
  ck_assert_msg(f->st != NULL, "%s", err);
  int shard = 0;
  rpc_service_opts so = {.shards = &shard, .n_shards = 1, .read_only = read_only};
  f->svc = rpc_service_create(f->plan, f->st, &so, err, sizeof err);
  ck_assert_msg(f->svc != NULL, "%s", err);
}

static void fx_close(fixture *f) {
  rpc_service_destroy(f->svc);
  emb_store_destroy(f->st);
  emb_plan_free(f->plan);
}

/* The first n ids of table t on shard s, ascending. */
static void ids_on(const fixture *f, int t, int s, uint64_t *out, size_t n) {
  for (uint64_t id = 0, k = 0; k < n; id++)
    if (emb_plan_shard_of(f->plan, t, id) == s) out[k++] = id;
}

/* Row id of table 0 as the store reads it now. */
static void read_row(fixture *f, uint64_t id, float *out) {
  const uint64_t *ip[2] = {&id, NULL};
  size_t counts[2] = {1, 0};
  float *outs[2] = {out, NULL};
  emb_idset set = {2, ip, counts};
  ck_assert_int_eq(emb_store_lookup_begin(f->st, 5, &set, outs), 0);
  ck_assert_int_eq(emb_store_lookup_wait(f->st), 0);
}

/* Gradients of 1 pushed to ids[n] of table 0 (so they differ from init). */
static void push_rows(fixture *f, const uint64_t *ids, size_t n) {
  float *g = malloc(n * DIM * sizeof *g);
  for (size_t i = 0; i < n * DIM; i++) g[i] = 1.0f;
  const uint64_t *ip[2] = {ids, NULL};
  size_t counts[2] = {n, 0};
  const float *gp[2] = {g, NULL};
  emb_idset set = {2, ip, counts};
  ck_assert_int_eq(emb_store_push(f->st, 1, 0.5f, &set, gp), 0);
  free(g);
}

/* A RemoveRequest, packed (caller frees): tables[n] of table_id tid[i]
 * with ids[i][cnt[i]] as varints, or as ids_fixed where fixed[i] (2: both). */
static uint8_t *remove_req(const char *fp, int world, uint32_t *tid, uint64_t **ids,
                           size_t *cnt, int *fixed, size_t n, size_t *len) {
  Shardrec__V1__RequestHeader h;
  shardrec__v1__request_header__init(&h);
  h.plan_fingerprint = (char *)fp;
  h.job_id = "rm";
  h.step = 4;
  h.world_size = world;
  h.rank = world - 1; /* the last rank */
  Shardrec__V1__TableIds ti[4], *tp[4];
  for (size_t i = 0; i < n; i++) {
    shardrec__v1__table_ids__init(&ti[i]);
    ti[i].table_id = tid[i];
    if (fixed[i] != 1) ti[i].ids = ids[i], ti[i].n_ids = cnt[i];
    if (fixed[i]) ti[i].ids_fixed = ids[i], ti[i].n_ids_fixed = cnt[i];
    tp[i] = &ti[i];
  }
  Shardrec__V1__RemoveRequest q = SHARDREC__V1__REMOVE_REQUEST__INIT;
  q.header = &h;
  q.n_tables = n;
  q.tables = tp;
  *len = shardrec__v1__remove_request__get_packed_size(&q);
  uint8_t *b = malloc(*len + 1);
  shardrec__v1__remove_request__pack(&q, b);
  return b;
}

static void expect(fixture *f, const uint8_t *req, size_t len, int status, const char *text) {
  rpc_reply r;
  rpc_service_handle(f->svc, RPC_REMOVE, req, len, &r);
  ck_assert_msg(r.status == status, "status %d (%s), wanted %d", r.status, r.msg, status);
  if (status != RPC_OK) ck_assert_msg(strstr(r.msg, text) != NULL, "'%s' lacks '%s'", r.msg, text);
  free(r.out);
}

START_TEST(test_remove_rows) {
  fixture f;
  fx_open(&f, 0);
  uint64_t mine[6];
  ids_on(&f, 0, 0, mine, 6);
  push_rows(&f, mine, 6);
  float init[6][DIM], pushed[6][DIM], now[DIM];
  for (int i = 0; i < 6; i++) {
    emb_row_init(f.plan, 0, mine[i], init[i]);
    read_row(&f, mine[i], pushed[i]);
    ck_assert(memcmp(init[i], pushed[i], sizeof init[i]) != 0);
  }
  /* ids 0, 1 as varints, then 2, 3 as ids_fixed; 4, 5 stay. */
  for (int fixed = 0; fixed < 2; fixed++) {
    uint32_t tid = 0;
    uint64_t *ip = mine + 2 * fixed;
    size_t cnt = 2, len;
    uint8_t *req = remove_req(f.fp, 1, &tid, &ip, &cnt, &fixed, 1, &len);
    rpc_reply r;
    rpc_service_handle(f.svc, RPC_REMOVE, req, len, &r);
    ck_assert_msg(r.status == RPC_OK, "%s", r.msg);
    Shardrec__V1__RemoveResponse *a = shardrec__v1__remove_response__unpack(NULL, r.out_len, r.out);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->rows, 2);
    shardrec__v1__remove_response__free_unpacked(a, NULL);
    free(r.out);
    free(req);
  }
  for (int i = 0; i < 6; i++) {
    read_row(&f, mine[i], now);
    ck_assert_msg(memcmp(now, i < 4 ? init[i] : pushed[i], sizeof now) == 0,
                  "row %llu: not %s", (unsigned long long)mine[i], i < 4 ? "its init value" : "kept");
  }
  fx_close(&f);
}
END_TEST

START_TEST(test_remove_refused) {
  fixture f;
  fx_open(&f, 0);
  uint64_t mine[2], theirs[1];
  ids_on(&f, 0, 0, mine, 2);
  ids_on(&f, 0, 1, theirs, 1);
  push_rows(&f, mine, 2);
  float pushed[DIM], now[DIM];
  read_row(&f, mine[0], pushed);
  uint32_t tid[2] = {0, 0};
  uint64_t *ip[2] = {mine, theirs};
  size_t cnt[2] = {2, 1}, len;
  int fx[2] = {0, 0};
  char want[200];
  /* a row of shard 1, beside rows of shard 0 in another table entry */
  uint32_t tid2[2] = {1, 0};
  uint64_t one[1];
  ids_on(&f, 1, 0, one, 1);
  uint64_t *ip2[2] = {one, theirs};
  size_t cnt2[2] = {1, 1};
  uint8_t *req = remove_req(f.fp, 1, tid2, ip2, cnt2, fx, 2, &len);
  snprintf(want, sizeof want, "tables[1].ids[0]: row %llu of table 0 (t0) lives on shard 1",
           (unsigned long long)theirs[0]);
  expect(&f, req, len, RPC_FAILED_PRECONDITION, want);
  free(req);
  /* table 0 twice */
  ip[1] = mine + 1;
  cnt[1] = 1;
  req = remove_req(f.fp, 1, tid, ip, cnt, fx, 2, &len);
  expect(&f, req, len, RPC_INVALID_ARGUMENT, "tables[1].table_id 0: table given twice");
  free(req);
  /* both id fields */
  fx[0] = 2;
  req = remove_req(f.fp, 1, tid, ip, cnt, fx, 1, &len);
  expect(&f, req, len, RPC_INVALID_ARGUMENT, "tables[0] (table_id 0): ids and ids_fixed both given");
  free(req);
  fx[0] = 0;
  /* rank 1 of a multi-rank job; another plan */
  req = remove_req(f.fp, 2, tid, ip, cnt, fx, 1, &len);
  expect(&f, req, len, RPC_FAILED_PRECONDITION, "header.rank 1: a multi-rank job's rows are removed by rank 0");
  free(req);
  req = remove_req("0123abcd", 1, tid, ip, cnt, fx, 1, &len);
  expect(&f, req, len, RPC_FAILED_PRECONDITION, "header.plan_fingerprint: request made under plan 0123abcd");
  free(req);
  const uint8_t junk[] = {0x0a, 0x05, 0x01};
  expect(&f, junk, sizeof junk, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.RemoveRequest (3 bytes)");
  read_row(&f, mine[0], now);
  ck_assert_msg(memcmp(now, pushed, sizeof now) == 0, "a refused Remove removed a row");
  fx_close(&f);
  /* a read-only server */
  fx_open(&f, 1);
  req = remove_req(f.fp, 1, tid, ip, cnt, fx, 1, &len);
  expect(&f, req, len, RPC_FAILED_PRECONDITION, "this server is read-only: Remove refused");
  free(req);
  fx_close(&f);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_remove");
  TCase *tc = tcase_create("remove");
  tcase_add_test(tc, test_remove_rows);
  tcase_add_test(tc, test_remove_refused);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
