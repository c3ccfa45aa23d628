// Copies as an earlier run of stagefs or stage-bcast leaves them on a node, planted by a test:
// the bytes, the source's mtime, the origin xattr (the source version and a CRC) and the
// chunk record (user.stagefs.chunks) in units of the chunk size, or coarser or finer, or none.
#pragma once

#include <sys/stat.h>
#include <sys/xattr.h>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "bcast/io/crc.h"
#include "bcast/io/manifest.h"
#include "bcast/io/source.h"
#include "bcast/io/store.h"
#include "fusefs/cache/copy_xattrs.h"

namespace stage::testing {

// none: an older copy without a record; same: units of one chunk (what a transfer of that
// chunk size records); coarser: 4 chunks a unit (a file of many chunks, or a transfer with a
// smaller chunk size than the writer's); finer: a quarter chunk a unit.
enum class Record { none, same, coarser, finer };

inline uint64_t crc_of(const std::string& s) {
  return crc64(std::as_bytes(std::span(s.data(), s.size())));
}

// The ChunkRecord of `truth` in units of `unit` bytes.
inline ChunkRecord record_of(const std::string& truth, uint64_t unit) {
  std::vector<uint64_t> crcs;
  for (uint64_t off = 0; off < truth.size(); off += unit) crcs.push_back(crc_of(truth.substr(off, unit)));
  return make_chunk_record(crcs, unit, truth.size());
}

struct Planted {
  Record record = Record::same;
  uint64_t chunk = 65536;
  // What the origin and the record describe (default: the bytes planted): a copy whose bytes
  // rotted on its disk after it was written records the source's.
  std::optional<std::string> truth;
  bool older_origin = false;  // the origin of an earlier version of the source (its ctime)
};

// Writes `bytes` at `copy` as the copy of source file `src` (which must exist).
inline ::testing::AssertionResult plant_copy(const std::string& copy, const std::string& bytes,
                                             const std::string& src, const Planted& how = {}) {
  {
    std::ofstream f(copy, std::ios::binary | std::ios::trunc);
    f << bytes;
    if (!f) return ::testing::AssertionFailure() << "cannot write " << copy;
  }
  struct stat st {};
  if (::stat(src.c_str(), &st) != 0) return ::testing::AssertionFailure() << "no source " << src;
  const std::string& truth = how.truth ? *how.truth : bytes;
  FileMeta meta = meta_from_stat(st);
  if (how.older_origin) meta.ctime_ns -= 1000000000;
  const std::string origin = encode_origin(meta, crc_of(truth));
  if (::setxattr(copy.c_str(), stagefs::kCopyXattrs.origin.c_str(), origin.data(), origin.size(), 0) != 0)
    return ::testing::AssertionFailure() << "setxattr origin " << copy;
  if (how.record != Record::none) {
    const uint64_t unit = how.record == Record::same      ? how.chunk
                          : how.record == Record::coarser ? how.chunk * 4
                                                          : how.chunk / 4;
    const std::string rec = encode_chunk_record(record_of(truth, unit));
    if (::setxattr(copy.c_str(), stagefs::kCopyXattrs.chunks.c_str(), rec.data(), rec.size(), 0) != 0)
      return ::testing::AssertionFailure() << "setxattr chunks " << copy;
  }
  const timespec times[2] = {st.st_atim, st.st_mtim};
  if (::utimensat(AT_FDCWD, copy.c_str(), times, 0) != 0) return ::testing::AssertionFailure() << "utimensat";
  return ::testing::AssertionSuccess();
}

}  // namespace stage::testing
