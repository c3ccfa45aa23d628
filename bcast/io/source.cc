#include "bcast/io/source.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>

#include "bcast/io/fd.h"
#include "bcast/io/temp_name.h"

namespace stage {

FileMeta meta_from_stat(const struct stat& st) {
  FileMeta m;
  m.size = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
  m.mtime_ns = to_ns(st.st_mtim);
  m.ctime_ns = to_ns(st.st_ctim);
  m.ino = st.st_ino;
  m.dev = st.st_dev;
  m.mode = st.st_mode & 07777U;
  return m;
}

uint64_t allocated_from_stat(const struct stat& st) {
  return S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_blocks) * 512U : 0;
}

Status settle_regular(int fd, struct stat& st, const std::string& path) {
  if (::fstat(fd, &st) != 0) return sys_error(errno, "stat source", path);
  if (!S_ISREG(st.st_mode)) return stage_error(Errc::unsupported, "source (not a regular file)", path);
  // F_SETFL sets only O_APPEND, O_ASYNC, O_DIRECT, O_NOATIME and O_NONBLOCK, and a source is
  // opened O_RDONLY with kNoWaitOpen only: 0 clears O_NONBLOCK without an F_GETFL first (one
  // syscall less per file of a batch).
  if (::fcntl(fd, F_SETFL, 0) != 0) return sys_error(errno, "fcntl source", path);
  return {};
}

namespace {

class PosixSourceFile final : public SourceFile {
 public:
  // A batch reads thousands of small files, and each syscall here costs about as much as
  // reading one: below 1 MiB neither the readahead hint nor the hole check is worth it (the
  // file is read in one call, and its holes read as zeros).
  static constexpr uint64_t kAskBelow = uint64_t{1} << 20;

  PosixSourceFile(Fd fd, std::string path, uint64_t size)
      : fd_(std::move(fd)), path_(std::move(path)), size_(size) {
    if (size_ >= kAskBelow) ::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  }

  Status read_at(uint64_t off, std::span<std::byte> buf) override {
    const ssize_t n = pread_full(fd_.get(), buf.data(), buf.size(), off);
    if (n < 0) return sys_error(static_cast<int>(-n), "read source", path_);
    if (static_cast<size_t>(n) < buf.size()) {
      Error e = stage_error(Errc::short_read, "read source", path_);
      e.message += " (at byte " + std::to_string(off + static_cast<uint64_t>(n)) + " of " +
                   std::to_string(size_) + ")";
      return e;
    }
    return {};
  }

  bool has_data(uint64_t off, uint64_t len) override {
    if (size_ < kAskBelow) return true;
    const off_t d = ::lseek(fd_.get(), static_cast<off_t>(off), SEEK_DATA);
    if (d < 0) return errno != ENXIO;  // ENXIO: only a hole up to EOF
    return static_cast<uint64_t>(d) < off + len;
  }

  Result<FileMeta> stat_now() override {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) return sys_error(errno, "stat source", path_);
    return meta_from_stat(st);
  }

  std::optional<Sparseness> sparseness(uint64_t size, uint64_t align, size_t max_extents) override;

  Result<bool> data_past(uint64_t size) override {
    std::byte b{};
    for (;;) {
      const ssize_t n = ::pread(fd_.get(), &b, 1, static_cast<off_t>(size));
      if (n >= 0) return n > 0;
      if (errno != EINTR) return sys_error(errno, "read source", path_);
    }
  }

 private:
  Fd fd_;
  std::string path_;
  uint64_t size_;
};

constexpr uint64_t kBlock = 4096;  // what a copy's data occupies: 4 KiB blocks
uint64_t round_down(uint64_t v, uint64_t a) {
  return v / a * a;
}
uint64_t round_up(uint64_t v, uint64_t a) {
  return v % a == 0 ? v : (v / a + 1) * a;
}

// The hole [from, to) of a file of `size` bytes, cut to whole chunks of `align` bytes (its
// end may be the file's end), appended to holes if anything is left.
void add_hole(std::vector<Extent>& holes, uint64_t from, uint64_t to, uint64_t size, uint64_t align) {
  const uint64_t a = round_up(from, align);
  const uint64_t b = to >= size ? size : round_down(to, align);
  if (a >= b) return;
  if (!holes.empty() && holes.back().off + holes.back().len == a)
    holes.back().len += b - a;
  else
    holes.push_back(Extent{a, b - a});
}

// One SEEK_DATA, one SEEK_HOLE per data extent (a file with few extents costs a few calls,
// however large it is). A filesystem that cannot tell says "all data" (Linux's generic answer).
std::optional<Sparseness> PosixSourceFile::sparseness(uint64_t size, uint64_t align, size_t max_extents) {
  Sparseness out;
  const auto all_data = [&] { return Sparseness{{}, round_up(size, kBlock), 1}; };
  for (uint64_t pos = 0; pos < size;) {
    const off_t d = ::lseek(fd_.get(), static_cast<off_t>(pos), SEEK_DATA);
    if (d < 0 && errno != ENXIO) return all_data();
    const uint64_t data = d < 0 ? size : std::min<uint64_t>(static_cast<uint64_t>(d), size);
    if (data < pos) return all_data();
    add_hole(out.holes, pos, data, size, align);
    if (data >= size) break;
    if (out.extents >= max_extents) {  // looked far enough: the rest counts as data
      out.copy_bytes += round_up(size, kBlock) - round_down(data, kBlock);
      break;
    }
    const off_t h = ::lseek(fd_.get(), static_cast<off_t>(data), SEEK_HOLE);
    if (h < 0 || static_cast<uint64_t>(h) <= data) return all_data();
    pos = std::min<uint64_t>(static_cast<uint64_t>(h), size);
    out.copy_bytes += round_up(pos, kBlock) - round_down(data, kBlock);
    ++out.extents;
  }
  // An extent map beyond what the inode holds (ext4: 4 extents; then 340 per 4 KiB block).
  if (out.extents > 4) out.copy_bytes += (out.extents + 339) / 340 * kBlock;
  return out;
}

