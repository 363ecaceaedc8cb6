/* The data source (see source.h): TSV streaming with a reader thread that
 * parses chunks ahead of the consumer, and the bin/int32 mmap readers. */
#include "datasets/source.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/progress.h"
#include "common/rng.h"
#include "common/status.h"
#include "datasets/bin_ahead.h"
#include "datasets/binfmt.h"
#include "datasets/lines_impl.h"

#define CHUNK 2048
#define MAX_REPORTS 16

/* Starts the line of a pass over paths: "NAME: what", in bytes. */
static void pass_begin(sr_progress *pg, const char *name, const char *what, char *buf,
                       size_t n, char **paths, int npaths) {
  snprintf(buf, n, "%s: %s", name ? name : "", what);
  sr_progress_begin(pg, name != NULL, buf, "bytes", ds__paths_bytes(paths, npaths));
}

/* ---- chunks of parsed, mapped samples (sample-major) ---- */
typedef struct {
  int n;
  float labels[CHUNK];
  float dense[CHUNK * DS_NUM_DENSE];
  uint32_t off[CHUNK * DS_NUM_SPARSE + 1];
  uint64_t *ids;
  size_t ids_cap;
  int end, err;
  uint64_t lines, malformed, bad[DS_BAD_COUNT]; /* counted while filling */
} chunk;

struct ds_source {
  ds_source_opts o;
  ds_format fmt;
  char err[1024];
  char reports[MAX_REPORTS][512];
  int nreports, max_reports;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* TSV */
  char **paths;
  int npaths;
  ds_split_ranges ranges;
  uint64_t split_count[4];
  int exact;
  int counted; /* split_count is known (else counted on first ask) */
  ds_criteo_dict *dict;    /* the dictionaries while they are built (owned) */
  uint64_t range;          /* the max_ind_range in use: the transform's or the options' */
  uint64_t table_sizes[DS_NUM_SPARSE];
  linesrc ls;
  uint64_t skip;
  ds_criteo_sample smp; /* producer's parse buffer */
  chunk *ch;
  int nch, rd, wr, nfull, thread_on, stop, at_end, pending_err;
  int cur_pos; /* samples of ch[rd] consumed */
  pthread_t th;
  uint32_t *sc_off; /* consumer scratch: sample-major offsets of a batch */
  uint64_t *sc_ids;
  size_t sc_cap, sc_ids_cap;
  /* bin / int32 */
  ds_bin_reader *bin;
  uint64_t bin_begin, bin_end;
  ds_bin_ahead *ahead; /* the next batch decoded ahead (read_ahead > 0) */
  int ahead_tried;     /* made (or failed to be) at the first read */
  /* both */
  uint64_t next_index;
  ds_source_stats st;
  ds_id_mode mode;
  ds_transform *own_xf;    /* the transform made here (owned) */
  const ds_transform *xf;  /* the one in use: own_xf or o.transform; NULL: raw ids */
  uint64_t hkey[DS_NUM_SPARSE]; /* ds_criteo_hash_id(c, 0) ^ 0: the column keys */
};

static void add_report(ds_source *s, const char *file, uint64_t line, const char *what) {
  pthread_mutex_lock(&s->mu);
  if (s->nreports < s->max_reports) {
    sr_fmt(s->reports[s->nreports], sizeof s->reports[0], "%s:%llu: %s", file,
           (unsigned long long)line, what);
    if (s->o.report) fprintf(s->o.report, "%s\n", s->reports[s->nreports]);
    s->nreports++;
  }
  pthread_mutex_unlock(&s->mu);
}

static inline uint64_t map_id(const ds_source *s, int c, uint32_t v) {
  switch (s->mode) {
    case DS_IDS_DICT:
      if (s->range) v = (uint32_t)(v % s->range);
      return ds_criteo_dict_lookup(s->xf->dict, c, v);
    case DS_IDS_MODULO:
      return v % s->range;
    case DS_IDS_HASH: /* = ds_criteo_hash_id(c, v), with the column's key kept */
      return sr_mix64(s->hkey[c] ^ (uint64_t)v);
    default:
      return v;
  }
}

/* Parse lines into c until full, the end of the split, or an error. Runs in
 * the reader thread (or the caller's with read_ahead 0). */
