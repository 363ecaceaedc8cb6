#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "common/sys.h"
#include "dense/pool.h"
#include "embedding/bag.h"
#include "train/trainer_bags.h"

/* One batch's ids deduplicated ahead of its step (trainer_ahead,
 * trainer_lookup_early): per table the unique ids and the inverse index, kept
 * until that step takes them (swapped with the step's own buffers, nothing
 * copied), so that no batch is deduplicated twice. */
enum { AH_FREE, AH_WAITING, AH_READY };
typedef struct ahead_set {
  int state;            /* AH_WAITING: registered, deduplicated at the next step */
  int hand;             /* its ids go to the store's look-ahead (trainer_ahead) */
  int64_t step;
  uint64_t first_index; /* the batch's, checked against the step's */
  int n;
  const ds_batch *b;    /* AH_WAITING: borrowed until deduplicated */
  size_t *cap, *counts; /* [T] */
  uint64_t **unique;    /* [T][cap] */
  uint32_t **inverse;   /* [T][cap] */
} ahead_set;

/* The look-ahead's state: the batches ahead of their step (trainer_ahead,
 * trainer_lookup_early), each deduplicated once, free sets kept for reuse;
 * and the early lookup (trainer_lookup_early, async mode): the next step's
 * rows, looked up while this step's are in use, swapped with the step's
 * rows when that step comes (buffers allocated by the first
 * trainer_lookup_early). */
typedef struct trainer_lookahead {
  ahead_set *sets;
  int n;
  size_t *early_rcap;        /* [T] */
  float **early_rows;        /* [T][early_rcap][dim] */
  emb_idset early_ids;       /* the early lookup's ids (borrowed by the store until waited) */
  int early_want;            /* registered: looked up during the next step, for early_want_step */
  int64_t early_want_step;
  int early_pending;         /* an early lookup is in flight, for early_step, set early_set */
  int64_t early_step;
  int early_set;
} trainer_lookahead;

struct trainer {
  const emb_plan *plan; /* borrowed */
  emb_store *store;     /* borrowed */
  const keep *keep;     /* borrowed; NULL: every id has a row (trainer_set_keep) */
  uint8_t *rowless;     /* [rl_cap] the last lookup's ids without a row, 1 each, tables in turn */
  size_t rl_cap;
  dense_model *model;   /* owned */
  dense_opt *opt;       /* owned */
  int T, dim, max_batch;
  emb_dedup **dedup;  /* [T] */
  size_t *cap;        /* [T] ids each table's unique and inverse hold */
  uint64_t **unique;  /* [T][cap] */
  uint32_t **inverse; /* [T][cap] */
  size_t *counts;     /* [T] unique ids this step */
  float **rows;       /* [T][rcap][dim] looked-up rows (an fp16 or bf16 table's as dim
                         16-bit values a row when rows16) */
  int rows16;         /* the store hands 16-bit tables' rows as they are, and
                         emb_bag_forward16 pools them */
  size_t *rcap;       /* [T] rows rows holds */
  float **grads;      /* [T][gcap][dim] summed row gradients */
  size_t *gcap;       /* [T] ids grads holds */
  /* The look-ahead: batches deduplicated ahead of their step, and async
   * mode's early lookup of the next step's rows. */
  trainer_lookahead la;
  float *emb;         /* [max_batch][T][dim] pooled */
  float *d_emb;       /* [max_batch][T][dim] */
  int emb_lent;       /* emb and d_emb are the dense model's own (a device's pinned buffers) */
  float *logits;      /* [max_batch] */
  dense_coll *coll;   /* borrowed; NULL: one rank */
  float *flat;        /* [params + 2] dense gradients, loss sum and failed ranks to all-reduce */
  int peer_failed;    /* the last step failed on another rank only (trainer_peer_failed) */
  trainer_times times;
  char err[512];
};

/* Room for need ids of table f in unique and inverse (one buffer set: the
 * step's or a batch's ahead). */
static int grow_ids(trainer *t, size_t *capv, uint64_t **unique, uint32_t **inverse, int f,
                    size_t need) {
  if (need <= capv[f]) return 0;
  size_t cap = capv[f] ? capv[f] : 64;
  while (cap < need) cap *= 2;
  uint64_t *u = realloc(unique[f], cap * sizeof *u);
  if (u) unique[f] = u;
  uint32_t *inv = realloc(inverse[f], cap * sizeof *inv);
  if (inv) inverse[f] = inv;
  if (!u || !inv) {
    sr_fmt(t->err, sizeof t->err, "trainer: out of memory for %zu ids of table %d", need, f);
    return SR_ENOMEM;
  }
  capv[f] = cap;
  return 0;
}

