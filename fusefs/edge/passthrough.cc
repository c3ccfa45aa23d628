#include "fusefs/edge/passthrough.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace stagefs {
namespace {

// From the kernel's include/uapi/linux/fuse.h (7.40, Linux 6.9).
constexpr uint32_t kOpInit = 26;
constexpr uint64_t kInitExt = 1ULL << 30;
constexpr uint64_t kPassthroughFlags2 = 1ULL << 5;  // FUSE_PASSTHROUGH = 1ULL << 37
constexpr uint32_t kFopenPassthrough = 1U << 7;
constexpr uint32_t kMaxStackDepth = 2;  // FILESYSTEM_MAX_STACK_DEPTH: cache may sit on overlayfs

struct InHeader {
  uint32_t len, opcode;
  uint64_t unique, nodeid;
  uint32_t uid, gid, pid;
  uint16_t total_extlen, padding;
};
struct InitIn {
  uint32_t major, minor, max_readahead, flags, flags2;
  uint32_t unused[11];
};
struct OutHeader {
  uint32_t len;
  int32_t error;
  uint64_t unique;
};
struct InitOut {
  uint32_t major, minor, max_readahead, flags;
  uint16_t max_background, congestion_threshold;
  uint32_t max_write, time_gran;
  uint16_t max_pages, map_alignment;
  uint32_t flags2, max_stack_depth;
  uint32_t unused[6];
};
struct OpenOut {
  uint64_t fh;
  uint32_t open_flags;
  int32_t backing_id;
};
struct BackingMap {
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
static_assert(sizeof(InHeader) == 40 && sizeof(InitOut) == 64 && sizeof(OpenOut) == 16);

#ifndef FUSE_DEV_IOC_BACKING_OPEN
#define FUSE_DEV_IOC_BACKING_OPEN _IOW(229, 1, struct BackingMap)
#define FUSE_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)
#endif

thread_local int armed_backing_id = -1;

}  // namespace

ssize_t Passthrough::read_hook(int fd, void* buf, size_t len, void* self) {
  auto* pt = static_cast<Passthrough*>(self);
  const ssize_t n = ::read(fd, buf, len);
  if (n >= static_cast<ssize_t>(sizeof(InHeader) + sizeof(InitIn))) {
    InHeader h{};
    std::memcpy(&h, buf, sizeof h);
    if (h.opcode == kOpInit) {
      InitIn in{};
      std::memcpy(&in, static_cast<char*>(buf) + sizeof h, sizeof in);
      const bool ext = (in.flags & kInitExt) != 0;
      pt->offered_ = ext && (in.flags2 & kPassthroughFlags2) != 0;
      pt->init_unique_ = h.unique;
    }
  }
  return n;
}

ssize_t Passthrough::writev_hook(int fd, struct iovec* iov, int count, void* self) {
  auto* pt = static_cast<Passthrough*>(self);
  if (count >= 2 && iov[0].iov_len == sizeof(OutHeader)) {
    OutHeader h{};
    std::memcpy(&h, iov[0].iov_base, sizeof h);
    if (h.error == 0 && h.unique != 0 && h.unique == pt->init_unique_.load() &&
        iov[1].iov_len >= sizeof(InitOut)) {
      auto* out = static_cast<InitOut*>(iov[1].iov_base);
      if (pt->wanted_ && pt->offered_) {
        out->flags |= static_cast<uint32_t>(kInitExt);
        out->flags2 |= static_cast<uint32_t>(kPassthroughFlags2);
        out->max_stack_depth = kMaxStackDepth;
        pt->active_ = true;
      }
      pt->init_unique_ = 0;
      pt->initialized_ = true;
    } else if (armed_backing_id >= 0 && h.error == 0 && iov[1].iov_len == sizeof(OpenOut)) {
      auto* out = static_cast<OpenOut*>(iov[1].iov_base);
      out->open_flags |= kFopenPassthrough;
      out->backing_id = armed_backing_id;
      armed_backing_id = -1;
    }
  }
  return ::writev(fd, iov, count);
}

ssize_t Passthrough::splice_send_hook(int fdin, off_t* offin, int fdout, off_t* offout, size_t len,
                                      unsigned int flags, void* /*self*/) {
  return ::splice(fdin, offin, fdout, offout, len, flags);
}

int Passthrough::open_backing(int fuse_fd, int file_fd) const {
  if (!active_) return -ENOTSUP;
  BackingMap map{file_fd, 0, 0};
  const int id = ::ioctl(fuse_fd, FUSE_DEV_IOC_BACKING_OPEN, &map);
  return id < 0 ? -errno : id;
}

void Passthrough::close_backing(int fuse_fd, int backing_id) const {
  auto id = static_cast<uint32_t>(backing_id);
  ::ioctl(fuse_fd, FUSE_DEV_IOC_BACKING_CLOSE, &id);
}

void Passthrough::arm_open_reply(int backing_id) {
  armed_backing_id = backing_id;
}
void Passthrough::disarm() {
  armed_backing_id = -1;
}

}  // namespace stagefs
