// GroupService (group.h): its life, the opens' requests and waits, the watchdog and the stats.
#include "fusefs/group/group.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "fusefs/base/log.h"

namespace stagefs {

GroupService::GroupService(stage::Comm& data, ControlPlane& ctl, stage::SourceReader& src,
                           stage::LocalStore& store, GroupConfig cfg, stage::Comm* nested)
    : data_(data),
      nested_(nested),
      ctl_(ctl),
      src_(src),
      store_(store),
      cfg_(std::move(cfg)),
      last_progress_(Clock::now()) {
  if (ctl_.is_coordinator()) {
    coord_.emplace();
    coord_->set_nesting(cfg_.batches.nested_batches && nested_ != nullptr);
    coord_->set_walks(cfg_.batches.prefetch_siblings && cfg_.small_file_size > 0);
    coord_->set_budget(cfg_.batches.prefetch_max_bytes, cfg_.batches.prefetch_max_files);
  }
  watchdog_ = std::thread([this] { watchdog(); });
}

GroupService::~GroupService() {
  Ready ready;
  {
    std::lock_guard lk(m_);
    stop_watchdog_ = true;
    ready = fail_all_locked(stage::sys_error(ESHUTDOWN, "materialize (mount is shutting down)"));
  }
  watchdog_cv_.notify_all();
  watchdog_.join();
  run_ready(ready);
}

namespace {
Message request(MsgType type, std::string path, const Want& want) {
  return Message{type, 0, std::move(path), want.uid, want.background ? kBackground : uint8_t{0}, {}, {}};
}
}  // namespace

void GroupService::materialize_async(const std::string& rel, const Want& want, Done done) {
  wait_for(request(MsgType::materialize, rel, want), want.may_evict, std::move(done));
}

void GroupService::materialize_small_async(const std::string& rel, uint64_t since, const Want& want,
                                           Done done) {
  if (cfg_.small_file_size == 0) return materialize_async(rel, want, std::move(done));
  std::string dir = batch_dir_of(rel);
  {
    std::unique_lock lk(m_);
    if (batch_failed_.contains(dir)) {
      lk.unlock();
      return materialize_async(rel, want, std::move(done));
    }
  }
  Message ask = request(MsgType::batch, std::move(dir), want);
  ask.from = rel.substr(rel.rfind('/') + 1);  // npos + 1 = 0: a file at the root
  wait_for(std::move(ask), want.may_evict, std::move(done), since);
}

void GroupService::materialize_live_async(const std::string& rel, const Want& want, Done done,
                                          LiveStarted on_live) {
  if (!cfg_.read_during_copy) return materialize_async(rel, want, std::move(done));
  wait_for(request(MsgType::materialize, rel, want), want.may_evict, std::move(done), UINT64_MAX,
           std::move(on_live));
}

// The transfer of rel runs here, its temporary file open: the opens waiting for it go on.
void GroupService::live_started(const std::string& rel) {
  std::vector<std::pair<LiveStarted, Done>> on_live;
  std::shared_ptr<LiveCopy> live;
  {
    std::lock_guard lk(m_);
    auto l = live_.find(rel);
    if (l == live_.end()) return;
    live = l->second;
    if (auto it = waits_.find(Key{MsgType::materialize, rel}); it != waits_.end())
      on_live = std::move(it->second->on_live);
  }
  for (auto& [e, d] : on_live) e(live);
}

uint64_t GroupService::epoch() const {
  std::lock_guard lk(m_);
  return epoch_;
}

bool GroupService::wait_for_epoch(uint64_t at_least, std::chrono::milliseconds timeout) const {
  std::unique_lock lk(m_);
  return epoch_cv_.wait_for(lk, timeout, [&] { return epoch_ >= at_least; });
}

bool GroupService::wait_for_budget_stops(uint64_t at_least, std::chrono::milliseconds timeout) const {
  std::unique_lock lk(m_);
  return epoch_cv_.wait_for(lk, timeout, [&] { return stats_.budget_stops >= at_least; });
}

bool GroupService::batch_running(const std::string& rel) const {
  const std::string dir = batch_dir_of(rel);
  std::lock_guard lk(m_);
  return batch_running_.contains(dir);
}

void GroupService::wait_for(Message ask, bool may_evict, Done done, uint64_t since, LiveStarted on_live) {
  const Key key{ask.type, ask.path};
  std::unique_lock lk(m_);
  const std::string& rel = key.second;
  if (on_live) {  // the copy is in progress here: no new request, go on with it
    if (auto l = live_.find(rel); l != live_.end() && l->second->ready()) {
      auto live = l->second;
      lk.unlock();
      return on_live(std::move(live));
    }
  }
  if (key.first == MsgType::batch) {
    // The directory's batch completed after the caller looked into the cache: that look may
    // have come just before the copy was published. Answered: the caller looks again.
    if (auto it = batch_done_.find(key.second); it != batch_done_.end() && it->second > since) {
      lk.unlock();
      return done({});
    }
  }
  if (state_ == GroupState::broken) {
    lk.unlock();
    return done(stage::stage_error(stage::Errc::comm_broken, "materialize", rel));
  }
  if (state_ == GroupState::shut_down || shutdown_requested_) {
    lk.unlock();
    return done(stage::sys_error(ESHUTDOWN, "materialize (mount is shutting down)", rel));
  }
  auto& slot = waits_[key];
  const bool running_here = key.first == MsgType::batch && batch_running_.contains(key.second);
  if (!slot) {  // first open of this file (batch) on this node: one request, shared by later opens
    slot = std::make_shared<Waiter>();
    slot->requested = Clock::now();
    slot->ask = std::move(ask);
    if (!running_here) ask_locked(slot->ask);
    watchdog_cv_.notify_all();
  } else if ((slot->ask.flags & kBackground) != 0 && (ask.flags & kBackground) == 0) {
    // An open joins a background wait (a replay's, a prefetch's): it asks as an open, so that
    // the coordinator moves the key ahead of the background queue.
    slot->ask = std::move(ask);
    if (!running_here) ask_locked(slot->ask);
  }
  slot->may_evict = slot->may_evict || may_evict;
  if (on_live)
    slot->on_live.emplace_back(std::move(on_live), std::move(done));
  else
    slot->callbacks.push_back(std::move(done));
}

// The stall rule for every waiting open, on a thread of its own.
void GroupService::watchdog() {
  std::unique_lock lk(m_);
  while (!stop_watchdog_) {
    // Armed while an open waits, or while a copy opened during its transfer runs (its reads may
    // wait for chunks: the same stall rule for them, checked every stall_timeout / 4).
    if ((waits_.empty() && live_.empty()) || state_ != GroupState::running) {
      watchdog_cv_.wait(lk);
      continue;
    }
    auto oldest = Clock::time_point::max();
    for (const auto& [rel, w] : waits_) oldest = std::min(oldest, w->requested);
    for (const auto& [rel, live] : live_)
      if (auto t = live->oldest_wait()) oldest = std::min(oldest, *t);
    if (oldest == Clock::time_point::max()) {  // only copies in progress, no read waits
      watchdog_cv_.wait_for(
          lk, std::max<std::chrono::milliseconds>(cfg_.stall_timeout / 4, std::chrono::milliseconds(10)));
      continue;
    }
    const auto deadline = std::max(oldest, last_progress_) + cfg_.stall_timeout;
    if (Clock::now() < deadline) {
      watchdog_cv_.wait_until(lk, deadline);
      continue;
    }
    const std::string rel =
        waits_.empty() ? (live_.empty() ? std::string("-") : live_.begin()->first)
        : waits_.begin()->first.first == MsgType::batch
            ? "the small files of " +
                  (waits_.begin()->first.second.empty() ? std::string("/") : waits_.begin()->first.second)
            : waits_.begin()->first.second;
    log_error("{}: no progress on {} for {} s: mount group marked broken", stage::host_name(), rel,
              std::chrono::duration<double>(cfg_.stall_timeout).count());
    state_ = GroupState::broken;
    Ready ready = fail_all_locked(stage::stage_error(stage::Errc::timed_out, "materialize", rel));
    lk.unlock();
    run_ready(ready);
    lk.lock();
  }
}

GroupService::Ready GroupService::fail_all_locked(const stage::Error& e) {
  Ready ready;
  for (auto& [rel, w] : waits_) {
    for (auto& cb : w->callbacks) ready.emplace_back(std::move(cb), e);
    for (auto& [on_live, cb] : w->on_live) ready.emplace_back(std::move(cb), e);
  }
  waits_.clear();
  outbox_.clear();
  // Reads waiting for chunks of a copy in progress fail too (EIO for what is missing): the
  // service thread may never come back from MPI to end it.
  for (auto& [rel, live] : live_)
    ready.emplace_back([live, why = e.code](const stage::Status&) { live->end(false, why); }, e);
  return ready;
}

void GroupService::run_ready(Ready& r) {
  for (auto& [cb, st] : r) cb(std::move(st));
  r.clear();
}

void GroupService::request_shutdown() {
  std::lock_guard lk(m_);
  shutdown_requested_ = true;
  service_cv_.notify_one();
}

GroupState GroupService::state() const {
  std::lock_guard lk(m_);
  return state_;
}

GroupStats GroupService::stats() const {
  std::lock_guard lk(m_);
  GroupStats s = stats_;
  s.waiting = waits_.size();
  if (!s.current.empty())
    s.current_seconds = std::chrono::duration<double>(Clock::now() - current_start_).count();
  return s;
}

void GroupService::mark_progress() {
  std::lock_guard lk(m_);
  last_progress_ = Clock::now();
}

stage::ProgressFn GroupService::transfer_progress() {
  return [this](uint64_t done, uint64_t total) {
    std::lock_guard lk(m_);
    last_progress_ = Clock::now();
    stats_.current_done = done;
    stats_.current_total = total;
  };
}

void GroupService::ask_locked(const Message& ask) {
  outbox_.push_back(ask);
  ++stats_.requests_sent;
  service_cv_.notify_one();
}

void GroupService::complete(const Key& key, const stage::Status& st) {
  std::vector<Done> cbs;
  {
    std::lock_guard lk(m_);
    ++epoch_;
    epoch_cv_.notify_all();
    if (key.first == MsgType::batch) batch_running_.erase(key.second);
    if (key.first == MsgType::batch && st.ok()) batch_done_[key.second] = epoch_;
    auto it = waits_.find(key);
    if (it == waits_.end()) return;
    cbs = std::move(it->second->callbacks);
    for (auto& [on_live, cb] : it->second->on_live) cbs.push_back(std::move(cb));
    waits_.erase(it);
  }
  for (auto& cb : cbs) cb(st);
}

}  // namespace stagefs
