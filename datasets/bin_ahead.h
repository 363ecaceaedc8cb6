/* The next batch of a binary (bin or int32) file decoded ahead, on a helper
 * thread, while the caller trains on the one it has.
 *
 * After a read of n records at index k, ds_source starts the decoding of
 * [k + n, k + 2n) into the helper's own batch; the next read of those
 * records takes it by swapping the contents of the two batches (the
 * caller's old buffers become the helper's for the read after). Any other
 * read (another size, a seek, a batch of another capacity) waits for the
 * helper and decodes in the caller's thread. The records, their checks and
 * their errors are ds_bin_reader_read's either way: only the thread that
 * decodes them changes, never a bit. */
#ifndef SHARDREC_DATASETS_BIN_AHEAD_H
#define SHARDREC_DATASETS_BIN_AHEAD_H

#include <stdint.h>

#include "datasets/batch.h"
#include "datasets/binfmt.h"

typedef struct ds_bin_ahead ds_bin_ahead;

/* A helper for reader r (borrowed: it outlives the helper; nothing else
 * reads r while the helper lives) and batches of cap samples; ids taken
 * modulo mod as ds_bin_reader_read does. NULL when the thread or memory
 * cannot be had: the caller then decodes in its own thread. */
ds_bin_ahead *ds_bin_ahead_create(ds_bin_reader *r, uint64_t mod, int cap);

/* Records [index, index + n) into b, as ds_bin_reader_read(r, index, n,
 * mod, b) gives them: the batch decoded ahead when it is that one and b's
 * capacity is the helper's (*taken 1), else decoded here after the helper
 * is idle (*taken 0). */
int ds_bin_ahead_read(ds_bin_ahead *a, uint64_t index, int n, ds_batch *b, int *taken);

/* Begin decoding [index, index + n) on the helper (n <= cap). */
void ds_bin_ahead_start(ds_bin_ahead *a, uint64_t index, int n);

/* Stop the helper and free it. NULL-safe. */
void ds_bin_ahead_destroy(ds_bin_ahead *a);

#endif
