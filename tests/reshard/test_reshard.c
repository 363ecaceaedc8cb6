/* shardrec reshard, end to end with the real binary.
 *
 * test_reshard (fast, in-process RocksDB shard store):
 *   - a 2-shard table-wise checkpoint resharded to 3 shards row-wise resumes
 *     with the per-step losses of the run that never left 2 shards;
 *   - (verification catching a changed or dropped row is
 *     test_reshard_ckpt's: the library's row hook);
 *   - refusals: a torn source (no DONE, a damaged file), a plan of another
 *     model (dim, rows, pooling, init, optimizer, seed, precision, keep:
 *     each named), an
 *     existing OUT (and --force replacing it), usage;
 *   - the in-memory trainer's table files: resharded in their layout,
 *     resumed bit for bit.
 * test_reshard_servers (integration): resharding with real
 *   shard servers: 2 servers, checkpoint at step k, reshard to 3 row-wise
 *   and to 1, resume against 3 (1) servers: steps k+1..2k and the test line
 *   string-equal to the 2-server run; 3 -> 2 again gives the original
 *   shard databases row for row, byte for byte. Then in-memory servers
 *   (table files per server): 2 -> 3, resumed bit for bit. */
#include <check.h>
#include <dirent.h>
#include <sys/stat.h>

#include "tests/check_main.h"

#include "storage/kv.h"
#include "tests/support/servers.h"

static char *dir;

static void setup(void) {
  dir = make_data_dir(6000, 5,
                      "%s train --processed-data-file d.bin --num-batches 1 --seed 17 --optimizer adagrad "
                      "--plan-out p1.json && "
                      "/usr/bin/python3 -c \"\n"
                      "import json\n"
                      "p = json.load(open('p1.json'))\n"
                      "p['n_shards'] = 2\n"
                      "for i, t in enumerate(p['tables']): t['placement'] = {'kind': 'table', 'shards': [i %% 2]}\n"
                      "json.dump(p, open('p2.json', 'w'), indent=1)\n"
                      "p['n_shards'] = 3\n"
                      "for t in p['tables']: t['placement'] = {'kind': 'row', 'shards': [0, 1, 2]}\n"
                      "json.dump(p, open('p3.json', 'w'), indent=1)\n\"",
                      bin_path());
}

static void teardown(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

#define TRAIN_FLAGS                                                                       \
  "--processed-data-file d.bin --print-freq 1 --mini-batch-size 64 --optimizer adagrad " \
  "--learning-rate 0.01 --sparse-learning-rate 0.1"

/* Lines of a metrics file after step `after`: kind, step and the exact
 * text of every loss/metric field (timings dropped). */
static __attribute__((unused)) char *steps_after(const char *metrics, int after) {
  char *out;
  int rc = run_cmd(&out, "cd %s && /usr/bin/python3 -c \"\n"
                         "import json, re\n"
                         "for l in open('%s'):\n"
                         "    j = json.loads(l)\n"
                         "    if j['step'] <= %d: continue\n"
                         "    f = re.findall(r'\\\"(loss|last_loss|auc|logloss|accuracy)\\\":([^,}]*)', l)\n"
                         "    print(j['kind'], j['step'], f)\"",
                   dir, metrics, after);
  ck_assert_msg(rc == 0, "%s", out);
  return out;
}

static __attribute__((unused)) int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static __attribute__((unused)) int path_exists(const char *rel) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, rel);
  struct stat st;
  return lstat(p, &st) == 0;
}

/* No OUT.tmp-* left beside OUT. */
static __attribute__((unused)) int tmp_left(void) {
  DIR *d = opendir(dir);
  struct dirent *de;
  int n = 0;
  while ((de = readdir(d))) n += strstr(de->d_name, ".tmp-") != NULL;
  closedir(d);
  return n;
}

/* An in-process shard-store run of 2k steps on p2.json checkpointing at k
 * and 2k (ck/step-k, ck/step-2k), its metrics in ref.jsonl. */
static __attribute__((unused)) void make_ckpt(int k) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train " TRAIN_FLAGS " --num-batches %d --plan p2.json "
                         "--data-dir dd2 --cache-rows 4096 --save-checkpoint ck --checkpoint-every %d "
                         "--keep-checkpoints 0 --metrics-out ref.jsonl",
                   dir, bin_path(), 2 * k, k);
  ck_assert_msg(rc == 0, "train failed: %s", out);
  free(out);
}

#ifndef SHARDREC_RESHARD_SERVERS
static void setup_with_ckpt(void) {
  setup();
  make_ckpt(4);
}

