#include "fusefs/core/nodes.h"

#include <malloc.h>

#include <algorithm>
#include <cerrno>

#include "bcast/io/paths.h"
#include "bcast/io/source.h"

namespace stagefs {

namespace {
// Freed node memory past which it is given back to the system (malloc_trim: freed pages in
// the middle of the heap too, which free() alone keeps).
constexpr uint64_t kTrimAfter = uint64_t{8} << 20;
}  // namespace

bool UserBytes::charge(uint32_t uid, uint64_t bytes, uint64_t& used) {
  if (uid == 0) return true;
  std::lock_guard lk(m_);
  auto it = by_uid_.find(uid);
  used = it == by_uid_.end() ? 0 : it->second;
  if (used + bytes > limit_) return false;
  if (it == by_uid_.end())
    by_uid_.emplace(uid, bytes);
  else
    it->second += bytes;
  return true;
}

void UserBytes::refund(uint32_t uid, uint64_t bytes) {
  if (uid == 0) return;
  std::lock_guard lk(m_);
  if (auto it = by_uid_.find(uid); it != by_uid_.end() && (it->second -= std::min(it->second, bytes)) == 0)
    by_uid_.erase(it);
}

uint64_t UserBytes::used(uint32_t uid) const {
  std::lock_guard lk(m_);
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? 0 : it->second;
}

uint64_t NodeTable::node_bytes(std::string_view name) {
  // The node in its map (~150), its index entry (~64), both maps' buckets, the xattr cache's
  // entry (~100), and the name's own allocation past std::string's 15 inline bytes.
  return 340 + (name.size() > 15 ? (name.size() + 1 + 8 + 15) / 16 * 16 : 0);
}

NodeTable::NodeTable(std::shared_ptr<UserBytes> budget) : budget_(std::move(budget)) {
  Node& root = nodes_[kRootId];
  root.nlookup = 1;  // never forgotten
}

stage::Result<uint64_t> NodeTable::note_lookup(uint64_t parent, const std::string& name,
                                               const struct stat& st, uint32_t uid) {
  const stage::FileMeta version = S_ISREG(st.st_mode) ? stage::meta_from_stat(st) : stage::FileMeta{};
  std::lock_guard lk(m_);
  auto p = nodes_.find(parent);
  if (p == nodes_.end()) return stage::sys_error(ESTALE, "lookup in an unknown directory id", name);
  auto it = ids_.find(Key{parent, name});
  if (it != ids_.end() && nodes_.at(it->second).version == version) {
    ++nodes_.at(it->second).nlookup;
    return it->second;
  }
  // A new name, or a new version of the file: a new id (the old one stays for its holders).
  const uint64_t bytes = node_bytes(name);
  uint64_t used = 0;
  if (budget_ && !budget_->charge(uid, bytes, used))
    return stage::sys_error(ENOMEM,
                            "lookup: the names and listings uid " + std::to_string(uid) +
                                " holds through the mount take " + std::to_string(used >> 20) +
                                " MiB, the limit of " + std::to_string(budget_->limit() >> 20) + " MiB",
                            name);
  const uint64_t id = next_id_++;
  Node& n = nodes_[id];
  n.parent = parent;
  n.name = name;
  n.nlookup = 1;
  n.charged = budget_ ? uid : 0;
  n.version = version;
  n.uid = st.st_uid;
  n.gid = st.st_gid;
  ++p->second.children;
  if (it != ids_.end()) ids_.erase(it);  // its key viewed the old node's name
  ids_.emplace(Key{parent, n.name}, id);
  return id;
}

std::vector<uint64_t> NodeTable::forget(uint64_t id, uint64_t n) {
  std::vector<uint64_t> gone;
  bool trim = false;
  {
    std::lock_guard lk(m_);
    auto it = nodes_.find(id);
    if (it == nodes_.end() || id == kRootId) return gone;
    it->second.nlookup = it->second.nlookup > n ? it->second.nlookup - n : 0;
    drop_unused_locked(id, gone);
    if (freed_ >= kTrimAfter) {
      freed_ = 0;
      trim = true;
    }
  }
  if (trim) ::malloc_trim(0);
  return gone;
}

void NodeTable::drop_unused_locked(uint64_t id, std::vector<uint64_t>& gone) {
  while (id != kRootId) {
    auto it = nodes_.find(id);
    if (it == nodes_.end() || it->second.nlookup > 0 || it->second.children > 0) return;
    Node& node = it->second;
    if (auto by = ids_.find(Key{node.parent, node.name}); by != ids_.end() && by->second == id)
      ids_.erase(by);
    const uint64_t bytes = node_bytes(node.name);
    if (budget_) budget_->refund(node.charged, bytes);
    freed_ += bytes;
    const uint64_t parent = node.parent;
    nodes_.erase(it);
    gone.push_back(id);
    auto p = nodes_.find(parent);
    if (p == nodes_.end()) return;
    --p->second.children;
    id = parent;
  }
}

std::string NodeTable::path_locked(uint64_t id) const {
  // The names from the node up to the root's child, joined in reverse.
  std::vector<const std::string*> names;
  size_t len = 0;
  for (auto it = nodes_.find(id); it != nodes_.end() && it->first != kRootId;
       it = nodes_.find(it->second.parent)) {
    names.push_back(&it->second.name);
    len += it->second.name.size() + 1;
  }
  std::string rel;
  rel.reserve(len);
  for (auto n = names.rbegin(); n != names.rend(); ++n) {
    if (!rel.empty()) rel += '/';
    rel += **n;
  }
  return rel;
}

stage::Result<std::string> NodeTable::path_of(uint64_t id) const {
  std::lock_guard lk(m_);
  if (nodes_.find(id) == nodes_.end()) return stage::sys_error(ESTALE, "unknown node id");
  return path_locked(id);
}

stage::Result<NodeTable::Info> NodeTable::info(uint64_t id) const {
  std::lock_guard lk(m_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return stage::sys_error(ESTALE, "unknown node id");
  return Info{path_locked(id), it->second.version, it->second.uid, it->second.gid};
}

size_t NodeTable::size() const {
  std::lock_guard lk(m_);
  return nodes_.size();
}

}  // namespace stagefs
