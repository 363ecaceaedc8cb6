/* Gradient checks of each dense layer against central finite differences of
 * a double-precision re-implementation written here.
 *
 * Objective for a layer with output y: L = sum(y * w) with fixed random w, so
 * dL/dy = w. Finite differences: h = 1e-6 on the double implementation,
 * evaluated at the float inputs. Tolerance per element:
 *   |analytic - fd| <= 1e-4 * |fd| + 1e-5 * max_k |fd_k|   (per tensor)
 * (float32 analytic gradients carry ~1e-6 relative rounding; the floor covers
 * elements that are small by cancellation). */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "dense/backend.h"
#include "dense/layers.h"
#include "tests/dense/dense_test_isa.h"

#define H 1e-6

static void fill(sr_rng *r, float *a, size_t n, double s) {
  for (size_t i = 0; i < n; i++) a[i] = (float)(s * sr_rng_normal(r));
}

static void check_grad(const char *what, const float *an, const double *fd,
                       size_t n) {
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(fd[i]));
  ck_assert_msg(scale > 0, "%s: all-zero gradient, test is vacuous", what);
  for (size_t i = 0; i < n; i++) {
    double tol = 1e-4 * fabs(fd[i]) + 1e-5 * scale;
    ck_assert_msg(fabs(an[i] - fd[i]) <= tol,
                  "%s[%zu]: analytic %.9g vs finite difference %.9g (tol %.3g)",
                  what, i, an[i], fd[i], tol);
  }
}

/* ---- linear ---------------------------------------------------------------- */

enum { LB = 5, LK = 7, LN = 6 };
static double lin_obj(const double *in, const double *W, const double *b,
                      int relu, const double *w) {
  double L = 0;
  for (int r = 0; r < LB; r++)
    for (int n = 0; n < LN; n++) {
      double z = b[n];
      for (int k = 0; k < LK; k++) z += in[r * LK + k] * W[n * LK + k];
      if (relu && z < 0) z = 0;
      L += z * w[r * LN + n];
    }
  return L;
}

static void run_linear(int relu) {
  const dense_backend *be = dense_test_be;
  sr_rng r;
  sr_rng_init(&r, 11, (uint64_t)relu);
  float in[LB * LK], W[LN * LK], b[LN], out[LB * LN], dout[LB * LN];
  float dW[LN * LK], db[LN], din[LB * LK];
  fill(&r, in, LB * LK, 1.0);
  fill(&r, W, LN * LK, 0.5);
  fill(&r, b, LN, 0.3);
  fill(&r, dout, LB * LN, 1.0);
  double w[LB * LN], din_d[LB * LK], W_d[LN * LK], b_d[LN];
  for (int i = 0; i < LB * LN; i++) w[i] = dout[i];
  for (int i = 0; i < LB * LK; i++) din_d[i] = in[i];
  for (int i = 0; i < LN * LK; i++) W_d[i] = W[i];
  for (int i = 0; i < LN; i++) b_d[i] = b[i];

  dense_linear_forward(be, LB, LK, LN, in, W, b, relu, out);
  /* forward value against the double implementation */
  for (int rr = 0; rr < LB; rr++)
    for (int n = 0; n < LN; n++) {
      double z = b_d[n];
      for (int k = 0; k < LK; k++) z += din_d[rr * LK + k] * W_d[n * LK + k];
      if (relu && z < 0) z = 0;
      ck_assert(fabs(out[rr * LN + n] - z) <= 1e-6 * (1 + fabs(z)));
      /* keep away from the ReLU kink so finite differences are smooth */
      if (relu) ck_assert_msg(z == 0 || z > 1e-4, "input too near the kink");
    }
  dense_linear_backward(be, LB, LK, LN, in, W, out, relu, dout, dW, db, din, 0);

  double fd[LB * LK > LN * LK ? LB * LK : LN * LK];
  double *vars[3] = {W_d, b_d, din_d};
  size_t sizes[3] = {LN * LK, LN, LB * LK};
  const float *an[3] = {dW, db, din};
  const char *names[3] = {"dW", "db", "din"};
  for (int v = 0; v < 3; v++) {
    for (size_t i = 0; i < sizes[v]; i++) {
      double keep = vars[v][i];
      vars[v][i] = keep + H;
      double lp = lin_obj(din_d, W_d, b_d, relu, w);
      vars[v][i] = keep - H;
      double lm = lin_obj(din_d, W_d, b_d, relu, w);
      vars[v][i] = keep;
      fd[i] = (lp - lm) / (2 * H);
    }
    check_grad(names[v], an[v], fd, sizes[v]);
  }
}

