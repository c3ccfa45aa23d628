#include "fusefs/coordinator.h"

namespace stagefs {

void Coordinator::on_request(const Message& m) {
  ++stats_.requests;
  if (shutdown_queued_) return;  // answered by the shutdown announcement
  if (m.type == MsgType::shutdown) {
    shutdown_queued_ = true;  // before any further transfer
    return;
  }
  if (auto it = announced_id_.find(m.path); it != announced_id_.end() && m.id < it->second) {
    ++stats_.already_answered;  // sent before its node saw the transfer that answers it
    return;
  }
  if (!queued_.insert(m.path).second) {
    ++stats_.merged;
    return;
  }
  queue_.push_back(m.path);
}

std::optional<Message> Coordinator::next_announcement() {
  if (outstanding_ || shutdown_announced_) return std::nullopt;
  Message m;
  if (shutdown_queued_) {
    m = Message{MsgType::shutdown, next_id_++, {}};
    shutdown_announced_ = true;
    queue_.clear();
    queued_.clear();
  } else {
    if (queue_.empty()) return std::nullopt;
    m = Message{MsgType::materialize, next_id_++, std::move(queue_.front())};
    queue_.pop_front();
    queued_.erase(m.path);
    announced_id_[m.path] = m.id;
    ++stats_.announced;
  }
  outstanding_ = true;
  return m;
}

void Coordinator::on_announced(const Message& /*m*/) {
  outstanding_ = false;
}

}  // namespace stagefs
