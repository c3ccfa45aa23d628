// FakeNet / FakeP2P: the fake side of the PointToPoint seam. N ranks are N threads of one
// process; a send copies its bytes into the destination's mailbox at once, and test() reports
// a ready request complete only with probability 1/2 (seeded per rank), so messages complete
// in a random order, as they may over a real network. Matching follows MPI: per (source, tag)
// in the order started; a receive of the wrong size is an error.
// Faults, per directed link a -> b:
//   cut(a, b, after)   after `after` messages, the link goes silent: later sends never
//                      complete and their bytes never arrive (a pulled cable under TCP)
//   fail(a, b, after)  after `after` messages, requests on the link complete with an error
// Thread safety: one mutex guards the whole net; each FakeP2P is used by its rank's thread.
#pragma once

#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bcast/comm/comm.h"

namespace stage::testing {

class FakeNet {
 public:
  explicit FakeNet(int n, std::vector<std::string> placement = {}) : n_(n), placement_(std::move(placement)) {
    if (placement_.empty())
      for (int r = 0; r < n; ++r) placement_.push_back("node" + std::to_string(r));
  }
  [[nodiscard]] int size() const { return n_; }
  [[nodiscard]] const std::vector<std::string>& placement() const { return placement_; }

  void cut(int a, int b, int after) {
    const std::lock_guard lock(m_);
    faults_[{a, b}] = Fault{after, false};
  }
  void fail(int a, int b, int after) {
    const std::lock_guard lock(m_);
    faults_[{a, b}] = Fault{after, true};
  }
  uint64_t bytes_sent(int rank) {
    const std::lock_guard lock(m_);
    return sent_[rank];
  }

 private:
  friend class FakeP2P;
  struct Fault {
    int after = 0;
    bool error = false;
  };
  enum class Link { ok, silent, error };
  // Called with m_ held, once per message sent from a to b.
  Link on_send(int a, int b) {
    auto it = faults_.find({a, b});
    if (it == faults_.end()) return Link::ok;
    if (it->second.after > 0) {
      --it->second.after;
      return Link::ok;
    }
    return it->second.error ? Link::error : Link::silent;
  }
  Link state(int a, int b) {
    auto it = faults_.find({a, b});
    if (it == faults_.end() || it->second.after > 0) return Link::ok;
    return it->second.error ? Link::error : Link::silent;
  }

  int n_;
  std::vector<std::string> placement_;
  std::mutex m_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> mail_;  // (dst, src, tag)
  std::map<std::pair<int, int>, Fault> faults_;
  std::map<int, uint64_t> sent_;
};

class FakeP2P final : public PointToPoint {
 public:
  FakeP2P(FakeNet& net, int rank, unsigned seed = 1) : net_(net), rank_(rank), rng_(seed * 7919U + rank) {}
  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return net_.size(); }
  [[nodiscard]] const std::vector<std::string>& placement() const override { return net_.placement(); }

  Result<Request> isend(std::span<const std::byte> buf, int dest, int tag) override {
    if (dest < 0 || dest >= size() || tag < 0 || tag > kMaxTag)
      return stage_error(Errc::bad_message, "isend");
    Req q{true, dest, tag, {}, Req::State::ready};
    {
      const std::lock_guard lock(net_.m_);
      switch (net_.on_send(rank_, dest)) {
        case FakeNet::Link::ok:
          net_.mail_[{dest, rank_, tag}].emplace_back(buf.begin(), buf.end());
          net_.sent_[rank_] += buf.size();
          break;
        case FakeNet::Link::silent:
          q.state = Req::State::never;
          break;
        case FakeNet::Link::error:
          q.state = Req::State::error;
          break;
      }
    }
    return add(std::move(q));
  }

  Result<Request> irecv(std::span<std::byte> buf, int source, int tag) override {
    if (source < 0 || source >= size() || tag < 0 || tag > kMaxTag)
      return stage_error(Errc::bad_message, "irecv");
    return add(Req{false, source, tag, buf, Req::State::ready});
  }

  Result<bool> test(Request r) override {
    if (r < 0 || static_cast<size_t>(r) >= reqs_.size() || !reqs_[static_cast<size_t>(r)].live)
      return stage_error(Errc::bad_message, "test: no such request");
    Req& q = reqs_[static_cast<size_t>(r)];
    if (q.state == Req::State::error) {
      q.live = false;
      return stage_error(Errc::comm_failed, "fake link failed");
    }
    if (q.state == Req::State::never || coin(rng_) == 0) return false;
    if (q.send) {
      q.live = false;
      return true;
    }
    const std::lock_guard lock(net_.m_);
    if (net_.state(q.peer, rank_) == FakeNet::Link::error) {
      q.live = false;
      return stage_error(Errc::comm_failed, "fake link failed");
    }
    auto it = net_.mail_.find({rank_, q.peer, q.tag});
    if (it == net_.mail_.end() || it->second.empty()) return false;
    std::vector<std::byte> msg = std::move(it->second.front());
    it->second.pop_front();
    q.live = false;
    if (msg.size() != q.buf.size()) return stage_error(Errc::bad_message, "fake: message size mismatch");
    if (!msg.empty()) std::memcpy(q.buf.data(), msg.data(), msg.size());
    return true;
  }

  void cancel(Request r) noexcept override {
    if (r >= 0 && static_cast<size_t>(r) < reqs_.size()) {
      reqs_[static_cast<size_t>(r)].live = false;
      ++cancelled_;
    }
  }

  [[nodiscard]] int live_requests() const {
    int n = 0;
    for (const auto& q : reqs_) n += q.live ? 1 : 0;
    return n;
  }
  [[nodiscard]] int cancelled() const { return cancelled_; }

 private:
  struct Req {
    bool send = false;
    int peer = -1;
    int tag = 0;
    std::span<std::byte> buf;
    enum class State { ready, never, error } state = State::ready;
    bool live = true;
  };
  Result<Request> add(Req q) {
    for (size_t i = 0; i < reqs_.size(); ++i)
      if (!reqs_[i].live) {
        reqs_[i] = q;
        return static_cast<Request>(i);
      }
    reqs_.push_back(q);
    return static_cast<Request>(reqs_.size() - 1);
  }

  FakeNet& net_;
  int rank_;
  std::mt19937 rng_;
  std::uniform_int_distribution<int> coin{0, 1};
  std::vector<Req> reqs_;
  int cancelled_ = 0;
};

// `n` bytes of a seeded random pattern: what a broadcast's root sends.
inline std::vector<std::byte> pattern(size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 g(seed);
  for (auto& b : v) b = static_cast<std::byte>(g());
  return v;
}

}  // namespace stage::testing
