#include "fusefs/core.h"

#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <future>

#include "bcast/io/fd.h"
#include "bcast/io/source.h"
#include "bcast/io/store.h"
#include "fusefs/beneath.h"
#include "fusefs/cache/cache.h"
#include "fusefs/cache/rules.h"
#include "fusefs/live.h"
#include "fusefs/log.h"

namespace stagefs {

using stage::Error;
using stage::Result;

namespace {
constexpr const char* kControlPrefix = "user.stagefs.";
constexpr const char* kSelinuxXattr = "security.selinux";

bool is_hidden_xattr(std::string_view name, const Caller& who) {
  return who.uid != 0 && name.rfind("trusted.", 0) == 0;
}
}  // namespace

stage::Status Materializer::materialize(const std::string& rel, const Want& want) {
  auto p = std::make_shared<std::promise<stage::Status>>();
  auto f = p->get_future();
  materialize_async(rel, want, [p](stage::Status st) { p->set_value(std::move(st)); });
  return f.get();
}

StageFsCore::StageFsCore(CoreConfig cfg, NodeCache& cache, Materializer& mat, CopyReader& reader,
                         stage::Fd root)
    : cfg_(std::move(cfg)),
      cache_(cache),
      mat_(mat),
      root_(std::move(root)),
      budget_(std::make_shared<UserBytes>(cfg_.listing_bytes_per_user)),
      nodes_(budget_),
      access_(AccessCheck::probe(root_.get())),
      handles_(cfg_.handles) {
  for (int i = 0; i < std::max(1, cfg_.completion_threads); ++i)
    pool_.emplace_back([this] { completion_loop(); });
  checker_ = std::make_unique<CopyChecker>(cache_, CopyChecker::Config{cfg_.verify, cfg_.verify_threads},
                                           counters_, reader);
  room_waits_ = std::make_unique<RoomWaits>(cache_, cfg_.space_wait, counters_.room_waits);
}

StageFsCore::~StageFsCore() {
  stop();
}

void StageFsCore::stop() {
  checker_->stop();
  // Opens waiting for room: ESHUTDOWN (before the pool stops: a retry in flight still runs).
  room_waits_->stop();
  {
    std::lock_guard lk(pool_m_);
    if (pool_stop_) return;
    pool_stop_ = true;
  }
  pool_cv_.notify_all();
  for (auto& t : pool_) t.join();
}

void StageFsCore::post(std::function<void()> fn) {
  {
    std::lock_guard lk(pool_m_);
    if (!pool_stop_) {
      pool_q_.push_back(std::move(fn));
      pool_cv_.notify_one();
      return;
    }
  }
  fn();  // stopping: run here (it only replies with an error or a descriptor)
}

void StageFsCore::completion_loop() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock lk(pool_m_);
      pool_cv_.wait(lk, [&] { return pool_stop_ || !pool_q_.empty(); });
      if (pool_q_.empty()) return;
      fn = std::move(pool_q_.front());
      pool_q_.pop_front();
    }
    fn();
  }
}

Error StageFsCore::read_only(const char* op) {
  return stage::sys_error(EROFS, op, "(read-only mount)");
}

