/* The engine library (train/) called directly: batch slicing over
 * ranks, the job's double-buffered batches (the async prefetch swap), the
 * cursor's rewind after a recovery, and the checkpoint refusals of
 * train_ckpt_load. Real files in a temporary folder, a real in-memory store and
 * dense model. */
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "tests/check_main.h"
#include "storage/ckpt_dir.h"
#include "train/job_impl.h"
#include "tests/support/files.h"

static char *dir;

static void setup(void) {
  dir = tmpdir_make("train");
}

static void teardown(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
  free(dir);
}

/* A batch of n samples whose every field says which sample it is: label
 * i % 2, dense[i][k] = 100 i + k, feature f's bag = {1000 i + f}. */
static void fill_batch(ds_batch *b, int n, uint64_t first) {
  b->n = n;
  b->first_index = first;
  ck_assert_int_eq(ds_batch_reserve_ids(b, (size_t)n * DS_NUM_SPARSE), 0);
  size_t id = 0;
  for (int f = 0; f < DS_NUM_SPARSE; f++) {
    uint32_t *off = ds_batch_offsets(b, f);
    for (int i = 0; i < n; i++) {
      off[i] = (uint32_t)id;
      b->ids[id++] = 1000u * (uint64_t)i + (uint64_t)f;
    }
    off[n] = (uint32_t)id;
  }
  for (int i = 0; i < n; i++) {
    b->labels[i] = (float)(i % 2);
    for (int k = 0; k < DS_NUM_DENSE; k++) b->dense[i * DS_NUM_DENSE + k] = (float)(100 * i + k);
  }
}

/* fill_batch with inputs a model trains on: dense features scaled down. */
static void fill_train_batch(ds_batch *b, int n) {
  fill_batch(b, n, 0);
  for (int i = 0; i < n * DS_NUM_DENSE; i++) b->dense[i] = log1pf(b->dense[i]);
}

/* Every rank's slice of batches of 1..40 samples over 1..5 ranks: the slices
 * are the batch's samples in order, contiguous, sized q or q+1 with the
 * larger ones first, each with its own first_index. */
START_TEST(test_batch_slices) {
  ds_batch b, part;
  ck_assert_int_eq(ds_batch_init(&b, 40), 0);
  ck_assert_int_eq(ds_batch_init(&part, 41), 0);
  for (int n = 1; n <= 40; n++) {
    fill_batch(&b, n, 500);
    for (int size = 1; size <= 5; size++) {
      int lo = 0;
      for (int r = 0; r < size; r++) {
        int want = n / size + (r < n % size);
        ck_assert_int_eq(trainer_slice_count(n, r, size), want);
        ck_assert_int_eq(trainer_batch_slice(&b, r, size, &part), 0);
        ck_assert_int_eq(part.n, want);
        ck_assert_uint_eq(part.first_index, 500u + (uint64_t)lo);
        for (int i = 0; i < want; i++) {
          int g = lo + i;
          ck_assert_float_eq(part.labels[i], (float)(g % 2));
          ck_assert_float_eq(part.dense[i * DS_NUM_DENSE + 3], (float)(100 * g + 3));
          for (int f = 0; f < DS_NUM_SPARSE; f += 5) {
            const uint32_t *off = ds_batch_offsets(&part, f);
            ck_assert_uint_eq(off[i + 1] - off[i], 1);
            ck_assert_uint_eq(part.ids[off[i]], 1000u * (uint64_t)g + (uint64_t)f);
          }
        }
        lo += want;
      }
      ck_assert_int_eq(lo, n);
    }
  }
  /* A slice buffer too small for the largest slice is refused. */
  ds_batch tiny;
  ck_assert_int_eq(ds_batch_init(&tiny, 3), 0);
  fill_batch(&b, 40, 0);
  ck_assert_int_ne(trainer_batch_slice(&b, 0, 2, &tiny), 0);
  ds_batch_free(&tiny);
  ds_batch_free(&b);
  ds_batch_free(&part);
}
END_TEST

/* A TSV file of n samples; sample i has I1 = i (its dense[0] is log(1 + i))
 * and label i % 3 == 0. */
static void write_tsv(const char *path, int n) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < n; i++) {
    fprintf(f, "%d\t%d", i % 3 == 0, i);
    for (int k = 1; k < DS_NUM_DENSE; k++) fprintf(f, "\t%d", k);
    for (int c = 0; c < DS_NUM_SPARSE; c++) fprintf(f, "\t%08x", (unsigned)(i * 31 + c));
    fprintf(f, "\n");
  }
  ck_assert_int_eq(fclose(f), 0);
}