START_TEST(test_linear) { run_linear(0); }
END_TEST
START_TEST(test_linear_relu) { run_linear(1); }
END_TEST

/* din may be NULL (first bottom layer) and the rest is unchanged */
START_TEST(test_linear_no_din) {
  const dense_backend *be = dense_test_be;
  sr_rng r;
  sr_rng_init(&r, 12, 0);
  float in[LB * LK], W[LN * LK], b[LN], out[LB * LN], d1[LB * LN], d2[LB * LN];
  float dW1[LN * LK], db1[LN], dW2[LN * LK], db2[LN], din[LB * LK];
  fill(&r, in, LB * LK, 1.0);
  fill(&r, W, LN * LK, 0.5);
  fill(&r, b, LN, 0.3);
  fill(&r, d1, LB * LN, 1.0);
  memcpy(d2, d1, sizeof d1);
  dense_linear_forward(be, LB, LK, LN, in, W, b, 1, out);
  dense_linear_backward(be, LB, LK, LN, in, W, out, 1, d1, dW1, db1, din, 0);
  dense_linear_backward(be, LB, LK, LN, in, W, out, 1, d2, dW2, db2, NULL, 0);
  ck_assert(memcmp(dW1, dW2, sizeof dW1) == 0);
  ck_assert(memcmp(db1, db2, sizeof db1) == 0);
}
END_TEST

/* ---- dot interaction -------------------------------------------------------- */

enum { DB = 3, NI = 5, DD = 4 };
/* the reference's li, lj: for i in range(ni) for j in range(i + offset) */
static double dot_obj(const double *T, int itself, const double *w, int rs) {
  double L = 0;
  for (int b = 0; b < DB; b++) {
    const double *t = T + b * NI * DD;
    const double *wb = w + b * rs;
    int p = 0;
    for (int k = 0; k < DD; k++) L += t[k] * wb[p++];
    for (int i = 0; i < NI; i++)
      for (int j = 0; j < i + itself; j++) {
        double z = 0;
        for (int k = 0; k < DD; k++) z += t[i * DD + k] * t[j * DD + k];
        L += z * wb[p++];
      }
  }
  return L;
}

static void run_dot(int itself) {
  const dense_backend *be = dense_test_be;
  int rs = DD + dense_interact_dot_pairs(NI, itself);
  sr_rng r;
  sr_rng_init(&r, 13, (uint64_t)itself);
  float T[DB * NI * DD], R[DB * 64], dR[DB * 64], dT[DB * NI * DD];
  fill(&r, T, DB * NI * DD, 1.0);
  fill(&r, dR, (size_t)DB * rs, 1.0);
  double Td[DB * NI * DD], w[DB * 64], fd[DB * NI * DD];
  for (int i = 0; i < DB * NI * DD; i++) Td[i] = T[i];
  for (int i = 0; i < DB * rs; i++) w[i] = dR[i];

  be->interact_dot_forward(DB, NI, DD, itself, T, R, rs);
  /* order of the forward: pass-through then Z[i][j] as listed */
  for (int b = 0; b < DB; b++) {
    const double *t = Td + b * NI * DD;
    int p = DD;
    for (int k = 0; k < DD; k++) ck_assert(R[b * rs + k] == T[b * NI * DD + k]);
    for (int i = 0; i < NI; i++)
      for (int j = 0; j < i + itself; j++) {
        double z = 0;
        for (int k = 0; k < DD; k++) z += t[i * DD + k] * t[j * DD + k];
        ck_assert_msg(fabs(R[b * rs + p] - z) <= 1e-6 * (1 + fabs(z)),
                      "Z[%d][%d] at %d", i, j, p);
        p++;
      }
    ck_assert_int_eq(p, rs);
  }
  be->interact_dot_backward(DB, NI, DD, itself, T, dR, rs, dT);
  for (int i = 0; i < DB * NI * DD; i++) {
    double keep = Td[i];
    Td[i] = keep + H;
    double lp = dot_obj(Td, itself, w, rs);
    Td[i] = keep - H;
    double lm = dot_obj(Td, itself, w, rs);
    Td[i] = keep;
    fd[i] = (lp - lm) / (2 * H);
  }
  check_grad(itself ? "dT (itself)" : "dT", dT, fd, DB * NI * DD);
}

