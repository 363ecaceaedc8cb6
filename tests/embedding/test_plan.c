/* Tests for embedding/plan.h: JSON round trip, validation messages,
 * fingerprints, placement, SHA-256, row init. */
#include <check.h>

#include "tests/check_main.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/status.h"
#include "embedding/plan.h"

static emb_plan *make_plan(int n_shards, int row_wise, emb_optim_kind k) {
  static const uint64_t rows[] = {1460, 583, 10131227, 2202608, 305, 0};
  emb_plan_params pp;
  memset(&pp, 0, sizeof pp);
  pp.n_tables = 6;
  pp.rows = rows;
  pp.dim = 16;
  pp.pooling = EMB_POOL_SUM;
  pp.optim.kind = k;
  pp.optim.eps = -1;
  pp.optim.init_acc = k == EMB_OPT_SGD ? 0 : 0.1;
  pp.seed = 0xfedcba9876543210ULL;
  pp.n_shards = n_shards;
  pp.row_wise = row_wise;
  char err[256];
  emb_plan *p = NULL;
  int rc = emb_plan_create(&pp, &p, err, sizeof err);
  ck_assert_msg(rc == 0, "create: %s", err);
  return p;
}

static void tmpname(char *buf, size_t n, const char *tag) {
  snprintf(buf, n, "/tmp/sr_test_plan_%ld_%s.json", (long)getpid(), tag);
}

static void fps(const emb_plan *p, char m[EMB_FP_HEX], char a[EMB_FP_HEX]) {
  ck_assert_int_eq(emb_plan_model_fingerprint(p, m), 0);
  ck_assert_int_eq(emb_plan_fingerprint(p, a), 0);
}

/* The first id past a table's rows: none in range or in an unbounded
 * table, else the earliest of those out. */
START_TEST(test_first_out_of_range) {
  emb_plan *p = make_plan(1, 0, EMB_OPT_SGD); /* table 4: 305 rows; table 5: unbounded */
  uint64_t ids[600];
  for (size_t k = 0; k < 600; k++) ids[k] = k % 305;
  ck_assert_uint_eq(emb_plan_first_out_of_range(p, 4, ids, 600), 600);
  ck_assert_uint_eq(emb_plan_first_out_of_range(p, 4, ids, 0), 0);
  ids[417] = 305, ids[530] = UINT64_MAX;
  ck_assert_uint_eq(emb_plan_first_out_of_range(p, 4, ids, 600), 417);
  ck_assert_uint_eq(emb_plan_first_out_of_range(p, 4, ids, 417), 417);
  ids[3] = 1000;
  ck_assert_uint_eq(emb_plan_first_out_of_range(p, 4, ids, 600), 3);
  /* Past the table by 2^63 or more, and one short of it. */
  ids[3] = 304, ids[417] = 304, ids[530] = 304;
  ids[599] = (1ULL << 63) + 304;
  ck_assert_uint_eq(emb_plan_first_out_of_range(p, 4, ids, 600), 599);
  ids[599] = (1ULL << 63) - 1;
  ck_assert_uint_eq(emb_plan_first_out_of_range(p, 4, ids, 600), 599);
  ids[599] = (1ULL << 63) + 305;
  ck_assert_uint_eq(emb_plan_first_out_of_range(p, 4, ids, 600), 599);
  ids[599] = 0;
  ck_assert_uint_eq(emb_plan_first_out_of_range(p, 4, ids, 600), 600);
  ids[3] = 1000;
  ck_assert_uint_eq(emb_plan_first_out_of_range(p, 5, ids, 600), 600);
  /* The refusal names the first id past the table, with or without what. */
  char err[256] = "";
  ck_assert_int_eq(emb_plan_check_range(p, 5, ids, 600, "push", err, sizeof err), 0);
  ck_assert_str_eq(err, "");
  ck_assert_int_eq(emb_plan_check_range(p, 4, ids, 600, "push", err, sizeof err), SR_ERANGE);
  char want[256];
  snprintf(want, sizeof want, "push: table 4 (%s): row id 1000 is out of range 0..304",
           p->tables[4].name);
  ck_assert_str_eq(err, want);
  ck_assert_int_eq(emb_plan_check_range(p, 4, ids, 600, NULL, err, sizeof err), SR_ERANGE);
  ck_assert_str_eq(err, want + strlen("push: "));
  emb_plan_free(p);
}
END_TEST

START_TEST(test_sha256_kat) {
  char hex[EMB_FP_HEX];
  ck_assert_int_eq(sr_sha256_hex("abc", 3, hex), 0);
  ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  ck_assert_int_eq(sr_sha256_hex("", 0, hex), 0);
  ck_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}
END_TEST

