// NodeCache: the one owner of a node's cache directory (CACHE, given by --cache).
//
// The daemon runs as root on nodes many users share, so the cache path is hostile input:
//   - open() resolves CACHE to its canonical path and checks every ancestor: each must be a
//     directory owned by root or by us, and one that others may write to must be sticky (like
//     /tmp), in which case the next component must be ours. CACHE itself must not be a
//     symlink and must be owned by the daemon's user; a missing CACHE (and missing ancestors)
//     is created by the daemon, 0700, with mkdirat relative to its parent's fd. Anything
//     else is refused with a message that names the path and the fix. Nothing outside CACHE
//     is ever created or chmodded.
//   - CACHE is made 0700 and locked (CACHE/.lock, flock): one daemon per cache. The holder
//     writes who it is into the lock file (a refusal quotes it), which also dates the cache's
//     last use (the file's mtime: the admin kit's epilog purges by it).
//   - One sweep at open walks CACHE/data without following symlinks and removes what the
//     daemon did not write: temporary files of dead writers, symlinks, special files, and
//     entries owned by anyone else (planted while the directory was wider, or by an earlier
//     careless setup). Directories are narrowed to 0700. After the sweep only root can add
//     entries, so a copy owned by us with one link was written by a daemon.
//   - data_fd() is held for the mount's life; the store reaches the cache only through
//     store_root() = "/proc/self/fd/N", so a path never resolves through a CACHE that was
//     renamed or replaced. A CACHE removed under a live mount (rm -rf) is detected by
//     alive(): opens of uncached files then fail with a message; nothing is recreated.
//   - open_current() is the validity rule: the copy at rel (resolved beneath data_fd, no
//     symlinks) is a regular file owned by us with one link whose recorded origin matches the
//     source's version (size, mtime, ctime and, unless set_source_version(no_inode), inode).
//     A copy that matches on everything but the inode is logged once per mount: the source's
//     inode numbers may not be stable (--source-version).
//   - The index: every copy with its allocated bytes and last use (the copy's
//     atime, set on each hit, so the order survives restarts), and pins (files open on
//     this node or being written). make_room() evicts least recently used, unpinned copies
//     until a new copy fits under --cache-size and in the filesystem's free space. store()
//     is the LocalStore handed to the engine: PosixStore, except that free_bytes() is what
//     the limit leaves, so the engine's collective free-space check (every node agrees
//     before a byte moves) counts the limit and what eviction freed on each node. A copy
//     costs its data plus copy_overhead() (its origin xattr's block, measured at open).
//   - Copies of a batch are published before their data is on disk; the UnsyncedLog
//     (cache/unsynced.h, CACHE/unsynced) records them first and syncs them in the background
//     about sync_after later. open() acts on a log an earlier daemon left (after the sweep):
//     after a reboot its copies are removed, otherwise synced; an unreadable log empties
//     the cache.
//   - Admission (cache/admit.cc): before a transfer or a batch, on every node, a stale copy
//     goes and room is made; after it, what was published joins the index. What a batch
//     takes is one rule, batch_eligible() (batch_rules.h). Trust in a copy's bytes (its CRC
//     checked once per mount) is CopyChecker's (cache/verify.h), which NodeCopies owns.
// Thread-safe after open(): the index has its own mutex; the UnsyncedLog its own (and a
// thread that syncs in the background); the rest only reads the held descriptors.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bcast/io/error.h"
#include "bcast/io/fd.h"
#include "bcast/io/source.h"
#include "bcast/io/store.h"
#include "fusefs/cache/unsynced.h"

namespace stagefs {

struct SweepCounts {
  int temps = 0;      // temporary files of interrupted writers
  int untrusted = 0;  // entries the daemon did not write (removed)
};

struct CacheUsage {
  uint64_t bytes = 0;  // allocated bytes of the indexed copies
  uint64_t limit = 0;  // 0: no limit beyond the filesystem's free space
  uint64_t files = 0;
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  uint64_t unsynced = 0;      // published copies whose data is not known to be on disk yet
  uint64_t synced_later = 0;  // copies synced in the background so far
  uint64_t pinned_bytes = 0;  // bytes of the indexed copies held open on this node (never evicted)
  uint64_t pinned_files = 0;  // ... and how many copies
};

// The room a new copy of `need` bytes has (NodeCache::room()).
struct Room {
  uint64_t need = 0;
  uint64_t free = 0;       // what the limit and the filesystem leave now
  uint64_t evictable = 0;  // copies make_room() may evict (not open, not the file itself)
  uint64_t pinned = 0;     // copies held open on this node: evictable once released
  uint64_t pinned_files = 0;
  [[nodiscard]] bool fits_now() const { return free + evictable >= need; }
  [[nodiscard]] bool fits_once_released() const { return free + evictable + pinned >= need; }
};

class NodeCache {
 public:
  // Creates or checks CACHE, locks it, sweeps CACHE/data, acts on an unsynced log an earlier
  // daemon left. Returns a message on refusal. sync_after: how long a batch's copies may stay unsynced (0:
  // synced before they are published).
  static stage::Result<std::unique_ptr<NodeCache>> open(
      const std::string& dir, stage::StoreOptions store_opt = {.direct_io = false, .parent_mode = 0700},
      std::chrono::milliseconds sync_after = kDefaultSyncAfter);
  static constexpr std::chrono::milliseconds kDefaultSyncAfter{5000};
  ~NodeCache();

