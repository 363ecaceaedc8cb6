/* End-to-end tests of the RocksDB shard store and checkpoints through the
 * real shardrec binary: bit-identical losses under a small cache with peak
 * memory bounded, exact resume, crash safety, and every refusal. */
#include <check.h>

#include "tests/check_main.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/proc.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static char *dir;

static void setup_data(void) {
  dir = tmpdir_make("test");
  char *out;
  /* Small data for resume tests; uniform ids over 26 tables of 2M rows
   * (modulo ids, no dictionary) for the bounded-memory test. */
#ifdef SHARDREC_BOUNDED_MEMORY_ONLY
  int rc = run_cmd(&out, "cd %s && %s datagen --rows 20000 --seed 5 --uniform --scale 1 --out u.tsv && "
                         "%s convert --test-fraction 0.05 --modulo --max-ind-range 2000000 u.tsv m.bin",
                   dir, bin_path(), bin_path());
#else
  int rc = run_cmd(&out, "cd %s && %s datagen --rows 12000 --seed 3 --out d.tsv && "
                         "%s convert --test-fraction 0.1 d.tsv d.bin",
                   dir, bin_path(), bin_path());
#endif
  ck_assert_msg(rc == 0, "data preparation failed: %s", out);
  free(out);
}

static void teardown_data(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

#define FLAGS "--processed-data-file d.bin --print-freq 1 --mini-batch-size 64 --optimizer adam "

#ifndef SHARDREC_BOUNDED_MEMORY_ONLY
/* Run train with extra flags; returns output, asserts the exit status. */
static char *train(int want_rc, const char *extra) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train " FLAGS "%s", dir, bin_path(), extra);
  ck_assert_msg(rc == want_rc, "train %s: exit %d, wanted %d:\n%s", extra, rc, want_rc, out);
  return out;
}

/* A run of train with extra, exiting want_rc, prints want. */
static void train_says(int want_rc, const char *extra, const char *want) {
  char *out = train(want_rc, extra);
  ck_assert_msg(strstr(out, want) != NULL, "%s", out);
  free(out);
}
#endif

/* The "step":N,...,"loss":X part of train lines with step > from, joined. */
static char *losses(const char *file, int from) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  char *m = slurp(path);
  ck_assert_msg(m != NULL, "no %s", path);
  size_t cap = strlen(m) + 1, n = 0;
  char *res = calloc(cap, 1);
  for (char *line = strtok(m, "\n"); line; line = strtok(NULL, "\n")) {
    if (!strstr(line, "\"kind\":\"train\"")) continue;
    int step = (int)find_num(line, "\"step\":");
    if (step <= from) continue;
    char *l = strstr(line, "\"loss\":"), *e = strstr(line, ",\"lr\"");
    ck_assert(l && e);
    n += (size_t)snprintf(res + n, cap - n, "%d:%.*s;", step, (int)(e - l), l);
  }
  free(m);
  return res;
}

static double test_auc(const char *file) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  char *m = slurp(path);
  const char *last = NULL, *p = m;
  while ((p = strstr(p, "\"kind\":\"test\""))) last = p++;
  ck_assert(last != NULL);
  double auc = find_num(last, "\"auc\":");
  free(m);
  return auc;
}

/* Losses and AUC bit-identical with rows in a 16 MB cache over RocksDB vs
 * all in memory, with 26 x 2M-row tables and ~500k distinct rows touched;
 * the shard run's peak RssAnon stays under cache + 256 MB (and well under
 * the in-memory run's). */
