/* Real `shardrec serve` processes on loopback for tests: start one
 * (server_start) or the shards of a plan (servers_start), their addresses
 * (servers_addrs), stop (server_stop) or kill one (server_kill9). */
#ifndef SHARDREC_TESTS_SUPPORT_SERVERS_H
#define SHARDREC_TESTS_SUPPORT_SERVERS_H

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

#include "tests/support/proc.h"

typedef struct {
  pid_t pid;
  char addr[64];
  char log[1024]; /* its stderr's file ("": none) */
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
  snprintf(s->log, sizeof s->log, "%s", log ? log : "");
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
 * killed by a signal); 0 when already stopped. A server that did not exit
 * 0 has its log's end written to stderr: the test's folder, and the log
 * with it, is usually removed before anyone can read it. */
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
  const int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  char *text = rc && s->log[0] ? slurp(s->log) : NULL;
  if (text) {
    fprintf(stderr, "server %s exited with %d; the end of its log %s:\n%s\n", s->addr, rc, s->log,
            text_end(text));
    free(text);
  }
  return rc;
}

/* SIGKILL server s (a crash: nothing flushed, no goodbye) and reap it. */
static inline void server_kill9(test_server *s) {
  proc_kill9(s->pid);
  s->pid = 0;
}

/* How servers_start starts the shards of a plan. */
typedef struct {
  const char *dir;   /* the folder of the plan, the logs and the data; the --checkpoint-root */
  const char *plan;  /* the plan's file name in dir */
  const char *data;  /* rows in RocksDB under DIR/DATA.srvK with a 4096-row cache (NULL: in memory) */
  const char *log;   /* stderr to DIR/LOG.srvK.log (NULL: DIR/srvK.log) */
  const char *flags; /* more flags for each server (NULL: none) */
} servers_opts;

/* Start shard k of the plan as o says, on port (NULL: any free one; a
 * restarted server takes its old one), and await its "listening on" line
 * (server_start). */
static inline void server_start_shard(test_server *s, int k, const servers_opts *o, const char *port) {
  char args[1800], data[700] = "", log[700];
  if (o->data)
    snprintf(data, sizeof data, " --cache-rows 4096 --data-dir '%s/%s.srv%d'", o->dir, o->data, k);
  snprintf(args, sizeof args, "--plan '%s/%s' --shard %d%s --checkpoint-root '%s'%s%s%s%s", o->dir,
           o->plan, k, data, o->dir, o->flags ? " " : "", o->flags ? o->flags : "",
           port ? " --listen 127.0.0.1:" : "", port ? port : "");
  if (o->log)
    snprintf(log, sizeof log, "%s/%s.srv%d.log", o->dir, o->log, k);
  else
    snprintf(log, sizeof log, "%s/srv%d.log", o->dir, k);
  server_start(s, args, log);
}

/* Start n servers, shards 0..n-1 of the plan, as o says. */
static inline void servers_start(test_server *s, int n, const servers_opts *o) {
  for (int k = 0; k < n; k++) server_start_shard(&s[k], k, o, NULL);
}

/* SIGKILL server s, shard k of o's plan, and start it again on its port
 * (and its folder, when o keeps rows on disk). */
static inline void server_restart(test_server *s, int k, const servers_opts *o) {
  char port[16];
  snprintf(port, sizeof port, "%s", strrchr(s->addr, ':') + 1);
  server_kill9(s);
  server_start_shard(s, k, o, port);
}

/* The addresses of servers s[0..n-1] joined by ',' into buf, for
 * --shard-servers. */
static inline void servers_addrs(const test_server *s, int n, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = 0;
  for (int k = 0; k < n && at < len; k++)
    at += (size_t)snprintf(buf + at, len - at, "%s%s", k ? "," : "", s[k].addr);
}

#endif