Result<std::unique_ptr<StageFsCore>> StageFsCore::create(CoreConfig cfg, NodeCache& cache, Materializer& mat,
                                                         CopyReader& reader) {
  stage::Fd root(::open(cfg.source_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return stage::sys_error(errno, "open SOURCE_DIR", cfg.source_dir);
  auto core =
      std::unique_ptr<StageFsCore>(new StageFsCore(std::move(cfg), cache, mat, reader, std::move(root)));
  if (core->access_.method() != AccessCheck::Method::faccessat2 && ::geteuid() == 0)
    log_info(
        "the kernel has no faccessat2 (Linux before 5.8, or a seccomp filter that predates it): each access "
        "is checked by {}",
        to_string(core->access_.method()));
  return core;
}

size_t StageFsCore::node_count() const {
  return nodes_.size();
}

Result<std::string> StageFsCore::path_of(uint64_t id) const {
  return nodes_.path_of(id);
}

Result<struct stat> StageFsCore::stat_rel(const std::string& rel) const {
  auto fd = open_beneath(root_.get(), rel, O_PATH);
  if (!fd) return fd.error();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return stage::sys_error(errno, "stat source", rel);
  return st;
}

namespace {
// One component a directory can hold: what lookup() resolves, never a path.
bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.size() <= 255;
}
}  // namespace

Result<struct stat> StageFsCore::stat_as_caller(const std::string& rel, const Caller& who) const {
  auto fd = resolve_as_caller(rel, O_PATH, 0, who);
  if (!fd) return fd.error();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return stage::sys_error(errno, "stat source", rel);
  return st;
}

Result<std::pair<uint64_t, struct stat>> StageFsCore::lookup(uint64_t parent, const std::string& name,
                                                             const Caller& who) {
  if (!plain_name(name)) return stage::sys_error(name.size() > 255 ? ENAMETOOLONG : ENOENT, "lookup", name);
  auto prel = path_of(parent);
  if (!prel) return prel.error();
  const std::string rel = stage::join_path(*prel, name);
  auto st = stat_as_caller(rel, who);
  if (!st) return st.error();
  auto id = nodes_.note_lookup(parent, name, *st, who.uid);
  if (!id) return id.error();
  xattrs_.observe(*id, stage::to_ns(st->st_ctim), st->st_dev);
  return std::pair{*id, *st};
}

std::vector<std::optional<std::pair<uint64_t, struct stat>>> StageFsCore::lookup_many(
    uint64_t parent, std::span<const DirEntry> entries, const Caller& who) {
  std::vector<std::optional<std::pair<uint64_t, struct stat>>> out(entries.size());
  auto prel = path_of(parent);
  if (!prel) return out;
  // As the caller, as lookup() resolves: the directory (search permission on the way), then
  // each name in it (search permission on the directory itself). Each name is one component,
  // never followed if it is a symlink.
  std::optional<AsCaller> as;
  if (checked_as_caller(who) && !as.emplace(who).ok()) return out;
  auto dfd = open_beneath(root_.get(), *prel, O_PATH | O_DIRECTORY);
  if (!dfd) return out;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string& name = entries[i].name;
    if (!plain_name(name)) continue;
    struct stat st {};
    if (::fstatat(dfd->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    auto id = nodes_.note_lookup(parent, name, st, who.uid);
    if (!id) continue;  // past the caller's budget: no attributes (its LOOKUP says why)
    xattrs_.observe(*id, stage::to_ns(st.st_ctim), st.st_dev);
    out[i] = std::pair{*id, st};
  }
  return out;
}

void StageFsCore::forget(uint64_t id, uint64_t n) {
  for (const uint64_t gone : nodes_.forget(id, n)) xattrs_.forget(gone);
}

Result<struct stat> StageFsCore::getattr(uint64_t id, const Caller& who) {
  auto info = nodes_.info(id);
  if (!info) return info.error();
  const NodeTable::Info& node = *info;
  auto st = stat_as_caller(node.rel, who);
  if (st) xattrs_.observe(id, stage::to_ns(st->st_ctim), st->st_dev);
  const stage::FileMeta& v = node.version;
  if (v == stage::FileMeta{}) return st;  // not a regular file's id
  if (!st && st.error().to_errno() != ENOENT && st.error().to_errno() != ENOTDIR) return st;
  if (!st || !S_ISREG(st->st_mode)) {
    // The path now holds something else, or nothing, but the id's holders still read its copy:
    // another type would make the kernel mark their inode bad (EIO on every read).
    struct stat own {};
    own.st_mode = S_IFREG | v.mode;
    own.st_nlink = 1;
    own.st_uid = node.uid;
    own.st_gid = node.gid;
    own.st_dev = static_cast<dev_t>(v.dev);
    own.st_blksize = 4096;
    st = own;
  } else if (stage::meta_from_stat(*st) == v) {
    return st;
  }
  // The id stands for an older version than the path's, which its holders keep reading. Its
  // size and times stay that version's: the kernel sizes reads by these attributes, and a new
  // size would cut the old bytes short or pad them.
  st->st_size = static_cast<off_t>(v.size);
  st->st_blocks = static_cast<blkcnt_t>((v.size + 511) / 512);
  st->st_mtim = stage::from_ns(v.mtime_ns);
  st->st_ctim = stage::from_ns(v.ctime_ns);
  st->st_ino = static_cast<ino_t>(v.ino);
  return st;
}

Result<std::string> StageFsCore::readlink(uint64_t id, const Caller& who) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto fd = resolve_as_caller(*rel, O_PATH, 0, who);
  if (!fd) return fd.error();
  std::string buf(4096, '\0');
  const ssize_t n = ::readlinkat(fd->get(), "", buf.data(), buf.size());
  if (n < 0) return stage::sys_error(errno, "readlink", *rel);
  buf.resize(static_cast<size_t>(n));
  return buf;
}

namespace {

// The file type bits of a directory entry's d_type (0: not known).
uint32_t mode_of(unsigned char d_type) {
  uint32_t mode = 0;
  switch (d_type) {
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
  return mode;
}

// The entries of directory fd (closed on return), as readdir gives them.
Result<std::unique_ptr<std::vector<DirEntry>>> list_entries(stage::Fd fd, const std::string& rel) {
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) return stage::sys_error(errno, "opendir", rel);
  fd.release();  // now owned by d
  auto out = std::make_unique<std::vector<DirEntry>>();
  errno = 0;
  while (const dirent* de = ::readdir(d))
    out->push_back(DirEntry{de->d_name, de->d_ino != 0 ? de->d_ino : 1, mode_of(de->d_type)});
  const int err = errno;
  ::closedir(d);
  if (err != 0) return stage::sys_error(err, "readdir", rel);
  out->shrink_to_fit();
  return out;
}

// The memory a listing holds, as its user's budget counts it.
uint64_t listing_size(const std::vector<DirEntry>& entries) {
  uint64_t bytes = entries.capacity() * sizeof(DirEntry);
  for (const DirEntry& e : entries)
    if (e.name.capacity() > 15) bytes += e.name.capacity() + 1;  // past std::string's inline buffer
  return bytes;
}

}  // namespace

Result<DirSnapshot> StageFsCore::readdir(uint64_t id, const Caller& who) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto fd = open_as_caller(*rel, O_RDONLY | O_DIRECTORY, R_OK, who);
  if (!fd) return fd.error();
  struct stat dst {};
  if (::fstat(fd->get(), &dst) != 0) return stage::sys_error(errno, "stat directory", *rel);
  const auto key = std::tuple{*rel, static_cast<uint64_t>(dst.st_dev), static_cast<uint64_t>(dst.st_ino),
                              stage::to_ns(dst.st_mtim), stage::to_ns(dst.st_ctim)};
  {
    std::lock_guard lk(dirs_m_);
    if (auto it = dirs_.find(key); it != dirs_.end())
      if (auto snap = it->second.lock()) return snap;
  }
  auto out = list_entries(std::move(*fd), *rel);
  if (!out) return out.error();
  const uint64_t bytes = listing_size(**out);
  if (uint64_t used = 0; !budget_->charge(who.uid, bytes, used))
    return stage::sys_error(ENOMEM,
                            "opendir: the listings and names uid " + std::to_string(who.uid) +
                                " holds through the mount would take " +
                                std::to_string((used + bytes) >> 20) + " MiB, over the limit of " +
                                std::to_string(budget_->limit() >> 20) + " MiB",
                            *rel);
  DirSnapshot snap = share_listing(std::move(*out), who.uid, bytes);
  std::lock_guard lk(dirs_m_);
  for (auto it = dirs_.begin(); it != dirs_.end();)  // drop entries of freed snapshots
    it = it->second.expired() ? dirs_.erase(it) : std::next(it);
  dirs_[key] = snap;
  return snap;
}

