// ThreadControlPlane: the fake side of the ControlPlane seam for N ranks that are N threads
// of one process (as ThreadComm is for the data plane). Requests travel as encoded bytes
// (decode_message() checks them, as the MPI side does) in one queue to rank 0; announcements
// are one log that every rank reads in order, at its own pace. At most one announcement may be
// outstanding: announce() while the coordinator has not yet polled the previous one fails the
// test, as it would break MPI's ordering of non-blocking collectives.
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "fusefs/group/control.h"

namespace stagefs::testing {

struct ControlWorld {
  std::mutex m;
  std::deque<std::string> requests;  // encoded, to rank 0
  std::vector<std::string> log;      // encoded announcements, in order
};

class ThreadControlPlane final : public ControlPlane {
 public:
  ThreadControlPlane(ControlWorld& w, int rank) : w_(w), rank_(rank) {}
  [[nodiscard]] bool is_coordinator() const override { return rank_ == 0; }
  stage::Status send_request(const Message& m) override {
    EXPECT_FALSE(is_coordinator());
    std::lock_guard lk(w_.m);
    w_.requests.push_back(encode_message(m));
    return {};
  }
  stage::Result<std::optional<Message>> poll_request() override {
    std::string bytes;
    {
      std::lock_guard lk(w_.m);
      if (w_.requests.empty()) return std::optional<Message>();
      bytes = std::move(w_.requests.front());
      w_.requests.pop_front();
    }
    auto m = decode(bytes);
    if (!m) return m.error();
    return std::optional<Message>(std::move(*m));
  }
  stage::Status announce(const Message& m) override {
    EXPECT_TRUE(is_coordinator());
    EXPECT_FALSE(outstanding_) << "two announcements outstanding";
    outstanding_ = true;
    std::lock_guard lk(w_.m);
    w_.log.push_back(encode_message(m));
    return {};
  }
  stage::Result<std::optional<Message>> poll_announcement() override {
    std::string bytes;
    {
      std::lock_guard lk(w_.m);
      if (next_ == w_.log.size()) return std::optional<Message>();
      bytes = w_.log[next_++];
    }
    outstanding_ = false;
    auto m = decode(bytes);
    if (!m) return m.error();
    return std::optional<Message>(std::move(*m));
  }

 private:
  static stage::Result<Message> decode(const std::string& s) {
    return decode_message(std::as_bytes(std::span(s.data(), s.size())));
  }
  ControlWorld& w_;
  int rank_;
  size_t next_ = 0;           // announcements this rank has read
  bool outstanding_ = false;  // coordinator: announced, not yet polled back
};

}  // namespace stagefs::testing
