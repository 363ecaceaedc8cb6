/* The kernel set a dense suite runs on. Each suite runs twice
 * (tests/dense/CMakeLists.txt): with no argument on the CPU backend's best
 * kernels (AVX2/FMA where the CPU has them), and with --isa=baseline on the
 * baseline (SSE2) ones. dense_test_isa_args parses the argument, sets
 * dense_test_be and makes it the default backend, so that dense_model_create
 * builds its models on it; call it in main() before the suite runs (the
 * forked tests inherit it). */
#ifndef SHARDREC_TESTS_DENSE_TEST_ISA_H
#define SHARDREC_TESTS_DENSE_TEST_ISA_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense/backend.h"
#include "dense/device.h"

static const dense_backend *dense_test_be; /* static object of backend_cpu.c */

static void dense_test_isa_args(int argc, char **argv) {
  dense_isa isa = DENSE_ISA_BEST;
  if (argc > 2 || (argc == 2 && strcmp(argv[1], "--isa=baseline") &&
                   strcmp(argv[1], "--isa=best"))) {
    fprintf(stderr, "usage: %s [--isa=best|--isa=baseline]\n", argv[0]);
    exit(2);
  }
  if (argc == 2 && !strcmp(argv[1], "--isa=baseline")) isa = DENSE_ISA_BASELINE;
  dense_test_be = dense_backend_cpu_isa(isa);
  dense_backend_set_default(dense_test_be);
  printf("dense kernels: %s\n", dense_test_be->name);
  fflush(stdout);
}

#endif
