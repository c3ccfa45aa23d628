// NodeCopies: one face for a copy's life on this node, the cache room's.
//
// The core asks it one question per open (ask()): serve this copy, check it first (a copy
// from an earlier mount is read back for its CRC once), another name's copy (hard links),
// wait for another name's transfer, or miss (the core has the file copied). A copy refused
// for room waits here (await_room()); a made copy is opened here (open_made()). The group
// asks it, through Admission (admission.h), before and after every transfer and batch on
// every rank: the room a copy needs is made in the NodeCache (cache/admit.cc), and a
// batch's published copies are trusted for the rest of the mount.
// It owns the parts that keep these answers, for the mount's life (a new mount trusts
// nothing it has not checked):
//   CopyChecker   (verify.h)  trust in a copy's bytes, read-backs on its own threads;
//   RoomWaits     (wait.h)    opens waiting for room that copies held open take;
//   LinkedCopies  (links.h)   the names of one source file share one transfer;
// over the NodeCache (cache.h) the daemon opened, which it does not own.
// Thread-safe: ask(), open_trusted(), open_made(), await_room() and the pins from any thread;
// the Admission methods from the group's service thread. No lock of its own: each part has
// its own (their orders are in their headers), and no callback runs under one.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bcast/io/error.h"
#include "bcast/io/fd.h"
#include "fusefs/base/admission.h"
#include "fusefs/cache/links.h"
#include "fusefs/cache/verify.h"
#include "fusefs/cache/wait.h"

namespace stagefs {

class NodeCache;

// What the cache room counts (the mount's status shows them): the checker's, and the opens
// that waited for room held by open copies (notified, atomic wait, once such an open is queued).
struct CopyCounters : CheckCounters {
  std::atomic<uint64_t> room_waits{0};
};

class NodeCopies final : public Admission {
 public:
  using Clock = std::chrono::steady_clock;
  struct Config {
    int source_root = -1;  // SOURCE_DIR's fd (admission looks at the source beneath it)
    Verify verify_cache = Verify::crc;
    int verify_threads = 2;  // the CopyChecker's threads
    // How long an open waits for room held by open copies, from its first refusal (RoomWaits).
    std::chrono::milliseconds space_wait{std::chrono::seconds(60)};
    uint64_t small_file_size = 0;  // batches take files of at most this size (batch_eligible)
  };
  // reader: how copies are read back for their CRC (outlives this).
  NodeCopies(NodeCache& cache, Config cfg, CopyReader& reader = disk_copy_reader());
  ~NodeCopies() override;  // stop()
  NodeCopies(const NodeCopies&) = delete;
  NodeCopies& operator=(const NodeCopies&) = delete;

  // An open of rel, the source file with stat src. small: the open would ask for rel's
  // directory as a batch; publishing: that batch is publishing rel's copy on this node right
  // now (it vouches for the copy when it ends: no read-back); checked: this open already
  // waited for its copy's read-back.
  struct Open {
    std::string rel;
    struct stat src {};
    bool small = false;
    bool publishing = false;
    bool checked = false;
  };
  // Runs when a `check_first` or `other_name_running` answer is ready for the open to ask
  // again: on the checker's thread (checked = true; ESHUTDOWN: the checker stopped), or as one
  // of the waiters made_linked() returns (checked = false). Must be quick.
  using Again = std::function<void(stage::Status outcome, bool checked)>;
  struct Answer {
    enum Kind {
      serve,               // fd is a trusted copy: of rel, or of `other` (another name of it)
      check_first,         // the copy is being read back for its CRC: `again` runs after
      other_name_running,  // another name of the file is being copied: `again` runs after
      miss,                // no trusted copy: copy the file
      stopping,            // the checker stops: the open fails (ESHUTDOWN)
      failed,              // the cache is gone (error, logged)
    } kind = miss;
    stage::Fd fd;
    std::string other;
    // miss: this open's copy is the one the file's other names wait for: tell made_linked()
    // when it ends.
    bool makes_linked = false;
    stage::Error error;
  };
  Answer ask(const Open& o, Again again);
  // Without a read or a wait: rel's current copy if it is trusted in this mount already (a
  // hit is recorded: its last use, and for a file with several names, the name that serves
  // them). copy_st receives its stat.
  stage::Result<stage::Fd> open_trusted(const std::string& rel, const struct stat& src, struct stat& copy_st);
  // rel's copy after its materialization: just_made trusts it (this mount's transfer made
  // it); otherwise a copy from an earlier mount is read back here, on the caller's thread.
  stage::Result<stage::Fd> open_made(const std::string& rel, const struct stat& src, bool just_made);
  // A miss with makes_linked ended (made: a whole copy of rel is in the cache): the opens of
  // other names that waited for it, to run (each asks again).
  std::vector<std::function<void()>> made_linked(const struct stat& src, const std::string& rel, bool made);

  // The cache's space epoch, read before a copy is asked for (await_room's space_epoch).
  [[nodiscard]] uint64_t space_epoch() const;
  // rel's copy was refused with `why` (ENOSPC): RoomWaits says when the open may ask for it
  // again (answer ok), or fails it (see wait.h; deadline unset on a first refusal).
  void await_room(const std::string& rel, const struct stat& src, Clock::time_point deadline,
                  uint64_t space_epoch, const stage::Error& why, RoomWaits::Answer answer);

  // A handle holds rel's copy (never evicted while pinned), or no longer does.
  void pin(const std::string& rel);
  void unpin(const std::string& rel);
  // Copies this mount made and checked while writing them (a batch's): trusted.
  void copies_made(const std::vector<struct stat>& copies);

  // Admission, on every rank (admission.h).
  stage::Status before_transfer(const std::string& rel, bool may_evict) override;
  void after_transfer(const std::string& rel, bool ok) override;
  void before_batch(const std::string& dir, const stage::SelectionSlice& slice, bool may_evict) override;
  void after_batch(const std::string& dir, const std::vector<std::string>& published, bool ok) override;

  // Ends the checker (a read in progress ends first; opens waiting for one get ESHUTDOWN),
  // then the waits for room (ESHUTDOWN). Idempotent. The answers it gives run on the calling
  // thread or the parts' own: a pool they post to must still run.
  void stop();
  [[nodiscard]] NodeCache& cache() const { return cache_; }
  [[nodiscard]] const CopyCounters& counters() const { return counters_; }

 private:
  // The cache's answer for rel's own copy (the checker's), or nullopt: not this copy.
  std::optional<Answer> own_copy(const Open& o, const Again& again);
  // Hard links: another name's copy, a wait for its transfer, or this open's own transfer.
  Answer linked_copy(const Open& o, const Again& again);
  // A trusted copy of rel was served: other names of a file with several links use it too.
  void note_linked_copy(const std::string& rel, const struct stat& src);

  NodeCache& cache_;
  Config cfg_;
  CopyCounters counters_;
  CopyChecker checker_;
  RoomWaits room_waits_;
  LinkedCopies links_;
};

}  // namespace stagefs
