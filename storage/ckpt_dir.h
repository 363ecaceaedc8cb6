/* The checkpoint folder protocol: how a checkpoint is named, written so that
 * a half-written one is never taken, found and verified. It knows nothing
 * of what a checkpoint holds (a training job's dense.bin and shards/, a
 * plan): its callers own every file and every manifest field but two.
 *
 * A checkpoint of step N under ROOT is the folder ROOT/step-N holding
 *   manifest.json  a JSON object; this module owns its "format" (the
 *                  manifest format, CKPT_DIR_FORMAT) and "files" (every
 *                  other file under the folder: {"path": relative, "size":
 *                  bytes, "sha256": hex}, sorted by path); the rest is the
 *                  caller's;
 *   DONE           written last; the manifest's SHA-256 (64 hex digits and
 *                  a newline);
 *   the caller's files.
 * Everything but DONE is written under ROOT/.step-N.TAG, then listed
 * into the manifest, which is written there too; the folder is renamed to
 * ROOT/step-N and DONE written last. A step-N without DONE (the writer
 * stopped between the rename and DONE) is never taken by ckpt_dir_resolve
 * or ckpt_dir_list and is refused by ckpt_dir_read; a leftover
 * .step-N.TAG is not a step-N name and is ignored. TAG is sr_tmp_tag's
 * (common/fs.h: tmp-PID-START-BOOT-HOST); ckpt_dir_begin removes the
 * .step-N.TAG folders of this host whose owner is gone, saying so on stderr.
 *
 * The manifest is a cJSON object (cJSON, borrowed or owned as each function
 * says). */
#ifndef SHARDREC_STORAGE_CKPT_DIR_H
#define SHARDREC_STORAGE_CKPT_DIR_H

#include <stddef.h>
#include <stdint.h>

struct cJSON;

#define CKPT_DIR_FORMAT 1
#define SR_CKPT_PATH 4096 /* = SR_PATH_MAX (common/fs.h) */

/* N of a folder name "step-N" (N a decimal >= 0), or -1 for any other name
 * (".step-N.TAG" included). */
long long ckpt_dir_step_of(const char *name);

/* A complete (DONE) checkpoint folder found under a root. */
typedef struct ckpt_dir_entry {
  long long step;
  char name[256]; /* "step-N" */
} ckpt_dir_entry;

/* The complete step-N folders under root (those holding a DONE file),
 * ascending by N, into *out (malloc'd, caller frees; NULL when none) and
 * *n. 0, or SR_ENOTFOUND when root cannot be opened. */
int ckpt_dir_list(const char *root, ckpt_dir_entry **out, int *n);

/* The checkpoint folder path names: path itself when it is a step folder
 * (holds manifest.json or is named step-N, complete or not: reading it
 * tells which), else the newest complete step-N under it, into out. 0, or
 * SR_ENOTFOUND with "PATH: no such checkpoint folder" or "PATH: no complete
 * checkpoint ..." in err, or SR_ERANGE ("...: path too long") when path or
 * the folder found does not fit; out is "" on failure. */
int ckpt_dir_resolve(const char *path, char *out, size_t outlen, char *err, size_t errlen);

/* A checkpoint being written. */
typedef struct ckpt_dir_txn {
  char root[4096];
  char tmp[4200];   /* root/.step-N.TAG: the caller writes its files here */
  char final[4200]; /* root/step-N */
} ckpt_dir_txn;

/* Start the checkpoint of step under root: create root (and its parents),
 * fill *t; when root/step-N is complete already, set *exists and do
 * nothing else; otherwise remove a torn root/step-N (no DONE) and a stale
 * tmp of this process, and create t->tmp. 0, SR_ERANGE when a name under
 * root does not fit (nothing made or removed), or SR_EIO with the folder in
 * err. */
int ckpt_dir_begin(const char *root, long long step, ckpt_dir_txn *t, int *exists, char *err,
                   size_t errlen);

