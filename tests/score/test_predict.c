/* shardrec predict with the rows in process (no servers): the trainer's own
 * test predictions (train --test-pred-out) reproduced string for string from
 * a RocksDB-layout checkpoint and from an in-memory one read from raw data,
 * the metrics equal the trainer's, --no-label input (raw, and converted:
 * scored, never evaluated or trained on), malformed lines kept
 * aligned as "nan", and every refusal (torn checkpoint, wrong server count,
 * a --plan of another fingerprint, bad flags). */
#include <check.h>
#include <unistd.h>

#include "tests/check_main.h"
#include "tests/score/common.h"

/* 1000 test samples (10% of 10000 lines). */
#define N_TEST 1000
#define N_ALL 10000

static void setup(void) {
  make_data();
  /* ckr: 2 shards in RocksDB (the shard store); ckl: 2 shards in memory,
   * trained on the raw TSV (its dictionary built from the train part). */
  free(in_dir(0, "%s train --processed-data-file d.bin " MODEL "--num-shards 2 --cache-mb 64 "
                 "--save-checkpoint ckr --test-pred-out tr.txt --metrics-out mr.jsonl "
                 "--plan-out plan.json > tra.out 2>&1", bin_path()));
  free(in_dir(0, "%s train --raw-data-file d.tsv --test-fraction 0.1 " MODEL "--num-shards 2 "
                 "--save-checkpoint ckl --test-pred-out tl.txt --metrics-out ml.jsonl "
                 "--plan-out plan-l.json > trl.out 2>&1", bin_path()));
}

/* The "auc X  logloss Y" part of the first line of out starting with prefix. */
static char *auc_text(const char *out, const char *prefix) {
  const char *p = strstr(out, prefix);
  ck_assert_msg(p != NULL, "no '%s' in:\n%s", prefix, out);
  p = strstr(p, "auc ");
  const char *e = strstr(p, "  accuracy");
  ck_assert(p && e);
  return strndup(p, (size_t)(e - p));
}

/* predict's metrics (pm.json) are train's test metrics (kind test in
 * metrics_jsonl), and the metrics it printed in out are the test line train
 * printed in train_out. */
static void same_metrics_as_train(const char *out, const char *metrics_jsonl, const char *train_out) {
  char *a = metric_fields("pm.json", "\"kind\":\"predict\"");
  char *b = metric_fields(metrics_jsonl, "\"kind\":\"test\"");
  ck_assert_str_eq(a, b);
  char *tro = file_text(train_out);
  char *x = auc_text(out, "metrics "), *y = auc_text(tro, "test   step");
  ck_assert_str_eq(x, y);
  free(x);
  free(y);
  free(tro);
  free(a);
  free(b);
}

START_TEST(test_rocks_in_process_equals_trainer) {
  char *out = in_dir(0, "%s predict --checkpoint ckr --processed-data-file d.bin --data-split test "
                        "--out p.tsv --metrics-out pm.json", bin_path());
  assert_same_preds("p.tsv", "tr.txt", N_TEST);
  same_metrics_as_train(out, "mr.jsonl", "tra.out");
  ck_assert_msg(strstr(out, "RocksDB shard databases in ") != NULL, "%s", out);
  /* The temporary copy of the databases is gone. */
  char tmp[512] = "";
  sscanf(strstr(out, "RocksDB shard databases in ") + 27, "%511s", tmp);
  ck_assert_msg(tmp[0] && access(tmp, F_OK) != 0, "%s left behind", tmp);
  /* Lines of one class: AUC has no value, written null (not NaN, which
   * no JSON reader takes). */
  free(in_dir(0, "head -1 d.tsv > one.tsv && %s predict --checkpoint ckl --raw-data-file one.tsv "
                 "--test-fraction 0.1 --out one.out --metrics-out one.json && python3 -c \""
                 "import json; m = json.load(open('one.json')); assert m['auc'] is None and "
                 "m['n'] == 1 and 0 < m['logloss'], m\"", bin_path()));
  /* Without --data-split the whole file: its test part is the same lines. */
  char *all = in_dir(0, "%s predict --checkpoint ckr --processed-data-file d.bin --out all.tsv",
                     bin_path());
  char *pa = file_text("all.tsv"), *pt = file_text("tr.txt");
  ck_assert_int_eq(count_lines(pa), N_ALL);
  /* The test split is the last 1000 samples; batches of 128 align
   * differently there, so compare as numbers within float rounding. */
  const char *q = pa;
  for (int i = 0; i < N_ALL - N_TEST; i++) q = strchr(q, '\n') + 1;
  const char *r = pt;
  for (int i = 0; i < N_TEST; i++) {
    double u = strtod(q, NULL), v = strtod(r, NULL);
    ck_assert_msg(u > 0 && u < 1 && __builtin_fabs(u - v) < 1e-5, "line %d: %g vs %g", i, u, v);
    q = strchr(q, '\n') + 1;
    r = strchr(r, '\n') + 1;
  }
  free(pa);
  free(pt);
  free(all);
  free(out);
}
END_TEST

