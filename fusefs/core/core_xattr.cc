// StageFsCore's extended attributes (core.h), the daemon's own on the root (user.stagefs.*),
// and stagectl's requests (prefetch, evict, whether a copy is cached).
#include <fcntl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "fusefs/base/beneath.h"
#include "fusefs/cache/cache.h"
#include "fusefs/core/core.h"

namespace stagefs {

using stage::Error;
using stage::Result;

namespace {
constexpr const char* kControlPrefix = "user.stagefs.";
constexpr const char* kSelinuxXattr = "security.selinux";

bool is_hidden_xattr(std::string_view name, const Caller& who) {
  return who.uid != 0 && name.rfind("trusted.", 0) == 0;
}
}  // namespace

// resolved beneath SOURCE_DIR) is followed by getxattr/listxattr to the file itself.
template <class F>
static Result<std::string> xattr_call(int root, const std::string& rel, const char* what, F&& call) {
  auto fd = open_beneath(root, rel, O_PATH);
  if (!fd) return fd.error();
  const std::string p = proc_fd_path(fd->get());
  std::string buf(65536, '\0');
  const ssize_t n = call(p.c_str(), buf.data(), buf.size());
  if (n < 0) return stage::sys_error(errno, what, rel);
  buf.resize(static_cast<size_t>(n));
  return buf;
}

// Both answered through xattrs_: the source is asked once per node (and version), and
// absent names (what `ls -l` asks of every entry) cost no syscall.
Result<std::string> StageFsCore::getxattr(uint64_t id, const std::string& name, const Caller& who) {
  if (is_hidden_xattr(name, who)) return stage::Error{std::error_code(ENODATA, std::generic_category()), ""};
  if (id == kRootId && name.rfind(kControlPrefix, 0) == 0 && control_xattr_) {
    if (auto v = control_xattr_(name, who)) return *v;
  }
  auto rel = path_of(id);
  if (!rel) return rel.error();
  if (xattr_checked_as_caller(name))
    if (auto reach = resolve_as_caller(*rel, O_PATH, 0, who); !reach) return reach.error();
  auto r = xattrs_.get(
      id, name, [&] { return list_source_xattrs(*rel); },
      [&] {
        return xattr_call(root_.get(), *rel, "getxattr", [&](const char* p, char* b, size_t n) {
          return ::getxattr(p, name.c_str(), b, n);
        });
      });
  if (r) return r;
  // Expected answers, not logged. The kernel fails permission checks on an ACL read that
  // answers EOPNOTSUPP: ACL names are ENODATA then; other names pass the source's answer.
  const int err = r.error().to_errno();
  // No SELinux label on this file: "not supported", which `ls` (and cp, tar) remember per
  // device and stop asking, instead of "no such attribute", which `ls -l` asks again for
  // every entry (one FUSE round trip each: a 100,000-entry `ls -l` 2.8x the source's time).
  // A file that has a label still shows it. (With SELinux enabled, the kernel answers this
  // name from the mount's context and never asks the daemon.)
  if (err == ENODATA && name == kSelinuxXattr)
    return stage::Error{std::error_code(EOPNOTSUPP, std::generic_category()), ""};
  if (err == ENODATA || (err == EOPNOTSUPP && name.rfind("system.posix_acl_", 0) == 0))
    return stage::Error{std::error_code(ENODATA, std::generic_category()), ""};
  if (err == EOPNOTSUPP) return stage::Error{std::error_code(EOPNOTSUPP, std::generic_category()), ""};
  return r;
}

Result<std::string> StageFsCore::list_source_xattrs(const std::string& rel) const {
  auto r = xattr_call(root_.get(), rel, "listxattr",
                      [](const char* p, char* b, size_t n) { return ::listxattr(p, b, n); });
  if (!r && r.error().to_errno() == ENOTSUP) return std::string();
  return r;
}

Result<std::string> StageFsCore::listxattr(uint64_t id, const Caller& who) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  if (auto reach = resolve_as_caller(*rel, O_PATH, 0, who); !reach) return reach.error();
  auto r = xattrs_.list(id, [&] { return list_source_xattrs(*rel); });
  if (!r) return r;
  std::string out;
  for (size_t i = 0; i < r->size();) {
    const size_t end = r->find('\0', i);
    const std::string_view name(r->data() + i, (end == std::string::npos ? r->size() : end) - i);
    if (!name.empty() && !is_hidden_xattr(name, who)) {
      out.append(name);
      out.push_back('\0');
    }
    if (end == std::string::npos) break;
    i = end + 1;
  }
  return out;
}

bool StageFsCore::xattr_checked_as_caller(std::string_view name) {
  return name.rfind("system.posix_acl_", 0) != 0;
}

void StageFsCore::prefetch_async(uint64_t id, const Caller& who, std::function<void(stage::Status)> done) {
  ++counters_.prefetches;
  // Done when the copy is complete (not when it starts, as an open may be).
  check_open(
      id, O_RDONLY, who,
      [this, done = std::move(done)](Result<OpenFile> r) {
        if (!r) return done(r.error());
        release(r->pinned);
        done({});
      },
      false, /*background=*/true);
}

stage::Status StageFsCore::evict(uint64_t id, const Caller& who) {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto st = stat_rel(*rel);
  if (!st) return st.error();
  if (!S_ISREG(st->st_mode)) return stage::stage_error(stage::Errc::unsupported, "evict", *rel);
  // Never cached; the name in the cache may be another file's temporary file.
  if (has_temp_component(*rel)) return stage::stage_error(stage::Errc::unsupported, "evict", *rel);
  if (who.uid != 0 && who.uid != st->st_uid)
    return stage::sys_error(EPERM, "evict: only root or the file's owner may evict it", *rel);
  // Only the copy of the file whose owner was checked: the path may name another file now.
  return copies_.cache().evict(*rel, *st);
}

Result<bool> StageFsCore::has_copy(uint64_t id, const Caller& who) const {
  auto rel = path_of(id);
  if (!rel) return rel.error();
  auto src_fd = open_as_caller(*rel, O_PATH, R_OK, who);
  if (!src_fd) return src_fd.error();
  struct stat st {};
  if (::fstat(src_fd->get(), &st) != 0) return stage::sys_error(errno, "stat source", *rel);
  if (!S_ISREG(st.st_mode)) return stage::stage_error(stage::Errc::unsupported, "cached", *rel);
  if (has_temp_component(*rel)) return false;  // never cached
  return copies_.cache().open_current(*rel, st).ok();
}

}  // namespace stagefs