/* Room for need rows of table f in rows (looked-up rows or gradients). */
static int grow_rows(trainer *t, size_t *capv, float **rows, int f, size_t need) {
  if (need <= capv[f]) return 0;
  size_t cap = capv[f] ? capv[f] : 64;
  while (cap < need) cap *= 2;
  float *r = realloc(rows[f], cap * (size_t)t->dim * sizeof *r);
  if (!r) {
    sr_fmt(t->err, sizeof t->err, "trainer: out of memory for %zu rows of table %d", need, f);
    return SR_ENOMEM;
  }
  rows[f] = r;
  capv[f] = cap;
  return 0;
}

static int grow_table(trainer *t, int f, size_t need) {
  int rc = grow_ids(t, t->cap, t->unique, t->inverse, f, need);
  if (!rc) rc = grow_rows(t, t->rcap, t->rows, f, need);
  if (!rc) rc = grow_rows(t, t->gcap, t->grads, f, need);
  return rc;
}

trainer *trainer_create(const emb_plan *plan, emb_store *store, const dense_config *cfg,
                        const dense_opt_config *ocfg, uint64_t seed, char *err, size_t errlen) {
  if (!plan || !store || !cfg || !ocfg) {
    sr_fmt(err, errlen, "trainer: missing plan, store or configuration");
    return NULL;
  }
  if (cfg->n_sparse != plan->n_tables) {
    sr_fmt(err, errlen, "trainer: the model has %d sparse features but the plan %d tables",
           cfg->n_sparse, plan->n_tables);
    return NULL;
  }
  for (int f = 0; f < plan->n_tables; f++)
    if (plan->tables[f].dim != cfg->emb_dim) {
      sr_fmt(err, errlen, "trainer: table %s has dim %d, the model expects %d",
             plan->tables[f].name, plan->tables[f].dim, cfg->emb_dim);
      return NULL;
    }
  trainer *t = calloc(1, sizeof *t);
  if (!t) {
    sr_fmt(err, errlen, "trainer: out of memory");
    return NULL;
  }
  t->plan = plan;
  t->store = store;
  t->T = plan->n_tables;
  for (int f = 0; f < t->T; f++)
    if (plan->tables[f].precision != EMB_PREC_FP32) t->rows16 = emb_store_has_rows16(store);
  t->dim = cfg->emb_dim;
  t->max_batch = cfg->max_batch;
  t->model = dense_model_create(cfg, seed, err, errlen);
  if (!t->model) goto fail;
  size_t np = 0;
  dense_model_params(t->model, &np);
  t->opt = dense_opt_create(ocfg, np, err, errlen);
  if (!t->opt) goto fail;
  int T = t->T;
  t->dedup = calloc((size_t)T, sizeof *t->dedup);
  t->cap = calloc((size_t)T, sizeof *t->cap);
  t->unique = calloc((size_t)T, sizeof *t->unique);
  t->inverse = calloc((size_t)T, sizeof *t->inverse);
  t->counts = calloc((size_t)T, sizeof *t->counts);
  t->rows = calloc((size_t)T, sizeof *t->rows);
  t->rcap = calloc((size_t)T, sizeof *t->rcap);
  t->grads = calloc((size_t)T, sizeof *t->grads);
  t->gcap = calloc((size_t)T, sizeof *t->gcap);
  size_t per = (size_t)t->max_batch * (size_t)T * (size_t)t->dim;
  t->emb_lent = dense_model_batch_buffers(t->model, &t->emb, &t->d_emb) == 0;
  if (!t->emb_lent) {
    t->emb = malloc(per * sizeof *t->emb);
    t->d_emb = malloc(per * sizeof *t->d_emb);
  }
  t->logits = malloc((size_t)t->max_batch * sizeof *t->logits);
  if (!t->dedup || !t->cap || !t->unique || !t->inverse || !t->counts || !t->rows || !t->rcap ||
      !t->grads || !t->gcap || !t->emb || !t->d_emb || !t->logits) {
    sr_fmt(err, errlen, "trainer: out of memory");
    goto fail;
  }
  for (int f = 0; f < T; f++) {
    t->dedup[f] = emb_dedup_create((size_t)t->max_batch);
    if (!t->dedup[f] || grow_table(t, f, (size_t)t->max_batch)) {
      sr_fmt(err, errlen, "trainer: out of memory");
      goto fail;
    }
  }
  return t;
fail:
  trainer_destroy(t);
  return NULL;
}

/* The buffers of one set ahead (NULL-safe members). */
static void ahead_set_free(ahead_set *a, int T) {
  for (int f = 0; f < T; f++) {
    if (a->unique) free(a->unique[f]);
    if (a->inverse) free(a->inverse[f]);
  }
  free(a->cap);
  free(a->counts);
  free(a->unique);
  free(a->inverse);
}

