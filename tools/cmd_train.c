/* shardrec train: train a DLRM on Criteo-format data.
 *
 * Flags follow the reference DLRM (dlrm_s_pytorch.py) where it has them.
 * With no shard servers every shard of the plan is hosted in this process
 * (the embedded default). */
#include <cblas.h>
#include <cjson/cJSON.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <unistd.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rng.h"
#include "common/status.h"
#include "common/sys.h"
#include "datasets/source.h"
#include "dense/collective.h"
#include "dense/cuda_device.h"
#include "dense/cuda_hooks.h"
#include "dense/metrics.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "tools/train/checkpoint.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "tools/train/colocate.h"
#include "tools/train/model_dir.h"
#include "tools/train/trainer.h"

#define CMD "train"

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec train (--processed-data-file FILE.bin | --raw-data-file FILE.tsv[.gz]) [options]\n"
"\n"
"Data\n"
"  --processed-data-file F   binary records made by 'shardrec convert' (holds its split)\n"
"  --raw-data-file F         Criteo TSV (or .gz); Terabyte: the day_ prefix with --data-set terabyte\n"
"  --data-set kaggle|terabyte   split of raw data as the reference DLRM (default kaggle)\n"
"  --test-fraction F         raw data: the last F of the lines are the test set instead\n"
"  --max-ind-range N         categorical value %% N before the dictionary (0: off)\n"
"  --frequency-threshold N   raw data: values seen fewer than N times share one id\n"
"  --strict                  raw data: the first malformed line is fatal\n"
"Model\n"
"  --arch-sparse-feature-size N   embedding dim (16)\n"
"  --arch-embedding-size A-B-...  rows per table (default: from the data)\n"
"  --arch-mlp-bot 13-512-256-64-16   bottom MLP widths, input first\n"
"  --arch-mlp-top 512-256-1  top MLP widths after the interaction\n"
"  --arch-interaction-op dot|cat  (dot)\n"
"  --arch-interaction-itself include the diagonal in the dot interaction\n"
"  --pooling sum|mean        embedding bag pooling (sum)\n"
"  --plan PLAN.json          use this sharding plan (tables, seed, optimizers, placement)\n"
"  --plan-out FILE           where to write the plan made when --plan is absent (plan.json)\n"
"  --num-shards N            shards of a plan made here (1; all hosted in process)\n"
"  --shard-servers H:P,...   train against shard servers (one per shard of --plan, in shard order)\n"
"  --rpc-deadline S          seconds per shard-server call (30)\n"
"  --tls-ca F [--tls-cert F --tls-key F]   TLS (and mTLS) to the shard servers\n"
"  --recover-timeout S       with --save-checkpoint: when a shard server is lost (down after\n"
"                            every retry, or restarted), wait up to S seconds (60) for the\n"
"                            servers, Restore all of them from the newest checkpoint, rewind\n"
"                            the trainer to it and carry on (one rank only: with several, a\n"
"                            lost server stops the job)\n"
"Data parallelism (mpirun -np N shardrec train ...)\n"
"  Each rank takes a fixed slice of every global batch (--mini-batch-size is the global\n"
"  batch and must divide by N); the dense gradients are all-reduced every step; rank 0\n"
"  prints and writes everything. Embeddings stay on shards: --shard-servers (every rank\n"
"  reaches the same servers) or --colocate-shards.\n"
"  --colocate-shards         host the plan's shards in the ranks themselves (shard k on rank\n"
"                            k %% N), served over gRPC to every rank (--data-dir, --cache-rows,\n"
"                            --cache-mb apply to them)\n"
"  --sparse-mode sync|async  sync (default): every rank's pushes of step t are applied, summed\n"
"                            in rank order, before any lookup of t+1 (bit-reproducible);\n"
"                            async: pushes applied on arrival, the next step's lookup issued\n"
"                            while this step computes (needs shard servers or colocated shards)\n"
"  --max-staleness S         async: a lookup of step t waits until every rank's push of step\n"
"                            t-S is applied (2; >= 1)\n"
"Training\n"
"  --mini-batch-size N       (128)\n"
"  --test-mini-batch-size N  (the mini-batch size)\n"
"  --learning-rate F         (0.1)\n"
"  --sparse-learning-rate F  learning rate of the embedding rows (the --learning-rate)\n"
"  --optimizer sgd|adagrad|adam   dense optimizer (sgd)\n"
"  --sparse-optimizer sgd|adagrad|rowwise_adagrad  (as --optimizer; rowwise_adagrad for adam)\n"
"  --lr-num-warmup-steps N, --lr-decay-start-step N, --lr-num-decay-steps N\n"
"  --nepochs N               (1)\n"
"  --num-batches N           stop after N batches (0: whole epochs)\n"
"  --seed N                  model seed (123, as the reference)\n"
"  --device cpu|cuda[:N]     where the dense part runs (cpu; cuda needs a CUDA build and a GPU)\n"
"Output\n"
"  --print-freq N            progress every N steps (256)\n"
"  --test-freq N             evaluate every N steps (0: at the end of each epoch)\n"
"  --metrics-out FILE.jsonl  one JSON object per print and test interval\n"
"  --save-model DIR          save the dense model, plan and touched rows\n"
"  --oracle SUMMARY.json     the generator's summary: print the oracle's test AUC beside ours\n"
"  --test-pred-out FILE      the test split's predicted probabilities, one per line in test\n"
"                            order (%%.9g: the exact float), rewritten at every evaluation\n"
"Embedding rows and checkpoints\n"
"  --cache-rows N, --cache-mb N   keep rows in the RocksDB shard store with a hot cache of\n"
"                            N rows / N MiB (default: every row in memory, no RocksDB)\n"
"  --data-dir DIR            where the shards' RocksDB databases live (DIR/shard-K; implies\n"
"                            the shard store, cache 256 MiB unless given; default: a\n"
"                            temporary folder removed at exit)\n"
"  --save-checkpoint DIR     write DIR/step-N/ every --checkpoint-every steps and at the end\n"
"  --checkpoint-every N      steps between checkpoints (0: only at the end)\n"
"  --keep-checkpoints K      keep the newest K complete checkpoints (0: all)\n"
"  --resume DIR              continue from the newest complete checkpoint in DIR (or the\n"
"                            step-N folder named): rows, dense model, optimizer, data position\n");
}

enum {
  O_PROC = 1000, O_RAW, O_DATASET, O_TESTFRAC, O_MAXIND, O_FREQ, O_STRICT, O_DIM, O_EMBSIZE,
  O_BOT, O_TOP, O_OP, O_ITSELF, O_POOL, O_PLAN, O_PLANOUT, O_SHARDS, O_BATCH, O_TBATCH, O_LR,
  O_OPT, O_SOPT, O_SLR, O_WARM, O_DSTART, O_DSTEPS, O_EPOCHS, O_NBATCH, O_SEED, O_PRINT, O_TEST,
  O_METRICS, O_SAVE, O_ORACLE, O_SERVERS, O_RPCDL, O_TLSCA, O_TLSCERT, O_TLSKEY, O_HELP,
  O_CKPT = 1100, O_CKEVERY, O_CKKEEP, O_RESUME, O_DATADIR, O_CROWS, O_CMB,
  O_DEVICE = 1200, O_RECOVER = 1300, O_COLOCATE = 1400, O_SPMODE, O_STALE, O_PREDOUT
};

