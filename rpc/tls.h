/* TLS for the shard service's gRPC channels: the PEM files of one side,
 * shared by the server (rpc/server.h) and the client (rpc/client.h). */
#ifndef SHARDREC_RPC_TLS_H
#define SHARDREC_RPC_TLS_H

typedef struct rpc_tls {
  const char *cert, *key; /* PEM files: this side's certificate and key */
  const char *ca;         /* server: client CA (mTLS, clients must present a cert);
                             client: CA that signed the server */
} rpc_tls;

#endif
