/* `--device cpu|cuda[:N]` for the tools: the dense backend a device names.
 * Plain C; in every build. The CUDA backend comes from its module
 * (cuda_plugin.h), loaded on the first "cuda": a build without it, or a
 * machine where it does not load, answers with a clear SR_EUNSUPPORTED. */
#ifndef SHARDREC_DENSE_CUDA_DEVICE_H
#define SHARDREC_DENSE_CUDA_DEVICE_H

#include <stddef.h>

#include "dense/backend.h"

/* "cpu" -> the CPU backend; "cuda" or "cuda:N" -> the CUDA backend on device
 * N (0 by default), created on first use. *is_gpu (may be NULL) tells which.
 * Returns 0, SR_EINVAL (not a device name), SR_EUNSUPPORTED (no CUDA backend
 * in this build, or its module does not load) or SR_EBACKEND (no such GPU,
 * driver error); the reason in err. */
int dense_backend_for_device(const char *spec, const dense_backend **out,
                             int *is_gpu, char *err, size_t errlen);

#endif