static void produce(ds_source *s, chunk *c) {
  c->n = 0;
  c->end = c->err = 0;
  c->lines = c->malformed = 0;
  memset(c->bad, 0, sizeof c->bad);
  size_t nid = 0;
  c->off[0] = 0;
  const ds_criteo_parse_opts po = {.no_label = s->o.no_label};
  const uint64_t end = s->ranges.end[s->o.split];
  char why[256];
  while (c->n < CHUNK) {
    if (s->ls.line >= end) {
      c->end = 1;
      break;
    }
    const char *p;
    size_t n;
    int rc = ds__ls_next(&s->ls, &p, &n, s->err, sizeof s->err);
    if (rc == 0) {
      c->end = 1;
      break;
    }
    if (rc < 0) {
      c->err = rc;
      break;
    }
    c->lines++;
    ds_criteo_sample *m = &s->smp;
    if (rc == 2) {
      m->bad = DS_BAD_LONG;
      sr_fmt(why, sizeof why, "%s: longer than %u MiB", ds_bad_kind_name(DS_BAD_LONG),
             DS_LINE_MAX >> 20);
    }
    if (rc == 2 || ds_criteo_parse_line(p, n, &po, m, why, sizeof why)) {
      c->malformed++;
      c->bad[m->bad]++;
      if (!s->exact) /* a parsing pass at open has reported these lines already */
        add_report(s, s->ls.paths[s->ls.cur], s->ls.file_line - 1, why);
      if (s->o.strict) {
        sr_fmt(s->err, sizeof s->err, "%s:%llu: %s", s->ls.paths[s->ls.cur],
               (unsigned long long)(s->ls.file_line - 1), why);
        c->err = SR_EFORMAT;
        break;
      }
      continue;
    }
    if (s->skip) {
      s->skip--;
      continue;
    }
    int i = c->n;
    uint32_t nv = m->off[DS_NUM_SPARSE];
    if (nid + nv > c->ids_cap) {
      size_t cap = c->ids_cap * 2;
      while (cap < nid + nv) cap *= 2;
      uint64_t *q = realloc(c->ids, cap * sizeof *q);
      if (!q) {
        c->err = SR_ENOMEM;
        sr_fmt(s->err, sizeof s->err, "out of memory");
        break;
      }
      c->ids = q;
      c->ids_cap = cap;
    }
    c->labels[i] = (float)m->label;
    memcpy(&c->dense[(size_t)i * DS_NUM_DENSE], m->dense, sizeof m->dense);
    for (int f = 0; f < DS_NUM_SPARSE; f++) {
      for (uint32_t k = m->off[f]; k < m->off[f + 1]; k++) c->ids[nid++] = map_id(s, f, m->vals[k]);
      c->off[i * DS_NUM_SPARSE + f + 1] = (uint32_t)nid;
    }
    c->n++;
  }
}

static void *reader_main(void *arg) {
  ds_source *s = arg;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (s->nfull == s->nch && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    int stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    if (stop) break;
    chunk *c = &s->ch[s->wr];
    produce(s, c);
    s->wr = (s->wr + 1) % s->nch;
    pthread_mutex_lock(&s->mu);
    s->nfull++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (c->end || c->err) break;
  }
  return NULL;
}

static void reader_stop(ds_source *s) {
  if (s->thread_on) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    s->thread_on = 0;
  }
  s->stop = 0;
  s->nfull = s->rd = s->wr = 0;
  s->cur_pos = 0;
}

/* Position the TSV reader at the split's start, skipping `skip` samples. */
static int tsv_restart(ds_source *s, uint64_t skip) {
  reader_stop(s);
  ds__ls_free(&s->ls);
  int rc = ds__ls_init(&s->ls, s->paths, s->npaths, s->err, sizeof s->err);
  if (rc) return rc;
  const uint64_t begin = s->ranges.begin[s->o.split];
  while (s->ls.line < begin) {
    const char *p;
    size_t n;
    rc = ds__ls_next(&s->ls, &p, &n, s->err, sizeof s->err);
    if (rc < 0) return rc;
    if (rc == 0) break;
  }
  s->skip = skip;
  s->at_end = 0;
  s->pending_err = 0;
  if (s->o.read_ahead > 0) {
    if (pthread_create(&s->th, NULL, reader_main, s)) {
      sr_fmt(s->err, sizeof s->err, "cannot start the reader thread");
      return SR_EIO;
    }
    s->thread_on = 1;
  }
  return 0;
}

/* Counting pass: total lines and the last file's lines. */
static int count_lines(char **paths, int npaths, uint64_t *total, uint64_t *last, char *err,
                       size_t en, const char *progress) {
  linesrc l;
  int rc = ds__ls_init(&l, paths, npaths, err, en);
  sr_progress pg;
  char what[128];
  pass_begin(&pg, progress, "counting lines", what, sizeof what, paths, npaths);
  uint64_t at_last = 0;
  const char *p;
  size_t n;
  while (rc == 0) {
    if ((rc = ds__ls_next(&l, &p, &n, err, en)) <= 0) break;
    rc = 0;
    if (l.cur == npaths - 1) at_last++;
    if (!(l.line & 0xffff)) sr_progress_set(&pg, ds__ls_bytes(&l), 0);
  }
  if (!rc) sr_progress_set(&pg, pg.total, 0), sr_progress_end(&pg);
  *total = l.line;
  *last = at_last;
  ds__ls_free(&l);
  return rc;
}

