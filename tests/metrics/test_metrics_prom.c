/* Against the real thing: Debian's Prometheus server (/usr/bin/prometheus)
 * on loopback scrapes a running `shardrec serve --metrics-listen` and a
 * running `shardrec train --metrics-listen` against it every second; the
 * test asks Prometheus' HTTP API for the series and checks them against the
 * server's Stats RPC and the trainer's --metrics-out file. Skipped, loudly,
 * where the prometheus package is not installed. Only 127.0.0.1 is used. */
#include <check.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "tests/check_main.h"
#include "tests/metrics/http_get.h"
#include "tests/rpc/calls.h"
#include "tests/support/proc.h"

#define PROM "/usr/bin/prometheus"

static int g_prom_port;

/* The samples of instant query q: the parsed "result" array's owner (caller
 * deletes), *res pointing into it; NULL while Prometheus cannot answer. */
static cJSON *prom_query(const char *q, const cJSON **res) {
  char enc[1024], path[1200];
  url_encode(q, enc, sizeof enc);
  snprintf(path, sizeof path, "/api/v1/query?query=%s", enc);
  char *body = http_get(g_prom_port, path);
  cJSON *j = body ? cJSON_Parse(body) : NULL;
  free(body);
  const cJSON *data = cJSON_GetObjectItem(j, "data");
  *res = data ? cJSON_GetObjectItem(data, "result") : NULL;
  if (!cJSON_IsArray(*res)) {
    cJSON_Delete(j);
    return NULL;
  }
  return j;
}

/* The value of the one sample of q; NAN when there is none (yet). When
 * label is given, *label_val gets that label's value (a static buffer). */
static double prom_value(const char *q, const char *label, char *label_val, size_t lvlen) {
  const cJSON *res;
  cJSON *j = prom_query(q, &res);
  double v = NAN;
  if (j && cJSON_GetArraySize(res) == 1) {
    const cJSON *s = cJSON_GetArrayItem(res, 0);
    const cJSON *val = cJSON_GetArrayItem(cJSON_GetObjectItem(s, "value"), 1);
    if (cJSON_IsString(val)) v = strtod(val->valuestring, NULL);
    const cJSON *l = label ? cJSON_GetObjectItem(cJSON_GetObjectItem(s, "metric"), label) : NULL;
    if (label_val) snprintf(label_val, lvlen, "%s", cJSON_IsString(l) ? l->valuestring : "");
  }
  cJSON_Delete(j);
  return v;
}

/* Wait (120 s at most) until Prometheus reports n targets, all up. */
static void wait_targets_up(int n, const char *log) {
  double t0 = test_now();
  for (;;) {
    char *body = http_get(g_prom_port, "/api/v1/targets");
    cJSON *j = body ? cJSON_Parse(body) : NULL;
    const cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "data"), "activeTargets");
    int up = 0;
    for (int i = 0; i < cJSON_GetArraySize(t); i++) {
      const cJSON *h = cJSON_GetObjectItem(cJSON_GetArrayItem(t, i), "health");
      up += cJSON_IsString(h) && !strcmp(h->valuestring, "up");
    }
    cJSON_Delete(j);
    if (up == n) {
      free(body);
      return;
    }
    if (test_now() - t0 > 120) {
      char *l = slurp(log);
      ck_abort_msg("Prometheus targets not up (%d of %d): %s\nlog: %s", up, n,
                   body ? body : "(no answer)", l ? l : "");
    }
    free(body);
    usleep(200000);
  }
}

/* Wait (60 s at most) until query q's value equals want. */
static void wait_value(const char *q, double want) {
  double t0 = test_now(), v = NAN;
  while ((v = prom_value(q, NULL, NULL, 0)) != want) {
    ck_assert_msg(test_now() - t0 < 60, "%s: Prometheus has %.17g, Stats says %.17g", q, v, want);
    usleep(200000);
  }
}

/* The shard store's row and byte figures are RocksDB's key estimates
 * (rocksdb.estimate-num-keys) plus its dirty cached rows: they move on an
 * idle server while its write-back and RocksDB's flushes and compactions
 * run. Waits for a scrape that equals a Stats taken meanwhile (each Stats
 * fresh, so a figure that has settled is met whatever it was before). */
