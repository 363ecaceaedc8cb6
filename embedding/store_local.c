/* The in-process embedding store: every row of every table in memory.
 *
 * Per table, an index from row_id to a slot, and a slab of slots holding
 * the row's value (dim floats) then its optimizer state. The index of an
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
 * Checkpoint: one file per table, DIR/table-<table_id>.bin, written to a
 * temporary name and renamed into place. Little-endian:
 *   header (256 bytes): magic "SREMBTAB", u32 version (1), u32 header bytes,
 *     u32 table_id, u32 dim, u32 state_len, u32 optimizer kind,
 *     u64 n_rows, u64 record bytes, char[64] model fingerprint (hex),
 *     zeros to 256 (reserved);
 *   n_rows records in ascending row id: u64 row_id, float value[dim],
 *     float state[state_len];
 *   trailer: SHA-256 of header and records (32 bytes).
 * Restore checks the size, the header against the plan and the checksum
 * before replacing anything. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/sha256.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "embedding/store.h"

#define LT_EMPTY 0u /* entry.slot1 of a free entry; slots are stored plus one */
#define LT_MAX_ROWS 0x7ffffffeu /* slot + 1 fits 31 bits: push marks new rows with bit 31 */
#define LT_DIRECT_MAX (1ULL << 28) /* 1 GiB of index at most, touched lazily */
#define LT_PREFETCH 32 /* ids ahead: enough misses in flight to hide DRAM latency */
#define CK_MAGIC "SREMBTAB"
#define CK_VERSION 1u
#define CK_HEADER 256u

typedef struct {
  uint64_t key;
  uint32_t slot1; /* slot + 1; LT_EMPTY when free (so calloc'd pages are an empty map) */
  uint32_t pad;
} lt_entry;

typedef struct {
  int dim, slen, stride; /* stride = dim + slen floats per slot */
  uint64_t rows;         /* EMB_ROWS_UNBOUNDED or the bound */
  lt_entry *map;         /* [mask+1], zeroed lazily by calloc; NULL when direct */
  uint32_t *direct;      /* bounded tables up to LT_DIRECT_MAX rows: [rows] slot + 1
                            indexed by row id (one access, no probing); else NULL */
  size_t mask;
  size_t n;              /* rows stored = slots used */
  float *slab;           /* [slab_cap][stride] */
  size_t slab_cap;
} ltab;

typedef struct {
  emb_store base;
  int n;
  ltab *t; /* [n] */
  /* Scratch of the batched passes, grown to the largest per-table count. */
  size_t scratch_cap;
  size_t *pos;    /* [scratch_cap] map position of ids[r] */
  uint32_t *slot; /* [scratch_cap] slot + 1 of ids[r] (0: not stored) */
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
  t->map = NULL;
  t->slab = NULL;
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

static inline float *lt_row(const ltab *t, uint32_t slot1) {
  return t->slab + (size_t)(slot1 - 1) * (size_t)t->stride;
}

static int lt_init(ltab *t, int dim, int slen, uint64_t rows, size_t cap_rows) {
  memset(t, 0, sizeof *t);
  t->dim = dim;
  t->slen = slen;
  t->stride = dim + slen;
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
  t->slab = malloc(t->slab_cap * (size_t)t->stride * sizeof(float));
  if ((!t->map && !t->direct) || !t->slab) {
    lt_free(t);
    return SR_ENOMEM;
  }
  sr_advise_huge(t->slab, t->slab_cap * (size_t)t->stride * sizeof(float));
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
    float *nb = realloc(t->slab, cap * (size_t)t->stride * sizeof(float));
    if (!nb) return SR_ENOMEM;
    t->slab = nb;
    t->slab_cap = cap;
    sr_advise_huge(nb, cap * (size_t)t->stride * sizeof(float));
  }
  return 0;
}

/* Insert key (absent, room reserved) at map position h; returns slot + 1. */
static inline uint32_t lt_insert_at(ltab *t, size_t h, uint64_t key) {
  uint32_t s1 = (uint32_t)++t->n;
  if (t->direct) {
    t->direct[h] = s1;
  } else {
    t->map[h].key = key;
    t->map[h].slot1 = s1;
  }
  return s1;
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
    if (slot[r]) __builtin_prefetch(lt_row(t, slot[r]), 1, 3);
  }
}

static int l_lookup_begin(emb_store *b, int64_t step, const emb_idset *ids, float *const *out) {
  (void)step;
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
    for (size_t r = 0; r < cnt; r++) {
      float *dst = o + r * dim;
      if (slot[r]) {
        memcpy(dst, lt_row(t, slot[r]), dim * sizeof(float));
        hits++;
      } else {
        emb_row_init(s->base.plan, ti, id[r], dst);
      }
    }
    total += cnt;
  }
  s->st.lookups += total;
  s->st.hits += hits;
  return s->last_lookup_rc = 0;
}

