// How an open file's reads are served: the read-mode policy of the mount, without FUSE.
//
//   passthrough   the kernel reads the local copy itself through a backing file registered
//                 on /dev/fuse (passthrough.h), shared by every passthrough handle of the
//                 node; no READ reaches the daemon
//   splice        READs reach the daemon, which splices them from its fd (the local copy, or
//                 the source on a stall fallback); the page cache is kept only when the open
//                 found the copy already there
//   during_copy   READs reach the daemon, which answers them from the copy in progress as its
//                 chunks land (LiveCopy); the page cache is not kept
//
// The kernel refuses to mix cached-mode and passthrough opens of one inode (EIO to whoever
// comes second; direct I/O is refused next to passthrough too). Per node therefore:
//   - while it has passthrough handles, an open during the copy is passed through as well,
//     over their backing file (the same version: a node id is one version);
//   - while it has cached-mode handles (during_copy ones, and splice ones opened next to
//     them), an open of the local copy splices and counts as cached-mode too;
//   - otherwise an open of the local copy asks for passthrough, and splices if the backing
//     file is refused (no passthrough on this mount, a stacked filesystem, no privilege).
// choose_read_mode() is that table as a pure function; NodeReadModes keeps the per-node
// counts and takes each decision under its lock, so a decision and its count are one step.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

namespace stagefs {

// How a mount serves reads, as reported (status, log): known after the first open.
enum class ReadPath { unknown, passthrough, splice };
const char* read_path_name(ReadPath p);

enum class ReadMode : uint8_t { passthrough, splice, during_copy };

// What an open found: the core's answer and the node's handles open at that moment.
struct OpenFacts {
  bool during_copy = false;          // the core answered with the copy in progress
  bool from_source = false;          // a stall fallback: the fd is the source's
  bool cache_hit = false;            // the copy was already there
  bool passthrough_handles = false;  // the node has passthrough handles open
  bool cached_mode_handles = false;  // ... or counted cached-mode handles
};

struct ReadChoice {
  ReadMode mode = ReadMode::splice;
  bool counted = false;                   // a cached-mode handle of its node until it is released
  bool keep_cache = false;                // the open reply keeps the kernel's page cache of the file
  ReadPath reported = ReadPath::unknown;  // what the mount now reports (unknown: no change)
  int backing_id = -1;                    // passthrough: the node's backing file
};

// The decision for an open (passthrough: if the backing file is refused, refused_passthrough).
ReadChoice choose_read_mode(const OpenFacts& f);
// The fallback of an open whose passthrough was refused: splice, reported as such.
ReadChoice refused_passthrough(const OpenFacts& f);

// The per-node handle counts behind the decision. Thread-safe.
class NodeReadModes {
 public:
  // Registers a file as a node's backing file: its id, or -errno; and unregisters one.
  struct Backing {
    std::function<int(int file_fd)> open;
    std::function<void(int backing_id)> close;
  };
  explicit NodeReadModes(Backing b) : backing_(std::move(b)) {}

  // Decides how an open of node is served and counts it; file_fd is what a new backing file
  // registers. facts' *_handles are filled in here. Release the result with close().
  ReadChoice open(uint64_t node, int file_fd, OpenFacts facts);
  void close(uint64_t node, const ReadChoice& c);

 private:
  Backing backing_;
  std::mutex m_;
  std::unordered_map<uint64_t, std::pair<int, int>> passthrough_;  // node -> (backing id, handles)
  std::unordered_map<uint64_t, int> cached_mode_;                  // node -> counted handles
};

}  // namespace stagefs