START_TEST(test_raw_in_memory_equals_trainer) {
  char *out = in_dir(0, "%s predict --checkpoint ckl --raw-data-file d.tsv --test-fraction 0.1 "
                        "--data-split test --out p.tsv --metrics-out pm.json", bin_path());
  ck_assert_msg(strstr(out, "in process, in memory") != NULL, "%s", out);
  ck_assert_msg(strstr(out, "warning") == NULL, "%s", out);
  assert_same_preds("p.tsv", "tl.txt", N_TEST);
  same_metrics_as_train(out, "ml.jsonl", "trl.out");
  free(out);
  /* Without --test-fraction the split is the Kaggle days', but the ids are
   * still the model's own (its transform, not a dictionary built from
   * another train part): the whole file scores as with the training flags. */
  out = in_dir(0, "%s predict --checkpoint ckl --raw-data-file d.tsv --data-split all --out w.tsv "
                  "&& %s predict --checkpoint ckl --raw-data-file d.tsv --test-fraction 0.1 "
                  "--data-split all --out wf.tsv", bin_path(), bin_path());
  assert_same_preds("w.tsv", "wf.tsv", N_ALL);
  ck_assert_msg(strstr(out, "warning") == NULL, "%s", out);
  free(out);
}
END_TEST

START_TEST(test_no_label) {
  /* The same lines without their label column score the same. */
  free(in_dir(0, "cut -f2- d.tsv > nl.tsv"));
  char *out = in_dir(0, "%s predict --checkpoint ckl --raw-data-file nl.tsv --no-label "
                        "--test-fraction 0.1 --data-split test --out q.tsv", bin_path());
  ck_assert_msg(strstr(out, "metrics") == NULL, "metrics printed for unlabelled input:\n%s", out);
  assert_same_preds("q.tsv", "tl.txt", N_TEST);
  free(out);
  free(in_dir(0, "%s predict --checkpoint ckl --raw-data-file nl.tsv --no-label --test-fraction 0.1 "
                 "--out qa.tsv && %s predict --checkpoint ckl --raw-data-file d.tsv --test-fraction 0.1 "
                 "--out pa.tsv", bin_path(), bin_path()));
  assert_same_preds("qa.tsv", "pa.tsv", N_ALL);
  /* Labelled input read as unlabelled is malformed (one field too many). */
  out = in_dir(0, "%s predict --checkpoint ckl --raw-data-file d.tsv --no-label --test-fraction 0.1 "
                  "--data-split test --out z.tsv", bin_path());
  char *z = file_text("z.tsv");
  ck_assert_int_eq(count_lines(z), N_TEST);
  ck_assert_msg(!strncmp(z, "nan\n", 4), "%.40s", z);
  free(z);
  free(out);
  /* Converted without labels: the file says so; predict scores it as the
   * raw rows (no metrics), and --metrics-out, eval and train, which would
   * read its zero labels as data, are refused naming it. */
  out = in_dir(0, "%s convert --no-label --test-fraction 0.1 --mapping-from ckl nl.tsv nl.bin",
               bin_path());
  ck_assert_msg(strstr(out, "no labels") != NULL, "%s", out);
  free(out);
  out = in_dir(0, "%s predict --checkpoint ckl --processed-data-file nl.bin --data-split test "
                  "--out qb.tsv", bin_path());
  ck_assert_msg(strstr(out, "metrics") == NULL, "metrics printed for unlabelled input:\n%s", out);
  assert_same_preds("qb.tsv", "tl.txt", N_TEST);
  free(out);
  const char *refused[3] = {
      "predict --checkpoint ckl --processed-data-file nl.bin --out qc.tsv --metrics-out qc.json",
      "eval --checkpoint ckl --processed-data-file nl.bin",
      "train --processed-data-file nl.bin " MODEL "--num-batches 2 --save-checkpoint ckn"};
  for (int k = 0; k < 3; k++) {
    out = in_dir(1, "%s %s", bin_path(), refused[k]);
    ck_assert_msg(strstr(out, "nl.bin: converted from rows without labels") != NULL, "%s:\n%s",
                  refused[k], out);
    free(out);
  }
  free(in_dir(2, "ls qc.tsv qc.json ckn"));
}
END_TEST