static int l_lookup_wait(emb_store *b) { return ((lstore *)b)->last_lookup_rc; }

static int l_push(emb_store *b, int64_t step, float lr, const emb_idset *ids,
                  const float *const *grads) {
  (void)step;
  lstore *s = (lstore *)b;
  int rc = check_ids(s, ids, "push");
  if (rc) return rc;
  for (int ti = 0; ti < s->n; ti++)
    if ((rc = lt_reserve(&s->t[ti], ids->counts[ti])) || (rc = scratch_reserve(s, ids->counts[ti]))) {
      sr_fmt(s->err, sizeof s->err, "push: table %d: %s", ti, sr_strerror(rc));
      return rc;
    }
  const emb_plan *plan = s->base.plan;
  uint64_t total = 0;
  for (int ti = 0; ti < s->n; ti++) {
    ltab *t = &s->t[ti];
    const emb_optim_cfg *oc = &plan->tables[ti].optim;
    const uint64_t *id = ids->ids[ti];
    const size_t cnt = ids->counts[ti];
    const int dim = t->dim;
    const float *g = grads[ti];
    resolve(s, t, id, cnt);
    uint32_t *slot = s->slot;
    /* Insert the missing rows, in id order (a repeated id finds its first
     * insertion: pos[] may be stale after an insert, so probe again). */
    for (size_t r = 0; r < cnt; r++) {
      if (slot[r]) continue;
      size_t h = lt_probe(t, s->pos[r], id[r]);
      if (lt_slot_at(t, h)) {
        slot[r] = lt_slot_at(t, h);
        continue;
      }
      slot[r] = lt_insert_at(t, h, id[r]) | 0x80000000u; /* new: init below */
    }
    for (size_t r = 0; r < cnt; r++) {
      float *row = lt_row(t, slot[r] & 0x7fffffffu);
      if (slot[r] & 0x80000000u) {
        emb_row_init(plan, ti, id[r], row);
        emb_optim_state_init(oc, dim, row + dim);
      }
      emb_optim_apply(oc, dim, lr, g + r * (size_t)dim, row, t->slen ? row + dim : NULL);
    }
    total += cnt;
  }
  s->st.pushes += total;
  return 0;
}

static int l_flush(emb_store *b) {
  (void)b;
  return 0;
}

static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static int write_table(lstore *s, int ti, const char *dir) {
  const ltab *t = &s->t[ti];
  uint32_t tid = s->base.plan->tables[ti].table_id;
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/table-%u.bin", dir, tid);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  uint64_t *keys;
  int rc = lt_sorted_keys(t, &keys);
  if (rc) {
    sr_fmt(s->err, sizeof s->err, "checkpoint: out of memory");
    return rc;
  }
  unsigned char hdr[CK_HEADER];
  const size_t rec = 8 + 4 * (size_t)t->stride;
  memset(hdr, 0, sizeof hdr);
  memcpy(hdr, CK_MAGIC, 8);
  put32(hdr + 8, CK_VERSION);
  put32(hdr + 12, CK_HEADER);
  put32(hdr + 16, tid);
  put32(hdr + 20, (uint32_t)t->dim);
  put32(hdr + 24, (uint32_t)t->slen);
  put32(hdr + 28, (uint32_t)s->base.plan->tables[ti].optim.kind);
  put64(hdr + 32, (uint64_t)t->n);
  put64(hdr + 40, (uint64_t)rec);
  memcpy(hdr + 48, s->model_fp, 64);
  FILE *f = fopen(tmp, "wb");
  sr_sha256_ctx md = {0};
  unsigned char *buf = malloc(rec * 1024);
  if (!f || !buf || (rc = sr_sha256_init(&md))) {
    sr_fmt(s->err, sizeof s->err, "checkpoint: %s: %s", tmp, f ? sr_strerror(rc ? rc : SR_ENOMEM) : strerror(errno));
    rc = f ? (rc ? rc : SR_ENOMEM) : SR_EIO;
    goto out;
  }
  int bad = fwrite(hdr, 1, sizeof hdr, f) != sizeof hdr;
  sr_sha256_update(&md, hdr, sizeof hdr); /* a failure is reported by final */
  size_t fill = 0;
  for (size_t i = 0; i < t->n && !bad; i++) {
    const float *row = lt_row(t, lt_slot_at(t, lt_find(t, keys[i])));
    unsigned char *p = buf + fill * rec;
    put64(p, keys[i]);
    memcpy(p + 8, row, 4 * (size_t)t->stride);
    if (++fill == 1024 || i + 1 == t->n) {
      sr_sha256_update(&md, buf, fill * rec);
      bad |= fwrite(buf, 1, fill * rec, f) != fill * rec;
      fill = 0;
    }
  }
  unsigned char dig[32];
  bad |= sr_sha256_final(&md, dig) != 0;
  bad |= fwrite(dig, 1, 32, f) != 32;
  bad |= fflush(f) != 0;
  bad |= fsync(fileno(f)) != 0;
  bad |= fclose(f) != 0;
  f = NULL;
  if (bad || rename(tmp, path) != 0) {
    sr_fmt(s->err, sizeof s->err, "checkpoint: %s: cannot write: %s", path, strerror(errno));
    unlink(tmp);
    rc = SR_EIO;
  }
out:
  if (f) {
    fclose(f);
    unlink(tmp);
  }
  sr_sha256_abort(&md);
  free(buf);
  free(keys);
  return rc;
}

