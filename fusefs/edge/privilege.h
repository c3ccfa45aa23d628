// What this process may do with FUSE, decided before mounting.
//
// libfuse mounts with `auto_unmount` through fusermount3 (setuid root), as root too. What that
// means for a mount:
//   allow_other   fusermount3 grants it to root (real uid 0) and, for anyone else, only when
//                 /etc/fuse.conf says `user_allow_other`; otherwise it refuses the whole mount.
//                 Without it the mount is for the caller only: other users, root included,
//                 get EACCES.
//   passthrough   registering a backing file (FUSE_DEV_IOC_BACKING_OPEN) needs CAP_SYS_ADMIN
//                 in the initial user namespace; without it every open would be refused, so
//                 the mount does not negotiate passthrough at all and says reads are spliced.
//   the mount     needs fusermount3 (setuid root for a non-root caller), the /dev/fuse
//                 character device readable and writable by the caller (fusermount3 opens it
//                 with the caller's rights), and, for a non-root caller, a mount point it may
//                 write to (and owns, if the directory is sticky): fusermount3's own rules,
//                 checked here first so that a failure names its cause.
// Stateless; thread-safe. No FUSE headers: the pure parts are unit-tested.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace stagefs {

struct Privileges {
  uid_t uid = 0;                  // real uid (what fusermount3 checks)
  bool cap_sys_admin = false;     // effective CAP_SYS_ADMIN (kernel passthrough)
  bool user_allow_other = false;  // /etc/fuse.conf has a `user_allow_other` line
  // fusermount3 will accept allow_other from this caller.
  [[nodiscard]] bool may_allow_other() const { return uid == 0 || user_allow_other; }
};

// fuse.conf text: true when a line (comments after '#' and surrounding blanks removed) is
// exactly `user_allow_other`, as fusermount3 reads it.
bool fuse_conf_allows_other(std::string_view text);

inline constexpr const char* kFuseConf = "/etc/fuse.conf";

// This process's privileges now (capget; fuse_conf is read if it exists).
Privileges probe_privileges(const char* fuse_conf = kFuseConf);

// Where libfuse will find fusermount3 (its install directory, then PATH), or empty.
std::string find_fusermount3();

// Why mounting at `mountpoint` will fail for a caller with `p`, checked without mounting:
// fusermount3 missing or (for a non-root caller) not setuid root, /dev/fuse missing, not the
// FUSE device, or not readable and writable by the caller (for root: not openable, a
// container's device policy), a non-root caller without write access to the mount point (or
// not owning a sticky one). Empty when none of
// these applies; the mount may still fail for reasons only fusermount3 sees (mount_max, a
// nosuid filesystem): it prints them itself.
std::string mount_obstacle(const std::string& mountpoint, const Privileges& p);

}  // namespace stagefs
