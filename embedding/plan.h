/* The sharding plan: the model's embedding tables and where they live.
 *
 * One JSON file is the single source of truth for trainers, shard servers and
 * the resharder (DESIGN.md, "The sharding plan"). It holds the format version,
 * the model seed, the tables (stable table_id, name, rows or unbounded, dim,
 * pooling, init range, sparse optimizer and its settings) and each table's
 * placement over n_shards shards.
 *
 * File layout (keys may come in any order on input, each once, and none
 * other: an unknown or repeated key is refused naming it; emb_plan_save
 * writes them in the canonical order below):
 *
 *   {"format": 1, "seed": "42", "n_shards": 2,
 *    "tables": [
 *      {"table_id": 0, "name": "t0", "rows": 1460, "dim": 16, "pooling": "sum",
 *       "init_range": 0.026171196129510021,
 *       "optimizer": {"name": "adagrad", "eps": 1e-10,
 *                     "initial_accumulator_value": 0},
 *       "placement": {"kind": "table", "shards": [1]}},
 *      {"table_id": 7, "name": "ids", "rows": "unbounded", ...
 *       "placement": {"kind": "row", "shards": [0, 1]}}]}
 *
 * - seed: a uint64 written as a decimal string, so every value round-trips
 *   (JSON numbers are doubles); a plain number is accepted on input when it is
 *   an exact integer below 2^53.
 * - rows: a number (1..2^53), or "unbounded" (also 0 on input) for tables
 *   whose ids are 64-bit hashes.
 * - init_range: optional on input; default sqrt(1/rows) as the reference
 *   DLRM, and sqrt(1/2^20) = 1/1024 for unbounded tables.
 * - optimizer.name: "sgd", "adagrad" (torch.optim.Adagrad; eps default 1e-10)
 *   or "rowwise_adagrad" (FBGEMM/TorchRec; eps default 1e-8); eps and
 *   initial_accumulator_value (default 0) are optional on input.
 * - placement.kind "table": shards holds exactly one shard; "row": rows are
 *   spread over the listed shards by emb_plan_shard_of.
 * - precision: optional, "fp32" (the default), "fp16" or "bf16": the bits
 *   a weight is kept in (embedding/precision.h). Written only when it is not
 *   fp32, so an fp32 plan's text and fingerprints are what they were.
 * - keep (optional; absent: every id seen gets a row forever): bounds on the
 *   table's rows, applied by the trainer at step boundaries (train/keep.h):
 *     {"admit_after": F, "admit_window": W, "expire_after": T,
 *      "capacity": C, "evict": "lru"}
 *   admit_after: an id gets a row once seen in F samples (0 and 1: at
 *   once); until then it reads zeros and its gradient is dropped.
 *   admit_window: a count not yet at F is forgotten after W steps in which
 *   the id was not seen (default EMB_KEEP_WINDOW_DEFAULT). expire_after: a
 *   row not looked up for T steps is removed (0: never). capacity: at most
 *   C rows at each step boundary (0: no bound), the lowest-scored removed
 *   first: "lru" (least recently looked up) or "lfu" (fewest samples).
 *   "half_life": H (lfu only; optional, written only when set): an
 *   admitted id's samples count half for every H steps since (train/keep.h).
 *   Written only when one of them is set, so plans without it keep their
 *   fingerprints; a keep that bounds nothing is read as all zero.
 *
 * Numbers are written in the shortest form that reads back to the same
 * double. Two SHA-256 fingerprints of a canonical serialisation (the layout
 * above, fixed key order, no whitespace): the model fingerprint covers
 * everything but n_shards and placement (resharding keeps it), the plan
 * fingerprint covers everything.
 *
 * The plan struct is plain data, read-only to everyone but this module's
 * constructors; table index (position in tables[]) is what the store and the
 * trainer use, table_id is what identifies a row forever. */
#ifndef SHARDREC_EMBEDDING_PLAN_H
#define SHARDREC_EMBEDDING_PLAN_H

#include <stddef.h>
#include <stdint.h>

