/* colo_prog: train/colocate.c under a real mpirun (or alone, without MPI).
 *
 *   colo_prog SHARDS [--data-dir D] [--fail-rank R[,R2]]
 *
 * Makes a plan of 8 tables over SHARDS shards, starts this rank's shards with
 * colocate_start and checks, printing one line per fact and "ERROR: ..." for
 * each failed check (exit 1 if any):
 *   - "rank R addrs A0 A1 ..." (the test compares the ranks' lines);
 *   - every address answers Stats with exactly its shard ("rank R: shard K
 *     at A serves [K]");
 *   - ownership: rank p stops its servers in turn (p = 0, 1, ...); after
 *     each stop every rank probes every shard, and shard K must be down
 *     exactly when K % size <= p ("rank R: after rank P stopped, shard K
 *     down|up").
 * --data-dir: RocksDB shard stores under D/shard-K. --fail-rank R[,R2]:
 * those ranks get an unusable data dir, so their colocate_start fails;
 * every rank must then get NULL with a message naming the first of them
 * R (and, with two, "and 1 more rank(s)"): "rank R: start failed as
 * expected: ...". Under mpirun the ranks share the addresses over the MPI
 * collective (dense_mpi_init, dense_coll_mpi_create), as the trainer does;
 * without it (dense_mpi_launched says no) MPI is never initialised and
 * colocate_start gets no collective (size 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense/collective.h"
#include "embedding/plan.h"
#include "rpc/client.h"
#include "rpc/shardrec.pb-c.h"
#include "train/colocate.h"

static int errors;

#define CHECK(cond, ...)                     \
  do {                                       \
    if (!(cond)) {                           \
      printf("ERROR: rank %d: ", rank);      \
      printf(__VA_ARGS__);                   \
      printf("\n");                          \
      errors++;                              \
    }                                        \
  } while (0)

/* Stats of addr: the shards it serves into shards[] (their count), or -1
 * when the call fails (the server is down: refused at once). The deadline
 * is long because on a loaded machine with ranks on shared cores a live
 * server may take a while to answer. */
static char last_msg[300];
static int stats_shards(const char *addr, int *shards, int max) {
  Shardrec__V1__StatsRequest q = SHARDREC__V1__STATS_REQUEST__INIT;
  uint8_t buf[16];
  size_t len = shardrec__v1__stats_request__pack(&q, buf);
  uint8_t *r = NULL;
  size_t rl = 0;
  char msg[256];
  int st = rpc_call_once(addr, NULL, RPC_STATS, buf, len, 10.0, &r, &rl, msg, sizeof msg);
  if (st != RPC_OK) {
    snprintf(last_msg, sizeof last_msg, "status %d: %s", st, msg);
    return -1;
  }
  Shardrec__V1__StatsResponse *a = shardrec__v1__stats_response__unpack(NULL, rl, r);
  free(r);
  if (!a) return -2;
  int n = 0;
  for (size_t i = 0; i < a->n_shards && n < max; i++) shards[n++] = a->shards[i];
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  return n;
}

