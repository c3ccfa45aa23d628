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
//     attributes are hidden from callers other than root.
//   - Listings: one snapshot per directory version is shared by every open handle of it and
//     freed with the last one: memory does not grow with the number of handles.
//   - Opens that must wait for a copy do not hold the caller's thread: open_async() answers
//     through a callback, run on the core's small completion pool.
//   - Room: an open whose copy does not fit in the cache because other copies are held open
//     on this node waits for room without holding a thread (the cache room's RoomWaits,
//     cache/wait.h), then asks for the copy again; past CoreConfig::space_wait it fails with
//     ENOSPC.
//   - Hard links: the names of one source file (one version of one inode) cost one transfer
//     (the cache room's LinkedCopies, cache/links.h, says which name's copy serves them). The
//     first open of a file with several links waits for its whole copy (no reads during the copy).
//   - Trust in a copy's bytes is the cache room's CopyChecker (cache/verify.h), which the core
//     owns for the mount's life and asks once per open: serve this copy, wait for its CRC
//     read-back (on the checker's threads, once per copy), or miss.
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
#include <set>
#include <thread>
#include <tuple>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <span>
#include <unordered_map>
#include <vector>

#include "bcast/fd.h"
#include "bcast/manifest.h"
#include "bcast/source.h"
#include "fusefs/cache/links.h"
#include "fusefs/cache/verify.h"
#include "fusefs/cache/wait.h"
#include "fusefs/xattr_cache.h"

namespace stagefs {

class NodeCache;
class LiveCopy;
using Clock = std::chrono::steady_clock;

// Whom a materialization is for: the uid of the open that asked (the group's queue takes
// turns by uid, coordinator.h), and whether no open waits for it (stagectl prefetch: queued
// behind every open).
struct Want {
  uint32_t uid = 0;
  bool background = false;
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
  virtual void materialize_live_async(const std::string& rel, const Want& want, Done done, LiveStarted on_live) {
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
  Verify verify = Verify::crc;  // check a cached copy's CRC once per mount before serving it
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
  // over the listings that user's opendirs built. Handles on one version of a directory share
  // one listing; a user who changes a large directory between opendirs builds a new one each
  // time. Past this, opendir fails with ENOMEM for that user only.
  uint64_t listing_bytes_per_user = uint64_t{1} << 30;
  // An open whose copy finds no room in this node's cache because copies held open here
  // (pinned) take it waits for room (pins released, copies evicted or removed), up to this
  // long from its first refusal, then fails with ENOSPC and a log line that names the cause.
  // The mount passes its stall timeout. 0: such an open fails at once.
  std::chrono::milliseconds space_wait{std::chrono::seconds(60)};
};

// Who asks (from the FUSE request). uid 0 is not checked.
struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;
};

struct OpenFile {
  stage::Fd fd;
  bool cache_hit = false;    // served from a copy that was already there
  bool from_source = false;  // stall fallback: reads go to the shared source
  std::string pinned;        // the cache copy held while this file is open: pass to release()
  std::shared_ptr<LiveCopy> live;  // set: the copy is in progress; read through read_live()
                                   // (fd: the source for --on-stall source, else unset)
};

struct DirEntry {
  std::string name;
  uint64_t ino = 0;  // the source's inode number (never 0)
  uint32_t mode = 0;
};
using DirSnapshot = std::shared_ptr<const std::vector<DirEntry>>;

// verified, corrupt and verify_waits are the CopyChecker's (CheckCounters).
struct CoreCounters : CheckCounters {
  std::atomic<uint64_t> opens{0}, cache_hits{0}, materializations{0}, source_fallbacks{0}, open_errors{0};
  std::atomic<uint64_t> stale_opens{0}, denied{0}, prefetches{0};
  std::atomic<uint64_t> opens_during_copy{0};  // opens answered while their copy was in progress
  std::atomic<uint64_t> room_waits{0};    // opens that waited for room held by open copies (no_room);
                                          // notified (atomic wait) once such an open is queued
};

class StageFsCore {
 public:
  static constexpr uint64_t kRootId = 1;
  // reader: how the cache's copies are read back for their CRC (CopyReader; outlives the core).
  static stage::Result<std::unique_ptr<StageFsCore>> create(CoreConfig cfg, NodeCache& cache,
                                                            Materializer& mat,
                                                            CopyReader& reader = disk_copy_reader());
  ~StageFsCore();

