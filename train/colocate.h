/* Colocated shards (shardrec train --colocate-shards under mpirun): the
 * plan's shards are spread over the trainer ranks, each rank hosting its
 * shards in gRPC server threads of its own process, and every rank reaches
 * every shard through the same gRPC service as with separate
 * `shardrec serve` processes (so the step order, checkpoints and recovery
 * are the same code). Shard k lives on rank k % size.
 *
 * colocate_start is collective: every rank calls it, in the same order
 * relative to other collectives. It starts this rank's servers (one
 * rpc_server, service and store per hosted shard, each listening on
 * opts->host:0: the remote store sends each shard its own Push of a step,
 * and a service taking two shards' pushes of one (job, step, rank) would
 * drop the second as a retry), then gathers every rank's addresses with the
 * job's collective (dense_coll_allgather_bytes) so that (*addrs)[k] is the
 * address of shard k on every rank. A rank with no shard (more ranks than
 * shards) starts nothing and still takes part. With size 1 there is no
 * collective call at all (coll may be NULL); with size > 1 coll must be the
 * job's host-buffer collective (dense_coll_mpi_create) and agree on rank
 * and size. */
#ifndef SHARDREC_TRAIN_COLOCATE_H
#define SHARDREC_TRAIN_COLOCATE_H

#include <stddef.h>
#include <stdint.h>

#include "dense/collective.h"
#include "embedding/plan.h"

typedef struct colocate colocate;

/* Shard k's database in data_dir before a job starts afresh there (the
 * colocated shards' and the trainer's own shard store's): none is fine; one
 * an --auto-resume start of the job of --save-checkpoint folder owner (NULL:
 * none) left before its first checkpoint is removed, said on stdout
 * (ckpt_dir_fresh_shard); any other is refused: SR_EEXISTS with "--data-dir
 * DIR: holds shard databases of an earlier run (...)" in err. With owner,
 * data_dir is then claimed for it (ckpt_dir_data_claim). 0 or SR_E*. */
int colocate_data_fresh(const char *data_dir, int k, const char *owner, char *err, size_t errlen);

typedef struct colocate_opts {
  const char *host;      /* address the servers listen on and advertise ("127.0.0.1") */
  const char *data_dir;  /* NULL: rows in memory (local store); else RocksDB shard store
                            under data_dir/shard-K with the cache below */
  int fresh;             /* a job not resuming: colocate_data_fresh of each shard */
  const char *owner;     /* a fresh --auto-resume job: its --save-checkpoint folder, which
                            it claims data_dir for; NULL: none */
  uint64_t cache_rows, cache_mb; /* the rank's cache, split evenly over its shards
                                    (cache_rows 0: cache_mb, default 256) */
  int threads;           /* worker threads per shard server (default 2) */
  const char *const *checkpoint_roots; /* [n_roots] the folders Checkpoint and Restore
                            calls to these servers may name (rpc/service.h, "Admin
                            calls"): the trainer's checkpoint folders; 0: refused */
  int n_roots;
} colocate_opts;

/* Start this rank's shards of plan (borrowed, outlives the colocate) and
 * gather the addresses over coll (borrowed for the call; NULL or of size 1:
 * one rank, no collective): on success *addrs is a malloc'd array of
 * plan->n_shards malloc'd "host:port" strings (free with colocate_addrs_free)
 * and the return value the running servers (colocate_stop). NULL with the
 * reason in err; collective even on failure (no rank is left waiting): a
 * rank that failed still takes part in the gather, and every rank returns
 * NULL with a message naming the first failing rank ("rank 1 of 3 could
 * not host its shards: ..."). Checkpoint and Restore RPCs to these servers
 * write and read path/shard-K, as separate `shardrec serve --shard K`
 * processes do. */
colocate *colocate_start(const emb_plan *plan, int rank, int size, dense_coll *coll,
                         const colocate_opts *o, char ***addrs, char *err, size_t errlen);
void colocate_addrs_free(char **addrs, int n);
/* Stop the servers (after the trainers' last call: a barrier first). NULL-safe. */
void colocate_stop(colocate *c);

#endif
