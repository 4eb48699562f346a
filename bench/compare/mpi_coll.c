/* Open MPI side of bench/compare: bus bandwidth of one collective, float32,
 * out-of-place where MPI has it, sizes min..max bytes by factor; for each size
 * a warm-up, then iterations for about `seconds` (at least 5), timed as the
 * maximum over ranks of the mean time per call.
 *
 * Collectives (tutti-perf's names; allreduce, reducescatter, allgather, bcast
 * are accepted too):
 *   all_reduce      MPI_Allreduce, sum, count = size/4
 *   reduce_scatter  MPI_Reduce_scatter_block, sum, recvcount = size/4/n
 *   all_gather      MPI_Allgather, sendcount = size/4/n
 *   broadcast       MPI_Bcast, root 0, count = size/4
 * Sizes as nccl-tests and tutti-perf: `size` is the total buffer (for
 * reduce_scatter the send buffer, for all_gather the receive buffer); for those
 * two it is rounded down to a multiple of n*4 bytes, and a size that rounds to
 * 0 is skipped. busbw = size / time x factor, factor 2(n-1)/n for all_reduce,
 * (n-1)/n for reduce_scatter and all_gather, 1 for broadcast. After timing,
 * the output is filled with garbage, one more call is made and its result
 * checked, so a broken run cannot report a number. Prints CSV lines:
 *   impl,transport,coll,np,bytes,time_us,busbw_gbs
 * usage: mpi_coll <coll> <transport-label> <minbytes> <maxbytes> <factor> <seconds> */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum Coll { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST };

static int parseColl(const char* s, enum Coll* c) {
  static const struct { const char* name; enum Coll coll; } names[] = {
      {"all_reduce", ALL_REDUCE},   {"allreduce", ALL_REDUCE},
      {"reduce_scatter", REDUCE_SCATTER}, {"reducescatter", REDUCE_SCATTER},
      {"all_gather", ALL_GATHER},   {"allgather", ALL_GATHER},
      {"broadcast", BROADCAST},     {"bcast", BROADCAST}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i)
    if (strcmp(s, names[i].name) == 0) {
      *c = names[i].coll;
      return 1;
    }
  return 0;
}

static const char* collName(enum Coll c) {
  static const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast"};
  return names[c];
}

/* One call. `elems` is the per-rank count of the API (count, recvcount or
 * sendcount); broadcast's buffer is `in` on the root and `out` elsewhere. */
static void call(enum Coll c, int rank, const float* in, float* out, int elems) {
  switch (c) {
    case ALL_REDUCE:
      MPI_Allreduce(in, out, elems, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case REDUCE_SCATTER:
      MPI_Reduce_scatter_block(in, out, elems, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case ALL_GATHER:
      MPI_Allgather(in, elems, MPI_FLOAT, out, elems, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case BROADCAST:
      MPI_Bcast(rank == 0 ? (float*)in : out, elems, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
  }
}

/* Input element i of rank r. Small integers: float sums are exact. */
static float val(int r, size_t i) { return (float)((r + i) % 7); }

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, np;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  enum Coll coll;
  if (argc < 2 || !parseColl(argv[1], &coll)) {
    if (rank == 0)
      fprintf(stderr, "usage: mpi_coll all_reduce|reduce_scatter|all_gather|broadcast "
                      "<transport-label> <minbytes> <maxbytes> <factor> <seconds>\n");
    MPI_Finalize();
    return 2;
  }
  const char* label = argc > 2 ? argv[2] : "?";
  size_t minb = argc > 3 ? strtoull(argv[3], NULL, 10) : 8;
  size_t maxb = argc > 4 ? strtoull(argv[4], NULL, 10) : (1u << 20);
  size_t factor = argc > 5 ? strtoull(argv[5], NULL, 10) : 2;
  double seconds = argc > 6 ? atof(argv[6]) : 0.2;
  if (minb < 4) minb = 4;
  if (factor < 2) factor = 2;
  double busFactor = coll == ALL_REDUCE ? 2.0 * (np - 1) / np
                     : coll == BROADCAST ? 1.0
                                         : (double)(np - 1) / np;
  float* in = malloc(maxb);
  float* out = malloc(maxb);
  for (size_t i = 0; i < maxb / 4; ++i) in[i] = val(rank, i);
  for (size_t req = minb; req <= maxb; req *= factor) {
    /* Element counts as tutti-perf's countsFor(): total = size/4, per rank
     * total/n for reduce_scatter and all_gather, whose total is then
     * (total/n)*n; bytes = that total x 4, the size tutti-perf prints. */
    size_t total = req / 4, elems = total, outElems = total;
    if (coll == REDUCE_SCATTER || coll == ALL_GATHER) {
      elems = total / np;
      total = elems * np;
      outElems = coll == ALL_GATHER ? total : elems;
    }
    if (elems == 0) continue;
    size_t bytes = total * 4;
    for (int w = 0; w < 3; ++w) call(coll, rank, in, out, (int)elems);
    /* Calibrate the iteration count on rank 0 and share it. */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    call(coll, rank, in, out, (int)elems);
    double one = MPI_Wtime() - t0;
    int iters = (int)(seconds / (one > 1e-7 ? one : 1e-7));
    if (iters < 5) iters = 5;
    if (iters > 100000) iters = 100000;
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int it = 0; it < iters; ++it) call(coll, rank, in, out, (int)elems);
    double mean = (MPI_Wtime() - t0) / iters, worst;
    MPI_Reduce(&mean, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    /* Check one call's result into a garbage-filled output. */
    for (size_t i = 0; i < outElems; ++i) out[i] = -1.0f;
    call(coll, rank, in, out, (int)elems);
    long bad = 0;
    if (!(coll == BROADCAST && rank == 0)) {
      for (size_t i = 0; i < outElems; ++i) {
        float want = 0;
        switch (coll) {
          case ALL_REDUCE:
            for (int r = 0; r < np; ++r) want += val(r, i);
            break;
          case REDUCE_SCATTER:
            for (int r = 0; r < np; ++r) want += val(r, (size_t)rank * elems + i);
            break;
          case ALL_GATHER:
            want = val((int)(i / elems), i % elems);
            break;
          case BROADCAST:
            want = val(0, i);
            break;
        }
        if (out[i] != want) ++bad;
      }
    }
    long badAll = 0;
    MPI_Reduce(&bad, &badAll, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      if (badAll) {
        fprintf(stderr, "mpi_coll: %s: %ld wrong values at %zu bytes\n", collName(coll), badAll,
                bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      double busbw = (double)bytes / worst * busFactor / 1e9;
      printf("openmpi,%s,%s,%d,%zu,%.3f,%.4f\n", label, collName(coll), np, bytes, worst * 1e6,
             busbw);
      fflush(stdout);
    }
  }
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
