#include "bcast/crc.h"

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

uint64_t crc64_combine(uint64_t crc_a, uint64_t crc_b, uint64_t len_b) noexcept {
  if (len_b == 0) return crc_a;
  Mat odd{};
  Mat even{};
  odd[0] = kPolyRefl;  // operator for one zero bit
  uint64_t row = 1;
  for (size_t i = 1; i < 64; ++i, row <<= 1) odd[i] = row;
  mat_square(even, odd);  // two zero bits
  mat_square(odd, even);  // four zero bits
  // Apply len_b zero bytes to crc_a, squaring the operator as we go (zlib's method).
  do {
    mat_square(even, odd);
    if ((len_b & 1U) != 0) crc_a = mat_times(even, crc_a);
    len_b >>= 1;
    if (len_b == 0) break;
    mat_square(odd, even);
    if ((len_b & 1U) != 0) crc_a = mat_times(odd, crc_a);
    len_b >>= 1;
  } while (len_b != 0);
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
