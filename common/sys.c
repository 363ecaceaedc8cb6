#include "common/sys.h"

#include <dirent.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

double sr_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

struct timespec sr_deadline(clockid_t clock, double s) {
  struct timespec t;
  clock_gettime(clock, &t);
  t.tv_sec += (time_t)s;
  t.tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
  if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
  return t;
}

static uint64_t cpu_ns(clockid_t c) {
  struct timespec t;
  if (clock_gettime(c, &t)) return 0;
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

uint64_t sr_thread_cpu_ns(void) { return cpu_ns(CLOCK_THREAD_CPUTIME_ID); }
uint64_t sr_process_cpu_ns(void) { return cpu_ns(CLOCK_PROCESS_CPUTIME_ID); }

/* Run time of task tid (a name under /proc/self/task) in nanoseconds when
 * its name begins with prefix, else 0. */
static uint64_t task_cpu_ns(const char *tid, const char *prefix) {
  char p[64], buf[512];
  snprintf(p, sizeof p, "/proc/self/task/%.20s/comm", tid);
  FILE *f = fopen(p, "re");
  if (!f) return 0;
  int named = fgets(buf, sizeof buf, f) && !strncmp(buf, prefix, strlen(prefix));
  fclose(f);
  if (!named) return 0;
  unsigned long long run = 0, ut = 0, st = 0;
  snprintf(p, sizeof p, "/proc/self/task/%.20s/schedstat", tid);
  if ((f = fopen(p, "re"))) {
    int ok = fscanf(f, "%llu", &run) == 1;
    fclose(f);
    if (ok && run) return run; /* 0: maybe no scheduler statistics; ask stat */
  }
  snprintf(p, sizeof p, "/proc/self/task/%.20s/stat", tid);
  if (!(f = fopen(p, "re"))) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *q = strrchr(buf, ')'); /* the name may hold spaces: fields follow its ')' */
  if (!q || sscanf(q + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return 0;
  return (ut + st) * (1000000000ull / (unsigned long long)sysconf(_SC_CLK_TCK));
}

uint64_t sr_named_threads_cpu_ns(const char *prefix) {
  DIR *d = opendir("/proc/self/task");
  uint64_t ns = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    if (e->d_name[0] != '.') ns += task_cpu_ns(e->d_name, prefix);
  if (d) closedir(d);
  return ns;
}

void sr_thread_name(const char *name) { (void)prctl(PR_SET_NAME, name, 0, 0, 0); }

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
