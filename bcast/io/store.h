// The local-store seam: where a node's copy goes. A copy is written through a Txn:
//   begin(path)  creates ".<name>.stage-tmp.<host>.<pid>" beside the destination (O_EXCL)
//   write()      pwrite at an offset (opens the file on first use: a tree of 100,000 small
//                files never holds more than a few descriptors). With direct I/O on, the
//                aligned part of a write of 64 KiB or more (unit: the filesystem's direct-I/O
//                alignment from statx, at least 4 KiB) goes through O_DIRECT: the bytes
//                go from our buffer to the device without a copy into the page cache (that
//                copy can be the largest CPU cost of staging: bench/README.md). Unaligned
//                heads and tails, and filesystems that refuse O_DIRECT (EINVAL), use
//                ordinary buffered writes; the result is the same file.
//   finish()     sets size (holes stay holes), mode, mtime = source mtime, records the source's
//                identity and CRC (its Origin) and, for a copy written chunk by chunk, its
//                chunks' CRCs (ChunkRecord) in the xattrs its user names (CopyXattrs), closes
//   sync()       fsync (or one sync_filesystem() for many files)
//   commit()     rename over the destination, fsync the directory (commit_unsynced(): the
//                rename only, for a batch that syncs once after its last rename)
//   abort()      unlink the temporary file (also done by the destructor if not committed)
// So a destination is either the old file or the complete new one, even after kill -9: a
// temporary name is never taken for a copy, and remove_stale_temps() clears the ones a dead
// process left. PosixStore is stateless and thread-safe; a Txn is used by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bcast/io/manifest.h"
#include "bcast/io/source.h"
#include "bcast/io/temp_name.h"  // the names of Txn's temporary files

