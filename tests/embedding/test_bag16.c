/* Pooling of 16-bit rows (embedding/bag16.h) and the in-process store's
 * lookups that hand them (emb_store_lookup_begin_rows16).
 *
 * Asserts: emb_bag_forward16 over fp16 and bf16 rows (every dim 1..40, so
 * the 8-wide kernel's tail runs; sum and mean; empty bags; repeated rows;
 * values across the formats' range, subnormals and infinities among them)
 * gives the bits of emb_bag_forward over the same rows widened to floats,
 * with the plain C kernel and with the vector one alike, and writes
 * nothing past each bag's dim. The in-process store's 16-bit lookup of a
 * plan with an fp16, a bf16 and an fp32 table gives, for rows pushed and
 * rows never written, the 16-bit values whose floats its float lookup
 * gives, and the fp32 table's floats as they are. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "common/rng.h"
#include "embedding/bag.h"
#include "embedding/bag16.h"
#include "embedding/plan.h"
#include "embedding/store.h"

enum { NU = 12, NB = 9, MAXD = 40 };

/* A 16-bit value of the format from random bits: mostly ordinary
 * magnitudes, some subnormals, some infinities (no NaNs: a NaN's sum is
 * any NaN). */
static uint16_t draw(sr_rng *r, int bf16) {
  uint32_t u = (uint32_t)sr_rng_below(r, 1u << 16), pick = (uint32_t)sr_rng_below(r, 16);
  uint16_t h;
  if (bf16) {
    h = (uint16_t)((u & 0x807f) | ((120 + u % 16) << 7)); /* about 2^-7 .. 2^8 */
    if (pick == 0) h = (uint16_t)(u & 0x807f);             /* subnormal or zero */
    if (pick == 1) h = (uint16_t)((u & 0x8000) | 0x7f80);  /* infinity */
  } else {
    h = (uint16_t)((u & 0x83ff) | ((8 + u % 16) << 10));
    if (pick == 0) h = (uint16_t)(u & 0x83ff);
    if (pick == 1) h = (uint16_t)((u & 0x8000) | 0x7c00);
  }
  return h;
}

START_TEST(test_forward16_bits) {
  sr_rng r;
  sr_rng_init(&r, 11, 0);
  static uint16_t h[NU * MAXD];
  static float f[NU * MAXD], want[NB * (MAXD + 3)], got[NB * (MAXD + 3)];
  uint32_t offsets[NB + 1], inverse[64];
  int checked = 0;
  for (int bf = 0; bf < 2; bf++)
    for (int dim = 1; dim <= MAXD; dim++)
      for (int pool = 0; pool < 2; pool++) {
        for (int i = 0; i < NU * dim; i++) h[i] = draw(&r, bf);
        for (int i = 0; i < NU * dim; i++) f[i] = bf ? sr_bf16_to_f32(h[i]) : sr_f16_to_f32(h[i]);
        uint32_t at = 7; /* offsets need not start at 0 */
        for (int i = 0; i <= NB; i++) {
          offsets[i] = at;
          at += i == 3 ? 0 : (uint32_t)sr_rng_below(&r, 6); /* bag 3 empty */
        }
        for (uint32_t k = 0; k < at - 7; k++) inverse[k] = (uint32_t)sr_rng_below(&r, NU);
        const emb_pooling p = pool ? EMB_POOL_MEAN : EMB_POOL_SUM;
        const size_t stride = (size_t)dim + 3;
        for (size_t i = 0; i < NB * stride; i++) want[i] = got[i] = -7.0f;
        emb_bag_forward(p, dim, NB, offsets, inverse, f, want, stride);
        for (int k = 0; k < 2; k++) {
          for (size_t i = 0; i < NB * stride; i++) got[i] = -7.0f;
          emb_bag_forward16(p, bf ? EMB_PREC_BF16 : EMB_PREC_FP16, k ? SR_HALF_AUTO : SR_HALF_C,
                            dim, NB, offsets, inverse, h, got, stride);
          ck_assert_msg(!memcmp(want, got, sizeof(float) * NB * stride),
                        "%s dim %d %s, %s kernel: not emb_bag_forward's bits", bf ? "bf16" : "fp16",
                        dim, pool ? "mean" : "sum", k ? "vector" : "C");
          checked++;
        }
      }
  ck_assert_int_eq(checked, 2 * MAXD * 2 * 2);
}
END_TEST

START_TEST(test_store_rows16) {
  static const uint64_t rows[] = {5000, 5000, 5000};
  emb_plan_params pp;
  memset(&pp, 0, sizeof pp);
  pp.n_tables = 3;
  pp.rows = rows;
  pp.dim = 24;
  pp.optim.kind = EMB_OPT_ROWWISE_ADAGRAD;
  pp.optim.eps = -1;
  pp.seed = 5;
  pp.n_shards = 1;
  pp.precision = EMB_PREC_FP16;
  char err[256];
  emb_plan *p = NULL;
  ck_assert_int_eq(emb_plan_create(&pp, &p, err, sizeof err), 0);
  p->tables[1].precision = EMB_PREC_BF16;
  p->tables[2].precision = EMB_PREC_FP32;
  emb_store *s = emb_store_create_local(p, err, sizeof err);
  ck_assert_ptr_nonnull(s);
  ck_assert(emb_store_has_rows16(s));
  enum { N = 300 };
  static uint64_t id[N];
  static float g[3][N * 24], fl[3][N * 24], raw[3][N * 24];
  for (int i = 0; i < N; i++) id[i] = (uint64_t)i * 13 % 5000;
  for (int t = 0; t < 3; t++)
    for (int i = 0; i < N * 24; i++) g[t][i] = (float)((i * 7 + t) % 23) * 0.01f - 0.1f;
  const uint64_t *ip[3] = {id, id, id};
  size_t half[3] = {N / 2, N / 2, N / 2}, all[3] = {N, N, N}; /* the rest never written */
  emb_idset pushed = {3, ip, half}, set = {3, ip, all};
  const float *gp[3] = {g[0], g[1], g[2]};
  ck_assert_int_eq(emb_store_push(s, 1, 0.3f, &pushed, gp), 0);
  float *fo[3] = {fl[0], fl[1], fl[2]};
  void *ro[3] = {raw[0], raw[1], raw[2]};
  ck_assert_int_eq(emb_store_lookup_begin(s, 2, &set, fo), 0);
  ck_assert_int_eq(emb_store_lookup_wait(s), 0);
  ck_assert_int_eq(emb_store_lookup_begin_rows16(s, 2, &set, (void *const *)ro), 0);
  ck_assert_int_eq(emb_store_lookup_wait(s), 0);
  for (int t = 0; t < 2; t++) {
    const uint16_t *h = (const uint16_t *)(const void *)raw[t];
    for (int i = 0; i < N * 24; i++) {
      float v = t == 0 ? sr_f16_to_f32(h[i]) : sr_bf16_to_f32(h[i]);
      ck_assert_msg(!memcmp(&v, &fl[t][i], sizeof v), "table %d value %d: %a, the float lookup's %a",
                    t, i, (double)v, (double)fl[t][i]);
    }
  }
  ck_assert(!memcmp(raw[2], fl[2], sizeof fl[2])); /* the fp32 table's floats */
  emb_store_destroy(s);
  emb_plan_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("emb_bag16");
  TCase *tc = tcase_create("bag16");
  tcase_add_test(tc, test_forward16_bits);
  tcase_add_test(tc, test_store_rows16);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
