/* shardrec train: train a DLRM on Criteo-format data.
 *
 * Flags follow the reference DLRM (dlrm_s_pytorch.py) where it has them.
 * With no shard servers every shard of the plan is hosted in this process
 * (the embedded default). */
#include <cblas.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/outfile.h"
#include "common/status.h"
#include "dense/collective.h"
#include "dense/cuda_device.h"
#include "dense/device.h"
#include "dense/pool.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "train/job.h"

#define CMD "train"

/* The data flags train takes. */
#define TRAIN_DATA (CLI_DATA_FILES | CLI_DATA_MAPPING | CLI_DATA_STRICT)

static void usage_ranks_and_training(FILE *f);

static void usage(FILE *f) {
  cli_data d;
  cli_data_init(&d, CMD, TRAIN_DATA, NULL);
  fprintf(f,
"usage: shardrec train (--processed-data-file FILE.bin | --raw-data-file FILE.tsv[.gz]) [options]\n"
"\n"
"Data\n");
  cli_data_help(f, &d, 26);
  fprintf(f,
"Model\n"
"  --arch-sparse-feature-size N   embedding dim (16)\n"
"  --arch-embedding-size A-B-...  rows per table (default: from the data)\n"
"  --arch-mlp-bot 13-512-256-64-16   bottom MLP widths, input first\n"
"  --arch-mlp-top 512-256-1  top MLP widths after the interaction\n"
"  --arch-interaction-op dot|cat|dcn  (dot); dcn: the DCN-v2 cross network over\n"
"                            [bottom MLP output, embeddings] (DLRM-DCNv2); alias --interaction_type\n"
"  --dcn-num-layers N        dcn: cross layers (3); alias --dcn_num_layers\n"
"  --dcn-low-rank-dim R      dcn: rank of each layer's U V (the power of two nearest the cross\n"
"                            input's width / 8, at most 512: 64 at dim 16); alias\n"
"                            --dcn_low_rank_dim. With --resume, either one not given is the\n"
"                            checkpoint's\n"
"  --arch-interaction-itself include the diagonal in the dot interaction\n"
"  --pooling sum|mean        embedding bag pooling (sum)\n"
"  --arch-embedding-precision fp32|fp16|bf16  the bits embedding weights are kept in (fp32);\n"
"                            16-bit updates are computed in fp32 and rounded stochastically\n"
"  --plan PLAN.json          use this sharding plan (tables, seed, optimizers, placement)\n"
"  --plan-out FILE           write the plan made here (no --plan) to FILE; it also goes into\n"
"                            --save-checkpoint's folder, and nowhere else unasked\n"
"  --num-shards N            shards of a plan made here (1; all hosted in process)\n"
CLI_KEEP_HELP
"  --shard-servers H:P,...   train against shard servers (one per shard of --plan, in shard order)\n"
"                            whose --checkpoint-root holds the --save-checkpoint, --save-model\n"
"                            and --resume folders (asked at start: the run stops if not)\n"
"  --rpc-deadline S          seconds per shard-server call (30). A call that fails\n"
"                            (UNAVAILABLE, or S passed with no answer: a partition) is\n"
"                            tried again, 10 tries in all: a partition shorter than about\n"
"                            10 x S (the budget: 300 s at the default) costs a log line;\n"
"                            a longer one is a lost server (--recover-timeout)\n"
"  --rpc-connections N       TCP connections to each shard server (1; 1..16); the calls to a\n"
"                            server go round them. N > 1 needs sync mode: in async mode a\n"
"                            Lookup of step t+1 may overtake the Push of step t on another\n"
"                            connection, which would change the bits\n"
"  --tls-ca F [--tls-cert F --tls-key F]   TLS (and mTLS) to the shard servers\n"
"  --recover-timeout S       with --save-checkpoint: when a shard server is lost (down after\n"
"                            every retry, or restarted), wait up to S seconds (60) for the\n"
"                            servers, Restore all of them from the newest checkpoint, rewind\n"
"                            the trainer to it and carry on (with several ranks in sync mode\n"
"                            every rank, in the same step; in async mode the job stops)\n");
  usage_ranks_and_training(f);
}

