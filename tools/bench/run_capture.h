/* Run a shell command and capture its output (the bench commands). */
#ifndef SHARDREC_TOOLS_RUN_CAPTURE_H
#define SHARDREC_TOOLS_RUN_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

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

#endif
