/* Internal helpers shared by the server and the client (rpc/ only). */
#ifndef SHARDREC_RPC_GRPC_UTIL_H
#define SHARDREC_RPC_GRPC_UTIL_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "rpc/tls.h"

/* Copy a received byte buffer (maybe several slices, maybe compressed) into
 * a malloc'd array. Returns 0, or -1 when out of memory. NULL bb: empty. */
int rpc__bb_read(grpc_byte_buffer *bb, uint8_t **out, size_t *len);
/* A byte buffer holding a copy of data[len]. */
grpc_byte_buffer *rpc__bb_make(const uint8_t *data, size_t len);
/* Credentials from PEM files; NULL with a message in err on failure. */
grpc_server_credentials *rpc__server_creds(const rpc_tls *tls, char *err, size_t errlen);
grpc_channel_credentials *rpc__channel_creds(const rpc_tls *tls, char *err, size_t errlen);
gpr_timespec rpc__deadline(double seconds);

#endif