Result<OpenDir> StageFsCore::opendir(uint64_t id, const Caller& who) {
  auto slot = handles_.take(who.uid, false);
  if (!slot) return slot.error();
  auto entries = readdir(id, who);
  if (!entries) return entries.error();
  return OpenDir{std::move(*entries), std::move(*slot)};
}

DirSnapshot StageFsCore::share_listing(std::unique_ptr<std::vector<DirEntry>> entries, uint32_t uid,
                                       uint64_t bytes) const {
  // The last handle's release frees the listing, gives the memory back to the system and to
  // its user's budget.
  return DirSnapshot(entries.release(), [budget = budget_, uid, bytes](const std::vector<DirEntry>* v) {
    const bool big = v->size() > 1000;
    delete v;
    if (big) ::malloc_trim(0);
    budget->refund(uid, bytes);
  });
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
  const std::string p = proc_fd_path(fd->get());
  std::string buf(65536, '\0');
  const ssize_t n = call(p.c_str(), buf.data(), buf.size());
  if (n < 0) return stage::sys_error(errno, what, rel);
  buf.resize(static_cast<size_t>(n));
  return buf;
}

// Both answered through xattrs_: the source is asked once per node (and version), and
// absent names (what `ls -l` asks of every entry) cost no syscall.
Result<std::string> StageFsCore::getxattr(uint64_t id, const std::string& name, const Caller& who) {
  if (is_hidden_xattr(name, who)) return stage::Error{std::error_code(ENODATA, std::generic_category()), ""};
  if (id == kRootId && name.rfind(kControlPrefix, 0) == 0 && control_xattr_) {
    if (auto v = control_xattr_(name, who)) return *v;
  }
  auto rel = path_of(id);
  if (!rel) return rel.error();
  if (xattr_checked_as_caller(name))
    if (auto reach = resolve_as_caller(*rel, O_PATH, 0, who); !reach) return reach.error();
  auto r = xattrs_.get(
      id, name, [&] { return list_source_xattrs(*rel); },
      [&] {
        return xattr_call(root_.get(), *rel, "getxattr", [&](const char* p, char* b, size_t n) {
          return ::getxattr(p, name.c_str(), b, n);
        });
      });
  if (r) return r;
  // Expected answers, not logged. The kernel fails permission checks on an ACL read that
  // answers EOPNOTSUPP: ACL names are ENODATA then; other names pass the source's answer.
  const int err = r.error().to_errno();
  // No SELinux label on this file: "not supported", which `ls` (and cp, tar) remember per
  // device and stop asking, instead of "no such attribute", which `ls -l` asks again for
  // every entry (one FUSE round trip each: a 100,000-entry `ls -l` 2.8x the source's time).
  // A file that has a label still shows it. (With SELinux enabled, the kernel answers this
  // name from the mount's context and never asks the daemon.)
  if (err == ENODATA && name == kSelinuxXattr)
    return stage::Error{std::error_code(EOPNOTSUPP, std::generic_category()), ""};
  if (err == ENODATA || (err == EOPNOTSUPP && name.rfind("system.posix_acl_", 0) == 0))
    return stage::Error{std::error_code(ENODATA, std::generic_category()), ""};
  if (err == EOPNOTSUPP) return stage::Error{std::error_code(EOPNOTSUPP, std::generic_category()), ""};
  return r;
}

