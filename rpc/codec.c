/* The shard service's wire codec (rpc/codec_impl.h): the hand-written Lookup
 * and Push messages, the server's half (requests decoded in place, the
 * LookupResponse written around the store's rows) and the client's half
 * (the remote store's requests). */
#include "rpc/codec_impl.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"

#include "rpc/shardrec.pb-c.h"

/* ---- the call's scratch ---- */

int rpc__grow(void **p, size_t *cap, size_t n, size_t size) {
  if (n <= *cap) return 0;
  size_t c = *cap * 2 > n ? *cap * 2 : n;
  void *q = malloc(c * size);
  if (!q) return -1;
  free(*p);
  *p = q;
  *cap = c;
  return 0;
}

int rpc__scratch_tables(rpc_scratch *x, size_t n) {
  if (n <= x->cap_req) return 0;
  size_t c = x->cap_req * 2 > n ? x->cap_req * 2 : n + 4;
  void *a = realloc(x->ti, c * sizeof *x->ti);
  if (!a) return -1;
  x->ti = a;
  if (!(a = realloc(x->tg, c * sizeof *x->tg))) return -1;
  x->tg = a;
  if (!(a = realloc(x->scan, c * sizeof *x->scan))) return -1;
  x->scan = a;
  free(x->tip), free(x->tgp), free(x->rows_at), free(x->idx);
  x->tip = malloc(c * sizeof *x->tip);
  x->tgp = malloc(c * sizeof *x->tgp);
  x->rows_at = malloc(c * sizeof *x->rows_at);
  x->idx = malloc(c * sizeof *x->idx);
  if (!x->tip || !x->tgp || !x->rows_at || !x->idx) {
    x->cap_req = 0;
    return -1;
  }
  x->cap_req = c;
  return 0;
}

/* ---- requests decoded in place (server) ---- */

/* The decoder's place in a request: the message's name and first byte,
 * for refusals that say what and where. */
typedef struct {
  const char *msg; /* "shardrec.v1.LookupRequest" */
  const uint8_t *base;
  size_t len;
  rpc_reply *r;
} wire_rd;

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

/* Refuse the request: INVALID_ARGUMENT, "not a valid MSG (N bytes): FIELD
 * at offset K: WHY". */
static int wire_bad(const wire_rd *d, const uint8_t *at, const char *field, const char *why) {
  d->r->status = RPC_INVALID_ARGUMENT;
  snprintf(d->r->msg, sizeof d->r->msg, "not a valid %s (%zu bytes): %s at offset %zu: %s",
           d->msg, d->len, field, (size_t)(at - d->base), why);
  return -1;
}

/* A varint at *p (before end) into *v, *p past it: 0, -1 cut off by end,
 * -2 longer than 10 bytes. */
static int wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  const uint8_t *q = *p;
  uint64_t x = 0;
  for (unsigned sh = 0; sh < 70; sh += 7) {
    if (q == end) return -1;
    const uint8_t b = *q++;
    x |= (uint64_t)(b & 0x7f) << sh;
    if (!(b & 0x80)) {
      *p = q;
      *v = x;
      return 0;
    }
  }
  return -2;
}

/* A message inside the request: its field's name in ("tables"; "" the
 * request itself), its index there when that field repeats (-1: none), and
 * the names of its own fields, names[n_names] (NULL: unknown). Only a
 * refusal spells the name out (field_name): a valid request formats none. */
typedef struct {
  const char *in;
  long idx;
  const char *const *names;
  uint32_t n_names;
} wire_msg;

/* The name of m itself ("tables[2]"), into buf[48]. */
static const char *msg_name(char *buf, const wire_msg *m) {
  if (m->idx >= 0) snprintf(buf, 48, "%s[%ld]", m->in, m->idx);
  else snprintf(buf, 48, "%s", m->in);
  return buf;
}

/* The name of field num of m ("tables[2].ids"), into buf[64]. */
static const char *field_name(char *buf, const wire_msg *m, uint32_t num) {
  char in[48];
  msg_name(in, m);
  const char *dot = *in ? "." : "";
  if (num < m->n_names && m->names[num]) snprintf(buf, 64, "%s%s%s", in, dot, m->names[num]);
  else snprintf(buf, 64, "%s%sfield %u", in, *in ? " " : "", num);
  return buf;
}

/* One field as wire_field read it: where it starts, its number and wire
 * type, and its value: a varint or the bits of a fixed-size one in v; a
 * length-delimited one's bytes at val[n], inside the request (v: n). */
