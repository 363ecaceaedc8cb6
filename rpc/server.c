/* The gRPC C-core server loop of the shard service.
 *
 * One completion queue per worker thread, registered with the server before
 * it starts. Each worker posts, on its own queue, one registered request per
 * method and one generic request (so a call to an unknown method is
 * answered UNIMPLEMENTED instead of hanging); a call lives on the thread
 * that received it and runs to the end there: decode, rpc_service_handle,
 * one batch of SEND_INITIAL_METADATA, SEND_MESSAGE, SEND_STATUS_FROM_SERVER,
 * RECV_CLOSE_ON_SERVER. The request is re-armed before the call is handled.
 * Exception: a Lookup of a multi-rank job held until its previous step is
 * applied (rpc/service.h), and a rank's Watch, are parked in the service with
 * their call; after each call
 * and every 50 ms poll, a worker answers the parked calls the service hands
 * back (grpc batches may be started from any thread; the batch completes on
 * the owner's queue). A parked call counts as live on its owner, so the
 * owner never shuts its queue down under it; on shutdown the service stops
 * parking and the parked calls are answered UNAVAILABLE. A parked call also
 * gets its RECV_CLOSE_ON_SERVER op at once, in a batch of its own: it
 * completes with cancelled = 1 when the client goes away (its process died,
 * or it cancelled the call), and before the call's deadline that is a rank
 * gone: rpc_service_cancel drops its job's pending state and the job's other
 * parked Lookups are answered ABORTED. Such a call is referenced by its
 * parked entry (until answered) and by its close batch; the last one frees
 * it.
 *
 * A Lookup answered from the store's memory (rpc_reply.pinned) goes out as
 * a byte buffer of slices into the store's slots (rpc__bb_pinned); its
 * share of the budget and the rows' pins go when gRPC drops the last of
 * them (the send finished, or the call was cancelled), not when c is freed.
 *
 * Shutdown (grpc-core.md): grpc_server_shutdown_and_notify on a queue of its
 * own while the workers still poll; after the grace period
 * grpc_server_cancel_all_calls; once notified, each worker shuts down its
 * own queue when it holds no live tag and drains it; join; destroy. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "common/sys.h"
#include "rpc/client.h"
#include "rpc/codec_impl.h"
#include "rpc/grpc_impl.h"
#include "rpc/server.h"

typedef enum { TAG_REQUEST = 1, TAG_GENERIC, TAG_REPLY, TAG_CLOSE, TAG_STREAM } tag_kind;

typedef struct worker worker;

typedef struct call_ctx {
  tag_kind kind;
  worker *owner;        /* the worker whose queue the call lives on */
  int method;           /* TAG_REQUEST: rpc_method */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  grpc_call_details details; /* generic requests */
  /* Reply batch. */
  grpc_byte_buffer *send;
  grpc_slice status_msg;
  int has_status_msg;
  int cancelled;
  int close_early;      /* RECV_CLOSE_ON_SERVER runs in a batch of its own (parked calls) */
  _Atomic int refs;     /* the reply batch (or parked entry) and the early close batch */
  size_t held;          /* in-flight budget the answer holds, given back when c is freed
                           (the reply batch completed: the answer is sent) */
  double give_up;       /* deferred (no room in the budget): answered RESOURCE_EXHAUSTED
                           if still without room at this sr_now() */
  struct call_ctx *next; /* in the deferred list */
} call_ctx;

/* The tag of a parked call's early RECV_CLOSE_ON_SERVER batch. kind first:
 * the worker reads a tag's kind before knowing its type. */
typedef struct {
  tag_kind kind; /* TAG_CLOSE */
  call_ctx *c;   /* holds one reference */
  int cancelled;
} close_tag;

typedef struct server_state server_state;

/* An exchange stream (rpc/shardrec.proto, "Exchange stream"), on the
 * worker that took it: one batch in flight at a time (at), so its
 * messages are read, handled and answered in order. kind first, as for
 * every tag. */
typedef enum { XS_NEW, XS_RECV, XS_SENT, XS_END } xs_at;
typedef struct xstream {
  tag_kind kind; /* TAG_STREAM */
  xs_at at;
  worker *owner;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *recv, *send;
  size_t held; /* the budget the answer being sent holds */
  int cancelled;
  int idle;     /* waiting for the client's next message (under st->mu) */
  struct xstream *prev, *next; /* the server's open streams (st->xs) */
  /* The message being handled: its method and bytes (head included),
   * kept while it waits for room in the in-flight budget. */
  rpc_method m;
  grpc_slice req;
  double give_up;        /* waiting: refused RESOURCE_EXHAUSTED if still without room then */
  struct xstream *dnext; /* in the deferred list */
} xstream;

struct worker {
  server_state *st;
  grpc_completion_queue *cq;
  pthread_t th;
  /* Tags posted and not yet returned, and calls parked or deferred. A tag
   * counts before gRPC has it (a batch started from another worker may end
   * on this one's queue, and its tag be freed, before start_batch returns);
   * the queue shuts down only at 0, so no batch can start on it after. */
  _Atomic int live;
};

