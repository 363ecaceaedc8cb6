/* What a command may replace at its output path, for every command that
 * writes, through the real binary. For each output and each kind of thing
 * already standing at its path (nothing; a previous output of the same
 * command; a regular file of foreign content; a folder of foreign files;
 * for folder outputs also a previous output with one foreign file added):
 *   - folder outputs (train --save-model, --save-checkpoint, reshard --to,
 *     with --force) write over nothing or a folder of checkpoints only;
 *   - single-file outputs replace nothing or a regular file, never a folder;
 *   - a refused command exits non-zero naming the path, and the folder it
 *     ran in is the same before and after (every entry's type and name,
 *     every file's size and SHA-256): nothing removed, nothing written, no
 *     temporary left;
 *   - an accepted one leaves its output, whole, where the old thing stood,
 *     and no temporary beside it.
 * And reshard --to without --force refuses its previous output; a
 * --save-model folder that takes a foreign file while the job trains is
 * refused when the model would replace it. */
#include <check.h>
#include <sys/stat.h>

#include "tests/check_main.h"
#include "tests/support/proc.h"

static char *data; /* datagen, convert, two plans, a checkpoint folder, two metrics files */

static void setup_data(void) {
  data = make_data_dir(
      2000, 3,
      "%s plan --out p1.json --processed-data-file d.bin --num-shards 1 && "
      "%s plan --out p2.json --processed-data-file d.bin --num-shards 2 && "
      "%s train --processed-data-file d.bin --plan p1.json --mini-batch-size 64 --num-batches 3 "
      "--print-freq 1 --save-checkpoint ck --checkpoint-every 1 --metrics-out m3.jsonl && "
      "%s train --processed-data-file d.bin --plan p1.json --mini-batch-size 64 --num-batches 2 "
      "--print-freq 1 --metrics-out m2.jsonl",
      bin_path(), bin_path(), bin_path(), bin_path());
}

static void teardown_data(void) {
  run_cmd(NULL, "rm -rf %s", data);
  free(data);
}

/* An output: the command (@D: the data folder, @V: 2 for the previous
 * output, 3 for the run under test, so that the two differ) and its path,
 * relative to the folder the command runs in. */
typedef struct {
  const char *what, *cmd, *target;
  int folder; /* 1: a folder output; 2: one written into rather than replaced */
} output;

static const output outputs[] = {
    {"train --save-model",
     "train --processed-data-file @D/d.bin --plan @D/p1.json --mini-batch-size 64 "
     "--num-batches @V --save-model tgt-model",
     "tgt-model", 1},
    {"train --save-checkpoint",
     "train --processed-data-file @D/d.bin --mini-batch-size 64 --num-batches @V "
     "--save-checkpoint tgt-ckpt",
     "tgt-ckpt", 2},
    {"reshard --to --force",
     "reshard --from @D/ck/step-@V --to tgt-reshard --plan @D/p2.json --force", "tgt-reshard", 1},
    {"train --metrics-out",
     "train --processed-data-file @D/d.bin --plan @D/p1.json --mini-batch-size 64 "
     "--num-batches @V --print-freq 1 --metrics-out tgt-metrics.jsonl",
     "tgt-metrics.jsonl", 0},
    {"train --plan-out",
     "train --processed-data-file @D/d.bin --mini-batch-size 64 --num-batches 1 "
     "--num-shards @V --plan-out tgt-plan-out.json",
     "tgt-plan-out.json", 0},
    {"convert", "convert --test-fraction 0.@V @D/d.tsv tgt.bin", "tgt.bin", 0},
    {"datagen --out", "datagen --rows @V0 --seed 5 --out tgt.tsv", "tgt.tsv", 0},
    {"predict --out",
     "predict --checkpoint @D/ck/step-@V --processed-data-file @D/d.bin --out tgt-pred.txt",
     "tgt-pred.txt", 0},
    {"predict --metrics-out",
     "predict --checkpoint @D/ck/step-@V --processed-data-file @D/d.bin --out side-pred.txt "
     "--metrics-out tgt-pm.json",
     "tgt-pm.json", 0},
    {"eval --out",
     "eval --checkpoint @D/ck/step-@V --processed-data-file @D/d.bin --out tgt-eval.txt",
     "tgt-eval.txt", 0},
    {"plot --out", "plot @D/m@V.jsonl --out tgt.png", "tgt.png", 0},
    {"plan --out", "plan --out tgt-plan.json --processed-data-file @D/d.bin --num-shards @V",
     "tgt-plan.json", 0},
};
#define N_OUTPUTS ((int)(sizeof outputs / sizeof outputs[0]))

