/* The next batch of a binary file decoded ahead (see bin_ahead.h). */
#include "datasets/bin_ahead.h"

#include <pthread.h>
#include <stdlib.h>

#include "common/sys.h"

struct ds_bin_ahead {
  ds_bin_reader *r;
  uint64_t mod;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t th;
  ds_batch b;     /* the helper's batch; the helper alone touches it while busy */
  uint64_t index; /* its records: [index, index + n) */
  int n;          /* 0: it holds none that a read may take */
  int busy;       /* a decode asked for or running */
  int rc;         /* the last decode's result */
  int stop;
};

static void *ahead_main(void *arg) {
  ds_bin_ahead *a = arg;
  sr_thread_name("sr:read-ahead");
  pthread_mutex_lock(&a->mu);
  for (;;) {
    while (!a->busy && !a->stop) pthread_cond_wait(&a->cv, &a->mu);
    if (a->stop) break;
    const uint64_t index = a->index;
    const int n = a->n;
    pthread_mutex_unlock(&a->mu);
    const int rc = ds_bin_reader_read(a->r, index, n, a->mod, &a->b);
    pthread_mutex_lock(&a->mu);
    a->rc = rc;
    a->busy = 0;
    pthread_cond_broadcast(&a->cv);
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

ds_bin_ahead *ds_bin_ahead_create(ds_bin_reader *r, uint64_t mod, int cap) {
  ds_bin_ahead *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->r = r;
  a->mod = mod;
  if (ds_batch_init(&a->b, cap)) {
    free(a);
    return NULL;
  }
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  if (pthread_create(&a->th, NULL, ahead_main, a)) {
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    ds_batch_free(&a->b);
    free(a);
    return NULL;
  }
  return a;
}

/* With a->mu held: until the helper is idle. */
static void wait_idle(ds_bin_ahead *a) {
  while (a->busy) pthread_cond_wait(&a->cv, &a->mu);
}

int ds_bin_ahead_read(ds_bin_ahead *a, uint64_t index, int n, ds_batch *b, int *taken) {
  pthread_mutex_lock(&a->mu);
  wait_idle(a);
  const int hit = a->n == n && a->index == index && b->cap == a->b.cap;
  a->n = 0;
  pthread_mutex_unlock(&a->mu);
  *taken = hit;
  if (!hit) return ds_bin_reader_read(a->r, index, n, a->mod, b);
  const ds_batch mine = *b;
  *b = a->b;
  a->b = mine;
  return a->rc;
}

void ds_bin_ahead_start(ds_bin_ahead *a, uint64_t index, int n) {
  pthread_mutex_lock(&a->mu);
  wait_idle(a);
  if (n > 0 && n <= a->b.cap) {
    a->index = index;
    a->n = n;
    a->busy = 1;
    pthread_cond_broadcast(&a->cv);
  }
  pthread_mutex_unlock(&a->mu);
}

void ds_bin_ahead_destroy(ds_bin_ahead *a) {
  if (!a) return;
  pthread_mutex_lock(&a->mu);
  a->stop = 1;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
  pthread_join(a->th, NULL);
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
  ds_batch_free(&a->b);
  free(a);
}
