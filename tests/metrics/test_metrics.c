/* Tests for metrics/: the text exposition format (escaping, number forms,
 * cumulative histogram buckets, +Inf equal to _count, constant labels),
 * names refused, exact counts under concurrent updates and scrapes, and the
 * HTTP listener over a real socket (GET /metrics, /healthz, 404, 405). */
#include <check.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/status.h"
#include "metrics/metrics.h"
#include "tests/check_main.h"

static char *scrape(metrics_registry *r) {
  char *out;
  size_t len;
  ck_assert_int_eq(metrics_registry_write(r, &out, &len), 0);
  ck_assert_uint_eq(strlen(out), len);
  return out;
}

START_TEST(test_escape_labels) {
  metrics_registry *r = metrics_registry_create();
  char err[256];
  const char *ln[] = {"path"};
  metrics_family *f = metrics_family_add(r, "shardrec_test_total", "Help with \\ and\nnewline.",
                                         METRICS_COUNTER, 1, ln, NULL, 0, err, sizeof err);
  ck_assert_ptr_nonnull(f);
  const char *v[] = {"a\\b\"c\nd"};
  metrics_series *s = metrics_series_get(f, v);
  metrics_counter_add(s, 3);
  metrics_counter_inc(s);
  ck_assert_ptr_eq(metrics_series_get(f, v), s); /* same labels: same series */
  char *out = scrape(r);
  ck_assert_str_eq(out, "# HELP shardrec_test_total Help with \\\\ and\\nnewline.\n"
                        "# TYPE shardrec_test_total counter\n"
                        "shardrec_test_total{path=\"a\\\\b\\\"c\\nd\"} 4\n");
  free(out);
  metrics_registry_destroy(r);
}
END_TEST

START_TEST(test_values_and_const_labels) {
  metrics_registry *r = metrics_registry_create();
  char err[256];
  ck_assert_int_eq(metrics_registry_label(r, "rank", "1"), 0);
  metrics_family *g = metrics_family_add(r, "shardrec_loss", "Loss.", METRICS_GAUGE, 0, NULL,
                                         NULL, 0, err, sizeof err);
  metrics_family *empty = metrics_family_add(r, "shardrec_unused", "No series.", METRICS_GAUGE,
                                             0, NULL, NULL, 0, err, sizeof err);
  ck_assert_ptr_nonnull(empty);
  ck_assert_int_eq(metrics_registry_label(r, "late", "x"), SR_EINVAL); /* after a family */
  metrics_series *s = metrics_series_get(g, NULL);
  metrics_gauge_set(s, 0.1);
  char *out = scrape(r);
  ck_assert_str_eq(out, "# HELP shardrec_loss Loss.\n# TYPE shardrec_loss gauge\n"
                        "shardrec_loss{rank=\"1\"} 0.10000000000000001\n");
  free(out);
  metrics_gauge_set(s, -1.0 / 0.0);
  out = scrape(r);
  ck_assert_ptr_nonnull(strstr(out, "shardrec_loss{rank=\"1\"} -Inf\n"));
  free(out);
  metrics_gauge_set(s, 12345678901.0);
  out = scrape(r);
  ck_assert_ptr_nonnull(strstr(out, "} 12345678901\n"));
  ck_assert_ptr_null(strstr(out, "shardrec_unused"));
  free(out);
  metrics_registry_destroy(r);
}
END_TEST

START_TEST(test_names_refused) {
  metrics_registry *r = metrics_registry_create();
  char err[256];
  const char *bad[] = {"le"}, *dash[] = {"a-b"};
  ck_assert_ptr_null(metrics_family_add(r, "9lives", "", METRICS_GAUGE, 0, NULL, NULL, 0, err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "bad metric name '9lives'"));
  ck_assert_ptr_null(metrics_family_add(r, "a b", "", METRICS_GAUGE, 0, NULL, NULL, 0, err, sizeof err));
  ck_assert_ptr_null(metrics_family_add(r, "x", "", METRICS_GAUGE, 1, bad, NULL, 0, err, sizeof err));
  ck_assert_ptr_null(metrics_family_add(r, "x", "", METRICS_GAUGE, 1, dash, NULL, 0, err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "bad label name 'a-b'"));
  double down[] = {1, 0.5};
  ck_assert_ptr_null(metrics_family_add(r, "h", "", METRICS_HISTOGRAM, 0, NULL, down, 2, err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "increasing"));
  ck_assert_ptr_nonnull(metrics_family_add(r, "x", "", METRICS_GAUGE, 0, NULL, NULL, 0, err, sizeof err));
  ck_assert_ptr_null(metrics_family_add(r, "x", "", METRICS_GAUGE, 0, NULL, NULL, 0, err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "x given twice"));
  metrics_registry_destroy(r);
}
END_TEST

