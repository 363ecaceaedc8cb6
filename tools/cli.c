#include "tools/cli.h"

#include "dense/cuda_hooks.h"
#include "dense/pool.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi,
            long long *out) {
  char *end = NULL;
  errno = 0;
  long long v = s ? strtoll(s, &end, 10) : 0;
  if (!s || !*s || *end || errno) {
    fprintf(stderr, "shardrec %s: %s: '%s' is not an integer\n", cmd, flag, s ? s : "");
    return -1;
  }
  if (v < lo || v > hi) {
    fprintf(stderr, "shardrec %s: %s: %lld is out of range [%lld, %lld]\n", cmd, flag, v, lo,
            hi);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_u64(const char *cmd, const char *flag, const char *s, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  if (!s || !*s || *s == '-') {
    fprintf(stderr, "shardrec %s: %s: '%s' is not a non-negative integer\n", cmd, flag,
            s ? s : "");
    return -1;
  }
  unsigned long long v = strtoull(s, &end, 10);
  if (*end || errno) {
    fprintf(stderr, "shardrec %s: %s: '%s' is not a non-negative integer\n", cmd, flag, s);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_double(const char *cmd, const char *flag, const char *s, double lo, double hi,
               double *out) {
  char *end = NULL;
  errno = 0;
  double v = s ? strtod(s, &end) : 0;
  if (!s || !*s || *end || errno || !isfinite(v)) {
    fprintf(stderr, "shardrec %s: %s: '%s' is not a number\n", cmd, flag, s ? s : "");
    return -1;
  }
  if (v < lo || v > hi) {
    fprintf(stderr, "shardrec %s: %s: %g is out of range [%g, %g]\n", cmd, flag, v, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
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
    char *end = NULL;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 1 || v > (1L << 24) || (*end && *end != sep)) {
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
  memset(cfg, 0, sizeof *cfg);
  if (cli_int_list(cmd, "--arch-mlp-bot", bot, '-', cfg->bot, DENSE_MAX_LAYERS, &cfg->n_bot))
    return -1;
  if (cli_int_list(cmd, "--arch-mlp-top", top, '-', cfg->top, DENSE_MAX_LAYERS, &cfg->n_top))
    return -1;
  if (!strcmp(op, "dot"))
    cfg->interaction = DENSE_INTERACT_DOT;
  else if (!strcmp(op, "cat"))
    cfg->interaction = DENSE_INTERACT_CAT;
  else {
    fprintf(stderr, "shardrec %s: --arch-interaction-op: '%s' is not dot or cat\n", cmd, op);
    return -1;
  }
  cfg->interaction_itself = itself;
  cfg->n_dense = cfg->bot[0];
  cfg->n_sparse = n_sparse;
  cfg->emb_dim = dim;
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
  if (cli_int(cmd, "--dense-threads", s, 1, DENSE_POOL_MAX_THREADS, &v)) return -1;
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
