#!/usr/bin/python3
"""Reference metrics for tests/dense/test_dense_metrics.c.

Reads a text file of "score label" lines (scores written exactly, %.17g of the
float value) and prints, one per line with %.17g: roc_auc_score, log_loss,
accuracy (as the reference DLRM: accuracy_score(y, np.round(p))), mean score,
mean label. scikit-learn's own functions are the oracle.
"""
import sys

import numpy as np
import sklearn.metrics as skm


# The C code clips at float32's machine epsilon, which is what sklearn >= 1.2
# (eps="auto") applies to the float32 predictions a trainer produces; the
# scores here are float64, so the same eps is passed explicitly.
EPS = 2.0 ** -23


def log_loss(y, p):
    try:
        return skm.log_loss(y, p, eps=EPS)
    except TypeError:  # sklearn >= 1.7 has no eps: clip by hand
        return skm.log_loss(y, np.clip(p, EPS, 1 - EPS))


def main():
    data = np.loadtxt(sys.argv[1], dtype=np.float64, ndmin=2)
    p, y = data[:, 0], data[:, 1]
    out = [
        skm.roc_auc_score(y, p),
        log_loss(y, p),
        skm.accuracy_score(y, np.round(p)),
        float(np.mean(p)),
        float(np.mean(y)),
    ]
    for v in out:
        print("%.17g" % v)


if __name__ == "__main__":
    main()
