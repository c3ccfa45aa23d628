#include "fusefs/control.h"

#include <cstring>

#include "bcast/manifest.h"

namespace stagefs {

namespace {
constexpr uint32_t kMagic = 0x53544643;  // "STFC"
constexpr size_t kHeader = 4 + 1 + 8 + 4;
}  // namespace

std::string batch_dir_of(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  return slash == std::string::npos ? std::string() : rel.substr(0, slash);
}

std::string encode_message(const Message& m) {
  std::string out(kHeader, '\0');
  const auto len = static_cast<uint32_t>(m.path.size());
  std::memcpy(out.data(), &kMagic, 4);
  out[4] = static_cast<char>(m.type);
  std::memcpy(out.data() + 5, &m.id, 8);
  std::memcpy(out.data() + 13, &len, 4);
  out += m.path;
  return out;
}

stage::Result<Message> decode_message(std::span<const std::byte> b) {
  auto bad = [](const char* why) {
    return stage::stage_error(stage::Errc::bad_message, std::string("control message: ") + why);
  };
  if (b.size() < kHeader || b.size() > kMaxMessage) return bad("bad length");
  uint32_t magic = 0;
  uint32_t len = 0;
  Message m;
  std::memcpy(&magic, b.data(), 4);
  const auto type = static_cast<uint8_t>(b[4]);
  std::memcpy(&m.id, b.data() + 5, 8);
  std::memcpy(&len, b.data() + 13, 4);
  if (magic != kMagic) return bad("bad magic");
  if (type < static_cast<uint8_t>(MsgType::materialize) || type > static_cast<uint8_t>(MsgType::batch_prefetch))
    return bad("bad type");
  m.type = static_cast<MsgType>(type);
  if (len > kMaxPath || len != b.size() - kHeader) return bad("bad path length");
  m.path.assign(reinterpret_cast<const char*>(b.data() + kHeader), len);
  if (m.type == MsgType::materialize && (m.path.empty() || !stage::is_safe_relative(m.path)))
    return bad("unsafe path");
  if (is_batch(m.type) && !stage::is_safe_relative(m.path))
    return bad("unsafe path");  // "" = root
  if (m.type == MsgType::shutdown && !m.path.empty()) return bad("path on shutdown");
  return m;
}

}  // namespace stagefs