START_TEST(test_round_trip) {
  for (int variant = 0; variant < 3; variant++) {
    emb_plan *p = make_plan(4, variant == 2, (emb_optim_kind)variant);
    char path[256], err[256];
    tmpname(path, sizeof path, "rt");
    ck_assert_msg(emb_plan_save(p, path, err, sizeof err) == 0, "%s", err);
    emb_plan *q = NULL;
    ck_assert_msg(emb_plan_load(path, &q, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(q->seed, p->seed);
    ck_assert_int_eq(q->n_shards, p->n_shards);
    ck_assert_int_eq(q->n_tables, p->n_tables);
    for (int i = 0; i < p->n_tables; i++) {
      const emb_table *a = &p->tables[i], *b = &q->tables[i];
      ck_assert_uint_eq(a->table_id, b->table_id);
      ck_assert_str_eq(a->name, b->name);
      ck_assert_uint_eq(a->rows, b->rows);
      ck_assert_int_eq(a->dim, b->dim);
      ck_assert_int_eq(a->pooling, b->pooling);
      ck_assert(a->init_range == b->init_range); /* exact */
      ck_assert_int_eq(a->optim.kind, b->optim.kind);
      ck_assert(a->optim.eps == b->optim.eps);
      ck_assert(a->optim.init_acc == b->optim.init_acc);
      ck_assert_int_eq(a->place.kind, b->place.kind);
      ck_assert_int_eq(a->place.n, b->place.n);
      for (int k = 0; k < a->place.n; k++) ck_assert_int_eq(a->place.shards[k], b->place.shards[k]);
    }
    char m1[EMB_FP_HEX], a1[EMB_FP_HEX], m2[EMB_FP_HEX], a2[EMB_FP_HEX];
    fps(p, m1, a1);
    fps(q, m2, a2);
    ck_assert_str_eq(m1, m2);
    ck_assert_str_eq(a1, a2);
    ck_assert_str_ne(m1, a1);
    /* Save of the loaded plan is byte-identical. */
    char path2[256];
    tmpname(path2, sizeof path2, "rt2");
    ck_assert_int_eq(emb_plan_save(q, path2, err, sizeof err), 0);
    char *c1 = emb_plan_canonical(p, 1), *c2 = emb_plan_canonical(q, 1);
    ck_assert_str_eq(c1, c2);
    ck_assert_ptr_null(strchr(c1, ' '));
    ck_assert_ptr_null(strchr(c1, '\n'));
    free(c1);
    free(c2);
    emb_plan *r = emb_plan_clone(q);
    fps(r, m2, a2);
    ck_assert_str_eq(a1, a2);
    emb_plan_free(r);
    unlink(path);
    unlink(path2);
    emb_plan_free(p);
    emb_plan_free(q);
  }
  emb_plan_free(NULL);
}
END_TEST

/* Print a JSON value with every object's keys in reverse order, with
 * whitespace, numbers as %.17g (cJSON's own printer is not exact: it accepts
 * 15 digits when they compare equal within an epsilon). */
static void print_reversed(const cJSON *j, char **s, size_t *len, size_t *cap) {
  char tmp[64];
  const char *lit = NULL;
  if (*cap - *len < 256) {
    *cap = *cap * 2 + 256;
    *s = realloc(*s, *cap);
  }
  if (cJSON_IsObject(j) || cJSON_IsArray(j)) {
    int obj = cJSON_IsObject(j);
    int n = cJSON_GetArraySize(j);
    *len += (size_t)sprintf(*s + *len, "%s\n  ", obj ? "{" : "[");
    for (int k = 0; k < n; k++) {
      const cJSON *e = cJSON_GetArrayItem(j, obj ? n - 1 - k : k);
      if (obj) {
        if (*cap - *len < 256) {
          *cap = *cap * 2 + 256;
          *s = realloc(*s, *cap);
        }
        *len += (size_t)sprintf(*s + *len, "\"%s\" : ", e->string);
      }
      print_reversed(e, s, len, cap);
      if (k + 1 < n) *len += (size_t)sprintf(*s + *len, " ,\t");
    }
    *len += (size_t)sprintf(*s + *len, "%s", obj ? "}" : "]");
    return;
  }
  if (cJSON_IsNumber(j)) {
    snprintf(tmp, sizeof tmp, "%.17g", j->valuedouble);
    lit = tmp;
  } else if (cJSON_IsString(j)) {
    snprintf(tmp, sizeof tmp, "\"%s\"", j->valuestring);
    lit = tmp;
  } else {
    lit = cJSON_IsTrue(j) ? "true" : cJSON_IsFalse(j) ? "false" : "null";
  }
  *len += (size_t)sprintf(*s + *len, "%s", lit);
}

START_TEST(test_key_order) {
  emb_plan *p = make_plan(3, 0, EMB_OPT_ADAGRAD);
  char *c = emb_plan_canonical(p, 1);
  cJSON *j = cJSON_Parse(c);
  ck_assert_ptr_nonnull(j);
  char *txt = NULL;
  size_t len = 0, cap = 0;
  print_reversed(j, &txt, &len, &cap);
  ck_assert_ptr_null(strstr(txt, "{\"format\""));
  ck_assert_ptr_nonnull(strstr(txt, "{\n  \"tables\""));
  emb_plan *q = NULL;
  char err[256];
  ck_assert_msg(emb_plan_parse(txt, "rev.json", &q, err, sizeof err) == 0, "%s", err);
  char m1[EMB_FP_HEX], a1[EMB_FP_HEX], m2[EMB_FP_HEX], a2[EMB_FP_HEX];
  fps(p, m1, a1);
  fps(q, m2, a2);
  ck_assert_str_eq(m1, m2);
  ck_assert_str_eq(a1, a2);
  free(txt);
  free(c);
  cJSON_Delete(j);
  emb_plan_free(p);
  emb_plan_free(q);
}
END_TEST

START_TEST(test_fingerprint_sensitivity) {
  emb_plan *p = make_plan(4, 0, EMB_OPT_ADAGRAD);
  char m0[EMB_FP_HEX], a0[EMB_FP_HEX], m[EMB_FP_HEX], a[EMB_FP_HEX];
  fps(p, m0, a0);
  /* Placement changes: model fingerprint kept, plan fingerprint changed. */
  for (int change = 0; change < 3; change++) {
    emb_plan *q = emb_plan_clone(p);
    if (change == 0) q->tables[2].place.shards[0] = (q->tables[2].place.shards[0] + 1) % 4;
    if (change == 1) q->n_shards = 5;
    if (change == 2) {
      emb_plan_free(q);
      q = make_plan(4, 1, EMB_OPT_ADAGRAD);
    }
    char err[256];
    ck_assert_msg(emb_plan_validate(q, "q", err, sizeof err) == 0, "%s", err);
    fps(q, m, a);
    ck_assert_str_eq(m, m0);
    ck_assert_str_ne(a, a0);
    emb_plan_free(q);
  }
  /* Model changes: both change. */
  for (int change = 0; change < 11; change++) {
    emb_plan *q = emb_plan_clone(p);
    emb_table *t = &q->tables[1];
    switch (change) {
      case 0: t->dim = 8; break;
      case 1: t->rows = 584; break;
      case 2: t->pooling = EMB_POOL_MEAN; break;
      case 3: t->init_range = nextafter(t->init_range, 1.0); break;
      case 4: t->optim.kind = EMB_OPT_ROWWISE_ADAGRAD; break;
      case 5: t->optim.eps = 1e-9; break;
      case 6: t->optim.init_acc = 0.2; break;
      case 7: q->seed ^= 1; break;
      case 8: t->table_id = 77; break;
      case 9: strcpy(t->name, "other"); break;
      case 10: t->rows = EMB_ROWS_UNBOUNDED; break;
    }
    fps(q, m, a);
    ck_assert_msg(strcmp(m, m0) != 0, "change %d kept the model fingerprint", change);
    ck_assert_msg(strcmp(a, a0) != 0, "change %d kept the plan fingerprint", change);
    emb_plan_free(q);
  }
  emb_plan_free(p);
}
END_TEST

/* A table's "keep": read, written back only when set, in the model
 * fingerprint; bad fields named. */
START_TEST(test_keep_field) {
  const char *base =
      "{\"format\":1,\"seed\":\"1\",\"n_shards\":1,\"tables\":[{\"table_id\":5,\"name\":\"a\","
      "\"rows\":10,\"dim\":4,\"pooling\":\"sum\",\"optimizer\":{\"name\":\"sgd\"}%s,"
      "\"placement\":{\"kind\":\"table\",\"shards\":[0]}}]}";
  char txt[1024], err[256], fp0[EMB_FP_HEX], fp1[EMB_FP_HEX];
  emb_plan *p = NULL, *q = NULL;
  snprintf(txt, sizeof txt, base, "");
  ck_assert_int_eq(emb_plan_parse(txt, "k", &p, err, sizeof err), 0);
  ck_assert(!emb_keep_on(&p->tables[0]));
  char *c = emb_plan_canonical(p, 1);
  ck_assert_ptr_null(strstr(c, "keep")); /* none set: none written */
  free(c);
  emb_plan_model_fingerprint(p, fp0);
  emb_plan_free(p);
  snprintf(txt, sizeof txt, base,
           ",\"keep\":{\"admit_after\":3,\"expire_after\":7,\"capacity\":9,\"evict\":\"lfu\"}");
  ck_assert_msg(emb_plan_parse(txt, "k", &p, err, sizeof err) == 0, "%s", err);
  const emb_keep_cfg *k = &p->tables[0].keep;
  ck_assert(k->admit_after == 3 && k->expire_after == 7 && k->capacity == 9 &&
            k->evict == EMB_EVICT_LFU && k->admit_window == 0);
  emb_plan_model_fingerprint(p, fp1);
  ck_assert_str_ne(fp0, fp1);
  c = emb_plan_canonical(p, 1);
  ck_assert_int_eq(emb_plan_parse(c, "k2", &q, err, sizeof err), 0);
  ck_assert_int_eq(memcmp(&q->tables[0].keep, k, sizeof *k), 0);
  free(c);
  emb_plan_free(q);
  emb_plan_free(p);
  const char *bad[][2] = {{",\"keep\":{\"capacity\":-1}", "tables[0].keep.capacity"},
                          {",\"keep\":{\"evict\":\"mru\"}", "tables[0].keep.evict"},
                          {",\"keep\":{\"admit_after\":1.5}", "tables[0].keep.admit_after"},
                          {",\"keep\":[]", "tables[0].keep: must be an object"}};
  for (int i = 0; i < 4; i++) {
    snprintf(txt, sizeof txt, base, bad[i][0]);
    ck_assert_int_eq(emb_plan_parse(txt, "k", &p, err, sizeof err), SR_EINVAL);
    ck_assert_msg(strstr(err, bad[i][1]) != NULL, "%s: %s", bad[i][0], err);
  }
}
END_TEST

/* A key the plan does not know, at any level, or a key given twice, is
 * refused naming it and where: a misspelt "capacity" must not leave a
 * table unbounded unsaid. */
START_TEST(test_unknown_and_repeated_keys) {
  const char *base =
      "{\"format\":1,\"seed\":\"1\",\"n_shards\":1%s,\"tables\":[{\"table_id\":5,"
      "\"name\":\"a\",\"rows\":10,\"dim\":4,\"pooling\":\"sum\"%s,"
      "\"optimizer\":{\"name\":\"adagrad\"%s},\"keep\":{\"capacity\":8%s},"
      "\"placement\":{\"kind\":\"table\",\"shards\":[0]%s}}]}";
  const char *bad[][6] = {
      {",\"sead\":\"2\"", "", "", "", "", "top level: unknown key \"sead\" (known: format, seed, "
                                               "n_shards, tables)"},
      {"", ",\"dims\":8", "", "", "", "tables[0]: unknown key \"dims\""},
      {"", "", ",\"epsilon\":0.1", "", "", "tables[0].optimizer: unknown key \"epsilon\""},
      {"", "", "", ",\"capcity\":9", "", "tables[0].keep: unknown key \"capcity\""},
      {"", "", "", "", ",\"shard\":[0]", "tables[0].placement: unknown key \"shard\""},
      {"", ",\"rows\":20", "", "", "", "tables[0]: key \"rows\" given twice"},
      {"", "", "", ",\"capacity\":9", "", "tables[0].keep: key \"capacity\" given twice"},
      {"", ",\"x\\ny\":1", "", "", "", "tables[0]: unknown key \"x?y\""},
  };
  char txt[1024], err[512];
  emb_plan *p = NULL;
  snprintf(txt, sizeof txt, base, "", "", "", "", "");
  ck_assert_msg(emb_plan_parse(txt, "k", &p, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(p->tables[0].keep.capacity, 8);
  emb_plan_free(p);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(txt, sizeof txt, base, bad[i][0], bad[i][1], bad[i][2], bad[i][3], bad[i][4]);
    p = NULL;
    ck_assert_int_eq(emb_plan_parse(txt, "plan.json", &p, err, sizeof err), SR_EINVAL);
    ck_assert_ptr_null(p);
    ck_assert_msg(!strncmp(err, "plan.json: ", 11) && strstr(err, bad[i][5]), "%zu: %s", i, err);
  }
}
END_TEST

START_TEST(test_seed_encoding) {
  const char *base =
      "{\"format\":1,\"seed\":%s,\"n_shards\":1,\"tables\":[{\"table_id\":5,\"name\":\"a\","
      "\"rows\":10,\"dim\":4,\"pooling\":\"sum\",\"optimizer\":{\"name\":\"sgd\"},"
      "\"placement\":{\"kind\":\"table\",\"shards\":[0]}}]}";
  char txt[1024], err[256];
  emb_plan *p = NULL;
  snprintf(txt, sizeof txt, base, "\"18446744073709551615\"");
  ck_assert_msg(emb_plan_parse(txt, "s", &p, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(p->seed, UINT64_MAX);
  /* Defaults filled in. */
  ck_assert(p->tables[0].init_range == sqrt(1.0 / 10));
  emb_plan_free(p);
  snprintf(txt, sizeof txt, base, "9007199254740991");
  ck_assert_int_eq(emb_plan_parse(txt, "s", &p, err, sizeof err), 0);
  ck_assert_uint_eq(p->seed, 9007199254740991ULL);
  emb_plan_free(p);
  snprintf(txt, sizeof txt, base, "18446744073709551615");
  ck_assert_int_eq(emb_plan_parse(txt, "s", &p, err, sizeof err), SR_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "s: seed: must be"));
  snprintf(txt, sizeof txt, base, "\"-1\"");
  ck_assert_int_eq(emb_plan_parse(txt, "s", &p, err, sizeof err), SR_EINVAL);
  ck_assert_ptr_null(p);
  /* Unbounded default init range. */
  ck_assert(emb_default_init_range(EMB_ROWS_UNBOUNDED) == 1.0 / 1024);
}
END_TEST

/* One validation case: mutate the base plan's JSON, expect rc and a message. */
typedef struct {
  const char *table_key; /* "" = top level, else key inside tables[1] */
  const char *sub;       /* NULL, or key inside that object ("optimizer"/"placement") */
  const char *key;
  const char *value_json; /* NULL = delete the key */
  int rc;
  const char *msg;
} vcase;

static const vcase vcases[] = {
    {"", NULL, "format", "2", SR_EVERSION, "plan.json: format: 2 is not supported"},
    {"", NULL, "format", NULL, SR_EINVAL, "plan.json: format: missing"},
    {"", NULL, "seed", NULL, SR_EINVAL, "plan.json: seed: missing"},
    {"", NULL, "seed", "\"x1\"", SR_EINVAL, "plan.json: seed: must be"},
    {"", NULL, "n_shards", "0", SR_EINVAL, "plan.json: n_shards: must be 1..65536"},
    {"", NULL, "tables", "[]", SR_EINVAL, "plan.json: tables: must be an array of 1..4096 tables"},
    {"t", NULL, "table_id", "0", SR_EINVAL, "plan.json: tables[1].table_id: 0 is also the table_id of tables[0]"},
    {"t", NULL, "table_id", "-3", SR_EINVAL, "plan.json: tables[1].table_id: must be an integer"},
    {"t", NULL, "table_id", NULL, SR_EINVAL, "plan.json: tables[1].table_id: missing"},
    {"t", NULL, "name", "\"t0\"", SR_EINVAL, "plan.json: tables[1].name: \"t0\" is also the name of tables[0]"},
    {"t", NULL, "name", "\"\"", SR_EINVAL, "plan.json: tables[1].name: must not be empty"},
    {"t", NULL, "name", NULL, SR_EINVAL, "plan.json: tables[1].name: missing"},
    {"t", NULL, "rows", "-5", SR_EINVAL, "plan.json: tables[1].rows: must be an integer 1..2^53 or \"unbounded\""},
    {"t", NULL, "rows", "\"lots\"", SR_EINVAL, "plan.json: tables[1].rows: must be"},
    {"t", NULL, "rows", NULL, SR_EINVAL, "plan.json: tables[1].rows: missing"},
    {"t", NULL, "dim", "0", SR_EINVAL, "plan.json: tables[1].dim: must be 1..1024"},
    {"t", NULL, "dim", "1025", SR_EINVAL, "plan.json: tables[1].dim: must be 1..1024"},
    {"t", NULL, "dim", "2.5", SR_EINVAL, "plan.json: tables[1].dim: must be 1..1024"},
    {"t", NULL, "dim", NULL, SR_EINVAL, "plan.json: tables[1].dim: missing"},
    {"t", NULL, "pooling", "\"max\"", SR_EINVAL, "plan.json: tables[1].pooling: must be \"sum\" or \"mean\""},
    {"t", NULL, "pooling", NULL, SR_EINVAL, "plan.json: tables[1].pooling: missing"},
    {"t", NULL, "init_range", "0", SR_EINVAL, "plan.json: tables[1].init_range: must be a positive number"},
    {"t", NULL, "optimizer", NULL, SR_EINVAL, "plan.json: tables[1].optimizer: missing"},
    {"t", "optimizer", "name", "\"adam\"", SR_EINVAL, "plan.json: tables[1].optimizer.name: must be \"sgd\", \"adagrad\" or \"rowwise_adagrad\""},
    {"t", "optimizer", "name", NULL, SR_EINVAL, "plan.json: tables[1].optimizer.name: missing"},
    {"t", "optimizer", "eps", "-1", SR_EINVAL, "plan.json: tables[1].optimizer.eps: must be a number >= 0"},
    {"t", "optimizer", "initial_accumulator_value", "\"a\"", SR_EINVAL, "plan.json: tables[1].optimizer.initial_accumulator_value: must be"},
    {"t", NULL, "placement", NULL, SR_EINVAL, "plan.json: tables[1].placement: missing"},
    {"t", "placement", "kind", "\"column\"", SR_EINVAL, "plan.json: tables[1].placement.kind: must be \"table\" or \"row\""},
    {"t", "placement", "shards", "[2]", SR_EINVAL, "plan.json: tables[1].placement.shards[0]: shard out of range 0..1"},
    {"t", "placement", "shards", "[0,1]", SR_EINVAL, "plan.json: tables[1].placement.shards: a table-wise placement names exactly one shard"},
    {"t", "placement", "shards", "[]", SR_EINVAL, "plan.json: tables[1].placement.shards: must be an array"},
    {"t", "placement", "shards", NULL, SR_EINVAL, "plan.json: tables[1].placement.shards: missing"},
};

START_TEST(test_validation) {
  static const uint64_t rows[] = {100, 200};
  emb_plan_params pp;
  memset(&pp, 0, sizeof pp);
  pp.n_tables = 2;
  pp.rows = rows;
  pp.dim = 8;
  pp.optim.kind = EMB_OPT_ADAGRAD;
  pp.optim.eps = -1;
  pp.n_shards = 2;
  char err[256];
  emb_plan *p = NULL;
  ck_assert_int_eq(emb_plan_create(&pp, &p, err, sizeof err), 0);
  char *base = emb_plan_canonical(p, 1);
  emb_plan_free(p);
  for (size_t i = 0; i < sizeof vcases / sizeof vcases[0]; i++) {
    const vcase *v = &vcases[i];
    cJSON *root = cJSON_Parse(base);
    cJSON *obj = root;
    if (v->table_key[0]) obj = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "tables"), 1);
    if (v->sub) obj = cJSON_GetObjectItem(obj, v->sub);
    ck_assert_ptr_nonnull(obj);
    if (v->value_json) {
      cJSON *nv = cJSON_Parse(v->value_json);
      ck_assert_ptr_nonnull(nv);
      if (cJSON_GetObjectItem(obj, v->key)) cJSON_ReplaceItemInObject(obj, v->key, nv);
      else cJSON_AddItemToObject(obj, v->key, nv);
    } else {
      cJSON_DeleteItemFromObject(obj, v->key);
    }
    char *txt = cJSON_PrintUnformatted(root);
    emb_plan *q = NULL;
    err[0] = '\0';
    int rc = emb_plan_parse(txt, "plan.json", &q, err, sizeof err);
    ck_assert_msg(rc == v->rc, "case %zu (%s): rc %d, want %d (%s)", i, v->msg, rc, v->rc, err);
    ck_assert_msg(strstr(err, v->msg) != NULL, "case %zu: message '%s', want '%s'", i, err, v->msg);
    ck_assert_ptr_null(q);
    free(txt);
    cJSON_Delete(root);
  }
  /* Not JSON at all. */
  emb_plan *q = NULL;
  ck_assert_int_eq(emb_plan_parse("{\"format\":1,", "bad.json", &q, err, sizeof err), SR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "bad.json: not valid JSON"));
  /* Row-wise placement with a shard listed twice, and sgd with eps. */
  const char *rw =
      "{\"format\":1,\"seed\":\"1\",\"n_shards\":3,\"tables\":[{\"table_id\":5,\"name\":\"a\","
      "\"rows\":10,\"dim\":4,\"pooling\":\"sum\",\"optimizer\":{\"name\":\"sgd\"%s},"
      "\"placement\":{\"kind\":\"row\",\"shards\":[%s]}}]}";
  char txt[1024];
  snprintf(txt, sizeof txt, rw, "", "0,2,0");
  ck_assert_int_eq(emb_plan_parse(txt, "p", &q, err, sizeof err), SR_EINVAL);
  ck_assert_str_eq(err, "p: tables[0].placement.shards[2]: shard 0 is listed twice");
  snprintf(txt, sizeof txt, rw, ",\"eps\":0.1", "0,2");
  ck_assert_int_eq(emb_plan_parse(txt, "p", &q, err, sizeof err), SR_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "p: tables[0].optimizer.: sgd takes no eps"));
  snprintf(txt, sizeof txt, rw, "", "2,0");
  ck_assert_int_eq(emb_plan_parse(txt, "p", &q, err, sizeof err), 0);
  emb_plan_free(q);
  /* Missing file. */
  ck_assert_int_eq(emb_plan_load("/nonexistent/plan.json", &q, err, sizeof err), SR_EIO);
  ck_assert_ptr_nonnull(strstr(err, "/nonexistent/plan.json: cannot open"));
  free(base);
}
END_TEST

