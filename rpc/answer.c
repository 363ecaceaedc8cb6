/* Lookup answers read where gRPC received them (rpc/remote_impl.h): a
 * cursor over the received byte buffer's slices and one walk of the
 * LookupResponse's wire format, each row copied once, from the slice it
 * arrived in straight to its place in the caller's array (no copy of the
 * buffer into one array, no protobuf-c unpack and its copy of the rows). */
#include <stdint.h>
#include <string.h>

#include "common/half.h"
#include "rpc/codec_impl.h"
#include "rpc/remote_impl.h"

/* A place in a received message: the slices, the current one's unread
 * bytes [p, end), the index of the next, and the bytes left in the span
 * the cursor reads (the message, or one field of it). */
typedef struct {
  const grpc_slice *sl;
  size_t n_sl, next;
  const uint8_t *p, *end;
  size_t left;
} cursor;

/* Move to the next slice holding bytes, when the current one is read. */
static void cur_load(cursor *c) {
  while (c->p == c->end && c->next < c->n_sl) {
    const grpc_slice *s = &c->sl[c->next++];
    c->p = GRPC_SLICE_START_PTR(*s);
    c->end = c->p + GRPC_SLICE_LENGTH(*s);
  }
}

static void cur_init(cursor *c, const grpc_slice_buffer *sb) {
  c->sl = sb->slices;
  c->n_sl = sb->count;
  c->next = 0;
  c->p = c->end = NULL;
  c->left = sb->length;
}

/* n bytes (n <= c->left) copied into dst (NULL: skipped). */
static void cur_take(cursor *c, void *dst, size_t n) {
  uint8_t *d = dst;
  if (!n) return;
  c->left -= n;
  if ((size_t)(c->end - c->p) >= n) { /* the usual case: within one slice */
    if (d) memcpy(d, c->p, n);
    c->p += n;
    return;
  }
  while (n) {
    cur_load(c);
    size_t k = (size_t)(c->end - c->p);
    if (k > n) k = n;
    if (d) memcpy(d, c->p, k), d += k;
    c->p += k;
    n -= k;
  }
}

