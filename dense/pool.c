/* The dense worker pool (see pool.h).
 *
 * A run is published as one 64-bit ticket: generation (32 bits), task count
 * (16) and the next unclaimed task (16). A thread claims a task by moving
 * the ticket on by one with a compare-and-swap, so a worker still looking at
 * an older run can never claim a task of a newer one (its generation no
 * longer matches), and the task count it sees is always its run's. The
 * run's fn and ctx are written before the ticket is published and used only
 * by a thread whose claim succeeded, which proves the run still current. */
#include "dense/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "common/sys.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* A worker spins this long after a run before it sleeps (the step's kernels
 * come microseconds apart); the caller spins this long on the last tasks
 * before it yields its core. */
#define POOL_SPIN_S 50e-6
#define POOL_WAIT_SPIN_S 20e-6

struct dense_pool {
  int threads;
  _Atomic uint64_t ticket; /* gen << 32 | n << 16 | next */
  _Atomic int done;        /* tasks of the current run finished */
  _Atomic(dense_pool_fn) fn;
  _Atomic(void *) ctx;
  _Atomic int sleepers;    /* workers in (or entering) the condition wait */
  _Atomic int stop;
  atomic_flag busy;        /* a run is in progress */
  uint32_t gen;            /* the current run's generation (runs are serialised by busy) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n_started;
  pthread_t tid[DENSE_POOL_MAX_THREADS];
};

static dense_pool *default_pool;

static uint32_t ticket_gen(uint64_t t) { return (uint32_t)(t >> 32); }
static int ticket_n(uint64_t t) { return (int)((t >> 16) & 0xffff); }
static int ticket_next(uint64_t t) { return (int)(t & 0xffff); }

/* Claim and run tasks of run gen until none is left or a newer run began. */
static void pool_work(dense_pool *p, uint32_t gen) {
  for (;;) {
    uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    if (ticket_gen(t) != gen || ticket_next(t) >= ticket_n(t)) return;
    dense_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
    void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
    if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                               memory_order_relaxed))
      continue;
    fn(ctx, ticket_next(t));
    atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
  }
}

/* Wait for a run newer than seen (spin, then sleep); its ticket, or 0 to stop. */
static uint64_t pool_wait(dense_pool *p, uint32_t seen) {
  double t0 = sr_now();
  for (int i = 1;; i++) {
    uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    if (ticket_gen(t) != seen) return t;
    if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return 0;
    cpu_relax();
    if (!(i & 255) && sr_now() - t0 > POOL_SPIN_S) break;
  }
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add(&p->sleepers, 1);
  uint64_t t;
  while (ticket_gen(t = atomic_load(&p->ticket)) == seen && !atomic_load(&p->stop))
    pthread_cond_wait(&p->cv, &p->mu);
  atomic_fetch_sub(&p->sleepers, 1);
  pthread_mutex_unlock(&p->mu);
  return atomic_load(&p->stop) ? 0 : t;
}

static void *pool_worker(void *arg) {
  dense_pool *p = arg;
  uint32_t seen = 0;
  uint64_t t;
  sr_thread_name("sr:dense");
  while ((t = pool_wait(p, seen)) != 0) {
    seen = ticket_gen(t);
    pool_work(p, seen);
  }
  return NULL;
}

dense_pool *dense_pool_create(int threads, char *err, size_t errlen) {
  if (threads < 1 || threads > DENSE_POOL_MAX_THREADS) {
    sr_fmt(err, errlen, "dense threads: %d is out of range [1, %d]", threads,
           DENSE_POOL_MAX_THREADS);
    return NULL;
  }
  dense_pool *p = calloc(1, sizeof *p);
  if (!p) {
    sr_fmt(err, errlen, "out of memory creating the dense pool");
    return NULL;
  }
  p->threads = threads;
  atomic_flag_clear(&p->busy);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  for (int i = 0; i + 1 < threads; i++) {
    int rc = pthread_create(&p->tid[i], NULL, pool_worker, p);
    if (rc) {
      sr_fmt(err, errlen, "dense pool: could not start worker %d of %d: %s", i + 1,
             threads - 1, strerror(rc));
      dense_pool_destroy(p);
      return NULL;
    }
    p->n_started++;
  }
  return p;
}

void dense_pool_destroy(dense_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_started; i++) pthread_join(p->tid[i], NULL);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

int dense_pool_threads(const dense_pool *p) { return p ? p->threads : 1; }

void dense_pool_run(dense_pool *p, int n_tasks, dense_pool_fn fn, void *ctx) {
  if (n_tasks < 1) return;
  if (!p || p->threads == 1 || n_tasks == 1 || n_tasks > DENSE_POOL_MAX_TASKS ||
      atomic_flag_test_and_set_explicit(&p->busy, memory_order_acquire)) {
    for (int t = 0; t < n_tasks; t++) fn(ctx, t);
    return;
  }
  atomic_store_explicit(&p->done, 0, memory_order_relaxed);
  atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
  atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
  if (++p->gen == 0) p->gen = 1; /* 0 is the workers' "none seen yet" */
  atomic_store(&p->ticket, (uint64_t)p->gen << 32 | (uint64_t)n_tasks << 16);
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  pool_work(p, p->gen);
  double t0 = 0;
  for (int i = 1; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++) {
    if (i == 256) t0 = sr_now();
    if (i > 256 && !(i & 63) && sr_now() - t0 > POOL_WAIT_SPIN_S)
      sched_yield(); /* a worker holding a task may need this core */
    else
      cpu_relax();
  }
  atomic_flag_clear_explicit(&p->busy, memory_order_release);
}

void dense_pool_set_default(dense_pool *p) { default_pool = p; }
dense_pool *dense_pool_default(void) { return default_pool; }

int dense_pool_threads_for(int local_ranks) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (local_ranks < 1) local_ranks = 1;
  long per = cores / local_ranks;
  if (per > DENSE_POOL_MAX_THREADS) per = DENSE_POOL_MAX_THREADS;
  return per < 1 ? 1 : (int)per;
}
