/* The shard store's cache (see shard_impl.h): slots of one slab, the map
 * from (table, row id) to a slot, GCLOCK eviction, and chunks of a batch's
 * rows made resident and pinned (hits from the map, misses given slots and
 * read by the store threads, shard_io.c) for a lookup, push or
 * lookup_pinned to act on. */
#include "embedding/shard_impl.h"

#include "common/status.h"

#define SH_PREFETCH 48 /* map entries prefetched ahead while a chunk is resolved */

/* A free slot: a never-used one, else GCLOCK's victim (written back if
 * dirty): the hand clears a row's F_REF, then takes one of its uses per
 * pass, and evicts a row with neither. */
uint32_t shard__slot_alloc(shstore *s) {
  if (s->used < s->cap) return s->used++;
  for (;;) {
    uint32_t i = s->hand;
    s->hand = s->hand + 1 == s->cap ? 0 : s->hand + 1;
    sh_meta *m = slot_meta(s, i);
    if (m->pins || (m->flags & F_LOADING) || slot_sent(s, i)) continue;
    if (m->flags & F_DETACHED) return i; /* a row's old copy, sent: free */
    if (m->flags & F_REF) {
      m->flags &= (uint16_t)~F_REF;
      continue;
    }
    if (m->flags & F_USES) {
      m->flags = (uint16_t)(m->flags - F_USES_ONE);
      continue;
    }
    if (m->flags & F_DIRTY) shard__writeback(s, i);
    entries_delete(s->map, s->mask, probe(s, key_tag(m->table, m->key), m->table, m->key));
    s->ctr.evictions++;
    return i;
  }
}

/* Row id of table t (database d) into the map, pinned once: its slot when
 * there (a repeated id), else a new slot filled from the pending index or
 * left LOADING for a read job. NONE32 when out of memory. */
uint32_t shard__row_bring(shstore *s, uint32_t t, uint64_t id, int d) {
  uint32_t tag = key_tag(t, id);
  size_t h = probe(s, tag, t, id);
  if (!s->map[h].slot1) {
    uint32_t slot = shard__slot_alloc(s);
    h = probe(s, tag, t, id); /* eviction may have shifted entries */
    s->map[h].slot1 = slot + 1;
    s->map[h].tag = tag;
    sh_meta *m = slot_meta(s, slot);
    m->key = id;
    m->table = (uint16_t)t;
    m->flags = F_REF;
    m->pins = 0;
    size_t ph = pidx_probe(s, tag, t, id);
    if (s->pidx[ph].slot1) { /* written back, maybe not in RocksDB yet: this is its value */
      char e2[256];
      float buf[2 * EMB_MAX_DIM + 1];
      kv_row_decode_w(rec_at(s, s->pidx[ph].slot1 - 1) + SH_REC_HEAD,
                      kv_row_size_w(s->dim[t], s->slen[t], sh_wprec(s, t)), s->dim[t], s->slen[t],
                      sh_wprec(s, t), buf, e2, sizeof e2); /* our own encoding: cannot fail */
      slot_put(s, slot, t, buf);
      s->ctr.pending_hits++;
    } else {
      m->flags |= F_LOADING;
      if (shard__job_add(s, d, t, id, slot)) {
        m->flags &= (uint16_t)~F_LOADING;
        m->flags |= F_FAILED;
        return NONE32;
      }
    }
  }
  sh_meta *m = slot_meta(s, s->map[h].slot1 - 1);
  m->pins++;
  m->flags |= F_REF;
  return s->map[h].slot1 - 1;
}

/* A slot whose read failed is read again (it is pinned by the caller). */
int shard__slot_reload(shstore *s, uint32_t slot) {
  sh_meta *m = slot_meta(s, slot);
  m->flags = (uint16_t)((m->flags & ~F_FAILED) | F_LOADING);
  if (shard__job_add(s, db_of(s, m->table, m->key), m->table, m->key, slot)) {
    m->flags = (uint16_t)((m->flags & ~F_LOADING) | F_FAILED);
    return SR_ENOMEM;
  }
  return 0;
}

void shard__slot_wait(shstore *s, uint32_t slot) {
  if (!(slot_meta(s, slot)->flags & F_LOADING)) return;
  s->ctr.load_waits++;
  while (slot_meta(s, slot)->flags & F_LOADING) shard__wait_some(s, 0);
}

