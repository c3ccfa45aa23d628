#include "bcast/pipeline.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <deque>
#include <numeric>
#include <utility>

#include "bcast/chunk.h"

namespace stage {

std::optional<BcastAlgorithm> parse_bcast_algorithm(std::string_view text) {
  if (text == "auto") return BcastAlgorithm::automatic;
  if (text == "chain") return BcastAlgorithm::chain;
  if (text == "tree") return BcastAlgorithm::tree;
  if (text == "mpi") return BcastAlgorithm::mpi;
  return std::nullopt;
}

const char* to_string(BcastAlgorithm a) {
  switch (a) {
    case BcastAlgorithm::automatic:
      return "auto";
    case BcastAlgorithm::chain:
      return "chain";
    case BcastAlgorithm::tree:
      return "tree";
    case BcastAlgorithm::mpi:
      return "mpi";
  }
  return "?";
}

namespace {

// "node9" < "node10": runs of digits compare as numbers, so numbered hosts and switches keep
// their natural neighbours next to each other.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const auto da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const auto db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie])) != 0) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je])) != 0) ++je;
      size_t is = i, js = j;  // skip leading zeros, then the longer number is bigger
      while (is + 1 < ie && a[is] == '0') ++is;
      while (js + 1 < je && b[js] == '0') ++js;
      if (ie - is != je - js) return ie - is < je - js;
      if (int c = a.compare(is, ie - is, b, js, je - js); c != 0) return c < 0;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

}  // namespace

std::vector<int> broadcast_order(const std::vector<std::string>& placement, int root) {
  const int n = static_cast<int>(placement.size());
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return natural_less(placement[static_cast<size_t>(a)], placement[static_cast<size_t>(b)]);
  });
  auto it = std::find(order.begin(), order.end(), root);
  if (it != order.end()) std::rotate(order.begin(), it, order.end());
  return order;
}

Links links_of(BcastAlgorithm shape, const std::vector<int>& order, int rank) {
  Links l;
  const auto it = std::find(order.begin(), order.end(), rank);
  if (it == order.end()) return l;
  const size_t p = static_cast<size_t>(it - order.begin());
  const size_t n = order.size();
  if (shape == BcastAlgorithm::tree) {
    if (p > 0) l.parent = order[(p - 1) / 2];
    for (size_t c : {2 * p + 1, 2 * p + 2})
      if (c < n) l.children.push_back(order[c]);
  } else {
    if (p > 0) l.parent = order[p - 1];
    if (p + 1 < n) l.children.push_back(order[p + 1]);
  }
  return l;
}

uint64_t segment_for(uint64_t bytes) {
  return std::max<uint64_t>(1, std::min(bytes, kDefaultSegment));
}

BcastAlgorithm resolve(BcastAlgorithm requested, Comm& comm, uint64_t bytes) {
  if (requested == BcastAlgorithm::mpi || comm.size() <= 1 || comm.point_to_point() == nullptr)
    return BcastAlgorithm::mpi;
  if (requested != BcastAlgorithm::automatic) return requested;
  return bytes > kPipelineMinBytes ? BcastAlgorithm::chain : BcastAlgorithm::mpi;
}

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSegmentTags = 16384;            // data tags: segment index modulo this
constexpr int kAckTag = kSegmentTags + 1;      // a child's "my subtree has it"
constexpr int kReleaseTag = kSegmentTags + 2;  // tree: "every subtree has it"
constexpr int kHeaderTag = kSegmentTags + 3;   // a chunk's header
static_assert(kHeaderTag <= PointToPoint::kMaxTag);

