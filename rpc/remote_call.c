/* The remote store's transport (rpc/remote_impl.h): channels to each
 * server, calls in flight on a completion queue, and what is done with a
 * call that fails. Every attempt has its own deadline; a call that ends
 * UNAVAILABLE (server down, restarting, connection refused) is tried again
 * after a backoff (doubling, at most 1 s), on the server's next channel
 * (each reconnects by itself); so is one the server's in-flight budget
 * refused, and (o->retry_deadline) a Lookup, Push or Stats past its
 * deadline. A TLS handshake refused is final, not a server down. When the
 * tries run out the error names the shard and the server. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/sys.h"
#include "rpc/client.h"
#include "rpc/codec_impl.h"
#include "rpc/grpc_impl.h"
#include "rpc/remote_impl.h"

/* grpc_channel_create with base's arguments, plus, when own_pool, a
 * subchannel pool of the channel's own: gRPC core shares one subchannel
 * (one TCP connection) between channels of equal arguments, so this is what
 * gives a server's second channel a connection of its own. */
static grpc_channel *channel_create(const char *addr, grpc_channel_credentials *cr,
                                    const grpc_channel_args *base, int own_pool) {
  if (!own_pool) return grpc_channel_create(addr, cr, base);
  grpc_arg *a = calloc(base->num_args + 1, sizeof *a);
  if (!a) return NULL;
  memcpy(a, base->args, base->num_args * sizeof *a);
  a[base->num_args].type = GRPC_ARG_INTEGER;
  a[base->num_args].key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
  a[base->num_args].value.integer = 1;
  grpc_channel_args args = {base->num_args + 1, a};
  grpc_channel *ch = grpc_channel_create(addr, cr, &args);
  free(a);
  return ch;
}

static grpc_channel *make_channel(const char *addr, const rpc_client_opts *o, int own_pool,
                                  char *err, size_t errlen) {
  grpc_arg a[7];
  static const char *const keys[7] = {
      GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,   GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
      GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
      GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,     GRPC_ARG_ENABLE_RETRIES,
      GRPC_ARG_TCP_READ_CHUNK_SIZE};
  /* GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is also gRPC core's minimum connect
   * timeout (the time a TCP + HTTP/2 handshake may take): at 100 ms a loaded
   * machine failed fresh connections with "connection attempt timed out
   * before receiving SETTINGS frame". A refused connection (server down)
   * still fails at once; retries start 100 ms apart. The connection's TCP
   * reads start at RPC_TCP_READ_CHUNK bytes (rpc/grpc_impl.h). */
  int vals[7] = {o->max_message_bytes, o->max_message_bytes, 100, 2000, 1000, 0,
                 RPC_TCP_READ_CHUNK};
  rpc__int_args(a, keys, vals, 7);
  grpc_channel_args args = {7, a};
  grpc_channel_credentials *cr =
      o->tls ? rpc__channel_creds(o->tls, err, errlen) : grpc_insecure_credentials_create();
  if (!cr) return NULL;
  grpc_channel *ch = channel_create(addr, cr, &args, own_pool);
  grpc_channel_credentials_release(cr);
  if (!ch) sr_fmt(err, errlen, "%s: cannot create a channel", addr);
  return ch;
}

/* c's o->connections channels to addr (the first in gRPC's shared pool,
 * the others each in a pool of its own: a TCP connection each), their
 * methods registered. 0, or -1 with a message in err (c->n_ch says how
 * many were made, for the caller's clean-up). */
int rpc__conn_open(conn *c, const char *addr, const rpc_client_opts *o, char *err,
                     size_t errlen) {
  c->chs = calloc((size_t)o->connections, sizeof *c->chs);
  if (!c->chs) {
    sr_fmt(err, errlen, "remote store: out of memory");
    return -1;
  }
  for (int i = 0; i < o->connections; i++) {
    chan *h = &c->chs[i];
    if (!(h->ch = make_channel(addr, o, i > 0, err, errlen))) return -1;
    c->n_ch++;
    for (int m = 0; m < RPC_N_METHODS; m++)
      h->reg[m] = grpc_channel_register_call(h->ch, rpc_method_path((rpc_method)m), NULL, NULL);
    h->exchange = grpc_channel_register_call(h->ch, RPC_EXCHANGE_PATH, NULL, NULL);
  }
  return 0;
}