START_TEST(test_balancer_and_shard_of) {
  /* Sizes 1000, 600, 500, 400, 100 over 2 shards: 1000 -> s0, 600 -> s1,
   * 500 -> s1 (1100), 400 -> s0 (1400), 100 -> s1 (1200). */
  static const uint64_t rows[] = {400, 1000, 100, 600, 500};
  emb_plan_params pp;
  memset(&pp, 0, sizeof pp);
  pp.n_tables = 5;
  pp.rows = rows;
  pp.dim = 4;
  pp.optim.eps = -1;
  pp.n_shards = 2;
  char err[256];
  emb_plan *p = NULL;
  ck_assert_int_eq(emb_plan_create(&pp, &p, err, sizeof err), 0);
  const int want[] = {0, 0, 1, 1, 1};
  for (int i = 0; i < 5; i++) {
    ck_assert_int_eq(p->tables[i].place.kind, EMB_PLACE_TABLE);
    ck_assert_int_eq(p->tables[i].place.shards[0], want[i]);
    for (uint64_t r = 0; r < 50; r++) ck_assert_int_eq(emb_plan_shard_of(p, i, r), want[i]);
  }
  ck_assert_int_eq(emb_plan_table_index(p, 3), 3);
  ck_assert_int_eq(emb_plan_table_index(p, 99), -1);
  emb_plan_free(p);
  /* Row-wise: every shard used, roughly evenly. */
  pp.row_wise = 1;
  pp.n_shards = 4;
  ck_assert_int_eq(emb_plan_create(&pp, &p, err, sizeof err), 0);
  int count[4] = {0};
  for (uint64_t r = 0; r < 40000; r++) {
    int s = emb_plan_shard_of(p, 1, r);
    ck_assert(s >= 0 && s < 4);
    ck_assert_int_eq(s, emb_plan_shard_of(p, 1, r));
    count[s]++;
  }
  for (int s = 0; s < 4; s++) ck_assert(count[s] > 9500 && count[s] < 10500);
  emb_plan_free(p);
  /* Bad parameters. */
  pp.n_shards = 0;
  ck_assert_int_eq(emb_plan_create(&pp, &p, err, sizeof err), SR_EINVAL);
  pp.n_shards = 1;
  pp.dim = 0;
  ck_assert_int_eq(emb_plan_create(&pp, &p, err, sizeof err), SR_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "tables[0].dim: must be 1..1024"));
}
END_TEST

