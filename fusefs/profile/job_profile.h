// JobProfile: a mount's profile from start to end, so that the daemon calls it at a few
// points only (fusefs/edge/daemon.cc):
//   attach()        before the mount serves: the core tells the recorder every open; the group
//                   (this is its ReadOrders) tells it what readers read during a copy (every
//                   node), and asks the replay for a file's recorded chunks (the coordinator's);
//   start_replay()  once every node mounted, on the coordinator's node: reads the profile
//                   (file.h's checks) and starts the Replay (replay.h) as the profile's user:
//                   the daemon's own user, or for a daemon that runs as root the profile file's
//                   owner, whose access every file is then checked against (root's: any);
//   finish()        when the group has shut down, on every rank (COLLECTIVE over the data
//                   Comm's ranks unless the group is broken): stops the replay, merges every
//                   node's record on rank 0 (exchange.h), counts the replay's hits and waste,
//                   and writes the profile (not when the job read nothing: the last one stays);
//   stats()         the replay's progress, for status and metrics (the coordinator's node).
// Thread-safety: attach, start_replay and finish from the daemon's main thread, in that order;
// stats from any thread; the ReadOrders methods from the group's service thread.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "bcast/comm/comm.h"
#include "fusefs/core/core.h"
#include "fusefs/group/group.h"
#include "fusefs/profile/recorder.h"
#include "fusefs/profile/replay.h"

namespace stagefs {

class JobProfile final : public ReadOrders {
 public:
  struct Config {
    std::string path;  // the profile file ("" : off)
    bool replay = true;
    std::string source_dir;   // absolute
    uint64_t chunk_size = 0;  // the mount's
    uint64_t small_file_size = 0;
  };
  explicit JobProfile(Config cfg);
  ~JobProfile() override;
  JobProfile(const JobProfile&) = delete;
  JobProfile& operator=(const JobProfile&) = delete;

  // Makes this the group's ReadOrders in g when it records (it must outlive the group); the
  // core's observer with core_ready().
  void attach(GroupConfig& g);
  std::vector<uint64_t> first_chunks(const std::string& rel, uint64_t chunk_size) override;
  void live_reads(const std::string& rel, const LiveCopy::ReadOrder& order) override;
  void core_ready(StageFsCore& core);
  void start_replay(Materializer& mat, StageFsCore& core, int source_root);
  // Returns false if the exchange left a send cancelled: MPI must not be finalized then.
  bool finish(stage::Comm& data, bool group_broken, std::chrono::milliseconds budget);
  [[nodiscard]] std::optional<ReplayStats> stats() const;

 private:
  FileProbe probe(const std::string& rel, const Caller& who) const;
  Config cfg_;
  std::unique_ptr<AccessRecorder> recorder_;
  mutable std::mutex m_;  // guards replay_ (set once), off_ and coordinator_ for stats()
  std::unique_ptr<Replay> replay_;
  ReplayStats off_;  // the coordinator's status when no replay runs (off, none, refused)
  bool coordinator_ = false;
  StageFsCore* core_ = nullptr;
  int source_root_ = -1;
};

}  // namespace stagefs
