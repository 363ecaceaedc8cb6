/* Bounded tables: the entries and the step-boundary decisions (keep.h).
 *
 * Per bounded table: a slab of entries, an open-addressing map (linear
 * probing, backward-shift deletion) from row id to entry, and two lists in
 * (last, row id) order, one of ids counting toward admission and one of
 * admitted ids: keep_observe visits a batch's ids in ascending order and
 * moves each to its list's tail, so a list's head is always the oldest
 * last, lowest id first. Expiry and lru take heads; lfu sorts the admitted
 * ids when there are more than capacity. */
#include "train/keep.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/outfile.h"
#include "common/rng.h"
#include "common/sha256.h"
#include "common/status.h"

#define KEEP_MAGIC "SRKEEP01"
#define KEEP_VERSION 1u
#define NIL 0u /* list links and map slots hold index + 1 */

typedef struct {
  uint64_t id, count;
  int64_t last;
  uint32_t prev, next; /* index + 1 in its list; NIL at the ends */
  uint32_t admitted;   /* 1: in the admitted list, else counting */
} kentry;

typedef struct {
  int on;
  emb_keep_cfg cfg;
  kentry *e;           /* [cap] */
  size_t used, cap;    /* entries made (live or free); slab size */
  uint32_t free1;      /* a free entry + 1, chained through next; NIL: none */
  uint32_t *map;       /* [mask + 1] entry + 1; NIL: empty */
  size_t mask, live;
  uint32_t head[2], tail[2]; /* [0] counting, [1] admitted */
  size_t n_list[2];
  keep_table_stats st;
  uint64_t *out;       /* [out_cap] the last decision's removed ids */
  size_t out_n, out_cap;
} ktab;

struct keep {
  const emb_plan *plan; /* borrowed */
  int n;
  ktab *t;              /* [n] */
  uint64_t *scratch;    /* a batch's ids of one table, sorted */
  size_t scratch_cap;
  const uint64_t **out_ids; /* [n] */
  size_t *out_counts;       /* [n] */
};

int keep_plan_on(const emb_plan *plan) {
  for (int i = 0; i < plan->n_tables; i++)
    if (emb_keep_on(&plan->tables[i])) return 1;
  return 0;
}

/* ---- map and lists ---- */

static size_t find_pos(const ktab *t, uint64_t id) {
  size_t h = (size_t)sr_mix64(id) & t->mask;
  while (t->map[h] != NIL && t->e[t->map[h] - 1].id != id) h = (h + 1) & t->mask;
  return h;
}

static int map_grow(ktab *t) {
  size_t cap = t->map ? (t->mask + 1) * 2 : 1024;
  uint32_t *m = calloc(cap, sizeof *m);
  if (!m) return SR_ENOMEM;
  for (size_t i = 0; t->map && i <= t->mask; i++) {
    if (t->map[i] == NIL) continue;
    size_t h = (size_t)sr_mix64(t->e[t->map[i] - 1].id) & (cap - 1);
    while (m[h] != NIL) h = (h + 1) & (cap - 1);
    m[h] = t->map[i];
  }
  free(t->map);
  t->map = m;
  t->mask = cap - 1;
  return 0;
}

/* Room for extra more entries, map and slab. */
static int reserve(ktab *t, size_t extra) {
  if (!t->map || 2 * (t->live + extra) > t->mask + 1) {
    while (!t->map || 2 * (t->live + extra) > t->mask + 1)
      if (map_grow(t)) return SR_ENOMEM;
  }
  if (t->used + extra > t->cap) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->used + extra) cap *= 2;
    kentry *e = realloc(t->e, cap * sizeof *e);
    if (!e) return SR_ENOMEM;
    t->e = e;
    t->cap = cap;
  }
  return 0;
}

static void unlink_entry(ktab *t, uint32_t i1) {
  kentry *e = &t->e[i1 - 1];
  int l = (int)e->admitted;
  if (e->prev) t->e[e->prev - 1].next = e->next;
  else t->head[l] = e->next;
  if (e->next) t->e[e->next - 1].prev = e->prev;
  else t->tail[l] = e->prev;
  t->n_list[l]--;
}

