/* Processes for tests: run the shardrec binary (SHARDREC_BIN) in a shell
 * (run_cmd, make_data_dir), and act on a running one from outside: start it
 * in the background (spawn_sh), wait for a line in its output or metrics
 * (wait_text), find an MPI rank's process (mpi_rank_pid), kill it
 * (proc_kill9), wait for it to end (wait_exit). */
#ifndef SHARDREC_TESTS_SUPPORT_PROC_H
#define SHARDREC_TESTS_SUPPORT_PROC_H

#include <check.h>
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/files.h"

static inline double test_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline const char *bin_path(void) {
  const char *b = getenv("SHARDREC_BIN");
  ck_assert_msg(b != NULL, "SHARDREC_BIN is not set (run through ctest)");
  return b;
}

/* Run a shell command (printf-style); capture stdout+stderr into a malloc'd
 * string (*out, may be NULL to discard). Returns the exit status. */
static inline int run_cmd(char **out, const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char full[8300];
  snprintf(full, sizeof full, "(%s) 2>&1", cmd);
  FILE *p = popen(full, "r");
  ck_assert_msg(p != NULL, "popen failed: %s", cmd);
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += got;
    if (cap - n < 4096) buf = realloc(buf, cap *= 2);
  }
  buf[n] = 0;
  int st = pclose(p);
  if (out)
    *out = buf;
  else
    free(buf);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* A new temporary folder (tmpdir_make("test"); returned, malloc'd)
 * holding rows generated lines (datagen --seed seed, d.tsv) converted with
 * the last 10% as the test split (d.bin); then the shell command then_fmt (printf-style; NULL:
 * none) run there. Asserts that all of it succeeded. */
__attribute__((format(printf, 3, 4))) static inline char *make_data_dir(int rows, int seed,
                                                                        const char *then_fmt, ...) {
  char then[6000] = "";
  if (then_fmt) {
    va_list ap;
    va_start(ap, then_fmt);
    vsnprintf(then, sizeof then, then_fmt, ap);
    va_end(ap);
  }
  char *d = tmpdir_make("test"), *out;
  int rc = run_cmd(&out, "cd %s && %s datagen --rows %d --seed %d --out d.tsv && "
                         "%s convert --test-fraction 0.1 d.tsv d.bin%s%s",
                   d, bin_path(), rows, seed, bin_path(), *then ? " && " : "", then);
  ck_assert_msg(rc == 0, "data preparation failed: %s", out);
  free(out);
  return d;
}

/* Start the shell command (printf-style) in the background: sh -c, with
 * the caller's stdout and stderr (redirect them in the command; `exec` in
 * it makes the pid the program's own). The child's pid, for wait_exit. */
__attribute__((format(printf, 1, 2))) static inline pid_t spawn_sh(const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* Wait until the file at path holds text at least n times: an event (a
 * line the program printed and flushed), polled every 2 ms. Fails the test
 * after secs, or as soon as the child pid (0: none) has ended without it,
 * with the file's tail either way. */
static inline void wait_text(const char *path, const char *text, int n, pid_t pid, double secs) {
  double t0 = test_now();
  while (file_count(path, text) < n) {
    int st;
    int gone = pid > 0 && waitpid(pid, &st, WNOHANG) == pid;
    if (gone || test_now() - t0 > secs) {
      char *s = slurp(path);
      ck_abort_msg("'%s' (x%d) is not in %s %s; its end:\n%s", text, n, path,
                   gone ? "and the process has ended" : "in time", s ? text_end(s) : "(none)");
    }
    usleep(2000);
  }
}

/* Wait (secs at most) for the child pid to end. Its wait status, or -1 if
 * it was still running after secs (then it is SIGKILLed and reaped). */
static inline int wait_exit(pid_t pid, double secs) {
  int st = 0;
  double t0 = test_now();
  pid_t got;
  while ((got = waitpid(pid, &st, WNOHANG)) == 0 && test_now() - t0 < secs) usleep(5000);
  if (got == pid) return st;
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

/* SIGKILL the child pid and reap it. Its wait status. */
static inline int proc_kill9(pid_t pid) {
  int st = 0;
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return st;
}

/* Parent pid of pid from /proc/PID/stat; 0 if it cannot be read. */
static inline pid_t proc_parent(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* the command name may hold anything */
  int ppid = 0;
  return p && sscanf(p + 1, " %*c %d", &ppid) == 1 ? (pid_t)ppid : 0;
}

/* Whether the environment of pid holds the entry var (e.g.
 * "OMPI_COMM_WORLD_RANK=1"). */
static inline int proc_has_env(pid_t pid, const char *var) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  size_t cap = 1 << 16, n = 0, got;
  char *buf = malloc(cap + 1);
  while ((got = fread(buf + n, 1, cap - n, f)) > 0)
    if ((n += got) == cap) buf = realloc(buf, (cap *= 2) + 1);
  fclose(f);
  buf[n] = 0;
  int found = 0;
  for (size_t i = 0; i < n && !found; i += strlen(buf + i) + 1) found = !strcmp(buf + i, var);
  free(buf);
  return found;
}

/* The process of MPI rank `rank` of a job the test started: a descendant
 * of root (the pid spawn_sh gave for the mpirun), running the shardrec
 * binary, with OMPI_COMM_WORLD_RANK=rank in its environment. Waits for it
 * (the ranks start after mpirun) and fails the test after secs. */
static inline pid_t mpi_rank_pid(pid_t root, int rank, double secs) {
  char bin[PATH_MAX], var[64];
  ck_assert_msg(realpath(bin_path(), bin) != NULL, "%s: cannot resolve", bin_path());
  snprintf(var, sizeof var, "OMPI_COMM_WORLD_RANK=%d", rank);
  double t0 = test_now();
  for (;;) {
    pid_t found = 0;
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    for (struct dirent *e; !found && (e = readdir(d));) {
      pid_t pid = (pid_t)atoi(e->d_name);
      if (pid <= 0 || pid == root) continue;
      char path[64], exe[PATH_MAX];
      snprintf(path, sizeof path, "/proc/%d/exe", (int)pid);
      ssize_t n = readlink(path, exe, sizeof exe - 1);
      if (n <= 0) continue;
      exe[n] = 0;
      if (strcmp(exe, bin) != 0) continue;
      pid_t up = pid;
      while (up > 1 && up != root) up = proc_parent(up);
      if (up == root && proc_has_env(pid, var)) found = pid;
    }
    closedir(d);
    if (found) return found;
    ck_assert_msg(test_now() - t0 < secs, "no process of rank %d under pid %d after %.0f s", rank,
                  (int)root, secs);
    usleep(5000);
  }
}

#endif
