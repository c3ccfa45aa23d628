/* LD_PRELOAD shim for the store's O_DIRECT fallbacks (ctest unit.direct_faults.*).
 *
 * STAGE_DIRECT_FAULT selects what O_DIRECT does, as a filesystem or a kernel might:
 *   open        opening with O_DIRECT fails with EINVAL (filesystems without direct I/O)
 *   einval:N    the Nth pwrite on an O_DIRECT descriptor fails with EINVAL
 *   short:N     the Nth pwrite on an O_DIRECT descriptor writes half its bytes plus 100
 *               (leaving the next write unaligned, which the kernel then refuses)
 * Buffered descriptors are never touched. At exit it prints "direct_faults: injected K" so
 * the test can check the fault really happened. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

enum { NONE, OPEN, EINVAL_AT, SHORT_AT };
static int mode = -1;
static long nth;
static long direct_writes;
static long injected;

static void report(void) { fprintf(stderr, "direct_faults: injected %ld\n", injected); }

static void setup(void) {
  if (mode >= 0) return;
  const char* f = getenv("STAGE_DIRECT_FAULT");
  mode = NONE;
  if (f == NULL) return;
  if (strcmp(f, "open") == 0) mode = OPEN;
  else if (strncmp(f, "einval:", 7) == 0) mode = EINVAL_AT, nth = atol(f + 7);
  else if (strncmp(f, "short:", 6) == 0) mode = SHORT_AT, nth = atol(f + 6);
  atexit(report);
}

static int do_open(const char* name, const char* path, int flags, mode_t m) {
  setup();
  if (mode == OPEN && (flags & O_DIRECT)) {
    ++injected;
    errno = EINVAL;
    return -1;
  }
  int (*real)(const char*, int, ...);
  *(void**)(&real) = dlsym(RTLD_NEXT, name); /* the POSIX way round ISO C's pointer rules */
  return real(path, flags, m);
}

int open(const char* path, int flags, ...) {
  mode_t m = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    m = va_arg(ap, mode_t);
    va_end(ap);
  }
  return do_open("open", path, flags, m);
}

/* On 64-bit glibc open64 and open are the same call. */
int open64(const char* path, int flags, ...) __attribute__((alias("open")));

static ssize_t do_pwrite(const char* name, int fd, const void* buf, size_t n, off_t off) {
  setup();
  ssize_t (*real)(int, const void*, size_t, off_t);
  *(void**)(&real) = dlsym(RTLD_NEXT, name);
  const int fl = fcntl(fd, F_GETFL);
  if (fl != -1 && (fl & O_DIRECT) && (mode == EINVAL_AT || mode == SHORT_AT) && ++direct_writes == nth) {
    ++injected;
    if (mode == EINVAL_AT) {
      errno = EINVAL;
      return -1;
    }
    if (n > 4096) n = n / 2 + 100; /* a short write: the rest must follow, unaligned */
  }
  return real(fd, buf, n, off);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) { return do_pwrite("pwrite", fd, buf, n, off); }
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) __attribute__((alias("pwrite")));
