// The byte stream of one transfer and the header that precedes every chunk of it.
// Layout: the files some node needs, in manifest order, each at a stream offset. A chunk may
// cover the tail of one file, several small files and the head of the next (small files
// travel packed, never one collective each). pieces() maps a chunk back to (file, offset)
// ranges. Pure, thread-safe, unit-tested.
#pragma once

#include <cstdint>
#include <vector>

#include "bcast/chunk.h"
#include "bcast/manifest.h"

namespace stage {

struct Segment {
  size_t entry = 0;         // index in the manifest
  uint64_t stream_off = 0;  // where the file starts in the stream
  uint64_t size = 0;
};

struct Piece {
  size_t segment = 0;      // index in the layout
  uint64_t file_off = 0;   // offset in the file
  uint64_t chunk_off = 0;  // offset in the chunk
  uint64_t length = 0;
};

class Layout {
 public:
  // Adds manifest entries whose flag in `in_stream` is set (regular files only).
  Layout(const Manifest& m, const std::vector<int64_t>& in_stream);
  [[nodiscard]] uint64_t bytes() const { return bytes_; }
  [[nodiscard]] const std::vector<Segment>& segments() const { return segs_; }
  // Pieces of [off, off+len) of the stream, in order; zero-length files yield no piece.
  [[nodiscard]] std::vector<Piece> pieces(uint64_t off, uint64_t len) const;

 private:
  std::vector<Segment> segs_;
  uint64_t bytes_ = 0;
};

// Sent before each chunk's payload (one small broadcast, then the payload unless zero/error).
struct ChunkHeader {
  uint64_t index = 0;
  uint64_t length = 0;
  uint64_t crc = 0;  // CRC-64 of the chunk's bytes (holes count as zeros)
  uint32_t flags = 0;
  int32_t reserved = 0;
};
static_assert(sizeof(ChunkHeader) == 32);

inline constexpr uint32_t kChunkZero = 1;   // all bytes zero (holes): no payload follows
inline constexpr uint32_t kChunkAbort = 2;  // the source failed: no payload, stream ends here
// Not a chunk: a mark between two chunks, where every rank runs a nested transfer (engine.h,
// Nest). No payload; index and length 0; `reserved` carries the nested transfer's token.
inline constexpr uint32_t kChunkNest = 4;

}  // namespace stage
