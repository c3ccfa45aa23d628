#include "fusefs/live.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace stagefs {

void LiveFile::started(const stage::FileMeta& source, uint64_t chunk_size, const stage::Txn& txn) {
  // A file of one chunk is complete one chunk later anyway: its opens wait for the verified
  // copy as before (and a pseudo file, empty by stat, fails its open rather than reading as
  // an empty file).
  if (source.size <= chunk_size) return;
  // The temporary file, just created by this daemon in its own cache (O_EXCL, 0700 parents):
  // no symlink is followed all the same.
  stage::Fd fd(::open(txn.temp_path().c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  {
    std::lock_guard lk(m_);
    source_ = source;
    chunk_ = std::max<uint64_t>(chunk_size, 1);
    const uint64_t n = (source.size + chunk_ - 1) / chunk_;
    state_.assign(n, kMissing);
    asked_.assign(n, 0);
    if (!fd.valid()) {
      open_error_ = std::strerror(errno);
      return;  // not ready: opens wait for the whole copy as before
    }
    fd_ = std::move(fd);
    started_ = true;
  }
  if (on_started_) on_started_();
}

bool LiveFile::have_locked(uint64_t off, uint64_t end) const {
  for (uint64_t c = off / chunk_; c * chunk_ < end; ++c)
    if (state_[c] == kMissing) return false;
  return true;
}

void LiveFile::want_locked(uint64_t off, uint64_t end) {
  for (uint64_t c = off / chunk_; c * chunk_ < end; ++c) {
    if (state_[c] != kMissing || asked_[c] != 0) continue;
    asked_[c] = 1;
    wants_.push_back(c);
    ++stats_.chunks_wanted;
  }
}

void LiveFile::chunk_written(uint64_t index, bool zero) {
  std::vector<Pending> now;
  {
    std::lock_guard lk(m_);
    if (index >= state_.size()) return;
    state_[index] = zero ? kZero : kData;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (have_locked(it->off, it->end)) {
        now.push_back(std::move(*it));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : now) p.done(read_now(p.off, p.end));
}

void LiveFile::take_wanted(std::vector<uint64_t>& out) {
  std::lock_guard lk(m_);
  out.insert(out.end(), wants_.begin(), wants_.end());
  wants_.clear();
}

void LiveFile::end(bool ok) {
  std::vector<Pending> failed, ready;
  {
    std::lock_guard lk(m_);
    ended_ = true;
    ok_ = ok;
    for (auto& p : pending_) (have_locked(p.off, p.end) ? ready : failed).push_back(std::move(p));
    pending_.clear();
    stats_.reads_failed += failed.size();
  }
  for (auto& p : ready) p.done(read_now(p.off, p.end));
  for (auto& p : failed)
    p.done(stage::sys_error(EIO, "read (the copy failed before this range arrived)"));
}

void LiveFile::read_async(uint64_t off, size_t size, ReadDone done) {
  uint64_t end = 0;
  {
    std::unique_lock lk(m_);
    ++stats_.reads;
    end = std::min<uint64_t>(source_.size, off + size);
    if (off >= end) {
      lk.unlock();
      return done(std::string());
    }
    if (!have_locked(off, end)) {
      if (ended_) {
        ++stats_.reads_failed;
        lk.unlock();
        return done(stage::sys_error(EIO, "read (the copy failed before this range arrived)"));
      }
      ++stats_.reads_waited;
      want_locked(off, end);
      pending_.push_back(Pending{off, end, std::move(done)});
      return;
    }
  }
  done(read_now(off, end));
}

stage::Result<std::string> LiveFile::read_now(uint64_t off, uint64_t end) {
  std::vector<char> states;
  {
    std::lock_guard lk(m_);
    for (uint64_t c = off / chunk_; c * chunk_ < end; ++c) states.push_back(state_[c]);
  }
  std::string out(end - off, '\0');
  const uint64_t first = off / chunk_;
  for (uint64_t pos = off; pos < end;) {
    const uint64_t c = pos / chunk_;
    const uint64_t stop = std::min(end, (c + 1) * chunk_);
    if (states[c - first] == kData) {
      for (uint64_t at = pos; at < stop;) {
        const ssize_t n = ::pread(fd_.get(), out.data() + (at - off), stop - at, static_cast<off_t>(at));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return stage::sys_error(n < 0 ? errno : EIO, "read of the copy in progress");
        at += static_cast<uint64_t>(n);
      }
    }  // a zero chunk: the zeros are there already
    pos = stop;
  }
  return out;
}

bool LiveFile::ready() const {
  std::lock_guard lk(m_);
  return started_ && !(ended_ && !ok_);
}

stage::FileMeta LiveFile::source() const {
  std::lock_guard lk(m_);
  return source_;
}

LiveFile::Stats LiveFile::stats() const {
  std::lock_guard lk(m_);
  return stats_;
}

}  // namespace stagefs
