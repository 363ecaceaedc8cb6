/* A rank that dies mid-job, end to end: `mpirun -np 2 shardrec train`
 * against 2 real `shardrec serve` processes (rows in memory), sync mode,
 * checkpoint every K steps; once rank 0 has printed step K the test finds
 * rank 1's process (OMPI_COMM_WORLD_RANK=1 under the mpirun it started)
 * and SIGKILLs it, so rank 1 dies somewhere after step K: the checks hold
 * wherever it was.
 *   - the job exits non-zero within a bounded time of the kill, naming the
 *     dead rank, without finishing;
 *   - both servers dropped the job (Stats: dropped_jobs 1, pending_pushes 0;
 *     dropped_steps 0 or 1: whether rank 0's push of the step was held
 *     before rank 1's death was heard is a race);
 *   - nothing is half-applied: the servers checkpoint again and both
 *     shards, read back through the in-memory store, each equal row by row
 *     the uninterrupted run's shard (which checkpoints every step) after
 *     one whole step M (per shard: a rank that died between its pushes to
 *     the two shards leaves them one step apart), N <= M <= L + 1 (N the
 *     newest complete checkpoint of
 *     the killed run, read from disk; L the last step rank 0 printed). A
 *     row only on the server must be an untouched initial row: a Lookup
 *     may create rows;
 *   - `mpirun -np 2 ... --resume D/step-N` on the same servers (which it
 *     restores to step N) finishes with per-step losses bit-identical to
 *     the uninterrupted -np 2 run. */
#include <check.h>
#include <dirent.h>
#include <math.h>

#include "tests/check_main.h"

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "rpc/shardrec.pb-c.h"
#include "tests/support/servers.h"

#define K 4      /* checkpoint every K steps; rank 1 is killed after step K */
#define STEPS 40 /* steps of a whole run: many more than run between print and kill */
#define ARCH "--arch-mlp-bot 13-16-16 --arch-mlp-top 32-1"
#define HYPER "--optimizer adagrad --learning-rate 0.01 --sparse-learning-rate 0.1"
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe"

static char *dir;

static void setup(void) {
  dir = make_data_dir(6000, 5,
                      "%s train --processed-data-file d.bin --num-batches 1 --num-shards 2 " ARCH
                      " --plan-out p.json",
                      bin_path());
}

static void teardown(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* The train command line of run `name` (metrics in name.jsonl) against
 * addrs with the flags extra, into cmd. */
static void train_cmd(char *cmd, size_t len, const char *name, const char *addrs,
                      const char *extra) {
  snprintf(cmd, len,
           "cd %s && exec " MPIRUN " -np 2 %s train --processed-data-file d.bin --plan p.json "
           ARCH " " HYPER " --mini-batch-size 64 --num-batches %d --print-freq 1 "
           "--metrics-out %s.jsonl --shard-servers %s %s",
           dir, bin_path(), STEPS, name, addrs, extra);
}

static int train(const char *name, const char *addrs, const char *extra, char **out) {
  char cmd[4096];
  train_cmd(cmd, sizeof cmd, name, addrs, extra);
  return run_cmd(out, "%s", cmd);
}

/* The newest complete checkpoint's step under ck (a step-N folder with
 * DONE); -1 if none. */
static int newest_ckpt(const char *ck) {
  DIR *d = opendir(ck);
  ck_assert_msg(d != NULL, "no %s", ck);
  int best = -1;
  for (struct dirent *e; (e = readdir(d));) {
    int n;
    char tail, done[1200];
    if (sscanf(e->d_name, "step-%d%c", &n, &tail) != 1) continue;
    snprintf(done, sizeof done, "%s/%s/DONE", ck, e->d_name);
    if (n > best && access(done, F_OK) == 0) best = n;
  }
  closedir(d);
  return best;
}

/* The last step rank 0 printed in the output text; 0 if none. */
static int last_printed(const char *text) {
  int last = 0;
  for (const char *p = text; (p = strstr(p, "train  step ")); p += 12) last = atoi(p + 12);
  return last;
}

/* Per-step last_loss texts of a run, by step (1-based, as printed). */
static int losses(const char *name, char text[][40], int max) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
  char *s = slurp(path);
  ck_assert_msg(s != NULL, "no %s", path);
  int n = 0;
  for (char *l = strtok(s, "\n"); l; l = strtok(NULL, "\n")) {
    if (!strstr(l, "\"kind\":\"train\"")) continue;
    int step = (int)find_num(l, "\"step\":");
    const char *p = strstr(l, "\"last_loss\":") + 12;
    ck_assert(step >= 1 && step < max);
    snprintf(text[step], 40, "%.*s", (int)strcspn(p, ","), p);
    if (step > n) n = step;
  }
  free(s);
  return n;
}

