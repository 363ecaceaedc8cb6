/* The shard store: a bounded row cache over RocksDB (see shard.h).
 *
 * Cache layout: one slab of cap slots; a slot is a 16-byte header (row id,
 * table, flags, pin stamp) followed by the row's value and optimizer state
 * (the widest table's dim + state_len floats), so a hit touches the map entry
 * and one contiguous slot. The map: open addressing, linear probing,
 * power-of-two size >= 2 x cap, 16-byte entries {row id, slot + 1, table};
 * deletion by backward shift (no tombstones). CLOCK: a reference bit per
 * slot, set on every access, cleared by the hand; the hand skips slots pinned
 * by the chunk in progress (pin == stamp). */
#include "embedding/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/rng.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"

#define SH_PREFETCH 48
#define SH_PASS 256 /* ids per lookup pass */
#define F_REF 1u
#define F_DIRTY 2u
#define WB_ROWS 4096 /* dirty rows per WriteBatch when flushing */

typedef struct {
  uint64_t key;
  uint32_t slot1; /* 0: empty */
  uint32_t table;
} sh_entry;

typedef struct {
  uint64_t key;
  uint16_t table;
  uint16_t flags;
  uint32_t pin;
} sh_meta; /* 16 bytes, first in each slot */

typedef struct {
  emb_store base;
  int n_tables;
  int *dim, *slen;        /* [n_tables] */
  int stride;             /* floats per slot after the meta */
  size_t slot_bytes;
  unsigned char *slab;    /* [cap][slot_bytes] */
  uint32_t cap, used, hand;
  uint32_t stamp;
  sh_entry *map;
  size_t mask;
  /* databases */
  char *dir;
  int n_db;
  int *db_shard;          /* [n_db] shard index of db k */
  int *shard_db;          /* [plan->n_shards] db index or -1 */
  kv_db **db;          /* [n_db] */
  kv_opts sopts;
  /* chunk scratch */
  size_t chunk;           /* max items per chunk = cap / 2 */
  uint32_t *it_t;         /* [chunk] table */
  uint64_t *it_id;        /* [chunk] row id */
  size_t *it_pos;         /* [chunk] map position / miss-list index */
  uint32_t *it_slot;      /* [chunk] slot index */
  size_t *miss;           /* [chunk] item index */
  int *mcf;               /* [chunk] database index of each miss */
  uint64_t *mkey;         /* [chunk] */
  char **mval;            /* [chunk] */
  size_t *mlen;           /* [chunk] */
  size_t *mitem;          /* [2 * chunk] item index of the k-th key sent; then row indices */
  uint32_t *ms_t;         /* [chunk] lookup misses: table, id, row index */
  uint64_t *ms_id;
  size_t *ms_r;
  float *tmp;             /* [stride] */
  unsigned char *enc;     /* [8 + 4 * stride] */
  emb_store_stats st;
  emb_shard_counters ctr;
  int unclean;            /* opened on rows without the clean-stop marks (a crash) */
  int marked;             /* the clean-stop marks are written (emb_shard_mark_clean) */
  int last_lookup_rc;
  char err[1024];
} shstore;

static inline sh_meta *slot_meta(const shstore *s, uint32_t i) {
  return (sh_meta *)(s->slab + (size_t)i * s->slot_bytes);
}
static inline float *slot_row(const shstore *s, uint32_t i) {
  return (float *)(s->slab + (size_t)i * s->slot_bytes + sizeof(sh_meta));
}
static inline size_t home(const shstore *s, uint32_t t, uint64_t key) {
  return (size_t)sr_mix64(key ^ ((uint64_t)(t + 1) * 0x9E3779B97F4A7C15ULL)) & s->mask;
}
static inline size_t probe(const shstore *s, size_t h, uint32_t t, uint64_t key) {
  for (;;) {
    const sh_entry *e = &s->map[h];
    if (!e->slot1 || (e->key == key && e->table == t)) return h;
    h = (h + 1) & s->mask;
  }
}

static void map_delete(shstore *s, size_t i) {
  size_t j = i;
  s->map[i].slot1 = 0;
  for (;;) {
    j = (j + 1) & s->mask;
    if (!s->map[j].slot1) break;
    size_t k = home(s, s->map[j].table, s->map[j].key);
    int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    s->map[i] = s->map[j];
    s->map[j].slot1 = 0;
    i = j;
  }
}

static int db_of(shstore *s, int t, uint64_t id) {
  int sh = emb_plan_shard_of(s->base.plan, t, id);
  return s->shard_db[sh];
}

/* Queue a dirty slot's row into its database's write batch. */
static void writeback(shstore *s, uint32_t i) {
  sh_meta *m = slot_meta(s, i);
  int t = m->table, k = db_of(s, t, m->key);
  kv_row_encode(s->dim[t], s->slen[t], slot_row(s, i), s->enc);
  kv_batch_put(s->db[k], t, m->key, s->enc, kv_row_size(s->dim[t], s->slen[t]));
  m->flags &= (uint16_t)~F_DIRTY;
  s->ctr.writebacks++;
}

