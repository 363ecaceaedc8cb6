/* The training job's test passes: the whole test split through the model
 * (split over the ranks, gathered on rank 0), --test-pred-out, the report
 * line and its JSON. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/num.h"
#include "common/outfile.h"
#include "common/status.h"
#include "common/sys.h"
#include "train/job_impl.h"

int train_oracle_read(const char *path, double *auc_out, double *ll_out, char *err,
                      size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    sr_fmt(err, errlen, "--oracle %s: cannot open", path);
    return SR_EIO;
  }
  char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  cJSON *j = cJSON_Parse(buf);
  const cJSON *test = j ? cJSON_GetObjectItem(j, "test") : NULL;
  const cJSON *auc = test ? cJSON_GetObjectItem(test, "oracle_auc") : NULL;
  const cJSON *ll = test ? cJSON_GetObjectItem(test, "oracle_logloss") : NULL;
  int ok = cJSON_IsNumber(auc) && cJSON_IsNumber(ll);
  if (ok) {
    *auc_out = auc->valuedouble;
    *ll_out = ll->valuedouble;
  }
  cJSON_Delete(j);
  if (!ok) {
    sr_fmt(err, errlen, "--oracle %s: no test.oracle_auc / test.oracle_logloss", path);
    return SR_EFORMAT;
  }
  return 0;
}

int job__eval_open(train_job *j) {
  const train_config *c = j->cfg;
  if (ds_batch_init(&j->tb, c->test_batch) ||
      (j->size > 1 && (ds_batch_init(&j->tpart, c->test_batch / j->size + 1) ||
                       !(j->lpred = malloc(((size_t)c->test_batch / (size_t)j->size + 1) *
                                           sizeof *j->lpred)) ||
                       !(j->counts = malloc((size_t)j->size * sizeof *j->counts))))) {
    job__errf(j, "out of memory for batches\n");
    return -1;
  }
  if (j->n_test) {
    j->pred = malloc(j->n_test * sizeof *j->pred);
    j->labels = malloc(j->n_test * sizeof *j->labels);
    if (!j->pred || !j->labels) {
      job__errf(j, "out of memory for %llu test predictions\n", (unsigned long long)j->n_test);
      return -1;
    }
  }
  if (c->metrics_out && j->rank == 0 && !c->resume) { /* resumed: job__metrics_out_resume */
    j->metrics = fopen(c->metrics_out, "w");
    if (!j->metrics) {
      job__errf(j, "--metrics-out %s: cannot open for writing\n", c->metrics_out);
      return -1;
    }
  }
  return 0;
}

int job__test_check(train_job *j) {
  const int batch = j->cfg->test_batch;
  int got;
  while ((got = ds_source_next(j->test, &j->tb, batch)) > 0) {
  }
  if (got < 0 || ds_source_rewind(j->test)) {
    job__errf(j, "test data, read before the first step: %s\n", ds_source_errmsg(j->test));
    return -1;
  }
  return 0;
}

/* What a resumed job at step keeps of its --metrics-out text[0, n): the
 * length of its whole lines that parse as JSON objects with a "step" up to
 * step, up to the first that is not or is a test line of step that
 * --test-freq did not write. *lines gets their count, *has the
 * JOB_REDO_* bits of the lines of step among them. */
static size_t metrics_kept(const train_job *j, char *text, size_t n, long *lines, int *has) {
  const double step = (double)j->cur.step;
  size_t keep = 0;
  *lines = 0;
  *has = 0;
  while (keep < n) {
    char *nl = memchr(text + keep, '\n', n - keep);
    if (!nl) break; /* a torn last line */
    *nl = 0;
    cJSON *o = cJSON_Parse(text + keep);
    *nl = '\n';
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "step");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
    int test = cJSON_IsString(kind) && !strcmp(kind->valuestring, "test");
    int ok = cJSON_IsNumber(st) && cJSON_IsString(kind) && st->valuedouble <= step &&
             !(test && st->valuedouble == step && !job__pass_due(j, j->cur.step));
    if (ok && st->valuedouble == step) *has |= test ? JOB_REDO_PASS : JOB_REDO_LINE;
    cJSON_Delete(o);
    if (!ok) break;
    keep = (size_t)(nl - text) + 1;
    (*lines)++;
  }
  return keep;
}