START_TEST(test_dot) { run_dot(0); }
END_TEST
START_TEST(test_dot_itself) { run_dot(1); }
END_TEST

/* d = 16 takes a specialised loop; check it against the generic one (d = 16
 * via a stride trick is not possible, so compare with the double formula) */
START_TEST(test_dot_d16) {
  const dense_backend *be = dense_test_be;
  enum { B = 2, N = 27, D = 16 };
  int rs = D + dense_interact_dot_pairs(N, 0);
  static float T[B * N * D], R[B * (16 + 351)];
  sr_rng r;
  sr_rng_init(&r, 14, 0);
  fill(&r, T, B * N * D, 1.0);
  be->interact_dot_forward(B, N, D, 0, T, R, rs);
  for (int b = 0; b < B; b++) {
    int p = D;
    for (int i = 0; i < N; i++)
      for (int j = 0; j < i; j++) {
        double z = 0;
        for (int k = 0; k < D; k++)
          z += (double)T[(b * N + i) * D + k] * T[(b * N + j) * D + k];
        ck_assert(fabs(R[b * rs + p] - z) <= 1e-5 * (1 + fabs(z)));
        p++;
      }
  }
}
END_TEST

/* d = 16 forward and backward (the AVX2/FMA kernels where the CPU has them),
 * for several ni (row counts that are and are not multiples of 8) and both
 * offsets, against the formulas in double: Z exactly as listed, and
 * dT[i] = sum over pairs (i, j) of dZ (T[j] into i, T[i] into j), a diagonal
 * pair 2 dZ T[i], plus the pass-through into dT[0]. Tolerance: 1e-5 of the
 * sum of the terms' magnitudes. */
static void run_dot_d16(int ni, int itself) {
  const dense_backend *be = dense_test_be;
  enum { B = 3, D = 16, MAXN = 27 };
  int rs = D + dense_interact_dot_pairs(ni, itself);
  static float T[B * MAXN * D], R[B * (16 + 378)], dR[B * (16 + 378)],
      dT[B * MAXN * D];
  static double g[MAXN * D], mag[MAXN * D];
  sr_rng r;
  sr_rng_init(&r, 15, (uint64_t)(ni * 2 + itself));
  fill(&r, T, (size_t)B * ni * D, 1.0);
  fill(&r, dR, (size_t)B * rs, 1.0);
  be->interact_dot_forward(B, ni, D, itself, T, R, rs);
  be->interact_dot_backward(B, ni, D, itself, T, dR, rs, dT);
  for (int b = 0; b < B; b++) {
    const float *t = T + (size_t)b * ni * D, *w = dR + (size_t)b * rs;
    for (int k = 0; k < D; k++) ck_assert(R[b * rs + k] == t[k]);
    for (int k = 0; k < ni * D; k++) g[k] = mag[k] = 0;
    for (int k = 0; k < D; k++) g[k] = w[k], mag[k] = fabs(w[k]);
    int p = D;
    for (int i = 0; i < ni; i++)
      for (int j = 0; j < i + itself; j++, p++) {
        double z = 0, zm = 0;
        for (int k = 0; k < D; k++) {
          z += (double)t[i * D + k] * t[j * D + k];
          zm += fabs((double)t[i * D + k] * t[j * D + k]);
        }
        ck_assert_msg(fabs(R[b * rs + p] - z) <= 1e-5 * (1 + zm),
                      "ni %d itself %d: Z[%d][%d] %.9g vs %.9g", ni, itself,
                      i, j, R[b * rs + p], z);
        double wp = w[p];
        for (int k = 0; k < D; k++) {
          if (i == j) {
            g[i * D + k] += 2 * wp * t[i * D + k];
            mag[i * D + k] += fabs(2 * wp * t[i * D + k]);
          } else {
            g[i * D + k] += wp * t[j * D + k];
            g[j * D + k] += wp * t[i * D + k];
            mag[i * D + k] += fabs(wp * t[j * D + k]);
            mag[j * D + k] += fabs(wp * t[i * D + k]);
          }
        }
      }
    ck_assert_int_eq(p, rs);
    for (int k = 0; k < ni * D; k++)
      ck_assert_msg(fabs(dT[(size_t)b * ni * D + k] - g[k]) <= 1e-5 * (1 + mag[k]),
                    "ni %d itself %d: dT[%d][%d] %.9g vs %.9g", ni, itself,
                    k / D, k % D, dT[(size_t)b * ni * D + k], g[k]);
  }
}

