// The terms of one transfer (bcast/transfer/engine.h): what its caller asks (StageOptions,
// StageEndpoint, the extension points LiveCopyReaders and Nest, a FileSelection) and what every
// rank gets back (StageReport). Plain types; the transfer's inside (transfer.h) includes them
// without the entry point.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bcast/comm/comm.h"
#include "bcast/io/chunk.h"
#include "bcast/io/source.h"
#include "bcast/io/store.h"
#include "bcast/transfer/pipeline.h"

namespace stage {

// A live copy: a copy that readers read before it ends. The engine tells the readers what is
// in the temporary file and they steer the order of the chunks. Used when the transfer streams
// exactly one file (not a tree, not a selection): chunk i is then the file's bytes
// [i x chunk_size, ...), and the reading rank reads the chunks in an order that follows the
// readers: first every chunk a reader on any rank asked for (passed up the chain or tree,
// ChunkStream::want; with the MPI collective, the reading rank's own readers only), then on
// from there in file order, then any chunk left behind. Each chunk still travels once; every
// chunk still carries its CRC, and the whole file's CRC is still checked before anything is
// published.
class LiveCopyReaders {
 public:
  virtual ~LiveCopyReaders() = default;
  // Chunks are chunks of the file: chunk i is its bytes [i x chunk_size, ...).
  // The calling thread, on a rank that writes the file, once its temporary file exists (after
  // the prepare agreement, before any chunk): the source version being copied, and its holes
  // (whole chunks, or a last chunk's tail: never sent, they read as zeros from the start).
  virtual void started(const FileMeta& source, uint64_t chunk_size, const std::vector<Extent>& holes,
                       const Txn& txn) = 0;
  // The writer thread: chunk `index` is verified (its CRC) and in the temporary file; zero: it
  // is a hole (nothing written: it reads as zeros).
  virtual void chunk_written(uint64_t index, bool zero) = 0;
  // The calling thread, at every turn of the copy loop, on every rank (and on the reading
  // rank once before its reader picks the first chunk): chunk indices readers here wait for,
  // appended to `out`, wanted first in that order. Must be cheap when there are none.
  virtual void take_wanted(std::vector<uint64_t>& out) = 0;
  // The calling thread: the copy runs again (its feeder failed; see Fallback in engine.h) into the
  // same temporary file, from another feeder. Chunks written stay written (the same version:
  // the same bytes); the chunks readers still wait for are to be wanted again.
  virtual void restarted() {}
};

// More than one transfer at a time: a short transfer (a selection of small files) that
// must not wait until a long one (a 50 GB image) ends runs NESTED in it, on another Comm, at a
// point of the long transfer's own stream that every rank sees: the source rank puts a nest
// header (kChunkNest, a token, no payload) between two chunks, and each rank, once that header
// is complete here (every chunk before it received, passed on to its children and handed to
// its writer), runs the nested transfer to the end, then goes on with the long one. Deciding
// in-band is what keeps the ranks in step: they reach the mark at different times, but every
// rank reaches it, since each passed it on before it left (a decision taken from the control
// plane alone could find one rank already past the last chunk and another waiting for it).
// The mark never follows the last chunk, so every rank still expects a chunk after it. A mark
// does not wait for the source's next chunk (a slow source does not delay the nested
// transfer). The long stream's pending messages wait on its own Comm meanwhile; its stall
// clock restarts afterwards. With the MPI collective the mark is a header broadcast of its own.
class Nest {
 public:
  virtual ~Nest() = default;
  // The calling thread, at every turn of the copy loop, on every rank: a chance to poll the
  // control plane. Must not use the long transfer's Comm; must be cheap when idle. An error
  // ends the long transfer (comm_broken).
  virtual Status poll() = 0;
  // Source rank, at every turn of the copy loop while chunks remain to be sent: a token (not
  // 0) if a nested transfer is to start there, else 0.
  virtual uint32_t mark() = 0;
  // Every rank, when the mark carrying `token` is complete here: runs the nested transfer
  // (COLLECTIVE on another Comm). An error means that Comm broke: the long transfer then
  // fails as if its own Comm had (comm_broken).
  virtual Status run(uint32_t token) = 0;
};

// size: same size and mtime; checksum: same CRC-64; none: always copy;
// recorded: the source version the copy recorded when it was written (its Origin: Txn::finish,
// io/store.h) is the source's now (size, mtime, ctime and, by StageOptions::source_version,
// inode): a touched or replaced source is copied again. A store that records none (no
// CopyXattrs) has no copy current by this rule.
// Whether a node's copy may also FEED others (a seed) is stricter than whether it counts as
// present on its own node: only a copy proven to be the source's current version does: one
// whose recorded origin matches the source now (for reads during the copy: also with a
// ChunkRecord that proves every chunk before it is sent), or one checked by checksum. Under
// `size`, a same-size, same-mtime file of unknown origin stays on its node (mpi-stage's
// meaning) but never feeds another.
enum class Validate { none, size, checksum, recorded };

// Seeds tried within one transfer before the source rank feeds it (engine.h: Fallback).
inline constexpr int kMaxSeedAttempts = 3;

// Which of ep.source's files a transfer stages. None (max_file_size 0): ep.source itself, one
// file or, with StageOptions::recursive, a tree. A selection: ep.source is a directory and the
// transfer stages its regular files of at most max_file_size bytes within `range` (not
// recursive: no subdirectory, symlink or larger file; SourceReader::scan_selection) into the
// directory ep.dest, packed into one stream as a tree is. Their copies are published as one
// group (LocalStore::publication): the data made durable once, before any rename; names are
// not synced (a crash may lose a name, never publish data that is not durable).
struct FileSelection {
  uint64_t max_file_size = 0;
  SelectionSlice range;
  [[nodiscard]] bool active() const { return max_file_size > 0; }
};

struct StageOptions {
  // The source rank's value travels in the manifest: every rank uses it (its own is ignored),
  // so ranks started with different values still cut the stream the same way.
  uint64_t chunk_size = kDefaultChunk;
  Validate pre = Validate::size;
  Validate post = Validate::none;
  bool overwrite = false;
  bool recursive = false;
  FileSelection selection;  // none: ep.source whole
  // A tree (recursive): these files (manifest paths) go first in the stream, in this order (a
  // profile's: the files a job read first); the others follow. Only the source rank's counts.
  std::vector<std::string> first_files;
  int root = 0;
  // Seeding: when some writer's copies of every file any node needs are current (by `pre`),
  // the lowest such rank (the seed) reads its own copies and roots the broadcast instead of
  // `root` reading the source; `root` still scans the source and re-checks its metadata after
  // the stream. The lowest rank: every rank computes the same choice from one allreduce, and
  // with a pipelined chain or tree the root's position barely changes the time. Off: `root`
  // always reads (a caller that must not read copies, and stage-bcast with an explicit
  // --source-rank).
  bool seed_from_copies = false;
  // What identifies a source version (the origin rule): every rank's setting must agree.
  SourceVersion source_version = SourceVersion::full;
  int pipeline_depth = 4;
  // Asked by the source rank's reader before each chunk: true abandons the transfer there
  // (every rank sees the abort in the stream; nothing is published, temporary files go).
  std::function<bool()> cancelled;
  // A live copy's readers (see LiveCopyReaders); nullptr: chunks in file order, no hooks.
  LiveCopyReaders* live_copy = nullptr;
  // Nested transfers (see Nest); nullptr: none (a header marked kChunkNest is then invalid).
  Nest* nest = nullptr;
  // How the chunks travel (bcast/transfer/pipeline.h, bcast/transfer/chunk_mover.h): chain or tree, all
  // chunks of a transfer as one pipelined stream with their headers in-band; mpi (or a stream too small to
  // pipeline, or a Comm without a point-to-point seam), a header broadcast and Comm::bcast per chunk. Either
  // way through the same copy loop. The manifest and the outcomes always go through the Comm's own
  // collectives.
  BcastAlgorithm bcast_algorithm = BcastAlgorithm::automatic;
  PipelineOptions pipeline;
};

struct StageEndpoint {
  std::string source;  // used on the root only
  std::string dest;    // this node's destination path
  bool writer = true;  // false: relay only
};

struct PhaseTimes {
  double topology = 0, metadata = 0, prevalidate = 0, copy = 0, postvalidate = 0, total = 0;
};

// Where the copy phase went, in seconds, each the largest over all ranks: the biggest busy
// figure names the bottleneck (read: the source; bcast: the network or a slow peer; verify,
// write, sync: the nodes' CPUs and disks). Waits are back-pressure, not work.
struct PipelineTimes {
  double read = 0;        // source rank's reader: pread + CRC
  double read_wait = 0;   // reader waiting for a free buffer (downstream is slower)
  double bcast = 0;       // MPI thread inside the chunk broadcasts (headers and payloads)
  double verify = 0;      // writer: CRC check of received chunks
  double write = 0;       // writer: writes to the temporary file
  double write_wait = 0;  // writer waiting for the next chunk (upstream is slower)
  double sync = 0;        // fsync of the copies
};

struct StageReport {
  bool ok = false;
  int exit_code = 1;
  PhaseTimes t;
  PipelineTimes pipe;
  uint64_t files = 0, dirs = 0, symlinks = 0;
  uint64_t bytes_total = 0;     // regular file bytes in the manifest
  uint64_t bytes_streamed = 0;  // bytes that went through the broadcast (holes excluded)
  uint64_t files_streamed = 0;
  uint64_t chunks = 0;
  int64_t writers = 0;        // nodes (one writer each)
  int64_t nodes_needing = 0;  // nodes whose copy was missing or stale
  int64_t nodes_written = 0;  // nodes that published a new copy
  // Who fed the broadcast: the rank that read (-1: nothing was streamed), and whether it read
  // its own current copy (a seed) rather than the shared source. The same on every rank.
  int fed_by = -1;
  bool fed_from_copy = false;
  // Feeds that failed and were replaced by another feeder (engine.h: Fallback), the same on every
  // rank; their causes (the root: every one; elsewhere: none): not errors, the transfer went on.
  int feed_retries = 0;
  std::vector<std::string> feed_failures;
  // Bytes read from the shared source (pre-validation CRCs and the copy) and from a seed's
  // copies. Every rank's figure after a transfer that reached the copy phase; otherwise the
  // reading rank's own.
  uint64_t bytes_read_source = 0;
  uint64_t bytes_read_seed = 0;
  bool this_node_wrote = false;
  std::vector<std::string> errors;  // root: every failing rank's message; elsewhere: its own
  std::error_code local_error;      // why this node failed (ENOSPC, ...), if it did
  // Why the source failed (its errno: EIO, EREMOTEIO...), the same on every rank, when the
  // transfer failed on the source's side with an error the system gave.
  std::error_code source_error;
  std::vector<std::string> skipped;    // root: entries not staged (FIFOs, sockets, devices)
  std::vector<std::string> published;  // manifest paths of the files this node published
  // Root, a selection: where its next slice starts, the first name of its range that its
  // limits left out ("" none: the range is done).
  std::string next_slice;
  // A collective or the data path failed (MPI error, stall): the ranks no longer agree on the
  // outcome, some may be stuck inside MPI, and the Comm must not be used again (errors then
  // holds this rank's own message, on every rank).
  bool comm_broken = false;
};

// Called on every rank, from the thread that called stage_transfer, after each chunk
// (bytes done, bytes to stream).
using ProgressFn = std::function<void(uint64_t, uint64_t)>;

}  // namespace stage
