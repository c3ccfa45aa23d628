#include "bcast/transfer/pipeline.h"

#include <algorithm>
#include <ctime>
#include <deque>
#include <mutex>
#include <set>
#include <utility>

#include "bcast/io/chunk.h"

namespace stage {

// Named rather than anonymous: ChunkStream::Impl, a member of an exported class, holds these
// types (GCC's -Wsubobject-linkage, which fires once this file is part of a unity build).
namespace pipeline_detail {

using Clock = std::chrono::steady_clock;

constexpr int kSegmentTags = 16384;            // data tags: segment index modulo this
constexpr int kReleaseTag = kSegmentTags + 2;  // tree: "every subtree has it"
constexpr int kHeaderTag = kSegmentTags + 3;   // a chunk's header
constexpr int kCreditTag = kSegmentTags + 4;   // child -> parent: chunks handed back
constexpr int kSubtreeTag = kSegmentTags + 5;  // child -> parent: chunks its whole subtree holds
constexpr int kWantTag = kSegmentTags + 6;     // child -> parent: a chunk readers below wait for
static_assert(kWantTag <= PointToPoint::kMaxTag);

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

}  // namespace pipeline_detail
using namespace pipeline_detail;

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
    bool dropped = false;   // after an abort: its header receive was cancelled (finish())
    std::deque<Op> hdr_recv;
  };
  struct Out {  // one child
    int rank = -1;
    uint64_t hdr_next = 0;  // next chunk whose header to send
    uint64_t hdr_done = 0;  // header sends completed (in order)
    uint64_t seg_next = 0;  // next stream segment to send
    uint64_t seg_done = 0;  // segment sends completed (in order)
    std::deque<Op> hdr_sends, seg_sends;
    uint64_t credit = 0;                     // chunks the child has handed back (flow control)
    uint64_t subtree = 0;                    // chunks the child's whole subtree holds (progress, completion)
    uint64_t credit_in = 0, subtree_in = 0;  // receive buffers
    std::deque<Op> credit_recv, subtree_recv;  // one receive of each posted at a time
  };
  // A parent sends a child the segments of chunk k only once the child has handed back chunk
  // k - kCreditChunks: at most this many chunks per link are in flight or waiting at the
  // child, so a slow node never has the rest of the stream piled up in its MPI library's
  // unexpected-message queue (eager sends complete without the receiver).
  static constexpr uint64_t kCreditChunks = 4;

  PointToPoint& p2p;
  const int root;
  const bool chain;
  const PipelineOptions opt;
  const uint64_t seg;
  const size_t window;
  const Links links;
  const bool is_root;
  std::deque<Item> items;
  uint64_t submitted = 0;   // chunks submitted
  uint64_t next_first = 0;  // stream-wide number of the next chunk's first segment
  uint64_t received = 0;    // stream segments held (a prefix: receives complete in order)
  uint64_t recv_next = 0;   // next stream segment to post a receive for
  std::deque<Op> recvs;
  std::deque<Out> outs;  // (a deque: Out holds requests and never moves)
  Backoff backoff;
  Clock::time_point last_progress = Clock::now();
  std::byte flag_out{1}, flag_in{};
  bool failed = false;           // a call returned an error: see ~ChunkStream
  uint64_t handed = 0;           // chunks handed back on this rank
  uint64_t credit_sent = 0;      // the last "handed back" value sent to the parent
  uint64_t subtree_sent = 0;     // the last "my subtree holds" value sent to the parent
  std::deque<uint64_t> up_vals;  // the values of the messages to the parent in flight
  std::deque<Op> up_sends;
  // Wants (chunks readers wait for), passed up hop by hop to the root: each rank forwards a
  // chunk index at most once per stream, so a link carries at most one want per chunk.
  std::set<uint64_t> wanted;       // asked for here or below (forwarded, or at the root queued)
  std::deque<uint64_t> wants_out;  // to send to the parent
  std::deque<uint64_t> want_vals;  // values of the want sends in flight
  std::deque<Op> want_sends;
  std::deque<uint64_t> wants_at_root;  // root: for the caller (take_want)
  std::deque<uint64_t> want_in;        // receive buffers, one per child
  std::deque<std::deque<Op>> want_recv;

  void want(uint64_t index) {
    if (!wanted.insert(index).second) return;
    (is_root ? wants_at_root : wants_out).push_back(index);
  }

  // Cancels and releases every request of the stream (their buffers stay where they are).
  void drop_requests() {
    for (Item& it : items) it.hdr_recv.clear();
    recvs.clear();
    for (Out& o : outs) {
      o.hdr_sends.clear();
      o.seg_sends.clear();
      o.credit_recv.clear();
      o.subtree_recv.clear();
    }
    up_sends.clear();
    want_sends.clear();
    for (auto& r : want_recv) r.clear();
  }

  Impl(PointToPoint& p, int r, BcastAlgorithm shape, const PipelineOptions& o)
      : p2p(p),
        root(r),
        chain(shape != BcastAlgorithm::tree),
        opt(o),
        seg(o.segment != 0 ? o.segment : kDefaultSegment),
        window(std::clamp<uint64_t>(o.window_bytes / seg, 2, 64)),
        links(links_of(shape, broadcast_order(p.placement(), r), p.rank())),
        is_root(p.rank() == r) {
    outs.resize(links.children.size());
    for (size_t k = 0; k < outs.size(); ++k) outs[k].rank = links.children[k];
    want_in.resize(outs.size());
    want_recv.resize(outs.size());
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

  // "rank R (HOST)": messages name the node a rank runs on, where the placement knows it.
  std::string who(int r) const {
    const auto& where = p2p.placement();
    const bool known =
        r >= 0 && static_cast<size_t>(r) < where.size() && !where[static_cast<size_t>(r)].empty();
    return "rank " + std::to_string(r) + (known ? " (" + where[static_cast<size_t>(r)] + ")" : std::string());
  }

  Status stalled(const std::string& what) const {
    return stage_error(Errc::timed_out,
                       who(p2p.rank()) + ": " + (chain ? "chain" : "tree") + " broadcast stalled for " +
                           std::to_string(opt.stall_timeout.count()) + " ms waiting for " + what);
  }
  bool past_stall() const {
    return opt.stall_timeout.count() > 0 && Clock::now() - last_progress > opt.stall_timeout;
  }
  void moved() {
    backoff.reset();
    last_progress = Clock::now();
  }

  // One round of the stream on this rank: headers in, receives, sends to the children, wants,
  // chunks handed back, counts to the parent. Whether anything moved.
  Result<bool> step(std::vector<ChunkHeader>& done) {
    auto h = step_headers();
    if (!h) return h.error();
    auto r = step_receives();
    if (!r) return r.error();
    bool any = *h || *r;
    for (Out& o : outs) {
      auto s = step_child(o);
      if (!s) return s.error();
      any = any || *s;
    }
    if (auto w = step_wants(); !w)
      return w.error();
    else
      any = any || *w;
    while (!items.empty() && complete(items.front())) {
      done.push_back(items.front().hdr);
      items.pop_front();
      ++handed;
      any = true;
    }
    if (is_root) return any;
    auto u = step_up();
    if (!u) return u.error();
    return any || *u;
  }

  // Headers arrive in order (one tag, MPI's non-overtaking rule); a header is placed only
  // once every earlier one is, so segment numbers are the same on every rank.
  Result<bool> step_headers() {
    bool any = false;
    for (Item& it : items) {
      if (it.have_hdr) continue;
      if (it.dropped) break;
      auto r = poll_in_order(it.hdr_recv, [](uint64_t) {});
      if (!r) return r.error();
      if (!it.hdr_recv.empty()) break;
      const uint32_t known = kChunkZero | kChunkAbort | kChunkNest;
      if ((it.hdr.flags & ~known) != 0 || payload(it.hdr) > it.buf.size())
        return stage_error(Errc::bad_message, "chunk header " + std::to_string(it.seq) + " from rank " +
                                                  std::to_string(links.parent));
      place(it);
      any = true;
    }
    return any;
  }

  // Receives: up to `window` segments in flight, in stream order.
  Result<bool> step_receives() {
    while (recv_next < next_first && recvs.size() < window) {
      Item& it = item_of_segment(recv_next);
      auto id = p2p.irecv(piece(it, recv_next), links.parent, tag(recv_next));
      if (!id) return id.error();
      recvs.emplace_back(p2p, *id, recv_next++);
    }
    return poll_in_order(recvs, [&](uint64_t) { ++received; });
  }

  // Sends to one child: each chunk's header, then its segments as they are here, `window` at
  // a time; and the child's counts: one receive of each kind posted while more can come.
  Result<bool> step_child(Out& o) {
    bool any = false;
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
      if (it.seq >= o.hdr_next) break;                // its header first
      if (it.seq >= o.credit + kCreditChunks) break;  // the child is that far behind
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
    for (auto [ops, in, count] : {std::tuple{&o.credit_recv, &o.credit_in, &o.credit},
                                  std::tuple{&o.subtree_recv, &o.subtree_in, &o.subtree}}) {
      auto got_count = poll_in_order(*ops, [&](uint64_t) { *count = std::max(*count, *in); });
      if (!got_count) return got_count.error();
      any = any || *got_count;
      if (ops->empty() && *count < submitted) {
        auto id = p2p.irecv(std::as_writable_bytes(std::span(in, 1)), o.rank,
                            ops == &o.credit_recv ? kCreditTag : kSubtreeTag);
        if (!id) return id.error();
        ops->emplace_back(p2p, *id, 0);
      }
    }
    return any;
  }

  // Tell the parent: chunks handed back here (its credit), chunks this whole subtree holds.
  Result<bool> step_up() {
    bool any = false;
    uint64_t sub = handed;
    for (const Out& o : outs) sub = std::min(sub, o.subtree);
    for (auto [tag, value, sent] :
         {std::tuple{kCreditTag, handed, &credit_sent}, std::tuple{kSubtreeTag, sub, &subtree_sent}}) {
      if (value <= *sent) continue;
      up_vals.push_back(value);
      auto id = p2p.isend(std::as_bytes(std::span(&up_vals.back(), 1)), links.parent, tag);
      if (!id) return id.error();
      up_sends.emplace_back(p2p, *id, 0);
      *sent = value;
      any = true;
    }
    auto u = poll_in_order(up_sends, [&](uint64_t) { up_vals.pop_front(); });
    if (!u) return u.error();
    return any || *u;
  }

  // Wants from the children (one receive posted per child at all times) and to the parent.
  // Not counted as progress of the stream: a want moves no data.
  Result<bool> step_wants() {
    for (size_t k = 0; k < outs.size(); ++k) {
      for (;;) {
        if (want_recv[k].empty()) {
          auto id = p2p.irecv(std::as_writable_bytes(std::span(&want_in[k], 1)), outs[k].rank, kWantTag);
          if (!id) return id.error();
          want_recv[k].emplace_back(p2p, *id, 0);
        }
        bool got = false;
        auto r = poll_in_order(want_recv[k], [&](uint64_t) { got = true; });
        if (!r) return r.error();
        if (!got) break;
        want(want_in[k]);
      }
    }
    if (is_root) return false;
    while (!wants_out.empty()) {
      want_vals.push_back(wants_out.front());
      wants_out.pop_front();
      auto id = p2p.isend(std::as_bytes(std::span(&want_vals.back(), 1)), links.parent, kWantTag);
      if (!id) return id.error();
      want_sends.emplace_back(p2p, *id, 0);
    }
    auto u = poll_in_order(want_sends, [&](uint64_t) { want_vals.pop_front(); });
    if (!u) return u.error();
    return false;
  }

  std::string waiting_for() const {
    for (const Out& o : outs)
      if (!items.empty() && items.front().seq >= o.credit + kCreditChunks)
        return who(o.rank) + " to take chunk " + std::to_string(o.credit);
    if (!items.empty() && !items.front().have_hdr)
      return "the header of chunk " + std::to_string(items.front().seq) + " from " + who(links.parent);
    if (!recvs.empty()) return "data from " + who(links.parent);
    return "its sends to the next rank(s) to complete";
  }

  // finish(): chunks this rank was ready for but that never came (after an abort): their
  // header receives are cancelled; the items stay (a cancelled receive's buffer is never
  // freed, see ~ChunkStream) but no longer count. An error if a chunk is still in flight.
  Status drop_unreceived() {
    size_t live = 0;
    for (Item& it : items) {
      if (it.have_hdr) {
        ++live;
        continue;
      }
      if (!it.dropped) {
        it.hdr_recv.clear();
        it.dropped = true;
        --submitted;
      }
    }
    if (live == 0) return {};
    return stage_error(Errc::bad_message,
                       "broadcast stream finished with " + std::to_string(live) + " chunk(s) in flight");
  }

  // finish()'s completion: every child's subtree holds every chunk (its "subtree" count,
  // which also moves while a slow rank far below catches up, so a healthy but slow node never
  // looks like a stall), and this rank's own counts reached its parent. In the chain that is
  // the end: the ranks above a rank held the data before passing it on. In the tree the root
  // then releases its subtrees, so each rank also knows the other branches hold it.
  Status await_completion() {
    std::deque<Op> release_recv, release_sends;
    if (!chain && !is_root) {
      auto id = p2p.irecv(std::span(&flag_in, 1), links.parent, kReleaseTag);
      if (!id) return id.error();
      release_recv.emplace_back(p2p, *id, 0);
    }
    bool release_posted = false;
    moved();
    std::vector<ChunkHeader> none;
    for (;;) {
      auto r = step(none);
      if (!r) return r.error();
      bool any = *r;
      for (auto* ops : {&release_recv, &release_sends}) {
        auto d = poll_in_order(*ops, [](uint64_t) {});
        if (!d) return d.error();
        any = any || *d;
      }
      bool below = true;
      for (const Out& o : outs) below = below && o.subtree >= handed;
      // (want sends complete too: eager 8-byte messages, never cancelled on a healthy stream)
      const bool up = is_root || (subtree_sent >= handed && up_sends.empty() && want_sends.empty());
      if (below && up) {
        if (chain) break;
        if (release_recv.empty() && !release_posted) {
          if (auto st = post_releases(release_sends); !st) return st;
          release_posted = any = true;
        }
        if (release_posted && release_sends.empty()) break;
      }
      if (any) {
        moved();
        continue;
      }
      if (past_stall()) return stalled(completion_waits_for(up));
      backoff.wait();
    }
    return {};
  }

  Status post_releases(std::deque<Op>& sends) {
    for (int c : links.children) {
      auto id = p2p.isend(std::span<const std::byte>(&flag_out, 1), c, kReleaseTag);
      if (!id) return id.error();
      sends.emplace_back(p2p, *id, 0);
    }
    return {};
  }

  std::string completion_waits_for(bool up) const {
    for (const Out& o : outs)
      if (o.subtree < handed) return who(o.rank) + "'s subtree to hold chunk " + std::to_string(o.subtree);
    return !up ? "its counts to reach " + who(links.parent) : "the release from " + who(links.parent);
  }
};

