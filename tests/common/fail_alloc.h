/* An allocator that fails on the Nth call, for unit tests of out-of-memory
 * paths. A test program that includes this header must be linked with
 *   -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup
 * (sr_add_check_test(... WRAP_ALLOC)): every call to these in the program's
 * own code and in the static shardrec libraries it links then goes through
 * the functions below; shared libraries (libc's internals, OpenSSL, RocksDB)
 * keep the real allocator. fail_alloc_arm(n) makes the n-th allocation from
 * now on fail (n = 1: the next one), once; fail_alloc_arm(0) disarms. */
#ifndef SHARDREC_TESTS_COMMON_FAIL_ALLOC_H
#define SHARDREC_TESTS_COMMON_FAIL_ALLOC_H

#include <stddef.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);

static long fail_alloc_countdown; /* 0: off; k: the k-th allocation from now fails */
static long fail_alloc_failed;    /* allocations failed since the last arm */

static inline void fail_alloc_arm(long n) {
  fail_alloc_countdown = n;
  fail_alloc_failed = 0;
}

static inline int fail_alloc_now(void) {
  if (fail_alloc_countdown <= 0 || --fail_alloc_countdown > 0) return 0;
  fail_alloc_failed++;
  return 1;
}

void *__wrap_malloc(size_t n);
void *__wrap_malloc(size_t n) { return fail_alloc_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size) {
  return fail_alloc_now() ? NULL : __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n) { return fail_alloc_now() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s);
char *__wrap_strdup(const char *s) {
  if (fail_alloc_now()) return NULL;
  size_t n = strlen(s) + 1;
  char *d = __real_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

#endif