Result<std::string> StageFsCore::list_source_xattrs(const std::string& rel) const {
  auto r = xattr_call(root_.get(), rel, "listxattr",
                      [](const char* p, char* b, size_t n) { return ::listxattr(p, b, n); });
  if (!r && r.error().to_errno() == ENOTSUP) return std::string();
  return r;
}

Result<std::string> StageFsCore::listxattr(uint64_t id, const Caller& who) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  if (auto reach = resolve_as_caller(*rel, O_PATH, 0, who); !reach) return reach.error();
  auto r = xattrs_.list(id, [&] { return list_source_xattrs(*rel); });
  if (!r) return r;
  std::string out;
  for (size_t i = 0; i < r->size();) {
    const size_t end = r->find('\0', i);
    const std::string_view name(r->data() + i, (end == std::string::npos ? r->size() : end) - i);
    if (!name.empty() && !is_hidden_xattr(name, who)) {
      out.append(name);
      out.push_back('\0');
    }
    if (end == std::string::npos) break;
    i = end + 1;
  }
  return out;
}

Result<stage::Fd> StageFsCore::open_as_caller(const std::string& rel, int flags, int mask,
                                              const Caller& who) const {
  auto fd = resolve_as_caller(rel, flags, mask, who);
  if (!fd && (fd.error().to_errno() == EACCES || fd.error().to_errno() == EPERM)) ++counters_.denied;
  return fd;
}

Result<stage::Fd> StageFsCore::resolve_as_caller(const std::string& rel, int flags, int mask,
                                                 const Caller& who) const {
  if (!checked_as_caller(who)) return open_beneath(root_.get(), rel, flags);
  std::optional<Result<stage::Fd>> fd;  // unset: the credentials could not be taken
  int err = 0;
  {
    const AsCaller as(who);
    if (as.ok()) {
      fd = open_beneath(root_.get(), rel, flags);
      if (*fd && mask != 0) err = access_.check((*fd)->get(), mask);
    }
  }
  if (!fd) return stage::sys_error(EACCES, "cannot take the caller's credentials to check access", rel);
  if (!*fd) {
    err = fd->error().to_errno();
    if (err != EACCES && err != EPERM) return fd->error();
  }
  if (err == 0) return std::move(*fd);
  return stage::sys_error(err, "access (checked against the source)", rel);
}

bool StageFsCore::xattr_checked_as_caller(std::string_view name) {
  return name.rfind("system.posix_acl_", 0) != 0;
}

bool StageFsCore::checked_as_caller(const Caller& who) {
  return who.uid != 0 && ::geteuid() == 0;  // root, and a daemon that reads as its own user, are not
}

bool StageFsCore::may_read(const std::string& rel, const Caller& who) const {
  if (who.uid == 0) return true;
  if (::geteuid() != 0) return who.uid == ::geteuid();
  return resolve_as_caller(rel, O_PATH, R_OK, who).ok();
}

