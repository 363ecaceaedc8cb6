/* GPU tests skip, visibly, where there is no GPU: "skipped: no GPU" and exit
 * 77 (ctest SKIP_RETURN_CODE). */
#ifndef SHARDREC_TESTS_CUDA_GPU_SKIP_H
#define SHARDREC_TESTS_CUDA_GPU_SKIP_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/rng.h"
#include "dense/backend_cuda.h"

/* GPUs visible, counted in a child process: the Check suites fork a child
 * per test, and CUDA cannot be used in a child forked after the parent has
 * initialised it (cudaGetDeviceCount does). With none, why[whylen] says
 * why, in cudaGetDeviceCount's words (a GPU the driver or runtime cannot
 * use reads otherwise as no GPU at all). */
static inline int gpu_count_in_child(char *why, size_t whylen) {
  int fd[2];
  snprintf(why, whylen, "no answer from the child that counts GPUs");
  if (pipe(fd)) return 0;
  pid_t pid = fork();
  if (pid == 0) {
    char w[256] = "";
    int n = dense_cuda_device_count(w, sizeof w);
    ssize_t k = write(fd[1], w, strlen(w));
    _exit(k < 0 ? 0 : n > 100 ? 100 : n);
  }
  close(fd[1]);
  if (pid > 0) {
    ssize_t k = read(fd[0], why, whylen - 1);
    if (k > 0) why[k] = 0;
  }
  close(fd[0]);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st)) return 0;
  return WEXITSTATUS(st);
}

#define SR_SKIP_NO_GPU(name)                                              \
  do {                                                                    \
    char why_[256];                                                       \
    if (gpu_count_in_child(why_, sizeof why_) < 1) {                      \
      printf("%s: skipped: no GPU (%s)\n", name, why_);                   \
      return 77;                                                          \
    }                                                                     \
  } while (0)

static inline const dense_backend *cuda_be(void) {
  char err[256];
  const dense_backend *be = dense_backend_cuda(0, err, sizeof err);
  ck_assert_msg(be != NULL, "%s", err);
  return be;
}

static inline void fill_uniform(float *x, size_t n, uint64_t seed, float lo,
                                float hi) {
  sr_rng r;
  sr_rng_init(&r, seed, 0);
  for (size_t i = 0; i < n; i++)
    x[i] = lo + (hi - lo) * (float)sr_rng_uniform(&r);
}

/* Device copy of host x[n] (owned by the caller: dense_cuda_free). */
static inline float *to_dev(const float *x, size_t n) {
  void *d = NULL;
  ck_assert_msg(dense_cuda_malloc(&d, n * sizeof(float) + 4) == 0, "%s",
                dense_cuda_last_error());
  if (n)
    ck_assert_msg(dense_cuda_upload(d, x, n * sizeof(float)) == 0, "%s",
                  dense_cuda_last_error());
  return (float *)d;
}
static inline void from_dev(float *x, const float *d, size_t n) {
  ck_assert_msg(dense_cuda_download(x, d, n * sizeof(float)) == 0, "%s",
                dense_cuda_last_error());
}

/* got[n] against want[n]: |got - want| <= rtol * (|want| + max|want|)
 * for every element (the max term makes the tolerance relative to the
 * array's scale where an element is a cancellation near zero). */
static inline void assert_close(const char *what, const float *got,
                                const float *want, size_t n, double rtol) {
  double scale = 0.0;
  for (size_t i = 0; i < n; i++)
    if (fabs(want[i]) > scale) scale = fabs(want[i]);
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    ck_assert_msg(e <= rtol * (fabs(want[i]) + scale),
                  "%s[%zu]: cuda %.9g cpu %.9g (|diff| %.3g > %.1e relative; "
                  "array scale %.3g)",
                  what, i, got[i], want[i], e, rtol, scale);
  }
}

#endif