static void append(ktab *t, uint32_t i1) {
  kentry *e = &t->e[i1 - 1];
  int l = (int)e->admitted;
  e->prev = t->tail[l];
  e->next = NIL;
  if (t->tail[l]) t->e[t->tail[l] - 1].next = i1;
  else t->head[l] = i1;
  t->tail[l] = i1;
  t->n_list[l]++;
}

/* A new entry for id at map position h (room reserved). */
static uint32_t insert(ktab *t, size_t h, uint64_t id) {
  uint32_t i1 = t->free1;
  if (i1) t->free1 = t->e[i1 - 1].next;
  else i1 = (uint32_t)++t->used;
  t->e[i1 - 1] = (kentry){.id = id};
  t->map[h] = i1;
  t->live++;
  append(t, i1);
  return i1;
}

/* Forget entry i1: off its list and the map, onto the free chain. */
static void drop(ktab *t, uint32_t i1) {
  unlink_entry(t, i1);
  size_t gap = find_pos(t, t->e[i1 - 1].id), j = gap;
  for (;;) {
    j = (j + 1) & t->mask;
    if (t->map[j] == NIL) break;
    size_t home = (size_t)sr_mix64(t->e[t->map[j] - 1].id) & t->mask;
    if (((j - home) & t->mask) >= ((j - gap) & t->mask)) {
      t->map[gap] = t->map[j];
      gap = j;
    }
  }
  t->map[gap] = NIL;
  t->live--;
  t->e[i1 - 1].next = t->free1;
  t->free1 = i1;
}

/* ---- create ---- */

static void ktab_free(ktab *t) {
  free(t->e);
  free(t->map);
  free(t->out);
  memset(t, 0, sizeof *t);
}

keep *keep_create(const emb_plan *plan, char *err, size_t errlen) {
  keep *k = calloc(1, sizeof *k);
  if (k) {
    k->plan = plan;
    k->n = plan->n_tables;
    k->t = calloc((size_t)k->n, sizeof *k->t);
    k->out_ids = calloc((size_t)k->n, sizeof *k->out_ids);
    k->out_counts = calloc((size_t)k->n, sizeof *k->out_counts);
  }
  if (!k || !k->t || !k->out_ids || !k->out_counts) {
    keep_destroy(k);
    sr_fmt(err, errlen, "bounded tables: out of memory");
    return NULL;
  }
  for (int i = 0; i < k->n; i++) {
    k->t[i].on = emb_keep_on(&plan->tables[i]);
    k->t[i].cfg = plan->tables[i].keep;
    if (!k->t[i].cfg.admit_window) k->t[i].cfg.admit_window = EMB_KEEP_WINDOW_DEFAULT;
  }
  return k;
}

void keep_destroy(keep *k) {
  if (!k) return;
  for (int i = 0; k->t && i < k->n; i++) ktab_free(&k->t[i]);
  free(k->t);
  free(k->scratch);
  free(k->out_ids);
  free(k->out_counts);
  free(k);
}

/* ---- steps ---- */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* One table's ids of the batch (sorted into k->scratch, n of them). */
static void observe_table(keep *k, ktab *t, const uint64_t *ids, size_t n, int64_t step) {
  memcpy(k->scratch, ids, n * sizeof *ids);
  qsort(k->scratch, n, sizeof *k->scratch, cmp_u64);
  uint64_t f = t->cfg.admit_after > 1 ? t->cfg.admit_after : 1;
  for (size_t a = 0, b; a < n; a = b) {
    for (b = a + 1; b < n && k->scratch[b] == k->scratch[a];) b++;
    size_t h = find_pos(t, k->scratch[a]);
    uint32_t i1 = t->map[h] != NIL ? t->map[h] : insert(t, h, k->scratch[a]);
    kentry *e = &t->e[i1 - 1];
    unlink_entry(t, i1);
    e->count += b - a;
    e->last = step;
    if (!e->admitted && e->count >= f) {
      e->admitted = 1;
      t->st.admitted++;
    } else if (!e->admitted) {
      t->st.refused++;
    }
    append(t, i1);
  }
}

