/* MPI_Allreduce bus-bandwidth benchmark, the Open MPI side of bench/compare.
 * float32 sum, out-of-place, sizes min..max bytes by factor; for each size a
 * warm-up, then iterations for about `seconds` (at least 5), timed as the
 * maximum over ranks of the mean time per call. Prints CSV lines:
 *   impl,transport,np,bytes,time_us,busbw_gbs
 * usage: mpi_allreduce <transport-label> <minbytes> <maxbytes> <factor> <seconds> */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, np;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  const char* label = argc > 1 ? argv[1] : "?";
  size_t minb = argc > 2 ? strtoull(argv[2], NULL, 10) : 8;
  size_t maxb = argc > 3 ? strtoull(argv[3], NULL, 10) : (1u << 20);
  size_t factor = argc > 4 ? strtoull(argv[4], NULL, 10) : 2;
  double seconds = argc > 5 ? atof(argv[5]) : 0.2;
  if (minb < 4) minb = 4;
  float* in = malloc(maxb);
  float* out = malloc(maxb);
  for (size_t i = 0; i < maxb / 4; ++i) in[i] = (float)((rank + i) % 7);
  for (size_t bytes = minb; bytes <= maxb; bytes *= factor) {
    int count = (int)(bytes / 4);
    for (int w = 0; w < 3; ++w) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    /* Calibrate the iteration count on rank 0 and share it. */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double one = MPI_Wtime() - t0;
    int iters = (int)(seconds / (one > 1e-7 ? one : 1e-7));
    if (iters < 5) iters = 5;
    if (iters > 100000) iters = 100000;
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int it = 0; it < iters; ++it)
      MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double mean = (MPI_Wtime() - t0) / iters, worst;
    MPI_Reduce(&mean, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    /* Check the result once, so a broken run cannot report a number. */
    long bad = 0;
    for (int i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < np; ++r) want += (float)((r + i) % 7);
      if (out[i] != want) ++bad;
    }
    long badAll = 0;
    MPI_Reduce(&bad, &badAll, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      if (badAll) {
        fprintf(stderr, "mpi_allreduce: %ld wrong values at %zu bytes\n", badAll, bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      double busbw = (double)bytes / worst * 2.0 * (np - 1) / np / 1e9;
      printf("openmpi,%s,%d,%zu,%.3f,%.4f\n", label, np, bytes, worst * 1e6, busbw);
      fflush(stdout);
    }
  }
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