Result<OpenFile> StageFsCore::open_materialized(const std::string& rel, const struct stat& src,
                                                const stage::Status& done) {
  if (auto fd = checker_->open_verified(rel, src, done.ok()))
    return OpenFile{std::move(fd.value()), false, false, {}, {}, {}};
  const bool stalled = !done && (done.error().code == stage::make_error_code(stage::Errc::timed_out) ||
                                 done.error().code == stage::make_error_code(stage::Errc::comm_broken));
  if (stalled && cfg_.on_stall == StallPolicy::source) {
    // Only the version this open was decided on (its access check and its node id).
    struct stat now {};
    auto fd = open_regular_beneath(root_.get(), rel, now);
    if (fd &&
        stage::same_version(stage::meta_from_stat(now), stage::meta_from_stat(src), cfg_.source_version)) {
      ++counters_.source_fallbacks;
      log_warn("{}: mount group stalled: reading {} from the shared source", stage::host_name(), rel);
      return OpenFile{std::move(fd.value()), false, true, {}, {}, {}};
    }
  }
  ++counters_.open_errors;
  if (!done) return done.error();
  return stage::stage_error(stage::Errc::checksum_mismatch, "no valid copy after materializing", rel);
}

void StageFsCore::open_async(uint64_t id, int flags, const Caller& who, OpenDone done) {
  auto slot = handles_.take(who.uid, true);
  if (!slot) {
    ++counters_.open_errors;
    return done(slot.error());
  }
  // The slot goes with the handle, or back when the open fails.
  check_open(
      id, flags, who,
      [slot = std::make_shared<HandleLimits::Slot>(std::move(*slot)),
       done = std::move(done)](Result<OpenFile> r) {
        if (r) r->slot = std::move(*slot);
        done(std::move(r));
      },
      cfg_.read_during_copy);
}

void StageFsCore::check_open(uint64_t id, int flags, const Caller& who, OpenDone done_, bool live_ok,
                             bool background) {
  ++counters_.opens;
  // Every copy handed out is pinned (not evicted) until its handle is released.
  auto pinned = std::make_shared<std::string>();
  OpenDone done = [this, pinned, done_ = std::move(done_)](Result<OpenFile> r) {
    if (r && !r->from_source && !pinned->empty()) {
      if (r->pinned.empty()) r->pinned = *pinned;  // set: another name's copy (hard links)
      cache_.pin(r->pinned);
    }
    done_(std::move(r));
  };
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_TRUNC | O_APPEND | O_CREAT)) != 0)
    return done(read_only("open for writing"));
  auto info = nodes_.info(id);
  if (!info) return done(info.error());
  const std::string rel = std::move(info->rel);
  const stage::FileMeta version = info->version;
  *pinned = rel;
  // One resolution of the path, as the caller, for the access check, the type and the version
  // below. A cache hit is checked the same way: access is the source's at every open.
  auto src_fd = open_as_caller(rel, O_PATH, R_OK, who);
  if (!src_fd) return done(src_fd.error());
  struct stat st {};
  if (::fstat(src_fd->get(), &st) != 0) return done(stage::sys_error(errno, "stat source", rel));
  if (!S_ISREG(st.st_mode)) return done(stage::stage_error(stage::Errc::unsupported, "open", rel));
  src_fd->reset();
  if (stage::meta_from_stat(st) != version) {
    // This id names an older version: ESTALE makes the kernel look the name up again.
    ++counters_.stale_opens;
    return done(stage::sys_error(ESTALE, "open (the source changed since it was looked up)", rel));
  }
  // A path named like a copy's temporary file is never copied into the cache: reads go to the
  // source (has_temp_component says why).
  if (has_temp_component(rel)) {
    struct stat now {};
    auto fd = open_regular_beneath(root_.get(), rel, now);
    if (!fd) return done(fd.error());
    if (!stage::same_version(stage::meta_from_stat(now), version, cfg_.source_version))
      return done(stage::sys_error(ESTALE, "open (the source changed since it was looked up)", rel));
    return done(OpenFile{std::move(fd.value()), false, true, {}, {}, {}});
  }
  if (open_observer_ && !background) open_observer_(rel);
  // A copy verified in this mount: answer here. Anything slower goes to the completion pool.
  struct stat cst {};
  if (auto fd = checker_->open_trusted(rel, st, cst)) {
    ++counters_.cache_hits;
    cache_.touch(rel, fd->get(), &cst);
    note_linked_copy(rel, st);
    return done(OpenFile{std::move(fd.value()), true, false, {}, {}, {}});
  }
  Ask ask;
  ask.want = Want{who.uid, background};
  ask.live_ok = live_ok;
  post([this, rel, src = st, ask, done = std::move(done)]() mutable {
    serve_or_materialize(rel, src, ask, std::move(done), false);
  });
}

