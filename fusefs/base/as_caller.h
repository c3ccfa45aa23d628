// Checks made as the caller of a FUSE request: a root daemon takes the caller's filesystem
// credentials on one thread (AsCaller), resolves a path beneath SOURCE_DIR with them (the
// kernel checks search permission on every directory on the way, modes and POSIX ACLs as they
// are now, and the source filesystem's own rules: NFS, Lustre...), then checks read access on
// the inode it reached (AccessCheck).
//
// AccessCheck asks the kernel in one of two ways, chosen once at start (probe()):
//   faccessat2   faccessat2(fd, "", mask, AT_EACCESS | AT_EMPTY_PATH): the kernel's answer for
//                the thread's credentials (Linux 5.8 and later);
//   reopen       where faccessat2 is missing (older kernels: ENOSYS; container runtimes whose
//                seccomp filter predates it: EPERM), the inode is opened again for reading
//                through /proc/self/fd/N with the caller's credentials. The kernel decides that
//                open with the same permission check (modes, ACLs, the filesystem's own), so
//                the answers are faccessat2's. Only R_OK can be asked that way, and only of
//                regular files and directories: a FIFO, socket or device is never opened (an
//                open may have side effects), it is refused (EACCES); every caller of the
//                check refuses those types anyway. The reopened descriptor is closed at once.
//   glibc's faccessat() emulation is not a fallback: it fails AT_EMPTY_PATH with EINVAL, and
//   it evaluates mode bits only (no ACLs) against the process's, not the thread's, credentials.
// Both are stateless after probe(); thread-safe. No FUSE, no MPI.
#pragma once

#include <cstdint>
#include <vector>

namespace stagefs {

// Who asks (from the FUSE request). uid 0 is not checked.
struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;
};

// The caller's fsuid, fsgid and supplementary groups on this thread for its lifetime (per-thread
// credentials: the raw syscalls, not glibc's setgroups, which changes every thread). A non-zero
// fsuid drops the filesystem capabilities (CAP_DAC_OVERRIDE...), so the kernel decides as it
// would for the caller. Restores root's on destruction. Only for a daemon running as root.
class AsCaller {
 public:
  explicit AsCaller(const Caller& who);
  ~AsCaller();
  AsCaller(const AsCaller&) = delete;
  AsCaller& operator=(const AsCaller&) = delete;
  // False if the credentials could not be taken (then nothing may be decided as the caller).
  [[nodiscard]] bool ok() const { return ok_; }

 private:
  bool ok_ = false;
};

class AccessCheck {
 public:
  enum class Method { faccessat2, reopen };
  // faccessat2 if the kernel answers it on dir_fd (any directory the daemon may read), else
  // reopen. Called once, at start.
  static Method probe(int dir_fd);
  explicit AccessCheck(Method m) : method_(m) {}
  [[nodiscard]] Method method() const { return method_; }
  // 0 if this thread's credentials (AsCaller) grant `mask` on what fd holds (any open or O_PATH
  // descriptor), else the errno (EACCES...). reopen: mask must be R_OK.
  [[nodiscard]] int check(int fd, int mask) const;

 private:
  Method method_;
};

const char* to_string(AccessCheck::Method m);

}  // namespace stagefs
