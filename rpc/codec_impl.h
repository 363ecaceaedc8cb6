/* The shard service's wire codec (rpc/codec.c), private to rpc/: the
 * hand-written Lookup and Push messages in both directions, with one copy
 * of the varint helpers and of the padding field.
 *   - Client half: the remote store's requests (rpc__lookup_encode,
 *     rpc__push_encode): ids as ids_fixed, each table's 8-byte aligned in
 *     the message behind a padding field, a Push's gradients 4-byte
 *     aligned, so that a server whose received bytes are aligned reads the
 *     ids where they lie (the gradients it reads there at any address; a
 *     server built before that copied them when off 4 bytes). Any protobuf
 *     decoder reads them as the messages of rpc/shardrec.proto.
 *   - Server half: those requests (or any protobuf client's) decoded in
 *     place (rpc__lookup_decode, rpc__push_decode), and the LookupResponse
 *     laid out around the rows the store writes into it
 *     (rpc__answer_layout, rpc__answer_write). A pinned answer's head
 *     (rpc/pinned.c) uses the varint helpers below.
 * The padding is an unknown length-delimited field, 15, that every protobuf
 * decoder skips. */
#ifndef SHARDREC_RPC_CODEC_IMPL_H
#define SHARDREC_RPC_CODEC_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/optim.h"
#include "embedding/plan.h"
#include "rpc/coord_impl.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ids, rows and gradients travel as they lie (little-endian): a big-endian host needs byte swaps"
#endif

#define RPC_WIRE_PAD_TAG 0x7a /* field 15, wire type 2: padding */

/* The bytes of v as a protobuf varint. */
static inline size_t rpc__varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, n++;
  return n;
}

/* v written at p as a varint; returns the byte after it. */
static inline uint8_t *rpc__varint_put(uint8_t *p, uint64_t v) {
  while (v >= 0x80) *p++ = (uint8_t)(v | 0x80), v >>= 7;
  *p++ = (uint8_t)v;
  return p;
}

/* ---- client half ---- */

/* Whether perm[n] counts up by one from perm[0] (the rows of a table that
 * lives on one shard, in the caller's order): then they move as one copy,
 * not one per row (4096 calls of memcpy for a dim-16 call). */
static inline int rpc__perm_runs(const size_t *perm, size_t n) {
  size_t off = 0;
  for (size_t j = 0; j < n; j++) off |= perm[j] ^ (perm[0] + j);
  return !off;
}

/* One table of a request. A Push's gradient row j (dim floats) is read
 * from grads + perm[j] * dim (perm NULL: grads + j * dim). */
typedef struct {
  uint32_t table_id;
  const uint64_t *ids; /* borrowed, [n] */
  size_t n;
  const emb_grad *grads; /* borrowed, at any address; Push only */
  const size_t *perm;  /* borrowed, [n] or NULL */
  int dim;
} rpc_wire_table;

/* A LookupRequest of header h and tables t[n] (prefetch_only as given)
 * into a malloc'd buffer (caller frees) of *len bytes; NULL out of memory. */
uint8_t *rpc__lookup_encode(const Shardrec__V1__RequestHeader *h, const rpc_wire_table *t,
                            size_t n, int prefetch_only, size_t *len);
/* The same for a PushRequest with learning rate lr and each table's
 * gradients gathered into it. */
uint8_t *rpc__push_encode(const Shardrec__V1__RequestHeader *h, float lr,
                          const rpc_wire_table *t, size_t n, size_t *len);

/* A PushLookupRequest of the PushRequest push[plen] and the LookupRequest
 * look[llen] (the two encoders' messages), each behind padding that starts
 * it at a multiple of 8 from the message's start, so that their ids and
 * gradients stay as aligned as they were; a malloc'd buffer of *len bytes,
 * NULL out of memory. */
uint8_t *rpc__push_lookup_encode(const uint8_t *push, size_t plen, const uint8_t *look,
                                 size_t llen, size_t *len);

/* ---- server half ---- */

