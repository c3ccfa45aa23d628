// The coordinator's decisions with N in-process ranks and no MPI: a simulated group delivers
// requests (FIFO per rank, as MPI point-to-point between two ranks) and announcements (the
// same sequence to every rank, each rank at its own pace, at most one outstanding) in random
// interleavings, and checks the group's promises against a reference model (a plain, slow
// restatement of the rules, as mountpoint-s3's reftests):
//   - every wait (a node's first open of a path) is answered exactly once: by a transfer of
//     its path announced after the node sent it, or by the shutdown;
//   - every transfer announcement answers at least one wait (no transfer twice for one need);
//   - every rank sees the same announcements in the same order, ids increasing;
//   - a shutdown goes before any further transfer and is the last announcement;
//   - walks (prefetch of sibling directories): a prefetched batch is announced only when no
//     request waits, never for a key announced before, and a request for it moves it ahead;
//   - turns between users by cost: the next request is the first of the uid with the lowest
//     tally of what its transfers cost (ties: the uid served longest ago), a uid that asks
//     again starts at the tally of the uid served last.
//   - background requests (a replay, stagectl prefetch) are announced only when no request
//     waits (a file as file_prefetch), and an open's request for one moves it ahead;
//   - nesting: in a transfer of one file only a batch nests; in a background one (file_prefetch)
//     the next request nests, a batch or a file; one nested transfer at a time.
// Keys: a node waits per (materialize, file) or (batch, directory): an open of a small file
// waits for its directory's batch, so small files of one directory merge into one
// batch transfer, and a batch never answers a wait for a large file of the same directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fusefs/control.h"
#include "fusefs/coordinator.h"

namespace stagefs {
namespace {

Message req(const std::string& path, uint64_t seen, MsgType type = MsgType::materialize, uint32_t uid = 0,
            uint8_t flags = 0) {
  return Message{type, seen, path, uid, flags};
}
// The key a node waits on for a small file: its directory's batch.
std::string dir_of(const std::string& file) {
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? std::string() : file.substr(0, slash);
}
Message shutdown_req() {
  return Message{MsgType::shutdown, 0, {}};
}

// The reference: the rules restated with linear scans over the whole history.
class ReferenceCoordinator {
 public:
  ReferenceCoordinator(bool nesting, bool walks) : nesting_(nesting), walks_(walks) {}
  void on_request(const Message& m) {
    if (m.type != MsgType::materialize && m.type != MsgType::batch && m.type != MsgType::shutdown) return;
    if (std::ranges::any_of(queue_, [](const Message& q) { return q.type == MsgType::shutdown; }) || done_)
      return;
    if (m.type == MsgType::shutdown) {
      queue_.insert(queue_.begin(), m);
      later_.clear();
      return;
    }
    const bool background = (m.flags & kBackground) != 0;
    if (m.type == MsgType::batch && walks_ && !m.path.empty() && !background) {
      auto& kids = children_[dir_of(m.path)];
      if (kids.insert(m.path).second && kids.size() == 2) new_walks_.push_back(dir_of(m.path));
    }
    for (auto it = history_.rbegin(); it != history_.rend(); ++it)
      if (key_type(it->type) == m.type && it->path == m.path) {
        if (m.id < it->id) return;  // its node will see *it
        break;
      }
    if (std::ranges::any_of(queue_, [&](const Message& q) { return q.type == m.type && q.path == m.path; }))
      return;
    auto in_later = [&](const Later& l) { return l.type == m.type && l.path == m.path; };
    if (background) {
      if (std::ranges::none_of(later_, in_later)) later_.push_back(Later{m.type, m.path, false, m.uid});
      return;
    }
    std::erase_if(later_, in_later);
    if (std::ranges::none_of(queue_, [&](const Message& q) { return q.uid == m.uid; })) {
      tally_[m.uid] = std::max(tally_[m.uid], served_);  // nothing banked while idle
      stamp_[m.uid] = ++clock_;
    }
    queue_.push_back(m);
  }
  // What announcement a cost: its uid's tally grows (not a prefetch's).
  void charge(const Message& a, uint64_t cost) {
    if (auto it = charge_to_.find(a.id); it != charge_to_.end()) tally_[it->second] += cost;
  }
  std::vector<std::string> take_walks() { return std::exchange(new_walks_, {}); }
  void prefetch(const std::string& dir) {
    if (done_ || std::ranges::any_of(queue_, [](const Message& q) { return q.type == MsgType::shutdown; }))
      return;
    if (std::ranges::any_of(
            history_,
            [&](const Message& h) { return key_type(h.type) == MsgType::batch && h.path == dir; }) ||
        std::ranges::any_of(queue_,
                            [&](const Message& q) { return q.type == MsgType::batch && q.path == dir; }) ||
        std::ranges::any_of(later_,
                            [&](const Later& l) { return l.type == MsgType::batch && l.path == dir; }))
      return;
    later_.push_back(Later{MsgType::batch, dir, true});
  }
  // Whether the last announcement came from the background queue (a walk's prefetch() or a
  // background request), and from a walk (it answers no wait).
  [[nodiscard]] bool last_prefetched() const { return last_prefetched_; }
  [[nodiscard]] bool last_walk() const { return last_walk_; }
  std::optional<Message> next() {
    last_prefetched_ = last_walk_ = false;
    if (outstanding_ || done_) return std::nullopt;
    if (queue_.empty() && !later_.empty() && !running_) {
      const Later l = later_.front();
      Message m{l.type == MsgType::batch ? MsgType::batch_prefetch : MsgType::file_prefetch,
                history_.size() + 1, l.path, l.uid};
      later_.erase(later_.begin());
      history_.push_back(m);
      outstanding_ = true;
      last_prefetched_ = true;
      last_walk_ = l.walk;
      return m;
    }
    if (queue_.empty()) return std::nullopt;
    auto pick = queue_.begin();
    if (running_) {  // nested in a single file's transfer, one at a time: a batch, or anything
                     // in a background one
      const bool background = running_->type == MsgType::file_prefetch;
      if (!nesting_ || (running_->type != MsgType::materialize && !background) || nested_open_ ||
          queue_.front().type == MsgType::shutdown)
        return std::nullopt;
      pick = fair_pick(/*batch_only=*/!background);
      if (pick == queue_.end()) return std::nullopt;
    } else if (queue_.front().type != MsgType::shutdown) {
      pick = fair_pick(false);
    }
    Message m = *pick;
    queue_.erase(pick);
    m.id = history_.size() + 1;
    if (m.type != MsgType::shutdown) {
      served_ = tally_[m.uid];
      stamp_[m.uid] = ++clock_;
      charge_to_[m.id] = m.uid;
    }
    if (running_) {
      m.type = m.type == MsgType::batch ? MsgType::batch_nested : MsgType::file_nested;
      nested_open_ = true;
    }
    if (m.type == MsgType::shutdown) {
      done_ = true;
      queue_.clear();
    }
    history_.push_back(m);
    outstanding_ = true;
    return m;
  }
  void announced() { outstanding_ = false; }
  size_t drop_prefetches() {
    return std::erase_if(later_, [](const Later& l) { return l.walk; });
  }
  void started(const Message& m) {
    if (!is_nested(m.type)) running_ = m;
  }
  void finished(const Message& m) {
    if (is_nested(m.type))
      nested_open_ = false;
    else
      running_.reset();
  }
  static MsgType key_type(MsgType t) { return stagefs::key_type(t); }