/* Shut cq down, drain it and destroy it. */
void rpc__cq_close(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

void rpc__opts_defaults(rpc_client_opts *o) {
  if (o->deadline_s <= 0) o->deadline_s = 30;
  if (o->max_tries <= 0) o->max_tries = 10;
  if (o->backoff_s <= 0) o->backoff_s = 0.05;
  if (o->max_message_bytes <= 0) o->max_message_bytes = 256 << 20;
  if (o->world_size <= 0) o->world_size = 1;
  if (o->connections <= 0) o->connections = RPC_CONNECTIONS_DEFAULT;
  if (o->connections > RPC_CONNECTIONS_MAX) o->connections = RPC_CONNECTIONS_MAX;
  if (o->chunk_bytes == 0) o->chunk_bytes = RPC_CHUNK_BYTES_DEFAULT;
}

static void pcall_reset_attempt(pcall *p) {
  if (p->call) grpc_call_unref(p->call);
  p->call = NULL;
  if (p->send) grpc_byte_buffer_destroy(p->send);
  p->send = NULL;
  if (p->recv) grpc_byte_buffer_destroy(p->recv);
  p->recv = NULL;
  grpc_metadata_array_destroy(&p->im);
  grpc_metadata_array_destroy(&p->tm);
  grpc_slice_unref(p->details);
  p->details = grpc_empty_slice();
}

void rpc__pcall_free(pcall *p) {
  pcall_reset_attempt(p);
  if (p->req_owned) free(p->req);
  else grpc_slice_unref(p->req_sl); /* gRPC frees req once it holds no reference */
  free(p->resp);
  free(p->parts);
  memset(p, 0, sizeof *p);
}

void rpc__pcall_init(pcall *p, int shard, rpc_method m, uint8_t *req, size_t len) {
  memset(p, 0, sizeof *p);
  p->shard = shard;
  p->m = m;
  p->req = req;
  p->req_len = len;
  p->req_owned = 1;
  p->req_sl = grpc_empty_slice();
  p->details = grpc_empty_slice();
  grpc_metadata_array_init(&p->im);
  grpc_metadata_array_init(&p->tm);
}

/* Let stream slot x go (its stream cancelled, if still open). */
static void xs_drop(xs_slot *x) {
  grpc_call_cancel(x->call, NULL);
  grpc_call_unref(x->call);
  memset(x, 0, sizeof *x);
}

/* Send p's request as a message on one of h's exchange streams over cq
 * (a free one, or a new one: its initial metadata go with the message):
 * the head (rpc/shardrec.proto, "Exchange stream"), then the request
 * without a copy. 0, or -1 when every slot is taken or the stream cannot
 * start (the attempt is then made as a call). */
static int xs_start(chan *h, grpc_completion_queue *cq, pcall *p, double deadline_s) {
  int k = -1, fresh = 0;
  for (int i = 0; i < RPC_XS_SLOTS && k < 0; i++)
    if (h->xs[i].call && h->xs[i].cq == cq && !h->xs[i].busy) k = i;
  for (int i = 0; i < RPC_XS_SLOTS && k < 0; i++)
    if (!h->xs[i].call) k = i, fresh = 1;
  if (k < 0) return -1;
  xs_slot *x = &h->xs[k];
  if (fresh) {
    x->call = grpc_channel_create_registered_call(h->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                                  h->exchange, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                                                  NULL);
    if (!x->call) return -1;
    x->cq = cq;
  }
  grpc_slice sl[2] = {grpc_slice_malloc(RPC_EXCHANGE_HEAD), p->req_sl};
  const uint32_t head[2] = {(uint32_t)p->m, 0};
  memcpy(GRPC_SLICE_START_PTR(sl[0]), head, RPC_EXCHANGE_HEAD);
  p->send = grpc_raw_byte_buffer_create(sl, 2);
  grpc_slice_unref(sl[0]);
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (fresh) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &p->im;
  }
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = p->send;
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &p->recv;
  if (grpc_call_start_batch(x->call, ops, n, p, NULL) != GRPC_CALL_OK) {
    xs_drop(x);
    return -1;
  }
  x->busy = 1;
  p->xs_ch = h;
  p->xs_at = k;
  p->xs_deadline = sr_now() + deadline_s;
  p->xs_late = 0;
  p->active = 1;
  return 0;
}