/* The rest of train's help: data parallelism, training, output and checkpoints. */
static void usage_ranks_and_training(FILE *f) {
  fprintf(f,
"Data parallelism (mpirun -np N shardrec train ...)\n"
"  Each rank takes a fixed slice of every global batch (--mini-batch-size is the global\n"
"  batch and must divide by N); the dense gradients are all-reduced every step; rank 0\n"
"  prints and writes everything. Embeddings stay on shards: --shard-servers (every rank\n"
"  reaches the same servers) or --colocate-shards.\n"
"  --colocate-shards         host the plan's shards in the ranks themselves (shard k on rank\n"
"                            k %% N), served over gRPC to every rank (--data-dir, --cache-rows,\n"
"                            --cache-mb apply to them)\n"
"  --sparse-mode sync|async  sync (default): every rank's pushes of step t are applied, summed\n"
"                            in rank order, before any lookup of t+1 (bit-reproducible);\n"
"                            async: pushes applied on arrival, the next step's lookup issued\n"
"                            while this step computes (needs shard servers or colocated shards)\n"
"  --max-staleness S         async: a lookup of step t waits until every rank's push of step\n"
"                            t-S is applied (2; >= 1)\n"
"  --prefetch-depth D        read D batches ahead and hand the store each later step's ids\n"
"                            during the step before (the shard store reads their misses from\n"
"                            RocksDB meanwhile); exact at any depth (2; 0..8, 0: off)\n"
"Training\n"
"  --mini-batch-size N       (128)\n"
"  --test-mini-batch-size N  (the mini-batch size)\n"
"  --learning-rate F         (0.1)\n"
"  --sparse-learning-rate F  learning rate of the embedding rows (the --learning-rate)\n"
"  --optimizer sgd|adagrad|adam   dense optimizer (sgd)\n"
"  --sparse-optimizer sgd|adagrad|rowwise_adagrad  (as --optimizer; rowwise_adagrad for adam)\n"
"  --lr-num-warmup-steps N, --lr-decay-start-step N, --lr-num-decay-steps N\n"
"  --nepochs N               (1)\n"
"  --num-batches N           stop after N batches (0: whole epochs)\n"
"  --seed N                  model seed (123, as the reference)\n"
"  --device cpu|cuda[:N]     where the dense part runs (cpu; cuda needs a CUDA build and a GPU)\n"
"  --dense-threads N         threads of the dense step per rank (cores / ranks on this host);\n"
"                            they change speed, never results (OPENBLAS_NUM_THREADS neither)\n"
"  --dense-isa baseline|avx2 our dense kernels (the best this CPU runs): to reproduce the bits\n"
"                            of a run on a machine that picked the other set\n"
"Output\n"
"  --print-freq N            progress every N steps (256)\n"
"  --test-freq N             evaluate every N steps (-1, the reference DLRM's default, or 0:\n"
"                            at the end only, of each epoch)\n"
"  --metrics-out FILE.jsonl  one JSON object per print and test interval (resumed: the\n"
"                            lines up to the checkpoint's step kept, the rest appended)\n"
"  --metrics-listen HOST:PORT  serve Prometheus figures on http://HOST:PORT/metrics (under\n"
"                            mpirun each rank on PORT + its local rank; off unless given)\n"
"  --save-model DIR          save the model as a checkpoint, DIR/step-N (read by eval and\n"
"                            predict); an existing DIR is replaced only when it is a folder of\n"
"                            checkpoints (step-N folders, plan.json); anything else is refused\n"
"  --oracle SUMMARY.json     the generator's summary: print the oracle's test AUC beside ours\n"
"  --test-pred-out FILE      the test split's predicted probabilities, one per line in test\n"
"                            order (%%.9g: the exact float), rewritten at every evaluation\n"
"Embedding rows and checkpoints\n"
"  --cache-rows N, --cache-mb N   keep rows in the RocksDB shard store with a hot cache of\n"
"                            N rows (1024..2^31-1) / N MiB (1..2^20) (default: every row\n"
"                            in memory, no RocksDB)\n"
"  --data-dir DIR            where the shards' RocksDB databases live (DIR/shard-K; implies\n"
"                            the shard store, cache 256 MiB unless given; default: a\n"
"                            temporary folder removed at exit)\n"
"  --save-checkpoint DIR     write DIR/step-N/ every --checkpoint-every steps and at the end\n"
"                            (and, with --checkpoint-every, step-0 before training); DIR is new\n"
"                            or a folder of checkpoints: one holding anything else is refused\n"
"  --checkpoint-every N      steps between checkpoints (0: only at the end)\n"
"  --keep-checkpoints K      keep the newest K complete checkpoints, each with every link of\n"
"                            its chain (0: all)\n"
"  --full-checkpoint-every K of the checkpoints written into --save-checkpoint, every K-th is\n"
"                            full and the others incremental: only the rows changed or\n"
"                            removed since the one before (dense state whole), naming it\n"
"                            (default 1: every one full). --resume takes the newest of a\n"
"                            chain; shardrec fold writes it whole; --save-model is full\n"
"  --resume DIR              continue from the newest complete checkpoint in DIR (or the\n"
"                            step-N folder named): rows, dense model, optimizer, data position.\n"
"                            The data is mapped as the checkpoint's was: a raw file with its\n"
"                            dictionaries; a converted file whose mapping extends them\n"
"                            (convert --mapping-from DIR --extend-dictionaries) grows the\n"
"                            tables (plan --grow-from DIR writes that plan), another is refused\n"
"  --auto-resume             with --save-checkpoint DIR: --resume DIR when DIR holds a\n"
"                            complete checkpoint, else start fresh (the same command under any\n"
"                            restart policy: a loop, systemd Restart=, Slurm --requeue)\n");
}