 private:
  // The first request (with batch_only: batch) of the uid with the lowest (tally, stamp)
  // among those that have one queued.
  std::vector<Message>::iterator fair_pick(bool batch_only) {
    auto best = queue_.end();
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (batch_only && it->type != MsgType::batch) continue;
      if (best == queue_.end() ||
          std::pair(tally_[it->uid], stamp_[it->uid]) < std::pair(tally_[best->uid], stamp_[best->uid]))
        best = it;
    }
    return best;
  }
  std::map<uint32_t, uint64_t> tally_, stamp_;
  std::map<uint64_t, uint32_t> charge_to_;
  uint64_t served_ = 0, clock_ = 0;
  // The background queue: a walk's prefetched batch, or a background request.
  struct Later {
    MsgType type;
    std::string path;
    bool walk;
    uint32_t uid = 0;  // a background request's: the first asker's (a walk's: none)
  };
  bool nesting_;
  bool walks_;
  std::map<std::string, std::set<std::string>> children_;
  std::vector<std::string> new_walks_;
  std::vector<Later> later_;
  bool last_prefetched_ = false, last_walk_ = false;
  std::optional<Message> running_;
  bool nested_open_ = false;
  std::vector<Message> queue_;
  std::vector<Message> history_;
  bool outstanding_ = false;
  bool done_ = false;
};

// One simulated node: its waits and how far it has read the announcements.
struct SimRank {
  uint64_t last_seen = 0;
  // (type, path) -> id it had seen when it sent the request
  std::map<std::pair<MsgType, std::string>, uint64_t> waiting;
  std::set<std::pair<MsgType, std::string>> background;  // waits no open has joined yet
  std::deque<Message> in_flight;                         // requests not yet received by the coordinator
  size_t delivered = 0;                                  // announcements processed
  bool stopped = false;
  bool shutdown_sent = false;
  uint64_t waits = 0, answered = 0, failed = 0;
};

// Rank 0 (the coordinator's node) runs each announcement from its delivery until finish0():
// a nested batch may be delivered and run while a transfer runs (nesting on), nothing else;
// a nested batch delivered after its transfer ended (its mark never came) runs alone.
class Group {
 public:
  // subdirs: what a walk of each parent lists (walks on when not empty).
  explicit Group(int n, bool nesting = false, std::map<std::string, std::vector<std::string>> subdirs = {})
      : ref_(nesting, !subdirs.empty()), ranks_(static_cast<size_t>(n)), subdirs_(std::move(subdirs)) {
    coord_.set_nesting(nesting);
    coord_.set_walks(!subdirs_.empty());
  }

  // background: a wait no open asked for (a replay, stagectl prefetch). An open that joins a
  // background wait of its node asks again as an open (GroupService::wait_for).
  void open(int r, const std::string& path, MsgType type = MsgType::materialize, uint32_t uid = 0,
            bool background = false) {
    auto& k = rank(r);
    const std::pair key{type, path};
    if (k.stopped || k.shutdown_sent) return;
    if (k.waiting.contains(key)) {  // merged on the node
      if (!background && k.background.erase(key) > 0) send(r, req(path, k.last_seen, type, uid));
      return;
    }
    k.waiting[key] = k.last_seen;
    if (background) k.background.insert(key);
    ++k.waits;
    send(r, req(path, k.last_seen, type, uid, background ? kBackground : 0));
  }
  // An open of a small file: the node waits for its directory's batch.
  void open_small(int r, const std::string& file, uint32_t uid = 0, bool background = false) {
    open(r, dir_of(file), MsgType::batch, uid, background);
  }
  void request_shutdown(int r) {
    auto& k = rank(r);
    if (k.stopped || k.shutdown_sent) return;
    k.shutdown_sent = true;
    send(r, shutdown_req());
  }
  // The coordinator receives rank r's oldest request in flight.
  bool deliver_request(int r) {
    auto& k = rank(r);
    if (k.in_flight.empty()) return false;
    receive(k.in_flight.front());
    k.in_flight.pop_front();
    return true;
  }
  static std::string show(const std::optional<Message>& m) {
    if (!m) return "none";
    return "{type " + std::to_string(static_cast<int>(m->type)) + ", id " + std::to_string(m->id) + ", " + m->path +
           ", uid " + std::to_string(m->uid) + ", flags " + std::to_string(m->flags) + ", " + m->from + ".." + m->until + "}";
  }
  // The coordinator starts its next broadcast, if it may.
  bool step_coordinator() {
    auto a = coord_.next_announcement();
    auto b = ref_.next();
    EXPECT_EQ(a, b) << "coordinator and reference disagree: " << show(a) << " vs " << show(b);
    if (!a) return false;
    EXPECT_TRUE(log_.empty() || a->id > log_.back().id);
    if (shutdown_received_) {
      EXPECT_EQ(a->type, MsgType::shutdown) << "a transfer after a shutdown request";
    }
    if (!log_.empty()) {
      EXPECT_NE(log_.back().type, MsgType::shutdown) << "an announcement after the shutdown";
    }
    EXPECT_LE(log_.size(), rank(0).delivered) << "two announcements outstanding";
    if (is_nested(a->type)) {
      EXPECT_TRUE(running_ &&
                  (running_->type == MsgType::materialize || running_->type == MsgType::file_prefetch))
          << "nested outside a file's transfer";
      EXPECT_TRUE(a->type == MsgType::batch_nested || running_->type == MsgType::file_prefetch)
          << "a file nested in an open's transfer";
      EXPECT_FALSE(nested_) << "two nested transfers at once";
    } else {
      EXPECT_FALSE(running_) << "a transfer announced while one runs";
    }
    EXPECT_EQ(ref_.last_prefetched(), a->type == MsgType::batch_prefetch || a->type == MsgType::file_prefetch)
        << "background iff announced so";
    if (ref_.last_prefetched()) {
      EXPECT_FALSE(running_) << "a background transfer while a transfer runs";
    }
    if (ref_.last_walk()) {
      for (const Message& m : log_)
        EXPECT_FALSE(ReferenceCoordinator::key_type(m.type) == MsgType::batch && m.path == a->path)
            << "prefetched batch " << a->path << " announced twice";
    }
    log_.push_back(*a);
    answers_.push_back(0);
    prefetched_.push_back(ref_.last_walk());
    return true;
  }
  // Rank r processes its next announcement, as GroupService does.
  bool deliver_announcement(int r) {
    auto& k = rank(r);
    if (k.stopped || k.delivered == log_.size()) return false;
    if (r == 0 && (nested_ || (running_ && !is_nested(log_[k.delivered].type))))
      return false;  // busy running a transfer
    const size_t i = k.delivered++;
    const Message& m = log_[i];
    if (r == 0) {
      coord_.on_announced(m);
      ref_.announced();
      if (m.type != MsgType::shutdown) {
        coord_.on_started(m);
        ref_.started(m);
        (is_nested(m.type) ? nested_ : running_) = m;  // a nested one may outlive its transfer
      }
    }
    EXPECT_GT(m.id, k.last_seen);
    k.last_seen = m.id;
    if (m.type == MsgType::shutdown) {
      k.failed += k.waiting.size();
      k.waiting.clear();
      k.background.clear();
      k.stopped = true;
      return true;
    }
    if (auto it = k.waiting.find(std::pair{ReferenceCoordinator::key_type(m.type), m.path}); it != k.waiting.end()) {
      EXPECT_GT(m.id, it->second);  // announced after the node asked
      k.background.erase(it->first);
      k.waiting.erase(it);
      ++k.answered;
      ++answers_[i];
    }
    return true;
  }
  // Rank 0 ends what it runs: the nested batch first, then the transfer it ran in, each with
  // a cost of its own (what GroupService charges: here a function of the path and id).
  bool finish0() {
    std::optional<Message>& m = nested_ ? nested_ : running_;
    if (!m) return false;
    const uint64_t cost = (m->path.size() * 2654435761ULL + m->id * 40503ULL) % (uint64_t{64} << 20);
    coord_.charge(*m, cost);
    ref_.charge(*m, cost);
    coord_.on_finished(*m);
    ref_.finished(*m);
    m.reset();
    return true;
  }
  // What GroupService does when a prefetched batch failed (no room without evicting).
  size_t drop_prefetches() {
    const size_t n = coord_.drop_prefetches();
    EXPECT_EQ(n, ref_.drop_prefetches());
    return n;
  }
  // Everything in flight delivered, everything queued announced and seen.
  void drain() {
    for (bool any = true; any;) {
      any = finish0();
      for (int r = 0; r < size(); ++r)
        while (deliver_request(r)) any = true;
      any = step_coordinator() || any;
      for (int r = 0; r < size(); ++r)
        while (deliver_announcement(r)) any = true;
    }
  }
  // The promises, once drained.
  void check_quiescent() const {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const auto& k = ranks_[r];
      EXPECT_TRUE(k.waiting.empty()) << "rank " << r << " still waits for " << k.waiting.begin()->first.second;
      EXPECT_EQ(k.answered + k.failed, k.waits) << "rank " << r;
      EXPECT_EQ(k.delivered, log_.size()) << "rank " << r;
    }
    for (size_t i = 0; i < log_.size(); ++i) {
      if (log_[i].type != MsgType::shutdown && !prefetched_[i]) {
        EXPECT_GE(answers_[i], 1U) << "transfer of " << log_[i].path << " (id " << log_[i].id
                                   << ") answered nobody";
      }
    }
    EXPECT_FALSE(coord_.outstanding());
  }

