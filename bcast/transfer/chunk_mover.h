// How the chunks of a transfer travel between ranks: the strategy under the engine's one chunk
// loop (Transfer::move_chunks, copy.cc). The loop decides what goes in (the reader's chunks,
// nest marks, receive buffers), checks and hands on what comes out (to the writer, to a nested
// transfer), routes wants and polls the control plane; a mover only moves:
//   StreamMover      every chunk through one pipelined chain or tree (ChunkStream,
//                    bcast/transfer/pipeline.h), headers in-band; many chunks in flight; wants travel
//                    up the stream to the reader; stalls are the stream's (stall_timeout).
//   CollectiveMover  one chunk at a time through the Comm's collectives: a header broadcast,
//                    then the payload (data_bcast); the reader's own readers' wants only.
// Used on every rank by the thread that owns the Comm; NOT thread-safe. A mover owns the
// buffers submitted to it until progress() hands them back; after a failure the stream keeps
// those an uncancellable request may still use (quarantine, bcast/transfer/pipeline.h).
// Internal to the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "bcast/comm/comm.h"
#include "bcast/io/buffer.h"
#include "bcast/transfer/layout.h"
#include "bcast/transfer/pipeline.h"

namespace stage::engine {

// A chunk buffer and the header that describes what it holds now.
struct Buffer {
  ChunkHeader hdr;
  std::unique_ptr<ChunkBuffer> mem;
};
using BufPtr = std::unique_ptr<Buffer>;

// A header complete on this rank (received in full and passed on), and its buffer: null for
// a nest mark the reader put in (no buffer); a receive buffer elsewhere, whatever the header.
struct MovedChunk {
  ChunkHeader hdr;
  BufPtr buf;
};

class ChunkMover {
 public:
  virtual ~ChunkMover() = default;
  // True: a chunk moves inside progress() (a collective every rank enters): the loop then
  // waits for its next buffer rather than polling, and a rank other than the reader, which
  // waits inside the collective, polls the control plane once per chunk.
  [[nodiscard]] virtual bool synchronous() const = 0;
  // Whether submit() may be called now (the collective: one chunk at a time).
  [[nodiscard]] virtual bool room() const = 0;
  // Submitted and not yet handed back.
  [[nodiscard]] virtual size_t pending() const = 0;
  // The reader: a chunk (its header and full buffer) or a nest mark (null buffer); elsewhere
  // a buffer to receive the next chunk into (hdr ignored).
  virtual Status submit(BufPtr buf, const ChunkHeader& hdr) = 0;
  // Moves; appends what is now complete here, in submission order. Whether anything moved.
  virtual Result<bool> progress(std::vector<MovedChunk>& done) = 0;
  // Nothing moved this turn: wait a little (or not at all).
  virtual void idle() = 0;
  // The loop was away on purpose (a nested transfer ran): restart the stall clock.
  virtual void resumed() = 0;
  // Wants of readers on this rank travel to the reader (want / take_want at the reader).
  [[nodiscard]] virtual bool carries_wants() const = 0;
  virtual void want(uint64_t /*index*/) {}
  virtual std::optional<uint64_t> take_want() { return std::nullopt; }
  // Every chunk done (or the abort seen): returns once every rank holds every chunk.
  virtual Status finish() = 0;
};

// `is_root`: this rank is `root`, the reader.
std::unique_ptr<ChunkMover> make_stream_mover(PointToPoint& p2p, int root, bool is_root, BcastAlgorithm shape,
                                              const PipelineOptions& opt);
// `fits`: whether a header may be followed by its payload here (checked on every rank before
// the payload's broadcast; false ends the transfer with bad_message).
std::unique_ptr<ChunkMover> make_collective_mover(Comm& comm, int root, BcastAlgorithm algo,
                                                  const PipelineOptions& opt,
                                                  std::function<bool(const ChunkHeader&)> fits);

}  // namespace stage::engine
