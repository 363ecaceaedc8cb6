/* Run under mpirun (test_mpi_coll starts it with -np 3): checks the MPI
 * collective's all-reduce, broadcast, gather, byte broadcast, byte
 * all-gather and barrier values on every rank and prints "rank R: ok" or "rank R: FAIL ..." lines; exit status 0
 * only when every check on this rank held.
 *
 * Every rank can compute every rank's input (a seeded generator), so each
 * checks the all-reduce against the rank-order sum ((b0 + b1) + b2) bit for
 * bit; rank 0 also gathers every rank's result and checks that the bits are
 * the same everywhere. The inputs span 12 orders of magnitude, so another
 * summation order would change bits. The byte operations carry a pattern
 * that differs per rank (byte_of), so a block from the wrong rank, in the
 * wrong place or cut short shows. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/status.h"
#include "dense/collective.h"

static int fails;
#define CHECK(cond, ...)                              \
  do {                                                \
    if (!(cond)) {                                    \
      printf("rank %d: FAIL ", rank);                 \
      printf(__VA_ARGS__);                            \
      printf("\n");                                   \
      fails++;                                        \
    }                                                 \
  } while (0)

/* Rank r's i-th input: sign, mantissa and exponent from a hash. */
static float value(int r, size_t i, uint64_t salt) {
  uint64_t x = sr_mix64(salt ^ ((uint64_t)r << 40) ^ (uint64_t)i);
  float m = (float)(x & 0xffffff) / (float)0x1000000 + 0.5f;
  int e = (int)((x >> 24) % 40) - 20;
  float v = m;
  for (; e > 0; e--) v *= 2;
  for (; e < 0; e++) v /= 2;
  return (x >> 40) & 1 ? -v : v;
}

/* Byte i of rank r's pattern (salted per check). */
static unsigned char byte_of(int r, size_t i, uint64_t salt) {
  return (unsigned char)(sr_mix64(salt ^ ((uint64_t)(r + 1) << 48) ^ (uint64_t)i) >> 17);
}

/* broadcast_bytes from every root and all_gather_bytes (apart and in
 * place), exact bytes; the refusals, which every rank meets alike before
 * any communication. */
static void check_bytes(dense_coll *c, int rank, int size) {
  enum { NB = 1237, NG = 333 };
  unsigned char b[NB];
  for (int root = 0; root < size; root++) {
    for (size_t i = 0; i < NB; i++) b[i] = byte_of(rank, i, 1);
    CHECK(dense_coll_broadcast_bytes(c, b, NB, root) == 0, "broadcast_bytes: %s",
          dense_coll_errmsg(c));
    size_t bad = 0;
    for (size_t i = 0; i < NB; i++) bad += b[i] != byte_of(root, i, 1);
    CHECK(bad == 0, "broadcast_bytes from %d: %zu of %d bytes differ from the root's", root,
          bad, NB);
  }
  unsigned char send[NG], *recv = malloc((size_t)size * NG + 1);
  for (size_t i = 0; i < NG; i++) send[i] = byte_of(rank, i, 2);
  memset(recv, 0xa5, (size_t)size * NG + 1);
  CHECK(dense_coll_allgather_bytes(c, send, NG, recv) == 0, "allgather_bytes: %s",
        dense_coll_errmsg(c));
  for (int r = 0; r < size; r++) {
    size_t bad = 0;
    for (size_t i = 0; i < NG; i++) bad += recv[(size_t)r * NG + i] != byte_of(r, i, 2);
    CHECK(bad == 0, "allgather_bytes: block %d: %zu of %d bytes differ from rank %d's", r, bad,
          NG, r);
  }
  CHECK(recv[(size_t)size * NG] == 0xa5, "allgather_bytes wrote past size * n");
  /* in place: this rank's block already in recv, the others garbage */
  memset(recv, 0x5a, (size_t)size * NG);
  for (size_t i = 0; i < NG; i++) recv[(size_t)rank * NG + i] = byte_of(rank, i, 3);
  CHECK(dense_coll_allgather_bytes(c, recv + (size_t)rank * NG, NG, recv) == 0,
        "allgather_bytes in place: %s", dense_coll_errmsg(c));
  for (int r = 0; r < size; r++) {
    size_t bad = 0;
    for (size_t i = 0; i < NG; i++) bad += recv[(size_t)r * NG + i] != byte_of(r, i, 3);
    CHECK(bad == 0, "allgather_bytes in place: block %d: %zu bytes differ", r, bad);
  }
  /* refused on every rank alike, nothing sent (a hang otherwise) */
  CHECK(dense_coll_broadcast_bytes(c, b, NB, size) == SR_EINVAL, "broadcast_bytes from root %d taken",
        size);
  CHECK(dense_coll_allgather_bytes(c, send, SIZE_MAX / 2, recv) == SR_EINVAL &&
            strstr(dense_coll_errmsg(c), "overflows"),
        "allgather_bytes of SIZE_MAX/2 bytes from %d ranks: %s", size, dense_coll_errmsg(c));
  CHECK(dense_coll_allgather_bytes(c, send, (size_t)1 << 31, recv) == SR_EINVAL &&
            strstr(dense_coll_errmsg(c), "int count"),
        "allgather_bytes of 2^31 bytes per rank: %s", dense_coll_errmsg(c));
  free(recv);
}

