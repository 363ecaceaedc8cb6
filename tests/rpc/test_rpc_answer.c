/* The remote store's reading of Lookup answers where gRPC received them
 * (rpc/answer.c): a LookupResponse held in a byte buffer of many slices
 * (cut at every size from 1 byte up, so that tags, lengths and rows
 * straddle slices) has its rows copied into the caller's array by the
 * call's grouping exactly as protobuf-c decodes them, whether its fields
 * come in protobuf-c's order or another (rows before table_id, the
 * incarnation first, unknown fields of every wire type between them), and
 * its incarnation read; a cut or garbled answer, a table missing, another
 * table's or another length's rows are refused, naming the table. Rows of
 * fp16 and bf16 tables (2 bytes a weight) are read the same way, from any
 * slicing (a row cut between slices, a row at an odd address), as the
 * floats their format decodes to; a float-sized answer for such a table
 * is another length, refused. */
#include <check.h>

#include "tests/check_main.h"

#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "embedding/plan.h"
#include "rpc/client.h"
#include "rpc/remote_impl.h"
#include "rpc/shardrec.pb-c.h"

#define NT 3
static const int dims[NT] = {1, 16, 33};
static const uint32_t tids[NT] = {5, 300, 70000};
#define CNT 9 /* ids of each table in the call */
#define LO 4  /* where the call's ids start in the table's grouping */

#define TABLE(id, name, dim)                                                               \
  "{\"table_id\": " #id ", \"name\": \"" name "\", \"rows\": 1000, \"dim\": " #dim                \
  ", \"pooling\": \"sum\", \"optimizer\": {\"name\": \"sgd\"}, \"placement\": {\"kind\": "      \
  "\"table\", \"shards\": [0]}}"

static emb_plan *plan_make(void) {
  const char *json = "{\"format\": 1, \"seed\": \"9\", \"n_shards\": 1, \"tables\": [" TABLE(5, "a", 1)
      ", " TABLE(300, "b", 16) ", " TABLE(70000, "c", 33) "]}";
  emb_plan *p;
  char err[512];
  ck_assert_msg(emb_plan_parse(json, "test", &p, err, sizeof err) == 0, "%s", err);
  return p;
}

static float rows[NT][CNT * 33];