static ds_source *open_tsv(const char *path) {
  ds_source_opts o;
  memset(&o, 0, sizeof o);
  o.path = path;
  o.format = DS_FORMAT_TSV;
  o.id_mode = DS_IDS_MODULO;
  o.max_ind_range = 1000;
  o.read_ahead = -1;
  char err[512];
  ds_source *s = ds_source_open(&o, err, sizeof err);
  ck_assert_msg(s != NULL, "%s", err);
  return s;
}

/* The sample a batch row came from, from its I1. */
static int sample_of(const ds_batch *b, int i) {
  return (int)lroundf(expf(b->dense[i * DS_NUM_DENSE]) - 1.0f);
}

/* The ring of batches read ahead: batches read after this step's land in
 * the next slots, this step's is untouched by them, and taking turns the
 * ring (no copy), slices included; the split's end comes after the last
 * partial batch, and a full ring is refused. */
START_TEST(test_prefetch_swap) {
  char path[512];
  snprintf(path, sizeof path, "%s/d.tsv", dir);
  write_tsv(path, 28);
  ds_source *src = open_tsv(path);
  job_batches q;
  char err[256];
  ck_assert_int_eq(job_batches_init(&q, 8, 1, 2, 2), 0); /* rank 1 of 2, two ahead */
  ck_assert_int_eq(job_batches_take(&q, src, 8, err, sizeof err), 8);
  ck_assert_uint_eq(job_batches_global(&q)->first_index, 0);
  ck_assert_int_eq(job_batches_mine(&q)->n, 4);
  ck_assert_uint_eq(job_batches_mine(&q)->first_index, 4); /* rank 1: samples 4..7 */
  ck_assert_int_eq(sample_of(job_batches_mine(&q), 0), 4);
  int got = -1;
  ck_assert_int_eq(job_batches_read_ahead(&q, src, 8, &got, err, sizeof err), 0);
  ck_assert_int_eq(got, 8);
  ck_assert_int_eq(job_batches_read_ahead(&q, src, 8, &got, err, sizeof err), 0);
  ck_assert_int_eq(got, 8);
  ck_assert_int_eq(q.ahead, 2);
  ck_assert_int_eq(job_batches_read_ahead(&q, src, 8, &got, err, sizeof err), SR_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "full"));
  ck_assert_uint_eq(job_batches_mine_at(&q, 1)->first_index, 12);
  ck_assert_int_eq(sample_of(job_batches_mine_at(&q, 1), 0), 12);
  ck_assert_int_eq(sample_of(job_batches_mine_at(&q, 2), 0), 20);
  /* This step's batch is untouched by reading the next ones. */
  ck_assert_uint_eq(job_batches_global(&q)->first_index, 0);
  ck_assert_int_eq(sample_of(job_batches_mine(&q), 3), 7);
  const float *next_labels = job_batches_mine_at(&q, 1)->labels;
  ck_assert_int_eq(job_batches_take(&q, src, 8, err, sizeof err), 8);
  ck_assert_int_eq(q.ahead, 1);
  ck_assert_ptr_eq(job_batches_mine(&q)->labels, next_labels); /* turned, not copied */
  ck_assert_uint_eq(job_batches_global(&q)->first_index, 8);
  ck_assert_int_eq(sample_of(job_batches_mine(&q), 0), 12);
  ck_assert_int_eq(sample_of(job_batches_mine(&q), 3), 15);
  /* The ring wraps: the slot of the first step holds the fourth batch. */
  ck_assert_int_eq(job_batches_read_ahead(&q, src, 8, &got, err, sizeof err), 0);
  ck_assert_int_eq(got, 4);
  ck_assert_int_eq(job_batches_take(&q, src, 8, err, sizeof err), 8);
  ck_assert_int_eq(sample_of(job_batches_mine(&q), 0), 20);
  /* The end of the split read ahead adds nothing. */
  ck_assert_int_eq(job_batches_read_ahead(&q, src, 8, &got, err, sizeof err), 0);
  ck_assert_int_eq(got, 0);
  ck_assert_int_eq(q.ahead, 1);
  ck_assert_int_eq(job_batches_take(&q, src, 8, err, sizeof err), 4);
  ck_assert_uint_eq(job_batches_global(&q)->first_index, 24);
  ck_assert_int_eq(job_batches_mine(&q)->n, 2);
  ck_assert_int_eq(sample_of(job_batches_mine(&q), 0), 26);
  ck_assert_int_eq(job_batches_take(&q, src, 8, err, sizeof err), 0);
  job_batches_free(&q);
  job_batches_free(&q); /* freed twice: harmless (zeroed) */
  ds_source_destroy(src);
}
END_TEST