static int commit_all(shstore *s) {
  for (int k = 0; k < s->n_db; k++) {
    int rc = kv_batch_commit(s->db[k], s->err, sizeof s->err);
    if (rc) return rc;
  }
  return 0;
}

/* A free slot: a never-used one, else CLOCK's victim (written back if dirty). */
static uint32_t slot_alloc(shstore *s) {
  if (s->used < s->cap) return s->used++;
  for (;;) {
    uint32_t i = s->hand;
    s->hand = s->hand + 1 == s->cap ? 0 : s->hand + 1;
    sh_meta *m = slot_meta(s, i);
    if (m->pin == s->stamp) continue;
    if (m->flags & F_REF) {
      m->flags &= (uint16_t)~F_REF;
      continue;
    }
    if (m->flags & F_DIRTY) writeback(s, i);
    map_delete(s, probe(s, home(s, m->table, m->key), m->table, m->key));
    s->ctr.evictions++;
    return i;
  }
}

/* Make the chunk's n items resident and pinned: it_slot[i] gets each slot.
 * Misses: one MultiGet per database, absent rows initialised. */
static int chunk_resolve(shstore *s, size_t n, uint64_t *hits) {
  const emb_plan *plan = s->base.plan;
  if (++s->stamp == 0) { /* wrapped: clear stale pins */
    for (uint32_t i = 0; i < s->used; i++) slot_meta(s, i)->pin = 0;
    s->stamp = 1;
  }
  for (size_t i = 0; i < n; i++) s->it_pos[i] = home(s, s->it_t[i], s->it_id[i]);
  size_t nm = 0;
  for (size_t i = 0; i < n; i++) {
    if (i + SH_PREFETCH < n) __builtin_prefetch(&s->map[s->it_pos[i + SH_PREFETCH]], 0, 3);
    size_t h = probe(s, s->it_pos[i], s->it_t[i], s->it_id[i]);
    uint32_t s1 = s->map[h].slot1;
    if (s1) {
      sh_meta *m = slot_meta(s, s1 - 1);
      __builtin_prefetch(m, 1, 3);
      s->it_slot[i] = s1 - 1;
      (*hits)++;
    } else {
      s->it_slot[i] = UINT32_MAX;
      s->miss[nm++] = i;
    }
  }
  for (size_t i = 0; i < n; i++)
    if (s->it_slot[i] != UINT32_MAX) {
      sh_meta *m = slot_meta(s, s->it_slot[i]);
      m->pin = s->stamp;
      m->flags |= F_REF;
    }
  if (!nm) return 0;
  /* Misses grouped by database and table: one batched MultiGet each. */
  for (size_t j = 0; j < nm; j++) {
    size_t i = s->miss[j];
    int d = db_of(s, (int)s->it_t[i], s->it_id[i]);
    if (d < 0) {
      sr_fmt(s->err, sizeof s->err, "table %d row %llu lives on shard %d, not hosted here",
             (int)s->it_t[i], (unsigned long long)s->it_id[i],
             emb_plan_shard_of(plan, (int)s->it_t[i], s->it_id[i]));
      return SR_EINVAL;
    }
    s->mcf[j] = d;
  }
  for (int k = 0; k < s->n_db; k++)
    for (uint32_t t = 0; t < (uint32_t)s->n_tables; t++) {
      size_t nk = 0;
      for (size_t j = 0; j < nm; j++) {
        size_t i = s->miss[j];
        if (s->mcf[j] != k || s->it_t[i] != t) continue;
        s->mkey[nk] = s->it_id[i];
        s->mitem[nk] = i;
        nk++;
      }
      if (!nk) continue;
      int rc = kv_multi_get_cf(s->db[k], (int)t, nk, s->mkey, (const char **)s->mval, s->mlen,
                                  s->err, sizeof s->err);
      if (rc) return rc;
      s->ctr.rocks_reads += nk;
      const int dim = s->dim[t], sl = s->slen[t];
      for (size_t q = 0; q < nk; q++) {
        size_t i = s->mitem[q];
        uint64_t id = s->it_id[i];
        if (s->mval[q]) {
          char e2[256];
          rc = kv_row_decode(s->mval[q], s->mlen[q], dim, sl, s->tmp, e2, sizeof e2);
          if (rc) {
            char dp[4200];
            ckpt_dir_shard_path(s->dir, s->db_shard[k], dp, sizeof dp);
            sr_fmt(s->err, sizeof s->err, "%s: table %u row %llu: %s", dp,
                   plan->tables[t].table_id, (unsigned long long)id, e2);
            kv_multi_get_release(s->db[k]);
            return rc;
          }
          s->ctr.rocks_found++;
        } else {
          emb_row_init(plan, (int)t, id, s->tmp);
          emb_optim_state_init(&plan->tables[t].optim, dim, s->tmp + dim);
        }
        /* A repeated id in the chunk finds its first insertion. */
        size_t h = probe(s, home(s, t, id), t, id);
        if (s->map[h].slot1) {
          s->it_slot[i] = s->map[h].slot1 - 1;
          continue;
        }
        uint32_t slot = slot_alloc(s);
        h = probe(s, home(s, t, id), t, id); /* eviction may have shifted entries */
        s->map[h].key = id;
        s->map[h].table = t;
        s->map[h].slot1 = slot + 1;
        sh_meta *m = slot_meta(s, slot);
        m->key = id;
        m->table = (uint16_t)t;
        m->flags = F_REF;
        m->pin = s->stamp;
        memcpy(slot_row(s, slot), s->tmp, 4 * (size_t)(dim + sl));
        s->it_slot[i] = slot;
      }
      kv_multi_get_release(s->db[k]);
    }
  return commit_all(s); /* rows evicted by this chunk */
}