/* Lookup and Push requests decoded in place (rpc__lookup_decode,
 * rpc__push_decode): one walk of the wire format fills protobuf-c's structs
 * as views, owning nothing (no *_free_unpacked). A table's ids_fixed
 * (8-byte little-endian ids; this host is little-endian, checked above)
 * point into the request bytes when they lie 8-byte aligned there, else
 * into a copy in the call's scratch; a Push's grads point into the request
 * bytes wherever they lie (read as emb_grad, embedding/optim.h); varint ids
 * are decoded into the scratch, and the header's two strings copied into it
 * NUL-terminated. The scratch comes from the service's pool (one per call
 * in flight, kept between calls: rpc/admission.c), so a call allocates
 * nothing once its thread's scratch has grown to the size of its
 * requests. */

/* What the first walk of a request's table found. */
typedef struct {
  const uint8_t *p;     /* the TableIds (TableGrads) bytes */
  size_t n;
  uint32_t table_id;
  size_t n_var, n_fix;  /* ids given as varints; as fixed64 */
  int fix_fields;       /* ids_fixed fields seen */
  const uint8_t *fix;   /* the first one's ids */
  const uint8_t *grads; /* Push: the (last) grads field */
  size_t grads_len;
} rpc_table_scan;

/* One call's scratch: the decoded request (owned buffers, views into the
 * request) and the per-table arrays its handler fills. */
typedef struct rpc_scratch {
  struct rpc_scratch *next; /* the pool's free list */
  Shardrec__V1__RequestHeader h;
  char fp[EMB_FP_HEX + 1], job[RPC_COORD_JOB_MAX + 1];
  Shardrec__V1__LookupRequest lq;
  Shardrec__V1__PushRequest pq;
  /* per request table, [cap_req] */
  Shardrec__V1__TableIds *ti, **tip;
  Shardrec__V1__TableGrads *tg, **tgp;
  rpc_table_scan *scan;
  size_t *rows_at;
  int *idx;
  size_t cap_req;
  /* per plan table, [n_tables + 1] */
  uint8_t *seen;
  const uint64_t **ids;
  size_t *counts;
  float **outp;
  const emb_grad **grads; /* a Push's, where they lie in the request */
  /* the ids that are not read in place, and the Push's set */
  uint64_t *idbuf;
  uint32_t *hash;
  size_t cap_id, cap_hash;
  uint64_t in_place, copied; /* ids of this call, for Stats */
} rpc_scratch;

/* *p grown to at least n elements of size bytes (contents dropped). 0, or
 * -1 out of memory (*p as it was). */
int rpc__grow(void **p, size_t *cap, size_t n, size_t size);
/* Room for n tables of a request in x. 0, or -1 out of memory. */
int rpc__scratch_tables(rpc_scratch *x, size_t n);

/* A LookupRequest in[len] decoded in place into x->lq: the views
 * protobuf-c's unpack would give (header NULL when absent), pointing into
 * in and x, valid while both are; at most n_tables tables (the plan's) and
 * max_ids ids copied. 0, or -1 with the refusal in r: INVALID_ARGUMENT
 * naming the field and its offset in the request, RESOURCE_EXHAUSTED out
 * of memory. */
int rpc__lookup_decode(rpc_scratch *x, int n_tables, size_t max_ids, const uint8_t *in,
                       size_t len, rpc_reply *r);
/* The same for a PushRequest, into x->pq (its grads at any address). */
int rpc__push_decode(rpc_scratch *x, int n_tables, size_t max_ids, const uint8_t *in, size_t len,
                     rpc_reply *r);

/* The two parts of a PushLookupRequest in[len], views into in. 0, or -1
 * with the refusal in r (INVALID_ARGUMENT: a part missing, given twice or
 * not length-delimited, named with its offset). */
int rpc__push_lookup_split(const uint8_t *in, size_t len, const uint8_t **push, size_t *plen,
                           const uint8_t **look, size_t *llen, rpc_reply *r);

