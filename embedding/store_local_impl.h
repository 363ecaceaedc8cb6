/* The in-process store's private parts (embedding/store_local.c): its
 * tables' index and slab, the store's state, and the operations on one
 * table (lt_*) that the store and its checkpoint code
 * (store_local_ckpt.c) share. */
#ifndef SHARDREC_EMBEDDING_STORE_LOCAL_IMPL_H
#define SHARDREC_EMBEDDING_STORE_LOCAL_IMPL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "common/rng.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/store.h"

#define LT_EMPTY 0u /* entry.slot1 of a free entry; slots are stored plus one */
#define LT_MAX_ROWS 0x7ffffffeu /* slot + 1 fits 31 bits */
#define LT_DIRECT_MAX (1ULL << 28) /* 1 GiB of index at most, touched lazily */
#define LT_PREFETCH 32 /* ids ahead: enough misses in flight to hide DRAM latency */
#define LT_PASS 256    /* ids a pass: its index entries and rows stay in cache until used */

typedef struct {
  uint64_t key;
  uint32_t slot1; /* slot + 1; LT_EMPTY when free (so calloc'd pages are an empty map) */
  uint32_t pad;
} lt_entry;

typedef struct {
  int dim, slen, stride; /* stride = dim + slen floats of a row as the store's callers see it */
  int prec;              /* emb_precision of the weights held */
  size_t rb;             /* bytes per slot: 4 stride (fp32), or the state floats then dim
                            16-bit weights, rounded up to 4 (fp16, bf16) */
  uint64_t rows;         /* EMB_ROWS_UNBOUNDED or the bound */
  lt_entry *map;         /* [mask+1], zeroed lazily by calloc; NULL when direct */
  uint32_t *direct;      /* bounded tables up to LT_DIRECT_MAX rows: [rows] slot + 1
                            indexed by row id (one access, no probing); else NULL */
  size_t mask;
  size_t n;              /* rows stored = slots used */
  unsigned char *slab;   /* [slab_cap][rb] */
  size_t slab_cap;
  uint8_t *chg;          /* [slab_cap] 1: the slot's row changed since the last checkpoint */
  uint64_t *chg_ids;     /* [chg_cap] the row ids of the flagged slots */
  size_t chg_n, chg_cap;
  int track;             /* 1 once checkpointed or restored: before, every row held is
                            changed, and the set costs nothing (a job that never saves) */
  uint64_t *keys;        /* [slab_cap] each slot's row id, kept from the first removal on
                            (a removal moves the last slot into the freed one); NULL before */
  uint64_t *rm_ids;      /* [rm_cap] ids removed since the last checkpoint (tracked tables
                            only; repeats and ids pushed again are dropped when written) */
  size_t rm_n, rm_cap;
} ltab;

typedef struct {
  emb_store base;
  int n;
  ltab *t; /* [n] */
  /* Scratch of one pass (LT_PASS ids of a table). */
  uint32_t slot[LT_PASS]; /* slot + 1 of the pass's id r (0: not stored) */
  float *w[LT_PASS];      /* where a push updates the pass's row r (fp32 tables) */
  float *vals;     /* [vals_cap] a push's rows: old values of stored ones (the undo), new
                      ones' values until they are stored */
  size_t vals_cap;
  uint32_t *slots; /* [slots_cap] their slots + 1 (0: new) */
  size_t slots_cap;
  float row[2 * EMB_MAX_DIM + 1]; /* one row as floats (16-bit tables' passes) */
  char model_fp[EMB_FP_HEX];
  emb_store_stats st;
  int last_lookup_rc;
  char err[512];
} lstore;

/* ---- map ---- */

