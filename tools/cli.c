#include "tools/cli.h"

#include "dense/device.h"
#include "dense/pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/num.h"
#include "common/outfile.h"
#include "common/status.h"
#include "embedding/plan.h"
#include "embedding/shard.h"
#include "rpc/client.h"

/* s as flag's integer in [lo, hi] into *out; unit (NULL: none) follows
 * the range in the message. 0, or -1 (printed): "'S' is not an integer",
 * or "S is out of range [LO, HI] UNIT" for one beyond the range or beyond
 * every integer type. */
static int int_in(const char *cmd, const char *flag, const char *s, long long lo, long long hi,
                  const char *unit, long long *out) {
  long long v = 0;
  const int rc = s ? sr_num_int(s, strlen(s), &v) : SR_EINVAL;
  if (rc == SR_EINVAL) {
    fprintf(stderr, "shardrec %s: %s: '%s' is not an integer\n", cmd, flag, s ? s : "");
    return -1;
  }
  if (rc || v < lo || v > hi) {
    fprintf(stderr, "shardrec %s: %s: %s is out of range [%lld, %lld]%s%s\n", cmd, flag, s, lo,
            hi, unit ? " " : "", unit ? unit : "");
    return -1;
  }
  *out = v;
  return 0;
}

int cli_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi,
            long long *out) {
  return int_in(cmd, flag, s, lo, hi, NULL, out);
}

/* One range per flag, for every command that takes it: add a flag here,
 * one line, and parse it with cli_flag / cli_flag_double. */
static const cli_range ranges[] = {
    {"--admit-after", 0, (double)EMB_KEEP_MAX, "samples holding an id (0 and 1: at once)"},
    {"--admit-window", 0, (double)EMB_KEEP_MAX, "steps (0: 1000)"},
    {"--arch-embedding-size", 1, (double)EMB_ROWS_MAX, "rows per table"},
    {"--capacity", 0, (double)EMB_ROWS_MAX, "rows per table (0: no bound)"},
    {"--lfu-half-life", 0, (double)EMB_KEEP_MAX, "steps (0: no decay)"},
    {"--arch-sparse-feature-size", 1, EMB_MAX_DIM, "floats per row"},
    {"--cache-mb", 1, 1 << 20, "MiB"},
    {"--cache-rows", EMB_SHARD_MIN_CACHE_ROWS, 2147483647.0, "rows"},
    {"--dcn-low-rank-dim", 1, DENSE_MAX_CROSS_RANK, "rank of each cross layer"},
    {"--dcn-num-layers", 1, DENSE_MAX_CROSS, "cross layers"},
    {"--dense-threads", 1, DENSE_POOL_MAX_THREADS, "threads"},
    {"--expire-after", 0, (double)EMB_KEEP_MAX, "steps without a lookup (0: never)"},
    {"--frequency-threshold", 0, 4294967295.0, "occurrences"},
    {"--max-ind-range", 0, 1099511627776.0, "rows (0: none)"},
    {"--mini-batch-size", 1, 1 << 20, "samples"},
    {"--num-shards", 1, EMB_MAX_SHARDS, "shards"},
    {"--prefetch-depth", 0, 8, "steps ahead (0: off)"},
    {"--rpc-connections", 1, RPC_CONNECTIONS_MAX, "TCP connections per shard server"},
    {"--rpc-deadline", 0.001, 86400, "seconds"},
    {"--test-fraction", 0, 1, "of the lines"},
    {"--test-freq", -1, 1099511627776.0, "steps (-1, the reference DLRM's default, and 0: at the end only)"},
    {"--test-mini-batch-size", 1, 1 << 20, "samples"},
    {"--threads", 1, 256, "threads"},
};

const cli_range *cli_range_of(const char *flag) {
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
    if (!strcmp(ranges[i].flag, flag)) return &ranges[i];
  return NULL;
}

/* One end of a range: whole numbers in full, others as %g. */
static int end_text(char *buf, size_t n, double v) {
  if (v == floor(v) && fabs(v) < 1e18) return snprintf(buf, n, "%lld", (long long)v);
  return snprintf(buf, n, "%g", v);
}

