// StageFsCore: the whole filesystem with neither a mount nor MPI. The FUSE edge (fuse_ops.cc)
// unpacks a request, calls one method here and replies; tests call the methods directly.
//
// A read-only mirror of SOURCE_DIR. Node ids are our own (1 = root), mapped to paths relative
// to SOURCE_DIR; every access resolves beneath SOURCE_DIR's fd (beneath.h). stat data
// (st_ino included) is the source's. open() of a regular file returns a descriptor of the
// node's local copy in the NodeCache (cache.h): served at once when the cache holds a copy
// that is current (the cache's validity rule) and, with Verify::crc, whose CRC was checked
// once in this mount; otherwise after the Materializer (the mount group) has made one.
//
// Security and freshness decisions:
//   - Versions: a node id stands for one version of a file (size, mtime, ctime, inode). When
//     a lookup finds the source changed, the name gets a new id: the kernel then sees a new
//     inode, with fresh attributes and no page cache, so a new open reads the new bytes
//     while holders of the old inode keep reading the old, whole copy (unlinked, never
//     overwritten). An open of an outdated id fails with ESTALE, on which the kernel's
//     path walk looks the name up again (LOOKUP_REVAL) and opens the new id.
//   - Access: with a root daemon, open() and opendir() resolve the path on the source as the
//     caller (its fsuid, fsgid and groups: search permission on every directory from
//     SOURCE_DIR down) and check read access on what they opened: POSIX ACLs and modes
//     changed since the kernel cached the attributes are enforced, on the file and on every
//     directory above it, for a cached copy as for a new one. trusted.* extended
//     attributes are hidden from callers other than root. Metadata (lookup, getattr,
//     readlink, xattrs) is resolved as the caller too: a directory closed on the source
//     shows nothing new to those it was closed to, whatever the kernel cached of its mode.
//   - Listings: one snapshot per directory version is shared by every open handle of it and
//     freed with the last one: memory does not grow with the number of handles.
//   - Opens that must wait for a copy do not hold the caller's thread: open_async() answers
//     through a callback, run on the core's small completion pool.
//   - Copies: every question about a copy goes to the cache room (NodeCopies,
//     cache/copies.h), once per open: serve this copy, check it first (its CRC read back
//     once per copy, on the room's threads), another name's copy (hard links: the names of
//     one source version cost one transfer, and the first open of such a file waits for its
//     whole copy), wait for that name's transfer, or miss. A copy that finds no room because
//     copies held open on this node take it waits there for room without holding a thread,
//     then is asked for again; past CoreConfig::space_wait the open fails with ENOSPC.
// The files: core.cc (life, completion pool), core_names.cc (lookups, attributes, the access
// check as the caller), core_listing.cc (directories), core_xattr.cc (extended attributes and
// stagectl), core_open.cc (the open chain and reads during a copy).
// Every method is thread-safe (one mutex over the node table; no lock is held while waiting
// for a materialization). Errors are stage::Error; the edge maps them with Error::to_errno().
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "bcast/io/fd.h"
#include "bcast/io/manifest.h"
#include "bcast/io/source.h"
#include "fusefs/base/as_caller.h"
#include "fusefs/cache/copies.h"
#include "fusefs/core/handles.h"
#include "fusefs/core/nodes.h"
#include "fusefs/core/xattr_cache.h"

