// LiveFile: a file this node is materializing, readable before its copy ends (issue 11).
//
// The engine tells it, through stage::LiveCopy, when the temporary file exists (started) and
// which chunks are in it, verified against their CRC (chunk_written). Readers ask for byte
// ranges (read_async):
//   - a range whose chunks are all here is read at once from the temporary file (one
//     read-only descriptor, opened when the transfer starts; after the publish the same inode
//     is the copy, so the descriptor stays good whatever happens to the name),
//   - a range beyond waits for its chunks only, and asks for them (take_wanted: the source
//     rank sends wanted chunks next, so a reader of the end of a 50 GB image does not wait
//     for the middle),
//   - once the transfer ended, a range with a chunk that never came fails with EIO (a failed
//     copy: nothing is published, but the chunks that did arrive were verified and are
//     served).
// Holes travel as "zero" chunks and read as zeros. Bytes past the source's size read as EOF.
// A file of one chunk or less never becomes ready: its opens wait for the whole copy.
//
// Thread-safety: every method is thread-safe (one mutex). started() and take_wanted() come
// from the MPI thread, chunk_written() from the engine's writer thread, read_async() and
// end() from any thread. A read's callback runs on the thread that completes it (the
// caller's, the writer's, or end()'s), never under the lock: it must be quick (it replies).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "bcast/engine.h"
#include "bcast/fd.h"

namespace stagefs {

class LiveFile final : public stage::LiveCopy {
 public:
  using ReadDone = std::function<void(stage::Result<std::string>)>;
  // on_started: called (without the lock) once the temporary file is open for reading.
  explicit LiveFile(std::function<void()> on_started = {}) : on_started_(std::move(on_started)) {}

  // stage::LiveCopy
  void started(const stage::FileMeta& source, uint64_t chunk_size, const stage::Txn& txn) override;
  void chunk_written(uint64_t index, bool zero) override;
  void take_wanted(std::vector<uint64_t>& out) override;

  // The transfer ended on this node; ok: it published the copy. Fails the reads still waiting.
  void end(bool ok);
  // Reads [off, off + size) (shorter at the end of the file); done gets the bytes or EIO.
  void read_async(uint64_t off, size_t size, ReadDone done);

  [[nodiscard]] bool ready() const;  // started and not failed: an open may use it
  [[nodiscard]] stage::FileMeta source() const;
  struct Stats {
    uint64_t reads = 0, reads_waited = 0, reads_failed = 0, chunks_wanted = 0;
  };
  [[nodiscard]] Stats stats() const;

 private:
  struct Pending {
    uint64_t off, end;
    ReadDone done;
  };
  enum : char { kMissing = 0, kData = 1, kZero = 2 };
  bool have_locked(uint64_t off, uint64_t end) const;
  void want_locked(uint64_t off, uint64_t end);
  stage::Result<std::string> read_now(uint64_t off, uint64_t end);

  std::function<void()> on_started_;
  mutable std::mutex m_;
  stage::Fd fd_;
  stage::FileMeta source_{};
  uint64_t chunk_ = 0;
  bool started_ = false, ended_ = false, ok_ = false;
  std::string open_error_;
  std::vector<char> state_;   // per chunk
  std::vector<char> asked_;   // per chunk: already wanted
  std::vector<uint64_t> wants_;
  std::deque<Pending> pending_;
  Stats stats_;
};

}  // namespace stagefs
