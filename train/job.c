/* The training job, in the order it runs: wiring (ranks, job id, data,
 * plan, store), the loop of steps over the epochs with its explicit rewind
 * after a recovery, the end of the job; then the job's public entry points
 * (train_run ties the rest together). Its batches read ahead are
 * job_batches.c's; its checkpoints, --resume and --save-model job_ckpt.c's;
 * its recovery from a lost shard server job_recover.c's; its test passes
 * job_eval.c's. See job.h. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/fs.h"
#include "common/num.h"
#include "common/outfile.h"
#include "common/status.h"
#include "common/sys.h"
#include "dense/backend.h"
#include "dense/device.h"
#include "dense/pool.h"
#include "embedding/shard.h"
#include "rpc/client.h"
#include "storage/ckpt_dir.h"
#include "train/job_impl.h"

void train_verrf(int rank, int size, const char *fmt, va_list ap) {
  char msg[4096];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (size > 1)
    fprintf(stderr, "shardrec train: rank %d: %s", rank, msg);
  else
    fprintf(stderr, "shardrec train: %s", msg);
  fflush(stderr);
}

void job__errf(const train_job *j, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  train_verrf(j->rank, j->size, fmt, ap);
  va_end(ap);
}

/* ---- wiring ---- */

int job__coll_ok(const train_job *j, int rc, const char *what) {
  if (rc) job__errf(j, "%s: %s\n", what, dense_coll_errmsg(j->coll));
  return rc == 0;
}

/* Options that open the train or test split of the data. */
static ds_source_opts source_opts(const train_job *j, ds_split split) {
  const train_config *c = j->cfg;
  ds_source_opts o;
  memset(&o, 0, sizeof o);
  o.path = c->processed ? c->processed : c->raw;
  o.split = split;
  o.max_ind_range = c->max_ind_range;
  o.frequency_threshold = c->frequency_threshold;
  o.strict = c->strict;
  /* every rank reads the same data, and the train and test sources the same
   * file: rank 0's train source alone reports its malformed lines */
  o.report = j->rank == 0 && split == DS_SPLIT_TRAIN ? stderr : NULL;
  o.format = DS_FORMAT_PROCESSED;
  if (c->raw) {
    o.format = DS_FORMAT_RAW;
    o.transform = j->ck_xf; /* --resume: the checkpoint's mapping (NULL: built from the data) */
    if (c->have_test_fraction) {
      o.scheme = DS_SCHEME_FRACTION;
      o.test_fraction = c->test_fraction;
    } else {
      o.scheme = c->terabyte ? DS_SCHEME_TERABYTE : DS_SCHEME_KAGGLE;
    }
  }
  return o;
}

static int open_data(train_job *j) {
  char err[1024];
  if (j->cfg->resume && job__resume_open(j)) return -1;
  ds_source_opts so = source_opts(j, DS_SPLIT_TRAIN);
  j->data_path = so.path;
  if (!(j->train = ds_source_open(&so, err, sizeof err))) {
    job__errf(j, "%s\n", err);
    return -1;
  }
  if (!ds_source_labelled(j->train)) {
    job__errf(j, "%s: converted from rows without labels (convert --no-label): nothing to train "
              "on (predict scores it)\n", so.path);
    return -1;
  }
  so = source_opts(j, DS_SPLIT_TEST);
  if (!(j->test = ds_source_open(&so, err, sizeof err))) {
    job__errf(j, "%s\n", err);
    return -1;
  }
  ds_source_identity(j->train, j->data_id, sizeof j->data_id);
  j->n_train = ds_source_count(j->train);
  j->n_test = ds_source_count(j->test);
  if (j->n_train == 0) {
    job__errf(j, "%s: the training split is empty\n", so.path);
    return -1;
  }
  return j->cfg->resume && j->cfg->processed ? job__resume_mapping(j) : 0;
}

/* A plan made here is written to --plan-out when given, and into the
 * checkpoint folder (--save-checkpoint DIR: DIR/plan.json) when there is
 * one; nothing lands in the current folder unasked. where gets the files
 * written, for the plan line ("" when none). Rank 0 only. 0 or -1. */
static int write_plan(train_job *j, char *where, size_t len) {
  const train_config *c = j->cfg;
  char err[1024], ck[4096];
  where[0] = 0;
  if (c->plan_out) {
    if (emb_plan_save(j->plan, c->plan_out, err, sizeof err)) {
      job__errf(j, "%s\n", err);
      return -1;
    }
    snprintf(where, len, "%s", c->plan_out);
  }
  if (c->checkpoint_dir) {
    if (sr_path(ck, sizeof ck, "%s/" CKPT_DIR_PLAN, c->checkpoint_dir)) {
      job__errf(j, "--save-checkpoint %s: path too long\n", c->checkpoint_dir);
      return -1;
    }
    if (sr_mkdirs(c->checkpoint_dir) || emb_plan_save(j->plan, ck, err, sizeof err)) {
      job__errf(j, "--save-checkpoint %s: cannot write its " CKPT_DIR_PLAN ": %s\n", c->checkpoint_dir,
                sr_is_dir(c->checkpoint_dir) ? err : strerror(errno));
      return -1;
    }
    size_t n = strlen(where);
    snprintf(where + n, len - n, "%s%s", n ? ", " : "", ck);
  }
  return 0;
}

/* The plan: given, or made from the data's table sizes and the flags (every
 * rank makes the same plan; rank 0 writes it). Prints the plan line. */
