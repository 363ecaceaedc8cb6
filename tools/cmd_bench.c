/* shardrec bench <what>: benchmarks that print figures beside a baseline
 * measured in the same run. */
#include <stdio.h>
#include <string.h>

#include "tools/cmds.h"

#pragma weak bench_data
#pragma weak bench_train
#pragma weak bench_rpc
#pragma weak bench_store
#pragma weak bench_dp
#pragma weak bench_reshard
#pragma weak bench_metrics
#pragma weak bench_allreduce
#pragma weak bench_ckpt
#pragma weak bench_half

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *what;
} benches[] = {
    {"data", bench_data, "TSV parse and binary read throughput vs. raw read()"},
    {"rpc", bench_rpc, "lookups over gRPC (1 and 4 servers) vs. in-process store and plain TCP"},
    {"train", bench_train, "training samples/s vs. this machine's sgemm bound"},
    {"store", bench_store, "shard store lookups (hits, misses, Zipf) vs. raw MultiGet and memcpy"},
    {"dp", bench_dp, "data-parallel trainers under mpirun: 1, 2, 4 ranks, sync and async"},
    {"reshard", bench_reshard, "resharding rows/s and MB/s vs. a raw RocksDB scan + SST write"},
    {"allreduce", bench_allreduce, "the trainer's dense all-reduce under mpirun: time and link rate"},
    {"metrics", bench_metrics, "Prometheus figures: update cost per step and per RPC, one scrape of 26 tables"},
    {"ckpt", bench_ckpt, "bytes and seconds per checkpoint: full vs. incremental, Zipf pushes"},
    {"half", bench_half, "fp16 and bf16 weights vs. fp32: bytes a row, store, gRPC and RocksDB rows/s"},
};
#define N_BENCH (int)(sizeof benches / sizeof benches[0])

int cmd_bench(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    FILE *f = argc < 2 ? stderr : stdout;
    fprintf(f, "usage: shardrec bench <what> [options]\n\nbenchmarks:\n");
    for (int i = 0; i < N_BENCH; i++) fprintf(f, "  %-8s %s\n", benches[i].name, benches[i].what);
    return argc < 2 ? 2 : 0;
  }
  for (int i = 0; i < N_BENCH; i++)
    if (!strcmp(argv[1], benches[i].name)) {
      if (!benches[i].fn) {
        fprintf(stderr, "shardrec bench: '%s' is not built in this version\n", argv[1]);
        return 2;
      }
      return benches[i].fn(argc - 1, argv + 1);
    }
  fprintf(stderr, "shardrec bench: unknown benchmark '%s'\n", argv[1]);
  return 2;
}
