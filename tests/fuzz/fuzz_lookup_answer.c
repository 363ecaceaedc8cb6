/* libFuzzer target: the client's reading of a Lookup's answer where gRPC
 * received it (rpc/answer.c: rpc__answer_incarnation, rpc__answer_scatter,
 * and the same bytes as an exchange stream's answer, rpc__exchange_answer),
 * the bytes a server sent, whatever it sent. The answer is cut into up to
 * four slices at places the input picks, each its own exact-size heap
 * buffer (a read past a slice is caught), and read for a call that asked
 * up to three parts of a plan of three tables: fp32 of dim 4, fp16 of dim 3
 * (6 bytes a row, so rows straddle 4-byte places) and bf16 of dim 8, each
 * part 0 to 8 rows at an offset of its table's order, in order or reversed,
 * as floats or (rows16) in their own bits.
 *
 * Input: byte 0 flags (bit 0 rows16, bit 1 reversed order, bits 2-3 the
 * number of parts, bits 4-6 the order of the tables, bit 7 structured),
 * bytes 1-3 each part's rows (bits 0-3), offset (bits 4-5) and, structured,
 * what is wrong (bits 6-7), bytes 4-6 the cuts, then the
 * answer's bytes. Structured: a well-formed LookupResponse packed by
 * protobuf-c from the rest, its incarnation from the first 8 bytes, a
 * part's table id or rows' length wrong where bytes 1-3 say so, the rows
 * the bytes after.
 *
 * Invariants: an answer protobuf-c unpacks and the reader takes has the
 * incarnation protobuf-c reads, and every asked row where the reader put
 * it, with the bits the answer carried (decoded from fp16 or bf16 unless
 * rows16); one it refuses as another table or length (-2) names a part
 * whose table in protobuf-c's reading is missing, another table or of
 * another length; a structured answer is taken, or refused -2 naming the
 * first part made wrong; an exchange answer is read exactly when the
 * bytes hold its head and message, with their status, message and the
 * bytes after. Seeds: tests/fuzz/seeds/fuzz_lookup_answer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "embedding/plan.h"
#include "rpc/remote_impl.h"
#include "rpc/shardrec.pb-c.h"

#define N_T 3
#define MAX_ROWS 8
#define MAX_LO 3

static emb_plan *plan;

static void init_once(void) {
  if (plan) return;
  grpc_init();
  uint64_t rows[N_T] = {100, 100, 100};
  emb_plan_params pp = {.n_tables = N_T, .rows = rows, .dim = 4,
                        .optim = {.kind = EMB_OPT_SGD, .eps = -1}, .seed = 1, .n_shards = 1};
  char err[256];
  if (emb_plan_create(&pp, &plan, err, sizeof err)) abort();
  plan->tables[1].dim = 3;
  plan->tables[1].precision = EMB_PREC_FP16;
  plan->tables[2].dim = 8;
  plan->tables[2].precision = EMB_PREC_BF16;
}

static size_t row_bytes(int t) {
  return (size_t)plan->tables[t].dim * (size_t)emb_precision_bytes(plan->tables[t].precision);
}

/* The structured answer: parts' tables with rows from body, table ids and
 * lengths wrong where wrong[j] says (1: id, 2: one row short); its packed
 * bytes into *msg (malloc'd), their length returned. */
static size_t structured(const call_part *parts, int n_parts, const int *wrong,
                         const uint8_t *body, size_t blen, uint8_t **msg) {
  Shardrec__V1__LookupResponse r = SHARDREC__V1__LOOKUP_RESPONSE__INIT;
  Shardrec__V1__TableRows tr[N_T], *tp[N_T];
  uint8_t *rows[N_T] = {NULL, NULL, NULL};
  uint64_t inc = 0;
  for (size_t k = 0; k < 8 && k < blen; k++) inc |= (uint64_t)body[k] << (8 * k);
  r.incarnation = inc;
  size_t at = 8;
  for (int j = 0; j < n_parts; j++) {
    const int t = parts[j].t;
    const emb_table *e = &plan->tables[t];
    size_t n = parts[j].n * row_bytes(t);
    if (wrong[j] == 2 && n) n -= row_bytes(t);
    shardrec__v1__table_rows__init(&tr[j]);
    tr[j].table_id = e->table_id + (wrong[j] == 1);
    tr[j].dim = e->dim;
    rows[j] = malloc(n ? n : 1);
    if (!rows[j]) abort();
    for (size_t b = 0; b < n; b++, at++) rows[j][b] = at < blen ? body[at] : (uint8_t)(at * 131);
    tr[j].rows.data = rows[j];
    tr[j].rows.len = n;
    tp[j] = &tr[j];
  }
  r.n_tables = (size_t)n_parts;
  r.tables = tp;
  const size_t len = shardrec__v1__lookup_response__get_packed_size(&r);
  *msg = malloc(len ? len : 1);
  if (!*msg) abort();
  shardrec__v1__lookup_response__pack(&r, *msg);
  for (int j = 0; j < n_parts; j++) free(rows[j]);
  return len;
}