struct server_state {
  grpc_server *srv;
  const rpc_server_opts *o;
  rpc_service *svc;
  void *methods[RPC_N_METHODS];
  void *exchange; /* the exchange stream's method */
  worker *w;
  int n_workers;
  _Atomic int server_down; /* shutdown notified: workers may close their queues */
  pthread_mutex_t mu;      /* the deferred list */
  call_ctx *def_head, *def_tail; /* calls waiting for room in the in-flight budget */
  xstream *xdef_head, *xdef_tail; /* stream messages waiting so */
  _Atomic int n_deferred;
  uint64_t def_gen;        /* rpc_service_budget_gen when they were last tried */
  xstream *xs;             /* open exchange streams (under mu) */
  int stopping;            /* a stop began (under mu): idle streams are cancelled */
};

static call_ctx *ctx_new(tag_kind k, int method) {
  call_ctx *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->kind = k;
  c->method = method;
  atomic_init(&c->refs, 1);
  grpc_metadata_array_init(&c->md);
  grpc_call_details_init(&c->details);
  return c;
}

static void ctx_free(call_ctx *c) {
  if (!c) return;
  if (c->held) rpc_service_release(c->owner->st->svc, c->held);
  grpc_metadata_array_destroy(&c->md);
  grpc_call_details_destroy(&c->details);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->send) grpc_byte_buffer_destroy(c->send);
  if (c->has_status_msg) grpc_slice_unref(c->status_msg);
  if (c->call) grpc_call_unref(c->call);
  free(c);
}

static void ctx_unref(call_ctx *c) {
  if (c && atomic_fetch_sub(&c->refs, 1) == 1) ctx_free(c);
}

/* Start a batch whose tag comes back on w's queue, counted on w before
 * gRPC has it (struct worker) and uncounted when the start fails. w comes
 * from the caller, so nothing reads the tag once the batch started: it may
 * have ended, and its tag been freed, before the start returns. 0, or -1
 * when it did not start (the caller frees the tag). */
static int batch_start(worker *w, grpc_call *call, const grpc_op *ops, size_t n, void *tag) {
  w->live++;
  if (grpc_call_start_batch(call, ops, n, tag, NULL) == GRPC_CALL_OK) return 0;
  w->live--;
  return -1;
}

/* Post a request for method m (or a generic one, m < 0) on w's queue. */
static int post_request(worker *w, int m) {
  server_state *st = w->st;
  call_ctx *c = ctx_new(m < 0 ? TAG_GENERIC : TAG_REQUEST, m);
  if (!c) return -1;
  c->owner = w;
  grpc_call_error e;
  w->live++; /* counted before gRPC has it, as every tag (struct worker) */
  if (m < 0)
    e = grpc_server_request_call(st->srv, &c->call, &c->details, &c->md, w->cq, w->cq, c);
  else
    e = grpc_server_request_registered_call(st->srv, st->methods[m], &c->call, &c->deadline,
                                            &c->md, &c->payload, w->cq, w->cq, c);
  if (e != GRPC_CALL_OK) {
    w->live--;
    ctx_free(c);
    return -1;
  }
  return 0;
}

/* Answer c's call with status (and body when status is OK). Takes c and
 * body (malloc'd, or NULL: sent without a copy and freed when gRPC is done
 * with it, whatever the status). Any thread may answer a call: the batch
 * completes on the owner's queue. */
static void reply(worker *w, call_ctx *c, int status, const char *msg, uint8_t *body,
                  size_t len) {
  c->kind = TAG_REPLY;
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  int n = 0;
  ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
  n++;
  if (status != RPC_OK) free(body);
  if (status == RPC_OK) {
    if (!c->send) c->send = rpc__bb_take(body, len); /* else a pinned answer's (reply_answer) */
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = c->send;
    n++;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)status;
  if (msg && *msg) {
    c->status_msg = grpc_slice_from_copied_string(msg);
    c->has_status_msg = 1;
    ops[n].data.send_status_from_server.status_details = &c->status_msg;
  }
  n++;
  if (!c->close_early) {
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
    n++;
  }
  if (batch_start(w, c->call, ops, (size_t)n, c)) ctx_unref(c);
}

/* Answer c's call refused before the service saw it, counted as the
 * service counts the calls it answers (rpc_service_note: Stats, metrics,
 * logs). */
static void refuse(worker *w, call_ctx *c, int status, const char *msg) {
  const size_t in = c->payload ? grpc_byte_buffer_length(c->payload) : 0;
  rpc_service_note(w->st->svc, (rpc_method)c->method, status, msg, 0, in, 0);
  reply(w, c, status, msg, NULL, 0);
}

/* Answer c's call with r (the service's reply: r->out or r->pinned); a
 * pinned answer's budget share is given back when gRPC releases its
 * rows (rpc__bb_pinned), the rest (r->held) when c is freed. late: the
 * deadline passed while it was handled: DEADLINE_EXCEEDED instead. */
