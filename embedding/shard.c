/* The shard store: a bounded row cache over RocksDB (see shard.h).
 *
 * Cache layout: one slab of cap slots; a slot is a 16-byte header (row id,
 * table, flags, pin count) followed by the row's value and optimizer state
 * (the widest table's dim + state_len floats), so a hit touches the map entry
 * and one contiguous slot. The map: open addressing, linear probing,
 * power-of-two size >= 2 x cap, 8-byte entries {slot + 1, tag}: the tag is
 * the low 32 bits of the (table, row id) hash, the home position is the tag
 * masked, and the key itself is checked in the slot (a hit reads the slot
 * anyway); deletion by backward shift (no tombstones). CLOCK: a reference
 * bit per slot, set on every access, cleared by the hand; the hand skips
 * pinned slots (pin count > 0) and slots being loaded.
 *
 * Pins. A slot's pin count is the number of holders: the chunk in progress
 * (one pin per item, dropped when the chunk is done) and each prefetched
 * step that asked for the row (a list of slots per step, dropped by that
 * step's push or by the lookup or push of a later step). Prefetch pins at
 * most cap - chunk - 1 slots (counted with repeats), so a chunk always finds
 * a slot to evict: a prefetch that reaches the limit stops, and the rest of
 * its step is read by its lookup.
 *
 * Store threads (EMB_SHARD_DEFAULT_THREADS, made at create, joined at
 * destroy) run two kinds of work from one queue under one lock:
 *   - read jobs: the misses of one (database, table), at most SH_JOB_ROWS
 *     rows, each already given a slot that is in the map, pinned and marked
 *     LOADING; the job reads them with one batched MultiGet straight into
 *     the slots (or the init value and optimizer init state when absent).
 *   - write buffers: dirty rows evicted (or flushed), encoded; one RocksDB
 *     WriteBatch per database. Written one buffer at a time, in the order
 *     they were handed over.
 * The caller thread alone touches the map, the slots' headers, the pin
 * lists and the pending index; a store thread touches only the rows of the
 * slots its job loads and its buffer. A finished job or buffer goes on a
 * done list that the caller reaps (clears LOADING, frees the buffer). The
 * caller, when it must wait (a LOADING slot it needs, no free write
 * buffer), runs queued work itself rather than sleep.
 *
 * Exactness (a row's bits never depend on prefetch, threads or timing):
 *   1. A row in the map is the single truth while it is there: every
 *      lookup and push of it uses the slot, and a LOADING slot is waited for
 *      before it is used. A slot is LOADING only while it holds no value
 *      yet (a new slot, or one whose read failed), so no update can be lost
 *      under a load.
 *   2. A row leaves the map only by eviction: clean, it is dropped (its
 *      latest value is where it was read from); dirty, it is encoded into a
 *      write buffer and entered in the pending index (table, row id) ->
 *      record, newest record first, before the slot is reused.
 *   3. A row brought into the map (lookup, push or prefetch) is taken from
 *      the pending index when it is there, else read from RocksDB. An
 *      index entry goes only when the caller reaps its buffer, after the
 *      write is in RocksDB, so a row missing from both the map and the
 *      index has its latest value in RocksDB; and while the read runs the
 *      row is in the map (LOADING, not evictable), so no newer write-back
 *      of it can exist. Buffers are written in order, so the newest value
 *      is the one RocksDB keeps.
 *   4. Optimizer state is in the slot and the record beside the value, so
 *      it travels with the row.
 * flush, checkpoint, iterate, mark_clean and restore first wait for every
 * read and write (drain); a write that failed is reported (SR_EIO, the
 * RocksDB message) by every later call until a restore: rows were lost.
 *
 * Send pins (lookup_pinned: answers sent from the slots, rpc/service.c).
 * Besides its pin count a slot has a send count, sends->cnt[slot], one per
 * answer being sent from it: raised by the caller (under its lock),
 * dropped by sh_pins_release from any thread (gRPC's, with no lock), so
 * it is atomic and the caller only ever reads it. A slot with a send count
 * is never written: eviction skips it (and never waits for it), and a push
 * to its row first moves the row (value and state) to a fresh slot that
 * the map points to from then on; the old slot is left DETACHED, out of
 * the map, and taken by the CLOCK hand once its counts are 0 (a restore
 * leaves every slot DETACHED the same way while any is sent from). The
 * slots sent from, sends->held, count with the prefetch pins against
 * pf_limit (prefetch_one, sh_lookup_pinned), so a chunk still always finds
 * a slot. The counts and the slab outlive the store while answers are out
 * (sends_unref). */
#include "embedding/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
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
#define SH_AHEAD 16 /* ids between the stages of a lookup pass */
#define SH_JOB_ROWS 1024 /* rows per read job at most: a big batch still splits over threads */
#define SH_REC_HEAD 16   /* a write record: u64 row id, u32 table, u32 database, then the row */
#define F_REF 1u
#define F_DIRTY 2u
#define F_LOADING 4u /* a read job is filling the slot */
#define F_FAILED 8u  /* the slot's read failed: read again when used */
#define F_DETACHED 16u /* out of the map, left to answers being sent (see the top) */
#define NONE32 UINT32_MAX

typedef struct {
  uint32_t slot1; /* 0: empty */
  uint32_t tag;   /* low 32 bits of the key's hash; home = tag & mask */
} sh_entry;

typedef struct {
  uint64_t key;
  uint16_t table;
  uint16_t flags;
  uint32_t pins;
} sh_meta; /* 16 bytes, first in each slot */

/* A read job (see the top). key/slot/vals/lens: [cap]. */
typedef struct sh_job {
  struct sh_job *next, *all;
  int db, table;
  size_t n, cap;
  uint64_t *key;
  uint32_t *slot;
  const char **vals;
  size_t *lens;
  uint64_t found;
  int rc;
  char err[1024];
} sh_job;

/* A write buffer: n records of rec_bytes. */
typedef struct sh_wbuf {
  struct sh_wbuf *next;
  uint32_t idx;
  size_t n;
  unsigned char *rec;
  kv_writes *w;
  int rc;
  char err[1024];
} sh_wbuf;

/* The send counts (see the top): one per slot; refs: the store's and one
 * per pin set out; slab: the store's slots, freed here once the store is
 * gone and the last pin set released. */
