/* --metrics-out across an interruption, through the real binary: a job
 * with periodic checkpoints is SIGKILLed once its metrics file shows a
 * step past a checkpoint, a torn line is left at the file's end (as a
 * crash mid-write leaves), and the job is resumed (--resume DIR, or the
 * same command again with --auto-resume). Its file must then be the
 * uninterrupted job's line for line, timing fields aside. A file cut back
 * before the checkpoint's own lines (a stop between the checkpoint and its
 * lines) gets them written again. */
#include <check.h>

#include "tests/check_main.h"

#include <signal.h>
#include <sys/wait.h>

#include "tests/support/proc.h"

/* 2700 train samples, 43 steps an epoch: the 150 steps cross epochs (and
 * their test passes at 43, 86 and 129); lines every 5 steps, a test pass
 * and a checkpoint every 25. */
#define FLAGS "--processed-data-file d.bin --mini-batch-size 64 --nepochs 4 --num-batches 150 " \
              "--print-freq 5 --test-freq 25 "
#define TORN "{\"kind\":\"train\",\"step\":4"

static char *dir;

static void setup(void) { dir = make_data_dir(3000, 13, NULL); }

static void teardown(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

static char *at(const char *name) {
  static char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return p;
}

/* The lines of the metrics file name without the timing fields (samples/s,
 * phase times, lookup time in flight), keys sorted; caller frees. */
static char *untimed(const char *name) {
  char *out;
  int rc = run_cmd(&out, "cd %s && /usr/bin/python3 -c \"\n"
                         "import json, sys\n"
                         "for l in open(sys.argv[1]):\n"
                         "    j = json.loads(l)\n"
                         "    for k in ('samples_per_s', 'step_ms', 'lookup_in_flight_ms'):\n"
                         "        j.pop(k, None)\n"
                         "    print(json.dumps(j, sort_keys=True))\" %s",
                   dir, name);
  ck_assert_msg(rc == 0, "%s: %s", name, out);
  return out;
}

/* Lines of text. */
static int lines_in(const char *text) {
  int n = 0;
  for (const char *p = text; (p = strchr(p, '\n')); p++) n++;
  return n;
}

/* The uninterrupted job's file, untimed. */
static char *reference(void) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train " FLAGS "--metrics-out ref.jsonl", dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  char *ref = untimed("ref.jsonl");
  ck_assert_int_eq(lines_in(ref), 30 + 6 + 3); /* every 5 steps; every 25; 3 epoch ends */
  return ref;
}

/* Start cmd (a train run writing metrics), SIGKILL it once metrics shows
 * step 35 (past the step-25 checkpoint, which comes first), and leave a
 * torn line at the file's end. */
static void interrupt(const char *cmd, const char *metrics) {
  pid_t pid = spawn_sh("cd '%s' && exec %s > /dev/null 2>&1", dir, cmd);
  wait_text(at(metrics), "\"step\":35,", 1, pid, 300);
  ck_assert_int_eq(kill(pid, SIGKILL), 0);
  int st = wait_exit(pid, 60);
  ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the job ended before the kill (%d)", st);
  FILE *f = fopen(at(metrics), "a");
  ck_assert_ptr_nonnull(f);
  fputs(TORN, f);
  fclose(f);
}

/* Run cmd, a resumed job, to its end; then its metrics file must be ref
 * (untimed), and its output must say that it resumed and what it dropped
 * of the file. */
static void resume(const char *cmd, const char *metrics, const char *ref) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s", dir, cmd);
  ck_assert_msg(rc == 0 && strstr(out, "resume "), "exit %d: %s", rc, out);
  char *got = untimed(metrics);
  size_t i = 0, line = 1;
  for (; ref[i] && ref[i] == got[i]; i++) line += ref[i] == '\n';
  if (ref[i] != got[i]) { /* the first line that differs, and the counts */
    size_t s = i;
    while (s > 0 && ref[s - 1] != '\n') s--;
    ck_abort_msg("%s: line %zu of %d (uninterrupted: %d):\n%.300s\nuninterrupted:\n%.300s",
                 metrics, line, lines_in(got), lines_in(ref), got + s, ref + s);
  }
  free(got);
  char want[100];
  snprintf(want, sizeof want, "metrics %s: ", metrics);
  ck_assert_msg(strstr(out, want) && strstr(out, " byte(s) after them dropped"), "%s", out);
  free(out);
}

/* The metrics file from as a stop between the step-25 checkpoint and its
 * lines leaves it: the lines of steps before 25 and a torn one, into to. */
static void cut_before_25(const char *from, const char *to) {
  char *out;
  int rc = run_cmd(&out, "cd %s && /usr/bin/python3 -c \"\n"
                         "import json, sys\n"
                         "kept = [l for l in open(sys.argv[1]) if json.loads(l)['step'] < 25]\n"
                         "open(sys.argv[2], 'w').write(''.join(kept) + sys.argv[3])\n"
                         "print(len(kept))\" %s %s '%s'",
                   dir, from, to, TORN);
  ck_assert_msg(rc == 0 && atoi(out) == 4, "%s", out); /* steps 5, 10, 15, 20 */
  free(out);
}

/* --resume DIR: the newest complete checkpoint; then, the file cut back
 * before step 25 (its train and test lines gone), --resume DIR/step-25. */
START_TEST(test_resume_keeps_metrics) {
  char *ref = reference();
  char cmd[1000];
  snprintf(cmd, sizeof cmd, "%s train " FLAGS "--metrics-out r.jsonl --save-checkpoint ck "
           "--checkpoint-every 25 --keep-checkpoints 0", bin_path());
  interrupt(cmd, "r.jsonl");
  snprintf(cmd, sizeof cmd, "%s train " FLAGS "--metrics-out r.jsonl --resume ck", bin_path());
  resume(cmd, "r.jsonl", ref);
  cut_before_25("r.jsonl", "r25.jsonl");
  snprintf(cmd, sizeof cmd, "%s train " FLAGS "--metrics-out r25.jsonl --resume ck/step-25",
           bin_path());
  resume(cmd, "r25.jsonl", ref);
  free(ref);
}
END_TEST

/* --auto-resume: the same command, killed, then run again to its end. */
START_TEST(test_auto_resume_keeps_metrics) {
  char *ref = reference();
  char cmd[1000];
  snprintf(cmd, sizeof cmd, "%s train " FLAGS "--metrics-out a.jsonl --save-checkpoint cka "
           "--checkpoint-every 25 --auto-resume", bin_path());
  interrupt(cmd, "a.jsonl");
  resume(cmd, "a.jsonl", ref);
  free(ref);
}
END_TEST

int main(void) {
  Suite *s = suite_create("resume_metrics");
  TCase *tc = tcase_create("resume_metrics");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_resume_keeps_metrics);
  tcase_add_test(tc, test_auto_resume_keeps_metrics);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