void trainer_destroy(trainer *t) {
  if (!t) return;
  if (t->la.early_pending) emb_store_lookup_wait(t->store); /* its buffers are freed below */
  for (int i = 0; i < t->la.n; i++) ahead_set_free(&t->la.sets[i], t->T);
  free(t->la.sets);
  for (int f = 0; f < t->T; f++) {
    if (t->la.early_rows) free(t->la.early_rows[f]);
    if (t->dedup) emb_dedup_destroy(t->dedup[f]);
    if (t->unique) free(t->unique[f]);
    if (t->inverse) free(t->inverse[f]);
    if (t->rows) free(t->rows[f]);
    if (t->grads) free(t->grads[f]);
  }
  free(t->dedup);
  free(t->cap);
  free(t->unique);
  free(t->inverse);
  free(t->counts);
  free(t->rows);
  free(t->rcap);
  free(t->grads);
  free(t->gcap);
  free(t->la.early_rcap);
  free(t->la.early_rows);
  if (!t->emb_lent) {
    free(t->emb);
    free(t->d_emb);
  }
  free(t->logits);
  free(t->flat);
  free(t->rowless);
  dense_opt_destroy(t->opt);
  dense_model_destroy(t->model);
  free(t);
}

/* Dedup b's ids of every table into one buffer set (the step's, or a set
 * ahead), growing it first. */
static int dedup_set(trainer *t, const ds_batch *b, size_t *capv, uint64_t **unique,
                     uint32_t **inverse, size_t *counts) {
  int n = b->n, rc, f;
  for (f = 0; f < t->T; f++) {
    const uint32_t *off = ds_batch_offsets(b, f);
    size_t nids = n > 0 ? (size_t)(off[n] - off[0]) : 0;
    if ((rc = grow_ids(t, capv, unique, inverse, f, nids))) return rc;
  }
  if ((rc = trainer_bags_dedup(t->dedup, t->T, b, unique, inverse, counts, &f)))
    sr_fmt(t->err, sizeof t->err, "trainer: dedup of table %d: %s", f, sr_strerror(rc));
  return rc;
}

/* ---- batches ahead of their step ---- */

/* A free set ahead (made when none is free), or -1 with SR_ENOMEM's message.
 * A failure leaves the sets as they were. */
static int ahead_slot(trainer *t) {
  for (int i = 0; i < t->la.n; i++)
    if (t->la.sets[i].state == AH_FREE) return i;
  ahead_set *v = realloc(t->la.sets, (size_t)(t->la.n + 1) * sizeof *v);
  if (v) t->la.sets = v;
  size_t T = (size_t)t->T;
  ahead_set a = {.state = AH_FREE};
  if (v) {
    a.cap = calloc(T, sizeof *a.cap);
    a.counts = calloc(T, sizeof *a.counts);
    a.unique = calloc(T, sizeof *a.unique);
    a.inverse = calloc(T, sizeof *a.inverse);
  }
  if (!v || !a.cap || !a.counts || !a.unique || !a.inverse) {
    ahead_set_free(&a, 0);
    sr_fmt(t->err, sizeof t->err, "trainer: out of memory for the batches ahead");
    return -1;
  }
  t->la.sets[t->la.n] = a;
  return t->la.n++;
}

/* The set ahead of step, or -1. */
static int ahead_find(const trainer *t, int64_t step) {
  for (int i = 0; i < t->la.n; i++)
    if (t->la.sets[i].state != AH_FREE && t->la.sets[i].step == step) return i;
  return -1;
}

/* Free every set ahead of a step below step (none in flight: the caller
 * waited for the early lookup). */
static void ahead_retire(trainer *t, int64_t step) {
  for (int i = 0; i < t->la.n; i++)
    if (t->la.sets[i].state != AH_FREE && t->la.sets[i].step < step) {
      t->la.sets[i].state = AH_FREE;
      t->la.sets[i].b = NULL;
    }
}

/* Register part as step's batch in a set ahead (AH_WAITING). 0 or SR_ENOMEM. */
static int ahead_register(trainer *t, const ds_batch *part, int64_t step, int hand) {
  int i = ahead_find(t, step);
  if (i >= 0 && t->la.early_pending && t->la.early_set == i) {
    sr_fmt(t->err, sizeof t->err, "trainer: step %lld's lookup is already in flight",
           (long long)step);
    return SR_EINVAL;
  }
  if (i < 0 && (i = ahead_slot(t)) < 0) return SR_ENOMEM;
  ahead_set *a = &t->la.sets[i];
  a->state = AH_WAITING;
  a->hand = hand;
  a->step = step;
  a->b = part;
  a->n = part->n;
  a->first_index = part->first_index;
  return 0;
}

/* Dedup set i's batch (AH_WAITING -> AH_READY). */
static int ahead_dedup(trainer *t, int i) {
  ahead_set *a = &t->la.sets[i];
  if (a->state != AH_WAITING) return 0;
  int rc = dedup_set(t, a->b, a->cap, a->unique, a->inverse, a->counts);
  if (rc) return rc;
  a->b = NULL;
  a->state = AH_READY;
  return 0;
}