#define EMB_PLAN_FORMAT 1
#define EMB_MAX_DIM 1024
#define EMB_MAX_TABLES 4096
#define EMB_MAX_SHARDS 65536
#define EMB_NAME_MAX 64
/* rows value of an unbounded table (ids are 64-bit hashes). */
#define EMB_ROWS_UNBOUNDED 0
/* Largest rows a bounded table may have (exact as a JSON number). */
#define EMB_ROWS_MAX (1ULL << 53)
/* Row count assumed for an unbounded table by the default init range and
 * the table-wise balancer. */
#define EMB_UNBOUNDED_ROWS_ESTIMATE (1ULL << 20)
/* Hex fingerprint: 64 digits and a NUL. */
#define EMB_FP_HEX 65

typedef enum { EMB_POOL_SUM = 0, EMB_POOL_MEAN = 1 } emb_pooling;

typedef enum {
  EMB_OPT_SGD = 0,
  EMB_OPT_ADAGRAD = 1,         /* one accumulator per element */
  EMB_OPT_ROWWISE_ADAGRAD = 2, /* one accumulator per row */
} emb_optim_kind;

typedef struct emb_optim_cfg {
  emb_optim_kind kind;
  double eps;      /* adagrad kinds: added to sqrt(acc) */
  double init_acc; /* adagrad kinds: initial accumulator value, >= 0 */
} emb_optim_cfg;

/* The bits a table's weights are kept in (optimizer state stays fp32). */
typedef enum {
  EMB_PREC_FP32 = 0, /* IEEE binary32: the default */
  EMB_PREC_FP16 = 1, /* IEEE binary16 */
  EMB_PREC_BF16 = 2, /* bfloat16 */
} emb_precision;

typedef enum {
  EMB_PLACE_TABLE = 0, /* whole table on shards[0] */
  EMB_PLACE_ROW = 1,   /* row r on shards[emb_plan_shard_of(...)] */
} emb_place_kind;

typedef struct emb_placement {
  emb_place_kind kind;
  int n;       /* entries in shards: 1 for table-wise, >= 1 for row-wise */
  int *shards; /* [n] distinct shard indices in 0..plan->n_shards-1; owned by the plan */
} emb_placement;

typedef enum { EMB_EVICT_LRU = 0, EMB_EVICT_LFU = 1 } emb_evict_kind;

/* Steps a count under admit_after survives without its id (keep.admit_window 0). */
#define EMB_KEEP_WINDOW_DEFAULT 1000
/* Largest admit_after, admit_window and expire_after (steps or samples). */
#define EMB_KEEP_MAX 1000000000ULL

/* A table's bounds (the plan's "keep"); all zero: none. */
typedef struct emb_keep_cfg {
  uint64_t admit_after;  /* 0/1: a row at once; F: after F samples hold the id */
  uint64_t admit_window; /* 0: EMB_KEEP_WINDOW_DEFAULT */
  uint64_t expire_after; /* 0: never; T: removed after T steps without a lookup */
  uint64_t capacity;     /* 0: unbounded; C: at most C rows at a step boundary */
  emb_evict_kind evict;  /* which rows go above capacity */
  uint64_t half_life;    /* lfu: an id's samples count half after H steps (0: never less) */
} emb_keep_cfg;

typedef struct emb_table {
  uint32_t table_id;       /* stable identity; never a list position */
  char name[EMB_NAME_MAX]; /* unique, printable, non-empty */
  uint64_t rows;           /* EMB_ROWS_UNBOUNDED or 1..EMB_ROWS_MAX */
  int dim;                 /* 1..EMB_MAX_DIM */
  emb_pooling pooling;
  double init_range;       /* never-written rows are uniform in [-a, a) */
  emb_optim_cfg optim;
  emb_placement place;
  emb_precision precision; /* weights' bits; EMB_PREC_FP32 unless the plan says */
  emb_keep_cfg keep;       /* all zero: every id seen keeps a row */
} emb_table;

typedef struct emb_plan {
  int format;        /* EMB_PLAN_FORMAT */
  uint64_t seed;     /* model seed: row init derives from it */
  int n_shards;      /* 1..EMB_MAX_SHARDS */
  int n_tables;      /* 1..EMB_MAX_TABLES */
  emb_table *tables; /* [n_tables], owned */
} emb_plan;