enum {
  O_DIM = 1000, O_EMBSIZE,
  O_BOT, O_TOP, O_OP, O_ITSELF, O_POOL, O_PLAN, O_PLANOUT, O_SHARDS, O_BATCH, O_TBATCH, O_LR,
  O_OPT, O_SOPT, O_SLR, O_WARM, O_DSTART, O_DSTEPS, O_EPOCHS, O_NBATCH, O_SEED, O_PRINT, O_TEST,
  O_METRICS, O_SAVE, O_ORACLE, O_SERVERS, O_RPCDL, O_TLSCA, O_TLSCERT, O_TLSKEY, O_HELP,
  O_CKPT = 1100, O_CKEVERY, O_CKKEEP, O_RESUME, O_DATADIR, O_CROWS, O_CMB,
  O_DEVICE = 1200, O_RECOVER = 1300, O_COLOCATE = 1400, O_SPMODE, O_STALE, O_PREDOUT,
  O_MLISTEN = 1500, O_DTHREADS, O_DISA,
  O_DCNL = 1600, O_DCNR
};
enum { O_PFDEPTH = 1700 }; /* --prefetch-depth */
enum { O_AUTORESUME = 1900 }; /* --auto-resume */
enum { O_RPCCONN = 2000 }; /* --rpc-connections */
enum { O_FULLEVERY = 2100 }; /* --full-checkpoint-every */
enum { O_ADMIT = 2200, O_AWIN, O_EXPIRE, O_CAP, O_EVICT, O_HALF }; /* the bounded tables' flags */
enum { O_EPREC = 2300 }; /* --arch-embedding-precision */