/* p's message on its stream ended (ok: gRPC's success): its status, its
 * status message and its answer (p->recv, without the head) from the
 * answer's head. A stream that failed is dropped: UNAVAILABLE, or
 * DEADLINE_EXCEEDED when this client cancelled it at p's deadline; the
 * attempt is then retried as a call's failure is. So is a stream this
 * client cancelled, even when its message's answer came first. */
static void xs_done(pcall *p, int ok) {
  xs_slot *x = &p->xs_ch->xs[p->xs_at];
  p->xs_ch = NULL;
  x->busy = 0;
  uint32_t st = 0;
  grpc_slice msg = grpc_empty_slice();
  grpc_byte_buffer *body = ok && p->recv ? rpc__exchange_answer(p->recv, &st, &msg) : NULL;
  if (!body || x->cancelled) xs_drop(x);
  grpc_slice_unref(p->details);
  if (!body) {
    p->status = p->xs_late ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_UNAVAILABLE;
    p->details = grpc_slice_from_static_string(
        p->xs_late ? "deadline passed on the exchange stream"
        : p->recv  ? "exchange stream: an answer that does not read"
                   : "exchange stream ended");
    return;
  }
  p->status = (grpc_status_code)st;
  p->details = msg;
  grpc_byte_buffer_destroy(p->recv);
  p->recv = body;
}

void rpc__pcall_cancel(pcall *p) {
  if (p->xs_ch) {
    xs_slot *x = &p->xs_ch->xs[p->xs_at];
    x->cancelled = 1;
    grpc_call_cancel(x->call, NULL);
  } else if (p->call) {
    grpc_call_cancel(p->call, NULL);
  }
}

void rpc__xs_close(conn *conns, int n, grpc_completion_queue *cq) {
  for (int k = 0; k < n; k++)
    for (int i = 0; i < conns[k].n_ch; i++)
      for (int j = 0; j < RPC_XS_SLOTS; j++) {
        xs_slot *x = &conns[k].chs[i].xs[j];
        if (!x->call || (cq && x->cq != cq)) continue;
        if (x->busy) x->cancelled = 1; /* its message ends first (xs_done) */
        else xs_drop(x);
      }
}

/* Start one attempt of p on conn c. 0, or -1 (p->done set with a status). */
int rpc__pcall_start(conn *c, grpc_completion_queue *cq, pcall *p, double deadline_s) {
  pcall_reset_attempt(p);
  grpc_metadata_array_init(&p->im);
  grpc_metadata_array_init(&p->tm);
  p->tries++;
  chan *h = &c->chs[p->chan % c->n_ch];
  if (p->req_owned && p->req) { /* the slice takes req: every attempt sends it, no copy */
    p->req_sl = grpc_slice_new(p->req, p->req_len, free);
    p->req_owned = 0;
  }
  const int xs = p->m == RPC_PUSH                                 ? c->xs_push
                 : p->m == RPC_LOOKUP || p->m == RPC_PUSH_LOOKUP ? c->xs_lookup
                                                                 : 0;
  if (xs && !p->path && !p->no_deadline && !xs_start(h, cq, p, deadline_s)) return 0;
  if (p->path) {
    grpc_slice method = grpc_slice_from_copied_string(p->path);
    p->call = grpc_channel_create_call(h->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                       rpc__deadline(deadline_s), NULL);
    grpc_slice_unref(method);
  } else {
    p->call = grpc_channel_create_registered_call(
        h->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, h->reg[p->m],
        p->no_deadline ? gpr_inf_future(GPR_CLOCK_MONOTONIC) : rpc__deadline(deadline_s), NULL);
  }
  p->send = grpc_raw_byte_buffer_create(&p->req_sl, 1);
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = p->send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &p->im;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &p->recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &p->tm;
  ops[5].data.recv_status_on_client.status = &p->status;
  ops[5].data.recv_status_on_client.status_details = &p->details;
  if (!p->call || grpc_call_start_batch(p->call, ops, 6, p, NULL) != GRPC_CALL_OK) {
    p->status = GRPC_STATUS_INTERNAL;
    p->done = 1;
    return -1;
  }
  p->active = 1;
  return 0;
}

