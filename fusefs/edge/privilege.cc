#include "fusefs/edge/privilege.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "bcast/io/fd.h"
#include "bcast/io/paths.h"

namespace stagefs {

namespace {

std::string_view trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

bool effective_cap_sys_admin() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[CAP_SYS_ADMIN / 32].effective & (1U << (CAP_SYS_ADMIN % 32))) != 0;
}

// The directory libfuse execs fusermount3 from first (FUSERMOUNT_DIR in its build).
constexpr const char* kFusermountDir = "/usr/bin";

}  // namespace

bool fuse_conf_allows_other(std::string_view text) {
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    if (trim(line) == "user_allow_other") return true;
  }
  return false;
}

Privileges probe_privileges(const char* fuse_conf) {
  Privileges p;
  p.uid = ::getuid();
  p.cap_sys_admin = effective_cap_sys_admin();
  std::ifstream in(fuse_conf);
  if (in) {
    std::ostringstream text;
    text << in.rdbuf();
    p.user_allow_other = fuse_conf_allows_other(text.str());
  }
  return p;
}

std::string find_fusermount3() {
  std::string first = std::string(kFusermountDir) + "/fusermount3";
  if (::access(first.c_str(), X_OK) == 0) return first;
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "";
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string dir(rest.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    if (dir.empty()) continue;
    std::string cand = dir + "/fusermount3";
    if (::access(cand.c_str(), X_OK) == 0) return cand;
  }
  return {};
}

std::string mount_obstacle(const std::string& mountpoint, const Privileges& p) {
  const std::string who = stage::owner_text(p.uid);
  const std::string fm = find_fusermount3();
  if (fm.empty())
    return "fusermount3 is not installed (package fuse3): libfuse mounts through it, as root too";
  struct stat st {};
  if (p.uid != 0 && (::stat(fm.c_str(), &st) != 0 || (st.st_mode & S_ISUID) == 0 || st.st_uid != 0))
    return fm + " is not setuid root: " + who + " can mount only through a setuid fusermount3 (chmod u+s " +
           fm + ", or run stagefs as root)";
  if (::stat("/dev/fuse", &st) != 0)
    return std::string("/dev/fuse: ") + std::strerror(errno) +
           " (modprobe fuse; in a container, pass the device in)";
  if (!S_ISCHR(st.st_mode) || major(st.st_rdev) != 10 || minor(st.st_rdev) != 229)
    return "/dev/fuse is not the FUSE device (character device 10:229)";
  // fusermount3 opens /dev/fuse with the caller's rights (fsuid), not its own: it must be
  // readable and writable by the caller (0666 on most distributions).
  if (p.uid == 0) {  // root: a device cgroup (a container) may still deny it
    const stage::Fd fd(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
    if (!fd.valid())
      return std::string("/dev/fuse cannot be opened: ") + std::strerror(errno) +
             " (a container's device policy?)";
    return {};
  }
  if (::access("/dev/fuse", R_OK | W_OK) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777U);
    return "/dev/fuse (mode " + std::string(mode) + ") is not readable and writable by " + who +
           ": fusermount3 opens it with the caller's rights, and so does a container runtime's squashfuse "
           "(most systems make it 0666; the administrator can: the stagefs admin kit's prolog sets it)";
  }
  // fusermount3's rules for a non-root caller (it checks them with the caller's rights).
  if (::stat(mountpoint.c_str(), &st) != 0) return {};  // check_mountpoint names this one
  const std::string theirs = "it is " + stage::owner_text(st.st_uid) + "'s";
  if ((st.st_mode & S_ISVTX) != 0 && st.st_uid != p.uid)
    return "mount point " + mountpoint + " is a sticky directory not owned by " + who + " (" + theirs +
           "): fusermount3 refuses it (use a directory " + who +
           " owns; stagefs run mounts on a directory of "
           "its job that the site's prolog creates)";
  if (::access(mountpoint.c_str(), W_OK) != 0)
    return "mount point " + mountpoint + " is not writable by " + who + " (" + theirs +
           "): fusermount3 mounts only where the caller may write (use a directory " + who +
           " owns; stagefs run mounts on a directory of its job that the site's prolog creates)";
  return {};
}

}  // namespace stagefs