// One pending request: cancelled if it is dropped before it completed.
class Op {
 public:
  Op(PointToPoint& p, PointToPoint::Request id, uint64_t seg) : p_(&p), id_(id), seg_(seg) {}
  Op(Op&& o) noexcept : p_(o.p_), id_(std::exchange(o.id_, -1)), seg_(o.seg_) {}
  Op& operator=(Op&& o) noexcept {
    if (this != &o) {
      drop();
      p_ = o.p_;
      id_ = std::exchange(o.id_, -1);
      seg_ = o.seg_;
    }
    return *this;
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  ~Op() { drop(); }

  [[nodiscard]] uint64_t seg() const { return seg_; }
  // true once complete; an error if the request failed.
  Result<bool> poll() {
    auto r = p_->test(id_);
    if (!r || *r) id_ = -1;
    return r;
  }

 private:
  void drop() noexcept {
    if (id_ >= 0) p_->cancel(id_);
    id_ = -1;
  }
  PointToPoint* p_;
  PointToPoint::Request id_;
  uint64_t seg_;
};

// Polls the ops in the order they were started, up to the first one still pending: removes the
// completed ones and calls done(seg) for each. Returns whether any completed, or the first
// error. (In order, because messages on one link complete in order, and because each test is
// a trip through the MPI progress engine, often a system call: testing all 64 requests of a
// window at every poll cost more CPU than the transfer itself on a loaded node.)
template <class F>
Result<bool> poll_in_order(std::deque<Op>& ops, F&& done) {
  bool any = false;
  while (!ops.empty()) {
    auto r = ops.front().poll();
    if (!r) return r.error();
    if (!*r) break;
    done(ops.front().seg());
    ops.pop_front();
    any = true;
  }
  return any;
}

// MPI_Test-driven waiting without a spinning core: a short burst of polls, then sleeps that
// double from 20 us to 1 ms until something progresses. (A window of segments in flight
// covers the sleeps: the sockets keep moving data while the rank sleeps.)
class Backoff {
 public:
  void reset() {
    spins_ = 0;
    sleep_ns_ = 0;
  }
  void wait() {
    constexpr int kSpins = 20;
    constexpr long kFirstNs = 20'000, kMaxNs = 1'000'000;
    if (spins_ < kSpins) {
      ++spins_;
      return;
    }
    sleep_ns_ = std::min(sleep_ns_ == 0 ? kFirstNs : sleep_ns_ * 2, kMaxNs);
    const timespec ts{0, sleep_ns_};
    ::nanosleep(&ts, nullptr);
  }

 private:
  int spins_ = 0;
  long sleep_ns_ = 0;
};

}  // namespace

struct ChunkStream::Impl {
  // One chunk on its way through this rank. Its header lives here (a send or receive buffer
  // of a live request: the deque never moves an element it keeps).
  struct Item {
    std::span<std::byte> buf;
    ChunkHeader hdr{};
    uint64_t seq = 0;       // chunk number in the stream
    bool have_hdr = false;  // root: always; elsewhere once the header arrived
    uint64_t nseg = 0;      // payload segments (valid with the header)
    uint64_t first = 0;     // stream-wide number of its first segment (valid with the header)
    std::deque<Op> hdr_recv;
  };
  struct Out {  // one child
    int rank = -1;
    uint64_t hdr_next = 0;  // next chunk whose header to send
    uint64_t hdr_done = 0;  // header sends completed (in order)
    uint64_t seg_next = 0;  // next stream segment to send
    uint64_t seg_done = 0;  // segment sends completed (in order)
    std::deque<Op> hdr_sends, seg_sends;
    std::deque<Op> ack;  // tree: the child's acknowledgement (posted by finish())
    std::byte ack_byte{};
  };

  PointToPoint& p2p;
  const int root;
  const bool chain;
  const PipelineOptions opt;
  const uint64_t seg;
  const size_t window;
  const Links links;
  const int tail;
  const bool is_root;
  std::deque<Item> items;
  uint64_t submitted = 0;    // chunks submitted
  uint64_t next_first = 0;   // stream-wide number of the next chunk's first segment
  uint64_t received = 0;     // stream segments held (a prefix: receives complete in order)
  uint64_t recv_next = 0;    // next stream segment to post a receive for
  std::deque<Op> recvs;
  std::deque<Out> outs;  // (a deque: Out holds requests and never moves)
  Backoff backoff;
  Clock::time_point last_progress = Clock::now();
  std::byte flag_out{1}, flag_in{};

