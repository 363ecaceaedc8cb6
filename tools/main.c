/* The shardrec command: one executable, subcommands dispatched by name. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "rpc/client.h"
#include "tools/cmds.h"

typedef struct {
  const char *name;
  int (*fn)(int, char **);
  const char *what;
} command;

static const command commands[] = {
    {"datagen", cmd_datagen, "write a synthetic Criteo-format data set with a known optimum"},
    {"convert", cmd_convert, "convert Criteo TSV (or .gz) to shardrec's binary record format"},
    {"plan", cmd_plan, "write a sharding plan (JSON) from table sizes and model flags"},
    {"train", cmd_train, "train a DLRM (in-process shards by default)"},
    {"eval", cmd_eval, "score a saved model on Criteo-format data"},
    {"serve", cmd_serve, "serve embedding shards of a plan over gRPC"},
    {"inspect", cmd_inspect, "tables, rows and bytes of a shard data folder or a checkpoint"},
    {"reshard", cmd_reshard, "rewrite a checkpoint's embedding shards for another plan (N to M)"},
    {"fold", cmd_fold, "fold a chain of incremental checkpoints into one full checkpoint"},
    {"predict", cmd_predict, "score Criteo-format data with a checkpoint's model and shards"},
    {"plot", cmd_plot, "draw train --metrics-out files as a PNG (loss, AUC, samples/s, step time)"},
    {"bench", cmd_bench, "benchmarks: data, train, store, rpc, dp, reshard, allreduce, metrics, ckpt"},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
  fprintf(f,
          "usage: shardrec <command> [options]\n"
          "       shardrec <command> --help\n\n"
          "commands:\n");
  for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].what);
  fprintf(f, "  %-9s %s\n", "help", "this text");
}

/* The soft limit of open files raised toward the hard one, to at most
 * OPEN_FILES_MAX: the shard store keeps every RocksDB file open (a few
 * dozen per database at open, then its SST files: usually up to 8 L0 files
 * per table, more while compactions fall behind, and L1's), and a process
 * hosting several shards would pass the usual soft limit of 1024. The cap
 * spares the children this process starts (mpirun, servers) a limit in
 * the millions, which some close file by file. A limit that cannot be
 * raised is left as it is. */
#define OPEN_FILES_MAX 65536
static void open_files_limit_raise(void) {
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  rlim_t want = r.rlim_max == RLIM_INFINITY || r.rlim_max > OPEN_FILES_MAX ? OPEN_FILES_MAX
                                                                           : r.rlim_max;
  if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur < want) {
    r.rlim_cur = want;
    (void)setrlimit(RLIMIT_NOFILE, &r);
  }
}

int main(int argc, char **argv) {
  open_files_limit_raise();
  /* Every command exits when done: gRPC's state goes with the process
   * (rpc/client.h says why). */
  rpc_global_keep_until_exit();
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *name = argv[1];
  if (!strcmp(name, "help") || !strcmp(name, "--help") || !strcmp(name, "-h")) {
    if (argc >= 3) {
      for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[2], commands[i].name)) {
          char *av[] = {argv[2], "--help", NULL};
          return commands[i].fn(2, av);
        }
    }
    usage(stdout);
    return 0;
  }
  for (int i = 0; i < N_COMMANDS; i++)
    if (!strcmp(name, commands[i].name)) {
      return commands[i].fn(argc - 1, argv + 1);
    }
  fprintf(stderr, "shardrec: unknown command '%s'\n\n", name);
  usage(stderr);
  return 2;
}
