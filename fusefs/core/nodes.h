// The mount's node ids, what the kernel's inodes stand for: NodeTable maps each id to one
// source path (and, for a regular file, one version of it: size, times, inode), counts the
// kernel's references (lookups minus forgets) and forgets an id with its last reference.
//
// Memory, which any user drives by listing large directories (READDIRPLUS looks up every
// entry): a node holds its own name, one component, never its path. The path is built from
// the chain of parents when asked (a node keeps its parent while it has children, whatever
// order the forgets come in), and the index from (parent, name) to the current id points
// into the node's own name. A node with a 250-byte name takes about 0.5 KB however deep it
// lies (a full path per node, stored twice, took 7 KB fourteen levels down). Every node a
// user's lookup creates is charged to that user's budget (UserBytes, shared with the
// directory listings) and given back when the kernel forgets it; once a large number of
// nodes went away the memory goes back to the system (malloc_trim), not only to the heap.
//
// Thread-safe: one mutex, held for no system call (the caller stats the source first).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bcast/io/error.h"
#include "bcast/io/manifest.h"

namespace stagefs {

// Bytes held on behalf of each user (other than root, who is not counted), against one limit:
// the directory listings a user's opendirs built and the nodes its lookups created.
// Thread-safe; shared (the listings' deleters may run after the core).
class UserBytes {
 public:
  explicit UserBytes(uint64_t limit) : limit_(limit) {}
  // Counts bytes for uid, or returns false (nothing counted) if that would pass the limit;
  // then `used` says what uid already holds. uid 0: always true, not counted.
  bool charge(uint32_t uid, uint64_t bytes, uint64_t& used);
  void refund(uint32_t uid, uint64_t bytes);
  [[nodiscard]] uint64_t used(uint32_t uid) const;
  [[nodiscard]] uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  mutable std::mutex m_;
  std::map<uint32_t, uint64_t> by_uid_;
};

class NodeTable {
 public:
  static constexpr uint64_t kRootId = 1;
  // What the core needs of a node: its path (relative to SOURCE_DIR), and for a regular file
  // the version it stands for and its owner.
  struct Info {
    std::string rel;
    stage::FileMeta version;  // empty: not a regular file's id
    uint32_t uid = 0, gid = 0;
  };
  // budget: where the nodes of users' lookups are counted (may be null: nothing counted).
  explicit NodeTable(std::shared_ptr<UserBytes> budget);
  NodeTable(const NodeTable&) = delete;
  NodeTable& operator=(const NodeTable&) = delete;

  // A lookup of `name` in directory `parent` found `st` (the caller, uid, asked): the name's
  // id, counting one reference. A new name, or a new version of a regular file, gets a new id
  // (the old one stays for its holders until forgotten). ESTALE: parent is unknown; ENOMEM:
  // a new node would take uid past its budget (message: `budget_message`).
  stage::Result<uint64_t> note_lookup(uint64_t parent, const std::string& name, const struct stat& st,
                                      uint32_t uid);
  // Drops n references; ids left with none (and no children) go, parents that only their
  // children kept go with the last child. Returns the ids that went.
  std::vector<uint64_t> forget(uint64_t id, uint64_t n);
  stage::Result<std::string> path_of(uint64_t id) const;
  stage::Result<Info> info(uint64_t id) const;
  [[nodiscard]] size_t size() const;
  // What one node of this name costs (what a user's budget is charged).
  static uint64_t node_bytes(std::string_view name);

 private:
  struct Node {
    uint64_t parent = 0;  // 0: the root
    std::string name;     // one component; "" for the root
    uint64_t nlookup = 0;
    uint32_t children = 0;  // nodes whose parent this is
    uint32_t charged = 0;   // the uid whose budget pays for it (0: none)
    stage::FileMeta version;
    uint32_t uid = 0, gid = 0;
  };
  // (parent, name), the name viewing the node's own string.
  struct Key {
    uint64_t parent;
    std::string_view name;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<std::string_view>()(k.name) ^
             (std::hash<uint64_t>()(k.parent) * 0x9e3779b97f4a7c15ULL);
    }
  };
  std::string path_locked(uint64_t id) const;
  // Removes id if nothing holds it any more, then its parent likewise; the ids removed are
  // appended to `gone`.
  void drop_unused_locked(uint64_t id, std::vector<uint64_t>& gone);

  std::shared_ptr<UserBytes> budget_;
  mutable std::mutex m_;
  std::unordered_map<uint64_t, Node> nodes_;
  std::unordered_map<Key, uint64_t, KeyHash> ids_;  // the current id of each (parent, name)
  uint64_t next_id_ = kRootId + 1;
  uint64_t freed_ = 0;  // node bytes freed since the memory was last given back
};

}  // namespace stagefs
