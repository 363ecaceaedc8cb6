/* A training job: what `shardrec train` runs once its flags are parsed.
 *
 * train_run wires the job (this process's rank, the ranks' collective, the
 * job id the shard servers key a multi-rank step by, the data, the plan, the
 * embedding store: in process, RocksDB shard store, remote shard servers or
 * shards colocated with the ranks), runs the loop of steps over the epochs
 * (evaluations, progress, checkpoints, automatic recovery from a lost shard
 * server) and writes what was asked for at the end (final checkpoint, saved
 * model). Rank 0 prints progress and metrics; every rank prints its own
 * failures. The loop itself is in job.c, the batches read ahead in
 * job_batches.c, checkpoints and --resume in job_ckpt.c, the recovery in
 * job_recover.c, the test passes in job_eval.c; the step is trainer.c's. */
#ifndef SHARDREC_TRAIN_JOB_H
#define SHARDREC_TRAIN_JOB_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "datasets/batch.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "embedding/optim.h"
#include "embedding/plan.h"

/* This process's place in an mpirun job (rank 0 of 1 without mpirun). */
typedef struct train_ranks {
  int rank, size;   /* from the launcher's environment (dense_mpi_launched) */
  int local_size;   /* ranks on this node */
  int launched;     /* started by mpirun: train_run initialises MPI */
  int stderr_saved; /* ranks > 0: stderr while they keep quiet (-1: not saved) */
} train_ranks;

/* Find this process's rank. Rank 0 speaks for the job: the others' stdout
 * goes nowhere, and their stderr too until train_ranks_speak (every rank
 * would print the same usage error). */
void train_ranks_enter(train_ranks *r);
/* From here on this rank prints its own failures (stderr restored). */
void train_ranks_speak(train_ranks *r);
/* The process's exit status for a job that returned rc (0, 1 failure, 2
 * usage error): a usage error comes before MPI is up and every rank finds it
 * alike, so rank 0 prints it and owns the job's exit status while the others
 * leave with 0 (mpirun ends the whole job at the first non-zero exit, which
 * could come before rank 0 has printed); a failed rank of several aborts the
 * whole job (the others may be waiting for it in a collective or a step of
 * the shard servers); else MPI is finalised. */
int train_ranks_leave(train_ranks *r, int rc);

/* "shardrec train: <why>" on stderr; "shardrec train: rank R: <why>" in a
 * job of several ranks. */
void train_verrf(int rank, int size, const char *fmt, va_list ap);

/* Everything a job needs, as the flags of `shardrec train` give it (their
 * names in the comments). Strings are borrowed for the job's life. */
