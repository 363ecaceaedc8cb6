/* Scoring with a trainer checkpoint: see score.h. */
#include "score/score.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/num.h"
#include "common/outfile.h"
#include "common/progress.h"
#include "common/status.h"
#include "common/sys.h"
#include "dense/state_file.h"
#include "embedding/ckpt_store.h"
#include "rpc/client.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

/* One run: what it opened (owned, released by run_free) and how far it got. */
typedef struct run {
  const score_opts *o;
  score_result *res;
  char *err;
  size_t errlen;
  char step_dir[SR_PATH_MAX];
  train_ckpt_info ci;
  ds_transform *xf;    /* the checkpoint's data transform (owned); NULL: it records none */
  emb_ckpt_store cs;       /* in process: the checkpoint's store (cs.store) */
  emb_store *store;    /* the rows: cs.store, or the remote store (owned) */
  trainer *t;
  ds_source_opts so;
  ds_source *src;
  ds_batch b;
  int batch;
  uint64_t n_all;      /* samples in the split */
  float *pred, *labels; /* [n_all] */
  uint64_t *bad;       /* [n_bad] split-relative malformed raw lines, ascending */
  size_t n_bad;
  int labelled;        /* the data's labels are real: metrics */
  sr_outfile *out;     /* the predictions under their temporary name (owned), or NULL */
  double t0;
} run;

/* The checkpoint, verified, with a dense architecture in its manifest. */
static int open_checkpoint(run *r) {
  char why[1024];
  const char *path = r->o->checkpoint;
  int rc = train_ckpt_resolve(path, r->step_dir, sizeof r->step_dir, why, sizeof why);
  if (rc && train_ckpt_is_old_model(path)) {
    snprintf(r->err, r->errlen, "--checkpoint: %s: a model folder written by an older shardrec "
             "(model.json, plan.json, dense.bin, rows/), a format this one no longer reads: "
             "save the model again by training with --save-model %s", path, path);
    return SR_EVERSION;
  }
  if (!rc) rc = train_ckpt_open(r->step_dir, &r->ci, why, sizeof why);
  if (rc) {
    snprintf(r->err, r->errlen, "--checkpoint: %s", why);
    return rc;
  }
  if (!r->ci.has_dense) {
    snprintf(r->err, r->errlen, "%s/manifest.json records no dense architecture (written "
             "by an older shardrec): its dense model cannot be rebuilt; train again with "
             "--save-checkpoint or --save-model", r->step_dir);
    return SR_EVERSION;
  }
  r->batch = r->o->batch ? r->o->batch : (int)r->ci.batch;
  return 0;
}

/* The store over shard servers: one per shard of the plan, in shard order. */
static int open_remote(run *r) {
  const score_opts *o = r->o;
  const emb_plan *plan = r->ci.plan;
  char *list = strdup(o->shard_servers);
  const char **addr = malloc((strlen(o->shard_servers) / 2 + 2) * sizeof *addr);
  int n_addr = 0, rc = 0;
  if (!list || !addr) {
    snprintf(r->err, r->errlen, "out of memory");
    rc = SR_ENOMEM;
    goto out;
  }
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) addr[n_addr++] = tok;
  if (n_addr != plan->n_shards) {
    snprintf(r->err, r->errlen, "--shard-servers: %d address(es), the checkpoint's plan has "
             "%d shard(s) (one server per shard, in shard order)", n_addr, plan->n_shards);
    if (r->res) r->res->bad_usage = 1;
    rc = SR_EINVAL;
    goto out;
  }
  rpc_tls tls = {.cert = o->tls_cert, .key = o->tls_key, .ca = o->tls_ca};
  rpc_client_opts ro = {.deadline_s = o->rpc_deadline > 0 ? o->rpc_deadline : 30,
                        .tls = o->tls_ca ? &tls : NULL};
  char why[1024];
  r->store = emb_store_create_remote(plan, addr, n_addr, &ro, why, sizeof why);
  if (!r->store) {
    snprintf(r->err, r->errlen, "--shard-servers: %s", why);
    rc = SR_EUNAVAILABLE;
  }
