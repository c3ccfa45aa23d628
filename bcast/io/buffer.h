// Chunk buffers: the memory every byte of a transfer passes through (read or received, CRC-
// checked, written). Three properties matter, each measured (bench/README.md):
//   - aligned for O_DIRECT (4 KiB; writers hand the buffer straight to the device);
//   - never zero-filled: std::vector::resize touched every page before the first chunk
//     (first-touch page faults) for bytes that are overwritten;
//   - transparent huge pages, requested with madvise (honoured under THP "madvise", Debian's
//     default, and "always"): with 4 KiB pages the CRC and MPI copies were TLB- and
//     fault-bound.
// Not thread-safe; owned by one pipeline stage at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace stage {

inline constexpr uint64_t kHugePage = uint64_t{2} << 20U;

class ChunkBuffer {
 public:
  // nullptr when the memory cannot be had. Sizes of 2 MiB and more are 2 MiB-aligned and
  // advised for huge pages; smaller ones 4 KiB-aligned.
  static std::unique_ptr<ChunkBuffer> make(uint64_t size);

  ChunkBuffer(const ChunkBuffer&) = delete;
  ChunkBuffer& operator=(const ChunkBuffer&) = delete;
  ~ChunkBuffer();

  [[nodiscard]] std::span<std::byte> bytes() const { return {mem_, size_}; }
  [[nodiscard]] std::byte* data() const { return mem_; }
  [[nodiscard]] uint64_t size() const { return size_; }

 private:
  ChunkBuffer(std::byte* mem, uint64_t size, uint64_t len) : mem_(mem), size_(size), len_(len) {}
  std::byte* mem_;
  uint64_t size_;
  uint64_t len_;  // mapped bytes
};

}  // namespace stage
