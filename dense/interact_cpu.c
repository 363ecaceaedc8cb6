/* The CPU backend's dot interaction (dense/cpu_impl.h): pairwise dot
 * products of a sample's rows and their gradients, per kernel set. */
#include <string.h>

#include "dense/cpu_impl.h"

/* A product, then an add: two statements, so that no compiler contracts
 * them into an FMA (clang does within a statement), and the loop has one
 * set of bits in every kernel set it is compiled into. */
static inline float dotf(const float *restrict a, const float *restrict b,
                         int d) {
  float s = 0.0f;
  for (int k = 0; k < d; k++) {
    const float p = a[k] * b[k];
    s += p;
  }
  return s;
}

#if DENSE_X86
/* Eight dot products of 16-float rows: p[q] = a . rows[q] for q in 0..7,
 * returned in one vector (lane q). a = (alo, ahi). */
__attribute__((target("avx2,fma"))) static inline __m256
dot16x8(__m256 alo, __m256 ahi, const float *const rows[8]) {
  __m256 p[8];
  for (int q = 0; q < 8; q++)
    p[q] = _mm256_fmadd_ps(ahi, _mm256_loadu_ps(rows[q] + 8),
                           _mm256_mul_ps(alo, _mm256_loadu_ps(rows[q])));
  __m256 s01 = _mm256_hadd_ps(p[0], p[1]), s23 = _mm256_hadd_ps(p[2], p[3]);
  __m256 s45 = _mm256_hadd_ps(p[4], p[5]), s67 = _mm256_hadd_ps(p[6], p[7]);
  __m256 u0 = _mm256_hadd_ps(s01, s23), u1 = _mm256_hadd_ps(s45, s67);
  /* u0 = [p0..p3 over lanes 0-3 | p0..p3 over lanes 4-7], u1 likewise */
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                       _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* d == 16 forward: per row i, the dots with rows j < i + off, eight at a
 * time (lanes past the row's end recompute row i and are not stored). */
__attribute__((target("avx2,fma"))) static void
interact_fwd_d16_avx2(int B, int ni, int itself, const float *T, float *R,
                      int r_stride) {
  static const int lane_mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                    0,  0,  0,  0,  0,  0,  0,  0};
  int off = itself ? 1 : 0;
  for (int b = 0; b < B; b++) {
    const float *t = T + (size_t)b * ni * 16;
    float *r = R + (size_t)b * r_stride;
    _mm256_storeu_ps(r, _mm256_loadu_ps(t));
    _mm256_storeu_ps(r + 8, _mm256_loadu_ps(t + 8));
    float *z = r + 16;
    for (int i = 0; i < ni; i++) {
      const float *ti = t + i * 16;
      __m256 alo = _mm256_loadu_ps(ti), ahi = _mm256_loadu_ps(ti + 8);
      int cnt = i + off;
      for (int j0 = 0; j0 < cnt; j0 += 8) {
        const float *rows[8];
        for (int q = 0; q < 8; q++)
          rows[q] = j0 + q < cnt ? t + (j0 + q) * 16 : ti;
        __m256 v = dot16x8(alo, ahi, rows);
        int n = cnt - j0;
        if (n >= 8)
          _mm256_storeu_ps(z + j0, v);
        else
          _mm256_maskstore_ps(
              z + j0, _mm256_loadu_si256((const __m256i *)(lane_mask + 8 - n)),
              v);
      }
      z += cnt;
    }
  }
}

/* d == 16 backward: dT[i] = sum_{j<i} dZ[i][j] T[j] + sum_{k>i} dZ[k][i] T[k]
 * (+ 2 dZ[i][i] T[i] when itself), accumulated in registers, two chains per
 * sum so the FMA latency is hidden; each row of dT is stored once. */
__attribute__((target("avx2,fma"))) static void
interact_bwd_d16_avx2(int B, int ni, int itself, const float *T,
                      const float *dR, int r_stride, float *dT) {
  int off = itself ? 1 : 0;
  for (int b = 0; b < B; b++) {
    const float *t = T + (size_t)b * ni * 16;
    const float *dr = dR + (size_t)b * r_stride;
    const float *dz = dr + 16;
    float *g = dT + (size_t)b * ni * 16;
    for (int i = 0; i < ni; i++) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, c0 = a0, c1 = a0;
      const float *dzi = dz + (size_t)i * (i - 1) / 2 + (size_t)off * i;
      int j = 0;
      for (; j + 1 < i; j += 2) { /* row i of dZ, contiguous */
        __m256 w0 = _mm256_broadcast_ss(dzi + j);
        __m256 w1 = _mm256_broadcast_ss(dzi + j + 1);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + j * 16), a0);
        a1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + j * 16 + 8), a1);
        c0 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(t + j * 16 + 16), c0);
        c1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(t + j * 16 + 24), c1);
      }
      if (j < i) {
        __m256 w0 = _mm256_broadcast_ss(dzi + j);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + j * 16), a0);
        a1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + j * 16 + 8), a1);
      }
      if (off) {
        __m256 w2 = _mm256_set1_ps(2.0f * dzi[i]);
        c0 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(t + i * 16), c0);
        c1 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(t + i * 16 + 8), c1);
      }
      /* column i of dZ below the diagonal: dZ[k][i] for k > i */
      __m256 e0 = _mm256_setzero_ps(), e1 = e0, f0 = e0, f1 = e0;
      size_t p = (size_t)(i + 1) * i / 2 + (size_t)off * (i + 1) + i;
      int k = i + 1;
      for (; k + 1 < ni; k += 2) {
        __m256 w0 = _mm256_broadcast_ss(dz + p);
        p += (size_t)k + off;
        __m256 w1 = _mm256_broadcast_ss(dz + p);
        p += (size_t)k + 1 + off;
        e0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + k * 16), e0);
        e1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + k * 16 + 8), e1);
        f0 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(t + k * 16 + 16), f0);
        f1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(t + k * 16 + 24), f1);
      }
      if (k < ni) {
        __m256 w0 = _mm256_broadcast_ss(dz + p);
        e0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + k * 16), e0);
        e1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + k * 16 + 8), e1);
      }
      __m256 s0 = _mm256_add_ps(_mm256_add_ps(a0, c0), _mm256_add_ps(e0, f0));
      __m256 s1 = _mm256_add_ps(_mm256_add_ps(a1, c1), _mm256_add_ps(e1, f1));
      if (i == 0) { /* the dense pass-through R[b][0:16] */
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(dr));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(dr + 8));
      }
      _mm256_storeu_ps(g + i * 16, s0);
      _mm256_storeu_ps(g + i * 16 + 8, s1);
    }
  }
}
#endif