static const struct option long_opts[] = { /* and the data flags of TRAIN_DATA (cli_data.c) */
    {"arch-sparse-feature-size", required_argument, 0, O_DIM},
    {"arch-embedding-size", required_argument, 0, O_EMBSIZE},
    {"arch-mlp-bot", required_argument, 0, O_BOT}, {"arch-mlp-top", required_argument, 0, O_TOP},
    {"arch-interaction-op", required_argument, 0, O_OP},
    {"arch-interaction-itself", no_argument, 0, O_ITSELF},
    {"interaction_type", required_argument, 0, O_OP}, /* TorchRec dlrm_main's spellings */
    {"dcn-num-layers", required_argument, 0, O_DCNL}, {"dcn_num_layers", required_argument, 0, O_DCNL},
    {"dcn-low-rank-dim", required_argument, 0, O_DCNR},
    {"dcn_low_rank_dim", required_argument, 0, O_DCNR},
    {"pooling", required_argument, 0, O_POOL}, {"plan", required_argument, 0, O_PLAN},
    {"arch-embedding-precision", required_argument, 0, O_EPREC},
    {"plan-out", required_argument, 0, O_PLANOUT}, {"num-shards", required_argument, 0, O_SHARDS},
    {"mini-batch-size", required_argument, 0, O_BATCH},
    {"test-mini-batch-size", required_argument, 0, O_TBATCH},
    {"learning-rate", required_argument, 0, O_LR}, {"optimizer", required_argument, 0, O_OPT},
    {"sparse-optimizer", required_argument, 0, O_SOPT},
    {"sparse-learning-rate", required_argument, 0, O_SLR},
    {"lr-num-warmup-steps", required_argument, 0, O_WARM},
    {"lr-decay-start-step", required_argument, 0, O_DSTART},
    {"lr-num-decay-steps", required_argument, 0, O_DSTEPS},
    {"nepochs", required_argument, 0, O_EPOCHS}, {"num-batches", required_argument, 0, O_NBATCH},
    {"seed", required_argument, 0, O_SEED}, {"print-freq", required_argument, 0, O_PRINT},
    {"test-freq", required_argument, 0, O_TEST}, {"metrics-out", required_argument, 0, O_METRICS},
    {"metrics-listen", required_argument, 0, O_MLISTEN},
    {"save-model", required_argument, 0, O_SAVE}, {"oracle", required_argument, 0, O_ORACLE},
    {"shard-servers", required_argument, 0, O_SERVERS},
    {"rpc-deadline", required_argument, 0, O_RPCDL}, {"tls-ca", required_argument, 0, O_TLSCA},
    {"tls-cert", required_argument, 0, O_TLSCERT}, {"tls-key", required_argument, 0, O_TLSKEY},
    {"help", no_argument, 0, O_HELP}, {"save-checkpoint", required_argument, 0, O_CKPT},
    {"checkpoint-every", required_argument, 0, O_CKEVERY},
    {"keep-checkpoints", required_argument, 0, O_CKKEEP},
    {"full-checkpoint-every", required_argument, 0, O_FULLEVERY},
    {"resume", required_argument, 0, O_RESUME}, {"data-dir", required_argument, 0, O_DATADIR},
    {"cache-rows", required_argument, 0, O_CROWS}, {"cache-mb", required_argument, 0, O_CMB},
    {"device", required_argument, 0, O_DEVICE},
    {"recover-timeout", required_argument, 0, O_RECOVER},
    {"test-pred-out", required_argument, 0, O_PREDOUT},
    {"colocate-shards", no_argument, 0, O_COLOCATE},
    {"admit-after", required_argument, 0, O_ADMIT}, {"admit-window", required_argument, 0, O_AWIN},
    {"expire-after", required_argument, 0, O_EXPIRE}, {"capacity", required_argument, 0, O_CAP},
    {"evict", required_argument, 0, O_EVICT}, {"lfu-half-life", required_argument, 0, O_HALF},
    {"sparse-mode", required_argument, 0, O_SPMODE},
    {"max-staleness", required_argument, 0, O_STALE},
    {"prefetch-depth", required_argument, 0, O_PFDEPTH},
    {"dense-threads", required_argument, 0, O_DTHREADS},
    {"dense-isa", required_argument, 0, O_DISA},
    {"auto-resume", no_argument, 0, O_AUTORESUME},
    {"rpc-connections", required_argument, 0, O_RPCCONN},
    {0, 0, 0, 0}};

