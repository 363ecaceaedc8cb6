/* Start and stop real `shardrec serve` processes on loopback for tests. */
#ifndef SHARDREC_TESTS_RPC_SERVER_H
#define SHARDREC_TESTS_RPC_SERVER_H

#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/bench/run_capture.h"

#include "tests/tools/run.h"

typedef struct {
  pid_t pid;
  char addr[64];
} test_server;

/* Start `shardrec serve --listen 127.0.0.1:0 ARGS` (args: a shell word list)
 * and wait (10 s at most) for its "listening on" line. stderr goes to log. */
static inline void server_start(test_server *s, const char *args, const char *log) {
  int fd[2];
  ck_assert_int_eq(pipe(fd), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec '%s' serve --listen 127.0.0.1:0 %s 2>>'%s'", bin_path(), args,
             log ? log : "/dev/null");
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  s->pid = pid;
  read_listen_addr(fd[0], 10, s->addr, sizeof s->addr);
  close(fd[0]);
  if (!s->addr[0]) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    s->pid = 0;
    ck_abort_msg("server did not start (args: %s; log %s)", args, log ? log : "-");
  }
}

/* SIGTERM, then SIGKILL after 10 s. Returns the exit status (128+sig if
 * killed by a signal); 0 when already stopped. */
static inline int server_stop(test_server *s) {
  if (s->pid <= 0) return 0;
  kill(s->pid, SIGTERM);
  int st = 0;
  double t0 = test_now();
  pid_t got;
  while ((got = waitpid(s->pid, &st, WNOHANG)) == 0 && test_now() - t0 < 10) usleep(10000);
  if (got == 0) {
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
  }
  s->pid = 0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#endif
