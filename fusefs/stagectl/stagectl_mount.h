// stagectl's view of a mount: which stagefs mount a path lies in, and the attribute reads
// that are stagectl's channel into it (fusefs/core/stagectl_channel.h is the daemon's side).
//
// Paths are taken as every command takes them: relative to the current directory, or
// absolute. The mount is found from the path itself, as df finds a filesystem: the topmost
// directory above it on the same device (st_dev; symlinks above the path are followed, the
// path's own last component is not), whose user.stagefs.status attribute then says whether a
// stagefs serves there. So `stagectl prefetch /stage/imgs` and, from /stage,
// `stagectl prefetch imgs` both work.
// The older form `stagectl CMD MOUNTPOINT PATH...` still works: when the first of several
// arguments is the root of a stagefs mount it only names the mount, and each relative PATH
// is taken relative to the current directory when that exists inside the mount, else relative
// to MOUNTPOINT (as it always was); when both exist and are different files the command
// refuses the path as ambiguous (usage, exit 2) and says which two it could mean.
// Used by one thread (stagectl's main) except get_attr, which is thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace stagefs::ctl {

// A name as the text output shows it (controls escaped).
std::string shown(const std::string& name);

// The attribute's value, or an errno.
int get_attr(const std::string& path, const char* name, std::string& out);

// JSON for the output: ASCII only (every control character and every non-ASCII character
// as \uXXXX, so that nothing in it acts on a terminal), bytes that are not UTF-8 as U+FFFD.
std::string dump(const nlohmann::json& j);

// The mount's user.stagefs.status as JSON; 1 (with a message on stderr) if mnt is not a
// running stagefs mount.
int read_status(const std::string& mnt, nlohmann::json& out);

// The mount point of the filesystem that holds path (see above), or nullopt with the reason
// in *why.
std::optional<std::string> mount_root(const std::string& path, std::string* why);

struct Target {
  std::string mount;  // the mount point the path lies in
  std::string path;   // the path to use: absolute, as the user wrote it (not canonical)
};
struct Targets {
  std::vector<Target> targets;
  int status = 0;  // 0, or the exit status after a message on stderr (1: not in a mount, 2: ambiguous)
};
// The command's PATH arguments (or MOUNTPOINT PATH...) as targets, each with its mount.
Targets resolve_targets(const std::vector<std::string>& args);

}  // namespace stagefs::ctl
