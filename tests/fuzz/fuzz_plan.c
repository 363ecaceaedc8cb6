/* libFuzzer target: the plan parser (embedding/plan.c: emb_plan_parse), a
 * plan file's text as `--plan FILE` and a checkpoint's plan.json give it.
 *
 * Invariants: a refusal names the text ("plan.json: ...") and says why; a
 * plan it takes validates, and its canonical form (with placement) parses
 * to a plan of the same values in every field (emb_plan_grows both ways),
 * the same canonical form and the same model and plan fingerprints.
 * Seeds: tests/fuzz/seeds/fuzz_plan (plans `shardrec plan` wrote: bounded
 * and unbounded tables, sgd, adagrad and rowwise_adagrad, fp16 and bf16,
 * table-wise and row-wise, admission and expiry). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "embedding/plan.h"

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
  /* The canonical form loses nothing: each plan grows the other, so every
   * field is the same, rows included. */
  if (!emb_plan_grows(p, q, err, sizeof err) || !emb_plan_grows(q, p, err, sizeof err)) abort();
  same_fingerprints(p, q);
  free(again);
  emb_plan_free(q);
  free(canon);
  emb_plan_free(p);
  free(text);
  return 0;
}
