#!/usr/bin/python3
"""Independent numpy implementation of the DLRM dense part, for
tests/reference/test_dense_reference.c.

Written from the reference dlrm_s_pytorch.py (create_mlp, interact_features,
sequential_forward) and torch's BCELoss/SGD definitions, in float64, with the
backward pass derived by hand in matrix form (not a transcription of the C
loops):
  bottom MLP: Linear + ReLU on every layer (sigmoid_bot = -1)
  dot: T = cat([x] + ly).view(B, -1, d); Z = T @ T^T;
       li, lj = [i for i in range(ni) for j in range(i + offset)], ...
       R = cat([x, Z[:, li, lj]])        dT = (dZ + dZ^T) @ T
  cat: R = cat([x] + ly)
  dcn: x0 = cat([x] + ly); x_{l+1} = x0 * (x_l V_l^T U_l^T + b_l) + x_l (TorchRec
       LowRankCrossNet: V_kernels [r][W], W_kernels [W][r], bias [W]); R = x_L.
       Backward from g = dx_{l+1}: dq = g * x0, dU = dq^T v, db = sum dq,
       dv = dq U, dV = dv^T x_l, dx_l = g + dv V, dx0 += g * q (over l)
  top MLP: ReLU between layers, none on the last (the logit z)
  loss: BCELoss(mean) of sigmoid(z)        dz = (sigmoid(z) - y) / B

Usage: dlrm_ref.py DIR. DIR holds config.txt ("key value..." lines: n_dense,
bot, top, n_sparse, emb_dim, interaction dot|cat|dcn, itself, batch, lr, steps;
dcn: dcn_layers, dcn_rank; optional optimizer sgd|adagrad, eps),
params.f32 (little-endian float32; per layer, bottom then top, W[out][in]
row-major then b[out]; dcn: between them, per cross layer V, U, b),
x.f32 [B][n_dense], emb.f32 [B][n_sparse][emb_dim],
y.f32 [B]. Writes DIR/ref.txt ("loss V", "loss_after_sgd V": the loss at the
parameters after `steps` optimizer steps on this batch at lr, plain SGD or
torch's Adagrad: s += g^2, p -= lr g / (sqrt(s) + eps)) and
DIR/grads.f64 (parameter gradients in the params order, then d_emb).
"""
import os
import sys

import numpy as np


def read_config(path):
    cfg = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts:
                cfg[parts[0]] = parts[1:]
    return cfg


def layer_shapes(cfg):
    bot = [int(v) for v in cfg["bot"]]
    top = [int(v) for v in cfg["top"]]
    ns, d, itself = int(cfg["n_sparse"][0]), int(cfg["emb_dim"][0]), int(cfg["itself"][0])
    if cfg["interaction"][0] == "dot":
        ni = ns + 1
        r = bot[-1] + ni * (ni - 1) // 2 + (ni if itself else 0)
    else:  # cat, dcn
        r = bot[-1] + ns * d
    bot_l = list(zip(bot[:-1], bot[1:]))
    top_l = list(zip([r] + top[:-1], top))
    return bot_l, top_l


def cross_shapes(cfg):
    """(W, rank, layers) of the cross network; layers 0 without one."""
    if cfg["interaction"][0] != "dcn":
        return 0, 0, 0
    w = int(cfg["bot"][-1]) + int(cfg["n_sparse"][0]) * int(cfg["emb_dim"][0])
    return w, int(cfg["dcn_rank"][0]), int(cfg["dcn_layers"][0])


def unpack_cross(flat, w, r, n):
    layers, off = [], 0
    for _ in range(n):
        V = flat[off:off + r * w].reshape(r, w)
        off += r * w
        U = flat[off:off + w * r].reshape(w, r)
        off += w * r
        b = flat[off:off + w]
        off += w
        layers.append((V, U, b))
    return layers, off


def cross_forward(cross, x0):
    """x_L and, per layer, (x_l, v_l, q_l)."""
    xl, saved = x0, []
    for V, U, b in cross:
        v = xl @ V.T
        q = v @ U.T + b
        saved.append((xl, v, q))
        xl = x0 * q + xl
    return xl, saved


def cross_backward(cross, saved, x0, g):
    """dx0 and the flat gradients of the cross layers from g = dx_L."""
    acc = np.zeros_like(x0)
    grads = []
    for (V, U, b), (xl, v, q) in zip(reversed(cross), reversed(saved)):
        dq = g * x0
        acc += g * q
        dv = dq @ U
        grads.append(np.concatenate([(dv.T @ xl).ravel(), (dq.T @ v).ravel(), dq.sum(axis=0)]))
        g = g + dv @ V
    grads.reverse()
    return g + acc, grads


def unpack(flat, shapes):
    layers, off = [], 0
    for n_in, n_out in shapes:
        W = flat[off:off + n_out * n_in].reshape(n_out, n_in)
        off += n_out * n_in
        b = flat[off:off + n_out]
        off += n_out
        layers.append((W, b))
    return layers, off


