/* Single-file outputs (a command's TSV, binary records, plan, predictions,
 * picture): written under a temporary name beside the final one, every write
 * checked, and renamed into place only when whole, so that the file appears
 * complete under its final name or not at all. A folder at the final path is
 * refused and left as it is. And the checked line writes of files read while
 * they grow (train --metrics-out). Every call returns 0 or a negative SR_E*
 * code (common/status.h) with the reason, naming the file, in err; none
 * prints but the sweep of a dead writer's temporary (sr_tmp_sweep). */
#ifndef SHARDREC_COMMON_OUTFILE_H
#define SHARDREC_COMMON_OUTFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct sr_outfile sr_outfile;

/* Whether path may take a single-file output: it does not exist, or is a
 * regular file (symlinks followed). 0; SR_EEXISTS for a folder ("PATH: is a
 * folder; a file output never replaces one, it is left as it is"),
 * SR_EINVAL for anything else that is not a regular file (a device, a
 * pipe). Nothing is touched. */
int sr_out_check(const char *path, char *err, size_t errlen);

/* Whether paths a and b name one file: both exist (symlinks followed) as
 * the same file, or neither exists and they name the same entry of the same
 * folder. An output is written beside its path and renamed over it, so an
 * output that is one of a command's inputs would replace that input. */
int sr_same_file(const char *a, const char *b);

/* Open the output path: sr_out_check, then a new file PATH.TAG beside it
 * (TAG as sr_tmp_tag writes it; a final name too long for that is cut in
 * the temporary's name), with an existing file's mode. Temporaries of
 * path whose writer is gone are removed first, with a line on stderr
 * (sr_tmp_sweep). *out (owned by the caller) ends with sr_out_commit or
 * sr_out_abort. 0, or SR_EEXISTS / SR_EINVAL (sr_out_check), SR_ERANGE
 * (path too long), SR_EIO (cannot create the temporary), SR_ENOMEM; *out
 * NULL then. */
int sr_out_open(const char *path, sr_outfile **out, char *err, size_t errlen);

/* The stream over the temporary (borrowed; write through sr_out_write /
 * sr_out_printf, or through it directly and let sr_out_commit find any
 * error), its descriptor (borrowed: for mmap and zlib's gzdopen of a dup),
 * the final path and the temporary's. */
FILE *sr_out_stream(sr_outfile *o);
int sr_out_fd(const sr_outfile *o);
const char *sr_out_path(const sr_outfile *o);
const char *sr_out_tmp(const sr_outfile *o);

/* Write p[n] / a formatted text. The first error is kept: every later call
 * returns it and writes nothing, and sr_out_commit refuses to commit. 0 or
 * SR_EIO ("PATH: cannot write: <errno's text>", also in sr_out_errmsg). */
int sr_out_write(sr_outfile *o, const void *p, size_t n);
int sr_out_printf(sr_outfile *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Record an error made by whoever wrote through the descriptor (msync, a
 * gzip stream), as sr_out_write's: what ("cannot write") and errnum. Returns
 * SR_EIO. */
int sr_out_fail(sr_outfile *o, const char *what, int errnum);

/* Reserve size bytes for the file (posix_fallocate), so that writing them
 * through a mapping can never meet a full disk. 0 or SR_EIO ("PATH: cannot
 * reserve N bytes: No space left on device"), recorded as sr_out_write's. */
int sr_out_reserve(sr_outfile *o, uint64_t size);

/* The first error's message ("" when none). Borrowed from o. */
const char *sr_out_errmsg(const sr_outfile *o);

/* Flush, fsync and close the temporary, then rename it to the final path
 * and fsync the folder. o is freed whatever happens. On an error (one
 * recorded before, or one now) the temporary is removed, the final path is
 * left as it was, and SR_EIO comes back with the reason in err. */
int sr_out_commit(sr_outfile *o, char *err, size_t errlen);

/* sr_out_commit of n outputs made together (datagen's TSV, .probs and
 * summary): every one is flushed, fsynced and closed first, and only when
 * all of them are whole are they renamed, in order. On an error every
 * temporary is removed and no final path changed (but for a rename that
 * fails after others were made, which leaves those: the files are whole by
 * then). Frees every os[i] and sets it NULL (NULL entries skipped). */
int sr_out_commit_all(sr_outfile **os, int n, char *err, size_t errlen);

/* Close and remove the temporary, free o; the final path is left as it
 * was. NULL-safe. */
void sr_out_abort(sr_outfile *o);

/* One line s[n] appended to the stream f of the file path (a file read
 * while it grows, opened by its owner), flushed at once. On an error (a
 * full disk) the stream's buffer is dropped and the file cut back to
 * where the line began, so that it holds whole lines only. 0 or SR_EIO
 * ("PATH: cannot write: <errno's text>" in err). */
int sr_out_line(FILE *f, const char *path, const char *s, size_t n, char *err, size_t errlen);

#endif
