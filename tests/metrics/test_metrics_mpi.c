/* train --metrics-listen under a real mpirun -np 2 (colocated shards): rank
 * R listens on PORT + its local rank, labels every series rank="R", and
 * only rank 0 has the job's figures (loss, samples/s, test AUC). */
#include <check.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/fs.h"
#include "tests/check_main.h"
#include "tests/metrics/http_get.h"
#include "tests/support/proc.h"

/* The value of the sample line starting with prefix in page; -1 if absent. */
static double sample(const char *page, const char *prefix) {
  char pat[256];
  snprintf(pat, sizeof pat, "\n%s ", prefix);
  const char *p = page ? strstr(page, pat) : NULL;
  return p ? strtod(p + strlen(pat), NULL) : -1;
}

START_TEST(test_ranks_listen_on_port_plus_local_rank) {
  char *d = make_data_dir(20000, 3, NULL), p_out[512];
  snprintf(p_out, sizeof p_out, "%s/train.out", d);
  int port = free_port();
  pid_t job = spawn_sh("cd %s && exec mpirun --allow-run-as-root --oversubscribe -np 2 %s train "
                       "--processed-data-file d.bin --num-shards 2 --colocate-shards --nepochs 1000 "
                       "--mini-batch-size 64 --print-freq 5 --metrics-listen 127.0.0.1:%d "
                       "> train.out 2>&1", d, bin_path(), port);
  char want[64];
  snprintf(want, sizeof want, "metrics on 127.0.0.1:%d (rank 0)", port);
  wait_text(p_out, want, 1, job, 120);
  char *page[2] = {NULL, NULL};
  double t0 = test_now();
  for (int r = 0; r < 2; r++) {
    char key[64];
    snprintf(key, sizeof key, "shardrec_train_step{rank=\"%d\"}", r);
    while (!page[r] || sample(page[r], key) < 10) { /* a scrape after step 10 */
      free(page[r]);
      int st;
      if (test_now() - t0 >= 180 || waitpid(job, &st, WNOHANG) == job) {
        char *out = slurp(p_out); /* what the job said: a port taken, a rank gone */
        ck_abort_msg("rank %d on port %d: no step 10; train said:\n%s", r, port + r,
                     out ? out : "(nothing)");
      }
      usleep(50000);
      page[r] = http_get(port + r, "/metrics");
    }
  }
  ck_assert(sample(page[0], "shardrec_train_loss{rank=\"0\"}") > 0);
  ck_assert(sample(page[0], "shardrec_train_samples_per_second{rank=\"0\"}") > 0);
  ck_assert_ptr_null(strstr(page[1], "shardrec_train_loss")); /* the job's figures: rank 0's */
  ck_assert_ptr_null(strstr(page[1], "rank=\"0\""));
  ck_assert(sample(page[1], "shardrec_train_lookup_bytes_total{rank=\"1\"}") > 0);
  ck_assert(sample(page[1], "process_resident_memory_bytes{rank=\"1\"}") > 1e6);
  free(page[0]);
  free(page[1]);
  kill(job, SIGTERM);
  wait_exit(job, 60);
  sr_rmtree(d);
  free(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("metrics_mpi");
  TCase *tc = tcase_create("mpi");
  tcase_set_timeout(tc, 400);
  tcase_add_test(tc, test_ranks_listen_on_port_plus_local_rank);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
