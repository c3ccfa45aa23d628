// CopyChecker: cache/verify.h states its design, its threads and its lock order.
#include "fusefs/cache/verify.h"

#include <spdlog/spdlog.h>

#include "bcast/io/source.h"
#include "bcast/io/store.h"
#include "fusefs/base/log.h"
#include "fusefs/cache/cache.h"
#include "fusefs/cache/copy_xattrs.h"

namespace stagefs {

namespace {
class DiskCopyReader final : public CopyReader {
 public:
  stage::Result<uint64_t> crc(int fd, const std::string& rel) override {
    return stage::crc_of_fd(fd, rel, false);
  }
};
}  // namespace

CopyReader& disk_copy_reader() {
  static DiskCopyReader reader;
  return reader;
}

CopyChecker::CopyChecker(NodeCache& cache, Config cfg, CheckCounters& counters, CopyReader& reader)
    : cache_(cache), cfg_(cfg), counters_(counters), reader_(reader) {
  if (cfg_.verify_cache == Verify::crc)
    for (int i = 0; i < std::max(1, cfg_.threads); ++i) verifiers_.emplace_back([this] { verify_loop(); });
}

CopyChecker::~CopyChecker() {
  stop();
}

void CopyChecker::stop() {
  bool first = false;
  {
    std::lock_guard lk(verify_m_);
    first = !verify_stop_;
    verify_stop_ = true;
  }
  verify_cv_.notify_all();
  if (first) reader_.stopping();
  for (auto& t : verifiers_)
    if (t.joinable()) t.join();
}

CopyChecker::CopyKey CopyChecker::copy_key(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), stage::to_ns(st.st_mtim)};
}

bool CopyChecker::trusted(const CopyKey& key) {
  std::lock_guard lk(verified_m_);
  return verified_.contains(key);
}

void CopyChecker::verify_loop() {
  for (;;) {
    CrcJob job;
    bool stopping = false;
    {
      std::unique_lock lk(verify_m_);
      verify_cv_.wait(lk, [&] { return verify_stop_ || !verify_q_.empty(); });
      if (verify_q_.empty()) return;
      job = std::move(verify_q_.front());
      verify_q_.pop_front();
      stopping = verify_stop_;
    }
    stage::Status outcome;
    if (stopping) {
      // A read not yet started is not started (a 50 GB read would hold the unmount).
      outcome = stage::sys_error(ESHUTDOWN, "open (the mount is stopping)", job.rel);
    } else {
      outcome = read_back(job.fd.get(), job.rel, job.copy, job.crc);
      if (!outcome && outcome.error().code != stage::make_error_code(stage::Errc::checksum_mismatch)) {
        // A copy that cannot be read is no use: removed, and the waiting opens copy the file
        // anew (none reads it back again on the completion pool).
        log_error("{}: cached copy of {} could not be read back ({}): removed, copying again",
                  stage::host_name(), job.rel, outcome.error().message);
        cache_.remove(job.rel, job.copy);
      }
    }
    job.fd.reset();
    std::vector<std::function<void(stage::Status)>> waiters;
    {
      std::lock_guard lk(verify_m_);
      if (auto node = checking_.extract(copy_key(job.copy))) waiters = std::move(node.mapped());
    }
    for (auto& w : waiters) w(outcome);
  }
}

stage::Status CopyChecker::read_back(int fd, const std::string& rel, const struct stat& copy,
                                     uint64_t recorded) {
  auto crc = reader_.crc(fd, rel);
  if (!crc) return crc.error();
  if (*crc != recorded) {
    ++counters_.corrupt;
    log_error("{}: cached copy of {} is corrupted (CRC {:016x}, recorded {:016x}): removed, copying again",
              stage::host_name(), rel, *crc, recorded);
    cache_.remove(rel, copy);
    return stage::stage_error(stage::Errc::checksum_mismatch, "cached copy", rel);
  }
  ++counters_.verified;
  std::lock_guard lk(verified_m_);
  verified_.insert(copy_key(copy));
  return {};
}

