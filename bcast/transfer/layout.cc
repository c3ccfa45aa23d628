#include "bcast/transfer/layout.h"

#include <algorithm>

#include "bcast/io/crc.h"

namespace stage {

Layout::Layout(const Manifest& m, const std::vector<int64_t>& in_stream) {
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const Entry& e = m.entries[i];
    if (e.type != EntryType::file || i >= in_stream.size() || in_stream[i] == 0) continue;
    Segment seg{i, bytes_, e.meta.size, 0, 0, runs_.size(), 0};
    const size_t index = segs_.size();
    uint64_t pos = 0, hole = 0;
    auto run_to = [&](uint64_t end) {
      if (end <= pos) return;
      runs_.push_back(Run{pos, bytes_, end - pos, hole, index});
      bytes_ += end - pos;
      hole = 0;
    };
    for (const Extent& h : e.holes) {
      run_to(h.off);
      hole += h.len;
      pos = h.off + h.len;
    }
    run_to(e.meta.size);
    seg.hole_after = hole;
    seg.length = bytes_ - seg.stream_off;
    seg.runs_end = runs_.size();
    segs_.push_back(seg);
  }
}

std::vector<Piece> Layout::pieces(uint64_t off, uint64_t len) const {
  std::vector<Piece> out;
  if (len == 0) return out;
  // First run that ends after off.
  auto it = std::upper_bound(runs_.begin(), runs_.end(), off,
                             [](uint64_t o, const Run& r) { return o < r.stream_off + r.len; });
  for (; it != runs_.end() && it->stream_off < off + len; ++it) {
    const ChunkRange r = overlap(off, len, it->stream_off, it->len);
    if (r.length == 0) continue;
    const Segment& seg = segs_[it->segment];
    const bool run_ends = r.offset + r.length == it->stream_off + it->len;
    const bool last_run = static_cast<size_t>(it - runs_.begin()) + 1 == seg.runs_end;
    out.push_back(Piece{it->segment, it->file_off + (r.offset - it->stream_off), r.offset - off, r.length,
                        r.offset == it->stream_off ? it->hole_before : 0, run_ends && last_run});
  }
  return out;
}

bool Layout::one_file_in_chunks(uint64_t chunk) const {
  if (segs_.size() != 1 || chunk == 0) return false;
  return std::all_of(runs_.begin(), runs_.end(), [&](const Run& r) {
    const uint64_t end = r.file_off + r.len;
    return r.file_off % chunk == 0 && r.stream_off % chunk == 0 && (end % chunk == 0 || end == segs_[0].size);
  });
}

uint64_t Layout::file_chunk(uint64_t stream_chunk, uint64_t chunk) const {
  const uint64_t s = stream_chunk * chunk;
  auto it = std::upper_bound(runs_.begin(), runs_.end(), s,
                             [](uint64_t o, const Run& r) { return o < r.stream_off + r.len; });
  if (it == runs_.end()) return stream_chunk;
  return (it->file_off + (s - it->stream_off)) / chunk;
}

std::optional<uint64_t> Layout::stream_chunk(uint64_t file_chunk, uint64_t chunk) const {
  const uint64_t f = file_chunk * chunk;
  auto it = std::upper_bound(runs_.begin(), runs_.end(), f,
                             [](uint64_t o, const Run& r) { return o < r.file_off + r.len; });
  if (it == runs_.end() || it->file_off > f) return std::nullopt;
  return (it->stream_off + (f - it->file_off)) / chunk;
}

uint64_t Layout::crc_of_chunks(uint64_t chunk, const std::vector<uint64_t>& chunk_crc) const {
  // Every chunk of the file in order, a chunk in a hole as its zeros (an all-hole file: no
  // stream chunk, its zeros).
  const std::vector<uint64_t> crcs = file_chunk_crcs(chunk, chunk_crc);
  uint64_t crc = 0;
  for (uint64_t c = 0; c < crcs.size(); ++c)
    crc = crc64_combine(crc, crcs[c], chunk_range(segs_[0].size, chunk, c).length);
  return crc;
}

std::vector<uint64_t> Layout::file_chunk_crcs(uint64_t chunk, const std::vector<uint64_t>& chunk_crc) const {
  if (segs_.size() != 1) return {};
  const uint64_t size = segs_[0].size;
  std::vector<uint64_t> out(chunk_count(size, chunk));
  for (uint64_t c = 0; c < out.size(); ++c) {
    const auto s = stream_chunk(c, chunk);
    out[c] = s && *s < chunk_crc.size() ? chunk_crc[*s] : crc64_zeros(chunk_range(size, chunk, c).length);
  }
  return out;
}

uint64_t crc_through(uint64_t file_crc, const Piece& p, uint64_t piece_crc, const Segment& seg) {
  if (p.hole_before != 0) file_crc = crc64_combine(file_crc, crc64_zeros(p.hole_before), p.hole_before);
  file_crc = crc64_combine(file_crc, piece_crc, p.length);
  if (p.ends_file && seg.hole_after != 0)
    file_crc = crc64_combine(file_crc, crc64_zeros(seg.hole_after), seg.hole_after);
  return file_crc;
}

}  // namespace stage
