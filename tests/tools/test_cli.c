/* The shardrec command line: help, unknown commands and flags, malformed
 * values, missing files. Each error must name what was wrong. */
#include <check.h>

#include "tests/check_main.h"

#include "tests/support/proc.h"

START_TEST(test_help_lists_commands) {
  char *out;
  ck_assert_int_eq(run_cmd(&out, "%s help", bin_path()), 0);
  const char *cmds[] = {"datagen", "convert", "plan", "train", "eval", "bench"};
  for (int i = 0; i < 6; i++) ck_assert_msg(strstr(out, cmds[i]), "help lacks %s: %s", cmds[i], out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s train --help", bin_path()), 0);
  ck_assert_ptr_nonnull(strstr(out, "--arch-mlp-bot"));
  ck_assert_ptr_nonnull(strstr(out, "--mini-batch-size"));
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s help eval", bin_path()), 0);
  ck_assert_ptr_nonnull(strstr(out, "--model"));
  free(out);
}
END_TEST

/* eval and predict name a concept alike: --checkpoint (alias --model) and
 * --data-split (alias --split), each alias in --help and accepted. */
START_TEST(test_eval_predict_flag_names) {
  const char *cmds[] = {"eval", "predict"};
  for (int i = 0; i < 2; i++) {
    char *out;
    ck_assert_int_eq(run_cmd(&out, "%s %s --help", bin_path(), cmds[i]), 0);
    ck_assert_msg(strstr(out, "  --checkpoint "), "%s: %s", cmds[i], out);
    ck_assert_msg(strstr(out, "  --data-split "), "%s: %s", cmds[i], out);
    ck_assert_msg(strstr(out, "alias of --checkpoint"), "%s: %s", cmds[i], out);
    ck_assert_msg(strstr(out, "alias of --data-split"), "%s: %s", cmds[i], out);
    free(out);
    /* Both spellings of the split reach the same check. */
    const char *split[] = {"--data-split", "--split"};
    for (int k = 0; k < 2; k++) {
      ck_assert_int_eq(run_cmd(&out, "%s %s --model m --processed-data-file x --out p %s most",
                               bin_path(), cmds[i], split[k]), 2);
      ck_assert_msg(strstr(out, "--data-split: 'most' is not"), "%s %s: %s", cmds[i], split[k],
                    out);
      free(out);
    }
  }
}
END_TEST

/* The commands that open a data file, the data flags each takes, and the
 * operands around a flag under test that carry the command to its flag
 * checks (paths under a folder that does not exist: nothing is written).
 * model: the command scores a model, whose data transform maps raw rows
 * (--raw-data-file says so; the mapping flags are refused saying so). */
static const struct {
  const char *cmd, *pre, *post, *takes, *split; /* split: --data-split's default */
  int model;
} data_cmds[] = {
    {"train", "--raw-data-file /nonexistent/d.tsv", "",
     " processed-data-file raw-data-file data-set test-fraction max-ind-range"
     " frequency-threshold strict ", NULL, 0},
    {"eval", "--model /nonexistent/m --processed-data-file /nonexistent/d.bin", "",
     " processed-data-file raw-data-file data-split split data-set test-fraction ", "test", 1},
    {"predict", "--model /nonexistent/m --processed-data-file /nonexistent/d.bin"
     " --out /nonexistent/p.tsv", "",
     " processed-data-file raw-data-file data-split split data-set test-fraction"
     " no-label strict ", "all", 1},
    {"plan", "--out /nonexistent/plan.json --table-sizes 3", "",
     " processed-data-file raw-data-file data-set test-fraction max-ind-range"
     " frequency-threshold ", NULL, 0},
    {"convert", "", "/nonexistent/in.tsv /nonexistent/out.bin",
     " test-fraction max-ind-range frequency-threshold no-label strict ", NULL, 0},
};
#define N_DATA_CMDS (sizeof data_cmds / sizeof data_cmds[0])

static int takes_flag(size_t c, const char *flag) {
  char word[64];
  snprintf(word, sizeof word, " %s ", flag);
  return strstr(data_cmds[c].takes, word) != NULL;
}

/* The text of flag's line in help (after the flag, its argument and the
 * padding; an argument follows one space, the text two or more), into
 * buf; NULL when help has no line for the flag. */
static const char *help_text(const char *help, const char *flag, char *buf, size_t n) {
  char head[64];
  snprintf(head, sizeof head, "\n  --%s ", flag);
  const char *p = strstr(help, head);
  if (!p) return NULL;
  p += strlen(head);
  if (*p != ' ') p += strcspn(p, " \n"); /* the argument */
  p += strspn(p, " ");
  snprintf(buf, n, "%.*s", (int)strcspn(p, "\n"), p);
  return buf;
}

/* Every command that takes a data flag prints the same help for it (but
 * for --data-split's default, and --raw-data-file's, which the commands
 * that score a model print alike) and the same message for the same bad
 * value; one that does not take it refuses it as an unknown option, but
 * for the mapping flags, which a command scoring a model refuses because
 * the model's transform decides them. */
START_TEST(test_data_flags_alike) {
  const char *flags[] = {"processed-data-file", "raw-data-file", "data-split", "split",
                         "data-set", "test-fraction", "max-ind-range", "frequency-threshold",
                         "no-label", "strict"};
  char *help[N_DATA_CMDS];
  for (size_t c = 0; c < N_DATA_CMDS; c++)
    ck_assert_int_eq(run_cmd(&help[c], "%s %s --help", bin_path(), data_cmds[c].cmd), 0);
  for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
    char first[2][512] = {"", ""}, text[512];
    const char *first_cmd[2] = {NULL, NULL};
    const int by_group = !strcmp(flags[f], "raw-data-file");
    for (size_t c = 0; c < N_DATA_CMDS; c++) {
      char *out;
      const int mapping = !strcmp(flags[f], "max-ind-range") ||
                          !strcmp(flags[f], "frequency-threshold");
      if (!takes_flag(c, flags[f]) && mapping && data_cmds[c].model) {
        ck_assert_int_eq(run_cmd(&out, "%s %s %s --%s 5 %s", bin_path(), data_cmds[c].cmd,
                                 data_cmds[c].pre, flags[f], data_cmds[c].post), 2);
        char want[160];
        snprintf(want, sizeof want, "shardrec %s: --%s: raw rows are mapped with the model's own "
                 "data transform", data_cmds[c].cmd, flags[f]);
        ck_assert_msg(strstr(out, want), "%s --%s: %s", data_cmds[c].cmd, flags[f], out);
        ck_assert_msg(help_text(help[c], flags[f], text, sizeof text) == NULL,
                      "%s --help shows --%s", data_cmds[c].cmd, flags[f]);
        free(out);
        continue;
      }
      if (!takes_flag(c, flags[f])) {
        if (!strcmp(data_cmds[c].cmd, "convert") && !strcmp(flags[f], "split")) continue;
        ck_assert_int_eq(run_cmd(&out, "%s %s %s --%s v %s", bin_path(), data_cmds[c].cmd,
                                 data_cmds[c].pre, flags[f], data_cmds[c].post), 2);
        char want[96];
        snprintf(want, sizeof want, "unknown option --%s", flags[f]);
        ck_assert_msg(strstr(out, want), "%s --%s: %s", data_cmds[c].cmd, flags[f], out);
        free(out);
        continue;
      }
      ck_assert_msg(help_text(help[c], flags[f], text, sizeof text), "%s --help lacks --%s: %s",
                    data_cmds[c].cmd, flags[f], help[c]);
      if (!strcmp(flags[f], "data-split")) {
        char want[64];
        snprintf(want, sizeof want, "which part to score (%s);", data_cmds[c].split);
        ck_assert_msg(!strcmp(text, want), "%s --data-split: '%s'", data_cmds[c].cmd, text);
        continue;
      }
      const int g = by_group && data_cmds[c].model;
      if (g)
        ck_assert_msg(strstr(text, "mapped with the model's"), "%s --raw-data-file: '%s'",
                      data_cmds[c].cmd, text);
      if (!first_cmd[g]) {
        first_cmd[g] = data_cmds[c].cmd;
        snprintf(first[g], sizeof first[g], "%s", text);
      }
      ck_assert_msg(!strcmp(text, first[g]), "--%s: %s says '%s', %s says '%s'", flags[f],
                    first_cmd[g], first[g], data_cmds[c].cmd, text);
    }
  }
  for (size_t c = 0; c < N_DATA_CMDS; c++) free(help[c]);
  /* One bad value per flag that reads one, and the message every command
   * taking the flag prints for it ("shardrec CMD: " first). */
  const char *bad[][3] = {
      {"data-set", "bogus", "--data-set: 'bogus' is not kaggle or terabyte"},
      {"data-split", "most", "--data-split: 'most' is not test, val, train or all"},
      {"split", "most", "--data-split: 'most' is not test, val, train or all"},
      {"test-fraction", "2", "--test-fraction: 2 is out of range [0, 1] of the lines"},
      {"max-ind-range", "-1",
       "--max-ind-range: -1 is out of range [0, 1099511627776] rows (0: none)"},
      {"frequency-threshold", "4294967296",
       "--frequency-threshold: 4294967296 is out of range [0, 4294967295] occurrences"},
  };
  for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++)
    for (size_t c = 0; c < N_DATA_CMDS; c++) {
      if (!takes_flag(c, bad[b][0])) continue;
      char *out, want[256];
      ck_assert_int_eq(run_cmd(&out, "%s %s %s --%s %s %s", bin_path(), data_cmds[c].cmd,
                               data_cmds[c].pre, bad[b][0], bad[b][1], data_cmds[c].post), 2);
      snprintf(want, sizeof want, "shardrec %s: %s\n", data_cmds[c].cmd, bad[b][2]);
      ck_assert_msg(strstr(out, want), "%s --%s %s: want '%s', got: %s", data_cmds[c].cmd,
                    bad[b][0], bad[b][1], want, out);
      free(out);
    }
}
END_TEST

