// RoomWaits: cache/wait.h states its design, its thread and its lock order.
#include "fusefs/cache/wait.h"

#include <spdlog/spdlog.h>

#include "bcast/io/paths.h"
#include "fusefs/base/log.h"
#include "fusefs/cache/cache.h"

namespace stagefs {

RoomWaits::RoomWaits(NodeCache& cache, std::chrono::milliseconds wait, std::atomic<uint64_t>& waits)
    : cache_(cache), wait_(wait), waits_(waits) {
  thread_ = std::thread([this] { loop(); });
  cache_.set_space_listener([sig = sig_] {
    if (sig->queued.load() == 0) return;  // a later waiter compares the cache's space_epoch() itself
    std::lock_guard lk(sig->m);
    sig->cv.notify_all();
  });
}

RoomWaits::~RoomWaits() {
  stop();
}

void RoomWaits::stop() {
  std::vector<Waiter> waiting;
  {
    std::lock_guard lk(sig_->m);
    if (!stop_) cache_.set_space_listener(nullptr);
    stop_ = true;
    waiting.swap(q_);
    sig_->queued = 0;
  }
  sig_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& w : waiting)
    w.answer(stage::sys_error(ESHUTDOWN, "open (the mount is stopping)", w.rel), w.deadline);
}

void RoomWaits::await(const std::string& rel, uint64_t need, Clock::time_point deadline, uint64_t space_epoch,
                      const stage::Error& why, Answer answer) {
  const auto now = Clock::now();
  const bool first = deadline == Clock::time_point{};
  if (first) deadline = now + wait_;
  const Room room = cache_.room(rel, need);
  // Only copies held open here can make room that is not there: anything else (a copy larger
  // than the whole cache, a filesystem full of other data) fails at once.
  if (room.pinned == 0 || !room.fits_once_released()) return answer(why, deadline);
  if (now < deadline) {
    std::lock_guard lk(sig_->m);
    if (!stop_) {
      if (first) {
        ++waits_;
        log_info(
            "{}: open of {} waits up to {:.0f} s for room in the cache: {} bytes in {} cop(ies) held open "
            "on this node",
            stage::host_name(), rel, std::chrono::duration<double>(wait_).count(), room.pinned,
            room.pinned_files);
      }
      q_.push_back(Waiter{rel, need, deadline, space_epoch, std::move(answer)});
      sig_->queued = q_.size();
      sig_->cv.notify_all();
      if (first) waits_.notify_all();  // for observers waiting on the counter
      return;
    }
  }
  const std::string cause =
      "no room in the cache for " + rel + " after waiting " +
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(wait_).count()) + " s: it needs " +
      std::to_string(room.need) + " bytes, " + std::to_string(room.free + room.evictable) +
      " are free or evictable, and " + std::to_string(room.pinned) + " bytes are held by " +
      std::to_string(room.pinned_files) + " cop(ies) of files open on this node (pinned, never evicted)";
  log_error("{}: {}", stage::host_name(), cause);
  answer(stage::sys_error(ENOSPC, cause), deadline);
}

// Wakes on the cache's listener (room freed) or on the earliest deadline; a waiter whose copy
// now fits is told to ask for it again, one whose deadline passed fails (await() says why).
void RoomWaits::loop() {
  std::unique_lock lk(sig_->m);
  while (!stop_) {
    if (q_.empty()) {
      sig_->cv.wait(lk);
      continue;
    }
    const uint64_t epoch = cache_.space_epoch();
    const auto now = Clock::now();
    std::vector<Waiter> retry, expired;
    auto next = Clock::time_point::max();
    for (auto it = q_.begin(); it != q_.end();) {
      if (it->epoch != epoch && cache_.room(it->rel, it->need).fits_now()) {
        retry.push_back(std::move(*it));
      } else if (now >= it->deadline) {
        expired.push_back(std::move(*it));
      } else {
        it->epoch = epoch;
        next = std::min(next, it->deadline);
        ++it;
        continue;
      }
      it = q_.erase(it);
    }
    sig_->queued = q_.size();
    if (retry.empty() && expired.empty()) {
      sig_->cv.wait_until(lk, next, [&] { return stop_ || cache_.space_epoch() != epoch; });
      continue;
    }
    lk.unlock();
    for (auto& w : retry) w.answer({}, w.deadline);
    for (auto& w : expired)  // past the deadline: await() fails it with the cause
      await(w.rel, w.need, w.deadline, w.epoch, stage::sys_error(ENOSPC, "no room in the cache", w.rel),
            std::move(w.answer));
    lk.lock();
  }
}

}  // namespace stagefs
