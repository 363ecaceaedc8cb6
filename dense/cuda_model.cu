/* dense_model on the CUDA backend: the device half of a model (see
 * dense/device.h). Parameters, gradients and activations live in three
 * device buffers; the host mirrors of parameters and gradients belong to
 * dense_model. Per step: forward uploads parameters, dense features and
 * pooled embeddings through one pinned buffer; backward downloads gradients
 * and d_emb through it. Everything runs on the backend's stream. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense/backend_cuda.h"
#include "dense/device.h"
#include "dense/cuda_impl.h"

#define SR_EBACKEND_ (-14)
#define SR_ENOMEM_ (-2)

struct devm {
  const dense_backend *be;
  dense_config cfg;
  int L, ni, r_width, maxw, d;
  int K[2 * DENSE_MAX_LAYERS], N[2 * DENSE_MAX_LAYERS];
  size_t w_off[2 * DENSE_MAX_LAYERS], b_off[2 * DENSE_MAX_LAYERS];
  size_t n_params, es; /* es: floats of pooled embeddings per sample */
  float *params, *grads; /* device [n_params] each */
  float *acts;           /* device block holding the rest */
  float *x_in, *out[2 * DENSE_MAX_LAYERS], *R, *T, *dT, *g0, *g1, *emb,
      *d_emb, *labels;
  float *pin; /* pinned host: [n_params] [B*n_dense] [B*es] [B*es] [2B] */
  float *pin_p, *pin_x, *pin_e, *pin_d, *pin_l;
  cudaEvent_t ev[8];
  int fwd_n;
};

static struct {
  double h2d, compute, d2h;
  int64_t steps;
} times;

void dense_cuda__times_add(double h2d, double compute, double d2h) {
  times.h2d += h2d, times.compute += compute, times.d2h += d2h;
  times.steps++;
}
extern "C" void dense_cuda_times_get(dense_cuda_times *o) {
  o->h2d = times.h2d, o->compute = times.compute, o->d2h = times.d2h;
  o->steps = times.steps;
}
extern "C" void dense_cuda_times_reset(void) { memset(&times, 0, sizeof times); }

static void set_err(char *err, size_t errlen, const char *what) {
  if (err && errlen)
    snprintf(err, errlen, "CUDA %s: %s", what,
             dense_cuda_error()[0] ? dense_cuda_error() : "failed");
}

static void devm_destroy(void *p) {
  devm *m = (devm *)p;
  if (!m) return;
  cudaStreamSynchronize(dense_cuda__stream());
  cudaFree(m->params);
  cudaFree(m->grads);
  cudaFree(m->acts);
  if (m->pin) cudaFreeHost(m->pin);
  for (int i = 0; i < 8; i++)
    if (m->ev[i]) cudaEventDestroy(m->ev[i]);
  free(m);
}

static void *devm_create(const dense_backend *be, const dense_dev_layout *lay,
                         char *err, size_t errlen) {
  devm *m = (devm *)calloc(1, sizeof *m);
  if (!m) {
    if (err && errlen) snprintf(err, errlen, "out of memory");
    return NULL;
  }
  const dense_config *c = lay->cfg;
  m->be = be;
  m->cfg = *c;
  m->L = lay->n_layers;
  m->ni = c->n_sparse + 1;
  m->r_width = lay->r_width;
  m->d = c->bot[c->n_bot - 1];
  m->n_params = lay->n_params;
  m->es = (size_t)c->n_sparse * c->emb_dim;
  int maxw = c->n_dense > m->r_width ? c->n_dense : m->r_width;
  for (int l = 0; l < m->L; l++) {
    m->K[l] = lay->K[l], m->N[l] = lay->N[l];
    m->w_off[l] = lay->w_off[l], m->b_off[l] = lay->b_off[l];
    if (m->N[l] > maxw) maxw = m->N[l];
  }
  m->maxw = maxw;
  size_t B = (size_t)c->max_batch, es = m->es;
  size_t tsz = c->interaction == DENSE_INTERACT_DOT ? B * m->ni * c->emb_dim : 0;
  size_t total = B * c->n_dense + B * m->r_width + 2 * tsz + 2 * B * maxw +
                 2 * B * es + B;
  for (int l = 0; l < m->L; l++) total += B * m->N[l];
  size_t pin_n = m->n_params + B * (size_t)c->n_dense + 2 * B * es + 2 * B;
  dense_cuda_error_clear();
  if (CUDA_CHECK(cudaMalloc((void **)&m->params, (m->n_params + 1) * 4)) ||
      CUDA_CHECK(cudaMalloc((void **)&m->grads, (m->n_params + 1) * 4)) ||
      CUDA_CHECK(cudaMalloc((void **)&m->acts, total * 4)) ||
      CUDA_CHECK(cudaMemsetAsync(m->acts, 0, total * 4, dense_cuda__stream())) ||
      CUDA_CHECK(cudaMemsetAsync(m->grads, 0, (m->n_params + 1) * 4, dense_cuda__stream())) ||
      CUDA_CHECK(cudaMallocHost((void **)&m->pin, pin_n * 4))) {
    set_err(err, errlen, "model buffers");
    devm_destroy(m);
    return NULL;
  }
  for (int i = 0; i < 8; i++)
    if (CUDA_CHECK(cudaEventCreate(&m->ev[i]))) {
      set_err(err, errlen, "events");
      devm_destroy(m);
      return NULL;
    }
  float *p = m->acts;
  m->x_in = p, p += B * c->n_dense;
  for (int l = 0; l < m->L; l++) m->out[l] = p, p += B * m->N[l];
  m->R = p, p += B * m->r_width;
  m->T = tsz ? p : NULL, p += tsz;
  m->dT = tsz ? p : NULL, p += tsz;
  m->g0 = p, p += B * maxw;
  m->g1 = p, p += B * maxw;
  m->emb = p, p += B * es;
  m->d_emb = p, p += B * es;
  m->labels = p, p += B;
  m->pin_p = m->pin;
  m->pin_x = m->pin_p + m->n_params;
  m->pin_e = m->pin_x + B * c->n_dense;
  m->pin_d = m->pin_e + B * es;
  m->pin_l = m->pin_d + B * es; /* labels in, logits out: [2B] */
  return m;
}

