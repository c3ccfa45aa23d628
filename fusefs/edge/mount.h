// The mount: a libfuse session over a StageFsCore, and its life cycle. fuse_ops.cc, the only
// file that includes fuse_lowlevel.h, holds the callbacks (each unpacks the request, calls one
// core method and replies; errors through Error::to_errno(), the one errno table; no
// exception reaches libfuse) and the session calls that mount.cc makes (fuse_ops.h).
// How an open's reads are served is read_mode.h; stagectl's requests are stagectl_channel.h.
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
#include <shared_mutex>
#include <string>

#include "fusefs/core/core.h"
#include "fusefs/edge/fuse_ops.h"
#include "fusefs/edge/passthrough.h"
#include "fusefs/edge/read_mode.h"

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
  // A regular file on the cache's filesystem (the daemon gives CACHE/.lock): registered once
  // as a backing file, it tells how reads of complete copies will be served before an open of
  // one did (read_path()). Empty: only opens tell.
  std::string backing_probe;
};

class FuseMount final : public EdgeMount {
 public:
  static stage::Result<std::unique_ptr<FuseMount>> create(StageFsCore& core, const MountOptions& opt);
  ~FuseMount() override;
  FuseMount(const FuseMount&) = delete;
  FuseMount& operator=(const FuseMount&) = delete;

  stage::Status loop();
  void unmount();
  // How this mount serves reads of complete copies: what the last open of one found, else
  // (before any such open: a file may have been read during its copy, through the daemon) what
  // registering the backing_probe file finds. Unknown only before the kernel's first request.
  // Thread-safe.
  [[nodiscard]] ReadPath read_path();
  [[nodiscard]] const MountOptions& options() const { return opt_; }

  // What the callbacks use (EdgeMount, fuse_ops.h).
  StageFsCore& core() override { return core_; }
  Passthrough& passthrough() override { return pt_; }
  [[nodiscard]] double attr_timeout() const override { return opt_.attr_timeout; }
  [[nodiscard]] double entry_timeout() const override { return opt_.entry_timeout; }
  std::shared_lock<std::shared_mutex> reply_guard() override {
    std::shared_lock lk(reply_m_);
    if (loop_done_) lk.unlock();
    return lk;
  }
  ReadChoice open_read_mode(uint64_t node, int file_fd, const OpenFacts& facts) override;
  void close_read_mode(uint64_t node, const ReadChoice& c) override { modes_.close(node, c); }

 private:
  FuseMount(StageFsCore& core, const MountOptions& opt);
  void note_read_path(ReadPath p);
  // Whether the kernel takes a backing file on the cache's filesystem (unknown without a probe file).
  [[nodiscard]] ReadPath probe_read_path() const;
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
  NodeReadModes modes_;
};

// Why a mount point cannot be used (missing, not a directory, not empty, already mounted, a
// stale FUSE mount of a dead daemon: with the command that clears it), or empty if it can.
std::string check_mountpoint(const std::string& path);

}  // namespace stagefs
