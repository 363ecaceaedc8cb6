/* The dense part of a DLRM (facebookresearch/dlrm, dlrm_s_pytorch.py):
 * bottom MLP over the dense features, feature interaction with the pooled
 * embeddings, top MLP to one logit, BCE-with-logits loss.
 *
 *   x_bot[B][bot_last] = MLP_bot(x_dense[B][n_dense])   Linear+ReLU every layer
 *   R = interact(x_bot, emb[B][n_sparse][emb_dim])      dot, cat or dcn
 *   z[B] = MLP_top(R)                                   ReLU between, none last
 *   loss = mean_b max(z,0) - z*y + log1p(exp(-|z|)),    prediction sigmoid(z)
 *
 * All parameters live in one contiguous float buffer (gradients in a second
 * buffer of the same shape), in this order, each layer W[out][in] then b[out]:
 * bottom layers first, then (dcn) the cross layers, each V[rank][W],
 * U[W][rank], b[W], then top layers. Activations are allocated for
 * max_batch at create time; forward/backward never allocate.
 *
 * dcn: the DCN-v2 cross network of DLRM-DCNv2 (TorchRec's LowRankCrossNet):
 * x_0 = [x_bot, emb_1, ..., emb_n_sparse] (W = (1 + n_sparse) * emb_dim),
 * x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l for l < dcn_layers, R = x_L.
 *
 * Threads: on the CPU every kernel runs on the default dense pool
 * (dense/pool.h) in blocks fixed by the shapes, so the thread count changes
 * speed, never bits. A model must not be used by two threads at once.
 *
 * Initialisation (as the reference create_mlp): W ~ N(0, sqrt(2/(in+out))),
 * b ~ N(0, sqrt(1/out)), drawn in double by sr_rng_normal and rounded to float.
 * Streams: key = sr_mix64(seed ^ DENSE_INIT_SALT); layer l (bottom layers
 * 0..n_bot-2, then top layers continuing the count) draws W row-major from
 * stream 2l and b from stream 2l+1. The same seed gives the same bits.
 * Cross layer l (as LowRankCrossNet: xavier-normal V and U, zero bias):
 * V and U ~ N(0, sqrt(2/(W+rank))), V from stream 2l and U from stream 2l+1
 * of key sr_mix64(seed ^ DENSE_CROSS_SALT), b = 0; the bottom and top
 * layers draw as in a dot model. */
#ifndef SHARDREC_DENSE_MODEL_H
#define SHARDREC_DENSE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dense/backend.h"

#define DENSE_MAX_LAYERS 16
#define DENSE_INIT_SALT 0x64656e73652d696eULL /* "dense-in" */
#define DENSE_CROSS_SALT 0x64636e2d63726f73ULL /* "dcn-cros" */
#define DENSE_MAX_CROSS 16        /* cross layers */
#define DENSE_MAX_CROSS_RANK 65536 /* their rank */

enum { DENSE_INTERACT_DOT = 0, DENSE_INTERACT_CAT = 1, DENSE_INTERACT_DCN = 2 };

typedef struct {
  int n_dense;                  /* dense features (13 for Criteo) */
  int bot[DENSE_MAX_LAYERS];    /* widths incl. input: 13-512-256-64-16 */
  int n_bot;                    /* entries in bot (>= 2) */
  int top[DENSE_MAX_LAYERS];    /* widths after the interaction: 512-256-1 */
  int n_top;                    /* entries in top (>= 1), top[n_top-1] == 1 */
  int n_sparse;                 /* pooled embedding vectors per sample (26) */
  int emb_dim;                  /* their width (16) */
  int interaction;              /* DENSE_INTERACT_DOT, _CAT or _DCN */
  int interaction_itself;       /* dot only: include the diagonal of T T^T */
  int dcn_layers;               /* dcn only (else 0): 1..DENSE_MAX_CROSS */
  int dcn_rank;                 /* dcn only (else 0): 1..DENSE_MAX_CROSS_RANK */
  int max_batch;                /* activations are sized for this */
} dense_config;

typedef struct dense_model dense_model;

/* Check a configuration; 0 or SR_EINVAL with the reason in err. */
int dense_config_validate(const dense_config *cfg, char *err, size_t errlen);

/* Width of the top MLP's input: bot_last + pairs (dot) or
 * bot_last + n_sparse*emb_dim (cat, dcn). -1 for an invalid configuration. */
int dense_config_top_input(const dense_config *cfg);

/* Number of parameters (floats) of the configuration. */
size_t dense_config_param_count(const dense_config *cfg);

/* Create a model with freshly initialised parameters (see above) on the CPU
 * backend. Returns NULL with the reason in err (may be NULL) on a bad
 * configuration or out of memory. The caller owns the model. */