static const struct option long_opts[] = {
    {"processed-data-file", required_argument, 0, O_PROC},
    {"raw-data-file", required_argument, 0, O_RAW},
    {"data-set", required_argument, 0, O_DATASET},
    {"test-fraction", required_argument, 0, O_TESTFRAC},
    {"max-ind-range", required_argument, 0, O_MAXIND},
    {"frequency-threshold", required_argument, 0, O_FREQ},
    {"strict", no_argument, 0, O_STRICT},
    {"arch-sparse-feature-size", required_argument, 0, O_DIM},
    {"arch-embedding-size", required_argument, 0, O_EMBSIZE},
    {"arch-mlp-bot", required_argument, 0, O_BOT},
    {"arch-mlp-top", required_argument, 0, O_TOP},
    {"arch-interaction-op", required_argument, 0, O_OP},
    {"arch-interaction-itself", no_argument, 0, O_ITSELF},
    {"pooling", required_argument, 0, O_POOL},
    {"plan", required_argument, 0, O_PLAN},
    {"plan-out", required_argument, 0, O_PLANOUT},
    {"num-shards", required_argument, 0, O_SHARDS},
    {"mini-batch-size", required_argument, 0, O_BATCH},
    {"test-mini-batch-size", required_argument, 0, O_TBATCH},
    {"learning-rate", required_argument, 0, O_LR},
    {"optimizer", required_argument, 0, O_OPT},
    {"sparse-optimizer", required_argument, 0, O_SOPT},
    {"sparse-learning-rate", required_argument, 0, O_SLR},
    {"lr-num-warmup-steps", required_argument, 0, O_WARM},
    {"lr-decay-start-step", required_argument, 0, O_DSTART},
    {"lr-num-decay-steps", required_argument, 0, O_DSTEPS},
    {"nepochs", required_argument, 0, O_EPOCHS},
    {"num-batches", required_argument, 0, O_NBATCH},
    {"seed", required_argument, 0, O_SEED},
    {"print-freq", required_argument, 0, O_PRINT},
    {"test-freq", required_argument, 0, O_TEST},
    {"metrics-out", required_argument, 0, O_METRICS},
    {"save-model", required_argument, 0, O_SAVE},
    {"oracle", required_argument, 0, O_ORACLE},
    {"shard-servers", required_argument, 0, O_SERVERS},
    {"rpc-deadline", required_argument, 0, O_RPCDL},
    {"tls-ca", required_argument, 0, O_TLSCA},
    {"tls-cert", required_argument, 0, O_TLSCERT},
    {"tls-key", required_argument, 0, O_TLSKEY},
    {"help", no_argument, 0, O_HELP},
    {"save-checkpoint", required_argument, 0, O_CKPT},
    {"checkpoint-every", required_argument, 0, O_CKEVERY},
    {"keep-checkpoints", required_argument, 0, O_CKKEEP},
    {"resume", required_argument, 0, O_RESUME},
    {"data-dir", required_argument, 0, O_DATADIR},
    {"cache-rows", required_argument, 0, O_CROWS},
    {"cache-mb", required_argument, 0, O_CMB},
    {"device", required_argument, 0, O_DEVICE},
    {"recover-timeout", required_argument, 0, O_RECOVER},
    {"test-pred-out", required_argument, 0, O_PREDOUT},
    {"colocate-shards", no_argument, 0, O_COLOCATE},
    {"sparse-mode", required_argument, 0, O_SPMODE},
    {"max-staleness", required_argument, 0, O_STALE},
    {0, 0, 0, 0}};

/* This process's place in an mpirun job (rank 0 of 1 without mpirun). Rank 0
 * prints progress and metrics; the others print only errors. */
static int g_rank = 0, g_size = 1;

/* "shardrec train: <why>" on stderr; "shardrec train: rank R: <why>" in a
 * job of several ranks. */
__attribute__((format(printf, 1, 2))) static void errf(const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_size > 1)
    fprintf(stderr, "shardrec train: rank %d: %s", g_rank, msg);
  else
    fprintf(stderr, "shardrec train: %s", msg);
  fflush(stderr);
}

static dense_coll *g_coll; /* the ranks' collective (NULL: one rank) */

/* A collective call of the job; on failure the reason, and the job stops. */
static int coll_ok(int rc, const char *what) {
  if (rc) errf("%s: %s\n", what, dense_coll_errmsg(g_coll));
  return rc == 0;
}

/* Colocated shards live in tools/colocate.c; until it is linked in, these
 * resolve to NULL and --colocate-shards says so (as tools/main.c does for
 * subcommands). */
#pragma weak colocate_start
#pragma weak colocate_stop
#pragma weak colocate_addrs_free

typedef struct {
  const char *proc, *raw, *dataset, *bot, *top, *op, *plan_path, *plan_out, *metrics, *save,
      *oracle, *emb_sizes, *pooling, *opt, *sopt;
  const char *servers, *tls_ca, *tls_cert, *tls_key; /* --shard-servers and its TLS */
  double rpc_deadline, recover_timeout;
  double test_fraction;
  int have_test_fraction;
  uint64_t max_ind, seed;
  long long freq, dim, shards, batch, tbatch, epochs, nbatches, print_freq, test_freq, warm,
      dstart, dsteps;
  double lr, sparse_lr;
  int strict, itself;
  const char *ckpt, *resume, *data_dir; /* checkpoints and the shard store (tools/checkpoint.h) */
  const char *pred_out;                 /* --test-pred-out */
  long long ck_every, ck_keep, cache_rows, cache_mb;
  int colocate;       /* --colocate-shards */
  int async;          /* --sparse-mode async */
  long long staleness; /* --max-staleness (0: not given) */
} train_flags;

/* Options that open the train or test split of the data. */
static ds_source_opts source_opts(const train_flags *fl, ds_split split) {
  ds_source_opts o;
  memset(&o, 0, sizeof o);
  o.path = fl->proc ? fl->proc : fl->raw;
  o.split = split;
  o.max_ind_range = fl->max_ind;
  o.frequency_threshold = (uint32_t)fl->freq;
  o.strict = fl->strict;
  o.report = g_rank == 0 ? stderr : NULL; /* every rank reads the same data */
  if (fl->raw) {
    o.format = DS_FORMAT_AUTO;
    if (fl->have_test_fraction) {
      o.scheme = DS_SCHEME_FRACTION;
      o.test_fraction = fl->test_fraction;
    } else {
      o.scheme = !strcmp(fl->dataset, "terabyte") ? DS_SCHEME_TERABYTE : DS_SCHEME_KAGGLE;
    }
  }
  return o;
}

typedef struct {
  FILE *metrics;
  double oracle_auc, oracle_logloss;
  int have_oracle;
} outputs;

static int read_oracle(const char *path, outputs *out) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    errf("--oracle %s: cannot open\n", path);
    return -1;
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
    out->oracle_auc = auc->valuedouble;
    out->oracle_logloss = ll->valuedouble;
    out->have_oracle = 1;
  }
  cJSON_Delete(j);
  if (!ok) {
    errf("--oracle %s: no test.oracle_auc / test.oracle_logloss\n",
            path);
    return -1;
  }
  return 0;
}

/* Evaluate on the whole test split; fills m (on rank 0). 0 or -1 (message
 * printed). Several ranks: each predicts its slice of every test batch
 * (tpart, lpred its buffers) and rank 0 gathers the predictions and labels
 * in sample order, so its metrics are over the whole split. */
