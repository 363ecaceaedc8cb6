/* The dense worker pool (see pool.h).
 *
 * A run's tasks are dealt out in contiguous ranges, one per thread: with T
 * threads, thread k (the caller is 0) owns tasks [n k / T, n (k + 1) / T).
 * Each thread runs its own range first, then takes what is left of the
 * others'. Kernels that follow each other mostly cut the batch alike (at a
 * large batch a layer's blocks of rows, then the next layer's, then the
 * interaction's blocks of samples), so the thread that wrote a block mostly
 * reads it back from its own cache.
 *
 * Each range is one 64-bit slot: generation (32 bits), end (16) and the
 * next unclaimed task (16). A thread claims a task by moving a slot on by
 * one with a compare-and-swap, so a worker still looking at an older run can
 * never claim a task of a newer one (its generation no longer matches). The
 * slots, fn and ctx are written before the run's generation is stored in
 * run, and a worker reads them only after loading that generation (acquire),
 * so it sees them whole; fn and ctx are used only by a thread whose claim
 * succeeded, which proves the run still current. */
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

typedef struct {
  _Alignas(64) _Atomic uint64_t t; /* gen << 32 | end << 16 | next */
} pool_slot;

struct dense_pool;
typedef struct {
  struct dense_pool *p;
  int self; /* the slot this worker runs first */
} pool_worker_arg;

struct dense_pool {
  int threads;
  _Atomic uint32_t run;    /* the generation of the latest run published */
  _Atomic int done;        /* tasks of the current run finished */
  _Atomic(dense_pool_fn) fn;
  _Atomic(void *) ctx;
  _Atomic uint32_t rest;   /* the generation after which workers sleep at once */
  _Atomic int sleepers;    /* workers in (or entering) the condition wait */
  _Atomic int stop;
  atomic_flag busy;        /* a run is in progress */
  uint32_t gen;            /* the current run's generation (runs are serialised by busy) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n_started;
  pthread_t tid[DENSE_POOL_MAX_THREADS];
  pool_worker_arg arg[DENSE_POOL_MAX_THREADS];
  pool_slot slot[DENSE_POOL_MAX_THREADS]; /* slot k: thread k's range */
};

static dense_pool *default_pool;

static uint32_t slot_gen(uint64_t t) { return (uint32_t)(t >> 32); }
static int slot_end(uint64_t t) { return (int)((t >> 16) & 0xffff); }
static int slot_next(uint64_t t) { return (int)(t & 0xffff); }

/* Claim and run tasks of run gen, from slot self's range first and then the
 * others' in turn, until none is left or a newer run began. */
static void pool_work(dense_pool *p, uint32_t gen, int self) {
  for (int i = 0; i < p->threads; i++) {
    int k = self + i < p->threads ? self + i : self + i - p->threads;
    _Atomic uint64_t *slot = &p->slot[k].t;
    for (;;) {
      uint64_t t = atomic_load_explicit(slot, memory_order_acquire);
      if (slot_gen(t) != gen) return; /* a newer run: this one is done */
      if (slot_next(t) >= slot_end(t)) break;
      dense_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
      void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
      if (!atomic_compare_exchange_weak_explicit(slot, &t, t + 1, memory_order_acq_rel,
                                                 memory_order_relaxed))
        continue;
      fn(ctx, slot_next(t));
      atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
  }
}

/* Wait for a run newer than seen (spin, then sleep); its generation, or 0 to
 * stop. */
static uint32_t pool_wait(dense_pool *p, uint32_t seen) {
  double t0 = sr_now();
  for (int i = 1;; i++) {
    uint32_t g = atomic_load_explicit(&p->run, memory_order_acquire);
    if (g != seen) return g;
    if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return 0;
    if (atomic_load_explicit(&p->rest, memory_order_relaxed) == seen) break;
    cpu_relax();
    if (!(i & 255) && sr_now() - t0 > POOL_SPIN_S) break;
  }
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add(&p->sleepers, 1);
  uint32_t g;
  while ((g = atomic_load(&p->run)) == seen && !atomic_load(&p->stop))
    pthread_cond_wait(&p->cv, &p->mu);
  atomic_fetch_sub(&p->sleepers, 1);
  pthread_mutex_unlock(&p->mu);
  return atomic_load(&p->stop) ? 0 : g;
}

static void *pool_worker(void *arg) {
  pool_worker_arg *a = arg;
  uint32_t seen = 0, g;
  sr_thread_name("sr:dense");
  while ((g = pool_wait(a->p, seen)) != 0) {
    seen = g;
    pool_work(a->p, g, a->self);
  }
  return NULL;
}

dense_pool *dense_pool_create(int threads, char *err, size_t errlen) {
  if (threads < 1 || threads > DENSE_POOL_MAX_THREADS) {
    sr_fmt(err, errlen, "dense threads: %d is out of range [1, %d]", threads,
           DENSE_POOL_MAX_THREADS);
    return NULL;
  }
  /* aligned as its slots are, each on a cache line of its own */
  dense_pool *p = aligned_alloc(_Alignof(dense_pool), sizeof *p);
  if (!p) {
    sr_fmt(err, errlen, "out of memory creating the dense pool");
    return NULL;
  }
  memset(p, 0, sizeof *p);
  p->threads = threads;
  atomic_flag_clear(&p->busy);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  for (int i = 0; i + 1 < threads; i++) {
    p->arg[i] = (pool_worker_arg){p, i + 1};
    int rc = pthread_create(&p->tid[i], NULL, pool_worker, &p->arg[i]);
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
  for (int k = 0; k < p->threads; k++) {
    uint64_t lo = (uint64_t)n_tasks * k / p->threads, hi = (uint64_t)n_tasks * (k + 1) / p->threads;
    atomic_store_explicit(&p->slot[k].t, (uint64_t)p->gen << 32 | hi << 16 | lo,
                          memory_order_relaxed);
  }
  atomic_store(&p->run, p->gen);
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  pool_work(p, p->gen, 0);
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

void dense_pool_rest(dense_pool *p) {
  if (p) atomic_store_explicit(&p->rest, p->gen, memory_order_relaxed);
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