int keep_observe(keep *k, const ds_batch *b, int64_t step) {
  for (int f = 0; f < k->n; f++) {
    ktab *t = &k->t[f];
    if (!t->on || b->n <= 0) continue;
    const uint32_t *off = ds_batch_offsets(b, f);
    size_t n = off[b->n] - off[0];
    if (n > k->scratch_cap) {
      uint64_t *s = realloc(k->scratch, n * sizeof *s);
      if (!s) return SR_ENOMEM;
      k->scratch = s;
      k->scratch_cap = n;
    }
    if (reserve(t, n)) return SR_ENOMEM;
  }
  for (int f = 0; f < k->n; f++) {
    ktab *t = &k->t[f];
    if (!t->on || b->n <= 0) continue;
    const uint32_t *off = ds_batch_offsets(b, f);
    observe_table(k, t, b->ids + off[0], off[b->n] - off[0], step);
  }
  return 0;
}

int keep_has_row(const keep *k, int table, uint64_t id) {
  const ktab *t = &k->t[table];
  if (!t->on) return 1;
  if (!t->map) return 0;
  uint32_t i1 = t->map[find_pos(t, id)];
  return i1 != NIL && t->e[i1 - 1].admitted;
}

/* An admitted entry's lfu score: fewest samples first, then the oldest
 * last, then row id. */
typedef struct {
  uint64_t count;
  int64_t last;
  uint64_t id;
  uint32_t i1;
} lfu_key;

static int cmp_lfu(const void *a, const void *b) {
  const lfu_key *x = a, *y = b;
  if (x->count != y->count) return x->count < y->count ? -1 : 1;
  if (x->last != y->last) return x->last < y->last ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* Remove admitted entry i1 and note its id. */
static void evict(ktab *t, uint32_t i1) {
  t->out[t->out_n++] = t->e[i1 - 1].id;
  drop(t, i1);
}

/* Capacity under lfu: the admitted entries sorted, the first ones out. */
static int evict_lfu(ktab *t, size_t over) {
  size_t n = t->n_list[1], m = 0;
  lfu_key *v = malloc(n * sizeof *v);
  if (!v) return SR_ENOMEM;
  for (uint32_t i1 = t->head[1]; i1; i1 = t->e[i1 - 1].next) {
    const kentry *e = &t->e[i1 - 1];
    v[m++] = (lfu_key){e->count, e->last, e->id, i1};
  }
  qsort(v, m, sizeof *v, cmp_lfu);
  for (size_t i = 0; i < over; i++) evict(t, v[i].i1);
  free(v);
  return 0;
}

static int decide_table(ktab *t, int64_t step) {
  t->out_n = 0;
  size_t most = t->n_list[1];
  if (most > t->out_cap) {
    uint64_t *o = realloc(t->out, most * sizeof *o);
    if (!o) return SR_ENOMEM;
    t->out = o;
    t->out_cap = most;
  }
  int64_t w = (int64_t)t->cfg.admit_window, x = (int64_t)t->cfg.expire_after;
  while (t->head[0] && t->e[t->head[0] - 1].last <= step - w) drop(t, t->head[0]);
  while (x > 0 && t->head[1] && t->e[t->head[1] - 1].last <= step - x) {
    evict(t, t->head[1]);
    t->st.expired++;
  }
  uint64_t c = t->cfg.capacity;
  if (c > 0 && t->n_list[1] > c) {
    size_t over = t->n_list[1] - (size_t)c;
    t->st.evicted += over;
    if (t->cfg.evict == EMB_EVICT_LFU) return evict_lfu(t, over);
    while (over--) evict(t, t->head[1]);
  }
  return 0;
}

int keep_decide(keep *k, int64_t step, emb_idset *out) {
  for (int f = 0; f < k->n; f++) {
    ktab *t = &k->t[f];
    t->out_n = 0;
    if (t->on) {
      int rc = decide_table(t, step);
      if (rc) return rc;
      qsort(t->out, t->out_n, sizeof *t->out, cmp_u64);
    }
    k->out_ids[f] = t->out;
    k->out_counts[f] = t->out_n;
  }
  out->n_tables = k->n;
  out->ids = (const uint64_t *const *)k->out_ids;
  out->counts = k->out_counts;
  return 0;
}

keep_table_stats keep_stats(const keep *k, int table) {
  keep_table_stats s = k->t[table].st;
  s.rows = k->t[table].n_list[1];
  s.counting = k->t[table].n_list[0];
  return s;
}

/* ---- files ---- */

/* A growing byte buffer. */
typedef struct {
  unsigned char *p;
  size_t n, cap;
  int oom;
} kbuf;

static void put(kbuf *b, const void *x, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n) cap *= 2;
    unsigned char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, x, n);
  b->n += n;
}

