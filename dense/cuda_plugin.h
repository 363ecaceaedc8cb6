/* The CUDA backend as a module the process loads only when it is asked
 * for (`--device cuda`): libshardrec_cuda.so, built beside the shardrec
 * binary where nvcc and the CUDA toolkit are found. A CPU run, a shard
 * server or a tool never maps cuBLAS (its static data alone is ~87 MB of
 * anonymous memory per process, and loading it costs start-up time), and a
 * binary built on a CUDA machine runs where the CUDA libraries are absent.
 * Plain C.
 *
 * The module's one exported symbol is shardrec_cuda_plugin (the
 * dense_cuda_plugin_fn type): the host hands it its hook registry (the
 * module's backend registers its device hooks there, device.h) and gets
 * the entry points back. The tests of the backend itself (tests/cuda) link
 * its static library, sr_dense_cuda, instead. */
#ifndef SHARDREC_DENSE_CUDA_PLUGIN_H
#define SHARDREC_DENSE_CUDA_PLUGIN_H

#include <stddef.h>

#include "dense/backend.h"
#include "dense/backend_cuda.h"
#include "dense/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever either struct or dense_dev_hooks changes: a module of
 * another version is refused by name. */
#define DENSE_CUDA_PLUGIN_ABI 2

/* What the host lends the module. */
typedef struct dense_cuda_host {
  int abi;
  int (*hooks_register)(const dense_backend *be, const dense_dev_hooks *h);
} dense_cuda_host;

/* The module's entry points (backend_cuda.h's functions of those names). */
typedef struct dense_cuda_plugin {
  int abi;
  const dense_backend *(*backend)(int device, char *err, size_t errlen);
  double (*gemm_seconds)(int trans_a, int trans_b, int M, int N, int K, int reps);
  void (*times_get)(dense_cuda_times *out);
  void (*times_reset)(void);
} dense_cuda_plugin;

/* The module's exported symbol: its entry points, or NULL when host->abi
 * is not the module's. */
#define DENSE_CUDA_PLUGIN_SYMBOL "shardrec_cuda_plugin"
typedef const dense_cuda_plugin *(*dense_cuda_plugin_fn)(const dense_cuda_host *host);

/* The module, loaded on the first call (later calls give the same answer):
 * $SHARDREC_CUDA_MODULE when set, else libshardrec_cuda.so in the folder of
 * the running executable. NULL with the reason in err (naming the path and
 * the loader's message) when this build has no CUDA backend, the file is
 * missing or does not load (e.g. no CUDA libraries), or its ABI differs.
 * Not thread-safe: call at start-up. */
const dense_cuda_plugin *dense_cuda_plugin_load(char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
