/* Lookups on a raw gRPC core channel, for the tests of clients that stall:
 * a call whose request is sent and whose answer is read later, or never
 * (test_rpc_limits.c: the in-flight budget; test_rpc_pinned.c: answers
 * pinned while unread), and raw exchange streams (test_rpc_server.c,
 * test_rpc_pinned.c). Static and marked unused, as tests/rpc/calls.h. */
#ifndef SHARDREC_TESTS_RPC_RAW_CALL_H
#define SHARDREC_TESTS_RPC_RAW_CALL_H

#include <check.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/client.h"
#include "rpc/grpc_impl.h"

#define RAW_UNUSED __attribute__((unused))

/* One call in flight on a raw gRPC core channel. */
typedef struct {
  grpc_call *call;
  grpc_byte_buffer *send, *recv;
  grpc_metadata_array im, tm;
  grpc_status_code status;
  grpc_slice details;
} raw_call;

/* An insecure channel to addr taking answers up to 64 MiB; slow: its
 * streams take 64 KiB before the application reads (no BDP probing to
 * grow the window), so an unread answer stays in the server's hands. */
static RAW_UNUSED grpc_channel *raw_channel(const char *addr, int slow) {
  grpc_arg a[3] = {
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = 64 << 20},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_BDP_PROBE, .value.integer = 0},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, .value.integer = 65535}};
  grpc_channel_args args = {slow ? 3 : 1, a};
  grpc_channel_credentials *cr = grpc_insecure_credentials_create();
  grpc_channel *ch = grpc_channel_create(addr, cr, &args);
  grpc_channel_credentials_release(cr);
  ck_assert_ptr_nonnull(ch);
  return ch;
}

/* The receiving half of c's ops into ops[3]. */
static RAW_UNUSED void raw_recv_ops(raw_call *c, grpc_op *ops) {
  ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[0].data.recv_initial_metadata.recv_initial_metadata = &c->im;
  ops[1].op = GRPC_OP_RECV_MESSAGE;
  ops[1].data.recv_message.recv_message = &c->recv;
  ops[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[2].data.recv_status_on_client.trailing_metadata = &c->tm;
  ops[2].data.recv_status_on_client.status = &c->status;
  ops[2].data.recv_status_on_client.status_details = &c->details;
}

/* Start a Lookup of req[len] on ch with a deadline of deadline_s: one batch
 * on cq (tag c) that sends it and, when read, also reads the answer; else
 * the answer waits for raw_read (or for ever: a stalled client). */
static RAW_UNUSED void raw_start(grpc_channel *ch, grpc_completion_queue *cq, raw_call *c,
                                 const uint8_t *req, size_t len, double deadline_s, int read) {
  memset(c, 0, sizeof *c);
  grpc_metadata_array_init(&c->im);
  grpc_metadata_array_init(&c->tm);
  c->details = grpc_empty_slice();
  grpc_slice m = grpc_slice_from_static_string(rpc_method_path(RPC_LOOKUP));
  c->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                     rpc__deadline(deadline_s), NULL);
  grpc_slice_unref(m);
  c->send = rpc__bb_make(req, len);
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = c->send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  if (read) raw_recv_ops(c, ops + 3);
  ck_assert_int_eq(grpc_call_start_batch(c->call, ops, read ? 6 : 3, c, NULL), GRPC_CALL_OK);
}

/* Wait for n completions on cq (300 s at most: the only failure); with
 * ok, each must have succeeded. */
static RAW_UNUSED void raw_wait(grpc_completion_queue *cq, int n, int ok) {
  for (int i = 0; i < n; i++) {
    grpc_event ev = grpc_completion_queue_next(cq, rpc__deadline(300), NULL);
    ck_assert_int_eq(ev.type, GRPC_OP_COMPLETE);
    if (ok) ck_assert(ev.success);
  }
}

/* Read c's answer now (its status into c->status, its message into
 * c->recv) and wait for it. */
static RAW_UNUSED void raw_read(grpc_completion_queue *cq, raw_call *c) {
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  raw_recv_ops(c, ops);
  ck_assert_int_eq(grpc_call_start_batch(c->call, ops, 3, c, NULL), GRPC_CALL_OK);
  raw_wait(cq, 1, 0);
}

static RAW_UNUSED void raw_free(raw_call *c) {
  if (c->call) grpc_call_unref(c->call);
  if (c->send) grpc_byte_buffer_destroy(c->send);
  if (c->recv) grpc_byte_buffer_destroy(c->recv);
  grpc_metadata_array_destroy(&c->im);
  grpc_metadata_array_destroy(&c->tm);
  grpc_slice_unref(c->details);
}

