/* Internals of the training job (job.c, job_batches.c, job_ckpt.c,
 * job_recover.c, job_eval.c, job_metrics.c), shared with their unit tests
 * (tests/train). Not part of the engine's interface. */
#ifndef SHARDREC_TRAIN_JOB_IMPL_H
#define SHARDREC_TRAIN_JOB_IMPL_H

#include <stdio.h>

#include "datasets/source.h"
#include "dense/collective.h"
#include "dense/metrics.h"
#include "embedding/store.h"
#include "train/checkpoint.h"
#include "train/colocate.h"
#include "train/job.h"
#include "train/trainer.h"
#include "train/train_metrics.h"

/* The train batches of one rank: a ring of the global batches every rank
 * reads and this rank's slice of each, this step's and those read ahead of
 * it (--prefetch-depth, and in async mode the next one, whose rows are asked
 * for during the step before). Slot head is this step's; the next ahead
 * slots hold steps step+1 .. step+ahead, each left unchanged until its step
 * has run. */
typedef struct job_batches {
  ds_batch *g, *p;    /* [slots] global batches and this rank's slices (size > 1) */
  int *got;           /* [slots] their samples */
  int slots;          /* 1 + the most batches read ahead */
  int head;           /* this step's slot */
  int ahead;          /* batches read after it */
  int rank, size;
} job_batches;

/* Buffers for batches of up to batch samples for rank of size, and for
 * max_ahead batches read ahead. 0 or SR_ENOMEM (q left for
 * job_batches_free). */
int job_batches_init(job_batches *q, int batch, int rank, int size, int max_ahead);
void job_batches_free(job_batches *q); /* NULL-safe; zeroes *q */

/* This step's batch: the first one read ahead when there is one (the ring
 * turns, nothing copied), else up to batch samples read from src (and this
 * rank's slice cut). Returns the global batch's samples (0 at the end of the
 * split) or SR_E* (the reason in err). */
int job_batches_take(job_batches *q, ds_source *src, int batch, char *err, size_t errlen);

/* Read the batch after the last one in the ring into the next free slot
 * (and its slice); *got gets its samples (0 at the end of the split: nothing
 * added). 0, SR_EINVAL (the ring is full) or SR_E* (err). */
int job_batches_read_ahead(job_batches *q, ds_source *src, int batch, int *got, char *err,
                           size_t errlen);

/* This rank's part of the batch k steps after this one (0: this step's;
 * k <= ahead), and the global batch. */
static inline const ds_batch *job_batches_mine_at(const job_batches *q, int k) {
  int i = (q->head + k) % q->slots;
  return q->size > 1 ? &q->p[i] : &q->g[i];
}
static inline const ds_batch *job_batches_mine(const job_batches *q) {
  return job_batches_mine_at(q, 0);
}
static inline const ds_batch *job_batches_global(const job_batches *q) { return &q->g[q->head]; }

/* Where the loop stands: the step, the epoch and the step within it, and the
 * running figures of the progress line. */
typedef struct job_cursor {
  int64_t step;            /* steps done */
  int epoch;
  int64_t epoch_step;      /* steps done in this epoch */
  double loss_sum;         /* since the last progress line */
  int64_t loss_n, samples_since;
  double t_last;           /* time of the last progress line */
} job_cursor;

/* Put the cursor at checkpoint state st (a resume, a recovery): its step
 * and epoch, the steps of that epoch up to its sample index (batch samples
 * a step), the progress figures started afresh at time now, but for the
 * progress line's window: the checkpoint's when window (a line was not
 * printed at its step: the window goes on), else empty; and drop the
 * batches read ahead, if any (the trainer's sets ahead go with them:
 * trainer_ahead_drop). */
void job_rewind(job_cursor *c, job_batches *q, const train_ckpt_state *st, int batch, int window,
                double now);