/* emb_plan_grow raises bounded tables' rows, keeps every other field (the
 * init range recorded, not the default of the new rows); emb_plan_grows
 * holds for it and names the first other difference; emb_plan_agrees
 * holds between it and a plan made for its rows. */
START_TEST(test_grow) {
  emb_plan *p = make_plan(3, 0, EMB_OPT_ADAGRAD), *g = NULL;
  const uint64_t rows[] = {2000, 100, 10131227, 3000000, 305, 0};
  char err[256], why[256];
  ck_assert_msg(emb_plan_grow(p, rows, &g, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(g->tables[0].rows, 2000);
  ck_assert_uint_eq(g->tables[1].rows, 583); /* never shrunk */
  ck_assert_uint_eq(g->tables[3].rows, 3000000);
  ck_assert_uint_eq(g->tables[5].rows, EMB_ROWS_UNBOUNDED);
  for (int i = 0; i < p->n_tables; i++) {
    ck_assert(g->tables[i].init_range == p->tables[i].init_range);
    ck_assert_int_eq(g->tables[i].place.shards[0], p->tables[i].place.shards[0]);
  }
  ck_assert(emb_plan_grows(p, g, why, sizeof why));
  ck_assert(emb_plan_grows(p, p, why, sizeof why));
  ck_assert(!emb_plan_grows(g, p, why, sizeof why));
  ck_assert_msg(strstr(why, "tables[0] (t0): 1460 rows, fewer than 2000"), "%s", why);
  char pm[EMB_FP_HEX], pa[EMB_FP_HEX], gm[EMB_FP_HEX], ga[EMB_FP_HEX];
  fps(p, pm, pa);
  fps(g, gm, ga);
  ck_assert_str_ne(pm, gm);
  ck_assert_str_ne(pa, ga);
  /* A never-written row of the old tables is the same in the grown plan. */
  float a[16], b[16];
  emb_row_init(p, 0, 1459, a);
  emb_row_init(g, 0, 1459, b);
  ck_assert_mem_eq(a, b, sizeof a);
  /* Any other change is no growth. */
  emb_plan *h = emb_plan_clone(g);
  h->tables[2].init_range *= 2;
  ck_assert(!emb_plan_grows(p, h, why, sizeof why));
  ck_assert_msg(strstr(why, "tables[2] (t2): init_range differs"), "%s", why);
  emb_plan_free(h);
  h = emb_plan_clone(g);
  h->seed++;
  ck_assert(!emb_plan_grows(p, h, why, sizeof why));
  ck_assert_msg(strstr(why, "seed"), "%s", why);
  emb_plan_free(h);
  h = emb_plan_clone(g);
  h->tables[4].place.shards[0] = (h->tables[4].place.shards[0] + 1) % 3;
  ck_assert(!emb_plan_grows(p, h, why, sizeof why));
  ck_assert_msg(strstr(why, "tables[4] (t4): placement differs"), "%s", why);
  /* A plan made afresh for the grown rows (each init range the default of
   * its rows) agrees with the grown plan, and with one placed otherwise:
   * those are what such a plan cannot say. Any other difference does not. */
  const uint64_t grown_rows[] = {2000, 583, 10131227, 3000000, 305, 0};
  emb_plan_params pp = {.n_tables = 6, .rows = grown_rows, .dim = 16, .pooling = EMB_POOL_SUM,
                        .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1, .init_acc = 0.1},
                        .seed = p->seed, .n_shards = 3};
  emb_plan *m = NULL;
  ck_assert_msg(emb_plan_create(&pp, &m, err, sizeof err) == 0, "%s", err);
  ck_assert(m->tables[0].init_range != g->tables[0].init_range);
  ck_assert(emb_plan_agrees(m, g));
  ck_assert(emb_plan_agrees(m, h));
  ck_assert(emb_plan_agrees(g, g));
  emb_plan_free(h);
  h = emb_plan_clone(g);
  h->seed++;
  ck_assert(!emb_plan_agrees(m, h));
  emb_plan_free(h);
  h = emb_plan_clone(g);
  h->tables[1].optim.kind = EMB_OPT_SGD;
  h->tables[1].optim.init_acc = h->tables[1].optim.eps = 0;
  ck_assert(!emb_plan_agrees(m, h));
  emb_plan_free(h);
  h = emb_plan_clone(g);
  h->tables[3].rows++;
  ck_assert(!emb_plan_agrees(m, h));
  emb_plan_free(h);
  emb_plan_free(m);
  pp.n_shards = 2;
  ck_assert_msg(emb_plan_create(&pp, &m, err, sizeof err) == 0, "%s", err);
  ck_assert(!emb_plan_agrees(m, g));
  emb_plan_free(m);
  /* A bounded table's rows must stay a bound. */
  emb_plan *bad = NULL;
  const uint64_t unb[] = {0, 583, 10131227, 2202608, 305, 0};
  ck_assert_int_eq(emb_plan_grow(p, unb, &bad, err, sizeof err), SR_EINVAL);
  ck_assert_ptr_null(bad);
  ck_assert_msg(strstr(err, "tables[0] (t0)"), "%s", err);
  emb_plan_free(g);
  emb_plan_free(p);
}
END_TEST

START_TEST(test_row_init) {
  emb_plan *p = make_plan(1, 0, EMB_OPT_SGD);
  const int dim = 16;
  float a[16], b[16];
  const float r = (float)p->tables[3].init_range;
  emb_row_init(p, 3, 12345, a);
  emb_row_init(p, 3, 12345, b);
  ck_assert_mem_eq(a, b, sizeof a);
  emb_row_init(p, 3, 12346, b);
  ck_assert(memcmp(a, b, sizeof a) != 0);
  emb_row_init(p, 2, 12345, b); /* another table */
  ck_assert(memcmp(a, b, sizeof a) != 0);
  for (int j = 0; j < dim; j++)
    for (int k = j + 1; k < dim; k++) ck_assert(a[j] != a[k]);
  /* Another seed differs; a clone (any holder) agrees. */
  emb_plan *q = emb_plan_clone(p);
  emb_row_init(q, 3, 12345, b);
  ck_assert_mem_eq(a, b, sizeof a);
  q->seed++;
  emb_row_init(q, 3, 12345, b);
  ck_assert(memcmp(a, b, sizeof a) != 0);
  /* The value of element j does not depend on dim (counter = j/4 block). */
  q->seed--;
  q->tables[3].dim = 5;
  float c[5];
  emb_row_init(q, 3, 12345, c);
  ck_assert_mem_eq(a, c, sizeof c);
  emb_plan_free(q);
  /* Range and moments over many rows: uniform [-r, r) has mean 0, var r^2/3. */
  double s = 0, s2 = 0;
  const int n = 20000;
  float lo = 1, hi = -1;
  for (int i = 0; i < n; i++) {
    emb_row_init(p, 3, (uint64_t)i * 7919u, a);
    for (int j = 0; j < dim; j++) {
      ck_assert(a[j] >= -r && a[j] < r);
      s += a[j];
      s2 += (double)a[j] * a[j];
      lo = a[j] < lo ? a[j] : lo;
      hi = a[j] > hi ? a[j] : hi;
    }
  }
  double m = s / (n * dim), var = s2 / (n * dim) - m * m;
  ck_assert_double_eq_tol(m / r, 0.0, 0.01);
  ck_assert_double_eq_tol(var / ((double)r * r), 1.0 / 3.0, 0.01);
  ck_assert(lo < -0.999 * r && hi > 0.999 * r);
  /* Unbounded table: 64-bit ids work, range 1/1024. */
  emb_row_init(p, 5, 0xffffffffffffffffULL, a);
  for (int j = 0; j < dim; j++) ck_assert(fabsf(a[j]) <= 1.0f / 1024);
  emb_plan_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("embedding_plan");
  TCase *tc = tcase_create("plan");
  tcase_add_test(tc, test_sha256_kat);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_key_order);
  tcase_add_test(tc, test_fingerprint_sensitivity);
  tcase_add_test(tc, test_seed_encoding);
  tcase_add_test(tc, test_validation);
  tcase_add_test(tc, test_balancer_and_shard_of);
  tcase_add_test(tc, test_row_init);
  tcase_add_test(tc, test_grow);
  tcase_add_test(tc, test_keep_field);
  tcase_add_test(tc, test_unknown_and_repeated_keys);
  tcase_add_test(tc, test_first_out_of_range);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