static RAW_UNUSED void raw_cq_drain(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

/* ---- exchange streams (rpc/shardrec.proto, "Exchange stream") ---- */

/* One exchange stream on a raw channel, with its own queue. */
typedef struct {
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_metadata_array im;
  grpc_byte_buffer *send, *recv; /* the message in flight and its answer */
  int sent; /* messages sent so far (the first carries the initial metadata) */
} xs_raw;

static RAW_UNUSED void xs_open(xs_raw *x, grpc_channel *ch) {
  memset(x, 0, sizeof *x);
  x->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_slice m = grpc_slice_from_static_string(RPC_EXCHANGE_PATH);
  x->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, x->cq, m, NULL,
                                     gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  grpc_slice_unref(m);
  grpc_metadata_array_init(&x->im);
}

/* Send msg[len] as x's next message, its answer read into x->recv; waited
 * for by xs_finish. */
static RAW_UNUSED void xs_start(xs_raw *x, const uint8_t *msg, size_t len) {
  x->send = rpc__bb_make(msg, len);
  x->recv = NULL;
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (!x->sent++) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &x->im;
  }
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = x->send;
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &x->recv;
  ck_assert_int_eq(grpc_call_start_batch(x->call, ops, n, x, NULL), GRPC_CALL_OK);
}

/* Wait for the answer xs_start asked for: its status, the status message
 * into msg_out, the answer after the head into *out (malloc'd) when out.
 * -1 when the stream ended instead. */
static RAW_UNUSED int xs_finish(xs_raw *x, char *msg_out, uint8_t **out, size_t *olen) {
  raw_wait(x->cq, 1, 0);
  grpc_byte_buffer_destroy(x->send);
  x->send = NULL;
  if (!x->recv) return -1;
  grpc_slice all;
  ck_assert_int_eq(rpc__bb_view(x->recv, &all), 0);
  grpc_byte_buffer_destroy(x->recv);
  x->recv = NULL;
  const uint8_t *a = GRPC_SLICE_START_PTR(all);
  const size_t alen = GRPC_SLICE_LENGTH(all);
  ck_assert_uint_ge(alen, 8);
  uint32_t st, ml;
  memcpy(&st, a, 4);
  memcpy(&ml, a + 4, 4);
  const size_t off = 8 + ((ml + 7) & ~(size_t)7);
  ck_assert_uint_le(off, alen);
  ck_assert_uint_lt(ml, 512);
  memcpy(msg_out, a + 8, ml);
  msg_out[ml] = 0;
  if (out) {
    *olen = alen - off;
    *out = malloc(*olen + 1);
    memcpy(*out, a + off, *olen);
  }
  grpc_slice_unref(all);
  return (int)st;
}

/* req[len] behind the head (method m, second word w2), sent on x: begun
 * (xs_begin) or sent and answered (xs_call, as xs_finish). */
static RAW_UNUSED void xs_begin(xs_raw *x, uint32_t m, uint32_t w2, const uint8_t *req,
                                size_t len) {
  uint8_t *b = malloc(len + 8);
  memcpy(b, &m, 4);
  memcpy(b + 4, &w2, 4);
  if (len) memcpy(b + 8, req, len);
  xs_start(x, b, len + 8);
  free(b);
}
static RAW_UNUSED int xs_call(xs_raw *x, uint32_t m, uint32_t w2, const uint8_t *req, size_t len,
                              char *msg, uint8_t **out, size_t *olen) {
  xs_begin(x, m, w2, req, len);
  return xs_finish(x, msg, out, olen);
}

/* x's call and queue freed, without a close (its stream ended). */
static RAW_UNUSED void xs_free(xs_raw *x) {
  grpc_call_unref(x->call);
  grpc_metadata_array_destroy(&x->im);
  raw_cq_drain(x->cq);
}

/* The client's end of x: its half-close and the status the server sends
 * (OK); then xs_free. */
static RAW_UNUSED void xs_close(xs_raw *x) {
  grpc_metadata_array tm;
  grpc_metadata_array_init(&tm);
  grpc_status_code st;
  grpc_slice details;
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[1].data.recv_status_on_client.trailing_metadata = &tm;
  ops[1].data.recv_status_on_client.status = &st;
  ops[1].data.recv_status_on_client.status_details = &details;
  ck_assert_int_eq(grpc_call_start_batch(x->call, ops, 2, x, NULL), GRPC_CALL_OK);
  raw_wait(x->cq, 1, 1);
  ck_assert_int_eq(st, GRPC_STATUS_OK);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&tm);
  xs_free(x);
}

#endif
