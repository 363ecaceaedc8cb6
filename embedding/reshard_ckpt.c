/* Resharding a checkpoint (see reshard_ckpt.h). */
#include "embedding/reshard_ckpt.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/ckpt_fold.h"
#include "embedding/ckpt_plan.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"

static int exists(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0;
}

/* Which layout the source's shards/ has (ckpt_dir_shards_layout); a
 * database layout must hold every shard of the plan. */
static int find_layout(const char *step_dir, const emb_plan *plan, ckpt_shards_layout *out,
                       char *err, size_t errlen) {
  char shards[SR_PATH_MAX], p[SR_PATH_MAX];
  if (ckpt_dir_shards_path(step_dir, shards, sizeof shards))
    return sr_path_too_long(err, errlen, step_dir, sizeof shards);
  int rc = ckpt_dir_shards_layout(shards, out, err, errlen);
  for (int k = 0; !rc && *out == CKPT_SHARDS_DBS && k < plan->n_shards; k++) {
    char cur[SR_PATH_MAX];
    if (ckpt_dir_shard_path(shards, k, p, sizeof p) ||
        sr_path_err(cur, sizeof cur, err, errlen, "%s/CURRENT", p))
      return sr_path_too_long(err, errlen, shards, sizeof p);
    if (!sr_is_file(cur)) {
      sr_fmt(err, errlen, "%s: missing (the plan has %d shards)", p, plan->n_shards);
      rc = SR_ENOTFOUND;
    }
  }
  return rc;
}

/* Under --precision: every table of plan in precision p, and *as_src a
 * copy of the source's plan likewise (the model the new checkpoint holds);
 * else *as_src NULL. */
static int set_precision(int p, const emb_plan *src, emb_plan *plan, emb_plan **as_src, char *err,
                         size_t errlen) {
  *as_src = NULL;
  if (p < 0) return 0;
  char *json = emb_plan_canonical(src, 1);
  int rc = json ? emb_plan_parse(json, "the checkpoint's plan", as_src, err, errlen) : SR_ENOMEM;
  free(json);
  if (rc == SR_ENOMEM) sr_fmt(err, errlen, "out of memory");
  if (rc) return rc;
  for (int i = 0; i < plan->n_tables; i++) plan->tables[i].precision = (emb_precision)p;
  for (int i = 0; i < (*as_src)->n_tables; i++) (*as_src)->tables[i].precision = (emb_precision)p;
  return 0;
}

/* The source, the new plan and OUT, checked before anything is written;
 * *as_src as set_precision makes it. */
static int check_inputs(const reshard_ckpt_opts *o, emb_ckpt *ck, emb_plan **plan,
                        emb_plan **as_src, reshard_ckpt_stats *st, char *err, size_t errlen) {
  int rc;
  memset(ck, 0, sizeof *ck); /* closed by the caller whatever happens */
  /* OUT first, before the source is read and verified: only a checkpoint
   * root is replaced, force or not (SR_EINVAL: force would not help). */
  st->failed = RESHARD_IN_TO;
  if ((rc = ckpt_dir_check_root(st->out_dir, err, errlen)))
    return rc == SR_EEXISTS ? SR_EINVAL : rc;
  if (exists(st->out_dir) && !o->force) {
    sr_fmt(err, errlen, "%s: already exists", st->out_dir);
    return SR_EEXISTS;
  }
  st->failed = RESHARD_IN_FROM;
  if ((rc = emb_ckpt_open(o->from, ck, err, errlen)) ||
      (rc = sr_path_err(st->src_dir, sizeof st->src_dir, err, errlen, "%s", ck->dir)))
    return rc;
  st->step = ck->step;
  st->src_shards = ck->plan->n_shards;
  st->failed = RESHARD_IN_PLAN;
  if ((rc = emb_plan_load(o->plan_path, plan, err, errlen))) return rc;
  st->dst_shards = (*plan)->n_shards;
  st->failed = RESHARD_IN_FROM;
  if ((rc = set_precision(o->convert ? (int)o->precision : -1, ck->plan, *plan, as_src, err, errlen))) return rc;
  st->failed = RESHARD_IN_PLAN;
  const emb_plan *model = *as_src ? *as_src : ck->plan;
  char a[EMB_FP_HEX], b[EMB_FP_HEX], diff[512];
  emb_plan_model_fingerprint(model, a);
  emb_plan_model_fingerprint(*plan, b);
  if (strcmp(a, b)) {
    reshard_model_diff(model, *plan, diff, sizeof diff);
    sr_fmt(err, errlen,
           "%s describes another model than the checkpoint %s (model fingerprint %.12s... vs "
           "%.12s...)%s%s; a new plan may change only n_shards and placements (and, with "
           "--precision, every table's precision)",
           o->plan_path, ck->dir, b, a, diff[0] ? ": " : "", diff);
    return SR_EMISMATCH;
  }
  st->failed = RESHARD_IN_FROM;
  if ((rc = find_layout(ck->dir, ck->plan, &st->layout, err, errlen))) return rc;
  st->failed = RESHARD_IN_TO;
  if (exists(st->out_dir)) { /* force: the source must not live under what is replaced */
    char ro[PATH_MAX], rs[PATH_MAX];
    if (realpath(st->out_dir, ro) && realpath(ck->dir, rs)) {
      size_t l = strlen(ro);
      if (!strncmp(rs, ro, l) && (rs[l] == '/' || !rs[l])) {
        sr_fmt(err, errlen, "%s holds the source checkpoint %s; write the new one elsewhere",
               st->out_dir, ck->dir);
        return SR_EINVAL;
      }
    }
  }
  st->failed = RESHARD_IN_NONE;
  return 0;
}