typedef struct {
  const uint8_t *at;
  uint32_t num;
  int wt;
  uint64_t v;
  const uint8_t *val;
  size_t n;
} wire_f;

/* The next field of message m at [*p, end) into *w, *p past it. 0, or -1
 * with the refusal in d. */
static int wire_field(const wire_rd *d, const uint8_t **p, const uint8_t *end, const wire_msg *m,
                      wire_f *w) {
  const uint8_t *at = *p;
  char f[64];
  uint64_t tag;
  *w = (wire_f){.at = at};
  int e = wire_varint(p, end, &tag);
  if (e || tag > 0xffffffffu || (tag >> 3) == 0)
    return wire_bad(d, at, *m->in ? m->in : "the request",
                    e == -1 ? "field tag cut off" : "field tag out of range");
  w->num = (uint32_t)(tag >> 3);
  w->wt = (int)(tag & 7);
  const uint8_t *vat = *p;
  switch (w->wt) {
    case WT_VARINT:
      if ((e = wire_varint(p, end, &w->v)))
        return wire_bad(d, vat, field_name(f, m, w->num),
                        e == -1 ? "varint cut off" : "varint longer than 10 bytes");
      return 0;
    case WT_I64:
    case WT_I32: {
      const size_t n = w->wt == WT_I64 ? 8 : 4;
      if ((size_t)(end - *p) < n)
        return wire_bad(d, vat, field_name(f, m, w->num), "fixed-size value cut off");
      memcpy(&w->v, *p, n); /* little-endian host */
      *p += n;
      return 0;
    }
    case WT_LEN:
      if ((e = wire_varint(p, end, &w->v)))
        return wire_bad(d, vat, field_name(f, m, w->num),
                        e == -1 ? "length cut off" : "length longer than 10 bytes");
      if (w->v > (uint64_t)(end - *p))
        return wire_bad(d, vat, field_name(f, m, w->num), "length past the end");
      w->val = *p;
      w->n = (size_t)w->v;
      *p += w->n;
      return 0;
  }
  return wire_bad(d, at, field_name(f, m, w->num), "wire type 3, 4, 6 or 7 (groups or none)");
}

/* A known field of number num seen with wire type wt where want was
 * expected: refused naming it. */
static int wire_type_bad(const wire_rd *d, const uint8_t *at, const char *field, int wt) {
  char why[64];
  snprintf(why, sizeof why, "wire type %d is not this field's", wt);
  return wire_bad(d, at, field, why);
}

/* s[n] into dst[cap] NUL-terminated, at most cap - 1 bytes (a longer one
 * stays longer than any value it is checked against). */
static void wire_str(char *dst, size_t cap, const uint8_t *s, size_t n) {
  if (n > cap - 1) n = cap - 1;
  memcpy(dst, s, n);
  dst[n] = 0;
}

/* Where the first control character (below 0x20, or 0x7f) of s[n] is; n
 * when none is. */
static size_t control_at(const uint8_t *s, size_t n) {
  size_t k = 0;
  while (k < n && s[k] >= 0x20 && s[k] != 0x7f) k++;
  return k;
}

/* The string field's bytes s[n] hold no control character: a NUL would
 * cut the C string made of them short, and a newline would forge a line of
 * the server's log. 0, or -1 with the refusal in d naming the field and
 * the byte's offset. */
static int wire_text(const wire_rd *d, const char *field, const uint8_t *s, size_t n) {
  const size_t k = control_at(s, n);
  if (k == n) return 0;
  char why[96];
  snprintf(why, sizeof why, "byte 0x%02x in a string (a control character)", s[k]);
  return wire_bad(d, s + k, field, why);
}

/* Every string field of the message desc at [p, end) (in: its field name
 * in the request, "" the request), those of the messages in it too,
 * through wire_text: the check protobuf-c's unpack leaves out, for the
 * requests it decodes. 0, or -1 with the refusal in d (a malformed field
 * too). */
static int wire_texts(const wire_rd *d, const ProtobufCMessageDescriptor *desc, const char *in,
                      const uint8_t *p, const uint8_t *end) {
  const wire_msg m = {in, -1, NULL, 0};
  while (p < end) {
    wire_f w;
    if (wire_field(d, &p, end, &m, &w)) return -1;
    const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(desc, w.num);
    if (!fd || w.wt != WT_LEN) continue; /* unknown, or a wrong type unpack refuses */
    char f[64];
    snprintf(f, sizeof f, "%s%s%s", in, *in ? "." : "", fd->name);
    if (fd->type == PROTOBUF_C_TYPE_STRING && wire_text(d, f, w.val, w.n)) return -1;
    if (fd->type == PROTOBUF_C_TYPE_MESSAGE &&
        wire_texts(d, fd->descriptor, f, w.val, w.val + w.n))
      return -1;
  }
  return 0;
}