out:
  free(list);
  free(addr);
  return rc;
}

/* The rows (on the servers, or from the checkpoint in this process) and the
 * dense model as trained: its architecture and parameters. */
static int open_model(run *r) {
  const score_opts *o = r->o;
  const emb_plan *plan = r->ci.plan;
  char fp[EMB_FP_HEX];
  emb_plan_fingerprint(plan, fp);
  int rc;
  if (o->shard_servers) {
    if ((rc = open_remote(r))) return rc;
  } else {
    emb_ckpt_store_opts co = {.cache_mb = o->cache_mb};
    char why[1024];
    if ((rc = emb_ckpt_store_open(r->step_dir, plan, &co, &r->cs, why, sizeof why))) {
      snprintf(r->err, r->errlen, "--checkpoint: %s", why);
      return rc;
    }
    r->store = r->cs.store;
  }
  if (o->log)
    fprintf(o->log, "checkpoint %s: step %lld, plan %.12s, %d shard(s) %s%s\n", r->step_dir,
            (long long)r->ci.st.step, fp, plan->n_shards,
            o->shard_servers ? "on shard servers: " : "in process, ",
            o->shard_servers ? o->shard_servers : r->cs.layout);
  dense_config cfg = r->ci.dense;
  cfg.max_batch = r->batch;
  /* The optimizer never runs here: SGD keeps no state. */
  dense_opt_config oc = dense_opt_defaults(DENSE_OPT_SGD);
  r->t = trainer_create(plan, r->store, &cfg, &oc, plan->seed, r->err, r->errlen);
  if (!r->t) return SR_EINVAL;
  /* The parameters only: the optimizer state after them is not needed to
   * score. train_ckpt_open has checked every file against the manifest. */
  char path[SR_PATH_MAX];
  if ((rc = sr_path_err(path, sizeof path, r->err, r->errlen, "%s/dense.bin", r->step_dir)))
    return rc;
  return dense_state_load(path, trainer_model(r->t), NULL, r->err, r->errlen);
}

/* The checkpoint's data transform (r->xf; NULL when it records none, as
 * a checkpoint written before models carried their mapping or trained on
 * ids mapped outside shardrec). Raw rows are mapped with it and nothing
 * else, so without one they are refused; its tables must fit the plan's. */
static int load_transform(run *r) {
  const score_opts *o = r->o;
  const emb_plan *plan = r->ci.plan;
  char why[1024];
  int rc = train_ckpt_transform(&r->ci, &r->xf, why, sizeof why);
  if (rc == SR_ENOTFOUND) {
    if (!o->raw) return 0; /* a converted file is scored as its ids say */
    sr_fmt(r->err, r->errlen, "--raw-data-file %s: %s: its raw-row mapping cannot be proven; "
             "score a file converted with its own dictionaries (--processed-data-file), or "
             "save the model again with this shardrec", o->data_path, why);
    return SR_EMISMATCH;
  }
  if (rc) {
    sr_fmt(r->err, r->errlen, "--checkpoint: %s", why);
    return rc;
  }
  if (plan->n_tables != DS_NUM_SPARSE) {
    sr_fmt(r->err, r->errlen, "the checkpoint's plan has %d tables, Criteo data %d",
             plan->n_tables, DS_NUM_SPARSE);
    return SR_EMISMATCH;
  }
  /* Bounded tables: the transform's ids must have rows (a plan may have
   * more, --arch-embedding-size; hashed ids are unbounded: 0). */
  uint64_t sizes[DS_NUM_SPARSE];
  ds_transform_table_sizes(r->xf, sizes);
  for (int i = 0; i < DS_NUM_SPARSE; i++)
    if (sizes[i] > plan->tables[i].rows) {
      sr_fmt(r->err, r->errlen, "%s: its data transform gives table %d (%s) %llu ids, its "
               "plan %llu rows: the transform and the plan do not belong together",
               r->step_dir, i, plan->tables[i].name, (unsigned long long)sizes[i],
               (unsigned long long)plan->tables[i].rows);
      return SR_EMISMATCH;
    }
  return 0;
}

