/* writer_sim: what a stage-bcast writer does per chunk, in isolation (one process, no MPI),
 * to measure how the ORDER of its passes over a chunk affects CPU cost (profile section of
 * bench/README.md). For TOTAL MiB in chunks of CHUNK MiB, using a pool of 4 chunk buffers
 * like bcast/transfer/engine.cc:
 *   receive   memcpy the chunk from a source buffer (stands in for the MPI receive copy)
 *   whole     crc64 over the whole chunk, then one pwrite of the whole chunk
 *             (what Transfer::writer_loop does today: verify, then write)
 *   split     crc64 over the whole chunk, then pwrite in BLOCK KiB pieces (isolates the
 *             size of one pwrite from the cache effect)
 *   blocks    for each BLOCK KiB piece: crc64 of the piece, then pwrite of the piece while it
 *             is still in the CPU cache (the proposed order)
 * then fsync. Prints wall and CPU seconds (getrusage). Buffers are malloc'd and faulted in
 * before the clock starts, so only the steady-state passes are timed.
 *
 *   cc -O2 -o writer_sim writer_sim.c -lisal
 *   ./writer_sim whole|split|blocks FILE TOTAL_MIB CHUNK_MIB [BLOCK_KIB=1024]
 */
#include <fcntl.h>
#include <isa-l/crc64.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}
static double cpu(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (double)r.ru_utime.tv_sec + (double)r.ru_utime.tv_usec / 1e6 + (double)r.ru_stime.tv_sec +
         (double)r.ru_stime.tv_usec / 1e6;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s whole|split|blocks FILE TOTAL_MIB CHUNK_MIB [BLOCK_KIB]\n", argv[0]);
    return 2;
  }
  const int blocks = strcmp(argv[1], "blocks") == 0, split = strcmp(argv[1], "split") == 0;
  const size_t total = (size_t)atol(argv[3]) << 20, chunk = (size_t)atol(argv[4]) << 20;
  const size_t block = (argc > 5 ? (size_t)atol(argv[5]) : 1024) << 10;
  char* src = malloc(chunk);
  char* pool[4];
  for (size_t i = 0; i < chunk; ++i) src[i] = (char)(i * 2654435761u >> 13);
  for (int k = 0; k < 4; ++k) {
    pool[k] = malloc(chunk);
    memset(pool[k], 0, chunk);
  }
  const int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    perror("open");
    return 1;
  }
  const double w0 = now(), c0 = cpu();
  uint64_t crc = 0;  // XOR of chunk CRCs: only keeps the CRC work from being optimized away
  size_t k = 0;
  for (size_t off = 0; off < total; off += chunk, k = (k + 1) % 4) {
    const size_t n = total - off < chunk ? total - off : chunk;
    char* b = pool[k];
    memcpy(b, src, n);  // the receive
    if (!blocks && !split) {
      crc ^= crc64_ecma_refl(0, (const unsigned char*)b, n);
      if (pwrite(fd, b, n, (off_t)off) != (ssize_t)n) return perror("pwrite"), 1;
    } else if (split) {
      crc ^= crc64_ecma_refl(0, (const unsigned char*)b, n);
      for (size_t p = 0; p < n; p += block) {
        const size_t m = n - p < block ? n - p : block;
        if (pwrite(fd, b + p, m, (off_t)(off + p)) != (ssize_t)m) return perror("pwrite"), 1;
      }
    } else {
      for (size_t p = 0; p < n; p += block) {
        const size_t m = n - p < block ? n - p : block;
        crc ^= crc64_ecma_refl(0, (const unsigned char*)b + p, m);
        if (pwrite(fd, b + p, m, (off_t)(off + p)) != (ssize_t)m) return perror("pwrite"), 1;
      }
    }
  }
  const double c_write = cpu() - c0;
  fsync(fd);
  close(fd);
  printf("mode=%s chunk_mib=%zu block_kib=%zu wall=%.3f cpu=%.3f cpu_before_fsync=%.3f crc=%016llx\n", argv[1],
         chunk >> 20, blocks || split ? block >> 10 : chunk >> 10, now() - w0, cpu() - c0, c_write, (unsigned long long)crc);
  return 0;
}