void StageFsCore::serve_or_materialize(const std::string& rel, const struct stat& src, Ask ask, OpenDone done,
                                       bool checked) {
  ask.since = mat_.epoch();  // before the look into the cache
  // The batch's own rule (cache/rules.h, beneath.h), so an open asks for a batch only if it
  // holds rel.
  ask.small = batch_eligible(src, std::string_view(rel).substr(rel.rfind('/') + 1), cfg_.small_file_size) &&
              !has_access_acl_beneath(root_.get(), rel);
  const bool small = ask.small;
  // A copy that its directory's batch is publishing on this node right now (a walk runs
  // batches ahead of the readers): the batch vouches for it when it ends; no CRC read-back.
  const bool publishing = small && mat_.batch_running(rel);
  if (!publishing) {
    // The cache room's one question: serve its copy, wait for its CRC read-back (a copy from an
    // earlier mount; this open goes on from here when that read ended, its own or another
    // open's of the same copy), or miss.
    auto a = checker_->ask(rel, src, checked, [this, rel, src, ask, done](stage::Status outcome) mutable {
      post([this, rel, src, ask, outcome = std::move(outcome), done = std::move(done)]() mutable {
        if (!outcome && outcome.error().to_errno() == ESHUTDOWN) {
          ++counters_.open_errors;
          return done(outcome.error());
        }
        serve_or_materialize(rel, src, ask, std::move(done), true);
      });
    });
    if (a.kind == CopyChecker::Answer::verify) return;
    if (a.kind == CopyChecker::Answer::stopping) {
      ++counters_.open_errors;
      return done(stage::sys_error(ESHUTDOWN, "open (the mount is stopping)", rel));
    }
    if (a.kind == CopyChecker::Answer::serve) {
      ++counters_.cache_hits;
      cache_.touch(rel, a.fd.get());
      note_linked_copy(rel, src);
      return done(OpenFile{std::move(a.fd), true, false, {}, {}, {}});
    }
  }
  if (auto alive = cache_.alive(); !alive) {
    ++counters_.open_errors;
    log_error("{}", alive.error().message);
    return done(alive.error());
  }
  // Batches copy every name of a small file as their own: only larger files are shared.
  if (src.st_nlink > 1 && !ask.small && serve_from_other_name(rel, src, ask, done)) return;
  ++counters_.materializations;
  materialize_then_open(rel, src, ask, std::move(done));
}

void StageFsCore::note_linked_copy(const std::string& rel, const struct stat& src) {
  if (src.st_nlink > 1 &&
      !batch_eligible(src, std::string_view(rel).substr(rel.rfind('/') + 1), cfg_.small_file_size))
    links_.served(LinkedCopies::key_of(src), rel);
}

bool StageFsCore::serve_from_other_name(const std::string& rel, const struct stat& src, Ask& ask,
                                        OpenDone& done) {
  const LinkedCopies::Key key = LinkedCopies::key_of(src);
  auto wait_for_other = [&] {
    return std::function<void()>([this, rel, src, ask, done = std::move(done)]() mutable {
      serve_or_materialize(rel, src, ask, std::move(done), false);  // finds the copy, or copies rel
    });
  };
  for (;;) {
    const auto a = links_.ask(key, rel, wait_for_other);
    if (a.kind == LinkedCopies::Answer::waiting) return true;
    if (a.kind == LinkedCopies::Answer::same_name) return false;  // the materializer merges the two
    if (a.kind == LinkedCopies::Answer::materialize) break;
    // That name's copy, if it is still the same version (its path may name another file now)
    // and was checked in this mount.
    if (auto fd = checker_->open_verified(a.other, src, false, /*may_read_back=*/false)) {
      ++counters_.cache_hits;
      cache_.touch(a.other, fd->get());
      done(OpenFile{std::move(fd.value()), true, false, a.other, {}, {}});
      return true;
    }
    links_.forget(key, a.other);
  }
  ask.live_ok = false;  // the others wait for a whole copy
  done = [this, key, rel, inner = std::move(done)](Result<OpenFile> r) mutable {
    auto waiters = links_.materialized(key, rel, r && !r->from_source && !r->live);
    inner(std::move(r));
    for (auto& w : waiters) post(std::move(w));
  };
  return false;
}

