#include "bcast/io/chunk.h"

#include <cctype>
#include <utility>

namespace stage {

std::optional<uint64_t> parse_size(const std::string& text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0])) == 0) return std::nullopt;
  uint64_t value = 0;
  size_t i = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0; ++i) {
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  uint64_t mult = 1;
  if (i < text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text[i]))) {
      case 'K':
        mult = 1ULL << 10;
        break;
      case 'M':
        mult = 1ULL << 20;
        break;
      case 'G':
        mult = 1ULL << 30;
        break;
      case 'T':
        mult = 1ULL << 40;
        break;
      default:
        return std::nullopt;
    }
    ++i;
    if (i < text.size() && (text[i] == 'i' || text[i] == 'I')) ++i;
    if (i < text.size() && (text[i] == 'b' || text[i] == 'B')) ++i;
  }
  if (i != text.size()) return std::nullopt;
  if (value > UINT64_MAX / mult) return std::nullopt;
  return value * mult;
}

std::string size_text(uint64_t bytes) {
  if (bytes == 0) return "0";
  for (const auto& [suffix, shift] : {std::pair{'T', 40}, {'G', 30}, {'M', 20}, {'K', 10}})
    if (bytes % (1ULL << shift) == 0) return std::to_string(bytes >> shift) + suffix;
  return std::to_string(bytes);
}

std::optional<std::string> check_chunk_size(uint64_t chunk) {
  if (chunk < kMinChunk || chunk > kMaxChunk)
    return "chunk size must be between 4K and 1G (got " + std::to_string(chunk) + " bytes)";
  return std::nullopt;
}

}  // namespace stage
