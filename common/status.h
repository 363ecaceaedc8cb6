/* Status codes shared by every shardrec module.
 *
 * Library functions return an int: 0 for success, one of the negative SR_E*
 * codes below for failure. One X-macro list generates the enum, the name and
 * the message (as libuv's UV_ERRNO_MAP does). */
#ifndef SHARDREC_COMMON_STATUS_H
#define SHARDREC_COMMON_STATUS_H

#include <stddef.h>

#define SR_ERRNO_MAP(X)                                                        \
  X(INVAL, -1, "invalid argument")                                             \
  X(NOMEM, -2, "out of memory")                                                \
  X(IO, -3, "input/output error")                                              \
  X(FORMAT, -4, "malformed input")                                             \
  X(VERSION, -5, "unsupported format version")                                 \
  X(CHECKSUM, -6, "checksum mismatch")                                         \
  X(NOTFOUND, -7, "not found")                                                 \
  X(EXISTS, -8, "already exists")                                              \
  X(RANGE, -9, "value out of range")                                           \
  X(MISMATCH, -10, "fingerprint or shape mismatch")                            \
  X(UNSUPPORTED, -11, "not supported")                                         \
  X(STATE, -12, "operation not valid in this state")                           \
  X(EOF, -13, "end of data")                                                   \
  X(BACKEND, -14, "error from an underlying library")                          \
  X(TIMEOUT, -15, "timed out")                                                 \
  X(UNAVAILABLE, -16, "service unavailable")

typedef enum {
  SR_OK = 0,
#define SR__ENUM(name, code, msg) SR_E##name = code,
  SR_ERRNO_MAP(SR__ENUM)
#undef SR__ENUM
} sr_status;

/* Message for a status code ("success" for 0, "unknown error" otherwise).
 * The returned string is static. */
const char *sr_strerror(int status);

/* Symbolic name of a status code ("SR_EINVAL"); static string. */
const char *sr_errname(int status);

/* Format into buf (capacity len, always NUL-terminated when len > 0), in the
 * manner of snprintf. Used by modules to record their last error text. */
void sr_fmt(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
