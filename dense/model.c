/* DLRM dense part: parameters in one buffer, activations preallocated. */
#include "dense/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/status.h"
#include "dense/device.h"
#include "dense/layers.h"

struct dense_model {
  dense_config cfg;
  const dense_backend *be;
  int r_width;   /* top MLP input width */
  int ni;        /* interaction vectors: 1 + n_sparse */
  int n_layers;  /* (n_bot - 1) + n_top */
  /* per layer l (bottom then top): shapes and offsets into params */
  int K[2 * DENSE_MAX_LAYERS], N[2 * DENSE_MAX_LAYERS];
  size_t w_off[2 * DENSE_MAX_LAYERS], b_off[2 * DENSE_MAX_LAYERS];
  size_t n_params;
  float *params; /* [n_params], owned */
  float *grads;  /* [n_params], owned */
  float *acts;   /* one owned block holding everything below */
  float *x_in;   /* [max_batch][n_dense] */
  float *out[2 * DENSE_MAX_LAYERS]; /* layer outputs [max_batch][N[l]] */
  float *T;      /* dot: [max_batch][ni][emb_dim] */
  float *R;      /* [max_batch][r_width] */
  float *dT;     /* dot: [max_batch][ni][emb_dim] */
  float *g0, *g1; /* gradient ping-pong [max_batch][max width] */
  /* dcn: cross layer l's V, U, b in params, and its activations */
  int n_cross, rank;
  size_t cv_off[DENSE_MAX_CROSS], cu_off[DENSE_MAX_CROSS], cb_off[DENSE_MAX_CROSS];
  float *X[DENSE_MAX_CROSS]; /* layer outputs x_{l+1} [max_batch][r_width] */
  float *P[DENSE_MAX_CROSS]; /* V x_l [max_batch][rank] */
  float *Q[DENSE_MAX_CROSS]; /* U P + b [max_batch][r_width] */
  float *dp;     /* [max_batch][rank] */
  float *acc;    /* gradient w.r.t. x_0 [max_batch][r_width] */
  int fwd_n;     /* batch of the last forward, 0 if none */
  /* A device backend (device.h): its hooks and the device half of the
   * model; NULL on the CPU. params/grads above stay the host copies. */
  const dense_dev_hooks *dev_hooks;
  void *dev; /* owned through dev_hooks */
  char errmsg[256];
};

/* ---- configuration -------------------------------------------------------- */

/* The cross network's part of dense_config_validate. */
static int validate_dcn(const dense_config *c, char *err, size_t errlen) {
  if (c->interaction != DENSE_INTERACT_DCN) {
    if (c->dcn_layers || c->dcn_rank) {
      sr_fmt(err, errlen, "dcn_layers and dcn_rank apply to the dcn interaction only");
      return SR_EINVAL;
    }
    return SR_OK;
  }
  if (c->bot[c->n_bot - 1] != c->emb_dim) {
    sr_fmt(err, errlen,
           "dcn interaction needs the last bottom MLP width (%d) to equal "
           "the embedding dimension (%d)",
           c->bot[c->n_bot - 1], c->emb_dim);
    return SR_EINVAL;
  }
  if (c->dcn_layers < 1 || c->dcn_layers > DENSE_MAX_CROSS || c->dcn_rank < 1 ||
      c->dcn_rank > DENSE_MAX_CROSS_RANK) {
    sr_fmt(err, errlen, "dcn needs 1..%d cross layers (got %d) of rank 1..%d (got %d)",
           DENSE_MAX_CROSS, c->dcn_layers, DENSE_MAX_CROSS_RANK, c->dcn_rank);
    return SR_EINVAL;
  }
  return SR_OK;
}