/* A converted file: its ids must be mapped by the checkpoint's transform
 * (the same fingerprint), else nothing is scored. A checkpoint without a
 * transform scores any converted file as its ids say. */
static int check_file_transform(run *r) {
  const char *path = r->o->data_path;
  const ds_transform *fx = ds_source_transform(r->src);
  if (!r->xf) return 0;
  const char *mfp = r->ci.transform_fp; /* the model's, proven by the checkpoint's file list */
  char ffp[SR_SHA256_HEX], why[512] = "";
  if (!fx) {
    sr_fmt(r->err, r->errlen, "--processed-data-file %s: its ids were mapped outside "
             "shardrec (raw ids, no data transform) and the model records one: convert the raw "
             "file with --mapping-from %s", path, r->step_dir);
    return SR_EMISMATCH;
  }
  if (ds_transform_fingerprint(fx, ffp)) {
    sr_fmt(r->err, r->errlen, "%s: cannot fingerprint the data transform", path);
    return SR_EBACKEND;
  }
  if (!strcmp(mfp, ffp)) return 0;
  ds_xform_relation rel = ds_transform_compare(r->xf, fx, why, sizeof why);
  sr_fmt(r->err, r->errlen, "--processed-data-file %s: mapping %.12s %s the model's %.12s "
           "(%s): convert the raw file with --mapping-from %s", path, ffp,
           rel == DS_XFORM_EXTENDS ? "extends (new ids without rows in)" : "differs from",
           mfp, why[0] ? why : "other canonical bytes", r->step_dir);
  return SR_EMISMATCH;
}

/* The data, opened as train opens it, and the room for its predictions. */
static int open_data(run *r) {
  const score_opts *o = r->o;
  r->so = (ds_source_opts){.path = o->data_path, .split = o->split,
                           .no_label = o->no_label, .strict = o->strict, .report = o->report,
                           .format = o->raw ? DS_FORMAT_RAW : DS_FORMAT_PROCESSED};
  if (o->raw) {
    r->so.scheme = o->terabyte ? DS_SCHEME_TERABYTE
                   : o->have_test_fraction ? DS_SCHEME_FRACTION : DS_SCHEME_KAGGLE;
    r->so.test_fraction = o->test_fraction;
    r->so.transform = r->xf; /* load_transform refused raw rows without one */
  }
  r->t0 = sr_now();
  r->src = ds_source_open(&r->so, r->err, r->errlen);
  if (!r->src) return SR_EIO;
  int rc;
  if (!o->raw && (rc = check_file_transform(r))) return rc;
  r->labelled = ds_source_labelled(r->src);
  if (!r->labelled && !o->no_label && (!o->out || o->metrics_out)) {
    snprintf(r->err, r->errlen, "%s: converted from rows without labels (convert --no-label): "
             "%s", o->data_path, o->out ? "--metrics-out needs labels" : "no labels to evaluate "
             "against (predict scores it)");
    return SR_EINVAL;
  }
  if (o->raw && o->out && (rc = ds_source_bad_lines(r->src, &r->bad, &r->n_bad, r->err, r->errlen)))
    return rc;
  r->n_all = ds_source_count(r->src);
  r->pred = malloc((r->n_all ? r->n_all : 1) * sizeof *r->pred);
  r->labels = malloc((r->n_all ? r->n_all : 1) * sizeof *r->labels);
  if (!r->pred || !r->labels || ds_batch_init(&r->b, r->batch)) {
    snprintf(r->err, r->errlen, "out of memory for %llu predictions",
             (unsigned long long)r->n_all);
    return SR_ENOMEM;
  }
  return 0;
}

