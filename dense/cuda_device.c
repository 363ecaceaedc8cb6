/* --device parsing (see cuda_device.h) and the host side of the CUDA
 * module (cuda_plugin.h). In every build; SHARDREC_CUDA_MODULE_BUILT says
 * whether the build made libshardrec_cuda.so. */
#include "dense/cuda_device.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/num.h"
#include "common/status.h"
#include "dense/cuda_plugin.h"

#define CUDA_MODULE_FILE "libshardrec_cuda.so"

/* The module's path: $SHARDREC_CUDA_MODULE, else beside the executable. */
static int module_path(char *out, size_t cap, char *err, size_t errlen) {
  const char *env = getenv("SHARDREC_CUDA_MODULE");
  if (env && *env) return sr_path_err(out, cap, err, errlen, "%s", env);
  char exe[SR_PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    sr_fmt(err, errlen, "cannot find the running executable (/proc/self/exe) to look for "
           CUDA_MODULE_FILE " beside it; set SHARDREC_CUDA_MODULE to its path");
    return SR_EIO;
  }
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  return sr_path_err(out, cap, err, errlen, "%s/" CUDA_MODULE_FILE, exe);
}

static const dense_cuda_plugin *load(char *err, size_t errlen) {
#ifndef SHARDREC_CUDA_MODULE_BUILT
  sr_fmt(err, errlen, "this build has no CUDA backend (nvcc and the CUDA toolkit were not "
         "found when it was configured); use --device cpu or rebuild where CUDA is installed");
  return NULL;
#endif
  char path[SR_PATH_MAX];
  if (module_path(path, sizeof path, err, errlen)) return NULL;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    sr_fmt(err, errlen, "the CUDA backend %s does not load: %s", path, dlerror());
    return NULL;
  }
  dense_cuda_plugin_fn entry = (dense_cuda_plugin_fn)dlsym(h, DENSE_CUDA_PLUGIN_SYMBOL);
  static const dense_cuda_host host = {DENSE_CUDA_PLUGIN_ABI, dense_dev_hooks_register};
  const dense_cuda_plugin *p = entry ? entry(&host) : NULL;
  if (!p || p->abi != DENSE_CUDA_PLUGIN_ABI) {
    sr_fmt(err, errlen, "%s is not this build's CUDA backend (%s version %d expected); "
           "rebuild it with this binary", path, DENSE_CUDA_PLUGIN_SYMBOL, DENSE_CUDA_PLUGIN_ABI);
    dlclose(h);
    return NULL;
  }
  return p; /* never closed: the backend is a static object of the module */
}

const dense_cuda_plugin *dense_cuda_plugin_load(char *err, size_t errlen) {
  static int tried;
  static const dense_cuda_plugin *plugin;
  static char why[640];
  if (!tried) {
    tried = 1;
    plugin = load(why, sizeof why);
  }
  if (!plugin) sr_fmt(err, errlen, "%s", why);
  return plugin;
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
      long long d = -1;
      sr_num_int(spec + 5, strlen(spec + 5), &d); /* d stays -1 unless a number */
      dev = (long)d;
      if (d < 0 || d > 1023) {
        sr_fmt(err, errlen, "--device %s: the GPU index must be a number 0 to 1023 "
               "(cuda:0, cuda:1, ...)", spec);
        return SR_EINVAL;
      }
    }
  } else {
    sr_fmt(err, errlen, "--device %s: not a device (cpu, cuda or cuda:N)",
           spec);
    return SR_EINVAL;
  }
  char why[640];
  const dense_cuda_plugin *p = dense_cuda_plugin_load(why, sizeof why);
  if (!p) {
    sr_fmt(err, errlen, "--device %s: %s", spec, why);
    return SR_EUNSUPPORTED;
  }
  const dense_backend *be = p->backend((int)dev, why, sizeof why);
  if (!be) {
    sr_fmt(err, errlen, "--device %s: %s", spec, why);
    return SR_EBACKEND;
  }
  *out = be;
  if (is_gpu) *is_gpu = 1;
  return SR_OK;
}
