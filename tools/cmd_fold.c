/* shardrec fold: one full checkpoint from a chain of incremental ones.
 *
 *   shardrec fold --from HEAD --to OUT [--force]
 *
 * HEAD is a step-N folder or a folder of them (the newest complete one);
 * its chain (the full checkpoint and the increments up to HEAD) is
 * verified whole first. OUT becomes a checkpoint folder holding OUT/step-N,
 * the full checkpoint the training job would have written at that step.
 * The work is embedding/ckpt_fold.h's (emb_ckpt_fold_to). */
#include <getopt.h>
#include <stdio.h>

#include "common/status.h"
#include "embedding/ckpt_fold.h"
#include "tools/cli.h"
#include "tools/cmds.h"

#define CMD "fold"

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec fold --from HEAD --to OUT [--force]\n"
"\n"
"Fold a chain of checkpoints (train --full-checkpoint-every K: a full one and\n"
"the incremental ones after it, each holding the rows changed since the one\n"
"before) into one full checkpoint of the head's step.\n"
"\n"
"  --from HEAD   the chain's newest checkpoint: a step-N folder, or a folder of\n"
"                them (the newest complete one); every link back to its full\n"
"                checkpoint is verified first (DONE, manifest, every file's size\n"
"                and SHA-256, each parent the one its child names): a missing or\n"
"                damaged link is refused, naming it, and nothing is written\n"
"  --to OUT      the new checkpoint folder: OUT/step-N is written (dense state,\n"
"                data transform and manifest of the head, kind full, no parent)\n"
"  --force       replace OUT if it is a folder of checkpoints; anything else at OUT\n"
"                is refused, --force or not\n"
"  -h, --help    this text\n"
"\n"
"Rows held in memory (the trainer's table files, in-memory servers' folders)\n"
"fold into the files a full checkpoint of that step holds, byte for byte;\n"
"rows held in RocksDB fold into databases holding the same rows (not the same\n"
"files). Exit status: 0 done, 1 refused or failed, 2 bad usage.\n");
}

enum { O_FROM = 1000, O_TO, O_FORCE, O_HELP };

static const struct option long_opts[] = {
    {"from", required_argument, 0, O_FROM}, {"to", required_argument, 0, O_TO},
    {"force", no_argument, 0, O_FORCE},     {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0}};

int cmd_fold(int argc, char **argv) {
  const char *from = NULL, *to = NULL;
  int force = 0, c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case O_FROM: from = optarg; break;
      case O_TO: to = optarg; break;
      case O_FORCE: force = 1; break;
      case 'h':
      case O_HELP: usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec fold: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!from || !to) {
    fprintf(stderr, "shardrec fold: --from and --to are required (see --help)\n");
    return 2;
  }
  char err[2048];
  int64_t step;
  int rc = emb_ckpt_fold_to(from, to, force, &step, err, sizeof err);
  if (rc) {
    fprintf(stderr, "shardrec fold: %s\n", err);
    return 1;
  }
  printf("ckpt   %s/step-%lld\n", to, (long long)step);
  return 0;
}