static void reply_answer(worker *w, call_ctx *c, rpc_reply *r, int late) {
  c->held = r->held;
  if (r->pinned && (r->status != RPC_OK || late)) rpc_pinned_release(r->pinned);
  else if (r->pinned && !(c->send = rpc__bb_pinned(r->pinned))) {
    reply(w, c, RPC_RESOURCE_EXHAUSTED, "out of memory for the answer", NULL, 0);
    return;
  }
  r->pinned = NULL;
  if (late) reply(w, c, RPC_DEADLINE_EXCEEDED, "deadline passed while handling the call", r->out, 0);
  else reply(w, c, r->status, r->msg, r->out, r->out_len);
}

/* 1 when name is in the list "A,B,...". */
static int name_listed(const char *list, const char *name, size_t n) {
  for (const char *p = list; *p;) {
    size_t k = strcspn(p, ",");
    if (k == n && !memcmp(p, name, n)) return 1;
    p += k + (p[k] == ',');
  }
  return 0;
}

/* The client's names (CN, SAN DNS names: auth context properties) checked
 * against list. 1 when one is listed; else 0 with who it was in who. */
static int peer_allowed(grpc_call *call, const char *list, char *who, size_t wlen) {
  static const char *const props[2] = {"x509_common_name", "x509_subject_alternative_name"};
  grpc_auth_context *ac = grpc_call_auth_context(call);
  int ok = 0;
  size_t at = 0;
  who[0] = 0;
  for (int i = 0; ac && i < 2 && !ok; i++) {
    grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ac, props[i]);
    const grpc_auth_property *p;
    while (!ok && (p = grpc_auth_property_iterator_next(&it))) {
      ok = name_listed(list, p->value, p->value_length);
      if (at + 8 < wlen)
        at += (size_t)snprintf(who + at, wlen - at, "%s%s%.*s", at ? ", " : "", i ? "SAN " : "CN ",
                               (int)p->value_length, p->value);
    }
  }
  if (ac) grpc_auth_context_release(ac);
  if (!who[0]) snprintf(who, wlen, "a client with no certificate names");
  return ok;
}

/* Whether method is open to call's client (o's allow lists): 1, or 0
 * with the refusal in msg. */
static int allowed(const rpc_server_opts *o, grpc_call *call, int method, char *msg, size_t n) {
  const int push = method == RPC_PUSH || method == RPC_REMOVE ||
                   method == RPC_PUSH_LOOKUP; /* all change rows */
  const char *list = push ? o->allow_push
                     : method == RPC_CHECKPOINT || method == RPC_RESTORE || method == RPC_SWAP_AT
                           ? o->allow_admin
                           : NULL;
  char who[256];
  if (!list || !o->tls || !o->tls->ca || peer_allowed(call, list, who, sizeof who)) return 1;
  const char *m = strrchr(rpc_method_path((rpc_method)method), '/') + 1;
  snprintf(msg, n, "%s refused: client %s is not in --allow-%s (%s)", m, who,
           push ? "push" : "admin", list);
  return 0;
}

/* Whether the call's method is open to its client; refused calls are
 * answered here. 1 when allowed. */
static int authorised(worker *w, call_ctx *c) {
  char msg[512];
  if (allowed(w->st->o, c->call, c->method, msg, sizeof msg)) return 1;
  refuse(w, c, RPC_PERMISSION_DENIED, msg);
  return 0;
}

/* Keep c (its request still in c->payload) until the budget has room;
 * it counts as live on its owner meanwhile. */
static void defer_call(server_state *st, call_ctx *c) {
  c->owner->live++;
  c->next = NULL;
  pthread_mutex_lock(&st->mu);
  if (st->def_tail) st->def_tail->next = c;
  else st->def_head = c;
  st->def_tail = c;
  rpc_service_waiting(st->svc, (uint64_t)++st->n_deferred);
  pthread_mutex_unlock(&st->mu);
}

/* Answer the parked calls that can be answered now (from any worker). */
static void answer_woken(server_state *st) {
  rpc_woken wk[16];
  int n;
  do {
    n = rpc_service_take_woken(st->svc, wk, 16);
    for (int i = 0; i < n; i++) {
      call_ctx *c = wk[i].token;
      worker *owner = c->owner;
      reply_answer(owner, c, &wk[i].r, 0);
      owner->live--; /* no longer parked (reply counted its batch first) */
    }
  } while (n == 16);
}