/* A running job (train_run's). */
typedef struct train_job {
  const train_config *cfg;
  int rank, size;
  dense_coll *coll;        /* the ranks' collective (NULL: one rank), owned */
  ds_source *train, *test; /* owned */
  uint64_t n_train, n_test;
  const char *data_path;
  char data_id[128];             /* ds_source_identity of the train source */
  emb_plan *plan;          /* owned */
  /* --resume: the checkpoint's plan and data transform (NULL: it records
   * none), owned; grow: the data's mapping extends the checkpoint's, so the
   * plan is the checkpoint's grown to the data's tables (job__resume_mapping). */
  emb_plan *ck_plan;
  ds_transform *ck_xf;
  int grow;
  emb_store *store;        /* owned */
  const char *store_kind;  /* "local", "shard" or "remote" */
  char *tmp_data_dir;      /* the shard store's temporary folder (removed at the end), owned */
  trainer *t;              /* owned */
  keep *keep;              /* the bounded tables' entries (NULL: the plan bounds none), owned */
  colocate *colo;          /* this rank's colocated shard servers, owned */
  char **colo_addrs;       /* [plan->n_shards], owned */
  char job_id[64];         /* several ranks: the id every rank's calls carry */
  job_batches q;
  job_cursor cur;
  train_ckpt_settings cks;
  train_ckpt_state ckst;         /* the job's position after its last step */
  /* The chain under --save-checkpoint: the step of the checkpoint the
   * store's change set counts from (the last written or resumed from
   * there; -1: none, the next one is full) and the increments since its
   * full one; noted_full: the store's lack of incremental ops was said. */
  long long ck_parent;
  int ck_incs, noted_full;
  int64_t total_steps, steps_per_epoch;
  int64_t samples_done;
  double t_start, t_eval;
  uint64_t mem_peak_kb;    /* peak RssAnon so far */
  int tty;                 /* rank 0 with stderr on a terminal: live progress line */
  int own_fail;            /* the step, pass or checkpoint being recovered from failed in
                              this rank's own call (else in another rank's) */
  /* Test passes (job_eval.c) */
  ds_batch tb, tpart;      /* a test batch and this rank's slice (size > 1) */
  float *lpred;            /* [test_batch / size + 1] this rank's predictions */
  float *pred, *labels;    /* [n_test] rank 0's predictions and labels */
  size_t *counts;          /* [size] samples per rank of a test batch */
  FILE *metrics;           /* --metrics-out (rank 0), owned */
  int resume_redo;         /* JOB_REDO_*: the resumed step's lines to write again */
  train_metrics *mx;       /* --metrics-listen, owned (job_metrics.c) */
  trainer_times phase_mark; /* the trainer's times at the last progress line */
} train_job;

/* A resumed job's --metrics-out lacks the lines of the checkpoint's step
 * (written after its checkpoint, lost in the interruption): the progress
 * line (rank 0), the test pass (every rank). */
enum { JOB_REDO_LINE = 1, JOB_REDO_PASS = 2 };

/* The folder a job starting afresh claims its --data-dir for: its
 * --save-checkpoint folder under --auto-resume (a restart before its first
 * checkpoint finds its databases again as its own), else NULL. */
static inline const char *job__fresh_owner(const train_config *c) {
  return c->auto_resume && c->checkpoint_dir && c->data_dir ? c->checkpoint_dir : NULL;
}

/* Whether the progress line, and --test-freq's test pass, are due after
 * step (steps done). */
static inline int job__print_due(const train_job *j, int64_t step) {
  return step % j->cfg->print_freq == 0 || step == j->total_steps;
}
static inline int job__pass_due(const train_job *j, int64_t step) {
  return j->cfg->test_freq > 0 && step > 0 && step % j->cfg->test_freq == 0 && j->n_test;
}

/* "shardrec train: <why>" on stderr; with several ranks "shardrec train:
 * rank R: <why>". */
__attribute__((format(printf, 2, 3))) void job__errf(const train_job *j, const char *fmt, ...);

/* A collective call of the job: 1 when rc is 0; else the reason (what and
 * the collective's message) printed, and 0. */
int job__coll_ok(const train_job *j, int rc, const char *what);

/* job.c: one job id for every rank (the servers key a step's pushes by
 * it): rank 0 draws it and broadcasts it. */
int job__share_job_id(train_job *j);

/* job_batches.c: fill the look-ahead before this step runs: read the batches
 * of the steps after it up to --prefetch-depth ahead (async mode: at least
 * the next), never past the job's last step nor the split's end (the next
 * epoch's first steps enter once it starts); the trainer takes each batch
 * entering the depth's window (trainer_ahead: deduplicated and handed to the
 * store during this step), and in async mode the next one's lookup
 * (trainer_lookup_early). 0 or -1 (message printed). */