  [[nodiscard]] const std::string& dir() const { return dir_; }  // canonical CACHE
  [[nodiscard]] int data_fd() const { return data_.get(); }
  // The path the store writes under: /proc/self/fd/<data_fd>.
  [[nodiscard]] std::string store_root() const;
  [[nodiscard]] const SweepCounts& swept() const { return swept_; }
  [[nodiscard]] const RecoveryCounts& recovered() const { return recovered_; }
  // Syncs every unsynced copy now (tests; the daemon's stop does it through the destructor).
  void sync_unsynced() { unsynced_->flush(); }
  // Error when CACHE/data was removed (or CACHE replaced) under the running mount.
  [[nodiscard]] stage::Status alive() const;
  // The copy of rel when it is current for a source with stat src (see above); copy_st, when
  // given, receives the copy's stat.
  [[nodiscard]] stage::Result<stage::Fd> open_current(const std::string& rel, const struct stat& src,
                                                      struct stat* copy_st = nullptr) const;
  // Removes a copy of rel that is not current for src (old holders keep their descriptor:
  // the file is unlinked, never overwritten). Returns true if something was removed.
  bool remove_stale(const std::string& rel, const struct stat& src);
  // Both of the above in one look (a batch's plan, per file): true when rel's copy is current
  // for src; otherwise a copy that is there but stale is removed, and false returned.
  bool keep_current(const std::string& rel, const struct stat& src);
  // Whether the cache holds directory rel_dir ("" is data itself): when it does not, no copy
  // of its files is there either, and a batch's plan need not look for each one.
  [[nodiscard]] bool has_dir(const std::string& rel_dir) const;
  // How many times open_current() read a copy's origin xattr (tests: the memo in the index).
  [[nodiscard]] uint64_t origin_reads() const { return origin_reads_.load(); }
  // Removes the copy of rel (a corrupted or unreadable one) if it is still the file `copy`
  // (device and inode): a copy published at rel since then is left alone.
  void remove(const std::string& rel, const struct stat& copy);

  // What identifies a source version in the validity rule (set once, before use).
  void set_source_version(stage::SourceVersion rule) { rule_ = rule; }

