/* libFuzzer target: the plan parser (embedding/plan.c: emb_plan_parse), a
 * plan file's text as `--plan FILE` and a checkpoint's plan.json give it.
 *
 * Invariants: a refusal names the text ("plan.json: ...") and says why; a
 * plan it takes validates, and its canonical form (with placement) parses
 * to a plan of the same values in every field (a table's keep fields only
 * where it bounds its rows), the same canonical form and the same model
 * and plan fingerprints.
 * Seeds: tests/fuzz/seeds/fuzz_plan (plans `shardrec plan` wrote: bounded
 * and unbounded tables, sgd, adagrad and rowwise_adagrad, fp16 and bf16,
 * table-wise and row-wise, admission and expiry). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "embedding/plan.h"

/* Whether tables x and y bound their rows alike: both not at all (their
 * other keep fields then say nothing), or with the same fields. */
static int same_keep(const emb_table *x, const emb_table *y) {
  const emb_keep_cfg *a = &x->keep, *b = &y->keep;
  if (!emb_keep_on(x) || !emb_keep_on(y)) return emb_keep_on(x) == emb_keep_on(y);
  return a->admit_after == b->admit_after && a->admit_window == b->admit_window &&
         a->expire_after == b->expire_after && a->capacity == b->capacity &&
         a->evict == b->evict && a->half_life == b->half_life;
}

/* Whether plans a and b hold the same values in every field that counts. */
static int same_plan(const emb_plan *a, const emb_plan *b) {
  if (a->format != b->format || a->seed != b->seed || a->n_shards != b->n_shards ||
      a->n_tables != b->n_tables)
    return 0;
  for (int i = 0; i < a->n_tables; i++) {
    const emb_table *x = &a->tables[i], *y = &b->tables[i];
    if (x->table_id != y->table_id || strcmp(x->name, y->name) || x->rows != y->rows ||
        x->dim != y->dim || x->pooling != y->pooling || x->init_range != y->init_range ||
        x->optim.kind != y->optim.kind || x->optim.eps != y->optim.eps ||
        x->optim.init_acc != y->optim.init_acc || x->precision != y->precision ||
        !same_keep(x, y) || x->place.kind != y->place.kind ||
        x->place.n != y->place.n ||
        memcmp(x->place.shards, y->place.shards, (size_t)x->place.n * sizeof(int)))
      return 0;
  }
  return 1;
}

static void same_fingerprints(const emb_plan *a, const emb_plan *b) {
  char x[EMB_FP_HEX], y[EMB_FP_HEX];
  if (emb_plan_model_fingerprint(a, x) || emb_plan_model_fingerprint(b, y) || strcmp(x, y))
    abort();
  if (emb_plan_fingerprint(a, x) || emb_plan_fingerprint(b, y) || strcmp(x, y)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1), err[1024];
  if (!text) abort();
  memcpy(text, data, size);
  text[size] = 0;
  emb_plan *p = NULL;
  err[0] = 0;
  if (emb_plan_parse(text, "plan.json", &p, err, sizeof err)) {
    if (p || strncmp(err, "plan.json: ", 11) || !err[11]) abort();
    free(text);
    return 0;
  }
  if (emb_plan_validate(p, "plan.json", err, sizeof err)) abort();
  char *canon = emb_plan_canonical(p, 1);
  if (!canon) abort();
  emb_plan *q = NULL;
  if (emb_plan_parse(canon, "canonical", &q, err, sizeof err)) abort();
  char *again = emb_plan_canonical(q, 1);
  if (!again || strcmp(canon, again)) abort();
  if (!same_plan(p, q)) abort(); /* the canonical form loses nothing */
  same_fingerprints(p, q);
  free(again);
  emb_plan_free(q);
  free(canon);
  emb_plan_free(p);
  free(text);
  return 0;
}