static inline void lt_free(ltab *t) {
  free(t->direct);
  t->direct = NULL;
  free(t->map);
  free(t->slab);
  free(t->chg);
  free(t->chg_ids);
  free(t->keys);
  free(t->rm_ids);
  t->keys = NULL;
  t->rm_ids = NULL;
  t->rm_n = t->rm_cap = 0;
  t->map = NULL;
  t->slab = NULL;
  t->chg = NULL;
  t->chg_ids = NULL;
  t->chg_n = t->chg_cap = 0;
}

/* A position is an index into map[], or the row id itself for a direct table. */
static inline size_t lt_home(const ltab *t, uint64_t key) {
  return t->direct ? (size_t)key : (size_t)sr_mix64(key) & t->mask;
}

static inline uint32_t lt_slot_at(const ltab *t, size_t h) {
  return t->direct ? t->direct[h] : t->map[h].slot1;
}

/* Position of key, or of the free entry where it would go, probing from h. */
static inline size_t lt_probe(const ltab *t, size_t h, uint64_t key) {
  if (t->direct) return h;
  for (;;) {
    const lt_entry *e = &t->map[h];
    if (e->slot1 == LT_EMPTY || e->key == key) return h;
    h = (h + 1) & t->mask;
  }
}

static inline size_t lt_find(const ltab *t, uint64_t key) { return lt_probe(t, lt_home(t, key), key); }

static inline unsigned char *lt_at(const ltab *t, uint32_t slot1) {
  return t->slab + (size_t)(slot1 - 1) * t->rb;
}

/* The row of an fp32 table, in place. */
static inline float *lt_row(const ltab *t, uint32_t slot1) {
  return (float *)(void *)lt_at(t, slot1);
}

/* A 16-bit slot's weights (after its state floats; 4-byte aligned). */
static inline uint16_t *lt_w16(const ltab *t, uint32_t slot1) {
  return (uint16_t *)(void *)(lt_at(t, slot1) + 4 * (size_t)t->slen);
}

/* Row slot1 as floats into dst: the dim weights, and the state after them
 * when full. */
static inline void lt_get(const ltab *t, uint32_t slot1, float *dst, int full) {
  if (t->prec == EMB_PREC_FP32) {
    emb_row_copy(dst, lt_row(t, slot1), (size_t)(full ? t->stride : t->dim));
    return;
  }
  if (t->prec == EMB_PREC_FP16) sr_f16_decode(lt_w16(t, slot1), dst, (size_t)t->dim, SR_HALF_AUTO);
  else sr_bf16_decode(lt_w16(t, slot1), dst, (size_t)t->dim);
  if (full) memcpy(dst + t->dim, lt_at(t, slot1), 4 * (size_t)t->slen);
}

/* src[stride] (weights of the table's format, then state) into slot1. */
static inline void lt_put(ltab *t, uint32_t slot1, const float *src) {
  if (t->prec == EMB_PREC_FP32) {
    memcpy(lt_row(t, slot1), src, (size_t)t->stride * sizeof *src);
    return;
  }
  if (t->prec == EMB_PREC_FP16) sr_f16_encode(src, lt_w16(t, slot1), (size_t)t->dim, SR_HALF_AUTO);
  else sr_bf16_encode(src, lt_w16(t, slot1), (size_t)t->dim);
  memcpy(lt_at(t, slot1), src + t->dim, 4 * (size_t)t->slen);
}

