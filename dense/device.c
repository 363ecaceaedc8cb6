/* Device backends: the hook registry, and the process's default backend (see device.h). */
#include "dense/device.h"

#include "common/status.h"

#define DENSE_DEV_MAX 8
static struct {
  const dense_backend *be;
  const dense_dev_hooks *h;
} dev_reg[DENSE_DEV_MAX];
static const dense_backend *default_be;

int dense_dev_hooks_register(const dense_backend *be, const dense_dev_hooks *h) {
  for (int i = 0; i < DENSE_DEV_MAX; i++)
    if (dev_reg[i].be == be || !dev_reg[i].be) {
      dev_reg[i].be = be;
      dev_reg[i].h = h;
      return SR_OK;
    }
  return SR_ERANGE;
}

const dense_dev_hooks *dense_dev_hooks_of(const dense_backend *be) {
  for (int i = 0; i < DENSE_DEV_MAX && dev_reg[i].be; i++)
    if (dev_reg[i].be == be) return dev_reg[i].h;
  return NULL;
}

void dense_backend_set_default(const dense_backend *be) { default_be = be; }

const dense_backend *dense_backend_default(void) {
  return default_be ? default_be : dense_backend_cpu();
}