int main(int argc, char **argv) {
  int rank = 0, size = 1, fail_rank = -1, fail_rank2 = -1;
  const char *data_dir = NULL;
  if (argc < 2) {
    fprintf(stderr, "usage: colo_prog SHARDS [--data-dir D] [--fail-rank R]\n");
    return 2;
  }
  int n_shards = atoi(argv[1]);
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--data-dir")) data_dir = argv[i + 1];
    else if (!strcmp(argv[i], "--fail-rank")) {
      fail_rank = atoi(argv[i + 1]);
      const char *comma = strchr(argv[i + 1], ',');
      if (comma) fail_rank2 = atoi(comma + 1);
    }
  }
  char err[1024];
  dense_coll *coll = NULL;
  int mpi = dense_mpi_launched(&rank, &size, NULL);
  if (mpi) {
    /* As the trainer: dense_mpi_init makes a rank waiting in a barrier
     * yield its core to the server threads the other ranks are calling. */
    if (dense_mpi_init(err, sizeof err) || !(coll = dense_coll_mpi_create(err, sizeof err))) {
      printf("ERROR: rank %d: %s\n", rank, err);
      dense_mpi_abort(1);
    }
    if (coll->rank != rank || coll->size != size) {
      printf("ERROR: rank %d of %d, MPI says %d of %d\n", rank, size, coll->rank, coll->size);
      dense_mpi_abort(1);
    }
  }
  uint64_t rows[8] = {1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000};
  emb_plan_params pp = {.n_tables = 8, .rows = rows, .dim = 4, .optim = {.eps = -1},
                        .seed = 7, .n_shards = n_shards};
  emb_plan *plan = NULL;
  if (emb_plan_create(&pp, &plan, err, sizeof err)) {
    printf("ERROR: plan: %s\n", err);
    return 1;
  }
  colocate_opts o = {.host = "127.0.0.1", .data_dir = data_dir, .cache_rows = 4096, .threads = 1};
  if (rank == fail_rank || rank == fail_rank2) o.data_dir = "/proc/colo_prog_cannot_create_this";
  char **addrs = NULL;
  colocate *c = colocate_start(plan, rank, size, coll, &o, &addrs, err, sizeof err);
  if (fail_rank >= 0) {
    char want[64];
    int first = fail_rank2 >= 0 && fail_rank2 < fail_rank ? fail_rank2 : fail_rank;
    snprintf(want, sizeof want, "rank %d of %d", first, size);
    CHECK(!c && !addrs, "colocate_start succeeded though rank %d could not host", fail_rank);
    CHECK(!c && strstr(err, want), "the message does not name %s: %s", want, err);
    CHECK(fail_rank2 < 0 || strstr(err, "(and 1 more rank(s))"),
          "the message does not count the second failing rank: %s", err);
    if (!c) printf("rank %d: start failed as expected: %s\n", rank, err);
    colocate_stop(c);
    goto out;
  }
  if (!c) {
    printf("ERROR: rank %d: colocate_start: %s\n", rank, err);
    errors++;
    goto out;
  }
  printf("rank %d addrs", rank);
  for (int k = 0; k < n_shards; k++) printf(" %s", addrs[k]);
  printf("\n");
  for (int k = 0; k < n_shards; k++) {
    int sh[8];
    int n = stats_shards(addrs[k], sh, 8);
    CHECK(n == 1 && sh[0] == k, "shard %d at %s: Stats answered %d shard(s), first %d (%s)", k,
          addrs[k], n, n > 0 ? sh[0] : -1, n < 0 ? last_msg : "");
    if (n == 1 && sh[0] == k) printf("rank %d: shard %d at %s serves [%d]\n", rank, k, addrs[k], k);
  }
  /* Ownership: the ranks stop their servers one after another. */
  for (int p = 0; p < size; p++) {
    if (mpi) CHECK(dense_coll_barrier(coll) == 0, "barrier: %s", dense_coll_errmsg(coll));
    if (rank == p) {
      colocate_stop(c);
      c = NULL;
    }
    if (mpi) CHECK(dense_coll_barrier(coll) == 0, "barrier: %s", dense_coll_errmsg(coll));
    for (int k = 0; k < n_shards; k++) {
      int sh[8];
      int n = stats_shards(addrs[k], sh, 8);
      int want_down = k % size <= p;
      CHECK(want_down ? n == -1 : (n == 1 && sh[0] == k),
            "after rank %d stopped, shard %d (rank %d's) at %s: Stats gave %d", p, k, k % size,
            addrs[k], n);
      printf("rank %d: after rank %d stopped, shard %d %s\n", rank, p, k, n == -1 ? "down" : "up");
    }
  }
  colocate_addrs_free(addrs, n_shards);
out:
  fflush(stdout);
  emb_plan_free(plan);
  if (mpi) {
    /* Every rank exits 1 when any rank found an error (counts are exact in
     * a float). */
    float total = (float)errors;
    if (dense_coll_all_reduce_sum(coll, &total, 1)) total = 1;
    dense_coll_destroy(coll);
    dense_mpi_finalize();
    return total ? 1 : 0;
  }
  return errors ? 1 : 0;
}
