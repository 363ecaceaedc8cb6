/* shardrec bench ckpt: bytes written and seconds per checkpoint, a full
 * checkpoint (emb_store_checkpoint) beside an incremental one
 * (emb_store_checkpoint_delta) of the same store at the same step, in one
 * run, through the store API.
 *
 * The plan: 26 tables shaped as datagen's Criteo columns (dg_cardinality at
 * the scale that makes them total about --rows rows), dim --dim, the sparse
 * optimizer --sparse-optimizer (default adagrad: as many state floats as
 * value floats, all of which a checkpoint carries), one shard. The store
 * (--store local: every row in memory; shard: a RocksDB shard store in the
 * work folder, its cache --cache-fraction of the rows) is filled by pushing
 * every row once, then checkpointed whole, which leaves no row changed.
 * Then --rounds times:
 *   pushes     --steps-between steps, each of --batch generated lines'
 *              26 categorical ids (datagen's Zipf ranks at --zipf, each
 *              column's ranks spread over its table by a fixed bijection;
 *              a missing field pushes nothing), deduplicated per table as
 *              the trainer does, pushed with random gradients;
 *   incremental emb_store_checkpoint_delta into a fresh folder: the rows
 *              those steps changed;
 *   full       emb_store_checkpoint into another fresh folder: every row.
 * The incremental checkpoint comes first because either checkpoint clears
 * the store's change set, and both start from a flushed store: the shard
 * store's dirty rows are written back to RocksDB before them (either
 * checkpoint would begin with that write-back; its time is printed on its
 * own). Each is timed by the wall clock around the call
 * and measured by the sum of the sizes of the files it left (what a copy
 * of it elsewhere moves); for a full checkpoint of the shard store (a
 * RocksDB checkpoint: SST files hard linked to the live database) the part
 * of that sum that is new is printed too (files written during the call, or
 * not linked), since the linked files written before it were not written
 * again. Both
 * folders are removed after the round. Printed: per round, then the
 * medians and full / incremental. A store with no incremental op prints
 * "unsupported" for it and the full figures alone. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/rng.h"
#include "common/status.h"
#include "common/sys.h"
#include "datasets/datagen.h"
#include "embedding/optim.h"
#include "embedding/plan.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "tools/cli.h"
#include "tools/cmds.h"

#define CMD "bench ckpt"
#define N_TABLES DG_NUM_CAT
#define MAX_ROUNDS 99
#define SPREAD 2654435761u /* a prime above every table's row count: rank -> row bijection */

typedef struct bc_flags {
  long long rows, dim, steps, batch, rounds;
  double zipf, cache_fraction;
  int shard;
  emb_optim_kind optim;
  const char *dir;
} bc_flags;

/* One run: the flags, the plan, the store, the buffers (all owned). */
typedef struct bc {
  bc_flags f;
  double scale;                 /* datagen's cardinality scale */
  uint64_t rows[N_TABLES], total;
  emb_plan *plan;
  emb_store *s;
  dg_generator *gen;
  dg_row *row;
  uint64_t line;                /* the next generated line */
  int64_t step;
  uint64_t *ids[N_TABLES];      /* [batch] each */
  size_t counts[N_TABLES];
  float *grads[N_TABLES];       /* [max(batch, FILL_CHUNK) * dim] each */
  unsigned char *seen[N_TABLES];/* [rows[t]]: pushed this round */
  uint64_t changed;             /* distinct rows pushed this round */
  sr_rng rng;
  char dir[SR_PATH_MAX];        /* the work folder (made here, removed) */
  char err[1024];
  int no_delta;                 /* the store has no incremental op */
  double full_b[MAX_ROUNDS], full_s[MAX_ROUNDS], full_new[MAX_ROUNDS];
  int linked;                   /* a full checkpoint shared files with the live database */
  double inc_b[MAX_ROUNDS], inc_s[MAX_ROUNDS], chg[MAX_ROUNDS], wb_s[MAX_ROUNDS];
} bc;

