/* Scoring with a trainer checkpoint (the engine of `shardrec predict`).
 *
 * score_run opens a verified checkpoint (train/checkpoint.h), builds
 * its dense model and its embedding rows: in this process, read from the
 * checkpoint (embedding/ckpt_store.h), or on shard servers serving it (e.g.
 * 'shardrec serve --checkpoint CKPT --read-only'). It streams Criteo-format
 * data through trainer_predict in batches of valid samples, as the trainer's
 * evaluation does (at the trainer's test batch size the probabilities are
 * the trainer's own, bit for bit), and writes one probability per input line
 * ("%.9g", a float round-trips) in input order; a malformed raw line the
 * reader skips is written as "nan" so the output stays aligned with the
 * input. Labelled input also gets its metrics (AUC, log loss, ...).
 *
 * The ids are the model's own (datasets/transform.h): raw rows are mapped
 * with the checkpoint's data transform (transform.bin), no dictionary is
 * built from the scored file, and a value the model never kept is the
 * unseen id 0. A checkpoint that records no transform scores no raw rows
 * (their mapping cannot be proven); a converted file is scored only when
 * its transform has the checkpoint's fingerprint (one converted with
 * --mapping-from CKPT), or when the checkpoint records none. Every refusal
 * comes before a row is scored or a file written.
 * `shardrec predict` and `shardrec eval` (predictions not written) are both
 * fronts of score_run. A saved-model folder of the format before
 * --save-model wrote checkpoints is refused (SR_EVERSION) with a message
 * saying to save it again. */
#ifndef SHARDREC_TRAIN_PREDICT_H
#define SHARDREC_TRAIN_PREDICT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "datasets/source.h"
#include "dense/metrics.h"

/* Zero-initialised fields are the defaults named below; the strings are
 * borrowed for the call. */
typedef struct score_opts {
  const char *checkpoint;    /* a step-N folder, or a folder of them (the newest complete) */
  const char *shard_servers; /* "H:P,...": one server per shard of the checkpoint's plan,
                                in shard order; NULL: the rows in this process, read
                                from the checkpoint */
  double rpc_deadline;       /* seconds per shard-server call (0: 30) */
  const char *tls_ca, *tls_cert, *tls_key; /* TLS (and mTLS) to the servers; tls_ca NULL:
                                              none */
  uint64_t cache_mb;         /* in process, RocksDB shards: the row cache (0: 256) */
  const char *data_path;     /* the data file */
  int raw;                   /* data_path is Criteo TSV (or .gz); else a converted file */
  int terabyte;              /* raw data: data_path is a prefix, the files PATH_0 ..
                                PATH_23 split as the reference's terabyte set (out must
                                be NULL: the day files are not scanned for malformed
                                lines) */
  ds_split split;            /* the part scored */
  const char *split_name;    /* its name, for messages ("all": NULL) */
  /* Raw data: the lines split as train splits them (kaggle unless terabyte
   * or have_test_fraction: then the last test_fraction of the lines are
   * test); their ids are mapped with the checkpoint's data transform. */
  int have_test_fraction;
  double test_fraction;
  int no_label;              /* raw data without the label column: no metrics */
  int strict;                /* raw data: the first malformed line is fatal */
  int batch;                 /* samples per forward pass (0: the checkpoint's batch) */
  const char *out;           /* the predictions, written whole under a temporary name
                                and then renamed; NULL: scored, not written (eval) */
  const char *metrics_out;   /* labelled input: the metrics as one JSON object, written
                                whole as out is (NULL: not) */
  FILE *log;                 /* the status lines (checkpoint, predict, data, metrics);
                                NULL: none */
  FILE *report;              /* the reader's malformed-line reports and warnings; NULL:
                                none */
  const char *who;           /* names the caller at the start of a warning ("shardrec
                                predict"; NULL: "predict") */
  int progress;              /* 1: a progress line on stderr while scoring (give it only
                                when stderr is a terminal; common/progress.h) */
} score_opts;

typedef struct score_result {
  size_t n;                  /* samples scored */
  dense_metrics m;           /* labelled input: the metrics */
  int bad_usage;             /* on failure: the options do not fit the checkpoint (a
                                --shard-servers list that is not one server per shard) */
} score_result;

/* The part of the data a split name means: "all", "train", "test", "val"
 * (--data-split, alias --split, of predict and eval). 0, or -1 for another
 * name (*sp unchanged). */
int score_split_parse(const char *name, ds_split *sp);

/* Score o->data_path with the checkpoint o->checkpoint and write o->out (and
 * o->metrics_out; either may be NULL). Fills *res (may be NULL). 0, or SR_E* with the reason in
 * err (naming the flag, file or server at fault). Both files are written
 * whole under temporary names and renamed into place (common/outfile.h; a
 * write error, a full disk included, is SR_EIO naming the file). A failure
 * before the predictions are complete leaves o->out as it was (the
 * temporary file is removed); every store, server connection and temporary
 * folder is released either way. */
int score_run(const score_opts *o, score_result *res, char *err, size_t errlen);

#endif
