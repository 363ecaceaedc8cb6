/* libFuzzer target: the shard service's request handlers (rpc/service.c,
 * rpc/service_transform.c, rpc/service_remove.c): the first byte picks
 * Lookup, Push, Stats (or, with its top bit set, GetTransform), Health
 * Check (or, with its top bit set, Remove) or Watch (or, with its two top
 * bits 01, an exchange stream's message: its head read by
 * rpc__exchange_head, then handled as rpc/server.c does), the rest is
 * the request as it would arrive off the wire, copied to an exact-size heap
 * buffer; a Lookup's first byte with bit 2 set and bit 3 clear picks
 * PushLookup instead (structured: a Push and a Lookup of the same bytes,
 * one request). The service runs over an in-process store of a small plan (two
 * bounded tables, row-wise over two shards, shard 0 served) and serves a
 * data transform of XF_LEN opaque bytes, as `shardrec serve` does. Checkpoint and Restore are left out: they write
 * and read paths named by the request, and libFuzzer's string-compare
 * tracing can learn the plan fingerprint.
 * Multi-rank jobs (sync and async, header.max_staleness) run through the
 * same handlers; a Lookup that would wait is answered UNAVAILABLE (no
 * token: nothing parks). Every 64th input also runs the stalled-job sweep
 * (pending_timeout_s is tiny) and a cancel of a token never parked.
 * Requests are decoded in place by the service's own decoders
 * (rpc__lookup_decode, rpc__push_decode in rpc/codec.c), compiled in here,
 * so raw bytes reach them instrumented; the structured mode sends each
 * table's ids as varints, ids_fixed or both, packed by protobuf-c or
 * written by the client's encoder (rpc/codec.c), at any alignment in memory. Seeds of both:
 * tests/fuzz/seeds/fuzz_rpc_service.
 * Invariants: every answer is OK with bytes that decode, or an error with a
 * message; the store never holds rows of the other shard; a single-rank
 * Lookup answered OK is answered with the same bytes when its ids go as
 * varints; a structured PushLookup answered OK is answered with the bytes a
 * Lookup of its ids then gets; a GetTransform answered OK carries the transform's fingerprint,
 * size and the bytes at the asked offset (no more than asked, 1 MiB when 0),
 * and one refused is malformed (INVALID_ARGUMENT) or past the end
 * (OUT_OF_RANGE); a Remove answered OK counts the request's ids, and the
 * store holds none of them after it; an exchange message's head is taken
 * exactly when it names Lookup, Push or PushLookup beside a zero word, and
 * a structured single-rank Lookup answered OK is answered the same bytes
 * as an exchange message; an exchange Push answered before an update that
 * then failed is refused again, naming it (then a fresh service goes on). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sha256.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/codec_impl.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"

static emb_plan *plan;
static emb_store *store;
static rpc_service *svc;
#define XF_LEN 300
static uint8_t xf[XF_LEN]; /* the served transform's bytes (opaque to the service) */
static char xf_fp[SR_SHA256_HEX];

/* The store and the service over plan, afresh. */
static void service_start(void) {
  char err[256];
  store = emb_store_create_local(plan, err, sizeof err);
  if (!store) abort();
  int shard = 0;
  rpc_service_opts o = {.shards = &shard, .n_shards = 1, .max_ids = 4096,
                        .pending_timeout_s = 1e-6, .transform = xf, .transform_len = XF_LEN,
                        .transform_fp = xf_fp};
  svc = rpc_service_create(plan, store, &o, err, sizeof err);
  if (!svc) abort();
}

static void init_once(void) {
  if (svc) return;
  uint64_t rows[2] = {1000, 64};
  emb_plan_params pp = {.n_tables = 2, .rows = rows, .dim = 4,
                        .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1},
                        .seed = 1, .n_shards = 2, .row_wise = 1};
  char err[256];
  if (emb_plan_create(&pp, &plan, err, sizeof err)) abort();
  for (int i = 0; i < XF_LEN; i++) xf[i] = (uint8_t)(i * 7 + 3);
  if (sr_sha256_hex(xf, XF_LEN, xf_fp)) abort();
  service_start();
}

static int check_row(void *ctx, int table, uint64_t row_id, const float *value, int dim,
                     const float *state, int state_len) {
  (void)ctx, (void)value, (void)dim, (void)state, (void)state_len;
  if (emb_plan_shard_of(plan, table, row_id) != 0) abort(); /* a foreign row was written */
  return 0;
}