__attribute__((format(printf, 2, 3))) static void errf(const train_ranks *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  train_verrf(r->rank, r->size, fmt, ap);
  va_end(ap);
}

/* The flags that need more than one call of a cli_* parser. */
typedef struct {
  cli_data data; /* the data flags */
  const char *pooling, *sopt, *device, *emb_sizes, *oracle, *dense_isa, *precision;
  int staleness; /* --max-staleness (0: not given) */
  int dcn_layers, dcn_rank; /* --dcn-num-layers, --dcn-low-rank-dim (0: not given) */
} raw_flags;

/* "A-B-..." of DS_NUM_SPARSE table sizes, each in the flag's range (they
 * may exceed int). */
static int parse_sizes(const train_ranks *r, const char *s, uint64_t *sizes) {
  const cli_range *range = cli_range_of("--arch-embedding-size");
  uint64_t v[256];
  int n;
  if (cli_u64_list(CMD, "--arch-embedding-size", s, "-", (uint64_t)range->lo,
                   (uint64_t)range->hi, range->unit, v, 256, &n))
    return -1;
  if (n != DS_NUM_SPARSE) {
    errf(r, "--arch-embedding-size: need %d sizes joined by '-', not %d\n", DS_NUM_SPARSE, n);
    return -1;
  }
  memcpy(sizes, v, sizeof v[0] * DS_NUM_SPARSE);
  return 0;
}

/* A flag whose argument is stored as is, or parsed as a number in a range;
 * exactly one destination is set. */
typedef struct {
  int id;
  const char *name;
  double lo, hi;
  const char **str;
  int *i;
  int64_t *l;
  uint64_t *u;
  double *d;
} flag_dest;

/* Store arg at f's destination, in the flag's range: the one of every
 * command (tools/cli.c) when it has one, else f's. 0 or 2 (message printed). */
static int flag_set(const flag_dest *f, const char *arg) {
  long long v;
  const int shared = f->name && cli_range_of(f->name);
  if (f->str) *f->str = arg;
  else if (f->d && shared) return cli_flag_double(CMD, f->name, arg, f->d) ? 2 : 0;
  else if (f->d) return cli_double(CMD, f->name, arg, f->lo, f->hi, f->d) ? 2 : 0;
  else if (f->u && !shared && f->hi == 0) return cli_u64(CMD, f->name, arg, f->u) ? 2 : 0;
  else if (shared ? cli_flag(CMD, f->name, arg, &v)
                  : cli_int(CMD, f->name, arg, (long long)f->lo, (long long)f->hi, &v)) return 2;
  else if (f->i) *f->i = (int)v;
  else if (f->l) *f->l = v;
  else *f->u = (uint64_t)v;
  return 0;
}

/* One option of getopt_long into c (or rf). 0, 1 for --help, or 2 for a
 * usage error (message printed). */