/* What stands at the path before the run. */
enum { K_NOTHING, K_PREVIOUS, K_FILE, K_FOLDER, K_PREVIOUS_PLUS, N_KINDS };
static const char *const kind_name[] = {"nothing", "a previous output", "a foreign file",
                                        "a folder of foreign files",
                                        "a previous output and a foreign file"};

/* The loop index as (output, kind): every output with the first four
 * kinds, folder outputs with the fifth too. */
static void case_of(int i, const output **o, int *k) {
  for (int n = 0; n < N_OUTPUTS; n++) {
    int kinds = outputs[n].folder ? N_KINDS : K_PREVIOUS_PLUS;
    if (i < kinds) {
      *o = &outputs[n];
      *k = i;
      return;
    }
    i -= kinds;
  }
  ck_abort_msg("no such case");
}

static int n_cases(void) {
  int n = 0;
  for (int i = 0; i < N_OUTPUTS; i++) n += outputs[i].folder ? N_KINDS : K_PREVIOUS_PLUS;
  return n;
}

/* o's command with @D and @V filled in, run in the folder w; its output
 * into *out (caller frees). The exit status. */
static int run_output(const output *o, const char *w, char v, char **out) {
  char cmd[4096];
  size_t n = 0;
  for (const char *p = o->cmd; *p && n + 600 < sizeof cmd; p++) {
    if (p[0] == '@' && p[1] == 'D') n += (size_t)snprintf(cmd + n, sizeof cmd - n, "%s", data), p++;
    else if (p[0] == '@' && p[1] == 'V') cmd[n++] = v, p++;
    else cmd[n++] = *p;
  }
  cmd[n] = 0;
  return run_cmd(out, "cd %s && %s %s", w, bin_path(), cmd);
}

/* Every entry under w (type and path; a file's size and SHA-256). */
static char *snapshot(const char *w) {
  char *out;
  int rc = run_cmd(&out, "cd %s && find . ! -type f -printf '%%y %%p\\n' | LC_ALL=C sort && "
                         "find . -type f -printf '%%s %%p\\n' | LC_ALL=C sort && "
                         "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum",
                   w);
  ck_assert_msg(rc == 0, "%s", out);
  return out;
}

/* The SHA-256 of the file w/name, or "" when it is not a regular file. */
static void file_hash(const char *w, const char *name, char *hex) {
  char *out;
  hex[0] = 0;
  if (run_cmd(&out, "cd %s && test -f %s && sha256sum < %s", w, name, name) == 0)
    snprintf(hex, 65, "%.64s", out);
  free(out);
}

/* Put kind k at w/o->target. */
static void plant(const output *o, const char *w, int k) {
  char *out;
  int rc = 0;
  if (k == K_PREVIOUS || k == K_PREVIOUS_PLUS) {
    rc = run_output(o, w, '2', &out);
    ck_assert_msg(rc == 0, "%s: the previous output: %s", o->what, out);
    free(out);
  }
  if (k == K_FILE)
    rc = run_cmd(NULL, "cd %s && printf 'foreign content\\n' > %s", w, o->target);
  else if (k == K_FOLDER)
    rc = run_cmd(NULL, "cd %s && mkdir -p %s/sub && printf 'notes\\n' > %s/notes.txt && "
                       "cp %s/d.bin %s/sub/data.bin", w, o->target, o->target, data, o->target);
  else if (k == K_PREVIOUS_PLUS)
    rc = run_cmd(NULL, "cd %s && printf 'notes\\n' > %s/notes.txt", w, o->target);
  ck_assert_int_eq(rc, 0);
}

/* Whether the kind k at o's path is one the command may replace. */
static int replaceable(const output *o, int k) {
  if (k == K_NOTHING || k == K_PREVIOUS) return 1;
  return !o->folder && k == K_FILE;
}

static void check_accepted(const output *o, const char *w, int k, const char *before_hash,
                           int rc, const char *out) {
  char *ls;
  ck_assert_msg(rc == 0, "%s over %s: rc %d: %s", o->what, kind_name[k], rc, out);
  if (o->folder) {
    /* The new step-3, whole; replaced: nothing else. */
    ck_assert_int_eq(run_cmd(&ls, "cd %s/%s && test -f step-3/DONE && LC_ALL=C ls -A", w,
                             o->target), 0);
    if (o->folder == 1) ck_assert_msg(!strcmp(ls, "step-3\n"), "%s: %s", o->what, ls);
    else ck_assert_msg(strstr(ls, "step-3\n") != NULL, "%s: %s", o->what, ls);
    free(ls);
  } else {
    char hex[65];
    file_hash(w, o->target, hex);
    ck_assert_msg(hex[0], "%s over %s: %s is not a regular file", o->what, kind_name[k], o->target);
    ck_assert_msg(strcmp(hex, before_hash), "%s over %s: %s was not rewritten", o->what,
                  kind_name[k], o->target);
    struct stat st;
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", w, o->target);
    ck_assert(stat(p, &st) == 0 && st.st_size > 0);
  }
  /* No temporary beside it or in it. */
  ck_assert_int_eq(run_cmd(&ls, "cd %s && find . -name '*tmp*' -o -name '*.old-*'", w), 0);
  ck_assert_msg(!ls[0], "%s over %s: left %s", o->what, kind_name[k], ls);
  free(ls);
}