/* A recovery rewinds the cursor to the checkpoint: its step and epoch, the
 * epoch's steps up to the sample index (rounded up: a partial batch is a
 * step), the progress figures afresh, the batches read ahead dropped; with
 * the data sought to the checkpoint's sample, the next step's batch starts
 * there. */
START_TEST(test_rewind) {
  char path[512];
  snprintf(path, sizeof path, "%s/d.tsv", dir);
  write_tsv(path, 64);
  ds_source *src = open_tsv(path);
  job_batches q;
  char err[256];
  ck_assert_int_eq(job_batches_init(&q, 8, 0, 1, 2), 0);
  job_cursor c = {.step = 9, .epoch = 1, .epoch_step = 2, .loss_sum = 3.5, .loss_n = 2,
                  .samples_since = 16, .t_last = 1.0};
  for (int k = 0; k < 3; k++) ck_assert_int_eq(job_batches_take(&q, src, 8, err, sizeof err), 8);
  int got;
  ck_assert_int_eq(job_batches_read_ahead(&q, src, 8, &got, err, sizeof err), 0);
  ck_assert_int_eq(job_batches_read_ahead(&q, src, 8, &got, err, sizeof err), 0);
  ck_assert_int_eq(q.ahead, 2);
  train_ckpt_state st = {.step = 5, .epoch = 0, .sample_index = 40, .loss_sum = 1.25, .loss_n = 3};
  job_rewind(&c, &q, &st, 8, 0, 42.0);
  ck_assert_int_eq(c.step, 5);
  ck_assert_int_eq(c.epoch, 0);
  ck_assert_int_eq(c.epoch_step, 5);
  ck_assert_int_eq(c.loss_n, 0);
  ck_assert(c.loss_sum == 0.0);
  ck_assert_int_eq(c.samples_since, 0);
  ck_assert(c.t_last == 42.0);
  ck_assert_int_eq(q.ahead, 0);
  ck_assert_int_eq(ds_source_seek(src, st.sample_index), 0);
  ck_assert_int_eq(job_batches_take(&q, src, 8, err, sizeof err), 8);
  ck_assert_uint_eq(job_batches_global(&q)->first_index, 40);
  ck_assert_int_eq(sample_of(job_batches_global(&q), 0), 40);
  st.sample_index = 41; /* a partial batch ended the checkpointed step */
  job_rewind(&c, &q, &st, 8, 1, 43.0); /* no line at its step: the window goes on */
  ck_assert_int_eq(c.epoch_step, 6);
  ck_assert_int_eq(c.loss_n, 3);
  ck_assert(c.loss_sum == 1.25);
  job_batches_free(&q);
  ds_source_destroy(src);
}
END_TEST

/* A small model: 26 tables of 50 rows, dim 4, bottom 13-8-4, top 8-1. */
typedef struct {
  emb_plan *plan;
  emb_store *store;
  trainer *t;
} small_model;

static void small_open(small_model *m, uint64_t seed) {
  uint64_t rows[DS_NUM_SPARSE];
  for (int i = 0; i < DS_NUM_SPARSE; i++) rows[i] = 50;
  emb_plan_params pp = {.n_tables = DS_NUM_SPARSE, .rows = rows, .dim = 4,
                        .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1}, .seed = seed,
                        .n_shards = 2};
  char err[512];
  ck_assert_int_eq(emb_plan_create(&pp, &m->plan, err, sizeof err), 0);
  m->store = emb_store_create_local(m->plan, err, sizeof err);
  ck_assert_msg(m->store != NULL, "%s", err);
  dense_config cfg = {.n_dense = 13, .bot = {13, 8, 4}, .n_bot = 3, .top = {8, 1}, .n_top = 2,
                      .n_sparse = DS_NUM_SPARSE, .emb_dim = 4,
                      .interaction = DENSE_INTERACT_DOT, .max_batch = 16};
  ck_assert_int_eq(dense_config_validate(&cfg, err, sizeof err), 0);
  dense_opt_config oc = dense_opt_defaults(DENSE_OPT_ADAGRAD);
  m->t = trainer_create(m->plan, m->store, &cfg, &oc, seed, err, sizeof err);
  ck_assert_msg(m->t != NULL, "%s", err);
}