  [[nodiscard]] int size() const { return static_cast<int>(ranks_.size()); }
  SimRank& rank(int r) { return ranks_[static_cast<size_t>(r)]; }
  [[nodiscard]] const std::vector<Message>& log() const { return log_; }
  [[nodiscard]] const Coordinator& coordinator() const { return coord_; }
  [[nodiscard]] bool stopped(int r) const { return ranks_[static_cast<size_t>(r)].stopped; }
  [[nodiscard]] uint64_t walks() const { return walks_; }

 private:
  void send(int r, const Message& m) {
    if (r == 0)
      receive(m);  // the coordinator's own node: no network
    else
      rank(r).in_flight.push_back(m);
  }
  void receive(const Message& m) {
    if (m.type == MsgType::shutdown) shutdown_received_ = true;
    coord_.on_request(m);
    ref_.on_request(m);
    // What GroupService does after each poll: the walks, listed.
    const auto walks = coord_.take_walks();
    EXPECT_EQ(walks, ref_.take_walks()) << "request " << int(m.type) << " '" << m.path << "' id " << m.id;
    for (const std::string& parent : walks) {
      ++walks_;
      auto it = subdirs_.find(parent);
      if (it == subdirs_.end()) continue;
      for (const std::string& d : it->second) {
        const std::string dir = parent.empty() ? d : parent + "/" + d;
        coord_.prefetch(dir);
        ref_.prefetch(dir);
      }
    }
  }

  Coordinator coord_;
  ReferenceCoordinator ref_;
  std::optional<Message> running_, nested_;  // what rank 0 runs
  std::vector<SimRank> ranks_;
  std::vector<Message> log_;       // every announcement, in order
  std::vector<uint64_t> answers_;  // waits each announcement answered
  std::vector<bool> prefetched_;   // announcements that came from a walk (they answer no wait)
  std::map<std::string, std::vector<std::string>> subdirs_;
  uint64_t walks_ = 0;
  bool shutdown_received_ = false;
};

TEST(CoordinatorTest, ABurstOfOpensOnEveryRankCostsOneTransfer) {
  Group g(4);
  for (int r = 0; r < 4; ++r) g.open(r, "img.sqsh");
  g.drain();
  ASSERT_EQ(g.log().size(), 1U);
  EXPECT_EQ(g.log()[0], (Message{MsgType::materialize, 1, "img.sqsh"}));
  EXPECT_EQ(g.coordinator().stats().merged, 3U);
  g.check_quiescent();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(g.rank(r).answered, 1U);
}

TEST(CoordinatorTest, ARequestThatRacedWithItsAnnouncementIsDropped) {
  Group g(2);
  g.open(0, "a");
  ASSERT_TRUE(g.step_coordinator());  // "a" announced (id 1); rank 1 has not seen it...
  g.open(1, "a");                     // ...and asks with last seen id 0
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_EQ(g.coordinator().stats().already_answered, 1U);
  g.drain();
  EXPECT_EQ(g.log().size(), 1U);  // announcement 1 answers rank 1 too
  g.check_quiescent();
  EXPECT_EQ(g.rank(1).answered, 1U);
}

TEST(CoordinatorTest, AnOpenAfterSeeingTheTransferGetsANewOne) {
  Group g(2);
  g.open(1, "a");
  g.drain();
  g.open(1, "a");  // e.g. the source changed: the node needs it again, having seen id 1
  g.drain();
  ASSERT_EQ(g.log().size(), 2U);
  EXPECT_EQ(g.log()[1], (Message{MsgType::materialize, 2, "a"}));
  g.check_quiescent();
}