/* Handle call c; 1 when it was deferred (no room in the in-flight budget). */
static int handle_one(worker *w, call_ctx *c) {
  if (c->kind == TAG_GENERIC) {
    char msg[300];
    char *method = grpc_slice_to_c_string(c->details.method);
    snprintf(msg, sizeof msg, "unknown method %s", method ? method : "?");
    gpr_free(method);
    refuse(w, c, RPC_UNIMPLEMENTED, msg); /* c->method: RPC_METHOD_UNKNOWN */
    return 0;
  }
  if (gpr_time_cmp(c->deadline, gpr_now(c->deadline.clock_type)) < 0) {
    refuse(w, c, RPC_DEADLINE_EXCEEDED, "deadline passed before the call was handled");
    return 0;
  }
  if (!authorised(w, c)) return 0;
  grpc_slice in;
  if (!c->payload) {
    refuse(w, c, RPC_INVALID_ARGUMENT, "no request message");
    return 0;
  }
  if (rpc__bb_view(c->payload, &in)) {
    refuse(w, c, RPC_RESOURCE_EXHAUSTED, "out of memory reading the request");
    return 0;
  }
  rpc_reply r;
  gpr_timespec left = gpr_time_sub(c->deadline, gpr_now(c->deadline.clock_type));
  double left_s = (double)left.tv_sec + 1e-9 * (double)left.tv_nsec;
  /* A Lookup may park, and another worker may answer it before this one
   * gets to start its close batch: set both up before it can. */
  int may_park = c->method == RPC_LOOKUP || c->method == RPC_WATCH;
  if (may_park) {
    c->close_early = 1;
    atomic_store(&c->refs, 2);
  }
  rpc_service_handle_call(w->st->svc, (rpc_method)c->method, GRPC_SLICE_START_PTR(in),
                          GRPC_SLICE_LENGTH(in), c, left_s, &r);
  grpc_slice_unref(in);
  if (r.status == RPC_PARKED) { /* answered later by whichever worker wakes it */
    w->live++;
    close_tag *ct = calloc(1, sizeof *ct);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    if (ct) {
      ct->kind = TAG_CLOSE;
      ct->c = c;
      op.data.recv_close_on_server.cancelled = &ct->cancelled;
    }
    if (!ct || batch_start(w, c->call, &op, 1, ct)) {
      /* no word of a cancel: the timeouts still end the job's wait */
      free(ct);
      ctx_unref(c);
    }
    return 0;
  }
  if (may_park) { /* not parked: nobody else holds c */
    c->close_early = 0;
    atomic_store(&c->refs, 1);
  }
  if (r.status == RPC_DEFERRED) { /* tried again when budget is given back */
    if (c->give_up == 0) c->give_up = sr_now() + rpc_service_budget_wait_s(w->st->svc);
    defer_call(w->st, c);
    return 1;
  }
  reply_answer(w, c, &r,
               r.status == RPC_OK && gpr_time_cmp(c->deadline, gpr_now(c->deadline.clock_type)) < 0);
  return 0;
}

/* handle_one, then the parked calls it woke answered (a Push that
 * completed a step wakes the Lookups parked for it): 1 when c waits for
 * room in the budget. */
static int handle(worker *w, call_ctx *c) {
  const int deferred = handle_one(w, c);
  answer_woken(w->st);
  return deferred;
}

static void xs_retry(server_state *st, xstream *x, int retry, double now);

/* The deferred calls: given up on (RESOURCE_EXHAUSTED) once their time is
 * past or a stop began (a stop does not wait for room); tried again, in
 * order, when budget was given back since the last try, until one finds
 * no room again. Any worker may run them: each is answered on its owner's
 * queue. */
static void retry_deferred(server_state *st) {
  if (!atomic_load(&st->n_deferred)) return;
  pthread_mutex_lock(&st->mu);
  uint64_t gen = rpc_service_budget_gen(st->svc);
  int retry = gen != st->def_gen;
  st->def_gen = gen;
  call_ctx *c = st->def_head;
  xstream *x = st->xdef_head;
  st->def_head = st->def_tail = NULL;
  st->xdef_head = st->xdef_tail = NULL;
  st->n_deferred = 0;
  const double now = st->stopping ? INFINITY : sr_now(); /* a stop gives up on all */
  pthread_mutex_unlock(&st->mu);
  while (c) {
    call_ctx *next = c->next;
    worker *owner = c->owner; /* c may be freed once answered */
    c->next = NULL;
    if (now >= c->give_up) {
      rpc_reply r;
      rpc_service_refuse_busy(st->svc, &r);
      reply(c->owner, c, r.status, r.msg, NULL, 0);
    } else if (retry) {
      retry = !handle(c->owner, c);
    } else {
      defer_call(st, c);
    }
    owner->live--; /* off the list: its answer's batch or its place back counts now */
    c = next;
  }
  xs_retry(st, x, retry, now);
  pthread_mutex_lock(&st->mu);
  rpc_service_waiting(st->svc, (uint64_t)st->n_deferred);
  pthread_mutex_unlock(&st->mu);
}

/* A parked call's close batch ended. Cancelled before the call's deadline
 * (a deadline cancels it too; the service answers those itself): the client
 * went away; if the call is still parked the service forgets it and drops
 * its job's pending state, and the job's other parked Lookups are answered
 * now. */
static void on_close(worker *w, close_tag *ct) {
  call_ctx *c = ct->c;
  if (ct->cancelled) {
    gpr_timespec now = gpr_now(c->deadline.clock_type);
    gpr_timespec near = gpr_time_sub(c->deadline, gpr_time_from_millis(200, GPR_TIMESPAN));
    if (gpr_time_cmp(now, near) < 0 && rpc_service_cancel(w->st->svc, c)) {
      c->owner->live--; /* no longer parked, never answered */
      ctx_unref(c);
    }
    answer_woken(w->st);
  }
  ctx_unref(c);
  free(ct);
}

