// The data path's own broadcast: a buffer cut into segments and passed down a pipelined chain
// or a pipelined binary tree of ranks over nonblocking point-to-point messages (PointToPoint,
// bcast/comm/comm.h). Why: MPI libraries pick their own bcast algorithm; Open MPI's tuned bcast for
// 16 MiB messages on 8 TCP ranks sends the whole chunk from the root to every rank (time
// linear in N, the source sends (N-1)x the data). In a chain every rank receives each segment
// once and sends it once, so the source sends 1x the data and, once the pipeline is full,
// every link carries the data at once: T ~ S/B + (N-1) x (segment/B + hop latency). The tree
// sends 2x from each inner rank (half the bandwidth when links are the bottleneck) but fills
// in log2(N) hops.
//
// Shape of the stream, on the rank at position p of the order (the root first, then the
// ranks sorted by placement so neighbours share a node or a switch):
//   - keep up to `window` segments of receives posted from the parent (never on the root),
//     across chunk boundaries: a chunk's header message says how many segments follow,
//   - as each header and segment arrives, send it to each child (up to `window` segment
//     sends in flight per child),
//   - hand a chunk back once it is here and passed on; after the last chunk, confirm
//     completion: in the chain the last rank sends every other rank a 1-byte "I have it
//     all" (the data passed through each of them first); in the tree each rank acknowledges
//     to its parent once its subtree is complete and waits for the root's release, passed
//     down. So finish() returns OK on a rank only when every rank holds the data. Cost per
//     transfer (not per chunk): one hop (chain) or 2 x log2(N) hops (tree) of latency, and
//     N-1 tiny messages from the chain's last rank.
// Waiting: MPI_Test-style polling with a back-off to short sleeps (no core spins at any N).
// Failure: an error from a request, or no request progressing for `stall_timeout` while a
// rank waits for something, ends the stream with an error; the pending requests are
// cancelled by their RAII owners. A cut link thus returns an error on every rank within
// about one stall timeout: the ranks below it wait for data, the ranks above it for the
// confirmation (chain) or the release (tree). A source that delivers nothing for
// `stall_timeout` fails the transfer the same way (the ranks wait for the next header).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bcast/comm/comm.h"
#include "bcast/io/error.h"
#include "bcast/transfer/layout.h"

namespace stage {

// automatic: chain for data, the MPI library's bcast for small buffers or where no
// point-to-point seam exists; mpi: always Comm::bcast.
enum class BcastAlgorithm { automatic, chain, tree, mpi };

std::optional<BcastAlgorithm> parse_bcast_algorithm(std::string_view text);
const char* to_string(BcastAlgorithm a);

struct PipelineOptions {
  uint64_t segment = 0;             // bytes per message; 0: kDefaultSegment
  uint64_t window_bytes = 4 << 20;  // bytes in flight per link (at least 2 segments)
  std::chrono::milliseconds stall_timeout{std::chrono::seconds(120)};  // 0: wait forever
};

// Buffers up to this size go through the MPI library under `automatic` (a few latencies
// either way; the library's small-message algorithms are fine).
inline constexpr uint64_t kPipelineMinBytes = 64 * 1024;

// --- pure helpers (unit-tested) ---------------------------------------------------------
// The broadcast order: ranks sorted by (placement key, rank), rotated so `root` comes first
// (the rotation keeps neighbours adjacent, the sort keeps one node's ranks together).
std::vector<int> broadcast_order(const std::vector<std::string>& placement, int root);

struct Links {
  int parent = -1;            // rank, -1 on the root
  std::vector<int> children;  // ranks
};
// A rank's neighbours in the chain (position p: parent p-1, child p+1) or the binary tree
// (parent (p-1)/2, children 2p+1, 2p+2) over `order`.
Links links_of(BcastAlgorithm shape, const std::vector<int>& order, int rank);

// Default segment: 60 KiB, under Open MPI's TCP eager limit (64 KiB with headers), so a segment
// goes out without a rendezvous round trip. Measured on 8 shaped netns nodes (64 MiB, 100 Mbit/s
// links): 60 KiB segments 6.5 s, 128 KiB 10.9 s, 1 MiB 12.5 s: each rendezvous needs both ranks
// inside MPI, and a polling rank that sleeps between tests stretches every one of them. Filling
// a chain of N ranks costs (N-1) segments per chunk (16 MiB: 273 segments). On fabrics whose
// rendezvous is receiver-driven RDMA (UCX), larger segments (--bcast-segment) cost less.
inline constexpr uint64_t kDefaultSegment = 60 * 1024;
uint64_t segment_for(uint64_t bytes);

// What `requested` means for a buffer of `bytes` on `comm` (chain, tree or mpi).
BcastAlgorithm resolve(BcastAlgorithm requested, Comm& comm, uint64_t bytes);

// --- the broadcasts ------------------------------------------------------------------------
// ChunkStream: the engine's copy phase as ONE pipeline. Every chunk of a transfer enters the
// same chain (or tree) as a 32-byte header message followed by its payload's segments, so
// chunk i+1's first segments leave the source while chunk i's last ones still travel down
// the chain: the pipeline fills once per transfer, not once per chunk, and no header
// broadcast or per-chunk completion round separates the chunks. (One pipeline per chunk would
// pay the fill cost (N-1) x (segment/B + hop latency) S/C times, which dominates at a
// thousand nodes: bench/results/bench_scale.md.)
//
// Use, on every rank, by the thread that owns the PointToPoint:
//   submit() a buffer per chunk (the root: the chunk's header and payload, in any order of
//   ChunkHeader::index, which the stream carries unchanged;
//   the others: an empty buffer big enough for any chunk, into which the next chunk is
//   received); call progress() until it hands the chunks back, in order, each complete on
//   this rank (received in full and passed on to every child); idle() between calls that
//   moved nothing; after the last chunk, finish(). A header with kChunkZero, kChunkAbort or
//   kChunkNest has no payload; after an abort the caller submits nothing more (finish() drops receives
//   posted for chunks that will never come).
// Completion: finish() returns once every rank holds every chunk (chain: the last rank tells
// every other rank directly, one hop; tree: acknowledgements up, the root's release down),
// so a lost node or link fails every rank instead of leaving some inside a later collective.
// Failure: a failed request, a header that does not fit the buffer, or nothing moving for
// `stall_timeout` while this rank waits for something (data, a header, its sends, the
// confirmation) ends the stream with an error; the destructor cancels what is pending. A
// request MPI could not cancel may still use its buffer later: after a failure (or with
// chunks still in flight) the destructor leaves the stream's own small buffers allocated,
// and the caller must likewise never free or reuse the chunk buffers it had submitted.
// COLLECTIVE over p2p as a whole (every rank submits the same number of chunks); NOT
// thread-safe.
class ChunkStream {
 public:
  ChunkStream(PointToPoint& p2p, int root, BcastAlgorithm shape, const PipelineOptions& opt);
  ~ChunkStream();
  ChunkStream(const ChunkStream&) = delete;
  ChunkStream& operator=(const ChunkStream&) = delete;

