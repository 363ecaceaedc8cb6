/* The checkpoint step of a Lookup answer (rpc/service.h, "versions"):
 * the step a server of a checkpoint names in every answer, a Lookup that
 * asks for one of a server holding one step, and the exclusive section a
 * following server swaps in. */
#include <pthread.h>
#include <stdio.h>

#include "rpc/service_impl.h"

void rpc_service_exclusive(rpc_service *s, void (*fn)(void *ctx), void *ctx) {
  pthread_mutex_lock(&s->mu);
  fn(ctx);
  pthread_mutex_unlock(&s->mu);
}

uint8_t *rpc__answer_step(const rpc_service *s, uint8_t *p, int64_t step) {
  if (!s->from_ckpt) return p;
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
             "no checkpoint's", (long long)asked);
  return r->status;
}