#ifdef SHARDREC_BOUNDED_MEMORY_ONLY
START_TEST(test_bounded_memory_identical) {
  char *o1, *o2;
  const char *f = "--processed-data-file m.bin --print-freq 1 --mini-batch-size 256 --optimizer adagrad "
                  "--learning-rate 0.01 --arch-mlp-bot 13-64-16 --arch-mlp-top 64-1";
  int rc = run_cmd(&o1, "cd %s && %s train %s --metrics-out mem.jsonl", dir, bin_path(), f);
  ck_assert_msg(rc == 0, "%s", o1);
  rc = run_cmd(&o2, "cd %s && %s train %s --metrics-out rocks.jsonl --cache-mb 16", dir, bin_path(), f);
  ck_assert_msg(rc == 0, "%s", o2);
  char *a = losses("mem.jsonl", 0), *b = losses("rocks.jsonl", 0);
  ck_assert_uint_gt(strlen(a), 1000);
  ck_assert_str_eq(a, b);
  ck_assert(test_auc("mem.jsonl") == test_auc("rocks.jsonl"));
  double mem = find_num(o1, "memory peak RssAnon "), rocks = find_num(o2, "memory peak RssAnon ");
  ck_assert_msg(rocks > 0 && mem > 0, "no memory line");
  if (!UNDER_ASAN) { /* ASan's shadow memory counts as anonymous */
    ck_assert_msg(rocks < 16 + 256, "peak RssAnon %.1f MB with a 16 MB cache", rocks);
    ck_assert_msg(rocks * 2 < mem, "shard store %.1f MB vs in-memory %.1f MB", rocks, mem);
  }
  free(a);
  free(b);
  free(o1);
  free(o2);
}
END_TEST
#endif

#ifndef SHARDREC_BOUNDED_MEMORY_ONLY
/* Straight 40 steps vs 20 steps, a checkpoint, SIGKILL, --resume, 20 more:
 * per-step losses and the final test AUC bit-identical. Both stores. */
static void exact_resume(const char *store_flags, const char *tag) {
  char extra[1024];
  snprintf(extra, sizeof extra, "%s --num-batches 40 --metrics-out %s-full.jsonl", store_flags, tag);
  free(train(0, extra));
  /* First half: killed with SIGKILL right after the step-20 checkpoint is
   * complete (the run would go on to 400 steps). */
  char *out;
  int rc = run_cmd(&out,
                   "cd %s && rm -rf %s-ck && (%s train " FLAGS "%s --num-batches 400 --save-checkpoint %s-ck "
                   "--checkpoint-every 20 --metrics-out %s-a.jsonl > %s-a.out 2>&1 & pid=$!; "
                   "for i in $(seq 1 600); do [ -f %s-ck/step-20/DONE ] && break; sleep 0.05; done; "
                   "kill -9 $pid; wait $pid; echo status $?)",
                   dir, tag, bin_path(), store_flags, tag, tag, tag, tag);
  ck_assert_int_eq(rc, 0);
  ck_assert_msg(strstr(out, "status 137") != NULL, "not killed: %s", out);
  free(out);
  /* step-20 by name: a fast model may have completed step-40 before the kill */
  snprintf(extra, sizeof extra, "%s --num-batches 40 --resume %s-ck/step-20 --metrics-out %s-b.jsonl",
           store_flags, tag, tag);
  out = train(0, extra);
  ck_assert_msg(strstr(out, "resume ") != NULL, "%s", out);
  free(out);
  char f1[64], f2[64];
  snprintf(f1, sizeof f1, "%s-full.jsonl", tag);
  snprintf(f2, sizeof f2, "%s-b.jsonl", tag);
  char *a = losses(f1, 20), *b = losses(f2, 0);
  ck_assert_uint_gt(strlen(a), 100);
  ck_assert_str_eq(a, b);
  ck_assert(test_auc(f1) == test_auc(f2));
  free(a);
  free(b);
}

START_TEST(test_exact_resume_shard) { exact_resume("--cache-rows 1024 --prefetch-depth 2", "sh"); }
END_TEST
START_TEST(test_exact_resume_local) { exact_resume("", "lo"); }
END_TEST

/* The cross network end to end: exact resume as above; its manifest names
 * the architecture, so a resume with other --dcn-* flags or another
 * interaction is refused naming both; predict and eval read the architecture
 * from the checkpoint and give train's own test predictions and metrics. */