namespace stagefs {

class NodeCache;
class LiveCopy;
using Clock = std::chrono::steady_clock;

// Whom a materialization is for: the uid of the open that asked (the group's queue takes
// turns by uid, coordinator.h), and whether no open waits for it (stagectl prefetch, a
// replayed profile: queued behind every open). A background transfer evicts no copy; when it
// finds no room, a want that may_evict asks again as an open would (stagectl prefetch), one
// that may not gets the error (a replayed profile stays within the cache's limit).
struct Want {
  uint32_t uid = 0;
  bool background = false;
  bool may_evict = true;
};

class Materializer {
 public:
  using Done = std::function<void(stage::Status)>;
  virtual ~Materializer() = default;
  // Calls done once a transfer of rel finished on this node (or failed, timed out, or the
  // group shut down), from whichever thread learned it: done must be quick.
  virtual void materialize_async(const std::string& rel, const Want& want, Done done) = 0;
  // rel is a small file (CoreConfig::small_file_size): the materializer may stage it with
  // the other small files of its directory (one transfer for the batch). done as above; the
  // batch may leave rel out (it changed or grew meanwhile): the core then asks for it alone.
  // `since` is epoch() read before the caller looked for rel in the cache: a batch of rel's
  // directory completed after that answers at once (the caller looks again) rather than
  // costing a new transfer.
  // The batch stages a slice of the directory (bounded in files and bytes) that begins with
  // rel.
  virtual void materialize_small_async(const std::string& rel, uint64_t since, const Want& want, Done done) {
    (void)since;
    materialize_async(rel, want, std::move(done));
  }
  // Reads before the copy ends: as materialize_async(), but once the transfer of
  // rel runs on this node with its temporary file open (LiveCopy), on_live(live) is called
  // instead of done, and done never: the open returns then and reads wait for their chunks.
  // If that never happens (the transfer failed first, or this materializer cannot), done
  // as above.
  using LiveStarted = std::function<void(std::shared_ptr<LiveCopy>)>;
  virtual void materialize_live_async(const std::string& rel, const Want& want, Done done,
                                      LiveStarted on_live) {
    (void)on_live;
    materialize_async(rel, want, std::move(done));
  }
  // A counter of completed transfers (0 if the materializer has none).
  [[nodiscard]] virtual uint64_t epoch() const { return 0; }
  // Whether the batch that holds small file rel runs on this node now: its copies appear
  // one by one before the batch tells the core they are verified, so an open that finds one
  // waits for the batch instead of reading the copy back for its CRC.
  [[nodiscard]] virtual bool batch_running(const std::string& rel) const {
    (void)rel;
    return false;
  }
  // Blocking form.
  stage::Status materialize(const std::string& rel, const Want& want = {});
};

enum class StallPolicy { eio, source };

struct CoreConfig {
  std::string source_dir;
  StallPolicy on_stall = StallPolicy::eio;
  Verify verify_cache = Verify::crc;  // check a cached copy's CRC once per mount before serving it
  int completion_threads = 2;
  int verify_threads = 2;  // the CopyChecker's threads
  // Regular files of at most this many bytes that every user may read (o+r) are
  // materialized with their directory's other small files
  // (Materializer::materialize_small_async); 0: every file alone.
  uint64_t small_file_size = 0;
  // An open of a file being materialized returns once its transfer runs on this node
  // (Materializer::materialize_live_async); its reads are served by the daemon from the copy
  // in progress (OpenFile::live) for the life of that handle.
  bool read_during_copy = false;
  // Memory the directory listings held open by one user (other than root) may take, summed
  // over the listings that user's opendirs built, with the node ids its lookups created
  // (READDIRPLUS looks up every entry listed) while the kernel holds them. Handles on one
  // version of a directory share one listing; a user who changes a large directory between
  // opendirs builds a new one each time. Past this, that user's opendir of a new listing,
  // and its lookups of names the mount does not hold yet, fail with ENOMEM (that user only).
  uint64_t listing_bytes_per_user = uint64_t{1} << 30;
  // An open whose copy finds no room in this node's cache because copies held open here
  // (pinned) take it waits for room (pins released, copies evicted or removed), up to this
  // long from its first refusal, then fails with ENOSPC and a log line that names the cause.
  // The mount passes its stall timeout. 0: such an open fails at once.
  std::chrono::milliseconds space_wait{std::chrono::seconds(60)};
  // What identifies a source version (--source-version): the rule every comparison of a
  // source with a version seen elsewhere (a copy in progress, fed from another node) uses.
  stage::SourceVersion source_version = stage::SourceVersion::full;
  // What users may hold open (handles.h): per user, and the descriptors of all together.
  // Zeros: no limit (the daemon sets them from --max-open-per-user and RLIMIT_NOFILE).
  HandleLimits::Config handles{};
};

struct OpenFile {
  stage::Fd fd;
  bool cache_hit = false;          // served from a copy that was already there
  bool from_source = false;        // stall fallback: reads go to the shared source
  std::string pinned;              // the cache copy held while this file is open: pass to release()
  std::shared_ptr<LiveCopy> live;  // set: the copy is in progress; read through read_live()
                                   // (fd: the source for --on-stall source, else unset)
  HandleLimits::Slot slot;         // this handle's share of its user's limit (held until released)
};

struct DirEntry {
  std::string name;
  uint64_t ino = 0;  // the source's inode number (never 0)
  uint32_t mode = 0;
};
using DirSnapshot = std::shared_ptr<const std::vector<DirEntry>>;

// An open directory handle: its listing and its share of its user's limit.
struct OpenDir {
  DirSnapshot entries;
  HandleLimits::Slot slot;
};

// What the core counts; the cache room counts the rest (CopyCounters: read-backs, room waits).
struct CoreCounters {
  std::atomic<uint64_t> opens{0}, cache_hits{0}, materializations{0}, source_fallbacks{0}, open_errors{0};
  std::atomic<uint64_t> stale_opens{0}, denied{0}, prefetches{0};
  std::atomic<uint64_t> opens_during_copy{0};  // opens answered while their copy was in progress
};

class StageFsCore {
 public:
  static constexpr uint64_t kRootId = NodeTable::kRootId;
  // copies: the cache room the opens ask (outlives the core; the daemon hands the same object
  // to the group as its Admission).
  static stage::Result<std::unique_ptr<StageFsCore>> create(CoreConfig cfg, NodeCopies& copies,
                                                            Materializer& mat);
  // The same with a cache room of its own over cache, made from cfg (verify, verify_threads,
  // space_wait, small_file_size); reader: how its copies are read back (outlives the core).
  static stage::Result<std::unique_ptr<StageFsCore>> create(CoreConfig cfg, NodeCache& cache,
                                                            Materializer& mat,
                                                            CopyReader& reader = disk_copy_reader());
  ~StageFsCore();