/* s as flag's number in [lo, hi] (unit: NULL or the range's) into *out.
 * 0, or -1 (printed): "'S' is not a number", or "S is out of range [LO,
 * HI] UNIT" (one beyond a double too). */
static int double_in(const char *cmd, const char *flag, const char *s, double lo, double hi,
                     const char *unit, double *out) {
  double v = 0;
  const int rc = sr_num_double(s, &v);
  if (rc == SR_EINVAL) {
    fprintf(stderr, "shardrec %s: %s: '%s' is not a number\n", cmd, flag, s ? s : "");
    return -1;
  }
  if (rc || v < lo || v > hi) {
    char l[32], h[32];
    end_text(l, sizeof l, lo);
    end_text(h, sizeof h, hi);
    fprintf(stderr, "shardrec %s: %s: %s is out of range [%s, %s]%s%s\n", cmd, flag, s, l, h,
            unit ? " " : "", unit ? unit : "");
    return -1;
  }
  *out = v;
  return 0;
}

/* flag's line of the table, or NULL with the missing line printed. */
static const cli_range *range_or_say(const char *cmd, const char *flag) {
  const cli_range *r = cli_range_of(flag);
  if (!r) fprintf(stderr, "shardrec %s: %s: no range for this flag (tools/cli.c)\n", cmd, flag);
  return r;
}

int cli_flag(const char *cmd, const char *flag, const char *s, long long *out) {
  const cli_range *r = range_or_say(cmd, flag);
  return r ? int_in(cmd, flag, s, (long long)r->lo, (long long)r->hi, r->unit, out) : -1;
}

int cli_keep_flag(const char *cmd, const char *flag, const char *s, emb_keep_cfg *k) {
  if (!strcmp(flag, "--evict")) {
    if (!s || emb_evict_parse(s, &k->evict)) {
      fprintf(stderr, "shardrec %s: --evict: '%s' is not lru or lfu\n", cmd, s ? s : "");
      return -1;
    }
    return 0;
  }
  uint64_t *dst = !strcmp(flag, "--admit-after")    ? &k->admit_after
                  : !strcmp(flag, "--admit-window") ? &k->admit_window
                  : !strcmp(flag, "--expire-after") ? &k->expire_after
                  : !strcmp(flag, "--lfu-half-life") ? &k->half_life
                                                    : &k->capacity;
  return cli_flag_u64(cmd, flag, s, dst);
}

int cli_flag_u64(const char *cmd, const char *flag, const char *s, uint64_t *out) {
  const cli_range *r = range_or_say(cmd, flag);
  long long v;
  if (!r || int_in(cmd, flag, s, r->lo < 0 ? 0 : (long long)r->lo, (long long)r->hi, r->unit, &v))
    return -1;
  *out = (uint64_t)v;
  return 0;
}

int cli_flag_double(const char *cmd, const char *flag, const char *s, double *out) {
  const cli_range *r = range_or_say(cmd, flag);
  return r ? double_in(cmd, flag, s, r->lo, r->hi, r->unit, out) : -1;
}

