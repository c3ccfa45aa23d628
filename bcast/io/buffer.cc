#include "bcast/io/buffer.h"

#include <sys/mman.h>

#include <algorithm>

#include "bcast/io/store.h"

namespace stage {

// Straight from mmap, not malloc: glibc serves large blocks from its heap once a freed mmap
// block raised its threshold (a daemon's second transfer would get recycled 4 KiB pages, and
// madvise could not turn them into huge pages). Over-map by one alignment unit and trim, so
// the buffer starts on a 2 MiB boundary.
std::unique_ptr<ChunkBuffer> ChunkBuffer::make(uint64_t size) {
  const uint64_t align = size >= kHugePage ? kHugePage : kDirectAlign;
  const uint64_t len = (std::max<uint64_t>(size, 1) + align - 1) / align * align;
  const uint64_t map_len = len + (align > kDirectAlign ? align : 0);
  void* m = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  auto* base = static_cast<std::byte*>(m);
  const uint64_t lead = (align - reinterpret_cast<uintptr_t>(base) % align) % align;
  if (lead > 0) ::munmap(base, lead);
  if (map_len - lead - len > 0) ::munmap(base + lead + len, map_len - lead - len);
  std::byte* mem = base + lead;
  if (align == kHugePage) ::madvise(mem, len, MADV_HUGEPAGE);  // advice: failure is harmless
  return std::unique_ptr<ChunkBuffer>(new ChunkBuffer(mem, size, len));
}

ChunkBuffer::~ChunkBuffer() {
  ::munmap(mem_, len_);
}

}  // namespace stage
