#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>

const char *sr_strerror(int status) {
  if (status == 0) return "success";
  switch (status) {
#define SR__MSG(name, code, msg) \
  case code:                     \
    return msg;
    SR_ERRNO_MAP(SR__MSG)
#undef SR__MSG
  }
  return "unknown error";
}

const char *sr_errname(int status) {
  if (status == 0) return "SR_OK";
  switch (status) {
#define SR__NAME(name, code, msg) \
  case code:                      \
    return "SR_E" #name;
    SR_ERRNO_MAP(SR__NAME)
#undef SR__NAME
  }
  return "SR_EUNKNOWN";
}

void sr_fmt(char *buf, size_t len, const char *fmt, ...) {
  if (!buf || len == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, len, fmt, ap);
  va_end(ap);
}