#define DCN "--arch-mlp-bot 13-32-16 --arch-mlp-top 64-1 --arch-interaction-op dcn " \
            "--dcn-num-layers 2 --dcn-low-rank-dim 8 "
START_TEST(test_dcn_resume_predict) {
  exact_resume(DCN, "dc");
  char *out = train(0, DCN "--num-batches 10 --save-checkpoint dck");
  ck_assert_msg(strstr(out, "dcn interaction"), "%s", out);
  free(out);
  out = train(1, "--arch-mlp-bot 13-32-16 --arch-mlp-top 64-1 --interaction_type dcn "
                 "--dcn_num_layers 3 --dcn_low_rank_dim 8 --num-batches 20 --resume dck");
  ck_assert_msg(strstr(out, "manifest.json: written for a cross network of 2 layers of rank 8; "
                            "this run has --dcn-num-layers 3 --dcn-low-rank-dim 8"), "%s", out);
  free(out);
  out = train(1, DCN "--dcn-low-rank-dim 4 --num-batches 20 --resume dck");
  ck_assert_msg(strstr(out, "this run has --dcn-num-layers 2 --dcn-low-rank-dim 4"), "%s", out);
  free(out);
  out = train(1, "--arch-mlp-bot 13-32-16 --arch-mlp-top 64-1 --num-batches 20 --resume dck");
  ck_assert_msg(strstr(out, "dcn interaction there, dot here"), "%s", out);
  free(out);
  /* predict and eval of a saved dcn model: train's bits */
  free(train(0, DCN "--num-batches 30 --save-model dm --test-pred-out dtr.txt"));
  int rc = run_cmd(&out, "cd %s && %s predict --checkpoint dm --processed-data-file d.bin "
                         "--data-split test --out dp.txt && cmp dp.txt dtr.txt && "
                         "%s eval --checkpoint dm --processed-data-file d.bin",
                   dir, bin_path(), bin_path());
  ck_assert_msg(rc == 0 && strstr(out, "auc "), "exit %d:\n%s", rc, out);
  free(out);
}
END_TEST

/* The default cross network fits the cross input's width 27 x dim: 3
 * layers of rank the power of two nearest 27 x dim / 8, at most 64 (16 at
 * dim 4, 64 at dim 16, 64, 128 and 256). With no --dcn-* flags a resume takes the cross
 * network the checkpoint records instead: one of 3 layers of rank 512
 * (TorchRec's numbers, given here) resumes, and predict and eval score the
 * model it saves with train's own test predictions; one of 2 layers of rank
 * 8 too. A flag given is the run's: the number not given comes from the
 * checkpoint, and one that differs from it is refused naming both. */
#define DCN_BARE "--arch-mlp-bot 13-32-16 --arch-mlp-top 64-1 --arch-interaction-op dcn "
START_TEST(test_dcn_resume_shape) {
  const char *dims[][2] = {{"4", "16"}, {"16", "64"}, {"64", "64"}, {"128", "64"}, {"256", "64"}};
  for (int i = 0; i < 5; i++) {
    char extra[256], want[64];
    snprintf(extra, sizeof extra, "--arch-sparse-feature-size %s --arch-mlp-bot 13-32-%s "
             "--arch-mlp-top 64-1 --arch-interaction-op dcn --num-batches 1", dims[i][0], dims[i][0]);
    snprintf(want, sizeof want, "dcn interaction (3 cross layers of rank %s);", dims[i][1]);
    train_says(0, extra, want);
  }
  free(train(0, DCN_BARE "--dcn-num-layers 3 --dcn-low-rank-dim 512 --num-batches 10 "
                         "--save-checkpoint wck"));
  train_says(0, DCN_BARE "--num-batches 20 --resume wck --save-model wm --test-pred-out wtr.txt",
             "dcn interaction (3 cross layers of rank 512)");
  char *out;
  int rc = run_cmd(&out, "cd %s && test -f wm/step-20/DONE && grep -q '\"dcn_rank\":[[:space:]]*512' "
                         "wm/step-20/manifest.json && %s predict --checkpoint wm --processed-data-file "
                         "d.bin --data-split test --out wp.txt && cmp wp.txt wtr.txt && "
                         "%s eval --checkpoint wm --processed-data-file d.bin",
                   dir, bin_path(), bin_path());
  ck_assert_msg(rc == 0 && strstr(out, "auc "), "exit %d:\n%s", rc, out);
  free(out);
  free(train(0, DCN "--num-batches 10 --save-checkpoint nck"));
  train_says(0, DCN_BARE "--num-batches 20 --resume nck/step-10",
             "dcn interaction (2 cross layers of rank 8)");
  train_says(0, DCN_BARE "--dcn-low-rank-dim 8 --num-batches 20 --resume nck/step-10",
             "dcn interaction (2 cross layers of rank 8)");
  train_says(1, DCN_BARE "--dcn-num-layers 3 --num-batches 20 --resume nck/step-10",
             "written for a cross network of 2 layers of rank 8; this run has "
             "--dcn-num-layers 3 --dcn-low-rank-dim 8");
}
END_TEST