/* Parsing pass over everything: exact counts per split, dictionaries. */
static int parse_pass(ds_source *s, int build_dict, uint64_t *total, uint64_t *last) {
  linesrc l;
  int rc = ds__ls_init(&l, s->paths, s->npaths, s->err, sizeof s->err);
  const ds_criteo_parse_opts po = {.no_label = s->o.no_label};
  const ds_split_ranges *r = &s->ranges;
  uint64_t at_last = 0;
  char why[256], what[128];
  memset(s->split_count, 0, sizeof s->split_count);
  sr_progress pg;
  pass_begin(&pg, s->o.progress, build_dict ? "dictionaries and counts" : "counts", what,
             sizeof what, s->paths, s->npaths);
  const char *p;
  size_t n;
  while (rc == 0) {
    if ((rc = ds__ls_next(&l, &p, &n, s->err, sizeof s->err)) <= 0) break;
    const int too_long = rc == 2;
    rc = 0;
    uint64_t li = l.line - 1;
    if (l.cur == s->npaths - 1) at_last++;
    s->st.scan_lines++;
    if (!(l.line & 0xffff)) sr_progress_set(&pg, ds__ls_bytes(&l), 0);
    if (too_long)
      sr_fmt(why, sizeof why, "%s: longer than %u MiB", ds_bad_kind_name(DS_BAD_LONG),
             DS_LINE_MAX >> 20);
    if (too_long || ds_criteo_parse_line(p, n, &po, &s->smp, why, sizeof why)) {
      s->st.scan_malformed++;
      add_report(s, l.paths[l.cur], l.file_line - 1, why);
      if (s->o.strict) {
        sr_fmt(s->err, sizeof s->err, "%s:%llu: %s", l.paths[l.cur],
               (unsigned long long)(l.file_line - 1), why);
        rc = SR_EFORMAT;
        break;
      }
      continue;
    }
    for (int k = 0; k < 4; k++) s->split_count[k] += li >= r->begin[k] && li < r->end[k];
    const ds_criteo_sample *m = &s->smp;
    s->st.scan_ids += m->off[DS_NUM_SPARSE];
    for (int f = 0; f < DS_NUM_SPARSE; f++) {
      uint32_t bag = m->off[f + 1] - m->off[f];
      if (bag > s->st.scan_max_bag) s->st.scan_max_bag = bag;
    }
    if (build_dict && li >= r->begin[DS_SPLIT_TRAIN] && li < r->end[DS_SPLIT_TRAIN])
      for (int f = 0; f < DS_NUM_SPARSE; f++)
        for (uint32_t k = m->off[f]; k < m->off[f + 1]; k++) {
          uint32_t v = m->vals[k];
          if (s->range) v = (uint32_t)(v % s->range);
          if (ds_criteo_dict_add(s->dict, f, v)) {
            sr_fmt(s->err, sizeof s->err, "out of memory building the dictionaries");
            rc = SR_ENOMEM;
            goto out;
          }
        }
  }
out:
  if (rc >= 0) sr_progress_set(&pg, pg.total, 0), sr_progress_end(&pg);
  *total = l.line;
  *last = at_last;
  ds__ls_free(&l);
  return rc < 0 ? rc : 0;
}

