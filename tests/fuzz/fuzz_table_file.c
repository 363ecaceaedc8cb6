/* libFuzzer target: the embedding table file's reader (embedding/table_file.c:
 * emb_tabfile_read), the file a checkpoint's shard holds per table.
 *
 * Input: byte 0 picks the table (bit 0 fp16 weights, file version 2; bit
 * 1 Adagrad, a state float per weight; dim 3, 50 rows either way) and the
 * file's making: bit 2 clear, the rest of the input is the file; set, the
 * harness lays out a header the table would take (its record count from
 * byte 1, wrong by one where bits 3-4 say so), the records from the rest
 * of the input, and with bit 5 the SHA-256 trailer of what it wrote (else
 * the input's next 32 bytes), so that the fuzzer reaches the records.
 *
 * Invariants: a file the reader takes has the size its header says, a
 * trailer that is the SHA-256 of the rest, and records handed over in
 * strictly ascending row id below the table's rows, as many as the header
 * counts, each with the values its bytes hold (decoded from fp16 for a
 * version 2 file); a file it refuses is named at the start of the
 * message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/bytes.h"
#include "common/half.h"
#include "common/sha256.h"
#include "embedding/optim.h"
#include "embedding/plan.h"
#include "embedding/table_file.h"

#define ROWS 50

static emb_plan *plans[4]; /* [bit 0 fp16 | bit 1 adagrad] */
static char fps[4][EMB_FP_HEX];
static char path[64];

static void remove_file(void) { unlink(path); }

static void init_once(void) {
  if (plans[0]) return;
  for (int k = 0; k < 4; k++) {
    uint64_t rows[1] = {ROWS};
    emb_plan_params pp = {.n_tables = 1, .rows = rows, .dim = 3,
                          .optim = {.kind = k & 2 ? EMB_OPT_ADAGRAD : EMB_OPT_SGD, .eps = -1},
                          .seed = 1, .n_shards = 1,
                          .precision = k & 1 ? EMB_PREC_FP16 : EMB_PREC_FP32};
    char err[256];
    if (emb_plan_create(&pp, &plans[k], err, sizeof err) ||
        emb_plan_model_fingerprint(plans[k], fps[k]))
      abort();
  }
  snprintf(path, sizeof path, "/tmp/fuzz_table_file.%d.bin", (int)getpid());
  atexit(remove_file);
}

typedef struct {
  const uint8_t *file; /* the bytes written */
  size_t rec, dim, slen;
  int fp16;
  uint64_t n, last;
  int bad; /* a record out of order or range was handed over */
} seen;

/* Each record handed over: in order, in range, with its bytes' values. */
static int check_record(void *ctx, uint64_t id, const float *vals) {
  seen *s = ctx;
  const uint8_t *r = s->file + EMB_TABFILE_HEADER + s->n * s->rec;
  const uint64_t want_id = sr_get64(r);
  /* Records out of order or range reach here before the refusal (the
   * trailer is checked first); a file taken must have none (below). */
  if (id != want_id) abort();
  float want[3 + 3];
  if (s->fp16) {
    uint16_t h[3];
    memcpy(h, r + 8, sizeof h);
    sr_f16_decode(h, want, s->dim, SR_HALF_AUTO);
    memcpy(want + s->dim, r + 8 + 2 * s->dim, 4 * s->slen);
  } else {
    memcpy(want, r + 8, 4 * (s->dim + s->slen));
  }
  if (memcmp(vals, want, (s->dim + s->slen) * sizeof(float))) abort();
  if ((s->n && id <= s->last) || id >= ROWS) s->bad = 1;
  s->last = id;
  s->n++;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  init_once();
  if (size < 2) return 0;
  const int k = data[0] & 3, layout = (data[0] >> 2) & 1, seal = (data[0] >> 5) & 1;
  const emb_table *tb = &plans[k]->tables[0];
  const size_t dim = (size_t)tb->dim, slen = (size_t)emb_optim_state_len(&tb->optim, tb->dim);
  const size_t rec = 8 + (k & 1 ? 2 : 4) * dim + 4 * slen;
  uint8_t *file;
  size_t len;
  if (!layout) {
    len = size - 2;
    file = malloc(len ? len : 1);
    if (!file) abort();
    memcpy(file, data + 2, len);
  } else {
    const uint8_t *body = data + 2;
    size_t blen = size - 2, n = data[1] % 64;
    if (n * rec > blen) n = blen / rec;
    const int skew = (data[0] >> 3) & 3; /* 1: one record more said, 2: one fewer */
    const uint64_t said = skew == 1 ? n + 1 : skew == 2 && n ? n - 1 : n;
    len = EMB_TABFILE_HEADER + n * rec + EMB_TABFILE_TRAILER;
    file = calloc(1, len);
    if (!file) abort();
    memcpy(file, "SREMBTAB", 8);
    sr_put32(file + 8, k & 1 ? EMB_TABFILE_VERSION_16 : EMB_TABFILE_VERSION);
    sr_put32(file + 12, EMB_TABFILE_HEADER);
    sr_put32(file + 16, tb->table_id);
    sr_put32(file + 20, (uint32_t)dim);
    sr_put32(file + 24, (uint32_t)slen);
    sr_put32(file + 28, (uint32_t)tb->optim.kind);
    sr_put64(file + 32, said);
    sr_put64(file + 40, rec);
    memcpy(file + 48, fps[k], 64);
    if (k & 1) sr_put32(file + 112, EMB_PREC_FP16);
    memcpy(file + EMB_TABFILE_HEADER, body, n * rec);
    uint8_t *trailer = file + EMB_TABFILE_HEADER + n * rec;
    if (seal) {
      if (sr_sha256(file, EMB_TABFILE_HEADER + n * rec, trailer)) abort();
    } else {
      const size_t left = blen - n * rec;
      memcpy(trailer, body + n * rec, left < 32 ? left : 32);
    }
  }
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(file, 1, len, f) != len || fclose(f)) abort();
  seen s = {.file = file, .rec = rec, .dim = dim, .slen = slen, .fp16 = k & 1};
  char err[1024] = "";
  const int rc = emb_tabfile_read(path, tb, fps[k], check_record, &s, err, sizeof err);
  if (rc == 0) {
    const uint64_t said = sr_get64(file + 32);
    unsigned char dig[SR_SHA256_LEN];
    if (len != EMB_TABFILE_HEADER + said * rec + EMB_TABFILE_TRAILER || s.n != said ||
        s.bad || sr_sha256(file, len - EMB_TABFILE_TRAILER, dig) ||
        memcmp(dig, file + len - EMB_TABFILE_TRAILER, SR_SHA256_LEN))
      abort();
  } else if (strncmp(err, path, strlen(path))) {
    abort(); /* a refusal names the file */
  }
  free(file);
  return 0;
}
