/* The two-server fixture halves of test_rpc_remote.c and test_rpc_delta.c:
 * a remote store over both servers (fx_remote) and the teardown (fx_stop).
 * Here, not in tests/support/servers.h, since it needs the rpc client that
 * the other suites of servers.h do not link. */
#ifndef SHARDREC_TESTS_RPC_REMOTE_FIXTURE_H
#define SHARDREC_TESTS_RPC_REMOTE_FIXTURE_H

#include <check.h>
#include <stdlib.h>
#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "tests/support/proc.h"
#include "tests/support/servers.h"

/* A remote store of plan over srv[0] and srv[1]; fails the test if none. */
static inline emb_store *fx_remote(const emb_plan *plan, const test_server srv[2]) {
  const char *addr[2] = {srv[0].addr, srv[1].addr};
  rpc_client_opts o = {.deadline_s = 10, .max_tries = 12};
  char err[512];
  emb_store *s = emb_store_create_remote(plan, addr, 2, &o, err, sizeof err);
  ck_assert_msg(s != NULL, "%s", err);
  return s;
}

/* Stops srv[0] and srv[1], each of which must exit 0; frees plan; removes
 * and frees dir. */
static inline void fx_stop(test_server srv[2], emb_plan *plan, char *dir) {
  for (int k = 0; k < 2; k++) {
    int st = server_stop(&srv[k]);
    ck_assert_msg(st == 0, "server %d exited with %d", k, st);
  }
  emb_plan_free(plan);
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

#endif
