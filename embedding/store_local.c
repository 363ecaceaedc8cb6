/* The in-process embedding store: every row of every table in memory.
 *
 * Per table, an index from row_id to a slot, and a slab of slots holding
 * the row's value (dim floats) then its optimizer state; an fp16 or bf16
 * table's slot holds the state floats then the dim 16-bit weights (2 bytes
 * a weight, the slot rounded up to 4 bytes), converted to floats as a
 * lookup copies them out and back as a push stores them. The index of an
 * unbounded table (or one above LT_DIRECT_MAX rows) is an open-addressing hash
 * map: linear probing, power-of-two capacity, load <= 1/2, 16-byte entries
 * {row_id, slot + 1} so one cache line answers most probes. A bounded table
 * indexes slots directly by row id (4 bytes per row, calloc'd so untouched
 * pages cost nothing): one memory access instead of a probe, which matters
 * because a lookup is a chain of cache misses. Slots are handed out
 * in insertion order and never freed. A row that was never pushed is not
 * stored: lookups compute its init value. Both the map and the slab grow by
 * doubling, reserved before a push is applied, so warm steps allocate nothing
 * and a push that fails leaves every row as it was. Lookups and pushes run
 * per table in passes (hash all ids, probe, then copy or update) with
 * prefetches a few ids ahead, so the map and row cache misses of a batch
 * overlap instead of queueing one after another.
 *
 * Checkpoint: one table file per table, DIR/table-<table_id>.bin
 * (embedding/table_file.h owns the format, storage/ckpt_dir.h the name).
 * Restore reads and checks every table's file into fresh indexes before
 * replacing anything.
 *
 * The change set (the incremental ops): per table, a flag per slot (set
 * when a push changes the slot's row) and the list of the row ids flagged,
 * in the order first pushed. checkpoint_delta sorts that list and writes
 * those rows only; a checkpoint, a checkpoint_delta or a restore that
 * succeeds clears it (the flags of the listed slots, then the list), so
 * neither costs a scan of the table. The list is kept from the first of
 * them on: before it every row held has changed (a checkpoint_delta then
 * writes them all), and a store that is never saved keeps no list. A
 * removal leaves the removed row's id in the list (its flag goes with its
 * slot): the list is sorted, its repeats and the ids no longer held
 * dropped when it is written. The removed rows' ids since then are kept
 * per table beside it (tombstones); checkpoint_delta writes those not held
 * again as removed-<table_id>.bin (embedding/removed_file.h) beside the
 * table file (a row removed and pushed again is a changed row).
 * restore_delta reads every file of its folder into fresh indexes first,
 * then deletes the removed rows and lays the files' rows over the held
 * ones. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/half.h"
#include "common/rng.h"
#include "common/sha256.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "embedding/removed_file.h"
#include "embedding/store.h"
#include "embedding/table_file.h"
#include "storage/ckpt_dir.h"

#define LT_EMPTY 0u /* entry.slot1 of a free entry; slots are stored plus one */
#define LT_MAX_ROWS 0x7ffffffeu /* slot + 1 fits 31 bits */
#define LT_DIRECT_MAX (1ULL << 28) /* 1 GiB of index at most, touched lazily */
#define LT_PREFETCH 32 /* ids ahead: enough misses in flight to hide DRAM latency */

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
  /* Scratch of the batched passes, grown to the largest per-table count. */
  size_t scratch_cap;
  size_t *pos;    /* [scratch_cap] map position of ids[r] */
  uint32_t *slot; /* [scratch_cap] slot + 1 of ids[r] (0: not stored) */
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

