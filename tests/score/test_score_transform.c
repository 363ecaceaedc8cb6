/* New raw rows scored as the model's training rows were mapped: a model
 * trained on one day's converted lines (datagen --seed 1) scores another
 * day's lines (--row-seed 2: the same teacher and values, new values in the
 * Zipf tail) from the raw TSV exactly as from the file converted with its
 * own transform (convert --mapping-from CKPT), byte for byte, from the
 * checkpoint and from a copy resharded 1 -> 3; a hash-mode model the same;
 * and every mapping that cannot be proven is refused with nothing written
 * (a file converted with its own dictionaries, one whose dictionaries
 * extend the model's, raw ids, raw rows for a model that records no
 * transform, converted rows given as raw ones). */
#include <check.h>
#include <stdint.h>
#include <unistd.h>

#include "tests/check_main.h"
#include "tests/score/common.h"

/* The sizes of the new days scored. */
static const int new_rows[] = {100, 1000, 100000};
#define N_NEW (sizeof new_rows / sizeof new_rows[0])

/* A model that learns the teacher in well under a second: 20000 lines, four
 * epochs of 64 (about 1100 steps). */
#define TRAIN MODEL "--nepochs 4 --mini-batch-size 64 "

static void setup(void) {
  dir = make_data_dir(20000, 1, NULL);
  /* ck: trained on d.bin (its own dictionaries); ck3: ck resharded to
   * three shards. new-N.tsv: N other lines; new-N.bin: them converted with
   * ck's transform, split as eval reads the TSV (kaggle). */
  free(in_dir(0, "%s train --processed-data-file d.bin " TRAIN "--save-checkpoint ck > tr.out 2>&1 "
                 "&& %s plan --processed-data-file d.bin --shards 3 --out p3.json > /dev/null "
                 "&& %s reshard --from ck --to ck3 --plan p3.json > rs.out 2>&1",
              bin_path(), bin_path(), bin_path()));
  for (size_t i = 0; i < N_NEW; i++)
    free(in_dir(0, "%s datagen --rows %d --seed 1 --row-seed 2 --out new-%d.tsv > /dev/null && "
                   "%s convert --mapping-from ck --split kaggle new-%d.tsv new-%d.bin > cv-%d.out",
                bin_path(), new_rows[i], new_rows[i], bin_path(), new_rows[i], new_rows[i],
                new_rows[i]));
}

/* The number after "key": in the text of dir/name (the first one). */
static double json_num(const char *name, const char *key) {
  char *t = file_text(name), k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(t, k);
  ck_assert_msg(p != NULL, "%s: no %s", name, k);
  p += strlen(k);
  p += strspn(p, " \t");
  double v = strtod(p, NULL);
  free(t);
  return v;
}

/* The text after "samples): " of eval's result line in out. */
static char *eval_metrics(const char *out) {
  const char *p = strstr(out, "eval   ");
  ck_assert_msg(p != NULL, "no eval line in:\n%s", out);
  p = strstr(p, "samples): ");
  ck_assert(p != NULL);
  return strndup(p, strcspn(p, "\n"));
}

/* The last "mapping <12 hex digits>" convert printed in dir/name. */
static void printed_mapping(const char *name, char fp[13]) {
  char *t = file_text(name);
  const char *p = t, *last = NULL;
  while ((p = strstr(p, "mapping "))) last = p++;
  ck_assert_msg(last != NULL, "%s: no mapping line", name);
  snprintf(fp, 13, "%s", last + 8);
  free(t);
}