/* The longest name under a checkpoint's step folder, the work folder's SST
 * files included ("work/t<id>-s<K>-w<W>-<seq>.sst", "shards/shard-K/<a
 * RocksDB file>"), with room to spare. */
#define RESHARD_CKPT_NAME_ROOM 96

/* Move the rows from ck's shards/ into t's shards/ (work: scratch). */
static int move_rows(const reshard_ckpt_opts *o, const emb_ckpt *ck, const emb_plan *plan,
                     const ckpt_dir_txn *t, const char *work, reshard_ckpt_stats *st, char *err,
                     size_t errlen) {
  char src_shards[SR_PATH_MAX], shards[SR_PATH_MAX];
  if (ckpt_dir_shards_path(ck->dir, src_shards, sizeof src_shards) ||
      ckpt_dir_shards_path(t->tmp, shards, sizeof shards)) {
    sr_fmt(err, errlen, "%s: path too long", t->tmp);
    return SR_ERANGE;
  }
  if (mkdir(shards, 0777) != 0) {
    sr_fmt(err, errlen, "%s: cannot create: %s", shards, strerror(errno));
    return SR_EIO;
  }
  /* One table per core at a time (scanning, hashing and SST encoding are
   * CPU work; the per-target ingestion threads mostly wait on fsync). */
  long n_cpu = o->threads > 0 ? o->threads : sysconf(_SC_NPROCESSORS_ONLN);
  if (n_cpu < 1) n_cpu = 1;
  if (o->threads <= 0 && n_cpu > 8) n_cpu = 8;
  reshard_opts ro = {.layout = st->layout, .src_dir = src_shards, .src = ck->plan, .dst = plan,
                     .out_dir = shards, .work_dir = work, .progress = o->progress, .verify = 1,
                     .src_checked = 1, .threads = (int)n_cpu, .row_hook = o->row_hook,
                     .row_hook_ctx = o->row_hook_ctx};
  return st->layout == CKPT_SHARDS_DBS ? reshard_run(&ro, &st->run, err, errlen)
                                       : reshard_run_files(&ro, &st->run, err, errlen);
}

/* Everything under OUT.TAG (OUT.TAG/step-N once complete), then
 * published. On failure the caller removes tmp. */
