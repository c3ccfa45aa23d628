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
//   - CACHE is made 0700 and locked (CACHE/.lock, flock): one daemon per cache.
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
//     source's size, mtime, ctime and inode.
// Thread-safe after open(): all methods only read the held descriptors.
#pragma once

#include <sys/stat.h>

#include <memory>
#include <string>

#include "bcast/error.h"
#include "bcast/fd.h"

namespace stagefs {

struct SweepCounts {
  int temps = 0;      // temporary files of interrupted writers
  int untrusted = 0;  // entries the daemon did not write (removed)
};

class NodeCache {
 public:
  // Creates or checks CACHE, locks it, sweeps CACHE/data. Returns a message on refusal.
  static stage::Result<std::unique_ptr<NodeCache>> open(const std::string& dir);

  [[nodiscard]] const std::string& dir() const { return dir_; }  // canonical CACHE
  [[nodiscard]] int data_fd() const { return data_.get(); }
  // The path the store writes under: /proc/self/fd/<data_fd>.
  [[nodiscard]] std::string store_root() const;
  [[nodiscard]] const SweepCounts& swept() const { return swept_; }
  // Error when CACHE/data was removed (or CACHE replaced) under the running mount.
  [[nodiscard]] stage::Status alive() const;
  // The copy of rel when it is current for a source with stat src (see above).
  [[nodiscard]] stage::Result<stage::Fd> open_current(const std::string& rel, const struct stat& src) const;
  // Removes a copy of rel that is not current for src (old holders keep their descriptor:
  // the file is unlinked, never overwritten). Returns true if something was removed.
  bool remove_stale(const std::string& rel, const struct stat& src) const;
  // Removes the copy of rel (a corrupted one).
  void remove(const std::string& rel) const;

 private:
  NodeCache() = default;
  std::string dir_;
  stage::Fd root_;  // CACHE (O_DIRECTORY)
  stage::Fd data_;  // CACHE/data (O_DIRECTORY)
  stage::Fd lock_;
  struct stat data_st_ {};
  SweepCounts swept_;
};

// Creates missing directories of `path` (0700, relative to each parent's fd, no symlinks
// followed) and checks that no ancestor lets another user replace a component. Exposed for
// tests. Returns an O_DIRECTORY fd of path.
stage::Result<stage::Fd> open_private_dir(const std::string& path);

}  // namespace stagefs