static int make_plan(train_job *j) {
  const train_config *c = j->cfg;
  char err[1024], where[8300] = "";
  int from_ck = 0;
  if (j->grow) {
    if (job__grown_plan(j)) return -1;
    if (!c->plan_path && j->rank == 0 && write_plan(j, where, sizeof where)) return -1;
  } else if (c->plan_path && c->have_keep) {
    job__errf(j, "--admit-after, --admit-window, --expire-after, --capacity and --evict shape a "
              "plan made here; %s sets its tables' bounds in their \"keep\" field "
              "(shardrec plan takes the same flags)\n", c->plan_path);
    return -1;
  } else if (c->plan_path) {
    if (emb_plan_load(c->plan_path, &j->plan, err, sizeof err)) {
      job__errf(j, "%s\n", err);
      return -1;
    }
  } else {
    uint64_t sizes[DS_NUM_SPARSE];
    if (c->have_emb_sizes) {
      memcpy(sizes, c->emb_sizes, sizeof sizes);
    } else if (ds_source_table_sizes(j->train, sizes)) {
      job__errf(j, "%s: no table sizes: %s\n", j->data_path, ds_source_errmsg(j->train));
      return -1;
    }
    emb_plan_params pp = {.n_tables = DS_NUM_SPARSE, .rows = sizes, .dim = c->dim,
                          .pooling = c->pooling,
                          .optim = {.kind = c->sparse_opt, .eps = -1, .init_acc = 0},
                          .init_range = 0, .seed = c->seed, .n_shards = c->n_shards,
                          .precision = c->precision,
                          .keep = c->keep};
    if (emb_plan_create(&pp, &j->plan, err, sizeof err)) {
      job__errf(j, "%s\n", err);
      return -1;
    }
    /* A resume takes what the flags cannot say from the checkpoint's plan
     * when they agree with it in everything else: the init ranges and
     * placement a grown plan kept from the plan it grew from. */
    if (j->ck_plan && emb_plan_agrees(j->plan, j->ck_plan)) {
      emb_plan *ck = emb_plan_clone(j->ck_plan);
      if (!ck) {
        job__errf(j, "--resume: out of memory for the checkpoint's plan\n");
        return -1;
      }
      emb_plan_free(j->plan);
      j->plan = ck;
      from_ck = 1;
    }
    if (j->rank == 0 && write_plan(j, where, sizeof where)) return -1;
  }
  const emb_plan *plan = j->plan;
  char mfp[EMB_FP_HEX], pfp[EMB_FP_HEX];
  emb_plan_model_fingerprint(plan, mfp);
  emb_plan_fingerprint(plan, pfp);
  uint64_t total_rows = 0;
  for (int i = 0; i < plan->n_tables; i++) total_rows += plan->tables[i].rows;
  printf("plan   %s%s: %d tables, %llu rows, dim %d, %d shard(s) %s; model %.12s plan %.12s\n",
         c->plan_path ? c->plan_path : where[0] ? where : j->grow ? "grown from the checkpoint's"
                                                      : from_ck ? "the checkpoint's"
                                                                : "made from the data",
         c->plan_path ? "" : where[0] ? " (written)" : " (not written: --plan-out FILE keeps it)",
         plan->n_tables, (unsigned long long)total_rows, plan->tables[0].dim, plan->n_shards,
         c->servers ? "on shard servers" : c->colocate ? "colocated with the ranks" : "in process",
         mfp, pfp);
  printf("data   %s: %llu train, %llu test samples\n", j->data_path,
         (unsigned long long)j->n_train, (unsigned long long)j->n_test);
  return 0;
}