class Model:
    def __init__(self, cfg):
        self.cfg = cfg
        self.bot_s, self.top_s = layer_shapes(cfg)
        self.inter = cfg["interaction"][0]
        self.itself = int(cfg["itself"][0])
        self.ns = int(cfg["n_sparse"][0])
        self.d = int(cfg["emb_dim"][0])

    def forward_backward(self, flat, x, emb, y, want_grad=True):
        bot, nb = unpack(flat, self.bot_s)
        cross, nc = unpack_cross(flat[nb:], *cross_shapes(self.cfg))
        top, _ = unpack(flat[nb + nc:], self.top_s)
        cgrads = []
        B = x.shape[0]
        # bottom MLP
        acts = [x]
        for W, b in bot:
            acts.append(np.maximum(acts[-1] @ W.T + b, 0.0))
        xb = acts[-1]
        ly = [emb[:, k, :] for k in range(self.ns)]
        if self.inter == "dot":
            d = xb.shape[1]
            T = np.concatenate([xb] + ly, axis=1).reshape(B, -1, d)
            Z = T @ T.transpose(0, 2, 1)
            _, ni, nj = Z.shape
            off = 1 if self.itself else 0
            li = np.array([i for i in range(ni) for j in range(i + off)], dtype=np.int64)
            lj = np.array([j for i in range(nj) for j in range(i + off)], dtype=np.int64)
            R = np.concatenate([xb, Z[:, li, lj]], axis=1)
        else:
            R = np.concatenate([xb] + ly, axis=1)
        if cross:
            x0 = R
            R, saved = cross_forward(cross, x0)
        tacts = [R]
        for k, (W, b) in enumerate(top):
            zz = tacts[-1] @ W.T + b
            tacts.append(zz if k == len(top) - 1 else np.maximum(zz, 0.0))
        z = tacts[-1][:, 0]
        p = 1.0 / (1.0 + np.exp(-z))
        loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
        if not want_grad:
            return loss, None, None
        # backward
        g = ((p - y) / B)[:, None]
        tgrads = []
        for k in range(len(top) - 1, -1, -1):
            W, b = top[k]
            if k != len(top) - 1:
                g = g * (tacts[k + 1] > 0)
            tgrads.append((g.T @ tacts[k], g.sum(axis=0)))
            g = g @ W
        tgrads.reverse()
        dR = g
        if cross:
            dR, cgrads = cross_backward(cross, saved, x0, dR)
        if self.inter == "dot":
            dZ = np.zeros((B, ni, nj))
            dZ[:, li, lj] = dR[:, d:]
            dT = (dZ + dZ.transpose(0, 2, 1)) @ T
            dxb = dR[:, :d] + dT[:, 0, :]
            d_emb = dT[:, 1:, :]
        else:
            dxb = dR[:, :xb.shape[1]]
            d_emb = dR[:, xb.shape[1]:].reshape(B, self.ns, self.d)
        g = dxb
        bgrads = []
        for k in range(len(bot) - 1, -1, -1):
            W, b = bot[k]
            g = g * (acts[k + 1] > 0)
            bgrads.append((g.T @ acts[k], g.sum(axis=0)))
            g = g @ W
        bgrads.reverse()
        flat_g = np.concatenate([np.concatenate([gw.ravel(), gb]) for gw, gb in bgrads] + cgrads +
                                [np.concatenate([gw.ravel(), gb]) for gw, gb in tgrads])
        return loss, flat_g, d_emb


def main():
    dr = sys.argv[1]
    cfg = read_config(os.path.join(dr, "config.txt"))
    B = int(cfg["batch"][0])
    nd, ns, d = int(cfg["n_dense"][0]), int(cfg["n_sparse"][0]), int(cfg["emb_dim"][0])

    def load(name, shape):
        a = np.fromfile(os.path.join(dr, name), dtype="<f4").astype(np.float64)
        return a.reshape(shape)

    m = Model(cfg)
    flat = np.fromfile(os.path.join(dr, "params.f32"), dtype="<f4").astype(np.float64)
    x, emb, y = load("x.f32", (B, nd)), load("emb.f32", (B, ns, d)), load("y.f32", (B,))
    loss, g, d_emb = m.forward_backward(flat, x, emb, y)
    np.concatenate([g, d_emb.ravel()]).astype("<f8").tofile(os.path.join(dr, "grads.f64"))
    lr, steps = float(cfg["lr"][0]), int(cfg["steps"][0])
    p = flat.copy()
    adagrad = cfg.get("optimizer", ["sgd"])[0] == "adagrad"
    eps = float(cfg.get("eps", ["1e-10"])[0])
    s = np.zeros_like(p)
    for _ in range(steps):
        _, gs, _ = m.forward_backward(p, x, emb, y)
        if adagrad:
            s += gs * gs
            p -= lr * gs / (np.sqrt(s) + eps)
        else:
            p -= lr * gs
    after, _, _ = m.forward_backward(p, x, emb, y, want_grad=False)
    with open(os.path.join(dr, "ref.txt"), "w") as f:
        f.write("loss %.17g\nloss_after_sgd %.17g\n" % (loss, after))


if __name__ == "__main__":
    main()