START_TEST(test_malformed_lines_stay_aligned) {
  /* Lines 9500 and 9996 (1-based, in the test part; the ids are the
   * model's transform's, so the other lines' ids do not change) replaced
   * by garbage, a NUL byte put into line 9997 (one malformed line, not two)
   * and a blank line at 9998. */
  free(in_dir(0, "awk 'NR==9500{print \"x\\ty\"; next} NR==9996{print \"garbage\"; next} "
                 "NR==9998{print \"\"; next} {print}' d.tsv | python3 -c \"import sys; "
                 "b = sys.stdin.buffer.read().split(b'\\n'); b[9996] = b[9996][:3] + b'\\0' + "
                 "b[9996][3:]; sys.stdout.buffer.write(b'\\n'.join(b))\" > bad.tsv"));
  char *out = in_dir(0, "%s predict --checkpoint ckl --raw-data-file bad.tsv --test-fraction 0.1 "
                        "--out b.tsv && %s predict --checkpoint ckl --raw-data-file d.tsv "
                        "--test-fraction 0.1 --out g.tsv", bin_path(), bin_path());
  ck_assert_msg(strstr(out, "4 malformed lines skipped (written as nan)") != NULL, "%s", out);
  ck_assert_msg(strstr(out, "bad.tsv:9500:") != NULL, "the reader's report is missing:\n%s", out);
  char *b = file_text("b.tsv"), *g = file_text("g.tsv");
  ck_assert_int_eq(count_lines(b), N_ALL);
  ck_assert_int_eq(count_lines(g), N_ALL);
  const char *p = b, *q = g;
  int nan = 0, diff = 0;
  for (int line = 1; line <= N_ALL; line++) {
    const char *pe = strchr(p, '\n'), *qe = strchr(q, '\n');
    int is_bad = line == 9500 || line == 9996 || line == 9997 || line == 9998;
    if (is_bad) {
      ck_assert_msg(pe - p == 3 && !strncmp(p, "nan", 3), "line %d: %.*s", line, (int)(pe - p), p);
      nan++;
    } else if (line < 9500) {
      /* Before the first bad line the batches are the same: same bits. */
      ck_assert_msg(pe - p == qe - q && !strncmp(p, q, (size_t)(pe - p)), "line %d differs", line);
    } else {
      /* After it the batches hold other samples: equal within rounding. */
      double u = strtod(p, NULL), v = strtod(q, NULL);
      ck_assert_msg(__builtin_fabs(u - v) < 1e-5, "line %d: %g vs %g", line, u, v);
      diff += u != v;
    }
    p = pe + 1;
    q = qe + 1;
  }
  ck_assert_int_eq(nan, 4);
  printf("predict: %d lines after the first malformed one differ in their last bits\n", diff);
  free(b);
  free(g);
  free(out);
  /* --strict stops at the first one, naming it. */
  out = in_dir(1, "%s predict --checkpoint ckl --raw-data-file bad.tsv --test-fraction 0.1 "
                  "--strict --out s.tsv", bin_path());
  ck_assert_msg(strstr(out, "bad.tsv:9500") != NULL, "%s", out);
  ck_assert_int_ne(access("s.tsv", F_OK), 0);
  free(out);
}
END_TEST