  Impl(PointToPoint& p, int r, BcastAlgorithm shape, const PipelineOptions& o)
      : p2p(p),
        root(r),
        chain(shape != BcastAlgorithm::tree),
        opt(o),
        seg(o.segment != 0 ? o.segment : kDefaultSegment),
        window(std::clamp<uint64_t>(o.window_bytes / seg, 2, 64)),
        links(links_of(shape, broadcast_order(p.placement(), r), p.rank())),
        tail(broadcast_order(p.placement(), r).back()),
        is_root(p.rank() == r) {
    outs.resize(links.children.size());
    for (size_t k = 0; k < outs.size(); ++k) outs[k].rank = links.children[k];
  }

  static int tag(uint64_t s) { return static_cast<int>(s % kSegmentTags); }
  Item& item(uint64_t seq) { return items[static_cast<size_t>(seq - items.front().seq)]; }
  // The item holding stream segment `s` (it is in `items`: segments of handed-back chunks
  // are never asked for).
  Item& item_of_segment(uint64_t s) {
    for (Item& it : items)
      if (s < it.first + it.nseg) return it;
    return items.back();
  }
  std::span<std::byte> piece(Item& it, uint64_t s) const {
    const uint64_t off = (s - it.first) * seg;
    return it.buf.subspan(off, std::min<uint64_t>(seg, payload(it.hdr) - off));
  }
  static uint64_t payload(const ChunkHeader& h) {
    return (h.flags & (kChunkZero | kChunkAbort)) != 0 ? 0 : h.length;
  }
  void place(Item& it) {  // the header is known: where its segments go in the stream
    it.have_hdr = true;
    it.nseg = (payload(it.hdr) + seg - 1) / seg;
    it.first = next_first;
    next_first += it.nseg;
  }
  bool complete(const Item& it) const {
    if (!it.have_hdr || received < it.first + it.nseg) return false;
    for (const Out& o : outs)
      if (o.hdr_done <= it.seq || o.seg_done < it.first + it.nseg) return false;
    return true;
  }

  Status stalled(const std::string& what) const {
    return stage_error(Errc::timed_out, "rank " + std::to_string(p2p.rank()) + ": " +
                                            (chain ? "chain" : "tree") + " broadcast stalled for " +
                                            std::to_string(opt.stall_timeout.count()) + " ms waiting for " + what);
  }
  bool past_stall() const {
    return opt.stall_timeout.count() > 0 && Clock::now() - last_progress > opt.stall_timeout;
  }
  void moved() {
    backoff.reset();
    last_progress = Clock::now();
  }

  Result<bool> step(std::vector<ChunkHeader>& done) {
    bool any = false;
    // Headers arrive in order (one tag, MPI's non-overtaking rule); a header is placed only
    // once every earlier one is, so segment numbers are the same on every rank.
    for (Item& it : items) {
      if (it.have_hdr) continue;
      auto r = poll_in_order(it.hdr_recv, [](uint64_t) {});
      if (!r) return r.error();
      if (!it.hdr_recv.empty()) break;
      const uint32_t known = kChunkZero | kChunkAbort;
      if ((it.hdr.flags & ~known) != 0 || it.hdr.index != it.seq || payload(it.hdr) > it.buf.size())
        return stage_error(Errc::bad_message, "chunk header " + std::to_string(it.seq) + " from rank " +
                                                  std::to_string(links.parent));
      place(it);
      any = true;
    }
    // Receives: up to `window` segments in flight, in stream order.
    while (recv_next < next_first && recvs.size() < window) {
      Item& it = item_of_segment(recv_next);
      auto id = p2p.irecv(piece(it, recv_next), links.parent, tag(recv_next));
      if (!id) return id.error();
      recvs.emplace_back(p2p, *id, recv_next++);
    }
    auto got = poll_in_order(recvs, [&](uint64_t) { ++received; });
    if (!got) return got.error();
    any = any || *got;
    // Sends: each chunk's header, then its segments as they are here, `window` per child.
    for (Out& o : outs) {
      while (o.hdr_next < submitted) {  // (a chunk leaves `items` only after its header went)
        Item& it = item(o.hdr_next);
        if (!it.have_hdr) break;
        auto id = p2p.isend(std::as_bytes(std::span(&it.hdr, 1)), o.rank, kHeaderTag);
        if (!id) return id.error();
        o.hdr_sends.emplace_back(p2p, *id, o.hdr_next++);
        any = true;
      }
      while (o.seg_next < received && o.seg_sends.size() < window) {
        Item& it = item_of_segment(o.seg_next);
        if (it.seq >= o.hdr_next) break;  // its header first
        auto id = p2p.isend(piece(it, o.seg_next), o.rank, tag(o.seg_next));
        if (!id) return id.error();
        o.seg_sends.emplace_back(p2p, *id, o.seg_next++);
        any = true;
      }
      auto h = poll_in_order(o.hdr_sends, [&](uint64_t) { ++o.hdr_done; });
      if (!h) return h.error();
      auto d = poll_in_order(o.seg_sends, [&](uint64_t) { ++o.seg_done; });
      if (!d) return d.error();
      any = any || *h || *d;
    }
    while (!items.empty() && complete(items.front())) {
      done.push_back(items.front().hdr);
      items.pop_front();
      any = true;
    }
    return any;
  }