TEST(CoordinatorTest, OneAnnouncementOutstandingAtATime) {
  Group g(3);
  g.open(0, "a");
  g.open(0, "b");
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_FALSE(g.step_coordinator());  // rank 0 has not completed "a"
  ASSERT_TRUE(g.deliver_announcement(0));
  EXPECT_FALSE(g.step_coordinator());  // rank 0 runs "a"
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.step_coordinator());
  g.drain();
  g.check_quiescent();
}

TEST(CoordinatorTest, ShutdownJumpsTheQueueAndIsLast) {
  Group g(3);
  for (const char* p : {"a", "b", "c"}) g.open(1, p);
  ASSERT_TRUE(g.deliver_request(1));
  ASSERT_TRUE(g.step_coordinator());  // "a" outstanding
  while (g.deliver_request(1)) {
  }
  g.request_shutdown(2);
  g.request_shutdown(1);
  g.drain();
  ASSERT_EQ(g.log().size(), 2U);
  EXPECT_EQ(g.log()[1].type, MsgType::shutdown);
  EXPECT_TRUE(g.coordinator().shut_down());
  g.open(2, "d");  // too late: stopped
  g.check_quiescent();
  EXPECT_EQ(g.rank(1).answered, 1U);
  EXPECT_EQ(g.rank(1).failed, 2U);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(g.stopped(r));
}

TEST(CoordinatorTest, SmallFilesOfOneDirectoryOnEveryRankCostOneBatch) {
  Group g(4);
  // Every rank opens 50 small files of d and the large file of d; rank 2 also a small file
  // of the root and of d/sub (other directories: other batches).
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 50; ++i) g.open_small(r, "d/s" + std::to_string((i + r * 7) % 50));
    g.open(r, "d/large");
  }
  g.open_small(2, "top");
  g.open_small(2, "d/sub/x");
  g.drain();
  ASSERT_EQ(g.log().size(), 4U);
  EXPECT_EQ(g.log()[0], (Message{MsgType::batch, 1, "d"}));
  EXPECT_EQ(g.log()[1], (Message{MsgType::materialize, 2, "d/large"}));
  EXPECT_EQ(g.log()[2], (Message{MsgType::batch, 3, ""}));
  EXPECT_EQ(g.log()[3], (Message{MsgType::batch, 4, "d/sub"}));
  EXPECT_EQ(g.coordinator().stats().batches, 3U);
  EXPECT_EQ(g.coordinator().stats().announced, 4U);
  // Each node asked once per key: 3 other ranks' requests for "d" and for "d/large" merged.
  EXPECT_EQ(g.coordinator().stats().merged, 6U);
  g.check_quiescent();
  EXPECT_EQ(g.rank(0).answered, 2U);
  EXPECT_EQ(g.rank(2).answered, 4U);
}

TEST(CoordinatorTest, ASmallFileRequestThatRacedWithItsBatchIsDropped) {
  Group g(2);
  g.open_small(0, "d/a");
  ASSERT_TRUE(g.step_coordinator());  // batch "d" announced (id 1); rank 1 has not seen it
  g.open_small(1, "d/b");             // another file of d, asked with last seen id 0
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_EQ(g.coordinator().stats().already_answered, 1U);
  g.open(1, "d");  // a *file* named like the directory's key is another key: not answered by it
  g.drain();
  ASSERT_EQ(g.log().size(), 2U);
  EXPECT_EQ(g.log()[1], (Message{MsgType::materialize, 2, "d"}));
  g.check_quiescent();
  // After seeing the batch, a new small-file open (a file created since) gets a new batch.
  g.open_small(1, "d/new");
  g.drain();
  ASSERT_EQ(g.log().size(), 3U);
  EXPECT_EQ(g.log()[2], (Message{MsgType::batch, 3, "d"}));
  g.check_quiescent();
}

TEST(ControlMessageTest, BatchesRoundTripAndUnsafeDirectoriesAreRefused) {
  for (const Message& m :
       {Message{MsgType::batch, 7, "d/e"}, Message{MsgType::batch, 8, ""},
        Message{MsgType::batch_nested, 9, "d"}, Message{MsgType::batch_prefetch, 10, "d/f"},
        Message{MsgType::file_prefetch, 11, "d/g"}, Message{MsgType::file_nested, 12, "h"}}) {
    const std::string bytes = encode_message(m);
    auto back = decode_message(std::as_bytes(std::span(bytes.data(), bytes.size())));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(*back, m);
  }
  for (const char* bad : {"../x", "/etc", "d/../..", "d//e"}) {
    for (MsgType t : {MsgType::batch, MsgType::batch_nested, MsgType::batch_prefetch}) {
      const std::string bytes = encode_message(Message{t, 1, bad});
      EXPECT_FALSE(decode_message(std::as_bytes(std::span(bytes.data(), bytes.size())))) << bad;
    }
  }
  // A single file still needs a name, and a safe one.
  for (MsgType t : {MsgType::materialize, MsgType::file_prefetch, MsgType::file_nested})
    for (const char* bad : {"", "../x", "/etc", "d//e"}) {
      const std::string bytes = encode_message(Message{t, 1, bad});
      EXPECT_FALSE(decode_message(std::as_bytes(std::span(bytes.data(), bytes.size())))) << bad;
    }
  // No type beyond the last one.
  std::string unknown = encode_message(Message{MsgType::file_nested, 1, "d"});
  unknown[4] = static_cast<char>(static_cast<uint8_t>(MsgType::file_nested) + 1);
  EXPECT_FALSE(decode_message(std::as_bytes(std::span(unknown.data(), unknown.size()))));
  unknown[4] = 0;
  EXPECT_FALSE(decode_message(std::as_bytes(std::span(unknown.data(), unknown.size()))));
}

// Nesting: while rank 0 runs a file's transfer, the first queued batch (and only a batch) is
// announced nested, one at a time; the file queued before it waits for the transfer's end,
// and so does a shutdown.
TEST(CoordinatorTest, WhileAFileIsCopiedOnlyABatchIsAnnouncedNested) {
  Group g(2, /*nesting=*/true);
  g.open(1, "big");
  ASSERT_TRUE(g.deliver_request(1));
  ASSERT_TRUE(g.step_coordinator());
  ASSERT_TRUE(g.deliver_announcement(0));  // rank 0 runs "big"
  g.open(1, "other");
  g.open_small(1, "d/s1");
  g.open_small(1, "e/s2");
  while (g.deliver_request(1)) {
  }
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch_nested, 2, "d"}));
  EXPECT_FALSE(g.step_coordinator());      // outstanding
  ASSERT_TRUE(g.deliver_announcement(0));  // runs the nested batch
  EXPECT_FALSE(g.step_coordinator());      // one nested batch at a time
  ASSERT_TRUE(g.finish0());                // the nested batch ends
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch_nested, 3, "e"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  ASSERT_TRUE(g.finish0());
  g.request_shutdown(1);
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_FALSE(g.step_coordinator());  // "other" and the shutdown wait for "big"
  ASSERT_TRUE(g.finish0());            // "big" ends
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back().type, MsgType::shutdown);
  g.drain();
  g.check_quiescent();
  EXPECT_EQ(g.coordinator().stats().nested, 2U);
  EXPECT_EQ(g.rank(1).answered, 3U);  // big, d, e; "other" failed with the shutdown
  EXPECT_EQ(g.rank(1).failed, 1U);
}