static int check_ids(shstore *s, const emb_idset *ids, const char *what) {
  if (!ids || ids->n_tables != s->n_tables || (s->n_tables && (!ids->ids || !ids->counts))) {
    sr_fmt(s->err, sizeof s->err, "%s: id set has %d tables, the plan has %d", what,
           ids ? ids->n_tables : -1, s->n_tables);
    return SR_EINVAL;
  }
  for (int t = 0; t < s->n_tables; t++) {
    uint64_t rows = s->base.plan->tables[t].rows;
    if (rows == EMB_ROWS_UNBOUNDED) continue;
    for (size_t r = 0; r < ids->counts[t]; r++)
      if (ids->ids[t][r] >= rows) {
        sr_fmt(s->err, sizeof s->err, "%s: table %d (%s): row id %llu is out of range 0..%llu", what,
               t, s->base.plan->tables[t].name, (unsigned long long)ids->ids[t][r],
               (unsigned long long)(rows - 1));
        return SR_ERANGE;
      }
  }
  return 0;
}

/* Walk every (table, r) of ids in chunks; per chunk resolve then act. */
typedef void (*chunk_fn)(shstore *s, size_t n, const size_t *it_r, void *ctx);

static int for_chunks(shstore *s, const emb_idset *ids, size_t *it_r, chunk_fn fn, void *ctx,
                      uint64_t *hits) {
  size_t n = 0;
  for (int t = 0; t < s->n_tables; t++)
    for (size_t r = 0; r < ids->counts[t]; r++) {
      s->it_t[n] = (uint32_t)t;
      s->it_id[n] = ids->ids[t][r];
      it_r[n] = r;
      if (++n == s->chunk) {
        int rc = chunk_resolve(s, n, hits);
        if (rc) return rc;
        fn(s, n, it_r, ctx);
        n = 0;
      }
    }
  if (n) {
    int rc = chunk_resolve(s, n, hits);
    if (rc) return rc;
    fn(s, n, it_r, ctx);
  }
  return 0;
}

typedef struct {
  float *const *out;
} lookup_ctx;

static void lookup_act(shstore *s, size_t n, const size_t *it_r, void *vctx) {
  lookup_ctx *c = vctx;
  for (size_t i = 0; i < n; i++) {
    uint32_t t = s->it_t[i];
    size_t dim = (size_t)s->dim[t];
    memcpy(c->out[t] + it_r[i] * dim, slot_row(s, s->it_slot[i]), dim * sizeof(float));
  }
}

typedef struct {
  float lr;
  const float *const *grads;
} push_ctx;

static void push_act(shstore *s, size_t n, const size_t *it_r, void *vctx) {
  push_ctx *c = vctx;
  const emb_plan *plan = s->base.plan;
  for (size_t i = 0; i < n; i++) {
    uint32_t t = s->it_t[i];
    int dim = s->dim[t];
    float *row = slot_row(s, s->it_slot[i]);
    emb_optim_apply(&plan->tables[t].optim, dim, c->lr, c->grads[t] + it_r[i] * (size_t)dim, row,
                    s->slen[t] ? row + dim : NULL);
    slot_meta(s, s->it_slot[i])->flags |= F_DIRTY;
  }
}

typedef struct {
  float lr;
  const float *const *grads;
  float *scratch;      /* [stride] */
  int bad_t;           /* -1, or the table of the first row that would turn non-finite */
  uint64_t bad_id;
} check_ctx;

/* A push's first pass: emb_optim_check on each row (resident and pinned),
 * nothing changed; the first row whose outcome is not finite is kept. */
static void check_act(shstore *s, size_t n, const size_t *it_r, void *vctx) {
  check_ctx *c = vctx;
  const emb_plan *plan = s->base.plan;
  for (size_t i = 0; i < n && c->bad_t < 0; i++) {
    uint32_t t = s->it_t[i];
    int dim = s->dim[t];
    const float *row = slot_row(s, s->it_slot[i]);
    if (!emb_optim_check(&plan->tables[t].optim, dim, c->lr, c->grads[t] + it_r[i] * (size_t)dim,
                         row, row + dim, c->scratch)) {
      c->bad_t = (int)t;
      c->bad_id = s->it_id[i];
    }
  }
}

