/* The served data transform: a read-only server of a checkpoint gives its
 * fingerprint in Stats and its bytes through GetTransform, and a Python
 * grpcio client with no checkpoint folder (tests/rpc/transform_client.py)
 * fetches them in chunks, checks them against the fingerprint and maps the
 * raw rows of another day (datagen --row-seed) to exactly the ids and
 * dense floats that `convert --mapping-from CKPT` writes: dictionary
 * (with and without --max-ind-range), modulo and hash checkpoints. A
 * server started from a plan has no transform (Stats "", NOT_FOUND). Real
 * processes on loopback; the chunk limits and the fingerprint check of
 * the service in process. */
#include <check.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "common/sha256.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"
#include "tests/check_main.h"
#include "tests/support/files.h"
#include "tests/support/proc.h"

static char *dir; /* the suite's folder: the data, the checkpoints, the stubs */

#define MODEL "--arch-mlp-bot 13-32-16 --arch-mlp-top 32-1 --num-batches 5 --print-freq 1000"

/* Day 1's rows (datagen --seed 1) converted as each checkpoint's id mode
 * says and trained 5 steps; day 2's (--row-seed 2) converted with each
 * checkpoint's mapping; the Python stubs. */
static void setup(void) {
  static const struct {
    const char *name, *flags;
  } ck[] = {{"dict", ""}, {"mir", "--max-ind-range 3000"}, {"mod", "--modulo --max-ind-range 500"},
            {"hash", "--hash"}};
  const char *src = getenv("SHARDREC_SRC"), *b = bin_path();
  ck_assert_ptr_nonnull(src);
  dir = tmpdir_new("rpc-transform");
  ck_assert_ptr_nonnull(dir);
  char *out;
  int rc = run_cmd(&out, "cd %s && '%s' datagen --rows 3000 --seed 1 --out d.tsv && "
                   "'%s' datagen --rows 2000 --seed 1 --row-seed 2 --out new.tsv && mkdir py && "
                   "protoc -I'%s' --python_out=py '%s/rpc/shardrec.proto'", dir, b, b, src, src);
  ck_assert_msg(rc == 0, "data: %s", out);
  free(out);
  for (size_t i = 0; i < sizeof ck / sizeof ck[0]; i++) {
    const char *n = ck[i].name;
    rc = run_cmd(&out, "cd %s && '%s' convert --test-fraction 0.1 %s d.tsv %s.bin && "
                 "'%s' train --processed-data-file %s.bin " MODEL " --save-checkpoint ck-%s && "
                 "'%s' convert --mapping-from ck-%s new.tsv new-%s.bin",
                 dir, b, ck[i].flags, n, b, n, n, b, n, n);
    ck_assert_msg(rc == 0, "%s checkpoint: %s", n, out);
    free(out);
  }
}