static void put64(kbuf *b, uint64_t v) { put(b, &v, sizeof v); }

/* File layout (little-endian, as the machine's): magic[8], u32 version, u32
 * bounded tables; per table: u64 table_id, u64 admitted, refused, expired,
 * evicted, u64 entries, then each entry: u64 id, count, last, admitted, in
 * list order (counting, then admitted: each oldest last first); SHA-256 of
 * everything before it. */
int keep_save(const keep *k, const char *path, char *err, size_t errlen) {
  kbuf b = {0};
  uint32_t hdr[2] = {KEEP_VERSION, 0};
  for (int f = 0; f < k->n; f++) hdr[1] += (uint32_t)k->t[f].on;
  put(&b, KEEP_MAGIC, 8);
  put(&b, hdr, sizeof hdr);
  for (int f = 0; f < k->n; f++) {
    const ktab *t = &k->t[f];
    if (!t->on) continue;
    put64(&b, k->plan->tables[f].table_id);
    put64(&b, t->st.admitted);
    put64(&b, t->st.refused);
    put64(&b, t->st.expired);
    put64(&b, t->st.evicted);
    put64(&b, t->n_list[0] + t->n_list[1]);
    for (int l = 0; l < 2; l++)
      for (uint32_t i1 = t->head[l]; i1; i1 = t->e[i1 - 1].next) {
        const kentry *e = &t->e[i1 - 1];
        uint64_t rec[4] = {e->id, e->count, (uint64_t)e->last, e->admitted};
        put(&b, rec, sizeof rec);
      }
  }
  unsigned char sum[SR_SHA256_LEN];
  int rc = b.oom ? SR_ENOMEM : sr_sha256(b.p, b.n, sum);
  if (!rc) put(&b, sum, sizeof sum);
  if (rc || b.oom) {
    free(b.p);
    sr_fmt(err, errlen, "%s: out of memory", path);
    return SR_ENOMEM;
  }
  sr_outfile *o;
  if (!(rc = sr_out_open(path, &o, err, errlen))) {
    if ((rc = sr_out_write(o, b.p, b.n))) sr_out_abort(o);
    else rc = sr_out_commit(o, err, errlen);
    if (rc && !err[0]) sr_fmt(err, errlen, "%s: %s", path, sr_strerror(rc));
  }
  free(b.p);
  return rc;
}

