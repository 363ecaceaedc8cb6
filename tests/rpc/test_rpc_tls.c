/* TLS and mutual TLS between the remote store and `shardrec serve`, with
 * throwaway certificates made by openssl in the test: a client with a
 * certificate signed by the server's client CA gets rows; a client without
 * one, or with one from another CA, is refused; a plaintext client is
 * refused, and the server says each refusal in one line of its own (a
 * JSON event with --log-format json), the trainer what it lacks, at once.
 * Who may call what (--allow-push, --allow-admin: a Python grpcio
 * client, tests/rpc/auth_client.py), what the server says at start about
 * it, and the loopback rule without client certificates; TLS files checked
 * before gRPC sees them; a certificate renewed under a running job
 * (SIGHUP). */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>
#include <sys/stat.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "tests/support/servers.h"

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
  dir = tmpdir_make("test");
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
      "openssl x509 -req -in bad.csr -CA ca2.pem -CAkey ca2.key -CAcreateserial -out bad.pem -days 2 && "
      "openssl req %s -keyout ops.key -out ops.csr -subj /CN=ops && "
      "openssl x509 -req -in ops.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out ops.pem -days 30 && "
      "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out long.pem -days 30 -extfile srv.ext && "
      "mkdir root out && ln -s %s/out root/esc",
      dir, ec, ec, ec, ec, ec, ec, dir);
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

/* A remote store over the server at addr with tls; NULL with err. */
static emb_store *open_at(const char *at, const rpc_tls *tls, char *err, size_t errlen) {
  const char *addr[1] = {at};
  rpc_client_opts o = {.deadline_s = 5, .max_tries = 2, .backoff_s = 0.05, .tls = tls};
  return emb_store_create_remote(plan, addr, 1, &o, err, errlen);
}

/* Lookup 3 rows through store s: 0 with the right rows, or its error. */
static int lookup3(emb_store *s, char *err, size_t errlen) {
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
  return rc;
}

/* Lookup 3 rows through a fresh remote store over at with tls (NULL:
 * plaintext). */
static int lookup_at(const char *at, const rpc_tls *tls, char *err, size_t errlen) {
  emb_store *s = open_at(at, tls, err, errlen);
  if (!s) return -100;
  int rc = lookup3(s, err, errlen);
  emb_store_destroy(s);
  return rc;
}

static int try_lookup(const rpc_tls *tls, char *err, size_t errlen) {
  return lookup_at(srv.addr, tls, err, errlen);
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
  /* The server said each refusal in a line of its own, not gRPC's. */
  static const char *const said[] = {
      "no client certificate", "the client's certificate is not signed by the client CA",
      "not TLS: a plaintext client"};
  for (int i = 0; i < 3; i++) {
    char line[200];
    snprintf(line, sizeof line, "server: refused a TLS handshake: %s", said[i]);
    wait_text(path("srv.log"), line, 1, srv.pid, 30);
  }
  char *log = slurp(path("srv.log"));
  ck_assert_msg(!strstr(log, "Handshake failed"), "%s", log);
  free(log);
}
END_TEST

/* `serve --plan P --shard 0 ARGS` in the background, its stdout and stderr
 * into dir/name, until its "listening on" line; its address into addr. */
static pid_t serve_bg(const char *name, const char *args, char *addr, size_t n) {
  const char *out = path(name);
  pid_t pid = spawn_sh("exec '%s' serve --plan '%s' --shard 0 %s > '%s' 2>&1", bin_path(),
                       plan_path, args, out);
  wait_text(out, "listening on", 1, pid, 30);
  char *text = slurp(out);
  const char *at = strstr(text, "listening on ");
  ck_assert_ptr_nonnull(at);
  ck_assert_int_eq(sscanf(at, "listening on %63s", addr), 1);
  (void)n;
  free(text);
  return pid;
}

static void stop_bg(pid_t pid) {
  kill(pid, SIGTERM);
  int st = wait_exit(pid, 30);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit status %d", st);
}