int job__share_job_id(train_job *j) {
  uint64_t x = 0;
  if (j->rank == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    x = sr_mix64(((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20));
  }
  if (!job__coll_ok(j, dense_coll_broadcast_bytes(j->coll, &x, sizeof x, 0), "broadcast of the job id"))
    return -1;
  snprintf(j->job_id, sizeof j->job_id, "job-%016llx", (unsigned long long)x);
  return 0;
}

/* The folders this job's Checkpoint and Restore calls to shard servers name
 * (rpc/service.h, "Admin calls"), with their flags: --save-checkpoint DIR,
 * --save-model DIR (written as DIR.TAG beside DIR, ckpt_dir_tmp_beside;
 * beside: DIR's parent instead), --resume DIR. */
typedef struct {
  const char *path[3], *name[3];
  char model[SR_PATH_MAX];
  int n;
} job_folders;

static void job_folders_get(const train_config *c, int beside, job_folders *f) {
  f->n = 0;
  if (c->checkpoint_dir) f->path[f->n] = c->checkpoint_dir, f->name[f->n++] = "--save-checkpoint";
  if (c->save_model) {
    int len = (int)strlen(c->save_model);
    while (len > 1 && c->save_model[len - 1] == '/') len--;
    int rc;
    if (beside) { /* DIR's parent */
      const char *slash = memrchr(c->save_model, '/', (size_t)len);
      int plen = !slash ? 0 : slash == c->save_model ? 1 : (int)(slash - c->save_model);
      rc = sr_path(f->model, sizeof f->model, "%.*s", plen ? plen : 1, plen ? c->save_model : ".");
    } else {
      rc = ckpt_dir_tmp_beside(c->save_model, f->model, sizeof f->model, NULL, 0);
    }
    if (!rc) f->path[f->n] = f->model, f->name[f->n++] = beside ? "--save-model" : "--save-model (written as)";
  }
  if (c->resume) f->path[f->n] = c->resume, f->name[f->n++] = "--resume";
}

/* A shard-server call tried again (rpc_client_opts.on_retry): a line. */
static void say_retry(void *ctx, const char *msg) { job__errf(ctx, "%s\n", msg); }

/* The remote store over --shard-servers, or over the colocated shards: one
 * address per shard of the plan, in shard order. */
static int open_remote(train_job *j) {
  const train_config *c = j->cfg;
  char err[1024];
  if (c->colocate) {
    job_folders jf;
    job_folders_get(c, 1, &jf); /* the servers' roots */
    colocate_opts co = {.host = "127.0.0.1", .data_dir = c->data_dir, .fresh = !c->resume,
                        .owner = c->resume ? NULL : job__fresh_owner(c),
                        .cache_rows = c->cache_rows, .cache_mb = c->cache_mb, .threads = 2,
                        .checkpoint_roots = jf.path, .n_roots = jf.n};
    j->colo = colocate_start(j->plan, j->rank, j->size, j->coll, &co, &j->colo_addrs, err,
                            sizeof err);
    if (!j->colo) {
      job__errf(j, "--colocate-shards: %s\n", err);
      return -1;
    }
  }
  char *list = c->servers ? strdup(c->servers) : NULL;
  const char **addr = malloc(((list ? strlen(list) / 2 : 0) + (size_t)j->plan->n_shards + 1) *
                             sizeof *addr);
  int n_addr = 0;
  if (c->colocate && addr)
    for (int k = 0; k < j->plan->n_shards; k++) addr[n_addr++] = j->colo_addrs[k];
  char *save = NULL;
  for (char *tok = addr && list ? strtok_r(list, ",", &save) : NULL; tok;
       tok = strtok_r(NULL, ",", &save))
    addr[n_addr++] = tok;
  rpc_tls tls = {.cert = c->tls_cert, .key = c->tls_key, .ca = c->tls_ca};
  rpc_client_opts ro = {.deadline_s = c->rpc_deadline,
                        .connections = c->rpc_connections,
                        .tls = c->tls_ca && !c->colocate ? &tls : NULL,
                        .job_id = j->job_id[0] ? j->job_id : NULL,
                        .rank = j->rank,
                        .world_size = j->size,
                        .max_staleness = c->async ? c->max_staleness : 0,
                        .retry_deadline = 1, /* a partition outlasted is a log line */
                        .on_retry = say_retry,
                        .retry_ctx = j};
  if (addr && (list || !c->servers))
    j->store = emb_store_create_remote(j->plan, addr, n_addr, &ro, err, sizeof err);
  else
    sr_fmt(err, sizeof err, "out of memory");
  if (j->store && c->servers)
    printf("shards %d shard server(s): %s\n", n_addr, c->servers);
  else if (j->store)
    printf("shards %d shard(s) colocated with %d rank(s): %s%s\n", n_addr, j->size,
           n_addr ? addr[0] : "", n_addr > 1 ? ", ..." : "");
  free(addr);
  free(list);
  if (!j->store) {
    job__errf(j, "%s\n", err);
    return -1;
  }
  job_folders jf;
  job_folders_get(c, 0, &jf);
  if (c->servers && rpc_remote_check_roots(j->store, jf.path, jf.name, jf.n, err, sizeof err)) {
    job__errf(j, "%s\n", err);
    return -1;
  }
  printf("mode   %s sparse updates%s\n", c->async ? "async" : "sync",
         c->async ? "" : " (every rank's pushes of a step applied before the next lookups)");
  if (c->async)
    printf("mode   max staleness %d step(s); each step's lookup sent during the step before\n",
           c->max_staleness);
  return 0;
}

/* The store in this process: the RocksDB shard store when --data-dir or a
 * cache size is given (no --data-dir: a temporary folder the job removes at
 * its end), else every row in memory. A --data-dir already holding shard
 * databases is refused unless resuming (the checkpoint replaces them). */
static int open_local(train_job *j) {
  const train_config *c = j->cfg;
  char err[1024];
  const char *data_dir = c->data_dir;
  if (!data_dir && !c->cache_rows && !c->cache_mb) {
    j->store_kind = "local";
    j->store = emb_store_create_local(j->plan, err, sizeof err);
  } else {
    j->store_kind = "shard";
    if (!data_dir) {
      const char *t = getenv("TMPDIR");
      const char *base = t && *t ? t : "/tmp";
      size_t len = strlen(base) + sizeof "/shardrec-data-XXXXXX";
      if (!(j->tmp_data_dir = malloc(len))) {
        job__errf(j, "out of memory\n");
        return -1;
      }
      sr_path(j->tmp_data_dir, len, "%s/shardrec-data-XXXXXX", base); /* len fits it */
      if (!mkdtemp(j->tmp_data_dir)) {
        job__errf(j, "%s: cannot create a temporary data folder: %s\n", j->tmp_data_dir,
                  strerror(errno));
        free(j->tmp_data_dir);
        j->tmp_data_dir = NULL;
        return -1;
      }
      data_dir = j->tmp_data_dir;
    } else if (!c->resume) {
      for (int k = 0; k < j->plan->n_shards; k++)
        if (colocate_data_fresh(data_dir, k, job__fresh_owner(c), err, sizeof err)) {
          job__errf(j, "%s\n", err);
          return -1;
        }
    }
    emb_shard_config sc;
    memset(&sc, 0, sizeof sc);
    sc.cache_rows = c->cache_rows;
    sc.cache_mb = c->cache_mb; /* 0: the shard store's default */
    j->store = emb_store_create_shard(j->plan, data_dir, &sc, err, sizeof err);
  }
  if (!j->store) {
    job__errf(j, "%s\n", err);
    return -1;
  }
  return 0;
}

/* Peak anonymous memory: sample /proc/self/status RssAnon (after each step). */
static void mem_sample(train_job *j) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return;
  char line[256];
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "RssAnon:", 8)) {
      uint64_t kb = strtoull(line + 8, NULL, 10);
      if (kb > j->mem_peak_kb) j->mem_peak_kb = kb;
      break;
    }
  fclose(f);
}

