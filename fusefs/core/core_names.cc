// StageFsCore's names (core.h): lookups, attributes and links, each resolved as the caller,
// and the access check as the caller that every room of the core uses.
#include <fcntl.h>
#include <unistd.h>

#include "bcast/io/store.h"
#include "fusefs/base/beneath.h"
#include "fusefs/core/core.h"

namespace stagefs {

using stage::Error;
using stage::Result;

Result<struct stat> StageFsCore::stat_rel(const std::string& rel) const {
  auto fd = open_beneath(root_.get(), rel, O_PATH);
  if (!fd) return fd.error();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return stage::sys_error(errno, "stat source", rel);
  return st;
}

namespace {
// One component a directory can hold: what lookup() resolves, never a path.
bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.size() <= 255;
}
}  // namespace

Result<struct stat> StageFsCore::stat_as_caller(const std::string& rel, const Caller& who) const {
  auto fd = resolve_as_caller(rel, O_PATH, 0, who);
  if (!fd) return fd.error();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return stage::sys_error(errno, "stat source", rel);
  return st;
}

Result<std::pair<uint64_t, struct stat>> StageFsCore::lookup(uint64_t parent, const std::string& name,
                                                             const Caller& who) {
  if (!plain_name(name)) return stage::sys_error(name.size() > 255 ? ENAMETOOLONG : ENOENT, "lookup", name);
  auto prel = path_of(parent);
  if (!prel) return prel.error();
  const std::string rel = stage::join_path(*prel, name);
  auto st = stat_as_caller(rel, who);
  if (!st) return st.error();
  auto id = nodes_.note_lookup(parent, name, *st, who.uid);
  if (!id) return id.error();
  xattrs_.observe(*id, stage::to_ns(st->st_ctim), st->st_dev);
  return std::pair{*id, *st};
}

std::vector<std::optional<std::pair<uint64_t, struct stat>>> StageFsCore::lookup_many(
    uint64_t parent, std::span<const DirEntry> entries, const Caller& who) {
  std::vector<std::optional<std::pair<uint64_t, struct stat>>> out(entries.size());
  auto prel = path_of(parent);
  if (!prel) return out;
  // As the caller, as lookup() resolves: the directory (search permission on the way), then
  // each name in it (search permission on the directory itself). Each name is one component,
  // never followed if it is a symlink.
  std::optional<AsCaller> as;
  if (checked_as_caller(who) && !as.emplace(who).ok()) return out;
  auto dfd = open_beneath(root_.get(), *prel, O_PATH | O_DIRECTORY);
  if (!dfd) return out;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string& name = entries[i].name;
    if (!plain_name(name)) continue;
    struct stat st {};
    if (::fstatat(dfd->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    auto id = nodes_.note_lookup(parent, name, st, who.uid);
    if (!id) continue;  // past the caller's budget: no attributes (its LOOKUP says why)
    xattrs_.observe(*id, stage::to_ns(st.st_ctim), st.st_dev);
    out[i] = std::pair{*id, st};
  }
  return out;
}

void StageFsCore::forget(uint64_t id, uint64_t n) {
  for (const uint64_t gone : nodes_.forget(id, n)) xattrs_.forget(gone);
}

Result<struct stat> StageFsCore::getattr(uint64_t id, const Caller& who) {
  auto info = nodes_.info(id);
  if (!info) return info.error();
  const NodeTable::Info& node = *info;
  auto st = stat_as_caller(node.rel, who);
  if (st) xattrs_.observe(id, stage::to_ns(st->st_ctim), st->st_dev);
  const stage::FileMeta& v = node.version;
  if (v == stage::FileMeta{}) return st;  // not a regular file's id
  if (!st && st.error().to_errno() != ENOENT && st.error().to_errno() != ENOTDIR) return st;
  if (!st || !S_ISREG(st->st_mode)) {
    // The path now holds something else, or nothing, but the id's holders still read its copy:
    // another type would make the kernel mark their inode bad (EIO on every read).
    struct stat own {};
    own.st_mode = S_IFREG | v.mode;
    own.st_nlink = 1;
    own.st_uid = node.uid;
    own.st_gid = node.gid;
    own.st_dev = static_cast<dev_t>(v.dev);
    own.st_blksize = 4096;
    st = own;
  } else if (stage::meta_from_stat(*st) == v) {
    return st;
  }
  // The id stands for an older version than the path's, which its holders keep reading. Its
  // size and times stay that version's: the kernel sizes reads by these attributes, and a new
  // size would cut the old bytes short or pad them.
  st->st_size = static_cast<off_t>(v.size);
  st->st_blocks = static_cast<blkcnt_t>((v.size + 511) / 512);
  st->st_mtim = stage::from_ns(v.mtime_ns);
  st->st_ctim = stage::from_ns(v.ctime_ns);
  st->st_ino = static_cast<ino_t>(v.ino);
  return st;
}

Result<std::string> StageFsCore::readlink(uint64_t id, const Caller& who) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto fd = resolve_as_caller(*rel, O_PATH, 0, who);
  if (!fd) return fd.error();
  std::string buf(4096, '\0');
  const ssize_t n = ::readlinkat(fd->get(), "", buf.data(), buf.size());
  if (n < 0) return stage::sys_error(errno, "readlink", *rel);
  buf.resize(static_cast<size_t>(n));
  return buf;
}

Result<stage::Fd> StageFsCore::open_as_caller(const std::string& rel, int flags, int mask,
                                              const Caller& who) const {
  auto fd = resolve_as_caller(rel, flags, mask, who);
  if (!fd && (fd.error().to_errno() == EACCES || fd.error().to_errno() == EPERM)) ++counters_.denied;
  return fd;
}

Result<stage::Fd> StageFsCore::resolve_as_caller(const std::string& rel, int flags, int mask,
                                                 const Caller& who) const {
  if (!checked_as_caller(who)) return open_beneath(root_.get(), rel, flags);
  std::optional<Result<stage::Fd>> fd;  // unset: the credentials could not be taken
  int err = 0;
  {
    const AsCaller as(who);
    if (as.ok()) {
      fd = open_beneath(root_.get(), rel, flags);
      if (*fd && mask != 0) err = access_.check((*fd)->get(), mask);
    }
  }
  if (!fd) return stage::sys_error(EACCES, "cannot take the caller's credentials to check access", rel);
  if (!*fd) {
    err = fd->error().to_errno();
    if (err != EACCES && err != EPERM) return fd->error();
  }
  if (err == 0) return std::move(*fd);
  return stage::sys_error(err, "access (checked against the source)", rel);
}

bool StageFsCore::checked_as_caller(const Caller& who) {
  return who.uid != 0 && ::geteuid() == 0;  // root, and a daemon that reads as its own user, are not
}

bool StageFsCore::may_read(const std::string& rel, const Caller& who) const {
  if (who.uid == 0) return true;
  if (::geteuid() != 0) return who.uid == ::geteuid();
  return resolve_as_caller(rel, O_PATH, R_OK, who).ok();
}

}  // namespace stagefs
