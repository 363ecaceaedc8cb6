/* Tests for datasets/: the Criteo line parser, the TSV source (quirks,
 * malformed lines, id modes, splits, batches, seek), the binary format
 * (round trip, int32 layout, torn and foreign files) and `shardrec convert`. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "common/fs.h"
#include "common/status.h"
#include "datasets/binfmt.h"
#include "datasets/convert.h"
#include "datasets/criteo.h"
#include "datasets/lines_impl.h"
#include "datasets/source.h"
#include "tests/support/files.h"

/* ---- helpers ---- */

static char *tmpdir;

static void setup(void) { tmpdir = tmpdir_make("ds"); }

static void teardown(void) {
  sr_rmtree(tmpdir);
  free(tmpdir);
}

static const char *tpath(const char *name) { return tmp_join(tmpdir, name); }


/* A deterministic labelled line i: I1 = i (so tests see which line a sample
 * came from), I2 negative on every third line, some empty fields, categorical
 * values from a small set; cols >= mh are multi-hot on odd lines when mh < 26. */
static int make_line(char *out, size_t n, uint64_t i, int mh) {
  int k = snprintf(out, n, "%d\t%llu\t%d", (int)(i % 2), (unsigned long long)i,
                   i % 3 == 0 ? -2 : (int)(i % 11));
  for (int d = 2; d < 13; d++)
    k += (i + (uint64_t)d) % 5 == 0 ? snprintf(out + k, n - k, "\t") : snprintf(out + k, n - k, "\t%d", (int)((i * 31 + (uint64_t)d) % 1000));
  for (int c = 0; c < 26; c++) {
    uint32_t v = (uint32_t)((i * 2654435761u + (uint64_t)c * 97) % (uint64_t)(3 + c * 5));
    v = v * 0x01000193u + (uint32_t)c;
    if ((i + (uint64_t)c) % 7 == 0)
      k += snprintf(out + k, n - k, "\t");
    else if (c >= mh && i % 2)
      k += snprintf(out + k, n - k, "\t%08x,%x", v, v ^ 0xabcu);
    else
      k += snprintf(out + k, n - k, "\t%08x", v);
  }
  k += snprintf(out + k, n - k, "\n");
  return k;
}

static void write_lines(const char *path, uint64_t n, int mh) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  char line[2048];
  for (uint64_t i = 0; i < n; i++) {
    int k = make_line(line, sizeof line, i, mh);
    ck_assert_int_eq((int)fwrite(line, 1, (size_t)k, f), k);
  }
  fclose(f);
}

/* Everything a source gives, flattened sample-major. */
typedef struct {
  uint64_t n;
  float *labels, *dense;
  uint32_t *off; /* [n*26+1] */
  uint64_t *ids;
  uint64_t nids;
  uint64_t *index; /* first_index + position in batch */
} flat;

static void flat_free(flat *f) {
  free(f->labels);
  free(f->dense);
  free(f->off);
  free(f->ids);
  free(f->index);
  memset(f, 0, sizeof *f);
}

static void collect(ds_source *s, int bs, flat *out) {
  memset(out, 0, sizeof *out);
  size_t cap = 1024, idcap = 1024 * 64;
  out->labels = malloc(cap * 4);
  out->dense = malloc(cap * 13 * 4);
  out->off = malloc((cap * 26 + 1) * 4);
  out->ids = malloc(idcap * 8);
  out->index = malloc(cap * 8);
  out->off[0] = 0;
  ds_batch b;
  ck_assert_int_eq(ds_batch_init(&b, bs), 0);
  int n;
  while ((n = ds_source_next(s, &b, bs)) > 0) {
    ck_assert_int_eq(b.n, n);
    for (int i = 0; i < n; i++) {
      if (out->n + 1 > cap) {
        cap *= 2;
        out->labels = realloc(out->labels, cap * 4);
        out->dense = realloc(out->dense, cap * 13 * 4);
        out->off = realloc(out->off, (cap * 26 + 1) * 4);
        out->index = realloc(out->index, cap * 8);
      }
      uint64_t j = out->n++;
      out->labels[j] = b.labels[i];
      out->index[j] = b.first_index + (uint64_t)i;
      memcpy(&out->dense[j * 13], &b.dense[i * 13], 13 * 4);
      for (int f = 0; f < 26; f++) {
        const uint32_t *o = ds_batch_offsets(&b, f);
        for (uint32_t k = o[i]; k < o[i + 1]; k++) {
          if (out->nids + 1 > idcap) {
            idcap *= 2;
            out->ids = realloc(out->ids, idcap * 8);
          }
          out->ids[out->nids++] = b.ids[k];
        }
        out->off[j * 26 + f + 1] = (uint32_t)out->nids;
      }
    }
  }
  ck_assert_msg(n == 0, "next failed: %d", n);
  ds_batch_free(&b);
}

static void flat_eq(const flat *a, const flat *b) {
  ck_assert_uint_eq(a->n, b->n);
  ck_assert_uint_eq(a->nids, b->nids);
  for (uint64_t i = 0; i < a->n; i++) {
    ck_assert(a->labels[i] == b->labels[i]);
    ck_assert_uint_eq(a->index[i], b->index[i]);
    for (int d = 0; d < 13; d++) ck_assert(a->dense[i * 13 + d] == b->dense[i * 13 + d]);
  }
  ck_assert_int_eq(memcmp(a->off, b->off, (a->n * 26 + 1) * 4), 0);
  ck_assert_int_eq(memcmp(a->ids, b->ids, a->nids * 8), 0);
}

static ds_source *open_src(ds_source_opts o) {
  char err[1024];
  ds_source *s = ds_source_open(&o, err, sizeof err);
  ck_assert_msg(s != NULL, "open failed: %s", err);
  return s;
}

static ds_criteo_sample smp;
static const ds_criteo_parse_opts LAB = {0}, NOLAB = {1};

static int parse(const char *line, const ds_criteo_parse_opts *o, char *err) {
  return ds_criteo_parse_line(line, strlen(line), o, &smp, err, 256);
}

/* ---- parser ---- */

START_TEST(test_parse_full_line) {
  char line[2048], err[256];
  make_line(line, sizeof line, 4, 26);
  ck_assert_int_eq(parse(line, &LAB, err), 0);
  ck_assert_int_eq(smp.label, 0);
  ck_assert(smp.dense[0] == (float)log1p(4.0));
  ck_assert(smp.dense[1] == (float)log1p(4.0)); /* 4 % 11 */
  ck_assert_uint_eq(smp.off[26], 26);
  ck_assert_str_eq(err, "");
}
END_TEST

START_TEST(test_parse_empty_negative_stripped) {
  char err[256];
  /* label, I1 empty, I2 = -1, I3 = 0, then stripped: everything else missing */
  ck_assert_int_eq(parse("1\t\t-1\t0", &LAB, err), 0);
  ck_assert_int_eq(smp.label, 1);
  for (int d = 0; d < 13; d++) ck_assert(smp.dense[d] == 0.0f);
  for (int c = 0; c < 26; c++) {
    ck_assert_uint_eq(smp.off[c], (uint32_t)c);
    ck_assert_uint_eq(smp.vals[c], 0);
  }
  /* categorical empties and values, CRLF, no final newline */
  char line[512] = "0\t5";
  for (int d = 1; d < 13; d++) strcat(line, "\t");
  strcat(line, "\tFFFFFFFF\t\tabc\r\n");
  ck_assert_int_eq(parse(line, &LAB, err), 0);
  ck_assert(smp.dense[0] == (float)log1p(5.0));
  ck_assert_uint_eq(smp.vals[0], 0xffffffffu);
  ck_assert_uint_eq(smp.vals[1], 0);
  ck_assert_uint_eq(smp.vals[2], 0xabc);
  ck_assert_uint_eq(smp.off[26], 26);
  /* just a label */
  ck_assert_int_eq(parse("1", &LAB, err), 0);
  ck_assert_uint_eq(smp.off[26], 26);
}
END_TEST

START_TEST(test_parse_no_label_vs_stripped) {
  char err[256];
  /* 39 fields: "1", thirteen "7", twenty-five "1f". Labelled: label 1,
     I1..I13 = 7, C1..C25 = 0x1f and the stripped C26 missing (0). No-label:
     I1 = 1, I2..I13 = 7, C1 = 0x7, C2..C26 = 0x1f. */
  char line[512] = "1";
  for (int d = 0; d < 13; d++) strcat(line, "\t7");
  for (int c = 0; c < 25; c++) strcat(line, "\t1f");
  ck_assert_int_eq(parse(line, &LAB, err), 0);
  ck_assert_int_eq(smp.label, 1);
  ck_assert(smp.dense[0] == (float)log1p(7.0));
  ck_assert(smp.dense[12] == (float)log1p(7.0));
  ck_assert_uint_eq(smp.vals[0], 0x1f);
  ck_assert_uint_eq(smp.vals[24], 0x1f);
  ck_assert_uint_eq(smp.vals[25], 0);
  ck_assert_int_eq(parse(line, &NOLAB, err), 0);
  ck_assert_int_eq(smp.label, 0);
  ck_assert(smp.dense[0] == (float)log1p(1.0));
  ck_assert(smp.dense[12] == (float)log1p(7.0));
  ck_assert_uint_eq(smp.vals[0], 0x7);
  ck_assert_uint_eq(smp.vals[25], 0x1f);
}
END_TEST

START_TEST(test_parse_no_label_mode) {
  char err[256];
  char line[512] = "3";
  for (int d = 1; d < 13; d++) strcat(line, "\t7");
  for (int c = 0; c < 26; c++) strcat(line, "\t1f");
  /* 39 fields, no label: I1 = 3, C26 = 0x1f */
  ck_assert_int_eq(parse(line, &NOLAB, err), 0);
  ck_assert_int_eq(smp.label, 0);
  ck_assert(smp.dense[0] == (float)log1p(3.0));
  ck_assert_uint_eq(smp.vals[25], 0x1f);
  /* the same line labelled: "3" is not a label */
  ck_assert_int_eq(parse(line, &LAB, err), SR_EFORMAT);
  ck_assert_int_eq(smp.bad, DS_BAD_LABEL);
  ck_assert_msg(strstr(err, "field 1 (label): '3' is not 0 or 1"), "%s", err);
  /* a refusal names the field and its column, with or without the label */
  line[2] = 'x';
  ck_assert_int_eq(parse(line, &NOLAB, err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "field 2 (I2): 'x' is not an integer"), "%s", err);
  line[0] = '1';
  ck_assert_int_eq(parse(line, &LAB, err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "field 2 (I1): 'x' is not an integer"), "%s", err);
  line[0] = '3';
  line[2] = '7';
  /* 40 fields in no-label mode: too many */
  strcat(line, "\t1");
  ck_assert_int_eq(parse(line, &NOLAB, err), SR_EFORMAT);
  ck_assert_int_eq(smp.bad, DS_BAD_FIELDS);
}
END_TEST

