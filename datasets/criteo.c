/* Criteo line parser, id mappings and split schemes (see criteo.h). */
#include "datasets/criteo.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/status.h"

const char *ds_bad_kind_name(int kind) {
  switch (kind) {
    case DS_BAD_NONE:
      return "good";
#define DS__BAD_MSG(name, code, msg) \
  case code:                         \
    return msg;
      DS_BAD_MAP(DS__BAD_MSG)
#undef DS__BAD_MSG
  }
  return "unknown";
}

/* Copy up to 16 bytes of a field into a printable, quoted form. */
static void field_text(const char *s, const char *e, char *out, size_t n) {
  size_t k = 0;
  for (const char *p = s; p < e && k + 4 < n && p - s < 16; p++)
    out[k++] = (*p >= 32 && *p < 127) ? *p : '?';
  if (e - s > 16 && k + 4 < n) {
    out[k++] = '.';
    out[k++] = '.';
    out[k++] = '.';
  }
  out[k] = 0;
}

/* Field `field` of the line (0-based), column col (0 the label, 1..13
 * I1..I13, 14..39 C1..C26), refused: "KIND: field N (COLUMN): 'TEXT' WHAT". */
static int fail(ds_criteo_sample *s, int kind, char *err, size_t errlen, int field, int col,
                const char *fs, const char *fe, const char *what) {
  s->bad = kind;
  if (err && errlen) {
    char txt[32], name[8] = "label";
    field_text(fs, fe, txt, sizeof txt);
    if (col > 0)
      snprintf(name, sizeof name, "%c%d", col <= DS_NUM_DENSE ? 'I' : 'C',
               col <= DS_NUM_DENSE ? col : col - DS_NUM_DENSE);
    sr_fmt(err, errlen, "%s: field %d (%s): '%s' %s", ds_bad_kind_name(kind), field + 1, name, txt,
           what);
  }
  return SR_EFORMAT;
}

/* log1p of small integers, computed once with the same expression as the
 * general case, so the table changes no value. */
#define LOG_TABLE 4096
static float log_table[LOG_TABLE];
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static void log_init(void) {
  for (int i = 0; i < LOG_TABLE; i++) log_table[i] = (float)log1p((double)i);
}