START_TEST(test_dot_d16_shapes) {
  static const int nis[] = {1, 2, 7, 8, 9, 16, 17, 26, 27};
  for (size_t n = 0; n < sizeof nis / sizeof nis[0]; n++)
    for (int itself = 0; itself < 2; itself++) run_dot_d16(nis[n], itself);
}
END_TEST

/* ---- BCE with logits -------------------------------------------------------- */

static double bce_d(double z, double y) {
  /* -(y log sigmoid(z) + (1-y) log(1 - sigmoid(z))), written differently
   * from the kernel: log sigmoid(z) = -log1p(exp(-z)) for z >= 0 */
  double ls = z >= 0 ? -log1p(exp(-z)) : z - log1p(exp(z));  /* log s(z) */
  double l1s = z >= 0 ? -z - log1p(exp(-z)) : -log1p(exp(z)); /* log 1-s */
  return -(y * ls + (1 - y) * l1s);
}

START_TEST(test_bce) {
  const dense_backend *be = dense_test_be;
  enum { B = 8 };
  float z[B] = {0.0f, 1.5f, -2.25f, 30.0f, -30.0f, 0.125f, -80.0f, 7.0f};
  float y[B] = {1, 0, 1, 1, 0, 0.3f, 1, 0};
  float dz[B];
  double loss = be->bce_logits(B, z, y, dz);
  double want = 0;
  for (int i = 0; i < B; i++) want += bce_d(z[i], y[i]);
  want /= B;
  ck_assert_msg(fabs(loss - want) <= 1e-12 * fabs(want), "loss %.17g vs %.17g",
                loss, want);
  ck_assert(isfinite(loss));
  double fd[B];
  for (int i = 0; i < B; i++)
    fd[i] = (bce_d(z[i] + H, y[i]) - bce_d(z[i] - H, y[i])) / (2 * H) / B;
  check_grad("dz", dz, fd, B);
  /* saturated logits: exact values */
  ck_assert(fabs(dz[3] - 0.0) < 1e-12 && fabs(dz[6] + 1.0 / B) < 1e-7);
}
END_TEST

/* ---- the two kernel sets ------------------------------------------------ */

/* Widths other than 16 (eight pairs side by side, or pair by pair past the
 * stack buffer: d 400 over 27 rows): both kernel sets give, bit for bit,
 * the plain loops in float: Z[i][j] summed over k in order, a product then
 * an add; dT's terms added pair by pair in the forward's order. */
