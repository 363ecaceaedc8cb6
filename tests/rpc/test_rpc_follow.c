/* A served checkpoint that follows its folder (embedding/served_follow.h,
 * tools/serve_follow.c) against a trainer's checkpoints, in process and as
 * a real server:
 *   - held steps past the first eight (grace long enough), grown while
 *     another thread answers Lookups of the oldest held step under the
 *     exclusive section's lock: every step swapped to and held (the
 *     sanitizer build catches a held list moved under a Lookup);
 *   - a following service refuses Restore FAILED_PRECONDITION, naming why;
 *     its rows and the step its answers name are unchanged after it; its
 *     swaps' own reads of the store do not count as Lookup rows in Stats;
 *   - one that does not follow names its checkpoint's step until a Restore
 *     or a Push changes its rows, then none, and refuses at_step of it;
 *   - 70 damaged checkpoints above the served step and a good one after
 *     them: each refused once, then the good one swapped to; 70 step-N
 *     folders without DONE above it: each reported incomplete once;
 *   - `serve --follow --follow-every 60` stopped by SIGTERM exits 0 (within
 *     10 s, not the 60 s between looks at the folder). */
#include <check.h>

#include "tests/check_main.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "embedding/served.h"
#include "embedding/served_follow.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"
#include "tests/support/servers.h"

#define STEPS 40   /* C: step-0 .. step-STEPS, one checkpoint a step */
#define LATE 80    /* G: step-0 and step-LATE, both full */
#define N_BAD 70   /* more than the 64 a table once held */

static char *dir; /* d.bin, C (a checkpoint every step), G (step-0, step-LATE) */