static Shardrec__V1__StatsResponse *stats(const char *addr) {
  Shardrec__V1__StatsRequest q = SHARDREC__V1__STATS_REQUEST__INIT;
  uint8_t b[8], *resp = NULL;
  size_t len = shardrec__v1__stats_request__pack(&q, b), rlen;
  char msg[256];
  int st = rpc_call_once(addr, NULL, RPC_STATS, b, len, 10, &resp, &rlen, msg, sizeof msg);
  ck_assert_msg(st == RPC_OK, "stats %s: %d %s", addr, st, msg);
  Shardrec__V1__StatsResponse *a = shardrec__v1__stats_response__unpack(NULL, rlen, resp);
  free(resp);
  ck_assert_ptr_nonnull(a);
  return a;
}

static void checkpoint(const char *addr, const char *fp, const char *path) {
  Shardrec__V1__CheckpointRequest q = SHARDREC__V1__CHECKPOINT_REQUEST__INIT;
  q.plan_fingerprint = (char *)fp;
  q.path = (char *)path;
  uint8_t b[2048], *resp = NULL;
  size_t len = shardrec__v1__checkpoint_request__pack(&q, b), rlen;
  char msg[512];
  int st = rpc_call_once(addr, NULL, RPC_CHECKPOINT, b, len, 30, &resp, &rlen, msg, sizeof msg);
  ck_assert_msg(st == RPC_OK, "checkpoint %s: %d %s", addr, st, msg);
  free(resp);
}

/* Rows of one shard checkpoint, read through the in-memory store. */
typedef struct {
  int n, cap;
  int *table;
  uint64_t *id;
  float *val; /* [n][dim + state_len] */
  int width;
} rowset;

static int collect(void *ctx, int table, uint64_t row_id, const float *value, int dim,
                   const float *state, int state_len) {
  rowset *r = ctx;
  if (!r->width) r->width = dim + state_len;
  ck_assert_int_eq(r->width, dim + state_len);
  if (r->n == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 1024;
    r->table = realloc(r->table, (size_t)r->cap * sizeof *r->table);
    r->id = realloc(r->id, (size_t)r->cap * sizeof *r->id);
    r->val = realloc(r->val, (size_t)r->cap * (size_t)r->width * sizeof *r->val);
  }
  r->table[r->n] = table;
  r->id[r->n] = row_id;
  memcpy(r->val + (size_t)r->n * (size_t)r->width, value, (size_t)dim * sizeof(float));
  if (state_len)
    memcpy(r->val + (size_t)r->n * (size_t)r->width + dim, state, (size_t)state_len * sizeof(float));
  r->n++;
  return 0;
}

static void load_rows(const emb_plan *plan, const char *path, rowset *r) {
  char err[512];
  emb_store *st = emb_store_create_local(plan, err, sizeof err);
  ck_assert_msg(st, "%s", err);
  ck_assert_msg(emb_store_restore(st, path) == 0, "restore %s: %s", path, emb_store_errmsg(st));
  memset(r, 0, sizeof *r);
  for (int t = 0; t < plan->n_tables; t++)
    ck_assert_int_eq(emb_store_iterate(st, t, collect, r), 0);
  emb_store_destroy(st);
}

/* Whether b (a server's rows) holds a (a checkpoint's) exactly: every row
 * of a is in b with the same value and optimizer state, and a row only in
 * b is an initial row. 0 if so; else 1 with the first difference in why. */