static void small_close(small_model *m) {
  trainer_destroy(m->t);
  emb_store_destroy(m->store);
  emb_plan_free(m->plan);
}

/* Train two steps on a batch of the generated file so that the rows and the
 * dense part differ from a fresh model's. */
static void small_train(small_model *m) {
  ds_batch b;
  ck_assert_int_eq(ds_batch_init(&b, 16), 0);
  fill_train_batch(&b, 16);
  for (int f = 0; f < DS_NUM_SPARSE; f++)
    for (int i = 0; i < 16; i++) b.ids[ds_batch_offsets(&b, f)[i]] %= 50;
  float loss;
  for (int s = 0; s < 2; s++)
    ck_assert_int_eq(trainer_step(m->t, &b, s, 0.05f, 0.05f, &loss), 0);
  ds_batch_free(&b);
}

/* The dense parameters' bits, summed: differs when any parameter does. */
static double param0(small_model *m) {
  size_t n;
  const float *p = dense_model_params(trainer_model(m->t), &n);
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)p[i] * (double)(i % 7 + 1);
  return s;
}

/* Rows 0..49 of table 0 into out[50 * 4]. */
static void rows0(small_model *m, float *out) {
  uint64_t ids[50];
  for (int i = 0; i < 50; i++) ids[i] = (uint64_t)i;
  const uint64_t *ip[DS_NUM_SPARSE] = {ids};
  size_t counts[DS_NUM_SPARSE] = {50};
  float *op[DS_NUM_SPARSE] = {out};
  emb_idset set = {.n_tables = DS_NUM_SPARSE, .ids = ip, .counts = counts};
  ck_assert_int_eq(emb_store_lookup_begin(m->store, 0, &set, op), 0);
  ck_assert_int_eq(emb_store_lookup_wait(m->store), 0);
}

/* Batch s of the look-ahead test: 16 samples from first_index 16 s, ids
 * shifted by step so that every step's rows differ. */
static void fill_step_batch(ds_batch *b, int s) {
  fill_train_batch(b, 16);
  b->first_index = 16u * (uint64_t)s;
  for (int f = 0; f < DS_NUM_SPARSE; f++)
    for (int i = 0; i < 16; i++) {
      uint64_t *id = &b->ids[ds_batch_offsets(b, f)[i]];
      *id = (*id + 7u * (uint64_t)s + (uint64_t)(i % 3)) % 50;
    }
}

/* Batches handed ahead (trainer_ahead, two steps ahead as --prefetch-depth
 * 2 does, with a test pass, a drop and a wrong batch in between) give the
 * losses of steps without them, bit for bit: each step trains on its own
 * batch's deduplicated ids whether they were deduplicated ahead or not. */
START_TEST(test_ahead_same_bits) {
  enum { STEPS = 8 };
  static ds_batch b[STEPS], wrong;
  for (int s = 0; s < STEPS; s++) {
    ck_assert_int_eq(ds_batch_init(&b[s], 16), 0);
    fill_step_batch(&b[s], s);
  }
  ck_assert_int_eq(ds_batch_init(&wrong, 16), 0);
  fill_step_batch(&wrong, 3);
  wrong.first_index = 16u * 6u + 1u; /* not step 6's batch */
  float plain[STEPS], ahead[STEPS], prob[16];
  small_model m;
  small_open(&m, 5);
  for (int s = 0; s < STEPS; s++)
    ck_assert_int_eq(trainer_step(m.t, &b[s], s, 0.05f, 0.05f, &plain[s]), 0);
  small_close(&m);
  small_open(&m, 5);
  for (int s = 0; s < STEPS; s++) {
    for (int k = 1; k <= 2 && s + k < STEPS; k++)
      if (s == 0 || k == 2 || s == 4)  /* the window's new batch (all after a drop) */
        ck_assert_int_eq(trainer_ahead(m.t, s + k == 6 && s == 4 ? &wrong : &b[s + k], s + k), 0);
    ck_assert_int_eq(trainer_step(m.t, &b[s], s, 0.05f, 0.05f, &ahead[s]), 0);
    if (s == 1) ck_assert_int_eq(trainer_predict(m.t, &b[0], s + 1, prob), 0);
    if (s == 3) trainer_ahead_drop(m.t); /* a rewind: step 4 and 5 are deduplicated again */
  }
  for (int s = 0; s < STEPS; s++)
    ck_assert_msg(memcmp(&plain[s], &ahead[s], sizeof(float)) == 0, "step %d: %.9g vs %.9g", s,
                  (double)plain[s], (double)ahead[s]);
  ck_assert(plain[0] != plain[1]);
  small_close(&m);
  for (int s = 0; s < STEPS; s++) ds_batch_free(&b[s]);
  ds_batch_free(&wrong);
}
END_TEST

