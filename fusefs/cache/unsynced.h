// UnsyncedLog: the cache's copies that were published before their data reached the disk, and
// what makes them safe after a crash. A directory batch of small files must not make the open
// that waits for it wait for the disk as well (a sync per batch would be most of a batch's
// time), yet a crash must never leave a cached name on wrong bytes.
//   record(names): before a batch's renames. Appends the copies' names to CACHE/unsynced and
//     fdatasyncs it; the engine renames the copies into place only after that. One small
//     write and one fdatasync per batch instead of writing the batch's data out.
//   published(names): after the renames. Only from then on may the names be synced: a sync
//     of a name not renamed yet would sync the old copy (or nothing) and drop the name.
//   A background thread syncs the published copies about --sync-after seconds after the
//     first of them was published: kSyncfsFrom copies or more by one syncfs() of the cache
//     filesystem (if it fails, as below); fewer, by starting the writeback of all of them
//     (sync_file_range), then fdatasyncing each (so they share the filesystem's journal
//     commits). Then it drops their names from the log (rewritten atomically: a new file,
//     synced, renamed over the old one, directory synced). close() does the same for what is
//     left and removes the log.
//   recover(), at open (after the cache's sweep, before its index): the log starts with the
//     boot id of the kernel that wrote it. The same boot (the daemon was killed, the kernel
//     still has every byte in its page cache): the listed copies are synced now. Another boot
//     (a crash or power loss while copies were unsynced): they are removed, and copied again
//     at their next open. A log that cannot be read says nothing of which copies are safe:
//     the caller then empties the cache. The log is removed once acted on.
// Names are resolved beneath CACHE/data without symlinks (a name that resolves elsewhere is
// skipped), and a torn last record (a crash during record(), before any rename) is ignored:
// a record is a name followed by a NUL byte, and a name never holds a NUL byte.
// If the log cannot be written (ENOSPC...), record() falls back to syncing the filesystem,
// and so does a sync that cannot open a copy for a reason other than its absence (EMFILE...).
// Thread-safe; one flush runs at a time; pending() and synced() never wait for the disk.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bcast/io/error.h"
#include "bcast/io/fd.h"

namespace stagefs {

struct RecoveryCounts {
  uint64_t synced = 0;      // listed copies synced (the same boot)
  uint64_t removed = 0;     // listed copies removed (another boot, or a failed sync)
  bool found = false;       // a log was there
  bool other_boot = false;
  bool unreadable = false;  // a log that could not be read: nothing is known to be synced
};

// The sync of a whole filesystem the log calls: syncfs(fd) (0, or -1 with errno). A seam:
// tests pass a fake that counts the calls or fails them.
using SyncFs = std::function<int(int)>;

class UnsyncedLog {
 public:
  inline static const char* const kName = "unsynced";
  static constexpr size_t kSyncfsFrom = 64;  // a flush of this many copies or more: one syncfs
  // root_fd: CACHE (holds the log); data_fd: CACHE/data (the names are relative to it).
  // on_removed: told of each copy removed because it could not be synced (to update the index).
  UnsyncedLog(int root_fd, int data_fd, std::chrono::milliseconds delay,
              std::function<void(const std::string&)> on_removed, SyncFs syncfs = ::syncfs);
  ~UnsyncedLog();  // close()
  UnsyncedLog(const UnsyncedLog&) = delete;
  UnsyncedLog& operator=(const UnsyncedLog&) = delete;

  // The boot id of the running kernel (/proc/sys/kernel/random/boot_id), "" if unknown.
  static std::string current_boot_id();
  // Reads a log left by an earlier daemon and acts on it (see above). boot_id: the running
  // kernel's (a parameter for tests).
  static RecoveryCounts recover(int root_fd, int data_fd, const std::string& boot_id);
  // Removes the log (after the caller emptied the cache for an unreadable one).
  static void discard(int root_fd);

  // Records the names (relative to CACHE/data) durably, before their renames. Error only if
  // neither the log nor the fallback sync worked.
  stage::Status record(std::span<const std::string> names);
  // The recorded names were renamed (or given up): they may be synced from now on.
  void published(std::span<const std::string> names);
  // Syncs every published copy now and drops its name from the log.
  void flush();
  // Stops the background thread, flushes, removes the log if nothing is left. Idempotent.
  void close();
  [[nodiscard]] uint64_t pending() const { return unsynced_count_.load(); }  // recorded, not synced
  [[nodiscard]] uint64_t synced() const { return synced_count_.load(); }     // synced so far
  // Waits until at least n copies were synced (by the background thread or flush()), at most
  // timeout. Returns whether they were.
  bool wait_synced(uint64_t n, std::chrono::milliseconds timeout);

 private:
  void run();
  bool append_locked(const std::string& bytes);  // the records, synced; false: not written
  bool rewrite_locked();  // a new log of header_ + in_flight_ + pending_, durable; false: none
  void count_locked() { unsynced_count_ = in_flight_.size() + pending_.size(); }

  int root_fd_;
  int data_fd_;
  std::chrono::milliseconds delay_;
  std::function<void(const std::string&)> on_removed_;
  const SyncFs syncfs_;
  const std::string header_;  // the first record: magic and boot id
  mutable std::mutex m_;  // guards everything below
  std::condition_variable cv_;
  stage::Fd log_;
  uint64_t log_size_ = 0;
  bool warned_ = false;
  std::multiset<std::string> in_flight_;  // recorded, not renamed yet: never synced
  std::vector<std::string> pending_;      // renamed, not synced yet, in publication order
  std::atomic<uint64_t> unsynced_count_{0};
  std::atomic<uint64_t> synced_count_{0};
  bool closing_ = false;  // close() began: the thread stops, records fall back to syncing
  std::mutex flush_m_;  // one flush at a time
  std::thread thread_;
};

}  // namespace stagefs
