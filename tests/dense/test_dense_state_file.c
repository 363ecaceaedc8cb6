/* The dense state file (dense/state_file.h, a checkpoint's dense.bin):
 * the bytes written are the SRCKDENS v1 layout built here from its
 * description (so checkpoints written before the codec moved still load),
 * parameters, optimizer state and step count come back bit for bit for
 * every dense optimizer, a parameters-only load skips the optimizer part,
 * and every refusal (damaged, torn, foreign, another version, another
 * shape or optimizer, missing) names the file and changes nothing. */
#include <check.h>

#include "tests/check_main.h"
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/status.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "dense/state_file.h"
#include "tests/dense/dense_test_isa.h"
#include "tests/support/files.h"

static dense_config small_cfg(int itself) {
  dense_config c = {0};
  c.n_dense = 4;
  c.n_bot = 3;
  c.bot[0] = 4, c.bot[1] = 6, c.bot[2] = 3;
  c.n_top = 3;
  c.top[0] = 5, c.top[1] = 4, c.top[2] = 1;
  c.n_sparse = 3;
  c.emb_dim = 3;
  c.interaction = DENSE_INTERACT_DOT;
  c.interaction_itself = itself;
  c.max_batch = 8;
  return c;
}

/* A temporary folder and the file path in it. */
typedef struct tmpf {
  char *dir, path[128];
} tmpf;

static void tmpf_make(tmpf *t) {
  t->dir = tmpdir_make("dense-state");
  snprintf(t->path, sizeof t->path, "%s/dense.bin", t->dir);
}

static void tmpf_drop(tmpf *t) {
  unlink(t->path);
  ck_assert_int_eq(rmdir(t->dir), 0); /* nothing else was left there (no dense.bin.tmp) */
  free(t->dir);
}

static void spit(const char *path, const void *b, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert(fwrite(b, 1, len, f) == len);
  ck_assert_int_eq(fclose(f), 0);
}

static void flip_byte(const char *path, long at) {
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, at, SEEK_SET);
  int ch = fgetc(f);
  fseek(f, at, SEEK_SET);
  fputc(ch ^ 0x40, f);
  fclose(f);
}

/* An optimizer of kind over m's parameters that has taken steps steps of
 * random gradients, so that its state and step count are not the initial
 * ones (m's parameters move too). */
static dense_opt *trained_opt(dense_model *m, dense_opt_kind kind, int steps, uint64_t seed) {
  size_t n;
  float *p = dense_model_params(m, &n);
  char err[256];
  dense_opt_config oc = dense_opt_defaults(kind);
  dense_opt *o = dense_opt_create(&oc, n, err, sizeof err);
  ck_assert_msg(o != NULL, "%s", err);
  float *g = malloc(n * sizeof *g);
  sr_rng r;
  sr_rng_init(&r, seed, 0);
  for (int s = 0; s < steps; s++) {
    for (size_t i = 0; i < n; i++) g[i] = (float)(0.1 * sr_rng_normal(&r));
    ck_assert_int_eq(dense_opt_step(o, p, g, 0.01f), 0);
  }
  free(g);
  return o;
}

/* The SRCKDENS v1 bytes of parameters p[np], state s[ns], steps and kind,
 * built from the format's description (state_file.h), not from the codec. */
static unsigned char *expected_bytes(const float *p, size_t np, const float *s, size_t ns,
                                     int64_t steps, uint32_t kind, size_t *len) {
  *len = 256 + 4 * (np + ns) + 32;
  unsigned char *b = calloc(1, *len);
  uint32_t version = 1, hb = 256;
  uint64_t n1 = np, n2 = ns;
  memcpy(b, "SRCKDENS", 8);
  memcpy(b + 8, &version, 4);
  memcpy(b + 12, &hb, 4);
  memcpy(b + 16, &n1, 8);
  memcpy(b + 24, &n2, 8);
  memcpy(b + 32, &steps, 8);
  memcpy(b + 40, &kind, 4);
  memcpy(b + 256, p, 4 * np);
  if (ns) memcpy(b + 256 + 4 * np, s, 4 * ns);
  unsigned int dl = 0;
  ck_assert(EVP_Digest(b, *len - 32, b + *len - 32, &dl, EVP_sha256(), NULL) && dl == 32);
  return b;
}