int job__fill_ahead(train_job *j);

/* job_ckpt.c: the output folders' checks, --resume, checkpoints,
 * --save-model. The folders the job writes or reads under are refused before
 * anything is read, trained or made when a path under them would not fit:
 * --save-checkpoint DIR (DIR/.step-N.TAG/...), --save-model DIR
 * (DIR.TAG/.step-N.TAG/...), --data-dir DIR (DIR/shard-K/...), N, TAG and K
 * at their widest; --resume DIR (DIR/<a checkpoint's file>: any step-N
 * train_ckpt_save wrote passes, and a newest step-N under DIR that does not
 * fit is refused by train_ckpt_resolve). 0 or -1 (message printed). */
int job__check_paths(const train_job *j);
/* The folder outputs, before anything is read or trained, by rank 0 (the one
 * that writes them): --save-checkpoint DIR is written into, and --save-model
 * DIR replaced, only when nothing is there or a checkpoint root is
 * (ckpt_dir_check_root); --save-model also replaces a saved model of the
 * format before (train_ckpt_is_old_model), which eval and predict say to
 * save again. The DIR.TAG folders beside --save-model DIR that a killed run
 * left are removed. 0 or -1 (message printed). */
int job__check_outputs(const train_job *j);
/* --resume, before the data is opened: the checkpoint's plan and data
 * transform into j (a raw data file is then mapped with that transform,
 * never with dictionaries rebuilt from it). 0 or -1 (message printed). */
int job__resume_open(train_job *j);
/* --resume of a processed data file, once it is open: its transform against
 * the checkpoint's (ds_transform_compare): the same, none on either side:
 * as it is; it extends the checkpoint's: j->grow; it differs: refused,
 * naming both fingerprints and the first difference. 0 or -1 (printed). */
int job__resume_mapping(train_job *j);
/* j->grow: j->plan is the checkpoint's plan with each bounded table's rows
 * raised to the data's table sizes (emb_plan_grow); a --plan given must be
 * that plan. 0 or -1 (message printed). */
int job__grown_plan(train_job *j);
/* --resume: several ranks: rank 0 restores the shards (and its dense part),
 * then the others load the dense part only, once the shards are back. */
int job__resume(train_job *j);
/* A checkpoint of the job at j->ckst under root (root/step-N; then only the
 * newest keep are kept, keep <= 0: all): --save-checkpoint's, or
 * --save-model's. Several ranks (sync mode): a barrier first, so every
 * rank's push of the step is in and the shards have applied it (the last
 * rank's push applies it inside its Push call); rank 0 then has the servers
 * write their shards and writes dense.bin, the manifest and DONE; then its
 * outcome is broadcast, which keeps every rank from the next step's lookups
 * until it is done and gives every rank its status. Only rank 0 reads
 * root. 0 or SR_E* with the reason in err (rank 0's code on every rank). */
int job__checkpoint(train_job *j, const char *root, int keep, char *err, size_t errlen);

/* The bounded tables of a job whose plan has any (train/keep.h): the
 * entries made and handed to the trainer, or refused for a store that
 * cannot remove rows. 0 or -1 (said). */
int job__keep_open(train_job *j);
/* keep_load of the checkpoint folder ckdir's KEEP_FILE (nothing to do
 * without bounded tables). 0 or -1 (said, with what). */
int job__keep_load(train_job *j, const char *ckdir, const char *what);
/* The decisions after step's push (keep_decide) applied to the store. 0 or
 * an SR_E* code with the reason in why, *lost set (every rank) when rank
 * 0's Remove failed for a lost shard server: a step to recover from. */
int job__keep_step(train_job *j, int64_t step, int *lost, char *why, size_t whylen);
/* The bounded tables' figures for a --metrics-out line into buf:
 * ',"keep":{"NAME":{"rows":R,"admitted":A,"refused":F,"expired":E,
 * "evicted":V},...}' (bounded tables only; keep_stats), or "" without any. */