int cli_u64(const char *cmd, const char *flag, const char *s, uint64_t *out) {
  uint64_t v = 0;
  const int rc = s ? sr_num_u64(s, strlen(s), &v) : SR_EINVAL;
  if (rc == SR_EINVAL) {
    fprintf(stderr, "shardrec %s: %s: '%s' is not an integer\n", cmd, flag, s ? s : "");
    return -1;
  }
  if (rc) {
    fprintf(stderr, "shardrec %s: %s: %s is out of range [0, %llu]\n", cmd, flag, s,
            (unsigned long long)UINT64_MAX);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_double(const char *cmd, const char *flag, const char *s, double lo, double hi,
               double *out) {
  return double_in(cmd, flag, s, lo, hi, NULL, out);
}

int cli_entry_u64(const char *cmd, const char *flag, int k, const char *s, size_t n, uint64_t lo,
                  uint64_t hi, const char *unit, uint64_t *out) {
  uint64_t v = 0;
  const int rc = sr_num_u64(s, n, &v);
  const int len = n > 64 ? 64 : (int)n;
  if (rc == SR_EINVAL) {
    fprintf(stderr, "shardrec %s: %s: entry %d: '%.*s%s' is not an integer\n", cmd, flag, k, len,
            s, n > 64 ? "..." : "");
    return -1;
  }
  if (rc || v < lo || v > hi) {
    fprintf(stderr, "shardrec %s: %s: entry %d: %.*s%s is out of range [%llu, %llu]%s%s\n", cmd,
            flag, k, len, s, n > 64 ? "..." : "", (unsigned long long)lo, (unsigned long long)hi,
            unit ? " " : "", unit ? unit : "");
    return -1;
  }
  *out = v;
  return 0;
}

int cli_u64_list(const char *cmd, const char *flag, const char *s, const char *seps, uint64_t lo,
                 uint64_t hi, const char *unit, uint64_t *out, int max, int *n) {
  *n = 0;
  if (!s || !*s) {
    fprintf(stderr, "shardrec %s: %s: empty list\n", cmd, flag);
    return -1;
  }
  for (const char *p = s;; p++) {
    const size_t len = strcspn(p, seps);
    if (*n == max) {
      fprintf(stderr, "shardrec %s: %s: more than %d entries\n", cmd, flag, max);
      return -1;
    }
    if (cli_entry_u64(cmd, flag, *n + 1, p, len, lo, hi, unit, &out[*n])) return -1;
    ++*n;
    p += len;
    if (!*p) return 0;
  }
}

int cli_int_list(const char *cmd, const char *flag, const char *s, char sep, int *out,
                 int max, int *n) {
  *n = 0;
  const char *p = s;
  if (!p || !*p) {
    fprintf(stderr, "shardrec %s: %s: empty list\n", cmd, flag);
    return -1;
  }
  while (*p) {
    const char *end = strchr(p, sep);
    if (!end) end = p + strlen(p);
    long long v;
    if (sr_num_int(p, (size_t)(end - p), &v) || v < 1 || v > (1L << 24)) {
      fprintf(stderr, "shardrec %s: %s: '%s' is not a list of positive integers joined by '%c'\n",
              cmd, flag, s, sep);
      return -1;
    }
    if (*n >= max) {
      fprintf(stderr, "shardrec %s: %s: more than %d entries\n", cmd, flag, max);
      return -1;
    }
    out[(*n)++] = (int)v;
    p = *end ? end + 1 : end;
    if (*end && !*p) {
      fprintf(stderr, "shardrec %s: %s: '%s' ends with '%c'\n", cmd, flag, s, sep);
      return -1;
    }
  }
  return 0;
}

void cli_bad_option(const char *cmd, int c, const char *arg) {
  if (c == ':')
    fprintf(stderr, "shardrec %s: option %s needs a value (see 'shardrec %s --help')\n", cmd,
            arg ? arg : "", cmd);
  else
    fprintf(stderr, "shardrec %s: unknown option %s (see 'shardrec %s --help')\n", cmd,
            arg ? arg : "", cmd);
}

int cli_isatty_err(void) { return isatty(2); }

int cli_model_arch(const char *cmd, const char *bot, const char *top, const char *op,
                   int itself, int dim, int n_sparse, int max_batch, dense_config *cfg) {
  return cli_model_arch_dcn(cmd, bot, top, op, itself, 0, 0, dim, n_sparse, max_batch, cfg);
}

int cli_dcn_default_rank(int width) {
  long long p = 1;
  while (p * 2 * 8 <= width) p *= 2; /* p <= width / 8 < 2p */
  if (width - p * 8 > p * 2 * 8 - width) p *= 2;
  return p < CLI_DCN_RANK_MAX ? (int)p : CLI_DCN_RANK_MAX;
}

/* --arch-interaction-op dcn's two numbers into cfg (its emb_dim and
 * n_sparse set): given or the defaults; any other op refuses them. 0 or -1
 * (printed). */
static int model_dcn(const char *cmd, int layers, int rank, dense_config *cfg) {
  if (cfg->interaction != DENSE_INTERACT_DCN) {
    if (!layers && !rank) return 0;
    fprintf(stderr, "shardrec %s: --dcn-num-layers and --dcn-low-rank-dim apply to "
            "--arch-interaction-op dcn only\n", cmd);
    return -1;
  }
  cfg->dcn_layers = layers ? layers : CLI_DCN_LAYERS;
  cfg->dcn_rank = rank ? rank : cli_dcn_default_rank((cfg->n_sparse + 1) * cfg->emb_dim);
  return 0;
}

int cli_model_arch_dcn(const char *cmd, const char *bot, const char *top, const char *op,
                       int itself, int dcn_layers, int dcn_rank, int dim, int n_sparse,
                       int max_batch, dense_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  if (cli_int_list(cmd, "--arch-mlp-bot", bot, '-', cfg->bot, DENSE_MAX_LAYERS, &cfg->n_bot))
    return -1;
  if (cli_int_list(cmd, "--arch-mlp-top", top, '-', cfg->top, DENSE_MAX_LAYERS, &cfg->n_top))
    return -1;
  if (!strcmp(op, "dot"))
    cfg->interaction = DENSE_INTERACT_DOT;
  else if (!strcmp(op, "cat"))
    cfg->interaction = DENSE_INTERACT_CAT;
  else if (!strcmp(op, "dcn"))
    cfg->interaction = DENSE_INTERACT_DCN;
  else {
    fprintf(stderr, "shardrec %s: --arch-interaction-op: '%s' is not dot, cat or dcn\n", cmd, op);
    return -1;
  }
  cfg->interaction_itself = itself;
  cfg->n_dense = cfg->bot[0];
  cfg->n_sparse = n_sparse;
  cfg->emb_dim = dim;
  if (model_dcn(cmd, dcn_layers, dcn_rank, cfg)) return -1;
  cfg->max_batch = max_batch;
  char err[512];
  if (dense_config_validate(cfg, err, sizeof err)) {
    fprintf(stderr, "shardrec %s: %s\n", cmd, err);
    return -1;
  }
  return 0;
}

int cli_dense_isa(const char *cmd, const char *name, const dense_backend **out) {
  char err[256];
  dense_isa isa;
  if (dense_isa_parse(name, &isa, err, sizeof err)) {
    fprintf(stderr, "shardrec %s: --dense-isa: %s\n", cmd, err);
    return -1;
  }
  *out = dense_backend_cpu_isa(isa);
  return 0;
}

int cli_dense_threads(const char *cmd, const char *s, int *out) {
  long long v;
  if (cli_flag(cmd, "--dense-threads", s, &v)) return -1;
  *out = (int)v;
  return 0;
}

struct dense_pool *cli_dense_begin(const char *cmd, int threads, const dense_backend *isa) {
  char err[256];
  dense_pool *p = dense_pool_create(threads ? threads : dense_pool_threads_for(1), err, sizeof err);
  if (!p) {
    fprintf(stderr, "shardrec %s: %s\n", cmd, err);
    return NULL;
  }
  dense_backend_set_default(isa);
  dense_pool_set_default(p);
  return p;
}

void cli_dense_end(struct dense_pool *p) {
  dense_pool_set_default(NULL);
  dense_pool_destroy(p);
}

int cli_out_file(const char *cmd, const char *flag, const char *path) {
  char err[1024];
  if (!path || !sr_out_check(path, err, sizeof err)) return 0;
  fprintf(stderr, "shardrec %s: %s: %s\n", cmd, flag, err);
  return 2;
}

int cli_outs_clash(const cli_file *outs, int n_out, const cli_file *ins, int n_in, char *err,
                   size_t errlen) {
  for (int i = 0; i < n_out; i++) {
    if (!outs[i].path) continue;
    for (int k = 0; k < n_in; k++)
      if (ins[k].path && sr_same_file(outs[i].path, ins[k].path)) {
        sr_fmt(err, errlen, "%s %s is the file %s reads (%s): an output never replaces an "
               "input; name another", outs[i].flag, outs[i].path, ins[k].flag, ins[k].path);
        return 1;
      }
    for (int k = 0; k < i; k++)
      if (outs[k].path && sr_same_file(outs[i].path, outs[k].path)) {
        sr_fmt(err, errlen, "%s %s is the file %s writes (%s): each output needs a file of "
               "its own", outs[i].flag, outs[i].path, outs[k].flag, outs[k].path);
        return 1;
      }
  }
  return 0;
}