static inline int lt_init(ltab *t, int dim, int slen, int prec, uint64_t rows, size_t cap_rows) {
  memset(t, 0, sizeof *t);
  t->dim = dim;
  t->slen = slen;
  t->stride = dim + slen;
  t->prec = prec;
  t->rb = prec == EMB_PREC_FP32 ? 4 * (size_t)t->stride : (4 * (size_t)slen + 2 * (size_t)dim + 3) & ~(size_t)3;
  t->rows = rows;
  size_t cap = 64;
  while (cap < 2 * cap_rows) cap <<= 1;
  if (rows != EMB_ROWS_UNBOUNDED && rows <= LT_DIRECT_MAX) {
    t->direct = calloc((size_t)rows, sizeof *t->direct);
    if (t->direct) sr_advise_huge(t->direct, (size_t)rows * sizeof *t->direct);
  } else {
    t->map = calloc(cap, sizeof *t->map);
    if (t->map) sr_advise_huge(t->map, cap * sizeof *t->map);
  }
  t->slab_cap = cap_rows > 16 ? cap_rows : 16;
  t->slab = malloc(t->slab_cap * t->rb);
  t->chg = calloc(t->slab_cap, 1);
  if ((!t->map && !t->direct) || !t->slab || !t->chg) {
    lt_free(t);
    return SR_ENOMEM;
  }
  sr_advise_huge(t->slab, t->slab_cap * t->rb);
  t->mask = cap - 1;
  return 0;
}

/* Room for extra more rows (index and slab) without further allocation. */
static inline int lt_reserve(ltab *t, size_t extra) {
  size_t need = t->n + extra;
  if (need > LT_MAX_ROWS) return SR_ERANGE;
  if (!t->direct && 2 * need > t->mask + 1) {
    size_t cap = (t->mask + 1) * 2;
    while (cap < 2 * need) cap <<= 1;
    lt_entry *m = calloc(cap, sizeof *m);
    if (!m) return SR_ENOMEM;
    sr_advise_huge(m, cap * sizeof *m);
    for (size_t i = 0; i <= t->mask; i++) {
      if (t->map[i].slot1 == LT_EMPTY) continue;
      size_t h = (size_t)sr_mix64(t->map[i].key) & (cap - 1);
      while (m[h].slot1 != LT_EMPTY) h = (h + 1) & (cap - 1);
      m[h] = t->map[i];
    }
    free(t->map);
    t->map = m;
    t->mask = cap - 1;
  }
  if (need > t->slab_cap) {
    size_t cap = t->slab_cap * 2;
    while (cap < need) cap *= 2;
    uint8_t *nc = realloc(t->chg, cap);
    if (!nc) return SR_ENOMEM;
    memset(nc + t->slab_cap, 0, cap - t->slab_cap);
    t->chg = nc;
    if (t->keys) {
      uint64_t *nk = realloc(t->keys, cap * sizeof *nk);
      if (!nk) return SR_ENOMEM;
      t->keys = nk;
    }
    unsigned char *nb = realloc(t->slab, cap * t->rb);
    if (!nb) return SR_ENOMEM;
    t->slab = nb;
    t->slab_cap = cap;
    sr_advise_huge(nb, cap * t->rb);
  }
  return 0;
}

/* Room in the id list *list (capacity *cap) for need ids, grown by doubling. */
static inline int lt_ids_room(uint64_t **list, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  uint64_t *ni = realloc(*list, c * sizeof *ni);
  if (!ni) return SR_ENOMEM;
  *list = ni;
  *cap = c;
  return 0;
}

/* Room in the change set for n more rows: every row of a push may join
 * it, and recording a change must not fail once the rows are updated. */
static inline int lt_reserve_changes(ltab *t, size_t n) {
  return t->track ? lt_ids_room(&t->chg_ids, &t->chg_cap, t->chg_n + n) : 0;
}

/* Record that the row key in slot s1 changed (room reserved by
 * lt_reserve_changes). */
static inline void lt_mark(ltab *t, uint32_t s1, uint64_t key) {
  if (!t->track || t->chg[s1 - 1]) return;
  t->chg[s1 - 1] = 1;
  t->chg_ids[t->chg_n++] = key;
}

/* Empty the change set (the listed slots' flags, then the list) and keep
 * it from now on. */
static inline void lt_clear_changes(ltab *t) {
  for (size_t i = 0; i < t->chg_n; i++) {
    uint32_t s1 = lt_slot_at(t, lt_find(t, t->chg_ids[i]));
    if (s1) t->chg[s1 - 1] = 0; /* 0: removed since it was listed */
  }
  t->chg_n = 0;
  t->rm_n = 0;
  t->track = 1;
}