  std::string waiting_for() const {
    if (!items.empty() && !items.front().have_hdr)
      return "the header of chunk " + std::to_string(items.front().seq) + " from rank " +
             std::to_string(links.parent);
    if (!recvs.empty()) return "data from rank " + std::to_string(links.parent);
    return "its sends to the next rank(s) to complete";
  }
};

ChunkStream::ChunkStream(PointToPoint& p2p, int root, BcastAlgorithm shape, const PipelineOptions& opt)
    : impl_(std::make_unique<Impl>(p2p, root, shape, opt)) {}

ChunkStream::~ChunkStream() = default;

Status ChunkStream::submit(std::span<std::byte> buf, const ChunkHeader& hdr) {
  Impl& s = *impl_;
  Impl::Item& it = s.items.emplace_back();
  it.buf = buf;
  it.seq = s.submitted++;
  if (s.is_root) {
    it.hdr = hdr;
    it.hdr.index = it.seq;
    if (Impl::payload(hdr) != buf.size())
      return stage_error(Errc::bad_message, "chunk " + std::to_string(it.seq) + ": payload and header disagree");
    s.place(it);
    s.received = s.next_first;  // the root holds what it submits
    s.recv_next = s.next_first;
  } else {
    auto id = s.p2p.irecv(std::as_writable_bytes(std::span(&it.hdr, 1)), s.links.parent, kHeaderTag);
    if (!id) return id.error();
    it.hdr_recv.emplace_back(s.p2p, *id, it.seq);
  }
  return {};
}

Result<bool> ChunkStream::progress(std::vector<ChunkHeader>& done) {
  Impl& s = *impl_;
  auto r = s.step(done);
  if (!r) return r;
  if (*r) {
    s.moved();
  } else if (!s.items.empty() && s.past_stall()) {
    return s.stalled(s.waiting_for()).error();
  } else if (s.items.empty()) {
    s.last_progress = Clock::now();  // nothing to wait for (the caller's reader is busy)
  }
  return r;
}

void ChunkStream::idle() { impl_->backoff.wait(); }

size_t ChunkStream::pending() const { return impl_->items.size(); }

