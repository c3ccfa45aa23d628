// The mount's life cycle (mount.h): the mount point's checks, mounting with the options this
// caller may use, the session loop, and an unmount that never closes /dev/fuse under a worker.
// The libfuse calls themselves are in fuse_ops.cc (fuse_ops.h).
#include "fusefs/edge/mount.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "bcast/io/paths.h"
#include "bcast/text/text.h"
#include "fusefs/base/log.h"
#include "fusefs/edge/fuse_ops.h"
#include "fusefs/edge/privilege.h"

namespace stagefs {
namespace {

struct MountEntry {
  std::string dev;         // "maj:min"
  std::string fstype;      // e.g. "fuse.stagefs"
  std::string super_opts;  // e.g. "ro,user_id=1000,group_id=1000" (FUSE: who mounted it)
};

// The filesystem mounted at path (last match in mountinfo), if any.
std::optional<MountEntry> mount_at(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  std::optional<MountEntry> found;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string id, parent, dev, root, mnt, word;
    ls >> id >> parent >> dev >> root >> mnt;
    if (mnt != path) continue;
    while (ls >> word && word != "-") {
    }
    MountEntry e{dev, "", ""};
    std::string source;
    ls >> e.fstype >> source >> e.super_opts;
    found = e;
  }
  return found;
}

// Whose a FUSE mount is ("uid 1001 (bob)"), from its user_id= option; "" when not given.
std::string fuse_owner(const MountEntry& m) {
  const std::string key = "user_id=";
  size_t at = m.super_opts.find(key);
  if (at == std::string::npos || (at > 0 && m.super_opts[at - 1] != ',')) return {};
  at += key.size();
  const std::string digits = m.super_opts.substr(at, m.super_opts.find(',', at) - at);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return {};
  return stage::owner_text(static_cast<uid_t>(std::stoul(digits)));
}

// "'name' (owned by uid 1001 (bob))" for the first entry of a directory that is not empty,
// and how many more there are.
std::string first_entries(DIR* d, int dirfd) {
  std::string first;
  int more = 0;
  while (const dirent* de = ::readdir(d)) {
    if (std::strcmp(de->d_name, ".") == 0 || std::strcmp(de->d_name, "..") == 0) continue;
    if (!first.empty()) {
      ++more;
      continue;
    }
    struct stat st {};
    first = "'" + stage::escape_controls(de->d_name) + "'";
    if (::fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
      first += " (owned by " + stage::owner_text(st.st_uid) + ")";
  }
  if (first.empty()) return {};
  return first + (more > 0 ? " and " + std::to_string(more) + " more" : "");
}

std::string mount_device(const std::string& path) {
  auto m = mount_at(path);
  return m ? m->dev : std::string();
}

void write_sysfs(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  if (out) out << value;
}

}  // namespace

FuseMount::FuseMount(StageFsCore& core, const MountOptions& opt)
    : core_(core),
      opt_(opt),
      pt_(opt.passthrough),
      modes_({[this](int file_fd) { return pt_.open_backing(fuse_fd_, file_fd); },
              [this](int backing_id) { pt_.close_backing(fuse_fd_, backing_id); }}) {}

std::string check_mountpoint(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOTCONN)
      return "mount point " + path +
             " is a stale mount of a stagefs that is no longer running; clear it with: "
             "fusermount3 -u " +
             path + "   (or, as root: umount -l " + path + ")";
    // A FUSE mount without allow_other refuses every other user, root included.
    if (auto m = mount_at(path); err == EACCES && m && m->fstype.rfind("fuse", 0) == 0) {
      const std::string owner = fuse_owner(*m);
      return "mount point " + path + " is another user's " + m->fstype + " mount" +
             (owner.empty() ? "" : " (" + owner + "'s)") +
             ": use a mount point of your own (stagefs run mounts on "
             "a directory of its job)";
    }
    return "mount point " + path + ": " + std::strerror(err) +
           (err == ENOENT
                ? " (it must exist on every node: stagefs run's, a directory of the job, is made by the "
                  "site's stagefs prolog; see the admin guide)"
                : "");
  }
  if (!S_ISDIR(st.st_mode)) return "mount point " + path + " is not a directory";
  // Mounting over a plain mount (a tmpfs or bind mount prepared for it) is fine; over a FUSE
  // filesystem (another stagefs, alive) it is not.
  if (auto m = mount_at(path); m && m->fstype.rfind("fuse", 0) == 0) {
    // stat() may be answered from the kernel's attribute cache; statfs always asks the daemon.
    struct statvfs sv {};
    if (::statvfs(path.c_str(), &sv) != 0 && errno == ENOTCONN)
      return "mount point " + path + " is a stale " + m->fstype +
             " mount (its daemon is gone); clear it with: " + "fusermount3 -u " + path +
             "   (or, as root: umount -l " + path + ")";
    const std::string owner = fuse_owner(*m);
    return "mount point " + path + " already has a " + m->fstype + " mounted on it" +
           (owner.empty() ? "" : " by " + owner) + " (fusermount3 -u " + path +
           " first, or use another mount point)";
  }
  stage::Fd dfd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (DIR* d = dfd.valid() ? ::fdopendir(dfd.get()) : nullptr) {
    const int fd = dfd.release();  // the DIR owns it now
    const std::string entries = first_entries(d, fd);
    ::closedir(d);
    if (!entries.empty())
      return "mount point " + path + " is not empty: it holds " + entries + " (use an empty directory)";
  }
  return {};
}