int dense_config_validate(const dense_config *c, char *err, size_t errlen) {
  if (!c) {
    sr_fmt(err, errlen, "dense config is NULL");
    return SR_EINVAL;
  }
  if (c->n_bot < 2 || c->n_bot > DENSE_MAX_LAYERS) {
    sr_fmt(err, errlen,
           "bottom MLP needs 2..%d widths including the input (got %d)",
           DENSE_MAX_LAYERS, c->n_bot);
    return SR_EINVAL;
  }
  if (c->n_top < 1 || c->n_top > DENSE_MAX_LAYERS) {
    sr_fmt(err, errlen, "top MLP needs 1..%d widths (got %d)",
           DENSE_MAX_LAYERS, c->n_top);
    return SR_EINVAL;
  }
  for (int i = 0; i < c->n_bot; i++)
    if (c->bot[i] < 1) {
      sr_fmt(err, errlen, "bottom MLP width %d is %d; widths must be >= 1", i,
             c->bot[i]);
      return SR_EINVAL;
    }
  for (int i = 0; i < c->n_top; i++)
    if (c->top[i] < 1) {
      sr_fmt(err, errlen, "top MLP width %d is %d; widths must be >= 1", i,
             c->top[i]);
      return SR_EINVAL;
    }
  if (c->bot[0] != c->n_dense) {
    sr_fmt(err, errlen,
           "bottom MLP input width %d differs from the number of dense "
           "features %d (--arch-mlp-bot must start with it)",
           c->bot[0], c->n_dense);
    return SR_EINVAL;
  }
  if (c->top[c->n_top - 1] != 1) {
    sr_fmt(err, errlen,
           "top MLP must end in width 1 (one logit); got %d (--arch-mlp-top)",
           c->top[c->n_top - 1]);
    return SR_EINVAL;
  }
  if (c->n_sparse < 0 || c->emb_dim < 1) {
    sr_fmt(err, errlen, "n_sparse %d / emb_dim %d out of range", c->n_sparse,
           c->emb_dim);
    return SR_EINVAL;
  }
  if (c->interaction == DENSE_INTERACT_DOT) {
    if (c->bot[c->n_bot - 1] != c->emb_dim) {
      sr_fmt(err, errlen,
             "dot interaction needs the last bottom MLP width (%d) to equal "
             "the embedding dimension (%d)",
             c->bot[c->n_bot - 1], c->emb_dim);
      return SR_EINVAL;
    }
  } else if (c->interaction == DENSE_INTERACT_CAT ||
             c->interaction == DENSE_INTERACT_DCN) {
    if (c->interaction_itself) {
      sr_fmt(err, errlen, "interaction_itself applies to dot only");
      return SR_EINVAL;
    }
  } else {
    sr_fmt(err, errlen, "unknown interaction %d (dot=%d, cat=%d, dcn=%d)",
           c->interaction, DENSE_INTERACT_DOT, DENSE_INTERACT_CAT,
           DENSE_INTERACT_DCN);
    return SR_EINVAL;
  }
  if (validate_dcn(c, err, errlen) != SR_OK) return SR_EINVAL;
  if (c->max_batch < 1) {
    sr_fmt(err, errlen, "max_batch must be >= 1 (got %d)", c->max_batch);
    return SR_EINVAL;
  }
  if (dense_config_top_input(c) < 1) {
    sr_fmt(err, errlen, "top MLP input width overflows");
    return SR_EINVAL;
  }
  return SR_OK;
}

int dense_config_top_input(const dense_config *c) {
  if (!c || c->n_bot < 2 || c->n_bot > DENSE_MAX_LAYERS) return -1;
  long long d = c->bot[c->n_bot - 1], w;
  if (c->interaction == DENSE_INTERACT_DOT) {
    long long ni = (long long)c->n_sparse + 1;
    w = d + ni * (ni - 1) / 2 + (c->interaction_itself ? ni : 0);
  } else if (c->interaction == DENSE_INTERACT_CAT ||
             c->interaction == DENSE_INTERACT_DCN) {
    w = d + (long long)c->n_sparse * c->emb_dim;
  } else {
    return -1;
  }
  return w > (1 << 30) ? -1 : (int)w;
}

/* Layer shapes (bottom then top); returns the layer count. */
static int layer_shapes(const dense_config *c, int *K, int *N) {
  int L = 0;
  for (int i = 0; i + 1 < c->n_bot; i++, L++) {
    K[L] = c->bot[i];
    N[L] = c->bot[i + 1];
  }
  int in = dense_config_top_input(c);
  for (int i = 0; i < c->n_top; i++, L++) {
    K[L] = in;
    N[L] = c->top[i];
    in = c->top[i];
  }
  return L;
}