/* The interaction's pairs at a width other than 16, eight at a time: lane
 * q of row i holds Z[i][j0 + q], summed over k in order, a product then an
 * add (each its own statement: no compiler fuses them into an FMA), as
 * dotf does one pair. So every lane is dotf's bits. tt is sample b's T
 * transposed, rows of np floats (ni rounded up to 8, zeros past ni). The
 * baseline's: the AVX2 copy runs interact_pairs_wide. */
DENSE_BODY interact_pairs8(int ni, int np, int d, int off, const float *restrict t,
                           const float *restrict tt, float *restrict z) {
  for (int i = 0; i < ni; i++) {
    const float *restrict ti = t + (size_t)i * d;
    const int nj = i + off;
    for (int j0 = 0; j0 < nj; j0 += 8) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int k = 0; k < d; k++) {
        const float a = ti[k];
        const float *restrict col = tt + (size_t)k * np + j0;
        for (int q = 0; q < 8; q++) {
          const float prod = a * col[q];
          acc[q] += prod;
        }
      }
      const int m = nj - j0 < 8 ? nj - j0 : 8;
      for (int q = 0; q < m; q++) *z++ = acc[q];
    }
  }
}

#define INTERACT_TT_MAX 8192 /* floats of tt (d * np) on the stack; wider runs pair by pair */
typedef float interact_v8 __attribute__((vector_size(32))); /* 8 lanes, element-wise ops */

/* The same in 8-float vectors (AVX2): lane q of group g holds
 * Z[i][j0 + 8g + q], every lane dotf's bits. Each pair's sum is a chain of
 * d adds, so R rows (1 or 2) times G groups (1 to 4) of chains run in one
 * pass over k, side by side, where one group alone would wait on each
 * add's latency. j0 + 8G <= np. */
DENSE_BODY interact_pairs_block(int R, int G, int d, int np, int j0, const float *restrict t0,
                                const float *restrict t1, const float *restrict tt,
                                float out[2][4][8]) {
  interact_v8 s0[4] = {{0}}, s1[4] = {{0}};
  for (int k = 0; k < d; k++) {
    const float *restrict col = tt + (size_t)k * np + j0;
    const float a0 = t0[k], a1 = R > 1 ? t1[k] : 0.0f;
    for (int g = 0; g < G; g++) {
      interact_v8 c;
      memcpy(&c, col + 8 * g, sizeof c);
      const interact_v8 p0 = c * a0;
      s0[g] += p0;
      if (R > 1) {
        const interact_v8 p1 = c * a1;
        s1[g] += p1;
      }
    }
  }
  for (int g = 0; g < G; g++) {
    memcpy(out[0][g], &s0[g], sizeof s0[g]);
    if (R > 1) memcpy(out[1][g], &s1[g], sizeof s1[g]);
  }
}

