#include "fusefs/group/control.h"

#include <cstring>

#include "bcast/io/manifest.h"

namespace stagefs {

namespace {
constexpr uint32_t kMagic = 0x53544643;  // "STFC"
// magic, type, id, path length, uid, flags, from length, until length
constexpr size_t kHeader = 4 + 1 + 8 + 4 + 4 + 1 + 2 + 2;

// A slice bound: empty, or one plain name.
bool plain_bound(const std::string& s) {
  return s.empty() || (s.size() <= kMaxName && s != "." && s != ".." && s.find('/') == std::string::npos &&
                       s.find('\0') == std::string::npos);
}
}  // namespace

std::string batch_dir_of(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  return slash == std::string::npos ? std::string() : rel.substr(0, slash);
}

std::string encode_message(const Message& m) {
  std::string out(kHeader, '\0');
  const auto len = static_cast<uint32_t>(m.path.size());
  const auto from_len = static_cast<uint16_t>(m.from.size());
  const auto until_len = static_cast<uint16_t>(m.until.size());
  std::memcpy(out.data(), &kMagic, 4);
  out[4] = static_cast<char>(m.type);
  std::memcpy(out.data() + 5, &m.id, 8);
  std::memcpy(out.data() + 13, &len, 4);
  std::memcpy(out.data() + 17, &m.uid, 4);
  out[21] = static_cast<char>(m.flags);
  std::memcpy(out.data() + 22, &from_len, 2);
  std::memcpy(out.data() + 24, &until_len, 2);
  out += m.path;
  out += m.from;
  out += m.until;
  return out;
}

stage::Result<Message> decode_message(std::span<const std::byte> b) {
  auto bad = [](const char* why) {
    return stage::stage_error(stage::Errc::bad_message, std::string("control message: ") + why);
  };
  if (b.size() < kHeader || b.size() > kMaxMessage) return bad("bad length");
  uint32_t magic = 0;
  uint32_t len = 0;
  uint16_t from_len = 0;
  uint16_t until_len = 0;
  Message m;
  std::memcpy(&magic, b.data(), 4);
  const auto type = static_cast<uint8_t>(b[4]);
  std::memcpy(&m.id, b.data() + 5, 8);
  std::memcpy(&len, b.data() + 13, 4);
  std::memcpy(&m.uid, b.data() + 17, 4);
  m.flags = static_cast<uint8_t>(b[21]);
  std::memcpy(&from_len, b.data() + 22, 2);
  std::memcpy(&until_len, b.data() + 24, 2);
  if (magic != kMagic) return bad("bad magic");
  if (type < static_cast<uint8_t>(MsgType::materialize) || type > static_cast<uint8_t>(MsgType::file_nested))
    return bad("bad type");
  m.type = static_cast<MsgType>(type);
  if (len > kMaxPath || from_len > kMaxName || until_len > kMaxName ||
      size_t{len} + from_len + until_len != b.size() - kHeader)
    return bad("bad path length");
  if ((m.flags & ~(kBackground | kToEnd)) != 0) return bad("bad flags");
  const char* text = reinterpret_cast<const char*>(b.data() + kHeader);
  m.path.assign(text, len);
  m.from.assign(text + len, from_len);
  m.until.assign(text + len + from_len, until_len);
  if (!plain_bound(m.from) || !plain_bound(m.until)) return bad("bad slice name");
  if (!is_batch(m.type) && (!m.from.empty() || !m.until.empty())) return bad("slice on a non-batch");
  if (is_file(m.type) && (m.path.empty() || !stage::is_safe_relative(m.path))) return bad("unsafe path");
  if (is_batch(m.type) && !stage::is_safe_relative(m.path)) return bad("unsafe path");  // "" = root
  if (m.type == MsgType::shutdown && !m.path.empty()) return bad("path on shutdown");
  return m;
}

}  // namespace stagefs