CopyChecker::Check CopyChecker::check_later(const std::string& rel, const struct stat& src,
                                            std::function<void(stage::Status)> then) {
  if (cfg_.verify_cache == Verify::none) return Check::none;
  struct stat st {};
  auto fd = cache_.open_current(rel, src, &st);
  if (!fd) return Check::none;
  const auto key = copy_key(st);
  if (trusted(key)) return Check::none;
  const auto origin = stage::origin_of_fd(fd->get(), kCopyXattrs.origin);
  if (!origin || !origin->crc_known) return Check::none;  // nothing to read back (open_verified says what)
  std::lock_guard lk(verify_m_);                          // then verified_m_ (the verifier never holds both)
  if (verify_stop_) return Check::stopping;
  // Checked again under verify_m_: a read-back that ended since the look above has already
  // handed out its waiters, and a second one would read the whole copy again.
  if (trusted(key)) return Check::none;
  auto [it, first] = checking_.try_emplace(key);
  it->second.push_back(std::move(then));
  if (!first) {
    ++counters_.verify_waits;
    return Check::queued;
  }
  verify_q_.push_back(CrcJob{st, std::move(fd.value()), rel, origin->crc});
  verify_cv_.notify_one();
  return Check::queued;
}

stage::Result<stage::Fd> CopyChecker::open_trusted(const std::string& rel, const struct stat& src,
                                                   struct stat& copy_st) {
  auto fd = cache_.open_current(rel, src, &copy_st);
  if (!fd || cfg_.verify_cache == Verify::none || trusted(copy_key(copy_st))) return fd;
  return stage::stage_error(stage::Errc::checksum_mismatch, "cached copy (not checked)", rel);
}

CopyChecker::Answer CopyChecker::ask(const std::string& rel, const struct stat& src, bool checked,
                                     std::function<void(stage::Status)> then) {
  if (!checked) {
    const Check c = check_later(rel, src, std::move(then));
    if (c == Check::queued) return {Answer::verify, {}};
    if (c == Check::stopping) return {Answer::stopping, {}};  // no read-back of a whole copy while stopping
  }
  // checked: only a copy whose read-back succeeded is served here; anything else (removed as
  // corrupted or unreadable, replaced since) is copied anew, never read back on this thread.
  auto fd = open_verified(rel, src, false, /*may_read_back=*/!checked);
  if (!fd) return {Answer::miss, {}};
  return {Answer::serve, std::move(fd.value())};
}

stage::Result<stage::Fd> CopyChecker::open_verified(const std::string& rel, const struct stat& src,
                                                    bool just_made, bool may_read_back) {
  struct stat st {};
  auto fd = cache_.open_current(rel, src, &st);
  if (!fd || cfg_.verify_cache == Verify::none) return fd;
  const auto key = copy_key(st);
  if (trusted(key)) return fd;
  const auto origin = stage::origin_of_fd(fd->get(), kCopyXattrs.origin);
  if (!just_made && origin && origin->crc_known) {
    if (!may_read_back)
      return stage::stage_error(stage::Errc::checksum_mismatch, "cached copy (not checked)", rel);
    // A copy from an earlier mount (or run): read it once and compare with its recorded CRC.
    if (auto checked = read_back(fd->get(), rel, st, origin->crc); !checked) return checked.error();
    return fd;
  }
  // A copy made in this mount was checked chunk by chunk and as a whole while it was written.
  std::lock_guard lk(verified_m_);
  verified_.insert(key);
  return fd;
}

void CopyChecker::copies_made(const std::vector<struct stat>& copies) {
  if (cfg_.verify_cache == Verify::none) return;
  std::lock_guard lk(verified_m_);
  for (const auto& st : copies) verified_.insert(copy_key(st));
}

}  // namespace stagefs