ChunkStream::ChunkStream(PointToPoint& p2p, int root, BcastAlgorithm shape, const PipelineOptions& opt)
    : impl_(std::make_unique<Impl>(p2p, root, shape, opt)) {}

// A request the MPI library could not cancel (a send already under way, a receive already
// matched) is still completed by it after MPI_Request_free, into or from its buffer. So after
// a failure, or with chunks still in flight, the stream's own buffers (headers, flags) are
// left allocated: a few bytes per chunk, once per failed transfer. The chunk buffers are the
// caller's to keep alive the same way (Transfer::stream_chunks does).
ChunkStream::~ChunkStream() {
  if (impl_ && (impl_->failed || !impl_->items.empty() || !impl_->want_sends.empty())) {
    impl_->drop_requests();
    quarantine(std::shared_ptr<void>(std::move(impl_)));
  }
}

void quarantine(std::shared_ptr<void> memory) {
  static std::mutex m;
  static std::vector<std::shared_ptr<void>>* kept =
      new std::vector<std::shared_ptr<void>>;  // never destroyed
  const std::lock_guard lock(m);
  kept->push_back(std::move(memory));
}

Status ChunkStream::submit(std::span<std::byte> buf, const ChunkHeader& hdr) {
  auto st = submit_one(buf, hdr);
  if (!st) impl_->failed = true;
  return st;
}