/* ---- exchange streams ---- */

/* Post a request for an exchange stream on w's queue. */
static void xs_post(worker *w) {
  xstream *x = calloc(1, sizeof *x);
  if (!x) return;
  x->kind = TAG_STREAM;
  x->at = XS_NEW;
  x->owner = w;
  grpc_metadata_array_init(&x->md);
  w->live++;
  if (grpc_server_request_registered_call(w->st->srv, w->st->exchange, &x->call, &x->deadline,
                                          &x->md, NULL, w->cq, w->cq, x) != GRPC_CALL_OK) {
    w->live--;
    grpc_metadata_array_destroy(&x->md);
    free(x);
  }
}

static void xs_free(xstream *x) {
  server_state *st = x->owner->st;
  pthread_mutex_lock(&st->mu);
  const int listed = x->prev || st->xs == x; /* open: counted by rpc_service_streams */
  if (x->prev) x->prev->next = x->next;
  else if (listed) st->xs = x->next;
  if (x->next) x->next->prev = x->prev;
  pthread_mutex_unlock(&st->mu);
  if (listed) rpc_service_streams(st->svc, -1);
  grpc_slice_unref(x->req);
  if (x->held) rpc_service_release(st->svc, x->held);
  grpc_metadata_array_destroy(&x->md);
  if (x->recv) grpc_byte_buffer_destroy(x->recv);
  if (x->send) grpc_byte_buffer_destroy(x->send);
  if (x->call) grpc_call_unref(x->call);
  free(x);
}

/* Start x's next batch (ops[n]), the one in flight from now on (on its
 * owner's queue: every xs_ function below works on x->owner's). */
static void xs_batch(xstream *x, xs_at at, grpc_op *ops, size_t n) {
  x->at = at;
  if (batch_start(x->owner, x->call, ops, n, x)) xs_free(x);
}

/* Read x's next message (after its initial metadata when first). The
 * stream is idle until it comes: a stop that begins meanwhile cancels it,
 * and one that began already cancels it now (an idle stream is no call in
 * flight, and would hold a graceful stop for its whole grace period). */
static void xs_read(xstream *x, int first) {
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (first) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &x->recv;
  server_state *st = x->owner->st;
  pthread_mutex_lock(&st->mu);
  x->at = XS_RECV;
  if (batch_start(x->owner, x->call, ops, n, x)) {
    pthread_mutex_unlock(&st->mu);
    xs_free(x);
    return;
  }
  x->idle = 1;
  if (st->stopping) grpc_call_cancel(x->call, NULL);
  pthread_mutex_unlock(&st->mu);
}

/* Send r as the answer to x's message (rpc/shardrec.proto: the head, then
 * the answer, a pinned one without a copy); x holds r's budget until it is
 * sent. */
static void xs_answer(xstream *x, rpc_reply *r) {
  if (r->status != RPC_OK && r->pinned) { /* as reply_answer; a refusal has no r->out */
    rpc_pinned_release(r->pinned);
    r->pinned = NULL;
  }
  const size_t ml = r->status == RPC_OK ? 0 : strlen(r->msg), pad = (ml + 7) & ~(size_t)7;
  grpc_slice head = grpc_slice_malloc(RPC_EXCHANGE_HEAD + pad);
  uint8_t *h = GRPC_SLICE_START_PTR(head);
  memset(h, 0, RPC_EXCHANGE_HEAD + pad);
  const uint32_t st = (uint32_t)r->status, len = (uint32_t)ml;
  memcpy(h, &st, 4);
  memcpy(h + 4, &len, 4);
  memcpy(h + RPC_EXCHANGE_HEAD, r->msg, ml);
  grpc_byte_buffer *body = NULL;
  if (r->pinned && !(body = rpc__bb_pinned(r->pinned))) {
    grpc_slice_unref(head);
    rpc_reply oom;
    memset(&oom, 0, sizeof oom);
    oom.status = RPC_RESOURCE_EXHAUSTED;
    snprintf(oom.msg, sizeof oom.msg, "out of memory for the answer");
    rpc_service_release(x->owner->st->svc, r->held);
    xs_answer(x, &oom);
    return;
  }
  if (!body && r->status == RPC_OK) body = rpc__bb_take(r->out, r->out_len);
  x->send = grpc_raw_byte_buffer_create(&head, 1);
  grpc_slice_unref(head);
  if (body) { /* its slices join the head's (a reference each) */
    for (size_t i = 0; i < body->data.raw.slice_buffer.count; i++)
      grpc_slice_buffer_add(&x->send->data.raw.slice_buffer,
                            grpc_slice_ref(body->data.raw.slice_buffer.slices[i]));
    grpc_byte_buffer_destroy(body);
  }
  x->held = r->held;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = x->send;
  xs_batch(x, XS_SENT, &op, 1);
}

/* Keep x's message (x->req) until the budget has room; the stream counts
 * as live on its owner meanwhile, as a deferred call does. */
