/* Admin calls confined (rpc/shardrec.proto, "Admin calls"): Checkpoint and
 * Restore of the service over an in-memory store and over a RocksDB shard
 * store (a real folder), with and without a checkpoint root: paths inside
 * the root are served; outside it, escaping it through ".." or a symlink,
 * or naming a folder that exists, they are refused and nothing outside is
 * made; without a root both are refused naming the flag; a string field
 * with a NUL byte or another control character in it is refused naming the
 * field, in every request, and nothing is written. Then real
 * processes (a server of a checkpoint, the third store kind, too): a trainer whose --save-checkpoint or --save-model lies outside
 * its servers' root stops at start, naming the flag, the folder and the
 * root; one inside trains and saves. */
#include <check.h>

#include "tests/check_main.h"

#include <sys/stat.h>

#include "embedding/plan.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"
#include "tests/support/servers.h"

static char *dir;
static emb_plan *plan;

/* dir/name in one of 8 static buffers. */
static const char *at(const char *name) {
  static char buf[8][700];
  static int i;
  i = (i + 1) % 8;
  snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
  return buf[i];
}

static void setup(void) {
  dir = tmpdir_make("test");
  uint64_t rows[1] = {100};
  emb_plan_params pp = {.n_tables = 1, .rows = rows, .dim = 4,
                        .optim = {.kind = EMB_OPT_SGD, .eps = -1}, .seed = 5, .n_shards = 2,
                        .row_wise = 1};
  char err[512];
  ck_assert_msg(emb_plan_create(&pp, &plan, err, sizeof err) == 0, "%s", err);
  /* root/, out/ beside it, root/esc -> out, root/in -> root/sub */
  ck_assert_int_eq(run_cmd(NULL, "cd %s && mkdir -p root/sub out && ln -s %s/out root/esc && "
                                 "ln -s %s/root/sub root/in", dir, dir, dir), 0);
}

