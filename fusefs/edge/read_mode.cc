#include "fusefs/edge/read_mode.h"

namespace stagefs {

const char* read_path_name(ReadPath p) {
  switch (p) {
    case ReadPath::passthrough:
      return "kernel passthrough";
    case ReadPath::splice:
      return "splice from the local copy (keep_cache)";
    default:
      return "not yet known";
  }
}

ReadChoice choose_read_mode(const OpenFacts& f) {
  ReadChoice c;
  if (f.during_copy) {
    if (f.passthrough_handles) {
      c.mode = ReadMode::passthrough;
      c.reported = ReadPath::passthrough;
    } else {
      c.mode = ReadMode::during_copy;
      c.counted = true;
    }
    return c;
  }
  c.keep_cache = f.cache_hit;
  if (f.from_source) return c;  // splice from the source (a stall fallback says so itself)
  if (f.cached_mode_handles) {
    c.counted = true;
    return c;
  }
  c.mode = ReadMode::passthrough;
  c.keep_cache = false;
  c.reported = ReadPath::passthrough;
  return c;
}

ReadChoice refused_passthrough(const OpenFacts& f) {
  ReadChoice c;
  c.keep_cache = f.cache_hit;
  c.reported = ReadPath::splice;
  return c;
}

ReadChoice NodeReadModes::open(uint64_t node, int file_fd, OpenFacts facts) {
  std::lock_guard lk(m_);
  const auto shared = passthrough_.find(node);
  facts.passthrough_handles = shared != passthrough_.end();
  facts.cached_mode_handles = cached_mode_.contains(node);
  ReadChoice c = choose_read_mode(facts);
  if (c.counted) ++cached_mode_[node];
  if (c.mode != ReadMode::passthrough) return c;
  if (shared != passthrough_.end()) {
    ++shared->second.second;
    c.backing_id = shared->second.first;
    return c;
  }
  const int id = backing_.open(file_fd);
  if (id < 0) return refused_passthrough(facts);
  passthrough_[node] = {id, 1};
  c.backing_id = id;
  return c;
}

void NodeReadModes::close(uint64_t node, const ReadChoice& c) {
  std::lock_guard lk(m_);
  if (c.counted) {
    if (auto it = cached_mode_.find(node); it != cached_mode_.end() && --it->second <= 0)
      cached_mode_.erase(it);
  }
  if (c.mode != ReadMode::passthrough) return;
  auto it = passthrough_.find(node);
  if (it == passthrough_.end() || --it->second.second > 0) return;
  backing_.close(it->second.first);
  passthrough_.erase(it);
}

}  // namespace stagefs