typedef struct sh_sends {
  atomic_size_t refs;
  atomic_uint held;      /* slots whose count is not 0 */
  unsigned char *slab;   /* owned once the store is destroyed */
  atomic_uint cnt[];     /* [cap] */
} sh_sends;

/* One answer's send pins (store.h's emb_pins). */
struct emb_pins {
  sh_sends *sends;
  size_t n;
  uint32_t slot[];       /* [n] a slot once per row sent */
};

/* The slots one prefetched step pinned. */
typedef struct {
  int64_t step;
  uint32_t *slot;
  size_t n, cap;
} sh_pinset;

typedef struct shstore shstore;
typedef struct {
  shstore *s;
  pthread_t th;
  kv_reader *rd;
} sh_worker;

struct shstore {
  emb_store base;
  int n_tables;
  int *dim, *slen;        /* [n_tables] */
  int stride;             /* floats per slot after the meta */
  size_t slot_bytes;
  unsigned char *slab;    /* [cap][slot_bytes] */
  uint32_t cap, used, hand;
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
  size_t *it_pos;         /* [chunk] map position */
  uint32_t *it_slot;      /* [chunk] slot index (NONE32: not resident) */
  size_t *miss;           /* [chunk] item index */
  int *mcf;               /* [chunk] database index of each miss */
  size_t *mitem;          /* [2 * chunk]: second half the chunk's row indices */
  uint32_t *ms_t;         /* [chunk] lookup misses: table, id, row index */
  uint64_t *ms_id;
  size_t *ms_r;
  float *tmp;             /* [stride] */
  /* prefetch pins */
  sh_pinset *pf;          /* [n_pf] steps in increasing order */
  int n_pf, cap_pf;
  size_t pf_pinned, pf_limit; /* sum of the lists' lengths; its bound */
  sh_sends *sends;        /* NULL until the first lookup_pinned */
  /* store threads (see the top) */
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  int pool_ok, stop, writing, n_workers, n_wk; /* threads running; wk[] length */
  sh_worker *wk;
  sh_job *rq, *rq_tail, *rdone; /* under mu */
  sh_wbuf *wq, *wq_tail, *wdone; /* under mu */
  /* the caller's side of the threads */
  kv_reader *crd;
  sh_job *jfree, *jall;
  sh_job **open;          /* [n_db * n_tables] the job being filled */
  int *open_list, n_open;
  size_t reads_out, wbufs_out; /* handed over, not reaped */
  sh_wbuf *wbufs, *wfree, *wcur; /* [EMB_SHARD_WB_BUFFERS] */
  size_t rec_bytes, rows_per_buf;
  sh_entry *pidx;         /* pending index: {record + 1, tag} */
  size_t pmask;
  int rd_rc, wb_rc;       /* the last failed read; the first failed write (sticky) */
  char rd_err[1024], wb_err[1024];
  emb_store_stats st;
  emb_shard_counters ctr;
  int unclean;            /* opened on rows without the clean-stop marks (a crash) */
  int marked;             /* the clean-stop marks are written (emb_shard_mark_clean) */
  int last_lookup_rc;
  char err[1024];
};

static inline sh_meta *slot_meta(const shstore *s, uint32_t i) {
  return (sh_meta *)(s->slab + (size_t)i * s->slot_bytes);
}
static inline float *slot_row(const shstore *s, uint32_t i) {
  return (float *)(s->slab + (size_t)i * s->slot_bytes + sizeof(sh_meta));
}
/* Answers being sent from slot i now (see the top). */
static inline unsigned slot_sent(const shstore *s, uint32_t i) {
  return s->sends ? atomic_load_explicit(&s->sends->cnt[i], memory_order_acquire) : 0;
}
/* Slots answers are being sent from now. */
static inline size_t sends_held(const shstore *s) {
  return s->sends ? atomic_load_explicit(&s->sends->held, memory_order_acquire) : 0;
}
static inline uint32_t key_tag(uint32_t t, uint64_t key) {
  return (uint32_t)sr_mix64(key ^ ((uint64_t)(t + 1) * 0x9E3779B97F4A7C15ULL));
}
/* The entry of (t, key), or the empty one where it would go. */
static inline size_t probe(const shstore *s, uint32_t tag, uint32_t t, uint64_t key) {
  for (size_t h = tag & s->mask;; h = (h + 1) & s->mask) {
    const sh_entry *e = &s->map[h];
    if (!e->slot1) return h;
    if (e->tag == tag) {
      const sh_meta *m = slot_meta(s, e->slot1 - 1);
      if (m->key == key && m->table == t) return h;
    }
  }
}

/* Backward-shift deletion of entry i of an open-addressing table. */
static void entries_delete(sh_entry *map, size_t mask, size_t i) {
  size_t j = i;
  map[i].slot1 = 0;
  for (;;) {
    j = (j + 1) & mask;
    if (!map[j].slot1) break;
    size_t k = map[j].tag & mask;
    int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    map[i] = map[j];
    map[j].slot1 = 0;
    i = j;
  }
}

static int db_of(shstore *s, int t, uint64_t id) {
  int sh = emb_plan_shard_of(s->base.plan, t, id);
  return s->shard_db[sh];
}

/* ---- the store threads ---- */

/* Under mu: the next piece of work, a read first; a write only when no other
 * is being written (buffers are written in order). 1 when one is taken. */
static int work_pick(shstore *s, sh_job **j, sh_wbuf **b) {
  *j = NULL;
  *b = NULL;
  if (s->rq) {
    *j = s->rq;
    if (!(s->rq = s->rq->next)) s->rq_tail = NULL;
    return 1;
  }
  if (s->wq && !s->writing) {
    *b = s->wq;
    if (!(s->wq = s->wq->next)) s->wq_tail = NULL;
    s->writing = 1;
    return 1;
  }
  return 0;
}