int rpc__texts_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *in, size_t len,
                  rpc_reply *r) {
  const wire_rd d = {desc->name, in, len, r};
  return wire_texts(&d, desc, "", in, in + len);
}

/* The RequestHeader at [p, end) into x->h (fields seen again override:
 * protobuf's merge of a message given twice). */
static int header_decode(const wire_rd *d, rpc_scratch *x, const uint8_t *p, const uint8_t *end) {
  static const char *const names[9] = {NULL, "plan_fingerprint", "job_id", "step", "rank",
                                       "world_size", "max_staleness", "part", "parts"};
  const wire_msg m = {"header", -1, names, 9};
  char f[64];
  while (p < end) {
    wire_f w;
    if (wire_field(d, &p, end, &m, &w)) return -1;
    if (w.num > 8) continue; /* unknown: skipped */
    if ((w.num <= 2) != (w.wt == WT_LEN) || (w.num > 2 && w.wt != WT_VARINT))
      return wire_type_bad(d, w.at, field_name(f, &m, w.num), w.wt);
    if (w.num <= 2 && control_at(w.val, w.n) < w.n) /* named only when refused */
      return wire_text(d, field_name(f, &m, w.num), w.val, w.n);
    if (w.num == 1) wire_str(x->fp, sizeof x->fp, w.val, w.n);
    else if (w.num == 2) wire_str(x->job, sizeof x->job, w.val, w.n);
    else if (w.num == 3) x->h.step = (int64_t)w.v;
    else {
      const int32_t i = (int32_t)(uint32_t)w.v;
      if (w.num == 4) x->h.rank = i;
      else if (w.num == 5) x->h.world_size = i;
      else if (w.num == 6) x->h.max_staleness = i;
      else if (w.num == 7) x->h.part = i;
      else x->h.parts = i;
    }
  }
  return 0;
}


static const char *const table_ids_names[4] = {NULL, "table_id", "ids", "ids_fixed"};
static const char *const table_grads_names[5] = {NULL, "table_id", "ids", "grads", "ids_fixed"};

/* First walk of tables[i] (a TableIds, or with push a TableGrads) at
 * [p, end): structure checked, ids counted. */
static int table_walk(const wire_rd *d, size_t i, int push, const uint8_t *p, const uint8_t *end,
                      rpc_table_scan *t) {
  const uint32_t fix_num = push ? 4 : 3;
  char f[64];
  const wire_msg m = {"tables", (long)i, push ? table_grads_names : table_ids_names, push ? 5 : 4};
  memset(t, 0, sizeof *t);
  t->p = p;
  t->n = (size_t)(end - p);
  while (p < end) {
    wire_f w;
    if (wire_field(d, &p, end, &m, &w)) return -1;
    const int want = w.num == 1 ? WT_VARINT : w.num == fix_num ? WT_I64 : w.num <= 3 ? WT_LEN : -1;
    if (want >= 0 && w.wt != want && (w.num == 1 || (push && w.num == 3) || w.wt != WT_LEN) &&
        !(w.num == 2 && w.wt == WT_VARINT))
      return wire_type_bad(d, w.at, field_name(f, &m, w.num), w.wt);
    if (w.num == 1) {
      t->table_id = (uint32_t)w.v;
    } else if (w.num == 2 && w.wt == WT_VARINT) {
      t->n_var++;
    } else if (w.num == 2) { /* packed varints */
      for (size_t k = 0; k < w.n; k++) t->n_var += w.val[k] < 0x80;
      if (w.n && w.val[w.n - 1] >= 0x80)
        return wire_bad(d, w.val + w.n - 1, field_name(f, &m, w.num), "last varint cut off");
    } else if (w.num == fix_num && w.wt == WT_I64) { /* one id, not packed: copied */
      t->n_fix++;
      t->fix_fields += 2;
    } else if (w.num == fix_num) { /* packed fixed64 */
      if (w.n % 8) return wire_bad(d, w.val, field_name(f, &m, w.num), "length not a multiple of 8 bytes");
      if (w.n && !t->fix_fields++) t->fix = w.val;
      t->n_fix += w.n / 8;
    } else if (push && w.num == 3) {
      t->grads = w.val;
      t->grads_len = w.n;
    }
  }
  return 0;
}

/* Second walk of tables[i] (scanned as *t): its ids in order into out
 * (varints decoded, fixed64 copied). */
