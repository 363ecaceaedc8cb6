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
  top MLP: ReLU between layers, none on the last (the logit z)
  loss: BCELoss(mean) of sigmoid(z)        dz = (sigmoid(z) - y) / B

Usage: dlrm_ref.py DIR. DIR holds config.txt ("key value..." lines: n_dense,
bot, top, n_sparse, emb_dim, interaction dot|cat, itself, batch, lr, steps),
params.f32 (little-endian float32; per layer, bottom then top, W[out][in]
row-major then b[out]), x.f32 [B][n_dense], emb.f32 [B][n_sparse][emb_dim],
y.f32 [B]. Writes DIR/ref.txt ("loss V", "loss_after_sgd V": the loss at the
parameters after `steps` plain SGD steps on this batch at lr) and
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
    else:
        r = bot[-1] + ns * d
    bot_l = list(zip(bot[:-1], bot[1:]))
    top_l = list(zip([r] + top[:-1], top))
    return bot_l, top_l


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
        top, _ = unpack(flat[nb:], self.top_s)
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
        flat_g = np.concatenate([np.concatenate([gw.ravel(), gb]) for gw, gb in bgrads + tgrads])
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
    for _ in range(steps):
        _, gs, _ = m.forward_backward(p, x, emb, y)
        p -= lr * gs
    after, _, _ = m.forward_backward(p, x, emb, y, want_grad=False)
    with open(os.path.join(dr, "ref.txt"), "w") as f:
        f.write("loss %.17g\nloss_after_sgd %.17g\n" % (loss, after))


if __name__ == "__main__":
    main()