DENSE_BODY interact_pairs_wide(int ni, int np, int d, int off, const float *restrict t,
                               const float *restrict tt, float *restrict z) {
  float acc[2][4][8];
  for (int i = 0; i < ni; i += 2) {
    const int R = i + 1 < ni ? 2 : 1, nj_max = i + R - 1 + off;
    const float *restrict t0 = t + (size_t)i * d, *restrict t1 = t0 + (R > 1 ? d : 0);
    float *restrict z0 = z + (size_t)i * (i - 1) / 2 + (size_t)off * i; /* row i's pairs */
    float *restrict z1 = z0 + i + off;
    for (int j0 = 0; j0 < nj_max; j0 += 32) {
      const int G = nj_max - j0 >= 32 ? 4 : (nj_max - j0 + 7) / 8;
      switch (R * 4 + G) { /* constant R and G: the chains stay in registers */
        case 5: interact_pairs_block(1, 1, d, np, j0, t0, t1, tt, acc); break;
        case 6: interact_pairs_block(1, 2, d, np, j0, t0, t1, tt, acc); break;
        case 7: interact_pairs_block(1, 3, d, np, j0, t0, t1, tt, acc); break;
        case 8: interact_pairs_block(1, 4, d, np, j0, t0, t1, tt, acc); break;
        case 9: interact_pairs_block(2, 1, d, np, j0, t0, t1, tt, acc); break;
        case 10: interact_pairs_block(2, 2, d, np, j0, t0, t1, tt, acc); break;
        case 11: interact_pairs_block(2, 3, d, np, j0, t0, t1, tt, acc); break;
        default: interact_pairs_block(2, 4, d, np, j0, t0, t1, tt, acc); break;
      }
      for (int r = 0; r < R; r++) {
        const int nj = i + r + off, end = nj < j0 + 32 ? nj : j0 + 32;
        float *restrict zr = r ? z1 : z0;
        for (int j = j0; j < end; j++) zr[j] = acc[r][(j - j0) / 8][(j - j0) % 8];
      }
    }
  }
}

/* tt[k][j] = t[j][k] for j < ni, 0 for ni <= j < np (np a multiple of 8):
 * in the AVX2 copy (wide) where d is a multiple of 8, blocks of 8 x 8 moved
 * with three rounds of shuffles, else one by one. */
