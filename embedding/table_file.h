/* The embedding table file (SREMBTAB v1, v2): one table's stored rows, the
 * in-process store's checkpoint (embedding/store_local.c) and what
 * resharding those checkpoints reads and writes (embedding/reshard_files.c).
 * This module is the format's one owner.
 *
 * Little-endian:
 *   header (256 bytes): magic "SREMBTAB", u32 version (1), u32 header bytes
 *     (256), u32 table_id, u32 dim, u32 state floats, u32 optimizer kind,
 *     u64 n_rows, u64 record bytes (8 + 4 (dim + state)), char[64] model
 *     fingerprint (hex), zeros to 256 (reserved);
 *   n_rows records in strictly ascending row id: u64 row_id, float
 *     value[dim], float state[state floats];
 *   trailer: SHA-256 of header and records (32 bytes).
 * Version 2, the file of an fp16 or bf16 table (plan.h emb_precision):
 *   the header's u32 at byte 112 is the precision (1 fp16, 2 bf16), record
 *   bytes are 8 + 2 dim + 4 state, and a record's value is dim 16-bit
 *   values of that format (common/half.h); state stays float. An fp32
 *   table's file is version 1 as ever. put takes and next gives floats
 *   whatever the version; a file is read only for a table of its precision.
 *
 * A file is written under PATH.tmp.PID and renamed to PATH once complete
 * (fsync'd first), so PATH is whole or absent. A reader checks the header
 * against the table it expects (table_id, dim, state floats, optimizer,
 * model fingerprint) and the file's size before reading a record, each
 * record's order and range as it goes, and the trailer at the end.
 *
 * The table expected is a plan table (emb_table, its state floats from its
 * optimizer) and the model fingerprint (EMB_FP_HEX, embedding/plan.h) of
 * its plan. Handles are used by one thread at a time. */
#ifndef SHARDREC_EMBEDDING_TABLE_FILE_H
#define SHARDREC_EMBEDDING_TABLE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"

#define EMB_TABFILE_HEADER 256u
#define EMB_TABFILE_TRAILER 32u
#define EMB_TABFILE_VERSION 1u
#define EMB_TABFILE_VERSION_16 2u

/* emb_tabfile_create's n_rows when the count is known only at the end. */
#define EMB_TABFILE_COUNT_LATER UINT64_MAX

typedef struct emb_tabfile_writer emb_tabfile_writer;
typedef struct emb_tabfile_reader emb_tabfile_reader;

/* Start writing table tb's file at path (under path.tmp.PID). n_rows: the
 * records that will be put, so the SHA-256 is computed as they are written;
 * EMB_TABFILE_COUNT_LATER: any number, the header's count is written at
 * commit and the file is read back once to compute the trailer. *out owned
 * by the caller until emb_tabfile_commit or emb_tabfile_abort. 0, or SR_EIO
 * / SR_ENOMEM with the file in err. */
int emb_tabfile_create(const char *path, const emb_table *tb, const char *model_fp,
                       uint64_t n_rows, emb_tabfile_writer **out, char *err, size_t errlen);

/* Append one record: row_id (above the last one put) and vals[dim + state
 * floats] (borrowed). 0, or SR_EINVAL (row id not ascending, more records
 * than n_rows) or SR_EIO, with the reason in err; after a failure only
 * emb_tabfile_abort is left to call. */
int emb_tabfile_put(emb_tabfile_writer *w, uint64_t row_id, const float *vals, char *err,
                    size_t errlen);

/* Records put so far. */
uint64_t emb_tabfile_written(const emb_tabfile_writer *w);

/* Finish: the header's count, the trailer, fsync, rename to path. Frees w
 * whatever happens. 0, or SR_EINVAL (fewer records than n_rows) / SR_EIO
 * with the file in err; on failure nothing is left at path or beside it. */
int emb_tabfile_commit(emb_tabfile_writer *w, char *err, size_t errlen);

/* Drop the file being written and free w. NULL-safe. */
void emb_tabfile_abort(emb_tabfile_writer *w);

/* Open table tb's file at path and check its header and size. *out owned
 * by the caller (emb_tabfile_close). 0, or, with the file named in err:
 * SR_ENOTFOUND (no file) / SR_EIO (cannot open or read), SR_EFORMAT ("too
 * short to be a table file", "not a shardrec embedding table file (bad
 * magic)", "torn or truncated file"), SR_EVERSION, SR_EMISMATCH (another
 * table, dim, state or optimizer; "written under model fingerprint ...").
 * Nothing is left open on failure. */
int emb_tabfile_open(const char *path, const emb_table *tb, const char *model_fp,
                     emb_tabfile_reader **out, char *err, size_t errlen);

/* The header's record count; the file's path. */
uint64_t emb_tabfile_rows(const emb_tabfile_reader *r);
const char *emb_tabfile_path(const emb_tabfile_reader *r);

/* The next record: 1 with *row_id and *vals (dim + state floats, valid
 * until the next call on r), or 0 at the end, once the trailer has been
 * checked. SR_EFORMAT for a record out of order or past the table's rows
 * ("record N: row id X out of order or range"), SR_ECHECKSUM at the end
 * ("checksum mismatch (file damaged)"), SR_EIO; the file named in err.
 * After a failure only emb_tabfile_close is left to call. */
int emb_tabfile_next(emb_tabfile_reader *r, uint64_t *row_id, const float **vals, char *err,
                     size_t errlen);

/* Called with each record by emb_tabfile_read_all; nonzero stops the read
 * and is returned. */
typedef int (*emb_tabfile_fn)(void *ctx, uint64_t row_id, const float *vals);

/* Every remaining record of r to fn, then the trailer. A record out of
 * order or range is reported after the trailer is checked, so a damaged
 * file reads as damaged (SR_ECHECKSUM), not as misordered. 0 or SR_E* as
 * emb_tabfile_next, or fn's nonzero return. */
int emb_tabfile_read_all(emb_tabfile_reader *r, emb_tabfile_fn fn, void *ctx, char *err,
                         size_t errlen);

/* emb_tabfile_open, emb_tabfile_read_all and emb_tabfile_close: read and
 * verify the whole file at path. */
int emb_tabfile_read(const char *path, const emb_table *tb, const char *model_fp,
                     emb_tabfile_fn fn, void *ctx, char *err, size_t errlen);

/* NULL-safe. */
void emb_tabfile_close(emb_tabfile_reader *r);

#endif