  // Metadata is answered as the caller `who` (lookup, lookup_many, getattr, readlink,
  // getxattr, listxattr): the path is resolved with the caller's credentials, so a caller
  // without search permission on a directory of the path (on the source, now) gets EACCES,
  // whatever the kernel cached about the directory. Root, and every caller of a daemon that
  // is not root, are not checked. `who` left empty: as root.
  // lookup() counts one reference to the node; forget() drops n of them.
  stage::Result<std::pair<uint64_t, struct stat>> lookup(uint64_t parent, const std::string& name,
                                                         const Caller& who = {});
  // lookup() of each entry's name in directory parent (READDIRPLUS: a slice of its listing),
  // with one open of the directory and one fstatat per name; a name that does not resolve
  // (or is not a plain name, or the caller may not search the directory) gets none.
  std::vector<std::optional<std::pair<uint64_t, struct stat>>> lookup_many(uint64_t parent,
                                                                           std::span<const DirEntry> entries,
                                                                           const Caller& who = {});
  void forget(uint64_t id, uint64_t n);
  stage::Result<struct stat> getattr(uint64_t id, const Caller& who = {});
  stage::Result<std::string> readlink(uint64_t id, const Caller& who = {});
  // The directory's listing (shared with other handles of the same version).
  stage::Result<DirSnapshot> readdir(uint64_t id, const Caller& who = {});
  // An opendir: readdir() for a new handle, counted against who's handle limit (EMFILE past it).
  stage::Result<OpenDir> opendir(uint64_t id, const Caller& who);
  stage::Result<struct statvfs> statfs();
  stage::Result<std::string> getxattr(uint64_t id, const std::string& name, const Caller& who = {});
  // Whether getxattr of `name` resolves the path as the caller (and so needs its groups): every
  // name but the POSIX ACLs. The kernel reads those for its own permission checks, and `ls -l`
  // of every entry for its '+', of nodes the kernel already holds: a walk as the caller for
  // each doubled a warm `ls -l` (credentials switched twice, the caller's groups read from
  // /proc). Their answer is like the attributes the kernel holds, not new metadata.
  static bool xattr_checked_as_caller(std::string_view name);
  stage::Result<std::string> listxattr(uint64_t id, const Caller& who = {});  // names, NUL-terminated
  using OpenDone = std::function<void(stage::Result<OpenFile>)>;
  // Calls done inline when the answer is known at once (a cached, verified copy; an error),
  // else later from the completion pool. The handle counts against who's handle limit from
  // the open on, also while it waits for its copy (EMFILE past it, ENFILE past the room every
  // user shares: handles.h).
  void open_async(uint64_t id, int flags, const Caller& who, OpenDone done);
  stage::Result<OpenFile> open(uint64_t id, int flags, const Caller& who = {});  // blocking form
  // A read of a handle opened during its copy (OpenFile::live): at once or when its chunks
  // are here (done may run on another thread). Reads of chunks that never come fail with
  // EIO, or, when the group stalled and the mount falls back to the source (--on-stall
  // source), come from source_fd (OpenFile::fd of that handle: the source, opened at the
  // open and checked to be the version being copied; -1: none).
  void read_live(const std::shared_ptr<LiveCopy>& live, int source_fd, uint64_t off, size_t size,
                 std::function<void(stage::Result<std::string>)> done);
  // The handle of an open is gone: its copy may be evicted again.
  void release(const std::string& pinned);
  // stagectl: start the materialization of a file the caller may read (as an open would);
  // done when it is in the cache (or failed).
  void prefetch_async(uint64_t id, const Caller& who, std::function<void(stage::Status)> done);
  // stagectl: remove a file's copy from this node's cache (root or the source file's owner;
  // EBUSY while it is open on this node).
  stage::Status evict(uint64_t id, const Caller& who);
  // stagectl: whether this node's cache holds a current copy of the file (the validity rule,
  // NodeCache::open_current), for a caller who may read it (the access check of an open:
  // others learn nothing of the cache, only EACCES). Copies nothing, counts no open.
  stage::Result<bool> has_copy(uint64_t id, const Caller& who) const;
  // The cache room's copies_made() (the mount's group tells it through its admission; tests
  // with a group of their own tell the core). The materializer published these copies in this mount (a batch
  // of small files): they were checked chunk by chunk while written, so their first open skips the CRC
  // re-read that a copy from an earlier mount gets (Verify::crc). Each is named by the stat of the copy
  // (device, inode, mtime), as NodeCache::added_in returns it.
  void copies_made(const std::vector<struct stat>& copies);
  // Finishes the verifier (a CRC read in progress ends first; opens waiting for one that had
  // not started get ESHUTDOWN), then the completion pool (pending work runs first). Called
  // before the edge goes away.
  void stop();
  // Any change to the tree: always EROFS.
  static stage::Error read_only(const char* op);