/* Every batch of the split through the model, one output line per input
 * line (nan where the reader skipped a malformed one), into the temporary
 * file (r->out NULL: none); *n gets the samples scored. */
static int score_all(run *r, size_t *n) {
  size_t bi = 0;
  uint64_t line = 0; /* split-relative input line of the next output line */
  *n = 0;
  sr_progress pg;
  sr_progress_begin(&pg, r->o->progress, "predict", "samples", r->n_all);
  for (;;) {
    sr_progress_set(&pg, *n, 0);
    int got = ds_source_next(r->src, &r->b, r->batch);
    if (got < 0) {
      snprintf(r->err, r->errlen, "%s", ds_source_errmsg(r->src));
      return got;
    }
    if (got == 0) break;
    if (*n + (size_t)got > r->n_all) {
      snprintf(r->err, r->errlen, "%s: more samples than counted (%llu)", r->so.path,
               (unsigned long long)r->n_all);
      return SR_EFORMAT;
    }
    int rc = trainer_predict(r->t, &r->b, r->ci.st.step, r->pred + *n);
    if (rc) {
      snprintf(r->err, r->errlen, "%s", trainer_errmsg(r->t));
      return rc;
    }
    memcpy(r->labels + *n, r->b.labels, (size_t)got * sizeof *r->labels);
    for (int i = 0; r->out && i < got; i++, line++) {
      for (; bi < r->n_bad && r->bad[bi] == line; bi++, line++) sr_out_write(r->out, "nan\n", 4);
      if (sr_out_printf(r->out, "%.9g\n", r->pred[*n + (size_t)i])) {
        snprintf(r->err, r->errlen, "--out %s", sr_out_errmsg(r->out));
        return SR_EIO;
      }
    }
    *n += (size_t)got;
  }
  sr_progress_set(&pg, *n, 0);
  sr_progress_end(&pg);
  for (; r->out && bi < r->n_bad; bi++, line++) {
    if (r->bad[bi] != line) break;
    sr_out_write(r->out, "nan\n", 4); /* an error is kept for the commit */
  }
  if (bi != r->n_bad) {
    /* The reader and the scan disagree on which lines are malformed. */
    snprintf(r->err, r->errlen, "%s: %zu samples and %zu malformed lines do not add up to "
             "the lines read; output not written", r->so.path, *n, r->n_bad);
    return SR_EFORMAT;
  }
  return 0;
}

/* The predictions, written under a temporary name and renamed into place
 * (o->out NULL: scored, not written). */
static int write_predictions(run *r, size_t *n) {
  const score_opts *o = r->o;
  if (!o->out) return score_all(r, n);
  char why[1024];
  int rc = sr_out_open(o->out, &r->out, why, sizeof why);
  if (rc) {
    snprintf(r->err, r->errlen, "--out %s", why); /* nothing opened, nothing to remove */
    return rc;
  }
  rc = score_all(r, n);
  if (rc) return rc; /* run_free removes the temporary */
  sr_outfile *out = r->out;
  r->out = NULL;
  if ((rc = sr_out_commit(out, why, sizeof why))) snprintf(r->err, r->errlen, "--out %s", why);
  return rc;
}

/* Labelled input: the metrics of the n predictions, printed and written to
 * o->metrics_out. */
