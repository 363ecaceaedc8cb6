/* shardrec reshard: rewrite a checkpoint's embedding shards for another plan
 * of the same model (N shards to M, table-wise to row-wise and back, tables
 * moved between shards).
 *
 *   shardrec reshard --from CKPT --to OUT --plan NEW.json [--force]
 *
 * CKPT is a step-N folder or a folder of them (the newest complete one),
 * with RocksDB shards or the in-memory stores' table files (the output
 * keeps the layout: its consumers restore only that one).
 * OUT becomes a checkpoint folder holding one complete OUT/step-N (same N):
 * `train --resume OUT` and `serve --checkpoint OUT` take it directly.
 * The work is embedding/reshard_ckpt.h's (reshard_checkpoint): this file
 * parses the flags, makes that call and prints. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "embedding/reshard_ckpt.h"
#include "storage/ckpt_dir.h"
#include "tools/cli.h"
#include "tools/cmds.h"

#define CMD "reshard"

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec reshard --from CKPT --to OUT --plan NEW.json [--precision P] [--force]\n"
"\n"
"Rewrite a checkpoint's embedding shards for another plan of the same model:\n"
"N shards to M, table-wise to row-wise and back, tables moved between shards.\n"
"Dense parameters, optimizer state, step and data position carry over; the\n"
"manifest gets the new plan.\n"
"\n"
"  --from CKPT      a checkpoint step-N folder, or a folder of them (the newest\n"
"                   complete one is taken); any store: RocksDB shard databases\n"
"                   (train --data-dir/--cache-mb, servers with --data-dir) or the\n"
"                   in-memory store's table files (train without them, in-memory\n"
"                   servers); the new checkpoint keeps the source's layout\n"
"  --to OUT         the new checkpoint folder: OUT/step-N is written, so\n"
"                   'train --resume OUT' and 'serve --checkpoint OUT' take it\n"
"  --plan NEW.json  the new plan; only n_shards and placements may differ\n"
"                   (same model fingerprint: tables, rows, dim, pooling, init,\n"
"                   optimizer, seed, precision, keep)\n"
"  --precision fp32|fp16|bf16  convert every table's weights to P: the new plan's\n"
"                   tables take P (whatever its precision fields say) and each\n"
"                   weight is rounded to the nearest value of P, ties to even (a\n"
"                   conversion, not an update: no stochastic rounding; 16 bits\n"
"                   to fp32 is exact). Optimizer state stays 32-bit\n"
"  --force          replace OUT if it is a checkpoint folder (after the new one\n"
"                   is complete); anything else at OUT is refused, --force or not\n"
"  --threads N      tables moved side by side (default: the cores, at most 8)\n"
"  -h, --help       this text\n"
"\n"
"Rows stream from read-only RocksDB scans of every source shard, are routed by\n"
"the new plan, written to sorted SST files and ingested into fresh shard\n"
"databases; memory stays bounded whatever the table size (table files are\n"
"merged and rewritten per shard of the new plan likewise). Each table's row\n"
"count and an order-independent checksum of (table_id, row id, value and\n"
"optimizer-state bytes) are computed while reading and again by re-reading\n"
"what was written; any difference fails the command and nothing is left at\n"
"OUT. A progress line (rows, MB, rows/s, ETA) is shown on a terminal. The\n"
"summary gives rows, MB, seconds, rows/s, MB/s and each table's check.\n"
"Exit status: 0 done, 1 refused or failed, 2 bad usage.\n");
}

enum { O_FROM = 1000, O_TO, O_PLAN, O_FORCE, O_THREADS, O_HELP, O_PREC };

static const struct option long_opts[] = {
    {"from", required_argument, 0, O_FROM}, {"to", required_argument, 0, O_TO},
    {"plan", required_argument, 0, O_PLAN}, {"force", no_argument, 0, O_FORCE},
    {"threads", required_argument, 0, O_THREADS}, {"precision", required_argument, 0, O_PREC},
    {"help", no_argument, 0, O_HELP},       {0, 0, 0, 0}};

static void on_start(const reshard_ckpt_stats *st, void *ctx) {
  (void)ctx;
  printf("reshard %s (%d shard%s) -> %s (%d shard%s), step %lld, %s\n", st->src_dir,
         st->src_shards, st->src_shards == 1 ? "" : "s", st->out_dir, st->dst_shards,
         st->dst_shards == 1 ? "" : "s", (long long)st->step, ckpt_dir_shards_layout_name(st->layout));
  fflush(stdout);
}

static void print_summary(const reshard_ckpt_stats *st) {
  const reshard_stats *r = &st->run;
  double mb = (double)r->bytes / 1e6, s = st->seconds > 0 ? st->seconds : 1e-9;
  int ok = 0;
  for (int t = 0; t < r->n_tables; t++) ok += r->tables[t].ok;
  printf("resharded %llu rows, %.1f MB in %.2f s: %.0f rows/s, %.1f MB/s (moving %.2f s, of which "
         "verification %.2f s); verified %d/%d tables ok\n",
         (unsigned long long)r->rows, mb, st->seconds, (double)r->rows / s, mb / s, r->seconds,
         r->verify_seconds, ok, r->n_tables);
  printf("ckpt   %s/step-%lld\n", st->out_dir, (long long)st->step);
}

int cmd_reshard(int argc, char **argv) {
  reshard_ckpt_opts o = {.on_start = on_start, .progress = cli_isatty_err()};
  long long threads = 0;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case O_FROM: o.from = optarg; break;
      case O_TO: o.to = optarg; break;
      case O_PLAN: o.plan_path = optarg; break;
      case O_FORCE: o.force = 1; break;
      case O_THREADS: if (cli_flag(CMD, "--threads", optarg, &threads)) return 2; break;
      case O_PREC:
        if (emb_precision_parse(optarg, &o.precision)) {
          fprintf(stderr, "shardrec reshard: --precision: '%s' is not fp32, fp16 or bf16\n", optarg);
          return 2;
        }
        o.convert = 1;
        break;
      case 'h':
      case O_HELP: usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec reshard: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!o.from || !o.to || !o.plan_path) {
    fprintf(stderr, "shardrec reshard: --from, --to and --plan are required (see --help)\n");
    return 2;
  }
  o.threads = (int)threads;
  char err[2048];
  reshard_ckpt_stats st;
  int rc = reshard_checkpoint(&o, &st, err, sizeof err);
  for (int t = 0; t < st.run.n_tables && (rc == 0 || rc == SR_ECHECKSUM); t++) {
    const reshard_table *x = &st.run.tables[t];
    printf("verify table_id %u (%s): %llu rows, checksum %016llx%016llx: %s\n", x->table_id,
           x->name, (unsigned long long)x->rows_out, (unsigned long long)x->sum_out,
           (unsigned long long)x->xor_out, x->ok ? "ok" : "MISMATCH");
  }
  if (rc) {
    static const char *const flag[] = {"", "--from ", "--plan ", "--to "};
    fprintf(stderr, "shardrec reshard: %s%s%s\n", flag[st.failed], err,
            st.failed == RESHARD_IN_TO && rc == SR_EEXISTS
                ? " (give --force to replace it once the new checkpoint is complete)" : "");
  } else {
    print_summary(&st);
  }
  reshard_stats_free(&st.run);
  return rc ? 1 : 0;
}
