// The stagefs daemon: one per node, all of a job step forming one mount group.
//
// Threads:
//   main        initializes MPI (FUNNELED: it is the only thread that ever calls MPI), mounts,
//               agrees with every rank that all mounted, then runs GroupService::run()
//   fuse        the FUSE session loop (and its workers): never calls MPI; waits for
//               materializations on the group
//   supervisor  takes SIGTERM/SIGINT/SIGHUP (blocked everywhere else) and the end of the
//               FUSE loop (fusermount3 -u); unmounts this node, asks the group to shut down,
//               and if the main thread does not finish in time (stuck in a stalled MPI
//               collective) ends the process itself: no orphan, no stale mount.
//   startup-watch  only until every rank is through MPI start-up (bcast/comm/mpi_start.h): ends
//               the process with status 3 if that takes longer than --startup-timeout
// SIGPIPE, SIGUSR1, SIGUSR2 and SIGALRM are ignored: none of them ends the mount.
// Without a launcher the group is a world of one rank (SelfComm, LocalControlPlane): a
// local cache-on-open filesystem.
#pragma once

#include <string>

#include "bcast/comm/mpi_start.h"
#include "bcast/io/chunk.h"
#include "bcast/io/seams.h"
#include "bcast/transfer/pipeline.h"
#include "fusefs/core/core.h"
#include "fusefs/edge/mount.h"
#include "fusefs/edge/status.h"
#include "fusefs/group/group.h"

namespace stagefs {

// The largest --small-file-size: a batch's files share one stream and its buffers.
inline constexpr uint64_t kMaxSmallFileSize = uint64_t{1} << 30;

// The daemon's settings, one member per stagefs option: the values here are the defaults
// (tools/stagefs.cc shows them in --help).
struct DaemonConfig {
  std::string source_dir;
  std::string mountpoint;
  std::string cache_dir;
  uint64_t chunk_size = stage::kDefaultChunk;
  stage::BcastAlgorithm bcast_algorithm = stage::BcastAlgorithm::automatic;  // chunk data path
  // --bcast-segment: chain/tree message size (0: stage::kDefaultSegment). Every rank posts
  // receives of the sender's size, so rank 0's value is every rank's (agreed at start).
  uint64_t bcast_segment = 0;
  double stall_timeout = 60;     // seconds without progress before an open gives up
  double shutdown_timeout = 10;  // seconds the group gets to shut down together
  // Seconds every rank gets to go through MPI start-up (bcast/comm/mpi_start.h); 0: no bound.
  double startup_timeout = stage::kDefaultStartupTimeout;
  StallPolicy on_stall = StallPolicy::eio;
  // Cache copies written with O_DIRECT where the filesystem accepts it. Off by default: a copy
  // is made because a process is about to read it, and buffered writes leave it in the page
  // cache for that read, which then costs no disk read; direct writes cost less CPU but
  // leave that read to the disk (bench/README.md).
  bool direct_io = false;
  Verify verify_cache = Verify::crc;  // check each cached copy's CRC once per mount before serving it
  // --source-version: what identifies a source version (the cache's validity rule, seeds).
  stage::SourceVersion source_version = stage::SourceVersion::full;
  // --small-file-size: files of at most this many bytes are staged with every other small
  // file of their directory in one transfer (0: every file alone).
  uint64_t small_file_size = stage::kMiB;  // at most kMaxSmallFileSize
  // --read-during-copy: an open of a file being copied returns once its transfer runs here;
  // reads wait for their chunks only (and ask for them first).
  bool read_during_copy = true;
  // --nested-batches, --prefetch-siblings, --batch-max-files, --batch-max-bytes,
  // --prefetch-max-dirs, --prefetch-max-bytes, --prefetch-max-files (group/group.h; rank 0's
  // settings count). The batch limits bound a batch to a few seconds of copying, so other
  // requests do not wait long behind it.
  BatchPolicy batches;
  double sync_after = 5;  // --sync-after: seconds a batch's copies may stay unsynced
  // --spare-caches: when --cache is in use by another stagefs on this node (another job of the
  // same user), the first free of CACHE/spare.1 .. CACHE/spare.N is used instead (0: refuse).
  unsigned spare_caches = 0;
  uint64_t cache_size = 0;        // --cache-size in bytes (0: none) ...
  double cache_size_percent = 0;  // ... or a percentage of the cache filesystem
  // --profile: where the mount records what its job read, written when it ends, and where
  // the next mount finds it to replay: "auto" (under the user's cache directory, keyed by
  // SOURCE_DIR: profile/file.h), "off" (neither), or a path. The same on every node.
  std::string profile = "auto";
  // --replay: the coordinator's node stages the profile's files in the background once every
  // node mounted (profile/replay.h). Off: only record.
  bool replay = true;
  // --max-open-per-user: files and directories one user other than root may hold open through
  // the mount on a node (at most a quarter of what the descriptor limit leaves users:
  // fusefs/core/handles.h); past it, that user's opens fail with EMFILE.
  uint64_t max_open_per_user = 4096;
  std::string metrics_file;      // --metrics-file (empty: none)
  double metrics_interval = 10;  // seconds between rewrites
  MountOptions mount;
  // Wraps the store and the source the group hands the engine (the tool's: the crash tests'
  // hold points, bcast/holds/holds.h); empty: they are used as they are.
  stage::SeamWrapper wrap_seams;
};

// Returns the process exit status.
int run_daemon(DaemonConfig cfg, int* argc, char*** argv);

// `stagefs --wait MOUNTPOINT`: returns 0 once every node of the group has mounted.
int wait_ready(const std::string& mountpoint, double timeout_s);

// The configuration is checked before anything is mounted, in two steps that each return an
// explanation, or empty. First the usage errors (exit status 2): the three paths made
// absolute with symlinks resolved (cfg is updated), then refused when one lies inside another
// (MOUNTPOINT in SOURCE_DIR or in --cache, --cache in SOURCE_DIR or MOUNTPOINT, SOURCE_DIR in
// --cache, SOURCE_DIR = MOUNTPOINT) or SOURCE_DIR is on a pseudo filesystem (/proc, /sys...).
// The message names both paths.
std::string check_paths(DaemonConfig& cfg);
// Then, on the paths check_paths made absolute: SOURCE_DIR is a directory, the stall timeout
// is positive, the mount point can be mounted on (check_mountpoint).
std::string check_source_and_mount(const DaemonConfig& cfg);

}  // namespace stagefs
