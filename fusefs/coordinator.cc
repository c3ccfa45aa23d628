#include "fusefs/coordinator.h"

#include <algorithm>
#include <utility>

namespace stagefs {

void Coordinator::on_request(const Message& m) {
  ++stats_.requests;
  if (shutdown_queued_) return;  // answered by the shutdown announcement
  if (m.type == MsgType::batch_nested || m.type == MsgType::batch_prefetch) return;  // announcements' types only
  if (m.type == MsgType::shutdown) {
    shutdown_queued_ = true;  // before any further transfer; no prefetch is announced after it
    later_.clear();
    later_set_.clear();
    return;
  }
  if (m.type == MsgType::batch) note_batch_request(m.path);
  Key key{m.type, m.path};
  if (auto it = announced_id_.find(key); it != announced_id_.end() && m.id < it->second) {
    ++stats_.already_answered;  // sent before its node saw the transfer that answers it
    return;
  }
  if (!queued_.insert(key).second) {
    ++stats_.merged;
    return;
  }
  // Promoted: its entry in later_ is skipped when reached (no search of a long queue).
  if (m.type == MsgType::batch && later_set_.erase(m.path) > 0) ++stats_.promoted;
  queue_.push_back(std::move(key));
}

void Coordinator::note_batch_request(const std::string& dir) {
  if (!walks_on_ || dir.empty()) return;  // the root has no siblings
  std::string parent = batch_dir_of(dir);
  if (walked_.contains(parent)) return;
  auto [it, fresh] = first_child_.try_emplace(parent, dir);
  if (fresh || it->second == dir) return;
  first_child_.erase(it);
  walked_.insert(parent);
  new_walks_.push_back(std::move(parent));
  ++stats_.walks;
}

std::vector<std::string> Coordinator::take_walks() {
  return std::exchange(new_walks_, {});
}

void Coordinator::prefetch(const std::string& dir) {
  if (shutdown_queued_) return;
  Key key{MsgType::batch, dir};
  if (announced_id_.contains(key) || queued_.contains(key) || !later_set_.insert(dir).second) return;
  later_.push_back(dir);
}

size_t Coordinator::drop_prefetches() {
  const size_t n = later_set_.size();
  later_.clear();
  later_set_.clear();
  stats_.prefetch_dropped += n;
  return n;
}

std::optional<Message> Coordinator::next_announcement() {
  if (outstanding_ || shutdown_announced_) return std::nullopt;
  Message m;
  if (running_) {  // only a batch, nested in a single file's transfer, one at a time
    if (!nesting_ || running_->type != MsgType::materialize || nested_open_ != 0 || shutdown_queued_)
      return std::nullopt;
    auto it = std::find_if(queue_.begin(), queue_.end(), [](const Key& k) { return k.first == MsgType::batch; });
    if (it == queue_.end()) return std::nullopt;
    Key key = std::move(*it);
    queue_.erase(it);
    queued_.erase(key);
    m = Message{MsgType::batch_nested, next_id_++, key.second};
    announced_id_[std::move(key)] = m.id;
    nested_open_ = m.id;
    ++stats_.announced;
    ++stats_.batches;
    ++stats_.nested;
  } else if (shutdown_queued_) {
    m = Message{MsgType::shutdown, next_id_++, {}};
    shutdown_announced_ = true;
    queue_.clear();
    queued_.clear();
  } else if (queue_.empty() && !later_set_.empty()) {  // nothing waits: the next prefetched batch
    while (!later_set_.contains(later_.front())) later_.pop_front();  // promoted meanwhile
    Key key{MsgType::batch, std::move(later_.front())};
    later_.pop_front();
    later_set_.erase(key.second);
    m = Message{MsgType::batch_prefetch, next_id_++, key.second};
    announced_id_[std::move(key)] = m.id;
    ++stats_.announced;
    ++stats_.batches;
    ++stats_.prefetched;
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

void Coordinator::on_started(const Message& m) {
  if (m.type != MsgType::batch_nested) running_ = m;
}

void Coordinator::on_finished(const Message& m) {
  if (m.type == MsgType::batch_nested) {
    if (nested_open_ == m.id) nested_open_ = 0;
  } else {
    running_.reset();
  }
}

}  // namespace stagefs
