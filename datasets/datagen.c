/* Synthetic Criteo-format generator with a known optimum: see datagen.h. */
#include "datasets/datagen.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/auc.h"
#include "common/fs.h"
#include "common/num.h"
#include "common/outfile.h"
#include "common/progress.h"
#include "common/rng.h"
#include "common/status.h"
#include "common/sys.h"

/* The reference DLRM's Kaggle cardinalities (C1..C26). */
static const uint32_t kaggle_counts[DG_NUM_CAT] = {
    1460,  583,     10131227, 2202608, 305, 24,      12517, 633, 3,      93145, 5683, 8351593, 3194,
    27,    14992,   5461306,  10,      5652, 2173,   4,     7046547, 18,  15,     286181, 105, 142572};

/* Missing rates measured on the Kaggle set (rounded). Integers average 20.7%,
 * categoricals 11.1%. */
static const double dense_miss[DG_NUM_DENSE] = {0.45,  0.0,   0.21,  0.22, 0.026, 0.22, 0.043,
                                                0.0005, 0.043, 0.45, 0.043, 0.765, 0.22};
static const double cat_miss[DG_NUM_CAT] = {0,     0,     0.034, 0.034, 0,    0.12, 0,     0,    0,
                                            0,     0,     0.034, 0,     0,    0,    0.034, 0,    0,
                                            0.44,  0.44,  0.034, 0.76,  0,    0.034, 0.44, 0.44};
/* Columns whose values go missing together, as in the real set. Group 0 is
 * "independent"; groups 1 and 2 share one draw per row. */
static const int cat_miss_group[DG_NUM_CAT] = {0, 0, 2, 2, 0, 0, 0, 0, 0, 0, 0, 2, 0,
                                               0, 0, 2, 0, 0, 1, 1, 2, 0, 0, 2, 1, 1};

/* Integer features: value = floor(exp(mu + sigma * z)) - 1, z ~ N(0,1): heavy
 * tailed non-negative counts with medians close to the real columns'. */
static const double dense_mu[DG_NUM_DENSE] = {0.7, 1.5, 2.0, 1.8, 7.5, 3.5, 1.6,
                                              2.4, 3.8, 0.3, 1.0, 0.3, 1.7};
static const double dense_sigma[DG_NUM_DENSE] = {1.0, 1.6, 1.4, 0.9, 1.8, 1.5, 1.4,
                                                 1.0, 1.3, 0.6, 1.0, 1.2, 1.0};

/* Teacher scales, tuned so that the oracle AUC is about 0.80, the categorical
 * part carries about 0.7 of the logit variance, dense-only logistic
 * regression sits well below the oracle (see tests/datagen), and a DLRM can
 * learn most of the signal from a few hundred thousand rows: value effects
 * shrink as 1/(1 + rank/8), so the signal sits on values seen often enough to
 * be learned, and the factorization-machine part is small. */
#define DG_TEACHER_DENSE 0.85 /* std of the dense part */
#define DG_TEACHER_CAT 0.30   /* per-column value-bias std before shrink */
#define DG_TEACHER_FM 0.08    /* latent entry scale before shrink */
#define DG_FM_DIM 4
#define DG_CROSS_N 8          /* cross triples */
#define DG_SHRINK_RANK 8.0    /* shrink(r) = 1/(1 + r/8) */
#define DG_VCACHE 4096        /* ranks whose teacher parameters are cached */
#define DG_ALIAS_MAX (1u << 20)
#define DG_ALIAS_HEAD 1024
#define DG_PILOT_ROWS 20000
#define DG_TARGET_RATE 0.25
#define DG_HIST_BINS (1u << 20)

typedef struct {
  float b;
  float e[DG_FM_DIM];
} vparam;

/* Zipf over ranks 0..n-1 with P(r) ~ 1/(r+1)^s: rejection-inversion
 * (Hörmann & Derflinger 1996, as Apache Commons' sampler), O(1) expected,
 * no table. */
typedef struct {
  double s, hx1, hn, sv;
  double n;
} zipf_ri;

/* One alias-table entry: keep i when the coin is below thresh, else take
 * alias. Packed so that a draw touches one cache line. */
typedef struct {
  uint32_t thresh, alias;
} alias_ent;

typedef struct {
  uint32_t card;
  alias_ent *alias; /* head table [nhead (+1 tail outcome)]; NULL: rejection-
                       inversion (card > DG_ALIAS_MAX) or uniform */
  alias_ent *tail;  /* tail table [card - nhead] or NULL */
  uint32_t nhead;
  zipf_ri ri;
  uint32_t hex_k0, hex_k1;
  vparam *cache;    /* [min(card, DG_VCACHE)] */
  vparam missing;
  double w;         /* value-bias scale */
} catcol;

struct dg_generator {
  dg_config cfg;
  uint64_t row_key, pilot_key, label_key, val_key;
  catcol cat[DG_NUM_CAT];
  double dw[DG_NUM_DENSE];     /* dense weights */
  double dmiss[DG_NUM_DENSE];  /* dense missing biases */
  double bias;
  double cross_scale;          /* c of the cross part (0: none), from the pilot */
  double pilot_var_dense, pilot_var_cat, pilot_var_cross, pilot_var_total;
};

/* ---------------------------------------------------------------- defaults */

void dg_config_default(dg_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->rows = 1000;
  cfg->seed = 1;
  cfg->scale = 0.01;
  cfg->test_fraction = 0.1;
  cfg->zipf_s = 1.1;
  cfg->multi_hot = 1;
  cfg->auc_exact_max = 1ull << 25;
}