// Without nesting (or with nesting, inside a batch) nothing is announced while rank 0 runs.
// A background copy of a large file (a replay's, stagectl prefetch's) never holds up an open:
// the next request runs nested in it, a file as well as a batch, one at a time; the background
// file's own open joins it (no second transfer), and a shutdown waits for its end.
TEST(CoordinatorTest, WhileABackgroundFileIsCopiedAnOpensFileRunsNested) {
  Group g(3, /*nesting=*/true);
  g.open(0, "replayed", MsgType::materialize, 0, /*background=*/true);
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::file_prefetch, 1, "replayed"}));
  ASSERT_TRUE(g.deliver_announcement(0));  // rank 0 runs it
  g.open(1, "wanted");
  g.open_small(2, "d/s1");
  g.open(2, "second");
  while (g.deliver_request(1) || g.deliver_request(2)) {
  }
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::file_nested, 2, "wanted"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  EXPECT_FALSE(g.step_coordinator());  // one nested transfer at a time
  ASSERT_TRUE(g.finish0());            // "wanted" ends, "replayed" goes on
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch_nested, 3, "d"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::file_nested, 4, "second"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  ASSERT_TRUE(g.finish0());
  g.request_shutdown(1);
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_FALSE(g.step_coordinator());  // the shutdown waits for "replayed"
  ASSERT_TRUE(g.finish0());
  g.drain();
  EXPECT_EQ(g.log().back().type, MsgType::shutdown);
  EXPECT_EQ(g.coordinator().stats().nested, 3U);
  g.check_quiescent();
  EXPECT_EQ(g.rank(0).answered, 1U);  // the background wait, answered by its transfer
}

// An open joins a background wait of its own node: it asks as an open, and the key goes
// ahead of the rest of the background queue; with nesting off, a background file runs alone.
TEST(CoordinatorTest, AnOpenMovesABackgroundFileAheadAndWithoutNestingWaitsForTheRunningOne) {
  Group g(2, /*nesting=*/false);
  for (const char* p : {"r0", "r1", "r2"}) g.open(0, p, MsgType::materialize, 0, /*background=*/true);
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::file_prefetch, 1, "r0"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  g.open(0, "r2");  // the job opens a file the replay queued last
  g.open(1, "other");
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_FALSE(g.step_coordinator());  // nesting off: "r0" runs alone
  ASSERT_TRUE(g.finish0());
  std::vector<std::string> order;
  while (g.step_coordinator()) {
    order.push_back(g.log().back().path);
    ASSERT_TRUE(g.deliver_announcement(0));
    ASSERT_TRUE(g.finish0());
  }
  EXPECT_EQ(order, (std::vector<std::string>{"r2", "other", "r1"}));
  EXPECT_EQ(g.coordinator().stats().promoted, 1U);
  g.drain();
  g.check_quiescent();
}

TEST(CoordinatorTest, NothingIsAnnouncedWhileABatchRunsOrWithNestingOff) {
  for (bool nesting : {false, true}) {
    Group g(2, nesting);
    if (nesting) {
      g.open_small(1, "d/s");
    } else {
      g.open(1, "big");
    }
    ASSERT_TRUE(g.deliver_request(1));
    ASSERT_TRUE(g.step_coordinator());
    ASSERT_TRUE(g.deliver_announcement(0));
    g.open_small(1, "e/s");
    ASSERT_TRUE(g.deliver_request(1));
    EXPECT_FALSE(g.step_coordinator()) << nesting;
    ASSERT_TRUE(g.finish0());
    ASSERT_TRUE(g.step_coordinator());
    EXPECT_EQ(g.log().back(), (Message{MsgType::batch, 2, "e"}));
    g.drain();
    g.check_quiescent();
  }
  // A request can never name a nested batch (announcements only): dropped.
  Coordinator c;
  c.on_request(Message{MsgType::batch_nested, 0, "d"});
  EXPECT_FALSE(c.next_announcement());
}

// Walks: opens in two sibling directories make their parent a walk; the other subdirectories
// are prefetched behind every request, one at a time, and a request promotes one.
TEST(CoordinatorTest, TwoSiblingDirectoriesStageTheOthersBehindEveryRequest) {
  Group g(2, /*nesting=*/true, {{"data", {"a", "b", "c", "d", "e"}}});
  g.open_small(1, "data/a/x");
  g.drain();
  EXPECT_EQ(g.walks(), 0U);  // one directory is not a walk
  g.open_small(1, "data/a/y");
  g.drain();
  EXPECT_EQ(g.walks(), 0U);  // nor twice the same one
  g.open_small(1, "data/b/x");
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_EQ(g.walks(), 1U);
  ASSERT_TRUE(g.step_coordinator());  // what was asked for goes first
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch, 3, "data/b"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  EXPECT_FALSE(g.step_coordinator());  // nothing while it runs
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.deliver_announcement(1));
  ASSERT_TRUE(g.step_coordinator());  // then c, the first not announced yet (a and b were)
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch_prefetch, 4, "data/c"}));
  // While c runs, rank 1 opens a file of e and a large file: both go before d.
  ASSERT_TRUE(g.deliver_announcement(0));
  g.open_small(1, "data/e/x");
  g.open(1, "data/big");
  while (g.deliver_request(1)) {
  }
  EXPECT_EQ(g.coordinator().stats().promoted, 1U);
  EXPECT_FALSE(g.step_coordinator());  // c runs
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch, 5, "data/e"}));  // promoted
  ASSERT_TRUE(g.deliver_announcement(0));
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::materialize, 6, "data/big"}));
  ASSERT_TRUE(g.deliver_announcement(0));  // rank 0 runs the large file: a prefetch never nests
  EXPECT_FALSE(g.step_coordinator());
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch_prefetch, 7, "data/d"}));
  g.drain();
  g.check_quiescent();
  const auto& st = g.coordinator().stats();
  EXPECT_EQ(st.prefetched, 2U);  // c and d; e was asked for
  EXPECT_EQ(st.walks, 1U);
  ASSERT_EQ(g.log().size(), 7U);
  // A later open in a third, fourth directory of the same parent is no new walk.
  g.open_small(1, "data/c/new");
  g.drain();
  EXPECT_EQ(g.walks(), 1U);
  g.check_quiescent();
}

// A shutdown drops what was prefetched; nothing is prefetched after it.
TEST(CoordinatorTest, AShutdownDropsThePrefetchedBatches) {
  Group g(2, false, {{"", {"a", "b", "c", "d"}}});
  g.open_small(1, "a/x");
  g.open_small(1, "b/x");
  while (g.deliver_request(1)) {
  }
  g.request_shutdown(1);
  ASSERT_TRUE(g.deliver_request(1));
  g.drain();
  ASSERT_EQ(g.log().size(), 1U);
  EXPECT_EQ(g.log().back().type, MsgType::shutdown);
  EXPECT_EQ(g.coordinator().stats().prefetched, 0U);
  g.check_quiescent();
}

