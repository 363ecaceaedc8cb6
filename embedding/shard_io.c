/* The shard store's I/O (see shard_impl.h): the store threads, which read
 * misses into their slots (read jobs, one batched MultiGet each) and write
 * evicted dirty rows back (write buffers, gathered into write sets, each
 * ingested as SST files, in order), and the caller's side of them: handing
 * work over, waiting for it (running queued work meanwhile), reaping what
 * is done; the pending index of rows written back and not yet in RocksDB. */
#include "embedding/shard_impl.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"

/* ---- the store threads ---- */

/* Under mu: the next piece of work, a read first; then (writes) the queued
 * write buffers, all of them as one write set, once EMB_SHARD_WB_SET are
 * queued (or a drain forces them out) and no other set is being written
 * (sets are written in order). 1 when one is taken. */
static int work_pick(shstore *s, int writes, sh_job **j, sh_wbuf **b) {
  *j = NULL;
  *b = NULL;
  if (s->rq) {
    *j = s->rq;
    if (!(s->rq = s->rq->next)) s->rq_tail = NULL;
    return 1;
  }
  if (writes && s->wq && !s->writing && (s->n_wq >= EMB_SHARD_WB_SET || s->wforce)) {
    *b = s->wq;
    s->wq = s->wq_tail = NULL;
    s->n_wq = 0;
    s->wforce = 0;
    s->writing = 1;
    return 1;
  }
  return 0;
}

/* Sift-down of a heap of job j's (key, slot) pairs, keys the order. */
static void job_sift(sh_job *j, size_t i, size_t n) {
  for (size_t c; (c = 2 * i + 1) < n; i = c) {
    if (c + 1 < n && j->key[c + 1] > j->key[c]) c++;
    if (j->key[c] <= j->key[i]) return;
    uint64_t k = j->key[i];
    uint32_t sl = j->slot[i];
    j->key[i] = j->key[c], j->slot[i] = j->slot[c];
    j->key[c] = k, j->slot[c] = sl;
  }
}

/* Job j's rows in ascending row id (a heap sort in place, slots moved with
 * their ids), so that RocksDB's MultiGet takes them as they are (no sort of
 * its own) and walks the SST blocks in order. */
static void job_sort(sh_job *j) {
  size_t n = j->n;
  for (size_t i = n / 2; i-- > 0;) job_sift(j, i, n);
  for (size_t e = n; e-- > 1;) {
    uint64_t k = j->key[0];
    uint32_t sl = j->slot[0];
    j->key[0] = j->key[e], j->slot[0] = j->slot[e];
    j->key[e] = k, j->slot[e] = sl;
    job_sift(j, 0, e);
  }
}

/* Read job j into its slots with reader rd (any thread). */
static void job_read(shstore *s, kv_reader *rd, sh_job *j) {
  const emb_plan *plan = s->base.plan;
  const int t = j->table, dim = s->dim[t], sl = s->slen[t];
  j->found = 0;
  char e2[512];
  uint64_t c0 = sr_thread_cpu_ns();
  job_sort(j);
  uint64_t cs = sr_thread_cpu_ns();
  j->rc = kv_reader_get_sorted_cf(rd, s->db[j->db], t, j->n, j->key, j->vals, j->lens, e2,
                                  sizeof e2);
  uint64_t c1 = sr_thread_cpu_ns();
  if (j->rc) {
    char dp[4200];
    ckpt_dir_shard_path(s->dir, s->db_shard[j->db], dp, sizeof dp);
    sr_fmt(j->err, sizeof j->err, "%s: table %u: %s", dp, plan->tables[t].table_id, e2);
  }
  for (size_t q = 0; q < j->n && !j->rc; q++) {
    float row[2 * EMB_MAX_DIM + 1];
    if (!j->vals[q]) {
      emb_store_absent_row(&s->base, t, j->key[q], row);
      emb_optim_state_init(&plan->tables[t].optim, dim, row + dim);
      slot_put(s, j->slot[q], (uint32_t)t, row);
      continue;
    }
    j->rc = kv_row_decode_w(j->vals[q], j->lens[q], dim, sl, sh_wprec(s, (uint32_t)t), row, e2,
                            sizeof e2);
    if (!j->rc) slot_put(s, j->slot[q], (uint32_t)t, row);
    if (j->rc) {
      char dp[4200];
      ckpt_dir_shard_path(s->dir, s->db_shard[j->db], dp, sizeof dp);
      sr_fmt(j->err, sizeof j->err, "%s: table %u row %llu: %s", dp, plan->tables[t].table_id,
             (unsigned long long)j->key[q], e2);
    }
    j->found++;
  }
  uint64_t c2 = sr_thread_cpu_ns();
  kv_reader_release(rd);
  j->rocks_ns = c1 - cs + (sr_thread_cpu_ns() - c2);
  j->own_ns = cs - c0 + (c2 - c1);
}