uint32_t dg_cardinality(int col, double scale) {
  if (col < 0 || col >= DG_NUM_CAT) return 0;
  if (scale <= 0) scale = 0.01;
  double c = kaggle_counts[col];
  double floor_c = c < 16 ? c : 16;
  double v = ceil(c * scale);
  if (v < floor_c) v = floor_c;
  if (v > 4294967295.0) v = 4294967295.0;
  return (uint32_t)v;
}

double dg_dense_missing_rate(int col) {
  return col >= 0 && col < DG_NUM_DENSE ? dense_miss[col] : 0;
}

double dg_cat_missing_rate(int col) { return col >= 0 && col < DG_NUM_CAT ? cat_miss[col] : 0; }

/* ---------------------------------------------------------------- samplers */

static double helper1(double x) {
  return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}
static double helper2(double x) {
  return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}
static double ri_hint(const zipf_ri *z, double x) {
  double lx = log(x);
  return helper2((1 - z->s) * lx) * lx;
}
static double ri_h(const zipf_ri *z, double x) { return exp(-z->s * log(x)); }
static double ri_hinv(const zipf_ri *z, double x) {
  double t = x * (1 - z->s);
  if (t < -1) t = -1;
  return exp(helper1(t) * x);
}
static void ri_init(zipf_ri *z, double s, uint32_t n) {
  z->s = s;
  z->n = n;
  z->hx1 = ri_hint(z, 1.5) - 1;
  z->hn = ri_hint(z, n + 0.5);
  z->sv = 2 - ri_hinv(z, ri_hint(z, 2.5) - ri_h(z, 2));
}
static uint32_t ri_sample(const zipf_ri *z, sr_rng *r) {
  for (;;) {
    double u = z->hn + sr_rng_uniform(r) * (z->hx1 - z->hn);
    double x = ri_hinv(z, u);
    double k = floor(x + 0.5);
    if (k < 1) k = 1;
    else if (k > z->n) k = z->n;
    if (k - x <= z->sv || u >= ri_hint(z, k + 0.5) - ri_h(z, k)) return (uint32_t)k - 1;
  }
}

/* Vose's alias table over weights w[0..n) (w is overwritten). Returns a new
 * table (caller frees) or NULL when out of memory. */
static alias_ent *alias_table(double *w, uint32_t n) {
  alias_ent *t = malloc(sizeof(alias_ent) * n);
  uint32_t *small = malloc(sizeof(uint32_t) * n), *large = malloc(sizeof(uint32_t) * n);
  if (!t || !small || !large) {
    free(t), free(small), free(large);
    return NULL;
  }
  double sum = 0;
  for (uint32_t r = 0; r < n; r++) sum += w[r];
  uint32_t ns = 0, nl = 0;
  for (uint32_t r = 0; r < n; r++) {
    w[r] *= n / sum;
    if (w[r] < 1) small[ns++] = r;
    else large[nl++] = r;
  }
  while (ns && nl) {
    uint32_t a = small[--ns], l = large[nl - 1];
    t[a].thresh = (uint32_t)(w[a] * 4294967296.0);
    t[a].alias = l;
    w[l] -= 1 - w[a];
    if (w[l] < 1) {
      nl--;
      small[ns++] = l;
    }
  }
  while (nl) {
    uint32_t l = large[--nl];
    t[l].thresh = UINT32_MAX, t[l].alias = l;
  }
  while (ns) {
    uint32_t a = small[--ns];
    t[a].thresh = UINT32_MAX, t[a].alias = a;
  }
  free(small), free(large);
  return t;
}

/* Alias sampling of P(r) ~ 1/(r+1)^s, r < card, in two levels so that draws
 * stay in cache: a head table over ranks < DG_ALIAS_HEAD plus one "tail"
 * outcome carrying the rest of the mass, and a tail table over the other
 * ranks, read only when the tail outcome comes up (a quarter of the draws
 * for a 100k column at s = 1.1). The distribution is exact. */
static int alias_build(catcol *c, double s) {
  uint32_t n = c->card;
  uint32_t nh = n > DG_ALIAS_HEAD ? DG_ALIAS_HEAD : n;
  double *w = malloc(sizeof(double) * (n + 1));
  if (!w) return SR_ENOMEM;
  double tail = 0;
  for (uint32_t r = nh; r < n; r++) tail += pow(r + 1.0, -s);
  for (uint32_t r = 0; r < nh; r++) w[r] = pow(r + 1.0, -s);
  w[nh] = tail;
  c->nhead = nh;
  c->alias = alias_table(w, nh + (n > nh));
  if (c->alias && n > nh) {
    for (uint32_t r = nh; r < n; r++) w[r - nh] = pow(r + 1.0, -s);
    c->tail = alias_table(w, n - nh);
  }
  free(w);
  return !c->alias || (n > nh && !c->tail) ? SR_ENOMEM : 0;
}

static inline uint32_t below32(uint32_t bits, uint32_t n) {
  return (uint32_t)(((uint64_t)bits * n) >> 32);
}

static inline uint32_t alias_draw(const alias_ent *t, uint32_t n, sr_rng *r) {
  uint32_t i = below32(sr_rng_u32(r), n);
  uint32_t coin = sr_rng_u32(r);
  alias_ent e = t[i];
  uint32_t keep = (uint32_t)0 - (uint32_t)(coin < e.thresh); /* branch-free select */
  return (i & keep) | (e.alias & ~keep);
}

static inline uint32_t cat_sample(const dg_generator *g, const catcol *c, sr_rng *r) {
  if (g->cfg.uniform) return below32(sr_rng_u32(r), c->card);
  if (c->alias) {
    uint32_t k = alias_draw(c->alias, c->nhead + (c->tail != NULL), r);
    return k < c->nhead ? k : c->nhead + alias_draw(c->tail, c->card - c->nhead, r);
  }
  return ri_sample(&c->ri, r);
}

