/* The live progress line of long commands (reshard, convert's passes,
 * datagen, predict, inspect): one line on stderr, redrawn in place with \r
 * at most four times a second, with the count done of the total, the
 * percentage, the rate and the time left:
 *
 *   convert: pass 1 (count lines): 1.20M/3.40M bytes (35%), 80.1M bytes/s, ETA 3 s
 *
 * Drawn only when asked (on: stderr is a terminal, sr_progress_tty), so
 * nothing of it reaches a file or a pipe. Not thread-safe: one thread
 * updates a line. */
#ifndef SHARDREC_COMMON_PROGRESS_H
#define SHARDREC_COMMON_PROGRESS_H

#include <stdint.h>

typedef struct sr_progress {
  int on;           /* 0: every call does nothing */
  const char *what; /* "reshard", "convert: pass 2 (write)" (borrowed) */
  const char *unit; /* "rows", "lines", "bytes", "samples" (borrowed) */
  double t0, last;
  uint64_t total;   /* 0: unknown (no percentage, no ETA) */
  uint64_t done, bytes;
  int show_bytes;   /* also "N MB" of bytes */
} sr_progress;

/* 1 when stderr is a terminal. */
int sr_progress_tty(void);

/* A line about what, counting unit up to total; drawn only when on. */
void sr_progress_begin(sr_progress *p, int on, const char *what, const char *unit,
                       uint64_t total);
/* done so far (and bytes, shown when show_bytes is set); redraws when a
 * quarter of a second has passed since the last drawing. */
void sr_progress_set(sr_progress *p, uint64_t done, uint64_t bytes);
/* The last drawing (done = what was reached) and the end of the line. */
void sr_progress_end(sr_progress *p);
/* Erases the line drawn so far (before the command prints a line of its
 * own on the terminal); the next sr_progress_set draws it again. */
void sr_progress_clear(sr_progress *p);

#endif
