/* A served checkpoint that follows its folder (see served_follow.h). */
#include "embedding/served_follow.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/ckpt_plan.h"
#include "embedding/optim.h"
#include "embedding/removed_file.h"
#include "embedding/table_file.h"
#include "storage/ckpt_dir.h"

#define CHUNK 4096 /* rows compared per exclusive section */

/* One table's rows as they were before the last swap, by ascending id. */
typedef struct {
  size_t n;
  uint64_t *ids;
  float *vals; /* [n][dim] */
} undo_tab;

/* A step held beside the served one: undo, laid over the rows of the step
 * after it (the served one, or the held step before it in the list),
 * gives its rows. */
typedef struct {
  int64_t step;
  double until;  /* sr_now() past which it is dropped */
  undo_tab *undo; /* [n_tables] owned */
} held_step;

/* A checkpoint looked at and refused (not looked at again while its DONE is the same). */
typedef struct {
  int64_t step;
  char done[65];
} refused;

/* A step-N folder seen without DONE. */
typedef struct {
  int64_t step;
  double since; /* sr_now() when first seen without DONE */
  int said;
} unfinished;

struct emb_follow {
  emb_served *sv;        /* borrowed */
  emb_store *store;      /* sv->store */
  const emb_plan *plan;  /* sv->plan */
  char model_fp[EMB_FP_HEX];
  char *root;            /* owned */
  double grace_s;
  int64_t swap_at;       /* under mu */
  void (*exclusive)(void *, void (*)(void *), void *);
  void *exclusive_ctx;
  pthread_mutex_t mu;    /* step and completed, for other threads */
  int64_t step;          /* served */
  double completed;
  char done[65];         /* the served checkpoint's DONE */
  /* Under the exclusive section: the steps served before, newest first
   * (each held grace_s after it stopped being served: the oldest go first). */
  held_step *held;
  int n_held, cap_held;
  uint64_t own_rows, own_hits; /* rows the follower itself looked up in the store, and hits */
  /* The follower thread's: checkpoints above the served step refused, and
   * step-N folders above it seen without DONE (those at or below the
   * served step dropped at each look). */
  refused *refused;
  size_t n_refused, cap_refused;
  unfinished *incomplete;
  size_t n_incomplete, cap_incomplete;
};

const char *emb_follow_reason_name(emb_follow_reason r) {
  static const char *const n[EMB_FOLLOW_N_REASONS] = {"incomplete", "damaged", "plan", "transform",
                                                      "layout", "rows", "failed"};
  return r >= 0 && r < EMB_FOLLOW_N_REASONS ? n[r] : "?";
}

static void undo_free(undo_tab *u, int n) {
  for (int t = 0; u && t < n; t++) {
    free(u[t].ids);
    free(u[t].vals);
  }
  free(u);
}

