/* Internal helpers shared by the server and the client (rpc/ only). */
#ifndef SHARDREC_RPC_GRPC_IMPL_H
#define SHARDREC_RPC_GRPC_IMPL_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice_buffer.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "rpc/tls.h"

/* The size a connection's TCP reads start at, both sides
 * (GRPC_ARG_TCP_READ_CHUNK_SIZE; gRPC 1.51 starts at 8 KiB and then sizes
 * each read by how full the last ones came back). Lookups and Pushes carry
 * hundreds of KB to a few MB: 256 KiB took a dim-16 Push from 408 to 341
 * us a step and a Lookup from 289 to 230 (medians of 8 alternated rounds,
 * docs/DESIGN.md). */
#define RPC_TCP_READ_CHUNK (256 << 10)

/* The least a TCP read of a server that takes Pushes takes
 * (GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE), in a process without gRPC's 64 KiB
 * read slices (rpc/grpc_util.c): a Push of up to a few hundred KB that is
 * on the socket when the server reads mostly comes whole in one slice,
 * decoded in place instead of joined by a copy, and without a
 * WINDOW_UPDATE of its own before the answer (docs/DESIGN.md, "What the
 * look-ahead hides"). A read-only server does not get it: with it, even
 * on 64 KiB slices (rpc_keep_grpc_read_slices), a following `serve` grew
 * its RSS over a swap by 264 kB against test_serve_follow's bound of 251. */
#define RPC_SERVER_READ_MIN (1 << 20)

/* Copy a received byte buffer (maybe several slices, maybe compressed) into
 * a malloc'd array. Returns 0, or -1 when out of memory. NULL bb: empty. */
int rpc__bb_read(grpc_byte_buffer *bb, uint8_t **out, size_t *len);
/* A received byte buffer's bytes as one slice (the caller unrefs it): the
 * buffer's own slice, no copy, when it is one uncompressed slice (the
 * slice holds a reference: it stays valid after bb is destroyed), else one
 * copy of its slices (decompressed). NULL bb: an empty slice. 0, or -1
 * when gRPC cannot read it. */
int rpc__bb_view(grpc_byte_buffer *bb, grpc_slice *sl);
/* A byte buffer holding a copy of data[len]. */
grpc_byte_buffer *rpc__bb_make(const uint8_t *data, size_t len);
/* A byte buffer over data[len] without a copy: it takes data (malloc'd),
 * which gRPC frees once the last reference to it goes (after the message
 * is sent). NULL data: an empty buffer. */
grpc_byte_buffer *rpc__bb_take(uint8_t *data, size_t len);

/* Integer channel arguments: a[i] = keys[i] set to vals[i], for i < n. */
void rpc__int_args(grpc_arg *a, const char *const *keys, const int *vals, int n);
/* A byte buffer over a pinned Lookup answer's pieces without a copy
 * (rpc/service.h): each piece a sub-slice of one of two base slices (the
 * answer's head, the rows' span in the store), which hold a between them;
 * gRPC dropping the last of them calls rpc_pinned_release (any thread).
 * Takes a; NULL when out of memory (a released). */
typedef struct rpc_pinned rpc_pinned;
grpc_byte_buffer *rpc__bb_pinned(rpc_pinned *a);
/* Server TLS whose certificate, key and client CA can be reloaded from
 * their files while serving: gRPC asks the fetcher for its certificate
 * config at each handshake, and rpc__tls_server_reload hands it the files'
 * new contents for the next one (connections made before keep theirs).
 * create and reload check the files first (rpc__tls_check; warn as there)
 * and keep the old config when they are bad. NULL / SR_E* with the reason
 * in err. tls's paths are borrowed; destroy after the server and gRPC are
 * shut down. */
typedef struct rpc__tls_server rpc__tls_server;
rpc__tls_server *rpc__tls_server_create(const rpc_tls *tls, char *err, size_t errlen, char *warn,
                                        size_t warnlen);
int rpc__tls_server_reload(rpc__tls_server *t, char *err, size_t errlen, char *warn,
                           size_t warnlen);
/* New credentials over t (the caller releases them); NULL on failure. */
grpc_server_credentials *rpc__tls_server_creds(rpc__tls_server *t);
void rpc__tls_server_destroy(rpc__tls_server *t); /* NULL-safe */
/* Client credentials from PEM files; NULL with a message in err on failure. */
grpc_channel_credentials *rpc__channel_creds(const rpc_tls *tls, char *err, size_t errlen);
gpr_timespec rpc__deadline(double seconds);
/* The exchange stream's method (rpc/shardrec.proto, "Exchange stream"). */
#define RPC_EXCHANGE_PATH "/shardrec.v1.EmbeddingShard/Exchange"
/* gRPC's own log lines (rpc_global_init installs the log function): a TLS
 * handshake that failed, which gRPC logs once per connection with
 * OpenSSL's error, goes to fn(ctx, reason, detail) from the gRPC thread
 * that saw it (reason: rpc__tls_refusal_reason(detail); detail: OpenSSL's
 * words, "SSL_ERROR_SSL: error:0A0000C7:SSL routines::peer did not return
 * a certificate"), or nowhere while fn is NULL (a client: its failed call
 * says it in its status); every other line goes to stderr. fn is called
 * under a lock that this call takes too: once it returns, the old fn is
 * not running and will not be called. */
typedef void (*rpc__tls_refused_fn)(void *ctx, const char *reason, const char *detail);
void rpc__tls_refused_hook(rpc__tls_refused_fn fn, void *ctx);
/* What an OpenSSL handshake error says of the client, in words ("no client
 * certificate", "not TLS: a plaintext client", ...); a static string. */
const char *rpc__tls_refusal_reason(const char *detail);
/* The TLS files of one side checked before gRPC sees them (server: the
 * server's --tls-cert/--tls-key/--tls-client-ca; else a client's): each
 * file opens and holds what it should (a PEM certificate, a PEM private
 * key), and the key belongs to the certificate. 0, or SR_EINVAL with a
 * message naming the flag, the file and the problem in err. warn (may be
 * NULL) gets a line when the certificate has expired or expires within 7
 * days, else "". */
int rpc__tls_check(const rpc_tls *tls, int server, char *err, size_t errlen, char *warn,
                   size_t warnlen);

#endif