int job__metrics_out_resume(train_job *j) {
  const char *path = j->cfg->metrics_out;
  const int64_t step = j->cur.step;
  FILE *f = fopen(path, "a+"); /* made when missing; writes go to its end */
  char *text = NULL;
  long size = -1, lines = 0;
  int has = 0;
  errno = 0; /* a short read sets none: said as such below */
  if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)size + 1)) &&
      fread(text, 1, (size_t)size, f) == (size_t)size) {
    size_t keep = metrics_kept(j, text, (size_t)size, &lines, &has);
    free(text);
    if (ftruncate(fileno(f), (off_t)keep) == 0) {
      j->metrics = f;
      if (lines > 0 && step > 0) /* the interrupted job's lines go on */
        j->resume_redo = (job__print_due(j, step) && j->ckst.loss_n > 0 && !(has & JOB_REDO_LINE)
                              ? JOB_REDO_LINE : 0) |
                         (job__pass_due(j, step) && !(has & JOB_REDO_PASS) ? JOB_REDO_PASS : 0);
      if ((size_t)size > keep)
        printf("metrics %s: %ld line(s) up to step %lld kept, %zu byte(s) after them dropped\n",
               path, lines, (long long)step, (size_t)size - keep);
      return 0;
    }
    text = NULL;
  }
  free(text);
  if (f) fclose(f);
  job__errf(j, "--metrics-out %s: cannot read it and cut it back to step %lld: %s\n", path,
            (long long)step, errno ? strerror(errno) : "it changed while read");
  return -1;
}

int job__metrics_out_rewound(train_job *j) {
  if (j->rank != 0 || !j->metrics) return 0;
  fclose(j->metrics);
  j->metrics = NULL;
  return job__metrics_out_resume(j);
}

void job__eval_close(train_job *j) {
  if (j->metrics) fclose(j->metrics);
  j->metrics = NULL;
  free(j->pred);
  free(j->labels);
  free(j->lpred);
  free(j->counts);
  j->pred = j->labels = j->lpred = NULL;
  j->counts = NULL;
  ds_batch_free(&j->tb);
  ds_batch_free(&j->tpart);
}

/* A failed prediction (own: this rank's; else another rank's) into why:
 * 1, for the job to recover from. */
static int predict_lost(train_job *j, int own, float ranks, char *why, size_t whylen) {
  j->own_fail = own;
  if (own)
    sr_fmt(why, whylen, "test pass at step %lld: %s", (long long)j->cur.step, trainer_errmsg(j->t));
  else
    sr_fmt(why, whylen, "test pass at step %lld: the lookup of %.0f other rank(s) of %d failed",
           (long long)j->cur.step, (double)ranks, j->size);
  return 1;
}

/* One test batch tb of got samples: its predictions and labels at
 * pred/labels + n on rank 0. Several ranks: each predicts its slice, every
 * rank learns whether any failed (a one-float all-reduce), and rank 0
 * gathers them in sample order. 0, -1 (message printed) or 1 (a lookup
 * failed: predict_lost). */
static int predict_batch(train_job *j, int got, size_t n, char *why, size_t whylen) {
  if (j->size == 1) {
    if (trainer_predict(j->t, &j->tb, j->cur.step, j->pred + n))
      return predict_lost(j, 1, 1, why, whylen);
    memcpy(j->labels + n, j->tb.labels, (size_t)got * sizeof *j->labels);
    return 0;
  }
  for (int r = 0; r < j->size; r++) j->counts[r] = (size_t)trainer_slice_count(got, r, j->size);
  if (trainer_batch_slice(&j->tb, j->rank, j->size, &j->tpart)) {
    job__errf(j, "test data: out of memory for this rank's slice\n");
    return -1;
  }
  int own = trainer_predict(j->t, &j->tpart, j->cur.step, j->lpred) != 0;
  float failed = (float)own;
  if (!job__coll_ok(j, dense_coll_all_reduce_sum(j->coll, &failed, 1),
                    "all-reduce of the test lookups' outcome"))
    return -1;
  if (failed > 0) return predict_lost(j, own, failed - (float)own, why, whylen);
  int r0 = j->rank == 0;
  return job__coll_ok(j, dense_coll_gather(j->coll, j->lpred, (size_t)j->tpart.n,
                                      r0 ? j->pred + n : NULL, r0 ? j->counts : NULL, 0),
                 "gather of the test predictions") &&
                 job__coll_ok(j, dense_coll_gather(j->coll, j->tpart.labels, (size_t)j->tpart.n,
                                              r0 ? j->labels + n : NULL, r0 ? j->counts : NULL, 0),
                         "gather of the test labels")
             ? 0
             : -1;
}

/* Evaluate on the whole test split; fills m (on rank 0). 0, -1 (message
 * printed) or 1 (predict_batch). */
