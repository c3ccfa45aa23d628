#include "bcast/io/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bcast/io/crc.h"
#include "bcast/io/fd.h"
#include "bcast/io/paths.h"
#include "bcast/io/temp_name.h"

namespace stage {

static constexpr size_t kWritePiece = size_t{1} << 20;

// A writer is gone when its pid no longer exists, or is a zombie (exited, not yet reaped).
static bool process_gone(long pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return true;
  char state = '?';
  const int n = std::fscanf(f, "%*d (%*[^)]) %c", &state);
  std::fclose(f);
  return n == 1 && (state == 'Z' || state == 'X');
}

Result<uint64_t> crc_of_fd(int fd, const std::string& path, bool drop_cache) {
  if (drop_cache) {
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return sys_error(errno, "stat local copy", path);
  const auto size = static_cast<uint64_t>(st.st_size);
  std::vector<std::byte> buf(4U << 20U);
  uint64_t crc = 0;
  uint64_t off = 0;
  // Holes are not read: they are zeros, whose CRC is combined in (a sparse 1 TiB copy with
  // 4 KiB of data reads 4 KiB). Where the filesystem cannot tell, everything is data.
  uint64_t data_end = 0;  // [off, data_end) is data
  while (off < size) {
    if (off >= data_end) {
      const off_t d = ::lseek(fd, static_cast<off_t>(off), SEEK_DATA);
      const uint64_t data = d >= 0           ? std::min<uint64_t>(static_cast<uint64_t>(d), size)
                            : errno == ENXIO ? size
                                             : off;
      if (data > off) {
        crc = crc64_combine(crc, crc64_zeros(data - off), data - off);
        off = data;
        continue;
      }
      const off_t h = ::lseek(fd, static_cast<off_t>(off), SEEK_HOLE);
      data_end = h > d && d >= 0 ? std::min<uint64_t>(static_cast<uint64_t>(h), size) : size;
    }
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), data_end - off));
    const ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error(errno, "read local copy", path);
    }
    if (n == 0) break;  // shorter than it was: the caller's CRC will not match
    crc = crc64(std::span(buf.data(), static_cast<size_t>(n)), crc);
    off += static_cast<uint64_t>(n);
  }
  return crc;
}

std::string encode_origin(const FileMeta& m, uint64_t crc) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "v1 %" PRIu64 " %" PRId64 " %" PRId64 " %" PRIu64 " %" PRIu64 " %016" PRIx64,
                m.size, m.mtime_ns, m.ctime_ns, m.ino, m.dev, crc);
  return buf;
}

bool ChunkRecord::proves(uint64_t chunk, uint64_t size, uint64_t crc) const {
  if (unit == 0 || chunk == 0 || (unit % chunk != 0 && chunk % unit != 0)) return false;
  if (crcs.size() != (size + unit - 1) / unit) return false;
  uint64_t whole = 0;  // the units' CRCs must make the file's: a record of this very copy
  for (size_t u = 0; u < crcs.size(); ++u)
    whole = crc64_combine(whole, crcs[u], std::min<uint64_t>(unit, size - u * unit));
  return whole == crc;
}

ChunkRecord make_chunk_record(std::span<const uint64_t> chunk_crcs, uint64_t chunk, uint64_t size) {
  ChunkRecord r;
  if (chunk == 0) return r;
  uint64_t per = 1;  // chunks per unit
  while ((chunk_crcs.size() + per - 1) / per > kMaxRecordUnits) per *= 2;
  r.unit = chunk * per;
  for (size_t c = 0; c < chunk_crcs.size(); c += per) {
    uint64_t crc = 0;
    for (size_t j = c; j < std::min(chunk_crcs.size(), c + per); ++j)
      crc = crc64_combine(crc, chunk_crcs[j], std::min<uint64_t>(chunk, size - j * chunk));
    r.crcs.push_back(crc);
  }
  return r;
}

// "SFC1", the number of units (u32), the unit (u64), then each unit's CRC (u64), little-endian.
namespace {
constexpr char kRecordMagic[4] = {'S', 'F', 'C', '1'};
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffU));
}
uint64_t get_le(std::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}
}  // namespace

std::string encode_chunk_record(const ChunkRecord& r) {
  std::string out(kRecordMagic, sizeof kRecordMagic);
  put_le(out, r.crcs.size(), 4);
  put_le(out, r.unit, 8);
  for (uint64_t c : r.crcs) put_le(out, c, 8);
  return out;
}

