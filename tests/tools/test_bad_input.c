/* Bad files and flags from outside, through the real binary: nothing wrong
 * is taken for data, every refusal names what and where, a flag error
 * exits 2. */
#include <check.h>

#include "tests/check_main.h"

#include <math.h>

#include "common/fs.h"
#include "datasets/binfmt.h"

#include "tests/support/proc.h"
#include "tests/tools/bin_edit.h"

/* Occurrences of text in s. */
static int count_in(const char *s, const char *text) {
  int n = 0;
  for (const char *p = s; p && (p = strstr(p, text)); p += strlen(text)) n++;
  return n;
}

/* An empty or all-garbage input converts to nothing: non-zero, "no
 * samples", no output file. */
START_TEST(test_convert_no_samples) {
  char *d = tmpdir_make("test"), *out;
  ck_assert_int_eq(run_cmd(NULL, "cd %s && : > empty.tsv && printf 'x\\ny\\tz\\n' > junk.tsv", d), 0);
  const char *in[] = {"empty.tsv", "junk.tsv"};
  const char *want[] = {"empty.tsv: no samples (0 lines, 0 malformed)",
                        "junk.tsv: no samples (2 lines, 2 malformed)"};
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(run_cmd(&out, "cd %s && %s convert %s o.bin", d, bin_path(), in[i]), 1);
    ck_assert_msg(strstr(out, want[i]), "%s", out);
    free(out);
    ck_assert_int_eq(run_cmd(NULL, "test -e %s/o.bin", d), 1);
  }
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

/* train reads the raw file through a train and a test source: a malformed
 * line is reported once, not by each. */
START_TEST(test_train_malformed_once) {
  char *d = make_data_dir(700, 3, "printf '7\\t1\\n' >> d.tsv"), *out;
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s train --raw-data-file d.tsv --test-fraction 0.2 "
                                 "--num-batches 2 --mini-batch-size 64", d, bin_path()), 0);
  ck_assert_msg(count_in(out, "d.tsv:701: bad label") == 1, "%s", out);
  free(out);
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

/* A tag as sr_tmp_tag writes it for a process of this host that is gone:
 * this one's PID, boot and host with another start time. */
static void dead_tag(char *out, size_t n) {
  char tag[SR_TMP_TAG_MAX], boot[16];
  long pid;
  unsigned long long start;
  int used = 0;
  ck_assert_int_eq(sr_tmp_tag(tag, sizeof tag), 0);
  ck_assert_int_eq(sscanf(tag, "tmp-%ld-%llu-%15[0-9a-f]-%n", &pid, &start, boot, &used), 3);
  snprintf(out, n, "tmp-%ld-%llu-%s-%s", pid, start + 12345, boot, tag + used);
}

/* What a kill -9 left (a checkpoint's .step-N.TAG, reshard's OUT.TAG) is
 * removed at the next start when its owner is gone, saying so; a folder of
 * a live owner (this test's own tag) is kept. */