START_TEST(test_bytes_are_the_format) {
  tmpf t;
  tmpf_make(&t);
  char err[512];
  dense_config c = small_cfg(0);
  dense_model *m = dense_model_create(&c, 3, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  dense_opt *o = trained_opt(m, DENSE_OPT_ADAM, 5, 11);
  size_t np, ns, len, want_len;
  const float *p = dense_model_params(m, &np), *s = dense_opt_state(o, &ns);
  ck_assert_uint_eq(ns, 2 * np);
  ck_assert_int_eq(dense_state_save(t.path, m, o, err, sizeof err), 0);
  unsigned char *got = (unsigned char *)slurp_file(t.path, &len, 1);
  unsigned char *want = expected_bytes(p, np, s, ns, 5, DENSE_OPT_ADAM, &want_len);
  ck_assert_uint_eq(len, want_len);
  ck_assert(memcmp(got, want, len) == 0);
  free(got);
  free(want);
  /* Without an optimizer: the parameters as SGD at step 0 (no state). */
  ck_assert_int_eq(dense_state_save(t.path, m, NULL, err, sizeof err), 0);
  got = (unsigned char *)slurp_file(t.path, &len, 1);
  want = expected_bytes(p, np, NULL, 0, 0, DENSE_OPT_SGD, &want_len);
  ck_assert_uint_eq(len, want_len);
  ck_assert(memcmp(got, want, len) == 0);
  free(got);
  free(want);
  dense_opt_destroy(o);
  dense_model_destroy(m);
  tmpf_drop(&t);
}
END_TEST

START_TEST(test_file_built_by_hand_loads) {
  /* A file made from the format's description alone (as a checkpoint
   * written by any earlier shardrec is) loads into a model and optimizer. */
  tmpf t;
  tmpf_make(&t);
  char err[512];
  dense_config c = small_cfg(0);
  dense_model *src = dense_model_create(&c, 4, err, sizeof err);
  dense_model *dst = dense_model_create(&c, 5, err, sizeof err);
  dense_opt *so = trained_opt(src, DENSE_OPT_ADAGRAD, 3, 12);
  dense_opt *dop = trained_opt(dst, DENSE_OPT_ADAGRAD, 0, 13);
  size_t np, ns, len;
  const float *p = dense_model_params(src, &np), *s = dense_opt_state(so, &ns);
  unsigned char *b = expected_bytes(p, np, s, ns, 3, DENSE_OPT_ADAGRAD, &len);
  spit(t.path, b, len);
  free(b);
  ck_assert_msg(dense_state_load(t.path, dst, dop, err, sizeof err) == 0, "%s", err);
  ck_assert(memcmp(dense_model_params(dst, NULL), p, np * 4) == 0);
  ck_assert(memcmp(dense_opt_state(dop, NULL), s, ns * 4) == 0);
  ck_assert_int_eq(dense_opt_steps(dop), 3);
  dense_opt_destroy(so);
  dense_opt_destroy(dop);
  dense_model_destroy(src);
  dense_model_destroy(dst);
  tmpf_drop(&t);
}
END_TEST

START_TEST(test_round_trip_every_optimizer) {
  const dense_opt_kind kinds[] = {DENSE_OPT_SGD, DENSE_OPT_ADAGRAD, DENSE_OPT_ADAM};
  char err[512];
  dense_config c = small_cfg(0);
  for (int k = 0; k < 3; k++) {
    tmpf t;
    tmpf_make(&t);
    dense_model *a = dense_model_create(&c, 1, err, sizeof err);
    dense_model *b = dense_model_create(&c, 2, err, sizeof err);
    dense_model *pb = dense_model_create(&c, 6, err, sizeof err);
    dense_opt *oa = trained_opt(a, kinds[k], 4 + k, 20 + (uint64_t)k);
    dense_opt *ob = trained_opt(b, kinds[k], 1, 30 + (uint64_t)k);
    size_t np, ns;
    const float *p = dense_model_params(a, &np), *s = dense_opt_state(oa, &ns);
    ck_assert(memcmp(p, dense_model_params(b, NULL), np * 4) != 0);
    ck_assert_int_eq(dense_state_save(t.path, a, oa, err, sizeof err), 0);
    ck_assert_int_eq(dense_state_check(t.path, b, ob, err, sizeof err), 0);
    ck_assert(memcmp(p, dense_model_params(b, NULL), np * 4) != 0); /* check loads nothing */
    ck_assert_msg(dense_state_load(t.path, b, ob, err, sizeof err) == 0, "%s", err);
    ck_assert(memcmp(p, dense_model_params(b, NULL), np * 4) == 0);
    if (ns) ck_assert(memcmp(s, dense_opt_state(ob, NULL), ns * 4) == 0);
    ck_assert_int_eq(dense_opt_steps(ob), 4 + k);
    /* The parameters alone, whatever the optimizer part holds. */
    ck_assert_msg(dense_state_load(t.path, pb, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert(memcmp(p, dense_model_params(pb, NULL), np * 4) == 0);
    dense_opt_destroy(oa);
    dense_opt_destroy(ob);
    dense_model_destroy(a);
    dense_model_destroy(b);
    dense_model_destroy(pb);
    tmpf_drop(&t);
  }
}
END_TEST

/* b's parameters and o's state and steps, to compare after a refusal. */
typedef struct snap {
  float *p, *s;
  size_t np, ns;
  int64_t steps;
} snap;

static snap snap_take(dense_model *b, dense_opt *o) {
  snap x = {0};
  const float *p = dense_model_params(b, &x.np), *s = dense_opt_state(o, &x.ns);
  x.p = malloc(x.np * 4);
  x.s = malloc(x.ns * 4 + 4);
  memcpy(x.p, p, x.np * 4);
  memcpy(x.s, s, x.ns * 4);
  x.steps = dense_opt_steps(o);
  return x;
}

static void snap_same(const snap *x, dense_model *b, dense_opt *o) {
  ck_assert(memcmp(x->p, dense_model_params(b, NULL), x->np * 4) == 0);
  ck_assert(memcmp(x->s, dense_opt_state(o, NULL), x->ns * 4) == 0);
  ck_assert_int_eq(dense_opt_steps(o), x->steps);
}

/* path refused by load (and check) with rc and a message naming path and
 * holding what; b and o unchanged. */
static void refused(const char *path, dense_model *b, dense_opt *o, int rc, const char *what) {
  char err[512];
  snap x = snap_take(b, o);
  ck_assert_int_eq(dense_state_check(path, b, o, err, sizeof err), rc);
  ck_assert_int_eq(dense_state_load(path, b, o, err, sizeof err), rc);
  ck_assert_msg(strstr(err, path) && strstr(err, what), "%s (want '%s')", err, what);
  snap_same(&x, b, o);
  free(x.p);
  free(x.s);
}

START_TEST(test_refusals_change_nothing) {
  tmpf t;
  tmpf_make(&t);
  char err[512];
  dense_config c = small_cfg(0);
  dense_model *a = dense_model_create(&c, 1, err, sizeof err);
  dense_model *b = dense_model_create(&c, 2, err, sizeof err);
  dense_opt *oa = trained_opt(a, DENSE_OPT_ADAGRAD, 3, 40);
  dense_opt *ob = trained_opt(b, DENSE_OPT_ADAGRAD, 2, 41);
  size_t np, ns;
  dense_model_params(a, &np);
  dense_opt_state(oa, &ns);
  const long size = 256 + 4 * (long)(np + ns) + 32;
  /* A parameter byte, a state byte, a reserved header byte, the trailer. */
  const long at[] = {256 + 5, 256 + 4 * (long)np + 3, 100, size - 1};
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(dense_state_save(t.path, a, oa, err, sizeof err), 0);
    flip_byte(t.path, at[i]);
    refused(t.path, b, ob, SR_ECHECKSUM, "checksum mismatch (file damaged)");
  }
  /* Another version. */
  ck_assert_int_eq(dense_state_save(t.path, a, oa, err, sizeof err), 0);
  flip_byte(t.path, 8);
  refused(t.path, b, ob, SR_EVERSION, "version");
  /* Torn: a float short, a float long, the header's count changed. */
  ck_assert_int_eq(dense_state_save(t.path, a, oa, err, sizeof err), 0);
  ck_assert_int_eq(truncate(t.path, size - 4), 0);
  refused(t.path, b, ob, SR_EFORMAT, "torn or truncated");
  ck_assert_int_eq(truncate(t.path, size + 4), 0);
  refused(t.path, b, ob, SR_EFORMAT, "torn or truncated");
  ck_assert_int_eq(dense_state_save(t.path, a, oa, err, sizeof err), 0);
  flip_byte(t.path, 16);
  refused(t.path, b, ob, SR_EFORMAT, "torn or truncated");
  /* Too short for a header, a foreign file. */
  ck_assert_int_eq(truncate(t.path, 10), 0);
  refused(t.path, b, ob, SR_EFORMAT, "bad magic or too short");
  FILE *f = fopen(t.path, "w");
  for (int i = 0; i < 100; i++) fputs("not a dense state file\n", f);
  fclose(f);
  refused(t.path, b, ob, SR_EFORMAT, "bad magic or too short");
  /* Another optimizer: its kind, or no state where adagrad keeps one. */
  dense_opt *adam = trained_opt(a, DENSE_OPT_ADAM, 1, 42);
  ck_assert_int_eq(dense_state_save(t.path, a, adam, err, sizeof err), 0);
  refused(t.path, b, ob, SR_EMISMATCH, "optimizer kind 2");
  ck_assert_int_eq(dense_state_save(t.path, a, NULL, err, sizeof err), 0);
  refused(t.path, b, ob, SR_EMISMATCH, "holds");
  /* Another shape (the dot interaction's diagonal widens the top MLP). */
  dense_config c2 = small_cfg(1);
  dense_model *o = dense_model_create(&c2, 1, err, sizeof err);
  ck_assert_msg(o != NULL, "%s", err);
  ck_assert_int_eq(dense_state_save(t.path, o, NULL, err, sizeof err), 0);
  snap x = snap_take(b, ob);
  ck_assert_int_eq(dense_state_load(t.path, b, NULL, err, sizeof err), SR_EMISMATCH);
  ck_assert_msg(strstr(err, "parameters; this model has"), "%s", err);
  snap_same(&x, b, ob);
  free(x.p);
  free(x.s);
  /* Missing. */
  unlink(t.path);
  refused(t.path, b, ob, SR_EIO, "cannot read");
  dense_opt_destroy(oa);
  dense_opt_destroy(ob);
  dense_opt_destroy(adam);
  dense_model_destroy(a);
  dense_model_destroy(b);
  dense_model_destroy(o);
  tmpf_drop(&t);
}
END_TEST

START_TEST(test_failed_save_leaves_the_old_file) {
  tmpf t;
  tmpf_make(&t);
  char err[512], bad[300];
  dense_config c = small_cfg(0);
  dense_model *a = dense_model_create(&c, 1, err, sizeof err);
  ck_assert_int_eq(dense_state_save(t.path, a, NULL, err, sizeof err), 0);
  size_t len0, len1;
  unsigned char *before = (unsigned char *)slurp_file(t.path, &len0, 1);
  /* path.tmp is a folder: the temporary file cannot be made. */
  snprintf(bad, sizeof bad, "%s.tmp", t.path);
  ck_assert_int_eq(mkdir(bad, 0755), 0);
  dense_model *b = dense_model_create(&c, 9, err, sizeof err);
  ck_assert_int_eq(dense_state_save(t.path, b, NULL, err, sizeof err), SR_EIO);
  ck_assert_msg(strstr(err, "dense.bin.tmp") && strstr(err, "cannot write"), "%s", err);
  unsigned char *after = (unsigned char *)slurp_file(t.path, &len1, 1);
  ck_assert_uint_eq(len0, len1);
  ck_assert(memcmp(before, after, len0) == 0);
  ck_assert_int_eq(rmdir(bad), 0);
  free(before);
  free(after);
  dense_model_destroy(a);
  dense_model_destroy(b);
  tmpf_drop(&t);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("dense_state_file");
  TCase *t = tcase_create("state_file");
  tcase_add_test(t, test_bytes_are_the_format);
  tcase_add_test(t, test_file_built_by_hand_loads);
  tcase_add_test(t, test_round_trip_every_optimizer);
  tcase_add_test(t, test_refusals_change_nothing);
  tcase_add_test(t, test_failed_save_leaves_the_old_file);
  suite_add_tcase(s, t);
  return s;
}

int main(int argc, char **argv) {
  dense_test_isa_args(argc, argv);
  return sr_check_run(suite());
}