size_t dense_config_param_count(const dense_config *c) {
  int K[2 * DENSE_MAX_LAYERS], N[2 * DENSE_MAX_LAYERS];
  if (dense_config_validate(c, NULL, 0) != SR_OK) return 0;
  int L = layer_shapes(c, K, N);
  size_t n = 0, W = (size_t)dense_config_top_input(c);
  for (int l = 0; l < L; l++) n += (size_t)N[l] * K[l] + N[l];
  return n + (size_t)c->dcn_layers * (2 * W * (size_t)c->dcn_rank + W);
}

/* Layer l of m through the shared layer code (dense/layers.h): forward
 * out[l][n][N] = act(in W^T + b); backward from dout[n][N] (ReLU backward
 * in place when relu) into its gradients and din[n][K] (may be NULL),
 * returning 1 when din came out masked by the ReLU below (din_relu: in is
 * that ReLU's output), so that the layer below is called with relu 0. */
static void linear_forward(dense_model *m, int n, int l, const float *in, int relu) {
  dense_linear_forward(m->be, n, m->K[l], m->N[l], in, m->params + m->w_off[l],
                       m->params + m->b_off[l], relu, m->out[l]);
}

static int linear_backward(dense_model *m, int n, int l, const float *in, int relu,
                           float *dout, float *din, int din_relu) {
  return dense_linear_backward(m->be, n, m->K[l], m->N[l], in, m->params + m->w_off[l],
                               m->out[l], relu, dout, m->grads + m->w_off[l],
                               m->grads + m->b_off[l], din, din_relu);
}

/* ---- create / destroy ----------------------------------------------------- */

static void init_params(dense_model *m, uint64_t seed) {
  uint64_t key = sr_mix64(seed ^ DENSE_INIT_SALT);
  for (int l = 0; l < m->n_layers; l++) {
    int K = m->K[l], N = m->N[l];
    sr_rng r;
    /* as the reference: W ~ N(0, sqrt(2/(m+n))), b ~ N(0, sqrt(1/m)) */
    double sw = sqrt(2.0 / (double)(K + N)), sb = sqrt(1.0 / (double)N);
    float *W = m->params + m->w_off[l], *b = m->params + m->b_off[l];
    sr_rng_init(&r, key, 2 * (uint64_t)l);
    for (size_t i = 0; i < (size_t)N * K; i++)
      W[i] = (float)(sw * sr_rng_normal(&r));
    sr_rng_init(&r, key, 2 * (uint64_t)l + 1);
    for (int i = 0; i < N; i++) b[i] = (float)(sb * sr_rng_normal(&r));
  }
  /* cross layers as LowRankCrossNet: xavier-normal V and U, zero bias */
  uint64_t ckey = sr_mix64(seed ^ DENSE_CROSS_SALT);
  size_t W = (size_t)m->r_width, R = (size_t)m->rank;
  double sx = sqrt(2.0 / (double)(W + R));
  for (int l = 0; l < m->n_cross; l++) {
    sr_rng r;
    float *V = m->params + m->cv_off[l], *U = m->params + m->cu_off[l];
    sr_rng_init(&r, ckey, 2 * (uint64_t)l);
    for (size_t i = 0; i < R * W; i++) V[i] = (float)(sx * sr_rng_normal(&r));
    sr_rng_init(&r, ckey, 2 * (uint64_t)l + 1);
    for (size_t i = 0; i < W * R; i++) U[i] = (float)(sx * sr_rng_normal(&r));
    memset(m->params + m->cb_off[l], 0, W * sizeof(float));
  }
}

/* Offsets of every tensor in the one buffer: bottom layers, cross layers,
 * top layers; the widest activation into *maxw. Returns the float count. */
