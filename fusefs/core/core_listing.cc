// StageFsCore's listings (core.h): one snapshot per directory version, shared by its handles
// and charged to the user who built it.
#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>

#include "fusefs/core/core.h"

namespace stagefs {

using stage::Error;
using stage::Result;

namespace {

// The file type bits of a directory entry's d_type (0: not known).
uint32_t mode_of(unsigned char d_type) {
  uint32_t mode = 0;
  switch (d_type) {
    case DT_DIR:
      mode = S_IFDIR;
      break;
    case DT_LNK:
      mode = S_IFLNK;
      break;
    case DT_REG:
      mode = S_IFREG;
      break;
    case DT_FIFO:
      mode = S_IFIFO;
      break;
    case DT_SOCK:
      mode = S_IFSOCK;
      break;
    case DT_CHR:
      mode = S_IFCHR;
      break;
    case DT_BLK:
      mode = S_IFBLK;
      break;
    default:
      mode = 0;
  }
  return mode;
}

// The entries of directory fd (closed on return), as readdir gives them.
Result<std::unique_ptr<std::vector<DirEntry>>> list_entries(stage::Fd fd, const std::string& rel) {
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) return stage::sys_error(errno, "opendir", rel);
  fd.release();  // now owned by d
  auto out = std::make_unique<std::vector<DirEntry>>();
  errno = 0;
  while (const dirent* de = ::readdir(d))
    out->push_back(DirEntry{de->d_name, de->d_ino != 0 ? de->d_ino : 1, mode_of(de->d_type)});
  const int err = errno;
  ::closedir(d);
  if (err != 0) return stage::sys_error(err, "readdir", rel);
  out->shrink_to_fit();
  return out;
}

// The memory a listing holds, as its user's budget counts it.
uint64_t listing_size(const std::vector<DirEntry>& entries) {
  uint64_t bytes = entries.capacity() * sizeof(DirEntry);
  for (const DirEntry& e : entries)
    if (e.name.capacity() > 15) bytes += e.name.capacity() + 1;  // past std::string's inline buffer
  return bytes;
}

}  // namespace

Result<DirSnapshot> StageFsCore::readdir(uint64_t id, const Caller& who) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto fd = open_as_caller(*rel, O_RDONLY | O_DIRECTORY, R_OK, who);
  if (!fd) return fd.error();
  struct stat dst {};
  if (::fstat(fd->get(), &dst) != 0) return stage::sys_error(errno, "stat directory", *rel);
  const auto key = std::tuple{*rel, static_cast<uint64_t>(dst.st_dev), static_cast<uint64_t>(dst.st_ino),
                              stage::to_ns(dst.st_mtim), stage::to_ns(dst.st_ctim)};
  {
    std::lock_guard lk(dirs_m_);
    if (auto it = dirs_.find(key); it != dirs_.end())
      if (auto snap = it->second.lock()) return snap;
  }
  auto out = list_entries(std::move(*fd), *rel);
  if (!out) return out.error();
  const uint64_t bytes = listing_size(**out);
  if (uint64_t used = 0; !budget_->charge(who.uid, bytes, used))
    return stage::sys_error(ENOMEM,
                            "opendir: the listings and names uid " + std::to_string(who.uid) +
                                " holds through the mount would take " +
                                std::to_string((used + bytes) >> 20) + " MiB, over the limit of " +
                                std::to_string(budget_->limit() >> 20) + " MiB",
                            *rel);
  DirSnapshot snap = share_listing(std::move(*out), who.uid, bytes);
  std::lock_guard lk(dirs_m_);
  for (auto it = dirs_.begin(); it != dirs_.end();)  // drop entries of freed snapshots
    it = it->second.expired() ? dirs_.erase(it) : std::next(it);
  dirs_[key] = snap;
  return snap;
}

Result<OpenDir> StageFsCore::opendir(uint64_t id, const Caller& who) {
  auto slot = handles_.take(who.uid, false);
  if (!slot) return slot.error();
  auto entries = readdir(id, who);
  if (!entries) return entries.error();
  return OpenDir{std::move(*entries), std::move(*slot)};
}

DirSnapshot StageFsCore::share_listing(std::unique_ptr<std::vector<DirEntry>> entries, uint32_t uid,
                                       uint64_t bytes) const {
  // The last handle's release frees the listing, gives the memory back to the system and to
  // its user's budget.
  return DirSnapshot(entries.release(), [budget = budget_, uid, bytes](const std::vector<DirEntry>* v) {
    const bool big = v->size() > 1000;
    delete v;
    if (big) ::malloc_trim(0);
    budget->refund(uid, bytes);
  });
}

}  // namespace stagefs