static float ms_between(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    cudaGetLastError();
    return 0.0f;
  }
  return ms;
}

#define TRY(call)                                                              \
  do {                                                                         \
    if (CUDA_CHECK(call)) goto fail;                                           \
  } while (0)

/* out[n][N] = act(in[n][K] W[N][K]^T + b) */
static void linear_fwd(devm *m, int n, int l, const float *in, int relu) {
  int K = m->K[l], N = m->N[l];
  m->be->gemm(0, 1, n, N, K, 1.0f, in, K, m->params + m->w_off[l], K, 0.0f,
              m->out[l], N);
  m->be->bias_act_forward(n, N, m->params + m->b_off[l], relu, m->out[l]);
}

static int devm_forward(void *p, const float *params, int n,
                        const float *x_dense, const float *emb, float *logits,
                        char *err, size_t errlen) {
  devm *m = (devm *)p;
  const dense_config *c = &m->cfg;
  cudaStream_t s = dense_cuda__stream();
  size_t es = m->es;
  int nb = c->n_bot - 1, d = m->d;
  m->fwd_n = 0;
  dense_cuda_error_clear();
  TRY(cudaEventRecord(m->ev[0], s));
  memcpy(m->pin_p, params, m->n_params * 4);
  memcpy(m->pin_x, x_dense, (size_t)n * c->n_dense * 4);
  if (es && emb != m->pin_e) memcpy(m->pin_e, emb, (size_t)n * es * 4);
  TRY(cudaMemcpyAsync(m->params, m->pin_p, m->n_params * 4,
                      cudaMemcpyHostToDevice, s));
  TRY(cudaMemcpyAsync(m->x_in, m->pin_x, (size_t)n * c->n_dense * 4,
                      cudaMemcpyHostToDevice, s));
  if (es)
    TRY(cudaMemcpyAsync(m->emb, m->pin_e, (size_t)n * es * 4,
                        cudaMemcpyHostToDevice, s));
  TRY(cudaEventRecord(m->ev[1], s));
  {
    const float *in = m->x_in;
    for (int l = 0; l < nb; l++) {
      linear_fwd(m, n, l, in, 1);
      in = m->out[l];
    }
    const float *xb = in; /* [n][d] */
    /* T[b] = [xb[b]; emb[b]] (dot) or R[b] = [xb[b]; emb[b]] (cat) */
    float *dst = c->interaction == DENSE_INTERACT_DOT ? m->T : m->R;
    size_t pitch = c->interaction == DENSE_INTERACT_DOT
                       ? (size_t)m->ni * c->emb_dim * 4
                       : (size_t)m->r_width * 4;
    TRY(cudaMemcpy2DAsync(dst, pitch, xb, (size_t)d * 4, (size_t)d * 4, n,
                          cudaMemcpyDeviceToDevice, s));
    if (es)
      TRY(cudaMemcpy2DAsync(dst + d, pitch, m->emb, es * 4, es * 4, n,
                            cudaMemcpyDeviceToDevice, s));
    if (c->interaction == DENSE_INTERACT_DOT)
      m->be->interact_dot_forward(n, m->ni, d, c->interaction_itself, m->T,
                                  m->R, m->r_width);
    in = m->R;
    for (int l = nb; l < m->L; l++) {
      linear_fwd(m, n, l, in, l + 1 < m->L);
      in = m->out[l];
    }
    TRY(cudaEventRecord(m->ev[2], s));
    if (logits)
      TRY(cudaMemcpyAsync(m->pin_l + c->max_batch, in, (size_t)n * 4,
                          cudaMemcpyDeviceToHost, s));
    TRY(cudaEventRecord(m->ev[3], s));
  }
  TRY(cudaStreamSynchronize(s));
  if (dense_cuda_error()[0]) goto fail;
  if (logits) memcpy(logits, m->pin_l + c->max_batch, (size_t)n * 4);
  m->fwd_n = n;
  return 0;
fail:
  set_err(err, errlen, "forward");
  return SR_EBACKEND_;
}