static void wait_rows_as_stats(const char *addr) {
  double t0 = test_now(), v = NAN, b = NAN;
  for (;;) {
    Shardrec__V1__StatsResponse *a = calls_stats(addr);
    const double rows = (double)a->rows, bytes = (double)a->bytes;
    shardrec__v1__stats_response__free_unpacked(a, NULL);
    ck_assert(rows > 0 && bytes > rows);
    v = prom_value("shardrec_store_rows", NULL, NULL, 0);
    b = prom_value("shardrec_store_bytes", NULL, NULL, 0);
    if (v == rows && b == bytes) return;
    ck_assert_msg(test_now() - t0 < 60, "shardrec_store_rows/_bytes: Prometheus has %.17g/%.17g, "
                  "Stats says %.17g/%.17g", v, b, rows, bytes);
    usleep(200000);
  }
}

/* 1 when the metrics file has a line of kind holding "key":value (within a
 * relative 1e-7: the file prints 9 digits) at a step in [lo, hi]. */
static int file_has(const char *path, const char *kind, const char *key, double value,
                    double lo, double hi) {
  FILE *f = fopen(path, "r");
  char line[4096];
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    cJSON *j = cJSON_Parse(line);
    const cJSON *k = cJSON_GetObjectItem(j, "kind"), *s = cJSON_GetObjectItem(j, "step"),
                *v = cJSON_GetObjectItem(j, key);
    found = cJSON_IsString(k) && !strcmp(k->valuestring, kind) && cJSON_IsNumber(s) &&
            s->valuedouble >= lo && s->valuedouble <= hi && cJSON_IsNumber(v) &&
            fabs(v->valuedouble - value) <= 1e-7 * fabs(value);
    cJSON_Delete(j);
  }
  if (f) fclose(f);
  return found;
}

