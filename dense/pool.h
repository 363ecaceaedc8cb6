/* The dense worker pool: the threads that own the cores during a dense step.
 *
 * A pool of N threads is the caller plus N - 1 workers. dense_pool_run
 * runs a FIXED list of tasks, fn(ctx, 0) ... fn(ctx, n_tasks - 1), spread
 * over the caller and the workers in contiguous ranges (thread k's first,
 * then what is left of the others'), and returns when every task is done.
 * Which thread runs which task varies; the tasks themselves never do: the
 * kernels that use the pool cut their work into blocks whose sizes depend on
 * the shapes only (dense/backend_cpu.c), and each task writes its own block
 * of the output with the same instructions in the same order. So the thread
 * count changes speed, never bits; N = 1 runs every task on the caller, in
 * order, with no thread at all.
 *
 * Workers spin briefly after a run (the step's kernels follow each other
 * within microseconds) and then sleep on a condition variable until the next
 * run. A run while the pool is busy (another thread's run, or a task that
 * itself calls into the pool) runs its tasks on its caller: same bits.
 *
 * The process's default pool (dense_pool_set_default) is the one the CPU
 * backend's kernels and dense_opt_step use; without one they run every task
 * on the calling thread. */
#ifndef SHARDREC_DENSE_POOL_H
#define SHARDREC_DENSE_POOL_H

#include <stddef.h>

#define DENSE_POOL_MAX_THREADS 256
#define DENSE_POOL_MAX_TASKS 65535

typedef struct dense_pool dense_pool;

/* One task of a run: fn(ctx, task) for task in [0, n_tasks). */
typedef void (*dense_pool_fn)(void *ctx, int task);

/* A pool of threads threads (1 ... DENSE_POOL_MAX_THREADS): threads - 1
 * workers are started. NULL with the reason in err on a bad count or when a
 * thread cannot be made. The caller owns the pool. */
dense_pool *dense_pool_create(int threads, char *err, size_t errlen);

/* Stop the workers and free the pool (NULL-safe). No run may be in progress. */
void dense_pool_destroy(dense_pool *p);

/* The pool's thread count, caller included (1 for NULL). */
int dense_pool_threads(const dense_pool *p);

/* The caller is about to wait on something else (the network): the workers
 * still spinning after the last run go to sleep now instead of holding
 * their cores for up to the spin time, which the processes the caller waits
 * for may need. The next run wakes them. NULL-safe; no run may be in
 * progress. */
void dense_pool_rest(dense_pool *p);

/* Run fn(ctx, t) for t in [0, n_tasks) (n_tasks <= DENSE_POOL_MAX_TASKS) and
 * return when all are done. p NULL, n_tasks 1, or a busy pool: every task
 * on the caller, in order. ctx is borrowed for the call. */
void dense_pool_run(dense_pool *p, int n_tasks, dense_pool_fn fn, void *ctx);

/* The process's default pool (borrowed; NULL: no threads). Not thread-safe:
 * set it at start-up, and back to NULL before destroying the pool. */
void dense_pool_set_default(dense_pool *p);
dense_pool *dense_pool_default(void);

/* The default thread count for a process that shares this host with
 * local_ranks - 1 others (mpirun): cores online / local_ranks, at least 1. */
int dense_pool_threads_for(int local_ranks);

#endif
