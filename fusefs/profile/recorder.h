// AccessRecorder: what this node's job read, for the profile its mount writes at the end
// (format.h). The core tells it each open that passed its access check (opened: the first
// one of a path counts, with its time since the mount was ready); the group tells it what
// readers read of a file while it was being copied (live_reads: the chunks in the order
// readers first asked for them). A file read through kernel passthrough after its copy is
// invisible to the daemon: its chunks stay unknown (the whole file, in file order).
// At most max_files paths are kept (the rest are counted as left out: Profile::truncated).
// Thread-safe: one mutex; an open costs one hash lookup under it.
//
// merge_profiles(): the nodes' profiles as one, at unmount (exchange.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "fusefs/profile/format.h"

namespace stagefs {

class AccessRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  // chunk_size: the chunks the profile records (the mount's --chunk-size); start: when the
  // mount was ready.
  AccessRecorder(uint64_t chunk_size, Clock::time_point start, size_t max_files = kMaxProfileFiles);

  void opened(const std::string& rel);
  // chunks: of chunk_size bytes (the transfer's), in first-read order.
  void live_reads(const std::string& rel, uint64_t chunk_size, const std::vector<uint64_t>& chunks);
  [[nodiscard]] bool contains(const std::string& rel) const;
  [[nodiscard]] size_t files() const;
  // The profile so far (uid, created and source are the caller's to fill in).
  [[nodiscard]] Profile snapshot() const;

 private:
  // The record of rel, added (with the time now) if new and there is room; nullptr if not.
  ProfileFile* note_locked(const std::string& rel);
  const uint64_t chunk_size_;
  const Clock::time_point start_;
  const size_t max_files_;
  mutable std::mutex m_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<ProfileFile> files_;
  bool truncated_ = false;
};

// One profile of several (the nodes' of one job): each file once, at its earliest first
// access, ordered by it (ties: the earlier profile's first); its chunks are those of its
// earliest record, then the others' not among them (in the first profile's chunk size). At
// most kMaxProfileFiles files (the earliest). The first profile's informational fields.
Profile merge_profiles(std::vector<Profile> profiles);

}  // namespace stagefs
