/* Tests for storage/ckpt_dir.h, the checkpoint folder protocol: a
 * checkpoint written, listed, resolved, read and verified; the states a
 * writer that stopped leaves (its temporary folder, a step-N without DONE)
 * never taken; a DONE that does not match, a flipped byte, a truncated or
 * missing file refused naming the file; keeping the newest K; the shards/
 * names and layouts; what a checkpoint root holds, and what
 * ckpt_dir_replace replaces. */
#include <check.h>

#include "tests/check_main.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"
#include "tests/support/files.h"

static char *dir, root[128];

static void setup(void) {
  dir = tmpdir_make("ckdir");
  snprintf(root, sizeof root, "%s/a/b", dir); /* created by ckpt_dir_begin */
}

static void teardown(void) {
  sr_rmtree(dir);
  free(dir);
}

static void sh(const char *fmt, const char *arg) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, fmt, arg, arg, arg);
  ck_assert_msg(system(cmd) == 0, "%s", cmd);
}

/* root/step-<step>: x.bin and sub/y.bin, manifest field "mine": step. */
static void write_step(long long step) {
  ckpt_dir_txn t;
  char err[1024], p[4400];
  int exists = -1;
  ck_assert_msg(ckpt_dir_begin(root, step, &t, &exists, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(exists, 0);
  char want[512], tag[SR_TMP_TAG_MAX];
  ck_assert_int_eq(sr_tmp_tag(tag, sizeof tag), 0); /* this process's: tmp-PID-START-BOOT-HOST */
  snprintf(want, sizeof want, "%s/.step-%lld.%s", root, step, tag);
  ck_assert_str_eq(t.tmp, want);
  snprintf(p, sizeof p, "%s/x.bin", t.tmp);
  file_put(p, "hello");
  snprintf(p, sizeof p, "%s/sub", t.tmp);
  ck_assert_int_eq(mkdir(p, 0777), 0);
  snprintf(p, sizeof p, "%s/sub/y.bin", t.tmp);
  file_put(p, "0123456789");
  cJSON *man = ckpt_dir_manifest_new();
  cJSON_AddNumberToObject(man, "mine", (double)step);
  ck_assert_msg(ckpt_dir_commit(&t, man, err, sizeof err) == 0, "%s", err);
  cJSON_Delete(man);
  ck_assert_int_ne(access(t.tmp, F_OK), 0); /* renamed */
}

/* Open root/rel: 0 or the status, the message into err. */
static int open_step(const char *rel, char *err, size_t errlen) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", root, rel);
  cJSON *man = NULL;
  int rc = ckpt_dir_read(p, &man, err, errlen);
  if (!rc) rc = ckpt_dir_verify(p, man, err, errlen);
  cJSON_Delete(man);
  return rc;
}

START_TEST(test_write_read) {
  write_step(10);
  char p[512], err[1024];
  snprintf(p, sizeof p, "%s/step-10", root);
  cJSON *man = NULL;
  ck_assert_msg(ckpt_dir_read(p, &man, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(cJSON_GetObjectItem(man, "format")->valueint, CKPT_DIR_FORMAT);
  ck_assert_int_eq(cJSON_GetObjectItem(man, "mine")->valueint, 10);
  /* The file list: sorted relative paths, sizes, SHA-256. */
  const cJSON *files = cJSON_GetObjectItem(man, "files");
  ck_assert_int_eq(cJSON_GetArraySize(files), 2);
  const cJSON *f0 = cJSON_GetArrayItem(files, 0), *f1 = cJSON_GetArrayItem(files, 1);
  ck_assert_str_eq(cJSON_GetObjectItem(f0, "path")->valuestring, "sub/y.bin");
  ck_assert_int_eq(cJSON_GetObjectItem(f0, "size")->valueint, 10);
  ck_assert_str_eq(cJSON_GetObjectItem(f1, "path")->valuestring, "x.bin");
  ck_assert_str_eq(cJSON_GetObjectItem(f1, "sha256")->valuestring,
                   "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"); /* "hello" */
  ck_assert_int_eq(ckpt_dir_verify(p, man, err, sizeof err), 0);
  cJSON_Delete(man);
  /* DONE holds the manifest's SHA-256. */
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cd %s && test \"$(sha256sum manifest.json | cut -c1-64)\" = \"$(cat DONE)\"", p);
  ck_assert_int_eq(system(cmd), 0);
  /* A second save of the same step: complete already, nothing done. */
  ckpt_dir_txn t;
  int exists = 0;
  ck_assert_int_eq(ckpt_dir_begin(root, 10, &t, &exists, err, sizeof err), 0);
  ck_assert_int_eq(exists, 1);
  ck_assert_int_ne(access(t.tmp, F_OK), 0);
}
END_TEST

/* A field that stands for a listed file by its fingerprint: taken when the
 * fingerprint is the file list's SHA-256 of it, refused naming the field
 * otherwise; absent is none. */
START_TEST(test_fingerprint_field) {
  write_step(3);
  char p[512], err[1024];
  snprintf(p, sizeof p, "%s/step-3", root);
  cJSON *man = NULL;
  ck_assert_msg(ckpt_dir_read(p, &man, err, sizeof err) == 0, "%s", err);
  const char *fp = "x";
  ck_assert_int_eq(ckpt_dir_fingerprint(man, "transform", "m.json", &fp, err, sizeof err), 0);
  ck_assert_ptr_null(fp);
  const char *hello = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
  cJSON *x = cJSON_AddObjectToObject(man, "transform");
  cJSON_AddStringToObject(x, "file", "x.bin");
  cJSON_AddStringToObject(x, "fingerprint", hello);
  ck_assert_msg(ckpt_dir_fingerprint(man, "transform", "m.json", &fp, err, sizeof err) == 0,
                "%s", err);
  ck_assert_str_eq(fp, hello);
  /* Another file's SHA-256, or a file not listed: refused. */
  cJSON_ReplaceItemInObject(x, "file", cJSON_CreateString("sub/y.bin"));
  ck_assert_int_eq(ckpt_dir_fingerprint(man, "transform", "m.json", &fp, err, sizeof err),
                   SR_EFORMAT);
  ck_assert_str_eq(err, "m.json: transform: its fingerprint 2cf24dba5fb0 is not the SHA-256 of a "
                        "listed sub/y.bin (84d89877f0d4)");
  cJSON_ReplaceItemInObject(x, "file", cJSON_CreateString("z.bin"));
  ck_assert_int_eq(ckpt_dir_fingerprint(man, "transform", "m.json", &fp, err, sizeof err),
                   SR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "listed z.bin (not listed)"));
  cJSON_Delete(man);
}
END_TEST

START_TEST(test_names_and_resolve) {
  char up[64];
  const char *const parents[][2] = {{"a/b/shards", "a/b"}, {"a/b/shards/", "a/b"},
                                    {"shards", "."},       {"/x", "/"}, {"/x//", "/"}};
  for (size_t i = 0; i < sizeof parents / sizeof parents[0]; i++) {
    ck_assert_int_eq(ckpt_dir_parent(parents[i][0], up, sizeof up), 0);
    ck_assert_str_eq(up, parents[i][1]);
  }
  ck_assert_int_eq(ckpt_dir_step_of("step-0"), 0);
  ck_assert_int_eq(ckpt_dir_step_of("step-123"), 123);
  ck_assert_int_eq(ckpt_dir_step_of("step-"), -1);
  ck_assert_int_eq(ckpt_dir_step_of("step-1x"), -1);
  ck_assert_int_eq(ckpt_dir_step_of("step--1"), -1);
  ck_assert_int_eq(ckpt_dir_step_of(".step-5.tmp-99"), -1);
  char out[4096], err[1024];
  ck_assert_int_eq(ckpt_dir_resolve(root, out, sizeof out, err, sizeof err), SR_ENOTFOUND);
  ck_assert_msg(strstr(err, "no such checkpoint folder") != NULL, "%s", err);
  write_step(5);
  write_step(20);
  write_step(100); /* numeric order, not name order */
  /* A writer stopped after the rename (step-200 without DONE) and one still
   * in its temporary folder (.step-300.tmp-1): neither is taken. */
  write_step(200);
  sh("rm %s/step-200/DONE", root);
  write_step(300);
  sh("mv %s/step-300 %s/.step-300.tmp-1 && rm %s/.step-300.tmp-1/DONE", root);
  ckpt_dir_entry *e;
  int n;
  ck_assert_int_eq(ckpt_dir_list(root, &e, &n), 0);
  ck_assert_int_eq(n, 3);
  ck_assert(e[0].step == 5 && e[1].step == 20 && e[2].step == 100);
  ck_assert_str_eq(e[2].name, "step-100");
  free(e);
  ck_assert_int_eq(ckpt_dir_resolve(root, out, sizeof out, err, sizeof err), 0);
  char want[512];
  snprintf(want, sizeof want, "%s/step-100", root);
  ck_assert_str_eq(out, want);
  /* Named directly, a step folder is itself (reading it tells the rest). */
  snprintf(want, sizeof want, "%s/step-200", root);
  ck_assert_int_eq(ckpt_dir_resolve(want, out, sizeof out, err, sizeof err), 0);
  ck_assert_str_eq(out, want);
  ck_assert_int_eq(open_step("step-200", err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "step-200/DONE: missing") && strstr(err, "incomplete"), "%s", err);
  /* The temporary folder named directly: refused once its manifest is
   * written (no DONE), not a checkpoint before that. */
  ck_assert_int_eq(open_step(".step-300.tmp-1", err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, ".step-300.tmp-1/DONE: missing") != NULL, "%s", err);
  sh("rm %s/.step-300.tmp-1/manifest.json", root);
  snprintf(want, sizeof want, "%s/.step-300.tmp-1", root);
  ck_assert_int_eq(ckpt_dir_resolve(want, out, sizeof out, err, sizeof err), SR_ENOTFOUND);
  ck_assert_msg(strstr(err, "no complete checkpoint") != NULL, "%s", err);
  /* Keep the newest 2 complete ones; the torn ones are not counted. */
  ckpt_dir_keep(root, 2);
  ck_assert_int_eq(ckpt_dir_list(root, &e, &n), 0);
  ck_assert_int_eq(n, 2);
  ck_assert(e[0].step == 20 && e[1].step == 100);
  free(e);
  /* A new save of a torn step replaces it. */
  write_step(200);
  ck_assert_int_eq(open_step("step-200", err, sizeof err), 0);
}
END_TEST

START_TEST(test_refusals) {
  write_step(1);
  char err[1024];
  /* DONE with another hash. */
  sh("cp -r %s/step-1 %s/step-2 && echo 0000000000000000000000000000000000000000000000000000000000000000 "
     "> %s/step-2/DONE", root);
  ck_assert_int_eq(open_step("step-2", err, sizeof err), SR_ECHECKSUM);
  ck_assert_msg(strstr(err, "step-2/manifest.json: checksum does not match the one in DONE"), "%s", err);
  /* A flipped byte, same size. */
  sh("cp -r %s/step-1 %s/step-3 && printf 'J' | dd of=%s/step-3/x.bin bs=1 seek=0 conv=notrunc 2>/dev/null",
     root);
  ck_assert_int_eq(open_step("step-3", err, sizeof err), SR_ECHECKSUM);
  ck_assert_msg(strstr(err, "step-3/x.bin: checksum mismatch (file damaged)"), "%s", err);
  /* Truncated. */
  sh("cp -r %s/step-1 %s/step-4 && truncate -s 4 %s/step-4/sub/y.bin", root);
  ck_assert_int_eq(open_step("step-4", err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "step-4/sub/y.bin: 4 bytes, the manifest says 10 (torn or truncated)"), "%s", err);
  /* Missing. */
  sh("cp -r %s/step-1 %s/step-5 && rm %s/step-5/x.bin", root);
  ck_assert_int_eq(open_step("step-5", err, sizeof err), SR_ENOTFOUND);
  ck_assert_msg(strstr(err, "step-5/x.bin: missing"), "%s", err);
  /* Another manifest format (DONE rewritten to match). */
  sh("cp -r %s/step-1 %s/step-6 && cd %s/step-6 && sed -i 's/\"format\":\t1/\"format\":\t9/' manifest.json && "
     "sha256sum manifest.json | cut -c1-64 > DONE", root);
  ck_assert_int_eq(open_step("step-6", err, sizeof err), SR_EVERSION);
  ck_assert_msg(strstr(err, "format 9 is not supported"), "%s", err);
  /* Not a folder. */
  ck_assert_int_eq(open_step("step-99", err, sizeof err), SR_ENOTFOUND);
  /* The untouched one is still good. */
  ck_assert_int_eq(open_step("step-1", err, sizeof err), 0);
}
END_TEST

/* The shards/ names: each path, SR_ERANGE when it does not fit; the
 * server folder names parsed back. */
START_TEST(test_shards_names) {
  char b[64];
  ck_assert_int_eq(ckpt_dir_shards_path("r/step-3", b, sizeof b), 0);
  ck_assert_str_eq(b, "r/step-3/shards");
  ck_assert_int_eq(ckpt_dir_shard_path("r/step-3/shards", 12, b, sizeof b), 0);
  ck_assert_str_eq(b, "r/step-3/shards/shard-12");
  ck_assert_int_eq(ckpt_dir_table_file("d", 4000000000u, b, sizeof b), 0);
  ck_assert_str_eq(b, "d/table-4000000000.bin");
  int ks[3] = {2, 0, 7};
  ck_assert_int_eq(ckpt_dir_server_path("p", ks, 3, b, sizeof b), 0);
  ck_assert_str_eq(b, "p/shard-2-0-7");
  ck_assert_int_eq(ckpt_dir_server_path("p", ks, 1, b, sizeof b), 0);
  ck_assert_str_eq(b, "p/shard-2");
  ck_assert_int_eq(ckpt_dir_server_path("p", ks, 0, b, sizeof b), SR_EINVAL);
  /* Exactly full (the NUL included) fits; one byte less does not. */
  ck_assert_int_eq(ckpt_dir_shard_path("abc", 5, b, 12), 0);
  ck_assert_str_eq(b, "abc/shard-5");
  ck_assert_int_eq(ckpt_dir_shard_path("abc", 5, b, 11), SR_ERANGE);
  ck_assert_int_eq(ckpt_dir_shards_path("abc", b, 10), SR_ERANGE);
  ck_assert_int_eq(ckpt_dir_table_file("abc", 1, b, 15), SR_ERANGE);
  ck_assert_int_eq(ckpt_dir_server_path("abc", ks, 3, b, 15), SR_ERANGE);
  ck_assert_int_eq(ckpt_dir_server_path("abc", ks, 3, b, 16), 0);
  /* Names parsed back. */
  int got[4];
  ck_assert_int_eq(ckpt_dir_server_shards("shard-2-0-7", got, 4), 3);
  ck_assert_int_eq(got[0], 2);
  ck_assert_int_eq(got[1], 0);
  ck_assert_int_eq(got[2], 7);
  ck_assert_int_eq(ckpt_dir_server_shards("shard-2-0-7", got, 2), 0); /* more than max */
  ck_assert_int_eq(ckpt_dir_server_shards("shard-", got, 4), 0);
  ck_assert_int_eq(ckpt_dir_server_shards("shard-1-", got, 4), 0);
  ck_assert_int_eq(ckpt_dir_server_shards("shard--1", got, 4), 0);
  ck_assert_int_eq(ckpt_dir_server_shards("shard-1x", got, 4), 0);
  ck_assert_int_eq(ckpt_dir_server_shards("shards", got, 4), 0);
  ck_assert_int_eq(ckpt_dir_table_of("table-25.bin"), 25);
  ck_assert_int_eq(ckpt_dir_table_of("table-25.bin.tmp.9"), -1);
  ck_assert_int_eq(ckpt_dir_table_of("table-.bin"), -1);
  ck_assert_int_eq(ckpt_dir_table_of("table-4294967296.bin"), -1);
}
END_TEST

/* dir/NAME created (a folder; with CURRENT or a table file in it). */
static void mk(const char *name, const char *file) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  ck_assert_int_eq(mkdir(p, 0777), 0);
  if (file) {
    snprintf(p, sizeof p, "%s/%s/%s", dir, name, file);
    file_put(p, "x");
  }
}

