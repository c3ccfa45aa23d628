// ThreadComm: the fake side of the Comm seam. N ranks are N threads of one process sharing a
// World; collectives meet at a std::barrier. Faults: corrupt one byte of the n-th broadcast
// a given rank receives (to prove chunk CRCs catch it). Collectives must be called by all
// ranks in the same order, as with MPI; a rank that skips one deadlocks the test (ctest's
// timeout catches it).
#pragma once

#include <barrier>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "bcast/comm/comm.h"

namespace stage::testing {

class World {
 public:
  explicit World(int n) : n_(n), bar_(n), slots_(static_cast<size_t>(n)), strs_(static_cast<size_t>(n)) {}
  [[nodiscard]] int size() const { return n_; }
  std::barrier<>& bar() { return bar_; }
  std::vector<std::vector<std::byte>>& slots() { return slots_; }
  std::vector<std::string>& strs() { return strs_; }
  // Fault: the `nth` bcast received by `rank` (0-based, counting only payloads > 64 bytes) gets
  // one byte flipped.
  int corrupt_rank = -1;
  int corrupt_nth = -1;

 private:
  int n_;
  std::barrier<> bar_;
  std::vector<std::vector<std::byte>> slots_;
  std::vector<std::string> strs_;
};

class ThreadComm final : public Comm {
 public:
  ThreadComm(World& w, int rank) : w_(w), rank_(rank) {}
  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return w_.size(); }

  Status bcast(std::span<std::byte> buf, int root) override {
    auto& slot = w_.slots()[static_cast<size_t>(root)];
    if (rank_ == root) slot.assign(buf.begin(), buf.end());
    w_.bar().arrive_and_wait();
    if (rank_ != root) {
      std::memcpy(buf.data(), slot.data(), buf.size());
      if (buf.size() > 64 && rank_ == w_.corrupt_rank && big_bcasts_++ == w_.corrupt_nth)
        buf[buf.size() / 2] ^= std::byte{1};
    }
    w_.bar().arrive_and_wait();
    return {};
  }
  Status allreduce_max(std::span<int64_t> v) override {
    return reduce(v, [](int64_t a, int64_t b) { return a > b ? a : b; });
  }
  Status allreduce_sum(std::span<int64_t> v) override {
    return reduce(v, [](int64_t a, int64_t b) { return a + b; });
  }
  Result<std::vector<std::string>> gather(const std::string& mine, int root) override {
    w_.strs()[static_cast<size_t>(rank_)] = mine;
    w_.bar().arrive_and_wait();
    std::vector<std::string> out;
    if (rank_ == root) out = w_.strs();
    w_.bar().arrive_and_wait();
    return out;
  }
  Status barrier() override {
    w_.bar().arrive_and_wait();
    return {};
  }
  // The point-to-point seam for the data path: none unless a test attaches one (FakeP2P).
  PointToPoint* point_to_point() override { return p2p_; }
  void attach(PointToPoint* p) { p2p_ = p; }

 private:
  Status reduce(std::span<int64_t> v, const std::function<int64_t(int64_t, int64_t)>& op) {
    auto& mine = w_.slots()[static_cast<size_t>(rank_)];
    mine.assign(reinterpret_cast<std::byte*>(v.data()), reinterpret_cast<std::byte*>(v.data() + v.size()));
    w_.bar().arrive_and_wait();
    for (int r = 0; r < w_.size(); ++r) {
      if (r == rank_) continue;
      const auto* other = reinterpret_cast<const int64_t*>(w_.slots()[static_cast<size_t>(r)].data());
      for (size_t i = 0; i < v.size(); ++i) v[i] = op(v[i], other[i]);
    }
    w_.bar().arrive_and_wait();
    return {};
  }
  World& w_;
  int rank_;
  int big_bcasts_ = 0;
  PointToPoint* p2p_ = nullptr;
};

// Runs fn(comm) on n threads, one per rank, and waits for all.
inline void run_ranks(World& w, const std::function<void(ThreadComm&)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < w.size(); ++r)
    ts.emplace_back([&w, &fn, r] {
      ThreadComm c(w, r);
      fn(c);
    });
  for (auto& t : ts) t.join();
}

}  // namespace stage::testing