static const char *at(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *at(const char *fmt, ...) {
  static char buf[8][1024];
  static int i;
  char name[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  i = (i + 1) % 8;
  snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
  return buf[i];
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static void excl(void *ctx, void (*fn)(void *), void *arg) {
  (void)ctx;
  pthread_mutex_lock(&mu);
  fn(arg);
  pthread_mutex_unlock(&mu);
}

/* A follower of root from its checkpoint step (under the test's lock). */
static emb_follow *follow(emb_served *sv, const char *ckpt, const char *root,
                          void (*ex)(void *, void (*)(void *), void *)) {
  int shards[1] = {0};
  char err[1024];
  emb_served_opts o = {.checkpoint = ckpt, .shards = shards, .n_shards = 1};
  ck_assert_msg(!emb_served_open(&o, sv, err, sizeof err), "open %s: %s", ckpt, err);
  emb_follow_opts fo = {.root = root, .grace_s = 1e6, .swap_at = -1, .exclusive = ex};
  emb_follow *f = emb_follow_create(sv, &fo, err, sizeof err);
  ck_assert_msg(f != NULL, "follow %s: %s", root, err);
  return f;
}

/* ---- held steps grown under Lookups ---- */

static emb_follow *F;
static emb_served SV;
static atomic_int stop, answered, failed, polls;

/* Lookups of ids 0..3 of every table at the oldest held step (step 1 once
 * held), many to one hold of the lock, a hold after each of the follower's
 * polls (taking the lock again at once would starve the follower's swaps
 * of it: a mutex is not fair). */
static void *looker(void *p) {
  (void)p;
  const int nt = SV.plan->n_tables;
  uint64_t ids[4] = {0, 1, 2, 3};
  const uint64_t *tid[EMB_MAX_TABLES];
  size_t counts[EMB_MAX_TABLES];
  float *out[EMB_MAX_TABLES];
  for (int t = 0; t < nt; t++) {
    tid[t] = ids;
    counts[t] = SV.plan->tables[t].rows < 4 ? SV.plan->tables[t].rows : 4;
    out[t] = malloc(4 * (size_t)SV.plan->tables[t].dim * sizeof(float));
  }
  emb_idset set = {.n_tables = nt, .ids = tid, .counts = counts};
  for (int seen = 0; !atomic_load(&stop);) {
    if (atomic_load(&polls) == seen) {
      sched_yield();
      continue;
    }
    seen = atomic_load(&polls);
    pthread_mutex_lock(&mu);
    for (int k = 0; k < 64; k++) {
      int64_t step;
      char msg[512];
      if (emb_follow_pick(F, 1, 1, &step, msg, sizeof msg) != EMB_FOLLOW_SERVED) continue;
      if (emb_store_lookup_begin(SV.store, 0, &set, out) || emb_store_lookup_wait(SV.store)) {
        atomic_store(&failed, 1);
        continue;
      }
      emb_follow_patch(F, step, &set, out);
      atomic_fetch_add(&answered, 1);
    }
    pthread_mutex_unlock(&mu);
  }
  for (int t = 0; t < nt; t++) free(out[t]);
  return NULL;
}

START_TEST(held_steps_grow_under_lookups) {
  F = follow(&SV, at("C/step-0"), at("C"), excl);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, looker, NULL), 0);
  emb_follow_event ev;
  int swaps = 0;
  for (emb_follow_poll(F, &ev); ev.what != EMB_FOLLOW_NOTHING; emb_follow_poll(F, &ev)) {
    ck_assert_msg(ev.what == EMB_FOLLOW_SWAPPED, "step %lld refused: %s", (long long)ev.step,
                  ev.msg);
    swaps++;
    atomic_fetch_add(&polls, 1);
  }
  atomic_store(&stop, 1);
  pthread_join(th, NULL);
  ck_assert_int_eq(swaps, STEPS);
  ck_assert_int_eq(emb_follow_step(F), STEPS);
  ck_assert_int_eq(atomic_load(&failed), 0);
  ck_assert_int_gt(atomic_load(&answered), 0);
  for (int64_t s = 0; s < STEPS; s++) { /* every step before the served one held */
    int64_t step;
    char msg[512];
    pthread_mutex_lock(&mu);
    int a = emb_follow_pick(F, s, 1, &step, msg, sizeof msg);
    pthread_mutex_unlock(&mu);
    ck_assert_msg(a == EMB_FOLLOW_SERVED && step == s, "step %lld: %s", (long long)s, msg);
  }
  emb_follow_destroy(F);
  emb_served_close(&SV);
}
END_TEST

/* ---- Restore refused ---- */

static rpc_service *SVC;
static void svc_excl(void *ctx, void (*fn)(void *), void *arg) {
  (void)ctx;
  rpc_service_exclusive(SVC, fn, arg);
}
static int pick(void *ctx, int64_t a, int sa, int64_t *st, char *m, size_t l) {
  int r = emb_follow_pick(ctx, a, sa, st, m, l);
  return r == EMB_FOLLOW_SERVED ? RPC_OK : r == EMB_FOLLOW_AHEAD ? RPC_UNAVAILABLE
                                                                 : RPC_FAILED_PRECONDITION;
}

/* A Lookup of ids 0..7 of every table (at_step at when at >= 0): the rows
 * answered (malloc'd, *n bytes) and the step the answer names (-1: none);
 * a refusal's status into *status when status is not NULL (NULL rows),
 * else it fails the test. */
static uint8_t *lookup_at(const emb_plan *p, const char *fp, int64_t at, int *status,
                          int64_t *step, size_t *n) {
  static int64_t req;
  Shardrec__V1__RequestHeader h = SHARDREC__V1__REQUEST_HEADER__INIT;
  h.plan_fingerprint = (char *)fp;
  h.job_id = "j";
  h.step = req++;
  h.world_size = 1;
  Shardrec__V1__TableIds ti[EMB_MAX_TABLES], *tp[EMB_MAX_TABLES];
  uint64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int t = 0; t < p->n_tables; t++) {
    shardrec__v1__table_ids__init(&ti[t]);
    ti[t].table_id = p->tables[t].table_id;
    ti[t].n_ids = p->tables[t].rows < 8 ? p->tables[t].rows : 8;
    ti[t].ids = ids;
    tp[t] = &ti[t];
  }
  Shardrec__V1__LookupRequest q = SHARDREC__V1__LOOKUP_REQUEST__INIT;
  q.header = &h;
  q.n_tables = (size_t)p->n_tables;
  q.tables = tp;
  q.step_asked = at >= 0;
  q.at_step = at >= 0 ? at : 0;
  size_t len = shardrec__v1__lookup_request__get_packed_size(&q);
  uint8_t *buf = malloc(len);
  shardrec__v1__lookup_request__pack(&q, buf);
  rpc_reply r;
  rpc_service_handle(SVC, RPC_LOOKUP, buf, len, &r);
  free(buf);
  if (status) *status = r.status;
  if (status && r.status) {
    free(r.out);
    return NULL;
  }
  ck_assert_msg(r.status == 0, "Lookup: %d %s", r.status, r.msg);
  Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, r.out_len, r.out);
  ck_assert_ptr_nonnull(a);
  *n = 0;
  for (size_t t = 0; t < a->n_tables; t++) *n += a->tables[t]->rows.len;
  uint8_t *rows = malloc(*n), *o = rows;
  for (size_t t = 0; t < a->n_tables; t++) {
    memcpy(o, a->tables[t]->rows.data, a->tables[t]->rows.len);
    o += a->tables[t]->rows.len;
  }
  *step = a->from_checkpoint ? a->step : -1;
  shardrec__v1__lookup_response__free_unpacked(a, NULL);
  free(r.out);
  return rows;
}