// A prefetched batch that found no room drops the queue: the other siblings are not
// announced; what readers ask for still is, and so is a later walk's prefetch.
TEST(CoordinatorTest, DroppedPrefetchesAreNotAnnouncedButRequestsAndLaterWalksAre) {
  Group g(2, false, {{"data", {"a", "b", "c", "d", "e"}}, {"more", {"x", "y", "z"}}});
  g.open_small(1, "data/a/f");
  g.open_small(1, "data/b/f");
  g.drain();  // a, b asked for; c, d, e prefetched
  ASSERT_EQ(g.log().size(), 5U);
  EXPECT_EQ(g.log()[2], (Message{MsgType::batch_prefetch, 3, "data/c"}));
  g.open_small(1, "more/x/f");
  g.open_small(1, "more/y/f");
  while (g.deliver_request(1)) {
  }
  ASSERT_TRUE(g.step_coordinator());
  ASSERT_TRUE(g.deliver_announcement(0));
  ASSERT_TRUE(g.finish0());
  EXPECT_EQ(g.drop_prefetches(), 1U);  // z, behind x and y
  g.drain();
  ASSERT_EQ(g.log().size(), 7U);
  EXPECT_EQ(g.log()[5], (Message{MsgType::batch, 6, "more/x"}));
  EXPECT_EQ(g.log()[6], (Message{MsgType::batch, 7, "more/y"}));
  g.open_small(0, "more/z/f");  // asked for: announced as usual
  g.drain();
  ASSERT_EQ(g.log().size(), 8U);
  EXPECT_EQ(g.log()[7], (Message{MsgType::batch, 8, "more/z"}));
  EXPECT_EQ(g.coordinator().stats().prefetch_dropped, 1U);
  EXPECT_EQ(g.drop_prefetches(), 0U);
  g.check_quiescent();
}

// Random interleavings of opens (large files, small files by directory), deliveries and
// shutdowns on 1 to 7 ranks.
TEST(CoordinatorTest, RandomInterleavingsKeepThePromises) {
  uint64_t nested = 0;                                 // the runs with nesting on do nest
  uint64_t nested_files = 0, background_files = 0;     // files nest in background ones
  uint64_t prefetched = 0, promoted = 0, dropped = 0;  // and the runs with walks do prefetch (and drop)
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    const int n = 1 + static_cast<int>(seed % 7);
    const int paths = 1 + static_cast<int>(rng() % 6);
    const bool with_shutdown = seed % 3 == 0;
    const bool walks = seed % 5 < 2;
    Group g(n, /*nesting=*/seed % 2 == 0,
            walks ? std::map<std::string, std::vector<std::string>>{{"", {"d3", "d0", "d1", "d2"}}}
                  : std::map<std::string, std::vector<std::string>>{});
    auto pick = [&](int k) { return static_cast<int>(rng() % static_cast<uint32_t>(k)); };
    const int users = 1 + static_cast<int>(seed % 4);  // one to four users take turns by cost
    auto uid = [&] { return static_cast<uint32_t>(1000 + pick(users)); };
    // Three runs in four also make background requests (a replay, stagectl prefetch).
    auto background = [&] { return seed % 4 != 3 && pick(3) == 0; };
    for (int step = 0; step < 400; ++step) {
      const int r = pick(n);
      switch (pick(10)) {
        case 0:
          g.open(r, "f" + std::to_string(pick(paths)), MsgType::materialize, uid(), background());
          break;
        case 1:  // a large file in a directory: its own transfer
          g.open(r, "d" + std::to_string(pick(3)) + "/f" + std::to_string(pick(paths)), MsgType::materialize,
                 uid(), background());
          break;
        case 2:  // a small file (in the root or a directory): its directory's batch
          g.open_small(r,
                       (pick(4) == 0 ? std::string() : "d" + std::to_string(pick(3)) + "/") + "s" +
                           std::to_string(pick(paths)),
                       uid(), background());
          break;
        case 3:
        case 4:
          g.deliver_request(r);
          break;
        case 5:
        case 6:
          g.step_coordinator();
          break;
        case 7:
        case 8:
          g.deliver_announcement(r);
          break;
        default:
          if (pick(2) == 0) g.finish0();
          if (with_shutdown && pick(40) == 0) g.request_shutdown(r);
          if (walks && pick(30) == 0) dropped += g.drop_prefetches();
      }
      if (::testing::Test::HasFailure()) FAIL() << "seed " << seed << " step " << step;
    }
    g.drain();
    g.check_quiescent();
    if (!with_shutdown) {
      for (int r = 0; r < n; ++r) EXPECT_EQ(g.rank(r).failed, 0U) << "seed " << seed;
    }
    g.request_shutdown(pick(n));
    g.drain();
    g.check_quiescent();
    ASSERT_FALSE(g.log().empty());
    EXPECT_EQ(g.log().back().type, MsgType::shutdown) << "seed " << seed;
    for (int r = 0; r < n; ++r) EXPECT_TRUE(g.stopped(r)) << "seed " << seed;
    if (::testing::Test::HasFailure()) FAIL() << "seed " << seed;
    nested += g.coordinator().stats().nested;
    for (const Message& m : g.log()) {
      nested_files += m.type == MsgType::file_nested ? 1 : 0;
      background_files += m.type == MsgType::file_prefetch ? 1 : 0;
    }
    prefetched += g.coordinator().stats().prefetched;
    promoted += g.coordinator().stats().promoted;
  }
  EXPECT_GT(nested, 100U);
  EXPECT_GT(background_files, 50U);
  EXPECT_GT(nested_files, 10U);
  EXPECT_GT(prefetched, 20U);
  EXPECT_GT(promoted, 5U);
  EXPECT_GT(dropped, 5U);
}

// Fairness: the direct Coordinator, one rank. A request of uid `uid`, as a node sends it.
Message user_req(uint32_t uid, const std::string& path, MsgType type = MsgType::materialize,
                 uint8_t flags = 0, const std::string& from = {}) {
  return Message{type, 0, path, uid, flags, from, {}};
}
// Announces what the coordinator decides next, runs it at once on its node, and returns it.
std::optional<Message> run_next(Coordinator& c) {
  auto m = c.next_announcement();
  if (!m) return m;
  c.on_announced(*m);
  c.on_started(*m);
  c.on_finished(*m);
  return m;
}