/* Whether the status details of p's last attempt hold key. */
static int details_have(const pcall *p, const char *key) {
  size_t n = GRPC_SLICE_LENGTH(p->details), k = strlen(key);
  const char *d = (const char *)GRPC_SLICE_START_PTR(p->details);
  for (size_t i = 0; i + k <= n; i++)
    if (!memcmp(d + i, key, k)) return 1;
  return 0;
}

/* A refusal of the server's in-flight budget (RPC_RESOURCE_EXHAUSTED,
 * "in-flight memory budget"): tried again after a backoff, as UNAVAILABLE. */
static int budget_refusal(const pcall *p) {
  return p->status == GRPC_STATUS_RESOURCE_EXHAUSTED && details_have(p, "in-flight memory budget");
}

/* Whether p's last attempt failed in a TLS handshake rather than on a
 * server that is down (connection refused): TLS_CLOSED, the server closed
 * each connection as soon as it was made, before any HTTP/2 frame (gRPC
 * 1.51 says "Socket closed" while connecting): what a TLS server does to
 * a client it refuses (no client certificate, one its client CA did not
 * sign, a plaintext client; the server's reason stays on its side); or
 * TLS_OURS, this client's own handshake failed ("Ssl handshake failed":
 * the server's certificate did not verify, or the server does not speak
 * TLS). Neither is tried again as a server down is: TLS_OURS is final at
 * once, TLS_CLOSED after TLS_CLOSED_TRIES attempts in a row (a server that
 * dies while a connection is made is refused at the next). */
enum { TLS_NONE, TLS_CLOSED, TLS_OURS };
#define TLS_CLOSED_TRIES 3
static int tls_refusal(const pcall *p) {
  if (p->status != GRPC_STATUS_UNAVAILABLE) return TLS_NONE;
  if (details_have(p, "Ssl handshake failed")) return TLS_OURS;
  if (details_have(p, "failed to connect to all addresses") && details_have(p, "Socket closed"))
    return TLS_CLOSED;
  return TLS_NONE;
}

/* o->retry_deadline: a Lookup, Push or Stats whose deadline passed (a
 * partition: nothing came back) is tried again too (each is safe to repeat:
 * Push is idempotent at the server, and so a PushLookup). */
static int deadline_retry(const pcall *p, const rpc_client_opts *o) {
  return o->retry_deadline && p->status == GRPC_STATUS_DEADLINE_EXCEEDED && !p->path &&
         (p->m == RPC_LOOKUP || p->m == RPC_PUSH || p->m == RPC_PUSH_LOOKUP || p->m == RPC_STATS);
}

/* A call answered after failed attempts: c's note says so. */
static void note_outlasted(conn *c, const pcall *p) {
  c->notes++;
  sr_fmt(c->note, sizeof c->note, "%s to %s answered after %d tries over %.1f s (%s before)",
         rpc_method_path(p->m), c->addr ? c->addr : "?", p->tries, sr_now() - p->t_trouble,
         rpc_status_name(p->why_retry));
}

