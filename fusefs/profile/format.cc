// The profile codec (format.h; the layout is docs/profile-format.md's).
#include "fusefs/profile/format.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_set>

#include "bcast/io/crc.h"
#include "bcast/io/manifest.h"

namespace stagefs {

namespace {

constexpr char kMagic[7] = {'S', 'T', 'G', 'P', 'R', 'O', 'F'};
constexpr size_t kHeader = 16;  // magic, version, flags, 3 reserved bytes, body length (u32)
constexpr size_t kTrailer = 8;  // CRC-64 of the header and the body
constexpr uint8_t kTruncated = 1;
constexpr uint64_t kMaxPathBytes = 4096;
constexpr uint64_t kMaxName = 255;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_string(std::string& out, std::string_view s) {
  put_varint(out, s.size());
  out.append(s);
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t zigzag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
int64_t unzigzag(uint64_t v) {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

// A file's directory ("" at the root) and name.
std::pair<std::string_view, std::string_view> split(std::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return {std::string_view(), path};
  return {path.substr(0, slash), path.substr(slash + 1)};
}

bool plain_name(std::string_view n) {
  return !n.empty() && n.size() <= kMaxName && n != "." && n != ".." &&
         n.find('/') == std::string_view::npos && n.find('\0') == std::string_view::npos;
}
bool safe_dir(std::string_view d) {
  return d.empty() ||
         (d.size() < kMaxPathBytes && d.find('\0') == std::string_view::npos && stage::is_safe_relative(d));
}

// Reads the body; every read is bounded by what is left.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
  bool varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ == b_.size()) return false;
      const auto byte = static_cast<uint8_t>(b_[pos_++]);
      if (shift == 63 && byte > 1) return false;  // past 64 bits
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }
  bool bounded(uint64_t& v, uint64_t max) { return varint(v) && v <= max; }
  bool bytes(std::string& s, uint64_t n) {
    s.clear();
    return append(s, n);
  }
  bool append(std::string& s, uint64_t n) {
    if (n > left()) return false;
    s.append(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  [[nodiscard]] uint64_t left() const { return b_.size() - pos_; }

 private:
  std::span<const std::byte> b_;
  size_t pos_ = 0;
};

stage::Error bad(const std::string& why) {
  return stage::stage_error(stage::Errc::bad_message, "profile: " + why);
}

std::string encode_body(const Profile& p) {
  std::string body;
  body.reserve(64 + p.files.size() * 24);
  put_varint(body, p.chunk_size);
  put_varint(body, p.uid);
  put_varint(body, static_cast<uint64_t>(std::max<int64_t>(p.created, 0)));
  put_string(body, p.source.size() <= kMaxPathBytes ? p.source : std::string());
  // Only what decode accepts: a file with an unsafe path, or a path seen before, is left out.
  std::vector<const ProfileFile*> files;
  std::unordered_set<std::string_view> seen;
  seen.reserve(p.files.size());
  std::map<std::string_view, uint64_t> dirs;
  for (const ProfileFile& f : p.files) {
    if (files.size() == kMaxProfileFiles) break;
    const auto [dir, name] = split(f.path);
    if (f.path.size() > kMaxPathBytes || !safe_dir(dir) || !plain_name(name) || !seen.insert(f.path).second)
      continue;
    files.push_back(&f);
    dirs.emplace(dir, 0);
  }
  put_varint(body, dirs.size());
  std::string_view prev;
  uint64_t index = 0;
  for (auto& [dir, i] : dirs) {  // sorted: each shares a prefix with the one before
    const size_t shared = static_cast<size_t>(
        std::mismatch(prev.begin(), prev.end(), dir.begin(), dir.end()).first - prev.begin());
    put_varint(body, shared);
    put_string(body, dir.substr(shared));
    i = index++;
    prev = dir;
  }
  put_varint(body, files.size());
  uint64_t last_ms = 0;
  for (const ProfileFile* f : files) {
    const auto [dir, name] = split(f->path);
    put_varint(body, dirs[dir]);
    put_string(body, name);
    put_varint(body, f->first_ms > last_ms ? f->first_ms - last_ms : 0);
    last_ms = std::max(last_ms, f->first_ms);
    const size_t n = std::min(f->chunks.size(), kMaxProfileChunks);
    put_varint(body, n);
    int64_t prev_chunk = -1;
    for (size_t k = 0; k < n; ++k) {
      put_varint(body, zigzag(static_cast<int64_t>(f->chunks[k]) - prev_chunk));
      prev_chunk = f->chunks[k];
    }
  }
  return body;
}

stage::Status decode_dirs(Reader& r, std::vector<std::string>& dirs) {
  uint64_t n = 0;
  if (!r.bounded(n, std::min<uint64_t>(kMaxProfileFiles, r.left() / 2))) return bad("bad directory count");
  dirs.reserve(n);
  std::string prev;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t shared = 0, len = 0;
    std::string suffix;
    if (!r.bounded(shared, prev.size()) || !r.bounded(len, kMaxPathBytes - shared) || !r.bytes(suffix, len))
      return bad("bad directory entry");
    std::string dir = prev.substr(0, shared) + suffix;
    if (!safe_dir(dir)) return bad("a directory outside the source");
    if (i > 0 && dir <= prev) return bad("directories out of order");
    prev = dir;
    dirs.push_back(std::move(dir));
  }
  return {};
}

stage::Result<ProfileFile> decode_file(Reader& r, const std::vector<std::string>& dirs, uint64_t& ms) {
  uint64_t dir = 0, len = 0, delta = 0, nchunks = 0;
  ProfileFile f{{}, 0, {}};
  if (!r.bounded(dir, dirs.size() - 1) || !r.bounded(len, kMaxName)) return bad("bad file entry");
  // The path in one allocation: the directory, "/", the name.
  f.path.reserve(dirs[dir].size() + 1 + len);
  f.path = dirs[dir];
  if (!f.path.empty()) f.path.push_back('/');
  const size_t name_at = f.path.size();
  if (!r.append(f.path, len) || !r.varint(delta) ||
      !r.bounded(nchunks, std::min<uint64_t>(kMaxProfileChunks, r.left())))
    return bad("bad file entry");
  if (!plain_name(std::string_view(f.path).substr(name_at)))
    return bad("a file name that is not a plain name");
  if (delta > UINT64_MAX - ms) return bad("bad access time");
  ms += delta;
  f.first_ms = ms;
  if (f.path.size() > kMaxPathBytes) return bad("a path too long");
  f.chunks.reserve(nchunks);
  int64_t prev = -1;
  for (uint64_t k = 0; k < nchunks; ++k) {
    uint64_t z = 0;
    if (!r.varint(z)) return bad("bad chunk list");
    const int64_t c = prev + unzigzag(z);
    if (c < 0 || c > int64_t{UINT32_MAX}) return bad("a chunk out of range");
    f.chunks.push_back(static_cast<uint32_t>(c));
    prev = c;
  }
  return f;
}

stage::Result<Profile> decode_body(std::span<const std::byte> body, bool truncated) {
  Reader r(body);
  Profile p;
  p.truncated = truncated;
  uint64_t uid = 0, created = 0, len = 0;
  if (!r.varint(p.chunk_size) || !r.bounded(uid, UINT32_MAX) || !r.bounded(created, INT64_MAX) ||
      !r.bounded(len, kMaxPathBytes) || !r.bytes(p.source, len))
    return bad("bad header fields");
  if (p.chunk_size != 0 && (p.chunk_size < 4096 || p.chunk_size > (uint64_t{1} << 30)))
    return bad("a chunk size out of range");
  p.uid = static_cast<uint32_t>(uid);
  p.created = static_cast<int64_t>(created);
  std::vector<std::string> dirs;
  if (auto st = decode_dirs(r, dirs); !st) return st.error();
  uint64_t n = 0;
  if (!r.bounded(n, std::min<uint64_t>(kMaxProfileFiles, r.left() / 4))) return bad("bad file count");
  if (n > 0 && dirs.empty()) return bad("files without a directory");
  p.files.reserve(n);  // exactly: the names below point into the paths, which must not move
  std::unordered_set<std::string_view> seen;
  seen.reserve(n);
  uint64_t ms = 0;
  for (uint64_t i = 0; i < n; ++i) {
    auto f = decode_file(r, dirs, ms);
    if (!f) return f.error();
    p.files.push_back(std::move(f.value()));
    if (!seen.insert(p.files.back().path).second) return bad("a file listed twice");
  }
  if (r.left() != 0) return bad("bytes after the last file");
  return p;
}

}  // namespace

std::string encode_profile(const Profile& p) {
  const std::string body = encode_body(p);
  std::string out(kMagic, sizeof kMagic);
  out.push_back(static_cast<char>(kProfileVersion));
  out.push_back(static_cast<char>(p.truncated ? kTruncated : 0));
  out.append(3, '\0');
  const auto len = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += body;
  put_u64(out, stage::crc64(std::as_bytes(std::span(out.data(), out.size()))));
  return out;
}

stage::Result<Profile> decode_profile(std::span<const std::byte> b) {
  if (b.size() > kMaxProfileBytes)
    return bad("larger than " + std::to_string(kMaxProfileBytes >> 20) + " MiB");
  if (b.size() < kHeader + kTrailer || std::memcmp(b.data(), kMagic, sizeof kMagic) != 0)
    return bad("not a stagefs profile");
  const auto version = static_cast<uint8_t>(b[7]);
  if (version != kProfileVersion)
    return bad("version " + std::to_string(version) + " (this stagefs reads version " +
               std::to_string(kProfileVersion) + ")");
  const auto flags = static_cast<uint8_t>(b[8]);
  uint32_t len = 0;
  for (int i = 0; i < 4; ++i) len |= static_cast<uint32_t>(static_cast<uint8_t>(b[12 + i])) << (8 * i);
  if ((flags & ~kTruncated) != 0 || b[9] != std::byte{0} || b[10] != std::byte{0} || b[11] != std::byte{0})
    return bad("unknown flags");
  if (size_t{len} != b.size() - kHeader - kTrailer) return bad("truncated, or bytes past its end");
  uint64_t crc = 0;
  for (int i = 0; i < 8; ++i)
    crc |= static_cast<uint64_t>(static_cast<uint8_t>(b[kHeader + len + i])) << (8 * i);
  if (crc != stage::crc64(b.first(kHeader + len))) return bad("checksum mismatch (damaged or edited)");
  return decode_body(b.subspan(kHeader, len), (flags & kTruncated) != 0);
}

std::vector<uint64_t> convert_chunks(const std::vector<uint32_t>& chunks, uint64_t from, uint64_t to) {
  std::vector<uint64_t> out;
  if (from == 0 || to == 0) return out;
  std::unordered_set<uint64_t> seen;
  for (uint32_t c : chunks) {
    const uint64_t begin = uint64_t{c} * from;
    for (uint64_t k = begin / to; k <= (begin + from - 1) / to; ++k) {
      if (out.size() == kMaxProfileChunks) return out;
      if (seen.insert(k).second) out.push_back(k);
    }
  }
  return out;
}

}  // namespace stagefs