static int rows_differ(const emb_plan *plan, const rowset *a, const rowset *b, char *why,
                       size_t len) {
  int i = 0;
  const int w = a->width ? a->width : b->width;
  for (int j = 0; j < b->n; j++) {
    if (i < a->n && (a->table[i] < b->table[j] ||
                     (a->table[i] == b->table[j] && a->id[i] < b->id[j]))) {
      snprintf(why, len, "row %llu of table %d is in the checkpoint, not on the server",
               (unsigned long long)a->id[i], a->table[i]);
      return 1;
    }
    const float *v = b->val + (size_t)j * (size_t)w;
    if (i < a->n && a->table[i] == b->table[j] && a->id[i] == b->id[j]) {
      if (memcmp(a->val + (size_t)i * (size_t)w, v, (size_t)w * sizeof(float)) != 0) {
        snprintf(why, len, "row %llu of table %d differs", (unsigned long long)b->id[j],
                 b->table[j]);
        return 1;
      }
      i++;
    } else { /* made by a Lookup after the checkpoint: must be untouched */
      const emb_table *tb = &plan->tables[b->table[j]];
      float init[256];
      ck_assert_int_le(tb->dim, 256);
      emb_row_init(plan, b->table[j], b->id[j], init);
      if (memcmp(init, v, (size_t)tb->dim * sizeof(float)) != 0) {
        snprintf(why, len, "row %llu of table %d is not in the checkpoint and not initial",
                 (unsigned long long)b->id[j], b->table[j]);
        return 1;
      }
    }
  }
  if (i < a->n) {
    snprintf(why, len, "%d rows of the checkpoint are not on the server", a->n - i);
    return 1;
  }
  return 0;
}

static void rows_free(rowset *r) {
  free(r->table);
  free(r->id);
  free(r->val);
}

/* Have both servers checkpoint (to D/after) and find, for each shard, the
 * step M in from..to whose rows of the uninterrupted run
 * (D/full/step-M/shards/shard-K) it holds exactly (rows_differ), printing
 * them; fails the test if a shard matches none. The shards may stand at
 * different steps: a rank that dies between its pushes of a step to shard 0
 * and to shard 1 leaves the step applied on shard 0 (every rank's push was
 * in) and dropped on shard 1 (held, then dropped whole); what must never be
 * is a shard holding part of a step. */