static size_t lay_out(dense_model *m, int *maxw) {
  size_t off = 0, W = (size_t)m->r_width, R = (size_t)m->rank;
  int nb = m->cfg.n_bot - 1;
  for (int l = 0; l < m->n_layers; l++) {
    for (int x = 0; l == nb && x < m->n_cross; x++) {
      m->cv_off[x] = off, off += R * W;
      m->cu_off[x] = off, off += W * R;
      m->cb_off[x] = off, off += W;
    }
    m->w_off[l] = off;
    off += (size_t)m->N[l] * m->K[l];
    m->b_off[l] = off;
    off += m->N[l];
    if (m->N[l] > *maxw) *maxw = m->N[l];
  }
  return off;
}

/* dcn: the cross layers' activations from p on; returns p past them. */
static float *cross_acts(dense_model *m, float *p) {
  size_t B = (size_t)m->cfg.max_batch, W = (size_t)m->r_width, R = (size_t)m->rank;
  for (int l = 0; l < m->n_cross; l++) {
    m->X[l] = p, p += B * W;
    m->P[l] = p, p += B * R;
    m->Q[l] = p, p += B * W;
  }
  if (m->n_cross) {
    m->dp = p, p += B * R;
    m->acc = p, p += B * W;
  }
  return p;
}

dense_model *dense_model_create(const dense_config *cfg, uint64_t seed,
                                char *err, size_t errlen) {
  return dense_model_create_on(cfg, seed, dense_backend_default(), err,
                               errlen);
}

dense_model *dense_model_create_on(const dense_config *cfg, uint64_t seed,
                                   const dense_backend *be, char *err,
                                   size_t errlen) {
  if (dense_config_validate(cfg, err, errlen) != SR_OK) return NULL;
  if (!be) {
    sr_fmt(err, errlen, "no backend");
    return NULL;
  }
  if (cfg->interaction == DENSE_INTERACT_DCN && (dense_dev_hooks_of(be) || !be->cross_forward)) {
    sr_fmt(err, errlen, "the dcn interaction (cross network) runs on the CPU only; "
           "backend %s has no cross-network kernels (use --device cpu)", be->name);
    return NULL;
  }
  dense_model *m = calloc(1, sizeof *m);
  if (!m) goto oom;
  m->cfg = *cfg;
  m->be = be;
  m->r_width = dense_config_top_input(cfg);
  m->ni = cfg->n_sparse + 1;
  m->n_layers = layer_shapes(cfg, m->K, m->N);
  m->n_cross = cfg->dcn_layers, m->rank = cfg->dcn_rank;
  int maxw = cfg->n_dense > m->r_width ? cfg->n_dense : m->r_width;
  size_t off = lay_out(m, &maxw);
  m->n_params = off;
  m->params = calloc(off, sizeof(float));
  m->grads = calloc(off, sizeof(float));
  if (!m->params || !m->grads) goto oom;

  m->dev_hooks = dense_dev_hooks_of(be);
  if (m->dev_hooks) { /* activations live on the device */
    init_params(m, seed);
    dense_dev_layout lay = {cfg,      m->n_layers, m->K,       m->N,
                            m->w_off, m->b_off,    m->n_params, m->r_width};
    m->dev = m->dev_hooks->create(be, &lay, err, errlen);
    if (!m->dev) {
      dense_model_destroy(m);
      return NULL;
    }
    return m;
  }

  size_t B = (size_t)cfg->max_batch, tsz = 0;
  if (cfg->interaction == DENSE_INTERACT_DOT) tsz = B * m->ni * cfg->emb_dim;
  size_t total = B * cfg->n_dense + B * m->r_width + 2 * tsz + 2 * B * maxw;
  for (int l = 0; l < m->n_layers; l++) total += B * m->N[l];
  if (m->n_cross) /* X, P, Q per layer; dp, acc */
    total += B * ((size_t)m->n_cross * (2 * m->r_width + m->rank) + m->rank + m->r_width);
  m->acts = malloc(total * sizeof(float));
  if (!m->acts) goto oom;
  memset(m->acts, 0, total * sizeof(float)); /* pre-fault every page now */
  float *p = m->acts;
  m->x_in = p, p += B * cfg->n_dense;
  for (int l = 0; l < m->n_layers; l++) m->out[l] = p, p += B * m->N[l];
  m->R = p, p += B * m->r_width;
  m->T = tsz ? p : NULL, p += tsz;
  m->dT = tsz ? p : NULL, p += tsz;
  m->g0 = p, p += B * maxw;
  m->g1 = p, p += B * maxw;
  cross_acts(m, p);

  init_params(m, seed);
  return m;
oom:
  sr_fmt(err, errlen, "out of memory creating the dense model");
  dense_model_destroy(m);
  return NULL;
}

