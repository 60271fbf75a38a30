/* tools/cluster/pingpong.c: the MPI program of the cluster harness's tests (tests/cluster/).
 * Rank 0 and rank `peer` (argument 1, default 1) time round trips of small (8 B) and large
 * (1 MiB) messages; every rank prints one line `rank R ns NETNS host HOST` first (its network
 * namespace read from /proc/self/ns/net's inode, matched by the caller), then rank 0 prints
 * `latency_us X` and `latency_min_us X` (half the median and the fastest of 50 small round
 * trips) and `bandwidth_mbit Y` and `bandwidth_max_mbit Y` (large messages one way, from the
 * median and the fastest of 8 round trips). On a busy machine the fastest is the link's
 * own figure, the median adds the waits for a core. Built by mpicc at test time (no build of
 * bottle needed): tests/cluster/ and tools/cluster/cluster.sh's users. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Seconds of one round trip of `bytes` between rank 0 and `peer` over `reps` repeats:
 * the median, and the fastest in *fastest. */
static double round_trip(int rank, int peer, char* buf, int bytes, int reps, double* fastest) {
  double* times = malloc(sizeof(double) * reps);
  for (int i = -2; i < reps; ++i) { /* two warm-up round trips */
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buf, bytes, MPI_CHAR, peer, 0, MPI_COMM_WORLD);
      MPI_Recv(buf, bytes, MPI_CHAR, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == peer) {
      MPI_Recv(buf, bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
    }
    if (i >= 0) times[i] = MPI_Wtime() - start;
  }
  qsort(times, reps, sizeof(double), compare);
  const double median = times[reps / 2];
  *fastest = times[0];
  free(times);
  return median;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int peer = argc > 1 ? atoi(argv[1]) : 1;
  const int large = 1 << 20;
  struct stat ns;
  char host[256] = "";
  stat("/proc/self/ns/net", &ns);
  gethostname(host, sizeof host - 1);
  printf("rank %d ns %lu host %s\n", rank, (unsigned long)ns.st_ino, host);
  fflush(stdout);
  if (peer < 1 || peer >= size) {
    if (rank == 0) fprintf(stderr, "pingpong: peer %d is not a rank of %d\n", peer, size);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  char* buf = calloc(large, 1);
  double small_fastest = 0, big_fastest = 0;
  const double small = round_trip(rank, peer, buf, 8, 50, &small_fastest);
  const double big = round_trip(rank, peer, buf, large, 8, &big_fastest);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    printf("latency_us %.1f\n", small / 2 * 1e6);
    printf("latency_min_us %.1f\n", small_fastest / 2 * 1e6);
    printf("bandwidth_mbit %.1f\n", 2.0 * large * 8 / big / 1e6);
    printf("bandwidth_max_mbit %.1f\n", 2.0 * large * 8 / big_fastest / 1e6);
    fflush(stdout);
  }
  free(buf);
  MPI_Finalize();
  return 0;
}
