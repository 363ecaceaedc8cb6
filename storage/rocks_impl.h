/* Helpers shared by the RocksDB C API wrappers of storage/ (kv.c, sst.c);
 * internal to storage/. */
#ifndef SHARDREC_STORAGE_ROCKS_IMPL_H
#define SHARDREC_STORAGE_ROCKS_IMPL_H

#include <rocksdb/c.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "storage/sst.h"

/* sst_writer_open with the table options of opts (a kv_db's: its block
 * format and bloom filters; kept by the caller until the writer is
 * destroyed); NULL: sst_writer_open's own. */
int sst__writer_open_with(const char *path, const rocksdb_options_t *opts, sst_writer **out,
                          char *err, size_t errlen);

/* After a RocksDB call that reports through char *e: on error, put its
 * message (with what and our file and line) into err, free it, set rc to
 * SR_EIO and jump to out. Needs err, errlen, rc and an out label in scope. */
#define RCHECK(e, what)                                                                  \
  do {                                                                                   \
    if (e) {                                                                             \
      sr_fmt(err, errlen, "%s: %s (%s:%d)", what, e, __FILE__, __LINE__);                \
      rocksdb_free(e);                                                                   \
      e = NULL;                                                                          \
      rc = SR_EIO;                                                                       \
      goto out;                                                                          \
    }                                                                                    \
  } while (0)

/* Row ids are keys as 8 bytes big-endian, so iteration is in ascending id. */
static inline void put_be64(char *p, uint64_t v) {
  for (int i = 7; i >= 0; i--) {
    p[i] = (char)(v & 0xff);
    v >>= 8;
  }
}
static inline uint64_t get_be64(const char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | (unsigned char)p[i];
  return v;
}

#endif
