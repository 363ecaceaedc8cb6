/* The removed-rows file (SREMBRMV v1): the row ids of one table an
 * incremental checkpoint's store removed since the checkpoint before it
 * (its tombstones), written beside the increment's table file of that
 * table as removed-<table_id>.bin (storage/ckpt_dir.h owns the name). A
 * reader of the chain deletes these rows before it lays the increment's
 * rows over the held ones. This module is the format's one owner.
 *
 * Little-endian:
 *   header (128 bytes): magic "SREMBRMV", u32 version (1), u32 table_id,
 *     u64 n_ids, char[64] model fingerprint (hex), zeros to 128;
 *   n_ids u64 row ids, strictly ascending, each below the table's rows;
 *   trailer: SHA-256 of header and ids (32 bytes).
 *
 * Written under PATH.tmp.PID, fsync'd and renamed, so PATH is whole or
 * absent. An increment written before the format had no such file: absent
 * reads as no removed rows. */
#ifndef SHARDREC_EMBEDDING_REMOVED_FILE_H
#define SHARDREC_EMBEDDING_REMOVED_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"

#define EMB_RMFILE_HEADER 128u
#define EMB_RMFILE_VERSION 1u

/* Sort ids[*n] and drop repeats in place (*n updated). */
void emb_rmfile_sort_unique(uint64_t *ids, size_t *n);

/* Write table tb's removed row ids (ids[n], strictly ascending; borrowed)
 * at path. 0, or SR_EINVAL (not ascending) / SR_ENOMEM / SR_EIO with the
 * file in err; nothing is left at path or beside it on failure. */
int emb_rmfile_write(const char *path, const emb_table *tb, const char *model_fp,
                     const uint64_t *ids, size_t n, char *err, size_t errlen);

/* Read table tb's removed row ids at path, checked whole (magic, version,
 * table, model fingerprint, size, order and range of every id, trailer),
 * into *ids (malloc'd, the caller's; NULL when none) and *n. An absent
 * file is no ids (0). 0, or SR_EIO / SR_ENOMEM / SR_EFORMAT / SR_EVERSION /
 * SR_EMISMATCH with the file (and the id's index) in err. */
int emb_rmfile_read(const char *path, const emb_table *tb, const char *model_fp, uint64_t **ids,
                    size_t *n, char *err, size_t errlen);

/* The id count of the removed-rows file at path, from its header (magic and
 * version checked, nothing else: for reports such as shardrec inspect). 0,
 * or SR_EIO / SR_EFORMAT / SR_EVERSION with the file in err. */
int emb_rmfile_count(const char *path, uint64_t *n, char *err, size_t errlen);

#endif