/* Misses gathered by a lookup: resolved (MultiGet, insert) and copied out. */
static int lookup_flush_misses(shstore *s, size_t *nm, float *const *out) {
  if (!*nm) return 0;
  size_t *it_r = s->mitem + s->chunk;
  memcpy(s->it_t, s->ms_t, *nm * sizeof *s->it_t);
  memcpy(s->it_id, s->ms_id, *nm * sizeof *s->it_id);
  memcpy(it_r, s->ms_r, *nm * sizeof *it_r);
  uint64_t dummy = 0;
  int rc = chunk_resolve(s, *nm, &dummy);
  if (rc) return rc;
  lookup_ctx c = {out};
  lookup_act(s, *nm, it_r, &c);
  *nm = 0;
  return 0;
}

/* Lookups take a lean path for hits (hash, probe with prefetch, copy; no
 * pinning: a hit is copied out before anything can evict it) and gather
 * misses for chunk_resolve. */
static int sh_lookup_begin(emb_store *b, int64_t step, const emb_idset *ids, float *const *out) {
  (void)step;
  shstore *s = (shstore *)b;
  int rc = check_ids(s, ids, "lookup");
  if (rc) return s->last_lookup_rc = rc;
  uint64_t hits = 0, total = 0;
  size_t nm = 0;
  for (int t = 0; t < s->n_tables && !rc; t++) {
    const uint64_t *id = ids->ids[t];
    const size_t cnt = ids->counts[t], dim = (size_t)s->dim[t];
    float *o = out[t];
    total += cnt;
    /* Passes of SH_PASS ids: their map entries and slots, prefetched, are
     * still in L1/L2 when copied. */
    const size_t pass = s->chunk < SH_PASS ? s->chunk : SH_PASS;
    for (size_t base = 0; base < cnt && !rc; base += pass) {
      size_t n = cnt - base < pass ? cnt - base : pass;
      if (nm + n > s->chunk && (rc = lookup_flush_misses(s, &nm, out))) break;
      for (size_t i = 0; i < n; i++) s->it_pos[i] = home(s, (uint32_t)t, id[base + i]);
      for (size_t i = 0; i < n; i++) {
        if (i + SH_PREFETCH < n) __builtin_prefetch(&s->map[s->it_pos[i + SH_PREFETCH]], 0, 3);
        size_t h = probe(s, s->it_pos[i], (uint32_t)t, id[base + i]);
        uint32_t s1 = s->map[h].slot1;
        s->it_slot[i] = s1;
        if (s1) {
          const char *m = (const char *)slot_meta(s, s1 - 1);
          __builtin_prefetch(m, 1, 3);
          __builtin_prefetch(m + sizeof(sh_meta) + dim * sizeof(float) - 1, 0, 3);
        }
      }
      for (size_t i = 0; i < n; i++) {
        uint32_t s1 = s->it_slot[i];
        if (s1) {
          sh_meta *m = slot_meta(s, s1 - 1);
          if (!(m->flags & F_REF)) m->flags |= F_REF; /* hot rows' lines stay clean */
          memcpy(o + (base + i) * dim, (const float *)(m + 1), dim * sizeof(float));
          hits++;
        } else {
          s->ms_t[nm] = (uint32_t)t;
          s->ms_id[nm] = id[base + i];
          s->ms_r[nm] = base + i;
          nm++;
        }
      }
    }
  }
  if (!rc) rc = lookup_flush_misses(s, &nm, out);
  if (!rc) {
    s->st.lookups += total;
    s->st.hits += hits;
  }
  return s->last_lookup_rc = rc;
}

static int sh_lookup_wait(emb_store *b) { return ((shstore *)b)->last_lookup_rc; }

static int sh_flush(emb_store *b);

/* ---- clean-stop marks: DIR/shard-K.clean, written at a clean stop ---- */

static int mark_path(const shstore *s, int k, char *out, size_t n) {
  char db[SR_PATH_MAX];
  if (ckpt_dir_shard_path(s->dir, s->db_shard[k], db, sizeof db)) return SR_ERANGE;
  return sr_path(out, n, "%s" EMB_SHARD_CLEAN_SUFFIX, db) ? SR_ERANGE : 0;
}

/* Remove every hosted shard's mark (the rows are about to change). */
static int marks_remove(shstore *s) {
  for (int k = 0; k < s->n_db; k++) {
    char p[SR_PATH_MAX];
    if (mark_path(s, k, p, sizeof p)) {
      sr_fmt(s->err, sizeof s->err, "%s: path too long", s->dir);
      return SR_ERANGE;
    }
    if (unlink(p) && errno != ENOENT) {
      sr_fmt(s->err, sizeof s->err, "%s: cannot remove: %s", p, strerror(errno));
      return SR_EIO;
    }
  }
  s->marked = 0;
  return sr_fsync_dir(s->dir) ? SR_EIO : 0;
}

/* Whether database k holds a row of any table. */
static int db_has_rows(shstore *s, int k) {
  int any = 0;
  for (int t = 0; t < s->n_tables && !any; t++) {
    kv_iter *it = kv_iter_create(s->db[k], t);
    any = !it || kv_iter_valid(it); /* cannot tell: count it as rows */
    kv_iter_destroy(it);
  }
  return any;
}

