// ReplayPlan: what a replay asks for, file by file in the profile's order (replay.h runs it;
// this is its pure part, tested with no mount):
//   - a small file (the batch rule, batch_rules.h): its directory's batch, once, beginning
//     with the first file of that directory the job read: as few transfers as the batch rules
//     allow (a slice of at most --batch-max-files and bytes each, the rest in further slices);
//   - any other regular file: its own transfer, with the chunks the job read first wanted
//     first (converted to the transfer's chunk size);
//   - a file that is gone, is not a regular file, or that the profile's user may not read:
//     skipped (the probe, replay.h, says which; files changed since the profile are simply
//     staged as they are now).
// Each item counts the profile's files (and their bytes, as they are now) it stands for.
// Not thread-safe (the replay's thread owns it).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fusefs/profile/format.h"

namespace stagefs {

// A profile's file, as the replay finds it now on the source.
struct FileProbe {
  enum class State { ok, gone, denied, other } state = State::gone;
  struct stat st {};
};

struct ReplayItem {
  enum class Kind { batch, file } kind = Kind::file;
  std::string path;               // the file (a batch: its first file; the batch is its directory's)
  std::vector<uint64_t> chunks;   // a file's recorded chunks, in the transfer's chunk size
  uint64_t files = 0, bytes = 0;  // profile files it stands for, and their size
};

struct PlanCounts {
  uint64_t files = 0, bytes = 0;  // planned (in an item)
  uint64_t gone = 0, denied = 0, other = 0;
};

class ReplayPlan {
 public:
  // small_file_size: the mount's (0: no batches); chunk sizes: the profile's and the
  // transfers' (the coordinator's --chunk-size).
  ReplayPlan(uint64_t small_file_size, uint64_t profile_chunk, uint64_t transfer_chunk);
  // f as probed: the index of a new item to ask for, or nullopt (skipped, or counted in a
  // directory batch planned before: item_of() says which).
  std::optional<size_t> add(const ProfileFile& f, const FileProbe& probe);
  [[nodiscard]] const ReplayItem& item(size_t i) const { return items_[i]; }
  [[nodiscard]] size_t items() const { return items_.size(); }
  // The item a planned file went into (the last add()).
  [[nodiscard]] size_t last_item() const { return last_; }
  [[nodiscard]] const PlanCounts& counts() const { return counts_; }

 private:
  uint64_t small_, profile_chunk_, transfer_chunk_;
  std::vector<ReplayItem> items_;
  std::map<std::string, size_t> batch_of_dir_;
  size_t last_ = 0;
  PlanCounts counts_;
};

}  // namespace stagefs
