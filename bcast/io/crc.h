// CRC-64/XZ (ECMA-182 polynomial, reflected, init and xorout all ones), computed with ISA-L's
// crc64_ecma_refl. Why this one: 64 bits make an accidental match of a stale or corrupt copy
// (checksum pre-validation of a 50 GB image) negligible where CRC-32 would be 1 in 4e9; ISA-L
// folds it with PCLMULQDQ at memory speed; and it is the well-known CRC of xz, so its check
// value ("123456789" -> 0x995dc9bbdf1939fa) is easy to verify.
// crc64_combine() gives CRC(A||B) from CRC(A), CRC(B) and len(B) without the data: the source
// computes one CRC per piece and derives chunk and whole-file CRCs from them.
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace stage {

uint64_t crc64(std::span<const std::byte> data, uint64_t prev = 0) noexcept;
uint64_t crc64_combine(uint64_t crc_a, uint64_t crc_b, uint64_t len_b) noexcept;
// CRC of len zero bytes (holes of sparse files are sent as a flag, not as bytes).
uint64_t crc64_zeros(uint64_t len) noexcept;

}  // namespace stage