static void rows_fill(void) {
  for (int t = 0; t < NT; t++)
    for (int i = 0; i < CNT * dims[t]; i++) rows[t][i] = (float)(t * 1000 + i) + 0.25f;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

/* Unknown fields of each wire type: varint 9, fixed64 10, bytes 11, fixed32 12. */
static uint8_t *put_unknown(uint8_t *p) {
  p = put_varint(p, 9 << 3 | 0);
  p = put_varint(p, 300);
  p = put_varint(p, 10 << 3 | 1);
  memset(p, 0xab, 8);
  p += 8;
  p = put_varint(p, 11 << 3 | 2);
  p = put_varint(p, 3);
  memcpy(p, "xyz", 3);
  p += 3;
  p = put_varint(p, 12 << 3 | 5);
  memset(p, 0xcd, 4);
  return p + 4;
}

/* The answer to the call of every table in order t = 0..NT-1 (table k's
 * id or length changed when bad_t == k): protobuf-c's packing (odd 0), or
 * by hand in another order with unknown fields (odd 1). Its length in *len. */
static uint8_t *answer_make(int odd, int bad_t, int bad_len, size_t *len) {
  uint8_t *buf = malloc(1 << 16), *p = buf;
  if (!odd) {
    Shardrec__V1__TableRows tr[NT], *trp[NT];
    for (int t = 0; t < NT; t++) {
      shardrec__v1__table_rows__init(&tr[t]);
      tr[t].table_id = tids[t] + (t == bad_t && !bad_len);
      tr[t].dim = dims[t];
      tr[t].rows.data = (uint8_t *)rows[t];
      tr[t].rows.len = (size_t)(CNT * dims[t] - (t == bad_t && bad_len)) * sizeof(float);
      trp[t] = &tr[t];
    }
    Shardrec__V1__LookupResponse a = SHARDREC__V1__LOOKUP_RESPONSE__INIT;
    a.n_tables = NT;
    a.tables = trp;
    a.incarnation = 0x1234567890ull;
    *len = shardrec__v1__lookup_response__pack(&a, buf);
    return buf;
  }
  p = put_varint(p, 2 << 3 | 0); /* incarnation first */
  p = put_varint(p, 0x1234567890ull);
  p = put_unknown(p);
  for (int t = 0; t < NT; t++) {
    uint8_t in[1 << 13], *q = in;
    const size_t rl = (size_t)(CNT * dims[t] - (t == bad_t && bad_len)) * sizeof(float);
    q = put_unknown(q);
    q = put_varint(q, 3 << 3 | 2); /* rows before table_id */
    q = put_varint(q, rl);
    memcpy(q, rows[t], rl);
    q += rl;
    q = put_varint(q, 2 << 3 | 0);
    q = put_varint(q, (uint64_t)dims[t]);
    q = put_varint(q, 1 << 3 | 0);
    q = put_varint(q, tids[t] + (t == bad_t && !bad_len));
    q = put_unknown(q);
    p = put_varint(p, 1 << 3 | 2);
    p = put_varint(p, (uint64_t)(q - in));
    memcpy(p, in, (size_t)(q - in));
    p += q - in;
  }
  *len = (size_t)(p - buf);
  return buf;
}

/* buf[len] as a byte buffer of slices of `size` bytes (0: one slice). */
static grpc_byte_buffer *sliced(const uint8_t *buf, size_t len, size_t size) {
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(NULL, 0);
  for (size_t at = 0; at < len;) {
    size_t k = size && len - at > size ? size : len - at;
    grpc_slice_buffer_add(&bb->data.raw.slice_buffer, grpc_slice_from_copied_buffer((const char *)buf + at, k));
    at += k;
  }
  return bb;
}

typedef struct {
  call_part parts[NT];
  size_t perm_a[NT][LO + CNT];
  size_t *perm[NT];
  float out_a[NT][(CNT + 2) * 33];
  float *out[NT];
} call_fx;

/* The call of CNT ids of each table, its rows going in reverse order to
 * positions 1..CNT of out (0 and CNT + 1 stay -1). */
static void call_init(call_fx *c) {
  for (int t = 0; t < NT; t++) {
    c->parts[t] = (call_part){.t = t, .lo = LO, .n = CNT};
    for (size_t r = 0; r < CNT; r++) c->perm_a[t][LO + r] = CNT - r;
    c->perm[t] = c->perm_a[t];
    for (size_t i = 0; i < (CNT + 2) * 33; i++) c->out_a[t][i] = -1;
    c->out[t] = c->out_a[t];
  }
}

START_TEST(test_answer_scattered_from_slices) {
  rpc_global_init();
  emb_plan *plan = plan_make();
  rows_fill();
  int checked = 0;
  for (int odd = 0; odd < 2; odd++) {
    size_t len;
    uint8_t *buf = answer_make(odd, -1, 0, &len);
    Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(a); /* a valid message either way */
    for (size_t size = 0; size <= 70; size++) {
      call_fx c;
      call_init(&c);
      grpc_byte_buffer *bb = sliced(buf, len, size);
      uint64_t inc = 0;
      int bad = 7;
      ck_assert_int_eq(rpc__answer_incarnation(bb, &inc), 0);
      ck_assert_uint_eq(inc, 0x1234567890ull);
      ck_assert_int_eq(rpc__answer_scatter(bb, plan, c.parts, NT, c.perm, (void *const *)c.out, 0, &bad), 0);
      for (int t = 0; t < NT; t++) {
        const size_t d = (size_t)dims[t];
        ck_assert_uint_eq(a->tables[t]->rows.len, CNT * d * sizeof(float));
        const float *want = (const float *)a->tables[t]->rows.data;
        for (size_t r = 0; r < CNT; r++)
          ck_assert_msg(!memcmp(c.out[t] + (CNT - r) * d, want + r * d, d * sizeof(float)),
                        "order %d slices of %zu: table %d row %zu differs", odd, size, t, r);
        for (size_t i = 0; i < d; i++) {
          ck_assert_float_eq(c.out[t][i], -1); /* nothing written outside the rows' places */
          ck_assert_float_eq(c.out[t][(CNT + 1) * d + i], -1);
        }
      }
      grpc_byte_buffer_destroy(bb);
      checked++;
    }
    shardrec__v1__lookup_response__free_unpacked(a, NULL);
    free(buf);
  }
  ck_assert_int_eq(checked, 2 * 71);
  emb_plan_free(plan);
}
END_TEST

START_TEST(test_answer_refused) {
  rpc_global_init();
  emb_plan *plan = plan_make();
  rows_fill();
  for (int odd = 0; odd < 2; odd++) {
    size_t len;
    uint8_t *buf = answer_make(odd, -1, 0, &len);
    /* Cut anywhere: refused, but for the one cut that drops exactly the
     * incarnation protobuf-c packs last (a message without it is valid). */
    int refused = 0;
    for (size_t cut = 1; cut < len; cut++) {
      call_fx c;
      call_init(&c);
      grpc_byte_buffer *bb = sliced(buf, len - cut, 5);
      int bad;
      if (rpc__answer_scatter(bb, plan, c.parts, NT, c.perm, (void *const *)c.out, 0, &bad) != 0) refused++;
      grpc_byte_buffer_destroy(bb);
    }
    ck_assert_int_eq(refused, (int)len - 1 - !odd);
    /* A table's answer for another table or of another length: that table named. */
    for (int t = 0; t < NT; t++)
      for (int bad_len = 0; bad_len < 2; bad_len++) {
        size_t bl;
        uint8_t *b = answer_make(odd, t, bad_len, &bl);
        call_fx c;
        call_init(&c);
        grpc_byte_buffer *bb = sliced(b, bl, 7);
        int bad = -1;
        ck_assert_int_eq(rpc__answer_scatter(bb, plan, c.parts, NT, c.perm, (void *const *)c.out, 0, &bad), -2);
        ck_assert_int_eq(bad, t);
        grpc_byte_buffer_destroy(bb);
        free(b);
      }
    /* Fewer tables than the call asked for: the first missing one named. */
    call_fx c;
    call_init(&c);
    call_part more[NT + 1];
    memcpy(more, c.parts, sizeof c.parts);
    more[NT] = (call_part){.t = 1, .lo = 0, .n = 1};
    grpc_byte_buffer *bb = sliced(buf, len, 0);
    int bad = -1;
    ck_assert_int_eq(rpc__answer_scatter(bb, plan, more, NT + 1, c.perm, (void *const *)c.out, 0, &bad), -2);
    ck_assert_int_eq(bad, 1);
    grpc_byte_buffer_destroy(bb);
    free(buf);
  }
  /* A group (wire type 3) and a tag of field 0: not a LookupResponse. */
  const uint8_t group[] = {0x0b, 0x0c}, zero[] = {0x00, 0x01};
  const uint8_t *garbled[] = {group, zero};
  for (int i = 0; i < 2; i++) {
    call_fx c;
    call_init(&c);
    grpc_byte_buffer *bb = sliced(garbled[i], 2, 1);
    int bad;
    uint64_t inc;
    ck_assert_int_eq(rpc__answer_scatter(bb, plan, c.parts, NT, c.perm, (void *const *)c.out, 0, &bad), -1);
    ck_assert_int_eq(rpc__answer_incarnation(bb, &inc), -1);
    grpc_byte_buffer_destroy(bb);
  }
  emb_plan_free(plan);
}
END_TEST

/* The plan with table a in fp16, b in bf16, c in fp16. */
static emb_plan *plan_make16(void) {
  emb_plan *p = plan_make();
  p->tables[0].precision = p->tables[2].precision = EMB_PREC_FP16;
  p->tables[1].precision = EMB_PREC_BF16;
  return p;
}

/* The answer of the 16-bit plan: each table's rows as its format's bits
 * (of rows[]), or 4 bytes a weight when wide; packed by protobuf-c. */
static uint8_t *answer_make16(const emb_plan *p, uint16_t h[NT][CNT * 33], int wide,
                              size_t *len) {
  Shardrec__V1__TableRows tr[NT], *trp[NT];
  for (int t = 0; t < NT; t++) {
    for (int i = 0; i < CNT * dims[t]; i++)
      h[t][i] = p->tables[t].precision == EMB_PREC_FP16 ? sr_f32_to_f16(rows[t][i] / 64)
                                                       : sr_f32_to_bf16(rows[t][i] / 64);
    shardrec__v1__table_rows__init(&tr[t]);
    tr[t].table_id = tids[t];
    tr[t].dim = dims[t];
    tr[t].rows.data = wide ? (uint8_t *)rows[t] : (uint8_t *)h[t];
    tr[t].rows.len = (size_t)(CNT * dims[t]) * (wide ? 4 : 2);
    trp[t] = &tr[t];
  }
  Shardrec__V1__LookupResponse a = SHARDREC__V1__LOOKUP_RESPONSE__INIT;
  a.n_tables = NT;
  a.tables = trp;
  uint8_t *buf = malloc(1 << 16);
  *len = shardrec__v1__lookup_response__pack(&a, buf);
  return buf;
}

START_TEST(test_answer_rows16) {
  rpc_global_init();
  emb_plan *plan = plan_make16();
  rows_fill();
  static uint16_t h[NT][CNT * 33];
  size_t len;
  uint8_t *buf = answer_make16(plan, h, 0, &len);
  for (size_t size = 0; size <= 70; size++) {
    call_fx c;
    call_init(&c);
    grpc_byte_buffer *bb = sliced(buf, len, size);
    int bad = 7;
    ck_assert_int_eq(rpc__answer_scatter(bb, plan, c.parts, NT, c.perm, (void *const *)c.out, 0, &bad), 0);
    for (int t = 0; t < NT; t++) {
      const size_t d = (size_t)dims[t];
      float want[33];
      for (size_t r = 0; r < CNT; r++) {
        if (plan->tables[t].precision == EMB_PREC_FP16) sr_f16_decode(h[t] + r * d, want, d, SR_HALF_C);
        else sr_bf16_decode(h[t] + r * d, want, d);
        ck_assert_msg(!memcmp(c.out[t] + (CNT - r) * d, want, d * sizeof(float)),
                      "slices of %zu: table %d row %zu is not its 16-bit value", size, t, r);
      }
      for (size_t i = 0; i < d; i++) {
        ck_assert_float_eq(c.out[t][i], -1);
        ck_assert_float_eq(c.out[t][(CNT + 1) * d + i], -1);
      }
    }
    grpc_byte_buffer_destroy(bb);
    /* rows16: the same rows in their own bits, 2 bytes a weight */
    call_init(&c);
    bb = sliced(buf, len, size);
    ck_assert_int_eq(rpc__answer_scatter(bb, plan, c.parts, NT, c.perm, (void *const *)c.out, 1,
                                         &bad), 0);
    for (int t = 0; t < NT; t++) {
      const size_t d = (size_t)dims[t];
      const uint16_t *o16 = (const uint16_t *)c.out[t];
      for (size_t r = 0; r < CNT; r++)
        ck_assert_msg(!memcmp(o16 + (CNT - r) * d, h[t] + r * d, d * 2),
                      "slices of %zu, rows16: table %d row %zu is not its bits", size, t, r);
      call_fx clean;
      call_init(&clean);
      const uint16_t *c16 = (const uint16_t *)clean.out[t];
      ck_assert(!memcmp(o16, c16, d * 2)); /* nothing written outside the rows' places */
      ck_assert(!memcmp(o16 + (CNT + 1) * d, c16 + (CNT + 1) * d, (CNT + 2) * 33 * 4 - (CNT + 1) * d * 2));
    }
    grpc_byte_buffer_destroy(bb);
  }
  free(buf);
  buf = answer_make16(plan, h, 1, &len); /* float rows for 16-bit tables */
  call_fx c;
  call_init(&c);
  grpc_byte_buffer *bb = sliced(buf, len, 0);
  int bad = -1;
  ck_assert_int_eq(rpc__answer_scatter(bb, plan, c.parts, NT, c.perm, (void *const *)c.out, 0, &bad), -2);
  ck_assert_int_eq(bad, 0);
  grpc_byte_buffer_destroy(bb);
  free(buf);
  emb_plan_free(plan);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_answer");
  TCase *tc = tcase_create("answer");
  tcase_add_test(tc, test_answer_scattered_from_slices);
  tcase_add_test(tc, test_answer_refused);
  tcase_add_test(tc, test_answer_rows16);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
