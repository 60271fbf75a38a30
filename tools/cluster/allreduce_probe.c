/* tools/cluster/allreduce_probe.c: MPI's all-reduce over the ranks of the job, as
 * tools/cluster/emulate.sh measures the shaped links of an emulated cluster. For each size
 * (arguments: bytes, default 64 262144 1048576 4194304; floats summed, as bottle's fp32 TP
 * all-reduces are; PROBE_ELEMENT_BYTES=2: 16-bit integers, as many bytes and 2^18-element
 * chunks as bf16's) it times rounds of a few calls, each round started by a barrier, and
 * rank 0 prints one line per size:
 *   allreduce ranks N bytes S median_us X min_us Y
 * X the median round's time per call and Y the fastest's, both the slowest rank's. Then
 * rank 0 and the last rank time 8-byte round trips and rank 0 prints
 *   oneway_us X min_us Y
 * (half the median and the fastest round trip): the link's latency without MPI's
 * collective machinery. With PROBE_GAP_MS=G every rank sleeps G ms before each timed call
 * (out of the timing), as a training step computes between its collectives (PROBE_SPIN=1:
 * spins on its core instead, as a computing rank holds it). With PROBE_ALGO=bottle (and a
 * power-of-two number of ranks) the all-reduce is bottle's own (src/comm/mpi_communicator.cpp,
 * MpiCommunicator::run_all_reduce): recursive doubling over point-to-point messages in chunks
 * of 2^18 elements, up to 16 chunks' exchanges in flight (PROBE_WINDOW=W to compare), each
 * reduced by MPI_Reduce_local as it arrives; not Open MPI's MPI_Allreduce, which bench tp does not call there. Built by mpicc
 * at run time (no build of bottle needed). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* bottle's all-reduce of a power-of-two group (MpiCommunicator::run_all_reduce): in each
 * round of the recursive doubling the message goes in chunks of 2^18 elements with up to
 * `window` chunks' exchanges in flight, each chunk reduced as soon as its exchange has ended.
 * `scratch` holds window chunks. */
static void bottle_allreduce(char* x, char* scratch, int count, MPI_Datatype type, int element,
                             int rank, int size, int window) {
  enum { kChunk = 1 << 18 };
  const int chunks = (count + kChunk - 1) / kChunk;
  MPI_Request requests[2 * 64];
  for (int distance = 1; distance < size; distance *= 2) {
    const int partner = rank ^ distance;
    int posted = 0;
    for (int done = 0; done < chunks; ++done) {
      for (; posted < chunks && posted - done < window; ++posted) {
        const long begin = (long)posted * kChunk;
        const int n = (int)(count - begin < kChunk ? count - begin : kChunk);
        const int slot = posted % window;
        MPI_Irecv(scratch + (long)slot * kChunk * element, n, type, partner, 7, MPI_COMM_WORLD,
                  &requests[2 * slot]);
        MPI_Isend(x + begin * element, n, type, partner, 7, MPI_COMM_WORLD,
                  &requests[2 * slot + 1]);
      }
      const long begin = (long)done * kChunk;
      const int n = (int)(count - begin < kChunk ? count - begin : kChunk);
      const int slot = done % window;
      MPI_Waitall(2, &requests[2 * slot], MPI_STATUSES_IGNORE);
      MPI_Reduce_local(scratch + (long)slot * kChunk * element, x + begin * element, n, type,
                       MPI_SUM);
    }
  }
}

static int compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  static const long defaults[] = {64, 262144, 1048576, 4194304};
  const int nsizes = argc > 1 ? argc - 1 : 4;
  enum { kRounds = 9 };
  const char* gap_env = getenv("PROBE_GAP_MS");
  const double gap_ms = gap_env ? atof(gap_env) : 0;
  const struct timespec gap = {(time_t)(gap_ms / 1000), (long)(gap_ms * 1e6) % 1000000000L};
  const int spin = getenv("PROBE_SPIN") && atoi(getenv("PROBE_SPIN")) != 0;
  const int bottle = getenv("PROBE_ALGO") && strcmp(getenv("PROBE_ALGO"), "bottle") == 0 &&
                     (size & (size - 1)) == 0;
  /* Chunks in flight: bottle's (kAllReduceWindow); PROBE_WINDOW=W for comparisons. */
  int window = getenv("PROBE_WINDOW") ? atoi(getenv("PROBE_WINDOW")) : 16;
  window = window < 1 ? 1 : window > 64 ? 64 : window;
  const int element = getenv("PROBE_ELEMENT_BYTES") && atoi(getenv("PROBE_ELEMENT_BYTES")) == 2 ? 2 : 4;
  const MPI_Datatype type = element == 2 ? MPI_SHORT : MPI_FLOAT;
  for (int s = 0; s < nsizes; ++s) {
    const long bytes = argc > 1 ? atol(argv[s + 1]) : defaults[s];
    const int count = (int)(bytes / element > 0 ? bytes / element : 1);
    char* in = calloc((size_t)count, (size_t)element);
    char* out = calloc((size_t)(bottle ? window * (1 << 18) : count), (size_t)element);
#define ALLREDUCE()                                                                 \
  (bottle ? bottle_allreduce(in, out, count, type, element, rank, size, window)      \
          : (void)MPI_Allreduce(in, out, count, type, MPI_SUM, MPI_COMM_WORLD))
    /* Calls per round: more for small messages, so a round lasts a few milliseconds. */
    const int calls = bytes <= 65536 ? 16 : bytes <= 1048576 ? 4 : 2;
    double times[kRounds];
    ALLREDUCE(); /* connections, caches */
    for (int r = 0; r < kRounds; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      double mine = 0, slowest = 0;
      if (gap_ms > 0) {
        for (int c = 0; c < calls; ++c) {
          if (spin) {
            const double until = MPI_Wtime() + gap_ms * 1e-3;
            while (MPI_Wtime() < until) {
            }
          } else {
            nanosleep(&gap, NULL);
          }
          const double start = MPI_Wtime();
          ALLREDUCE();
          mine += (MPI_Wtime() - start) / calls;
        }
      } else {
        const double start = MPI_Wtime();
        for (int c = 0; c < calls; ++c) ALLREDUCE();
        mine = (MPI_Wtime() - start) / calls;
      }
      MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      times[r] = slowest;
    }
    qsort(times, kRounds, sizeof(double), compare);
    if (rank == 0)
      printf("allreduce ranks %d bytes %ld median_us %.1f min_us %.1f\n", size, bytes,
             times[kRounds / 2] * 1e6, times[0] * 1e6);
    free(in);
    free(out);
  }
  if (size > 1) {
    const int peer = size - 1;
    enum { kTrips = 40 };
    double trips[kTrips];
    char byte8[8] = {0};
    for (int i = -2; i < kTrips; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(byte8, 8, MPI_CHAR, peer, 0, MPI_COMM_WORLD);
        MPI_Recv(byte8, 8, MPI_CHAR, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (rank == peer) {
        MPI_Recv(byte8, 8, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(byte8, 8, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
      }
      if (i >= 0) trips[i] = MPI_Wtime() - start;
    }
    qsort(trips, kTrips, sizeof(double), compare);
    if (rank == 0) printf("oneway_us %.1f min_us %.1f\n", trips[kTrips / 2] / 2 * 1e6, trips[0] / 2 * 1e6);
  }
  fflush(stdout);
  MPI_Finalize();
  return 0;
}
