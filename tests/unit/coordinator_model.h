// The coordinator's reference model and a simulated group of N in-process ranks (no MPI), for
// tests/unit/test_coordinator.cc: ReferenceCoordinator restates the rules with linear scans
// over the whole history; Group delivers requests (FIFO per rank) and announcements (the same
// sequence to every rank, each at its own pace) and checks every step against the reference.
#pragma once

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

#include "fusefs/group/control.h"
#include "fusefs/group/coordinator.h"

namespace stagefs::testing {

inline Message req(const std::string& path, uint64_t seen, MsgType type = MsgType::materialize,
                   uint32_t uid = 0, uint8_t flags = 0) {
  return Message{type, seen, path, uid, flags};
}
// The key a node waits on for a small file: its directory's batch.
inline std::string dir_of(const std::string& file) {
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? std::string() : file.substr(0, slash);
}
inline Message shutdown_req() {
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
    return "{type " + std::to_string(static_cast<int>(m->type)) + ", id " + std::to_string(m->id) + ", " +
           m->path + ", uid " + std::to_string(m->uid) + ", flags " + std::to_string(m->flags) + ", " +
           m->from + ".." + m->until + "}";
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
    if (auto it = k.waiting.find(std::pair{ReferenceCoordinator::key_type(m.type), m.path});
        it != k.waiting.end()) {
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
      EXPECT_TRUE(k.waiting.empty()) << "rank " << r << " still waits for "
                                     << k.waiting.begin()->first.second;
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

}  // namespace stagefs::testing