  // lookup() counts one reference to the node; forget() drops n of them.
  stage::Result<std::pair<uint64_t, struct stat>> lookup(uint64_t parent, const std::string& name);
  // lookup() of each entry's name in directory parent (READDIRPLUS: a slice of its listing),
  // with one open of the directory and one fstatat per name; a name that does not resolve
  // (or is not a plain name) gets none.
  std::vector<std::optional<std::pair<uint64_t, struct stat>>> lookup_many(uint64_t parent,
                                                                           std::span<const DirEntry> entries);
  void forget(uint64_t id, uint64_t n);
  stage::Result<struct stat> getattr(uint64_t id);
  stage::Result<std::string> readlink(uint64_t id);
  // The directory's listing (shared with other handles of the same version).
  stage::Result<DirSnapshot> readdir(uint64_t id, const Caller& who = {});
  stage::Result<struct statvfs> statfs();
  stage::Result<std::string> getxattr(uint64_t id, const std::string& name, const Caller& who = {});
  stage::Result<std::string> listxattr(uint64_t id, const Caller& who = {});  // names, NUL-terminated
  using OpenDone = std::function<void(stage::Result<OpenFile>)>;
  // Calls done inline when the answer is known at once (a cached, verified copy; an error),
  // else later from the completion pool.
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
  // The materializer published these copies in this mount (a batch of small files): they
  // were checked chunk by chunk while written, so their first open skips the CRC re-read that
  // a copy from an earlier mount gets (Verify::crc). Each is named by the stat of the copy
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
  // Whether the caller could open rel (a file: read it; a directory: list it) through the
  // mount: rel is resolved beneath SOURCE_DIR with the caller's credentials (search
  // permission on SOURCE_DIR and on every directory on the way, as the kernel's walk through
  // the mount checks it), then read permission is checked on what was found, as
  // open_as_caller() does. Root: always; a daemon that is not root (it cannot
  // take other credentials): its own user only. Counts no denial.
  [[nodiscard]] bool may_read(const std::string& rel, const Caller& who) const;
  [[nodiscard]] int root_fd() const { return root_.get(); }
  [[nodiscard]] const CoreCounters& counters() const { return counters_; }
  [[nodiscard]] XattrCache::Stats xattr_stats() const { return xattrs_.stats(); }
  [[nodiscard]] size_t node_count() const;
  stage::Result<std::string> path_of(uint64_t id) const;

 private:
  StageFsCore(CoreConfig cfg, NodeCache& cache, Materializer& mat, CopyReader& reader, stage::Fd root);
  stage::Result<struct stat> stat_rel(const std::string& rel) const;
  stage::Result<std::string> list_source_xattrs(const std::string& rel) const;
  // rel opened beneath SOURCE_DIR (flags as for open_beneath) with the caller's fsuid, fsgid
  // and groups on this thread, then checked for `mask` (faccessat2 AT_EMPTY_PATH) on what was
  // opened: the kernel searches every directory from SOURCE_DIR down to rel's parent as the
  // caller would (modes and POSIX ACLs as they are now on the source), and the mask is checked
  // on the very inode that is then stat'ed or listed, never on a path resolved again (a path
  // checked apart from the fd could be swapped in between by a user who may rename a parent).
  // Root callers, and a daemon that does not run as root, resolve with the daemon's own rights.
  // The same number of path walks and credential switches as a check of the file alone: no
  // answer is cached, so a chmod or setfacl on the source counts from the next open on.
  // Counts a denial (CoreCounters::denied).
  stage::Result<stage::Fd> open_as_caller(const std::string& rel, int flags, int mask, const Caller& who) const;
  // open_as_caller() without counting (may_read() is not an open).
  stage::Result<stage::Fd> resolve_as_caller(const std::string& rel, int flags, int mask, const Caller& who) const;

