// The data path's own broadcast: a buffer cut into segments and passed down a pipelined chain
// or a pipelined binary tree of ranks over nonblocking point-to-point messages (PointToPoint,
// bcast/comm.h). Why: MPI libraries pick their own bcast algorithm; Open MPI's tuned bcast for
// 16 MiB messages on 8 TCP ranks sends the whole chunk from the root to every rank (time
// linear in N, the source sends (N-1)x the data). In a chain every rank receives each segment
// once and sends it once, so the source sends 1x the data and, once the pipeline is full,
// every link carries the data at once: T ~ S/B + (N-1) x (segment/B + hop latency). The tree
// sends 2x from each inner rank (half the bandwidth when links are the bottleneck) but fills
// in log2(N) hops.
//
// Shape of one call, on the rank at position p of the order (the root first, then the ranks
// sorted by placement so neighbours share a node or a switch):
//   - keep up to `window` segments of receives posted from the parent (never on the root),
//   - as each segment arrives, send it to each child (up to `window` sends in flight per child),
//   - then confirm completion: in the chain the last rank sends every other rank a 1-byte
//     "I have it all" (the data passed through each of them first); in the tree each rank
//     acknowledges to its parent once its subtree is complete and waits for the root's
//     release, passed down. So a call returns OK on a rank only when every rank holds the
//     data. Cost per call: one hop (chain) or 2 x log2(N) hops (tree) of latency, and N-1 tiny
//     messages from the chain's last rank.
// Waiting: MPI_Test-style polling with a back-off to short sleeps (no core spins at any N).
// Failure: an error from a request, or no request progressing for `stall_timeout`, ends the
// call with an error; the pending requests are cancelled by their RAII owners. A cut link
// thus returns an error on every rank within about one stall timeout: the ranks below it
// wait for data, the ranks above it for the confirmation (chain) or the release (tree).
// Collective over the PointToPoint's ranks (all call with the same length, root and options);
// called by the thread that owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bcast/comm.h"
#include "bcast/error.h"

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
// Pipelined broadcast of `buf` from `root` (shape: chain or tree). COLLECTIVE over p2p.
Status pipeline_bcast(PointToPoint& p2p, std::span<std::byte> buf, int root, BcastAlgorithm shape,
                      const PipelineOptions& opt);

// The engine's chunk broadcast: resolve(), then the pipeline or comm.bcast. COLLECTIVE.
Status data_bcast(Comm& comm, std::span<std::byte> buf, int root, BcastAlgorithm algo,
                  const PipelineOptions& opt);

}  // namespace stage