static void dot_wide_reference(int ni, int d, int itself, const float *t, const float *dr,
                               float *z, float *g) {
  int p = 0;
  for (int i = 0; i < ni; i++)
    for (int j = 0; j < i + itself; j++) {
      float s = 0.0f;
      for (int k = 0; k < d; k++) {
        const float prod = t[i * d + k] * t[j * d + k];
        s += prod;
      }
      z[p++] = s;
    }
  for (int k = 0; k < ni * d; k++) g[k] = k < d ? dr[k] : 0.0f;
  const float *dz = dr + d;
  for (int i = 0; i < ni; i++) {
    for (int j = 0; j < i; j++) {
      const float w = *dz++;
      for (int k = 0; k < d; k++) {
        const float pi = w * t[j * d + k], pj = w * t[i * d + k];
        g[i * d + k] += pi;
        g[j * d + k] += pj;
      }
    }
    if (itself) {
      const float w2 = 2.0f * *dz++;
      for (int k = 0; k < d; k++) {
        const float pk = w2 * t[i * d + k];
        g[i * d + k] += pk;
      }
    }
  }
}

START_TEST(test_dot_wide_bits) {
  const dense_backend *sets[2] = {dense_backend_cpu_isa(DENSE_ISA_BEST),
                                  dense_backend_cpu_isa(DENSE_ISA_BASELINE)};
  /* ni past 32: rows of more than one block of 32 pairs; even and odd ni:
   * a last pair of rows and a last row alone. */
  const int dims[] = {4, 8, 12, 24, 64, 128, 130, 400}, nis[] = {3, 8, 9, 27, 40, 64};
  enum { B = 2, MAXD = 400, MAXN = 64, MAXR = MAXD + MAXN * (MAXN + 1) / 2 };
  static float T[B * MAXN * MAXD], R[B * MAXR], dR[B * MAXR], dT[B * MAXN * MAXD];
  static float z[MAXR], g[MAXN * MAXD];
  sr_rng r;
  sr_rng_init(&r, 17, 0);
  for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
    for (size_t ni_i = 0; ni_i < sizeof nis / sizeof *nis; ni_i++)
      for (int itself = 0; itself < 2; itself++) {
        const int d = dims[di], ni = nis[ni_i];
        const int rs = d + dense_interact_dot_pairs(ni, itself), np = rs - d;
        fill(&r, T, (size_t)B * ni * d, 1.0);
        fill(&r, dR, (size_t)B * rs, 1.0);
        for (int s = 0; s < 2; s++) {
          memset(R, 0xff, sizeof R);
          memset(dT, 0xff, sizeof dT);
          sets[s]->interact_dot_forward(B, ni, d, itself, T, R, rs);
          sets[s]->interact_dot_backward(B, ni, d, itself, T, dR, rs, dT);
          for (int b = 0; b < B; b++) {
            const float *t = T + (size_t)b * ni * d;
            dot_wide_reference(ni, d, itself, t, dR + (size_t)b * rs, z, g);
            ck_assert_msg(!memcmp(R + (size_t)b * rs, t, (size_t)d * sizeof(float)) &&
                              !memcmp(R + (size_t)b * rs + d, z, (size_t)np * sizeof(float)),
                          "%s: forward at d %d, ni %d, itself %d: not the plain loop's bits",
                          sets[s]->name, d, ni, itself);
            ck_assert_msg(!memcmp(dT + (size_t)b * ni * d, g, (size_t)ni * d * sizeof(float)),
                          "%s: backward at d %d, ni %d, itself %d: not the plain loop's bits",
                          sets[s]->name, d, ni, itself);
          }
        }
      }
}
END_TEST


/* Which OpenBLAS kernel family to suggest: none for the fast families (any
 * case) or the one forced or a CPU without AVX2 or a build that cannot
 * pick one at run time; SkylakeX where AVX-512 is there, Haswell otherwise,
 * for a generic family such as Prescott (what an OpenBLAS that does not
 * know the CPU's model, or refuses a forced name, falls back to). */