/* Structured mode: a well-formed Lookup or Push built from the bytes
 * (raw bytes rarely carry the plan fingerprint): tables, ids and gradients
 * all fuzzed, the plan fingerprint right unless a flag bit says otherwise.
 * An encoding byte picks, unless varint_only: bit 0 the client's encoder
 * (rpc__lookup_encode, rpc__push_encode), else bits 1..3 ids_fixed for
 * tables 0..2 and bit 4 both fields in table 0; bits 5..7 the request's
 * offset from an 8-byte boundary (*off). */
static uint8_t *build(rpc_method m, uint8_t flags, const uint8_t *p, size_t n, int varint_only,
                      size_t *off, size_t *len) {
  size_t at = 0;
#define NEXT() (at < n ? p[at++] : 0)
  char fp[EMB_FP_HEX];
  emb_plan_fingerprint(plan, fp);
  if (flags & 0x40) fp[3] ^= 1;
  Shardrec__V1__RequestHeader h = SHARDREC__V1__REQUEST_HEADER__INIT;
  h.plan_fingerprint = fp;
  h.job_id = (flags & 0x20) ? "b" : "a";
  h.step = (int64_t)(NEXT() % 8) - 1;
  h.world_size = (flags & 0x10) ? 2 : 1;
  h.rank = (flags & 0x08) ? 1 : 0;
  /* -1 (refused), 0 (sync), 1 or 2 (async): a job keeps the mode of its
   * first call, so most later ones are refused as a mismatch. */
  h.max_staleness = (int32_t)(NEXT() % 4) - 1;
  const uint8_t enc_byte = NEXT(), enc = varint_only ? 0 : enc_byte;
  *off = enc >> 5;
  enum { MAXT = 3, MAXI = 16 };
  Shardrec__V1__TableIds ti[MAXT], *tip[MAXT];
  Shardrec__V1__TableGrads tg[MAXT], *tgp[MAXT];
  uint64_t ids[MAXT][MAXI];
  float g[MAXT][MAXI * 4 + 1];
  size_t nt = NEXT() % (MAXT + 1), k_of[MAXT] = {0};
  static const uint32_t tids[4] = {0, 1, 0, 99};
  for (size_t t = 0; t < nt; t++) {
    size_t k = NEXT() % (MAXI + 1);
    for (size_t i = 0; i < k; i++) {
      uint64_t lo = NEXT(), hi = NEXT();
      ids[t][i] = (lo | hi << 8) >> 6;
    }
    size_t gl = k * 4 + (NEXT() == 7);
    for (size_t i = 0; i < gl; i++) {
      uint8_t x = NEXT();
      g[t][i] = x == 0xff ? (float)NAN : x == 0xfe ? (float)INFINITY : (float)(x - 128) / 64;
    }
    shardrec__v1__table_ids__init(&ti[t]);
    ti[t].table_id = tids[t % 4 == 0 ? NEXT() % 4 : t % 4];
    ti[t].n_ids = k;
    k_of[t] = k;
    ti[t].ids = ids[t];
    tip[t] = &ti[t];
    shardrec__v1__table_grads__init(&tg[t]);
    tg[t].table_id = ti[t].table_id;
    tg[t].n_ids = k;
    tg[t].ids = ids[t];
    tg[t].grads.data = (uint8_t *)g[t];
    tg[t].grads.len = gl * sizeof(float);
    tgp[t] = &tg[t];
    if (enc & (2u << t)) { /* ids_fixed instead of ids; table 0 both with bit 4 */
      ti[t].n_ids_fixed = tg[t].n_ids_fixed = k;
      ti[t].ids_fixed = tg[t].ids_fixed = ids[t];
      if (!(t == 0 && (enc & 0x10))) ti[t].n_ids = tg[t].n_ids = 0;
    }
  }
#undef NEXT
  if ((enc & 1) && m != RPC_WATCH && m != RPC_REMOVE) { /* the client's encoder */
    rpc_wire_table wt[MAXT];
    for (size_t t = 0; t < nt; t++)
      wt[t] = (rpc_wire_table){.table_id = ti[t].table_id, .ids = ids[t], .n = k_of[t],
                               .grads = g[t], .dim = 4};
    return m == RPC_LOOKUP ? rpc__lookup_encode(&h, wt, nt, 0, len)
                           : rpc__push_encode(&h, (flags & 0x04) ? -1.0f : 0.1f, wt, nt, len);
  }
  ProtobufCMessage *msg;
  Shardrec__V1__LookupRequest lq = SHARDREC__V1__LOOKUP_REQUEST__INIT;
  Shardrec__V1__PushRequest pq = SHARDREC__V1__PUSH_REQUEST__INIT;
  Shardrec__V1__WatchRequest wq = SHARDREC__V1__WATCH_REQUEST__INIT;
  Shardrec__V1__RemoveRequest rq = SHARDREC__V1__REMOVE_REQUEST__INIT;
  if (m == RPC_REMOVE) {
    rq.header = &h;
    rq.n_tables = nt;
    rq.tables = tip;
    msg = &rq.base;
  } else if (m == RPC_WATCH) {
    wq.header = &h;
    wq.detach = (flags & 0x04) != 0;
    msg = &wq.base;
  } else if (m == RPC_LOOKUP) {
    lq.header = &h;
    lq.n_tables = nt;
    lq.tables = tip;
    msg = &lq.base;
  } else {
    pq.header = &h;
    pq.learning_rate = (flags & 0x04) ? -1.0f : 0.1f;
    pq.n_tables = nt;
    pq.tables = tgp;
    msg = &pq.base;
  }
  *len = protobuf_c_message_get_packed_size(msg);
  uint8_t *out = malloc(*len ? *len : 1);
  if (out) protobuf_c_message_pack(msg, out);
  return out;
}