START_TEST(test_raw_scores_as_mapped) {
  for (size_t i = 0; i < N_NEW; i++) {
    const int n = new_rows[i];
    /* predict: the raw TSV and the converted file, from ck and from ck3. */
    char *out = in_dir(0, "%s predict --checkpoint ck --raw-data-file new-%d.tsv --out r-%d.tsv "
                          "--metrics-out rm-%d.json && %s predict --checkpoint ck "
                          "--processed-data-file new-%d.bin --out b-%d.tsv --metrics-out "
                          "bm-%d.json && %s predict --checkpoint ck3 --raw-data-file new-%d.tsv "
                          "--out r3-%d.tsv --metrics-out rm3-%d.json", bin_path(), n, n, n,
                       bin_path(), n, n, n, bin_path(), n, n, n);
    char a[64], b[64];
    snprintf(a, sizeof a, "r-%d.tsv", n);
    snprintf(b, sizeof b, "b-%d.tsv", n);
    assert_same_preds(a, b, n);
    ck_assert_msg(strstr(out, "warning") == NULL, "%s", out);
    free(out);
    snprintf(b, sizeof b, "r3-%d.tsv", n);
    assert_same_preds(a, b, n);
    char *mr, *mb, *m3;
    snprintf(a, sizeof a, "rm-%d.json", n);
    mr = file_text(a);
    snprintf(a, sizeof a, "bm-%d.json", n);
    mb = file_text(a);
    snprintf(a, sizeof a, "rm3-%d.json", n);
    m3 = file_text(a);
    ck_assert_str_eq(mr, mb);
    ck_assert_str_eq(mr, m3);
    free(mr);
    free(mb);
    free(m3);
    /* eval (the test split: the TSV's Kaggle days, the file's stored split). */
    char *er = in_dir(0, "%s eval --checkpoint ck --raw-data-file new-%d.tsv", bin_path(), n);
    char *eb = in_dir(0, "%s eval --checkpoint ck --processed-data-file new-%d.bin", bin_path(), n);
    char *e3 = in_dir(0, "%s eval --checkpoint ck3 --processed-data-file new-%d.bin", bin_path(), n);
    char *xr = eval_metrics(er), *xb = eval_metrics(eb), *x3 = eval_metrics(e3);
    ck_assert_str_eq(xr, xb);
    ck_assert_str_eq(xr, x3);
    free(xr);
    free(xb);
    free(x3);
    free(er);
    free(eb);
    free(e3);
    /* Well above chance and near the best a model can do on these lines. */
    snprintf(a, sizeof a, "rm-%d.json", n);
    snprintf(b, sizeof b, "new-%d.tsv.summary.json", n);
    const double auc = json_num(a, "auc"), oracle = json_num(b, "oracle_auc");
    printf("score_transform: %6d new lines: auc %.4f, oracle auc %.4f\n", n, auc, oracle);
    /* 100 lines (about 25 clicks) are a noisy sample: a wider margin. */
    const double margin = n < 1000 ? 0.12 : 0.08;
    ck_assert_msg(auc > 0.6 && auc > oracle - margin, "%d lines: auc %.4f, oracle %.4f", n, auc,
                  oracle);
  }
}
END_TEST

/* The out files of a refused run do not exist. */
static void assert_nothing_written(void) {
  char path[1024];
  snprintf(path, sizeof path, "%s/x.tsv", dir);
  ck_assert_msg(access(path, F_OK) != 0, "%s written", path);
  snprintf(path, sizeof path, "%s/xm.json", dir);
  ck_assert_msg(access(path, F_OK) != 0, "%s written", path);
}

START_TEST(test_other_mappings_refused) {
  /* The model's fingerprint, as convert --mapping-from printed it. */
  char model_fp[13], own_fp[13], ext_fp[13];
  printed_mapping("cv-1000.out", model_fp);
  /* A file converted with its own dictionaries: refused, naming both
   * fingerprints and the first difference. */
  free(in_dir(0, "%s convert new-1000.tsv own.bin > own.out", bin_path()));
  printed_mapping("own.out", own_fp);
  ck_assert_str_ne(own_fp, model_fp);
  const char *cmds[] = {"predict --checkpoint ck --out x.tsv --metrics-out xm.json",
                        "eval --checkpoint ck --out x.tsv", "predict --checkpoint ck3 --out x.tsv"};
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    char *out = in_dir(1, "%s %s --processed-data-file own.bin", bin_path(), cmds[i]);
    char want[256];
    snprintf(want, sizeof want, "--processed-data-file own.bin: mapping %s differs from the "
             "model's %s (C", own_fp, model_fp);
    ck_assert_msg(strstr(out, want) && strstr(out, "convert the raw file with --mapping-from"),
                  "%s: %s", cmds[i], out);
    ck_assert_msg(strstr(out, "samples scored") == NULL, "%s scored: %s", cmds[i], out);
    free(out);
    assert_nothing_written();
    /* The same file given as raw rows: converted rows are never taken for
     * raw ones (their own mapping would go unchecked). */
    out = in_dir(1, "%s %s --raw-data-file own.bin", bin_path(), cmds[i]);
    ck_assert_msg(strstr(out, "own.bin: a shardrec binary file (converted rows, magic "
                              "'SRCRITEO'), not raw Criteo TSV: give it as --processed-data-file"),
                  "%s: %s", cmds[i], out);
    free(out);
    assert_nothing_written();
  }
  /* A file whose dictionaries extend the model's: its new ids have no rows. */
  free(in_dir(0, "%s convert --mapping-from ck --extend-dictionaries new-1000.tsv ext.bin > ext.out",
              bin_path()));
  printed_mapping("ext.out", ext_fp);
  char *out = in_dir(1, "%s predict --checkpoint ck --processed-data-file ext.bin --out x.tsv "
                        "--metrics-out xm.json", bin_path());
  char want[256];
  snprintf(want, sizeof want, "mapping %s extends (new ids without rows in) the model's %s (C",
           ext_fp, model_fp);
  ck_assert_msg(strstr(out, want) && strstr(out, "values added"), "%s", out);
  free(out);
  assert_nothing_written();
}
END_TEST

