#include "fusefs/group/coordinator.h"

#include <algorithm>
#include <utility>

namespace stagefs {

void Coordinator::on_request(const Message& m) {
  ++stats_.requests;
  if (shutdown_queued_) return;  // answered by the shutdown announcement
  if (m.type != MsgType::materialize && m.type != MsgType::batch && m.type != MsgType::shutdown)
    return;  // announcements' types only
  if (m.type == MsgType::shutdown) {
    shutdown_queued_ = true;  // before any further transfer; no prefetch is announced after it
    later_.clear();
    later_set_.clear();
    return;
  }
  const bool background = (m.flags & kBackground) != 0;
  if (m.type == MsgType::batch && !background) note_batch_request(m.path);
  Key key{m.type, m.path};
  if (auto it = announced_id_.find(key); it != announced_id_.end() && m.id < it->second) {
    ++stats_.already_answered;  // sent before its node saw the transfer that answers it
    return;
  }
  if (queued_.contains(key)) {
    ++stats_.merged;
    return;
  }
  Pending p;
  p.uid = m.uid;
  if (m.type == MsgType::batch) {
    p.from = m.from;
    p.until = m.until;
    p.flags = m.flags & kToEnd;
  }
  if (background) {
    if (!queue_later(std::move(key), std::move(p))) ++stats_.merged;
    return;
  }
  // Promoted: its entry in later_ is skipped when reached (no search of a long queue).
  if (later_set_.erase(key) > 0) ++stats_.promoted;
  enqueue(std::move(key), std::move(p));
}

bool Coordinator::queue_later(Key key, Pending p) {
  p.later_seq = ++later_seq_;
  const uint64_t seq = p.later_seq;
  if (!later_set_.emplace(key, std::move(p)).second) return false;
  later_.emplace_back(std::move(key), seq);
  return true;
}

void Coordinator::enqueue(Key key, Pending p) {
  auto& q = by_uid_[p.uid];
  if (q.empty()) {
    turns_.push_back(p.uid);
    uint64_t& tally = tally_[p.uid];  // nothing banked while it had nothing queued
    tally = std::max(tally, served_tally_);
  }
  q.push_back(key);
  queued_.emplace(std::move(key), std::move(p));
}

std::optional<Coordinator::Key> Coordinator::take_turn(bool batch_only) {
  // The uid with the lowest tally (the first in turn order among equals) that has something
  // to announce (with batch_only: a batch).
  auto best = turns_.end();
  std::deque<Key>::iterator pick;
  for (auto t = turns_.begin(); t != turns_.end(); ++t) {
    if (best != turns_.end() && tally_[*t] >= tally_[*best]) continue;
    auto& q = by_uid_[*t];
    auto it = batch_only
                  ? std::find_if(q.begin(), q.end(), [](const Key& k) { return k.first == MsgType::batch; })
                  : q.begin();
    if (it == q.end()) continue;
    best = t;
    pick = it;
  }
  if (best == turns_.end()) return std::nullopt;
  const uint32_t uid = *best;
  auto& q = by_uid_[uid];
  Key key = std::move(*pick);
  q.erase(pick);
  served_tally_ = tally_[uid];
  // This uid had its turn: among equal tallies, the others go first next time.
  turns_.erase(best);
  if (q.empty())
    by_uid_.erase(uid);
  else
    turns_.push_back(uid);
  return key;
}

void Coordinator::charge(const Message& a, uint64_t cost) {
  auto it = charge_to_.find(a.id);
  if (it == charge_to_.end()) return;
  uint64_t& tally = tally_[it->second];
  tally = cost > UINT64_MAX - tally ? UINT64_MAX : tally + cost;
  charge_to_.erase(it);
}

Message Coordinator::announce(MsgType type, const Key& key, const Pending& p) {
  Message m{type, next_id_++, key.second, p.uid, p.flags, p.from, p.until};
  announced_id_[key] = m.id;
  ++stats_.announced;
  if (is_batch(type)) ++stats_.batches;
  if (is_batch(type) && !(type == MsgType::batch_prefetch && p.walk))  // a sequence's slice
    sequence_of_[m.id] = {p.continued, p.spent};
  return m;
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

bool Coordinator::prefetch(const std::string& dir) {
  if (shutdown_queued_) return false;
  Key key{MsgType::batch, dir};
  if (announced_id_.contains(key) || queued_.contains(key) || later_set_.contains(key)) return false;
  Pending p;
  p.walk = batch_dir_of(dir);
  return queue_later(std::move(key), std::move(p));
}

bool Coordinator::continue_batch(const Message& a, const std::string& next, Spent spent) {
  if (shutdown_queued_ || !is_batch(a.type) || next.empty()) return true;
  // The rest of a's range: from next to where a's range ends (a whole circle from "" ends at
  // the last name).
  Pending p;
  p.uid = a.uid;
  p.from = next;
  p.until = a.until;
  if (a.until.empty() && ((a.flags & kToEnd) != 0 || a.from.empty()))
    p.flags = kToEnd;
  else if (a.until.empty())
    p.until = a.from;
  Key key{MsgType::batch, a.path};
  if (queued_.contains(key) || later_set_.contains(key)) return true;  // a slice of it is queued already
  const auto w = a.type == MsgType::batch_prefetch ? walk_of_.find(a.path) : walk_of_.end();
  if (w != walk_of_.end()) {
    if (over(walk_spent_[w->second])) return true;  // the walk's own budget (batch_ran said so)
    p.walk = w->second;
  } else {
    if (over(spent)) {
      ++stats_.budget_stopped;
      return false;
    }
    p.continued = true;
    p.spent = spent;
  }
  ++stats_.continued;
  if (a.type == MsgType::batch_prefetch) {  // a walk's, or a background request's: behind every request
    queue_later(std::move(key), std::move(p));
    return true;
  }
  enqueue(std::move(key), std::move(p));
  return true;
}

Coordinator::Tally Coordinator::batch_ran(const Message& a, uint64_t bytes, uint64_t files) {
  Tally t;
  const auto w = a.type == MsgType::batch_prefetch ? walk_of_.find(a.path) : walk_of_.end();
  if (w == walk_of_.end()) {  // a sequence's slice
    auto node = sequence_of_.extract(a.id);
    if (!node.empty()) t.spent = node.mapped().second;
    t.spent.bytes += bytes;
    t.spent.files += files;
    t.over = over(t.spent);
    return t;
  }
  const std::string walk = w->second;
  t.walk = true;
  Spent& s = walk_spent_[walk];
  const bool was_over = over(s);
  s.bytes += bytes;
  s.files += files;
  t.spent = s;
  t.over = over(s) && !was_over;  // this slice spent it
  if (!t.over) return t;
  // Over budget: this walk's prefetches still queued go (requests and other walks stay).
  t.dropped = std::erase_if(later_set_, [&](const auto& kv) { return kv.second.walk == walk; });
  stats_.prefetch_dropped += t.dropped;
  return t;
}

Coordinator::Spent Coordinator::left(const Spent& s) const {
  const auto rest = [](uint64_t budget, uint64_t used) {
    return budget == 0 ? UINT64_MAX : budget > used ? budget - used : 0;
  };
  return Spent{rest(budget_.bytes, s.bytes), rest(budget_.files, s.files)};
}

std::optional<Coordinator::Spent> Coordinator::slice_left(const Message& a) const {
  if (a.type == MsgType::batch_prefetch)
    if (auto w = walk_of_.find(a.path); w != walk_of_.end()) {
      auto s = walk_spent_.find(w->second);
      return left(s == walk_spent_.end() ? Spent{} : s->second);
    }
  auto q = sequence_of_.find(a.id);
  if (q == sequence_of_.end() || !q->second.first) return std::nullopt;
  return left(q->second.second);
}

size_t Coordinator::drop_prefetches() {
  // Only the walks' prefetches: a background request has an open (stagectl) waiting for it.
  const size_t n = std::erase_if(later_set_, [](const auto& kv) { return kv.second.walk.has_value(); });
  stats_.prefetch_dropped += n;
  return n;
}

std::optional<Message> Coordinator::next_announcement() {
  if (outstanding_ || shutdown_announced_) return std::nullopt;
  Message m;
  if (running_) {  // nested in a single file's transfer, one at a time: a batch, or anything
                   // in a background one
    const bool background = running_->type == MsgType::file_prefetch;
    if (!nesting_ || (running_->type != MsgType::materialize && !background) || nested_open_ != 0 ||
        shutdown_queued_)
      return std::nullopt;
    auto key = take_turn(/*batch_only=*/!background);
    if (!key) return std::nullopt;
    auto node = queued_.extract(*key);
    m = announce(key->first == MsgType::batch ? MsgType::batch_nested : MsgType::file_nested, *key,
                 node.mapped());
    charge_to_[m.id] = m.uid;
    nested_open_ = m.id;
    ++stats_.nested;
  } else if (shutdown_queued_) {
    m = Message{MsgType::shutdown, next_id_++, {}};
    shutdown_announced_ = true;
    queued_.clear();
    by_uid_.clear();
    turns_.clear();
  } else if (queued_.empty() && !later_set_.empty()) {  // nothing waits: the next prefetched batch
    for (;;) {                                          // skip the entries promoted or dropped meanwhile
      auto it = later_set_.find(later_.front().first);
      if (it != later_set_.end() && it->second.later_seq == later_.front().second) break;
      later_.pop_front();
    }
    Key key = std::move(later_.front().first);
    later_.pop_front();
    auto node = later_set_.extract(key);
    const Pending& p = node.mapped();
    if (key.first == MsgType::batch) {
      if (p.walk)
        walk_of_[key.second] = *p.walk;
      else
        walk_of_.erase(key.second);
    }
    m = announce(key.first == MsgType::batch ? MsgType::batch_prefetch : MsgType::file_prefetch, key, p);
    if (key.first == MsgType::batch) ++stats_.prefetched;
  } else {
    auto key = take_turn(/*batch_only=*/false);
    if (!key) return std::nullopt;
    auto node = queued_.extract(*key);
    m = announce(key->first, *key, node.mapped());
    charge_to_[m.id] = m.uid;
  }
  outstanding_ = true;
  return m;
}

void Coordinator::on_announced(const Message& /*m*/) {
  outstanding_ = false;
}

void Coordinator::on_started(const Message& m) {
  if (!is_nested(m.type)) running_ = m;
}

void Coordinator::on_finished(const Message& m) {
  if (is_nested(m.type)) {
    if (nested_open_ == m.id) nested_open_ = 0;
  } else {
    running_.reset();
  }
}

}  // namespace stagefs