std::optional<ChunkRecord> decode_chunk_record(std::string_view in) {
  if (in.size() < 16 || in.substr(0, 4) != std::string_view(kRecordMagic, 4)) return std::nullopt;
  const uint64_t n = get_le(in, 4, 4);
  if (n == 0 || n > kMaxRecordUnits || in.size() != 16 + 8 * n) return std::nullopt;
  ChunkRecord r;
  r.unit = get_le(in, 8, 8);
  if (r.unit == 0) return std::nullopt;
  for (uint64_t i = 0; i < n; ++i) r.crcs.push_back(get_le(in, 16 + 8 * i, 8));
  return r;
}

namespace {

std::optional<Origin> decode_origin(const std::string& s) {
  Origin o;
  uint64_t crc = 0;
  if (std::sscanf(s.c_str(), "v1 %" SCNu64 " %" SCNd64 " %" SCNd64 " %" SCNu64 " %" SCNu64 " %" SCNx64,
                  &o.source.size, &o.source.mtime_ns, &o.source.ctime_ns, &o.source.ino, &o.source.dev,
                  &crc) != 6)
    return std::nullopt;
  o.crc = crc;
  o.crc_known = true;
  return o;
}

// pwrite of all of data at off, in calls of at most `piece` bytes, retrying EINTR and short
// writes; stops at the first error: how far it got, and the errno (0: all written).
struct Written {
  uint64_t bytes = 0;
  int err = 0;
};
Written pwrite_all(int fd, std::span<const std::byte> data, uint64_t off, size_t piece) {
  Written w;
  while (w.bytes < data.size()) {
    const size_t n = std::min<uint64_t>(data.size() - w.bytes, piece);
    const ssize_t r = ::pwrite(fd, data.data() + w.bytes, n, static_cast<off_t>(off + w.bytes));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {  // 0 would loop forever: no regular file answers that, call it an I/O error
      w.err = r < 0 ? errno : EIO;
      break;
    }
    w.bytes += static_cast<uint64_t>(r);
  }
  return w;
}

class PosixTxn final : public Txn {
 public:
  PosixTxn(std::string dest, std::string temp, bool direct, CopyXattrs xattrs)
      : dest_(std::move(dest)), temp_(std::move(temp)), xattrs_(std::move(xattrs)), direct_(direct) {}
  ~PosixTxn() override { abort(); }

  Status write(uint64_t off, std::span<const std::byte> data) override {
    if (auto st = open_rw(); !st) return st;
    // The aligned middle goes direct (when the buffer is aligned too); the rest buffered.
    // Small writes (packed small files) never try: a second descriptor is not worth it.
    if (direct_ && data.size() >= kMinDirectWrite && !dfd_.valid()) open_direct();
    const uint64_t head = std::min<uint64_t>(data.size(), (align_ - off % align_) % align_);
    const uint64_t body = (data.size() - head) / align_ * align_;
    const bool aligned_mem = reinterpret_cast<uintptr_t>(data.data() + head) % align_ == 0;
    if (dfd_.valid() && body > 0 && aligned_mem) {
      if (auto st = write_buffered(off, data.first(head)); !st) return st;
      auto done = write_direct(off + head, data.subspan(head, body));
      if (!done) return done.error();
      const uint64_t rest = head + *done;  // less than head + body if direct I/O was refused
      if (auto st = write_buffered(off + rest, data.subspan(rest)); !st) return st;
    } else if (auto st = write_buffered(off, data); !st) {
      return st;
    }
    end_ = std::max(end_, off + data.size());
    return {};
  }

  Status finish(const FileMeta& src, uint64_t crc, const ChunkRecord* chunks) override {
    dfd_.reset();
    if (auto st = open_rw(); !st) return st;
    // A fresh temporary file written up to src.size has that size already (most copies); one
    // that ends in a hole (zero chunks are not written) gets it here.
    if (end_ != src.size && ::ftruncate(fd_.get(), static_cast<off_t>(src.size)) != 0)
      return sys_error(errno, "set size of local copy", temp_);
    // The xattrs before the mode: setting a user.* xattr needs write permission, which the
    // source's mode (0444) takes from a writer that is not root.
    const std::string origin = encode_origin(src, crc);
    if (!xattrs_.origin.empty() &&
        ::fsetxattr(fd_.get(), xattrs_.origin.c_str(), origin.data(), origin.size(), 0) != 0 &&
        errno != ENOTSUP)
      return sys_error(errno, "record origin of local copy", temp_);
    record_chunks(chunks);
    if (::fchmod(fd_.get(), src.mode & 0777U) != 0) return sys_error(errno, "chmod local copy", temp_);
    const timespec times[2] = {{0, UTIME_OMIT}, from_ns(src.mtime_ns)};
    if (::futimens(fd_.get(), times) != 0) return sys_error(errno, "set mtime of local copy", temp_);
    fd_.reset();
    finished_ = true;
    return {};
  }

