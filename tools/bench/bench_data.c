/* shardrec bench data: how fast the data path reads, beside the raw read()
 * speed of the same file measured in the same run.
 *
 * Generates a synthetic Criteo TSV (datasets/datagen.h) in a temporary
 * folder, or takes --file. Rows, each the median of --runs runs:
 *   read() baseline    read() into a 1 MiB buffer, counting newlines
 *   parse_line         read() + line split + ds_criteo_parse_line, one core
 *   source, 1 core     ds_source_next (parse, hash ids, batch), no reader thread
 *   source, thread     the same with the reader thread parsing ahead
 *   binary (mmap)      ds_source_next over the converted binary file,
 *                      decoded in the caller's thread (no read-ahead: the
 *                      decoding itself is timed; open timed apart: mmap with
 *                      populate, dictionary load, and with the CRC32 pass
 *                      over the payload) */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "datasets/binfmt.h"
#include "datasets/convert.h"
#include "datasets/criteo.h"
#include "datasets/datagen.h"
#include "datasets/source.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "common/sys.h"

static int write_tsv(const char *path, uint64_t rows, uint64_t seed) {
  dg_config cfg;
  dg_config_default(&cfg);
  cfg.rows = rows;
  cfg.seed = seed;
  dg_generator *g = NULL;
  char err[512];
  if (dg_generator_create(&cfg, &g, err, sizeof err)) {
    fprintf(stderr, "shardrec bench data: datagen: %s\n", err);
    return -1;
  }
  FILE *f = fopen(path, "wb");
  if (!f) {
    fprintf(stderr, "shardrec bench data: %s: %s\n", path, strerror(errno));
    dg_generator_destroy(g);
    return -1;
  }
  static char buf[DG_LINE_MAX];
  dg_row row;
  for (uint64_t i = 0; i < rows; i++) {
    dg_generator_row(g, i, &row);
    size_t n = dg_row_format(&row, buf);
    fwrite(buf, 1, n, f);
  }
  int bad = ferror(f);
  bad |= fclose(f) != 0; /* the last buffer's write: a full disk shows here */
  dg_generator_destroy(g);
  if (bad) fprintf(stderr, "shardrec bench data: %s: cannot write: %s\n", path, strerror(errno));
  return bad ? -1 : 0;
}

/* read() into 1 MiB, count newlines (parse = 0) or parse every line too. */
static int scan_file(const char *path, int parse, uint64_t *lines, uint64_t *bad) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  const size_t cap = 1u << 20;
  char *buf = malloc(cap + 65536);
  static ds_criteo_sample s;
  ds_criteo_parse_opts o = {0};
  size_t keep = 0;
  ssize_t k;
  *lines = *bad = 0;
  while ((k = read(fd, buf + keep, cap)) > 0) {
    size_t len = keep + (size_t)k;
    char *p = buf, *end = buf + len, *nl;
    while ((nl = memchr(p, '\n', (size_t)(end - p)))) {
      if (parse && ds_criteo_parse_line(p, (size_t)(nl - p), &o, &s, NULL, 0)) (*bad)++;
      (*lines)++;
      p = nl + 1;
    }
    keep = (size_t)(end - p);
    if (keep > 65536) keep = 0; /* a line over 64 KiB: not Criteo, dropped */
    memmove(buf, p, keep);
  }
  if (keep) {
    if (parse && ds_criteo_parse_line(buf, keep, &o, &s, NULL, 0)) (*bad)++;
    (*lines)++;
  }
  free(buf);
  close(fd);
  return 0;
}

/* Read every sample; *open_s = seconds spent in ds_source_open (NULL: not asked). */
static int read_source(const char *path, ds_format fmt, int read_ahead, uint64_t *n_out,
                       double *open_s) {
  double t0 = sr_now();
  ds_source_opts o = {.path = path, .format = fmt, .id_mode = DS_IDS_HASH, .read_ahead = read_ahead,
                      .no_verify = 1};
  char err[1024];
  ds_source *s = ds_source_open(&o, err, sizeof err);
  if (!s) {
    fprintf(stderr, "shardrec bench data: %s\n", err);
    return -1;
  }
  if (open_s) *open_s = sr_now() - t0;
  ds_batch b;
  ds_batch_init(&b, 2048);
  int n;
  uint64_t tot = 0;
  while ((n = ds_source_next(s, &b, 2048)) > 0) tot += (uint64_t)n;
  ds_batch_free(&b);
  ds_source_destroy(s);
  *n_out = tot;
  return n < 0 ? -1 : 0;
}

static int convert(const char *in, const char *out) {
  ds_source_opts o = {.path = in, .format = DS_FORMAT_TSV, .id_mode = DS_IDS_DICT};
  char err[1024];
  ds_source *s = ds_source_open(&o, err, sizeof err);
  if (!s) {
    fprintf(stderr, "shardrec bench data: %s\n", err);
    return -1;
  }
  int rc = ds_convert_to_bin(s, &o, out, 0, 0, NULL, NULL, err, sizeof err);
  if (rc) fprintf(stderr, "shardrec bench data: %s\n", err);
  ds_source_destroy(s);
  return rc ? -1 : 0;
}

static void row(const char *name, double bytes, double lines, double secs, double base_mbs) {
  double mbs = bytes / secs / 1e6;
  printf("  %-24s %10.1f %14.0f %10.3f", name, mbs, lines / secs, secs);
  if (base_mbs > 0)
    printf(" %9.1f%%\n", 100.0 * mbs / base_mbs);
  else
    printf(" %10s\n", "-");
}

/* The parse and read rates of file (TSV), its conversion to bin and the
 * binary reader's, medians of runs runs, printed. 0 or 1 (said). */