static int parse_opt(const train_ranks *r, int opt, const char *arg, train_config *c, raw_flags *rf) {
  const double L40 = (double)(1LL << 40);
  const flag_dest dests[] = {
      {O_EMBSIZE, .str = &rf->emb_sizes},
      {O_BOT, .str = &c->bot}, {O_TOP, .str = &c->top}, {O_OP, .str = &c->op},
      {O_POOL, .str = &rf->pooling}, {O_PLAN, .str = &c->plan_path},
      {O_PLANOUT, .str = &c->plan_out}, {O_OPT, .str = &c->opt_name}, {O_SOPT, .str = &rf->sopt},
      {O_METRICS, .str = &c->metrics_out}, {O_SAVE, .str = &c->save_model},
      {O_MLISTEN, .str = &c->metrics_listen},
      {O_ORACLE, .str = &rf->oracle}, {O_CKPT, .str = &c->checkpoint_dir},
      {O_RESUME, .str = &c->resume}, {O_DATADIR, .str = &c->data_dir},
      {O_SERVERS, .str = &c->servers}, {O_DEVICE, .str = &rf->device},
      {O_PREDOUT, .str = &c->test_pred_out}, {O_TLSCA, .str = &c->tls_ca},
      {O_DISA, .str = &rf->dense_isa}, {O_EPREC, .str = &rf->precision},
      {O_TLSCERT, .str = &c->tls_cert}, {O_TLSKEY, .str = &c->tls_key},
      /* ranges 0, 0: the flag's range of every command (tools/cli.c) */
      {O_DTHREADS, "--dense-threads", 0, 0, .i = &c->dense_threads},
      {O_DCNL, "--dcn-num-layers", 0, 0, .i = &rf->dcn_layers},
      {O_DCNR, "--dcn-low-rank-dim", 0, 0, .i = &rf->dcn_rank},
      {O_SEED, "--seed", 0, 0, .u = &c->seed},
      {O_DIM, "--arch-sparse-feature-size", 0, 0, .i = &c->dim},
      {O_SHARDS, "--num-shards", 0, 0, .i = &c->n_shards},
      {O_BATCH, "--mini-batch-size", 0, 0, .i = &c->batch},
      {O_TBATCH, "--test-mini-batch-size", 0, 0, .i = &c->test_batch},
      {O_WARM, "--lr-num-warmup-steps", 0, L40, .l = &c->sched.num_warmup_steps},
      {O_DSTART, "--lr-decay-start-step", 0, L40, .l = &c->sched.decay_start_step},
      {O_DSTEPS, "--lr-num-decay-steps", 0, L40, .l = &c->sched.num_decay_steps},
      {O_EPOCHS, "--nepochs", 1, 1 << 20, .i = &c->epochs},
      {O_NBATCH, "--num-batches", 0, L40, .l = &c->num_batches},
      {O_PRINT, "--print-freq", 1, L40, .l = &c->print_freq},
      {O_TEST, "--test-freq", 0, 0, .l = &c->test_freq},
      {O_CKEVERY, "--checkpoint-every", 0, L40, .l = &c->checkpoint_every},
      {O_CKKEEP, "--keep-checkpoints", 0, 1 << 20, .i = &c->keep_checkpoints},
      {O_FULLEVERY, "--full-checkpoint-every", 1, 1 << 20, .i = &c->full_every},
      {O_CROWS, "--cache-rows", 0, 0, .u = &c->cache_rows},
      {O_CMB, "--cache-mb", 0, 0, .u = &c->cache_mb},
      {O_STALE, "--max-staleness", 1, 1 << 20, .i = &rf->staleness},
      {O_PFDEPTH, "--prefetch-depth", 0, 0, .i = &c->prefetch_depth},
      {O_LR, "--learning-rate", 0.0, 1e6, .d = &c->lr},
      {O_SLR, "--sparse-learning-rate", 0.0, 1e6, .d = &c->sparse_lr},
      {O_RECOVER, "--recover-timeout", 0.0, 1e6, .d = &c->recover_timeout},
      {O_RPCDL, "--rpc-deadline", 0, 0, .d = &c->rpc_deadline},
      {O_RPCCONN, "--rpc-connections", 0, 0, .i = &c->rpc_connections},
  };
  for (size_t k = 0; k < sizeof dests / sizeof dests[0]; k++)
    if (dests[k].id == opt) {
      if (flag_set(&dests[k], arg)) return 2;
      if (opt == O_TEST && c->test_freq < 0) c->test_freq = 0;
      return 0;
    }
  switch (opt) {
    case O_SPMODE:
      if (strcmp(arg, "sync") && strcmp(arg, "async")) {
        errf(r, "--sparse-mode: '%s' is not sync or async\n", arg);
        return 2;
      }
      c->async = !strcmp(arg, "async");
      return 0;
    case O_ITSELF: c->dense.interaction_itself = 1; return 0;
    case O_COLOCATE: c->colocate = 1; return 0;
    case O_ADMIT: case O_AWIN: case O_EXPIRE: case O_CAP: case O_EVICT: case O_HALF: {
      static const char *const names[] = {"--admit-after", "--admit-window", "--expire-after",
                                          "--capacity", "--evict", "--lfu-half-life"};
      c->have_keep = 1;
      return cli_keep_flag(CMD, names[opt - O_ADMIT], arg, &c->keep) ? 2 : 0;
    }
    case O_AUTORESUME: c->auto_resume = 1; return 0;
    case 'h':
    case O_HELP: usage(stdout); return 1;
    default: return cli_data_flag(&rf->data, opt, arg) ? 2 : 0; /* a data flag */
  }
}

