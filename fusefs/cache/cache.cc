#include "fusefs/cache/cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "bcast/io/manifest.h"
#include "bcast/io/paths.h"
#include "bcast/io/source.h"
#include "bcast/io/store.h"
#include "bcast/text/text.h"
#include "fusefs/base/beneath.h"
#include "fusefs/base/log.h"
#include "fusefs/cache/copy_xattrs.h"

namespace stagefs {

using stage::Error;
using stage::Fd;
using stage::Result;

namespace {

Error refuse(const std::string& path, const std::string& why, const std::string& fix) {
  return stage::sys_error(EPERM, "--cache " + path + ": " + why + "; " + fix);
}

std::vector<std::string> components(const std::string& abs) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < abs.size()) {
    const size_t j = abs.find('/', i);
    const std::string c = abs.substr(i, j == std::string::npos ? std::string::npos : j - i);
    if (!c.empty() && c != ".") {
      if (c == ".." && !out.empty())
        out.pop_back();
      else if (c != "..")
        out.push_back(c);
    }
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

// What a refusal suggests when the cache cannot be created or entered as the daemon's user.
constexpr const char* kOwnCacheFix =
    "give --cache a directory of your own: on a cluster, the stagefs prolog prepares one per user "
    "on each node (stagefs run uses it; see the admin guide), or choose one below a directory you own";

// "owned by uid 1001 (bob), mode 0700"
std::string described(const struct stat& st) {
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777U);
  return "owned by " + stage::owner_text(st.st_uid) + ", mode " + mode;
}

bool others_may_write(const struct stat& st) {
  return (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
}

// The names in directory dirfd (not "." and ".."), read through a descriptor of its own.
std::vector<std::string> names_in(int dirfd) {
  std::vector<std::string> names;
  const int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return names;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return names;
  }
  while (const dirent* de = ::readdir(d))
    if (std::strcmp(de->d_name, ".") != 0 && std::strcmp(de->d_name, "..") != 0)
      names.emplace_back(de->d_name);
  ::closedir(d);
  return names;
}

// Removes name (any type) in dirfd, recursively, without following symlinks.
void remove_tree(int dirfd, const char* name) {
  struct stat st {};
  if (::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    const int fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      for (const auto& n : names_in(fd)) remove_tree(fd, n.c_str());
      ::close(fd);
    }
    ::unlinkat(dirfd, name, AT_REMOVEDIR);
  } else {
    ::unlinkat(dirfd, name, 0);
  }
}

// Who holds the cache: note_holder() writes one line into CACHE/.lock once the lock is taken
// ("pid 123 on n1, Slurm job 45"); it also marks when the cache was last used (the file's
// mtime), which the admin kit's epilog reads. lock_holder() is that line for a refusal.
void note_holder(int fd) {
  std::string line = "pid " + std::to_string(::getpid()) + " on " + stage::host_name();
  if (const char* job = std::getenv("SLURM_JOB_ID"); job != nullptr && *job != '\0')
    line += std::string(", Slurm job ") + job;
  line += "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) < 0)
    spdlog::debug("cache: could not note this daemon in the lock file: {}", std::strerror(errno));
}

std::string lock_holder(int fd) {
  char buf[160];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return {};
  std::string_view line(buf, static_cast<size_t>(n));
  line = line.substr(0, line.find('\n'));
  return line.empty() ? std::string() : " (" + stage::escape_controls(line) + ")";
}

// One walk of CACHE/data: see the header.
void sweep(int dirfd, SweepCounts& n) {
  const uid_t me = ::geteuid();
  for (const auto& name : names_in(dirfd)) {
    struct stat st {};
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const bool trusted =
        st.st_uid == me && (S_ISDIR(st.st_mode) || (S_ISREG(st.st_mode) && st.st_nlink == 1));
    if (!trusted) {
      log_warn("cache: removing {} (type {:o}, owner {}): not written by this daemon's user", name,
               st.st_mode & S_IFMT, st.st_uid);
      remove_tree(dirfd, name.c_str());
      ++n.untrusted;
      continue;
    }
    if (S_ISREG(st.st_mode)) {
      if (stage::is_temp_name(name) && ::unlinkat(dirfd, name.c_str(), 0) == 0) ++n.temps;
      continue;
    }
    if ((st.st_mode & 077) != 0) ::fchmodat(dirfd, name.c_str(), 0700, 0);
    const int sub = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) continue;
    sweep(sub, n);
    ::close(sub);
  }
}

}  // namespace