static int wsort_cmp(const void *a, const void *b) {
  const sh_wsort *x = a, *y = b;
  if (x->dt != y->dt) return x->dt < y->dt ? -1 : 1;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->r < y->r ? -1 : x->r > y->r;
}

/* Write set b (buffers linked in the order they were handed over) into
 * RocksDB (any thread): its records sorted by (database, table, row id,
 * hand-over order), a row's newest record kept, and each (database, table)
 * run written as one SST file and ingested (kv_ingest: no memtable insert,
 * no flush after). The sort is the shard store's own work; the files and
 * their ingestion are RocksDB's. The outcome is b's (the set's first). */
static void wset_write(shstore *s, sh_wbuf *b) {
  const size_t per = s->rows_per_buf;
  size_t n = 0;
  int nb = 0;
  uint64_t c0 = sr_thread_cpu_ns();
  for (sh_wbuf *x = b; x; x = x->next, nb++) {
    x->rc = 0;
    x->rocks_ns = x->own_ns = 0;
    x->written = 0;
    for (size_t r = 0; r < x->n; r++, n++) {
      const unsigned char *p = x->rec + r * s->rec_bytes;
      uint32_t t, d;
      memcpy(&s->word[n].key, p, 8);
      memcpy(&t, p + 8, 4);
      memcpy(&d, p + 12, 4);
      s->word[n].dt = (uint64_t)d << 32 | t;
      s->word[n].r = (uint32_t)((size_t)nb * per + r);
      s->word[n].loc = (uint32_t)(x->idx * per + r);
    }
  }
  qsort(s->word, n, sizeof *s->word, wsort_cmp);
  uint64_t c1 = sr_thread_cpu_ns();
  int rc = 0;
  for (size_t i = 0; i < n && !rc;) {
    const uint64_t dt = s->word[i].dt;
    const int d = (int)(dt >> 32), t = (int)(uint32_t)dt;
    const size_t len = kv_row_size_w(s->dim[t], s->slen[t], sh_wprec(s, (uint32_t)t));
    rc = kv_ingest_begin(s->ing, s->db[d], t, b->err, sizeof b->err);
    for (; i < n && s->word[i].dt == dt && !rc; i++) {
      if (i + 1 < n && s->word[i + 1].dt == dt && s->word[i + 1].key == s->word[i].key)
        continue; /* a newer record of the row follows */
      rc = kv_ingest_put(s->ing, s->word[i].key, rec_at(s, s->word[i].loc) + SH_REC_HEAD, len,
                         b->err, sizeof b->err);
      b->written++;
    }
    if (!rc) rc = kv_ingest_commit(s->ing, b->err, sizeof b->err);
  }
  b->rc = rc;
  b->own_ns = c1 - c0;
  b->rocks_ns = sr_thread_cpu_ns() - c1;
}

static void work_run(shstore *s, kv_reader *rd, sh_job *j, sh_wbuf *b) {
  if (j) job_read(s, rd, j);
  if (b) wset_write(s, b);
}

/* Under mu: j or b is done; the caller reaps it. */
static void work_done(shstore *s, sh_job *j, sh_wbuf *b) {
  if (j) {
    j->next = s->rdone;
    s->rdone = j;
  }
  if (b) {
    while (b) {
      sh_wbuf *x = b;
      b = x->next;
      x->next = s->wdone;
      s->wdone = x;
    }
    s->writing = 0;
    if (s->wq) pthread_cond_signal(&s->cv_work);
  }
  pthread_cond_broadcast(&s->cv_done);
}