DENSE_BODY interact_transpose(int wide, int ni, int np, int d, const float *restrict t,
                              float *restrict tt) {
  if (!wide || d % 8) {
    for (int k = 0; k < d; k++) {
      for (int j = 0; j < ni; j++) tt[(size_t)k * np + j] = t[(size_t)j * d + k];
      for (int j = ni; j < np; j++) tt[(size_t)k * np + j] = 0.0f;
    }
    return;
  }
  const interact_v8 zero = {0};
  for (int j0 = 0; j0 < np; j0 += 8)
    for (int k0 = 0; k0 < d; k0 += 8) {
      interact_v8 r[8], a[8], b[8];
      for (int q = 0; q < 8; q++) {
        if (j0 + q < ni) memcpy(&r[q], t + (size_t)(j0 + q) * d + k0, sizeof r[q]);
        else r[q] = zero;
      }
      for (int q = 0; q < 8; q += 2) {
        a[q] = __builtin_shufflevector(r[q], r[q + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        a[q + 1] = __builtin_shufflevector(r[q], r[q + 1], 2, 10, 3, 11, 6, 14, 7, 15);
      }
      for (int q = 0; q < 8; q += 4)
        for (int h = 0; h < 2; h++) {
          b[q + 2 * h] = __builtin_shufflevector(a[q + h], a[q + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
          b[q + 2 * h + 1] =
              __builtin_shufflevector(a[q + h], a[q + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
      /* b[0..3]: rows 0-3, columns (0,4) (1,5) (2,6) (3,7) by 128-bit half;
       * b[4..7] the same for rows 4-7. */
      for (int m = 0; m < 4; m++) {
        const interact_v8 c0 = __builtin_shufflevector(b[m], b[m + 4], 0, 1, 2, 3, 8, 9, 10, 11),
                          c1 = __builtin_shufflevector(b[m], b[m + 4], 4, 5, 6, 7, 12, 13, 14, 15);
        memcpy(tt + (size_t)(k0 + m) * np + j0, &c0, sizeof c0);
        memcpy(tt + (size_t)(k0 + m + 4) * np + j0, &c1, sizeof c1);
      }
    }
}

/* T[B][ni][d] -> R[B][r_stride]: R[b][0:d] = T[b][0], then Z[i][j] for
 * i in [0,ni), j in [0, i + itself). Only the lower triangle is computed. */
DENSE_BODY cpu_interact_dot_forward_body(int wide, int B, int ni, int d, int itself,
                                         const float *T, float *R, int r_stride) {
  int off = itself ? 1 : 0;
  const int np = (ni + 7) / 8 * 8;
  float tt[INTERACT_TT_MAX];
  for (int b = 0; b < B; b++) {
    const float *t = T + (size_t)b * ni * d;
    float *restrict r = R + (size_t)b * r_stride;
    for (int k = 0; k < d; k++) r[k] = t[k];
    float *restrict z = r + d;
    if (d == 16) { /* the common case: a constant trip count vectorises fully */
      for (int i = 0; i < ni; i++)
        for (int j = 0; j < i + off; j++) *z++ = dotf(t + i * 16, t + j * 16, 16);
    } else if ((size_t)d * np <= INTERACT_TT_MAX) {
      interact_transpose(wide, ni, np, d, t, tt);
      if (wide) interact_pairs_wide(ni, np, d, off, t, tt, z);
      else interact_pairs8(ni, np, d, off, t, tt, z);
    } else {
      for (int i = 0; i < ni; i++)
        for (int j = 0; j < i + off; j++)
          *z++ = dotf(t + (size_t)i * d, t + (size_t)j * d, d);
    }
  }
}
DENSE_MULTIVERSION_WIDE(cpu_interact_dot_forward,
                   (int B, int ni, int d, int itself, const float *T, float *R, int r_stride),
                   (B, ni, d, itself, T, R, r_stride))

/* Columns [k0, k0 + 8V) of one sample's dT (V = 1 or 4 vectors of 8):
 * row i's slice of g held in registers over its pairs (i, j < i), each gj
 * slice read, added to and written back once a pair. Every float gets the
 * same products and adds in the same order as the plain loop over (i, j)
 * with k innermost. */
#define INTERACT_LD(p) ({ interact_v8 v_; memcpy(&v_, (p), sizeof v_); v_; })
#define INTERACT_ST(p, v) do { interact_v8 v_ = (v); memcpy((p), &v_, sizeof v_); } while (0)
DENSE_BODY interact_bwd_cols(int V, int ni, int d, int off, int k0, const float *restrict t,
                             const float *restrict dz, float *restrict g) {
  const interact_v8 z = {0};
  for (int i = 0; i < ni; i++) {
    const float *ti = t + (size_t)i * d + k0;
    float *gi = g + (size_t)i * d + k0;
    const interact_v8 t0 = INTERACT_LD(ti), t1 = V > 1 ? INTERACT_LD(ti + 8) : z,
                      t2 = V > 1 ? INTERACT_LD(ti + 16) : z, t3 = V > 1 ? INTERACT_LD(ti + 24) : z;
    interact_v8 g0 = INTERACT_LD(gi), g1 = V > 1 ? INTERACT_LD(gi + 8) : z,
                g2 = V > 1 ? INTERACT_LD(gi + 16) : z, g3 = V > 1 ? INTERACT_LD(gi + 24) : z;
    for (int j = 0; j < i; j++) {
      const float w = *dz++;
      const float *tj = t + (size_t)j * d + k0;
      float *gj = g + (size_t)j * d + k0;
      const interact_v8 p0 = INTERACT_LD(tj) * w, q0 = t0 * w;
      g0 += p0;
      INTERACT_ST(gj, INTERACT_LD(gj) + q0);
      if (V > 1) {
        const interact_v8 p1 = INTERACT_LD(tj + 8) * w, q1 = t1 * w;
        const interact_v8 p2 = INTERACT_LD(tj + 16) * w, q2 = t2 * w;
        const interact_v8 p3 = INTERACT_LD(tj + 24) * w, q3 = t3 * w;
        g1 += p1;
        g2 += p2;
        g3 += p3;
        INTERACT_ST(gj + 8, INTERACT_LD(gj + 8) + q1);
        INTERACT_ST(gj + 16, INTERACT_LD(gj + 16) + q2);
        INTERACT_ST(gj + 24, INTERACT_LD(gj + 24) + q3);
      }
    }
    if (off) {
      const float w2 = 2.0f * *dz++;
      const interact_v8 p0 = t0 * w2, p1 = t1 * w2, p2 = t2 * w2, p3 = t3 * w2;
      g0 += p0;
      g1 += p1;
      g2 += p2;
      g3 += p3;
    }
    INTERACT_ST(gi, g0);
    if (V > 1) {
      INTERACT_ST(gi + 8, g1);
      INTERACT_ST(gi + 16, g2);
      INTERACT_ST(gi + 24, g3);
    }
  }
}

/* dT[b][i] = sum_j dZ[i][j] T[j] + sum_j dZ[j][i] T[j] over the pairs taken;
 * a diagonal term Z[i][i] = |T_i|^2 contributes 2 dZ[i][i] T_i. The dense
 * pass-through R[b][0:d] adds to dT[b][0]. Element-wise in k (a product,
 * then an add, each its own statement), so both kernel sets give these
 * bits, whatever columns are taken together: in the AVX2 copy (wide) 32
 * at a time, then 8 (interact_bwd_cols), then the last d % 8 in the plain
 * loop, which the baseline runs over every column. */
DENSE_BODY cpu_interact_dot_backward_body(int wide, int B, int ni, int d, int itself,
                                          const float *T, const float *dR, int r_stride,
                                          float *dT) {
  int off = itself ? 1 : 0;
  for (int b = 0; b < B; b++) {
    const float *restrict t = T + (size_t)b * ni * d;
    const float *restrict dr = dR + (size_t)b * r_stride;
    float *restrict g = dT + (size_t)b * ni * d;
    for (int k = 0; k < d; k++) g[k] = dr[k];
    for (size_t k = d; k < (size_t)ni * d; k++) g[k] = 0.0f;
    const float *dz = dr + d;
    int k0 = 0;
    for (; wide && k0 + 32 <= d; k0 += 32) interact_bwd_cols(4, ni, d, off, k0, t, dz, g);
    for (; wide && k0 + 8 <= d; k0 += 8) interact_bwd_cols(1, ni, d, off, k0, t, dz, g);
    if (k0 == d) continue;
    for (int i = 0; i < ni; i++) {
      float *restrict gi = g + (size_t)i * d;
      const float *restrict ti = t + (size_t)i * d;
      for (int j = 0; j < i; j++) {
        float w = *dz++;
        const float *restrict tj = t + (size_t)j * d;
        float *restrict gj = g + (size_t)j * d;
        for (int k = k0; k < d; k++) {
          const float pi = w * tj[k], pj = w * ti[k];
          gi[k] += pi;
          gj[k] += pj;
        }
      }
      if (off) {
        float w2 = 2.0f * *dz++;
        for (int k = k0; k < d; k++) {
          const float p = w2 * ti[k];
          gi[k] += p;
        }
      }
    }
  }
}
DENSE_MULTIVERSION_WIDE(cpu_interact_dot_backward,
                   (int B, int ni, int d, int itself, const float *T, const float *dR,
                    int r_stride, float *dT),
                   (B, ni, d, itself, T, dR, r_stride, dT))

/* The interaction of each kernel set: the baseline's loops; the AVX2 set's
 * d == 16 in intrinsics, other widths in 8-float vectors (the baseline's
 * bits). */
void dense__interact_fwd_base(int B, int ni, int d, int itself, const float *T, float *R,
                              int r_stride) {
  cpu_interact_dot_forward_base(B, ni, d, itself, T, R, r_stride);
}
void dense__interact_bwd_base(int B, int ni, int d, int itself, const float *T,
                              const float *dR, int r_stride, float *dT) {
  cpu_interact_dot_backward_base(B, ni, d, itself, T, dR, r_stride, dT);
}
#if DENSE_X86
void dense__interact_fwd_avx2(int B, int ni, int d, int itself, const float *T, float *R,
                              int r_stride) {
  if (d == 16)
    interact_fwd_d16_avx2(B, ni, itself, T, R, r_stride);
  else
    cpu_interact_dot_forward_avx2(B, ni, d, itself, T, R, r_stride);
}
void dense__interact_bwd_avx2(int B, int ni, int d, int itself, const float *T,
                              const float *dR, int r_stride, float *dT) {
  if (d == 16)
    interact_bwd_d16_avx2(B, ni, itself, T, dR, r_stride, dT);
  else
    cpu_interact_dot_backward_avx2(B, ni, d, itself, T, dR, r_stride, dT);
}
#endif

