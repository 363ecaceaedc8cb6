/* The served model's data transform (rpc/shardrec.proto, "The data
 * transform"): opaque bytes handed to rpc_service_create with their
 * fingerprint, checked once there, then given out in chunks by
 * GetTransform. rpc/ does not parse them (it does not see datasets/). */
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "rpc/service_impl.h"
#include "rpc/shardrec.pb-c.h"

int rpc__transform_init(rpc_service *s, const rpc_service_opts *o, char *err, size_t errlen) {
  if (!o->transform_fp || !o->transform_fp[0]) return 0;
  if (!o->transform || strlen(o->transform_fp) != SR_SHA256_HEX - 1) {
    sr_fmt(err, errlen, "service: data transform fingerprint '%.70s' without its bytes, or not "
           "a SHA-256 hex", o->transform_fp);
    return SR_EINVAL;
  }
  char have[SR_SHA256_HEX];
  int rc = sr_sha256_hex(o->transform, o->transform_len, have);
  if (rc) {
    sr_fmt(err, errlen, "service: SHA-256 of the data transform failed");
    return rc;
  }
  if (strcmp(have, o->transform_fp)) {
    sr_fmt(err, errlen, "service: the data transform's %zu bytes hash to %.12s, not to its "
           "fingerprint %.12s", o->transform_len, have, o->transform_fp);
    return SR_ECHECKSUM;
  }
  s->xf = o->transform;
  s->xf_len = o->transform_len;
  memcpy(s->xf_fp, have, SR_SHA256_HEX);
  return 0;
}

/* The most bytes one answer carries: max_bytes (0: the default), at most
 * RPC_TRANSFORM_CHUNK_MAX and what fits the message limit with room for
 * the answer's other fields. */
static size_t chunk_cap(const rpc_service *s, uint32_t max_bytes) {
  size_t n = max_bytes ? max_bytes : RPC_TRANSFORM_CHUNK;
  if (n > RPC_TRANSFORM_CHUNK_MAX) n = RPC_TRANSFORM_CHUNK_MAX;
  size_t fit = s->max_msg > 4096 ? s->max_msg - 4096 : 1;
  return n < fit ? n : fit;
}

void rpc__get_transform(rpc_service *s, const uint8_t *in, size_t len, int defer, rpc_reply *r) {
  Shardrec__V1__GetTransformRequest *q =
      shardrec__v1__get_transform_request__unpack(NULL, len, in);
  if (!q) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "not a valid shardrec.v1.GetTransformRequest (%zu bytes)", len);
    return;
  }
  const uint64_t off = q->offset;
  const uint32_t max_bytes = q->max_bytes;
  shardrec__v1__get_transform_request__free_unpacked(q, NULL);
  if (!s->xf) {
    r->status = RPC_NOT_FOUND;
    snprintf(r->msg, sizeof r->msg, "this server's model records no data transform (it was "
             "started from a plan, or from a checkpoint that records none)");
    return;
  }
  if (off > s->xf_len) {
    r->status = RPC_OUT_OF_RANGE;
    snprintf(r->msg, sizeof r->msg, "offset %llu is past the end of the data transform's %zu "
             "bytes", (unsigned long long)off, s->xf_len);
    return;
  }
  size_t n = chunk_cap(s, max_bytes);
  if (n > s->xf_len - off) n = s->xf_len - (size_t)off;
  /* The packed answer and gRPC's copy of it, until it is sent. */
  if (rpc__budget_take(s, 2 * (n + 128), defer, r)) return;
  Shardrec__V1__GetTransformResponse resp = SHARDREC__V1__GET_TRANSFORM_RESPONSE__INIT;
  resp.fingerprint = s->xf_fp;
  resp.total_bytes = s->xf_len;
  resp.offset = off;
  resp.data.len = n;
  resp.data.data = (uint8_t *)s->xf + off; /* packed (copied) below, never written */
  rpc__pack_reply(r, &resp.base);
}