/* A GetTransform answered OK to the request req[n]: the transform's
 * fingerprint and size, the bytes at the asked offset, as many as asked
 * (1 MiB when 0) or as are left. */
static void check_transform(const uint8_t *req, size_t n, const rpc_reply *r) {
  Shardrec__V1__GetTransformRequest *q = shardrec__v1__get_transform_request__unpack(NULL, n, req);
  Shardrec__V1__GetTransformResponse *a =
      shardrec__v1__get_transform_response__unpack(NULL, r->out_len, r->out);
  if (!q || !a || strcmp(a->fingerprint, xf_fp) || a->total_bytes != XF_LEN ||
      a->offset != q->offset || q->offset > XF_LEN)
    abort();
  size_t want = q->max_bytes ? q->max_bytes : RPC_TRANSFORM_CHUNK;
  if (want > XF_LEN - q->offset) want = XF_LEN - (size_t)q->offset;
  if (a->data.len != want || (want && memcmp(a->data.data, xf + q->offset, want))) abort();
  shardrec__v1__get_transform_request__free_unpacked(q, NULL);
  shardrec__v1__get_transform_response__free_unpacked(a, NULL);
}

/* emb_store_iterate's visit after an OK Remove: a row the request named
 * (ctx, the request decoded) is still held. */
static int check_gone(void *ctx, int table, uint64_t row_id, const float *value, int dim,
                      const float *state, int state_len) {
  (void)value, (void)dim, (void)state, (void)state_len;
  const Shardrec__V1__RemoveRequest *q = ctx;
  for (size_t i = 0; i < q->n_tables; i++) {
    const Shardrec__V1__TableIds *t = q->tables[i];
    if (t->table_id != plan->tables[table].table_id) continue;
    for (size_t k = 0; k < t->n_ids; k++)
      if (t->ids[k] == row_id) abort();
    for (size_t k = 0; k < t->n_ids_fixed; k++)
      if (t->ids_fixed[k] == row_id) abort();
  }
  return 0;
}

/* A Remove answered OK to req[n]: its answer counts the request's ids,
 * and none of them is held now. */
static void check_removed(const uint8_t *req, size_t n, const rpc_reply *r) {
  Shardrec__V1__RemoveRequest *q = shardrec__v1__remove_request__unpack(NULL, n, req);
  Shardrec__V1__RemoveResponse *a = shardrec__v1__remove_response__unpack(NULL, r->out_len, r->out);
  if (!q || !a) abort();
  uint64_t ids = 0;
  for (size_t i = 0; i < q->n_tables; i++) ids += q->tables[i]->n_ids + q->tables[i]->n_ids_fixed;
  if (a->rows != ids) abort();
  for (int t = 0; t < 2; t++) emb_store_iterate(store, t, check_gone, q);
  shardrec__v1__remove_request__free_unpacked(q, NULL);
  shardrec__v1__remove_response__free_unpacked(a, NULL);
}

/* req[n] handed to the service from off bytes past an 8-byte boundary, in
 * a copy that ends where the request does. */