void dense_model_destroy(dense_model *m) {
  if (!m) return;
  if (m->dev_hooks) m->dev_hooks->destroy(m->dev);
  free(m->params);
  free(m->grads);
  free(m->acts);
  free(m);
}

const dense_config *dense_model_config(const dense_model *m) {
  return &m->cfg;
}
const char *dense_model_errmsg(const dense_model *m) { return m->errmsg; }

float *dense_model_params(dense_model *m, size_t *count) {
  if (count) *count = m->n_params;
  return m->params;
}
float *dense_model_grads(dense_model *m, size_t *count) {
  if (count) *count = m->n_params;
  return m->grads;
}

/* Cross layer x's three tensors into info[t..t+3) (those below cap). */
static int cross_tensors(const dense_model *m, int x, dense_tensor_info *info, int t, int cap) {
  const char *nm[3] = {"V", "U", "b"};
  size_t off[3] = {m->cv_off[x], m->cu_off[x], m->cb_off[x]};
  int rows[3] = {m->rank, m->r_width, m->r_width}, cols[3] = {m->r_width, m->rank, 1};
  for (int k = 0; k < 3; k++, t++) {
    if (!info || t >= cap) continue;
    snprintf(info[t].name, sizeof info[t].name, "cross.%d.%s", x, nm[k]);
    info[t].offset = off[k], info[t].rows = rows[k], info[t].cols = cols[k];
  }
  return t;
}

int dense_model_tensors(const dense_model *m, dense_tensor_info *info,
                        int cap) {
  int nb = m->cfg.n_bot - 1, t = 0;
  for (int l = 0; l < m->n_layers; l++) {
    for (int x = 0; l == nb && x < m->n_cross; x++) t = cross_tensors(m, x, info, t, cap);
    const char *part = l < nb ? "bot" : "top";
    int idx = l < nb ? l : l - nb;
    for (int k = 0; k < 2; k++, t++) {
      if (!info || t >= cap) continue;
      snprintf(info[t].name, sizeof info[t].name, "%s.%d.%c", part, idx,
               k ? 'b' : 'W');
      info[t].offset = k ? m->b_off[l] : m->w_off[l];
      info[t].rows = m->N[l];
      info[t].cols = k ? 1 : m->K[l];
    }
  }
  return t;
}

/* ---- forward / backward --------------------------------------------------- */

/* The top MLP's input: R, or the last cross layer's output. */
static const float *top_in(const dense_model *m) {
  return m->n_cross ? m->X[m->n_cross - 1] : m->R;
}

/* The cross layers' backward from g = d x_L[n][W] (overwritten), h[n][W]
 * scratch; returns d x_0 (m->acc). */
static const float *cross_backward(dense_model *m, int n, float *g, float *h) {
  for (int x = m->n_cross - 1; x >= 0; x--)
    dense_cross_backward(m->be, n, m->r_width, m->rank, m->R, x ? m->X[x - 1] : m->R,
                         m->params + m->cv_off[x], m->params + m->cu_off[x], m->P[x], m->Q[x],
                         g, h, m->dp, m->acc, x == m->n_cross - 1, x == 0,
                         m->grads + m->cv_off[x], m->grads + m->cu_off[x],
                         m->grads + m->cb_off[x]);
  return m->acc;
}

