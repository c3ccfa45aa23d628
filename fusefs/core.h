// StageFsCore: the whole filesystem with neither a mount nor MPI. The FUSE edge (fuse_ops.cc)
// unpacks a request, calls one method here and replies; tests call the methods directly.
//
// A read-only mirror of SOURCE_DIR. Node ids are our own (1 = root), mapped to paths relative
// to SOURCE_DIR; every access resolves beneath SOURCE_DIR's fd (beneath.h). stat data
// (st_ino included) is the source's. open() of a regular file returns a descriptor of the
// node's local copy in the cache: served at once when the cache holds a copy whose recorded
// origin (size, mtime, ctime, inode) matches the source now, otherwise after the
// Materializer (the mount group) has made one. Every method is thread-safe (one mutex over
// the node table; no lock is held while waiting for a materialization). Errors are
// stage::Error; the edge maps them with Error::to_errno().
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "bcast/fd.h"
#include "bcast/manifest.h"

namespace stagefs {

class Materializer {
 public:
  virtual ~Materializer() = default;
  // Blocks until a transfer of rel finished on this node (or failed).
  virtual stage::Status materialize(const std::string& rel) = 0;
};

enum class StallPolicy { eio, source };

struct CoreConfig {
  std::string source_dir;
  std::string cache_dir;  // where copies live: cache_dir/<path relative to SOURCE_DIR>
  StallPolicy on_stall = StallPolicy::eio;
};

struct OpenFile {
  stage::Fd fd;
  bool cache_hit = false;    // served from a copy that was already there
  bool from_source = false;  // stall fallback: reads go to the shared source
};

struct DirEntry {
  std::string name;
  uint64_t ino = 0;  // the source's inode number (never 0)
  uint32_t mode = 0;
};

struct CoreCounters {
  std::atomic<uint64_t> opens{0}, cache_hits{0}, materializations{0}, source_fallbacks{0}, open_errors{0};
};

class StageFsCore {
 public:
  static constexpr uint64_t kRootId = 1;
  static stage::Result<std::unique_ptr<StageFsCore>> create(CoreConfig cfg, Materializer& mat);

  // lookup() counts one reference to the node; forget() drops n of them.
  stage::Result<std::pair<uint64_t, struct stat>> lookup(uint64_t parent, const std::string& name);
  void forget(uint64_t id, uint64_t n);
  stage::Result<struct stat> getattr(uint64_t id);
  stage::Result<std::string> readlink(uint64_t id);
  stage::Result<std::vector<DirEntry>> readdir(uint64_t id);
  stage::Result<struct statvfs> statfs();
  stage::Result<std::string> getxattr(uint64_t id, const std::string& name);
  stage::Result<std::string> listxattr(uint64_t id);  // names, each NUL-terminated
  stage::Result<OpenFile> open(uint64_t id, int flags);
  // Any change to the tree: always EROFS.
  static stage::Error read_only(const char* op);

  // Synthetic attributes on the root ("user.stagefs.*"), answered by the daemon.
  void set_control_xattr(std::function<std::optional<std::string>(const std::string&)> fn) {
    control_xattr_ = std::move(fn);
  }
  [[nodiscard]] int root_fd() const { return root_.get(); }
  [[nodiscard]] const CoreCounters& counters() const { return counters_; }
  [[nodiscard]] size_t node_count() const;
  stage::Result<std::string> path_of(uint64_t id) const;

 private:
  StageFsCore(CoreConfig cfg, Materializer& mat, stage::Fd root)
      : cfg_(std::move(cfg)), mat_(mat), root_(std::move(root)) {}
  stage::Result<struct stat> stat_rel(const std::string& rel) const;
  stage::Result<stage::Fd> open_cached(const std::string& rel, const struct stat& src) const;

  struct Node {
    std::string rel;
    uint64_t nlookup = 0;
  };
  CoreConfig cfg_;
  Materializer& mat_;
  stage::Fd root_;
  mutable std::mutex m_;  // guards nodes_, ids_, next_id_
  std::unordered_map<uint64_t, Node> nodes_;
  std::unordered_map<std::string, uint64_t> ids_;
  uint64_t next_id_ = kRootId + 1;
  CoreCounters counters_;
  std::function<std::optional<std::string>(const std::string&)> control_xattr_;
};

}  // namespace stagefs
