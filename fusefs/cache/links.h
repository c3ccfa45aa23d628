// LinkedCopies: the cache room's record of source files with several names (hard links).
//
// The names of one source version (device, inode, mtime, ctime, size) cost one transfer.
// While one name of it is materialized, an open of another name waits for that transfer,
// then reads the first name's copy (pinned as that name's). The cache keeps one copy per
// name it made (a copy with two links would look planted to its ownership rule), so a name
// is copied on its own only when no copy of the same version was made in this mount.
// Records, per version: the name whose copy was made here (or found, trusted and served), and
// the name being materialized with the opens of other names waiting for it. Whether a recorded
// copy is still usable is the caller's to check (CopyChecker::open_verified); it forgets one
// that is not.
// NodeCopies (copies.h) owns one. Thread-safe (one lock, innermost: nothing is called under it but
// `make_waiter`).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace stagefs {

class LinkedCopies {
 public:
  using Key = std::tuple<uint64_t, uint64_t, int64_t, int64_t, uint64_t>;  // dev, ino, mtime, ctime, size
  static Key key_of(const struct stat& src);

  // What an open of name rel of version key does.
  struct Answer {
    enum Kind {
      other_copy,   // serve `other`'s copy of this version, if it is still usable (else forget())
      materialize,  // rel materializes the version: call materialized() when that ends
      same_name,    // rel is being materialized already (the materializer merges the two)
      waiting,      // another name is being materialized: make_waiter()'s result runs when it ends
    } kind = materialize;
    std::string other;
  };
  // make_waiter is called (under the lock) only for `waiting`.
  Answer ask(const Key& key, const std::string& rel,
             const std::function<std::function<void()>()>& make_waiter);
  // other's copy (an other_copy answer) could not be served: no longer the version's copy.
  void forget(const Key& key, const std::string& other);
  // rel's materialization of the version ended (made: a whole copy is in the cache). Returns
  // the waiting opens of other names, to run.
  std::vector<std::function<void()>> materialized(const Key& key, const std::string& rel, bool made);
  // rel's copy of the version, found in the cache and trusted (an earlier mount's, or one
  // its checker read back), was served: other names of the version may use it too, unless
  // a copy is recorded already or one is being made.
  void served(const Key& key, const std::string& rel);

 private:
  struct Inflight {
    std::string rel;                             // the name being materialized
    std::vector<std::function<void()>> waiters;  // other names' opens, run when it ends
  };
  std::mutex m_;
  std::map<Key, Inflight> inflight_;
  std::map<Key, std::string> copy_;  // the name whose copy of that version was made here
};

}  // namespace stagefs