static void xs_defer(server_state *st, xstream *x) {
  x->owner->live++;
  x->dnext = NULL;
  pthread_mutex_lock(&st->mu);
  if (st->xdef_tail) st->xdef_tail->dnext = x;
  else st->xdef_head = x;
  st->xdef_tail = x;
  rpc_service_waiting(st->svc, (uint64_t)++st->n_deferred);
  pthread_mutex_unlock(&st->mu);
}

/* Handle x's message (x->req: its head read, its method allowed) and
 * answer it on x's owner's queue (from any worker); 1 when it found no
 * room in the in-flight budget and waits for it (xs_defer). */
static int xs_handle(xstream *x) {
  server_state *st = x->owner->st;
  rpc_reply r;
  rpc_service_handle_exchange(st->svc, x->m, GRPC_SLICE_START_PTR(x->req) + RPC_EXCHANGE_HEAD,
                              GRPC_SLICE_LENGTH(x->req) - RPC_EXCHANGE_HEAD, &r);
  if (r.status == RPC_DEFERRED) {
    xs_defer(st, x);
    return 1;
  }
  grpc_slice req = x->req; /* kept past the answer (which may free x) for a Push's update */
  x->req = grpc_empty_slice();
  xs_answer(x, &r);
  (void)rpc_service_after(st->svc, r.after); /* a Push answered, updated as its answer travels */
  grpc_slice_unref(req);
  answer_woken(st); /* as handle's */
  return 0;
}

/* The deferred stream messages, as retry_deferred's calls: refused once
 * their time is past (now: INFINITY at a stop), tried again in order
 * while retry holds (until one finds no room again), else put back. A
 * message leaves its owner's live count only once its answer's batch or
 * its place back on the list counts there. */
static void xs_retry(server_state *st, xstream *x, int retry, double now) {
  while (x) {
    xstream *next = x->dnext;
    worker *owner = x->owner;
    x->dnext = NULL;
    if (now >= x->give_up) {
      rpc_reply r;
      rpc_service_refuse_busy(st->svc, &r);
      grpc_slice_unref(x->req);
      x->req = grpc_empty_slice();
      xs_answer(x, &r);
    } else if (retry) {
      retry = !xs_handle(x);
    } else {
      xs_defer(st, x);
    }
    owner->live--;
    x = next;
  }
}

/* x's message, just read: its head checked, its method allowed, then
 * handled and answered (xs_handle); one that finds no room in the
 * in-flight budget waits for it as a deferred call does, and is refused
 * RESOURCE_EXHAUSTED when its time runs out. */
static void xs_message(xstream *x) {
  server_state *st = x->owner->st;
  rpc_reply r;
  memset(&r, 0, sizeof r);
  grpc_slice in;
  const int read = rpc__bb_view(x->recv, &in);
  const size_t len = read ? grpc_byte_buffer_length(x->recv) : GRPC_SLICE_LENGTH(in);
  grpc_byte_buffer_destroy(x->recv);
  x->recv = NULL;
  x->m = RPC_METHOD_UNKNOWN;
  if (read) {
    r.status = RPC_RESOURCE_EXHAUSTED;
    snprintf(r.msg, sizeof r.msg, "out of memory reading the request");
  } else if (!rpc__exchange_head(GRPC_SLICE_START_PTR(in), len, &x->m, &r) &&
             !allowed(st->o, x->call, (int)x->m, r.msg, sizeof r.msg)) {
    r.status = RPC_PERMISSION_DENIED;
  }
  if (r.status == RPC_OK) {
    x->req = in;
    x->give_up = sr_now() + rpc_service_budget_wait_s(st->svc);
    xs_handle(x);
    return;
  }
  rpc_service_note(st->svc, x->m, r.status, r.msg, 0, len, 0);
  grpc_slice_unref(in);
  xs_answer(x, &r);
}

/* x's batch in flight ended. */
static void xs_event(worker *w, xstream *x, int success) {
  server_state *st = w->st;
  switch (x->at) {
    case XS_NEW:
      if (!success) { /* shutting down: free, do not re-arm */
        xs_free(x);
        return;
      }
      xs_post(w);
      pthread_mutex_lock(&st->mu);
      x->next = st->xs;
      if (st->xs) st->xs->prev = x;
      st->xs = x;
      pthread_mutex_unlock(&st->mu);
      rpc_service_streams(st->svc, 1);
      xs_read(x, 1);
      return;
    case XS_RECV:
      pthread_mutex_lock(&st->mu);
      x->idle = 0;
      pthread_mutex_unlock(&st->mu);
      if (!success) { /* cancelled: the client went, or a stop began */
        xs_free(x);
        return;
      }
      if (x->recv) {
        xs_message(x);
      } else { /* the client closed the stream: its status, and the end */
        grpc_op ops[2];
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[0].data.send_status_from_server.status = GRPC_STATUS_OK;
        ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[1].data.recv_close_on_server.cancelled = &x->cancelled;
        xs_batch(x, XS_END, ops, 2);
      }
      return;
    case XS_SENT:
      rpc_service_release(st->svc, x->held);
      x->held = 0;
      grpc_byte_buffer_destroy(x->send);
      x->send = NULL;
      if (success) xs_read(x, 0);
      else xs_free(x);
      retry_deferred(st); /* budget was given back */
      return;
    case XS_END:
      xs_free(x);
      return;
  }
}