  // Root: `hdr` is the chunk's header and `buf` its payload (exactly the payload's size:
  // hdr.length, or 0 for a zero or abort chunk). Elsewhere `hdr` is ignored and `buf` must
  // hold the largest chunk. The buffer is the stream's until progress() hands it back.
  Status submit(std::span<std::byte> buf, const ChunkHeader& hdr);
  // Moves messages; appends the headers of chunks now complete on this rank to `done`, in
  // submission order. Returns whether anything moved, or the error that ends the stream.
  Result<bool> progress(std::vector<ChunkHeader>& done);
  // A short sleep that grows while nothing moves (a burst of polls, then 20 us up to 1 ms).
  void idle();
  // Chunks submitted and not yet handed back.
  [[nodiscard]] size_t pending() const;
  // The caller was away on purpose (a nested transfer ran, terms.h Nest): the stall clock
  // starts again now, as after progress.
  void resumed();
  // Reads before the copy ends: a chunk (the caller's ChunkHeader::index) that
  // readers on this rank wait for. Passed up the chain or tree to the root, hop by hop, each
  // index at most once per stream and link; the root's caller collects them with
  // take_want() and sends those chunks next. A hint: an index may arrive after its chunk
  // went, or (left over from an earlier stream) not be a chunk of this one.
  void want(uint64_t index);
  // Root: the next wanted chunk index from any rank (its own included), if any.
  std::optional<uint64_t> take_want();
  // Every chunk done (or the abort seen): waits until every rank holds every chunk.
  Status finish();

 private:
  Status submit_one(std::span<std::byte> buf, const ChunkHeader& hdr);
  Status finish_round();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Keeps `memory` allocated (and reachable) until the process exits: the buffers of requests
// that MPI could not cancel after a failure. Thread-safe.
void quarantine(std::shared_ptr<void> memory);

// Pipelined broadcast of one buffer from `root` (shape: chain or tree): a ChunkStream of one
// chunk. COLLECTIVE over p2p (every rank passes the same length). After an error, `buf` may
// still be used by a request MPI could not cancel (see ChunkStream).
Status pipeline_bcast(PointToPoint& p2p, std::span<std::byte> buf, int root, BcastAlgorithm shape,
                      const PipelineOptions& opt);

// The engine's chunk broadcast: resolve(), then the pipeline or comm.bcast. COLLECTIVE.
Status data_bcast(Comm& comm, std::span<std::byte> buf, int root, BcastAlgorithm algo,
                  const PipelineOptions& opt);

}  // namespace stage
