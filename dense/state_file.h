/* The dense state file (a checkpoint's dense.bin): a dense model's
 * parameters and, optionally, its dense optimizer's state, in one file.
 *
 * Format SRCKDENS version 1, little-endian:
 *   offset  0  magic "SRCKDENS"
 *           8  u32 version (1)
 *          12  u32 header bytes (256)
 *          16  u64 parameters (floats)
 *          24  u64 optimizer state floats
 *          32  i64 optimizer steps
 *          40  u32 optimizer kind (dense_opt_kind)
 *          44  zeros up to 256
 *         256  float parameters[params], then float state[state floats]
 *         end  SHA-256 of everything before it (32 bytes)
 *
 * The reader checks the magic, the version and header size, the file's
 * size against the header's counts and the SHA-256 trailer before it trusts
 * anything, then the counts and optimizer kind against the model and
 * optimizer it loads into; a failed load changes nothing. */
#ifndef SHARDREC_DENSE_STATE_FILE_H
#define SHARDREC_DENSE_STATE_FILE_H

#include <stddef.h>

#include "dense/model.h"
#include "dense/optim.h"

#define DENSE_STATE_MAGIC "SRCKDENS"
#define DENSE_STATE_VERSION 1u
#define DENSE_STATE_HEADER 256u

/* Write m's parameters and o's state (o NULL: the parameters alone, written
 * as an SGD optimizer at step 0, which keeps no state) to path: under
 * path.tmp, fsynced, then renamed. m and o are only read. 0, or SR_EIO
 * (SR_ERANGE for a path too long: path.tmp would not fit) with the reason in err; on failure no
 * path.tmp is left and path is as it was. */
int dense_state_save(const char *path, const dense_model *m, const dense_opt *o, char *err,
                     size_t errlen);

/* Check path as dense_state_load would (every check, the SHA-256 included)
 * without loading it. 0 or the error dense_state_load would return. */
int dense_state_check(const char *path, const dense_model *m, const dense_opt *o, char *err,
                      size_t errlen);

/* Load path into m's parameters and, when o is not NULL, o's state and step
 * count (o NULL: the parameters only; the file's optimizer part is checked
 * by the SHA-256 but not loaded, whatever its kind). Refused, with m and o
 * unchanged: unreadable (SR_EIO), bad magic or too short (SR_EFORMAT),
 * another version or header size (SR_EVERSION), a size that is not the
 * header's (SR_EFORMAT, "torn or truncated"), a damaged file (SR_ECHECKSUM,
 * "checksum mismatch"), another parameter count, state count or optimizer
 * kind than m's and o's (SR_EMISMATCH). The message in err names path. */
int dense_state_load(const char *path, dense_model *m, dense_opt *o, char *err, size_t errlen);

#endif
