/* What the process's OpenBLAS is: its version, the kernel family it runs on
 * this CPU, and a warning when that family is a generic one on a CPU that
 * has faster ones (dense/backend.h). */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/sys.h"
#include "dense/backend.h"

/* "OpenBLAS 0.3.21 DYNAMIC_ARCH ..." -> "0.3.21" */
static char blas_version[32];
static pthread_once_t blas_version_once = PTHREAD_ONCE_INIT;
static void blas_version_read(void) {
  const char *c = openblas_get_config();
  const char *p = c ? strstr(c, "OpenBLAS ") : NULL;
  p = p ? p + 9 : "unknown";
  size_t n = strcspn(p, " ");
  if (n >= sizeof blas_version) n = sizeof blas_version - 1;
  memcpy(blas_version, p, n);
  blas_version[n] = 0;
}
const char *dense_blas_version(void) {
  pthread_once(&blas_version_once, blas_version_read);
  return blas_version;
}
const char *dense_blas_core(void) {
  const char *c = openblas_get_corename();
  return c ? c : "unknown";
}

const char *dense_blas_core_hint_for(const char *core, const char *config, int avx2, int avx512,
                                     const char *forced) {
  static const char *const fast[] = {"Haswell",    "Zen",            "SkylakeX",
                                     "Cooperlake", "SapphireRapids", "Excavator"};
  if (!core || !config || !strstr(config, "DYNAMIC_ARCH") || !avx2) return NULL;
  if (forced && !strcasecmp(forced, core)) return NULL;
  for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++)
    if (!strcasecmp(core, fast[i])) return NULL;
  return avx512 ? "SkylakeX" : "Haswell";
}

int dense_blas_core_warning(char *buf, size_t len) {
  int avx512 = 0;
#if defined(__x86_64__) || defined(__i386__)
  avx512 = __builtin_cpu_supports("avx512f");
#endif
  const char *core = dense_blas_core(),
             *hint = dense_blas_core_hint_for(core, openblas_get_config(), sr_cpu_avx2(), avx512,
                                              getenv("OPENBLAS_CORETYPE"));
  if (!hint) return 0;
  snprintf(buf, len,
           "OpenBLAS runs its generic %s kernels on this %s CPU; OPENBLAS_CORETYPE=%s runs its "
           "faster ones (the results' last bits change)",
           core, avx512 ? "AVX-512" : "AVX2", hint);
  return 1;
}
