#include "fusefs/base/beneath.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "bcast/io/store.h"
#include "fusefs/base/batch_rules.h"

namespace stagefs {

stage::Result<stage::Fd> open_beneath(int root_fd, const std::string& rel, int flags) {
  if (!rel.empty() && !stage::is_safe_relative(rel)) return stage::sys_error(EINVAL, "unsafe path", rel);
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC | O_NOFOLLOW);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const long fd = ::syscall(SYS_openat2, root_fd, rel.empty() ? "." : rel.c_str(), &how, sizeof how);
  if (fd < 0) return stage::sys_error(errno, "open source", rel);
  return stage::Fd(static_cast<int>(fd));
}

stage::Result<stage::Fd> open_regular_beneath(int root_fd, const std::string& rel, struct stat& st) {
  auto fd = open_beneath(root_fd, rel, O_RDONLY | stage::kNoWaitOpen);
  if (!fd) return fd.error();
  if (auto s = stage::settle_regular(fd->get(), st, rel); !s) return s.error();
  return fd;
}

bool has_temp_component(const std::string& rel) {  // on every open: no allocation
  const std::string_view path(rel);
  for (size_t b = 0; b <= path.size();) {
    const size_t e = std::min(path.find('/', b), path.size());
    if (stage::is_temp_name(path.substr(b, e - b))) return true;
    b = e + 1;
  }
  return false;
}

std::string proc_fd_path(int fd) {
  return "/proc/self/fd/" + std::to_string(fd);
}

bool has_access_acl(int dfd, const std::string& name) {
  const std::string p = proc_fd_path(dfd) + "/" + name;
  if (::lgetxattr(p.c_str(), "system.posix_acl_access", nullptr, 0) >= 0) return true;
  return errno != ENODATA && errno != ENOTSUP;  // ENOTSUP: the filesystem has no ACLs
}