/* The chunk's pins dropped (every item resolved so far). */
static void chunk_unpin(shstore *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s->it_slot[i] != NONE32) slot_meta(s, s->it_slot[i])->pins--;
}

/* Make the chunk's n items resident and pinned: it_slot[i] gets each slot
 * (NONE32 for items not reached on failure; chunk_unpin undoes it either
 * way). Misses are read by jobs per (database, table), on the threads and
 * this one, and waited for. */
static int chunk_resolve(shstore *s, size_t n, uint64_t *hits) {
  const emb_plan *plan = s->base.plan;
  for (size_t i = 0; i < n; i++) s->it_pos[i] = key_tag(s->it_t[i], s->it_id[i]);
  size_t nm = 0;
  for (size_t i = 0; i < n; i++) {
    if (i + SH_PREFETCH < n) __builtin_prefetch(&s->map[s->it_pos[i + SH_PREFETCH] & s->mask], 0, 3);
    size_t h = probe(s, (uint32_t)s->it_pos[i], s->it_t[i], s->it_id[i]);
    uint32_t s1 = s->map[h].slot1;
    s->it_slot[i] = s1 ? s1 - 1 : NONE32;
    if (s1) {
      sh_meta *m = slot_meta(s, s1 - 1);
      m->pins++;
      m->flags |= F_REF;
      (*hits)++;
    } else {
      s->miss[nm++] = i;
    }
  }
  for (size_t j = 0; j < nm; j++) {
    size_t i = s->miss[j];
    if ((s->mcf[j] = db_of(s, (int)s->it_t[i], s->it_id[i])) < 0) {
      sr_fmt(s->err, sizeof s->err, "table %d row %llu lives on shard %d, not hosted here",
             (int)s->it_t[i], (unsigned long long)s->it_id[i],
             emb_plan_shard_of(plan, (int)s->it_t[i], s->it_id[i]));
      return SR_EINVAL;
    }
  }
  int rc = 0;
  for (size_t j = 0; j < nm && !rc; j++) {
    size_t i = s->miss[j];
    if ((s->it_slot[i] = shard__row_bring(s, s->it_t[i], s->it_id[i], s->mcf[j])) == NONE32) rc = SR_ENOMEM;
  }
  for (size_t i = 0; i < n && !rc; i++)
    if (s->it_slot[i] != NONE32 && (slot_meta(s, s->it_slot[i])->flags & F_FAILED))
      rc = shard__slot_reload(s, s->it_slot[i]);
  shard__jobs_submit(s);
  for (size_t i = 0; i < n; i++)
    if (s->it_slot[i] != NONE32) shard__slot_wait(s, s->it_slot[i]);
  if (rc) {
    sr_fmt(s->err, sizeof s->err, "shard store: out of memory");
    return rc;
  }
  for (size_t i = 0; i < n; i++)
    if (slot_meta(s, s->it_slot[i])->flags & F_FAILED) {
      memcpy(s->err, s->rd_err, sizeof s->err);
      return s->rd_rc ? s->rd_rc : SR_EIO;
    }
  return 0;
}

/* Walk every (table, r) of ids in chunks; per chunk resolve then act. */
int shard__chunk_run(shstore *s, size_t n, const size_t *it_r, chunk_fn fn, void *ctx,
                     uint64_t *hits) {
  int rc = chunk_resolve(s, n, hits);
  if (!rc) fn(s, n, it_r, ctx);
  chunk_unpin(s, n);
  return rc;
}

int shard__for_chunks(shstore *s, const emb_idset *ids, size_t *it_r, chunk_fn fn, void *ctx,
                      uint64_t *hits) {
  size_t n = 0;
  for (int t = 0; t < s->n_tables; t++)
    for (size_t r = 0; r < ids->counts[t]; r++) {
      s->it_t[n] = (uint32_t)t;
      s->it_id[n] = ids->ids[t][r];
      it_r[n] = r;
      if (++n == s->chunk) {
        int rc = shard__chunk_run(s, n, it_r, fn, ctx, hits);
        if (rc) return rc;
        n = 0;
      }
    }
  return n ? shard__chunk_run(s, n, it_r, fn, ctx, hits) : 0;
}