static void teardown(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* `shardrec serve --listen 127.0.0.1:0 ARGS` run in the suite's folder,
 * its output in NAME.out, awaited until it listens; its address into addr. */
static pid_t serve(const char *name, const char *args, char *addr) {
  char out[4096];
  snprintf(out, sizeof out, "%s/%s.out", dir, name);
  pid_t pid = spawn_sh("cd %s && exec '%s' serve --listen 127.0.0.1:0 %s > '%s' 2>&1", dir,
                       bin_path(), args, out);
  wait_text(out, "listening on", 1, pid, 30);
  char *text = slurp(out);
  const char *at = strstr(text, "listening on ");
  ck_assert_ptr_nonnull(at);
  ck_assert_int_eq(sscanf(at, "listening on %63s", addr), 1);
  free(text);
  return pid;
}

static void stop(pid_t pid) {
  kill(pid, SIGTERM);
  int st = wait_exit(pid, 30);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server exit status %d", st);
}

/* Serve checkpoint ck-NAME, run the client's map checks against day 2's
 * rows and new-NAME.bin; the fingerprint it fetched is the SHA-256 of the
 * checkpoint's transform.bin, and the server said so at start. */
static void check_mapping(const char *name) {
  char addr[64], args[512], *out, file[4096], fp[SR_SHA256_HEX];
  snprintf(args, sizeof args, "--checkpoint ck-%s --shard 0 --read-only", name);
  pid_t pid = serve(name, args, addr);
  int rc = run_cmd(&out, "cd %s && /usr/bin/python3 '%s/tests/rpc/transform_client.py' py %s map "
                   "new.tsv new-%s.bin", dir, getenv("SHARDREC_SRC"), addr, name);
  ck_assert_msg(rc == 0 && strstr(out, "all checks passed"), "python client (rc %d):\n%s", rc, out);
  snprintf(file, sizeof file, "%s/ck-%s/step-5/transform.bin", dir, name);
  ck_assert_int_eq(sr_sha256_file(file, fp, NULL), 0);
  char want[128];
  snprintf(want, sizeof want, "fingerprint %s\n", fp);
  ck_assert_msg(strstr(out, want), "want %s in:\n%s", want, out);
  free(out);
  snprintf(file, sizeof file, "%s/%s.out", dir, name);
  snprintf(want, sizeof want, "data transform %.12s (", fp);
  char *said = slurp(file);
  ck_assert_msg(said && strstr(said, want), "want '%s' in:\n%s", want, said);
  free(said);
  stop(pid);
}

START_TEST(test_dictionary) { check_mapping("dict"); }
END_TEST

START_TEST(test_dictionary_max_ind_range) { check_mapping("mir"); }
END_TEST

START_TEST(test_modulo) { check_mapping("mod"); }
END_TEST

START_TEST(test_hash) { check_mapping("hash"); }
END_TEST

/* A server of a plan alone has no transform: Stats says "", GetTransform
 * is refused NOT_FOUND. */
START_TEST(test_plan_server_has_none) {
  char addr[64], *out;
  pid_t pid = serve("plan", "--plan ck-dict/plan.json --shard 0", addr);
  int rc = run_cmd(&out, "cd %s && /usr/bin/python3 '%s/tests/rpc/transform_client.py' py %s none",
                   dir, getenv("SHARDREC_SRC"), addr);
  ck_assert_msg(rc == 0 && strstr(out, "all checks passed"), "python client (rc %d):\n%s", rc, out);
  free(out);
  stop(pid);
}
END_TEST

/* An in-process service over a one-table plan serving bytes[len] with
 * fingerprint fp, its message limit max_msg (0: the default); NULL with
 * the reason in err when refused. */
static rpc_service *service_of(emb_plan **plan, emb_store **store, const uint8_t *bytes,
                               size_t len, const char *fp, size_t max_msg, char *err,
                               size_t errlen) {
  uint64_t rows[1] = {16};
  emb_plan_params pp = {.n_tables = 1, .rows = rows, .dim = 4,
                        .optim = {.kind = EMB_OPT_SGD, .eps = -1}, .seed = 1, .n_shards = 1};
  ck_assert_int_eq(emb_plan_create(&pp, plan, err, errlen), 0);
  *store = emb_store_create_local(*plan, err, errlen);
  ck_assert_ptr_nonnull(*store);
  int shard = 0;
  rpc_service_opts o = {.shards = &shard, .n_shards = 1, .max_message_bytes = max_msg,
                        .transform = bytes, .transform_len = len, .transform_fp = fp};
  return rpc_service_create(*plan, *store, &o, err, errlen);
}

/* GetTransform(offset, max_bytes) handled in process: its status; an OK
 * answer's data size into *got and checked against bytes at offset. */
static int get_chunk(rpc_service *svc, const uint8_t *bytes, size_t len, uint64_t offset,
                     uint32_t max_bytes, size_t *got) {
  Shardrec__V1__GetTransformRequest q = SHARDREC__V1__GET_TRANSFORM_REQUEST__INIT;
  q.offset = offset;
  q.max_bytes = max_bytes;
  uint8_t in[32];
  size_t n = shardrec__v1__get_transform_request__pack(&q, in);
  rpc_reply r;
  rpc_service_handle(svc, RPC_GET_TRANSFORM, in, n, &r);
  if (r.status == RPC_OK) {
    Shardrec__V1__GetTransformResponse *a =
        shardrec__v1__get_transform_response__unpack(NULL, r.out_len, r.out);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->total_bytes, len);
    ck_assert_uint_eq(a->offset, offset);
    ck_assert(a->data.len == 0 || !memcmp(a->data.data, bytes + offset, a->data.len));
    *got = a->data.len;
    shardrec__v1__get_transform_response__free_unpacked(a, NULL);
  }
  free(r.out);
  return r.status;
}