/* The head of an exchange stream's message in[len] (rpc/shardrec.proto,
 * "Exchange stream": u32 the method, u32 0, little-endian). 0 with *m a
 * method the stream carries (Lookup, Push or PushLookup), its request at
 * in + RPC_EXCHANGE_HEAD; else -1 with the refusal in r (INVALID_ARGUMENT:
 * shorter than the head, a nonzero second word, no such method or one
 * that goes as a call) and *m the head's method when it names one, else
 * RPC_METHOD_UNKNOWN. */
#define RPC_EXCHANGE_HEAD 8
int rpc__exchange_head(const uint8_t *in, size_t len, rpc_method *m, rpc_reply *r);

/* The world_size and parts of the header of a Lookup or Push request
 * in[len] (the last of each, as protobuf reads them); 0 where none is
 * found (a malformed request is its decoder's to refuse). */
void rpc__request_peek(const uint8_t *in, size_t len, int32_t *world, int32_t *parts);

/* The request in[len], a message of type desc, holds no control character
 * (below 0x20, or 0x7f; a NUL byte included) in any of its string fields,
 * those of the messages in it too: the check protobuf-c's unpack leaves
 * out, for the requests it decodes (a NUL would cut the C string made of
 * them short, a newline would forge a line of the server's log). 0, or -1
 * with the refusal (INVALID_ARGUMENT naming the field and the byte's
 * offset) in r. The in-place decoders check the header's strings alike. */
int rpc__texts_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *in, size_t len,
                  rpc_reply *r);

/* The LookupResponse is written by hand, so that the store writes the rows
 * straight into the answer (no TableRows buffers, no pack copy): per table
 * a TableRows of table_id (1), dim (2), a padding field and rows (3), then
 * incarnation (2). The padding field (2 to 9 bytes) is there when needed
 * so that each table's rows start 4-byte aligned in the answer (the store
 * writes floats). */
/* Bytes of one weight of table t (plan index) in a LookupResponse: 4, or 2
 * for an fp16 or bf16 table, whose rows travel as 16-bit values of its
 * format (the plan, which both sides hold, says which). */
static inline size_t rpc__row_value_bytes(const emb_plan *plan, int t) {
  return (size_t)emb_precision_bytes(plan->tables[t].precision);
}

/* Offsets of each table's rows in the answer to q (tables at plan indexes
 * idx, dims from plan) in rows_at[n_tables], and the answer's length. Always
 * 0: rpc__check_answer has bounded the answer's size. */
int rpc__answer_layout(const emb_plan *plan, uint64_t incarnation,
                       const Shardrec__V1__LookupRequest *q, const int *idx, size_t *rows_at,
                       size_t *len);
/* Everything of that answer but the rows (left for the store at rows_at)
 * into out[len]. */
void rpc__answer_write(const emb_plan *plan, uint64_t incarnation,
                       const Shardrec__V1__LookupRequest *q, const int *idx,
                       const size_t *rows_at, uint8_t *out, size_t len);

/* Where the store writes the rows of q's answer (out, laid out at rows_at):
 * outp[t] for each table of q, into the answer itself for an fp32 table,
 * and for a 16-bit one too when direct (the store hands 16-bit rows as
 * they are: emb_store_lookup_begin_rows16), else into a float buffer.
 * Returns that buffer (malloc'd; the caller frees it unless it is
 * &rpc__no_rows16, which stands for none), or NULL when out of memory. */
extern float rpc__no_rows16;
float *rpc__answer_rows16(const emb_plan *plan, const Shardrec__V1__LookupRequest *q,
                          const int *idx, uint8_t *out, const size_t *rows_at, float **outp,
                          int direct);
/* Once the store has written them: the 16-bit tables' rows from outp[t]
 * into the answer, as 16-bit values of each table's format. */
void rpc__answer_encode16(const emb_plan *plan, const Shardrec__V1__LookupRequest *q,
                          const int *idx, uint8_t *out, const size_t *rows_at,
                          float *const *outp);

/* m packed by protobuf-c into r->out (malloc'd; caller frees), r->out_len;
 * out of memory: RESOURCE_EXHAUSTED in r. */
void rpc__pack_reply(rpc_reply *r, const ProtobufCMessage *m);

#endif
