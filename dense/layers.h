/* Layers of the DLRM dense part, built on a dense_backend. Used by
 * dense_model and by the tests, which check each against finite differences.
 *
 * Interaction order (as the reference dlrm_s_pytorch.py, interact_features):
 * T = [x_bot; e_1; ...; e_{ni-1}] (ni vectors of width d), Z = T T^T,
 * Zflat = Z[li, lj] with pairs enumerated
 *     for i in range(ni): for j in range(i + offset): (i, j)
 * offset = 0 (strict lower triangle) or 1 (--arch-interaction-itself: the
 * diagonal too). R = [x_bot, Zflat]: width d + ni*(ni-1)/2 (+ ni).
 *
 * Cross network (dcn): x_0 = [x_bot, e_1, ..., e_{ni-1}] (width W = ni*d),
 * then dcn_layers cross layers (below); the top MLP reads the last one's
 * output. */
#ifndef SHARDREC_DENSE_LAYERS_H
#define SHARDREC_DENSE_LAYERS_H

#include "dense/backend.h"

/* Linear (+ReLU): out[B][N] = act(in[B][K] * W[N][K]^T + b[N]).
 * Borrowed pointers; out must not alias in. */
void dense_linear_forward(const dense_backend *be, int B, int K, int N,
                          const float *in, const float *W, const float *b,
                          int relu, float *out);

/* Backward of dense_linear_forward. dout[B][N] is the gradient w.r.t. out
 * (the post-activation output); it is overwritten by the pre-activation
 * gradient (relu: masked by out > 0; pass 0 when dout is masked already).
 * Writes (overwrites) dW[N][K] = dz^T * in, db[N] = colsum(dz) and, unless
 * din is NULL, din[B][K] = dz * W. out is the forward's output.
 * din_relu: in is a ReLU's output, and din may be masked by in > 0 (the
 * layer below's ReLU backward) as each block of it is formed, while in
 * cache. Returns 1 when din was masked so (the CPU kernel sets), else 0;
 * the bits are those of masking it afterwards. */
int dense_linear_backward(const dense_backend *be, int B, int K, int N,
                          const float *in, const float *W, const float *out,
                          int relu, float *dout, float *dW, float *db,
                          float *din, int din_relu);

/* The dot interaction of the bottom MLP's output xb[B][d] with the pooled
 * embeddings emb[B][ni-1][d]: T[b] = [xb[b], emb[b]] gathered into
 * T[B][ni][d] (kept for the backward), then the backend's
 * interact_dot_forward into R. The CPU kernel sets gather each block of
 * samples in the task that computes it. */
void dense_interact_dot_forward(const dense_backend *be, int B, int ni, int d, int itself,
                                const float *xb, const float *emb, float *T, float *R,
                                int r_stride);

/* Its backward: interact_dot_backward from dR into dT[B][ni][d], then
 * dT[b] scattered to dxb[b] (width d; not NULL) and, unless NULL, d_emb[b]
 * (width (ni-1) d), by each block's task on the CPU. */
void dense_interact_dot_backward(const dense_backend *be, int B, int ni, int d, int itself,
                                 const float *T, const float *dR, int r_stride, float *dT,
                                 float *dxb, float *d_emb);

/* DCN-v2 cross layer (TorchRec's LowRankCrossNet, one layer), rows of width
 * W, rank R: out[B][W] = x0 * (xl V^T U^T + b) + xl, with V[R][W], U[W][R],
 * b[W]. Keeps P[B][R] = xl V^T and Q[B][W] = P U^T + b for the backward.
 * Borrowed pointers; out must not alias x0, xl, P or Q. */
void dense_cross_forward(const dense_backend *be, int B, int W, int R,
                         const float *x0, const float *xl, const float *V,
                         const float *U, const float *b, float *P, float *Q,
                         float *out);

/* Backward of dense_cross_forward from g[B][W] = d out. Overwrites
 * dV[R][W], dU[W][R], db[W]; dq[B][W] and dp[B][R] are scratch. acc[B][W]
 * gathers the gradient w.r.t. x0 over the layers: init (the first layer
 * a backward visits, the top one) overwrites it, else it is added to.
 * Unless first (layer 0, whose xl is x0), g is overwritten by the gradient
 * w.r.t. xl (g + dp V), for the layer below; when first, acc receives
 * g + dp V too and holds the whole gradient w.r.t. x0 at return. */
void dense_cross_backward(const dense_backend *be, int B, int W, int R,
                          const float *x0, const float *xl, const float *V,
                          const float *U, const float *P, const float *Q,
                          float *g, float *dq, float *dp, float *acc, int init,
                          int first, float *dV, float *dU, float *db);

/* Number of interaction terms: ni*(ni-1)/2, plus ni when itself. */
static inline int dense_interact_dot_pairs(int ni, int itself) {
  return ni * (ni - 1) / 2 + (itself ? ni : 0);
}

#endif
