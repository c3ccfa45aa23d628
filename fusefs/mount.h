// The FUSE edge: a mounted session over a StageFsCore. fuse_ops.cc is the only file that
// includes fuse_lowlevel.h; every callback there unpacks the request, calls one core method
// and replies (errors through Error::to_errno(), the one errno table). No exception reaches
// libfuse.
//
// Life cycle (thread-safe where noted):
//   FuseMount::create()  mount at the mount point (fails with a clear message on a stale or
//                        busy mount point, or naming what blocks a non-root mount); installs
//                        the passthrough hooks
//   loop()               serve requests on worker threads until unmounted (blocking; one
//                        thread calls it)
//   unmount()            thread-safe, idempotent: leave the loop and detach the mount
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "fusefs/core.h"
#include "fusefs/passthrough.h"

namespace stagefs {

struct MountOptions {
  std::string mountpoint;
  double attr_timeout = 3600;   // seconds the kernel may cache attributes
  double entry_timeout = 3600;  // ... and name lookups
  bool passthrough = true;      // try kernel passthrough (only with CAP_SYS_ADMIN: privilege.h)
  bool allow_other = true;      // let every user reach the mount (permissions still apply), where
                                // fusermount3 grants it (root, user_allow_other): privilege.h
  int max_threads = 16;
  bool debug = false;
};

enum class ReadPath { unknown, passthrough, splice };
const char* read_path_name(ReadPath p);

class FuseMount {
 public:
  static stage::Result<std::unique_ptr<FuseMount>> create(StageFsCore& core, const MountOptions& opt);
  ~FuseMount();
  FuseMount(const FuseMount&) = delete;
  FuseMount& operator=(const FuseMount&) = delete;

  stage::Status loop();
  void unmount();
  // How this mount serves reads (known after the first open).
  [[nodiscard]] ReadPath read_path() const { return read_path_.load(); }
  [[nodiscard]] const MountOptions& options() const { return opt_; }

  // Used by the callbacks (fuse_ops.cc).
  StageFsCore& core() { return core_; }
  Passthrough& passthrough() { return pt_; }
  int fuse_fd() const { return fuse_fd_; }
  void note_read_path(ReadPath p);
  // Held while a reply is written from outside the session's workers; empty (false) once the
  // session loop ended.
  std::shared_lock<std::shared_mutex> reply_guard() {
    std::shared_lock lk(reply_m_);
    if (loop_done_) lk.unlock();
    return lk;
  }
  // The kernel allows one backing file per inode while it is open in passthrough mode: every
  // open of a node shares one refcounted backing id. Returns the id, or -errno.
  // Returns -EBUSY while the node has cached-mode handles open (begin_live): the kernel
  // refuses a passthrough open of an inode that has cached-mode opens (EIO to the caller).
  // The handle is then a spliced, cached-mode one too, and counted as such (release it with
  // end_live).
  int acquire_backing(uint64_t node, int fd);
  void release_backing(uint64_t node);
  // A cached-mode handle of a node that may get passthrough opens (one opened during the
  // copy): counted per node. false if the node has passthrough handles open (the kernel
  // would refuse the cached-mode open; nothing counted).
  bool begin_live(uint64_t node);
  void end_live(uint64_t node);

 private:
  FuseMount(StageFsCore& core, const MountOptions& opt) : core_(core), opt_(opt), pt_(opt.passthrough) {}
  StageFsCore& core_;
  MountOptions opt_;
  Passthrough pt_;
  struct fuse_session* se_ = nullptr;
  int fuse_fd_ = -1;
  std::atomic<bool> unmounted_{false};
  std::atomic<bool> loop_done_{false};
  std::shared_mutex reply_m_;  // replies from outside the workers vs. the end of the loop
  std::atomic<ReadPath> read_path_{ReadPath::unknown};
  std::atomic<bool> logged_fallback_{false};
  std::mutex backing_m_;                                       // guards backing_
  std::unordered_map<uint64_t, std::pair<int, int>> backing_;  // node -> (backing id, opens)
  std::unordered_map<uint64_t, int> live_opens_;               // node -> cached-mode live handles
};

// Why a mount point cannot be used (missing, not a directory, not empty, already mounted, a
// stale FUSE mount of a dead daemon: with the command that clears it), or empty if it can.
std::string check_mountpoint(const std::string& path);

}  // namespace stagefs
