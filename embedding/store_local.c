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
 * in insertion order; a removed row's slot takes the last slot's row, so
 * the held rows stay the slab's first slots. A row that was never pushed is not
 * stored: lookups compute its init value. Both the map and the slab grow by
 * doubling, for the rows a push adds only (a push of held rows grows
 * neither, however full), the room made once the push's updates are
 * computed and before any new row is stored; a push that fails, there or
 * before, has its updates undone and leaves every row as it was. Lookups and pushes run
 * per table in passes of LT_PASS ids (hash them, probe, then copy or
 * update) with prefetches a few ids ahead, so the map and row cache misses
 * of a pass overlap instead of queueing one after another, and its rows
 * are still in cache when used.
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
#include <stdio.h>

#include "embedding/optim.h"
#include "embedding/store_local_impl.h"

/* ---- ops ---- */

static int check_ids(lstore *s, const emb_idset *ids, const char *what) {
  if (!ids || ids->n_tables != s->n || (s->n && (!ids->ids || !ids->counts))) {
    sr_fmt(s->err, sizeof s->err, "%s: id set has %d tables, the plan has %d", what,
           ids ? ids->n_tables : -1, s->n);
    return SR_EINVAL;
  }
  for (int t = 0; t < s->n; t++)
    if (emb_plan_check_range(s->base.plan, t, ids->ids[t], ids->counts[t], what, s->err,
                             sizeof s->err))
      return SR_ERANGE;
  return 0;
}

/* One pass of at most LT_PASS ids: their home positions, then each probed
 * (prefetching the map entries LT_PREFETCH ahead) into s->slot[r] = slot
 * + 1 or 0 when not stored, prefetching the row as soon as its slot is
 * known. The pass's rows are used right after, while still in cache:
 * pushes of 4096 dim-16 rows in passes of 256 took 0.90x and 0.92x the
 * time of the batch resolved whole before any row was used (two stores of
 * one process, timed round by round). */
