/* A slow or garbage client cannot stall the server or the trainer: 100
 * idle connections and one client sending a byte a second to the metrics
 * port of `shardrec serve` and of `shardrec train` leave the trainer's step
 * time within 25% and the server's Lookup p99 within 2x of the same without
 * them. (A server thread held by the byte-a-second client would hold
 * Lookups about a second, x500 and more here; a listener that spins shows
 * in the step time's median, which is steadier. The p99 of 300 Lookups on 2
 * shared cores
 * moves more than a median does: x0.4 to x1.29 between runs with nothing
 * wrong, the x1.29 in a CI run; 25% was inside that noise.)
 * Step time: the median step (from --metrics-out) of one training run
 * with the load on and off in turn every second, 10 s each. Lookup p99: the
 * client side of Lookups through the remote store in 30 blocks of 300 each
 * way, with and without the load in turn, the median of the blocks' p99.
 * So the machine's other
 * work falls on both alike; it is a comparison, not a time limit. */
#include <check.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/sys.h"
#include "embedding/plan.h"
#include "rpc/client.h"
#include "tests/check_main.h"
#include "tests/metrics/http_get.h"
#include "tests/support/proc.h"

#define IDLE 100
#define STEP_BLOCKS 10   /* seconds of training of each kind */
#define LOOKUP_BLOCKS 30 /* blocks of Lookups of each kind */
#define LOOKUP_BLOCK 300 /* Lookups in a block: its p99 is its 3rd slowest */

typedef struct {
  int port;
  atomic_int stop;
  int fds[IDLE], n;
  int slow_bytes; /* bytes the slow client sent */
  pthread_t th;
} loader;

static int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (fd >= 0 && !connect(fd, (struct sockaddr *)&sa, sizeof sa)) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

static void nap(double s) { usleep((useconds_t)(s * 1e6)); }

/* Opens the idle connections (retrying until the port listens), then sends
 * a never-finished request a byte a second until told to stop. */
