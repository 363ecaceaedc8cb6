/* shardrec bench dp: data-parallel trainers under mpirun, colocated shards.
 *
 * Generates a synthetic set (shardrec datagen) in a temporary folder, then
 * for each repeat, mode and rank count runs
 *   mpirun --allow-run-as-root --oversubscribe -np N <this binary> train
 *     --colocate-shards --sparse-mode M ...
 * (one rank too goes through mpirun and colocated shards, so every row of
 * the table runs the same code path) and reads rank 0's summary lines:
 *   rate   <samples/s> samples/s over <N> rank(s); per step: dense compute
 *          <ms> ms, allreduce <ms> ms
 *   done   ... per step: ... lookup <ms>, ... push <ms>, ...
 * The samples/s leave out start-up (mpirun, data open, shard start). Repeats
 * are interleaved (every configuration once, then again) so a change of the
 * machine's load spreads over all of them; the table shows medians. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/sys.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "tools/bench/run_capture.h"

#define CMD "bench dp"
#define MAX_RANKS 8
#define MAX_RUNS 15

/* The last 2000 bytes of text (for failure reports). */
static const char *tail(const char *text) {
  size_t n = text ? strlen(text) : 0;
  return !text ? "(no output)" : n > 2000 ? text + n - 2000 : text;
}

typedef struct {
  double rate, dense_ms, allreduce_ms, lookup_ms, push_ms;
  int ranks;
} run_figures;

/* Rank 0's "rate" and "done" lines of a train run. 0, or -1 if absent. */
static int parse_run(const char *out, run_figures *f) {
  const char *r = strstr(out, "\nrate   ");
  if (!r && !strncmp(out, "rate   ", 7)) r = out - 1;
  if (!r || sscanf(r + 1, "rate   %lf samples/s over %d rank(s); per step: dense compute %lf ms, "
                          "allreduce %lf ms",
                   &f->rate, &f->ranks, &f->dense_ms, &f->allreduce_ms) != 4)
    return -1;
  const char *d = strstr(out, "\ndone   ");
  const char *lk = d ? strstr(d, " lookup ") : NULL, *pu = d ? strstr(d, " push ") : NULL;
  f->lookup_ms = lk ? strtod(lk + 8, NULL) : -1;
  f->push_ms = pu ? strtod(pu + 6, NULL) : -1;
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec bench dp [--rows N (200000)] [--batch B (1024)] [--steps S (60)]\n"
"                         [--ranks 1,2,4] [--modes sync,async] [--runs R (3)]\n"
"                         [--shards K (4)] [--max-staleness S (2)]\n"
"                         [--arch-mlp-bot 13-512-256-64-16] [--arch-mlp-top 512-256-1]\n"
"\n"
"Trains S steps of global batch B for each mode and rank count with\n"
"'mpirun -np N shardrec train --colocate-shards' (the plan's K shards spread over\n"
"the ranks) on a synthetic set of N rows, and prints samples/s (median of R runs)\n"
"with the ratio to one rank and rank 0's per-step dense compute, all-reduce,\n"
"lookup and push times.\n");
}

/* The flags, checked. */
typedef struct dp_flags {
  long long rows, batch, steps, runs, shards, staleness;
  const char *ranks_s, *modes_s, *bot, *top;
  int ranks[MAX_RANKS], nr;
  const char *modes[2];
  int nm;
} dp_flags;