static void resolve(lstore *s, const ltab *t, const uint64_t *id, size_t cnt) {
  size_t pos[LT_PASS];
  uint32_t *slot = s->slot;
  for (size_t r = 0; r < cnt; r++) pos[r] = lt_home(t, id[r]);
  for (size_t r = 0; r < cnt; r++) {
    if (r + LT_PREFETCH < cnt) {
      if (t->direct) __builtin_prefetch(&t->direct[pos[r + LT_PREFETCH]], 0, 1);
      else __builtin_prefetch(&t->map[pos[r + LT_PREFETCH]], 0, 1);
    }
    slot[r] = lt_slot_at(t, lt_probe(t, pos[r], id[r]));
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
  uint64_t hits = 0, total = 0;
  for (int ti = 0; ti < s->n; ti++) {
    const ltab *t = &s->t[ti];
    const size_t cnt = ids->counts[ti], dim = (size_t)t->dim;
    const int bits16 = rows16 && t->prec != EMB_PREC_FP32;
    for (size_t c0 = 0; c0 < cnt; c0 += LT_PASS) {
      const size_t m = cnt - c0 < LT_PASS ? cnt - c0 : LT_PASS;
      const uint64_t *id = ids->ids[ti] + c0;
      resolve(s, t, id, m);
      for (size_t r = 0; r < m; r++) {
        const uint32_t s1 = s->slot[r];
        hits += s1 != 0;
        if (bits16) {
          get_rows16(s, ti, t, s1, id[r], (uint16_t *)out[ti] + (c0 + r) * dim);
        } else {
          float *dst = (float *)out[ti] + (c0 + r) * dim;
          if (s1) lt_get(t, s1, dst, 0);
          else emb_store_absent_row(&s->base, ti, id[r], dst);
        }
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

/* push_apply's pass over rows id[m] of fp32 table ti (resolved in
 * s->slot), their gradients g, their outcomes' room v, their slots + 1 into
 * slots: each held row's old value saved in v (the undo), then every row
 * updated by one call of emb_optim_apply_rows (the optimizer chosen once,
 * no call per row), a held row in place, a new one in v from its init
 * value. The index of the first row whose outcome is not finite, or m. */
static size_t pass_fp32(lstore *s, int ti, float lr, const uint64_t *id, const emb_grad *g,
                        float *v, uint32_t *slots, size_t m) {
  const emb_plan *plan = s->base.plan;
  const ltab *t = &s->t[ti];
  const emb_optim_cfg *oc = &plan->tables[ti].optim;
  const size_t stride = (size_t)t->stride;
  for (size_t r = 0; r < m; r++) {
    const uint32_t s1 = slots[r] = s->slot[r];
    float *o = v + r * stride;
    if (s1) {
      s->w[r] = lt_row(t, s1);
      for (size_t j = 0; j < stride; j++) o[j] = s->w[r][j];
    } else {
      s->w[r] = o;
      emb_row_init(plan, ti, id[r], o);
      emb_optim_state_init(oc, t->dim, o + t->dim);
    }
  }
  return emb_optim_apply_rows(oc, t->dim, lr, g, s->w, m);
}

/* The same for a 16-bit table, row by row: a held row converted to floats
 * (its old value kept in v), updated and rounded (emb_optim_apply_at),
 * stored back; a new one computed in v. */
static size_t pass_16(lstore *s, int ti, int64_t step, float lr, const uint64_t *id,
                      const emb_grad *g, float *v, uint32_t *slots, size_t m) {
  const emb_plan *plan = s->base.plan;
  ltab *t = &s->t[ti];
  const emb_optim_cfg *oc = &plan->tables[ti].optim;
  const size_t stride = (size_t)t->stride, dim = (size_t)t->dim;
  for (size_t r = 0; r < m; r++) {
    const uint32_t s1 = slots[r] = s->slot[r];
    float *w = v + r * stride;
    if (s1) {
      lt_get(t, s1, w, 1);
      w = memcpy(s->row, w, stride * sizeof *w);
    } else {
      emb_row_init(plan, ti, id[r], w);
      emb_optim_state_init(oc, t->dim, w + t->dim);
    }
    const int ok =
        emb_optim_apply_at(plan, ti, id[r], step, lr, g + r * dim, w, t->slen ? w + dim : NULL);
    if (s1) lt_put(t, s1, w);
    if (!ok) return r;
  }
  return m;
}

/* A push's first half: every row's update, checked finite, a table's rows
 * in passes of LT_PASS (pass_fp32, pass_16). A stored row is updated in
 * place with its old value kept in s->vals; a row not stored yet is
 * computed into s->vals from its init value (the same optimizer update:
 * the same bits) and stored by push_commit. s->slots gets each row's slot
 * + 1 (0: new). 0, or SR_ERANGE naming the first row whose value or
 * optimizer state would not be finite, every row as it was. */
static int push_apply(lstore *s, int64_t step, float lr, const emb_idset *ids,
                      const emb_grad *const *grads) {
  const emb_plan *plan = s->base.plan;
  size_t at = 0, vat = 0; /* rows before this table's, and their floats in s->vals */
  for (int ti = 0; ti < s->n; ti++) {
    const ltab *t = &s->t[ti];
    const size_t stride = (size_t)t->stride, dim = (size_t)t->dim, cnt = ids->counts[ti];
    for (size_t c0 = 0; c0 < cnt; c0 += LT_PASS) {
      const size_t m = cnt - c0 < LT_PASS ? cnt - c0 : LT_PASS;
      const uint64_t *id = ids->ids[ti] + c0;
      const emb_grad *g = grads[ti] + c0 * dim;
      float *v = s->vals + vat + c0 * stride;
      resolve(s, t, id, m);
      const size_t ok = t->prec == EMB_PREC_FP32
                            ? pass_fp32(s, ti, lr, id, g, v, s->slots + at + c0, m)
                            : pass_16(s, ti, step, lr, id, g, v, s->slots + at + c0, m);
      if (ok < m) {
        push_undo(s, ids, at + c0 + ok + 1);
        sr_fmt(s->err, sizeof s->err,
               "push: table %u (%s) row %llu: the update (learning rate %g) would leave the row "
               "or its optimizer state non-finite; nothing applied",
               plan->tables[ti].table_id, plan->tables[ti].name, (unsigned long long)id[ok],
               (double)lr);
        return SR_ERANGE;
      }
    }
    at += cnt;
    vat += cnt * stride;
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
 * (push_apply, undone on a refusal), room made for the rows not held yet
 * (undone too when that fails), then those rows stored (push_commit). */
static int l_push(emb_store *b, int64_t step, float lr, const emb_idset *ids,
                  const emb_grad *const *grads) {
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
    if ((rc = lt_reserve_changes(&s->t[ti], ids->counts[ti]))) {
      sr_fmt(s->err, sizeof s->err, "push: table %d: %s", ti, sr_strerror(rc));
      return rc;
    }
  }
  if ((rc = push_scratch(s, n, f))) {
    sr_fmt(s->err, sizeof s->err, "push: out of memory for %zu rows", n);
    return rc;
  }
  if ((rc = push_apply(s, step, lr, ids, grads))) return rc;
  /* Index and slab room for the rows not held yet only: a push of held
   * rows grows neither, however full they are. */
  size_t at = 0;
  for (int ti = 0; ti < s->n; ti++) {
    size_t fresh = 0;
    for (size_t r = 0; r < ids->counts[ti]; r++) fresh += !s->slots[at++];
    if (fresh && (rc = lt_reserve(&s->t[ti], fresh))) {
      push_undo(s, ids, n);
      sr_fmt(s->err, sizeof s->err, "push: table %d: %zu new rows: %s; nothing applied", ti, fresh,
             sr_strerror(rc));
      return rc;
    }
  }
  push_commit(s, ids);
  s->st.pushes += n;
  return 0;
}

static int l_flush(emb_store *b) {
  (void)b;
  return 0;
}

/* Room for extra more ids in t's removed list. */
static int lt_reserve_removed(ltab *t, size_t extra) {
  return lt_ids_room(&t->rm_ids, &t->rm_cap, t->rm_n + extra);
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
    .checkpoint = local__checkpoint,
    .restore = local__restore,
    .checkpoint_delta = local__checkpoint_delta,
    .restore_delta = local__restore_delta,
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
