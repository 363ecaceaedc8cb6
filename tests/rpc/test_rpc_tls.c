/* TLS and mutual TLS between the remote store and `shardrec serve`, with
 * throwaway certificates made by openssl in the test: a client with a
 * certificate signed by the server's client CA gets rows; a client without
 * one, or with one from another CA, is refused; a plaintext client is
 * refused. */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "tests/rpc/server.h"

static char *dir;
static char plan_path[512];
static emb_plan *plan;
static test_server srv;

static char *path(const char *name) {
  static char buf[8][600];
  static int i;
  i = (i + 1) % 8;
  snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
  return buf[i];
}

static void setup(void) {
  dir = make_tmpdir();
  char *out;
  const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  int rc = run_cmd(&out,
      "cd %s && "
      "openssl req -x509 %s -keyout ca.key -out ca.pem -days 2 -subj /CN=shardrec-test-ca && "
      "openssl req -x509 %s -keyout ca2.key -out ca2.pem -days 2 -subj /CN=other-ca && "
      "openssl req %s -keyout srv.key -out srv.csr -subj /CN=localhost && "
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > srv.ext && "
      "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 -extfile srv.ext && "
      "openssl req %s -keyout cli.key -out cli.csr -subj /CN=trainer && "
      "openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cli.pem -days 2 && "
      "openssl req %s -keyout bad.key -out bad.csr -subj /CN=intruder && "
      "openssl x509 -req -in bad.csr -CA ca2.pem -CAkey ca2.key -CAcreateserial -out bad.pem -days 2",
      dir, ec, ec, ec, ec, ec);
  ck_assert_msg(rc == 0, "openssl: %s", out);
  free(out);
  snprintf(plan_path, sizeof plan_path, "%s/plan.json", dir);
  uint64_t rows[1] = {100};
  emb_plan_params pp = {.n_tables = 1, .rows = rows, .dim = 4, .optim = {.kind = EMB_OPT_SGD, .eps = -1},
                        .seed = 5, .n_shards = 1};
  char err[512];
  emb_plan *p;
  ck_assert_msg(emb_plan_create(&pp, &p, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(emb_plan_save(p, plan_path, err, sizeof err) == 0, "%s", err);
  emb_plan_free(p);
  ck_assert_msg(emb_plan_load(plan_path, &plan, err, sizeof err) == 0, "%s", err);
  char args[2000];
  snprintf(args, sizeof args, "--plan '%s' --shard 0 --tls-cert '%s' --tls-key '%s' --tls-client-ca '%s'",
           plan_path, path("srv.pem"), path("srv.key"), path("ca.pem"));
  server_start(&srv, args, path("srv.log"));
}

static void teardown(void) {
  int st = server_stop(&srv);
  ck_assert_msg(st == 0, "server exited with %d", st);
  emb_plan_free(plan);
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* Lookup 3 rows through a remote store with tls (NULL: plaintext). */
static int try_lookup(const rpc_tls *tls, char *err, size_t errlen) {
  const char *addr[1] = {srv.addr};
  rpc_client_opts o = {.deadline_s = 5, .max_tries = 2, .backoff_s = 0.05, .tls = tls};
  emb_store *s = emb_store_create_remote(plan, addr, 1, &o, err, errlen);
  if (!s) return -100;
  uint64_t ids[3] = {1, 2, 3};
  const uint64_t *ip[1] = {ids};
  size_t counts[1] = {3};
  emb_idset set = {1, ip, counts};
  float rows[12], expect[12];
  float *op[1] = {rows};
  int rc = emb_store_lookup_begin(s, 0, &set, op);
  if (!rc) rc = emb_store_lookup_wait(s);
  snprintf(err, errlen, "%s", emb_store_errmsg(s));
  if (!rc) {
    for (int i = 0; i < 3; i++) emb_row_init(plan, 0, ids[i], expect + 4 * i);
    ck_assert(memcmp(rows, expect, sizeof rows) == 0);
  }
  emb_store_destroy(s);
  return rc;
}

START_TEST(test_mtls) {
  char err[1024];
  rpc_tls good = {.cert = path("cli.pem"), .key = path("cli.key"), .ca = path("ca.pem")};
  ck_assert_msg(try_lookup(&good, err, sizeof err) == 0, "mTLS client refused: %s", err);
  rpc_tls nocert = {.ca = path("ca.pem")};
  ck_assert_msg(try_lookup(&nocert, err, sizeof err) != 0, "a client without a certificate got rows");
  ck_assert_msg(strstr(err, srv.addr), "%s", err);
  rpc_tls other = {.cert = path("bad.pem"), .key = path("bad.key"), .ca = path("ca.pem")};
  ck_assert_msg(try_lookup(&other, err, sizeof err) != 0, "a client of another CA got rows");
  ck_assert_msg(try_lookup(NULL, err, sizeof err) != 0, "a plaintext client got rows");
  /* A client that does not trust the server's CA refuses it. */
  rpc_tls distrust = {.cert = path("cli.pem"), .key = path("cli.key"), .ca = path("ca2.pem")};
  ck_assert_msg(try_lookup(&distrust, err, sizeof err) != 0, "server of an untrusted CA accepted");
  /* Still serving the good client (path() reuses its buffers: name the
   * files again). */
  good = (rpc_tls){.cert = path("cli.pem"), .key = path("cli.key"), .ca = path("ca.pem")};
  ck_assert_msg(try_lookup(&good, err, sizeof err) == 0, "%s", err);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_tls");
  TCase *tc = tcase_create("tls");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_mtls);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
