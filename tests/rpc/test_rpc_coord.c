/* The step coordinator of multi-rank jobs alone (rpc/coord_impl.h; the rules are
 * rpc/shardrec.proto's "Multi-rank jobs" and "Rank death"), with no service, no
 * protobuf and no clock of its own: every call gets now from the test.
 *
 * The apply callback records each step it is given (step, lr, and every
 * table's ids and gradient bits), so a test asserts exactly what was
 * applied and when:
 *   sync step order: step t applied once, only when every rank's push is
 *     in, a row's gradients summed in rank order whatever order they came
 *     in (bit for bit; values chosen so that any other order differs);
 *     steps collected ahead applied in order; a Lookup of t+1 parked until
 *     t is applied; at most RPC_COORD_AHEAD steps collected;
 *   async staleness bound, and a parked Lookup's own timeout;
 *   idempotent retries (sync held and applied, async, single rank), modes
 *     and world sizes fixed by a job's first call;
 *   rank death (a cancelled Lookup or Watch), a detached rank, stopping;
 *   the pending timeout, driven by the test's clock;
 *   Restore forgetting every job;
 *   a failing apply;
 *   pushes in parts: at most RPC_COORD_PARTIALS collected at once, a part
 *     taken never dropped for another push's;
 *   at most RPC_COORD_MAX_JOBS multi-rank jobs, none holding pending state
 *     forgotten. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "rpc/coord_impl.h"
#include "tests/check_main.h"

#define NT 2          /* tables */
#define MAX_APPLIED 16
#define MAX_ROWS 16
static const int dims[NT] = {2, 1};

/* One apply the coordinator made. */
typedef struct {
  int64_t step;
  float lr;
  size_t counts[NT];
  uint64_t ids[NT][MAX_ROWS];
  float grads[NT][MAX_ROWS * 2];
} applied_step;

static applied_step applied[MAX_APPLIED];
static int n_applied;
static int fail_next; /* the next apply fails */
static int refuse_next; /* the next apply refuses the update (SR_ERANGE, as a store does) */

static int record(void *ctx, int64_t step, float lr, const emb_idset *set,
                  const emb_grad *const *grads, char *err, size_t errlen) {
  ck_assert_ptr_eq(ctx, &n_applied);
  ck_assert_int_eq(set->n_tables, NT);
  if (fail_next) {
    fail_next = 0;
    snprintf(err, errlen, "disk full");
    return -1;
  }
  if (refuse_next) {
    refuse_next = 0;
    snprintf(err, errlen, "push: table 3 (t3) row 9: would be non-finite; nothing applied");
    return SR_ERANGE;
  }
  ck_assert_int_lt(n_applied, MAX_APPLIED);
  applied_step *a = &applied[n_applied++];
  a->step = step;
  a->lr = lr;
  for (int t = 0; t < NT; t++) {
    ck_assert_uint_le(set->counts[t], MAX_ROWS);
    a->counts[t] = set->counts[t];
    if (!set->counts[t]) continue;
    memcpy(a->ids[t], set->ids[t], set->counts[t] * sizeof(uint64_t));
    memcpy(a->grads[t], grads[t], set->counts[t] * (size_t)dims[t] * sizeof(float));
  }
  return 0;
}

static rpc_coord *co;

static void setup(void) {
  n_applied = 0;
  fail_next = 0;
  refuse_next = 0;
  rpc_coord_opts o = {.n_tables = NT, .dims = dims, .pending_timeout_s = 10, .apply = record,
                      .apply_ctx = &n_applied};
  co = rpc_coord_create(&o);
  ck_assert_ptr_nonnull(co);
}

static void teardown(void) { rpc_coord_destroy(co); }

static rpc_coord_call call(const char *job, int64_t step, int rank, int world, int stale) {
  return (rpc_coord_call){.job = job, .step = step, .rank = rank, .world = world, .stale = stale};
}

/* A push of rows of table 0 only (n ids, 2 floats each from g). */
static rpc_coord_outcome push0(const char *job, int64_t step, int rank, int world, int stale,
                               float lr, const uint64_t *ids, size_t n, const float *g,
                               double now, char *msg) {
  const uint64_t *ip[NT] = {ids, NULL};
  size_t counts[NT] = {n, 0};
  const float *gp[NT] = {g, NULL};
  emb_idset set = {NT, ip, counts};
  rpc_coord_grads p = {.lr = lr, .set = &set, .grads = gp};
  rpc_coord_call k = call(job, step, rank, world, stale);
  return rpc_coord_push(co, &k, &p, now, msg, RPC_COORD_MSG);
}

/* An empty push (it still moves the rank's step on). */
static rpc_coord_outcome push_empty(const char *job, int64_t step, int rank, int world,
                                    int stale, double now) {
  char msg[RPC_COORD_MSG];
  return push0(job, step, rank, world, stale, 0.1f, NULL, 0, NULL, now, msg);
}

/* A Lookup with token (NULL: cannot park); its request bytes are "L<step>". */
static rpc_coord_outcome lookup(const char *job, int64_t step, int rank, int world, int stale,
                                void *token, double timeout_s, double now, char *msg) {
  char in[32];
  int len = snprintf(in, sizeof in, "L%lld", (long long)step);
  rpc_coord_call k = call(job, step, rank, world, stale);
  return rpc_coord_lookup(co, &k, token, (const uint8_t *)in, (size_t)len, timeout_s, now, msg,
                          RPC_COORD_MSG);
}

static rpc_coord_outcome watch(const char *job, int rank, int world, int detach, void *token,
                               double now, char *msg) {
  rpc_coord_call k = call(job, 0, rank, world, 0);
  return rpc_coord_watch(co, &k, detach, token, (const uint8_t *)"W", 1, 1e6, now, msg,
                         RPC_COORD_MSG);
}

static rpc_coord_stats stats(void) {
  rpc_coord_stats st;
  rpc_coord_stats_get(co, &st);
  return st;
}

/* take_woken at now, which must hand back exactly n calls (at most 8) into
 * w; frees their bytes. */
static void woken(double now, int n, rpc_coord_woken *w) {
  rpc_coord_woken tmp[8];
  int got = rpc_coord_take_woken(co, now, tmp, 8);
  ck_assert_int_eq(got, n);
  for (int i = 0; i < got; i++) {
    ck_assert_ptr_nonnull(tmp[i].in);
    free(tmp[i].in);
    tmp[i].in = NULL;
    if (w) w[i] = tmp[i];
  }
}

