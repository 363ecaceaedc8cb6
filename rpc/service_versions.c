/* The checkpoint step of a Lookup answer (rpc/service.h, "versions"):
 * the step a server of a checkpoint names in every answer, a Lookup that
 * asks for one of a server holding one step, and the exclusive section a
 * following server swaps in. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "rpc/service_impl.h"
#include "rpc/shardrec.pb-c.h"

void rpc_service_exclusive(rpc_service *s, void (*fn)(void *ctx), void *ctx) {
  pthread_mutex_lock(&s->mu);
  fn(ctx);
  pthread_mutex_unlock(&s->mu);
}

uint8_t *rpc__answer_step(uint8_t *p, int named, int64_t step) {
  if (!named) return p;
  *p++ = 0x18; /* LookupResponse.step */
  p = rpc__varint_put(p, (uint64_t)step);
  *p++ = 0x20; /* LookupResponse.from_checkpoint */
  *p++ = 1;
  return p;
}

int rpc__check_one_step(const rpc_service *s, int64_t asked, rpc_reply *r) {
  if (s->from_ckpt && asked == s->ckpt_step) return RPC_OK;
  r->status = s->from_ckpt && asked > s->ckpt_step ? RPC_UNAVAILABLE : RPC_FAILED_PRECONDITION;
  if (s->from_ckpt)
    snprintf(r->msg, sizeof r->msg, "at_step: step %lld asked, this server serves the checkpoint "
             "of step %lld only", (long long)asked, (long long)s->ckpt_step);
  else
    snprintf(r->msg, sizeof r->msg, "at_step: step %lld asked, this server serves a plan's rows, "
             "no checkpoint's (or a checkpoint's changed since by a Restore, Push or Remove)",
             (long long)asked);
  return r->status;
}

void rpc__swap_at(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r) {
  if (rpc__texts_ok(&shardrec__v1__swap_at_request__descriptor, in, len, r)) return;
  Shardrec__V1__SwapAtRequest *q = shardrec__v1__swap_at_request__unpack(NULL, len, in);
  int64_t served = s->ckpt_step;
  if (!q) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "not a valid shardrec.v1.SwapAtRequest (%zu bytes)", len);
  } else if (!q->plan_fingerprint || strcmp(q->plan_fingerprint, s->fp)) {
    r->status = RPC_FAILED_PRECONDITION;
    snprintf(r->msg, sizeof r->msg, "plan_fingerprint: request made under plan %.16s..., this "
             "server serves plan %.16s...",
             q->plan_fingerprint && *q->plan_fingerprint ? q->plan_fingerprint : "(none)", s->fp);
  } else if (!s->versions || !s->versions->swap_at) {
    r->status = RPC_FAILED_PRECONDITION;
    snprintf(r->msg, sizeof r->msg, "SwapAt refused: this server does not follow a checkpoint "
             "folder (serve --checkpoint DIR --follow)");
  } else {
    r->status = s->versions->swap_at(s->versions->ctx, q->step, &served, r->msg, sizeof r->msg);
  }
  if (!r->status) {
    Shardrec__V1__SwapAtResponse resp = SHARDREC__V1__SWAP_AT_RESPONSE__INIT;
    resp.served_step = served;
    resp.incarnation = s->incarnation;
    rpc__pack_reply(r, &resp.base);
  }
  if (q) shardrec__v1__swap_at_request__free_unpacked(q, NULL);
}