#define FILL_CHUNK 65536

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec bench ckpt [--rows N] [--dim D] [--store local|shard] [--steps-between S]\n"
"       [--batch B] [--zipf S] [--rounds R] [--sparse-optimizer NAME] [--cache-fraction F]\n"
"       [--dir DIR]\n"
"\n"
"  --rows N             rows of the 26 tables together, shaped as datagen's columns (default 4000000)\n"
"  --dim D              embedding dim (default 16)\n"
"  --store local|shard  in-memory store, or the RocksDB shard store in the work folder (default local)\n"
"  --steps-between S    training steps pushed between checkpoints (default 50)\n"
"  --batch B            generated lines a step; 26 ids each (default 2048)\n"
"  --zipf S             the ids' Zipf exponent, datagen's skew (default 1.1)\n"
"  --rounds R           checkpoints of each kind (default 5; medians)\n"
"  --sparse-optimizer NAME  sgd | adagrad | rowwise_adagrad (default adagrad)\n"
"  --cache-fraction F   the shard store's cache, a fraction of the rows (default 0.25)\n"
"  --dir DIR            work folder (default $TMPDIR or /tmp; a fresh folder under it, removed)\n"
"\n"
"Fills the store, then each round pushes S steps of Zipf ids and writes an incremental\n"
"checkpoint (the rows changed since the last checkpoint) and a full one (every row):\n"
"bytes written and seconds of each, their medians and full / incremental.\n");
}

enum { O_ROWS = 1000, O_DIM, O_STORE, O_STEPS, O_BATCH, O_ZIPF, O_ROUNDS, O_OPT, O_CACHE, O_DIR,
       O_HELP };
static const struct option long_opts[] = {
    {"rows", required_argument, 0, O_ROWS},       {"dim", required_argument, 0, O_DIM},
    {"store", required_argument, 0, O_STORE},     {"steps-between", required_argument, 0, O_STEPS},
    {"batch", required_argument, 0, O_BATCH},     {"zipf", required_argument, 0, O_ZIPF},
    {"rounds", required_argument, 0, O_ROUNDS},   {"sparse-optimizer", required_argument, 0, O_OPT},
    {"cache-fraction", required_argument, 0, O_CACHE}, {"dir", required_argument, 0, O_DIR},
    {"help", no_argument, 0, O_HELP},             {0, 0, 0, 0}};

/* Parse argv into *f. -1 to go on, or the exit status (0 for --help, 2 for
 * bad usage, the message printed). */
static int parse_flags(int argc, char **argv, bc_flags *f) {
  *f = (bc_flags){.rows = 4000000, .dim = 16, .steps = 50, .batch = 2048, .rounds = 5,
                  .zipf = 1.1, .cache_fraction = 0.25, .optim = EMB_OPT_ADAGRAD};
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case O_ROWS: if (cli_int(CMD, "--rows", optarg, 1000, 1LL << 31, &f->rows)) return 2; break;
      case O_DIM: if (cli_int(CMD, "--dim", optarg, 1, 1024, &f->dim)) return 2; break;
      case O_STEPS: if (cli_int(CMD, "--steps-between", optarg, 1, 1 << 20, &f->steps)) return 2; break;
      case O_BATCH: if (cli_int(CMD, "--batch", optarg, 1, 1 << 16, &f->batch)) return 2; break;
      case O_ROUNDS: if (cli_int(CMD, "--rounds", optarg, 1, MAX_ROUNDS, &f->rounds)) return 2; break;
      case O_ZIPF: if (cli_double(CMD, "--zipf", optarg, 1.0001, 3, &f->zipf)) return 2; break;
      case O_CACHE:
        if (cli_double(CMD, "--cache-fraction", optarg, 0.001, 1, &f->cache_fraction)) return 2;
        break;
      case O_STORE:
        if (strcmp(optarg, "local") && strcmp(optarg, "shard")) {
          fprintf(stderr, "shardrec %s: --store: '%s' is not local or shard\n", CMD, optarg);
          return 2;
        }
        f->shard = !strcmp(optarg, "shard");
        break;
      case O_OPT:
        if (emb_optim_parse(optarg, &f->optim)) {
          fprintf(stderr, "shardrec %s: --sparse-optimizer: '%s' is not sgd, adagrad or "
                  "rowwise_adagrad\n", CMD, optarg);
          return 2;
        }
        break;
      case O_DIR: f->dir = optarg; break;
      case 'h': case O_HELP: usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec %s: unexpected argument '%s'\n", CMD, argv[optind]);
    return 2;
  }
  uint64_t most = 0; /* datagen's columns at scale 1 */
  for (int j = 0; j < N_TABLES; j++) most += dg_cardinality(j, 1.0);
  if ((uint64_t)f->rows > most) {
    fprintf(stderr, "shardrec %s: --rows: %lld is more than datagen's columns hold at scale 1 "
            "(%llu)\n", CMD, f->rows, (unsigned long long)most);
    return 2;
  }
  return -1;
}

