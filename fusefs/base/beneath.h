// Path resolution that cannot leave a root directory: openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) relative to an fd of SOURCE_DIR. Whatever a
// name from the kernel or a message between ranks says, and whatever the source tree does
// meanwhile (a directory swapped for a symlink), the daemon only opens what lies inside it.
// BeneathSource is the engine's SourceReader for the mount: paths are relative to the root.
// Stateless apart from the root fd; thread-safe.
#pragma once

#include <sys/stat.h>

#include <functional>
#include <string>

#include "bcast/io/fd.h"
#include "bcast/io/source.h"

namespace stagefs {

// rel == "" opens the root itself. flags as for openat (O_PATH, O_RDONLY, O_DIRECTORY...).
stage::Result<stage::Fd> open_beneath(int root_fd, const std::string& rel, int flags);
// A regular file beneath the root, opened for reading without ever waiting in open(2): a
// name swapped for a FIFO fails with Errc::unsupported instead of blocking the caller (a
// thread that stages for every node). st receives the file's stat.
stage::Result<stage::Fd> open_regular_beneath(int root_fd, const std::string& rel, struct stat& st);
// True when a component of rel is named like a copy's temporary file (".B.stage-tmp.HOST.PID",
// stage::is_temp_name). Such a file or directory is never copied into the cache: its copy
// would land on (or, as a directory, block) the temporary file of B's copy, and a user who may
// create files beside B could thus replace or stop another user's copy. It is read from the
// source instead.
bool has_temp_component(const std::string& rel);
// "/proc/self/fd/N": a path that reaches what fd holds without resolving any name again.
std::string proc_fd_path(int fd);
// Removes the regular file rel (its parent resolved as above; anything else is left).
// Returns true if it was removed.
bool unlink_beneath(int root_fd, const std::string& rel);

// True when the entry `name` of directory dfd has an access ACL (system.posix_acl_access; the
// kernel keeps none that only restates the mode bits), or when that cannot be told: then its
// mode bits do not say who may read it. One lgetxattr, not following a symlink.
bool has_access_acl(int dfd, const std::string& name);
// The same for rel beneath the root (its parent resolved as open_beneath does).
bool has_access_acl_beneath(int root_fd, const std::string& rel);

// The files a batch of directory dfd (named dir) takes, in the slice's order: those the
// cache's batch rule admits (batch_eligible, batch_rules.h: small regular files every user
// may read by their mode, not named like a temporary file) and that have no ACL, within the
// slice and its limits (stage::SelectionSlice; its bytes count each file's copy_charge).
// Lists every name, checks (fstatat, no symlinks; lgetxattr) only the slice's; fn(name,
// stat) for each file taken. Returns the first name the limits left out ("" none). The
// batch's scan and the mount's room-making before a batch both use it, so they agree on what
// a batch holds.
stage::Result<std::string> for_each_small_file(
    int dfd, const std::string& dir, uint64_t max_size, const stage::SelectionSlice& slice,
    const std::function<void(const std::string&, const struct stat&)>& fn);

class BeneathSource final : public stage::SourceReader {
 public:
  explicit BeneathSource(int root_fd) : root_fd_(root_fd) {}
  // Single regular files only (the mount's single-file transfers).
  stage::Result<stage::Manifest> scan(const std::string& rel, bool recursive, const SkipFn& skipped) override;
  // A directory batch: its small regular files that every user may read (mode o+r; the
  // others are staged alone, after their opener's access check), listed through the
  // directory's fd (fstatat without following symlinks), sorted by name.
  stage::Result<stage::Selection> scan_selection(const std::string& dir, uint64_t max_size,
                                                 const stage::SelectionSlice& slice) override;
  // Listed through the directory's fd; each entry checked with fstatat (no symlinks): those
  // every user may list and enter by their mode (u+rx, g+rx, o+rx) and that have no ACL.
  stage::Result<std::vector<std::string>> list_dirs(const std::string& dir, size_t max) override;
  stage::Result<std::unique_ptr<stage::SourceFile>> open(const std::string& rel,
                                                         const stage::Entry& e) override;

 private:
  int root_fd_;
};

}  // namespace stagefs