/* At open: a hosted shard that holds rows but no mark was not stopped
 * cleanly; then every mark goes, before anything is written. */
static int marks_check(shstore *s) {
  for (int k = 0; k < s->n_db; k++) {
    char p[SR_PATH_MAX];
    if (mark_path(s, k, p, sizeof p)) {
      sr_fmt(s->err, sizeof s->err, "%s: path too long", s->dir);
      return SR_ERANGE;
    }
    if (!sr_is_file(p) && db_has_rows(s, k)) s->unclean = 1;
  }
  return marks_remove(s);
}

int emb_shard_mark_clean(emb_store *b) {
  if (!b || emb_store_kind_of(b) != EMB_STORE_SHARD) return SR_EINVAL;
  shstore *s = (shstore *)b;
  int rc = sh_flush(b);
  if (rc) return rc;
  for (int k = 0; k < s->n_db; k++) {
    char p[SR_PATH_MAX];
    if (mark_path(s, k, p, sizeof p)) return SR_ERANGE;
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int ok = fd >= 0 && write(fd, "clean\n", 6) == 6 && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    if (!ok) {
      sr_fmt(s->err, sizeof s->err, "%s: cannot write: %s", p, strerror(errno));
      return SR_EIO;
    }
  }
  if (sr_fsync_dir(s->dir)) return SR_EIO;
  s->marked = 1;
  return 0;
}

int emb_shard_unclean(const emb_store *b) {
  return b && emb_store_kind_of(b) == EMB_STORE_SHARD && ((const shstore *)b)->unclean;
}

static int sh_push(emb_store *b, int64_t step, float lr, const emb_idset *ids,
                   const float *const *grads) {
  (void)step;
  shstore *s = (shstore *)b;
  int rc = check_ids(s, ids, "push");
  if (rc) return rc;
  if (s->marked && (rc = marks_remove(s))) return rc;
  if (!emb_optim_lr_ok(lr)) {
    sr_fmt(s->err, sizeof s->err, "push: learning rate %g is outside [0, %g]", (double)lr,
           EMB_OPTIM_MAX_LR);
    return SR_ERANGE;
  }
  uint64_t hits = 0, total = 0;
  for (int t = 0; t < s->n_tables; t++) total += ids->counts[t];
  /* Applied whole or not at all: every row checked first (the check brings
   * rows into the cache, which changes no value). */
  check_ctx cc = {lr, grads, s->tmp, -1, 0};
  rc = for_chunks(s, ids, s->mitem + s->chunk, check_act, &cc, &hits);
  if (rc) return rc;
  if (cc.bad_t >= 0) {
    const emb_table *tb = &s->base.plan->tables[cc.bad_t];
    sr_fmt(s->err, sizeof s->err,
           "push: table %u (%s) row %llu: the update (learning rate %g) would leave the row or "
           "its optimizer state non-finite; nothing applied",
           tb->table_id, tb->name, (unsigned long long)cc.bad_id, (double)lr);
    return SR_ERANGE;
  }
  hits = 0;
  push_ctx c = {lr, grads};
  rc = for_chunks(s, ids, s->mitem + s->chunk, push_act, &c, &hits);
  if (!rc) s->st.pushes += total;
  return rc;
}

static int sh_flush(emb_store *b) {
  shstore *s = (shstore *)b;
  size_t pending = 0;
  for (uint32_t i = 0; i < s->used; i++)
    if (slot_meta(s, i)->flags & F_DIRTY) {
      writeback(s, i);
      if (++pending == WB_ROWS) {
        int rc = commit_all(s);
        if (rc) return rc;
        pending = 0;
      }
    }
  return commit_all(s);
}

static int open_dbs(shstore *s) {
  const emb_plan *plan = s->base.plan;
  uint32_t *ids = malloc((size_t)s->n_tables * sizeof *ids);
  if (!ids) return SR_ENOMEM;
  for (int t = 0; t < s->n_tables; t++) ids[t] = plan->tables[t].table_id;
  int rc = 0;
  for (int k = 0; k < s->n_db && !rc; k++) {
    if (s->db[k]) continue;
    char path[4096];
    if (ckpt_dir_shard_path(s->dir, s->db_shard[k], path, sizeof path)) {
      sr_fmt(s->err, sizeof s->err, "%s: path too long", s->dir);
      rc = SR_ERANGE;
      break;
    }
    rc = kv_open(path, s->n_tables, ids, &s->sopts, &s->db[k], s->err, sizeof s->err);
  }
  free(ids);
  return rc;
}

static void drop_cache(shstore *s) {
  memset(s->map, 0, (s->mask + 1) * sizeof *s->map);
  s->used = 0;
  s->hand = 0;
}

