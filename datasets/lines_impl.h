/* Lines from a list of files, plain or gzip (datasets/lines.c): the one
 * line reader of the TSV source (datasets/source.c), so that every pass
 * over a file splits it into the same lines and skips the same ones. */
#ifndef SHARDREC_DATASETS_LINES_IMPL_H
#define SHARDREC_DATASETS_LINES_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#define DS_READ_BYTES (1u << 20)
/* A line longer than DS_LINE_MAX bytes (its '\n' left out) is skipped
 * (DS_BAD_LONG), wherever it lies in the reader's buffer of at most
 * DS_LINE_BUF bytes. */
#define DS_LINE_BUF (4u << 20)
#define DS_LINE_MAX (DS_LINE_BUF - DS_READ_BYTES)

typedef struct {
  char **paths;
  int npaths, cur;
  int fd;
  gzFile gz;
  char *buf;
  size_t cap, pos, len;
  int eof;
  int skipping;       /* dropping the rest of an over-long line */
  uint64_t line;      /* global index of the next line */
  uint64_t file_line; /* 1-based number of the next line in the current file */
  uint64_t before;    /* bytes of the files before the current one (progress) */
} linesrc;

/* Open paths[0..npaths) for reading from their first line: 0, or SR_E*
 * with the reason in err. */
int ds__ls_init(linesrc *l, char **paths, int npaths, char *err, size_t en);
void ds__ls_free(linesrc *l);

/* Next line (without '\n') in *p, *n: 1; 2 for a line longer than
 * DS_LINE_MAX (skipped, no text); 0 at the end of all files; < 0 on a read
 * error (err). */
int ds__ls_next(linesrc *l, const char **p, size_t *n, char *err, size_t en);

/* Bytes of the input files read so far (gzip: compressed bytes). */
uint64_t ds__ls_bytes(const linesrc *l);

/* Bytes of paths[0..n). */
uint64_t ds__paths_bytes(char **paths, int n);

/* CRC-32 of each of paths[0..n)'s first and last MiB (the whole file
 * when it is at most 2 MiB), in turn: with the bytes, what tells one
 * day's file from another's of the same size. Unreadable files add
 * nothing. */
uint32_t ds__paths_ends_crc(char *const *paths, int n);

#endif