int dense_model_forward(dense_model *m, int n, const float *x_dense,
                        const float *emb, float *logits) {
  const dense_config *c = &m->cfg;
  if (n < 1 || n > c->max_batch || !x_dense || (!emb && c->n_sparse > 0)) {
    sr_fmt(m->errmsg, sizeof m->errmsg,
           "forward: batch %d outside [1, %d] or NULL input", n, c->max_batch);
    return SR_EINVAL;
  }
  if (m->dev) {
    m->fwd_n = 0;
    int rc = m->dev_hooks->forward(m->dev, m->params, n, x_dense, emb, logits,
                                   m->errmsg, sizeof m->errmsg);
    if (rc == SR_OK) m->fwd_n = n;
    return rc;
  }
  int nb = c->n_bot - 1, d = c->bot[c->n_bot - 1];
  size_t es = (size_t)c->n_sparse * c->emb_dim; /* floats of emb per sample */
  m->fwd_n = 0; /* activations are being overwritten */
  memcpy(m->x_in, x_dense, sizeof(float) * n * c->n_dense);

  /* bottom MLP: Linear + ReLU on every layer (sigmoid_bot = -1) */
  const float *in = m->x_in;
  for (int l = 0; l < nb; l++) {
    linear_forward(m, n, l, in, 1);
    in = m->out[l];
  }
  const float *xb = in; /* [n][d] */

  /* interaction -> R[n][r_width] (dcn: x_0) */
  if (c->interaction == DENSE_INTERACT_DOT) {
    dense_interact_dot_forward(m->be, n, m->ni, c->emb_dim, c->interaction_itself, xb, emb,
                               m->T, m->R, m->r_width); /* T[n][ni][d] = [xb[b], emb[b]] */
  } else { /* cat, dcn: [x_bot, emb] */
    for (int b = 0; b < n; b++) {
      float *r = m->R + (size_t)b * m->r_width;
      memcpy(r, xb + (size_t)b * d, sizeof(float) * d);
      memcpy(r + d, emb + b * es, sizeof(float) * es);
    }
  }

  /* dcn: x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l */
  for (int x = 0; x < m->n_cross; x++)
    dense_cross_forward(m->be, n, m->r_width, m->rank, m->R, x ? m->X[x - 1] : m->R,
                        m->params + m->cv_off[x], m->params + m->cu_off[x],
                        m->params + m->cb_off[x], m->P[x], m->Q[x], m->X[x]);

  /* top MLP: ReLU between layers, none after the last (it is the logit) */
  in = top_in(m);
  for (int l = nb; l < m->n_layers; l++) {
    linear_forward(m, n, l, in, l + 1 < m->n_layers);
    in = m->out[l];
  }
  if (logits) memcpy(logits, in, sizeof(float) * n);
  m->fwd_n = n;
  return SR_OK;
}

int dense_model_batch_buffers(dense_model *m, float **emb, float **d_emb) {
  if (!m->dev || !m->dev_hooks->batch_buffers) return -1;
  m->dev_hooks->batch_buffers(m->dev, emb, d_emb);
  return 0;
}

int dense_model_backward(dense_model *m, int n, const float *labels,
                         float *loss_out, float *d_emb) {
  return dense_model_backward_ready(m, n, labels, loss_out, d_emb, NULL, NULL);
}