static void handle_at(rpc_method m, const uint8_t *req, size_t n, size_t off, rpc_reply *r) {
  uint8_t *buf = malloc(n + off ? n + off : 1); /* malloc'd: 16-byte aligned */
  if (!buf) abort();
  if (n) memcpy(buf + off, req, n);
  rpc_service_handle(svc, m, buf + off, n, r);
  free(buf);
}

/* An exchange stream's message (rpc/server.c): its head read
 * (rpc__exchange_head), then its request handled as the stream does
 * (rpc_service_handle_exchange, a deferral refused as busy). Sets *xm to
 * the head's method. */
static void exchange(const uint8_t *msg, size_t n, rpc_method *xm, rpc_reply *r) {
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) abort();
  if (n) memcpy(buf, msg, n);
  memset(r, 0, sizeof *r);
  if (!rpc__exchange_head(buf, n, xm, r)) {
    rpc_service_handle_exchange(svc, *xm, buf + RPC_EXCHANGE_HEAD, n - RPC_EXCHANGE_HEAD, r);
    if (r->status == RPC_DEFERRED) rpc_service_refuse_busy(svc, r);
    if (r->after && rpc_service_after(svc, r->after) != RPC_OK) {
      /* A Push answered whose update then failed: the service refuses it
       * again, naming it, until a Restore; a fresh service goes on. */
      rpc_reply again;
      rpc_service_handle_exchange(svc, *xm, buf + RPC_EXCHANGE_HEAD, n - RPC_EXCHANGE_HEAD,
                                  &again);
      if (again.status != RPC_FAILED_PRECONDITION || again.out || again.after ||
          !strstr(again.msg, "was not applied"))
        abort();
      rpc_service_destroy(svc);
      emb_store_destroy(store);
      service_start();
    }
    r->after = NULL;
  }
  free(buf);
}

/* Raw exchange mode: bytes that are an exchange message. The head is
 * taken exactly when it is 8 bytes of a carried method and a zero word;
 * what follows is answered as a call of that method is (an OK Lookup or
 * PushLookup decodes; a refusal has a message and no answer). */