START_TEST(test_output_rule) {
  const output *o;
  int k;
  case_of(_i, &o, &k);
  char w[4096];
  snprintf(w, sizeof w, "%s/w%d", data, _i);
  ck_assert_int_eq(mkdir(w, 0777), 0);
  plant(o, w, k);
  char before_hash[65], *out;
  file_hash(w, o->target, before_hash);
  char *before = snapshot(w);
  int rc = run_output(o, w, '3', &out);
  if (replaceable(o, k)) {
    check_accepted(o, w, k, before_hash, rc, out);
  } else {
    char *after = snapshot(w);
    ck_assert_msg(rc != 0 && strstr(out, o->target), "%s over %s: rc %d: %s", o->what,
                  kind_name[k], rc, out);
    ck_assert_msg(!strcmp(before, after), "%s over %s: the folder changed:\n%s\n---\n%s",
                  o->what, kind_name[k], before, after);
    free(after);
  }
  free(before);
  free(out);
  run_cmd(NULL, "rm -rf %s", w);
}
END_TEST

/* reshard --to without --force: a previous output (a folder of
 * checkpoints) is refused too, and kept. */
START_TEST(test_reshard_no_force) {
  char w[4096], *out;
  snprintf(w, sizeof w, "%s/wnf", data);
  ck_assert_int_eq(mkdir(w, 0777), 0);
  plant(&outputs[2], w, K_PREVIOUS);
  char *before = snapshot(w);
  int rc = run_cmd(&out, "cd %s && %s reshard --from %s/ck/step-3 --to tgt-reshard --plan "
                         "%s/p2.json", w, bin_path(), data, data);
  ck_assert_msg(rc == 1 && strstr(out, "--to tgt-reshard: already exists (give --force"), "%s",
                out);
  char *after = snapshot(w);
  ck_assert_str_eq(before, after);
  free(after);
  free(before);
  free(out);
  run_cmd(NULL, "rm -rf %s", w);
}
END_TEST

/* train --save-model over a previous output that takes a foreign file
 * while the job trains (the trainer held stopped meanwhile): refused when
 * the model would replace it, naming the file; the folder as it was, and
 * the model's temporary removed. */
START_TEST(test_save_model_changed_meanwhile) {
  char w[4096], log[4200];
  snprintf(w, sizeof w, "%s/wlate", data);
  snprintf(log, sizeof log, "%s/late.out", data);
  ck_assert_int_eq(mkdir(w, 0777), 0);
  plant(&outputs[0], w, K_PREVIOUS);
  pid_t pid = spawn_sh("cd %s && exec %s train --processed-data-file %s/d.bin --plan %s/p1.json "
                       "--mini-batch-size 16 --nepochs 50 --num-batches 1500 --print-freq 1 "
                       "--save-model tgt-model > %s 2>&1",
                       w, bin_path(), data, data, log);
  wait_text(log, "train  step 1/", 1, pid, 120);
  ck_assert_int_eq(kill(pid, SIGSTOP), 0);
  ck_assert_int_eq(run_cmd(NULL, "printf 'notes\\n' > %s/tgt-model/notes.txt", w), 0);
  char *before = snapshot(w);
  ck_assert_int_eq(kill(pid, SIGCONT), 0);
  int st = wait_exit(pid, 300);
  char *out = slurp(log);
  const char *end = out + (strlen(out) > 1500 ? strlen(out) - 1500 : 0); /* for a message */
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1 &&
                    strstr(out, "--save-model: tgt-model: holds notes.txt, which is not part"),
                "status %d: ...%s", st, end);
  ck_assert_msg(strstr(out, "train  step 1500/"), "...%s", end); /* refused at the end */
  char *after = snapshot(w);
  ck_assert_str_eq(before, after);
  free(after);
  free(out);
  free(before);
  run_cmd(NULL, "rm -rf %s", w);
}
END_TEST

int main(void) {
  Suite *s = suite_create("outputs");
  TCase *tc = tcase_create("outputs");
  tcase_set_timeout(tc, 120);
  tcase_add_unchecked_fixture(tc, setup_data, teardown_data);
  tcase_add_loop_test(tc, test_output_rule, 0, n_cases());
  tcase_add_test(tc, test_reshard_no_force);
  tcase_add_test(tc, test_save_model_changed_meanwhile);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
