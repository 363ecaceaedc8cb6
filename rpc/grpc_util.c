/* Byte buffers, deadlines and TLS credentials for the server and client,
 * and the process-wide set-up both call (rpc/client.h). */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include <grpc/support/log.h>

#include "common/status.h"
#include "rpc/client.h"
#include "rpc/grpc_impl.h"
#include "rpc/service.h"

int rpc__bb_read(grpc_byte_buffer *bb, uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  if (!bb) {
    *out = malloc(1);
    return *out ? 0 : -1;
  }
  grpc_byte_buffer_reader rd;
  if (!grpc_byte_buffer_reader_init(&rd, bb)) return -1;
  /* The slices copied once, straight into the array (readall would copy
   * them into a slice of its own first). */
  size_t n = grpc_byte_buffer_length(rd.buffer_out);
  uint8_t *p = malloc(n ? n : 1);
  size_t at = 0;
  grpc_slice sl;
  while (p && grpc_byte_buffer_reader_next(&rd, &sl)) {
    size_t k = GRPC_SLICE_LENGTH(sl);
    if (at + k > n) { /* cannot happen: the length is the slices' sum */
      grpc_slice_unref(sl);
      free(p);
      p = NULL;
      break;
    }
    memcpy(p + at, GRPC_SLICE_START_PTR(sl), k);
    at += k;
    grpc_slice_unref(sl);
  }
  grpc_byte_buffer_reader_destroy(&rd);
  if (!p) return -1;
  *out = p;
  *len = at;
  return 0;
}

int rpc__bb_view(grpc_byte_buffer *bb, grpc_slice *sl) {
  *sl = grpc_empty_slice();
  if (!bb) return 0;
  if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
      bb->data.raw.slice_buffer.count <= 1) { /* in place: no copy */
    if (bb->data.raw.slice_buffer.count) *sl = grpc_slice_ref(bb->data.raw.slice_buffer.slices[0]);
    return 0;
  }
  grpc_byte_buffer_reader rd;
  if (!grpc_byte_buffer_reader_init(&rd, bb)) return -1;
  *sl = grpc_byte_buffer_reader_readall(&rd); /* one copy of several slices */
  grpc_byte_buffer_reader_destroy(&rd);
  return 0;
}

void rpc__int_args(grpc_arg *a, const char *const *keys, const int *vals, int n) {
  for (int i = 0; i < n; i++) {
    a[i].type = GRPC_ARG_INTEGER;
    a[i].key = (char *)keys[i];
    a[i].value.integer = vals[i];
  }
}

