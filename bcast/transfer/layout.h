// The byte stream of one transfer and the header that precedes every chunk of it.
// Layout: the files some node needs, in manifest order, each at a stream offset. A chunk may
// cover the tail of one file, several small files and the head of the next (small files
// travel packed, never one collective each). A sparse file's holes (Entry::holes) are not in
// the stream: the file is its data runs, back to back, so a hole costs nothing per chunk on
// any rank. pieces() maps a chunk back to (file, offset) ranges, and says which hole comes
// before a piece and whether it ends its file, so that the reader and the writers can extend
// a file's CRC over its holes (crc_through). Pure, thread-safe, unit-tested.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "bcast/io/chunk.h"
#include "bcast/io/manifest.h"

namespace stage {

// A file's bytes between two holes (or its ends), where they lie in the stream.
struct Run {
  uint64_t file_off = 0;
  uint64_t stream_off = 0;
  uint64_t len = 0;
  uint64_t hole_before = 0;  // bytes of hole between the previous run (or the file's start) and this one
  size_t segment = 0;        // its file's index in the layout
};

struct Segment {
  size_t entry = 0;                     // index in the manifest
  uint64_t stream_off = 0;              // where the file's first byte in the stream is
  uint64_t size = 0;                    // the file's size
  uint64_t length = 0;                  // its bytes in the stream (size less its holes)
  uint64_t hole_after = 0;              // bytes of hole after its last run, up to its size
  size_t runs_begin = 0, runs_end = 0;  // its runs in Layout::runs()
};

struct Piece {
  size_t segment = 0;      // index in the layout
  uint64_t file_off = 0;   // offset in the file
  uint64_t chunk_off = 0;  // offset in the chunk
  uint64_t length = 0;
  uint64_t hole_before = 0;  // the hole just before this piece in the file (only the first piece of a run)
  bool ends_file = false;    // the file's last byte in the stream (a hole_after may follow)
};

class Layout {
 public:
  // Adds manifest entries whose flag in `in_stream` is set (regular files only).
  Layout(const Manifest& m, const std::vector<int64_t>& in_stream);
  [[nodiscard]] uint64_t bytes() const { return bytes_; }
  [[nodiscard]] const std::vector<Segment>& segments() const { return segs_; }
  [[nodiscard]] const std::vector<Run>& runs() const { return runs_; }
  // Pieces of [off, off+len) of the stream, in order; files with nothing in the stream (empty,
  // or all hole) yield no piece.
  [[nodiscard]] std::vector<Piece> pieces(uint64_t off, uint64_t len) const;
  // A layout of one file whose runs start and end on chunk boundaries of the file (or at its
  // size): each stream chunk is then one chunk of the file. Holes from a manifest always are
  // (decode() checks), so a single file's stream chunk k is file chunk file_chunk(k).
  [[nodiscard]] bool one_file_in_chunks(uint64_t chunk) const;
  [[nodiscard]] uint64_t file_chunk(uint64_t stream_chunk, uint64_t chunk) const;
  // The stream chunk that carries file chunk c, or nullopt: c lies in a hole.
  [[nodiscard]] std::optional<uint64_t> stream_chunk(uint64_t file_chunk, uint64_t chunk) const;
  // One file in chunks: its CRC from the CRC of each stream chunk, holes included.
  [[nodiscard]] uint64_t crc_of_chunks(uint64_t chunk, const std::vector<uint64_t>& chunk_crc) const;
  // One file in chunks: the CRC of each chunk of the file, from the CRC of each stream chunk
  // (a chunk in a hole: its zeros').
  [[nodiscard]] std::vector<uint64_t> file_chunk_crcs(uint64_t chunk,
                                                      const std::vector<uint64_t>& chunk_crc) const;

 private:
  std::vector<Segment> segs_;
  std::vector<Run> runs_;
  uint64_t bytes_ = 0;
};

// A file's CRC so far, extended by piece p (whose own CRC is piece_crc): the hole before it,
// its bytes and, at the file's end, the hole after (zeros, combined without a pass over them).
uint64_t crc_through(uint64_t file_crc, const Piece& p, uint64_t piece_crc, const Segment& seg);

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
// Not a chunk: a mark between two chunks, where every rank runs a nested transfer (terms.h,
// Nest). No payload; index and length 0; `reserved` carries the nested transfer's token.
inline constexpr uint32_t kChunkNest = 4;

}  // namespace stage
