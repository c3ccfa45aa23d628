// The reader thread, on the rank that feeds the stream (the source rank, or a seed): fills
// free chunk buffers from the input files, each chunk with its CRC, and checks each file's
// end (still the same file, no longer than its size). A seed whose copy recorded its chunks'
// CRCs (ChunkRecord) proves each chunk against them before the chunk enters the stream: a
// reader on another node never gets a byte the source does not hold. Any failure, and a
// cancellation, goes into the stream as an abort chunk, which every rank sees at the same
// point.
#include <cstring>

#include "bcast/io/crc.h"
#include "bcast/transfer/transfer.h"

namespace stage::engine {

namespace {
constexpr const char* kSeedCopy = "seed copy";
}  // namespace

// The reader, steered by a live copy's readers (see LiveCopyReaders): first the wanted chunks not sent
// yet, then on in file order from the last one, then any chunk left behind.
uint64_t Transfer::pick_chunk(std::vector<char>& sent, uint64_t& next, uint64_t& low) {
  const uint64_t n = sent.size();
  {
    const std::lock_guard lk(want_m_);
    while (!want_q_.empty()) {
      const uint64_t w = want_q_.front();
      want_q_.pop_front();
      if (w < n && sent[w] == 0) {
        next = w + 1;
        return w;
      }
    }
  }
  if (next < n && sent[next] == 0) return next++;
  while (low < n && sent[low] != 0) ++low;
  next = low + 1;
  return low;
}

// After a file's last byte: is it still the file it was, and does it really end there? A
// source is the version it was (size, mtime, ctime, inode); a seed's copy the same copy
// (same_copy: its ctime moves with every metadata update of its mount, its bytes do not). A
// read past its recorded size that returns data means the copy would be truncated: a pseudo
// file whose stat size is not its content, or a file that grew without its mtime telling
// (yet). Either way nothing is published.
std::optional<Error> Transfer::check_end(SourceFile& f, const FileMeta& expect, const std::string& path,
                                         bool seed_copy) {
  auto now = f.stat_now();
  if (!now) return now.error();
  const char* what = seed_copy ? kSeedCopy : "source";
  if (seed_copy ? !same_copy(*now, expect) : *now != expect)
    return stage_error(Errc::source_changed, what, path);
  auto more = f.data_past(expect.size);
  if (!more) return more.error();
  if (!*more) return std::nullopt;
  Error err = stage_error(Errc::source_changed, what, path);
  err.message += " (it is longer than its size of " + std::to_string(expect.size) +
                 " bytes: it grew, or it is a pseudo file whose size does not describe its content)";
  return err;
}

// The reader's end check: the source against the scan, or a seed's copy against its identity
// when the seed opened it and (the origin rule) its bytes, whose CRC is `crc`, against the CRC
// the copy recorded when it was written. A copy that reads back otherwise was corrupted on
// this node's disk: every chunk's CRC is the seed's own, so only this check catches it; the
// store may then drop it (bad_copy), so that it is not chosen again.
std::optional<Error> Transfer::check_input_end(SourceFile& f, size_t entry, uint64_t crc) const {
  const Entry& e = m_.entries[entry];
  if (!seeded_) return check_end(f, e.meta, join_path(ep_.source, e.path), false);
  const std::string path = dest_of(entry);
  if (auto err = check_end(f, seed_before_[entry], path, true)) return err;
  if (!copy_crc_[entry] || *copy_crc_[entry] == crc) return std::nullopt;
  return unproven(entry, "does not match the checksum it recorded when it was written");
}

// A seed's copy whose bytes do not read back to what it recorded: corrupted on this node's
// disk. The store may drop it (bad_copy), so that it is not chosen again.
Error Transfer::unproven(size_t entry, const std::string& what) const {
  const std::string path = dest_of(entry);
  store_.bad_copy(path, seed_before_[entry]);
  return Error{make_error_code(Errc::checksum_mismatch), host_name() + ": seed copy " + path + " " + what};
}

// One chunk of a seed's copy against its ChunkRecord, before it is sent: its CRC `crc` (of
// the bytes in buf) must be the one recorded for it (a unit of one chunk), or the units in it
// must read back to theirs (units smaller than the chunk), or the chunk must read back to the
// CRC the proving pass of its unit found (units larger than the chunk: the whole unit is read
// and proven first, once).
std::optional<Error> Transfer::prove_chunk(Input& in, const Segment& seg, uint64_t i, const Buffer& buf,
                                           uint64_t crc) {
  ChunkProof& p = chunk_proof_;
  const uint64_t chunk = m_.chunk_size, unit = p.record.unit;
  const ChunkRange range = chunk_range(seg.size, chunk, i);
  const bool zero = (buf.hdr.flags & kChunkZero) != 0;  // no payload: its bytes are zeros
  const auto bad = [&](uint64_t u) {
    return unproven(seg.entry, "does not read back to the CRC it recorded when it was written (bytes " +
                                   std::to_string(u * unit) + " to " +
                                   std::to_string(std::min(seg.size, (u + 1) * unit)) + ")");
  };
  if (unit == chunk) return crc == p.record.crcs[i] ? std::nullopt : std::optional<Error>(bad(i));
  if (unit < chunk) {
    for (uint64_t off = 0; off < range.length; off += unit) {
      const uint64_t n = std::min(unit, range.length - off);
      const uint64_t u = (range.offset + off) / unit;
      const uint64_t c = zero ? crc64_zeros(n) : crc64(std::span(buf.mem->data() + off, n));
      if (c != p.record.crcs[u]) return bad(u);
    }
    return std::nullopt;
  }
  const uint64_t u = range.offset / unit;
  if (p.unit_proven[u] == 0)
    if (auto err = prove_unit(in, seg, u)) return err;
  if (crc == p.chunk_crc[i]) return std::nullopt;
  return unproven(seg.entry, "changed its bytes between two reads of chunk " + std::to_string(i));
}

// The proving pass of unit u (larger than a chunk): each of its chunks read once, its CRC
// kept, and the unit's CRC, combined from them, against the record.
std::optional<Error> Transfer::prove_unit(Input& in, const Segment& seg, uint64_t u) {
  ChunkProof& p = chunk_proof_;
  const uint64_t chunk = m_.chunk_size, unit = p.record.unit;
  if (!p.scratch && !(p.scratch = ChunkBuffer::make(chunk)))
    return sys_error(ENOMEM, "allocate a buffer to prove a seed copy's chunks");
  uint64_t crc = 0;
  const uint64_t end = std::min(seg.size, (u + 1) * unit);
  for (uint64_t off = u * unit; off < end; off += chunk) {
    const uint64_t n = std::min(chunk, end - off);
    uint64_t c = crc64_zeros(n);
    if (in.file->has_data(off, n)) {
      const std::span<std::byte> dst(p.scratch->data(), n);
      if (auto st = in.file->read_at(off, dst); !st) {
        store_.bad_copy(dest_of(seg.entry), seed_before_[seg.entry]);  // unreadable
        return st.error();
      }
      read_seed_ += n;
      c = crc64(dst);
    }
    p.chunk_crc[off / chunk] = c;
    crc = crc64_combine(crc, c, n);
  }
  if (crc != p.record.crcs[u])
    return unproven(seg.entry, "does not read back to the CRC it recorded when it was written (bytes " +
                                   std::to_string(u * unit) + " to " + std::to_string(end) + ")");
  p.unit_proven[u] = 1;
  return std::nullopt;
}

// The reader's file: from the source, or (a seed) this node's copy, which must still be the
// copy decide() judged current (same_copy: the file at the name is the one judged, with its
// size and mtime). A copy replaced since fails this feed (the transfer goes on from another
// feeder: refeed.cc).
Result<std::unique_ptr<SourceFile>> Transfer::open_input(size_t entry) {
  const Entry& e = m_.entries[entry];
  if (!seeded_) return src_->open(ep_.source, e);
  const std::string path = dest_of(entry);
  auto f = store_.open_copy(path);
  if (!f) return f.error();
  auto now = (*f)->stat_now();
  if (!now) return now.error();
  if (now->size != e.meta.size || !same_copy(*now, copy_seen_[entry]))
    return stage_error(Errc::source_changed, kSeedCopy, path);
  seed_before_[entry] = *now;
  return f;
}

// A seeded transfer, after the stream, on the source rank: is the source still the version
// the manifest describes (the check the source rank's reader makes after each file's last
// byte)? Opens each streamed file; reads no data.
std::optional<Error> Transfer::recheck_source(const Layout& layout) {
  for (const Segment& seg : layout.segments()) {
    const Entry& e = m_.entries[seg.entry];
    auto f = src_->open(ep_.source, e);
    if (!f) return f.error();
    if (auto err = check_end(**f, e.meta, join_path(ep_.source, e.path), false)) return err;
  }
  return std::nullopt;
}

// Files with nothing in the stream (empty, or all hole) have no piece in any chunk, so no end
// of file in read_chunk(): checked first (a /proc file is empty by stat and full of text by
// read). False: source_err_ says why.
bool Transfer::check_empty_files(const Layout& layout) {
  for (const Segment& seg : layout.segments()) {
    if (seg.length != 0) continue;
    auto f = open_input(seg.entry);
    source_err_ =
        f ? check_input_end(**f, seg.entry, crc64_zeros(seg.size)) : std::optional<Error>(f.error());
    if (source_err_) return false;
  }
  return true;
}

// One piece of a chunk (a part of one file) into buf: read, or (hole: any_data left alone)
// nothing at all: the caller zeroes hole pieces only in a chunk that holds data, since a chunk
// of holes travels as a flag and nobody reads its buffer.
std::optional<Error> Transfer::read_piece(const Layout& layout, Input& in, const Piece& p, Buffer& buf,
                                          uint64_t& piece_crc, bool& any_data) {
  const Segment& seg = layout.segments()[p.segment];
  if (in.segment != p.segment) {
    auto f = open_input(seg.entry);
    if (!f) return f.error();
    in.file = std::move(f.value());
    in.segment = p.segment;
  }
  SourceFile& file = *in.file;
  const std::span<std::byte> dst(buf.mem->data() + p.chunk_off, p.length);
  if (file.has_data(p.file_off, p.length)) {
    if (auto st = file.read_at(p.file_off, dst); !st) {
      if (seeded_) store_.bad_copy(dest_of(seg.entry), seed_before_[seg.entry]);  // unreadable
      return st.error();
    }
    (seeded_ ? read_seed_ : read_source_) += p.length;
    any_data = true;
    piece_crc = crc64(dst);
    return std::nullopt;
  }
  // A hole, or the end of a file that shrank since the scan: zeros only for a hole
  // (a reader of the copy in progress may see this chunk before the end check).
  auto now = file.stat_now();
  if (!now) return now.error();
  if (now->size < p.file_off + p.length) {
    Error err = stage_error(Errc::source_changed, seeded_ ? kSeedCopy : "source",
                            seeded_ ? dest_of(seg.entry) : join_path(ep_.source, m_.entries[seg.entry].path));
    err.message += " (it shrank during the copy)";
    return err;
  }
  piece_crc = crc64_zeros(p.length);
  return std::nullopt;
}

// Chunk i into buf, with its header; `last`: the last chunk this reader reads. A failure or
// a cancellation sets source_err_ and makes it an abort chunk.
void Transfer::read_chunk(const Layout& layout, Input& in, Buffer& buf, uint64_t i, bool last) {
  const ChunkRange range = chunk_range(layout.bytes(), m_.chunk_size, i);
  buf.hdr = ChunkHeader{i, range.length, 0, 0, 0};
  if (opt_.cancelled && opt_.cancelled()) {
    source_err_ = stage_error(Errc::cancelled, "transfer abandoned (stopping)", ep_.source);
    buf.hdr.flags = kChunkAbort;
    return;
  }
  bool any_data = false;
  uint64_t crc = 0;
  const auto pieces = layout.pieces(range.offset, range.length);
  std::vector<char> hole(pieces.size(), 0);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& p = pieces[k];
    uint64_t piece_crc = 0;
    bool data = false;
    source_err_ = read_piece(layout, in, p, buf, piece_crc, data);
    if (source_err_) break;
    hole[k] = data ? 0 : 1;
    any_data = any_data || data;
    crc = crc64_combine(crc, piece_crc, p.length);
    if (live_copy_) continue;  // one piece per chunk; the file's CRC and end check below
    const Segment& seg = layout.segments()[p.segment];
    reader_file_crc_[p.segment] = crc_through(reader_file_crc_[p.segment], p, piece_crc, seg);
    if (p.ends_file) {  // end of this file: is it still the same file?
      source_err_ = check_input_end(*in.file, seg.entry, reader_file_crc_[p.segment]);
      if (source_err_) break;
    }
  }
  if (!source_err_ && any_data)  // its holes travel as zeros
    for (size_t k = 0; k < pieces.size(); ++k)
      if (hole[k] != 0) std::memset(buf.mem->data() + pieces[k].chunk_off, 0, pieces[k].length);
  buf.hdr.flags = any_data ? 0 : kChunkZero;
  if (live_copy_ && !source_err_ && chunk_proof_.record.unit != 0)  // the chunk of the file it is
    source_err_ = prove_chunk(in, layout.segments()[0], layout.file_chunk(i, m_.chunk_size), buf, crc);
  if (live_copy_ && !source_err_) {
    reader_chunk_crc_[i] = crc;
    if (last) {  // every chunk read: the file's CRC, and is it still the same file?
      reader_file_crc_[0] = layout.crc_of_chunks(m_.chunk_size, reader_chunk_crc_);
      source_err_ = check_input_end(*in.file, layout.segments()[0].entry, reader_file_crc_[0]);
    }
  }
  if (source_err_) {
    buf.hdr.flags = kChunkAbort;
    return;
  }
  buf.hdr.crc = crc;
}