START_TEST(test_parse_multi_hot) {
  char err[256];
  char line[512] = "0";
  for (int d = 0; d < 13; d++) strcat(line, "\t");
  strcat(line, "\ta,b,c\t\t12345678,0");
  ck_assert_int_eq(parse(line, &LAB, err), 0);
  ck_assert_uint_eq(smp.off[1] - smp.off[0], 3);
  ck_assert_uint_eq(smp.vals[0], 0xa);
  ck_assert_uint_eq(smp.vals[2], 0xc);
  ck_assert_uint_eq(smp.off[2] - smp.off[1], 1);
  ck_assert_uint_eq(smp.vals[smp.off[2]], 0x12345678);
  ck_assert_uint_eq(smp.off[3] - smp.off[2], 2);
  ck_assert_uint_eq(smp.off[26], 3 + 1 + 2 + 23);
}
END_TEST

START_TEST(test_parse_malformed_kinds) {
  char err[256];
  struct { const char *line; int kind; const char *what; } cases[] = {
      {"2\t1", DS_BAD_LABEL, "bad label"},
      {"", DS_BAD_LABEL, "bad label"},
      {"1\t12a", DS_BAD_INT, "not an integer"},
      {"1\t-", DS_BAD_INT, "not an integer"},
      {"1\t1.5", DS_BAD_INT, "not an integer"},
      {"1\t9223372036854775808", DS_BAD_OVERFLOW, "int64"},
      {"1\t\t\t\t\t\t\t\t\t\t\t\t\t\txyz", DS_BAD_CAT, "hexadecimal"},
      {"1\t\t\t\t\t\t\t\t\t\t\t\t\t\t123456789", DS_BAD_CAT, "8 hex digits"},
      {"1\t\t\t\t\t\t\t\t\t\t\t\t\t\ta,,b", DS_BAD_CAT, "empty value"},
      {"1\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t", DS_BAD_FIELDS, "41 fields"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_assert_int_eq(parse(cases[i].line, &LAB, err), SR_EFORMAT);
    ck_assert_int_eq(smp.bad, cases[i].kind);
    ck_assert_msg(strstr(err, cases[i].what), "case %zu: '%s'", i, err);
  }
  ck_assert_int_eq(parse("1\t-9223372036854775808", &LAB, err), 0);
  ck_assert(smp.dense[0] == 0.0f);
  ck_assert_int_eq(parse("1\t9223372036854775807", &LAB, err), 0);
}
END_TEST

/* ---- TSV source ---- */

START_TEST(test_source_quirks_plain_gzip_crlf) {
  /* the same three lines, plain LF, CRLF without a final newline, gzip */
  const char *lf = "1\t\t-1\n0\t3\t2\t\t\t\t\t\t\t\t\t\t\t\tab\n1\t1\n";
  const char *crlf = "1\t\t-1\r\n0\t3\t2\t\t\t\t\t\t\t\t\t\t\t\tab\r\n1\t1";
  file_put(tpath("a.txt"), lf);
  file_put(tpath("b.txt"), crlf);
  gzFile g = gzopen(tpath("c.data"), "wb"); /* name says nothing: magic decides */
  gzwrite(g, lf, (unsigned)strlen(lf));
  gzclose(g);
  flat f[3];
  const char *names[3] = {"a.txt", "b.txt", "c.data"};
  for (int k = 0; k < 3; k++) {
    ds_source_opts o = {.path = tpath(names[k]), .id_mode = DS_IDS_HASH, .read_ahead = k == 1 ? -1 : 0};
    ds_source *s = open_src(o);
    ck_assert_uint_eq(ds_source_count(s), 3);
    collect(s, 2, &f[k]);
    ds_source_stats st;
    ds_source_stats_get(s, &st);
    ck_assert_uint_eq(st.lines, 3);
    ck_assert_uint_eq(st.malformed, 0);
    ds_source_destroy(s);
  }
  ck_assert_uint_eq(f[0].n, 3);
  ck_assert(f[0].labels[0] == 1.0f && f[0].labels[1] == 0.0f);
  ck_assert(f[0].dense[13] == (float)log1p(3.0));
  ck_assert_uint_eq(f[0].ids[26], ds_criteo_hash_id(0, 0xab));
  ck_assert_uint_eq(f[0].ids[0], ds_criteo_hash_id(0, 0));
  flat_eq(&f[0], &f[1]);
  flat_eq(&f[0], &f[2]);
  for (int k = 0; k < 3; k++) flat_free(&f[k]);
}
END_TEST

/* The complete lines in the part of a gzip file zlib can decode. */
static uint64_t gz_complete_lines(const char *path) {
  gzFile g = gzopen(path, "rb");
  ck_assert_ptr_nonnull(g);
  char buf[4096];
  uint64_t nl = 0;
  int k;
  while ((k = gzread(g, buf, sizeof buf)) > 0)
    for (int i = 0; i < k; i++) nl += buf[i] == '\n';
  gzclose(g);
  return nl;
}

/* A gzip file cut short or with a flipped byte is an error naming the file
 * and the compressed offset, with or without strict; the cut line (and
 * nothing after it) is never a sample. */
START_TEST(test_source_gzip_truncated) {
  write_lines(tpath("w.txt"), 200, 26);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "gzip -c %s > %s", tpath("w.txt"), tpath("w.gz"));
  ck_assert_int_eq(system(cmd), 0);
  struct stat st;
  ck_assert_int_eq(stat(tpath("w.gz"), &st), 0);
  FILE *f = fopen(tpath("w.gz"), "rb");
  char *all = malloc((size_t)st.st_size);
  ck_assert_int_eq((long)fread(all, 1, (size_t)st.st_size, f), (long)st.st_size);
  fclose(f);
  file_put_bytes(tpath("cut.gz"), all, (size_t)st.st_size / 2);
  all[st.st_size / 2] ^= 0x55;
  file_put_bytes(tpath("flip.gz"), all, (size_t)st.st_size);
  free(all);
  const uint64_t whole = gz_complete_lines(tpath("cut.gz"));
  ck_assert(whole > 10 && whole < 200);
  char err[1024];
  for (int strict = 0; strict < 2; strict++) {
    /* a parsing pass at open (dictionaries) fails there */
    ds_source_opts o = {.path = tpath("cut.gz"), .strict = strict};
    ck_assert_ptr_null(ds_source_open(&o, err, sizeof err));
    ck_assert_msg(strstr(err, "cut.gz: truncated or corrupt gzip stream at compressed byte") &&
                      strstr(err, "unexpected end of file"), "%s", err);
    ds_source_opts of = {.path = tpath("flip.gz"), .strict = strict};
    ck_assert_ptr_null(ds_source_open(&of, err, sizeof err));
    ck_assert_msg(strstr(err, "flip.gz: truncated or corrupt gzip stream at compressed byte ") &&
                      !strstr(err, "<fd:"), "%s", err);
    /* gzip's magic, then a compression method zlib does not know: zlib's
     * message, under the file's name (not zlib's "<fd:N>") */
    file_put_bytes(tpath("m.gz"), "\x1f\x8b\x09\x00\x00\x00\x00\x00\x00\x03rest of it\n", 21);
    ds_source_opts om = {.path = tpath("m.gz"), .strict = strict};
    ck_assert_ptr_null(ds_source_open(&om, err, sizeof err));
    ck_assert_msg(strstr(err, "m.gz: truncated or corrupt gzip stream at compressed byte ") &&
                      strstr(err, "unknown compression method") && !strstr(err, "<fd:"),
                  "%s", err);
    /* streamed (no pass at open): the complete lines, then the error */
    ds_source_opts oh = {.path = tpath("cut.gz"), .id_mode = DS_IDS_HASH, .strict = strict};
    ds_source *s = open_src(oh);
    ds_batch b;
    ds_batch_init(&b, 64);
    uint64_t got = 0;
    int n;
    while ((n = ds_source_next(s, &b, 64)) > 0) got += (uint64_t)n;
    ck_assert_int_eq(n, SR_EFORMAT);
    ck_assert_uint_eq(got, whole);
    ck_assert_msg(strstr(ds_source_errmsg(s), "cut.gz: truncated or corrupt gzip"), "%s",
                  ds_source_errmsg(s));
    ds_batch_free(&b);
    ds_source_destroy(s);
  }
}
END_TEST

START_TEST(test_source_malformed_reported) {
  const char *text = "1\t1\n7\t1\n1\tx\n0\t\t\t\t\t\t\t\t\t\t\t\t\t\tzz\n1\t99999999999999999999\n"
                     "1\t\t\t\t\t\t\t\t\t\t\t\t\t\t1ffffffff\n0\t2\n";
  file_put(tpath("m.txt"), text);
  char rep[4096] = {0};
  FILE *mem = fmemopen(rep, sizeof rep, "w");
  ds_source_opts o = {.path = tpath("m.txt"), .id_mode = DS_IDS_HASH, .report = mem, .max_reports = 4};
  ds_source *s = open_src(o);
  flat f;
  collect(s, 3, &f);
  fclose(mem);
  ck_assert_uint_eq(f.n, 2);
  ck_assert(f.dense[13] == (float)log1p(2.0));
  ck_assert_uint_eq(f.index[1], 1); /* malformed lines take no index */
  ds_source_stats st;
  ds_source_stats_get(s, &st);
  ck_assert_uint_eq(st.lines, 7);
  ck_assert_uint_eq(st.malformed, 5);
  ck_assert_uint_eq(st.bad[DS_BAD_LABEL], 1);
  ck_assert_uint_eq(st.bad[DS_BAD_INT], 1);
  ck_assert_uint_eq(st.bad[DS_BAD_CAT], 2);
  ck_assert_uint_eq(st.bad[DS_BAD_OVERFLOW], 1);
  char want[600];
  snprintf(want, sizeof want, "%s:2: bad label", tpath("m.txt"));
  ck_assert_msg(strstr(ds_source_report(s, 0), want), "%s", ds_source_report(s, 0));
  snprintf(want, sizeof want, "%s:3: non-numeric", tpath("m.txt"));
  ck_assert_pstr_eq(strstr(ds_source_report(s, 1), want) ? want : ds_source_report(s, 1), want);
  snprintf(want, sizeof want, "%s:5: integer feature overflows", tpath("m.txt"));
  ck_assert_msg(strstr(ds_source_report(s, 3), want), "%s", ds_source_report(s, 3));
  ck_assert_ptr_null(ds_source_report(s, 4)); /* only max_reports kept */
  ck_assert_msg(strstr(rep, want) != NULL, "printed: %s", rep);
  ds_source_destroy(s);
  flat_free(&f);

  /* strict: the first malformed line is an error, named */
  ds_source_opts so = {.path = tpath("m.txt"), .id_mode = DS_IDS_HASH, .strict = 1};
  s = open_src(so);
  ds_batch b;
  ds_batch_init(&b, 8);
  int n = ds_source_next(s, &b, 8);
  ck_assert_int_eq(n, 1); /* the good line before it */
  ck_assert_int_eq(ds_source_next(s, &b, 8), SR_EFORMAT);
  snprintf(want, sizeof want, "%s:2: bad label", tpath("m.txt"));
  ck_assert_msg(strstr(ds_source_errmsg(s), want), "%s", ds_source_errmsg(s));
  ds_source_destroy(s);
  /* strict with a dictionary pass fails at open */
  char err[1024];
  ds_source_opts sd = {.path = tpath("m.txt"), .strict = 1};
  ck_assert_ptr_null(ds_source_open(&sd, err, sizeof err));
  ck_assert_msg(strstr(err, want), "%s", err);
  ds_batch_free(&b);
}
END_TEST