struct Walker {
  const SourceReader::SkipFn& skipped;
  Manifest& m;

  Status walk(const std::string& abs, const std::string& rel) {
    DIR* d = ::opendir(abs.c_str());
    if (d == nullptr) return sys_error(errno, "open source directory", abs);
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* de = ::readdir(d)) {
      const std::string name = de->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    const int err = errno;
    ::closedir(d);
    if (err != 0) return sys_error(err, "read source directory", abs);
    std::sort(names.begin(), names.end());  // same order on every run
    for (const std::string& name : names) {
      const std::string cabs = abs + "/" + name;
      const std::string crel = rel.empty() ? name : rel + "/" + name;
      struct stat st {};
      if (::lstat(cabs.c_str(), &st) != 0) return sys_error(errno, "stat source", cabs);
      Entry e{crel, EntryType::file, meta_from_stat(st), {}, allocated_from_stat(st)};
      if (S_ISREG(st.st_mode) && is_temp_name(name)) {
        // Its copy would be the temporary file of the copy of its neighbour in the destination.
        if (skipped) skipped(cabs, "named like a stage-bcast temporary file");
      } else if (S_ISREG(st.st_mode)) {
        if (::access(cabs.c_str(), R_OK) != 0) return sys_error(errno, "source", cabs);
        m.entries.push_back(std::move(e));
      } else if (S_ISDIR(st.st_mode)) {
        e.type = EntryType::dir;
        m.entries.push_back(std::move(e));
        if (auto s = walk(cabs, crel); !s) return s;
      } else if (S_ISLNK(st.st_mode)) {
        std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
        const ssize_t n = ::readlink(cabs.c_str(), target.data(), target.size());
        if (n < 0) return sys_error(errno, "read symlink", cabs);
        target.resize(static_cast<size_t>(n));
        e.type = EntryType::symlink;
        e.meta.size = 0;
        e.link_target = std::move(target);
        m.entries.push_back(std::move(e));
      } else if (skipped) {
        skipped(cabs, "not a regular file, directory or symlink");
      }
    }
    return {};
  }
};

}  // namespace

Result<Manifest> PosixSource::scan(const std::string& path, bool recursive, const SkipFn& skipped) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return sys_error(errno, "source", path);
  Manifest m;
  if (S_ISDIR(st.st_mode)) {
    if (!recursive) return sys_error(EISDIR, "source (use --recursive to stage a directory tree)", path);
    m.tree = true;
    m.entries.push_back(Entry{"", EntryType::dir, meta_from_stat(st), {}, 0});
    Walker w{skipped, m};
    if (auto s = w.walk(path, ""); !s) return s.error();
    return m;
  }
  if (!S_ISREG(st.st_mode)) return stage_error(Errc::unsupported, "source", path);
  // Check readability now so every rank hears about it before any collective on data.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | kNoWaitOpen));
  if (!fd.valid()) return sys_error(errno, "open source", path);
  m.entries.push_back(Entry{"", EntryType::file, meta_from_stat(st), {}, allocated_from_stat(st)});
  return m;
}

void scan_sparse_files(SourceReader& src, const std::string& root, Manifest& m) {
  size_t budget = kMaxScanExtents;
  for (Entry& e : m.entries) {
    if (e.type != EntryType::file || e.allocated >= e.meta.size) continue;
    if (budget == 0) {  // not looked at: it may take its whole size
      e.allocated = e.meta.size;
      continue;
    }
    auto f = src.open(root, e);
    if (!f) continue;  // the reader's own open finds out why
    auto sp = (*f)->sparseness(e.meta.size, m.chunk_size, budget);
    if (!sp) continue;
    budget -= std::min(budget, sp->extents);
    e.holes = std::move(sp->holes);
    e.allocated = std::max(e.allocated, sp->copy_bytes);
  }
}

std::unique_ptr<SourceFile> posix_source_file(Fd fd, std::string path, uint64_t size) {
  return std::unique_ptr<SourceFile>(new PosixSourceFile(std::move(fd), std::move(path), size));
}

Result<std::unique_ptr<SourceFile>> PosixSource::open(const std::string& root, const Entry& e) {
  const std::string path = join_path(root, e.path);
  // The root may be a symlink the user named; below it, symlinks are never followed.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | kNoWaitOpen | (e.path.empty() ? 0 : O_NOFOLLOW)));
  if (!fd.valid()) return sys_error(errno, "open source", path);
  struct stat st {};
  if (auto s = settle_regular(fd.get(), st, path); !s || meta_from_stat(st) != e.meta)
    return stage_error(Errc::source_changed, "open source", path);
  return std::unique_ptr<SourceFile>(new PosixSourceFile(std::move(fd), path, e.meta.size));
}

}  // namespace stage