static void servers_whole_step(const test_server *sb, int from, int to) {
  char err[512], fp[EMB_FP_HEX], path[800];
  emb_plan *plan;
  snprintf(path, sizeof path, "%s/p.json", dir);
  ck_assert_msg(emb_plan_load(path, &plan, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  snprintf(path, sizeof path, "%s/after", dir);
  for (int k = 0; k < 2; k++) checkpoint(sb[k].addr, fp, path);
  for (int k = 0; k < 2; k++) {
    char b_dir[900], why[300] = "";
    rowset on;
    snprintf(b_dir, sizeof b_dir, "%s/after/shard-%d", dir, k);
    load_rows(plan, b_dir, &on);
    int m = -1, compared = 0;
    for (int step = from; step <= to && m < 0; step++) {
      char a_dir[900];
      rowset ra;
      snprintf(a_dir, sizeof a_dir, "%s/full/step-%d/shards/shard-%d", dir, step, k);
      load_rows(plan, a_dir, &ra);
      ck_assert_msg(ra.n > 0, "%s holds no rows", a_dir);
      compared = ra.n;
      if (!rows_differ(plan, &ra, &on, why, sizeof why)) m = step;
      else fprintf(stderr, "shard %d not at step %d: %s\n", k, step, why);
      rows_free(&ra);
    }
    ck_assert_msg(m >= 0, "shard %d's rows are not the uninterrupted run's after any step from "
                  "%d to %d (the last: %s)", k, from, to, why);
    fprintf(stderr, "shard %d holds the rows of step %d (%d rows compared)\n", k, m, compared);
    rows_free(&on);
  }
  emb_plan_free(plan);
}

START_TEST(test_rank_dies_job_stops_servers_drop_resume) {
  char *out, path[800];
  test_server sa[2], sb[2];
  char addrs[200], extra[800], cmd[4096];
  /* The uninterrupted run, with the servers' rows after every step on
   * disk (full/step-M). */
  servers_start(sa, 2, &(servers_opts){.dir = dir, .plan = "p.json", .log = "full", .flags = "--threads 2"});
  servers_addrs(sa, 2, addrs, sizeof addrs);
  snprintf(extra, sizeof extra, "--save-checkpoint %s/full --checkpoint-every 1", dir);
  int rc = train("full", addrs, extra, &out);
  ck_assert_msg(rc == 0, "uninterrupted run failed: %s", out);
  free(out);
  server_stop(&sa[0]);
  server_stop(&sa[1]);
  /* Rank 1 is killed once rank 0 has printed step K (its step-K
   * checkpoint is complete by then: the print follows it). */
  servers_start(sb, 2, &(servers_opts){.dir = dir, .plan = "p.json", .log = "dead", .flags = "--threads 2"});
  servers_addrs(sb, 2, addrs, sizeof addrs);
  snprintf(extra, sizeof extra, "--save-checkpoint %s/ck --checkpoint-every %d > dead.out 2>&1",
           dir, K);
  train_cmd(cmd, sizeof cmd, "dead", addrs, extra);
  pid_t job = spawn_sh("%s", cmd);
  pid_t r1 = mpi_rank_pid(job, 1, 120);
  char dead_out[700], want[64];
  snprintf(dead_out, sizeof dead_out, "%s/dead.out", dir);
  snprintf(want, sizeof want, "train  step %d/%d ", K, STEPS);
  wait_text(dead_out, want, 1, job, 120);
  ck_assert_int_eq(kill(r1, SIGKILL), 0);
  double t0 = test_now();
  int st = wait_exit(job, 120);
  double secs = test_now() - t0;
  out = slurp(dead_out);
  ck_assert_msg(st != -1, "the job did not stop within 120 s of rank 1's death:\n%s", out);
  ck_assert_msg(!WIFEXITED(st) || WEXITSTATUS(st) != 0, "the job went on without rank 1: %s",
                out);
  ck_assert_msg(secs < 60, "the job took %.0f s to stop", secs);
  ck_assert_msg(strstr(out, "rank 1") != NULL, "the dead rank is not named:\n%s", out);
  snprintf(want, sizeof want, "train  step %d/%d ", STEPS, STEPS);
  ck_assert_msg(!strstr(out, want), "the job finished without rank 1:\n%s", out);
  const int last = last_printed(out);
  snprintf(path, sizeof path, "%s/ck", dir);
  const int n = newest_ckpt(path);
  fprintf(stderr, "rank death end to end: the job stopped %.1f s after the kill (wait status %d); "
          "last step printed %d, newest checkpoint step-%d\n", secs, st, last, n);
  ck_assert_msg(n >= K && n <= last, "newest checkpoint step-%d, last printed step %d", n, last);
  free(out);
  /* Both servers dropped the job; nothing is held. */
  for (int k = 0; k < 2; k++) {
    Shardrec__V1__StatsResponse *a = NULL;
    double t1 = test_now();
    for (;;) { /* heard at once; poll a little for a loaded machine */
      if (a) shardrec__v1__stats_response__free_unpacked(a, NULL);
      a = stats(sb[k].addr);
      if (a->dropped_jobs >= 1 || test_now() - t1 > 10) break;
      usleep(20 * 1000);
    }
    ck_assert_msg(a->dropped_jobs == 1, "server %d: dropped_jobs %llu", k,
                  (unsigned long long)a->dropped_jobs);
    ck_assert_uint_eq(a->pending_pushes, 0);
    ck_assert_msg(a->dropped_steps <= 1, "server %d: dropped_steps %llu", k,
                  (unsigned long long)a->dropped_steps);
    fprintf(stderr, "server %d: dropped_jobs %llu dropped_steps %llu jobs %llu\n", k,
            (unsigned long long)a->dropped_jobs, (unsigned long long)a->dropped_steps,
            (unsigned long long)a->jobs);
    shardrec__v1__stats_response__free_unpacked(a, NULL);
  }
  /* Each shard's rows are the uninterrupted run's after one whole step. */
  servers_whole_step(sb, n, last + 1 < STEPS ? last + 1 : STEPS);
  /* Resumed on the same servers: the uninterrupted run's losses, bit for bit. */
  snprintf(extra, sizeof extra, "--resume %s/ck/step-%d", dir, n);
  rc = train("resumed", addrs, extra, &out);
  ck_assert_msg(rc == 0, "resumed run failed: %s", out);
  free(out);
  server_stop(&sb[0]);
  server_stop(&sb[1]);
  static char lf[64][40], lr[64][40];
  int nf = losses("full", lf, 64), nr = losses("resumed", lr, 64);
  ck_assert_int_eq(nf, STEPS);
  ck_assert_int_eq(nr, STEPS);
  for (int s = n + 1; s <= STEPS; s++)
    ck_assert_msg(lr[s][0] && !strcmp(lf[s], lr[s]), "step %d: resumed %s, uninterrupted %s", s,
                  lr[s], lf[s]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_rank_death");
  TCase *tc = tcase_create("e2e");
  tcase_set_timeout(tc, 240);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_rank_dies_job_stops_servers_drop_resume);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