START_TEST(test_source_long_line) {
  /* a 5 MB line between two good ones: skipped as DS_BAD_LONG, in both the
     parsing pass (DICT) and the reading pass (HASH), memory stays bounded */
  FILE *f = fopen(tpath("long.txt"), "wb");
  fputs("1\t1\n0\t", f);
  for (int i = 0; i < 5 * 1024 * 1024; i++) fputc('7', f);
  fputs("\n1\t3", f);
  fclose(f);
  for (int m = 0; m < 2; m++) {
    ds_source_opts o = {.path = tpath("long.txt"), .id_mode = m ? DS_IDS_HASH : DS_IDS_DICT};
    ds_source *s = open_src(o);
    flat fl;
    collect(s, 4, &fl);
    ck_assert_uint_eq(fl.n, 2);
    ck_assert(fl.dense[13] == (float)log1p(3.0));
    ds_source_stats st;
    ds_source_stats_get(s, &st);
    ck_assert_uint_eq(st.bad[DS_BAD_LONG], 1);
    char want[600];
    snprintf(want, sizeof want, "%s:2: line too long", tpath("long.txt"));
    ck_assert_msg(strstr(ds_source_report(s, 0), want), "%s", ds_source_report(s, 0));
    flat_free(&fl);
    ds_source_destroy(s);
  }
}
END_TEST

/* A line of DS_LINE_MAX bytes is read and one byte more is skipped,
 * wherever the line starts in the reader's buffer (after a short line and
 * after one of 1.5 MiB); ds_source_bad_lines lists the skipped lines and
 * the malformed one, split-relative. Each long line is a label and I1 of
 * leading zeros then 7. */
static void put_long(FILE *f, size_t len) {
  fputs("1\t", f);
  for (size_t i = 2; i + 1 < len; i++) fputc('0', f);
  fputs("7\n", f);
}

START_TEST(test_source_line_limit_exact) {
  FILE *f = fopen(tpath("limit.txt"), "wb");
  const size_t first[2] = {3, (size_t)3 << 19};
  for (int k = 0; k < 2; k++) {
    put_long(f, first[k]);        /* lines 1 and 6: the buffer's start moves */
    put_long(f, DS_LINE_MAX);     /* 2, 7: read */
    put_long(f, DS_LINE_MAX + 1); /* 3, 8: skipped */
    fputs("x\n", f);             /* 4, 9: malformed */
    put_long(f, DS_LINE_MAX);     /* 5, 10: read */
  }
  fclose(f);
  ds_source_opts o = {.path = tpath("limit.txt"), .id_mode = DS_IDS_HASH};
  ds_source *s = open_src(o);
  uint64_t *bad;
  size_t n_bad;
  char err[256];
  ck_assert_int_eq(ds_source_bad_lines(s, &bad, &n_bad, err, sizeof err), 0);
  const uint64_t want[4] = {2, 3, 7, 8}; /* 0-based */
  ck_assert_uint_eq(n_bad, 4);
  for (int i = 0; i < 4; i++) ck_assert_uint_eq(bad[i], want[i]);
  free(bad);
  flat fl;
  collect(s, 4, &fl);
  ck_assert_uint_eq(fl.n, 6);
  for (size_t i = 0; i < fl.n; i++) ck_assert(fl.dense[i * 13] == (float)log1p(7.0));
  ds_source_stats st;
  ds_source_stats_get(s, &st);
  ck_assert_uint_eq(st.bad[DS_BAD_LONG], 2);
  flat_free(&fl);
  ds_source_destroy(s);
}
END_TEST

/* A TSV's identity: its bytes and a CRC-32 of its first and last MiB, so
 * a file of the same size with another label on its first or its last
 * line is other data; an identity written before the CRC was part of it
 * (bytes or records alone) still names the same data, and no other kind. */
static void identity_of(const char *name, char *out, size_t len) {
  ds_source_opts o = {.path = tpath(name), .id_mode = DS_IDS_HASH};
  ds_source *s = open_src(o);
  ds_source_identity(s, out, len);
  ds_source_destroy(s);
}

/* n lines of make_line, line flip's label the other one. */
static void write_flipped(const char *name, uint64_t n, uint64_t flip) {
  FILE *f = fopen(tpath(name), "wb");
  ck_assert_ptr_nonnull(f);
  char line[2048];
  for (uint64_t i = 0; i < n; i++) {
    make_line(line, sizeof line, i, 26);
    if (i == flip) line[0] = line[0] == '0' ? '1' : '0';
    fputs(line, f);
  }
  fclose(f);
}

START_TEST(test_source_identity) {
  const uint64_t n = 40000; /* past 2 MiB: the middle is not read */
  write_flipped("a.tsv", n, UINT64_MAX);
  write_flipped("first.tsv", n, 0);
  write_flipped("last.tsv", n, n - 1);
  struct stat st;
  ck_assert_int_eq(stat(tpath("a.tsv"), &st), 0);
  ck_assert(st.st_size > (3 << 20));
  char a[256], a2[256], first[256], last[256], want[64];
  identity_of("a.tsv", a, sizeof a);
  identity_of("a.tsv", a2, sizeof a2);
  identity_of("first.tsv", first, sizeof first);
  identity_of("last.tsv", last, sizeof last);
  snprintf(want, sizeof want, "tsv %lld bytes, ends crc32 ", (long long)st.st_size);
  ck_assert_msg(!strncmp(a, want, strlen(want)) && strlen(a) == strlen(want) + 8, "%s", a);
  ck_assert(ds_source_identity_same(a, a2));
  ck_assert_msg(!ds_source_identity_same(a, first), "%s / %s", a, first);
  ck_assert_msg(!ds_source_identity_same(a, last), "%s / %s", a, last);
  /* Bytes alone (the older form): the same bytes are the same data. */
  want[strlen(want) - strlen(", ends crc32 ")] = 0;
  ck_assert(ds_source_identity_same(want, a));
  ck_assert(ds_source_identity_same(want, last));
  ck_assert(!ds_source_identity_same("tsv 1000 bytes", a));
  ck_assert(!ds_source_identity_same(a, want));
  ck_assert(ds_source_identity_same("int32 5 records", "int32 5 records, ends crc32 0a1b2c3d"));
  ck_assert(!ds_source_identity_same("int32 5 records", "int32 50 records, ends crc32 0a1b2c3d"));
  ck_assert(!ds_source_identity_same("bin data crc32 0a1b2c3d, 5 samples (train 5, test 0, val 0)",
                                     "bin data crc32 0a1b2c3d, 5 samples (train 5, test 0, val 0)"
                                     ", ends crc32 00000000"));
}
END_TEST

START_TEST(test_dict_threshold_unseen) {
  /* C1 values over 6 lines: 5 5 7 9 7 5; C2 always missing */
  const char *vals[] = {"5", "5", "7", "9", "7", "5"};
  char text[2048] = "";
  for (int i = 0; i < 6; i++) {
    strcat(text, "1");
    for (int d = 0; d < 13; d++) strcat(text, "\t");
    strcat(text, "\t");
    strcat(text, vals[i]);
    strcat(text, "\n");
  }
  file_put(tpath("d.txt"), text);
  ds_source_opts o = {.path = tpath("d.txt")};
  ds_source *s = open_src(o);
  uint64_t sizes[26];
  ds_source_table_sizes(s, sizes);
  ck_assert_uint_eq(sizes[0], 4); /* rare/unseen + 5, 7, 9 */
  ck_assert_uint_eq(sizes[1], 2); /* rare/unseen + the missing value 0 */
  flat f;
  collect(s, 4, &f);
  uint64_t want1[] = {1, 1, 2, 3, 2, 1};
  for (int i = 0; i < 6; i++) {
    ck_assert_uint_eq(f.ids[f.off[i * 26]], want1[i]);
    ck_assert_uint_eq(f.ids[f.off[i * 26 + 1]], 1);
  }
  flat_free(&f);
  ds_source_destroy(s);
  /* threshold 2: 9 (seen once) shares id 0 */
  o.frequency_threshold = 2;
  s = open_src(o);
  ds_source_table_sizes(s, sizes);
  ck_assert_uint_eq(sizes[0], 3);
  collect(s, 5, &f);
  uint64_t want2[] = {1, 1, 2, 0, 2, 1};
  for (int i = 0; i < 6; i++) ck_assert_uint_eq(f.ids[f.off[i * 26]], want2[i]);
  flat_free(&f);
  ds_source_destroy(s);
  /* test split with fraction 1/3: dictionary from lines 0-3 (5 5 7 9), the
     test lines hold 7 and 5; with max_ind_range 3 first: 5%3=2, 7%3=1, 9%3=0 */
  ds_source_opts t = {.path = tpath("d.txt"), .scheme = DS_SCHEME_FRACTION, .test_fraction = 1.0 / 3.0 + 1e-9, .split = DS_SPLIT_TEST};
  s = open_src(t);
  ck_assert_uint_eq(ds_source_count(s), 2);
  collect(s, 5, &f);
  ck_assert_uint_eq(f.ids[f.off[0]], 2);
  ck_assert_uint_eq(f.ids[f.off[26]], 1);
  flat_free(&f);
  ds_source_destroy(s);
  /* a value only in the test part maps to 0 */
  file_put(tpath("e.txt"), "1\t\t\t\t\t\t\t\t\t\t\t\t\t\t5\n1\t\t\t\t\t\t\t\t\t\t\t\t\t\t6\n");
  ds_source_opts u = {.path = tpath("e.txt"), .scheme = DS_SCHEME_FRACTION, .test_fraction = 0.5, .split = DS_SPLIT_TEST};
  s = open_src(u);
  collect(s, 5, &f);
  ck_assert_uint_eq(f.n, 1);
  ck_assert_uint_eq(f.ids[f.off[0]], 0);
  flat_free(&f);
  ds_source_destroy(s);
  /* max_ind_range before the dictionary */
  ds_source_opts m = {.path = tpath("d.txt"), .max_ind_range = 3};
  s = open_src(m);
  collect(s, 5, &f);
  uint64_t want3[] = {1, 1, 2, 3, 2, 1}; /* 2 2 1 0 1 2 by first appearance */
  for (int i = 0; i < 6; i++) ck_assert_uint_eq(f.ids[f.off[i * 26]], want3[i]);
  flat_free(&f);
  ds_source_destroy(s);
}
END_TEST