static int table_copy(const wire_rd *d, size_t i, int push, const rpc_table_scan *t, uint64_t *out) {
  const uint32_t fix_num = push ? 4 : 3;
  const uint8_t *p = t->p, *end = t->p + t->n;
  char f[64];
  const wire_msg m = {"tables", (long)i, push ? table_grads_names : table_ids_names, push ? 5 : 4};
  while (p < end) {
    wire_f w;
    if (wire_field(d, &p, end, &m, &w)) return -1;
    if (w.num == 2 && w.wt == WT_VARINT) {
      *out++ = w.v;
    } else if (w.num == 2) {
      for (const uint8_t *q = w.val, *qe = w.val + w.n; q < qe;)
        if (wire_varint(&q, qe, out++))
          return wire_bad(d, q, field_name(f, &m, w.num), "varint longer than 10 bytes");
    } else if (w.num == fix_num && w.wt == WT_I64) {
      *out++ = w.v;
    } else if (w.num == fix_num && w.n) {
      memcpy(out, w.val, w.n); /* little-endian host */
      out += w.n / 8;
    }
  }
  return 0;
}

/* Whether a table's ids are read where they lie: one ids_fixed field,
 * 8-byte aligned in memory. */
static int scan_in_place(const rpc_table_scan *t) {
  return !t->n_var && t->fix_fields == 1 && t->n_fix && t->fix && !((uintptr_t)t->fix & 7u);
}

static int scratch_nomem(rpc_reply *r) {
  r->status = RPC_RESOURCE_EXHAUSTED;
  snprintf(r->msg, sizeof r->msg, "out of memory");
  return -1;
}

/* tables[i]'s view (scanned as *t, its n ids at ids) in x->ti or, with
 * push, x->tg, its gradients where they lie in the request (at any
 * address: read as emb_grad, embedding/optim.h). */
static void table_view(rpc_scratch *x, size_t i, int push, const rpc_table_scan *t, uint64_t *ids,
                       size_t n) {
  if (!push) {
    shardrec__v1__table_ids__init(&x->ti[i]);
    x->ti[i].table_id = t->table_id;
    x->ti[i].n_ids = n;
    x->ti[i].ids = ids;
    x->tip[i] = &x->ti[i];
    return;
  }
  Shardrec__V1__TableGrads *tg = &x->tg[i];
  shardrec__v1__table_grads__init(tg);
  tg->table_id = t->table_id;
  tg->n_ids = n;
  tg->ids = ids;
  tg->grads.len = t->grads_len;
  tg->grads.data = (uint8_t *)(uintptr_t)t->grads; /* read only */
  x->tgp[i] = tg;
}

/* The views of the request's tables[nt] (scanned into x->scan) in x->ti
 * (Lookup) or x->tg (push): ids in place or copied, grads in place. */
static int tables_fill(size_t max_ids, rpc_scratch *x, const wire_rd *d, int push, size_t nt) {
  size_t need = 0;
  for (size_t i = 0; i < nt; i++) {
    const rpc_table_scan *t = &x->scan[i];
    if (t->n_var && t->n_fix) {
      d->r->status = RPC_INVALID_ARGUMENT;
      snprintf(d->r->msg, sizeof d->r->msg,
               "tables[%zu].table_id %u: both ids and ids_fixed are given (send one)", i,
               t->table_id);
      return -1;
    }
    if (!scan_in_place(t)) need += t->n_var + t->n_fix;
  }
  if (need > max_ids) {
    d->r->status = RPC_INVALID_ARGUMENT;
    snprintf(d->r->msg, sizeof d->r->msg, "tables: more than %zu ids in one request", max_ids);
    return -1;
  }
  if (rpc__grow((void **)&x->idbuf, &x->cap_id, need, sizeof *x->idbuf))
    return scratch_nomem(d->r);
  uint64_t *id = x->idbuf;
  for (size_t i = 0; i < nt; i++) {
    const rpc_table_scan *t = &x->scan[i];
    const size_t n = t->n_var + t->n_fix;
    uint64_t *ids = NULL;
    if (n && scan_in_place(t)) {
      ids = (uint64_t *)(uintptr_t)t->fix; /* read only */
      x->in_place += n;
    } else if (n) {
      if (table_copy(d, i, push, t, id)) return -1;
      ids = id;
      id += n;
      x->copied += n;
    }
    table_view(x, i, push, t, ids, n);
  }
  return 0;
}