static void teardown(void) {
  emb_plan_free(plan);
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* Checkpoint (restore 0) or Restore of path; the status, the message in msg. */
static int admin(rpc_service *svc, int restore, const char *path, char *msg, size_t n) {
  char fp[EMB_FP_HEX];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  uint8_t b[8192];
  size_t len;
  if (!restore) {
    Shardrec__V1__CheckpointRequest q = SHARDREC__V1__CHECKPOINT_REQUEST__INIT;
    q.plan_fingerprint = fp;
    q.path = (char *)path;
    len = shardrec__v1__checkpoint_request__pack(&q, b);
  } else {
    Shardrec__V1__RestoreRequest q = SHARDREC__V1__RESTORE_REQUEST__INIT;
    q.plan_fingerprint = fp;
    q.path = (char *)path;
    len = shardrec__v1__restore_request__pack(&q, b);
  }
  rpc_reply r;
  rpc_service_handle(svc, restore ? RPC_RESTORE : RPC_CHECKPOINT, b, len, &r);
  snprintf(msg, n, "%s", r.msg);
  free(r.out);
  return r.status;
}

static int exists(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0;
}

/* Every rule, on a service over store (serving shard 0) with root dir/root. */
static void check_rules(emb_store *store, const char *tag) {
  char err[512], msg[600], p[700];
  int shard = 0;
  /* No root: both refused, naming the flag. */
  rpc_service_opts o = {.shards = &shard, .n_shards = 1};
  rpc_service *svc = rpc_service_create(plan, store, &o, err, sizeof err);
  ck_assert_msg(svc, "%s", err);
  snprintf(p, sizeof p, "%s/root/%s-a", dir, tag);
  ck_assert_int_eq(admin(svc, 0, p, msg, sizeof msg), RPC_FAILED_PRECONDITION);
  ck_assert_msg(strstr(msg, "--checkpoint-root") && strstr(msg, "Checkpoint"), "%s", msg);
  ck_assert_int_eq(admin(svc, 1, p, msg, sizeof msg), RPC_FAILED_PRECONDITION);
  ck_assert_msg(strstr(msg, "--checkpoint-root") && strstr(msg, "Restore"), "%s", msg);
  ck_assert(!exists(p));
  rpc_service_destroy(svc);

  const char *root = at("root");
  o.checkpoint_roots = &root;
  o.n_roots = 1;
  svc = rpc_service_create(plan, store, &o, err, sizeof err);
  ck_assert_msg(svc, "%s", err);
  /* Inside: written (path/shard-0 either way), then restored. */
  ck_assert_msg(admin(svc, 0, p, msg, sizeof msg) == RPC_OK, "%s", msg);
  snprintf(p, sizeof p, "%s/root/%s-a/shard-0", dir, tag);
  ck_assert_msg(exists(p), "%s not written", p);
  snprintf(p, sizeof p, "%s/root/%s-a", dir, tag);
  ck_assert_msg(admin(svc, 1, p, msg, sizeof msg) == RPC_OK, "%s", msg);
  /* A target that exists: refused, whatever is in it stays. */
  ck_assert_int_eq(admin(svc, 0, p, msg, sizeof msg), RPC_ALREADY_EXISTS);
  ck_assert_msg(strstr(msg, "shard-0") && strstr(msg, "exists"), "%s", msg);
  /* Through a symlink that stays inside: fine. */
  snprintf(p, sizeof p, "%s/root/in/%s-b", dir, tag);
  ck_assert_msg(admin(svc, 0, p, msg, sizeof msg) == RPC_OK, "%s", msg);
  snprintf(p, sizeof p, "%s/root/sub/%s-b/shard-0", dir, tag);
  ck_assert_msg(exists(p), "%s not written", p);
  /* Outside, through "..", through a symlink: refused naming path and root,
   * nothing made under out/. */
  const char *bad[3] = {"%s/out/%s-c", "%s/root/../out/%s-c", "%s/root/esc/%s-c"};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, bad[i], dir, tag);
    ck_assert_int_eq(admin(svc, 0, p, msg, sizeof msg), RPC_PERMISSION_DENIED);
    ck_assert_msg(strstr(msg, p) && strstr(msg, "/root") && strstr(msg, "outside"), "%s", msg);
    ck_assert_int_eq(admin(svc, 1, p, msg, sizeof msg), RPC_PERMISSION_DENIED);
    snprintf(p, sizeof p, "%s/out/%s-c", dir, tag);
    ck_assert_msg(!exists(p), "%s made", p);
  }
  /* ".." after a folder that does not exist cannot be resolved. */
  snprintf(p, sizeof p, "%s/root/nothere/../%s-d", dir, tag);
  ck_assert_int_eq(admin(svc, 0, p, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  /* Into a complete checkpoint step (manifest.json and DONE), at any depth:
   * refused, nothing made in it; a step still being written takes it. */
  ck_assert_int_eq(run_cmd(NULL, "cd %s/root && mkdir -p %s-ck/step-5/shards && touch "
                                 "%s-ck/step-5/manifest.json %s-ck/step-5/DONE", dir, tag, tag,
                           tag), 0);
  const char *in_step[2] = {"%s/root/%s-ck/step-5/shards", "%s/root/%s-ck/step-5/x/y"};
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, in_step[i], dir, tag);
    ck_assert_int_eq(admin(svc, 0, p, msg, sizeof msg), RPC_FAILED_PRECONDITION);
    ck_assert_msg(strstr(msg, "lies in the complete checkpoint") && strstr(msg, "step-5"), "%s",
                  msg);
  }
  ck_assert_int_eq(run_cmd(NULL, "cd %s/root/%s-ck/step-5 && test \"$(ls | tr '\\n' ' ')\" = "
                                 "'DONE manifest.json shards ' && ! ls shards/*", dir, tag), 0);
  ck_assert_int_eq(run_cmd(NULL, "rm %s/root/%s-ck/step-5/DONE", dir, tag), 0);
  snprintf(p, sizeof p, "%s/root/%s-ck/step-5/shards", dir, tag);
  ck_assert_msg(admin(svc, 0, p, msg, sizeof msg) == RPC_OK, "%s", msg);
  /* Restore from a folder whose shard folder is a symlink out of the root. */
  ck_assert_int_eq(run_cmd(NULL, "cd %s && mkdir -p out/%s-e root/%s-e && ln -s %s/out/%s-e "
                                 "root/%s-e/shard-0", dir, tag, tag, dir, tag, tag), 0);
  snprintf(p, sizeof p, "%s/root/%s-e", dir, tag);
  ck_assert_int_eq(admin(svc, 1, p, msg, sizeof msg), RPC_PERMISSION_DENIED);
  ck_assert_msg(strstr(msg, "shard-0"), "%s", msg);
  /* Stats names the root. */
  Shardrec__V1__StatsRequest sq = SHARDREC__V1__STATS_REQUEST__INIT;
  uint8_t b[16];
  size_t len = shardrec__v1__stats_request__pack(&sq, b);
  rpc_reply r;
  rpc_service_handle(svc, RPC_STATS, b, len, &r);
  ck_assert_int_eq(r.status, RPC_OK);
  Shardrec__V1__StatsResponse *a = shardrec__v1__stats_response__unpack(NULL, r.out_len, r.out);
  ck_assert_ptr_nonnull(a);
  ck_assert_int_eq(a->n_checkpoint_roots, 1);
  ck_assert_str_eq(a->checkpoint_roots[0], root);
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  free(r.out);
  rpc_service_destroy(svc);
}

