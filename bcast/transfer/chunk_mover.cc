#include "bcast/transfer/chunk_mover.h"

#include <deque>
#include <string>

namespace stage::engine {

namespace {

class StreamMover final : public ChunkMover {
 public:
  StreamMover(PointToPoint& p2p, int root, bool is_root, BcastAlgorithm shape, const PipelineOptions& opt)
      : is_root_(is_root), stream_(p2p, root, shape, opt) {}
  // On a failure, a send or receive MPI could not cancel may still use a submitted buffer
  // after we give up: those buffers are then left allocated, never unmapped or reused (a few
  // chunks, once per failed transfer; a stagefs group stops transferring after a failure).
  ~StreamMover() override {
    if (ok_) return;
    for (auto& b : inflight_)
      if (b) quarantine(std::shared_ptr<void>(std::move(b)));
  }
  StreamMover(const StreamMover&) = delete;
  StreamMover& operator=(const StreamMover&) = delete;

  [[nodiscard]] bool synchronous() const override { return false; }
  [[nodiscard]] bool room() const override { return true; }
  [[nodiscard]] size_t pending() const override { return stream_.pending(); }
  Status submit(BufPtr buf, const ChunkHeader& hdr) override {
    std::span<std::byte> span;
    if (buf) {
      const bool empty = (hdr.flags & (kChunkZero | kChunkAbort)) != 0;
      span = is_root_ ? std::span(buf->mem->data(), empty ? 0 : hdr.length) : buf->mem->bytes();
    }
    if (auto st = stream_.submit(span, hdr); !st) return st;
    inflight_.push_back(std::move(buf));
    return {};
  }
  Result<bool> progress(std::vector<MovedChunk>& done) override {
    hdrs_.clear();
    auto r = stream_.progress(hdrs_);
    if (!r) return r;
    for (const ChunkHeader& h : hdrs_) {
      done.push_back(MovedChunk{h, std::move(inflight_.front())});
      inflight_.pop_front();
    }
    return r;
  }
  void idle() override { stream_.idle(); }
  void resumed() override { stream_.resumed(); }
  [[nodiscard]] bool carries_wants() const override { return true; }
  void want(uint64_t index) override { stream_.want(index); }
  std::optional<uint64_t> take_want() override { return stream_.take_want(); }
  Status finish() override {
    auto st = stream_.finish();
    ok_ = static_cast<bool>(st);
    return st;
  }

 private:
  const bool is_root_;
  // Declared before the stream: a request still pending when the stream goes is cancelled
  // before its buffer is freed (or kept, see above).
  std::deque<BufPtr> inflight_;  // submitted, in submission order (nest marks: null)
  bool ok_ = false;
  ChunkStream stream_;
  std::vector<ChunkHeader> hdrs_;
};

class CollectiveMover final : public ChunkMover {
 public:
  CollectiveMover(Comm& comm, int root, BcastAlgorithm algo, const PipelineOptions& opt,
                  std::function<bool(const ChunkHeader&)> fits)
      : comm_(comm), root_(root), algo_(algo), opt_(opt), fits_(std::move(fits)) {}

  [[nodiscard]] bool synchronous() const override { return true; }
  [[nodiscard]] bool room() const override { return !held_; }
  [[nodiscard]] size_t pending() const override { return held_ ? 1 : 0; }
  Status submit(BufPtr buf, const ChunkHeader& hdr) override {
    buf_ = std::move(buf);
    hdr_ = hdr;
    held_ = true;
    return {};
  }
  // The header from the root, then (unless it says there is none) the payload.
  Result<bool> progress(std::vector<MovedChunk>& done) override {
    if (!held_) return false;
    held_ = false;
    ChunkHeader h = comm_.rank() == root_ ? hdr_ : ChunkHeader{};
    if (auto st = comm_.bcast(std::as_writable_bytes(std::span(&h, 1)), root_); !st) return st.error();
    if (!fits_(h))  // out of step: stop (every rank sees the same header)
      return stage_error(Errc::bad_message, "chunk header " + std::to_string(chunks_));
    if ((h.flags & (kChunkZero | kChunkAbort | kChunkNest)) == 0)
      if (auto st = data_bcast(comm_, std::span(buf_->mem->data(), h.length), root_, algo_, opt_); !st)
        return st.error();
    if ((h.flags & kChunkNest) == 0) ++chunks_;
    done.push_back(MovedChunk{h, std::move(buf_)});
    return true;
  }
  void idle() override {}  // the loop waited for its buffer
  void resumed() override {}
  [[nodiscard]] bool carries_wants() const override { return false; }
  Status finish() override { return {}; }

 private:
  Comm& comm_;
  const int root_;
  const BcastAlgorithm algo_;
  const PipelineOptions opt_;
  const std::function<bool(const ChunkHeader&)> fits_;
  bool held_ = false;
  BufPtr buf_;
  ChunkHeader hdr_{};
  uint64_t chunks_ = 0;  // headers moved, nest marks aside (for messages)
};

}  // namespace

std::unique_ptr<ChunkMover> make_stream_mover(PointToPoint& p2p, int root, bool is_root, BcastAlgorithm shape,
                                              const PipelineOptions& opt) {
  return std::make_unique<StreamMover>(p2p, root, is_root, shape, opt);
}

std::unique_ptr<ChunkMover> make_collective_mover(Comm& comm, int root, BcastAlgorithm algo,
                                                  const PipelineOptions& opt,
                                                  std::function<bool(const ChunkHeader&)> fits) {
  return std::make_unique<CollectiveMover>(comm, root, algo, opt, std::move(fits));
}

}  // namespace stage::engine