namespace stage {

// What a copy records about the source it was made from.
struct Origin {
  FileMeta source;
  uint64_t crc = 0;
  bool crc_known = false;
};

// The CRCs a copy recorded, chunk by chunk, when it was written (a single-file transfer of more
// than one chunk): the CRC-64 of each `unit` bytes of the file in order (the last one may be
// shorter). unit is the transfer's chunk size, or a power-of-two multiple of it for a file of
// more than kMaxRecordUnits chunks, so that the record fits, with the origin, in the one xattr
// block ext4 gives a file. A seed proves each chunk against it before the chunk is sent.
struct ChunkRecord {
  uint64_t unit = 0;
  std::vector<uint64_t> crcs;
  // Whether it describes a file of `size` bytes whose CRC is `crc`, in units that a stream cut
  // in chunks of `chunk` bytes can be checked against (one divides the other).
  [[nodiscard]] bool proves(uint64_t chunk, uint64_t size, uint64_t crc) const;
};
inline constexpr size_t kMaxRecordUnits = 384;  // 3 KiB of CRCs
// The record of a file of `size` bytes from its chunks' CRCs (chunks of `chunk` bytes).
ChunkRecord make_chunk_record(std::span<const uint64_t> chunk_crcs, uint64_t chunk, uint64_t size);
std::string encode_chunk_record(const ChunkRecord& r);
std::optional<ChunkRecord> decode_chunk_record(std::string_view bytes);

// A copy's ChunkRecord with the file it was read from (device and inode).
struct CopyRecord {
  ChunkRecord chunks;
  uint64_t dev = 0, ino = 0;
};

struct LocalState {
  bool exists = false;
  bool regular = false;
  bool is_dir = false;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t dev = 0, ino = 0;      // the file found (not following a symlink)
  std::optional<Origin> origin;   // from the xattr, when present and well-formed
  std::string link_target;        // when the local entry is a symlink
  const char* special = nullptr;  // "character device", "FIFO"...: never replaced by a copy
};

class Txn {
 public:
  virtual ~Txn() = default;
  virtual Status write(uint64_t off, std::span<const std::byte> data) = 0;
  // chunks: the copy's ChunkRecord (nullptr: none); the store records it if it can.
  virtual Status finish(const FileMeta& source, uint64_t crc, const ChunkRecord* chunks) = 0;
  // Empties the temporary file (size 0, every byte a hole) for writing it again: a transfer fed
  // again after a failed feed whose bytes were not proven chunk by chunk.
  virtual Status rewind() = 0;
  virtual Status sync() = 0;
  // CRC of what is on disk now (after finish), read back past the page cache where possible.
  virtual Result<uint64_t> crc_on_disk() = 0;
  virtual Result<uint64_t> size_on_disk() = 0;
  virtual Status commit() = 0;
  // commit() without the directory's fsync: the rename is atomic (the name is the old file or
  // the complete copy), but it may be lost in a crash. The engine calls it only inside a
  // Publication, after data_durable() succeeded: a name that survives a crash always names
  // durable data; a name lost is a copy made again.
  virtual Status commit_unsynced() { return commit(); }
  virtual void abort() noexcept = 0;
  [[nodiscard]] virtual const std::string& temp_path() const = 0;
};

// One group of copies published together, in three steps: the engine calls data_durable(),
// then (if it succeeded) renames the copies (Txn::commit_unsynced), then done().
class Publication {
 public:
  virtual ~Publication() = default;
  // Before any rename: returns once a crash can no longer leave one of the group's names on a
  // copy with wrong bytes. An error: nothing of the group is renamed, and done() is not called.
  virtual Status data_durable() = 0;
  // After the renames, also when a check failed in between and not every copy (or none) was
  // renamed: from now on the store may sync what is at those names. Never before: a sync of a
  // name not renamed yet would sync the old copy, or nothing.
  virtual void done() = 0;
};

class LocalStore {
 public:
  virtual ~LocalStore() = default;
  virtual Result<LocalState> inspect(const std::string& path) = 0;
  virtual Result<uint64_t> checksum(const std::string& path) = 0;
  // The ChunkRecord this node's copy at path recorded, with that file's identity (none: no
  // record, or a store that keeps none).
  virtual Result<std::optional<CopyRecord>> chunk_record(const std::string& /*path*/) {
    return std::optional<CopyRecord>();
  }
  // Opens this node's existing copy at path for reading, to seed a transfer (a regular file,
  // the last component not followed). Stores that cannot say unsupported.
  virtual Result<std::unique_ptr<SourceFile>> open_copy(const std::string& path) {
    return stage_error(Errc::unsupported, "read local copy", path);
  }
  // A copy open_copy() opened (its identity then: `seen`) to seed a transfer failed a read,
  // or read back with a CRC other than the one it recorded when it was written (its origin):
  // a store that owns its copies may remove it, if it is still that file, so that no later
  // transfer chooses it again.
  virtual void bad_copy(const std::string& /*path*/, const FileMeta& /*seen*/) {}
  // Free bytes for an unprivileged writer on the filesystem that holds path's directory.
  virtual Result<uint64_t> free_bytes(const std::string& path) = 0;
  // syncfs() of the filesystem holding path: one call instead of one fsync per small file.
  virtual Status sync_filesystem(const std::string& path) = 0;
  // The publication of a group of copies (a selection, transfer/terms.h FileSelection): `paths`
  // are finished temporary copies in directory dir, to be renamed into place without a sync of
  // their names. By default their data is made durable by one sync of the filesystem, before
  // any rename. A store may keep that promise its own way (for instance record the names and
  // sync them later, never letting a name be read as a copy until its data is durable), so
  // that the transfer does not wait for the disk.
  virtual std::unique_ptr<Publication> publication(const std::string& dir, std::vector<std::string> paths);
  virtual Result<std::unique_ptr<Txn>> begin(const std::string& path) = 0;
  virtual Status make_dir(const std::string& path, uint32_t mode) = 0;
  // mkdir -p of path's parent (StoreOptions::parent_mode for new levels; existing ones are left as they are).
  virtual Status make_parents(const std::string& path) = 0;
  virtual Status make_symlink(const std::string& path, const std::string& target) = 0;
  // Removes, in directory dir, the temporary files of writers of this host that are gone (a
  // killed run); returns how many.
  virtual int remove_stale_temps(const std::string& dir) = 0;
};

// The extended attributes a copy records what it was made from in, named by the store's user
// (its tools' names, the same for every copy they make). "" records none: without an origin a
// copy is never current by Validate::recorded (nor a seed under it), and without a ChunkRecord
// it seeds only transfers without reads during the copy.
struct CopyXattrs {
  std::string origin;  // the Origin (encode_origin)
  std::string chunks;  // the ChunkRecord (encode_chunk_record)
};

struct StoreOptions {
  bool direct_io = true;        // O_DIRECT for aligned writes where the filesystem accepts it (stagefs: off)
  uint32_t parent_mode = 0755;  // directories make_parents() creates (the mount's cache: 0700)
  CopyXattrs xattrs{};          // none unless the user names them
};

inline constexpr size_t kDirectAlign = 4096;  // offsets, lengths and buffers for O_DIRECT

class PosixStore final : public LocalStore {
 public:
  PosixStore() = default;
  explicit PosixStore(StoreOptions opt) : opt_(opt) {}
  Result<LocalState> inspect(const std::string& path) override;
  Result<uint64_t> checksum(const std::string& path) override;
  Result<std::optional<CopyRecord>> chunk_record(const std::string& path) override;
  Result<std::unique_ptr<SourceFile>> open_copy(const std::string& path) override;
  Result<uint64_t> free_bytes(const std::string& path) override;
  Status sync_filesystem(const std::string& path) override;
  Result<std::unique_ptr<Txn>> begin(const std::string& path) override;
  Status make_dir(const std::string& path, uint32_t mode) override;
  Status make_parents(const std::string& path) override;
  Status make_symlink(const std::string& path, const std::string& target) override;
  int remove_stale_temps(const std::string& dir) override;

 private:
  StoreOptions opt_;
};

// CRC-64 of a whole file read with pread (drop_cache: ask the kernel to read from disk).
Result<uint64_t> crc_of_fd(int fd, const std::string& path, bool drop_cache);

// The origin recorded on an open copy in the xattr named `xattr`, if present and well-formed;
// and the value recorded (CopyXattrs::origin) for a copy of source m with this CRC.
std::optional<Origin> origin_of_fd(int fd, const std::string& xattr);
std::string encode_origin(const FileMeta& m, uint64_t crc);
// True when a copy with this origin and mtime is current for a source with meta `src`: the
// recorded source is the same version (same_version by `rule`: size, mtime, ctime and, with
// SourceVersion::full, inode) and the copy's mtime is the source's. The mount's validity rule.
bool origin_matches(const Origin& o, int64_t copy_mtime_ns, const FileMeta& src,
                    SourceVersion rule = SourceVersion::full);

}  // namespace stage
