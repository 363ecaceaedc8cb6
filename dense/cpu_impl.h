/* The CPU backend's kernels, private to dense/: how a kernel body is
 * compiled for both kernel sets (backend_cpu.c), and the dot interaction's
 * kernels (interact_cpu.c). */
#ifndef SHARDREC_DENSE_CPU_IMPL_H
#define SHARDREC_DENSE_CPU_IMPL_H

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define DENSE_X86 1
#else
#define DENSE_X86 0
#endif

/* Element-wise kernels: one body, compiled twice, as name_base (baseline)
 * and name_avx2. -std=c11 keeps -ffp-contract=off, so both versions round
 * exactly alike: the AVX2 copy only moves more floats per instruction. */
#if DENSE_X86
#define DENSE_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define DENSE_MULTIVERSION(name, params, args)                \
  static void name##_base params { name##_body args; }        \
  static DENSE_TARGET_AVX2 void name##_avx2 params { name##_body args; }
#else
#define DENSE_MULTIVERSION(name, params, args) \
  static void name##_base params { name##_body args; }
#endif
#define DENSE_BODY static inline __attribute__((always_inline)) void
/* The same, the body's first argument saying which copy it is (wide: the
 * AVX2 one), for bodies whose 8-float vector code the baseline would run
 * slower than its plain loops (GCC splits each 32-byte vector op there). */
#define DENSE_UNPAREN(...) __VA_ARGS__
#if DENSE_X86
#define DENSE_MULTIVERSION_WIDE(name, params, args)                           \
  static void name##_base params { name##_body(0, DENSE_UNPAREN args); }    \
  static DENSE_TARGET_AVX2 void name##_avx2 params { name##_body(1, DENSE_UNPAREN args); }
#else
#define DENSE_MULTIVERSION_WIDE(name, params, args) \
  static void name##_base params { name##_body(0, DENSE_UNPAREN args); }
#endif


/* The dot interaction of B samples of ni rows of d floats, T[B][ni][d] ->
 * R[B][r_stride] (the dense pass-through T[b][0], then the pairs of the
 * lower triangle, the diagonal too when itself) and back, dR -> dT: the
 * baseline kernel set's, and the AVX2 set's (d == 16 in FMA intrinsics,
 * other widths the baseline's bits in 8-float vectors). */
void dense__interact_fwd_base(int B, int ni, int d, int itself, const float *T, float *R,
                              int r_stride);
void dense__interact_bwd_base(int B, int ni, int d, int itself, const float *T,
                              const float *dR, int r_stride, float *dT);
#if DENSE_X86
void dense__interact_fwd_avx2(int B, int ni, int d, int itself, const float *T, float *R,
                              int r_stride);
void dense__interact_bwd_avx2(int B, int ni, int d, int itself, const float *T,
                              const float *dR, int r_stride, float *dT);
#endif

#endif