void Transfer::reader_loop(const Layout& layout, BlockingQueue<BufPtr>& free_q,
                           BlockingQueue<BufPtr>& full_q) {
  const uint64_t nchunks = chunk_count(layout.bytes(), m_.chunk_size);
  reader_file_crc_.assign(layout.segments().size(), 0);
  if (!check_empty_files(layout)) {
    if (nchunks == 0) return;  // the trailer carries the error
    auto b = free_q.pop();
    if (!b) return;
    (*b)->hdr = ChunkHeader{0, chunk_range(layout.bytes(), m_.chunk_size, 0).length, 0, kChunkAbort, 0};
    full_q.push(std::move(*b));
    return;
  }
  Input in;
  std::vector<char> sent(live_copy_ ? nchunks : 0);
  uint64_t next = 0, low = 0;
  if (live_copy_) reader_chunk_crc_.assign(nchunks, 0);
  if (live_copy_ && seeded_ && record_) {  // a seed proves every chunk it sends (see the top)
    chunk_proof_.record = *record_;
    chunk_proof_.unit_proven.assign(record_->crcs.size(), 0);
    chunk_proof_.chunk_crc.assign(chunk_count(layout.segments()[0].size, m_.chunk_size), 0);  // by file chunk
  }
  for (uint64_t k = 0; k < nchunks; ++k) {
    auto t_wait = Clock::now();
    auto b = free_q.pop();
    if (!b) return;
    // Chosen once a buffer is free: as late as possible, so the latest wants count.
    const uint64_t i = live_copy_ ? pick_chunk(sent, next, low) : k;
    if (live_copy_) sent[i] = 1;
    const auto t_read = Clock::now();
    r_.pipe.read_wait += seconds_between(t_wait, t_read);
    const Accumulate busy(r_.pipe.read, t_read);
    read_chunk(layout, in, **b, i, k + 1 == nchunks);
    const bool aborted = ((*b)->hdr.flags & kChunkAbort) != 0;
    full_q.push(std::move(*b));
    if (aborted) return;
  }
}

}  // namespace stage::engine