/* A new manifest object holding "format" (the caller adds its fields, then
 * hands it to ckpt_dir_commit). Caller owns it (cJSON_Delete); NULL when out
 * of memory. */
struct cJSON *ckpt_dir_manifest_new(void);

/* Complete t: list every file under t->tmp with its size and SHA-256 into
 * man's "files" (replacing any), write man as t->tmp/manifest.json, rename
 * t->tmp to t->final, then write DONE (the manifest's SHA-256) as DONE.tmp
 * renamed to DONE, so that a DONE is never seen half written; each step
 * fsync'd, and before the rename every folder under t->tmp (a failure to
 * sync one, SR_EIO naming it, fails the commit). man is borrowed (its "files" is rewritten). 0, or SR_E* with the
 * reason in err: before the rename t->tmp is left for ckpt_dir_abort; after
 * it t->final is in place without DONE, which no reader takes. */
int ckpt_dir_commit(const ckpt_dir_txn *t, struct cJSON *man, char *err, size_t errlen);

/* Remove t->tmp (after a failure). */
void ckpt_dir_abort(const ckpt_dir_txn *t);

/* Keep the newest keep complete step-N folders under root and every link
 * of their chains (below), removing the other complete ones (keep <= 0:
 * keep all). */
void ckpt_dir_keep(const char *root, int keep);

/* ---- chains: incremental checkpoints ----
 *
 * A manifest's "kind" says what its folder holds: "full" (every row; a
 * manifest without "kind", written before increments, is full) or
 * "incremental" (the rows changed since its parent), then naming the
 * parent:
 *   "parent": {"step": M, "manifest_sha256": the parent's DONE (its
 *              manifest's SHA-256)}
 * The parent is ROOT/step-M beside the child, M below the child's N. A
 * chain is a full checkpoint and the increments each naming the one before;
 * its head is the newest. This module owns "kind" and "parent". */

/* Set man's "kind": "full" when parent_step < 0, else "incremental" and
 * "parent" (parent_sha: 64 hex digits). 0 or SR_ENOMEM. */
int ckpt_dir_set_kind(struct cJSON *man, long long parent_step, const char *parent_sha);

/* Make man full: "kind" "full" in its place, "parent" removed (a folded
 * chain's manifest). 0 or SR_ENOMEM. */
int ckpt_dir_make_full(struct cJSON *man);

/* The parent step man names (-1: man is full); SR_EFORMAT (a negative
 * value below -1) for an unknown kind or a malformed parent. */
long long ckpt_dir_parent_step(const struct cJSON *man);

/* The 64 hex digits of dir's DONE (its manifest's SHA-256) into hex[65].
 * 0, or SR_EFORMAT with "DIR/DONE: missing ..." in err. */
int ckpt_dir_done(const char *dir, char *hex, char *err, size_t errlen);

/* A verified chain: dirs[0] the full checkpoint, dirs[n-1] the head. */
typedef struct ckpt_dir_chain {
  int n;
  char (*dirs)[SR_CKPT_PATH];
} ckpt_dir_chain;

/* Verify the chain whose head is the folder head (man: its manifest,
 * ckpt_dir_read's, borrowed): every link's files (ckpt_dir_verify; files
 * 0: not hashed, for a caller that verified the chain already), and back
 * from the head, each parent's DONE and manifest (ckpt_dir_read) and
 * its manifest's SHA-256 against the one its child names, down to the full
 * one. Into *c (ckpt_dir_chain_free). 0, or SR_E* with the link in err:
 * "DIR/step-M...: ... (link K of the chain of step-N)", links counted from
 * the head (1) back (only when the head is incremental; a full head's
 * messages are ckpt_dir_verify's). Reads only. */
int ckpt_dir_chain_open(const char *head, const struct cJSON *man, int files, ckpt_dir_chain *c,
                        char *err, size_t errlen);
