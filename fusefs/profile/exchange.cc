// The profiles' exchange at unmount (exchange.h).
#include "fusefs/profile/exchange.h"

#include <spdlog/spdlog.h>

#include <optional>
#include <thread>

#include "fusefs/profile/recorder.h"

namespace stagefs {

namespace {

using Clock = std::chrono::steady_clock;
// Tags of their own: no transfer runs any more, but the stream's tags are the low ones.
constexpr int kTagLength = 32001;
constexpr int kTagData = 32002;

// Polls r until it completes, fails or the deadline passes (then cancels it): true if it
// completed.
bool wait(stage::PointToPoint& p2p, stage::PointToPoint::Request r, Clock::time_point deadline, bool& clean) {
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    auto done = p2p.test(r);
    if (!done) {
      spdlog::debug("profile exchange: {}", done.error().message);
      return false;
    }
    if (*done) return true;
    if (Clock::now() >= deadline) {
      p2p.cancel(r);
      clean = false;
      return false;
    }
    std::this_thread::sleep_for(pause);  // a bounded poll: the exchange is not on a hot path
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

// The profile a child sends, or nullopt (nothing in time, or nothing usable).
std::optional<Profile> receive(stage::PointToPoint& p2p, int child, Clock::time_point deadline, bool& clean) {
  uint64_t len = 0;
  auto r = p2p.irecv(std::as_writable_bytes(std::span(&len, 1)), child, kTagLength);
  if (!r || !wait(p2p, *r, deadline, clean)) return std::nullopt;
  if (len == 0 || len > kMaxProfileBytes) return std::nullopt;
  std::string data(len, '\0');
  r = p2p.irecv(std::as_writable_bytes(std::span(data.data(), data.size())), child, kTagData);
  if (!r || !wait(p2p, *r, deadline, clean)) return std::nullopt;
  auto p = decode_profile(std::as_bytes(std::span(data.data(), data.size())));
  if (!p) {
    spdlog::warn("profile from rank {}: {}", child, p.error().message);
    return std::nullopt;
  }
  return std::move(p.value());
}

void send(stage::PointToPoint& p2p, const Profile& p, int parent, Clock::time_point deadline, bool& clean) {
  std::string data = encode_profile(p);
  uint64_t len = data.size() <= kMaxProfileBytes ? data.size() : 0;
  auto a = p2p.isend(std::as_bytes(std::span(&len, 1)), parent, kTagLength);
  if (!a || !wait(p2p, *a, deadline, clean) || len == 0) return;
  auto b = p2p.isend(std::as_bytes(std::span(data.data(), data.size())), parent, kTagData);
  if (b) wait(p2p, *b, deadline, clean);
}

}  // namespace

GatherResult gather_profiles(stage::PointToPoint* p2p, Profile mine, std::chrono::milliseconds budget) {
  GatherResult out;
  out.merged = std::move(mine);
  if (p2p == nullptr || p2p->size() < 2) return out;
  const int rank = p2p->rank(), n = p2p->size();
  int levels = 0;
  while ((1 << levels) < n) ++levels;
  const auto start = Clock::now();
  // Level s ends at its share of the budget: a child's own subtree is merged before its
  // parent stops waiting for it (nodes leave the group's last announcement within moments).
  auto deadline = [&](int s) { return start + budget * (s + 1) / (levels + 1); };
  for (int s = 0; s < levels; ++s) {
    const int step = 1 << s;
    if ((rank & step) != 0) {
      send(*p2p, out.merged, rank - step, deadline(s), out.clean);
      break;
    }
    if (rank + step >= n) continue;
    auto theirs = receive(*p2p, rank + step, deadline(s), out.clean);
    if (!theirs) {
      ++out.missing;
      continue;
    }
    std::vector<Profile> both;
    both.push_back(std::move(out.merged));
    both.push_back(std::move(*theirs));
    out.merged = merge_profiles(std::move(both));
  }
  return out;
}

}  // namespace stagefs