/* The time dir's DONE was written (seconds since the epoch); 0 unknown. */
static double done_time(const char *dir) {
  char p[SR_PATH_MAX];
  struct stat st;
  if (sr_path(p, sizeof p, "%s/DONE", dir) || stat(p, &st)) return 0;
  return (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec;
}

emb_follow *emb_follow_create(emb_served *sv, const emb_follow_opts *o, char *err,
                              size_t errlen) {
  char shards[SR_PATH_MAX];
  ckpt_shards_layout lay;
  if (!sv->ckpt_dir[0] || emb_store_kind_of(sv->store) != EMB_STORE_LOCAL ||
      ckpt_dir_shards_path(sv->ckpt_dir, shards, sizeof shards) ||
      ckpt_dir_shards_layout(shards, &lay, err, errlen) || lay != CKPT_SHARDS_TABLES) {
    sr_fmt(err, errlen, "%s: a followed checkpoint's rows must be the in-process trainer's "
           "table files (shards/table-<id>.bin), served in memory", sv->ckpt_dir);
    return NULL;
  }
  emb_follow *f = calloc(1, sizeof *f);
  if (!f || !(f->root = strdup(o->root))) {
    free(f);
    sr_fmt(err, errlen, "out of memory");
    return NULL;
  }
  f->sv = sv;
  f->store = sv->store;
  f->plan = sv->plan;
  emb_plan_model_fingerprint(sv->plan, f->model_fp);
  f->grace_s = o->grace_s;
  f->swap_at = o->swap_at;
  f->exclusive = o->exclusive;
  f->exclusive_ctx = o->exclusive_ctx;
  f->step = sv->step;
  f->completed = done_time(sv->ckpt_dir);
  if (ckpt_dir_done(sv->ckpt_dir, f->done, err, errlen)) {
    emb_follow_destroy(f);
    return NULL;
  }
  pthread_mutex_init(&f->mu, NULL);
  return f;
}

void emb_follow_destroy(emb_follow *f) {
  if (!f) return;
  for (int i = 0; i < f->n_held; i++) undo_free(f->held[i].undo, f->plan->n_tables);
  free(f->held);
  free(f->refused);
  free(f->incomplete);
  pthread_mutex_destroy(&f->mu);
  free(f->root);
  free(f);
}

int emb_follow_swap_at(emb_follow *f, int64_t step, int64_t *served, char *msg, size_t len) {
  pthread_mutex_lock(&f->mu);
  *served = f->step;
  int ok = step > f->step;
  if (ok) f->swap_at = step;
  pthread_mutex_unlock(&f->mu);
  if (ok) return EMB_FOLLOW_SERVED;
  sr_fmt(msg, len, "SwapAt: step %lld is not above step %lld, the one served", (long long)step,
         (long long)*served);
  return EMB_FOLLOW_GONE;
}

int64_t emb_follow_step(const emb_follow *f) {
  pthread_mutex_lock((pthread_mutex_t *)&f->mu);
  int64_t s = f->step;
  pthread_mutex_unlock((pthread_mutex_t *)&f->mu);
  return s;
}

double emb_follow_completed(const emb_follow *f) {
  pthread_mutex_lock((pthread_mutex_t *)&f->mu);
  double c = f->completed;
  pthread_mutex_unlock((pthread_mutex_t *)&f->mu);
  return c;
}

/* ---- Lookups (under the exclusive section's lock) ---- */

int emb_follow_pick(void *ctx, int64_t asked, int step_asked, int64_t *step, char *msg,
                    size_t len) {
  emb_follow *f = ctx;
  *step = f->step;
  if (!step_asked || asked == f->step) return EMB_FOLLOW_SERVED;
  const double now = sr_now();
  int live = 0; /* the held steps whose grace has not passed */
  while (live < f->n_held && now < f->held[live].until) live++;
  for (int i = 0; i < live; i++)
    if (f->held[i].step == asked) {
      *step = asked;
      return EMB_FOLLOW_SERVED;
    }
  if (live)
    sr_fmt(msg, len, "at_step: step %lld asked; this server serves step %lld and holds steps "
           "%lld..%lld", (long long)asked, (long long)f->step, (long long)f->held[live - 1].step,
           (long long)f->held[0].step);
  else
    sr_fmt(msg, len, "at_step: step %lld asked; this server serves step %lld", (long long)asked,
           (long long)f->step);
  return asked > f->step ? EMB_FOLLOW_AHEAD : EMB_FOLLOW_GONE;
}

/* The index of id in u's ascending ids, or -1. */
static long undo_find(const undo_tab *u, uint64_t id) {
  size_t lo = 0, hi = u->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (u->ids[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < u->n && u->ids[lo] == id ? (long)lo : -1;
}

void emb_follow_patch(void *ctx, int64_t step, const emb_idset *set, float *const *out) {
  emb_follow *f = ctx;
  /* Back from the served step one swap at a time, newest first. */
  for (int i = 0; step != f->step && i < f->n_held; i++) {
    for (int t = 0; t < set->n_tables; t++) {
      const undo_tab *u = &f->held[i].undo[t];
      const size_t dim = (size_t)f->plan->tables[t].dim;
      for (size_t r = 0; u->n && r < set->counts[t]; r++) {
        long k = undo_find(u, set->ids[t][r]);
        if (k >= 0) memcpy(out[t] + r * dim, u->vals + (size_t)k * dim, dim * sizeof(float));
      }
    }
    if (f->held[i].step == step) break;
  }
}

/* ---- gathering a swap's rows ---- */

/* The rows a swap lays over the store, per table: records of (id, link,
 * removed, value and state), sorted by id then link (in a link, its
 * removal before its row), the last kept: a row, or a removed row (an
 * increment's removed-<id>.bin: its values unused). */
#define REC_ROW 0u
#define REC_REMOVED 1u
typedef struct {
  size_t n, cap;
  uint8_t *rec; /* [cap][rec_bytes]: u64 id, u32 link, u32 REC_ROW or REC_REMOVED,
                   float vals[stride] */
  size_t rec_bytes;
  int stride;
} rows_tab;

typedef struct {
  emb_follow *f;
  rows_tab *tabs;     /* [n_tables] */
  int link;           /* the link being read */
  int table;
} gather;

static int rows_add(rows_tab *r, uint64_t id, int link, uint32_t kind, const float *vals) {
  if (r->n == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 1024;
    uint8_t *p = realloc(r->rec, cap * r->rec_bytes);
    if (!p) return SR_ENOMEM;
    r->rec = p;
    r->cap = cap;
  }
  uint8_t *e = r->rec + r->n++ * r->rec_bytes;
  uint32_t l = (uint32_t)link;
  memcpy(e, &id, 8);
  memcpy(e + 8, &l, 4);
  memcpy(e + 12, &kind, 4);
  if (vals) memcpy(e + 16, vals, (size_t)r->stride * sizeof(float));
  else memset(e + 16, 0, (size_t)r->stride * sizeof(float));
  return 0;
}

static uint32_t rec_kind(const uint8_t *e) {
  uint32_t k;
  memcpy(&k, e + 12, 4);
  return k;
}

static int rec_cmp(const void *a, const void *b) {
  uint64_t x, y;
  uint32_t lx, ly;
  memcpy(&x, a, 8), memcpy(&y, b, 8);
  if (x != y) return x < y ? -1 : 1;
  memcpy(&lx, (const uint8_t *)a + 8, 4), memcpy(&ly, (const uint8_t *)b + 8, 4);
  if (lx != ly) return lx < ly ? -1 : 1;
  uint32_t kx = rec_kind(a), ky = rec_kind(b);
  return kx > ky ? -1 : kx < ky; /* a link's removal before its row */
}

static int add_record(void *ctx, uint64_t row_id, const float *vals) {
  gather *g = ctx;
  return rows_add(&g->tabs[g->table], row_id, g->link, REC_ROW, vals);
}

/* A chunk of a full checkpoint's rows compared with the store's (under
 * the exclusive section): those that differ kept. */
typedef struct {
  gather *g;
  int table;
  size_t n;
  uint64_t ids[CHUNK];
  float *vals;        /* [CHUNK][stride] the checkpoint's */
  float *held;        /* [CHUNK][dim] the store's */
  uint64_t hits;      /* rows of the chunk the store holds */
  uint64_t *seen;     /* a bounded table's: every row id of the checkpoint's file, ascending */
  size_t n_seen, cap_seen, walk; /* walk: find_removed's place in seen */
  uint64_t gone;      /* rows the store holds that the checkpoint's bounded tables removed */
  int rc;
} chunk;

/* The served rows of set into out, read for the follower's own work
 * (under the exclusive section): counted in f->own_rows and f->own_hits,
 * its hits also added to *hits (NULL: not wanted). 0 or the store's
 * status. */
static int own_lookup(emb_follow *f, const emb_idset *set, float *const *out, uint64_t *hits) {
  emb_store_stats a, b;
  int rc = emb_store_stats_get(f->store, &a);
  if (!rc) rc = emb_store_lookup_begin(f->store, f->step, set, out);
  if (!rc) rc = emb_store_lookup_wait(f->store);
  if (!rc) rc = emb_store_stats_get(f->store, &b);
  if (rc) return rc;
  f->own_rows += b.lookups - a.lookups;
  f->own_hits += b.hits - a.hits;
  if (hits) *hits += b.hits - a.hits;
  return 0;
}

static void compare_chunk(void *arg) {
  chunk *c = arg;
  emb_follow *f = c->g->f;
  const int nt = f->plan->n_tables, dim = f->plan->tables[c->table].dim;
  const int stride = c->g->tabs[c->table].stride;
  const uint64_t *ids[EMB_MAX_TABLES] = {0};
  size_t counts[EMB_MAX_TABLES] = {0};
  float *out[EMB_MAX_TABLES];
  for (int t = 0; t < nt; t++) out[t] = c->held;
  ids[c->table] = c->ids;
  counts[c->table] = c->n;
  emb_idset set = {.n_tables = nt, .ids = ids, .counts = counts};
  if ((c->rc = own_lookup(f, &set, out, &c->hits))) return;
  for (size_t r = 0; r < c->n && !c->rc; r++)
    if (memcmp(c->held + r * (size_t)dim, c->vals + r * (size_t)stride,
               (size_t)dim * sizeof(float)))
      c->rc = rows_add(&c->g->tabs[c->table], c->ids[r], 0, REC_ROW, c->vals + r * (size_t)stride);
}

static int compare_record(void *ctx, uint64_t row_id, const float *vals) {
  chunk *c = ctx;
  const int stride = c->g->tabs[c->table].stride;
  if (emb_keep_on(&c->g->f->plan->tables[c->table])) {
    if (c->n_seen == c->cap_seen) {
      size_t cap = c->cap_seen ? 2 * c->cap_seen : 1024;
      uint64_t *p = realloc(c->seen, cap * sizeof *p);
      if (!p) return c->rc = SR_ENOMEM;
      c->seen = p;
      c->cap_seen = cap;
    }
    c->seen[c->n_seen++] = row_id;
  }
  c->ids[c->n] = row_id;
  memcpy(c->vals + c->n * (size_t)stride, vals, (size_t)stride * sizeof(float));
  if (++c->n < CHUNK) return 0;
  c->g->f->exclusive(c->g->f->exclusive_ctx, compare_chunk, c);
  c->n = 0;
  return c->rc;
}

/* The store's stats (the store is not read outside the exclusive section:
 * Lookups run on it meanwhile). */
typedef struct {
  emb_follow *f;
  emb_store_stats st;
  int rc;
} stats_read;

static void read_stats(void *arg) {
  stats_read *r = arg;
  r->rc = emb_store_stats_get(r->f->store, &r->st);
}

/* A row the store holds of c's table (iterate, ascending): one the
 * checkpoint's file lacks (c->seen, ascending, walked along) is a removed
 * row of g. */
static int removed_row(void *ctx, int table, uint64_t id, const float *v, int dim,
                       const float *st, int sl) {
  (void)v, (void)dim, (void)st, (void)sl;
  chunk *c = ctx;
  while (c->walk < c->n_seen && c->seen[c->walk] < id) c->walk++;
  if (c->walk < c->n_seen && c->seen[c->walk] == id) return 0;
  c->gone++;
  return (c->rc = rows_add(&c->g->tabs[table], id, 0, REC_REMOVED, NULL)) ? 1 : 0;
}

/* The rows the store holds of a bounded table that the checkpoint's file
 * lacks (under the exclusive section: the checkpoint dropped them). */
static void find_removed(void *arg) {
  chunk *c = arg;
  c->walk = 0;
  int rc = emb_store_iterate(c->g->f->store, c->table, removed_row, c);
  if (rc && !c->rc) c->rc = rc;
}

/* The rows of the full checkpoint at shards (link 0 of a chain that does
 * not hold the served step) that differ from the store's into g, and the
 * rows of its bounded tables it does not hold as removed rows; refused
 * EMB_FOLLOW_ROWS when it lacks other rows the store holds. */
static int diff_full(gather *g, const char *shards, emb_follow_event *ev) {
  emb_follow *f = g->f;
  stats_read held = {.f = f};
  f->exclusive(f->exclusive_ctx, read_stats, &held);
  int rc = held.rc;
  chunk *c = calloc(1, sizeof *c);
  int widest = 1;
  for (int t = 0; t < f->plan->n_tables; t++)
    if (g->tabs[t].stride > widest) widest = g->tabs[t].stride;
  if (c) {
    c->vals = malloc((size_t)CHUNK * (size_t)widest * sizeof(float));
    c->held = malloc((size_t)CHUNK * (size_t)widest * sizeof(float));
  }
  if (!c || !c->vals || !c->held) rc = SR_ENOMEM;
  for (int t = 0; t < f->plan->n_tables && !rc; t++) {
    char path[SR_PATH_MAX];
    const emb_table *tb = &f->plan->tables[t];
    *c = (chunk){.g = g, .table = t, .vals = c->vals, .held = c->held, .hits = c->hits,
                 .seen = c->seen, .cap_seen = c->cap_seen, .gone = c->gone};
    if ((rc = sr_path_err(path, sizeof path, ev->msg, sizeof ev->msg, "%s/table-%u.bin", shards,
                          tb->table_id)))
      break;
    rc = emb_tabfile_read(path, tb, f->model_fp, compare_record, c, ev->msg, sizeof ev->msg);
    if (!rc && c->n) {
      f->exclusive(f->exclusive_ctx, compare_chunk, c);
      rc = c->rc;
    }
    if (!rc && emb_keep_on(tb)) {
      f->exclusive(f->exclusive_ctx, find_removed, c);
      rc = c->rc;
    }
  }
  if (!rc && c->hits + c->gone < held.st.rows) {
    ev->reason = EMB_FOLLOW_ROWS;
    sr_fmt(ev->msg, sizeof ev->msg, "%s: holds %llu of the %llu rows served: a followed "
           "model's rows are never dropped", shards, (unsigned long long)c->hits,
           (unsigned long long)held.st.rows);
    rc = SR_EMISMATCH;
  } else if (rc && !ev->msg[0]) {
    sr_fmt(ev->msg, sizeof ev->msg, "%s: comparing rows: %s", shards, sr_strerror(rc));
  }
  if (c) free(c->vals), free(c->held), free(c->seen);
  free(c);
  return rc;
}

/* Table t's removed rows of the increment at shards (link; no
 * removed-<id>.bin: none) into g. */
static int read_removed(gather *g, const char *shards, int link, int t, emb_follow_event *ev) {
  char path[SR_PATH_MAX];
  const emb_table *tb = &g->f->plan->tables[t];
  uint64_t *ids = NULL;
  size_t n = 0;
  int rc = ckpt_dir_removed_file(shards, tb->table_id, path, sizeof path);
  if (rc) sr_fmt(ev->msg, sizeof ev->msg, "%s: path too long", shards);
  if (!rc) rc = emb_rmfile_read(path, tb, g->f->model_fp, &ids, &n, ev->msg, sizeof ev->msg);
  for (size_t i = 0; i < n && !rc; i++) rc = rows_add(&g->tabs[t], ids[i], link, REC_REMOVED, NULL);
  free(ids);
  return rc;
}

/* Every record of the increment at shards (link) into g: its rows and its
 * removed rows. */
static int read_increment(gather *g, const char *shards, int link, emb_follow_event *ev) {
  g->link = link;
  for (int t = 0; t < g->f->plan->n_tables; t++) {
    char path[SR_PATH_MAX];
    const emb_table *tb = &g->f->plan->tables[t];
    g->table = t;
    int rc = sr_path_err(path, sizeof path, ev->msg, sizeof ev->msg, "%s/table-%u.bin", shards,
                         tb->table_id);
    if (!rc) rc = emb_tabfile_read(path, tb, g->f->model_fp, add_record, g, ev->msg,
                                   sizeof ev->msg);
    if (!rc) rc = read_removed(g, shards, link, t, ev);
    if (rc) return rc;
  }
  return 0;
}

/* g's rows sorted by id, each id's last link's kept; their count. */
static uint64_t last_rows(gather *g) {
  uint64_t n = 0;
  for (int t = 0; t < g->f->plan->n_tables; t++) {
    rows_tab *r = &g->tabs[t];
    qsort(r->rec, r->n, r->rec_bytes, rec_cmp);
    size_t k = 0; /* the kept records, compacted in place */
    for (size_t i = 0; i < r->n; i++) {
      uint64_t a, b;
      memcpy(&a, r->rec + i * r->rec_bytes, 8);
      if (i + 1 < r->n && (memcpy(&b, r->rec + (i + 1) * r->rec_bytes, 8), a == b)) continue;
      if (k != i) memcpy(r->rec + k * r->rec_bytes, r->rec + i * r->rec_bytes, r->rec_bytes);
      k++;
    }
    r->n = k;
    n += k;
  }
  return n;
}

/* Table t's removed rows of g (last_rows') as dir/removed-<id>.bin (none:
 * no file). */
static int write_removed(gather *g, int t, const char *dir, emb_follow_event *ev) {
  rows_tab *r = &g->tabs[t];
  const emb_table *tb = &g->f->plan->tables[t];
  char path[SR_PATH_MAX];
  size_t n = 0;
  for (size_t i = 0; i < r->n; i++) n += rec_kind(r->rec + i * r->rec_bytes) == REC_REMOVED;
  if (!n) return 0;
  uint64_t *ids = malloc(n * sizeof *ids);
  if (!ids) {
    sr_fmt(ev->msg, sizeof ev->msg, "%s: out of memory", dir);
    return SR_ENOMEM;
  }
  n = 0;
  for (size_t i = 0; i < r->n; i++)
    if (rec_kind(r->rec + i * r->rec_bytes) == REC_REMOVED) memcpy(&ids[n++], r->rec + i * r->rec_bytes, 8);
  int rc = ckpt_dir_removed_file(dir, tb->table_id, path, sizeof path);
  if (rc) sr_fmt(ev->msg, sizeof ev->msg, "%s: path too long", dir);
  if (!rc) rc = emb_rmfile_write(path, tb, g->f->model_fp, ids, n, ev->msg, sizeof ev->msg);
  free(ids);
  return rc;
}

/* g's rows (last_rows') as table files under dir, its removed rows beside
 * them. */
static int write_rows(gather *g, const char *dir, emb_follow_event *ev) {
  for (int t = 0; t < g->f->plan->n_tables; t++) {
    rows_tab *r = &g->tabs[t];
    const emb_table *tb = &g->f->plan->tables[t];
    char path[SR_PATH_MAX];
    emb_tabfile_writer *w;
    size_t rows = 0;
    for (size_t i = 0; i < r->n; i++) rows += rec_kind(r->rec + i * r->rec_bytes) == REC_ROW;
    int rc = sr_path_err(path, sizeof path, ev->msg, sizeof ev->msg, "%s/table-%u.bin", dir,
                         tb->table_id);
    if (!rc) rc = emb_tabfile_create(path, tb, g->f->model_fp, rows, &w, ev->msg, sizeof ev->msg);
    for (size_t i = 0; i < r->n && !rc; i++) {
      uint64_t id;
      if (rec_kind(r->rec + i * r->rec_bytes) != REC_ROW) continue;
      memcpy(&id, r->rec + i * r->rec_bytes, 8);
      if ((rc = emb_tabfile_put(w, id, (const float *)(r->rec + i * r->rec_bytes + 16), ev->msg,
                                sizeof ev->msg)))
        emb_tabfile_abort(w);
    }
    if (!rc) rc = emb_tabfile_commit(w, ev->msg, sizeof ev->msg);
    if (!rc) rc = write_removed(g, t, dir, ev);
    if (rc) return rc;
  }
  return 0;
}

/* ---- the swap ---- */

typedef struct {
  emb_follow *f;
  gather *g;
  const char *dir;       /* the folder of rows to lay */
  int64_t step;          /* the step swapped to */
  double completed;
  const char *done;
  undo_tab *undo;        /* [n_tables] built here: the old values of g's rows */
  held_step *dropped;    /* held steps taken out (freed outside the section) */
  int n_dropped;
  double seconds;
  int rc;
  char err[512];
} swap;

static void apply(void *arg) {
  swap *w = arg;
  emb_follow *f = w->f;
  double t0 = sr_now();
  const int nt = f->plan->n_tables;
  if (f->n_held == f->cap_held) { /* room for one more held step: Lookups read held */
    held_step *h = realloc(f->held, (size_t)(f->cap_held + 8) * sizeof *h);
    if (!h) {
      w->rc = SR_ENOMEM;
      sr_fmt(w->err, sizeof w->err, "out of memory");
      return;
    }
    f->held = h;
    f->cap_held += 8;
  }
  const uint64_t *ids[EMB_MAX_TABLES] = {0};
  size_t counts[EMB_MAX_TABLES] = {0};
  float *out[EMB_MAX_TABLES];
  for (int t = 0; t < nt; t++) {
    undo_tab *u = &w->undo[t];
    const rows_tab *r = &w->g->tabs[t];
    for (size_t i = 0; i < r->n; i++) memcpy(&u->ids[i], r->rec + i * r->rec_bytes, 8);
    u->n = r->n;
    ids[t] = u->ids;
    counts[t] = u->n;
    out[t] = u->vals;
  }
  emb_idset set = {.n_tables = nt, .ids = ids, .counts = counts};
  w->rc = own_lookup(f, &set, out, NULL);
  if (!w->rc) w->rc = emb_store_restore_delta(f->store, w->dir);
  if (w->rc) {
    sr_fmt(w->err, sizeof w->err, "%s", emb_store_errmsg(f->store));
  } else {
    memmove(f->held + 1, f->held, (size_t)f->n_held * sizeof *f->held); /* room: above */
    f->held[0] = (held_step){.step = f->step, .until = sr_now() + f->grace_s, .undo = w->undo};
    f->n_held++;
    w->undo = NULL;
    pthread_mutex_lock(&f->mu);
    f->step = w->step;
    f->completed = w->completed;
    memcpy(f->done, w->done, sizeof f->done);
    pthread_mutex_unlock(&f->mu);
  }
  w->seconds = sr_now() - t0;
}

/* The held steps whose grace has passed taken out of f into w->dropped. */
static void drop_expired(void *arg) {
  swap *w = arg;
  emb_follow *f = w->f;
  const double now = sr_now();
  int keep = f->n_held;
  while (keep > 0 && now >= f->held[keep - 1].until) keep--;
  w->n_dropped = f->n_held - keep;
  memcpy(w->dropped, f->held + keep, (size_t)w->n_dropped * sizeof *f->held);
  f->n_held = keep;
}

static void free_dropped(emb_follow *f, swap *w) {
  for (int i = 0; i < w->n_dropped; i++) undo_free(w->dropped[i].undo, f->plan->n_tables);
  free(w->dropped);
}

/* A temporary folder for a swap's rows: $TMPDIR or /tmp. */
static int tmp_folder(char *out, size_t len, emb_follow_event *ev) {
  const char *tmp = getenv("TMPDIR");
  if (sr_path_err(out, len, ev->msg, sizeof ev->msg, "%s/shardrec-follow-XXXXXX",
                  tmp && *tmp ? tmp : "/tmp"))
    return SR_ERANGE;
  if (!mkdtemp(out)) {
    sr_fmt(ev->msg, sizeof ev->msg, "%s: cannot make a temporary folder: %s", out,
           strerror(errno));
    return SR_EIO;
  }
  return 0;
}

/* The links of chain to lay over the served rows: from the one after the
 * served step when the chain holds it, else from its full checkpoint
 * (0); each verified (its files' sizes and SHA-256) and in table files. */
static int links_from(emb_follow *f, const ckpt_dir_chain *chain, int *from,
                      emb_follow_event *ev) {
  *from = 0;
  for (int i = chain->n - 2; i >= 0 && !*from; i--) { /* the head is newer than the served */
    char hex[65], e[256];
    if (!ckpt_dir_done(chain->dirs[i], hex, e, sizeof e) && !strcmp(hex, f->done)) *from = i + 1;
  }
  for (int i = *from; i < chain->n; i++) {
    cJSON *man = NULL;
    char shards[SR_PATH_MAX];
    ckpt_shards_layout lay;
    int rc = ckpt_dir_read(chain->dirs[i], &man, ev->msg, sizeof ev->msg);
    if (!rc) rc = ckpt_dir_verify(chain->dirs[i], man, ev->msg, sizeof ev->msg);
    cJSON_Delete(man);
    if (rc) {
      ev->reason = EMB_FOLLOW_DAMAGED;
      return rc;
    }
    if (ckpt_dir_shards_path(chain->dirs[i], shards, sizeof shards) ||
        ckpt_dir_shards_layout(shards, &lay, ev->msg, sizeof ev->msg) ||
        lay != CKPT_SHARDS_TABLES) {
      ev->reason = EMB_FOLLOW_LAYOUT;
      sr_fmt(ev->msg, sizeof ev->msg, "%s: not the in-process trainer's table files: a "
             "followed checkpoint's rows are", shards);
      return SR_EFORMAT;
    }
  }
  return 0;
}

/* dir's manifest against the served checkpoint: its plan and data
 * transform; its verified chain into *chain. */
static int check_head(emb_follow *f, const char *dir, ckpt_dir_chain *chain,
                      emb_follow_event *ev) {
  cJSON *man = NULL;
  emb_plan *plan = NULL;
  char src[SR_PATH_MAX], fp[EMB_FP_HEX], served[EMB_FP_HEX];
  const char *xf = NULL;
  ev->reason = EMB_FOLLOW_DAMAGED;
  int rc = sr_path_err(src, sizeof src, ev->msg, sizeof ev->msg, "%s/manifest.json", dir);
  if (!rc) rc = ckpt_dir_read(dir, &man, ev->msg, sizeof ev->msg);
  if (!rc) rc = emb_ckpt_get_plan(man, src, &plan, ev->msg, sizeof ev->msg);
  if (!rc) rc = ckpt_dir_fingerprint(man, "transform", src, &xf, ev->msg, sizeof ev->msg);
  if (!rc) {
    emb_plan_fingerprint(plan, fp);
    emb_plan_fingerprint(f->plan, served);
    if (strcmp(fp, served)) {
      ev->reason = EMB_FOLLOW_PLAN;
      sr_fmt(ev->msg, sizeof ev->msg, "%s: plan %.12s..., the served checkpoint's is %.12s... "
             "(other tables, sizes or placement: serve it from a new server)", src, fp, served);
      rc = SR_EMISMATCH;
    } else if (strcmp(xf ? xf : "", f->sv->transform_fp)) {
      ev->reason = EMB_FOLLOW_TRANSFORM;
      sr_fmt(ev->msg, sizeof ev->msg, "%s: data transform %.12s..., the served checkpoint's is "
             "%.12s... (another mapping of raw rows: serve it from a new server)", src,
             xf ? xf : "(none)", f->sv->transform_fp[0] ? f->sv->transform_fp : "(none)");
      rc = SR_EMISMATCH;
    }
  }
  const cJSON *st = rc ? NULL : cJSON_GetObjectItemCaseSensitive(man, "step");
  if (!rc && (!cJSON_IsNumber(st) || st->valuedouble != (double)ev->step)) {
    sr_fmt(ev->msg, sizeof ev->msg, "%s: the manifest's step is not the folder's (%lld)", src,
           (long long)ev->step);
    rc = SR_EFORMAT;
  }
  if (!rc) rc = ckpt_dir_chain_open(dir, man, 0, chain, ev->msg, sizeof ev->msg);
  emb_plan_free(plan);
  cJSON_Delete(man);
  return rc;
}

/* Prepare and swap to the checkpoint dir of step (see served_follow.h). */
static int swap_to(emb_follow *f, const char *dir, int64_t step, emb_follow_event *ev) {
  const int nt = f->plan->n_tables;
  ckpt_dir_chain chain = {0};
  gather g = {.f = f};
  swap w = {.f = f, .g = &g, .step = step};
  char tmp[SR_PATH_MAX] = "", done[65];
  double t0 = sr_now();
  int from = 0;
  int rc = check_head(f, dir, &chain, ev);
  if (!rc) rc = links_from(f, &chain, &from, ev);
  if (!rc && ckpt_dir_done(dir, done, ev->msg, sizeof ev->msg)) rc = SR_EFORMAT;
  if (!rc) ev->reason = EMB_FOLLOW_FAILED;
  if (!rc && !(g.tabs = calloc((size_t)nt, sizeof *g.tabs))) rc = SR_ENOMEM;
  for (int t = 0; t < nt && !rc; t++) {
    const emb_table *tb = &f->plan->tables[t];
    g.tabs[t].stride = tb->dim + emb_optim_state_len(&tb->optim, tb->dim);
    g.tabs[t].rec_bytes = 16 + (size_t)g.tabs[t].stride * sizeof(float);
  }
  for (int i = from; i < chain.n && !rc; i++) {
    char shards[SR_PATH_MAX];
    if ((rc = sr_path_err(shards, sizeof shards, ev->msg, sizeof ev->msg, "%s/shards",
                          chain.dirs[i])))
      break;
    rc = i ? read_increment(&g, shards, i, ev) : diff_full(&g, shards, ev);
  }
  /* One increment past the served step is laid from its own folder; several
   * links, or a full checkpoint's differences, from one folder of them all
   * (one restore_delta: all or nothing). */
  char one[SR_PATH_MAX] = "";
  const uint64_t changed = rc ? 0 : last_rows(&g);
  if (!rc && from >= 1 && from == chain.n - 1)
    rc = sr_path_err(one, sizeof one, ev->msg, sizeof ev->msg, "%s/shards", chain.dirs[from]);
  else if (!rc && !(rc = tmp_folder(tmp, sizeof tmp, ev)))
    rc = write_rows(&g, tmp, ev);
  if (!rc && !(w.undo = calloc((size_t)nt, sizeof *w.undo))) rc = SR_ENOMEM;
  for (int t = 0; t < nt && !rc; t++) {
    size_t n = g.tabs[t].n ? g.tabs[t].n : 1;
    w.undo[t].ids = malloc(n * sizeof *w.undo[t].ids);
    w.undo[t].vals = malloc(n * (size_t)f->plan->tables[t].dim * sizeof(float));
    if (!w.undo[t].ids || !w.undo[t].vals) rc = SR_ENOMEM;
  }
  if (rc == SR_ENOMEM && !ev->msg[0]) sr_fmt(ev->msg, sizeof ev->msg, "%s: out of memory", dir);
  ev->prepare_s = sr_now() - t0;
  if (!rc) {
    w.dir = one[0] ? one : tmp;
    w.done = done;
    w.completed = done_time(dir);
    ev->from_step = f->step;
    f->exclusive(f->exclusive_ctx, apply, &w);
    if ((rc = w.rc)) sr_fmt(ev->msg, sizeof ev->msg, "%s: laying its rows: %s", dir, w.err);
  }
  if (!rc) {
    stats_read st = {.f = f};
    f->exclusive(f->exclusive_ctx, read_stats, &st);
    ev->what = EMB_FOLLOW_SWAPPED;
    ev->incremental = chain.n > 1;
    ev->rows_changed = changed;
    ev->rows_held = st.st.rows;
    ev->swap_s = w.seconds;
  }
  if (tmp[0]) sr_rmtree(tmp);
  undo_free(w.undo, nt);
  for (int t = 0; g.tabs && t < nt; t++) free(g.tabs[t].rec);
  free(g.tabs);
  ckpt_dir_chain_free(&chain);
  return rc;
}

static int was_refused(const emb_follow *f, int64_t step, const char *done) {
  for (size_t i = 0; i < f->n_refused; i++)
    if (f->refused[i].step == step && !strcmp(f->refused[i].done, done)) return 1;
  return 0;
}

/* Room for one more entry of *n in *list (*cap, each size bytes): 0, or -1
 * out of memory. */
static int room(void **list, size_t *n, size_t *cap, size_t size) {
  if (*n < *cap) return 0;
  size_t c = *cap ? 2 * *cap : 64;
  void *p = realloc(*list, c * size);
  if (!p) return -1;
  *list = p;
  *cap = c;
  return 0;
}

/* Every refused checkpoint above the served step is remembered (the list
 * grows; out of memory, not remembered: looked at and said again). */
static void remember_refused(emb_follow *f, int64_t step, const char *done) {
  size_t k = 0;
  while (k < f->n_refused && f->refused[k].step != step) k++; /* its DONE changed */
  if (k == f->n_refused) {
    if (room((void **)&f->refused, &f->n_refused, &f->cap_refused, sizeof *f->refused)) return;
    k = f->n_refused++;
  }
  f->refused[k].step = step;
  snprintf(f->refused[k].done, sizeof f->refused[k].done, "%s", done);
}

/* The refused and incomplete steps at or below the served one dropped:
 * never looked at again. */
static void forget_below(emb_follow *f) {
  size_t k = 0;
  for (size_t i = 0; i < f->n_refused; i++)
    if (f->refused[i].step > f->step) f->refused[k++] = f->refused[i];
  f->n_refused = k;
  k = 0;
  for (size_t i = 0; i < f->n_incomplete; i++)
    if (f->incomplete[i].step > f->step) f->incomplete[k++] = f->incomplete[i];
  f->n_incomplete = k;
}

/* A step-N folder above the served step that has had no DONE for
 * INCOMPLETE_S (a writer between its rename and DONE is not reported),
 * not said before: reported once. 1 when one was. */
#define INCOMPLETE_S 1.0
static int incomplete(emb_follow *f, emb_follow_event *ev) {
  char **names = NULL;
  int n = 0, found = 0;
  if (sr_list_dir(f->root, &names, &n)) return 0;
  for (int i = 0; i < n && !found; i++) {
    long long s = ckpt_dir_step_of(names[i]);
    char done[SR_PATH_MAX];
    if (s <= f->step || sr_path(done, sizeof done, "%s/%s/DONE", f->root, names[i]) ||
        sr_is_file(done))
      continue;
    size_t k = 0;
    while (k < f->n_incomplete && f->incomplete[k].step != s) k++;
    if (k == f->n_incomplete) {
      if (room((void **)&f->incomplete, &f->n_incomplete, &f->cap_incomplete,
               sizeof *f->incomplete))
        continue; /* out of memory: seen again at the next look */
      k = f->n_incomplete++;
      f->incomplete[k].step = s;
      f->incomplete[k].since = sr_now();
      f->incomplete[k].said = 0;
    }
    if (f->incomplete[k].said || sr_now() - f->incomplete[k].since < INCOMPLETE_S) continue;
    f->incomplete[k].said = 1;
    ev->what = EMB_FOLLOW_REFUSED;
    ev->reason = EMB_FOLLOW_INCOMPLETE;
    ev->step = s;
    sr_path(ev->dir, sizeof ev->dir, "%s/%s", f->root, names[i]);
    sr_fmt(ev->msg, sizeof ev->msg, "%s: no DONE: the checkpoint is not complete (served "
           "once it is)", ev->dir);
    found = 1;
  }
  sr_paths_free(names, n);
  return found;
}

void emb_follow_poll(emb_follow *f, emb_follow_event *ev) {
  memset(ev, 0, sizeof *ev);
  if (f->n_held && sr_now() >= f->held[f->n_held - 1].until) {
    swap w = {.f = f, .dropped = malloc((size_t)f->n_held * sizeof *w.dropped)};
    if (w.dropped) f->exclusive(f->exclusive_ctx, drop_expired, &w);
    free_dropped(f, &w);
  }
  forget_below(f);
  ckpt_dir_entry *e = NULL;
  int n = 0;
  pthread_mutex_lock(&f->mu);
  const int64_t swap_at = f->swap_at;
  pthread_mutex_unlock(&f->mu);
  if (ckpt_dir_list(f->root, &e, &n)) return;
  for (int i = 0; i < n; i++) { /* the oldest first: every step is served in turn */
    char dir[SR_PATH_MAX], done[65], err[256];
    if (e[i].step <= f->step) continue;
    if (swap_at >= 0 && f->step < swap_at && e[i].step != swap_at) continue;
    if (sr_path(dir, sizeof dir, "%s/%s", f->root, e[i].name)) continue;
    if (ckpt_dir_done(dir, done, err, sizeof err)) done[0] = 0;
    if (was_refused(f, e[i].step, done)) continue;
    ev->step = e[i].step;
    sr_path(ev->dir, sizeof ev->dir, "%s", dir);
    if (swap_to(f, dir, e[i].step, ev)) {
      ev->what = EMB_FOLLOW_REFUSED;
      remember_refused(f, e[i].step, done);
    }
    free(e);
    return;
  }
  free(e);
  incomplete(f, ev);
}

void emb_follow_own_reads(const emb_follow *f, uint64_t *rows, uint64_t *hits) {
  *rows = f->own_rows;
  *hits = f->own_hits;
}
