#include "fusefs/core.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "bcast/source.h"
#include "bcast/store.h"
#include "fusefs/beneath.h"

namespace stagefs {

using stage::Error;
using stage::Result;

namespace {
constexpr const char* kControlPrefix = "user.stagefs.";

std::string proc_path(int fd) {
  return "/proc/self/fd/" + std::to_string(fd);
}
}  // namespace

Error StageFsCore::read_only(const char* op) {
  return stage::sys_error(EROFS, op, "(read-only mount)");
}

Result<std::unique_ptr<StageFsCore>> StageFsCore::create(CoreConfig cfg, Materializer& mat) {
  stage::Fd root(::open(cfg.source_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return stage::sys_error(errno, "open SOURCE_DIR", cfg.source_dir);
  auto core = std::unique_ptr<StageFsCore>(new StageFsCore(std::move(cfg), mat, std::move(root)));
  core->nodes_[kRootId] = Node{"", 1};
  core->ids_[""] = kRootId;
  return core;
}

size_t StageFsCore::node_count() const {
  std::lock_guard lk(m_);
  return nodes_.size();
}

Result<std::string> StageFsCore::path_of(uint64_t id) const {
  std::lock_guard lk(m_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return stage::sys_error(ESTALE, "unknown node id");
  return it->second.rel;
}

Result<struct stat> StageFsCore::stat_rel(const std::string& rel) const {
  auto fd = open_beneath(root_.get(), rel, O_PATH);
  if (!fd) return fd.error();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return stage::sys_error(errno, "stat source", rel);
  return st;
}

Result<std::pair<uint64_t, struct stat>> StageFsCore::lookup(uint64_t parent, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || name.size() > 255)
    return stage::sys_error(name.size() > 255 ? ENAMETOOLONG : ENOENT, "lookup", name);
  auto prel = path_of(parent);
  if (!prel) return prel.error();
  const std::string rel = stage::join_path(*prel, name);
  auto st = stat_rel(rel);
  if (!st) return st.error();
  std::lock_guard lk(m_);
  auto [it, fresh] = ids_.try_emplace(rel, next_id_);
  if (fresh) nodes_[next_id_++] = Node{rel, 0};
  ++nodes_[it->second].nlookup;
  return std::pair{it->second, *st};
}

void StageFsCore::forget(uint64_t id, uint64_t n) {
  if (id == kRootId) return;
  std::lock_guard lk(m_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  it->second.nlookup = it->second.nlookup > n ? it->second.nlookup - n : 0;
  if (it->second.nlookup == 0) {
    ids_.erase(it->second.rel);
    nodes_.erase(it);
  }
}

Result<struct stat> StageFsCore::getattr(uint64_t id) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  return stat_rel(*rel);
}

Result<std::string> StageFsCore::readlink(uint64_t id) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto fd = open_beneath(root_.get(), *rel, O_PATH);
  if (!fd) return fd.error();
  std::string buf(4096, '\0');
  const ssize_t n = ::readlinkat(fd->get(), "", buf.data(), buf.size());
  if (n < 0) return stage::sys_error(errno, "readlink", *rel);
  buf.resize(static_cast<size_t>(n));
  return buf;
}

Result<std::vector<DirEntry>> StageFsCore::readdir(uint64_t id) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto fd = open_beneath(root_.get(), *rel, O_RDONLY | O_DIRECTORY);
  if (!fd) return fd.error();
  DIR* d = ::fdopendir(fd->get());
  if (d == nullptr) return stage::sys_error(errno, "opendir", *rel);
  fd->release();  // now owned by d
  std::vector<DirEntry> out;
  errno = 0;
  while (const dirent* de = ::readdir(d)) {
    uint32_t mode = 0;
    switch (de->d_type) {
      case DT_DIR:
        mode = S_IFDIR;
        break;
      case DT_LNK:
        mode = S_IFLNK;
        break;
      case DT_REG:
        mode = S_IFREG;
        break;
      case DT_FIFO:
        mode = S_IFIFO;
        break;
      case DT_SOCK:
        mode = S_IFSOCK;
        break;
      case DT_CHR:
        mode = S_IFCHR;
        break;
      case DT_BLK:
        mode = S_IFBLK;
        break;
      default:
        mode = 0;
    }
    out.push_back(DirEntry{de->d_name, de->d_ino != 0 ? de->d_ino : 1, mode});
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return stage::sys_error(err, "readdir", *rel);
  return out;
}

Result<struct statvfs> StageFsCore::statfs() {
  struct statvfs sv {};
  if (::fstatvfs(root_.get(), &sv) != 0) return stage::sys_error(errno, "statfs", cfg_.source_dir);
  return sv;
}

// Runs an xattr call on the source node behind id. Its /proc/self/fd/N link (of an O_PATH fd
// resolved beneath SOURCE_DIR) is followed by getxattr/listxattr to the file itself.
template <class F>
static Result<std::string> xattr_call(int root, const std::string& rel, const char* what, F&& call) {
  auto fd = open_beneath(root, rel, O_PATH);
  if (!fd) return fd.error();
  const std::string p = proc_path(fd->get());
  std::string buf(65536, '\0');
  const ssize_t n = call(p.c_str(), buf.data(), buf.size());
  if (n < 0) return stage::sys_error(errno, what, rel);
  buf.resize(static_cast<size_t>(n));
  return buf;
}

Result<std::string> StageFsCore::getxattr(uint64_t id, const std::string& name) {
  if (id == kRootId && name.rfind(kControlPrefix, 0) == 0 && control_xattr_) {
    if (auto v = control_xattr_(name)) return *v;
  }
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto r = xattr_call(root_.get(), *rel, "getxattr",
                      [&](const char* p, char* b, size_t n) { return ::getxattr(p, name.c_str(), b, n); });
  if (!r && (r.error().to_errno() == ENODATA || r.error().to_errno() == ENOTSUP))
    return stage::Error{std::error_code(ENODATA, std::generic_category()), ""};  // expected: not logged
  return r;
}

Result<std::string> StageFsCore::listxattr(uint64_t id) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto r = xattr_call(root_.get(), *rel, "listxattr",
                      [](const char* p, char* b, size_t n) { return ::listxattr(p, b, n); });
  if (!r && r.error().to_errno() == ENOTSUP) return std::string();
  return r;
}

Result<stage::Fd> StageFsCore::open_cached(const std::string& rel, const struct stat& src) const {
  const std::string path = stage::join_path(cfg_.cache_dir, rel);
  stage::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return stage::sys_error(errno, "open cached copy", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return stage::sys_error(errno, "stat cached copy", path);
  const auto origin = stage::origin_of_fd(fd.get());
  const int64_t mtime = stage::to_ns(st.st_mtim);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != static_cast<uint64_t>(src.st_size) ||
      !origin || !stage::origin_matches(*origin, mtime, stage::meta_from_stat(src)))
    return stage::stage_error(stage::Errc::source_changed, "cached copy is not current", path);
  return fd;
}

Result<OpenFile> StageFsCore::open(uint64_t id, int flags) {
  ++counters_.opens;
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_TRUNC | O_APPEND | O_CREAT)) != 0)
    return read_only("open for writing");
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto st = stat_rel(*rel);
  if (!st) return st.error();
  if (!S_ISREG(st->st_mode)) return stage::stage_error(stage::Errc::unsupported, "open", *rel);
  if (auto fd = open_cached(*rel, *st)) {
    ++counters_.cache_hits;
    return OpenFile{std::move(fd.value()), true, false};
  }
  ++counters_.materializations;
  auto done = mat_.materialize(*rel);
  if (auto fd = open_cached(*rel, *st)) return OpenFile{std::move(fd.value()), false, false};
  const bool stalled = !done && (done.error().code == stage::make_error_code(stage::Errc::timed_out) ||
                                 done.error().code == stage::make_error_code(stage::Errc::group_broken));
  if (stalled && cfg_.on_stall == StallPolicy::source) {
    auto fd = open_beneath(root_.get(), *rel, O_RDONLY);
    if (fd) {
      ++counters_.source_fallbacks;
      spdlog::warn("{}: mount group stalled: reading {} from the shared source", stage::host_name(), *rel);
      return OpenFile{std::move(fd.value()), false, true};
    }
  }
  ++counters_.open_errors;
  if (!done) return done.error();
  return stage::stage_error(stage::Errc::checksum_mismatch, "no valid copy after materializing", *rel);
}

}  // namespace stagefs