/* Read job j into its slots with reader rd (any thread). */
static void job_read(shstore *s, kv_reader *rd, sh_job *j) {
  const emb_plan *plan = s->base.plan;
  const int t = j->table, dim = s->dim[t], sl = s->slen[t];
  j->found = 0;
  char e2[512];
  j->rc = kv_reader_get_cf(rd, s->db[j->db], t, j->n, j->key, j->vals, j->lens, e2, sizeof e2);
  if (j->rc) {
    char dp[4200];
    ckpt_dir_shard_path(s->dir, s->db_shard[j->db], dp, sizeof dp);
    sr_fmt(j->err, sizeof j->err, "%s: table %u: %s", dp, plan->tables[t].table_id, e2);
  }
  for (size_t q = 0; q < j->n && !j->rc; q++) {
    float *row = slot_row(s, j->slot[q]);
    if (!j->vals[q]) {
      emb_row_init(plan, t, j->key[q], row);
      emb_optim_state_init(&plan->tables[t].optim, dim, row + dim);
      continue;
    }
    j->rc = kv_row_decode(j->vals[q], j->lens[q], dim, sl, row, e2, sizeof e2);
    if (j->rc) {
      char dp[4200];
      ckpt_dir_shard_path(s->dir, s->db_shard[j->db], dp, sizeof dp);
      sr_fmt(j->err, sizeof j->err, "%s: table %u row %llu: %s", dp, plan->tables[t].table_id,
             (unsigned long long)j->key[q], e2);
    }
    j->found++;
  }
  kv_reader_release(rd);
}

/* Write buffer b's records, one WriteBatch per database (any thread). */
static void wbuf_write(shstore *s, sh_wbuf *b) {
  b->rc = 0;
  for (int k = 0; k < s->n_db && !b->rc; k++) {
    for (size_t r = 0; r < b->n; r++) {
      const unsigned char *p = b->rec + r * s->rec_bytes;
      uint64_t key;
      uint32_t t, d;
      memcpy(&key, p, 8);
      memcpy(&t, p + 8, 4);
      memcpy(&d, p + 12, 4);
      if ((int)d == k)
        kv_writes_put(b->w, s->db[k], (int)t, key, p + SH_REC_HEAD, kv_row_size(s->dim[t], s->slen[t]));
    }
    b->rc = kv_writes_commit(b->w, s->db[k], b->err, sizeof b->err);
  }
}

static void work_run(shstore *s, kv_reader *rd, sh_job *j, sh_wbuf *b) {
  if (j) job_read(s, rd, j);
  if (b) wbuf_write(s, b);
}

/* Under mu: j or b is done; the caller reaps it. */
static void work_done(shstore *s, sh_job *j, sh_wbuf *b) {
  if (j) {
    j->next = s->rdone;
    s->rdone = j;
  }
  if (b) {
    b->next = s->wdone;
    s->wdone = b;
    s->writing = 0;
    if (s->wq) pthread_cond_signal(&s->cv_work);
  }
  pthread_cond_broadcast(&s->cv_done);
}

static void *worker_main(void *arg) {
  sh_worker *w = arg;
  shstore *s = w->s;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    sh_job *j;
    sh_wbuf *b;
    if (work_pick(s, &j, &b)) {
      pthread_mutex_unlock(&s->mu);
      work_run(s, w->rd, j, b);
      pthread_mutex_lock(&s->mu);
      work_done(s, j, b);
      continue;
    }
    if (s->stop) break;
    pthread_cond_wait(&s->cv_work, &s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* ---- the caller's side ---- */

static void pidx_remove(shstore *s, const sh_wbuf *b, size_t r);

/* Take what the threads finished: loaded slots lose LOADING (FAILED when
 * the read failed), written buffers leave the pending index and are free. */
static void reap(shstore *s) {
  pthread_mutex_lock(&s->mu);
  sh_job *jd = s->rdone;
  sh_wbuf *bd = s->wdone;
  s->rdone = NULL;
  s->wdone = NULL;
  pthread_mutex_unlock(&s->mu);
  while (jd) {
    sh_job *j = jd;
    jd = j->next;
    for (size_t q = 0; q < j->n; q++) {
      sh_meta *m = slot_meta(s, j->slot[q]);
      m->flags = (uint16_t)((m->flags & ~F_LOADING) | (j->rc ? F_FAILED : 0));
    }
    if (j->rc) {
      s->rd_rc = j->rc;
      memcpy(s->rd_err, j->err, sizeof s->rd_err);
    }
    s->ctr.rocks_reads += j->n;
    s->ctr.rocks_found += j->found;
    s->reads_out--;
    j->next = s->jfree;
    s->jfree = j;
  }
  while (bd) {
    sh_wbuf *b = bd;
    bd = b->next;
    for (size_t r = 0; r < b->n; r++) pidx_remove(s, b, r);
    if (b->rc && !s->wb_rc) {
      s->wb_rc = b->rc;
      sr_fmt(s->wb_err, sizeof s->wb_err, "writing evicted rows back: %s", b->err);
    }
    s->ctr.wb_batches++;
    s->wbufs_out--;
    b->n = 0;
    b->next = s->wfree;
    s->wfree = b;
  }
}

/* Wait for some handed-over work to finish (there must be some), running
 * queued work on this thread meanwhile; then reap. */
static void wait_some(shstore *s) {
  double t0 = sr_now();
  pthread_mutex_lock(&s->mu);
  if (!s->rdone && !s->wdone) {
    sh_job *j;
    sh_wbuf *b;
    if (work_pick(s, &j, &b)) {
      pthread_mutex_unlock(&s->mu);
      work_run(s, s->crd, j, b);
      pthread_mutex_lock(&s->mu);
      work_done(s, j, b);
    } else {
      pthread_cond_wait(&s->cv_done, &s->mu);
    }
  }
  pthread_mutex_unlock(&s->mu);
  s->ctr.wait_ns += (uint64_t)((sr_now() - t0) * 1e9);
  reap(s);
}

/* Wait until every read and write handed over is done and reaped. */
static void drain(shstore *s);

static void job_submit(shstore *s, sh_job *j) {
  j->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->rq_tail) s->rq_tail->next = j;
  else s->rq = j;
  s->rq_tail = j;
  pthread_cond_signal(&s->cv_work);
  pthread_mutex_unlock(&s->mu);
  s->reads_out++;
}

static void wbuf_submit(shstore *s) {
  sh_wbuf *b = s->wcur;
  if (!b || !b->n) return;
  s->wcur = NULL;
  b->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->wq_tail) s->wq_tail->next = b;
  else s->wq = b;
  s->wq_tail = b;
  pthread_cond_signal(&s->cv_work);
  pthread_mutex_unlock(&s->mu);
  s->wbufs_out++;
}

static void drain(shstore *s) {
  wbuf_submit(s);
  while (s->reads_out || s->wbufs_out) wait_some(s);
}