stage::Result<std::unique_ptr<FuseMount>> FuseMount::create(StageFsCore& core, const MountOptions& opt) {
  if (auto why = check_mountpoint(opt.mountpoint); !why.empty()) return stage::sys_error(EBUSY, why);
  // What this caller may ask for (privilege.h): allow_other only where fusermount3 grants it,
  // passthrough only with the capability its backing files need. Whatever blocks the mount
  // itself is named now, not guessed at after fusermount3 failed.
  const Privileges priv = probe_privileges();
  if (auto why = mount_obstacle(opt.mountpoint, priv); !why.empty())
    return stage::sys_error(EPERM, "cannot mount at " + opt.mountpoint + ": " + why);
  MountOptions eff = opt;
  eff.allow_other = opt.allow_other && priv.may_allow_other();
  eff.passthrough = opt.passthrough && priv.cap_sys_admin;
  auto m = std::unique_ptr<FuseMount>(new FuseMount(core, eff));
  // auto_unmount: fusermount3 watches the session and unmounts if the daemon dies (kill -9),
  // so a crash never leaves a stale mount behind.
  std::string o = "default_permissions,ro,fsname=stagefs,subtype=stagefs,auto_unmount";
  if (eff.allow_other) o += ",allow_other";
  std::vector<const char*> argv{"stagefs", "-o", o.c_str()};
  if (opt.debug) argv.push_back("-d");
  m->se_ = fuse_edge::new_session(*m, argv);
  if (m->se_ == nullptr) return stage::sys_error(EINVAL, "fuse_session_new failed", opt.mountpoint);
  if (fuse_edge::mount_session(m->se_, opt.mountpoint) != 0) {
    fuse_edge::destroy_session(m->se_);
    m->se_ = nullptr;
    std::string why = mount_obstacle(opt.mountpoint, priv);  // changed meanwhile?
    if (why.empty())
      why = "fusermount3 refused it (its message is above: mount_max in " + std::string(kFuseConf) +
            "? a nosuid filesystem?)";
    return stage::sys_error(EPERM, "mount at " + opt.mountpoint + " failed: " + why);
  }
  if (opt.allow_other && !eff.allow_other)
    log_info(
        "mounted for uid {} only: other users (root included) cannot enter {} (to share a user's "
        "mount, {} needs user_allow_other)",
        priv.uid, opt.mountpoint, kFuseConf);
  if (opt.passthrough && !eff.passthrough)
    log_info("kernel passthrough needs CAP_SYS_ADMIN: reads will be served by {}",
             read_path_name(ReadPath::splice));
  m->fuse_fd_ = fuse_edge::session_fd(m->se_);
  if (!fuse_edge::use_passthrough_io(m->se_)) log_warn("custom io refused: kernel passthrough disabled");
  // Larger READ requests: raise this mount's read-ahead (best effort, needs root).
  if (const std::string dev = mount_device(opt.mountpoint); !dev.empty())
    write_sysfs("/sys/class/bdi/" + dev + "/read_ahead_kb", "1024");
  return m;
}

