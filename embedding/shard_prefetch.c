/* The shard store's look-ahead op (store.h's prefetch; see shard_impl.h):
 * a later step's ids pinned, a list of slots per step, its misses read by
 * the store threads while the steps before it run; the pins go at that
 * step's push or a later step's lookup or push. */
#include "embedding/shard_impl.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"

/* Drop the pins of every prefetched step below step (upto: at or below). */
void shard__prefetch_release(shstore *s, int64_t step, int upto) {
  int k = 0;
  while (k < s->n_pf && (s->pf[k].step < step || (upto && s->pf[k].step == step))) {
    sh_pinset *p = &s->pf[k];
    for (size_t i = 0; i < p->n; i++) {
      shard__slot_wait(s, p->slot[i]); /* an unpinned slot is never LOADING */
      slot_meta(s, p->slot[i])->pins--;
    }
    s->pf_pinned -= p->n;
    p->n = 0;
    k++;
  }
  if (!k) return;
  for (int i = 0; i < s->n_pf - k; i++) { /* keep the released lists' memory */
    sh_pinset tmp = s->pf[i];
    s->pf[i] = s->pf[i + k];
    s->pf[i + k] = tmp;
  }
  s->n_pf -= k;
}

/* The pin list of step (the last one, or a new one). NULL when out of memory. */
static sh_pinset *pins_of(shstore *s, int64_t step) {
  if (s->n_pf && s->pf[s->n_pf - 1].step == step) return &s->pf[s->n_pf - 1];
  if (s->n_pf == s->cap_pf) {
    int cap = s->cap_pf ? 2 * s->cap_pf : 4;
    sh_pinset *p = realloc(s->pf, (size_t)cap * sizeof *p);
    if (!p) return NULL;
    memset(p + s->cap_pf, 0, (size_t)(cap - s->cap_pf) * sizeof *p);
    s->pf = p;
    s->cap_pf = cap;
  }
  sh_pinset *p = &s->pf[s->n_pf++];
  p->step = step;
  p->n = 0;
  return p;
}

/* Room for one more slot in p. */
static int pins_reserve(sh_pinset *p) {
  if (p->n < p->cap) return 0;
  size_t cap = p->cap ? 2 * p->cap : 256;
  uint32_t *n = realloc(p->slot, cap * sizeof *n);
  if (!n) return SR_ENOMEM;
  p->slot = n;
  p->cap = cap;
  return 0;
}

/* Pin one id for p: a resident row (counted cached), else a new slot read
 * by a job. 1 when the pin limit is reached (nothing pinned). */
static int prefetch_one(shstore *s, sh_pinset *p, uint32_t t, uint64_t id) {
  if (s->pf_pinned + sends_held(s) >= s->pf_limit || pins_reserve(p)) return 1;
  size_t h = probe(s, key_tag(t, id), t, id);
  uint32_t slot;
  if (s->map[h].slot1) {
    slot = s->map[h].slot1 - 1;
    sh_meta *m = slot_meta(s, slot);
    m->pins++;
    sh_use(m);
    if ((m->flags & F_FAILED) && shard__slot_reload(s, slot)) {
      m->pins--;
      return 1;
    }
    s->ctr.prefetch_cached++;
  } else {
    int d = db_of(s, (int)t, id);
    if (d < 0) return 0; /* not hosted here: the lookup says so */
    if ((slot = shard__row_bring(s, t, id, d)) == NONE32) return 1;
    s->ctr.prefetched++;
  }
  p->slot[p->n++] = slot;
  s->pf_pinned++;
  return 0;
}

/* The look-ahead op (store.h): every id of step pinned, misses read by the
 * threads; stops at the pin limit (the rest is read by the step's lookup). */
int shard__prefetch(emb_store *b, int64_t step, const emb_idset *ids) {
  shstore *s = (shstore *)b;
  int rc = shard__check_ids(s, ids, "prefetch");
  if (rc) return rc;
  shard__reap(s);
  if (s->wb_rc) return 0; /* the next lookup or push reports it */
  sh_pinset *p = pins_of(s, step);
  if (!p) return 0; /* out of memory: the lookup reads the rows */
  uint64_t cpu0 = caller_cpu_mark(s);
  int full = 0;
  for (int t = 0; t < s->n_tables && !full; t++)
    for (size_t r = 0; r < ids->counts[t] && !full; r++)
      full = prefetch_one(s, p, (uint32_t)t, ids->ids[t][r]);
  if (full) s->ctr.prefetch_stops++;
  shard__jobs_submit(s);
  s->ctr.caller_ns += caller_cpu_mark(s) - cpu0;
  return 0;
}