START_TEST(test_reshard_resume_in_process) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s reshard --from ck/step-4 --to o3 --plan p3.json", dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  /* The summary: rows, MB, seconds, rates, every table verified. */
  ck_assert_msg(strstr(out, "resharded ") && strstr(out, " rows/s, ") && strstr(out, " MB/s") &&
                    strstr(out, "verified 26/26 tables ok") && strstr(out, "ckpt   o3/step-4"),
                "%s", out);
  ck_assert_ptr_null(strstr(out, "MISMATCH"));
  ck_assert_ptr_null(strstr(out, "ETA")); /* no progress line off a terminal */
  ck_assert_msg(find_num(out, "resharded ") > 100, "%s", out);
  free(out);
  ck_assert(path_exists("o3/step-4/DONE") && path_exists("o3/step-4/shards/shard-2/CURRENT"));
  ck_assert_int_eq(tmp_left(), 0);
  rc = run_cmd(&out, "cd %s && %s train " TRAIN_FLAGS " --num-batches 8 --plan p3.json --data-dir dd3 "
                     "--cache-rows 4096 --resume o3 --metrics-out r3.jsonl",
               dir, bin_path());
  ck_assert_msg(rc == 0 && strstr(out, "resume o3/step-4: step 4"), "%s", out);
  free(out);
  char *want = steps_after("ref.jsonl", 4), *got = steps_after("r3.jsonl", 4);
  ck_assert_int_eq(count_lines(want), 5); /* steps 5..8 and the test line */
  ck_assert_msg(strcmp(want, got) == 0, "resumed on 3 shards:\n%s\nstayed on 2:\n%s", got, want);
  free(want);
  free(got);
}
END_TEST

/* Write plan name from p2.json with one change (a python statement on p). */
static __attribute__((unused)) void edit_plan(const char *name, const char *stmt) {
  char *out;
  int rc = run_cmd(&out, "cd %s && /usr/bin/python3 -c \"\n"
                         "import json\n"
                         "p = json.load(open('p3.json'))\n"
                         "%s\n"
                         "json.dump(p, open('%s', 'w'))\"",
                   dir, stmt, name);
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
}