static void *worker_main(void *arg) {
  sh_worker *w = arg;
  shstore *s = w->s;
  sr_thread_name("sr:store-io");
  pthread_mutex_lock(&s->mu);
  for (;;) {
    sh_job *j;
    sh_wbuf *b;
    if (work_pick(s, 1, &j, &b)) {
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
void shard__reap(shstore *s) {
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
    s->ctr.rocks_read_ns += j->rocks_ns;
    s->ctr.io_own_ns += j->own_ns;
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
    s->ctr.wb_rows += b->written;
    s->ctr.rocks_write_ns += b->rocks_ns;
    s->ctr.io_own_ns += b->own_ns;
    s->wbufs_out--;
    b->n = 0;
    b->next = s->wfree;
    s->wfree = b;
  }
}

/* Wait for some handed-over work to finish (there must be some), running
 * queued work on this thread meanwhile (write sets only when writes); then
 * reap. */
void shard__wait_some(shstore *s, int writes) {
  double t0 = sr_now();
  pthread_mutex_lock(&s->mu);
  if (!s->rdone && !s->wdone) {
    sh_job *j;
    sh_wbuf *b;
    if (work_pick(s, writes, &j, &b)) {
      pthread_mutex_unlock(&s->mu);
      uint64_t c0 = sr_thread_cpu_ns();
      work_run(s, s->crd, j, b);
      s->inline_ns += sr_thread_cpu_ns() - c0;
      pthread_mutex_lock(&s->mu);
      work_done(s, j, b);
    } else {
      pthread_cond_wait(&s->cv_done, &s->mu);
    }
  }
  pthread_mutex_unlock(&s->mu);
  s->ctr.wait_ns += (uint64_t)((sr_now() - t0) * 1e9);
  shard__reap(s);
}

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

/* The write buffer being filled, handed to the threads. */
static void wbuf_submit(shstore *s) {
  sh_wbuf *b = s->wcur;
  if (!b || !b->n) return;
  s->wcur = NULL;
  b->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->wq_tail) s->wq_tail->next = b;
  else s->wq = b;
  s->wq_tail = b;
  if (++s->n_wq >= EMB_SHARD_WB_SET) pthread_cond_signal(&s->cv_work);
  pthread_mutex_unlock(&s->mu);
  s->wbufs_out++;
}

/* The queued write buffers written now, however few (none queued: no
 * later buffer is forced out alone). */
static void wbuf_force(shstore *s) {
  pthread_mutex_lock(&s->mu);
  if (s->wq) {
    s->wforce = 1;
    pthread_cond_signal(&s->cv_work);
  }
  pthread_mutex_unlock(&s->mu);
}

/* Wait until every read and write handed over is done and reaped. */
void shard__drain(shstore *s) {
  wbuf_submit(s);
  if (s->wbufs_out) wbuf_force(s);
  while (s->reads_out || s->wbufs_out) shard__wait_some(s, 1);
}

/* Every job being filled, handed to the threads. */
void shard__jobs_submit(shstore *s) {
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
int shard__job_add(shstore *s, int d, uint32_t t, uint64_t id, uint32_t slot) {
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

/* A free write buffer, waiting for one when every buffer is handed over
 * (then a set is being written, or at least EMB_SHARD_WB_SET are queued:
 * one frees some). */
static sh_wbuf *wbuf_get(shstore *s) {
  if (!s->wfree) {
    double t0 = sr_now();
    s->ctr.wb_full_waits++;
    while (!s->wfree) shard__wait_some(s, 1);
    s->ctr.wb_wait_ns += (uint64_t)((sr_now() - t0) * 1e9);
  }
  sh_wbuf *b = s->wfree;
  s->wfree = b->next;
  b->n = 0;
  return b;
}

/* Write dirty slot i back: its row encoded into the current buffer and
 * entered in the pending index; the slot is clean after. */
void shard__writeback(shstore *s, uint32_t i) {
  if (!s->wcur) s->wcur = wbuf_get(s);
  sh_wbuf *b = s->wcur;
  sh_meta *m = slot_meta(s, i);
  uint32_t t = m->table, d = (uint32_t)db_of(s, (int)t, m->key);
  unsigned char *p = b->rec + b->n * s->rec_bytes;
  memcpy(p, &m->key, 8);
  memcpy(p + 8, &t, 4);
  memcpy(p + 12, &d, 4);
  float row[2 * EMB_MAX_DIM + 1];
  slot_get(s, i, t, row, 1);
  kv_row_encode_w(s->dim[t], s->slen[t], sh_wprec(s, t), row, p + SH_REC_HEAD);
  uint32_t tag = key_tag(t, m->key);
  size_t h = pidx_probe(s, tag, t, m->key);
  s->pidx[h].slot1 = (uint32_t)(b->idx * s->rows_per_buf + b->n) + 1;
  s->pidx[h].tag = tag;
  b->n++;
  m->flags &= (uint16_t)~F_DIRTY;
  s->ctr.writebacks++;
  if (b->n == s->rows_per_buf) wbuf_submit(s);
}

/* ---- made at create, stopped and freed at destroy ---- */

/* The write buffers, the pending index, the job table and the store
 * threads (n of them; 0: the caller does all the work). */
int shard__pool_create(shstore *s, int n, size_t wb_bytes) {
  s->rec_bytes = (SH_REC_HEAD + KV_ROW_HEADER + 4 * (size_t)s->stride + 7) & ~(size_t)7;
  s->rows_per_buf = wb_bytes / EMB_SHARD_WB_BUFFERS / s->rec_bytes;
  if (!s->rows_per_buf) s->rows_per_buf = 1;
  size_t pcap = 64;
  while (pcap < 2 * EMB_SHARD_WB_BUFFERS * s->rows_per_buf) pcap <<= 1;
  s->pmask = pcap - 1;
  s->pidx = calloc(pcap, sizeof *s->pidx);
  s->wbufs = calloc(EMB_SHARD_WB_BUFFERS, sizeof *s->wbufs);
  s->open = calloc((size_t)s->n_db * (size_t)s->n_tables + 1, sizeof *s->open);
  s->open_list = malloc(((size_t)s->n_db * (size_t)s->n_tables + 1) * sizeof *s->open_list);
  s->crd = kv_reader_create();
  s->word = malloc(EMB_SHARD_WB_BUFFERS * s->rows_per_buf * sizeof *s->word);
  s->ing = kv_ingest_create();
  /* the buffers' records in one block, on huge pages where it is large
   * enough: records are read back at random (the pending index, a set's
   * sorted order) */
  const size_t per_buf = s->rows_per_buf * s->rec_bytes;
  s->wrec = malloc(EMB_SHARD_WB_BUFFERS * per_buf);
  if (!s->pidx || !s->wbufs || !s->open || !s->open_list || !s->crd || !s->word || !s->ing ||
      !s->wrec)
    return SR_ENOMEM;
  sr_advise_huge(s->wrec, EMB_SHARD_WB_BUFFERS * per_buf);
  for (int k = 0; k < EMB_SHARD_WB_BUFFERS; k++) {
    sh_wbuf *b = &s->wbufs[k];
    b->idx = (uint32_t)k;
    b->rec = s->wrec + (size_t)k * per_buf;
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
void shard__pool_stop(shstore *s) {
  if (!s->pool_ok) return;
  wbuf_submit(s);
  pthread_mutex_lock(&s->mu);
  s->wforce = 1;
  s->stop = 1;
  pthread_cond_broadcast(&s->cv_work);
  pthread_mutex_unlock(&s->mu);
  for (int k = 0; k < s->n_workers; k++) pthread_join(s->wk[k].th, NULL);
  s->n_workers = 0;
  /* no thread left: what is still queued (with none, all) is done here */
  while (s->rq || s->wq) {
    sh_job *j;
    sh_wbuf *b;
    work_pick(s, 1, &j, &b);
    work_run(s, s->crd, j, b);
    work_done(s, j, b);
  }
}

void shard__pool_free(shstore *s) {
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
  free(s->wrec);
  free(s->word);
  kv_ingest_destroy(s->ing);
  free(s->wbufs);
  for (int k = 0; k < s->cap_pf; k++) free(s->pf[k].slot);
  free(s->pf);
  free(s->pidx);
  free(s->open);
  free(s->open_list);
  kv_reader_destroy(s->crd);
}
