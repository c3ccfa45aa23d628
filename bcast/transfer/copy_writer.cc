// The writer thread, on a rank that writes a copy: verifies each chunk's CRC, writes its
// pieces into the temporary files (holes stay holes), accumulates each file's CRC and
// finishes a file at its last byte; a single file of more than one chunk records its chunks'
// CRCs with it (ChunkRecord), so that it can later prove each chunk it feeds to other nodes. A failed writer
// keeps draining its queue so the stream never stalls; the failure is this node's (writer_err_), not the
// transfer's.
#include <algorithm>
#include <array>
#include <cstring>

#include "bcast/io/crc.h"
#include "bcast/transfer/transfer.h"

namespace stage::engine {

namespace {

bool is_sparse(const Entry& e) {
  return e.type == EntryType::file && e.allocated != 0 && e.allocated < e.meta.size;
}

// Writes data at off, leaving each all-zero 4 KiB block (aligned in the file) a hole. For a
// sparse source's chunks that hold data: without it, a file with one 4 KiB block of data in
// every 16 MiB chunk (1 TiB with 256 MiB allocated, a user's file in the source) would write
// its whole size on every node, far past its reservation and --cache-size.
Status write_sparse(Txn& t, uint64_t off, std::span<const std::byte> data) {
  constexpr uint64_t kBlock = 4096;
  static const std::array<std::byte, kBlock> kZeros{};
  size_t run = 0;
  bool in_run = false;
  for (size_t i = 0; i < data.size();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(data.size() - i, kBlock - (off + i) % kBlock));
    const bool zero = std::memcmp(data.data() + i, kZeros.data(), n) == 0;
    if (!zero && !in_run) {
      run = i;
      in_run = true;
    } else if (zero && in_run) {
      if (auto st = t.write(off + run, data.subspan(run, i - run)); !st) return st;
      in_run = false;
    }
    i += n;
  }
  if (in_run) return t.write(off + run, data.subspan(run));
  return {};
}

}  // namespace

void Transfer::finish_file(Txn& t, size_t entry, const ChunkRecord* chunks) {
  if (auto st = t.finish(m_.entries[entry].meta, file_crc_[entry], chunks); !st) writer_err_ = st.error();
  finished_[entry] = 1;
}

void Transfer::write_chunk(const Layout& layout, Buffer& buf, std::vector<uint64_t>& piece_crc,
                           Clock::time_point t_verify) {
  const bool zero = (buf.hdr.flags & kChunkZero) != 0;
  const ChunkRange range = chunk_range(layout.bytes(), m_.chunk_size, buf.hdr.index);
  const auto pieces = layout.pieces(range.offset, range.length);
  piece_crc.assign(pieces.size(), 0);
  uint64_t crc = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& p = pieces[k];
    piece_crc[k] = zero ? crc64_zeros(p.length) : crc64(std::span(buf.mem->data() + p.chunk_off, p.length));
    crc = crc64_combine(crc, piece_crc[k], p.length);
  }
  const auto t_write = Clock::now();
  r_.pipe.verify += seconds_between(t_verify, t_write);
  const Accumulate busy(r_.pipe.write, t_write);
  if (!zero && crc != buf.hdr.crc)
    writer_err_ =
        stage_error(Errc::checksum_mismatch, "chunk " + std::to_string(buf.hdr.index) + " for", ep_.dest);
  for (size_t k = 0; k < pieces.size() && !writer_err_; ++k) {
    const Piece& p = pieces[k];
    const Segment& seg = layout.segments()[p.segment];
    if (need_local_[seg.entry] == 0) continue;
    Txn& t = *txn_[seg.entry];
    if (!zero) {
      const std::span<const std::byte> data(buf.mem->data() + p.chunk_off, p.length);
      if (auto st = is_sparse(m_.entries[seg.entry]) ? write_sparse(t, p.file_off, data)
                                                     : t.write(p.file_off, data);
          !st) {
        writer_err_ = st.error();
        break;
      }
    }
    if (live_copy_) {  // chunks in any order: the file's CRC once all are here
      writer_chunk_crc_[buf.hdr.index] = piece_crc[k];
      if (opt_.live_copy != nullptr)
        opt_.live_copy->chunk_written(layout.file_chunk(buf.hdr.index, m_.chunk_size), zero);
      if (++writer_chunks_ < writer_chunk_crc_.size()) continue;
      file_crc_[seg.entry] = layout.crc_of_chunks(m_.chunk_size, writer_chunk_crc_);
      const auto crcs = layout.file_chunk_crcs(m_.chunk_size, writer_chunk_crc_);
      const ChunkRecord record = make_chunk_record(crcs, m_.chunk_size, seg.size);
      finish_file(t, seg.entry, crcs.size() > 1 ? &record : nullptr);
      continue;
    }
    file_crc_[seg.entry] = crc_through(file_crc_[seg.entry], p, piece_crc[k], seg);
    if (p.ends_file) finish_file(t, seg.entry);
  }
}

void Transfer::writer_loop(const Layout& layout, BlockingQueue<BufPtr>& write_q,
                           BlockingQueue<BufPtr>& free_q) {
  std::vector<uint64_t> piece_crc;
  for (auto t_wait = Clock::now();; t_wait = Clock::now()) {
    auto b = write_q.pop();
    if (!b) break;
    const auto t_verify = Clock::now();
    r_.pipe.write_wait += seconds_between(t_wait, t_verify);
    if (!writer_err_) write_chunk(layout, **b, piece_crc, t_verify);
    free_q.push(std::move(*b));  // a failed writer keeps draining so the pipeline never stalls
  }
}

}  // namespace stage::engine