void ckpt_dir_chain_free(ckpt_dir_chain *c); /* NULL-safe; leaves *c zeroed */

/* The links of the chain whose head is the checkpoint dir (1: a full one;
 * the links found while each parent's manifest reads: a caller that needs
 * the chain whole verifies it with ckpt_dir_chain_open). */
int ckpt_dir_chain_links(const char *dir);

/* Read the manifest of the checkpoint folder dir and check it against DONE:
 * dir exists (SR_ENOTFOUND), DONE exists (SR_EFORMAT, "DIR/DONE: missing:
 * the checkpoint is incomplete ..."), the manifest's SHA-256 is DONE's
 * (SR_ECHECKSUM), it is a JSON object with "format" CKPT_DIR_FORMAT
 * (SR_EFORMAT, SR_EVERSION). The files are checked by ckpt_dir_verify
 * (the caller checks its own fields in between: they cost nothing, hashing
 * the files may take minutes). *man gets the parsed
 * manifest (caller owns: cJSON_Delete). 0 or SR_E* with a message naming
 * the file in err. */
int ckpt_dir_read(const char *dir, struct cJSON **man, char *err, size_t errlen);

/* Check every file man (ckpt_dir_read's) lists under dir: a non-empty
 * "files" list (SR_EFORMAT), each file present
 * (SR_ENOTFOUND), its size (SR_EFORMAT, "torn or truncated") and its
 * SHA-256 (SR_ECHECKSUM, "checksum mismatch (file damaged)"); a malformed
 * entry or a path with ".." is SR_EFORMAT. 0 or SR_E* naming the file. */
int ckpt_dir_verify(const char *dir, const struct cJSON *man, char *err, size_t errlen);

/* A manifest field that stands for one of the listed files by its
 * fingerprint ({"file": NAME, "fingerprint": SHA-256 hex, ...}: the data
 * transform's "transform"): *fp gets the fingerprint, NULL when man has no
 * such field. SR_EFORMAT ("SRC: FIELD: its fingerprint ... is not the
 * SHA-256 of a listed NAME") when it is not the SHA-256 the file list
 * gives the file, so ckpt_dir_verify's check of the file proves it. 0 or
 * SR_EFORMAT. */
int ckpt_dir_fingerprint(const struct cJSON *man, const char *field, const char *src,
                         const char **fp, char *err, size_t errlen);

/* The folder above path ("." for a bare name, "/" for "/x"; trailing slashes
 * ignored) into out. 0 or
 * SR_ERANGE when it does not fit. */
int ckpt_dir_parent(const char *path, char *out, size_t outlen);

/* 1 when path (absolute, resolved) is a complete checkpoint folder (its
 * manifest.json and DONE in place) or lies inside one, that folder into
 * step[len]; else 0. */
int ckpt_dir_step_holding(const char *path, char *step, size_t len);

/* ---- checkpoint roots as outputs ----
 *
 * A checkpoint root is what a folder output (train --save-checkpoint,
 * --save-model, reshard --to) writes or replaces, and the only thing it
 * writes into or replaces. Every entry of one is
 *   step-N/          a folder whose files are manifest.json, DONE, DONE.tmp
 *                    and the files its manifest lists (complete or torn:
 *                    ckpt_dir_commit's rename comes after the manifest);
 *   .step-N.tmp-...  a folder: a checkpoint being written, or left by a
 *                    killed writer (ckpt_dir_begin);
 *   plan.json        a regular file: the plan the trainer writes into its
 *                    --save-checkpoint folder (CKPT_DIR_PLAN), and its
 *                    temporary plan.json.tmp...
 *   .shardrec-ckpt-K.TAG
 *                    a folder: a reader's working copy of a checkpoint
 *                    (serve, predict or eval of a RocksDB checkpoint or a
 *                    chain, when /tmp is on another file system:
 *                    embedding/ckpt_store.h; CKPT_DIR_READER_TMP), in use
 *                    or left by a killed reader, whose next run removes it.
 * An empty folder is one. Anything else (a regular file at the path, a
 * folder holding another name, a file in a step-N that its manifest does not
 * list) is foreign, and refused. */
