/* Colocated shards (shardrec train --colocate-shards under mpirun): the
 * plan's shards are spread over the trainer ranks, each rank hosting its
 * shards in gRPC server threads of its own process, and every rank reaches
 * every shard through the same gRPC service as with separate
 * `shardrec serve` processes (so the step order, checkpoints and recovery
 * are the same code). Shard k lives on rank k % size.
 *
 * colocate_start is collective: every rank calls it, in the same order
 * relative to other collectives. It starts this rank's servers (one
 * rpc_server per hosted shard set, listening on opts->host:0), then gathers
 * every rank's address over MPI so that (*addrs)[k] is the address of
 * shard k on every rank. */
#ifndef SHARDREC_TOOLS_COLOCATE_H
#define SHARDREC_TOOLS_COLOCATE_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"

typedef struct colocate colocate;

typedef struct colocate_opts {
  const char *host;      /* address the servers listen on and advertise ("127.0.0.1") */
  const char *data_dir;  /* NULL: rows in memory (local store); else RocksDB shard store
                            under data_dir/shard-K with the cache below */
  uint64_t cache_rows, cache_mb;
  int threads;           /* server worker threads per rank (default 2) */
} colocate_opts;

/* Start this rank's shards of plan (borrowed, outlives the colocate) and
 * gather the addresses: on success *addrs is a malloc'd array of
 * plan->n_shards malloc'd "host:port" strings (free with colocate_addrs_free)
 * and the return value the running servers (colocate_stop). NULL with the
 * reason in err; collective even on failure (no rank is left waiting). */
colocate *colocate_start(const emb_plan *plan, int rank, int size, const colocate_opts *o,
                         char ***addrs, char *err, size_t errlen);
void colocate_addrs_free(char **addrs, int n);
/* Stop the servers (after the trainers' last call: a barrier first). NULL-safe. */
void colocate_stop(colocate *c);

#endif
