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
static_assert(kReleaseTag <= PointToPoint::kMaxTag);

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

struct Child {
  int rank = -1;
  uint64_t next = 0;  // next segment to send
  uint64_t sent = 0;  // sends completed
  std::deque<Op> sends;
  std::deque<Op> ack;  // the acknowledgement receive (one, until it completes)
  std::byte ack_byte{};
};

}  // namespace

Status pipeline_bcast(PointToPoint& p2p, std::span<std::byte> buf, int root, BcastAlgorithm shape,
                      const PipelineOptions& opt) {
  const int n = p2p.size();
  if (root < 0 || root >= n) return stage_error(Errc::bad_message, "broadcast root " + std::to_string(root));
  if (buf.empty() || n <= 1) return {};
  const std::vector<int> order = broadcast_order(p2p.placement(), root);
  const Links links = links_of(shape, order, p2p.rank());
  const bool is_root = p2p.rank() == root;
  const uint64_t seg = opt.segment != 0 ? opt.segment : segment_for(buf.size());
  const uint64_t nseg = (buf.size() + seg - 1) / seg;
  const size_t window = std::clamp<uint64_t>(opt.window_bytes / seg, 2, 64);
  auto piece = [&](uint64_t s) {
    const uint64_t off = s * seg;
    return buf.subspan(off, std::min<uint64_t>(seg, buf.size() - off));
  };
  auto tag = [](uint64_t s) { return static_cast<int>(s % kSegmentTags); };

  std::vector<char> have(nseg, is_root ? 1 : 0);
  uint64_t next_recv = is_root ? nseg : 0;  // next segment to post a receive for
  uint64_t received = is_root ? nseg : 0;
  std::deque<Op> recvs;
  std::vector<Child> kids(links.children.size());
  for (size_t k = 0; k < kids.size(); ++k) kids[k].rank = links.children[k];

  // Completion, so that a rank returns OK only once every rank holds the buffer and a lost
  // link fails every rank (within one stall timeout) instead of leaving some in a later call:
  //   chain: the last rank tells every other rank directly that it has everything (the data
  //          passed through each rank on its way there): one hop of latency, not N-1;
  //   tree:  acknowledgements climb to the root (each rank's subtree is complete), then the
  //          root's release descends: 2 x log2(N) hops.
  const bool chain = shape != BcastAlgorithm::tree;
  const int tail = order.back();
  const bool is_tail = p2p.rank() == tail;
  std::byte flag_out{1}, flag_in{};
  std::deque<Op> confirm_recv, confirm_sends;            // chain: from / by the last rank
  std::deque<Op> ack_send, release_recv, release_sends;  // tree
  if (chain && !is_tail) {
    auto id = p2p.irecv(std::span(&flag_in, 1), tail, kAckTag);
    if (!id) return id.error();
    confirm_recv.emplace_back(p2p, *id, 0);
  }
  if (!chain) {
    for (Child& c : kids) {
      auto id = p2p.irecv(std::span(&c.ack_byte, 1), c.rank, kAckTag);
      if (!id) return id.error();
      c.ack.emplace_back(p2p, *id, 0);
    }
    if (!is_root) {
      auto id = p2p.irecv(std::span(&flag_in, 1), links.parent, kReleaseTag);
      if (!id) return id.error();
      release_recv.emplace_back(p2p, *id, 0);
    }
  }
  bool confirm_posted = false, ack_posted = false, release_posted = false;
  // Posts a 1-byte flag to each of `to`, into `ops`.
  auto post_flags = [&](const std::vector<int>& to, int flag_tag, std::deque<Op>& ops) -> Status {
    for (int r : to) {
      auto id = p2p.isend(std::span<const std::byte>(&flag_out, 1), r, flag_tag);
      if (!id) return id.error();
      ops.emplace_back(p2p, *id, 0);
    }
    return {};
  };

  Backoff backoff;
  auto last_progress = Clock::now();
  for (;;) {
    bool progress = false;
    while (next_recv < nseg && recvs.size() < window) {
      auto id = p2p.irecv(piece(next_recv), links.parent, tag(next_recv));
      if (!id) return id.error();
      recvs.emplace_back(p2p, *id, next_recv++);
    }
    auto got = poll_in_order(recvs, [&](uint64_t s) {
      have[s] = 1;
      ++received;
    });
    if (!got) return got.error();
    progress = progress || *got;
    bool all_sent = true;
    bool all_acked = true;
    for (Child& c : kids) {
      while (c.next < nseg && have[c.next] != 0 && c.sends.size() < window) {
        auto id = p2p.isend(piece(c.next), c.rank, tag(c.next));
        if (!id) return id.error();
        c.sends.emplace_back(p2p, *id, c.next++);
        progress = true;
      }
      auto sent = poll_in_order(c.sends, [&](uint64_t) { ++c.sent; });
      if (!sent) return sent.error();
      progress = progress || *sent;
      auto acked = poll_in_order(c.ack, [](uint64_t) {});
      if (!acked) return acked.error();
      progress = progress || *acked;
      all_sent = all_sent && c.sent == nseg;
      all_acked = all_acked && c.ack.empty();
    }
    const bool local_done = received == nseg && all_sent && all_acked;
    if (chain && is_tail && local_done && !confirm_posted) {
      std::vector<int> others;
      for (int r = 0; r < n; ++r)
        if (r != tail) others.push_back(r);
      if (auto st = post_flags(others, kAckTag, confirm_sends); !st) return st;
      confirm_posted = progress = true;
    }
    if (!chain && local_done && !is_root && !ack_posted) {
      if (auto st = post_flags({links.parent}, kAckTag, ack_send); !st) return st;
      ack_posted = progress = true;
    }
    for (auto* ops : {&confirm_recv, &confirm_sends, &ack_send, &release_recv, &release_sends}) {
      auto done = poll_in_order(*ops, [](uint64_t) {});
      if (!done) return done.error();
      progress = progress || *done;
    }
    const bool confirmed = is_tail ? confirm_posted && confirm_sends.empty() : confirm_recv.empty();
    if (chain && local_done && confirmed) return {};
    const bool up_done = local_done && (is_root || (ack_posted && ack_send.empty()));
    const bool released = is_root || release_recv.empty();
    if (!chain && up_done && released && !release_posted) {
      if (auto st = post_flags(links.children, kReleaseTag, release_sends); !st) return st;
      release_posted = progress = true;
    }
    if (release_posted && release_sends.empty()) return {};
    if (progress) {
      backoff.reset();
      last_progress = Clock::now();
      continue;
    }
    if (opt.stall_timeout.count() > 0 && Clock::now() - last_progress > opt.stall_timeout) {
      const std::string what = received < nseg    ? "data from rank " + std::to_string(links.parent)
                               : !all_sent        ? "its sends to the next rank(s) to complete"
                               : chain && is_tail ? "its confirmations to the other ranks"
                               : chain      ? "the confirmation of the last rank, " + std::to_string(tail)
                               : !all_acked ? "the acknowledgement of the rank(s) below"
                               : !up_done   ? "its acknowledgement to rank " + std::to_string(links.parent)
                               : !released  ? "the release from rank " + std::to_string(links.parent)
                                            : "its releases to the rank(s) below";
      return stage_error(Errc::timed_out, "rank " + std::to_string(p2p.rank()) + ": " + to_string(shape) +
                                              " broadcast stalled for " +
                                              std::to_string(opt.stall_timeout.count()) + " ms waiting for " +
                                              what);
    }
    backoff.wait();
  }
}

Status data_bcast(Comm& comm, std::span<std::byte> buf, int root, BcastAlgorithm algo,
                  const PipelineOptions& opt) {
  const BcastAlgorithm a = resolve(algo, comm, buf.size());
  if (a == BcastAlgorithm::mpi) return comm.bcast(buf, root);
  return pipeline_bcast(*comm.point_to_point(), buf, root, a, opt);
}

}  // namespace stage
