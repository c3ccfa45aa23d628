// Where a mount's profile lives (format.h), and how it is written and read.
//
// By default under the home of the daemon's user, where the next job finds it from any node:
// $XDG_CACHE_HOME/stagefs/profiles/, else $HOME/.cache/stagefs/profiles/ (HOME from the
// environment, else the user's passwd entry), as NAME-HASH.profile: NAME the source
// directory's last component (for people), HASH 16 hex digits of the CRC-64 of its absolute
// path (so two sources never share a profile). --profile PATH names another file.
//
// write_profile() publishes atomically: a temporary file beside PATH (a new name, O_EXCL, mode
// 0600, never through a symlink), written, fsynced, renamed over PATH, the directory fsynced:
// a reader finds the old profile or the new one, never half of one. Missing directories are
// made (0700).
// read_profile() trusts nothing it finds: PATH must be a regular file (a symlink is not
// followed), at most kMaxProfileBytes, writable by its owner only, and owned by the user the
// caller names (a daemon that is not root: its own user; root: any user, whose access the
// replay then has); then decode_profile() checks its bytes. Stateless; thread-safe.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "fusefs/profile/format.h"

namespace stagefs {

// The default profile of source_dir (absolute) for this process's user; "" when no home can
// be found.
std::string default_profile_path(const std::string& source_dir);

stage::Status write_profile(const std::string& path, const Profile& p);

struct LoadedProfile {
  Profile profile;
  uid_t owner = 0;  // the file's owner: whose access a root daemon's replay has
};
// owner: the only owner accepted (nullopt: any). ENOENT (Errc via errno) when there is none.
stage::Result<LoadedProfile> read_profile(const std::string& path, std::optional<uid_t> owner);

// stage-bcast --profile: the profile's files, in order, as paths relative to `source` (an
// absolute, resolved directory): as recorded when the profile was made for `source`; with the
// source's path stripped when `source` lies inside the profile's source directory (the others
// left out). Pure.
std::vector<std::string> profile_paths_under(const Profile& p, const std::string& source);

}  // namespace stagefs