  // Synthetic attributes on the root ("user.stagefs.*"), answered by the daemon for the
  // caller who asks (what it shows may depend on who: may_read()).
  // The daemon's answer to a user.stagefs.* attribute of the root (a value, or an error such
  // as EPERM); nullopt: not one of its names.
  using ControlXattr =
      std::function<std::optional<stage::Result<std::string>>(const std::string& name, const Caller& who)>;
  void set_control_xattr(ControlXattr fn) { control_xattr_ = std::move(fn); }
  // Told of each open of a regular file that passed its checks (access, version), cached or
  // not, on the opening thread (not stagectl prefetch): the mount's record of what its job
  // read (profile/recorder.h). Must be quick. Set before the mount serves.
  using OpenObserver = std::function<void(const std::string& rel)>;
  void set_open_observer(OpenObserver fn) { open_observer_ = std::move(fn); }
  // Whether the caller could open rel (a file: read it; a directory: list it) through the
  // mount: rel is resolved beneath SOURCE_DIR with the caller's credentials (search
  // permission on SOURCE_DIR and on every directory on the way, as the kernel's walk through
  // the mount checks it), then read permission is checked on what was found, as
  // open_as_caller() does. Root: always; a daemon that is not root (it cannot
  // take other credentials): its own user only. Counts no denial.
  [[nodiscard]] bool may_read(const std::string& rel, const Caller& who) const;
  [[nodiscard]] int root_fd() const { return root_.get(); }
  [[nodiscard]] const CoreCounters& counters() const { return counters_; }
  [[nodiscard]] const CopyCounters& copy_counters() const { return copies_.counters(); }
  [[nodiscard]] XattrCache::Stats xattr_stats() const { return xattrs_.stats(); }
  [[nodiscard]] size_t node_count() const;
  [[nodiscard]] AccessCheck::Method access_method() const { return access_.method(); }
  stage::Result<std::string> path_of(uint64_t id) const;