/* A Lookup (push 0) or Push request in[len] decoded in place into x->lq
 * or x->pq: the views protobuf-c's unpack would give (header NULL when
 * absent), pointing into in and x, valid while both are. 0, or -1 with
 * the refusal in r: INVALID_ARGUMENT naming the field and its offset in
 * the request, RESOURCE_EXHAUSTED out of memory. */
static int req_decode(rpc_scratch *x, int push, int n_tables, size_t max_ids, const uint8_t *in,
                      size_t len, rpc_reply *r) {
  static const char *const lookup_names[6] = {NULL, "header", "tables", "prefetch_only",
                                              "at_step", "step_asked"};
  static const char *const push_names[4] = {NULL, "header", "learning_rate", "tables"};
  const wire_rd d = {push ? "shardrec.v1.PushRequest" : "shardrec.v1.LookupRequest", in, len, r};
  const wire_msg m = {"", -1, push ? push_names : lookup_names, push ? 4 : 6};
  shardrec__v1__request_header__init(&x->h);
  x->fp[0] = x->job[0] = 0;
  x->h.plan_fingerprint = x->fp;
  x->h.job_id = x->job;
  int has_header = 0, prefetch = 0, asked = 0;
  int64_t at_step = 0;
  float lr = 0;
  size_t nt = 0;
  const uint8_t *p = in, *end = in + len;
  while (p < end) {
    wire_f w;
    if (wire_field(&d, &p, end, &m, &w)) return -1;
    if (w.num == 1) {
      if (w.wt != WT_LEN) return wire_type_bad(&d, w.at, "header", w.wt);
      if (header_decode(&d, x, w.val, w.val + w.n)) return -1;
      has_header = 1;
    } else if (w.num == (push ? 3u : 2u)) {
      const wire_msg tm = {"tables", (long)nt, NULL, 0};
      char field[64];
      if (w.wt != WT_LEN) return wire_type_bad(&d, w.at, msg_name(field, &tm), w.wt);
      /* More tables than the plan has: one is given twice (or is not the
       * plan's), refused before the scratch grows with the entries. */
      if (nt == (size_t)n_tables)
        return wire_bad(&d, w.at, msg_name(field, &tm),
                        "more tables than the plan's (a table appears at most once)");
      if (rpc__scratch_tables(x, nt + 1)) return scratch_nomem(r);
      if (table_walk(&d, nt, push, w.val, w.val + w.n, &x->scan[nt])) return -1;
      nt++;
    } else if (!push && w.num == 3) {
      if (w.wt != WT_VARINT) return wire_type_bad(&d, w.at, "prefetch_only", w.wt);
      prefetch = w.v != 0;
    } else if (!push && (w.num == 4 || w.num == 5)) {
      if (w.wt != WT_VARINT) return wire_type_bad(&d, w.at, lookup_names[w.num], w.wt);
      if (w.num == 4) at_step = (int64_t)w.v;
      else asked = w.v != 0;
    } else if (push && w.num == 2) {
      if (w.wt != WT_I32) return wire_type_bad(&d, w.at, "learning_rate", w.wt);
      const uint32_t b = (uint32_t)w.v;
      memcpy(&lr, &b, sizeof lr);
    }
  }
  if (tables_fill(max_ids, x, &d, push, nt)) return -1;
  if (push) {
    shardrec__v1__push_request__init(&x->pq);
    x->pq.header = has_header ? &x->h : NULL;
    x->pq.learning_rate = lr;
    x->pq.n_tables = nt;
    x->pq.tables = x->tgp;
  } else {
    shardrec__v1__lookup_request__init(&x->lq);
    x->lq.header = has_header ? &x->h : NULL;
    x->lq.n_tables = nt;
    x->lq.tables = x->tip;
    x->lq.prefetch_only = prefetch;
    x->lq.at_step = at_step;
    x->lq.step_asked = asked;
  }
  return 0;
}

int rpc__lookup_decode(rpc_scratch *x, int n_tables, size_t max_ids, const uint8_t *in,
                       size_t len, rpc_reply *r) {
  return req_decode(x, 0, n_tables, max_ids, in, len, r);
}

int rpc__push_decode(rpc_scratch *x, int n_tables, size_t max_ids, const uint8_t *in, size_t len,
                     rpc_reply *r) {
  return req_decode(x, 1, n_tables, max_ids, in, len, r);
}

/* The two parts of a PushLookupRequest in[len] (views into in). 0, or -1
 * with the refusal in r: INVALID_ARGUMENT naming the part missing, given
 * twice or not length-delimited, and its offset. Other fields (the
 * padding) are skipped, as any protobuf decoder does. */