START_TEST(test_modulo_hash_modes) {
  write_lines(tpath("l.txt"), 50, 26);
  ds_source_opts o = {.path = tpath("l.txt"), .id_mode = DS_IDS_MODULO, .max_ind_range = 10};
  ds_source *s = open_src(o);
  uint64_t sizes[26];
  ds_source_table_sizes(s, sizes);
  ck_assert_uint_eq(sizes[5], 10);
  flat fm, fh;
  collect(s, 7, &fm);
  ds_source_destroy(s);
  o.id_mode = DS_IDS_HASH;
  s = open_src(o);
  ds_source_table_sizes(s, sizes);
  ck_assert_uint_eq(sizes[5], 0);
  collect(s, 7, &fh);
  ds_source_destroy(s);
  flat fr;
  o.id_mode = DS_IDS_RAW;
  s = open_src(o);
  collect(s, 50, &fr);
  ds_source_destroy(s);
  char line[2048];
  for (uint64_t i = 0; i < 50; i++) {
    make_line(line, sizeof line, i, 26);
    ck_assert_int_eq(parse(line, &LAB, NULL), 0);
    for (int c = 0; c < 26; c++) {
      ck_assert_uint_eq(fm.ids[fm.off[i * 26 + c]], smp.vals[c] % 10);
      ck_assert_uint_eq(fh.ids[fh.off[i * 26 + c]], ds_criteo_hash_id(c, smp.vals[c]));
      ck_assert_uint_eq(fr.ids[fr.off[i * 26 + c]], smp.vals[c]);
    }
  }
  ck_assert_uint_ne(ds_criteo_hash_id(0, 5), ds_criteo_hash_id(1, 5));
  flat_free(&fm);
  flat_free(&fh);
  flat_free(&fr);
  o.id_mode = DS_IDS_MODULO;
  o.max_ind_range = 0;
  char err[512];
  ck_assert_ptr_null(ds_source_open(&o, err, sizeof err));
}
END_TEST

START_TEST(test_split_ranges) {
  ds_split_ranges r;
  ck_assert_int_eq(ds_split_ranges_compute(DS_SCHEME_KAGGLE, 15, 0, 0, &r), 0);
  /* per day 2, one extra line for day 0: day 6 = [13, 15) */
  ck_assert_uint_eq(r.end[DS_SPLIT_TRAIN], 13);
  ck_assert_uint_eq(r.begin[DS_SPLIT_TEST], 13);
  ck_assert_uint_eq(r.end[DS_SPLIT_TEST], 14);
  ck_assert_uint_eq(r.begin[DS_SPLIT_VAL], 14);
  ck_assert_uint_eq(r.end[DS_SPLIT_VAL], 15);
  ck_assert_int_eq(ds_split_ranges_compute(DS_SCHEME_KAGGLE, 70, 0, 0, &r), 0);
  ck_assert_uint_eq(r.end[DS_SPLIT_TRAIN], 60);
  ck_assert_uint_eq(r.end[DS_SPLIT_TEST], 65);
  ck_assert_int_eq(ds_split_ranges_compute(DS_SCHEME_KAGGLE, 76, 0, 0, &r), 0);
  ck_assert_uint_eq(r.end[DS_SPLIT_TRAIN], 66); /* 10 per day, extra 6: days 0-5 get 11 */
  ck_assert_uint_eq(r.end[DS_SPLIT_TEST], 71);
  ck_assert_int_eq(ds_split_ranges_compute(DS_SCHEME_FRACTION, 10, 0, 0.25, &r), 0);
  ck_assert_uint_eq(r.end[DS_SPLIT_TRAIN], 8);
  ck_assert_uint_eq(r.begin[DS_SPLIT_TEST], 8);
  ck_assert_uint_eq(r.end[DS_SPLIT_TEST], 10);
  ck_assert_uint_eq(r.begin[DS_SPLIT_VAL], r.end[DS_SPLIT_VAL]);
  ck_assert_int_eq(ds_split_ranges_compute(DS_SCHEME_TERABYTE, 100, 7, 0, &r), 0);
  ck_assert_uint_eq(r.end[DS_SPLIT_TRAIN], 93);
  ck_assert_uint_eq(r.end[DS_SPLIT_TEST], 97);
  ck_assert_int_eq(ds_split_ranges_compute(DS_SCHEME_FRACTION, 10, 0, 1.5, &r), SR_EINVAL);
}
END_TEST

/* The line index of each sample, read back from I1 = log1p(i). */
static uint64_t line_of(const flat *f, uint64_t j) {
  return (uint64_t)llround(expm1((double)f->dense[j * 13]));
}

static void check_split(const char *path, ds_split_scheme sch, double frac, ds_split sp,
                        uint64_t b, uint64_t e, ds_id_mode mode) {
  ds_source_opts o = {.path = path, .scheme = sch, .test_fraction = frac, .split = sp, .id_mode = mode};
  ds_source *s = open_src(o);
  ck_assert_uint_eq(ds_source_count(s), e - b);
  flat f;
  collect(s, 3, &f);
  ck_assert_uint_eq(f.n, e - b);
  for (uint64_t j = 0; j < f.n; j++) {
    ck_assert_uint_eq(line_of(&f, j), b + j);
    ck_assert_uint_eq(f.index[j], j);
  }
  flat_free(&f);
  ds_source_destroy(s);
}

START_TEST(test_source_splits) {
  write_lines(tpath("k.txt"), 15, 26);
  for (int m = 0; m < 2; m++) {
    ds_id_mode mode = m ? DS_IDS_HASH : DS_IDS_DICT;
    check_split(tpath("k.txt"), DS_SCHEME_KAGGLE, 0, DS_SPLIT_TRAIN, 0, 13, mode);
    check_split(tpath("k.txt"), DS_SCHEME_KAGGLE, 0, DS_SPLIT_TEST, 13, 14, mode);
    check_split(tpath("k.txt"), DS_SCHEME_KAGGLE, 0, DS_SPLIT_VAL, 14, 15, mode);
    check_split(tpath("k.txt"), DS_SCHEME_KAGGLE, 0, DS_SPLIT_ALL, 0, 15, mode);
    check_split(tpath("k.txt"), DS_SCHEME_FRACTION, 0.2, DS_SPLIT_TRAIN, 0, 12, mode);
    check_split(tpath("k.txt"), DS_SCHEME_FRACTION, 0.2, DS_SPLIT_TEST, 12, 15, mode);
    check_split(tpath("k.txt"), DS_SCHEME_FRACTION, 0.2, DS_SPLIT_VAL, 15, 15, mode);
  }
  /* terabyte: day_0..day_23, 3 lines each except day_23 with 5 */
  char line[2048];
  uint64_t i = 0;
  for (int d = 0; d < 24; d++) {
    char name[64];
    snprintf(name, sizeof name, "day_%d", d);
    FILE *f = fopen(tpath(name), "wb");
    for (int k = 0; k < (d == 23 ? 5 : 3); k++, i++) {
      int n = make_line(line, sizeof line, i, 26);
      if (d == 4 && k == 2) n--; /* a day without a final newline */
      fwrite(line, 1, (size_t)n, f);
    }
    fclose(f);
  }
  check_split(tpath("day"), DS_SCHEME_TERABYTE, 0, DS_SPLIT_TRAIN, 0, 69, DS_IDS_DICT);
  check_split(tpath("day"), DS_SCHEME_TERABYTE, 0, DS_SPLIT_TEST, 69, 72, DS_IDS_DICT);
  check_split(tpath("day"), DS_SCHEME_TERABYTE, 0, DS_SPLIT_VAL, 72, 74, DS_IDS_HASH);
  unlink(tpath("day_7"));
  char err[1024];
  ds_source_opts o = {.path = tpath("day"), .scheme = DS_SCHEME_TERABYTE};
  ck_assert_ptr_null(ds_source_open(&o, err, sizeof err));
  ck_assert_msg(strstr(err, "day_7"), "%s", err);
}
END_TEST

START_TEST(test_batches_and_seek) {
  write_lines(tpath("b.txt"), 5000, 20);
  flat ref;
  ds_source_opts o = {.path = tpath("b.txt"), .read_ahead = -1};
  ds_source *s = open_src(o);
  collect(s, 5000, &ref);
  ds_source_destroy(s);
  ck_assert_uint_eq(ref.n, 5000);
  int sizes[] = {1, 7, 2049, 4096};
  for (int k = 0; k < 4; k++) {
    for (int ra = -1; ra <= 3; ra += 4) {
      ds_source_opts q = {.path = tpath("b.txt"), .read_ahead = ra};
      s = open_src(q);
      flat f;
      collect(s, sizes[k], &f);
      flat_eq(&ref, &f);
      flat_free(&f);
      /* seek, then read again: same samples from that index */
      uint64_t at = (uint64_t)sizes[k] * 3 % 5000 + 1;
      ck_assert_int_eq(ds_source_seek(s, at), 0);
      ds_batch b;
      ds_batch_init(&b, 9);
      ck_assert_int_eq(ds_source_next(s, &b, 9), 9);
      ck_assert_uint_eq(b.first_index, at);
      for (int i = 0; i < 9; i++) ck_assert(b.dense[i * 13] == ref.dense[(at + i) * 13]);
      ck_assert_int_eq(ds_source_seek(s, 5000), 0);
      ck_assert_int_eq(ds_source_next(s, &b, 9), 0);
      ck_assert_int_eq(ds_source_seek(s, 5001), SR_ERANGE);
      ck_assert_int_eq(ds_source_rewind(s), 0);
      ck_assert_int_eq(ds_source_next(s, &b, 9), 9);
      ck_assert_uint_eq(b.first_index, 0);
      ds_batch_free(&b);
      ds_source_destroy(s);
    }
  }
  /* multi-hot bags: odd lines hold two values in columns >= 20 */
  for (uint64_t j = 0; j < 4; j++)
    for (int c = 0; c < 26; c++) {
      uint32_t len = ref.off[j * 26 + c + 1] - ref.off[j * 26 + c];
      char line[2048];
      make_line(line, sizeof line, j, 20);
      ck_assert_int_eq(parse(line, &LAB, NULL), 0);
      ck_assert_uint_eq(len, smp.off[c + 1] - smp.off[c]);
      if (j % 2 && c >= 20 && (j + (uint64_t)c) % 7) ck_assert_uint_eq(len, 2);
    }
  flat_free(&ref);
}
END_TEST


