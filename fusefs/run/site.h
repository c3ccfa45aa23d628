// The site's settings for `stagefs run`: /etc/stagefs/stagefs.conf, installed by the packages
// with the admin kit (packaging/admin/), whose Slurm prolog and epilog read the same file.
//
// The model they describe: a job's daemons run as the job's user. Each job mounts on a
// directory of its own (STAGEFS_MOUNT, default /stage/%j), and each user has a cache of their
// own on every node (STAGEFS_CACHE, default /nvme/stagefs/%u), which that user's later jobs
// reuse; the prolog creates both, owned by the user, mode 0700, under directories only root
// may change, so no user can read, plant or block another's. A second job of the same user
// on the same node at the same time takes a spare cache below the first (--spare-caches).
//
// The file is KEY=VALUE lines a shell can source: '#' starts a comment line, a value may be
// quoted ('...' or "..."), nothing is expanded. Keys this side does not use (the epilog's)
// are accepted; unknown ones are reported (a typo) and ignored. Patterns: %j the job id,
// %u the user name, %U the uid, %% a percent sign.
// Pure functions, but load_site_config() (reads the file); thread-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "bcast/io/error.h"

namespace stagefs::run {

inline constexpr const char* kSiteConfigPath = "/etc/stagefs/stagefs.conf";
// The environment variable that names another file (tests; a user who wants other defaults).
inline constexpr const char* kSiteConfigEnv = "STAGEFS_CONF";

struct SiteConfig {
  std::string mount = "/stage/%j";         // STAGEFS_MOUNT: the job's mount point
  std::string cache = "/nvme/stagefs/%u";  // STAGEFS_CACHE: the user's cache on each node
  std::string cache_size = "50%";          // STAGEFS_CACHE_SIZE: --cache-size of each mount
  std::string spare_caches = "4";          // STAGEFS_SPARE_CACHES: --spare-caches
  std::vector<std::string> warnings;       // lines that were ignored, and why
};

// The settings in text (from `origin`, for messages), over the defaults. An error names the
// line that cannot be read.
stage::Result<SiteConfig> parse_site_config(std::string_view text, const std::string& origin);
// The file at path; a missing file gives the defaults.
stage::Result<SiteConfig> load_site_config(const std::string& path);

// What a pattern's %-codes stand for.
struct PatternValues {
  std::string job_id;
  std::string user;
  uid_t uid = 0;
};
// pattern with its codes replaced; an error for an unknown code or a value that would make a
// path other than one directory name (empty, "/", "." or "..").
stage::Result<std::string> expand_pattern(std::string_view pattern, const PatternValues& v);

}  // namespace stagefs::run