/* The table sizes: datagen's cardinalities at the scale (found by halving
 * the interval) whose total is closest to rows from above. */
static void shape_tables(bc *b) {
  double lo = 1e-7, hi = 1;
  for (int it = 0; it < 80; it++) {
    double mid = (lo + hi) / 2, sum = 0;
    for (int j = 0; j < N_TABLES; j++) sum += (double)dg_cardinality(j, mid);
    if (sum >= (double)b->f.rows) hi = mid;
    else lo = mid;
  }
  b->scale = hi;
  b->total = 0;
  for (int j = 0; j < N_TABLES; j++) b->total += b->rows[j] = dg_cardinality(j, hi);
}

/* The plan, the generator, the store and the buffers. 0 or -1 (message in err). */
static int setup(bc *b) {
  shape_tables(b);
  emb_plan_params pp = {.n_tables = N_TABLES, .rows = b->rows, .dim = (int)b->f.dim,
                        .optim = {.kind = b->f.optim, .eps = -1}, .seed = 1, .n_shards = 1};
  dg_config dc;
  dg_config_default(&dc);
  dc.scale = b->scale;
  dc.zipf_s = b->f.zipf;
  if (emb_plan_create(&pp, &b->plan, b->err, sizeof b->err) ||
      dg_generator_create(&dc, &b->gen, b->err, sizeof b->err))
    return -1;
  size_t n = (size_t)(b->f.batch > FILL_CHUNK ? b->f.batch : FILL_CHUNK);
  b->row = malloc(sizeof *b->row);
  int ok = b->row != NULL;
  for (int t = 0; t < N_TABLES && ok; t++) {
    b->ids[t] = malloc(n * sizeof *b->ids[t]);
    b->grads[t] = malloc(n * (size_t)b->f.dim * sizeof *b->grads[t]);
    b->seen[t] = calloc(b->rows[t], 1);
    ok = b->ids[t] && b->grads[t] && b->seen[t];
    for (size_t i = 0; ok && i < n * (size_t)b->f.dim; i++)
      b->grads[t][i] = (float)(sr_rng_uniform(&b->rng) - 0.5) * 1e-2f;
  }
  if (!ok) {
    sr_fmt(b->err, sizeof b->err, "out of memory");
    return -1;
  }
  if (!b->f.shard) {
    b->s = emb_store_create_local(b->plan, b->err, sizeof b->err);
  } else {
    char data[SR_PATH_MAX];
    if (sr_path_err(data, sizeof data, b->err, sizeof b->err, "%s/data", b->dir)) return -1;
    uint64_t cache = (uint64_t)((double)b->total * b->f.cache_fraction);
    emb_shard_config cfg = {.cache_rows = cache > 2 * FILL_CHUNK ? cache : 2 * FILL_CHUNK};
    b->s = emb_store_create_shard(b->plan, data, &cfg, b->err, sizeof b->err);
  }
  return b->s ? 0 : -1;
}