static emb_idset ahead_ids(const trainer *t, const ahead_set *a) {
  return (emb_idset){.n_tables = t->T, .ids = (const uint64_t *const *)a->unique,
                     .counts = a->counts};
}

/* During step: every batch registered since the step before, in step
 * order, deduplicated, and those of trainer_ahead handed to the store's
 * look-ahead (timed as prefetch). 0 or SR_E* (trainer_errmsg). */
static int ahead_run(trainer *t, int64_t step) {
  for (;;) {
    int i = -1;
    for (int k = 0; k < t->la.n; k++)
      if (t->la.sets[k].state == AH_WAITING && t->la.sets[k].step > step &&
          (i < 0 || t->la.sets[k].step < t->la.sets[i].step))
        i = k;
    if (i < 0) return 0;
    double t0 = sr_now();
    int rc = ahead_dedup(t, i);
    t->times.dedup += sr_now() - t0;
    if (rc) return rc;
    ahead_set *a = &t->la.sets[i];
    if (!a->hand || a->n <= 0) continue;
    emb_idset ids = ahead_ids(t, a);
    t0 = sr_now();
    rc = emb_store_prefetch(t->store, a->step, &ids);
    t->times.prefetch += sr_now() - t0;
    if (rc) {
      sr_fmt(t->err, sizeof t->err, "look-ahead of step %lld: %s", (long long)a->step,
             emb_store_errmsg(t->store));
      return rc;
    }
  }
}

int trainer_ahead(trainer *t, const ds_batch *part, int64_t step) {
  return ahead_register(t, part, step, 1);
}

void trainer_ahead_drop(trainer *t) {
  if (t->la.early_pending) emb_store_lookup_wait(t->store); /* its rows are not wanted */
  t->la.early_pending = 0;
  t->la.early_want = 0;
  for (int i = 0; i < t->la.n; i++) {
    t->la.sets[i].state = AH_FREE;
    t->la.sets[i].b = NULL;
  }
}

/* Wait for the early lookup and forget its rows (the step looks up
 * again). */
static int early_drop(trainer *t) {
  t->la.early_pending = 0;
  int rc = emb_store_lookup_wait(t->store);
  if (rc)
    sr_fmt(t->err, sizeof t->err, "early lookup of step %lld: %s", (long long)t->la.early_step,
           emb_store_errmsg(t->store));
  return rc;
}

/* Swap two pointers of one type (each read and written as its own type). */
#define SWAP_PTR(a, b)      \
  do {                      \
    void *x_ = (void *)(a); \
    (a) = (void *)(b);      \
    (b) = x_;               \
  } while (0)

/* Step 1: this step's ids into the step's buffers: its set ahead when
 * there is one for b (swapped in, nothing deduplicated again), else
 * deduplicated now. *early: its rows are in flight (the early lookup's). */
static int take_ids(trainer *t, const ds_batch *b, int64_t step, int train, int *early) {
  int rc, i = train ? ahead_find(t, step) : -1;
  if (i >= 0 && (t->la.sets[i].n != b->n || t->la.sets[i].first_index != b->first_index)) {
    if (t->la.early_pending && t->la.early_set == i && (rc = early_drop(t))) return rc;
    t->la.sets[i].state = AH_FREE; /* not this batch: forget it */
    i = -1;
  }
  if (i >= 0 && (rc = ahead_dedup(t, i))) return rc;
  *early = i >= 0 && t->la.early_pending && t->la.early_set == i;
  if (i >= 0) {
    ahead_set *a = &t->la.sets[i];
    SWAP_PTR(t->cap, a->cap);
    SWAP_PTR(t->counts, a->counts);
    SWAP_PTR(t->unique, a->unique);
    SWAP_PTR(t->inverse, a->inverse);
    a->state = AH_FREE;
  } else if ((rc = dedup_set(t, b, t->cap, t->unique, t->inverse, t->counts))) {
    return rc;
  }
  if (*early) {
    /* This step's rows were asked for during the last step: take them. */
    t->la.early_pending = 0;
    SWAP_PTR(t->rows, t->la.early_rows);
    SWAP_PTR(t->rcap, t->la.early_rcap);
  }
  if (train) ahead_retire(t, step);
  return 0;
}

/* Ids of bounded tables without a row (keep_has_row) read zeros; each is
 * noted in t->rowless for drop_rowless. 0 or SR_ENOMEM. */
/* Bytes of a looked-up row of table f in t->rows. */
static size_t row_bytes(const trainer *t, int f) {
  const int w = t->rows16 ? emb_precision_bytes(t->plan->tables[f].precision) : 4;
  return (size_t)t->dim * (size_t)w;
}

