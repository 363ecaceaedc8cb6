/* Answers sent from the shard store's slots (store.h's lookup_pinned and
 * pins_release; see shard_impl.h's "Send pins"): the rows resolved as a
 * lookup's misses are, each slot send-pinned once per row; a push to a row
 * being sent moves it to a fresh slot first (copy on write). */
#include "embedding/shard_impl.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

/* One answer's send pins (store.h's emb_pins). */
struct emb_pins {
  sh_sends *sends;
  size_t n;
  uint32_t slot[];       /* [n] a slot once per row sent */
};

void shard__sends_unref(sh_sends *d) {
  if (atomic_fetch_sub_explicit(&d->refs, 1, memory_order_acq_rel) != 1) return;
  free(d->slab);
  free(d);
}

/* The store's send counts, made at the first lookup_pinned. */
static sh_sends *sends_get(shstore *s) {
  if (!s->sends && (s->sends = calloc(1, sizeof *s->sends + s->cap * sizeof(atomic_uint)))) {
    atomic_init(&s->sends->refs, 1);
    atomic_init(&s->sends->held, 0);
    for (uint32_t i = 0; i < s->cap; i++) atomic_init(&s->sends->cnt[i], 0);
  }
  return s->sends;
}

void shard__pins_release(emb_pins *p) {
  if (!p) return;
  sh_sends *d = p->sends;
  for (size_t i = 0; i < p->n; i++)
    if (atomic_fetch_sub_explicit(&d->cnt[p->slot[i]], 1, memory_order_acq_rel) == 1)
      atomic_fetch_sub_explicit(&d->held, 1, memory_order_relaxed);
  free(p);
  shard__sends_unref(d);
}

typedef struct {
  const float **const *rows;
  emb_pins *p;
} pinned_ctx;

/* The chunk's rows pointed at and send-pinned (the chunk pins them now). */
static void pinned_act(shstore *s, size_t n, const size_t *it_r, void *vctx) {
  pinned_ctx *c = vctx;
  sh_sends *d = s->sends;
  for (size_t i = 0; i < n; i++) {
    uint32_t slot = s->it_slot[i];
    c->rows[s->it_t[i]][it_r[i]] = slot_row(s, slot);
    c->p->slot[c->p->n++] = slot;
    if (atomic_fetch_add_explicit(&d->cnt[slot], 1, memory_order_relaxed) == 0)
      atomic_fetch_add_explicit(&d->held, 1, memory_order_relaxed);
  }
}

/* Rows of ids a lookup would count as hits (resident, loaded, not failed),
 * each given a use as the lookup's hit path gives it (sh_lookup_use). */
static uint64_t use_hits(shstore *s, const emb_idset *ids) {
  uint64_t hits = 0;
  for (int t = 0; t < s->n_tables; t++)
    for (size_t r = 0; r < ids->counts[t]; r++) {
      uint64_t id = ids->ids[t][r];
      uint32_t s1 = s->map[probe(s, key_tag((uint32_t)t, id), (uint32_t)t, id)].slot1;
      sh_meta *m = s1 ? slot_meta(s, s1 - 1) : NULL;
      if (m && !(m->flags & (F_LOADING | F_FAILED))) {
        sh_lookup_use(m);
        hits++;
      }
    }
  return hits;
}

/* The lookup_pinned op (store.h): the rows resolved chunk by chunk as a
 * lookup's misses are, each slot send-pinned once per row. */
int shard__lookup_pinned(emb_store *b, int64_t step, const emb_idset *ids,
                            const float **const *rows, emb_pins **pins) {
  shstore *s = (shstore *)b;
  *pins = NULL;
  int rc = shard__check_ids(s, ids, "lookup");
  if (!rc) rc = shard__call_begin(s, step);
  if (rc) return rc;
  size_t total = 0;
  for (int t = 0; t < s->n_tables; t++) total += ids->counts[t];
  for (int t = 0; t < s->n_tables; t++)
    if (ids->counts[t] && sh_wprec(s, (uint32_t)t) != KV_W_FP32) {
      /* Its slots hold 16-bit weights, not the floats a pinned answer is */
      sr_fmt(s->err, sizeof s->err, "lookup: table %d keeps 16-bit weights: gathered, not pinned", t);
      return SR_ESTATE;
    }
  size_t held = sends_held(s);
  if (held + s->pf_pinned + total > s->pf_limit) {
    sr_fmt(s->err, sizeof s->err,
           "lookup: %zu rows cannot be pinned for sending: %zu of the cache's %u slots are "
           "pinned by answers being sent and %zu by look-aheads",
           total, held, s->cap, s->pf_pinned);
    return SR_ESTATE;
  }
  emb_pins *p = sends_get(s) ? malloc(sizeof *p + (total ? total : 1) * sizeof(uint32_t)) : NULL;
  if (!p) {
    sr_fmt(s->err, sizeof s->err, "shard store: out of memory");
    return SR_ENOMEM;
  }
  p->sends = s->sends;
  p->n = 0;
  atomic_fetch_add_explicit(&s->sends->refs, 1, memory_order_relaxed);
  uint64_t hits = use_hits(s, ids), dummy = 0;
  pinned_ctx c = {rows, p};
  rc = shard__for_chunks(s, ids, s->mitem + s->chunk, pinned_act, &c, &dummy);
  if (!rc) rc = shard__wb_failed(s);
  if (rc) {
    shard__pins_release(p);
    return rc;
  }
  s->st.lookups += total;
  s->st.hits += hits;
  *pins = p;
  return 0;
}


/* Item i's row where a push may write it: a slot an answer is being sent
 * from (or a copy of it left for one) is first replaced by the row's copy
 * in a fresh slot (see shard_impl.h), or by the copy an earlier item of the
 * chunk made. The chunk's pin moves with it. */
void shard__slot_unshare(shstore *s, size_t i) {
  uint32_t x = s->it_slot[i], t = s->it_t[i];
  if (!slot_sent(s, x) && !(slot_meta(s, x)->flags & F_DETACHED)) return;
  uint64_t id = s->it_id[i];
  uint32_t tag = key_tag(t, id), y = s->map[probe(s, tag, t, id)].slot1 - 1;
  if (y == x) {
    y = shard__slot_alloc(s); /* never x: pinned */
    memcpy(slot_meta(s, y), slot_meta(s, x), s->slot_bytes);
    slot_meta(s, y)->pins = 0;
    s->map[probe(s, tag, t, id)].slot1 = y + 1; /* after the eviction's shifts */
    slot_meta(s, x)->flags = F_DETACHED;
    s->ctr.send_copies++;
  }
  slot_meta(s, x)->pins--;
  slot_meta(s, y)->pins++;
  s->it_slot[i] = y;
}