int main(void) {
  char err[512];
  int rank = 0, size = 1, local = 1;
  if (!dense_mpi_launched(&rank, &size, &local)) {
    printf("not started by mpirun\n");
    return 2;
  }
  if (dense_mpi_init(err, sizeof err)) {
    printf("rank %d: FAIL %s\n", rank, err);
    return 1;
  }
  const char *y = getenv("OMPI_MCA_mpi_yield_when_idle");
  CHECK(y && !strcmp(y, "1"), "OMPI_MCA_mpi_yield_when_idle is %s, not 1", y ? y : "unset");
  dense_coll *c = dense_coll_mpi_create(err, sizeof err);
  if (!c) {
    printf("rank %d: FAIL %s\n", rank, err);
    dense_mpi_abort(1);
  }
  CHECK(c->rank == rank && c->size == size, "rank %d of %d, the environment says %d of %d",
        c->rank, c->size, rank, size);
  CHECK(!strcmp(c->ops->name, "mpi"), "backend %s", c->ops->name);

  /* All-reduce: sizes below, at and above the rank count, and one large. */
  size_t sizes[] = {1, 2, 3, 7, 1000, 300001};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    size_t n = sizes[k];
    float *buf = malloc(n * sizeof *buf), *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++) {
      buf[i] = value(rank, i, k);
      want[i] = value(0, i, k);
      for (int r = 1; r < size; r++) want[i] += value(r, i, k);
    }
    int rc = dense_coll_all_reduce_sum(c, buf, n);
    CHECK(rc == 0, "all_reduce of %zu: %s", n, dense_coll_errmsg(c));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&buf[i], &want[i], sizeof *buf) != 0;
    CHECK(bad == 0, "all_reduce of %zu: %zu values differ from the rank-order sum", n, bad);
    /* The same bits on every rank: rank 0 gathers them all. */
    size_t counts[64];
    for (int r = 0; r < size && r < 64; r++) counts[r] = n;
    float *all = rank == 0 ? malloc((size_t)size * n * sizeof *all) : NULL;
    rc = dense_coll_gather(c, buf, n, all, rank == 0 ? counts : NULL, 0);
    CHECK(rc == 0, "gather of %zu: %s", n, dense_coll_errmsg(c));
    if (rank == 0)
      for (int r = 1; r < size; r++)
        CHECK(!memcmp(all, all + (size_t)r * n, n * sizeof *all),
              "all_reduce of %zu: rank %d got other bits than rank 0", n, r);
    free(all);
    free(buf);
    free(want);
  }

  /* Broadcast from each root. */
  for (int root = 0; root < size; root++) {
    float b[5];
    for (int i = 0; i < 5; i++) b[i] = (float)(rank * 100 + i);
    CHECK(dense_coll_broadcast(c, b, 5, root) == 0, "broadcast: %s", dense_coll_errmsg(c));
    for (int i = 0; i < 5; i++)
      CHECK(b[i] == (float)(root * 100 + i), "broadcast from %d: b[%d] = %g", root, i, b[i]);
  }
  float dummy = 0; /* a root outside the job is refused before any communication */
  CHECK(dense_coll_broadcast(c, &dummy, 1, size) == SR_EINVAL, "broadcast from root %d taken", size);

  /* Gatherv: rank r sends r+1 values (rank 1 sends none when size > 2), to
   * the last rank as root; the root sees them concatenated in rank order. */
  int root = size - 1;
  size_t counts[64], total = 0;
  for (int r = 0; r < size && r < 64; r++) {
    counts[r] = (size > 2 && r == 1) ? 0 : (size_t)r + 1;
    total += counts[r];
  }
  float send[64];
  for (size_t i = 0; i < counts[rank]; i++) send[i] = (float)(rank * 1000 + (int)i);
  float *recv = rank == root ? calloc(total + 1, sizeof *recv) : NULL;
  int rc = dense_coll_gather(c, send, counts[rank], recv, rank == root ? counts : NULL, root);
  CHECK(rc == 0, "gatherv: %s", dense_coll_errmsg(c));
  if (rank == root) {
    size_t at = 0;
    for (int r = 0; r < size; r++)
      for (size_t i = 0; i < counts[r]; i++, at++)
        CHECK(recv[at] == (float)(r * 1000 + (int)i), "gatherv: recv[%zu] = %g, want %d", at,
              recv[at], r * 1000 + (int)i);
    CHECK(at == total, "gatherv: %zu values", at);
  }
  free(recv);

  check_bytes(c, rank, size);

  /* Barrier: rank 0 arrives last (after 300 ms); nobody leaves before it
   * arrived, which the others see by the time they leave. */
  CHECK(dense_coll_barrier(c) == 0, "barrier: %s", dense_coll_errmsg(c)); /* line up */
  double t0 = 0;
  {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t0 = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  }
  if (rank == 0) usleep(300 * 1000);
  CHECK(dense_coll_barrier(c) == 0, "barrier: %s", dense_coll_errmsg(c));
  {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double waited = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - t0;
    CHECK(waited >= 0.25, "barrier returned after %.3f s, before rank 0 (300 ms late) came", waited);
  }

  printf(fails ? "rank %d: %d check(s) failed\n" : "rank %d: ok\n", rank, fails);
  fflush(stdout);
  dense_coll_destroy(c);
  dense_mpi_finalize();
  return fails ? 1 : 0;
}