static int sh_checkpoint(emb_store *b, const char *path) {
  shstore *s = (shstore *)b;
  int rc = sh_flush(b);
  if (rc) return rc;
  if (mkdir(path, 0777) != 0 && errno != EEXIST) {
    sr_fmt(s->err, sizeof s->err, "checkpoint: %s: cannot create folder: %s", path, strerror(errno));
    return SR_EIO;
  }
  for (int k = 0; k < s->n_db; k++) {
    char dir[4096], e2[768];
    if (ckpt_dir_shard_path(path, s->db_shard[k], dir, sizeof dir)) {
      sr_fmt(s->err, sizeof s->err, "checkpoint: %s: path too long", path);
      return SR_ERANGE;
    }
    if ((rc = kv_checkpoint(s->db[k], dir, e2, sizeof e2))) {
      sr_fmt(s->err, sizeof s->err, "checkpoint: %s", e2);
      return rc;
    }
  }
  return 0;
}

static int sh_restore(emb_store *b, const char *path) {
  shstore *s = (shstore *)b;
  const emb_plan *plan = s->base.plan;
  /* Check every shard folder before touching anything. */
  for (int k = 0; k < s->n_db; k++) {
    char src[4096];
    if (ckpt_dir_shard_path(path, s->db_shard[k], src, sizeof src)) {
      sr_fmt(s->err, sizeof s->err, "restore: %s: path too long", path);
      return SR_ERANGE;
    }
    uint32_t *have;
    int n_have;
    char e2[512];
    int rc = kv_list_tables(src, &have, &n_have, e2, sizeof e2);
    if (rc) {
      sr_fmt(s->err, sizeof s->err, "restore: %s", e2);
      return SR_ENOTFOUND;
    }
    for (int t = 0; t < s->n_tables && !rc; t++) {
      int found = 0;
      for (int i = 0; i < n_have; i++) found |= have[i] == plan->tables[t].table_id;
      if (!found) {
        sr_fmt(s->err, sizeof s->err, "restore: %s: has no column family for table_id %u",
               src, plan->tables[t].table_id);
        rc = SR_EMISMATCH;
      }
    }
    free(have);
    if (rc) return rc;
  }
  drop_cache(s); /* the live rows are replaced, not written */
  for (int k = 0; k < s->n_db; k++) {
    char src[4096], dst[4096]; /* both fit: checked above and at open */
    ckpt_dir_shard_path(path, s->db_shard[k], src, sizeof src);
    ckpt_dir_shard_path(s->dir, s->db_shard[k], dst, sizeof dst);
    kv_close(s->db[k]);
    s->db[k] = NULL;
    if (sr_rmtree(dst)) {
      sr_fmt(s->err, sizeof s->err, "restore: %s: cannot remove", dst);
      return SR_EIO;
    }
    char e2[768];
    int rc = sr_copytree(src, dst, e2, sizeof e2);
    if (rc) {
      sr_fmt(s->err, sizeof s->err, "restore: %s", e2);
      return rc;
    }
  }
  int rc = open_dbs(s);
  if (!rc) s->unclean = 0; /* every row is the checkpoint's now */
  return rc;
}

static int sh_stats(emb_store *b, emb_store_stats *out) {
  shstore *s = (shstore *)b;
  *out = s->st;
  uint64_t rows = 0, bytes = 0;
  for (int k = 0; k < s->n_db; k++)
    for (int t = 0; t < s->n_tables; t++) {
      uint64_t r = kv_property(s->db[k], t, "rocksdb.estimate-num-keys");
      rows += r;
      bytes += r * 4 * (uint64_t)(s->dim[t] + s->slen[t]);
    }
  for (uint32_t i = 0; i < s->used; i++) {
    const sh_meta *m = slot_meta(s, i);
    if (m->flags & F_DIRTY) { /* an estimate: may already be on disk */
      rows++;
      bytes += 4 * (uint64_t)(s->dim[m->table] + s->slen[m->table]);
    }
  }
  out->rows = rows;
  out->bytes = bytes;
  return 0;
}

static int sh_iterate(emb_store *b, int table, emb_row_fn fn, void *ctx) {
  shstore *s = (shstore *)b;
  if (table < 0 || table >= s->n_tables) {
    sr_fmt(s->err, sizeof s->err, "iterate: table %d is out of range 0..%d", table, s->n_tables - 1);
    return SR_EINVAL;
  }
  int rc = sh_flush(b);
  if (rc) return rc;
  kv_iter **it = calloc((size_t)s->n_db, sizeof *it);
  if (!it) return SR_ENOMEM;
  for (int k = 0; k < s->n_db; k++)
    if (!(it[k] = kv_iter_create(s->db[k], table))) rc = SR_ENOMEM;
  int dim = s->dim[table], sl = s->slen[table];
  while (!rc) {
    int best = -1;
    uint64_t bk = 0;
    for (int k = 0; k < s->n_db; k++)
      if (kv_iter_valid(it[k]) && (best < 0 || kv_iter_key(it[k]) < bk)) {
        best = k;
        bk = kv_iter_key(it[k]);
      }
    if (best < 0) break;
    size_t len;
    const char *v = kv_iter_value(it[best], &len);
    char e2[256];
    if ((rc = kv_row_decode(v, len, dim, sl, s->tmp, e2, sizeof e2))) {
      char dp[4200];
      ckpt_dir_shard_path(s->dir, s->db_shard[best], dp, sizeof dp);
      sr_fmt(s->err, sizeof s->err, "iterate: %s: table %d row %llu: %s", dp, table,
             (unsigned long long)bk, e2);
      break;
    }
    if (fn(ctx, table, bk, s->tmp, dim, sl ? s->tmp + dim : NULL, sl)) break;
    kv_iter_next(it[best]);
  }
  for (int k = 0; k < s->n_db; k++) kv_iter_destroy(it[k]);
  free(it);
  return rc;
}

