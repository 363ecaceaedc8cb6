/* Tests for datasets/transform.c, the data transform a model carries: its
 * file round trip and fingerprint (the SHA-256 of the file), the parser's
 * refusals of a damaged or foreign file, how two transforms relate (same,
 * extended, different, with the first difference), dictionaries extended
 * over new data, and a TSV source mapping its lines with a given transform
 * (dictionary with the unseen id and max_ind_range, modulo, hash). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/sha256.h"
#include "common/status.h"
#include "datasets/source.h"
#include "datasets/transform.h"
#include "tests/check_main.h"
#include "tests/support/files.h"

static char *tmpdir;

static void setup(void) { tmpdir = tmpdir_make("xform"); }

static void teardown(void) {
  sr_rmtree(tmpdir);
  free(tmpdir);
}

static const char *tpath(const char *name) { return tmp_join(tmpdir, name); }

/* A finalized dictionary at threshold thr: column c counts values
 * vals[c][0 .. n[c]) in that order (columns past n_cols get none). */
static ds_criteo_dict *dict_of(uint32_t thr, int n_cols, const uint32_t *const *vals,
                               const int *n) {
  ds_criteo_dict *d = ds_criteo_dict_create(thr);
  ck_assert(d != NULL);
  for (int c = 0; c < n_cols; c++)
    for (int i = 0; i < n[c]; i++) ck_assert_int_eq(ds_criteo_dict_add(d, c, vals[c][i]), 0);
  ck_assert_int_eq(ds_criteo_dict_finalize(d), 0);
  return d;
}

/* A dictionary transform: C1 keeps 0x10, 0x20, 0x30; C2 keeps 0x7; C5
 * keeps 0xabc. */
static ds_transform *small_dict(void) {
  static const uint32_t c1[] = {0x10, 0x20, 0x30}, c2[] = {0x7}, c5[] = {0xabc};
  const uint32_t *v[5] = {c1, c2, NULL, NULL, c5};
  const int n[5] = {3, 1, 0, 0, 1};
  ds_transform *t = ds_transform_create(DS_IDS_DICT, 0, 1, dict_of(1, 5, v, n));
  ck_assert(t != NULL);
  return t;
}

/* The file's bytes (malloc'd) and their count. */
static unsigned char *file_bytes(const char *path, size_t *len) {
  return (unsigned char *)slurp_file(path, len, 1);
}

START_TEST(test_round_trip_fingerprint) {
  ds_transform *ts[3] = {small_dict(), ds_transform_create(DS_IDS_MODULO, 1000, 0, NULL),
                         ds_transform_create(DS_IDS_HASH, 0, 0, NULL)};
  for (int k = 0; k < 3; k++) {
    ds_transform *t = ts[k], *u = NULL;
    ck_assert(t != NULL);
    char fp[SR_SHA256_HEX], fp2[SR_SHA256_HEX], fp3[SR_SHA256_HEX], fpf[SR_SHA256_HEX],
        err[512];
    ck_assert_int_eq(ds_transform_save(t, tpath("t.bin"), fp, err, sizeof err), 0);
    /* The fingerprint is the SHA-256 of the file written. */
    uint64_t size;
    ck_assert_int_eq(sr_sha256_file(tpath("t.bin"), fpf, &size), 0);
    ck_assert_str_eq(fp, fpf);
    uint64_t n_vals = k == 0 ? 5 : 0;
    ck_assert_uint_eq(size, DS_XFORM_HEADER_BYTES + 4 * n_vals);
    ck_assert_int_eq(ds_transform_load(tpath("t.bin"), &u, fp2, err, sizeof err), 0);
    ck_assert_str_eq(fp2, fp);
    ck_assert_int_eq(ds_transform_fingerprint(u, fp3), 0);
    ck_assert_str_eq(fp3, fp);
    ck_assert_int_eq(ds_transform_compare(t, u, NULL, 0), DS_XFORM_SAME);
    ck_assert_int_eq(u->id_mode, t->id_mode);
    ck_assert_uint_eq(u->max_ind_range, t->max_ind_range);
    for (int c = 0; c < DS_NUM_SPARSE; c++)
      for (uint32_t v = 0; v < 0x40; v += 7)
        ck_assert_uint_eq(ds_transform_map(u, c, v), ds_transform_map(t, c, v));
    ds_transform_free(u);
  }
  /* Three modes, three fingerprints. */
  char a[SR_SHA256_HEX], b[SR_SHA256_HEX], c[SR_SHA256_HEX];
  ds_transform_fingerprint(ts[0], a);
  ds_transform_fingerprint(ts[1], b);
  ds_transform_fingerprint(ts[2], c);
  ck_assert(strcmp(a, b) && strcmp(b, c) && strcmp(a, c));
  /* The table sizes: 1 + kept values, the range, unbounded. */
  uint64_t sizes[DS_NUM_SPARSE];
  ds_transform_table_sizes(ts[0], sizes);
  ck_assert_uint_eq(sizes[0], 4);
  ck_assert_uint_eq(sizes[1], 2);
  ck_assert_uint_eq(sizes[2], 1);
  ds_transform_table_sizes(ts[1], sizes);
  ck_assert_uint_eq(sizes[25], 1000);
  ds_transform_table_sizes(ts[2], sizes);
  ck_assert_uint_eq(sizes[7], 0);
  for (int k = 0; k < 3; k++) ds_transform_free(ts[k]);
}
END_TEST

