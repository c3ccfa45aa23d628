#include "bcast/layout.h"

#include <algorithm>

namespace stage {

Layout::Layout(const Manifest& m, const std::vector<int64_t>& in_stream) {
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const Entry& e = m.entries[i];
    if (e.type != EntryType::file || i >= in_stream.size() || in_stream[i] == 0) continue;
    segs_.push_back(Segment{i, bytes_, e.meta.size});
    bytes_ += e.meta.size;
  }
}

std::vector<Piece> Layout::pieces(uint64_t off, uint64_t len) const {
  std::vector<Piece> out;
  if (len == 0) return out;
  // First segment that ends after off.
  auto it = std::upper_bound(segs_.begin(), segs_.end(), off,
                             [](uint64_t o, const Segment& s) { return o < s.stream_off + s.size; });
  for (; it != segs_.end() && it->stream_off < off + len; ++it) {
    const ChunkRange r = overlap(off, len, it->stream_off, it->size);
    if (r.length == 0) continue;
    out.push_back(
        Piece{static_cast<size_t>(it - segs_.begin()), r.offset - it->stream_off, r.offset - off, r.length});
  }
  return out;
}

}  // namespace stage