/* Hex digit value + 1 of a byte, 0 for a byte that is not a hex digit. */
static const uint8_t hex_tab[256] = {
    ['0'] = 1,  ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,
    ['7'] = 8,  ['8'] = 9,  ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14,
    ['e'] = 15, ['f'] = 16, ['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15,
    ['F'] = 16};

/* End of the field that starts at fs (for error messages only). */
static const char *field_end(const char *fs, const char *end) {
  const char *fe = memchr(fs, '\t', (size_t)(end - fs));
  return fe ? fe : end;
}

#define BAD(kind, what) return fail(s, kind, err, errlen, f, col, fs, field_end(fs, end), what)

/* One pass over the bytes: each field is parsed where it stands and must end
 * at a tab or at the end of the line; no separate search for the tabs. */
int ds_criteo_parse_line(const char *line, size_t len, const ds_criteo_parse_opts *o,
                         ds_criteo_sample *s, char *err, size_t errlen) {
  pthread_once(&log_once, log_init);
  const int nl = o && o->no_label;
  const int nfields = nl ? 39 : 40;
  const char *end = line + len;
  if (end > line && end[-1] == '\n') end--;
  if (end > line && end[-1] == '\r') end--;
  s->label = 0;
  s->bad = 0;
  if (err && errlen) err[0] = 0;
  uint32_t nv = 0;
  int f = 0;
  const char *q = line;
  for (;;) {
    const char *fs = q;
    if (f >= nfields) {
      s->bad = DS_BAD_FIELDS;
      if (err && errlen) {
        int n = f + 1;
        for (const char *p = fs; p < end; p++) n += *p == '\t';
        sr_fmt(err, errlen, "%s: %d fields, at most %d expected", ds_bad_kind_name(DS_BAD_FIELDS),
               n, nfields);
      }
      return SR_EFORMAT;
    }
    const int col = nl ? f + 1 : f; /* 0 label, 1..13 dense, 14..39 categorical */
    if (col == 0) {
      if (q < end && (*q == '0' || *q == '1') && (q + 1 == end || q[1] == '\t')) {
        s->label = *q - '0';
        q++;
      } else {
        BAD(DS_BAD_LABEL, "is not 0 or 1");
      }
    } else if (col <= DS_NUM_DENSE) {
      float v = 0.0f;
      if (q < end && *q != '\t') {
        int neg = *q == '-';
        q += neg;
        const char *d0 = q;
        uint64_t acc = 0;
        const char *q18 = end - q > 18 ? q + 18 : end; /* 18 digits cannot overflow */
        for (; q < q18; q++) {
          unsigned d = (unsigned)(unsigned char)*q - '0';
          if (d > 9) break;
          acc = acc * 10 + d;
        }
        if (q == q18 && q < end) {
          const uint64_t lim = neg ? (1ULL << 63) : (uint64_t)INT64_MAX;
          for (; q < end; q++) {
            unsigned d = (unsigned)(unsigned char)*q - '0';
            if (d > 9) break;
            if (acc > (lim - d) / 10) BAD(DS_BAD_OVERFLOW, "does not fit in int64");
            acc = acc * 10 + d;
          }
        }
        if (q == d0 || (q < end && *q != '\t')) BAD(DS_BAD_INT, "is not an integer");
        if (!neg && acc) v = acc < LOG_TABLE ? log_table[acc] : (float)log1p((double)acc);
      }
      s->dense[col - 1] = v;
    } else {
      const int c = col - 1 - DS_NUM_DENSE;
      s->off[c] = nv;
      if (q == end || *q == '\t') {
        if (nv >= DS_CRITEO_MAX_VALUES) BAD(DS_BAD_VALUES, "exceeds the values per line");
        s->vals[nv++] = 0;
      } else {
        for (;;) {
          const char *v0 = q;
          uint32_t v = 0;
          unsigned h;
          while (q < end && (h = hex_tab[(unsigned char)*q]) != 0) {
            v = (v << 4) | (h - 1);
            q++;
          }
          if (q < end && *q != '\t' && *q != ',') BAD(DS_BAD_CAT, "is not hexadecimal");
          if (q == v0) BAD(DS_BAD_CAT, "has an empty value");
          if (q - v0 > 8) BAD(DS_BAD_CAT, "has more than 8 hex digits");
          if (nv >= DS_CRITEO_MAX_VALUES) BAD(DS_BAD_VALUES, "exceeds the values per line");
          if (nv - s->off[c] >= DS_MAX_BAG) BAD(DS_BAD_VALUES, "holds more than 128 ids (a bag's limit)");
          s->vals[nv++] = v;
          if (q < end && *q == ',') {
            q++;
            continue;
          }
          break;
        }
      }
    }
    f++;
    if (q == end) break;
    q++; /* the tab */
  }
  /* Stripped trailing fields are empty. f >= 1 here, so the label was seen. */
  for (; f < nfields; f++) {
    const char *fs = end;
    const int col = nl ? f + 1 : f;
    if (col <= DS_NUM_DENSE) {
      s->dense[col - 1] = 0.0f;
    } else {
      const int c = col - 1 - DS_NUM_DENSE;
      s->off[c] = nv;
      if (nv >= DS_CRITEO_MAX_VALUES) BAD(DS_BAD_VALUES, "exceeds the values per line");
      s->vals[nv++] = 0;
    }
  }
  s->off[DS_NUM_SPARSE] = nv;
  return 0;
}

uint64_t ds_criteo_hash_id(int col, uint32_t value) {
  return sr_mix64(sr_mix64((uint64_t)(unsigned)col + 0x5eedULL) ^ (uint64_t)value);
}

/* ---- dictionaries -------------------------------------------------------- */

typedef struct {
  uint32_t *keys, *vals; /* open addressing; vals == 0 marks an empty slot */
  uint64_t cap, used;
  uint32_t *order; /* keys by first appearance (after finalize: kept keys by id) */
  uint64_t norder, order_cap;
  uint64_t size; /* rows after finalize */
} dcol;

struct ds_criteo_dict {
  uint32_t thr;
  int final;
  dcol c[DS_NUM_SPARSE];
};

static inline uint64_t slot_of(uint32_t key, uint64_t cap) {
  return (uint64_t)((uint64_t)key * 0x9E3779B97F4A7C15ULL >> 20) & (cap - 1);
}

static int dcol_alloc(dcol *c, uint64_t cap) {
  c->keys = calloc(cap, sizeof *c->keys);
  c->vals = calloc(cap, sizeof *c->vals);
  if (!c->keys || !c->vals) {
    free(c->keys);
    free(c->vals);
    c->keys = c->vals = NULL;
    return SR_ENOMEM;
  }
  c->cap = cap;
  c->used = 0;
  return 0;
}

static uint32_t *dcol_find(dcol *c, uint32_t key) {
  uint64_t i = slot_of(key, c->cap);
  while (c->vals[i] && c->keys[i] != key) i = (i + 1) & (c->cap - 1);
  c->keys[i] = key;
  return &c->vals[i];
}

static int dcol_grow(dcol *c) {
  dcol n = *c;
  if (dcol_alloc(&n, c->cap * 2)) return SR_ENOMEM;
  for (uint64_t i = 0; i < c->cap; i++)
    if (c->vals[i]) {
      *dcol_find(&n, c->keys[i]) = c->vals[i];
      n.used++;
    }
  free(c->keys);
  free(c->vals);
  *c = n;
  return 0;
}

ds_criteo_dict *ds_criteo_dict_create(uint32_t thr) {
  ds_criteo_dict *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->thr = thr ? thr : 1;
  for (int c = 0; c < DS_NUM_SPARSE; c++)
    if (dcol_alloc(&d->c[c], 1024)) {
      ds_criteo_dict_destroy(d);
      return NULL;
    }
  return d;
}

ds_criteo_dict *ds_criteo_dict_extend(const ds_criteo_dict *base, uint32_t thr) {
  ds_criteo_dict *d = ds_criteo_dict_create(thr);
  for (int c = 0; d && c < DS_NUM_SPARSE; c++) {
    uint64_t n;
    const uint32_t *v = ds_criteo_dict_values(base, c, &n);
    for (uint64_t i = 0; i < n; i++) {
      if (ds_criteo_dict_add(d, c, v[i])) {
        ds_criteo_dict_destroy(d);
        return NULL;
      }
      *dcol_find(&d->c[c], v[i]) = UINT32_MAX; /* kept, counted no further */
    }
  }
  return d;
}

void ds_criteo_dict_destroy(ds_criteo_dict *d) {
  if (!d) return;
  for (int c = 0; c < DS_NUM_SPARSE; c++) {
    free(d->c[c].keys);
    free(d->c[c].vals);
    free(d->c[c].order);
  }
  free(d);
}

int ds_criteo_dict_add(ds_criteo_dict *d, int col, uint32_t value) {
  if (d->final) return SR_ESTATE;
  dcol *c = &d->c[col];
  if ((c->used + 1) * 2 > c->cap && dcol_grow(c)) return SR_ENOMEM;
  uint32_t *v = dcol_find(c, value);
  if (*v == 0) {
    if (c->norder == c->order_cap) {
      uint64_t nc = c->order_cap ? c->order_cap * 2 : 1024;
      uint32_t *o = realloc(c->order, nc * sizeof *o);
      if (!o) return SR_ENOMEM;
      c->order = o;
      c->order_cap = nc;
    }
    c->order[c->norder++] = value;
    c->used++;
  }
  if (*v != UINT32_MAX) (*v)++;
  return 0;
}

int ds_criteo_dict_finalize(ds_criteo_dict *d) {
  if (d->final) return 0;
  for (int ci = 0; ci < DS_NUM_SPARSE; ci++) {
    dcol *c = &d->c[ci];
    uint64_t kept = 0;
    for (uint64_t i = 0; i < c->norder; i++) {
      uint32_t cnt = *dcol_find(c, c->order[i]);
      if (cnt >= d->thr) c->order[kept++] = c->order[i];
    }
    uint64_t cap = 1024;
    while (cap < kept * 2 + 2) cap *= 2;
    dcol n = *c;
    if (dcol_alloc(&n, cap)) return SR_ENOMEM;
    for (uint64_t i = 0; i < kept; i++) *dcol_find(&n, c->order[i]) = (uint32_t)(i + 1);
    n.used = kept;
    n.norder = kept;
    n.size = kept + 1;
    free(c->keys);
    free(c->vals);
    *c = n;
  }
  d->final = 1;
  return 0;
}

uint32_t ds_criteo_dict_lookup(const ds_criteo_dict *d, int col, uint32_t value) {
  const dcol *c = &d->c[col];
  uint64_t i = slot_of(value, c->cap);
  while (c->vals[i]) {
    if (c->keys[i] == value) return c->vals[i];
    i = (i + 1) & (c->cap - 1);
  }
  return 0;
}

uint64_t ds_criteo_dict_size(const ds_criteo_dict *d, int col) { return d->c[col].size; }

const uint32_t *ds_criteo_dict_values(const ds_criteo_dict *d, int col, uint64_t *n) {
  *n = d->c[col].norder;
  return d->c[col].order;
}

ds_criteo_dict *ds_criteo_dict_from_values(const uint32_t *const *values, const uint64_t *n,
                                           char *err, size_t errlen) {
  ds_criteo_dict *d = calloc(1, sizeof *d);
  sr_fmt(err, errlen, "out of memory loading the dictionaries");
  if (!d) return NULL;
  d->thr = 1;
  d->final = 1;
  for (int ci = 0; ci < DS_NUM_SPARSE; ci++) {
    dcol *c = &d->c[ci];
    uint64_t cap = 1024;
    while (cap < n[ci] * 2 + 2) cap *= 2;
    c->order = malloc((n[ci] ? n[ci] : 1) * sizeof *c->order);
    if (!c->order || dcol_alloc(c, cap)) {
      ds_criteo_dict_destroy(d);
      return NULL;
    }
    if (n[ci]) memcpy(c->order, values[ci], n[ci] * sizeof *c->order);
    for (uint64_t i = 0; i < n[ci]; i++) {
      uint32_t *id = dcol_find(c, values[ci][i]);
      if (*id) {
        sr_fmt(err, errlen, "C%d: value 0x%x is entries %u and %llu of its dictionary", ci + 1,
               values[ci][i], *id, (unsigned long long)(i + 1));
        ds_criteo_dict_destroy(d);
        return NULL;
      }
      *id = (uint32_t)(i + 1);
    }
    c->used = c->norder = c->order_cap = n[ci];
    c->size = n[ci] + 1;
  }
  if (err && errlen) err[0] = 0;
  return d;
}

/* ---- splits -------------------------------------------------------------- */

static void set(ds_split_ranges *r, int s, uint64_t b, uint64_t e) {
  r->begin[s] = b;
  r->end[s] = e;
}

/* Halve the last part [b, total): test gets the first half (rounded up). */
static void halve(ds_split_ranges *r, uint64_t b, uint64_t total) {
  uint64_t half = (total - b + 1) / 2;
  set(r, DS_SPLIT_TRAIN, 0, b);
  set(r, DS_SPLIT_TEST, b, b + half);
  set(r, DS_SPLIT_VAL, b + half, total);
}

int ds_split_ranges_compute(ds_split_scheme scheme, uint64_t total, uint64_t last_file_lines,
                            double fraction, ds_split_ranges *r) {
  set(r, DS_SPLIT_ALL, 0, total);
  switch (scheme) {
    case DS_SCHEME_NONE:
      set(r, DS_SPLIT_TRAIN, 0, total);
      set(r, DS_SPLIT_TEST, total, total);
      set(r, DS_SPLIT_VAL, total, total);
      return 0;
    case DS_SCHEME_KAGGLE: {
      uint64_t per = total / 7, extra = total % 7;
      uint64_t day6 = 6 * per + (extra < 6 ? extra : 6);
      halve(r, day6, total);
      return 0;
    }
    case DS_SCHEME_TERABYTE:
      if (last_file_lines > total) return SR_EINVAL;
      halve(r, total - last_file_lines, total);
      return 0;
    case DS_SCHEME_FRACTION: {
      if (!(fraction >= 0.0 && fraction <= 1.0)) return SR_EINVAL;
      uint64_t nt = (uint64_t)floor(fraction * (double)total);
      if (nt > total) nt = total;
      set(r, DS_SPLIT_TRAIN, 0, total - nt);
      set(r, DS_SPLIT_TEST, total - nt, total);
      set(r, DS_SPLIT_VAL, total, total);
      return 0;
    }
  }
  return SR_EINVAL;
}
