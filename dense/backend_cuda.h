/* The CUDA backend: cuBLAS sgemm for the linear layers and CUDA kernels for
 * the rest of a dense step, behind dense_backend (backend.h), tested against
 * the CPU backend (tests/cuda). Built only where nvcc and the CUDA libraries
 * are found (libshardrec_cuda.so, cuda_plugin.h; sr_dense_cuda for its tests); this header is plain C.
 *
 * One device and one stream per process (one GPU per rank). The backend's
 * kernel pointers take DEVICE pointers, are queued on the backend's stream
 * and never fail themselves: an error (bad launch, cuBLAS status) is kept
 * as the first error "file:line: call: message" (dense_cuda_error) and the
 * next synchronising call reports it. bce_logits synchronises (it returns
 * the loss). Kernels are deterministic: no float atomics; every sum adds in
 * a fixed order (bias gradients: rows in chunks of 64 in order, then the
 * chunks in order; the loss: a fixed-shape tree over 256 strided partial
 * sums). Elementwise kernels are compiled without FMA contraction
 * (-fmad=false), as the CPU code (-ffp-contract=off): SGD/Adagrad/Adam and
 * bias/ReLU give the CPU's bits; sgemm, the interaction and the loss agree
 * within rounding (tests/cuda states the tolerances).
 *
 * A dense_model created on this backend (dense_model_create_on, or
 * dense_model_create after dense_backend_set_default) keeps its parameters
 * and gradients on the device in one buffer each, activations in a third,
 * and mirrors parameters/gradients in host memory for the caller (see
 * dense/device.h): per step the parameters, dense features and pooled
 * embeddings go host-to-device and the gradients and d_emb device-to-host,
 * through pinned buffers on the backend's stream. */
#ifndef SHARDREC_DENSE_BACKEND_CUDA_H
#define SHARDREC_DENSE_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "dense/backend.h"
#include "dense/optim.h"

/* CUDA devices this process can use; 0 when there is no driver or no GPU
 * (never an error: callers skip), with why in why[whylen] (may be NULL):
 * cudaGetDeviceCount's own words ("no CUDA-capable device is detected", a
 * driver older than the runtime, ...). */
int dense_cuda_device_count(char *why, size_t whylen);

/* The CUDA backend on device `device` (0-based), created on first call
 * (stream, cuBLAS handle); later calls must name the same device. Static
 * object, never freed. NULL with the reason in err. */
const dense_backend *dense_backend_cuda(int device, char *err, size_t errlen);

/* Device memory on the backend's device (call dense_backend_cuda first).
 * Return 0 or SR_EBACKEND (text in dense_cuda_error). The copies are
 * synchronous. */
int dense_cuda_malloc(void **p, size_t bytes);
void dense_cuda_free(void *p); /* NULL-safe */
int dense_cuda_upload(void *dst_dev, const void *src_host, size_t bytes);
int dense_cuda_download(void *dst_host, const void *src_dev, size_t bytes);
/* Wait for the backend's stream; 0, or SR_EBACKEND with the first error
 * since the last dense_cuda_error_clear (declared in cuda_check.h). */
int dense_cuda_sync(void);
/* The backend's cudaStream_t, as a void pointer (for collectives). */
void *dense_cuda_stream(void);
const char *dense_cuda_last_error(void); /* as dense_cuda_error */

/* One dense optimizer step on device buffers p[n], g[n] and state (none for
 * SGD, s[n] for Adagrad, m[n] then v[n] for Adam: dense_opt_state's layout),
 * with the formulas of dense/optim.c; t is Adam's step number after the
 * increment (1 for the first step). Queued on the stream. 0 or SR_EINVAL /
 * SR_EBACKEND. */
int dense_cuda_opt_step(const dense_opt_config *cfg, size_t n, float *p,
                        const float *g, float *state, int64_t t, float lr);

/* Median seconds of one cublasSgemm of this row-major shape (as
 * dense_backend.gemm; lda/ldb/ldc packed) over reps timed calls after two
 * warm-up calls, on device matrices of uniform values, timed with CUDA
 * events on the backend's stream. Negative on failure (dense_cuda_error). */
double dense_cuda_gemm_seconds(int trans_a, int trans_b, int M, int N, int K,
                               int reps);

/* Seconds of device-stream time of the models' steps since the last reset,
 * measured with CUDA events: uploads (parameters, dense features, pooled
 * embeddings, labels), compute (forward + backward kernels and sgemm), and
 * downloads (logits, gradients, d_emb). */
typedef struct dense_cuda_times {
  double h2d, compute, d2h;
  int64_t steps;
} dense_cuda_times;
void dense_cuda_times_get(dense_cuda_times *out);
void dense_cuda_times_reset(void);

#ifdef __cplusplus
}
#endif

#endif
