// CopyChecker: the node cache's once-per-mount trust in the bytes of a copy (Verify::crc).
//
// A copy made in this mount was checked chunk by chunk and as a whole while it was written:
// it is trusted from its publication on (open_verified(just_made), copies_made()). A copy
// from an earlier mount (or run) is read back once and its CRC compared with the one its
// origin records before it is served: a match is trusted for the rest of the mount, a
// mismatch or a copy that cannot be read is removed (that inode only) and the opens that
// waited for it copy the file anew.
// Read-backs run on the checker's own threads (at most `threads` copies are read at once;
// further ones queue), once however many opens ask for one copy: the opens that find it
// being read wait for that read (a callback each, no thread held). A 50 GB image being
// checked holds neither the core's completion pool nor a second reader of the same copy.
// NodeCopies (copies.h) owns one, for the mount's life (a new mount trusts nothing it has not
// checked), and asks it one question per open that found no trusted copy at once (ask()).
// Thread-safe. Lock order: verify_m_ (queue, waiters, stop) before verified_m_ (the trusted
// set); the verifier threads never hold both; no lock is held while a copy is read or a
// callback runs; NodeCache's index lock is taken only inside NodeCache calls, under neither.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bcast/io/error.h"
#include "bcast/io/fd.h"

namespace stagefs {

class NodeCache;

enum class Verify { none, crc };

// What the checker counts (the mount's status shows them).
struct CheckCounters {
  std::atomic<uint64_t> verified{0};      // copies whose read-back matched their recorded CRC
  std::atomic<uint64_t> corrupt{0};       // ... and those that did not (removed)
  std::atomic<uint64_t> verify_waits{0};  // opens that waited for another open's read-back
};

// How a copy is read back: the checker's seam to the disk. The real one reads the whole copy
// (stage::crc_of_fd); tests hold or fail read-backs with a fake. Called on the verifier
// threads, and on an open's thread for open_verified(); thread-safe.
class CopyReader {
 public:
  virtual ~CopyReader() = default;
  // The CRC-64 of the copy open at fd (rel names it in errors). An error stands for an I/O
  // error on the cache's disk.
  virtual stage::Result<uint64_t> crc(int fd, const std::string& rel) = 0;
  // The checker stops: no read-back starts any more, and stop() waits next for those that
  // run. A reader that can end a read early may do so now.
  virtual void stopping() {}
};
// The real reader (stateless, shared).
CopyReader& disk_copy_reader();

class CopyChecker {
 public:
  struct Config {
    Verify verify_cache = Verify::crc;
    int threads = 2;  // verifier threads (at least one with Verify::crc)
  };
  // counters: where the checker counts; reader: how it reads copies back (both outlive it).
  CopyChecker(NodeCache& cache, Config cfg, CheckCounters& counters, CopyReader& reader = disk_copy_reader());
  ~CopyChecker();  // stop()
  CopyChecker(const CopyChecker&) = delete;
  CopyChecker& operator=(const CopyChecker&) = delete;

  // rel's current copy for a source with stat src (NodeCache::open_current) if it is trusted
  // in this mount already (or Verify::none): no read, no wait. copy_st receives its stat.
  stage::Result<stage::Fd> open_trusted(const std::string& rel, const struct stat& src, struct stat& copy_st);
  // The question an open asks when open_trusted() had nothing for it.
  //   serve: fd is rel's current copy, trusted now;
  //   verify: a copy from an earlier mount is being read back for this open (or another's):
  //           then(outcome) runs on a verifier thread once that read ended (ESHUTDOWN: the
  //           checker stopped first), and the open asks again with checked = true;
  //   miss: no current, trusted copy (none, outdated, or found corrupted): copy the file;
  //   stopping: the checker stops (then is dropped).
  // checked: this open already waited for its copy's read-back; a copy is then served only if
  // that read trusted it, never read back again here.
  struct Answer {
    enum Kind { serve, verify, miss, stopping } kind = miss;
    stage::Fd fd;  // serve: the copy
  };
  Answer ask(const std::string& rel, const struct stat& src, bool checked,
             std::function<void(stage::Status)> then);
  // rel's current copy, trusted: just_made (a transfer of this mount made it) trusts it;
  // otherwise a copy from an earlier mount is read back here, on the caller's thread, unless
  // may_read_back is false (then it is an error until ask() had it read).
  stage::Result<stage::Fd> open_verified(const std::string& rel, const struct stat& src, bool just_made,
                                         bool may_read_back = true);
  // A batch of this mount published these copies (NodeCache::batch_done's stats): trusted.
  void copies_made(const std::vector<struct stat>& copies);
  // Ends the verifier threads: a read in progress ends first; opens waiting for one that had
  // not started get ESHUTDOWN. Idempotent.
  void stop();

 private:
  using CopyKey = std::tuple<uint64_t, uint64_t, int64_t>;  // the copy's device, inode, mtime
  static CopyKey copy_key(const struct stat& st);
  bool trusted(const CopyKey& key);
  // If rel's current copy is from an earlier mount and not yet checked: queues its read-back
  // (or joins the one in progress) and returns queued; none: nothing to wait for.
  enum class Check { none, queued, stopping };
  Check check_later(const std::string& rel, const struct stat& src, std::function<void(stage::Status)> then);
  void verify_loop();
  // Reads rel's copy (fd; its stat `copy`) back and compares its CRC with the recorded one: a
  // match is trusted; a mismatch removes the copy (that inode only).
  stage::Status read_back(int fd, const std::string& rel, const struct stat& copy, uint64_t recorded);

  NodeCache& cache_;
  Config cfg_;
  CheckCounters& counters_;
  CopyReader& reader_;
  std::mutex verified_m_;
  std::set<CopyKey> verified_;  // copies trusted in this mount
  struct CrcJob {
    struct stat copy {};  // the copy read (its key; removed if bad only while it is still at rel)
    stage::Fd fd;
    std::string rel;
    uint64_t crc = 0;
  };
  std::mutex verify_m_;
  std::condition_variable verify_cv_;
  std::deque<CrcJob> verify_q_;
  std::map<CopyKey, std::vector<std::function<void(stage::Status)>>> checking_;  // waiters by copy
  bool verify_stop_ = false;
  std::vector<std::thread> verifiers_;
};

}  // namespace stagefs
