/* serve --log-format json with a real server: every stdout line is one JSON
 * object with "time" and "event"; access (what is open to whom); start (its listen address and the
 * plan's fingerprint and incarnation, as Stats says), a refused call with
 * its method, status and message (a call to an unknown method too), a Restore, a dropped job (a 2-rank job
 * whose second rank never pushes, dropped by --pending-timeout), stop; and
 * the flag errors of --metrics-listen and --log-format. */
#include <check.h>

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "tests/check_main.h"
#include "tests/rpc/calls.h"
#include "tests/support/proc.h"

/* Line nth (0: the first) of the log whose "event" is ev, parsed (caller
 * deletes). */
static cJSON *event_at(const char *log, const char *ev, int nth) {
  char *s = slurp(log);
  cJSON *found = NULL;
  for (char *line = strtok(s, "\n"); line && !found; line = strtok(NULL, "\n")) {
    cJSON *o = cJSON_Parse(line);
    ck_assert_msg(cJSON_IsObject(o), "not a JSON object: %s", line);
    ck_assert(cJSON_IsNumber(cJSON_GetObjectItem(o, "time")));
    const cJSON *e = cJSON_GetObjectItem(o, "event");
    ck_assert(cJSON_IsString(e));
    if (!strcmp(e->valuestring, ev) && nth-- == 0) found = o;
    else cJSON_Delete(o);
  }
  free(s);
  ck_assert_msg(found != NULL, "no %s event in %s", ev, log);
  return found;
}

static cJSON *event(const char *log, const char *ev) { return event_at(log, ev, 0); }

static const char *str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItem(o, k);
  ck_assert_msg(cJSON_IsString(v), "no string %s", k);
  return v->valuestring;
}

START_TEST(test_json_events) {
  char *d = make_data_dir(3000, 5, "%s plan --out plan.json --processed-data-file d.bin "
                                   "--num-shards 1 > /dev/null", bin_path());
  char log[512], addr[64], msg[512], ck[600];
  snprintf(log, sizeof log, "%s/serve.jsonl", d);
  snprintf(ck, sizeof ck, "%s/ck", d);
  pid_t srv = spawn_sh("cd %s && exec %s serve --plan plan.json --shard 0 --listen 127.0.0.1:0 "
                       "--log-format json --pending-timeout 0.5 --checkpoint-root '%s' > serve.jsonl 2> serve.err",
                       d, bin_path(), d);
  wait_text(log, "\"event\":\"start\"", 1, srv, 60);
  cJSON *start = event(log, "start");
  snprintf(addr, sizeof addr, "%s", str(start, "listen"));
  Shardrec__V1__StatsResponse *st = calls_stats(addr);
  ck_assert_str_eq(str(start, "plan_fingerprint"), st->plan_fingerprint);
  ck_assert_uint_eq(strtoull(str(start, "incarnation"), NULL, 10), st->incarnation);
  cJSON_Delete(start);
  cJSON *acc = event(log, "access"); /* what is open to whom, as an event too */
  ck_assert_msg(strstr(str(acc, "access"), "no client certificates (plaintext)"), "%s",
                str(acc, "access"));
  cJSON_Delete(acc);

  /* A refused call. */
  uint8_t *resp = NULL;
  size_t rlen = 0;
  ck_assert_int_eq(rpc_call_once(addr, NULL, RPC_LOOKUP, (const uint8_t *)"zz", 2, 10, &resp, &rlen,
                                 msg, sizeof msg), RPC_INVALID_ARGUMENT);
  free(resp);
  wait_text(log, "\"event\":\"refused\"", 1, srv, 30);
  cJSON *ref = event(log, "refused");
  ck_assert_str_eq(str(ref, "method"), "Lookup");
  ck_assert_str_eq(str(ref, "status"), "INVALID_ARGUMENT");
  ck_assert_int_eq(cJSON_GetObjectItem(ref, "code")->valueint, 3);
  ck_assert_str_eq(str(ref, "message"), msg);
  cJSON_Delete(ref);
  /* A call to a method the server does not have is refused and told too. */
  ck_assert_int_eq(rpc_call_path(addr, NULL, "/shardrec.v1.EmbeddingShard/Nope", (const uint8_t *)"",
                                 0, 10, &resp, &rlen, msg, sizeof msg), RPC_UNIMPLEMENTED);
  free(resp);
  wait_text(log, "\"event\":\"refused\"", 2, srv, 30);
  ref = event_at(log, "refused", 1);
  ck_assert_str_eq(str(ref, "method"), "unknown");
  ck_assert_str_eq(str(ref, "status"), "UNIMPLEMENTED");
  ck_assert_str_eq(str(ref, "message"), "unknown method /shardrec.v1.EmbeddingShard/Nope");
  cJSON_Delete(ref);

  /* Checkpoint, then Restore. */
  uint8_t b[1024];
  Shardrec__V1__CheckpointRequest cq = SHARDREC__V1__CHECKPOINT_REQUEST__INIT;
  cq.plan_fingerprint = st->plan_fingerprint;
  cq.step = 1;
  cq.path = ck;
  size_t len = shardrec__v1__checkpoint_request__pack(&cq, b);
  ck_assert_int_eq(rpc_call_once(addr, NULL, RPC_CHECKPOINT, b, len, 30, &resp, &rlen, msg, sizeof msg), RPC_OK);
  free(resp);
  Shardrec__V1__RestoreRequest rq = SHARDREC__V1__RESTORE_REQUEST__INIT;
  rq.plan_fingerprint = st->plan_fingerprint;
  rq.path = ck;
  len = shardrec__v1__restore_request__pack(&rq, b);
  ck_assert_int_eq(rpc_call_once(addr, NULL, RPC_RESTORE, b, len, 30, &resp, &rlen, msg, sizeof msg), RPC_OK);
  free(resp);
  wait_text(log, "\"event\":\"restore\"", 1, srv, 30);
  cJSON_Delete(event(log, "restore"));

  /* A 2-rank job whose rank 1 never comes: dropped after the pending timeout. */
  Shardrec__V1__RequestHeader h;
  calls_header(&h, st->plan_fingerprint, "job-1", 0, 0, 2, 0);
  uint8_t *push = calls_pack_push(&h, 0.1f, NULL, 0, 16, &len);
  ck_assert_int_eq(calls_push(addr, push, len, NULL, msg, sizeof msg), RPC_OK);
  wait_text(log, "\"event\":\"dropped_job\"", 1, srv, 60);
  cJSON *dj = event(log, "dropped_job");
  ck_assert_int_eq(cJSON_GetObjectItem(dj, "dropped_jobs")->valueint, 1);
  cJSON_Delete(dj);
  shardrec__v1__stats_response__free_unpacked(st, NULL);

  kill(srv, SIGTERM);
  int ws = wait_exit(srv, 30);
  ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  cJSON_Delete(event(log, "stop"));
  ck_assert_int_eq(file_count(log, "listening on"), 0); /* no text lines among the JSON */
  sr_rmtree(d);
  free(d);
}
END_TEST