// One user's backlog (a prefetch of hundreds of names) delays another user's open by the one
// transfer announced before it arrived: the uids take turns, each uid's requests in order.
TEST(FairQueueTest, AnotherUsersOpenIsServedBeforeTheRestOfOneUsersBacklog) {
  Coordinator c;
  for (int i = 0; i < 200; ++i) c.on_request(user_req(1000, "big/f" + std::to_string(i)));
  auto first = run_next(c);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->path, "big/f0");
  c.on_request(user_req(2000, "other"));
  c.on_request(user_req(2000, "other2"));
  std::vector<std::string> order;
  while (auto m = run_next(c)) order.push_back(m->path);
  ASSERT_EQ(order.size(), 201U);
  EXPECT_EQ(order[0], "big/f1");  // 1000's turn had come before 2000 asked
  EXPECT_EQ(order[1], "other");
  EXPECT_EQ(order[2], "big/f2");
  EXPECT_EQ(order[3], "other2");
  // Within a uid: first come, first served.
  for (size_t i = 4; i < order.size(); ++i) EXPECT_EQ(order[i], "big/f" + std::to_string(i - 1));
}

// Announces, runs and charges what the coordinator decides next, as GroupService does.
std::optional<Message> run_charged(Coordinator& c, const std::function<uint64_t(const Message&)>& cost) {
  auto m = c.next_announcement();
  if (!m) return m;
  c.on_announced(*m);
  c.on_started(*m);
  c.charge(*m, cost(*m));
  c.on_finished(*m);
  return m;
}

// Turns by cost: a user whose transfers move 10 GiB each gets one of them, then another
// user's 20 MiB opens all go before its next one (by turns alone they would alternate, and
// the last small open would wait for three 10 GiB copies).
TEST(FairQueueTest, AUsersExpensiveTransfersDoNotStarveAnothersCheapOnes) {
  Coordinator c;
  for (int i = 0; i < 4; ++i) c.on_request(user_req(1000, "big" + std::to_string(i)));
  for (int i = 0; i < 4; ++i) c.on_request(user_req(2000, "small" + std::to_string(i)));
  const auto cost = [](const Message& m) {
    return m.path.starts_with("big") ? transfer_cost(uint64_t{10} << 30, 640, 1)
                                     : transfer_cost(20 << 20, 2, 1);
  };
  std::vector<std::string> order;
  while (auto m = run_charged(c, cost)) order.push_back(m->path);
  EXPECT_EQ(order, (std::vector<std::string>{"big0", "small0", "small1", "small2", "small3", "big1", "big2",
                                             "big3"}));
  // A 1 TiB sparse file with one written byte moves one chunk: it costs about what a small
  // file does, not what 65,536 chunks of zeros would.
  EXPECT_LT(transfer_cost(16 << 20, 1, 1), transfer_cost(20 << 20, 2, 1));
}

// A user who had the mount alone banks nothing: when another user comes, both start level,
// and with equal costs they take turns (the newcomer does not get its whole backlog first).
TEST(FairQueueTest, AUserWhoHadTheMountAloneBanksNoCredit) {
  Coordinator c;
  const auto cost = [](const Message&) { return transfer_cost(uint64_t{10} << 30, 640, 1); };
  for (int i = 0; i < 5; ++i) c.on_request(user_req(1000, "a" + std::to_string(i)));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(run_charged(c, cost));
  for (int i = 0; i < 3; ++i) c.on_request(user_req(2000, "b" + std::to_string(i)));
  for (int i = 5; i < 7; ++i) c.on_request(user_req(1000, "a" + std::to_string(i)));
  std::vector<std::string> order;
  while (auto m = run_charged(c, cost)) order.push_back(m->path);
  EXPECT_EQ(order, (std::vector<std::string>{"b0", "a4", "b1", "a5", "b2", "a6"}));
}

// The turn order is by uid, not by key: a batch asked for by one user and merged with another
// user's request keeps its first place; three users alternate.
TEST(FairQueueTest, ThreeUsersTakeTurnsAndAMergedRequestKeepsItsPlace) {
  Coordinator c;
  for (int i = 0; i < 3; ++i) c.on_request(user_req(1, "a" + std::to_string(i)));
  for (int i = 0; i < 3; ++i) c.on_request(user_req(2, "b" + std::to_string(i)));
  c.on_request(user_req(3, "c0"));
  c.on_request(user_req(3, "a2"));  // merged into uid 1's
  std::vector<std::string> order;
  while (auto m = run_next(c)) order.push_back(m->path);
  EXPECT_EQ(order, (std::vector<std::string>{"a0", "b0", "c0", "a1", "b1", "a2", "b2"}));
  EXPECT_EQ(c.stats().merged, 1U);
}

// A background request (stagectl prefetch) waits behind every request, whatever its uid; an
// open of the same file promotes it.
TEST(FairQueueTest, BackgroundRequestsRunBehindOpensAndAnOpenPromotesOne) {
  Coordinator c;
  for (int i = 0; i < 5; ++i)
    c.on_request(user_req(1000, "p" + std::to_string(i), MsgType::materialize, kBackground));
  c.on_request(user_req(2000, "open1"));
  c.on_request(user_req(2000, "p3"));  // an open of a prefetched file
  c.on_request(user_req(3000, "open2"));
  std::vector<std::string> order;
  while (auto m = run_next(c)) order.push_back(m->path);
  EXPECT_EQ(order, (std::vector<std::string>{"open1", "open2", "p3", "p0", "p1", "p2", "p4"}));
  EXPECT_EQ(c.stats().promoted, 1U);
}

// Bounded batches: a slice that left names out queues the rest of its range behind the
// requests of other users that arrived meanwhile; the ranges chain round the directory back
// to where the first slice began, and end when a slice leaves nothing out.
TEST(FairQueueTest, TheNextSliceQueuesBehindOtherUsersAndCoversTheRestOfTheCircle) {
  Coordinator c;
  c.on_request(user_req(1000, "huge", MsgType::batch, 0, "f500"));
  auto s1 = run_next(c);
  ASSERT_TRUE(s1);
  EXPECT_EQ(*s1, (Message{MsgType::batch, 1, "huge", 1000, 0, "f500", ""}));
  c.on_request(user_req(2000, "other"));
  c.continue_batch(*s1, "f700");
  auto o = run_next(c);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->path, "other");
  auto s2 = run_next(c);
  ASSERT_TRUE(s2);
  EXPECT_EQ(*s2, (Message{MsgType::batch, 3, "huge", 1000, 0, "f700", "f500"}));  // round to f500
  c.continue_batch(*s2, "f100");  // wrapped past the last name
  auto s3 = run_next(c);
  ASSERT_TRUE(s3);
  EXPECT_EQ(*s3, (Message{MsgType::batch, 4, "huge", 1000, 0, "f100", "f500"}));
  c.continue_batch(*s3, "");  // nothing left out: the end
  EXPECT_FALSE(c.next_announcement());
  // A directory staged from its first name: the rest runs to the last name, not round again.
  c.on_request(user_req(1000, "d", MsgType::batch));
  auto t1 = run_next(c);
  ASSERT_TRUE(t1);
  c.continue_batch(*t1, "g");
  auto t2 = run_next(c);
  ASSERT_TRUE(t2);
  EXPECT_EQ(*t2, (Message{MsgType::batch, 6, "d", 1000, kToEnd, "g", ""}));
  c.continue_batch(*t2, "k");
  auto t3 = run_next(c);
  ASSERT_TRUE(t3);
  EXPECT_EQ(*t3, (Message{MsgType::batch, 7, "d", 1000, kToEnd, "k", ""}));
  EXPECT_EQ(c.stats().continued, 4U);
}