#define JOB_KEEP_JSON 8192
void job__keep_json(const train_job *j, char *buf, size_t n);
/* --save-model DIR: the job's checkpoint (job__checkpoint, every rank) at
 * DIR/step-N, the same files as --save-checkpoint writes, so that eval and
 * predict read it. Written under DIR.TAG beside DIR and put in DIR's place
 * (ckpt_dir_replace): DIR is replaced when it is a checkpoint root or a
 * saved model of the format before (job__check_outputs said so at the start;
 * a folder that became anything else since is refused, and DIR.TAG removed).
 * When DIR is the --save-checkpoint folder, the final checkpoint just
 * written is the model. 0 or SR_E* with the reason in err. */
int job__save_model(train_job *j, char *err, size_t errlen);
/* Whether --save-model names the --save-checkpoint folder (its final
 * checkpoint is the model, and so full). */
int job__model_is_ckpt_root(const train_job *j);

/* job_recover.c (with job_rewind above, which puts the cursor at the
 * restored position): automatic recovery from a lost shard server
 * (rpc_remote_lost): wait for the servers, Restore every one of them from
 * the newest complete checkpoint under --save-checkpoint, load the dense
 * model and optimizer from it and seek the data to its position. why is the
 * error that started it; own: this rank's own call failed (else another
 * rank's did: several ranks). 0 (ckst holds the checkpoint's position), or
 * -1 with the reason printed. A push the lost server may have applied in
 * part does not matter: every server's rows are replaced by the
 * checkpoint's. */
int job__recover(train_job *j, const char *why, int own);

/* job_eval.c: open --metrics-out and the test buffers
 * (0 or -1, message printed); a test pass at the cursor's step: evaluate the
 * whole test split, --test-pred-out, the report line and JSON (its seconds
 * added to t_eval). The pass returns 0, -1 (failed, message printed) or 1
 * when a lookup failed (why says which; own_fail: this rank's; several
 * ranks: every rank returns 1 at the same test batch), for the job to
 * recover from as from a lost step. */
int job__eval_open(train_job *j);
/* --metrics-out of a job resumed at the cursor's step (rank 0): the file
 * (made when missing) cut back to its whole lines up to that step, up to
 * the first torn or unreadable line, and without a test line of that step
 * other than --test-freq's (the resumed job runs an epoch's last pass
 * again); then opened for appending in j->metrics. When lines are kept
 * but the step's own are not (the job stopped between its checkpoint and
 * them), j->resume_redo says which to write again (JOB_REDO_*; the line
 * only from a checkpoint that records the progress figures). What was
 * dropped is said on stdout. 0 or -1 (printed). */
int job__metrics_out_resume(train_job *j);
/* After a recovery rewound the job (rank 0, --metrics-out open): the file
 * cut back to the checkpoint's step as job__metrics_out_resume does, so the
 * replayed steps' lines are not there twice. 0 or -1 (message printed). */
int job__metrics_out_rewound(train_job *j);
/* The whole test split read once through its checks (a bin file's labels,
 * dense values and ids), so that a bad test record stops the job before
 * its first step rather than at its first test pass; then rewound. 0 or -1
 * (the record named on stderr). After job__eval_open. */
int job__test_check(train_job *j);
void job__eval_close(train_job *j);
int job__test_pass(train_job *j, char *why, size_t whylen);

/* job_metrics.c: --metrics-listen. start: the listener on PORT + this
 * rank's local rank (0, or -1 with the message printed; j->mx is then for
 * stop to free); stop: NULL-safe. The rest do nothing without it: a step
 * taken (got samples of the global batch), a progress line (its mean loss
 * and rate), a test pass, a recovery. */
int job__metrics_start(train_job *j);
/* --metrics-listen's value: HOST:PORT, HOST empty or IPv4. 0, or -1 with
 * "--metrics-listen ...: why" in err. */
int job__metrics_check(const char *addr, char *err, size_t errlen);
void job__metrics_stop(train_job *j);
void job__metrics_step(train_job *j, int got);
void job__metrics_progress(train_job *j, double loss, double samples_per_s);
void job__metrics_test(const train_job *j, double auc, double logloss);
void job__metrics_recovered(train_job *j);
/* `,"step_ms":{"dedup":x,...,"dense_opt":x}`: each phase's mean milliseconds
 * per step since the last call, for the --metrics-out line (into buf[n]). */
void job__phase_json(train_job *j, char *buf, size_t n);

#endif
