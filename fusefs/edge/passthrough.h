// Kernel FUSE passthrough (Linux 6.9+) on libfuse 3.14, which has no API for it.
// libfuse 3.14 lets the daemon supply its own read/writev on /dev/fuse
// (fuse_session_custom_io); these hooks
//   - read:   notice whether the kernel's INIT request offers FUSE_PASSTHROUGH (flags2 bit 5);
//   - writev: in the INIT reply, accept it (flags2 |= passthrough, max_stack_depth = 2);
//             in an OPEN reply armed by this thread, set FOPEN_PASSTHROUGH and the backing id;
//   - splice_send: plain splice(), so libfuse keeps splicing replies of files that are not
//             passed through (without it, custom io would turn splice off).
// A file is passed through by registering its fd with FUSE_DEV_IOC_BACKING_OPEN (needs
// CAP_SYS_ADMIN) and arming the next OPEN reply of the calling thread; the kernel then serves
// reads from the backing file and no READ reaches the daemon. Anything refused (old kernel,
// no privilege, a backing file on a stacked filesystem) falls back to splice per file.
// The constants are defined here: Debian 12's kernel headers (6.1) lack them.
// Thread-safe: the hooks run on every FUSE worker thread; state is atomic or thread_local.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>

namespace stagefs {

class Passthrough {
 public:
  explicit Passthrough(bool wanted) : wanted_(wanted) {}

  static ssize_t read_hook(int fd, void* buf, size_t len, void* self);
  static ssize_t writev_hook(int fd, struct iovec* iov, int count, void* self);
  static ssize_t splice_send_hook(int fdin, off_t* offin, int fdout, off_t* offout, size_t len,
                                  unsigned int flags, void* self);

  // After INIT: the kernel offered passthrough and our INIT reply accepted it.
  [[nodiscard]] bool active() const { return active_.load(); }
  // Our INIT reply went out: active() is final.
  [[nodiscard]] bool initialized() const { return initialized_.load(); }
  [[nodiscard]] bool offered() const { return offered_.load(); }
  // Registers file_fd as a backing file on the /dev/fuse fd; the id, or -errno.
  int open_backing(int fuse_fd, int file_fd) const;
  void close_backing(int fuse_fd, int backing_id) const;
  // The next OPEN reply this thread writes carries FOPEN_PASSTHROUGH with this backing id.
  static void arm_open_reply(int backing_id);
  static void disarm();

 private:
  bool wanted_;
  std::atomic<bool> offered_{false};
  std::atomic<bool> active_{false};
  std::atomic<bool> initialized_{false};
  std::atomic<uint64_t> init_unique_{0};
};

}  // namespace stagefs
