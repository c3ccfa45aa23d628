// Chunk arithmetic, kept pure so it can be tested without MPI. A transfer is one logical
// stream: the bytes of every file that some node needs, concatenated in manifest order.
// The stream is cut into chunks of chunk_size bytes (the last one shorter). Every MPI count is
// an int, so a chunk never exceeds kMaxChunk; offsets and sizes are 64-bit everywhere.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace stage {

inline constexpr uint64_t kMiB = 1024ULL * 1024ULL;
inline constexpr uint64_t kMinChunk = 4096;
inline constexpr uint64_t kMaxChunk = 1024ULL * kMiB;  // well under INT_MAX bytes
inline constexpr uint64_t kDefaultChunk = 16 * kMiB;
static_assert(kMaxChunk < static_cast<uint64_t>(std::numeric_limits<int>::max()));

struct ChunkRange {
  uint64_t offset = 0;  // in the stream
  uint64_t length = 0;  // bytes, <= chunk size
};

constexpr uint64_t chunk_count(uint64_t stream_bytes, uint64_t chunk) noexcept {
  return chunk == 0 ? 0 : (stream_bytes + chunk - 1) / chunk;
}

constexpr ChunkRange chunk_range(uint64_t stream_bytes, uint64_t chunk, uint64_t index) noexcept {
  const uint64_t off = index * chunk;
  if (chunk == 0 || off >= stream_bytes) return {stream_bytes, 0};
  const uint64_t left = stream_bytes - off;
  return {off, left < chunk ? left : chunk};
}

// Intersection of [a, a+alen) and [b, b+blen); length 0 when they do not overlap.
constexpr ChunkRange overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) noexcept {
  const uint64_t lo = a > b ? a : b;
  const uint64_t ahi = a + alen;
  const uint64_t bhi = b + blen;
  const uint64_t hi = ahi < bhi ? ahi : bhi;
  return hi > lo ? ChunkRange{lo, hi - lo} : ChunkRange{lo, 0};
}

// Splits a byte count into MPI-sized pieces (for buffers that may exceed INT_MAX).
constexpr int mpi_piece(uint64_t remaining) noexcept {
  constexpr uint64_t kPiece = 1ULL << 30;
  return static_cast<int>(remaining < kPiece ? remaining : kPiece);
}

// Parses "16M", "1G", "4096", "512K" (binary units). Empty optional on a malformed value.
std::optional<uint64_t> parse_size(const std::string& text);
// The inverse, for showing a size: the largest of T, G, M, K that divides it ("16M", "1G"),
// else plain bytes ("0", "1000"). parse_size(size_text(n)) == n.
std::string size_text(uint64_t bytes);

// Checks a chunk size is within [kMinChunk, kMaxChunk]; returns an explanation if not.
std::optional<std::string> check_chunk_size(uint64_t chunk);

}  // namespace stage