/* Parse bytes (len of them) and expect status want with want_text in the
 * message. */
static void assert_refused(const unsigned char *p, size_t len, int want, const char *want_text) {
  ds_transform *t = (ds_transform *)1;
  char err[512] = "";
  ck_assert_int_eq(ds_transform_parse(p, len, "X.bin", &t, err, sizeof err), want);
  ck_assert(t == NULL);
  ck_assert_msg(!strncmp(err, "X.bin: ", 7) && strstr(err, want_text), "want '%s', got '%s'",
                want_text, err);
}

START_TEST(test_parse_refusals) {
  ds_transform *t = small_dict();
  char err[512];
  ck_assert_int_eq(ds_transform_save(t, tpath("t.bin"), NULL, err, sizeof err), 0);
  size_t len;
  unsigned char *good = file_bytes(tpath("t.bin"), &len), *p = malloc(len + 64);
  ck_assert(good && p);
  ds_transform *u = NULL;
  ck_assert_int_eq(ds_transform_parse(good, len, "X.bin", &u, err, sizeof err), 0);
  ds_transform_free(u);
  /* Another magic. */
  memcpy(p, good, len);
  p[3] ^= 1;
  assert_refused(p, len, SR_EFORMAT, "not a shardrec data transform (no SRXFORM1 header)");
  /* Another version. */
  memcpy(p, good, len);
  p[8] = 2;
  assert_refused(p, len, SR_EVERSION, "transform version 2, this shardrec reads 1");
  /* Torn: in the header, and in the values. */
  assert_refused(good, 100, SR_EFORMAT, "not a shardrec data transform");
  assert_refused(good, len - 3, SR_EFORMAT, "do not fit the");
  assert_refused(good, len - 4, SR_EFORMAT, "do not fit the");
  /* A byte too many. */
  memcpy(p, good, len);
  p[len] = 0;
  assert_refused(p, len + 1, SR_EFORMAT, "bytes, its header says");
  /* C3 claims values past the file's end. */
  memcpy(p, good, len);
  uint64_t huge = 1000;
  memcpy(p + 40 + 8 * 2, &huge, 8);
  assert_refused(p, len, SR_EFORMAT, "C3's 1000 values do not fit the");
  /* A value listed twice in C1 (0x10, 0x20, 0x10). */
  memcpy(p, good, len);
  uint32_t dup = 0x10;
  memcpy(p + DS_XFORM_HEADER_BYTES + 8, &dup, 4);
  assert_refused(p, len, SR_EFORMAT, "dictionary C1: value 0x10 is entries");
  /* A dictionary of threshold 0 (the writer says 1): not canonical bytes. */
  memcpy(p, good, len);
  memset(p + 24, 0, 4);
  assert_refused(p, len, SR_EFORMAT, "header: id mode 0, range 0, frequency threshold 0,");
  free(good);
  ds_transform_free(t);
  /* Modulo with range 0, hash with a range: not transforms. */
  t = ds_transform_create(DS_IDS_MODULO, 50, 0, NULL);
  ck_assert_int_eq(ds_transform_save(t, tpath("m.bin"), NULL, err, sizeof err), 0);
  good = file_bytes(tpath("m.bin"), &len);
  memcpy(p, good, len);
  memset(p + 16, 0, 8);
  assert_refused(p, len, SR_EFORMAT, "header: id mode 1, range 0,");
  memcpy(p, good, len);
  uint32_t mode = DS_IDS_HASH;
  memcpy(p + 12, &mode, 4);
  assert_refused(p, len, SR_EFORMAT, "header: id mode 2, range 50,");
  /* An unknown mode. */
  mode = 7;
  memcpy(p + 12, &mode, 4);
  assert_refused(p, len, SR_EFORMAT, "is not a transform this shardrec knows");
  free(good);
  free(p);
  ds_transform_free(t);
  /* A file that is not there. */
  ck_assert_int_eq(ds_transform_load(tpath("none.bin"), &u, NULL, err, sizeof err), SR_EIO);
  ck_assert_msg(strstr(err, "none.bin: cannot read: No such file"), "%s", err);
}
END_TEST