static int open_tsv(ds_source *s) {
  const ds_source_opts *o = &s->o;
  if (o->scheme == DS_SCHEME_TERABYTE) {
    s->npaths = 24;
    s->paths = calloc(24, sizeof *s->paths);
    if (!s->paths) return SR_ENOMEM;
    for (int d = 0; d < 24; d++) {
      size_t L = strlen(o->path) + 8;
      s->paths[d] = malloc(L);
      if (!s->paths[d]) return SR_ENOMEM;
      sr_path(s->paths[d], L, "%s_%d", o->path, d); /* L fits it */
      if (access(s->paths[d], R_OK)) {
        sr_fmt(s->err, sizeof s->err, "%s: %s (the terabyte split reads %s_0 .. %s_23)",
               s->paths[d], strerror(errno), o->path, o->path);
        return SR_EIO;
      }
    }
  } else {
    s->npaths = 1;
    s->paths = calloc(1, sizeof *s->paths);
    if (!s->paths || !(s->paths[0] = strdup(o->path))) return SR_ENOMEM;
  }
  const ds_transform *given = o->transform;
  if (given) s->mode = given->id_mode;
  s->range = given ? given->max_ind_range : o->max_ind_range;
  if (s->mode == DS_IDS_MODULO && !s->range) {
    sr_fmt(s->err, sizeof s->err, "%s: modulo ids need max_ind_range > 0", o->path);
    return SR_EINVAL;
  }
  if (o->extend && (!given || given->id_mode != DS_IDS_DICT)) {
    sr_fmt(s->err, sizeof s->err, "%s: only dictionaries are extended", o->path);
    return SR_EINVAL;
  }
  /* Dictionaries are built unless given as they are. */
  int dict = s->mode == DS_IDS_DICT && (!given || o->extend);
  uint64_t total = 0, last = 0;
  int rc;
  if (dict && !(s->dict = given ? ds_criteo_dict_extend(given->dict, given->frequency_threshold)
                                : ds_criteo_dict_create(o->frequency_threshold)))
    return SR_ENOMEM;
  if (o->scheme == DS_SCHEME_NONE && (dict || o->exact_count)) {
    /* train = everything: one parsing pass gives counts and dictionaries */
    ds_split_ranges_compute(DS_SCHEME_NONE, UINT64_MAX, 0, 0, &s->ranges);
    if ((rc = parse_pass(s, dict, &total, &last))) return rc;
    ds_split_ranges_compute(DS_SCHEME_NONE, total, 0, 0, &s->ranges);
    s->split_count[DS_SPLIT_TEST] = s->split_count[DS_SPLIT_VAL] = 0;
    s->exact = 1;
  } else if (o->scheme == DS_SCHEME_NONE && !dict && !o->exact_count) {
    /* everything, no dictionary: no pass at open; counted when asked */
    ds_split_ranges_compute(DS_SCHEME_NONE, UINT64_MAX, 0, 0, &s->ranges);
    s->counted = 0;
  } else {
    if ((rc = count_lines(s->paths, s->npaths, &total, &last, s->err, sizeof s->err,
                          o->progress)))
      return rc;
    if (ds_split_ranges_compute(o->scheme, total, last, o->test_fraction, &s->ranges)) {
      sr_fmt(s->err, sizeof s->err, "%s: bad split (test fraction %g)", o->path, o->test_fraction);
      return SR_EINVAL;
    }
    for (int k = 0; k < 4; k++) s->split_count[k] = s->ranges.end[k] - s->ranges.begin[k];
    if (dict || o->exact_count) {
      if ((rc = parse_pass(s, dict, &total, &last))) return rc;
      s->exact = 1;
    }
  }
  if (dict && ds_criteo_dict_finalize(s->dict)) return SR_ENOMEM;
  if (given && !dict) {
    s->xf = given;
  } else if (s->mode != DS_IDS_RAW) {
    uint32_t thr = given ? given->frequency_threshold : o->frequency_threshold;
    ds_criteo_dict *d = s->dict;
    s->dict = NULL; /* the transform's now, even on failure */
    if (!(s->xf = s->own_xf = ds_transform_create(s->mode, s->range, thr, d))) return SR_ENOMEM;
  }
  for (int c = 0; c < DS_NUM_SPARSE; c++) s->table_sizes[c] = 0;
  if (s->xf) ds_transform_table_sizes(s->xf, s->table_sizes);
  s->nch = o->read_ahead > 0 ? o->read_ahead + 1 : 1;
  s->ch = calloc((size_t)s->nch, sizeof *s->ch);
  if (!s->ch) return SR_ENOMEM;
  for (int i = 0; i < s->nch; i++) {
    s->ch[i].ids_cap = CHUNK * DS_NUM_SPARSE;
    if (!(s->ch[i].ids = malloc(s->ch[i].ids_cap * sizeof(uint64_t)))) return SR_ENOMEM;
  }
  return tsv_restart(s, 0);
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

static int open_bin(ds_source *s) {
  const ds_source_opts *o = &s->o;
  int int32 = s->fmt == DS_FORMAT_INT32;
  s->bin = ds_bin_reader_open(o->path, int32, !o->no_verify, s->err, sizeof s->err);
  if (!s->bin) return SR_EFORMAT;
  const ds_bin_info *in = ds_bin_reader_info(s->bin);
  if (int32) {
    if (o->scheme == DS_SCHEME_TERABYTE) {
      sr_fmt(s->err, sizeof s->err, "%s: the terabyte split needs the day_N TSV files", o->path);
      return SR_EINVAL;
    }
    if (ds_split_ranges_compute(o->scheme, in->n_samples, 0, o->test_fraction, &s->ranges)) {
      sr_fmt(s->err, sizeof s->err, "%s: bad split", o->path);
      return SR_EINVAL;
    }
    s->mode = o->max_ind_range ? DS_IDS_MODULO : DS_IDS_RAW;
    if (o->max_ind_range)
      for (int c = 0; c < DS_NUM_SPARSE; c++) s->table_sizes[c] = o->max_ind_range;
    else
      ds_bin_reader_id_range(s->bin, s->table_sizes);
  } else {
    ds_split_ranges *r = &s->ranges;
    r->begin[DS_SPLIT_ALL] = 0;
    r->end[DS_SPLIT_ALL] = in->n_samples;
    r->begin[DS_SPLIT_TRAIN] = 0;
    r->end[DS_SPLIT_TRAIN] = in->n_train;
    r->begin[DS_SPLIT_TEST] = in->n_train;
    r->end[DS_SPLIT_TEST] = in->n_train + in->n_test;
    r->begin[DS_SPLIT_VAL] = in->n_train + in->n_test;
    r->end[DS_SPLIT_VAL] = in->n_samples;
    s->mode = (ds_id_mode)in->id_mode;
    memcpy(s->table_sizes, in->table_sizes, sizeof s->table_sizes);
    ds_criteo_dict *d = NULL;
    if (s->mode == DS_IDS_DICT && !(d = ds_bin_reader_dict(s->bin))) {
      sr_fmt(s->err, sizeof s->err, "%s: %s", o->path, ds_bin_reader_errmsg(s->bin));
      return SR_EFORMAT;
    }
    if (s->mode != DS_IDS_RAW &&
        !(s->xf = s->own_xf = ds_transform_create(s->mode, in->max_ind_range, in->freq_threshold, d)))
      return SR_ENOMEM;
  }
  for (int k = 0; k < 4; k++) s->split_count[k] = s->ranges.end[k] - s->ranges.begin[k];
  s->exact = 1;
  s->bin_begin = s->ranges.begin[o->split];
  s->bin_end = s->ranges.end[o->split];
  s->next_index = 0;
  return 0;
}

/* First bytes that no Criteo text line starts with: a control byte other
 * than tab, CR or LF, or half or more of shardrec's magic in place. */
static int looks_binary(const unsigned char *m, ssize_t k) {
  int same = 0;
  for (ssize_t i = 0; i < k; i++) {
    if (m[i] < 0x20 && m[i] != '\t' && m[i] != '\r' && m[i] != '\n') return 1;
    same += m[i] == (unsigned char)DS_BIN_MAGIC[i];
  }
  return same >= 4;
}

/* s->fmt for AUTO, PROCESSED and RAW, from the file's first bytes (the
 * int32 layout, which has none of its own, from its name). 0, or
 * SR_EFORMAT with "PATH: not a shardrec binary file (magic ...)" in s->err
 * for a file that is not what it must be (RAW: "PATH: a shardrec binary
 * file ..., not raw Criteo TSV" for converted rows). */
static int pick_format(ds_source *s) {
  const ds_source_opts *o = &s->o;
  const int processed = s->fmt == DS_FORMAT_PROCESSED, raw = s->fmt == DS_FORMAT_RAW;
  s->fmt = DS_FORMAT_TSV;
  if (o->scheme == DS_SCHEME_TERABYTE) return 0;
  if (ends_with(o->path, ".int32")) {
    s->fmt = DS_FORMAT_INT32;
    if (!raw) return 0;
    sr_fmt(s->err, sizeof s->err, "%s: named as the reference DLRM's int32 records (converted "
           "rows), not raw Criteo TSV: give it as --processed-data-file", o->path);
    return SR_EFORMAT;
  }
  unsigned char m[8];
  int fd = open(o->path, O_RDONLY);
  if (fd < 0) return 0; /* the reader names the file and the reason */
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    sr_fmt(s->err, sizeof s->err, "%s: a folder, not a data file (give the file in it)", o->path);
    return SR_EFORMAT;
  }
  ssize_t k = pread(fd, m, sizeof m, 0);
  close(fd);
  if (k < 0) k = 0;
  if (k == 8 && !memcmp(m, DS_BIN_MAGIC, 8)) {
    s->fmt = DS_FORMAT_BIN;
    if (!raw) return 0;
    sr_fmt(s->err, sizeof s->err, "%s: a shardrec binary file (converted rows, magic '%s'), "
           "not raw Criteo TSV: give it as --processed-data-file", o->path, DS_BIN_MAGIC);
    return SR_EFORMAT;
  }
  const int gz = k >= 2 && m[0] == 0x1f && m[1] == 0x8b;
  if (!processed && (gz || !looks_binary(m, k))) return 0;
  char shown[40] = "";
  size_t w = 0;
  for (ssize_t i = 0; i < k; i++)
    w += (size_t)snprintf(shown + w, sizeof shown - w, m[i] >= 0x20 && m[i] < 0x7f ? "%c" : "\\x%02x",
                          m[i]);
  sr_fmt(s->err, sizeof s->err,
         "%s: not a shardrec binary file (magic '%s'%s, want '%s'; %s)", o->path, shown,
         k == 0 ? ": the file is empty" : k < 8 ? ": the file is shorter" : "", DS_BIN_MAGIC,
         processed ? "convert a TSV with 'shardrec convert', the reference DLRM's int32 "
                     "records are read from a name ending in .int32"
                   : "a Criteo TSV is text");
  return SR_EFORMAT;
}