/* Whether row r of part p (at its place in out) holds the row bytes src. */
static int row_is(const call_part *p, const size_t *perm, const void *out, int rows16,
                  const uint8_t *src, size_t r) {
  const emb_table *e = &plan->tables[p->t];
  const size_t dim = (size_t)e->dim, rb = row_bytes(p->t), at = perm[p->lo + r];
  if (e->precision == EMB_PREC_FP32 || rows16)
    return !memcmp((const char *)out + at * rb, src + r * rb, rb);
  uint16_t h[8];
  float want[8];
  memcpy(h, src + r * rb, rb);
  if (e->precision == EMB_PREC_FP16) sr_f16_decode(h, want, dim, SR_HALF_AUTO);
  else sr_bf16_decode(h, want, dim);
  return !memcmp((const float *)out + at * dim, want, dim * sizeof(float));
}

/* The same bytes read as an exchange stream's answer (bb holds msg[len]
 * in its cut slices): taken exactly when they hold the head and its padded
 * message, then with the head's status, the message's bytes and every
 * byte after them, whatever the cuts. */
static void exchange_check(grpc_byte_buffer *bb, const uint8_t *msg, size_t len) {
  uint32_t st = 0, w0 = 0, w1 = 0;
  grpc_slice m = grpc_empty_slice();
  grpc_byte_buffer *body = rpc__exchange_answer(bb, &st, &m);
  if (len >= 8) {
    memcpy(&w0, msg, 4);
    memcpy(&w1, msg + 4, 4);
  }
  const size_t off = len >= 8 ? 8 + (((size_t)w1 + 7) & ~(size_t)7) : SIZE_MAX;
  if (!body != (off > len)) abort();
  if (!body) return;
  if (st != w0 || GRPC_SLICE_LENGTH(m) != w1 || memcmp(GRPC_SLICE_START_PTR(m), msg + 8, w1))
    abort();
  grpc_byte_buffer_reader rd;
  if (!grpc_byte_buffer_reader_init(&rd, body)) abort();
  grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
  grpc_byte_buffer_reader_destroy(&rd);
  if (GRPC_SLICE_LENGTH(all) != len - off || memcmp(GRPC_SLICE_START_PTR(all), msg + off, len - off))
    abort();
  grpc_slice_unref(all);
  grpc_slice_unref(m);
  grpc_byte_buffer_destroy(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  init_once();
  if (size < 7) return 0;
  const int rows16 = data[0] & 1, reversed = (data[0] >> 1) & 1, n_parts = (data[0] >> 2) & 3;
  const int is_struct = data[0] >> 7;
  static const int orders[6][N_T] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                     {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  const int *order = orders[((data[0] >> 4) & 7) % 6];
  call_part parts[N_T];
  int wrong[N_T] = {0, 0, 0};
  size_t perm_store[N_T][MAX_LO + MAX_ROWS], *perm[N_T];
  void *out[N_T];
  size_t rows_of[N_T] = {0, 0, 0};
  for (int t = 0; t < N_T; t++) {
    perm[t] = perm_store[t];
    for (size_t k = 0; k < MAX_LO + MAX_ROWS; k++) perm[t][k] = 0;
  }
  for (int j = 0; j < n_parts; j++) {
    const int t = order[j];
    parts[j].t = t;
    parts[j].n = (data[1 + j] & 15) % (MAX_ROWS + 1);
    parts[j].lo = (data[1 + j] >> 4) & MAX_LO;
    wrong[j] = is_struct ? (data[1 + j] >> 6) % 3 : 0;
    /* The caller's places of the part's rows (lo + n of them in its order). */
    for (size_t r = 0; r < parts[j].n; r++)
      perm[t][parts[j].lo + r] = reversed ? parts[j].n - 1 - r : r;
    rows_of[t] = parts[j].n;
  }
  for (int t = 0; t < N_T; t++) { /* exactly the part's rows: a write past them is caught */
    const emb_table *e = &plan->tables[t];
    const size_t rb = e->precision == EMB_PREC_FP32 || !rows16 ? (size_t)e->dim * sizeof(float)
                                                               : row_bytes(t);
    out[t] = malloc(rows_of[t] ? rows_of[t] * rb : 1);
    if (!out[t]) abort();
  }
  uint8_t *msg;
  size_t len;
  if (is_struct) {
    len = structured(parts, n_parts, wrong, data + 7, size - 7, &msg);
  } else {
    len = size - 7;
    msg = malloc(len ? len : 1);
    if (!msg) abort();
    memcpy(msg, data + 7, len);
  }
  /* Up to four slices, cut at the input's places (empty slices kept). */
  size_t cut[5] = {0, 0, 0, 0, len};
  for (int k = 0; k < 3; k++) cut[k + 1] = (size_t)data[4 + k] * len / 255;
  for (int a = 1; a < 4; a++)
    for (int b = a + 1; b < 4; b++)
      if (cut[b] < cut[a]) {
        size_t x = cut[a];
        cut[a] = cut[b];
        cut[b] = x;
      }
  grpc_slice sl[4];
  for (int k = 0; k < 4; k++) {
    const size_t n = cut[k + 1] - cut[k];
    uint8_t *piece = malloc(n ? n : 1);
    if (!piece) abort();
    memcpy(piece, msg + cut[k], n);
    sl[k] = grpc_slice_new(piece, n, free);
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, 4);
  for (int k = 0; k < 4; k++) grpc_slice_unref(sl[k]);

  uint64_t inc;
  const int inc_rc = rpc__answer_incarnation(bb, &inc);
  int bad = -1;
  const int rc =
      rpc__answer_scatter(bb, plan, parts, n_parts, perm, out, rows16, &bad);
  if (rc != 0 && rc != -1 && rc != -2) abort();
  if (rc == -2 && (bad < 0 || bad >= N_T)) abort();

  if (is_struct) { /* well-formed: taken, or refused naming the first part made wrong */
    int first = -1;
    for (int j = 0; j < n_parts && first < 0; j++)
      if (wrong[j] == 1 || (wrong[j] == 2 && parts[j].n)) first = j;
    if (inc_rc) abort();
    if (first < 0 ? rc != 0 : rc != -2 || bad != parts[first].t) abort();
  }
  Shardrec__V1__LookupResponse *u = shardrec__v1__lookup_response__unpack(NULL, len, msg);
  if (u) {
    if (rc == 0) {
      if (inc_rc || inc != u->incarnation || u->n_tables < (size_t)n_parts) abort();
      for (int j = 0; j < n_parts; j++) {
        const Shardrec__V1__TableRows *tr = u->tables[j];
        const int t = parts[j].t;
        if (tr->table_id != plan->tables[t].table_id || tr->rows.len != parts[j].n * row_bytes(t))
          abort();
        for (size_t r = 0; r < parts[j].n; r++)
          if (!row_is(&parts[j], perm[t], out[t], rows16, tr->rows.data, r)) abort();
      }
    } else if (rc == -2) {
      int j = 0;
      while (j < n_parts && parts[j].t != bad) j++;
      if (j == n_parts) abort();
      const Shardrec__V1__TableRows *tr = (size_t)j < u->n_tables ? u->tables[j] : NULL;
      if (tr && tr->table_id == plan->tables[bad].table_id &&
          tr->rows.len == parts[j].n * row_bytes(bad))
        abort(); /* refused an answer that holds the part */
    }
    shardrec__v1__lookup_response__free_unpacked(u, NULL);
  }
  exchange_check(bb, msg, len);
  grpc_byte_buffer_destroy(bb);
  free(msg);
  for (int t = 0; t < N_T; t++) free(out[t]);
  return 0;
}