START_TEST(test_blas_core_hint) {
  const char *dyn = "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64";
  const char *fast[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids",
                        "Excavator", "HASWELL", "skylakex"};
  for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++)
    ck_assert_msg(dense_blas_core_hint_for(fast[i], dyn, 1, 1, NULL) == NULL, "%s", fast[i]);
  ck_assert_str_eq(dense_blas_core_hint_for("Prescott", dyn, 1, 1, NULL), "SkylakeX");
  ck_assert_str_eq(dense_blas_core_hint_for("Prescott", dyn, 1, 0, NULL), "Haswell");
  ck_assert_str_eq(dense_blas_core_hint_for("Sandybridge", dyn, 1, 0, NULL), "Haswell");
  ck_assert_ptr_null(dense_blas_core_hint_for("Prescott", dyn, 1, 1, "prescott")); /* forced */
  ck_assert_str_eq(dense_blas_core_hint_for("Prescott", dyn, 1, 1, "SapphireRapids"),
                   "SkylakeX"); /* a name this OpenBLAS refused */
  ck_assert_ptr_null(dense_blas_core_hint_for("Prescott", dyn, 0, 0, NULL)); /* no AVX2 */
  ck_assert_ptr_null(dense_blas_core_hint_for("PRESCOTT", "OpenBLAS 0.3.21 NO_AFFINITY", 1, 1,
                                              NULL)); /* one family, built in */
  ck_assert_ptr_null(dense_blas_core_hint_for(NULL, dyn, 1, 1, NULL));
}
END_TEST

/* dense_backend_cpu is the best set; on a CPU with AVX2 and FMA that is the
 * AVX2 set, another object than the baseline one. The element-wise kernels
 * give the same bits in both (no FMA contraction, the same sums in the same
 * order): rows of 37 columns (a vector tail), a row stride past N. */
START_TEST(test_isa_sets) {
  const dense_backend *best = dense_backend_cpu_isa(DENSE_ISA_BEST);
  const dense_backend *base = dense_backend_cpu_isa(DENSE_ISA_BASELINE);
  ck_assert_ptr_nonnull(best);
  ck_assert_ptr_nonnull(base);
  ck_assert_ptr_eq(dense_backend_cpu(), best);
  ck_assert_ptr_null(dense_backend_cpu_isa((dense_isa)7));
  ck_assert_ptr_eq(dense_backend_default(), dense_test_be);
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  ck_assert_int_eq(best != base, avx2);
  if (avx2) ck_assert_msg(strstr(best->name, "avx2") != NULL, "%s", best->name);
#endif
  enum { B = 9, N = 37, LD = 41 };
  static float y0[B * LD], y1[B * LD], bias[N], dy0[B * LD], dy1[B * LD];
  static float db0[N], db1[N];
  sr_rng r;
  sr_rng_init(&r, 16, 0);
  for (int relu = 0; relu < 2; relu++) {
    fill(&r, y0, B * N, 1.0);
    fill(&r, bias, N, 0.5);
    memcpy(y1, y0, sizeof y0);
    best->bias_act_forward(B, N, bias, relu, y0);
    base->bias_act_forward(B, N, bias, relu, y1);
    ck_assert_msg(memcmp(y0, y1, B * N * sizeof(float)) == 0,
                  "bias_act_forward (relu %d): the two sets differ", relu);
  }
  fill(&r, y0, B * LD, 1.0);
  for (int with_y = 0; with_y < 2; with_y++) {
    fill(&r, dy0, B * LD, 1.0);
    memcpy(dy1, dy0, sizeof dy0);
    best->relu_bias_grad(B, N, LD, with_y ? y0 : NULL, dy0, db0);
    base->relu_bias_grad(B, N, LD, with_y ? y0 : NULL, dy1, db1);
    ck_assert_msg(memcmp(dy0, dy1, sizeof dy0) == 0 && memcmp(db0, db1, sizeof db0) == 0,
                  "relu_bias_grad (y %d): the two sets differ", with_y);
  }
}
END_TEST

/* ---- cross layer (DCN-v2) ------------------------------------------------- */

enum { CB = 4, CW = 6, CR = 3 };
/* L = sum(out * w), out = x0 * (U (V xl) + b) + xl; tied: xl is x0. */
static double cross_obj(const double *x0, const double *xl, const double *V, const double *U,
                        const double *b, const double *w, int tied) {
  double L = 0;
  for (int r = 0; r < CB; r++) {
    const double *a = x0 + r * CW, *x = tied ? a : xl + r * CW;
    double v[CR];
    for (int k = 0; k < CR; k++) {
      v[k] = 0;
      for (int c = 0; c < CW; c++) v[k] += V[k * CW + c] * x[c];
    }
    for (int c = 0; c < CW; c++) {
      double q = b[c];
      for (int k = 0; k < CR; k++) q += U[c * CR + k] * v[k];
      L += (a[c] * q + x[c]) * w[r * CW + c];
    }
  }
  return L;
}