START_TEST(test_dead_owner_tmp_removed) {
  char dead[SR_TMP_TAG_MAX + 16], live[SR_TMP_TAG_MAX], *out;
  dead_tag(dead, sizeof dead);
  ck_assert_int_eq(sr_tmp_tag(live, sizeof live), 0);
  char *d = make_data_dir(600, 5, "mkdir -p ck/.step-9.%s/shards ck/.step-8.%s o.%s o.%s", dead,
                          live, dead, live);
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --num-batches 3 "
                                 "--mini-batch-size 64 --save-checkpoint ck", d, bin_path()), 0);
  ck_assert_msg(strstr(out, "ck/.step-9.") && strstr(out, "removed: a temporary folder whose owner"),
                "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(NULL, "cd %s && test ! -e ck/.step-9.%s && test -d ck/.step-8.%s && "
                                 "test -d ck/step-3", d, dead, live), 0);
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s plan --out p2.json --processed-data-file d.bin "
                                 "--num-shards 2 && %s reshard --from ck --to o --plan p2.json",
                           d, bin_path(), bin_path()), 0);
  ck_assert_msg(strstr(out, "o.tmp-") && strstr(out, "removed: a temporary folder"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(NULL, "cd %s && test ! -e o.%s && test -d o.%s && test -d o", d, dead,
                           live), 0);
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

/* One range per flag, checked once, the same in every command: the
 * message names the flag and the range, and the exit is 2. */
START_TEST(test_flag_ranges) {
  char sizes0[200] = "0", sizes_big[600] = "9007199254740993";
  for (int i = 1; i < 26; i++) {
    strcat(sizes0, "-7");
    strcat(sizes_big, "-7");
  }
  struct { const char *cmd, *flag, *value, *want; } c[] = {
      {"train", "--cache-rows", "2147483648", "[1024, 2147483647] rows"},
      {"serve", "--cache-rows", "2147483648", "[1024, 2147483647] rows"},
      {"train", "--cache-rows", "1", "[1024, 2147483647] rows"},
      {"serve", "--cache-rows", "1", "[1024, 2147483647] rows"},
      {"train", "--cache-mb", "1073741824", "[1, 1048576] MiB"},
      {"serve", "--cache-mb", "1073741824", "[1, 1048576] MiB"},
      {"predict", "--cache-mb", "1073741824", "[1, 1048576] MiB"},
      {"train", "--mini-batch-size", "0", "[1, 1048576] samples"},
      {"eval", "--mini-batch-size", "0", "[1, 1048576] samples"},
      {"predict", "--mini-batch-size", "0", "[1, 1048576] samples"},
      {"train", "--frequency-threshold", "4294967296", "[0, 4294967295] occurrences"},
      {"eval", "--frequency-threshold", "4294967296", "[0, 4294967295] occurrences"},
      {"plan", "--frequency-threshold", "4294967296", "[0, 4294967295] occurrences"},
      {"convert", "--frequency-threshold", "4294967296", "[0, 4294967295] occurrences"},
      {"train", "--max-ind-range", "-1", "[0, 1099511627776] rows"},
      {"convert", "--max-ind-range", "-1", "[0, 1099511627776] rows"},
      {"train", "--test-freq", "-2", "[-1, 1099511627776] steps (-1, the reference DLRM's default, and 0: at the end only)"},
      {"train", "--rpc-deadline", "0", "[0.001, 86400] seconds"},
      {"predict", "--rpc-deadline", "0", "[0.001, 86400] seconds"},
      {"serve", "--threads", "0", "[1, 256] threads"},
      {"reshard", "--threads", "0", "[1, 256] threads"},
      {"train", "--num-shards", "0", "[1, 65536] shards"},
      {"plan", "--num-shards", "0", "[1, 65536] shards"},
      {"train", "--prefetch-depth", "-1", "[0, 8] steps ahead (0: off)"},
      {"train", "--prefetch-depth", "9", "[0, 8] steps ahead (0: off)"},
      {"train", "--prefetch-depth", "two", "'two' is not an integer"},
      {"bench train", "--prefetch-depth", "9", "[0, 8] steps ahead (0: off)"},
      {"train", "--rpc-connections", "0", "[1, 16] TCP connections per shard server"},
      {"train", "--rpc-connections", "17", "[1, 16] TCP connections per shard server"},
      {"train", "--rpc-connections", "two", "'two' is not an integer"},
      {"bench rpc", "--rpc-connections", "17", "[1, 16] TCP connections per shard server"},
      {"train", "--arch-embedding-size", sizes0, "entry 1: 0 is out of range [1, 9007199254740992] rows per table"},
      {"train", "--arch-embedding-size", sizes_big, "entry 1: 9007199254740993 is out of range [1, 9007199254740992] rows per table"},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    char *out;
    int rc = run_cmd(&out, "%s %s %s %s", bin_path(), c[i].cmd, c[i].flag, c[i].value);
    char want[512];
    snprintf(want, sizeof want, "shardrec %s: %s: ", c[i].cmd, c[i].flag);
    ck_assert_msg(rc == 2 && strstr(out, want) && strstr(out, c[i].want), "%s %s %s: exit %d: %s",
                  c[i].cmd, c[i].flag, c[i].value, rc, out);
    free(out);
  }
  /* --rpc-connections: only where there are servers, and 1 in async mode */
  char *out;
  const char *conn[][2] = {
      {"", "--rpc-connections applies to shard servers (--shard-servers or --colocate-shards)"},
      {"--shard-servers 127.0.0.1:1 --sparse-mode async",
       "--rpc-connections 2 needs --sparse-mode sync: in async mode a Lookup of step t+1"}};
  for (size_t i = 0; i < sizeof conn / sizeof conn[0]; i++) {
    int rc = run_cmd(&out, "%s train --processed-data-file none.bin %s --rpc-connections 2",
                     bin_path(), conn[i][0]);
    ck_assert_msg(rc == 2 && strstr(out, conn[i][1]), "%s: exit %d: %s", conn[i][0], rc, out);
    free(out);
  }
  /* -1, the reference DLRM's default, is taken and documented */
  ck_assert_int_eq(run_cmd(&out, "%s train --help", bin_path()), 0);
  ck_assert_msg(strstr(out, "--test-freq N") && strstr(out, "at the end only"), "%s", out);
  free(out);
}
END_TEST

/* Numbers in flags are plain decimal ones, read alike by every command: a
 * hexadecimal number, a space before or after, a '+' in front, inf and nan
 * are not numbers; an integer too large for any type is out of the flag's
 * range (not "not an integer"); a list names its entry. Each stops the
 * command with exit 2 before anything is read or served. */
START_TEST(test_number_syntax) {
  struct { const char *cmd, *args, *want; } c[] = {
      {"train", "--learning-rate 0x10", "--learning-rate: '0x10' is not a number"},
      {"train", "--learning-rate ' 5'", "--learning-rate: ' 5' is not a number"},
      {"train", "--learning-rate '5 '", "--learning-rate: '5 ' is not a number"},
      {"train", "--learning-rate inf", "--learning-rate: 'inf' is not a number"},
      {"train", "--learning-rate 1e400", "--learning-rate: 1e400 is out of range [0, 1000000]"},
      {"train", "--rpc-deadline 0x1p3", "--rpc-deadline: '0x1p3' is not a number"},
      {"predict", "--rpc-deadline nan", "--rpc-deadline: 'nan' is not a number"},
      {"datagen", "--scale ' 0.5'", "--scale: ' 0.5' is not a number"},
      {"train", "--mini-batch-size ' 5'", "--mini-batch-size: ' 5' is not an integer"},
      {"eval", "--mini-batch-size +5", "--mini-batch-size: '+5' is not an integer"},
      {"serve", "--threads ' 4'", "--threads: ' 4' is not an integer"},
      {"train", "--num-batches 99999999999999999999999",
       "--num-batches: 99999999999999999999999 is out of range [0, 1099511627776]"},
      {"train", "--seed 99999999999999999999999",
       "--seed: 99999999999999999999999 is out of range [0, 18446744073709551615]"},
      {"datagen", "--rows -1", "--rows: -1 is out of range [0, 18446744073709551615]"},
      {"serve", "--shard 4294967297 --plan none.json",
       "--shard: entry 1: 4294967297 is out of range [0, 65535]"},
      {"serve", "--shard 0,-1 --plan none.json", "--shard: entry 2: -1 is out of range [0, 65535]"},
      {"serve", "--shard '0, 1' --plan none.json", "--shard: entry 2: ' 1' is not an integer"},
      {"inspect", "--rows 3,99999999999999999999 none",
       "--rows: entry 2: 99999999999999999999 is out of range [0, 18446744073709551615]"},
      {"plan", "--table-sizes 5,+7 --out none.json", "--table-sizes: entry 2: '+7' is not an integer"},
      {"train", "--metrics-listen '127.0.0.1: 80'", "--metrics-listen '127.0.0.1: 80' is not HOST:PORT"},
  };
  char *d = tmpdir_make("test");
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    char *out;
    int rc = run_cmd(&out, "cd %s && %s %s %s", d, bin_path(), c[i].cmd, c[i].args);
    char want[512];
    snprintf(want, sizeof want, "shardrec %s: %s", c[i].cmd, c[i].want);
    ck_assert_msg(rc == 2 && strstr(out, want), "%s %s: exit %d: %s", c[i].cmd, c[i].args, rc,
                  out);
    free(out);
  }
  /* nothing was made */
  ck_assert_int_eq(run_cmd(NULL, "rmdir %s", d), 0);
  free(d);
}
END_TEST