ds_source *ds_source_open(const ds_source_opts *o, char *err, size_t errlen) {
  if (!o || !o->path || o->split < DS_SPLIT_ALL || o->split > DS_SPLIT_VAL) {
    sr_fmt(err, errlen, "ds_source_open: no path or bad split");
    return NULL;
  }
  ds_source *s = calloc(1, sizeof *s);
  if (!s) {
    sr_fmt(err, errlen, "%s: out of memory", o->path);
    return NULL;
  }
  s->o = *o;
  if (s->o.read_ahead == 0) s->o.read_ahead = 2;
  s->counted = 1;
  s->max_reports = o->max_reports > 0 ? (o->max_reports < MAX_REPORTS ? o->max_reports : MAX_REPORTS) : 5;
  s->mode = o->id_mode;
  for (int c = 0; c < DS_NUM_SPARSE; c++) s->hkey[c] = sr_mix64((uint64_t)(unsigned)c + 0x5eedULL);
  s->ls.fd = -1;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->fmt = o->format;
  if ((s->fmt == DS_FORMAT_AUTO || s->fmt == DS_FORMAT_PROCESSED || s->fmt == DS_FORMAT_RAW) &&
      pick_format(s)) {
    sr_fmt(err, errlen, "%s", s->err);
    ds_source_destroy(s);
    return NULL;
  }
  int rc = s->fmt == DS_FORMAT_TSV ? open_tsv(s) : open_bin(s);
  if (rc) {
    sr_fmt(err, errlen, "%s", s->err[0] ? s->err : sr_strerror(rc));
    if (!s->err[0]) sr_fmt(err, errlen, "%s: %s", o->path, sr_strerror(rc));
    ds_source_destroy(s);
    return NULL;
  }
  return s;
}