void rpc__run_calls(conn *conns, grpc_completion_queue *cq, pcall *calls, int n,
                    const rpc_client_opts *o) {
  rpc__run_calls_each(conns, cq, calls, n, o, NULL, NULL);
}

/* Drive calls[n] (already started or waiting to retry) to their end. */
void rpc__run_calls_each(conn *conns, grpc_completion_queue *cq, pcall *calls, int n,
                         const rpc_client_opts *o, void (*each)(void *ctx, pcall *p),
                         void *ctx) {
  for (;;) {
    int busy = 0;
    double now = sr_now(), next_retry = 0;
    for (int i = 0; i < n; i++) {
      pcall *p = &calls[i];
      if (p->done) continue;
      busy = 1;
      if (!p->active && p->retry_at <= now)
        rpc__pcall_start(&conns[p->shard], cq, p, o->deadline_s);
      else if (!p->active && (next_retry == 0 || p->retry_at < next_retry)) next_retry = p->retry_at;
    }
    int active = 0;
    for (int i = 0; i < n; i++) {
      const pcall *p = &calls[i];
      active += p->active;
      /* A message on a stream has no deadline of gRPC's: the wait ends at
       * its own too (below). */
      if (p->active && p->xs_ch && !p->xs_late && (next_retry == 0 || p->xs_deadline < next_retry))
        next_retry = p->xs_deadline;
    }
    if (!busy) return;
    gpr_timespec until = active ? gpr_inf_future(GPR_CLOCK_MONOTONIC)
                                : rpc__deadline(next_retry - now > 0 ? next_retry - now : 0);
    if (active && next_retry > 0) until = rpc__deadline(next_retry - now > 0 ? next_retry - now : 0);
    grpc_event ev = grpc_completion_queue_next(cq, until, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
      /* Nothing came: a message on a stream past its deadline is cancelled
       * with its stream. Only now, when the queue held no answer: one that
       * came while its caller was away (a Lookup sent ahead) is not late. */
      now = sr_now();
      for (int i = 0; i < n; i++) {
        pcall *p = &calls[i];
        if (p->active && p->xs_ch && !p->xs_late && p->xs_deadline <= now) {
          p->xs_late = 1;
          rpc__pcall_cancel(p);
        }
      }
    }
    if (ev.type != GRPC_OP_COMPLETE) continue;
    pcall *p = ev.tag;
    p->active = 0;
    if (p->xs_ch) xs_done(p, ev.success);
    else if (!ev.success) p->status = GRPC_STATUS_INTERNAL;
    const int trouble = p->status == GRPC_STATUS_UNAVAILABLE || deadline_retry(p, o);
    const int tls = tls_refusal(p);
    p->refusals = tls ? p->refusals + 1 : 0;
    const int final = tls == TLS_OURS || p->refusals >= TLS_CLOSED_TRIES;
    if (trouble && !p->trouble++) {
      p->t_trouble = sr_now();
      if (o->on_retry && p->tries < o->max_tries && !p->cancelled && !tls) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s to %s: %s; trying again (%d tries in all)",
                 rpc_method_path(p->m), conns[p->shard].addr ? conns[p->shard].addr : "?",
                 rpc_status_name(p->status), o->max_tries);
        o->on_retry(o->retry_ctx, msg);
      }
    }
    if (trouble) p->why_retry = p->status;
    if ((trouble || budget_refusal(p)) && p->tries < o->max_tries && !p->cancelled && !final) {
      /* The next attempt goes on the server's next connection: one that
       * broke need not hold the retry up while it reconnects. */
      p->chan = (p->chan + 1) % conns[p->shard].n_ch;
      p->backoff = p->backoff > 0 ? p->backoff * 2 : o->backoff_s;
      if (p->backoff > 1.0) p->backoff = 1.0;
      p->retry_at = sr_now() + p->backoff;
      continue;
    }
    p->done = 1;
    if (p->status == GRPC_STATUS_OK && p->trouble) note_outlasted(&conns[p->shard], p);
    if (p->status == GRPC_STATUS_OK) {
      /* A Lookup's answer stays in p->recv, read in place (rpc/answer.c). */
      const int in_place = (p->m == RPC_LOOKUP || p->m == RPC_PUSH_LOOKUP) && !p->path;
      if (!p->recv || (!in_place && rpc__bb_read(p->recv, &p->resp, &p->resp_len))) {
        p->status = GRPC_STATUS_INTERNAL;
        grpc_slice_unref(p->details);
        p->details = grpc_slice_from_static_string("no answer message");
      }
    }
    if (each) each(ctx, p);
  }
}

