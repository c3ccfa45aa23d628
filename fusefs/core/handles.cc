#include "fusefs/core/handles.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

namespace stagefs {

struct HandleLimits::Slot::State {
  std::mutex m;
  std::map<uint32_t, uint64_t> by_uid;  // handles of users other than root
  uint64_t descriptors = 0;             // file handles of every user
};

HandleLimits::HandleLimits(Config cfg) : cfg_(cfg), state_(std::make_shared<Slot::State>()) {}

HandleLimits::Slot& HandleLimits::Slot::operator=(Slot&& o) noexcept {
  if (this != &o) {
    reset();
    state_ = std::move(o.state_);
    uid_ = o.uid_;
    descriptor_ = o.descriptor_;
  }
  return *this;
}

void HandleLimits::Slot::reset() {
  if (!state_) return;
  {
    std::lock_guard lk(state_->m);
    if (uid_ != 0)
      if (auto it = state_->by_uid.find(uid_); it != state_->by_uid.end() && --it->second == 0)
        state_->by_uid.erase(it);
    if (descriptor_) --state_->descriptors;
  }
  state_.reset();
}

stage::Result<HandleLimits::Slot> HandleLimits::take(uint32_t uid, bool descriptor) {
  std::lock_guard lk(state_->m);
  const uint64_t mine = uid == 0 ? 0 : state_->by_uid.count(uid) ? state_->by_uid[uid] : 0;
  if (uid != 0 && cfg_.per_user > 0 && mine >= cfg_.per_user)
    return stage::sys_error(EMFILE, "open: uid " + std::to_string(uid) + " holds " + std::to_string(mine) +
                                        " open files and directories on this mount, its limit "
                                        "(--max-open-per-user)");
  if (descriptor && cfg_.room > 0 && state_->descriptors >= cfg_.room)
    return stage::sys_error(ENFILE,
                            "open: the users of this mount hold " + std::to_string(state_->descriptors) +
                                " open files, all the descriptors the daemon gives them (the rest of "
                                "RLIMIT_NOFILE is its own); raise the hard limit (ulimit -Hn, LimitNOFILE)");
  Slot s;
  s.state_ = state_;
  s.uid_ = uid;
  s.descriptor_ = descriptor;
  if (uid != 0) ++state_->by_uid[uid];
  if (descriptor) ++state_->descriptors;
  return s;
}

uint64_t HandleLimits::held(uint32_t uid) const {
  std::lock_guard lk(state_->m);
  auto it = state_->by_uid.find(uid);
  return it == state_->by_uid.end() ? 0 : it->second;
}

uint64_t HandleLimits::descriptors() const {
  std::lock_guard lk(state_->m);
  return state_->descriptors;
}

uint64_t raise_descriptor_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  rlim_t want = rl.rlim_max;
  if (want == RLIM_INFINITY) {  // the kernel caps descriptors at fs.nr_open
    uint64_t nr_open = 1 << 20;
    std::ifstream("/proc/sys/fs/nr_open") >> nr_open;
    want = nr_open;
  }
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want)
    return rl.rlim_cur == RLIM_INFINITY ? want : rl.rlim_cur;
  const rlimit raised{want, rl.rlim_max};
  return ::setrlimit(RLIMIT_NOFILE, &raised) == 0 ? want : rl.rlim_cur;
}

HandleLimits::Config descriptor_budget(uint64_t limit, uint64_t per_user, std::string& why_lowered) {
  const uint64_t reserve = std::min(std::max<uint64_t>(1024, limit / 8), limit / 2);
  HandleLimits::Config c;
  c.room = limit - reserve;
  const uint64_t share = std::max<uint64_t>(1, c.room / 4);
  c.per_user = per_user;
  why_lowered.clear();
  if (per_user == 0 || per_user > share) {
    c.per_user = share;
    why_lowered = "--max-open-per-user " +
                  (per_user == 0 ? std::string("0 (no limit)") : std::to_string(per_user)) + " lowered to " +
                  std::to_string(share) + ": the daemon's descriptor limit (RLIMIT_NOFILE " +
                  std::to_string(limit) + ") leaves " + std::to_string(c.room) +
                  " for users' open files; raise its hard limit (ulimit -Hn, LimitNOFILE) to allow more";
  }
  return c;
}

}  // namespace stagefs