/* The store's lookup of ids into rows (16-bit rows as they are when rows16). */
static int rows_lookup(trainer *t, int64_t step, const emb_idset *ids, float *const *rows) {
  if (t->rows16) return emb_store_lookup_begin_rows16(t->store, step, ids, (void *const *)rows);
  return emb_store_lookup_begin(t->store, step, ids, rows);
}

static int zero_rowless(trainer *t) {
  if (!t->keep) return 0;
  size_t total = 0, at = 0;
  for (int f = 0; f < t->T; f++) total += t->counts[f];
  if (total > t->rl_cap) {
    uint8_t *m = realloc(t->rowless, total);
    if (!m) {
      sr_fmt(t->err, sizeof t->err, "trainer: out of memory");
      return SR_ENOMEM;
    }
    t->rowless = m;
    t->rl_cap = total;
  }
  for (int f = 0; f < t->T; f++) {
    int on = emb_keep_on(&t->plan->tables[f]);
    for (size_t r = 0; r < t->counts[f]; r++, at++) {
      t->rowless[at] = on && !keep_has_row(t->keep, f, t->unique[f][r]);
      if (t->rowless[at]) memset((char *)t->rows[f] + r * row_bytes(t, f), 0, row_bytes(t, f));
    }
  }
  return 0;
}

/* Before the push: the ids without a row (zero_rowless's) and their
 * gradients leave the step's set (compacted in place; the step needs
 * neither again). */
static void drop_rowless(trainer *t) {
  size_t at = 0;
  for (int f = 0; t->keep && f < t->T; f++) {
    size_t w = 0, dim = (size_t)t->dim, n = t->counts[f];
    for (size_t r = 0; r < n; r++, at++) {
      if (t->rowless[at]) continue;
      if (w != r) {
        t->unique[f][w] = t->unique[f][r];
        memcpy(t->grads[f] + w * dim, t->grads[f] + r * dim, dim * sizeof(float));
      }
      w++;
    }
    t->counts[f] = w;
  }
}

/* Steps 1-3: dedup, lookup, pool into t->emb. */
static int gather(trainer *t, const ds_batch *b, int64_t step, emb_idset *ids, int train) {
  int n = b->n;
  if (n <= 0 || n > t->max_batch) {
    sr_fmt(t->err, sizeof t->err, "trainer: batch of %d samples (max %d)", n, t->max_batch);
    return SR_EINVAL;
  }
  double t0 = sr_now(), t1;
  int rc, early = 0;
  /* An early lookup for another step, or a test pass (its batch is not
   * the one looked up early): drop it; the training step looks up again. */
  if (t->la.early_pending && (t->la.early_step != step || !train) && (rc = early_drop(t))) return rc;
  if ((rc = take_ids(t, b, step, train, &early))) return rc;
  t1 = sr_now();
  ids->n_tables = t->T;
  ids->ids = (const uint64_t *const *)t->unique;
  ids->counts = t->counts;
  for (int f = 0; !early && f < t->T; f++)
    if ((rc = grow_rows(t, t->rcap, t->rows, f, t->counts[f]))) return rc;
  /* A set looked up early is already in flight: wait for it. */
  rc = early ? 0 : rows_lookup(t, step, ids, t->rows);
  if (!rc) rc = emb_store_lookup_wait(t->store);
  if (rc) {
    sr_fmt(t->err, sizeof t->err, "lookup at step %lld: %s", (long long)step,
           emb_store_errmsg(t->store));
    return rc;
  }
  t->times.lookup_flight += emb_store_lookup_flight(t->store);
  if ((rc = zero_rowless(t))) return rc;
  /* Room for the row gradients (after the wait: no lookup is left in flight
   * if this fails). */
  for (int f = 0; f < t->T; f++)
    if ((rc = grow_rows(t, t->gcap, t->grads, f, t->counts[f]))) return rc;
  double t2 = sr_now();
  trainer_bags_forward(t->plan, t->T, t->dim, b, n, t->inverse, t->rows, t->rows16, t->emb);
  double t3 = sr_now();
  t->times.dedup += t1 - t0;
  t->times.lookup += t2 - t1;
  t->times.pool += t3 - t2;
  for (int f = 0; f < t->T; f++) t->times.rows += t->counts[f];
  return 0;
}

/* The registered early lookup (trainer_lookup_early): the next part's set ahead
 * (deduplicated now if it is not yet) and its lookup begun, which stays in
 * flight while this step computes and pushes. */