/* A checkpoint its writer did not finish leaves the previous one usable and
 * the torn one refused. The test writes each half-written state itself from
 * a complete step-20 (what a writer stopped at that point leaves behind):
 *   c1: still in the temporary folder (.step-20.tmp-PID: dense.bin and the
 *       shards, no manifest, no DONE);
 *   c2: renamed into place, DONE not yet written;
 *   c3: DONE holding another manifest's SHA-256;
 *   c4: a flipped byte in step-20's dense.bin. */
START_TEST(test_crash_safety) {
  free(train(0, "--cache-rows 1024 --num-batches 20 --save-checkpoint c --checkpoint-every 10"));
  char *out;
  int rc = run_cmd(&out, "cd %s && test -f c/step-10/DONE && test -f c/step-20/DONE && "
                         "rm -rf c1 c2 c3 c4 && "
                         "cp -r c c1 && mv c1/step-20 c1/.step-20.tmp-4242 && "
                         "rm c1/.step-20.tmp-4242/DONE c1/.step-20.tmp-4242/manifest.json && "
                         "cp -r c c2 && rm c2/step-20/DONE && "
                         "cp -r c c3 && sha256sum c3/step-10/manifest.json | cut -c1-64 > c3/step-20/DONE && "
                         "cp -r c c4 && printf 'X' | dd of=c4/step-20/dense.bin bs=1 seek=300 conv=notrunc 2>/dev/null",
                   dir);
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  free(train(0, "--cache-rows 1024 --num-batches 40 --metrics-out full.jsonl"));
  /* --resume DIR takes step-10, the newest complete one, and continues exactly. */
  train_says(0, "--cache-rows 1024 --num-batches 40 --resume c1 --metrics-out r1.jsonl",
             "c1/step-10: step 10");
  train_says(0, "--cache-rows 1024 --num-batches 40 --resume c2 --metrics-out r2.jsonl",
             "c2/step-10: step 10");
  char *a = losses("full.jsonl", 10), *b = losses("r1.jsonl", 0), *c = losses("r2.jsonl", 0);
  ck_assert_uint_gt(strlen(a), 200);
  ck_assert_str_eq(a, b);
  ck_assert_str_eq(a, c);
  free(a);
  free(b);
  free(c);
  /* The torn one named directly is refused, naming DONE. */
  train_says(1, "--cache-rows 1024 --num-batches 40 --resume c2/step-20", "c2/step-20/DONE: missing");
  /* The temporary folder is no checkpoint, named directly either. */
  train_says(1, "--cache-rows 1024 --num-batches 40 --resume c1/.step-20.tmp-4242",
             "c1/.step-20.tmp-4242: no complete checkpoint");
  /* A DONE that does not hold the manifest's SHA-256: step-20 is the newest
   * marked one, and it is refused, not skipped silently. */
  out = train(1, "--cache-rows 1024 --num-batches 40 --resume c3");
  ck_assert_msg(strstr(out, "c3/step-20/manifest.json: checksum does not match the one in DONE") != NULL,
                "%s", out);
  free(out);
  train_says(1, "--cache-rows 1024 --num-batches 40 --resume c4",
             "c4/step-20/dense.bin: checksum mismatch (file damaged)");
  /* A later save over c1 writes step-20 afresh beside the leftover. */
  free(train(0, "--cache-rows 1024 --num-batches 20 --resume c1 --save-checkpoint c1"));
  rc = run_cmd(&out, "cd %s && cmp c/step-20/dense.bin c1/step-20/dense.bin && echo same", dir);
  ck_assert_msg(rc == 0 && strstr(out, "same"), "%s", out);
  free(out);
}
END_TEST