static int devm_backward(void *p, int n, const float *labels, float *loss_out,
                         float *d_emb, float *grads, char *err,
                         size_t errlen) {
  devm *m = (devm *)p;
  const dense_config *c = &m->cfg;
  cudaStream_t s = dense_cuda__stream();
  const dense_backend *be = m->be;
  size_t es = m->es;
  int nb = c->n_bot - 1, L = m->L, d = m->d;
  float *gg = m->g0, *h = m->g1, *tmp;
  double loss;
  dense_cuda_error_clear();
  TRY(cudaEventRecord(m->ev[4], s));
  memcpy(m->pin_l, labels, (size_t)n * 4);
  TRY(cudaMemcpyAsync(m->labels, m->pin_l, (size_t)n * 4,
                      cudaMemcpyHostToDevice, s));
  TRY(cudaEventRecord(m->ev[5], s));
  loss = be->bce_logits(n, m->out[L - 1], m->labels, gg); /* gg = dz[n] */
  if (loss_out) *loss_out = (float)loss;
  for (int l = L - 1; l >= 0; l--) {
    const float *in = l == 0 ? m->x_in : l == nb ? m->R : m->out[l - 1];
    int K = m->K[l], N = m->N[l], relu = l < nb || l + 1 < L;
    be->relu_bias_grad(n, N, N, relu ? m->out[l] : NULL, gg,
                       m->grads + m->b_off[l]);
    /* dW[N][K] = dz[n][N]^T in[n][K]; din[n][K] = dz[n][N] W[N][K] */
    be->gemm(1, 0, N, K, n, 1.0f, gg, N, in, K, 0.0f, m->grads + m->w_off[l],
             K);
    if (l > 0)
      be->gemm(0, 0, n, K, N, 1.0f, gg, N, m->params + m->w_off[l], K, 0.0f,
               h, K);
    tmp = gg, gg = h, h = tmp;
    if (l == nb) { /* gg = dR[n][r_width] -> dx_bot[n][d] and d_emb */
      const float *src = gg;
      size_t pitch = (size_t)m->r_width * 4;
      if (c->interaction == DENSE_INTERACT_DOT) {
        be->interact_dot_backward(n, m->ni, d, c->interaction_itself, m->T,
                                  gg, m->r_width, m->dT);
        src = m->dT;
        pitch = (size_t)m->ni * c->emb_dim * 4;
      }
      TRY(cudaMemcpy2DAsync(h, (size_t)d * 4, src, pitch, (size_t)d * 4, n,
                            cudaMemcpyDeviceToDevice, s));
      if (es && d_emb)
        TRY(cudaMemcpy2DAsync(m->d_emb, es * 4, src + d, pitch, es * 4, n,
                              cudaMemcpyDeviceToDevice, s));
      tmp = gg, gg = h, h = tmp;
    }
  }
  TRY(cudaEventRecord(m->ev[6], s));
  TRY(cudaMemcpyAsync(m->pin_p, m->grads, m->n_params * 4,
                      cudaMemcpyDeviceToHost, s));
  if (es && d_emb)
    TRY(cudaMemcpyAsync(m->pin_d, m->d_emb, (size_t)n * es * 4,
                        cudaMemcpyDeviceToHost, s));
  TRY(cudaEventRecord(m->ev[7], s));
  TRY(cudaStreamSynchronize(s));
  if (dense_cuda_error()[0]) goto fail;
  memcpy(grads, m->pin_p, m->n_params * 4);
  if (es && d_emb && d_emb != m->pin_d) memcpy(d_emb, m->pin_d, (size_t)n * es * 4);
  dense_cuda__times_add(
      1e-3 * (ms_between(m->ev[0], m->ev[1]) + ms_between(m->ev[4], m->ev[5])),
      1e-3 * (ms_between(m->ev[1], m->ev[2]) + ms_between(m->ev[5], m->ev[6])),
      1e-3 * (ms_between(m->ev[2], m->ev[3]) + ms_between(m->ev[6], m->ev[7])));
  return 0;
fail:
  set_err(err, errlen, "backward");
  return SR_EBACKEND_;
}

static void devm_batch_buffers(void *p, float **emb, float **d_emb) {
  devm *m = (devm *)p;
  *emb = m->pin_e;
  *d_emb = m->pin_d;
}

static const dense_dev_hooks cuda_hooks = {devm_create, devm_destroy,
                                           devm_forward, devm_backward,
                                           devm_batch_buffers};

void dense_cuda__model_register(const dense_backend *be) {
  dense_dev_hooks_register(be, &cuda_hooks);
}