START_TEST(test_model_without_transform) {
  /* A model trained on the reference's int32 records (ids mapped outside
   * shardrec): its checkpoint records no transform. */
  char path[1024];
  snprintf(path, sizeof path, "%s/r.int32", dir);
  static int32_t rec[2000][40];
  for (int i = 0; i < 2000; i++)
    for (int k = 0; k < 40; k++) rec[i][k] = k == 0 ? i % 3 == 0 : (i * 7 + k) % 50;
  file_put_bytes(path, rec, sizeof rec);
  free(in_dir(0, "%s train --processed-data-file r.int32 " MODEL "--num-batches 5 "
                 "--save-checkpoint ck0 > t0.out 2>&1", bin_path()));
  /* Its raw rows are refused before anything is scored or written. */
  const char *cmds[] = {"predict --checkpoint ck0 --out x.tsv --metrics-out xm.json",
                        "eval --checkpoint ck0 --out x.tsv"};
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    char *out = in_dir(1, "%s %s --raw-data-file new-1000.tsv", bin_path(), cmds[i]);
    ck_assert_msg(strstr(out, "--raw-data-file new-1000.tsv: ") &&
                  strstr(out, "records no data transform (written before models carried their "
                              "mapping") &&
                  strstr(out, "its raw-row mapping cannot be proven; score a file converted "
                              "with its own dictionaries") &&
                  strstr(out, "save the model again with this shardrec"), "%s: %s", cmds[i], out);
    free(out);
    assert_nothing_written();
  }
  /* Its own records are scored as before. */
  free(in_dir(0, "%s predict --checkpoint ck0 --processed-data-file r.int32 --out ok.tsv",
              bin_path()));
  char *ok = file_text("ok.tsv");
  ck_assert_int_eq(count_lines(ok), 2000);
  free(ok);
  /* Raw ids scored by a model that records a transform: refused. */
  char *out = in_dir(1, "%s predict --checkpoint ck --processed-data-file r.int32 --out x.tsv "
                        "--metrics-out xm.json", bin_path());
  ck_assert_msg(strstr(out, "--processed-data-file r.int32: its ids were mapped outside shardrec"),
                "%s", out);
  free(out);
  assert_nothing_written();
  /* A model that records one, trained on raw ids: the job says its checkpoints
   * will record no mapping (the model's is not carried to ids it did not map),
   * and they record none. */
  static int32_t zero[500][40]; /* every id 0: within every table */
  for (int i = 0; i < 500; i++)
    for (int k = 0; k < 14; k++) zero[i][k] = k == 0 ? i % 2 : (i + k) % 20;
  snprintf(path, sizeof path, "%s/z.int32", dir);
  file_put_bytes(path, zero, sizeof zero);
  out = in_dir(0, "%s train --resume ck --plan ck/plan.json --processed-data-file z.int32 " TRAIN
                  "--save-checkpoint ckz", bin_path());
  ck_assert_msg(strstr(out, "note   z.int32 records no data mapping (ids mapped outside shardrec): "
                            "this job's checkpoints record none either"), "%s", out);
  free(out);
  out = in_dir(0, "%s inspect ckz", bin_path());
  ck_assert_msg(strstr(out, "data transform: none recorded"), "%s", out);
  free(out);
  /* inspect says which model has one. */
  out = in_dir(0, "%s inspect ck0", bin_path());
  ck_assert_msg(strstr(out, "data transform: none recorded"), "%s", out);
  free(out);
  char model_fp[13];
  printed_mapping("cv-1000.out", model_fp);
  out = in_dir(0, "%s inspect ck3", bin_path());
  char want[64];
  snprintf(want, sizeof want, "data transform: %s", model_fp);
  ck_assert_msg(strstr(out, want) && strstr(out, ": dictionary (frequency threshold"), "%s", out);
  free(out);
}
END_TEST

START_TEST(test_hash_model) {
  /* A model of hashed ids: its raw rows score as convert --hash's file. */
  free(in_dir(0, "%s convert --hash --test-fraction 0.1 d.tsv dh.bin > /dev/null && "
                 "%s train --processed-data-file dh.bin " MODEL "--num-batches 100 "
                 "--save-checkpoint ckh > th.out 2>&1 && "
                 "%s convert --hash new-1000.tsv nh.bin > /dev/null && "
                 "%s predict --checkpoint ckh --raw-data-file new-1000.tsv --out hr.tsv "
                 "--metrics-out hrm.json > /dev/null && "
                 "%s predict --checkpoint ckh --processed-data-file nh.bin --out hb.tsv "
                 "--metrics-out hbm.json > /dev/null",
              bin_path(), bin_path(), bin_path(), bin_path(), bin_path()));
  assert_same_preds("hr.tsv", "hb.tsv", 1000);
  char *a = file_text("hrm.json"), *b = file_text("hbm.json");
  ck_assert_str_eq(a, b);
  free(a);
  free(b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("score_transform");
  TCase *tc = tcase_create("score_transform");
  tcase_add_unchecked_fixture(tc, setup, remove_data);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_raw_scores_as_mapped);
  tcase_add_test(tc, test_other_mappings_refused);
  tcase_add_test(tc, test_model_without_transform);
  tcase_add_test(tc, test_hash_model);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
