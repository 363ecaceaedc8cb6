/* The client side of the shard service: the remote store (an emb_store over
 * shard servers, embedding/store.h), one-off calls for tools and tests, and
 * the process-wide gRPC set-up. The methods and status codes are the
 * service's (rpc/service.h). */
#ifndef SHARDREC_RPC_CLIENT_H
#define SHARDREC_RPC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/service.h"
#include "rpc/tls.h"

typedef struct rpc_client_opts {
  double deadline_s;        /* per call (default 30) */
  int max_tries;            /* attempts on UNAVAILABLE (default 10) */
  int retry_deadline;       /* also try a Lookup, Push or Stats again when its deadline
                               passed (a partition: nothing came back), up to max_tries;
                               past them it is a lost server (rpc_remote_lost) */
  /* Called (NULL: not) when a call is first tried again after UNAVAILABLE or
   * its deadline, with "METHOD to ADDR: STATUS; trying again (N tries in
   * all)", from the thread that drives the call. */
  void (*on_retry)(void *ctx, const char *msg);
  void *retry_ctx;
  double backoff_s;         /* first wait between tries, doubled each time (0.05) */
  int max_message_bytes;    /* default 64 MiB */
  const rpc_tls *tls;       /* NULL: insecure */
  const char *job_id;       /* NULL: a fresh random one (ranks of one job must share it) */
  int rank, world_size;     /* this trainer's rank of world_size (0: 1 rank); with several,
                               every step pushes to every shard (empty where nothing) */
  int max_staleness;        /* 0: sync mode (rpc/shardrec.proto, "Multi-rank jobs"); S >= 1:
                               async mode: pushes applied on arrival, and a Lookup of step
                               t waits until every rank's push of step t-S is applied */
  int connections;          /* TCP connections (gRPC channels) per server, 1..
                               RPC_CONNECTIONS_MAX; a call's chunks go round them (0:
                               RPC_CONNECTIONS_DEFAULT) */
  size_t chunk_bytes;       /* most bytes of rows (or gradients) one Lookup or Push call
                               carries: a larger one is cut into chunks in flight at once
                               (0: RPC_CHUNK_BYTES_DEFAULT; SIZE_MAX: only the server's
                               limits cut; no less than 1/4096 of a push to one server) */
} rpc_client_opts;

#define RPC_CONNECTIONS_MAX 16
/* From `shardrec bench rpc --part connections` on a 2-core machine
 * (README, "Benchmarks"), three runs: 2 connections x0.96 to x1.18 of 1
 * (within the noise), chunks slower for pushes (x0.6 to x0.9 at 64 and
 * 128 KiB) and for lookups but at dim 128 against one server: so one
 * connection and no chunks but the servers' limits. One connection also
 * keeps a rank's calls to a server in the order they were sent, which one
 * rank of async mode needs for its bits: over several, a Lookup of step
 * t+1 sent before the Push of step t may reach the server after it (sync
 * mode does not depend on it: its Lookups are sent after the push they
 * must see is answered). */
#define RPC_CONNECTIONS_DEFAULT 1
#define RPC_CHUNK_BYTES_DEFAULT SIZE_MAX

/* The remote store: servers[k] serves shard k of plan (plan->n_shards
 * addresses). plan is borrowed. NULL with a message in err on failure.
 * Every request carries rank, world_size and max_staleness. A lookup_begin
 * (say of step t+1, prefetched) may stay outstanding while push() of step t
 * runs, in both modes: lookups have their own completion queue and id
 * grouping, so push never waits for it and its rows land in the buffers of
 * its own lookup_begin; a second lookup_begin before lookup_wait finishes
 * the first and drops its rows. checkpoint, restore and stats do not wait
 * for it either; destroy does (rpc/shardrec.proto, "Rank death", says why it is not
 * cancelled). A multi-rank job's store (o->world_size > 1) starts a Watch
 * on every server when it is created and detaches when it is destroyed
 * (waiting for the prefetched Lookup, if any, first). A lookup refused
 * because its job was dropped fails with SR_ESTATE and the server's message
 * (ABORTED). Calls are cut to fit each server's limits, read from its Stats
 * at the first Lookup or Push (and again after a Restore): max_ids, the
 * message limit and the in-flight budget; a cut Push is sent as parts the
 * server takes as one (RequestHeader.part, .parts), and further into
 * chunks of o->chunk_bytes, all in flight at once, round o->connections TCP
 * connections per server (a retry goes on the next one). A call the server's
 * in-flight budget refused (RESOURCE_EXHAUSTED) is retried as UNAVAILABLE
 * is.
 *
 * Look-ahead (emb_store_prefetch, up to 4 steps): the step's ids are copied,
 * sent at once as prefetch_only hints to the servers whose stores read
 * ahead (StatsResponse.looks_ahead), and
 * the step's Lookups follow as soon as their answers cannot be stale
 * (multi-rank, after this rank's first push: at once, the servers hold them
 * by the job's rules; one rank: once this store's push of step-1, async
 * step-S, is answered). The step's lookup_begin with the same ids takes
 * their answers; with other ids it reads afresh; a failed prefetched Lookup
 * is read again by it. Bits are those of a lookup without look-ahead. */