START_TEST(test_compare) {
  ds_transform *a = small_dict(), *b = small_dict();
  char why[256] = "";
  ck_assert_int_eq(ds_transform_compare(a, b, why, sizeof why), DS_XFORM_SAME);
  /* b with two values added at the end of C2 (and the others kept). */
  ds_criteo_dict *d = ds_criteo_dict_extend(a->dict, 1);
  ck_assert(d != NULL);
  ds_criteo_dict_add(d, 1, 0x8);
  ds_criteo_dict_add(d, 1, 0x7);
  ds_criteo_dict_add(d, 1, 0x9);
  ck_assert_int_eq(ds_criteo_dict_finalize(d), 0);
  ds_transform *ext = ds_transform_create(DS_IDS_DICT, 0, 1, d);
  ck_assert_int_eq(ds_transform_compare(a, ext, why, sizeof why), DS_XFORM_EXTENDS);
  ck_assert_str_eq(why, "C2: 2 values added after its 1");
  /* The other way round: fewer values. */
  ck_assert_int_eq(ds_transform_compare(ext, a, why, sizeof why), DS_XFORM_DIFFERS);
  ck_assert_str_eq(why, "C2: 3 kept values in one, 1 in the other");
  /* A value at another id. */
  static const uint32_t c1[] = {0x10, 0x30, 0x20};
  const uint32_t *v[1] = {c1};
  const int n[1] = {3};
  ds_transform *other = ds_transform_create(DS_IDS_DICT, 0, 1, dict_of(1, 1, v, n));
  ck_assert_int_eq(ds_transform_compare(a, other, why, sizeof why), DS_XFORM_DIFFERS);
  ck_assert_str_eq(why, "C1: id 2 is value 0x20 in one, 0x30 in the other");
  /* Another mode, range or threshold. */
  ds_transform *h = ds_transform_create(DS_IDS_HASH, 0, 0, NULL);
  ck_assert_int_eq(ds_transform_compare(a, h, why, sizeof why), DS_XFORM_DIFFERS);
  ck_assert_str_eq(why, "dictionary (max-ind-range 0, frequency threshold 1) in one, hash (0, 0) "
                        "in the other");
  ds_transform *m1 = ds_transform_create(DS_IDS_MODULO, 100, 0, NULL),
               *m2 = ds_transform_create(DS_IDS_MODULO, 200, 0, NULL);
  ck_assert_int_eq(ds_transform_compare(m1, m2, why, sizeof why), DS_XFORM_DIFFERS);
  ck_assert_msg(strstr(why, "modulo (max-ind-range 100,") && strstr(why, "modulo (200, 0)"), "%s",
                why);
  ck_assert_int_eq(ds_transform_compare(m1, m1, NULL, 0), DS_XFORM_SAME);
  ds_transform *t2 = ds_transform_clone(a);
  t2->frequency_threshold = 2;
  ck_assert_int_eq(ds_transform_compare(a, t2, why, sizeof why), DS_XFORM_DIFFERS);
  ck_assert_msg(strstr(why, "frequency threshold 1) in one, dictionary (0, 2)"), "%s", why);
  /* Their fingerprints: equal exactly when the relation is SAME. */
  char fa[SR_SHA256_HEX], fb[SR_SHA256_HEX], fe[SR_SHA256_HEX];
  ds_transform_fingerprint(a, fa);
  ds_transform_fingerprint(b, fb);
  ds_transform_fingerprint(ext, fe);
  ck_assert_str_eq(fa, fb);
  ck_assert_str_ne(fa, fe);
  ds_transform *ts[] = {a, b, ext, other, h, m1, m2, t2};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) ds_transform_free(ts[i]);
}
END_TEST