int dense_model_backward_ready(dense_model *m, int n, const float *labels, float *loss_out,
                               float *d_emb, int (*ready)(void *ctx, float loss), void *ctx) {
  const dense_config *c = &m->cfg;
  if (!labels || n < 1) {
    sr_fmt(m->errmsg, sizeof m->errmsg, "backward: NULL labels or batch %d",
           n);
    return SR_EINVAL;
  }
  if (m->fwd_n != n) {
    sr_fmt(m->errmsg, sizeof m->errmsg,
           "backward of %d samples without a forward of %d", n, n);
    return SR_ESTATE;
  }
  if (m->dev) {
    float loss = 0;
    int rc = m->dev_hooks->backward(m->dev, n, labels, &loss, d_emb, m->grads, m->errmsg,
                                    sizeof m->errmsg);
    if (loss_out) *loss_out = loss;
    return rc || !ready ? rc : ready(ctx, loss);
  }
  const dense_backend *be = m->be;
  int nb = c->n_bot - 1, L = m->n_layers, d = c->bot[c->n_bot - 1];
  size_t es = (size_t)c->n_sparse * c->emb_dim;
  float *g = m->g0, *h = m->g1, *tmp;

  float loss = (float)be->bce_logits(n, m->out[L - 1], labels, g); /* g = dz[n] */
  if (loss_out) *loss_out = loss;

  /* top MLP, last layer first; the last din is dR[n][r_width]. masked: g
   * has had its ReLU backward already (in the product that formed it). */
  int masked = 0;
  for (int l = L - 1; l >= nb; l--) {
    const float *in = l == nb ? top_in(m) : m->out[l - 1];
    masked = linear_backward(m, n, l, in, l + 1 < L && !masked, g, h, l > nb);
    tmp = g, g = h, h = tmp;
  }

  /* interaction backward: g = dR -> h = dx_bot[n][d], d_emb */
  if (c->interaction == DENSE_INTERACT_DOT) {
    dense_interact_dot_backward(m->be, n, m->ni, c->emb_dim, c->interaction_itself, m->T, g,
                                m->r_width, m->dT, h, d_emb);
  } else { /* cat: dR is d[x_bot, emb]; dcn: d x_0, gathered in acc */
    const float *dx0 = m->n_cross ? cross_backward(m, n, g, h) : g;
    for (int b = 0; b < n; b++) {
      const float *dr = dx0 + (size_t)b * m->r_width;
      memcpy(h + (size_t)b * d, dr, sizeof(float) * d);
      if (d_emb) memcpy(d_emb + b * es, dr + d, sizeof(float) * es);
    }
  }
  tmp = g, g = h, h = tmp;
  int rc = ready ? ready(ctx, loss) : 0;
  if (rc) return rc;

  /* bottom MLP (the interaction's gradient is not masked: masked is 0);
   * the first layer needs no input gradient */
  for (int l = nb - 1; l >= 0; l--) {
    const float *in = l == 0 ? m->x_in : m->out[l - 1];
    masked = linear_backward(m, n, l, in, !masked, g, l == 0 ? NULL : h, 1);
    tmp = g, g = h, h = tmp;
  }
  return SR_OK;
}

/* ---- FLOPs and gemm shapes ------------------------------------------------ */

double dense_model_flops_per_sample(const dense_config *c) {
  int K[2 * DENSE_MAX_LAYERS], N[2 * DENSE_MAX_LAYERS];
  if (dense_config_validate(c, NULL, 0) != SR_OK) return 0.0;
  int L = layer_shapes(c, K, N);
  double f = 0.0;
  for (int l = 0; l < L; l++) f += (l == 0 ? 4.0 : 6.0) * K[l] * N[l];
  f += 12.0 * c->dcn_layers * (double)dense_config_top_input(c) * c->dcn_rank;
  if (c->interaction == DENSE_INTERACT_DOT)
    f += 6.0 * c->emb_dim *
         (double)dense_interact_dot_pairs(c->n_sparse + 1,
                                          c->interaction_itself);
  return f;
}

int dense_model_gemm_shapes(const dense_config *c, int B,
                            dense_gemm_shape *out, int cap) {
  int K[2 * DENSE_MAX_LAYERS], N[2 * DENSE_MAX_LAYERS], t = 0;
  if (dense_config_validate(c, NULL, 0) != SR_OK) return 0;
  int L = layer_shapes(c, K, N);
#define PUT(ta, tb, m_, n_, k_)                                            \
  do {                                                                     \
    if (out && t < cap) out[t] = (dense_gemm_shape){ta, tb, m_, n_, k_};   \
    t++;                                                                   \
  } while (0)
  int nb = c->n_bot - 1, W = dense_config_top_input(c), R = c->dcn_rank;
  for (int l = 0; l < L; l++) {
    for (int x = 0; l == nb && x < c->dcn_layers; x++) { /* dense_cross_forward */
      PUT(0, 1, B, R, W);
      PUT(0, 1, B, W, R);
    }
    PUT(0, 1, B, N[l], K[l]);
  }
  for (int l = L - 1; l >= 0; l--) {
    PUT(1, 0, N[l], K[l], B);
    if (l > 0) PUT(0, 0, B, K[l], N[l]);
    for (int x = 0; l == nb && x < c->dcn_layers; x++) { /* dense_cross_backward */
      PUT(1, 0, W, R, B);
      PUT(0, 0, B, R, W);
      PUT(1, 0, R, W, B);
      PUT(0, 0, B, W, R);
    }
  }
#undef PUT
  return t;
}