/* Each layout told from what the folder holds; a mix or nothing refused
 * naming the folder; which server folder holds each shard. */
START_TEST(test_shards_layout) {
  char err[1024], p[512];
  ckpt_shards_layout l = (ckpt_shards_layout)-1;
  /* Nothing (a stray file and a folder of another name do not count). */
  snprintf(p, sizeof p, "%s/notes.txt", dir);
  file_put(p, "x");
  mk("other", "table-1.bin");
  mk("shard-5", NULL); /* an empty shard folder */
  ck_assert_int_eq(ckpt_dir_shards_layout(dir, &l, err, sizeof err), SR_ENOTFOUND);
  ck_assert_msg(strstr(err, dir) && strstr(err, "holds no embedding rows"), "%s", err);
  /* Databases. */
  mk("shard-0", "CURRENT");
  mk("shard-1", "CURRENT");
  ck_assert_int_eq(ckpt_dir_shards_layout(dir, &l, err, sizeof err), 0);
  ck_assert_int_eq(l, CKPT_SHARDS_DBS);
  /* ... and server folders beside them: refused. */
  mk("shard-2-3", "table-1.bin");
  ck_assert_int_eq(ckpt_dir_shards_layout(dir, &l, err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "RocksDB shard databases and server folders of table files") &&
                    strstr(err, "not a checkpoint this build wrote"), "%s", err);
  sh("rm -r %s/shard-0 %s/shard-1", dir);
  ck_assert_int_eq(ckpt_dir_shards_layout(dir, &l, err, sizeof err), 0);
  ck_assert_int_eq(l, CKPT_SHARDS_SERVER_TABLES);
  mk("shard-0-1", "table-1.bin");
  char (*folder)[256] = calloc(6, sizeof *folder);
  ck_assert_int_eq(ckpt_dir_server_folders(dir, 6, folder, err, sizeof err), 0);
  ck_assert_str_eq(folder[0], "shard-0-1");
  ck_assert_str_eq(folder[1], "shard-0-1");
  ck_assert_str_eq(folder[2], "shard-2-3");
  ck_assert_str_eq(folder[3], "shard-2-3");
  ck_assert_str_eq(folder[4], "");
  ck_assert_str_eq(folder[5], "shard-5"); /* named so, though empty */
  free(folder);
  /* A table file at the top: the in-process store's, mixed with servers'. */
  snprintf(p, sizeof p, "%s/table-1.bin", dir);
  file_put(p, "x");
  ck_assert_int_eq(ckpt_dir_shards_layout(dir, &l, err, sizeof err), SR_EFORMAT);
  sh("rm -r %s/shard-2-3 %s/shard-0-1", dir);
  ck_assert_int_eq(ckpt_dir_shards_layout(dir, &l, err, sizeof err), 0);
  ck_assert_int_eq(l, CKPT_SHARDS_TABLES);
  /* No folder. */
  snprintf(p, sizeof p, "%s/none", dir);
  ck_assert_int_eq(ckpt_dir_shards_layout(p, &l, err, sizeof err), SR_ENOTFOUND);
  ck_assert_msg(strstr(err, "none: cannot open"), "%s", err);
  ck_assert_str_eq(ckpt_dir_shards_layout_name(CKPT_SHARDS_SERVER_TABLES),
                   "in-memory servers' table files");
}
END_TEST