START_TEST(test_prometheus_scrapes_serve_and_train) {
  struct stat st;
  if (stat(PROM, &st)) {
    fprintf(stderr, "\n*** SKIPPED test_prometheus: %s is not installed (Debian package "
                    "'prometheus'; tools/setup installs it) ***\n\n", PROM);
    return;
  }
  char *d = make_data_dir(20000, 7, "%s plan --out plan.json --processed-data-file d.bin "
                                    "--num-shards 1 > /dev/null", bin_path());
  char p_serve[512], p_train[512], p_prom[512], p_cfg[512], p_m[512];
  snprintf(p_serve, sizeof p_serve, "%s/serve.out", d);
  snprintf(p_train, sizeof p_train, "%s/train.out", d);
  snprintf(p_prom, sizeof p_prom, "%s/prom.log", d);
  snprintf(p_cfg, sizeof p_cfg, "%s/prom.yml", d);
  snprintf(p_m, sizeof p_m, "%s/m.jsonl", d);
  pid_t srv = spawn_sh("cd %s && exec %s serve --plan plan.json --shard 0 --listen 127.0.0.1:0 "
                       "--data-dir sd --cache-rows 2000 --metrics-listen 127.0.0.1:0 > serve.out "
                       "2>&1", d, bin_path());
  wait_text(p_serve, "listening on", 1, srv, 60);
  char *so = slurp(p_serve), addr[64];
  int ms = port_after(so, "metrics"), sp = port_after(so, "listening");
  free(so);
  snprintf(addr, sizeof addr, "127.0.0.1:%d", sp);
  pid_t tr = spawn_sh("cd %s && exec %s train --processed-data-file d.bin --plan plan.json "
                      "--shard-servers %s --nepochs 10000 --print-freq 1 --test-freq 20 "
                      "--metrics-out m.jsonl --metrics-listen 127.0.0.1:0 > train.out 2>&1",
                      d, bin_path(), addr);
  wait_text(p_train, "metrics on", 1, tr, 60);
  char *to = slurp(p_train);
  int mt = port_after(to, "metrics");
  free(to);
  ck_assert(ms > 0 && mt > 0);
  FILE *f = fopen(p_cfg, "w");
  fprintf(f, "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n"
             "  - job_name: serve\n    static_configs:\n      - targets: ['127.0.0.1:%d']\n"
             "  - job_name: train\n    static_configs:\n      - targets: ['127.0.0.1:%d']\n",
          ms, mt);
  fclose(f);
  g_prom_port = free_port();
  pid_t prom = spawn_sh("cd %s && exec %s --config.file=prom.yml --storage.tsdb.path=tsdb "
                        "--web.listen-address=127.0.0.1:%d > prom.log 2>&1", d, PROM, g_prom_port);
  wait_targets_up(2, p_prom);

  /* The trainer: wait for a scrape after its first test pass. */
  double t0 = test_now(), auc = NAN;
  char rank[16];
  while (isnan(auc = prom_value("shardrec_train_test_auc", "rank", rank, sizeof rank))) {
    ck_assert_msg(test_now() - t0 < 120, "no test AUC in Prometheus");
    usleep(200000);
  }
  ck_assert_str_eq(rank, "0");
  ck_assert_msg(file_has(p_m, "test", "auc", auc, 0, 1e18), "AUC %.17g is not in %s", auc, p_m);
  double ll = prom_value("shardrec_train_test_logloss", NULL, NULL, 0);
  ck_assert_msg(file_has(p_m, "test", "logloss", ll, 0, 1e18), "log loss %.17g", ll);
  /* The step and the loss of one scrape (one query, so one scrape): the
   * loss is the file's at that step (or the one next to it: the trainer
   * stores the two one after the other). */
  double step = NAN, loss = NAN;
  const cJSON *res;
  cJSON *j = prom_query("{__name__=~\"shardrec_train_step|shardrec_train_loss\"}", &res);
  for (int i = 0; j && i < cJSON_GetArraySize(res); i++) {
    const cJSON *smp = cJSON_GetArrayItem(res, i);
    const cJSON *name = cJSON_GetObjectItem(cJSON_GetObjectItem(smp, "metric"), "__name__");
    double v = strtod(cJSON_GetArrayItem(cJSON_GetObjectItem(smp, "value"), 1)->valuestring, NULL);
    if (!strcmp(name->valuestring, "shardrec_train_step")) step = v;
    else loss = v;
  }
  cJSON_Delete(j);
  ck_assert_msg(step >= 20 && file_has(p_m, "train", "loss", loss, step - 1, step + 1),
                "loss %.17g at step %g is not in %s", loss, step, p_m);
  ck_assert(prom_value("shardrec_train_lookup_bytes_total", NULL, NULL, 0) > 0);
  ck_assert(prom_value("process_resident_memory_bytes{job=\"train\"}", NULL, NULL, 0) > 1e6);
  /* One rank sends its Lookups and Pushes on exchange streams: the server
   * counts them open while it trains, and none once it is killed (its
   * connection gone, the server ends them). */
  double streams, ts = test_now();
  while (!((streams = prom_value("shardrec_server_exchange_streams", NULL, NULL, 0)) >= 1)) {
    ck_assert_msg(test_now() - ts < 60, "exchange streams: %g", streams);
    usleep(200000);
  }
  proc_kill9(tr);
  wait_value("shardrec_server_exchange_streams", 0);

  /* The server, now idle: Prometheus' figures equal its Stats. */
  Shardrec__V1__StatsResponse *a = calls_stats(addr);
  wait_value("shardrec_server_calls_total{method=\"lookup\"}", (double)a->lookup_calls);
  wait_value("shardrec_server_calls_total{method=\"push\"}", (double)a->push_calls);
  /* One rank: most steps' pushes carried the next step's Lookup. */
  wait_value("shardrec_server_calls_total{method=\"push_lookup\"}", (double)a->push_lookup_calls);
  ck_assert_uint_gt(a->push_lookup_calls, 10);
  ck_assert_uint_gt(a->lookup_calls, 20);
  ck_assert_double_eq(prom_value("shardrec_server_rows_total{method=\"lookup\"}", NULL, NULL, 0), (double)a->rows_looked_up);
  ck_assert_double_eq(prom_value("shardrec_server_rows_total{method=\"push\"}", NULL, NULL, 0), (double)a->rows_pushed);
  ck_assert_double_eq(prom_value("shardrec_cache_hits_total", NULL, NULL, 0), (double)a->rows_hit);
  ck_assert_double_eq(prom_value("shardrec_cache_misses_total", NULL, NULL, 0), (double)(a->rows_looked_up - a->rows_hit));
  ck_assert_double_eq(prom_value("shardrec_server_failed_calls_total", NULL, NULL, 0), (double)a->failed_calls);
  ck_assert_double_eq(prom_value("shardrec_server_call_duration_seconds_count{method=\"lookup\"}", NULL, NULL, 0), (double)a->lookup_calls);
  ck_assert(prom_value("shardrec_cache_evictions_total", NULL, NULL, 0) > 0); /* 2000-row cache */
  char fp[128], inc[32];
  ck_assert_double_eq(prom_value("shardrec_server_info", "plan_fingerprint", fp, sizeof fp), 1);
  prom_value("shardrec_server_info", "incarnation", inc, sizeof inc);
  ck_assert_str_eq(fp, a->plan_fingerprint);
  ck_assert_uint_eq(strtoull(inc, NULL, 10), a->incarnation);
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  wait_rows_as_stats(addr);

  kill(prom, SIGTERM);
  wait_exit(prom, 30);
  kill(srv, SIGTERM);
  ck_assert_int_eq(wait_exit(srv, 30), 0);
  sr_rmtree(d);
  free(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("metrics_prometheus");
  TCase *tc = tcase_create("prometheus");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_prometheus_scrapes_serve_and_train);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
