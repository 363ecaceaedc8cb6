/* Internals shared by the CUDA backend's .cu files (not public). */
#ifndef SHARDREC_DENSE_CUDA_IMPL_H
#define SHARDREC_DENSE_CUDA_IMPL_H

#include <cuda_runtime.h>

extern "C" {
#include "dense/backend.h"
}
#include "dense/cuda_check.h"

/* The backend's stream (valid after dense_backend_cuda succeeded). */
cudaStream_t dense_cuda__stream(void);
/* Register the dense_model hooks for the backend object (cuda_model.cu). */
void dense_cuda__model_register(const dense_backend *be);
/* Add to the process-wide step times (cuda_model.cu keeps them). */
void dense_cuda__times_add(double h2d, double compute, double d2h);

#endif
