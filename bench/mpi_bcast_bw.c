/* mpi_bcast_bw: MPI_Bcast throughput alone (no file I/O, no threads), to separate the cost of
 * the broadcast from the rest of stage-bcast's pipeline (see bench_stage_bcast.sh, profile
 * section). Every rank broadcasts TOTAL bytes from rank 0 in CHUNK-sized MPI_Bcast calls into
 * one reused, pre-touched buffer, after a barrier; rank 0 prints the slowest rank's time.
 *
 * With DELAY_S > 0, rank 0 first sleeps DELAY_S seconds (a slow source) while the others already
 * wait in MPI_Bcast: run under `perf stat` to see what a blocked rank costs in CPU while it
 * waits (Open MPI polls: it spins, yielding when oversubscribed).
 *
 *   mpicc -O2 -o mpi_bcast_bw mpi_bcast_bw.c
 *   mpirun --oversubscribe -np 4 ./mpi_bcast_bw TOTAL_MIB CHUNK_KIB [DELAY_S]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const long total = (argc > 1 ? atol(argv[1]) : 1024) << 20;
  const long chunk = (argc > 2 ? atol(argv[2]) : 16384) << 10;
  const double delay = argc > 3 ? atof(argv[3]) : 0;
  char* buf = malloc((size_t)chunk);
  memset(buf, rank + 1, (size_t)chunk);
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  if (rank == 0 && delay > 0) usleep((useconds_t)(delay * 1e6));
  for (long off = 0; off < total; off += chunk) {
    const long n = total - off < chunk ? total - off : chunk;
    MPI_Bcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
  }
  double dt = MPI_Wtime() - t0, worst = 0;
  MPI_Reduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0)
    printf("ranks=%d total_mib=%ld chunk_kib=%ld seconds=%.3f mb_s=%.1f\n", size, total >> 20, chunk >> 10, worst,
           (double)total / worst / 1e6);
  free(buf);
  MPI_Finalize();
  return 0;
}