emb_store *emb_store_create_remote(const emb_plan *plan, const char *const *servers,
                                   int n_servers, const rpc_client_opts *o, char *err,
                                   size_t errlen);

/* Nonzero when store is a remote store whose last failure means a server
 * was unreachable after every retry (UNAVAILABLE; with retry_deadline also
 * every attempt past its deadline), answered from a new
 * incarnation (it restarted), or refused the call because it restarted on
 * rows left by a crash (FAILED_PRECONDITION RPC_MSG_UNCLEAN; the call fails
 * with SR_EUNAVAILABLE, not SR_EMISMATCH): its rows may no longer be the run's, and only
 * a Restore of every server from a checkpoint (emb_store_restore, which
 * clears this) makes the store usable again. 0 for other stores. */
int rpc_remote_lost(const emb_store *store);

/* Recovery of a multi-rank job from a lost server, around rank 0's Restore
 * of every server (rpc/service.h; each rank calls quiesce before it and
 * rejoin after it).
 *
 * quiesce ends every call store has in flight: the look-ahead's Lookups
 * (and a prefetched one) are cancelled, which a server that holds one
 * reads as the rank going away (it drops the job's pending state: the job
 * is about to be restored anyway), and calls waiting to be retried are not
 * sent again; the steps handed ahead are forgotten. Nothing for other
 * stores.
 *
 * incarnations: the servers' incarnations as this store last saw them
 * (rank 0: its Restore's answers) into inc[n]; the number written (0 for
 * other stores).
 *
 * rejoin: quiesce, then detach this rank from the job (its Watches) and go
 * on as job job_id (the id every rank's calls carry from now on: a call of
 * the old id still on its way to a server after the Restore cannot touch
 * the new job's steps, which the servers count from the checkpoint's), with
 * inc[n_shards] (rank 0's incarnations; NULL: the first seen) as the
 * servers' incarnations, the lost mark cleared, the servers' limits read
 * again, and (several ranks) a Watch on every server for the new id. 0 or
 * SR_ENOMEM; 0 for other stores. */
void rpc_remote_quiesce(emb_store *store);
int rpc_remote_incarnations(const emb_store *store, uint64_t *inc, int n);
int rpc_remote_rejoin(emb_store *store, const char *job_id, const uint64_t *inc);

/* Calls of store answered only after failed attempts (UNAVAILABLE, or
 * past their deadline with retry_deadline: a partition the retries
 * outlasted) since the last call: their number (0 for other stores), and
 * the first server's last one described in buf ("shard K: METHOD to ADDR
 * answered after N tries over S s (STATUS before)"). */
int rpc_remote_note(emb_store *store, char *buf, size_t len);

/* Whether the folders paths[n] (named by the flags names[n] in messages;
 * absolute or from the current folder, existing or not) lie inside a
 * checkpoint root of every server behind the remote store store
 * (StatsResponse.checkpoint_roots, asked of each server now), resolved on
 * this machine with sr_path_confine (common/fs.h): the servers see the same
 * folders at the same paths (shared storage). 0 (also for a store that is
 * not remote); SR_EINVAL with a message naming the flag, the path, the
 * server and its root (or that it has none) in err; the Stats call's
 * SR_E* code otherwise. */
int rpc_remote_check_roots(emb_store *store, const char *const *paths, const char *const *names,
                           int n, char *err, size_t errlen);

/* One unary call on a fresh channel to target, for tools and tests:
 * req[len] in, *resp (malloc'd, caller frees) out. Returns the gRPC status
 * code, with its message in msg. */
int rpc_call_once(const char *target, const rpc_tls *tls, rpc_method m, const uint8_t *req,
                  size_t len, double deadline_s, uint8_t **resp, size_t *resp_len, char *msg,
                  size_t msglen);

/* The same for a method named by its path ("/pkg.Service/Method"), known
 * to the server or not. */
int rpc_call_path(const char *target, const rpc_tls *tls, const char *path, const uint8_t *req,
                  size_t len, double deadline_s, uint8_t **resp, size_t *resp_len, char *msg,
                  size_t msglen);

/* Keep glibc from handing blocks over 128 KiB back to the kernel on free:
 * every call's message and row buffers would otherwise come back as fresh
 * pages (about 11 us per 4 KiB on our VMs), which made a 4096-row dim-16
 * Lookup 5x slower (bench rpc). Process-wide; called by rpc_server_run and
 * emb_store_create_remote; idempotent. */
void rpc_malloc_tune(void);

/* grpc_init / grpc_shutdown, reference counted by gRPC itself. */
void rpc_global_init(void);
void rpc_global_shutdown(void);
/* For a process that exits once its work is done (the command line's
 * commands): from the next rpc_global_init on, gRPC's global state is left
 * to the process's exit, never shut down (rpc_global_init takes one
 * reference that no rpc_global_shutdown returns). gRPC 1.51's shutdown
 * joins its TCP backup poller, which a write that found a socket's send
 * buffer full starts and which can sit out a 10 s poll first: a server's
 * stop, or a trainer's end, that took 10 s more. Servers and stores made
 * and dropped inside a process that goes on (the tests) do shut gRPC down
 * unless this was called. */
void rpc_global_keep_until_exit(void);

#endif
