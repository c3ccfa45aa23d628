// Path checks the tools make before they touch anything, so that nothing is accepted that
// should be refused: where a path really is once symlinks are resolved, whether one path lies inside
// another, which pseudo filesystem (proc, sysfs, ...) holds a path, which file types a copy
// must never replace, and how to name the owner of a path in a message. Stateless and
// thread-safe; the pure functions are unit-tested.
#pragma once

#include <sys/types.h>

#include <string>

namespace stage {

// The absolute path with every symlink of its longest existing prefix resolved and the rest
// appended with "." and ".." folded (realpath of what exists, lexical for what does not yet).
std::string resolve_path(const std::string& p);

// True when `child` is `parent` or lies below it, compared component by component ("/a/bc" is
// not inside "/a/b"). Lexical: resolve both first.
bool path_within(const std::string& child, const std::string& parent);

// The name of a pseudo filesystem by its statfs f_type (proc, sysfs, debugfs, tracefs,
// securityfs, cgroup, cgroup2, configfs, efivarfs, bpf, pstore, ...): files whose stat size
// does not describe what a read returns. nullptr for anything else.
const char* pseudo_fs_name(long f_type);
// The same for the filesystem holding `path` (statfs; nullptr when it cannot be asked).
const char* pseudo_fs_of(const std::string& path);

// "character device", "block device", "FIFO" or "socket" for a mode a copy must never be
// renamed over; nullptr for regular files, directories and symlinks.
const char* special_file_kind(mode_t mode);

// The user database's name for uid (getpwuid_r), or "" when it has none.
std::string user_name(uid_t uid);
// A user as messages name them: "uid 1001 (bob)", or "uid 1001" when it has no name.
std::string owner_text(uid_t uid);

}  // namespace stage