 private:
  StageFsCore(CoreConfig cfg, std::unique_ptr<NodeCopies> own, NodeCopies& copies, Materializer& mat,
              stage::Fd root);
  // A new core, its access check's method logged where it is not faccessat2.
  static std::unique_ptr<StageFsCore> started(std::unique_ptr<StageFsCore> core);
  stage::Result<struct stat> stat_rel(const std::string& rel) const;
  // stat of rel resolved as the caller (resolve_as_caller, no access mask).
  stage::Result<struct stat> stat_as_caller(const std::string& rel, const Caller& who) const;
  // Whether who's requests are resolved with who's credentials (not root, and a root daemon).
  static bool checked_as_caller(const Caller& who);
  stage::Result<std::string> list_source_xattrs(const std::string& rel) const;
  // rel opened beneath SOURCE_DIR (flags as for open_beneath) with the caller's fsuid, fsgid
  // and groups on this thread, then checked for `mask` (AccessCheck: faccessat2, or where the
  // kernel lacks it a reopen as the caller, as_caller.h) on what was
  // opened: the kernel searches every directory from SOURCE_DIR down to rel's parent as the
  // caller would (modes and POSIX ACLs as they are now on the source), and the mask is checked
  // on the very inode that is then stat'ed or listed, never on a path resolved again (a path
  // checked apart from the fd could be swapped in between by a user who may rename a parent).
  // Root callers, and a daemon that does not run as root, resolve with the daemon's own rights.
  // The same number of path walks and credential switches as a check of the file alone: no
  // answer is cached, so a chmod or setfacl on the source counts from the next open on.
  // Counts a denial (CoreCounters::denied).
  stage::Result<stage::Fd> open_as_caller(const std::string& rel, int flags, int mask,
                                          const Caller& who) const;
  // open_as_caller() without counting (may_read() is not an open). mask 0: the path walk
  // alone (search permission on every directory on the way), no check on what it reached.
  stage::Result<stage::Fd> resolve_as_caller(const std::string& rel, int flags, int mask,
                                             const Caller& who) const;