stage::Status FuseMount::loop() {
  const int rc = fuse_edge::run_loop(se_, static_cast<unsigned>(opt_.max_threads));
  {
    // No late reply (an open answered by the core's completion pool) may write to the
    // session's fd once it is closed.
    std::unique_lock lk(reply_m_);
    loop_done_ = true;
  }
  // Only now, with no worker reading /dev/fuse, may the session's fd be closed.
  fuse_edge::unmount_session(se_);
  if (rc < 0) return stage::sys_error(-rc, "FUSE session loop", opt_.mountpoint);
  return {};
}

// Thread-safe. Never closes the session's fd (workers may be blocked reading it: libfuse's
// fuse_session_unmount would close it under them); detaches the mount and aborts the
// connection instead, which wakes every worker, and loop() finishes the job.
void FuseMount::unmount() {
  if (unmounted_.exchange(true) || se_ == nullptr) return;
  const auto m = mount_at(opt_.mountpoint);
  fuse_edge::leave_loop(se_);
  if (!m || m->fstype.rfind("fuse", 0) != 0) return;  // already unmounted (fusermount3 -u)
  if (::umount2(opt_.mountpoint.c_str(), MNT_DETACH) != 0) {
    // Not root: ask fusermount3 (setuid) for a lazy unmount.
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execlp("fusermount3", "fusermount3", "-u", "-z", "-q", "--", opt_.mountpoint.c_str(), nullptr);
      ::_exit(127);
    }
    if (pid > 0) ::waitpid(pid, nullptr, 0);
  }
  // Open files keep a detached connection (and the workers) alive: abort it so the workers
  // return now; later reads of those files fail with ENOTCONN.
  if (const size_t colon = m->dev.find(':'); colon != std::string::npos) {
    const std::string conn = "/sys/fs/fuse/connections/" + m->dev.substr(colon + 1);
    struct stat st {};
    if (::stat(conn.c_str(), &st) != 0)  // fusectl not mounted (systemd usually does it)
      ::mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, nullptr);
    write_sysfs(conn + "/abort", "1");
  }
}

FuseMount::~FuseMount() {
  if (se_ == nullptr) return;
  unmount();
  if (!loop_done_) fuse_edge::unmount_session(se_);
  fuse_edge::destroy_session(se_);
}

ReadChoice FuseMount::open_read_mode(uint64_t node, int file_fd, const OpenFacts& facts) {
  const ReadChoice c = modes_.open(node, file_fd, facts);
  if (c.reported != ReadPath::unknown) note_read_path(c.reported);
  return c;
}

ReadPath FuseMount::read_path() {
  if (const ReadPath p = read_path_.load(); p != ReadPath::unknown) return p;
  if (!pt_.initialized()) return ReadPath::unknown;  // before the kernel's first request
  if (const ReadPath p = probe_read_path(); p != ReadPath::unknown) note_read_path(p);
  return read_path_.load();
}

ReadPath FuseMount::probe_read_path() const {
  if (!opt_.passthrough || !pt_.active()) return ReadPath::splice;
  if (opt_.backing_probe.empty()) return ReadPath::unknown;
  const stage::Fd fd(::open(opt_.backing_probe.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return ReadPath::unknown;
  const int id = pt_.open_backing(fuse_fd_, fd.get());
  if (id < 0) return ReadPath::splice;
  pt_.close_backing(fuse_fd_, id);
  return ReadPath::passthrough;
}

void FuseMount::note_read_path(ReadPath p) {
  const ReadPath old = read_path_.exchange(p);
  if (old != p) log_info("reads are served by {}", read_path_name(p));
  if (p == ReadPath::splice && opt_.passthrough && pt_.active() && !logged_fallback_.exchange(true))
    log_warn(
        "kernel passthrough refused for a file (the cache on a stacked filesystem?): falling back to "
        "splice");
}

}  // namespace stagefs
