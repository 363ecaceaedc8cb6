/* The training job's batches: the ring of the global batches every rank
 * reads and this rank's slice of each (job_batches, train/job_impl.h), and
 * the look-ahead fill that reads the batches of the steps after this one
 * into it and hands them to the trainer before the step runs. */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "train/job_impl.h"

int job_batches_init(job_batches *q, int batch, int rank, int size, int max_ahead) {
  memset(q, 0, sizeof *q);
  q->rank = rank;
  q->size = size;
  int n = max_ahead + 1;
  q->g = calloc((size_t)n, sizeof *q->g);
  q->p = calloc((size_t)n, sizeof *q->p);
  q->got = calloc((size_t)n, sizeof *q->got);
  if (!q->g || !q->p || !q->got) return SR_ENOMEM;
  q->slots = n;
  for (int i = 0; i < n; i++)
    if (ds_batch_init(&q->g[i], batch) ||
        (size > 1 && ds_batch_init(&q->p[i], batch / size + 1)))
      return SR_ENOMEM;
  return 0;
}

void job_batches_free(job_batches *q) {
  if (!q) return;
  for (int i = 0; i < q->slots; i++) {
    ds_batch_free(&q->g[i]);
    ds_batch_free(&q->p[i]);
  }
  free(q->g);
  free(q->p);
  free(q->got);
  memset(q, 0, sizeof *q);
}

/* Read up to batch samples of src into g and cut this rank's slice into
 * part. The samples, or SR_E* (err). */
static int read_global(job_batches *q, ds_source *src, int batch, ds_batch *g, ds_batch *part,
                       char *err, size_t errlen) {
  int got = ds_source_next(src, g, batch);
  if (got < 0) {
    sr_fmt(err, errlen, "%s", ds_source_errmsg(src));
    return got;
  }
  /* Every rank read the same global batch; each trains on its slice. */
  if (got > 0 && q->size > 1 && trainer_batch_slice(g, q->rank, q->size, part)) {
    sr_fmt(err, errlen, "out of memory for this rank's slice");
    return SR_ENOMEM;
  }
  return got;
}

int job_batches_take(job_batches *q, ds_source *src, int batch, char *err, size_t errlen) {
  if (q->ahead > 0) { /* read (and its rows asked for) during the steps before */
    q->head = (q->head + 1) % q->slots;
    q->ahead--;
    return q->got[q->head];
  }
  int n = read_global(q, src, batch, &q->g[q->head], &q->p[q->head], err, errlen);
  if (n >= 0) q->got[q->head] = n;
  return n;
}

int job_batches_read_ahead(job_batches *q, ds_source *src, int batch, int *got, char *err,
                           size_t errlen) {
  if (q->ahead + 1 >= q->slots) {
    sr_fmt(err, errlen, "the ring of %d batches is full", q->slots);
    return SR_EINVAL;
  }
  int i = (q->head + q->ahead + 1) % q->slots;
  int n = read_global(q, src, batch, &q->g[i], &q->p[i], err, errlen);
  if (n < 0) return n;
  *got = q->got[i] = n;
  if (n > 0) q->ahead++;
  return 0;
}


int job__fill_ahead(train_job *j) {
  const train_config *c = j->cfg;
  job_batches *q = &j->q;
  const int64_t step = j->cur.step;
  char err[1024];
  while (q->ahead + 1 < q->slots && step + q->ahead + 1 < j->total_steps) {
    int got;
    int rc = job_batches_read_ahead(q, j->train, c->batch, &got, err, sizeof err);
    if (rc == SR_ENOMEM) job__errf(j, "step %lld: %s\n", (long long)(step + q->ahead + 1), err);
    else if (rc) job__errf(j, "%s\n", err);
    if (rc) return -1;
    if (got == 0) break;
    if (q->ahead <= c->prefetch_depth &&
        trainer_ahead(j->t, job_batches_mine_at(q, q->ahead), step + q->ahead)) {
      job__errf(j, "%s\n", trainer_errmsg(j->t));
      return -1;
    }
  }
  if (c->async && q->ahead > 0 && trainer_lookup_early(j->t, job_batches_mine_at(q, 1), step + 1)) {
    job__errf(j, "%s\n", trainer_errmsg(j->t));
    return -1;
  }
  return 0;
}