int rpc__push_lookup_split(const uint8_t *in, size_t len, const uint8_t **push, size_t *plen,
                           const uint8_t **look, size_t *llen, rpc_reply *r) {
  static const char *const names[3] = {NULL, "push", "lookup"};
  const wire_rd d = {"shardrec.v1.PushLookupRequest", in, len, r};
  const wire_msg m = {"", -1, names, 3};
  const uint8_t *p = in, *end = in + len, *part[3] = {NULL, NULL, NULL};
  size_t n[3] = {0, 0, 0};
  while (p < end) {
    wire_f w;
    if (wire_field(&d, &p, end, &m, &w)) return -1;
    if (w.num != 1 && w.num != 2) continue;
    if (w.wt != WT_LEN) return wire_type_bad(&d, w.at, names[w.num], w.wt);
    if (part[w.num]) return wire_bad(&d, w.at, names[w.num], "given twice");
    part[w.num] = w.val;
    n[w.num] = w.n;
  }
  for (int i = 1; i <= 2; i++)
    if (!part[i]) return wire_bad(&d, end, names[i], "missing");
  *push = part[1], *plen = n[1];
  *look = part[2], *llen = n[2];
  return 0;
}

int rpc__exchange_head(const uint8_t *in, size_t len, rpc_method *m, rpc_reply *r) {
  uint32_t mu = 0, zero = 0;
  if (len >= RPC_EXCHANGE_HEAD) {
    memcpy(&mu, in, 4);
    memcpy(&zero, in + 4, 4);
  }
  *m = len >= RPC_EXCHANGE_HEAD && mu < RPC_N_METHODS ? (rpc_method)mu : RPC_METHOD_UNKNOWN;
  r->status = RPC_INVALID_ARGUMENT;
  if (len < RPC_EXCHANGE_HEAD)
    snprintf(r->msg, sizeof r->msg, "exchange message of %zu bytes: shorter than its %d-byte head",
             len, RPC_EXCHANGE_HEAD);
  else if (zero)
    snprintf(r->msg, sizeof r->msg, "exchange message: the head's second word is %u, not 0", zero);
  else if (*m == RPC_METHOD_UNKNOWN)
    snprintf(r->msg, sizeof r->msg, "exchange message: no method %u", mu);
  else if (*m != RPC_LOOKUP && *m != RPC_PUSH && *m != RPC_PUSH_LOOKUP)
    snprintf(r->msg, sizeof r->msg, "%s does not go on an exchange stream (only Lookup, Push and "
             "PushLookup do)", strrchr(rpc_method_path(*m), '/') + 1);
  else
    r->status = RPC_OK;
  return r->status == RPC_OK ? 0 : -1;
}

void rpc__request_peek(const uint8_t *in, size_t len, int32_t *world, int32_t *parts) {
  rpc_reply ignored; /* a malformed request is refused by its decoder, not here */
  const wire_rd d = {"", in, len, &ignored};
  const wire_msg m = {"", -1, NULL, 0};
  const uint8_t *p = in, *end = in + len;
  *world = *parts = 0;
  while (p < end) {
    wire_f w, h;
    if (wire_field(&d, &p, end, &m, &w)) break;
    if (w.num != 1 || w.wt != WT_LEN) continue;
    for (const uint8_t *q = w.val, *qe = w.val + w.n; q < qe;) {
      if (wire_field(&d, &q, qe, &m, &h)) break;
      if (h.num == 5 && h.wt == WT_VARINT) *world = (int32_t)h.v;
      if (h.num == 8 && h.wt == WT_VARINT) *parts = (int32_t)h.v;
    }
  }
}

/* ---- answers (server) ---- */

void rpc__pack_reply(rpc_reply *r, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  r->out = malloc(n ? n : 1);
  if (!r->out) {
    r->status = RPC_RESOURCE_EXHAUSTED;
    snprintf(r->msg, sizeof r->msg, "out of memory for a %zu-byte answer", n);
    return;
  }
  r->out_len = protobuf_c_message_pack(m, r->out);
}

/* One table's TableRows from its start at: its content's length (*inner),
 * the padding field's size (*pad: 0, or 2..9 bytes: tag, length, zeros)
 * and where its rows begin, a multiple of 4. Of the sizes 2..9 the header's
 * varint changes length at most once, so four consecutive ones share it
 * and one of them aligns the rows. */
