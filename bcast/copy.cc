// The copy phase on the calling thread (the one that owns the Comm): starts the reader
// thread (the rank that feeds the stream) and the writer thread (a rank that writes), moves
// the chunks between them, and after the last chunk shares the trailer: the reader's verdict
// and every streamed file's CRC, against which each writer checks its copies.
#include <thread>

#include "bcast/test_hold.h"
#include "bcast/transfer.h"

namespace stage::engine {

namespace {

// With a Nest: the source rank's chunks in the stream at once (see stream_chunks). 2 keeps
// the source's link busy across chunk boundaries (the next chunk is queued behind the one
// leaving) and bounds what a nest mark waits for to two chunks: a nested batch waits about
// as many chunk times as there are chunks ahead of its mark, while the large copy's own time
// does not depend on it (bench/results/bench_hol.md). 1 would leave the source's link idle
// for a loop turn at every chunk boundary, which costs little on a slow link but more where
// a chunk takes a millisecond.
constexpr size_t kNestAheadChunks = 2;

}  // namespace

Status Transfer::poll_nest() {
  const auto now = Clock::now();
  if (now < next_nest_poll_) return {};
  next_nest_poll_ = now + std::chrono::microseconds(500);
  return opt_.nest->poll();
}

void Transfer::route_wants(ChunkStream* stream) {
  if (!adaptive_) return;
  want_scratch_.clear();
  if (opt_.live != nullptr) opt_.live->take_wanted(want_scratch_);
  for (uint64_t w : want_scratch_) {
    if (is_reader())
      push_want(w);
    else if (stream != nullptr)
      stream->want(w);
  }
  if (stream != nullptr && is_reader())
    while (auto w = stream->take_want()) push_want(*w);
}

// Chunk by chunk through the Comm's collectives: a header broadcast, then the payload
// (Comm::bcast). Used with --bcast-algorithm mpi, one rank, or a stream too small to pipeline.
// A nest header (kChunkNest) comes between two chunks: every rank runs the nested transfer.
Status Transfer::broadcast_chunks(const Layout& layout, bool write_here, Queues& q) {
  const uint64_t nchunks = chunk_count(layout.bytes(), m_.chunk_size);
  std::vector<char> seen(nchunks);
  uint64_t done_bytes = 0;
  bool held = false;
  for (uint64_t i = 0; i < nchunks;) {
    if (i == 2 && !held) {  // let the writer catch up so "mid-file" means data is on disk
      test_hold("mid-file", comm_.rank());
      held = true;
    }
    std::optional<BufPtr> b;
    uint32_t token = 0;
    if (is_reader() && (adaptive_ || opt_.nest != nullptr)) {
      // The root's own readers' wants reach its reader, and the control plane is polled, while
      // it waits for the reader.
      for (;;) {
        route_wants(nullptr);
        if (opt_.nest != nullptr) {
          if (auto st = poll_nest(); !st) return st;
          if ((token = opt_.nest->mark()) != 0) break;
        }
        if ((b = q.full_q.pop_for(std::chrono::milliseconds(1)))) break;
      }
    } else {
      // Elsewhere once per chunk (this rank waits inside the header broadcast): its requests
      // still reach the coordinator during a long transfer.
      if (opt_.nest != nullptr)
        if (auto st = opt_.nest->poll(); !st) return st;
      b = is_reader() ? q.full_q.pop() : q.free_q.pop();
      if (!b) return {};
    }
    const Accumulate in_bcast(r_.pipe.bcast);
    ChunkHeader h = token != 0 ? nest_header(token) : is_reader() ? (*b)->hdr : ChunkHeader{};
    if (auto st = comm_.bcast(std::as_writable_bytes(std::span(&h, 1)), data_root_); !st) return st;
    if (!valid_header(h, layout, i, seen))
      return stage_error(Errc::bad_message, "chunk header " + std::to_string(i));  // out of step: stop
    if ((h.flags & kChunkNest) != 0) {
      if (b) q.free_q.push(std::move(*b));  // a receive buffer: no chunk came
      if (auto st = opt_.nest->run(static_cast<uint32_t>(h.reserved)); !st) return st;
      continue;
    }
    Buffer& buf = **b;
    const ChunkRange range = chunk_range(layout.bytes(), m_.chunk_size, h.index);
    if ((h.flags & kChunkAbort) != 0) {
      q.free_q.push(std::move(*b));
      return {};  // every rank sees the same header and leaves the loop at the same chunk
    }
    if ((h.flags & kChunkZero) == 0) {
      if (auto st = data_bcast(comm_, std::span(buf.mem->data(), h.length), data_root_, opt_.bcast_algorithm,
                               opt_.pipeline);
          !st)
        return st;
      r_.bytes_streamed += h.length;
    }
    ++r_.chunks;
    buf.hdr = h;
    (write_here ? q.write_q : q.free_q).push(std::move(*b));
    done_bytes += range.length;
    if (progress_) progress_(done_bytes, layout.bytes());
    ++i;
  }
  return {};
}

// A chunk header from the stream: a known flag set; an abort ends the stream wherever it
// comes; any other chunk must be the next one (in file order) or, with readers steering the
// order, one not seen yet; its length must be its chunk's.
bool Transfer::valid_header(const ChunkHeader& h, const Layout& layout, uint64_t seq, std::vector<char>& seen) const {
  if (h.flags == kChunkNest) return opt_.nest != nullptr && h.index == 0 && h.length == 0 && h.reserved != 0;
  if ((h.flags & ~(kChunkZero | kChunkAbort)) != 0) return false;
  if ((h.flags & kChunkAbort) != 0) return true;
  const uint64_t n = seen.size();
  if (adaptive_ ? (h.index >= n || seen[h.index] != 0) : h.index != seq) return false;
  if (h.length != chunk_range(layout.bytes(), m_.chunk_size, h.index).length) return false;
  seen[h.index] = 1;
  return true;
}

// Every chunk through one pipelined chain or tree (ChunkStream, bcast/pipeline.h): chunk
// i+1 enters the pipeline while chunk i drains, headers travel in-band. The MPI thread feeds
// the stream with buffers (the root: full ones from the reader; the others: free ones to
// receive into), hands completed chunks to the writer, and sleeps briefly when nothing moves.
Status Transfer::stream_chunks(const Layout& layout, BcastAlgorithm shape, bool write_here, Queues& q) {
  const uint64_t nchunks = chunk_count(layout.bytes(), m_.chunk_size);
  std::deque<BufPtr> inflight;  // submitted to the stream, in chunk order (outlives the stream)
  // On a failure, a send or receive MPI could not cancel may still use a submitted buffer
  // after we give up: those buffers are then left allocated, never unmapped or reused (a few
  // chunks, once per failed transfer; a stagefs group stops transferring after a failure).
  bool ok = false;
  struct Quarantine {
    std::deque<BufPtr>& bufs;
    const bool& ok;
    ~Quarantine() {
      if (!ok)
        for (auto& b : bufs) quarantine(std::shared_ptr<void>(std::move(b)));
    }
  } quarantine{inflight, ok};
  ChunkStream stream(*comm_.point_to_point(), data_root_, shape, opt_.pipeline);
  std::vector<ChunkHeader> done;
  std::vector<char> seen(nchunks);
  // The source rank's chunks in the stream at once (kNestAheadChunks with a Nest; else every
  // chunk the reader has filled).
  const size_t root_pending_max = opt_.nest != nullptr ? kNestAheadChunks : SIZE_MAX;
  // submitted: buffers put into the stream (the root: chunks; elsewhere: receive buffers, one
  // per chunk and one per nest header, which a rank learns of as it hands it back).
  uint64_t submitted = 0, completed = 0, done_bytes = 0, nests = 0;
  bool ended = false;      // the abort chunk came out of the stream
  bool abort_sent = false;  // root: the reader's abort chunk is in the stream
  while (completed < nchunks && !ended) {
    const auto t_iter = Clock::now();
    bool moved = false;
    route_wants(&stream);
    if (opt_.nest != nullptr) {
      if (auto st = poll_nest(); !st) return st;
      // A nest header goes in between two chunks, never after the last one (every rank then
      // still has a chunk to receive after it, so it posts a receive for it).
      if (is_reader() && submitted < nchunks && !abort_sent)
        if (const uint32_t token = opt_.nest->mark(); token != 0) {
          if (auto st = stream.submit({}, nest_header(token)); !st) return st;
          inflight.push_back(nullptr);
          moved = true;
        }
    }
    while (submitted < nchunks + (is_reader() ? 0 : nests) && !abort_sent &&
           (!is_reader() || stream.pending() < root_pending_max)) {
      auto b = is_reader() ? q.full_q.try_pop() : q.free_q.try_pop();
      if (!b) break;
      Buffer& buf = **b;
      const ChunkHeader h = is_reader() ? buf.hdr : ChunkHeader{};
      const bool empty = (h.flags & (kChunkZero | kChunkAbort)) != 0;
      const auto span = is_reader() ? std::span(buf.mem->data(), empty ? 0 : h.length) : buf.mem->bytes();
      if (auto st = stream.submit(span, h); !st) return st;
      inflight.push_back(std::move(*b));
      ++submitted;
      moved = true;
      abort_sent = (h.flags & kChunkAbort) != 0;
    }
    done.clear();
    auto r = stream.progress(done);
    if (!r) return r.error();
    for (const ChunkHeader& h : done) {
      BufPtr b = std::move(inflight.front());
      inflight.pop_front();
      if (!valid_header(h, layout, completed, seen))
        return stage_error(Errc::bad_message, "chunk header " + std::to_string(completed));
      if ((h.flags & kChunkNest) != 0) {  // every chunk before it passed on: the nested transfer runs
        if (b) q.free_q.push(std::move(b));  // a receive buffer: no chunk came
        ++nests;
        if (auto st = opt_.nest->run(static_cast<uint32_t>(h.reserved)); !st) return st;
        stream.resumed();
        moved = true;
        continue;
      }
      const ChunkRange range = chunk_range(layout.bytes(), m_.chunk_size, h.index);
      if ((h.flags & kChunkAbort) != 0) {  // every rank sees it at the same chunk
        q.free_q.push(std::move(b));
        ended = true;
        break;
      }
      if ((h.flags & kChunkZero) == 0) r_.bytes_streamed += h.length;
      ++r_.chunks;
      b->hdr = h;
      (write_here ? q.write_q : q.free_q).push(std::move(b));
      done_bytes += range.length;
      if (progress_) progress_(done_bytes, layout.bytes());
      if (++completed == 2 && completed < nchunks)  // chunks 0 and 1 are with the writer, more follow
        test_hold("mid-file", comm_.rank());
    }
    const bool busy = stream.pending() > 0 || !done.empty();  // else: waiting for the reader or writer
    if (!moved && !*r) stream.idle();
    if (busy) r_.pipe.bcast += seconds_between(t_iter, Clock::now());
  }
  if (auto st = stream.finish(); !st) return st;
  ok = true;
  for (auto& b : inflight)  // receives dropped after an abort (the root's nest marks hold none)
    if (b) q.free_q.push(std::move(b));
  return {};
}


// Reads before the copy ends: the same choice on every rank, since it depends on the
// manifest and the chunk size only (not on whether this rank has readers: nodes started with
// different --read-during-copy still agree). At most kMaxAdaptiveChunks (a few bytes of
// state per chunk and rank).
void Transfer::start_live(const Layout& layout, bool write_here) {
  const uint64_t nchunks = chunk_count(layout.bytes(), m_.chunk_size);
  adaptive_ = !m_.tree && opt_.small_files_max == 0 && layout.segments().size() == 1 && nchunks <= kMaxAdaptiveChunks;
  if (!adaptive_) return;
  const size_t e = layout.segments()[0].entry;
  writer_chunk_crc_.assign(nchunks, 0);
  if (opt_.live != nullptr && write_here && need_local_[e] != 0 && txn_[e])
    opt_.live->started(m_.entries[e].meta, m_.chunk_size, *txn_[e]);
}

// Trailer: the reader's verdict on what it read; with a seed, the source rank's on the
// source; then the CRC of every streamed file.
Status Transfer::share_trailer(const Layout& layout) {
  if (auto st = share_root_status(source_err_, data_root_); !st) return st;
  if (source_err_) return {};
  if (seeded_) {
    if (is_root()) source_err_ = recheck_source(layout);
    if (auto st = share_root_status(source_err_, opt_.root); !st) return st;
    if (source_err_) return {};
  }
  source_file_crc_ = is_reader() ? reader_file_crc_ : std::vector<uint64_t>(layout.segments().size());
  if (auto st = comm_.bcast(std::as_writable_bytes(std::span(source_file_crc_)), data_root_); !st) return st;
  if (seeded_ && !src_crc_.empty()) {  // --pre-validate checksum: every rank knows the source's CRCs
    for (size_t k = 0; k < layout.segments().size(); ++k) {
      const size_t i = layout.segments()[k].entry;
      if (source_file_crc_[k] == src_crc_[i]) continue;
      const std::string msg = "seed copy " + dest_of(i) + " does not match the source's checksum";
      source_err_ = Error{make_error_code(is_reader() ? Errc::checksum_mismatch : Errc::peer_failed), msg};
      return {};
    }
  }
  return {};
}

// This node's copies against the trailer's CRCs.
void Transfer::check_copies(const Layout& layout, bool write_here) {
  if (writer_err_) fail_local(*writer_err_);
  if (!write_here || local_err_) return;
  for (size_t s = 0; s < layout.segments().size(); ++s) {
    const size_t i = layout.segments()[s].entry;
    if (need_local_[i] != 0 && finished_[i] != 0 && file_crc_[i] != source_file_crc_[s])
      fail_local(stage_error(Errc::checksum_mismatch, "copy of", dest_of(i)));
  }
}

Status Transfer::copy() {
  const Layout layout(m_, need_any_);
  r_.files_streamed = layout.segments().size();
  const bool write_here = ep_.writer && r_.this_node_wrote;
  start_live(layout, write_here);
  Queues q;
  for (auto& b : buffers_) q.free_q.push(std::move(b));
  buffers_.clear();
  std::thread reader;
  std::thread writer;
  if (is_reader()) reader = std::thread([&] { reader_loop(layout, q.free_q, q.full_q); });
  if (write_here) writer = std::thread([&] { writer_loop(layout, q.write_q, q.free_q); });

  test_hold("before-first-chunk", comm_.rank());
  // Same choice on every rank: the layout and the Comm's seam are the same everywhere.
  const BcastAlgorithm shape = resolve(opt_.bcast_algorithm, comm_, layout.bytes());
  const Status comm_status = shape == BcastAlgorithm::mpi ? broadcast_chunks(layout, write_here, q)
                                                          : stream_chunks(layout, shape, write_here, q);
  q.write_q.close();
  if (writer.joinable()) writer.join();
  q.free_q.close();
  if (reader.joinable()) reader.join();
  if (!comm_status) return comm_status;
  if (auto st = share_trailer(layout); !st) return st;
  if (source_err_) return {};
  check_copies(layout, write_here);
  return {};
}

}  // namespace stage::engine