static int measure(const char *file, const char *bin, int runs) {
  struct stat st;
  if (stat(file, &st)) {
    fprintf(stderr, "shardrec bench data: %s: %s\n", file, strerror(errno));
    return 1;
  }
  double bytes = (double)st.st_size;
  double t[5][99];
  uint64_t lines = 0, bad = 0, n = 0;
  for (int r = 0; r < runs; r++) {
    double a = sr_now();
    if (scan_file(file, 0, &lines, &bad)) return 1;
    t[0][r] = sr_now() - a;
    a = sr_now();
    if (scan_file(file, 1, &lines, &bad)) return 1;
    t[1][r] = sr_now() - a;
    a = sr_now();
    if (read_source(file, DS_FORMAT_TSV, -1, &n, NULL)) return 1;
    t[2][r] = sr_now() - a;
    a = sr_now();
    if (read_source(file, DS_FORMAT_TSV, 2, &n, NULL)) return 1;
    t[3][r] = sr_now() - a;
  }
  double ca = sr_now();
  if (convert(file, bin)) return 1;
  double conv = sr_now() - ca;
  struct stat sb;
  stat(bin, &sb);
  uint64_t nb = 0;
  double topen[99];
  for (int r = 0; r < runs; r++) {
    double a = sr_now();
    if (read_source(bin, DS_FORMAT_BIN, -1, &nb, &topen[r])) return 1;
    t[4][r] = sr_now() - a - topen[r];
  }
  double va = sr_now();
  {
    char err[512];
    ds_bin_reader *vr = ds_bin_reader_open(bin, 0, 1, err, sizeof err);
    if (!vr) {
      fprintf(stderr, "shardrec bench data: %s\n", err);
      return 1;
    }
    ds_bin_reader_destroy(vr);
  }
  double verify = sr_now() - va;
  double base = bytes / sr_median(t[0], runs) / 1e6;
  printf("\nfile %s: %.1f MB, %llu lines (%llu malformed); median of %d runs, page cache warm\n",
         file, bytes / 1e6, (unsigned long long)lines, (unsigned long long)bad, runs);
  printf("  %-24s %10s %14s %10s %10s\n", "", "MB/s", "lines/s", "seconds", "vs read()");
  row("read() baseline", bytes, (double)lines, sr_median(t[0], runs), 0);
  row("parse_line, 1 core", bytes, (double)lines, sr_median(t[1], runs), base);
  row("source, 1 core (hash)", bytes, (double)n, sr_median(t[2], runs), base);
  row("source, reader thread", bytes, (double)n, sr_median(t[3], runs), base);
  printf("\nbinary file %.1f MB (converted, dictionary ids, in %.2f s: %.0f lines/s)\n",
         (double)sb.st_size / 1e6, conv, (double)lines / conv);
  double bt = sr_median(t[4], runs);
  printf("  %-24s %10.1f %14.0f %10.3f   (samples/s)\n", "binary reader (mmap)", (double)sb.st_size / bt / 1e6,
         (double)nb / bt, bt);
  printf("  %-24s %10.1f %14s %10.3f\n", "open (mmap, no verify)", (double)sb.st_size / sr_median(topen, runs) / 1e6, "-",
         sr_median(topen, runs));
  printf("  %-24s %10.1f %14s %10.3f\n", "open + CRC32 verify", (double)sb.st_size / verify / 1e6, "-", verify);
  return 0;
}

int bench_data(int argc, char **argv) {
  static const struct option longs[] = {{"rows", required_argument, 0, 'n'},
                                        {"file", required_argument, 0, 'f'},
                                        {"runs", required_argument, 0, 'r'},
                                        {"seed", required_argument, 0, 's'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  uint64_t rows = 500000, seed = 1;
  long long runs = 3;
  const char *file = NULL;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    switch (c) {
      case 'n':
        if (cli_u64("bench data", "--rows", optarg, &rows) || rows == 0) return 2;
        break;
      case 'f': file = optarg; break;
      case 'r':
        if (cli_int("bench data", "--runs", optarg, 1, 99, &runs)) return 2;
        break;
      case 's':
        if (cli_u64("bench data", "--seed", optarg, &seed)) return 2;
        break;
      case 'h':
        printf("usage: shardrec bench data [--rows N (500000)] [--file TSV] [--runs R (3)] [--seed S]\n"
               "TSV parse and binary read throughput beside read() of the same file (medians).\n");
        return 0;
      default:
        fprintf(stderr, "shardrec bench data: bad option %s (see --help)\n", argv[optind - 1]);
        return 2;
    }
  }
  if (optind != argc) {
    fprintf(stderr, "shardrec bench data: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  char dir[] = "/tmp/shardrec-bench-data-XXXXXX";
  if (!mkdtemp(dir)) {
    fprintf(stderr, "shardrec bench data: mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  char tsv[SR_PATH_MAX], bin[SR_PATH_MAX], perr[256];
  if (sr_path_err(tsv, sizeof tsv, perr, sizeof perr, "%s/data.tsv", dir) ||
      sr_path_err(bin, sizeof bin, perr, sizeof perr, "%s/data.bin", dir)) {
    fprintf(stderr, "shardrec bench data: %s\n", perr);
    sr_rmtree(dir);
    return 1;
  }
  int status = 1;
  double t0 = sr_now();
  if (!file) {
    if (write_tsv(tsv, rows, seed)) goto out;
    file = tsv;
    printf("generated %llu rows of synthetic Criteo TSV in %.1f s\n", (unsigned long long)rows, sr_now() - t0);
  }
  status = measure(file, bin, (int)runs);
out:
  unlink(tsv);
  unlink(bin);
  rmdir(dir);
  return status;
}