static int l_checkpoint(emb_store *b, const char *path) {
  lstore *s = (lstore *)b;
  if (mkdir(path, 0777) != 0 && errno != EEXIST) {
    sr_fmt(s->err, sizeof s->err, "checkpoint: %s: cannot create folder: %s", path, strerror(errno));
    return SR_EIO;
  }
  for (int ti = 0; ti < s->n; ti++) {
    int rc = write_table(s, ti, path);
    if (rc) return rc;
  }
  return 0;
}

/* Read DIR/table-<id>.bin into a fresh ltab nt. */
static int read_table(lstore *s, int ti, const char *dir, ltab *nt) {
  const emb_table *pt = &s->base.plan->tables[ti];
  const ltab *cur = &s->t[ti];
  char path[4096];
  snprintf(path, sizeof path, "%s/table-%u.bin", dir, pt->table_id);
  memset(nt, 0, sizeof *nt);
  FILE *f = fopen(path, "rb");
  if (!f) {
    sr_fmt(s->err, sizeof s->err, "restore: %s: cannot open: %s", path, strerror(errno));
    return errno == ENOENT ? SR_ENOTFOUND : SR_EIO;
  }
  int rc = 0;
  unsigned char hdr[CK_HEADER], *buf = NULL;
  sr_sha256_ctx md = {0};
  struct stat stt;
  if (fstat(fileno(f), &stt) != 0 || (size_t)stt.st_size < CK_HEADER + 32 ||
      fread(hdr, 1, CK_HEADER, f) != CK_HEADER) {
    sr_fmt(s->err, sizeof s->err, "restore: %s: too short to be a table file (torn write?)", path);
    rc = SR_EFORMAT;
    goto out;
  }
  if (memcmp(hdr, CK_MAGIC, 8) != 0) {
    sr_fmt(s->err, sizeof s->err, "restore: %s: not a shardrec embedding table file (bad magic)", path);
    rc = SR_EFORMAT;
    goto out;
  }
  if (get32(hdr + 8) != CK_VERSION || get32(hdr + 12) != CK_HEADER) {
    sr_fmt(s->err, sizeof s->err, "restore: %s: format version %u is not supported (this build reads %u)",
           path, get32(hdr + 8), CK_VERSION);
    rc = SR_EVERSION;
    goto out;
  }
  uint64_t n = get64(hdr + 32), rec = get64(hdr + 40);
  if (get32(hdr + 16) != pt->table_id || get32(hdr + 20) != (uint32_t)cur->dim ||
      get32(hdr + 24) != (uint32_t)cur->slen || get32(hdr + 28) != (uint32_t)pt->optim.kind ||
      rec != 8 + 4 * (uint64_t)cur->stride) {
    sr_fmt(s->err, sizeof s->err,
           "restore: %s: holds table_id %u dim %u state %u, the plan wants table_id %u dim %d state %d",
           path, get32(hdr + 16), get32(hdr + 20), get32(hdr + 24), pt->table_id, cur->dim, cur->slen);
    rc = SR_EMISMATCH;
    goto out;
  }
  if (memcmp(hdr + 48, s->model_fp, 64) != 0) {
    sr_fmt(s->err, sizeof s->err, "restore: %s: written under model fingerprint %.12s..., this plan's is %.12s...",
           path, (const char *)(hdr + 48), s->model_fp);
    rc = SR_EMISMATCH;
    goto out;
  }
  if (n > LT_MAX_ROWS || (uint64_t)stt.st_size != CK_HEADER + n * rec + 32) {
    sr_fmt(s->err, sizeof s->err, "restore: %s: size %lld, expected %llu for %llu rows (torn or truncated file)",
           path, (long long)stt.st_size, (unsigned long long)(CK_HEADER + n * rec + 32),
           (unsigned long long)n);
    rc = SR_EFORMAT;
    goto out;
  }
  if ((rc = lt_init(nt, cur->dim, cur->slen, cur->rows, (size_t)n))) {
    sr_fmt(s->err, sizeof s->err, "restore: out of memory");
    goto out;
  }
  buf = malloc(rec * 1024);
  if (!buf || (rc = sr_sha256_init(&md))) {
    rc = buf ? rc : SR_ENOMEM;
    sr_fmt(s->err, sizeof s->err, "restore: %s", sr_strerror(rc));
    goto out;
  }
  sr_sha256_update(&md, hdr, CK_HEADER); /* a failure is reported by final */
  uint64_t prev = 0;
  for (uint64_t done = 0; done < n;) {
    size_t m = n - done < 1024 ? (size_t)(n - done) : 1024;
    if (fread(buf, rec, m, f) != m) {
      sr_fmt(s->err, sizeof s->err, "restore: %s: read error", path);
      rc = SR_EIO;
      goto out;
    }
    sr_sha256_update(&md, buf, m * rec);
    for (size_t i = 0; i < m; i++) {
      const unsigned char *p = buf + i * rec;
      uint64_t key = get64(p);
      if ((done + i > 0 && key <= prev) || (cur->rows != EMB_ROWS_UNBOUNDED && key >= cur->rows)) {
        sr_fmt(s->err, sizeof s->err, "restore: %s: record %llu: row id %llu out of order or range", path,
               (unsigned long long)(done + i), (unsigned long long)key);
        rc = SR_EFORMAT; /* reported after the checksum check below if that fails first */
      }
      prev = key;
      size_t h = lt_find(nt, key);
      if (lt_slot_at(nt, h) == LT_EMPTY) memcpy(lt_row(nt, lt_insert_at(nt, h, key)), p + 8, rec - 8);
    }
    done += m;
  }
  unsigned char dig[32], want[32];
  if (sr_sha256_final(&md, dig) != 0) {
    sr_fmt(s->err, sizeof s->err, "restore: %s: SHA-256 failed", path);
    rc = SR_EBACKEND;
  } else if (fread(want, 1, 32, f) != 32 || memcmp(dig, want, 32) != 0) {
    sr_fmt(s->err, sizeof s->err, "restore: %s: checksum mismatch (file damaged)", path);
    rc = SR_ECHECKSUM;
  }
out:
  if (rc) lt_free(nt);
  sr_sha256_abort(&md);
  free(buf);
  fclose(f);
  return rc;
}

