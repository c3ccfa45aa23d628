// throttlefs: a read-only FUSE passthrough of one directory whose file reads are limited to a
// fixed rate, shared by every reader: a contended shared filesystem for the benchmarks.
//
//   throttlefs RATE_MB_S SRCDIR MOUNTPOINT [libfuse options, e.g. -f]
//   cc -O2 -Wall -o throttlefs bench/throttlefs.c $(pkg-config --cflags --libs fuse3) -lpthread
//
// - One token bucket for the whole mount: RATE_MB_S * 10^6 bytes per second of file data,
//   whatever the number of readers and files. A read is served (pread on the source), then
//   held until the bucket has paid for it; a reader idle for a while gets at most BURST_S of
//   credit back, so a sequential reader's own latency does not lower the rate.
// - Files are opened direct_io: the kernel's page cache never holds their pages, so a second
//   read (or another node's, in a simulated cluster sharing this mount) pays the rate again.
// - use_ino: the source's inode numbers, sizes and times pass through unchanged, so a tool
//   that identifies a file's version by (size, mtime, ctime, inode) sees the source's.
// - getxattr of "user.throttlefs.bytes_read" on any path gives the file bytes served so far
//   (not listed by listxattr): a count of the source's data reads independent of the reader.
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define BURST_S 0.05
#define COUNTER_XATTR "user.throttlefs.bytes_read"

static int src_fd = -1;
static double rate_bps;  // bytes per second
static pthread_mutex_t bucket_mu = PTHREAD_MUTEX_INITIALIZER;
static double bucket_paid_until;  // monotonic seconds up to which the rate is spoken for
static _Atomic uint64_t bytes_read;

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

// Reserves n bytes of the shared rate and sleeps until they are paid for.
static void throttle(size_t n) {
  pthread_mutex_lock(&bucket_mu);
  const double now = mono_now();
  double start = bucket_paid_until;
  if (start < now - BURST_S) start = now - BURST_S;
  bucket_paid_until = start + (double)n / rate_bps;
  const double until = bucket_paid_until;
  pthread_mutex_unlock(&bucket_mu);
  const double wait = until - mono_now();
  if (wait > 0) {
    struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
  }
}

// FUSE paths start with '/'; relative to the source directory's descriptor.
static const char* rel(const char* path) { return path[1] ? path + 1 : "."; }

static void* tf_init(struct fuse_conn_info* conn, struct fuse_config* cfg) {
  (void)conn;
  cfg->use_ino = 1;
  cfg->direct_io = 1;
  cfg->kernel_cache = 0;
  return NULL;
}

static int tf_getattr(const char* path, struct stat* st, struct fuse_file_info* fi) {
  (void)fi;  // (fi->fh is a DIR* for a directory: always by path)
  return fstatat(src_fd, rel(path), st, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : -errno;
}

static int tf_readlink(const char* path, char* buf, size_t size) {
  ssize_t n = readlinkat(src_fd, rel(path), buf, size - 1);
  if (n < 0) return -errno;
  buf[n] = '\0';
  return 0;
}

static int tf_open(const char* path, struct fuse_file_info* fi) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
  int fd = openat(src_fd, rel(path), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -errno;
  fi->fh = (uint64_t)fd;
  fi->direct_io = 1;
  return 0;
}

static int tf_read(const char* path, char* buf, size_t size, off_t off, struct fuse_file_info* fi) {
  (void)path;
  ssize_t n = pread((int)fi->fh, buf, size, off);
  if (n < 0) return -errno;
  atomic_fetch_add(&bytes_read, (uint64_t)n);
  throttle((size_t)n);
  return (int)n;
}

static int tf_release(const char* path, struct fuse_file_info* fi) {
  (void)path;
  close((int)fi->fh);
  return 0;
}

static int tf_opendir(const char* path, struct fuse_file_info* fi) {
  int fd = openat(src_fd, rel(path), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -errno;
  DIR* d = fdopendir(fd);
  if (!d) {
    int e = errno;
    close(fd);
    return -e;
  }
  fi->fh = (uint64_t)(uintptr_t)d;
  return 0;
}

static int tf_readdir(const char* path, void* buf, fuse_fill_dir_t fill, off_t off,
                      struct fuse_file_info* fi, enum fuse_readdir_flags flags) {
  (void)path, (void)off, (void)flags;
  DIR* d = (DIR*)(uintptr_t)fi->fh;
  rewinddir(d);
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    struct stat st = {.st_ino = e->d_ino, .st_mode = (mode_t)(DTTOIF(e->d_type))};
    if (fill(buf, e->d_name, &st, 0, 0)) break;
  }
  return 0;
}

static int tf_releasedir(const char* path, struct fuse_file_info* fi) {
  (void)path;
  closedir((DIR*)(uintptr_t)fi->fh);
  return 0;
}

static int tf_statfs(const char* path, struct statvfs* st) {
  (void)path;
  return fstatvfs(src_fd, st) == 0 ? 0 : -errno;
}

static int tf_access(const char* path, int mask) {
  if (mask & W_OK) return -EROFS;
  return faccessat(src_fd, rel(path), mask, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : -errno;
}

static int tf_getxattr(const char* path, const char* name, char* value, size_t size) {
  if (strcmp(name, COUNTER_XATTR) == 0) {
    char s[32];
    int len = snprintf(s, sizeof s, "%" PRIu64, atomic_load(&bytes_read));
    if (size == 0) return len;
    if (size < (size_t)len) return -ERANGE;
    memcpy(value, s, (size_t)len);
    return len;
  }
  char proc[64];
  int fd = openat(src_fd, rel(path), O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -errno;
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
  ssize_t n = getxattr(proc, name, value, size);
  int e = errno;
  close(fd);
  return n < 0 ? -e : (int)n;
}

static const struct fuse_operations ops = {
    .init = tf_init,
    .getattr = tf_getattr,
    .readlink = tf_readlink,
    .open = tf_open,
    .read = tf_read,
    .release = tf_release,
    .opendir = tf_opendir,
    .readdir = tf_readdir,
    .releasedir = tf_releasedir,
    .statfs = tf_statfs,
    .access = tf_access,
    .getxattr = tf_getxattr,
};

int main(int argc, char* argv[]) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s RATE_MB_S SRCDIR MOUNTPOINT [libfuse options]\n", argv[0]);
    return 2;
  }
  char* end;
  double mbs = strtod(argv[1], &end);
  if (*end || !(mbs > 0)) {
    fprintf(stderr, "%s: bad rate '%s' (MB/s, > 0)\n", argv[0], argv[1]);
    return 2;
  }
  rate_bps = mbs * 1e6;
  src_fd = open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (src_fd < 0) {
    perror(argv[2]);
    return 1;
  }
  // libfuse sees: argv[0] MOUNTPOINT -o ro,allow_other,default_permissions [the rest]
  char** fargv = calloc((size_t)argc + 2, sizeof *fargv);
  if (!fargv) return 1;
  int fargc = 0;
  fargv[fargc++] = argv[0];
  fargv[fargc++] = argv[3];
  fargv[fargc++] = "-o";
  fargv[fargc++] = "ro,allow_other,default_permissions,fsname=throttlefs";
  for (int i = 4; i < argc; i++) fargv[fargc++] = argv[i];
  return fuse_main(fargc, fargv, &ops, NULL);
}