static void lt_free(ltab *t) {
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
static void lt_get(const ltab *t, uint32_t slot1, float *dst, int full) {
  if (t->prec == EMB_PREC_FP32) {
    memcpy(dst, lt_row(t, slot1), (size_t)(full ? t->stride : t->dim) * sizeof *dst);
    return;
  }
  if (t->prec == EMB_PREC_FP16) sr_f16_decode(lt_w16(t, slot1), dst, (size_t)t->dim, SR_HALF_AUTO);
  else sr_bf16_decode(lt_w16(t, slot1), dst, (size_t)t->dim);
  if (full) memcpy(dst + t->dim, lt_at(t, slot1), 4 * (size_t)t->slen);
}

/* src[stride] (weights of the table's format, then state) into slot1. */
static void lt_put(ltab *t, uint32_t slot1, const float *src) {
  if (t->prec == EMB_PREC_FP32) {
    memcpy(lt_row(t, slot1), src, (size_t)t->stride * sizeof *src);
    return;
  }
  if (t->prec == EMB_PREC_FP16) sr_f16_encode(src, lt_w16(t, slot1), (size_t)t->dim, SR_HALF_AUTO);
  else sr_bf16_encode(src, lt_w16(t, slot1), (size_t)t->dim);
  memcpy(lt_at(t, slot1), src + t->dim, 4 * (size_t)t->slen);
}

static int lt_init(ltab *t, int dim, int slen, int prec, uint64_t rows, size_t cap_rows) {
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

/* Make room for extra more rows without further allocation. */
static int lt_reserve(ltab *t, size_t extra) {
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
  /* Every row of the push may join the change set: room for it now, so
   * that recording a change never fails after the rows are updated. */
  if (t->track && t->chg_n + extra > t->chg_cap) {
    size_t cap = t->chg_cap ? t->chg_cap : 64;
    while (cap < t->chg_n + extra) cap *= 2;
    uint64_t *ni = realloc(t->chg_ids, cap * sizeof *ni);
    if (!ni) return SR_ENOMEM;
    t->chg_ids = ni;
    t->chg_cap = cap;
  }
  return 0;
}

/* Record that the row key in slot s1 changed (room reserved by lt_reserve). */
static inline void lt_mark(ltab *t, uint32_t s1, uint64_t key) {
  if (!t->track || t->chg[s1 - 1]) return;
  t->chg[s1 - 1] = 1;
  t->chg_ids[t->chg_n++] = key;
}

/* Empty the change set (the listed slots' flags, then the list) and keep
 * it from now on. */
static void lt_clear_changes(ltab *t) {
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
static int lt_keys(ltab *t) {
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
static void lt_remove(ltab *t, uint64_t key) {
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

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Stored keys in ascending order; malloc'd (NULL with n = 0 when empty). */
static int lt_sorted_keys(const ltab *t, uint64_t **out) {
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

/* ---- ops ---- */

static int check_ids(lstore *s, const emb_idset *ids, const char *what) {
  if (!ids || ids->n_tables != s->n || (s->n && (!ids->ids || !ids->counts))) {
    sr_fmt(s->err, sizeof s->err, "%s: id set has %d tables, the plan has %d", what,
           ids ? ids->n_tables : -1, s->n);
    return SR_EINVAL;
  }
  for (int t = 0; t < s->n; t++) {
    uint64_t rows = s->t[t].rows;
    if (rows == EMB_ROWS_UNBOUNDED) continue;
    const uint64_t *id = ids->ids[t];
    for (size_t r = 0; r < ids->counts[t]; r++)
      if (id[r] >= rows) {
        sr_fmt(s->err, sizeof s->err, "%s: table %d (%s): row id %llu is out of range 0..%llu", what,
               t, s->base.plan->tables[t].name, (unsigned long long)id[r],
               (unsigned long long)(rows - 1));
        return SR_ERANGE;
      }
  }
  return 0;
}

/* Room in the scratch arrays for n ids. */
static int scratch_reserve(lstore *s, size_t n) {
  if (n <= s->scratch_cap) return 0;
  size_t cap = s->scratch_cap ? s->scratch_cap : 1024;
  while (cap < n) cap *= 2;
  size_t *p = realloc(s->pos, cap * sizeof *p);
  if (p) s->pos = p;
  uint32_t *q = realloc(s->slot, cap * sizeof *q);
  if (q) s->slot = q;
  if (!p || !q) return SR_ENOMEM;
  s->scratch_cap = cap;
  return 0;
}

/* Pass 1 and 2 of a batch: home positions of every id (prefetching the map
 * entries LT_PREFETCH ahead), then probe each: pos[r] = its entry,
 * slot[r] = slot + 1 or 0 when not stored, prefetching the row. */
static void resolve(lstore *s, const ltab *t, const uint64_t *id, size_t cnt) {
  size_t *pos = s->pos;
  uint32_t *slot = s->slot;
  for (size_t r = 0; r < cnt; r++) pos[r] = lt_home(t, id[r]);
  for (size_t r = 0; r < cnt; r++) {
    if (r + LT_PREFETCH < cnt) {
      if (t->direct) __builtin_prefetch(&t->direct[pos[r + LT_PREFETCH]], 0, 1);
      else __builtin_prefetch(&t->map[pos[r + LT_PREFETCH]], 0, 1);
    }
    size_t h = lt_probe(t, pos[r], id[r]);
    pos[r] = h;
    slot[r] = lt_slot_at(t, h);
    /* The batch's rows fit in L2: fetch each as soon as its slot is known. */
    if (slot[r]) __builtin_prefetch(lt_at(t, slot[r]), 1, 3);
  }
}

/* Row r of table t (slot1, 0: not held) into o as lookup_begin_rows16
 * hands it: a 16-bit table's bits copied, an absent row's value (already
 * of the format: init rounded, or zeros) encoded. */
static void get_rows16(lstore *s, int ti, const ltab *t, uint32_t slot1, uint64_t id,
                       uint16_t *o) {
  const size_t dim = (size_t)t->dim;
  if (slot1) {
    memcpy(o, lt_w16(t, slot1), dim * sizeof *o);
    return;
  }
  float v[EMB_MAX_DIM];
  emb_store_absent_row(&s->base, ti, id, v);
  if (t->prec == EMB_PREC_FP16) sr_f16_encode(v, o, dim, SR_HALF_AUTO);
  else sr_bf16_encode(v, o, dim);
}

/* lookup_begin; rows16: 16-bit tables' rows in their bits (get_rows16). */
static int lookup_rows(emb_store *b, const emb_idset *ids, void *const *out, int rows16) {
  lstore *s = (lstore *)b;
  int rc = check_ids(s, ids, "lookup");
  if (rc) return s->last_lookup_rc = rc;
  for (int ti = 0; ti < s->n; ti++)
    if ((rc = scratch_reserve(s, ids->counts[ti]))) {
      sr_fmt(s->err, sizeof s->err, "lookup: out of memory");
      return s->last_lookup_rc = rc;
    }
  uint64_t hits = 0, total = 0;
  for (int ti = 0; ti < s->n; ti++) {
    const ltab *t = &s->t[ti];
    const uint64_t *id = ids->ids[ti];
    const size_t cnt = ids->counts[ti];
    const size_t dim = (size_t)t->dim;
    float *o = out[ti];
    resolve(s, t, id, cnt);
    const uint32_t *slot = s->slot;
    if (rows16 && t->prec != EMB_PREC_FP32) {
      for (size_t r = 0; r < cnt; r++) {
        get_rows16(s, ti, t, slot[r], id[r], (uint16_t *)out[ti] + r * dim);
        hits += slot[r] != 0;
      }
      total += cnt;
      continue;
    }
    for (size_t r = 0; r < cnt; r++) {
      float *dst = o + r * dim;
      if (slot[r]) {
        lt_get(t, slot[r], dst, 0);
        hits++;
      } else {
        emb_store_absent_row(&s->base, ti, id[r], dst);
      }
    }
    total += cnt;
  }
  s->st.lookups += total;
  s->st.hits += hits;
  return s->last_lookup_rc = 0;
}

static int l_lookup_begin(emb_store *b, int64_t step, const emb_idset *ids, float *const *out) {
  (void)step;
  return lookup_rows(b, ids, (void *const *)out, 0);
}

static int l_lookup_begin_rows16(emb_store *b, int64_t step, const emb_idset *ids,
                                 void *const *out) {
  (void)step;
  return lookup_rows(b, ids, out, 1);
}

static int l_lookup_wait(emb_store *b) { return ((lstore *)b)->last_lookup_rc; }

/* Room for a push of n rows and f floats of outcome (grown, kept). */
static int push_scratch(lstore *s, size_t n, size_t f) {
  if (f > s->vals_cap) {
    float *v = realloc(s->vals, f * sizeof *v);
    if (!v) return SR_ENOMEM;
    s->vals = v;
    s->vals_cap = f;
  }
  if (n > s->slots_cap) {
    uint32_t *q = realloc(s->slots, n * sizeof *q);
    if (!q) return SR_ENOMEM;
    s->slots = q;
    s->slots_cap = n;
  }
  return 0;
}

/* Undo the first `done` rows push_apply changed (their old values are in
 * s->vals): a refused push leaves every row as it was. */
static void push_undo(lstore *s, const emb_idset *ids, size_t done) {
  size_t at = 0;
  const float *v = s->vals;
  for (int ti = 0; ti < s->n && at < done; ti++) {
    ltab *t = &s->t[ti];
    const size_t stride = (size_t)t->stride;
    for (size_t r = 0; r < ids->counts[ti] && at < done; r++, v += stride)
      if (s->slots[at++]) lt_put(t, s->slots[at - 1], v);
  }
}

/* A push's first half: every row's update, checked finite. A stored row
 * is updated in place (hot in cache after resolve) with its old value kept
 * in s->vals; a row not stored yet is computed into s->vals from its init
 * value (the same emb_optim_apply: the same bits) and stored by
 * push_commit. s->slots gets each row's slot + 1 (0: new). 0, or
 * SR_ERANGE naming the first row whose value or optimizer state would not
 * be finite, every row as it was. */
static int push_apply(lstore *s, int64_t step, float lr, const emb_idset *ids,
                      const float *const *grads) {
  const emb_plan *plan = s->base.plan;
  size_t at = 0;
  float *v = s->vals;
  for (int ti = 0; ti < s->n; ti++) {
    ltab *t = &s->t[ti];
    const emb_optim_cfg *oc = &plan->tables[ti].optim;
    const uint64_t *id = ids->ids[ti];
    const size_t stride = (size_t)t->stride;
    resolve(s, t, id, ids->counts[ti]);
    for (size_t r = 0; r < ids->counts[ti]; r++, v += stride) {
      uint32_t s1 = s->slot[r];
      float *w = v;
      s->slots[at++] = s1;
      if (s1 && t->prec == EMB_PREC_FP32) {
        w = lt_row(t, s1); /* updated in place */
        memcpy(v, w, stride * sizeof *v);
      } else if (s1) { /* 16 bits: updated as floats, then stored */
        lt_get(t, s1, v, 1);
        w = memcpy(s->row, v, stride * sizeof *v);
      } else {
        emb_row_init(plan, ti, id[r], w);
        emb_optim_state_init(oc, t->dim, w + t->dim);
      }
      const int ok = emb_optim_apply_at(plan, ti, id[r], step, lr, grads[ti] + r * (size_t)t->dim,
                                        w, t->slen ? w + t->dim : NULL);
      if (s1 && t->prec != EMB_PREC_FP32) lt_put(t, s1, w);
      if (!ok) {
        push_undo(s, ids, at);
        sr_fmt(s->err, sizeof s->err,
               "push: table %u (%s) row %llu: the update (learning rate %g) would leave the row "
               "or its optimizer state non-finite; nothing applied",
               plan->tables[ti].table_id, plan->tables[ti].name, (unsigned long long)id[r],
               (double)lr);
        return SR_ERANGE;
      }
    }
  }
  return 0;
}

/* The second half: the new rows inserted (room reserved before), their
 * values from s->vals. */
static void push_commit(lstore *s, const emb_idset *ids) {
  size_t at = 0;
  const float *v = s->vals;
  for (int ti = 0; ti < s->n; ti++) {
    ltab *t = &s->t[ti];
    const uint64_t *id = ids->ids[ti];
    const size_t stride = (size_t)t->stride;
    for (size_t r = 0; r < ids->counts[ti]; r++, v += stride) {
      uint32_t s1 = s->slots[at++];
      if (!s1) {
        size_t h = lt_find(t, id[r]);
        s1 = lt_slot_at(t, h);
        if (!s1) s1 = lt_insert_at(t, h, id[r]);
        lt_put(t, s1, v);
      }
      lt_mark(t, s1, id[r]);
    }
  }
}

/* Applied whole or not at all: every row's update is made and checked
 * (push_apply, undone on a refusal), then the new rows stored (push_commit). */
static int l_push(emb_store *b, int64_t step, float lr, const emb_idset *ids,
                  const float *const *grads) {
  lstore *s = (lstore *)b;
  int rc = check_ids(s, ids, "push");
  if (rc) return rc;
  if (!emb_optim_lr_ok(lr)) {
    sr_fmt(s->err, sizeof s->err, "push: learning rate %g is outside [0, %g]", (double)lr,
           EMB_OPTIM_MAX_LR);
    return SR_ERANGE;
  }
  size_t n = 0, f = 0;
  for (int ti = 0; ti < s->n; ti++) {
    n += ids->counts[ti];
    f += ids->counts[ti] * (size_t)s->t[ti].stride;
    if ((rc = lt_reserve(&s->t[ti], ids->counts[ti])) || (rc = scratch_reserve(s, ids->counts[ti]))) {
      sr_fmt(s->err, sizeof s->err, "push: table %d: %s", ti, sr_strerror(rc));
      return rc;
    }
  }
  if ((rc = push_scratch(s, n, f))) {
    sr_fmt(s->err, sizeof s->err, "push: out of memory for %zu rows", n);
    return rc;
  }
  if ((rc = push_apply(s, step, lr, ids, grads))) return rc;
  push_commit(s, ids);
  s->st.pushes += n;
  return 0;
}

static int l_flush(emb_store *b) {
  (void)b;
  return 0;
}

/* The ids list[n] in ascending order, once each, those held (held 1) or
 * not held (held 0) only, into *out (malloc'd; NULL when none) and *nout. */
static int lt_sorted_ids(const ltab *t, const uint64_t *list, size_t n, int held, uint64_t **out,
                         size_t *nout) {
  *out = NULL;
  *nout = 0;
  if (!n) return 0;
  uint64_t *k = malloc(n * sizeof *k);
  if (!k) return SR_ENOMEM;
  memcpy(k, list, n * sizeof *k);
  emb_rmfile_sort_unique(k, &n);
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if ((lt_slot_at(t, lt_find(t, k[i])) != LT_EMPTY) == held) k[m++] = k[i];
  *out = k;
  *nout = m;
  return 0;
}

/* Table ti's removed rows since the last checkpoint not held again, as
 * dir/removed-<table_id>.bin (none: no file). */
static int write_removed(lstore *s, int ti, const char *dir) {
  const ltab *t = &s->t[ti];
  const emb_table *pt = &s->base.plan->tables[ti];
  char path[4096], e2[1024];
  uint64_t *ids;
  size_t n;
  int rc = lt_sorted_ids(t, t->rm_ids, t->rm_n, 0, &ids, &n);
  if (!rc && n && ckpt_dir_removed_file(dir, pt->table_id, path, sizeof path)) {
    sr_fmt(e2, sizeof e2, "%s: path too long", dir);
    rc = SR_ERANGE;
  } else if (rc) {
    sr_fmt(e2, sizeof e2, "out of memory");
  } else if (n) {
    rc = emb_rmfile_write(path, pt, s->model_fp, ids, n, e2, sizeof e2);
  }
  if (rc) sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s", e2);
  free(ids);
  return rc;
}

/* Table ti's file under dir: every row held, or (delta) the changed ones. */
static int write_table(lstore *s, int ti, const char *dir, int delta) {
  const ltab *t = &s->t[ti];
  const emb_table *pt = &s->base.plan->tables[ti];
  const char *what = delta ? "checkpoint_delta" : "checkpoint";
  char path[4096], e2[1024];
  if (ckpt_dir_table_file(dir, pt->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "%s: %s: path too long", what, dir);
    return SR_ERANGE;
  }
  uint64_t *keys;
  size_t n = t->n;
  int rc = delta ? lt_sorted_ids(t, t->chg_ids, t->chg_n, 1, &keys, &n) : lt_sorted_keys(t, &keys);
  if (rc) {
    sr_fmt(s->err, sizeof s->err, "%s: out of memory", what);
    return rc;
  }
  emb_tabfile_writer *w;
  rc = emb_tabfile_create(path, pt, s->model_fp, n, &w, e2, sizeof e2);
  for (size_t i = 0; i < n && !rc; i++) {
    lt_get(t, lt_slot_at(t, lt_find(t, keys[i])), s->row, 1);
    rc = emb_tabfile_put(w, keys[i], s->row, e2, sizeof e2);
  }
  if (!rc) rc = emb_tabfile_commit(w, e2, sizeof e2);
  else emb_tabfile_abort(w);
  if (rc) sr_fmt(s->err, sizeof s->err, "%s: %s", what, e2);
  free(keys);
  return rc;
}

/* Every table's file under path; the change set cleared once all are written. */
static int write_tables(lstore *s, const char *path, int delta) {
  if (mkdir(path, 0777) != 0 && errno != EEXIST) {
    sr_fmt(s->err, sizeof s->err, "%s: %s: cannot create folder: %s",
           delta ? "checkpoint_delta" : "checkpoint", path, strerror(errno));
    return SR_EIO;
  }
  for (int ti = 0; ti < s->n; ti++) { /* not tracked yet: every row changed */
    int rc = write_table(s, ti, path, delta && s->t[ti].track);
    if (!rc && delta && s->t[ti].track) rc = write_removed(s, ti, path);
    if (rc) return rc;
  }
  for (int ti = 0; ti < s->n; ti++) lt_clear_changes(&s->t[ti]);
  return 0;
}

static int l_checkpoint(emb_store *b, const char *path) {
  return write_tables((lstore *)b, path, 0);
}

static int l_checkpoint_delta(emb_store *b, const char *path) {
  return write_tables((lstore *)b, path, 1);
}

/* Each record of a table file into the fresh ltab of emb_tabfile_read_all's
 * ctx. A row id out of order or range refuses the file once its checksum is
 * checked; until then a repeated one keeps its first record and one past a
 * bounded table is skipped (it has no index entry to write). */
static int read_record(void *ctx, uint64_t row_id, const float *vals) {
  ltab *nt = ctx;
  if (nt->rows != EMB_ROWS_UNBOUNDED && row_id >= nt->rows) return 0;
  size_t h = lt_find(nt, row_id);
  if (lt_slot_at(nt, h) == LT_EMPTY)
    lt_put(nt, lt_insert_at(nt, h, row_id), vals);
  return 0;
}

/* Read DIR/table-<id>.bin into a fresh ltab nt. */
static int read_table(lstore *s, int ti, const char *dir, const char *from_fp, ltab *nt) {
  const emb_table *pt = &s->base.plan->tables[ti];
  const ltab *cur = &s->t[ti];
  char path[4096], e2[1024];
  memset(nt, 0, sizeof *nt);
  if (ckpt_dir_table_file(dir, pt->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "restore: %s: path too long", dir);
    return SR_ERANGE;
  }
  emb_tabfile_reader *r;
  /* Rows of a smaller plan this one grows (emb_store_restore_grown): its
   * model fingerprint; ids past its rows are this plan's never-written rows. */
  const char *fp = from_fp ? from_fp : s->model_fp;
  int rc = emb_tabfile_open(path, pt, fp, &r, e2, sizeof e2);
  uint64_t n = rc ? 0 : emb_tabfile_rows(r);
  if (!rc && n > LT_MAX_ROWS) {
    sr_fmt(e2, sizeof e2, "%s: %llu rows, more than a table of this store holds (%u)", path,
           (unsigned long long)n, LT_MAX_ROWS);
    rc = SR_EFORMAT;
  }
  if (!rc && (rc = lt_init(nt, cur->dim, cur->slen, cur->prec, cur->rows, (size_t)n)))
    sr_fmt(e2, sizeof e2, "out of memory");
  if (!rc && (rc = emb_tabfile_read_all(r, read_record, nt, e2, sizeof e2))) lt_free(nt);
  emb_tabfile_close(r);
  if (rc) sr_fmt(s->err, sizeof s->err, "restore: %s", e2);
  return rc;
}

static int l_restore(emb_store *b, const char *path, const char *from_model_fp) {
  lstore *s = (lstore *)b;
  ltab *nt = calloc((size_t)s->n, sizeof *nt);
  if (!nt) {
    sr_fmt(s->err, sizeof s->err, "restore: out of memory");
    return SR_ENOMEM;
  }
  for (int ti = 0; ti < s->n; ti++) {
    int rc = read_table(s, ti, path, from_model_fp, &nt[ti]);
    if (rc) {
      for (int k = 0; k < ti; k++) lt_free(&nt[k]);
      free(nt);
      return rc;
    }
  }
  for (int ti = 0; ti < s->n; ti++) {
    lt_free(&s->t[ti]);
    nt[ti].track = 1; /* restored: nothing changed since */
  }
  free(s->t);
  s->t = nt;
  return 0;
}

/* Table ti's removed rows under dir (removed-<table_id>.bin; absent: none),
 * checked, into *ids[*n]. */
static int read_removed(lstore *s, int ti, const char *dir, uint64_t **ids, size_t *n) {
  const emb_table *pt = &s->base.plan->tables[ti];
  char path[4096], e2[1024];
  *ids = NULL;
  *n = 0;
  if (ckpt_dir_removed_file(dir, pt->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "restore_delta: %s: path too long", dir);
    return SR_ERANGE;
  }
  int rc = emb_rmfile_read(path, pt, s->model_fp, ids, n, e2, sizeof e2);
  if (rc) sr_fmt(s->err, sizeof s->err, "restore_delta: %s", e2);
  return rc;
}

/* Every table file and removed-rows file under path read and checked
 * (table files into fresh indexes), room made in the held tables, then
 * the removed rows deleted and each row of the files laid over the held
 * one: a refused folder changes no row. */
static int l_restore_delta(emb_store *b, const char *path) {
  lstore *s = (lstore *)b;
  ltab *nt = calloc((size_t)s->n, sizeof *nt);
  uint64_t **keys = calloc((size_t)s->n, sizeof *keys), **rm = calloc((size_t)s->n, sizeof *rm);
  size_t *rm_n = calloc((size_t)s->n, sizeof *rm_n);
  int rc = nt && keys && rm && rm_n ? 0 : SR_ENOMEM;
  for (int k = 0; k < s->n && !rc; k++) rc = read_table(s, k, path, NULL, &nt[k]);
  for (int k = 0; k < s->n && !rc; k++) rc = read_removed(s, k, path, &rm[k], &rm_n[k]);
  for (int k = 0; k < s->n && !rc; k++)
    if ((rc = lt_sorted_keys(&nt[k], &keys[k])) || (rc = lt_reserve(&s->t[k], nt[k].n)) ||
        (rm_n[k] && (rc = lt_keys(&s->t[k]))))
      sr_fmt(s->err, sizeof s->err, "restore_delta: table %d: %s", k, sr_strerror(rc));
  if (rc == SR_ENOMEM && (!nt || !keys || !rm || !rm_n))
    sr_fmt(s->err, sizeof s->err, "restore_delta: out of memory");
  for (int k = 0; k < s->n && !rc; k++) {
    ltab *t = &s->t[k];
    for (size_t i = 0; i < rm_n[k]; i++) lt_remove(t, rm[k][i]);
    for (size_t i = 0; i < nt[k].n; i++) {
      size_t h = lt_find(t, keys[k][i]);
      uint32_t s1 = lt_slot_at(t, h);
      if (!s1) s1 = lt_insert_at(t, h, keys[k][i]);
      memcpy(lt_at(t, s1), lt_at(&nt[k], lt_slot_at(&nt[k], lt_find(&nt[k], keys[k][i]))), t->rb);
    }
  }
  for (int k = 0; k < s->n && nt && keys && rm; k++) {
    lt_free(&nt[k]);
    free(keys[k]);
    free(rm[k]);
  }
  free(nt);
  free(keys);
  free(rm);
  free(rm_n);
  if (!rc)
    for (int k = 0; k < s->n; k++) lt_clear_changes(&s->t[k]);
  return rc;
}

/* Room for extra more ids in t's removed list. */
static int lt_reserve_removed(ltab *t, size_t extra) {
  if (t->rm_n + extra <= t->rm_cap) return 0;
  size_t cap = t->rm_cap ? t->rm_cap : 64;
  while (cap < t->rm_n + extra) cap *= 2;
  uint64_t *ni = realloc(t->rm_ids, cap * sizeof *ni);
  if (!ni) return SR_ENOMEM;
  t->rm_ids = ni;
  t->rm_cap = cap;
  return 0;
}

/* Rows of ids go (emb_store_ops.remove); a tracked table lists the held
 * ones it removes for the next checkpoint_delta. */
static int l_remove(emb_store *b, int64_t step, const emb_idset *ids) {
  (void)step;
  lstore *s = (lstore *)b;
  int rc = check_ids(s, ids, "remove");
  if (rc) return rc;
  for (int ti = 0; ti < s->n; ti++)
    if (ids->counts[ti] &&
        ((rc = lt_keys(&s->t[ti])) ||
         (s->t[ti].track && (rc = lt_reserve_removed(&s->t[ti], ids->counts[ti]))))) {
      sr_fmt(s->err, sizeof s->err, "remove: out of memory");
      return rc;
    }
  for (int ti = 0; ti < s->n; ti++) {
    ltab *t = &s->t[ti];
    for (size_t r = 0; r < ids->counts[ti]; r++) {
      uint64_t id = ids->ids[ti][r];
      if (t->track && lt_slot_at(t, lt_find(t, id)) != LT_EMPTY) t->rm_ids[t->rm_n++] = id;
      lt_remove(t, id);
    }
  }
  return 0;
}

static int l_stats(emb_store *b, emb_store_stats *out) {
  lstore *s = (lstore *)b;
  uint64_t rows = 0, bytes = 0;
  for (int ti = 0; ti < s->n; ti++) {
    rows += s->t[ti].n;
    bytes += (uint64_t)s->t[ti].n * (uint64_t)s->t[ti].rb;
  }
  *out = s->st;
  out->rows = rows;
  out->bytes = bytes;
  return 0;
}

static int l_iterate(emb_store *b, int table, emb_row_fn fn, void *ctx) {
  lstore *s = (lstore *)b;
  if (table < 0 || table >= s->n) {
    sr_fmt(s->err, sizeof s->err, "iterate: table %d is out of range 0..%d", table, s->n - 1);
    return SR_EINVAL;
  }
  const ltab *t = &s->t[table];
  uint64_t *keys;
  int rc = lt_sorted_keys(t, &keys);
  if (rc) {
    sr_fmt(s->err, sizeof s->err, "iterate: out of memory");
    return rc;
  }
  for (size_t i = 0; i < t->n; i++) {
    float *row = s->row;
    lt_get(t, lt_slot_at(t, lt_find(t, keys[i])), row, 1);
    if (fn(ctx, table, keys[i], row, t->dim, t->slen ? row + t->dim : NULL, t->slen)) break;
  }
  free(keys);
  return 0;
}

static const char *l_errmsg(emb_store *b) { return ((lstore *)b)->err; }

static void l_destroy(emb_store *b) {
  lstore *s = (lstore *)b;
  if (s->t)
    for (int ti = 0; ti < s->n; ti++) lt_free(&s->t[ti]);
  free(s->t);
  free(s->pos);
  free(s->slot);
  free(s->vals);
  free(s->slots);
  free(s);
}

static const emb_store_ops local_ops = {
    .kind = EMB_STORE_LOCAL,
    .ckpt_layout = EMB_CKPT_TABLE_FILES,
    .lookup_begin = l_lookup_begin,
    .lookup_begin_rows16 = l_lookup_begin_rows16,
    .lookup_wait = l_lookup_wait,
    .push = l_push,
    .flush = l_flush,
    .checkpoint = l_checkpoint,
    .restore = l_restore,
    .checkpoint_delta = l_checkpoint_delta,
    .restore_delta = l_restore_delta,
    .remove = l_remove,
    .stats = l_stats,
    .iterate = l_iterate,
    .errmsg = l_errmsg,
    .destroy = l_destroy,
};

emb_store *emb_store_create_local(const emb_plan *plan, char *err, size_t errlen) {
  int rc = emb_plan_validate(plan, "plan", err, errlen);
  if (rc) return NULL;
  lstore *s = calloc(1, sizeof *s);
  if (!s) goto nomem;
  s->base.ops = &local_ops;
  s->base.plan = plan;
  s->n = plan->n_tables;
  s->t = calloc((size_t)s->n, sizeof *s->t);
  if (!s->t) goto nomem;
  for (int ti = 0; ti < s->n; ti++) {
    const emb_table *pt = &plan->tables[ti];
    if (lt_init(&s->t[ti], pt->dim, emb_optim_state_len(&pt->optim, pt->dim), (int)pt->precision,
                pt->rows, 0))
      goto nomem;
  }
  if (emb_plan_model_fingerprint(plan, s->model_fp)) goto nomem;
  return &s->base;
nomem:
  sr_fmt(err, errlen, "local store: out of memory");
  if (s) l_destroy(&s->base);
  return NULL;
}