START_TEST(test_dict_extend) {
  /* Base: C1 keeps 0xa, 0xb, 0xc (ids 1..3). */
  static const uint32_t c1[] = {0xa, 0xb, 0xc};
  const uint32_t *v[1] = {c1};
  const int n[1] = {3};
  ds_criteo_dict *base = dict_of(1, 1, v, n);
  /* New data at threshold 2: f, d, e, d, f, b, g, e... in that order:
   * 0xf and 0xd are seen twice (0xf first), 0xe twice, 0x9 once; 0xb once,
   * but it is base's and keeps its id; 0xa is not seen and keeps its id. */
  static const uint32_t seen[] = {0xf, 0xd, 0xe, 0xd, 0xf, 0xb, 0x9, 0xe};
  ds_criteo_dict *d = ds_criteo_dict_extend(base, 2);
  ck_assert(d != NULL);
  for (size_t i = 0; i < sizeof seen / sizeof *seen; i++) ds_criteo_dict_add(d, 0, seen[i]);
  ck_assert_int_eq(ds_criteo_dict_finalize(d), 0);
  ck_assert_uint_eq(ds_criteo_dict_lookup(d, 0, 0xa), 1);
  ck_assert_uint_eq(ds_criteo_dict_lookup(d, 0, 0xb), 2);
  ck_assert_uint_eq(ds_criteo_dict_lookup(d, 0, 0xc), 3);
  ck_assert_uint_eq(ds_criteo_dict_lookup(d, 0, 0xf), 4);
  ck_assert_uint_eq(ds_criteo_dict_lookup(d, 0, 0xd), 5);
  ck_assert_uint_eq(ds_criteo_dict_lookup(d, 0, 0xe), 6);
  ck_assert_uint_eq(ds_criteo_dict_lookup(d, 0, 0x9), 0); /* seen once: not kept */
  ck_assert_uint_eq(ds_criteo_dict_size(d, 0), 7);
  ck_assert_uint_eq(ds_criteo_dict_size(d, 1), 1);
  uint64_t k;
  const uint32_t *vals = ds_criteo_dict_values(d, 0, &k);
  ck_assert_uint_eq(k, 6);
  static const uint32_t want[] = {0xa, 0xb, 0xc, 0xf, 0xd, 0xe};
  for (int i = 0; i < 6; i++) ck_assert_uint_eq(vals[i], want[i]);
  /* As transforms: the extension EXTENDS the base. */
  ds_transform *tb = ds_transform_create(DS_IDS_DICT, 0, 1, base),
               *te = ds_transform_create(DS_IDS_DICT, 0, 1, d);
  char why[256];
  ck_assert_int_eq(ds_transform_compare(tb, te, why, sizeof why), DS_XFORM_EXTENDS);
  ck_assert_str_eq(why, "C1: 3 values added after its 3");
  ds_transform_free(tb);
  ds_transform_free(te);
}
END_TEST

/* A labelled Criteo line: I1..I13 = 1; C1 = c1, C2 = c2, the others 0x7. */
static void line(char *out, size_t n, uint32_t c1, uint32_t c2) {
  int k = snprintf(out, n, "1");
  for (int d = 0; d < 13; d++) k += snprintf(out + k, n - (size_t)k, "\t1");
  k += snprintf(out + k, n - (size_t)k, "\t%x\t%x", c1, c2);
  for (int c = 2; c < 26; c++) k += snprintf(out + k, n - (size_t)k, "\t7");
  snprintf(out + k, n - (size_t)k, "\n");
}