/* Chunk sizes: 0 asks for 1 MiB, no answer carries more than 2 MiB, nor
 * more than the message limit less 4 KiB; bytes whose SHA-256 is not the
 * fingerprint given are refused when the service is created. */
START_TEST(test_chunk_limits_and_fingerprint) {
  const size_t len = (size_t)3 << 20;
  uint8_t *bytes = malloc(len);
  ck_assert_ptr_nonnull(bytes);
  for (size_t i = 0; i < len; i++) bytes[i] = (uint8_t)(i * 31 + (i >> 12));
  char fp[SR_SHA256_HEX], err[512];
  ck_assert_int_eq(sr_sha256_hex(bytes, len, fp), 0);
  emb_plan *plan;
  emb_store *store;
  rpc_service *svc = service_of(&plan, &store, bytes, len, fp, 0, err, sizeof err);
  ck_assert_msg(svc, "%s", err);
  size_t got = 0;
  ck_assert_int_eq(get_chunk(svc, bytes, len, 0, 0, &got), RPC_OK);
  ck_assert_uint_eq(got, (size_t)1 << 20);
  ck_assert_int_eq(get_chunk(svc, bytes, len, 5, UINT32_MAX, &got), RPC_OK);
  ck_assert_uint_eq(got, (size_t)2 << 20);
  ck_assert_int_eq(get_chunk(svc, bytes, len, len - 7, UINT32_MAX, &got), RPC_OK);
  ck_assert_uint_eq(got, 7);
  ck_assert_int_eq(get_chunk(svc, bytes, len, len, 0, &got), RPC_OK);
  ck_assert_uint_eq(got, 0);
  ck_assert_int_eq(get_chunk(svc, bytes, len, len + 1, 0, &got), RPC_OUT_OF_RANGE);
  rpc_service_destroy(svc);
  emb_store_destroy(store);
  emb_plan_free(plan);
  /* A 1 MiB message limit: 4 KiB short of it. */
  svc = service_of(&plan, &store, bytes, len, fp, (size_t)1 << 20, err, sizeof err);
  ck_assert_msg(svc, "%s", err);
  ck_assert_int_eq(get_chunk(svc, bytes, len, 0, 0, &got), RPC_OK);
  ck_assert_uint_eq(got, ((size_t)1 << 20) - 4096);
  rpc_service_destroy(svc);
  emb_store_destroy(store);
  emb_plan_free(plan);
  /* One byte changed: refused, naming both fingerprints' starts. */
  bytes[len / 2] ^= 1;
  svc = service_of(&plan, &store, bytes, len, fp, 0, err, sizeof err);
  ck_assert_ptr_null(svc);
  char want[64];
  snprintf(want, sizeof want, "not to its fingerprint %.12s", fp);
  ck_assert_msg(strstr(err, "data transform") && strstr(err, want), "%s", err);
  emb_store_destroy(store);
  emb_plan_free(plan);
  free(bytes);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_transform");
  TCase *tc = tcase_create("transform");
  tcase_add_unchecked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_dictionary);
  tcase_add_test(tc, test_dictionary_max_ind_range);
  tcase_add_test(tc, test_modulo);
  tcase_add_test(tc, test_hash);
  tcase_add_test(tc, test_plan_server_has_none);
  suite_add_tcase(s, tc);
  TCase *unit = tcase_create("service");
  tcase_add_test(unit, test_chunk_limits_and_fingerprint);
  suite_add_tcase(s, unit);
  return sr_check_run(s);
}
