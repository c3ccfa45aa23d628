// RoomWaits: the cache room's answer to an open whose copy found no room (ENOSPC).
//
// Only copies held open on this node (pinned: never evicted) can make room that is not there.
// So an open refused while such copies stand in the way, and whose copy would fit once they
// are released, waits here: a queue entry, not a thread, woken when the cache frees space (a
// copy's last pin goes, a copy is evicted or removed: NodeCache's space listener) or by its
// deadline (from its first refusal, `wait` later). A waiter whose copy now fits is told to
// ask for it again (a new transfer, whose admission makes the room); if it loses the room to
// another copy it comes back here with its first deadline. Past the deadline, or when waiting
// cannot help (nothing pinned, a copy larger than the whole cache, a filesystem full of other
// data), it fails with ENOSPC and a log line naming the cause.
// NodeCopies (copies.h) owns one and asks it one question per refusal (await()).
// Thread-safe. One thread of its own. Lock order: sig_->m before NodeCache's index lock (the thread
// asks the cache for room under it); the cache's listener takes sig_->m only, with no cache lock
// held; no lock is held while an answer runs.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bcast/io/error.h"

namespace stagefs {

class NodeCache;

class RoomWaits {
 public:
  using Clock = std::chrono::steady_clock;
  // The answer to await(): ok (the copy fits now: ask for it again, passing `deadline` to the
  // next await()), or the error the open fails with.
  using Answer = std::function<void(stage::Status fits, Clock::time_point deadline)>;
  // wait: how long an open waits from its first refusal (0: never). waits: counts the opens
  // that began to wait, notified (atomic wait) as each is queued; it outlives this.
  RoomWaits(NodeCache& cache, std::chrono::milliseconds wait, std::atomic<uint64_t>& waits);
  ~RoomWaits();  // stop()
  RoomWaits(const RoomWaits&) = delete;
  RoomWaits& operator=(const RoomWaits&) = delete;

  // rel's copy (need bytes in the cache) was refused with `why` (ENOSPC). space_epoch: the
  // cache's space_epoch() read before that copy was asked for. deadline: unset on the open's
  // first refusal, else the one an earlier answer passed on. The answer runs at once on this
  // thread when waiting cannot help (`why`) or the deadline has passed (ENOSPC with the
  // cause), else later on the room's thread.
  void await(const std::string& rel, uint64_t need, Clock::time_point deadline, uint64_t space_epoch,
             const stage::Error& why, Answer answer);
  // Ends the thread; the opens still waiting get ESHUTDOWN. Idempotent.
  void stop();

 private:
  struct Waiter {
    std::string rel;
    uint64_t need = 0;
    Clock::time_point deadline;
    uint64_t epoch = 0;  // the cache's space_epoch() when it last found no room for it
    Answer answer;
  };
  void loop();

  NodeCache& cache_;
  const std::chrono::milliseconds wait_;
  std::atomic<uint64_t>& waits_;
  // Shared with the cache's listener, which may run on a thread that released a pin while
  // this stops. queued: q_'s size (the listener notifies only when some open waits).
  struct Signal {
    std::mutex m;
    std::condition_variable cv;
    std::atomic<size_t> queued{0};
  };
  std::shared_ptr<Signal> sig_ = std::make_shared<Signal>();
  std::vector<Waiter> q_;  // guarded by sig_->m
  bool stop_ = false;      // guarded by sig_->m
  std::thread thread_;
};

}  // namespace stagefs