static int evaluate(trainer *t, ds_source *test, ds_batch *tb, ds_batch *tpart, float *lpred,
                    int tbatch, int64_t step, float *pred, float *labels, size_t cap,
                    dense_metrics *m) {
  if (ds_source_rewind(test)) {
    errf("test data: %s\n", ds_source_errmsg(test));
    return -1;
  }
  size_t n = 0;
  for (;;) {
    int got = ds_source_next(test, tb, tbatch);
    if (got < 0) {
      errf("test data: %s\n", ds_source_errmsg(test));
      return -1;
    }
    if (got == 0) break;
    if (n + (size_t)got > cap) {
      errf("test split larger than counted (%zu)\n", cap);
      return -1;
    }
    if (g_size == 1) {
      if (trainer_predict(t, tb, step, pred + n)) {
        errf("%s\n", trainer_errmsg(t));
        return -1;
      }
      memcpy(labels + n, tb->labels, (size_t)got * sizeof *labels);
    } else {
      static size_t *counts; /* [g_size], kept for the process's life */
      if (!counts && !(counts = malloc((size_t)g_size * sizeof *counts))) {
        errf("out of memory\n");
        return -1;
      }
      for (int r = 0; r < g_size; r++) counts[r] = (size_t)trainer_slice_count(got, r, g_size);
      if (trainer_batch_slice(tb, g_rank, g_size, tpart)) {
        errf("test data: out of memory for this rank's slice\n");
        return -1;
      }
      if (trainer_predict(t, tpart, step, lpred)) {
        errf("%s\n", trainer_errmsg(t));
        return -1;
      }
      int r0 = g_rank == 0;
      if (!coll_ok(dense_coll_gather(g_coll, lpred, (size_t)tpart->n, r0 ? pred + n : NULL,
                                     r0 ? counts : NULL, 0), "gather of the test predictions") ||
          !coll_ok(dense_coll_gather(g_coll, tpart->labels, (size_t)tpart->n,
                                     r0 ? labels + n : NULL, r0 ? counts : NULL, 0),
                   "gather of the test labels"))
        return -1;
    }
    n += (size_t)got;
  }
  if (g_rank != 0) return 0; /* rank 0 computes the job's metrics */
  if (n == 0) {
    errf("the test split is empty\n");
    return -1;
  }
  if (dense_metrics_compute(pred, labels, n, m)) {
    errf("metrics failed (NaN predictions?)\n");
    return -1;
  }
  return 0;
}

/* --test-pred-out: the n test predictions, "%.9g" each (round-trips a
 * float), written to a temporary name and renamed, so a reader never sees a
 * half-written file. Rank 0 only. 0 or -1 (message printed). */
static int write_preds(const char *path, const float *pred, size_t n) {
  if (!path || g_rank != 0) return 0;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) {
    errf("--test-pred-out %s: cannot open for writing\n", tmp);
    return -1;
  }
  for (size_t i = 0; i < n; i++) fprintf(f, "%.9g\n", (double)pred[i]);
  if (fclose(f) != 0 || rename(tmp, path) != 0) {
    errf("--test-pred-out %s: cannot write\n", path);
    remove(tmp);
    return -1;
  }
  return 0;
}

static void report_test(const outputs *o, int64_t step, int epoch, const dense_metrics *m) {
  if (g_rank != 0) return;
  printf("test   step %lld epoch %d: auc %.6f  logloss %.6f  accuracy %.4f  mean pred %.4f  "
         "ctr %.4f  (%zu samples)\n",
         (long long)step, epoch, m->auc, m->log_loss, m->accuracy, m->mean_pred, m->ctr, m->n);
  if (o->have_oracle)
    printf("oracle              : auc %.6f  logloss %.6f  (gap: auc %+.4f, logloss %+.4f)\n",
           o->oracle_auc, o->oracle_logloss, m->auc - o->oracle_auc,
           m->log_loss - o->oracle_logloss);
  fflush(stdout);
  if (o->metrics) {
    fprintf(o->metrics,
            "{\"kind\":\"test\",\"step\":%lld,\"epoch\":%d,\"auc\":%.17g,\"logloss\":%.17g,"
            "\"accuracy\":%.17g,\"mean_pred\":%.17g,\"ctr\":%.17g,\"n\":%zu",
            (long long)step, epoch, m->auc, m->log_loss, m->accuracy, m->mean_pred, m->ctr, m->n);
    if (o->have_oracle)
      fprintf(o->metrics, ",\"oracle_auc\":%.17g,\"oracle_logloss\":%.17g", o->oracle_auc,
              o->oracle_logloss);
    fprintf(o->metrics, "}\n");
    fflush(o->metrics);
  }
}

/* A test pass at step: evaluate, --test-pred-out, the report line. Its
 * seconds are added to *t_eval. 0 or -1 (message printed). */
static int test_pass(trainer *t, ds_source *test, ds_batch *tb, ds_batch *tpart, float *lpred,
                     int tbatch, int64_t step, int epoch, float *pred, float *labels, size_t cap,
                     const char *pred_out, const outputs *out, double *t_eval) {
  double e0 = sr_now();
  dense_metrics m;
  if (evaluate(t, test, tb, tpart, lpred, tbatch, step, pred, labels, cap, &m)) return -1;
  if (g_rank == 0) { /* m is rank 0's alone */
    if (write_preds(pred_out, pred, m.n)) return -1;
    report_test(out, step, epoch, &m);
  }
  *t_eval += sr_now() - e0;
  return 0;
}

/* Test hook (only tests set it): SHARDREC_TEST_PAUSE=PREFIX:S1,S2,... makes
 * the trainer, after step Si, create PREFIX-Si.wait and wait (120 s at most)
 * for PREFIX-Si.go, so a test can kill and restart servers at a fixed step. */