bool has_access_acl_beneath(int root_fd, const std::string& rel) {
  const std::string dir = stage::parent_dir(rel);
  auto parent = open_beneath(root_fd, dir == "." ? "" : dir, O_PATH | O_DIRECTORY);
  if (!parent) return true;
  return has_access_acl(parent->get(),
                        rel.substr(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/') + 1));
}

bool unlink_beneath(int root_fd, const std::string& rel) {
  const std::string dir = stage::parent_dir(rel);
  auto parent = open_beneath(root_fd, dir == "." ? "" : dir, O_PATH | O_DIRECTORY);
  if (!parent) return false;
  const std::string base = rel.substr(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/') + 1);
  struct stat st {};
  if (::fstatat(parent->get(), base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
    return false;
  return ::unlinkat(parent->get(), base.c_str(), 0) == 0;
}

stage::Result<stage::Manifest> BeneathSource::scan(const std::string& rel, bool /*recursive*/,
                                                   const SkipFn& /*skipped*/) {
  struct stat st {};
  auto fd = open_regular_beneath(root_fd_, rel, st);
  if (!fd) return fd.error();
  stage::Manifest m;
  m.entries.push_back(stage::Entry{
      "", stage::EntryType::file, stage::meta_from_stat(st), {}, stage::allocated_from_stat(st)});
  return m;
}

namespace {

// The names of the entries of the directory fd holds whose d_type is `type` (or unknown: the
// caller checks with fstatat), "." and ".." left out, in the order the directory lists them.
// fdopendir takes a descriptor of its own: the listing never resolves a path again.
stage::Result<std::vector<std::string>> list_names(int fd, unsigned char type, const std::string& dir) {
  const int lfd = ::dup(fd);
  DIR* d = lfd < 0 ? nullptr : ::fdopendir(lfd);
  if (d == nullptr) {
    const int err = errno;
    if (lfd >= 0) ::close(lfd);
    return stage::sys_error(err, "list source directory", dir);
  }
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* de = ::readdir(d)) {
    if (de->d_type != type && de->d_type != DT_UNKNOWN) continue;
    const std::string name = de->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return stage::sys_error(err, "list source directory", dir);
  return names;
}

}  // namespace

stage::Result<std::string> for_each_small_file(
    int dfd, const std::string& dir, uint64_t max_size, const stage::SelectionSlice& slice,
    const std::function<void(const std::string&, const struct stat&)>& fn) {
  auto listed = list_names(dfd, DT_REG, dir);
  if (!listed) return listed.error();
  std::vector<std::string> names = std::move(listed.value());
  std::sort(names.begin(), names.end());  // the same order on every run; slices by name
  // The slice: count names circularly from the first at or after `from`. Only its names are
  // checked (fstatat): the rest of a huge directory is only listed.
  const size_t n = names.size();
  const auto at = [&](const std::string& name) {
    return static_cast<size_t>(std::lower_bound(names.begin(), names.end(), name) - names.begin());
  };
  const size_t first = n == 0 ? 0 : at(slice.from) % n;
  size_t count = n;
  if (!slice.until.empty())
    count = (at(slice.until) + n - first) % n;
  else if (slice.to_end)
    count = n - first;
  uint64_t files = 0, bytes = 0;
  for (size_t k = 0; k < count; ++k) {
    const std::string& name = names[(first + k) % n];
    struct stat fst {};
    // Gone or replaced since the listing: not part of the batch (an open of it stages it alone).
    if (::fstatat(dfd, name.c_str(), &fst, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!batch_eligible(fst, name, max_size) || has_access_acl(dfd, name)) continue;
    const uint64_t charge = copy_charge(static_cast<uint64_t>(fst.st_size));
    if (files > 0 && ((slice.max_files > 0 && files >= slice.max_files) ||
                      (slice.max_bytes > 0 && bytes + charge > slice.max_bytes)))
      return name;  // the next slice starts here
    ++files;
    bytes += charge;
    fn(name, fst);
  }
  return std::string();
}

stage::Result<stage::Selection> BeneathSource::scan_selection(const std::string& dir, uint64_t max_size,
                                                              const stage::SelectionSlice& slice) {
  if (has_temp_component(dir))
    return stage::stage_error(stage::Errc::unsupported, "a batch (temporary-file name)", dir);
  auto fd = open_beneath(root_fd_, dir, O_RDONLY | O_DIRECTORY);
  if (!fd) return fd.error();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return stage::sys_error(errno, "stat source directory", dir);
  stage::Selection out;
  stage::Manifest& m = out.manifest;
  m.tree = true;
  m.entries.push_back(stage::Entry{"", stage::EntryType::dir, stage::meta_from_stat(st), {}, 0});
  auto next = for_each_small_file(
      fd->get(), dir, max_size, slice, [&](const std::string& name, const struct stat& fst) {
        m.entries.push_back(stage::Entry{
            name, stage::EntryType::file, stage::meta_from_stat(fst), {}, stage::allocated_from_stat(fst)});
      });
  if (!next) return next.error();
  out.next_slice = std::move(next.value());
  // The manifest's files by name (a slice that wrapped lists its tail first).
  std::sort(m.entries.begin() + 1, m.entries.end(),
            [](const stage::Entry& a, const stage::Entry& b) { return a.path < b.path; });
  return out;
}

stage::Result<std::vector<std::string>> BeneathSource::list_dirs(const std::string& dir, size_t max) {
  auto fd = open_beneath(root_fd_, dir, O_RDONLY | O_DIRECTORY);
  if (!fd) return fd.error();
  auto names = list_names(fd->get(), DT_DIR, dir);
  if (!names) return names.error();
  std::vector<std::string> out;
  for (const std::string& name : *names) {
    if (out.size() >= max) break;
    struct stat st {};
    // Only what every user may reach: a walk by one user never stages a directory the
    // others (or that user) could not list, by its mode or an ACL.
    constexpr mode_t kEveryone = S_IRUSR | S_IXUSR | S_IRGRP | S_IXGRP | S_IROTH | S_IXOTH;
    if (!stage::is_temp_name(name) && ::fstatat(fd->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode) && (st.st_mode & kEveryone) == kEveryone && !has_access_acl(fd->get(), name))
      out.push_back(name);
  }
  return out;
}

stage::Result<std::unique_ptr<stage::SourceFile>> BeneathSource::open(const std::string& rel,
                                                                      const stage::Entry& e) {
  struct stat st {};
  auto fd = open_regular_beneath(root_fd_, stage::join_path(rel, e.path), st);
  if (!fd) {
    if (fd.error().code == stage::make_error_code(stage::Errc::unsupported))  // swapped for a FIFO...
      return stage::stage_error(stage::Errc::source_changed, "open source", rel);
    return fd.error();
  }
  if (stage::meta_from_stat(st) != e.meta)
    return stage::stage_error(stage::Errc::source_changed, "open source", rel);
  return stage::posix_source_file(std::move(fd.value()), rel, e.meta.size);
}

}  // namespace stagefs