#define CKPT_DIR_PLAN "plan.json"
#define CKPT_DIR_READER_TMP ".shardrec-ckpt-"

/* Whether path may be written as a checkpoint root: 0 when nothing is there
 * or it is a checkpoint root (above); SR_EEXISTS when it is anything else,
 * with "PATH: ..." in err naming what is there (the first foreign entry);
 * SR_EIO when it cannot be read, SR_ERANGE when a name under it does not
 * fit. Reads only. */
int ckpt_dir_check_root(const char *path, char *err, size_t errlen);

/* The temporary name a folder output dir is written under before
 * ckpt_dir_replace puts it in place: dir.TAG beside dir (TAG sr_tmp_tag's;
 * trailing '/'s of dir dropped) into tmp. 0 or SR_ERANGE (tmp empty, the
 * reason in err). */
int ckpt_dir_tmp_beside(const char *dir, char *tmp, size_t len, char *err, size_t errlen);

/* Remove the dir.TAG folders beside dir whose owner is gone (a writer
 * killed before ckpt_dir_replace, or after its exchange), a line each on
 * stderr. */
void ckpt_dir_sweep_beside(const char *dir);

/* Put the folder tmp in dir's place, when dir is absent or a checkpoint
 * root (ckpt_dir_check_root, asked again here), or a folder the caller's
 * also (NULL: none) says is of its own kind too (1): tmp is renamed to dir, or
 * exchanged with it in one rename (RENAME_EXCHANGE) and the old one, now at
 * tmp, removed; dir is always whole, the old one or the new. Where the file
 * system cannot exchange, the old dir is moved aside to dir.old-PID first
 * and moved back on a failed rename. 0, or SR_EEXISTS (dir is foreign:
 * nothing moved), SR_ERANGE (a name does not fit: nothing moved) or
 * SR_EIO, the reason in err; tmp is the caller's to remove on failure. */
int ckpt_dir_replace(const char *tmp, const char *dir, int (*also)(const char *dir), char *err,
                     size_t errlen);

/* ---- shards/: where a checkpoint keeps its embedding rows ----
 *
 * step-N/shards/ is what the embedding store's checkpoint(path) wrote
 * (embedding/store.h), in one of three layouts:
 *   CKPT_SHARDS_DBS            shards/shard-K/: a RocksDB checkpoint per
 *                              shard (the shard store, or shard servers run
 *                              with --data-dir);
 *   CKPT_SHARDS_TABLES         shards/table-<id>.bin: one table file per
 *                              table holding every shard's rows (the
 *                              in-process store);
 *   CKPT_SHARDS_SERVER_TABLES  shards/shard-K[-K2...]/table-<id>.bin: one
 *                              folder per in-memory shard server, named by
 *                              the shards it served, in the order served.
 * The same shard-K name is a shard's database in a shard store's data
 * folder (DIR/shard-K). This module owns these names: every other file asks
 * the functions below. Each path function writes into buf and returns 0, or
 * SR_ERANGE when the path does not fit in len bytes (buf then empty, as
 * sr_path leaves it). */
typedef enum ckpt_shards_layout {
  CKPT_SHARDS_DBS = 0,
  CKPT_SHARDS_TABLES = 1,
  CKPT_SHARDS_SERVER_TABLES = 2,
} ckpt_shards_layout;

/* step_dir/shards. */
int ckpt_dir_shards_path(const char *step_dir, char *buf, size_t len);

/* dir/shard-K: shard k's folder (a database or a server folder) under dir. */
int ckpt_dir_shard_path(const char *dir, int k, char *buf, size_t len);