static int early_begin(trainer *t) {
  int64_t step = t->la.early_want_step;
  t->la.early_want = 0;
  int i = ahead_find(t, step), rc;
  if (i < 0) return 0;
  double t0 = sr_now();
  rc = ahead_dedup(t, i);
  t->times.dedup += sr_now() - t0;
  if (rc) return rc;
  ahead_set *a = &t->la.sets[i];
  if (a->n <= 0) return 0; /* nothing to look up: the step will do without */
  for (int f = 0; f < t->T; f++)
    if ((rc = grow_rows(t, t->la.early_rcap, t->la.early_rows, f, a->counts[f]))) return rc;
  t->la.early_ids = ahead_ids(t, a);
  double t1 = sr_now();
  rc = rows_lookup(t, step, &t->la.early_ids, t->la.early_rows);
  t->times.lookup += sr_now() - t1;
  if (rc) {
    sr_fmt(t->err, sizeof t->err, "early lookup of step %lld: %s", (long long)step,
           emb_store_errmsg(t->store));
    return rc;
  }
  t->la.early_pending = 1;
  t->la.early_step = step;
  t->la.early_set = i;
  return 0;
}

int trainer_lookup_early(trainer *t, const ds_batch *next, int64_t next_step) {
  if (!t->la.early_rows) {
    /* Both or none: a failure leaves the trainer as it was, so a retry
     * allocates again. */
    size_t T = (size_t)t->T;
    size_t *cap = calloc(T, sizeof *cap);
    float **rows = calloc(T, sizeof *rows);
    if (!cap || !rows) {
      free(cap);
      free(rows);
      sr_fmt(t->err, sizeof t->err, "trainer: out of memory for the early lookup's buffers");
      return SR_ENOMEM;
    }
    t->la.early_rcap = cap;
    t->la.early_rows = rows;
  }
  /* A batch already ahead (trainer_ahead) keeps its set: deduplicated once. */
  int i = ahead_find(t, next_step), rc;
  if ((i < 0 || t->la.sets[i].n != next->n || t->la.sets[i].first_index != next->first_index) &&
      (rc = ahead_register(t, next, next_step, 0)))
    return rc;
  t->la.early_want = 1;
  t->la.early_want_step = next_step;
  return 0;
}

void trainer_set_coll(trainer *t, dense_coll *c) { t->coll = c; }
void trainer_set_keep(trainer *t, const keep *k) { t->keep = k; }

int trainer_slice_count(int n, int rank, int size) {
  return n / size + (rank < n % size);
}

int trainer_batch_slice(const ds_batch *b, int rank, int size, ds_batch *out) {
  if (size < 1 || rank < 0 || rank >= size || b->n < 0) return SR_EINVAL;
  int q = b->n / size, e = b->n % size;
  int lo = rank * q + (rank < e ? rank : e), n = trainer_slice_count(b->n, rank, size);
  if (n > out->cap) return SR_EINVAL;
  size_t total = 0;
  for (int f = 0; f < DS_NUM_SPARSE; f++) {
    const uint32_t *off = ds_batch_offsets(b, f);
    total += (size_t)(off[lo + n] - off[lo]);
  }
  int rc = ds_batch_reserve_ids(out, total);
  if (rc) return rc;
  out->n = n;
  out->first_index = b->first_index + (uint64_t)lo;
  memcpy(out->labels, b->labels + lo, (size_t)n * sizeof *out->labels);
  memcpy(out->dense, b->dense + (size_t)lo * DS_NUM_DENSE,
         (size_t)n * DS_NUM_DENSE * sizeof *out->dense);
  /* Feature f's ids of the slice, moved to start right after feature f-1's. */
  uint32_t at = 0;
  for (int f = 0; f < DS_NUM_SPARSE; f++) {
    const uint32_t *off = ds_batch_offsets(b, f);
    uint32_t *o = ds_batch_offsets(out, f);
    uint32_t first = off[lo];
    for (int i = 0; i <= n; i++) o[i] = at + (off[lo + i] - first);
    memcpy(out->ids + at, b->ids + first, (size_t)(off[lo + n] - first) * sizeof *out->ids);
    at += off[lo + n] - first;
  }
  return 0;
}

int trainer_step(trainer *t, const ds_batch *b, int64_t step, float lr, float sparse_lr,
                 float *loss) {
  return trainer_step_part(t, b, b->n, step, lr, sparse_lr, loss);
}

/* The step's push: begun from the backward as soon as the row gradients
 * are whole (push_ready), so that the servers apply the rows while the
 * bottom MLP's backward runs, and awaited after it. */
typedef struct {
  trainer *t;
  const ds_batch *b;
  const emb_idset *ids;
  int64_t step;
  float scale, sparse_lr;
  int ranks;
  int own;              /* this rank's lookup or push failed (several ranks) */
  int begun;            /* a push is in flight: emb_store_push_wait follows */
  int stopped;          /* push_ready stopped the backward (t->err says why) */
  double scatter, push; /* seconds in the rows' gradients and in push_begin */
} step_push;

/* The push of step failed with rc (its half begin or wait): the step's
 * failure with one rank (rc), this rank's with several (*own; 0). */
static int push_failed(trainer *t, int64_t step, int rc, int ranks, int *own) {
  sr_fmt(t->err, sizeof t->err, "push at step %lld: %s", (long long)step,
         emb_store_errmsg(t->store));
  if (ranks == 1) return rc;
  *own = rc;
  return 0;
}

