#include "fusefs/base/as_caller.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "bcast/io/fd.h"
#include "fusefs/base/beneath.h"

namespace stagefs {

AsCaller::AsCaller(const Caller& who) {
  ok_ = ::syscall(SYS_setgroups, who.groups.size(), who.groups.data()) == 0;
  ::syscall(SYS_setfsgid, who.gid);
  ::syscall(SYS_setfsuid, who.uid);
  ok_ = ok_ && static_cast<uint32_t>(::syscall(SYS_setfsuid, -1)) == who.uid &&
        static_cast<uint32_t>(::syscall(SYS_setfsgid, -1)) == who.gid;
}

AsCaller::~AsCaller() {
  ::syscall(SYS_setfsuid, 0);
  ::syscall(SYS_setfsgid, 0);
  ::syscall(SYS_setgroups, 0, nullptr);
}

namespace {

// The raw system call: glibc's faccessat() would emulate a missing one wrongly (see the header).
int faccessat2_fd(int fd, int mask) {
  return ::syscall(SYS_faccessat2, fd, "", mask, AT_EACCESS | AT_EMPTY_PATH) == 0 ? 0 : errno;
}

int reopen_for_reading(int fd, int mask) {
  if (mask != R_OK) return EINVAL;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno;
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return EACCES;  // never opened: see the header
  const int flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (S_ISDIR(st.st_mode) ? O_DIRECTORY : 0);
  const stage::Fd again(::open(proc_fd_path(fd).c_str(), flags));
  return again.valid() ? 0 : errno;
}

}  // namespace

AccessCheck::Method AccessCheck::probe(int dir_fd) {
  // Any answer of the kernel's own (0, EACCES) says the call exists; ENOSYS (no such call) or
  // EPERM/EINVAL (a filter that does not know it) say it does not.
  const int err = faccessat2_fd(dir_fd, R_OK);
  return err == 0 || err == EACCES ? Method::faccessat2 : Method::reopen;
}

int AccessCheck::check(int fd, int mask) const {
  return method_ == Method::faccessat2 ? faccessat2_fd(fd, mask) : reopen_for_reading(fd, mask);
}

const char* to_string(AccessCheck::Method m) {
  return m == AccessCheck::Method::faccessat2 ? "faccessat2" : "a reopen as the caller";
}

}  // namespace stagefs