/* --modes into f->modes. 0, or 2 with the message printed. */
static int parse_modes(dp_flags *f) {
  char m[64];
  snprintf(m, sizeof m, "%s", f->modes_s);
  for (char *save, *tok = strtok_r(m, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (f->nm < 2 && !strcmp(tok, "sync")) f->modes[f->nm++] = "sync";
    else if (f->nm < 2 && !strcmp(tok, "async")) f->modes[f->nm++] = "async";
    else {
      fprintf(stderr, "shardrec bench dp: --modes: '%s' is not sync or async (give sync,async)\n",
              tok);
      return 2;
    }
  }
  if (!f->nm) {
    fprintf(stderr, "shardrec bench dp: --modes: empty\n");
    return 2;
  }
  return 0;
}

/* Parse argv into *f. Returns -1 to go on, or the exit status (0 for
 * --help, 2 for bad usage, the message printed). */
static int parse_flags(int argc, char **argv, dp_flags *f) {
  static const struct option opts[] = {
      {"rows", required_argument, 0, 'r'},   {"batch", required_argument, 0, 'b'},
      {"steps", required_argument, 0, 's'},  {"ranks", required_argument, 0, 'n'},
      {"modes", required_argument, 0, 'm'},  {"runs", required_argument, 0, 'R'},
      {"shards", required_argument, 0, 'k'}, {"max-staleness", required_argument, 0, 'S'},
      {"arch-mlp-bot", required_argument, 0, 'B'}, {"arch-mlp-top", required_argument, 0, 'T'},
      {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'r': if (cli_int(CMD, "--rows", optarg, 1000, 1LL << 32, &f->rows)) return 2; break;
      case 'b': if (cli_int(CMD, "--batch", optarg, 1, 1 << 20, &f->batch)) return 2; break;
      case 's': if (cli_int(CMD, "--steps", optarg, 1, 1 << 24, &f->steps)) return 2; break;
      case 'R': if (cli_int(CMD, "--runs", optarg, 1, MAX_RUNS, &f->runs)) return 2; break;
      case 'k': if (cli_int(CMD, "--shards", optarg, 1, 256, &f->shards)) return 2; break;
      case 'S': if (cli_int(CMD, "--max-staleness", optarg, 1, 1000, &f->staleness)) return 2; break;
      case 'n': f->ranks_s = optarg; break;
      case 'm': f->modes_s = optarg; break;
      case 'B': f->bot = optarg; break;
      case 'T': f->top = optarg; break;
      case 'h': usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec bench dp: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (cli_int_list(CMD, "--ranks", f->ranks_s, ',', f->ranks, MAX_RANKS, &f->nr)) return 2;
  for (int i = 0; i < f->nr; i++)
    if (f->batch % f->ranks[i]) {
      fprintf(stderr, "shardrec bench dp: --batch %lld does not divide by %d ranks (--ranks %s)\n",
              f->batch, f->ranks[i], f->ranks_s);
      return 2;
    }
  if (parse_modes(f)) return 2;
  return -1;
}

/* fig[mode][ranks][run] */
static run_figures fig[2][MAX_RANKS][MAX_RUNS];

/* Every repeat of every mode and rank count, interleaved, into fig; cmd
 * (cmdlen bytes) is the room for each command line. 0 or -1 (printed). */
static int run_all(const dp_flags *f, const char *dir, const char *self, char *cmd,
                   size_t cmdlen) {
  for (int r = 0; r < f->runs; r++)
    for (int mi = 0; mi < f->nm; mi++)
      for (int ri = 0; ri < f->nr; ri++) {
        char mode_flags[96], *out = NULL;
        if (!strcmp(f->modes[mi], "async"))
          snprintf(mode_flags, sizeof mode_flags, "--sparse-mode async --max-staleness %lld",
                   f->staleness);
        else
          snprintf(mode_flags, sizeof mode_flags, "--sparse-mode sync");
        snprintf(cmd, cmdlen,
                 "cd '%s' && mpirun --allow-run-as-root --oversubscribe -np %d '%s' train "
                 "--processed-data-file d.bin --num-shards %lld --plan-out plan.json "
                 "--arch-mlp-bot %s --arch-mlp-top %s --mini-batch-size %lld --num-batches %lld "
                 "--print-freq 1000000 --colocate-shards %s",
                 dir, f->ranks[ri], self, f->shards, f->bot, f->top, f->batch, f->steps,
                 mode_flags);
        int rc = run_capture(cmd, &out);
        run_figures *g = &fig[mi][ri][r];
        if (rc || !out || parse_run(out, g)) {
          fprintf(stderr, "shardrec bench dp: %s%s, %d rank(s): %s:\n%s\n", f->modes[mi],
                  rc == 127 ? " (is mpirun installed?)" : "", f->ranks[ri],
                  rc ? "the run failed" : "no 'rate' line in its output", tail(out));
          fprintf(stderr, "command: %s\n", cmd);
          free(out);
          return -1;
        }
        free(out);
        if (g->ranks != f->ranks[ri]) {
          fprintf(stderr, "shardrec bench dp: asked for %d rank(s), the run says %d\n",
                  f->ranks[ri], g->ranks);
          return -1;
        }
        fprintf(stderr, "bench dp: run %d/%lld %-5s %d rank(s): %.0f samples/s\n", r + 1, f->runs,
                f->modes[mi], f->ranks[ri], g->rate);
      }
  return 0;
}

/* The table of medians and the note under it. */
static void print_table(const dp_flags *f, long cores) {
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 0) load[0] = -1;
  printf("\nglobal batch %lld, %lld steps, %lld shard(s) colocated (shard k on rank k %% N), "
         "arch %s / %s; medians of %lld run(s)\n",
         f->batch, f->steps, f->shards, f->bot, f->top, f->runs);
  printf("%-6s %5s %12s %9s %14s %14s %10s %10s\n", "mode", "ranks", "samples/s", "x 1 rank",
         "dense ms/step", "allreduce ms", "lookup ms", "push ms");
  for (int mi = 0; mi < f->nm; mi++) {
    double base = -1;
    for (int ri = 0; ri < f->nr; ri++) {
      double v[5][MAX_RUNS];
      for (int r = 0; r < f->runs; r++) {
        const run_figures *g = &fig[mi][ri][r];
        v[0][r] = g->rate;
        v[1][r] = g->dense_ms;
        v[2][r] = g->allreduce_ms;
        v[3][r] = g->lookup_ms;
        v[4][r] = g->push_ms;
      }
      double med[5];
      for (int k = 0; k < 5; k++) med[k] = sr_median(v[k], (int)f->runs);
      if (f->ranks[ri] == 1) base = med[0];
      char ratio[16] = "-";
      if (base > 0) snprintf(ratio, sizeof ratio, "%.2f", med[0] / base);
      printf("%-6s %5d %12.0f %9s %14.2f %14.2f %10.2f %10.2f\n", f->modes[mi], f->ranks[ri],
             med[0], ratio, med[1], med[2], med[3], med[4]);
    }
  }
  printf("samples/s: training steps only (mpirun and shard start-up left out); per-step times "
         "are rank 0's, at its slice of the global batch (B/N); dense = forward + backward + "
         "dense optimizer; the all-reduce, lookup and push include waiting for the slowest rank "
         "(lookup: for the other ranks' pushes in sync mode, for the staleness bound of %lld "
         "in async mode). This machine has %ld core(s) (load average %.2f at "
         "the end) and the ranks share them: with more ranks than cores the figures show the "
         "protocol's overhead (all-reduce, per-step shard traffic, waiting), not scaling.\n",
         f->staleness, cores, load[0]);
}

int bench_dp(int argc, char **argv) {
  dp_flags f = {.rows = 200000, .batch = 1024, .steps = 60, .runs = 3, .shards = 4,
                .staleness = 2, .ranks_s = "1,2,4", .modes_s = "sync,async",
                .bot = "13-512-256-64-16", .top = "512-256-1"};
  int st = parse_flags(argc, argv, &f);
  if (st >= 0) return st;
  /* mpirun starts every rank from a path: this very binary's. */
  char self[PATH_MAX];
  ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
  if (sl <= 0) {
    perror("shardrec bench dp: /proc/self/exe");
    return 1;
  }
  self[sl] = 0;

  char dir[] = "/tmp/shardrec-bench-dp-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("shardrec bench dp: mkdtemp");
    return 1;
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int status = 1;
  char cmd[3 * PATH_MAX + 1024], *out = NULL; /* two paths of this binary and the folder */
  printf("bench dp: %lld synthetic rows in %s; %ld core(s) on this machine\n", f.rows, dir, cores);
  fflush(stdout);
  snprintf(cmd, sizeof cmd,
           "cd '%s' && '%s' datagen --rows %lld --seed 1 --out d.tsv && "
           "'%s' convert --test-fraction 0 d.tsv d.bin && rm d.tsv",
           dir, self, f.rows, self);
  int rc = run_capture(cmd, &out);
  if (rc) {
    fprintf(stderr, "shardrec bench dp: data preparation failed (exit %d):\n%s\n", rc, tail(out));
    goto out;
  }
  if (run_all(&f, dir, self, cmd, sizeof cmd)) goto out;
  print_table(&f, cores);
  status = 0;
out:
  free(out);
  if (sr_rmtree(dir) != 0) fprintf(stderr, "shardrec bench dp: could not remove %s\n", dir);
  return status;
}