/* The ids without a row leave the step's set, and the push begins. */
static int push_begin(step_push *sp) {
  trainer *t = sp->t;
  double t0 = sr_now();
  drop_rowless(t);
  int rc = emb_store_push_begin(t->store, sp->step, sp->sparse_lr, sp->ids,
                                (const float *const *)t->grads);
  sp->push += sr_now() - t0;
  sp->begun = !rc;
  return rc ? push_failed(t, sp->step, rc, sp->ranks, &sp->own) : 0;
}

/* The backward's hook (dense_model_backward_ready): the loss checked
 * before any row or parameter changes, the row gradients (scaled to the
 * global batch's mean) scattered onto the unique rows, and their push
 * begun. */
static int push_ready(void *ctx, float loss) {
  step_push *sp = ctx;
  trainer *t = sp->t;
  int rc = SR_ERANGE;
  if (!isfinite(loss)) {
    sr_fmt(t->err, sizeof t->err, "the loss is %g (not finite): nothing of this step was applied",
           (double)loss);
  } else {
    double t0 = sr_now();
    const int n = sp->b->n;
    size_t stride = (size_t)t->T * (size_t)t->dim;
    if (sp->scale != 1.0f)
      for (size_t i = 0, m = (size_t)n * stride; i < m; i++) t->d_emb[i] *= sp->scale;
    trainer_bags_backward(t->plan, t->T, t->dim, sp->b, n, t->inverse, t->d_emb, t->counts,
                          t->grads);
    sp->scatter += sr_now() - t0;
    rc = push_begin(sp);
  }
  sp->stopped = rc != 0;
  return rc;
}

/* Steps 4-5 of this part (n > 0 samples): forward, and backward with the
 * push begun inside it (push_ready). *part_loss gets the part's mean BCE;
 * *tb the backward's seconds but push_ready's. 0, push_ready's code or the
 * dense model's. */
static int step_compute(trainer *t, step_push *sp, float *part_loss, double *tf, double *tb) {
  const ds_batch *b = sp->b;
  double t0 = sr_now();
  int rc = dense_model_forward(t->model, b->n, b->dense, t->emb, t->logits);
  *tf = sr_now() - t0;
  if (!rc)
    rc = dense_model_backward_ready(t->model, b->n, b->labels, part_loss, t->d_emb, push_ready, sp);
  if (rc) {
    if (!sp->stopped) sr_fmt(t->err, sizeof t->err, "dense step: %s", dense_model_errmsg(t->model));
    return rc;
  }
  *tb = sr_now() - t0 - *tf - sp->scatter - sp->push;
  return 0;
}

/* Several ranks: the dense gradients of this part (g[np], scaled; zeros
 * when own failed or the part is empty), its loss sum and whether its
 * lookup or push failed (own), all-reduced in one call into t->flat. The
 * failure count rides in the step's one all-reduce, after every rank's
 * push: no rank counts a step another rank did not finish. 0; SR_ESTATE
 * (t->peer_failed) when another rank's step failed and this one's did
 * not; own when it did; the collective's code. */
static int step_all_reduce(trainer *t, const float *g, size_t np, float scale, int n,
                           float part_loss, int own, int64_t step) {
  if (!t->flat) {
    t->flat = malloc((np + 2) * sizeof *t->flat);
    if (!t->flat) {
      sr_fmt(t->err, sizeof t->err, "trainer: out of memory for %zu gradients", np + 2);
      return SR_ENOMEM;
    }
  }
  if (n > 0 && !own)
    for (size_t i = 0; i < np; i++) t->flat[i] = g[i] * scale;
  else
    memset(t->flat, 0, np * sizeof *t->flat);
  t->flat[np] = own ? 0.0f : part_loss * (float)n; /* this rank's loss sum */
  t->flat[np + 1] = own ? 1.0f : 0.0f;              /* ranks whose step failed */
  int rc = dense_coll_all_reduce_sum(t->coll, t->flat, np + 2);
  if (rc) {
    sr_fmt(t->err, sizeof t->err, "all-reduce of the dense gradients at step %lld: %s",
           (long long)step, dense_coll_errmsg(t->coll));
    return rc;
  }
  if (own) return own; /* t->err says why */
  if (t->flat[np + 1] > 0) {
    t->peer_failed = 1;
    sr_fmt(t->err, sizeof t->err, "step %lld: the lookup or push of %.0f other rank(s) of %d "
           "failed; nothing of the step counts", (long long)step, (double)t->flat[np + 1],
           t->coll->size);
    return SR_ESTATE;
  }
  return 0;
}