/* Insert key (absent, room reserved) at map position h; returns slot + 1. */
static inline uint32_t lt_insert_at(ltab *t, size_t h, uint64_t key) {
  uint32_t s1 = (uint32_t)++t->n;
  if (t->keys) t->keys[s1 - 1] = key;
  if (t->direct) {
    t->direct[h] = s1;
  } else {
    t->map[h].key = key;
    t->map[h].slot1 = s1;
  }
  return s1;
}

/* Each slot's row id (t->keys), made once, at the first removal. */
static inline int lt_keys(ltab *t) {
  if (t->keys) return 0;
  if (!(t->keys = malloc(t->slab_cap * sizeof *t->keys))) return SR_ENOMEM;
  if (t->direct) {
    for (uint64_t i = 0; i < t->rows; i++)
      if (t->direct[i] != LT_EMPTY) t->keys[t->direct[i] - 1] = i;
  } else {
    for (size_t i = 0; i <= t->mask; i++)
      if (t->map[i].slot1 != LT_EMPTY) t->keys[t->map[i].slot1 - 1] = t->map[i].key;
  }
  return 0;
}

/* Remove key when stored (t->keys made): the last slot moves into its slot
 * and the map entry closes up (linear probing: the entries after it that
 * may not stay past the gap shift back). */
static inline void lt_remove(ltab *t, uint64_t key) {
  size_t h = lt_find(t, key);
  uint32_t s1 = lt_slot_at(t, h);
  if (!s1) return;
  if (t->direct) {
    t->direct[h] = LT_EMPTY;
  } else {
    size_t gap = h, j = h;
    for (;;) {
      j = (j + 1) & t->mask;
      if (t->map[j].slot1 == LT_EMPTY) break;
      size_t home = (size_t)sr_mix64(t->map[j].key) & t->mask;
      /* j's entry may fill the gap when its home is not in (gap, j]. */
      if (((j - home) & t->mask) >= ((j - gap) & t->mask)) {
        t->map[gap] = t->map[j];
        gap = j;
      }
    }
    t->map[gap].slot1 = LT_EMPTY;
    t->map[gap].key = 0;
  }
  uint32_t last = (uint32_t)t->n--;
  if (s1 != last) {
    uint64_t moved = t->keys[last - 1];
    memcpy(lt_at(t, s1), lt_at(t, last), t->rb);
    t->keys[s1 - 1] = moved;
    t->chg[s1 - 1] = t->chg[last - 1];
    size_t hm = lt_find(t, moved);
    if (t->direct) t->direct[hm] = s1;
    else t->map[hm].slot1 = s1;
  }
  t->chg[last - 1] = 0;
}

static inline int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Stored keys in ascending order; malloc'd (NULL with n = 0 when empty). */
static inline int lt_sorted_keys(const ltab *t, uint64_t **out) {
  *out = NULL;
  if (!t->n) return 0;
  uint64_t *k = malloc(t->n * sizeof *k);
  if (!k) return SR_ENOMEM;
  size_t m = 0;
  if (t->direct) { /* already in order */
    for (uint64_t i = 0; i < t->rows; i++)
      if (t->direct[i] != LT_EMPTY) k[m++] = i;
    *out = k;
    return 0;
  }
  for (size_t i = 0; i <= t->mask; i++)
    if (t->map[i].slot1 != LT_EMPTY) k[m++] = t->map[i].key;
  qsort(k, m, sizeof *k, cmp_u64);
  *out = k;
  return 0;
}

/* The checkpoint operations (store_local_ckpt.c). */
int local__checkpoint(emb_store *b, const char *path);
int local__checkpoint_delta(emb_store *b, const char *path);
int local__restore(emb_store *b, const char *path, const char *from_model_fp);
int local__restore_delta(emb_store *b, const char *path);

#endif
