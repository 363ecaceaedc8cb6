#include "common/sha256.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/status.h"

int sr_sha256_init(sr_sha256_ctx *h) {
  h->failed = 0;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  h->md = md;
  if (!md) return SR_ENOMEM;
  if (!EVP_DigestInit_ex(md, EVP_sha256(), NULL)) {
    EVP_MD_CTX_free(md);
    h->md = NULL;
    return SR_EBACKEND;
  }
  return 0;
}

int sr_sha256_update(sr_sha256_ctx *h, const void *data, size_t n) {
  if (!h->md || h->failed) return SR_EBACKEND;
  if (n && !EVP_DigestUpdate((EVP_MD_CTX *)h->md, data, n)) h->failed = 1;
  return h->failed ? SR_EBACKEND : 0;
}

int sr_sha256_final(sr_sha256_ctx *h, unsigned char out[SR_SHA256_LEN]) {
  if (!h->md) return SR_EBACKEND;
  unsigned int len = 0;
  int ok = !h->failed && EVP_DigestFinal_ex((EVP_MD_CTX *)h->md, out, &len) && len == SR_SHA256_LEN;
  sr_sha256_abort(h);
  return ok ? 0 : SR_EBACKEND;
}

void sr_sha256_abort(sr_sha256_ctx *h) {
  if (!h) return;
  EVP_MD_CTX_free((EVP_MD_CTX *)h->md);
  h->md = NULL;
}

int sr_sha256(const void *data, size_t n, unsigned char out[SR_SHA256_LEN]) {
  sr_sha256_ctx h;
  int rc = sr_sha256_init(&h);
  if (rc) return rc;
  if ((rc = sr_sha256_update(&h, data, n))) {
    sr_sha256_abort(&h);
    return rc;
  }
  return sr_sha256_final(&h, out);
}

void sr_sha256_to_hex(const unsigned char d[SR_SHA256_LEN], char hex[SR_SHA256_HEX]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < SR_SHA256_LEN; i++) {
    hex[2 * i] = digits[d[i] >> 4];
    hex[2 * i + 1] = digits[d[i] & 15];
  }
  hex[2 * SR_SHA256_LEN] = '\0';
}

int sr_sha256_hex(const void *data, size_t n, char hex[SR_SHA256_HEX]) {
  unsigned char d[SR_SHA256_LEN];
  int rc = sr_sha256(data, n, d);
  if (!rc) sr_sha256_to_hex(d, hex);
  return rc;
}

int sr_sha256_file(const char *path, char hex[SR_SHA256_HEX], uint64_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return SR_EIO;
  enum { CHUNK = 1 << 20 };
  unsigned char *buf = malloc(CHUNK);
  sr_sha256_ctx h = {0};
  int rc = buf ? sr_sha256_init(&h) : SR_ENOMEM;
  uint64_t total = 0;
  size_t got;
  while (!rc && (got = fread(buf, 1, CHUNK, f)) > 0) {
    rc = sr_sha256_update(&h, buf, got);
    total += got;
  }
  if (!rc && ferror(f)) rc = SR_EIO;
  unsigned char d[SR_SHA256_LEN];
  if (!rc) {
    rc = sr_sha256_final(&h, d);
    if (!rc) {
      sr_sha256_to_hex(d, hex);
      if (size) *size = total;
    }
  }
  sr_sha256_abort(&h);
  free(buf);
  fclose(f);
  return rc;
}
