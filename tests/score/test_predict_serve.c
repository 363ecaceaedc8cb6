/* Serving a trainer's checkpoint: read-only shard servers of one checkpoint
 * side by side (each shard, the same shard twice, one server of both), and
 * shardrec predict against them reproduces the trainer's own test
 * predictions (train --test-pred-out) line for line at the same test batch
 * size, with the trainer's AUC and log loss; a Push to a read-only server is
 * refused FAILED_PRECONDITION and changes nothing; a checkpoint of in-memory
 * servers (row-wise plan, table files per server) served and scored in
 * process. Real processes on loopback. */
#include <check.h>
#include <unistd.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "tests/check_main.h"
#include "tests/score/common.h"
#include "tests/support/servers.h"

#define N_TEST 1000

static void setup(void) {
  make_data();
  free(in_dir(0, "%s train --processed-data-file d.bin " MODEL "--num-shards 2 --cache-mb 64 "
                 "--save-checkpoint ckr --test-pred-out tr.txt --metrics-out mr.jsonl "
                 "--plan-out plan.json > tra.out 2>&1", bin_path()));
}

static void serve(test_server *s, const char *args) {
  char full[2048], log[1024];
  snprintf(full, sizeof full, "%s", args);
  snprintf(log, sizeof log, "%s/serve.log", dir);
  char cwd[4096];
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  ck_assert_int_eq(chdir(dir), 0);
  server_start(s, full, log);
  ck_assert_int_eq(chdir(cwd), 0);
}

START_TEST(test_read_only_servers_equal_trainer) {
  test_server s0, s1, s1b, s01;
  serve(&s0, "--checkpoint ckr --shard 0 --read-only");
  serve(&s1, "--checkpoint ckr --shard 1 --read-only");
  serve(&s1b, "--checkpoint ckr --shard 1 --read-only");  /* the same shard again */
  serve(&s01, "--checkpoint ckr --shard 0,1 --read-only"); /* both shards */
  const char *sets[][2] = {{s0.addr, s1.addr}, {s0.addr, s1b.addr}, {s01.addr, s01.addr}};
  for (int i = 0; i < 3; i++) {
    char *out = in_dir(0, "%s predict --checkpoint ckr --shard-servers %s,%s --processed-data-file "
                          "d.bin --data-split test --mini-batch-size 128 --out p%d.tsv "
                          "--metrics-out pm%d.json", bin_path(), sets[i][0], sets[i][1], i, i);
    ck_assert_msg(strstr(out, "on shard servers"), "%s", out);
    char p[32], pm[32];
    snprintf(p, sizeof p, "p%d.tsv", i);
    snprintf(pm, sizeof pm, "pm%d.json", i);
    assert_same_preds(p, "tr.txt", N_TEST);
    char *a = metric_fields(pm, "\"kind\":\"predict\""), *b = metric_fields("mr.jsonl", "\"kind\":\"test\"");
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
    free(out);
  }
  ck_assert_int_eq(server_stop(&s0), 0);
  ck_assert_int_eq(server_stop(&s1), 0);
  ck_assert_int_eq(server_stop(&s1b), 0);
  ck_assert_int_eq(server_stop(&s01), 0);
  /* Their temporary copies of the databases are gone. */
  char *log = file_text("serve.log");
  free(log);
  char *left = in_dir(0, "grep -h 'RocksDB shard databases in' serve.log | "
                         "sed 's/.* in \\([^ ]*\\) (temporary).*/\\1/' | while read d; do "
                         "[ -e \"$d\" ] && echo LEFT $d; done; true");
  ck_assert_msg(strstr(left, "LEFT") == NULL, "%s", left);
  free(left);
}
END_TEST