/* Push the ids in b->ids/counts (step b->step). 0 or -1 (message in err). */
static int push(bc *b) {
  const uint64_t *ip[N_TABLES];
  const float *gp[N_TABLES];
  for (int t = 0; t < N_TABLES; t++) ip[t] = b->ids[t], gp[t] = b->grads[t];
  emb_idset set = {.n_tables = N_TABLES, .ids = ip, .counts = b->counts};
  if (emb_store_push(b->s, b->step++, 0.01f, &set, gp)) {
    sr_fmt(b->err, sizeof b->err, "push: %s", emb_store_errmsg(b->s));
    return -1;
  }
  return 0;
}

/* Every row of every table pushed once, in chunks. 0 or -1. */
static int fill(bc *b) {
  for (int t = 0; t < N_TABLES; t++) {
    for (uint64_t r0 = 0; r0 < b->rows[t]; r0 += FILL_CHUNK) {
      memset(b->counts, 0, sizeof b->counts);
      for (uint64_t r = r0; r < b->rows[t] && r < r0 + FILL_CHUNK; r++)
        b->ids[t][b->counts[t]++] = r;
      if (push(b)) return -1;
    }
  }
  memset(b->counts, 0, sizeof b->counts);
  return 0;
}

/* One training step's ids: --batch generated lines, each field's Zipf rank
 * spread over its table, deduplicated per table; counted into changed. */
static void draw_step(bc *b) {
  memset(b->counts, 0, sizeof b->counts);
  for (long long k = 0; k < b->f.batch; k++) {
    dg_generator_row(b->gen, b->line++, b->row);
    for (int t = 0; t < N_TABLES; t++)
      for (int h = 0; h < b->row->ncat[t]; h++) {
        uint64_t id = (uint64_t)b->row->cat_rank[t][h] * SPREAD % b->rows[t];
        if (b->seen[t][id] == 2) continue; /* already in this step */
        if (!b->seen[t][id]) b->changed++;
        b->seen[t][id] = 2;
        b->ids[t][b->counts[t]++] = id;
      }
  }
  for (int t = 0; t < N_TABLES; t++)
    for (size_t i = 0; i < b->counts[t]; i++) b->seen[t][b->ids[t][i]] = 1;
}

/* Bytes of the files under path; *old: of them, in files that have other
 * links (shared with the live database) and were last written before t0
 * (the kernel's coarse clock, as file times are stamped). -1 on failure. */
static double tree_bytes(const char *path, const struct timespec *t0, double *old) {
  char **paths = NULL;
  int n = 0;
  double sum = 0;
  *old = 0;
  if (sr_list_files(path, &paths, &n)) return -1;
  for (int i = 0; i < n; i++) {
    char full[SR_PATH_MAX];
    struct stat st;
    if (sr_path(full, sizeof full, "%s/%s", path, paths[i]) || stat(full, &st)) {
      sr_paths_free(paths, n);
      return -1;
    }
    sum += (double)st.st_size;
    if (st.st_nlink > 1 && (st.st_mtim.tv_sec < t0->tv_sec ||
                            (st.st_mtim.tv_sec == t0->tv_sec && st.st_mtim.tv_nsec < t0->tv_nsec)))
      *old += (double)st.st_size;
  }
  sr_paths_free(paths, n);
  return sum;
}

/* One checkpoint of a kind into dir/name: seconds and bytes. 0, 1 when the
 * store has no incremental op, or -1 (message in err). */
