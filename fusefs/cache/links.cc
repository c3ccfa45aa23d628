// LinkedCopies: cache/links.h states what it records and why.
#include "fusefs/cache/links.h"

#include "bcast/io/manifest.h"

namespace stagefs {

LinkedCopies::Key LinkedCopies::key_of(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), stage::to_ns(st.st_mtim),
          stage::to_ns(st.st_ctim), static_cast<uint64_t>(st.st_size)};
}

LinkedCopies::Answer LinkedCopies::ask(const Key& key, const std::string& rel,
                                       const std::function<std::function<void()>()>& make_waiter) {
  std::lock_guard lk(m_);
  if (auto c = copy_.find(key); c != copy_.end() && c->second != rel) return {Answer::other_copy, c->second};
  if (auto f = inflight_.find(key); f != inflight_.end()) {
    if (f->second.rel == rel) return {Answer::same_name, {}};
    f->second.waiters.push_back(make_waiter());
    return {Answer::waiting, {}};
  }
  inflight_.emplace(key, Inflight{rel, {}});
  return {Answer::materialize, {}};
}

void LinkedCopies::forget(const Key& key, const std::string& other) {
  std::lock_guard lk(m_);
  if (auto c = copy_.find(key); c != copy_.end() && c->second == other) copy_.erase(c);
}

std::vector<std::function<void()>> LinkedCopies::materialized(const Key& key, const std::string& rel,
                                                              bool made) {
  std::lock_guard lk(m_);
  if (made) copy_[key] = rel;
  if (auto node = inflight_.extract(key)) return std::move(node.mapped().waiters);
  return {};
}

void LinkedCopies::served(const Key& key, const std::string& rel) {
  std::lock_guard lk(m_);
  if (!inflight_.contains(key)) copy_.try_emplace(key, rel);
}

}  // namespace stagefs
