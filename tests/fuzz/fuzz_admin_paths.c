/* libFuzzer target: the admin handlers' path handling (sr_path_confine,
 * common/fs.c, which rpc/service.c's Checkpoint and Restore run on every
 * path a client sends). A temporary tree is made once:
 *   T/root/            the checkpoint root
 *   T/root/sub/        a folder, T/root/file a file
 *   T/root/in    -> T/root/sub     (a symlink that stays inside)
 *   T/root/esc   -> T/out          (a symlink out of the root)
 *   T/root/up    -> ..             (a relative one out of it)
 *   T/root/loop  -> T/root/loop    (a symlink loop)
 *   T/root/gone  -> /nonexistent   (a dangling symlink)
 *   T/out/x                        (beside the root)
 * The first byte chooses how the rest is read: as a path under T/root/, under
 * T/, or as it is (relative paths start from T/root, the current folder).
 * Invariants: accepted => the result is the root or under it, made of plain
 * names (no "", ".", ".." components, no trailing '/'), its existing part
 * is its own realpath (no symlink left in it) and the component after that
 * part does not exist; refused => a message. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "tests/support/files.h"

static char *tmp, root[SR_PATH_MAX];

static void sh(const char *cmd) {
  if (system(cmd) != 0) abort();
}

static void cleanup(void) { sr_rmtree(tmp); }

static void init_once(void) {
  if (root[0]) return;
  if (!(tmp = tmpdir_new("fuzz-confine"))) abort();
  atexit(cleanup); /* libFuzzer ends with exit() */
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "cd %s && mkdir -p root/sub out && touch root/file out/x && ln -s %s/root/sub root/in && "
           "ln -s %s/out root/esc && ln -s .. root/up && ln -s %s/root/loop root/loop && "
           "ln -s /nonexistent-shardrec root/gone", tmp, tmp, tmp, tmp);
  sh(cmd);
  char r[SR_PATH_MAX];
  snprintf(r, sizeof r, "%s/root", tmp);
  if (!realpath(r, root) || chdir(root)) abort();
}

static void check_accepted(const char *out) {
  size_t rl = strlen(root);
  if (strncmp(out, root, rl) || (out[rl] && out[rl] != '/')) abort(); /* outside the root */
  if (strstr(out, "//") || strstr(out, "/./") || strstr(out, "/../")) abort();
  size_t n = strlen(out);
  if (n > 1 && out[n - 1] == '/') abort();
  if ((n >= 2 && !strcmp(out + n - 2, "/.")) || (n >= 3 && !strcmp(out + n - 3, "/.."))) abort();
  /* The existing part: its own realpath, inside the root; the next
   * component does not exist. */
  char q[SR_PATH_MAX], real[SR_PATH_MAX];
  memcpy(q, out, n + 1);
  struct stat st;
  size_t cut = n;
  while (lstat(q, &st) != 0) {
    char *slash = strrchr(q, '/');
    if (!slash || slash == q) abort();
    cut = (size_t)(slash - q);
    *slash = 0;
  }
  if (!realpath(q, real) || strcmp(real, q)) abort(); /* a symlink or '..' survived */
  if (strncmp(real, root, rl) || (real[rl] && real[rl] != '/')) abort();
  if (cut < n) {
    const char *next = out + cut + 1;
    size_t k = strcspn(next, "/");
    char first[SR_PATH_MAX];
    snprintf(first, sizeof first, "%s/%.*s", q, (int)k, next);
    if (lstat(first, &st) == 0) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  init_once();
  if (size < 1) return 0;
  char rest[SR_PATH_MAX], path[2 * SR_PATH_MAX];
  size_t n = size - 1 < SR_PATH_MAX - 1 ? size - 1 : SR_PATH_MAX - 1;
  memcpy(rest, data + 1, n);
  rest[n] = 0; /* an inner NUL ends the path: the service refuses such a path before
                 this (rpc/service.c, wire_texts), so none reaches sr_path_confine */
  switch (data[0] % 3) {
    case 0: snprintf(path, sizeof path, "%s/%s", root, rest); break;
    case 1: snprintf(path, sizeof path, "%s/%s", tmp, rest); break;
    default: snprintf(path, sizeof path, "%s", rest); break;
  }
  char out[SR_PATH_MAX], err[1024] = "";
  int rc = sr_path_confine(root, path, out, sizeof out, err, sizeof err);
  if (rc == 0) check_accepted(out);
  else if (!err[0]) abort(); /* a refusal says why */
  return 0;
}