/* The ids of C1 and C2 (one-hot) of the lines of path read with t: ids[i][0..1]. */
static void read_ids(const char *path, const ds_transform *t, int n_lines, uint64_t ids[][2]) {
  ds_source_opts o = {.path = path, .transform = t, .read_ahead = -1};
  char err[512];
  ds_source *s = ds_source_open(&o, err, sizeof err);
  ck_assert_msg(s != NULL, "%s", err);
  ck_assert(ds_source_transform(s) == t);
  ds_batch b;
  ck_assert_int_eq(ds_batch_init(&b, 16), 0);
  ck_assert_int_eq(ds_source_next(s, &b, 16), n_lines);
  for (int i = 0; i < n_lines; i++)
    for (int f = 0; f < 2; f++) ids[i][f] = b.ids[ds_batch_offsets(&b, f)[i]];
  ds_batch_free(&b);
  ds_source_destroy(s);
}

START_TEST(test_source_maps_with_transform) {
  char text[4096] = "", l[512];
  /* (C1, C2) per line. */
  static const uint32_t vals[][2] = {{0x10, 0x7}, {0x30, 0x8}, {0x99, 0x7}, {0x20, 0x7},
                                     {0x16d, 0x12}};
  const int n_lines = 5;
  for (int i = 0; i < n_lines; i++) {
    line(l, sizeof l, vals[i][0], vals[i][1]);
    strcat(text, l);
  }
  file_put(tpath("x.tsv"), text);
  uint64_t ids[5][2];
  /* Dictionary: kept values by their ids, every other value (0x99, 0x8
   * never kept) the unseen id 0; no dictionary built from the file (0x99
   * would have an id then). */
  ds_transform *t = small_dict();
  read_ids(tpath("x.tsv"), t, n_lines, ids);
  static const uint64_t want_dict[][2] = {{1, 1}, {3, 0}, {0, 1}, {2, 1}, {0, 0}};
  for (int i = 0; i < n_lines; i++)
    for (int f = 0; f < 2; f++)
      ck_assert_msg(ids[i][f] == want_dict[i][f], "line %d C%d: id %llu, want %llu", i + 1, f + 1,
                    (unsigned long long)ids[i][f], (unsigned long long)want_dict[i][f]);
  ds_transform_free(t);
  /* Dictionary after % max_ind_range 100: C1 keeps 0x10 (16) and 0x41
   * (65): 0x16d = 365 -> 65 -> id 2; 0x99 = 153 -> 53, not kept -> 0. */
  static const uint32_t k1[] = {0x10, 0x41}, k2[] = {0x7, 0x12};
  const uint32_t *kv[2] = {k1, k2};
  const int kn[2] = {2, 2};
  t = ds_transform_create(DS_IDS_DICT, 100, 1, dict_of(1, 2, kv, kn));
  read_ids(tpath("x.tsv"), t, n_lines, ids);
  static const uint64_t want_range[][2] = {{1, 1}, {0, 0}, {0, 1}, {0, 1}, {2, 2}};
  for (int i = 0; i < n_lines; i++)
    for (int f = 0; f < 2; f++)
      ck_assert_msg(ids[i][f] == want_range[i][f], "range, line %d C%d: id %llu, want %llu",
                    i + 1, f + 1, (unsigned long long)ids[i][f],
                    (unsigned long long)want_range[i][f]);
  ds_transform_free(t);
  /* Modulo 0x20 and hash. */
  t = ds_transform_create(DS_IDS_MODULO, 0x20, 0, NULL);
  read_ids(tpath("x.tsv"), t, n_lines, ids);
  for (int i = 0; i < n_lines; i++)
    for (int f = 0; f < 2; f++) ck_assert_uint_eq(ids[i][f], vals[i][f] % 0x20);
  ds_transform_free(t);
  t = ds_transform_create(DS_IDS_HASH, 0, 0, NULL);
  read_ids(tpath("x.tsv"), t, n_lines, ids);
  for (int i = 0; i < n_lines; i++)
    for (int f = 0; f < 2; f++) ck_assert_uint_eq(ids[i][f], ds_criteo_hash_id(f, vals[i][f]));
  ck_assert_uint_ne(ids[0][0], ids[3][0]);
  ds_transform_free(t);
}
END_TEST

int main(void) {
  Suite *s = suite_create("transform");
  TCase *tc = tcase_create("transform");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_round_trip_fingerprint);
  tcase_add_test(tc, test_parse_refusals);
  tcase_add_test(tc, test_compare);
  tcase_add_test(tc, test_dict_extend);
  tcase_add_test(tc, test_source_maps_with_transform);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