Result<Fd> open_private_dir(const std::string& path) {
  if (path.empty() || path[0] != '/')
    return stage::sys_error(EINVAL, "--cache must be an absolute path", path);
  const auto parts = components(path);
  const uid_t me = ::geteuid();
  const std::string self = stage::owner_text(me);
  Fd cur(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!cur.valid()) return stage::sys_error(errno, "open /");
  std::string at = "/";
  struct stat at_st {};  // the directory we are in
  if (::fstat(cur.get(), &at_st) != 0) return stage::sys_error(errno, "stat /");
  bool parent_shared = false;  // the directory we are in lets others create entries (sticky)
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    const std::string& name = parts[i];
    const std::string here = (at == "/" ? "" : at) + "/" + name;
    struct stat lst {};
    if (::fstatat(cur.get(), name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) return stage::sys_error(errno, "--cache: stat", here);
      if (::mkdirat(cur.get(), name.c_str(), 0700) != 0 && errno != EEXIST) {
        if (errno == EACCES || errno == EPERM)
          return refuse(
              path,
              "cannot create " + here + ": " + at + " (" + described(at_st) + ") is not writable by " + self,
              kOwnCacheFix);
        return stage::sys_error(errno, "--cache: create directory", here);
      }
      if (::fstatat(cur.get(), name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) != 0)
        return stage::sys_error(errno, "--cache: stat", here);
    }
    if (S_ISLNK(lst.st_mode)) {
      if (last)
        return refuse(here, "is a symlink",
                      "give the directory it points to (after checking who may change the link)");
      if (lst.st_uid != 0 || parent_shared)
        return refuse(path,
                      here + " is a symlink owned by " + stage::owner_text(lst.st_uid) +
                          (parent_shared ? " in a directory others may write to" : ""),
                      "use a path without it");
    }
    const int flags =
        (last ? O_RDONLY : O_PATH) | O_DIRECTORY | O_CLOEXEC | (S_ISLNK(lst.st_mode) ? 0 : O_NOFOLLOW);
    Fd next(::openat(cur.get(), name.c_str(), flags));
    if (!next.valid()) {
      if ((errno == EACCES || errno == EPERM) && !S_ISLNK(lst.st_mode) && lst.st_uid != me)
        return refuse(path, here + " (" + described(lst) + ") is another user's directory, closed to " + self,
                      kOwnCacheFix);
      return stage::sys_error(errno, "--cache: open", here);
    }
    struct stat st {};
    if (::fstat(next.get(), &st) != 0) return stage::sys_error(errno, "--cache: stat", here);
    if (!S_ISLNK(lst.st_mode) && (st.st_dev != lst.st_dev || st.st_ino != lst.st_ino))
      return refuse(here, "changed while it was checked", "try again");
    if (st.st_uid != 0 && st.st_uid != me)
      return refuse(path,
                    here + " is owned by " + stage::owner_text(st.st_uid) + ", not by root" +
                        (me == 0 ? "" : " or " + self),
                    "use a directory owned by root (or by the daemon's user) all the way down; " +
                        std::string(kOwnCacheFix));
    if (parent_shared && st.st_uid != me && st.st_uid != 0)
      return refuse(
          path,
          here + " lies in a directory others may write to and is not owned by the daemon's user or root",
          "create it as the daemon's user, or use another path");
    if (last) {
      if (st.st_uid != me)
        return refuse(
            path, "is owned by " + stage::owner_text(st.st_uid) + ", not by the daemon's user (" + self + ")",
            "give the daemon a directory of its own (it creates a missing one, mode 0700)");
    } else if (others_may_write(st) && (st.st_mode & S_ISVTX) == 0) {
      return refuse(path, here + " may be written by other users and is not sticky",
                    "use a path whose parents only root (or the daemon's user) can change");
    }
    parent_shared = others_may_write(st);
    cur = std::move(next);
    at = here;
    at_st = st;
  }
  if (parts.empty()) return refuse(path, "is /", "give a directory of its own");
  return cur;
}

