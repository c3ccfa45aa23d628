// What fuse_ops.cc, the one file that includes fuse_lowlevel.h, offers the mount's life cycle
// (mount.cc): a libfuse session serving the callbacks, behind libfuse's opaque struct. Each
// call is one libfuse call (or two); mount.cc holds the decisions around them. And what the
// callbacks see of their mount (EdgeMount, which FuseMount implements): the edge includes
// nothing of mount.h, so the two files do not include each other.
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <span>
#include <string>

#include "fusefs/core/core.h"
#include "fusefs/edge/passthrough.h"
#include "fusefs/edge/read_mode.h"

struct fuse_session;

namespace stagefs {

// The session's userdata, as the callbacks use it. Thread-safe.
class EdgeMount {
 public:
  virtual ~EdgeMount() = default;
  virtual StageFsCore& core() = 0;
  virtual Passthrough& passthrough() = 0;
  // Seconds the kernel may cache attributes, and name lookups.
  [[nodiscard]] virtual double attr_timeout() const = 0;
  [[nodiscard]] virtual double entry_timeout() const = 0;
  // Held while a reply is written from outside the session's workers; empty (false) once the
  // session loop ended.
  virtual std::shared_lock<std::shared_mutex> reply_guard() = 0;
  // How an open of node is served (read_mode.h), counted until close_read_mode; file_fd is
  // what a new backing file registers.
  virtual ReadChoice open_read_mode(uint64_t node, int file_fd, const OpenFacts& facts) = 0;
  virtual void close_read_mode(uint64_t node, const ReadChoice& c) = 0;
};

namespace fuse_edge {

// A session whose callbacks serve `m` (its userdata), from libfuse's command line (program
// name, -o options, -d); nullptr if libfuse refused it.
fuse_session* new_session(EdgeMount& m, std::span<const char*> argv);
// 0, or -1 (fusermount3 printed why).
int mount_session(fuse_session* se, const std::string& mountpoint);
// Reads and writes of /dev/fuse go through the passthrough hooks (passthrough.h), which find
// the EdgeMount as the session's userdata; false if libfuse refused them.
bool use_passthrough_io(fuse_session* se);
int session_fd(fuse_session* se);
// Serves requests on up to max_threads workers, kept once started, until the session ends:
// 0 or -errno.
int run_loop(fuse_session* se, unsigned max_threads);
// Makes run_loop return (thread-safe).
void leave_loop(fuse_session* se);
void unmount_session(fuse_session* se);
void destroy_session(fuse_session* se);

}  // namespace fuse_edge
}  // namespace stagefs