static int l_restore(emb_store *b, const char *path) {
  lstore *s = (lstore *)b;
  ltab *nt = calloc((size_t)s->n, sizeof *nt);
  if (!nt) {
    sr_fmt(s->err, sizeof s->err, "restore: out of memory");
    return SR_ENOMEM;
  }
  for (int ti = 0; ti < s->n; ti++) {
    int rc = read_table(s, ti, path, &nt[ti]);
    if (rc) {
      for (int k = 0; k < ti; k++) lt_free(&nt[k]);
      free(nt);
      return rc;
    }
  }
  for (int ti = 0; ti < s->n; ti++) lt_free(&s->t[ti]);
  free(s->t);
  s->t = nt;
  return 0;
}

static int l_stats(emb_store *b, emb_store_stats *out) {
  lstore *s = (lstore *)b;
  uint64_t rows = 0, bytes = 0;
  for (int ti = 0; ti < s->n; ti++) {
    rows += s->t[ti].n;
    bytes += (uint64_t)s->t[ti].n * (uint64_t)s->t[ti].stride * 4;
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
    const float *row = lt_row(t, lt_slot_at(t, lt_find(t, keys[i])));
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
  free(s);
}

static const emb_store_ops local_ops = {
    l_lookup_begin, l_lookup_wait, l_push,    l_flush,  l_checkpoint,
    l_restore,      l_stats,       l_iterate, l_errmsg, l_destroy,
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
    if (lt_init(&s->t[ti], pt->dim, emb_optim_state_len(&pt->optim, pt->dim), pt->rows, 0)) goto nomem;
  }
  if (emb_plan_model_fingerprint(plan, s->model_fp)) goto nomem;
  return &s->base;
nomem:
  sr_fmt(err, errlen, "local store: out of memory");
  if (s) l_destroy(&s->base);
  return NULL;
}