/* Wait for (or make) the chunk to read from; NULL at the end/after an error. */
static chunk *take_chunk(ds_source *s) {
  if (s->o.read_ahead <= 0) {
    if (s->nfull == 0) {
      produce(s, &s->ch[0]);
      s->nfull = 1;
    }
    return &s->ch[0];
  }
  pthread_mutex_lock(&s->mu);
  while (s->nfull == 0) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return &s->ch[s->rd];
}

static void release_chunk(ds_source *s) {
  chunk *c = &s->ch[s->rd];
  s->st.lines += c->lines;
  s->st.malformed += c->malformed;
  for (int k = 0; k < DS_BAD_COUNT; k++) s->st.bad[k] += c->bad[k];
  if (c->end) s->at_end = 1;
  if (c->err) s->pending_err = c->err;
  s->cur_pos = 0;
  if (s->o.read_ahead <= 0) {
    s->nfull = 0;
    return;
  }
  pthread_mutex_lock(&s->mu);
  s->nfull--;
  s->rd = (s->rd + 1) % s->nch;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static int next_tsv(ds_source *s, ds_batch *b, int max_n) {
  int n = 0;
  size_t nid = 0;
  if (s->sc_cap < (size_t)b->cap) {
    free(s->sc_off);
    s->sc_off = malloc(((size_t)b->cap * DS_NUM_SPARSE + 1) * sizeof *s->sc_off);
    if (!s->sc_off) return SR_ENOMEM;
    s->sc_cap = (size_t)b->cap;
  }
  s->sc_off[0] = 0;
  while (n < max_n && !s->at_end && !s->pending_err) {
    chunk *c = take_chunk(s);
    int take = c->n - s->cur_pos;
    if (take > max_n - n) take = max_n - n;
    if (take > 0) {
      int i0 = s->cur_pos;
      memcpy(&b->labels[n], &c->labels[i0], (size_t)take * sizeof(float));
      memcpy(&b->dense[(size_t)n * DS_NUM_DENSE], &c->dense[(size_t)i0 * DS_NUM_DENSE],
             (size_t)take * DS_NUM_DENSE * sizeof(float));
      uint32_t a = c->off[i0 * DS_NUM_SPARSE], e = c->off[(i0 + take) * DS_NUM_SPARSE];
      if (nid + (e - a) > s->sc_ids_cap) {
        size_t cap = s->sc_ids_cap ? s->sc_ids_cap : 4096;
        while (cap < nid + (e - a)) cap *= 2;
        uint64_t *q = realloc(s->sc_ids, cap * sizeof *q);
        if (!q) return SR_ENOMEM;
        s->sc_ids = q;
        s->sc_ids_cap = cap;
      }
      memcpy(s->sc_ids + nid, c->ids + a, (e - a) * sizeof(uint64_t));
      for (int k = 1; k <= take * DS_NUM_SPARSE; k++)
        s->sc_off[n * DS_NUM_SPARSE + k] = (uint32_t)(nid + (c->off[i0 * DS_NUM_SPARSE + k] - a));
      nid += e - a;
      n += take;
      s->cur_pos += take;
    }
    if (s->cur_pos >= c->n) release_chunk(s);
  }
  if (n == 0 && s->pending_err) return s->pending_err;
  /* transpose to feature-major CSR */
  if (ds_batch_reserve_ids(b, nid)) return SR_ENOMEM;
  size_t pos = 0;
  for (int f = 0; f < DS_NUM_SPARSE; f++) {
    uint32_t *o = ds_batch_offsets(b, f);
    for (int i = 0; i < n; i++) {
      o[i] = (uint32_t)pos;
      uint32_t a = s->sc_off[i * DS_NUM_SPARSE + f], e = s->sc_off[i * DS_NUM_SPARSE + f + 1];
      for (uint32_t k = a; k < e; k++) b->ids[pos++] = s->sc_ids[k];
    }
    o[n] = (uint32_t)pos;
  }
  b->n = n;
  b->first_index = s->next_index;
  s->next_index += (uint64_t)n;
  s->st.samples += (uint64_t)n;
  return n;
}

int ds_source_next(ds_source *s, ds_batch *b, int max_n) {
  if (!s || !b || max_n <= 0 || max_n > b->cap) {
    if (s) sr_fmt(s->err, sizeof s->err, "ds_source_next: max_n %d outside [1, %d]", max_n, b ? b->cap : 0);
    return SR_EINVAL;
  }
  if (s->bin) {
    uint64_t at = s->bin_begin + s->next_index;
    uint64_t left = s->bin_end - at;
    int n = left < (uint64_t)max_n ? (int)left : max_n;
    b->n = 0;
    if (n == 0) return 0;
    const uint64_t mod = s->fmt == DS_FORMAT_INT32 ? s->o.max_ind_range : 0;
    if (!s->ahead_tried && s->o.read_ahead > 0) { /* without a helper: decoded here */
      s->ahead_tried = 1;
      s->ahead = ds_bin_ahead_create(s->bin, mod, b->cap);
    }
    int taken = 0;
    int rc = s->ahead ? ds_bin_ahead_read(s->ahead, at, n, b, &taken)
                      : ds_bin_reader_read(s->bin, at, n, mod, b);
    s->st.ahead_taken += (uint64_t)taken;
    if (rc) {
      sr_fmt(s->err, sizeof s->err, "%s: %s", s->o.path, ds_bin_reader_errmsg(s->bin));
      return rc;
    }
    b->first_index = s->next_index;
    s->next_index += (uint64_t)n;
    s->st.lines += (uint64_t)n;
    s->st.samples += (uint64_t)n;
    left -= (uint64_t)n; /* the next read of max_n, begun now */
    if (s->ahead && left) ds_bin_ahead_start(s->ahead, at + n, left < (uint64_t)max_n ? (int)left : max_n);
    return n;
  }
  b->n = 0;
  return next_tsv(s, b, max_n);
}

int ds_source_seek(ds_source *s, uint64_t k) {
  if (!s) return SR_EINVAL;
  if (s->counted && k > s->split_count[s->o.split]) {
    sr_fmt(s->err, sizeof s->err, "seek to %llu: the split has %llu samples",
           (unsigned long long)k, (unsigned long long)s->split_count[s->o.split]);
    return SR_ERANGE;
  }
  memset(&s->st.lines, 0, sizeof(uint64_t) * (3 + DS_BAD_COUNT));
  s->next_index = k;
  s->st.samples = k;
  if (s->bin) return 0;
  return tsv_restart(s, k);
}

int ds_source_rewind(ds_source *s) { return ds_source_seek(s, 0); }

/* TSV read whole without a dictionary: count the lines on first ask. */
static void ensure_counted(ds_source *s) {
  if (s->counted) return;
  uint64_t total = 0, last = 0;
  char err[256]; /* the reader thread may be using s->err */
  if (count_lines(s->paths, s->npaths, &total, &last, err, sizeof err, NULL) == 0) {
    s->split_count[DS_SPLIT_ALL] = s->split_count[DS_SPLIT_TRAIN] = total;
    s->counted = 1;
  }
}

uint64_t ds_source_count(ds_source *s) {
  if (!s) return 0;
  ensure_counted(s);
  return s->split_count[s->o.split];
}

uint64_t ds_source_split_count(ds_source *s, ds_split split) {
  if (!s || split < DS_SPLIT_ALL || split > DS_SPLIT_VAL) return 0;
  ensure_counted(s);
  return s->split_count[split];
}

int ds_source_table_sizes(ds_source *s, uint64_t *sizes) {
  if (!s || !sizes) return SR_EINVAL;
  memcpy(sizes, s->table_sizes, sizeof s->table_sizes);
  return 0;
}

const ds_criteo_dict *ds_source_dict(ds_source *s) { return s && s->xf ? s->xf->dict : NULL; }

const ds_transform *ds_source_transform(const ds_source *s) { return s ? s->xf : NULL; }

ds_id_mode ds_source_id_mode(ds_source *s) { return s->mode; }

int ds_source_stats_get(ds_source *s, ds_source_stats *st) {
  if (!s || !st) return SR_EINVAL;
  *st = s->st;
  return 0;
}

const char *ds_source_report(ds_source *s, int i) {
  if (!s || i < 0) return NULL;
  pthread_mutex_lock(&s->mu);
  const char *r = i < s->nreports ? s->reports[i] : NULL;
  pthread_mutex_unlock(&s->mu);
  return r;
}

int ds_source_bad_lines(const ds_source *s, uint64_t **bad, size_t *n_bad, char *err,
                        size_t errlen) {
  *bad = NULL;
  *n_bad = 0;
  if (s->fmt != DS_FORMAT_TSV) return 0;
  const uint64_t lo = s->ranges.begin[s->o.split], hi = s->ranges.end[s->o.split];
  const ds_criteo_parse_opts po = {.no_label = s->o.no_label};
  ds_criteo_sample *smp = malloc(sizeof *smp);
  linesrc l;
  int rc = smp ? ds__ls_init(&l, s->paths, s->npaths, err, errlen) : SR_ENOMEM;
  size_t cap = 0;
  const char *p;
  size_t n;
  while (rc == 0 && (rc = ds__ls_next(&l, &p, &n, err, errlen)) > 0) {
    const uint64_t li = l.line - 1;
    const int skipped = rc == 2;
    rc = 0;
    if (li >= hi) break;
    if (li < lo || (!skipped && !ds_criteo_parse_line(p, n, &po, smp, NULL, 0))) continue;
    if (*n_bad == cap) {
      uint64_t *q = realloc(*bad, (cap = cap ? 2 * cap : 64) * sizeof *q);
      if (!q) {
        rc = SR_ENOMEM;
        break;
      }
      *bad = q;
    }
    (*bad)[(*n_bad)++] = li - lo;
  }
  if (smp) ds__ls_free(&l);
  free(smp);
  if (rc == SR_ENOMEM) sr_fmt(err, errlen, "out of memory listing the malformed lines");
  if (rc < 0) {
    free(*bad);
    *bad = NULL;
    *n_bad = 0;
    return rc;
  }
  return 0;
}

int ds_source_labelled(const ds_source *s) {
  if (s->fmt == DS_FORMAT_TSV) return !s->o.no_label;
  return !(ds_bin_reader_info(s->bin)->flags & DS_BIN_NO_LABEL);
}

#define ENDS_CRC ", ends crc32 "

void ds_source_identity(const ds_source *s, char *out, size_t len) {
  if (s->fmt == DS_FORMAT_TSV) {
    sr_fmt(out, len, "tsv %llu bytes" ENDS_CRC "%08x",
           (unsigned long long)ds__paths_bytes(s->paths, s->npaths),
           ds__paths_ends_crc(s->paths, s->npaths));
    return;
  }
  const ds_bin_info *in = ds_bin_reader_info(s->bin);
  char *const path[1] = {(char *)s->o.path};
  if (s->fmt == DS_FORMAT_INT32)
    sr_fmt(out, len, "int32 %llu records" ENDS_CRC "%08x", (unsigned long long)in->n_samples,
           ds__paths_ends_crc(path, 1));
  else
    sr_fmt(out, len, "bin data crc32 %08x, %llu samples (train %llu, test %llu, val %llu)",
           in->data_crc, (unsigned long long)in->n_samples, (unsigned long long)in->n_train,
           (unsigned long long)in->n_test, (unsigned long long)in->n_val);
}

int ds_source_identity_same(const char *was, const char *now) {
  if (!strcmp(was, now)) return 1;
  /* An identity written before the ends' CRC was part of it: its bytes or
   * records alone. */
  const size_t n = strlen(was);
  return !strstr(was, ENDS_CRC) && !strncmp(was, now, n) &&
         !strncmp(now + n, ENDS_CRC, strlen(ENDS_CRC)) &&
         (!strncmp(was, "tsv ", 4) || !strncmp(was, "int32 ", 6));
}

const char *ds_source_errmsg(ds_source *s) { return s ? s->err : "no source"; }

int ds_source_record_of(const ds_source *s, uint64_t sample_index, uint64_t *record) {
  if (!s || !s->bin) return SR_EINVAL;
  *record = s->bin_begin + sample_index;
  return 0;
}

void ds_source_destroy(ds_source *s) {
  if (!s) return;
  reader_stop(s);
  ds__ls_free(&s->ls);
  if (s->ch)
    for (int i = 0; i < s->nch; i++) free(s->ch[i].ids);
  free(s->ch);
  for (int i = 0; i < s->npaths && s->paths; i++) free(s->paths[i]);
  free(s->paths);
  ds_criteo_dict_destroy(s->dict);
  ds_transform_free(s->own_xf);
  ds_bin_ahead_destroy(s->ahead); /* before the reader it reads */
  ds_bin_reader_destroy(s->bin);
  free(s->sc_off);
  free(s->sc_ids);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}