dense_model *dense_model_create(const dense_config *cfg, uint64_t seed,
                                char *err, size_t errlen);

/* Same, on a given backend (borrowed; must outlive the model). A dcn
 * configuration on a backend without the cross-network kernels (a device
 * backend: CUDA) is refused, NULL with "runs on the CPU only" in err. */
dense_model *dense_model_create_on(const dense_config *cfg, uint64_t seed,
                                   const dense_backend *be, char *err,
                                   size_t errlen);

void dense_model_destroy(dense_model *m); /* NULL-safe */

const dense_config *dense_model_config(const dense_model *m);
/* Text of the model's last error ("" if none); owned by the model. */
const char *dense_model_errmsg(const dense_model *m);

/* Forward n <= max_batch samples. x_dense[n][n_dense] and emb[n][n_sparse]
 * [emb_dim] are copied in (borrowed only for the call); logits[n] (may be
 * NULL) receives z. Returns 0, SR_EINVAL (bad n or pointer). */
int dense_model_forward(dense_model *m, int n, const float *x_dense,
                        const float *emb, float *logits);

/* Backward of the last forward (same n). labels[n] in {0,1} (any value in
 * [0,1] works). Writes the mean BCE loss to *loss_out (may be NULL), the
 * gradient of the MEAN loss w.r.t. emb into d_emb[n][n_sparse][emb_dim] (may
 * be NULL) and overwrites the parameter gradient buffer. Returns 0,
 * SR_EINVAL, or SR_ESTATE if no forward of n samples preceded it. */
int dense_model_backward(dense_model *m, int n, const float *labels,
                         float *loss_out, float *d_emb);

/* dense_model_backward, calling ready(ctx, loss) once d_emb and the loss
 * are whole, before the bottom MLP's backward (a device model: after the
 * whole backward), so that work on d_emb (a push to shard servers) runs
 * beside the rest; ready may read d_emb but not change the model. The
 * bottom MLP reads neither d_emb nor the embedding rows: the bits are
 * dense_model_backward's. A nonzero return from ready stops the backward
 * there (the parameter gradients are then incomplete) and is returned. */
int dense_model_backward_ready(dense_model *m, int n, const float *labels, float *loss_out,
                               float *d_emb, int (*ready)(void *ctx, float loss), void *ctx);

/* Host buffers for one batch's emb and d_emb ([max_batch][n_sparse]
 * [emb_dim] floats each, owned by the model) that forward reads and backward
 * writes without a copy of their own: a device model's page-locked staging
 * buffers, which its transfers use directly. A forward handed another emb
 * copies it into the first, and a backward handed another d_emb passes
 * through the second: whoever lends them out (the trainer) must be the
 * model's only caller. Returns 0, or -1 where the model has none (the CPU
 * backend: any buffer is as good). */
int dense_model_batch_buffers(dense_model *m, float **emb, float **d_emb);

/* The parameter / gradient buffers (owned by the model), count floats. */
float *dense_model_params(dense_model *m, size_t *count);
float *dense_model_grads(dense_model *m, size_t *count);

/* A named tensor inside the parameter buffer: "bot.0.W", "cross.0.V",
 * "cross.0.U", "cross.0.b", "top.2.b", ... in buffer order; offset and
 * shape in floats; rows = out, cols = in (cols = 1 for biases). */
typedef struct {
  char name[32];
  size_t offset;
  int rows, cols;
} dense_tensor_info;
/* Number of tensors (2 per layer, 3 per cross layer); fills info[0..cap)
 * if info != NULL. */
int dense_model_tensors(const dense_model *m, dense_tensor_info *info, int cap);

/* Saving and loading the parameters (with the optimizer's state or
 * without): dense/state_file.h. */

/* --- for benchmarks -------------------------------------------------------- */

/* FLOPs of one sample's forward + backward (2 per multiply-add): every
 * linear layer 2*K*N forward, 2*K*N for dW, 2*K*N for din except the first
 * bottom layer; the dot interaction 2*d per pair forward, 4*d backward;
 * a cross layer 2 products of 2*W*rank forward, 4 backward. */
double dense_model_flops_per_sample(const dense_config *cfg);

typedef struct {
  int trans_a, trans_b; /* as dense_backend.gemm (row-major) */
  int M, N, K;
} dense_gemm_shape;

/* The sgemm calls one training step performs at batch B, in order (forward,
 * then backward): bottom, cross, top forward; top, cross, bottom backward.
 * Returns the count; fills out[0..cap) when out != NULL. */
int dense_model_gemm_shapes(const dense_config *cfg, int B,
                            dense_gemm_shape *out, int cap);

#endif
