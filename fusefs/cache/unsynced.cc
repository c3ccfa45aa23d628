#include "fusefs/cache/unsynced.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "fusefs/base/beneath.h"
#include "fusefs/base/log.h"

namespace stagefs {

namespace {

constexpr const char* kNewName = "unsynced.new";
constexpr size_t kSyncGroup = 128;                     // descriptors open at once while syncing
constexpr uint64_t kMaxLogBytes = uint64_t{1} << 30;  // a larger log counts as unreadable
const std::string kMagic = "stagefs-unsynced 1 boot ";

// Appends each name as a record: the name, then a NUL byte.
template <class Names>
void append_records(std::string& out, const Names& names) {
  for (const auto& n : names) {
    out += n;
    out.push_back('\0');
  }
}

bool write_all(int fd, const std::string& bytes, off_t off) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, off + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Starts the writeback of every copy named, then waits for each, so that one journal commit
// serves many. A name that no longer resolves to a regular file beneath data_fd (evicted,
// replaced by a newer copy that is synced on its own, a symlink) is skipped. A copy that
// cannot be opened for another reason (EMFILE, EIO...) is synced by one syncfs() of the whole
// filesystem instead. Returns the names whose sync failed; counts the others in synced.
std::vector<std::string> sync_names(int data_fd, std::span<const std::string> names, uint64_t& synced) {
  std::vector<std::string> failed, unopened;
  for (size_t i = 0; i < names.size(); i += kSyncGroup) {
    const size_t end = std::min(names.size(), i + kSyncGroup);
    std::vector<std::pair<size_t, stage::Fd>> open;
    for (size_t k = i; k < end; ++k) {
      // O_PATH first: nothing but a regular file is ever opened for reading (a device node).
      auto path = open_beneath(data_fd, names[k], O_PATH);
      struct stat st {};
      if (!path) {
        const int err = path.error().code.value();
        if (err != ENOENT && err != ENOTDIR && err != ELOOP && err != EXDEV && err != EINVAL)
          unopened.push_back(names[k]);
        continue;
      }
      if (::fstat(path->get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      stage::Fd fd(::open(proc_fd_path(path->get()).c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd.valid()) {
        unopened.push_back(names[k]);
        continue;
      }
      ::sync_file_range(fd.get(), 0, 0, SYNC_FILE_RANGE_WRITE);
      open.emplace_back(k, std::move(fd));
    }
    for (auto& [k, fd] : open) {
      if (::fdatasync(fd.get()) != 0)
        failed.push_back(names[k]);
      else
        ++synced;
    }
  }
  if (!unopened.empty()) {
    if (::syncfs(data_fd) == 0)
      synced += unopened.size();
    else
      failed.insert(failed.end(), unopened.begin(), unopened.end());
  }
  return failed;
}

}  // namespace

std::string UnsyncedLog::current_boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

RecoveryCounts UnsyncedLog::recover(int root_fd, int data_fd, const std::string& boot_id) {
  RecoveryCounts r;
  ::unlinkat(root_fd, kNewName, 0);  // an interrupted rewrite: the old log still stands
  stage::Fd fd(::openat(root_fd, kName, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid() && errno == ENOENT) return r;
  r.found = true;
  struct stat st {};
  std::string bytes;
  bool read_ok = fd.valid() && ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) &&
                 static_cast<uint64_t>(st.st_size) <= kMaxLogBytes;
  if (read_ok) {
    bytes.resize(static_cast<size_t>(st.st_size));
    const ssize_t n = stage::pread_full(fd.get(), bytes.data(), bytes.size(), 0);
    read_ok = n == static_cast<ssize_t>(bytes.size());
  }
  // Complete records only: a torn last one was being written when the daemon stopped, before
  // the copies it names were renamed.
  std::vector<std::string> records;
  for (size_t i = 0; read_ok;) {
    const size_t z = bytes.find('\0', i);
    if (z == std::string::npos) break;
    records.emplace_back(bytes, i, z - i);
    i = z + 1;
  }
  // The log is created whole (header included) before it gets its name: a log without a
  // header was not written by us, or was damaged; it cannot say which copies are safe.
  if (!read_ok || records.empty() || !records.front().starts_with(kMagic)) {
    r.unreadable = true;
    return r;  // the caller empties the cache, then calls discard()
  }
  const bool same_boot = !boot_id.empty() && records.front() == kMagic + boot_id;
  const std::span<const std::string> names = std::span<const std::string>(records).subspan(1);
  if (same_boot) {
    for (const auto& name : sync_names(data_fd, names, r.synced))
      if (unlink_beneath(data_fd, name)) ++r.removed;
  } else {
    r.other_boot = true;
    for (const auto& name : names)
      if (unlink_beneath(data_fd, name)) ++r.removed;
  }
  // The removals must be durable before the log that asked for them is gone.
  if (r.removed > 0) ::syncfs(data_fd);
  discard(root_fd);
  return r;
}

void UnsyncedLog::discard(int root_fd) {
  ::unlinkat(root_fd, kName, 0);
}

UnsyncedLog::UnsyncedLog(int root_fd, int data_fd, std::chrono::milliseconds delay,
                         std::function<void(const std::string&)> on_removed, SyncFs syncfs)
    : root_fd_(root_fd), data_fd_(data_fd), delay_(delay), on_removed_(std::move(on_removed)),
      syncfs_(std::move(syncfs)), header_(kMagic + current_boot_id() + std::string(1, '\0')) {
  if (delay_.count() > 0) thread_ = std::thread([this] { run(); });
}

UnsyncedLog::~UnsyncedLog() { close(); }

stage::Status UnsyncedLog::record(std::span<const std::string> names) {
  std::string bytes;
  append_records(bytes, names);
  {
    std::lock_guard lk(m_);
    if (delay_.count() > 0 && !closing_ && append_locked(bytes)) {
      in_flight_.insert(names.begin(), names.end());
      count_locked();
      return {};
    }
  }
  // --sync-after 0, a closing log, or a log that cannot be written: the data now, as before.
  if (syncfs_(data_fd_) != 0) return stage::sys_error(errno, "sync the cache filesystem");
  return {};
}

void UnsyncedLog::published(std::span<const std::string> names) {
  std::lock_guard lk(m_);
  bool any = false;
  for (const auto& n : names) {
    auto it = in_flight_.find(n);
    if (it == in_flight_.end()) continue;  // synced at once (the fallback): nothing to do
    in_flight_.erase(it);
    pending_.push_back(n);
    any = true;
  }
  count_locked();
  if (any) cv_.notify_all();
}

bool UnsyncedLog::append_locked(const std::string& bytes) {
  if (!log_.valid() && !rewrite_locked()) return false;
  if (write_all(log_.get(), bytes, static_cast<off_t>(log_size_)) && ::fdatasync(log_.get()) == 0) {
    log_size_ += bytes.size();
    return true;
  }
  const int err = errno;
  // No torn record may stay in front of the next one: cut it off, or start a new log.
  if (::ftruncate(log_.get(), static_cast<off_t>(log_size_)) != 0) log_.reset();
  if (!warned_)
    log_warn("cache: cannot write the log of unsynced copies ({}): each batch syncs its data instead",
             std::strerror(err));
  warned_ = true;
  return false;
}

bool UnsyncedLog::rewrite_locked() {
  std::string bytes = header_;
  append_records(bytes, pending_);
  append_records(bytes, in_flight_);
  ::unlinkat(root_fd_, kNewName, 0);
  stage::Fd f(::openat(root_fd_, kNewName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  // The new log, synced, then its name, synced: until then the old log (a superset) stands.
  if (!f.valid() || !write_all(f.get(), bytes, 0) || ::fdatasync(f.get()) != 0 ||
      ::renameat(root_fd_, kNewName, root_fd_, kName) != 0) {
    ::unlinkat(root_fd_, kNewName, 0);
    return false;
  }
  // Renamed. Records may go only to a log whose name is durable: if the directory's sync
  // fails, the next record tries a new log again (and falls back to syncing meanwhile).
  log_.reset();
  if (::fsync(root_fd_) != 0) return false;
  log_ = std::move(f);
  log_size_ = bytes.size();
  return true;
}

void UnsyncedLog::flush() {
  std::lock_guard one(flush_m_);
  std::vector<std::string> names;
  {
    std::lock_guard lk(m_);
    names = pending_;  // published only: in_flight_ names are not renamed yet
  }
  if (names.empty()) return;
  uint64_t ok = 0;
  std::vector<std::string> failed;
  // Many copies: one syncfs() (less daemon CPU than several syscalls per copy, and no sync
  // left to spill into the readers' next pass; bench/results/bench_smallfiles.md). It
  // reports a writeback error anywhere on the filesystem (Linux 5.8+); each copy is then
  // synced on its own, which says which ones failed. Few copies: each on its own, so a small
  // flush does not write out other users' data on that disk.
  if (names.size() >= kSyncfsFrom && syncfs_(data_fd_) == 0)
    ok = names.size();
  else
    failed = sync_names(data_fd_, names, ok);
  for (const auto& name : failed) {
    log_error("cache: could not sync the copy of {} to disk: removed (it is copied again at its next open)",
              name);
    unlink_beneath(data_fd_, name);
    if (on_removed_) on_removed_(name);
  }
  synced_count_ += ok;
  std::lock_guard lk(m_);
  // Only published() appends to pending_'s end and only flush() (one at a time) erases its front.
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(names.size()));
  count_locked();
  cv_.notify_all();  // wait_synced()
  if (!log_.valid()) return;
  if (pending_.empty() && in_flight_.empty()) {
    // Not synced on purpose: every name it drops is synced now, so the old length is as safe.
    if (::ftruncate(log_.get(), static_cast<off_t>(header_.size())) == 0) log_size_ = header_.size();
  } else {
    rewrite_locked();  // on failure the old log (a superset) stands; records then start a new one
  }
}

void UnsyncedLog::close() {
  {
    std::lock_guard lk(m_);
    if (closing_) return;
    closing_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  flush();
  std::lock_guard lk(m_);
  if (pending_.empty() && in_flight_.empty()) {
    log_.reset();
    ::unlinkat(root_fd_, kName, 0);
  }
}

bool UnsyncedLog::wait_synced(uint64_t n, std::chrono::milliseconds timeout) {
  std::unique_lock lk(m_);
  return cv_.wait_for(lk, timeout, [&] { return synced_count_.load() >= n; });
}

void UnsyncedLog::run() {
  std::unique_lock lk(m_);
  for (;;) {
    cv_.wait(lk, [&] { return closing_ || !pending_.empty(); });
    if (closing_) return;
    // The first published copy waits delay_; the ones published meanwhile go with it.
    if (cv_.wait_for(lk, delay_, [&] { return closing_; })) return;
    lk.unlock();
    flush();
    lk.lock();
  }
}

}  // namespace stagefs