typedef struct train_config {
  /* Data */
  const char *processed;    /* --processed-data-file (one of processed, raw) */
  const char *raw;          /* --raw-data-file */
  int terabyte;             /* --data-set terabyte (raw data without a test fraction) */
  int have_test_fraction;   /* --test-fraction given (raw data) */
  double test_fraction;
  uint64_t max_ind_range;   /* --max-ind-range */
  uint32_t frequency_threshold; /* --frequency-threshold */
  int strict;               /* --strict */
  /* Model */
  dense_config dense;       /* the dense architecture (max_batch: the larger batch) */
  int dcn_layers_set, dcn_rank_set; /* dcn: --dcn-num-layers, --dcn-low-rank-dim given (those
                               not given: a --resume's checkpoint's, else the defaults) */
  const char *bot, *top, *op; /* its flags as given, for the model line */
  const char *plan_path;    /* --plan (NULL: made here from the data and these flags) */
  const char *plan_out;     /* --plan-out: where a plan made here is written (NULL: only
                               into --save-checkpoint's folder, if any) */
  int have_emb_sizes;       /* --arch-embedding-size given: rows per table below */
  uint64_t emb_sizes[DS_NUM_SPARSE];
  int dim;                  /* --arch-sparse-feature-size */
  emb_pooling pooling;      /* --pooling */
  emb_optim_kind sparse_opt; /* --sparse-optimizer (or the --optimizer's default) */
  emb_precision precision;  /* --arch-embedding-precision (fp32) */
  uint64_t seed;            /* --seed */
  int n_shards;             /* --num-shards */
  emb_keep_cfg keep;        /* --admit-after, --admit-window, --expire-after, --capacity,
                               --evict: every table's bounds of a plan made here */
  int have_keep;            /* one of them given */
  /* Training */
  int batch, test_batch;    /* --mini-batch-size (the global batch), --test-mini-batch-size */
  double lr, sparse_lr;     /* --learning-rate, --sparse-learning-rate */
  dense_opt_kind dense_opt; /* --optimizer */
  const char *opt_name;     /* its name as given */
  dense_lr_sched sched;     /* --lr-num-warmup-steps, --lr-decay-start-step, --lr-num-decay-steps */
  int epochs;               /* --nepochs */
  int64_t num_batches;      /* --num-batches (0: whole epochs) */
  int dense_threads;        /* --dense-threads (0: cores / ranks on this host); the
                               kernels (--dense-isa) are the default backend's */
  /* Output */
  int64_t print_freq, test_freq; /* --print-freq, --test-freq (0: at each epoch's end) */
  const char *metrics_out;  /* --metrics-out */
  const char *metrics_listen; /* --metrics-listen HOST:PORT (Prometheus; PORT + local rank) */
  const char *save_model;   /* --save-model */
  int have_oracle;          /* --oracle read (train_oracle_read): its test figures */
  double oracle_auc, oracle_logloss;
  const char *test_pred_out; /* --test-pred-out */
  /* Embeddings */
  const char *servers;      /* --shard-servers "H:P,..." */
  const char *tls_ca, *tls_cert, *tls_key;
  double rpc_deadline;      /* --rpc-deadline (0: the remote store's default) */
  int rpc_connections;      /* --rpc-connections: TCP connections per server (0: the remote
                               store's default, 1) */
  double recover_timeout;   /* --recover-timeout */
  int colocate;             /* --colocate-shards */
  int async;                /* --sparse-mode async */
  int max_staleness;        /* --max-staleness */
  int prefetch_depth;       /* --prefetch-depth: steps whose ids the store gets ahead (0: off) */
  const char *data_dir;     /* --data-dir */
  uint64_t cache_rows, cache_mb; /* --cache-rows, --cache-mb */
  /* Checkpoints */
  const char *checkpoint_dir; /* --save-checkpoint */
  int64_t checkpoint_every; /* --checkpoint-every */
  int keep_checkpoints;     /* --keep-checkpoints: the newest K heads, with their chains */
  int full_every;           /* --full-checkpoint-every K: of the checkpoints written into
                               checkpoint_dir, every K-th full, the others incremental on the
                               one before (<= 1: every one full) */
  const char *resume;       /* --resume */
  int auto_resume;          /* --auto-resume: --resume checkpoint_dir when it holds a complete
                               checkpoint, else start fresh */
  train_ranks ranks;        /* train_ranks_enter's */
} train_config;

/* --prefetch-depth's default: measured with bench train --store shard
 * (README, "Training from RocksDB"). */
#define TRAIN_PREFETCH_DEPTH_DEFAULT 2

/* Check what the flags' parsers cannot see alone: one data file, options
 * that need others or exclude them, the batch against the ranks. 0, or
 * SR_EINVAL with the message in err (a usage error). */
int train_config_check(const train_config *c, char *err, size_t errlen);

/* The generator's summary (--oracle SUMMARY.json): its test.oracle_auc and
 * test.oracle_logloss. 0, or SR_E* with the reason naming path in err. */
int train_oracle_read(const char *path, double *auc, double *logloss, char *err, size_t errlen);

/* Run the job of c (checked). Returns 0 on success, 1 on failure with the
 * reason printed on stderr ("shardrec train: ..." or, with several ranks,
 * "shardrec train: rank R: ..."). Under mpirun, MPI is initialised here and
 * the collective destroyed before returning; MPI_Finalize or MPI_Abort is
 * the caller's. */
int train_run(const train_config *c);

#endif