Status ChunkStream::finish() {
  Impl& s = *impl_;
  // Chunks announced to this rank but never sent (after an abort): drop their receives.
  while (!s.items.empty() && !s.items.back().have_hdr) s.items.pop_back();
  if (!s.items.empty())
    return stage_error(Errc::bad_message, "broadcast stream finished with " + std::to_string(s.items.size()) +
                                              " chunk(s) in flight");
  const int n = s.p2p.size();
  if (n <= 1) return {};
  std::deque<Op> confirm_recv, confirm_sends, ack_send, release_recv, release_sends;
  auto post_flags = [&](const std::vector<int>& to, int flag_tag, std::deque<Op>& ops) -> Status {
    for (int r : to) {
      auto id = s.p2p.isend(std::span<const std::byte>(&s.flag_out, 1), r, flag_tag);
      if (!id) return id.error();
      ops.emplace_back(s.p2p, *id, 0);
    }
    return {};
  };
  const bool is_tail = s.p2p.rank() == s.tail;
  if (s.chain) {
    if (is_tail) {
      std::vector<int> others;
      for (int r = 0; r < n; ++r)
        if (r != s.tail) others.push_back(r);
      if (auto st = post_flags(others, kAckTag, confirm_sends); !st) return st;
    } else {
      auto id = s.p2p.irecv(std::span(&s.flag_in, 1), s.tail, kAckTag);
      if (!id) return id.error();
      confirm_recv.emplace_back(s.p2p, *id, 0);
    }
  } else {
    for (Impl::Out& o : s.outs) {
      auto id = s.p2p.irecv(std::span(&o.ack_byte, 1), o.rank, kAckTag);
      if (!id) return id.error();
      o.ack.emplace_back(s.p2p, *id, 0);
    }
    if (!s.is_root) {
      auto id = s.p2p.irecv(std::span(&s.flag_in, 1), s.links.parent, kReleaseTag);
      if (!id) return id.error();
      release_recv.emplace_back(s.p2p, *id, 0);
    }
  }
  bool ack_posted = false, release_posted = false;
  s.moved();
  for (;;) {
    bool any = false;
    bool all_acked = true;
    for (Impl::Out& o : s.outs) {
      auto a = poll_in_order(o.ack, [](uint64_t) {});
      if (!a) return a.error();
      any = any || *a;
      all_acked = all_acked && o.ack.empty();
    }
    for (auto* ops : {&confirm_recv, &confirm_sends, &ack_send, &release_recv, &release_sends}) {
      auto d = poll_in_order(*ops, [](uint64_t) {});
      if (!d) return d.error();
      any = any || *d;
    }
    if (s.chain) {
      if (confirm_recv.empty() && confirm_sends.empty()) return {};
    } else {
      if (all_acked && !s.is_root && !ack_posted) {
        if (auto st = post_flags({s.links.parent}, kAckTag, ack_send); !st) return st;
        ack_posted = any = true;
      }
      const bool up_done = all_acked && (s.is_root || (ack_posted && ack_send.empty()));
      if (up_done && release_recv.empty() && !release_posted) {
        if (auto st = post_flags(s.links.children, kReleaseTag, release_sends); !st) return st;
        release_posted = any = true;
      }
      if (release_posted && release_sends.empty()) return {};
    }
    if (any) {
      s.moved();
      continue;
    }
    if (s.past_stall()) {
      const std::string what = s.chain ? (is_tail ? "its confirmations to the other ranks"
                                                  : "the confirmation of the last rank, " + std::to_string(s.tail))
                               : !all_acked ? "the acknowledgement of the rank(s) below"
                               : !ack_posted || !ack_send.empty()
                                   ? "its acknowledgement to rank " + std::to_string(s.links.parent)
                               : !release_recv.empty() ? "the release from rank " + std::to_string(s.links.parent)
                                                       : "its releases to the rank(s) below";
      return s.stalled(what);
    }
    s.backoff.wait();
  }
}

Status pipeline_bcast(PointToPoint& p2p, std::span<std::byte> buf, int root, BcastAlgorithm shape,
                      const PipelineOptions& opt) {
  const int n = p2p.size();
  if (root < 0 || root >= n) return stage_error(Errc::bad_message, "broadcast root " + std::to_string(root));
  if (buf.empty() || n <= 1) return {};
  ChunkStream stream(p2p, root, shape, opt);
  if (auto st = stream.submit(buf, ChunkHeader{0, buf.size(), 0, 0, 0}); !st) return st;
  std::vector<ChunkHeader> done;
  while (done.empty()) {
    auto r = stream.progress(done);
    if (!r) return r.error();
    if (!*r) stream.idle();
  }
  if (done.front().length != buf.size())
    return stage_error(Errc::bad_message, "broadcast of " + std::to_string(buf.size()) + " bytes: the root sent " +
                                              std::to_string(done.front().length));
  return stream.finish();
}

Status data_bcast(Comm& comm, std::span<std::byte> buf, int root, BcastAlgorithm algo,
                  const PipelineOptions& opt) {
  const BcastAlgorithm a = resolve(algo, comm, buf.size());
  if (a == BcastAlgorithm::mpi) return comm.bcast(buf, root);
  return pipeline_bcast(*comm.point_to_point(), buf, root, a, opt);
}

}  // namespace stage
