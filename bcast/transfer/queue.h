// A small bounded-by-construction blocking queue that can be closed: pop() returns nullopt once
// the queue is closed and empty, so pipeline threads stop without extra flags. Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

namespace stage {

template <class T>
class BlockingQueue {
 public:
  void push(T v) {
    {
      std::lock_guard lk(m_);
      q_.push_back(std::move(v));
    }
    cv_.notify_one();
  }
  std::optional<T> pop() {
    std::unique_lock lk(m_);
    cv_.wait(lk, [&] { return !q_.empty() || closed_; });
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    return v;
  }
  // pop(), giving up after `d` (nullopt: nothing came, or closed and empty).
  template <class Duration>
  std::optional<T> pop_for(Duration d) {
    std::unique_lock lk(m_);
    cv_.wait_for(lk, d, [&] { return !q_.empty() || closed_; });
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    return v;
  }
  // The front element if there is one, without waiting.
  std::optional<T> try_pop() {
    const std::lock_guard lk(m_);
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    return v;
  }
  void close() {
    {
      std::lock_guard lk(m_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<T> q_;
  bool closed_ = false;
};

}  // namespace stage
