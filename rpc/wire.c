/* The client's hand-written Lookup and Push requests (rpc/wire.h). A
 * table is TableIds / TableGrads of table_id (1), a padding field when
 * needed, ids_fixed (3 / 4) and, for a Push, a second padding field and
 * grads (3): the padding (2..17 bytes: tag, length, zeros) puts the ids at
 * a multiple of 8 from the message's start and the gradients at a multiple
 * of 4. The header goes first, packed by protobuf-c. */
#include "rpc/wire.h"

#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ids and gradients are copied as they lie: a big-endian host needs byte swaps here"
#endif

static size_t vlen(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, n++;
  return n;
}

static uint8_t *vput(uint8_t *p, uint64_t v) {
  while (v >= 0x80) *p++ = (uint8_t)(v | 0x80), v >>= 7;
  *p++ = (uint8_t)v;
  return p;
}

static uint8_t *pad_put(uint8_t *p, size_t pad) {
  if (!pad) return p;
  *p++ = RPC_WIRE_PAD_TAG;
  *p++ = (uint8_t)(pad - 2);
  memset(p, 0, pad - 2);
  return p + pad - 2;
}

/* The layout of table t written at offset at: its content's length
 * (*inner) and the padding before its ids (*p1) and its gradients (*p2).
 * Of the 16 sizes 2..17 the table's length varint changes length at most
 * once, so 8 consecutive ones share it and one of them aligns the ids. */
static void table_plan(const rpc_wire_table *t, int push, size_t at, size_t *inner, size_t *p1,
                       size_t *p2) {
  const size_t il = t->n * 8, gl = push ? t->n * (size_t)t->dim * sizeof(float) : 0;
  size_t tail = 0;
  *p1 = *p2 = 0;
  if (push && t->n) {
    const size_t h = (1 + vlen(gl)) % 4; /* the grads' tag and length, after the 8-aligned ids */
    *p2 = h == 0 ? 0 : h == 1 ? 3 : h == 2 ? 2 : 5;
    tail = *p2 + 1 + vlen(gl) + gl;
  }
  const size_t head = 1 + vlen(t->table_id);
  if (!t->n) { /* no ids: table_id alone */
    *inner = head;
    return;
  }
  for (size_t p = 0; p <= 17; p += p ? 1 : 2) {
    const size_t in = head + p + 1 + vlen(il) + il + tail;
    if ((at + 1 + vlen(in) + head + p + 1 + vlen(il)) % 8 == 0) {
      *inner = in;
      *p1 = p;
      return;
    }
  }
  *inner = 0; /* unreachable: see above */
}

static uint8_t *table_put(uint8_t *p, const rpc_wire_table *t, int push, size_t inner, size_t p1,
                          size_t p2) {
  const size_t dim = (size_t)t->dim, row = dim * sizeof(float);
  *p++ = push ? 0x1a : 0x12; /* PushRequest.tables (3), LookupRequest.tables (2) */
  p = vput(p, inner);
  *p++ = 0x08; /* table_id */
  p = vput(p, t->table_id);
  if (!t->n) return p;
  p = pad_put(p, p1);
  *p++ = push ? 0x22 : 0x1a; /* TableGrads.ids_fixed (4), TableIds.ids_fixed (3) */
  p = vput(p, t->n * 8);
  memcpy(p, t->ids, t->n * 8);
  p += t->n * 8;
  if (!push) return p;
  p = pad_put(p, p2);
  *p++ = 0x1a; /* TableGrads.grads */
  p = vput(p, t->n * row);
  for (size_t j = 0; j < t->n; j++, p += row)
    memcpy(p, t->grads + (t->perm ? t->perm[j] : j) * dim, row);
  return p;
}

static uint8_t *encode(const Shardrec__V1__RequestHeader *h, int push, float lr,
                       const rpc_wire_table *t, size_t n, int prefetch, size_t *len) {
  const size_t hl = shardrec__v1__request_header__get_packed_size(h);
  size_t at = 1 + vlen(hl) + hl + (push ? 5 : 0), inner, p1, p2;
  for (size_t i = 0; i < n; i++) {
    table_plan(&t[i], push, at, &inner, &p1, &p2);
    at += 1 + vlen(inner) + inner;
  }
  *len = at + (prefetch ? 2 : 0);
  uint8_t *buf = malloc(*len ? *len : 1), *p = buf;
  if (!buf) return NULL;
  *p++ = 0x0a; /* header */
  p = vput(p, hl);
  p += shardrec__v1__request_header__pack(h, p);
  if (push) {
    *p++ = 0x15; /* PushRequest.learning_rate */
    memcpy(p, &lr, 4);
    p += 4;
  }
  for (size_t i = 0; i < n; i++) {
    table_plan(&t[i], push, (size_t)(p - buf), &inner, &p1, &p2);
    p = table_put(p, &t[i], push, inner, p1, p2);
  }
  if (prefetch) *p++ = 0x18, *p++ = 1; /* LookupRequest.prefetch_only */
  return buf;
}

uint8_t *rpc__lookup_encode(const Shardrec__V1__RequestHeader *h, const rpc_wire_table *t,
                            size_t n, int prefetch_only, size_t *len) {
  return encode(h, 0, 0, t, n, prefetch_only, len);
}

uint8_t *rpc__push_encode(const Shardrec__V1__RequestHeader *h, float lr,
                          const rpc_wire_table *t, size_t n, size_t *len) {
  return encode(h, 1, lr, t, n, 0, len);
}
