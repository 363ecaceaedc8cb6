#include "common/sys.h"

#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>

double sr_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t cpu_ns(clockid_t c) {
  struct timespec t;
  if (clock_gettime(c, &t)) return 0;
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

uint64_t sr_thread_cpu_ns(void) { return cpu_ns(CLOCK_THREAD_CPUTIME_ID); }
uint64_t sr_process_cpu_ns(void) { return cpu_ns(CLOCK_PROCESS_CPUTIME_ID); }

double sr_median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
      double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void sr_advise_huge(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = (uintptr_t)2 << 20;
  if (bytes < 2 * huge) return;
  uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + bytes) & ~(huge - 1);
  if (e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

int sr_cpu_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
  static atomic_int avail = -1; /* asked once, from any thread */
  int a = atomic_load_explicit(&avail, memory_order_relaxed);
  if (a < 0)
    atomic_store_explicit(&avail, a = __builtin_cpu_supports("avx2") ? 1 : 0, memory_order_relaxed);
  return a;
#else
  return 0;
#endif
}
