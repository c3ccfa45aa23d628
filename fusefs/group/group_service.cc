// GroupService (group.h): the service thread's loop: requests out, announcements in and run,
// and the nested batches the engine asks for inside a transfer.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "fusefs/base/log.h"
#include "fusefs/group/group.h"

namespace stagefs {

stage::Status GroupService::control_failed(const stage::Error& e, const char* what) {
  log_error("{}: {} failed: {}", stage::host_name(), what, e.message);
  Ready ready;
  {
    std::lock_guard lk(m_);
    state_ = GroupState::broken;
    ready = fail_all_locked(e);
  }
  run_ready(ready);
  return e;
}

// This node's new first opens (and its shutdown) go to the coordinator: through the control
// plane, or straight into the Coordinator on its own node.
stage::Result<bool> GroupService::forward_local() {
  std::vector<Message> msgs;
  bool want_shutdown = false;
  {
    std::lock_guard lk(m_);
    std::deque<Message> keep;
    for (auto& ask : outbox_) {
      const Key key{ask.type, ask.path};
      if (!waits_.contains(key)) continue;  // a transfer answered it already
      // A transfer of that key runs here now (this is the engine's copy loop calling): it
      // answers the open when it ends. A request now would carry that transfer's id, which
      // the coordinator cannot tell from a need that came after it (a second transfer).
      if (std::find(running_.begin(), running_.end(), key) != running_.end()) {
        keep.push_back(std::move(ask));
      } else {
        ask.id = last_seen_id_;
        msgs.push_back(std::move(ask));
      }
    }
    outbox_ = std::move(keep);
    want_shutdown = shutdown_requested_ && !shutdown_sent_;
  }
  if (want_shutdown) msgs.push_back(Message{MsgType::shutdown, 0, {}});
  for (const auto& m : msgs) {
    if (coord_)
      coord_->on_request(m);
    else if (auto st = ctl_.send_request(m); !st)
      return st.error();
  }
  shutdown_sent_ = shutdown_sent_ || want_shutdown;
  return !msgs.empty();
}

// Coordinator's node: every rank's requests into the Coordinator, its next decision out.
stage::Result<bool> GroupService::coordinate() {
  bool busy = false;
  for (;;) {
    auto r = ctl_.poll_request();
    if (!r) {
      log_warn("{}", r.error().message);  // malformed request: dropped
      continue;
    }
    if (!r->has_value()) break;
    busy = true;
    coord_->on_request(**r);
  }
  for (auto& [a, next, spent] : std::exchange(continuations_, {})) {
    if (coord_->continue_batch(a, next, spent)) continue;
    {
      std::lock_guard lk(m_);
      ++stats_.budget_stops;
      epoch_cv_.notify_all();
    }
    log_info(
        "batch {}/: {} small file(s) ({} bytes charged) listed for the open that asked for it; the rest "
        "is staged at its own opens (--prefetch-max-files, --prefetch-max-bytes)",
        a.path, spent.files, spent.bytes);
  }
  expand_walks();
  if (auto next = coord_->next_announcement()) {
    if (auto st = ctl_.announce(*next); !st) return st.error();
    busy = true;
  }
  return busy;
}

void GroupService::expand_walks() {
  const auto walks = coord_->take_walks();
  if (!walks.empty()) {
    std::lock_guard lk(m_);
    stats_.walks += walks.size();
  }
  for (const std::string& parent : walks) {
    // The budget counts the directories queued: the two asked for may be among those listed.
    const size_t budget =
        cfg_.batches.prefetch_max_dirs > 0 ? static_cast<size_t>(cfg_.batches.prefetch_max_dirs) : SIZE_MAX;
    auto dirs = src_.list_dirs(parent, budget > SIZE_MAX - 2 ? budget : budget + 2);
    if (!dirs) {
      spdlog::debug("walk of {}/: {}", parent, dirs.error().message);
      continue;
    }
    size_t queued = 0;
    for (const std::string& name : *dirs)
      if (queued < budget && coord_->prefetch(stage::join_path(parent, name))) ++queued;
    {
      std::lock_guard lk(m_);
      stats_.prefetch_queued += queued;
    }
    log_info("readers walk {}/: staging the small files of {} of its subdirectories in the background",
             parent, queued);
  }
}

stage::Result<std::optional<Message>> GroupService::receive() {
  auto a = ctl_.poll_announcement();
  if (a && a->has_value() && coord_) coord_->on_announced(**a);
  return a;
}

bool GroupService::run_announcement(const Message& m) {
  // From now on this node's requests say they saw m: an open that starts waiting before m
  // ends here is answered by m; one before m started (a nested batch's announcement may
  // arrive well before it runs) still asks, and the coordinator drops what m answers.
  if (is_batch(m.type)) {
    std::lock_guard lk(m_);  // before this node's requests say they saw m (see wait_for)
    batch_running_.insert(m.path);
  }
  last_seen_id_ = std::max(last_seen_id_, m.id);
  running_.emplace_back(key_type(m.type), m.path);
  if (coord_) coord_->on_started(m);
  stage::Comm& comm = is_nested(m.type) && nested_ != nullptr ? *nested_ : data_;
  const Ran ran = is_file(m.type) ? run_transfer(m, comm) : run_batch(m, comm);
  if (coord_) {
    coord_->charge(m, ran.cost);
    coord_->on_finished(m);
  }
  running_.pop_back();
  return ran.data_ok;
}

// Inside a transfer (the engine's copy loop, service thread): what run() does between
// transfers, except running them. An announcement that arrives now can only be a nested
// batch (the coordinator announces nothing else while a transfer runs): it waits for its mark.
stage::Status GroupService::nest_poll() {
  auto fwd = forward_local();
  if (!fwd) return fwd.error();
  if (coord_) {
    auto c = coordinate();
    if (!c) return c.error();
  }
  auto a = receive();
  if (!a) return a.error();
  if (a->has_value()) {
    deferred_.push_back(std::move(**a));
    mark_progress();
  }
  return {};
}

// The rank that reads (the source rank, or a seed): a mark for the nested batch announced
// last, once. Every rank receives every announcement, so any rank can place the mark.
uint32_t GroupService::nest_mark() {
  for (const Message& m : deferred_)
    if (is_nested(m.type) && m.id > marked_) {
      marked_ = m.id;
      return nest_token(m.id);
    }
  return 0;
}

// Every rank, at the mark: the nested batch runs now, on the nested Comm. Its announcement
// may still be on its way (the control plane and the stream are separate paths): wait for
// it, within the stall timeout.
stage::Status GroupService::nest_run(uint32_t token) {
  auto first_nested = [&] {
    return std::find_if(deferred_.begin(), deferred_.end(),
                        [](const Message& m) { return is_nested(m.type); });
  };
  const auto t0 = Clock::now();
  auto it = first_nested();
  while (it == deferred_.end()) {
    auto a = receive();
    if (!a) return a.error();
    if (a->has_value()) {
      deferred_.push_back(std::move(**a));
      it = first_nested();
      continue;
    }
    if (cfg_.stall_timeout.count() > 0 && Clock::now() - t0 > cfg_.stall_timeout)
      return stage::stage_error(stage::Errc::timed_out, "the announcement of a nested transfer never came");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (nest_token(it->id) != token)
    return stage::stage_error(stage::Errc::bad_message,
                              "a mark names nested transfer " + std::to_string(token) +
                                  ", the next one announced is " + std::to_string(it->id));
  const Message m = std::move(*it);
  deferred_.erase(it);
  if (!run_announcement(m))
    return stage::stage_error(
        stage::Errc::comm_broken,
        "the nested transfer of " + (m.path.empty() ? std::string("/") : m.path) + " broke");
  return {};
}

stage::Status GroupService::run() {
  auto idle = std::chrono::milliseconds(1);
  for (;;) {
    auto fwd = forward_local();
    if (!fwd) return control_failed(fwd.error());
    bool busy = *fwd;
    if (coord_) {
      auto c = coordinate();
      if (!c) return control_failed(c.error());
      busy = busy || *c;
    }
    auto next = next_announcement();
    if (!next) return control_failed(next.error());
    if (*next) {
      busy = true;
      mark_progress();
      if ((*next)->type == MsgType::shutdown) return shut_down();
      if (!run_announcement(**next)) return data_path_broke(**next);
    }
    if (busy) {
      idle = std::chrono::milliseconds(1);
      continue;
    }
    // Idle: sleep until a local request arrives or the poll interval passes (backing off to
    // idle_poll), so remote requests and announcements are still noticed.
    std::unique_lock lk(m_);
    service_cv_.wait_for(lk, idle,
                         [&] { return !outbox_.empty() || (shutdown_requested_ && !shutdown_sent_); });
    idle = std::min(idle * 2, cfg_.idle_poll);
  }
}

// One that arrived during the last transfer and did not run nested in it, else a new one.
stage::Result<std::optional<Message>> GroupService::next_announcement() {
  if (deferred_.empty()) return receive();
  std::optional<Message> next = std::move(deferred_.front());
  deferred_.pop_front();
  return next;
}

// Every node agreed to shut down: the waiting opens get ESHUTDOWN.
stage::Status GroupService::shut_down() {
  Ready ready;
  {
    std::lock_guard lk(m_);
    state_ = GroupState::shut_down;
    ready = fail_all_locked(stage::sys_error(ESHUTDOWN, "materialize (mount group shut down)"));
  }
  run_ready(ready);
  return {};
}

// The ranks may no longer be in step: no MPI call may follow. The group is broken (later cache
// misses fail at once or go to the source; cached files are still served) and this thread
// waits, without MPI, for the mount to be shut down.
stage::Status GroupService::data_path_broke(const Message& m) {
  (void)control_failed(stage::stage_error(stage::Errc::comm_broken,
                                          "the mount group stops transferring (the broadcast of " +
                                              (m.path.empty() ? std::string("/") : m.path) + " broke)"),
                       "data path");
  std::unique_lock lk(m_);
  service_cv_.wait(lk, [&] { return shutdown_requested_; });
  return {};
}

}  // namespace stagefs
