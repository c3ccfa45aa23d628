/* startup_probe: MPI start-up the way stage-bcast does it, without stage-bcast, to tell an
 * MPI start-up crash of the library from one of ours (bench/startup_crash_rates.sh).
 *
 *   startup_probe plain     MPI_Init_thread(FUNNELED), MPI_Comm_dup of WORLD, the 256-byte
 *                           placement allgather, MPI_Comm_split_type(SHARED), an allreduce, a
 *                           barrier, MPI_Finalize: stage-bcast's start-up collectives.
 *   startup_probe threads   the same, then what stage-bcast's engine does next: a reader and a
 *                           writer thread started after MPI start-up (they never call MPI; the
 *                           writer writes and fsyncs 4 MiB under TMPDIR or /tmp) while the MPI
 *                           thread passes 4 MiB down the rank chain in 64 KiB messages
 *                           (MPI_Isend/MPI_Irecv polled with MPI_Test), then joins them.
 *   startup_probe early     like threads, but the two threads start BEFORE MPI_Init_thread
 *                           and run through it (a different start order than stage-bcast's).
 * Exit 0 when every step succeeded; 1 on an MPI error (MPI_ERRORS_RETURN on the duplicate). */
#include <fcntl.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { kKey = 256, kMsg = 64 * 1024, kTotal = 4 * 1024 * 1024 };

static volatile int stop_threads;

static void* reader(void* arg) {
  (void)arg;
  unsigned long x = 1;
  char buf[4096];
  while (!stop_threads) { /* CPU work like CRC-64 of chunks */
    for (size_t i = 0; i < sizeof buf; ++i) buf[i] = (char)(x = x * 6364136223846793005UL + 1);
  }
  return NULL;
}

static void* writer(void* arg) {
  (void)arg;
  const char* dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  char path[4096];
  snprintf(path, sizeof path, "%s/startup_probe.%d", dir, (int)getpid());
  static char buf[1 << 20];
  memset(buf, 'x', sizeof buf);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) {
    for (int i = 0; i < kTotal / (int)sizeof buf; ++i)
      if (write(fd, buf, sizeof buf) < 0) break;
    fsync(fd);
    close(fd);
    unlink(path);
  }
  while (!stop_threads) usleep(1000);
  return NULL;
}

#define CHECK(call)                                           \
  do {                                                        \
    int rc_ = (call);                                         \
    if (rc_ != MPI_SUCCESS) {                                 \
      fprintf(stderr, "startup_probe: %s failed\n", #call); \
      return 1;                                               \
    }                                                         \
  } while (0)

static int wait_test(MPI_Request* r) {
  for (int done = 0; !done;) {
    if (MPI_Test(r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return 1;
    if (!done) usleep(10);
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "plain";
  const int threads = strcmp(mode, "plain") != 0, early = strcmp(mode, "early") == 0;
  pthread_t t[2];
  if (early) {
    pthread_create(&t[0], NULL, reader, NULL);
    pthread_create(&t[1], NULL, writer, NULL);
  }
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return 1;
  MPI_Comm w;
  CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &w));
  CHECK(MPI_Comm_set_errhandler(w, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  MPI_Comm_rank(w, &rank);
  MPI_Comm_size(w, &size);
  char mine[kKey] = {0};
  gethostname(mine, kKey - 1);
  char* all = malloc((size_t)kKey * (size_t)size);
  CHECK(MPI_Allgather(mine, kKey, MPI_CHAR, all, kKey, MPI_CHAR, w));
  MPI_Comm local;
  CHECK(MPI_Comm_split_type(w, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local));
  long long v = rank;
  MPI_Request r;
  CHECK(MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_LONG_LONG, MPI_MAX, w, &r));
  if (wait_test(&r)) return 1;
  CHECK(MPI_Ibarrier(w, &r));
  if (wait_test(&r)) return 1;
  if (threads) {
    if (!early) {
      pthread_create(&t[0], NULL, reader, NULL);
      pthread_create(&t[1], NULL, writer, NULL);
    }
    static char msg[kMsg];
    for (int sent = 0; sent < kTotal; sent += kMsg) { /* the chain: 0 -> 1 -> ... -> size-1 */
      if (rank > 0) {
        CHECK(MPI_Irecv(msg, kMsg, MPI_BYTE, rank - 1, 7, w, &r));
        if (wait_test(&r)) return 1;
      }
      if (rank + 1 < size) {
        CHECK(MPI_Isend(msg, kMsg, MPI_BYTE, rank + 1, 7, w, &r));
        if (wait_test(&r)) return 1;
      }
    }
    stop_threads = 1;
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
  }
  CHECK(MPI_Ibarrier(w, &r));
  if (wait_test(&r)) return 1;
  MPI_Comm_free(&local);
  MPI_Comm_free(&w);
  free(all);
  MPI_Finalize();
  return 0;
}
