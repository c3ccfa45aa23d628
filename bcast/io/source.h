// The source seam: what the source rank reads. PosixSource reads a shared filesystem with
// pread; tests substitute readers that fail, return short reads or change under the copy.
// scan() walks the source without following symlinks below the root (a symlink is sent as a
// symlink, never followed out of the source tree); FIFOs, sockets and devices are skipped and
// reported. Only the source rank uses a SourceReader. Instances are not thread-safe; a
// SourceFile is used by one thread (the engine's reader thread).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bcast/io/fd.h"
#include "bcast/io/manifest.h"

namespace stage {

// What a look at a file's data and holes found (SourceFile::sparseness).
struct Sparseness {
  std::vector<Extent> holes;  // each at least `align` long, aligned to it (or ending at the file's end)
  uint64_t copy_bytes = 0;    // what a copy takes: the data in 4 KiB blocks (rounded out), its extent map
  size_t extents = 0;         // data extents looked at
};

class SourceFile {
 public:
  virtual ~SourceFile() = default;
  // Reads exactly buf.size() bytes at off; a short read is an error (Errc::short_read).
  virtual Status read_at(uint64_t off, std::span<std::byte> buf) = 0;
  // False when [off, off+len) lies entirely in a hole (sparse file); true when unsure.
  virtual bool has_data(uint64_t off, uint64_t len) = 0;
  // The file's identity now (for "changed during the transfer" checks).
  virtual Result<FileMeta> stat_now() = 0;
  // True when a read at `size` (the size the scan recorded) still returns data: the file grew,
  // or it is a pseudo file whose stat size is not its content (/proc reports 0 bytes). The
  // engine asks once per file, after its last byte. Readers that cannot tell say false.
  virtual Result<bool> data_past(uint64_t /*size*/) { return false; }
  // The file's data and holes (a file of `size` bytes), looking at no more than max_extents
  // data extents (the rest counts as data): the holes a transfer may skip, as chunks of
  // `align` bytes, and what a copy takes. nullopt: this reader cannot tell (its allocation is
  // trusted).
  virtual std::optional<Sparseness> sparseness(uint64_t /*size*/, uint64_t /*align*/,
                                               size_t /*max_extents*/) {
    return std::nullopt;
  }
};

// A selection's slice of its directory: the names in byte order, circularly, from the first at
// or after `from` ("" the first name) up to the first at or after `until` (exclusive), or with
// `until` empty: back to `from` (the whole directory) or, with to_end, to the last name; at
// most max_files files and max_bytes bytes (0: no limit; the slice's first file is always
// in, whatever its size).
struct SelectionSlice {
  std::string from;
  std::string until;
  bool to_end = false;
  uint64_t max_files = 0;
  uint64_t max_bytes = 0;
};
// What the scan of a selection found: the manifest, and where its next slice starts: the first
// name of the range the slice's limits left out ("" none: the range is done).
struct Selection {
  Manifest manifest;
  std::string next_slice;
};

class SourceReader {
 public:
  virtual ~SourceReader() = default;
  // Called for entries scan() skipped (FIFO, socket, device): path and reason.
  using SkipFn = std::function<void(const std::string&, const std::string&)>;
  virtual Result<Manifest> scan(const std::string& path, bool recursive, const SkipFn& skipped) = 0;
  // A selection (transfer/terms.h FileSelection): the regular files directly in directory `dir` (not
  // recursive, symlinks and everything else left out) of at most max_size bytes, within the
  // slice, as a tree manifest: the root directory entry, then the files by name. Only the
  // slice's names are checked (stat): the rest of a huge directory is only listed. Readers
  // that cannot list say unsupported.
  virtual Result<Selection> scan_selection(const std::string& dir, uint64_t max_size,
                                           const SelectionSlice& slice) {
    (void)max_size;
    (void)slice;
    return stage_error(Errc::unsupported, "a batch of small files", dir);
  }
  // The subdirectories directly in `dir` that every user may list and enter (mode o+rx), in
  // the order the directory lists them, at most max of them (a mount's walks).
  // Readers that cannot list say unsupported.
  virtual Result<std::vector<std::string>> list_dirs(const std::string& dir, size_t max) {
    (void)max;
    return stage_error(Errc::unsupported, "list subdirectories", dir);
  }
  // Opens a regular file of the manifest and checks it is still the file that was scanned.
  virtual Result<std::unique_ptr<SourceFile>> open(const std::string& root, const Entry& e) = 0;
};

class PosixSource final : public SourceReader {
 public:
  Result<Manifest> scan(const std::string& path, bool recursive, const SkipFn& skipped) override;
  Result<std::unique_ptr<SourceFile>> open(const std::string& root, const Entry& e) override;
};

// The source rank, after its scan: every sparse regular file of m (allocated below its size)
// gets the holes the stream may skip (chunks of m.chunk_size) and, in `allocated`, what its
// copy takes (SourceFile::sparseness), looking at no more than kMaxScanExtents data extents in
// all. A file past that budget keeps no holes and counts its whole size.
inline constexpr size_t kMaxScanExtents = size_t{1} << 20;
void scan_sparse_files(SourceReader& src, const std::string& root, Manifest& m);

FileMeta meta_from_stat(const struct stat& st);
// Bytes a regular file occupies on disk (st_blocks x 512); 0 for anything else.
uint64_t allocated_from_stat(const struct stat& st);

// Opening a source file never waits: a name a user swapped for a FIFO would block open(2)
// (O_RDONLY waits for a writer) and with it the thread that stages for every node. Open with
// kNoWaitOpen added (and no other status flag: O_DIRECT, O_NOATIME...), then settle_regular():
// it fails with Errc::unsupported unless fd is a regular file, clears O_NONBLOCK, and leaves
// the file's stat in st.
inline constexpr int kNoWaitOpen = O_NONBLOCK | O_NOCTTY;
Status settle_regular(int fd, struct stat& st, const std::string& path);

// A SourceFile over an open regular file (pread, SEEK_DATA, fstat), for readers that resolve
// paths their own way (the mount's BeneathSource).
std::unique_ptr<SourceFile> posix_source_file(Fd fd, std::string path, uint64_t size);

}  // namespace stage