grpc_byte_buffer *rpc__bb_take(uint8_t *data, size_t len) {
  if (!data) return rpc__bb_make(NULL, 0);
  grpc_slice sl = grpc_slice_new(data, len, free);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

/* The two base slices' shared hold on a pinned answer. */
typedef struct {
  atomic_int refs;
  rpc_pinned *a;
} pinned_hold;

static void pinned_unref(void *p) {
  pinned_hold *h = p;
  if (atomic_fetch_sub(&h->refs, 1) != 1) return;
  rpc_pinned_release(h->a);
  free(h);
}

grpc_byte_buffer *rpc__bb_pinned(rpc_pinned *a) {
  size_t n, head_len;
  const uint8_t *head;
  const rpc_piece *pc = rpc_pinned_pieces(a, &n, &head, &head_len);
  const uint8_t *lo = NULL, *hi = NULL; /* the rows' span */
  for (size_t i = 0; i < n; i++)
    if (!pc[i].in_head) {
      if (!lo || pc[i].p < lo) lo = pc[i].p;
      if (!hi || pc[i].p + pc[i].n > hi) hi = pc[i].p + pc[i].n;
    }
  pinned_hold *h = malloc(sizeof *h);
  grpc_byte_buffer *bb = h ? grpc_raw_byte_buffer_create(NULL, 0) : NULL;
  if (!bb) {
    free(h);
    rpc_pinned_release(a);
    return NULL;
  }
  atomic_init(&h->refs, lo ? 2 : 1);
  h->a = a;
  /* Base slices over the head and the rows' span (never sent themselves):
   * every piece is a sub-slice holding one reference to its base. */
  grpc_slice bh = grpc_slice_new_with_user_data((void *)head, head_len, pinned_unref, h);
  grpc_slice br = lo ? grpc_slice_new_with_user_data((void *)lo, (size_t)(hi - lo), pinned_unref, h)
                     : grpc_empty_slice();
  grpc_slice_buffer *sb = &bb->data.raw.slice_buffer;
  for (size_t i = 0; i < n; i++) {
    const grpc_slice *base = pc[i].in_head ? &bh : &br;
    size_t at = (size_t)(pc[i].p - GRPC_SLICE_START_PTR(*base));
    grpc_slice_buffer_add(sb, grpc_slice_sub(*base, at, at + pc[i].n));
  }
  grpc_slice_unref(bh);
  grpc_slice_unref(br);
  return bb;
}

grpc_byte_buffer *rpc__bb_make(const uint8_t *data, size_t len) {
  grpc_slice sl = grpc_slice_malloc(len);
  if (len) memcpy(GRPC_SLICE_START_PTR(sl), data, len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

gpr_timespec rpc__deadline(double seconds) {
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_micros((int64_t)(seconds * 1e6), GPR_TIMESPAN));
}

static char *read_pem(const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    sr_fmt(err, errlen, "%s: cannot open", path);
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 && n < (1 << 20) ? malloc((size_t)n + 1) : NULL;
  if (!s) {
    fclose(f);
    sr_fmt(err, errlen, "%s: not a PEM file of a sensible size", path);
    return NULL;
  }
  size_t got = fread(s, 1, (size_t)n, f);
  fclose(f);
  s[got] = 0;
  return s;
}

/* The PEM file path opened, or NULL with "FLAG FILE: cannot open: why". */
static BIO *pem_open(const char *flag, const char *path, char *err, size_t errlen) {
  BIO *b = BIO_new_file(path, "r");
  if (!b) sr_fmt(err, errlen, "%s %s: cannot open: %s", flag, path, strerror(errno ? errno : EIO));
  return b;
}

/* The first certificate of path, or NULL with the reason in err. */
static X509 *pem_cert(const char *flag, const char *path, char *err, size_t errlen) {
  BIO *b = pem_open(flag, path, err, errlen);
  X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
  if (b && !x)
    sr_fmt(err, errlen, "%s %s: not a PEM certificate (no readable BEGIN CERTIFICATE block)", flag,
           path);
  BIO_free(b);
  ERR_clear_error();
  return x;
}

/* A warning for a certificate past or near its end (within 7 days). */
static void cert_expiry(const char *flag, const char *path, X509 *x, char *warn, size_t warnlen) {
  const ASN1_TIME *end = X509_get0_notAfter(x);
  time_t soon = time(NULL) + 7 * 86400;
  char when[64] = "?";
  BIO *m = BIO_new(BIO_s_mem());
  if (m && ASN1_TIME_print(m, end) > 0) {
    int n = BIO_read(m, when, (int)sizeof when - 1);
    when[n > 0 ? n : 0] = 0;
  }
  BIO_free(m);
  if (X509_cmp_current_time(end) < 0)
    sr_fmt(warn, warnlen, "%s %s: the certificate expired on %s", flag, path, when);
  else if (X509_cmp_time(end, &soon) < 0)
    sr_fmt(warn, warnlen, "%s %s: the certificate expires within 7 days, on %s", flag, path, when);
}

int rpc__tls_check(const rpc_tls *tls, int server, char *err, size_t errlen, char *warn,
                   size_t warnlen) {
  const char *fc = "--tls-cert", *fk = "--tls-key", *fa = server ? "--tls-client-ca" : "--tls-ca";
  if (warn && warnlen) warn[0] = 0;
  int rc = 0;
  X509 *ca = tls->ca ? pem_cert(fa, tls->ca, err, errlen) : NULL, *x = NULL;
  EVP_PKEY *k = NULL;
  if (tls->ca && !ca) rc = SR_EINVAL;
  if (!rc && tls->cert && !(x = pem_cert(fc, tls->cert, err, errlen))) rc = SR_EINVAL;
  if (!rc && tls->key) {
    BIO *b = pem_open(fk, tls->key, err, errlen);
    k = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    if (b && !k) sr_fmt(err, errlen, "%s %s: not a PEM private key (or one with a passphrase)", fk, tls->key);
    BIO_free(b);
    if (!k) rc = SR_EINVAL;
  }
  if (!rc && x && k && X509_check_private_key(x, k) != 1) {
    sr_fmt(err, errlen, "%s %s does not match the certificate %s %s (another key pair)", fk,
           tls->key, fc, tls->cert);
    rc = SR_EINVAL;
  }
  if (!rc && x && warn) cert_expiry(fc, tls->cert, x, warn, warnlen);
  ERR_clear_error();
  X509_free(ca);
  X509_free(x);
  EVP_PKEY_free(k);
  return rc;
}

struct rpc__tls_server {
  rpc_tls files;   /* borrowed paths */
  pthread_mutex_t mu;
  grpc_ssl_server_certificate_config *next; /* handed to gRPC at its next handshake */
};

/* The files of tls read into a gRPC certificate config, or NULL with the
 * reason in err (rpc__tls_check said they are good). */
static grpc_ssl_server_certificate_config *tls_config(const rpc_tls *tls, char *err, size_t errlen) {
  char *cert = read_pem(tls->cert, err, errlen), *key = cert ? read_pem(tls->key, err, errlen) : NULL;
  char *ca = key && tls->ca ? read_pem(tls->ca, err, errlen) : NULL;
  grpc_ssl_server_certificate_config *c = NULL;
  if (cert && key && (!tls->ca || ca)) {
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    /* gRPC 1.51 asserts that a fetched config has root certificates even
     * when no client certificate is requested (server-only TLS): then they
     * are never used, and the server's own certificate stands in. */
    c = grpc_ssl_server_certificate_config_create(ca ? ca : cert, &pair, 1);
    if (!c) sr_fmt(err, errlen, "TLS: gRPC refused the certificate or key");
  }
  free(cert);
  free(key);
  free(ca);
  return c;
}

/* gRPC's fetcher, asked at each handshake: a reloaded config once, then
 * unchanged. */
static grpc_ssl_certificate_config_reload_status tls_fetch(void *ctx,
                                                           grpc_ssl_server_certificate_config **c) {
  rpc__tls_server *t = ctx;
  pthread_mutex_lock(&t->mu);
  grpc_ssl_server_certificate_config *next = t->next;
  t->next = NULL;
  pthread_mutex_unlock(&t->mu);
  if (!next) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  *c = next; /* gRPC owns it now */
  return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

int rpc__tls_server_reload(rpc__tls_server *t, char *err, size_t errlen, char *warn,
                           size_t warnlen) {
  int rc = rpc__tls_check(&t->files, 1, err, errlen, warn, warnlen);
  grpc_ssl_server_certificate_config *c = rc ? NULL : tls_config(&t->files, err, errlen);
  if (!c) return rc ? rc : SR_EINVAL;
  pthread_mutex_lock(&t->mu);
  if (t->next) grpc_ssl_server_certificate_config_destroy(t->next);
  t->next = c;
  pthread_mutex_unlock(&t->mu);
  return 0;
}

rpc__tls_server *rpc__tls_server_create(const rpc_tls *tls, char *err, size_t errlen, char *warn,
                                        size_t warnlen) {
  if (!tls->cert || !tls->key) {
    sr_fmt(err, errlen, "TLS: a server needs --tls-cert and --tls-key");
    return NULL;
  }
  rpc__tls_server *t = calloc(1, sizeof *t);
  if (!t) {
    sr_fmt(err, errlen, "TLS: out of memory");
    return NULL;
  }
  t->files = *tls;
  pthread_mutex_init(&t->mu, NULL);
  if (rpc__tls_server_reload(t, err, errlen, warn, warnlen)) {
    rpc__tls_server_destroy(t);
    return NULL;
  }
  return t;
}

grpc_server_credentials *rpc__tls_server_creds(rpc__tls_server *t) {
  grpc_ssl_server_credentials_options *o =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          t->files.ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                      : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
          tls_fetch, t);
  return o ? grpc_ssl_server_credentials_create_with_options(o) : NULL;
}

void rpc__tls_server_destroy(rpc__tls_server *t) {
  if (!t) return;
  if (t->next) grpc_ssl_server_certificate_config_destroy(t->next);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

grpc_channel_credentials *rpc__channel_creds(const rpc_tls *tls, char *err, size_t errlen) {
  if (!tls->ca) {
    sr_fmt(err, errlen, "TLS: a client needs --tls-ca");
    return NULL;
  }
  if (!!tls->cert != !!tls->key) {
    sr_fmt(err, errlen, "TLS: give both --tls-cert and --tls-key, or neither");
    return NULL;
  }
  if (rpc__tls_check(tls, 0, err, errlen, NULL, 0)) return NULL;
  char *ca = read_pem(tls->ca, err, errlen);
  char *cert = ca && tls->cert ? read_pem(tls->cert, err, errlen) : NULL;
  char *key = cert ? read_pem(tls->key, err, errlen) : NULL;
  grpc_channel_credentials *c = NULL;
  if (ca && (!tls->cert || (cert && key))) {
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    c = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    if (!c) sr_fmt(err, errlen, "TLS: gRPC refused the certificates");
  }
  free(cert);
  free(key);
  free(ca);
  return c;
}

/* ---- gRPC's log lines ---- */

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static rpc__tls_refused_fn g_refused; /* under g_log_mu */
static void *g_refused_ctx;

void rpc__tls_refused_hook(rpc__tls_refused_fn fn, void *ctx) {
  pthread_mutex_lock(&g_log_mu);
  g_refused = fn;
  g_refused_ctx = ctx;
  pthread_mutex_unlock(&g_log_mu);
}

const char *rpc__tls_refusal_reason(const char *detail) {
  static const struct {
    const char *key, *reason;
  } known[] = {
      {"peer did not return a certificate", "no client certificate"},
      {"certificate verify failed",
       "the client's certificate is not signed by the client CA (or has expired)"},
      {"wrong version number", "not TLS: a plaintext client"},
      {"http request", "not TLS: a plaintext client"},
      {"packet length too long", "not TLS: a plaintext client"},
      {"unknown protocol", "not TLS: a plaintext client"},
  };
  for (size_t i = 0; detail && i < sizeof known / sizeof *known; i++)
    if (strstr(detail, known[i].key)) return known[i].reason;
  return "the TLS handshake failed";
}

/* gRPC's log function (gpr_set_log_function): OpenSSL's handshake failure,
 * which gRPC logs once per connection as "Handshake failed with fatal
 * error SSL_ERROR_SSL: error:...: REASON.", goes to the hook (or nowhere:
 * a client's failed call carries it in its status); every other line to
 * stderr as gRPC's own would, with the file's base name. */
static void log_line(gpr_log_func_args *a) {
  static const char key[] = "Handshake failed with fatal error ";
  const char *m = a->message ? a->message : "";
  if (!strncmp(m, key, sizeof key - 1)) {
    char detail[512];
    snprintf(detail, sizeof detail, "%s", m + sizeof key - 1);
    size_t n = strlen(detail);
    if (n && detail[n - 1] == '.') detail[n - 1] = 0;
    pthread_mutex_lock(&g_log_mu);
    if (g_refused) g_refused(g_refused_ctx, rpc__tls_refusal_reason(detail), detail);
    pthread_mutex_unlock(&g_log_mu);
    return;
  }
  const char *file = a->file ? strrchr(a->file, '/') : NULL;
  fprintf(stderr, "grpc %s %s:%d] %s\n", gpr_log_severity_string(a->severity),
          file ? file + 1 : a->file ? a->file : "?", a->line, m);
}

/* Debian's abseil is built with its debug checks on, so every absl::Mutex
 * lock in gRPC also runs deadlock detection (a graph of lock orders,
 * GraphCycles in `perf`: 2-4% of a small call's samples, client and server
 * alike). Builds of abseil for production (NDEBUG) leave it off; so does
 * this, through absl::SetMutexDeadlockDetectionMode(kIgnore) when the
 * loaded abseil has it under Debian's inline namespace. Looked up, not
 * linked: another abseil keeps its own setting. */
static void absl_deadlock_checks_off(void) {
  void (*set_mode)(int) = (void (*)(int))dlsym(
      RTLD_DEFAULT, "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE");
  if (set_mode) set_mode(0); /* OnDeadlockCycle::kIgnore */
}

/* Whether grpc_setup set GRPC_EXPERIMENTS (it was not in the environment). */
static int experiments_set;

/* gRPC 1.51's default polling engine (epoll1) has one poller for the whole
 * process: one thread at a time waits in epoll and reads every socket, then
 * hands each call to the thread whose completion queue it belongs to and
 * passes the poller's role on, both through futex wake-ups. A client and
 * the shard servers of one process (colocated, a benchmark), or a server's
 * two workers, so switch threads on every call and never poll at once.
 * The "poll" engine polls each completion queue's own sockets in the thread
 * that waits on it. Measured (bench rpc --part lookup, 4096 ids;
 * docs/DESIGN.md, "On the wire"): 4 in-process servers' Lookups at dim 128
 * from 1.0-1.6x the time of one server's to 0.66-0.94x, and a `serve` of 2
 * workers from 3 context switches a call to 1. Set before main, while the process has one thread, for gRPC
 * to read at its first grpc_init; an engine named in the environment is
 * kept. */
__attribute__((constructor)) static void grpc_setup(void) {
  setenv("GRPC_POLL_STRATEGY", "poll", 0);
  /* gRPC 1.51 reads a socket into 64 KiB slices (its tcp_read_chunks
   * experiment, on by default), whatever a connection's read sizes say;
   * off, a read takes one slice of the sizes the connection asks for
   * (rpc/grpc_impl.h: RPC_TCP_READ_CHUNK, RPC_SERVER_READ_MIN), so that a
   * request can come whole in one slice, read in place (docs/DESIGN.md,
   * "What the look-ahead hides"). Experiments named in the environment
   * are kept. */
  experiments_set = !getenv("GRPC_EXPERIMENTS");
  if (experiments_set) setenv("GRPC_EXPERIMENTS", "-tcp_read_chunks", 1);
  absl_deadlock_checks_off();
}

void rpc_keep_grpc_read_slices(void) {
  if (experiments_set) unsetenv("GRPC_EXPERIMENTS");
  experiments_set = 0;
}

/* rpc_global_keep_until_exit's wish, and whether its reference is taken. */
static int keep_wanted, keep_taken;

void rpc_global_keep_until_exit(void) { __atomic_store_n(&keep_wanted, 1, __ATOMIC_SEQ_CST); }

void rpc_global_init(void) {
  gpr_set_log_function(log_line);
  grpc_init();
  if (__atomic_load_n(&keep_wanted, __ATOMIC_SEQ_CST) &&
      !__atomic_exchange_n(&keep_taken, 1, __ATOMIC_SEQ_CST))
    grpc_init(); /* never released: the last rpc_global_shutdown leaves it */
}

void rpc_malloc_tune(void) {
#ifdef M_MMAP_THRESHOLD
  static int done;
  if (__atomic_exchange_n(&done, 1, __ATOMIC_SEQ_CST)) return;
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}
void rpc_global_shutdown(void) { grpc_shutdown(); }