  // ---- index, capacity, pins
  void set_limit(uint64_t bytes) {
    std::lock_guard lk(m_);
    limit_ = bytes;
  }
  [[nodiscard]] CacheUsage usage() const;
  // A cache hit: most recently used now. copy_st (the copy's stat, when the caller has it):
  // the copy's atime is left alone when it is under a minute old (one futimens per copy and
  // minute, not per open: the order across restarts needs no finer grain).
  void touch(const std::string& rel, int fd, const struct stat* copy_st = nullptr);
  void added(const std::string& rel);  // a copy of rel was published (or replaced)
  // A batch published `names` (plain names) in rel_dir: each joins the index, as added()
  // does, with one fstatat per name under one directory fd. Returns the stat of each copy
  // found (regular files only), for the caller's verified set.
  std::vector<struct stat> added_in(const std::string& rel_dir, const std::vector<std::string>& names);
  void pin(const std::string& rel);
  void unpin(const std::string& rel);
  // Space made evictable or free: a copy's last pin released, a copy evicted or removed on
  // request. space_epoch() counts these; the listener (one, set by the core) is called after
  // each, from the thread that freed it, without the index lock: it must be quick.
  [[nodiscard]] uint64_t space_epoch() const { return space_epoch_.load(); }
  void set_space_listener(std::function<void()> fn);
  // What a new copy of rel needing `need` bytes has now (see Room).
  [[nodiscard]] Room room(const std::string& rel, uint64_t need) const;
  // What one copy takes on disk beyond its data (the origin xattr's block on ext4 with small
  // inodes; 0 where xattrs live in the inode), measured at open(). A transfer's need is its
  // data plus this per file.
  [[nodiscard]] uint64_t copy_overhead() const { return copy_overhead_; }
  // The overhead of the copies about to be written (files x copy_overhead()): store()'s
  // free_bytes() leaves it out, so that the engine's free-space check counts it too. Set
  // before a transfer, 0 after it (the service thread).
  void set_pending_overhead(uint64_t bytes) { pending_overhead_ = bytes; }
  // Evicts LRU unpinned copies (never `rel` itself) until need more bytes fit under the
  // limit and in the filesystem. Error (ENOSPC, with both sizes) when they cannot, or, with
  // !may_evict, when they do not fit under the limit as the cache is.
  stage::Status make_room(const std::string& rel, uint64_t need, bool may_evict = true);
  // Removes rel's copy unless it is pinned (EBUSY) or absent (ENOENT).
  // source: the source file whose owner asked (dev, inode). A copy recorded as made from
  // another file (the path was swapped since the owner check) is left alone: EBUSY.
  stage::Status evict(const std::string& rel, const struct stat& source);
  // ---- admission (cache/admit.cc): called on every node by the group's service thread,
  // through NodeCopies (its Admission), around each transfer or batch. source_root: SOURCE_DIR's fd.
  // Before a transfer of rel: removes an outdated copy, then makes room for the new one (an
  // error, logged: no room under the limit; this node then relays without writing). With
  // !may_evict (a background transfer: no open asked for it) no copy is evicted for it.
  stage::Status admit_transfer(int source_root, const std::string& rel, bool may_evict = true);
  // Before a batch of dir's slice (its files as batch_eligible() takes them, at most max_size
  // bytes each): keeps current copies, removes stale ones, and makes room for the others in
  // one make_room (none when !may_evict: a prefetch never evicts).
  void admit_batch(int source_root, const std::string& dir, uint64_t max_size,
                   const stage::SelectionSlice& slice, bool may_evict);
  // After a transfer of rel (whatever its outcome): its copy, if published, joins the index.
  void transfer_done(const std::string& rel);
  // After a batch of dir: the copies this node published join the index (added_in's result).
  std::vector<struct stat> batch_done(const std::string& dir, const std::vector<std::string>& published);
  [[nodiscard]] stage::LocalStore& store() { return *store_; }
  [[nodiscard]] uint64_t fs_free() const;

 private:
  class LimitedStore;
  struct Entry {
    uint64_t bytes = 0;
    int64_t last_use = 0;  // ns since the epoch
    // The copy's recorded origin as open_current() last read it, valid while the copy's inode
    // and ctime are those below (any write, xattr change or rename moves its ctime): a warm
    // open then needs no getxattr (ext4's was a tenth of the daemon's CPU in a warm pass).
    mutable std::optional<stage::Origin> origin;
    mutable uint64_t origin_dev = 0, origin_ino = 0;
    mutable int64_t origin_ctime_ns = 0;
  };
  NodeCache() = default;
  void index_tree(int dirfd, const std::string& prefix);
  void index_put(const std::string& rel, const struct stat* st, int64_t now_ns);  // st null: gone
  // The one look behind keep_current() and remove_stale(): a current copy, none, a stale one
  // removed, or a stale one that could not be (not a regular file).
  enum class Look { current, absent, removed, kept };
  Look look_or_remove(const std::string& rel, const struct stat& src);

  mutable std::mutex m_;  // guards the index below
  std::map<std::string, Entry> index_;
  std::map<std::string, int> pins_;
  uint64_t bytes_ = 0;
  uint64_t limit_ = 0;
  uint64_t evictions_ = 0;
  uint64_t evicted_bytes_ = 0;
  uint64_t copy_overhead_ = 0;
  std::atomic<uint64_t> pending_overhead_{0};
  std::atomic<uint64_t> space_epoch_{0};
  std::function<void()> space_listener_;  // guarded by m_
  void space_freed();                     // called without m_
  std::unique_ptr<stage::PosixStore> base_;
  std::unique_ptr<stage::LocalStore> store_;
  std::string dir_;
  stage::Fd root_;  // CACHE (O_DIRECTORY)
  stage::Fd data_;  // CACHE/data (O_DIRECTORY)
  stage::Fd lock_;
  struct stat data_st_ {};
  mutable std::atomic<uint64_t> origin_reads_{0};
  stage::SourceVersion rule_ = stage::SourceVersion::full;
  mutable std::atomic<bool> told_inode_only_{false};  // the inode warning, once per mount
  uid_t euid_ = ::geteuid();                          // the daemon's user: the owner of every copy it wrote
  SweepCounts swept_;
  RecoveryCounts recovered_;
  std::unique_ptr<UnsyncedLog> unsynced_;  // last: stopped (and flushed) before the fds close
};

// Creates missing directories of `path` (0700, relative to each parent's fd, no symlinks
// followed) and checks that no ancestor lets another user replace a component. Exposed for
// tests. Returns an O_DIRECTORY fd of path.
stage::Result<stage::Fd> open_private_dir(const std::string& path);

}  // namespace stagefs