/* A step whose loss is not finite stops before anything of it is applied
 * (no row pushed, no dense update); a dense update that leaves a parameter
 * non-finite is an error too, so the job stops instead of training on. */
START_TEST(test_step_nonfinite) {
  small_model m;
  small_open(&m, 11);
  small_train(&m);
  ds_batch b;
  ck_assert_int_eq(ds_batch_init(&b, 16), 0);
  fill_train_batch(&b, 16);
  for (int f = 0; f < DS_NUM_SPARSE; f++)
    for (int i = 0; i < 16; i++) b.ids[ds_batch_offsets(&b, f)[i]] %= 50;
  static float before[200], after[200];
  rows0(&m, before);
  size_t np;
  float *p = dense_model_params(trainer_model(m.t), &np);
  const float keep = p[np - 1]; /* the top MLP's last bias: every logit goes NaN */
  p[np - 1] = NAN;
  float loss = 0;
  ck_assert_int_eq(trainer_step(m.t, &b, 2, 0.05f, 0.05f, &loss), SR_ERANGE);
  ck_assert_msg(strstr(trainer_errmsg(m.t), "the loss is nan (not finite)"), "%s",
                trainer_errmsg(m.t));
  rows0(&m, after);
  ck_assert_msg(!memcmp(before, after, sizeof before), "rows changed by a step with a NaN loss");
  p[np - 1] = keep;
  /* A finite loss, an update that overflows (an infinite dense rate). */
  ck_assert_int_eq(trainer_step(m.t, &b, 2, INFINITY, 0.05f, &loss), SR_ERANGE);
  ck_assert(isfinite(loss));
  ck_assert_msg(strstr(trainer_errmsg(m.t), "the dense update left parameter"), "%s",
                trainer_errmsg(m.t));
  ds_batch_free(&b);
  small_close(&m);
}
END_TEST

static void flip_byte(const char *path, long off) {
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fseek(f, off, SEEK_SET), 0);
  int c = fgetc(f);
  ck_assert_int_ne(c, EOF);
  ck_assert_int_eq(fseek(f, off, SEEK_SET), 0);
  fputc(c ^ 0x40, f);
  ck_assert_int_eq(fclose(f), 0);
}

/* train_ckpt_load refuses a checkpoint of another batch size or optimizer,
 * another model (seed), a damaged dense.bin and one without DONE, each with
 * a message naming the problem, and changes nothing when it refuses; the
 * good checkpoint loads back the saved parameters. */
