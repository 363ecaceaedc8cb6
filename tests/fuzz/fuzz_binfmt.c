/* libFuzzer target: the binary record reader (datasets/binfmt.c) over a file
 * made from the input: open (magic, version, header fields, sizes, CRCs,
 * multi-hot offsets), every record read in batches (the value checks), the
 * stored dictionaries loaded. The first input byte steers the harness:
 *   bit 0  int32 layout (the input is the file, no header)
 *   bit 1  the input is the file as it is (nothing fixed)
 *   else   the harness lays the header out from the input's fields (counts
 *          cut to a few samples, ids and dictionary values), fills the
 *          sections with the rest of the input and recomputes the three
 *          CRC32s, so that the fuzzer gets past the checksums to the records
 * The file is a memfd, read through /proc/self/fd/N as a path. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "common/bytes.h"
#include "datasets/batch.h"
#include "datasets/binfmt.h"
#include "datasets/criteo.h"

#define H_FLAGS 12
#define H_N 24
#define H_IDS 56
#define H_DICT_OFF 72
#define H_DATA_OFF 88
#define H_TABLES 112
#define H_DICTN (H_TABLES + 8 * DS_NUM_SPARSE)


/* A consistent header from the input's fields into h; the file's size. */
static uint64_t lay_out(unsigned char *h) {
  memcpy(h, DS_BIN_MAGIC, 8);
  sr_put32(h + 8, DS_BIN_VERSION);
  uint32_t flags = h[H_FLAGS] & (DS_BIN_MULTI | DS_BIN_ID64);
  sr_put32(h + H_FLAGS, flags);
  uint64_t n = sr_get64(h + H_N) % 40, tr = sr_get64(h + 32) % (n + 1), te = sr_get64(h + 40) % (n - tr + 1);
  sr_put64(h + H_N, n);
  sr_put64(h + 32, tr);
  sr_put64(h + 40, te);
  sr_put64(h + 48, n - tr - te);
  uint64_t ids = (flags & DS_BIN_MULTI) ? sr_get64(h + H_IDS) % 512 : 0, db = 0;
  sr_put64(h + H_IDS, ids);
  for (int c = 0; c < DS_NUM_SPARSE; c++) {
    uint64_t dn = sr_get64(h + H_DICTN + 8 * c) % 6;
    sr_put64(h + H_DICTN + 8 * c, dn);
    db += 4 * dn;
  }
  uint64_t w = (flags & DS_BIN_ID64) ? 8 : 4;
  uint64_t data_off = (DS_BIN_HEADER_SIZE + db + 63) & ~(uint64_t)63;
  uint64_t data_bytes = (flags & DS_BIN_MULTI) ? n * 56 + (n * DS_NUM_SPARSE + 1) * 8 + ids * w
                                               : n * (56 + DS_NUM_SPARSE * w);
  sr_put64(h + H_DICT_OFF, DS_BIN_HEADER_SIZE);
  sr_put64(h + 80, db);
  sr_put64(h + H_DATA_OFF, data_off);
  sr_put64(h + 96, data_bytes);
  return data_off + data_bytes;
}

static void put_crcs(unsigned char *f) {
  uint64_t xo = sr_get64(f + H_DICT_OFF), xb = sr_get64(f + 80);
  uint64_t doff = sr_get64(f + H_DATA_OFF), dbytes = sr_get64(f + 96);
  sr_put32(f + 104, (uint32_t)crc32(0, f + xo, (uInt)xb));
  sr_put32(f + 108, (uint32_t)crc32(0, f + doff, (uInt)dbytes));
  sr_put32(f + DS_BIN_HEADER_SIZE - 4, (uint32_t)crc32(0, f, DS_BIN_HEADER_SIZE - 4));
}

/* Open, read every record, load the dictionaries; the invariants of what
 * a reader hands out. */
static void read_file(const char *path, int int32) {
  char err[512];
  ds_bin_reader *r = ds_bin_reader_open(path, int32, 1, err, sizeof err);
  if (!r) {
    if (!err[0]) abort();
    return;
  }
  const ds_bin_info *in = ds_bin_reader_info(r);
  ds_batch b;
  if (ds_batch_init(&b, 16)) abort();
  for (uint64_t i = 0; i < in->n_samples; i += 16) {
    int n = in->n_samples - i < 16 ? (int)(in->n_samples - i) : 16;
    if (ds_bin_reader_read(r, i, n, int32 ? 7 : 0, &b) != 0) {
      if (!ds_bin_reader_errmsg(r)[0]) abort();
      break;
    }
    for (int k = 0; k < n; k++)
      if (b.labels[k] != 0.0f && b.labels[k] != 1.0f) abort(); /* the checks let none by */
  }
  ds_batch_free(&b);
  ds_criteo_dict_destroy(ds_bin_reader_dict(r));
  uint64_t sizes[DS_NUM_SPARSE];
  ds_bin_reader_id_range(r, sizes);
  ds_bin_reader_destroy(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0];
  data++;
  size--;
  unsigned char *f;
  uint64_t fsize;
  if (mode & 3) {
    fsize = size;
    f = malloc(size ? size : 1);
    if (!f) return 0;
    if (size) memcpy(f, data, size);
  } else {
    unsigned char h[DS_BIN_HEADER_SIZE] = {0};
    size_t hn = size < 1024 ? size : 1024; /* the fields live in the first 1 KiB */
    memcpy(h, data, hn);
    fsize = lay_out(h);
    f = calloc(1, fsize);
    if (!f) return 0;
    memcpy(f, h, sizeof h);
    size_t rest = size - hn, room = (size_t)(fsize - DS_BIN_HEADER_SIZE);
    memcpy(f + DS_BIN_HEADER_SIZE, data + hn, rest < room ? rest : room);
    put_crcs(f);
  }
  int fd = memfd_create("fuzz_binfmt", 0);
  if (fd < 0) abort();
  if (fsize && write(fd, f, fsize) != (ssize_t)fsize) abort();
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  read_file(path, mode & 1);
  close(fd);
  free(f);
  return 0;
}