/* Damaged input end to end: a gzip file cut in half (convert, strict
 * or not), a converted file with one dense value made inf behind valid
 * checksums, a damaged magic and an empty file given as processed data:
 * each refused naming the file and where, never trained on. */
START_TEST(test_bad_files_refused) {
  char *d = make_data_dir(600, 9, "head -200 d.tsv | gzip > g.gz && "
                          "head -c $(( $(stat -c %%s g.gz) / 2 )) g.gz > cut.gz && : > e.bin && "
                          "cp d.bin m.bin && printf 'SR?' | dd of=m.bin conv=notrunc 2>/dev/null"),
       *out;
  for (int strict = 0; strict < 2; strict++) {
    ck_assert_int_eq(run_cmd(&out, "cd %s && %s convert %s cut.gz o.bin", d, bin_path(),
                             strict ? "--strict" : ""), 1);
    ck_assert_msg(strstr(out, "cut.gz: truncated or corrupt gzip stream at compressed byte"), "%s",
                  out);
    free(out);
    ck_assert_int_eq(run_cmd(NULL, "test -e %s/o.bin", d), 1);
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/d.bin", d);
  FILE *f = fopen(path, "rb");
  unsigned char h[DS_BIN_HEADER_SIZE];
  ck_assert_int_eq((int)fread(h, 1, sizeof h, f), (int)sizeof h);
  fclose(f);
  uint64_t doff;
  memcpy(&doff, h + 88, 8);
  const float inf = INFINITY;
  edit_bin(path, doff + 5 * (56 + 26 * 4) + 4 + 2 * 4, &inf); /* record 5, I3 */
  ck_assert_int_ne(run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --num-batches 4 "
                                 "--mini-batch-size 16", d, bin_path()), 0);
  ck_assert_msg(strstr(out, "d.bin: record 5: dense I3 is inf, not a finite number"), "%s", out);
  ck_assert_msg(!strstr(out, "done   "), "%s", out);
  free(out);
  const char *bad[] = {"m.bin", "e.bin"};
  const char *want[] = {"m.bin: not a shardrec binary file (magic 'SR?RITEO'",
                        "e.bin: not a shardrec binary file (magic '': the file is empty"};
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(run_cmd(&out, "cd %s && %s train --processed-data-file %s", d, bin_path(),
                             bad[i]), 1);
    ck_assert_msg(strstr(out, want[i]) && !strstr(out, "is not 0 or 1"), "%s", out);
    free(out);
  }
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("bad_input");
  TCase *tc = tcase_create("bad_input");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_convert_no_samples);
  tcase_add_test(tc, test_train_malformed_once);
  tcase_add_test(tc, test_dead_owner_tmp_removed);
  tcase_add_test(tc, test_flag_ranges);
  tcase_add_test(tc, test_number_syntax);
  tcase_add_test(tc, test_bad_files_refused);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