static int evaluate(train_job *j, dense_metrics *m, char *why, size_t whylen) {
  if (ds_source_rewind(j->test)) {
    job__errf(j, "test data: %s\n", ds_source_errmsg(j->test));
    return -1;
  }
  size_t n = 0;
  for (;;) {
    int got = ds_source_next(j->test, &j->tb, j->cfg->test_batch);
    if (got < 0) {
      job__errf(j, "test data: %s\n", ds_source_errmsg(j->test));
      return -1;
    }
    if (got == 0) break;
    if (n + (size_t)got > j->n_test) {
      job__errf(j, "test split larger than counted (%zu)\n", (size_t)j->n_test);
      return -1;
    }
    int rc = predict_batch(j, got, n, why, whylen);
    if (rc) return rc;
    n += (size_t)got;
  }
  if (j->rank != 0) return 0; /* rank 0 computes the job's metrics */
  if (n == 0) {
    job__errf(j, "the test split is empty\n");
    return -1;
  }
  if (dense_metrics_compute(j->pred, j->labels, n, m)) {
    job__errf(j, "metrics failed (NaN predictions?)\n");
    return -1;
  }
  return 0;
}

/* --test-pred-out: the n test predictions, "%.9g" each (round-trips a
 * float), written under a temporary name and renamed (common/outfile.h), so
 * a reader never sees a half-written file. 0 or -1 (message printed). */
static int write_preds(const train_job *j, const char *path, size_t n) {
  if (!path) return 0;
  sr_outfile *o;
  char err[1024];
  int rc = sr_out_open(path, &o, err, sizeof err);
  for (size_t i = 0; !rc && i < n; i++) rc = sr_out_printf(o, "%.9g\n", (double)j->pred[i]);
  if (rc && o) sr_fmt(err, sizeof err, "%s", sr_out_errmsg(o)), sr_out_abort(o);
  else if (!rc) rc = sr_out_commit(o, err, sizeof err);
  if (rc) job__errf(j, "--test-pred-out %s\n", err);
  return rc ? -1 : 0;
}

/* The test line on stdout and in --metrics-out (each line's write checked:
 * the file is read while it grows). 0 or -1 (message printed). */
static int report_test(const train_job *j, const dense_metrics *m) {
  const train_config *c = j->cfg;
  long long step = (long long)j->cur.step;
  int epoch = j->cur.epoch;
  printf("test   step %lld epoch %d: auc %.6f  logloss %.6f  accuracy %.4f  mean pred %.4f  "
         "ctr %.4f  (%zu samples)\n",
         step, epoch, m->auc, m->log_loss, m->accuracy, m->mean_pred, m->ctr, m->n);
  if (c->have_oracle)
    printf("oracle              : auc %.6f  logloss %.6f  (gap: auc %+.4f, logloss %+.4f)\n",
           c->oracle_auc, c->oracle_logloss, m->auc - c->oracle_auc,
           m->log_loss - c->oracle_logloss);
  fflush(stdout);
  job__metrics_test(j, m->auc, m->log_loss);
  if (!j->metrics) return 0;
  char line[1024], oracle[128] = "", err[1024], v[7][SR_JNUM_MAX]; /* NaN: null */
  if (c->have_oracle)
    snprintf(oracle, sizeof oracle, ",\"oracle_auc\":%s,\"oracle_logloss\":%s",
             sr_jnum(v[5], c->oracle_auc, 17), sr_jnum(v[6], c->oracle_logloss, 17));
  int len = snprintf(line, sizeof line,
                     "{\"kind\":\"test\",\"step\":%lld,\"epoch\":%d,\"auc\":%s,"
                     "\"logloss\":%s,\"accuracy\":%s,\"mean_pred\":%s,\"ctr\":%s,"
                     "\"n\":%zu%s}\n",
                     step, epoch, sr_jnum(v[0], m->auc, 17), sr_jnum(v[1], m->log_loss, 17),
                     sr_jnum(v[2], m->accuracy, 17), sr_jnum(v[3], m->mean_pred, 17),
                     sr_jnum(v[4], m->ctr, 17), m->n, oracle);
  if (sr_out_line(j->metrics, c->metrics_out, line, (size_t)len, err, sizeof err)) {
    job__errf(j, "--metrics-out %s\n", err);
    return -1;
  }
  return 0;
}

int job__test_pass(train_job *j, char *why, size_t whylen) {
  double e0 = sr_now();
  dense_metrics m;
  int rc = evaluate(j, &m, why, whylen);
  if (rc) return rc;
  if (j->rank == 0) { /* m is rank 0's alone */
    if (write_preds(j, j->cfg->test_pred_out, m.n) || report_test(j, &m)) return -1;
  }
  j->t_eval += sr_now() - e0;
  return 0;
}
