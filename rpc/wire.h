/* The client's Lookup and Push requests, written by hand (rpc/ and its
 * tests only): ids as ids_fixed, each table's 8-byte aligned in the
 * message behind a padding field (field 15, which decoders skip), a Push's
 * gradients 4-byte aligned, so that a server whose received bytes are
 * aligned reads both where they lie (rpc/service.c, "decoded in place").
 * Any protobuf decoder reads them as the messages of rpc/shardrec.proto. */
#ifndef SHARDREC_RPC_WIRE_H
#define SHARDREC_RPC_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "rpc/shardrec.pb-c.h"

#define RPC_WIRE_PAD_TAG 0x7a /* field 15, wire type 2: padding */

/* One table of a request. A Push's gradient row j (dim floats) is read
 * from grads + perm[j] * dim (perm NULL: grads + j * dim). */
typedef struct {
  uint32_t table_id;
  const uint64_t *ids; /* borrowed, [n] */
  size_t n;
  const float *grads;  /* borrowed; Push only */
  const size_t *perm;  /* borrowed, [n] or NULL */
  int dim;
} rpc_wire_table;

/* A LookupRequest of header h and tables t[n] (prefetch_only as given)
 * into a malloc'd buffer (caller frees) of *len bytes; NULL out of memory. */
uint8_t *rpc__lookup_encode(const Shardrec__V1__RequestHeader *h, const rpc_wire_table *t,
                            size_t n, int prefetch_only, size_t *len);
/* The same for a PushRequest with learning rate lr and each table's
 * gradients gathered into it. */
uint8_t *rpc__push_encode(const Shardrec__V1__RequestHeader *h, float lr,
                          const rpc_wire_table *t, size_t n, size_t *len);

#endif
