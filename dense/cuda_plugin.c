/* The module side of cuda_plugin.h: compiled into libshardrec_cuda.so only,
 * with every other symbol hidden. */
#include "dense/cuda_plugin.h"

#include "common/status.h"

static const dense_cuda_host *host;

/* The backend's objects register their hooks through this name
 * (cuda_model.cu); in the module it is the host's registry, so that the
 * host's dense_model finds them. */
int dense_dev_hooks_register(const dense_backend *be, const dense_dev_hooks *h) {
  return host ? host->hooks_register(be, h) : SR_EBACKEND;
}

static const dense_cuda_plugin plugin = {
    DENSE_CUDA_PLUGIN_ABI, dense_backend_cuda, dense_cuda_gemm_seconds,
    dense_cuda_times_get, dense_cuda_times_reset,
};

__attribute__((visibility("default"))) const dense_cuda_plugin *shardrec_cuda_plugin(
    const dense_cuda_host *h) {
  if (!h || h->abi != DENSE_CUDA_PLUGIN_ABI || !h->hooks_register) return NULL;
  host = h;
  return &plugin;
}