static const char *sh_errmsg(emb_store *b) { return ((shstore *)b)->err; }

static void sh_destroy(emb_store *b) {
  shstore *s = (shstore *)b;
  if (s->db) {
    for (int k = 0; k < s->n_db; k++) kv_close(s->db[k]);
  }
  free(s->db);
  free(s->db_shard);
  free(s->shard_db);
  free(s->dim);
  free(s->slen);
  free(s->slab);
  free(s->map);
  free(s->it_t);
  free(s->it_id);
  free(s->it_pos);
  free(s->it_slot);
  free(s->miss);
  free(s->mcf);
  free(s->mkey);
  free(s->mval);
  free(s->mlen);
  free(s->mitem);
  free(s->ms_t);
  free(s->ms_id);
  free(s->ms_r);
  free(s->tmp);
  free(s->enc);
  free(s->dir);
  free(s);
}

static const emb_store_ops shard_ops = {
    .kind = EMB_STORE_SHARD,
    .ckpt_layout = EMB_CKPT_SHARD_FOLDERS,
    .lookup_begin = sh_lookup_begin,
    .lookup_wait = sh_lookup_wait,
    .push = sh_push,
    .flush = sh_flush,
    .checkpoint = sh_checkpoint,
    .restore = sh_restore,
    .stats = sh_stats,
    .iterate = sh_iterate,
    .errmsg = sh_errmsg,
    .destroy = sh_destroy,
};

static int max_stride(const emb_plan *plan) {
  int m = 1;
  for (int t = 0; t < plan->n_tables; t++) {
    int st = plan->tables[t].dim + emb_optim_state_len(&plan->tables[t].optim, plan->tables[t].dim);
    if (st > m) m = st;
  }
  return m;
}

uint64_t emb_shard_rows_for_mb(const emb_plan *plan, uint64_t mb) {
  uint64_t per = ((sizeof(sh_meta) + 4 * (uint64_t)max_stride(plan) + 15) & ~15ULL) + 2 * sizeof(sh_entry) +
                 4 * sizeof(uint64_t); /* slot, map at load 1/2, chunk scratch */
  return (mb << 20) / per;
}

int emb_shard_counters_get(emb_store *b, emb_shard_counters *out) {
  if (!b || emb_store_kind_of(b) != EMB_STORE_SHARD) return SR_EINVAL;
  shstore *s = (shstore *)b;
  *out = s->ctr;
  out->cache_rows = s->cap;
  out->cache_used = s->used;
  return 0;
}

int emb_shard_kv_figures_get(emb_store *b, kv_figures *out) {
  if (!b || emb_store_kind_of(b) != EMB_STORE_SHARD) return SR_EINVAL;
  shstore *s = (shstore *)b;
  kv_figures sum = {0};
  for (int k = 0; k < s->n_db; k++) {
    kv_figures f;
    if (!s->db[k] || kv_figures_get(s->db[k], &f)) continue;
    sum.sst_bytes += f.sst_bytes;
    sum.pending_compaction_bytes += f.pending_compaction_bytes;
    sum.block_cache_hits += f.block_cache_hits;
    sum.block_cache_misses += f.block_cache_misses;
  }
  *out = sum;
  return 0;
}