/* A run of serve (that must not start) with args: its exit code, and its
 * output in *out. */
static int serve_fails(char **out, const char *args) {
  return run_cmd(out, "timeout 30 '%s' serve --plan '%s' --shard 0 %s", bin_path(), plan_path, args);
}

/* Python grpcio client (tests/rpc/auth_client.py): Push only for CN
 * trainer, Checkpoint/Restore only for CN ops, the rest for both; admin
 * paths inside the root written, outside it (directly, through "..",
 * through a symlink) refused. The server says who may call what. */
START_TEST(test_allow_lists_python) {
  const char *src = getenv("SHARDREC_SRC");
  ck_assert_ptr_nonnull(src);
  char *out, addr[64], fp[EMB_FP_HEX], args[2000];
  int rc = run_cmd(&out, "mkdir -p %s/py && protoc -I%s --python_out=%s/py %s/rpc/shardrec.proto "
                         "%s/rpc/health.proto", dir, src, dir, src, src);
  ck_assert_msg(rc == 0, "python stubs: %s", out);
  free(out);
  snprintf(args, sizeof args, "--tls-cert '%s' --tls-key '%s' --tls-client-ca '%s' --allow-push "
           "trainer --allow-admin ops --checkpoint-root '%s'", path("srv.pem"), path("srv.key"),
           path("ca.pem"), path("root"));
  pid_t pid = serve_bg("auth.out", args, addr, sizeof addr);
  char *said = slurp(path("auth.out"));
  ck_assert_msg(strstr(said, "access: mTLS") && strstr(said, "Push: trainer") &&
                strstr(said, "GetTransform: every verified client") &&
                strstr(said, "Checkpoint, Restore, SwapAt: ops"), "%s", said);
  free(said);
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  rc = run_cmd(&out, "/usr/bin/python3 '%s/tests/rpc/auth_client.py' '%s/py' %s '%s' %s '%s' '%s'",
               src, dir, addr, dir, fp, path("root"), path("out"));
  ck_assert_msg(rc == 0 && strstr(out, "all checks passed"), "python client (rc %d):\n%s", rc, out);
  free(out);
  stop_bg(pid);
}
END_TEST

/* What the server says at start, and where it may listen: mTLS without
 * lists is open to every verified client (said); without client
 * certificates only loopback unless --insecure (said too); allow lists
 * need mTLS. */
START_TEST(test_access_rules_at_start) {
  char addr[64], args[2000], *out;
  snprintf(args, sizeof args, "--tls-cert '%s' --tls-key '%s' --tls-client-ca '%s'",
           path("long.pem"), path("srv.key"), path("ca.pem"));
  pid_t pid = serve_bg("open.out", args, addr, sizeof addr);
  char *said = slurp(path("open.out"));
  ck_assert_msg(strstr(said, "every method is open to every client with a certificate"), "%s", said);
  free(said);
  stop_bg(pid);
  ck_assert_int_eq(serve_fails(&out, "--listen 0.0.0.0:0"), 2);
  ck_assert_msg(strstr(out, "0.0.0.0:0 is not a loopback address") && strstr(out, "--insecure"),
                "%s", out);
  free(out);
  snprintf(args, sizeof args, "--listen 0.0.0.0:0 --tls-cert '%s' --tls-key '%s'", path("long.pem"),
           path("srv.key"));
  ck_assert_int_eq(serve_fails(&out, args), 2);
  ck_assert_msg(strstr(out, "not a loopback address"), "%s", out);
  free(out);
  ck_assert_int_eq(serve_fails(&out, "--allow-push trainer"), 2);
  ck_assert_msg(strstr(out, "need mTLS"), "%s", out);
  free(out);
  pid = serve_bg("insecure.out", "--listen 0.0.0.0:0 --insecure", addr, sizeof addr);
  said = slurp(path("insecure.out"));
  ck_assert_msg(strstr(said, "access: no client certificates (plaintext): every method") &&
                strstr(said, "--insecure"), "%s", said);
  free(said);
  stop_bg(pid);
}
END_TEST