START_TEST(test_confined_in_memory) {
  char err[512];
  emb_store *store = emb_store_create_local(plan, err, sizeof err);
  ck_assert_msg(store, "%s", err);
  check_rules(store, "mem");
  emb_store_destroy(store);
}
END_TEST

START_TEST(test_confined_rocksdb) {
  char err[512];
  int k = 0;
  emb_shard_config sc = {.cache_rows = EMB_SHARD_MIN_CACHE_ROWS, .n_hosted = 1, .hosted = &k};
  emb_store *store = emb_store_create_shard(plan, at("data"), &sc, err, sizeof err);
  ck_assert_msg(store, "%s", err);
  check_rules(store, "kv");
  emb_store_destroy(store);
}
END_TEST

/* A length-delimited field num of bytes v[n], as given (a NUL or a newline
 * included: protobuf-c's pack would stop at a NUL), at b; past it. */
static uint8_t *put_bytes(uint8_t *b, unsigned num, const void *v, size_t n) {
  *b++ = (uint8_t)(num << 3 | 2);
  size_t k = n;
  do {
    *b++ = (uint8_t)((k & 0x7f) | (k > 0x7f ? 0x80 : 0));
    k >>= 7;
  } while (k);
  memcpy(b, v, n);
  return b + n;
}

/* Checkpoint (restore 0) or Restore bytes of fingerprint fp[fn] and path
 * p[pn] into b; their length. */
static size_t admin_bytes(uint8_t *b, int restore, const char *fp, size_t fn, const char *p,
                          size_t pn) {
  uint8_t *e = put_bytes(b, 1, fp, fn);
  return (size_t)(put_bytes(e, restore ? 2 : 3, p, pn) - b);
}

/* Method m of svc on in[len]: the status, the message in msg[600]. */
static int call(rpc_service *svc, rpc_method m, const uint8_t *in, size_t len, char *msg) {
  rpc_reply r;
  rpc_service_handle(svc, m, in, len, &r);
  snprintf(msg, 600, "%s", r.msg);
  free(r.out);
  return r.status;
}

