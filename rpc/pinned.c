/* Lookup answers sent from the store's memory (rpc_service_pin_answers,
 * rpc/service.h): the rows pinned in the store, the answer a list of
 * pieces, a head of tags and lengths written here and one piece per row
 * (no padding field: the rows are where the store holds them), the same
 * message protobuf-c packs; the pins and the answer's share of the
 * in-flight budget held until gRPC lets the last piece go. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/status.h"
#include "rpc/service_impl.h"

struct rpc_pinned {
  rpc_service *s;                 /* one of s->refs: s outlives this answer */
  void (*unpin)(emb_pins *);      /* the store's pins_release */
  emb_pins *pins;                 /* owned */
  size_t held, rows, bytes;       /* budget share; rows and row bytes pinned */
  uint8_t *head;                  /* [head_len] tags and lengths */
  size_t head_len, n;
  int named;                      /* the answer names the checkpoint step (rpc__answer_step) */
  rpc_piece piece[];              /* [n] */
};

const rpc_piece *rpc_pinned_pieces(const rpc_pinned *a, size_t *n, const uint8_t **head,
                                   size_t *head_len) {
  *n = a->n;
  *head = a->head;
  *head_len = a->head_len;
  return a->piece;
}

void rpc_pinned_release(rpc_pinned *a) {
  if (!a) return;
  rpc_service *s = a->s;
  a->unpin(a->pins);
  atomic_fetch_sub(&s->pin_rows, a->rows);
  atomic_fetch_sub(&s->pin_bytes, a->bytes);
  rpc_service_release(s, a->held);
  free(a->head);
  free(a);
  rpc__service_unref(s);
}

void rpc_service_pin_answers(rpc_service *s, size_t min_row_bytes) { s->pin_min = min_row_bytes; }

/* Whether q's answer goes pinned: the store offers it and every table's
 * rows are at least s->pin_min bytes. */
static int answer_pins(const rpc_service *s, const Shardrec__V1__LookupRequest *q, const int *idx) {
  if (!s->pin_min || !s->store->ops->lookup_pinned) return 0;
  for (size_t i = 0; i < q->n_tables; i++)
    if ((size_t)s->plan->tables[idx[i]].dim * sizeof(float) < s->pin_min ||
        s->plan->tables[idx[i]].precision != EMB_PREC_FP32) /* 16-bit rows are converted */
      return 0;
  return 1;
}

static void piece_head(rpc_pinned *a, uint8_t *from, uint8_t *to) {
  a->piece[a->n++] = (rpc_piece){from, (size_t)(to - from), 1};
}

/* a's pieces over the pinned rows (rows[t][r]): per table a TableRows of
 * table_id (1), dim (2) and rows (3), then incarnation (2), no padding
 * (the store's floats are where they are); the same message protobuf-c
 * packs. */
static void pinned_layout(rpc_pinned *a, const Shardrec__V1__LookupRequest *q, const int *idx,
                          const float *const *const *rows) {
  uint8_t *p = a->head;
  for (size_t i = 0; i < q->n_tables; i++) {
    const uint32_t id = q->tables[i]->table_id;
    const int dim = a->s->plan->tables[idx[i]].dim;
    const size_t rb = (size_t)dim * sizeof(float), rl = q->tables[i]->n_ids * rb;
    const size_t inner = 1 + rpc__varint_len(id) + 1 + rpc__varint_len((uint64_t)dim) + 1 +
                         rpc__varint_len(rl) + rl;
    uint8_t *from = p;
    *p++ = 0x0a; /* LookupResponse.tables */
    p = rpc__varint_put(p, inner);
    *p++ = 0x08; /* TableRows.table_id */
    p = rpc__varint_put(p, id);
    *p++ = 0x10; /* TableRows.dim */
    p = rpc__varint_put(p, (uint64_t)dim);
    *p++ = 0x1a; /* TableRows.rows */
    p = rpc__varint_put(p, rl);
    piece_head(a, from, p);
    for (size_t r = 0; r < q->tables[i]->n_ids; r++)
      a->piece[a->n++] = (rpc_piece){(const uint8_t *)rows[idx[i]][r], rb, 0};
    a->rows += q->tables[i]->n_ids;
    a->bytes += rl;
  }
  uint8_t *from = p;
  *p++ = 0x10; /* LookupResponse.incarnation */
  p = rpc__varint_put(p, a->s->incarnation);
  p = rpc__answer_step(p, a->named, a->s->ckpt_step); /* pinned only without versions */
  piece_head(a, from, p);
  a->head_len = (size_t)(p - a->head);
}

int rpc__answer_pinned(rpc_service *s, const Shardrec__V1__LookupRequest *q, const int *idx,
                       const emb_idset *set, rpc_reply *r) {
  if (!answer_pins(s, q, idx)) return 0;
  size_t total = 0;
  for (size_t i = 0; i < q->n_tables; i++) total += q->tables[i]->n_ids;
  const int nt = s->plan->n_tables;
  const float **ptr = malloc((total ? total : 1) * sizeof *ptr);
  const float ***rows = calloc((size_t)nt, sizeof *rows);
  rpc_pinned *a = malloc(sizeof *a + (total + q->n_tables + 1) * sizeof(rpc_piece));
  uint8_t *head = malloc(40 * q->n_tables + 16 + RPC_STEP_BYTES);
  if (!ptr || !rows || !a || !head) {
    free(ptr), free(rows), free(a), free(head);
    r->status = RPC_RESOURCE_EXHAUSTED;
    snprintf(r->msg, sizeof r->msg, "out of memory for the answer");
    return 1;
  }
  for (size_t i = 0, at = 0; i < q->n_tables; at += q->tables[i]->n_ids, i++) rows[idx[i]] = ptr + at;
  pthread_mutex_lock(&s->mu);
  if (q->header->step > s->hi_step) s->hi_step = q->header->step;
  emb_pins *pins = NULL;
  const int named = s->from_ckpt; /* the rows pinned now are its checkpoint's */
  int rc = q->step_asked ? rpc__check_one_step(s, q->at_step, r)
           : s->store->ops->lookup_pinned(s->store, q->header->step, set,
                                          (const float **const *)rows, &pins);
  if (rc && rc != SR_ESTATE && !r->status)
    snprintf(r->msg, sizeof r->msg, "lookup: %s", emb_store_errmsg(s->store));
  pthread_mutex_unlock(&s->mu);
  if (!rc) {
    *a = (rpc_pinned){.s = s, .unpin = s->store->ops->pins_release, .pins = pins, .head = head,
                      .named = named};
    pinned_layout(a, q, idx, (const float *const *const *)rows);
    atomic_fetch_add(&s->refs, 1); /* for rpc_pinned_release */
    atomic_fetch_add(&s->pin_rows, a->rows);
    atomic_fetch_add(&s->pin_bytes, a->bytes);
    const size_t back = 2 * rpc__answer_bound(s, q->tables, q->n_tables, idx);
    rpc_service_release(s, back < r->held ? back : 0);
    r->held -= back < r->held ? back : 0;
    a->held = r->held; /* given back by rpc_pinned_release */
    r->held = 0;
    r->pinned = a;
    r->out_len = a->head_len + a->bytes;
  } else {
    free(a);
    free(head);
  }
  free(ptr);
  free(rows);
  if (rc == SR_ESTATE) return 0;
  if (rc && !r->status) r->status = RPC_INTERNAL;
  return 1;
}