/* A call that ended in a TLS refusal (tls_refusal): what this client
 * can tell of it into err, from the status and its own TLS files (d:
 * the status details). Not a lost server: a Restore would not help. */
static int tls_error(const conn *c, const rpc_client_opts *o, const pcall *p, const char *what,
                     const char *d, char *err, size_t errlen) {
  const rpc_tls *t = o->tls;
  char head[400];
  snprintf(head, sizeof head, "%s: shard %d server %s", what, p->shard, c->addr);
  const char *ssl = strstr(d, "Ssl handshake failed: ");
  if (tls_refusal(p) == TLS_OURS)
    sr_fmt(err, errlen, "%s: the TLS handshake failed on this side: %s (%s)", head,
           strstr(d, "certificate verify failed")
               ? "the server's certificate is not signed by --tls-ca's CA, or not made out to "
                 "that address"
               : "does the server speak TLS?",
           ssl ? ssl + strlen("Ssl handshake failed: ") : d);
  else if (!t)
    sr_fmt(err, errlen, "%s refused the plaintext connection (closed it before any "
           "HTTP/2 frame): the server speaks TLS: give --tls-ca (and --tls-cert, --tls-key "
           "when it asks for client certificates) (after %d tries)", head, p->tries);
  else if (!t->cert)
    sr_fmt(err, errlen, "%s refused the TLS handshake: no client certificate (the "
           "server asks for one: give --tls-cert and --tls-key) (after %d tries)", head, p->tries);
  else
    sr_fmt(err, errlen, "%s refused the TLS handshake: the client certificate "
           "--tls-cert %s is not signed by the server's client CA (or has expired) (after %d "
           "tries)", head, t->cert, p->tries);
  return SR_EBACKEND;
}

/* Message for a failed call into err; returns an SR_E* code. A server
 * that restarted on rows left by a crash (RPC_MSG_UNCLEAN) is a lost server,
 * as one with a new incarnation is: only a Restore makes it usable. A TLS
 * refusal (final, as run_calls decides it) is not (tls_error). */