/* Everything the loop needs: data, plan, store, trainer, batches, outputs. */
static int job_open(train_job *j) {
  const train_config *c = j->cfg;
  char err[1024];
  if (job__check_paths(j) || job__check_outputs(j) || open_data(j) || make_plan(j)) return -1;
  j->store_kind = "remote";
  if (j->size > 1 && job__share_job_id(j)) return -1;
  if ((c->servers || c->colocate) ? open_remote(j) : open_local(j)) return -1;
  dense_opt_config ocfg = dense_opt_defaults(c->dense_opt);
  j->t = trainer_create(j->plan, j->store, &c->dense, &ocfg, j->plan->seed, err, sizeof err);
  if (!j->t) {
    job__errf(j, "%s\n", err);
    return -1;
  }
  trainer_set_coll(j->t, j->size > 1 ? j->coll : NULL);
  if (job__keep_open(j)) return -1;
  int max_ahead = c->prefetch_depth > 0 ? c->prefetch_depth : c->async;
  if (job_batches_init(&j->q, c->batch, j->rank, j->size, max_ahead)) {
    job__errf(j, "out of memory for batches\n");
    return -1;
  }
  if (job__eval_open(j) || (c->processed && job__test_check(j))) return -1;
  char cross[64] = "";
  if (c->dense.interaction == DENSE_INTERACT_DCN)
    snprintf(cross, sizeof cross, " (%d cross layers of rank %d)", c->dense.dcn_layers,
             c->dense.dcn_rank);
  printf("model  bottom %s, top %s, %s interaction%s; %zu dense parameters; %s (dense) / %s "
         "(sparse), lr %g / %g\n",
         c->bot, c->top, c->op, cross, dense_config_param_count(&c->dense), c->opt_name,
         emb_optim_name(j->plan->tables[0].optim.kind), c->lr, c->sparse_lr);
  fflush(stdout);
  j->steps_per_epoch = (int64_t)((j->n_train + (uint64_t)c->batch - 1) / (uint64_t)c->batch);
  j->total_steps = j->steps_per_epoch * c->epochs;
  if (c->num_batches > 0 && c->num_batches < j->total_steps) j->total_steps = c->num_batches;
  j->cks = (train_ckpt_settings){c->opt_name, emb_optim_name(j->plan->tables[0].optim.kind), c->lr,
                           c->sparse_lr, c->sched.num_warmup_steps, c->sched.decay_start_step,
                           c->sched.num_decay_steps, c->batch,
                           dense_backend_kernels(dense_backend_default()), dense_blas_version(),
                           dense_blas_core(), j->data_id};
  return 0;
}

/* ---- the loop ---- */

typedef enum {
  STEP_DONE = 0,  /* a step was taken */
  STEP_EPOCH_END, /* the split is used up: the epoch is over */
  STEP_ALL_DONE,  /* the job's steps are done */
  STEP_LOST,      /* the step (or its checkpoint) failed: recover, then rewind */
  STEP_FAILED,    /* the job stops (message printed) */
} step_outcome;

/* The progress line on stdout (or the terminal's live line) and in
 * --metrics-out (each line's write checked: the file is read while it
 * grows). 0 or -1 (message printed). */
static int progress(train_job *j, float loss, float lr) {
  const train_config *c = j->cfg;
  job_cursor *cur = &j->cur;
  double tnow = sr_now();
  double rate = cur->samples_since / (tnow - cur->t_last);
  double frac = (double)cur->epoch_step / (double)j->steps_per_epoch;
  double eta = (double)(j->total_steps - cur->step) * c->batch / (rate > 0 ? rate : 1);
  double mean = cur->loss_sum / (double)cur->loss_n;
  if (j->tty)
    fprintf(stderr, "\rstep %lld/%llu  epoch %d %5.1f%%  %8.0f samples/s  loss %.6f  ETA %4.0fs ",
            (long long)cur->step, (unsigned long long)j->total_steps, cur->epoch, 100 * frac,
            rate, mean, eta);
  else
    printf("train  step %lld/%llu epoch %d %.1f%%: loss %.6f  %.0f samples/s  ETA %.0fs\n",
           (long long)cur->step, (unsigned long long)j->total_steps, cur->epoch, 100 * frac,
           mean, rate, eta);
  char phases[512], kept[JOB_KEEP_JSON], line[JOB_KEEP_JSON + 1024], err[1024], v[3][SR_JNUM_MAX];
  job__phase_json(j, phases, sizeof phases);
  job__keep_json(j, kept, sizeof kept);
  /* Flushed per line: a reader (a test, a dashboard) sees each line at once. */
  int len = snprintf(line, sizeof line,
                     "{\"kind\":\"train\",\"step\":%lld,\"epoch\":%d,\"loss\":%s,"
                     "\"last_loss\":%s,\"lr\":%s,\"samples_per_s\":%.1f%s%s}\n",
                     (long long)cur->step, cur->epoch, sr_jnum(v[0], mean, 9),
                     sr_jnum(v[1], loss, 9), sr_jnum(v[2], lr, 9), rate, phases, kept);
  if (j->metrics &&
      sr_out_line(j->metrics, j->cfg->metrics_out, line, (size_t)len, err, sizeof err)) {
    job__errf(j, "--metrics-out %s\n", err);
    return -1;
  }
  job__metrics_progress(j, mean, rate);
  fflush(stdout);
  cur->loss_sum = 0;
  cur->loss_n = 0;
  cur->samples_since = 0;
  cur->t_last = sr_now();
  return 0;
}

/* The test pass of --test-freq when one is due after the cursor's step.
 * STEP_DONE, STEP_LOST (why) or STEP_FAILED. */