static void *worker_main(void *arg) {
  worker *w = arg;
  server_state *st = w->st;
  int closing = 0;
  for (;;) {
    if (!closing && st->server_down && w->live == 0) {
      grpc_completion_queue_shutdown(w->cq);
      closing = 1;
    }
    grpc_event ev = grpc_completion_queue_next(
        w->cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(50, GPR_TIMESPAN)),
        NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
      answer_woken(st); /* parked calls whose deadline passed */
      retry_deferred(st);
      continue;
    }
    w->live--;
    if (*(tag_kind *)ev.tag == TAG_CLOSE) {
      on_close(w, ev.tag);
      continue;
    }
    if (*(tag_kind *)ev.tag == TAG_STREAM) {
      xs_event(w, ev.tag, ev.success);
      continue;
    }
    call_ctx *c = ev.tag;
    switch (c->kind) {
      case TAG_REQUEST:
      case TAG_GENERIC:
        if (!ev.success) { /* shutting down: free, do not re-arm */
          ctx_free(c);
          break;
        }
        post_request(w, c->kind == TAG_GENERIC ? -1 : c->method);
        handle(w, c);
        break;
      case TAG_REPLY:
        ctx_unref(c); /* the answer is sent: its budget is given back */
        retry_deferred(st);
        break;
      case TAG_CLOSE:
      case TAG_STREAM:
        break;
    }
  }
  return NULL;
}

/* Bind o->listen on srv, with TLS (*tlsrv, checked files; a warning about
 * the certificate's end on stderr) or without. 0 with the port, or SR_E*
 * with the reason in err. */
static int listen_port(grpc_server *srv, const rpc_server_opts *o, rpc__tls_server **tlsrv,
                       int *port, char *err, size_t errlen) {
  grpc_server_credentials *creds;
  if (o->tls) {
    char warn[600];
    *tlsrv = rpc__tls_server_create(o->tls, err, errlen, warn, sizeof warn);
    if (!*tlsrv) return SR_EINVAL;
    if (warn[0]) fprintf(stderr, "server: warning: %s\n", warn);
    creds = rpc__tls_server_creds(*tlsrv);
    if (!creds) {
      sr_fmt(err, errlen, "server: gRPC refused the TLS credentials");
      return SR_EINVAL;
    }
  } else {
    creds = grpc_insecure_server_credentials_create();
  }
  *port = grpc_server_add_http2_port(srv, o->listen, creds);
  grpc_server_credentials_release(creds);
  if (*port > 0) return 0;
  sr_fmt(err, errlen, "server: cannot listen on %s (address in use or invalid)", o->listen);
  return SR_EIO;
}

/* A client's TLS handshake refused (rpc__tls_refused_hook): said once per
 * connection, by o's hook or as one line on stderr. */
static void tls_refused(void *ctx, const char *reason, const char *detail) {
  const rpc_server_opts *o = ctx;
  if (o->on_tls_refused) o->on_tls_refused(o->tls_refused_ctx, reason, detail);
  else fprintf(stderr, "server: refused a TLS handshake: %s (%s)\n", reason, detail);
}

/* SIGHUP: the TLS files read again for new connections; said on stderr. */
static void tls_reload(rpc__tls_server *t, const rpc_server_opts *o) {
  char err[600], warn[600];
  if (!t) {
    fprintf(stderr, "server: reload asked, but this server has no TLS files\n");
    return;
  }
  if (rpc__tls_server_reload(t, err, sizeof err, warn, sizeof warn)) {
    fprintf(stderr, "server: TLS reload failed, the old files stay in use: %s\n", err);
    return;
  }
  if (warn[0]) fprintf(stderr, "server: warning: %s\n", warn);
  fprintf(stderr, "server: TLS files reloaded (%s, %s%s%s): new connections use them\n",
          o->tls->cert, o->tls->key, o->tls->ca ? ", " : "", o->tls->ca ? o->tls->ca : "");
}