/* A string field holding a control character (a NUL that protobuf-c would
 * hand on as a shorter C string, a newline) is refused INVALID_ARGUMENT
 * naming the field and the byte, in every request that has one, and
 * nothing is written or restored; bytes of UTF-8 are not control
 * characters. */
START_TEST(test_control_bytes_refused) {
  char err[512], msg[600], fp[EMB_FP_HEX], p[700];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  const size_t fn = strlen(fp);
  emb_store *store = emb_store_create_local(plan, err, sizeof err);
  ck_assert_msg(store, "%s", err);
  int shard = 0;
  const char *root = at("root");
  rpc_service_opts o = {.shards = &shard, .n_shards = 1, .checkpoint_roots = &root, .n_roots = 1};
  rpc_service *svc = rpc_service_create(plan, store, &o, err, sizeof err);
  ck_assert_msg(svc, "%s", err);
  uint8_t b[2048];
  /* Checkpoint of "root/cut\0x", of "root/cut\nx": refused, root/cut not made. */
  const char tail[2][3] = {{0, 'x', 0}, {'\n', 'x', 0}};
  for (int i = 0; i < 2; i++) {
    int n = snprintf(p, sizeof p, "%s/root/cut", dir);
    memcpy(p + n, tail[i], 2);
    size_t len = admin_bytes(b, 0, fp, fn, p, (size_t)n + 2);
    ck_assert_int_eq(call(svc, RPC_CHECKPOINT, b, len, msg), RPC_INVALID_ARGUMENT);
    char want[128];
    snprintf(want, sizeof want, "path at offset %zu: byte 0x%02x in a string", len - 2,
             (unsigned)(uint8_t)tail[i][0]);
    ck_assert_msg(strstr(msg, "shardrec.v1.CheckpointRequest") && strstr(msg, want), "%s", msg);
    ck_assert_msg(!exists(at("root/cut")), "%s made", at("root/cut"));
  }
  /* A checkpoint in root/ok (a UTF-8 name); its Restore as "root/ok\0x": refused. */
  snprintf(p, sizeof p, "%s/root/ok\xc3\xa9", dir);
  size_t len = admin_bytes(b, 0, fp, fn, p, strlen(p));
  ck_assert_msg(call(svc, RPC_CHECKPOINT, b, len, msg) == RPC_OK, "%s", msg);
  p[strlen(p) + 1] = 'x'; /* past the NUL */
  len = admin_bytes(b, 1, fp, fn, p, strlen(p) + 2);
  ck_assert_int_eq(call(svc, RPC_RESTORE, b, len, msg), RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "shardrec.v1.RestoreRequest") && strstr(msg, "path at offset") &&
                strstr(msg, "byte 0x00"), "%s", msg);
  /* The plan fingerprint followed by a NUL and more: refused, nothing made. */
  char fpx[EMB_FP_HEX + 8];
  memcpy(fpx, fp, fn);
  memcpy(fpx + fn, "\0junk", 5);
  snprintf(p, sizeof p, "%s/root/fpx", dir);
  len = admin_bytes(b, 0, fpx, fn + 5, p, strlen(p));
  ck_assert_int_eq(call(svc, RPC_CHECKPOINT, b, len, msg), RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "plan_fingerprint at offset"), "%s", msg);
  ck_assert(!exists(p));
  /* A Watch's and a Lookup's header.job_id, a health check's service. */
  uint8_t h[256];
  size_t hn = (size_t)(put_bytes(put_bytes(h, 1, fp, fn), 2, "job\0x", 5) - h);
  len = (size_t)(put_bytes(b, 1, h, hn) - b);
  ck_assert_int_eq(call(svc, RPC_WATCH, b, len, msg), RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "WatchRequest") && strstr(msg, "header.job_id at offset"), "%s", msg);
  ck_assert_int_eq(call(svc, RPC_LOOKUP, b, len, msg), RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "LookupRequest") && strstr(msg, "header.job_id at offset"), "%s", msg);
  len = (size_t)(put_bytes(b, 1, "shardrec.v1.EmbeddingShard\0", 27) - b);
  ck_assert_int_eq(call(svc, RPC_HEALTH_CHECK, b, len, msg), RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "service at offset 28: byte 0x00"), "%s", msg);
  rpc_service_destroy(svc);
  emb_store_destroy(store);
}
END_TEST