START_TEST(test_reshard_refusals) {
  char *out;
  /* Another model: each field named. */
  static const struct {
    const char *stmt, *says;
  } mod[] = {
      {"p['tables'][2]['dim'] = 8", "tables[2] (table_id 2, t2): dim 16 vs 8"},
      {"p['tables'][3]['rows'] += 1", "tables[3] (table_id 3, t3): rows"},
      {"p['tables'][1]['pooling'] = 'mean'", "tables[1] (table_id 1, t1): pooling sum vs mean"},
      {"p['tables'][4]['init_range'] = 0.5", "tables[4] (table_id 4, t4): init_range"},
      {"p['tables'][5]['optimizer'] = {'name': 'sgd'}", "tables[5] (table_id 5, t5): optimizer adagrad vs sgd"},
      {"p['seed'] = '18'", "seed 17 vs 18"},
      {"p['tables'][0]['precision'] = 'fp16'",
       "tables[0] (table_id 0, t0): precision fp32 vs fp16 (reshard --precision converts)"},
      {"p['tables'][1]['keep'] = {'expire_after': 50}", "tables[1] (table_id 1, t1): keep.expire_after 0 vs 50"},
      {"p['tables'][2]['keep'] = {'capacity': 60, 'evict': 'lfu'}",
       "tables[2] (table_id 2, t2): keep.capacity 0 vs 60"},
  };
  for (size_t i = 0; i < sizeof mod / sizeof mod[0]; i++) {
    edit_plan("pm.json", mod[i].stmt);
    int rc = run_cmd(&out, "cd %s && %s reshard --from ck --to o --plan pm.json", dir, bin_path());
    ck_assert_msg(rc == 1 && strstr(out, "describes another model") && strstr(out, mod[i].says),
                  "%s: exit %d: %s", mod[i].stmt, rc, out);
    free(out);
    ck_assert(!path_exists("o"));
  }
  /* OUT holds a file no checkpoint holds: refused, --force or not. */
  run_cmd(NULL, "mkdir -p %s/o && touch %s/o/marker", dir, dir);
  int rc;
  for (int force = 0; force < 2; force++) {
    rc = run_cmd(&out, "cd %s && %s reshard --from ck --to o --plan p3.json%s", dir, bin_path(),
                 force ? " --force" : "");
    ck_assert_msg(rc == 1 && strstr(out, "--to o: holds marker, which is not part of a checkpoint"),
                  "%s", out);
    free(out);
    ck_assert(path_exists("o/marker") && !path_exists("o/step-8"));
  }
  /* OUT a folder of checkpoints: refused; --force replaces it once the new
   * one is complete. */
  run_cmd(NULL, "mv %s/o/marker %s/o/plan.json", dir, dir);
  rc = run_cmd(&out, "cd %s && %s reshard --from ck --to o --plan p3.json", dir, bin_path());
  ck_assert_msg(rc == 1 && strstr(out, "--to o: already exists") && strstr(out, "--force"), "%s", out);
  free(out);
  ck_assert(path_exists("o/plan.json"));
  rc = run_cmd(&out, "cd %s && %s reshard --from ck --to o --plan p3.json --force", dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  ck_assert(!path_exists("o/plan.json") && path_exists("o/step-8/DONE"));
  /* On a terminal (script(1) gives it one), the progress line. */
  rc = run_cmd(&out, "cd %s && script -qec \"%s reshard --from ck --to otty --plan p3.json\" /dev/null",
               dir, bin_path());
  ck_assert_msg(rc == 0 && strstr(out, "reshard: ") && strstr(out, " rows (") && strstr(out, "MB, ") &&
                    strstr(out, "rows/s, ETA "), "%s", out);
  free(out);
  /* --from ck took the newest complete step (8). A torn source: no DONE
   * (a copy of step-4 without its marker), then a damaged file. */
  run_cmd(NULL, "cp -r %s/ck/step-4 %s/torn && rm %s/torn/DONE", dir, dir, dir);
  rc = run_cmd(&out, "cd %s && %s reshard --from torn --to o2 --plan p3.json", dir, bin_path());
  ck_assert_msg(rc == 1 && strstr(out, "torn/DONE: missing") && strstr(out, "incomplete"), "%s", out);
  free(out);
  run_cmd(NULL, "rm -rf %s/torn && cp -r %s/ck/step-4 %s/torn && "
                "f=$(ls %s/torn/shards/shard-0/*.sst | head -1) && "
                "printf 'X' | dd of=$f bs=1 seek=100 conv=notrunc 2>/dev/null",
          dir, dir, dir, dir);
  rc = run_cmd(&out, "cd %s && %s reshard --from torn --to o2 --plan p3.json", dir, bin_path());
  ck_assert_msg(rc == 1 && strstr(out, "torn/shards/shard-0/") && strstr(out, "checksum mismatch (file damaged)"),
                "%s", out);
  free(out);
  ck_assert(!path_exists("o2"));
  ck_assert_int_eq(tmp_left(), 0);
  /* Usage. */
  rc = run_cmd(&out, "%s reshard --from %s/ck --to %s/o2", bin_path(), dir, dir);
  ck_assert_msg(rc == 2 && strstr(out, "--plan are required"), "%s", out);
  free(out);
  rc = run_cmd(&out, "%s reshard --bogus", bin_path());
  ck_assert_msg(rc == 2 && strstr(out, "unknown option --bogus"), "%s", out);
  free(out);
}
END_TEST


/* The in-memory trainer's checkpoint (table files): resharded in its own
 * layout, resumed bit for bit. */
START_TEST(test_reshard_table_files) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train " TRAIN_FLAGS " --num-batches 8 --plan p2.json "
                         "--save-checkpoint mem --checkpoint-every 4 --keep-checkpoints 0 "
                         "--metrics-out mref.jsonl && "
                         "%s reshard --from mem/step-4 --to mo3 --plan p3.json",
                   dir, bin_path(), bin_path());
  ck_assert_msg(rc == 0 && strstr(out, "the in-memory trainer's table files") &&
                    strstr(out, "verified 26/26 tables ok"), "%s", out);
  free(out);
  ck_assert(path_exists("mo3/step-4/shards/table-0.bin") && !path_exists("mo3/step-4/shards/shard-0"));
  rc = run_cmd(&out, "cd %s && %s train " TRAIN_FLAGS " --num-batches 8 --plan p3.json --resume mo3 "
                     "--metrics-out m3.jsonl", dir, bin_path());
  ck_assert_msg(rc == 0 && strstr(out, "resume mo3/step-4: step 4"), "%s", out);
  free(out);
  char *want = steps_after("mref.jsonl", 4), *got = steps_after("m3.jsonl", 4);
  ck_assert_int_eq(count_lines(want), 5);
  ck_assert_msg(strcmp(want, got) == 0, "resumed:\n%s\nstayed:\n%s", got, want);
  free(want);
  free(got);
}
END_TEST
#endif