/* Parameters of emb_plan_create: one table per entry of rows. */
typedef struct emb_plan_params {
  int n_tables;
  const uint64_t *rows;     /* [n_tables]; EMB_ROWS_UNBOUNDED allowed */
  const char *const *names; /* [n_tables] or NULL for "t0", "t1", ... */
  int dim;
  emb_pooling pooling;
  emb_optim_cfg optim;      /* eps < 0 means the optimizer's default */
  double init_range;        /* <= 0 means the default per table */
  uint64_t seed;
  int n_shards;
  int row_wise; /* 0: each table on one shard, balanced greedily by bytes;
                   1: every table row-wise over all shards */
  emb_precision precision; /* every table's (0: fp32) */
  emb_keep_cfg keep; /* every table's bounds (all zero: none) */
} emb_plan_params;

/* 1 when the table has any bound (admission, expiry or capacity): its ids
 * without a row read zeros (train/keep.h), in training and in scoring. */
int emb_keep_on(const emb_table *t);
/* "lru", "lfu"; emb_evict_parse returns 0 or -1. */
const char *emb_evict_name(emb_evict_kind k);
int emb_evict_parse(const char *s, emb_evict_kind *out);

/* Default eps of an optimizer kind (1e-10 adagrad, 1e-8 rowwise, 0 sgd). */
double emb_optim_default_eps(emb_optim_kind kind);
/* "sgd", "adagrad", "rowwise_adagrad"; emb_optim_parse returns 0 or -1. */
const char *emb_optim_name(emb_optim_kind kind);
int emb_optim_parse(const char *s, emb_optim_kind *out);
/* "fp32", "fp16", "bf16"; emb_precision_parse returns 0 or -1. */
const char *emb_precision_name(emb_precision p);
int emb_precision_parse(const char *s, emb_precision *out);
/* Bytes of one weight: 4 or 2. */
int emb_precision_bytes(emb_precision p);
/* "sum", "mean"; emb_pooling_parse returns 0 or -1. */
const char *emb_pooling_name(emb_pooling p);
int emb_pooling_parse(const char *s, emb_pooling *out);
/* Default init range for a table of rows rows: sqrt(1/rows), or
 * sqrt(1/EMB_UNBOUNDED_ROWS_ESTIMATE) for an unbounded table. */
double emb_default_init_range(uint64_t rows);

/* Build a plan from parameters: table_id = index, table-wise placement
 * balanced by bytes (values + optimizer state; largest table first onto the
 * least-loaded shard, ties to the lowest shard) or row-wise over all shards.
 * On success *out is a new plan the caller frees with emb_plan_free. On
 * failure returns SR_EINVAL or SR_ENOMEM and writes a message to err. */
int emb_plan_create(const emb_plan_params *p, emb_plan **out, char *err, size_t errlen);

/* Parse a plan from JSON text; src names the text in messages ("plan.json").
 * Validates every field (see emb_plan_validate). Returns 0 and a new plan in
 * *out, else SR_EFORMAT (not JSON), SR_EINVAL (a bad field; err says which,
 * e.g. "plan.json: tables[3].dim: must be 1..1024"), SR_EVERSION or SR_ENOMEM. */
int emb_plan_parse(const char *json, const char *src, emb_plan **out, char *err, size_t errlen);

/* Read and parse the file at path (messages are prefixed with path). */
int emb_plan_load(const char *path, emb_plan **out, char *err, size_t errlen);

/* Write the plan to path (through a temporary file renamed into place,
 * common/outfile.h), indented, keys in canonical order. Returns 0, SR_EINVAL
 * if the plan does not validate, SR_EEXISTS for a folder at path (left as it
 * is), or SR_EIO (naming path; whatever was at path left as it was). */
int emb_plan_save(const emb_plan *plan, const char *path, char *err, size_t errlen);

/* Check every field; src prefixes messages. Returns 0 or SR_EINVAL. Used by
 * parse and create, and by code that edits a plan in place. */
int emb_plan_validate(const emb_plan *plan, const char *src, char *err, size_t errlen);

/* Deep copy. Returns NULL when out of memory. */
emb_plan *emb_plan_clone(const emb_plan *plan);