int trainer_step_part(trainer *t, const ds_batch *b, int n_global, int64_t step, float lr,
                      float sparse_lr, float *loss) {
  int n = b->n;
  int ranks = t->coll ? t->coll->size : 1;
  if (n < 0 || n_global < n || n_global < 1 || (ranks == 1 && n != n_global)) {
    sr_fmt(t->err, sizeof t->err, "trainer: a part of %d samples of a global batch of %d (%d rank(s))",
           n, n_global, ranks);
    return SR_EINVAL;
  }
  t->peer_failed = 0;
  emb_idset ids;
  int rc, own = 0; /* this rank's lookup or push failed (several ranks: told in the all-reduce) */
  if (n > 0) {
    rc = gather(t, b, step, &ids, 1);
    if (rc && ranks == 1) return rc;
    own = rc;
  } else {
    /* Nothing to look up; the rank still pushes (empty) and all-reduces. */
    if (t->la.early_pending && (rc = early_drop(t))) return rc;
    ahead_retire(t, step + 1);
    for (int f = 0; f < t->T; f++) t->counts[f] = 0;
    ids.n_tables = t->T;
    ids.ids = (const uint64_t *const *)t->unique;
    ids.counts = t->counts;
  }
  /* This step's rows are in: the batches that entered the look-ahead go to
   * the store now (their reads overlap this step's compute and push), then
   * the next step's lookup (async mode), in that order of steps. */
  if (!own && (rc = ahead_run(t, step))) return rc;
  if (!own && t->la.early_want && (rc = early_begin(t))) return rc;
  size_t np = 0;
  float *p = dense_model_params(t->model, &np);
  float *g = dense_model_grads(t->model, &np);
  /* The model's gradients are of this part's mean loss (1/n); the global
   * mean's are scale times those. 1 with one rank: the bits stay as they were. */
  float scale = n == n_global ? 1.0f : (float)n / (float)n_global, part_loss = 0;
  step_push sp = {.t = t, .b = b, .ids = &ids, .step = step, .scale = scale,
                  .sparse_lr = sparse_lr, .ranks = ranks, .own = own};
  double tf = 0, tb = 0;
  if (n > 0 && !own) {
    if ((rc = step_compute(t, &sp, &part_loss, &tf, &tb))) return rc;
  } else if (!own && (rc = push_begin(&sp))) {
    return rc;
  }
  own = sp.own;
  double t3 = sr_now();
  if (sp.begun) {
    /* A push to shard servers waits for them: on shared cores they need the
     * ones the dense workers would spin on. */
    if (emb_store_kind_of(t->store) == EMB_STORE_REMOTE) dense_pool_rest(dense_pool_default());
    if ((rc = emb_store_push_wait(t->store)) && (rc = push_failed(t, step, rc, ranks, &own)))
      return rc;
  }
  double t4 = sr_now(), t4b = t4;
  const float *gsum = g;
  float mean = part_loss;
  if (ranks > 1) {
    if ((rc = step_all_reduce(t, g, np, scale, n, part_loss, own, step))) return rc;
    gsum = t->flat;
    mean = t->flat[np] / (float)n_global;
    t4b = sr_now();
  }
  if (loss) *loss = mean;
  rc = dense_opt_step(t->opt, p, gsum, lr);
  if (rc == SR_ERANGE) {
    size_t bad = dense_opt_nonfinite_at(t->opt);
    sr_fmt(t->err, sizeof t->err,
           "the dense update left parameter %zu of %zu at %g (not finite; learning rate %g): "
           "stopping",
           bad, np, (double)p[bad], (double)lr);
  }
  double t5 = sr_now();
  t->times.forward += tf;
  t->times.backward += tb;
  t->times.scatter += sp.scatter;
  t->times.push += sp.push + t4 - t3;
  t->times.allreduce += t4b - t4;
  t->times.dense_opt += t5 - t4b;
  t->times.steps++;
  return rc;
}

int trainer_peer_failed(const trainer *t) { return t->peer_failed; }

int trainer_predict(trainer *t, const ds_batch *b, int64_t step, float *prob) {
  if (b->n == 0) return 0;
  emb_idset ids;
  int rc = gather(t, b, step, &ids, 0);
  if (rc) return rc;
  rc = dense_model_forward(t->model, b->n, b->dense, t->emb, t->logits);
  if (rc) {
    sr_fmt(t->err, sizeof t->err, "dense forward: %s", dense_model_errmsg(t->model));
    return rc;
  }
  for (int i = 0; i < b->n; i++) {
    float z = t->logits[i];
    /* Stable sigmoid. */
    prob[i] = z >= 0 ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
  }
  return 0;
}

dense_model *trainer_model(trainer *t) { return t->model; }
dense_opt *trainer_dense_opt(trainer *t) { return t->opt; }
const trainer_times *trainer_times_get(const trainer *t) { return &t->times; }
void trainer_times_reset(trainer *t) { memset(&t->times, 0, sizeof t->times); }
const char *trainer_errmsg(const trainer *t) { return t->err; }