// The engine's store for the mount: the real one, with the limit in its free space.
class NodeCache::LimitedStore final : public stage::LocalStore {
 public:
  LimitedStore(NodeCache& c, stage::LocalStore& base) : c_(c), base_(base) {}
  Result<stage::LocalState> inspect(const std::string& p) override { return base_.inspect(p); }
  Result<uint64_t> checksum(const std::string& p) override { return base_.checksum(p); }
  Result<std::optional<stage::CopyRecord>> chunk_record(const std::string& p) override {
    return base_.chunk_record(p);
  }
  // A copy that seeds a transfer: resolved beneath the cache's data directory, a regular file
  // this daemon wrote (owned by us, one link, as open_current() requires), pinned while the
  // engine holds it (never evicted mid-read; an evicted copy would still read through the
  // descriptor, but its room would count as free while it is not).
  Result<std::unique_ptr<stage::SourceFile>> open_copy(const std::string& p) override {
    auto rels = rels_in_cache(std::span(&p, 1));
    if (!rels) return stage::stage_error(stage::Errc::unsupported, "seed from a copy outside the cache", p);
    const std::string& rel = rels->front();
    auto fd = open_beneath(c_.data_.get(), rel, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | stage::kNoWaitOpen);
    if (!fd) return fd.error();
    struct stat st {};
    if (auto ok = stage::settle_regular(fd->get(), st, p); !ok) return ok.error();
    if (st.st_uid != c_.euid_ || st.st_nlink != 1)
      return stage::stage_error(stage::Errc::unsupported, "seed copy (not a copy this daemon wrote)", p);
    c_.pin(rel);
    return std::unique_ptr<stage::SourceFile>(new PinnedCopy(
        stage::posix_source_file(std::move(*fd), p, static_cast<uint64_t>(st.st_size)), c_, rel));
  }
  // A seed's copy that failed a read or read back wrong: removed (if it is still that file),
  // so that the next open chooses another seed or the source.
  void bad_copy(const std::string& p, const stage::FileMeta& seen) override {
    auto rels = rels_in_cache(std::span(&p, 1));
    if (!rels) return;
    log_warn("cache: {} could not feed a transfer (unreadable, or not the bytes it recorded): removed",
             rels->front());
    struct stat st {};
    st.st_dev = static_cast<dev_t>(seen.dev);
    st.st_ino = static_cast<ino_t>(seen.ino);
    c_.remove(rels->front(), st);
  }
  Result<uint64_t> free_bytes(const std::string& p) override {
    auto fs_free = base_.free_bytes(p);
    if (!fs_free) return fs_free;
    const CacheUsage u = c_.usage();
    const uint64_t room =
        u.limit == 0 ? *fs_free : std::min(*fs_free, u.limit > u.bytes ? u.limit - u.bytes : 0);
    const uint64_t overhead = c_.pending_overhead_.load();  // what the copies take beyond their data
    return room > overhead ? room - overhead : 0;
  }
  stage::Status sync_filesystem(const std::string& p) override { return base_.sync_filesystem(p); }
  Result<std::unique_ptr<stage::Txn>> begin(const std::string& p) override { return base_.begin(p); }
  stage::Status make_dir(const std::string& p, uint32_t mode) override { return base_.make_dir(p, mode); }
  stage::Status make_parents(const std::string& p) override { return base_.make_parents(p); }
  stage::Status make_symlink(const std::string& p, const std::string& t) override {
    return base_.make_symlink(p, t);
  }
  int remove_stale_temps(const std::string& d) override { return base_.remove_stale_temps(d); }
  // A group's names go into the unsynced log before their renames, and may be synced after.
  std::unique_ptr<stage::Publication> publication(const std::string& dir,
                                                  std::vector<std::string> paths) override {
    auto rels = rels_in_cache(paths);
    if (!rels)
      return LocalStore::publication(dir, std::move(paths));  // not names in this cache: sync them now
    return std::make_unique<UnsyncedPublication>(*c_.unsynced_, std::move(*rels));
  }

