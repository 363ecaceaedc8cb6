/* Run a shell command and capture its output (the bench commands); read a
 * `shardrec serve` child's address from its stdout (benchmarks and tests). */
#ifndef SHARDREC_TOOLS_RUN_CAPTURE_H
#define SHARDREC_TOOLS_RUN_CAPTURE_H

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/sys.h"

/* Run cmd through the shell, stdout and stderr into a malloc'd *out (NULL
 * when out of memory). Returns the exit status (127: not found, -1: could
 * not start or did not exit). */
static inline int run_capture(const char *cmd, char **out) {
  *out = NULL;
  char *full = malloc(strlen(cmd) + 16);
  if (!full) return -1;
  sprintf(full, "(%s) 2>&1", cmd);
  FILE *p = popen(full, "r");
  free(full);
  if (!p) return -1;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += got;
    if (cap - n < 4096) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
    }
  }
  int st = pclose(p);
  if (buf) buf[n] = 0;
  *out = buf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Read fd (a `shardrec serve` child's stdout) until its "listening on
 * HOST:PORT" line, for up to timeout_s seconds; the address into addr[alen].
 * 0, or -1 when the line did not come (the child died or was too slow). */
static inline int read_listen_addr(int fd, double timeout_s, char *addr, size_t alen) {
  char buf[4096]; /* the lines before it: checkpoint, note, access (serve prints them first) */
  size_t n = 0;
  double t0 = sr_now();
  addr[0] = 0;
  for (;;) {
    if (sr_now() - t0 > timeout_s || n >= sizeof buf - 1) return -1;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t got = read(fd, buf + n, sizeof buf - 1 - n);
    if (got <= 0) return -1;
    n += (size_t)got;
    buf[n] = 0;
    char *l = strstr(buf, "listening on ");
    if (l && strchr(l, '\n')) {
      snprintf(addr, alen, "%.*s", (int)strcspn(l + 13, " \n"), l + 13);
      return 0;
    }
  }
}

#endif