emb_store *emb_store_create_shard(const emb_plan *plan, const char *data_dir,
                                  const emb_shard_config *cfg, char *err, size_t errlen) {
  if (emb_plan_validate(plan, "plan", err, errlen)) return NULL;
  if (!data_dir || !cfg) {
    sr_fmt(err, errlen, "shard store: missing data folder or configuration");
    return NULL;
  }
  if (plan->n_tables > 65535) {
    sr_fmt(err, errlen, "shard store: at most 65535 tables");
    return NULL;
  }
  uint64_t rows = cfg->cache_rows ? cfg->cache_rows
                                  : emb_shard_rows_for_mb(plan, cfg->cache_mb ? cfg->cache_mb
                                                                             : EMB_SHARD_DEFAULT_CACHE_MB);
  if (rows < EMB_SHARD_MIN_CACHE_ROWS || rows > 0x7fffffffULL) {
    sr_fmt(err, errlen, "shard store: a cache of %llu rows%s: need %d..2^31-1 rows (a %s --cache-mb)",
           (unsigned long long)rows, cfg->cache_rows ? "" : " (--cache-mb over this plan's rows)",
           EMB_SHARD_MIN_CACHE_ROWS, rows < EMB_SHARD_MIN_CACHE_ROWS ? "bigger" : "smaller");
    return NULL;
  }
  if (sr_mkdirs(data_dir) != 0) {
    sr_fmt(err, errlen, "shard store: %s: cannot create folder: %s", data_dir, strerror(errno));
    return NULL;
  }
  shstore *s = calloc(1, sizeof *s);
  if (!s) goto nomem;
  s->base.ops = &shard_ops;
  s->base.plan = plan;
  s->n_tables = plan->n_tables;
  s->dim = calloc((size_t)s->n_tables, sizeof *s->dim);
  s->slen = calloc((size_t)s->n_tables, sizeof *s->slen);
  s->dir = strdup(data_dir);
  if (!s->dim || !s->slen || !s->dir) goto nomem;
  for (int t = 0; t < s->n_tables; t++) {
    s->dim[t] = plan->tables[t].dim;
    s->slen[t] = emb_optim_state_len(&plan->tables[t].optim, s->dim[t]);
  }
  s->stride = max_stride(plan);
  s->slot_bytes = (sizeof(sh_meta) + 4 * (size_t)s->stride + 15) & ~(size_t)15; /* aligned slots */
  s->cap = (uint32_t)rows;
  size_t mcap = 64;
  while (mcap < 2 * (size_t)rows) mcap <<= 1;
  s->mask = mcap - 1;
  s->map = calloc(mcap, sizeof *s->map);
  s->slab = malloc((size_t)s->cap * s->slot_bytes);
  if (s->map) sr_advise_huge(s->map, mcap * sizeof *s->map);
  if (s->slab) sr_advise_huge(s->slab, (size_t)s->cap * s->slot_bytes);
  s->chunk = s->cap / 2;
  if (s->chunk > 65536) s->chunk = 65536;
  size_t c = s->chunk;
  s->it_t = malloc(c * sizeof *s->it_t);
  s->it_id = malloc(c * sizeof *s->it_id);
  s->it_pos = malloc(c * sizeof *s->it_pos);
  s->it_slot = malloc(c * sizeof *s->it_slot);
  s->miss = malloc(c * sizeof *s->miss);
  s->mcf = malloc(c * sizeof *s->mcf);
  s->mkey = malloc(c * sizeof *s->mkey);
  s->mval = malloc(c * sizeof *s->mval);
  s->mlen = malloc(c * sizeof *s->mlen);
  s->mitem = malloc(2 * c * sizeof *s->mitem); /* second half: the chunk's row indices */
  s->ms_t = malloc(c * sizeof *s->ms_t);
  s->ms_id = malloc(c * sizeof *s->ms_id);
  s->ms_r = malloc(c * sizeof *s->ms_r);
  s->tmp = malloc(4 * (size_t)s->stride);
  s->enc = malloc(KV_ROW_HEADER + 4 * (size_t)s->stride);
  if (!s->map || !s->slab || !s->it_t || !s->it_id || !s->it_pos || !s->it_slot || !s->miss ||
      !s->mcf || !s->mkey || !s->mval || !s->mlen || !s->mitem || !s->ms_t || !s->ms_id || !s->ms_r || !s->tmp || !s->enc)
    goto nomem;
  /* Hosted shards. */
  s->shard_db = malloc((size_t)plan->n_shards * sizeof *s->shard_db);
  if (!s->shard_db) goto nomem;
  for (int k = 0; k < plan->n_shards; k++) s->shard_db[k] = -1;
  s->n_db = cfg->n_hosted ? cfg->n_hosted : plan->n_shards;
  s->db_shard = malloc((size_t)s->n_db * sizeof *s->db_shard);
  s->db = calloc((size_t)s->n_db, sizeof *s->db);
  if (!s->db_shard || !s->db) goto nomem;
  for (int k = 0; k < s->n_db; k++) {
    int sh = cfg->n_hosted ? cfg->hosted[k] : k;
    if (sh < 0 || sh >= plan->n_shards || s->shard_db[sh] >= 0) {
      sr_fmt(err, errlen, "shard store: hosted shard %d is not a distinct shard 0..%d of the plan", sh,
             plan->n_shards - 1);
      sh_destroy(&s->base);
      return NULL;
    }
    s->db_shard[k] = sh;
    s->shard_db[sh] = k;
  }
  s->sopts.block_cache_bytes = cfg->block_cache_bytes;
  s->sopts.write_buffer_bytes = cfg->write_buffer_bytes;
  s->sopts.compression = cfg->lz4 ? KV_COMPRESSION_LZ4 : KV_COMPRESSION_NONE;
  s->sopts.statistics = cfg->statistics;
  if (open_dbs(s) || marks_check(s)) {
    sr_fmt(err, errlen, "shard store: %s", s->err);
    sh_destroy(&s->base);
    return NULL;
  }
  return &s->base;
nomem:
  sr_fmt(err, errlen, "shard store: out of memory");
  if (s) sh_destroy(&s->base);
  return NULL;
}