  // The open chain, in the order an open goes through it (core_open.cc). An open (open_async,
  // prefetch_async) hands its answer (done) on from step to step; none holds a thread while a
  // copy or a CRC read-back runs. check_open runs on the caller's thread (a FUSE worker, or
  // stagectl's), every later step on the core's completion pool.
  //   check_open       the checks every open passes (read-only, the id's version, access as the
  //                    caller, temporary names); a copy trusted in this mount is answered here;
  //   ask_cache        the cache room's one answer (NodeCopies::ask): serve a copy (this
  //                    name's or another name's), check it first, wait for another name's
  //                    transfer, or miss;
  //   materialize      asks the materializer for the copy: the file alone, its directory's
  //                    small files, or answered during the copy (open_live);
  //   materialized     the outcome: the copy made (open_materialized, or the source after a
  //                    stall); a batch that failed or left the file out: the file alone
  //                    (batch_ended); no room: wait for it (wait_for_room), then materialize.
  // How an open asks the materializer: small (its directory's slice; `since` as
  // materialize_small_async's), live_ok (answer during the copy).
  struct Ask {
    Want want;
    bool small = false;
    bool live_ok = false;
    uint64_t since = 0;
  };
  // An open past its checks, on its way to a copy. space_deadline: when an open that found no
  // room stops waiting for it (unset before its first refusal).
  struct Pending {
    std::string rel;
    struct stat src {};
    Ask ask;
    OpenDone done;
    Clock::time_point space_deadline{};
  };
  // live_ok: answer during the copy (read_during_copy; not for prefetch); background: a
  // prefetch (no open waits for it).
  void check_open(uint64_t id, int flags, const Caller& who, OpenDone done, bool live_ok,
                  bool background = false);
  // The source file an open of rel (the id's version) reads: resolved as the caller, checked
  // for read access, a regular file, still that version (ESTALE if not).
  stage::Result<struct stat> check_source(const std::string& rel, const stage::FileMeta& version,
                                          const Caller& who);
  // A path named like a copy's temporary file: served from the source, never cached.
  stage::Result<OpenFile> open_temp_name(const std::string& rel, const stage::FileMeta& version);
  // checked: the copy's CRC read-back (if it needed one) has ended.
  void ask_cache(Pending p, bool checked);
  // This open's copy is the one the file's other names wait for (hard links): done is wrapped
  // to tell the cache room when it ends, and the open waits for a whole copy.
  void make_linked_copy(Pending& p);
  void materialize(Pending p);
  void materialized(Pending p, const stage::Status& outcome, uint64_t space_epoch);
  void batch_ended(Pending p, const stage::Status& outcome);
  // The copy found no room (ENOSPC, `why`): the cache room's RoomWaits says when to ask for it
  // again, or fails the open. space_epoch: NodeCopies::space_epoch() read before the copy was
  // asked for.
  void wait_for_room(Pending p, uint64_t space_epoch, const stage::Error& why);
  // The copy is in progress on this node: the open returns with it (reads wait for chunks).
  void open_live(Pending p, std::shared_ptr<LiveCopy> live);
  // done: the materialization's outcome.
  stage::Result<OpenFile> open_materialized(const std::string& rel, const struct stat& src,
                                            const stage::Status& done);
  void post(std::function<void()> fn);
  void completion_loop();

  // A cache room of the core's own (the create() that takes a NodeCache), else null.
  std::unique_ptr<NodeCopies> own_copies_;
  CoreConfig cfg_;
  NodeCopies& copies_;  // the cache room: every question about a copy goes to it
  Materializer& mat_;
  stage::Fd root_;
  // Directory snapshots by (path, dev, inode, mtime, ctime), while some handle holds them.
  std::mutex dirs_m_;
  std::map<std::tuple<std::string, uint64_t, uint64_t, int64_t, int64_t>,
           std::weak_ptr<const std::vector<DirEntry>>>
      dirs_;
  // The listing as the handles share it; the last one's release gives its bytes back.
  DirSnapshot share_listing(std::unique_ptr<std::vector<DirEntry>> entries, uint32_t uid,
                            uint64_t bytes) const;
  // Completion pool.
  std::mutex pool_m_;
  std::condition_variable pool_cv_;
  std::deque<std::function<void()>> pool_q_;
  bool pool_stop_ = false;
  std::vector<std::thread> pool_;
  // Bytes each user holds through the mount: the listings its opendirs built (held while a
  // handle of them is open) and the nodes its lookups created (held until the kernel forgets
  // them), against CoreConfig::listing_bytes_per_user. Shared with the listings' deleters,
  // which may run after the core.
  std::shared_ptr<UserBytes> budget_;
  NodeTable nodes_;                // the node ids (thread-safe on its own)
  mutable CoreCounters counters_;  // counted from const paths too (access checks)
  AccessCheck access_;             // how access is checked as the caller (chosen at start)
  ControlXattr control_xattr_;
  OpenObserver open_observer_;
  XattrCache xattrs_;     // per node id; its lock is innermost
  HandleLimits handles_;  // what each user holds open
};

}  // namespace stagefs