/* Every job being filled, handed to the threads. */
static void jobs_submit(shstore *s) {
  for (int q = 0; q < s->n_open; q++) {
    job_submit(s, s->open[s->open_list[q]]);
    s->open[s->open_list[q]] = NULL;
  }
  s->n_open = 0;
}

static sh_job *job_get(shstore *s) {
  sh_job *j = s->jfree;
  if (j) {
    s->jfree = j->next;
  } else if ((j = calloc(1, sizeof *j))) {
    j->all = s->jall;
    s->jall = j;
  }
  return j;
}

static int job_grow(sh_job *j) {
  size_t cap = j->cap ? 2 * j->cap : 64;
  uint64_t *k = realloc(j->key, cap * sizeof *k);
  if (k) j->key = k;
  uint32_t *sl = realloc(j->slot, cap * sizeof *sl);
  if (sl) j->slot = sl;
  const char **v = realloc(j->vals, cap * sizeof *v);
  if (v) j->vals = v;
  size_t *l = realloc(j->lens, cap * sizeof *l);
  if (l) j->lens = l;
  if (!k || !sl || !v || !l) return SR_ENOMEM;
  j->cap = cap;
  return 0;
}

/* Slot (new, LOADING) gets row id of table t from database d by a read job. */
static int job_add(shstore *s, int d, uint32_t t, uint64_t id, uint32_t slot) {
  int q = d * s->n_tables + (int)t;
  sh_job *j = s->open[q];
  if (!j) {
    if (!(j = job_get(s))) return SR_ENOMEM;
    j->db = d;
    j->table = (int)t;
    j->n = 0;
    s->open[q] = j;
    s->open_list[s->n_open++] = q;
  }
  if (j->n == j->cap && job_grow(j)) return SR_ENOMEM;
  j->key[j->n] = id;
  j->slot[j->n] = slot;
  if (++j->n == SH_JOB_ROWS) { /* full: the threads start on it now */
    for (int k = 0; k < s->n_open; k++)
      if (s->open_list[k] == q) s->open_list[k] = s->open_list[--s->n_open];
    s->open[q] = NULL;
    job_submit(s, j);
  }
  return 0;
}

/* ---- the pending index: rows written back, not yet in RocksDB ---- */

static unsigned char *rec_at(const shstore *s, uint32_t loc) {
  return s->wbufs[loc / s->rows_per_buf].rec + (size_t)(loc % s->rows_per_buf) * s->rec_bytes;
}

static size_t pidx_probe(const shstore *s, uint32_t tag, uint32_t t, uint64_t key) {
  for (size_t h = tag & s->pmask;; h = (h + 1) & s->pmask) {
    const sh_entry *e = &s->pidx[h];
    if (!e->slot1) return h;
    if (e->tag == tag) {
      const unsigned char *p = rec_at(s, e->slot1 - 1);
      uint64_t k;
      uint32_t tt;
      memcpy(&k, p, 8);
      memcpy(&tt, p + 8, 4);
      if (k == key && tt == t) return h;
    }
  }
}

static void pidx_remove(shstore *s, const sh_wbuf *b, size_t r) {
  const unsigned char *p = b->rec + r * s->rec_bytes;
  uint64_t key;
  uint32_t t;
  memcpy(&key, p, 8);
  memcpy(&t, p + 8, 4);
  size_t h = pidx_probe(s, key_tag(t, key), t, key);
  if (s->pidx[h].slot1 == (uint32_t)(b->idx * s->rows_per_buf + r) + 1) /* else a newer one */
    entries_delete(s->pidx, s->pmask, h);
}

/* A free write buffer, waiting for one when every buffer is handed over. */
static sh_wbuf *wbuf_get(shstore *s) {
  if (!s->wfree) {
    double t0 = sr_now();
    s->ctr.wb_full_waits++;
    while (!s->wfree) wait_some(s);
    s->ctr.wb_wait_ns += (uint64_t)((sr_now() - t0) * 1e9);
  }
  sh_wbuf *b = s->wfree;
  s->wfree = b->next;
  b->n = 0;
  return b;
}

/* Write dirty slot i back: its row encoded into the current buffer and
 * entered in the pending index; the slot is clean after. */
static void writeback(shstore *s, uint32_t i) {
  if (!s->wcur) s->wcur = wbuf_get(s);
  sh_wbuf *b = s->wcur;
  sh_meta *m = slot_meta(s, i);
  uint32_t t = m->table, d = (uint32_t)db_of(s, (int)t, m->key);
  unsigned char *p = b->rec + b->n * s->rec_bytes;
  memcpy(p, &m->key, 8);
  memcpy(p + 8, &t, 4);
  memcpy(p + 12, &d, 4);
  kv_row_encode(s->dim[t], s->slen[t], slot_row(s, i), p + SH_REC_HEAD);
  uint32_t tag = key_tag(t, m->key);
  size_t h = pidx_probe(s, tag, t, m->key);
  s->pidx[h].slot1 = (uint32_t)(b->idx * s->rows_per_buf + b->n) + 1;
  s->pidx[h].tag = tag;
  b->n++;
  m->flags &= (uint16_t)~F_DIRTY;
  s->ctr.writebacks++;
  if (b->n == s->rows_per_buf) wbuf_submit(s);
}

/* A free slot: a never-used one, else CLOCK's victim (written back if dirty). */
static uint32_t slot_alloc(shstore *s) {
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
    if (m->flags & F_DIRTY) writeback(s, i);
    entries_delete(s->map, s->mask, probe(s, key_tag(m->table, m->key), m->table, m->key));
    s->ctr.evictions++;
    return i;
  }
}

/* Row id of table t (database d) into the map, pinned once: its slot when
 * there (a repeated id), else a new slot filled from the pending index or
 * left LOADING for a read job. NONE32 when out of memory. */
