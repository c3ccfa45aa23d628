// The daemon's configuration checks (daemon.h): the paths, the source and the mount point,
// before anything is mounted; and `stagefs --wait`.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "bcast/io/paths.h"
#include "fusefs/edge/daemon.h"
#include "fusefs/edge/status.h"

namespace stagefs {

namespace fs = std::filesystem;

namespace {

bool inside(const std::string& child, const std::string& parent) {
  return child == parent || (child.size() > parent.size() && child.compare(0, parent.size(), parent) == 0 &&
                             (parent.back() == '/' || child[parent.size()] == '/'));
}

std::string absolute(const std::string& p) {
  std::error_code ec;
  auto a = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal().string() : a.string();
}

}  // namespace

std::string check_paths(DaemonConfig& cfg) {
  if (cfg.source_dir.empty() || cfg.mountpoint.empty() || cfg.cache_dir.empty())
    return "SOURCE_DIR, MOUNTPOINT and --cache are required";
  const std::string given_src = cfg.source_dir;
  const std::string given_mnt = cfg.mountpoint;
  const std::string given_cache = cfg.cache_dir;
  cfg.source_dir = absolute(cfg.source_dir);
  cfg.mountpoint = absolute(cfg.mountpoint);
  cfg.cache_dir = absolute(cfg.cache_dir);
  // Both paths as given and as resolved (symlinks of their existing prefixes followed).
  auto both = [](const char* what, const std::string& given, const std::string& abs) {
    return std::string(what) + " " + given + (given == abs ? std::string() : " (" + abs + ")");
  };
  const std::string src = both("SOURCE_DIR", given_src, cfg.source_dir);
  const std::string mnt = both("MOUNTPOINT", given_mnt, cfg.mountpoint);
  const std::string cache = both("--cache", given_cache, cfg.cache_dir);
  if (cfg.source_dir == cfg.mountpoint) return src + " and " + mnt + " are the same directory";
  if (inside(cfg.mountpoint, cfg.source_dir))
    return mnt + " lies inside " + src + ": the mount would hide part of its own source";
  if (inside(cfg.cache_dir, cfg.mountpoint))
    return cache + " lies inside " + mnt + ": the copies would be hidden under the mount";
  if (inside(cfg.cache_dir, cfg.source_dir))
    return cache + " lies inside " + src + ": the copies would show up in the source they mirror";
  if (inside(cfg.source_dir, cfg.cache_dir))
    return src + " lies inside " + cache + ": the cache would write into the source it mirrors";
  if (inside(cfg.mountpoint, cfg.cache_dir))
    return mnt + " lies inside " + cache + ": the cache would be written through its own read-only mount";
  if (const char* fs = stage::pseudo_fs_of(cfg.source_dir))
    return src + " is on " + fs + ", a pseudo filesystem whose file sizes do not describe their contents";
  return {};
}

std::string check_source_and_mount(const DaemonConfig& cfg) {
  struct stat st {};
  if (::stat(cfg.source_dir.c_str(), &st) != 0)
    return "SOURCE_DIR " + cfg.source_dir + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "SOURCE_DIR " + cfg.source_dir + " is not a directory";
  if (cfg.stall_timeout <= 0) return "--stall-timeout must be positive";
  return check_mountpoint(cfg.mountpoint);
}

int wait_ready(const std::string& mountpoint, double timeout_s) {
  const std::string why = wait_until_ready(mountpoint, timeout_s);
  if (why.empty()) return 0;
  std::fprintf(stderr, "stagefs --wait: %s is not ready (%s)\n", mountpoint.c_str(), why.c_str());
  return 1;
}

}  // namespace stagefs