/* ---- binary format ---- */

static void convert_api(const char *in, const char *out, ds_split_scheme sch, double frac,
                        ds_id_mode mode, int shuffle) {
  ds_source_opts o = {.path = in, .scheme = sch, .test_fraction = frac, .id_mode = mode,
                      .exact_count = 1, .max_ind_range = mode == DS_IDS_MODULO ? 100 : 0};
  ds_source *s = open_src(o);
  char err[1024];
  ck_assert_msg(ds_convert_to_bin(s, &o, out, shuffle, 42, NULL, NULL, err, sizeof err) == 0, "%s",
                err);
  ds_source_destroy(s);
}

static void roundtrip(int mh, ds_id_mode mode) {
  write_lines(tpath("r.txt"), 3001, mh);
  convert_api(tpath("r.txt"), tpath("r.bin"), DS_SCHEME_KAGGLE, 0, mode, 0);
  for (int sp = DS_SPLIT_ALL; sp <= DS_SPLIT_VAL; sp++) {
    ds_source_opts ot = {.path = tpath("r.txt"), .scheme = DS_SCHEME_KAGGLE, .split = sp, .id_mode = mode,
                         .max_ind_range = mode == DS_IDS_MODULO ? 100 : 0};
    ds_source_opts ob = {.path = tpath("r.bin"), .split = sp};
    ds_source *st = open_src(ot), *sb = open_src(ob);
    ck_assert_uint_eq(ds_source_count(st), ds_source_count(sb));
    uint64_t z1[26], z2[26];
    ds_source_table_sizes(st, z1);
    ds_source_table_sizes(sb, z2);
    ck_assert_int_eq(memcmp(z1, z2, sizeof z1), 0);
    flat ft, fb;
    collect(st, 97, &ft);
    collect(sb, 64, &fb);
    flat_eq(&ft, &fb);
    /* seek by sample index agrees too */
    ck_assert_int_eq(ds_source_seek(sb, ft.n / 2), 0);
    ds_batch b;
    ds_batch_init(&b, 4);
    if (ft.n / 2 < ft.n) {
      ck_assert_int_eq(ds_source_next(sb, &b, 1), 1);
      ck_assert_uint_eq(b.first_index, ft.n / 2);
      ck_assert(b.dense[0] == ft.dense[(ft.n / 2) * 13]);
    }
    ds_batch_free(&b);
    flat_free(&ft);
    flat_free(&fb);
    ds_source_destroy(st);
    ds_source_destroy(sb);
  }
}

START_TEST(test_bin_roundtrip_onehot_dict) { roundtrip(26, DS_IDS_DICT); }
END_TEST
START_TEST(test_bin_roundtrip_multihot_hash) { roundtrip(13, DS_IDS_HASH); }
END_TEST
START_TEST(test_bin_roundtrip_modulo) { roundtrip(26, DS_IDS_MODULO); }
END_TEST

START_TEST(test_bin_dictionary_stored) {
  write_lines(tpath("r.txt"), 500, 26);
  convert_api(tpath("r.txt"), tpath("r.bin"), DS_SCHEME_NONE, 0, DS_IDS_DICT, 0);
  char err[512];
  ds_bin_reader *r = ds_bin_reader_open(tpath("r.bin"), 0, 1, err, sizeof err);
  ck_assert_ptr_nonnull(r);
  ds_criteo_dict *d = ds_bin_reader_dict(r);
  ck_assert_ptr_nonnull(d);
  ds_source_opts o = {.path = tpath("r.txt")};
  ds_source *s = open_src(o);
  const ds_criteo_dict *d2 = ds_source_dict(s);
  for (int c = 0; c < 26; c++) {
    ck_assert_uint_eq(ds_criteo_dict_size(d, c), ds_criteo_dict_size(d2, c));
    uint64_t n;
    const uint32_t *v = ds_criteo_dict_values(d2, c, &n);
    for (uint64_t k = 0; k < n; k++) ck_assert_uint_eq(ds_criteo_dict_lookup(d, c, v[k]), k + 1);
  }
  ds_criteo_dict_destroy(d);
  ds_bin_reader_destroy(r);
  ds_source_destroy(s);
}
END_TEST

START_TEST(test_bin_shuffle) {
  for (uint64_t n = 1; n < 300; n += 37) {
    char *seen = calloc(n, 1);
    for (uint64_t i = 0; i < n; i++) {
      uint64_t p = ds_bin_shuffle_pos(i, n, 7);
      ck_assert_uint_lt(p, n);
      ck_assert(!seen[p]);
      seen[p] = 1;
    }
    free(seen);
  }
  write_lines(tpath("r.txt"), 700, 26);
  convert_api(tpath("r.txt"), tpath("s.bin"), DS_SCHEME_FRACTION, 0.1, DS_IDS_DICT, 1);
  convert_api(tpath("r.txt"), tpath("u.bin"), DS_SCHEME_FRACTION, 0.1, DS_IDS_DICT, 0);
  ds_source_opts a = {.path = tpath("s.bin"), .split = DS_SPLIT_TRAIN}, b = {.path = tpath("u.bin"), .split = DS_SPLIT_TRAIN};
  ds_source *sa = open_src(a), *sb = open_src(b);
  flat fa, fb;
  collect(sa, 100, &fa);
  collect(sb, 100, &fb);
  ck_assert_uint_eq(fa.n, 630);
  int moved = 0;
  uint64_t sum_a = 0, sum_b = 0;
  for (uint64_t j = 0; j < fa.n; j++) {
    moved += line_of(&fa, j) != j;
    sum_a += line_of(&fa, j);
    sum_b += line_of(&fb, j);
    ck_assert_uint_eq(line_of(&fb, ds_bin_shuffle_pos(j, 630, 42)) , line_of(&fb, ds_bin_shuffle_pos(j, 630, 42)));
  }
  for (uint64_t j = 0; j < fa.n; j++) ck_assert_uint_eq(line_of(&fa, ds_bin_shuffle_pos(j, 630, 42)), j);
  ck_assert_int_gt(moved, 500);
  ck_assert_uint_eq(sum_a, sum_b);
  flat_free(&fa);
  flat_free(&fb);
  ds_source_destroy(sa);
  ds_source_destroy(sb);
  /* test part untouched */
  ds_source_opts t = {.path = tpath("s.bin"), .split = DS_SPLIT_TEST};
  sa = open_src(t);
  collect(sa, 100, &fa);
  for (uint64_t j = 0; j < fa.n; j++) ck_assert_uint_eq(line_of(&fa, j), 630 + j);
  flat_free(&fa);
  ds_source_destroy(sa);
}
END_TEST

START_TEST(test_int32_layout) {
  int32_t rec[3][40];
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 40; k++) rec[i][k] = k == 0 ? i % 2 : (k == 2 ? -1 : i * 100 + k);
  file_put_bytes(tpath("t.int32"), (const char *)rec, sizeof rec);
  ds_source_opts o = {.path = tpath("t.int32")};
  ds_source *s = open_src(o);
  ck_assert_uint_eq(ds_source_count(s), 3);
  uint64_t sizes[26];
  ds_source_table_sizes(s, sizes);
  ck_assert_uint_eq(sizes[0], 200 + 14 + 1);
  flat f;
  collect(s, 2, &f);
  for (int i = 0; i < 3; i++) {
    ck_assert(f.labels[i] == (float)(i % 2));
    ck_assert(f.dense[i * 13 + 1] == 0.0f);
    ck_assert(f.dense[i * 13 + 2] == (float)log1p((double)(i * 100 + 3)));
    for (int c = 0; c < 26; c++) ck_assert_uint_eq(f.ids[f.off[i * 26 + c]], (uint64_t)(i * 100 + 14 + c));
  }
  flat_free(&f);
  ds_source_destroy(s);
  /* explicit format, modulo, split */
  file_put_bytes(tpath("ref.bin"), (const char *)rec, sizeof rec);
  ds_source_opts m = {.path = tpath("ref.bin"), .format = DS_FORMAT_INT32, .max_ind_range = 7,
                      .scheme = DS_SCHEME_FRACTION, .test_fraction = 0.34, .split = DS_SPLIT_TEST};
  s = open_src(m);
  ck_assert_uint_eq(ds_source_count(s), 1);
  collect(s, 2, &f);
  ck_assert_uint_eq(f.ids[f.off[0]], (200 + 14) % 7);
  flat_free(&f);
  ds_source_destroy(s);
  /* a negative id or a bad label is refused, naming the record */
  rec[1][20] = -3;
  file_put_bytes(tpath("neg.int32"), (const char *)rec, sizeof rec);
  ds_source_opts ng = {.path = tpath("neg.int32")};
  char nerr[512];
  ck_assert_ptr_null(ds_source_open(&ng, nerr, sizeof nerr));
  ck_assert_msg(strstr(nerr, "neg.int32: record 1: categorical C7 id -3"), "%s", nerr);
  rec[1][20] = 5;
  rec[2][0] = 2;
  file_put_bytes(tpath("lab.int32"), (const char *)rec, sizeof rec);
  ds_source_opts lb = {.path = tpath("lab.int32")};
  ck_assert_ptr_null(ds_source_open(&lb, nerr, sizeof nerr));
  ck_assert_msg(strstr(nerr, "record 2: label 2"), "%s", nerr);
  /* torn */
  file_put_bytes(tpath("bad.int32"), (const char *)rec, sizeof rec - 4);
  char err[512];
  ds_source_opts t = {.path = tpath("bad.int32")};
  ck_assert_ptr_null(ds_source_open(&t, err, sizeof err));
  ck_assert_msg(strstr(err, "bad.int32") && strstr(err, "multiple of 160"), "%s", err);
}
END_TEST

static void copy_trunc(const char *from, const char *to, long cut, long flip_at) {
  size_t n;
  char *buf = slurp_file(from, &n, 1);
  if (flip_at >= 0) buf[flip_at] ^= 0x10;
  file_put_bytes(to, buf, n - (size_t)cut);
  free(buf);
}