/* The central difference of cross_obj in each element of t[n] (a copy of
 * the float values in d, the double arrays). */
static void cross_fd(double *t, size_t n, double *const d[5], const double *w, int tied,
                     double *fd) {
  for (size_t i = 0; i < n; i++) {
    double keep = t[i];
    t[i] = keep + H;
    double lp = cross_obj(d[0], d[1], d[2], d[3], d[4], w, tied);
    t[i] = keep - H;
    double lm = cross_obj(d[0], d[1], d[2], d[3], d[4], w, tied);
    t[i] = keep;
    fd[i] = (lp - lm) / (2 * H);
  }
}

/* One cross layer: a middle one (xl apart from x0; init: acc overwritten
 * with x0's direct part, g turned into d xl) and the first (xl is x0; acc,
 * holding an earlier layer's part, receives the rest of d x0). */
static void run_cross(int first) {
  const dense_backend *be = dense_test_be;
  sr_rng r;
  sr_rng_init(&r, 21, (uint64_t)first);
  float x0[CB * CW], xl[CB * CW], V[CR * CW], U[CW * CR], b[CW], w[CB * CW];
  float P[CB * CR], Q[CB * CW], out[CB * CW], g[CB * CW], dq[CB * CW], dp[CB * CR];
  float acc[CB * CW], acc0[CB * CW], dV[CR * CW], dU[CW * CR], db[CW], got[CB * CW];
  fill(&r, x0, CB * CW, 1.0), fill(&r, xl, CB * CW, 1.0), fill(&r, V, CR * CW, 0.5);
  fill(&r, U, CW * CR, 0.5), fill(&r, b, CW, 0.5), fill(&r, w, CB * CW, 1.0);
  fill(&r, acc0, CB * CW, 1.0);
  const float *in = first ? x0 : xl;
  dense_cross_forward(be, CB, CW, CR, x0, in, V, U, b, P, Q, out);
  memcpy(g, w, sizeof g);
  memcpy(acc, acc0, sizeof acc);
  dense_cross_backward(be, CB, CW, CR, x0, in, V, U, P, Q, g, dq, dp, acc, !first, first, dV, dU,
                       db);
  double dx0[CB * CW], dxl[CB * CW], dVd[CR * CW], dUd[CW * CR], dbd[CW], dw[CB * CW];
  double fd[CB * CW];
  for (int i = 0; i < CB * CW; i++) dx0[i] = x0[i], dxl[i] = xl[i], dw[i] = w[i];
  for (int i = 0; i < CR * CW; i++) dVd[i] = V[i], dUd[i] = U[i];
  for (int i = 0; i < CW; i++) dbd[i] = b[i];
  double *d[5] = {dx0, dxl, dVd, dUd, dbd};
  /* the forward itself: out[r][c] = d L / d w[r][c] */
  cross_fd(dw, CB * CW, d, dw, first, fd);
  check_grad("cross out", out, fd, CB * CW);
  cross_fd(dVd, CR * CW, d, dw, first, fd);
  check_grad("cross dV", dV, fd, CR * CW);
  cross_fd(dUd, CW * CR, d, dw, first, fd);
  check_grad("cross dU", dU, fd, CW * CR);
  cross_fd(dbd, CW, d, dw, first, fd);
  check_grad("cross db", db, fd, CW);
  cross_fd(dx0, CB * CW, d, dw, first, fd); /* first: the whole d x0, else its direct part */
  for (int i = 0; i < CB * CW; i++) got[i] = first ? acc[i] - acc0[i] : acc[i];
  check_grad(first ? "cross d x0 (added to acc)" : "cross d x0 (direct, acc)", got, fd, CB * CW);
  if (!first) {
    cross_fd(dxl, CB * CW, d, dw, 0, fd);
    check_grad("cross d xl (g)", g, fd, CB * CW);
  }
}