/* ckpt_dir_check_root on root (written by write_step and what the test
 * adds): 0, or SR_EEXISTS with err naming want. */
static void root_is(int want_rc, const char *want) {
  char err[1024] = "";
  int rc = ckpt_dir_check_root(root, err, sizeof err);
  ck_assert_msg(rc == want_rc && (!want || strstr(err, want)), "rc %d: %s (wanted %s)", rc, err,
                want ? want : "");
}

/* What a checkpoint root holds (ckpt_dir_check_root) and what
 * ckpt_dir_replace replaces: step-N folders of their manifest's files,
 * complete or torn, the .step-N temporaries, plan.json and its temporary,
 * readers' working copies; nothing else, and a refused folder is left as
 * it was. */
START_TEST(test_root_kind) {
  char p[512], tmp[512], err[1024];
  root_is(0, NULL); /* nothing there */
  ck_assert_int_eq(sr_mkdirs(root), 0);
  root_is(0, NULL); /* empty */
  write_step(3);
  write_step(5);
  snprintf(p, sizeof p, "%s/step-5/DONE", root);
  ck_assert_int_eq(unlink(p), 0); /* torn: the manifest, no DONE */
  snprintf(p, sizeof p, "%s/step-5/DONE.tmp", root);
  file_put(p, "half");
  snprintf(p, sizeof p, "%s/.step-9.tmp-1-2-3-host/shards", root);
  ck_assert_int_eq(sr_mkdirs(p), 0);
  snprintf(p, sizeof p, "%s/.step-9.tmp-1-2-3-host/shards/any", root);
  file_put(p, "being written");
  snprintf(p, sizeof p, "%s/plan.json", root);
  file_put(p, "{}");
  snprintf(p, sizeof p, "%s/plan.json.tmp.77", root);
  file_put(p, "{");
  snprintf(p, sizeof p, "%s/.shardrec-ckpt-0.tmp-41-2-3-host/shard-0", root);
  ck_assert_int_eq(sr_mkdirs(p), 0); /* a reader's working copy */
  snprintf(p, sizeof p, "%s/.shardrec-ckpt-0.tmp-41-2-3-host/shard-0/CURRENT", root);
  file_put(p, "MANIFEST-000001");
  root_is(0, NULL);

  /* A file the manifest does not list, in a step folder or in a folder of it. */
  snprintf(p, sizeof p, "%s/step-3/sub/notes.txt", root);
  file_put(p, "mine");
  root_is(SR_EEXISTS, "/a/b: holds step-3/sub/notes.txt, which its checkpoint's manifest");
  ck_assert_int_eq(unlink(p), 0);
  /* A manifest that is not one. */
  snprintf(p, sizeof p, "%s/step-5/manifest.json", root);
  file_put(p, "not json");
  root_is(SR_EEXISTS, "holds step-5/manifest.json, which is not a checkpoint manifest");
  sh("rm -rf %s/a/b/step-5", dir);
  /* Other names at the top: a file, a folder, a file named as a step, a
   * folder named plan.json, a symlink named as a step, a file named as a
   * reader's copy, a folder named almost as one. */
  const char *make[] = {"touch %s/a/b/data.bin", "mkdir %s/a/b/runs",
                        "touch %s/a/b/step-7", "mkdir %s/a/b/plan.json.tmp",
                        "ln -s step-3 %s/a/b/step-8", "touch %s/a/b/.shardrec-ckpt-1.tmp-5",
                        "mkdir %s/a/b/.shardrec-ckpt-x.tmp-5"};
  const char *name[] = {"holds data.bin, which is not part of a checkpoint folder",
                        "holds runs,", "holds step-7,", "holds plan.json.tmp,", "holds step-8,",
                        "holds .shardrec-ckpt-1.tmp-5,", "holds .shardrec-ckpt-x.tmp-5,"};
  for (int i = 0; i < 7; i++) {
    sh(make[i], dir);
    root_is(SR_EEXISTS, name[i]);
    sh("rm -rf %s/a/b/data.bin %s/a/b/runs %s/a/b/step-7", dir);
    sh("rm -rf %s/a/b/plan.json.tmp %s/a/b/step-8", dir);
    sh("rm -rf %s/a/b/.shardrec-ckpt-1.tmp-5 %s/a/b/.shardrec-ckpt-x.tmp-5", dir);
  }
  root_is(0, NULL);

  /* A regular file at the path. */
  snprintf(p, sizeof p, "%s/file", dir);
  file_put(p, "x");
  ck_assert_int_eq(ckpt_dir_check_root(p, err, sizeof err), SR_EEXISTS);
  ck_assert_msg(strstr(err, "/file: is a file, not a checkpoint folder"), "%s", err);

  /* ckpt_dir_replace: a foreign root is left as it was, tmp too. */
  snprintf(tmp, sizeof tmp, "%s/new", dir);
  ck_assert_int_eq(mkdir(tmp, 0777), 0);
  snprintf(p, sizeof p, "%s/new/step-1", dir);
  ck_assert_int_eq(mkdir(p, 0777), 0);
  snprintf(p, sizeof p, "%s/notes.txt", root);
  file_put(p, "mine");
  ck_assert_int_eq(ckpt_dir_replace(tmp, root, NULL, err, sizeof err), SR_EEXISTS);
  ck_assert_msg(strstr(err, "holds notes.txt"), "%s", err);
  ck_assert(sr_is_file(p) && sr_is_dir(tmp));
  /* ... unless the caller's also says it is of its kind. */
  ck_assert_int_eq(ckpt_dir_replace(tmp, root, sr_is_dir, err, sizeof err), 0);
  ck_assert(!sr_is_file(p) && !sr_is_dir(tmp));
  snprintf(p, sizeof p, "%s/step-1", root);
  ck_assert(sr_is_dir(p));
  /* A root replaced: exchanged, the old one gone with the temporary name. */
  ck_assert_int_eq(mkdir(tmp, 0777), 0);
  snprintf(p, sizeof p, "%s/new/step-2", dir);
  ck_assert_int_eq(mkdir(p, 0777), 0);
  ck_assert_msg(ckpt_dir_replace(tmp, root, NULL, err, sizeof err) == 0, "%s", err);
  snprintf(p, sizeof p, "%s/step-2", root);
  ck_assert(sr_is_dir(p) && !sr_is_dir(tmp));
  snprintf(p, sizeof p, "%s/step-1", root);
  ck_assert(!sr_is_dir(p));
}
END_TEST