static void *load_main(void *p) {
  loader *l = p;
  while (l->n < IDLE && !l->stop) {
    int fd = connect_to(l->port);
    if (fd < 0) nap(0.01);
    else l->fds[l->n++] = fd;
  }
  static const char req[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  int slow = -1;
  size_t at = 0;
  while (!l->stop) {
    if (slow < 0) slow = connect_to(l->port), at = 0;
    char c = at < sizeof req - 1 ? req[at] : 'a';
    if (slow >= 0 && send(slow, &c, 1, MSG_NOSIGNAL) == 1) at++, l->slow_bytes++;
    else if (slow >= 0) close(slow), slow = -1; /* closed by the server's timeout: again */
    for (int i = 0; i < 4 && !l->stop; i++) nap(0.25); /* few wake-ups of the test's own */
  }
  if (slow >= 0) close(slow);
  return NULL;
}

static void load_start(loader *l, int port) {
  memset(l, 0, sizeof *l);
  l->port = port;
  ck_assert_int_eq(pthread_create(&l->th, NULL, load_main, l), 0);
}

static void load_stop(loader *l) {
  l->stop = 1;
  pthread_join(l->th, NULL);
  for (int i = 0; i < l->n; i++) close(l->fds[i]);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* n Lookups of 64 ids per table through the remote store s, their
 * seconds appended to lat. */
static void lookups(emb_store *s, const emb_plan *plan, int n, double *lat) {
  int T = plan->n_tables, dim = plan->tables[0].dim;
  uint64_t ids[64];
  const uint64_t *idp[64];
  size_t counts[64];
  float *out[64];
  for (int i = 0; i < 64; i++) ids[i] = (uint64_t)i;
  for (int t = 0; t < T; t++) {
    idp[t] = ids;
    counts[t] = plan->tables[t].rows < 64 ? plan->tables[t].rows : 64;
    out[t] = malloc(64 * (size_t)dim * sizeof(float));
  }
  emb_idset set = {T, idp, counts};
  for (int i = 0; i < n; i++) {
    double t0 = sr_now();
    ck_assert_int_eq(emb_store_lookup_begin(s, 0, &set, out), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s), 0);
    lat[i] = sr_now() - t0;
  }
  for (int t = 0; t < T; t++) free(out[t]);
}

/* New lines of the train --metrics-out file f since the last call (a
 * partial last line is left for the next): each train line's step time
 * (its global batch over its samples/s) into v[*n] when keep. */
static void take_steps(FILE *f, int keep, double *v, int *n, int max) {
  char line[4096];
  for (;;) {
    long at = ftell(f);
    if (!fgets(line, sizeof line, f)) break;
    if (!strchr(line, '\n')) {
      fseek(f, at, SEEK_SET);
      break;
    }
    double sps = find_num(line, "\"samples_per_s\":");
    if (keep && sps > 0 && *n < max && strstr(line, "\"kind\":\"train\"")) v[(*n)++] = 128.0 / sps;
  }
  clearerr(f);
}

/* Starts the load on both ports and waits until it is all there. */
static void load_both(loader *a, int pa, loader *b, int pb) {
  load_start(a, pa);
  load_start(b, pb);
  double t0 = test_now();
  while (a->n < IDLE || b->n < IDLE || !a->slow_bytes || !b->slow_bytes) {
    ck_assert_msg(test_now() - t0 < 60, "the load did not connect (%d, %d)", a->n, b->n);
    nap(0.005);
  }
}

START_TEST(test_slow_clients_do_not_stall) {
  char *d = make_data_dir(20000, 9, "%s plan --out plan.json --processed-data-file d.bin "
                                    "--num-shards 1 > /dev/null", bin_path());
  char p_serve[512], p_plan[512], p_m[512], p_train[512], err[512];
  snprintf(p_train, sizeof p_train, "%s/train.out", d);
  snprintf(p_serve, sizeof p_serve, "%s/serve.out", d);
  snprintf(p_m, sizeof p_m, "%s/m.jsonl", d);
  snprintf(p_plan, sizeof p_plan, "%s/plan.json", d);
  pid_t srv = spawn_sh("cd %s && exec %s serve --plan plan.json --shard 0 --listen 127.0.0.1:0 "
                       "--metrics-listen 127.0.0.1:0 > serve.out 2>&1", d, bin_path());
  wait_text(p_serve, "listening on", 1, srv, 60);
  char *so = slurp(p_serve), addr[64];
  int ms = port_after(so, "metrics");
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port_after(so, "listening"));
  free(so);
  emb_plan *plan;
  ck_assert_msg(emb_plan_load(p_plan, &plan, err, sizeof err) == 0, "%s", err);
  const char *servers[] = {addr};
  rpc_client_opts co = {0};
  emb_store *store = emb_store_create_remote(plan, servers, 1, &co, err, sizeof err);
  ck_assert_msg(store != NULL, "%s", err);
  static double lat[2][LOOKUP_BLOCKS * LOOKUP_BLOCK];
  lookups(store, plan, LOOKUP_BLOCK, lat[0]); /* warm up: rows made, channel up */

  /* The step: one training run, the load on and off in turn every second;
   * a step counts for the side in force when its line appears (not within
   * 50 ms of a change). */
  int pt = free_port();
  pid_t tr = spawn_sh("cd %s && exec %s train --processed-data-file d.bin --plan plan.json "
                      "--shard-servers %s --nepochs 100000 --print-freq 1 --metrics-out m.jsonl "
                      "--metrics-listen 127.0.0.1:%d > train.out 2>&1", d, bin_path(), addr, pt);
  wait_text(p_train, "metrics on", 1, tr, 60);
  wait_text(p_m, "\"kind\":\"train\"", 10, tr, 60);
  FILE *mf = fopen(p_m, "r");
  static double step[2][4096];
  int ns[2] = {0, 0};
  for (int blk = 0; blk < 2 * STEP_BLOCKS; blk++) {
    int loaded = blk % 2;
    loader ls, lt;
    if (loaded) load_both(&ls, ms, &lt, pt);
    take_steps(mf, 0, NULL, NULL, 0); /* what came before the change */
    double t0 = test_now();
    while (test_now() - t0 < 1.0) {
      take_steps(mf, test_now() - t0 > 0.05, step[loaded], &ns[loaded], 4096);
      nap(0.005);
    }
    if (loaded) load_stop(&ls), load_stop(&lt);
  }
  fclose(mf);
  proc_kill9(tr);
  ck_assert_msg(ns[0] > 50 && ns[1] > 50, "steps seen: %d, %d", ns[0], ns[1]);
  /* The Lookup p99: blocks of Lookups, with and without the load in turn;
   * each block's p99, and each kind's median of them (a burst of the
   * machine's other work spoils a few blocks, not the median). */
  double bp99[2][LOOKUP_BLOCKS];
  for (int b = 0; b < 2 * LOOKUP_BLOCKS; b++) {
    int loaded = b % 2;
    loader ls;
    if (loaded) {
      load_start(&ls, ms);
      double t0 = test_now();
      while (ls.n < IDLE || !ls.slow_bytes) {
        ck_assert_msg(test_now() - t0 < 60, "the load did not connect");
        nap(0.01);
      }
    }
    double *bl = lat[loaded] + (b / 2) * LOOKUP_BLOCK;
    lookups(store, plan, LOOKUP_BLOCK, bl);
    qsort(bl, LOOKUP_BLOCK, sizeof bl[0], cmp_double);
    bp99[loaded][b / 2] = bl[LOOKUP_BLOCK * 99 / 100];
    if (loaded) {
      char *m = http_get(ms, "/metrics"); /* a scrape still answers */
      ck_assert_ptr_nonnull(m);
      ck_assert_ptr_nonnull(strstr(m, "shardrec_server_calls_total{method=\"lookup\"}"));
      free(m);
      load_stop(&ls);
    }
  }
  const int nl = LOOKUP_BLOCKS * LOOKUP_BLOCK;
  double sb = sr_median(step[0], ns[0]), sl = sr_median(step[1], ns[1]);
  double pb = sr_median(bp99[0], LOOKUP_BLOCKS), pl = sr_median(bp99[1], LOOKUP_BLOCKS);
  fprintf(stderr, "step time (median) %.2f ms without, %.2f ms with the load (x%.3f; %d and %d "
                  "steps); Lookup p99 (median of %d blocks) %.3f ms without, %.3f ms with (x%.3f; %d "
                  "Lookups each)\n",
          1e3 * sb, 1e3 * sl, sl / sb, ns[0], ns[1], LOOKUP_BLOCKS, 1e3 * pb, 1e3 * pl, pl / pb, nl);
  ck_assert_msg(sl <= 1.25 * sb, "step time %.3f ms under load vs %.3f ms", 1e3 * sl, 1e3 * sb);
  ck_assert_msg(pl <= 2 * pb, "Lookup p99 %.3f ms under load vs %.3f ms", 1e3 * pl, 1e3 * pb);
  emb_store_destroy(store);
  emb_plan_free(plan);
  kill(srv, SIGTERM);
  ck_assert_int_eq(wait_exit(srv, 30), 0);
  sr_rmtree(d);
  free(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("metrics_load");
  TCase *tc = tcase_create("load");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, test_slow_clients_do_not_stall);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
