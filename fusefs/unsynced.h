// UnsyncedLog: the cache's copies that were published before their data reached the disk, and
// what makes them safe after a crash. Issue 11: a directory batch of small files must not make
// the open that waits for it wait for the disk as well (a sync per batch was two thirds of a
// batch's time on 4 nodes), yet a crash must never leave a cached name on wrong bytes.
//   record(names): appends the copies' names to CACHE/unsynced and fdatasyncs it; the engine
//     renames the copies into place only after that. One small write and one fdatasync per
//     batch instead of writing the batch's data out.
//   A background thread syncs the recorded copies at most --sync-after seconds later: starts
//     the writeback of all of them (sync_file_range), then fdatasyncs each (so they share
//     the filesystem's journal commits), then drops their names from the log (rewritten
//     atomically: a new file, synced, renamed over the old one). close() does the same for
//     what is left and removes the log.
//   recover(), at open, before anything reads the cache: the log starts with the boot id of
//     the kernel that wrote it. The same boot (the daemon was killed, the kernel still has
//     every byte in its page cache): the listed copies are synced now. Another boot (a crash
//     or power loss while copies were unsynced): they are removed, and copied again at their
//     next open. Either way the log is then removed.
// Names are resolved beneath CACHE/data without symlinks (a name that resolves elsewhere is
// skipped), and a torn last record (a crash during record(), before any rename) is ignored:
// a record is a name followed by a NUL byte, and a name never holds a NUL byte.
// If the log cannot be written (ENOSPC...), record() falls back to syncing the filesystem.
// Thread-safe; one flush runs at a time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bcast/error.h"
#include "bcast/fd.h"

namespace stagefs {

struct RecoveryCounts {
  uint64_t synced = 0;   // listed copies synced (the same boot)
  uint64_t removed = 0;  // listed copies removed (another boot, or a failed sync)
  bool found = false;    // a log was there
  bool other_boot = false;
};

class UnsyncedLog {
 public:
  inline static const char* const kName = "unsynced";
  // root_fd: CACHE (holds the log); data_fd: CACHE/data (the names are relative to it).
  // on_removed: told of each copy removed because it could not be synced (to update the index).
  UnsyncedLog(int root_fd, int data_fd, std::chrono::milliseconds delay,
              std::function<void(const std::string&)> on_removed);
  ~UnsyncedLog();  // close()
  UnsyncedLog(const UnsyncedLog&) = delete;
  UnsyncedLog& operator=(const UnsyncedLog&) = delete;

  // The boot id of the running kernel (/proc/sys/kernel/random/boot_id), "" if unknown.
  static std::string current_boot_id();
  // Reads a log left by an earlier daemon and acts on it (see above). boot_id: the running
  // kernel's (a parameter for tests).
  static RecoveryCounts recover(int root_fd, int data_fd, const std::string& boot_id);

  // Records the names (relative to CACHE/data) durably. Error only if neither the log nor the
  // fallback sync worked.
  stage::Status record(std::span<const std::string> names);
  // Syncs every recorded copy now and empties the log.
  void flush();
  // Stops the background thread, flushes, removes the log. Idempotent.
  void close();
  [[nodiscard]] uint64_t pending() const;
  [[nodiscard]] uint64_t synced() const;  // copies synced in the background so far

 private:
  void run();
  bool append_locked(const std::string& bytes);  // the records, synced; false: not written
  bool rewrite_locked();                         // a new log of header_ + pending_

  int root_fd_;
  int data_fd_;
  std::chrono::milliseconds delay_;
  std::function<void(const std::string&)> on_removed_;
  const std::string header_;  // the first record: magic and boot id
  mutable std::mutex m_;  // guards everything below
  std::condition_variable cv_;
  stage::Fd log_;
  uint64_t log_size_ = 0;
  bool warned_ = false;
  std::vector<std::string> pending_;  // recorded, not synced yet, in log order
  uint64_t synced_ = 0;
  bool stop_ = false;
  bool closed_ = false;
  std::mutex flush_m_;  // one flush at a time
  std::thread thread_;
};

}  // namespace stagefs
