/* split_pwrite.so: an LD_PRELOAD shim for experiments only (bench/try_split_pwrite.sh). It
 * splits every pwrite()/pwrite64() larger than SPLIT_PWRITE_KIB (default 1024) into pieces of
 * that size, so stage-bcast's writer (PosixTxn::write in bcast/io/store.cc, one pwrite per chunk
 * piece: 16 MiB by default) can be measured with small writes WITHOUT changing product code.
 * Semantics are those of a loop of pwrite calls (the product already loops on short writes).
 *
 *   cc -O2 -shared -fPIC -o split_pwrite.so split_pwrite.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

typedef ssize_t (*pwrite_fn)(int, const void*, size_t, off_t);

static size_t piece(void) {
  static size_t p;
  if (p == 0) {
    const char* s = getenv("SPLIT_PWRITE_KIB");
    p = (size_t)(s != NULL && atol(s) > 0 ? atol(s) : 1024) << 10;
  }
  return p;
}

static ssize_t split(pwrite_fn real, int fd, const void* buf, size_t n, off_t off) {
  const size_t p = piece();
  if (n <= p) return real(fd, buf, n, off);
  size_t done = 0;
  while (done < n) {
    const size_t m = n - done < p ? n - done : p;
    const ssize_t w = real(fd, (const char*)buf + done, m, off + (off_t)done);
    if (w < 0) return done > 0 ? (ssize_t)done : w;
    done += (size_t)w;
    if ((size_t)w < m) break;
  }
  return (ssize_t)done;
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  static pwrite_fn real;
  if (real == NULL) real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
  return split(real, fd, buf, n, off);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  static pwrite_fn real;
  if (real == NULL) real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite");
  return split(real, fd, buf, n, off);
}