void StageFsCore::materialize_then_open(const std::string& rel, const struct stat& src, Ask ask,
                                        OpenDone done_, Clock::time_point space_deadline) {
  const uint64_t space_epoch = cache_.space_epoch();  // before the transfer decides on room
  // Exactly one of `then` and `on_live` is called.
  auto shared = std::make_shared<OpenDone>(std::move(done_));
  auto then = [this, rel, src, ask, shared, space_deadline, space_epoch](stage::Status outcome) mutable {
    post([this, rel, src, ask, space_deadline, space_epoch, outcome = std::move(outcome),
          done = std::move(*shared)]() mutable {
      if (!ask.small && !outcome.ok() && outcome.error().to_errno() == ENOSPC)
        return no_room(rel, src, ask, std::move(done), space_deadline, space_epoch, outcome.error());
      Ask alone = ask;
      alone.small = false;
      alone.since = 0;
      if (ask.small && !outcome.ok() && outcome.error().to_errno() != ESHUTDOWN &&
          outcome.error().code != stage::make_error_code(stage::Errc::timed_out) &&
          outcome.error().code != stage::make_error_code(stage::Errc::comm_broken)) {
        // The batch failed (twice): one bad file (a pseudo file, one that keeps changing)
        // fails the whole stream. This file alone then: it gets its own outcome, as before.
        return materialize_then_open(rel, src, alone, std::move(done));
      }
      if (ask.small && outcome.ok()) {
        if (auto fd = checker_->open_verified(rel, src, true))
          return done(OpenFile{std::move(fd.value()), false, false, {}, {}, {}});
        // The batch succeeded without a current copy of rel: the file changed since this open
        // looked at it (ESTALE: the kernel looks the name up again and opens the new
        // version), or it was not in the batch (grew, appeared after the listing, or the
        // slice of its directory that answered this open began with another file): alone.
        if (auto now = stat_rel(rel); now && stage::meta_from_stat(*now) != stage::meta_from_stat(src)) {
          ++counters_.stale_opens;
          ++counters_.open_errors;
          return done(
              stage::sys_error(ESTALE, "open (the source changed while its directory was staged)", rel));
        }
        return materialize_then_open(rel, src, alone, std::move(done));
      }
      done(open_materialized(rel, src, outcome));
    });
  };
  if (ask.small) return mat_.materialize_small_async(rel, ask.since, ask.want, std::move(then));
  if (!ask.live_ok) return mat_.materialize_async(rel, ask.want, std::move(then));
  auto on_live = [this, rel, src, shared](std::shared_ptr<LiveCopy> live) {
    post([this, rel, src, live = std::move(live), done = std::move(*shared)]() mutable {
      // The same version (the device number is this node's own on a network filesystem).
      if (!stage::same_version(live->source(), stage::meta_from_stat(src), cfg_.source_version)) {
        // The transfer copies a newer version than this open looked up.
        ++counters_.stale_opens;
        ++counters_.open_errors;
        return done(stage::sys_error(ESTALE, "open (the source changed while it was being staged)", rel));
      }
      ++counters_.opens_during_copy;
      OpenFile f;
      f.live = std::move(live);
      if (cfg_.on_stall == StallPolicy::source) {  // the version being copied, for a stall
        struct stat now {};
        auto fd = open_regular_beneath(root_.get(), rel, now);
        if (fd &&
            stage::same_version(stage::meta_from_stat(now), stage::meta_from_stat(src), cfg_.source_version))
          f.fd = std::move(fd.value());
      }
      done(std::move(f));
    });
  };
  mat_.materialize_live_async(rel, ask.want, std::move(then), std::move(on_live));
}

namespace {
// The bytes a copy of a source file with stat src takes in the cache (NodeCache's accounting).
uint64_t copy_need(const NodeCache& cache, const struct stat& src) {
  return stage::allocated_from_stat(src) + cache.copy_overhead();
}
}  // namespace

void StageFsCore::no_room(const std::string& rel, const struct stat& src, const Ask& ask, OpenDone done,
                          Clock::time_point deadline, uint64_t space_epoch, const stage::Error& why) {
  // Room now: a new copy (its admission makes the room), still bound by the first deadline.
  auto answer = [this, rel, src, ask, done = std::move(done)](stage::Status fits,
                                                              Clock::time_point first) mutable {
    if (!fits) {
      ++counters_.open_errors;
      return done(fits.error());
    }
    post([this, rel, src, ask, first, done = std::move(done)]() mutable {
      materialize_then_open(rel, src, ask, std::move(done), first);
    });
  };
  room_waits_->await(rel, copy_need(cache_, src), deadline, space_epoch, why, std::move(answer));
}