/* Whether dir/shard-K holds a shard database (its CURRENT file): rows of an
 * earlier run that a job starting fresh must not take for its own. 1 with
 * its folder in db (db[len]), 0 (db "" when the path is too long). */
int ckpt_dir_shard_db_exists(const char *dir, int k, char *db, size_t len);

/* The file of a data folder naming the checkpoint folder of the job with
 * --auto-resume that made its databases (ckpt_dir_data_claim): such a job
 * restarted before its first checkpoint finds them again as its own. */
#define CKPT_DATA_OWNER ".shardrec-owner"

/* Write dir/CKPT_DATA_OWNER naming the folder owner (resolved), through a
 * temporary renamed into place. 0, or SR_E* with the reason in err. */
int ckpt_dir_data_claim(const char *dir, const char *owner, char *err, size_t errlen);

/* 1 when dir/CKPT_DATA_OWNER names the folder owner (resolved), else 0. */
int ckpt_dir_data_claimed_by(const char *dir, const char *owner);

/* Shard k's database in dir (its folder into db[len]) before a job starts
 * afresh on dir: 0 when there is none, or when owner (NULL: none) claims
 * dir and the database was removed (*removed set: the leftovers of that
 * job's start before its first checkpoint); SR_EEXISTS when one is there
 * (an earlier run's rows, which a fresh job must not take for its own);
 * SR_EIO when it cannot be removed. */
int ckpt_dir_fresh_shard(const char *dir, int k, const char *owner, int *removed, char *db,
                         size_t len);

/* dir/shard-K1-K2-...: the folder of one server serving shards[n] (n >= 1),
 * in that order. */
int ckpt_dir_server_path(const char *dir, const int *shards, int n, char *buf, size_t len);

/* dir/table-<table_id>.bin. */
int ckpt_dir_table_file(const char *dir, uint32_t table_id, char *buf, size_t len);

/* dir/removed-<table_id>.bin: an increment's removed rows of that table
 * (embedding/removed_file.h), beside its table file. */
int ckpt_dir_removed_file(const char *dir, uint32_t table_id, char *buf, size_t len);

/* table_id of a file name "table-<id>.bin", or -1 for any other name. */
long long ckpt_dir_table_of(const char *name);

/* table_id of a file name "removed-<id>.bin", or -1 for any other name. */
long long ckpt_dir_removed_of(const char *name);

/* The shards a folder name "shard-K[-K2...]" lists (each K a decimal >= 0),
 * into ks[max]; their count, or 0 when name is not such a name or lists
 * more than max. */
int ckpt_dir_server_shards(const char *name, int *ks, int max);

/* The layout of the shards/ folder shards, from what it holds: a
 * table-<id>.bin file in it (TABLES), shard-K folders holding a RocksDB
 * database (a CURRENT file: DBS), shard-K[-K2...] folders holding
 * table-<id>.bin files (SERVER_TABLES). 0, or SR_ENOTFOUND (the folder
 * cannot be opened or holds none of these) or SR_EFORMAT (it holds more
 * than one kind: not a checkpoint this build wrote), naming the folder in
 * err. Whether every shard is there is the caller's question
 * (ckpt_dir_server_folders, ckpt_dir_shard_path). */
int ckpt_dir_shards_layout(const char *shards, ckpt_shards_layout *out, char *err, size_t errlen);

/* The SERVER_TABLES layout: which server folder under shards holds each
 * shard 0..n_shards-1, into folder[n_shards] (the folder name, "" for a
 * shard no folder lists; a name longer than 255 bytes is skipped). 0, or
 * SR_ENOTFOUND when shards cannot be opened. */
int ckpt_dir_server_folders(const char *shards, int n_shards, char (*folder)[256], char *err,
                            size_t errlen);

/* Words for a layout ("RocksDB shard databases", "the in-memory trainer's
 * table files", "in-memory servers' table files"). */
const char *ckpt_dir_shards_layout_name(ckpt_shards_layout l);

#endif