/* The value of the sample line starting with prefix in text (fails if absent). */
static double sample(const char *text, const char *prefix) {
  char pat[256];
  snprintf(pat, sizeof pat, "\n%s ", prefix);
  const char *p = strstr(text, pat);
  ck_assert_msg(p != NULL, "no sample %s in:\n%s", prefix, text);
  return strtod(p + strlen(pat), NULL);
}

START_TEST(test_histogram_cumulative) {
  metrics_registry *r = metrics_registry_create();
  char err[256];
  const char *ln[] = {"method"};
  double b[] = {0.001, 0.01, 0.1};
  metrics_family *f = metrics_family_add(r, "shardrec_call_duration_seconds", "Latency.",
                                         METRICS_HISTOGRAM, 1, ln, b, 3, err, sizeof err);
  const char *v[] = {"Lookup"};
  metrics_series *s = metrics_series_get(f, v);
  double obs[] = {0.0005, 0.001, 0.002, 0.05, 0.05, 0.5, 7};
  double sum = 0;
  for (int i = 0; i < 7; i++) metrics_histogram_observe(s, obs[i]), sum += obs[i];
  char *out = scrape(r);
  /* le is "less or equal": 0.001 falls in the first bucket. */
  ck_assert_double_eq(sample(out, "shardrec_call_duration_seconds_bucket{method=\"Lookup\",le=\"0.001\"}"), 2);
  ck_assert_double_eq(sample(out, "shardrec_call_duration_seconds_bucket{method=\"Lookup\",le=\"0.01\"}"), 3);
  ck_assert_double_eq(sample(out, "shardrec_call_duration_seconds_bucket{method=\"Lookup\",le=\"0.1\"}"), 5);
  double inf = sample(out, "shardrec_call_duration_seconds_bucket{method=\"Lookup\",le=\"+Inf\"}");
  double count = sample(out, "shardrec_call_duration_seconds_count{method=\"Lookup\"}");
  ck_assert_double_eq(inf, 7);
  ck_assert_double_eq(count, inf);
  ck_assert_double_eq_tol(sample(out, "shardrec_call_duration_seconds_sum{method=\"Lookup\"}"), sum, 1e-12);
  ck_assert_ptr_nonnull(strstr(out, "# TYPE shardrec_call_duration_seconds histogram\n"));
  ck_assert_double_eq(metrics_series_value(s), 7);
  free(out);
  metrics_registry_destroy(r);
}
END_TEST

typedef struct {
  metrics_series *c, *h;
  int n;
} upd_arg;

static void *updater(void *p) {
  upd_arg *a = p;
  for (int i = 0; i < a->n; i++) {
    metrics_counter_inc(a->c);
    metrics_histogram_observe(a->h, (i % 3) * 0.004);
  }
  return NULL;
}

/* Four threads update while the main thread scrapes: every scrape's
 * histogram is cumulative with +Inf = _count, and the final counts are exact. */
START_TEST(test_concurrent_updates) {
  metrics_registry *r = metrics_registry_create();
  char err[256];
  double b[] = {0.001, 0.005};
  metrics_series *c = metrics_series_get(metrics_family_add(r, "c_total", "", METRICS_COUNTER, 0, NULL, NULL, 0, err, sizeof err), NULL);
  metrics_series *h = metrics_series_get(metrics_family_add(r, "h_seconds", "", METRICS_HISTOGRAM, 0, NULL, b, 2, err, sizeof err), NULL);
  upd_arg a = {c, h, 200000};
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, updater, &a);
  for (int k = 0; k < 50; k++) {
    char *out = scrape(r);
    double b1 = sample(out, "h_seconds_bucket{le=\"0.001\"}"), b2 = sample(out, "h_seconds_bucket{le=\"0.005\"}");
    double inf = sample(out, "h_seconds_bucket{le=\"+Inf\"}"), n = sample(out, "h_seconds_count");
    ck_assert(b1 <= b2 && b2 <= inf);
    ck_assert_double_eq(inf, n);
    free(out);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  char *out = scrape(r);
  ck_assert_double_eq(sample(out, "c_total"), 800000);
  ck_assert_double_eq(sample(out, "h_seconds_count"), 800000);
  ck_assert_double_eq(sample(out, "h_seconds_bucket{le=\"0.001\"}"), 4 * 66667);
  free(out);
  metrics_registry_destroy(r);
}
END_TEST