static uint8_t *lookup(const emb_plan *p, const char *fp, int64_t *step, size_t *n) {
  return lookup_at(p, fp, -1, NULL, step, n);
}

/* Checkpoint (restore 0) or Restore of path: the status, msg the message. */
static int admin(const char *fp, int restore, const char *path, char *msg, size_t len) {
  uint8_t buf[4096];
  size_t n;
  if (restore) {
    Shardrec__V1__RestoreRequest q = SHARDREC__V1__RESTORE_REQUEST__INIT;
    q.plan_fingerprint = (char *)fp;
    q.path = (char *)path;
    n = shardrec__v1__restore_request__pack(&q, buf);
  } else {
    Shardrec__V1__CheckpointRequest q = SHARDREC__V1__CHECKPOINT_REQUEST__INIT;
    q.plan_fingerprint = (char *)fp;
    q.path = (char *)path;
    n = shardrec__v1__checkpoint_request__pack(&q, buf);
  }
  rpc_reply r;
  rpc_service_handle(SVC, restore ? RPC_RESTORE : RPC_CHECKPOINT, buf, n, &r);
  snprintf(msg, len, "%s", r.msg);
  free(r.out);
  return r.status;
}

static void own_reads(void *ctx, uint64_t *rows, uint64_t *hits) {
  emb_follow_own_reads(ctx, rows, hits);
}

/* Stats' rows_looked_up of SVC. */
static uint64_t rows_looked_up(void) {
  Shardrec__V1__StatsRequest q = SHARDREC__V1__STATS_REQUEST__INIT;
  uint8_t b[16];
  rpc_reply r;
  rpc_service_handle(SVC, RPC_STATS, b, shardrec__v1__stats_request__pack(&q, b), &r);
  ck_assert_int_eq(r.status, RPC_OK);
  Shardrec__V1__StatsResponse *a = shardrec__v1__stats_response__unpack(NULL, r.out_len, r.out);
  ck_assert_ptr_nonnull(a);
  uint64_t n = a->rows_looked_up;
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  free(r.out);
  return n;
}

START_TEST(restore_refused_while_following) {
  emb_served sv;
  emb_follow *f = follow(&sv, at("C/step-0"), at("C"), svc_excl);
  int shards[1] = {0};
  char err[1024], fp[EMB_FP_HEX], msg[512];
  emb_plan_fingerprint(sv.plan, fp);
  ck_assert_int_eq(mkdir(at("roots"), 0755), 0);
  const char *roots[1] = {at("roots")};
  rpc_service_versions v = {.pick = pick, .patch = emb_follow_patch, .own_reads = own_reads,
                            .ctx = f};
  rpc_service_opts so = {.shards = shards, .n_shards = 1, .read_only = 1, .checkpoint_roots = roots,
                         .n_roots = 1, .from_checkpoint = 1, .step = sv.step, .versions = &v};
  SVC = rpc_service_create(sv.plan, sv.store, &so, err, sizeof err);
  ck_assert_msg(SVC != NULL, "%s", err);
  /* The rows of step 0 kept (Checkpoint is not refused), then step STEPS served. */
  ck_assert_msg(!admin(fp, 0, at("roots/ck0"), msg, sizeof msg), "Checkpoint: %s", msg);
  emb_follow_event ev;
  for (emb_follow_poll(f, &ev); ev.what != EMB_FOLLOW_NOTHING; emb_follow_poll(f, &ev))
    ck_assert_msg(ev.what == EMB_FOLLOW_SWAPPED, "refused: %s", ev.msg);
  int64_t s1, s2;
  size_t n1, n2;
  /* The swaps' own reads of the store are not clients' Lookups. */
  ck_assert_uint_eq(rows_looked_up(), 0);
  uint8_t *r1 = lookup(sv.plan, fp, &s1, &n1);
  ck_assert_int_eq(s1, STEPS);
  uint64_t asked = 0;
  for (int t = 0; t < sv.plan->n_tables; t++) asked += sv.plan->tables[t].rows < 8 ? sv.plan->tables[t].rows : 8;
  ck_assert_uint_eq(rows_looked_up(), asked);
  ck_assert_int_eq(admin(fp, 1, at("roots/ck0"), msg, sizeof msg), RPC_FAILED_PRECONDITION);
  ck_assert_msg(strstr(msg, "Restore refused") && strstr(msg, "follows"), "%s", msg);
  uint8_t *r2 = lookup(sv.plan, fp, &s2, &n2);
  ck_assert_int_eq(s2, STEPS);
  ck_assert_uint_eq(n1, n2);
  ck_assert_msg(!memcmp(r1, r2, n1), "Restore changed the rows served");
  free(r1);
  free(r2);
  rpc_service_destroy(SVC);
  emb_follow_destroy(f);
  emb_served_close(&sv);
}
END_TEST

