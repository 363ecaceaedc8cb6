/* A trainer's Prometheus series (train --metrics-listen), without a
 * listener: what the job records after every step (9 phase gauges and
 * counters, rows and bytes looked up, samples, step, epoch), each labelled
 * with the rank. The job (train/job_metrics.c) serves their registry on
 * --metrics-listen; bench metrics times the update. */
#ifndef SHARDREC_TRAIN_TRAIN_METRICS_H
#define SHARDREC_TRAIN_TRAIN_METRICS_H

#include <stdint.h>
#include <stddef.h>

#include "metrics/metrics.h"
#include "train/trainer.h"

typedef struct train_metrics train_metrics;

/* The series of rank, in a registry of their own. NULL with the reason in
 * err. */
train_metrics *train_metrics_open(int rank, char *err, size_t errlen);
/* The registry holding them (borrowed; lives as long as m). */
metrics_registry *train_metrics_registry(train_metrics *m);
/* NULL-safe. */
void train_metrics_close(train_metrics *m);
/* A step taken: the trainer's cumulative times tt (dim: the rows' floats),
 * the job's step and epoch, its total steps, got samples of the global
 * batch. */
void train_metrics_note(train_metrics *m, const trainer_times *tt, int dim, int64_t step, int epoch,
                        int64_t total, int got);

#endif
