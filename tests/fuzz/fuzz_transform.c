/* libFuzzer target: the data transform's parser (datasets/transform.c) over
 * the input. The first input byte steers the harness:
 *   bit 0  the input (after that byte) is the file as it is
 *   else   the harness lays a header out from the input's next bytes (id
 *          mode, max_ind_range, threshold, small per-column counts) and
 *          fills the values with the rest, so that the fuzzer gets past the
 *          header to the dictionaries
 * A transform the parser takes must be canonical: its fingerprint is the
 * SHA-256 of the bytes it was read from, it is the same as itself, and its
 * lookups give ids within its tables. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/sha256.h"
#include "common/status.h"
#include "datasets/transform.h"


/* A header from the input's fields, the rest as values. */
static unsigned char *lay_out(const uint8_t *in, size_t n, size_t *len) {
  uint8_t f[16] = {0};
  memcpy(f, in, n < sizeof f ? n : sizeof f);
  in += n < sizeof f ? n : sizeof f;
  n -= n < sizeof f ? n : sizeof f;
  const uint32_t mode = f[0] % 3;
  uint64_t counts[DS_NUM_SPARSE] = {0}, total = 0;
  if (mode == DS_IDS_DICT)
    for (int c = 0; c < DS_NUM_SPARSE; c++) total += counts[c] = (f[1 + c % 8] >> (c % 3)) & 7;
  *len = DS_XFORM_HEADER_BYTES + 4 * total;
  unsigned char *p = calloc(1, *len);
  if (!p) return NULL;
  memcpy(p, DS_XFORM_MAGIC, 8);
  sr_put32(p + 8, DS_XFORM_VERSION);
  sr_put32(p + 12, mode);
  sr_put64(p + 16, mode == DS_IDS_HASH ? 0 : (f[9] % 2 ? (uint64_t)f[10] + 1 : 0) + (mode == 1));
  sr_put32(p + 24, mode == DS_IDS_DICT ? 1u + f[11] % 4 : 0);
  sr_put32(p + 28, DS_XFORM_UNSEEN_ID);
  sr_put32(p + 32, DS_XFORM_DENSE_LOG1P);
  sr_put32(p + 36, DS_NUM_SPARSE);
  for (int c = 0; c < DS_NUM_SPARSE; c++) sr_put64(p + 40 + 8 * c, counts[c]);
  memcpy(p + DS_XFORM_HEADER_BYTES, in, n < 4 * total ? n : 4 * total);
  return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t len = size - 1;
  unsigned char *p = (data[0] & 1) ? malloc(len ? len : 1) : lay_out(data + 1, size - 1, &len);
  if (!p) return 0;
  if (data[0] & 1) memcpy(p, data + 1, len);
  ds_transform *t = NULL;
  char err[512];
  if (ds_transform_parse(p, len, "fuzz", &t, err, sizeof err) == 0) {
    char fp[SR_SHA256_HEX], want[SR_SHA256_HEX];
    if (ds_transform_fingerprint(t, fp) || sr_sha256_hex(p, len, want) || strcmp(fp, want))
      abort(); /* the bytes it was read from are not its canonical bytes */
    if (ds_transform_compare(t, t, NULL, 0) != DS_XFORM_SAME) abort();
    uint64_t sizes[DS_NUM_SPARSE];
    ds_transform_table_sizes(t, sizes);
    for (int c = 0; c < DS_NUM_SPARSE; c++)
      for (uint32_t v = 0; v < 4; v++) {
        uint64_t id = ds_transform_map(t, c, v * 0x10u + (uint32_t)c);
        if (sizes[c] && id >= sizes[c]) abort();
      }
    char line[256];
    ds_transform_describe(t, line, sizeof line);
    ds_transform_free(t);
  }
  free(p);
  return 0;
}