static int checkpoint(bc *b, int delta, const char *name, double *secs, double *bytes,
                      double *old) {
  char path[SR_PATH_MAX];
  if (sr_path_err(path, sizeof path, b->err, sizeof b->err, "%s/%s", b->dir, name)) return -1;
  struct timespec t0;
  clock_gettime(CLOCK_REALTIME_COARSE, &t0);
  double t = sr_now();
  int rc = delta ? emb_store_checkpoint_delta(b->s, path) : emb_store_checkpoint(b->s, path);
  *secs = sr_now() - t;
  if (delta && rc == SR_EUNSUPPORTED) return 1;
  if (rc) {
    sr_fmt(b->err, sizeof b->err, "%s checkpoint: %s", delta ? "incremental" : "full",
           emb_store_errmsg(b->s));
    return -1;
  }
  *bytes = tree_bytes(path, &t0, old);
  if (*bytes < 0 || sr_rmtree(path)) {
    sr_fmt(b->err, sizeof b->err, "%s: cannot read or remove: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

static void print_round(bc *b, const char *what, int r) {
  printf("%-9s changed %9.0f rows (%5.2f%%)  full %9.3f MB %7.3f s", what, b->chg[r],
         100 * b->chg[r] / (double)b->total, b->full_b[r] / 1e6, b->full_s[r]);
  if (b->linked) printf(" (%.3f MB new, the rest linked)", b->full_new[r] / 1e6);
  if (b->no_delta) printf("  incremental unsupported");
  else printf("  incremental %9.3f MB %7.3f s", b->inc_b[r] / 1e6, b->inc_s[r]);
  if (b->f.shard) printf("  (write-back before both %.3f s)", b->wb_s[r]);
  printf("\n");
}

/* The rounds: pushes, incremental checkpoint, full checkpoint. 0 or -1. */
static int rounds(bc *b) {
  for (int r = 0; r < b->f.rounds; r++) {
    b->changed = 0;
    for (int t = 0; t < N_TABLES; t++) memset(b->seen[t], 0, b->rows[t]);
    for (long long k = 0; k < b->f.steps; k++) {
      draw_step(b);
      if (push(b)) return -1;
    }
    b->chg[r] = (double)b->changed;
    double t = sr_now(); /* the dirty rows to RocksDB, which either checkpoint starts with */
    if (emb_store_flush(b->s)) {
      sr_fmt(b->err, sizeof b->err, "flush: %s", emb_store_errmsg(b->s));
      return -1;
    }
    b->wb_s[r] = sr_now() - t;
    double dummy;
    int rc = b->no_delta ? 1 : checkpoint(b, 1, "incremental", &b->inc_s[r], &b->inc_b[r], &dummy);
    if (rc < 0) return -1;
    if (rc == 1 && !b->no_delta) {
      b->no_delta = 1;
      printf("incremental checkpoint: unsupported (the %s store has no checkpoint_delta); "
             "full checkpoints only\n", b->f.shard ? "shard" : "local");
    }
    double old;
    if (checkpoint(b, 0, "full", &b->full_s[r], &b->full_b[r], &old)) return -1;
    b->full_new[r] = b->full_b[r] - old;
    b->linked |= old > 0;
    char what[16];
    snprintf(what, sizeof what, "round %d", r + 1);
    print_round(b, what, r);
  }
  return 0;
}

static void print_medians(bc *b) {
  int n = (int)b->f.rounds;
  double fb = sr_median(b->full_b, n), fs = sr_median(b->full_s, n),
         fnew = sr_median(b->full_new, n), ch = sr_median(b->chg, n);
  double ib = b->no_delta ? 0 : sr_median(b->inc_b, n), is = b->no_delta ? 0 : sr_median(b->inc_s, n);
  printf("median    changed %9.0f rows (%5.2f%%)  full %9.3f MB %7.3f s", ch,
         100 * ch / (double)b->total, fb / 1e6, fs);
  if (b->linked) printf(" (%.3f MB new, the rest linked)", fnew / 1e6);
  if (b->no_delta) printf("  incremental unsupported");
  else printf("  incremental %9.3f MB %7.3f s", ib / 1e6, is);
  if (b->f.shard) printf("  (write-back before both %.3f s)", sr_median(b->wb_s, n));
  printf("\n");
  if (!b->no_delta)
    printf("full / incremental: bytes x%.1f, time x%.1f\n", ib > 0 ? fb / ib : 0.0,
           is > 0 ? fs / is : 0.0);
}

/* The machine: /proc/cpuinfo's first model name and the cores online. */
static void print_cpu(void) {
  char line[512], model[256] = "unknown";
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && fgets(line, sizeof line, f)) {
    char *c = strchr(line, ':');
    if (!strncmp(line, "model name", 10) && c) {
      c += strspn(c + 1, " \t") + 1;
      snprintf(model, sizeof model, "%s", c);
      model[strcspn(model, "\n")] = 0;
      break;
    }
  }
  if (f) fclose(f);
  printf("cpu: %s, %ld cores online\n", model, sysconf(_SC_NPROCESSORS_ONLN));
}

static int run(bc *b) {
  if (setup(b)) return -1;
  int dim = (int)b->f.dim, sl = emb_optim_state_len(&b->plan->tables[0].optim, dim);
  printf("bench ckpt: %s store, %d tables, %llu rows (datagen's columns at scale %.4g), dim %d, "
         "%s (%d state floats a row); %lld steps of %lld lines (Zipf %.2f) between checkpoints\n",
         b->f.shard ? "shard" : "local", N_TABLES, (unsigned long long)b->total, b->scale, dim,
         emb_optim_name(b->f.optim), sl, b->f.steps, b->f.batch, b->f.zipf);
  print_cpu();
  fflush(stdout);
  double t = sr_now(), secs, bytes, old;
  if (fill(b)) return -1;
  double tf = sr_now() - t;
  if (checkpoint(b, 0, "full", &secs, &bytes, &old)) return -1;
  printf("fill: %llu rows pushed in %.1f s; first full checkpoint %.1f MB in %.3f s\n",
         (unsigned long long)b->total, tf, bytes / 1e6, secs);
  fflush(stdout);
  if (rounds(b)) return -1;
  print_medians(b);
  return 0;
}

static void bc_free(bc *b) {
  emb_store_destroy(b->s);
  dg_generator_destroy(b->gen);
  emb_plan_free(b->plan);
  free(b->row);
  for (int t = 0; t < N_TABLES; t++) {
    free(b->ids[t]);
    free(b->grads[t]);
    free(b->seen[t]);
  }
  if (b->dir[0]) sr_rmtree(b->dir);
}

int bench_ckpt(int argc, char **argv) {
  bc *b = calloc(1, sizeof *b);
  if (!b) {
    fprintf(stderr, "shardrec %s: out of memory\n", CMD);
    return 1;
  }
  int status = parse_flags(argc, argv, &b->f);
  if (status >= 0) {
    free(b);
    return status;
  }
  sr_rng_init(&b->rng, 7, 0);
  const char *tmp = getenv("TMPDIR"), *root = b->f.dir ? b->f.dir : tmp && *tmp ? tmp : "/tmp";
  if (sr_path_err(b->dir, sizeof b->dir, b->err, sizeof b->err, "%s/shardrec-bench-ckpt-XXXXXX",
                  root)) {
    fprintf(stderr, "shardrec %s: --dir: %s\n", CMD, b->err);
    free(b);
    return 2;
  }
  if (!mkdtemp(b->dir)) { /* a --dir that is no folder is a bad flag */
    fprintf(stderr, "shardrec %s: %s%s: cannot make a folder: %s\n", CMD, b->f.dir ? "--dir: " : "",
            b->dir, strerror(errno));
    status = b->f.dir ? 2 : 1;
    free(b);
    return status;
  }
  status = run(b) ? 1 : 0;
  if (status) fprintf(stderr, "shardrec %s: %s\n", CMD, b->err);
  bc_free(b);
  free(b);
  return status;
}