/* What the flags mean together: defaults that follow other flags, names
 * into kinds, the dense architecture, the oracle. 0 or 2 (message printed). */
static int finish_flags(const train_ranks *r, train_config *c, raw_flags *rf) {
  char err[1024];
  const cli_data *d = &rf->data;
  c->processed = d->processed;
  c->raw = d->raw;
  c->terabyte = d->terabyte;
  c->have_test_fraction = d->have_test_fraction;
  c->test_fraction = d->test_fraction;
  c->max_ind_range = d->max_ind_range;
  c->frequency_threshold = d->frequency_threshold;
  c->strict = d->strict;
  if (rf->emb_sizes) { /* a flag's own range before what flags mean together */
    if (parse_sizes(r, rf->emb_sizes, c->emb_sizes)) return 2;
    c->have_emb_sizes = 1;
  }
  if (train_config_check(c, err, sizeof err)) {
    errf(r, "%s\n", err);
    return 2;
  }
  const cli_file outs[3] = {{"--metrics-out", c->metrics_out},
                            {"--plan-out", c->plan_out},
                            {"--test-pred-out", c->test_pred_out}};
  for (int k = 0; k < 3; k++) /* single files: a folder there is refused and kept */
    if (outs[k].path && sr_out_check(outs[k].path, err, sizeof err)) {
      errf(r, "%s: %s\n", outs[k].flag, err);
      return 2;
    }
  const cli_file ins[3] = {{"--raw-data-file", c->raw},
                           {"--processed-data-file", c->processed},
                           {"--plan", c->plan_path}};
  if (cli_outs_clash(outs, 3, ins, 3, err, sizeof err)) {
    errf(r, "%s\n", err);
    return 2;
  }
  const dense_backend *be;
  int gpu = 0;
  if (!strncmp(rf->device, "cuda", 4) && !strcmp(c->op, "dcn")) {
    errf(r, "--arch-interaction-op dcn runs on the CPU only (the CUDA backend has no "
         "cross-network kernels); drop --device %s\n", rf->device);
    return 2;
  }
  if (dense_backend_for_device(rf->device, &be, &gpu, err, sizeof err)) {
    errf(r, "%s\n", err);
    return 2;
  }
  if (rf->dense_isa && gpu) {
    errf(r, "--dense-isa picks CPU kernels; it does not apply to --device %s\n", rf->device);
    return 2;
  }
  if (rf->dense_isa && cli_dense_isa(CMD, rf->dense_isa, &be)) return 2;
  dense_backend_set_default(be); /* the trainer's dense model runs on it */
  if (gpu) printf("device %s (%s)\n", rf->device, be->name);
  if (c->test_batch == 0) c->test_batch = c->batch;
  if (c->sparse_lr < 0) c->sparse_lr = c->lr;
  if (!strcmp(c->opt_name, "sgd")) c->dense_opt = DENSE_OPT_SGD, c->sparse_opt = EMB_OPT_SGD;
  else if (!strcmp(c->opt_name, "adagrad")) c->dense_opt = DENSE_OPT_ADAGRAD, c->sparse_opt = EMB_OPT_ADAGRAD;
  else if (!strcmp(c->opt_name, "adam")) c->dense_opt = DENSE_OPT_ADAM, c->sparse_opt = EMB_OPT_ROWWISE_ADAGRAD;
  else {
    errf(r, "--optimizer: '%s' is not sgd, adagrad or adam\n", c->opt_name);
    return 2;
  }
  if (rf->sopt && emb_optim_parse(rf->sopt, &c->sparse_opt)) {
    errf(r, "--sparse-optimizer: '%s' is not sgd, adagrad or rowwise_adagrad\n", rf->sopt);
    return 2;
  }
  if (emb_pooling_parse(rf->pooling, &c->pooling)) {
    errf(r, "--pooling: '%s' is not sum or mean\n", rf->pooling);
    return 2;
  }
  if (rf->precision && emb_precision_parse(rf->precision, &c->precision)) {
    errf(r, "--arch-embedding-precision: '%s' is not fp32, fp16 or bf16\n", rf->precision);
    return 2;
  }
  c->sched.base_lr = c->lr;
  if (dense_lr_sched_validate(&c->sched, err, sizeof err)) {
    errf(r, "%s\n", err);
    return 2;
  }
  int itself = c->dense.interaction_itself;
  if (cli_model_arch_dcn(CMD, c->bot, c->top, c->op, itself, rf->dcn_layers, rf->dcn_rank, c->dim,
                         DS_NUM_SPARSE, c->batch > c->test_batch ? c->batch : c->test_batch,
                         &c->dense))
    return 2;
  c->dcn_layers_set = rf->dcn_layers != 0, c->dcn_rank_set = rf->dcn_rank != 0;
  if (c->dense.n_dense != DS_NUM_DENSE) {
    errf(r, "--arch-mlp-bot must start with %d (the dense features), not %d\n", DS_NUM_DENSE,
         c->dense.n_dense);
    return 2;
  }
  if (rf->oracle) {
    if (train_oracle_read(rf->oracle, &c->oracle_auc, &c->oracle_logloss, err, sizeof err)) {
      errf(r, "%s\n", err);
      return 2;
    }
    c->have_oracle = 1;
  }
  if (rf->staleness && !c->async) {
    errf(r, "--max-staleness applies to --sparse-mode async\n");
    return 2;
  }
  if (c->keep.half_life && c->keep.evict != EMB_EVICT_LFU) {
    errf(r, "--lfu-half-life applies to --evict lfu\n");
    return 2;
  }
  c->max_staleness = rf->staleness ? rf->staleness : 2;
  return 0;
}