/* ---- resharding, with shard servers ---- */

/* Every row of every table of a and b's shard databases, byte for byte. */
static __attribute__((unused)) void same_shards(const char *a, const char *b, int n_shards) {
  for (int k = 0; k < n_shards; k++) {
    char pa[1024], pb[1024], err[512];
    snprintf(pa, sizeof pa, "%s/%s/shard-%d", dir, a, k);
    snprintf(pb, sizeof pb, "%s/%s/shard-%d", dir, b, k);
    uint32_t *ids;
    int n;
    ck_assert_msg(kv_list_tables(pa, &ids, &n, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(n, 26);
    kv_opts o = {.read_only = 1};
    kv_db *da, *db;
    ck_assert_msg(kv_open(pa, n, ids, &o, &da, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(kv_open(pb, n, ids, &o, &db, err, sizeof err) == 0, "%s", err);
    uint64_t rows = 0;
    for (int t = 0; t < n; t++) {
      kv_iter *x = kv_iter_create(da, t), *y = kv_iter_create(db, t);
      for (; kv_iter_valid(x); kv_iter_next(x), kv_iter_next(y)) {
        ck_assert_msg(kv_iter_valid(y), "%s: table %u: fewer rows than %s", pb, ids[t], pa);
        ck_assert_msg(kv_iter_key(x) == kv_iter_key(y), "%s vs %s: table %u: row %llu vs %llu", pa,
                      pb, ids[t], (unsigned long long)kv_iter_key(x),
                      (unsigned long long)kv_iter_key(y));
        size_t lx, ly;
        const char *vx = kv_iter_value(x, &lx), *vy = kv_iter_value(y, &ly);
        ck_assert_msg(lx == ly && memcmp(vx, vy, lx) == 0, "table %u row %llu differs", ids[t],
                      (unsigned long long)kv_iter_key(x));
        rows++;
      }
      ck_assert_msg(!kv_iter_valid(y), "%s: table %u: more rows than %s", pb, ids[t], pa);
      kv_iter_destroy(x);
      kv_iter_destroy(y);
    }
    ck_assert_msg(rows > 50, "shard %d: only %llu rows compared", k, (unsigned long long)rows);
    kv_close(da);
    kv_close(db);
    free(ids);
  }
}

#ifdef SHARDREC_RESHARD_SERVERS
START_TEST(test_reshard_servers_resume) {
  const int k = 5;
  char *out, list[256];
  /* The reference: 2 servers, a checkpoint at step k, 2k steps. */
  test_server s[3];
  servers_start(s, 2, &(servers_opts){.dir = dir, .plan = "p2.json", .data = "a", .log = "a"});
  servers_addrs(s, 2, list, sizeof list);
  int rc = run_cmd(&out, "cd %s && %s train " TRAIN_FLAGS " --num-batches %d --plan p2.json "
                         "--shard-servers %s --save-checkpoint C --checkpoint-every %d "
                         "--keep-checkpoints 0 --metrics-out ref.jsonl",
                   dir, bin_path(), 2 * k, list, k);
  for (int i = 0; i < 2; i++) ck_assert_int_eq(server_stop(&s[i]), 0);
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  char *want = steps_after("ref.jsonl", k);
  ck_assert_int_eq(count_lines(want), k + 1);
  /* To 3 shards row-wise and to 1 shard; resume on as many servers. */
  const char *plans[2] = {"p3.json", "p1.json"};
  const int n_srv[2] = {3, 1};
  for (int c = 0; c < 2; c++) {
    rc = run_cmd(&out, "cd %s && %s reshard --from C/step-%d --to O%d --plan %s", dir, bin_path(), k,
                 n_srv[c], plans[c]);
    ck_assert_msg(rc == 0 && strstr(out, "verified 26/26 tables ok"), "%s", out);
    free(out);
    char tag[8];
    snprintf(tag, sizeof tag, "b%d", n_srv[c]);
    servers_start(s, n_srv[c], &(servers_opts){.dir = dir, .plan = plans[c], .data = tag, .log = tag});
    servers_addrs(s, n_srv[c], list, sizeof list);
    rc = run_cmd(&out, "cd %s && %s train " TRAIN_FLAGS " --num-batches %d --plan %s "
                       "--shard-servers %s --resume O%d --metrics-out r%d.jsonl",
                 dir, bin_path(), 2 * k, plans[c], list, n_srv[c], n_srv[c]);
    for (int i = 0; i < n_srv[c]; i++) ck_assert_int_eq(server_stop(&s[i]), 0);
    ck_assert_msg(rc == 0 && strstr(out, "resume O"), "%s", out);
    free(out);
    char name[32];
    snprintf(name, sizeof name, "r%d.jsonl", n_srv[c]);
    char *got = steps_after(name, k);
    ck_assert_msg(strcmp(want, got) == 0, "resumed on %d server(s):\n%s\nstayed on 2:\n%s", n_srv[c],
                  got, want);
    free(got);
  }
  free(want);
  /* 3 -> 2 again: the original shard databases, row for row. */
  rc = run_cmd(&out, "cd %s && %s reshard --from O3 --to O2 --plan p2.json", dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  char a[64], b[64];
  snprintf(a, sizeof a, "C/step-%d/shards", k);
  snprintf(b, sizeof b, "O2/step-%d/shards", k);
  same_shards(a, b, 2);
  /* And the manifests agree on everything the plan decides. */
  rc = run_cmd(&out, "cd %s && /usr/bin/python3 -c \"\n"
                     "import json\n"
                     "a = json.load(open('C/step-%d/manifest.json'))\n"
                     "b = json.load(open('O2/step-%d/manifest.json'))\n"
                     "for f in ('plan_fingerprint', 'model_fingerprint', 'step', 'epoch', 'sample_index', 'settings', 'dense', 'store'):\n"
                     "    assert a.get(f) == b.get(f), f\n"
                     "fa = {x['path']: x['sha256'] for x in a['files']}\n"
                     "fb = {x['path']: x['sha256'] for x in b['files']}\n"
                     "assert fa['dense.bin'] == fb['dense.bin']\n"
                     "print('manifests agree')\"", dir, k, k);
  ck_assert_msg(rc == 0 && strstr(out, "manifests agree"), "%s", out);
  free(out);
  /* In-memory servers: their checkpoint is one folder of table files per
   * server; 2 -> 3 keeps that layout, resumed bit for bit. */
  servers_start(s, 2, &(servers_opts){.dir = dir, .plan = "p2.json", .log = "mem"}); /* in memory */
  servers_addrs(s, 2, list, sizeof list);
  rc = run_cmd(&out, "cd %s && %s train " TRAIN_FLAGS " --num-batches %d --plan p2.json "
                     "--shard-servers %s --save-checkpoint MC --checkpoint-every %d "
                     "--keep-checkpoints 0 --metrics-out mref.jsonl",
               dir, bin_path(), 2 * k, list, k);
  for (int i = 0; i < 2; i++) ck_assert_int_eq(server_stop(&s[i]), 0);
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  rc = run_cmd(&out, "cd %s && %s reshard --from MC/step-%d --to MO3 --plan p3.json", dir, bin_path(), k);
  ck_assert_msg(rc == 0 && strstr(out, "in-memory servers' table files") &&
                    strstr(out, "verified 26/26 tables ok"), "%s", out);
  free(out);
  servers_start(s, 3, &(servers_opts){.dir = dir, .plan = "p3.json", .log = "mem"});
  servers_addrs(s, 3, list, sizeof list);
  rc = run_cmd(&out, "cd %s && %s train " TRAIN_FLAGS " --num-batches %d --plan p3.json "
               "--shard-servers %s --resume MO3 --metrics-out mr3.jsonl",
               dir, bin_path(), 2 * k, list);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(server_stop(&s[i]), 0);
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  want = steps_after("mref.jsonl", k);
  char *got = steps_after("mr3.jsonl", k);
  ck_assert_int_eq(count_lines(want), k + 1);
  ck_assert_msg(strcmp(want, got) == 0, "in-memory servers, resumed on 3:\n%s\nstayed on 2:\n%s", got, want);
  free(want);
  free(got);
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("reshard");
#ifdef SHARDREC_RESHARD_SERVERS
  TCase *tc = tcase_create("servers");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_reshard_servers_resume);
#else
  TCase *tc = tcase_create("reshard");
  tcase_set_timeout(tc, 180);
  /* One data set and one checkpoint (steps 4 and 8) for the three tests,
   * made once (each test writes its own outputs). */
  tcase_add_unchecked_fixture(tc, setup_with_ckpt, teardown);
  tcase_add_test(tc, test_reshard_resume_in_process);
  tcase_add_test(tc, test_reshard_refusals);
  tcase_add_test(tc, test_reshard_table_files);
#endif
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
