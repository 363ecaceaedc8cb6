/* A saved model (--save-model DIR, read by `shardrec eval`): the folder holds
 *   model.json  the dense architecture (flags that rebuild dense_config)
 *   plan.json   the sharding plan (tables, seed, optimizers, placement)
 *   dense.bin   the dense parameters (dense_model_save)
 *   rows/       every touched embedding row (the store's checkpoint)
 * Written under DIR.tmp and renamed into place, so a half-written model is
 * never mistaken for a good one. */
#ifndef SHARDREC_TRAIN_MODEL_DIR_H
#define SHARDREC_TRAIN_MODEL_DIR_H

#include <stddef.h>

#include "dense/model.h"
#include "embedding/plan.h"
#include "embedding/store.h"

/* Save; 0 or SR_E* with the reason in err. An existing DIR is replaced. */
int model_dir_save(const char *dir, const dense_config *cfg, const emb_plan *plan,
                   dense_model *model, emb_store *store, char *err, size_t errlen);

/* Read model.json into cfg (max_batch left as the caller set it) and
 * plan.json into *plan (caller frees). 0 or SR_E* with the reason in err. */
int model_dir_read_config(const char *dir, dense_config *cfg, emb_plan **plan, char *err,
                          size_t errlen);

/* Load dense.bin into model and rows/ into store. */
int model_dir_load_state(const char *dir, dense_model *model, emb_store *store, char *err,
                         size_t errlen);

/* The dense architecture as JSON (model.json; a checkpoint manifest's
 * "dense"), and back: parse fills cfg (max_batch left as the caller set it)
 * and validates it; src names the text in messages. */
struct cJSON;
struct cJSON *model_arch_json(const dense_config *cfg);
int model_arch_parse(const struct cJSON *j, const char *src, dense_config *cfg, char *err,
                     size_t errlen);


#endif