/* Flags into c; 0, 1 for --help (printed) or 2 for a usage error. */
static int parse_flags(const train_ranks *r, int argc, char **argv, train_config *c) {
  raw_flags rf = {.pooling = "sum", .device = "cpu"};
  cli_data_init(&rf.data, CMD, TRAIN_DATA, NULL);
  struct option opts[CLI_OPTIONS_MAX];
  if (cli_data_options(&rf.data, long_opts, opts, CLI_OPTIONS_MAX)) return 2;
  optind = 1;
  opterr = 0;
  int opt;
  while ((opt = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    if (opt == ':' || opt == '?') {
      cli_bad_option(CMD, opt, argv[optind - 1]);
      return 2;
    }
    int rc = parse_opt(r, opt, optarg, c, &rf);
    if (rc) return rc;
  }
  if (optind < argc) {
    errf(r, "unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  return finish_flags(r, c, &rf);
}

int cmd_train(int argc, char **argv) {
  train_ranks r;
  train_ranks_enter(&r);
  train_config c = {.bot = "13-512-256-64-16", .top = "512-256-1", .op = "dot",
                    .opt_name = "sgd", .seed = 123, .dim = 16,
                    .n_shards = 1, .batch = 128, .epochs = 1, .print_freq = 256, .lr = 0.1,
                    .sparse_lr = -1, .recover_timeout = 60, .ranks = r,
                    .prefetch_depth = TRAIN_PREFETCH_DEPTH_DEFAULT, .full_every = 1};
  int rc = parse_flags(&r, argc, argv, &c);
  if (rc == 1) rc = 0; /* --help */
  else if (rc == 0) {
    train_ranks_speak(&r); /* the flags are good: every rank reports its own failures */
    rc = train_run(&c);
  }
  return train_ranks_leave(&r, rc);
}