static step_outcome periodic_test(train_job *j, char *why, size_t whylen) {
  job_cursor *cur = &j->cur;
  if (!job__pass_due(j, cur->step)) return STEP_DONE;
  if (j->tty) fprintf(stderr, "\n");
  double e0 = sr_now();
  int tp = job__test_pass(j, why, whylen);
  if (tp) return tp < 0 ? STEP_FAILED : STEP_LOST;
  cur->t_last += sr_now() - e0; /* the rate leaves the pass out, not the steps before it */
  return STEP_DONE;
}

/* The samples of batch g (got of them, the train split's) as a message
 * names them: "FILE records A..B" (bin and int32 files: the records'
 * indices in the file), "FILE's train samples A..B" (TSV). */
static void batch_where(const train_job *j, const ds_batch *g, int got, char *buf, size_t len) {
  uint64_t first = g->first_index, rec;
  if (!ds_source_record_of(j->train, first, &rec))
    sr_fmt(buf, len, "%s records %llu..%llu", j->data_path, (unsigned long long)rec,
           (unsigned long long)(rec + (uint64_t)got - 1));
  else
    sr_fmt(buf, len, "%s's train samples %llu..%llu", j->data_path, (unsigned long long)first,
           (unsigned long long)(first + (uint64_t)got - 1));
}

/* One step of the job: the batch, the step, the checkpoint when due, the
 * progress line and test pass when due. why gets the reason of STEP_LOST. */
static step_outcome job_step(train_job *j, char *why, size_t whylen) {
  const train_config *c = j->cfg;
  job_cursor *cur = &j->cur;
  char err[1024];
  if (cur->step >= j->total_steps) return STEP_ALL_DONE;
  int got = job_batches_take(&j->q, j->train, c->batch, err, sizeof err);
  if (got < 0) {
    if (got == SR_ENOMEM)
      job__errf(j, "step %lld: %s\n", (long long)cur->step, err);
    else
      job__errf(j, "%s\n", err);
    return STEP_FAILED;
  }
  if (got == 0) return STEP_EPOCH_END;
  /* The schedule scales both rates alike. */
  float lr = dense_lr_at(&c->sched, cur->step), loss = 0;
  float slr = c->lr > 0 ? (float)((double)lr * (c->sparse_lr / c->lr)) : (float)c->sparse_lr;
  if (job__fill_ahead(j)) return STEP_FAILED;
  if (j->keep && keep_observe(j->keep, job_batches_global(&j->q), cur->step)) {
    job__errf(j, "step %lld: bounded tables: out of memory\n", (long long)cur->step);
    return STEP_FAILED;
  }
  int rc = trainer_step_part(j->t, job_batches_mine(&j->q), got, cur->step, lr, slr, &loss);
  if (rc) {
    char where[600] = "";
    if (rc == SR_ERANGE) /* a loss or update not finite: the samples that made it */
      batch_where(j, job_batches_global(&j->q), got, where, sizeof where);
    sr_fmt(why, whylen, "step %lld: %s%s%s%s", (long long)cur->step, trainer_errmsg(j->t),
           *where ? " (batch of " : "", where, *where ? ")" : "");
    j->own_fail = !trainer_peer_failed(j->t);
    return STEP_LOST;
  }
  if (!isfinite(loss)) {
    char where[600];
    batch_where(j, job_batches_global(&j->q), got, where, sizeof where);
    job__errf(j, "step %lld: the loss is %g (batch of %s); lower --learning-rate, or look at "
              "those samples\n", (long long)cur->step, loss, where);
    return STEP_FAILED;
  }
  int lost;
  if (job__keep_step(j, cur->step, &lost, err, sizeof err)) {
    if (lost) { /* a shard server lost during the boundary's Remove */
      sr_fmt(why, whylen, "%s", err);
      j->own_fail = j->rank == 0;
      return STEP_LOST;
    }
    job__errf(j, "%s\n", err);
    return STEP_FAILED;
  }
  int notes = rpc_remote_note(j->store, err, sizeof err);
  if (notes) /* a partition (or a restart) the retries outlasted: nothing else to do */
    job__errf(j, "step %lld: %d call(s) answered only after retries; %s\n", (long long)cur->step,
              notes, err);
  cur->step++;
  cur->epoch_step++;
  mem_sample(j);
  /* The loss joins the progress figures before the checkpoint, which
   * records them (a failed checkpoint rewinds them with the cursor). */
  cur->loss_sum += loss;
  cur->loss_n++;
  j->ckst = (train_ckpt_state){cur->step, cur->epoch,
                         job_batches_global(&j->q)->first_index + (uint64_t)got, cur->loss_sum,
                         cur->loss_n, loss, j->keep};
  /* The job's last step: the model when --save-model names this folder, so full. */
  if (cur->step >= j->total_steps && c->save_model && job__model_is_ckpt_root(j))
    j->ck_parent = -1;
  if (c->checkpoint_dir && c->checkpoint_every > 0 && cur->step % c->checkpoint_every == 0 &&
      job__checkpoint(j, c->checkpoint_dir, c->keep_checkpoints, err, sizeof err)) {
    sr_fmt(why, whylen, "--save-checkpoint: %s", err);
    j->own_fail = j->rank == 0;
    return STEP_LOST;
  }
  cur->samples_since += got;
  j->samples_done += got;
  job__metrics_step(j, got);
  if (job__print_due(j, cur->step) && progress(j, loss, lr)) return STEP_FAILED;
  return periodic_test(j, why, whylen);
}

/* The test pass at an epoch's end (or the job's), unless the last step
 * just had one (--test-freq). STEP_DONE, STEP_LOST (why) or STEP_FAILED. */