/* Bad --metrics-listen and --log-format values are flag errors (exit 2,
 * naming the flag and the value); a port taken is a failure (exit 1). */
START_TEST(test_flag_errors) {
  char *d = make_data_dir(2000, 5, "%s plan --out plan.json --processed-data-file d.bin "
                                   "--num-shards 1 > /dev/null", bin_path());
  static const char *const bad[][3] = {
      {"serve --plan plan.json --shard 0 --metrics-listen foo", "--metrics-listen 'foo' is not HOST:PORT", "2"},
      {"serve --plan plan.json --shard 0 --metrics-listen example.com:80", "'example.com' is not an IPv4 address", "2"},
      {"serve --plan plan.json --shard 0 --log-format xml", "--log-format: 'xml' is not text or json", "2"},
      {"train --processed-data-file d.bin --metrics-listen 127.0.0.1:70000", "--metrics-listen '127.0.0.1:70000' is not HOST:PORT", "2"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *out;
    int rc = run_cmd(&out, "cd %s && %s %s", d, bin_path(), bad[i][0]);
    ck_assert_msg(rc == atoi(bad[i][2]) && strstr(out, bad[i][1]), "%s: %d %s", bad[i][0], rc, out);
    free(out);
  }
  /* A port taken: the server says so and stops. */
  char log[512];
  snprintf(log, sizeof log, "%s/a.out", d);
  pid_t a = spawn_sh("cd %s && exec %s serve --plan plan.json --shard 0 --listen 127.0.0.1:0 "
                     "--metrics-listen 127.0.0.1:0 > a.out 2>&1", d, bin_path());
  wait_text(log, "listening on", 1, a, 60);
  char *ao = slurp(log), *out;
  const char *m = strstr(ao, "metrics on ");
  ck_assert_ptr_nonnull(m);
  int rc = run_cmd(&out, "cd %s && %s serve --plan plan.json --shard 0 --metrics-listen %.*s", d,
                   bin_path(), (int)strcspn(m + 11, "\n"), m + 11);
  ck_assert_msg(rc == 1 && strstr(out, "cannot listen on"), "%d %s", rc, out);
  free(out);
  free(ao);
  kill(a, SIGTERM);
  wait_exit(a, 30);
  sr_rmtree(d);
  free(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("serve_log");
  TCase *tc = tcase_create("json");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_json_events);
  tcase_add_test(tc, test_flag_errors);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