static int g_collected;
static void collect(void *ctx) {
  metrics_counter_set(ctx, 41 + ++g_collected);
}

START_TEST(test_collector) {
  metrics_registry *r = metrics_registry_create();
  char err[256];
  metrics_series *s = metrics_series_get(metrics_family_add(r, "ext_total", "", METRICS_COUNTER, 0, NULL, NULL, 0, err, sizeof err), NULL);
  ck_assert_int_eq(metrics_registry_collector(r, collect, s, NULL), 0);
  ck_assert_int_eq(metrics_process_add(r, err, sizeof err), 0);
  char *out = scrape(r);
  ck_assert_double_eq(sample(out, "ext_total"), 42);
  ck_assert(sample(out, "process_resident_memory_bytes") > 1e5);
  free(out);
  metrics_registry_destroy(r);
}
END_TEST

/* One HTTP/1.0 request to 127.0.0.1:port; the whole answer (caller frees). */
static char *http(int port, const char *req) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t n;
  while ((n = read(fd, buf + len, cap - 1 - len)) > 0) len += (size_t)n;
  buf[len] = 0;
  close(fd);
  return buf;
}

START_TEST(test_http) {
  metrics_registry *r = metrics_registry_create();
  char err[256];
  metrics_series *s = metrics_series_get(metrics_family_add(r, "shardrec_up", "Up.", METRICS_GAUGE, 0, NULL, NULL, 0, err, sizeof err), NULL);
  metrics_gauge_set(s, 1);
  ck_assert_ptr_null(metrics_http_start(r, "127.0.0.1", NULL, err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "not HOST:PORT"));
  ck_assert_ptr_null(metrics_http_start(r, "example.com:0", NULL, err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "not an IPv4 address"));
  metrics_http *h = metrics_http_start(r, "127.0.0.1:0", NULL, err, sizeof err);
  ck_assert_msg(h != NULL, "%s", err);
  int port = metrics_http_port(h);
  ck_assert_int_gt(port, 0);
  char *a = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
  ck_assert_msg(!strncmp(a, "HTTP/1.0 200", 12) || !strncmp(a, "HTTP/1.1 200", 12), "%s", a);
  ck_assert_ptr_nonnull(strstr(a, "text/plain; version=0.0.4"));
  ck_assert_ptr_nonnull(strstr(a, "\r\n\r\n# HELP shardrec_up Up.\n# TYPE shardrec_up gauge\nshardrec_up 1\n"));
  free(a);
  a = http(port, "GET /healthz HTTP/1.0\r\n\r\n");
  ck_assert_ptr_nonnull(strstr(a, " 200 "));
  ck_assert_ptr_nonnull(strstr(a, "\r\n\r\nok\n"));
  free(a);
  a = http(port, "GET /metrics/../etc HTTP/1.0\r\n\r\n");
  ck_assert_ptr_nonnull(strstr(a, " 404 "));
  free(a);
  a = http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
  ck_assert_ptr_nonnull(strstr(a, " 405 "));
  ck_assert_ptr_nonnull(strstr(a, "Allow: GET, HEAD"));
  free(a);
  a = http(port, "garbage\r\n\r\n");
  ck_assert_ptr_null(strstr(a, "shardrec_up")); /* refused, never the figures */
  free(a);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  ck_assert_ptr_null(metrics_http_start(r, addr, NULL, err, sizeof err)); /* taken */
  ck_assert_ptr_nonnull(strstr(err, "cannot listen on"));
  metrics_http_stop(h);
  metrics_registry_destroy(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("metrics");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_escape_labels);
  tcase_add_test(tc, test_values_and_const_labels);
  tcase_add_test(tc, test_names_refused);
  tcase_add_test(tc, test_histogram_cumulative);
  tcase_add_test(tc, test_concurrent_updates);
  tcase_add_test(tc, test_collector);
  tcase_add_test(tc, test_http);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