static step_outcome epoch_test(train_job *j, char *why, size_t whylen) {
  const train_config *c = j->cfg;
  if (j->tty) fprintf(stderr, "\n");
  if (!j->n_test || (c->test_freq > 0 && j->cur.step % c->test_freq == 0)) return STEP_DONE;
  double e0 = sr_now();
  int tp = job__test_pass(j, why, whylen);
  j->cur.t_last += sr_now() - e0;
  return tp < 0 ? STEP_FAILED : tp > 0 ? STEP_LOST : STEP_DONE;
}

/* --save-checkpoint DIR: the final checkpoint. STEP_DONE, or STEP_LOST with
 * why (several ranks: every rank, rank 0's failure). */
static step_outcome final_checkpoint(train_job *j, char *why, size_t whylen) {
  const train_config *c = j->cfg;
  char err[1024];
  if (!c->checkpoint_dir) return STEP_DONE;
  if (c->save_model && job__model_is_ckpt_root(j)) j->ck_parent = -1; /* the model: full */
  if (!job__checkpoint(j, c->checkpoint_dir, c->keep_checkpoints, err, sizeof err)) return STEP_DONE;
  sr_fmt(why, whylen, "--save-checkpoint: %s", err);
  j->own_fail = j->rank == 0;
  return STEP_LOST;
}

/* The next epoch: the split read from its start. 0, or -1 (message printed). */
static int epoch_begin(train_job *j) {
  if (ds_source_rewind(j->train)) {
    job__errf(j, "%s\n", ds_source_errmsg(j->train));
    return -1;
  }
  j->cur.epoch_step = 0;
  return 0;
}

/* The job from the cursor on: epochs of steps (each step with its
 * checkpoint, progress line and test pass when due, job_step), each epoch
 * ended by its test pass, then the final checkpoint. The cursor's epoch goes
 * on where it stands (a resumed or rewound one); rewound: the position was
 * just restored by a recovery (or resumed without its step's test line in
 * --metrics-out), so its step's test pass, when due, runs again.
 * STEP_DONE at the job's end, STEP_LOST (why) or STEP_FAILED. */
static step_outcome job_run(train_job *j, int rewound, char *why, size_t whylen) {
  const train_config *c = j->cfg;
  job_cursor *cur = &j->cur;
  step_outcome o;
  if (rewound && (o = periodic_test(j, why, whylen)) != STEP_DONE) return o;
  for (int first = 1; cur->epoch < c->epochs; cur->epoch++, first = 0) {
    if (!first && epoch_begin(j)) return STEP_FAILED;
    while ((o = job_step(j, why, whylen)) == STEP_DONE) continue;
    if (o != STEP_EPOCH_END && o != STEP_ALL_DONE) return o;
    step_outcome t = epoch_test(j, why, whylen);
    if (t != STEP_DONE) return t;
    if (o == STEP_ALL_DONE) break; /* the job's steps are done before its epochs */
  }
  return final_checkpoint(j, why, whylen);
}

/* The job from the resumed epoch on (job_run); a step, test pass or
 * checkpoint lost to a shard server is recovered from, and the job runs on
 * from the position the recovery rewound the cursor to (the checkpoint
 * restored), whose steps and passes run again. 0 or -1. */
static int job_loop(train_job *j) {
  const train_config *c = j->cfg;
  job_cursor *cur = &j->cur;
  char why[1300];
  j->t_start = cur->t_last = sr_now();
  cur->epoch = j->ckst.epoch;
  /* A point to return to before the first periodic checkpoint: step 0
   * (cheap: no row touched yet, rows start from the seed at first touch). */
  if (!c->resume && c->checkpoint_dir && c->checkpoint_every > 0 &&
      job__checkpoint(j, c->checkpoint_dir, c->keep_checkpoints, why, sizeof why)) {
    job__errf(j, "--save-checkpoint: %s\n", why);
    return -1;
  }
  /* Resumed: the lines of the checkpoint's step that the interrupted job
   * did not write (they come after its checkpoint), as it would have: the
   * progress line here, the test pass as after a recovery. */
  if (j->resume_redo & JOB_REDO_LINE) {
    cur->loss_sum = j->ckst.loss_sum;
    cur->loss_n = j->ckst.loss_n;
    if (progress(j, j->ckst.last_loss, dense_lr_at(&c->sched, cur->step - 1))) return -1;
  }
  step_outcome o;
  for (int rewound = (j->resume_redo & JOB_REDO_PASS) != 0;
       (o = job_run(j, rewound, why, sizeof why)) == STEP_LOST; rewound = 1) {
    if (job__recover(j, why, j->own_fail)) return -1;
    j->ck_parent = -1; /* restored: the next checkpoint is full */
    job_rewind(cur, &j->q, &j->ckst, c->batch, !job__print_due(j, j->ckst.step), sr_now());
    trainer_ahead_drop(j->t);
    if (job__metrics_out_rewound(j)) return -1;
  }
  return o == STEP_DONE ? 0 : -1;
}

/* The end of the job: where the time went, the final checkpoint, memory,
 * skipped lines, --save-model. 0 or -1. */
