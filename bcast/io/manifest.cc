#include "bcast/io/manifest.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

namespace stage {
namespace {

constexpr uint32_t kMagic = 0x53544734;  // "STG4": ranks of different versions refuse each other
constexpr uint64_t kMaxEntries = 1ULL << 26;
constexpr uint32_t kMaxPath = 4096;
// Holes listed in one manifest, all files together (16 bytes each on the wire).
constexpr uint64_t kMaxHoles = 1ULL << 20;

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  std::string take() { return std::move(out_); }

 private:
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
  bool u8(uint8_t& v) { return raw(&v, sizeof v); }
  bool u32(uint32_t& v) { return raw(&v, sizeof v); }
  bool u64(uint64_t& v) { return raw(&v, sizeof v); }
  bool str(std::string& s) {
    uint32_t n = 0;
    if (!u32(n) || n > kMaxPath || n > b_.size() - pos_) return false;
    s.assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  [[nodiscard]] bool at_end() const { return pos_ == b_.size(); }
  [[nodiscard]] size_t remaining() const { return b_.size() - pos_; }

 private:
  bool raw(void* p, size_t n) {
    if (n > b_.size() - pos_) return false;
    std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::span<const std::byte> b_;
  size_t pos_ = 0;
};

Error bad(const char* why) {
  return stage_error(Errc::bad_message, std::string("manifest: ") + why);
}

}  // namespace

int64_t to_ns(const struct timespec& ts) noexcept {
  constexpr int64_t kMaxSec = INT64_MAX / 1000000000LL - 1;
  const int64_t sec = std::clamp<int64_t>(ts.tv_sec, -kMaxSec, kMaxSec);
  return sec * 1000000000LL + ts.tv_nsec;
}

struct timespec from_ns(int64_t ns) noexcept {
  int64_t sec = ns / 1000000000LL;
  int64_t rem = ns % 1000000000LL;
  if (rem < 0) {  // floor: tv_nsec must be in [0, 1e9) for times before 1970
    rem += 1000000000LL;
    --sec;
  }
  return timespec{static_cast<time_t>(sec), static_cast<long>(rem)};
}

void order_files_first(Manifest& m, const std::vector<std::string>& first) {
  if (first.empty()) return;
  // Directories and symlinks first, as they were (a parent before what it holds: decode()
  // insists), then the files: the named ones in first's order, then the others as they were.
  std::vector<Entry> out;
  out.reserve(m.entries.size());
  std::unordered_map<std::string_view, size_t> file_at;
  for (size_t i = 0; i < m.entries.size(); ++i) {
    if (m.entries[i].type == EntryType::file)
      file_at.emplace(m.entries[i].path, i);
    else
      out.push_back(m.entries[i]);
  }
  std::vector<char> taken(m.entries.size(), 0);
  for (const std::string& p : first)
    if (auto it = file_at.find(p); it != file_at.end() && taken[it->second] == 0) {
      taken[it->second] = 1;
      out.push_back(m.entries[it->second]);
    }
  for (size_t i = 0; i < m.entries.size(); ++i)
    if (m.entries[i].type == EntryType::file && taken[i] == 0) out.push_back(m.entries[i]);
  m.entries = std::move(out);
}

bool is_safe_relative(std::string_view path) {
  if (path.empty()) return true;  // the root itself
  if (path.front() == '/' || path.find('\0') != std::string_view::npos) return false;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

std::string join_path(const std::string& root, const std::string& rel) {
  if (rel.empty()) return root;
  if (root.empty()) return rel;
  if (root.back() == '/') return root + rel;
  return root + "/" + rel;
}

std::string encode(const Manifest& m) {
  Writer w;
  w.u32(kMagic);
  w.u8(m.tree ? 1 : 0);
  w.u64(m.chunk_size);
  w.u64(m.entries.size());
  for (const Entry& e : m.entries) {
    w.str(e.path);
    w.u8(static_cast<uint8_t>(e.type));
    w.u64(e.meta.size);
    w.u64(e.allocated);
    w.u64(static_cast<uint64_t>(e.meta.mtime_ns));
    w.u64(static_cast<uint64_t>(e.meta.ctime_ns));
    w.u64(e.meta.ino);
    w.u64(e.meta.dev);
    w.u32(e.meta.mode);
    w.str(e.link_target);
    w.u32(static_cast<uint32_t>(e.holes.size()));
    for (const Extent& h : e.holes) {
      w.u64(h.off);
      w.u64(h.len);
    }
  }
  return w.take();
}

uint64_t streamed_bytes(const Entry& e) {
  uint64_t holes = 0;
  for (const Extent& h : e.holes) holes += h.len;
  return e.meta.size - holes;
}

namespace {

// A file's holes, as decode() accepts them: in order, disjoint, not empty, inside the file,
// each from a multiple of the chunk size to one (or to the file's end).
bool holes_fit(const std::vector<Extent>& holes, uint64_t size, uint64_t chunk) {
  uint64_t end = 0;
  for (const Extent& h : holes) {
    if (h.len == 0 || h.off < end || h.off > size || h.len > size - h.off) return false;
    if (h.off % chunk != 0 || ((h.off + h.len) % chunk != 0 && h.off + h.len != size)) return false;
    end = h.off + h.len;
  }
  return true;
}

bool read_holes(Reader& r, uint64_t& budget, std::vector<Extent>& holes) {
  uint32_t n = 0;
  if (!r.u32(n) || n > budget || n > r.remaining() / 16) return false;
  budget -= n;
  holes.resize(n);
  for (Extent& h : holes)
    if (!r.u64(h.off) || !r.u64(h.len)) return false;
  return true;
}

}  // namespace

Result<Manifest> decode(std::span<const std::byte> bytes) {
  Reader r(bytes);
  uint32_t magic = 0;
  uint8_t tree = 0;
  uint64_t count = 0;
  if (!r.u32(magic) || magic != kMagic) return bad("bad magic");
  if (!r.u8(tree) || tree > 1) return bad("bad flags");
  uint64_t chunk = 0;
  if (!r.u64(chunk) || check_chunk_size(chunk)) return bad("bad chunk size");
  if (!r.u64(count) || count > kMaxEntries || count > bytes.size()) return bad("bad entry count");
  Manifest m;
  m.tree = tree == 1;
  m.chunk_size = chunk;
  m.entries.reserve(count);
  std::unordered_set<std::string> dirs;  // a parent must be a directory listed earlier
  uint64_t hole_budget = kMaxHoles;
  for (uint64_t i = 0; i < count; ++i) {
    Entry e;
    uint8_t type = 0;
    uint64_t mtime = 0;
    uint64_t ctime = 0;
    if (!r.str(e.path) || !r.u8(type) || !r.u64(e.meta.size) || !r.u64(e.allocated) || !r.u64(mtime) ||
        !r.u64(ctime) || !r.u64(e.meta.ino) || !r.u64(e.meta.dev) || !r.u32(e.meta.mode) ||
        !r.str(e.link_target) || !read_holes(r, hole_budget, e.holes))
      return bad("truncated entry");
    if (type < 1 || type > 3) return bad("bad entry type");
    e.type = static_cast<EntryType>(type);
    e.meta.mtime_ns = static_cast<int64_t>(mtime);
    e.meta.ctime_ns = static_cast<int64_t>(ctime);
    if (!is_safe_relative(e.path)) return bad("unsafe path");
    if (e.path.empty() && (m.tree ? e.type != EntryType::dir : count != 1)) return bad("bad root entry");
    if (!m.tree && !e.path.empty()) return bad("path in a single-file manifest");
    if ((e.meta.mode & ~07777U) != 0) return bad("bad mode");
    if (e.type == EntryType::symlink ? e.link_target.empty() : !e.link_target.empty())
      return bad("bad symlink target");
    if (e.type != EntryType::file && e.meta.size != 0 && e.type != EntryType::symlink)
      return bad("size on a directory");
    if (e.meta.size > (1ULL << 62)) return bad("size out of range");
    if (!e.holes.empty() && (e.type != EntryType::file || !holes_fit(e.holes, e.meta.size, m.chunk_size)))
      return bad("bad holes");
    if (!e.path.empty()) {
      const size_t slash = e.path.rfind('/');
      const std::string parent = slash == std::string::npos ? "" : e.path.substr(0, slash);
      if (!dirs.contains(parent)) return bad("entry whose parent is not a listed directory");
    }
    if (e.type == EntryType::dir) dirs.insert(e.path);
    m.entries.push_back(std::move(e));
  }
  if (!r.at_end()) return bad("trailing bytes");
  return m;
}

}  // namespace stage