/* ckpt_dir_tmp_beside names DIR.TAG (trailing '/'s dropped); a DIR.TAG of
 * a dead owner is swept, a live one's and other names are not. */
START_TEST(test_tmp_beside) {
  char tmp[512], want[512], tag[SR_TMP_TAG_MAX], err[256], d[160];
  ck_assert_int_eq(sr_tmp_tag(tag, sizeof tag), 0);
  snprintf(d, sizeof d, "%s/m//", dir);
  ck_assert_int_eq(ckpt_dir_tmp_beside(d, tmp, sizeof tmp, err, sizeof err), 0);
  snprintf(want, sizeof want, "%s/m.%s", dir, tag);
  ck_assert_str_eq(tmp, want);
  ck_assert_int_eq(mkdir(tmp, 0777), 0);
  /* This process's tag with another start time: an owner that is gone. */
  long pid;
  unsigned long long start;
  int used = 0;
  ck_assert_int_eq(sscanf(tag, "tmp-%ld-%llu-%n", &pid, &start, &used), 2);
  char dead[512], other[512], keep[512];
  snprintf(dead, sizeof dead, "%s/m.tmp-%ld-%llu-%s", dir, pid, start + 1, tag + used);
  snprintf(other, sizeof other, "%s/mx.tmp-%ld-%llu-%s", dir, pid, start + 1, tag + used);
  snprintf(keep, sizeof keep, "%s/m.keep", dir);
  ck_assert(!mkdir(dead, 0777) && !mkdir(other, 0777) && !mkdir(keep, 0777));
  ckpt_dir_sweep_beside(d);
  ck_assert(sr_is_dir(tmp)); /* this process's */
  ck_assert(!sr_is_dir(dead));
  ck_assert(sr_is_dir(keep) && sr_is_dir(other));
}
END_TEST

int main(void) {
  Suite *s = suite_create("ckpt_dir");
  TCase *tc = tcase_create("ckpt_dir");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_write_read);
  tcase_add_test(tc, test_fingerprint_field);
  tcase_add_test(tc, test_names_and_resolve);
  tcase_add_test(tc, test_refusals);
  tcase_add_test(tc, test_shards_names);
  tcase_add_test(tc, test_shards_layout);
  tcase_add_test(tc, test_root_kind);
  tcase_add_test(tc, test_tmp_beside);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