// Walk budget: once one walk's prefetched slices listed its bytes, its queued prefetches go;
// another walk's and the requests stay.
TEST(FairQueueTest, AWalkOverItsByteBudgetDropsItsOwnPrefetchesOnly) {
  Coordinator c;
  c.set_walks(true);
  c.set_budget(1000, 0);
  c.on_request(user_req(1, "w/a", MsgType::batch));
  c.on_request(user_req(1, "w/b", MsgType::batch));
  c.on_request(user_req(1, "v/a", MsgType::batch));
  c.on_request(user_req(1, "v/b", MsgType::batch));
  ASSERT_EQ(c.take_walks(), (std::vector<std::string>{"w", "v"}));
  for (const char* d : {"w/c", "w/d", "w/e", "v/c", "v/d"}) c.prefetch(d);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(run_next(c));  // the four asked for
  auto p = run_next(c);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, (Message{MsgType::batch_prefetch, 5, "w/c"}));
  EXPECT_EQ(c.slice_left(*p)->bytes, 1000U);
  EXPECT_FALSE(c.batch_ran(*p, 600, 3).over);
  auto q = run_next(c);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->path, "w/d");
  EXPECT_EQ(c.slice_left(*q)->bytes, 400U) << "what the walk has left";
  EXPECT_EQ(c.slice_left(*q)->files, UINT64_MAX) << "no file budget";
  const auto t = c.batch_ran(*q, 600, 3);  // 1200 > 1000: w/e goes
  EXPECT_TRUE(t.over);
  EXPECT_EQ(t.dropped, 1U);
  c.continue_batch(*q, "n", t.spent);  // nor is the rest of w/d queued
  std::vector<std::string> rest;
  while (auto m = run_next(c)) rest.push_back(m->path);
  EXPECT_EQ(rest, (std::vector<std::string>{"v/c", "v/d"}));
  EXPECT_EQ(c.stats().prefetch_dropped, 1U);
}

// Walks count files too: a walk of empty files (no bytes, 8 KiB charged each by the group,
// here 0) stops at its file budget.
TEST(FairQueueTest, AWalkOverItsFileBudgetDropsItsPrefetches) {
  Coordinator c;
  c.set_walks(true);
  c.set_budget(0, 100);
  c.on_request(user_req(1, "w/a", MsgType::batch));
  c.on_request(user_req(1, "w/b", MsgType::batch));
  ASSERT_EQ(c.take_walks(), (std::vector<std::string>{"w"}));
  for (const char* d : {"w/c", "w/d", "w/e"}) c.prefetch(d);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(run_next(c));
  auto p = run_next(c);
  ASSERT_TRUE(p);
  EXPECT_EQ(c.slice_left(*p)->files, 100U);
  const auto t = c.batch_ran(*p, 0, 100);
  EXPECT_TRUE(t.over);
  EXPECT_EQ(t.dropped, 2U);
  EXPECT_FALSE(run_next(c));
}

// One open's batch and the slices that follow it list at most the budget: each slice after
// the first lists at most what is left, and once it is spent no further slice is queued (the
// rest waits for its own opens, each of which starts a sequence of its own). A background
// request's batch (stagectl prefetch of a small file) is held to the same.
TEST(FairQueueTest, TheSlicesThatFollowABatchStopAtTheBudget) {
  for (uint8_t flags : {uint8_t{0}, kBackground}) {
    Coordinator c;
    c.set_budget(0, 1000);
    c.on_request(user_req(1000, "huge", MsgType::batch, flags, "f0"));
    auto s1 = run_next(c);
    ASSERT_TRUE(s1);
    EXPECT_FALSE(c.slice_left(*s1)) << "the slice the open asked for: the batch limits only";
    auto t = c.batch_ran(*s1, 0, 400);
    EXPECT_TRUE(c.continue_batch(*s1, "f400", t.spent));
    auto s2 = run_next(c);
    ASSERT_TRUE(s2);
    EXPECT_EQ(s2->from, "f400");
    EXPECT_EQ(c.slice_left(*s2)->files, 600U);
    t = c.batch_ran(*s2, 0, 400);
    EXPECT_TRUE(c.continue_batch(*s2, "f800", t.spent));
    auto s3 = run_next(c);
    ASSERT_TRUE(s3);
    EXPECT_EQ(c.slice_left(*s3)->files, 200U);
    t = c.batch_ran(*s3, 0, 200);
    EXPECT_TRUE(t.over);
    EXPECT_FALSE(c.continue_batch(*s3, "f1000", t.spent)) << "the budget is spent";
    EXPECT_FALSE(c.next_announcement());
    EXPECT_EQ(c.stats().budget_stopped, 1U);
    // An open further on (its node has seen s3) starts a sequence of its own.
    Message further = user_req(1000, "huge", MsgType::batch, flags, "f1500");
    further.id = s3->id;
    c.on_request(further);
    auto again = run_next(c);
    ASSERT_TRUE(again);
    EXPECT_FALSE(c.slice_left(*again));
    EXPECT_TRUE(c.continue_batch(*again, "f1900", c.batch_ran(*again, 0, 400).spent));
  }
}

TEST(ControlMessageTest, UidsFlagsAndSlicesRoundTripAndBadSlicesAreRefused) {
  for (const Message& m : {Message{MsgType::batch, 7, "d/e", 1000, kBackground, "f1", "f9"},
                           Message{MsgType::batch_prefetch, 8, "", 0, kToEnd, "x", ""},
                           Message{MsgType::materialize, 9, "a/b", 4294967295U, kBackground, "", ""}}) {
    const std::string bytes = encode_message(m);
    auto back = decode_message(std::as_bytes(std::span(bytes.data(), bytes.size())));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(*back, m);
  }
  for (const Message& bad :
       {Message{MsgType::batch, 1, "d", 0, 0, "a/b", ""}, Message{MsgType::batch, 1, "d", 0, 0, "..", ""},
        Message{MsgType::batch, 1, "d", 0, 0, "", std::string(256, 'x')},
        Message{MsgType::materialize, 1, "f", 0, 0, "x", ""},
        Message{MsgType::batch, 1, "d", 0, 4, "", ""}}) {
    const std::string bytes = encode_message(bad);
    EXPECT_FALSE(decode_message(std::as_bytes(std::span(bytes.data(), bytes.size()))))
        << bad.from << bad.until;
  }
}

}  // namespace
}  // namespace stagefs
