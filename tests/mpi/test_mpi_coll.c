/* The MPI collective under a real `mpirun -np 3` (tests/mpi/mpi_coll_prog.c
 * does the checks on every rank): all-reduce bits equal to the rank-order
 * sum and the same on every rank, broadcast from every root, variable-count
 * gather in rank order, byte broadcast and byte all-gather (exact bytes of
 * each rank's own pattern, in rank order; in place; the refusals), barrier. */
#include <check.h>

#include "tests/check_main.h"
#include "tests/support/proc.h"

START_TEST(test_mpi_collective_np3) {
  char *out;
  int rc = run_cmd(&out, "mpirun --allow-run-as-root --oversubscribe -np 3 '%s'", MPI_COLL_PROG);
  ck_assert_msg(rc == 0, "mpirun -np 3 mpi_coll_prog: exit %d\n%s", rc, out);
  for (int r = 0; r < 3; r++) {
    char want[32];
    snprintf(want, sizeof want, "rank %d: ok", r);
    ck_assert_msg(strstr(out, want), "no '%s' in:\n%s", want, out);
  }
  ck_assert_msg(!strstr(out, "FAIL"), "%s", out);
  free(out);
}
END_TEST

/* Without mpirun the program says so and stops (MPI is never initialised). */
START_TEST(test_mpi_not_launched) {
  char *out;
  int rc = run_cmd(&out, "env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE '%s'", MPI_COLL_PROG);
  ck_assert_msg(rc == 2 && strstr(out, "not started by mpirun"), "exit %d: %s", rc, out);
  free(out);
}
END_TEST

/* bench allreduce: the trainer's collective timed under mpirun -np 2, the
 * bytes it reports moved a rank's ring volume (2(R-1)/R x 4N: 0.004 MB for
 * 1000 floats); refused without mpirun and with a bad flag. */
START_TEST(test_bench_allreduce) {
  char *out;
  int rc = run_cmd(&out, "mpirun --allow-run-as-root --oversubscribe -np 2 %s bench allreduce --floats 1000 "
                   "--reps 3 --gap-ms 1", bin_path());
  ck_assert_msg(rc == 0 && strstr(out, "allreduce 1000 floats over 2 ranks, 3 calls each after 1 ms idle: median ") &&
                    strstr(out, "; 0.004 MB each way a rank: "), "exit %d:\n%s", rc, out);
  double ms = find_num(out, "median ");
  ck_assert_msg(ms > 0, "%s", out);
  free(out);
  rc = run_cmd(&out, "env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE %s bench allreduce", bin_path());
  ck_assert_msg(rc == 2 && strstr(out, "run it under mpirun with 2 or more ranks"), "exit %d: %s", rc, out);
  free(out);
  rc = run_cmd(&out, "%s bench allreduce --reps 0", bin_path());
  ck_assert_msg(rc == 2 && strstr(out, "--reps: 0 is out of range"), "exit %d: %s", rc, out);
  free(out);
}
END_TEST

int main(void) {
  Suite *s = suite_create("mpi_coll");
  TCase *tc = tcase_create("coll");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_mpi_collective_np3);
  tcase_add_test(tc, test_mpi_not_launched);
  tcase_add_test(tc, test_bench_allreduce);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