START_TEST(test_push_refused_read_only) {
  test_server s0, s1;
  serve(&s0, "--checkpoint ckr --shard 0 --read-only");
  serve(&s1, "--checkpoint ckr --shard 1 --read-only");
  char path[1024], err[1024];
  snprintf(path, sizeof path, "%s/plan.json", dir);
  emb_plan *plan = NULL;
  ck_assert_msg(emb_plan_load(path, &plan, err, sizeof err) == 0, "%s", err);
  const char *addr[2] = {s0.addr, s1.addr};
  rpc_client_opts ro = {.deadline_s = 10};
  emb_store *st = emb_store_create_remote(plan, addr, 2, &ro, err, sizeof err);
  ck_assert_msg(st != NULL, "%s", err);
  /* Rows 0..7 of every table (both shards hold some tables). */
  int T = plan->n_tables;
  uint64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const uint64_t *idp[64];
  size_t cnt[64];
  float *before[64], *after[64], *grad[64];
  for (int t = 0; t < T; t++) {
    idp[t] = ids;
    cnt[t] = plan->tables[t].rows < 8 ? plan->tables[t].rows : 8;
    size_t n = cnt[t] * (size_t)plan->tables[t].dim;
    before[t] = calloc(n, 4);
    after[t] = calloc(n, 4);
    grad[t] = malloc(n * 4);
    for (size_t j = 0; j < n; j++) grad[t][j] = 1.0f;
  }
  emb_idset set = {.n_tables = T, .ids = idp, .counts = cnt};
  ck_assert_int_eq(emb_store_lookup_begin(st, 1, &set, before), 0);
  ck_assert_int_eq(emb_store_lookup_wait(st), 0);
  int rc = emb_store_push(st, 1, 0.5f, &set, (const float *const *)grad);
  ck_assert_int_ne(rc, 0);
  const char *msg = emb_store_errmsg(st);
  ck_assert_msg(strstr(msg, "FAILED_PRECONDITION") && strstr(msg, "read-only"), "%s", msg);
  ck_assert_int_eq(emb_store_lookup_begin(st, 2, &set, after), 0);
  ck_assert_int_eq(emb_store_lookup_wait(st), 0);
  int nonzero = 0;
  for (int t = 0; t < T; t++) {
    size_t n = cnt[t] * (size_t)plan->tables[t].dim;
    ck_assert_msg(!memcmp(before[t], after[t], n * 4), "table %d changed after a refused Push", t);
    for (size_t j = 0; j < n; j++) nonzero += before[t][j] != 0;
    free(before[t]);
    free(after[t]);
    free(grad[t]);
  }
  ck_assert_int_gt(nonzero, 0);
  emb_store_destroy(st);
  emb_plan_free(plan);
  /* And the servers still score exactly as the trainer did. */
  free(in_dir(0, "%s predict --checkpoint ckr --shard-servers %s,%s --processed-data-file d.bin "
                 "--data-split test --out pp.tsv", bin_path(), s0.addr, s1.addr));
  assert_same_preds("pp.tsv", "tr.txt", N_TEST);
  ck_assert_int_eq(server_stop(&s0), 0);
  ck_assert_int_eq(server_stop(&s1), 0);
}
END_TEST

/* Training against two in-memory servers under a row-wise plan: the
 * checkpoint holds shards/shard-K/table-<id>.bin per server. Scored in
 * process (rows routed to each shard's folder), by one read-only server of
 * both shards, and by one per shard. */
START_TEST(test_in_memory_servers_checkpoint) {
  free(in_dir(0, "%s plan --processed-data-file d.bin --shards 2 --row-wise --out rw.json", bin_path()));
  test_server m0, m1;
  serve(&m0, "--plan rw.json --shard 0 --checkpoint-root .");
  serve(&m1, "--plan rw.json --shard 1 --checkpoint-root .");
  free(in_dir(0, "%s train --processed-data-file d.bin " MODEL "--plan rw.json --shard-servers %s,%s "
                 "--save-checkpoint ckm --test-pred-out tm.txt > trm.out 2>&1", bin_path(), m0.addr,
              m1.addr));
  ck_assert_int_eq(server_stop(&m0), 0);
  ck_assert_int_eq(server_stop(&m1), 0);
  free(in_dir(0, "ls ckm/step-*/shards/shard-0/table-*.bin ckm/step-*/shards/shard-1/table-*.bin"));
  char *out = in_dir(0, "%s predict --checkpoint ckm --processed-data-file d.bin --data-split test "
                        "--out q.tsv", bin_path());
  ck_assert_msg(strstr(out, "in memory (2 server folders)"), "%s", out);
  assert_same_preds("q.tsv", "tm.txt", N_TEST);
  free(out);
  test_server r01, r0, r1;
  serve(&r01, "--checkpoint ckm --shard 0,1 --read-only");
  serve(&r0, "--checkpoint ckm --shard 0 --read-only");
  serve(&r1, "--checkpoint ckm --shard 1 --read-only");
  free(in_dir(0, "%s predict --checkpoint ckm --shard-servers %s,%s --processed-data-file d.bin "
                 "--data-split test --out q2.tsv && %s predict --checkpoint ckm --shard-servers %s,%s "
                 "--processed-data-file d.bin --data-split test --out q3.tsv", bin_path(), r01.addr,
              r01.addr, bin_path(), r0.addr, r1.addr));
  assert_same_preds("q2.tsv", "tm.txt", N_TEST);
  assert_same_preds("q3.tsv", "tm.txt", N_TEST);
  ck_assert_int_eq(server_stop(&r01), 0);
  ck_assert_int_eq(server_stop(&r0), 0);
  ck_assert_int_eq(server_stop(&r1), 0);
  /* --data-dir with table files: refused, naming the folder. */
  out = in_dir(1, "%s serve --checkpoint ckm --shard 0 --data-dir dd", bin_path());
  ck_assert_msg(strstr(out, "in-memory table files") && strstr(out, "/shards"), "%s", out);
  free(out);
}
END_TEST

int main(void) {
  Suite *s = suite_create("predict_serve");
  TCase *tc = tcase_create("servers");
  tcase_add_unchecked_fixture(tc, setup, remove_data);
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, test_read_only_servers_equal_trainer);
  tcase_add_test(tc, test_push_refused_read_only);
  tcase_add_test(tc, test_in_memory_servers_checkpoint);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
