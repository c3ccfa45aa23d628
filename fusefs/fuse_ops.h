// What fuse_ops.cc, the one file that includes fuse_lowlevel.h, offers the mount's life cycle
// (mount.cc): a libfuse session serving the callbacks, behind libfuse's opaque struct. Each
// call is one libfuse call (or two); mount.cc holds the decisions around them.
#pragma once

#include <span>
#include <string>

struct fuse_session;

namespace stagefs {

class FuseMount;

namespace fuse_edge {

// A session whose callbacks serve `m` (its userdata), from libfuse's command line (program
// name, -o options, -d); nullptr if libfuse refused it.
fuse_session* new_session(FuseMount& m, std::span<const char*> argv);
// 0, or -1 (fusermount3 printed why).
int mount_session(fuse_session* se, const std::string& mountpoint);
// Reads and writes of /dev/fuse go through the passthrough hooks (passthrough.h), which find
// the FuseMount as the session's userdata; false if libfuse refused them.
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
