/* --device parsing (see cuda_device.h). Compiled into sr_dense_cuda in CUDA
 * builds (SHARDREC_HAVE_CUDA defined) and into sr_dense otherwise. */
#include "dense/cuda_device.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#ifdef SHARDREC_HAVE_CUDA
#include "dense/backend_cuda.h"
#endif

int dense_have_cuda(void) {
#ifdef SHARDREC_HAVE_CUDA
  return 1;
#else
  return 0;
#endif
}

int dense_backend_for_device(const char *spec, const dense_backend **out,
                             int *is_gpu, char *err, size_t errlen) {
  if (is_gpu) *is_gpu = 0;
  if (!spec || !strcmp(spec, "cpu")) {
    *out = dense_backend_cpu();
    return SR_OK;
  }
  long dev = 0;
  if (!strncmp(spec, "cuda", 4) && (spec[4] == 0 || spec[4] == ':')) {
    if (spec[4] == ':') {
      char *end;
      dev = strtol(spec + 5, &end, 10);
      if (end == spec + 5 || *end || dev < 0 || dev > 1023) {
        sr_fmt(err, errlen, "--device %s: the GPU index must be a number "
               "(cuda:0, cuda:1, ...)", spec);
        return SR_EINVAL;
      }
    }
  } else {
    sr_fmt(err, errlen, "--device %s: not a device (cpu, cuda or cuda:N)",
           spec);
    return SR_EINVAL;
  }
#ifdef SHARDREC_HAVE_CUDA
  char why[384];
  const dense_backend *be = dense_backend_cuda((int)dev, why, sizeof why);
  if (!be) {
    sr_fmt(err, errlen, "--device %s: %s", spec, why);
    return SR_EBACKEND;
  }
  *out = be;
  if (is_gpu) *is_gpu = 1;
  return SR_OK;
#else
  sr_fmt(err, errlen, "--device %s: this build has no CUDA backend (nvcc and "
         "the CUDA toolkit were not found when it was configured); use "
         "--device cpu or rebuild where CUDA is installed", spec);
  return SR_EUNSUPPORTED;
#endif
}