static void test_pause(int64_t step) {
  const char *e = getenv("SHARDREC_TEST_PAUSE");
  const char *colon = e ? strrchr(e, ':') : NULL;
  if (!colon) return;
  for (const char *p = colon + 1; *p;) {
    char *end;
    long long x = strtoll(p, &end, 10);
    if (end == p) return;
    if (x == step) {
      char path[4096];
      snprintf(path, sizeof path, "%.*s-%lld.wait", (int)(colon - e), e, x);
      FILE *f = fopen(path, "w");
      if (f) fclose(f);
      snprintf(path, sizeof path, "%.*s-%lld.go", (int)(colon - e), e, x);
      for (int i = 0; i < 12000; i++) {
        FILE *g = fopen(path, "r");
        if (g) {
          fclose(g);
          break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
      }
      return;
    }
    p = *end == ',' ? end + 1 : end;
  }
}

/* Automatic recovery from a lost shard server (rpc_remote_lost): wait for
 * the servers, Restore every one of them from the newest complete checkpoint
 * under --save-checkpoint, load the dense model and optimizer from it and
 * seek the data to its position. why is the error that started it. 0 (st
 * holds the checkpoint's position), or -1 with the reason printed. A push
 * the lost server may have applied in part does not matter: every server's
 * rows are replaced by the checkpoint's. */
static int recover(const train_flags *fl, const emb_plan *plan, emb_store *store, trainer *t,
                   ds_source *train, const ckpt_settings *cks, ckpt_state *st, const char *why) {
  if (!fl->servers || !rpc_remote_lost(store)) {
    errf("%s\n", why); /* not a lost server: nothing to recover from */
    return -1;
  }
  if (g_size > 1) {
    /* Rewinding N ranks and the servers' step state together is not done:
     * stop the job cleanly; --resume restarts it from the last checkpoint. */
    errf("%s\n", why);
    errf("a shard server was lost; with %d ranks the job stops (automatic recovery runs with "
         "one rank): restart it with --resume from the newest checkpoint\n", g_size);
    return -1;
  }
  char ckdir[4096], err[1024];
  if (!fl->ckpt) {
    errf("%s\nshardrec train: a shard server was lost and there is no "
                    "checkpoint to recover from (--save-checkpoint DIR --checkpoint-every N "
                    "recovers automatically)\n", why);
    return -1;
  }
  if (ckpt_resolve(fl->ckpt, ckdir, sizeof ckdir, err, sizeof err)) {
    errf("%s\nshardrec train: a shard server was lost and no complete "
                    "checkpoint is under %s yet to recover from (%s)\n", why, fl->ckpt, err);
    return -1;
  }
  errf("%s\nshardrec train: restoring every shard server from %s "
                  "(waiting up to %g s for them)\n", why, ckdir, fl->recover_timeout);
  double t0 = sr_now();
  for (;;) {
    ckpt_state got;
    if (!ckpt_load(ckdir, plan, store, "remote", trainer_model(t), trainer_dense_opt(t), cks,
                   &got, err, sizeof err)) {
      *st = got;
      break;
    }
    if (!rpc_remote_lost(store) || sr_now() - t0 > fl->recover_timeout) {
      errf("recovery from %s failed%s: %s\n", ckdir,
              rpc_remote_lost(store) ? " (--recover-timeout passed)" : "", err);
      return -1;
    }
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (ds_source_seek(train, st->sample_index)) {
    errf("recovery: cannot seek the data to sample %llu: %s\n",
            (unsigned long long)st->sample_index, ds_source_errmsg(train));
    return -1;
  }
  printf("recovered from %s after: %s\n", ckdir, why);
  fflush(stdout);
  return 0;
}

/* Test hook (only tests set it): SHARDREC_TEST_DIE=R:S makes rank R
 * raise(SIGKILL) at the start of step S, before its lookups, as a rank that
 * dies mid-job (the rank-death test). */
static void test_die(int64_t step) {
  const char *e = getenv("SHARDREC_TEST_DIE");
  int r;
  long long s;
  if (e && sscanf(e, "%d:%lld", &r, &s) == 2 && r == g_rank && s == step) raise(SIGKILL);
}

static int g_stderr_saved = -1; /* stderr while ranks > 0 keep quiet about usage */
static int g_local = 1;         /* ranks on this node */
static int g_launched;          /* started by mpirun (MPI is initialised below) */

static void stderr_restore(void) {
  if (g_stderr_saved < 0) return;
  fflush(stderr);
  dup2(g_stderr_saved, 2);
  close(g_stderr_saved);
  g_stderr_saved = -1;
}


static int train_main(int argc, char **argv);

/* A checkpoint of the job at st->step. Several ranks (sync mode): a barrier
 * first, so every rank's push of the step is in and the shards have
 * applied it (the last rank's push applies it inside its Push call); rank
 * 0 then has the servers write their shards and writes dense.bin, the
 * manifest and DONE; a second barrier keeps every rank from the next
 * step's lookups until it is done. 0 or SR_E* with the reason in err (a
 * failed collective's too). */
static int ckpt_job(const train_flags *fl, const emb_plan *plan, emb_store *store,
                    const char *store_kind, trainer *t, const ckpt_state *st,
                    const ckpt_settings *cks, char *err, size_t errlen) {
  int rc;
  if (g_size > 1 && (rc = dense_coll_barrier(g_coll))) {
    sr_fmt(err, errlen, "barrier before the checkpoint: %s", dense_coll_errmsg(g_coll));
    return rc;
  }
  if (g_rank == 0 && (rc = ckpt_save(fl->ckpt, (int)fl->ck_keep, plan, store, store_kind,
                                     trainer_model(t), trainer_dense_opt(t), st, cks, err,
                                     errlen)))
    return rc;
  if (g_size > 1 && (rc = dense_coll_barrier(g_coll))) {
    sr_fmt(err, errlen, "barrier after the checkpoint: %s", dense_coll_errmsg(g_coll));
    return rc;
  }
  return 0;
}

int cmd_train(int argc, char **argv) {
  g_launched = dense_mpi_launched(&g_rank, &g_size, &g_local);
  if (g_launched && g_rank != 0) {
    /* Rank 0 speaks for the job: the others' stdout goes nowhere, and their
     * stderr only once the flags are accepted (every rank would print the
     * same usage error). */
    fflush(stdout);
    int dn = open("/dev/null", O_WRONLY);
    if (dn >= 0) {
      dup2(dn, 1);
      g_stderr_saved = dup(2);
      dup2(dn, 2);
      close(dn);
    }
  }
  int rc = train_main(argc, argv);
  stderr_restore();
  fflush(stdout);
  /* A usage error (2) comes before MPI is up and every rank finds it alike
   * (same flags): rank 0 prints it and owns the job's exit status. The
   * others leave with 0, since mpirun ends the whole job at the first
   * non-zero exit, which could come before rank 0 has printed. */
  if (rc == 2 && g_launched && g_rank != 0 && !g_coll) return 0;
  dense_coll_destroy(g_coll);
  g_coll = NULL;
  /* A failed rank stops the whole job: the others may be waiting for it in
   * a collective or a step of the shard servers. */
  if (rc && g_size > 1) dense_mpi_abort(rc);
  dense_mpi_finalize();
  return rc;
}

static int train_main(int argc, char **argv) {
  train_flags fl = {.dataset = "kaggle", .bot = "13-512-256-64-16", .top = "512-256-1",
                    .op = "dot", .plan_out = "plan.json", .pooling = "sum", .opt = "sgd",
                    .seed = 123, .freq = 0, .dim = 16, .shards = 1, .batch = 128, .tbatch = 0,
                    .epochs = 1, .nbatches = 0, .print_freq = 256, .test_freq = 0, .lr = 0.1, .sparse_lr = -1, .recover_timeout = 60};
  const char *device = "cpu";
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case O_PROC: fl.proc = optarg; break;
      case O_RAW: fl.raw = optarg; break;
      case O_DATASET:
        if (strcmp(optarg, "kaggle") && strcmp(optarg, "terabyte")) {
          errf("--data-set: '%s' is not kaggle or terabyte\n", optarg);
          return 2;
        }
        fl.dataset = optarg;
        break;
      case O_TESTFRAC:
        if (cli_double(CMD, "--test-fraction", optarg, 0.0, 1.0, &fl.test_fraction)) return 2;
        fl.have_test_fraction = 1;
        break;
      case O_MAXIND: if (cli_u64(CMD, "--max-ind-range", optarg, &fl.max_ind)) return 2; break;
      case O_FREQ: if (cli_int(CMD, "--frequency-threshold", optarg, 0, 1LL << 31, &fl.freq)) return 2; break;
      case O_STRICT: fl.strict = 1; break;
      case O_DIM: if (cli_int(CMD, "--arch-sparse-feature-size", optarg, 1, EMB_MAX_DIM, &fl.dim)) return 2; break;
      case O_EMBSIZE: fl.emb_sizes = optarg; break;
      case O_BOT: fl.bot = optarg; break;
      case O_TOP: fl.top = optarg; break;
      case O_OP: fl.op = optarg; break;
      case O_ITSELF: fl.itself = 1; break;
      case O_POOL: fl.pooling = optarg; break;
      case O_PLAN: fl.plan_path = optarg; break;
      case O_PLANOUT: fl.plan_out = optarg; break;
      case O_SHARDS: if (cli_int(CMD, "--num-shards", optarg, 1, EMB_MAX_SHARDS, &fl.shards)) return 2; break;
      case O_BATCH: if (cli_int(CMD, "--mini-batch-size", optarg, 1, 1 << 20, &fl.batch)) return 2; break;
      case O_TBATCH: if (cli_int(CMD, "--test-mini-batch-size", optarg, 1, 1 << 20, &fl.tbatch)) return 2; break;
      case O_LR: if (cli_double(CMD, "--learning-rate", optarg, 0.0, 1e6, &fl.lr)) return 2; break;
      case O_SLR: if (cli_double(CMD, "--sparse-learning-rate", optarg, 0.0, 1e6, &fl.sparse_lr)) return 2; break;
      case O_OPT: fl.opt = optarg; break;
      case O_SOPT: fl.sopt = optarg; break;
      case O_WARM: if (cli_int(CMD, "--lr-num-warmup-steps", optarg, 0, 1LL << 40, &fl.warm)) return 2; break;
      case O_DSTART: if (cli_int(CMD, "--lr-decay-start-step", optarg, 0, 1LL << 40, &fl.dstart)) return 2; break;
      case O_DSTEPS: if (cli_int(CMD, "--lr-num-decay-steps", optarg, 0, 1LL << 40, &fl.dsteps)) return 2; break;
      case O_EPOCHS: if (cli_int(CMD, "--nepochs", optarg, 1, 1 << 20, &fl.epochs)) return 2; break;
      case O_NBATCH: if (cli_int(CMD, "--num-batches", optarg, 0, 1LL << 40, &fl.nbatches)) return 2; break;
      case O_SEED: if (cli_u64(CMD, "--seed", optarg, &fl.seed)) return 2; break;
      case O_PRINT: if (cli_int(CMD, "--print-freq", optarg, 1, 1LL << 40, &fl.print_freq)) return 2; break;
      case O_TEST: if (cli_int(CMD, "--test-freq", optarg, -1, 1LL << 40, &fl.test_freq)) return 2; break;
      case O_METRICS: fl.metrics = optarg; break;
      case O_SAVE: fl.save = optarg; break;
      case O_ORACLE: fl.oracle = optarg; break;
      case O_CKPT: fl.ckpt = optarg; break;
      case O_CKEVERY: if (cli_int(CMD, "--checkpoint-every", optarg, 0, 1LL << 40, &fl.ck_every)) return 2; break;
      case O_CKKEEP: if (cli_int(CMD, "--keep-checkpoints", optarg, 0, 1 << 20, &fl.ck_keep)) return 2; break;
      case O_RESUME: fl.resume = optarg; break;
      case O_DATADIR: fl.data_dir = optarg; break;
      case O_CROWS: if (cli_int(CMD, "--cache-rows", optarg, 1, 1LL << 31, &fl.cache_rows)) return 2; break;
      case O_CMB: if (cli_int(CMD, "--cache-mb", optarg, 1, 1LL << 30, &fl.cache_mb)) return 2; break;
      case O_SERVERS: fl.servers = optarg; break;
      case O_DEVICE: device = optarg; break;
      case O_COLOCATE: fl.colocate = 1; break;
      case O_SPMODE:
        if (strcmp(optarg, "sync") && strcmp(optarg, "async")) {
          errf("--sparse-mode: '%s' is not sync or async\n", optarg);
          return 2;
        }
        fl.async = !strcmp(optarg, "async");
        break;
      case O_STALE: if (cli_int(CMD, "--max-staleness", optarg, 1, 1 << 20, &fl.staleness)) return 2; break;
      case O_PREDOUT: fl.pred_out = optarg; break;
      case O_RECOVER: if (cli_double(CMD, "--recover-timeout", optarg, 0.0, 1e6, &fl.recover_timeout)) return 2; break;
      case O_RPCDL: if (cli_double(CMD, "--rpc-deadline", optarg, 0.001, 1e6, &fl.rpc_deadline)) return 2; break;
      case O_TLSCA: fl.tls_ca = optarg; break;
      case O_TLSCERT: fl.tls_cert = optarg; break;
      case O_TLSKEY: fl.tls_key = optarg; break;
      case 'h':
      case O_HELP: usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (optind < argc) {
    errf("unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!!fl.proc == !!fl.raw) {
    errf("give exactly one of --processed-data-file and --raw-data-file\n");
    return 2;
  }
  if (fl.proc && fl.have_test_fraction) {
    errf("--test-fraction applies to raw data; a processed file holds "
                    "the split chosen by 'shardrec convert'\n");
    return 2;
  }
  {
    const dense_backend *be;
    int gpu = 0;
    char derr[512];
    if (dense_backend_for_device(device, &be, &gpu, derr, sizeof derr)) {
      errf("%s\n", derr);
      return 2;
    }
    dense_backend_set_default(be); /* the trainer's dense model runs on it */
    if (gpu) printf("device %s (%s)\n", device, be->name);
  }
  if (fl.tbatch == 0) fl.tbatch = fl.batch;
  if (fl.sparse_lr < 0) fl.sparse_lr = fl.lr;
  if (fl.test_freq < 0) fl.test_freq = 0;

  dense_opt_kind dkind;
  emb_optim_kind skind;
  if (!strcmp(fl.opt, "sgd")) dkind = DENSE_OPT_SGD, skind = EMB_OPT_SGD;
  else if (!strcmp(fl.opt, "adagrad")) dkind = DENSE_OPT_ADAGRAD, skind = EMB_OPT_ADAGRAD;
  else if (!strcmp(fl.opt, "adam")) dkind = DENSE_OPT_ADAM, skind = EMB_OPT_ROWWISE_ADAGRAD;
  else {
    errf("--optimizer: '%s' is not sgd, adagrad or adam\n", fl.opt);
    return 2;
  }
  if (fl.sopt && emb_optim_parse(fl.sopt, &skind)) {
    errf("--sparse-optimizer: '%s' is not sgd, adagrad or rowwise_adagrad\n", fl.sopt);
    return 2;
  }
  emb_pooling pooling;
  if (emb_pooling_parse(fl.pooling, &pooling)) {
    errf("--pooling: '%s' is not sum or mean\n", fl.pooling);
    return 2;
  }
  dense_lr_sched sched = {.base_lr = fl.lr, .num_warmup_steps = fl.warm,
                          .decay_start_step = fl.dstart, .num_decay_steps = fl.dsteps};
  char err[1024];
  if (dense_lr_sched_validate(&sched, err, sizeof err)) {
    errf("%s\n", err);
    return 2;
  }
  dense_config cfg;
  if (cli_model_arch(CMD, fl.bot, fl.top, fl.op, fl.itself, (int)fl.dim, DS_NUM_SPARSE,
                            (int)(fl.batch > fl.tbatch ? fl.batch : fl.tbatch), &cfg))
    return 2;
  if (cfg.n_dense != DS_NUM_DENSE) {
    errf("--arch-mlp-bot must start with %d (the dense features), not %d\n",
            DS_NUM_DENSE, cfg.n_dense);
    return 2;
  }
  outputs out = {0};
  if (fl.oracle && read_oracle(fl.oracle, &out)) return 2;
  if (fl.staleness && !fl.async) {
    errf("--max-staleness applies to --sparse-mode async\n");
    return 2;
  }
  if (!fl.staleness) fl.staleness = 2;
  if (fl.colocate && fl.servers) {
    errf("give one of --shard-servers and --colocate-shards\n");
    return 2;
  }
  if (fl.async && !fl.servers && !fl.colocate) {
    errf("--sparse-mode async needs shard servers (--shard-servers or --colocate-shards): "
         "in-process shards apply every push at once\n");
    return 2;
  }
  if (fl.colocate && !colocate_start) {
    errf("--colocate-shards: not built into this shardrec (tools/colocate.c has not landed)\n");
    return 2;
  }
  if (g_size > 1) {
    if (fl.batch % g_size) {
      errf("--mini-batch-size %lld is the global batch and must divide by the %d ranks "
           "(%lld %% %d = %lld)\n", fl.batch, g_size, fl.batch, g_size, fl.batch % g_size);
      return 2;
    }
    if (!fl.servers && !fl.colocate) {
      errf("%d ranks need the embeddings on shards every rank reaches: --shard-servers "
           "H:P,... or --colocate-shards (in-process shards would be one copy per rank)\n",
           g_size);
      return 2;
    }
    if (fl.data_dir && !fl.colocate) {
      errf("--data-dir: with shard servers the rows live on the servers\n");
      return 2;
    }
  }
  /* The flags are good: from here every rank reports its own failures. */
  stderr_restore();
  if (g_launched) {
    if (dense_mpi_init(err, sizeof err)) {
      errf("%s\n", err);
      return 1;
    }
    g_coll = dense_coll_mpi_create(err, sizeof err);
    if (!g_coll) {
      errf("%s\n", err);
      return 1;
    }
    if (g_coll->size != g_size || g_coll->rank != g_rank) {
      errf("MPI says rank %d of %d, the environment rank %d of %d\n", g_coll->rank,
           g_coll->size, g_rank, g_size);
      return 1;
    }
    /* Ranks crowded on few cores: share the cores out rather than run
     * (cores x ranks) BLAS threads. An explicit OPENBLAS_NUM_THREADS wins. */
    if (!getenv("OPENBLAS_NUM_THREADS")) {
      long cores = sysconf(_SC_NPROCESSORS_ONLN);
      int per = (int)(cores / g_local);
      openblas_set_num_threads(per < 1 ? 1 : per);
    }
  }
  printf("ranks  %d rank(s)%s, %d on this node; %d BLAS thread(s) per rank\n", g_size,
         g_size > 1 ? " (mpirun)" : "", g_local, openblas_get_num_threads());

  int status = 1;
  ds_source *train = NULL, *test = NULL;
  emb_plan *plan = NULL;
  emb_store *store = NULL;
  trainer *t = NULL;
  ds_batch b = {0}, tb = {0};
  ds_batch part = {0}, tpart = {0}; /* this rank's slices of b and tb (several ranks) */
  ds_batch nb = {0}, npart = {0};   /* async: the next global batch and its slice */
  float *pred = NULL, *labels = NULL, *lpred = NULL;
  colocate *colo = NULL;
  char **colo_addrs = NULL;

  ds_source_opts so = source_opts(&fl, DS_SPLIT_TRAIN);
  train = ds_source_open(&so, err, sizeof err);
  if (!train) {
    errf("%s\n", err);
    goto done;
  }
  so = source_opts(&fl, DS_SPLIT_TEST);
  test = ds_source_open(&so, err, sizeof err);
  if (!test) {
    errf("%s\n", err);
    goto done;
  }
  uint64_t n_train = ds_source_count(train), n_test = ds_source_count(test);
  if (n_train == 0) {
    errf("%s: the training split is empty\n", so.path);
    goto done;
  }

  /* The plan: given, or made from the data's table sizes and the flags. */
  if (fl.plan_path) {
    if (emb_plan_load(fl.plan_path, &plan, err, sizeof err)) {
      errf("%s\n", err);
      goto done;
    }
  } else {
    uint64_t sizes[DS_NUM_SPARSE];
    if (fl.emb_sizes) {
      int n = 0;
      /* Sizes may exceed int: parse by hand. */
      const char *p = fl.emb_sizes;
      for (n = 0; n < DS_NUM_SPARSE && *p; n++) {
        char *end;
        unsigned long long x = strtoull(p, &end, 10);
        if (end == p || x == 0 || (*end && *end != '-')) break;
        sizes[n] = x;
        p = *end ? end + 1 : end;
      }
      if (n != DS_NUM_SPARSE || *p) {
        errf("--arch-embedding-size: need %d positive sizes joined by '-'\n",
                DS_NUM_SPARSE);
        goto done;
      }
    } else if (ds_source_table_sizes(train, sizes)) {
      errf("%s: no table sizes: %s\n", so.path, ds_source_errmsg(train));
      goto done;
    }
    emb_plan_params pp = {.n_tables = DS_NUM_SPARSE, .rows = sizes, .dim = (int)fl.dim,
                          .pooling = pooling, .optim = {.kind = skind, .eps = -1, .init_acc = 0},
                          .init_range = 0, .seed = fl.seed, .n_shards = (int)fl.shards};
    /* Every rank makes the same plan; rank 0 writes it. */
    if (emb_plan_create(&pp, &plan, err, sizeof err) ||
        (g_rank == 0 && emb_plan_save(plan, fl.plan_out, err, sizeof err))) {
      errf("%s\n", err);
      goto done;
    }
  }
  char mfp[EMB_FP_HEX], pfp[EMB_FP_HEX];
  emb_plan_model_fingerprint(plan, mfp);
  emb_plan_fingerprint(plan, pfp);
  uint64_t total_rows = 0;
  for (int i = 0; i < plan->n_tables; i++) total_rows += plan->tables[i].rows;
  printf("plan   %s%s: %d tables, %llu rows, dim %d, %d shard(s) %s; model %.12s plan %.12s\n",
         fl.plan_path ? fl.plan_path : fl.plan_out, fl.plan_path ? "" : " (written)",
         plan->n_tables, (unsigned long long)total_rows, plan->tables[0].dim, plan->n_shards,
         fl.servers ? "on shard servers" : fl.colocate ? "colocated with the ranks" : "in process",
         mfp, pfp);
  printf("data   %s: %llu train, %llu test samples\n", so.path, (unsigned long long)n_train,
         (unsigned long long)n_test);

  const char *store_kind = "remote";
  char job[64] = "";
  if (g_size > 1) {
    /* One job id for every rank (the servers key a step's pushes by it):
     * rank 0 draws it and broadcasts it as four 16-bit integers in floats. */
    float w[4] = {0};
    if (g_rank == 0) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t x = sr_mix64(((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^
                            ((uint64_t)ts.tv_sec << 20));
      for (int i = 0; i < 4; i++) w[i] = (float)((x >> (16 * i)) & 0xffff);
    }
    if (!coll_ok(dense_coll_broadcast(g_coll, w, 4, 0), "broadcast of the job id")) goto done;
    uint64_t x = 0;
    for (int i = 0; i < 4; i++) x |= (uint64_t)w[i] << (16 * i);
    snprintf(job, sizeof job, "job-%016llx", (unsigned long long)x);
  }
  if (fl.colocate) {
    colocate_opts co = {.host = "127.0.0.1", .data_dir = fl.data_dir,
                        .cache_rows = (uint64_t)fl.cache_rows, .cache_mb = (uint64_t)fl.cache_mb,
                        .threads = 2};
    colo = colocate_start(plan, g_rank, g_size, &co, &colo_addrs, err, sizeof err);
    if (!colo) {
      errf("--colocate-shards: %s\n", err);
      goto done;
    }
  }
  if (fl.servers || fl.colocate) {
    /* One address per shard of the plan, in shard order. */
    char *list = fl.servers ? strdup(fl.servers) : NULL;
    const char **addr = malloc(((list ? strlen(list) / 2 : 0) + (size_t)plan->n_shards + 1) *
                               sizeof *addr);
    int n_addr = 0;
    if (fl.colocate && addr)
      for (int k = 0; k < plan->n_shards; k++) addr[n_addr++] = colo_addrs[k];
    for (char *tok = addr && list ? strtok(list, ",") : NULL; tok; tok = strtok(NULL, ","))
      addr[n_addr++] = tok;
    rpc_tls tls = {.cert = fl.tls_cert, .key = fl.tls_key, .ca = fl.tls_ca};
    rpc_client_opts ro = {.deadline_s = fl.rpc_deadline,
                          .tls = fl.tls_ca && !fl.colocate ? &tls : NULL,
                          .job_id = job[0] ? job : NULL,
                          .rank = g_rank,
                          .world_size = g_size,
                          .max_staleness = fl.async ? (int)fl.staleness : 0};
    if (addr && (list || !fl.servers))
      store = emb_store_create_remote(plan, addr, n_addr, &ro, err, sizeof err);
    else snprintf(err, sizeof err, "out of memory");
    if (store && fl.servers)
      printf("shards %d shard server(s): %s\n", n_addr, fl.servers);
    else if (store)
      printf("shards %d shard(s) colocated with %d rank(s): %s%s\n", n_addr, g_size,
             n_addr ? addr[0] : "", n_addr > 1 ? ", ..." : "");
    free(addr);
    free(list);
    if (store)
      printf("mode   %s sparse updates%s\n", fl.async ? "async" : "sync",
             fl.async ? "" : " (every rank's pushes of a step applied before the next lookups)");
    if (store && fl.async)
      printf("mode   max staleness %lld step(s); lookups prefetched one step ahead\n",
             fl.staleness);
  } else {
    store = train_store_create(plan, fl.data_dir, (uint64_t)fl.cache_rows, (uint64_t)fl.cache_mb,
                               fl.resume != NULL, &store_kind, err, sizeof err);
  }
  if (!store) {
    errf("%s\n", err);
    goto done;
  }
  dense_opt_config ocfg = dense_opt_defaults(dkind);
  t = trainer_create(plan, store, &cfg, &ocfg, plan->seed, err, sizeof err);
  if (!t) {
    errf("%s\n", err);
    goto done;
  }
  trainer_set_coll(t, g_size > 1 ? g_coll : NULL);
  if (ds_batch_init(&b, (int)fl.batch) || ds_batch_init(&tb, (int)fl.tbatch) ||
      (g_size > 1 && (ds_batch_init(&part, (int)(fl.batch / g_size) + 1) ||
                      ds_batch_init(&tpart, (int)(fl.tbatch / g_size) + 1) ||
                      !(lpred = malloc(((size_t)fl.tbatch / (size_t)g_size + 1) * sizeof *lpred))))) {
    errf("out of memory for batches\n");
    goto done;
  }
  if (fl.async && (ds_batch_init(&nb, (int)fl.batch) ||
                   (g_size > 1 && ds_batch_init(&npart, (int)(fl.batch / g_size) + 1)))) {
    errf("out of memory for batches\n");
    goto done;
  }
  if (n_test) {
    pred = malloc(n_test * sizeof *pred);
    labels = malloc(n_test * sizeof *labels);
    if (!pred || !labels) {
      errf("out of memory for %llu test predictions\n",
              (unsigned long long)n_test);
      goto done;
    }
  }
  if (fl.metrics && g_rank == 0) {
    out.metrics = fopen(fl.metrics, "w");
    if (!out.metrics) {
      errf("--metrics-out %s: cannot open for writing\n", fl.metrics);
      goto done;
    }
  }
  {
    printf("model  bottom %s, top %s, %s interaction; %zu dense parameters; %s (dense) / %s (sparse), lr %g / %g\n",
           fl.bot, fl.top, fl.op, dense_config_param_count(&cfg), fl.opt,
           emb_optim_name(plan->tables[0].optim.kind), fl.lr, fl.sparse_lr);
    fflush(stdout);
    int tty = cli_isatty_err() && g_rank == 0;
    uint64_t steps_per_epoch = (n_train + (uint64_t)fl.batch - 1) / (uint64_t)fl.batch;
    uint64_t total_steps = steps_per_epoch * (uint64_t)fl.epochs;
    if (fl.nbatches > 0 && (uint64_t)fl.nbatches < total_steps) total_steps = (uint64_t)fl.nbatches;
    int64_t step = 0;
    ckpt_settings cks = {fl.opt, emb_optim_name(plan->tables[0].optim.kind), fl.lr, fl.sparse_lr,
                         fl.warm, fl.dstart, fl.dsteps, fl.batch};
    ckpt_state ckst = {0, 0, 0};
    if (fl.resume) {
      /* Several ranks: rank 0 restores the shards (and its dense part), then
       * the others load the dense part only, once the shards are back. */
      char ckdir[4096];
      int rc = ckpt_resolve(fl.resume, ckdir, sizeof ckdir, err, sizeof err);
      if (!rc && g_rank == 0)
        rc = ckpt_load(ckdir, plan, store, store_kind, trainer_model(t), trainer_dense_opt(t),
                       &cks, &ckst, err, sizeof err);
      if (rc) {
        errf("--resume: %s\n", err);
        goto done;
      }
      if (g_size > 1 && !coll_ok(dense_coll_barrier(g_coll), "barrier after the restore"))
        goto done;
      if (g_rank != 0 &&
          (rc = ckpt_load(ckdir, plan, NULL, store_kind, trainer_model(t), trainer_dense_opt(t),
                          &cks, &ckst, err, sizeof err))) {
        errf("--resume: %s\n", err);
        goto done;
      }
      if (ds_source_seek(train, ckst.sample_index)) {
        errf("--resume: cannot seek the data to sample %llu: %s\n",
             (unsigned long long)ckst.sample_index, ds_source_errmsg(train));
        goto done;
      }
      step = ckst.step;
      printf("resume %s: step %lld, epoch %d, sample %llu\n", ckdir, (long long)step, ckst.epoch,
             (unsigned long long)ckst.sample_index);
    }
    double t_start = sr_now(), t_last = t_start, loss_sum = 0, t_eval = 0;
    int64_t loss_n = 0, samples_since = 0, samples_done = 0;
    int have_next = 0, next_got = 0; /* async: the next batch is in nb (and npart) */
    int stop = 0;
    const int start_epoch = ckst.epoch;
    for (int epoch = start_epoch; epoch < fl.epochs && !stop; epoch++) {
      if (epoch > start_epoch && ds_source_rewind(train)) {
        errf("%s\n", ds_source_errmsg(train));
        goto done;
      }
      int64_t epoch_step = 0;
      for (;;) {
        if ((uint64_t)step >= total_steps) {
          stop = 1;
          break;
        }
        int got;
        if (have_next) {
          /* Async: this step's batch was read (and its rows asked for)
           * during the last step. */
          ds_batch x = b;
          b = nb, nb = x;
          x = part, part = npart, npart = x;
          got = next_got;
          have_next = 0;
        } else {
          got = ds_source_next(train, &b, (int)fl.batch);
          if (got < 0) {
            errf("%s\n", ds_source_errmsg(train));
            goto done;
          }
          if (got == 0) break;
          /* Every rank read the same global batch; each trains on its slice. */
          if (g_size > 1 && trainer_batch_slice(&b, g_rank, g_size, &part)) {
            errf("step %lld: out of memory for this rank's slice\n", (long long)step);
            goto done;
          }
        }
        const ds_batch *mine = g_size > 1 ? &part : &b;
        /* The schedule scales both rates alike. */
        float lr = dense_lr_at(&sched, step), loss = 0;
        float slr = fl.lr > 0 ? (float)((double)lr * (fl.sparse_lr / fl.lr)) : (float)fl.sparse_lr;
        test_die(step);
        if (fl.async && (uint64_t)step + 1 < total_steps) {
          /* Read the next batch now: the step below sends its lookup out
           * while it computes (trainer_prefetch). */
          next_got = ds_source_next(train, &nb, (int)fl.batch);
          if (next_got < 0) {
            errf("%s\n", ds_source_errmsg(train));
            goto done;
          }
          if (next_got > 0) {
            if (g_size > 1 && trainer_batch_slice(&nb, g_rank, g_size, &npart)) {
              errf("step %lld: out of memory for this rank's slice\n", (long long)step + 1);
              goto done;
            }
            if (trainer_prefetch(t, g_size > 1 ? &npart : &nb, step + 1)) {
              errf("%s\n", trainer_errmsg(t));
              goto done;
            }
            have_next = 1;
          }
        }
        if (trainer_step_part(t, mine, got, step, lr, slr, &loss)) {
          char why[1300];
          snprintf(why, sizeof why, "step %lld: %s", (long long)step, trainer_errmsg(t));
          if (recover(&fl, plan, store, t, train, &cks, &ckst, why)) goto done;
          goto rewound;
        }
        if (!isfinite(loss)) {
          errf("step %lld: the loss is %g; lower --learning-rate\n",
                  (long long)step, loss);
          goto done;
        }
        step++;
        epoch_step++;
        train_mem_sample();
        ckst = (ckpt_state){step, epoch, b.first_index + (uint64_t)got};
        if (fl.ckpt && fl.ck_every > 0 && step % fl.ck_every == 0 &&
            ckpt_job(&fl, plan, store, store_kind, t, &ckst, &cks, err, sizeof err)) {
          char why[1300];
          snprintf(why, sizeof why, "--save-checkpoint: %s", err);
          if (recover(&fl, plan, store, t, train, &cks, &ckst, why)) goto done;
          goto rewound;
        }
        test_pause(step);
        loss_sum += loss;
        loss_n++;
        samples_since += got;
        samples_done += got;
        if (step % fl.print_freq == 0 || (uint64_t)step == total_steps) {
          double tnow = sr_now();
          double rate = samples_since / (tnow - t_last);
          double frac = (double)epoch_step / (double)steps_per_epoch;
          double eta = (double)(total_steps - (uint64_t)step) * fl.batch / (rate > 0 ? rate : 1);
          double mean = loss_sum / (double)loss_n;
          if (tty)
            fprintf(stderr, "\rstep %lld/%llu  epoch %d %5.1f%%  %8.0f samples/s  loss %.6f  ETA %4.0fs ",
                    (long long)step, (unsigned long long)total_steps, epoch, 100 * frac, rate,
                    mean, eta);
          else
            printf("train  step %lld/%llu epoch %d %.1f%%: loss %.6f  %.0f samples/s  ETA %.0fs\n",
                   (long long)step, (unsigned long long)total_steps, epoch, 100 * frac, mean,
                   rate, eta);
          if (out.metrics)
            fprintf(out.metrics,
                    "{\"kind\":\"train\",\"step\":%lld,\"epoch\":%d,\"loss\":%.9g,\"last_loss\":%.9g,"
                    "\"lr\":%.9g,\"samples_per_s\":%.1f}\n",
                    (long long)step, epoch, mean, loss, lr, rate);
          fflush(stdout);
          loss_sum = 0;
          loss_n = 0;
          samples_since = 0;
          t_last = sr_now();
        }
        if (fl.test_freq > 0 && step % fl.test_freq == 0 && n_test) {
          if (tty) fprintf(stderr, "\n");
          if (test_pass(t, test, &tb, &tpart, lpred, (int)fl.tbatch, step, epoch, pred, labels,
                        n_test, fl.pred_out, &out, &t_eval))
            goto done;
          t_last = sr_now();
        }
        continue;
      rewound: /* recovered: carry on from the checkpoint's step and data position */
        have_next = 0;
        step = ckst.step;
        epoch = ckst.epoch;
        epoch_step = (int64_t)((ckst.sample_index + (uint64_t)fl.batch - 1) / (uint64_t)fl.batch);
        loss_sum = 0;
        loss_n = 0;
        samples_since = 0;
        t_last = sr_now();
      }
      if (tty) fprintf(stderr, "\n");
      if (n_test && (fl.test_freq == 0 || step % fl.test_freq != 0)) {
        if (test_pass(t, test, &tb, &tpart, lpred, (int)fl.tbatch, step, epoch, pred, labels,
                      n_test, fl.pred_out, &out, &t_eval))
          goto done;
      }
    }
    double secs = sr_now() - t_start;
    const trainer_times *tt = trainer_times_get(t);
    printf("done   %lld steps in %.1f s; per step: dedup %.2f ms, lookup %.2f, pool %.2f, "
           "forward %.2f, backward %.2f, scatter %.2f, push %.2f, dense opt %.2f\n",
           (long long)step, secs, 1e3 * tt->dedup / (double)(tt->steps ? tt->steps : 1),
           1e3 * tt->lookup / (double)(tt->steps ? tt->steps : 1),
           1e3 * tt->pool / (double)(tt->steps ? tt->steps : 1),
           1e3 * tt->forward / (double)(tt->steps ? tt->steps : 1),
           1e3 * tt->backward / (double)(tt->steps ? tt->steps : 1),
           1e3 * tt->scatter / (double)(tt->steps ? tt->steps : 1),
           1e3 * tt->push / (double)(tt->steps ? tt->steps : 1),
           1e3 * tt->dense_opt / (double)(tt->steps ? tt->steps : 1));
    {
      /* Samples per second of training (test passes left out), and where a
       * step's time went: bench dp reads this line. */
      double ts = secs - t_eval, ns = (double)(tt->steps ? tt->steps : 1);
      printf("rate   %.1f samples/s over %d rank(s); per step: dense compute %.3f ms, "
             "allreduce %.3f ms\n",
             ts > 0 ? (double)samples_done / ts : 0.0, g_size,
             1e3 * (tt->forward + tt->backward + tt->dense_opt) / ns, 1e3 * tt->allreduce / ns);
    }
    if (fl.ckpt) {
      if (ckpt_job(&fl, plan, store, store_kind, t, &ckst, &cks, err, sizeof err)) {
        errf("--save-checkpoint: %s\n", err);
        goto done;
      }
      printf("ckpt   %s/step-%lld\n", fl.ckpt, (long long)ckst.step);
    }
    printf("memory peak RssAnon %.1f MB (%s store)\n", (double)train_mem_sample() / 1024.0, store_kind);
    ds_source_stats st;
    if (!ds_source_stats_get(train, &st) && (st.malformed || st.scan_malformed))
      printf("data   %llu malformed lines skipped\n",
             (unsigned long long)(st.malformed > st.scan_malformed ? st.malformed : st.scan_malformed));
  }
  if (fl.save && g_rank == 0) {
    if (model_dir_save(fl.save, &cfg, plan, trainer_model(t), store, err, sizeof err)) {
      errf("--save-model: %s\n", err);
      goto done;
    }
    printf("saved  %s\n", fl.save);
  }
  status = 0;
done:
  if (out.metrics) fclose(out.metrics);
  free(pred);
  free(labels);
  free(lpred);
  ds_batch_free(&b);
  ds_batch_free(&tb);
  ds_batch_free(&part);
  ds_batch_free(&tpart);
  ds_batch_free(&nb);
  ds_batch_free(&npart);
  trainer_destroy(t);
  emb_store_destroy(store);
  if (colo) {
    /* Every rank's last call is in before any rank's servers go. */
    if (status == 0 && g_coll) coll_ok(dense_coll_barrier(g_coll), "final barrier");
    colocate_stop(colo);
  }
  if (colo_addrs) colocate_addrs_free(colo_addrs, plan ? plan->n_shards : 0);
  emb_plan_free(plan);
  ds_source_destroy(train);
  ds_source_destroy(test);
  return status;
}