/* NULL-safe. */
void emb_plan_free(emb_plan *plan);

/* Canonical JSON (no whitespace, fixed key order, exact numbers) of the model
 * (with_placement = 0) or of the whole plan (1). Returns a malloc'd string
 * the caller frees, or NULL when out of memory. */
char *emb_plan_canonical(const emb_plan *plan, int with_placement);

/* SHA-256 hex fingerprints of the canonical forms into hex[EMB_FP_HEX].
 * Returns 0, SR_ENOMEM or SR_EBACKEND (libcrypto failed). */
int emb_plan_model_fingerprint(const emb_plan *plan, char hex[EMB_FP_HEX]);
int emb_plan_fingerprint(const emb_plan *plan, char hex[EMB_FP_HEX]);

/* Growth (a model trained on, with more ids to come): a plan whose bounded
 * tables have more rows and every other field (seed, names, dim, pooling,
 * each table's init_range, optimizer, placement, n_shards) the same. Rows
 * are in both fingerprints, so a grown plan has new ones; a row of the
 * smaller plan keeps its id and value, and a new row is a never-written row
 * (emb_row_init: from seed, table_id and row id alone).
 *
 * emb_plan_grow: a copy of p with each bounded table's rows raised to
 * rows[i] where that is larger (rows[n_tables]; unbounded tables stay so).
 * 0 and a new plan in *out (emb_plan_free), SR_EINVAL (a rows[i] that is no
 * bound, for a bounded table) or SR_ENOMEM, with the reason in err. */
int emb_plan_grow(const emb_plan *p, const uint64_t *rows, emb_plan **out, char *err,
                  size_t errlen);

/* 1 when b grows a (b is a with each bounded table's rows >= a's; a plan
 * grows itself), else 0 with the first difference in why ("tables[3] (t3):
 * dim differs", "tables[2] (t2): 90 rows, fewer than 100"). */
int emb_plan_grows(const emb_plan *a, const emb_plan *b, char *why, size_t len);

/* 1 when ck differs from made in nothing but each table's init range and
 * placement: what a plan made from the data and the trainer's flags cannot
 * say of a checkpoint's (a grown plan keeps its first init ranges and
 * placement, which the grown rows would not give). 0 otherwise, and when
 * out of memory. */
int emb_plan_agrees(const emb_plan *made, const emb_plan *ck);

/* Index of the table with table_id, or -1. */
int emb_plan_table_index(const emb_plan *plan, uint32_t table_id);

/* Shard holding row row_id of table (plan index). Table-wise: the table's
 * shard. Row-wise: shards[sr_mix64(row_id) % n] — a pure function of the row
 * id and the table's shard list, the same in every process. */
int emb_plan_shard_of(const emb_plan *plan, int table, uint64_t row_id);

/* Index of the first of ids[n] past the last row of table (plan index;
 * none in an unbounded table), or n. One branch-free pass (vectorised)
 * says whether any is, and the ids are walked one by one only then. */
size_t emb_plan_first_out_of_range(const emb_plan *plan, int table, const uint64_t *ids, size_t n);
/* 0 when every one of ids[n] is a row of table (emb_plan_first_out_of_range),
 * else SR_ERANGE with "WHAT: table T (NAME): row id X is out of range
 * 0..ROWS-1" in err, naming the first id past it ("WHAT: " left out when
 * what is NULL). */
int emb_plan_check_range(const emb_plan *plan, int table, const uint64_t *ids, size_t n,
                         const char *what, char *err, size_t errlen);

/* Value of a never-written row: out[j] for j < dim of table (plan index) is
 * uniform in [-a, a), a = (float)init_range, from
 *   bits = sr_philox(seed, row_id, ((uint64_t)table_id << 32) | (j / 4)).v[j % 4]
 *   out[j] = a * (2 * sr_u01f(bits) - 1)          (float arithmetic)
 * then, for an fp16 or bf16 table, rounded to the nearest value of that
 * format (ties to even), so that it is a weight the table can hold.
 * A pure function of (seed, table_id, row_id): every holder computes the
 * same bits. */
void emb_row_init(const emb_plan *plan, int table, uint64_t row_id, float *out);

#endif
