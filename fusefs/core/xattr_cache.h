// XattrCache: what the source answered to listxattr and getxattr, per node id, so that the
// calls `ls -l` makes for every entry (security.selinux, system.posix_acl_access: absent on
// almost every file) cost no syscall once a node's names are known.
//
// How: the first xattr call on a node lists its names (one listxattr); a getxattr of a name
// the list does not hold is answered at once with what the source's filesystem answers for an
// absent name (ENODATA, or EOPNOTSUPP where it has no such namespace: security.* on NFS),
// learnt once per (source device, name) by one real getxattr; the value of a listed name is
// read once and kept when small (kMaxValue). Nothing is cached for a read that fails
// otherwise. Passing EOPNOTSUPP through matters: ls, cp and tar then stop asking for that
// device, as they do on the source.
// Freshness: setting or removing an xattr changes the file's ctime. The core reports the
// ctime each lookup and getattr sees (observe()); a different one drops the node's entry. So
// the answers are as fresh as the attributes the kernel holds (a changed regular file also
// gets a new node id at lookup). A load that raced with an invalidation is not stored.
//
// Thread-safe (one mutex, never held while loading). Memory: one small entry per node that
// was observed (about 80 bytes), what was read only for the nodes asked; freed by forget().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "bcast/io/error.h"

namespace stagefs {

class XattrCache {
 public:
  static constexpr size_t kMaxValue = 1024;
  using Load = std::function<stage::Result<std::string>()>;

  // The node's names, NUL-terminated as listxattr gives them; load() lists the source.
  stage::Result<std::string> list(uint64_t id, const Load& load);
  // One attribute's value, or ENODATA. load_list() as above; load_value() reads the source.
  stage::Result<std::string> get(uint64_t id, const std::string& name, const Load& load_list,
                                 const Load& load_value);
  // A lookup or getattr saw the node's source with this ctime, on this device.
  void observe(uint64_t id, int64_t ctime_ns, uint64_t dev);
  void forget(uint64_t id);

  struct Stats {
    uint64_t hits = 0;   // answered without touching the source
    uint64_t loads = 0;  // listxattr or getxattr on the source
  };
  [[nodiscard]] Stats stats() const;
  [[nodiscard]] size_t size() const;

 private:
  // What was read of one node's attributes: only for the nodes whose attributes were asked.
  struct Loaded {
    std::string names;  // raw listxattr output
    std::unordered_map<std::string, std::string> values;
  };
  // One per node observed (every entry a listing looked up): kept small.
  struct Entry {
    uint64_t gen = 0;  // changes whenever the entry is reset
    int64_t ctime_ns = 0;
    std::optional<uint64_t> dev;
    std::unique_ptr<Loaded> loaded;  // set: listed
  };
  static bool holds(const std::string& names, const std::string& name);

  static constexpr size_t kMaxAbsent = 256;  // (device, name) answers kept

  mutable std::mutex m_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::map<std::pair<uint64_t, std::string>, int> absent_;  // the errno of an absent name
  uint64_t next_gen_ = 1;
  Stats stats_;
};

}  // namespace stagefs