/* A server of a checkpoint that does not follow: its answers name the
 * checkpoint's step and take at_step of it, until a Restore (here of the
 * same rows, checkpointed) replaces its rows: then they name no step, and
 * a Lookup at that step is refused; a Push does the same on a server that
 * takes them. */
START_TEST(rows_changed_name_no_step) {
  for (int push = 0; push < 2; push++) {
    emb_served sv;
    int shards[1] = {0};
    char err[1024], fp[EMB_FP_HEX], msg[512];
    emb_served_opts o = {.checkpoint = at("C/step-%d", STEPS), .shards = shards, .n_shards = 1};
    ck_assert_msg(!emb_served_open(&o, &sv, err, sizeof err), "%s", err);
    emb_plan_fingerprint(sv.plan, fp);
    const char *roots[1] = {at("roots%d", push)};
    ck_assert_int_eq(mkdir(roots[0], 0755), 0);
    rpc_service_opts so = {.shards = shards, .n_shards = 1, .checkpoint_roots = roots,
                           .n_roots = 1, .from_checkpoint = 1, .step = sv.step};
    SVC = rpc_service_create(sv.plan, sv.store, &so, err, sizeof err);
    ck_assert_msg(SVC != NULL, "%s", err);
    int64_t s1, s2;
    size_t n1, n2;
    int st;
    uint8_t *r1 = lookup_at(sv.plan, fp, STEPS, NULL, &s1, &n1);
    ck_assert_int_eq(s1, STEPS);
    if (!push) {
      ck_assert_msg(!admin(fp, 0, at("roots0/ck"), msg, sizeof msg), "Checkpoint: %s", msg);
      ck_assert_msg(!admin(fp, 1, at("roots0/ck"), msg, sizeof msg), "Restore: %s", msg);
    } else {
      Shardrec__V1__RequestHeader h = SHARDREC__V1__REQUEST_HEADER__INIT;
      h.plan_fingerprint = fp;
      h.job_id = "p";
      h.step = 1000;
      h.world_size = 1;
      uint64_t id = 0;
      float g[EMB_MAX_DIM] = {1};
      Shardrec__V1__TableGrads tg = SHARDREC__V1__TABLE_GRADS__INIT, *tgp = &tg;
      tg.table_id = sv.plan->tables[0].table_id;
      tg.n_ids = 1;
      tg.ids = &id;
      tg.grads.len = (size_t)sv.plan->tables[0].dim * sizeof(float);
      tg.grads.data = (uint8_t *)g;
      Shardrec__V1__PushRequest q = SHARDREC__V1__PUSH_REQUEST__INIT;
      q.header = &h;
      q.learning_rate = 0.5f;
      q.n_tables = 1;
      q.tables = &tgp;
      uint8_t buf[8192];
      size_t len = shardrec__v1__push_request__pack(&q, buf);
      rpc_reply r;
      rpc_service_handle(SVC, RPC_PUSH, buf, len, &r);
      ck_assert_msg(r.status == 0, "Push: %d %s", r.status, r.msg);
      free(r.out);
    }
    uint8_t *r2 = lookup(sv.plan, fp, &s2, &n2);
    ck_assert_int_eq(s2, -1);
    ck_assert_uint_eq(n1, n2);
    ck_assert(!memcmp(r1, r2, n1) == !push); /* the push changed row 0 of table 0 */
    ck_assert_ptr_null(lookup_at(sv.plan, fp, STEPS, &st, &s2, &n2));
    ck_assert_int_eq(st, RPC_FAILED_PRECONDITION);
    free(r1);
    free(r2);
    rpc_service_destroy(SVC);
    emb_served_close(&sv);
  }
}
END_TEST

/* ---- many refused checkpoints ---- */