Status ChunkStream::submit_one(std::span<std::byte> buf, const ChunkHeader& hdr) {
  Impl& s = *impl_;
  Impl::Item& it = s.items.emplace_back();
  it.buf = buf;
  it.seq = s.submitted++;
  if (s.is_root) {
    it.hdr = hdr;  // its index is the caller's (chunks may travel in any order)
    if (Impl::payload(hdr) != buf.size())
      return stage_error(Errc::bad_message,
                         "chunk " + std::to_string(it.seq) + ": payload and header disagree");
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
  if (!r) {
    s.failed = true;
    return r;
  }
  if (*r) {
    s.moved();
  } else if (!s.items.empty() && s.past_stall()) {
    s.failed = true;
    return s.stalled(s.waiting_for()).error();
  } else if (s.items.empty()) {
    s.last_progress = Clock::now();  // nothing to wait for (the caller's reader is busy)
  }
  return r;
}

void ChunkStream::idle() {
  impl_->backoff.wait();
}

void ChunkStream::resumed() {
  impl_->moved();
}

void ChunkStream::want(uint64_t index) {
  impl_->want(index);
}

std::optional<uint64_t> ChunkStream::take_want() {
  Impl& s = *impl_;
  if (s.wants_at_root.empty()) return std::nullopt;
  const uint64_t i = s.wants_at_root.front();
  s.wants_at_root.pop_front();
  return i;
}

size_t ChunkStream::pending() const {
  return impl_->items.size();
}

Status ChunkStream::finish() {
  auto st = finish_round();
  if (!st) impl_->failed = true;
  return st;
}

Status ChunkStream::finish_round() {
  Impl& s = *impl_;
  if (auto st = s.drop_unreceived(); !st) return st;
  if (s.p2p.size() <= 1) return {};
  if (auto st = s.await_completion(); !st) return st;
  // The receives for counts that will not come (after an abort) are dropped here; none is
  // pending otherwise.
  for (Impl::Out& o : s.outs) {
    o.credit_recv.clear();
    o.subtree_recv.clear();
  }
  for (auto& r : s.want_recv) r.clear();  // wants that come later are for nothing now
  return {};
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
    return stage_error(Errc::bad_message, "broadcast of " + std::to_string(buf.size()) +
                                              " bytes: the root sent " + std::to_string(done.front().length));
  return stream.finish();
}

Status data_bcast(Comm& comm, std::span<std::byte> buf, int root, BcastAlgorithm algo,
                  const PipelineOptions& opt) {
  const BcastAlgorithm a = resolve(algo, comm, buf.size());
  if (a == BcastAlgorithm::mpi) return comm.bcast(buf, root);
  return pipeline_bcast(*comm.point_to_point(), buf, root, a, opt);
}

}  // namespace stage