/* The fingerprint of the plan data/p.json into fp. */
static void data_fp(const char *data, char *fp) {
  char pp[700], err[512];
  emb_plan *p;
  snprintf(pp, sizeof pp, "%s/p.json", data);
  ck_assert_msg(emb_plan_load(pp, &p, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(emb_plan_fingerprint(p, fp), 0);
  emb_plan_free(p);
}

/* Checkpoint (restore 0) or Restore of path on the server at addr, whose
 * plan is data/p.json: the gRPC status, its message in msg. */
static int remote_admin(const char *addr, const char *data, int restore, const char *path,
                        char *msg, size_t n) {
  char fp[EMB_FP_HEX];
  data_fp(data, fp);
  uint8_t b[8192], *resp = NULL;
  size_t len, rlen;
  if (!restore) {
    Shardrec__V1__CheckpointRequest q = SHARDREC__V1__CHECKPOINT_REQUEST__INIT;
    q.plan_fingerprint = fp;
    q.path = (char *)path;
    len = shardrec__v1__checkpoint_request__pack(&q, b);
  } else {
    Shardrec__V1__RestoreRequest q = SHARDREC__V1__RESTORE_REQUEST__INIT;
    q.plan_fingerprint = fp;
    q.path = (char *)path;
    len = shardrec__v1__restore_request__pack(&q, b);
  }
  int st = rpc_call_once(addr, NULL, restore ? RPC_RESTORE : RPC_CHECKPOINT, b, len, 30, &resp,
                         &rlen, msg, n);
  free(resp);
  return st;
}

/* Checkpoint of the n bytes at path (a NUL at path[strlen(path)] and one
 * more byte, 'x', past it) on the server at addr, as remote_admin. */
static int remote_admin_n(const char *addr, const char *data, char *path, size_t n, char *msg,
                          size_t msgn) {
  char fp[EMB_FP_HEX];
  data_fp(data, fp);
  path[strlen(path) + 1] = 'x';
  uint8_t b[2048], *resp = NULL;
  size_t len = admin_bytes(b, 0, fp, strlen(fp), path, n), rlen;
  int st = rpc_call_once(addr, NULL, RPC_CHECKPOINT, b, len, 30, &resp, &rlen, msg, msgn);
  free(resp);
  return st;
}

/* A trainer against a server whose root does not hold its folders stops
 * before training, naming the flag, the folder and the root; with the
 * folders inside, it trains and checkpoints through the server. */
START_TEST(test_trainer_checks_root) {
  char *data = make_data_dir(3000, 3, "%s train --processed-data-file d.bin --num-batches 1 "
                                      "--num-shards 1 --plan-out p.json > /dev/null && mkdir root",
                             bin_path());
  char args[1400], log[800], *out;
  snprintf(args, sizeof args, "--plan '%s/p.json' --shard 0 --checkpoint-root '%s/root'", data, data);
  snprintf(log, sizeof log, "%s/srv.log", data);
  test_server s;
  server_start(&s, args, log);
  const char *tr = "cd '%s' && '%s' train --processed-data-file d.bin --num-batches 4 "
                   "--plan p.json --shard-servers %s %s 2>&1";
  int rc = run_cmd(&out, tr, data, bin_path(), s.addr, "--save-checkpoint out/ck");
  ck_assert_msg(rc != 0 && strstr(out, "--save-checkpoint out/ck") &&
                strstr(out, "checkpoint root") && strstr(out, "/root") && !strstr(out, "step 1/"),
                "%s", out);
  free(out);
  rc = run_cmd(&out, tr, data, bin_path(), s.addr, "--save-model root/../m");
  ck_assert_msg(rc != 0 && strstr(out, "--save-model") && strstr(out, "checkpoint root"), "%s", out);
  free(out);
  rc = run_cmd(&out, tr, data, bin_path(), s.addr,
               "--save-checkpoint root/ck --checkpoint-every 2 --save-model root/m");
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(NULL, "cd '%s' && ls root/ck/step-4/shards/shard-0 root/m/step-4/shards/shard-0", data), 0);
  ck_assert_int_eq(server_stop(&s), 0);
  /* A server of that checkpoint (the third store kind): the same rules. */
  snprintf(args, sizeof args, "--checkpoint '%s/root/ck' --shard 0 --checkpoint-root '%s/root'",
           data, data);
  server_start(&s, args, log);
  char path[900], msg[600];
  snprintf(path, sizeof path, "%s/root/ck/step-4/shards", data);
  ck_assert_int_eq(remote_admin(s.addr, data, 0, path, msg, sizeof msg), RPC_FAILED_PRECONDITION);
  ck_assert_msg(strstr(msg, "lies in the complete checkpoint") && strstr(msg, "step-4"), "%s", msg);
  snprintf(path, sizeof path, "%s/root/ck/step-4/sub", data); /* the step served: the same */
  ck_assert_int_eq(remote_admin(s.addr, data, 0, path, msg, sizeof msg), RPC_FAILED_PRECONDITION);
  ck_assert_int_eq(run_cmd(NULL, "test ! -e '%s/root/ck/step-4/sub'", data), 0);
  snprintf(path, sizeof path, "%s/root/../m2", data);
  ck_assert_int_eq(remote_admin(s.addr, data, 0, path, msg, sizeof msg), RPC_PERMISSION_DENIED);
  ck_assert_msg(strstr(msg, "outside the checkpoint root"), "%s", msg);
  snprintf(path, sizeof path, "%s/root/again", data);
  ck_assert_msg(remote_admin(s.addr, data, 0, path, msg, sizeof msg) == RPC_OK, "%s", msg);
  /* A path with a NUL inside: refused naming the field, root/cut not made
   * (read as a C string it would be). */
  snprintf(path, sizeof path, "%s/root/cut", data);
  ck_assert_int_eq(remote_admin_n(s.addr, data, path, strlen(path) + 2, msg, sizeof msg),
                   RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "path at offset") && strstr(msg, "byte 0x00"), "%s", msg);
  snprintf(path, sizeof path, "%s/root/cut", data);
  ck_assert_msg(!exists(path), "%s made", path);
  ck_assert_int_eq(server_stop(&s), 0);
  /* A server without a root: the trainer says so. */
  snprintf(args, sizeof args, "--plan '%s/p.json' --shard 0", data);
  server_start(&s, args, log);
  rc = run_cmd(&out, tr, data, bin_path(), s.addr, "--save-checkpoint root/ck2");
  ck_assert_msg(rc != 0 && strstr(out, "no checkpoint root") && strstr(out, "--checkpoint-root"),
                "%s", out);
  free(out);
  ck_assert_int_eq(server_stop(&s), 0);
  /* serve --checkpoint-root must name a folder: a flag error. */
  rc = run_cmd(&out, "'%s' serve --plan '%s/p.json' --shard 0 --checkpoint-root '%s/nope'",
               bin_path(), data, data);
  ck_assert_msg(rc == 2 && strstr(out, "--checkpoint-root") && strstr(out, "nope"), "%s", out);
  free(out);
  run_cmd(NULL, "rm -rf %s", data);
  free(data);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_admin");
  TCase *tc = tcase_create("admin");
  tcase_set_timeout(tc, 240);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_confined_in_memory);
  tcase_add_test(tc, test_confined_rocksdb);
  tcase_add_test(tc, test_control_bytes_refused);
  tcase_add_test(tc, test_trainer_checks_root);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
