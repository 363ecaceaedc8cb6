/* Check macros for CUDA, cuBLAS and NCCL calls (llm.c's cudaCheck, minus the
 * exit): a failed call records "file:line: call: message" as the last error
 * and the macro evaluates to SR_EBACKEND (0 on success), so library code
 * returns the status and only tools/ mains print. Include from .cu files or
 * from C files built with the CUDA headers on the include path. */
#ifndef SHARDREC_DENSE_CUDA_CHECK_H
#define SHARDREC_DENSE_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Record a failure (keeps the first one until dense_cuda_error_clear). */
void dense_cuda__fail(const char *file, int line, const char *call,
                      const char *what);
/* The first error recorded since the last clear ("" if none); static. */
const char *dense_cuda_error(void);
void dense_cuda_error_clear(void);

static inline int dense_cuda__check(cudaError_t e, const char *call,
                                    const char *file, int line) {
  if (e == cudaSuccess) return 0;
  dense_cuda__fail(file, line, call, cudaGetErrorString(e));
  return -14; /* SR_EBACKEND */
}

#define CUDA_CHECK(call) dense_cuda__check((call), #call, __FILE__, __LINE__)

#ifdef __cplusplus
}
#endif

#endif