/* Bijective 32-bit mix of a rank under a column's keys: the id a value is
 * written as. */
static inline uint32_t hex_id(const catcol *c, uint32_t rank) {
  uint32_t x = rank + c->hex_k0;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x ^ c->hex_k1;
}

/* The written id of a rank. Readers take 00000000 for "missing", so the one
 * rank that would map there takes the image of UINT32_MAX - 1 instead, which
 * no rank has (cardinalities stay far below 2^32): still one id per rank. */
static inline uint32_t cat_id(const catcol *c, uint32_t rank) {
  uint32_t x = hex_id(c, rank);
  return x ? x : hex_id(c, UINT32_MAX - 1);
}

/* --------------------------------------------------------------- teacher */

static double normal_from(uint32_t a, uint32_t b) {
  double u1 = ((double)a + 1.0) * (1.0 / 4294967296.0); /* (0, 1] */
  double u2 = (double)b * (1.0 / 4294967296.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* The teacher's parameters of value id of column col drawn at Zipf rank
 * rank: drawn from (col, id), shrunk by the rank (id == rank without drift). */
static void vparam_of(const dg_generator *g, int col, uint32_t id, uint32_t rank, vparam *v) {
  sr_philox_out o = sr_philox(g->val_key, (uint64_t)col, id);
  double shrink = rank == DG_MISSING_RANK ? 1.0 : 1.0 / (1.0 + rank / DG_SHRINK_RANK);
  v->b = (float)(g->cat[col].w * normal_from(o.v[0], o.v[1]) * shrink);
  uint32_t bits[DG_FM_DIM] = {o.v[2] & 0xffff, o.v[2] >> 16, o.v[3] & 0xffff, o.v[3] >> 16};
  for (int k = 0; k < DG_FM_DIM; k++)
    v->e[k] = (float)(DG_TEACHER_FM * shrink * 1.7320508075688772 *
                      ((bits[k] + 0.5) * (2.0 / 65536.0) - 1.0));
}

static void vparam_compute(const dg_generator *g, int col, uint32_t rank, vparam *v) {
  vparam_of(g, col, rank, rank, v);
}

/* Drift (dg_config.drift): at row index the values of column c have slid by
 * this many ids: rank r is written as the value id r + off, so ids below off
 * no longer appear and ids past the column's first ones come in. */
static inline uint32_t drift_off(const dg_generator *g, const catcol *c, uint64_t index) {
  if (!(g->cfg.drift > 0)) return 0;
  return (uint32_t)((double)c->card * g->cfg.drift * ((double)index / (double)g->cfg.rows));
}

static inline void vparam_get(const dg_generator *g, int col, uint32_t rank, vparam *v) {
  const catcol *c = &g->cat[col];
  if (rank == DG_MISSING_RANK) *v = c->missing;
  else if (rank < DG_VCACHE) *v = c->cache[rank];
  else vparam_compute(g, col, rank, v);
}

/* The teacher's cross triples (0-based columns): C5*C6*C8, C9*C14*C17,
 * C20*C22*C23, C25*C1*C2, C6*C14*C23, C8*C17*C25, C1*C9*C20, C2*C13*C19,
 * columns of a few dozen to a few thousand values, whose heads a model sees
 * often enough to learn a three-way interaction from. */
static const int cross_triples[DG_CROSS_N][3] = {{4, 5, 7},  {8, 13, 16}, {19, 21, 22}, {24, 0, 1},
                                                 {5, 13, 22}, {7, 16, 24}, {0, 8, 19},  {1, 12, 18}};

/* sum over the triples (a, b, c) of sum_d e_a[d] e_b[d] e_c[d], in units of
 * the FM scale (so the raw value is of order 1 before calibration). */
static double cross_raw(const float ecol[DG_NUM_CAT][DG_FM_DIM]) {
  const double u = 1.0 / DG_TEACHER_FM;
  double x = 0;
  for (int t = 0; t < DG_CROSS_N; t++) {
    const float *a = ecol[cross_triples[t][0]], *b = ecol[cross_triples[t][1]],
                *c = ecol[cross_triples[t][2]];
    for (int d = 0; d < DG_FM_DIM; d++) x += (a[d] * u) * (b[d] * u) * (c[d] * u);
  }
  return x;
}

/* Features and logit parts of row `index` under stream key `key`. */
static void row_features(const dg_generator *g, uint64_t key, uint64_t index, dg_row *row) {
  sr_rng r;
  sr_rng_init(&r, key, index);
  row->index = index;
  row->strip = g->cfg.strip_trailing > 0 && sr_rng_uniform(&r) < g->cfg.strip_trailing;

  double dense = 0;
  for (int i = 0; i < DG_NUM_DENSE; i++) {
    double u = sr_rng_uniform(&r);
    if (u < dense_miss[i]) {
      row->dense_missing[i] = 1;
      row->dense[i] = 0;
      dense += g->dmiss[i];
      continue;
    }
    row->dense_missing[i] = 0;
    int64_t v;
    if (i == 1 && u > 0.952) {
      /* I2's negatives: -1 about 4%, -2 0.6%, -3 0.2% */
      v = u > 0.998 ? -3 : u > 0.992 ? -2 : -1;
    } else {
      double z = sr_rng_normal(&r);
      double e = exp(dense_mu[i] + dense_sigma[i] * z);
      v = e > 1e9 ? 1000000000 : (int64_t)e - 1;
      if (v < 0) v = 0;
    }
    row->dense[i] = v;
    dense += g->dw[i] * (log1p(v > 0 ? (double)v : 0.0) - dense_mu[i]);
  }

  double gmiss[3] = {0, sr_rng_uniform(&r), sr_rng_uniform(&r)};
  double cat = 0, esum[DG_FM_DIM] = {0}, esq = 0;
  float ecol[DG_NUM_CAT][DG_FM_DIM]; /* each column's bag vector, for the cross terms */
  int hot = g->cfg.multi_hot > 1 ? g->cfg.multi_hot : 1;
  const int exact = g->cfg.bag_sizes[0] > 0;
  for (int j = 0; j < DG_NUM_CAT; j++) {
    const catcol *c = &g->cat[j];
    int grp = cat_miss_group[j];
    double u = grp ? gmiss[grp] : sr_rng_uniform(&r);
    vparam v;
    if (!exact && u < cat_miss[j]) {
      row->ncat[j] = 0;
      vparam_get(g, j, DG_MISSING_RANK, &v);
    } else {
      int k = exact ? g->cfg.bag_sizes[j]
                    : hot > 1 ? 1 + (int)below32(sr_rng_u32(&r), (uint32_t)hot) : 1;
      row->ncat[j] = k;
      double b = 0, e[DG_FM_DIM] = {0};
      const uint32_t off = drift_off(g, c, index);
      for (int t = 0; t < k; t++) {
        uint32_t rank = cat_sample(g, c, &r);
        row->cat_rank[j][t] = rank;
        row->cat_hex[j][t] = cat_id(c, rank + off);
        if (off) vparam_of(g, j, rank + off, rank, &v); /* the teacher follows the value */
        else vparam_get(g, j, rank, &v);
        b += v.b;
        for (int d = 0; d < DG_FM_DIM; d++) e[d] += v.e[d];
      }
      /* a bag's parameters are the mean of its values' */
      v.b = (float)(b / k);
      for (int d = 0; d < DG_FM_DIM; d++) v.e[d] = (float)(e[d] / k);
    }
    cat += v.b;
    for (int d = 0; d < DG_FM_DIM; d++) {
      esum[d] += v.e[d];
      esq += (double)v.e[d] * v.e[d];
      ecol[j][d] = v.e[d];
    }
  }
  double fm = -esq;
  for (int d = 0; d < DG_FM_DIM; d++) fm += esum[d] * esum[d];
  fm *= 0.5;
  row->logit_dense = dense;
  row->logit_cat_fm = fm;
  row->logit_cat = cat + fm;
  row->logit_cross = g->cross_scale != 0 ? g->cross_scale * cross_raw(ecol) : 0;
}

static float prob_of(double logit) {
  float p = (float)(1.0 / (1.0 + exp(-logit)));
  const float lo = 1.0f / 16777216.0f;
  if (p < lo) p = lo;
  if (p > 1.0f - lo) p = 1.0f - lo;
  return p;
}

void dg_generator_row(const dg_generator *g, uint64_t index, dg_row *row) {
  row_features(g, g->row_key, index, row);
  row->logit_bias = g->bias;
  row->logit = g->bias + row->logit_dense + row->logit_cat + row->logit_cross;
  row->prob = prob_of(row->logit);
  sr_philox_out o = sr_philox(g->label_key, index, 0);
  row->label = sr_u01d(o.v[0], o.v[1]) < (double)row->prob;
}

/* Mean and variance of x[0..n). */
static void mean_var(const double *x, int n, double *mean, double *var) {
  double s = 0, ss = 0;
  for (int i = 0; i < n; i++) s += x[i], ss += x[i] * x[i];
  *mean = s / n;
  *var = ss / n - *mean * *mean;
}

/* With cross terms, the scale c that gives the cross part the standard
 * deviation cfg.cross_terms on the pilot rows, then solve
 * mean(sigmoid(bias + l_i)) = target by bisection on the pilot sample
 * (drawn from its own stream); also records the variance decomposition. */
static int calibrate(dg_generator *g) {
  double *l = malloc(sizeof(double) * DG_PILOT_ROWS * 4);
  if (!l) return SR_ENOMEM;
  double *ld = l + DG_PILOT_ROWS, *lc = ld + DG_PILOT_ROWS, *lx = lc + DG_PILOT_ROWS;
  dg_row *row = malloc(sizeof *row);
  if (!row) {
    free(l);
    return SR_ENOMEM;
  }
  g->cross_scale = g->cfg.cross_terms > 0 ? 1.0 : 0.0; /* raw values first */
  for (int i = 0; i < DG_PILOT_ROWS; i++) {
    row_features(g, g->pilot_key, (uint64_t)i, row);
    ld[i] = row->logit_dense, lc[i] = row->logit_cat, lx[i] = row->logit_cross;
  }
  free(row);
  double m, var_raw;
  mean_var(lx, DG_PILOT_ROWS, &m, &var_raw);
  if (g->cross_scale != 0) g->cross_scale = var_raw > 0 ? g->cfg.cross_terms / sqrt(var_raw) : 0;
  for (int i = 0; i < DG_PILOT_ROWS; i++) {
    lx[i] *= g->cross_scale;
    l[i] = ld[i] + lc[i] + lx[i];
  }
  const double n = DG_PILOT_ROWS;
  mean_var(ld, DG_PILOT_ROWS, &m, &g->pilot_var_dense);
  mean_var(lc, DG_PILOT_ROWS, &m, &g->pilot_var_cat);
  mean_var(lx, DG_PILOT_ROWS, &m, &g->pilot_var_cross);
  mean_var(l, DG_PILOT_ROWS, &m, &g->pilot_var_total);
  double lo = -30, hi = 30;
  for (int it = 0; it < 60; it++) {
    double mid = 0.5 * (lo + hi), p = 0;
    for (int i = 0; i < DG_PILOT_ROWS; i++) p += 1.0 / (1.0 + exp(-(mid + l[i])));
    if (p / n < DG_TARGET_RATE) lo = mid;
    else hi = mid;
  }
  g->bias = 0.5 * (lo + hi);
  free(l);
  return 0;
}

/* ------------------------------------------------------------ life cycle */

/* What is wrong with cfg's bag sizes (a static string), NULL when nothing. */
static const char *bag_sizes_bad(const dg_config *cfg) {
  if (cfg->bag_sizes[0] == 0) {
    for (int j = 1; j < DG_NUM_CAT; j++)
      if (cfg->bag_sizes[j]) return "bag_sizes: C1's size is 0 (every size in [1, 128], or all 0)";
    return NULL;
  }
  for (int j = 0; j < DG_NUM_CAT; j++)
    if (cfg->bag_sizes[j] < 1 || cfg->bag_sizes[j] > DG_MAX_HOT)
      return "bag_sizes: every size must be in [1, 128]";
  if (cfg->multi_hot > 1) return "bag_sizes and multi_hot > 1 exclude each other";
  return NULL;
}

int dg_bag_sizes_parse(const char *text, int *sizes, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (text && strcmp(text, "mlperf") == 0) text = DG_MLPERF_BAG_SIZES;
  if (!text || !*text) {
    if (err) sr_fmt(err, errlen, "an empty list, 26 sizes expected (C1..C26)");
    return SR_EINVAL;
  }
  int n = 1;
  for (const char *p = text; *p; p++) n += *p == ',';
  if (n != DG_NUM_CAT) {
    if (err) sr_fmt(err, errlen, "%d sizes, 26 expected (C1..C26)", n);
    return SR_EINVAL;
  }
  const char *p = text;
  for (int j = 0; j < DG_NUM_CAT; j++) {
    const char *end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    long long v;
    int rc = sr_num_int(p, (size_t)(end - p), &v);
    if (rc == SR_EINVAL) {
      if (err) sr_fmt(err, errlen, "size %d (C%d) is not an integer", j + 1, j + 1);
      return SR_EINVAL;
    }
    if (rc) { /* beyond a long long */
      if (err) sr_fmt(err, errlen, "size %d (C%d) '%.*s' is out of range [1, %d]", j + 1, j + 1,
                      (int)(end - p), p, DG_MAX_HOT);
      return SR_EINVAL;
    }
    if (v < 1 || v > DG_MAX_HOT) {
      if (err) sr_fmt(err, errlen, "size %d (C%d) is %lld, must be in [1, %d]", j + 1, j + 1, v,
                      DG_MAX_HOT);
      return SR_EINVAL;
    }
    sizes[j] = (int)v;
    p = *end ? end + 1 : end;
  }
  return 0;
}

void dg_generator_destroy(dg_generator *g) {
  if (!g) return;
  for (int j = 0; j < DG_NUM_CAT; j++) {
    free(g->cat[j].alias);
    free(g->cat[j].tail);
    free(g->cat[j].cache);
  }
  free(g);
}

int dg_generator_create(const dg_config *cfg_in, dg_generator **out, char *errbuf,
                        size_t errlen) {
  if (errbuf && errlen) errbuf[0] = 0;
  if (!cfg_in || !out) return SR_EINVAL;
  dg_config cfg = *cfg_in;
  if (cfg.scale == 0) cfg.scale = 0.01;
  if (cfg.zipf_s == 0) cfg.zipf_s = 1.1;
  if (cfg.multi_hot == 0) cfg.multi_hot = 1;
  if (cfg.auc_exact_max == 0) cfg.auc_exact_max = 1ull << 25;
  const char *bad = NULL;
  if (!(cfg.scale > 0 && cfg.scale <= 1)) bad = "scale must be in (0, 1]";
  else if (!(cfg.test_fraction >= 0 && cfg.test_fraction <= 1)) bad = "test_fraction must be in [0, 1]";
  else if (!(cfg.zipf_s > 1.0 && cfg.zipf_s <= 3.0)) bad = "zipf_s must be in (1, 3]";
  else if (cfg.multi_hot < 1 || cfg.multi_hot > DG_MAX_HOT) bad = "multi_hot must be in [1, 128]";
  else if (!(cfg.cross_terms >= 0 && cfg.cross_terms <= DG_CROSS_MAX)) bad = "cross_terms must be in [0, 8]";
  else if (!(cfg.drift >= 0 && cfg.drift <= DG_DRIFT_MAX)) bad = "drift must be in [0, 64]";
  else if ((bad = bag_sizes_bad(&cfg)) != NULL) {}
  else if (!(cfg.strip_trailing >= 0 && cfg.strip_trailing <= 1)) bad = "strip_trailing must be in [0, 1]";
  else if (cfg.rows < 1) bad = "rows must be >= 1";
  if (bad) {
    if (errbuf) sr_fmt(errbuf, errlen, "datagen: %s", bad);
    return SR_EINVAL;
  }
  dg_generator *g = calloc(1, sizeof *g);
  if (!g) return SR_ENOMEM;
  g->cfg = cfg;
  uint64_t base = sr_mix64(cfg.seed ^ 0x5348415244524543ull); /* "SHARDREC" */
  const uint64_t rows = cfg.row_seed_set ? sr_mix64(cfg.row_seed ^ 0x5348415244524543ull) : base;
  g->row_key = sr_mix64(rows + 1);
  g->pilot_key = sr_mix64(base + 2);
  g->label_key = sr_mix64(rows + 3);
  g->val_key = sr_mix64(base + 4);

  sr_rng r;
  sr_rng_init(&r, sr_mix64(base + 5), 0);
  /* dense weights: random directions, total std about DG_TEACHER_DENSE */
  double a[DG_NUM_DENSE], na = 0;
  for (int i = 0; i < DG_NUM_DENSE; i++) {
    a[i] = sr_rng_normal(&r);
    na += a[i] * a[i];
  }
  for (int i = 0; i < DG_NUM_DENSE; i++) {
    g->dw[i] = DG_TEACHER_DENSE * a[i] / sqrt(na) / dense_sigma[i];
    g->dmiss[i] = 0.3 * DG_TEACHER_DENSE * sr_rng_normal(&r) / sqrt(DG_NUM_DENSE);
  }
  int rc = 0;
  for (int j = 0; j < DG_NUM_CAT && !rc; j++) {
    catcol *c = &g->cat[j];
    c->card = dg_cardinality(j, cfg.scale);
    c->hex_k0 = sr_rng_u32(&r);
    c->hex_k1 = sr_rng_u32(&r);
    c->w = DG_TEACHER_CAT * (0.5 + sr_rng_uniform(&r)); /* some columns matter more */
    if (!cfg.uniform) {
      if (c->card <= DG_ALIAS_MAX) rc = alias_build(c, cfg.zipf_s);
      else ri_init(&c->ri, cfg.zipf_s, c->card);
    }
    uint32_t nc = c->card < DG_VCACHE ? c->card : DG_VCACHE;
    if (!rc && !(c->cache = malloc(sizeof(vparam) * nc))) rc = SR_ENOMEM;
    for (uint32_t v = 0; !rc && v < nc; v++) vparam_compute(g, j, v, &c->cache[v]);
    if (!rc) vparam_compute(g, j, DG_MISSING_RANK, &c->missing);
  }
  if (!rc) rc = calibrate(g);
  if (rc) {
    dg_generator_destroy(g);
    return rc;
  }
  *out = g;
  return 0;
}

const dg_config *dg_generator_config(const dg_generator *g) { return &g->cfg; }
double dg_generator_bias(const dg_generator *g) { return g->bias; }

/* ------------------------------------------------------------ formatting */

static const char hexd[16] = "0123456789abcdef";

static inline char *put_i64(char *p, int64_t v) {
  char tmp[24];
  int n = 0;
  uint64_t u;
  if (v < 0) {
    *p++ = '-';
    u = (uint64_t)(-(v + 1)) + 1;
  } else {
    u = (uint64_t)v;
  }
  do {
    tmp[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  while (n) *p++ = tmp[--n];
  return p;
}

static inline char *put_hex(char *p, uint32_t x) {
  for (int s = 28; s >= 0; s -= 4) *p++ = hexd[(x >> s) & 15];
  return p;
}

size_t dg_row_format(const dg_row *row, char *buf) {
  char *p = buf;
  *p++ = row->label ? '1' : '0';
  for (int i = 0; i < DG_NUM_DENSE; i++) {
    *p++ = '\t';
    if (!row->dense_missing[i]) p = put_i64(p, row->dense[i]);
  }
  for (int j = 0; j < DG_NUM_CAT; j++) {
    *p++ = '\t';
    for (int t = 0; t < row->ncat[j]; t++) {
      if (t) *p++ = ',';
      p = put_hex(p, row->cat_hex[j][t]);
    }
  }
  if (row->strip)
    while (p[-1] == '\t') p--;
  *p++ = '\n';
  return (size_t)(p - buf);
}

/* ------------------------------------------------------------------ AUC */

/* Streaming oracle figures of one split: exact keys up to `max` rows, then a
 * histogram over the top 20 bits of the probability's float key. */
typedef struct {
  uint64_t *keys;
  size_t n, cap, max;
  uint64_t *hist; /* [2][DG_HIST_BINS] */
  uint64_t rows, pos;
  double ll;
} auc_acc;

static int acc_add(auc_acc *a, float p, int y) {
  a->rows++;
  a->pos += (uint64_t)y;
  a->ll -= y ? log((double)p) : log1p(-(double)p);
  uint64_t key = sr_auc_key(p, y);
  if (!a->hist && a->n == a->max) {
    a->hist = calloc(2 * (size_t)DG_HIST_BINS, sizeof(uint64_t));
    if (!a->hist) return SR_ENOMEM;
    for (size_t i = 0; i < a->n; i++)
      a->hist[(a->keys[i] & 1) * DG_HIST_BINS + ((a->keys[i] >> 1) >> 12)]++;
    free(a->keys);
    a->keys = NULL;
    a->n = a->cap = 0;
  }
  if (a->hist) {
    a->hist[(uint64_t)y * DG_HIST_BINS + ((key >> 1) >> 12)]++;
    return 0;
  }
  if (a->n == a->cap) {
    size_t nc = a->cap ? a->cap * 2 : 65536;
    if (nc > a->max) nc = a->max;
    uint64_t *k = realloc(a->keys, sizeof(uint64_t) * nc);
    if (!k) return SR_ENOMEM;
    a->keys = k;
    a->cap = nc;
  }
  a->keys[a->n++] = key;
  return 0;
}

static int acc_finish(auc_acc *a, dg_split_stats *s) {
  s->rows = a->rows;
  s->positives = a->pos;
  s->logloss = a->rows ? a->ll / (double)a->rows : NAN;
  s->auc_exact = !a->hist;
  if (a->hist) {
    double pos = 0, neg = 0, acc = 0;
    for (uint32_t b = 0; b < DG_HIST_BINS; b++) {
      double ng = (double)a->hist[b], pg = (double)a->hist[DG_HIST_BINS + b];
      acc += pg * (neg + 0.5 * ng);
      pos += pg, neg += ng;
    }
    s->auc = pos > 0 && neg > 0 ? acc / (pos * neg) : NAN;
    return 0;
  }
  return sr_auc_keys(a->keys, a->n, &s->auc);
}

static void acc_free(auc_acc *a) {
  free(a->keys);
  free(a->hist);
  memset(a, 0, sizeof *a);
}

/* ---------------------------------------------------------------- writer */

static cJSON *split_json(const dg_split_stats *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "rows", (double)s->rows);
  cJSON_AddNumberToObject(o, "positives", (double)s->positives);
  cJSON_AddNumberToObject(o, "positive_rate", s->rows ? (double)s->positives / s->rows : 0);
  if (isnan(s->auc)) cJSON_AddNullToObject(o, "oracle_auc");
  else cJSON_AddNumberToObject(o, "oracle_auc", s->auc);
  cJSON_AddNumberToObject(o, "oracle_logloss", s->logloss);
  cJSON_AddBoolToObject(o, "auc_exact", s->auc_exact);
  return o;
}

static int write_summary(const dg_generator *g, sr_outfile *out, const dg_summary *sm) {
  const dg_config *c = &g->cfg;
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", "criteo-kaggle-tsv");
  cJSON_AddNumberToObject(root, "rows", (double)c->rows);
  if (c->seed <= (1ull << 53)) {
    cJSON_AddNumberToObject(root, "seed", (double)c->seed);
  } else { /* not exact as a JSON number: a decimal string */
    char sb[32];
    snprintf(sb, sizeof sb, "%llu", (unsigned long long)c->seed);
    cJSON_AddStringToObject(root, "seed", sb);
  }
  if (c->row_seed_set) {
    char sb[32];
    snprintf(sb, sizeof sb, "%llu", (unsigned long long)c->row_seed);
    cJSON_AddStringToObject(root, "row_seed", sb);
  }
  cJSON_AddNumberToObject(root, "positive_rate",
                          sm->all.rows ? (double)sm->all.positives / sm->all.rows : 0);
  cJSON_AddItemToObject(root, "all", split_json(&sm->all));
  cJSON_AddItemToObject(root, "test", split_json(&sm->test));
  cJSON_AddNumberToObject(root, "test_first_row", (double)(sm->all.rows - sm->test.rows));
  cJSON *o = cJSON_AddObjectToObject(root, "options");
  cJSON_AddNumberToObject(o, "scale", c->scale);
  cJSON_AddNumberToObject(o, "test_fraction", c->test_fraction);
  cJSON_AddNumberToObject(o, "zipf_s", c->zipf_s);
  cJSON_AddBoolToObject(o, "uniform", c->uniform);
  cJSON_AddNumberToObject(o, "multi_hot", c->multi_hot);
  if (c->bag_sizes[0]) {
    cJSON *bs = cJSON_AddArrayToObject(o, "bag_sizes");
    for (int j = 0; j < DG_NUM_CAT; j++) cJSON_AddItemToArray(bs, cJSON_CreateNumber(c->bag_sizes[j]));
  }
  if (c->cross_terms > 0) cJSON_AddNumberToObject(o, "cross_terms", c->cross_terms);
  if (c->drift > 0) cJSON_AddNumberToObject(o, "drift", c->drift);
  cJSON_AddNumberToObject(o, "strip_trailing", c->strip_trailing);
  cJSON_AddBoolToObject(o, "gzip", c->gzip);
  cJSON *card = cJSON_AddArrayToObject(root, "cardinalities");
  for (int j = 0; j < DG_NUM_CAT; j++)
    cJSON_AddItemToArray(card, cJSON_CreateNumber(g->cat[j].card));
  cJSON *t = cJSON_AddObjectToObject(root, "teacher");
  cJSON_AddNumberToObject(t, "bias", g->bias);
  cJSON_AddNumberToObject(t, "pilot_var_dense", g->pilot_var_dense);
  cJSON_AddNumberToObject(t, "pilot_var_cat", g->pilot_var_cat);
  if (c->cross_terms > 0) {
    cJSON_AddNumberToObject(t, "cross_scale", g->cross_scale);
    cJSON_AddNumberToObject(t, "pilot_var_cross", g->pilot_var_cross);
  }
  cJSON_AddNumberToObject(t, "pilot_var_total", g->pilot_var_total);
  cJSON_AddNumberToObject(t, "cat_variance_share",
                          g->pilot_var_total > 0 ? g->pilot_var_cat / g->pilot_var_total : 0);
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  if (!text) return SR_ENOMEM;
  int rc = sr_out_write(out, text, strlen(text));
  if (!rc) rc = sr_out_write(out, "\n", 1);
  free(text);
  return rc;
}

#define OUT_CHUNK (1u << 20)

enum { OUT_TSV, OUT_PROBS, OUT_SUMMARY, OUT_N };

/* The three outputs of path, each under a temporary name beside its final
 * one (common/outfile.h), and over the TSV's descriptor the gzip stream
 * when c->gzip. 0 or SR_E* (err); what was opened is in o for the caller
 * to abort. */
static int outs_open(const dg_config *c, const char *path, sr_outfile *o[OUT_N], gzFile *gz,
                     char *err, size_t errlen) {
  static const char *const sfx[OUT_N] = {"", DG_PROBS_SUFFIX, DG_SUMMARY_SUFFIX};
  for (int k = 0; k < OUT_N; k++) {
    char p[SR_PATH_MAX];
    int rc = sr_path_err(p, sizeof p, err, errlen, "%s%s", path, sfx[k]);
    if (!rc) rc = sr_out_open(p, &o[k], err, errlen);
    if (rc) return rc;
  }
  if (!c->gzip) return 0;
  int fd = dup(sr_out_fd(o[OUT_TSV])); /* gzclose closes it; the outfile keeps its own */
  if (fd < 0 || !(*gz = gzdopen(fd, "wb1"))) {
    if (fd >= 0) close(fd);
    sr_fmt(err, errlen, "%s: cannot start a gzip stream: %s", path, strerror(errno));
    return SR_EIO;
  }
  gzbuffer(*gz, 1u << 18);
  return 0;
}

/* Write buf[n] to the TSV o, through zlib when gz is set. 0 or SR_EIO
 * (recorded in o). */
static int out_write(sr_outfile *o, gzFile gz, const char *buf, size_t n) {
  if (!gz) return sr_out_write(o, buf, n);
  if (!n || gzwrite(gz, buf, (unsigned)n) == (int)n) return 0;
  int zerr;
  gzerror(gz, &zerr);
  return sr_out_fail(o, "cannot write (gzip)", zerr == Z_ERRNO ? errno : EIO);
}

/* Generate the rows into the TSV and .probs outputs (o) and the oracle's
 * accumulators; sm->bytes gets the TSV's bytes. 0 or SR_E*. */
static int write_rows(dg_generator *g, sr_outfile *o[OUT_N], gzFile gz, auc_acc *all,
                      auc_acc *test, dg_summary *sm) {
  const dg_config *c = &g->cfg;
  uint64_t ntest = (uint64_t)llround((double)c->rows * c->test_fraction);
  if (ntest > c->rows) ntest = c->rows;
  uint64_t test_first = c->rows - ntest;
  char *buf = malloc(OUT_CHUNK + DG_LINE_MAX), *pbuf = malloc(OUT_CHUNK + 64);
  dg_row *row = malloc(sizeof *row);
  int rc = buf && pbuf && row ? 0 : SR_ENOMEM;
  size_t blen = 0, plen = 0;
  sr_progress pg = {0}; /* off until the loop */
  if (!rc) sr_progress_begin(&pg, c->progress, "datagen", "lines", c->rows);
  for (uint64_t i = 0; !rc && i < c->rows; i++) {
    if (!(i & 0xfff)) sr_progress_set(&pg, i, 0);
    dg_generator_row(g, i, row);
    blen += dg_row_format(row, buf + blen);
    plen += (size_t)snprintf(pbuf + plen, 64, "%.9g\n", (double)row->prob);
    if ((rc = acc_add(all, row->prob, row->label)) ||
        (i >= test_first && (rc = acc_add(test, row->prob, row->label))))
      break;
    if (blen >= OUT_CHUNK) {
      rc = out_write(o[OUT_TSV], gz, buf, blen);
      sm->bytes += blen;
      blen = 0;
    }
    if (!rc && plen >= OUT_CHUNK) rc = sr_out_write(o[OUT_PROBS], pbuf, plen), plen = 0;
  }
  if (!rc) {
    sr_progress_set(&pg, c->rows, 0);
    sr_progress_end(&pg);
    rc = out_write(o[OUT_TSV], gz, buf, blen);
    sm->bytes += blen;
  }
  if (!rc) rc = sr_out_write(o[OUT_PROBS], pbuf, plen);
  if (rc && pg.on && pg.done) fputc('\n', stderr); /* end the progress line */
  free(buf), free(pbuf), free(row);
  return rc;
}

int dg_generator_write(dg_generator *g, const char *path, dg_summary *summary, char *errbuf,
                       size_t errlen) {
  if (errbuf && errlen) errbuf[0] = 0;
  double t0 = sr_now();
  sr_outfile *o[OUT_N] = {NULL, NULL, NULL};
  gzFile gz = NULL;
  auc_acc all = {0}, test = {0};
  all.max = test.max = (size_t)g->cfg.auc_exact_max;
  dg_summary sm;
  memset(&sm, 0, sizeof sm);
  int rc = outs_open(&g->cfg, path, o, &gz, errbuf, errlen);
  if (!rc) rc = write_rows(g, o, gz, &all, &test, &sm);
  if (gz) {
    int zrc = gzclose(gz); /* the stream's tail */
    if (!rc && zrc != Z_OK) rc = sr_out_fail(o[OUT_TSV], "cannot write (gzip)", zrc == Z_ERRNO ? errno : EIO);
  }
  if (!rc && !(rc = acc_finish(&all, &sm.all)) && !(rc = acc_finish(&test, &sm.test))) {
    sm.seconds = sr_now() - t0;
    rc = write_summary(g, o[OUT_SUMMARY], &sm);
  }
  for (int k = 0; rc == SR_EIO && k < OUT_N; k++) /* the write that failed names its file */
    if (o[k] && *sr_out_errmsg(o[k])) sr_fmt(errbuf, errlen, "%s", sr_out_errmsg(o[k]));
  if (rc && rc != SR_EIO && errbuf && !errbuf[0]) sr_fmt(errbuf, errlen, "%s", sr_strerror(rc));
  if (!rc) rc = sr_out_commit_all(o, OUT_N, errbuf, errlen); /* all three whole, then renamed */
  for (int k = 0; k < OUT_N; k++) sr_out_abort(o[k]);
  acc_free(&all);
  acc_free(&test);
  if (!rc && summary) *summary = sm;
  return rc;
}
