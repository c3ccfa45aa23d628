// The copy phase on the calling thread (the one that owns the Comm): starts the reader
// thread (the rank that feeds the stream) and the writer thread (a rank that writes), moves
// the chunks between them, and after the last chunk shares the trailer: the reader's verdict
// and every streamed file's CRC, against which each writer checks its copies.
#include <thread>

#include "bcast/transfer/transfer.h"

namespace stage::engine {

namespace {

// With a Nest: the reader's chunks in a pipelined mover at once (see move_chunks). 2 keeps
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

void Transfer::route_wants(const Layout& layout, ChunkMover& mover) {
  if (!live_copy_) return;
  want_scratch_.clear();
  if (opt_.live_copy != nullptr) opt_.live_copy->take_wanted(want_scratch_);
  for (uint64_t c : want_scratch_) {
    const auto w = layout.stream_chunk(c, m_.chunk_size);  // readers name chunks of the file
    if (!w) continue;                                      // a hole: nothing to send
    if (is_reader())
      push_want(*w);
    else if (mover.carries_wants())
      mover.want(*w);
  }
  if (is_reader())
    while (auto w = mover.take_want()) push_want(*w);
}

// A chunk header: a known flag set and, for a chunk, a known index and its chunk's length.
// Pure: the collective mover checks it before the payload's broadcast.
bool Transfer::header_fits(const ChunkHeader& h, const Layout& layout) const {
  if (h.flags == kChunkNest) return opt_.nest != nullptr && h.index == 0 && h.length == 0 && h.reserved != 0;
  if ((h.flags & ~(kChunkZero | kChunkAbort)) != 0) return false;
  if ((h.flags & kChunkAbort) != 0) return true;
  if (h.index >= chunk_count(layout.bytes(), m_.chunk_size)) return false;
  return h.length == chunk_range(layout.bytes(), m_.chunk_size, h.index).length;
}

// A chunk header out of the mover: it fits, and an abort ends the stream wherever it comes;
// any other chunk must be the next one (in file order) or, with readers steering the order,
// one not seen yet.
bool Transfer::valid_header(const ChunkHeader& h, const Layout& layout, uint64_t seq,
                            std::vector<char>& seen) const {
  if (!header_fits(h, layout)) return false;
  if ((h.flags & (kChunkNest | kChunkAbort)) != 0) return true;
  if (live_copy_ ? seen[h.index] != 0 : h.index != seq) return false;
  seen[h.index] = 1;
  return true;
}

// The control plane's turn: a poll and, on the reader, maybe a nest mark. A nest header goes
// in between two chunks, never after the last one (every rank then still has a chunk to
// receive after it, so it posts a receive for it).
Status Transfer::nest_turn(ChunkMover& mover, ChunkLoop& s) {
  if (opt_.nest == nullptr) return {};
  // A rank waiting inside every chunk's collective polls once per chunk; elsewhere the loop
  // turns far more often than the control plane needs.
  if (auto st = mover.synchronous() && !is_reader() ? opt_.nest->poll() : poll_nest(); !st) return st;
  if (!is_reader() || s.submitted >= s.nchunks || s.abort_sent || !mover.room()) return {};
  const uint32_t token = opt_.nest->mark();
  if (token == 0) return {};
  if (auto st = mover.submit(nullptr, nest_header(token)); !st) return st;
  s.moved = true;
  return {};
}

// The next buffer for the mover: the reader's next full one, elsewhere a free one to receive
// into. A synchronous mover's loop waits for it (on the reader in steps of 1 ms while readers'
// wants or the control plane need the loop to turn); a pipelined one takes what is there.
std::optional<BufPtr> Transfer::next_buffer(ChunkMover& mover, Queues& q, ChunkLoop& s) {
  BlockingQueue<BufPtr>& from = is_reader() ? q.full_q : q.free_q;
  if (!mover.synchronous()) return from.try_pop();
  std::optional<BufPtr> b;
  if (is_reader() && (live_copy_ || opt_.nest != nullptr))
    b = from.pop_for(std::chrono::milliseconds(1));
  else if (!(b = from.pop()))
    s.closed = true;
  if (b) s.t_turn = Clock::now();  // the chunk's time in the collectives starts here
  return b;
}

// Buffers into the mover: up to every chunk (the reader: within `ahead` in flight), and
// elsewhere one receive buffer per chunk and per nest mark seen.
Status Transfer::feed(ChunkMover& mover, Queues& q, ChunkLoop& s) {
  while (s.submitted < s.nchunks + (is_reader() ? 0 : s.nests) && !s.abort_sent && mover.room() &&
         (!is_reader() || mover.pending() < s.ahead)) {
    auto b = next_buffer(mover, q, s);
    if (!b) break;
    const ChunkHeader h = is_reader() ? (*b)->hdr : ChunkHeader{};
    if (auto st = mover.submit(std::move(*b), h); !st) return st;
    ++s.submitted;
    s.moved = true;
    s.abort_sent = (h.flags & kChunkAbort) != 0;
  }
  return {};
}

// A chunk complete here: checked, then to the writer (or back to the free buffers), or a
// nest mark: the nested transfer runs now; or the abort: the loop ends (every rank sees it at
// the same chunk).
Status Transfer::hand_on(MovedChunk& c, const Layout& layout, ChunkMover& mover, ChunkLoop& s, Queues& q) {
  const ChunkHeader& h = c.hdr;
  if (!valid_header(h, layout, s.completed, s.seen))  // out of step: stop
    return stage_error(Errc::bad_message, "chunk header " + std::to_string(s.completed));
  // A nest mark: every chunk before it is passed on here, so the nested transfer runs now.
  if ((h.flags & kChunkNest) != 0) {
    if (c.buf) q.free_q.push(std::move(c.buf));  // a receive buffer: no chunk came
    ++s.nests;
    if (auto st = opt_.nest->run(static_cast<uint32_t>(h.reserved)); !st) return st;
    mover.resumed();
    s.moved = true;
    return {};
  }
  if ((h.flags & kChunkAbort) != 0) {
    q.free_q.push(std::move(c.buf));
    s.ended = true;
    return {};
  }
  if ((h.flags & kChunkZero) == 0) r_.bytes_streamed += h.length;
  ++r_.chunks;
  c.buf->hdr = h;
  (s.write_here ? q.write_q : q.free_q).push(std::move(c.buf));
  s.done_bytes += chunk_range(layout.bytes(), m_.chunk_size, h.index).length;
  if (progress_) progress_(s.done_bytes, layout.bytes());
  ++s.completed;
  return {};
}

// The one chunk loop, on the calling thread: each turn routes readers' wants, gives the
// control plane its turn, feeds the mover, and hands on what it completed; a turn that moved
// nothing lets the mover wait. The time of turns with chunks in the mover is the bcast figure.
Status Transfer::move_chunks(const Layout& layout, ChunkMover& mover, bool write_here, Queues& q) {
  ChunkLoop s;
  s.nchunks = chunk_count(layout.bytes(), m_.chunk_size);
  s.seen.resize(s.nchunks);
  s.write_here = write_here;
  // The reader's chunks in the mover at once (kNestAheadChunks with a Nest; else every
  // chunk the reader has filled).
  s.ahead = opt_.nest != nullptr ? kNestAheadChunks : SIZE_MAX;
  std::vector<MovedChunk> done;
  while (s.completed < s.nchunks && !s.ended) {
    s.t_turn = Clock::now();
    s.moved = false;
    if (is_reader() || mover.carries_wants()) route_wants(layout, mover);
    if (auto st = nest_turn(mover, s); !st) return st;
    if (auto st = feed(mover, q, s); !st) return st;
    if (s.closed) return {};
    done.clear();
    auto r = mover.progress(done);
    if (!r) return r.error();
    for (MovedChunk& c : done) {
      if (auto st = hand_on(c, layout, mover, s, q); !st) return st;
      if (s.ended) break;
    }
    const bool busy = mover.pending() > 0 || !done.empty();  // else: waiting for the reader or writer
    if (!s.moved && !*r) mover.idle();
    if (busy) r_.pipe.bcast += seconds_between(s.t_turn, Clock::now());
  }
  return mover.finish();
}

// How the chunks travel: the same choice on every rank (the layout and the Comm's seam are
// the same everywhere). The mover goes before the threads are joined.
Status Transfer::run_chunks(const Layout& layout, bool write_here, Queues& q) {
  const BcastAlgorithm shape = resolve(opt_.bcast_algorithm, comm_, layout.bytes());
  std::unique_ptr<ChunkMover> mover;
  if (shape == BcastAlgorithm::mpi)
    mover = make_collective_mover(comm_, data_root_, opt_.bcast_algorithm, opt_.pipeline,
                                  [this, &layout](const ChunkHeader& h) { return header_fits(h, layout); });
  else
    mover = make_stream_mover(*comm_.point_to_point(), data_root_, is_reader(), shape, opt_.pipeline);
  return move_chunks(layout, *mover, write_here, q);
}

// A live copy: the same choice on every rank, since it depends on the manifest and the chunk
// size only (not on whether this rank has readers: nodes started with different
// --read-during-copy still agree). At most kMaxLiveCopyChunks (a few bytes of
// state per chunk and rank).
void Transfer::start_live(const Layout& layout, bool write_here) {
  const uint64_t nchunks = chunk_count(layout.bytes(), m_.chunk_size);
  // A sparse file's holes are whole chunks of the file (the manifest's rule), so each stream
  // chunk is one chunk of the file; readers name chunks of the file (LiveCopyReaders).
  live_copy_ = !m_.tree && !opt_.selection.active() && layout.one_file_in_chunks(m_.chunk_size) &&
               chunk_count(layout.segments()[0].size, m_.chunk_size) <= kMaxLiveCopyChunks;
  if (!live_copy_) return;
  const size_t e = layout.segments()[0].entry;
  writer_chunk_crc_.assign(nchunks, 0);
  if (opt_.live_copy == nullptr) return;
  if (live_started_) return opt_.live_copy->restarted();  // fed again (refeed.cc)
  if (write_here && need_local_[e] != 0 && txn_[e]) {
    opt_.live_copy->started(m_.entries[e].meta, m_.chunk_size, m_.entries[e].holes, *txn_[e]);
    live_started_ = true;
  }
  // Wants known before the copy starts (a replayed profile's) go first: on the reading rank,
  // before its reader picks a chunk.
  if (is_reader()) {
    want_scratch_.clear();
    opt_.live_copy->take_wanted(want_scratch_);
    for (uint64_t c : want_scratch_)
      if (const auto w = layout.stream_chunk(c, m_.chunk_size)) push_want(*w);  // a hole: nothing to send
  }
}

// Trailer: the reader's verdict on what it read; with a seed, the source rank's on the
// source; then the CRC of every streamed file. A seed's failure (but a stop: cancelled) is
// the seed's own: refeed_ says so on every rank, and the transfer is fed again (refeed.cc).
Status Transfer::share_trailer(const Layout& layout) {
  int64_t how = seeded_ && source_err_ && source_err_->code != make_error_code(Errc::cancelled) ? 2 : 1;
  if (auto st = share_root_status(source_err_, data_root_, &how); !st) return st;
  if (source_err_) {
    refeed_ = how == 2;
    return {};
  }
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
      refeed_ = true;
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
  const bool write_here = ep_.writer && r_.this_node_wrote && !local_err_;
  start_live(layout, write_here);
  Queues q;
  for (auto& b : buffers_) q.free_q.push(std::move(b));
  buffers_.clear();
  std::thread reader;
  std::thread writer;
  if (is_reader()) reader = std::thread([&] { reader_loop(layout, q.free_q, q.full_q); });
  if (write_here) writer = std::thread([&] { writer_loop(layout, q.write_q, q.free_q); });

  const Status comm_status = run_chunks(layout, write_here, q);
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
