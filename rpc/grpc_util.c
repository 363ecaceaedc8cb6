/* Byte buffers, deadlines and TLS credentials for the server and client,
 * and the process-wide set-up both call (rpc/client.h). */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "rpc/client.h"
#include "rpc/grpc_util.h"

int rpc__bb_read(grpc_byte_buffer *bb, uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  if (!bb) {
    *out = malloc(1);
    return *out ? 0 : -1;
  }
  grpc_byte_buffer_reader rd;
  if (!grpc_byte_buffer_reader_init(&rd, bb)) return -1;
  grpc_slice sl = grpc_byte_buffer_reader_readall(&rd);
  grpc_byte_buffer_reader_destroy(&rd);
  size_t n = GRPC_SLICE_LENGTH(sl);
  uint8_t *p = malloc(n ? n : 1);
  if (p) memcpy(p, GRPC_SLICE_START_PTR(sl), n);
  grpc_slice_unref(sl);
  if (!p) return -1;
  *out = p;
  *len = n;
  return 0;
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

grpc_server_credentials *rpc__server_creds(const rpc_tls *tls, char *err, size_t errlen) {
  if (!tls->cert || !tls->key) {
    sr_fmt(err, errlen, "TLS: a server needs --tls-cert and --tls-key");
    return NULL;
  }
  char *cert = read_pem(tls->cert, err, errlen), *key = cert ? read_pem(tls->key, err, errlen) : NULL;
  char *ca = key && tls->ca ? read_pem(tls->ca, err, errlen) : NULL;
  grpc_server_credentials *c = NULL;
  if (cert && key && (!tls->ca || ca)) {
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    c = grpc_ssl_server_credentials_create_ex(
        ca, &pair, 1,
        ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    if (!c) sr_fmt(err, errlen, "TLS: gRPC refused the certificate or key");
  }
  free(cert);
  free(key);
  free(ca);
  return c;
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

void rpc_global_init(void) { grpc_init(); }

void rpc_malloc_tune(void) {
#ifdef M_MMAP_THRESHOLD
  static int done;
  if (__atomic_exchange_n(&done, 1, __ATOMIC_SEQ_CST)) return;
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}
void rpc_global_shutdown(void) { grpc_shutdown(); }