static int write_metrics(run *r, size_t n) {
  const score_opts *o = r->o;
  const char *split = o->split_name ? o->split_name : "all";
  dense_metrics m;
  if (n == 0) {
    snprintf(r->err, r->errlen, "%s: the %s split is empty: no metrics", r->so.path, split);
    return SR_EINVAL;
  }
  if (dense_metrics_compute(r->pred, r->labels, n, &m)) {
    snprintf(r->err, r->errlen, "metrics failed (NaN predictions?)");
    return SR_EINVAL;
  }
  if (r->res) r->res->m = m;
  if (o->log)
    fprintf(o->log, "metrics auc %.6f  logloss %.6f  accuracy %.4f  mean pred %.4f  ctr %.4f  "
            "(%zu samples)\n", m.auc, m.log_loss, m.accuracy, m.mean_pred, m.ctr, n);
  if (!o->metrics_out) return 0;
  sr_outfile *mf;
  char why[1024];
  int rc = sr_out_open(o->metrics_out, &mf, why, sizeof why);
  if (!rc) {
    char v[5][SR_JNUM_MAX]; /* a one-class split's AUC is NaN: null */
    sr_out_printf(mf, "{\"kind\":\"predict\",\"n\":%zu,\"auc\":%s,\"logloss\":%s,"
                  "\"accuracy\":%s,\"mean_pred\":%s,\"ctr\":%s}\n", n, sr_jnum(v[0], m.auc, 17),
                  sr_jnum(v[1], m.log_loss, 17), sr_jnum(v[2], m.accuracy, 17),
                  sr_jnum(v[3], m.mean_pred, 17), sr_jnum(v[4], m.ctr, 17));
    rc = sr_out_commit(mf, why, sizeof why); /* a write error is kept until here */
  }
  if (rc) snprintf(r->err, r->errlen, "--metrics-out %s", why);
  return rc;
}

static void run_free(run *r) {
  sr_out_abort(r->out);
  free(r->pred);
  free(r->labels);
  free(r->bad);
  ds_batch_free(&r->b);
  ds_source_destroy(r->src);
  trainer_destroy(r->t);
  if (r->cs.store) emb_ckpt_store_close(&r->cs);
  else emb_store_destroy(r->store);
  train_ckpt_info_free(&r->ci);
  ds_transform_free(r->xf);
}

int score_split_parse(const char *name, ds_split *sp) {
  static const struct { const char *name; ds_split sp; } names[] = {
      {"all", DS_SPLIT_ALL}, {"train", DS_SPLIT_TRAIN}, {"test", DS_SPLIT_TEST},
      {"val", DS_SPLIT_VAL}};
  for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i].name)) {
      *sp = names[i].sp;
      return 0;
    }
  return -1;
}

int score_run(const score_opts *o, score_result *res, char *err, size_t errlen) {
  if (res) memset(res, 0, sizeof *res);
  if (!o || !o->checkpoint || !o->data_path) {
    snprintf(err, errlen, "predict: need a checkpoint and a data file");
    return SR_EINVAL;
  }
  if (o->raw && o->terabyte && o->out) {
    snprintf(err, errlen, "--out: the predictions of the terabyte day files are not written "
             "(score one file, split by --data-set kaggle or --test-fraction)");
    return SR_EINVAL;
  }
  run *r = calloc(1, sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return SR_ENOMEM;
  }
  r->o = o;
  r->res = res;
  r->err = err;
  r->errlen = errlen;
  size_t n = 0;
  int rc = open_checkpoint(r);
  if (!rc) rc = load_transform(r);
  if (!rc) rc = open_model(r);
  if (!rc) rc = open_data(r);
  if (!rc) rc = write_predictions(r, &n);
  if (!rc) {
    double secs = sr_now() - r->t0;
    if (res) res->n = n;
    if (o->log) {
      fprintf(o->log, "predict %s (%s): %zu samples scored in %.2f s (%.0f samples/s)%s%s\n",
              r->so.path, o->split_name ? o->split_name : "all", n, secs,
              secs > 0 ? (double)n / secs : 0.0, o->out ? " -> " : "", o->out ? o->out : "");
      if (r->n_bad)
        fprintf(o->log, "data   %zu malformed lines skipped (written as nan)\n", r->n_bad);
    }
    if (r->labelled) rc = write_metrics(r, n);
  }
  run_free(r);
  free(r);
  return rc;
}