void StageFsCore::read_live(const std::shared_ptr<LiveCopy>& live, int source_fd, uint64_t off, size_t size,
                            std::function<void(stage::Result<std::string>)> done) {
  // A range that is here is read on the caller's thread; one that waits is read on the
  // completion pool once its chunks are written (not on the engine's writer thread).
  auto finish = [this, live, source_fd, off, size](std::error_code ec) -> Result<std::string> {
    if (!ec) {
      auto r = live->read(off, size);
      if (r) return r;
      ec = r.error().code;  // the copy failed after the range was found here
    }
    const bool stalled = ec == stage::make_error_code(stage::Errc::timed_out) ||
                         ec == stage::make_error_code(stage::Errc::comm_broken);
    if (!stalled || source_fd < 0) return stage::sys_error(EIO, "read of a copy that failed");
    // --on-stall source: the source, if it is still the version this handle opened.
    struct stat now {};
    if (::fstat(source_fd, &now) != 0 ||
        !stage::same_version(stage::meta_from_stat(now), live->source(), cfg_.source_version))
      return stage::sys_error(EIO, "read after a stall (the source changed too)");
    if (live->first_fallback()) {
      ++counters_.source_fallbacks;
      log_warn(
          "{}: mount group stalled: reading the rest of a file opened during its copy from the shared source",
          stage::host_name());
    }
    std::string buf(size, '\0');
    const ssize_t n = stage::pread_full(source_fd, buf.data(), size, off);
    if (n < 0) return stage::sys_error(static_cast<int>(-n), "read of the source after a stall");
    buf.resize(static_cast<size_t>(n));
    return buf;
  };
  auto shared = std::make_shared<std::function<void(stage::Result<std::string>)>>(std::move(done));
  auto now = live->await(off, size, [this, finish, shared](std::error_code ec) {
    post([finish, shared, ec] { (*shared)(finish(ec)); });
  });
  if (now) (*shared)(finish(*now));
}

void StageFsCore::copies_made(const std::vector<struct stat>& copies) {
  checker_->copies_made(copies);
}

void StageFsCore::release(const std::string& pinned) {
  if (!pinned.empty()) cache_.unpin(pinned);
}

void StageFsCore::prefetch_async(uint64_t id, const Caller& who, std::function<void(stage::Status)> done) {
  ++counters_.prefetches;
  // Done when the copy is complete (not when it starts, as an open may be).
  check_open(
      id, O_RDONLY, who,
      [this, done = std::move(done)](Result<OpenFile> r) {
        if (!r) return done(r.error());
        release(r->pinned);
        done({});
      },
      false, /*background=*/true);
}

stage::Status StageFsCore::evict(uint64_t id, const Caller& who) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto st = stat_rel(*rel);
  if (!st) return st.error();
  if (!S_ISREG(st->st_mode)) return stage::stage_error(stage::Errc::unsupported, "evict", *rel);
  // Never cached; the name in the cache may be another file's temporary file.
  if (has_temp_component(*rel)) return stage::stage_error(stage::Errc::unsupported, "evict", *rel);
  if (who.uid != 0 && who.uid != st->st_uid)
    return stage::sys_error(EPERM, "evict: only root or the file's owner may evict it", *rel);
  // Only the copy of the file whose owner was checked: the path may name another file now.
  return cache_.evict(*rel, *st);
}

Result<bool> StageFsCore::has_copy(uint64_t id, const Caller& who) const {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto src_fd = open_as_caller(*rel, O_PATH, R_OK, who);
  if (!src_fd) return src_fd.error();
  struct stat st {};
  if (::fstat(src_fd->get(), &st) != 0) return stage::sys_error(errno, "stat source", *rel);
  if (!S_ISREG(st.st_mode)) return stage::stage_error(stage::Errc::unsupported, "cached", *rel);
  if (has_temp_component(*rel)) return false;  // never cached
  return cache_.open_current(*rel, st).ok();
}

Result<OpenFile> StageFsCore::open(uint64_t id, int flags, const Caller& who) {
  auto p = std::make_shared<std::promise<Result<OpenFile>>>();
  auto f = p->get_future();
  open_async(id, flags, who, [p](Result<OpenFile> r) { p->set_value(std::move(r)); });
  return f.get();
}

}  // namespace stagefs