START_TEST(test_unknown_command_and_flags) {
  char *out;
  ck_assert_int_eq(run_cmd(&out, "%s frobnicate", bin_path()), 2);
  ck_assert_ptr_nonnull(strstr(out, "unknown command 'frobnicate'"));
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s", bin_path()), 2);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s train --no-such-flag", bin_path()), 2);
  ck_assert_msg(strstr(out, "unknown option --no-such-flag"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s train --processed-data-file", bin_path()), 2);
  ck_assert_msg(strstr(out, "needs a value"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s bench nothing", bin_path()), 2);
  ck_assert_ptr_nonnull(strstr(out, "unknown benchmark"));
  free(out);
}
END_TEST

START_TEST(test_malformed_values) {
  char *out;
  ck_assert_int_eq(run_cmd(&out, "%s train --raw-data-file x --mini-batch-size 12x", bin_path()), 2);
  ck_assert_msg(strstr(out, "--mini-batch-size: '12x' is not an integer"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s train --raw-data-file x --mini-batch-size 0", bin_path()), 2);
  ck_assert_msg(strstr(out, "out of range"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s train --raw-data-file x --learning-rate abc", bin_path()), 2);
  ck_assert_msg(strstr(out, "--learning-rate: 'abc' is not a number"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s train --raw-data-file x --arch-mlp-bot 13-512--16", bin_path()), 2);
  ck_assert_msg(strstr(out, "--arch-mlp-bot"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s train --raw-data-file x --arch-interaction-op mul", bin_path()), 2);
  ck_assert_msg(strstr(out, "'mul' is not dot, cat or dcn"), "%s", out);
  free(out);
  /* The cross network's flags (and TorchRec's spellings): ranges, the op
   * they belong to, the bottom MLP's width, no CUDA. */
  const char *dcn_bad[][2] = {
      {"--arch-interaction-op dcn --dcn-num-layers 0", "--dcn-num-layers: 0 is out of range [1, 16] cross layers"},
      {"--interaction_type dcn --dcn_num_layers 17", "--dcn-num-layers: 17 is out of range [1, 16]"},
      {"--arch-interaction-op dcn --dcn-low-rank-dim 65537", "--dcn-low-rank-dim: 65537 is out of range [1, 65536]"},
      {"--arch-interaction-op dcn --dcn_low_rank_dim x", "--dcn-low-rank-dim: 'x' is not an integer"},
      {"--dcn-num-layers 2", "--dcn-num-layers and --dcn-low-rank-dim apply to --arch-interaction-op dcn only"},
      {"--arch-interaction-op cat --dcn-low-rank-dim 2", "apply to --arch-interaction-op dcn only"},
      {"--arch-interaction-op dcn --arch-mlp-bot 13-64-8",
       "dcn interaction needs the last bottom MLP width (8) to equal the embedding dimension (16)"},
      {"--arch-interaction-op dcn --device cuda", "--arch-interaction-op dcn runs on the CPU only"},
      {"--interaction_type dcn --device cuda:1", "drop --device cuda:1"},
  };
  for (size_t i = 0; i < sizeof dcn_bad / sizeof dcn_bad[0]; i++) {
    ck_assert_int_eq(run_cmd(&out, "%s train --raw-data-file x %s", bin_path(), dcn_bad[i][0]), 2);
    ck_assert_msg(strstr(out, dcn_bad[i][1]), "%s: %s", dcn_bad[i][0], out);
    free(out);
  }
  /* The bottom MLP's output must match the embedding dim for dot. */
  ck_assert_int_eq(run_cmd(&out, "%s train --raw-data-file x --arch-mlp-bot 13-64-8", bin_path()), 2);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s train --raw-data-file x --optimizer lbfgs", bin_path()), 2);
  ck_assert_msg(strstr(out, "'lbfgs'"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s train", bin_path()), 2);
  ck_assert_msg(strstr(out, "exactly one of"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s train --raw-data-file x --sparse-mode eventual", bin_path()), 2);
  ck_assert_msg(strstr(out, "--sparse-mode") && strstr(out, "eventual"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s serve --plan p.json --shard 0 --pending-timeout -1", bin_path()), 2);
  ck_assert_msg(strstr(out, "--pending-timeout") && strstr(out, "out of range"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s serve --plan p.json --shard 0 --stop-grace 0", bin_path()), 2);
  ck_assert_msg(strstr(out, "--stop-grace") && strstr(out, "out of range"), "%s", out);
  free(out);
}
END_TEST

START_TEST(test_missing_file) {
  char *out;
  ck_assert_int_eq(run_cmd(&out, "%s train --processed-data-file /nonexistent/x.bin", bin_path()), 1);
  ck_assert_msg(strstr(out, "/nonexistent/x.bin"), "message must name the file: %s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s eval --model /nonexistent/m --processed-data-file x", bin_path()), 1);
  ck_assert_msg(strstr(out, "/nonexistent/m: no such checkpoint folder"), "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "%s eval --checkpoint /nonexistent/m --processed-data-file x", bin_path()), 1);
  ck_assert_msg(strstr(out, "/nonexistent/m: no such checkpoint folder"), "%s", out);
  free(out);
}
END_TEST

/* The CUDA backend is a module loaded only for --device cuda: a CPU run
 * never maps cuBLAS (the loader's own trace, LD_DEBUG=files, lists every
 * library it maps, dlopen'ed ones too), --device cuda loads the module from
 * beside the binary, and a module that is not there is named. */
START_TEST(test_cuda_module_on_request) {
  char *out;
  ck_assert_int_eq(run_cmd(&out, "LD_DEBUG=files %s train --raw-data-file /nonexistent/x --device cpu",
                           bin_path()), 1);
  ck_assert_msg(strstr(out, "file=libopenblas") && !strstr(out, "libcublas") && !strstr(out, "libcudart"),
                "a CPU run maps CUDA libraries:\n%s", out);
  free(out);
#ifdef SR_TEST_CUDA_MODULE
  /* This machine may have no GPU: the module still loads before the device
   * is looked for. */
  int rc = run_cmd(&out, "LD_DEBUG=files %s train --raw-data-file /nonexistent/x --device cuda", bin_path());
  ck_assert_msg(rc != 0 && strstr(out, "libshardrec_cuda.so [0];  dynamically loaded by") &&
                    strstr(out, "file=libcublas"), "exit %d:\n%s", rc, out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "SHARDREC_CUDA_MODULE=/nonexistent/libm.so %s train --raw-data-file x "
                           "--device cuda:0", bin_path()), 2);
  ck_assert_msg(strstr(out, "--device cuda:0: the CUDA backend /nonexistent/libm.so does not load: "),
                "%s", out);
  free(out);
  /* a library that is not the module: named, refused */
  ck_assert_int_eq(run_cmd(&out, "SHARDREC_CUDA_MODULE=libz.so.1 %s train --raw-data-file x --device cuda",
                           bin_path()), 2);
  ck_assert_msg(strstr(out, "libz.so.1 is not this build's CUDA backend"), "%s", out);
  free(out);
#else
  ck_assert_int_eq(run_cmd(&out, "%s train --raw-data-file x --device cuda", bin_path()), 2);
  ck_assert_msg(strstr(out, "this build has no CUDA backend"), "%s", out);
  free(out);
#endif
}
END_TEST

int main(void) {
  Suite *s = suite_create("cli");
  TCase *tc = tcase_create("cli");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_help_lists_commands);
  tcase_add_test(tc, test_eval_predict_flag_names);
  tcase_add_test(tc, test_data_flags_alike);
  tcase_add_test(tc, test_unknown_command_and_flags);
  tcase_add_test(tc, test_malformed_values);
  tcase_add_test(tc, test_missing_file);
  tcase_add_test(tc, test_cuda_module_on_request);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