START_TEST(test_checkpoint_refusals) {
  small_model m;
  small_open(&m, 7);
  small_train(&m);
  char root[512], ck[600], err[1024];
  snprintf(root, sizeof root, "%s/ck", dir);
  train_ckpt_settings set = {"adagrad", "adagrad", 0.05, 0.05, 0, 0, 0, 16, NULL, NULL, NULL, NULL};
  train_ckpt_state st = {.step = 2, .epoch = 0, .sample_index = 32}, got;
  ck_assert_int_eq(train_ckpt_save(root, 0, m.plan, m.store, "local", trainer_model(m.t),
                             trainer_dense_opt(m.t), NULL, &st, &set, err, sizeof err), 0);
  ck_assert_int_eq(train_ckpt_resolve(root, ck, sizeof ck, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(ck, "step-2"));
  double saved = param0(&m);

  small_model fresh;
  small_open(&fresh, 7);
  double before = param0(&fresh);
  ck_assert(before != saved);
  train_ckpt_settings other = set;
  other.batch = 32;
  ck_assert_int_eq(train_ckpt_load(ck, fresh.plan, fresh.store, "local", trainer_model(fresh.t),
                             trainer_dense_opt(fresh.t), &other, &got, err, sizeof err),
                   SR_EMISMATCH);
  ck_assert_ptr_nonnull(strstr(err, "--mini-batch-size 16"));
  other = set;
  other.dense_optimizer = "sgd";
  ck_assert_int_eq(train_ckpt_load(ck, fresh.plan, fresh.store, "local", trainer_model(fresh.t),
                             trainer_dense_opt(fresh.t), &other, &got, err, sizeof err),
                   SR_EMISMATCH);
  ck_assert_ptr_nonnull(strstr(err, "--optimizer adagrad"));
  ck_assert(param0(&fresh) == before);

  small_model seed8;
  small_open(&seed8, 8);
  ck_assert_int_eq(train_ckpt_load(ck, seed8.plan, seed8.store, "local", trainer_model(seed8.t),
                             trainer_dense_opt(seed8.t), &set, &got, err, sizeof err),
                   SR_EMISMATCH);
  small_close(&seed8);

  /* The good checkpoint loads: the saved parameters and position. */
  ck_assert_int_eq(train_ckpt_load(ck, fresh.plan, fresh.store, "local", trainer_model(fresh.t),
                             trainer_dense_opt(fresh.t), &set, &got, err, sizeof err), 0);
  ck_assert(param0(&fresh) == saved);
  ck_assert_int_eq(got.step, 2);
  ck_assert_uint_eq(got.sample_index, 32);

  /* A flipped byte in dense.bin: refused, nothing loaded. */
  small_model third;
  small_open(&third, 7);
  char p[700];
  snprintf(p, sizeof p, "%s/dense.bin", ck);
  flip_byte(p, 300);
  ck_assert_int_lt(train_ckpt_load(ck, third.plan, third.store, "local", trainer_model(third.t),
                             trainer_dense_opt(third.t), &set, &got, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(err, "dense.bin"));
  ck_assert(param0(&third) == before);
  flip_byte(p, 300);

  /* Without DONE the folder is no checkpoint: --resume DIR finds none, and
   * naming it is refused. */
  snprintf(p, sizeof p, "%s/DONE", ck);
  ck_assert_int_eq(unlink(p), 0);
  char ck2[600];
  ck_assert_int_eq(train_ckpt_resolve(root, ck2, sizeof ck2, err, sizeof err), SR_ENOTFOUND);
  ck_assert_int_lt(train_ckpt_load(ck, third.plan, third.store, "local", trainer_model(third.t),
                             trainer_dense_opt(third.t), &set, &got, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(err, "DONE"));
  ck_assert(param0(&third) == before);
  small_close(&third);
  small_close(&fresh);
  small_close(&m);
}
END_TEST

/* dir/ then folders of 200 'd's (made) while the path is under len
 * characters, then a last name of 'r's to len (not made); into out
 * (SR_PATH_MAX). */
static void deep_path(char *out, size_t len) {
  ck_assert_int_eq(sr_path(out, SR_PATH_MAX, "%s", dir), 0);
  while (strlen(out) + 201 < len) {
    size_t n = strlen(out);
    out[n] = '/';
    memset(out + n + 1, 'd', 200);
    out[n + 201] = 0;
  }
  ck_assert_int_eq(sr_mkdirs(out), 0);
  size_t n = strlen(out);
  out[n] = '/';
  memset(out + n + 1, 'r', len - n - 1);
  out[len] = 0;
}

/* Entries of the folder path. */
static int entries(const char *path) {
  char **names;
  int n;
  ck_assert_int_eq(sr_list_dir(path, &names, &n), 0);
  sr_paths_free(names, n);
  return n;
}

/* A checkpoint root too long for the paths under it (train_ckpt_root_room):
 * train_ckpt_save is SR_ERANGE naming the root's start, and makes nothing (the
 * root is not created; a folder named as the root cut short, and its file,
 * survive). One character shorter it saves and loads back. train_ckpt_resolve
 * and train_ckpt_load of paths too long, and ckpt_dir_replace of a folder whose
 * aside name is too long, are SR_ERANGE, nothing moved. */
START_TEST(test_checkpoint_path_too_long) {
  small_model m;
  small_open(&m, 7);
  small_train(&m);
  train_ckpt_settings set = {"adagrad", "adagrad", 0.05, 0.05, 0, 0, 0, 16, NULL, NULL, NULL, NULL};
  train_ckpt_state st = {.step = 2, .epoch = 0, .sample_index = 32}, got;
  size_t limit = SR_PATH_MAX - train_ckpt_root_room(); /* a root fits in limit bytes */
  char root[SR_PATH_MAX], parent[SR_PATH_MAX], sentinel[SR_PATH_MAX], keep[SR_PATH_MAX];
  char err[1024];
  deep_path(root, limit);
  ck_assert_int_eq(sr_path(parent, sizeof parent, "%.*s", (int)(strrchr(root, '/') - root), root), 0);
  ck_assert_int_eq(sr_path(sentinel, sizeof sentinel, "%.*s", (int)limit - 8, root), 0);
  ck_assert_int_eq(mkdir(sentinel, 0777), 0);
  ck_assert_int_eq(sr_path(keep, sizeof keep, "%s/keep", sentinel), 0);
  FILE *f = fopen(keep, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  int rc = train_ckpt_save(root, 0, m.plan, m.store, "local", trainer_model(m.t),
                     trainer_dense_opt(m.t), NULL, &st, &set, err, sizeof err);
  ck_assert_msg(rc == SR_ERANGE, "rc %d: %s", rc, err);
  char want[128];
  snprintf(want, sizeof want, "%.64s...: path too long (over %zu characters)", root, limit - 1);
  ck_assert_str_eq(err, want);
  ck_assert_int_eq(entries(parent), 1); /* the sentinel only: no root, no .step-N.tmp */
  ck_assert(sr_is_file(keep));

  /* One character shorter: saved, resolved and loaded back. */
  root[limit - 1] = 0;
  ck_assert_int_eq(train_ckpt_save(root, 0, m.plan, m.store, "local", trainer_model(m.t),
                             trainer_dense_opt(m.t), NULL, &st, &set, err, sizeof err), 0);
  char ck[SR_PATH_MAX];
  ck_assert_int_eq(train_ckpt_resolve(root, ck, sizeof ck, err, sizeof err), 0);
  small_model fresh;
  small_open(&fresh, 7);
  ck_assert_int_eq(train_ckpt_load(ck, fresh.plan, fresh.store, "local", trainer_model(fresh.t),
                             trainer_dense_opt(fresh.t), &set, &got, err, sizeof err), 0);
  ck_assert(param0(&fresh) == param0(&m));
  ck_assert_int_eq(entries(parent), 2);

  /* --resume and load of paths too long: refused, out never a cut name. */
  char longer[SR_PATH_MAX + 64];
  snprintf(longer, sizeof longer, "%s/%0*d/../step-2", root, 4090 - (int)strlen(root), 0);
  ck_assert_int_eq(train_ckpt_resolve(longer, ck, sizeof ck, err, sizeof err), SR_ERANGE);
  ck_assert_str_eq(ck, "");
  ck_assert_ptr_nonnull(strstr(err, "path too long"));
  ck_assert_int_eq(train_ckpt_load(longer, fresh.plan, fresh.store, "local", trainer_model(fresh.t),
                             trainer_dense_opt(fresh.t), &set, &got, err, sizeof err),
                   SR_ERANGE);
  ck_assert_ptr_nonnull(strstr(err, "path too long"));

  /* ckpt_dir_replace of a folder whose name leaves no room for another
   * beside it: exchanged in one rename, no name made. */
  char dir2[SR_PATH_MAX], tmp2[SR_PATH_MAX], f2[SR_PATH_MAX + 8];
  deep_path(dir2, SR_PATH_MAX - 4);
  ck_assert_int_eq(mkdir(dir2, 0777), 0);
  ck_assert_int_eq(sr_path(tmp2, sizeof tmp2, "%s/tmp2", dir), 0);
  ck_assert_int_eq(mkdir(tmp2, 0777), 0);
  snprintf(f2, sizeof f2, "%s/step-1", tmp2);
  ck_assert_int_eq(mkdir(f2, 0777), 0);
  ck_assert_msg(ckpt_dir_replace(tmp2, dir2, NULL, err, sizeof err) == 0, "%s", err);
  ck_assert(!sr_is_dir(tmp2));
  int fd2 = open(dir2, O_RDONLY | O_DIRECTORY); /* dir2/step-1 is too long a path */
  struct stat st2;
  ck_assert(fd2 >= 0 && fstatat(fd2, "step-1", &st2, 0) == 0 && S_ISDIR(st2.st_mode));
  close(fd2);
  small_close(&fresh);
  small_close(&m);
}
END_TEST

/* The manifest records the dense kernels, OpenBLAS's version and core, and
 * the data's identity; train_ckpt_kernels_differ and train_ckpt_data_differs
 * name both sides when one differs, say nothing when all agree or the
 * checkpoint records none (an older one). */
START_TEST(test_checkpoint_kernels) {
  small_model m;
  small_open(&m, 7);
  small_train(&m);
  char root[512], ck[600], err[1024], msg[1024];
  snprintf(root, sizeof root, "%s/kern", dir);
  train_ckpt_settings set = {"adagrad", "adagrad", 0.05, 0.05, 0,      0,
                             0,         16,        "avx2", "0.3.21", "Zen", "tsv 1000 bytes"};
  train_ckpt_state st = {.step = 2, .epoch = 0, .sample_index = 32};
  ck_assert_int_eq(train_ckpt_save(root, 0, m.plan, m.store, "local", trainer_model(m.t),
                             trainer_dense_opt(m.t), NULL, &st, &set, err, sizeof err), 0);
  ck_assert_int_eq(train_ckpt_resolve(root, ck, sizeof ck, err, sizeof err), 0);
  ck_assert_int_eq(train_ckpt_kernels_differ(ck, &set, msg, sizeof msg), 0);
  train_ckpt_settings other = set;
  other.dense_kernels = "baseline";
  ck_assert_int_eq(train_ckpt_kernels_differ(ck, &other, msg, sizeof msg), 1);
  ck_assert_msg(strstr(msg, "dense kernels avx2, OpenBLAS 0.3.21, core Zen") &&
                    strstr(msg, "this run has dense kernels baseline, OpenBLAS 0.3.21, core Zen"),
                "%s", msg);
  other = set;
  other.blas_core = "SkylakeX";
  ck_assert_int_eq(train_ckpt_kernels_differ(ck, &other, msg, sizeof msg), 1);
  ck_assert_ptr_nonnull(strstr(msg, "core SkylakeX"));
  other = set;
  other.blas_version = "0.3.26";
  ck_assert_int_eq(train_ckpt_kernels_differ(ck, &other, msg, sizeof msg), 1);
  /* The data's identity: the same data, other data, or none said. */
  ck_assert_int_eq(train_ckpt_data_differs(ck, &set, msg, sizeof msg), 0);
  other = set;
  other.data_identity = "tsv 2000 bytes";
  ck_assert_int_eq(train_ckpt_data_differs(ck, &other, msg, sizeof msg), 1);
  ck_assert_msg(strstr(msg, "was trained on other data (tsv 1000 bytes; this run's: tsv 2000 bytes)"),
                "%s", msg);
  /* Recorded as bytes alone (before the ends' CRC): the same bytes are the
   * same data. */
  other.data_identity = "tsv 1000 bytes, ends crc32 0a1b2c3d";
  ck_assert_int_eq(train_ckpt_data_differs(ck, &other, msg, sizeof msg), 0);
  other.data_identity = NULL;
  ck_assert_int_eq(train_ckpt_data_differs(ck, &other, msg, sizeof msg), 0);
  /* written without them: nothing to compare */
  snprintf(root, sizeof root, "%s/kern-none", dir);
  set.dense_kernels = set.blas_version = set.blas_core = set.data_identity = NULL;
  ck_assert_int_eq(train_ckpt_save(root, 0, m.plan, m.store, "local", trainer_model(m.t),
                             trainer_dense_opt(m.t), NULL, &st, &set, err, sizeof err), 0);
  ck_assert_int_eq(train_ckpt_resolve(root, ck, sizeof ck, err, sizeof err), 0);
  ck_assert_int_eq(train_ckpt_kernels_differ(ck, &other, msg, sizeof msg), 0);
  other.data_identity = "tsv 2000 bytes";
  ck_assert_int_eq(train_ckpt_data_differs(ck, &other, msg, sizeof msg), 0);
  small_close(&m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("train_engine");
  TCase *tc = tcase_create("engine");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_batch_slices);
  tcase_add_test(tc, test_prefetch_swap);
  tcase_add_test(tc, test_rewind);
  tcase_add_test(tc, test_checkpoint_refusals);
  tcase_add_test(tc, test_checkpoint_path_too_long);
  tcase_add_test(tc, test_step_nonfinite);
  tcase_add_test(tc, test_ahead_same_bits);
  tcase_add_test(tc, test_checkpoint_kernels);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