static size_t table_layout(uint32_t table_id, int dim, size_t rows_len, size_t at,
                           size_t *inner, size_t *pad) {
  const size_t fixed = 1 + rpc__varint_len(table_id) + 1 + rpc__varint_len((uint64_t)dim) + 1 +
                       rpc__varint_len(rows_len) + rows_len;
  for (size_t p = 0; p <= 9; p += p ? 1 : 2) {
    const size_t in = fixed + p, from = at + 1 + rpc__varint_len(in) + in - rows_len;
    if (from % 4 == 0) {
      *inner = in;
      *pad = p;
      return from;
    }
  }
  assert(!"no padding aligns the rows"); /* unreachable: see above */
  return 0;
}

int rpc__answer_layout(const emb_plan *plan, uint64_t incarnation,
                       const Shardrec__V1__LookupRequest *q, const int *idx, size_t *rows_at,
                       size_t *len) {
  size_t at = 0, inner, pad;
  for (size_t i = 0; i < q->n_tables; i++) {
    const int dim = plan->tables[idx[i]].dim;
    const size_t rl = q->tables[i]->n_ids * (size_t)dim * rpc__row_value_bytes(plan, idx[i]);
    rows_at[i] = table_layout(q->tables[i]->table_id, dim, rl, at, &inner, &pad);
    at = rows_at[i] + rl;
  }
  *len = at + 1 + rpc__varint_len(incarnation);
  return 0;
}

void rpc__answer_write(const emb_plan *plan, uint64_t incarnation,
                       const Shardrec__V1__LookupRequest *q, const int *idx,
                       const size_t *rows_at, uint8_t *out, size_t len) {
  size_t at = 0, inner, pad;
  for (size_t i = 0; i < q->n_tables; i++) {
    const uint32_t id = q->tables[i]->table_id;
    const int dim = plan->tables[idx[i]].dim;
    const size_t rl = q->tables[i]->n_ids * (size_t)dim * rpc__row_value_bytes(plan, idx[i]);
    table_layout(id, dim, rl, at, &inner, &pad);
    uint8_t *p = out + at;
    *p++ = 0x0a; /* LookupResponse.tables */
    p = rpc__varint_put(p, inner);
    *p++ = 0x08; /* TableRows.table_id */
    p = rpc__varint_put(p, id);
    *p++ = 0x10; /* TableRows.dim */
    p = rpc__varint_put(p, (uint64_t)dim);
    if (pad) {
      *p++ = RPC_WIRE_PAD_TAG;
      *p++ = (uint8_t)(pad - 2);
      memset(p, 0, pad - 2);
      p += pad - 2;
    }
    *p++ = 0x1a; /* TableRows.rows */
    p = rpc__varint_put(p, rl);
    at = rows_at[i] + rl;
  }
  uint8_t *p = out + at;
  *p++ = 0x10; /* LookupResponse.incarnation */
  p = rpc__varint_put(p, incarnation);
  assert((size_t)(p - out) == len); /* rpc__answer_layout's length */
  (void)len;
}

float rpc__no_rows16;

float *rpc__answer_rows16(const emb_plan *plan, const Shardrec__V1__LookupRequest *q,
                          const int *idx, uint8_t *out, const size_t *rows_at, float **outp,
                          int direct) {
  size_t n = 0;
  for (size_t i = 0; i < q->n_tables && !direct; i++)
    if (plan->tables[idx[i]].precision != EMB_PREC_FP32)
      n += q->tables[i]->n_ids * (size_t)plan->tables[idx[i]].dim;
  float *f = n ? malloc(n * sizeof *f) : &rpc__no_rows16;
  if (!f) return NULL;
  for (size_t i = 0, at = 0; i < q->n_tables; i++) {
    const int t = idx[i];
    if (direct || plan->tables[t].precision == EMB_PREC_FP32) {
      outp[t] = (float *)(void *)(out + rows_at[i]); /* 4-byte aligned: rpc__answer_layout */
    } else {
      outp[t] = f + at;
      at += q->tables[i]->n_ids * (size_t)plan->tables[t].dim;
    }
  }
  return f;
}

void rpc__answer_encode16(const emb_plan *plan, const Shardrec__V1__LookupRequest *q,
                          const int *idx, uint8_t *out, const size_t *rows_at,
                          float *const *outp) {
  for (size_t i = 0; i < q->n_tables; i++) {
    const int t = idx[i];
    const size_t n = q->tables[i]->n_ids * (size_t)plan->tables[t].dim;
    uint16_t *h = (uint16_t *)(void *)(out + rows_at[i]); /* 4-byte aligned */
    if (plan->tables[t].precision == EMB_PREC_FP16) sr_f16_encode(outp[t], h, n, SR_HALF_AUTO);
    else if (plan->tables[t].precision == EMB_PREC_BF16) sr_bf16_encode(outp[t], h, n);
  }
}