  Status sync() override {
    Fd fd(::open(temp_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid()) return sys_error(errno, "open local copy", temp_);
    if (::fsync(fd.get()) != 0) return sys_error(errno, "sync local copy", temp_);
    return {};
  }

  Status rewind() override {
    dfd_.reset();
    if (auto st = open_rw(); !st) return st;
    if (::ftruncate(fd_.get(), 0) != 0) return sys_error(errno, "empty temporary file", temp_);
    end_ = 0;
    return {};
  }

  Result<uint64_t> crc_on_disk() override {
    Fd fd(::open(temp_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid()) return sys_error(errno, "open local copy", temp_);
    return crc_of_fd(fd.get(), temp_, true);
  }

  Result<uint64_t> size_on_disk() override {
    struct stat st {};
    if (::lstat(temp_.c_str(), &st) != 0) return sys_error(errno, "stat local copy", temp_);
    return static_cast<uint64_t>(st.st_size);
  }

  Status commit_unsynced() override {
    fd_.reset();
    dfd_.reset();
    if (::rename(temp_.c_str(), dest_.c_str()) != 0) return sys_error(errno, "publish local copy", dest_);
    committed_ = true;
    return {};
  }

  Status commit() override {
    if (auto st = commit_unsynced(); !st) return st;
    // Durable only once the directory entry is: a directory that cannot be opened (EMFILE...)
    // is an error like a failed fsync, not a copy silently left unsynced.
    Fd dir(::open(parent_dir(dest_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) return sys_error(errno, "open directory of", dest_);
    if (::fsync(dir.get()) != 0) return sys_error(errno, "sync directory of", dest_);
    return {};
  }

  void abort() noexcept override {
    if (committed_ || aborted_) return;
    aborted_ = true;
    fd_.reset();
    dfd_.reset();
    ::unlink(temp_.c_str());
  }

  [[nodiscard]] const std::string& temp_path() const override { return temp_; }

 private:
  // The copy's chunk CRCs, if the store records them: a copy without them still serves its
  // own node and feeds transfers without reads during the copy, so a filesystem that refuses
  // the xattr (no user xattrs, too large) costs nothing else.
  void record_chunks(const ChunkRecord* chunks) {
    if (xattrs_.chunks.empty() || chunks == nullptr || chunks->crcs.empty()) return;
    const std::string v = encode_chunk_record(*chunks);
    if (::fsetxattr(fd_.get(), xattrs_.chunks.c_str(), v.data(), v.size(), 0) != 0)
      spdlog::debug("{}: chunk record of {} not kept: {}", host_name(), temp_, std::strerror(errno));
  }

  Status open_rw() {
    if (fd_.valid()) return {};
    // Written again after finish() (a transfer fed again): finish() gave it the source's mode,
    // which may forbid writing (0444) to a writer that is not root.
    if (finished_ && ::fchmodat(AT_FDCWD, temp_.c_str(), 0600, AT_SYMLINK_NOFOLLOW) != 0)
      return sys_error(errno, "make temporary file writable again", temp_);
    finished_ = false;
    fd_ = Fd(::open(temp_.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd_.valid()) return sys_error(errno, "open temporary file", temp_);
    return {};
  }

  Status write_buffered(uint64_t off, std::span<const std::byte> data) {
    // At most 1 MiB per call: the kernel's page-cache copy then reads from CPU caches rather
    // than RAM (bench/try_split_pwrite.sh).
    const Written w = pwrite_all(fd_.get(), data, off, kWritePiece);
    if (w.err != 0) return sys_error(w.err, "write local copy of", dest_);
    return {};
  }

  // Writes what O_DIRECT accepts and returns how much that was: all of it, or less when the
  // filesystem refuses direct I/O (EINVAL at open or at a write, including the write after a
  // short one left the offset unaligned: tmpfs on old kernels, some FUSE and network
  // filesystems), after which this copy is written buffered.
  Result<uint64_t> write_direct(uint64_t off, std::span<const std::byte> data) {
    const Written w = pwrite_all(dfd_.get(), data, off, kMaxDirectWrite);
    if (w.err == EINVAL) {
      refuse_direct(w.err);
      return w.bytes;
    }
    if (w.err != 0) return sys_error(w.err, "write local copy of", dest_);
    return w.bytes;
  }

  // Opens the O_DIRECT descriptor and learns the filesystem's alignment (statx DIOALIGN, Linux
  // >= 6.1): offsets and lengths in units of at least 4 KiB, more where the filesystem needs
  // more (large blocks), so a buffered head or tail never shares a block with a direct body.
  // A filesystem that says it cannot do direct I/O, or refuses the open, gets buffered writes.
  void open_direct() {
    dfd_ = Fd(::open(temp_.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECT));
    if (!dfd_.valid()) {
      refuse_direct(errno);
      return;
    }
    struct statx sx {};
    if (::statx(dfd_.get(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN) != 0) {
      if (sx.stx_dio_offset_align == 0) {
        refuse_direct(EINVAL);
        return;
      }
      align_ = std::max<uint64_t>({kDirectAlign, sx.stx_dio_offset_align, sx.stx_dio_mem_align});
    }
  }

  void refuse_direct(int err) {
    spdlog::debug("{}: direct I/O refused for {} ({}): writing it buffered", host_name(), temp_,
                  std::strerror(err));
    direct_ = false;
    dfd_.reset();
  }

  static constexpr size_t kMaxDirectWrite = size_t{1} << 30;
  static constexpr size_t kMinDirectWrite = size_t{64} << 10;

  Fd fd_;
  Fd dfd_;  // the same file opened O_DIRECT, while direct I/O works
  std::string dest_;
  std::string temp_;
  CopyXattrs xattrs_;              // where finish() records the origin and the chunks' CRCs
  bool direct_ = false;            // still willing to try O_DIRECT for this copy
  uint64_t align_ = kDirectAlign;  // direct I/O unit (offsets, lengths, memory)
  uint64_t end_ = 0;               // end of the furthest write
  bool finished_ = false;          // finish() ran (and set the source's mode) since the last write
  bool committed_ = false;
  bool aborted_ = false;
};

}  // namespace

std::optional<Origin> origin_of_fd(int fd, const std::string& xattr) {
  if (xattr.empty()) return std::nullopt;
  char buf[256];
  const ssize_t n = ::fgetxattr(fd, xattr.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return std::nullopt;
  return decode_origin(std::string(buf, static_cast<size_t>(n)));
}

bool origin_matches(const Origin& o, int64_t copy_mtime_ns, const FileMeta& src, SourceVersion rule) {
  return same_version(o.source, src, rule) && copy_mtime_ns == src.mtime_ns;
}

Result<LocalState> PosixStore::inspect(const std::string& path) {
  LocalState ls;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return ls;
    return sys_error(errno, "stat destination", path);
  }
  ls.exists = true;
  ls.regular = S_ISREG(st.st_mode);
  ls.is_dir = S_ISDIR(st.st_mode);
  ls.special = special_file_kind(st.st_mode);
  ls.size = static_cast<uint64_t>(st.st_size);
  ls.mtime_ns = to_ns(st.st_mtim);
  ls.dev = static_cast<uint64_t>(st.st_dev);
  ls.ino = static_cast<uint64_t>(st.st_ino);
  if (S_ISLNK(st.st_mode)) {
    std::string t(static_cast<size_t>(st.st_size) + 1, '\0');
    const ssize_t n = ::readlink(path.c_str(), t.data(), t.size());
    if (n >= 0) ls.link_target.assign(t.data(), static_cast<size_t>(n));
  }
  if (ls.regular && !opt_.xattrs.origin.empty()) {
    char buf[256];
    const ssize_t n = ::lgetxattr(path.c_str(), opt_.xattrs.origin.c_str(), buf, sizeof buf - 1);
    if (n > 0) ls.origin = decode_origin(std::string(buf, static_cast<size_t>(n)));
  }
  return ls;
}

Result<std::unique_ptr<SourceFile>> PosixStore::open_copy(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | kNoWaitOpen));
  if (!fd.valid()) return sys_error(errno, "open local copy", path);
  struct stat st {};
  if (auto s = settle_regular(fd.get(), st, path); !s) return s.error();
  return posix_source_file(std::move(fd), path, static_cast<uint64_t>(st.st_size));
}

Result<std::optional<CopyRecord>> PosixStore::chunk_record(const std::string& path) {
  if (opt_.xattrs.chunks.empty()) return std::optional<CopyRecord>();
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | kNoWaitOpen));
  if (!fd.valid()) return sys_error(errno, "open local copy", path);
  struct stat st {};
  if (auto s = settle_regular(fd.get(), st, path); !s) return s.error();
  std::string buf(16 + 8 * kMaxRecordUnits, '\0');
  const ssize_t n = ::fgetxattr(fd.get(), opt_.xattrs.chunks.c_str(), buf.data(), buf.size());
  if (n <= 0) return std::optional<CopyRecord>();
  auto rec = decode_chunk_record(std::string_view(buf.data(), static_cast<size_t>(n)));
  if (!rec) return std::optional<CopyRecord>();
  return std::optional<CopyRecord>(
      CopyRecord{std::move(*rec), static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
}

Result<uint64_t> PosixStore::checksum(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return sys_error(errno, "open local copy", path);
  return crc_of_fd(fd.get(), path, false);
}

Result<uint64_t> PosixStore::free_bytes(const std::string& path) {
  struct statvfs sv {};
  const std::string dir = parent_dir(path);
  if (::statvfs(dir.c_str(), &sv) != 0) return sys_error(errno, "statvfs destination directory", dir);
  return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
}

Result<std::unique_ptr<Txn>> PosixStore::begin(const std::string& path) {
  const std::string temp = temp_name_for(path);
  constexpr int kCreate = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
  Fd fd(::open(temp.c_str(), kCreate, 0600));
  if (!fd.valid() && errno == EEXIST) {
    ::unlink(temp.c_str());  // our own leftover (same host and pid) cannot be in use
    fd = Fd(::open(temp.c_str(), kCreate, 0600));
  }
  if (!fd.valid()) return sys_error(errno, "create temporary file for destination", path);
  return std::unique_ptr<Txn>(new PosixTxn(path, temp, opt_.direct_io, opt_.xattrs));
}

namespace {

// The default publication: one sync of the filesystem that holds the group, before the renames.
class SyncPublication final : public Publication {
 public:
  SyncPublication(LocalStore& store, std::string dir) : store_(store), dir_(std::move(dir)) {}
  Status data_durable() override { return store_.sync_filesystem(dir_); }
  void done() override {}

 private:
  LocalStore& store_;
  std::string dir_;
};

}  // namespace

std::unique_ptr<Publication> LocalStore::publication(const std::string& dir,
                                                     std::vector<std::string> /*paths*/) {
  return std::make_unique<SyncPublication>(*this, dir);
}

Status PosixStore::sync_filesystem(const std::string& path) {
  Fd fd(::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || ::syncfs(fd.get()) != 0) return sys_error(errno, "sync filesystem of", path);
  return {};
}

Status PosixStore::make_dir(const std::string& path, uint32_t mode) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return sys_error(errno, "create directory", path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return sys_error(errno, "stat directory", path);
  if (!S_ISDIR(st.st_mode)) return sys_error(ENOTDIR, "create directory", path);
  if ((st.st_mode & 07777U) != (mode | 0700U) && ::chmod(path.c_str(), mode | 0700U) != 0)
    return sys_error(errno, "chmod directory", path);
  return {};
}

Status PosixStore::make_parents(const std::string& path) {
  const std::string dir = parent_dir(path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return {};
    return sys_error(ENOTDIR, "destination directory", dir);
  }
  if (dir != "/" && dir != ".") {
    if (auto s = make_parents(dir); !s) return s;
  }
  if (::mkdir(dir.c_str(), opt_.parent_mode) != 0 && errno != EEXIST)
    return sys_error(errno, "create directory", dir);
  return {};
}

Status PosixStore::make_symlink(const std::string& path, const std::string& target) {
  const std::string temp = temp_name_for(path);
  ::unlink(temp.c_str());
  if (::symlink(target.c_str(), temp.c_str()) != 0) return sys_error(errno, "create symlink", path);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    return sys_error(err, "publish symlink", path);
  }
  return {};
}

int PosixStore::remove_stale_temps(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  std::vector<std::string> victims;
  while (const dirent* de = ::readdir(d)) {
    const std::string name = de->d_name;
    const long pid = temp_name_pid(name);
    if (pid > 0 && pid != ::getpid() && process_gone(pid)) victims.push_back(dir + "/" + name);
  }
  ::closedir(d);
  for (const auto& v : victims)
    if (::unlink(v.c_str()) == 0) ++removed;
  return removed;
}

}  // namespace stage
