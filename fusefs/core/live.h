// LiveCopy: a file this node is materializing, readable before its copy ends (a live copy).
//
// One word in code: "live" (LiveCopy, materialize_live_async, open_live, read_live,
// live_reads). Only the names users see keep the option's words: --read-during-copy and the
// config fields named after it (read_during_copy), and the status keys opens_during_copy and
// reads_waited_during_copy.
//
// The engine tells it, as the copy's stage::LiveCopyReaders, when the temporary file exists
// (started) and which chunks are in it, verified against their CRC (chunk_written). A reader
// asks for a byte range (await):
//   - here: every chunk of the range is written; read() it now, from the temporary file (one
//     read-only descriptor, opened when the transfer starts; after the publish the same
//     inode is the copy, so the descriptor stays good whatever happens to the name),
//   - waiting: the range's missing chunks are asked for (take_wanted: the source rank sends
//     wanted chunks next, so a reader of the end of a 50 GB image does not wait for the
//     middle) and `ready` is called once they are written, or once the transfer failed,
//   - fed again: the seed feeding the transfer failed and another feeder takes over
//     (restarted): written chunks stay, the waiting reads ask their chunks of the new feeder;
//   - failed: the transfer failed; nothing is published and the descriptor is closed at
//     once, so the failed copy's disk space is freed even while handles stay open (else a
//     user who can change a source file could pin one unlinked, almost complete copy per
//     handle). Every read of the handle then fails.
// Holes travel as "zero" chunks, or not at all (a sparse file's holes of whole chunks are
// here from the start), and read as zeros. Bytes past the source's size read as EOF.
// A file of one chunk or less never becomes ready: its opens wait for the whole copy.
// What readers read is remembered (read_order: each chunk once, in the order readers first
// asked for it, at most kMaxReadOrder chunks): a profile replays it (fusefs/profile/). Chunks
// known to be wanted before any reader asks (want_first: a replayed profile's) are wanted
// first, in that order.
//
// Thread-safety: every method is thread-safe. started() and take_wanted() come from the MPI
// thread, chunk_written() from the engine's writer thread (which only collects the ready
// callbacks and calls them after the lock: they must be quick, e.g. post the read to a pool),
// await(), read() and end() from any thread. A read never races the descriptor's close (a
// shared lock around each pread).
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <system_error>
#include <vector>

#include "bcast/io/fd.h"
#include "bcast/transfer/engine.h"

namespace stagefs {

class LiveCopy final : public stage::LiveCopyReaders {
 public:
  using Ready = std::function<void(std::error_code)>;
  // on_started: called (without the lock) once the temporary file is open for reading.
  explicit LiveCopy(std::function<void()> on_started = {}) : on_started_(std::move(on_started)) {}

  // The most chunks read_order() keeps.
  static constexpr size_t kMaxReadOrder = 4096;

  // Chunks to send before any reader asks, in this order (valid on any rank, started or not:
  // the engine routes them to the rank that reads).
  void want_first(const std::vector<uint64_t>& chunks);

  // stage::LiveCopyReaders
  void started(const stage::FileMeta& source, uint64_t chunk_size, const std::vector<stage::Extent>& holes,
               const stage::Txn& txn) override;
  void chunk_written(uint64_t index, bool zero) override;
  void take_wanted(std::vector<uint64_t>& out) override;
  // The transfer is fed again (its seed failed): what readers wait for is wanted again from
  // the new feeder; what is written stays (the same bytes).
  void restarted() override;

  // The transfer ended on this node; ok: it published the copy. Otherwise waiting reads get
  // `why` (EIO; the group's stall error when the transfer stalled: the core may then read the
  // source instead, --on-stall source), and so does every later await().
  void end(bool ok, std::error_code why = std::error_code(EIO, std::generic_category()));
  // [off, off + size): std::error_code{} if it is here now (read() it), an error if it will
  // never be, nullopt if `ready` was kept and will be called once, from another thread.
  std::optional<std::error_code> await(uint64_t off, size_t size, Ready ready);
  // The bytes of a range that is here (shorter at the end of the file, empty past it).
  stage::Result<std::string> read(uint64_t off, size_t size);

  [[nodiscard]] bool ready() const;  // started and not failed: an open may use it
  // True once: the first read served from the source after a stall (counted per copy).
  bool first_fallback() { return !fell_back_.exchange(true); }
  // When the longest-waiting read started waiting, if any waits (the group's stall rule).
  [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> oldest_wait() const;
  [[nodiscard]] stage::FileMeta source() const;
  struct Stats {
    uint64_t reads = 0, reads_waited = 0, reads_failed = 0, chunks_wanted = 0;
  };
  [[nodiscard]] Stats stats() const;
  // The chunks this node's readers read, each once, in the order they first asked for it
  // (empty if none read, or the copy never started here), in chunks of chunk_size.
  struct ReadOrder {
    uint64_t chunk_size = 0;
    std::vector<uint64_t> chunks;
  };
  [[nodiscard]] ReadOrder read_order() const;

 private:
  struct Pending {
    uint64_t off, end;
    Ready ready;
    std::chrono::steady_clock::time_point since;
  };
  enum : char { kMissing = 0, kData = 1, kZero = 2 };
  bool have_locked(uint64_t off, uint64_t end) const;
  void want_locked(uint64_t off, uint64_t end);

  std::function<void()> on_started_;
  mutable std::mutex m_;
  std::shared_mutex fd_m_;  // shared: a pread; exclusive: the close (m_ is never taken inside)
  stage::Fd fd_;
  stage::FileMeta source_{};
  uint64_t chunk_ = 0;
  bool started_ = false, ended_ = false, ok_ = false;
  std::error_code why_{EIO, std::generic_category()};
  std::vector<char> state_;  // per chunk
  std::vector<char> asked_;  // per chunk: already wanted
  std::vector<char> read_;   // per chunk: in read_order_
  std::vector<uint64_t> read_order_;
  std::vector<uint64_t> wants_;
  std::deque<Pending> pending_;
  Stats stats_;
  std::atomic<bool> fell_back_{false};
};

}  // namespace stagefs