START_TEST(test_bin_refused) {
  write_lines(tpath("r.txt"), 200, 26);
  convert_api(tpath("r.txt"), tpath("r.bin"), DS_SCHEME_NONE, 0, DS_IDS_DICT, 0);
  struct stat st;
  stat(tpath("r.bin"), &st);
  char err[1024];
  struct { long cut, flip; ds_format fmt; const char *want; } cases[] = {
      {100, -1, DS_FORMAT_AUTO, "truncated"},
      {st.st_size - 100, -1, DS_FORMAT_BIN, "truncated"},
      {0, (long)st.st_size - 7, DS_FORMAT_AUTO, "checksum mismatch"},
      {0, 4096 + 3, DS_FORMAT_AUTO, "checksum mismatch"},
      {0, 30, DS_FORMAT_AUTO, "header checksum"},
      {0, 9, DS_FORMAT_AUTO, "version"},
      {0, 0, DS_FORMAT_BIN, "not a shardrec binary file"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    copy_trunc(tpath("r.bin"), tpath("x.bin"), cases[i].cut, cases[i].flip);
    ds_source_opts o = {.path = tpath("x.bin"), .format = cases[i].fmt};
    ck_assert_ptr_null(ds_source_open(&o, err, sizeof err));
    ck_assert_msg(strstr(err, cases[i].want) && strstr(err, "x.bin"), "case %zu: %s", i, err);
  }
  /* a foreign file named .bin is read as TSV by AUTO, refused as BIN */
  file_put(tpath("f.bin"), "hello\n");
  ds_source_opts o = {.path = tpath("f.bin"), .format = DS_FORMAT_BIN};
  ck_assert_ptr_null(ds_source_open(&o, err, sizeof err));
  ck_assert_msg(strstr(err, "not a shardrec binary file"), "%s", err);
  /* no_verify skips only the payload checksum */
  copy_trunc(tpath("r.bin"), tpath("y.bin"), 0, (long)st.st_size - 7);
  ds_source_opts nv = {.path = tpath("y.bin"), .no_verify = 1};
  ds_source *s = open_src(nv);
  ds_source_destroy(s);
}
END_TEST

/* The format comes from the content: a damaged magic is never parsed as
 * TSV; a converted-data file (PROCESSED) is a shardrec binary by its magic
 * or an int32 file by its name, and an empty or 7-byte file is neither;
 * raw rows (RAW) are text, never converted rows by magic or by name. */
START_TEST(test_source_format_by_content) {
  write_lines(tpath("r.txt"), 50, 26);
  convert_api(tpath("r.txt"), tpath("r.bin"), DS_SCHEME_NONE, 0, DS_IDS_DICT, 0);
  copy_trunc(tpath("r.bin"), tpath("m.bin"), 0, 2); /* 'C' -> 'S' */
  file_put(tpath("e0"), "");
  file_put(tpath("e7"), "SRCRITE");
  int32_t rec[40] = {1};
  file_put_bytes(tpath("x.int32"), (const char *)rec, sizeof rec);
  char err[1024];
  struct { const char *name; ds_format fmt; const char *want; } bad[] = {
      {"m.bin", DS_FORMAT_AUTO, "m.bin: not a shardrec binary file (magic 'SRSRITEO'"},
      {"m.bin", DS_FORMAT_PROCESSED, "m.bin: not a shardrec binary file (magic 'SRSRITEO'"},
      {"e0", DS_FORMAT_PROCESSED, "e0: not a shardrec binary file (magic '': the file is empty"},
      {"e7", DS_FORMAT_PROCESSED, "e7: not a shardrec binary file (magic 'SRCRITE': the file is shorter"},
      {"e7", DS_FORMAT_AUTO, "e7: not a shardrec binary file"},
      {"r.txt", DS_FORMAT_PROCESSED, "r.txt: not a shardrec binary file (magic '0\\x09"},
      {"r.bin", DS_FORMAT_RAW, "r.bin: a shardrec binary file (converted rows, magic 'SRCRITEO'), "
                               "not raw Criteo TSV: give it as --processed-data-file"},
      {"x.int32", DS_FORMAT_RAW, "x.int32: named as the reference DLRM's int32 records"},
      {"m.bin", DS_FORMAT_RAW, "m.bin: not a shardrec binary file (magic 'SRSRITEO'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ds_source_opts o = {.path = tpath(bad[i].name), .format = bad[i].fmt};
    ck_assert_ptr_null(ds_source_open(&o, err, sizeof err));
    ck_assert_msg(strstr(err, bad[i].want), "case %zu: %s", i, err);
  }
  /* what is right still opens: the binary, an int32 file by its name, text as TSV */
  ds_source_opts ob = {.path = tpath("r.bin"), .format = DS_FORMAT_PROCESSED};
  ds_source *s = open_src(ob);
  ck_assert_uint_eq(ds_source_count(s), 50);
  ds_source_destroy(s);
  ds_source_opts oi = {.path = tpath("x.int32"), .format = DS_FORMAT_PROCESSED};
  s = open_src(oi);
  ck_assert_uint_eq(ds_source_count(s), 1);
  ds_source_destroy(s);
  for (int k = 0; k < 2; k++) {
    ds_source_opts ot = {.path = tpath("r.txt"), .id_mode = DS_IDS_HASH,
                         .format = k ? DS_FORMAT_RAW : DS_FORMAT_AUTO};
    s = open_src(ot);
    ck_assert_uint_eq(ds_source_count(s), 50);
    ds_source_destroy(s);
  }
  ds_source_opts oe = {.path = tpath("e0"), .id_mode = DS_IDS_HASH};
  s = open_src(oe); /* an empty TSV is an empty TSV */
  ck_assert_uint_eq(ds_source_count(s), 0);
  ds_source_destroy(s);
}
END_TEST

/* A copy of the bin file from with n bytes of p at offset at, and every
 * checksum recomputed, as an editor that knows the format would leave it. */
static void edit_bin(const char *from, const char *to, uint64_t at, const void *p, size_t n) {
  size_t size;
  unsigned char *buf = (unsigned char *)slurp_file(from, &size, 1);
  memcpy(buf + at, p, n);
  uint64_t doff, dbytes, xoff, xbytes;
  memcpy(&xoff, buf + 72, 8);
  memcpy(&xbytes, buf + 80, 8);
  memcpy(&doff, buf + 88, 8);
  memcpy(&dbytes, buf + 96, 8);
  uint32_t c = (uint32_t)crc32(0, buf + xoff, (uInt)xbytes);
  memcpy(buf + 104, &c, 4);
  c = (uint32_t)crc32(0, buf + doff, (uInt)dbytes);
  memcpy(buf + 108, &c, 4);
  c = (uint32_t)crc32(0, buf, DS_BIN_HEADER_SIZE - 4);
  memcpy(buf + DS_BIN_HEADER_SIZE - 4, &c, 4);
  file_put_bytes(to, (const char *)buf, (size_t)size);
  free(buf);
}

/* Read every sample of path: 0 at the end, or the failing code with the
 * source's message in err. */
static int read_all(const char *path, char *err, size_t n) {
  ds_source_opts o = {.path = path};
  ds_source *s = ds_source_open(&o, err, n);
  if (!s) return SR_EFORMAT;
  ds_batch b;
  ds_batch_init(&b, 64);
  int rc;
  while ((rc = ds_source_next(s, &b, 64)) > 0) {}
  snprintf(err, n, "%s", ds_source_errmsg(s));
  ds_batch_free(&b);
  ds_source_destroy(s);
  return rc;
}

/* Values no writer writes, behind valid checksums, are refused naming the
 * file, the record and the field (a record) or the header field. */
START_TEST(test_bin_values_checked) {
  write_lines(tpath("r.txt"), 100, 26);
  convert_api(tpath("r.txt"), tpath("r.bin"), DS_SCHEME_NONE, 0, DS_IDS_DICT, 0);
  ds_source_opts o = {.path = tpath("r.bin")};
  ds_source *s = open_src(o);
  ds_bin_info in = {0};
  FILE *f = fopen(tpath("r.bin"), "rb");
  unsigned char h[DS_BIN_HEADER_SIZE];
  ck_assert_int_eq((int)fread(h, 1, sizeof h, f), (int)sizeof h);
  fclose(f);
  memcpy(&in.data_off, h + 88, 8);
  ds_source_destroy(s);
  char err[1024];
  ck_assert_int_eq(read_all(tpath("r.bin"), err, sizeof err), 0);
  const uint64_t rs = 56 + 26 * 4;
  const float two = 2.0f, minus1 = -1.0f, inf = INFINITY, nan = NAN;
  const float hundred = 100.0f; /* finite, past the largest value convert writes */
  const uint32_t big = 9999, mode = 7, flags = 0x1f;
  const uint64_t zero64 = 0;
  struct { uint64_t at; const void *p; size_t n; int at_open; const char *want; } cases[] = {
      {in.data_off + 3 * rs, &two, 4, 0, "x.bin: record 3: label 2 is not 0 or 1"},
      {in.data_off + 5 * rs, &minus1, 4, 0, "x.bin: record 5: label -1 is not 0 or 1"},
      {in.data_off + 7 * rs + 4 + 4 * 4, &inf, 4, 0, "x.bin: record 7: dense I5 is inf"},
      {in.data_off + 9 * rs + 4, &nan, 4, 0, "x.bin: record 9: dense I1 is nan"},
      {in.data_off + 11 * rs + 4 + 4, &hundred, 4, 0,
       "x.bin: record 11: dense I2 is 100, outside [0, 43.6683], the range convert writes"},
      {in.data_off + 99 * rs + 56 + 4, &big, 4, 0,
       "x.bin: record 99: C2 id 9999 is outside its table of"},
      {16, &mode, 4, 1, "x.bin: header: id mode 7 is not one of 0..3"},
      {12, &flags, 4, 1, "x.bin: header: unknown layout flags 0x1f"},
      {112 + 8 * 3, &zero64, 8, 1, "x.bin: header: table C4 has 0 rows"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    edit_bin(tpath("r.bin"), tpath("x.bin"), cases[i].at, cases[i].p, cases[i].n);
    ds_source_opts ox = {.path = tpath("x.bin")};
    ds_source *sx = ds_source_open(&ox, err, sizeof err);
    ck_assert_msg((sx == NULL) == cases[i].at_open, "case %zu: %s", i, sx ? "opened" : err);
    ds_source_destroy(sx);
    int rc = read_all(tpath("x.bin"), err, sizeof err);
    ck_assert_int_eq(rc, SR_EFORMAT);
    ck_assert_msg(strstr(err, cases[i].want), "case %zu: %s", i, err);
  }
}
END_TEST

/* Batches of a bin file decoded ahead on a helper thread are the ones the
 * caller's thread decodes: multi-hot bags, sizes that change (the helper's
 * batch then goes unused), a seek back and one forward, a batch of another
 * capacity, and the short batch at the end; each batch whole (count, first
 * index, labels, dense values, offsets, ids). */
static void batch_eq(const ds_batch *a, const ds_batch *b, int step) {
  ck_assert_msg(a->n == b->n && a->first_index == b->first_index,
                "step %d: %d samples from %llu, %d from %llu", step, a->n,
                (unsigned long long)a->first_index, b->n, (unsigned long long)b->first_index);
  ck_assert(!memcmp(a->labels, b->labels, (size_t)a->n * sizeof *a->labels));
  ck_assert(!memcmp(a->dense, b->dense, (size_t)a->n * DS_NUM_DENSE * sizeof *a->dense));
  for (int f = 0; f < DS_NUM_SPARSE; f++) {
    const uint32_t *oa = ds_batch_offsets(a, f), *ob = ds_batch_offsets(b, f);
    ck_assert_msg(!memcmp(oa, ob, (size_t)(a->n + 1) * sizeof *oa), "step %d: C%d offsets", step,
                  f + 1);
    ck_assert_msg(!memcmp(a->ids + oa[0], b->ids + ob[0], (size_t)(oa[a->n] - oa[0]) * 8),
                  "step %d: C%d ids", step, f + 1);
  }
}

START_TEST(test_bin_read_ahead) {
  write_lines(tpath("r.txt"), 3001, 13);
  convert_api(tpath("r.txt"), tpath("r.bin"), DS_SCHEME_NONE, 0, DS_IDS_DICT, 0);
  ds_source_opts here = {.path = tpath("r.bin"), .read_ahead = -1};
  ds_source_opts ahead = {.path = tpath("r.bin")};
  ds_source *sh = open_src(here), *sa = open_src(ahead);
  ds_batch bh, ba[3], small;
  ck_assert_int_eq(ds_batch_init(&bh, 128), 0);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(ds_batch_init(&ba[i], 128), 0);
  ck_assert_int_eq(ds_batch_init(&small, 40), 0);
  const int sizes[] = {128, 128, 128, 100, 100, 7, 128, 128, 128, 128};
  int step = 0, got;
  for (int pass = 0; pass < 3; pass++) {
    for (int k = 0; k < 10; k++, step++) { /* a ring of 3 batches, as the trainer's */
      ds_batch *b = &ba[step % 3];
      ck_assert_int_eq(got = ds_source_next(sh, &bh, sizes[k]), sizes[k]);
      ck_assert_int_eq(ds_source_next(sa, b, sizes[k]), got);
      batch_eq(&bh, b, step);
      for (int again = 0; k == 5 && again < 2; again++) { /* another capacity, kept */
        ck_assert_int_eq(ds_source_next(sh, &bh, 33), 33);
        ck_assert_int_eq(ds_source_next(sa, &small, 33), 33);
        batch_eq(&bh, &small, step);
        ck_assert_int_eq(small.cap, 40);
      }
    }
    /* the helper holds the next 128 from here: the seek's first read of 128 must not take it */
    const uint64_t to = pass == 0 ? 500 : pass == 1 ? 1800 : 10; /* back, forward, back */
    ck_assert_int_eq(ds_source_seek(sh, to), 0);
    ck_assert_int_eq(ds_source_seek(sa, to), 0);
  }
  uint64_t end = 0;
  do { /* to the end: the last batch is short, then none */
    ds_batch *b = &ba[step % 3];
    got = ds_source_next(sh, &bh, 128);
    ck_assert_int_eq(ds_source_next(sa, b, 128), got);
    if (got) batch_eq(&bh, b, step), end = b->first_index + (uint64_t)b->n;
    step++;
  } while (got > 0);
  ck_assert_uint_eq(end, 3001);
  ds_source_stats th, ta; /* the helper's batches were taken, most of them */
  ck_assert_int_eq(ds_source_stats_get(sh, &th), 0);
  ck_assert_int_eq(ds_source_stats_get(sa, &ta), 0);
  ck_assert_uint_eq(th.ahead_taken, 0);
  ck_assert_msg(ta.ahead_taken >= (uint64_t)step / 2, "%llu of %d batches taken ahead",
                (unsigned long long)ta.ahead_taken, step);
  ds_source_destroy(sh);
  ds_source_destroy(sa);
  /* the reference's int32 records, ids taken modulo 7: the same again */
  static int32_t rec[300][40];
  for (int i = 0; i < 300; i++)
    for (int k = 0; k < 40; k++) rec[i][k] = k == 0 ? i % 2 : i * 41 + k;
  file_put_bytes(tpath("r.int32"), (const char *)rec, sizeof rec);
  ds_source_opts ih = {.path = tpath("r.int32"), .max_ind_range = 7, .read_ahead = -1};
  ds_source_opts ia = {.path = tpath("r.int32"), .max_ind_range = 7};
  sh = open_src(ih), sa = open_src(ia);
  for (int k = 0; (got = ds_source_next(sh, &bh, 128)) > 0; k++) {
    ck_assert_int_eq(ds_source_next(sa, &ba[k % 3], 128), got);
    batch_eq(&bh, &ba[k % 3], k);
  }
  ck_assert_int_eq(ds_source_next(sa, &ba[0], 128), 0);
  ck_assert_int_eq(ds_source_stats_get(sa, &ta), 0);
  ck_assert_uint_eq(ta.ahead_taken, 2); /* 128 here, then 128 and 44 ahead */
  ds_source_destroy(sh);
  ds_source_destroy(sa);
  ds_batch_free(&bh);
  for (int i = 0; i < 3; i++) ds_batch_free(&ba[i]);
  ds_batch_free(&small);
}
END_TEST

/* Two more a broken or hostile file brings: a dictionary that lists a
 * value twice (behind valid checksums; the second entry's id would be one no
 * raw value maps to) and a folder given as the data file. */
START_TEST(test_bin_dict_duplicate_and_folder) {
  write_lines(tpath("r.txt"), 300, 26);
  convert_api(tpath("r.txt"), tpath("r.bin"), DS_SCHEME_NONE, 0, DS_IDS_DICT, 0);
  FILE *f = fopen(tpath("r.bin"), "rb");
  unsigned char h[DS_BIN_HEADER_SIZE];
  ck_assert_int_eq((int)fread(h, 1, sizeof h, f), (int)sizeof h);
  uint64_t n0, n1;
  memcpy(&n0, h + 112 + 8 * 26, 8); /* C1's and C2's dictionary sizes */
  memcpy(&n1, h + 112 + 8 * 27, 8);
  ck_assert(n0 >= 1 && n1 >= 3);
  uint32_t v[3]; /* C2's first three values */
  fseek(f, (long)(DS_BIN_HEADER_SIZE + 4 * n0), SEEK_SET);
  ck_assert_int_eq((int)fread(v, 4, 3, f), 3);
  fclose(f);
  edit_bin(tpath("r.bin"), tpath("x.bin"), DS_BIN_HEADER_SIZE + 4 * n0 + 8, &v[0], 4);
  char err[1024], want[128];
  ds_source_opts o = {.path = tpath("x.bin")};
  ck_assert_ptr_null(ds_source_open(&o, err, sizeof err));
  snprintf(want, sizeof want, "x.bin: dictionary C2: value 0x%x is entries 1 and 3", v[0]);
  ck_assert_msg(strstr(err, want), "%s", err);
  ck_assert_int_eq(mkdir(tpath("dir.bin"), 0777), 0);
  for (int k = 0; k < 2; k++) {
    ds_source_opts od = {.path = tpath("dir.bin"), .format = k ? DS_FORMAT_PROCESSED : DS_FORMAT_AUTO};
    ck_assert_ptr_null(ds_source_open(&od, err, sizeof err));
    ck_assert_msg(strstr(err, "dir.bin: a folder, not a data file"), "%s", err);
  }
}
END_TEST

/* ---- multi-hot bags up to DS_MAX_BAG ---- */

/* Line i with bags of up to 128 ids: C1 holds 128 (all distinct), C2 3, C21
 * 100 (repeats: value j % 37), the rest one; every third line is cut after
 * C21 (stripped trailing fields: C22..C26 empty). */
static int big_bag_line(char *out, size_t n, uint64_t i) {
  int k = snprintf(out, n, "%d\t%llu", (int)(i % 2), (unsigned long long)i);
  for (int d = 1; d < 13; d++) k += snprintf(out + k, n - k, "\t%d", d);
  for (int c = 0; c < 26; c++) {
    if (i % 3 == 0 && c > 20) break;
    int len = c == 0 ? 128 : c == 1 ? 3 : c == 20 ? 100 : 1;
    k += snprintf(out + k, n - k, "\t");
    for (int j = 0; j < len; j++)
      k += snprintf(out + k, n - k, "%s%x", j ? "," : "",
                    (unsigned)(c == 20 ? 1 + (j + (int)i) % 37 : 1 + j + 7 * c + (int)(i % 5)));
  }
  k += snprintf(out + k, n - k, "\n");
  return k;
}

START_TEST(test_multi_hot_128) {
  static char line[8192];
  char err[256];
  /* the parser: 128 ids a bag, stripped fields one id 0 after a multi-hot bag */
  big_bag_line(line, sizeof line, 3);
  ck_assert_int_eq(parse(line, &LAB, err), 0);
  ck_assert_uint_eq(smp.off[1] - smp.off[0], 128);
  ck_assert_uint_eq(smp.vals[127], 1 + 127 + 3);
  ck_assert_uint_eq(smp.off[21] - smp.off[20], 100);
  for (int c = 21; c < 26; c++) {
    ck_assert_uint_eq(smp.off[c + 1] - smp.off[c], 1);
    ck_assert_uint_eq(smp.vals[smp.off[c]], 0);
  }
  ck_assert_uint_eq(smp.off[26], 128 + 3 + 100 + 18 + 5);
  /* a TSV file of such lines, converted (dictionary and hash ids): the
   * binary file's samples are the TSV's, bag for bag */
  FILE *f = fopen(tpath("big.txt"), "wb");
  for (uint64_t i = 0; i < 300; i++) {
    int k = big_bag_line(line, sizeof line, i);
    ck_assert_int_eq((int)fwrite(line, 1, (size_t)k, f), k);
  }
  fclose(f);
  const ds_id_mode modes[2] = {DS_IDS_DICT, DS_IDS_HASH};
  for (int m = 0; m < 2; m++) {
    convert_api(tpath("big.txt"), tpath("big.bin"), DS_SCHEME_FRACTION, 0.2, modes[m], 0);
    ds_bin_reader *r = ds_bin_reader_open(tpath("big.bin"), 0, 1, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    ck_assert(ds_bin_reader_info(r)->flags & DS_BIN_MULTI);
    ck_assert_uint_eq(ds_bin_reader_info(r)->total_ids, 300 * (128 + 3 + 100 + 23));
    ds_bin_reader_destroy(r);
    ds_source_opts ot = {.path = tpath("big.txt"), .scheme = DS_SCHEME_FRACTION, .test_fraction = 0.2,
                         .id_mode = modes[m]};
    ds_source_opts ob = {.path = tpath("big.bin")};
    ds_source *st = open_src(ot), *sb = open_src(ob);
    flat ft, fb;
    collect(st, 64, &ft);
    collect(sb, 128, &fb);
    flat_eq(&ft, &fb);
    ck_assert_uint_eq(fb.n, 300);
    for (uint64_t i = 0; i < fb.n; i++) {
      ck_assert_uint_eq(fb.off[i * 26 + 1] - fb.off[i * 26], 128);
      ck_assert_uint_eq(fb.off[i * 26 + 21] - fb.off[i * 26 + 20], 100);
    }
    flat_free(&ft);
    flat_free(&fb);
    ds_source_destroy(st);
    ds_source_destroy(sb);
  }
}
END_TEST

/* A bag of 129 ids is refused naming the field (the parser) and the file's
 * line (the source); an empty id inside a bag too; a binary file whose
 * offsets make a bag of more than 128 ids is refused at open naming the
 * sample and column. */
START_TEST(test_multi_hot_limits) {
  static char line[8192];
  char err[256];
  int k = snprintf(line, sizeof line, "1");
  for (int d = 0; d < 13; d++) k += snprintf(line + k, sizeof line - k, "\t");
  k += snprintf(line + k, sizeof line - k, "\t");
  for (int j = 0; j < 129; j++) k += snprintf(line + k, sizeof line - k, "%s%x", j ? "," : "", j + 1);
  ck_assert_int_eq(parse(line, &LAB, err), SR_EFORMAT);
  ck_assert_int_eq(smp.bad, DS_BAD_VALUES);
  ck_assert_msg(strstr(err, "too many categorical values: field 15 (C1): '1,2,3,4,5,6,7,8,...' holds more than "
                            "128 ids (a bag's limit)"), "%s", err);
  char *last = strrchr(line, ',');
  *last = 0; /* 128 ids: taken */
  ck_assert_int_eq(parse(line, &LAB, err), 0);
  ck_assert_uint_eq(smp.off[1] - smp.off[0], 128);
  *last = ',';
  /* in a file: line 2 skipped and named; strict stops there */
  char text[10000];
  snprintf(text, sizeof text, "0\t1\n%s\n1\t\t\t\t\t\t\t\t\t\t\t\t\t\ta,,b\n1\t2\n", line);
  file_put(tpath("bad.txt"), text);
  ds_source_opts o = {.path = tpath("bad.txt"), .id_mode = DS_IDS_HASH};
  ds_source *s = open_src(o);
  flat f;
  collect(s, 4, &f);
  ck_assert_uint_eq(f.n, 2);
  char want[600];
  snprintf(want, sizeof want, "%s:2: too many categorical values: field 15 (C1):", tpath("bad.txt"));
  ck_assert_msg(strstr(ds_source_report(s, 0), want), "%s", ds_source_report(s, 0));
  snprintf(want, sizeof want, "%s:3: bad categorical value: field 15 (C1): 'a,,b' has an empty value",
           tpath("bad.txt"));
  ck_assert_msg(strstr(ds_source_report(s, 1), want), "%s", ds_source_report(s, 1));
  ds_source_destroy(s);
  flat_free(&f);
  /* a binary file with a bag of 131 ids behind valid checksums */
  FILE *fp = fopen(tpath("big.txt"), "wb");
  for (uint64_t i = 0; i < 10; i++) {
    k = big_bag_line(line, sizeof line, i);
    ck_assert_int_eq((int)fwrite(line, 1, (size_t)k, fp), k);
  }
  fclose(fp);
  convert_api(tpath("big.txt"), tpath("big.bin"), DS_SCHEME_NONE, 0, DS_IDS_HASH, 0);
  ck_assert_int_eq(read_all(tpath("big.bin"), err, sizeof err), 0);
  unsigned char h[DS_BIN_HEADER_SIZE];
  FILE *hf = fopen(tpath("big.bin"), "rb");
  ck_assert_int_eq((int)fread(h, 1, sizeof h, hf), (int)sizeof h);
  fclose(hf);
  uint64_t data_off, n;
  memcpy(&data_off, h + 88, 8);
  memcpy(&n, h + 24, 8);
  /* sample 2: C1 [o, o+128), C2 [o+128, o+131): C1's end moved to C2's */
  const uint64_t k1 = 2 * 26 + 1, o2 = 2 * (128 + 3 + 100 + 23) + 131;
  edit_bin(tpath("big.bin"), tpath("x.bin"), data_off + n * 56 + 8 * k1, &o2, 8);
  ck_assert_int_eq(read_all(tpath("x.bin"), err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "x.bin: corrupt multi-hot offsets at 53: sample 2 C1 has 131 ids, more than "
                            "the 128 a bag may hold"), "%s", err);
}
END_TEST


/* ---- shardrec convert ---- */

static int run(const char *cmd, char *out, size_t n) {
  char full[4096];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  FILE *p = popen(full, "r");
  ck_assert_ptr_nonnull(p);
  size_t k = fread(out, 1, n - 1, p);
  out[k] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_cli_convert) {
  const char *bin = getenv("SHARDREC_BIN");
  ck_assert_ptr_nonnull(bin);
  char cmd[2048], out[8192];
  snprintf(cmd, sizeof cmd, "%s convert --bogus a b", bin);
  ck_assert_int_eq(run(cmd, out, sizeof out), 2);
  ck_assert_msg(strstr(out, "bogus"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s convert --test-fraction 2 a b", bin);
  ck_assert_int_eq(run(cmd, out, sizeof out), 2);
  snprintf(cmd, sizeof cmd, "%s convert --split nope a b", bin);
  ck_assert_int_eq(run(cmd, out, sizeof out), 2);
  snprintf(cmd, sizeof cmd, "%s convert only-one", bin);
  ck_assert_int_eq(run(cmd, out, sizeof out), 2);
  /* An id mode's flags that it would not use: refused, not dropped. */
  snprintf(cmd, sizeof cmd, "%s convert --modulo --max-ind-range 50 --frequency-threshold 5 a b",
           bin);
  ck_assert_int_eq(run(cmd, out, sizeof out), 2);
  ck_assert_msg(strstr(out, "--modulo takes no --frequency-threshold"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s convert --hash --frequency-threshold 5 a b", bin);
  ck_assert_int_eq(run(cmd, out, sizeof out), 2);
  ck_assert_msg(strstr(out, "--hash takes neither"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s convert --help", bin);
  ck_assert_int_eq(run(cmd, out, sizeof out), 0);
  ck_assert_msg(strstr(out, "--max-ind-range"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s convert %s %s", bin, tpath("missing.txt"), tpath("o.bin"));
  ck_assert_int_eq(run(cmd, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "missing.txt"), "%s", out);
  /* a real conversion, gzip in, with a malformed line; compare with the TSV reader */
  write_lines(tpath("c.txt"), 1000, 26);
  FILE *f = fopen(tpath("c.txt"), "ab");
  fputs("5\t1\n", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "gzip -k %s", tpath("c.txt"));
  ck_assert_int_eq(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "%s convert --split kaggle --frequency-threshold 2 %s.gz %s", bin,
           tpath("c.txt"), tpath("c.bin"));
  ck_assert_msg(run(cmd, out, sizeof out) == 0, "%s", out);
  ck_assert_msg(strstr(out, "c.txt.gz:1001: bad label"), "%s", out);
  for (int sp = DS_SPLIT_ALL; sp <= DS_SPLIT_VAL; sp++) {
    ds_source_opts ot = {.path = tpath("c.txt"), .scheme = DS_SCHEME_KAGGLE, .split = sp, .frequency_threshold = 2};
    ds_source_opts ob = {.path = tpath("c.bin"), .split = sp};
    ds_source *st = open_src(ot), *sb = open_src(ob);
    flat ft, fb;
    collect(st, 100, &ft);
    collect(sb, 100, &fb);
    flat_eq(&ft, &fb);
    flat_free(&ft);
    flat_free(&fb);
    ds_source_destroy(st);
    ds_source_destroy(sb);
  }
  snprintf(cmd, sizeof cmd, "%s convert --strict %s %s", bin, tpath("c.txt"), tpath("d.bin"));
  ck_assert_int_eq(run(cmd, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "c.txt:1001: bad label"), "%s", out);
  ck_assert_int_ne(access(tpath("d.bin"), F_OK), 0);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("datasets");
  TCase *p = tcase_create("parser");
  tcase_add_test(p, test_parse_full_line);
  tcase_add_test(p, test_parse_empty_negative_stripped);
  tcase_add_test(p, test_parse_no_label_vs_stripped);
  tcase_add_test(p, test_parse_no_label_mode);
  tcase_add_test(p, test_parse_multi_hot);
  tcase_add_test(p, test_parse_malformed_kinds);
  tcase_add_test(p, test_split_ranges);
  suite_add_tcase(s, p);
  TCase *t = tcase_create("source");
  tcase_add_checked_fixture(t, setup, teardown);
  tcase_set_timeout(t, 120);
  tcase_add_test(t, test_source_quirks_plain_gzip_crlf);
  tcase_add_test(t, test_source_malformed_reported);
  tcase_add_test(t, test_source_long_line);
  tcase_add_test(t, test_source_line_limit_exact);
  tcase_add_test(t, test_source_identity);
  tcase_add_test(t, test_source_gzip_truncated);
  tcase_add_test(t, test_dict_threshold_unseen);
  tcase_add_test(t, test_modulo_hash_modes);
  tcase_add_test(t, test_source_splits);
  tcase_add_test(t, test_batches_and_seek);
  suite_add_tcase(s, t);
  TCase *b = tcase_create("binary");
  tcase_add_checked_fixture(b, setup, teardown);
  tcase_set_timeout(b, 120);
  tcase_add_test(b, test_bin_roundtrip_onehot_dict);
  tcase_add_test(b, test_bin_roundtrip_multihot_hash);
  tcase_add_test(b, test_bin_roundtrip_modulo);
  tcase_add_test(b, test_bin_dictionary_stored);
  tcase_add_test(b, test_bin_shuffle);
  tcase_add_test(b, test_int32_layout);
  tcase_add_test(b, test_bin_refused);
  tcase_add_test(b, test_source_format_by_content);
  tcase_add_test(b, test_bin_values_checked);
  tcase_add_test(b, test_bin_read_ahead);
  tcase_add_test(b, test_bin_dict_duplicate_and_folder);
  tcase_add_test(b, test_cli_convert);
  tcase_add_test(b, test_multi_hot_128);
  tcase_add_test(b, test_multi_hot_limits);
  suite_add_tcase(s, b);
  return s;
}

int main(void) {
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