 private:
  class UnsyncedPublication final : public stage::Publication {
   public:
    UnsyncedPublication(UnsyncedLog& log, std::vector<std::string> rels)
        : log_(log), rels_(std::move(rels)) {}
    stage::Status data_durable() override { return log_.record(rels_); }
    void done() override { log_.published(rels_); }

   private:
    UnsyncedLog& log_;
    std::vector<std::string> rels_;
  };
  // A seed's copy, pinned in the index until the engine closes it.
  class PinnedCopy final : public stage::SourceFile {
   public:
    PinnedCopy(std::unique_ptr<stage::SourceFile> in, NodeCache& c, std::string rel)
        : in_(std::move(in)), c_(c), rel_(std::move(rel)) {}
    ~PinnedCopy() override { c_.unpin(rel_); }
    PinnedCopy(const PinnedCopy&) = delete;
    PinnedCopy& operator=(const PinnedCopy&) = delete;
    stage::Status read_at(uint64_t off, std::span<std::byte> buf) override { return in_->read_at(off, buf); }
    bool has_data(uint64_t off, uint64_t len) override { return in_->has_data(off, len); }
    Result<stage::FileMeta> stat_now() override { return in_->stat_now(); }
    Result<bool> data_past(uint64_t size) override { return in_->data_past(size); }

   private:
    std::unique_ptr<stage::SourceFile> in_;
    NodeCache& c_;
    std::string rel_;
  };
  // The engine's paths (under store_root()) as names relative to CACHE/data; none if any
  // path lies elsewhere.
  std::optional<std::vector<std::string>> rels_in_cache(std::span<const std::string> paths) const {
    const std::string root = c_.store_root() + "/";
    std::vector<std::string> rels;
    rels.reserve(paths.size());
    for (const auto& p : paths) {
      if (!p.starts_with(root)) return std::nullopt;
      rels.push_back(p.substr(root.size()));
    }
    return rels;
  }
  NodeCache& c_;
  stage::LocalStore& base_;
};

NodeCache::~NodeCache() = default;

// What a copy takes beyond its data: ext4 keeps an xattr that does not fit in the inode
// (128-byte inodes: no room) in a block of its own, counted in st_blocks: one more 4 KiB for a
// small file of 4 KiB. Measured once, on an unnamed file in the cache carrying an origin of
// the longest form; 4 KiB when it cannot be measured.
static uint64_t probe_copy_overhead(int data_fd) {
  constexpr uint64_t kGuess = 4096;
  Fd f(::openat(data_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!f.valid()) return kGuess;
  stage::FileMeta longest;
  longest.size = longest.ino = longest.dev = UINT64_MAX;
  longest.mtime_ns = longest.ctime_ns = INT64_MIN;
  const std::string origin = stage::encode_origin(longest, UINT64_MAX);
  if (::fsetxattr(f.get(), kCopyXattrs.origin.c_str(), origin.data(), origin.size(), 0) != 0)
    return errno == ENOTSUP ? 0 : kGuess;  // no xattrs here: the store records none either
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) return kGuess;
  return static_cast<uint64_t>(st.st_blocks) * 512U;
}