START_TEST(many_refused_then_a_good_one) {
  char *out;
  /* R: G's step-0 (served) and step-LATE; N_BAD copies of step-0 between
   * them, each named another step than its manifest's (damaged). */
  ck_assert_int_eq(run_cmd(&out, "cp -r '%s' '%s' && for s in $(seq 1 %d); do cp -r '%s' "
                                 "'%s'/step-$s; done", at("G"), at("R"), N_BAD,
                           at("G/step-0"), at("R")), 0);
  free(out);
  emb_served sv;
  emb_follow *f = follow(&sv, at("R/step-0"), at("R"), excl);
  int said[N_BAD] = {0}, swaps = 0;
  emb_follow_event ev;
  /* Each look says one thing: N_BAD refusals and a swap, then nothing. */
  int looks = 0;
  for (emb_follow_poll(f, &ev); ev.what != EMB_FOLLOW_NOTHING && looks < 4 * N_BAD;
       emb_follow_poll(f, &ev), looks++) {
    if (ev.what == EMB_FOLLOW_SWAPPED) {
      ck_assert_int_eq(ev.step, LATE);
      swaps++;
      continue;
    }
    ck_assert_msg(ev.reason == EMB_FOLLOW_DAMAGED && ev.step >= 1 && ev.step <= N_BAD,
                  "step %lld refused (%s): %s", (long long)ev.step,
                  emb_follow_reason_name(ev.reason), ev.msg);
    said[ev.step - 1]++;
  }
  ck_assert_msg(ev.what == EMB_FOLLOW_NOTHING, "still saying something after %d looks", looks);
  for (int i = 0; i < N_BAD; i++) ck_assert_msg(said[i] == 1, "step %d refused %d times", 1 + i, said[i]);
  ck_assert_int_eq(swaps, 1);
  ck_assert_int_eq(emb_follow_step(f), LATE);
  /* N_BAD step-N folders without DONE above the served step: each said once. */
  ck_assert_int_eq(run_cmd(&out, "for s in $(seq 300 %d); do cp -r '%s' '%s'/step-$s; "
                                 "rm '%s'/step-$s/DONE; done", 299 + N_BAD, at("G/step-0"),
                           at("R"), at("R")), 0);
  free(out);
  int incomplete[N_BAD] = {0}, n = 0;
  double t0 = test_now();
  while (n < N_BAD && test_now() - t0 < 30) { /* each is said a second after it is seen */
    emb_follow_poll(f, &ev);
    if (ev.what == EMB_FOLLOW_NOTHING) {
      usleep(10000);
      continue;
    }
    ck_assert_msg(ev.what == EMB_FOLLOW_REFUSED && ev.reason == EMB_FOLLOW_INCOMPLETE &&
                      ev.step >= 300 && ev.step < 300 + N_BAD,
                  "step %lld: %s", (long long)ev.step, ev.msg);
    ck_assert_msg(!incomplete[ev.step - 300]++, "step %lld said twice", (long long)ev.step);
    n++;
  }
  ck_assert_msg(n == N_BAD, "%d of %d incomplete folders said", n, N_BAD);
  emb_follow_destroy(f);
  emb_served_close(&sv);
}
END_TEST

/* ---- SIGTERM ---- */

START_TEST(sigterm_between_looks) {
  test_server s;
  char args[2048];
  snprintf(args, sizeof args, "--checkpoint '%s' --shard 0 --follow --follow-every 60",
           at("C"));
  server_start(&s, args, at("term.log"));
  ck_assert_int_eq(server_stop(&s), 0); /* SIGKILLed (137) when not gone in 10 s */
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("rpc_follow");
  TCase *tc = tcase_create("follow");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, held_steps_grow_under_lookups);
  tcase_add_test(tc, restore_refused_while_following);
  tcase_add_test(tc, rows_changed_name_no_step);
  tcase_add_test(tc, many_refused_then_a_good_one);
  tcase_add_test(tc, sigterm_between_looks);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  const char *bin = getenv("SHARDREC_BIN");
  if (!bin || !(dir = tmpdir_new("follow"))) {
    fprintf(stderr, "test_rpc_follow: SHARDREC_BIN unset (run through ctest) or no temporary folder\n");
    return 1;
  }
  char cmd[8192];
  const char *t = "--processed-data-file d.bin --mini-batch-size 64 --arch-mlp-bot 13-16-16 "
                  "--arch-mlp-top 16-1 --print-freq 100000 --test-freq 0";
  snprintf(cmd, sizeof cmd,
           "cd '%s' && (%s datagen --rows 6000 --seed 1 --out d.tsv && %s convert "
           "--test-fraction 0.1 d.tsv d.bin && %s train %s --save-checkpoint C --num-batches %d "
           "--checkpoint-every 1 --full-checkpoint-every 5 && %s train %s --save-checkpoint G "
           "--num-batches %d --checkpoint-every %d) > prep.log 2>&1 || (cat prep.log >&2; exit 1)",
           dir, bin, bin, bin, t, STEPS, bin, t, LATE, LATE);
  int rc = system(cmd) ? EXIT_FAILURE : sr_check_run(suite());
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (rc == EXIT_SUCCESS && system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  free(dir);
  return rc;
}