static int job_finish(train_job *j) {
  const train_config *c = j->cfg;
  char err[1024];
  double secs = sr_now() - j->t_start;
  const trainer_times *tt = trainer_times_get(j->t);
  double ns = (double)(tt->steps ? tt->steps : 1);
  /* Where the store times its lookups (shard servers): how much of their
   * time in flight the step did not wait for. */
  char hidden[80] = "";
  if (tt->lookup_flight > 0) {
    double h = 1 - tt->lookup / tt->lookup_flight;
    snprintf(hidden, sizeof hidden, " (of %.2f in flight, %.0f%% hidden)",
             1e3 * tt->lookup_flight / ns, 100 * (h > 0 ? h : 0));
  }
  printf("done   %lld steps in %.3f s; per step: dedup %.2f ms, lookup %.2f%s, prefetch %.2f, "
         "pool %.2f, forward %.2f, backward %.2f, scatter %.2f, push %.2f, dense opt %.2f\n",
         (long long)j->cur.step, secs, 1e3 * tt->dedup / ns, 1e3 * tt->lookup / ns, hidden,
         1e3 * tt->prefetch / ns, 1e3 * tt->pool / ns, 1e3 * tt->forward / ns, 1e3 * tt->backward / ns,
         1e3 * tt->scatter / ns, 1e3 * tt->push / ns, 1e3 * tt->dense_opt / ns);
  /* Samples per second of training (test passes left out), and where a
   * step's time went: bench dp reads this line. */
  double ts = secs - j->t_eval;
  printf("rate   %.1f samples/s over %d rank(s); per step: dense compute %.3f ms, "
         "allreduce %.3f ms\n",
         ts > 0 ? (double)j->samples_done / ts : 0.0, j->size,
         1e3 * (tt->forward + tt->backward + tt->dense_opt) / ns, 1e3 * tt->allreduce / ns);
  if (c->checkpoint_dir) /* written at the loop's end (final_checkpoint) */
    printf("ckpt   %s/step-%lld\n", c->checkpoint_dir, (long long)j->ckst.step);
  mem_sample(j);
  printf("memory peak RssAnon %.1f MB (%s store)\n", (double)j->mem_peak_kb / 1024.0,
         j->store_kind);
  ds_source_stats st;
  if (!ds_source_stats_get(j->train, &st) && (st.malformed || st.scan_malformed))
    printf("data   %llu malformed lines skipped\n",
           (unsigned long long)(st.malformed > st.scan_malformed ? st.malformed
                                                                  : st.scan_malformed));
  if (c->save_model && job__save_model(j, err, sizeof err)) {
    job__errf(j, "--save-model: %s\n", err);
    return -1;
  }
  return 0;
}

static void job_close(train_job *j, int status) {
  job__eval_close(j);
  job_batches_free(&j->q);
  trainer_destroy(j->t);
  keep_destroy(j->keep);
  emb_store_destroy(j->store);
  if (j->colo) {
    /* Every rank's last call is in before any rank's servers go. */
    if (status == 0 && j->coll) job__coll_ok(j, dense_coll_barrier(j->coll), "final barrier");
    colocate_stop(j->colo);
  }
  if (j->colo_addrs) colocate_addrs_free(j->colo_addrs, j->plan ? j->plan->n_shards : 0);
  if (j->tmp_data_dir) {
    sr_rmtree(j->tmp_data_dir);
    free(j->tmp_data_dir);
  }
  emb_plan_free(j->plan);
  emb_plan_free(j->ck_plan);
  ds_source_destroy(j->train);
  ds_source_destroy(j->test);
  ds_transform_free(j->ck_xf); /* after the sources that borrowed it */
}

/* Under mpirun: MPI up, the collective, and the cores shared out between
 * the ranks of a node. 0 or -1. */
static int job_ranks(train_job *j) {
  char err[1024];
  if (dense_mpi_init(err, sizeof err)) {
    job__errf(j, "%s\n", err);
    return -1;
  }
  if (!(j->coll = dense_coll_mpi_create(err, sizeof err))) {
    job__errf(j, "%s\n", err);
    return -1;
  }
  if (j->coll->size != j->size || j->coll->rank != j->rank) {
    job__errf(j, "MPI says rank %d of %d, the environment rank %d of %d\n", j->coll->rank,
              j->coll->size, j->rank, j->size);
    return -1;
  }
  return 0;
}

/* The dense pool every dense kernel of this process runs on (dense/pool.h):
 * --dense-threads, or the cores shared out between the ranks of this host
 * rather than (cores x ranks) threads. The thread count changes no bits.
 * The pool in *out (the caller destroys it); 0 or -1. */
static int job_dense_pool(train_job *j, dense_pool **out) {
  const train_config *c = j->cfg;
  char err[256];
  int n = c->dense_threads ? c->dense_threads : dense_pool_threads_for(c->ranks.local_size);
  if (!(*out = dense_pool_create(n, err, sizeof err))) {
    job__errf(j, "%s\n", err);
    return -1;
  }
  dense_pool_set_default(*out);
  return 0;
}

/* --auto-resume: c with --resume DIR (into *out, path in dir) when the
 * --save-checkpoint folder holds a complete checkpoint; else c as it is
 * (a fresh start). Every rank finds the same: the job has not started. */
static const train_config *auto_resume(const train_config *c, train_config *out, char *dir,
                                       size_t len) {
  char err[1024];
  if (!c->auto_resume || train_ckpt_resolve(c->checkpoint_dir, dir, len, err, sizeof err)) return c;
  *out = *c;
  out->resume = dir;
  return out;
}

/* A --resume of a dcn model: the cross network's numbers the flags do not
 * give are the checkpoint's (into *out), so a model trained under other
 * defaults resumes as it was; else c as it is (a checkpoint of another
 * interaction, or one that cannot be read, is refused by the resume itself,
 * naming why). */
static const train_config *resume_cross(const train_config *c, train_config *out) {
  if (!c->resume || c->dense.interaction != DENSE_INTERACT_DCN ||
      (c->dcn_layers_set && c->dcn_rank_set))
    return c;
  dense_config ck;
  char err[1024];
  int has;
  if (train_ckpt_dense(c->resume, &has, &ck, err, sizeof err) || !has ||
      ck.interaction != DENSE_INTERACT_DCN)
    return c;
  *out = *c;
  if (!c->dcn_layers_set) out->dense.dcn_layers = ck.dcn_layers;
  if (!c->dcn_rank_set) out->dense.dcn_rank = ck.dcn_rank;
  return out;
}

