/* Small system helpers every module uses: a monotonic clock and deadlines, CPU time, thread
 * names, the median of a few timings, huge-page advice for big row blocks,
 * and whether the CPU runs AVX2. */
#ifndef SHARDREC_COMMON_SYS_H
#define SHARDREC_COMMON_SYS_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Seconds on the monotonic clock. */
double sr_now(void);

/* The time s seconds from now on clock (CLOCK_REALTIME, CLOCK_MONOTONIC):
 * a deadline for pthread_cond_timedwait on a condition of that clock. */
struct timespec sr_deadline(clockid_t clock, double s);

/* CPU time in nanoseconds: of the calling thread (sr_thread_cpu_ns), of the
 * whole process, every thread together (sr_process_cpu_ns). For figures of
 * work done, not for deadlines; each is a system call (about 0.1-1 us). */
uint64_t sr_thread_cpu_ns(void);
uint64_t sr_process_cpu_ns(void);

/* CPU time in nanoseconds of this process's threads whose name begins with
 * prefix (as the kernel keeps it, 15 characters at most: "rocksdb:" names
 * RocksDB's flush and compaction threads), those alive now, read from
 * /proc/self/task (each thread's schedstat run time, or its stat clock
 * ticks where schedstat is missing); 0 where /proc cannot be read. */
uint64_t sr_named_threads_cpu_ns(const char *prefix);

/* Name the calling thread (15 characters kept) as top -H, perf and
 * sr_named_threads_cpu_ns see it: shardrec's own are "sr:dense" (the dense
 * worker pool), "sr:store-io" (the shard store's I/O workers) and
 * "sr:read-ahead" (a binary data file's next batch). */
void sr_thread_name(const char *name);

/* Median of v[n] (n >= 1); sorts v in place. Even n: the mean of the two
 * middle values. */
double sr_median(double *v, int n);

/* Ask for transparent huge pages on the 2 MiB-aligned part of a block of
 * bytes at p: random row access over hundreds of MB is TLB-bound with 4 KiB
 * pages (about 4x fewer rows/s measured on our VMs), and first touch costs one
 * fault per 2 MiB instead of per 4 KiB. Advice only: failure changes nothing;
 * blocks under 4 MiB are left alone. */
void sr_advise_huge(void *p, size_t bytes);

/* 1 when this CPU (and its OS) runs AVX2 code, else 0 (always 0 off x86);
 * asked once, then remembered. For kernels that pick an AVX2 path at run
 * time. */
int sr_cpu_avx2(void);

#endif