static uint32_t row_bring(shstore *s, uint32_t t, uint64_t id, int d) {
  uint32_t tag = key_tag(t, id);
  size_t h = probe(s, tag, t, id);
  if (!s->map[h].slot1) {
    uint32_t slot = slot_alloc(s);
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
      kv_row_decode(rec_at(s, s->pidx[ph].slot1 - 1) + SH_REC_HEAD,
                    kv_row_size(s->dim[t], s->slen[t]), s->dim[t], s->slen[t], slot_row(s, slot),
                    e2, sizeof e2); /* our own encoding: cannot fail */
      s->ctr.pending_hits++;
    } else {
      m->flags |= F_LOADING;
      if (job_add(s, d, t, id, slot)) {
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
static int slot_reload(shstore *s, uint32_t slot) {
  sh_meta *m = slot_meta(s, slot);
  m->flags = (uint16_t)((m->flags & ~F_FAILED) | F_LOADING);
  if (job_add(s, db_of(s, m->table, m->key), m->table, m->key, slot)) {
    m->flags = (uint16_t)((m->flags & ~F_LOADING) | F_FAILED);
    return SR_ENOMEM;
  }
  return 0;
}

static void slot_wait(shstore *s, uint32_t slot) {
  if (!(slot_meta(s, slot)->flags & F_LOADING)) return;
  s->ctr.load_waits++;
  while (slot_meta(s, slot)->flags & F_LOADING) wait_some(s);
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
    if ((s->it_slot[i] = row_bring(s, s->it_t[i], s->it_id[i], s->mcf[j])) == NONE32) rc = SR_ENOMEM;
  }
  for (size_t i = 0; i < n && !rc; i++)
    if (s->it_slot[i] != NONE32 && (slot_meta(s, s->it_slot[i])->flags & F_FAILED))
      rc = slot_reload(s, s->it_slot[i]);
  jobs_submit(s);
  for (size_t i = 0; i < n; i++)
    if (s->it_slot[i] != NONE32) slot_wait(s, s->it_slot[i]);
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

/* ---- prefetch pins ---- */

/* Drop the pins of every prefetched step below step (upto: at or below). */
static void pins_release(shstore *s, int64_t step, int upto) {
  int k = 0;
  while (k < s->n_pf && (s->pf[k].step < step || (upto && s->pf[k].step == step))) {
    sh_pinset *p = &s->pf[k];
    for (size_t i = 0; i < p->n; i++) {
      slot_wait(s, p->slot[i]); /* an unpinned slot is never LOADING */
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
    m->flags |= F_REF;
    if ((m->flags & F_FAILED) && slot_reload(s, slot)) {
      m->pins--;
      return 1;
    }
    s->ctr.prefetch_cached++;
  } else {
    int d = db_of(s, (int)t, id);
    if (d < 0) return 0; /* not hosted here: the lookup says so */
    if ((slot = row_bring(s, t, id, d)) == NONE32) return 1;
    s->ctr.prefetched++;
  }
  p->slot[p->n++] = slot;
  s->pf_pinned++;
  return 0;
}

/* The look-ahead op (store.h): every id of step pinned, misses read by the
 * threads; stops at the pin limit (the rest is read by the step's lookup). */
static int sh_prefetch(emb_store *b, int64_t step, const emb_idset *ids) {
  shstore *s = (shstore *)b;
  int rc = check_ids(s, ids, "prefetch");
  if (rc) return rc;
  reap(s);
  if (s->wb_rc) return 0; /* the next lookup or push reports it */
  sh_pinset *p = pins_of(s, step);
  if (!p) return 0; /* out of memory: the lookup reads the rows */
  int full = 0;
  for (int t = 0; t < s->n_tables && !full; t++)
    for (size_t r = 0; r < ids->counts[t] && !full; r++)
      full = prefetch_one(s, p, (uint32_t)t, ids->ids[t][r]);
  if (full) s->ctr.prefetch_stops++;
  jobs_submit(s);
  wbuf_submit(s);
  return 0;
}

/* Common start of a lookup or push of step: finished work reaped, a failed
 * write-back reported, earlier steps' prefetch pins dropped. */
static int call_begin(shstore *s, int64_t step) {
  reap(s);
  pins_release(s, step, 0);
  if (s->wb_rc) {
    memcpy(s->err, s->wb_err, sizeof s->err);
    return s->wb_rc;
  }
  return 0;
}

/* Walk every (table, r) of ids in chunks; per chunk resolve then act. */
typedef void (*chunk_fn)(shstore *s, size_t n, const size_t *it_r, void *ctx);

static int chunk_run(shstore *s, size_t n, const size_t *it_r, chunk_fn fn, void *ctx,
                     uint64_t *hits) {
  int rc = chunk_resolve(s, n, hits);
  if (!rc) fn(s, n, it_r, ctx);
  chunk_unpin(s, n);
  return rc;
}

static int for_chunks(shstore *s, const emb_idset *ids, size_t *it_r, chunk_fn fn, void *ctx,
                      uint64_t *hits) {
  size_t n = 0;
  for (int t = 0; t < s->n_tables; t++)
    for (size_t r = 0; r < ids->counts[t]; r++) {
      s->it_t[n] = (uint32_t)t;
      s->it_id[n] = ids->ids[t][r];
      it_r[n] = r;
      if (++n == s->chunk) {
        int rc = chunk_run(s, n, it_r, fn, ctx, hits);
        if (rc) return rc;
        n = 0;
      }
    }
  return n ? chunk_run(s, n, it_r, fn, ctx, hits) : 0;
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

/* Item i's row where a push may write it: a slot an answer is being sent
 * from (or a copy of it left for one) is first replaced by the row's copy
 * in a fresh slot (see the top), or by the copy an earlier item of the
 * chunk made. The chunk's pin moves with it. */
static void slot_unshare(shstore *s, size_t i) {
  uint32_t x = s->it_slot[i], t = s->it_t[i];
  if (!slot_sent(s, x) && !(slot_meta(s, x)->flags & F_DETACHED)) return;
  uint64_t id = s->it_id[i];
  uint32_t tag = key_tag(t, id), y = s->map[probe(s, tag, t, id)].slot1 - 1;
  if (y == x) {
    y = slot_alloc(s); /* never x: pinned */
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

static void push_act(shstore *s, size_t n, const size_t *it_r, void *vctx) {
  push_ctx *c = vctx;
  const emb_plan *plan = s->base.plan;
  for (size_t i = 0; i < n; i++) {
    if (s->sends) slot_unshare(s, i);
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

/* Misses gathered by a lookup: resolved (read, insert) and copied out. */
static int lookup_flush_misses(shstore *s, size_t *nm, float *const *out) {
  if (!*nm) return 0;
  size_t *it_r = s->mitem + s->chunk;
  memcpy(s->it_t, s->ms_t, *nm * sizeof *s->it_t);
  memcpy(s->it_id, s->ms_id, *nm * sizeof *s->it_id);
  memcpy(it_r, s->ms_r, *nm * sizeof *it_r);
  uint64_t dummy = 0;
  lookup_ctx c = {out};
  int rc = chunk_run(s, *nm, it_r, lookup_act, &c, &dummy);
  *nm = 0;
  return rc;
}

/* dim floats from src to dst; the common dims as fixed-size copies, which
 * the compiler inlines instead of a memcpy call per row. */
static inline void row_copy(float *dst, const float *src, size_t dim) {
  switch (dim) {
    case 16: memcpy(dst, src, 16 * sizeof(float)); break;
    case 32: memcpy(dst, src, 32 * sizeof(float)); break;
    case 64: memcpy(dst, src, 64 * sizeof(float)); break;
    case 128: memcpy(dst, src, 128 * sizeof(float)); break;
    default: memcpy(dst, src, dim * sizeof(float));
  }
}

/* One pass of n <= SH_PASS ids of table t (out rows o): hits copied, the
 * rest (misses, rows being loaded or whose read failed) gathered for
 * lookup_flush_misses, in id order. Software-pipelined, SH_AHEAD ids
 * between the stages, so that memory is asked for well before it is used
 * and the lines in flight are the ones used next: id i + 2A's map entry is
 * prefetched, id i + A's first tag match found and its slot (header and
 * row) prefetched, id i's key checked and its row copied. The map and slab
 * are read through locals (stores to s's scratch would make the compiler
 * reload them from s). */
static uint64_t lookup_pass(shstore *s, uint32_t t, const uint64_t *id, size_t n, size_t base,
                            float *o, size_t *nm) {
  const size_t dim = (size_t)s->dim[t], row_end = sizeof(sh_meta) + dim * sizeof(float) - 1;
  const size_t mask = s->mask, sb = s->slot_bytes, a = SH_AHEAD;
  const sh_entry *map = s->map;
  unsigned char *slab = s->slab;
  uint32_t tag[SH_PASS], s1[SH_PASS];
  uint64_t hits = 0;
  for (size_t i = 0; i < n + 2 * a; i++) {
    if (i < n) {
      tag[i] = key_tag(t, id[i]);
      __builtin_prefetch(&map[tag[i] & mask], 0, 3);
    }
    if (i >= a && i - a < n) {
      size_t j = i - a, h = tag[j] & mask;
      while (map[h].slot1 && map[h].tag != tag[j]) h = (h + 1) & mask;
      if ((s1[j] = map[h].slot1)) {
        const unsigned char *m = slab + (size_t)(s1[j] - 1) * sb;
        __builtin_prefetch(m, 0, 3);
        __builtin_prefetch(m + row_end, 0, 3);
      }
    }
    if (i < 2 * a) continue;
    size_t j = i - 2 * a;
    sh_meta *m = s1[j] ? (sh_meta *)(slab + (size_t)(s1[j] - 1) * sb) : NULL;
    if (m && (m->key != id[j] || m->table != t)) { /* another key's tag: probe on */
      uint32_t e = map[probe(s, tag[j], t, id[j])].slot1;
      m = e ? slot_meta(s, e - 1) : NULL;
    }
    if (m && !(m->flags & (F_LOADING | F_FAILED))) {
      if (!(m->flags & F_REF)) m->flags |= F_REF; /* hot rows' lines stay clean */
      row_copy(o + (base + j) * dim, (const float *)(m + 1), dim);
      hits++;
    } else {
      s->ms_t[*nm] = t;
      s->ms_id[*nm] = id[j];
      s->ms_r[*nm] = base + j;
      (*nm)++;
    }
  }
  return hits;
}

/* Lookups take a lean path for hits (no pinning: a hit is copied out before
 * anything can evict it) and gather the rest for chunk_resolve. */
static int sh_lookup_begin(emb_store *b, int64_t step, const emb_idset *ids, float *const *out) {
  shstore *s = (shstore *)b;
  int rc = check_ids(s, ids, "lookup");
  if (!rc) rc = call_begin(s, step);
  if (rc) return s->last_lookup_rc = rc;
  uint64_t hits = 0, total = 0;
  size_t nm = 0;
  const size_t pass = s->chunk < SH_PASS ? s->chunk : SH_PASS;
  for (int t = 0; t < s->n_tables && !rc; t++) {
    const size_t cnt = ids->counts[t];
    total += cnt;
    for (size_t base = 0; base < cnt && !rc; base += pass) {
      size_t n = cnt - base < pass ? cnt - base : pass;
      if (nm + n > s->chunk && (rc = lookup_flush_misses(s, &nm, out))) break;
      hits += lookup_pass(s, (uint32_t)t, ids->ids[t] + base, n, base, out[t], &nm);
    }
  }
  if (!rc) rc = lookup_flush_misses(s, &nm, out);
  wbuf_submit(s);
  if (!rc) {
    s->st.lookups += total;
    s->st.hits += hits;
  }
  return s->last_lookup_rc = rc;
}

static int sh_lookup_wait(emb_store *b) { return ((shstore *)b)->last_lookup_rc; }

/* ---- send pins (see the top) ---- */

static void sends_unref(sh_sends *d) {
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

static void sh_pins_release(emb_pins *p) {
  if (!p) return;
  sh_sends *d = p->sends;
  for (size_t i = 0; i < p->n; i++)
    if (atomic_fetch_sub_explicit(&d->cnt[p->slot[i]], 1, memory_order_acq_rel) == 1)
      atomic_fetch_sub_explicit(&d->held, 1, memory_order_relaxed);
  free(p);
  sends_unref(d);
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

/* Rows of ids a lookup would count as hits: resident, loaded, not failed. */
static uint64_t count_hits(const shstore *s, const emb_idset *ids) {
  uint64_t hits = 0;
  for (int t = 0; t < s->n_tables; t++)
    for (size_t r = 0; r < ids->counts[t]; r++) {
      uint64_t id = ids->ids[t][r];
      uint32_t s1 = s->map[probe(s, key_tag((uint32_t)t, id), (uint32_t)t, id)].slot1;
      hits += s1 && !(slot_meta(s, s1 - 1)->flags & (F_LOADING | F_FAILED));
    }
  return hits;
}

/* The lookup_pinned op (store.h): the rows resolved chunk by chunk as a
 * lookup's misses are, each slot send-pinned once per row. */
static int sh_lookup_pinned(emb_store *b, int64_t step, const emb_idset *ids,
                            const float **const *rows, emb_pins **pins) {
  shstore *s = (shstore *)b;
  *pins = NULL;
  int rc = check_ids(s, ids, "lookup");
  if (!rc) rc = call_begin(s, step);
  if (rc) return rc;
  size_t total = 0;
  for (int t = 0; t < s->n_tables; t++) total += ids->counts[t];
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
  uint64_t hits = count_hits(s, ids), dummy = 0;
  pinned_ctx c = {rows, p};
  rc = for_chunks(s, ids, s->mitem + s->chunk, pinned_act, &c, &dummy);
  wbuf_submit(s);
  if (rc) {
    sh_pins_release(p);
    return rc;
  }
  s->st.lookups += total;
  s->st.hits += hits;
  *pins = p;
  return 0;
}

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

/* At open: a hosted shard with no mark whose database was there before
 * this open (existed[k]) or holds rows was not stopped cleanly. Rows alone
 * would miss a crash that lost every write: write-backs skip the
 * write-ahead log, so rows not yet flushed go with the process. Then every
 * mark goes, before anything is written. */
static int marks_check(shstore *s, const uint8_t *existed) {
  for (int k = 0; k < s->n_db; k++) {
    char p[SR_PATH_MAX];
    if (mark_path(s, k, p, sizeof p)) {
      sr_fmt(s->err, sizeof s->err, "%s: path too long", s->dir);
      return SR_ERANGE;
    }
    if (!sr_is_file(p) && (existed[k] || db_has_rows(s, k))) s->unclean = 1;
  }
  return marks_remove(s);
}

int emb_shard_mark_clean(emb_store *b) {
  if (!b || emb_store_kind_of(b) != EMB_STORE_SHARD) return SR_EINVAL;
  shstore *s = (shstore *)b;
  int rc = sh_flush(b);
  if (rc || s->unclean) return rc; /* a crash's rows stay unmarked until a restore */
  /* Write-backs skip the write-ahead log (kv_writes): on disk only once
   * the memtables are flushed, which the mark must follow. */
  for (int k = 0; k < s->n_db; k++)
    if ((rc = kv_flush(s->db[k], s->err, sizeof s->err))) return rc;
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

void emb_shard_accept_unclean(emb_store *b) {
  if (b && emb_store_kind_of(b) == EMB_STORE_SHARD) ((shstore *)b)->unclean = 0;
}

static int push_apply(shstore *s, float lr, const emb_idset *ids, const float *const *grads) {
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

/* A push of step; its prefetch pins (and earlier steps') go, whatever the
 * outcome. */
static int sh_push(emb_store *b, int64_t step, float lr, const emb_idset *ids,
                   const float *const *grads) {
  shstore *s = (shstore *)b;
  int rc = call_begin(s, step);
  if (!rc) rc = push_apply(s, lr, ids, grads);
  pins_release(s, step, 1);
  wbuf_submit(s);
  return rc;
}

/* Every dirty row written back and in RocksDB (and every read done). */
static int sh_flush(emb_store *b) {
  shstore *s = (shstore *)b;
  drain(s);
  for (uint32_t i = 0; i < s->used && !s->wb_rc; i++)
    if (slot_meta(s, i)->flags & F_DIRTY) writeback(s, i);
  drain(s);
  if (s->wb_rc) memcpy(s->err, s->wb_err, sizeof s->err);
  return s->wb_rc;
}

/* Open every hosted shard's database not open yet; existed[k] (when not
 * NULL): 1 when database k was there before (its CURRENT file). */
static int open_dbs(shstore *s, uint8_t *existed) {
  const emb_plan *plan = s->base.plan;
  uint32_t *ids = malloc((size_t)s->n_tables * sizeof *ids);
  if (!ids) return SR_ENOMEM;
  for (int t = 0; t < s->n_tables; t++) ids[t] = plan->tables[t].table_id;
  int rc = 0;
  for (int k = 0; k < s->n_db && !rc; k++) {
    if (s->db[k]) continue;
    char path[4096], cur[4096 + 16];
    if (ckpt_dir_shard_path(s->dir, s->db_shard[k], path, sizeof path)) {
      sr_fmt(s->err, sizeof s->err, "%s: path too long", s->dir);
      rc = SR_ERANGE;
      break;
    }
    snprintf(cur, sizeof cur, "%s/CURRENT", path);
    if (existed) existed[k] = (uint8_t)sr_is_file(cur);
    rc = kv_open(path, s->n_tables, ids, &s->sopts, &s->db[k], s->err, sizeof s->err);
  }
  free(ids);
  return rc;
}

/* Forget every cached row and prefetch pin (nothing in flight: drained). */
static void drop_cache(shstore *s) {
  for (int k = 0; k < s->n_pf; k++) s->pf[k].n = 0;
  s->n_pf = 0;
  s->pf_pinned = 0;
  memset(s->map, 0, (s->mask + 1) * sizeof *s->map);
  s->hand = 0;
  if (sends_held(s)) { /* answers are sent from some: every slot detached, taken when free */
    for (uint32_t i = 0; i < s->used; i++) {
      slot_meta(s, i)->flags = F_DETACHED;
      slot_meta(s, i)->pins = 0;
    }
    return;
  }
  s->used = 0;
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
  drain(s);
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
  int rc = open_dbs(s, NULL);
  if (!rc) {
    s->unclean = 0; /* every row is the checkpoint's now */
    s->wb_rc = 0;   /* and a failed write-back's rows with them */
  }
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

/* The write buffers, the pending index, the job table and the store
 * threads (n of them; 0: the caller does all the work). */
static int pool_create(shstore *s, int n) {
  s->rec_bytes = (SH_REC_HEAD + KV_ROW_HEADER + 4 * (size_t)s->stride + 7) & ~(size_t)7;
  s->rows_per_buf = EMB_SHARD_WB_BYTES / s->rec_bytes;
  if (!s->rows_per_buf) s->rows_per_buf = 1;
  size_t pcap = 64;
  while (pcap < 2 * EMB_SHARD_WB_BUFFERS * s->rows_per_buf) pcap <<= 1;
  s->pmask = pcap - 1;
  s->pidx = calloc(pcap, sizeof *s->pidx);
  s->wbufs = calloc(EMB_SHARD_WB_BUFFERS, sizeof *s->wbufs);
  s->open = calloc((size_t)s->n_db * (size_t)s->n_tables + 1, sizeof *s->open);
  s->open_list = malloc(((size_t)s->n_db * (size_t)s->n_tables + 1) * sizeof *s->open_list);
  s->crd = kv_reader_create();
  if (!s->pidx || !s->wbufs || !s->open || !s->open_list || !s->crd) return SR_ENOMEM;
  for (int k = 0; k < EMB_SHARD_WB_BUFFERS; k++) {
    sh_wbuf *b = &s->wbufs[k];
    b->idx = (uint32_t)k;
    if (!(b->rec = malloc(s->rows_per_buf * s->rec_bytes)) || !(b->w = kv_writes_create()))
      return SR_ENOMEM;
    b->next = s->wfree;
    s->wfree = b;
  }
  if (pthread_mutex_init(&s->mu, NULL)) return SR_ENOMEM;
  if (pthread_cond_init(&s->cv_work, NULL)) {
    pthread_mutex_destroy(&s->mu);
    return SR_ENOMEM;
  }
  if (pthread_cond_init(&s->cv_done, NULL)) {
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->mu);
    return SR_ENOMEM;
  }
  s->pool_ok = 1;
  if (!(s->wk = calloc((size_t)(n ? n : 1), sizeof *s->wk))) return SR_ENOMEM;
  s->n_wk = n;
  for (int k = 0; k < n; k++) {
    s->wk[k].s = s;
    if (!(s->wk[k].rd = kv_reader_create())) return SR_ENOMEM;
    if (pthread_create(&s->wk[k].th, NULL, worker_main, &s->wk[k])) return SR_ENOMEM;
    s->n_workers++;
  }
  return 0;
}

/* Join the threads once they have done every piece of work queued. */
static void pool_stop(shstore *s) {
  if (!s->pool_ok) return;
  wbuf_submit(s);
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_broadcast(&s->cv_work);
  pthread_mutex_unlock(&s->mu);
  for (int k = 0; k < s->n_workers; k++) pthread_join(s->wk[k].th, NULL);
  s->n_workers = 0;
  /* no thread left: what is still queued (with none, all) is done here */
  while (s->rq || s->wq) {
    sh_job *j;
    sh_wbuf *b;
    work_pick(s, &j, &b);
    work_run(s, s->crd, j, b);
    work_done(s, j, b);
  }
}

static void pool_free(shstore *s) {
  if (s->wk)
    for (int k = 0; k < s->n_wk; k++) kv_reader_destroy(s->wk[k].rd);
  free(s->wk);
  if (s->pool_ok) {
    pthread_cond_destroy(&s->cv_done);
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->mu);
  }
  while (s->jall) {
    sh_job *j = s->jall;
    s->jall = j->all;
    free(j->key);
    free(j->slot);
    free(j->vals);
    free(j->lens);
    free(j);
  }
  if (s->wbufs)
    for (int k = 0; k < EMB_SHARD_WB_BUFFERS; k++) {
      free(s->wbufs[k].rec);
      kv_writes_destroy(s->wbufs[k].w);
    }
  free(s->wbufs);
  for (int k = 0; k < s->cap_pf; k++) free(s->pf[k].slot);
  free(s->pf);
  free(s->pidx);
  free(s->open);
  free(s->open_list);
  kv_reader_destroy(s->crd);
}

static void sh_destroy(emb_store *b) {
  shstore *s = (shstore *)b;
  pool_stop(s); /* queued write-backs are written first */
  if (s->db) {
    for (int k = 0; k < s->n_db; k++) kv_close(s->db[k]);
  }
  free(s->db);
  free(s->db_shard);
  free(s->shard_db);
  free(s->dim);
  free(s->slen);
  if (s->sends) { /* answers still out keep the slots until their release */
    s->sends->slab = s->slab;
    sends_unref(s->sends);
  } else {
    free(s->slab);
  }
  free(s->map);
  free(s->it_t);
  free(s->it_id);
  free(s->it_pos);
  free(s->it_slot);
  free(s->miss);
  free(s->mcf);
  free(s->mitem);
  free(s->ms_t);
  free(s->ms_id);
  free(s->ms_r);
  free(s->tmp);
  free(s->dir);
  pool_free(s);
  free(s);
}

static const emb_store_ops shard_ops = {
    .kind = EMB_STORE_SHARD,
    .ckpt_layout = EMB_CKPT_SHARD_FOLDERS,
    .lookup_begin = sh_lookup_begin,
    .lookup_wait = sh_lookup_wait,
    .prefetch = sh_prefetch,
    .lookup_pinned = sh_lookup_pinned,
    .pins_release = sh_pins_release,
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
  out->pinned = s->pf_pinned;
  out->send_held = sends_held(s);
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
  s->mitem = malloc(2 * c * sizeof *s->mitem); /* second half: the chunk's row indices */
  s->ms_t = malloc(c * sizeof *s->ms_t);
  s->ms_id = malloc(c * sizeof *s->ms_id);
  s->ms_r = malloc(c * sizeof *s->ms_r);
  s->tmp = malloc(4 * (size_t)s->stride);
  if (!s->map || !s->slab || !s->it_t || !s->it_id || !s->it_pos || !s->it_slot || !s->miss ||
      !s->mcf || !s->mitem || !s->ms_t || !s->ms_id || !s->ms_r || !s->tmp)
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
  s->pf_limit = s->cap - s->chunk - 1;
  if (pool_create(s, cfg->threads ? (cfg->threads < 0 ? 0 : cfg->threads)
                                  : EMB_SHARD_DEFAULT_THREADS))
    goto nomem;
  uint8_t *existed = calloc((size_t)s->n_db, 1);
  if (!existed) goto nomem;
  if (open_dbs(s, existed) || marks_check(s, existed)) {
    free(existed);
    sr_fmt(err, errlen, "shard store: %s", s->err);
    sh_destroy(&s->base);
    return NULL;
  }
  free(existed);
  return &s->base;
nomem:
  sr_fmt(err, errlen, "shard store: out of memory");
  if (s) sh_destroy(&s->base);
  return NULL;
}
