/* shardrec plot: training curves as a PNG.
 *
 *   shardrec plot METRICS.jsonl [MORE.jsonl ...] --out curves.png [--size WxH]
 *
 * METRICS.jsonl are `train --metrics-out` files, one run each, overlaid in
 * the picture: training loss and test AUC / log loss against step,
 * samples/s, and the split of a step's time over its phases (and bounded
 * tables' rows and ids, where the files have them). Drawn by
 * gnuplot (metrics/plot.h's plot_write); this file parses the flags. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "metrics/plot.h"
#include "tools/cli.h"
#include "tools/cmds.h"

#define CMD "plot"

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec plot METRICS.jsonl [MORE.jsonl ...] --out FILE.png [--size WxH]\n"
"\n"
"Draws the runs of train --metrics-out files into one PNG (gnuplot): training loss\n"
"and test AUC / log loss against step (runs overlaid), samples/s, and the mean time\n"
"per step of each phase (one stacked bar per run); for runs with bounded tables\n"
"(train --admit-after / --expire-after / --capacity) also rows per table and the ids\n"
"admitted, refused, expired and evicted so far against step.\n"
"  --out FILE.png   the picture (written under a temporary name, then renamed)\n"
"  --size WxH       its size in pixels (1200x900; each 200 to 8000)\n");
}

/* "WxH" into *w, *h; 0, or 2 with the message printed. */
static int parse_size(const char *s, int *w, int *h) {
  char *x = strchr(s, 'x');
  long long a, b;
  char ws[32];
  if (!x || x == s || (size_t)(x - s) >= sizeof ws) {
    fprintf(stderr, "shardrec plot: --size: '%s' is not WxH (e.g. 1200x900)\n", s);
    return 2;
  }
  snprintf(ws, sizeof ws, "%.*s", (int)(x - s), s);
  if (cli_int(CMD, "--size (width)", ws, 200, 8000, &a) ||
      cli_int(CMD, "--size (height)", x + 1, 200, 8000, &b))
    return 2;
  *w = (int)a, *h = (int)b;
  return 0;
}

int cmd_plot(int argc, char **argv) {
  plot_config c = {.width = 1200, .height = 900};
  static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                       {"size", required_argument, 0, 's'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  optind = 1;
  opterr = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
      case 'o': c.out = optarg; break;
      case 's': if (parse_size(optarg, &c.width, &c.height)) return 2; break;
      case 'h': usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (!c.out || optind >= argc) {
    fprintf(stderr, "shardrec plot: give one or more METRICS.jsonl and --out FILE.png\n");
    return 2;
  }
  if (cli_out_file(CMD, "--out", c.out)) return 2;
  c.files = (const char *const *)argv + optind;
  c.n_files = argc - optind;
  char err[1024];
  const cli_file out = {"--out", c.out};
  for (int i = 0; i < c.n_files; i++) {
    const cli_file in = {"METRICS", c.files[i]};
    if (cli_outs_clash(&out, 1, &in, 1, err, sizeof err)) {
      fprintf(stderr, "shardrec plot: %s\n", err);
      return 2;
    }
  }
  if (plot_write(&c, err, sizeof err)) {
    fprintf(stderr, "shardrec plot: %s\n", err);
    return 1;
  }
  printf("wrote %s (%dx%d, %d run(s))", c.out, c.width, c.height, c.n_files);
  if (c.kept) printf("; the bounded tables of %d run(s): rows per table, ids admitted, refused, "
                     "expired and evicted", c.kept);
  printf("\n");
  return 0;
}