int rpc__call_error(const conn *c, const rpc_client_opts *o, const pcall *p, const char *what,
                    char *err, size_t errlen, int *lost) {
  char *d = grpc_slice_to_c_string(p->details);
  const int tls = tls_refusal(p); /* a closed socket is a refusal only when it was final */
  if (tls == TLS_OURS || (tls && p->refusals >= TLS_CLOSED_TRIES)) {
    int rc = tls_error(c, o, p, what, d ? d : "", err, errlen);
    gpr_free(d);
    return rc;
  }
  const int crashed = p->status == GRPC_STATUS_FAILED_PRECONDITION && d && strstr(d, RPC_MSG_UNCLEAN);
  /* A call tried again across a partition and answered ABORTED because a
   * rank "went away": the server took a call the client gave up on at its
   * deadline (a Lookup cancelled) for a rank gone and dropped the step's
   * held pushes, so the step is lost there as on a restarted server: the
   * job recovers rather than stopping. */
  const int dropped = p->status == GRPC_STATUS_ABORTED && p->trouble && d && strstr(d, "went away");
  sr_fmt(err, errlen, "%s: shard %d server %s%s: %s%s%s (after %d tr%s)", what, p->shard,
         c->addr, crashed ? " restarted after a crash" : "", rpc_status_name(p->status),
         d && *d ? ": " : "", d ? d : "", p->tries, p->tries == 1 ? "y" : "ies");
  gpr_free(d);
  /* A Checkpoint tried again after its server went away finds the part of
   * the folder that server wrote before it went (or the whole of it, when
   * only its answer was lost): as a lost server, so the job recovers and
   * writes the step again rather than stopping. */
  const int torn = p->m == RPC_CHECKPOINT && p->status == GRPC_STATUS_ALREADY_EXISTS && p->trouble;
  if (crashed || torn || dropped) {
    *lost = 1;
    return SR_EUNAVAILABLE;
  }
  switch ((int)p->status) {
    case GRPC_STATUS_UNAVAILABLE: *lost = 1; return SR_EUNAVAILABLE;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
      /* past every retry's deadline (retry_deadline): unreachable as long
       * as the budget, so lost as a server that is down; so is one a
       * Restore did not reach in time (a link back from a cut that TCP has
       * not resent on yet): the recovery waits for it and tries again (a
       * Restore is safe to repeat) */
      if (deadline_retry(p, o) || p->m == RPC_RESTORE) *lost = 1;
      return SR_ETIMEOUT;
    case GRPC_STATUS_FAILED_PRECONDITION: return SR_EMISMATCH;
    case GRPC_STATUS_ABORTED: return SR_ESTATE; /* the job's pending state was dropped */
    case GRPC_STATUS_INVALID_ARGUMENT: return SR_EINVAL;
    default: return SR_EBACKEND;
  }
}

int rpc_call_once(const char *target, const rpc_tls *tls, rpc_method m, const uint8_t *req,
                  size_t len, double deadline_s, uint8_t **resp, size_t *resp_len, char *msg,
                  size_t msglen) {
  if (m < 0 || m >= RPC_N_METHODS) {
    if (msglen) snprintf(msg, msglen, "no such method");
    return GRPC_STATUS_INVALID_ARGUMENT;
  }
  return rpc_call_path(target, tls, rpc_method_path(m), req, len, deadline_s, resp, resp_len, msg,
                       msglen);
}

int rpc_call_path(const char *target, const rpc_tls *tls, const char *path, const uint8_t *req,
                  size_t len, double deadline_s, uint8_t **resp, size_t *resp_len, char *msg,
                  size_t msglen) {
  *resp = NULL;
  *resp_len = 0;
  if (msglen) msg[0] = 0;
  rpc_global_init();
  rpc_client_opts o = {.deadline_s = deadline_s, .max_tries = 1, .tls = tls};
  rpc__opts_defaults(&o);
  grpc_channel *ch = make_channel(target, &o, 0, msg, msglen);
  if (!ch) {
    rpc_global_shutdown();
    return GRPC_STATUS_INTERNAL;
  }
  chan h = {.ch = ch};
  conn c = {.chs = &h, .n_ch = 1};
  for (int i = 0; i < RPC_N_METHODS; i++)
    h.reg[i] = grpc_channel_register_call(ch, rpc_method_path((rpc_method)i), NULL, NULL);
  grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
  pcall p;
  uint8_t *copy = malloc(len ? len : 1);
  if (len) memcpy(copy, req, len);
  rpc__pcall_init(&p, 0, RPC_LOOKUP, copy, len);
  p.path = path;
  if (!rpc__pcall_start(&c, cq, &p, o.deadline_s)) rpc__run_calls(&c, cq, &p, 1, &o);
  int st = (int)p.status;
  char *d = grpc_slice_to_c_string(p.details);
  if (msglen) snprintf(msg, msglen, "%s", d ? d : "");
  gpr_free(d);
  if (st == GRPC_STATUS_OK) {
    *resp = p.resp;
    *resp_len = p.resp_len;
    p.resp = NULL;
  }
  rpc__pcall_free(&p);
  grpc_channel_destroy(ch);
  rpc__cq_close(cq);
  rpc_global_shutdown();
  return st;
}
