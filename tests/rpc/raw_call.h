/* Lookups on a raw gRPC core channel, for the tests of clients that stall:
 * a call whose request is sent and whose answer is read later, or never
 * (test_rpc_limits.c: the in-flight budget; test_rpc_pinned.c: answers
 * pinned while unread). Static and marked unused, as tests/rpc/calls.h. */
#ifndef SHARDREC_TESTS_RPC_RAW_CALL_H
#define SHARDREC_TESTS_RPC_RAW_CALL_H

#include <check.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
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

#endif
