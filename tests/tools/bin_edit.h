/* Editing a shardrec binary record file (datasets/binfmt.h) as an editor
 * that knows the format would: bytes changed in place, then the data and
 * header CRC32s recomputed, so that the reader's checks of the contents are
 * what sees the change. For tests that link zlib (LIBS PkgConfig::ZLIB). */
#ifndef SHARDREC_TESTS_TOOLS_BIN_EDIT_H
#define SHARDREC_TESTS_TOOLS_BIN_EDIT_H

#include <stdint.h>
#include <zlib.h>

#include "datasets/binfmt.h"
#include "tests/support/proc.h"

/* Put the 4 bytes v at offsets at, at + stride, ... (count of them) of the
 * bin file path and recompute its data and header CRC32s. */
static inline void edit_bin_each(const char *path, uint64_t at, uint64_t stride, uint64_t count,
                                 const void *v) {
  size_t size;
  unsigned char *b = (unsigned char *)slurp_file(path, &size, 1);
  for (uint64_t i = 0; i < count; i++) {
    ck_assert(at + i * stride + 4 <= (uint64_t)size);
    memcpy(b + at + i * stride, v, 4);
  }
  uint64_t doff, dbytes;
  memcpy(&doff, b + 88, 8);
  memcpy(&dbytes, b + 96, 8);
  uint32_t c = (uint32_t)crc32(0, b + doff, (uInt)dbytes);
  memcpy(b + 108, &c, 4);
  c = (uint32_t)crc32(0, b, DS_BIN_HEADER_SIZE - 4);
  memcpy(b + DS_BIN_HEADER_SIZE - 4, &c, 4);
  FILE *fp = fopen(path, "wb");
  ck_assert_uint_eq(fwrite(b, 1, size, fp), size);
  fclose(fp);
  free(b);
}

/* Put 4 bytes at offset at of the bin file path and recompute its data and
 * header CRC32s. */
static inline void edit_bin(const char *path, uint64_t at, const void *v) {
  edit_bin_each(path, at, 0, 1, v);
}

/* The data section's offset of the bin file path (header bytes 88..95). */
static inline uint64_t bin_data_off(const char *path) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  unsigned char h[96];
  ck_assert_int_eq((int)fread(h, 1, sizeof h, f), (int)sizeof h);
  fclose(f);
  uint64_t doff;
  memcpy(&doff, h + 88, 8);
  return doff;
}

#endif