START_TEST(test_cross) { run_cross(0); }
END_TEST
START_TEST(test_cross_first) { run_cross(1); }
END_TEST

/* The cross layer's forward values against the double formula, and its
 * element-wise kernels alike in both kernel sets, split in row blocks or
 * not (B * W over 65536 floats: several blocks), with a vector tail. */
START_TEST(test_cross_forward_and_sets) {
  const dense_backend *best = dense_backend_cpu_isa(DENSE_ISA_BEST);
  const dense_backend *base = dense_backend_cpu_isa(DENSE_ISA_BASELINE);
  enum { B = 100, W = 1003 }; /* 100 x 1003 floats: 4 blocks of 32 rows */
  float *x0 = malloc(sizeof(float) * B * W), *xl = malloc(sizeof(float) * B * W);
  float *q[2], *o[2], *dq[2], *acc[2], bias[W];
  sr_rng r;
  sr_rng_init(&r, 22, 0);
  fill(&r, x0, (size_t)B * W, 1.0), fill(&r, xl, (size_t)B * W, 1.0), fill(&r, bias, W, 1.0);
  for (int k = 0; k < 2; k++) {
    const dense_backend *be = k ? base : best;
    q[k] = malloc(sizeof(float) * B * W), o[k] = malloc(sizeof(float) * B * W);
    dq[k] = malloc(sizeof(float) * B * W), acc[k] = malloc(sizeof(float) * B * W);
    sr_rng_init(&r, 23, 0);
    fill(&r, q[k], (size_t)B * W, 1.0);
    be->cross_forward(B, W, bias, x0, xl, q[k], o[k]);
    fill(&r, acc[k], (size_t)B * W, 1.0);
    be->cross_backward(B, W, xl, x0, q[k], dq[k], acc[k], 0, 1); /* g = xl */
  }
  sr_rng_init(&r, 23, 0);
  float *q0 = malloc(sizeof(float) * B * W), *a0 = malloc(sizeof(float) * B * W);
  fill(&r, q0, (size_t)B * W, 1.0);
  fill(&r, a0, (size_t)B * W, 1.0);
  for (size_t i = 0; i < (size_t)B * W; i++) {
    /* the kernels' exact float steps, each product rounded alone */
    float qq = q0[i] + bias[i % W], p = x0[i] * qq, gq = xl[i] * qq;
    ck_assert(q[0][i] == qq && o[0][i] == p + xl[i]);
    ck_assert(dq[0][i] == xl[i] * x0[i] && acc[0][i] == (a0[i] + gq) + xl[i]);
  }
  size_t n = sizeof(float) * B * W;
  ck_assert_msg(!memcmp(q[0], q[1], n) && !memcmp(o[0], o[1], n) && !memcmp(dq[0], dq[1], n) &&
                    !memcmp(acc[0], acc[1], n),
                "cross kernels: the two sets differ");
  for (int k = 0; k < 2; k++) free(q[k]), free(o[k]), free(dq[k]), free(acc[k]);
  free(x0), free(xl), free(q0), free(a0);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("dense_layers");
  TCase *t = tcase_create("grad");
  tcase_add_test(t, test_linear);
  tcase_add_test(t, test_linear_relu);
  tcase_add_test(t, test_linear_no_din);
  tcase_add_test(t, test_dot);
  tcase_add_test(t, test_dot_itself);
  tcase_add_test(t, test_dot_d16);
  tcase_add_test(t, test_dot_d16_shapes);
  tcase_add_test(t, test_bce);
  tcase_add_test(t, test_isa_sets);
  tcase_add_test(t, test_blas_core_hint);
  tcase_add_test(t, test_dot_wide_bits);
  tcase_add_test(t, test_cross);
  tcase_add_test(t, test_cross_first);
  tcase_add_test(t, test_cross_forward_and_sets);
  suite_add_tcase(s, t);
  return s;
}

int main(int argc, char **argv) {
  dense_test_isa_args(argc, argv);
  return sr_check_run(suite());
}
