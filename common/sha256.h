/* SHA-256, the one copy every module uses (checkpoint manifests, plan
 * fingerprints, table files, the dense model file): incremental, one buffer
 * to raw bytes or hex, and a file streamed to hex with its size. Built on
 * OpenSSL's EVP interface, every call of which is checked: a libcrypto
 * failure is SR_EBACKEND, never a digest of garbage. */
#ifndef SHARDREC_COMMON_SHA256_H
#define SHARDREC_COMMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SR_SHA256_LEN 32 /* raw digest bytes */
#define SR_SHA256_HEX 65 /* lowercase hex digits and the NUL */

/* An incremental digest: sr_sha256_init, any number of sr_sha256_update,
 * then sr_sha256_final (which frees what init allocated, success or not). */
typedef struct sr_sha256_ctx {
  void *md; /* EVP_MD_CTX, owned; NULL outside init..final */
  int failed; /* an update failed: final returns SR_EBACKEND */
} sr_sha256_ctx;

/* Start a digest in *h. Returns 0, or SR_ENOMEM / SR_EBACKEND (nothing to
 * free then). */
int sr_sha256_init(sr_sha256_ctx *h);
/* Add data[n] (borrowed). Returns 0 or SR_EBACKEND; after a failure later
 * updates do nothing and final reports it. */
int sr_sha256_update(sr_sha256_ctx *h, const void *data, size_t n);
/* Finish into out[SR_SHA256_LEN] and free the context. Returns 0, or
 * SR_EBACKEND when this or an earlier update failed (out unspecified). */
int sr_sha256_final(sr_sha256_ctx *h, unsigned char out[SR_SHA256_LEN]);
/* Free the context without a digest (an error path); NULL-safe. */
void sr_sha256_abort(sr_sha256_ctx *h);

/* SHA-256 of data[n] as raw bytes / as lowercase hex. 0 or SR_ENOMEM /
 * SR_EBACKEND. */
int sr_sha256(const void *data, size_t n, unsigned char out[SR_SHA256_LEN]);
int sr_sha256_hex(const void *data, size_t n, char hex[SR_SHA256_HEX]);

/* Lowercase hex of a raw digest. */
void sr_sha256_to_hex(const unsigned char d[SR_SHA256_LEN], char hex[SR_SHA256_HEX]);

/* SHA-256 of the file at path (streamed in 1 MiB reads) as hex, and its size
 * in *size (may be NULL). 0, SR_EIO (cannot open or read), SR_ENOMEM or
 * SR_EBACKEND. */
int sr_sha256_file(const char *path, char hex[SR_SHA256_HEX], uint64_t *size);

#endif