int train_run(const train_config *cfg) {
  train_config resumed, crossed;
  char resume_dir[SR_PATH_MAX];
  const train_config *c = auto_resume(cfg, &resumed, resume_dir, sizeof resume_dir);
  c = resume_cross(c, &crossed);
  train_job job, *j = &job;
  memset(j, 0, sizeof *j);
  j->ck_parent = -1;
  j->cfg = c;
  j->rank = c->ranks.rank;
  j->size = c->ranks.size;
  j->tty = isatty(2) && j->rank == 0;
  int status = 1;
  dense_pool *pool = NULL;
  if ((c->ranks.launched && job_ranks(j)) || job_dense_pool(j, &pool)) goto done;
  if (c->metrics_listen && job__metrics_start(j)) goto done;
  const dense_backend *be = dense_backend_default();
  printf("ranks  %d rank(s)%s, %d on this node; %d dense thread(s) per rank\n", j->size,
         j->size > 1 ? " (mpirun)" : "", c->ranks.local_size, dense_pool_threads(pool));
  printf("dense  kernels %s; OpenBLAS %s, core %s, one thread per call\n",
         dense_backend_kernels(be), dense_blas_version(), dense_blas_core());
  char blas_warning[256];
  if (dense_blas_core_warning(blas_warning, sizeof blas_warning))
    printf("dense  warning: %s\n", blas_warning);
  if (job_open(j) || (c->resume && job__resume(j)) || job_loop(j) || job_finish(j)) goto done;
  status = 0;
done:
  job_close(j, status);
  job__metrics_stop(j);
  dense_coll_destroy(j->coll);
  dense_pool_set_default(NULL);
  dense_pool_destroy(pool);
  return status;
}

void train_ranks_enter(train_ranks *r) {
  memset(r, 0, sizeof *r);
  r->stderr_saved = -1;
  r->launched = dense_mpi_launched(&r->rank, &r->size, &r->local_size);
  if (!r->launched || r->rank == 0) return;
  fflush(stdout);
  int dn = open("/dev/null", O_WRONLY);
  if (dn >= 0) {
    dup2(dn, 1);
    r->stderr_saved = dup(2);
    dup2(dn, 2);
    close(dn);
  }
}

void train_ranks_speak(train_ranks *r) {
  if (r->stderr_saved < 0) return;
  fflush(stderr);
  dup2(r->stderr_saved, 2);
  close(r->stderr_saved);
  r->stderr_saved = -1;
}

int train_ranks_leave(train_ranks *r, int rc) {
  train_ranks_speak(r);
  fflush(stdout);
  if (rc == 2 && r->launched && r->rank != 0) return 0;
  if (rc && r->size > 1) dense_mpi_abort(rc);
  dense_mpi_finalize();
  return rc;
}

int train_config_check(const train_config *c, char *err, size_t errlen) {
  if (c->metrics_listen && job__metrics_check(c->metrics_listen, err, errlen)) return SR_EINVAL;
  if (!!c->processed == !!c->raw) {
    sr_fmt(err, errlen, "give exactly one of --processed-data-file and --raw-data-file");
    return SR_EINVAL;
  }
  if (c->processed && c->have_test_fraction) {
    sr_fmt(err, errlen, "--test-fraction applies to raw data; a processed file holds the split "
           "chosen by 'shardrec convert'");
    return SR_EINVAL;
  }
  if (c->colocate && c->servers) {
    sr_fmt(err, errlen, "give one of --shard-servers and --colocate-shards");
    return SR_EINVAL;
  }
  if (c->async && !c->servers && !c->colocate) {
    sr_fmt(err, errlen, "--sparse-mode async needs shard servers (--shard-servers or "
           "--colocate-shards): in-process shards apply every push at once");
    return SR_EINVAL;
  }
  if (c->rpc_connections && !c->servers && !c->colocate) {
    sr_fmt(err, errlen, "--rpc-connections applies to shard servers (--shard-servers or "
           "--colocate-shards)");
    return SR_EINVAL;
  }
  if (c->rpc_connections > 1 && c->async) {
    sr_fmt(err, errlen, "--rpc-connections %d needs --sparse-mode sync: in async mode a Lookup "
           "of step t+1 sent on one connection may overtake the Push of step t sent on another, "
           "and the bits would depend on which arrives first (use 1)", c->rpc_connections);
    return SR_EINVAL;
  }
  if (c->full_every > 1 && !c->checkpoint_dir) {
    sr_fmt(err, errlen, "--full-checkpoint-every %d needs --save-checkpoint DIR (the folder its "
           "chains are written into)", c->full_every);
    return SR_EINVAL;
  }
  if (c->auto_resume && (!c->checkpoint_dir || c->resume)) {
    sr_fmt(err, errlen, "--auto-resume needs --save-checkpoint DIR (the folder it resumes "
           "from) and takes no --resume");
    return SR_EINVAL;
  }
  if (c->ranks.size > 1) {
    if (c->batch % c->ranks.size) {
      sr_fmt(err, errlen, "--mini-batch-size %d is the global batch and must divide by the %d "
             "ranks (%d %% %d = %d)", c->batch, c->ranks.size, c->batch, c->ranks.size, c->batch % c->ranks.size);
      return SR_EINVAL;
    }
    if (!c->servers && !c->colocate) {
      sr_fmt(err, errlen, "%d ranks need the embeddings on shards every rank reaches: "
             "--shard-servers H:P,... or --colocate-shards (in-process shards would be one copy "
             "per rank)", c->ranks.size);
      return SR_EINVAL;
    }
    if (c->data_dir && !c->colocate) {
      sr_fmt(err, errlen, "--data-dir: with shard servers the rows live on the servers");
      return SR_EINVAL;
    }
  }
  return 0;
}