Result<std::unique_ptr<NodeCache>> NodeCache::open(const std::string& dir, stage::StoreOptions store_opt,
                                                   std::chrono::milliseconds sync_after) {
  auto root = open_private_dir(dir);
  if (!root) return root.error();
  auto c = std::unique_ptr<NodeCache>(new NodeCache());
  store_opt.xattrs = kCopyXattrs;  // the cache reads them back itself (origin_of_fd)
  c->base_ = std::make_unique<stage::PosixStore>(store_opt);
  c->store_ = std::make_unique<LimitedStore>(*c, *c->base_);
  c->dir_ = dir;
  c->root_ = std::move(root.value());
  struct stat st {};
  if (::fstat(c->root_.get(), &st) != 0) return stage::sys_error(errno, "stat cache", dir);
  if ((st.st_mode & 07777) != 0700 && ::fchmod(c->root_.get(), 0700) != 0)
    return stage::sys_error(errno, "chmod 0700 cache", dir);
  c->lock_ = Fd(::openat(c->root_.get(), ".lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!c->lock_.valid()) return stage::sys_error(errno, "create lock file in cache", dir);
  if (::flock(c->lock_.get(), LOCK_EX | LOCK_NB) != 0)
    return stage::sys_error(
        EBUSY, "cache " + dir + " is in use by another stagefs on this node" + lock_holder(c->lock_.get()));
  note_holder(c->lock_.get());
  // data: ours, a directory, not a symlink (replaced if it is one)
  struct stat dst {};
  if (::fstatat(c->root_.get(), "data", &dst, AT_SYMLINK_NOFOLLOW) == 0 &&
      (!S_ISDIR(dst.st_mode) || dst.st_uid != ::geteuid())) {
    log_warn("cache: removing {}/data (type {:o}, owner {}): not written by this daemon's user", dir,
             dst.st_mode & S_IFMT, dst.st_uid);
    remove_tree(c->root_.get(), "data");
    ++c->swept_.untrusted;
  }
  if (::mkdirat(c->root_.get(), "data", 0700) != 0 && errno != EEXIST)
    return stage::sys_error(errno, "create cache data directory", dir + "/data");
  c->data_ = Fd(::openat(c->root_.get(), "data", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!c->data_.valid()) return stage::sys_error(errno, "open cache data directory", dir + "/data");
  if (::fstat(c->data_.get(), &c->data_st_) != 0) return stage::sys_error(errno, "stat", dir + "/data");
  if (c->data_st_.st_uid != ::geteuid())
    return refuse(dir, "data is not owned by the daemon's user", "remove it");
  if ((c->data_st_.st_mode & 077) != 0) ::fchmod(c->data_.get(), 0700);
  sweep(c->data_.get(), c->swept_);  // first: afterwards data holds only our directories and files
  c->recovered_ = UnsyncedLog::recover(c->root_.get(), c->data_.get(), UnsyncedLog::current_boot_id());
  if (c->recovered_.unreadable) {
    // Which copies were synced is unknown: none is trusted.
    log_warn(
        "cache: {}/{} cannot be read: removing every cached copy (each is copied again at its next open)",
        dir, UnsyncedLog::kName);
    for (const auto& name : names_in(c->data_.get())) remove_tree(c->data_.get(), name.c_str());
    ::syncfs(c->data_.get());
    UnsyncedLog::discard(c->root_.get());
  }
  c->index_tree(c->data_.get(), "");
  c->copy_overhead_ = probe_copy_overhead(c->data_.get());
  NodeCache* self = c.get();
  c->unsynced_ = std::make_unique<UnsyncedLog>(c->root_.get(), c->data_.get(), sync_after,
                                               [self](const std::string& rel) { self->added(rel); });
  return c;
}

void NodeCache::index_tree(int dirfd, const std::string& prefix) {
  for (const auto& name : names_in(dirfd)) {
    struct stat st {};
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const std::string rel = prefix.empty() ? name : prefix + "/" + name;
    if (S_ISREG(st.st_mode)) {
      const uint64_t bytes = static_cast<uint64_t>(st.st_blocks) * 512;
      index_[rel] = Entry{.bytes = bytes, .last_use = stage::to_ns(st.st_atim), .origin = {}};
      bytes_ += bytes;
    } else if (S_ISDIR(st.st_mode)) {
      const int sub = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) continue;
      index_tree(sub, rel);
      ::close(sub);
    }
  }
}

CacheUsage NodeCache::usage() const {
  std::lock_guard lk(m_);
  CacheUsage u{bytes_,
               limit_,
               index_.size(),
               evictions_,
               evicted_bytes_,
               unsynced_ ? unsynced_->pending() : 0,
               unsynced_ ? unsynced_->synced() : 0};
  for (const auto& [name, n] : pins_)
    if (auto it = index_.find(name); it != index_.end()) {
      u.pinned_bytes += it->second.bytes;
      ++u.pinned_files;
    }
  return u;
}

void NodeCache::touch(const std::string& rel, int fd, const struct stat* copy_st) {
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  // The copy's atime carries the order across restarts (mtime is the source's: untouched).
  constexpr int64_t kAtimeGrain = int64_t{60} * 1000 * 1000 * 1000;
  const int64_t atime = copy_st != nullptr ? stage::to_ns(copy_st->st_atim) : 0;
  if (copy_st == nullptr || atime > stage::to_ns(now) || stage::to_ns(now) - atime >= kAtimeGrain) {
    const struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
    ::futimens(fd, times);
  }
  std::lock_guard lk(m_);
  if (auto it = index_.find(rel); it != index_.end()) it->second.last_use = stage::to_ns(now);
}

void NodeCache::added(const std::string& rel) {
  auto fd = open_beneath(data_.get(), rel, O_PATH);
  struct stat st {};
  const bool there = fd && ::fstat(fd->get(), &st) == 0 && S_ISREG(st.st_mode);
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  std::lock_guard lk(m_);
  index_put(rel, there ? &st : nullptr, stage::to_ns(now));
}

std::vector<struct stat> NodeCache::added_in(const std::string& rel_dir,
                                             const std::vector<std::string>& names) {
  std::vector<struct stat> found;
  found.reserve(names.size());
  auto dfd = open_beneath(data_.get(), rel_dir, O_PATH | O_DIRECTORY);
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  for (const auto& name : names) {
    const std::string rel = stage::join_path(rel_dir, name);
    if (name.find('/') != std::string::npos || name == "." || name == "..") {  // not a batch's name
      added(rel);
      continue;
    }
    struct stat st {};
    const bool there =
        dfd && ::fstatat(dfd->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
    {
      std::lock_guard lk(m_);
      index_put(rel, there ? &st : nullptr, stage::to_ns(now));
    }
    if (there) found.push_back(st);
  }
  return found;
}

void NodeCache::index_put(const std::string& rel, const struct stat* st, int64_t now_ns) {
  if (auto it = index_.find(rel); it != index_.end()) {
    bytes_ -= it->second.bytes;
    index_.erase(it);
  }
  if (st == nullptr) return;
  const uint64_t bytes = static_cast<uint64_t>(st->st_blocks) * 512;
  index_[rel] = Entry{.bytes = bytes, .last_use = now_ns, .origin = {}};
  bytes_ += bytes;
}

void NodeCache::pin(const std::string& rel) {
  std::lock_guard lk(m_);
  ++pins_[rel];
}

void NodeCache::unpin(const std::string& rel) {
  {
    std::lock_guard lk(m_);
    auto it = pins_.find(rel);
    if (it == pins_.end() || --it->second > 0) return;
    pins_.erase(it);
  }
  space_freed();
}

void NodeCache::set_space_listener(std::function<void()> fn) {
  std::lock_guard lk(m_);
  space_listener_ = std::move(fn);
}

void NodeCache::space_freed() {
  ++space_epoch_;
  std::function<void()> fn;
  {
    std::lock_guard lk(m_);
    fn = space_listener_;
  }
  if (fn) fn();
}

Room NodeCache::room(const std::string& rel, uint64_t need) const {
  const uint64_t fs = fs_free();
  std::lock_guard lk(m_);
  Room r;
  r.need = need;
  r.free = fs;
  if (limit_ != 0) r.free = std::min(r.free, limit_ > bytes_ ? limit_ - bytes_ : 0);
  for (const auto& [name, e] : index_) {
    if (name == rel) continue;
    if (pins_.contains(name)) {
      r.pinned += e.bytes;
      ++r.pinned_files;
    } else {
      r.evictable += e.bytes;
    }
  }
  return r;
}

uint64_t NodeCache::fs_free() const {
  struct statvfs sv {};
  if (::fstatvfs(data_.get(), &sv) != 0) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
}

stage::Status NodeCache::make_room(const std::string& rel, uint64_t need, bool may_evict) {
  std::unique_lock lk(m_);
  if (limit_ != 0 && need > limit_)
    return stage::sys_error(ENOSPC, rel + " needs " + std::to_string(need) +
                                        " bytes, more than the whole --cache-size (" +
                                        std::to_string(limit_) + " bytes)");
  for (;;) {
    const bool over_limit = limit_ != 0 && bytes_ + need > limit_;
    lk.unlock();
    const uint64_t free_now = fs_free();
    lk.lock();
    const bool no_space = free_now < need;
    if (!over_limit && !no_space) return {};
    if (!may_evict) {  // a filesystem without room is the engine's free-space check to report
      if (!over_limit) return {};
      return stage::sys_error(ENOSPC, rel + " needs " + std::to_string(need) + " bytes; the cache holds " +
                                          std::to_string(bytes_) + " of its " + std::to_string(limit_) +
                                          " bytes, and a background copy evicts nothing");
    }
    // Evict only when it can be enough: a copy that cannot fit anyway must not cost the
    // node the copies it has.
    uint64_t evictable = 0;
    for (const auto& [name, e] : index_)
      if (name != rel && !pins_.contains(name)) evictable += e.bytes;
    if (over_limit && bytes_ - evictable + need > limit_)
      return stage::sys_error(ENOSPC, rel + " needs " + std::to_string(need) + " bytes; the cache holds " +
                                          std::to_string(bytes_) + " of its " + std::to_string(limit_) +
                                          " bytes, " + std::to_string(bytes_ - evictable) +
                                          " of them in files open on this node (not evicted)");
    if (no_space && free_now + evictable < need) return {};  // the engine's free-space check reports it
    // Least recently used, not pinned, not the file about to be written.
    auto victim = index_.end();
    for (auto it = index_.begin(); it != index_.end(); ++it) {
      if (it->first == rel || pins_.contains(it->first)) continue;
      if (victim == index_.end() || it->second.last_use < victim->second.last_use) victim = it;
    }
    if (victim == index_.end()) return {};
    const std::string name = victim->first;
    const uint64_t bytes = victim->second.bytes;
    bytes_ -= bytes;
    index_.erase(victim);
    ++evictions_;
    evicted_bytes_ += bytes;
    lk.unlock();
    unlink_beneath(data_.get(), name);
    log_info("evicted {} ({} bytes, least recently used) to make room for {}", name, bytes, rel);
    lk.lock();
  }
}

stage::Status NodeCache::evict(const std::string& rel, const struct stat& source) {
  if (auto fd = open_beneath(data_.get(), rel, O_RDONLY | O_NOFOLLOW | O_NONBLOCK)) {
    const auto origin = stage::origin_of_fd(fd->get(), kCopyXattrs.origin);
    if (origin && (origin->source.dev != static_cast<uint64_t>(source.st_dev) ||
                   origin->source.ino != static_cast<uint64_t>(source.st_ino)))
      return stage::sys_error(EBUSY, "evict: the cached copy is of another file than the one checked", rel);
  }
  std::unique_lock lk(m_);
  if (pins_.contains(rel)) return stage::sys_error(EBUSY, "evict: the file is open on this node", rel);
  auto it = index_.find(rel);
  if (it == index_.end()) return stage::sys_error(ENOENT, "evict: not in the cache", rel);
  bytes_ -= it->second.bytes;
  ++evictions_;
  evicted_bytes_ += it->second.bytes;
  index_.erase(it);
  lk.unlock();
  unlink_beneath(data_.get(), rel);
  log_info("evicted {} (asked)", rel);
  space_freed();
  return {};
}

std::string NodeCache::store_root() const {
  return proc_fd_path(data_.get());
}

stage::Status NodeCache::alive() const {
  struct stat st {};
  if (::fstat(data_.get(), &st) != 0 || st.st_nlink == 0)
    return stage::sys_error(ENOENT,
                            "cache directory " + dir_ +
                                "/data was removed under the running mount: copies cannot be made until "
                                "the mount is restarted (cached files still open keep working)");
  return {};
}

Result<Fd> NodeCache::open_current(const std::string& rel, const struct stat& src,
                                   struct stat* copy_st) const {
  auto fd = open_beneath(data_.get(), rel, O_RDONLY);
  if (!fd) return fd.error();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return stage::sys_error(errno, "stat cached copy", rel);
  if (!S_ISREG(st.st_mode) || st.st_uid != euid_ || st.st_nlink != 1)
    return stage::stage_error(stage::Errc::source_changed, "cached copy was not written by this daemon", rel);
  std::optional<stage::Origin> origin;
  const auto dev = static_cast<uint64_t>(st.st_dev), ino = static_cast<uint64_t>(st.st_ino);
  const int64_t ctime = stage::to_ns(st.st_ctim);
  {
    std::lock_guard lk(m_);
    if (auto it = index_.find(rel); it != index_.end() && it->second.origin && it->second.origin_dev == dev &&
                                    it->second.origin_ino == ino && it->second.origin_ctime_ns == ctime)
      origin = it->second.origin;
  }
  if (!origin) {
    origin = stage::origin_of_fd(fd->get(), kCopyXattrs.origin);
    ++origin_reads_;
    std::lock_guard lk(m_);
    if (auto it = index_.find(rel); origin && it != index_.end()) {
      it->second.origin = origin;
      it->second.origin_dev = dev;
      it->second.origin_ino = ino;
      it->second.origin_ctime_ns = ctime;
    }
  }
  const stage::FileMeta meta = stage::meta_from_stat(src);
  const int64_t mtime = stage::to_ns(st.st_mtim);
  if (static_cast<uint64_t>(st.st_size) != static_cast<uint64_t>(src.st_size) || !origin ||
      !stage::origin_matches(*origin, mtime, meta, rule_)) {
    if (origin && stage::origin_matches(*origin, mtime, meta, stage::SourceVersion::no_inode) &&
        !told_inode_only_.exchange(true))
      spdlog::warn(
          "{}: the cached copy of {} records the source's size, mtime and ctime but inode {} (the "
          "source's is now {}): it is copied again. If the source's inode numbers are not stable "
          "across mounts or nodes (a FUSE filesystem without use_ino, an object-store mount), "
          "--source-version no-inode keeps such copies (see the admin guide); said once per mount",
          stage::host_name(), rel, origin->source.ino, meta.ino);
    return stage::stage_error(stage::Errc::source_changed, "cached copy is not current", rel);
  }
  if (copy_st != nullptr) *copy_st = st;
  return std::move(fd.value());
}

NodeCache::Look NodeCache::look_or_remove(const std::string& rel, const struct stat& src) {
  auto fd = open_current(rel, src);
  if (fd) return Look::current;
  if (fd.error().code == std::errc::no_such_file_or_directory) return Look::absent;  // nothing to remove
  if (!unlink_beneath(data_.get(), rel)) return Look::kept;
  added(rel);  // drops it from the index
  return Look::removed;
}

bool NodeCache::keep_current(const std::string& rel, const struct stat& src) {
  return look_or_remove(rel, src) == Look::current;
}

bool NodeCache::has_dir(const std::string& rel_dir) const {
  return static_cast<bool>(open_beneath(data_.get(), rel_dir, O_PATH | O_DIRECTORY));
}

bool NodeCache::remove_stale(const std::string& rel, const struct stat& src) {
  return look_or_remove(rel, src) == Look::removed;
}

void NodeCache::remove(const std::string& rel, const struct stat& copy) {
  if (auto fd = open_beneath(data_.get(), rel, O_PATH | O_NOFOLLOW)) {
    struct stat now {};
    if (::fstat(fd->get(), &now) != 0 || now.st_dev != copy.st_dev || now.st_ino != copy.st_ino) return;
  }
  unlink_beneath(data_.get(), rel);
  added(rel);  // drops it from the index
  space_freed();
}

}  // namespace stagefs