  // The open chain. An open (open_async, prefetch_async) takes up to four steps, each handing
  // the open's answer (done) on to the next; none holds a thread while a copy or a CRC
  // read-back runs:
  //   check_open             on the caller's thread: the checks every open passes (read-only,
  //                          the id's version, access as the caller, temporary names), then a
  //                          copy trusted in this mount is answered at once;
  //   serve_or_materialize   on the completion pool: the cache room's answer (serve the copy,
  //                          wait for its CRC read-back, or miss), another name's copy (hard
  //                          links), else on to a copy;
  //   materialize_then_open  asks the materializer for the copy (the file alone, its
  //                          directory's small files, or answered during the copy); no room:
  //                          the cache room's wait (no_room); a failed batch: the file alone;
  //   open_materialized      the verified copy the materialization made, or the source after
  //                          a stall (--on-stall source).
  // How an open asks the materializer: small (its directory's slice; `since` as
  // materialize_small_async's), live_ok (answer during the copy).
  struct Ask {
    Want want;
    bool small = false;
    bool live_ok = false;
    uint64_t since = 0;
  };
  // space_deadline: when an open that found no room (no_room) stops waiting; unset before.
  void materialize_then_open(const std::string& rel, const struct stat& src, Ask ask, OpenDone done,
                             Clock::time_point space_deadline = {});
  // rel's copy found no room (ENOSPC, `why`): the cache room's RoomWaits says when to ask
  // for it again, or fails the open. space_epoch: NodeCache::space_epoch() read before the
  // copy was asked for.
  void no_room(const std::string& rel, const struct stat& src, const Ask& ask, OpenDone done,
               Clock::time_point deadline, uint64_t space_epoch, const stage::Error& why);
  // live_ok: answer during the copy (read_during_copy; not for prefetch); background: a
  // prefetch (no open waits for it).
  void check_open(uint64_t id, int flags, const Caller& who, OpenDone done, bool live_ok,
                  bool background = false);
  // checked: the copy's CRC read-back (if it needed one) has ended.
  void serve_or_materialize(const std::string& rel, const struct stat& src, Ask ask, OpenDone done,
                            bool checked);
  // done: the materialization's outcome.
  stage::Result<OpenFile> open_materialized(const std::string& rel, const struct stat& src,
                                            const stage::Status& done);
  void post(std::function<void()> fn);
  void completion_loop();
  // Hard links (LinkedCopies): if another name of src's version has a copy made in this
  // mount, or is being materialized, serves this open from that copy (now, or once that
  // transfer ended) and returns true. Otherwise, rel's open is the one that materializes that
  // version: done is wrapped to record the copy and release the waiting names, and
  // ask.live_ok is cleared.
  bool serve_from_other_name(const std::string& rel, const struct stat& src, Ask& ask, OpenDone& done);
  LinkedCopies links_;

  struct Node {
    std::string rel;
    uint64_t nlookup = 0;
    stage::FileMeta version;  // regular files: the source version this id stands for
    uint32_t uid = 0, gid = 0;  // ... and its owner (getattr once the path holds something else)
  };
  CoreConfig cfg_;
  NodeCache& cache_;
  Materializer& mat_;
  stage::Fd root_;
  // Directory snapshots by (path, dev, inode, mtime, ctime), while some handle holds them.
  std::mutex dirs_m_;
  std::map<std::tuple<std::string, uint64_t, uint64_t, int64_t, int64_t>, std::weak_ptr<const std::vector<DirEntry>>>
      dirs_;
  // Bytes of the listings alive, by the uid whose opendir built them (CoreConfig::
  // listing_bytes_per_user). Shared with the listings' deleters, which may run after the core.
  struct ListingBytes {
    std::mutex m;
    std::map<uint32_t, uint64_t> by_uid;
  };
  std::shared_ptr<ListingBytes> listing_bytes_ = std::make_shared<ListingBytes>();
  // The steps of readdir. Counts a listing of `bytes` against uid's budget (root: none), or
  // fails with ENOMEM if it would go over.
  stage::Status charge_listing(uint32_t uid, uint64_t bytes, const std::string& rel);
  // The listing as the handles share it; the last one's release gives its bytes back.
  DirSnapshot share_listing(std::unique_ptr<std::vector<DirEntry>> entries, uint32_t uid,
                            uint64_t bytes) const;
  // Completion pool.
  std::mutex pool_m_;
  std::condition_variable pool_cv_;
  std::deque<std::function<void()>> pool_q_;
  bool pool_stop_ = false;
  std::vector<std::thread> pool_;
  // Trust in the copies (made after the pool: its callbacks post to it; stopped before it).
  std::unique_ptr<CopyChecker> checker_;
  // Opens waiting for room in the cache (no_room); made after the pool (its answers post to
  // it), stopped before it.
  std::unique_ptr<RoomWaits> room_waits_;
  // The id of the source node rel (stat st) for a lookup, counting one reference (m_ held).
  uint64_t note_lookup_locked(const std::string& rel, const struct stat& st);
  mutable std::mutex m_;  // guards nodes_, ids_, next_id_
  std::unordered_map<uint64_t, Node> nodes_;
  std::unordered_map<std::string, uint64_t> ids_;
  uint64_t next_id_ = kRootId + 1;
  mutable CoreCounters counters_;  // counted from const paths too (access checks)
  ControlXattr control_xattr_;
  XattrCache xattrs_;  // per node id; its lock is innermost (forget() takes it under m_)
};

}  // namespace stagefs