/* TLS files checked before gRPC sees them: each mistake named with its
 * file, never "cannot listen"; a certificate near its end is warned
 * about, one with a month left is not. */
START_TEST(test_tls_file_mistakes) {
  FILE *g = fopen(path("garbage.pem"), "w");
  ck_assert_ptr_nonnull(g);
  fputs("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n", g);
  fclose(g);
  struct {
    const char *cert, *key, *ca, *want;
  } cases[] = {
      {"srv.pem", "cli.key", "ca.pem", "cli.key does not match the certificate --tls-cert"},
      {"garbage.pem", "srv.key", "ca.pem", "garbage.pem: not a PEM certificate"},
      {"srv.pem", "srv.key", "garbage.pem", "--tls-client-ca"},
      {"srv.pem", "srv.pem", "ca.pem", "srv.pem: not a PEM private key"},
      {"srv.pem", "nope.key", "ca.pem", "nope.key: cannot open"},
      {"nope.pem", "srv.key", NULL, "--tls-cert"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char args[2000], *out, ca[700] = "";
    if (cases[i].ca) snprintf(ca, sizeof ca, "--tls-client-ca '%s'", path(cases[i].ca));
    snprintf(args, sizeof args, "--tls-cert '%s' --tls-key '%s' %s", path(cases[i].cert),
             path(cases[i].key), ca);
    int rc = serve_fails(&out, args);
    ck_assert_msg(rc == 1 && strstr(out, cases[i].want) && !strstr(out, "cannot listen"),
                  "case %zu (rc %d): %s", i, rc, out);
    free(out);
  }
  char addr[64], args[2000], err[1024];
  snprintf(args, sizeof args, "--tls-cert '%s' --tls-key '%s'", path("srv.pem"), path("srv.key"));
  pid_t pid = serve_bg("soon.out", args, addr, sizeof addr);
  char *said = slurp(path("soon.out"));
  ck_assert_msg(strstr(said, "srv.pem: the certificate expires within 7 days"), "%s", said);
  free(said);
  /* A client's files are checked too. */
  rpc_tls bad_client = {.cert = path("cli.pem"), .key = path("srv.key"), .ca = path("garbage.pem")};
  ck_assert_ptr_null(open_at(addr, &bad_client, err, sizeof err));
  ck_assert_msg(strstr(err, "--tls-ca") && strstr(err, "garbage.pem: not a PEM certificate"), "%s", err);
  bad_client = (rpc_tls){.cert = path("cli.pem"), .key = path("srv.key"), .ca = path("ca.pem")};
  ck_assert_ptr_null(open_at(addr, &bad_client, err, sizeof err));
  ck_assert_msg(strstr(err, "srv.key does not match the certificate"), "%s", err);
  /* Server-only TLS serves a client without a certificate. */
  rpc_tls server_only = {.ca = path("ca.pem")};
  ck_assert_msg(lookup_at(addr, &server_only, err, sizeof err) == 0, "%s", err);
  stop_bg(pid);
  ck_assert_int_eq(run_cmd(NULL, "cd %s && openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key "
                                 "-CAcreateserial -out old.pem -days -1 -extfile srv.ext", dir), 0);
  snprintf(args, sizeof args, "--tls-cert '%s' --tls-key '%s'", path("old.pem"), path("srv.key"));
  pid = serve_bg("old.out", args, addr, sizeof addr);
  said = slurp(path("old.out"));
  ck_assert_msg(strstr(said, "old.pem: the certificate expired on"), "%s", said);
  free(said);
  stop_bg(pid);
  snprintf(args, sizeof args, "--tls-cert '%s' --tls-key '%s'", path("long.pem"), path("srv.key"));
  pid = serve_bg("month.out", args, addr, sizeof addr);
  said = slurp(path("month.out"));
  ck_assert_msg(!strstr(said, "expire"), "%s", said);
  free(said);
  stop_bg(pid);
}
END_TEST

/* Handshakes the server refuses, as the trainer and the server tell them:
 * `shardrec train` without a client certificate, with one of another CA,
 * and in plaintext against an mTLS server with --log-format json stops at
 * once (exit 1, a few tries, not ten as for a server that is down) saying
 * the server refused the TLS handshake and what it lacks; the server says
 * each refused handshake as one "tls_refused" event with the reason, and
 * prints none of gRPC's own handshake lines. */
START_TEST(test_handshake_refusals) {
  char *data = make_data_dir(2000, 3, "%s plan --out dplan.json --processed-data-file d.bin "
                                      "> /dev/null", bin_path());
  char args[2000], addr[64];
  const char *log = path("json.out");
  snprintf(args, sizeof args, "--tls-cert '%s' --tls-key '%s' --tls-client-ca '%s' "
           "--log-format json", path("srv.pem"), path("srv.key"), path("ca.pem"));
  pid_t pid = spawn_sh("exec '%s' serve --plan '%s/dplan.json' --shard 0 %s > '%s' 2>&1",
                       bin_path(), data, args, log);
  wait_text(log, "\"event\":\"start\"", 1, pid, 30);
  char *said = slurp(log);
  const char *at = strstr(said, "\"listen\":\"");
  ck_assert_msg(at && sscanf(at, "\"listen\":\"%63[^\"]", addr) == 1, "%s", said);
  free(said);
  struct {
    const char *flags, *trainer, *server;
  } cases[] = {
      {"--tls-ca ca.pem", "refused the TLS handshake: no client certificate (the server asks "
       "for one: give --tls-cert and --tls-key)", "\"reason\":\"no client certificate\""},
      {"--tls-ca ca.pem --tls-cert bad.pem --tls-key bad.key",
       "refused the TLS handshake: the client certificate --tls-cert bad.pem is not signed by "
       "the server's client CA", "\"reason\":\"the client's certificate is not signed by the "
       "client CA (or has expired)\""},
      {"", "refused the plaintext connection (closed it before any HTTP/2 frame): the server "
       "speaks TLS: give --tls-ca", "\"reason\":\"not TLS: a plaintext client\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *out;
    int rc = run_cmd(&out, "cd %s && timeout 60 '%s' train --processed-data-file '%s/d.bin' "
                           "--plan '%s/dplan.json' --shard-servers %s --num-batches 2 %s 2>&1",
                     dir, bin_path(), data, data, addr, cases[i].flags);
    char want[300];
    snprintf(want, sizeof want, "shard 0 server %s %s", addr, cases[i].trainer);
    ck_assert_msg(rc == 1 && strstr(out, want), "case %zu (rc %d): want '%s' in:\n%s", i, rc,
                  want, out);
    ck_assert_msg(!strstr(out, "UNAVAILABLE") && !strstr(out, "trying again"), "case %zu: %s", i,
                  out);
    free(out);
    char event[400];
    snprintf(event, sizeof event, "\"event\":\"tls_refused\",%s,\"detail\":\"SSL_ERROR_SSL: ",
             cases[i].server);
    wait_text(log, event, 1, pid, 30);
  }
  said = slurp(log);
  ck_assert_msg(!strstr(said, "Handshake failed") && !strstr(said, "ssl_transport_security"),
                "%s", said);
  /* One event a line, each a JSON object of the server's event shape. */
  for (const char *l = said; (l = strstr(l, "tls_refused")); l++) {
    const char *start = l, *end = strchr(l, '\n');
    while (start > said && start[-1] != '\n') start--;
    ck_assert_msg(!strncmp(start, "{\"time\":", 8) && end && end[-1] == '}', "%.300s", start);
  }
  free(said);
  stop_bg(pid);
  run_cmd(NULL, "rm -rf %s", data);
  free(data);
}
END_TEST

/* A certificate renewed under a running job: the server's certificate is
 * replaced by one of another CA and the server gets SIGHUP; a job's store
 * opened before keeps its connection and its lookups; a new connection
 * verifies against the new certificate (a client trusting only the old CA
 * is refused, one trusting the new CA gets rows). Bad files on a later
 * SIGHUP are refused and the last good ones stay. */
START_TEST(test_sighup_renews_certificate) {
  char *out, addr[64], args[2000], err[1024];
  ck_assert_int_eq(run_cmd(&out, "cd %s && cp srv.pem cur.pem && cp srv.key cur.key && "
                                 "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                                 "-keyout new.key -out new.csr -subj /CN=localhost && "
                                 "openssl x509 -req -in new.csr -CA ca2.pem -CAkey ca2.key "
                                 "-CAcreateserial -out new.pem -days 30 -extfile srv.ext", dir), 0);
  free(out);
  snprintf(args, sizeof args, "--tls-cert '%s' --tls-key '%s' --tls-client-ca '%s'",
           path("cur.pem"), path("cur.key"), path("ca.pem"));
  pid_t pid = serve_bg("hup.out", args, addr, sizeof addr);
  rpc_tls old_ca = {.cert = path("cli.pem"), .key = path("cli.key"), .ca = path("ca.pem")};
  emb_store *job = open_at(addr, &old_ca, err, sizeof err);
  ck_assert_msg(job, "%s", err);
  ck_assert_msg(lookup3(job, err, sizeof err) == 0, "%s", err);
  rpc_tls new_ca = {.cert = path("cli.pem"), .key = path("cli.key"), .ca = path("ca2.pem")};
  ck_assert_msg(lookup_at(addr, &new_ca, err, sizeof err) != 0, "new CA trusted before the renewal");
  ck_assert_int_eq(run_cmd(NULL, "cd %s && cp new.pem cur.pem && cp new.key cur.key", dir), 0);
  ck_assert_int_eq(kill(pid, SIGHUP), 0);
  wait_text(path("hup.out"), "TLS files reloaded", 1, pid, 30);
  new_ca = (rpc_tls){.cert = path("cli.pem"), .key = path("cli.key"), .ca = path("ca2.pem")};
  ck_assert_msg(lookup_at(addr, &new_ca, err, sizeof err) == 0, "after SIGHUP: %s", err);
  old_ca = (rpc_tls){.cert = path("cli.pem"), .key = path("cli.key"), .ca = path("ca.pem")};
  ck_assert_msg(lookup_at(addr, &old_ca, err, sizeof err) != 0, "old certificate still served");
  ck_assert_msg(lookup3(job, err, sizeof err) == 0, "the running job lost its server: %s", err);
  /* Bad files: refused, the renewed certificate stays. */
  ck_assert_int_eq(run_cmd(NULL, "cd %s && cp cli.key cur.key", dir), 0);
  ck_assert_int_eq(kill(pid, SIGHUP), 0);
  wait_text(path("hup.out"), "TLS reload failed", 1, pid, 30);
  char *said = slurp(path("hup.out"));
  ck_assert_msg(strstr(said, "cur.key does not match"), "%s", said);
  free(said);
  new_ca = (rpc_tls){.cert = path("cli.pem"), .key = path("cli.key"), .ca = path("ca2.pem")};
  ck_assert_msg(lookup_at(addr, &new_ca, err, sizeof err) == 0, "after a bad reload: %s", err);
  emb_store_destroy(job);
  stop_bg(pid);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_tls");
  TCase *tc = tcase_create("tls");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_mtls);
  tcase_add_test(tc, test_allow_lists_python);
  tcase_add_test(tc, test_access_rules_at_start);
  tcase_add_test(tc, test_tls_file_mistakes);
  tcase_add_test(tc, test_sighup_renews_certificate);
  tcase_add_test(tc, test_handshake_refusals);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
