/* Device backends: how dense_model reaches a device backend, and the process's default
 * backend. Plain C, compiled into every build (with or without CUDA).
 *
 * The kernels of a backend are the function pointers of dense_backend
 * (backend.h). A device backend (CUDA) also needs its own memory: it
 * registers these hooks for its backend object, and dense_model_create_on
 * then keeps the parameters and gradients the caller sees in host memory
 * (dense_model_params / dense_model_grads, as on the CPU: optimizer steps,
 * checkpoints and loads work unchanged) and runs forward/backward on device
 * copies: forward uploads the parameters and the batch, backward downloads
 * the parameter gradients and d_emb. Without hooks (the CPU backend) the
 * model runs exactly as before, same bits.
 *
 * The default backend is the one dense_model_create uses (the CPU backend
 * unless a program chooses another, e.g. `shardrec train --device cuda`). */
#ifndef SHARDREC_DENSE_CUDA_HOOKS_H
#define SHARDREC_DENSE_CUDA_HOOKS_H

#include <stddef.h>

#include "dense/backend.h"
#include "dense/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Shapes of a model, as dense_model lays out its parameter buffer. */
typedef struct dense_dev_layout {
  const dense_config *cfg; /* borrowed for the create call only */
  int n_layers;            /* bottom layers then top layers */
  const int *K, *N;        /* [n_layers] input / output widths */
  const size_t *w_off, *b_off; /* [n_layers] offsets into the params */
  size_t n_params;
  int r_width;             /* top MLP input width */
} dense_dev_layout;

typedef struct dense_dev_hooks {
  /* Device state for one model; NULL with the reason in err. */
  void *(*create)(const dense_backend *be, const dense_dev_layout *lay,
                  char *err, size_t errlen);
  void (*destroy)(void *dev); /* NULL-safe */
  /* As dense_model_forward; params[n_params] (host) are uploaded first. */
  int (*forward)(void *dev, const float *params, int n, const float *x_dense,
                 const float *emb, float *logits, char *err, size_t errlen);
  /* As dense_model_backward; grads[n_params] (host) receive the parameter
   * gradients. */
  int (*backward)(void *dev, int n, const float *labels, float *loss_out,
                  float *d_emb, float *grads, char *err, size_t errlen);
  /* The device's own host buffers for a batch's emb and d_emb, each
   * [max_batch][n_sparse][emb_dim] (page-locked: the copies run straight
   * from and into them). */
  void (*batch_buffers)(void *dev, float **emb, float **d_emb);
} dense_dev_hooks;

/* Register hooks (static object) for a backend (static object); a second
 * registration of the same backend replaces the first. At most 8 backends.
 * Returns 0 or SR_ERANGE. Not thread-safe: call at start-up. */
int dense_dev_hooks_register(const dense_backend *be, const dense_dev_hooks *h);
/* The hooks of be, or NULL (host backend). */
const dense_dev_hooks *dense_dev_hooks_of(const dense_backend *be);

/* The backend dense_model_create uses; NULL restores the CPU backend.
 * Not thread-safe: call at start-up, before models are created. */
void dense_backend_set_default(const dense_backend *be);
const dense_backend *dense_backend_default(void);

#ifdef __cplusplus
}
#endif

#endif