/* ---- requests written by hand (client) ---- */

/* A table is TableIds / TableGrads of table_id (1), a padding field when
 * needed, ids_fixed (3 / 4) and, for a Push, a second padding field and
 * grads (3): the padding (2..17 bytes: tag, length, zeros) puts the ids at
 * a multiple of 8 from the message's start and the gradients at a multiple
 * of 4. The header goes first, packed by protobuf-c. */
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
    /* the grads' tag and length, after the 8-aligned ids */
    const size_t h = (1 + rpc__varint_len(gl)) % 4;
    *p2 = h == 0 ? 0 : h == 1 ? 3 : h == 2 ? 2 : 5;
    tail = *p2 + 1 + rpc__varint_len(gl) + gl;
  }
  const size_t head = 1 + rpc__varint_len(t->table_id);
  if (!t->n) { /* no ids: table_id alone */
    *inner = head;
    return;
  }
  for (size_t p = 0; p <= 17; p += p ? 1 : 2) {
    const size_t in = head + p + 1 + rpc__varint_len(il) + il + tail;
    if ((at + 1 + rpc__varint_len(in) + head + p + 1 + rpc__varint_len(il)) % 8 == 0) {
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
  p = rpc__varint_put(p, inner);
  *p++ = 0x08; /* table_id */
  p = rpc__varint_put(p, t->table_id);
  if (!t->n) return p;
  p = pad_put(p, p1);
  *p++ = push ? 0x22 : 0x1a; /* TableGrads.ids_fixed (4), TableIds.ids_fixed (3) */
  p = rpc__varint_put(p, t->n * 8);
  memcpy(p, t->ids, t->n * 8);
  p += t->n * 8;
  if (!push) return p;
  p = pad_put(p, p2);
  *p++ = 0x1a; /* TableGrads.grads */
  p = rpc__varint_put(p, t->n * row);
  if (!t->perm || rpc__perm_runs(t->perm, t->n)) {
    memcpy(p, t->grads + (t->perm ? t->perm[0] : 0) * dim, t->n * row);
    return p + t->n * row;
  }
  for (size_t j = 0; j < t->n; j++, p += row) memcpy(p, t->grads + t->perm[j] * dim, row);
  return p;
}

static uint8_t *encode(const Shardrec__V1__RequestHeader *h, int push, float lr,
                       const rpc_wire_table *t, size_t n, int prefetch, size_t *len) {
  const size_t hl = shardrec__v1__request_header__get_packed_size(h);
  size_t at = 1 + rpc__varint_len(hl) + hl + (push ? 5 : 0), inner, p1, p2;
  for (size_t i = 0; i < n; i++) {
    table_plan(&t[i], push, at, &inner, &p1, &p2);
    at += 1 + rpc__varint_len(inner) + inner;
  }
  *len = at + (prefetch ? 2 : 0);
  uint8_t *buf = malloc(*len ? *len : 1), *p = buf;
  if (!buf) return NULL;
  *p++ = 0x0a; /* header */
  p = rpc__varint_put(p, hl);
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

/* Padding before a length-delimited field of n bytes written at offset at
 * (0, or 2..9 bytes: pad_put's) so that its bytes start at a multiple of 8.
 * Of the 8 sizes 2..9 one fits every offset. */
static size_t pad_to_8(size_t at, size_t n) {
  const size_t head = 1 + rpc__varint_len(n);
  if ((at + head) % 8 == 0) return 0;
  for (size_t pad = 2;; pad++)
    if ((at + pad + head) % 8 == 0) return pad;
}

uint8_t *rpc__push_lookup_encode(const uint8_t *push, size_t plen, const uint8_t *look,
                                 size_t llen, size_t *len) {
  const size_t p1 = pad_to_8(0, plen), at = p1 + 1 + rpc__varint_len(plen) + plen,
               p2 = pad_to_8(at, llen);
  *len = at + p2 + 1 + rpc__varint_len(llen) + llen;
  uint8_t *buf = malloc(*len), *p = buf;
  if (!buf) return NULL;
  p = pad_put(p, p1);
  *p++ = 0x0a; /* PushLookupRequest.push */
  p = rpc__varint_put(p, plen);
  memcpy(p, push, plen);
  p = pad_put(p + plen, p2);
  *p++ = 0x12; /* PushLookupRequest.lookup */
  p = rpc__varint_put(p, llen);
  memcpy(p, look, llen);
  return buf;
}