static void exchange_raw(const uint8_t *msg, size_t n) {
  rpc_method xm;
  rpc_reply r;
  exchange(msg, n, &xm, &r);
  uint32_t w0 = 0, w1 = 1;
  if (n >= RPC_EXCHANGE_HEAD) memcpy(&w0, msg, 4), memcpy(&w1, msg + 4, 4);
  const int carried = w1 == 0 && (w0 == RPC_LOOKUP || w0 == RPC_PUSH || w0 == RPC_PUSH_LOOKUP);
  if (!carried && (r.status != RPC_INVALID_ARGUMENT || r.out || !r.msg[0])) abort();
  if (r.status != RPC_OK) {
    if (r.out || !r.msg[0]) abort();
    return;
  }
  if (!carried || !r.out) abort();
  if (xm != RPC_PUSH) {
    Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, r.out_len, r.out);
    if (!a) abort();
    shardrec__v1__lookup_response__free_unpacked(a, NULL);
  } else {
    for (int t = 0; t < 2; t++) emb_store_iterate(store, t, check_row, NULL);
  }
  free(r.out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  init_once();
  if (size < 1) return 0;
  if (data[0] % 5 == 4 && (data[0] & 0xc0) == 0x40) { /* a raw Watch's half: exchange */
    exchange_raw(data + 1, size - 1);
    return 0;
  }
  static const rpc_method pick[5] = {RPC_LOOKUP, RPC_PUSH, RPC_STATS, RPC_HEALTH_CHECK,
                                     RPC_WATCH};
  rpc_method m = pick[data[0] % 5];
  if (m == RPC_STATS && (data[0] & 0x80)) m = RPC_GET_TRANSFORM;
  if (m == RPC_HEALTH_CHECK && (data[0] & 0x80)) m = RPC_REMOVE;
  if (m == RPC_LOOKUP && (data[0] & 0x0c) == 0x04) m = RPC_PUSH_LOOKUP;
  size_t n = size - 1, off = 0;
  const int structured =
      ((data[0] & 0x80) && (m == RPC_LOOKUP || m == RPC_PUSH || m == RPC_WATCH ||
                            m == RPC_PUSH_LOOKUP)) ||
      (m == RPC_REMOVE && (data[0] & 0x04));
  uint8_t *req, *look = NULL; /* look: a structured PushLookup's Lookup */
  size_t look_len = 0;
  if (structured && m == RPC_PUSH_LOOKUP) {
    /* A Push and a Lookup of the same bytes (the same step and ids; the
     * learning rate a good one), in one request by the client's encoder. */
    size_t pn = n, loff;
    uint8_t *push = build(RPC_PUSH, data[0] & ~0x04, data + 1, pn, 0, &off, &pn);
    look_len = n;
    look = build(RPC_LOOKUP, data[0], data + 1, look_len, 0, &loff, &look_len);
    req = push && look ? rpc__push_lookup_encode(push, pn, look, look_len, &n) : NULL;
    free(push);
  } else if (structured) {
    req = build(m, data[0], data + 1, n, 0, &off, &n);
  } else {
    req = malloc(n ? n : 1);
    if (req && n) memcpy(req, data + 1, n);
  }
  if (!req) {
    free(look);
    return 0;
  }
  rpc_reply r;
  handle_at(m, req, n, off, &r);
  if (m == RPC_REMOVE && r.status == RPC_OK) check_removed(req, n, &r);
  if (structured && m == RPC_LOOKUP && !(data[0] & 0x10) && r.status == RPC_OK) {
    /* One rank's Lookup as an exchange message: the same answer. */
    uint8_t *x = malloc(RPC_EXCHANGE_HEAD + n);
    if (!x) abort();
    memset(x, 0, RPC_EXCHANGE_HEAD);
    memcpy(x + RPC_EXCHANGE_HEAD, req, n);
    rpc_method xm;
    rpc_reply xr;
    exchange(x, RPC_EXCHANGE_HEAD + n, &xm, &xr);
    free(x);
    if (xm != RPC_LOOKUP || xr.status != RPC_OK || xr.out_len != r.out_len ||
        memcmp(xr.out, r.out, r.out_len))
      abort();
    free(xr.out);
  }
  free(req);
  if (r.status == RPC_OK) {
    if (!r.out) abort();
    if (m == RPC_LOOKUP || m == RPC_PUSH_LOOKUP) {
      Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, r.out_len, r.out);
      if (!a) abort();
      for (size_t i = 0; i < a->n_tables; i++)
        if (a->tables[i]->rows.len % (4 * sizeof(float))) abort();
      shardrec__v1__lookup_response__free_unpacked(a, NULL);
    }
    if (m == RPC_GET_TRANSFORM) check_transform(data + 1, size - 1, &r);
    if (m == RPC_WATCH) {
      Shardrec__V1__WatchResponse *a = shardrec__v1__watch_response__unpack(NULL, r.out_len, r.out);
      if (!a) abort();
      shardrec__v1__watch_response__free_unpacked(a, NULL);
    }
    if (structured && m == RPC_LOOKUP && !(data[0] & 0x10)) { /* the same ids as varints */
      size_t vn = size - 1, voff;
      uint8_t *v = build(m, data[0], data + 1, vn, 1, &voff, &vn);
      if (!v) abort();
      rpc_reply vr;
      handle_at(m, v, vn, 0, &vr);
      free(v);
      if (vr.status != RPC_OK || vr.out_len != r.out_len || memcmp(vr.out, r.out, r.out_len))
        abort(); /* ids_fixed and varint ids answered differently */
      free(vr.out);
    }
  } else {
    if (r.out || !r.msg[0]) abort();
    if (m == RPC_GET_TRANSFORM && r.status != RPC_INVALID_ARGUMENT) {
      Shardrec__V1__GetTransformRequest *q =
          shardrec__v1__get_transform_request__unpack(NULL, size - 1, data + 1);
      if (!q || r.status != RPC_OUT_OF_RANGE || q->offset <= XF_LEN) abort();
      shardrec__v1__get_transform_request__free_unpacked(q, NULL);
    }
  }
  if (look && r.status == RPC_OK) { /* its rows are the store's now: a Lookup reads the same */
    rpc_reply lr;
    handle_at(RPC_LOOKUP, look, look_len, 0, &lr);
    if (lr.status != RPC_OK || lr.out_len != r.out_len || memcmp(lr.out, r.out, r.out_len))
      abort();
    free(lr.out);
  }
  free(look);
  free(r.out);
  if ((m == RPC_PUSH || m == RPC_PUSH_LOOKUP) && r.status == RPC_OK)
    for (int t = 0; t < 2; t++) emb_store_iterate(store, t, check_row, NULL);
  static unsigned calls;
  if (++calls % 64 == 0) {
    rpc_woken wk[4];
    if (rpc_service_take_woken(svc, wk, 4) != 0) abort(); /* nothing was ever parked */
    static int not_parked;
    if (rpc_service_cancel(svc, &not_parked) != 0) abort();
  }
  return 0;
}