static int bits_eq(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

START_TEST(test_sync_rank_order_sum) {
  /* Four ranks; row 5 comes from every rank, rows 3 and 9 from one each.
   * The pushes arrive in the order 3, 1, 2, 0. */
  const float lr[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
  float g5[4][2] = {{1e8f, 3.0f}, {1.0f, -1e8f}, {-1e8f, 1e8f}, {0.75f, 1.0f}};
  uint64_t ids[4][2] = {{5, 9}, {5, 0}, {5, 0}, {3, 5}};
  size_t n[4] = {2, 1, 1, 2};
  float g[4][4];
  memcpy(g[0], g5[0], sizeof g5[0]);
  g[0][2] = 7.0f, g[0][3] = 8.0f; /* row 9 */
  memcpy(g[1], g5[1], sizeof g5[1]);
  memcpy(g[2], g5[2], sizeof g5[2]);
  g[3][0] = 4.0f, g[3][1] = 6.0f; /* row 3 */
  memcpy(g[3] + 2, g5[3], sizeof g5[3]);
  const int order[4] = {3, 1, 2, 0};
  char msg[RPC_COORD_MSG];
  int tok;
  for (int i = 0; i < 4; i++) {
    int r = order[i];
    ck_assert_int_eq(push0("j", 0, r, 4, 0, lr[r], ids[r], n[r], g[r], 1, msg), RPC_COORD_GO);
    if (i == 0) /* rank 3's Lookup of step 1 waits for step 0 */
      ck_assert_int_eq(lookup("j", 1, 3, 4, 0, &tok, 100, 1, msg), RPC_COORD_PARKED);
    if (i < 3) {
      ck_assert_int_eq(n_applied, 0); /* held until every rank's is in */
      ck_assert_uint_eq(stats().pending_pushes, (uint64_t)i + 1);
      woken(1, 0, NULL); /* the Lookup still waits */
    }
  }
  ck_assert_int_eq(n_applied, 1);
  ck_assert_uint_eq(stats().pending_pushes, 0);
  const applied_step *a = &applied[0];
  ck_assert_int_eq(a->step, 0);
  ck_assert(a->lr == lr[0]); /* rank 0's learning rate */
  ck_assert_uint_eq(a->counts[0], 3);
  ck_assert_uint_eq(a->counts[1], 0);
  ck_assert_uint_eq(a->ids[0][0], 3);
  ck_assert_uint_eq(a->ids[0][1], 5);
  ck_assert_uint_eq(a->ids[0][2], 9);
  ck_assert(bits_eq(a->grads[0][0], 4.0f) && bits_eq(a->grads[0][1], 6.0f));
  ck_assert(bits_eq(a->grads[0][4], 7.0f) && bits_eq(a->grads[0][5], 8.0f));
  for (int d = 0; d < 2; d++) {
    float rank_order = ((g5[0][d] + g5[1][d]) + g5[2][d]) + g5[3][d];
    float arrival = ((g5[3][d] + g5[1][d]) + g5[2][d]) + g5[0][d];
    ck_assert_msg(!bits_eq(rank_order, arrival), "the test's values must tell the orders apart");
    ck_assert_msg(bits_eq(a->grads[0][2 + d], rank_order), "row 5 [%d]: %.9g, want %.9g", d,
                  (double)a->grads[0][2 + d], (double)rank_order);
  }
  /* The parked Lookup is handed back to be served, with its bytes. */
  rpc_coord_woken w[1];
  rpc_coord_woken tmp[2];
  ck_assert_int_eq(rpc_coord_take_woken(co, 1, tmp, 2), 1);
  w[0] = tmp[0];
  ck_assert_ptr_eq(w[0].token, &tok);
  ck_assert_int_eq(w[0].what, RPC_COORD_GO);
  ck_assert_int_eq(w[0].watch, 0);
  ck_assert_uint_eq(w[0].len, 2);
  ck_assert(memcmp(w[0].in, "L1", 2) == 0);
  free(w[0].in);
  ck_assert_uint_eq(stats().parked_lookups, 0);
}
END_TEST

START_TEST(test_sync_steps_ahead) {
  char msg[RPC_COORD_MSG];
  uint64_t id = 1;
  float g[4][2] = {{1, 1}, {2, 2}, {3, 3}, {4, 4}};
  /* Rank 0 runs ahead: steps 0..3 held (RPC_COORD_AHEAD = 4), step 4 refused. */
  for (int t = 0; t < 4; t++)
    ck_assert_int_eq(push0("a", t, 0, 2, 0, 0.1f, &id, 1, g[t], 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(push0("a", 4, 0, 2, 0, 0.1f, &id, 1, g[0], 1, msg), RPC_COORD_REFUSED);
  ck_assert_msg(strstr(msg, "step 0 still misses ranks' pushes") && strstr(msg, "at most 4"), "%s",
                msg);
  ck_assert_uint_eq(stats().pending_pushes, 4);
  /* A Lookup of step 2 waits for step 1; without a token it is refused. */
  ck_assert_int_eq(lookup("a", 2, 1, 2, 0, NULL, 100, 1, msg), RPC_COORD_WAIT);
  ck_assert_msg(strstr(msg, "waits for every rank's push of step 1 (complete: -1)"), "%s", msg);
  int tok;
  ck_assert_int_eq(lookup("a", 2, 1, 2, 0, &tok, 100, 1, msg), RPC_COORD_PARKED);
  /* Rank 1's pushes complete the steps one by one, in order. */
  for (int t = 0; t < 4; t++) {
    ck_assert_int_eq(push_empty("a", t, 1, 2, 0, 1), RPC_COORD_GO);
    ck_assert_int_eq(n_applied, t + 1);
    ck_assert_int_eq(applied[t].step, t);
    ck_assert(bits_eq(applied[t].grads[0][0], g[t][0]));
    woken(1, t == 1 ? 1 : 0, NULL); /* the Lookup of step 2 goes once step 1 is applied */
  }
  ck_assert_uint_eq(stats().pending_pushes, 0);
  ck_assert_int_eq(lookup("a", 4, 0, 2, 0, NULL, 100, 1, msg), RPC_COORD_GO);
}
END_TEST

START_TEST(test_async_staleness_bound) {
  const int W = 3, S = 2, k = 2; /* rank 2 pushes steps 0..k only */
  char msg[RPC_COORD_MSG];
  int applied_before;
  for (int64_t t = 0; t <= k + S; t++)
    for (int r = 0; r < W; r++) {
      if (r == 2 && t > k) continue;
      ck_assert_msg(lookup("s", t, r, W, S, NULL, 100, 1, msg) == RPC_COORD_GO,
                    "lookup of step %lld rank %d waited: %s", (long long)t, r, msg);
      applied_before = n_applied;
      ck_assert_int_eq(push_empty("s", t, r, W, S, 1), RPC_COORD_GO);
      ck_assert_int_eq(n_applied, applied_before + 1); /* applied on arrival */
      ck_assert_int_eq(applied[n_applied - 1].step, t);
    }
  ck_assert_uint_eq(stats().pending_pushes, 0); /* async holds nothing */
  /* Step k+S+1 needs rank 2's push of k+1. */
  int tok0, tok1;
  ck_assert_int_eq(lookup("s", k + S + 1, 0, W, S, NULL, 100, 1, msg), RPC_COORD_WAIT);
  ck_assert_msg(strstr(msg, "push of step 3 (complete: 2)"), "%s", msg);
  ck_assert_int_eq(lookup("s", k + S + 1, 0, W, S, &tok0, 100, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(lookup("s", k + S + 1, 1, W, S, &tok1, 5, 1, msg), RPC_COORD_PARKED);
  ck_assert_uint_eq(stats().parked_lookups, 2);
  woken(5.9, 0, NULL);
  /* Rank 1's times out at 1 + 5 s; nothing changed. */
  rpc_coord_woken w[2];
  woken(6, 1, w);
  ck_assert_ptr_eq(w[0].token, &tok1);
  ck_assert_int_eq(w[0].what, RPC_COORD_TIMED_OUT);
  ck_assert_msg(strstr(w[0].msg, "deadline passed waiting for every rank's push of step 3"), "%s",
                w[0].msg);
  ck_assert_int_eq(push_empty("s", k + 1, 2, W, S, 7), RPC_COORD_GO);
  woken(7, 1, w);
  ck_assert_ptr_eq(w[0].token, &tok0);
  ck_assert_int_eq(w[0].what, RPC_COORD_GO);
  /* The bound moves with the slowest rank. */
  ck_assert_int_eq(lookup("s", k + S + 2, 0, W, S, NULL, 100, 7, msg), RPC_COORD_WAIT);
  /* A job's first call fixes its first step: t - S before it never waits. */
  ck_assert_int_eq(lookup("s2", 50, 0, 2, 3, NULL, 100, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(lookup("s2", 52, 1, 2, 3, NULL, 100, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(lookup("s2", 53, 1, 2, 3, NULL, 100, 1, msg), RPC_COORD_WAIT);
}
END_TEST

START_TEST(test_idempotent_retry) {
  char msg[RPC_COORD_MSG];
  uint64_t id = 4;
  float g[2] = {1, 2}, other[2] = {9, 9};
  /* Sync: a retry of a held push, then of an applied one. */
  ck_assert_int_eq(push0("r", 0, 1, 2, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(push0("r", 0, 1, 2, 0, 0.1f, &id, 1, other, 1, msg), RPC_COORD_RETRY);
  ck_assert_uint_eq(stats().pending_pushes, 1);
  ck_assert_int_eq(push0("r", 0, 0, 2, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 1);
  ck_assert(bits_eq(applied[0].grads[0][0], 2.0f)); /* g + g: the retry's rows were not kept */
  ck_assert_int_eq(push0("r", 0, 0, 2, 0, 0.1f, &id, 1, other, 1, msg), RPC_COORD_RETRY);
  ck_assert_int_eq(n_applied, 1);
  ck_assert_uint_eq(stats().pending_pushes, 0);
  /* Async. */
  ck_assert_int_eq(push0("q", 3, 0, 2, 1, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(push0("q", 3, 0, 2, 1, 0.1f, &id, 1, g, 1, msg), RPC_COORD_RETRY);
  ck_assert_int_eq(push0("q", 2, 0, 2, 1, 0.1f, &id, 1, g, 1, msg), RPC_COORD_RETRY);
  ck_assert_int_eq(n_applied, 2);
  /* Single rank: idempotent on (job, step, rank); other ranks are other entries. */
  ck_assert_int_eq(push0("one", 3, 0, 1, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(push0("one", 3, 0, 1, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_RETRY);
  ck_assert_int_eq(push0("one", 2, 0, 1, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_RETRY);
  ck_assert_int_eq(push0("one", 3, 1, 1, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(push0("one", 4, 0, 1, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 5);
  ck_assert_int_eq(applied[4].step, 4);
  /* The first call fixes the mode and the world size. */
  ck_assert_int_eq(push0("one", 5, 0, 1, 2, 0.1f, &id, 1, g, 1, msg), RPC_COORD_REFUSED);
  ck_assert_msg(strstr(msg, "runs in sync mode") && strstr(msg, "async mode with max_staleness 2"),
                "%s", msg);
  ck_assert_int_eq(lookup("q", 9, 1, 2, 0, NULL, 1, 1, msg), RPC_COORD_REFUSED);
  ck_assert_msg(strstr(msg, "max_staleness 1") && strstr(msg, "asks for sync mode"), "%s", msg);
  ck_assert_int_eq(push_empty("q", 4, 0, 3, 1, 1), RPC_COORD_REFUSED);
  ck_assert_int_eq(lookup("q", 4, 0, 3, 1, NULL, 1, 1, msg), RPC_COORD_REFUSED);
  ck_assert_msg(strstr(msg, "job q runs with world size 2; this call says 3"), "%s", msg);
  ck_assert_int_eq(n_applied, 5); /* refused calls applied nothing */
}
END_TEST

START_TEST(test_rank_death) {
  char msg[RPC_COORD_MSG];
  uint64_t id = 2;
  float g[2] = {1, 1};
  ck_assert_int_eq(push0("d", 0, 0, 2, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(push0("d", 0, 1, 2, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 1);
  ck_assert_int_eq(push0("d", 1, 0, 2, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO); /* held */
  int tok0, tok1, wt;
  ck_assert_int_eq(lookup("d", 2, 0, 2, 0, &tok0, 100, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(lookup("d", 2, 1, 2, 0, &tok1, 100, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(watch("d", 1, 2, 0, &wt, 1, msg), RPC_COORD_PARKED);
  rpc_coord_stats st = stats();
  ck_assert_uint_eq(st.parked_lookups, 2);
  ck_assert_uint_eq(st.parked_watches, 1);
  ck_assert_uint_eq(st.dropped_steps, 0);
  /* Rank 0's process goes away: its parked Lookup is cancelled. */
  size_t in_len = 0;
  ck_assert_int_eq(rpc_coord_cancel(co, &tok0, 2, &in_len), 1);
  ck_assert_uint_eq(in_len, 2); /* its request, "L2" */
  ck_assert_int_eq(rpc_coord_cancel(co, &tok0, 2, NULL), 0);
  st = stats();
  ck_assert_uint_eq(st.dropped_steps, 1);
  ck_assert_uint_eq(st.dropped_jobs, 1);
  ck_assert_uint_eq(st.pending_pushes, 0);
  ck_assert_uint_eq(st.jobs, 1);
  rpc_coord_woken w[2];
  woken(2, 2, w); /* rank 1's Lookup and Watch: ABORTED */
  const char *why = NULL;
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(w[i].what, RPC_COORD_ABORTED);
    ck_assert_ptr_eq(w[i].token, w[i].watch ? (void *)&wt : (void *)&tok1);
    ck_assert_msg(strstr(w[i].msg, "job d: rank 0 went away (its Lookup of step 2 was cancelled)") &&
                      strstr(w[i].msg, "during step 1, which waited for rank(s) 1") &&
                      strstr(w[i].msg, "held pushes were dropped (nothing of it was applied)"),
                  "%s", w[i].msg);
  }
  why = w[0].msg;
  ck_assert_int_eq(n_applied, 1); /* nothing of step 1 */
  /* Every later call of the job is refused with the same message. */
  char m2[RPC_COORD_MSG];
  ck_assert_int_eq(push0("d", 1, 1, 2, 0, 0.1f, &id, 1, g, 3, m2), RPC_COORD_ABORTED);
  ck_assert_str_eq(m2, why);
  ck_assert_int_eq(lookup("d", 1, 1, 2, 0, NULL, 1, 3, m2), RPC_COORD_ABORTED);
  ck_assert_str_eq(m2, why);
  ck_assert_int_eq(watch("d", 1, 2, 0, &wt, 3, m2), RPC_COORD_ABORTED);
  ck_assert_str_eq(m2, why);
  ck_assert_int_eq(n_applied, 1);
  /* A new job id runs. */
  ck_assert_int_eq(push_empty("d2", 1, 0, 2, 0, 3), RPC_COORD_GO);
  ck_assert_int_eq(push_empty("d2", 1, 1, 2, 0, 3), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 2);
}
END_TEST

START_TEST(test_watch_death_and_detach) {
  char msg[RPC_COORD_MSG];
  int w0, w1, w2;
  ck_assert_int_eq(watch("w", 0, 3, 0, &w0, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(watch("w", 1, 3, 0, &w1, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(watch("w", 2, 3, 0, &w2, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(watch("w", 1, 3, 0, NULL, 1, msg), RPC_COORD_WAIT);
  ck_assert_msg(strstr(msg, "nothing to wait on"), "%s", msg);
  ck_assert_uint_eq(stats().parked_watches, 3);
  /* The Watches do not fix the first step: the first push does (step 7). */
  ck_assert_int_eq(push_empty("w", 7, 0, 3, 0, 1), RPC_COORD_GO);
  ck_assert_uint_eq(stats().pending_pushes, 1);
  /* Ranks 1 and 2 finish: they detach, their Watches are released. Rank
   * 1's process ends before its Watch is answered: that cancel means
   * nothing. Rank 2's Watch is handed back RELEASED. */
  ck_assert_int_eq(watch("w", 1, 3, 1, NULL, 2, msg), RPC_COORD_GO);
  ck_assert_int_eq(watch("w", 2, 3, 1, NULL, 2, msg), RPC_COORD_GO);
  ck_assert_int_eq(rpc_coord_cancel(co, &w1, 2, NULL), 2);
  ck_assert_uint_eq(stats().dropped_jobs, 0);
  rpc_coord_woken w[1];
  woken(2, 1, w);
  ck_assert_ptr_eq(w[0].token, &w2);
  ck_assert_int_eq(w[0].what, RPC_COORD_RELEASED);
  ck_assert_int_eq(w[0].watch, 1);
  ck_assert_int_eq(watch("w", 2, 3, 0, &w2, 2, msg), RPC_COORD_GO); /* detached: at once */
  ck_assert_uint_eq(stats().parked_watches, 1);
  /* Rank 0 dies while computing: only its Watch tells. */
  ck_assert_int_eq(rpc_coord_cancel(co, &w0, 3, NULL), 2);
  rpc_coord_stats st = stats();
  ck_assert_uint_eq(st.dropped_jobs, 1);
  ck_assert_uint_eq(st.dropped_steps, 1);
  ck_assert_int_eq(push_empty("w", 7, 1, 3, 0, 3), RPC_COORD_ABORTED);
  ck_assert_int_eq(lookup("w", 8, 1, 3, 0, NULL, 1, 3, msg), RPC_COORD_ABORTED);
  ck_assert_msg(strstr(msg, "job w: rank 0 went away (its Watch was cancelled: its process ended)") &&
                    strstr(msg, "during step 7, which waited for rank(s) 1,2"),
                "%s", msg);
  ck_assert_int_eq(n_applied, 0);
}
END_TEST

/* A Lookup given up by a rank whose Watch stays open (a client's deadline
 * passed during a partition; its late attempts arrive cancelled) drops
 * nothing: the step completes when that rank's next attempt and push come.
 * Its process ending is still heard, from the Watch. */
START_TEST(test_lookup_given_up_by_a_live_rank) {
  char msg[RPC_COORD_MSG];
  int w0, w1, stale0, tok0, tok1;
  ck_assert_int_eq(watch("p", 0, 2, 0, &w0, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(watch("p", 1, 2, 0, &w1, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(push_empty("p", 0, 1, 2, 0, 1), RPC_COORD_GO); /* held: rank 0's is late */
  ck_assert_int_eq(lookup("p", 1, 0, 2, 0, &stale0, 100, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(rpc_coord_cancel(co, &stale0, 2, NULL), 1); /* the given-up attempt */
  rpc_coord_stats st = stats();
  ck_assert_uint_eq(st.dropped_jobs, 0);
  ck_assert_uint_eq(st.dropped_steps, 0);
  ck_assert_uint_eq(st.pending_pushes, 1);
  ck_assert_uint_eq(st.parked_lookups, 0);
  /* The rank's next attempt parks; rank 0's push completes step 0. */
  ck_assert_int_eq(lookup("p", 1, 0, 2, 0, &tok0, 100, 2, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(lookup("p", 1, 1, 2, 0, &tok1, 100, 2, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(push_empty("p", 0, 0, 2, 0, 3), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 1);
  rpc_coord_woken w[2];
  woken(3, 2, w);
  for (int k = 0; k < 2; k++) ck_assert_int_eq(w[k].what, RPC_COORD_GO);
  /* Rank 0's process ends: its Watch is cancelled, the job dropped. */
  ck_assert_int_eq(push_empty("p", 1, 1, 2, 0, 4), RPC_COORD_GO); /* held */
  ck_assert_int_eq(rpc_coord_cancel(co, &w0, 4, NULL), 2);
  st = stats();
  ck_assert_uint_eq(st.dropped_jobs, 1);
  ck_assert_uint_eq(st.dropped_steps, 1);
  ck_assert_int_eq(push_empty("p", 1, 0, 2, 0, 4), RPC_COORD_ABORTED);
}
END_TEST

START_TEST(test_pending_timeout) {
  char msg[RPC_COORD_MSG];
  int tok;
  /* Sync job p: rank 0 pushes step 0 at t = 100 and parks its Lookup of
   * step 1 (with a timeout far beyond the pending timeout, 10 s). */
  ck_assert_int_eq(push_empty("p", 0, 0, 2, 0, 100), RPC_COORD_GO);
  ck_assert_int_eq(lookup("p", 1, 0, 2, 0, &tok, 1e6, 100, msg), RPC_COORD_PARKED);
  /* Async job q: its ranks at the same step: nothing pending, never dropped. */
  ck_assert_int_eq(push_empty("q", 0, 0, 2, 1, 100), RPC_COORD_GO);
  ck_assert_int_eq(push_empty("q", 0, 1, 2, 1, 100), RPC_COORD_GO);
  /* Async job z: rank 1 behind since t = 100, then progress at t = 105. */
  ck_assert_int_eq(push_empty("z", 0, 0, 2, 1, 100), RPC_COORD_GO);
  woken(105, 0, NULL);
  ck_assert_int_eq(push_empty("z", 1, 0, 2, 1, 105), RPC_COORD_GO);
  woken(109.5, 0, NULL);
  ck_assert_uint_eq(stats().dropped_jobs, 0);
  /* The sweep ran at 109.5: the next is due at 110.5 at the latest. */
  ck_assert_int_eq(rpc_coord_idle(co, 109.9), 0); /* a Lookup is parked */
  rpc_coord_woken w[1];
  woken(110.5, 1, w);
  ck_assert_ptr_eq(w[0].token, &tok);
  ck_assert_int_eq(w[0].what, RPC_COORD_ABORTED);
  ck_assert_msg(strstr(w[0].msg, "job p: no progress for 10 s (a rank went away?)") &&
                    strstr(w[0].msg, "held pushes were dropped"),
                "%s", w[0].msg);
  rpc_coord_stats st = stats();
  ck_assert_uint_eq(st.dropped_jobs, 1);
  ck_assert_uint_eq(st.dropped_steps, 1);
  /* No call parked now: idle until the next sweep is due (110.5 + 1). */
  ck_assert_int_eq(rpc_coord_idle(co, 111.4), 1);
  ck_assert_int_eq(rpc_coord_idle(co, 111.5), 0);
  woken(114.9, 0, NULL);
  ck_assert_uint_eq(stats().dropped_jobs, 1); /* z progressed at 105 */
  woken(116, 0, NULL);
  ck_assert_uint_eq(stats().dropped_jobs, 2); /* z: no progress since 105 */
  ck_assert_int_eq(push_empty("z", 0, 1, 2, 1, 116), RPC_COORD_ABORTED);
  ck_assert_int_eq(push_empty("q", 1, 0, 2, 1, 116), RPC_COORD_GO); /* q was not pending */
  ck_assert_uint_eq(stats().dropped_jobs, 2);
}
END_TEST

START_TEST(test_restore_forgets_jobs) {
  char msg[RPC_COORD_MSG];
  int tok, wt;
  uint64_t id = 1;
  float g[2] = {1, 1};
  ck_assert_int_eq(push0("r1", 5, 1, 2, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO); /* held */
  ck_assert_int_eq(lookup("r1", 6, 1, 2, 0, &tok, 100, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(watch("r2", 0, 2, 0, &wt, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(push0("solo", 3, 0, 1, 0, 0.1f, &id, 1, g, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 1);
  rpc_coord_restore(co);
  rpc_coord_stats st = stats();
  ck_assert_uint_eq(st.jobs, 0);
  ck_assert_uint_eq(st.pending_pushes, 0);
  ck_assert_uint_eq(st.dropped_steps, 1);
  ck_assert_uint_eq(st.dropped_jobs, 0);
  ck_assert_uint_eq(st.parked_watches, 1); /* the ranks are still there */
  rpc_coord_woken w[1];
  woken(2, 1, w);
  ck_assert_ptr_eq(w[0].token, &tok);
  ck_assert_int_eq(w[0].what, RPC_COORD_ABORTED);
  ck_assert_msg(strstr(w[0].msg, "job r1: the server was restored from a checkpoint while this "
                                 "Lookup of step 6 waited"),
                "%s", w[0].msg);
  /* Forgotten: r1 starts afresh from step 0, the single-rank job's step 3
   * is applied again. */
  ck_assert_int_eq(push0("r1", 0, 0, 2, 0, 0.1f, &id, 1, g, 2, msg), RPC_COORD_GO);
  ck_assert_int_eq(push0("r1", 0, 1, 2, 0, 0.1f, &id, 1, g, 2, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 2);
  ck_assert_int_eq(applied[1].step, 0);
  ck_assert_int_eq(push0("solo", 3, 0, 1, 0, 0.1f, &id, 1, g, 2, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 3);
  /* r2's rank 0 dies after the Restore: its forgotten job is refused from
   * then on. */
  ck_assert_int_eq(rpc_coord_cancel(co, &wt, 3, NULL), 2);
  ck_assert_int_eq(push_empty("r2", 0, 1, 2, 0, 3), RPC_COORD_ABORTED);
  ck_assert_int_eq(lookup("r2", 0, 1, 2, 0, NULL, 1, 3, msg), RPC_COORD_ABORTED);
  ck_assert_msg(strstr(msg, "rank 0 went away (its Watch was cancelled") &&
                    strstr(msg, "its start (before any Lookup or Push)"),
                "%s", msg);
}
END_TEST

START_TEST(test_stop_parking) {
  char msg[RPC_COORD_MSG];
  int tok, wt;
  ck_assert_int_eq(push_empty("x", 0, 0, 2, 0, 1), RPC_COORD_GO);
  ck_assert_int_eq(lookup("x", 1, 0, 2, 0, &tok, 100, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(watch("x", 1, 2, 0, &wt, 1, msg), RPC_COORD_PARKED);
  rpc_coord_stop_parking(co);
  ck_assert_int_eq(rpc_coord_idle(co, 1), 0);
  rpc_coord_woken w[2];
  woken(1, 2, w);
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(w[i].what, RPC_COORD_STOPPING);
    ck_assert_msg(strstr(w[i].msg, w[i].watch ? "watch of job x: the server is shutting down"
                                              : "lookup of job x: the server is shutting down"),
                  "%s", w[i].msg);
  }
  ck_assert_int_eq(lookup("x", 1, 1, 2, 0, &tok, 100, 1, msg), RPC_COORD_WAIT);
  ck_assert_msg(strstr(msg, "; the server is shutting down"), "%s", msg);
  ck_assert_int_eq(watch("x", 1, 2, 0, &wt, 1, msg), RPC_COORD_WAIT);
  ck_assert_msg(strstr(msg, "the server is shutting down"), "%s", msg);
  ck_assert_uint_eq(stats().dropped_jobs, 0); /* stopping drops nothing */
  ck_assert_uint_eq(stats().pending_pushes, 1);
}
END_TEST

START_TEST(test_apply_failure) {
  char msg[RPC_COORD_MSG];
  /* Async: a failed apply records nothing; the retry is applied. */
  fail_next = 1;
  ck_assert_int_eq(push_empty("f", 0, 0, 2, 1, 1), RPC_COORD_FAILED);
  ck_assert_int_eq(lookup("f", 2, 1, 2, 1, NULL, 1, 1, msg), RPC_COORD_WAIT);
  fail_next = 1;
  ck_assert_int_eq(push0("f", 0, 0, 2, 1, 0.1f, NULL, 0, NULL, 1, msg), RPC_COORD_FAILED);
  ck_assert_str_eq(msg, "push of step 0 of job f: disk full");
  ck_assert_int_eq(push_empty("f", 0, 0, 2, 1, 1), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 1);
  /* Single rank. */
  fail_next = 1;
  ck_assert_int_eq(push0("g", 0, 0, 1, 0, 0.1f, NULL, 0, NULL, 1, msg), RPC_COORD_FAILED);
  ck_assert_str_eq(msg, "push: disk full");
  ck_assert_int_eq(push_empty("g", 0, 0, 1, 0, 1), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 2);
  /* Sync: the step whose apply failed is gone; the next one goes on. */
  ck_assert_int_eq(push_empty("h", 0, 0, 2, 0, 1), RPC_COORD_GO);
  fail_next = 1;
  ck_assert_int_eq(push0("h", 0, 1, 2, 0, 0.1f, NULL, 0, NULL, 1, msg), RPC_COORD_FAILED);
  ck_assert_str_eq(msg, "push of step 0 of job h: disk full");
  ck_assert_uint_eq(stats().pending_pushes, 0);
  ck_assert_int_eq(push_empty("h", 0, 1, 2, 0, 1), RPC_COORD_RETRY);
  ck_assert_int_eq(push_empty("h", 1, 0, 2, 0, 1), RPC_COORD_GO);
  ck_assert_int_eq(push_empty("h", 1, 1, 2, 0, 1), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 3);
  ck_assert_int_eq(applied[2].step, 1);
}
END_TEST

/* A part of push p, call k with part/parts set. */
static rpc_coord_outcome push_part0(const char *job, int64_t step, int rank, int world, int part,
                                    int parts, const uint64_t *ids, size_t n, const float *g,
                                    double now, char *msg) {
  const uint64_t *ip[NT] = {ids, NULL};
  size_t counts[NT] = {n, 0};
  const float *gp[NT] = {g, NULL};
  emb_idset set = {NT, ip, counts};
  rpc_coord_grads p = {.lr = 0.1f, .set = &set, .grads = gp};
  rpc_coord_call k = call(job, step, rank, world, 0);
  k.part = part;
  k.parts = parts;
  return rpc_coord_push(co, &k, &p, now, msg, RPC_COORD_MSG);
}

/* A push cut into parts is held until every part is in, then applied as
 * one (single rank: at the last part; sync: as the rank's push of the
 * step); each part is idempotent, a row in two parts refuses the push. */
START_TEST(test_push_parts) {
  char msg[RPC_COORD_MSG];
  const uint64_t a[2] = {5, 1}, b[1] = {9};
  const float ga[4] = {1, 2, 3, 4}, gb[2] = {5, 6};
  ck_assert_int_eq(push_part0("p", 0, 0, 1, 1, 2, b, 1, gb, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 0);
  ck_assert_int_eq(push_part0("p", 0, 0, 1, 1, 2, b, 1, gb, 1, msg), RPC_COORD_RETRY);
  ck_assert_int_eq(push_part0("p", 0, 0, 1, 0, 2, a, 2, ga, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 1);
  ck_assert_uint_eq(applied[0].counts[0], 3); /* parts in part order: 5, 1, then 9 */
  ck_assert(applied[0].ids[0][0] == 5 && applied[0].ids[0][1] == 1 && applied[0].ids[0][2] == 9);
  ck_assert(applied[0].grads[0][4] == 5 && applied[0].grads[0][5] == 6);
  ck_assert_int_eq(push_part0("p", 0, 0, 1, 0, 2, a, 2, ga, 1, msg), RPC_COORD_RETRY);
  ck_assert_int_eq(n_applied, 1);
  /* A row in two parts: nothing applied. */
  ck_assert_int_eq(push_part0("p", 1, 0, 1, 0, 2, a, 2, ga, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(push_part0("p", 1, 0, 1, 1, 2, a, 1, ga, 1, msg), RPC_COORD_INVALID);
  ck_assert_msg(strstr(msg, "row 5") && strstr(msg, "two"), "%s", msg);
  ck_assert_int_eq(n_applied, 1);
  /* Sync, 2 ranks: rank 1 in 3 parts, rank 0 whole; applied once all are in. */
  ck_assert_int_eq(push_part0("q", 0, 1, 2, 2, 3, b, 1, gb, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(push_empty("q", 0, 0, 2, 0, 1), RPC_COORD_GO);
  ck_assert_int_eq(push_part0("q", 0, 1, 2, 0, 3, a, 1, ga, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 1);
  ck_assert_int_eq(push_part0("q", 0, 1, 2, 1, 3, a + 1, 1, ga + 2, 1, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 2);
  ck_assert_uint_eq(applied[1].counts[0], 3);
  ck_assert_int_eq(push_part0("q", 0, 1, 2, 1, 3, a + 1, 1, ga + 2, 1, msg), RPC_COORD_RETRY);
}
END_TEST

/* One part of a push of rank r of the wide job below: part 0 row 7 of
 * table 0, part 1 row 3 of table 1. */
static rpc_coord_outcome wide_part(int r, int world, int part, double now, char *msg) {
  const uint64_t id0 = 7, id1 = 3;
  const float g0[2] = {(float)(r + 1), 1.0f / (float)(r + 3)}, g1 = 1.0f / (float)(r + 7);
  const uint64_t *ip[NT] = {part ? NULL : &id0, part ? &id1 : NULL};
  size_t counts[NT] = {part ? 0u : 1u, part ? 1u : 0u};
  const float *gp[NT] = {part ? NULL : g0, part ? &g1 : NULL};
  emb_idset set = {NT, ip, counts};
  rpc_coord_grads p = {.lr = 0.1f, .set = &set, .grads = gp};
  rpc_coord_call k = call("wide", 0, r, world, 0);
  k.part = part;
  k.parts = 2;
  return rpc_coord_push(co, &k, &p, now, msg, RPC_COORD_MSG);
}

/* More ranks than the pushes whose parts may be collected at once, each
 * sending part 0 of its push, then part 1: a part taken is never dropped
 * for another push's; a part that would begin one push too many is BUSY
 * (UNAVAILABLE, which the client sends again), and once sent again every
 * rank's push is applied exactly once, the step's sums the same bits as
 * with nothing refused (in rank order). */
START_TEST(test_push_parts_table_full) {
  const int W = RPC_COORD_PARTIALS + 1;
  char msg[RPC_COORD_MSG];
  uint8_t *busy = calloc((size_t)W * 2, 1);
  ck_assert_ptr_nonnull(busy);
  int n_busy = 0;
  for (int part = 0; part < 2; part++)
    for (int r = 0; r < W; r++) {
      rpc_coord_outcome o = wide_part(r, W, part, 1, msg);
      ck_assert_msg(o == RPC_COORD_GO || o == RPC_COORD_BUSY, "rank %d part %d: %d %s", r, part,
                    (int)o, msg);
      if (o == RPC_COORD_GO) continue;
      ck_assert_msg(strstr(msg, "at most 4096 pushes") && strstr(msg, "send it again later"),
                    "%s", msg);
      busy[r * 2 + part] = 1;
      n_busy++;
    }
  const int refused = n_busy;
  ck_assert_int_eq(n_applied, 0); /* a rank's push is not complete yet */
  for (int tries = 0; n_busy && tries < 4; tries++) /* the client sends them again */
    for (int i = 0; i < W * 2; i++)
      if (busy[i] && wide_part(i / 2, W, i % 2, 2 + tries, msg) == RPC_COORD_GO) {
        busy[i] = 0;
        n_busy--;
      }
  ck_assert_int_eq(n_busy, 0);
  ck_assert_int_eq(n_applied, 1);
  ck_assert_int_gt(refused, 0);
  ck_assert_int_eq(applied[0].step, 0);
  ck_assert_uint_eq(applied[0].counts[0], 1);
  ck_assert_uint_eq(applied[0].counts[1], 1);
  ck_assert(applied[0].ids[0][0] == 7 && applied[0].ids[1][0] == 3);
  float s0 = 0, s1 = 0, s2 = 0; /* every rank's gradients once, in rank order */
  for (int r = 0; r < W; r++) {
    s0 = r ? s0 + (float)(r + 1) : (float)(r + 1);
    s1 = r ? s1 + 1.0f / (float)(r + 3) : 1.0f / (float)(r + 3);
    s2 = r ? s2 + 1.0f / (float)(r + 7) : 1.0f / (float)(r + 7);
  }
  ck_assert_msg(bits_eq(applied[0].grads[0][0], s0), "%.9g vs %.9g", applied[0].grads[0][0], s0);
  ck_assert_msg(bits_eq(applied[0].grads[0][1], s1), "%.9g vs %.9g", applied[0].grads[0][1], s1);
  ck_assert_msg(bits_eq(applied[0].grads[1][0], s2), "%.9g vs %.9g", applied[0].grads[1][0], s2);
  ck_assert_uint_eq(stats().pending_pushes, 0);
  ck_assert_int_eq(lookup("wide", 1, 0, W, 0, NULL, 1, 9, msg), RPC_COORD_GO);
  for (int i = 0; i < W * 2; i++) /* every part again: a retry, nothing applied twice */
    ck_assert_int_eq(wide_part(i / 2, W, i % 2, 9, msg), RPC_COORD_RETRY);
  ck_assert_int_eq(n_applied, 1);
  free(busy);
}
END_TEST

/* With the table full, a push no part came for in the pending timeout (10
 * s here: its sender went away) makes room for a new one; until then a new
 * push's part is BUSY. */
START_TEST(test_push_parts_idle_dropped) {
  char msg[RPC_COORD_MSG], job[32];
  const uint64_t a[1] = {1};
  const float ga[2] = {1, 2};
  for (int i = 0; i < RPC_COORD_PARTIALS; i++) {
    snprintf(job, sizeof job, "s%d", i);
    ck_assert_int_eq(push_part0(job, 0, 0, 1, 0, 2, a, 1, ga, 1 + i * 1e-3, msg), RPC_COORD_GO);
  }
  ck_assert_int_eq(push_part0("new", 0, 0, 1, 0, 2, a, 1, ga, 5, msg), RPC_COORD_BUSY);
  ck_assert_int_eq(push_part0("s1", 0, 0, 1, 1, 2, a + 0, 0, ga, 5, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 1); /* s1 complete: its room is free */
  ck_assert_int_eq(push_part0("new", 0, 0, 1, 0, 2, a, 1, ga, 5, msg), RPC_COORD_GO);
  ck_assert_int_eq(push_part0("new2", 0, 0, 1, 0, 2, a, 1, ga, 10.5, msg), RPC_COORD_BUSY);
  /* s0 had no part since 1 s: at 11 s it is dropped for new2 */
  ck_assert_int_eq(push_part0("new2", 0, 0, 1, 0, 2, a, 1, ga, 11.0005, msg), RPC_COORD_GO);
  ck_assert_int_eq(push_part0("s2", 0, 0, 1, 1, 2, a + 0, 0, ga, 11.0005, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 2); /* s2 (1.002 s) kept: 10 s had not passed */
  ck_assert_int_eq(push_part0("new2", 0, 0, 1, 1, 2, a + 0, 0, ga, 12, msg), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 3);
}
END_TEST

/* With RPC_COORD_MAX_JOBS multi-rank jobs remembered, one holding pending
 * state (a held push, a parked Lookup) is never forgotten for a new job:
 * the new job's call is BUSY (UNAVAILABLE, sent again by the client) until
 * a job holds nothing pending, which is then forgotten for it. */
START_TEST(test_jobs_full_keep_pending) {
  char msg[RPC_COORD_MSG], job[32];
  for (int i = 0; i < RPC_COORD_MAX_JOBS; i++) {
    snprintf(job, sizeof job, "m%d", i);
    ck_assert_int_eq(push_empty(job, 0, 0, 2, 0, 1), RPC_COORD_GO); /* held */
  }
  int token = 0;
  ck_assert_int_eq(lookup("m0", 1, 0, 2, 0, &token, 100, 1, msg), RPC_COORD_PARKED);
  ck_assert_int_eq(lookup("new", 0, 0, 2, 0, NULL, 1, 2, msg), RPC_COORD_BUSY);
  ck_assert_msg(strstr(msg, "at most 256 multi-rank jobs") && strstr(msg, "try again later"),
                "%s", msg);
  ck_assert_int_eq(watch("new", 1, 2, 0, &token, 2, msg), RPC_COORD_BUSY);
  woken(2, 0, NULL); /* m0's Lookup of step 1 still waits */
  ck_assert_uint_eq(stats().pending_pushes, RPC_COORD_MAX_JOBS);
  ck_assert_uint_eq(stats().jobs, RPC_COORD_MAX_JOBS);
  ck_assert_int_eq(push_empty("m5", 0, 1, 2, 0, 2), RPC_COORD_GO); /* m5's step 0 applied */
  ck_assert_int_eq(n_applied, 1);
  ck_assert_int_eq(lookup("new", 0, 0, 2, 0, NULL, 1, 2, msg), RPC_COORD_GO); /* m5 forgotten */
  ck_assert_uint_eq(stats().jobs, RPC_COORD_MAX_JOBS);
  ck_assert_uint_eq(stats().pending_pushes, RPC_COORD_MAX_JOBS - 1);
  ck_assert_int_eq(push_empty("new", 0, 0, 2, 0, 2), RPC_COORD_GO); /* held: pending too */
  ck_assert_int_eq(lookup("new2", 0, 0, 2, 0, NULL, 1, 2, msg), RPC_COORD_BUSY);
  ck_assert_int_eq(push_empty("m0", 0, 1, 2, 0, 3), RPC_COORD_GO); /* every held push kept */
  ck_assert_int_eq(n_applied, 2);
  ck_assert_int_eq(applied[1].step, 0);
  rpc_coord_woken w[1];
  woken(3, 1, w);
  ck_assert_int_eq(w[0].what, RPC_COORD_GO);
  ck_assert_ptr_eq(w[0].token, &token);
}
END_TEST

/* An update the store refuses whole (a row it would leave non-finite):
 * single rank and async answer INVALID; sync drops the step's held pushes,
 * nothing applied, and aborts the job: the push that completed the step and
 * every later call of the job are ABORTED naming the table and row. */
START_TEST(test_apply_refused) {
  char msg[RPC_COORD_MSG];
  refuse_next = 1;
  ck_assert_int_eq(push0("s", 0, 0, 1, 0, 0.1f, NULL, 0, NULL, 1, msg), RPC_COORD_INVALID);
  ck_assert_msg(strstr(msg, "table 3 (t3) row 9"), "%s", msg);
  ck_assert_int_eq(push_empty("s", 0, 0, 1, 0, 1), RPC_COORD_GO); /* not recorded as taken */
  refuse_next = 1;
  ck_assert_int_eq(push0("a", 0, 0, 2, 1, 0.1f, NULL, 0, NULL, 1, msg), RPC_COORD_INVALID);
  ck_assert_int_eq(n_applied, 1);
  /* Sync, two ranks: step 0 applies, step 1's summed update is refused. */
  ck_assert_int_eq(push_empty("y", 0, 0, 2, 0, 1), RPC_COORD_GO);
  ck_assert_int_eq(push_empty("y", 0, 1, 2, 0, 1), RPC_COORD_GO);
  ck_assert_int_eq(n_applied, 2);
  int token = 0;
  ck_assert_int_eq(push_empty("y", 1, 0, 2, 0, 2), RPC_COORD_GO);
  ck_assert_int_eq(lookup("y", 2, 0, 2, 0, &token, 100, 2, msg), RPC_COORD_PARKED);
  refuse_next = 1;
  ck_assert_int_eq(push0("y", 1, 1, 2, 0, 0.1f, NULL, 0, NULL, 2, msg), RPC_COORD_ABORTED);
  ck_assert_msg(strstr(msg, "table 3 (t3) row 9") && strstr(msg, "nothing of it was applied"),
                "%s", msg);
  ck_assert_int_eq(n_applied, 2);
  ck_assert_uint_eq(stats().pending_pushes, 0);
  ck_assert_uint_eq(stats().dropped_steps, 1);
  ck_assert_uint_eq(stats().dropped_jobs, 1);
  rpc_coord_woken w[1];
  woken(2, 1, w); /* the parked Lookup of step 2 */
  ck_assert_int_eq(w[0].what, RPC_COORD_ABORTED);
  ck_assert_msg(strstr(w[0].msg, "table 3 (t3) row 9"), "%s", w[0].msg);
  ck_assert_int_eq(push_empty("y", 2, 0, 2, 0, 3), RPC_COORD_ABORTED);
  ck_assert_int_eq(lookup("y", 2, 1, 2, 0, NULL, 1, 3, msg), RPC_COORD_ABORTED);
  ck_assert_msg(strstr(msg, "table 3 (t3) row 9"), "%s", msg);
  ck_assert_int_eq(n_applied, 2);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_coord");
  TCase *tc = tcase_create("coord");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_sync_rank_order_sum);
  tcase_add_test(tc, test_sync_steps_ahead);
  tcase_add_test(tc, test_async_staleness_bound);
  tcase_add_test(tc, test_idempotent_retry);
  tcase_add_test(tc, test_rank_death);
  tcase_add_test(tc, test_watch_death_and_detach);
  tcase_add_test(tc, test_lookup_given_up_by_a_live_rank);
  tcase_add_test(tc, test_pending_timeout);
  tcase_add_test(tc, test_restore_forgets_jobs);
  tcase_add_test(tc, test_stop_parking);
  tcase_add_test(tc, test_apply_failure);
  tcase_add_test(tc, test_apply_refused);
  tcase_add_test(tc, test_push_parts);
  tcase_add_test(tc, test_push_parts_table_full);
  tcase_add_test(tc, test_push_parts_idle_dropped);
  tcase_add_test(tc, test_jobs_full_keep_pending);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
