/* The gRPC C-core server loop around an rpc_service (rpc/service.h): one
 * completion queue per worker thread, registered methods, a generic
 * request so unknown methods get UNIMPLEMENTED. */
#ifndef SHARDREC_RPC_SERVER_H
#define SHARDREC_RPC_SERVER_H

#include <stddef.h>

#include "rpc/service.h"
#include "rpc/tls.h"

typedef struct rpc_server_opts {
  const char *listen;       /* "127.0.0.1:0" */
  int threads;              /* worker threads, each with its own completion queue */
  int max_message_bytes;    /* send and receive limit */
  const rpc_tls *tls;       /* NULL: insecure */
  volatile int *stop;       /* set nonzero (e.g. from a signal handler) to stop */
  double shutdown_grace_s;  /* in-flight calls get this long before cancellation (0: 5 s) */
  volatile int *reload;     /* set nonzero (e.g. on SIGHUP) to reload tls's files: new
                               connections get the new certificate, key and client CA,
                               those made before keep theirs; bad files keep the old
                               ones (said on stderr). NULL: never */
  /* With mTLS (tls->ca): the clients (certificate subject CN or a SAN DNS
   * name, "NAME[,NAME...]") that may call Push, and Checkpoint/Restore;
   * NULL: every verified client. Lookup, Stats, Health and Watch are open
   * to every verified client. A call refused is PERMISSION_DENIED naming
   * the method and the client. */
  const char *allow_push, *allow_admin;
  /* Lookup answers are sent from the store's memory, its rows pinned until
   * gRPC has sent them (rpc_service_pin_answers), when the store offers
   * it (a shard store) and every table asked for has rows of at least
   * this many bytes. 0: RPC_PIN_MIN_ROW_BYTES; SIZE_MAX: never. */
  size_t pin_min_row_bytes;
  /* With TLS: a client's handshake this server refused (no client
   * certificate, one its client CA did not sign, a plaintext client),
   * once per connection, from a gRPC thread: reason in words and
   * OpenSSL's error as detail (rpc/grpc_impl.h). NULL: one line on stderr,
   * "server: refused a TLS handshake: REASON (DETAIL)". */
  void (*on_tls_refused)(void *ctx, const char *reason, const char *detail);
  void *tls_refused_ctx;
} rpc_server_opts;

/* The default of pin_min_row_bytes, from `shardrec bench rpc` (docs/DESIGN.md,
 * "Answers sent from the store"). */
#define RPC_PIN_MIN_ROW_BYTES 4096

/* Keep gRPC's 64 KiB read slices in this process, which every shardrec
 * process otherwise turns off before main (rpc/grpc_util.c) so that its
 * servers read Pushes whole into slices of RPC_SERVER_READ_MIN. A process
 * of read-only servers calls it before its first gRPC call (gRPC reads
 * its experiments once): its requests are small Lookups, and a connection
 * keeps the unused end of its last read, so small requests would walk
 * through one large slice a few pages at a time where 64 KiB slices are
 * recycled at once (docs/DESIGN.md, "What the look-ahead hides"). */
void rpc_keep_grpc_read_slices(void);

/* Serve svc until *o->stop. on_listening(port, ctx) is called once the port
 * is bound, before serving. The TLS files are checked first (a missing or
 * unreadable file, one that is not a PEM certificate or key, a key that
 * does not match the certificate: refused naming the file; a certificate
 * expired or expiring within 7 days: a warning on stderr). Returns 0 after
 * a clean shutdown, or an SR_E* code with the reason in err. */
int rpc_server_run(rpc_service *svc, const rpc_server_opts *o,
                   void (*on_listening)(int port, void *ctx), void *ctx, char *err,
                   size_t errlen);

#endif