START_TEST(test_refusals) {
  char *out;
  /* A torn dense.bin, a damaged SST file, a missing DONE: refused by
   * predict and serve, naming the file. */
  free(in_dir(0, "rm -rf t1 t2 t3 && cp -r ckr t1 && cp -r ckr t2 && cp -r ckr t3 && "
                 "truncate -s -7 t1/step-*/dense.bin && "
                 "f=$(ls t2/step-*/shards/shard-1/*.sst | head -1) && "
                 "printf 'X' | dd of=$f bs=1 seek=100 conv=notrunc 2>/dev/null && "
                 "rm t3/step-*/DONE"));
  out = in_dir(1, "%s predict --checkpoint t1 --processed-data-file d.bin --out x.tsv", bin_path());
  ck_assert_msg(strstr(out, "dense.bin") && strstr(out, "torn or truncated"), "%s", out);
  free(out);
  out = in_dir(1, "%s serve --checkpoint t1 --shard 0 --read-only", bin_path());
  ck_assert_msg(strstr(out, "dense.bin") && strstr(out, "torn or truncated"), "%s", out);
  free(out);
  out = in_dir(1, "%s predict --checkpoint t2/step-* --processed-data-file d.bin --out x.tsv",
               bin_path());
  ck_assert_msg(strstr(out, "/shards/shard-1/") && strstr(out, ".sst") &&
                strstr(out, "checksum mismatch"), "%s", out);
  free(out);
  out = in_dir(1, "%s serve --checkpoint t2/step-* --shard 1", bin_path());
  ck_assert_msg(strstr(out, "/shards/shard-1/") && strstr(out, "checksum mismatch"), "%s", out);
  free(out);
  out = in_dir(1, "%s predict --checkpoint t3/step-* --processed-data-file d.bin --out x.tsv",
               bin_path());
  ck_assert_msg(strstr(out, "/DONE") && strstr(out, "incomplete"), "%s", out);
  free(out);
  ck_assert_int_ne(access("x.tsv", F_OK), 0);
  /* One server address for a 2-shard plan. */
  out = in_dir(2, "%s predict --checkpoint ckr --shard-servers 127.0.0.1:1 --processed-data-file "
                  "d.bin --out x.tsv", bin_path());
  ck_assert_msg(strstr(out, "1 address(es), the checkpoint's plan has 2 shard(s)"), "%s", out);
  free(out);
  /* A --plan with the same model but another placement (row-wise). */
  free(in_dir(0, "%s plan --processed-data-file d.bin --shards 2 --row-wise --out rw.json", bin_path()));
  out = in_dir(1, "%s serve --checkpoint ckr --plan rw.json --shard 0", bin_path());
  ck_assert_msg(strstr(out, "rw.json has plan fingerprint") && strstr(out, "reshard"), "%s", out);
  free(out);
  /* The checkpoint's own plan is accepted (the server is not started:
   * a bad --listen stops it after the checks). */
  out = in_dir(1, "%s serve --checkpoint ckr --plan plan.json --shard 0 --listen 256.0.0.1:1 --insecure",
                  bin_path());
  ck_assert_msg(strstr(out, "checkpoint ") && strstr(out, "serving shard(s) 0"), "%s", out);
  free(out);
  out = in_dir(1, "%s serve --checkpoint ckr --shard 2", bin_path());
  ck_assert_msg(strstr(out, "--shard 2: the checkpoint's plan has shards 0..1"), "%s", out);
  free(out);
  /* A --data-dir in the checkpoint's folder (a step's shards/, or beside
   * the steps) would have the shard store write there: refused, the
   * checkpoint byte for byte as it was. */
  char *before = in_dir(0, "cd ckr && find . -type f | sort | xargs sha256sum");
  const char *inside[] = {"\"$(ls -d ckr/step-* | tail -1)/shards\"", "ckr/dd"};
  for (int i = 0; i < 2; i++) {
    out = in_dir(1, "%s serve --checkpoint ckr --shard 0 --data-dir %s", bin_path(), inside[i]);
    ck_assert_msg(strstr(out, "overlaps the checkpoint's folder"), "%s: %s", inside[i], out);
    free(out);
  }
  char *after = in_dir(0, "cd ckr && find . -type f | sort | xargs sha256sum");
  ck_assert_str_eq(before, after);
  free(before);
  free(after);
  /* Bad usage: exit 2. */
  const char *bad[] = {
      "predict --checkpoint ckr --processed-data-file d.bin",                      /* no --out */
      "predict --checkpoint ckr --processed-data-file d.bin --raw-data-file d.tsv --out x.tsv",
      "predict --checkpoint ckr --processed-data-file d.bin --out x.tsv --mini-batch-size 0",
      "predict --checkpoint ckr --processed-data-file d.bin --out x.tsv --bogus",
      "predict --checkpoint ckr --processed-data-file d.bin --out x.tsv --max-ind-range 10",
      "serve --checkpoint ckr",
      "serve --checkpoint ckr --shard 0 --restore ckr",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    out = in_dir(2, "%s %s", bin_path(), bad[i]);
    ck_assert_msg(strstr(out, "shardrec ") != NULL, "%s: no message", bad[i]);
    free(out);
  }
  ck_assert_int_ne(access("x.tsv", F_OK), 0);
  /* A raw file's split and parsing flags given with a processed file, which
   * holds its own split: refused by predict and eval alike (eval takes no
   * --strict or --no-label). */
  const char *raw_only[] = {"--test-fraction 0.5", "--data-set terabyte", "--strict", "--no-label"};
  for (size_t i = 0; i < sizeof raw_only / sizeof *raw_only; i++)
    for (int k = 0; k < (i < 2 ? 2 : 1); k++) {
      out = in_dir(2, "%s %s --checkpoint ckr --processed-data-file d.bin %s%s", bin_path(),
                   k ? "eval" : "predict", raw_only[i], k ? "" : " --out x.tsv");
      ck_assert_msg(strstr(out, "apply to --raw-data-file (a processed file holds its split"),
                    "%s %s:\n%s", k ? "eval" : "predict", raw_only[i], out);
      free(out);
    }
}
END_TEST

int main(void) {
  Suite *s = suite_create("predict");
  TCase *tc = tcase_create("in_process");
  tcase_add_unchecked_fixture(tc, setup, remove_data);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_rocks_in_process_equals_trainer);
  tcase_add_test(tc, test_raw_in_memory_equals_trainer);
  tcase_add_test(tc, test_no_label);
  tcase_add_test(tc, test_malformed_lines_stay_aligned);
  tcase_add_test(tc, test_refusals);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
