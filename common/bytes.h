/* Fixed-width integers at a byte address, for the binary file formats
 * (table files, removed-row lists, the binary record format, the data
 * mapping): memcpy in the host's byte order, which the build checks is
 * little-endian, so a file's fields are little-endian; no alignment asked. */
#ifndef SHARDREC_COMMON_BYTES_H
#define SHARDREC_COMMON_BYTES_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the file formats are little-endian and written as they lie: a big-endian host needs byte swaps"
#endif

static inline void sr_put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void sr_put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t sr_get32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline uint64_t sr_get64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

#endif
