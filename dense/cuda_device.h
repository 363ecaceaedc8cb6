/* `--device cpu|cuda[:N]` for the tools: the dense backend a device names.
 * Plain C; in every build (a build without CUDA answers "cuda" with a clear
 * SR_EUNSUPPORTED). */
#ifndef SHARDREC_DENSE_CUDA_DEVICE_H
#define SHARDREC_DENSE_CUDA_DEVICE_H

#include <stddef.h>

#include "dense/backend.h"

/* "cpu" -> the CPU backend; "cuda" or "cuda:N" -> the CUDA backend on device
 * N (0 by default), created on first use. *is_gpu (may be NULL) tells which.
 * Returns 0, SR_EINVAL (not a device name), SR_EUNSUPPORTED (no CUDA in this
 * build) or SR_EBACKEND (no such GPU, driver error); the reason in err. */
int dense_backend_for_device(const char *spec, const dense_backend **out,
                             int *is_gpu, char *err, size_t errlen);

/* 1 if this build has the CUDA backend. */
int dense_have_cuda(void);

#endif
