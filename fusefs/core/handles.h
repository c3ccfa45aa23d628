// What the daemon holds open for each user, bounded so that no user can exhaust what the
// others, and the daemon itself, need.
//
// Every open handle of a file holds a descriptor in the daemon (the local copy; during its copy
// the temporary file; after a stall the source), every directory handle a share of a listing.
// HandleLimits counts them by uid:
//   - a user other than root may hold at most `per_user` handles (files and directories):
//     past it, that user's opens and opendirs fail with EMFILE ("Too many open files"), as a
//     process past its own RLIMIT_NOFILE would; other users are not affected;
//   - the file handles of every user together (root's too) may hold at most `room`
//     descriptors: the daemon's descriptor limit less a reserve for its own work (temporary
//     files of copies, the cache, CRC read-backs, listings being read, MPI's connections):
//     past it, ENFILE ("Too many open files in system"). The reserve is what keeps a first open
//     working on the other nodes of the group while one node is full of handles: each node
//     must create its temporary file.
// descriptor_budget() turns the process's RLIMIT_NOFILE into those numbers, and
// raise_descriptor_limit() raises the soft limit to the hard one first.
//
// A Slot is one handle's share: move-only, given back when destroyed (it may outlive the
// HandleLimits that issued it). Thread-safe: atomics and one mutex per instance.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "bcast/io/error.h"

namespace stagefs {

class HandleLimits {
 public:
  // 0: no limit.
  struct Config {
    uint64_t per_user = 0;
    uint64_t room = 0;
  };
  explicit HandleLimits(Config cfg);

  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& o) noexcept { *this = std::move(o); }
    Slot& operator=(Slot&& o) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { reset(); }
    void reset();
    [[nodiscard]] bool held() const { return state_ != nullptr; }

   private:
    friend class HandleLimits;
    struct State;
    std::shared_ptr<State> state_;
    uint32_t uid_ = 0;
    bool descriptor_ = false;
  };

  // One handle for uid: a file's (descriptor: true) or a directory's. EMFILE past uid's
  // limit, ENFILE past the descriptor room; the message says which and what to change.
  stage::Result<Slot> take(uint32_t uid, bool descriptor);
  [[nodiscard]] uint64_t held(uint32_t uid) const;
  [[nodiscard]] uint64_t descriptors() const;
  [[nodiscard]] const Config& config() const { return cfg_; }

 private:
  Config cfg_;
  std::shared_ptr<Slot::State> state_;
};

// The descriptor limit the daemon runs with: RLIMIT_NOFILE's soft limit raised to the hard one
// (capped by /proc/sys/fs/nr_open when the hard one is unlimited). Returns the soft limit now.
uint64_t raise_descriptor_limit();

// HandleLimits for a process whose descriptor limit is `limit`: the room is the limit less a
// reserve of an eighth (at least 1024, at most half); a user's handles at most `per_user`, and
// at most a quarter of the room, so that four users at their limit still leave room for more.
// `why_lowered` says so when per_user had to come down (empty otherwise).
HandleLimits::Config descriptor_budget(uint64_t limit, uint64_t per_user, std::string& why_lowered);

}  // namespace stagefs
