// What the source rank found under --source, sent to every rank before any data.
// A manifest is a list of entries (regular files, directories, symlinks) with the source's
// metadata; for a single file it holds one entry whose path is "". A sparse file's entry also
// lists its holes of at least one chunk (aligned to the chunk size): the stream skips them, so
// a 1 TiB file with one written byte costs one chunk, not 65,536. The wire encoding is a
// flat little-endian byte string; decode() validates every length, type and path (no "..",
// no absolute path, no NUL, no empty component) before anything is used, so a corrupt or
// hostile message cannot make a rank touch a path outside its destination. Pure functions.
#pragma once

#include <time.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bcast/io/chunk.h"
#include "bcast/io/error.h"

namespace stage {

enum class EntryType : uint8_t { file = 1, dir = 2, symlink = 3 };

// Identity of a source file: if any field changes, a copy made from it is stale.
struct FileMeta {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t ino = 0;
  uint64_t dev = 0;
  uint32_t mode = 0;  // permission bits only
  bool operator==(const FileMeta&) const = default;
};

// What identifies one version of a source file across nodes and mounts (--source-version).
//   full      size, mtime, ctime and inode number
//   no_inode  size, mtime and ctime: for sources whose inode numbers are not stable across
//             mounts or nodes (FUSE filesystems without use_ino, object-store mounts). Two
//             different files with the same size, mtime and ctime are then taken for one.
enum class SourceVersion : uint8_t { full, no_inode };

// One version of a file, compared across nodes: size, times and (by the rule) inode agree (the
// device number is each node's own on a network filesystem; the mode says nothing of the
// content).
inline bool same_version(const FileMeta& a, const FileMeta& b, SourceVersion rule = SourceVersion::full) {
  return a.size == b.size && a.mtime_ns == b.mtime_ns && a.ctime_ns == b.ctime_ns &&
         (rule == SourceVersion::no_inode || a.ino == b.ino);
}

// One copy on a node's disk, unchanged: the same file (device, inode) with the same size and
// mtime (set to the source's when it was written). Its ctime is not part of it: every metadata
// update of the mount (the LRU order's atime, an xattr) moves it without touching a byte. Its
// content is proven by the CRCs it recorded when it was written (bcast/io/store.h).
inline bool same_copy(const FileMeta& a, const FileMeta& b) {
  return a.dev == b.dev && a.ino == b.ino && a.size == b.size && a.mtime_ns == b.mtime_ns;
}

// Nanoseconds since the epoch, saturated (no overflow past the year 2262), and back.
int64_t to_ns(const struct timespec& ts) noexcept;
struct timespec from_ns(int64_t ns) noexcept;

// A byte range of a file.
struct Extent {
  uint64_t off = 0;
  uint64_t len = 0;
  bool operator==(const Extent&) const = default;
};

struct Entry {
  std::string path;  // relative to the source root; "" for the root itself
  EntryType type = EntryType::file;
  FileMeta meta;
  std::string link_target;  // symlinks only
  // Regular files: bytes a copy may occupy on disk. The source's allocation (st_blocks x 512),
  // raised by the scan where the file's data, in 4 KiB blocks, takes more (a source that
  // compresses, or allocates smaller blocks). Holes stay holes in a copy, so this, not
  // meta.size, is what a copy needs (the free-space check).
  uint64_t allocated = 0;
  // Regular files: the holes the stream skips (they read as zeros), in order, disjoint, inside
  // the file, none empty; each starts at a multiple of the manifest's chunk size and ends at
  // one or at the file's end (decode() checks all of it). Empty: every byte is streamed.
  std::vector<Extent> holes{};
};

struct Manifest {
  std::vector<Entry> entries;
  bool tree = false;  // source was a directory (--recursive)
  // The source rank's chunk size: every rank cuts the stream (and sizes its buffers) by this
  // one, whatever its own setting, so ranks started with different --chunk-size values agree.
  // decode() refuses one outside check_chunk_size's range.
  uint64_t chunk_size = kDefaultChunk;
};

std::string encode(const Manifest& m);
Result<Manifest> decode(std::span<const std::byte> bytes);

// The bytes of e that the stream carries: its size less its holes.
uint64_t streamed_bytes(const Entry& e);

// The regular files of m named in `first` (manifest paths) go first in the stream, in first's
// order; the other files follow in their order. Directories and symlinks move ahead of every
// file, in their order (a directory still comes before what it holds). Pure.
void order_files_first(Manifest& m, const std::vector<std::string>& first);

// True for a path that stays below its root: relative, no "." or ".." or empty component.
bool is_safe_relative(std::string_view path);

// dest_root joined with a manifest path ("" -> dest_root itself).
std::string join_path(const std::string& root, const std::string& rel);

}  // namespace stage
