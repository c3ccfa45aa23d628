// Replay: a mount that finds a profile (format.h) stages what the last job read before this
// one asks, in the background. The coordinator's node runs it (every node takes part in the
// transfers it asks for, as in any other).
//
// A thread of its own walks the profile in order. Each file is probed (probe: resolved beneath
// SOURCE_DIR and checked for read access as the profile's user; a file changed since the
// profile is simply staged as it is now), planned (plan.h: its directory's batch, or the file
// alone with the chunks the job read first), and each new item asked of the materializer as a
// background want that may not evict (Want{uid, background, !may_evict}, group.h): it waits
// behind every open, an open of its file moves it ahead, an open of another large file runs
// nested in it, and it never evicts a copy to make room (the replay stays within the cache's
// limit). At most `window` items are outstanding (asked, not answered), so what waits behind
// the opens stays short and the replay ends soon after the cache is full or the mount stops.
// It stops at the first item that found no room (ENOSPC), after kMaxFailures failed items in a
// row, or at stop().
//
// stats() is the progress stagectl status and the metrics show; account() adds, at unmount,
// how much of what it staged the job then opened (every node's record, merged: exchange.h).
// Thread-safety: every method from any thread. The materializer's callbacks hold the
// replay's state, not the Replay: they may come after stop() (the group answers what is
// outstanding when it shuts down).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fusefs/core/core.h"
#include "fusefs/profile/file.h"
#include "fusefs/profile/plan.h"

namespace stagefs {

struct ReplayStats {
  // off (--profile off, --replay off), none (no profile yet), refused (see note), running,
  // done, full (no room without evicting), failed (items kept failing), stopped (the mount
  // ended first).
  std::string state = "off";
  std::string note;                             // why refused, or the profile's path
  uint64_t files = 0;                           // in the profile
  uint64_t files_queued = 0, bytes_queued = 0;  // planned and asked for (sizes as they are now)
  uint64_t files_done = 0, bytes_done = 0;      // whose transfer completed (copied, or current already)
  uint64_t files_skipped = 0;  // gone, not readable by the profile's user, not a regular file, or failed
  // At unmount, on the coordinator's node: of the files done, those the job opened on any node
  // (used) and those it did not (unused: the replay's waste).
  bool accounted = false;
  uint64_t files_used = 0, bytes_used = 0, files_unused = 0, bytes_unused = 0;
};

class Replay {
 public:
  static constexpr size_t kWindow = 16;
  static constexpr int kMaxFailures = 3;
  using Probe = std::function<FileProbe(const std::string& rel)>;
  struct Config {
    uint64_t small_file_size = 0;  // the mount's
    uint64_t transfer_chunk = 0;   // the coordinator's --chunk-size
    size_t window = kWindow;
  };
  // want: the profile's user (uid), background, may not evict.
  Replay(Profile profile, std::string path, Config cfg, Materializer& mat, Probe probe, Want want);
  ~Replay();
  Replay(const Replay&) = delete;
  Replay& operator=(const Replay&) = delete;

  void start();
  // Ends the walk and joins the thread; what is outstanding is answered by the group.
  void stop();
  [[nodiscard]] ReplayStats stats() const;
  // Waits until the walk ended (done, or full, failed, stopped) or `timeout` passed; true if it
  // ended.
  bool wait_for_end(std::chrono::milliseconds timeout) const;
  // The chunks of rel the job read first, in chunks of chunk_size (GroupConfig::first_chunks).
  [[nodiscard]] std::vector<uint64_t> first_chunks(const std::string& rel, uint64_t chunk_size) const;
  // At unmount: `job` is this job's profile (every node's opens).
  void account(const Profile& job);

 private:
  struct State;
  static void run(const std::shared_ptr<State>& s, Materializer& mat, const Probe& probe, Want want);
  static void ask(const std::shared_ptr<State>& s, size_t item, Materializer& mat, Want want);
  static void answered(State& s, size_t item, const stage::Status& st);

  std::shared_ptr<State> s_;
  Materializer& mat_;
  Probe probe_;
  Want want_;
  std::unordered_map<std::string, std::vector<uint32_t>> chunks_;  // files with recorded chunks
  uint64_t profile_chunk_ = 0;
  std::thread thread_;
};

}  // namespace stagefs
