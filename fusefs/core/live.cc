#include "fusefs/core/live.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "bcast/io/fd.h"

namespace stagefs {

void LiveCopy::started(const stage::FileMeta& source, uint64_t chunk_size,
                       const std::vector<stage::Extent>& holes, const stage::Txn& txn) {
  // A file of one chunk is complete one chunk later anyway: its opens wait for the verified
  // copy as before (and a pseudo file, empty by stat, fails its open rather than reading as
  // an empty file).
  if (source.size <= chunk_size) return;
  // The temporary file, just created by this daemon in its own cache (O_EXCL, 0700 parents):
  // no symlink is followed all the same.
  stage::Fd fd(::open(txn.temp_path().c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return;  // not ready: opens wait for the whole copy as before
  {
    std::unique_lock fdlk(fd_m_);
    fd_ = std::move(fd);
  }
  {
    std::lock_guard lk(m_);
    source_ = source;
    chunk_ = std::max<uint64_t>(chunk_size, 1);
    const uint64_t n = (source.size + chunk_ - 1) / chunk_;
    state_.assign(n, kMissing);
    for (const stage::Extent& h : holes)  // whole chunks (or a last chunk's tail): never sent
      for (uint64_t c = h.off / chunk_; c < std::min(n, (h.off + h.len + chunk_ - 1) / chunk_); ++c)
        state_[c] = kZero;
    asked_.assign(n, 0);
    read_.assign(n, 0);
    started_ = true;
  }
  if (on_started_) on_started_();
}

bool LiveCopy::have_locked(uint64_t off, uint64_t end) const {
  for (uint64_t c = off / chunk_; c * chunk_ < end; ++c)
    if (state_[c] == kMissing) return false;
  return true;
}

void LiveCopy::want_locked(uint64_t off, uint64_t end) {
  for (uint64_t c = off / chunk_; c * chunk_ < end; ++c) {
    if (state_[c] != kMissing || asked_[c] != 0) continue;
    asked_[c] = 1;
    wants_.push_back(c);
    ++stats_.chunks_wanted;
  }
}

void LiveCopy::chunk_written(uint64_t index, bool zero) {
  std::vector<Ready> now;
  {
    std::lock_guard lk(m_);
    if (index >= state_.size() || state_[index] != kMissing) return;
    state_[index] = zero ? kZero : kData;
    // Only the reads that wait for this chunk (one chunk-range test each).
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->off / chunk_ <= index && index * chunk_ < it->end && have_locked(it->off, it->end)) {
        now.push_back(std::move(it->ready));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : now) r({});
}

void LiveCopy::want_first(const std::vector<uint64_t>& chunks) {
  std::lock_guard lk(m_);
  wants_.insert(wants_.end(), chunks.begin(), chunks.end());
}

void LiveCopy::take_wanted(std::vector<uint64_t>& out) {
  std::lock_guard lk(m_);
  out.insert(out.end(), wants_.begin(), wants_.end());
  wants_.clear();
}

void LiveCopy::restarted() {
  std::lock_guard lk(m_);
  for (size_t c = 0; c < asked_.size(); ++c)
    if (state_[c] == kMissing) asked_[c] = 0;
  for (const Pending& p : pending_) want_locked(p.off, p.end);
}

void LiveCopy::end(bool ok, std::error_code why) {
  std::vector<Ready> failed;
  {
    std::lock_guard lk(m_);
    if (ended_) return;  // the first outcome stands (a late failure must not close a good copy)
    ended_ = true;
    ok_ = ok;
    why_ = why;
    // (ok: every chunk is here and nothing waits; any waiter then simply reads)
    for (auto& p : pending_) failed.push_back(std::move(p.ready));
    if (!ok) stats_.reads_failed += pending_.size();
    pending_.clear();
  }
  if (!ok) {  // free the failed copy's space now (see the header)
    std::unique_lock fdlk(fd_m_);
    fd_.reset();
  }
  for (auto& r : failed) r(ok ? std::error_code{} : why);
}

std::optional<std::error_code> LiveCopy::await(uint64_t off, size_t size, Ready ready) {
  std::lock_guard lk(m_);
  ++stats_.reads;
  if (ended_ && !ok_) {
    ++stats_.reads_failed;
    return why_;
  }
  const uint64_t end = std::min<uint64_t>(source_.size, off + size);
  if (off >= end) return std::error_code{};
  for (uint64_t c = off / chunk_; c * chunk_ < end && read_order_.size() < kMaxReadOrder; ++c)
    if (read_[c] == 0) {
      read_[c] = 1;
      read_order_.push_back(c);
    }
  if (have_locked(off, end)) return std::error_code{};
  ++stats_.reads_waited;
  want_locked(off, end);
  pending_.push_back(Pending{off, end, std::move(ready), std::chrono::steady_clock::now()});
  return std::nullopt;
}

stage::Result<std::string> LiveCopy::read(uint64_t off, size_t size) {
  std::vector<char> states;
  uint64_t end = 0, chunk = 0;
  {
    std::lock_guard lk(m_);
    if (ended_ && !ok_) return stage::Error{why_, "read (the copy failed)"};
    end = std::min<uint64_t>(source_.size, off + size);
    if (off >= end) return std::string();
    if (!have_locked(off, end)) return stage::sys_error(EIO, "read of a range not yet copied");
    chunk = chunk_;
    for (uint64_t c = off / chunk; c * chunk < end; ++c) states.push_back(state_[c]);
  }
  std::string out(end - off, '\0');
  std::shared_lock fdlk(fd_m_);
  if (!fd_.valid()) return stage::sys_error(EIO, "read (the copy failed)");
  const uint64_t first = off / chunk;
  for (uint64_t pos = off; pos < end;) {
    const uint64_t c = pos / chunk;
    const uint64_t stop = std::min(end, (c + 1) * chunk);
    if (states[c - first] == kData) {
      const ssize_t n = stage::pread_full(fd_.get(), out.data() + (pos - off), stop - pos, pos);
      if (n < 0 || static_cast<uint64_t>(n) < stop - pos)
        return stage::sys_error(n < 0 ? static_cast<int>(-n) : EIO, "read of the copy in progress");
    }  // a zero chunk: the zeros are there already
    pos = stop;
  }
  return out;
}

std::optional<std::chrono::steady_clock::time_point> LiveCopy::oldest_wait() const {
  std::lock_guard lk(m_);
  if (pending_.empty()) return std::nullopt;
  auto t = pending_.front().since;
  for (const auto& p : pending_) t = std::min(t, p.since);
  return t;
}

bool LiveCopy::ready() const {
  std::lock_guard lk(m_);
  return started_ && !(ended_ && !ok_);
}

stage::FileMeta LiveCopy::source() const {
  std::lock_guard lk(m_);
  return source_;
}

LiveCopy::Stats LiveCopy::stats() const {
  std::lock_guard lk(m_);
  return stats_;
}

LiveCopy::ReadOrder LiveCopy::read_order() const {
  std::lock_guard lk(m_);
  return ReadOrder{chunk_, read_order_};
}

}  // namespace stagefs
