#include "fusefs/core/xattr_cache.h"

#include <cerrno>
#include <string_view>
#include <system_error>

namespace stagefs {

namespace {
stage::Error absent(int err) {
  return stage::Error{std::error_code(err, std::generic_category()), ""};
}
bool is_absent(int err) {
  return err == ENODATA || err == EOPNOTSUPP;
}
}  // namespace

bool XattrCache::holds(const std::string& names, const std::string& name) {
  for (size_t i = 0; i < names.size();) {
    size_t end = names.find('\0', i);
    if (end == std::string::npos) end = names.size();
    if (std::string_view(names).substr(i, end - i) == name) return true;
    i = end + 1;
  }
  return false;
}

stage::Result<std::string> XattrCache::list(uint64_t id, const Load& load) {
  uint64_t gen = 0;
  {
    std::lock_guard lk(m_);
    auto& e = entries_[id];
    if (e.gen == 0) e.gen = next_gen_++;
    if (e.loaded) {
      ++stats_.hits;
      return e.loaded->names;
    }
    gen = e.gen;
    ++stats_.loads;
  }
  auto r = load();
  if (!r) return r;
  std::lock_guard lk(m_);
  if (auto it = entries_.find(id); it != entries_.end() && it->second.gen == gen)
    it->second.loaded = std::make_unique<Loaded>(Loaded{*r, {}});
  return r;
}

stage::Result<std::string> XattrCache::get(uint64_t id, const std::string& name, const Load& load_list,
                                           const Load& load_value) {
  auto names = list(id, load_list);
  if (!names) return names.error();
  const bool listed = holds(*names, name);
  uint64_t gen = 0;
  std::optional<uint64_t> dev;
  {
    std::lock_guard lk(m_);
    auto it = entries_.find(id);
    if (it != entries_.end()) {
      dev = it->second.dev;
      if (!listed && dev) {
        if (auto a = absent_.find({*dev, name}); a != absent_.end()) {
          ++stats_.hits;
          return absent(a->second);
        }
      }
      if (const Loaded* l = it->second.loaded.get(); listed && l != nullptr)
        if (auto v = l->values.find(name); v != l->values.end()) {
          ++stats_.hits;
          return v->second;
        }
      gen = it->second.gen;
    }
    ++stats_.loads;
  }
  auto v = load_value();
  std::lock_guard lk(m_);
  if (!listed) {  // what this filesystem answers for a name it does not hold
    if (!v && is_absent(v.error().to_errno()) && dev && absent_.size() < kMaxAbsent)
      absent_.emplace(std::pair{*dev, name}, v.error().to_errno());
    return v;  // a value the list did not show (some filesystems hide names): not kept
  }
  if (!v || v->size() > kMaxValue) return v;
  if (auto it = entries_.find(id); it != entries_.end() && it->second.gen == gen && it->second.loaded)
    it->second.loaded->values[name] = *v;
  return v;
}

void XattrCache::observe(uint64_t id, int64_t ctime_ns, uint64_t dev) {
  std::lock_guard lk(m_);
  auto& e = entries_[id];
  if (e.gen != 0 && e.ctime_ns == ctime_ns && e.dev == dev) return;
  e = Entry{next_gen_++, ctime_ns, dev, nullptr};
}

void XattrCache::forget(uint64_t id) {
  std::lock_guard lk(m_);
  entries_.erase(id);
}

XattrCache::Stats XattrCache::stats() const {
  std::lock_guard lk(m_);
  return stats_;
}

size_t XattrCache::size() const {
  std::lock_guard lk(m_);
  return entries_.size();
}

}  // namespace stagefs