static int write_out(const reshard_ckpt_opts *o, const emb_ckpt *ck, const emb_plan *plan,
                     const emb_plan *as_src, const char *tmp, reshard_ckpt_stats *st, char *err,
                     size_t errlen) {
  ckpt_dir_txn t;
  char work[SR_PATH_MAX], p1[SR_PATH_MAX], p2[SR_PATH_MAX];
  int done, rc = ckpt_dir_begin(tmp, st->step, &t, &done, err, errlen);
  if (!rc) rc = sr_path_err(work, sizeof work, err, errlen, "%s/work", tmp);
  if (!rc) rc = sr_path_err(p1, sizeof p1, err, errlen, "%s/dense.bin", ck->dir);
  if (!rc) rc = sr_path_err(p2, sizeof p2, err, errlen, "%s/dense.bin", t.tmp);
  if (rc) return rc;
  if (mkdir(work, 0777) != 0) {
    sr_fmt(err, errlen, "%s: cannot create folders: %s", tmp, strerror(errno));
    return SR_EIO;
  }
  if (sr_is_file(p1) && (rc = sr_copy_file(p1, p2, err, errlen))) return rc;
  /* The data transform goes with the model, unchanged (the manifest's
   * "transform" is carried by emb_ckpt_write_as), and so do the bounded
   * tables' counts (train/keep.h's keep.bin: keyed by table_id and row id,
   * whatever the placement). */
  static const char *const carried[] = {"transform.bin", "keep.bin"};
  for (int k = 0; k < 2; k++) {
    if ((rc = sr_path_err(p1, sizeof p1, err, errlen, "%s/%s", ck->dir, carried[k])) ||
        (rc = sr_path_err(p2, sizeof p2, err, errlen, "%s/%s", t.tmp, carried[k])))
      return rc;
    if (sr_is_file(p1) && (rc = sr_copy_file(p1, p2, err, errlen))) return rc;
  }
  if (o->on_start) o->on_start(st, o->ctx);
  if ((rc = move_rows(o, ck, plan, &t, work, st, err, errlen))) {
    size_t l = strlen(err);
    snprintf(err + l, errlen > l ? errlen - l : 0, "; nothing written at %s", st->out_dir);
    return rc;
  }
  sr_rmtree(work);
  if (!sr_path(p1, sizeof p1, "%s/fold", tmp)) sr_rmtree(p1); /* a folded chain's rows */
  if ((rc = emb_ckpt_write_as(ck->manifest, as_src ? as_src : ck->plan, plan, t.tmp, t.final,
                              err, errlen)))
    return rc;
  return ckpt_dir_replace(tmp, st->out_dir, NULL, err, errlen);
}

/* An incremental source: its chain folded into tmp/fold/step-N
 * (embedding/ckpt_fold.h), which *ck becomes, its layout the full one's. */
static int fold_source(emb_ckpt *ck, const char *tmp, reshard_ckpt_stats *st, char *err,
                       size_t errlen) {
  char fold[SR_PATH_MAX], step[SR_PATH_MAX];
  if (ck->chain.n <= 1) return 0;
  st->failed = RESHARD_IN_FROM;
  int rc = sr_path_err(fold, sizeof fold, err, errlen, "%s/fold", tmp);
  if (!rc) rc = sr_path_err(step, sizeof step, err, errlen, "%s/step-%lld", fold,
                            (long long)ck->step);
  if (!rc) rc = emb_ckpt_fold(ck, fold, err, errlen);
  if (rc) return rc;
  emb_ckpt_close(ck);
  if ((rc = emb_ckpt_open(step, ck, err, errlen)) ||
      (rc = find_layout(ck->dir, ck->plan, &st->layout, err, errlen)))
    return rc;
  st->failed = RESHARD_IN_NONE;
  return 0;
}

int reshard_checkpoint(const reshard_ckpt_opts *o, reshard_ckpt_stats *st, char *err,
                       size_t errlen) {
  double t0 = sr_now();
  memset(st, 0, sizeof *st);
  size_t tl = strlen(o->to);
  while (tl > 1 && o->to[tl - 1] == '/') tl--;
  /* OUT leaves room for the longest path made under it (checked before
   * anything is read or written). */
  char widest[128];
  size_t room = (size_t)snprintf(widest, sizeof widest, "./.step-%lld./", LLONG_MAX) +
                2 * (SR_TMP_TAG_MAX - 1) + RESHARD_CKPT_NAME_ROOM;
  if (tl + room >= SR_PATH_MAX) {
    st->failed = RESHARD_IN_TO;
    return sr_path_too_long(err, errlen, o->to, SR_PATH_MAX - room);
  }
  sr_path(st->out_dir, sizeof st->out_dir, "%.*s", (int)tl, o->to); /* fits: checked above */
  emb_ckpt ck;
  emb_plan *plan = NULL, *as_src = NULL; /* as_src: the source's model in --precision */
  char tmp[SR_PATH_MAX];
  int rc = check_inputs(o, &ck, &plan, &as_src, st, err, errlen);
  if (rc) goto out;
  if ((rc = ckpt_dir_tmp_beside(st->out_dir, tmp, sizeof tmp, err, errlen))) goto out;
  ckpt_dir_sweep_beside(st->out_dir);
  if (mkdir(tmp, 0777) != 0) {
    sr_fmt(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    rc = SR_EIO;
    goto out;
  }
  if ((rc = fold_source(&ck, tmp, st, err, errlen)) ||
      (rc = write_out(o, &ck, plan, as_src, tmp, st, err, errlen)))
    sr_rmtree(tmp);
out:
  emb_plan_free(plan);
  emb_plan_free(as_src);
  emb_ckpt_close(&ck);
  st->seconds = sr_now() - t0;
  return rc;
}