/* Every refusal names the file and the problem. */
START_TEST(test_refusals) {
  free(train(0, "--cache-rows 1024 --num-batches 10 --save-checkpoint r --data-dir live"));
  char *out;
  /* inspect: the checkpoint's manifest, tables, rows; a row by id. */
  int rc0 = run_cmd(&out, "cd %s && %s inspect r && %s inspect r/step-10 --table 0 --rows 0,1,2,3,4,5,6,7",
                    dir, bin_path(), bin_path());
  ck_assert_msg(rc0 == 0, "%s", out);
  ck_assert_msg(strstr(out, "checkpoint r/step-10 (complete)") && strstr(out, "step 10, epoch 0") &&
                    strstr(out, "shard-0  table_id 25") && strstr(out, "row layout v1: dim 16") &&
                    strstr(out, "(table_id 0, shard-0): value ["),
                "%s", out);
  ck_assert(find_num(out, "total ") > 100);
  free(out);
  /* The live data folder holds databases: a fresh run is refused. */
  train_says(1, "--cache-rows 1024 --num-batches 10 --data-dir live", "holds shard databases");
  /* An --auto-resume job stopped before its first checkpoint (its steps
   * removed here) starts again on the databases it made: they are its own
   * (claimed for its --save-checkpoint folder), removed, and the job ends
   * as one never stopped; another --auto-resume job is still refused them. */
  free(train(0, "--cache-rows 1024 --num-batches 6 --data-dir ar --save-checkpoint arck "
                "--auto-resume"));
  free(train(0, "--cache-rows 1024 --num-batches 6 --data-dir ar0 --save-checkpoint ar0ck"));
  int rc1 = run_cmd(&out, "cd %s && rm -r arck/step-6 && ls ar/shard-0/CURRENT", dir);
  ck_assert_msg(rc1 == 0, "%s", out);
  free(out);
  train_says(1, "--cache-rows 1024 --num-batches 6 --data-dir ar --save-checkpoint other "
                "--auto-resume", "holds shard databases of an earlier run (ar/shard-0)");
  train_says(0, "--cache-rows 1024 --num-batches 6 --data-dir ar --save-checkpoint arck "
                "--auto-resume", "note   --data-dir ar: ar/shard-0, left by a start of this job "
                "before its first checkpoint in arck: removed, the job starts afresh");
  rc1 = run_cmd(&out, "cd %s && cmp arck/step-6/dense.bin ar0ck/step-6/dense.bin", dir);
  ck_assert_msg(rc1 == 0, "%s", out);
  free(out);
  /* ... and --resume replaces them from the checkpoint. */
  out = train(0, "--cache-rows 1024 --num-batches 12 --data-dir live --resume r");
  free(out);
  /* Missing. */
  train_says(1, "--cache-rows 1024 --num-batches 10 --resume nowhere", "nowhere: no such checkpoint folder");
  /* Other model (seed). */
  train_says(1, "--cache-rows 1024 --num-batches 20 --seed 7 --resume r",
             "manifest.json: written for model fingerprint");
  /* Other store kind, and what the flags would have to say. */
  train_says(1, "--num-batches 20 --resume r",
             "holds rows of the shard store; this run uses the local store (add --data-dir");
  train_says(1, "--num-batches 20 --colocate-shards --resume r",
             "holds rows of the shard store; this run uses the remote store (drop --shard-servers "
             "or --colocate-shards, give --data-dir");
  /* Other batch size. */
  train_says(1, "--cache-rows 1024 --num-batches 20 --resume r --mini-batch-size 32", "--mini-batch-size 64");
  /* A damaged dense file (same size). */
  int rc = run_cmd(&out, "cd %s && cp -r r/step-10 bad1 && printf 'X' | dd of=bad1/dense.bin bs=1 seek=300 "
                         "conv=notrunc 2>/dev/null && %s train " FLAGS "--cache-rows 1024 --num-batches 20 --resume bad1",
                   dir, bin_path());
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "bad1/dense.bin: checksum mismatch") != NULL, "%s", out);
  free(out);
  /* A torn shard file. */
  rc = run_cmd(&out, "cd %s && cp -r r/step-10 bad2 && f=$(ls bad2/shards/shard-0/*.sst | head -1) && "
                     "truncate -s 100 $f && %s train " FLAGS "--cache-rows 1024 --num-batches 20 --resume bad2",
               dir, bin_path());
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, ".sst: 100 bytes, the manifest says") != NULL, "%s", out);
  free(out);
  /* A missing shard file. */
  rc = run_cmd(&out, "cd %s && cp -r r/step-10 bad3 && rm bad3/shards/shard-0/CURRENT && %s train " FLAGS
                     "--cache-rows 1024 --num-batches 20 --resume bad3",
               dir, bin_path());
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "bad3/shards/shard-0/CURRENT: missing") != NULL, "%s", out);
  free(out);
  /* An edited manifest. */
  rc = run_cmd(&out, "cd %s && cp -r r/step-10 bad4 && sed -i 's/\"step\":\t10/\"step\":\t11/' bad4/manifest.json && "
                     "%s train " FLAGS "--cache-rows 1024 --num-batches 20 --resume bad4",
               dir, bin_path());
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "bad4/manifest.json: checksum does not match") != NULL, "%s", out);
  free(out);
  /* --keep-checkpoints: only the newest K remain, beside the plan made by
   * the run (no --plan-out: written into the checkpoint folder and nowhere
   * else, so none lands in the current folder). */
  rc = run_cmd(&out, "cd %s && rm -f plan.json", dir);
  free(out);
  train_says(0, "--cache-rows 1024 --num-batches 30 --save-checkpoint k --checkpoint-every 5 --keep-checkpoints 2",
             "plan   k/plan.json (written): ");
  rc = run_cmd(&out, "cd %s && ls k && test ! -e plan.json", dir);
  ck_assert_msg(rc == 0 && !strcmp(out, "plan.json\nstep-25\nstep-30\n"), "%s", out);
  free(out);
  /* The plan written there is the checkpoint's (resume checks the plan's
   * fingerprints against the manifest's). */
  free(train(0, "--cache-rows 1024 --num-batches 31 --plan k/plan.json --resume k"));
}
END_TEST

#endif

int main(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("e2e");
  tcase_add_unchecked_fixture(tc, setup_data, teardown_data);
  tcase_set_timeout(tc, 300);
#ifdef SHARDREC_BOUNDED_MEMORY_ONLY /* test_bounded_memory: integration (slow under ASan) */
  tcase_add_test(tc, test_bounded_memory_identical);
#else
  tcase_add_test(tc, test_exact_resume_shard);
  tcase_add_test(tc, test_exact_resume_local);
  tcase_add_test(tc, test_crash_safety);
  tcase_add_test(tc, test_refusals);
  tcase_add_test(tc, test_dcn_resume_predict);
  TCase *dcn = tcase_create("dcn");
  tcase_add_unchecked_fixture(dcn, setup_data, teardown_data);
  tcase_set_timeout(dcn, 300);
  tcase_add_test(dcn, test_dcn_resume_shape);
  suite_add_tcase(s, dcn);
#endif
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