/* A varint into *v: 0, or -1 cut off or longer than 10 bytes. */
static int cur_varint(cursor *c, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (!c->left) return -1;
    uint8_t b;
    cur_take(c, &b, 1);
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

/* The next field's number and wire type; a length-delimited field's
 * content becomes *sub (c moves past it), any other field of wire type
 * 0, 1 or 5 is read into *v (fixed ones as their little-endian bytes).
 * 0, or -1 at a cut or garbled field. */
static int cur_field(cursor *c, uint32_t *num, int *wt, uint64_t *v, cursor *sub) {
  uint64_t tag, len;
  if (cur_varint(c, &tag) || (tag >> 3) == 0 || (tag >> 3) > UINT32_MAX) return -1;
  *num = (uint32_t)(tag >> 3);
  *wt = (int)(tag & 7);
  *v = 0;
  switch (*wt) {
    case 0: return cur_varint(c, v);
    case 1:
    case 5: {
      const size_t n = *wt == 1 ? 8 : 4;
      if (c->left < n) return -1;
      cur_take(c, v, n);
      return 0;
    }
    case 2:
      if (cur_varint(c, &len) || len > c->left) return -1;
      *sub = *c;
      sub->left = (size_t)len;
      cur_take(c, NULL, (size_t)len);
      return 0;
    default: return -1; /* groups: no shardrec message has one */
  }
}

int rpc__answer_incarnation(grpc_byte_buffer *bb, uint64_t *inc) {
  *inc = 0;
  grpc_byte_buffer_reader rd;
  if (!bb || !grpc_byte_buffer_reader_init(&rd, bb)) return -1;
  cursor c, sub;
  cur_init(&c, &rd.buffer_out->data.raw.slice_buffer);
  int rc = 0;
  while (c.left && !rc) {
    uint32_t num;
    int wt;
    uint64_t v;
    rc = cur_field(&c, &num, &wt, &v, &sub);
    if (!rc && num == 2) { /* LookupResponse.incarnation (the last seen counts) */
      if (wt != 0) rc = -1;
      *inc = v;
    } else if (!rc && num == 1 && wt != 2) rc = -1;
  }
  grpc_byte_buffer_reader_destroy(&rd);
  return rc;
}

/* One row of dim 16-bit weights of format prec (2 dim bytes) from c into
 * dst as floats: decoded straight from the slice when it lies in one, else
 * gathered first. */
static void cur_row16(cursor *c, emb_precision prec, float *dst, size_t dim) {
  uint16_t tmp[EMB_MAX_DIM];
  const size_t n = 2 * dim;
  const uint16_t *src = tmp;
  if ((size_t)(c->end - c->p) >= n && !((uintptr_t)c->p & 1)) {
    src = (const uint16_t *)(const void *)c->p;
    c->p += n;
    c->left -= n;
  } else {
    cur_take(c, tmp, n);
  }
  if (prec == EMB_PREC_FP16) sr_f16_decode(src, dst, dim, SR_HALF_AUTO);
  else sr_bf16_decode(src, dst, dim);
}

/* One TableRows (*c) asked for as cnt ids of table tp: its rows (4 bytes a
 * weight, or 2 for an fp16 or bf16 table), if its table and length are
 * those, into out, row r at perm[r] * dim: as floats, or as they came
 * (rows16: a 16-bit table's rows as uint16_t values). 0, -1 garbled, -2
 * another table or length. */
static int table_scatter(cursor *c, const emb_table *tp, size_t cnt, const size_t *perm,
                         void *out, int rows16) {
  uint64_t id = 0, v;
  cursor rows = {0}, sub;
  int have_rows = 0;
  while (c->left) {
    uint32_t num;
    int wt;
    if (cur_field(c, &num, &wt, &v, &sub)) return -1;
    if (num == 1 && wt == 0) id = v;        /* TableRows.table_id */
    else if (num == 3 && wt == 2) rows = sub, have_rows = 1; /* TableRows.rows */
    else if ((num == 1 || num == 2 || num == 3) && wt != (num == 3 ? 2 : 0)) return -1;
  }
  const size_t dim = (size_t)tp->dim;
  const size_t bytes = dim * (size_t)emb_precision_bytes(tp->precision);
  if (id != tp->table_id || (have_rows ? rows.left : 0) != cnt * bytes) return -2;
  const int as_sent = tp->precision == EMB_PREC_FP32 || rows16; /* bytes copied as they come */
  if (as_sent && cnt && rpc__perm_runs(perm, cnt))
    cur_take(&rows, (char *)out + perm[0] * bytes, cnt * bytes); /* in order: one copy */
  else if (as_sent)
    for (size_t r = 0; r < cnt; r++) cur_take(&rows, (char *)out + perm[r] * bytes, bytes);
  else
    for (size_t r = 0; r < cnt; r++)
      cur_row16(&rows, tp->precision, (float *)out + perm[r] * dim, dim);
  return 0;
}

int rpc__answer_scatter(grpc_byte_buffer *bb, const emb_plan *plan, const call_part *parts,
                        int n_parts, size_t *const *perm, void *const *out, int rows16,
                        int *bad_table) {
  *bad_table = -1;
  grpc_byte_buffer_reader rd;
  if (!bb || !grpc_byte_buffer_reader_init(&rd, bb)) return -1;
  cursor c, sub;
  cur_init(&c, &rd.buffer_out->data.raw.slice_buffer);
  int rc = 0, j = 0;
  while (c.left && !rc) {
    uint32_t num;
    int wt;
    uint64_t v;
    if ((rc = cur_field(&c, &num, &wt, &v, &sub))) break;
    if (num != 1) continue; /* incarnation (rpc__answer_incarnation), unknown fields */
    if (wt != 2) {
      rc = -1;
      break;
    }
    if (j >= n_parts) continue; /* more tables than asked for: not read */
    const call_part *pt = &parts[j++];
    const emb_table *tp = &plan->tables[pt->t];
    rc = table_scatter(&sub, tp, pt->n, perm[pt->t] + pt->lo, out[pt->t], rows16);
    if (rc == -2) *bad_table = pt->t;
  }
  if (!rc && j < n_parts) { /* a table missing from the answer */
    *bad_table = parts[j].t;
    rc = -2;
  }
  grpc_byte_buffer_reader_destroy(&rd);
  return rc;
}

/* The length of an answer's head and message as sl begins them (its
 * status and message length into st, ml); SIZE_MAX when sl is shorter
 * than the head. */
static size_t xs_head(grpc_slice sl, uint32_t *st, uint32_t *ml) {
  if (GRPC_SLICE_LENGTH(sl) < RPC_EXCHANGE_HEAD) return SIZE_MAX;
  memcpy(st, GRPC_SLICE_START_PTR(sl), 4);
  memcpy(ml, GRPC_SLICE_START_PTR(sl) + 4, 4);
  return RPC_EXCHANGE_HEAD + (((size_t)*ml + 7) & ~(size_t)7);
}

grpc_byte_buffer *rpc__exchange_answer(grpc_byte_buffer *bb, uint32_t *st, grpc_slice *msg) {
  if (bb->type != GRPC_BB_RAW || bb->data.raw.compression != GRPC_COMPRESS_NONE) return NULL;
  const grpc_slice_buffer *sb = &bb->data.raw.slice_buffer;
  grpc_slice all = sb->count ? grpc_slice_ref(sb->slices[0]) : grpc_empty_slice();
  size_t joined = 1; /* the slices all holds */
  uint32_t ml = 0;
  size_t off = xs_head(all, st, &ml);
  if (off > GRPC_SLICE_LENGTH(all) && sb->count > 1) { /* the head spans slices: join them */
    grpc_slice_unref(all);
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb)) return NULL;
    all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    joined = sb->count;
    off = xs_head(all, st, &ml);
  }
  if (off > GRPC_SLICE_LENGTH(all)) {
    grpc_slice_unref(all);
    return NULL;
  }
  *msg = grpc_slice_sub(all, RPC_EXCHANGE_HEAD, RPC_EXCHANGE_HEAD + ml);
  grpc_slice first = grpc_slice_sub(all, off, GRPC_SLICE_LENGTH(all));
  grpc_slice_unref(all);
  grpc_byte_buffer *out = grpc_raw_byte_buffer_create(&first, 1);
  grpc_slice_unref(first);
  for (size_t i = joined; i < sb->count; i++)
    grpc_slice_buffer_add(&out->data.raw.slice_buffer, grpc_slice_ref(sb->slices[i]));
  return out;
}