/* Parse one table's section at p[*at..n) into nt (fresh); 0 or SR_EFORMAT. */
static int load_table(keep *k, const unsigned char *p, size_t n, size_t *at, ktab *nt, int *f,
                      const char *path, char *err, size_t errlen) {
  uint64_t h[6];
  if (n - *at < sizeof h) goto short_;
  memcpy(h, p + *at, sizeof h);
  *at += sizeof h;
  *f = h[0] > UINT32_MAX ? -1 : emb_plan_table_index(k->plan, (uint32_t)h[0]);
  if (*f < 0 || !k->t[*f].on || nt[*f].on) {
    sr_fmt(err, errlen, "%s: table_id %llu is not a bounded table of this plan (or twice)", path,
           (unsigned long long)h[0]);
    return SR_EFORMAT;
  }
  ktab *t = &nt[*f];
  t->on = 1;
  t->cfg = k->t[*f].cfg;
  t->st = (keep_table_stats){.admitted = h[1], .refused = h[2], .expired = h[3], .evicted = h[4]};
  if (h[5] > (n - *at) / 32) goto short_;
  if (reserve(t, (size_t)h[5])) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    return SR_ENOMEM;
  }
  for (uint64_t i = 0; i < h[5]; i++, *at += 32) {
    uint64_t rec[4];
    memcpy(rec, p + *at, sizeof rec);
    size_t pos = find_pos(t, rec[0]);
    if (t->map[pos] != NIL || rec[3] > 1 || (int)rec[3] < (t->tail[1] != NIL)) {
      sr_fmt(err, errlen, "%s: table_id %llu: entry %llu (row %llu) is out of order or repeated",
             path, (unsigned long long)h[0], (unsigned long long)i, (unsigned long long)rec[0]);
      return SR_EFORMAT;
    }
    kentry e = {.id = rec[0], .count = rec[1], .last = (int64_t)rec[2], .admitted = (uint32_t)rec[3]};
    uint32_t i1 = (uint32_t)++t->used;
    t->e[i1 - 1] = e;
    t->map[pos] = i1;
    t->live++;
    append(t, i1);
  }
  return 0;
short_:
  sr_fmt(err, errlen, "%s: truncated", path);
  return SR_EFORMAT;
}

int keep_load(keep *k, const char *path, char *err, size_t errlen) {
  unsigned char sum[SR_SHA256_LEN];
  size_t n = 0, at = 16;
  int rc;
  unsigned char *p = (unsigned char *)sr_read_file(path, &n);
  if (!p) {
    sr_fmt(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    return errno == ENOENT ? SR_ENOTFOUND : errno == ENOMEM ? SR_ENOMEM : SR_EIO;
  }
  uint32_t hdr[2] = {0, 0};
  if (n >= 16 + SR_SHA256_LEN) memcpy(hdr, p + 8, sizeof hdr);
  if (n < 16 + SR_SHA256_LEN || memcmp(p, KEEP_MAGIC, 8) || hdr[0] != KEEP_VERSION) {
    free(p);
    sr_fmt(err, errlen, "%s: not a bounded-table file of version %u", path, KEEP_VERSION);
    return SR_EFORMAT;
  }
  n -= SR_SHA256_LEN;
  if ((rc = sr_sha256(p, n, sum)) || memcmp(sum, p + n, sizeof sum)) {
    free(p);
    sr_fmt(err, errlen, "%s: checksum mismatch", path);
    return rc ? rc : SR_ECHECKSUM;
  }
  ktab *nt = calloc((size_t)k->n, sizeof *nt);
  rc = nt ? 0 : SR_ENOMEM;
  for (uint32_t i = 0; !rc && i < hdr[1]; i++) {
    int f;
    rc = load_table(k, p, n, &at, nt, &f, path, err, errlen);
  }
  if (!rc && at != n) {
    sr_fmt(err, errlen, "%s: %zu bytes past its tables", path, n - at);
    rc = SR_EFORMAT;
  }
  for (int f = 0; !rc && f < k->n; f++)
    if (k->t[f].on && !nt[f].on) {
      sr_fmt(err, errlen, "%s: holds no entries of bounded table %s", path,
             k->plan->tables[f].name);
      rc = SR_EFORMAT;
    }
  for (int f = 0; !rc && f < k->n; f++) {
    ktab_free(&k->t[f]);
    k->t[f] = nt[f];
    k->t[f].on = emb_keep_on(&k->plan->tables[f]);
    k->t[f].cfg = k->plan->tables[f].keep;
    if (!k->t[f].cfg.admit_window) k->t[f].cfg.admit_window = EMB_KEEP_WINDOW_DEFAULT;
  }
  if (rc && nt)
    for (int f = 0; f < k->n; f++) ktab_free(&nt[f]);
  if (rc == SR_ENOMEM && !nt) sr_fmt(err, errlen, "%s: out of memory", path);
  free(nt);
  free(p);
  return rc;
}
