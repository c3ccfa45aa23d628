// The batch rules that the rooms must apply the same way: what a batch of small files takes,
// and what a copy of one costs. The batch's scan (BeneathSource::scan_selection), the
// cache's room-making before a batch (NodeCache) and the core's choice between a batch and a
// transfer of one file (StageFsCore) all ask batch_eligible (and, beneath.h, whether the file
// has an ACL: for_each_small_file), so they never disagree on what a batch holds. A leaf that
// depends on the engine's store only, in the library of the paths beneath SOURCE_DIR: the
// source reader (beneath.cc) and the cache (cache/) both include it, neither the other.
// Pure functions of a stat and a name: thread-safe.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string_view>

#include "bcast/io/store.h"

namespace stagefs {

// True when the file `name` (a plain name, the last component) with stat st goes into its
// directory's batch when batches take files of at most max_size bytes (0: no batches):
//   - a regular file no larger than max_size;
//   - that every user may read by its mode: read for its owner, its group and others
//     (u+r, g+r, o+r; o+r alone leaves out the owner's group with mode 0604). An open checks
//     its caller's access before it stages a file, and a batch (which one user's open, a walk
//     or a prefetch runs for every user alike) must not copy files some user may not read:
//     they are staged alone, at their own open, after its access check. A file with an ACL
//     is left out too (for_each_small_file, beneath.h: the mode does not say who may read it);
//   - not named like a copy's temporary file (stage::is_temp_name): never cached
//     (has_temp_component in beneath.h says why).
inline bool batch_eligible(const struct stat& st, std::string_view name, uint64_t max_size) {
  constexpr mode_t kEveryone = S_IRUSR | S_IRGRP | S_IROTH;
  return max_size > 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) <= max_size &&
         (st.st_mode & kEveryone) == kEveryone && !stage::is_temp_name(name);
}

// What a small file's copy costs, as a batch's byte limit and the walks' byte budgets count
// it: its bytes and 8 KiB more (its data rounded up to 4 KiB blocks, its inode, and its
// origin record's block where the filesystem needs one), so an empty file is not free.
inline constexpr uint64_t kCopyCharge = 8192;
inline uint64_t copy_charge(uint64_t size) {
  return size + kCopyCharge;
}

}  // namespace stagefs
