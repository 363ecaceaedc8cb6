/* shardrec bench allreduce: the trainer's own dense all-reduce (the
 * deterministic MPI collective of dense/collective_mpi.c) of N floats,
 * timed on every rank under mpirun, with an idle gap before each call as a
 * training step's dense compute leaves one. Rank 0 prints the median and
 * p90 time and the rate it moved the bytes at: 2(R-1)/R x 4N bytes each
 * way a rank, the ring's volume (the collective's Alltoallv plus
 * Allgatherv move the same). This is the link rate the model of scale
 * (docs/SCALE.md, tools/scale_model.py) takes for the all-reduce: on a
 * shaped or shared link the collective can move less than a raw TCP
 * exchange of the same bytes. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/sys.h"
#include "dense/collective.h"
#include "tools/cli.h"
#include "tools/cmds.h"

#define CMD "bench allreduce"
#define MAX_REPS 999

static void usage(FILE *f) {
  fprintf(f,
"usage: mpirun -np R shardrec bench allreduce [--floats N (2368897)] [--reps K (9)]\n"
"                                             [--gap-ms G (200)]\n"
"\n"
"Times K all-reduces of N floats (the trainer's collective; the default is the\n"
"MLPerf-like MLP's parameter count), each after G ms idle, and prints rank 0's\n"
"median and p90 time and the rate the bytes moved at (2(R-1)/R x 4N bytes each\n"
"way a rank).\n");
}

static int parse(int argc, char **argv, long long *floats, long long *reps, double *gap_ms) {
  static const struct option opts[] = {{"floats", required_argument, 0, 'n'},
                                       {"reps", required_argument, 0, 'k'},
                                       {"gap-ms", required_argument, 0, 'g'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    switch (c) {
      case 'n': if (cli_int(CMD, "--floats", optarg, 1, 1LL << 30, floats)) return 2; break;
      case 'k': if (cli_int(CMD, "--reps", optarg, 1, MAX_REPS, reps)) return 2; break;
      case 'g': if (cli_double(CMD, "--gap-ms", optarg, 0, 60000, gap_ms)) return 2; break;
      case 'h': usage(stdout); return 1;
      default: cli_bad_option(CMD, optopt, argv[optind - 1]); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec " CMD ": unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int bench_allreduce(int argc, char **argv) {
  long long floats = 2368897, reps = 9;
  double gap_ms = 200;
  int rc = parse(argc, argv, &floats, &reps, &gap_ms);
  if (rc) return rc == 1 ? 0 : rc;
  int rank = 0, size = 1, local = 1;
  char err[512];
  if (!dense_mpi_launched(&rank, &size, &local) || size < 2) {
    fprintf(stderr, "shardrec " CMD ": run it under mpirun with 2 or more ranks "
            "(mpirun -np 2 shardrec " CMD ")\n");
    return 2;
  }
  if (dense_mpi_init(err, sizeof err)) {
    fprintf(stderr, "shardrec " CMD ": %s\n", err);
    return 1;
  }
  dense_coll *c = dense_coll_mpi_create(err, sizeof err);
  float *buf = calloc((size_t)floats, sizeof *buf);
  double t[MAX_REPS];
  rc = !c || !buf;
  if (rc) fprintf(stderr, "shardrec " CMD ": %s\n", c ? "out of memory" : err);
  for (long long k = 0; !rc && k <= reps; k++) { /* call 0 warms the connections */
    if ((rc = dense_coll_barrier(c))) break;
    struct timespec gap = {(time_t)(gap_ms / 1e3), (long)((gap_ms - 1e3 * (time_t)(gap_ms / 1e3)) * 1e6)};
    nanosleep(&gap, NULL); /* the dense step's idle link, not a wait for an event */
    double t0 = sr_now();
    if ((rc = dense_coll_all_reduce_sum(c, buf, (size_t)floats))) break;
    if (k) t[k - 1] = sr_now() - t0;
  }
  if (rc && c) fprintf(stderr, "shardrec " CMD ": rank %d: %s\n", rank, dense_coll_errmsg(c));
  if (!rc && rank == 0) {
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    double med = t[reps / 2], p90 = t[(reps * 9) / 10 < reps ? (reps * 9) / 10 : reps - 1];
    double bytes = 2.0 * (size - 1) / size * 4.0 * (double)floats;
    printf("allreduce %lld floats over %d ranks, %lld calls each after %.0f ms idle: median %.3f ms, "
           "p90 %.3f ms; %.3f MB each way a rank: %.3f Gbit/s\n",
           floats, size, reps, gap_ms, 1e3 * med, 1e3 * p90, bytes / 1e6, bytes * 8 / med / 1e9);
  }
  free(buf);
  dense_coll_destroy(c);
  dense_mpi_finalize();
  return rc ? 1 : 0;
}
