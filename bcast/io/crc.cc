#include "bcast/io/crc.h"

#include <isa-l/crc64.h>

#include <array>

namespace stage {
namespace {

// GF(2) 64x64 matrices, as in zlib's crc32_combine: column i is the image of bit i.
using Mat = std::array<uint64_t, 64>;
constexpr uint64_t kPolyRefl = 0xC96C5795D7870F42ULL;  // ECMA-182, bit-reversed

uint64_t mat_times(const Mat& m, uint64_t v) noexcept {
  uint64_t sum = 0;
  for (int i = 0; v != 0; ++i, v >>= 1)
    if ((v & 1U) != 0) sum ^= m[static_cast<size_t>(i)];
  return sum;
}

void mat_square(Mat& sq, const Mat& m) noexcept {
  for (size_t i = 0; i < 64; ++i) sq[i] = mat_times(m, m[i]);
}

}  // namespace

uint64_t crc64(std::span<const std::byte> data, uint64_t prev) noexcept {
  return crc64_ecma_refl(prev, reinterpret_cast<const unsigned char*>(data.data()), data.size());
}

// ops[k] appends 2^k zero bytes to a CRC register. Built once (thread-safe static init), so
// a combine is one 64-step matrix-vector product per set bit of len_b: about a microsecond.
const std::array<Mat, 64>& zero_byte_operators() {
  static const std::array<Mat, 64> ops = [] {
    std::array<Mat, 64> t{};
    Mat bit{};  // one zero bit
    bit[0] = kPolyRefl;
    uint64_t row = 1;
    for (size_t i = 1; i < 64; ++i, row <<= 1) bit[i] = row;
    Mat two{};
    Mat four{};
    mat_square(two, bit);
    mat_square(four, two);
    mat_square(t[0], four);  // eight bits: one byte
    for (size_t k = 1; k < 64; ++k) mat_square(t[k], t[k - 1]);
    return t;
  }();
  return ops;
}

uint64_t crc64_combine(uint64_t crc_a, uint64_t crc_b, uint64_t len_b) noexcept {
  const auto& ops = zero_byte_operators();
  for (size_t k = 0; len_b != 0; ++k, len_b >>= 1)
    if ((len_b & 1U) != 0) crc_a = mat_times(ops[k], crc_a);
  return crc_a ^ crc_b;
}

uint64_t crc64_zeros(uint64_t len) noexcept {
  // CRC(zeros(a+b)) = combine(CRC(zeros(a)), CRC(zeros(b)), b): O(log len) combines, so a
  // 4 GiB hole costs microseconds, not a pass over 4 GiB of zeros.
  static constexpr size_t kBlock = 65536;
  static const std::array<std::byte, kBlock> zeros{};
  static const uint64_t block_crc = crc64(std::span(zeros.data(), kBlock));
  uint64_t acc = 0;  // CRC of the empty string
  uint64_t pow = block_crc;
  uint64_t pow_len = kBlock;
  for (uint64_t blocks = len / kBlock; blocks != 0; blocks >>= 1) {
    if ((blocks & 1U) != 0) acc = crc64_combine(acc, pow, pow_len);
    if (blocks > 1) {
      pow = crc64_combine(pow, pow, pow_len);
      pow_len *= 2;
    }
  }
  const uint64_t rem = len % kBlock;
  return crc64_combine(acc, crc64(std::span(zeros.data(), rem)), rem);
}

}  // namespace stage
