#include "fusefs/coordinator.h"

namespace stagefs {

void Coordinator::on_request(const Message& m) {
  ++stats_.requests;
  if (shutdown_queued_) return;  // answered by the shutdown announcement
  if (m.type == MsgType::shutdown) {
    shutdown_queued_ = true;  // before any further transfer
    return;
  }
  Key key{m.type, m.path};
  if (auto it = announced_id_.find(key); it != announced_id_.end() && m.id < it->second) {
    ++stats_.already_answered;  // sent before its node saw the transfer that answers it
    return;
  }
  if (!queued_.insert(key).second) {
    ++stats_.merged;
    return;
  }
  queue_.push_back(std::move(key));
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
    Key key = std::move(queue_.front());
    queue_.pop_front();
    queued_.erase(key);
    m = Message{key.first, next_id_++, key.second};
    announced_id_[std::move(key)] = m.id;
    ++stats_.announced;
    if (m.type == MsgType::batch) ++stats_.batches;
  }
  outstanding_ = true;
  return m;
}

void Coordinator::on_announced(const Message& /*m*/) {
  outstanding_ = false;
}

}  // namespace stagefs