int rpc_server_run(rpc_service *svc, const rpc_server_opts *o,
                   void (*on_listening)(int port, void *ctx), void *ctx, char *err,
                   size_t errlen) {
  int threads = o->threads > 0 ? o->threads : 1;
  int maxmsg = o->max_message_bytes > 0 ? o->max_message_bytes : 64 << 20;
  /* Message limits, no port sharing, and the TCP reads (rpc/grpc_impl.h:
   * the last, the least a read takes, only where Pushes come). */
  static const char *const keys[] = {
      GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, "grpc.so_reuseport",
      GRPC_ARG_TCP_READ_CHUNK_SIZE, GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE};
  const int vals[] = {maxmsg, maxmsg, 0, RPC_TCP_READ_CHUNK, RPC_SERVER_READ_MIN};
  grpc_arg args[5];
  const int n_args = rpc_service_takes_pushes(svc) ? 5 : 4;
  rpc__int_args(args, keys, vals, n_args);
  grpc_channel_args cargs = {(size_t)n_args, args};

  server_state st;
  memset(&st, 0, sizeof st);
  st.svc = svc;
  st.o = o;
  st.n_workers = threads;
  pthread_mutex_init(&st.mu, NULL);
  st.w = calloc((size_t)threads, sizeof *st.w);
  if (!st.w) {
    sr_fmt(err, errlen, "server: out of memory");
    return SR_ENOMEM;
  }
  rpc_malloc_tune();
  rpc_global_init();
  rpc_service_pin_answers(svc, o->pin_min_row_bytes ? o->pin_min_row_bytes : RPC_PIN_MIN_ROW_BYTES);
  st.srv = grpc_server_create(&cargs, NULL);
  for (int m = 0; m < RPC_N_METHODS; m++)
    st.methods[m] = grpc_server_register_method(st.srv, rpc_method_path((rpc_method)m), NULL,
                                                GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  st.exchange =
      grpc_server_register_method(st.srv, RPC_EXCHANGE_PATH, NULL, GRPC_SRM_PAYLOAD_NONE, 0);
  for (int i = 0; i < threads; i++) {
    st.w[i].st = &st;
    st.w[i].cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(st.srv, st.w[i].cq, NULL);
  }
  /* Shutdown's queue is not listening: the server hands each new
   * connection to one of its listening queues' pollers in turn, and nobody
   * waits on this one until shutdown (the "poll" engine, rpc/grpc_util.c,
   * polls a connection only from the queue it was handed to). */
  grpc_completion_queue_attributes nl = {GRPC_CQ_CURRENT_VERSION, GRPC_CQ_NEXT,
                                         GRPC_CQ_NON_LISTENING, NULL};
  grpc_completion_queue *shut_cq =
      grpc_completion_queue_create(grpc_completion_queue_factory_lookup(&nl), &nl, NULL);
  grpc_server_register_completion_queue(st.srv, shut_cq, NULL);

  rpc__tls_server *tlsrv = NULL;
  int port = 0, rc = listen_port(st.srv, o, &tlsrv, &port, err, errlen);
  if (rc) {
    grpc_server_destroy(st.srv);
    for (int i = 0; i < threads; i++) grpc_completion_queue_destroy(st.w[i].cq);
    grpc_completion_queue_destroy(shut_cq);
    free(st.w);
    pthread_mutex_destroy(&st.mu);
    rpc_global_shutdown();
    rpc__tls_server_destroy(tlsrv);
    return rc;
  }
  if (o->tls) rpc__tls_refused_hook(tls_refused, (void *)o);
  grpc_server_start(st.srv);
  for (int i = 0; i < threads; i++) {
    for (int m = 0; m < RPC_N_METHODS; m++) post_request(&st.w[i], m);
    post_request(&st.w[i], -1);
    xs_post(&st.w[i]);
  }
  for (int i = 0; i < threads; i++) pthread_create(&st.w[i].th, NULL, worker_main, &st.w[i]);
  if (on_listening) on_listening(port, ctx);

  while (!*o->stop) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (o->reload && *o->reload) {
      *o->reload = 0;
      tls_reload(tlsrv, o);
    }
  }
  /* Stop accepting; let in-flight calls finish within the grace period. */
  static int shut_tag;
  grpc_server_shutdown_and_notify(st.srv, shut_cq, &shut_tag);
  rpc_service_stop_parking(svc); /* parked Lookups are answered UNAVAILABLE */
  pthread_mutex_lock(&st.mu); /* idle streams end now, the others once answered (xs_read) */
  st.stopping = 1;
  for (xstream *x = st.xs; x; x = x->next)
    if (x->idle) grpc_call_cancel(x->call, NULL);
  pthread_mutex_unlock(&st.mu);
  double grace = o->shutdown_grace_s > 0 ? o->shutdown_grace_s : 5;
  grpc_event ev = grpc_completion_queue_next(shut_cq, rpc__deadline(grace), NULL);
  if (ev.type == GRPC_QUEUE_TIMEOUT) {
    fprintf(stderr, "server: calls still running after the %g s grace period: cancelled\n",
            grace);
    grpc_server_cancel_all_calls(st.srv);
    ev = grpc_completion_queue_next(shut_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  }
  st.server_down = 1;
  for (int i = 0; i < threads; i++) pthread_join(st.w[i].th, NULL);
  grpc_server_destroy(st.srv);
  if (o->tls) rpc__tls_refused_hook(NULL, NULL);
  grpc_completion_queue_shutdown(shut_cq);
  while (grpc_completion_queue_next(shut_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  for (int i = 0; i < threads; i++) grpc_completion_queue_destroy(st.w[i].cq);
  grpc_completion_queue_destroy(shut_cq);
  free(st.w);
  pthread_mutex_destroy(&st.mu);
  rc = rpc_service_flush(svc);
  if (rc) sr_fmt(err, errlen, "server: flush on shutdown failed: %s", sr_strerror(rc));
  rpc_global_shutdown();
  rpc__tls_server_destroy(tlsrv);
  return rc;
}
